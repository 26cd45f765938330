//! The persistent step's task bodies and the helpers its stages share: a
//! product stage's tasks ([`stage_linear`]), the first task and the tile
//! count of a stage, the L2 prefetches of the next layer's weights and of
//! a sequence's cached keys and values, and the trace marks.

use super::{MAX_ROWS, TRACE_PHASES};
use crate::dequant::linear::{LINEAR_BLOCK_K, linear_epilogue, linear_tile, residual_sum, tile_load};
use crate::dequant::stacked::{
    StackedShape, packed_epilogue, packed_sums, stacked_load, stacked_rows, stacked_sums,
};
use crate::dequant::{Fuse, QuantFormat};
use crate::kv_cache::kv8_slot;
use crate::rmsnorm::{rms_rstd, rms_rstd_rows};
use crate::rope::{RopeShape, rope_pairs};
use dsl_core::DType;
use dsl_macros::kernel_fn;

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
    /// stacked for one row (`one_row`) in the word-tiled formats, otherwise
    /// split along K into tiles of 64 rows (Q8_0, or with `tall`) or 32.
    /// Tile heights decide only which program computes which output, not
    /// the arithmetic.
    fn stage_format(self, one_row: bool, rows: usize, k: usize, tall: bool) -> StageFormat;
}

impl StageShape for QuantFormat {
    fn stage_format(self, one_row: bool, rows: usize, k: usize, tall: bool) -> StageFormat {
        let split = if tall || self == QuantFormat::Q8_0 { 64 } else { 32 };
        let (stack, block_n, pack) = self.stacked_tiling(one_row, rows, k, split);
        StageFormat { quant: self, block_n, stack, pack }
    }
}

/// One product stage: `out = x @ W^T` (with the fusions) as tasks of one
/// output tile and (with `split_k`) one K tile, each waiting until counter
/// `wait_idx` reaches `wait_target`, each finished output tile counted in
/// counter `done_idx`. With `norm`, the prologue's statistic is taken per
/// row of `x` (one row with `one_row`). With `stack > 0` (one row, a
/// word-tiled format) each task is one output tile over all `tiles` K tiles,
/// `stack` of them per `dot` ([`stacked_sums`]), and `split_k` is not read;
/// then with `rope` on (a QKV product) the tile ends in [`rope_pairs`]
/// instead of a store: Q to `out`, K and V to the caches at the slot of
/// `slot_ptr`, rotated for the position at `pos_ptr` (both read before the
/// wait; with `rope` off these and the caches are not read). With `trace`,
/// each task writes its wait-exit, prologue and products readings (entries
/// `done_idx` plus 1, 2 and 3 times `n_marks` in rows of
/// `TRACE_PHASES * n_marks`, see [`super::decode_step`]'s `TRACE`).
///
/// The stage's matrices are in format `fmt` (with its tile height and
/// stack), or in `fmt2` in layers where `alt` is not zero (a runtime value:
/// llama.cpp's mixed quantizations pick some matrices' formats per layer):
/// the tasks are built once per format, each under an `if` on `alt`. With
/// `fmt2 == fmt` they are built once and `alt` is not read.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn stage_linear(
    x_ptr: Tensor,
    q_ptr: Tensor,
    s_ptr: Tensor,
    nw_ptr: Tensor,
    out_ptr: Tensor,
    ws_ptr: Tensor,
    cnt_ptr: Tensor,
    stage_ptr: Tensor,
    wait_idx: Tensor,
    wait_target: Tensor,
    done_idx: Tensor,
    offset: Tensor,
    m: Tensor,
    n: Tensor,
    k: Tensor,
    eps: Tensor,
    fmt: StageFormat,
    fmt2: StageFormat,
    alt: Tensor,
    fuse: Fuse,
    split_k: bool,
    f16_ops: bool,
    one_row: bool,
    dt: DType,
    norm_block: usize,
    tiles: usize,
    rope: RopeShape,
    pos_ptr: Tensor,
    slot_ptr: Tensor,
    theta: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    trace_ptr: Tensor,
    n_marks: usize,
    trace: bool,
) {
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
                let (pos, slot) =
                    if rope.on() { (load(pos_ptr).to(f32), load(slot_ptr)) } else { (eps, zero) };
                wait_until(stage_ptr + wait_idx, "ge", wait_target);
                let width = TRACE_PHASES * n_marks;
                mark(trace_ptr, done_idx + n_marks as i32, width, trace);
                let rs = if !fuse.norm() {
                    eps
                } else if one_row {
                    let cols = arange(0, norm_block);
                    let row = load(x_ptr + cols, mask = cols < k, other = 0.0).to(f32);
                    rms_rstd(row, k, eps, norm_block)
                } else {
                    let offs = minimum(arange(0, MAX_ROWS), m - 1) * k;
                    expand_dims(rms_rstd_rows(x_ptr, offs, k, eps, MAX_ROWS, 256), 1)
                };
                // A stacked tile's residual goes out now, so its latency
                // hides behind the tile's products instead of following them.
                let res_on = t * block_n as i32 + arange(0, block_n as i32);
                let early = stack > 0 && pack == 1 && fuse.residual() && !rope.on();
                let res = if early { load(out_ptr + res_on, mask = res_on < n, other = 0.0) } else { eps };
                mark(trace_ptr, done_idx + 2 * n_marks as i32, width, trace);
                let fin = if pack > 1 {
                    packed_sums(
                        x_ptr, nw_ptr, ws_ptr, k, rs, wd, sr, block_n, stack, pack, tiles, quant, fuse,
                        f16_ops, dt,
                    );
                    mark(trace_ptr, done_idx + 3 * n_marks as i32, width, trace);
                    packed_epilogue(ws_ptr, out_ptr, n, t, fuse, dt, block_n, stack, pack, tiles);
                    full([], 1, i1)
                } else if stack > 0 {
                    let (sums, odd) = stacked_sums(
                        x_ptr,
                        q_ptr,
                        s_ptr,
                        nw_ptr,
                        ws_ptr,
                        k,
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
                        rope.on(),
                    );
                    mark(trace_ptr, done_idx + 3 * n_marks as i32, width, trace);
                    if rope.on() {
                        // `sums` holds the even rows.
                        let r = t * block_n as i32 + arange(0, (block_n / 2) as i32) * 2;
                        rope_pairs(
                            sums,
                            odd,
                            r,
                            n,
                            pos,
                            theta,
                            slot,
                            out_ptr,
                            k_cache,
                            v_cache,
                            rope.n_q(),
                            rope.n_kv(),
                            rope.head_dim(),
                            dt,
                        );
                    } else if early {
                        // `linear_epilogue`'s residual sum, on the loaded residual.
                        store(out_ptr + res_on, residual_sum(sums, res, dt), mask = res_on < n);
                    } else {
                        linear_epilogue(
                            reshape(sums, [1, block_n]),
                            out_ptr,
                            zero + 1,
                            n,
                            n,
                            zero,
                            t,
                            fuse,
                            dt,
                            1,
                            block_n,
                        );
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

/// Asks L2 for the first `len` cached keys and values of KV head `h` of
/// a sequence with block table `bt` (one line per token and head: the
/// layout of [`crate::decode_attention`]).
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn prefetch_kv(
    k_cache: Tensor,
    v_cache: Tensor,
    bt: Tensor,
    len: Tensor,
    h: Tensor,
    h_kv: usize,
    head_dim: usize,
    page: usize,
    kv8: bool,
) {
    for c0 in range(0, len, 128) {
        let tok = c0 + arange(0, 128);
        let ok = tok < len;
        let blk = load(bt + tok / page, mask = ok, other = 0);
        if kv8 {
            // A head's bytes and its slot's scales ([`crate::kv_cache`]).
            let at = kv8_slot(blk * page + tok % page, h_kv, head_dim);
            let (k8, v8) = (ptrcast(k_cache, u8), ptrcast(v_cache, u8));
            prefetch_l2(k8 + at + h * head_dim, mask = ok);
            prefetch_l2(v8 + at + h * head_dim, mask = ok);
            prefetch_l2(k8 + at + (h_kv * head_dim) as i32, mask = ok);
            prefetch_l2(v8 + at + (h_kv * head_dim) as i32, mask = ok);
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
#[allow(clippy::too_many_arguments)]
pub fn prefetch_layer(
    qkv_q: Tensor,
    qkv_s: Tensor,
    o_q: Tensor,
    o_s: Tensor,
    gu_q: Tensor,
    gu_s: Tensor,
    dn_q: Tensor,
    dn_s: Tensor,
    qkv_qs: Tensor,
    qkv_ss: Tensor,
    o_qs: Tensor,
    o_ss: Tensor,
    gu_qs: Tensor,
    gu_ss: Tensor,
    dn_qs: Tensor,
    dn_ss: Tensor,
    l: Tensor,
    n_layers: usize,
    part: usize,
) {
    // At most one trip: layer `l` if it exists.
    for l in range(l, minimum(l + 1, n_layers as i32)) {
        if part != 2 {
            prefetch_share(qkv_q + l * qkv_qs, qkv_qs);
            prefetch_share(ptrcast(qkv_s + l * qkv_ss, u8), qkv_ss * 2);
            prefetch_share(o_q + l * o_qs, o_qs);
            prefetch_share(ptrcast(o_s + l * o_ss, u8), o_ss * 2);
        }
        if part != 1 {
            prefetch_share(gu_q + l * gu_qs, gu_qs);
            prefetch_share(ptrcast(gu_s + l * gu_ss, u8), gu_ss * 2);
            prefetch_share(dn_q + l * dn_qs, dn_qs);
            prefetch_share(ptrcast(dn_s + l * dn_ss, u8), dn_ss * 2);
        }
    }
}
