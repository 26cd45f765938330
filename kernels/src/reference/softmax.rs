//! References for the softmax kernels (see `crate::softmax`): the exact row
//! softmax in f64, and the online softmax as a plain f64 loop with the
//! kernel's semantics (inputs scaled with one f32 rounding, the causal
//! convention, zeros for masked columns and fully masked rows) and one final
//! rounding to the storage dtype.
//!
//! `dsl-core`'s interpreter tests include this file (they cannot depend on
//! this crate), so it names only `dsl_core` and `std`.
//!
//! Inputs are the values as stored in `dtype`. Tensors are row-major
//! `[rows, cols]`, contiguous (stride = cols).

use dsl_core::DType;

/// The exact softmax of each row of the row-major `[rows, cols]` matrix `x`,
/// in f64 (no rounding).
pub fn softmax(x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut out = vec![0.0; rows * cols];
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
        for c in 0..cols {
            out[r * cols + c] = (row[c] - m).exp() / s;
        }
    }
    out
}

/// Whether column `c` of row `r` takes part: always without `causal`, else
/// `c <= r + offset` (query row `r` attends keys `0..=r + offset`).
pub fn attends(r: usize, c: usize, causal: Option<i64>) -> bool {
    match causal {
        None => true,
        Some(offset) => (c as i64) <= r as i64 + offset,
    }
}

/// `softmax_online`: per row, `out_c = round_T(exp(x_c - m) / l)` over the
/// attended columns with `x_c = round_f32(in_c * scale)`; masked columns and
/// rows without any attended column are `0`.
pub fn softmax_online(
    x: &[f64],
    rows: usize,
    cols: usize,
    scale: f32,
    causal: Option<i64>,
    dtype: DType,
) -> Vec<f64> {
    assert_eq!(x.len(), rows * cols);
    let mut out = vec![0.0; rows * cols];
    for r in 0..rows {
        let xs: Vec<Option<f64>> = (0..cols)
            .map(|c| attends(r, c, causal).then(|| (x[r * cols + c] as f32 * scale) as f64))
            .collect();
        let m = xs.iter().flatten().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
        if m == f64::NEG_INFINITY {
            continue;
        }
        let l: f64 = xs.iter().flatten().map(|v| (v - m).exp()).sum();
        for (c, v) in xs.iter().enumerate() {
            if let Some(v) = v {
                out[r * cols + c] = dtype.round_float((v - m).exp() / l);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_rows_and_masking() {
        let out = softmax_online(&[1.0; 8], 2, 4, 1.0, None, DType::F32);
        assert_eq!(out, vec![0.25; 8]);
        // Row 0 attends key 0 only; row 1 keys 0..=1.
        let out = softmax_online(&[3.0; 8], 2, 4, 0.5, Some(0), DType::F32);
        assert_eq!(out, vec![1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.0, 0.0]);
        // Offset -1: row 0 attends nothing (zeros), row 1 key 0.
        let out = softmax_online(&[3.0; 8], 2, 4, 1.0, Some(-1), DType::BF16);
        assert_eq!(out, vec![0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]);
    }
}
