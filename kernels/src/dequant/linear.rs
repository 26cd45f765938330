//! The batch-invariant linear layer: `y[M, N] = x[M, K] @ W^T` for every `M`
//! (batch-1 and batched decode, prefill, speculative verification), one
//! kernel whose arithmetic for a row of `y` never depends on `M`, on the
//! other rows of the step or on the launch's tiles.
//!
//! # Math
//!
//! The K axis is cut into tiles of [`LINEAR_BLOCK_K`] = 128 columns, the
//! same on every device and for every batch size. Per tile, the weight tile
//! `[BLOCK_N, 128]` is dequantized in K order (column `c` of the tile is
//! `k0 + c`) exactly as the swapped GEMM forms it
//! ([`super::gemm::swap_weights`]), rounded to the operand dtype (f16 with
//! `F16`, the tensor-core inputs; f32 otherwise) together with the
//! activations, and multiplied by one `dot` from a zero accumulator; the
//! tile products are added to the f32 result in K order:
//!
//! ```text
//! y = ((0 + dot(x[:, 0:128], w[:, 0:128])) + dot(x[:, 128:256], ..)) + ...
//! ```
//!
//! On tensor cores a tile's `dot` is a chain of `mma` instructions over its
//! eight 16-column steps, and an output element's value depends only on its
//! row of `x`, its row of `w` and the chain, not on the other elements of
//! the tile: `BLOCK_M`, `BLOCK_N` and the warps only decide which thread
//! computes which element (the interpreter sums a tile's products in f64
//! and rounds once, per element too). A last partial tile reads its missing
//! activations as zero. So a row's result is the same in every launch, at
//! every batch size.
//!
//! Two forms compute that sum. Unsplit, each program loops over the tiles
//! and adds their products as it goes. Split (`SPLIT`, the decode batches:
//! many short programs instead of a few long loops), the grid's third axis
//! gives each program one K tile: it stores its tile's product in the
//! workspace and increments its output tile's counter, and the program that
//! completes the count adds the products in K order, from zero, as the
//! loop does (see [`split_finish`]).
//!
//! Fusions, each computing bit for bit what the separate kernels compute:
//!
//! - `FUSE.norm()` (RMSNorm prologue, single-row steps only: `m == 1`): the
//!   statistic of the row through [`crate::rmsnorm::rms_rstd`] (exact and
//!   order-independent, as in the norm kernels), then add+RMSNorm's
//!   rounding sequence `round_T(round_T(x * rstd) * nw)` on every
//!   activation before the operand rounding.
//! - `FUSE.residual()` (epilogue, not with the SiLU-mul): `out =
//!   round_T(round_T(y) + out)` in place: the product rounded to `T`, then
//!   add+RMSNorm's rounded residual add.
//! - `FUSE.silu()` (gate/up interleaved as in
//!   [`super::repack::interleave_gate_up`]): `silu(gate) * up`
//!   ([`super::gemm::gemm_epilogue`]).
//!
//! # Tiling
//!
//! Program `(i, j, z)` owns the output rows from `i * BLOCK_M` and the
//! weight rows from `j * BLOCK_N` (and, split, K tile `z`; grid
//! [`super::linear_grid`]). Activation rows past `M` and weight rows past
//! `N` (or `2N`) are clamped to the last row (valid addresses; their results
//! are not stored), so whole K tiles need no masks. Unsplit, the weight
//! words and scales of the next K tile, and its activations, are loaded into
//! registers before the current tile is multiplied. The program's first K
//! tile and the last partial one are loaded before `gdc_wait` (weights are
//! never written by a kernel, so their latency overlaps the previous
//! kernel's tail).
//!
//! # Contract
//!
//! As the other dequant kernels ([`super`]): `x` `[M, K]` and `out` `[M, N]`
//! row-major in `T`; the repacked planes; `K % 32 == 0`. With the norm, `m`
//! must be 1, `nw_ptr` holds the `K` norm weights in `T` and `NORM_BLOCK`
//! is `K` rounded up to a power of two; with the residual add, `out` holds
//! the residual stream (not aliasing `x`). With `SPLIT`, `ws` holds at least
//! [`super::linear_workspace`]'s entries and `cnt` its counters, all zero
//! before the first launch (every launch leaves them zero); without it
//! they are not read.

use super::gemm::{gemm_epilogue, swap_weights, tile_index};
use super::gemv::{k_scales_of, k_scales_raw, q6k_scale_of, q6k_scale_raw, scale_load};
use super::{Fuse, QuantFormat};
use crate::cpu_gemv::{byte_format_weights, byte_weights, weight_tile_any};
use crate::rmsnorm::rms_rstd;
use dsl_core::DType;
use dsl_macros::{kernel, kernel_fn};

/// The `dot` operand of an activation tile `x` (in `T`): with `norm`,
/// add+RMSNorm's sequence `round_T(round_T(x * rs) * nw)` (f32 math, `nw`
/// the norm weights in `T`); then rounded to f16 (`f16`, tensor cores) or
/// widened to f32.
#[kernel_fn]
pub fn linear_operand(x: Tensor, nw: Tensor, rs: Tensor, norm: bool, f16_ops: bool, dt: DType) -> Tensor {
    let v = if norm { ((x.to(f32) * rs).to(dt).to(f32) * nw.to(f32)).to(dt) } else { x };
    if f16_ops { v.to(f16) } else { v.to(f32) }
}

/// The residual epilogue's `round_T(round_T(y) + r)` (`y` f32, `r` in `T`),
/// which every arrangement of the add must share bit for bit.
#[kernel_fn]
pub fn residual_sum(y: Tensor, r: Tensor, dt: DType) -> Tensor {
    (y.to(dt).to(f32) + r.to(f32)).to(dt)
}

/// Stores the `[block_m, block_n]` accumulator of output tile `(pid_m,
/// pid_n)`: [`gemm_epilogue`] (with `fuse.silu()`, the SiLU-mul), or with
/// `fuse.residual()` the in-place residual add `out = round_T(round_T(y) +
/// out)`.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn linear_epilogue(
    acc: Tensor,
    out_ptr: Tensor,
    m: Tensor,
    n: Tensor,
    ldo: Tensor,
    pid_m: Tensor,
    pid_n: Tensor,
    fuse: Fuse,
    dt: DType,
    block_m: usize,
    block_n: usize,
) {
    if fuse.residual() {
        let o = arange(0, block_m * block_n);
        let om = pid_m * block_m + o / block_n;
        let on = pid_n * block_n + o % block_n;
        let ok = om < m && on < n;
        let y = reshape(acc, [block_m * block_n]);
        let r = load(out_ptr + om * ldo + on, mask = ok, other = 0.0);
        store(out_ptr + om * ldo + on, residual_sum(y, r, dt), mask = ok);
    } else {
        gemm_epilogue(acc, out_ptr, m, n, ldo, fuse.silu(), pid_m, pid_n, block_m, block_n);
    }
}

/// The tallest output tile whose activation and norm-weight loads mask the
/// columns past K (vectors); taller tiles clamp the column to K - 1 instead
/// (scalar loads), which runs faster at their sizes (see BENCHMARKS.md).
/// Both forms give the same products: `tile_product` zeroes the columns
/// past K.
pub const VECTOR_X_ROWS: usize = 16;

/// The shortest output tile whose unsplit loop forms each K tile's product
/// in two halves of its columns ([`linear_tile`]): at 128 rows the whole
/// tile's operands do not fit in registers beside the two accumulators.
pub const WIDE_ROWS: usize = 128;

/// The K tile of every batch-invariant product, on every device: a row's
/// result is the sum, in K order, of one `dot` per 128 columns (see the
/// module doc), so this width is part of the arithmetic.
pub const LINEAR_BLOCK_K: usize = 128;

/// The K tile from column `k0` of a `[block_n, LINEAR_BLOCK_K]` weight tile
/// (blocks past the row clamped to its last block): for the word-tiled
/// formats its quant words and scale entries; for the K-quants its quant
/// words and raw scale entries ([`k_scales_raw`], [`q6k_scale_raw`]), whose
/// weights [`loaded_weights`] forms; for the others the f32 weights
/// themselves (and no scales). The quant plane is read as words in
/// [`tile_index`]'s layout (each word once per thread chunk), each weight's
/// nibble or byte shifted out of its word; the 16-bit floats one element
/// at a time. The weights are [`weight_tile_any`]'s, bit for bit.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn tile_load(
    q_ptr: Tensor,
    s_ptr: Tensor,
    wrow: Tensor,
    nb: Tensor,
    k0: Tensor,
    quant: QuantFormat,
    block_n: usize,
) -> (Tensor, Tensor) {
    if quant.is_float() {
        let col = minimum(k0 + expand_dims(arange(0, LINEAR_BLOCK_K as i32), 0), nb * 32 - 1);
        (weight_tile_any(q_ptr, s_ptr, expand_dims(wrow, 1), col, nb * 32, quant), full([], 0.0, f32))
    } else {
        let h = arange(0, (LINEAR_BLOCK_K / 16) as i32);
        let (w_idx, s_idx) =
            tile_index(wrow, nb, minimum(k0 / 32 + h / 2, nb - 1), quant, block_n, LINEAR_BLOCK_K);
        let wd = load(ptrcast(q_ptr, i32) + w_idx);
        if quant.gpu_kernels() {
            (wd, scale_load(s_ptr, s_idx, full([], 1, i1), quant))
        } else if quant.is_k_quant() {
            // The words and scale entries stay raw: the product forms the
            // weights ([`loaded_weights`]), so a K tile loaded ahead is
            // still in flight while the current one is multiplied.
            let c = broadcast_to(expand_dims(arange(0, LINEAR_BLOCK_K as i32), 0), [block_n, LINEAR_BLOCK_K]);
            let raw = if quant == QuantFormat::Q6_K {
                q6k_scale_raw(s_ptr, s_idx * 2 + c % 32 / 16)
            } else {
                k_scales_raw(s_ptr, s_idx)
            };
            (wd, raw)
        } else {
            // Column c of the tile is byte c % 4 of its word.
            let c = broadcast_to(expand_dims(arange(0, LINEAR_BLOCK_K as i32), 0), [block_n, LINEAR_BLOCK_K]);
            (byte_format_weights(wd >> (c % 4 * 8) & 255, s_ptr, s_idx, c % 32, quant), full([], 0.0, f32))
        }
    }
}

/// The f32 weights of a K tile from what [`tile_load`] returns in a format
/// the word-tiled bodies do not take: a K-quant's formed from its raw
/// words and scale entries, [`weight_tile_any`]'s values bit for bit
/// (column `c` is byte `c % 4` of its word; Q4_K's 16-column group `c / 16`
/// takes the low (even) or high (odd) nibbles); the other formats' are
/// `wd` itself.
#[kernel_fn]
pub fn loaded_weights(wd: Tensor, sr: Tensor, quant: QuantFormat, block_n: usize, width: usize) -> Tensor {
    if !quant.is_k_quant() {
        wd
    } else {
        let c = broadcast_to(expand_dims(arange(0, width as i32), 0), [block_n, width]);
        if quant.is_q4() {
            // The group's nibbles moved down once per word, then each
            // register's nibble (byte `c % 4`, a constant of the register)
            // to bits 19-22 by a constant shift: the mantissa of `16 + q`.
            let wn = wd >> (c / 16 % 2 * 4);
            let e8 = c % 4 * 8;
            let t = where_(e8 <= 19, wn << maximum(19 - e8, 0), wn >> maximum(e8 - 19, 0));
            let f = (t & 0x78_0000 | 0x4180_0000).bitcast(f32);
            let (d1, m1) = k_scales_of(sr);
            fma(d1, f, fma(d1, -16.0, 0.0 - m1))
        } else if quant == QuantFormat::Q6_K {
            byte_weights(wd >> (c % 4 * 8) & 255, q6k_scale_of(sr))
        } else {
            let f = ((wd >> (c % 4 * 8) & 255) << 15 | 0x4380_0000).bitcast(f32);
            let (d1, m1) = k_scales_of(sr);
            fma(d1, f, fma(d1, -256.0, 0.0 - m1))
        }
    }
}

/// One K tile's product `x[:, k0 ..] @ w[.., k0 ..]^T` from a zero
/// accumulator, `[block_m, block_n]` f32: the weight words `wd` and scales
/// `sr` of [`tile_load`], the activation tile `xa` (`[block_m,
/// LINEAR_BLOCK_K]`, columns past K masked to zero here) and, with `norm`,
/// the norm weights at the tile's columns.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn tile_product(
    wd: Tensor,
    sr: Tensor,
    xa: Tensor,
    nw_ptr: Tensor,
    rs: Tensor,
    k: Tensor,
    k0: Tensor,
    quant: QuantFormat,
    norm: bool,
    f16_ops: bool,
    dt: DType,
    block_m: usize,
    block_n: usize,
) -> Tensor {
    let zero = zeros([block_m, block_n], f32);
    columns_product(
        wd,
        sr,
        xa,
        nw_ptr,
        rs,
        k,
        k0,
        zero,
        quant,
        norm,
        f16_ops,
        dt,
        block_m,
        block_n,
        LINEAR_BLOCK_K,
    )
}

/// `init + x[:, k0 .. k0 + width] @ w[.., k0 .. k0 + width]^T` as one
/// `dot`: a chain of `mma` steps over the `width / 16` column groups that
/// continues `init`'s. [`tile_product`] is one call of `width =
/// LINEAR_BLOCK_K` from zero; two calls of half the width, the second
/// continuing the first's result, run the same chain of steps (see
/// [`linear_tile`]'s wide tiles). `wd`/`sr` are the words and scales of the
/// `width` columns ([`tile_index`]'s layout at that width, or the f32
/// weights of a format the word-tiled bodies do not take), `xa` the
/// `[block_m, width]` activations.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn columns_product(
    wd: Tensor,
    sr: Tensor,
    xa: Tensor,
    nw_ptr: Tensor,
    rs: Tensor,
    k: Tensor,
    k0: Tensor,
    init: Tensor,
    quant: QuantFormat,
    norm: bool,
    f16_ops: bool,
    dt: DType,
    block_m: usize,
    block_n: usize,
    width: usize,
) -> Tensor {
    let c = expand_dims(arange(0, width as i32), 0);
    let w = if quant.gpu_kernels() {
        let nib = broadcast_to(if quant.is_q4() { c / 16 % 2 * 4 } else { c * 0 }, [block_n, width]);
        let e8 = broadcast_to(c % 4 * 8, [block_n, width]);
        swap_weights(wd, nib, e8, sr, quant)
    } else {
        loaded_weights(wd, sr, quant, block_n, width)
    };
    let col = k0 + c;
    let nw = if !norm {
        xa
    } else if block_m <= VECTOR_X_ROWS {
        load(nw_ptr + col, mask = col < k, other = 0.0)
    } else {
        load(nw_ptr + minimum(col, k - 1))
    };
    let xv = where_(col < k, linear_operand(xa, nw, rs, norm, f16_ops, dt), 0.0);
    let wv = if f16_ops { w.to(f16) } else { w };
    dot(xv, trans(wv), init)
}

/// The quant words, scales and activations of the `width` columns from
/// `k0` of a wide tile's K step ([`linear_tile`]): words and scales at
/// [`tile_index`]'s indices `w_idx`/`s_idx` for that width, activations of
/// the rows at element offsets `xrow`, columns `cols` (`[1, width]`; whole
/// K tiles: no masks).
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn half_tile_load(
    q_ptr: Tensor,
    s_ptr: Tensor,
    x_ptr: Tensor,
    w_idx: Tensor,
    s_idx: Tensor,
    xrow: Tensor,
    cols: Tensor,
    k0: Tensor,
    quant: QuantFormat,
) -> (Tensor, Tensor, Tensor) {
    let wpb = if quant.is_q4() { 4 } else { 8 };
    let w = load(ptrcast(q_ptr, i32) + (w_idx + k0 / 32 * wpb));
    let s = scale_load(s_ptr, s_idx + k0 / 32, full([], 1, i1), quant);
    let x = load(x_ptr + xrow + cols + k0);
    (w, s, x)
}

/// Output tile `(pid_m, pid_n)` of `x @ W^T` (of `tiles_n` tiles along N):
/// unsplit, every K tile's product in K order then the epilogue; with
/// `split_k`, K tile `pid_k`'s product handed to [`split_finish`] (of
/// `tiles_k`). `wd`/`sr` are the words and scales of the first K tile this
/// call multiplies, `wd_tail`/`sr_tail` those of the last partial one
/// ([`tile_load`]); `rs` the norm statistic (a scalar, or `[block_m, 1]`
/// per row). Returns whether this call stored the output tile (always
/// unsplit; the finishing program split).
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn linear_tile(
    x_ptr: Tensor,
    q_ptr: Tensor,
    s_ptr: Tensor,
    nw_ptr: Tensor,
    out_ptr: Tensor,
    ws_ptr: Tensor,
    cnt_ptr: Tensor,
    m: Tensor,
    n: Tensor,
    ldo: Tensor,
    k: Tensor,
    rs: Tensor,
    wd0: Tensor,
    sr0: Tensor,
    wd_tail: Tensor,
    sr_tail: Tensor,
    pid_m: Tensor,
    pid_n: Tensor,
    pid_k: Tensor,
    tiles_n: Tensor,
    tiles_k: Tensor,
    quant: QuantFormat,
    fuse: Fuse,
    split_k: bool,
    f16_ops: bool,
    dt: DType,
    block_m: usize,
    block_n: usize,
    sum_unroll: usize,
) -> Tensor {
    let norm = fuse.norm();
    // Tiles of at most `VECTOR_X_ROWS` rows: K is whole quant blocks, so the
    // activation rows start on 64-byte lines and the masks below hold in
    // runs of 32, and the activation loads are vectors.
    let vector_x = block_m <= VECTOR_X_ROWS;
    let k = if vector_x { multiple_of(k, 32) } else { k };
    let bk = LINEAR_BLOCK_K as i32;
    let rows = if fuse.silu() { n * 2 } else { n };
    let nb = k / 32;
    let m0 = pid_m * block_m;
    let wrow = minimum(pid_n * block_n + arange(0, block_n), rows - 1);
    let k_full = k / bk * bk;
    let xrow = expand_dims(minimum(m0 + arange(0, block_m), m - 1) * k, 1);
    let kc = expand_dims(arange(0, bk), 0);
    if split_k {
        let first = pid_k * bk;
        let xa = if vector_x {
            load(x_ptr + xrow + first + kc, mask = first + kc < k, other = 0.0)
        } else {
            load(x_ptr + xrow + minimum(first + kc, k - 1))
        };
        let part =
            tile_product(wd0, sr0, xa, nw_ptr, rs, k, first, quant, norm, f16_ops, dt, block_m, block_n);
        split_finish(
            part, out_ptr, ws_ptr, cnt_ptr, m, n, ldo, pid_m, pid_n, pid_k, tiles_n, tiles_k, fuse, dt,
            block_m, block_n, sum_unroll,
        )
    } else {
        let mut acc = if block_m >= WIDE_ROWS && quant.gpu_kernels() {
            // Wide tiles: each K tile's product as two dots of half its
            // columns, the second continuing the first's chain (the same
            // `mma` steps in the same order as one dot over the tile), so
            // half the operand registers are live at a time; loaded at the
            // top of each step.
            let hw = LINEAR_BLOCK_K / 2;
            let (w_idx, s_idx) = tile_index(wrow, nb, arange(0, hw as i32 / 16) / 2, quant, block_n, hw);
            let kh = expand_dims(arange(0, hw as i32), 0);
            let mut acc = zeros([block_m, block_n], f32);
            for k0 in range(0, k_full, bk) {
                let k1 = k0 + hw as i32;
                let (lo_w, lo_s, lo_x) =
                    half_tile_load(q_ptr, s_ptr, x_ptr, w_idx, s_idx, xrow, kh, k0, quant);
                let (hi_w, hi_s, hi_x) =
                    half_tile_load(q_ptr, s_ptr, x_ptr, w_idx, s_idx, xrow, kh, k1, quant);
                let zero = zeros([block_m, block_n], f32);
                let lo = columns_product(
                    lo_w, lo_s, lo_x, nw_ptr, rs, k, k0, zero, quant, norm, f16_ops, dt, block_m, block_n, hw,
                );
                let part = columns_product(
                    hi_w, hi_s, hi_x, nw_ptr, rs, k, k1, lo, quant, norm, f16_ops, dt, block_m, block_n, hw,
                );
                acc = acc + part;
            }
            acc
        } else {
            // Whole K tiles: unmasked loads at offsets that move by a constant,
            // the next tile's issued before this one's product.
            let (w_idx, s_idx) = tile_index(wrow, nb, arange(0, bk / 16) / 2, quant, block_n, LINEAR_BLOCK_K);
            let wpb = if quant.is_q4() { 4 } else { 8 };
            let qw = ptrcast(q_ptr, i32);
            let last = maximum(k_full - bk, 0);
            let mut wd = wd0;
            let mut sr = sr0;
            let mut xa = load(x_ptr + xrow + kc, mask = k_full > 0, other = 0.0);
            let mut acc = zeros([block_m, block_n], f32);
            for k0 in range(0, k_full, bk) {
                let nk = minimum(k0 + bk, last);
                let (wd_next, sr_next) = if quant.gpu_kernels() {
                    (
                        load(qw + (w_idx + nk / 32 * wpb)),
                        scale_load(s_ptr, s_idx + nk / 32, full([], 1, i1), quant),
                    )
                } else {
                    tile_load(q_ptr, s_ptr, wrow, nb, nk, quant, block_n)
                };
                let xa_next = load(x_ptr + xrow + kc + nk);
                let part =
                    tile_product(wd, sr, xa, nw_ptr, rs, k, k0, quant, norm, f16_ops, dt, block_m, block_n);
                acc = acc + part;
                wd = wd_next;
                sr = sr_next;
                xa = xa_next;
            }
            acc
        };
        // The last partial tile (at most one): activations past K read as zero.
        for k0 in range(k_full, k, bk) {
            let xt = if vector_x {
                load(x_ptr + xrow + k0 + kc, mask = k0 + kc < k, other = 0.0)
            } else {
                load(x_ptr + xrow + minimum(k0 + kc, k - 1))
            };
            let part = tile_product(
                wd_tail, sr_tail, xt, nw_ptr, rs, k, k0, quant, norm, f16_ops, dt, block_m, block_n,
            );
            acc = acc + part;
        }
        linear_epilogue(acc, out_ptr, m, n, ldo, pid_m, pid_n, fuse, dt, block_m, block_n);
        full([], 1, i1)
    }
}

/// The split form's end (see the module doc): this program's K tile
/// product `part` goes to its slot of the workspace (the valid rows only),
/// then the output tile's counter is incremented; the program that brings
/// it to the number of K tiles sums every tile's product in K order,
/// exactly as the loop of the unsplit form does, resets the counter and
/// runs the epilogue. Output tile `(pid_m, pid_n)` of `tiles_n` along N,
/// K tile `pid_k` of `tiles_k`. Returns whether this program finished the
/// tile.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn split_finish(
    part: Tensor,
    out_ptr: Tensor,
    ws_ptr: Tensor,
    cnt_ptr: Tensor,
    m: Tensor,
    n: Tensor,
    ldo: Tensor,
    pid_m: Tensor,
    pid_n: Tensor,
    pid_k: Tensor,
    tiles_n: Tensor,
    tiles_k: Tensor,
    fuse: Fuse,
    dt: DType,
    block_m: usize,
    block_n: usize,
    sum_unroll: usize,
) -> Tensor {
    let tile = pid_m * tiles_n + pid_n;
    let len = (block_m * block_n) as i32;
    let (bm, bn) = (block_m as i32, block_n as i32);
    let r = arange(0, len);
    let valid = pid_m * bm + r / bn < m;
    let slot = (tile * tiles_k + pid_k) * len + r;
    store(ws_ptr + slot, reshape(part, [block_m * block_n]), mask = valid);
    let done = atomic_add(cnt_ptr + tile, 1);
    let finished = done == tiles_k - 1;
    if finished {
        let mut acc = zeros([block_m * block_n], f32);
        // In K order, `sum_unroll` products per trip: their loads do not
        // wait for each other's sums. A K tile past the last reads as -0.0,
        // which leaves every sum as it is.
        for z0 in range(0, tiles_k, sum_unroll as i32) {
            for j in 0..sum_unroll {
                let z = z0 + j as i32;
                let (live, pad) = if sum_unroll == 1 { (valid, 0.0) } else { (valid & (z < tiles_k), -0.0) };
                // `.cg`: the products were written by other SMs in this launch.
                let p = load(
                    ws_ptr + (tile * tiles_k + z) * len + r,
                    mask = live,
                    other = pad,
                    cache_modifier = ".cg",
                );
                acc = acc + p;
            }
        }
        store(cnt_ptr + tile, 0);
        linear_epilogue(
            reshape(acc, [block_m, block_n]),
            out_ptr,
            m,
            n,
            ldo,
            pid_m,
            pid_n,
            fuse,
            dt,
            block_m,
            block_n,
        );
    }
    finished
}

/// The batch-invariant linear layer (see the module doc): `out = x @ W^T`
/// with `W` repacked in the format `QUANT`; with the fusions `FUSE`, the
/// fused gate/up product (`silu`), the RMSNorm prologue (`norm`, `m == 1`)
/// or the in-place residual add (`residual`). `F16` rounds both operands
/// to f16 (tensor cores); otherwise they stay f32. With `SPLIT` the grid's third
/// axis runs one K tile per program (`cdiv(K, LINEAR_BLOCK_K)` programs per
/// output tile) and the products meet through `ws` and `cnt` (see
/// [`split_finish`]); otherwise each program loops over K. Output row `r`
/// starts at `out + r * ldo` (`ldo >= n`), so one product can fill a column
/// range of a wider matrix (QKV whose parts differ in format). The output
/// is in `O`: `T` for activations, f32 for the LM head's logits (the f32
/// sums stored unrounded); the residual add takes `O == T`.
#[kernel(autotune(
    configs = [
        (BLOCK_M = 16, BLOCK_N = 32, num_warps = 4),
        (BLOCK_M = 16, BLOCK_N = 64, num_warps = 4),
        (BLOCK_M = 16, BLOCK_N = 16, num_warps = 2),
        (BLOCK_M = 16, BLOCK_N = 64, num_warps = 8),
        (BLOCK_M = 32, BLOCK_N = 32, num_warps = 4),
        (BLOCK_M = 64, BLOCK_N = 64, num_warps = 4),
        (BLOCK_M = 32, BLOCK_N = 64, num_warps = 4),
        (BLOCK_M = 64, BLOCK_N = 128, num_warps = 8),
        (BLOCK_M = 128, BLOCK_N = 64, num_warps = 8),
        (BLOCK_M = 128, BLOCK_N = 128, num_warps = 8),
    ],
    key = [m, n, k]
))]
#[allow(clippy::too_many_arguments)]
pub fn linear<T: Float, O: Float>(
    x_ptr: Ptr<T>,
    q_ptr: Ptr<u8>,
    s_ptr: Ptr<f16>,
    nw_ptr: Ptr<T>,
    out_ptr: Ptr<O>,
    ws_ptr: Ptr<f32>,
    cnt_ptr: Ptr<i32>,
    m: i32,
    n: i32,
    ldo: i32,
    k: i32,
    eps: f32,
    #[constexpr] QUANT: QuantFormat,
    #[constexpr] FUSE: Fuse,
    #[constexpr] SPLIT: bool,
    #[constexpr] F16: bool,
    #[constexpr] BLOCK_M: usize,
    #[constexpr] BLOCK_N: usize,
    #[constexpr] NORM_BLOCK: usize,
) {
    static_assert(!(FUSE.silu() && FUSE.residual()), "the SiLU-mul and the residual add do not combine");
    // Program `(i, j, z)` is output tile `(i, j)` (and K tile `z` when
    // split).
    let (pid_m, pid_n, pid_k) = (program_id(0), program_id(1), program_id(2));
    let rows = if FUSE.silu() { n * 2 } else { n };
    let nb = k / 32;
    let wrow = minimum(pid_n * BLOCK_N + arange(0, BLOCK_N), rows - 1);
    let bk = LINEAR_BLOCK_K as i32;
    // The first K tile of this program (its own with `SPLIT`, else tile
    // 0) and the last, partial one: both loaded before `gdc_wait` (weights
    // are never written by a kernel), blocks past the row clamped.
    let first = if SPLIT { pid_k * bk } else { full([], 0, i32) };
    let (wd, sr) = tile_load(q_ptr, s_ptr, wrow, nb, first, QUANT, BLOCK_N);
    let (wd_tail, sr_tail) = tile_load(q_ptr, s_ptr, wrow, nb, k / bk * bk, QUANT, BLOCK_N);
    // Activations, the norm's statistic and the residual may come from the
    // previous kernel.
    gdc_wait();
    gdc_launch_dependents();
    let rs = if FUSE.norm() {
        let cols = arange(0, NORM_BLOCK);
        let row = load(x_ptr + cols, mask = cols < k, other = 0.0).to(f32);
        rms_rstd(row, k, eps, NORM_BLOCK)
    } else {
        eps
    };
    linear_tile(
        x_ptr,
        q_ptr,
        s_ptr,
        nw_ptr,
        out_ptr,
        ws_ptr,
        cnt_ptr,
        m,
        n,
        ldo,
        k,
        rs,
        wd,
        sr,
        wd_tail,
        sr_tail,
        pid_m,
        pid_n,
        pid_k,
        num_programs(1),
        num_programs(2),
        QUANT,
        FUSE,
        SPLIT,
        F16,
        T,
        BLOCK_M,
        BLOCK_N,
        SPLIT_SUM_UNROLL,
    );
}

/// The K tiles' products the standalone product's [`split_finish`] loads
/// per trip of its sum (the persistent step's split stages keep one: their
/// unrolled sum measured slower there).
pub const SPLIT_SUM_UNROLL: usize = 8;
