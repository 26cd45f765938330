//! The f64 reference of the dense matmul (`kernels::matmul`) and its error bound.
//!
//! `dsl-core`'s interpreter tests include this file (they cannot depend on
//! this crate), so it names nothing outside `std`.

/// `C = A @ B` for row-major `A: [m, k]`, `B: [k, n]` (exact products, f64 sums).
pub fn matmul(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            let av = a[i * k + p];
            for j in 0..n {
                c[i * n + j] += av * b[p * n + j];
            }
        }
    }
    c
}

/// `sum_p |A[i, p] * B[p, j]|` for every output: the scale of the f32
/// accumulation error of output `(i, j)`.
pub fn abs_products(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    let aa: Vec<f64> = a.iter().map(|x| x.abs()).collect();
    let bb: Vec<f64> = b.iter().map(|x| x.abs()).collect();
    matmul(&aa, &bb, m, n, k)
}

/// The tolerance of one output stored in a dtype of unit roundoff `u_out`:
/// the f32 accumulation of `k` exact products in any order (at most
/// `k * 2^-24 * mag`, doubled for margin) plus one rounding of the result.
pub fn error_bound(want: f64, mag: f64, k: usize, u_out: f64) -> f64 {
    2.0 * k as f64 * f64::powi(2.0, -24) * mag + u_out * want.abs() + 1e-30
}
