//! Kernel library: the Q8_0 embedding gather on the interpreter against the
//! reference.
//!
//! Random Q8_0 tables (random finite f16 scales, random i8 quants, built as
//! raw bytes), hidden sizes 64, SmolLM2's 576 and 4096 (one tile, a padded
//! tile and a looped row), 1..17 tokens with random ids (repeats likely, the
//! table being small), f32 and bf16 outputs. `d * q` is exact in f32, so f32
//! outputs must equal the exact value and bf16 outputs its rounding: exact
//! equality with the reference in both.

use crate::common::{cases, f32_or_bf16};
use dsl_core::DType;
use dsl_core::half::{bf16, f16};
use dsl_core::interp::{Cpu, Element};
use kernels::embedding::{block_for, embedding_q8_0};
use kernels::reference::embedding as r;
use proptest::prelude::*;
use std::marker::PhantomData;
use tests::reference::Rng;

/// A random Q8_0 table of `vocab` rows: finite f16 scales of random sign and
/// exponent, random i8 quants.
fn table(rng: &mut Rng, vocab: usize, hidden: usize) -> Vec<u8> {
    let blocks = vocab * hidden / 32;
    let mut t = Vec::with_capacity(blocks * 34);
    for _ in 0..blocks {
        let d = loop {
            let d = f16::from_bits(rng.next_u64() as u16);
            if d.is_finite() {
                break d;
            }
        };
        t.extend_from_slice(&d.to_le_bytes());
        t.extend((0..32).map(|_| rng.next_u64() as u8));
    }
    t
}

/// Runs the kernel on the interpreter; returns the output as f64.
fn run<T: Element>(
    w: &[u8],
    ids: &[i32],
    hidden: usize,
    vocab: usize,
    block: usize,
) -> Result<Vec<f64>, String> {
    let mut cpu = Cpu::new();
    let (wp, ip, op) = (cpu.upload(w), cpu.upload(ids), cpu.zeros::<T>(ids.len() * hidden));
    let args = embedding_q8_0::Args {
        w_ptr: wp.cast(),
        ids_ptr: ip.cast(),
        out_ptr: op.cast(),
        hidden: hidden as i32,
        vocab: vocab as i32,
        _marker: PhantomData,
    };
    let config = embedding_q8_0::Config::new(T::DTYPE, block);
    embedding_q8_0::interpret(&mut cpu, [ids.len() as u32, 1, 1], &config, &args)
        .map_err(|e| e.to_string())?;
    Ok(cpu.read(op).iter().map(|v| v.to_f64()).collect())
}

fn case<T: Element>(
    seed: u64,
    tokens: usize,
    hidden: usize,
    vocab: usize,
    block: usize,
) -> Result<(), TestCaseError> {
    let mut rng = Rng::new(seed);
    let w = table(&mut rng, vocab, hidden);
    let ids: Vec<i32> = (0..tokens).map(|_| (rng.next_u64() % vocab as u64) as i32).collect();
    let got = run::<T>(&w, &ids, hidden, vocab, block).map_err(TestCaseError::fail)?;
    let want = r::embedding_q8_0(&w, &ids, hidden, vocab, T::DTYPE);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        prop_assert!(g == w, "token {} column {}: got {g}, want {w} (ids {ids:?})", i / hidden, i % hidden);
    }
    Ok(())
}

proptest! {
    #![proptest_config(cases(12))]

    #[test]
    fn embedding_q8_0_random_tables(
        tokens in 1usize..17,
        hidden in prop_oneof![Just(64usize), Just(576), Just(4096)],
        vocab in 1usize..9,
        small_block in any::<bool>(),
        bf in any::<bool>(),
        seed in any::<u64>(),
    ) {
        // The default tile, or a smaller one so that every row loops.
        let block = if small_block { 32 } else { block_for(hidden) };
        f32_or_bf16!(bf, case(seed, tokens, hidden, vocab, block))?;
    }
}

/// Ids outside `[0, vocab)` read nothing and give zero rows; valid ids around
/// them are gathered as usual (the contract of the module doc).
#[test]
fn invalid_ids_give_zero_rows() {
    let (hidden, vocab) = (64, 3);
    let w = table(&mut Rng::new(5), vocab, hidden);
    let ids = [2, -1, 3, 0, i32::MAX, i32::MIN, 2];
    let f32_out = run::<f32>(&w, &ids, hidden, vocab, 64).unwrap();
    let bf16_out = run::<bf16>(&w, &ids, hidden, vocab, 32).unwrap();
    for (got, dtype) in [(f32_out, DType::F32), (bf16_out, DType::BF16)] {
        assert_eq!(got, r::embedding_q8_0(&w, &ids, hidden, vocab, dtype));
        for t in [1, 2, 4, 5] {
            assert!(got[t * hidden..(t + 1) * hidden].iter().all(|&v| v == 0.0), "token {t}");
        }
    }
}

/// SmolLM2's shape: the full 49152 x 576 table, a few ids including the ends.
#[test]
fn smollm2_table() {
    let (hidden, vocab) = (576, 49152);
    let w = table(&mut Rng::new(7), vocab, hidden);
    let ids = [0, 1, 2, 49151, 12345, 1];
    for dtype in [DType::F32, DType::BF16] {
        let got = if dtype == DType::F32 {
            run::<f32>(&w, &ids, hidden, vocab, block_for(hidden)).unwrap()
        } else {
            run::<bf16>(&w, &ids, hidden, vocab, block_for(hidden)).unwrap()
        };
        assert_eq!(got, r::embedding_q8_0(&w, &ids, hidden, vocab, dtype));
    }
}
