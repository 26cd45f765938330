//! The one-row batch-invariant product with all of its K tiles in one
//! `dot`: the persistent decode step's single-row products
//! ([`crate::decode_step`]) take a whole output tile over all of K per task
//! this way, with no split-K hand-over.
//!
//! # Math
//!
//! [`super::linear`]'s product of a row is the K-ordered sum of one `dot`
//! per 128-column K tile, each from a zero accumulator: `y = ((0 + p_0) +
//! p_1) + ...` with `p_t = x[t*128 ..] . w[.., t*128 ..]` as a chain of
//! `mma` steps. A tensor-core `dot`'s element `(i, j)` depends only on row
//! `i` of its left operand, column `j` of its right one and the chain, so
//! the `p_t` of up to 16 K tiles come out of one `dot`: row `t` of the left
//! operand is the row's activations of K tile `t` (operand-rounded as
//! `linear` rounds them, columns past K zero), and the right operand stacks
//! the weight tiles side by side (column `t * block_n + j` is weight row
//! `j` of the output tile at K tile `t`). The diagonal blocks `(t, t)` of
//! the result are the `p_t`, bit for bit; the other blocks are discarded.
//! Each `p_t` is taken out by a masked sum (one value and zeros, exact) and
//! added to the f32 result in K order from zero, as
//! [`super::linear::split_finish`] adds the split form's tile products.
//!
//! # Tiling
//!
//! A dot covers `stack` K tiles (a power of two, at most 16, the height of
//! one `mma` tile); a K axis of more tiles takes several dots in order, the
//! next one's weight words issued before the current one is multiplied.
//! Weight rows past the matrix are clamped to its last row and quant
//! blocks past a row to its last block (valid addresses; their products
//! are never taken out or meet zero activations), as in [`super::linear`].
//! Word-tiled formats only ([`QuantFormat::gpu_kernels`]), and f16
//! (tensor-core) operands only: the claim above is the `mma` chain's; the
//! GPU's FMA `dot` (f32 operands) orders its sum along K by its tile's
//! shape, so a stacked f32 product differs from the split one there (the
//! interpreter, which rounds each element once, cannot tell them apart).

use super::gemm::swap_weights;
use super::gemv::scale_load;
#[cfg(doc)]
use super::linear::linear_epilogue;
use super::linear::{LINEAR_BLOCK_K, linear_operand};
use super::{Fuse, QuantFormat};
use dsl_core::DType;
use dsl_macros::kernel_fn;

/// The most weight rows one stacked `dot` takes (`stack * block_n`): its
/// dequantized operand is what a program's registers hold beside the rest
/// of the persistent step.
pub const STACKED_MAX_ROWS: usize = 128;

/// The fewest weight rows one stacked `dot` takes: with the persistent
/// step's four warps a 16-row `dot` runs on tensor cores only when its
/// columns are a multiple of 32 (one 8-column n tile per warp at least);
/// a narrower one would run on FMA, whose order along K differs.
pub const STACKED_MIN_ROWS: usize = 32;

/// The output tiles a stacked product stage is cut into at most, while its
/// tiles have at least 4 rows: about the programs of a Hopper grid of the
/// persistent step (two per SM), so that the stage runs in one round.
pub const STACKED_TASKS: usize = 256;

/// The task shape of a persistent-step product in a format: the kernels
/// call it on their constexpr format (a method, so it is decided while the
/// kernel is built).
pub trait StackedShape {
    /// `(stack, block_n)` of a one-row product on f16 operands (`one_row`:
    /// the caller's one-row and tensor-core condition) of `rows` weight
    /// rows and `k` columns; `(0, split_block_n)` where it runs split:
    /// formats other than the word-tiled ones, and shapes whose dot would
    /// exceed [`STACKED_MAX_ROWS`]. `stack` is the next power of two of the
    /// K tiles (at most 16); `block_n` the smallest power of two from 4
    /// (and from [`STACKED_MIN_ROWS`]` / stack`) that cuts the rows into at
    /// most [`STACKED_TASKS`] tiles.
    fn stacked_shape(self, one_row: bool, rows: usize, k: usize, split_block_n: usize) -> (usize, usize);

    /// Whether [`StackedShape::stacked_shape`] stacks the product.
    fn stacks(self, one_row: bool, rows: usize, k: usize) -> bool
    where
        Self: Sized,
    {
        self.stacked_shape(one_row, rows, k, 0).0 > 0
    }
}

impl StackedShape for QuantFormat {
    fn stacked_shape(self, one_row: bool, rows: usize, k: usize, split_block_n: usize) -> (usize, usize) {
        let tiles = k.div_ceil(LINEAR_BLOCK_K);
        let stack = tiles.next_power_of_two().min(16);
        let mut block_n = (STACKED_MIN_ROWS / stack).max(4);
        while rows.div_ceil(block_n) > STACKED_TASKS {
            block_n *= 2;
        }
        if one_row && self.gpu_kernels() && stack * block_n <= STACKED_MAX_ROWS {
            (stack, block_n)
        } else {
            (0, split_block_n)
        }
    }
}

/// The scratch entries a program of the persistent step needs for a
/// product stacked as `(stack, block_n)` over `k` columns.
pub const fn stacked_slot(stack: usize, block_n: usize, k: usize) -> usize {
    k.div_ceil(LINEAR_BLOCK_K).div_ceil(stack) * stack * block_n
}

/// The weight rows `wrow` (`[stack * block_n]`) of a stacked tile for output
/// tile `pid_n` (`block_n` rows; rows past `rows` clamped to the last).
#[kernel_fn]
pub fn stacked_rows(pid_n: Tensor, rows: Tensor, block_n: usize, stack: usize) -> Tensor {
    let r = arange(0, (stack * block_n) as i32);
    minimum(pid_n * block_n as i32 + r % block_n as i32, rows - 1)
}

/// The quant words and raw scale entries of a stacked weight tile
/// (`[stack * block_n, LINEAR_BLOCK_K]`, [`super::linear::tile_index`]'s
/// layout per row): row `r` is weight row `wrow[r]` at K tile `c0 + r /
/// block_n` (quant blocks past the row clamped to its last block).
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn stacked_load(
    q_ptr: Tensor,
    s_ptr: Tensor,
    wrow: Tensor,
    c0: Tensor,
    nb: Tensor,
    quant: QuantFormat,
    block_n: usize,
    stack: usize,
) -> (Tensor, Tensor) {
    let rows = stack * block_n;
    let hq = LINEAR_BLOCK_K / 16;
    let wpb = if quant.is_q4() { 4 } else { 8 };
    let h = expand_dims(arange(0, hq as i32), 0);
    let kt = c0 + arange(0, rows as i32) / block_n as i32;
    // Block of each 16-column group, counted from the plane's start.
    let tile_blocks = minimum(expand_dims(kt * (LINEAR_BLOCK_K as i32 / 32), 1) + h / 2, nb - 1);
    let blk = expand_dims(wrow * nb, 1) + tile_blocks;
    let half_words = if quant.is_q4() { h * 0 } else { h % 2 * 4 };
    let word3 = expand_dims(blk * wpb + half_words, 2) + expand_dims(expand_dims(arange(0, 4), 0), 0);
    let w_idx = reshape(broadcast_to(expand_dims(word3, 3), [rows, hq, 4, 4]), [rows, LINEAR_BLOCK_K]);
    let s_idx = reshape(broadcast_to(expand_dims(blk, 2), [rows, hq, 16]), [rows, LINEAR_BLOCK_K]);
    let wd = load(ptrcast(q_ptr, i32) + w_idx);
    (wd, scale_load(s_ptr, s_idx, full([], 1, i1), quant))
}

/// The f32 row sums of one output tile (`block_n` weight rows) of the
/// one-row product `x @ W^T` over all `tiles` K tiles (see the module doc),
/// before an epilogue ([`linear_epilogue`]'s fusions, or RoPE's): the
/// tile's `[block_n]` sums, or with `pairs` its even rows' and its odd
/// rows' (`[block_n / 2]` each; the same sums, read from the scratch in two
/// strided halves, for epilogues that take rows in pairs; without `pairs`
/// the second result repeats the first). `wrow` are its weight rows
/// ([`stacked_rows`]), `wd0`/`sr0` the first dot's weights
/// ([`stacked_load`] at K tile 0), `rs` the norm statistic. Program `p`'s
/// scratch is slot `p` of `ws` ([`stacked_slot`] entries each).
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn stacked_sums(
    x_ptr: Tensor,
    q_ptr: Tensor,
    s_ptr: Tensor,
    nw_ptr: Tensor,
    ws_ptr: Tensor,
    k: Tensor,
    rs: Tensor,
    wrow: Tensor,
    wd0: Tensor,
    sr0: Tensor,
    quant: QuantFormat,
    fuse: Fuse,
    f16_ops: bool,
    dt: DType,
    block_n: usize,
    stack: usize,
    tiles: usize,
    pairs: bool,
) -> (Tensor, Tensor) {
    let bk = LINEAR_BLOCK_K as i32;
    let width = stack * block_n;
    let slot = program_id(0) * (block_n * tiles.div_ceil(stack) * stack) as i32;
    // The dot's rows (one per K tile of the chunk), the tile's columns, and
    // which columns of the result hold each row's own K tile.
    let t16 = expand_dims(arange(0, 16), 1);
    let c = expand_dims(arange(0, bk), 0);
    let cols = expand_dims(arange(0, width as i32), 0);
    let own = t16 == cols / block_n as i32;
    // The rows each sum reads back: all of them, or the even ones and the
    // odd ones.
    let (j, j2) = if pairs {
        let e = arange(0, (block_n / 2) as i32) * 2;
        (e, e + 1)
    } else {
        let a = arange(0, block_n as i32);
        (a, a)
    };
    let nib = broadcast_to(if quant.is_q4() { c / 16 % 2 * 4 } else { c * 0 }, [width, LINEAR_BLOCK_K]);
    let e8 = broadcast_to(c % 4 * 8, [width, LINEAR_BLOCK_K]);
    let mut wd = wd0;
    let mut sr = sr0;
    let mut acc = zeros([if pairs { block_n / 2 } else { block_n }], f32);
    let mut acc2 = acc;
    for c0 in static_range(0, tiles, stack) {
        let (wd_next, sr_next) = if c0 + stack < tiles {
            stacked_load(
                q_ptr,
                s_ptr,
                wrow,
                full([], (c0 + stack) as i32, i32),
                k / 32,
                quant,
                block_n,
                stack,
            )
        } else {
            (wd, sr)
        };
        let col = (t16 + c0 as i32) * bk + c;
        let ok = t16 < stack as i32 && col < k;
        let xa = load(x_ptr + col, mask = ok, other = 0.0);
        let nw = if fuse.norm() { load(nw_ptr + col, mask = ok, other = 0.0) } else { xa };
        let xv = where_(ok, linear_operand(xa, nw, rs, fuse.norm(), f16_ops, dt), 0.0);
        let w = swap_weights(wd, nib, e8, sr, quant);
        let wv = if f16_ops { w.to(f16) } else { w };
        let d = dot(xv, trans(wv), zeros([16, width], f32));
        // The diagonal blocks to this program's scratch, read back in K
        // order after a barrier. Each dot of the task has its own region;
        // the program's next task writes the slot only after its own dot,
        // whose operand staging waits at a CTA barrier for every thread,
        // so no thread overwrites a value another has yet to read.
        let base = ws_ptr + slot + (c0 / stack * width) as i32;
        store(base + broadcast_to(cols, [16, width]), d, mask = own);
        barrier();
        for t in static_range(0, stack.min(tiles - c0)) {
            acc = acc + load(base + (t * block_n) as i32 + j);
            if pairs {
                acc2 = acc2 + load(base + (t * block_n) as i32 + j2);
            }
        }
        wd = wd_next;
        sr = sr_next;
    }
    (acc, acc2)
}
