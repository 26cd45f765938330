//! Kernel library: FlashAttention prefill over a paged KV cache on the
//! interpreter against the f64 reference.
//!
//! `flash_attention` (kernels::flash_attention) against
//! `kernels::reference::attention::prefill_varlen`: random non-zero Q, K and V;
//! odd and even batch sizes; ragged query runs and contexts (not multiples of
//! any tile or page, contexts ending mid-page), about half of the sequences a
//! chunked prefill / prefix-cache hit (`q_len < ctx`), some `q_len = 1`, some
//! `q_len = 0`; GQA ratios 1, 3 (SmolLM2: 9 Q heads, 3 KV heads, head dim 64)
//! and 4, head dims 64 and 128; causal and full; f32 and bf16 (f16 in the
//! corners); page sizes 16, 32 and 64 behind a random (shuffled, not
//! identity) block table whose unused entries are `-1`; caches full of random
//! values (so a read past the context or through a wrong page changes the
//! result); small tiles (`BLOCK_M`, `BLOCK_N` of 16 and 32) so that every
//! program runs several unmasked and masked key blocks, plus the default
//! tiles. The output starts filled with 100 (a value attention of |v| <= 2
//! cannot produce), so unwritten rows fail.
//!
//! Tolerance per element: `Attention::error_bound` (kernels::reference::
//! attention) from the reference's error scales `mag = sum_j p_j |v_j|` and
//! `score_abs = max_j scale sum_d |q_d k_jd|`: the f32 arithmetic of scores,
//! exponentials and accumulations with margins of 4 to 8, plus, in bf16/f16,
//! the rounding of `p` to the storage dtype before `p . v` (at most one unit
//! roundoff times `mag`) and of the output. Including or dropping one key
//! moves an output by about `p_j |v_j - o|` (a few percent at these
//! contexts), far above the tolerance; `wrong_mask_is_caught` checks that
//! such a change does fail the comparison.

use crate::common::{Storage, cases, f32_or_bf16, nonzero};
use dsl_core::DType;
use dsl_core::half::{bf16, f16};
use dsl_core::interp::Cpu;
use kernels::flash_attention::{self as fa, flash_attention};
use kernels::reference::attention::{self as r, Attention, PagedBatch, PagedKv, PagedLayout};
use proptest::prelude::*;
use std::marker::PhantomData;
use tests::reference::Rng;

/// One launch: the batch (heads, sequences `(q_len, ctx)`, paging), tiles
/// and mask.
#[derive(Clone, Debug)]
struct Case {
    batch: PagedBatch,
    block_m: usize,
    block_n: usize,
    causal: bool,
    scale: f32,
    /// `BOXES`: `load_block` boxes for key blocks inside one page.
    boxes: bool,
}

/// Inputs of one launch, as f64 values representable in the storage dtype.
struct Inputs {
    q: Vec<f64>,
    k_cache: Vec<f64>,
    v_cache: Vec<f64>,
    /// Block tables, context lengths and query offsets.
    layout: PagedLayout,
}

/// Random inputs for `case`: pages of all sequences shuffled over a cache
/// with two spare pages, unused table entries `-1`.
fn inputs(case: &Case, dtype: DType, seed: u64) -> Inputs {
    let mut rng = Rng::new(seed);
    let b = &case.batch;
    let layout = b.layout(2, |n| rng.below(n));
    Inputs {
        q: nonzero(&mut rng, b.total_q() * b.n_q * b.d, dtype),
        k_cache: nonzero(&mut rng, layout.cache_len, dtype),
        v_cache: nonzero(&mut rng, layout.cache_len, dtype),
        layout,
    }
}

/// The kernel on the interpreter; returns O as f64.
fn run_kernel<T: Storage>(case: &Case, x: &Inputs) -> Result<Vec<f64>, String> {
    let cvt = |v: &[f64]| v.iter().map(|&e| T::from_f64(e)).collect::<Vec<T>>();
    let mut cpu = Cpu::new();
    let (qp, kp, vp) = (cpu.upload(&cvt(&x.q)), cpu.upload(&cvt(&x.k_cache)), cpu.upload(&cvt(&x.v_cache)));
    let op = cpu.upload(&vec![T::from_f64(100.0); x.q.len()]);
    let lay = &x.layout;
    let (bp, sp, cp) = (cpu.upload(&lay.tables), cpu.upload(&lay.seq_lens), cpu.upload(&lay.cu_seqlens));
    let args = flash_attention::Args {
        q_ptr: qp.cast(),
        k_cache_ptr: kp.cast(),
        v_cache_ptr: vp.cast(),
        o_ptr: op.cast(),
        block_tables_ptr: bp,
        seq_lens_ptr: sp,
        cu_seqlens_q_ptr: cp,
        scale: case.scale,
        max_blocks_per_seq: lay.max_blocks as i32,
        _marker: PhantomData,
    };
    let b = &case.batch;
    let config = flash_attention::Config::new(
        T::DTYPE,
        b.n_q,
        b.n_kv,
        b.d,
        b.block_size,
        case.block_m,
        case.block_n,
        case.causal,
        case.boxes,
        false,
        false,
    );
    let max_q = b.seqs.iter().map(|s| s.0).max().unwrap_or(0);
    let grid = fa::grid(max_q, b.seqs.len(), b.n_q, case.block_m);
    flash_attention::interpret(&mut cpu, grid, &config, &args).map_err(|e| e.to_string())?;
    Ok(cpu.read(op).iter().map(|v| v.to_f64()).collect())
}

/// The reference for `case` (its mask and scale) on `x`.
fn reference(case: &Case, x: &Inputs) -> Attention {
    case.batch.prefill(&x.q, &x.k_cache, &x.v_cache, &x.layout, case.scale as f64, case.causal)
}

/// The unit roundoff of `dtype` (0 for f32: the kernel's rounding of `p` is exact).
fn unit_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => f64::powi(2.0, -8),
        DType::F16 => f64::powi(2.0, -11),
        _ => 0.0,
    }
}

/// Compares `got` with `want` per element within `Attention::error_bound`.
fn compare(case: &Case, dtype: DType, got: &[f64], want: &Attention) -> Result<(), String> {
    let b = &case.batch;
    let keys = b.seqs.iter().map(|s| s.1).max().unwrap_or(0);
    let row = b.n_q * b.d;
    for (e, &g) in got.iter().enumerate() {
        let w = want.out[e];
        let tol = want.error_bound(e, b.d, keys, unit_roundoff(dtype));
        let diff = (g - w).abs();
        if diff.is_nan() || diff > tol {
            let (t, c) = (e / row, e % row);
            return Err(format!(
                "o[token {t}, head {}, {}]: got {g}, want {w}, |diff| {diff} > {tol} ({case:?})",
                c / b.d,
                c % b.d
            ));
        }
    }
    Ok(())
}

/// Runs `case` in `T` with inputs from `seed` and compares with the reference.
fn check<T: Storage>(case: &Case, seed: u64) -> Result<(), String> {
    let x = inputs(case, T::DTYPE, seed);
    let got = run_kernel::<T>(case, &x)?;
    compare(case, T::DTYPE, &got, &reference(case, &x))
}

/// Head shapes: GQA 3 (SmolLM2), MHA at 128, GQA 4 at 128, GQA 4 at 64.
const HEADS: [(usize, usize, usize); 4] = [(9, 3, 64), (2, 2, 128), (4, 1, 128), (4, 1, 64)];

/// Tiles `(BLOCK_M, BLOCK_N)`: small ones for many loop iterations, and the default.
const TILES: [(usize, usize); 4] = [(16, 16), (32, 16), (16, 32), (64, 32)];

/// A sequence: `q_len` in 0..=80 (1 and 0 with extra weight) after a prefix
/// of 0..=70 tokens half the time.
fn seq() -> impl Strategy<Value = (usize, usize)> {
    let q_len = prop_oneof![2 => Just(1usize), 1 => Just(0usize), 7 => 1usize..81];
    let prefix = prop_oneof![Just(0usize), 1usize..71];
    (q_len, prefix).prop_map(|(q, p)| (q, q + p))
}

proptest! {
    #![proptest_config(cases(64))]

    #[test]
    fn flash_attention_paged_varlen(
        heads in 0usize..HEADS.len(),
        seqs in prop::collection::vec(seq(), 1..6),
        block_size in prop::sample::select(vec![16usize, 32, 64]),
        tiles in 0usize..TILES.len(),
        causal in any::<bool>(),
        boxes in any::<bool>(),
        bf in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let (n_q, n_kv, d) = HEADS[heads];
        let (block_m, block_n) = TILES[tiles];
        let scale = 1.0 / (d as f32).sqrt();
        let batch = PagedBatch { n_q, n_kv, d, seqs, block_size };
        let case = Case { batch, block_m, block_n, causal, scale, boxes };
        let res = f32_or_bf16!(bf, check(&case, seed));
        res.map_err(TestCaseError::fail)?;
    }
}

/// Fixed corners: a single query token (decode-like) at the end of a long
/// context, a context that is exactly one tile and one page, a sequence with
/// no query tokens between others, scales other than `1/sqrt(d)` (including
/// a negative one), f16 storage, and a key block that crosses pages
/// (`BLOCK_N` 32 over pages of 16).
#[test]
fn corners() {
    let batch = PagedBatch {
        n_q: 9,
        n_kv: 3,
        d: 64,
        seqs: vec![(1, 97), (16, 16), (0, 5), (33, 33)],
        block_size: 16,
    };
    let base = Case { batch, block_m: 16, block_n: 32, causal: true, scale: 0.125, boxes: false };
    for causal in [true, false] {
        let case = Case { causal, ..base.clone() };
        check::<f32>(&case, 1).unwrap();
        check::<bf16>(&case, 2).unwrap();
        check::<f16>(&case, 3).unwrap();
        let batch = PagedBatch { block_size: 64, seqs: vec![(5, 70), (64, 64)], ..base.batch.clone() };
        let case = Case { causal, scale: -0.3, batch, ..base.clone() };
        check::<f32>(&case, 4).unwrap();
        // The same pages of whole key blocks as `load_block` boxes.
        check::<bf16>(&Case { boxes: true, ..case }, 6).unwrap();
        let batch = PagedBatch { n_q: 3, n_kv: 3, d: 128, ..base.batch.clone() };
        let case = Case { causal, scale: 0.5, batch, ..base.clone() };
        check::<bf16>(&case, 5).unwrap();
    }
}

/// Causal tiles whose first query sits just before, on and just after a key
/// block boundary (`prefix + m * BLOCK_M` = `BLOCK_N - 2 ..= BLOCK_N + 1`
/// modulo `BLOCK_N`), where the split between unmasked and masked key blocks
/// is easiest to get off by one.
#[test]
fn causal_split_at_block_boundaries() {
    for (block_m, block_n) in [(16, 16), (16, 32), (32, 16), (64, 32)] {
        let seqs = (0..6).map(|i| (2 * block_m + 3, 2 * block_m + 3 + block_n - 2 + i)).collect();
        let case = Case {
            batch: PagedBatch { n_q: 2, n_kv: 1, d: 64, seqs, block_size: 16 },
            block_m,
            block_n,
            causal: true,
            scale: 0.125,
            boxes: false,
        };
        check::<f32>(&case, block_m as u64 * 100 + block_n as u64).unwrap();
    }
}

/// Rows that see no key are zeros, not NaN: `seq_lens[b] < q_len_b` puts
/// the first causal rows at negative positions (and a full-attention
/// sequence with an empty context sees nothing at all).
#[test]
fn rows_without_keys_are_zero() {
    for (causal, seqs) in [(true, vec![(20, 7), (3, 3)]), (false, vec![(4, 0), (2, 9)])] {
        let case = Case {
            batch: PagedBatch { n_q: 4, n_kv: 2, d: 64, seqs, block_size: 16 },
            block_m: 16,
            block_n: 16,
            causal,
            scale: 0.125,
            boxes: false,
        };
        let x = inputs(&case, DType::F32, 7);
        let got = run_kernel::<f32>(&case, &x).unwrap();
        let want = reference(&case, &x);
        compare(&case, DType::F32, &got, &want).unwrap();
        let row = case.batch.n_q * case.batch.d;
        // Sequence 0's first rows see no key: exactly zero.
        let empty = if causal { 20 - 7 } else { 4 };
        assert!(got[..empty * row].iter().all(|&v| v == 0.0), "rows without keys must be 0");
        assert!(want.out[..empty * row].iter().all(|&v| v == 0.0));
        assert!(got.iter().all(|v| !v.is_nan()));
    }
}

/// The comparison fails when the kernel and the reference disagree on the
/// mask by a little: causal against full on sequences whose query run is
/// short against its context (only a few keys differ per row), and the
/// causal rows of sequence 0 against a reference that gives every row one
/// key fewer (positions shifted down by one).
#[test]
fn wrong_mask_is_caught() {
    let case = Case {
        batch: PagedBatch { n_q: 2, n_kv: 1, d: 64, seqs: vec![(3, 50), (2, 41)], block_size: 16 },
        block_m: 16,
        block_n: 16,
        causal: true,
        scale: 0.125,
        boxes: false,
    };
    for dtype in [DType::F32, DType::BF16] {
        let x = inputs(&case, dtype, 11);
        let got =
            if dtype == DType::BF16 { run_kernel::<bf16>(&case, &x) } else { run_kernel::<f32>(&case, &x) };
        let got = got.unwrap();
        compare(&case, dtype, &got, &reference(&case, &x)).unwrap();
        let full = Case { causal: false, ..case.clone() };
        assert!(compare(&case, dtype, &got, &reference(&full, &x)).is_err(), "causal vs full must differ");
        let kv = PagedKv { k: &x.k_cache, v: &x.v_cache, block_size: 16, n_kv: 1, head_dim: 64 };
        let n_q = case.batch.n_q;
        let rows = 3 * n_q * case.batch.d;
        let table = &x.layout.tables[..x.layout.max_blocks];
        let short = r::attend(&x.q[..rows], &[46, 47, 48], n_q, 50, table, &kv, 0.125, true);
        assert!(compare(&case, dtype, &got[..rows], &short).is_err(), "one key fewer must fail");
        let exact = r::attend(&x.q[..rows], &[47, 48, 49], n_q, 50, table, &kv, 0.125, true);
        compare(&case, dtype, &got[..rows], &exact).unwrap();
    }
}

/// The reference on a hand-computed case: one query, two keys on two pages
/// in swapped order, scores 0 and ln 3 (weights 1/4 and 3/4).
#[test]
fn reference_reads_through_the_block_table() {
    // Cache: 2 pages of 1 slot, 1 KV head of dim 2. Page 1 holds key 0, page 0 key 1.
    let k = [0.0, 1.0, /* page 1: key 0 */ 0.0, 0.0];
    let v = [10.0, 20.0, /* page 1: value 0 */ 2.0, 4.0];
    let kv = PagedKv { k: &k, v: &v, block_size: 1, n_kv: 1, head_dim: 2 };
    let q = [0.0, 3f64.ln()];
    let a = r::attend(&q, &[1], 1, 2, &[1, 0], &kv, 1.0, true);
    let want = [0.25 * 2.0 + 0.75 * 10.0, 0.25 * 4.0 + 0.75 * 20.0];
    for (g, w) in a.out.iter().zip(want) {
        assert!((g - w).abs() < 1e-12, "{:?}", a.out);
    }
    assert!((a.score_abs[0] - 3f64.ln()).abs() < 1e-12);
    // Causal at position 0: key 0 only.
    let a = r::attend(&q, &[0], 1, 2, &[1, 0], &kv, 1.0, true);
    assert_eq!(a.out, vec![2.0, 4.0]);
    assert_eq!(a.mag, vec![2.0, 4.0]);
}
