//! The batch-invariant product of one row, or of a few, with all of its K
//! tiles in one `dot`: the persistent decode step's products of up to four
//! rows ([`crate::decode_step`]) take a whole output tile over all of K per
//! task this way, with no split-K hand-over.
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
//! The diagonal blocks go to the program's slot of the workspace (a masked
//! store, then a barrier), and each `p_t` is read back and added to the f32
//! result in K order from zero, as [`super::linear::split_finish`] adds the
//! split form's tile products. (Taking them out of the accumulator by
//! masked reductions instead made the persistent step spill; see
//! BENCHMARKS.md.)
//!
//! Several rows share the dequantized weights: with `R` rows, row `t * R +
//! r` of the left operand is row `r`'s activations of K tile `t`, and each
//! row's diagonal blocks go to its own part of the scratch, so a task of
//! `R` rows dequantizes its weight tile once and each row's sums are the
//! one-row sums bit for bit. The dot is `R` times as tall (at least the 16
//! rows of one `mma` tile, so two rows of up to 8 K tiles cost no more than
//! one).
//!
//! # Tiling
//!
//! A dot covers `stack` K tiles (a power of two, at most 16, the height of
//! one `mma` tile); a K axis of more tiles takes several dots in order, the
//! next one's weight words issued before the current one is multiplied.
//! A packed tile ([`StackedShape::stacked_tiling`]) uses the left
//! operand's rows the same way but fills the dot's slots with several
//! output blocks: slot `j` is block `j / tiles` at K tile `j % tiles`, so
//! the product taken out of slot `j` is row `j % tiles` of its columns
//! (not the diagonal), and a K of 5 tiles fills 15 of 16 slots instead of 5
//! of 8. Each block's products are summed in K order as above
//! ([`packed_sums`], [`packed_row_sums`]).
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
use super::linear::{LINEAR_BLOCK_K, linear_epilogue, linear_operand};
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

/// The most f32 results one stacked `dot` of several activation rows
/// holds (`[rows * K tiles, stack * block_n]`; 8 registers a thread at the
/// persistent step's four warps). Past it, the taller dot and the longer
/// read-back of the products cost the persistent step more than the split
/// products' hand-over (see BENCHMARKS.md): at two rows SmolLM2's QKV, O
/// and (packed) gate/up products stack and its down product (12 K tiles)
/// splits.
pub const STACKED_MAX_RESULT: usize = 1024;

/// The rows of a stacked `dot` of `stack_rows` activation rows over `span`
/// K tiles, at most 16 (row `t * stack_rows + r` is row `r`'s K tile
/// `t`): at least 16, the height of one `mma` tile.
pub const fn stacked_dot_rows(stack_rows: usize, span: usize) -> usize {
    let rows = if stack_rows > 1 { stack_rows * span } else { span };
    if rows > 16 { rows } else { 16 }
}

/// The dot width (weight rows) of a packed stacked tile (see
/// [`StackedShape::stacked_tiling`]).
pub const PACKED_ROWS: usize = 64;

/// The rows of one output block of a packed stacked tile.
pub const PACKED_BLOCK_N: usize = 4;

/// The task shape of a persistent-step product in a format: the kernels
/// call it on their constexpr format (a method, so it is decided while the
/// kernel is built).
pub trait StackedShape {
    /// `(stack, block_n)` of a product of `stack_rows` activation rows on
    /// f16 operands (`stack_rows`: the caller's row capacity, 0 where it
    /// cannot stack, e.g. without tensor cores) of `rows` weight rows and
    /// `k` columns; `(0, split_block_n)` where it runs split: formats other
    /// than the word-tiled ones, shapes whose dot would exceed
    /// [`STACKED_MAX_ROWS`] weight rows, and several rows whose results
    /// would exceed [`STACKED_MAX_RESULT`]. `stack` is the next power of two
    /// of the K tiles (at most 16); `block_n` the smallest power of two
    /// from 4 (and from [`STACKED_MIN_ROWS`]` / stack`) that cuts the rows
    /// into at most [`STACKED_TASKS`] tiles.
    fn stacked_shape(self, stack_rows: usize, rows: usize, k: usize, split_block_n: usize) -> (usize, usize);

    /// `(stack, block_n, pack)`: [`StackedShape::stacked_shape`]'s tiling,
    /// or, where its one dot would be wider than [`PACKED_ROWS`] with the
    /// dot's rows mostly past K (a K of few tiles, whose stack is rounded
    /// up to a power of two), a packed one: `pack` output blocks of
    /// [`PACKED_BLOCK_N`] rows in one dot of `stack` slots, slot `j` holding
    /// block `j / tiles` at K tile `j % tiles`. A task then covers `pack *
    /// block_n` output rows, dequantizing fewer weights past K per output
    /// row than the unpacked tile, with the same sums.
    fn stacked_tiling(
        self,
        stack_rows: usize,
        rows: usize,
        k: usize,
        split_block_n: usize,
    ) -> (usize, usize, usize)
    where
        Self: Sized + Copy,
    {
        // The unpacked tile of one row decides whether packing pays; the
        // packed dot's own size decides whether it takes `stack_rows` rows.
        let (stack, block_n) = self.stacked_shape(stack_rows.min(1), rows, k, split_block_n);
        let tiles = k.div_ceil(LINEAR_BLOCK_K);
        let slots = PACKED_ROWS / PACKED_BLOCK_N;
        let pack = slots / tiles.max(1);
        let result = stacked_dot_rows(stack_rows, tiles.next_power_of_two()) * PACKED_ROWS;
        if stack >= tiles
            && stack * block_n > PACKED_ROWS
            && pack >= 2
            && rows.div_ceil(pack * PACKED_BLOCK_N) <= STACKED_TASKS
            && (stack_rows == 1 || (stack_rows.is_power_of_two() && result <= STACKED_MAX_RESULT))
        {
            (slots, PACKED_BLOCK_N, pack)
        } else {
            let (stack, block_n) = self.stacked_shape(stack_rows, rows, k, split_block_n);
            (stack, block_n, 1)
        }
    }

    /// Whether [`StackedShape::stacked_shape`] stacks the product.
    fn stacks(self, stack_rows: usize, rows: usize, k: usize) -> bool
    where
        Self: Sized,
    {
        self.stacked_shape(stack_rows, rows, k, 0).0 > 0
    }
}

impl StackedShape for QuantFormat {
    fn stacked_shape(self, stack_rows: usize, rows: usize, k: usize, split_block_n: usize) -> (usize, usize) {
        let tiles = k.div_ceil(LINEAR_BLOCK_K);
        let stack = tiles.next_power_of_two().min(16);
        let mut block_n = (STACKED_MIN_ROWS / stack).max(4);
        while rows.div_ceil(block_n) > STACKED_TASKS {
            block_n *= 2;
        }
        let result = stacked_dot_rows(stack_rows, stack) * stack * block_n;
        let fits = stack_rows == 1 || (stack_rows.is_power_of_two() && result <= STACKED_MAX_RESULT);
        if stack_rows > 0 && fits && self.gpu_kernels() && stack * block_n <= STACKED_MAX_ROWS {
            (stack, block_n)
        } else {
            (0, split_block_n)
        }
    }
}

/// The scratch entries a program of the persistent step needs for a
/// product of `stack_rows` rows (at least one) stacked as `(stack,
/// block_n)` over `k` columns.
pub const fn stacked_slot(stack: usize, block_n: usize, k: usize, stack_rows: usize) -> usize {
    let rows = if stack_rows > 1 { stack_rows } else { 1 };
    k.div_ceil(LINEAR_BLOCK_K).div_ceil(stack) * stack * block_n * rows
}

/// The weight rows `wrow` (`[stack * block_n]`) of a stacked tile for output
/// tile `pid_n` (`block_n` rows; rows past `rows` clamped to the last); a
/// packed tile (`pack > 1`, see [`StackedShape::stacked_tiling`]) covers
/// `pack` blocks of `block_n` rows, slot `j` block `j / tiles` (the
/// slots past the last block repeat it).
#[kernel_fn]
pub fn stacked_rows(
    pid_n: Tensor,
    rows: Tensor,
    block_n: usize,
    stack: usize,
    pack: usize,
    tiles: usize,
) -> Tensor {
    let r = arange(0, (stack * block_n) as i32);
    if pack > 1 {
        let blk = minimum(r / block_n as i32 / tiles as i32, pack as i32 - 1);
        minimum(pid_n * (pack * block_n) as i32 + blk * block_n as i32 + r % block_n as i32, rows - 1)
    } else {
        minimum(pid_n * block_n as i32 + r % block_n as i32, rows - 1)
    }
}

/// The quant words and raw scale entries of a stacked weight tile
/// (`[stack * block_n, LINEAR_BLOCK_K]`, [`super::gemm::tile_index`]'s
/// layout per row): row `r` is weight row `wrow[r]` at K tile `c0 + r /
/// block_n`, or with `cycle > 0` (a packed tile of `cycle` K tiles) at K
/// tile `r / block_n % cycle` (quant blocks past the row clamped to its
/// last block).
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn stacked_load(
    q_ptr: Tensor,
    s_ptr: Tensor,
    wrow: Tensor,
    c0: Tensor,
    cycle: usize,
    nb: Tensor,
    quant: QuantFormat,
    block_n: usize,
    stack: usize,
) -> (Tensor, Tensor) {
    let rows = stack * block_n;
    let hq = LINEAR_BLOCK_K / 16;
    let wpb = if quant.is_q4() { 4 } else { 8 };
    let h = expand_dims(arange(0, hq as i32), 0);
    let slot = arange(0, rows as i32) / block_n as i32;
    let kt = if cycle > 0 { c0 + slot % cycle as i32 } else { c0 + slot };
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
/// product `x @ W^T` of `stack_rows` activation rows (the first `m` real,
/// the others repeating row `m - 1`) over all `tiles` K tiles (see the
/// module doc), before an epilogue ([`linear_epilogue`]'s fusions, or
/// RoPE's): the tile's `[block_n]` sums of one row (`stack_rows == 1`),
/// `[stack_rows, block_n]` otherwise, or with `pairs` its even rows' and
/// its odd rows' (`[block_n / 2]` each, or `[stack_rows, block_n / 2]`;
/// the same sums, read from the scratch in two strided halves, for
/// epilogues that take rows in pairs; without `pairs` the second result
/// repeats the first). `wrow` are its weight rows ([`stacked_rows`],
/// shared by the rows), `wd0`/`sr0` the first dot's weights
/// ([`stacked_load`] at K tile 0), `rs` the norm statistic (of several
/// rows: `[stack_rows]`). Program `p`'s scratch is slot `p` of `ws`
/// ([`stacked_slot`] entries each).
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn stacked_sums(
    x_ptr: Tensor,
    q_ptr: Tensor,
    s_ptr: Tensor,
    nw_ptr: Tensor,
    ws_ptr: Tensor,
    k: Tensor,
    m: Tensor,
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
    stack_rows: usize,
    pairs: bool,
) -> (Tensor, Tensor) {
    let rows = stack_rows.max(1);
    let slot = program_id(0) * (block_n * tiles.div_ceil(stack) * stack * rows) as i32;
    let width = stack * block_n;
    // The dot's rows (row `t * rows + r`: row `r`'s K tile `t` of the
    // chunk), the tile's columns, and which columns of the result hold each
    // row's own K tile.
    let dr = (rows * stack).max(16);
    let t16 = expand_dims(arange(0, dr as i32), 1);
    let cols = expand_dims(arange(0, width as i32), 0);
    let own =
        if rows > 1 { t16 / rows as i32 == cols / block_n as i32 } else { t16 == cols / block_n as i32 };
    // The rows each sum reads back: all of them, or the even ones and the
    // odd ones; of several rows, row `r`'s at `r * width` in the scratch.
    let (j, j2) = if pairs && rows > 1 {
        let r = expand_dims(arange(0, rows as i32) * width as i32, 1);
        let e = r + expand_dims(arange(0, (block_n / 2) as i32) * 2, 0);
        (e, e + 1)
    } else if pairs {
        let e = arange(0, (block_n / 2) as i32) * 2;
        (e, e + 1)
    } else if rows > 1 {
        let a =
            expand_dims(arange(0, rows as i32) * width as i32, 1) + expand_dims(arange(0, block_n as i32), 0);
        (a, a)
    } else {
        let a = arange(0, block_n as i32);
        (a, a)
    };
    // Where each product row of the dot goes in the scratch.
    let at = if rows > 1 { t16 % rows as i32 * width as i32 + cols } else { cols };
    let mut wd = wd0;
    let mut sr = sr0;
    let mut acc = if rows > 1 {
        zeros([rows, if pairs { block_n / 2 } else { block_n }], f32)
    } else {
        zeros([if pairs { block_n / 2 } else { block_n }], f32)
    };
    let mut acc2 = acc;
    for c0 in static_range(0, tiles, stack) {
        let (wd_next, sr_next) = if c0 + stack < tiles {
            stacked_load(
                q_ptr,
                s_ptr,
                wrow,
                full([], (c0 + stack) as i32, i32),
                0,
                k / 32,
                quant,
                block_n,
                stack,
            )
        } else {
            (wd, sr)
        };
        let d = stacked_dot(
            x_ptr, nw_ptr, k, m, rs, wd, sr, c0, block_n, stack, stack, rows, quant, fuse, f16_ops, dt,
        );
        // The diagonal blocks to this program's scratch, read back in K
        // order after a barrier. Each dot of the task has its own region;
        // the program's next task writes the slot only after its own dot,
        // whose operand staging waits at a CTA barrier for every thread,
        // so no thread overwrites a value another has yet to read.
        let base = ws_ptr + slot + (c0 / stack * width * rows) as i32;
        store(base + broadcast_to(at, [dr, width]), d, mask = own);
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

/// The epilogue of stacked tile `t` ([`linear_epilogue`]'s fusions) on
/// the sums of [`stacked_sums`]: `[block_n]` of one row (`stack_rows` 1),
/// `[stack_rows, block_n]` of which the first `m` rows are stored. `zero`
/// is the caller's i32 zero.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn stacked_epilogue(
    sums: Tensor,
    out_ptr: Tensor,
    m: Tensor,
    n: Tensor,
    t: Tensor,
    zero: Tensor,
    fuse: Fuse,
    dt: DType,
    block_n: usize,
    stack_rows: usize,
) {
    if stack_rows > 1 {
        linear_epilogue(sums, out_ptr, m, n, n, zero, t, fuse, dt, stack_rows, block_n);
    } else {
        let sums = reshape(sums, [1, block_n]);
        linear_epilogue(sums, out_ptr, zero + 1, n, n, zero, t, fuse, dt, 1, block_n);
    }
}

/// One stacked `dot` of `rows` activation rows (the first `m` real, the
/// others repeating row `m - 1`): row `t * rows + r` of the left operand is
/// row `r`'s activations of K tile `c0 + t` for `t < span` (rounded as
/// `linear` rounds them, with the norm statistic `rs`, `[rows]` for several
/// rows, whose entries past `m` repeat row `m - 1`'s; other rows and
/// columns past K zero), the right operand the dequantized weights `wd`/`sr` of
/// [`stacked_load`] (`stack` K tiles or slots). The `[stacked_dot_rows(rows,
/// span), stack * block_n]` products, f32.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn stacked_dot(
    x_ptr: Tensor,
    nw_ptr: Tensor,
    k: Tensor,
    m: Tensor,
    rs: Tensor,
    wd: Tensor,
    sr: Tensor,
    c0: usize,
    block_n: usize,
    stack: usize,
    span: usize,
    rows: usize,
    quant: QuantFormat,
    fuse: Fuse,
    f16_ops: bool,
    dt: DType,
) -> Tensor {
    let bk = LINEAR_BLOCK_K as i32;
    let width = stack * block_n;
    let dr = (rows * span).max(16);
    let t16 = expand_dims(arange(0, dr as i32), 1);
    let c = expand_dims(arange(0, bk), 0);
    let nib = broadcast_to(if quant.is_q4() { c / 16 % 2 * 4 } else { c * 0 }, [width, LINEAR_BLOCK_K]);
    let e8 = broadcast_to(c % 4 * 8, [width, LINEAR_BLOCK_K]);
    let (xa, col, ok, rs) = if rows > 1 {
        // Rows past `m` repeat row `m - 1` (the same products, bit for bit).
        let (t, r) = (t16 / rows as i32, minimum(t16 % rows as i32, m - 1));
        let col = (t + c0 as i32) * bk + c;
        let ok = t < span as i32 && col < k;
        let xa = load(x_ptr + r * k + col, mask = ok, other = 0.0);
        // Row `t * rows + r`'s statistic is row `r`'s.
        let rs = if fuse.norm() {
            reshape(broadcast_to(expand_dims(rs, 0), [dr / rows, rows]), [dr, 1])
        } else {
            rs
        };
        (xa, col, ok, rs)
    } else {
        let col = (t16 + c0 as i32) * bk + c;
        let ok = t16 < stack as i32 && col < k;
        (load(x_ptr + col, mask = ok, other = 0.0), col, ok, rs)
    };
    let nw = if fuse.norm() { load(nw_ptr + col, mask = ok, other = 0.0) } else { xa };
    let xv = where_(ok, linear_operand(xa, nw, rs, fuse.norm(), f16_ops, dt), 0.0);
    let w = swap_weights(wd, nib, e8, sr, quant);
    let wv = if f16_ops { w.to(f16) } else { w };
    dot(xv, trans(wv), zeros([dr, width], f32))
}

/// The products of a packed stacked tile ([`StackedShape::stacked_tiling`]:
/// `pack` output blocks of `block_n` rows over all `tiles` K tiles in one
/// dot of `stack` slots) of `stack_rows` activation rows (the first `m`
/// real) into this program's scratch slot of `ws`: slot `j`'s product with
/// K tile `j % tiles`, the others discarded. Summed per row with
/// [`packed_row_sums`] (this ends with the barrier that makes them visible
/// to the whole program).
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn packed_sums(
    x_ptr: Tensor,
    nw_ptr: Tensor,
    ws_ptr: Tensor,
    k: Tensor,
    m: Tensor,
    rs: Tensor,
    wd: Tensor,
    sr: Tensor,
    block_n: usize,
    stack: usize,
    pack: usize,
    tiles: usize,
    stack_rows: usize,
    quant: QuantFormat,
    fuse: Fuse,
    f16_ops: bool,
    dt: DType,
) {
    static_assert(tiles <= stack && pack * tiles <= stack, "a packed tile is one dot");
    let rows = stack_rows.max(1);
    let span = tiles.next_power_of_two();
    let dr = (rows * span).max(16);
    let width = (stack * block_n) as i32;
    let t16 = expand_dims(arange(0, dr as i32), 1);
    let cols = expand_dims(arange(0, width), 0);
    let slot = cols / block_n as i32;
    let t = if rows > 1 { t16 / rows as i32 } else { t16 };
    let own = t == slot % tiles as i32 && slot < (pack * tiles) as i32;
    let d =
        stacked_dot(x_ptr, nw_ptr, k, m, rs, wd, sr, 0, block_n, stack, span, rows, quant, fuse, f16_ops, dt);
    // As in `stacked_sums`: the next task writes the slot only after its
    // own dot's operand staging, a CTA barrier every thread reaches. Of
    // several rows, row `r`'s products at `r * width`.
    if rows > 1 {
        let at = t16 % rows as i32 * width + cols;
        store(
            ws_ptr + program_id(0) * width * rows as i32 + broadcast_to(at, [dr, width as usize]),
            d,
            mask = own,
        );
    } else {
        store(ws_ptr + program_id(0) * width + broadcast_to(cols, [16, width as usize]), d, mask = own);
    }
    barrier();
}

/// The row sums of the packed tile that [`packed_sums`] left in this
/// program's scratch slot, `[P * block_n]` with `P` the next power of two
/// of `pack` (block `b` at `b * block_n`, the rows past the last block
/// zero), of several rows `[stack_rows, P * block_n]`: each row's K tiles'
/// products added in K order from zero, as [`stacked_sums`] adds them.
#[kernel_fn]
pub fn packed_row_sums(
    ws_ptr: Tensor,
    stack: usize,
    tiles: usize,
    block_n: usize,
    pack: usize,
    stack_rows: usize,
) -> Tensor {
    let rows = stack_rows.max(1);
    let o = arange(0, (pack.next_power_of_two() * block_n) as i32);
    let (blk, j) = (o / block_n as i32, o % block_n as i32);
    let width = (stack * block_n) as i32;
    if rows > 1 {
        let r = expand_dims(arange(0, rows as i32) * width, 1);
        let base = ws_ptr
            + program_id(0) * width * rows as i32
            + r
            + expand_dims(blk * (tiles * block_n) as i32 + j, 0);
        let live =
            broadcast_to(expand_dims(blk < pack as i32, 0), [rows, pack.next_power_of_two() * block_n]);
        let mut acc = zeros([rows, pack.next_power_of_two() * block_n], f32);
        for t in static_range(0, tiles) {
            acc = acc + load(base + (t * block_n) as i32, mask = live, other = 0.0);
        }
        acc
    } else {
        let base = ws_ptr + program_id(0) * width + blk * (tiles * block_n) as i32 + j;
        let mut acc = zeros([pack.next_power_of_two() * block_n], f32);
        for t in static_range(0, tiles) {
            acc = acc + load(base + (t * block_n) as i32, mask = blk < pack as i32, other = 0.0);
        }
        acc
    }
}

/// The epilogue of packed task `t` ([`linear_epilogue`]'s fusions on the
/// sums [`packed_row_sums`] reads back) of `stack_rows` rows (the first `m`
/// real): the task's `pack * block_n` weight rows are output rows (SiLU:
/// pairs) from `t` times as many, element for element what the unpacked
/// tiles of those rows store.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn packed_epilogue(
    ws_ptr: Tensor,
    out_ptr: Tensor,
    m: Tensor,
    n: Tensor,
    t: Tensor,
    fuse: Fuse,
    dt: DType,
    block_n: usize,
    stack: usize,
    pack: usize,
    tiles: usize,
    stack_rows: usize,
) {
    let rows = stack_rows.max(1);
    let width = pack.next_power_of_two() * block_n;
    let per = (if fuse.silu() { pack * block_n / 2 } else { pack * block_n }) as i32;
    let off = t * per;
    let zero = full([], 0, i32);
    let sums = packed_row_sums(ws_ptr, stack, tiles, block_n, pack, rows);
    if rows > 1 {
        linear_epilogue(sums, out_ptr + off, m, minimum(n - off, per), n, zero, zero, fuse, dt, rows, width);
    } else {
        let sums = reshape(sums, [1, width]);
        linear_epilogue(
            sums,
            out_ptr + off,
            zero + 1,
            minimum(n - off, per),
            n,
            zero,
            zero,
            fuse,
            dt,
            1,
            width,
        );
    }
}
