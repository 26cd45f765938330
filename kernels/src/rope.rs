//! RoPE + paged KV-cache write: from the fused QKV projection output, rotate
//! Q and K and write K and V into the paged cache.
//!
//! # Math
//!
//! The rotation is the one llama.cpp applies to GGUF Llama models
//! (`LLAMA_ROPE_TYPE_NORM`): each head of Q and K is rotated in **adjacent**
//! pairs `(x[2i], x[2i+1])`, `i < HEAD_DIM / 2`, by the angle
//! `a_i = pos * theta^(-2i / HEAD_DIM)`:
//!
//! ```text
//! y[2i]   = x[2i] * cos(a_i) - x[2i+1] * sin(a_i)
//! y[2i+1] = x[2i] * sin(a_i) + x[2i+1] * cos(a_i)
//! ```
//!
//! (The GGUF converter permutes the rows of the Q/K projection weights so that
//! this adjacent-pair rotation of the GGUF model equals Hugging Face's
//! rotate-half rotation of the original checkpoint; a kernel fed GGUF weights
//! must use the adjacent pairs.) `theta` is the model's `rope.freq_base`
//! (100000 for SmolLM2), a runtime f32 scalar.
//!
//! The angle is computed in f32 exactly in this order (the interpreter and the
//! GPU both follow it; the f64 reference in [`crate::reference::rope`] uses the
//! exact angle and bounds the difference, `angle_error_bound`):
//!
//! ```text
//! inv_freq_i = exp2(-((2i / HEAD_DIM) * log2(theta)))
//! a_i        = f32(pos) * inv_freq_i
//! k          = floor(a_i / (2 pi) + 1/2)                (range reduction)
//! r_i        = (a_i - k * C1) - k * C2                  (C1 = 6.28125 exact, C1 + C2 = 2 pi)
//! ```
//!
//! then `cos(r_i)`, `sin(r_i)` and the rotation in f32, rounded to `T` once at
//! the store. The range reduction matters on the GPU: `sin.approx`/`cos.approx`
//! are accurate (2^-20.9 absolute) only for small arguments, and positions up to
//! 8191 give angles up to 8191 rad. `k * C1` is exact (k < 2^13, C1 has 8
//! significant bits), so `r_i` carries only the error already in `a_i`. That
//! error is inherent to computing the angle in f32 (as llama.cpp and HF do):
//! `inv_freq` is rounded (and `ex2.approx` on the GPU is a few ulps), so
//! `|a_i|` has a relative error of a few `2^-24`, up to ~1e-3 rad at position
//! 8191 for the low-index pairs; tests bound it per element.
//!
//! # Tiling
//!
//! One program per token (grid `[tokens, 1, 1]`), all heads of the token at
//! once as 2-D tiles `[heads, HEAD_DIM / 2]` (Q: `[N_Q, HALF]`, K:
//! `[N_KV, HALF]`, V: `[N_KV, HEAD_DIM]`; `N_Q`/`N_KV` need not be powers of
//! two, the front end pads and masks). The angles, `cos` and `sin` depend only
//! on the token and the pair index, so a per-token program computes them once
//! as a `[1, HALF]` row and broadcasts them over all `N_Q + N_KV` heads (a
//! per-(token, head) program would recompute them per head and need a runtime
//! branch between Q heads, K heads and the V copy). Even and odd elements are
//! loaded with two strided loads (offsets `2i` and `2i + 1`) rather than a
//! contiguous load plus `split`, which keeps codegen free of shared-memory
//! shuffles; the V copy is a plain contiguous load/store in `T`.
//!
//! # Layout contract
//!
//! - `qkv`: `[tokens, (N_Q + 2 N_KV) * HEAD_DIM]` row-major in `T`, per row
//!   Q heads, then K heads, then V heads, each `HEAD_DIM` contiguous.
//! - `positions`, `slot_mapping`: `[tokens]` i32. A slot is
//!   `block * block_size + offset`; `-1` means "do not write this token to the
//!   cache" (padding); Q is rotated for every token.
//! - `q_out`: `[tokens, N_Q * HEAD_DIM]` in `T`, rotated Q.
//! - `k_cache`, `v_cache`: `[num_blocks, block_size, N_KV, HEAD_DIM]` in `T`.
//!   Because `(block, offset)` are the outer two dimensions, the element
//!   `(h, d)` of a slot lives at `slot * N_KV * HEAD_DIM + h * HEAD_DIM + d`:
//!   the paged block size does not enter the address, so it is not a
//!   constexpr. K is written rotated, V unrotated (copied bit for bit); cache
//!   entries of other slots are untouched. Offsets are i32: the cache must have
//!   fewer than 2^31 elements (the runtime's 32-bit offset rule).
//! - Slots must be distinct among the tokens of one launch (the interpreter
//!   reports a write race otherwise).
//!
//! # Constexprs
//!
//! `N_Q`, `N_KV` (head counts, any positive value), `HEAD_DIM` (a power of
//! two, e.g. 64 or 128); `HALF = HEAD_DIM / 2` is derived. `T` (f32, bf16 or
//! f16) is the storage dtype of `qkv`, `q_out` and the caches.

use crate::kv_cache::kv8_write;
use dsl_core::DType;
use dsl_macros::{kernel, kernel_fn};

/// RoPE (adjacent pairs, llama.cpp `NORM`) on Q and K of a fused QKV row, and
/// the paged KV-cache write of rotated K and unrotated V; one program per token.
#[kernel]
#[allow(clippy::too_many_arguments)]
pub fn rope_kv_write<T: Float>(
    qkv_ptr: Ptr<T>,
    pos_ptr: Ptr<i32>,
    slot_ptr: Ptr<i32>,
    q_out_ptr: Ptr<T>,
    k_cache_ptr: Ptr<T>,
    v_cache_ptr: Ptr<T>,
    theta: f32,
    #[constexpr] N_Q: usize,
    #[constexpr] N_KV: usize,
    #[constexpr] HEAD_DIM: usize,
    #[constexpr] KV8: bool,
) {
    // Programmatic dependent launch (sm_90): every input may come from the
    // previous kernel, so wait first; then let the next kernel start early.
    gdc_wait();
    gdc_launch_dependents();
    let all = full([], 0, i32);
    let tok = program_id(0);
    let (c, s) = rope_angles(pos_ptr, theta, tok, HEAD_DIM);
    rope_row(
        qkv_ptr,
        c,
        s,
        load(slot_ptr + tok),
        q_out_ptr,
        k_cache_ptr,
        v_cache_ptr,
        tok,
        all,
        N_Q,
        all,
        N_KV,
        N_Q,
        N_KV,
        HEAD_DIM,
        KV8,
    );
}

/// The pair indices `i` (`[HEAD_DIM / 2]`) and their inverse frequencies
/// `theta^(-2 i / head_dim)` (f32).
#[kernel_fn]
pub fn rope_inv_freq(theta: Tensor, head_dim: usize) -> (Tensor, Tensor) {
    let i = arange(0, head_dim / 2);
    (i, rope_freq_of(i, theta, head_dim))
}

/// The inverse frequencies of the pair indices `i` (any shape; see
/// [`rope_inv_freq`]).
#[kernel_fn]
pub fn rope_freq_of(i: Tensor, theta: Tensor, head_dim: usize) -> Tensor {
    let expo = (i * 2).to(f32) / head_dim;
    exp2(-(expo * log2(theta)))
}

/// The rotation of position `pos` (f32) at `inv_freq`: the angles
/// range-reduced to [-pi, pi], then their cosines and sines as `[1, HALF]`
/// rows.
#[kernel_fn]
pub fn rope_cos_sin(pos: Tensor, inv_freq: Tensor) -> (Tensor, Tensor) {
    let r = rope_reduced(pos, inv_freq);
    (expand_dims(cos(r), 0), expand_dims(sin(r), 0))
}

/// The angles `pos * inv_freq`, range-reduced to [-pi, pi] (the module
/// doc's order).
#[kernel_fn]
pub fn rope_reduced(pos: Tensor, inv_freq: Tensor) -> Tensor {
    let angle = pos * inv_freq;
    let k = floor(angle * 0.159_154_943_091_895_35 + 0.5);
    angle - k * 6.28125 - k * 0.001_935_307_179_586_476_9
}

/// The cosines and sines ([`rope_cos_sin`]) of token `tok`'s position.
#[kernel_fn]
pub fn rope_angles(pos_ptr: Tensor, theta: Tensor, tok: Tensor, head_dim: usize) -> (Tensor, Tensor) {
    let pos = load(pos_ptr + tok).to(f32);
    let (_, inv_freq) = rope_inv_freq(theta, head_dim);
    rope_cos_sin(pos, inv_freq)
}

/// The body of [`rope_kv_write`] for token `tok` (see the module doc), for
/// the `q_count` query heads from `q_first` and the `kv_count` KV heads from
/// `kv_first` of its `n_q` and `n_kv` (all of them in the kernel; one KV
/// head and its query group in a persistent step), with the token's
/// rotation (`c`, `s` from [`rope_angles`]) and cache slot given: a
/// persistent step forms them before it waits for the QKV product, so only
/// the product's loads remain after the wait. Each element's arithmetic is
/// the same whichever heads a call covers.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn rope_row(
    qkv_ptr: Tensor,
    c: Tensor,
    s: Tensor,
    slot: Tensor,
    q_out_ptr: Tensor,
    k_cache_ptr: Tensor,
    v_cache_ptr: Tensor,
    tok: Tensor,
    q_first: Tensor,
    q_count: usize,
    kv_first: Tensor,
    kv_count: usize,
    n_q: usize,
    n_kv: usize,
    head_dim: usize,
    kv8: bool,
) {
    let row = tok * ((n_q + 2 * n_kv) * head_dim);
    let even = expand_dims(arange(0, head_dim / 2) * 2, 0);

    // Q: [q_count, HALF] pairs, rotated, to q_out.
    let qh = expand_dims(q_first + arange(0, q_count), 1) * head_dim + even;
    let q0 = load(qkv_ptr + row + qh).to(f32);
    let q1 = load(qkv_ptr + row + qh + 1).to(f32);
    let q_dst = q_out_ptr + tok * (n_q * head_dim) + qh;
    store(q_dst, q0 * c - q1 * s);
    store(q_dst + 1, q0 * s + q1 * c);

    // K (rotated) and V (copied) to the token's cache slot, unless slot < 0.
    let valid = slot >= 0;
    let dst = where_(valid, slot, 0) * (n_kv * head_dim);
    let heads = expand_dims(kv_first + arange(0, kv_count), 1) * head_dim;
    let kh = heads + even;
    let k_src = qkv_ptr + row + n_q * head_dim + kh;
    let k0 = load(k_src, mask = valid, other = 0.0).to(f32);
    let k1 = load(k_src + 1, mask = valid, other = 0.0).to(f32);
    if kv8 {
        // The FP8 cache ([`crate::kv_cache`]): each head's values and scale.
        let vh = heads + expand_dims(arange(0, head_dim), 0);
        let v = load(qkv_ptr + row + (n_q + n_kv) * head_dim + vh, mask = valid, other = 0.0).to(f32);
        let (a, b, hk) = (k0 * c - k1 * s, k0 * s + k1 * c, kv_first + arange(0, kv_count));
        kv8_write(k_cache_ptr, v_cache_ptr, slot, hk, a, b, v, even, 1, valid, n_kv, head_dim);
    } else {
        let k_dst = k_cache_ptr + dst + kh;
        store(k_dst, k0 * c - k1 * s, mask = valid);
        store(k_dst + 1, k0 * s + k1 * c, mask = valid);
        let vh = heads + expand_dims(arange(0, head_dim), 0);
        let v = load(qkv_ptr + row + (n_q + n_kv) * head_dim + vh, mask = valid, other = 0.0);
        store(v_cache_ptr + dst + vh, v, mask = valid);
    }
}

/// The heads of a fused QKV row, for a product whose epilogue is
/// [`rope_pairs`] ([`RopeShape::NONE`]: a plain product).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RopeShape {
    n_q: usize,
    n_kv: usize,
    head_dim: usize,
}

impl RopeShape {
    /// No RoPE epilogue.
    pub const NONE: RopeShape = RopeShape { n_q: 0, n_kv: 0, head_dim: 0 };

    /// `n_q` query and `n_kv` KV heads of `head_dim` (a method, so that
    /// kernel code can call it on [`RopeShape::NONE`]).
    pub const fn heads(self, n_q: usize, n_kv: usize, head_dim: usize) -> RopeShape {
        RopeShape { n_q, n_kv, head_dim }
    }

    /// Whether the product ends in [`rope_pairs`].
    pub const fn on(self) -> bool {
        self.head_dim > 0
    }

    /// Query heads.
    pub const fn n_q(self) -> usize {
        self.n_q
    }

    /// KV heads.
    pub const fn n_kv(self) -> usize {
        self.n_kv
    }

    /// Elements per head.
    pub const fn head_dim(self) -> usize {
        self.head_dim
    }
}

/// [`rope_row`] as the epilogue of a one-row QKV product tile: `even` and
/// `odd` are the f32 sums of the tile's pairs of weight rows (`[pairs]`),
/// `r` their even rows (a pair never straddles two heads). Each value is
/// rounded to `dt` first, as the product's store to the QKV row rounds it,
/// then rotated and stored as [`rope_row`] does, with its angles: Q pairs to
/// `q_out`, K pairs (rotated) and V pairs (copied) to the token's cache
/// slot (unless `slot < 0`). Rows from `rows` on are padding.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn rope_pairs(
    even: Tensor,
    odd: Tensor,
    r: Tensor,
    rows: Tensor,
    pos: Tensor,
    theta: Tensor,
    slot: Tensor,
    q_out_ptr: Tensor,
    k_cache_ptr: Tensor,
    v_cache_ptr: Tensor,
    n_q: usize,
    n_kv: usize,
    head_dim: usize,
    dt: DType,
) {
    let (nq, nk) = ((n_q * head_dim) as i32, (n_kv * head_dim) as i32);
    let y0 = even.to(dt).to(f32);
    let y1 = odd.to(dt).to(f32);
    let angle = rope_reduced(pos, rope_freq_of(r % head_dim as i32 / 2, theta, head_dim));
    let (c, s) = (cos(angle), sin(angle));
    let (a, b) = (y0 * c - y1 * s, y0 * s + y1 * c);
    let is_q = r < nq;
    store(q_out_ptr + r, a, mask = is_q);
    store(q_out_ptr + r + 1, b, mask = is_q);
    let valid = slot >= 0;
    let dst = where_(valid, slot, 0) * nk;
    let is_k = r >= nq && r < nq + nk && valid;
    store(k_cache_ptr + dst + r - nq, a, mask = is_k);
    store(k_cache_ptr + dst + r - nq + 1, b, mask = is_k);
    let is_v = r >= nq + nk && r < rows && valid;
    store(v_cache_ptr + dst + r - (nq + nk), even.to(dt), mask = is_v);
    store(v_cache_ptr + dst + r - (nq + nk) + 1, odd.to(dt), mask = is_v);
}

/// [`rope_kv_write`] with the options where model architectures differ,
/// each a constexpr (off: the same arithmetic as [`rope_kv_write`]):
///
/// - `NEOX`: rotate the pairs `(x[i], x[i + HALF])` (llama.cpp
///   `LLAMA_ROPE_TYPE_NEOX`: Qwen2, Qwen3) instead of adjacent pairs. The
///   angle of pair `i` is the same.
/// - `FACTORS`: divide pair `i`'s inverse frequency by `factors[i]` (f32,
///   `[HALF]`): llama.cpp's `rope_freqs.weight` (Llama 3's `llama3` scaling),
///   with linear scaling's factor folded in by the host.
/// - `BIAS`: add `bias` (f32, `[(N_Q + 2 N_KV) * HEAD_DIM]`, one fused QKV
///   row) to Q, K and V before anything else (Qwen2's projection biases).
/// - `QK_NORM`: RMSNorm each Q and K head over its `HEAD_DIM` values before
///   the rotation, `x * rsqrt(sum(x^2) / HEAD_DIM + eps) * w` in f32, with
///   `w` the Q norm weight at `norm[0..HEAD_DIM]` and the K one at
///   `norm[HEAD_DIM..2 HEAD_DIM]` (f32; Qwen3).
///
/// Everything is per token (one program per token), so a row's values never
/// depend on the other rows of the launch (batch invariance). Unused pointer
/// arguments are never read.
#[kernel]
#[allow(clippy::too_many_arguments)]
pub fn rope_arch_kv_write<T: Float>(
    qkv_ptr: Ptr<T>,
    pos_ptr: Ptr<i32>,
    slot_ptr: Ptr<i32>,
    q_out_ptr: Ptr<T>,
    k_cache_ptr: Ptr<T>,
    v_cache_ptr: Ptr<T>,
    factors_ptr: Ptr<f32>,
    bias_ptr: Ptr<f32>,
    norm_ptr: Ptr<f32>,
    theta: f32,
    eps: f32,
    #[constexpr] N_Q: usize,
    #[constexpr] N_KV: usize,
    #[constexpr] HEAD_DIM: usize,
    #[constexpr] NEOX: bool,
    #[constexpr] FACTORS: bool,
    #[constexpr] BIAS: bool,
    #[constexpr] QK_NORM: bool,
    #[constexpr] KV8: bool,
) {
    gdc_wait();
    gdc_launch_dependents();
    let tok = program_id(0);
    let half = HEAD_DIM / 2;
    let row = tok * ((N_Q + 2 * N_KV) * HEAD_DIM);
    let pos = load(pos_ptr + tok).to(f32);
    let slot = load(slot_ptr + tok);

    // The angles of `rope_row`, optionally divided by the frequency factors.
    let (i, base) = rope_inv_freq(theta, HEAD_DIM);
    let inv_freq = if FACTORS { base / load(factors_ptr + i) } else { base };
    let (c, s) = rope_cos_sin(pos, inv_freq);
    // The first element of each pair and the distance to its partner.
    let first = expand_dims(if NEOX { i } else { i * 2 }, 0);
    let step = if NEOX { half } else { 1 };

    // Q: [N_Q, HALF] pairs (+ bias, head norm), rotated, to q_out.
    let qh = expand_dims(arange(0, N_Q), 1) * HEAD_DIM + first;
    let q0 = load(qkv_ptr + row + qh).to(f32);
    let q1 = load(qkv_ptr + row + qh + step).to(f32);
    let q0 = if BIAS { q0 + load(bias_ptr + qh) } else { q0 };
    let q1 = if BIAS { q1 + load(bias_ptr + qh + step) } else { q1 };
    let q_rstd = expand_dims(rsqrt(sum(q0 * q0 + q1 * q1, 1) / HEAD_DIM + eps), 1);
    let q0 = if QK_NORM { q0 * q_rstd * load(norm_ptr + first) } else { q0 };
    let q1 = if QK_NORM { q1 * q_rstd * load(norm_ptr + first + step) } else { q1 };
    let q_dst = q_out_ptr + tok * (N_Q * HEAD_DIM) + qh;
    store(q_dst, q0 * c - q1 * s);
    store(q_dst + step, q0 * s + q1 * c);

    // K (+ bias, head norm, rotated) and V (+ bias) to the token's cache
    // slot, unless slot < 0.
    let valid = slot >= 0;
    let dst = where_(valid, slot, 0) * (N_KV * HEAD_DIM);
    let heads = expand_dims(arange(0, N_KV), 1) * HEAD_DIM;
    let kh = heads + first;
    let k_off = N_Q * HEAD_DIM;
    let k0 = load(qkv_ptr + row + k_off + kh, mask = valid, other = 0.0).to(f32);
    let k1 = load(qkv_ptr + row + k_off + kh + step, mask = valid, other = 0.0).to(f32);
    let k0 = if BIAS { k0 + load(bias_ptr + k_off + kh) } else { k0 };
    let k1 = if BIAS { k1 + load(bias_ptr + k_off + kh + step) } else { k1 };
    let k_rstd = expand_dims(rsqrt(sum(k0 * k0 + k1 * k1, 1) / HEAD_DIM + eps), 1);
    let k0 = if QK_NORM { k0 * k_rstd * load(norm_ptr + HEAD_DIM + first) } else { k0 };
    let k1 = if QK_NORM { k1 * k_rstd * load(norm_ptr + HEAD_DIM + first + step) } else { k1 };
    if KV8 {
        // The FP8 cache ([`crate::kv_cache`]): each head's values and scale.
        let vh = heads + expand_dims(arange(0, HEAD_DIM), 0);
        let v_off = (N_Q + N_KV) * HEAD_DIM;
        let v = load(qkv_ptr + row + v_off + vh, mask = valid, other = 0.0).to(f32);
        let v = if BIAS { v + load(bias_ptr + v_off + vh) } else { v };
        let (a, b, hk) = (k0 * c - k1 * s, k0 * s + k1 * c, arange(0, N_KV));
        kv8_write(k_cache_ptr, v_cache_ptr, slot, hk, a, b, v, first, step, valid, N_KV, HEAD_DIM);
    } else {
        let k_dst = k_cache_ptr + dst + kh;
        store(k_dst, k0 * c - k1 * s, mask = valid);
        store(k_dst + step, k0 * s + k1 * c, mask = valid);
        let vh = heads + expand_dims(arange(0, HEAD_DIM), 0);
        let v_off = (N_Q + N_KV) * HEAD_DIM;
        let v = load(qkv_ptr + row + v_off + vh, mask = valid, other = 0.0);
        if BIAS {
            store(v_cache_ptr + dst + vh, v.to(f32) + load(bias_ptr + v_off + vh), mask = valid);
        } else {
            store(v_cache_ptr + dst + vh, v, mask = valid);
        }
    }
}
