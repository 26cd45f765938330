//! References for RoPE and the paged KV-cache write (see `crate::rope`):
//! plain f64 loops, rounded to the storage dtype once at the end (as the
//! kernel rounds at its stores).
//!
//! The angle here is the exact `pos * theta^(-2i / head_dim)` in f64 (no range
//! reduction needed); the kernel computes it in f32, so the two differ by the
//! f32 angle error that [`angle_error_bound`] bounds. Inputs are the values as
//! stored in `dtype` (already representable); outputs are representable in
//! `dtype`. Layouts are the kernel's: `qkv` is `[tokens, (n_q + 2 n_kv) *
//! head_dim]`, `q_out` `[tokens, n_q * head_dim]`, the caches `[slots, n_kv,
//! head_dim]` (`slots = num_blocks * block_size`).

use dsl_core::DType;

/// Head counts and head size of one RoPE launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RopeShape {
    /// Query heads.
    pub n_q: usize,
    /// Key/value heads.
    pub n_kv: usize,
    /// Elements per head (even).
    pub head_dim: usize,
}

impl RopeShape {
    /// Elements of one fused QKV row.
    pub fn row(&self) -> usize {
        (self.n_q + 2 * self.n_kv) * self.head_dim
    }

    /// Elements of one cache slot (`n_kv * head_dim`).
    pub fn slot(&self) -> usize {
        self.n_kv * self.head_dim
    }
}

/// The exact rotation angle of pair `i` at position `pos`.
pub fn angle(pos: i32, i: usize, head_dim: usize, theta: f64) -> f64 {
    pos as f64 * theta.powf(-2.0 * i as f64 / head_dim as f64)
}

/// A bound on the error of the kernel's f32 angle on the interpreter (whose
/// `exp2`/`log2` are correctly rounded), in radians, with a margin of about
/// two: `log2 theta` and the exponent `(2i/d) log2 theta` are rounded (half an
/// ulp each, amplified by `ln 2 * |exponent|` through `exp2`), `exp2` and the
/// product with `pos` add half an ulp of the angle each, and the range
/// reduction (`k * C1` exact, `C2` and `k * C2` rounded, the final
/// subtraction) adds less than `2^-22` absolute.
pub fn angle_error_bound(pos: i32, i: usize, head_dim: usize, theta: f64) -> f64 {
    let e = 2.0 * i as f64 / head_dim as f64 * theta.log2();
    let a = angle(pos, i, head_dim, theta).abs();
    let u = f64::powi(2.0, -24);
    a * u * (2.0 + 2.0 * std::f64::consts::LN_2 * e) + 8.0 * u
}

/// Rotates one pair by `a`: `(x0 cos a - x1 sin a, x0 sin a + x1 cos a)`.
fn rotate(x0: f64, x1: f64, a: f64) -> (f64, f64) {
    let (s, c) = a.sin_cos();
    (x0 * c - x1 * s, x0 * s + x1 * c)
}

/// RoPE of Q and the paged cache write of rotated K and V, as
/// `rope_kv_write` computes it: [`rope_arch_kv_write`] with every option off.
/// Returns `q_out`; writes the slots of tokens whose `slots[t] >= 0` in
/// `k_cache`/`v_cache` and leaves the rest untouched.
#[allow(clippy::too_many_arguments)]
pub fn rope_kv_write(
    qkv: &[f64],
    positions: &[i32],
    slots: &[i32],
    theta: f64,
    shape: RopeShape,
    dtype: DType,
    k_cache: &mut [f64],
    v_cache: &mut [f64],
) -> Vec<f64> {
    assert_eq!(k_cache.len(), v_cache.len());
    rope_arch_kv_write(qkv, positions, slots, theta, shape, &RopeArch::default(), dtype, k_cache, v_cache)
}

/// The architecture options of `rope_arch_kv_write` (see there), as f64
/// values (`None`: the option is off).
#[derive(Clone, Debug, Default)]
pub struct RopeArch {
    /// Rotate `(x[i], x[i + d/2])` instead of `(x[2i], x[2i+1])`.
    pub neox: bool,
    /// Per-pair divisors of the inverse frequency, `[d/2]`.
    pub factors: Option<Vec<f64>>,
    /// Added to the fused QKV row, `[(n_q + 2 n_kv) d]`.
    pub bias: Option<Vec<f64>>,
    /// Q and K head-norm weights (`[d]` each) and epsilon.
    pub qk_norm: Option<(Vec<f64>, Vec<f64>, f64)>,
}

impl RopeArch {
    /// The exact angle of pair `i` at `pos`.
    pub fn angle(&self, pos: i32, i: usize, head_dim: usize, theta: f64) -> f64 {
        angle(pos, i, head_dim, theta) / self.factors.as_ref().map_or(1.0, |f| f[i])
    }

    /// The element indices `(first, partner)` of pair `i` in a head.
    pub fn pair(&self, i: usize, head_dim: usize) -> (usize, usize) {
        if self.neox { (i, i + head_dim / 2) } else { (2 * i, 2 * i + 1) }
    }

    /// One head `x` (`d` values at offset `off` of the fused row) with the
    /// bias added and, when `norm` is given, RMSNormed with it.
    pub fn head(&self, row: &[f64], off: usize, d: usize, norm: Option<&[f64]>) -> Vec<f64> {
        let mut x: Vec<f64> =
            (0..d).map(|j| self.bias.as_ref().map_or(row[off + j], |b| row[off + j] + b[off + j])).collect();
        if let (Some(w), Some((_, _, eps))) = (norm, &self.qk_norm) {
            let rstd = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / d as f64 + eps).sqrt();
            for (v, w) in x.iter_mut().zip(w) {
                *v *= rstd * w;
            }
        }
        x
    }

    /// `x` rotated at `pos`.
    fn rotate_head(&self, x: &[f64], pos: i32, theta: f64) -> Vec<f64> {
        let d = x.len();
        let mut y = vec![0.0; d];
        for i in 0..d / 2 {
            let (a, b) = self.pair(i, d);
            let (y0, y1) = rotate(x[a], x[b], self.angle(pos, i, d, theta));
            y[a] = y0;
            y[b] = y1;
        }
        y
    }
}

/// `rope_arch_kv_write` in f64: [`rope_kv_write`] with the options of `arch`.
#[allow(clippy::too_many_arguments)]
pub fn rope_arch_kv_write(
    qkv: &[f64],
    positions: &[i32],
    slots: &[i32],
    theta: f64,
    shape: RopeShape,
    arch: &RopeArch,
    dtype: DType,
    k_cache: &mut [f64],
    v_cache: &mut [f64],
) -> Vec<f64> {
    let RopeShape { n_q, n_kv, head_dim: d } = shape;
    let tokens = positions.len();
    assert_eq!(slots.len(), tokens);
    assert_eq!(qkv.len(), tokens * shape.row());
    let round = |v: f64| dtype.round_float(v);
    let (qn, kn) = match &arch.qk_norm {
        Some((q, k, _)) => (Some(q.as_slice()), Some(k.as_slice())),
        None => (None, None),
    };
    let mut q_out = vec![0.0; tokens * n_q * d];
    for t in 0..tokens {
        let row = &qkv[t * shape.row()..(t + 1) * shape.row()];
        let pos = positions[t];
        for h in 0..n_q {
            let y = arch.rotate_head(&arch.head(row, h * d, d, qn), pos, theta);
            for (j, v) in y.into_iter().enumerate() {
                q_out[t * n_q * d + h * d + j] = round(v);
            }
        }
        if slots[t] < 0 {
            continue;
        }
        let base = slots[t] as usize * shape.slot();
        for h in 0..n_kv {
            let y = arch.rotate_head(&arch.head(row, (n_q + h) * d, d, kn), pos, theta);
            let v = arch.head(row, (n_q + n_kv + h) * d, d, None);
            for j in 0..d {
                k_cache[base + h * d + j] = round(y[j]);
                v_cache[base + h * d + j] = round(v[j]);
            }
        }
    }
    q_out
}
