//! Plain-Rust references, computed in f64, and test inputs. The references
//! of library kernels live in `kernels::reference` (re-exported here where
//! the macro tests use them); this module holds what only these tests need.

pub use kernels::reference::matmul::matmul;
pub use kernels::reference::softmax::softmax;

/// A small deterministic generator (SplitMix64) for test inputs.
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        kernels::reference::splitmix64(&mut self.0)
    }

    /// A uniform float in `[lo, hi)`, never exactly zero.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        loop {
            let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
            let v = lo + (hi - lo) * u;
            if v != 0.0 {
                return v;
            }
        }
    }

    /// `n` uniform floats in `[lo, hi)`.
    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }

    /// A uniform integer in `[0, n)`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// Layer norm of each row: `(x - mean) / sqrt(var + eps) * w + b`.
pub fn layer_norm(x: &[f64], w: &[f64], b: &[f64], rows: usize, cols: usize, eps: f64) -> Vec<f64> {
    let mut out = vec![0.0; rows * cols];
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let mean = row.iter().sum::<f64>() / cols as f64;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / cols as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        for c in 0..cols {
            out[r * cols + c] = (row[c] - mean) * rstd * w[c] + b[c];
        }
    }
    out
}

/// The running sums of each row of `x` (rows of `cols`), left to right.
pub fn cumsum_rows(x: &[f64], cols: usize) -> Vec<f64> {
    let running = |row: &[f64]| {
        row.iter()
            .scan(0.0, |acc, &v| {
                *acc += v;
                Some(*acc)
            })
            .collect::<Vec<f64>>()
    };
    x.chunks(cols.max(1)).flat_map(running).collect()
}

/// Largest absolute difference, with a message naming the first offending index
/// when it exceeds `atol + rtol * |want|`.
pub fn check_close(got: &[f64], want: &[f64], atol: f64, rtol: f64) -> Result<f64, String> {
    if got.len() != want.len() {
        return Err(format!("length {} vs {}", got.len(), want.len()));
    }
    let mut worst = 0.0f64;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let d = (g - w).abs();
        if d.is_nan() || d > atol + rtol * w.abs() {
            return Err(format!("element {i}: got {g}, want {w} (|diff| {d})"));
        }
        worst = worst.max(d);
    }
    Ok(worst)
}
