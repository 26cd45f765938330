//! The prefill path: `y[M, N] = x[M, K] @ W^T` for `M` above the GEMV's
//! range, tiled over `[BLOCK_M, BLOCK_N]` output tiles with a K loop that
//! dequantizes the W tile to f32, rounds it and the activation tile to f16
//! and accumulates with `dot` in f32 (tensor cores, `mma.sync.m16n8k16`, for
//! tiles that fit whole instructions). See the parent module for the math,
//! the repacked layout, the tiling, the constexprs and the error model.

use super::gemv::{
    q4_scale_decode, q4_scale_load, q4_scale_load_all, q4_scales, q4_weights, q8_weights, unit_index,
};
use dsl_core::DType;
use dsl_macros::{kernel, kernel_fn};

/// Stores the `[BLOCK_M, BLOCK_N]` accumulator of output tile `(pid_m,
/// pid_n)` (activation rows from `pid_m * BLOCK_M`, weight rows from `pid_n
/// * BLOCK_N`); with `silu`, weight rows come in (gate, up) pairs and the
/// tile holds `BLOCK_N / 2` output columns of `silu(gate) * up`.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn gemm_epilogue(
    acc: Tensor,
    out_ptr: Tensor,
    m: Tensor,
    n: Tensor,
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
        store(out_ptr + om * n + on, y, mask = om < m && on < n);
    } else {
        let o = arange(0, block_m * block_n);
        let om = pid_m * block_m + o / block_n;
        let on = pid_n * block_n + o % block_n;
        store(out_ptr + om * n + on, reshape(acc, [block_m * block_n]), mask = om < m && on < n);
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

/// The Q4 GEMM shared by [`gemm_q4_0`] and [`gemm_q4_1`] (`has_min`): per K
/// tile, the W tile `[BLOCK_N, BLOCK_K / 2]` of quant bytes is dequantized
/// into its low-nibble and high-nibble halves, and the two matching
/// `[BLOCK_M, BLOCK_K / 2]` activation tiles are multiplied with them.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn gemm_q4_body(
    x_ptr: Tensor,
    q_ptr: Tensor,
    s_ptr: Tensor,
    out_ptr: Tensor,
    m: Tensor,
    n: Tensor,
    k: Tensor,
    has_min: bool,
    silu: bool,
    block_m: usize,
    block_n: usize,
    block_k: usize,
) {
    gdc_wait();
    gdc_launch_dependents();
    let half = block_k / 2;
    let pid_n = program_id(1);
    let rows = if silu { n * 2 } else { n };
    let nb = k / 32;
    let s_idx = unit_index(pid_n * block_n, rows, nb, block_n, half, 16);
    let wl = arange(0, block_n * half);
    let j = wl % 16;
    let w_idx = unit_index(pid_n * block_n, rows, nb * 2, block_n, half, 8) * 2 + wl % 8 / 4;
    let sh = j % 4 * 8;
    let qw = ptrcast(q_ptr, i32);
    let xl_ = arange(0, block_m * half);
    let c = xl_ % half;
    let mrow = minimum(program_id(0) * block_m + xl_ / half, m - 1);
    let x_off = mrow * k + c / 16 * 32 + c % 16;
    let mut acc = zeros([block_m, block_n], f32);
    let k_full = k / block_k * block_k;
    // Software pipelining as in the GEMV: the loads of tile i + 1 are issued
    // before tile i is dequantized and multiplied (the last tile reloads
    // itself); the first tile's loads are masked off without a whole tile.
    let have = k_full > 0;
    let mut wd = load(qw + w_idx, mask = have, other = 0);
    let mut sr = q4_scale_load(s_ptr, s_idx, have, has_min);
    let mut xa = load(x_ptr + x_off, mask = have, other = 0.0);
    let mut xb = load(x_ptr + x_off + 16, mask = have, other = 0.0);
    for k0 in range(0, k_full, block_k) {
        let nk = minimum(k0 + block_k, k_full - block_k);
        let wd_next = load(qw + w_idx + nk / 8);
        let sr_next = q4_scale_load_all(s_ptr, s_idx + nk / 32, has_min);
        let xa_next = load(x_ptr + x_off + nk);
        let xb_next = load(x_ptr + x_off + nk + 16);
        let (d, off) = q4_scale_decode(sr, has_min);
        let (w_lo, w_hi) = q4_weights(wd, sh, d, off);
        acc = dot_wt(xa.to(f32), w_lo, acc, block_m, block_n, half);
        acc = dot_wt(xb.to(f32), w_hi, acc, block_m, block_n, half);
        wd = wd_next;
        sr = sr_next;
        xa = xa_next;
        xb = xb_next;
    }
    for k0 in range(k_full, k, block_k) {
        let row = minimum(pid_n * block_n + wl / half, rows - 1);
        let s = row * nb + minimum(k0 / 32 + wl % half / 16, nb - 1);
        let wd = load(qw + s * 4 + j / 4);
        let (d, off) = q4_scales(s_ptr, s, has_min);
        let (w_lo, w_hi) = q4_weights(wd, sh, d, off);
        let xkb = k0 / 32 + c / 16;
        let valid = xkb < nb;
        let xk = x_ptr + mrow * k + minimum(xkb, nb - 1) * 32 + c % 16;
        let xl = where_(valid, load(xk).to(f32), 0.0);
        let xh = where_(valid, load(xk + 16).to(f32), 0.0);
        acc = dot_wt(xl, w_lo, acc, block_m, block_n, half);
        acc = dot_wt(xh, w_hi, acc, block_m, block_n, half);
    }
    gemm_epilogue(acc, out_ptr, m, n, silu, program_id(0), program_id(1), block_m, block_n);
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

/// The swapped GEMM ([`gemm_q4_1`] and the others with `SWAP`): the
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
    q8: bool,
    has_min: bool,
    silu: bool,
    dt: DType,
    block_m: usize,
    block_n: usize,
    block_k: usize,
) {
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
        true,
        true,
        q8,
        has_min,
        dt,
        block_m,
        block_n,
        block_k,
    );
    gemm_epilogue(trans(acc), out_ptr, m, n, silu, pid_m, pid_n, block_m, block_n);
}

/// `W_tile @ x_tile^T` over the K range `[k_lo, k_hi)` (whole tiles) for the
/// `BLOCK_N` weight rows from `w0` and the `BLOCK_M` activation rows from
/// `m0`, as `[BLOCK_N, BLOCK_M]` f32; with `tail`, plus the partial K tile
/// from `k_hi` (`k_hi = K / BLOCK_K * BLOCK_K`). The weight words and scales
/// are loaded into registers one tile ahead before each product, or with
/// `ahead2` two tiles ahead after it (the tiled kernel: M 64 x N 14336 58.8
/// -> 54.0 us, M 256 x N 14336 74.3 -> 73.5, H100, same call; the stream-K
/// pieces, short loops, keep one tile). The dequantized weights are
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
    tail: bool,
    ahead2: bool,
    q8: bool,
    has_min: bool,
    dt: DType,
    block_m: usize,
    block_n: usize,
    block_k: usize,
) -> Tensor {
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
    // before tile i is dequantized, as in [`gemm_q4_body`]; the activations
    // are pipelined by the codegen.
    let have = k_hi > k_lo;
    let mut wd = load(qw + (w_idx + k_lo / 32 * wpb), mask = have, other = 0);
    let mut sr = swap_scale_load(s_ptr, s_idx + k_lo / 32, have, q8, has_min);
    if ahead2 {
        // Two tiles ahead, issued after the product: on sm_90a the staged
        // product's proxy fence waits for every load issued before it, and
        // these have a whole iteration to land.
        let k1 = maximum(minimum(k_lo + block_k, k_hi - block_k), k_lo);
        let mut wd1 = load(qw + (w_idx + k1 / 32 * wpb), mask = have, other = 0);
        let mut sr1 = swap_scale_load(s_ptr, s_idx + k1 / 32, have, q8, has_min);
        for k0 in range(k_lo, k_hi, block_k) {
            let x = load_block(x_ptr, m, k, k, m0, k0, [block_m, block_k]);
            acc = dot_swapped(swap_weights(wd, nib, e8, sr, q8, has_min), x, acc, dt);
            let nk = maximum(minimum(k0 + 2 * block_k, k_hi - block_k), k_lo);
            let wd_next = load(qw + (w_idx + nk / 32 * wpb));
            let sr_next = swap_scale_load(s_ptr, s_idx + nk / 32, have, q8, has_min);
            wd = wd1;
            sr = sr1;
            wd1 = wd_next;
            sr1 = sr_next;
        }
    } else {
        for k0 in range(k_lo, k_hi, block_k) {
            let nk = minimum(k0 + block_k, k_hi - block_k);
            let wd_next = load(qw + (w_idx + nk / 32 * wpb));
            let sr_next = swap_scale_load(s_ptr, s_idx + nk / 32, have, q8, has_min);
            let x = load_block(x_ptr, m, k, k, m0, k0, [block_m, block_k]);
            acc = dot_swapped(swap_weights(wd, nib, e8, sr, q8, has_min), x, acc, dt);
            wd = wd_next;
            sr = sr_next;
        }
    }
    if tail {
        for k0 in range(k_hi, k, block_k) {
            // The last partial tile: blocks past K are clamped to the row's
            // last block, and their activations read as zero.
            let hb = minimum(k0 / 32 + h / 2, nb - 1);
            let tw = row_words + expand_dims(expand_dims(hb * wpb + half_words, 0), 2) + j4;
            let tw_idx = reshape(broadcast_to(expand_dims(tw, 3), [block_n, hq, 4, 4]), [block_n, block_k]);
            let ts2 = row_blocks + expand_dims(hb, 0);
            let ts = reshape(broadcast_to(expand_dims(ts2, 2), [block_n, hq, 16]), [block_n, block_k]);
            let sr = swap_scale_load(s_ptr, ts, k0 < k, q8, has_min);
            let w = swap_weights(load(qw + tw_idx), nib, e8, sr, q8, has_min);
            let x = load_block(x_ptr, m, k, k, m0, k0, [block_m, block_k]);
            acc = dot_swapped(w, x, acc, dt);
        }
    }
    acc
}

/// The stream-K form of [`gemm_swap`] ([`gemm_stream_k`]): the `tiles`
/// output tiles times `ipt = K / BLOCK_K` K tiles make `tiles * ipt`
/// iterations (tile-major, K inner), split evenly over the `G` programs:
/// `q = G - 1 - program_id(0)` runs iterations `[q T / G, (q + 1) T / G)`.
/// With `tiles <= G` (the runtime's rule) that range is at most `ipt` long,
/// so it covers the end of one tile (piece A) and perhaps the start of the
/// next (piece B). A piece that does not start its tile (K offset > 0) is a
/// partial sum: it goes to the program's slot of the f32 workspace `ws`
/// (`[G, BLOCK_M * BLOCK_N]`) and `flags[q]` is set (`atomic_xchg`, release
/// after a CTA barrier). The piece that starts a tile finishes it: it takes
/// each later program whose range starts inside the tile, spins until its
/// flag is set, resets it (so the flags are zero again after every launch)
/// and adds its slot, then stores the tile. Waits go from a program to
/// programs with lower `program_id`, whose first piece never waits, so the
/// handshake cannot deadlock (the interpreter, running programs in order,
/// never spins). Tiles are numbered `pid_n * tiles_m + pid_m`, so
/// neighbouring programs share weight rows. `K % BLOCK_K == 0` and `tiles
/// <= G` are asserted; `tiles * ipt * G < 2^31` is the caller's (the
/// runtime's) to ensure.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn gemm_swap_sk(
    x_ptr: Tensor,
    q_ptr: Tensor,
    s_ptr: Tensor,
    out_ptr: Tensor,
    ws_ptr: Tensor,
    flag_ptr: Tensor,
    m: Tensor,
    n: Tensor,
    k: Tensor,
    q8: bool,
    has_min: bool,
    silu: bool,
    dt: DType,
    block_m: usize,
    block_n: usize,
    block_k: usize,
) {
    gdc_wait();
    gdc_launch_dependents();
    let rows = if silu { n * 2 } else { n };
    let tiles_m = cdiv(m, block_m);
    let ipt = k / block_k;
    let total = tiles_m * cdiv(rows, block_n) * ipt;
    let g = num_programs(0);
    device_assert(
        k % block_k == 0 && total / ipt <= g,
        "gemm_stream_k needs K % BLOCK_K == 0 and at least one program per output tile",
    );
    let q = g - 1 - program_id(0);
    let start = q * total / g;
    let end = (q + 1) * total / g;
    // Piece A: the rest of tile `ta` from K tile `a0`.
    let ta = start / ipt;
    let a0 = start % ipt;
    let a1 = minimum(ipt, a0 + (end - start));
    let acc = swap_acc(
        x_ptr,
        q_ptr,
        s_ptr,
        m,
        k,
        rows,
        ta % tiles_m * block_m,
        ta / tiles_m * block_n,
        a0 * block_k,
        a1 * block_k,
        false,
        false,
        q8,
        has_min,
        dt,
        block_m,
        block_n,
        block_k,
    );
    let tile_len = block_m * block_n;
    let slot = arange(0, tile_len);
    if a0 > 0 {
        store(ws_ptr + q * tile_len + slot, reshape(trans(acc), [tile_len]));
        atomic_xchg(flag_ptr + q, 1);
    } else {
        if end > start {
            sk_finish(
                trans(acc),
                out_ptr,
                ws_ptr,
                flag_ptr,
                m,
                n,
                silu,
                ta,
                tiles_m,
                ipt,
                total,
                q,
                block_m,
                block_n,
            );
        }
    }
    // Piece B: the start of tile `ta + 1`, up to K tile `b1` (none when 0).
    let b1 = maximum(end - (ta + 1) * ipt, 0);
    let tb = ta + 1;
    let acc_b = swap_acc(
        x_ptr,
        q_ptr,
        s_ptr,
        m,
        k,
        rows,
        tb % tiles_m * block_m,
        tb / tiles_m * block_n,
        full([], 0, i32),
        b1 * block_k,
        false,
        false,
        q8,
        has_min,
        dt,
        block_m,
        block_n,
        block_k,
    );
    if b1 > 0 {
        sk_finish(
            trans(acc_b),
            out_ptr,
            ws_ptr,
            flag_ptr,
            m,
            n,
            silu,
            tb,
            tiles_m,
            ipt,
            total,
            q,
            block_m,
            block_n,
        );
    }
}

/// Finishes output tile `t` of [`gemm_swap_sk`] from its first piece `acc`
/// (`[BLOCK_M, BLOCK_N]`, computed by program `q`): adds the partial sums of
/// the later programs whose ranges start inside the tile, then stores it.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn sk_finish(
    acc: Tensor,
    out_ptr: Tensor,
    ws_ptr: Tensor,
    flag_ptr: Tensor,
    m: Tensor,
    n: Tensor,
    silu: bool,
    t: Tensor,
    tiles_m: Tensor,
    ipt: Tensor,
    total: Tensor,
    q: Tensor,
    block_m: usize,
    block_n: usize,
) {
    let g = num_programs(0);
    let tile_len = block_m * block_n;
    let slot = arange(0, tile_len);
    let tile_end = (t + 1) * ipt;
    let mut sum = reshape(acc, [tile_len]);
    let mut p = q + 1;
    while p < g && p * total / g < tile_end {
        let mut set = 0;
        while set == 0 {
            set = atomic_xchg(flag_ptr + p, 0);
        }
        // `.cg`: the partial was written by another SM in this launch.
        sum = sum + load(ws_ptr + p * tile_len + slot, cache_modifier = ".cg");
        p = p + 1;
    }
    gemm_epilogue(
        reshape(sum, [block_m, block_n]),
        out_ptr,
        m,
        n,
        silu,
        t % tiles_m,
        t / tiles_m,
        block_m,
        block_n,
    );
}

/// Stream-K swapped GEMM: [`gemm_q4_1`] / [`gemm_q4_0`] / [`gemm_q8_0`]
/// with `SWAP` (`Q8`, `HAS_MIN` pick the format: Q8_0, Q4_1, else Q4_0),
/// its `tiles * K / BLOCK_K` iterations split evenly over the grid
/// `[G, 1, 1]` (see [`gemm_swap_sk`]). For products with fewer output tiles
/// than the GPU has SMs, where the tiled grid leaves SMs idle: the runtime
/// launches one program per SM. `ws` holds `G * BLOCK_M * BLOCK_N` f32
/// (partial sums; any contents) and `flags` `G` i32 that must be zero
/// before the first launch (every launch leaves them zero).
#[kernel(autotune(
    configs = [
        (BLOCK_M = 256, BLOCK_N = 128, BLOCK_K = 64, num_warps = 8, num_stages = 3),
        (BLOCK_M = 256, BLOCK_N = 128, BLOCK_K = 64, num_warps = 8, num_stages = 4),
    ],
    key = [m, n, k]
))]
#[allow(clippy::too_many_arguments)]
pub fn gemm_stream_k<T: Float>(
    x_ptr: Ptr<T>,
    q_ptr: Ptr<u8>,
    s_ptr: Ptr<f16>,
    out_ptr: Ptr<T>,
    ws_ptr: Ptr<f32>,
    flag_ptr: Ptr<i32>,
    m: i32,
    n: i32,
    k: i32,
    #[constexpr] SILU: bool,
    #[constexpr] Q8: bool,
    #[constexpr] HAS_MIN: bool,
    #[constexpr] BLOCK_M: usize,
    #[constexpr] BLOCK_N: usize,
    #[constexpr] BLOCK_K: usize,
) {
    gemm_swap_sk(
        x_ptr, q_ptr, s_ptr, out_ptr, ws_ptr, flag_ptr, m, n, k, Q8, HAS_MIN, SILU, T, BLOCK_M, BLOCK_N,
        BLOCK_K,
    );
}

/// The raw scale entries at `s` for [`gemm_swap`] (see [`q4_scale_load`];
/// Q8_0 planes hold `d`); lanes where `ok` is false read nothing.
#[kernel_fn]
pub fn swap_scale_load(s_ptr: Tensor, s: Tensor, ok: Tensor, q8: bool, has_min: bool) -> Tensor {
    if q8 { load(s_ptr + s, mask = ok, other = 0.0) } else { q4_scale_load(s_ptr, s, ok, has_min) }
}

/// The f32 weights of [`gemm_swap`]'s tile: the byte (Q8_0) or nibble (Q4)
/// at bit offset `nib + e8` of the words `wd` (`nib` is 0 for Q8_0), scaled
/// with the raw scale entries `sr` of [`swap_scale_load`]. For Q4 each word
/// is shifted by `nib` once; then `e8`, a constant of each register, moves
/// the nibble to bits 16-19 (no shift at all for `e8 = 16`), where it is
/// the top of the mantissa of `128.0` (`0x4300_0000`): `f = 128 + q`, and
/// `w = d f + (off - 112 d)`, with `off` of [`q4_scale_decode`] (`m - 16 d`
/// or `-24 d`). Q4_0 stays exact (`d (q - 8)`); for Q4_1 the offset
/// `m - 128 d` is rounded once more, by at most `2^-24 (|m| + 128 |d|)`.
#[kernel_fn]
pub fn swap_weights(wd: Tensor, nib: Tensor, e8: Tensor, sr: Tensor, q8: bool, has_min: bool) -> Tensor {
    if q8 {
        q8_weights(wd, e8, sr.to(f32))
    } else {
        let (d, off) = q4_scale_decode(sr, has_min);
        let wn = wd >> nib;
        let t = where_(e8 <= 16, wn << maximum(16 - e8, 0), wn >> maximum(e8 - 16, 0));
        let f = (t & 0xF_0000 | 0x4300_0000).bitcast(f32);
        fma(d, f, fma(d, -112.0, off))
    }
}

/// The Q8_0 GEMM ([`gemm_q8_0`]): W tile `[BLOCK_N, BLOCK_K]`, one weight
/// per element, against the `[BLOCK_M, BLOCK_K]` activation tile.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn gemm_q8_body(
    x_ptr: Tensor,
    q_ptr: Tensor,
    s_ptr: Tensor,
    out_ptr: Tensor,
    m: Tensor,
    n: Tensor,
    k: Tensor,
    silu: bool,
    block_m: usize,
    block_n: usize,
    block_k: usize,
) {
    gdc_wait();
    gdc_launch_dependents();
    let pid_n = program_id(1);
    let rows = if silu { n * 2 } else { n };
    let nb = k / 32;
    let s_idx = unit_index(pid_n * block_n, rows, nb, block_n, block_k, 32);
    let wl = arange(0, block_n * block_k);
    let j = wl % 32;
    let w_idx = unit_index(pid_n * block_n, rows, nb * 4, block_n, block_k, 8) * 2 + wl % 8 / 4;
    let sh = j % 4 * 8;
    let qw = ptrcast(q_ptr, i32);
    let xl_ = arange(0, block_m * block_k);
    let c = xl_ % block_k;
    let mrow = minimum(program_id(0) * block_m + xl_ / block_k, m - 1);
    let x_off = mrow * k + c;
    let mut acc = zeros([block_m, block_n], f32);
    let k_full = k / block_k * block_k;
    // Software pipelining as in [`gemm_q4_body`].
    let have = k_full > 0;
    let mut wd = load(qw + w_idx, mask = have, other = 0);
    let mut sr = load(s_ptr + s_idx, mask = have, other = 0.0);
    let mut xa = load(x_ptr + x_off, mask = have, other = 0.0);
    for k0 in range(0, k_full, block_k) {
        let nk = minimum(k0 + block_k, k_full - block_k);
        let wd_next = load(qw + w_idx + nk / 4);
        let sr_next = load(s_ptr + s_idx + nk / 32);
        let xa_next = load(x_ptr + x_off + nk);
        let w = q8_weights(wd, sh, sr.to(f32));
        acc = dot_wt(xa.to(f32), w, acc, block_m, block_n, block_k);
        wd = wd_next;
        sr = sr_next;
        xa = xa_next;
    }
    for k0 in range(k_full, k, block_k) {
        let row = minimum(pid_n * block_n + wl / block_k, rows - 1);
        let s = row * nb + minimum(k0 / 32 + wl % block_k / 32, nb - 1);
        let wd = load(qw + s * 8 + j / 4);
        let d = load(s_ptr + s).to(f32);
        let w = q8_weights(wd, sh, d);
        let xk = k0 + c;
        let valid = xk < k;
        let x = where_(valid, load(x_ptr + mrow * k + minimum(xk, k - 1)).to(f32), 0.0);
        acc = dot_wt(x, w, acc, block_m, block_n, block_k);
    }
    gemm_epilogue(acc, out_ptr, m, n, silu, program_id(0), program_id(1), block_m, block_n);
}

/// Q4_1 GEMM (prefill): `out[M, N] = x[M, K] @ W^T` with `W` repacked Q4_1;
/// with `SILU`, `silu(x @ Wg^T) * (x @ Wu^T)` from interleaved gate/up rows.
#[kernel(autotune(
    configs = [
        (BLOCK_M = 64, BLOCK_N = 64, BLOCK_K = 64, SWAP = false, num_warps = 4),
        (BLOCK_M = 128, BLOCK_N = 128, BLOCK_K = 64, SWAP = false, num_warps = 8),
        (BLOCK_M = 64, BLOCK_N = 128, BLOCK_K = 128, SWAP = false, num_warps = 8),
        (BLOCK_M = 128, BLOCK_N = 64, BLOCK_K = 128, SWAP = false, num_warps = 8),
        (BLOCK_M = 32, BLOCK_N = 32, BLOCK_K = 128, SWAP = false, num_warps = 4),
        (BLOCK_M = 16, BLOCK_N = 32, BLOCK_K = 128, SWAP = false, num_warps = 2),
        (BLOCK_M = 256, BLOCK_N = 128, BLOCK_K = 64, SWAP = true, num_warps = 8, num_stages = 3),
        (BLOCK_M = 256, BLOCK_N = 128, BLOCK_K = 64, SWAP = true, num_warps = 8, num_stages = 4),
        (BLOCK_M = 128, BLOCK_N = 64, BLOCK_K = 64, SWAP = true, num_warps = 4, num_stages = 4),
        (BLOCK_M = 128, BLOCK_N = 128, BLOCK_K = 64, SWAP = true, num_warps = 8, num_stages = 4),
        (BLOCK_M = 64, BLOCK_N = 64, BLOCK_K = 64, SWAP = true, num_warps = 4, num_stages = 4),
    ],
    key = [m, n, k]
))]
#[allow(clippy::too_many_arguments)]
pub fn gemm_q4_1<T: Float>(
    x_ptr: Ptr<T>,
    q_ptr: Ptr<u8>,
    s_ptr: Ptr<f16>,
    out_ptr: Ptr<T>,
    m: i32,
    n: i32,
    k: i32,
    #[constexpr] SILU: bool,
    #[constexpr] BLOCK_M: usize,
    #[constexpr] BLOCK_N: usize,
    #[constexpr] BLOCK_K: usize,
    #[constexpr] SWAP: bool,
) {
    if SWAP {
        gemm_swap(x_ptr, q_ptr, s_ptr, out_ptr, m, n, k, false, true, SILU, T, BLOCK_M, BLOCK_N, BLOCK_K);
    } else {
        gemm_q4_body(x_ptr, q_ptr, s_ptr, out_ptr, m, n, k, true, SILU, BLOCK_M, BLOCK_N, BLOCK_K);
    }
}

/// Q4_0 GEMM: as [`gemm_q4_1`] with `W` repacked Q4_0.
#[kernel(autotune(
    configs = [
        (BLOCK_M = 64, BLOCK_N = 64, BLOCK_K = 64, SWAP = false, num_warps = 4),
        (BLOCK_M = 128, BLOCK_N = 128, BLOCK_K = 64, SWAP = false, num_warps = 8),
        (BLOCK_M = 64, BLOCK_N = 128, BLOCK_K = 128, SWAP = false, num_warps = 8),
        (BLOCK_M = 128, BLOCK_N = 64, BLOCK_K = 128, SWAP = false, num_warps = 8),
        (BLOCK_M = 32, BLOCK_N = 32, BLOCK_K = 128, SWAP = false, num_warps = 4),
        (BLOCK_M = 16, BLOCK_N = 32, BLOCK_K = 128, SWAP = false, num_warps = 2),
        (BLOCK_M = 256, BLOCK_N = 128, BLOCK_K = 64, SWAP = true, num_warps = 8, num_stages = 3),
        (BLOCK_M = 256, BLOCK_N = 128, BLOCK_K = 64, SWAP = true, num_warps = 8, num_stages = 4),
        (BLOCK_M = 128, BLOCK_N = 64, BLOCK_K = 64, SWAP = true, num_warps = 4, num_stages = 4),
        (BLOCK_M = 128, BLOCK_N = 128, BLOCK_K = 64, SWAP = true, num_warps = 8, num_stages = 4),
        (BLOCK_M = 64, BLOCK_N = 64, BLOCK_K = 64, SWAP = true, num_warps = 4, num_stages = 4),
    ],
    key = [m, n, k]
))]
#[allow(clippy::too_many_arguments)]
pub fn gemm_q4_0<T: Float>(
    x_ptr: Ptr<T>,
    q_ptr: Ptr<u8>,
    s_ptr: Ptr<f16>,
    out_ptr: Ptr<T>,
    m: i32,
    n: i32,
    k: i32,
    #[constexpr] SILU: bool,
    #[constexpr] BLOCK_M: usize,
    #[constexpr] BLOCK_N: usize,
    #[constexpr] BLOCK_K: usize,
    #[constexpr] SWAP: bool,
) {
    if SWAP {
        gemm_swap(x_ptr, q_ptr, s_ptr, out_ptr, m, n, k, false, false, SILU, T, BLOCK_M, BLOCK_N, BLOCK_K);
    } else {
        gemm_q4_body(x_ptr, q_ptr, s_ptr, out_ptr, m, n, k, false, SILU, BLOCK_M, BLOCK_N, BLOCK_K);
    }
}

/// Q8_0 GEMM: as [`gemm_q4_1`] with `W` repacked Q8_0.
#[kernel(autotune(
    configs = [
        (BLOCK_M = 64, BLOCK_N = 64, BLOCK_K = 32, SWAP = false, num_warps = 4),
        (BLOCK_M = 128, BLOCK_N = 128, BLOCK_K = 32, SWAP = false, num_warps = 8),
        (BLOCK_M = 64, BLOCK_N = 128, BLOCK_K = 64, SWAP = false, num_warps = 8),
        (BLOCK_M = 128, BLOCK_N = 64, BLOCK_K = 64, SWAP = false, num_warps = 8),
        (BLOCK_M = 32, BLOCK_N = 32, BLOCK_K = 64, SWAP = false, num_warps = 4),
        (BLOCK_M = 16, BLOCK_N = 32, BLOCK_K = 64, SWAP = false, num_warps = 2),
        (BLOCK_M = 256, BLOCK_N = 128, BLOCK_K = 64, SWAP = true, num_warps = 8, num_stages = 3),
        (BLOCK_M = 256, BLOCK_N = 128, BLOCK_K = 64, SWAP = true, num_warps = 8, num_stages = 4),
        (BLOCK_M = 128, BLOCK_N = 64, BLOCK_K = 64, SWAP = true, num_warps = 4, num_stages = 4),
        (BLOCK_M = 128, BLOCK_N = 128, BLOCK_K = 64, SWAP = true, num_warps = 8, num_stages = 4),
        (BLOCK_M = 64, BLOCK_N = 64, BLOCK_K = 64, SWAP = true, num_warps = 4, num_stages = 4),
    ],
    key = [m, n, k]
))]
#[allow(clippy::too_many_arguments)]
pub fn gemm_q8_0<T: Float>(
    x_ptr: Ptr<T>,
    q_ptr: Ptr<u8>,
    s_ptr: Ptr<f16>,
    out_ptr: Ptr<T>,
    m: i32,
    n: i32,
    k: i32,
    #[constexpr] SILU: bool,
    #[constexpr] BLOCK_M: usize,
    #[constexpr] BLOCK_N: usize,
    #[constexpr] BLOCK_K: usize,
    #[constexpr] SWAP: bool,
) {
    if SWAP {
        gemm_swap(x_ptr, q_ptr, s_ptr, out_ptr, m, n, k, true, false, SILU, T, BLOCK_M, BLOCK_N, BLOCK_K);
    } else {
        gemm_q8_body(x_ptr, q_ptr, s_ptr, out_ptr, m, n, k, SILU, BLOCK_M, BLOCK_N, BLOCK_K);
    }
}
