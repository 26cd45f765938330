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
/// `rope_kv_write` computes it. Returns `q_out`; writes the slots of tokens
/// whose `slots[t] >= 0` in `k_cache`/`v_cache` and leaves the rest untouched.
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
    let RopeShape { n_q, n_kv, head_dim: d } = shape;
    let tokens = positions.len();
    assert_eq!(slots.len(), tokens);
    assert_eq!(qkv.len(), tokens * shape.row());
    assert_eq!(k_cache.len(), v_cache.len());
    let round = |v: f64| dtype.round_float(v);
    let mut q_out = vec![0.0; tokens * n_q * d];
    for t in 0..tokens {
        let row = &qkv[t * shape.row()..(t + 1) * shape.row()];
        let pos = positions[t];
        for h in 0..n_q {
            for i in 0..d / 2 {
                let (y0, y1) = rotate(row[h * d + 2 * i], row[h * d + 2 * i + 1], angle(pos, i, d, theta));
                q_out[t * n_q * d + h * d + 2 * i] = round(y0);
                q_out[t * n_q * d + h * d + 2 * i + 1] = round(y1);
            }
        }
        if slots[t] < 0 {
            continue;
        }
        let base = slots[t] as usize * shape.slot();
        let (k, v) = (&row[n_q * d..(n_q + n_kv) * d], &row[(n_q + n_kv) * d..]);
        for h in 0..n_kv {
            for i in 0..d / 2 {
                let (y0, y1) = rotate(k[h * d + 2 * i], k[h * d + 2 * i + 1], angle(pos, i, d, theta));
                k_cache[base + h * d + 2 * i] = round(y0);
                k_cache[base + h * d + 2 * i + 1] = round(y1);
            }
        }
        v_cache[base..base + shape.slot()].copy_from_slice(v);
    }
    q_out
}
