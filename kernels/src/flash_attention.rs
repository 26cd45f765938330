//! FlashAttention prefill over a paged KV cache: variable-length batches,
//! grouped-query attention, causal or full, reading K and V through block
//! tables so that chunked prefill and prefix-cache hits work.
//!
//! # Math
//!
//! Sequence `b` has a context of `ctx_b = seq_lens[b]` key/value positions and
//! `q_len_b = cu_seqlens_q[b + 1] - cu_seqlens_q[b]` query tokens, which are the
//! **last** `q_len_b` positions of the context: query `i` sits at position
//! `p_i = ctx_b - q_len_b + i` (the first `ctx_b - q_len_b` positions are a
//! prefix-cache hit or earlier chunks, already in the cache). For query head
//! `h` (key/value head `h / G`, `G = H_Q / H_KV`) and the keys `j` it attends
//! (`j <= p_i` when `CAUSAL`, every `j < ctx_b` otherwise):
//!
//! ```text
//! s_j = scale * (q_i . k_j)
//! o_i = sum_j softmax(s)_j v_j
//! ```
//!
//! The softmax is online (FlashAttention-2): keys are visited in blocks of
//! `BLOCK_N`, the running row max `m` and row sum `l` live in the log2 domain
//! (`c = |scale| * log2(e)`, then `exp2`; a negative `scale` negates `q`
//! once, which is exact). Since `c >= 0`, the row max of the scaled scores
//! is the scaled row max of the raw ones, so in unmasked key blocks each
//! score's exponent is one `fma` (masked blocks scale first, then mask):
//!
//! ```text
//! s     = q . k^T                               [BLOCK_M, BLOCK_N] f32
//! m_new = max(m, c * rowmax(s))
//! p     = exp2(fma(s, c, -m_new))
//! alpha = exp2(m - m_new)
//! l     = l * alpha + rowsum(p)
//! acc   = acc * alpha + round_T(p) . v          (f32 accumulator)
//! o     = acc / l                               (rounded to T once)
//! ```
//!
//! `p` is rounded to `T` before the second product (as FlashAttention-2 and
//! Triton do, so that a tensor-core lowering can take it as an operand); `l`
//! sums the unrounded `p`. For f32 `T` the rounding is exact.
//!
//! The batch-invariant mode (`INVARIANT`) computes each key block's softmax
//! on its own and folds the blocks' partials into the running state in key
//! order (`online_softmax_step`'s `exact`):
//!
//! ```text
//! mb    = c * rowmax(s),  p = exp2(fma(s, c, -mb))
//! lb    = fixsum(p),      ob = round_T(p) . v   (from a zero accumulator)
//! m_new = max(m, mb),     a = exp2(m - m_new),  b = exp2(mb - m_new)
//! l     = fma(l, a, lb * b)
//! acc   = fma(acc, a, ob * b)
//! ```
//!
//! `fixsum` ([`fixed_row_sum`]) sums the weights in fixed point, in units
//! of `2^-23` (each `p <= 1` rounded to the nearest unit, in one `fadd`):
//! an integer sum, so its bits do not depend on the order of the additions.
//! A tile may therefore put the keys of one row in any lanes and warps (the
//! decode kernel's 16-row tile spreads them over four warps, the prefill
//! kernel's 64-row tile keeps a row in one warp) and get the same `lb`; the
//! products' sums run over the head dimension and over the block's keys
//! one 16-wide step after another in every layout.
//!
//! A block's partial `(mb, lb, ob)` depends on nothing but the block, so a
//! decode step may compute the blocks of one row in different programs
//! and fold them afterwards ([`softmax_fold`]), bit for bit what this
//! kernel computes for the same row: the key blocks are those of absolute
//! positions `0, BLOCK_N, 2 BLOCK_N, ...` on both sides.
//!
//! Rows that see no key (causal rows at negative positions when a caller
//! passes `seq_lens[b] < q_len_b`, every row of an empty context under full
//! attention) are not NaN: `m` starts at the lowest finite f32,
//! so `exp2(m - m_new)` is never `exp2(-inf + inf)`, masked scores are `-inf`
//! (`p = 0`), and the final reciprocal is `0` when `l = 0` (output zeros).
//!
//! # Tiling
//!
//! Grid `[cdiv(max_q_len, BLOCK_M), B * H_Q, 1]`: program `(x, b * H_Q + h)`
//! handles query rows `m * BLOCK_M ..` of sequence `b`, head `h`, with
//! `m = x` for full attention and `m = num_programs(0) - 1 - x` when
//! `CAUSAL` (the GPU starts programs in order, so the heaviest query blocks
//! go first and the light ones fill the last wave); programs
//! whose first row is past `q_len_b` do nothing (one runtime `if`). The Q
//! tile `[BLOCK_M, HEAD_DIM]` is loaded once; the key loop is split the
//! Triton way into
//!
//! 1. blocks every row of the tile sees entirely (`[0, lo)`, `lo` = the first
//!    query's position plus one, rounded down to `BLOCK_N`; for full
//!    attention `ctx` rounded down): no mask at all, unmasked vector loads;
//! 2. the remaining blocks up to `hi` (the last query's position plus one,
//!    capped at `ctx`; `ctx` for full attention): keys `>= hi` are masked at
//!    the loads, and when `CAUSAL` each row masks the keys after its position.
//!
//! Fully masked key blocks above the diagonal are never visited, so causal
//! work is about half of full. Each key block is `dot(q, trans(k))`, the
//! online-softmax update, and `dot(p, v)`, so a tensor-core lowering of `dot`
//! speeds the kernel up unchanged.
//!
//! Paging: key position `j` of sequence `b` lives in cache row
//! `block_tables[b, j / PAGE] * PAGE + j % PAGE`. The lookup is per key (a
//! `[BLOCK_N]` gather of the block table, cached), so a key block may cross
//! page boundaries and `PAGE` is independent of `BLOCK_N`. `PAGE` is a
//! constexpr power of two, so in the unmasked loop the page and the offset
//! are a shift and a mask (a runtime page size would cost two integer
//! divisions per key and iteration in the hot loop); the boundary loop
//! divides by the constant (a few instructions more: a shift there too
//! makes ptxas spill the head-dim-64 tile on sm_90a).
//! K and V share the cache layout, so one offset tile serves both loads; each
//! row is `HEAD_DIM` contiguous elements (16-byte vector loads).
//!
//! When a page holds whole key blocks (`PAGE % BLOCK_N == 0`, a constexpr
//! choice) an unmasked key block is `BLOCK_N` consecutive rows of one page,
//! at row `block_tables[b, n0 / PAGE] * PAGE + n0 % PAGE` (one page lookup
//! per block). Without `BOXES` it is read by plain loads at offsets fixed
//! for the whole loop (no per-key lookup). With `BOXES` it is one box of
//! the cache, seen as a matrix of `H_KV * HEAD_DIM` columns: a
//! `load_block`. On sm_90a the
//! codegen copies such boxes with TMA (as FlashAttention-3 does for pages
//! that are a multiple of its key tile), which frees the per-thread address
//! math and registers of the gather, and the loop needs no CTA barrier
//! (which is what lets [`config_for`] take 128 x 128 tiles of 8 warps over
//! large pages). The
//! matrix's row count is a bound, `i32::MAX / (H_KV * HEAD_DIM)` (the
//! layout contract's 32-bit offsets), never reached by a box.
//!
//! # Layout contract
//!
//! - `q`: `[total_q, H_Q * HEAD_DIM]` row-major in `T` (rotated Q, as
//!   `crate::rope::rope_kv_write` writes it); token `cu_seqlens_q[b] + i` is
//!   query `i` of sequence `b`. `o`: the same shape and dtype.
//! - `k_cache`, `v_cache`: `[num_blocks, PAGE, H_KV, HEAD_DIM]` in `T`
//!   (the layout `rope_kv_write` writes).
//! - `block_tables`: `[B, max_blocks_per_seq]` i32, row stride
//!   `max_blocks_per_seq`; entries for positions `< seq_lens[b]` must be valid
//!   block indices, the rest are never read.
//! - `seq_lens`: `[B]` i32, the context length including the new tokens
//!   (`seq_lens[b] >= q_len_b`; otherwise the first rows sit at negative
//!   positions, and causal rows there see no key and are written as zeros).
//!   `cu_seqlens_q`: `[B + 1]` i32, non-decreasing, `cu_seqlens_q[0] = 0`.
//!   `q_len_b = 0` is allowed (the sequence is skipped).
//! - The grid's first extent must be at least `cdiv(max_b q_len_b, BLOCK_M)`
//!   ([`grid`]); its second is exactly `B * H_Q` (at most 65535, the CUDA
//!   limit of the second grid extent).
//! - `scale`: the softmax scale, usually `1 / sqrt(HEAD_DIM)` (any finite value).
//! - Offsets are 32-bit: `total_q * H_Q * HEAD_DIM < 2^31` and
//!   `num_blocks * PAGE * H_KV * HEAD_DIM < 2^31`.
//!
//! # Constexprs
//!
//! - `T: Float`: storage dtype of Q, the caches and O (f32, bf16, f16).
//! - `H_Q`, `H_KV`: head counts, `H_Q` a multiple of `H_KV` (GQA; `H_Q = H_KV`
//!   is multi-head attention).
//! - `HEAD_DIM`: a power of two (64 or 128).
//! - `PAGE`: tokens per KV-cache block, a power of two (the runtime's 16, 32
//!   or 64).
//! - `BLOCK_M`, `BLOCK_N`: the query and key tile heights (powers of two);
//!   [`config_for`] picks them with the warp count.
//! - `CAUSAL`: causal or full attention.
//! - `BOXES`: unmasked key blocks inside one page as `load_block` boxes
//!   (TMA on sm_90a; [`config_for`] sets it with `wgmma`). On `cp.async`
//!   targets the boxes' bounds masks cost registers that the plain loads
//!   do not.

use crate::kv_cache::{kv_load, kv_tile, kv8_tile};
use dsl_macros::{kernel, kernel_fn};

/// One key block of the online softmax (FlashAttention-2), shared by the
/// prefill and the tensor-core decode kernels: with the block's scores `s`
/// (`[M, N]`) and the scale `c >= 0` that takes them to the log2 domain, its
/// values `v` (`[N, D]`) and the running max `m` (log2 domain), sum `l`
/// (`[M]`) and accumulator `acc` (`[M, D]`), returns the updated
/// `(m, l, acc)`; `p` is rounded to `dt` before `p . v`.
///
/// A non-negative scale commutes with the row max, so scores are never
/// scaled on their own: the max is taken on `s` and scaled per row, and each
/// score's exponent is one `fma` (`s * c - m`), as FlashAttention-2 does.
///
/// With `exact` (the batch-invariant mode) each block's softmax is computed
/// on its own ([`block_softmax`]) and folded into the running state
/// ([`softmax_fold`]): the bits of a row's result then depend only on its
/// keys and the key block, not on how a kernel splits its key loop or
/// which program computes which block. Otherwise the FlashAttention-2
/// update `l * alpha + sum(p)`, `acc * alpha + p . v`, whose row sum the
/// codegen may keep per lane across a loop (`codegen`'s partial row sums:
/// faster, but the rounding follows the loop's extent).
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn online_softmax_step(
    s: Tensor,
    qk_scale: Tensor,
    v: Tensor,
    m: Tensor,
    l: Tensor,
    acc: Tensor,
    dt: dsl_core::DType,
    exact: bool,
) -> (Tensor, Tensor, Tensor) {
    if exact {
        let (mb, lb, ob) = block_softmax(s, qk_scale, v, dt);
        softmax_fold(m, l, acc, mb, lb, ob)
    } else {
        let (m_new, p) = softmax_weights(s, qk_scale, m);
        softmax_update(p, m, m_new, l, v, acc, dt)
    }
}

/// One key block's softmax on its own (the batch-invariant mode): with the
/// block's scores `s`, the log2-domain scale `c >= 0` and its values `v`,
/// the block's row max `mb = c * rowmax(s)`, its weights `p = exp2(s * c -
/// mb)`, their row sum `lb` and `ob = round_dt(p) . v` from a zero
/// accumulator. Nothing in it depends on the other blocks, so any program
/// can compute any block's partial; [`softmax_fold`] takes the partials in
/// key order.
#[kernel_fn]
pub fn block_softmax(
    s: Tensor,
    qk_scale: Tensor,
    v: Tensor,
    dt: dsl_core::DType,
) -> (Tensor, Tensor, Tensor) {
    let mb = max(s, 1) * qk_scale;
    let p = exp2(fma(s, qk_scale, -expand_dims(mb, 1)));
    (mb, fixed_row_sum(p), dot(p.to(dt), v))
}

/// The units of [`fixed_row_sum`] in one: `2^23`.
pub const FIXED_ONE: i32 = 1 << 23;

/// The most columns [`fixed_row_sum`] takes: their units sum below `2^31`
/// (weights up to `1 + 2^-22`, see there).
pub const FIXED_SUM_COLS: usize = 128;

/// The row sums of the weights `p` (`[M, N]`, each in `[0, 1 + 2^-22]`,
/// `N <= FIXED_SUM_COLS`) in fixed point: `fadd(p, 1)` rounds `p` to a
/// multiple of `2^-23` (round to nearest even, as `1 + p` lies in `[1, 2]`),
/// the difference of its bits from those of `1.0` is that multiple as an
/// integer, and the integers' row sum, exact in any order, is scaled back
/// by `2^-23` (its conversion to f32 rounds to nearest even once). A weight
/// below `2^-24` counts as zero; the row's largest weight is about 1, so
/// the sum's error stays within `N * 2^-24` of it, as a float sum's does.
/// (The weights are `exp2` of a non-positive exponent up to the rounding of
/// the max's own product, so at most `1 + 2^-23`.)
#[kernel_fn]
pub fn fixed_row_sum(p: Tensor) -> Tensor {
    let units = bitcast(p + 1.0, dsl_core::DType::I32) - FIXED_ONE * 127;
    sum(units, 1).to(f32) * (1.0 / FIXED_ONE as f32)
}

/// [`block_softmax`] where only the keys with `seen` true (`[M, N]`,
/// broadcastable) count: the row max over the seen scores (the lowest
/// finite f32 elsewhere, times `c`), the unseen weights zero. Where `seen`
/// is true everywhere this is [`block_softmax`] bit for bit.
#[kernel_fn]
pub fn block_softmax_masked(
    s: Tensor,
    seen: Tensor,
    qk_scale: Tensor,
    v: Tensor,
    dt: dsl_core::DType,
) -> (Tensor, Tensor, Tensor) {
    let mb = max(where_(seen, s, f32::MIN), 1) * qk_scale;
    let p = where_(seen, exp2(fma(s, qk_scale, -expand_dims(mb, 1))), 0.0);
    (mb, fixed_row_sum(p), dot(p.to(dt), v))
}

/// The running max `m`, sum `l` and accumulator `acc` after the partial
/// `(mb, lb, ob)` of the next key block ([`block_softmax`]):
///
/// ```text
/// m' = max(m, mb), a = exp2(m - m'), b = exp2(mb - m')
/// l' = fma(l, a, lb * b), acc' = fma(acc, a, ob * b)
/// ```
///
/// Every operation is elementwise and explicit (no sum the codegen could
/// reassociate), so the state after folding blocks `0..n` from `(lowest
/// finite f32, 0, 0)` has the same bits whether one program folds them
/// as it goes or another folds partials that programs stored.
#[kernel_fn]
pub fn softmax_fold(
    m: Tensor,
    l: Tensor,
    acc: Tensor,
    mb: Tensor,
    lb: Tensor,
    ob: Tensor,
) -> (Tensor, Tensor, Tensor) {
    let m_new = maximum(m, mb);
    let a = exp2(m - m_new);
    let b = exp2(mb - m_new);
    (m_new, fma(l, a, lb * b), fma(acc, expand_dims(a, 1), ob * expand_dims(b, 1)))
}

/// The running max `m_new` after a block of scores `s` (running max `m`
/// before it) and the block's weights `exp2(s * qk_scale - m_new)`: the
/// first half of [`online_softmax_step`].
#[kernel_fn]
pub fn softmax_weights(s: Tensor, qk_scale: Tensor, m: Tensor) -> (Tensor, Tensor) {
    let m_new = maximum(m, max(s, 1) * qk_scale);
    (m_new, exp2(fma(s, qk_scale, -expand_dims(m_new, 1))))
}

/// [`online_softmax_step`] on a block where only the keys with `seen` true
/// (`[M, N]`, broadcastable) count.
///
/// With `exact` (the batch-invariant mode) the block's partial is
/// [`block_softmax_masked`]'s: where `seen` is true everywhere this computes
/// exactly what [`online_softmax_step`] does, bit for bit, so a row's result
/// does not depend on whether a kernel visits a block with or without masks.
/// Otherwise the scores are scaled first and the unseen ones set to `-inf`
/// (`-inf * c` would be NaN for `c = 0`), then the step runs with `c = 1`:
/// fewer registers live in the masked loop, but the exponent's rounding
/// differs from the unmasked step's.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn online_softmax_step_masked(
    s: Tensor,
    seen: Tensor,
    qk_scale: Tensor,
    v: Tensor,
    m: Tensor,
    l: Tensor,
    acc: Tensor,
    dt: dsl_core::DType,
    exact: bool,
) -> (Tensor, Tensor, Tensor) {
    if exact {
        let (mb, lb, ob) = block_softmax_masked(s, seen, qk_scale, v, dt);
        softmax_fold(m, l, acc, mb, lb, ob)
    } else {
        let t = where_(seen, s * qk_scale, f32::NEG_INFINITY);
        online_softmax_step(t, constant(1.0, f32), v, m, l, acc, dt, exact)
    }
}

/// The running sum and accumulator after a block of weights `p` whose max
/// moved from `m` to `m_new` (FlashAttention-2, outside the batch-invariant
/// mode; see [`online_softmax_step`]).
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn softmax_update(
    p: Tensor,
    m: Tensor,
    m_new: Tensor,
    l: Tensor,
    v: Tensor,
    acc: Tensor,
    dt: dsl_core::DType,
) -> (Tensor, Tensor, Tensor) {
    let alpha = exp2(m - m_new);
    (m_new, l * alpha + sum(p, 1), dot(p.to(dt), v, acc * expand_dims(alpha, 1)))
}

/// FlashAttention prefill (online softmax, f32 accumulation) over a paged KV
/// cache, varlen batches, GQA, causal or full; see the module doc.
// Autotune candidates: 16 or 32 query rows per warp. 128-row tiles of 4
// warps (32 rows per warp) run `mma.sync` on every target (`wgmma` needs
// 16 rows per warp): they are the `mma.sync` defaults, and on sm_90a they
// lose to the `wgmma` tiles. Every candidate names its occupancy hint (a
// base config's would carry over).
#[kernel(autotune(
    configs = [
        (BLOCK_M = 64, BLOCK_N = 32, num_warps = 4, min_programs_per_sm = 0),
        (BLOCK_M = 64, BLOCK_N = 64, num_warps = 4, min_programs_per_sm = 0),
        (BLOCK_M = 128, BLOCK_N = 32, num_warps = 8, min_programs_per_sm = 0),
        (BLOCK_M = 128, BLOCK_N = 64, num_warps = 8, min_programs_per_sm = 0),
        (BLOCK_M = 64, BLOCK_N = 32, num_warps = 8, min_programs_per_sm = 0),
        (BLOCK_M = 64, BLOCK_N = 128, num_warps = 4, min_programs_per_sm = 0),
        (BLOCK_M = 64, BLOCK_N = 128, num_warps = 4, min_programs_per_sm = 3),
        (BLOCK_M = 64, BLOCK_N = 64, num_warps = 4, num_stages = 3, min_programs_per_sm = 0),
        (BLOCK_M = 128, BLOCK_N = 128, num_warps = 8, min_programs_per_sm = 0),
        (BLOCK_M = 128, BLOCK_N = 32, num_warps = 4, min_programs_per_sm = 0),
        (BLOCK_M = 128, BLOCK_N = 64, num_warps = 4, min_programs_per_sm = 0),
    ],
    key = [max_blocks_per_seq]
))]
#[allow(clippy::too_many_arguments)]
pub fn flash_attention<T: Float>(
    q_ptr: Ptr<T>,
    k_cache_ptr: Ptr<T>,
    v_cache_ptr: Ptr<T>,
    o_ptr: Ptr<T>,
    block_tables_ptr: Ptr<i32>,
    seq_lens_ptr: Ptr<i32>,
    cu_seqlens_q_ptr: Ptr<i32>,
    scale: f32,
    max_blocks_per_seq: i32,
    #[constexpr] H_Q: usize,
    #[constexpr] H_KV: usize,
    #[constexpr] HEAD_DIM: usize,
    #[constexpr] PAGE: usize,
    #[constexpr] BLOCK_M: usize,
    #[constexpr] BLOCK_N: usize,
    #[constexpr] CAUSAL: bool,
    #[constexpr] BOXES: bool,
    #[constexpr] INVARIANT: bool,
    #[constexpr] KV8: bool,
) {
    static_assert(H_Q % H_KV == 0, "H_Q must be a multiple of H_KV");
    static_assert(!(BOXES && KV8), "an FP8 KV cache is read with plain loads (BOXES off)");
    static_assert(PAGE.is_power_of_two(), "PAGE must be a power of two");
    static_assert(
        !INVARIANT || BLOCK_N <= FIXED_SUM_COLS,
        "the batch-invariant softmax takes key blocks of at most 128",
    );
    // Programmatic dependent launch (sm_90): every input may come from the
    // previous kernel, so wait first; then let the next kernel start early.
    gdc_wait();
    gdc_launch_dependents();
    let group = H_Q / H_KV;
    // Causal programs are visited heaviest first (the last query block
    // sees the most keys), so the light ones fill the last wave.
    let mut pid_m = program_id(0);
    if CAUSAL {
        pid_m = num_programs(0) - 1 - pid_m;
    }
    let bh = program_id(1);
    let b = bh / H_Q;
    let h = bh % H_Q;
    let kvh = h / group;
    let q_start = load(cu_seqlens_q_ptr + b);
    let q_len = load(cu_seqlens_q_ptr + b + 1) - q_start;
    let ctx = load(seq_lens_ptr + b);
    let first = pid_m * BLOCK_M;
    if first < q_len {
        let prefix = ctx - q_len;
        let offs_m = first + arange(0, BLOCK_M);
        let offs_n = arange(0, BLOCK_N);
        let offs_d = expand_dims(arange(0, HEAD_DIM), 0);
        let row_valid = offs_m < q_len;
        let q_row = expand_dims((q_start + offs_m) * (H_Q * HEAD_DIM), 1) + h * HEAD_DIM + offs_d;
        let q = load(q_ptr + q_row, mask = expand_dims(row_valid, 1), other = 0.0);
        // |scale| * log2(e): the softmax runs on exp2 with a non-negative
        // scale (`online_softmax_step`); a negative one negates `q` instead
        // (exact), once.
        let q = where_(scale < 0.0, -q, q);
        let qk_scale = abs(scale) * 1.442_695_040_888_963_4;
        let table = block_tables_ptr + b * max_blocks_per_seq;
        let head = kvh * HEAD_DIM + offs_d;
        // Key index of every element of a K/V tile (`[BLOCK_N, HEAD_DIM]`),
        // broadcast once here: inside the loops the page lookup and the row
        // offsets are elementwise on the tile (a repeated address is loaded
        // once per thread chunk), so no per-block exchange between threads.
        let keys2 = broadcast_to(expand_dims(offs_n, 1), [BLOCK_N, HEAD_DIM]);
        let head2 = broadcast_to(head, [BLOCK_N, HEAD_DIM]);
        // Keys are never negative: page and offset by shift and mask.
        let page_shift = PAGE.trailing_zeros() as i32;
        let page_mask = PAGE as i32 - 1;

        // Lowest finite f32, not -inf: exp2(m - m_new) stays defined (1)
        // while every key seen so far is masked.
        let mut m_i = full([BLOCK_M], f32::MIN, f32);
        let mut l_i = zeros([BLOCK_M], f32);
        let mut acc = zeros([BLOCK_M, HEAD_DIM], f32);

        // Key range: [0, lo) is seen by every row (no mask), [lo, hi) needs masks.
        let mut lo = (ctx / BLOCK_N) * BLOCK_N;
        let mut hi = ctx;
        if CAUSAL {
            let first_pos = prefix + first;
            let last_pos = prefix + minimum(q_len, first + BLOCK_M) - 1;
            lo = maximum(((first_pos + 1) / BLOCK_N) * BLOCK_N, 0);
            hi = minimum(ctx, last_pos + 1);
        }

        // 1. Unmasked key blocks. When a page holds whole key blocks, each
        // block is `BLOCK_N` consecutive rows of one page (one page lookup
        // per block): with `BOXES` a `load_block` box of the cache, which
        // the codegen copies with TMA on sm_90a; otherwise plain loads at
        // the block's row plus offsets fixed for the whole loop (no per-key
        // lookup, no masks).
        if PAGE % BLOCK_N == 0 {
            let kv_cols = (H_KV * HEAD_DIM) as i32;
            let kv_rows = i32::MAX / kv_cols;
            let col0 = kvh * HEAD_DIM;
            let offs = keys2 * (H_KV * HEAD_DIM) + head2;
            for n0 in range(0, lo, BLOCK_N) {
                let page = load(table + (n0 >> page_shift));
                let row0 = (page << page_shift) + (n0 & page_mask);
                let k = if BOXES {
                    load_block(k_cache_ptr, kv_rows, kv_cols, kv_cols, row0, col0, [BLOCK_N, HEAD_DIM])
                } else if KV8 {
                    kv8_tile(k_cache_ptr, row0 + keys2, head2, kvh, H_KV, HEAD_DIM, T)
                } else {
                    load(k_cache_ptr + row0 * kv_cols + offs)
                };
                let s = dot(q, trans(k));
                let v = if BOXES {
                    load_block(v_cache_ptr, kv_rows, kv_cols, kv_cols, row0, col0, [BLOCK_N, HEAD_DIM])
                } else if KV8 {
                    kv8_tile(v_cache_ptr, row0 + keys2, head2, kvh, H_KV, HEAD_DIM, T)
                } else {
                    load(v_cache_ptr + row0 * kv_cols + offs)
                };
                let (m_new, l_new, acc_new) =
                    online_softmax_step(s, qk_scale, v, m_i, l_i, acc, T, INVARIANT);
                m_i = m_new;
                l_i = l_new;
                acc = acc_new;
            }
        } else {
            for n0 in range(0, lo, BLOCK_N) {
                let key = n0 + keys2;
                let page = load(table + (key >> page_shift));
                let slot = (page << page_shift) + (key & page_mask);
                let kv = slot * (H_KV * HEAD_DIM) + head2;
                let k = kv_tile(k_cache_ptr, kv, slot, head2, kvh, KV8, H_KV, HEAD_DIM, T);
                let s = dot(q, trans(k));
                let v = kv_tile(v_cache_ptr, kv, slot, head2, kvh, KV8, H_KV, HEAD_DIM, T);
                let (m_new, l_new, acc_new) =
                    online_softmax_step(s, qk_scale, v, m_i, l_i, acc, T, INVARIANT);
                m_i = m_new;
                l_i = l_new;
                acc = acc_new;
            }
        }

        // 2. Boundary (and, when causal, diagonal) key blocks, masked.
        let pos = expand_dims(prefix + offs_m, 1);
        for n0 in range(lo, hi, BLOCK_N) {
            let key = n0 + offs_n;
            let in_ctx = key < hi;
            let key2 = n0 + keys2;
            let kv_mask = key2 < hi;
            let page = load(table + key2 / PAGE, mask = kv_mask, other = 0);
            let slot = page * PAGE + key2 % PAGE;
            let kv = slot * (H_KV * HEAD_DIM) + head2;
            let k = kv_load(k_cache_ptr, kv, slot, head2, kvh, kv_mask, KV8, H_KV, HEAD_DIM, T);
            let s = dot(q, trans(k));
            let mut seen = expand_dims(in_ctx, 0);
            if CAUSAL {
                seen = seen && expand_dims(key, 0) <= pos;
            }
            let v = kv_load(v_cache_ptr, kv, slot, head2, kvh, kv_mask, KV8, H_KV, HEAD_DIM, T);
            let (m_new, l_new, acc_new) =
                online_softmax_step_masked(s, seen, qk_scale, v, m_i, l_i, acc, T, INVARIANT);
            m_i = m_new;
            l_i = l_new;
            acc = acc_new;
        }

        // One reciprocal per row; a row that saw no key has l = 0 and is written as zeros.
        let inv = where_(l_i > 0.0, 1.0 / l_i, 0.0);
        let o = acc * expand_dims(inv, 1);
        // `q_row` and `row_valid` stay live across both loops (on sm_80 at
        // head dim 128 ptxas spills a few of them there, outside the loops):
        // addressing the output afresh from the tile's first row would free
        // them, but slows the 128 x 128 `wgmma` tile at head dim 128 down.
        store(o_ptr + q_row, o.to(T), mask = expand_dims(row_valid, 1));
    }
}

/// A launch configuration: query tile, key tile, warps and pipeline depth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileConfig {
    /// Query rows per program (`BLOCK_M`).
    pub block_m: usize,
    /// Keys per inner iteration (`BLOCK_N`).
    pub block_n: usize,
    /// Warps per program.
    pub num_warps: u32,
    /// K/V tiles in flight (`num_stages` of the `cp.async` pipeline).
    pub num_stages: u32,
    /// Occupancy hint: programs per SM that ptxas must leave registers for
    /// (`min_programs_per_sm`; 0: ptxas's choice).
    pub min_programs_per_sm: u32,
    /// Whether unmasked key blocks that fill part of one page are
    /// `load_block` boxes (`BOXES`: TMA copies on sm_90a) rather than plain
    /// loads at fixed offsets from the block's row.
    pub boxes: bool,
    /// The batch-invariant softmax (`INVARIANT`: each key block's softmax
    /// on its own, its row sum in fixed point, folded in key order; see
    /// [`online_softmax_step`]).
    pub invariant: bool,
    /// The caches are FP8 (`KV8`, [`crate::kv_cache`]); their blocks are
    /// then plain loads, never boxes.
    pub kv8: bool,
}

impl TileConfig {
    /// Query tile, key tile and warps, with the kernel's default two stages
    /// and no occupancy hint.
    pub const fn new(block_m: usize, block_n: usize, num_warps: u32) -> TileConfig {
        TileConfig {
            block_m,
            block_n,
            num_warps,
            num_stages: 2,
            min_programs_per_sm: 0,
            boxes: false,
            invariant: false,
            kv8: false,
        }
    }

    /// The kernel configuration with these tiles for the other constexprs.
    #[allow(clippy::too_many_arguments)]
    pub fn config(
        &self,
        dtype: dsl_core::DType,
        h_q: usize,
        h_kv: usize,
        head_dim: usize,
        page: usize,
        causal: bool,
    ) -> flash_attention::Config {
        flash_attention::Config::new(
            dtype,
            h_q,
            h_kv,
            head_dim,
            page,
            self.block_m,
            self.block_n,
            causal,
            self.boxes && !self.kv8,
            self.invariant,
            self.kv8,
        )
        .with_warps(self.num_warps)
        .with_stages(self.num_stages)
        .with_min_programs(self.min_programs_per_sm)
    }
}

/// The default tiles for storage dtype `dtype`, on Hopper's `wgmma` when
/// `wgmma`, over pages of `page` tokens (the measurements behind each
/// choice are in BENCHMARKS.md and the commits that made them). For
/// f16/bf16 (tensor cores): every warp holds 16 whole rows of
/// the scores, so `p` feeds the second product from registers, and the K
/// and V loads are pipelined with `cp.async` (and the page numbers one
/// iteration ahead of them).
///
/// - `mma.sync`: 128-row tiles of 4 warps, as FlashAttention-2 takes on
///   Hopper, with 64 keys at head dim 64 and 32 at 128 (the largest tiles
///   whose loops ptxas compiles without spills; at head dim 128 it spills
///   a few bytes outside them). Each warp owns 32 rows of the scores,
///   so every B fragment of `k` and `v` feeds two `mma`s (16-row warps read
///   as much shared memory per `mma` as the tensor cores can use). `q` then
///   resides in shared memory and is reloaded per key block (the codegen's
///   `dot::resident`): its fragments and tile would not fit in registers
///   beside 64 accumulator and 64 score registers (head dim 64) or 128 and 64
///   (head dim 128). At head dim 128 the 64-key tile spills the row sums in
///   its loop; the 32-key tile is the default over every page size. Shared memory:
///   51 KB at head dim 64, 70 KB at 128 (an sm_86 block holds 99 KB; 128 x
///   128 of 8 warps needs 166 KB, an A100's whole block).
/// - `wgmma` (sm_90a): one warpgroup of 4 warps, 64 query rows; the B
///   operands are read from shared memory by the tensor cores, so a wider
///   key tile costs no fragment registers. Head dim 64: 128 keys with
///   registers for three programs per SM (`min_programs_per_sm = 3`: ptxas
///   on its own takes a few registers more than three programs allow and
///   fits two): per key, half the loop overhead of the 64-key tile (the
///   rescale of `acc`, barriers, descriptors). Head dim 128: 64 keys
///   (`m64n64k16` scores; 128 keys need more than 255 registers).
/// - `wgmma` over pages that hold whole key blocks (the unmasked blocks are
///   TMA boxes, see the module doc): head dim 128 over pages of 128 takes
///   128 x 128 tiles of 8 warps (255 registers, no spill without the
///   gather's addresses; one program per SM, its two warpgroups drifting
///   apart without a CTA barrier), faster than 64 x 64 over small pages.
///   Head dim 64 keeps 64 x 128 at three programs per SM over pages of
///   128. Over pages of 64 (boxes of 64 keys, not 128) head dim 64 takes
///   64 x 64, and head dim 128 keeps 64 x 64.
///
/// For f32 (`dot` by FMAs through shared memory) `64 x 32` with 4 warps at
/// head dim 64 and 8 above.
pub fn config_for(head_dim: usize, dtype: dsl_core::DType, wgmma: bool, page: usize) -> TileConfig {
    let half = matches!(dtype, dsl_core::DType::F16 | dsl_core::DType::BF16);
    let boxes = |block_n: usize| page.is_multiple_of(block_n);
    let t = match (half, wgmma, head_dim <= 64) {
        (true, true, true) if !boxes(128) && boxes(64) => TileConfig::new(64, 64, 4),
        (true, true, true) => TileConfig { min_programs_per_sm: 3, ..TileConfig::new(64, 128, 4) },
        (true, true, false) if boxes(128) => TileConfig::new(128, 128, 8),
        (true, true, false) => TileConfig::new(64, 64, 4),
        (true, false, true) => TileConfig::new(128, 64, 4),
        (true, false, false) => TileConfig::new(128, 32, 4),
        (false, _, true) => TileConfig::new(64, 32, 4),
        (false, _, false) => TileConfig::new(64, 32, 8),
    };
    TileConfig { boxes: half && wgmma, ..t }
}

/// The launch grid for a batch whose longest query run is `max_q_len` tokens:
/// `[cdiv(max_q_len, block_m), batch * h_q, 1]`.
pub fn grid(max_q_len: usize, batch: usize, h_q: usize, block_m: usize) -> [u32; 3] {
    [max_q_len.div_ceil(block_m).max(1) as u32, (batch * h_q) as u32, 1]
}
