//! Stream-K for the swapped GEMM ([`super::gemm::gemm_swap`]): when a
//! product has fewer output tiles than the GPU has SMs, the tiled grid
//! leaves SMs idle; here one program per SM takes an even share of all the
//! (output tile, K tile) iterations, and the programs that share an output
//! tile add their partial sums through a workspace and flags. The tile
//! product itself is [`super::gemm::swap_acc`]'s, on whole K tiles
//! ([`super::gemm::SwapLoop::PIECE`]). See the parent module for the math,
//! the layout and the constexprs, and [`super::stream_k()`] for when the
//! runtime launches it.

use super::QuantFormat;
use super::gemm::{SwapLoop, gemm_epilogue, swap_acc};
use super::gemv::word_tiled_only;
use dsl_core::DType;
use dsl_macros::{kernel, kernel_fn};

/// The stream-K form of [`super::gemm::gemm_swap`] ([`gemm_stream_k`]): the `tiles`
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
    let acc =
        sk_piece(x_ptr, q_ptr, s_ptr, m, k, rows, ta, tiles_m, a0, a1, quant, dt, block_m, block_n, block_k);
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
    let (tb, b0) = (ta + 1, full([], 0, i32));
    let acc_b =
        sk_piece(x_ptr, q_ptr, s_ptr, m, k, rows, tb, tiles_m, b0, b1, quant, dt, block_m, block_n, block_k);
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

/// One piece of [`gemm_swap_sk`]: [`swap_acc`] of output tile `t` (`t %
/// tiles_m` along M, `t / tiles_m` along N) over its K tiles `[lo, hi)`.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn sk_piece(
    x_ptr: Tensor,
    q_ptr: Tensor,
    s_ptr: Tensor,
    m: Tensor,
    k: Tensor,
    rows: Tensor,
    t: Tensor,
    tiles_m: Tensor,
    lo: Tensor,
    hi: Tensor,
    quant: QuantFormat,
    dt: DType,
    block_m: usize,
    block_n: usize,
    block_k: usize,
) -> Tensor {
    swap_acc(
        x_ptr,
        q_ptr,
        s_ptr,
        m,
        k,
        rows,
        t % tiles_m * block_m,
        t / tiles_m * block_n,
        lo * block_k,
        hi * block_k,
        SwapLoop::PIECE,
        quant,
        dt,
        block_m,
        block_n,
        block_k,
    )
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
        n,
        silu,
        t % tiles_m,
        t / tiles_m,
        block_m,
        block_n,
    );
}

/// Stream-K swapped GEMM: [`super::gemm::gemm`] with `SWAP` (for the format `QUANT`),
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
    #[constexpr] QUANT: QuantFormat,
    #[constexpr] SILU: bool,
    #[constexpr] BLOCK_M: usize,
    #[constexpr] BLOCK_N: usize,
    #[constexpr] BLOCK_K: usize,
) {
    gemm_swap_sk(
        x_ptr, q_ptr, s_ptr, out_ptr, ws_ptr, flag_ptr, m, n, k, QUANT, SILU, T, BLOCK_M, BLOCK_N, BLOCK_K,
    );
}
