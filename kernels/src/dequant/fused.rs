//! GEMVs with the decoder's neighbours fused in: an RMSNorm prologue and a
//! residual-add epilogue, so a decode layer needs no separate norm kernels:
//!
//! ```text
//! qkv = gemv(norm: attn_norm, x = h)        o: gemv(residual, x = attn, out = h)
//! act = gemv(norm: ffn_norm, silu, x = h)   down: gemv(residual, x = act, out = h)
//! logits = gemv(norm: output_norm, x = h[rows])
//! ```
//!
//! # Math
//!
//! `FUSE.norm()` (prologue): every program first computes, for each of its
//! `M_BLOCK` activation rows, `rstd = rsqrt(sum_k x^2 / K + eps)` in f32 (it
//! rereads the row, K floats from L2, instead of waiting for another
//! kernel), then uses `x'_k = round_T(round_T(x_k * rstd) * nw_k)` as the
//! activation: exactly the sequence of `add_rmsnorm`'s normalized output
//! (see [`crate::rmsnorm`]), so the fused layer computes the unfused one's
//! values up to the order of the f32 sum of squares.
//!
//! `FUSE.residual()` (epilogue, not with `FUSE.silu()`): `out =
//! round_T(round_T(y) + out)` with `y` the f32 product: the unfused path's
//! rounded projection output plus `add_rmsnorm`'s rounded residual add,
//! written in place (each program reads and writes only its own `[M_BLOCK,
//! BLOCK_N]` patch of `out`, so programs never race).
//!
//! Everything else (dequantization, tiling, the K tail, the SiLU-mul) is
//! the plain GEMV's ([`super::gemv`], module docs in [`super`]).
//!
//! # Contract
//!
//! As the plain GEMV, plus: `nw_ptr` holds `K` norm weights in `T` (read
//! only with the norm; pass any valid pointer otherwise); `x` must not alias
//! `out` (with the residual add, `out` is the residual stream and `x`
//! another buffer); `eps` is read only with the norm.
//!
//! # Constexprs
//!
//! The plain GEMV's (`T`, `QUANT`, `M_BLOCK`, `BLOCK_N`, `BLOCK_K`), with
//! its `SILU` as one of the fusions `FUSE` ([`Fuse`]: SiLU-mul, norm,
//! residual add). The runtime uses [`super::gemv_tiles`].

use super::gemv::gemv_body;
use super::{Fuse, QuantFormat};
use dsl_macros::kernel;

/// The dequant GEMV of [`super::gemv::gemv`] (any format `QUANT`) with an
/// optional RMSNorm prologue and residual-add epilogue (`FUSE`); see the
/// module doc. Each format is its own specialization (IR name
/// `gemv_q4_1_fused`, ...); Q8_0 is the tied LM head with the final norm in
/// its prologue. Output row `r` starts at `out + r * ldo` (`ldo >=
/// n`), as in [`super::linear::linear`], in `O` (`T`, or f32 for logits;
/// the residual add takes `O == T`).
#[kernel(name = "gemv_{QUANT}_fused")]
#[allow(clippy::too_many_arguments)]
pub fn gemv_fused<T: Float, O: Float>(
    x_ptr: Ptr<T>,
    q_ptr: Ptr<u8>,
    s_ptr: Ptr<f16>,
    nw_ptr: Ptr<T>,
    out_ptr: Ptr<O>,
    m: i32,
    n: i32,
    ldo: i32,
    k: i32,
    eps: f32,
    #[constexpr] QUANT: QuantFormat,
    #[constexpr] FUSE: Fuse,
    #[constexpr] M_BLOCK: usize,
    #[constexpr] BLOCK_N: usize,
    #[constexpr] BLOCK_K: usize,
) {
    gemv_body(
        x_ptr, q_ptr, s_ptr, out_ptr, m, n, ldo, k, nw_ptr, eps, QUANT, FUSE, T, M_BLOCK, BLOCK_N, BLOCK_K,
    );
}
