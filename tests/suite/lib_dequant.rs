//! Kernel library: the dequant GEMV/GEMM kernels (`kernels::dequant`) on the
//! interpreter against the f64 reference of `kernels::reference::quant`.
//!
//! Random GGUF weights (random finite f16 scales of either sign over several
//! binades, random Q4_1 mins, random quant bytes) are built as the raw GGUF
//! blocks, repacked with `kernels::dequant::repack`, and the reference reads
//! the raw bytes, so a wrong repack fails too. Activations are random
//! non-zero values in f32 or bf16. Shapes are ragged: `N` not a multiple of
//! `BLOCK_N`, odd `M` in 1..16 for the GEMV (and `M` not a multiple of
//! `BLOCK_M` for the GEMM), `K` a multiple of 32 but often not of `BLOCK_K`
//! (so the masked tail tile runs), all three formats, with and without the
//! fused SiLU-mul epilogue (gate and up weights interleaved by
//! `interleave_gate_up`). Tolerance: the f32 accumulation bound
//! `reference::quant::error_bound` (linear in the reduction depth, so a wrong
//! nibble, scale, min, row or column is far outside it), plus one rounding to
//! the output dtype, plus the SiLU propagation bound. Shapes are small: the
//! interpreter is slow.

use crate::common::{cases, f32_or_bf16};
use dsl_core::DType;
use dsl_core::half::{bf16, f16};
use dsl_core::interp::{Cpu, Element};
use kernels::dequant::{
    GEMV_MAX_M, QuantFormat, Repacked, fused, gemm, gemm_grid, gemv, gemv_grid, gemv_tiles,
    interleave_gate_up, repack,
};
use kernels::reference::quant as r;
use proptest::prelude::*;
use std::marker::PhantomData;
use tests::reference::Rng;

/// A random finite f16 of either sign with exponent in `[lo, hi)`.
fn f16_value(rng: &mut Rng, lo: i32, hi: i32) -> f16 {
    let e = lo + rng.below((hi - lo) as u64) as i32;
    let mant = 1.0 + rng.uniform(0.0, 1.0);
    let v = mant * 2f32.powi(e);
    f16::from_f32(if rng.next_u64() & 1 == 0 { v } else { -v })
}

/// Random GGUF bytes of a weight `[n, k]` in `format`.
pub fn gguf_weight(rng: &mut Rng, format: QuantFormat, n: usize, k: usize) -> Vec<u8> {
    let blocks = n * k / 32;
    let mut out = Vec::with_capacity(blocks * format.block_bytes());
    for _ in 0..blocks {
        out.extend_from_slice(&f16_value(rng, -8, 0).to_le_bytes());
        if format == QuantFormat::Q4_1 {
            out.extend_from_slice(&f16_value(rng, -6, 1).to_le_bytes());
        }
        out.extend((0..format.quant_bytes()).map(|_| rng.next_u64() as u8));
    }
    out
}

/// A random weight `[n, k]` (or the interleaved gate/up pair with `silu`)
/// with its GGUF bytes (gate, then up).
pub fn random_weight(
    rng: &mut Rng,
    format: QuantFormat,
    n: usize,
    k: usize,
    silu: bool,
) -> (Repacked, Vec<Vec<u8>>) {
    let g = gguf_weight(rng, format, n, k);
    let gr = repack(format, &g, n, k).unwrap();
    if silu {
        let u = gguf_weight(rng, format, n, k);
        let ur = repack(format, &u, n, k).unwrap();
        (interleave_gate_up(&gr, &ur).unwrap(), vec![g, u])
    } else {
        (gr, vec![g])
    }
}

/// Activation storage dtypes.
pub trait Act: Element {
    /// Rounds an f32 to the storage type.
    fn from_f32(v: f32) -> Self;
    /// Bound on the relative error of the final rounding (half an ulp of the
    /// value's binade: 2^-8 for bf16; 2^-23, twice that, for f32).
    const ROUND: f64;
}

impl Act for f32 {
    fn from_f32(v: f32) -> Self {
        v
    }
    const ROUND: f64 = 1.0 / 8_388_608.0;
}

impl Act for bf16 {
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    const ROUND: f64 = 1.0 / 256.0;
}

/// Non-zero activations with magnitudes in `[1/64, 2)`.
pub fn activations<T: Act>(rng: &mut Rng, n: usize) -> Vec<T> {
    (0..n)
        .map(|_| {
            let m = rng.uniform(1.0 / 64.0, 2.0);
            T::from_f32(if rng.next_u64() & 1 == 0 { m } else { -m })
        })
        .collect()
}

/// The reference GEMVs of a random weight's GGUF bytes `raws` (from
/// [`random_weight`]: the weight, and with SiLU the up weight) on `x`.
pub fn reference_gemvs(
    format: QuantFormat,
    raws: &[Vec<u8>],
    n: usize,
    k: usize,
    x: &[f64],
    m: usize,
) -> Vec<r::Gemv> {
    raws.iter().map(|raw| r::gemv(format, raw, n, k, x, m)).collect()
}

/// Output `i` of the references `ys` (from [`reference_gemvs`]) and its
/// tolerance before any rounding of the kernel's result: `ys[0]`'s value
/// within `bound`, or with an up product `silu(gate) * up` within the SiLU
/// propagation bound of both products' `bound`s.
fn want_and_tol(ys: &[r::Gemv], i: usize, bound: impl Fn(&r::Gemv, usize) -> f64) -> (f64, f64) {
    let (g, eg) = (&ys[0], bound(&ys[0], i));
    match ys.get(1) {
        Some(u) => (r::silu_mul(g.y[i], u.y[i]), r::silu_mul_bound(g.y[i], u.y[i], eg, bound(u, i))),
        None => (g.y[i], eg),
    }
}

/// Checks every output `got[i]` (row-major, `n` per row) against output `i`
/// of the references `ys` ([`want_and_tol`] within `bound`), widened by the
/// final rounding to `T`; a failure names the case (`what`) and the output.
pub fn check_outputs<T: Act>(
    got: &[f64],
    ys: &[r::Gemv],
    n: usize,
    bound: impl Fn(&r::Gemv, usize) -> f64,
    what: &str,
) -> Result<(), TestCaseError> {
    for (i, &got_i) in got.iter().enumerate() {
        let (want, tol) = want_and_tol(ys, i, &bound);
        // The final rounding is of the computed value, itself within `tol`.
        let tol = rounded_tol::<T>(want, tol);
        prop_assert!(
            (got_i - want).abs() <= tol,
            "{what}: out[{}, {}] = {got_i}, want {want} (tol {tol:e})",
            i / n,
            i % n
        );
    }
    Ok(())
}

/// `tol` widened by the final rounding to `T` of a computed value within
/// `tol` of `want`.
fn rounded_tol<T: Act>(want: f64, tol: f64) -> f64 {
    tol + T::ROUND * (want.abs() + tol) + 1e-30
}

/// A random case of a quantized product: the RNG seed, the weight format,
/// whether the weight is an interleaved gate/up pair (SiLU-mul), and the
/// product's shape (`[m, k]` activations, `n` outputs per row).
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub seed: u64,
    pub format: QuantFormat,
    pub silu: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

impl Case {
    /// The case's RNG after its first draws, the `m x k` activations.
    pub fn activations<T: Act>(&self) -> (Rng, Vec<T>) {
        let mut rng = Rng::new(self.seed);
        let x = activations::<T>(&mut rng, self.m * self.k);
        (rng, x)
    }
}

/// Which kernel and tiles: GEMV `(m_block, block_n, block_k)` or GEMM
/// `(block_m, block_n, block_k)`.
#[derive(Clone, Copy, Debug)]
enum Tiles {
    Gemv(usize, usize, usize),
    Gemm(usize, usize, usize),
    /// The GEMM with its product swapped (`SWAP`).
    Swap(usize, usize, usize),
    /// The stream-K swapped GEMM (`gemm_stream_k`) on a grid of `g` programs.
    StreamK(usize, usize, usize, usize),
}

/// Runs one dequant kernel on the interpreter for the product of shape
/// `(m, n, k)` with `T` activations and an `O` output; returns `out` as f64.
fn run<T: Act, O: Act>(
    format: QuantFormat,
    silu: bool,
    tiles: Tiles,
    x: &[T],
    quants: &[u8],
    scales: &[f16],
    (m, n, k): (usize, usize, usize),
) -> Result<Vec<f64>, String> {
    let mut cpu = Cpu::new();
    let (xp, qp, sp) = (cpu.upload(x), cpu.upload(quants), cpu.upload(scales));
    let op = cpu.zeros::<O>(m * n);
    let (mi, ni, ki) = (m as i32, n as i32, k as i32);
    macro_rules! go {
        ($k:path, $grid:expr, $a:expr, $b:expr, $c:expr $(, $swap:expr)?) => {{
            use $k as kk;
            let args = kk::Args {
                x_ptr: xp.cast(),
                q_ptr: qp.cast(),
                s_ptr: sp.cast(),
                out_ptr: op.cast(),
                m: mi,
                n: ni,
                k: ki,
                _marker: PhantomData,
            };
            let config = kk::Config::new(T::DTYPE, O::DTYPE, format, silu, $a, $b, $c $(, $swap)?);
            kk::interpret(&mut cpu, $grid, &config, &args).map_err(|e| e.to_string())?
        }};
    }
    match tiles {
        Tiles::Gemv(a, b, c) => {
            let grid = gemv_grid(m, n, silu, a, b);
            go!(gemv::gemv, grid, a, b, c)
        }
        Tiles::StreamK(a, b, c, g) => {
            use kernels::dequant::stream_k::gemm_stream_k as kk;
            if O::DTYPE != T::DTYPE {
                return Err("gemm_stream_k writes its activations' dtype".into());
            }
            // NaN garbage in the workspace: every slot read must be written first.
            let ws = cpu.upload(&vec![f32::NAN; g * a * b]);
            let flags = cpu.zeros::<i32>(g);
            let args = kk::Args {
                x_ptr: xp.cast(),
                q_ptr: qp.cast(),
                s_ptr: sp.cast(),
                out_ptr: op.cast(),
                ws_ptr: ws.cast(),
                flag_ptr: flags.cast(),
                m: mi,
                n: ni,
                k: ki,
                _marker: PhantomData,
            };
            let config = kk::Config::new(T::DTYPE, format, silu, a, b, c);
            kk::interpret(&mut cpu, [g as u32, 1, 1], &config, &args).map_err(|e| e.to_string())?;
            let left = cpu.read(flags);
            if left.iter().any(|&v| v != 0) {
                return Err(format!("flags not reset after the launch: {left:?}"));
            }
        }
        Tiles::Gemm(a, b, c) | Tiles::Swap(a, b, c) => {
            let grid = gemm_grid(m, n, silu, a, b);
            let swap = matches!(tiles, Tiles::Swap(..));
            go!(gemm::gemm, grid, a, b, c, swap)
        }
    }
    Ok(cpu.read(op).iter().map(|v| v.to_f64()).collect())
}

/// One random case: builds the weight(s), runs the kernel, checks every
/// output against the reference within the documented bound.
fn case<T: Act>(c: Case, tiles: Tiles) -> Result<(), TestCaseError> {
    let Case { format, silu, m, n, k, .. } = c;
    let (mut rng, x) = c.activations::<T>();
    let xf: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
    let block_k = match tiles {
        Tiles::Gemv(_, _, bk)
        | Tiles::Gemm(_, _, bk)
        | Tiles::Swap(_, _, bk)
        | Tiles::StreamK(_, _, bk, _) => bk,
    };
    let (weight, raws) = random_weight(&mut rng, format, n, k, silu);
    let ys = reference_gemvs(format, &raws, n, k, &xf, m);
    let got = run::<T, T>(format, silu, tiles, &x, &weight.quants, &weight.scales, (m, n, k))
        .map_err(TestCaseError::fail)?;
    let bound = |y: &r::Gemv, i: usize| tile_bound(tiles, format, k, block_k, T::DTYPE, y, i);
    check_outputs::<T>(&got, &ys, n, bound, &format!("{format:?} {tiles:?} silu={silu} m={m} n={n} k={k}"))
}

/// The reference bound of output `i` (reference `y`) of the kernel `tiles`
/// with `dt` activations and a K tile of `block_k`: the GEMM rounds its
/// operands to f16 (see `reference::quant`).
fn tile_bound(
    tiles: Tiles,
    format: QuantFormat,
    k: usize,
    block_k: usize,
    dt: DType,
    y: &r::Gemv,
    i: usize,
) -> f64 {
    match tiles {
        Tiles::Gemv(..) => r::error_bound(format, k, block_k, y.abs[i]),
        Tiles::Gemm(..) => r::gemm_error_bound(format, k, block_k, y.abs[i], y.l1[i]),
        Tiles::Swap(..) | Tiles::StreamK(..) => r::gemm_swap_error_bound(format, k, y.abs[i], y.l1[i], dt),
    }
}

/// Checks that the f32 outputs `wide` of a launch with bf16 activations are
/// its f32 sums unrounded: each rounds (to nearest even) to the bf16 output
/// `narrow` of the same launch with a bf16 output, bit for bit, and most are
/// not bf16 values themselves.
pub fn unrounded_f32_outputs(wide: &[f64], narrow: &[f64], what: &str) {
    assert_eq!(wide.len(), narrow.len(), "{what}");
    let mut off_grid = 0;
    for (i, (&w, &b)) in wide.iter().zip(narrow).enumerate() {
        let r = bf16::from_f64(w);
        assert_eq!(
            r.to_bits(),
            bf16::from_f64(b).to_bits(),
            "{what}: out[{i}]: f32 {w} rounds to {r}, not {b}"
        );
        off_grid += usize::from(r.to_f64() != w);
    }
    assert!(
        2 * off_grid > wide.len(),
        "{what}: only {off_grid} of {} f32 outputs are not bf16 values",
        wide.len()
    );
}

/// The LM head's output dtype: with bf16 activations and an f32 output,
/// the GEMV, the GEMM (plain and swapped) and the fused GEMV with the norm
/// prologue store their f32 sums unrounded ([`unrounded_f32_outputs`]),
/// and the plain products' f32 outputs meet the reference within f32's
/// final rounding, every format, ragged N and K.
#[test]
fn f32_outputs_of_bf16_activations_are_unrounded() {
    let (m, n, k) = (3, 37, 160);
    for (i, format) in [QuantFormat::Q4_0, QuantFormat::Q4_1, QuantFormat::Q8_0].into_iter().enumerate() {
        let c = Case { seed: 0x10917 + i as u64, format, silu: false, m, n, k };
        let (mut rng, x) = c.activations::<bf16>();
        let xf: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
        let (w, raws) = random_weight(&mut rng, format, n, k, false);
        let ys = reference_gemvs(format, &raws, n, k, &xf, m);
        for tiles in [Tiles::Gemv(2, 8, 64), Tiles::Gemm(16, 16, 64), Tiles::Swap(16, 16, 64)] {
            let what = format!("{format:?} {tiles:?}");
            let planes = (&w.quants[..], &w.scales[..]);
            let wide = run::<bf16, f32>(format, false, tiles, &x, planes.0, planes.1, (m, n, k)).unwrap();
            let narrow = run::<bf16, bf16>(format, false, tiles, &x, planes.0, planes.1, (m, n, k)).unwrap();
            unrounded_f32_outputs(&wide, &narrow, &what);
            let bound = |y: &r::Gemv, i: usize| tile_bound(tiles, format, k, 64, DType::BF16, y, i);
            check_outputs::<f32>(&wide, &ys, n, bound, &what).unwrap();
        }
        let nw = activations::<bf16>(&mut rng, k);
        let fused = |wide: bool| {
            let (x, mnk) = (&x[..k], (1, n, k));
            let (q, s) = (&w.quants[..], &w.scales[..]);
            let norm = (format, false, Fuse::Norm, (1, 8, 64));
            if wide {
                run_fused::<bf16, f32>(norm.0, norm.1, norm.2, norm.3, x, &nw, &vec![0.0; n], q, s, mnk, 1e-5)
            } else {
                run_fused::<bf16, bf16>(
                    norm.0,
                    norm.1,
                    norm.2,
                    norm.3,
                    x,
                    &nw,
                    &vec![bf16::ZERO; n],
                    q,
                    s,
                    mnk,
                    1e-5,
                )
            }
            .unwrap()
        };
        unrounded_f32_outputs(&fused(true), &fused(false), &format!("{format:?} fused norm"));
    }
}

/// GEMV tiles for `format`: `(m_block, block_n, block_k)` from small choices.
fn gemv_tiles_strategy(format: QuantFormat) -> impl Strategy<Value = (usize, usize, usize)> {
    let bk = if format == QuantFormat::Q8_0 {
        prop_oneof![Just(32), Just(64), Just(128)].boxed()
    } else {
        prop_oneof![Just(32), Just(64), Just(128), Just(256)].boxed()
    };
    (prop_oneof![Just(1), Just(2), Just(4), Just(8)], prop_oneof![Just(2), Just(4), Just(8), Just(16)], bk)
}

fn format_strategy() -> impl Strategy<Value = QuantFormat> {
    prop_oneof![Just(QuantFormat::Q4_0), Just(QuantFormat::Q4_1), Just(QuantFormat::Q8_0)]
}

/// The GEMM tests' `(BLOCK_M, BLOCK_N, BLOCK_K)`: 16x16, 16x32 or 32x16
/// output tiles, K tiles of 64 or 128.
fn gemm_tiles_strategy() -> impl Strategy<Value = (usize, usize, usize)> {
    let mn = prop_oneof![Just((16usize, 16usize)), Just((16, 32)), Just((32, 16))];
    (mn, prop_oneof![Just(64usize), Just(128)]).prop_map(|((bm, bn), bk)| (bm, bn, bk))
}

#[allow(clippy::too_many_arguments)]
fn gemv_case(
    format: QuantFormat,
    (mb, bn, bk): (usize, usize, usize),
    m: usize,
    n: usize,
    kb: usize,
    silu: bool,
    bf: bool,
    seed: u64,
) -> Result<(), TestCaseError> {
    case_dt(bf, Case { seed, format, silu, m, n, k: 32 * kb }, Tiles::Gemv(mb, bn, bk))
}

/// [`case`] with bf16 (`bf`) or f32 activations.
fn case_dt(bf: bool, c: Case, tiles: Tiles) -> Result<(), TestCaseError> {
    f32_or_bf16!(bf, case(c, tiles))
}

proptest! {
    #![proptest_config(cases(64))]

    /// GEMV: all formats, both dtypes, odd M in 1..16, ragged N and K.
    #[test]
    fn gemv_random(
        (format, tiles) in format_strategy().prop_flat_map(|f| (Just(f), gemv_tiles_strategy(f))),
        m in prop_oneof![Just(1usize), Just(3), Just(5), Just(7), Just(9), Just(15)],
        n in 1usize..40,
        kb in 1usize..13,
        silu in any::<bool>(),
        bf in any::<bool>(),
        seed in any::<u64>(),
    ) {
        gemv_case(format, tiles, m, n, kb, silu, bf, seed)?;
    }
}

proptest! {
    #![proptest_config(cases(40))]

    /// GEMM, plain and swapped (`SWAP`: weights as the product's `a`,
    /// activations as its `b`): all formats, both dtypes, ragged M, N and K.
    #[test]
    fn gemm_random(
        format in format_strategy(),
        (bm, bn, bk) in gemm_tiles_strategy(),
        swap in any::<bool>(),
        m in 1usize..40,
        n in 1usize..40,
        kb in 1usize..7,
        silu in any::<bool>(),
        bf in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let tiles = if swap { Tiles::Swap(bm, bn, bk) } else { Tiles::Gemm(bm, bn, bk) };
        case_dt(bf, Case { seed, format, silu, m, n, k: 32 * kb }, tiles)?;
    }
}

proptest! {
    #![proptest_config(cases(48))]

    /// The stream-K swapped GEMM: all formats, both dtypes, ragged M and N,
    /// K a multiple of `BLOCK_K`, and grids from one program per tile up to
    /// more programs than iterations (some ranges empty), so pieces start
    /// and end anywhere in a tile and one tile may gather several partial
    /// sums. The flags must be zero again after the launch.
    #[test]
    fn gemm_stream_k_random(
        format in format_strategy(),
        (bm, bn, bk) in gemm_tiles_strategy(),
        m in 1usize..40,
        n in 1usize..40,
        kt in 1usize..5,
        silu in any::<bool>(),
        bf in any::<bool>(),
        extra in 0usize..64,
        seed in any::<u64>(),
    ) {
        let rows = if silu { 2 * n } else { n };
        let tiles = m.div_ceil(bm) * rows.div_ceil(bn);
        let g = tiles + extra % (tiles * kt + 3);
        let c = Case { seed, format, silu, m, n, k: 32 * (kt * bk / 32) };
        case_dt(bf, c, Tiles::StreamK(bm, bn, bk, g))?;
    }
}

/// The stream-K GEMM refuses a grid with fewer programs than output tiles
/// and a K that is not a multiple of `BLOCK_K` (it would skip iterations).
#[test]
fn gemm_stream_k_rejects_what_it_cannot_cover() {
    let c = Case { seed: 3, format: QuantFormat::Q4_1, silu: false, m: 20, n: 40, k: 128 };
    let too_few = case::<bf16>(c, Tiles::StreamK(16, 16, 64, 3));
    let ragged_k = case::<bf16>(Case { k: 96, ..c }, Tiles::StreamK(16, 16, 64, 9));
    for r in [too_few, ragged_k] {
        let e = r.expect_err("must be refused").to_string();
        assert!(e.contains("gemm_stream_k needs K % BLOCK_K == 0"), "{e}");
    }
}

/// The untuned GEMV tiles on a real-model shape: one token through a
/// SmolLM2 gate/up projection (K = 576, N = 1536, SiLU-mul fused), every
/// format, bf16, with the tiles the runtime picks by default (a K tile of at
/// least 256 that does not divide 576, so the masked K tail runs too).
#[test]
fn gemv_smollm2_gate_up() {
    for format in [QuantFormat::Q4_1, QuantFormat::Q4_0, QuantFormat::Q8_0] {
        let t = gemv_tiles(format, 1, 2 * 1536, 576);
        assert!(t.m_block == 1 && t.block_k >= 256 && 576 % t.block_k != 0, "{t:?}");
        gemv_case(format, (t.m_block, t.block_n, t.block_k), 1, 1536, 18, true, true, 11).unwrap();
    }
}

/// Every M of the GEMV path with the default tiles (M_BLOCK 1, 2, 4, 8 and
/// two programs along M from 9 on), Q4_1 in f32 at a small shape.
#[test]
fn gemv_every_m() {
    for m in 1..=GEMV_MAX_M {
        let t = gemv_tiles(QuantFormat::Q4_1, m, 24, 96);
        gemv_case(QuantFormat::Q4_1, (t.m_block, t.block_n, t.block_k), m, 24, 3, false, false, m as u64)
            .unwrap();
    }
}

/// The tolerance is tight enough to catch a single wrong weight: flipping one
/// nibble of the repacked quants (or swapping Q4_1's `d` and `m`) fails.
#[test]
fn corrupted_weights_are_caught() {
    let (m, n, k) = (3, 5, 96);
    let mut rng = Rng::new(3);
    let x = activations::<f32>(&mut rng, m * k);
    let xf: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
    let raw = gguf_weight(&mut rng, QuantFormat::Q4_1, n, k);
    let want = r::gemv(QuantFormat::Q4_1, &raw, n, k, &xf, m);
    let w = repack(QuantFormat::Q4_1, &raw, n, k).unwrap();
    let tiles = Tiles::Gemv(4, 2, 64);
    let within = |got: &[f64]| {
        got.iter().enumerate().all(|(i, g)| {
            (g - want.y[i]).abs()
                <= r::error_bound(QuantFormat::Q4_1, k, 64, want.abs[i]) + 1e-6 * want.y[i].abs()
        })
    };
    let ok = run::<f32, f32>(QuantFormat::Q4_1, false, tiles, &x, &w.quants, &w.scales, (m, n, k)).unwrap();
    assert!(within(&ok));
    let mut bad = w.quants.clone();
    bad[3 * 48 + 17] ^= 0x10;
    let got = run::<f32, f32>(QuantFormat::Q4_1, false, tiles, &x, &bad, &w.scales, (m, n, k)).unwrap();
    assert!(!within(&got), "a flipped high nibble went unnoticed");
    let mut swapped = w.scales.clone();
    swapped.swap(2, 3);
    let got = run::<f32, f32>(QuantFormat::Q4_1, false, tiles, &x, &w.quants, &swapped, (m, n, k)).unwrap();
    assert!(!within(&got), "swapped d and m went unnoticed");
    // The GEMM's looser (f16-operand) bound still sees a wrong scale.
    let gemm = Tiles::Gemm(16, 16, 64);
    let within_gemm = |got: &[f64]| {
        got.iter().enumerate().all(|(i, g)| {
            (g - want.y[i]).abs()
                <= r::gemm_error_bound(QuantFormat::Q4_1, k, 64, want.abs[i], want.l1[i])
                    + 1e-6 * want.y[i].abs()
        })
    };
    let ok = run::<f32, f32>(QuantFormat::Q4_1, false, gemm, &x, &w.quants, &w.scales, (m, n, k)).unwrap();
    assert!(within_gemm(&ok));
    let got = run::<f32, f32>(QuantFormat::Q4_1, false, gemm, &x, &w.quants, &swapped, (m, n, k)).unwrap();
    assert!(!within_gemm(&got), "GEMM: swapped d and m went unnoticed");
    // So does the swapped GEMM's (bf16 weights).
    let xb: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
    let xbf: Vec<f64> = xb.iter().map(|v| v.to_f64()).collect();
    let want_b = r::gemv(QuantFormat::Q4_1, &raw, n, k, &xbf, m);
    let swap = Tiles::Swap(16, 16, 64);
    let within_swap = |got: &[f64]| {
        got.iter().enumerate().all(|(i, g)| {
            (g - want_b.y[i]).abs()
                <= r::gemm_swap_error_bound(QuantFormat::Q4_1, k, want_b.abs[i], want_b.l1[i], DType::BF16)
                    + (want_b.y[i].abs() + 1e-30) / 256.0
        })
    };
    let ok = run::<bf16, bf16>(QuantFormat::Q4_1, false, swap, &xb, &w.quants, &w.scales, (m, n, k)).unwrap();
    assert!(within_swap(&ok));
    let got = run::<bf16, bf16>(QuantFormat::Q4_1, false, swap, &xb, &w.quants, &swapped, (m, n, k)).unwrap();
    assert!(!within_swap(&got), "swapped GEMM: swapped d and m went unnoticed");
}

/// Which fusion of `kernels::dequant::fused` a case runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fuse {
    /// RMSNorm prologue (with or without SiLU-mul).
    Norm,
    /// Residual-add epilogue.
    Residual,
}

/// Runs a fused GEMV on the interpreter with norm weights `nw` and the
/// initial `out` (the residual), `m` rows of `out0.len() / m` values (the
/// output's row stride `ldo`) in `O`; returns `out` as f64.
#[allow(clippy::too_many_arguments)]
fn run_fused<T: Act, O: Act>(
    format: QuantFormat,
    silu: bool,
    fuse: Fuse,
    (mb, bn, bk): (usize, usize, usize),
    x: &[T],
    nw: &[T],
    out0: &[O],
    quants: &[u8],
    scales: &[f16],
    (m, n, k): (usize, usize, usize),
    eps: f32,
) -> Result<Vec<f64>, String> {
    let mut cpu = Cpu::new();
    let (xp, qp, sp, np) = (cpu.upload(x), cpu.upload(quants), cpu.upload(scales), cpu.upload(nw));
    let op = cpu.upload(out0);
    let grid = gemv_grid(m, n, silu, mb, bn);
    let flags = kernels::dequant::Fuse::NONE
        .with_silu(silu)
        .with_norm(fuse == Fuse::Norm)
        .with_residual(fuse == Fuse::Residual);
    macro_rules! go {
        ($k:path) => {{
            use $k as kk;
            let args = kk::Args {
                x_ptr: xp.cast(),
                q_ptr: qp.cast(),
                s_ptr: sp.cast(),
                nw_ptr: np.cast(),
                out_ptr: op.cast(),
                m: m as i32,
                n: n as i32,
                ldo: (out0.len() / m) as i32,
                k: k as i32,
                eps,
                _marker: PhantomData,
            };
            let config = kk::Config::new(T::DTYPE, O::DTYPE, format, flags, mb, bn, bk);
            kk::interpret(&mut cpu, grid, &config, &args).map_err(|e| e.to_string())?
        }};
    }
    go!(fused::gemv_fused);
    Ok(cpu.read(op).iter().map(|v| v.to_f64()).collect())
}

/// One random fused case against `reference::quant::{rms_normed,
/// residual_add}` composed with the plain GEMV reference. With the norm, the
/// kernel's f32 `rstd` may move an intermediate rounding of a normed
/// activation by a unit of `T` (see `reference::norm::add_rmsnorm_scaled`):
/// the tolerance adds two such units of every product and the f32 error of
/// `rstd` (a common factor), `(4 ROUND + 2^-19) * abs`.
fn fused_case<T: Act>(c: Case, fuse: Fuse, tiles: (usize, usize, usize)) -> Result<(), TestCaseError> {
    let Case { format, silu, m, n, k, .. } = c;
    let eps = 1e-5f32;
    let (mut rng, x) = c.activations::<T>();
    let nw = activations::<T>(&mut rng, k);
    let out0 = if fuse == Fuse::Residual {
        activations::<T>(&mut rng, m * n)
    } else {
        vec![T::from_f32(0.0); m * n]
    };
    let f64s = |v: &[T]| v.iter().map(|e| e.to_f64()).collect::<Vec<f64>>();
    let xf = match fuse {
        Fuse::Norm => r::rms_normed(&f64s(&x), &f64s(&nw), m, k, eps as f64, T::DTYPE, 1.0),
        Fuse::Residual => f64s(&x),
    };
    let (weight, raws) = random_weight(&mut rng, format, n, k, silu);
    let ys = reference_gemvs(format, &raws, n, k, &xf, m);
    let got = run_fused::<T, T>(
        format,
        silu,
        fuse,
        tiles,
        &x,
        &nw,
        &out0,
        &weight.quants,
        &weight.scales,
        (m, n, k),
        eps,
    )
    .map_err(TestCaseError::fail)?;
    // Two units of the normed activations' roundings, plus the f32 sum of
    // squares (at most ~20 roundings deep here) through `rsqrt`.
    let slack = if fuse == Fuse::Norm { 4.0 * T::ROUND + 32.0 * f64::powi(2.0, -24) } else { 0.0 };
    let bound = |y: &r::Gemv, i: usize| r::error_bound(format, k, tiles.2, y.abs[i]) + slack * y.abs[i];
    for (i, &got_i) in got.iter().enumerate() {
        let (y, tol) = want_and_tol(&ys, i, bound);
        let (want, tol) = match fuse {
            Fuse::Norm => (y, rounded_tol::<T>(y, tol)),
            Fuse::Residual => {
                let want = r::residual_add(y, out0[i].to_f64(), T::DTYPE);
                let tol = tol + T::ROUND * (y.abs() + tol) + T::ROUND * (want.abs() + 2.0 * tol) + 1e-30;
                (want, tol)
            }
        };
        prop_assert!(
            (got_i - want).abs() <= tol,
            "{format:?} {tiles:?} {fuse:?} silu={silu} m={m} n={n} k={k}: out[{}, {}] = {}, want {want} (tol {tol:e})",
            i / n,
            i % n,
            got_i
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(cases(40))]

    /// Fused GEMVs: all formats, both dtypes, the norm prologue (with and
    /// without SiLU-mul) and the residual epilogue, odd M, ragged N and K.
    #[test]
    fn fused_gemv_random(
        (format, tiles) in format_strategy().prop_flat_map(|f| (Just(f), gemv_tiles_strategy(f))),
        m in prop_oneof![Just(1usize), Just(3), Just(5), Just(9)],
        n in 1usize..40,
        kb in 1usize..13,
        fuse in prop_oneof![Just(Fuse::Norm), Just(Fuse::Residual)],
        silu in any::<bool>(),
        bf in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let silu = silu && fuse == Fuse::Norm;
        let c = Case { seed, format, silu, m, n, k: 32 * kb };
        f32_or_bf16!(bf, fused_case(c, fuse, tiles))?;
    }
}

/// The fused GEMVs at the SmolLM2 decode shapes with the runtime's tiles: the
/// QKV (N = 960) and gate/up (N = 1536, SiLU) projections with the norm
/// prologue and O/down (N = 576) with the residual epilogue, K = 576 (or 1536
/// for down), Q4_1 in f32 and bf16, plus an odd N.
#[test]
fn fused_gemv_smollm2_shapes() {
    let cases = [
        (960, 576, false, Fuse::Norm),
        (1536, 576, true, Fuse::Norm),
        (576, 576, false, Fuse::Residual),
        (576, 1536, false, Fuse::Residual),
        (577, 576, false, Fuse::Norm),
    ];
    for (i, &(n, k, silu, fuse)) in cases.iter().enumerate() {
        let rows = if silu { 2 * n } else { n };
        let t = gemv_tiles(QuantFormat::Q4_1, 1, rows, k);
        let tiles = (t.m_block, t.block_n, t.block_k);
        let c = Case { seed: i as u64, format: QuantFormat::Q4_1, silu, m: 1, n, k };
        fused_case::<f32>(c, fuse, tiles).unwrap();
        fused_case::<bf16>(Case { seed: i as u64 + 100, ..c }, fuse, tiles).unwrap();
    }
    // The tied LM head's format with the final norm, a ragged N.
    let t = gemv_tiles(QuantFormat::Q8_0, 1, 301, 576);
    let c = Case { seed: 7, format: QuantFormat::Q8_0, silu: false, m: 1, n: 301, k: 576 };
    fused_case::<f32>(c, Fuse::Norm, (t.m_block, t.block_n, t.block_k)).unwrap();
}

/// A Q4_1 weight of `n x k` (GGUF blocks and repacked), f32 activations
/// `x` (`m x k`) and norm weights `nw`, drawn from `rng` in that order: the
/// operands of the fusion tests below.
struct Q4_1Gemv {
    x: Vec<f32>,
    nw: Vec<f32>,
    raw: Vec<u8>,
    w: Repacked,
    mnk: (usize, usize, usize),
}

impl Q4_1Gemv {
    fn new(rng: &mut Rng, (m, n, k): (usize, usize, usize)) -> Q4_1Gemv {
        let x = activations::<f32>(rng, m * k);
        let nw = activations::<f32>(rng, k);
        let raw = gguf_weight(rng, QuantFormat::Q4_1, n, k);
        let w = repack(QuantFormat::Q4_1, &raw, n, k).unwrap();
        Q4_1Gemv { x, nw, raw, w, mnk: (m, n, k) }
    }

    /// The fused GEMV (no SiLU, eps 1e-5) with `tiles`, norm weights `nw`
    /// and the initial output `out0`.
    fn run(&self, fuse: Fuse, tiles: (usize, usize, usize), nw: &[f32], out0: &[f32]) -> Vec<f64> {
        let w = &self.w;
        run_fused::<f32, f32>(
            QuantFormat::Q4_1,
            false,
            fuse,
            tiles,
            &self.x,
            nw,
            out0,
            &w.quants,
            &w.scales,
            self.mnk,
            1e-5,
        )
        .unwrap()
    }
}

/// The norm and residual tolerances catch a missing or wrong fusion: the
/// norm prologue without its weights (all ones) and the residual epilogue
/// without the residual (a zeroed `out`) both fail the check.
#[test]
fn fused_gemv_wrong_fusion_is_caught() {
    let (m, n, k) = (2, 5, 96);
    let mut rng = Rng::new(5);
    let g = Q4_1Gemv::new(&mut rng, (m, n, k));
    let (nw, raw) = (&g.nw, &g.raw);
    let xf: Vec<f64> = g.x.iter().map(|v| v.to_f64()).collect();
    let nf: Vec<f64> = nw.iter().map(|v| v.to_f64()).collect();
    let normed = r::rms_normed(&xf, &nf, m, k, 1e-5, dsl_core::DType::F32, 1.0);
    let want = r::gemv(QuantFormat::Q4_1, raw, n, k, &normed, m);
    let tiles = (2, 4, 64);
    let within = |got: &[f64], want: &[f64]| {
        got.iter().zip(want).all(|(g, w)| (g - w).abs() <= 1e-4 * w.abs().max(1.0))
    };
    let zeros = vec![0.0f32; m * n];
    let run = |nw: &[f32], out0: &[f32], fuse| g.run(fuse, tiles, nw, out0);
    assert!(within(&run(nw, &zeros, Fuse::Norm), &want.y));
    assert!(!within(&run(&vec![1.0; k], &zeros, Fuse::Norm), &want.y), "norm weights ignored");
    let plain = r::gemv(QuantFormat::Q4_1, raw, n, k, &xf, m);
    let res: Vec<f32> = activations::<f32>(&mut rng, m * n);
    let want_res: Vec<f64> =
        plain.y.iter().zip(&res).map(|(y, r)| r::residual_add(*y, *r as f64, dsl_core::DType::F32)).collect();
    assert!(within(&run(nw, &res, Fuse::Residual), &want_res));
    assert!(!within(&run(nw, &zeros, Fuse::Residual), &want_res), "residual ignored");
}

/// The fused GEMV with output rows `ldo > n` apart (a column range of a
/// wider output): the same bits in the product's columns as with `ldo = n`
/// and the columns past `n` untouched, with the norm prologue and with the
/// residual epilogue.
#[test]
fn fused_gemv_writes_a_column_range_of_a_wider_output() {
    let mut rng = Rng::new(0x1d1);
    let (m, n, k, ldo) = (1, 12, 96, 29);
    let g = Q4_1Gemv::new(&mut rng, (m, n, k));
    for fuse in [Fuse::Norm, Fuse::Residual] {
        let wide0 = activations::<f32>(&mut rng, m * ldo);
        let narrow0: Vec<f32> = wide0.chunks(ldo).flat_map(|r| r[..n].to_vec()).collect();
        let run = |out0: &[f32]| g.run(fuse, (1, 4, 64), &g.nw, out0);
        let (narrow, wide) = (run(&narrow0), run(&wide0));
        assert_eq!(&wide[..n], &narrow[..], "{fuse:?}");
        let rest: Vec<f64> = wide0[n..].iter().map(|v| *v as f64).collect();
        assert_eq!(&wide[n..], &rest[..], "{fuse:?}: columns past n");
    }
}
