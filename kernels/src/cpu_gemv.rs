//! Decode GEMVs shaped for CPUs: the fused GEMVs of [`crate::dequant::fused`]
//! (the same arguments, constexprs, grid and epilogues: RMSNorm prologue,
//! SiLU-mul, residual add) with a K loop that a CPU runs well.
//!
//! # Why a second kernel
//!
//! The GPU GEMVs spread a tile over 32-lane warps: they read the quant plane
//! as 32-bit words (one per four bytes, shifted apart per lane), compute
//! block and word indices per element, and software-pipeline the K loop
//! (tile `t + 1`'s loads in flight while tile `t` is computed). Compiled
//! for a CPU, each of those becomes work per element: index arithmetic,
//! gathers of words, and the pipelined tiles stored to and reloaded from
//! the stack every step. These kernels instead load each row's quant bytes
//! as one contiguous run per block, take a block's scale once per run, and
//! carry nothing across K steps but the accumulator.
//!
//! # Math
//!
//! The module docs of [`crate::dequant`]: weights formed in f32 by placing
//! the quant in a mantissa (`f = 16 + q` for a nibble, `256 + (q + 128)`
//! for a byte) and one FMA with the block scale (`w = d * f + off`),
//! activations (with the norm, normalized with the norm kernels'
//! exact statistic and add+RMSNorm's rounding, as the fused GEMV rounds)
//! multiplied and accumulated elementwise in f32 by FMAs into an f32 tile
//! `[M_BLOCK, BLOCK_N, W]` (`W = BLOCK_K / 2` quant bytes for Q4, each
//! element the running sum of its byte's two products, low nibble first;
//! `W = BLOCK_K` for Q8_0), in increasing K order, then summed along `W`
//! once (the epilogue of [`crate::dequant::gemv`]). Every result is a fixed
//! function of the inputs and the tile shape; with the same `BLOCK_K` it
//! does not depend on `M_BLOCK`, `BLOCK_N` or the batch, and the norm and
//! residual-add fusions give the bits of a separate norm or add kernel: the
//! native CPU's batch-invariant product is this kernel at every batch size.
//!
//! # Layout contract
//!
//! [`crate::dequant`]'s (repacked planes, `K % 32 == 0`, 32-bit offsets):
//! row `r`'s quants are the `K / 2` (Q4) or `K` (Q8_0) bytes from `r * K /
//! 2` (`r * K`), block `b`'s 16 (32) of them from `b * 16` (`b * 32`); for
//! Q4, byte `j` of a block holds weight `32 b + j` in its low nibble and
//! `32 b + j + 16` in its high one. Scales: entry `r * K / 32 + b` (Q4_1: a
//! `(d, m)` pair of f16, read as one 32-bit word).
//!
//! # Tiling
//!
//! Program `(i, j)` owns weight rows `i * BLOCK_N ..` and activation rows
//! `j * M_BLOCK ..` ([`crate::dequant::gemv_grid`]). Per K tile it loads
//! the W tile `[BLOCK_N, W]` of bytes (each row's run contiguous), the
//! scales (one per 16 or 32 bytes, equal along the run) and the activation
//! tile `[M_BLOCK, W]` (the two runs of 16 per block for Q4), which is
//! broadcast over the `BLOCK_N` rows. Once per 64-byte line of a row's run
//! it prefetches the line two ahead (within the row): the program reads
//! `BLOCK_N` interleaved runs, more than the hardware prefetchers follow,
//! and decode streams every weight from memory. Rows past the weight's or `M` are
//! clamped to the last one (their results are not stored). Whole tiles run
//! unmasked; a last partial tile (`K % BLOCK_K != 0`) runs once with the
//! blocks past K masked off (they add nothing).
//!
//! # Constexprs
//!
//! `T` (activation dtype), `QUANT`, `FUSE` (the fusions, [`Fuse`]), `M_BLOCK`
//! (activation rows per program), `BLOCK_N` (weight rows per program, even
//! with the SiLU-mul), `BLOCK_K` (a power of two `>= 32`), as the fused GEMV.

use crate::dequant::gemv::{
    dm_word, gemv_epilogue, gemv_operand, k_scales, q4_scale_decode, q4_scales, q6k_scale, repeat_rows,
    scale_load,
};
use crate::dequant::{Fuse, GemvTiles, QuantFormat, m_block_for};
use crate::rmsnorm::{rms_rstd_rows, rms_rstd_tiled};
use dsl_core::DType;
use dsl_macros::{kernel, kernel_fn};

/// The tiles of these kernels for `m` activation rows times a weight of
/// `rows` rows and `k` columns: K tiles of one block (32 weights, so K
/// never has a partial tile and every W tile row is one block's contiguous
/// run with one scale), and as many weight rows as keep the accumulator at
/// 1024 f32 for one activation row (4 KiB in L1 beside the tiles: a GEMV
/// streams weights, and fewer, larger programs amortize each program's
/// set-up) or 512 for several (32 strips of AVX-512, which the host backend
/// unrolls so that LLVM keeps the accumulator in registers: a prefill's
/// product is bound by arithmetic, not by the weights), at most the
/// weight's rows.
pub fn cpu_gemv_tiles(format: QuantFormat, m: usize, rows: usize, k: usize) -> GemvTiles {
    let _ = k;
    let m_block = m_block_for(m);
    // W tile elements per block: one per quant byte (one per weight for
    // the floats).
    let width = if format.is_q4() { 16 } else { 32 };
    let acc = if m_block == 1 { 1024 } else { 512 };
    let block_n = (acc / (m_block * width)).clamp(2, rows.next_power_of_two().max(2));
    GemvTiles { m_block, block_n, block_k: 32, num_warps: 4 }
}

/// The dequantized weights `(w_lo, w_hi)` of the nibbles of quant bytes `q`
/// (as `i32`) with block scale `d` and offset `off` ([`q4_scale_decode`]):
/// `w = d * (16 + nibble) + off`, as [`crate::dequant::gemv::q4_weights`].
#[kernel_fn]
pub fn nibble_weights(q: Tensor, d: Tensor, off: Tensor) -> (Tensor, Tensor) {
    let lo = ((q & 15) << 19 | 0x4180_0000).bitcast(f32);
    let hi = ((q >> 4 & 15) << 19 | 0x4180_0000).bitcast(f32);
    (fma(d, lo, off), fma(d, hi, off))
}

/// The dequantized Q8_0 weights of quant bytes `q` (as `i32`, the signed
/// byte's bits) with block scale `d`: `w = d * (256 + (q ^ 128)) - 384 d`,
/// as [`crate::dequant::gemv::q8_weights`].
#[kernel_fn]
pub fn byte_weights(q: Tensor, d: Tensor) -> Tensor {
    let f = ((q ^ 128) << 15 | 0x4380_0000).bitcast(f32);
    fma(d, f, d * -384.0)
}

/// The weights of a K tile of one block (32 weights) in a byte or float
/// format other than Q8_0: element `c` (0..32) of the block `s` (row-major
/// block index) of each W tile row, whose quant plane offset (bytes, or
/// weights for the floats) is `q_at`.
///
/// - Q5_1: `w = d (256 + q) + (m - 256 d)` (`(d, m)` the block's pair;
///   `q` the unsigned byte, 5 bits for GGUF's Q5_1, 8 for a Q8_0 block
///   converted by [`crate::dequant::repack::q8_0_as_q5_1`]).
/// - Q5_K: the same with `d = d sc`, `m = -dmin m` ([`k_scales`]).
/// - Q6_K: `w = d1 (384 + s) - 384 d1` with `s = q - 32` the signed byte
///   and `d1 = d sc` of its 16-weight group ([`q6k_scale`]): `round(d1 s)`,
///   ggml's value.
/// - F16/BF16: the weight itself.
///
/// `256 + q` places the byte `q` in the mantissa of `256.0`, as the nibble
/// formats place theirs in `16.0`.
#[kernel_fn]
pub fn wide_weights(
    q_ptr: Tensor,
    s_ptr: Tensor,
    q_at: Tensor,
    s: Tensor,
    c: Tensor,
    quant: QuantFormat,
) -> Tensor {
    if quant.is_float() {
        let h = load(ptrcast(q_ptr, i16) + q_at);
        if quant == QuantFormat::F16 { bitcast(h, f16).to(f32) } else { bitcast(h, bf16).to(f32) }
    } else {
        byte_format_weights(load(q_ptr + q_at).to(i32), s_ptr, s, c, quant)
    }
}

/// [`wide_weights`] of the byte formats (Q5_1, Q5_K, Q6_K) from the quant
/// byte `q` already loaded (as `i32`: its low 8 bits are the byte's).
#[kernel_fn]
pub fn byte_format_weights(q: Tensor, s_ptr: Tensor, s: Tensor, c: Tensor, quant: QuantFormat) -> Tensor {
    if quant == QuantFormat::Q6_K {
        let d1 = q6k_scale(s_ptr, s * 2 + c / 16);
        byte_weights(q, d1)
    } else {
        let f = ((q & 255) << 15 | 0x4380_0000).bitcast(f32);
        let (d, off) = if quant.is_k_quant() {
            let (d1, m1) = k_scales(s_ptr, s);
            (d1, fma(d1, -256.0, 0.0 - m1))
        } else {
            let raw = load(ptrcast(s_ptr, i32) + s);
            let (d, m) = dm_word(raw);
            (d, fma(d, -256.0, m))
        };
        fma(d, f, off)
    }
}

/// The f32 weights at rows `row` and columns `col` (broadcast against each
/// other) of a `k`-column weight in a format the word-tiled bodies do not
/// take (Q5_1, Q4_K, Q5_K, Q6_K, F16, BF16; see [`QuantFormat::gpu_kernels`]),
/// one element at a time from the planes: the nibble formats as
/// [`crate::dequant::gemv::q4_weights`] with [`q4_scales`], the others as
/// [`wide_weights`], so the weights are the CPU GEMV's bits.
#[kernel_fn]
pub fn weight_tile_any(
    q_ptr: Tensor,
    s_ptr: Tensor,
    row: Tensor,
    col: Tensor,
    k: Tensor,
    quant: QuantFormat,
) -> Tensor {
    let s = row * (k / 32) + col / 32;
    let j = col % 32;
    if quant.is_q4() {
        let byte = load(q_ptr + (s * 16 + j % 16)).to(i32);
        let f = ((byte >> (j / 16 * 4) & 15) << 19 | 0x4180_0000).bitcast(f32);
        let (d, off) = q4_scales(s_ptr, s, quant);
        fma(d, f, off)
    } else {
        wide_weights(q_ptr, s_ptr, row * k + col, s, j, quant)
    }
}

/// The activation tile `[M_BLOCK, W]` (flat) repeated over the `BLOCK_N`
/// weight rows: flat `[M_BLOCK, BLOCK_N, W]`, a broadcast (no data moves).
#[kernel_fn]
pub fn over_rows(x: Tensor, m_block: usize, block_n: usize, width: usize) -> Tensor {
    let x3 = expand_dims(reshape(x, [m_block, width]), 1);
    reshape(broadcast_to(x3, [m_block, block_n, width]), [m_block * block_n * width])
}

/// The RMSNorm statistic of the norm prologue (`eps`, unused, without
/// it): the norm kernels' exact statistic ([`rms_rstd_tiled`]) of this
/// program's activation rows (rows past `m` clamped), so a fused norm and a
/// separate one agree bit for bit; a scalar for one row, else repeated over
/// each row's `width` elements of a flat `[m_block * width]` tile.
#[kernel_fn]
pub fn norm_rstd(
    x_ptr: Tensor,
    m: Tensor,
    k: Tensor,
    eps: Tensor,
    norm: bool,
    m_block: usize,
    width: usize,
) -> Tensor {
    if !norm {
        eps
    } else if m_block == 1 {
        rms_rstd_tiled(x_ptr + minimum(program_id(1), m - 1) * k, k, eps, 256)
    } else {
        let rows = minimum(program_id(1) * m_block + arange(0, m_block), m - 1);
        let r = rms_rstd_rows(x_ptr, rows * k, k, eps, m_block, 256);
        reshape(broadcast_to(expand_dims(r, 1), [m_block, width]), [m_block * width])
    }
}

/// `acc + w * x` for a flat weight tile `w` (`[BLOCK_N, width]`) and
/// activations `xv` (`[M_BLOCK, width]`, with norm weights `nv`) taken as
/// the GEMV operand ([`gemv_operand`]), both broadcast to `[M_BLOCK,
/// BLOCK_N, width]`.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn cpu_fma(
    acc: Tensor,
    w: Tensor,
    xv: Tensor,
    nv: Tensor,
    rs: Tensor,
    norm: bool,
    dt: DType,
    m_block: usize,
    block_n: usize,
    width: usize,
) -> Tensor {
    let x = over_rows(gemv_operand(xv, nv, rs, norm, dt), m_block, block_n, width);
    fma(repeat_rows(w, m_block, block_n * width), x, acc)
}

/// The dequant GEMV for CPUs, in the format `QUANT`, with the fused GEMV's
/// RMSNorm prologue, SiLU-mul and residual add (`FUSE`); see the module
/// doc. Each format is its own specialization (IR name `cpu_gemv_q4_1`,
/// ...). Output row `r` starts at `out + r * ldo` (`ldo >= n`), as in
/// [`crate::dequant::linear::linear`], in `O` (`T`, or f32 for logits;
/// the residual add takes `O == T`).
///
/// The W tile `[BLOCK_N, W]` holds quant byte `c` of each weight row's K
/// tile: two weights for the nibble formats (Q4_0, Q4_1; `W = BLOCK_K / 2`),
/// one for the other formats (`W = BLOCK_K`); the activation tile `[M_BLOCK,
/// W]` the matching (Q4: low-nibble) activations.
#[kernel(name = "cpu_gemv_{QUANT}")]
#[allow(clippy::too_many_arguments)]
pub fn cpu_gemv<T: Float, O: Float>(
    x_ptr: Ptr<T>,
    q_ptr: Ptr<u8>,
    s_ptr: Ptr<f16>,
    nw_ptr: Ptr<T>,
    out_ptr: Ptr<O>,
    m: i32,
    n: i32,
    ldo: i32,
    k: i32,
    eps: f32,
    #[constexpr] QUANT: QuantFormat,
    #[constexpr] FUSE: Fuse,
    #[constexpr] M_BLOCK: usize,
    #[constexpr] BLOCK_N: usize,
    #[constexpr] BLOCK_K: usize,
) {
    let q4 = QUANT.is_q4();
    let w = if q4 { BLOCK_K / 2 } else { BLOCK_K };
    let wn = BLOCK_N * w;
    let norm = FUSE.norm();
    let rows = if FUSE.silu() { n * 2 } else { n };
    let nb = k / 32;
    // W tile [BLOCK_N, W]: byte c of row r's K tile.
    let wl = arange(0, wn);
    let c = wl % w;
    let row = minimum(program_id(0) * BLOCK_N + wl / w, rows - 1);
    let q_off = if q4 { row * (k / 2) + c } else { row * k + c };
    let s_off = row * nb + c / QUANT.quant_bytes();
    // Activation tile [M_BLOCK, W]: Q4 byte c's low-nibble activation is at
    // 32 (c / 16) + c % 16 of the K tile, the high nibble's 16 further.
    let xl = arange(0, M_BLOCK * w);
    let xc = xl % w;
    let mrow = minimum(program_id(1) * M_BLOCK + xl / w, m - 1);
    let n_off = if q4 { xc / 16 * 32 + xc % 16 } else { xc };
    let x_off = mrow * k + n_off;
    let rs = norm_rstd(x_ptr, m, k, eps, norm, M_BLOCK, w);
    let k_full = k / BLOCK_K * BLOCK_K;
    let mut acc = zeros([M_BLOCK * wn], f32);
    if q4 {
        for k0 in range(0, k_full, BLOCK_K) {
            if k0 % 128 == 0 {
                prefetch_l2(q_ptr + q_off + k0 / 2 + 128, mask = k0 / 2 + 128 + c < k / 2);
            }
            let q = load(q_ptr + q_off + k0 / 2).to(i32);
            let (d, off) = q4_scales(s_ptr, s_off + k0 / 32, QUANT);
            let (w_lo, w_hi) = nibble_weights(q, d, off);
            let xa = load(x_ptr + x_off + k0);
            let na = if norm { load(nw_ptr + n_off + k0) } else { xa };
            acc = cpu_fma(acc, w_lo, xa, na, rs, norm, T, M_BLOCK, BLOCK_N, w);
            let xb = load(x_ptr + x_off + k0 + 16);
            let nb_ = if norm { load(nw_ptr + n_off + k0 + 16) } else { xb };
            acc = cpu_fma(acc, w_hi, xb, nb_, rs, norm, T, M_BLOCK, BLOCK_N, w);
        }
        // The partial K tile: blocks past K read nothing and add nothing
        // (never for the K-quants, whose rows are whole super-blocks).
        if !QUANT.is_k_quant() {
            for k0 in range(k_full, k, BLOCK_K) {
                let ok = k0 / 32 + c / 16 < nb;
                let q = load(q_ptr + q_off + k0 / 2, mask = ok, other = 0).to(i32);
                let (d, off) = q4_scale_decode(scale_load(s_ptr, s_off + k0 / 32, ok, QUANT), QUANT);
                let (w_lo, w_hi) = nibble_weights(q, d, off);
                let okx = k0 / 32 + xc / 16 < nb;
                let xa = load(x_ptr + x_off + k0, mask = okx, other = 0.0);
                let na = if norm { load(nw_ptr + n_off + k0, mask = okx, other = 0.0) } else { xa };
                acc = cpu_fma(acc, w_lo, xa, na, rs, norm, T, M_BLOCK, BLOCK_N, w);
                let xb = load(x_ptr + x_off + k0 + 16, mask = okx, other = 0.0);
                let nb_ = if norm { load(nw_ptr + n_off + k0 + 16, mask = okx, other = 0.0) } else { xb };
                acc = cpu_fma(acc, w_hi, xb, nb_, rs, norm, T, M_BLOCK, BLOCK_N, w);
            }
        }
    } else if QUANT != QuantFormat::Q8_0 {
        // Byte formats with a min or 16-weight scales, and the floats: K
        // tiles of one block (`BLOCK_K = 32`, [`cpu_gemv_tiles`]), so K has
        // no partial tile.
        for k0 in range(0, k, BLOCK_K) {
            let wt = wide_weights(q_ptr, s_ptr, q_off + k0, s_off + k0 / 32, c, QUANT);
            let xa = load(x_ptr + x_off + k0);
            let na = if norm { load(nw_ptr + n_off + k0) } else { xa };
            acc = cpu_fma(acc, wt, xa, na, rs, norm, T, M_BLOCK, BLOCK_N, w);
        }
    } else {
        for k0 in range(0, k_full, BLOCK_K) {
            if k0 % 64 == 0 {
                prefetch_l2(q_ptr + q_off + k0 + 128, mask = k0 + 128 + c < k);
            }
            let q = load(q_ptr + q_off + k0).to(i32);
            let d = load(s_ptr + s_off + k0 / 32).to(f32);
            let wt = byte_weights(q, d);
            let xa = load(x_ptr + x_off + k0);
            let na = if norm { load(nw_ptr + n_off + k0) } else { xa };
            acc = cpu_fma(acc, wt, xa, na, rs, norm, T, M_BLOCK, BLOCK_N, w);
        }
        for k0 in range(k_full, k, BLOCK_K) {
            let ok = k0 + c < k;
            let q = load(q_ptr + q_off + k0, mask = ok, other = 0).to(i32);
            let d = load(s_ptr + s_off + k0 / 32, mask = ok, other = 0.0).to(f32);
            let wt = byte_weights(q, d);
            let okx = k0 + xc < k;
            let xa = load(x_ptr + x_off + k0, mask = okx, other = 0.0);
            let na = if norm { load(nw_ptr + n_off + k0, mask = okx, other = 0.0) } else { xa };
            acc = cpu_fma(acc, wt, xa, na, rs, norm, T, M_BLOCK, BLOCK_N, w);
        }
    }
    gemv_epilogue(acc, out_ptr, m, n, ldo, FUSE, T, M_BLOCK, BLOCK_N, w);
}
