//! Block formats of the supported tensor types: dequantization to `f32` and
//! llama.cpp's reference quantization (`quantize_row_*_ref`), used by the
//! writer to build test models and by tests as the CPU reference.
//!
//! Formats (little-endian; `d`, `m` are fp16):
//!
//! - `Q8_0`: 34 bytes per 32 values: `d`, then 32 `i8` `q`; `x = d * q`.
//! - `Q4_0`: 18 bytes per 32 values: `d`, then 16 bytes; byte `j` holds value
//!   `j` in its low nibble and value `j + 16` in its high nibble; `x = d * (q - 8)`.
//! - `Q4_1`: 20 bytes per 32 values: `d`, `m`, then 16 bytes of nibbles laid out
//!   as in `Q4_0`; `x = d * q + m`.
//! - `F32`, `F16`, `BF16`: plain little-endian scalars.
//! - `Q5_0`, `Q5_1`, `Q4_K`, `Q5_K`, `Q6_K` (dequantization only): as
//!   `kernels::reference::quant` defines them, exact in f64 and rounded once
//!   to `f32`.
//!
//! Invariant: `dequantize_into(ty, quantize(ty, x))` reproduces `x` exactly for
//! `F32` and up to the format's rounding otherwise (at most half a step, `d / 2`,
//! per value plus the fp16 rounding of `d` and `m`).

use super::types::GgmlType;
use super::{GgufError, Result};
use half::{bf16, f16};

/// Values per block of `Q8_0`, `Q4_0` and `Q4_1`.
pub const QK: usize = 32;

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

/// Quantizes `src` to `ty` with llama.cpp's reference rounding. `src.len()` must
/// be a whole number of blocks.
pub fn quantize(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>> {
    let bytes = block_bytes(ty, src.len() as u64, "quantize")?;
    let mut out = Vec::with_capacity(bytes as usize);
    match ty {
        GgmlType::F32 => src.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        GgmlType::F16 => src.iter().for_each(|&x| out.extend_from_slice(&f16::from_f32(x).to_le_bytes())),
        GgmlType::BF16 => src.iter().for_each(|&x| out.extend_from_slice(&bf16::from_f32(x).to_le_bytes())),
        GgmlType::Q8_0 => src.chunks_exact(QK).for_each(|b| quantize_q8_0(b, &mut out)),
        GgmlType::Q4_0 => src.chunks_exact(QK).for_each(|b| quantize_q4_0(b, &mut out)),
        GgmlType::Q4_1 => src.chunks_exact(QK).for_each(|b| quantize_q4_1(b, &mut out)),
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

/// `quantize_row_q4_0_ref`: `d = max / -8` where `max` is the value of largest
/// magnitude (with its sign), `q = min(15, trunc(x / d + 8.5))`.
fn quantize_q4_0(x: &[f32], out: &mut Vec<u8>) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
    let q = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
    out.extend((0..QK / 2).map(|j| q(x[j]) | (q(x[j + QK / 2]) << 4)));
}

/// `quantize_row_q4_1_ref`: `d = (max - min) / 15`, `m = min`,
/// `q = min(15, trunc((x - min) / d + 0.5))`.
fn quantize_q4_1(x: &[f32], out: &mut Vec<u8>) {
    let min = x.iter().copied().fold(f32::INFINITY, f32::min);
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let d = (max - min) / 15.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
    out.extend_from_slice(&f16::from_f32(min).to_le_bytes());
    let q = |v: f32| (((v - min) * id + 0.5) as i8).min(15) as u8;
    out.extend((0..QK / 2).map(|j| q(x[j]) | (q(x[j + QK / 2]) << 4)));
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
