//! Add+RMSNorm and RMSNorm over the rows (tokens) of a `[tokens, hidden]`
//! activation, as a transformer block applies them before attention and MLP.
//!
//! # Math
//!
//! For one row `x` of `n = n_cols` elements, with weight `w` (one per column)
//! and `eps`:
//!
//! ```text
//! rstd = 1 / sqrt(sum_i x_i^2 / n + eps)          (one rsqrt per row)
//! rmsnorm(x)_i = x_i * rstd * w_i
//! ```
//!
//! The row statistic is computed once per row and applied with multiplies: no
//! division per element (a division per element costs more than the memory
//! traffic of a bf16 row). The sum of squares is [`sum_squares`]: exact up
//! to far below f32's precision and independent of the order and tile of
//! the reduction, so every kernel that normalizes a row (these and the
//! fused prologue of `dequant::linear`) gets the same `rstd` bits.
//!
//! # Rounding (exact sequence; `round_T` rounds to the storage dtype `T`,
//! nearest-even; all arithmetic is f32)
//!
//! [`add_rmsnorm`] follows the peer baseline of `shared/bench/peers.py`
//! (`h = x + r; out = (h.float() * rsqrt(mean(h.float()^2) + eps)).to(T) * w`),
//! so that its outputs are those of the torch code it is benchmarked against:
//!
//! ```text
//! h     = round_T(f32(x) + f32(r))             stored to h_ptr (the new residual)
//! rstd  = rsqrt(sum(f32(h)^2) / n + eps)       from the *stored* (rounded) h
//! nrm   = round_T(f32(h) * rstd)               torch's `.to(T)`
//! out   = round_T(f32(nrm) * f32(w))           torch's `T * T` (f32 multiply, one rounding)
//! ```
//!
//! [`rmsnorm`] follows llama.cpp / the model code (with `ROUND_NORMED`,
//! add+RMSNorm's sequence above instead: the batch-invariant model's first
//! norm, which must equal the fused prologue): everything in f32 and one
//! rounding at the end:
//!
//! ```text
//! rstd  = rsqrt(sum(f32(x)^2) / n + eps)
//! out   = round_T(f32(x) * rstd * f32(w))
//! ```
//!
//! For `T = f32` every `round_T` is the f32 rounding the arithmetic does anyway.
//!
//! # Tiling
//!
//! One program per row (grid `[tokens, 1, 1]`); the whole row is one tile of
//! `BLOCK >= n_cols` elements, so the row is read once and the statistic is a
//! single in-register/warp-shuffle reduction. A `BLOCK` that is not a power of
//! two (e.g. 576) is padded to the next power of two and masked by the front
//! end; columns `>= n_cols` are masked in every load and store.
//!
//! # Shape and layout contract
//!
//! Row-major `[tokens, hidden]` tensors whose rows start `stride` elements
//! apart (`stride >= n_cols`, contiguous within a row); `x`, `r`, `out` and `h`
//! share the same `stride`; `w` is contiguous `[hidden]`. `out`/`h` must not
//! alias `x`/`r` of a *different* row (in-place on the same row is fine: each
//! program reads its row fully before writing it). Offsets are 32-bit: `tokens
//! * stride < 2^31`.
//!
//! # Parameters
//!
//! - `T: Float`: the storage dtype of every tensor (f32, bf16, f16); math is f32.
//! - `n_cols: i32`: the hidden size; `stride: i32`: the row stride in elements;
//!   `eps: f32`: added to the mean square (1e-5 in peers.py, SmolLM2's rms_norm_eps).
//! - `#[constexpr] BLOCK`: the tile length, `>= n_cols` (the row length itself
//!   or its next power of two).
//! - `num_warps`: Triton's heuristic is 4 for rows up to 1024 columns and 8 at
//!   4096 ([`warps_for`]); autotune configs 4/8/16 keyed on `n_cols` are declared.

use dsl_macros::{kernel, kernel_fn};

/// The most elements [`sum_squares`] takes.
pub const SUM_SQUARES_MAX: usize = 1 << 16;

/// The fixed-point shift of [`sum_squares`]: `2^16` terms of at most
/// `2^(24 + 22)` sum below `2^62`.
const SUM_SQUARES_SHIFT: i32 = 22;

/// `sum(x * x)` over the 1-D f32 tile `x` of `n` elements (padding lanes
/// zero), computed so that the result depends only on the multiset of
/// squares and never on the order or thread layout of the reduction: every
/// square `t = x * x` (f32, exact for bf16/f16 inputs) is turned into a
/// fixed-point integer relative to the largest square's exponent `E`
/// (`mant * 2^(e - E + S)` truncated, `S = 22`, so up to `2^16` terms of at
/// most `2^(24 + S)` fit an i64), the integers are summed exactly and the
/// sum is converted back once (`* 2^(E - 150 - S)`). Each term loses at
/// most `2^-45` of the largest one, far below f32's precision. A row
/// holding an infinity or NaN gives NaN.
///
/// Every RMSNorm statistic of the model goes through this function, so a
/// norm fused into a GEMM prologue and the norm kernels agree bit for bit
/// whatever their tiles and warps (the batch-invariance guarantee).
#[kernel_fn]
pub fn sum_squares(x: Tensor, n: usize) -> Tensor {
    static_assert(n <= SUM_SQUARES_MAX, "sum_squares takes at most 65536 elements");
    let t = x * x;
    let top = max(square_exponent(t), 0);
    fixed_to_f32(sum(square_fixed(t, top), 0), top)
}

/// The exponent fields of the squares `t` (sign cleared, so a NaN of either
/// sign reads as 255), at least 1: subnormals share the smallest normal's
/// scale. [`sum_squares`]' `E` is their maximum.
#[kernel_fn]
fn square_exponent(t: Tensor) -> Tensor {
    maximum((t.bitcast(i32) & 0x7FFF_FFFF) >> 23, 1)
}

/// The squares `t` as [`sum_squares`]' fixed-point integers (i64) relative to
/// the exponent `top` (at least every [`square_exponent`]). The same integer
/// is `t * 2^(S + 150 - top)` truncated, but the GPU's f32-to-i64
/// conversion costs more than these shifts.
#[kernel_fn]
fn square_fixed(t: Tensor, top: Tensor) -> Tensor {
    // Fixed (not derived from the tile), so every tile width truncates alike.
    let s = SUM_SQUARES_SHIFT;
    let bits = t.bitcast(i32) & 0x7FFF_FFFF;
    let e = bits >> 23;
    let frac = bits & 0x7F_FFFF;
    let mant = where_(e > 0, frac | 0x80_0000, frac);
    let shift = minimum(top - maximum(e, 1), 63);
    (mant.to(i64) << s) >> shift.to(i64)
}

/// The f32 value of a sum `total` (i64) of [`square_fixed`] integers
/// relative to `top`; NaN when `top` is 255 (an infinity or NaN was squared).
#[kernel_fn]
fn fixed_to_f32(total: Tensor, top: Tensor) -> Tensor {
    // 2^(top - 150 - S) as two powers of two, each within f32's normal range.
    let p = top - 150 - SUM_SQUARES_SHIFT;
    let h1 = p / 2;
    let h2 = p - h1;
    let pow1 = ((h1 + 127) << 23).bitcast(f32);
    let pow2 = ((h2 + 127) << 23).bitcast(f32);
    where_(top >= 255, f32::NAN, total.to(f32) * pow1 * pow2)
}

/// [`rms_rstd_tiled`] of `rows` rows at once: `x_ptr + row_off[i]` holds
/// row `i`'s `n_cols` elements (in `T`); the `[rows]` statistics, each with
/// the bits [`rms_rstd`] gives its row.
#[kernel_fn]
pub fn rms_rstd_rows(
    x_ptr: Tensor,
    row_off: Tensor,
    n_cols: Tensor,
    eps: Tensor,
    rows: usize,
    tile: usize,
) -> Tensor {
    let cols = arange(0, tile);
    let at = expand_dims(row_off, 1) + expand_dims(cols, 0);
    let mut e = full([rows, tile], 1, i32);
    for k0 in range(0, n_cols, tile) {
        let ok = broadcast_to(expand_dims(k0 + cols < n_cols, 0), [rows, tile]);
        let v = load(x_ptr + at + k0, mask = ok, other = 0.0).to(f32);
        e = maximum(e, square_exponent(v * v));
    }
    let top = max(e, 1);
    let top2 = expand_dims(top, 1);
    let mut acc = zeros([rows, tile], i64);
    for k0 in range(0, n_cols, tile) {
        let ok = broadcast_to(expand_dims(k0 + cols < n_cols, 0), [rows, tile]);
        let v = load(x_ptr + at + k0, mask = ok, other = 0.0).to(f32);
        acc = acc + square_fixed(v * v, top2);
    }
    rsqrt(fixed_to_f32(sum(acc, 1), top) / n_cols + eps)
}

/// [`rms_rstd_rows`] of the rows `min(i, m - 1)`, `i < rows`, of the
/// `[m, n_cols]` row-major activation at `x_ptr` (`1 <= m <= rows`, a
/// runtime count): the same `[rows]` tile, bit for bit, but the statistic
/// is computed only for the `ceil(m / chunk)` chunks of `chunk` rows that
/// hold a real row, `tile` columns at a time; entries past the last real
/// row repeat its statistic. The exact statistic costs its arithmetic per
/// element, so a persistent step's product tasks, each of which needs
/// every row's statistic, pay for the rows of the batch instead of the
/// rows of the tile. `rows` is a multiple of `chunk`.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn rms_rstd_live_rows(
    x_ptr: Tensor,
    m: Tensor,
    n_cols: Tensor,
    eps: Tensor,
    rows: usize,
    chunk: usize,
    tile: usize,
) -> Tensor {
    static_assert(rows % chunk == 0, "rows must be a multiple of chunk");
    let groups = rows / chunk;
    let lane = arange(0, chunk as i32);
    let group = expand_dims(arange(0, groups as i32), 1);
    let mut rs = full([groups, chunk], 1.0, f32);
    for c in range(0, (m + (chunk as i32 - 1)) / chunk as i32) {
        let offs = minimum(c * chunk as i32 + lane, m - 1) * n_cols;
        let part = expand_dims(rms_rstd_rows(x_ptr, offs, n_cols, eps, chunk, tile), 0);
        rs = where_(group == c, broadcast_to(part, [groups, chunk]), rs);
    }
    let rs = reshape(rs, [rows]);
    let i = arange(0, rows as i32);
    // Row `m - 1`'s entry (a sum of it and zeros: exact, NaN kept).
    let last = sum(where_(i == m - 1, rs, 0.0), 0);
    where_(i >= m, last, rs)
}

/// [`rms_rstd`] of the `n_cols` elements (in `T`) at `x_ptr`, read in
/// tiles of `tile` columns: the statistic of a row too long for one tile,
/// bit for bit [`rms_rstd`]'s over the whole row (the largest exponent is
/// found first, then the fixed-point terms are integers, summed exactly in
/// any grouping). `n_cols <= SUM_SQUARES_MAX`.
#[kernel_fn]
pub fn rms_rstd_tiled(x_ptr: Tensor, n_cols: Tensor, eps: Tensor, tile: usize) -> Tensor {
    let cols = arange(0, tile);
    let mut e = full([tile], 1, i32);
    for k0 in range(0, n_cols, tile) {
        let kk = k0 + cols;
        let v = load(x_ptr + kk, mask = kk < n_cols, other = 0.0).to(f32);
        e = maximum(e, square_exponent(v * v));
    }
    let top = max(e, 0);
    let mut acc = zeros([tile], i64);
    for k0 in range(0, n_cols, tile) {
        let kk = k0 + cols;
        let v = load(x_ptr + kk, mask = kk < n_cols, other = 0.0).to(f32);
        acc = acc + square_fixed(v * v, top);
    }
    rsqrt(fixed_to_f32(sum(acc, 0), top) / n_cols + eps)
}

/// `rsqrt(sum(x^2) / n_cols + eps)` of the 1-D f32 row tile `x` (`block`
/// lanes, padding zero) with [`sum_squares`]: the RMSNorm statistic every
/// norm of the model uses.
#[kernel_fn]
pub fn rms_rstd(x: Tensor, n_cols: Tensor, eps: Tensor, block: usize) -> Tensor {
    rsqrt(sum_squares(x, block) / n_cols + eps)
}

/// The start of a row kernel (one program per row of `n_cols <= block`
/// elements, rows `stride` apart): programmatic dependent launch (sm_90),
/// where every input may come from the previous kernel, so it waits first and
/// then lets the next kernel start early; then this row of `x` in f32
/// (masked-off lanes 0). Returns the column tile, its mask, the row's
/// offsets and `x`.
#[kernel_fn]
pub fn load_row(
    x_ptr: Tensor,
    n_cols: Tensor,
    stride: Tensor,
    block: usize,
) -> (Tensor, Tensor, Tensor, Tensor) {
    gdc_wait();
    gdc_launch_dependents();
    let row = program_id(0);
    let cols = arange(0, block);
    let mask = cols < n_cols;
    let offs = row * stride + cols;
    (cols, mask, offs, load(x_ptr + offs, mask = mask, other = 0.0).to(f32))
}

/// Fused residual add + RMSNorm: `h = x + r` (stored to `h_ptr`, rounded to
/// `T`), `out = round_T(round_T(h * rstd) * w)` with `rstd` from the stored
/// `h`; see the module doc for the exact rounding sequence.
#[kernel(autotune(configs = [(num_warps = 4), (num_warps = 8), (num_warps = 16)], key = [n_cols]))]
#[allow(clippy::too_many_arguments)]
pub fn add_rmsnorm<T: Float>(
    x_ptr: Ptr<T>,
    r_ptr: Ptr<T>,
    w_ptr: Ptr<T>,
    out_ptr: Ptr<T>,
    h_ptr: Ptr<T>,
    n_cols: i32,
    stride: i32,
    eps: f32,
    #[constexpr] BLOCK: usize,
) {
    let (cols, mask, offs, x) = load_row(x_ptr, n_cols, stride, BLOCK);
    let r = load(r_ptr + offs, mask = mask, other = 0.0).to(f32);
    // The new residual, rounded to the storage dtype; the norm reads it back
    // at that precision (as torch's `h.float()` does).
    let h = (x + r).to(T);
    store(h_ptr + offs, h, mask = mask);
    let hf = h.to(f32);
    let rstd = rms_rstd(hf, n_cols, eps, BLOCK);
    let normed = (hf * rstd).to(T).to(f32);
    let w = load(w_ptr + cols, mask = mask, other = 0.0).to(f32);
    store(out_ptr + offs, (normed * w).to(T), mask = mask);
}

/// RMSNorm: `out = round_T(x * rsqrt(mean(x^2) + eps) * w)`, all in f32 (the
/// llama.cpp form), or with `ROUND_NORMED` add+RMSNorm's sequence
/// `round_T(round_T(x * rstd) * w)`; see the module doc.
#[kernel(autotune(configs = [(num_warps = 4), (num_warps = 8), (num_warps = 16)], key = [n_cols]))]
#[allow(clippy::too_many_arguments)]
pub fn rmsnorm<T: Float>(
    x_ptr: Ptr<T>,
    w_ptr: Ptr<T>,
    out_ptr: Ptr<T>,
    n_cols: i32,
    stride: i32,
    eps: f32,
    #[constexpr] BLOCK: usize,
    #[constexpr] ROUND_NORMED: bool,
) {
    let (cols, mask, offs, x) = load_row(x_ptr, n_cols, stride, BLOCK);
    let rstd = rms_rstd(x, n_cols, eps, BLOCK);
    let w = load(w_ptr + cols, mask = mask, other = 0.0).to(f32);
    if ROUND_NORMED {
        store(out_ptr + offs, ((x * rstd).to(T).to(f32) * w).to(T), mask = mask);
    } else {
        store(out_ptr + offs, (x * rstd * w).to(T), mask = mask);
    }
}

/// Warps for a row tile of `block` elements, as Triton's heuristic picks them:
/// 4 up to 2048 elements, 8 up to 8192, 16 beyond.
pub fn warps_for(block: usize) -> u32 {
    crate::warps_by_tile(block, 2048, 8192)
}

/// The row tile for `n_cols` columns: the next power of two (what Triton uses;
/// an exact non-power-of-two `BLOCK` is padded to the same tile).
pub fn block_for(n_cols: usize) -> usize {
    n_cols.next_power_of_two()
}

#[cfg(test)]
mod tests {
    use super::{
        SUM_SQUARES_SHIFT, rms_rstd, rms_rstd_live_rows, rms_rstd_rows, rms_rstd_tiled, sum_squares,
    };
    use dsl_core::DType;
    use dsl_core::interp::Cpu;
    use dsl_macros::kernel;
    use std::marker::PhantomData;

    /// Every form of the statistic on the `[16, n]` rows at `x_ptr`, into
    /// `out_ptr`: row 0 three ways (one tile of the whole row, tiles of 64
    /// columns, and the two-row form over row 0 twice) at 0..4; the 16-row
    /// form over the rows `min(i, m - 1)` at 4..20, and the live-row form of
    /// `m` rows in chunks of 4 rows by 128 columns at 20..36 and of 2 rows by
    /// 1024 at 36..52.
    #[kernel]
    fn rstd_forms<T: Float>(
        x_ptr: Ptr<T>,
        out_ptr: Ptr<f32>,
        m: i32,
        n: i32,
        eps: f32,
        #[constexpr] BLOCK: usize,
    ) {
        let cols = arange(0, BLOCK);
        let row = load(x_ptr + cols, mask = cols < n, other = 0.0).to(f32);
        store(out_ptr, rms_rstd(row, n, eps, BLOCK));
        store(out_ptr + 1, rms_rstd_tiled(x_ptr, n, eps, 64));
        store(out_ptr + 2 + arange(0, 2), rms_rstd_rows(x_ptr, full([2], 0, i32), n, eps, 2, 32));
        let offs = minimum(arange(0, 16), m - 1) * n;
        store(out_ptr + 4 + arange(0, 16), rms_rstd_rows(x_ptr, offs, n, eps, 16, 256));
        store(out_ptr + 20 + arange(0, 16), rms_rstd_live_rows(x_ptr, m, n, eps, 16, 4, 128));
        store(out_ptr + 36 + arange(0, 16), rms_rstd_live_rows(x_ptr, m, n, eps, 16, 2, 1024));
    }

    /// [`rstd_forms`] on the interpreter: `rows` holds 16 rows of `n`.
    fn forms(rows: &[f32], m: i32, n: usize) -> Vec<f32> {
        let mut cpu = Cpu::new();
        let (xp, op) = (cpu.upload(rows), cpu.zeros::<f32>(52));
        let args = rstd_forms::Args {
            x_ptr: xp.cast(),
            out_ptr: op,
            m,
            n: n as i32,
            eps: 1e-5,
            _marker: PhantomData,
        };
        let config = rstd_forms::Config::new(DType::F32, n.next_power_of_two());
        rstd_forms::interpret(&mut cpu, [1, 1, 1], &config, &args).unwrap();
        cpu.read(op)
    }

    /// `sum_squares` of the first `n` of `x_ptr`'s elements (one tile).
    #[kernel]
    fn sum_squares_row(x_ptr: Ptr<f32>, out_ptr: Ptr<f32>, n: i32, #[constexpr] BLOCK: usize) {
        let cols = arange(0, BLOCK);
        store(out_ptr, sum_squares(load(x_ptr + cols, mask = cols < n, other = 0.0), BLOCK));
    }

    /// [`sum_squares`] as its doc defines it, on the host: each square's
    /// significand shifted to the fixed point of the largest exponent (`top`,
    /// at least 1), truncated, summed in i64, scaled back; NaN when a square
    /// is not finite.
    fn sum_squares_definition(row: &[f32]) -> f32 {
        let fields = |t: f32| {
            let bits = t.to_bits() & 0x7FFF_FFFF;
            ((bits >> 23) as i32, bits & 0x7F_FFFF)
        };
        let sq: Vec<f32> = row.iter().map(|v| v * v).collect();
        let top = sq.iter().map(|&t| fields(t).0.max(1)).max().unwrap_or(1);
        if top >= 255 {
            return f32::NAN;
        }
        let total: i64 = sq
            .iter()
            .map(|&t| {
                let (e, frac) = fields(t);
                let mant = i64::from(if e > 0 { frac | 0x80_0000 } else { frac });
                (mant << SUM_SQUARES_SHIFT) >> (top - e.max(1)).min(63)
            })
            .sum();
        let p = top - 150 - SUM_SQUARES_SHIFT;
        let pow = |h: i32| f32::from_bits(((h + 127) << 23) as u32);
        total as f32 * pow(p / 2) * pow(p - p / 2)
    }

    /// The interpreter's [`sum_squares`] has its definition's bits on rows
    /// of spread magnitudes: normal squares over 160 binades, squares that
    /// are subnormal (alone and beside normal ones, where they truncate),
    /// zeros, and rows with a NaN or an infinity.
    #[test]
    fn sum_squares_is_its_fixed_point_definition() {
        let mut x = 0x5851_f42d_4c95_7f2du64;
        for n in [1usize, 7, 100, 576] {
            let block = n.next_power_of_two();
            let mut cases = vec![
                spread(&mut x, n, 80),
                spread(&mut x, n, 20).iter().map(|v| v * 2f32.powi(-70)).collect::<Vec<_>>(),
                spread(&mut x, n, 120).iter().map(|v| v * 2f32.powi(-40)).collect(),
                vec![0.0; n],
            ];
            let mut bad = spread(&mut x, n, 30);
            bad[n / 2] = if n % 2 == 0 { f32::NAN } else { f32::INFINITY };
            cases.push(bad);
            for row in cases {
                let mut cpu = Cpu::new();
                let (xp, op) = (cpu.upload(&row), cpu.zeros::<f32>(1));
                let args =
                    sum_squares_row::Args { x_ptr: xp, out_ptr: op, n: n as i32, _marker: PhantomData };
                sum_squares_row::interpret(&mut cpu, [1, 1, 1], &sum_squares_row::Config::new(block), &args)
                    .unwrap();
                let (got, want) = (cpu.read::<f32>(op)[0], sum_squares_definition(&row));
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "n={n}: {got:e} against {want:e} for {row:?}"
                );
            }
        }
    }

    /// `len` values `+-(1 + u) * 2^e`, `e` spread over `exps` binades
    /// centred on 0, from the xorshift state `x`.
    fn spread(x: &mut u64, len: usize, exps: u64) -> Vec<f32> {
        (0..len)
            .map(|i| {
                *x ^= *x << 13;
                *x ^= *x >> 7;
                *x ^= *x << 17;
                let v = (1.0 + (*x >> 40) as f32 / (1u64 << 24) as f32)
                    * 2f32.powi((*x % exps) as i32 - (exps / 2) as i32);
                if i % 3 == 0 { -v } else { v }
            })
            .collect()
    }

    /// The tiled and row-batched statistics (the CPU GEMV's fused norm) have
    /// the whole-row tile's bits, on rows longer and shorter than the tiles,
    /// with spread exponents, a NaN and an infinity.
    #[test]
    fn tiled_statistics_equal_the_whole_row() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for n in [1usize, 31, 64, 100, 576, 1536] {
            let mut rows = spread(&mut x, 16 * n, 41);
            for bad in [None, Some(f32::NAN), Some(-f32::NAN), Some(f32::INFINITY)] {
                if let Some(b) = bad {
                    rows[n / 2] = b;
                }
                let got = forms(&rows, 16, n);
                assert_eq!(got[0].is_nan(), bad.is_some(), "n={n} {bad:?}: {got:?}");
                for g in &got[1..4] {
                    assert_eq!(g.to_bits(), got[0].to_bits(), "n={n} {bad:?}: {got:?}");
                }
            }
        }
    }

    /// [`rms_rstd_live_rows`] has [`rms_rstd_rows`]' bits for every live
    /// count of a 16-row tile, rows of spread magnitudes (one row far larger
    /// than the others, one holding a NaN) and lengths that are not a
    /// multiple of the tile.
    #[test]
    fn live_rows_statistic_equals_the_padded_tile() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for n in [1usize, 100, 576] {
            let mut rows = spread(&mut x, 16 * n, 31);
            rows[5 * n..6 * n].iter_mut().for_each(|v| *v *= 1e12);
            rows[9 * n + n / 2] = f32::NAN;
            for m in 1..=16 {
                let got = forms(&rows, m, n);
                for i in 0..16 {
                    for j in [20, 36] {
                        assert_eq!(
                            got[4 + i].to_bits(),
                            got[j + i].to_bits(),
                            "n={n} m={m} row {i}: {got:?}"
                        );
                    }
                }
            }
        }
    }
}
