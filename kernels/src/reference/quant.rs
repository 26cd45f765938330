//! Reference for the dequant GEMV/GEMM kernels (`crate::dequant`): parses
//! the ORIGINAL GGUF block bytes (not the repacked planes, so tests check the
//! repack as well), dequantizes in f64 and multiplies in f64.
//!
//! GGUF semantics (ggml's `dequantize_row_*`), block of 32 values:
//! - `Q4_0`: f16 `d`, 16 bytes; byte `j` holds `q_j` (low nibble) and
//!   `q_{j+16}` (high nibble); `x = d * (q - 8)`.
//! - `Q4_1`: f16 `d`, f16 `m`, 16 bytes as Q4_0; `x = d * q + m`.
//! - `Q8_0`: f16 `d`, 32 signed bytes; `x = d * q`.
//! - `Q5_0`: f16 `d`, 4 bytes `qh` (bit `j` of the little-endian word is
//!   `q_j`'s fifth bit), 16 bytes of nibbles as Q4_0; `x = d * (q - 16)`.
//! - `Q5_1`: f16 `d`, f16 `m`, `qh`, nibbles; `x = d * q + m`.
//!
//! K-quants, super-blocks of 256 values:
//! - `Q4_K`: f16 `d`, f16 `dmin`, 12 bytes of 6-bit scales and mins of the 8
//!   sub-blocks of 32 (`get_scale_min_k4`), 128 bytes `qs`: per 64 values 32
//!   bytes, the low nibbles values 0..31, the high ones 32..63; `x = d sc q
//!   - dmin m`.
//! - `Q5_K`: as Q4_K with 32 bytes `qh` before `qs`: bit `s` of `qh[l]` is
//!   the fifth bit of value `l` of sub-block `s`.
//! - `Q6_K`: 128 bytes `ql`, 64 bytes `qh`, 16 signed scales (one per 16
//!   values), f16 `d`; per 128 values, value `32 i + l` has nibble `i / 2` of
//!   `ql[l + 32 (i % 2)]` and bits `2 i, 2 i + 1` of `qh[l]` on top; `x = d
//!   sc (q - 32)`.
//! - `F16`, `BF16`: the values.
//!
//! Error model of the kernels (used by the tests' tolerances, see
//! [`error_bound`]): with `u = 2^-24`, every weight is formed in f32 exactly
//! (Q4_0, Q8_0, Q5_0, F16, BF16), rounded once (Q6_K: `(d sc) q`, as ggml)
//! or within `u * (|w| + |m| + c |d|)` (two roundings: Q4_1 and Q4_K with `c
//! = 16`, Q5_1 and Q5_K with `c = 256`; the K-quants' `d`, `m` are the
//! sub-block's `d sc` and `dmin m`, exact in f32),
//! each product is accumulated by an f32 FMA chain of at most `depth`
//! additions (per-lane K loop, then the reduction of the lanes), so
//! `|y - y_exact| <= depth * u * S` (first order) with
//! `S = sum_k (|w_k| + |m_b| + 16 |d_b|) * |x_k|` ([`Gemv::abs`]).
//!
//! The GEMM (`crate::dequant::gemm`) rounds both operands of every product
//! to f16 before the tensor cores multiply them exactly and accumulate in
//! f32: each operand gains a relative error of at most `2^-11` in f16's
//! normal range, or an absolute one of at most `2^-25` below it, which adds
//! `(2^-10 + 2^-22) * S + 2^-25 * L` with `L = sum_k (|w_k| + |x_k|)`
//! ([`Gemv::l1`]) to the f32 bound ([`gemm_error_bound`]).

use crate::dequant::repack::{BLOCK_VALUES, QuantFormat};
use dsl_core::DType;
use dsl_core::half::f16;

/// `2^-24`, the unit roundoff of f32.
pub const U32: f64 = 1.0 / 16_777_216.0;

fn f16_at(raw: &[u8], i: usize) -> f64 {
    f16::from_le_bytes([raw[i], raw[i + 1]]).to_f64()
}

/// The exact value and the weight-rounding term (see the module doc) of
/// every weight of one GGUF block `blk` in `format` (the block's
/// [`QuantFormat::gguf_block_values`] values; 32 for the floats, which are
/// read 32 at a time here).
/// Weight `j` of a Q4/Q5 block (scale `d` at byte 0) from its quant `q`:
/// `d q + m` in the formats with a minimum `m` (at byte 2; `extra[j] = |m|
/// + span |d|`), else `d (q - zero)`.
fn put_weight(
    blk: &[u8],
    j: usize,
    q: f64,
    min: bool,
    (span, zero): (f64, f64),
    w: &mut [f64],
    extra: &mut [f64],
) {
    let d = f16_at(blk, 0);
    if min {
        let m = f16_at(blk, 2);
        extra[j] = m.abs() + span * d.abs();
        w[j] = d * q + m;
    } else {
        w[j] = d * (q - zero);
    }
}

fn dequant_block(format: QuantFormat, blk: &[u8], w: &mut [f64], extra: &mut [f64]) {
    let d = || f16_at(blk, 0);
    match format {
        QuantFormat::Q4_0 | QuantFormat::Q4_1 => {
            let qs = if format == QuantFormat::Q4_1 { &blk[4..] } else { &blk[2..] };
            for j in 0..BLOCK_VALUES {
                let byte = qs[j % 16];
                let q = f64::from(if j < 16 { byte & 15 } else { byte >> 4 });
                put_weight(blk, j, q, format == QuantFormat::Q4_1, (16.0, 8.0), w, extra);
            }
        }
        QuantFormat::Q8_0 => (0..32).for_each(|j| w[j] = d() * f64::from(blk[2 + j] as i8)),
        QuantFormat::Q5_0 | QuantFormat::Q5_1 => {
            // qh: bit j of the little-endian word is weight j's fifth bit.
            let off = if format == QuantFormat::Q5_1 { 4 } else { 2 };
            let qh = u32::from_le_bytes([blk[off], blk[off + 1], blk[off + 2], blk[off + 3]]);
            for j in 0..BLOCK_VALUES {
                let nib = if j < 16 { blk[off + 4 + j] & 15 } else { blk[off + 4 + j - 16] >> 4 };
                let q = f64::from(u32::from(nib) | ((qh >> j) & 1) << 4);
                put_weight(blk, j, q, format == QuantFormat::Q5_1, (256.0, 16.0), w, extra);
            }
        }
        QuantFormat::Q4_K | QuantFormat::Q5_K => {
            // d, dmin, 12 scale bytes, [qh: 32 bytes,] qs: per 64 weights 32
            // bytes, low nibbles the first 32, high nibbles the next 32.
            let (dall, dmin) = (d(), f16_at(blk, 2));
            let q5 = format == QuantFormat::Q5_K;
            let (qh, qs) = if q5 { (&blk[16..48], &blk[48..]) } else { (&blk[16..16], &blk[16..]) };
            for sub in 0..8 {
                let (sc, m) = crate::dequant::repack::scale_min_k4(sub, &blk[4..16]);
                let (d1, m1) = (dall * f64::from(sc), dmin * f64::from(m));
                for l in 0..32 {
                    let byte = qs[32 * (sub / 2) + l];
                    let mut q = u32::from(if sub % 2 == 0 { byte & 15 } else { byte >> 4 });
                    if q5 {
                        q |= u32::from((qh[l] >> sub) & 1) << 4;
                    }
                    let i = 32 * sub + l;
                    w[i] = d1 * f64::from(q) - m1;
                    extra[i] = m1.abs() + if q5 { 256.0 } else { 16.0 } * d1.abs();
                }
            }
        }
        QuantFormat::Q6_K => {
            // ql[128], qh[64], scales[16] (i8), d. Per 128 weights: weight
            // 32 i + l has the nibble i / 2 of ql[l + 32 (i % 2)] and bits
            // 2 i, 2 i + 1 of qh[l].
            let d = f16_at(blk, 208);
            for h in 0..2 {
                for i in 0..4 {
                    for l in 0..32 {
                        let lo = (blk[64 * h + l + 32 * (i % 2)] >> (4 * (i / 2))) & 15;
                        let hi = (blk[128 + 32 * h + l] >> (2 * i)) & 3;
                        let q = i32::from(lo | hi << 4) - 32;
                        let idx = 128 * h + 32 * i + l;
                        let sc = blk[192 + idx / 16] as i8;
                        w[idx] = d * f64::from(sc) * f64::from(q);
                    }
                }
            }
        }
        QuantFormat::F16 => (0..32).for_each(|j| w[j] = f16_at(blk, 2 * j)),
        QuantFormat::BF16 => (0..32)
            .for_each(|j| w[j] = dsl_core::half::bf16::from_le_bytes([blk[2 * j], blk[2 * j + 1]]).to_f64()),
    }
}

/// Row `row` of a weight `[n, k]` in `format` (GGUF bytes `raw`), exact.
/// Also returns, per value, the weight-rounding term of the error model:
/// `|m| + c |d|` of its block for the formats with a min (`c` = 16 for the
/// nibbles, 256 for the 5-bit bytes; `d`, `m` the sub-block's `d * sc`,
/// `dmin * m` for the K-quants), zero for the exact formats.
pub fn dequant_row(format: QuantFormat, raw: &[u8], k: usize, row: usize) -> (Vec<f64>, Vec<f64>) {
    let bv = format.gguf_block_values().max(BLOCK_VALUES);
    let bb = format.block_bytes() * bv / format.gguf_block_values();
    let nb = k / bv;
    let mut w = vec![0.0; k];
    let mut extra = vec![0.0; k];
    for b in 0..nb {
        let blk = &raw[(row * nb + b) * bb..][..bb];
        dequant_block(format, blk, &mut w[b * bv..][..bv], &mut extra[b * bv..][..bv]);
    }
    (w, extra)
}

/// The exact product `y[m, n] = x[m, k] @ W^T` and its error scale.
#[derive(Clone, Debug, PartialEq)]
pub struct Gemv {
    /// `y`, row-major `[m, n]`, exact (f64 of exactly dequantized weights).
    pub y: Vec<f64>,
    /// `S[m, n] = sum_k (|w| + weight-rounding term) * |x|` (see the module doc).
    pub abs: Vec<f64>,
    /// `L[m, n] = sum_k (|w| + |x|)` (the f16 underflow term of the GEMM).
    pub l1: Vec<f64>,
}

/// `x[m, k] @ W^T` for a weight `[n, k]` in `format` (GGUF bytes `raw`).
pub fn gemv(format: QuantFormat, raw: &[u8], n: usize, k: usize, x: &[f64], m: usize) -> Gemv {
    assert_eq!(k % format.row_multiple(), 0);
    assert_eq!(raw.len(), format.gguf_bytes(n, k));
    assert_eq!(x.len(), m * k);
    let mut y = vec![0.0; m * n];
    let mut abs = vec![0.0; m * n];
    let mut l1 = vec![0.0; m * n];
    let x_l1: Vec<f64> = x.chunks(k).map(|r| r.iter().map(|v| v.abs()).sum()).collect();
    for r in 0..n {
        let (w, extra) = dequant_row(format, raw, k, r);
        let w_l1: f64 = w.iter().map(|v| v.abs()).sum();
        for i in 0..m {
            let xr = &x[i * k..(i + 1) * k];
            let (mut s, mut a) = (0.0, 0.0);
            for c in 0..k {
                s += w[c] * xr[c];
                a += (w[c].abs() + extra[c]) * xr[c].abs();
            }
            y[i * n + r] = s;
            abs[i * n + r] = a;
            l1[i * n + r] = w_l1 + x_l1[i];
        }
    }
    Gemv { y, abs, l1 }
}

/// `silu(g) * u = g / (1 + e^-g) * u`.
pub fn silu_mul(g: f64, u: f64) -> f64 {
    g / (1.0 + (-g).exp()) * u
}

/// The first-order bound `depth * 2^-24 * abs` on an f32 result whose
/// products were summed with at most `depth` roundings each, for the kernels
/// of `crate::dequant` with K tile `block_k` over `k` columns: each lane
/// accumulates `2 * ceil(k / block_k)` products (one per K tile for the
/// byte and float formats),
/// then at most `block_k` lanes are reduced; 8 more for the weight and final
/// roundings.
pub fn error_bound(format: QuantFormat, k: usize, block_k: usize, abs: f64) -> f64 {
    let per_tile = if format.is_q4() { 2 } else { 1 };
    let depth = per_tile * k.div_ceil(block_k) + block_k + 8;
    depth as f64 * U32 * abs
}

/// The GEMM's bound ([`error_bound`] plus the f16 rounding of both
/// operands, see the module doc) for the output whose [`Gemv::abs`] is `abs`
/// and [`Gemv::l1`] is `l1`.
pub fn gemm_error_bound(format: QuantFormat, k: usize, block_k: usize, abs: f64, l1: f64) -> f64 {
    const U16: f64 = 1.0 / 2048.0;
    error_bound(format, k, block_k, abs) + (2.0 * U16 + U16 * U16) * abs + l1 / 33_554_432.0
}

/// The swapped GEMM's bound (`SWAP`, see `crate::dequant::gemm::gemm_swap`)
/// for activations in `dtype`. The tensor cores add one 16-wide k step at
/// a time to the f32 accumulator (at most `k / 16` roundings per output:
/// [`error_bound`] with 16-column tiles). The operands are rounded to
/// `dtype` when it is 16-bit: bf16 activations are exact and each weight
/// gains a relative error of at most `2^-9` (bf16 has f32's exponent range,
/// so there is no underflow term); f16 as in [`gemm_error_bound`]; f32
/// activations are rounded to f16 with the weights, as in
/// [`gemm_error_bound`]. Its Q4_1 weights take one more rounding, of the
/// offset `m - 128 d` (see `crate::dequant::gemm::swap_weights`): they are
/// within `u (|w| + 2 |m| + 144 |d|)`, which the depth covers (at least 28
/// roundings of `|w| + |m| + 16 |d|`).
pub fn gemm_swap_error_bound(format: QuantFormat, k: usize, abs: f64, l1: f64, dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => error_bound(format, k, 16, abs) + abs / 512.0,
        _ => gemm_error_bound(format, k, 16, abs, l1),
    }
}

/// The bound on `silu(g) * u` computed in f32 from `g` and `u` known within
/// `eg` and `eu`: propagation (`|silu'| <= 1.1`), the f32 operations and an
/// approximate `exp` (relative `2^-20`).
pub fn silu_mul_bound(g: f64, u: f64, eg: f64, eu: f64) -> f64 {
    let s = g / (1.0 + (-g).exp());
    1.1 * eg * u.abs() + (s.abs() + 1.1 * eg) * eu + (g * u).abs() * f64::powi(2.0, -20)
}

/// The activations a fused GEMV with an RMSNorm prologue multiplies
/// (`crate::dequant::fused`): each row of `x` (`[m, k]`, values in `dtype`)
/// normed as add+RMSNorm's output, `round_T(round_T(x * rstd * rstd_scale) *
/// nw)` with `rstd` in f64 (see `crate::reference::norm::add_rmsnorm_scaled`
/// for why a kernel may differ by a unit of the roundings).
pub fn rms_normed(
    x: &[f64],
    nw: &[f64],
    m: usize,
    k: usize,
    eps: f64,
    dtype: DType,
    rstd_scale: f64,
) -> Vec<f64> {
    let zeros = vec![0.0; m * k];
    super::norm::add_rmsnorm_scaled(x, &zeros, nw, m, k, eps, dtype, rstd_scale).0
}

/// The residual epilogue of a fused GEMV: `round_T(round_T(y) + r)`, the
/// sum formed in f32 (as add+RMSNorm adds).
pub fn residual_add(y: f64, r: f64, dtype: DType) -> f64 {
    dtype.round_float((dtype.round_float(y) + r) as f32 as f64)
}

/// 8-bit activations (`crate::dequant::q8`): llama.cpp's `q8_1` rule per
/// block of 32 values of a row, in f32 exactly as the kernel computes it:
/// `amax = max |x|`, `d = amax / 127`, `id = 1 / d` (0 when `d` is 0),
/// `q = round(x * id)` rounding half away from zero. Returns the quants
/// (row-major like `x`) and one `d` per block.
pub fn quantize_q8(x: &[f32], k: usize) -> (Vec<i8>, Vec<f32>) {
    assert_eq!(k % BLOCK_VALUES, 0);
    assert_eq!(x.len() % k, 0);
    let mut q = Vec::with_capacity(x.len());
    let mut d = Vec::with_capacity(x.len() / BLOCK_VALUES);
    for blk in x.chunks(BLOCK_VALUES) {
        let amax = blk.iter().fold(0f32, |a, v| a.max(v.abs()));
        let db = amax / 127.0;
        let id = if db != 0.0 { 1.0 / db } else { 0.0 };
        for &v in blk {
            let s = v * id;
            let r = if s < 0.0 { -(-s + 0.5).floor() } else { (s + 0.5).floor() };
            q.push(r as i8);
        }
        d.push(db);
    }
    (q, d)
}

/// The activations the 8-bit kernels multiply: `d_b * q` per value (exact in f64).
pub fn dequantize_q8(q: &[i8], d: &[f32]) -> Vec<f64> {
    q.iter().enumerate().map(|(i, &v)| f64::from(d[i / BLOCK_VALUES]) * f64::from(v)).collect()
}

/// The bound on the f32 result of an 8-bit-activation GEMV
/// (`crate::dequant::q8`) against the exact product with the quantized
/// activations ([`gemv`] of [`dequantize_q8`]) whose [`Gemv::abs`] is `abs`:
/// the byte products and their per-word sums are exact integers, so only the
/// per-word scaling (`(d_w d_x) * dot + (m_w d_x) * sum`: up to 6 roundings),
/// the lane's f32 accumulation over `ceil(k / block_k)` K tiles and the
/// reduction of `block_k / 8` (Q4) or `block_k / 4` (Q8_0) word lanes round.
pub fn error_bound_q8(format: QuantFormat, k: usize, block_k: usize, abs: f64) -> f64 {
    let lanes = if format == QuantFormat::Q8_0 { block_k / 4 } else { block_k / 8 };
    let depth = 6 + 2 * k.div_ceil(block_k) + lanes + 8;
    depth as f64 * U32 * abs
}

/// A bound on how far quantizing the activations to 8 bits moves the exact
/// product `y = x @ w`: each value moves by at most half a quantization step
/// `d_b / 2` of its block (plus f32 noise), so `|y_q - y| <= sum_k |w_k|
/// (d_b(k) / 2 + 2^-22 |x_k|)`; `w` is one dequantized weight row.
pub fn q8_activation_bound(w: &[f64], x: &[f64], d: &[f32]) -> f64 {
    w.iter()
        .zip(x)
        .enumerate()
        .map(|(i, (wk, xk))| {
            wk.abs() * (f64::from(d[i / BLOCK_VALUES]) / 2.0 + xk.abs() * f64::powi(2.0, -22))
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_gguf_blocks() {
        // Q4_0: d = 0.5, byte 0 = 0x9F -> q0 = 15, q16 = 9.
        let mut b = vec![0u8; 18];
        b[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        b[2] = 0x9F;
        let (w, extra) = dequant_row(QuantFormat::Q4_0, &b, 32, 0);
        assert_eq!((w[0], w[16], w[1]), (3.5, 0.5, -4.0));
        assert!(extra.iter().all(|&e| e == 0.0));
        // Q4_1: d = 2, m = -1: x = 2q - 1.
        let mut b = vec![0u8; 20];
        b[..2].copy_from_slice(&f16::from_f32(2.0).to_le_bytes());
        b[2..4].copy_from_slice(&f16::from_f32(-1.0).to_le_bytes());
        b[4 + 3] = 0x21;
        let (w, extra) = dequant_row(QuantFormat::Q4_1, &b, 32, 0);
        assert_eq!((w[3], w[19], w[0], extra[0]), (1.0, 3.0, -1.0, 33.0));
        // Q8_0: d = 0.25, q = [-128, 7].
        let mut b = vec![0u8; 34];
        b[..2].copy_from_slice(&f16::from_f32(0.25).to_le_bytes());
        b[2] = 0x80;
        b[3] = 7;
        let (w, _) = dequant_row(QuantFormat::Q8_0, &b, 32, 0);
        assert_eq!((w[0], w[1]), (-32.0, 1.75));
    }

    #[test]
    fn multiplies_rows() {
        let mut b = vec![0u8; 34];
        b[..2].copy_from_slice(&f16::from_f32(1.0).to_le_bytes());
        b[2..34].iter_mut().enumerate().for_each(|(j, q)| *q = j as u8);
        let x: Vec<f64> = (0..64).map(|i| if i < 32 { 1.0 } else { -2.0 }).collect();
        let g = gemv(QuantFormat::Q8_0, &b, 1, 32, &x, 2);
        assert_eq!(g.y, vec![496.0, -992.0]);
        assert_eq!(g.abs, vec![496.0, 992.0]);
        assert!((silu_mul(1.0, 2.0) - 2.0 / (1.0 + (-1.0f64).exp())).abs() < 1e-15);
    }
}
