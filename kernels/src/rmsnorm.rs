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
//! traffic of a bf16 row).
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
//! [`rmsnorm`] follows llama.cpp / the model code: everything in f32 and one
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

use dsl_macros::kernel;

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
    // Programmatic dependent launch (sm_90): every input may come from the
    // previous kernel, so wait first; then let the next kernel start early.
    gdc_wait();
    gdc_launch_dependents();
    let row = program_id(0);
    let cols = arange(0, BLOCK);
    let mask = cols < n_cols;
    let offs = row * stride + cols;
    let x = load(x_ptr + offs, mask = mask, other = 0.0).to(f32);
    let r = load(r_ptr + offs, mask = mask, other = 0.0).to(f32);
    // The new residual, rounded to the storage dtype; the norm reads it back
    // at that precision (as torch's `h.float()` does).
    let h = (x + r).to(T);
    store(h_ptr + offs, h, mask = mask);
    let hf = h.to(f32);
    let rstd = rsqrt(sum(hf * hf, 0) / n_cols + eps);
    let normed = (hf * rstd).to(T).to(f32);
    let w = load(w_ptr + cols, mask = mask, other = 0.0).to(f32);
    store(out_ptr + offs, (normed * w).to(T), mask = mask);
}

/// RMSNorm: `out = round_T(x * rsqrt(mean(x^2) + eps) * w)`, all in f32 (the
/// llama.cpp form); see the module doc.
#[kernel(autotune(configs = [(num_warps = 4), (num_warps = 8), (num_warps = 16)], key = [n_cols]))]
pub fn rmsnorm<T: Float>(
    x_ptr: Ptr<T>,
    w_ptr: Ptr<T>,
    out_ptr: Ptr<T>,
    n_cols: i32,
    stride: i32,
    eps: f32,
    #[constexpr] BLOCK: usize,
) {
    gdc_wait();
    gdc_launch_dependents();
    let row = program_id(0);
    let cols = arange(0, BLOCK);
    let mask = cols < n_cols;
    let offs = row * stride + cols;
    let x = load(x_ptr + offs, mask = mask, other = 0.0).to(f32);
    let rstd = rsqrt(sum(x * x, 0) / n_cols + eps);
    let w = load(w_ptr + cols, mask = mask, other = 0.0).to(f32);
    store(out_ptr + offs, (x * rstd * w).to(T), mask = mask);
}

/// Warps for a row tile of `block` elements, as Triton's heuristic picks them:
/// 4 up to 2048 elements, 8 up to 8192, 16 beyond.
pub fn warps_for(block: usize) -> u32 {
    match block.next_power_of_two() {
        0..=2048 => 4,
        2049..=8192 => 8,
        _ => 16,
    }
}

/// The row tile for `n_cols` columns: the next power of two (what Triton uses;
/// an exact non-power-of-two `BLOCK` is padded to the same tile).
pub fn block_for(n_cols: usize) -> usize {
    n_cols.next_power_of_two()
}
