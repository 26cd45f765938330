//! Decode GEMVs on 8-bit activations: `y[M, N] = x[M, K] @ W^T` with the
//! activations first quantized per block of 32 ([`quantize_q8`], llama.cpp's
//! `q8_1` rule) and every product of a weight word with an activation word
//! formed by `dp4a` (four byte products and their sum in one instruction),
//! the way llama.cpp's MMVQ kernels multiply quantized matrices.
//!
//! # Math
//!
//! Activation block `b` of row `i`: `x ~ d_x q_x` with `d_x = max|x| / 127`
//! and `q_x = round(x / d_x)` (half away from zero; see
//! [`crate::reference::quant::quantize_q8`]). Weights as in the parent
//! module: Q4_1 `w = d q + m`, Q4_0 `w = d (q - 8)`, Q8_0 `w = d q`. For a
//! 32-bit word of quants (Q4: eight nibbles, the low ones the block's values
//! `4c..4c+3`, the high ones 16 further; Q8_0: four signed bytes):
//!
//! ```text
//! Q4:   dot = dp4a(word & 0x0F0F0F0F, x_lo, dp4a((word >> 4) & 0x0F0F0F0F, x_hi, 0))
//!       sum = dp4a(0x01010101, x_lo, dp4a(0x01010101, x_hi, 0))
//!       acc += (d d_x) dot + (m d_x) sum          (Q4_0: m = -8 d)
//! Q8_0: acc += (d d_x) dp4a(word, x_word, 0)
//! ```
//!
//! The integer parts are exact; the f32 scaling and accumulation round (error
//! model: [`crate::reference::quant::error_bound_q8`]). Against the product
//! with unquantized activations the result moves by at most half a
//! quantization step per value ([`crate::reference::quant::q8_activation_bound`]).
//!
//! # Layout contract
//!
//! - `x`: row-major `[M, K]` in `T`; `xq`: `[M, K]` i8 (the quants, the
//!   address 4-byte aligned), `xd`: `[M, K / 32]` f32 (the block scales),
//!   both written by [`quantize_q8`].
//! - `q_ptr`, `s_ptr`: a [`super::repack::Repacked`] weight (quant plane read
//!   as 32-bit words, scale plane as in the parent module).
//! - `K % 32 == 0`; `M, N >= 1`; 32-bit offsets as in the parent module.
//!
//! # Tiling
//!
//! The GEMV of the parent module with one element per quant *word* instead
//! of per byte: program `(i, j)` owns `BLOCK_N` weight rows and `M_BLOCK`
//! activation rows; the W tile is `[BLOCK_N, BLOCK_K / 8]` words (Q4) or
//! `[BLOCK_N, BLOCK_K / 4]` (Q8_0), so a thread chunk of 8 words is 32
//! contiguous bytes (two 16-byte loads) and needs two 16-byte activation
//! loads, shared by the thread's chunks of other rows; the f32 accumulator
//! holds one value per word (not per weight). Whole K tiles run in a
//! software-pipelined loop without masks (rows past `N` clamped), a last
//! partial tile with masks. The epilogue (and the SiLU pairing of gate/up
//! rows) is the parent module's.

use super::gemv::{gemv_epilogue, q4_scale_decode, repeat_rows, word_tiled_only};
use super::{Fuse, QuantFormat};
use dsl_macros::{kernel, kernel_fn};

/// Quantizes `x[M, K]` (`T`) to 8 bits per block of 32 values of a row:
/// `xq[M, K]` i8 and `xd[M, K / 32]` f32 (see the module doc). Grid
/// `[cdiv(K, BLOCK), M, 1]`; `BLOCK` a multiple of 32.
#[kernel]
pub fn quantize_q8<T: Float>(
    x_ptr: Ptr<T>,
    xq_ptr: Ptr<i8>,
    xd_ptr: Ptr<f32>,
    k: i32,
    #[constexpr] BLOCK: usize,
) {
    static_assert(BLOCK % 32 == 0, "BLOCK must be a multiple of 32");
    let row = program_id(1);
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let ok = offs < k;
    let x = load(x_ptr + row * k + offs, mask = ok, other = 0.0).to(f32);
    let (q, d) = q8_blocks(x, BLOCK);
    store(xq_ptr + row * k + offs, q, mask = ok);
    let b = program_id(0) * (BLOCK / 32) + arange(0, BLOCK / 32);
    store(xd_ptr + row * (k / 32) + b, d, mask = b < k / 32);
}

/// The 8-bit quantization of `x` (`[block]` f32, `block` a multiple of 32)
/// per run of 32 values: the quants (`[block]` i8) and the block scales
/// (`[block / 32]` f32), by the rule in the module doc.
#[kernel_fn]
pub fn q8_blocks(x: Tensor, block: usize) -> (Tensor, Tensor) {
    let x = reshape(x, [block / 32, 32]);
    let amax = max(abs(x), 1);
    let d = amax / 127.0;
    let id = where_(d != 0.0, 1.0 / d, 0.0);
    let s = x * expand_dims(id, 1);
    // Half away from zero (C's roundf), exact for |s| <= 127.
    let q = where_(s < 0.0, -floor(0.5 - s), floor(s + 0.5));
    (reshape(q, [block]).to(i8), d)
}

/// RMSNorm fused with the 8-bit quantization of its output, the producer of
/// a decoder's GEMV inputs: the normalized row `y = round_T(x * rstd * w)`
/// exactly as [`crate::rmsnorm::rmsnorm`] computes it (f32, one rounding to
/// `T`), then quantized as [`quantize_q8`] does, so the result equals the two
/// kernels run one after the other, with one launch and without writing `y`.
/// One program per row (grid `[rows, 1, 1]`); `BLOCK >= n_cols` a power of
/// two and `n_cols % 32 == 0`. `xq` is `[rows, n_cols]` and `xd` `[rows,
/// n_cols / 32]`, contiguous; `x` rows are `stride` apart.
#[kernel(autotune(configs = [(num_warps = 4), (num_warps = 8), (num_warps = 16)], key = [n_cols]))]
#[allow(clippy::too_many_arguments)]
pub fn rmsnorm_q8<T: Float>(
    x_ptr: Ptr<T>,
    w_ptr: Ptr<T>,
    xq_ptr: Ptr<i8>,
    xd_ptr: Ptr<f32>,
    n_cols: i32,
    stride: i32,
    eps: f32,
    #[constexpr] BLOCK: usize,
) {
    static_assert(BLOCK % 32 == 0, "BLOCK must be a multiple of 32");
    let row = program_id(0);
    let cols = arange(0, BLOCK);
    let mask = cols < n_cols;
    let x = load(x_ptr + row * stride + cols, mask = mask, other = 0.0).to(f32);
    let rstd = rsqrt(sum(x * x, 0) / n_cols + eps);
    let w = load(w_ptr + cols, mask = mask, other = 0.0).to(f32);
    let y = (x * rstd * w).to(T).to(f32);
    let (q, d) = q8_blocks(y, BLOCK);
    store(xq_ptr + row * n_cols + cols, q, mask = mask);
    let b = arange(0, BLOCK / 32);
    store(xd_ptr + row * (n_cols / 32) + b, d, mask = b < n_cols / 32);
}

/// The scale entries `s` (f16 `d` and `m` as one 32-bit word for Q4_1,
/// f16 `d` otherwise), masked by `ok`, streamed evict-first like the quant
/// words: each is read once, and L1 keeps the activations instead.
#[kernel_fn]
pub fn scale_stream(s_ptr: Tensor, s: Tensor, ok: Tensor, quant: QuantFormat) -> Tensor {
    if quant.has_min() {
        load(ptrcast(s_ptr, i32) + s, mask = ok, other = 0, eviction_policy = "evict_first")
    } else {
        load(s_ptr + s, mask = ok, other = 0.0, eviction_policy = "evict_first")
    }
}

/// `(d, m)` of Q4 scale entries `raw` for the 8-bit path: Q4_1 `w = d q + m`,
/// Q4_0 `w = d (q - 8)`, so `m = -8 d`.
#[kernel_fn]
pub fn q4_dm(raw: Tensor, quant: QuantFormat) -> (Tensor, Tensor) {
    let (d, off) = q4_scale_decode(raw, quant);
    // `off` is `m - 16 d` (Q4_1) or `-24 d` (Q4_0): add 16 d back.
    (d, fma(d, 16.0, off))
}

/// The tile coordinates of [`gemv_q8`], `kw` quant words per
/// weight row of a K tile: for each element of the W tile `[BLOCK_N, kw]`,
/// its word column and weight row (`2N` rows with `silu`, clamped); for each
/// element of the activation tile `[M_BLOCK, BLOCK_N, kw]`, its word column
/// and activation row (clamped to `m`).
#[kernel_fn]
pub fn q8_gemv_tiles(
    n: Tensor,
    m: Tensor,
    silu: bool,
    m_block: usize,
    block_n: usize,
    kw: usize,
) -> (Tensor, Tensor, Tensor, Tensor) {
    let wn = block_n * kw;
    let rows = if silu { n * 2 } else { n };
    let wl = arange(0, wn);
    let c = wl % kw;
    let row = minimum(program_id(0) * block_n + wl / kw, rows - 1);
    let al = arange(0, m_block * wn);
    let ac = al % kw;
    let mrow = minimum(program_id(1) * m_block + al / wn, m - 1);
    (c, row, ac, mrow)
}

/// One K tile of the Q4 8-bit GEMV: the integer dot products and block sums
/// of every word, scaled and added to `acc` (see the module doc).
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn q4_q8_step(
    wd: Tensor,
    sr: Tensor,
    xlo: Tensor,
    xhi: Tensor,
    xd: Tensor,
    acc: Tensor,
    quant: QuantFormat,
    m_block: usize,
    wn: usize,
) -> Tensor {
    let lo = repeat_rows(wd & 0x0F0F_0F0F, m_block, wn);
    let hi = repeat_rows((wd >> 4) & 0x0F0F_0F0F, m_block, wn);
    let dot = dp4a(lo, xlo, dp4a(hi, xhi, 0));
    let sum = dp4a(0x0101_0101, xlo, dp4a(0x0101_0101, xhi, 0));
    let (d, mm) = q4_dm(sr, quant);
    let dd = repeat_rows(d, m_block, wn) * xd;
    let md = repeat_rows(mm, m_block, wn) * xd;
    fma(dd, dot.to(f32), fma(md, sum.to(f32), acc))
}

/// One K tile of the Q8_0 8-bit GEMV: the integer dot product of every
/// weight word with its activation word, scaled and added to `acc`.
#[kernel_fn]
pub fn q8_q8_step(
    wd: Tensor,
    sd: Tensor,
    xa: Tensor,
    xd: Tensor,
    acc: Tensor,
    m_block: usize,
    wn: usize,
) -> Tensor {
    let dot = dp4a(repeat_rows(wd, m_block, wn), xa, 0);
    let dd = repeat_rows(sd.to(f32), m_block, wn) * xd;
    fma(dd, dot.to(f32), acc)
}

/// The dequant GEMV on 8-bit activations: `out = xq @ W^T` with `W`
/// repacked in the format `QUANT` (Q4_1 `w = d q + m`, Q4_0 `w = d (q -
/// 8)`, Q8_0 `w = d q`, e.g. the tied LM head); with `SILU`, the gate/up
/// epilogue of the parent module. See the module doc. Each format is its
/// own specialization (IR name `gemv_q4_1_q8`, ...).
///
/// The autotune configs size the K tile in quant bytes per weight row
/// (`BLOCK_K = QUANT.k_tile(bytes)`, four bytes per quant word); the tiles
/// tuned for some formats only say so with `when`.
#[kernel(
    name = "gemv_{QUANT}_q8",
    autotune(
        configs = [
            (when = QUANT == QuantFormat::Q8_0, M_BLOCK = 1, BLOCK_N = 4, BLOCK_K = QUANT.k_tile(1024), num_warps = 2),
            (M_BLOCK = 1, BLOCK_N = 8, BLOCK_K = QUANT.k_tile(1024), num_warps = 4),
            (when = QUANT != QuantFormat::Q4_0, M_BLOCK = 1, BLOCK_N = 8, BLOCK_K = QUANT.k_tile(512), num_warps = 4),
            (when = QUANT != QuantFormat::Q4_0, M_BLOCK = 1, BLOCK_N = 4, BLOCK_K = QUANT.k_tile(1024), num_warps = 4),
            (when = QUANT == QuantFormat::Q4_1, M_BLOCK = 1, BLOCK_N = 2, BLOCK_K = QUANT.k_tile(2048), num_warps = 4),
            (when = QUANT == QuantFormat::Q4_1, M_BLOCK = 1, BLOCK_N = 4, BLOCK_K = QUANT.k_tile(512), num_warps = 2),
            (when = QUANT == QuantFormat::Q4_1, M_BLOCK = 1, BLOCK_N = 16, BLOCK_K = QUANT.k_tile(256), num_warps = 4),
            (when = QUANT == QuantFormat::Q4_1, M_BLOCK = 1, BLOCK_N = 16, BLOCK_K = QUANT.k_tile(512), num_warps = 8),
            (M_BLOCK = 1, BLOCK_N = 16, BLOCK_K = QUANT.k_tile(512), num_warps = 4),
            (when = QUANT == QuantFormat::Q4_1, M_BLOCK = 1, BLOCK_N = 32, BLOCK_K = QUANT.k_tile(512), num_warps = 8),
            (when = QUANT == QuantFormat::Q4_1, M_BLOCK = 1, BLOCK_N = 8, BLOCK_K = QUANT.k_tile(256), num_warps = 2),
            (M_BLOCK = 2, BLOCK_N = 8, BLOCK_K = QUANT.k_tile(512), num_warps = 4),
            (when = QUANT == QuantFormat::Q4_1, M_BLOCK = 4, BLOCK_N = 8, BLOCK_K = QUANT.k_tile(256), num_warps = 4),
            (when = QUANT == QuantFormat::Q4_0, M_BLOCK = 1, BLOCK_N = 16, BLOCK_K = QUANT.k_tile(1024), num_warps = 8),
            (when = QUANT == QuantFormat::Q8_0, M_BLOCK = 1, BLOCK_N = 2, BLOCK_K = QUANT.k_tile(1024), num_warps = 2),
        ],
        key = [m, n, k]
    )
)]
#[allow(clippy::too_many_arguments)]
pub fn gemv_q8<T: Float>(
    xq_ptr: Ptr<i8>,
    xd_ptr: Ptr<f32>,
    q_ptr: Ptr<u8>,
    s_ptr: Ptr<f16>,
    out_ptr: Ptr<T>,
    m: i32,
    n: i32,
    k: i32,
    #[constexpr] QUANT: QuantFormat,
    #[constexpr] SILU: bool,
    #[constexpr] M_BLOCK: usize,
    #[constexpr] BLOCK_N: usize,
    #[constexpr] BLOCK_K: usize,
) {
    word_tiled_only(QUANT);
    // Whole blocks (the layout contract): rows of QUANT words start 16-byte
    // aligned, so each thread chunk loads as 16-byte vectors.
    let k = multiple_of(k, 32);
    let q4 = QUANT.is_q4();
    // Weights per QUANT word: eight nibbles (Q4) or four bytes (Q8_0); a
    // block of 32 weights is `block_words` words.
    let per_word = if q4 { 8 } else { 4 };
    let block_words = 32 / per_word;
    let kw = BLOCK_K / per_word;
    let wn = BLOCK_N * kw;
    let nb = k / 32;
    // W tile: word column `c` is word `c % block_words` of the tile's block
    // `c / block_words`.
    let (c, row, ac, mrow) = q8_gemv_tiles(n, m, SILU, M_BLOCK, BLOCK_N, kw);
    let w_idx = row * (k / per_word) + c;
    let s_idx = row * nb + c / block_words;
    let qw = ptrcast(q_ptr, if q4 { u32 } else { i32 });
    // Activations, four per word: for Q4 the low-nibble word of word column
    // `c` is word `8 (c / 4) + c % 4` of the row's K tile, the high 4
    // further; for Q8_0 word `c`. One scale per block.
    let x_idx = if q4 { mrow * (k / 4) + ac / 4 * 8 + ac % 4 } else { mrow * (k / 4) + ac };
    let xd_idx = mrow * nb + ac / block_words;
    let xw = ptrcast(xq_ptr, i32);
    let mut acc = zeros([M_BLOCK * wn], f32);
    let k_full = k / BLOCK_K * BLOCK_K;
    // Software pipelining: tile i + 1's loads are issued before tile i is
    // computed.
    let have = k_full > 0;
    let mut wd = load(qw + w_idx, mask = have, other = 0, eviction_policy = "evict_first");
    let mut sr = scale_stream(s_ptr, s_idx, have, QUANT);
    let mut xa = load(xw + x_idx, mask = have, other = 0);
    if q4 {
        let mut xhi = load(xw + x_idx + 4, mask = have, other = 0);
        let mut xd = load(xd_ptr + xd_idx, mask = have, other = 0.0);
        for k0 in range(0, k_full, BLOCK_K) {
            // The last whole tile prefetches nothing (a uniform mask).
            let nk = k0 + BLOCK_K;
            let more = nk < k_full;
            let wd_next = load(qw + w_idx + nk / 8, mask = more, other = 0, eviction_policy = "evict_first");
            let sr_next = scale_stream(s_ptr, s_idx + nk / 32, more, QUANT);
            let xa_next = load(xw + x_idx + nk / 4, mask = more, other = 0);
            let xhi_next = load(xw + x_idx + nk / 4 + 4, mask = more, other = 0);
            let xd_next = load(xd_ptr + xd_idx + nk / 32, mask = more, other = 0.0);
            acc = q4_q8_step(wd, sr, xa, xhi, xd, acc, QUANT, M_BLOCK, wn);
            wd = wd_next;
            sr = sr_next;
            xa = xa_next;
            xhi = xhi_next;
            xd = xd_next;
        }
    } else {
        let mut xd = load(xd_ptr + xd_idx, mask = have, other = 0.0);
        for k0 in range(0, k_full, BLOCK_K) {
            let nk = k0 + BLOCK_K;
            let more = nk < k_full;
            let wd_next = load(qw + w_idx + nk / 4, mask = more, other = 0, eviction_policy = "evict_first");
            let sr_next =
                load(s_ptr + s_idx + nk / 32, mask = more, other = 0.0, eviction_policy = "evict_first");
            let xa_next = load(xw + x_idx + nk / 4, mask = more, other = 0);
            let xd_next = load(xd_ptr + xd_idx + nk / 32, mask = more, other = 0.0);
            acc = q8_q8_step(wd, sr, xa, xd, acc, M_BLOCK, wn);
            wd = wd_next;
            sr = sr_next;
            xa = xa_next;
            xd = xd_next;
        }
    }
    // The last partial K tile (at most one): word columns past K masked off.
    for k0 in range(k_full, k, BLOCK_K) {
        let wok = c < (k - k0) / per_word;
        let aok = ac < (k - k0) / per_word;
        let wd = load(qw + w_idx + k0 / per_word, mask = wok, other = 0, eviction_policy = "evict_first");
        let sr = if q4 {
            scale_stream(s_ptr, s_idx + k0 / 32, wok, QUANT)
        } else {
            load(s_ptr + s_idx + k0 / 32, mask = wok, other = 0.0, eviction_policy = "evict_first")
        };
        let xa = load(xw + x_idx + k0 / 4, mask = aok, other = 0);
        if q4 {
            let xhi = load(xw + x_idx + k0 / 4 + 4, mask = aok, other = 0);
            let xd = load(xd_ptr + xd_idx + k0 / 32, mask = aok, other = 0.0);
            acc = q4_q8_step(wd, sr, xa, xhi, xd, acc, QUANT, M_BLOCK, wn);
        } else {
            let xd = load(xd_ptr + xd_idx + k0 / 32, mask = aok, other = 0.0);
            acc = q8_q8_step(wd, sr, xa, xd, acc, M_BLOCK, wn);
        }
    }
    gemv_epilogue(acc, out_ptr, m, n, n, Fuse::NONE.with_silu(SILU), T, M_BLOCK, BLOCK_N, kw);
}
