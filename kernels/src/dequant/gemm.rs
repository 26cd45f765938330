//! The prefill path: `y[M, N] = x[M, K] @ W^T` for `M` above the GEMV's
//! range, tiled over `[BLOCK_M, BLOCK_N]` output tiles with a K loop that
//! dequantizes the W tile to f32, rounds it and the activation tile to f16
//! and accumulates with `dot` in f32 (tensor cores, `mma.sync.m16n8k16`, for
//! tiles that fit whole instructions). See the parent module for the math,
//! the repacked layout, the tiling, the constexprs and the error model.

use super::QuantFormat;
use super::gemv::{
    next_tile, q4_scale_decode, q4_scales, q4_tail_x, q4_weights, q8_tail_x, q8_weights, scale_load,
    tail_words, weight_tile, word_tiled_only, x_tile,
};
use dsl_core::DType;
use dsl_macros::{kernel, kernel_fn};

/// Stores the `[BLOCK_M, BLOCK_N]` accumulator of output tile `(pid_m,
/// pid_n)` (activation rows from `pid_m * BLOCK_M`, weight rows from `pid_n
/// * BLOCK_N`); with `silu`, weight rows come in (gate, up) pairs and the
/// tile holds `BLOCK_N / 2` output columns of `silu(gate) * up`. Output
/// rows are `ldo` elements apart.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn gemm_epilogue(
    acc: Tensor,
    out_ptr: Tensor,
    m: Tensor,
    n: Tensor,
    ldo: Tensor,
    silu: bool,
    pid_m: Tensor,
    pid_n: Tensor,
    block_m: usize,
    block_n: usize,
) {
    if silu {
        let pairs = block_n / 2;
        // Gate and up of an output column are adjacent along the last axis.
        let a = reshape(acc, [block_m * pairs, 2]);
        let is_gate = expand_dims(arange(0, 2) == 0, 0);
        let gate = sum(where_(is_gate, a, 0.0), 1);
        let up = sum(where_(is_gate, 0.0, a), 1);
        let y = gate * sigmoid(gate) * up;
        let o = arange(0, block_m * pairs);
        let om = pid_m * block_m + o / pairs;
        let on = pid_n * pairs + o % pairs;
        store(out_ptr + om * ldo + on, y, mask = om < m && on < n);
    } else {
        let o = arange(0, block_m * block_n);
        let om = pid_m * block_m + o / block_n;
        let on = pid_n * block_n + o % block_n;
        store(out_ptr + om * ldo + on, reshape(acc, [block_m * block_n]), mask = om < m && on < n);
    }
}

/// `acc + x @ w^T` for a flat `[BLOCK_M, width]` activation tile and a flat
/// `[BLOCK_N, width]` dequantized weight tile (both f32), through `dot` on
/// f16 operands (tensor-core inputs; f16 rather than bf16 keeps 11
/// significant bits of every weight and represents bf16 activations exactly
/// within f16's range). The order of the reduced axis is irrelevant, so it
/// only has to match between `x` and `w`.
#[kernel_fn]
pub fn dot_wt(x: Tensor, w: Tensor, acc: Tensor, block_m: usize, block_n: usize, width: usize) -> Tensor {
    let a = reshape(x.to(f16), [block_m, width]);
    let b = reshape(w.to(f16), [block_n, width]);
    dot(a, trans(b), acc)
}

/// `acc + w @ x^T` for the dequantized `[BLOCK_N, BLOCK_K]` weight tile `w`
/// (f32) and the `[BLOCK_M, BLOCK_K]` activation tile `x` as loaded (`dt`):
/// on 16-bit activations the weights are rounded to `dt` and `x` is the
/// `b` operand as it is (so the codegen can pipeline its load into
/// shared memory and, on sm_90a, read it with `wgmma`); f32 activations are
/// rounded to f16 with the weights.
#[kernel_fn]
pub fn dot_swapped(w: Tensor, x: Tensor, acc: Tensor, dt: DType) -> Tensor {
    if dt == DType::F32 { dot(w.to(f16), trans(x.to(f16)), acc) } else { dot(w.to(dt), trans(x), acc) }
}

/// The swapped GEMM ([`gemm`] with `SWAP`): the
/// program computes `acc[BLOCK_N, BLOCK_M] = W_tile @ x_tile^T` (weight
/// rows as the product's M, activation rows as its N) with [`swap_acc`] and
/// stores its transpose.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn gemm_swap(
    x_ptr: Tensor,
    q_ptr: Tensor,
    s_ptr: Tensor,
    out_ptr: Tensor,
    m: Tensor,
    n: Tensor,
    k: Tensor,
    quant: QuantFormat,
    silu: bool,
    dt: DType,
    block_m: usize,
    block_n: usize,
    block_k: usize,
) {
    word_tiled_only(quant);
    gdc_wait();
    gdc_launch_dependents();
    let rows = if silu { n * 2 } else { n };
    let (pid_m, pid_n) = (program_id(0), program_id(1));
    let k_full = k / block_k * block_k;
    let acc = swap_acc(
        x_ptr,
        q_ptr,
        s_ptr,
        m,
        k,
        rows,
        pid_m * block_m,
        pid_n * block_n,
        full([], 0, i32),
        k_full,
        SwapLoop::TILED,
        quant,
        dt,
        block_m,
        block_n,
        block_k,
    );
    gemm_epilogue(trans(acc), out_ptr, m, n, n, silu, pid_m, pid_n, block_m, block_n);
}

/// How [`swap_acc`] runs its K loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwapLoop {
    tail: bool,
    ahead2: bool,
}

impl SwapLoop {
    /// The tiled kernel's loop: the partial K tile after the whole ones, and
    /// the weights prefetched two tiles ahead, issued after each product, so
    /// they have a whole iteration to land (on sm_90a the staged product's
    /// proxy fence waits for every load issued before it).
    pub const TILED: SwapLoop = SwapLoop { tail: true, ahead2: true };
    /// A stream-K piece: whole K tiles only, short loops that prefetch one
    /// tile ahead.
    pub const PIECE: SwapLoop = SwapLoop { tail: false, ahead2: false };

    /// Whether the partial K tile follows the whole ones.
    pub const fn tail(self) -> bool {
        self.tail
    }

    /// Whether the weights are prefetched two tiles ahead.
    pub const fn ahead2(self) -> bool {
        self.ahead2
    }
}

/// `W_tile @ x_tile^T` over the K range `[k_lo, k_hi)` (whole tiles) for the
/// `BLOCK_N` weight rows from `w0` and the `BLOCK_M` activation rows from
/// `m0`, as `[BLOCK_N, BLOCK_M]` f32; with `tail`, plus the partial K tile
/// from `k_hi` (`k_hi = K / BLOCK_K * BLOCK_K`). The weight words and scales
/// are loaded into registers one tile ahead before each product, or two
/// tiles ahead after it (see [`SwapLoop`]). The dequantized weights are
/// the `a` operand (on sm_90a the codegen writes each tile into a ring of
/// shared-memory stages that `wgmma` reads in place; `mma.sync` takes it
/// from registers), and the activations are the `b` operand,
/// which the codegen pipelines into shared memory (TMA on sm_90a). The W
/// tile is formed in K order: viewed as `[BLOCK_N, BLOCK_K / 16, 4, 4]`,
/// element `(r, h, j, e)` is column `16 h + 4 j + e` of the tile, byte `e`
/// of the row's 32-bit word `wpb * (h / 2) + j` (Q4: `wpb = 4` words per
/// block, the nibble `h % 2` of the byte, as byte `b` of a block holds
/// columns `b` and `b + 16`) or `wpb * (h / 2) + 4 (h % 2) + j` (Q8_0: `wpb
/// = 8`, one byte per column). The word and scale indices are broadcast
/// along `e` (the scales along `j` and `e` too), so each thread chunk loads
/// each word and scale once. Weight rows past `rows` are clamped to the
/// last one (their results are not stored).
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn swap_acc(
    x_ptr: Tensor,
    q_ptr: Tensor,
    s_ptr: Tensor,
    m: Tensor,
    k: Tensor,
    rows: Tensor,
    m0: Tensor,
    w0: Tensor,
    k_lo: Tensor,
    k_hi: Tensor,
    pipeline: SwapLoop,
    quant: QuantFormat,
    dt: DType,
    block_m: usize,
    block_n: usize,
    block_k: usize,
) -> Tensor {
    let q8 = !quant.is_q4();
    let hq = block_k / 16;
    let wpb = if q8 { 8 } else { 4 };
    let nb = k / 32;
    let wrow = minimum(w0 + arange(0, block_n), rows - 1);
    let h = arange(0, hq);
    let j4 = expand_dims(expand_dims(arange(0, 4), 0), 0);
    // The bit offset of element `(r, h, j, e)` in its word (column `c = 16 h
    // + 4 j + e` of the tile), split into the nibble's `nib` (Q4: `4 (h %
    // 2)`, which varies between threads) and the byte's `e8 = 8 e` (which
    // varies only between a thread's registers, so it folds into constant
    // shifts; see [`swap_weights`]). Both come from one `[1, BLOCK_K]`
    // `arange` broadcast along the leading axis, which moves no data.
    let c = expand_dims(arange(0, block_k), 0);
    let nib = broadcast_to(if q8 { c * 0 } else { c / 16 % 2 * 4 }, [block_n, block_k]);
    let e8 = broadcast_to(c % 4 * 8, [block_n, block_k]);
    let half_words = if q8 { h % 2 * 4 } else { h * 0 };
    let row_words = expand_dims(expand_dims(wrow * (nb * wpb), 1), 2);
    let row_blocks = expand_dims(wrow * nb, 1);
    // The word and scale indices of the tile whose blocks start at `hb`.
    let word3 = row_words + expand_dims(expand_dims(h / 2 * wpb + half_words, 0), 2) + j4;
    let w_idx = reshape(broadcast_to(expand_dims(word3, 3), [block_n, hq, 4, 4]), [block_n, block_k]);
    let s2 = row_blocks + expand_dims(h / 2, 0);
    let s_idx = reshape(broadcast_to(expand_dims(s2, 2), [block_n, hq, 16]), [block_n, block_k]);
    // The activation tiles are boxes of the row-major `[M, K]` x (rows past
    // `M` and columns past `K` read as zero); on sm_90a TMA copies them.
    let qw = ptrcast(q_ptr, i32);
    let mut acc = zeros([block_n, block_m], f32);
    // The weight words and scales of tile i + 1 are loaded (into registers)
    // before tile i is dequantized, as in [`gemm`]'s tiled loop; the
    // activations are pipelined by the codegen.
    let have = k_hi > k_lo;
    let mut wd = load(qw + (w_idx + k_lo / 32 * wpb), mask = have, other = 0);
    let mut sr = scale_load(s_ptr, s_idx + k_lo / 32, have, quant);
    if pipeline.ahead2() {
        // Two tiles ahead, issued after the product: on sm_90a the staged
        // product's proxy fence waits for every load issued before it, and
        // these have a whole iteration to land.
        let k1 = maximum(minimum(k_lo + block_k, k_hi - block_k), k_lo);
        let mut wd1 = load(qw + (w_idx + k1 / 32 * wpb), mask = have, other = 0);
        let mut sr1 = scale_load(s_ptr, s_idx + k1 / 32, have, quant);
        for k0 in range(k_lo, k_hi, block_k) {
            let x = load_block(x_ptr, m, k, k, m0, k0, [block_m, block_k]);
            acc = dot_swapped(swap_weights(wd, nib, e8, sr, quant), x, acc, dt);
            let nk = maximum(minimum(k0 + 2 * block_k, k_hi - block_k), k_lo);
            let wd_next = load(qw + (w_idx + nk / 32 * wpb));
            let sr_next = scale_load(s_ptr, s_idx + nk / 32, have, quant);
            wd = wd1;
            sr = sr1;
            wd1 = wd_next;
            sr1 = sr_next;
        }
    } else {
        for k0 in range(k_lo, k_hi, block_k) {
            let nk = minimum(k0 + block_k, k_hi - block_k);
            let wd_next = load(qw + (w_idx + nk / 32 * wpb));
            let sr_next = scale_load(s_ptr, s_idx + nk / 32, have, quant);
            let x = load_block(x_ptr, m, k, k, m0, k0, [block_m, block_k]);
            acc = dot_swapped(swap_weights(wd, nib, e8, sr, quant), x, acc, dt);
            wd = wd_next;
            sr = sr_next;
        }
    }
    if pipeline.tail() {
        for k0 in range(k_hi, k, block_k) {
            // The last partial tile: blocks past K are clamped to the row's
            // last block, and their activations read as zero.
            let hb = minimum(k0 / 32 + h / 2, nb - 1);
            let tw = row_words + expand_dims(expand_dims(hb * wpb + half_words, 0), 2) + j4;
            let tw_idx = reshape(broadcast_to(expand_dims(tw, 3), [block_n, hq, 4, 4]), [block_n, block_k]);
            let ts2 = row_blocks + expand_dims(hb, 0);
            let ts = reshape(broadcast_to(expand_dims(ts2, 2), [block_n, hq, 16]), [block_n, block_k]);
            let sr = scale_load(s_ptr, ts, k0 < k, quant);
            let w = swap_weights(load(qw + tw_idx), nib, e8, sr, quant);
            let x = load_block(x_ptr, m, k, k, m0, k0, [block_m, block_k]);
            acc = dot_swapped(w, x, acc, dt);
        }
    }
    acc
}

/// The f32 weights of [`gemm_swap`]'s tile: the byte (Q8_0) or nibble (Q4)
/// at bit offset `nib + e8` of the words `wd` (`nib` is 0 for Q8_0), scaled
/// with the raw scale entries `sr` of [`scale_load`]. For Q4 each word
/// is shifted by `nib` once; then `e8`, a constant of each register, moves
/// the nibble to bits 16-19 (no shift at all for `e8 = 16`), where it is
/// the top of the mantissa of `128.0` (`0x4300_0000`): `f = 128 + q`, and
/// `w = d f + (off - 112 d)`, with `off` of [`q4_scale_decode`] (`m - 16 d`
/// or `-24 d`). Q4_0 stays exact (`d (q - 8)`); for Q4_1 the offset
/// `m - 128 d` is rounded once more, by at most `2^-24 (|m| + 128 |d|)`.
#[kernel_fn]
pub fn swap_weights(wd: Tensor, nib: Tensor, e8: Tensor, sr: Tensor, quant: QuantFormat) -> Tensor {
    if !quant.is_q4() {
        q8_weights(wd, e8, sr.to(f32))
    } else {
        let (d, off) = q4_scale_decode(sr, quant);
        let wn = wd >> nib;
        let t = where_(e8 <= 16, wn << maximum(16 - e8, 0), wn >> maximum(e8 - 16, 0));
        let f = (t & 0xF_0000 | 0x4300_0000).bitcast(f32);
        fma(d, f, fma(d, -112.0, off))
    }
}

/// The dequant GEMM (prefill): `out[M, N] = x[M, K] @ W^T` with `W`
/// repacked in the format `QUANT`; with `SILU`, `silu(x @ Wg^T) * (x @
/// Wu^T)` from interleaved gate/up rows; with `SWAP`, the swapped product
/// ([`gemm_swap`]). Each format is its own specialization (IR name
/// `gemm_q4_1`, ...). The output is in `O` (`T`, or f32 for logits).
///
/// Unswapped, the program's W tile `[BLOCK_N, width]` holds one quant byte
/// per element: for the nibble formats (Q4_0, Q4_1, `width = BLOCK_K / 2`)
/// it is dequantized per K tile into its low-nibble and high-nibble halves,
/// each multiplied with the matching `[BLOCK_M, width]` activation tile; for
/// the byte format (Q8_0, `width = BLOCK_K`) one weight per element, against
/// the `[BLOCK_M, BLOCK_K]` activation tile.
///
/// The unswapped autotune configs size the K tile in quant bytes per weight
/// row (`BLOCK_K = QUANT.k_tile(bytes)`: 32 or 64 bytes); the swapped ones
/// take 64 weights in every format.
#[kernel(
    name = "gemm_{QUANT}",
    autotune(
        configs = [
            (BLOCK_M = 64, BLOCK_N = 64, BLOCK_K = QUANT.k_tile(32), SWAP = false, num_warps = 4),
            (BLOCK_M = 128, BLOCK_N = 128, BLOCK_K = QUANT.k_tile(32), SWAP = false, num_warps = 8),
            (BLOCK_M = 64, BLOCK_N = 128, BLOCK_K = QUANT.k_tile(64), SWAP = false, num_warps = 8),
            (BLOCK_M = 128, BLOCK_N = 64, BLOCK_K = QUANT.k_tile(64), SWAP = false, num_warps = 8),
            (BLOCK_M = 32, BLOCK_N = 32, BLOCK_K = QUANT.k_tile(64), SWAP = false, num_warps = 4),
            (BLOCK_M = 16, BLOCK_N = 32, BLOCK_K = QUANT.k_tile(64), SWAP = false, num_warps = 2),
            (BLOCK_M = 256, BLOCK_N = 128, BLOCK_K = 64, SWAP = true, num_warps = 8, num_stages = 3),
            (BLOCK_M = 256, BLOCK_N = 128, BLOCK_K = 64, SWAP = true, num_warps = 8, num_stages = 4),
            (BLOCK_M = 128, BLOCK_N = 64, BLOCK_K = 64, SWAP = true, num_warps = 4, num_stages = 4),
            (BLOCK_M = 128, BLOCK_N = 128, BLOCK_K = 64, SWAP = true, num_warps = 8, num_stages = 4),
            (BLOCK_M = 64, BLOCK_N = 64, BLOCK_K = 64, SWAP = true, num_warps = 4, num_stages = 4),
        ],
        key = [m, n, k]
    )
)]
#[allow(clippy::too_many_arguments)]
pub fn gemm<T: Float, O: Float>(
    x_ptr: Ptr<T>,
    q_ptr: Ptr<u8>,
    s_ptr: Ptr<f16>,
    out_ptr: Ptr<O>,
    m: i32,
    n: i32,
    k: i32,
    #[constexpr] QUANT: QuantFormat,
    #[constexpr] SILU: bool,
    #[constexpr] BLOCK_M: usize,
    #[constexpr] BLOCK_N: usize,
    #[constexpr] BLOCK_K: usize,
    #[constexpr] SWAP: bool,
) {
    if SWAP {
        gemm_swap(x_ptr, q_ptr, s_ptr, out_ptr, m, n, k, QUANT, SILU, T, BLOCK_M, BLOCK_N, BLOCK_K);
    } else {
        word_tiled_only(QUANT);
        gdc_wait();
        gdc_launch_dependents();
        let q4 = QUANT.is_q4();
        let width = if q4 { BLOCK_K / 2 } else { BLOCK_K };
        let (pid_n, rows, nb, wl, j, s_idx, w_idx, sh) = weight_tile(n, k, SILU, QUANT, 1, BLOCK_N, width);
        let qw = ptrcast(q_ptr, i32);
        let (c, mrow, x_off) = x_tile(m, k, QUANT, 0, BLOCK_M, width, width);
        let mut acc = zeros([BLOCK_M, BLOCK_N], f32);
        let k_full = k / BLOCK_K * BLOCK_K;
        // Software pipelining as in the GEMV: the loads of tile i + 1 are issued
        // before tile i is dequantized and multiplied (the last tile reloads
        // itself); the first tile's loads are masked off without a whole tile.
        let have = k_full > 0;
        let mut wd = load(qw + w_idx, mask = have, other = 0);
        let mut sr = scale_load(s_ptr, s_idx, have, QUANT);
        let mut xa = load(x_ptr + x_off, mask = have, other = 0.0);
        if q4 {
            let mut xb = load(x_ptr + x_off + 16, mask = have, other = 0.0);
            for k0 in range(0, k_full, BLOCK_K) {
                let (nk, wd_next, sr_next, xa_next) =
                    next_tile(qw, w_idx, s_ptr, s_idx, x_ptr, x_off, k0, k_full, QUANT, BLOCK_K);
                let xb_next = load(x_ptr + x_off + nk + 16);
                let (d, off) = q4_scale_decode(sr, QUANT);
                let (w_lo, w_hi) = q4_weights(wd, sh, d, off);
                acc = dot_wt(xa.to(f32), w_lo, acc, BLOCK_M, BLOCK_N, width);
                acc = dot_wt(xb.to(f32), w_hi, acc, BLOCK_M, BLOCK_N, width);
                wd = wd_next;
                sr = sr_next;
                xa = xa_next;
                xb = xb_next;
            }
            for k0 in range(k_full, k, BLOCK_K) {
                let (s, wd) = tail_words(qw, pid_n, rows, nb, wl, j, k0, QUANT, BLOCK_N, width);
                let (d, off) = q4_scales(s_ptr, s, QUANT);
                let (w_lo, w_hi) = q4_weights(wd, sh, d, off);
                let (_, valid, xk) = q4_tail_x(x_ptr, mrow, c, k, nb, k0);
                let xl = where_(valid, load(xk).to(f32), 0.0);
                let xh = where_(valid, load(xk + 16).to(f32), 0.0);
                acc = dot_wt(xl, w_lo, acc, BLOCK_M, BLOCK_N, width);
                acc = dot_wt(xh, w_hi, acc, BLOCK_M, BLOCK_N, width);
            }
        } else {
            for k0 in range(0, k_full, BLOCK_K) {
                let (_, wd_next, sr_next, xa_next) =
                    next_tile(qw, w_idx, s_ptr, s_idx, x_ptr, x_off, k0, k_full, QUANT, BLOCK_K);
                let w = q8_weights(wd, sh, sr.to(f32));
                acc = dot_wt(xa.to(f32), w, acc, BLOCK_M, BLOCK_N, width);
                wd = wd_next;
                sr = sr_next;
                xa = xa_next;
            }
            for k0 in range(k_full, k, BLOCK_K) {
                let (s, wd) = tail_words(qw, pid_n, rows, nb, wl, j, k0, QUANT, BLOCK_N, width);
                let d = load(s_ptr + s).to(f32);
                let w = q8_weights(wd, sh, d);
                let (_, valid, xt) = q8_tail_x(x_ptr, mrow, c, k, k0);
                let x = where_(valid, xt.to(f32), 0.0);
                acc = dot_wt(x, w, acc, BLOCK_M, BLOCK_N, width);
            }
        }
        gemm_epilogue(acc, out_ptr, m, n, n, SILU, program_id(0), program_id(1), BLOCK_M, BLOCK_N);
    }
}

/// The 32-bit word and scale-entry indices of a `[block_n, block_k]` weight
/// tile formed in K order (see [`swap_acc`]): element `(r, c)`
/// with `c = 16 h + 4 j + e` is byte `e` of word `wpb * hb[h] + 4 (h % 2) + j`
/// (Q8_0, `wpb = 8`) or `wpb * hb[h] + j` (Q4, `wpb = 4`, the nibble `h % 2`)
/// of row `wrow[r]`, whose block `hb[h]` has scale entry `wrow[r] * nb +
/// hb[h]`. `hb` (`[block_k / 16]`) is the block of each 16-column group.
/// The indices are broadcast along `e` (and the scales along `j`), so each
/// thread chunk loads each word and scale once.
#[kernel_fn]
pub fn tile_index(
    wrow: Tensor,
    nb: Tensor,
    hb: Tensor,
    quant: QuantFormat,
    block_n: usize,
    block_k: usize,
) -> (Tensor, Tensor) {
    let q8 = !quant.is_q4();
    let hq = block_k / 16;
    let wpb = if q8 { 8 } else { 4 };
    let h = arange(0, hq);
    let j4 = expand_dims(expand_dims(arange(0, 4), 0), 0);
    let half_words = if q8 { h % 2 * 4 } else { h * 0 };
    let row_words = expand_dims(expand_dims(wrow * (nb * wpb), 1), 2);
    let word3 = row_words + expand_dims(expand_dims(hb * wpb + half_words, 0), 2) + j4;
    let w_idx = reshape(broadcast_to(expand_dims(word3, 3), [block_n, hq, 4, 4]), [block_n, block_k]);
    let s2 = expand_dims(wrow * nb, 1) + expand_dims(hb, 0);
    let s_idx = reshape(broadcast_to(expand_dims(s2, 2), [block_n, hq, 16]), [block_n, block_k]);
    (w_idx, s_idx)
}
