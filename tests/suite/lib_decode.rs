//! Kernel library: paged decode attention on the interpreter against the f64
//! reference (`kernels::reference::attention::attend`, one query row per
//! sequence at position `ctx - 1`, all keys of the context).
//!
//! Random non-zero inputs; ragged contexts (1 to ~300 tokens, ending
//! mid-page, some 0-length), odd batch sizes, GQA groups 1, 3 (SmolLM2's 9:3,
//! padded to 4 in the kernel) and 4, head dims 64 and 128, pages of 16, 32
//! and 64 tokens through shuffled block tables, chunks of 16 and 32 tokens,
//! direct and split-KV (with the reduce kernel), f32 and bf16; both kernels:
//! the per-lane-stream `paged_decode` and the tensor-core `paged_decode_tc`
//! (chunks of 16, 32 and 64 tokens).
//!
//! Tolerance per element: the output is a convex combination of the `v_j`,
//! so score errors `e` move it by at most about `2 e * mag` (`mag =
//! sum_j p_j |v_j|`); f32 scores of `hd` products have `e <= hd * 2^-23 *
//! score_abs` (a factor 8 margin is used); f32 accumulation adds `2^-20 *
//! mag`; bf16 output adds one unit of the final rounding (`|want| / 128`),
//! and the tensor-core kernel's rounding of the weights `p` to bf16 before
//! `p . v` moves the combination by at most `2^-8 mag`.

use crate::common::{cases, nonzero};
use dsl_core::DType;
use dsl_core::interp::{Buffer, Cpu};
use kernels::decode_attention::{paged_decode, paged_decode_reduce, paged_decode_tc, tc_config};
use kernels::reference::attention::{PagedKv, attend};
use proptest::prelude::*;
use std::marker::PhantomData;
use tests::reference::Rng;

/// One decode case.
#[derive(Clone, Copy, Debug)]
struct Case {
    batch: usize,
    h_kv: usize,
    group: usize,
    head_dim: usize,
    page: usize,
    block_n: usize,
    /// `Some(split_len / block_n)` for split-KV.
    split_chunks: Option<usize>,
    bf: bool,
    /// The tensor-core kernel (`paged_decode_tc`) instead of `paged_decode`.
    tc: bool,
    seed: u64,
}

fn run_case(c: Case) -> Result<(), TestCaseError> {
    let mut rng = Rng::new(c.seed);
    let dtype = if c.bf { DType::BF16 } else { DType::F32 };
    let (d, n_q) = (c.head_dim, c.h_kv * c.group);
    // Context lengths: ragged, about one in eight empty.
    let ctx: Vec<i32> =
        (0..c.batch).map(|_| if rng.below(8) == 0 { 0 } else { 1 + rng.below(300) as i32 }).collect();
    let max_ctx = ctx.iter().copied().max().unwrap_or(0).max(1) as usize;
    let max_pages = max_ctx.div_ceil(c.page);
    let num_blocks = c.batch * max_pages + 3;
    // Shuffled pages: every sequence gets distinct random blocks.
    let mut pages: Vec<i32> = (0..num_blocks as i32).collect();
    for i in (1..pages.len()).rev() {
        pages.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let tables: Vec<i32> = pages[..c.batch * max_pages].to_vec();
    let slot = c.h_kv * d;
    let k = nonzero(&mut rng, num_blocks * c.page * slot, dtype);
    let v = nonzero(&mut rng, num_blocks * c.page * slot, dtype);
    let q = nonzero(&mut rng, c.batch * n_q * d, dtype);
    let scale = 1.0 / (d as f64).sqrt();

    let kv = PagedKv { k: &k, v: &v, block_size: c.page, n_kv: c.h_kv, head_dim: d };
    let row = n_q * d;
    let mut want = Vec::with_capacity(c.batch * row);
    let mut mag = Vec::with_capacity(c.batch * row);
    let mut sabs = Vec::with_capacity(c.batch * row);
    for b in 0..c.batch {
        let table = &tables[b * max_pages..(b + 1) * max_pages];
        let pos = [ctx[b] as i64 - 1];
        let a = attend(&q[b * row..(b + 1) * row], &pos, n_q, ctx[b] as usize, table, &kv, scale, false);
        want.extend(a.out);
        mag.extend(a.mag);
        sabs.extend(a.score_abs);
    }

    let mut cpu = Cpu::new();
    let qp = cpu.add_buffer(Buffer::from_f64(dtype, &q));
    let kp = cpu.add_buffer(Buffer::from_f64(dtype, &k));
    let vp = cpu.add_buffer(Buffer::from_f64(dtype, &v));
    let op = cpu.add_buffer(Buffer::zeros(dtype, c.batch * row));
    let bt = cpu.upload(&tables);
    let sl = cpu.upload(&ctx);
    let (split_len, splits) = match c.split_chunks {
        Some(ch) => {
            let len = ch * c.block_n;
            (len, max_ctx.div_ceil(len))
        }
        None => (max_ctx.div_ceil(c.block_n) * c.block_n, 1),
    };
    let parts = c.batch * c.h_kv * splits * c.group;
    let po = cpu.zeros::<f32>(parts * d);
    let pm = cpu.zeros::<f32>(parts);
    let pl = cpu.zeros::<f32>(parts);
    let split = c.split_chunks.is_some();
    macro_rules! args {
        ($k:ident) => {
            $k::Args {
                q_ptr: qp,
                k_cache: kp,
                v_cache: vp,
                block_tables: bt,
                bt_stride: max_pages as i32,
                seq_lens: sl,
                out_ptr: op,
                part_o: po,
                part_m: pm,
                part_l: pl,
                scale: scale as f32,
                split_len: split_len as i32,
                _marker: PhantomData,
            }
        };
    }
    let grid = [c.batch as u32, c.h_kv as u32, splits as u32];
    let done = if c.tc {
        let config = tc_config(dtype, c.h_kv, c.group, d, c.page, c.block_n, split);
        paged_decode_tc::interpret(&mut cpu, grid, &config, &args!(paged_decode_tc))
    } else {
        let config = paged_decode::Config::new(dtype, c.h_kv, c.group, d, c.page, c.block_n, split);
        paged_decode::interpret(&mut cpu, grid, &config, &args!(paged_decode))
    };
    done.map_err(|e| TestCaseError::fail(e.to_string()))?;
    if split {
        let config = paged_decode_reduce::Config::new(dtype, c.group, d);
        let args = paged_decode_reduce::Args {
            part_o: po,
            part_m: pm,
            part_l: pl,
            seq_lens: sl,
            out_ptr: op,
            split_len: split_len as i32,
            max_splits: splits as i32,
            _marker: PhantomData,
        };
        let grid = [c.batch as u32, n_q as u32, 1];
        paged_decode_reduce::interpret(&mut cpu, grid, &config, &args)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
    let got = cpu.buffer(op).to_f64();
    for (e, (&g, &w)) in got.iter().zip(&want).enumerate() {
        let score_err = 8.0 * d as f64 * f64::powi(2.0, -23) * sabs[e];
        let mut tol = mag[e] * (2.0 * score_err + f64::powi(2.0, -20)) + 1e-30;
        if c.bf {
            tol += w.abs() / 128.0;
            if c.tc {
                tol += mag[e] / 256.0;
            }
        }
        let diff = (g - w).abs();
        if diff.is_nan() || diff > tol {
            let (b, h) = (e / row, (e % row) / d);
            return Err(TestCaseError::fail(format!(
                "{c:?}: out[{e}] (seq {b}, ctx {}, head {h}): got {g}, want {w}, |diff| {diff} > {tol}",
                ctx[b]
            )));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(cases(24))]

    #[test]
    fn paged_decode_ragged(
        batch in 1usize..5,
        h_kv in 1usize..3,
        group in prop::sample::select(vec![1usize, 3, 4]),
        wide in any::<bool>(),
        page in prop::sample::select(vec![16usize, 32, 64]),
        block_n in prop::sample::select(vec![16usize, 32, 64]),
        split_chunks in prop::option::of(1usize..5),
        bf in any::<bool>(),
        tc in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let head_dim = if wide { 128 } else { 64 };
        run_case(Case { batch, h_kv, group, head_dim, page, block_n, split_chunks, bf, tc, seed })?;
    }
}

/// SmolLM2's shape (9 query heads on 3 KV heads, head dim 64) with a long
/// context split over many programs.
#[test]
fn paged_decode_smollm2_split() {
    let c = Case {
        batch: 3,
        h_kv: 3,
        group: 3,
        head_dim: 64,
        page: 16,
        block_n: 16,
        split_chunks: Some(4),
        bf: true,
        tc: false,
        seed: 7,
    };
    run_case(c).unwrap();
    run_case(Case { tc: true, block_n: 64, split_chunks: Some(1), ..c }).unwrap();
}
