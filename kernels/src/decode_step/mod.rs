//! The persistent decode step: one launch runs a whole decode step of a
//! Llama model (every sequence of the step has one new token), from the
//! token embedding to the logits, and in a step whose rows are all greedy
//! to the sampled tokens (`SAMPLE`).
//!
//! # Design
//!
//! The grid is one program per SM, all resident at once, and stays for the
//! whole step. The step is a fixed sequence of stages; each stage is a list
//! of tasks that the programs take in turn (task `t` goes to program `t %
//! num_programs`):
//!
//! | stage | tasks | body |
//! |---|---|---|
//! | embedding | one per row | [`crate::embedding::embedding_row`] into `h` |
//! | per layer: QKV | output tile (stacked) or output tile x K tile | [`crate::dequant::stacked::stacked_sums`] or [`crate::dequant::linear::linear_tile`], attention norm as its prologue (its statistic computed there at one or two rows, read from [`row_stats`] past that); stacked (one or two rows), RoPE and the KV write as its epilogue ([`crate::rope::rope_pairs`]) |
//! | attention | row x KV head x key block | split QKV: [`crate::rope::rope_row`] for its heads (RoPE, the token's K/V into the cache); then [`crate::decode_attention::decode_tc_body`] on its block, storing the block's softmax partial; the last block's task of a row and head folds them ([`crate::decode_attention::fold_blocks`]); a context of fewer than [`ATT_SPLIT_BLOCKS`] blocks is one task that runs them all and writes the result |
//! | O projection | as QKV | residual add into `h` as the epilogue |
//! | gate/up | as QKV | MLP norm prologue, SiLU-mul epilogue |
//! | down | as QKV | residual add into `h` |
//! | LM head | output tile | `linear_tile` unsplit, final norm prologue |
//! | sampling (`SAMPLE`) | one per row and [`SAMPLE_SLICE`] logits | `sample_rows`: slice maxima, then exact fixed-point slice sums ([`crate::sampling::exp_units`]) |
//!
//! Past two rows, the stages that write the residual stream (embedding, O,
//! down) end with one [`row_stats`] task per row, which stores the row's
//! norm statistic after the stage counters and counts in its stage's
//! counter; the normed products read the statistics instead of each
//! computing every row's.
//!
//! Stages meet through counters in global memory, one per stage and layer:
//! a task waits (`wait_until`, acquire) until the stage it reads has
//! counted all of its tasks, and the program that completes an output
//! (a row, a head, or the finishing K tile of an output tile) adds one to
//! its stage's counter with release semantics. Every stage here reads all of
//! the previous stage's output (a norm needs the whole row, a projection all
//! heads), so a stage waits for the whole previous stage; tasks of one stage
//! never wait for each other, so with every program resident the step cannot
//! deadlock. While a program waits, the weights it will multiply next are
//! already in flight: each task loads its weight tile before its wait (the
//! weights are never written), and every program asks L2 for its share of
//! the next layer's weights (`prefetch_l2`) in two parts: its QKV and O
//! matrices after this layer's attention stage (at one row most programs
//! have no attention task and would only wait there), its gate/up and down
//! matrices after the gate/up stage. Issued at the top of the layer, the
//! prefetches delayed the QKV tasks' waits; issued all at once after the
//! attention, their traffic slowed the gate/up tasks.
//!
//! The products of a step of one row, or of at most `STACK_ROWS` rows, in
//! the word-tiled formats take one task per output tile over all of K, the
//! K tiles of all its rows stacked in one `dot`
//! ([`crate::dequant::stacked`]; small tiles, so even the 576-row
//! projections of a small model give a hundred tasks or more); where that
//! `dot` would be wide and mostly past K, packed with several output
//! blocks (a small model's gate/up: three blocks of 4 rows per task). The other
//! products are split along K (one 128-column K tile per task): each task
//! stores its tile's product, and the task that completes an output tile
//! sums them in K order ([`crate::dequant::linear::split_finish`]).
//!
//! A stacked QKV tile of one or two rows holds whole RoPE pairs, so it rotates its Q and K
//! rows and writes Q to `q` and K and V to its token's cache slot itself:
//! the attention task then starts on the cache right after its wait, with
//! no QKV row to read back, rotate and store first. Everything an attention
//! task needs that the step does not write (the context length, the block
//! table, the cached keys and values, and for the split QKV the rotation
//! and the cache slot) it reads or asks L2 for before its wait.
//!
//! # Arithmetic
//!
//! Every stage runs the batch-invariant kernels' bodies with their
//! batch-invariant arithmetic: the products sum one `dot` per 128-column K
//! tile in K order, the norms take the exact statistic, RoPE rounds the
//! product to `T` and rotates it as the RoPE kernel does, the attention
//! computes the prefill kernel's key blocks, each block's softmax on its own
//! (whichever program computes it), folded in key order
//! ([`crate::flash_attention::softmax_fold`]). So the logits of
//! a row are bit for bit those of the multi-kernel batch-invariant step, for
//! any batch and any grid. The caller must give the attention the
//! invariant decode configuration (`ATT_ROWS`, `ATT_BLOCK_N` and the warps
//! of the multi-kernel decode kernel).
//!
//! # Contract
//!
//! - `m` rows, `1 <= m <= 16` (one M tile); with `ONE_ROW`, `m == 1`;
//!   otherwise with `STACK_ROWS > 0` (2 or 4), `m <= STACK_ROWS`: the
//!   products stack the K tiles of all rows ([`crate::dequant::stacked`]).
//! - Weights of layer `l`: the repacked planes at `q + l * *_qs` bytes and
//!   `s + l * *_ss` scale entries; norm weights at `l * N_EMBD`; the KV cache
//!   of layer `l` at `l * kv_stride` elements; all offsets fit 32 bits;
//!   every stride a multiple of [`STRIDE_ALIGN`] (the scale strides of half
//!   of it).
//! - Scratch as the multi-kernel step uses it (`h`, `qkv`, `q`, `attn`,
//!   `act` of `m` rows in `T`, `logits` of `m` rows in f32, as the LM head
//!   accumulates them; a stacked QKV leaves `qkv` unwritten); `ws`/`cnt` the
//!   split products' workspace and counters (counters zero; every launch
//!   leaves them zero), `ws` also holding a slot per program for the
//!   stacked products ([`crate::dequant::stacked::stacked_slot`] entries at most);
//!   `part` the attention's key-block partials: [`attention_parts`] rows
//!   for the longest context of the step, each `HEAD_DIM` sums, then each
//!   row's max, then each row's sum (`HEAD_DIM + 2` entries a row);
//!   `stage` holds [`stage_words`] words, the [`stage_counters`] and the
//!   key-block counts among them zero (every launch leaves them zero).
//! - The grid is at most the number of programs that can be resident at
//!   once (the launcher refuses larger waiting grids).
//! - Formats: `F_*` is the [`QuantFormat`] of each matrix kind. A kind
//!   whose layers mix two formats (llama.cpp's Q4_K_M files: down in Q4_K
//!   or Q6_K by layer) has the second as `F_*2` (otherwise `F_*2 = F_*`),
//!   and bit `j` of `alt_ptr[l]` set where layer `l`'s matrix of kind `j`
//!   (QKV, O, gate/up, down) is in it; the per-layer strides then span the
//!   larger of the two. Both QKV formats must stack or both split.
//! - With `SAMPLE`, every row is sampled greedily in the step: its token,
//!   logprob and threshold (`+inf`) go to `tok_out`, `logprob_out` and
//!   `thresh_out` at the row's index, the bits the sampler kernel writes
//!   for a greedy row (the caller keeps the step's other rows, those with
//!   temperatures, penalties or grammar masks, for the sampler kernels).
//!   Without it those pointers are not read.
//! - With `TRACE`, program `p` writes [`globaltimer`](dsl_core::lang::globaltimer)
//!   readings to row `p` of `trace` ([`trace_width`] entries per program):
//!   entry 0 when it leaves the embedding, `1 + 5 l + j` when it leaves
//!   stage `j` of layer `l` (QKV, attention with RoPE, O, gate/up, down),
//!   `5 L + 1` when it leaves the LM head, `5 L + 2` when it starts. The latest
//!   reading of an entry over the programs is when that stage ended. With
//!   `S` = [`stage_counters`], entries `S + i`, `2 S + i` and `3 S + i`
//!   are the times at which the program's (last) task of the stage ending
//!   at entry `i` left its wait, finished its prologue (a product's norm
//!   statistic; an attention task's RoPE) and finished its products (a
//!   product's sums, an attention task's key loop and store): the phases
//!   of a task, and how long after the previous stage's end each program
//!   saw it.

mod tasks;

pub use tasks::{
    Operands, Planes, Schedule, StageFormat, StageShape, StageSpec, StepCfg, StepIo, at_layer, by_format,
    count_tiles, first_task, layer_caches, mark, prefetch_kv, prefetch_layer, prefetch_planes,
    prefetch_share, row_rstd, row_stats, stage_linear, task_weights, with_rows,
};

use crate::decode_attention::{decode_tc_body, fold_blocks};
use crate::dequant::linear::LINEAR_BLOCK_K;
use crate::dequant::stacked::StackedShape;
#[cfg(doc)]
use crate::dequant::stacked::stacked_sums;
use crate::dequant::{Fuse, QuantFormat};
use crate::embedding::embedding_row;
use crate::rope::{RopeShape, rope_angles, rope_row};
use crate::sampling::{exp_units, units_to_f32};
use dsl_macros::{kernel, kernel_fn};

/// What every per-layer stride of the step is a multiple of: the weight
/// planes' bytes (`*_qs`), twice the scale entries (`*_ss`, bytes of f16) and
/// the KV cache's elements per layer (`kv_stride`). The kernel tells the
/// compiler so, which makes its weight, activation and cache loads vectors
/// and lets the attention's key loop be pipelined; the launcher must not run
/// it on other strides.
pub const STRIDE_ALIGN: usize = 16;

/// The fewest key blocks of a row whose attention the step splits into a
/// task per block: below it, the hand-over of the partials (a count, the
/// partials read back and folded) takes longer than the blocks it runs
/// beside each other (BENCHMARKS.md).
pub const ATT_SPLIT_BLOCKS: usize = 4;

/// The logits of a `SAMPLE` step's sampling task: a row's slice of this
/// many (eight a thread on the step's four warps).
pub const SAMPLE_SLICE: usize = 1024;

/// Stage counters per layer: QKV, attention (with RoPE), O, gate/up, down.
pub const STAGES_PER_LAYER: usize = 5;

/// The stage counters a model of `n_layers` layers needs: the embedding,
/// five per layer, the LM head and the exit count.
pub const fn stage_counters(n_layers: usize) -> usize {
    STAGES_PER_LAYER * n_layers + 3
}

/// The 32-bit words of the `stage` buffer of a model of `n_layers` layers,
/// `n_kv` KV heads and `vocab` tokens: the [`stage_counters`], then
/// [`MAX_ROWS`] words that hold the rows' norm statistics (f32) in a step
/// that computes them once per norm, then a count of finished key blocks
/// per row and KV head, then two counts of finished sampling tasks per row
/// (all counts zero at every launch and left zero), then the sampling
/// tasks' partials (see [`sample_parts`]).
pub const fn stage_words(n_layers: usize, n_kv: usize, vocab: usize) -> usize {
    sample_base(n_layers, n_kv) + 2 * MAX_ROWS + 4 * MAX_ROWS * vocab.div_ceil(SAMPLE_SLICE) + 1
}

/// Where the sampling counts start in the `stage` buffer.
const fn sample_base(n_layers: usize, n_kv: usize) -> usize {
    stage_counters(n_layers) + MAX_ROWS + MAX_ROWS * n_kv
}

/// The partial rows (`part_m`, `part_l` entries; `part_o` holds `head_dim`
/// for each) a step of `m` rows needs for contexts of up to `max_ctx`
/// tokens: per row, query head and key block of `block_n` keys, the
/// block's softmax partial.
pub const fn attention_parts(m: usize, n_head: usize, block_n: usize, max_ctx: usize) -> usize {
    m * n_head * max_ctx.div_ceil(block_n)
}

/// The trace entries per program of a model of `n_layers` layers (see
/// [`decode_step`]'s `TRACE`): per stage counter, the stage-end reading
/// and a task's wait-exit, prologue and products readings.
pub const fn trace_width(n_layers: usize) -> usize {
    TRACE_PHASES * stage_counters(n_layers)
}

/// Readings per stage counter in a trace row (see [`trace_width`]).
pub const TRACE_PHASES: usize = 4;

/// The most rows one persistent step takes (one M tile of the products).
pub const MAX_ROWS: usize = 16;

/// The split products' workspace entries and tile counters a product of
/// `rows` weight rows and `k` columns needs (tiles of 32 or 64 rows).
pub fn workspace(rows: usize, k: usize) -> (usize, usize) {
    (rows.div_ceil(64) * 64 * k.div_ceil(LINEAR_BLOCK_K) * MAX_ROWS, rows.div_ceil(32))
}

/// One decode step of a Llama model (see the module doc).
#[kernel]
#[allow(clippy::too_many_arguments)]
pub fn decode_step<T: Float>(
    emb_ptr: Ptr<u8>,
    ids_ptr: Ptr<i32>,
    pos_ptr: Ptr<i32>,
    slot_ptr: Ptr<i32>,
    tables_ptr: Ptr<i32>,
    ctx_ptr: Ptr<i32>,
    qkv_q: Ptr<u8>,
    qkv_s: Ptr<f16>,
    o_q: Ptr<u8>,
    o_s: Ptr<f16>,
    gu_q: Ptr<u8>,
    gu_s: Ptr<f16>,
    dn_q: Ptr<u8>,
    dn_s: Ptr<f16>,
    head_q: Ptr<u8>,
    head_s: Ptr<f16>,
    alt_ptr: Ptr<i32>,
    attn_norm: Ptr<T>,
    ffn_norm: Ptr<T>,
    out_norm: Ptr<T>,
    k_cache: Ptr<T>,
    v_cache: Ptr<T>,
    h_ptr: Ptr<T>,
    qkv_ptr: Ptr<T>,
    q_ptr: Ptr<T>,
    attn_ptr: Ptr<T>,
    act_ptr: Ptr<T>,
    logits_ptr: Ptr<f32>,
    tok_out: Ptr<i32>,
    logprob_out: Ptr<f32>,
    thresh_out: Ptr<f32>,
    ws_ptr: Ptr<f32>,
    cnt_ptr: Ptr<i32>,
    stage_ptr: Ptr<i32>,
    part_ptr: Ptr<f32>,
    trace_ptr: Ptr<i64>,
    m: i32,
    bt_stride: i32,
    vocab: i32,
    qkv_qs: i32,
    qkv_ss: i32,
    o_qs: i32,
    o_ss: i32,
    gu_qs: i32,
    gu_ss: i32,
    dn_qs: i32,
    dn_ss: i32,
    kv_stride: i32,
    eps: f32,
    theta: f32,
    scale: f32,
    #[constexpr] N_LAYERS: usize,
    #[constexpr] N_EMBD: usize,
    #[constexpr] N_HEAD: usize,
    #[constexpr] N_KV: usize,
    #[constexpr] HEAD_DIM: usize,
    #[constexpr] N_FF: usize,
    #[constexpr] PAGE: usize,
    #[constexpr] ATT_BLOCK_N: usize,
    #[constexpr] ATT_ROWS: usize,
    #[constexpr] F_QKV: QuantFormat,
    #[constexpr] F_O: QuantFormat,
    #[constexpr] F_GU: QuantFormat,
    #[constexpr] F_DN: QuantFormat,
    #[constexpr] F_HEAD: QuantFormat,
    #[constexpr] F_QKV2: QuantFormat,
    #[constexpr] F_O2: QuantFormat,
    #[constexpr] F_GU2: QuantFormat,
    #[constexpr] F_DN2: QuantFormat,
    #[constexpr] F16: bool,
    #[constexpr] ONE_ROW: bool,
    #[constexpr] STACK_ROWS: usize,
    #[constexpr] TRACE: bool,
    #[constexpr] KV8: bool,
    #[constexpr] SAMPLE: bool,
) {
    static_assert(N_HEAD % N_KV == 0, "query heads must group evenly over KV heads");
    // Per-layer strides in whole 16-byte lines (see `STRIDE_ALIGN`).
    let a = STRIDE_ALIGN as u32;
    let (qkv_qs, o_qs, gu_qs, dn_qs) =
        (multiple_of(qkv_qs, a), multiple_of(o_qs, a), multiple_of(gu_qs, a), multiple_of(dn_qs, a));
    let (qkv_ss, o_ss, gu_ss, dn_ss) = (
        multiple_of(qkv_ss, a / 2),
        multiple_of(o_ss, a / 2),
        multiple_of(gu_ss, a / 2),
        multiple_of(dn_ss, a / 2),
    );
    let kv_stride = multiple_of(kv_stride, a);
    // Each kind's weights over the layers.
    let qkv = Planes { q: qkv_q, s: qkv_s, qs: qkv_qs, ss: qkv_ss };
    let o = Planes { q: o_q, s: o_s, qs: o_qs, ss: o_ss };
    let gu = Planes { q: gu_q, s: gu_s, qs: gu_qs, ss: gu_ss };
    let dn = Planes { q: dn_q, s: dn_s, qs: dn_qs, ss: dn_ss };
    // The step's inputs (ids, positions, slots, tables) come from the copies
    // or kernels before it.
    gdc_wait();
    // Stage-end entries per program of the trace (`stage_counters`); a
    // row holds as many entries of each task phase after them (`trace_width`).
    let n_marks = STAGES_PER_LAYER * N_LAYERS + 3;
    let width = TRACE_PHASES * n_marks;
    mark(trace_ptr, full([], (n_marks - 1) as i32, i32), width, TRACE);
    let e = N_EMBD as i32;
    let qkv_rows = ((N_HEAD + 2 * N_KV) * HEAD_DIM) as i32;
    let attn_cols = (N_HEAD * HEAD_DIM) as i32;
    let ff = N_FF as i32;
    let n_e = full([], e, i32);
    let n_qkv = full([], qkv_rows, i32);
    let n_attn = full([], attn_cols, i32);
    let n_ff = full([], ff, i32);
    // The embedding kernel's column tile (`embedding::block_for`).
    let nb_e = N_EMBD.next_power_of_two().min(1024);
    let norm_block = N_EMBD.next_power_of_two();
    // Steps on tensor cores of one row, or of at most `STACK_ROWS` rows,
    // take the word-tiled products stacked ([`stacked_sums`]: `stack` K
    // tiles of every row per dot, no split-K hand-over); the others split
    // into 128-column K tiles, gate/up in tiles of 64 rows (its tasks then
    // fit the grid in one round).
    let srows = if !F16 {
        0
    } else if ONE_ROW {
        1
    } else {
        STACK_ROWS
    };
    let qkv_rows_n = (N_HEAD + 2 * N_KV) * HEAD_DIM;
    let (f_qkv, f_qkv2) = (
        F_QKV.stage_format(srows, qkv_rows_n, N_EMBD, false),
        F_QKV2.stage_format(srows, qkv_rows_n, N_EMBD, false),
    );
    let (f_o, f_o2) = (
        F_O.stage_format(srows, N_EMBD, N_HEAD * HEAD_DIM, false),
        F_O2.stage_format(srows, N_EMBD, N_HEAD * HEAD_DIM, false),
    );
    let (f_gu, f_gu2) =
        (F_GU.stage_format(srows, 2 * N_FF, N_EMBD, true), F_GU2.stage_format(srows, 2 * N_FF, N_EMBD, true));
    let (f_dn, f_dn2) =
        (F_DN.stage_format(srows, N_EMBD, N_FF, false), F_DN2.stage_format(srows, N_EMBD, N_FF, false));
    let (st_qkv, bn_qkv) = (f_qkv.stack(), f_qkv.task_rows());
    let (st_o, bn_o) = (f_o.stack(), f_o.task_rows());
    let (st_gu, bn_gu) = (f_gu.stack(), f_gu.task_rows());
    let (st_dn, bn_dn) = (f_dn.stack(), f_dn.task_rows());
    // Layers whose matrix of a kind is in that kind's second format (bit j
    // of `alt_ptr[l]` for kind j: QKV, O, gate/up, down) run the stage's
    // tasks in it; the RoPE placement below must not depend on the format.
    let mixed = F_QKV2 != F_QKV || F_O2 != F_O || F_GU2 != F_GU || F_DN2 != F_DN;
    static_assert(
        F_QKV2.stacks(srows, qkv_rows_n, N_EMBD) == F_QKV.stacks(srows, qkv_rows_n, N_EMBD),
        "a model's QKV formats must both stack or both split",
    );
    let (tl_e, tl_attn, tl_ff) = (
        N_EMBD.div_ceil(LINEAR_BLOCK_K),
        (N_HEAD * HEAD_DIM).div_ceil(LINEAR_BLOCK_K),
        N_FF.div_ceil(LINEAR_BLOCK_K),
    );
    // The LM head unsplit (its tiles alone fill the grid): tiles of 64 rows
    // in Q8_0, 32 otherwise.
    let f_head = F_HEAD.stage_format(0, 0, N_EMBD, false);
    // A stacked QKV product of one or two rows rotates Q and K itself and
    // writes them (and V) where the attention reads them ([`rope_pairs`]);
    // otherwise the attention task does it ([`rope_row`]) from the QKV row.
    // (At four rows the tile's rotations cost what the attention's save.)
    let fused_rope = srows <= 2 && F_QKV.stacks(srows, qkv_rows_n, N_EMBD) && !KV8;
    let rope_qkv = if fused_rope { RopeShape::NONE.heads(N_HEAD, N_KV, HEAD_DIM) } else { RopeShape::NONE };
    let qkv_out = if fused_rope { q_ptr } else { qkv_ptr };
    let t_qkv = count_tiles(n_qkv, bn_qkv);
    let t_o = count_tiles(n_e, bn_o);
    let t_gu = count_tiles(n_ff * 2, bn_gu);
    let t_dn = count_tiles(n_e, bn_dn);
    let (t_qkv2, t_o2, t_gu2, t_dn2) = (
        count_tiles(n_qkv, f_qkv2.task_rows()),
        count_tiles(n_e, f_o2.task_rows()),
        count_tiles(n_ff * 2, f_gu2.task_rows()),
        count_tiles(n_e, f_dn2.task_rows()),
    );
    let zero = full([], 0, i32);
    let last = (STAGES_PER_LAYER * N_LAYERS + 2) as i32;
    // Past one or two rows (whose statistics a product task computes in
    // about the time a hand-over takes) each row's norm statistic is
    // computed once, by a task of its own appended to the stage that
    // writes the residual stream ([`row_stats`]); the products read it.
    let shared_stats = !ONE_ROW && srows != 2;
    // What the product stages share, and what each one is at build time.
    let io = StepIo {
        ws: ws_ptr,
        cnt: cnt_ptr,
        stage: stage_ptr,
        trace: trace_ptr,
        m,
        eps,
        pos: pos_ptr,
        slot: slot_ptr,
        theta,
        k_cache,
        v_cache,
        // (Without shared statistics nothing reads it: bound to a value
        // that exists anyway, so those steps gain no op.)
        rstd: if shared_stats { ptrcast(stage_ptr + (last + 1), f32) } else { eps },
    };
    let cfg = StepCfg {
        f16_ops: F16,
        one_row: ONE_ROW,
        stack_rows: srows,
        dt: T,
        norm_block,
        n_marks,
        trace: TRACE,
        shared_stats,
    };
    let qkv_spec = cfg.stage(f_qkv, f_qkv2, Fuse::NONE.with_norm(true), tl_e).with_rope(rope_qkv);
    let o_spec = cfg.stage(f_o, f_o2, Fuse::NONE.with_residual(true), tl_attn);
    let gu_spec = cfg.stage(f_gu, f_gu2, Fuse::NONE.with_silu(true).with_norm(true), tl_e);
    let dn_spec = cfg.stage(f_dn, f_dn2, Fuse::NONE.with_residual(true), tl_ff);
    let head_spec = cfg.stage(f_head, f_head, Fuse::NONE.with_norm(true), 0).unsplit();

    for t in range(program_id(0), m, num_programs(0)) {
        embedding_row(emb_ptr, ids_ptr, h_ptr, n_e, vocab, t, T, nb_e);
        atomic_add(stage_ptr, 1, sem = "release");
    }
    if shared_stats {
        row_stats(h_ptr, io, zero, m, m, n_e, cfg);
    }
    mark(trace_ptr, full([], 0, i32), width, TRACE);
    // Tasks per stage of a layer (products split into 128-column K tiles);
    // a layer's stages start at `l * per_layer` in the rotation of
    // [`first_task`].
    let kt_e = (e + 127) / 128;
    let kt_attn = (attn_cols + 127) / 128;
    let kt_ff = (ff + 127) / 128;
    let n_qkv_tasks = if st_qkv > 0 { t_qkv } else { t_qkv * kt_e };
    let n_o_tasks = if st_o > 0 { t_o } else { t_o * kt_attn };
    let n_gu_tasks = if st_gu > 0 { t_gu } else { t_gu * kt_e };
    let n_dn_tasks = if st_dn > 0 { t_dn } else { t_dn * kt_ff };
    // The attention runs one task per row, KV head and key block of
    // `ATT_BLOCK_N` keys (a row's blocks past its context do nothing); each
    // stores its block's softmax partial, and the task that finishes a
    // row and head's last block folds them in key order
    // ([`fold_blocks`]): the batch-invariant softmax's partials do not
    // depend on which program computes them. A context of fewer than
    // [`ATT_SPLIT_BLOCKS`] blocks runs whole in its block-0 task, which
    // writes the result (the same bits).
    // (The stages' rotation counts one attention task per row and head.)
    let group = N_HEAD / N_KV;
    let bn = ATT_BLOCK_N as i32;
    let n_heads = m * N_KV as i32;
    let per_layer = n_qkv_tasks + n_heads + n_o_tasks + n_gu_tasks + n_dn_tasks;
    // With shared statistics: the row tasks after the O and down stages,
    // and the rows' counts the stages that read them wait for in addition.
    let (per_layer, first) = if shared_stats { (per_layer + 2 * m, 2 * m) } else { (per_layer, m) };
    // This program's share of the first layer's weights, asked of L2 now;
    // each later layer's a layer ahead, in two parts (see the module doc).
    prefetch_layer(qkv, o, gu, dn, zero, N_LAYERS, 0);
    for l in range(0, N_LAYERS as i32) {
        let s0 = l * STAGES_PER_LAYER as i32 + 1;
        let next = l + 1;
        let kv = l * kv_stride;
        let off_qkv = first + l * per_layer;
        let off_att = off_qkv + n_qkv_tasks;
        let off_o = off_att + n_heads;
        let off_gu = if shared_stats { off_o + n_o_tasks + m } else { off_o + n_o_tasks };
        let off_dn = off_gu + n_gu_tasks;
        // Which of their kind's two formats this layer's matrices are in
        // (see `mixed`), and the previous layer's.
        let alt = if mixed { load(alt_ptr + l) } else { zero };
        let alt_prev = if F_DN2 != F_DN { load(alt_ptr + maximum(l - 1, 0)) } else { zero };
        // QKV with the attention norm: reads the residual, the embedding
        // (layer 0) or the previous layer's down product.
        let ready = with_rows(where_(l == 0, m, by_format(alt_prev, 3, t_dn, t_dn2)), m, shared_stats);
        stage_linear(
            at_layer(qkv, l),
            Operands { x: h_ptr, nw: attn_norm + l * e, out: qkv_out, n: n_qkv, k: n_e },
            Schedule { wait: s0 - 1, target: ready, done: s0, offset: off_qkv },
            alt >> 0 & 1,
            qkv_spec,
            layer_caches(io, kv),
        );
        mark(trace_ptr, s0, width, TRACE);
        // Blocks of the longest context (a row's tasks past its own do
        // nothing), read here rather than held across the layers.
        let rows16 = arange(0, MAX_ROWS as i32);
        let ctxs = load(ctx_ptr + rows16, mask = rows16 < m, other = 0);
        let nb_max = maximum(max((ctxs + (bn - 1)) / bn, 0), 1);
        // The partials' sums, maxima and row sums, one after the other.
        let part_rows = n_heads * nb_max * group as i32;
        let (part_o, part_m, part_l) =
            (part_ptr, part_ptr + part_rows * HEAD_DIM as i32, part_ptr + part_rows * (HEAD_DIM + 1) as i32);
        for t in range(first_task(off_att), n_heads * nb_max, num_programs(0)) {
            let (j, bh) = (t / n_heads, t % n_heads);
            let (b, h) = (bh / N_KV as i32, bh % N_KV as i32);
            let ctx = load(ctx_ptr + b);
            let nb = (ctx + (bn - 1)) / bn;
            let split = nb >= ATT_SPLIT_BLOCKS as i32;
            if j < nb && (split || j == 0) {
                // The cached keys and values of its blocks before this
                // step's token are final: ask L2 for them while the QKV
                // stage runs.
                prefetch_kv(
                    k_cache + kv,
                    v_cache + kv,
                    tables_ptr + b * bt_stride,
                    where_(split, j * bn, 0),
                    where_(split, minimum(ctx - 1, (j + 1) * bn), ctx - 1),
                    h,
                    N_KV,
                    HEAD_DIM,
                    PAGE,
                    KV8,
                );
                // The token's rotation and cache slot do not depend on the
                // QKV product either.
                let (c, s, slot) = if fused_rope {
                    (theta, theta, ctx)
                } else {
                    let (c, s) = rope_angles(pos_ptr, theta, b, HEAD_DIM);
                    (c, s, load(slot_ptr + b))
                };
                wait_until(stage_ptr + s0, "ge", by_format(alt, 0, t_qkv, t_qkv2));
                mark(trace_ptr, s0 + 1 + n_marks as i32, width, TRACE);
                // Unless the QKV product did: RoPE of this KV head's query
                // group and of its key, and the token's key and value into
                // the cache, then attention over the cache (which now holds
                // them): the program reads back its own stores, after a
                // barrier. Every block's task of the row and head does it
                // (they all read the rotated query; the values are the
                // same whichever task stores them).
                if !fused_rope {
                    rope_row(
                        qkv_ptr,
                        c,
                        s,
                        slot,
                        q_ptr,
                        k_cache + kv,
                        v_cache + kv,
                        b,
                        h * group as i32,
                        group,
                        h,
                        1,
                        N_HEAD,
                        N_KV,
                        HEAD_DIM,
                        KV8,
                    );
                    barrier();
                }
                mark(trace_ptr, s0 + 1 + 2 * n_marks as i32, width, TRACE);
                // Two instances of the body (whole context; one block that
                // keeps its partial) rather than one with a runtime range
                // and epilogue: the single instance holds more registers
                // across the step's products.
                if !split {
                    decode_tc_body(
                        q_ptr,
                        k_cache + kv,
                        v_cache + kv,
                        tables_ptr,
                        bt_stride,
                        ctx,
                        attn_ptr,
                        part_o,
                        part_m,
                        part_l,
                        scale,
                        full([], 1 << 30, i32),
                        b,
                        h,
                        full([], 0, i32),
                        full([], 1, i32),
                        T,
                        N_KV,
                        group,
                        HEAD_DIM,
                        PAGE,
                        ATT_BLOCK_N,
                        false,
                        ATT_ROWS,
                        true,
                        KV8,
                    );
                    mark(trace_ptr, s0 + 1 + 3 * n_marks as i32, width, TRACE);
                    atomic_add(stage_ptr + s0 + 1, 1, sem = "release");
                } else {
                    decode_tc_body(
                        q_ptr,
                        k_cache + kv,
                        v_cache + kv,
                        tables_ptr,
                        bt_stride,
                        ctx,
                        attn_ptr,
                        part_o,
                        part_m,
                        part_l,
                        scale,
                        full([], bn, i32),
                        b,
                        h,
                        j,
                        nb_max,
                        T,
                        N_KV,
                        group,
                        HEAD_DIM,
                        PAGE,
                        ATT_BLOCK_N,
                        true,
                        ATT_ROWS,
                        true,
                        KV8,
                    );
                    mark(trace_ptr, s0 + 1 + 3 * n_marks as i32, width, TRACE);
                    // Its partial is stored (the count releases it); the
                    // task that counts the row and head's last block
                    // (acquiring the others') folds them and releases
                    // the result.
                    let arrived = stage_ptr + (last + 1 + MAX_ROWS as i32) + bh;
                    let done = atomic_add(arrived, 1);
                    if done == nb - 1 {
                        store(arrived, 0);
                        fold_blocks(
                            part_o, part_m, part_l, attn_ptr, b, h, nb, nb_max, T, N_KV, group, HEAD_DIM,
                        );
                        atomic_add(stage_ptr + s0 + 1, 1, sem = "release");
                    }
                }
            }
        }
        mark(trace_ptr, s0 + 1, width, TRACE);
        // This program's share of the next layer's QKV and O weights, asked
        // of L2 while the attention tasks (few at small batches) run.
        prefetch_layer(qkv, o, gu, dn, next, N_LAYERS, 1);
        stage_linear(
            at_layer(o, l),
            Operands { x: attn_ptr, nw: h_ptr, out: h_ptr, n: n_e, k: n_attn },
            Schedule { wait: s0 + 1, target: m * N_KV as i32, done: s0 + 2, offset: off_o },
            alt >> 1 & 1,
            o_spec,
            io,
        );
        if shared_stats {
            row_stats(h_ptr, io, s0 + 2, by_format(alt, 1, t_o, t_o2), off_o + n_o_tasks, n_e, cfg);
        }
        mark(trace_ptr, s0 + 2, width, TRACE);
        stage_linear(
            at_layer(gu, l),
            Operands { x: h_ptr, nw: ffn_norm + l * e, out: act_ptr, n: n_ff, k: n_e },
            Schedule {
                wait: s0 + 2,
                target: with_rows(by_format(alt, 1, t_o, t_o2), m, shared_stats),
                done: s0 + 3,
                offset: off_gu,
            },
            alt >> 2 & 1,
            gu_spec,
            io,
        );
        mark(trace_ptr, s0 + 3, width, TRACE);
        // And of its gate/up and down weights.
        prefetch_layer(qkv, o, gu, dn, next, N_LAYERS, 2);
        stage_linear(
            at_layer(dn, l),
            Operands { x: act_ptr, nw: h_ptr, out: h_ptr, n: n_e, k: n_ff },
            Schedule { wait: s0 + 3, target: by_format(alt, 2, t_gu, t_gu2), done: s0 + 4, offset: off_dn },
            alt >> 3 & 1,
            dn_spec,
            io,
        );
        if shared_stats {
            row_stats(h_ptr, io, s0 + 4, by_format(alt, 3, t_dn, t_dn2), off_dn + n_dn_tasks, n_e, cfg);
        }
        mark(trace_ptr, s0 + 4, width, TRACE);
    }
    // The LM head with the final norm, unsplit (its tiles alone fill the grid).
    let alt_last = if F_DN2 != F_DN { load(alt_ptr + (N_LAYERS - 1) as i32) } else { zero };
    stage_linear(
        (head_q, head_s),
        Operands { x: h_ptr, nw: out_norm, out: logits_ptr, n: vocab, k: n_e },
        Schedule {
            wait: full([], last - 2, i32),
            target: with_rows(by_format(alt_last, 3, t_dn, t_dn2), m, shared_stats),
            done: full([], last - 1, i32),
            offset: first + N_LAYERS as i32 * per_layer,
        },
        zero,
        head_spec,
        io,
    );
    mark(trace_ptr, full([], last - 1, i32), width, TRACE);
    if SAMPLE {
        let head_tiles = count_tiles(vocab, f_head.task_rows());
        let off = first + N_LAYERS as i32 * per_layer + head_tiles;
        sample_rows(
            logits_ptr,
            tok_out,
            logprob_out,
            thresh_out,
            stage_ptr,
            full([], last - 1, i32),
            head_tiles,
            m,
            vocab,
            off,
            sample_base(N_LAYERS, N_KV),
        );
    }
    // The program that leaves last zeroes the stage counters for the next
    // launch: every other program has passed all of its waits by then.
    let gone = atomic_add(stage_ptr + last, 1, sem = "acq_rel");
    if gone == num_programs(0) - 1 {
        for c in range(0, last + 1, 256) {
            let i = c + arange(0, 256);
            store(stage_ptr + i, zeros([256], i32), mask = i <= last);
        }
    };
}

/// The rows of a `SAMPLE` step sampled greedily, spread over the programs
/// in tasks of one row and one [`SAMPLE_SLICE`] of its logits, with the
/// bits the sampler kernel (`crate::sampling::sample`) writes for a greedy
/// row:
///
/// 1. each task waits until the LM head has counted `head_tiles` in
///    counter `head_done` of `stage`, takes its slice's maximum and the
///    lowest index reaching it, stores them and counts in its row's first
///    count;
/// 2. once the row's first count holds every slice, each task takes the
///    row's maximum `m` from the slices' and stores its slice's
///    `sum exp(x - m)` in fixed point ([`exp_units`], exact integers); the
///    task that counts the row's last slice in the second count adds them
///    (exact in any order), writes the token (the lowest index among the
///    slices' maxima equal to `m`), its logprob and `+inf`, and zeroes the
///    row's counts.
///
/// A program runs all of its first-phase tasks before any second-phase
/// one, so with every program resident no wait can starve. The counts and
/// partials sit at word `base` of `stage` ([`stage_words`]); tasks start
/// at program `off` of the rotation ([`first_task`]).
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
fn sample_rows(
    logits_ptr: Tensor,
    tok_out: Tensor,
    logprob_out: Tensor,
    thresh_out: Tensor,
    stage_ptr: Tensor,
    head_done: Tensor,
    head_tiles: Tensor,
    m: Tensor,
    vocab: Tensor,
    off: Tensor,
    base: usize,
) {
    let sl = SAMPLE_SLICE as i32;
    let n_slices = (vocab + (sl - 1)) / sl;
    let rows = MAX_ROWS as i32;
    let base = base as i32;
    let (first, second) = (stage_ptr + base, stage_ptr + base + rows);
    // Per row and slice: the maximum, its lowest index, then the i64 sum
    // (at an even word, so 8-byte aligned).
    let parts = base + 2 * rows;
    let p_max = ptrcast(stage_ptr + parts, f32);
    let p_idx = stage_ptr + parts + rows * n_slices;
    let p_sum = ptrcast(stage_ptr + (parts + 2 * rows * n_slices + 1) / 2 * 2, i64);
    let cols = arange(0, SAMPLE_SLICE as i32);
    let n_tasks = m * n_slices;
    let t0 = first_task(off);
    for t in range(t0, n_tasks, num_programs(0)) {
        let (r, j) = (t / n_slices, t % n_slices);
        wait_until(stage_ptr + head_done, "ge", head_tiles);
        let c = j * sl + cols;
        let x = load(logits_ptr + r * vocab + c, mask = c < vocab, other = f32::NEG_INFINITY);
        let mx = max(x, 0);
        store(p_max + r * n_slices + j, mx);
        store(p_idx + r * n_slices + j, min(where_(x == mx, c, vocab), 0));
        atomic_add(first + r, 1, sem = "release");
    }
    for t in range(t0, n_tasks, num_programs(0)) {
        let (r, j) = (t / n_slices, t % n_slices);
        wait_until(first + r, "ge", n_slices);
        // The row's maximum and its lowest index, over the slices' in
        // chunks of 128.
        let mut mx = f32::NEG_INFINITY;
        let mut id = vocab;
        for s0 in range(0, n_slices, 128) {
            let k = s0 + arange(0, 128);
            let at = r * n_slices + k;
            let pm = load(p_max + at, mask = k < n_slices, other = f32::NEG_INFINITY);
            let pi = load(p_idx + at, mask = k < n_slices, other = 0);
            let cm = max(pm, 0);
            let ci = min(where_(pm == cm, pi, vocab), 0);
            id = where_(cm > mx, ci, where_(cm == mx, minimum(id, ci), id));
            mx = maximum(mx, cm);
        }
        let c = j * sl + cols;
        let x = load(logits_ptr + r * vocab + c, mask = c < vocab, other = f32::NEG_INFINITY);
        store(p_sum + r * n_slices + j, sum(exp_units(exp(x - mx)), 0));
        let done = atomic_add(second + r, 1);
        if done == n_slices - 1 {
            let mut total = zeros([], i64);
            for s0 in range(0, n_slices, 128) {
                let k = s0 + arange(0, 128);
                total += sum(load(p_sum + r * n_slices + k, mask = k < n_slices, other = 0), 0);
            }
            let x_id = load(logits_ptr + r * vocab + id);
            store(tok_out + r, id);
            store(logprob_out + r, x_id - mx - log(units_to_f32(total)));
            store(thresh_out + r, f32::INFINITY);
            store(first + r, 0);
            store(second + r, 0);
        }
    }
}
