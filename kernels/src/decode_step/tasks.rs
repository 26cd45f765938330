//! The persistent step's task bodies and the helpers its stages share: a
//! product stage's tasks ([`stage_linear`]), the first task and the tile
//! count of a stage, the L2 prefetches of the next layer's weights and of
//! a sequence's cached keys and values, and the trace marks.

use super::{MAX_ROWS, TRACE_PHASES};
use crate::dequant::linear::{LINEAR_BLOCK_K, linear_tile, residual_sum, tile_load};
use crate::dequant::stacked::{
    StackedShape, packed_epilogue, packed_sums, stacked_epilogue, stacked_load, stacked_rows, stacked_sums,
};
use crate::dequant::{Fuse, QuantFormat};
use crate::kv_cache::{kv8_scale_index, kv8_slot};
use crate::rmsnorm::{rms_rstd, rms_rstd_live_rows};
use crate::rope::{RopeShape, rope_pairs};
use dsl_core::DType;
use dsl_core::lang::Tensor;
use dsl_macros::kernel_fn;

/// A projection kind's weights over the layers, a group of tensors: the
/// repacked words at `q` (bytes) and the scales at `s`, layer `l`'s at
/// `q + l * qs` and `s + l * ss` ([`at_layer`]).
#[derive(Clone, Copy, Debug)]
pub struct Planes {
    /// The words of layer 0.
    pub q: Tensor,
    /// The scales of layer 0.
    pub s: Tensor,
    /// Bytes of words per layer.
    pub qs: Tensor,
    /// Scale entries per layer.
    pub ss: Tensor,
}

/// Layer `l`'s words and scales of `p`.
#[kernel_fn]
pub fn at_layer(#[tensors] p: Planes, l: Tensor) -> (Tensor, Tensor) {
    (p.q + l * p.qs, p.s + l * p.ss)
}

/// What every product task of the step reads or writes besides its
/// operands, a group of tensors: the split products' workspace `ws` and
/// tile counters `cnt`, the stage counters `stage`, the trace `trace`, the
/// step's rows `m` and the norms' `eps`; and for a RoPE epilogue the
/// pointers to the rows' positions `pos` and cache slots `slot`, `theta`,
/// and the K and V caches (of layer 0; [`layer_caches`] gives a layer's).
#[derive(Clone, Copy, Debug)]
pub struct StepIo {
    /// The split products' workspace (and the stacked products' slots).
    pub ws: Tensor,
    /// The split products' tile counters.
    pub cnt: Tensor,
    /// The stage counters.
    pub stage: Tensor,
    /// The trace (read with the trace on).
    pub trace: Tensor,
    /// Rows of the step.
    pub m: Tensor,
    /// The norms' epsilon.
    pub eps: Tensor,
    /// The rows' positions.
    pub pos: Tensor,
    /// The rows' cache slots.
    pub slot: Tensor,
    /// The RoPE base.
    pub theta: Tensor,
    /// The K cache.
    pub k_cache: Tensor,
    /// The V cache.
    pub v_cache: Tensor,
    /// The rows' norm statistics of the residual stream, where the step
    /// computes them once per norm ([`StepCfg::shared_stats`], [`row_stats`]).
    pub rstd: Tensor,
}

/// `io` with the K and V caches of the layer `kv` elements in.
#[kernel_fn]
pub fn layer_caches(#[tensors] io: StepIo, kv: Tensor) -> StepIo {
    StepIo {
        ws: io.ws,
        cnt: io.cnt,
        stage: io.stage,
        trace: io.trace,
        m: io.m,
        eps: io.eps,
        pos: io.pos,
        slot: io.slot,
        theta: io.theta,
        k_cache: io.k_cache + kv,
        v_cache: io.v_cache + kv,
        rstd: io.rstd,
    }
}

/// The step's build-time settings that every product stage takes: f16
/// operands (`f16_ops`), one row (`one_row`), the rows of a stacked
/// product (`stack_rows`), the activations' dtype `dt`,
/// the norm statistic's column tile `norm_block`, and with `trace` the
/// trace marks of `n_marks` stage counters (see [`stage_linear`]).
#[derive(Clone, Copy, Debug)]
pub struct StepCfg {
    /// Products on f16 operands (tensor cores).
    pub f16_ops: bool,
    /// A one-row step.
    pub one_row: bool,
    /// The activation rows a stacked product holds: 1 in a one-row step, 2
    /// or 4 in a multi-row one of at most that many rows, 0 where the
    /// products do not stack ([`StageShape::stage_format`]).
    pub stack_rows: usize,
    /// The activations' dtype.
    pub dt: DType,
    /// The norm statistic's column tile.
    pub norm_block: usize,
    /// Stage counters of the step (trace entries per phase).
    pub n_marks: usize,
    /// Whether the tasks write their trace readings.
    pub trace: bool,
    /// Whether the norm statistics come from the rows' own tasks
    /// ([`row_stats`], appended to the stage that writes the residual
    /// stream) instead of every product task's prologue.
    pub shared_stats: bool,
}

impl StepCfg {
    /// A product stage in formats `fmt` and `fmt2` (see [`stage_linear`])
    /// with the fusions `fuse`, over `tiles` K tiles (stacked), split along
    /// K where it does not stack, without RoPE.
    pub const fn stage(self, fmt: StageFormat, fmt2: StageFormat, fuse: Fuse, tiles: usize) -> StageSpec {
        StageSpec { fmt, fmt2, fuse, tiles, split_k: true, rope: RopeShape::NONE, cfg: self }
    }
}

/// A product stage's build-time description ([`StepCfg::stage`]): its
/// formats, fusions, K tiles and RoPE epilogue, whether it splits along K,
/// and the step's settings.
#[derive(Clone, Copy, Debug)]
pub struct StageSpec {
    /// The format of the layers whose `alt` bit is clear.
    pub fmt: StageFormat,
    /// The format of the others.
    pub fmt2: StageFormat,
    /// The fusions.
    pub fuse: Fuse,
    /// K tiles of a stacked product.
    pub tiles: usize,
    /// Tasks of one K tile where the product does not stack.
    pub split_k: bool,
    /// The RoPE epilogue of a stacked QKV product ([`RopeShape::NONE`]: none).
    pub rope: RopeShape,
    /// The step's settings.
    pub cfg: StepCfg,
}

impl StageSpec {
    /// The same stage with the RoPE epilogue `rope`.
    pub const fn with_rope(self, rope: RopeShape) -> StageSpec {
        StageSpec { rope, ..self }
    }

    /// The same stage, one task per output tile over all of K.
    pub const fn unsplit(self) -> StageSpec {
        StageSpec { split_k: false, ..self }
    }
}

/// Where a product stage sits in the step, a group of tensors: its tasks
/// wait until stage counter `wait` reaches `target`, count each finished
/// output tile in counter `done`, and start at `offset` in the rotation of
/// [`first_task`].
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    /// The counter the tasks wait on.
    pub wait: Tensor,
    /// The count they wait for.
    pub target: Tensor,
    /// The counter of finished output tiles.
    pub done: Tensor,
    /// The stage's place in the task rotation.
    pub offset: Tensor,
}

/// A product's activations and shape, a group of tensors: input `x` (`k`
/// columns), the norm weights `nw` (read with a norm prologue), output
/// `out` (`n` columns; with SiLU-mul, the weights have `2 n` rows).
#[derive(Clone, Copy, Debug)]
pub struct Operands {
    /// The input rows.
    pub x: Tensor,
    /// The norm weights.
    pub nw: Tensor,
    /// The output rows.
    pub out: Tensor,
    /// Output columns.
    pub n: Tensor,
    /// Input columns.
    pub k: Tensor,
}

/// Rows of the multi-row norm statistic computed together
/// ([`rms_rstd_live_rows`], each row one tile of the next power of two of
/// its columns): every product task recomputes the statistic of the
/// batch's rows, at an arithmetic cost per row, so a batch of `m` rows pays
/// for `ceil(m / 2) * 2` of them instead of the tile's 16.
const LIVE_ROWS_CHUNK: usize = 2;

/// Asks L2 for the `bytes` bytes at `base` (a byte pointer), this program's
/// share of them: lines of 128 bytes, 64 lines per program in turn.
#[kernel_fn]
pub fn prefetch_share(base: Tensor, bytes: Tensor) {
    let lines = (bytes + 127) / 128;
    for c in range(program_id(0) * 64, lines, num_programs(0) * 64) {
        let off = (c + arange(0, 64)) * 128;
        prefetch_l2(base + off, mask = off < bytes);
    }
}

/// With `on`, records the clock as this program's entry `idx` of its row
/// of `trace` (`stride` entries per program; see [`decode_step`]'s
/// `TRACE`).
#[kernel_fn]
pub fn mark(trace_ptr: Tensor, idx: Tensor, stride: usize, on: bool) {
    if on {
        store(trace_ptr + program_id(0) * stride + idx, globaltimer());
    }
}

/// The norm statistic ([`rms_rstd`]) of the row of `k <= block` elements
/// at `x_ptr`, read as one tile of `block` columns.
#[kernel_fn]
pub fn row_rstd(x_ptr: Tensor, k: Tensor, eps: Tensor, block: usize) -> Tensor {
    let cols = arange(0, block);
    let row = load(x_ptr + cols, mask = cols < k, other = 0.0).to(f32);
    rms_rstd(row, k, eps, block)
}

/// The norm statistic of each of the `io.m` rows of `x` (`k` columns, at
/// most `cfg.norm_block`) into `io.rstd`, one task per row, as
/// tasks appended to the stage that writes `x`: each waits until that
/// stage's counter `idx` reaches `target` (its own tasks), stores its row's
/// statistic ([`rms_rstd`], the same bits as every other form of it) and
/// adds one to the same counter, so the stage that reads `x` waits for
/// `target + m`. A task runs on program `(t + offset) % num_programs`.
/// With rows spread over programs this costs about one row's statistic,
/// where each product task's prologue would compute every row's. With
/// `cfg.trace` a task records its phases as a product task does (its
/// statistic as the prologue, no products).
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn row_stats(
    x_ptr: Tensor,
    #[tensors] io: StepIo,
    idx: Tensor,
    target: Tensor,
    offset: Tensor,
    k: Tensor,
    cfg: StepCfg,
) {
    let (n_marks, trace) = (cfg.n_marks, cfg.trace);
    let width = TRACE_PHASES * n_marks;
    for t in range(first_task(offset), io.m, num_programs(0)) {
        wait_until(io.stage + idx, "ge", target);
        mark(io.trace, idx + n_marks as i32, width, trace);
        store(io.rstd + t, row_rstd(x_ptr + t * k, k, io.eps, cfg.norm_block));
        mark(io.trace, idx + 2 * n_marks as i32, width, trace);
        mark(io.trace, idx + 3 * n_marks as i32, width, trace);
        atomic_add(io.stage + idx, 1, sem = "release");
    }
}

/// The count a normed product stage waits for: its input stage's outputs
/// `done`, plus its `m` [`row_stats`] tasks where the step has them.
#[kernel_fn]
pub fn with_rows(done: Tensor, m: Tensor, shared_stats: bool) -> Tensor {
    if shared_stats { done + m } else { done }
}

/// The first task of this program in a stage whose task `t` runs on
/// program `(t + offset) % num_programs` (stages start where the previous
/// one ended, so a program's next task is rarely right after its last one
/// and its weight loads go out early).
#[kernel_fn]
pub fn first_task(offset: Tensor) -> Tensor {
    let np = num_programs(0);
    (program_id(0) + np - offset % np) % np
}

/// `a`, or `b` where bit `bit` of `alt` is set: a count of a stage whose
/// layers' matrices come in two formats (see [`stage_linear`]).
#[kernel_fn]
pub fn by_format(alt: Tensor, bit: i32, a: Tensor, b: Tensor) -> Tensor {
    where_((alt >> bit & 1) != 0, b, a)
}

/// Output tiles of `block_n` rows of a product with `rows` weight rows.
#[kernel_fn]
pub fn count_tiles(rows: Tensor, block_n: usize) -> Tensor {
    (rows + (block_n as i32 - 1)) / block_n as i32
}

/// A product stage's weight format and tiling: the [`QuantFormat`], the
/// output tile height `block_n` and, for a stacked product, the K tiles
/// per `dot` (`stack`; 0: split along K), as [`StackedShape::stacked_shape`]
/// gives them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StageFormat {
    quant: QuantFormat,
    block_n: usize,
    stack: usize,
    pack: usize,
}

impl StageFormat {
    /// The format.
    pub const fn quant(self) -> QuantFormat {
        self.quant
    }

    /// Output tile height.
    pub const fn block_n(self) -> usize {
        self.block_n
    }

    /// Stacked K tiles (slots) per `dot` (0: split along K).
    pub const fn stack(self) -> usize {
        self.stack
    }

    /// Output blocks of `block_n` rows per task (more than one in a packed
    /// stacked tile, see [`crate::dequant::stacked::StackedShape::stacked_tiling`]).
    pub const fn pack(self) -> usize {
        self.pack
    }

    /// Output rows per task: the count of a stage's tiles.
    pub const fn task_rows(self) -> usize {
        self.block_n * self.pack
    }
}

/// The persistent step's [`StageFormat`] of a product in a format.
pub trait StageShape {
    /// The tiling of a product of `rows` weight rows and `k` columns:
    /// stacked for `stack_rows` activation rows (see
    /// [`StackedShape::stacked_shape`]) in the word-tiled formats, otherwise
    /// split along K into tiles of 64 rows (Q8_0, or with `tall`) or 32.
    /// Tile heights decide only which program computes which output, not
    /// the arithmetic.
    fn stage_format(self, stack_rows: usize, rows: usize, k: usize, tall: bool) -> StageFormat;
}

impl StageShape for QuantFormat {
    fn stage_format(self, stack_rows: usize, rows: usize, k: usize, tall: bool) -> StageFormat {
        let split = if tall || self == QuantFormat::Q8_0 { 64 } else { 32 };
        let (stack, block_n, pack) = self.stacked_tiling(stack_rows, rows, k, split);
        StageFormat { quant: self, block_n, stack, pack }
    }
}

/// One product stage: `out = x @ W^T` (with the fusions) of the layer's
/// words and scales `w` ([`at_layer`]) and the [`Operands`], as tasks of one
/// output tile and (with `split_k`) one K tile, each waiting until counter
/// `sched.wait` reaches `sched.target`, each finished output tile counted
/// in counter `sched.done` ([`Schedule`]). The stage's build-time side is
/// `spec` ([`StageSpec`]): with `norm`, the prologue's statistic is taken
/// per row of `x` (one row with `one_row`). With `stack > 0` (one row, a
/// word-tiled format) each task is one output tile over all `tiles` K
/// tiles, `stack` of them per `dot` ([`stacked_sums`]), and `split_k` is
/// not read; then with `rope` on (a QKV product) the tile ends in
/// [`rope_pairs`] instead of a store: Q to `out`, K and V to the caches of
/// `io` at the slot at `io.slot`, rotated for the position at `io.pos`
/// (both read before the wait; with `rope` off these and the caches are
/// not read). With `trace`, each task writes its wait-exit, prologue and
/// products readings (entries `sched.done` plus 1, 2 and 3 times `n_marks`
/// in rows of `TRACE_PHASES * n_marks`, see [`super::decode_step`]'s
/// `TRACE`).
///
/// The stage's matrices are in format `fmt` (with its tile height and
/// stack), or in `fmt2` in layers where `alt` is not zero (a runtime value:
/// llama.cpp's mixed quantizations pick some matrices' formats per layer):
/// the tasks are built once per format, each under an `if` on `alt`. With
/// `fmt2 == fmt` they are built once and `alt` is not read.
#[kernel_fn]
pub fn stage_linear(
    w: (Tensor, Tensor),
    #[tensors] ops: Operands,
    #[tensors] sched: Schedule,
    alt: Tensor,
    spec: StageSpec,
    #[tensors] io: StepIo,
) {
    // The groups' members, under the names the tasks use.
    let (q_ptr, s_ptr) = w;
    let (x_ptr, nw_ptr, out_ptr, n, k) = (ops.x, ops.nw, ops.out, ops.n, ops.k);
    let (wait_idx, wait_target, done_idx, offset) = (sched.wait, sched.target, sched.done, sched.offset);
    let (ws_ptr, cnt_ptr, stage_ptr, trace_ptr, m, eps) = (io.ws, io.cnt, io.stage, io.trace, io.m, io.eps);
    let (pos_ptr, slot_ptr, theta, k_cache, v_cache) = (io.pos, io.slot, io.theta, io.k_cache, io.v_cache);
    let (fmt, fmt2, fuse, tiles, split_k, rope) =
        (spec.fmt, spec.fmt2, spec.fuse, spec.tiles, spec.split_k, spec.rope);
    let cfg = spec.cfg;
    let (f16_ops, one_row, dt, norm_block, n_marks, trace) =
        (cfg.f16_ops, cfg.one_row, cfg.dt, cfg.norm_block, cfg.n_marks, cfg.trace);
    // Activation rows of a stacked tile (1: one row; more: `m` of them live).
    let srows = cfg.stack_rows;
    let n_formats = if fmt2 == fmt { 1 } else { 2 };
    for j in 0..n_formats {
        let f = if j == 0 { fmt } else { fmt2 };
        // With one format the condition is a constant and the `if` folds away.
        let mine = if n_formats == 1 {
            full([], 1, i1)
        } else if j == 0 {
            alt == 0
        } else {
            alt != 0
        };
        if mine {
            let (quant, block_n, stack, pack) = (f.quant(), f.block_n(), f.stack(), f.pack());
            static_assert(pack == 1 || !rope.on(), "a RoPE epilogue takes unpacked tiles");
            let bk = LINEAR_BLOCK_K as i32;
            let rows = if fuse.silu() { n * 2 } else { n };
            let tiles_n = count_tiles(rows, f.task_rows());
            let split_k = split_k && stack == 0;
            let tiles_k = if split_k { (k + (bk - 1)) / bk } else { full([], 1, i32) };
            let zero = full([], 0, i32);
            let np = num_programs(0);
            let n_tasks = tiles_n * tiles_k;
            // RoPE is an epilogue of the stacked tile only.
            let rope = if stack > 0 { rope } else { RopeShape::NONE };
            let t0 = first_task(offset);
            for t in range(t0, n_tasks, np) {
                // The task's weights go out before its wait (the weights are never
                // written by the step).
                let (wrow, wd, sr, wd_tail, sr_tail) = if stack > 0 {
                    let wrow = stacked_rows(t, rows, block_n, stack, pack, tiles);
                    let cycle = if pack > 1 { tiles } else { 0 };
                    let (wd, sr) =
                        stacked_load(q_ptr, s_ptr, wrow, zero, cycle, k / 32, quant, block_n, stack);
                    (wrow, wd, sr, wd, sr)
                } else {
                    let (wd, sr, wd_tail, sr_tail) =
                        task_weights(q_ptr, s_ptr, t, tiles_k, rows, k, quant, split_k, block_n);
                    (zero, wd, sr, wd_tail, sr_tail)
                };
                let pid_n = t / tiles_k;
                let pid_k = t % tiles_k;
                // Of several rows, each row's (`[rows, 1]`; rows past `m`
                // repeat row `m - 1`, as the stacked sums do).
                let (pos, slot) = if !rope.on() {
                    (eps, zero)
                } else if srows > 1 {
                    let b = minimum(arange(0, srows as i32), m - 1);
                    (expand_dims(load(pos_ptr + b).to(f32), 1), expand_dims(load(slot_ptr + b), 1))
                } else {
                    (load(pos_ptr).to(f32), load(slot_ptr))
                };
                wait_until(stage_ptr + wait_idx, "ge", wait_target);
                let width = TRACE_PHASES * n_marks;
                mark(trace_ptr, done_idx + n_marks as i32, width, trace);
                let rs = if !fuse.norm() {
                    eps
                } else if cfg.shared_stats {
                    // Rows past `m` repeat row `m - 1`'s, as the live-rows
                    // statistic's entries do.
                    let held = if stack > 0 { srows } else { MAX_ROWS };
                    let rs = load(io.rstd + minimum(arange(0, held as i32), m - 1));
                    if stack > 0 { rs } else { expand_dims(rs, 1) }
                } else if one_row {
                    row_rstd(x_ptr, k, eps, norm_block)
                } else if stack > 0 && srows == 2 {
                    // Two rows as two one-row statistics (the same bits as
                    // the live-rows loop): no loop, both rows' loads out
                    // at once.
                    let cols = arange(0, norm_block);
                    let row0 = load(x_ptr + cols, mask = cols < k, other = 0.0).to(f32);
                    let row1 =
                        load(x_ptr + minimum(m - 1, 1) * k + cols, mask = cols < k, other = 0.0).to(f32);
                    let (r0, r1) = (rms_rstd(row0, k, eps, norm_block), rms_rstd(row1, k, eps, norm_block));
                    where_(arange(0, 2) == 0, r0, r1)
                } else if stack > 0 {
                    rms_rstd_live_rows(x_ptr, m, k, eps, srows, LIVE_ROWS_CHUNK, norm_block)
                } else {
                    expand_dims(
                        rms_rstd_live_rows(x_ptr, m, k, eps, MAX_ROWS, LIVE_ROWS_CHUNK, norm_block),
                        1,
                    )
                };
                // A stacked tile's residual goes out now, so its latency
                // hides behind the tile's products instead of following them.
                let res_on = t * block_n as i32 + arange(0, block_n as i32);
                let early = stack > 0 && pack == 1 && fuse.residual() && !rope.on();
                let res = if !early {
                    eps
                } else if srows > 1 {
                    let (at, ok) = rows_at(res_on, m, n, srows);
                    load(out_ptr + at, mask = ok, other = 0.0)
                } else {
                    load(out_ptr + res_on, mask = res_on < n, other = 0.0)
                };
                mark(trace_ptr, done_idx + 2 * n_marks as i32, width, trace);
                let fin = if pack > 1 {
                    packed_sums(
                        x_ptr, nw_ptr, ws_ptr, k, m, rs, wd, sr, block_n, stack, pack, tiles, srows, quant,
                        fuse, f16_ops, dt,
                    );
                    mark(trace_ptr, done_idx + 3 * n_marks as i32, width, trace);
                    packed_epilogue(ws_ptr, out_ptr, m, n, t, fuse, dt, block_n, stack, pack, tiles, srows);
                    full([], 1, i1)
                } else if stack > 0 {
                    let (sums, odd) = stacked_sums(
                        x_ptr,
                        q_ptr,
                        s_ptr,
                        nw_ptr,
                        ws_ptr,
                        k,
                        m,
                        rs,
                        wrow,
                        wd,
                        sr,
                        quant,
                        fuse,
                        f16_ops,
                        dt,
                        block_n,
                        stack,
                        tiles,
                        srows,
                        rope.on(),
                    );
                    mark(trace_ptr, done_idx + 3 * n_marks as i32, width, trace);
                    if rope.on() {
                        // `sums` holds the even rows; of several rows, each
                        // row's Q goes to its row of `out` (rows past `m`
                        // store row `m - 1`'s values again).
                        let even = t * block_n as i32 + arange(0, (block_n / 2) as i32) * 2;
                        let (r, q_out) = if srows > 1 {
                            let b = minimum(arange(0, srows as i32), m - 1);
                            let q_cols = (rope.n_q() * rope.head_dim()) as i32;
                            (expand_dims(even, 0), out_ptr + expand_dims(b * q_cols, 1))
                        } else {
                            (even, out_ptr)
                        };
                        rope_pairs(
                            sums,
                            odd,
                            r,
                            n,
                            pos,
                            theta,
                            slot,
                            q_out,
                            k_cache,
                            v_cache,
                            rope.n_q(),
                            rope.n_kv(),
                            rope.head_dim(),
                            dt,
                        );
                    } else if early {
                        // `linear_epilogue`'s residual sum, on the loaded residual.
                        if srows > 1 {
                            let (at, ok) = rows_at(res_on, m, n, srows);
                            store(out_ptr + at, residual_sum(sums, res, dt), mask = ok);
                        } else {
                            store(out_ptr + res_on, residual_sum(sums, res, dt), mask = res_on < n);
                        }
                    } else {
                        stacked_epilogue(sums, out_ptr, m, n, t, zero, fuse, dt, block_n, srows);
                    }
                    full([], 1, i1)
                } else {
                    let fin = linear_tile(
                        x_ptr, q_ptr, s_ptr, nw_ptr, out_ptr, ws_ptr, cnt_ptr, m, n, n, k, rs, wd, sr,
                        wd_tail, sr_tail, zero, pid_n, pid_k, tiles_n, tiles_k, quant, fuse, split_k,
                        f16_ops, dt, MAX_ROWS, block_n, 1,
                    );
                    mark(trace_ptr, done_idx + 3 * n_marks as i32, width, trace);
                    fin
                };
                if fin {
                    atomic_add(stage_ptr + done_idx, 1, sem = "release");
                }
            }
        };
    }
}

/// The offsets and the mask of columns `cols` in the first `m` of `rows`
/// rows of `n` columns (`[rows, len(cols)]`; row `r` at `r * n`).
#[kernel_fn]
fn rows_at(cols: Tensor, m: Tensor, n: Tensor, rows: usize) -> (Tensor, Tensor) {
    let r = expand_dims(arange(0, rows as i32), 1);
    (r * n + expand_dims(cols, 0), r < m && expand_dims(cols < n, 0))
}

/// The weight words and scales of product task `t` ([`tile_load`]): its
/// K tile (split) or the first and the last partial K tile of its output
/// tile (unsplit; the loop of [`linear_tile`] loads the others).
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn task_weights(
    q_ptr: Tensor,
    s_ptr: Tensor,
    t: Tensor,
    tiles_k: Tensor,
    rows: Tensor,
    k: Tensor,
    quant: QuantFormat,
    split_k: bool,
    block_n: usize,
) -> (Tensor, Tensor, Tensor, Tensor) {
    let bk = LINEAR_BLOCK_K as i32;
    let nb = k / 32;
    let wrow = minimum(t / tiles_k * block_n + arange(0, block_n), rows - 1);
    if split_k {
        let (wd, sr) = tile_load(q_ptr, s_ptr, wrow, nb, t % tiles_k * bk, quant, block_n);
        (wd, sr, wd, sr)
    } else {
        let (wd, sr) = tile_load(q_ptr, s_ptr, wrow, nb, full([], 0, i32), quant, block_n);
        let (wt, st) = tile_load(q_ptr, s_ptr, wrow, nb, k / bk * bk, quant, block_n);
        (wd, sr, wt, st)
    }
}

/// Asks L2 for the cached keys and values `from..len` of KV head `h` of
/// a sequence with block table `bt` (one line per token and head: the
/// layout of [`crate::decode_attention`]).
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn prefetch_kv(
    k_cache: Tensor,
    v_cache: Tensor,
    bt: Tensor,
    from: Tensor,
    len: Tensor,
    h: Tensor,
    h_kv: usize,
    head_dim: usize,
    page: usize,
    kv8: bool,
) {
    for c0 in range(from, len, 128) {
        let tok = c0 + arange(0, 128);
        let ok = tok < len;
        let blk = load(bt + tok / page, mask = ok, other = 0);
        if kv8 {
            // A head's bytes and its scales ([`crate::kv_cache`]).
            let slot = where_(ok, blk * page + tok % page, 0);
            let at = kv8_slot(slot, h_kv, head_dim) + h * head_dim;
            let (k8, v8) = (ptrcast(k_cache, u8), ptrcast(v_cache, u8));
            prefetch_l2(k8 + at, mask = ok);
            prefetch_l2(v8 + at, mask = ok);
            let sc = kv8_scale_index(slot, h, h_kv, head_dim);
            prefetch_l2(ptrcast(k_cache, f32) + sc, mask = ok);
            prefetch_l2(ptrcast(v_cache, f32) + sc, mask = ok);
        } else {
            let row = (blk * page + tok % page) * (h_kv * head_dim) + h * head_dim;
            prefetch_l2(k_cache + row, mask = ok);
            prefetch_l2(v_cache + row, mask = ok);
        }
    }
}

/// This program's share of layer `l`'s projection weights, asked of L2:
/// all four kinds (`part` 0), QKV and O (1), or gate/up and down (2);
/// nothing when `l` is past the model's `n_layers`.
#[kernel_fn]
pub fn prefetch_layer(
    #[tensors] qkv: Planes,
    #[tensors] o: Planes,
    #[tensors] gu: Planes,
    #[tensors] dn: Planes,
    l: Tensor,
    n_layers: usize,
    part: usize,
) {
    // At most one trip: layer `l` if it exists.
    for l in range(l, minimum(l + 1, n_layers as i32)) {
        if part != 2 {
            prefetch_planes(qkv, l);
            prefetch_planes(o, l);
        }
        if part != 1 {
            prefetch_planes(gu, l);
            prefetch_planes(dn, l);
        }
    }
}

/// This program's share of layer `l`'s words and scales of `p`, asked of L2.
#[kernel_fn]
pub fn prefetch_planes(#[tensors] p: Planes, l: Tensor) {
    prefetch_share(p.q + l * p.qs, p.qs);
    prefetch_share(ptrcast(p.s + l * p.ss, u8), p.ss * 2);
}
