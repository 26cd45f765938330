//! Paged decode attention: one query token per sequence against its whole
//! context in the paged KV cache, all query heads of one KV head in one
//! program (GQA grouping), optionally split over the context with a second
//! kernel that merges the splits (split-KV, "flash decoding"). Two kernels
//! compute it: [`paged_decode`] (per-lane online-softmax streams, any dtype)
//! and [`paged_decode_tc`] (tensor cores, bf16/f16).
//!
//! # Math
//!
//! For sequence `b`, KV head `h` and its `GROUP` query heads `g` (query head
//! `h * GROUP + g`), with `t_j = (q_g . k_j) * scale * log2(e)` over the
//! context positions `j < ctx_b`:
//!
//! ```text
//! o_g = sum_j exp2(t_j - max_j t_j) v_j  /  sum_j exp2(t_j - max_j t_j)
//! ```
//!
//! Scores and accumulators are f32; K, V, Q and the output are `T`.
//!
//! # Tiling
//!
//! Grid `[B, H_KV, splits]`. Program `(b, h, s)` covers the positions
//! `[s * split_len, min(ctx_b, (s + 1) * split_len))` in chunks of `BLOCK_N`
//! tokens. Q (`[GROUP, HEAD_DIM]`, kept in `T`) is broadcast once to
//! `[GROUP, BLOCK_N, HEAD_DIM]`; per chunk the K and V tiles
//! `[BLOCK_N, HEAD_DIM]` are gathered through the block table (one row per
//! token, contiguous `HEAD_DIM`), the scores `[GROUP, BLOCK_N]` are one
//! row-wise reduction over `HEAD_DIM`, and V is accumulated *elementwise* into
//! `acc[GROUP, BLOCK_N, HEAD_DIM]`: every `(g, n)` lane is its own online
//! softmax stream over the positions `n, n + BLOCK_N, ...` with its own running
//! max `m[g, n]` and sum `l[g, n]`. No reduction over tokens happens inside
//! the loop (the broadcasts of `alpha` and `p` along `HEAD_DIM` are the only
//! data exchange); after the loop the `BLOCK_N` streams are merged exactly:
//! `M = max_n m[g, n]`, `w = exp2(m - M)`, `l = sum_n w l`, `o = sum_n w acc`.
//!
//! With `SPLIT = false` the program writes `o / l` to `out` (grid `[B, H_KV,
//! 1]`, `split_len >= ctx`). With `SPLIT = true` it writes the unnormalized
//! `o`, `M` and `l` of its split to the partial buffers and
//! [`paged_decode_reduce`] merges the `cdiv(ctx_b, split_len)` valid splits
//! of each query head the same way.
//!
//! # Pipelining
//!
//! The loop is software-pipelined by hand: while chunk `i` is computed, the
//! K/V loads of chunk `i + 1` are in flight (issued at the top of the
//! iteration, consumed one iteration later), chunk `i + 2`'s row offsets are
//! formed from page numbers loaded one iteration earlier, and the page
//! numbers of chunk `i + 3` are loaded. Loads past the end are masked off, so
//! no memory beyond the context (or the block table row) is touched. Without
//! this, every chunk waits for two dependent global loads (block table, then
//! K/V) with nothing else to do.
//!
//! The running maxima are updated lazily: a chunk rescales `acc` and `l`
//! only when one of its scores exceeds its stream's max by more than
//! `RESCALE_LOG2` (`2^8`); other chunks add weights `exp2(t - m) <= 2^8`
//! against the stale max. The result is the same softmax (the merge uses the
//! max every stream was scaled with); the saving is the per-chunk
//! `acc * alpha` and its broadcast once the maxima settle.
//!
//! Running maxima start at the lowest finite f32 and masked scores are `-inf`,
//! so `exp2(m - m_new)` is always defined; a stream that never saw a valid
//! token gets weight 0 in the merge; a context of length 0 gives zeros.
//!
//! # Tensor cores ([`paged_decode_tc`], bf16/f16)
//!
//! The same function computed as FlashAttention does (see
//! [`crate::flash_attention`]), with the same arguments and partials: the
//! `GROUP` query rows are padded with zero rows to `ROWS = max(16, GROUP)` (a
//! tensor-core tile height), so each block of `BLOCK_N` keys is two `dot`s,
//! `[ROWS, HEAD_DIM] x [HEAD_DIM, BLOCK_N]` for the scores and `[ROWS,
//! BLOCK_N] x [BLOCK_N, HEAD_DIM]` for the values (`mma.sync`; the padding
//! rows cost tensor-core time only, the kernel is bound by reading K and V),
//! with one running max and sum per query head and `p` rounded to `T` before
//! the second product. The page lookup and row offsets are computed on the
//! `[BLOCK_N, HEAD_DIM]` K/V tile itself, so every access is a 16-byte
//! vector and the loads of whole key blocks are pipelined `num_stages` deep
//! with `cp.async` by the codegen (their addresses depend only on the loop
//! index; the stages are XOR-swizzled, and the copies bypass L1: the K/V
//! rows are read once per program, so `cache_modifier = ".ca"` would only
//! evict what L1 holds for others). The last, partial key block runs in a
//! second loop with masks; in the batch-invariant mode, whose masked step
//! computes a whole block bit for bit as the unmasked one does, every block
//! runs in that loop, so the partial block's copies go out with the others
//! instead of after the whole blocks. There each block's softmax is
//! computed on its own and folded into the running state
//! ([`crate::flash_attention::softmax_fold`]), so a caller may compute
//! the blocks of one row in several programs: with `split_mode` and
//! `split_len = BLOCK_N` the body stores its one block's partial as it is,
//! and [`fold_blocks`] folds the stored partials in key order into the
//! bits the unsplit body writes (the persistent decode step does this).
//! Tensor cores need `BLOCK_N` to be a multiple of `8 * num_warps` (other
//! configs run, with `dot` on FMAs). f32 caches use [`paged_decode`].
//!
//! # The FP8 cache outside the batch-invariant mode
//!
//! On an FP8 cache ([`crate::kv_cache`]) the batch-invariant step reads
//! `T(code * scale)` as every other reader does. The fast step runs its
//! products in f16 instead, which more than halves the work of widening
//! the codes (the kernel's largest cost, above the bytes it reads): each
//! pair of codes becomes f16 in one `cvt`, times its scale in one packed
//! f16 multiply ([`crate::kv_cache::kv8_load16`]). `q` goes in as f16 rows
//! scaled by powers of two ([`crate::kv_cache::f16_rows`]), undone on the
//! scores; the weights are rounded to `T` as in the 16-bit product, then
//! scaled by [`P16_SCALE`] into f16, undone on the output. Where every
//! slot's scale lies in `[2^-15, 2^7]` (row maxima from `2^-8` up to
//! `2^15`), no element of `q` is below `2^-31` of its row's largest (other
//! than zero) and no weight below `2^-31`, each operand holds exactly the
//! 16-bit product's value times a power of two. The tensor cores then
//! mostly give the bf16 cache's bits, but not always: their f16 and bf16
//! sums can differ in the last bit (`gpu-check` shows it on one partial
//! row in thousands). Outside that range a value is rounded in f16: by at
//! most `2^-25` for a slot's values, `2^-39` for a weight and `2^-39` of
//! its row's largest for an element of `q`, and a head whose values all
//! lie below `2^-17` reads as zero. All of it stays far below E4M3's own
//! rounding (`2^-4` of a value); `gpu-check` bounds the difference from
//! the bf16 cache's result. Scales above `2^7` (values from `2^15` up)
//! overflow f16.
//!
//! # Layout contract
//!
//! - `q`: `[B, H_KV * GROUP * HEAD_DIM]` in `T` (RoPE already applied), query
//!   head `h * GROUP + g` at columns `(h * GROUP + g) * HEAD_DIM ..`.
//! - `k_cache`, `v_cache`: `[num_blocks, PAGE, H_KV, HEAD_DIM]` in `T` (the
//!   layout `rope_kv_write` fills); the cache must have fewer than 2^31
//!   elements (32-bit offsets).
//! - `block_tables`: `[B, bt_stride]` i32, page `i` of sequence `b` at
//!   `b * bt_stride + i`; only the first `cdiv(ctx_b, PAGE)` entries are read.
//! - `seq_lens`: `[B]` i32 context lengths (including the current token,
//!   whose K/V must already be in the cache).
//! - `out`: `[B, H_KV * GROUP * HEAD_DIM]` in `T`.
//! - Partials (split mode): `part_o` `[B, H_KV, max_splits, GROUP, HEAD_DIM]`,
//!   `part_m` and `part_l` `[B, H_KV, max_splits, GROUP]`, all f32, with
//!   `max_splits` = the grid's third extent >= `cdiv(max ctx, split_len)`.
//! - `split_len` is a positive multiple of `BLOCK_N`.
//!
//! # Constexprs
//!
//! `H_KV` (KV heads), `GROUP` (query heads per KV head, any positive value;
//! padded to a power of two and masked), `HEAD_DIM` (power of two, 64 or 128),
//! `PAGE` (tokens per cache block, a power of two: 16, 32 or 64), `BLOCK_N`
//! (tokens per chunk, a power of two), `SPLIT`; `T` is f32, bf16 or f16.

use crate::flash_attention::{
    FIXED_SUM_COLS, block_softmax_masked, online_softmax_step, online_softmax_step_masked, softmax_fold,
    softmax_weights,
};
use crate::kv_cache::{f16_rows, kv_load, kv_tile, kv8_load16};
use dsl_core::DType;
use dsl_macros::{kernel, kernel_fn};

/// `log2(e)`: folded into the query scale so the softmax uses `exp2`.
pub const LOG2E: f32 = std::f32::consts::LOG2_E;

/// The lazy-rescaling threshold (log2 domain): weights up to `2^8` are summed
/// against a stale running max.
pub const RESCALE_LOG2: f32 = 8.0;

/// Attention of one decode token per sequence over its paged context; see
/// the module doc.
#[kernel(autotune(
    configs = [(BLOCK_N = 16, num_warps = 4), (BLOCK_N = 16, num_warps = 8), (BLOCK_N = 32, num_warps = 8)],
    key = [split_len]
))]
#[allow(clippy::too_many_arguments)]
pub fn paged_decode<T: Float>(
    q_ptr: Ptr<T>,
    k_cache: Ptr<T>,
    v_cache: Ptr<T>,
    block_tables: Ptr<i32>,
    bt_stride: i32,
    seq_lens: Ptr<i32>,
    out_ptr: Ptr<T>,
    part_o: Ptr<f32>,
    part_m: Ptr<f32>,
    part_l: Ptr<f32>,
    scale: f32,
    split_len: i32,
    #[constexpr] H_KV: usize,
    #[constexpr] GROUP: usize,
    #[constexpr] HEAD_DIM: usize,
    #[constexpr] PAGE: usize,
    #[constexpr] BLOCK_N: usize,
    #[constexpr] SPLIT: bool,
) {
    // Programmatic dependent launch (sm_90): every input may come from the
    // previous kernel, so wait first; then let the next kernel start early.
    gdc_wait();
    gdc_launch_dependents();
    let b = program_id(0);
    let h = program_id(1);
    let split = program_id(2);
    let ctx = load(seq_lens + b);
    let start = split * split_len;
    let end = minimum(ctx, start + split_len);

    let g = arange(0, GROUP);
    let d = expand_dims(arange(0, HEAD_DIM), 0);
    let n = arange(0, BLOCK_N);
    let q_off = expand_dims((b * (H_KV * GROUP) + h * GROUP + g) * HEAD_DIM, 1) + d;
    // Q stays in T (half the registers of f32); the scale is applied to the
    // f32 scores.
    let q3 = broadcast_to(expand_dims(load(q_ptr + q_off), 1), [GROUP, BLOCK_N, HEAD_DIM]);
    let qk_scale = scale * LOG2E;

    let mut m = full([GROUP, BLOCK_N], f32::MIN, f32);
    let mut l = zeros([GROUP, BLOCK_N], f32);
    let mut acc = zeros([GROUP, BLOCK_N, HEAD_DIM], f32);
    let bt = block_tables + b * bt_stride;
    // Software pipeline (see "Pipelining" in the module doc): at the top of
    // the iteration for chunk i, `kn`/`vn` hold chunk i's K/V tiles, `rows`
    // chunk i + 1's row offsets and `pages` chunk i + 2's page numbers.
    let pos0 = start + n;
    let pg0 = load(bt + pos0 / PAGE, mask = pos0 < end, other = 0);
    let r0 = where_(pos0 < end, ((pg0 * PAGE + pos0 % PAGE) * H_KV + h) * HEAD_DIM, -(HEAD_DIM as i32));
    let r0 = broadcast_to(expand_dims(r0, 1), [BLOCK_N, HEAD_DIM]);
    let mut kn = load(k_cache + r0 + d, mask = r0 >= 0, other = 0.0);
    let mut vn = load(v_cache + r0 + d, mask = r0 >= 0, other = 0.0);
    let pos1 = start + BLOCK_N + n;
    let pg1 = load(bt + pos1 / PAGE, mask = pos1 < end, other = 0);
    let r1 = where_(pos1 < end, ((pg1 * PAGE + pos1 % PAGE) * H_KV + h) * HEAD_DIM, -(HEAD_DIM as i32));
    let mut rows = broadcast_to(expand_dims(r1, 1), [BLOCK_N, HEAD_DIM]);
    let pos2 = start + 2 * BLOCK_N + n;
    let mut pages = load(bt + pos2 / PAGE, mask = pos2 < end, other = 0);
    for s0 in range(start, end, BLOCK_N) {
        let k = kn.to(f32);
        let v = vn.to(f32);
        // Issue the next chunk's K/V and the page numbers three chunks ahead
        // before this chunk's math, so their latency overlaps it.
        kn = load(k_cache + rows + d, mask = rows >= 0, other = 0.0);
        vn = load(v_cache + rows + d, mask = rows >= 0, other = 0.0);
        let pos2 = s0 + 2 * BLOCK_N + n;
        let r2 = where_(pos2 < end, ((pages * PAGE + pos2 % PAGE) * H_KV + h) * HEAD_DIM, -(HEAD_DIM as i32));
        rows = broadcast_to(expand_dims(r2, 1), [BLOCK_N, HEAD_DIM]);
        let pos3 = s0 + 3 * BLOCK_N + n;
        pages = load(bt + pos3 / PAGE, mask = pos3 < end, other = 0);

        let valid = s0 + n < end;
        let t = sum(q3.to(f32) * expand_dims(k, 0), 2) * qk_scale;
        let t = where_(expand_dims(valid, 0), t, f32::NEG_INFINITY);
        // Lazy rescaling: the running maxima move (and `acc`, `l` are
        // rescaled) only when some score exceeds its stream's max by more
        // than 2^8; otherwise p <= 2^8 is summed against the stale max,
        // which is exact math and saves the rescale of `acc` per chunk.
        let grow = max(max(t - m, 1), 0);
        if grow > RESCALE_LOG2 {
            let m_new = maximum(m, t);
            let alpha = exp2(m - m_new);
            l = l * alpha;
            acc = acc * expand_dims(alpha, 2);
            m = m_new;
        }
        let p = exp2(t - m);
        l = l + p;
        acc = acc + expand_dims(p, 2) * expand_dims(v, 0);
    }

    // Merge the BLOCK_N streams of every query head.
    let m_all = max(m, 1);
    let w = exp2(m - expand_dims(m_all, 1));
    let l_all = sum(l * w, 1);
    let o = sum(acc * expand_dims(w, 2), 1);
    if SPLIT {
        let row = ((b * H_KV + h) * num_programs(2) + split) * GROUP + g;
        store(part_m + row, m_all);
        store(part_l + row, l_all);
        store(part_o + expand_dims(row * HEAD_DIM, 1) + d, o);
    } else {
        let inv = where_(l_all > 0.0, 1.0 / l_all, 0.0);
        store(out_ptr + q_off, (o * expand_dims(inv, 1)).to(T));
    }
}

/// [`paged_decode`] on tensor cores (bf16/f16): the query rows padded to a
/// tile, each key block two `dot`s, K/V loads pipelined with `cp.async`; see
/// the module doc ("Tensor cores").
#[kernel(autotune(
    configs = [
        (BLOCK_N = 64, num_warps = 4, num_stages = 3),
        (BLOCK_N = 64, num_warps = 4, num_stages = 2),
        (BLOCK_N = 32, num_warps = 4, num_stages = 4),
        (BLOCK_N = 128, num_warps = 4, num_stages = 2),
        (BLOCK_N = 64, num_warps = 2, num_stages = 3),
        (BLOCK_N = 128, num_warps = 8, num_stages = 3),
        (BLOCK_N = 128, num_warps = 8, num_stages = 2),
        (BLOCK_N = 64, num_warps = 4, num_stages = 4),
        (BLOCK_N = 128, num_warps = 4, num_stages = 3),
        (BLOCK_N = 32, num_warps = 4, num_stages = 3),
        (BLOCK_N = 32, num_warps = 4, num_stages = 2),
        (BLOCK_N = 32, num_warps = 2, num_stages = 4),
        (BLOCK_N = 64, num_warps = 4, num_stages = 2, min_programs_per_sm = 3),
        (BLOCK_N = 32, num_warps = 4, num_stages = 2, min_programs_per_sm = 4),
    ],
    key = [split_len]
))]
#[allow(clippy::too_many_arguments)]
pub fn paged_decode_tc<T: Float>(
    q_ptr: Ptr<T>,
    k_cache: Ptr<T>,
    v_cache: Ptr<T>,
    block_tables: Ptr<i32>,
    bt_stride: i32,
    seq_lens: Ptr<i32>,
    out_ptr: Ptr<T>,
    part_o: Ptr<f32>,
    part_m: Ptr<f32>,
    part_l: Ptr<f32>,
    scale: f32,
    split_len: i32,
    #[constexpr] H_KV: usize,
    #[constexpr] GROUP: usize,
    #[constexpr] HEAD_DIM: usize,
    #[constexpr] PAGE: usize,
    #[constexpr] BLOCK_N: usize,
    #[constexpr] SPLIT: bool,
    #[constexpr] ROWS: usize,
    #[constexpr] INVARIANT: bool,
    #[constexpr] KV8: bool,
) {
    static_assert(ROWS >= GROUP, "ROWS must hold the query heads of a KV head");
    static_assert(!(SPLIT && INVARIANT), "the batch-invariant kernel folds its key blocks itself (no split)");
    gdc_wait();
    gdc_launch_dependents();
    decode_tc_body(
        q_ptr,
        k_cache,
        v_cache,
        block_tables,
        bt_stride,
        load(seq_lens + program_id(0)),
        out_ptr,
        part_o,
        part_m,
        part_l,
        scale,
        split_len,
        program_id(0),
        program_id(1),
        program_id(2),
        num_programs(2),
        T,
        H_KV,
        GROUP,
        HEAD_DIM,
        PAGE,
        BLOCK_N,
        SPLIT,
        ROWS,
        INVARIANT,
        KV8,
    );
}

/// The body of [`paged_decode_tc`] for sequence `b` (of `ctx` tokens), KV
/// head `h` and split `split_id` of `n_splits` (see the module doc).
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn decode_tc_body(
    q_ptr: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    bt_stride: Tensor,
    ctx: Tensor,
    out_ptr: Tensor,
    part_o: Tensor,
    part_m: Tensor,
    part_l: Tensor,
    scale: Tensor,
    split_len: Tensor,
    b: Tensor,
    h: Tensor,
    split_id: Tensor,
    n_splits: Tensor,
    dt: DType,
    h_kv: usize,
    group: usize,
    head_dim: usize,
    page_size: usize,
    block_n: usize,
    split_mode: bool,
    rows: usize,
    invariant: bool,
    kv8: bool,
) {
    static_assert(
        !invariant || block_n <= FIXED_SUM_COLS,
        "the batch-invariant softmax takes key blocks of at most 128",
    );
    let start = split_id * split_len;
    let end = minimum(ctx, start + split_len);
    // Whole key blocks first (no masks), then at most one partial block
    // (see the loops below).
    let full_end = start + maximum(end - start, 0) / block_n * block_n;

    let g = arange(0, rows);
    let d = arange(0, head_dim);
    let real = g < group;
    let q_off = expand_dims((b * (h_kv * group) + h * group + g) * head_dim, 1) + expand_dims(d, 0);
    let q = load(q_ptr + q_off, mask = expand_dims(real, 1), other = 0.0);
    // A non-negative scale for `online_softmax_step`: a negative one negates
    // `q` instead (exact), once.
    let q = where_(scale < 0.0, -q, q);
    let qk_scale = abs(scale) * LOG2E;
    // The FP8 reader outside the batch-invariant mode runs its products in
    // f16: codes widened and scaled in f16 (`kv8_load16`), `q` in f16 rows
    // scaled by powers of two, undone on the scores (see the module doc).
    let codes16 = kv8 && !invariant;
    let (q16, q_back) = if codes16 {
        let (q16, q_back) = f16_rows(q.to(f32));
        (q16, expand_dims(q_back, 1))
    } else {
        // Unused by the other readers.
        (q, q)
    };

    let bt = block_tables + b * bt_stride;
    // Key index and cache column of every element of a K/V tile.
    let keys = broadcast_to(expand_dims(arange(0, block_n), 1), [block_n, head_dim]);
    let col = broadcast_to(expand_dims(h * head_dim + d, 0), [block_n, head_dim]);

    let mut m = full([rows], f32::MIN, f32);
    let mut l = zeros([rows], f32);
    let mut acc = zeros([rows, head_dim], f32);
    // The batch-invariant step computes a whole block with masks exactly as
    // without them, so there every block, the partial last one included,
    // runs in the masked loop, whose K/V copies (and page numbers) are then
    // all issued ahead; otherwise the whole blocks run unmasked and the
    // partial one starts its loads after them.
    let tail_start = if invariant { start } else { full_end };
    if !invariant {
        for s0 in range(start, full_end, block_n) {
            let key = s0 + keys;
            let page = load(bt + key / page_size);
            let slot = page * page_size + key % page_size;
            let kv = slot * (h_kv * head_dim) + col;
            let (m_new, l_new, acc_new) = if codes16 {
                let k = kv8_load16(k_cache, slot, col, h, keys, false, h_kv, head_dim);
                let s = dot(q16, trans(k)) * q_back;
                let v = kv8_load16(v_cache, slot, col, h, keys, false, h_kv, head_dim);
                online_softmax_step_p16(s, qk_scale, v, m, l, acc, dt)
            } else {
                let k = kv_tile(k_cache, kv, slot, col, h, kv8, h_kv, head_dim, dt);
                let s = dot(q, trans(k));
                let v = kv_tile(v_cache, kv, slot, col, h, kv8, h_kv, head_dim, dt);
                online_softmax_step(s, qk_scale, v, m, l, acc, dt, invariant)
            };
            m = m_new;
            l = l_new;
            acc = acc_new;
        }
    }
    for s0 in range(tail_start, end, block_n) {
        let key = s0 + keys;
        let ok = key < end;
        let page = load(bt + key / page_size, mask = ok, other = 0);
        let slot = page * page_size + key % page_size;
        let kv = slot * (h_kv * head_dim) + col;
        let seen = expand_dims(s0 + arange(0, block_n) < end, 0);
        let (m_new, l_new, acc_new) = if codes16 {
            let k = kv8_load16(k_cache, slot, col, h, ok, true, h_kv, head_dim);
            let s = dot(q16, trans(k)) * q_back;
            let v = kv8_load16(v_cache, slot, col, h, ok, true, h_kv, head_dim);
            online_softmax_step_p16(
                where_(seen, s * qk_scale, f32::NEG_INFINITY),
                constant(1.0, f32),
                v,
                m,
                l,
                acc,
                dt,
            )
        } else {
            let k = kv_load(k_cache, kv, slot, col, h, ok, kv8, h_kv, head_dim, dt);
            let s = dot(q, trans(k));
            let v = kv_load(v_cache, kv, slot, col, h, ok, kv8, h_kv, head_dim, dt);
            if invariant && split_mode {
                // A split of the batch-invariant mode is one key block: its
                // own partial, which the caller folds with the others'.
                block_softmax_masked(s, seen, qk_scale, v, dt)
            } else {
                online_softmax_step_masked(s, seen, qk_scale, v, m, l, acc, dt, invariant)
            }
        };
        m = m_new;
        l = l_new;
        acc = acc_new;
    }

    // The f16 products summed `P16_SCALE` times the weights.
    let acc = if codes16 { acc * (1.0 / P16_SCALE) } else { acc };
    if split_mode {
        let row = ((b * h_kv + h) * n_splits + split_id) * group + g;
        store(part_m + row, m, mask = real);
        store(part_l + row, l, mask = real);
        store(part_o + expand_dims(row * head_dim, 1) + expand_dims(d, 0), acc, mask = expand_dims(real, 1));
    } else {
        let inv = where_(l > 0.0, 1.0 / l, 0.0);
        store(out_ptr + q_off, (acc * expand_dims(inv, 1)).to(dt), mask = expand_dims(real, 1));
    }
}

/// Folds the batch-invariant decode's key-block partials of sequence `b`
/// and KV head `h` in key order and writes `o / l` of its `group` query
/// heads to `out_ptr` in `dt`: bit for bit what [`decode_tc_body`] writes
/// unsplit. Block `j < n_blocks` is the partial [`decode_tc_body`] stores
/// with `split_mode` in the batch-invariant mode for split `j` of
/// `n_splits` with `split_len` one key block. The partials were written by
/// other programs of the launch (the caller orders them before this read),
/// so they are read past L1.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn fold_blocks(
    part_o: Tensor,
    part_m: Tensor,
    part_l: Tensor,
    out_ptr: Tensor,
    b: Tensor,
    h: Tensor,
    n_blocks: Tensor,
    n_splits: Tensor,
    dt: DType,
    h_kv: usize,
    group: usize,
    head_dim: usize,
) {
    let rows = group.next_power_of_two();
    let g = arange(0, rows);
    let real = g < group;
    let d = arange(0, head_dim);
    let base = (b * h_kv + h) * n_splits;
    let mut m = full([rows], f32::MIN, f32);
    let mut l = zeros([rows], f32);
    let mut acc = zeros([rows, head_dim], f32);
    // Four blocks a trip: their loads go out before the first fold.
    for j0 in range(0, n_blocks, 4) {
        let (j1, j2, j3) = (j0 + 1, j0 + 2, j0 + 3);
        let (mb0, lb0, ob0) = block_part(part_o, part_m, part_l, (base + j0) * group + g, real, head_dim);
        let (mb1, lb1, ob1) =
            block_part(part_o, part_m, part_l, (base + j1) * group + g, real & (j1 < n_blocks), head_dim);
        let (mb2, lb2, ob2) =
            block_part(part_o, part_m, part_l, (base + j2) * group + g, real & (j2 < n_blocks), head_dim);
        let (mb3, lb3, ob3) =
            block_part(part_o, part_m, part_l, (base + j3) * group + g, real & (j3 < n_blocks), head_dim);
        let (m0, l0, acc0) = softmax_fold(m, l, acc, mb0, lb0, ob0);
        let (m1, l1, acc1) = fold_if(j1 < n_blocks, m0, l0, acc0, mb1, lb1, ob1);
        let (m2, l2, acc2) = fold_if(j2 < n_blocks, m1, l1, acc1, mb2, lb2, ob2);
        let (m3, l3, acc3) = fold_if(j3 < n_blocks, m2, l2, acc2, mb3, lb3, ob3);
        m = m3;
        l = l3;
        acc = acc3;
    }
    let inv = where_(l > 0.0, 1.0 / l, 0.0);
    let out = expand_dims((b * (h_kv * group) + h * group + g) * head_dim, 1) + expand_dims(d, 0);
    store(out_ptr + out, (acc * expand_dims(inv, 1)).to(dt), mask = expand_dims(real, 1));
}

/// One key block's stored partial `(mb, lb, ob)` at partial rows `row`
/// (lanes `live`), read past L1 (see [`fold_blocks`]).
#[kernel_fn]
pub fn block_part(
    part_o: Tensor,
    part_m: Tensor,
    part_l: Tensor,
    row: Tensor,
    live: Tensor,
    head_dim: usize,
) -> (Tensor, Tensor, Tensor) {
    let d = expand_dims(arange(0, head_dim), 0);
    (
        load(part_m + row, mask = live, other = 0.0, cache_modifier = ".cg"),
        load(part_l + row, mask = live, other = 0.0, cache_modifier = ".cg"),
        load(
            part_o + expand_dims(row * head_dim, 1) + d,
            mask = expand_dims(live, 1),
            other = 0.0,
            cache_modifier = ".cg",
        ),
    )
}

/// [`softmax_fold`] where `live` holds; the state as it is elsewhere
/// (selected, not folded: folding an empty block would turn a -0.0 sum
/// into +0.0).
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn fold_if(
    live: Tensor,
    m: Tensor,
    l: Tensor,
    acc: Tensor,
    mb: Tensor,
    lb: Tensor,
    ob: Tensor,
) -> (Tensor, Tensor, Tensor) {
    let (m2, l2, acc2) = softmax_fold(m, l, acc, mb, lb, ob);
    (where_(live, m2, m), where_(live, l2, l), where_(live, acc2, acc))
}

/// The power of two the FP8 reader's f16 weights are scaled by: a weight
/// rounded to `T` is exact in f16 after the scaling from `2^-31` up (f16
/// holds 8 significant bits down to `2^-17`), and the largest, 1, stays
/// below f16's largest finite value.
pub const P16_SCALE: f32 = 16384.0;

/// [`online_softmax_step`] (outside the batch-invariant mode) on values
/// `v` in f16: the weights rounded to `dt` as there, then scaled by
/// [`P16_SCALE`] into f16 (exactly, see there), so the accumulator sums
/// `P16_SCALE` times what the 16-bit product would.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn online_softmax_step_p16(
    s: Tensor,
    qk_scale: Tensor,
    v: Tensor,
    m: Tensor,
    l: Tensor,
    acc: Tensor,
    dt: DType,
) -> (Tensor, Tensor, Tensor) {
    let (m_new, p) = softmax_weights(s, qk_scale, m);
    let alpha = exp2(m - m_new);
    let l_new = l * alpha + sum(p, 1);
    let p16 = (p.to(dt).to(f32) * P16_SCALE).to(f16);
    (m_new, l_new, dot(p16, v, acc * expand_dims(alpha, 1)))
}

/// Merges the split-KV partials of [`paged_decode`] or [`paged_decode_tc`]
/// (`SPLIT = true`) into the
/// output: one program per (sequence, query head), grid `[B, H_KV * GROUP]`;
/// `max_splits` is the decode launch's third grid extent.
#[kernel]
#[allow(clippy::too_many_arguments)]
pub fn paged_decode_reduce<T: Float>(
    part_o: Ptr<f32>,
    part_m: Ptr<f32>,
    part_l: Ptr<f32>,
    seq_lens: Ptr<i32>,
    out_ptr: Ptr<T>,
    split_len: i32,
    max_splits: i32,
    #[constexpr] GROUP: usize,
    #[constexpr] HEAD_DIM: usize,
) {
    gdc_wait();
    gdc_launch_dependents();
    let b = program_id(0);
    let hq = program_id(1);
    let h_kv = num_programs(1) / GROUP;
    let h = hq / GROUP;
    let g = hq % GROUP;
    let ctx = load(seq_lens + b);
    let splits = (ctx + split_len - 1) / split_len;
    let base = (b * h_kv + h) * max_splits * GROUP + g;
    let mut m = f32::MIN;
    for s in range(0, splits) {
        m = maximum(m, load(part_m + base + s * GROUP));
    }
    let d = arange(0, HEAD_DIM);
    let mut l = 0.0;
    let mut acc = zeros([HEAD_DIM], f32);
    for s in range(0, splits) {
        let row = base + s * GROUP;
        let w = exp2(load(part_m + row) - m);
        l = l + w * load(part_l + row);
        acc = acc + w * load(part_o + row * HEAD_DIM + d);
    }
    let inv = where_(l > 0.0, 1.0 / l, 0.0);
    store(out_ptr + (b * num_programs(1) + hq) * HEAD_DIM + d, (acc * inv).to(T));
}

/// The tile height of [`paged_decode_tc`] outside the batch-invariant
/// mode: the query heads of a KV head padded to 16 rows (one `mma.sync`
/// tile).
pub fn default_rows(group: usize) -> usize {
    group.max(16)
}

/// [`paged_decode_tc`]'s config outside the batch-invariant mode: tiles of
/// [`default_rows`] query rows.
pub fn tc_config(
    dtype: DType,
    h_kv: usize,
    group: usize,
    head_dim: usize,
    page: usize,
    block_n: usize,
    split: bool,
) -> paged_decode_tc::Config {
    paged_decode_tc::Config::new(
        dtype,
        h_kv,
        group,
        head_dim,
        page,
        block_n,
        split,
        default_rows(group),
        false,
        false,
    )
}

/// [`paged_decode_tc`]'s config on an FP8 cache outside the
/// batch-invariant mode ([`tc_config`]'s rows) for a launch of `programs`
/// programs (sequences x KV heads x splits) on `sms` multiprocessors. When
/// the launch is unsplit and fills the GPU twice over, every program walks
/// a whole sequence and the grid itself caps the programs per SM: blocks of
/// 32 keys, four warps and two stages, with registers for four programs per
/// SM. Otherwise (split launches, short contexts) blocks of 64 keys and two
/// stages, with registers for three programs per SM (`bench --only decode
/// --autotune` on peers.py's shapes, BENCHMARKS.md).
#[allow(clippy::too_many_arguments)]
pub fn kv8_tc_config(
    dtype: DType,
    h_kv: usize,
    group: usize,
    head_dim: usize,
    page: usize,
    split: bool,
    programs: usize,
    sms: usize,
) -> paged_decode_tc::Config {
    let wide = !split && programs >= 2 * sms;
    let (block_n, warps, stages, per_sm) = if wide { (32, 4, 2, 4) } else { (64, 4, 2, 3) };
    paged_decode_tc::Config { KV8: true, ..tc_config(dtype, h_kv, group, head_dim, page, block_n, split) }
        .with_warps(warps)
        .with_stages(stages)
        .with_min_programs(per_sm)
}

/// The split length (a multiple of `block_n`) and split count for a batch of
/// `batch` sequences of at most `max_ctx` tokens with `h_kv` KV heads on a GPU
/// with `sms` multiprocessors: no split when `batch * h_kv` programs already
/// fill the GPU about twice, else enough splits (each at least 256 tokens) to
/// reach that. (Aiming at more programs per multiprocessor splits more
/// batches, and the extra merge costs more than the idle tail of the last
/// wave it saves.)
pub fn split_plan(batch: usize, h_kv: usize, max_ctx: usize, sms: usize, block_n: usize) -> (usize, usize) {
    let programs = (batch * h_kv).max(1);
    let target = 2 * sms.max(1);
    let max_ctx = max_ctx.max(1);
    if programs >= target {
        let len = max_ctx.div_ceil(block_n) * block_n;
        return (len, 1);
    }
    let want = target.div_ceil(programs);
    let len = max_ctx.div_ceil(want).max(256);
    let len = len.div_ceil(block_n) * block_n;
    (len, max_ctx.div_ceil(len))
}

#[cfg(test)]
mod tests {
    use super::{kv8_tc_config, split_plan};
    use dsl_core::DType;

    #[test]
    fn kv8_decode_takes_small_blocks_only_where_its_grid_fills_the_gpu() {
        let tile = |split, programs| {
            let c = kv8_tc_config(DType::BF16, 8, 4, 128, 16, split, programs, 132);
            (c.BLOCK_N, c.num_warps, c.num_stages, c.min_programs_per_sm, c.KV8)
        };
        // B64 x 8 KV heads, unsplit: every program walks a whole sequence,
        // about four programs per SM.
        assert_eq!(tile(false, 512), (32, 4, 2, 4, true));
        // A split launch, and an unsplit one too short to fill the GPU (one
        // sequence of a few hundred tokens): longer blocks, three programs
        // per SM.
        assert_eq!(tile(true, 512), (64, 4, 2, 3, true));
        assert_eq!(tile(false, 3), (64, 4, 2, 3, true));
        assert_eq!(tile(false, 263), (64, 4, 2, 3, true));
    }

    #[test]
    fn split_plan_fills_the_gpu_and_covers_the_context() {
        // B64 x 8 KV heads = 512 programs: no split needed on 132 SMs.
        assert_eq!(split_plan(64, 8, 8192, 132, 16), (8192, 1));
        // One sequence: split into chunks of at least 256 tokens.
        let (len, n) = split_plan(1, 8, 4096, 132, 16);
        assert_eq!((len, n), (256, 16));
        for &(b, h, ctx) in &[(1usize, 3usize, 1usize), (3, 3, 1000), (2, 8, 100_000), (1, 1, 17)] {
            let (len, n) = split_plan(b, h, ctx, 132, 32);
            assert!(len % 32 == 0 && len * n >= ctx && len * (n - 1) < ctx, "{b} {h} {ctx}: {len} {n}");
        }
    }
}
