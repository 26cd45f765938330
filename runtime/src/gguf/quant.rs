//! Block formats of the supported tensor types: dequantization to `f32` and
//! quantization, used by the writer to build test models and by tests as the
//! CPU reference.
//!
//! Formats (little-endian; `d`, `m`, `dmin` are fp16):
//!
//! - `Q8_0`: 34 bytes per 32 values: `d`, then 32 `i8` `q`; `x = d * q`.
//! - `Q4_0`: 18 bytes per 32 values: `d`, then 16 bytes; byte `j` holds value
//!   `j` in its low nibble and value `j + 16` in its high nibble; `x = d * (q - 8)`.
//! - `Q4_1`: 20 bytes per 32 values: `d`, `m`, then 16 bytes of nibbles laid out
//!   as in `Q4_0`; `x = d * q + m`.
//! - `Q5_0`: 22 bytes per 32 values: `d`, 4 bytes `qh` (bit `j` of the
//!   little-endian word is value `j`'s fifth bit), nibbles as in `Q4_0`;
//!   `x = d * (q - 16)`. `Q5_1`: 24 bytes: `d`, `m`, `qh`, nibbles; `x = d * q + m`.
//! - `Q4_K`: 144 bytes per 256 values: `d`, `dmin`, 12 bytes of 6-bit scales
//!   `sc` and mins `m` of the 8 sub-blocks of 32 (ggml's `get_scale_min_k4`),
//!   128 bytes of nibbles (per 64 values: byte `l` holds value `l` low and
//!   `l + 32` high); `x = d sc q - dmin m`. `Q5_K`: 176 bytes, as `Q4_K` with
//!   32 bytes `qh` before the nibbles (bit `s` of `qh[l]` is the fifth bit of
//!   value `l` of sub-block `s`).
//! - `Q6_K`: 210 bytes per 256 values: 128 bytes `ql` (low nibbles), 64 bytes
//!   `qh` (top 2 bits), 16 `i8` scales (one per 16 values), `d`; `x = d sc (q - 32)`.
//! - `F32`, `F16`, `BF16`: plain little-endian scalars.
//!
//! The dequantization of `Q5_0`, `Q5_1` and the K-quants is the kernels'
//! f64 reference (`kernels::reference::quant`), rounded once to `f32`.
//!
//! Invariant: `dequantize_into(ty, quantize(ty, x))` reproduces `x` exactly for
//! `F32` and up to the format's rounding otherwise: half a step per value (one
//! step for the clamped extreme of `Q4_0`, `Q5_0`) plus the fp16 rounding of
//! the scales; the K-quants' steps are bounded in the doc comments of their
//! quantizers.

use super::types::GgmlType;
use super::{GgufError, Result};
use half::{bf16, f16};

/// Values per block of `Q8_0`, `Q4_0`, `Q4_1`, `Q5_0` and `Q5_1`.
pub const QK: usize = 32;

/// Values per super-block of the K-quants.
pub const QK_K: usize = 256;

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// The bytes of `n` values of `ty`, or why `ty` cannot `verb` (`quantize`,
/// `dequantize`) them: an unsupported type, or not a whole number of blocks.
fn block_bytes(ty: GgmlType, n: u64, verb: &str) -> Result<u64> {
    if !ty.is_supported() {
        return Err(GgufError::UnsupportedType { tensor: format!("({verb})"), ty });
    }
    ty.bytes_for(n).ok_or_else(|| GgufError::SizeMismatch {
        what: format!("{ty} values to {verb} (a multiple of {})", ty.block_size()),
        expected: n.next_multiple_of(ty.block_size()),
        found: n,
    })
}

/// Dequantizes `src` (whole blocks of `ty`) into `dst`, whose length must be the
/// number of values `src` holds.
pub fn dequantize_into(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    let n = dst.len() as u64;
    let expected = block_bytes(ty, n, "dequantize")?;
    if src.len() as u64 != expected {
        return Err(GgufError::SizeMismatch {
            what: format!("{ty} data for {n} values"),
            expected,
            found: src.len() as u64,
        });
    }
    match ty {
        GgmlType::F32 => {
            for (o, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        GgmlType::BF16 => {
            for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *o = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        GgmlType::Q8_0 => {
            for (o, b) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(34)) {
                let d = f16_at(b, 0);
                for (x, &q) in o.iter_mut().zip(&b[2..]) {
                    *x = d * f32::from(q as i8);
                }
            }
        }
        GgmlType::Q4_0 => {
            for (o, b) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(18)) {
                let d = f16_at(b, 0);
                for (j, &q) in b[2..].iter().enumerate() {
                    o[j] = d * (f32::from(q & 0x0f) - 8.0);
                    o[j + QK / 2] = d * (f32::from(q >> 4) - 8.0);
                }
            }
        }
        GgmlType::Q4_1 => {
            for (o, b) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(20)) {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                for (j, &q) in b[4..].iter().enumerate() {
                    o[j] = d * f32::from(q & 0x0f) + m;
                    o[j + QK / 2] = d * f32::from(q >> 4) + m;
                }
            }
        }
        GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
            // The kernels' f64 reference, rounded once to f32.
            let format = ty.quant_format().expect("a supported block type");
            let (w, _) = kernels::reference::quant::dequant_row(format, src, dst.len(), 0);
            dst.iter_mut().zip(w).for_each(|(o, v)| *o = v as f32);
        }
        _ => unreachable!("checked by block_bytes above"),
    }
    Ok(())
}

/// Quantizes `src` to `ty`. `src.len()` must be a whole number of blocks.
///
/// The 32-value formats (`Q8_0`, `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`) round as
/// llama.cpp's reference (`quantize_row_*_ref`) does; the K-quants (`Q4_K`,
/// `Q5_K`, `Q6_K`) use a plain min/max rule (see `quantize_k_minmax` and
/// `quantize_q6_k`), not llama.cpp's search for the best scales, so their
/// bytes differ from llama.cpp's (same layout, a somewhat larger error).
pub fn quantize(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>> {
    let bytes = block_bytes(ty, src.len() as u64, "quantize")?;
    let mut out = Vec::with_capacity(bytes as usize);
    match ty {
        GgmlType::F32 => src.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        GgmlType::F16 => src.iter().for_each(|&x| out.extend_from_slice(&f16::from_f32(x).to_le_bytes())),
        GgmlType::BF16 => src.iter().for_each(|&x| out.extend_from_slice(&bf16::from_f32(x).to_le_bytes())),
        GgmlType::Q8_0 => src.chunks_exact(QK).for_each(|b| quantize_q8_0(b, &mut out)),
        GgmlType::Q4_0 | GgmlType::Q5_0 => {
            let bits = if ty == GgmlType::Q4_0 { 4 } else { 5 };
            for b in src.chunks_exact(QK) {
                let (d, q) = symmetric_quants(b, bits);
                out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                push_quants(&q, bits, &mut out);
            }
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 => {
            let bits = if ty == GgmlType::Q4_1 { 4 } else { 5 };
            for b in src.chunks_exact(QK) {
                let (d, m, q) = affine_quants(b, bits);
                out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                out.extend_from_slice(&f16::from_f32(m).to_le_bytes());
                push_quants(&q, bits, &mut out);
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let q5 = ty == GgmlType::Q5_K;
            for b in src.chunks_exact(QK_K) {
                let k = quantize_k_minmax(b, if q5 { 31 } else { 15 });
                out.extend_from_slice(&k.d.to_le_bytes());
                out.extend_from_slice(&k.dmin.to_le_bytes());
                out.extend_from_slice(&k.scales);
                if q5 {
                    out.extend(high_bits(&k.q, 1));
                }
                k.q.chunks_exact(64).for_each(|c| pack_nibbles(c, &mut out));
            }
        }
        GgmlType::Q6_K => src.chunks_exact(QK_K).for_each(|b| quantize_q6_k(b, &mut out)),
        other => return Err(GgufError::UnsupportedType { tensor: "(quantize)".into(), ty: other }),
    }
    Ok(out)
}

/// `quantize_row_q8_0_ref`: `d = max|x| / 127`, `q = round(x / d)`.
fn quantize_q8_0(x: &[f32], out: &mut Vec<u8>) {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
    out.extend(x.iter().map(|&v| (v * id).round() as i8 as u8));
}

/// `quantize_row_q{4,5}_0_ref` with `h = 2^(bits - 1)`: `d = max / -h` where
/// `max` is the value of largest magnitude (with its sign, the first one on
/// ties), `q = min(2h - 1, trunc(x / d + h + 0.5))`, computed with `d` in
/// f32 before its rounding to fp16. The extreme of the sign opposite to
/// `max` may clamp: up to one step `|d|` off, every other value half a step.
fn symmetric_quants(x: &[f32], bits: u32) -> (f32, [u8; QK]) {
    let h = (1u32 << (bits - 1)) as f32;
    let top = (1u8 << bits) - 1;
    let max = x.iter().fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let d = max / -h;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let offset = h + 0.5;
    (d, std::array::from_fn(|j| ((x[j] * id + offset) as u8).min(top)))
}

/// `quantize_row_q{4,5}_1_ref`: `d = (max - min) / (2^bits - 1)`, `m = min`,
/// `q = min(2^bits - 1, trunc((x - min) / d + 0.5))` (llama.cpp's Q5_1 does
/// not clamp; the clamp only guards the f32 rounding of `1 / d`).
fn affine_quants(x: &[f32], bits: u32) -> (f32, f32, [u8; QK]) {
    let top = (1u8 << bits) - 1;
    let min = x.iter().copied().fold(f32::INFINITY, f32::min);
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let d = (max - min) / f32::from(top);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    (d, min, std::array::from_fn(|j| (((x[j] - min) * id + 0.5) as u8).min(top)))
}

/// The quants of a 32-value block: for 5 bits first `qh` (bit `j` of the
/// little-endian word is value `j`'s fifth bit), then the nibbles
/// ([`pack_nibbles`]).
fn push_quants(q: &[u8; QK], bits: u32, out: &mut Vec<u8>) {
    if bits == 5 {
        let qh = q.iter().enumerate().fold(0u32, |h, (j, &v)| h | u32::from(v >> 4) << j);
        out.extend_from_slice(&qh.to_le_bytes());
    }
    pack_nibbles(q, out);
}

/// The low nibbles of `q` (an even count `2h`): byte `j` holds value `j` in
/// its low nibble and value `j + h` in its high one (Q4_0's layout with `h =
/// 16`, the K-quants' per 64 values with `h = 32`, Q6_K's per 128 with `h =
/// 64`).
fn pack_nibbles(q: &[u8], out: &mut Vec<u8>) {
    let h = q.len() / 2;
    out.extend((0..h).map(|j| (q[j] & 15) | (q[j + h] & 15) << 4));
}

/// The bits of `q` above the nibble, `width` of them per value, as 32 bytes:
/// `q` holds `8 / width` groups of 32 values and bits `g * width ..` of byte
/// `l` are those of value `32 g + l` (Q5_K's `qh` with `width` 1 over the 256
/// values, Q6_K's per 128 values with `width` 2).
fn high_bits(q: &[u8], width: u32) -> impl Iterator<Item = u8> + '_ {
    let groups = q.len() / 32;
    (0..32).map(move |l| (0..groups).fold(0u8, |a, g| a | (q[32 * g + l] >> 4) << (g as u32 * width)))
}

/// `v` (non-negative) rounded up to fp16: the smallest fp16 not below it.
fn f16_up(v: f32) -> f16 {
    let h = f16::from_f32(v);
    if h.to_f32() < v { f16::from_bits(h.to_bits() + 1) } else { h }
}

/// Sub-block scales `s` (non-negative) as integers up to `top` times a
/// shared fp16 super-scale: `d = max(s) / top` rounded up to fp16, `sc_j =
/// min(top, ceil(s_j / d))` (0 when `d` is 0), so that `d * sc_j >= s_j` up
/// to the f32 rounding, and `d * sc_j < s_j + d`.
fn quantize_scales<const N: usize>(s: &[f32; N], top: u8) -> (f16, [u8; N]) {
    let d = f16_up(s.iter().fold(0.0f32, |a, &v| a.max(v)) / f32::from(top));
    let df = d.to_f32();
    (d, std::array::from_fn(|j| if df > 0.0 { (s[j] / df).ceil().min(f32::from(top)) as u8 } else { 0 }))
}

/// The quant `round(v / step)` clamped to `lo..=hi` (0 when `step` is 0).
fn round_quant(v: f32, step: f32, lo: f32, hi: f32) -> f32 {
    if step > 0.0 { (v / step).round().clamp(lo, hi) } else { 0.0 }
}

/// A Q4_K/Q5_K super-block: `x = d sc_j q - dmin m_j` in sub-block `j`.
struct KMinMax {
    d: f16,
    dmin: f16,
    /// The 6-bit `sc` and `m` packed as `get_scale_min_k4` reads them.
    scales: [u8; 12],
    /// `0..=top`, in value order.
    q: [u8; QK_K],
}

/// Q4_K (`top` 15) and Q5_K (`top` 31) without llama.cpp's search: per
/// sub-block `j` of 32 values with `lo_j = min(0, min x)` and `hi_j = max x`,
/// the offset `M_j = dmin m_j` is `-lo_j` quantized up ([`quantize_scales`]
/// over the 8 sub-blocks, 6 bits), the step `D_j = d sc_j` is `(hi_j + M_j)
/// / top` quantized up the same way, and `q = round((x + M_j) / D_j)`. The
/// grid `-M_j + D_j * (0..=top)` then spans the sub-block, so every value is
/// within half a step `D_j / 2 < ((hi_j - lo_j + dmin) / top + d) / 2`; zero
/// and constant sub-blocks get finite (possibly zero) scales.
fn quantize_k_minmax(x: &[f32], top: u8) -> KMinMax {
    let sub = |j: usize| &x[32 * j..32 * (j + 1)];
    let neg_min: [f32; 8] = std::array::from_fn(|j| -sub(j).iter().fold(0.0f32, |a, &v| a.min(v)));
    let (dmin, m) = quantize_scales(&neg_min, 63);
    let offset: [f32; 8] = std::array::from_fn(|j| dmin.to_f32() * f32::from(m[j]));
    let span: [f32; 8] = std::array::from_fn(|j| {
        let hi = sub(j).iter().copied().fold(f32::NEG_INFINITY, f32::max);
        (hi + offset[j]).max(0.0) / f32::from(top)
    });
    let (d, sc) = quantize_scales(&span, 63);
    let q = std::array::from_fn(|i| {
        let j = i / 32;
        round_quant(x[i] + offset[j], d.to_f32() * f32::from(sc[j]), 0.0, f32::from(top)) as u8
    });
    KMinMax { d, dmin, scales: pack_scale_min_k4(&sc, &m), q }
}

/// The 12 scale bytes of a Q4_K/Q5_K super-block as ggml's
/// `get_scale_min_k4` reads them: `sc_j`, `m_j` of sub-blocks 0..3 in the low
/// 6 bits of bytes `j` and `j + 4`; those of 4..7 in the nibbles of byte `j +
/// 4` (sub-block `j`), their top 2 bits in the top bits of bytes `j - 4`
/// (`sc`) and `j` (`m`).
fn pack_scale_min_k4(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..4 {
        q[j] = sc[j] | (sc[j + 4] >> 4) << 6;
        q[j + 4] = m[j] | (m[j + 4] >> 4) << 6;
        q[j + 8] = (sc[j + 4] & 15) | (m[j + 4] & 15) << 4;
    }
    q
}

/// Q6_K without llama.cpp's search: per sub-block `j` of 16 values the step
/// `D_j = d sc_j` is `max|x| / 31` quantized up ([`quantize_scales`], `sc_j`
/// in 0..=127 of the signed bytes), `q = round(x / D_j)` in -31..=31 (stored
/// `+ 32`; -32 is unused), so every value is within `D_j / 2 < (max|x| / 31
/// + d) / 2`. Layout: `ql` (per 128 values [`pack_nibbles`]), `qh` (per 128
/// values [`high_bits`] of width 2), the 16 scales, `d`.
fn quantize_q6_k(x: &[f32], out: &mut Vec<u8>) {
    let amax: [f32; 16] =
        std::array::from_fn(|j| x[16 * j..][..16].iter().fold(0.0f32, |a, v| a.max(v.abs())));
    let (d, sc) = quantize_scales(&amax.map(|a| a / 31.0), 127);
    let q: [u8; QK_K] = std::array::from_fn(|i| {
        (round_quant(x[i], d.to_f32() * f32::from(sc[i / 16]), -31.0, 31.0) + 32.0) as u8
    });
    q.chunks_exact(128).for_each(|h| pack_nibbles(h, out));
    q.chunks_exact(128).for_each(|h| out.extend(high_bits(h, 2)));
    out.extend_from_slice(&sc);
    out.extend_from_slice(&d.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(n: usize) -> Vec<f32> {
        (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect()
    }

    /// Round trips stay within the format's step (half a quantization step plus
    /// the fp16 rounding of the scale and minimum).
    #[test]
    fn round_trip_error_is_bounded() {
        let x = ramp(256);
        for (ty, tol) in [
            (GgmlType::F32, 0.0),
            (GgmlType::F16, 2e-3),
            (GgmlType::BF16, 2e-2),
            (GgmlType::Q8_0, 3.0 / 127.0 * 0.5 + 3e-3),
            // Q4_0's extreme of the sign opposite to `max` clamps to 7d: one step.
            (GgmlType::Q4_0, 3.0 / 8.0 + 1e-2),
            (GgmlType::Q4_1, 6.0 / 15.0 * 0.51 + 1e-2),
        ] {
            let q = quantize(ty, &x).unwrap();
            assert_eq!(q.len() as u64, ty.bytes_for(256).unwrap());
            let mut y = vec![0.0; 256];
            dequantize_into(ty, &q, &mut y).unwrap();
            let err = x.iter().zip(&y).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(err <= tol, "{ty}: max error {err} > {tol}");
        }
    }

    /// A zero super-block, a negative and a positive constant one, then
    /// random ones in pieces of 16 values of magnitude `10^u` (`u` uniform in
    /// [-2, 2]), a third of them centered at `+3` magnitudes and a third at
    /// `-3` (one sign throughout), the rest of mixed signs.
    fn mixed_input() -> Vec<f32> {
        let mut rng = crate::rng::Rng::new(42);
        let mut x = [0.0, -0.75, 2.5].iter().flat_map(|&v| [v; QK_K]).collect::<Vec<f32>>();
        for _ in 0..8 * QK_K / 16 {
            let mag = 10f32.powf(4.0 * rng.unit() as f32 - 2.0);
            let center = [0.0, 3.0, -3.0][(rng.next_u64() % 3) as usize] * mag;
            x.extend((0..16).map(|_| center + mag * rng.signed_f32()));
        }
        x
    }

    /// A bound on `|fp16(v) - v|`: half an ulp (relative `2^-11`), or half
    /// the subnormal spacing `2^-24`.
    fn r16(v: f32) -> f32 {
        v.abs() / 2048.0 + 1.0 / 33_554_432.0
    }

    /// A bound on `v >= 0` rounded up to fp16 (less than one ulp above it).
    fn up16(v: f32) -> f32 {
        v * (1.0 + 1.0 / 1024.0) + 1.0 / 16_777_216.0
    }

    fn max_abs(x: &[f32]) -> f32 {
        x.iter().fold(0.0, |a, v| a.max(v.abs()))
    }

    /// The error bound of every value of block `x` (one format block) of the
    /// new types, derived from `x` alone; each adds `2^-20` of the block's
    /// magnitudes for the f32 arithmetic of the quantizer.
    ///
    /// - `Q5_0`: `d = amax / 16`; values within half a step except the
    ///   clamped extreme, a full step `d`; the fp16 `d` moves `d (q - 16)` by
    ///   at most `16 r16(d)`.
    /// - `Q5_1`: `d = (max - min) / 31`: half a step, plus `31 r16(d)` and
    ///   `r16(min)` for the fp16 `d` and `m`.
    /// - `Q4_K`, `Q5_K` (`top` 15, 31): per sub-block `j` of 32, with `lo_j =
    ///   min(0, min x)`, `hi_j = max x`: `dmin <= up16(max(-lo) / 63)`, the
    ///   offset `M_j < -lo_j + dmin` (rounded up), the step's target `s_j =
    ///   (hi_j + M_j) / top < (hi_j - lo_j + dmin) / top`, `d <=
    ///   up16(max(s) / 63)` and the step `D_j < s_j + d` (rounded up); the
    ///   grid spans the sub-block, so values are within `D_j / 2`.
    /// - `Q6_K`: per sub-block of 16, `s_j = amax_j / 31`, `d <=
    ///   up16(max(s) / 127)`, step `D_j < s_j + d`, values within `D_j / 2`.
    fn new_type_bounds(ty: GgmlType, x: &[f32]) -> Vec<f32> {
        let slack = |v: &[f32]| max_abs(v) / 1_048_576.0;
        let lo_hi = |v: &[f32]| {
            (v.iter().fold(0.0f32, |a, &b| a.min(b)), v.iter().copied().fold(f32::NEG_INFINITY, f32::max))
        };
        match ty {
            GgmlType::Q5_0 => {
                let d = max_abs(x) / 16.0;
                vec![d + 16.0 * r16(d) + slack(x); QK]
            }
            GgmlType::Q5_1 => {
                let min = x.iter().copied().fold(f32::INFINITY, f32::min);
                let d = (lo_hi(x).1 - min) / 31.0;
                vec![d / 2.0 + 31.0 * r16(d) + r16(min) + slack(x); QK]
            }
            GgmlType::Q4_K | GgmlType::Q5_K => {
                let top = if ty == GgmlType::Q4_K { 15.0 } else { 31.0 };
                let subs: Vec<(f32, f32)> = x.chunks(32).map(lo_hi).collect();
                let dmin = up16(subs.iter().fold(0.0f32, |a, &(lo, _)| a.max(-lo)) / 63.0);
                let s: Vec<f32> = subs.iter().map(|&(lo, hi)| (hi - lo + dmin) / top).collect();
                let d = up16(s.iter().fold(0.0f32, |a, &v| a.max(v)) / 63.0);
                (0..QK_K).map(|i| (s[i / 32] + d) / 2.0 + slack(&x[i / 32 * 32..][..32])).collect()
            }
            GgmlType::Q6_K => {
                let s: Vec<f32> = x.chunks(16).map(|v| max_abs(v) / 31.0).collect();
                let d = up16(s.iter().fold(0.0f32, |a, &v| a.max(v)) / 127.0);
                (0..QK_K).map(|i| (s[i / 16] + d) / 2.0 + slack(&x[i / 16 * 16..][..16])).collect()
            }
            _ => unreachable!("not a new type"),
        }
    }

    /// The new quantizers round trip through `dequantize_into` (the kernels'
    /// f64 reference) within [`new_type_bounds`], with the type's byte
    /// length; zero and constant blocks come back finite and within bound
    /// (a zero block exactly).
    #[test]
    fn new_types_round_trip_within_bound() {
        let x = mixed_input();
        for ty in [GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
            let q = quantize(ty, &x).unwrap();
            assert_eq!(q.len() as u64, ty.bytes_for(x.len() as u64).unwrap(), "{ty}");
            assert_eq!(q.len() as u64, x.len() as u64 / ty.block_size() * ty.block_bytes(), "{ty}");
            let mut y = vec![0.0; x.len()];
            dequantize_into(ty, &q, &mut y).unwrap();
            assert!(y[..QK_K].iter().all(|&v| v == 0.0), "{ty}: zero block");
            let bs = ty.block_size() as usize;
            for (b, (xb, yb)) in x.chunks(bs).zip(y.chunks(bs)).enumerate() {
                for (i, ((&a, &v), tol)) in xb.iter().zip(yb).zip(new_type_bounds(ty, xb)).enumerate() {
                    assert!((a - v).abs() <= tol, "{ty} block {b} value {i}: {a} -> {v}, bound {tol}");
                }
            }
        }
    }

    /// The packed 6-bit scales and mins read back with ggml's
    /// `get_scale_min_k4` (the kernels' `scale_min_k4`).
    #[test]
    fn scale_min_k4_packing_round_trips() {
        let mut rng = crate::rng::Rng::new(3);
        for _ in 0..64 {
            let sc: [u8; 8] = std::array::from_fn(|_| (rng.next_u64() % 64) as u8);
            let m: [u8; 8] = std::array::from_fn(|_| (rng.next_u64() % 64) as u8);
            let packed = pack_scale_min_k4(&sc, &m);
            for j in 0..8 {
                assert_eq!(kernels::dequant::repack::scale_min_k4(j, &packed), (sc[j], m[j]));
            }
        }
    }

    /// The nibble layout: value j in the low nibble of byte j, value j+16 in the
    /// high nibble (a hand-built Q4_1 block with d = 1, m = -8).
    #[test]
    fn q4_1_nibble_layout() {
        let mut b = Vec::new();
        b.extend_from_slice(&f16::from_f32(1.0).to_le_bytes());
        b.extend_from_slice(&f16::from_f32(-8.0).to_le_bytes());
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let mut y = [0.0; 32];
        dequantize_into(GgmlType::Q4_1, &b, &mut y).unwrap();
        for j in 0..16 {
            assert_eq!(y[j], j as f32 - 8.0);
            assert_eq!(y[j + 16], (15 - j) as f32 - 8.0);
        }
    }

    /// Q8_0 and Q4_0 blocks decode as documented; a zero block has scale 0.
    #[test]
    fn q8_0_and_q4_0_known_blocks() {
        let mut b = f16::from_f32(0.5).to_le_bytes().to_vec();
        b.extend((0..32).map(|j| (j as i8 - 16) as u8));
        let mut y = [0.0; 32];
        dequantize_into(GgmlType::Q8_0, &b, &mut y).unwrap();
        assert!(y.iter().enumerate().all(|(j, &v)| v == 0.5 * (j as f32 - 16.0)));

        let q = quantize(GgmlType::Q4_0, &[0.0; 32]).unwrap();
        assert_eq!(f16::from_le_bytes([q[0], q[1]]).to_f32(), 0.0);
        assert!(q[2..].iter().all(|&b| b == 0x88));
    }

    /// Sizes that are not whole blocks and unsupported types are errors.
    #[test]
    fn bad_sizes_and_types_are_errors() {
        assert!(matches!(quantize(GgmlType::Q8_0, &[0.0; 31]), Err(GgufError::SizeMismatch { .. })));
        for ty in [GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
            let n = ty.block_size() as usize + 16;
            assert!(matches!(quantize(ty, &vec![0.0; n]), Err(GgufError::SizeMismatch { .. })), "{ty}");
        }
        assert!(matches!(
            dequantize_into(GgmlType::Q4_1, &[0; 19], &mut [0.0; 32]),
            Err(GgufError::SizeMismatch { .. })
        ));
        assert!(matches!(
            dequantize_into(GgmlType::Q2_K, &[0; 84], &mut [0.0; 256]),
            Err(GgufError::UnsupportedType { .. })
        ));
        // A truncated K-quant block and a length that is not whole super-blocks.
        assert!(matches!(
            dequantize_into(GgmlType::Q6_K, &[0; 209], &mut [0.0; 256]),
            Err(GgufError::SizeMismatch { expected: 210, found: 209, .. })
        ));
        assert!(matches!(
            dequantize_into(GgmlType::Q4_K, &[0; 144], &mut [0.0; 128]),
            Err(GgufError::SizeMismatch { .. })
        ));
    }

    /// The new block types decode to the kernels' reference values: a Q5_0
    /// block by hand, a Q4_K super-block whose first sub-block has scale 2
    /// and min 1.
    #[test]
    fn q5_0_and_q4_k_known_blocks() {
        let mut b = f16::from_f32(0.5).to_le_bytes().to_vec();
        b.extend(1u32.to_le_bytes()); // weight 0's fifth bit
        b.extend([0x21; 16]); // nibbles 1 (weights 0..16) and 2 (16..32)
        let mut y = [0.0; 32];
        dequantize_into(GgmlType::Q5_0, &b, &mut y).unwrap();
        assert_eq!((y[0], y[1], y[16]), (0.5 * (17.0 - 16.0), 0.5 * (1.0 - 16.0), 0.5 * (2.0 - 16.0)));
        let mut k = vec![0u8; 144];
        k[0..2].copy_from_slice(&f16::from_f32(1.5).to_le_bytes());
        k[2..4].copy_from_slice(&f16::from_f32(0.25).to_le_bytes());
        k[4] = 2;
        k[8] = 1;
        k[16] = 0x57;
        let mut y = [0.0; 256];
        dequantize_into(GgmlType::Q4_K, &k, &mut y).unwrap();
        assert_eq!(y[0], 1.5 * 2.0 * 7.0 - 0.25);
        assert_eq!(y[32], 0.0);
    }
}
