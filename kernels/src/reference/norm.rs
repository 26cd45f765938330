//! References for RMSNorm and add+RMSNorm (see `crate::rmsnorm`): plain f64
//! loops that round where the kernels round (the exact sequences of the
//! `rmsnorm` module doc), so a kernel differs from them only by its f32 row
//! statistic and, through it, by at most one unit of a final rounding.
//!
//! Inputs are the values as stored in `dtype` (already representable);
//! outputs are representable in `dtype`. Tensors are row-major
//! `[rows, cols]`, contiguous (stride = cols); `w` has `cols` elements.

use dsl_core::DType;

/// `1 / sqrt(mean(row^2) + eps)` in f64.
fn rstd(row: &[f64], eps: f64) -> f64 {
    let ms = row.iter().map(|v| v * v).sum::<f64>() / row.len() as f64;
    1.0 / (ms + eps).sqrt()
}

/// Add+RMSNorm as `add_rmsnorm` (and peers.py) computes it, with every row's
/// `rstd` multiplied by `rstd_scale` (1 for the exact sequence); returns
/// `(out, h)`:
///
/// ```text
/// h   = round_T(round_f32(x + r))
/// nrm = round_T(h * rstd(h) * rstd_scale)
/// out = round_T(nrm * w)
/// ```
///
/// A kernel computes `rstd` in f32, a relative error of about `1e-6` away from
/// the f64 value; where `h * rstd` lies that close to a rounding boundary of
/// `T`, the intermediate `round_T` may go the other way and the output then
/// differs by up to two units of its rounding. Tests accept an output within
/// one unit of the reference computed with `rstd_scale = 1` or `1 +- delta`.
#[allow(clippy::too_many_arguments)]
pub fn add_rmsnorm_scaled(
    x: &[f64],
    r: &[f64],
    w: &[f64],
    rows: usize,
    cols: usize,
    eps: f64,
    dtype: DType,
    rstd_scale: f64,
) -> (Vec<f64>, Vec<f64>) {
    assert_eq!(x.len(), rows * cols);
    assert_eq!(r.len(), rows * cols);
    assert_eq!(w.len(), cols);
    // The kernel adds in f32 then rounds to T (as torch's bf16 add does).
    let h: Vec<f64> = x.iter().zip(r).map(|(a, b)| dtype.round_float((a + b) as f32 as f64)).collect();
    let mut out = vec![0.0; rows * cols];
    for i in 0..rows {
        let row = &h[i * cols..(i + 1) * cols];
        let s = rstd(row, eps) * rstd_scale;
        for c in 0..cols {
            let nrm = dtype.round_float(row[c] * s);
            out[i * cols + c] = dtype.round_float(nrm * w[c]);
        }
    }
    (out, h)
}

/// RMSNorm as `rmsnorm` computes it: `out = round_T(x * rstd(x) * w)`.
pub fn rmsnorm(x: &[f64], w: &[f64], rows: usize, cols: usize, eps: f64, dtype: DType) -> Vec<f64> {
    assert_eq!(x.len(), rows * cols);
    assert_eq!(w.len(), cols);
    let mut out = vec![0.0; rows * cols];
    for i in 0..rows {
        let row = &x[i * cols..(i + 1) * cols];
        let s = rstd(row, eps);
        for c in 0..cols {
            out[i * cols + c] = dtype.round_float(row[c] * s * w[c]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_rows_normalize_to_the_weight() {
        // A row of ones has rms 1: out = w (eps = 0).
        let (out, h) =
            add_rmsnorm_scaled(&[0.5; 4], &[0.5; 4], &[1.0, 2.0, -3.0, 0.25], 1, 4, 0.0, DType::F32, 1.0);
        assert_eq!(h, vec![1.0; 4]);
        assert_eq!(out, vec![1.0, 2.0, -3.0, 0.25]);
        let out = rmsnorm(&[2.0, -2.0], &[1.0, 3.0], 1, 2, 0.0, DType::BF16);
        assert_eq!(out, vec![1.0, -3.0]);
    }

    #[test]
    fn bf16_rounds_the_residual_first() {
        // 1 + 2^-9 is not a bf16: h rounds to 1 before the norm.
        let (_, h) = add_rmsnorm_scaled(&[1.0], &[1.0 / 512.0], &[1.0], 1, 1, 0.0, DType::BF16, 1.0);
        assert_eq!(h, vec![1.0]);
    }
}
