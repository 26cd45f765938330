//! The decode path: `y[M, N] = x[M, K] @ W^T` for small `M` (1..16), one
//! program per `BLOCK_N` weight rows and `M_BLOCK` activation rows, the K
//! loop accumulating elementwise into an f32 tile that is reduced once at the
//! end. See the parent module for the math, the repacked layout, the tiling
//! and the constexprs.

use super::{Fuse, QuantFormat};
use dsl_core::DType;
use dsl_macros::{kernel, kernel_fn};

/// The dequantized weights `(w_lo, w_hi)` of the two nibbles of the Q4 byte
/// of each element, given the 32-bit word `wd` holding it and its bit
/// offset `sh` there. `d` is the block scale; `off` is `m - 16 d` (Q4_1) or
/// `-24 d` (Q4_0).
///
/// A nibble `q` becomes the float `f = 16 + q` by placing it in the top four
/// mantissa bits of `16.0` (`0x4180_0000 | q << 19`), so no integer-to-float
/// conversion is needed; then `w = d * f + off` is one FMA: `d * q + m` for
/// Q4_1, `d * (q - 8)` (exact) for Q4_0.
#[kernel_fn]
pub fn q4_weights(wd: Tensor, sh: Tensor, d: Tensor, off: Tensor) -> (Tensor, Tensor) {
    let lo = ((wd >> sh & 15) << 19 | 0x4180_0000).bitcast(f32);
    let hi = ((wd >> (sh + 4) & 15) << 19 | 0x4180_0000).bitcast(f32);
    (fma(d, lo, off), fma(d, hi, off))
}

/// Refuses, when the kernel is built, a weight format the word-tiled bodies
/// (GEMM, stream-K, the Q8 GEMV) do not read: their
/// weight and scale indices assume the planes of Q4_0, Q4_1 and Q8_0 (see
/// [`QuantFormat::gpu_kernels`]), so any other format would be read out of
/// its planes' bounds. Those formats go through
/// [`crate::dequant::linear::linear`].
#[kernel_fn]
pub fn word_tiled_only(quant: QuantFormat) {
    static_assert(
        quant.gpu_kernels(),
        "the word-tiled dequant kernels take Q4_0, Q4_1 and Q8_0 weights (and Q5_0 repacked as Q8_0); \
         other formats go through `linear`",
    );
}

/// Refuses, when the kernel is built, a weight format the GEMV bodies do
/// not read: they take every block format ([`QuantFormat::gemv_kernels`]);
/// 16-bit float weights go through [`crate::dequant::linear::linear`].
#[kernel_fn]
pub fn gemv_formats_only(quant: QuantFormat) {
    static_assert(
        quant.gemv_kernels(),
        "the dequant GEMV takes the block formats (Q4_0, Q4_1, Q8_0, Q5_1, Q4_K, Q5_K, Q6_K); \
         16-bit float weights go through `linear`",
    );
}

/// The raw scale entries of the blocks at index tile `s` (in blocks) of the
/// scale plane: Q4_1 planes hold `(d, m)` f16 pairs, read as one 32-bit word;
/// the other formats' hold `d` alone. Lanes where `ok` is false read nothing.
#[kernel_fn]
pub fn scale_load(s_ptr: Tensor, s: Tensor, ok: Tensor, quant: QuantFormat) -> Tensor {
    if quant.has_min() {
        load(ptrcast(s_ptr, i32) + s, mask = ok, other = 0)
    } else {
        load(s_ptr + s, mask = ok, other = 0.0)
    }
}

/// [`scale_load`] without a mask (the main loop's loads).
#[kernel_fn]
pub fn scale_load_all(s_ptr: Tensor, s: Tensor, quant: QuantFormat) -> Tensor {
    if quant.has_min() { load(ptrcast(s_ptr, i32) + s) } else { load(s_ptr + s) }
}

/// The f32 scale `d` and min `m` of a Q4_1/Q5_1 scale-plane word (the f16
/// pair `(d, m)`, `d` in the low half).
#[kernel_fn]
pub fn dm_word(raw: Tensor) -> (Tensor, Tensor) {
    (bitcast(raw.to(i16), f16).to(f32), bitcast((raw >> 16).to(i16), f16).to(f32))
}

/// The scale `d` and offset `off` (see [`q4_weights`]) of raw scale entries
/// from [`scale_load`] (Q4_K: [`scale_raw`]): `off = m - 16 d` (Q4_1),
/// `-24 d` (Q4_0) or `-m1 - 16 d1` (Q4_K).
#[kernel_fn]
pub fn q4_scale_decode(raw: Tensor, quant: QuantFormat) -> (Tensor, Tensor) {
    if quant.is_k_quant() {
        // A `k_scales_raw` value: `off = -m1 - 16 d1`.
        let (d1, m1) = k_scales_of(raw);
        (d1, fma(d1, -16.0, 0.0 - m1))
    } else if quant.has_min() {
        let (d, m) = dm_word(raw);
        (d, fma(d, -16.0, m))
    } else {
        let d = raw.to(f32);
        (d, d * -24.0)
    }
}

/// [`scale_load_all`] then [`q4_scale_decode`]; for Q4_K the sub-block's
/// scale and offset from [`k_scales`] (`off = -m1 - 16 d1`).
#[kernel_fn]
pub fn q4_scales(s_ptr: Tensor, s: Tensor, quant: QuantFormat) -> (Tensor, Tensor) {
    if quant.is_k_quant() {
        let (d1, m1) = k_scales(s_ptr, s);
        (d1, fma(d1, -16.0, 0.0 - m1))
    } else {
        q4_scale_decode(scale_load_all(s_ptr, s, quant), quant)
    }
}

/// The scale `d1 = d * sc` and min `m1 = dmin * m` (both exact in f32, as
/// ggml computes them) of the Q4_K/Q5_K 32-weight block `s` (row-major
/// block index): its super-block `s / 8` owns the 10 scale entries from
/// `10 (s / 8)`, `d` and `dmin` the first two (one 32-bit word), the block's
/// `sc | m << 8` entry `2 + s % 8`.
#[kernel_fn]
pub fn k_scales(s_ptr: Tensor, s: Tensor) -> (Tensor, Tensor) {
    let word = load(ptrcast(s_ptr, i32) + s / 8 * 5);
    let scm = load(ptrcast(s_ptr, i16) + (s / 8 * 10 + 2 + s % 8)).to(i32);
    k_scale_decode(word, scm)
}

/// [`k_scales`] of the super-block's `d`/`dmin` word and the block's
/// `sc | m << 8` entry (as `i32`).
#[kernel_fn]
pub fn k_scale_decode(word: Tensor, scm: Tensor) -> (Tensor, Tensor) {
    let d = bitcast(word.to(i16), f16).to(f32);
    let dmin = bitcast((word >> 16).to(i16), f16).to(f32);
    (d * (scm & 255).to(f32), dmin * (scm >> 8 & 255).to(f32))
}

/// [`k_scales`]' two loads kept raw in one `i64`: the `d`/`dmin` word in
/// the high half, the `sc | m << 8` entry in the low one. A caller that
/// forms the weights later ([`k_scales_of`]) leaves the loads in flight
/// until then.
#[kernel_fn]
pub fn k_scales_raw(s_ptr: Tensor, s: Tensor) -> Tensor {
    let word = load(ptrcast(s_ptr, i32) + s / 8 * 5);
    let scm = load(ptrcast(s_ptr, i16) + (s / 8 * 10 + 2 + s % 8)).to(i32);
    word.to(i64) << 32 | scm.to(i64)
}

/// [`k_scales`] of a [`k_scales_raw`] value.
#[kernel_fn]
pub fn k_scales_of(raw: Tensor) -> (Tensor, Tensor) {
    k_scale_decode((raw >> 32).to(i32), raw.to(i32) & 65535)
}

/// The scale `d1 = d * sc` (exact in f32) of the Q6_K 16-weight group `g`
/// (row-major group index): its super-block `g / 16` owns the 10 scale
/// entries from `10 (g / 16)`, `d` the first, the signed scale byte `g % 16`
/// from byte 4.
#[kernel_fn]
pub fn q6k_scale(s_ptr: Tensor, g: Tensor) -> Tensor {
    let d = load(s_ptr + g / 16 * 10).to(f32);
    let sc = load(ptrcast(s_ptr, i8) + (g / 16 * 20 + 4 + g % 16)).to(f32);
    d * sc
}

/// [`q6k_scale`]'s two loads kept raw in one `i32`: the bits of `d` in the
/// low half, the signed scale in the high one ([`q6k_scale_of`]).
#[kernel_fn]
pub fn q6k_scale_raw(s_ptr: Tensor, g: Tensor) -> Tensor {
    let d = load(ptrcast(s_ptr, i16) + g / 16 * 10).to(i32) & 65535;
    let sc = load(ptrcast(s_ptr, i8) + (g / 16 * 20 + 4 + g % 16)).to(i32);
    sc * 65536 | d
}

/// [`q6k_scale`] of a [`q6k_scale_raw`] value.
#[kernel_fn]
pub fn q6k_scale_of(raw: Tensor) -> Tensor {
    bitcast(raw.to(i16), f16).to(f32) * (raw >> 16).to(f32)
}

/// The raw scale entries of scale group `g` (row-major, in groups of
/// [`QuantFormat::scale_group`] weights) of a GEMV format, as the main loops
/// carry them: the `(d, m)` word of Q4_1 and Q5_1, the f16 `d` of Q4_0 and
/// Q8_0 ([`scale_load_all`]), [`k_scales_raw`] (Q4_K, Q5_K) or
/// [`q6k_scale_raw`] (Q6_K). Decoded by [`q4_scale_decode`] (nibbles) or
/// [`byte_tile_weights`] (bytes).
#[kernel_fn]
pub fn scale_raw(s_ptr: Tensor, g: Tensor, quant: QuantFormat) -> Tensor {
    if quant == QuantFormat::Q6_K {
        q6k_scale_raw(s_ptr, g)
    } else if quant.is_k_quant() {
        k_scales_raw(s_ptr, g)
    } else {
        scale_load_all(s_ptr, g, quant)
    }
}

/// The weights of a byte-format W tile: quant words `wd` (each element's
/// byte at bit offset `sh`) and the raw scale entries `raw` of each
/// element's group ([`scale_raw`]). Signed bytes (Q8_0, Q6_K's `q - 32`) as
/// [`q8_weights`] with `d` (Q6_K: `d sc`); unsigned ones (Q5_1, Q5_K) `w = d
/// (256 + q) + (m - 256 d)` with Q5_1's `(d, m)` or Q5_K's `(d sc, -dmin
/// m)`, the CPU GEMV's formation ([`crate::cpu_gemv::byte_format_weights`]).
#[kernel_fn]
pub fn byte_tile_weights(wd: Tensor, sh: Tensor, raw: Tensor, quant: QuantFormat) -> Tensor {
    if quant == QuantFormat::Q6_K {
        q8_weights(wd, sh, q6k_scale_of(raw))
    } else if quant.unsigned_bytes() {
        let (d, m) = if quant.is_k_quant() {
            let (d1, m1) = k_scales_of(raw);
            (d1, 0.0 - m1)
        } else {
            dm_word(raw)
        };
        let f = ((wd >> sh & 255) << 15 | 0x4380_0000).bitcast(f32);
        fma(d, f, fma(d, -256.0, m))
    } else {
        q8_weights(wd, sh, raw.to(f32))
    }
}

/// The dequantized Q8_0 weights of the bytes held by a tile of 32-bit words
/// `wd` (byte at bit offset `sh`) with block scale `d`: the signed byte `q`
/// is biased to `u = q + 128` (`^ 0x80`), placed in the mantissa of `256.0`
/// (`f = 256 + u`, exact) and `w = d * f - 384 d = d * q` (exact).
#[kernel_fn]
pub fn q8_weights(wd: Tensor, sh: Tensor, d: Tensor) -> Tensor {
    let u = wd >> sh & 255 ^ 128;
    let f = (u << 15 | 0x4380_0000).bitcast(f32);
    fma(d, f, d * -384.0)
}

/// Repeats a weight tile `w` (`[width]`) for each of the `m_block`
/// activation rows (`[m_block * width]`): a leading broadcast, which moves no
/// data (the copies are the same registers).
#[kernel_fn]
pub fn repeat_rows(w: Tensor, m_block: usize, width: usize) -> Tensor {
    if m_block == 1 {
        w
    } else {
        reshape(broadcast_to(expand_dims(w, 0), [m_block, width]), [m_block * width])
    }
}

/// The index `idx` of each block of a `[rows_per_tile, blocks]` grid of
/// blocks, repeated over the block's `width` elements (`[rows_per_tile *
/// blocks * width]` flat). Computed per block and broadcast along the last
/// axis, so every register of a thread chunk (which never straddles a block)
/// holds the same value: loads through it are one load per chunk.
#[kernel_fn]
pub fn per_block(idx: Tensor, nblocks: usize, width: usize) -> Tensor {
    reshape(broadcast_to(expand_dims(idx, 1), [nblocks, width]), [nblocks * width])
}

/// The index of every `width`-byte unit of a `[block_n, row_bytes]` W tile
/// whose first row is `row0`, in a plane of `units_per_row` units per row,
/// repeated over the unit's `width` elements (flat `[block_n * row_bytes]`).
/// Rows from `rows` on are clamped to `rows - 1`. `width` is a multiple of
/// the chunk size, so a chunk never straddles two units.
#[kernel_fn]
pub fn unit_index(
    row0: Tensor,
    rows: Tensor,
    units_per_row: Tensor,
    block_n: usize,
    row_bytes: usize,
    width: usize,
) -> Tensor {
    let per_row = row_bytes / width;
    let u = arange(0, block_n * per_row);
    let row = minimum(row0 + u / per_row, rows - 1);
    per_block(row * units_per_row + u % per_row, block_n * per_row, width)
}

/// The weight side of a dequant GEMV or GEMM program: its weight-tile index
/// `pid_n = program_id(n_axis)`, the weight rows `rows` (`2N` with `silu`,
/// gate and up interleaved), the blocks per row `nb`, and the index tiles
/// of its `[block_n, width]` W tile of quant bytes, whose first weight row
/// is `pid_n * block_n` (rows from `rows` on clamped to the last one: valid
/// addresses whose results are not stored, so the main loops need no
/// masks), per element: its element index `wl`, its byte `j` within its
/// block, its block's scale entry `s_idx` (`row * nb + block`), the 32-bit
/// word `w_idx` of the quant plane holding it and the byte's bit offset
/// `sh` in that word. A block is `quant.quant_bytes()` bytes.
#[kernel_fn]
#[allow(clippy::type_complexity)]
pub fn weight_tile(
    n: Tensor,
    k: Tensor,
    silu: bool,
    quant: QuantFormat,
    n_axis: usize,
    block_n: usize,
    width: usize,
) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor) {
    let pid_n = program_id(n_axis);
    let rows = if silu { n * 2 } else { n };
    let nb = k / 32;
    let qb = quant.quant_bytes();
    let s_idx = unit_index(pid_n * block_n, rows, nb, block_n, width, qb);
    let wl = arange(0, block_n * width);
    let j = wl % qb;
    let w_idx = unit_index(pid_n * block_n, rows, nb * (qb / 8), block_n, width, 8) * 2 + wl % 8 / 4;
    (pid_n, rows, nb, wl, j, s_idx, w_idx, j % 4 * 8)
}

/// The activation tile of a program whose `m_block` activation rows start
/// at `program_id(m_axis) * m_block`: flat `[m_block * span]`, each row's
/// `span` elements the `width` quant bytes of a weight row's K tile (once
/// in the GEMM, repeated over the `span / width` weight rows in the GEMV).
/// Per element: its byte `c` in the weight row, its activation row `mrow`
/// (rows past `m` clamped to `m - 1`) and the offset `x_off` in `x` of the
/// byte's activation at K offset 0 (Q4: the low nibble's, `32 (c / 16) + c
/// % 16`; the high nibble's is 16 further).
#[kernel_fn]
pub fn x_tile(
    m: Tensor,
    k: Tensor,
    quant: QuantFormat,
    m_axis: usize,
    m_block: usize,
    span: usize,
    width: usize,
) -> (Tensor, Tensor, Tensor) {
    let xl_ = arange(0, m_block * span);
    let c = xl_ % width;
    let mrow = minimum(program_id(m_axis) * m_block + xl_ / span, m - 1);
    let x_off = if quant.is_q4() { mrow * k + c / 16 * 32 + c % 16 } else { mrow * k + c };
    (c, mrow, x_off)
}

/// The loads of the next K tile of the software-pipelined main loops (the
/// GEMV's and the GEMM's), issued before tile `k0` is computed: the K
/// offset `nk` of the next whole tile (the last tile reloads itself), its
/// quant words, raw scale entries (Q4_0, Q4_1: [`scale_load_all`]; Q8_0:
/// the f16 scales; the other formats: [`scale_raw`] of the tile's groups)
/// and (Q4: low-nibble) activations.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn next_tile(
    qw: Tensor,
    w_idx: Tensor,
    s_ptr: Tensor,
    s_idx: Tensor,
    x_ptr: Tensor,
    x_off: Tensor,
    k0: Tensor,
    k_full: Tensor,
    quant: QuantFormat,
    block_k: usize,
) -> (Tensor, Tensor, Tensor, Tensor) {
    // Weights per 32-bit word: eight nibbles or four bytes.
    let per_word = if quant.is_q4() { 8 } else { 4 };
    let nk = minimum(k0 + block_k, k_full - block_k);
    let wd_next = load(qw + w_idx + nk / per_word);
    let sr_next = if !quant.gpu_kernels() {
        scale_raw(s_ptr, s_idx + nk / quant.scale_group(), quant)
    } else if quant.is_q4() {
        scale_load_all(s_ptr, s_idx + nk / 32, quant)
    } else {
        load(s_ptr + s_idx + nk / 32)
    };
    let xa_next = load(x_ptr + x_off + nk);
    (nk, wd_next, sr_next, xa_next)
}

/// The scale entry `s` and quant word `wd` of each element of the W tile
/// (see [`weight_tile`]) in the K tail from `k0`: blocks past the row are
/// clamped to its last block (their activations are zeroed by the caller).
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn tail_words(
    qw: Tensor,
    pid_n: Tensor,
    rows: Tensor,
    nb: Tensor,
    wl: Tensor,
    j: Tensor,
    k0: Tensor,
    quant: QuantFormat,
    block_n: usize,
    width: usize,
) -> (Tensor, Tensor) {
    let qb = quant.quant_bytes();
    let row = minimum(pid_n * block_n + wl / width, rows - 1);
    let s = row * nb + minimum(k0 / 32 + wl % width / qb, nb - 1);
    (s, load(qw + s * (qb / 4) + j / 4))
}

/// The Q4 K tail's activations of byte `c` of each element in K tile `k0`:
/// the byte's block `xkb`, whether that block is inside the row (`valid`)
/// and the address `xk` of its low-nibble activation (the block clamped to
/// the row's last; the high nibble's is 16 further).
#[kernel_fn]
pub fn q4_tail_x(
    x_ptr: Tensor,
    mrow: Tensor,
    c: Tensor,
    k: Tensor,
    nb: Tensor,
    k0: Tensor,
) -> (Tensor, Tensor, Tensor) {
    let xkb = k0 / 32 + c / 16;
    let valid = xkb < nb;
    let xk = x_ptr + mrow * k + minimum(xkb, nb - 1) * 32 + c % 16;
    (xkb, valid, xk)
}

/// The Q8_0 K tail's activations of byte `c` of each element in K tile
/// `k0`: its column `xk`, whether it is inside the row (`valid`) and its
/// activation (the column clamped to the row's last).
#[kernel_fn]
pub fn q8_tail_x(x_ptr: Tensor, mrow: Tensor, c: Tensor, k: Tensor, k0: Tensor) -> (Tensor, Tensor, Tensor) {
    let xk = k0 + c;
    let valid = xk < k;
    (xk, valid, load(x_ptr + mrow * k + minimum(xk, k - 1)))
}

/// Reduces the flat accumulator `acc` (`[M_BLOCK, BLOCK_N, width]` row-major)
/// over its last axis and stores row `mi`, column `r` of the tile at
/// `out[pid1 * M_BLOCK + mi, pid0 * BLOCK_N + r]`. With `fuse.silu()`, weight
/// rows come in (gate, up) pairs: output column `pid0 * BLOCK_N / 2 + r / 2`
/// gets `silu(gate) * up`; with `fuse.residual()` the result is added to
/// `out` in place. Output rows are `ldo` elements apart.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn gemv_epilogue(
    acc: Tensor,
    out_ptr: Tensor,
    m: Tensor,
    n: Tensor,
    ldo: Tensor,
    fuse: Fuse,
    dt: DType,
    m_block: usize,
    block_n: usize,
    width: usize,
) {
    let pid_n = program_id(0);
    let pid_m = program_id(1);
    if fuse.silu() {
        let pairs = block_n / 2;
        // Rows 2j (gate) and 2j + 1 (up) are adjacent, so one reshape puts
        // both in the last axis: the first `width` lanes are the gate's.
        let a = reshape(acc, [m_block * pairs, 2 * width]);
        let is_gate = expand_dims(arange(0, 2 * width) < width, 0);
        let gate = sum(where_(is_gate, a, 0.0), 1);
        let up = sum(where_(is_gate, 0.0, a), 1);
        let y = gate * sigmoid(gate) * up;
        let o = arange(0, m_block * pairs);
        let om = pid_m * m_block + o / pairs;
        let on = pid_n * pairs + o % pairs;
        store(out_ptr + om * ldo + on, y, mask = om < m && on < n);
    } else {
        let y = sum(reshape(acc, [m_block * block_n, width]), 1);
        let o = arange(0, m_block * block_n);
        let om = pid_m * m_block + o / block_n;
        let on = pid_n * block_n + o % block_n;
        let ok = om < m && on < n;
        if fuse.residual() {
            // `out = round_T(round_T(y) + out)`: the unfused path's product
            // rounded to `T`, then add+RMSNorm's rounded residual add.
            let r = load(out_ptr + om * ldo + on, mask = ok, other = 0.0).to(f32);
            store(out_ptr + om * ldo + on, (y.to(dt).to(f32) + r).to(dt), mask = ok);
        } else {
            store(out_ptr + om * ldo + on, y, mask = ok);
        }
    }
}

/// The RMSNorm statistic `rsqrt(mean(x[r]^2) + eps)` of the `m_block`
/// activation rows `r` of this program (rows past `m` clamped to `m - 1`),
/// in f32: a scalar when `m_block == 1`, else repeated over each row's
/// `width` elements of a flat `[m_block * width]` tile. The rows are read in
/// tiles of `1024 / m_block` columns (at least 64), masked past `k`.
#[kernel_fn]
pub fn row_rstd(x_ptr: Tensor, m: Tensor, k: Tensor, eps: Tensor, m_block: usize, width: usize) -> Tensor {
    let rb = (1024 / m_block).max(64);
    let i = arange(0, m_block * rb);
    let row = minimum(program_id(1) * m_block + i / rb, m - 1);
    let mut ss = zeros([m_block * rb], f32);
    for k0 in range(0, k, rb) {
        let kk = k0 + i % rb;
        let v = load(x_ptr + row * k + kk, mask = kk < k, other = 0.0).to(f32);
        ss = fma(v, v, ss);
    }
    if m_block == 1 {
        rsqrt(sum(ss, 0) / k + eps)
    } else {
        let r = rsqrt(sum(reshape(ss, [m_block, rb]), 1) / k + eps);
        reshape(broadcast_to(expand_dims(r, 1), [m_block, width]), [m_block * width])
    }
}

/// The GEMV operand of activations `xv` (in `T`): `f32(xv)` without `norm`;
/// with `norm`, add+RMSNorm's rounding sequence `round_T(round_T(xv * rs) *
/// nw)` in f32 (`rs` from [`row_rstd`], `nv` the norm weights in `T`).
#[kernel_fn]
pub fn gemv_operand(xv: Tensor, nv: Tensor, rs: Tensor, norm: bool, dt: DType) -> Tensor {
    if norm { ((xv.to(f32) * rs).to(dt).to(f32) * nv.to(f32)).to(dt).to(f32) } else { xv.to(f32) }
}

/// The GEMV of every format ([`gemv`], [`super::fused`]). `nw_ptr` and
/// `eps` are read only when `fuse` has the norm.
///
/// Tiles (flat, row-major): the W tile `[BLOCK_N, width]` holds one quant
/// byte per element: for the nibble formats (Q4_0, Q4_1, Q4_K, `width =
/// BLOCK_K / 2`) two weights (low nibble `k = 32 b + j`, high nibble `k +
/// 16`, for byte `j` of block `b` of the K tile), for the byte formats
/// (Q8_0, Q5_1, Q5_K, Q6_K, `width = BLOCK_K`) one. The X/acc tile
/// `[M_BLOCK, BLOCK_N, width]` holds, per element, the activations of that
/// byte's weights and their running sum of products. Each element's scale
/// entries are those of its scale group ([`scale_raw`]), one load per
/// thread chunk, as a chunk never straddles a group.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn gemv_body(
    x_ptr: Tensor,
    q_ptr: Tensor,
    s_ptr: Tensor,
    out_ptr: Tensor,
    m: Tensor,
    n: Tensor,
    ldo: Tensor,
    k: Tensor,
    nw_ptr: Tensor,
    eps: Tensor,
    quant: QuantFormat,
    fuse: Fuse,
    dt: DType,
    m_block: usize,
    block_n: usize,
    block_k: usize,
) {
    gemv_formats_only(quant);
    let (silu, norm) = (fuse.silu(), fuse.norm());
    let q4 = quant.is_q4();
    let width = if q4 { block_k / 2 } else { block_k };
    let wn = block_n * width;
    let (pid_n, rows, nb, wl, j, s_idx, w_idx, sh) = weight_tile(n, k, silu, quant, 0, block_n, width);
    // Q6_K's scales are per 16 weights: its scale index counts groups.
    let group = quant.scale_group();
    let s_idx =
        if group == 32 { s_idx } else { unit_index(pid_n * block_n, rows, nb * 2, block_n, width, group) };
    let qw = ptrcast(q_ptr, i32);
    let (c, mrow, x_off) = x_tile(m, k, quant, 1, m_block, wn, width);
    // The norm weights' offsets: the activations' within the row.
    let n_off = if q4 && norm { c / 16 * 32 + c % 16 } else { c };
    let k_full = k / block_k * block_k;
    // Software pipelining: the loads of tile i + 1 are issued before tile i
    // is computed (the last tile reloads itself), so every thread keeps two
    // tiles of loads in flight. The first tile's loads are masked off when
    // there is no whole tile. The first weight tile is read before
    // `gdc_wait`: weights are never written by an earlier kernel, so their
    // latency overlaps the previous kernel's tail.
    let have = k_full > 0;
    let mut wd = load(qw + w_idx, mask = have, other = 0);
    // Without a whole tile the first scales are not used: the other
    // formats read group 0's, always in bounds.
    let mut sr = if quant.gpu_kernels() {
        scale_load(s_ptr, s_idx, have, quant)
    } else {
        scale_raw(s_ptr, where_(have, s_idx, 0), quant)
    };
    gdc_wait();
    gdc_launch_dependents();
    let rs = if norm { row_rstd(x_ptr, m, k, eps, m_block, wn) } else { eps };
    let mut acc = zeros([m_block * wn], f32);
    let mut xa = load(x_ptr + x_off, mask = have, other = 0.0);
    if q4 {
        let mut xb = load(x_ptr + x_off + 16, mask = have, other = 0.0);
        for k0 in range(0, k_full, block_k) {
            let (nk, wd_next, sr_next, xa_next) =
                next_tile(qw, w_idx, s_ptr, s_idx, x_ptr, x_off, k0, k_full, quant, block_k);
            let xb_next = load(x_ptr + x_off + nk + 16);
            let (d, off) = q4_scale_decode(sr, quant);
            let (w_lo, w_hi) = q4_weights(wd, sh, d, off);
            // The norm weights are tiny and cached: loaded in the tile's step.
            let na = if norm { load(nw_ptr + n_off + k0) } else { xa };
            acc = fma(repeat_rows(w_lo, m_block, wn), gemv_operand(xa, na, rs, norm, dt), acc);
            let nb_ = if norm { load(nw_ptr + n_off + k0 + 16) } else { xb };
            acc = fma(repeat_rows(w_hi, m_block, wn), gemv_operand(xb, nb_, rs, norm, dt), acc);
            wd = wd_next;
            sr = sr_next;
            xa = xa_next;
            xb = xb_next;
        }
        // The K tail (at most one iteration): blocks past the row are
        // clamped to its last block and their activations zeroed.
        for k0 in range(k_full, k, block_k) {
            let (s, wd) = tail_words(qw, pid_n, rows, nb, wl, j, k0, quant, block_n, width);
            let (d, off) = q4_scales(s_ptr, s, quant);
            let (w_lo, w_hi) = q4_weights(wd, sh, d, off);
            let (xkb, valid, xk) = q4_tail_x(x_ptr, mrow, c, k, nb, k0);
            let xl_t = load(xk);
            let ko = if norm { minimum(xkb, nb - 1) * 32 + c % 16 } else { xkb };
            let nl = if norm { load(nw_ptr + ko) } else { xl_t };
            let xl = where_(valid, gemv_operand(xl_t, nl, rs, norm, dt), 0.0);
            let xh_t = load(xk + 16);
            let nh = if norm { load(nw_ptr + ko + 16) } else { xh_t };
            let xh = where_(valid, gemv_operand(xh_t, nh, rs, norm, dt), 0.0);
            acc = fma(repeat_rows(w_lo, m_block, wn), xl, acc);
            acc = fma(repeat_rows(w_hi, m_block, wn), xh, acc);
        }
    } else {
        for k0 in range(0, k_full, block_k) {
            let (nk, wd_next, sr_next, xa_next) =
                next_tile(qw, w_idx, s_ptr, s_idx, x_ptr, x_off, k0, k_full, quant, block_k);
            let w = byte_tile_weights(wd, sh, sr, quant);
            let na = if norm { load(nw_ptr + n_off + k0) } else { xa };
            acc = fma(repeat_rows(w, m_block, wn), gemv_operand(xa, na, rs, norm, dt), acc);
            wd = wd_next;
            sr = sr_next;
            xa = xa_next;
        }
        for k0 in range(k_full, k, block_k) {
            let (s, wd) = tail_words(qw, pid_n, rows, nb, wl, j, k0, quant, block_n, width);
            // `s` is the block; Q6_K's group is one of its two halves.
            let g = if group == 32 { s } else { s * 2 + j / 16 };
            let w = byte_tile_weights(wd, sh, scale_raw(s_ptr, g, quant), quant);
            let (xk, valid, xt) = q8_tail_x(x_ptr, mrow, c, k, k0);
            let nt = if norm { load(nw_ptr + minimum(xk, k - 1)) } else { xt };
            let x = where_(valid, gemv_operand(xt, nt, rs, norm, dt), 0.0);
            acc = fma(repeat_rows(w, m_block, wn), x, acc);
        }
    }
    gemv_epilogue(acc, out_ptr, m, n, ldo, fuse, dt, m_block, block_n, width);
}

/// The dequant GEMV: `out[M, N] = x[M, K] @ W^T` with `W` repacked in the
/// format `QUANT` (Q4_1 `w = d * q + m`, Q4_0 `w = d * (q - 8)`, Q8_0 `w =
/// d * q`, e.g. the tied embedding used as the LM head; Q5_1 and the
/// K-quants with their sub-block scales and mins); with `SILU`, `out =
/// silu(x @ Wg^T) * (x @ Wu^T)` from gate/up rows interleaved into one `[2N,
/// K]` weight. See the module docs. Each format is its own specialization
/// (IR name `gemv_q4_1`, ...). The output is in `O` (`T`, or f32 for
/// logits).
///
/// The autotune configs size the K tile in quant bytes per weight row
/// (`BLOCK_K = QUANT.k_tile(bytes)`; the one-warp tile is two blocks in
/// every format), so a config holds the same accumulator in every format;
/// Q4_1, the bundled model's format, also tries the wider tiles of larger
/// models' projections (`when`).
#[kernel(
    name = "gemv_{QUANT}",
    autotune(
        configs = [
            (M_BLOCK = 1, BLOCK_N = 4, BLOCK_K = QUANT.k_tile(512), num_warps = 4),
            (M_BLOCK = 1, BLOCK_N = 8, BLOCK_K = QUANT.k_tile(256), num_warps = 4),
            (M_BLOCK = 1, BLOCK_N = 16, BLOCK_K = QUANT.k_tile(256), num_warps = 4),
            (M_BLOCK = 1, BLOCK_N = 8, BLOCK_K = QUANT.k_tile(512), num_warps = 4),
            (M_BLOCK = 1, BLOCK_N = 8, BLOCK_K = QUANT.k_tile(128), num_warps = 2),
            (M_BLOCK = 1, BLOCK_N = 16, BLOCK_K = 64, num_warps = 1),
            (M_BLOCK = 2, BLOCK_N = 8, BLOCK_K = QUANT.k_tile(256), num_warps = 4),
            (M_BLOCK = 4, BLOCK_N = 8, BLOCK_K = QUANT.k_tile(128), num_warps = 4),
            (M_BLOCK = 8, BLOCK_N = 8, BLOCK_K = QUANT.k_tile(128), num_warps = 4),
            (M_BLOCK = 8, BLOCK_N = 4, BLOCK_K = QUANT.k_tile(128), num_warps = 2),
            (when = QUANT == QuantFormat::Q4_1, M_BLOCK = 1, BLOCK_N = 32, BLOCK_K = QUANT.k_tile(128), num_warps = 4),
            (when = QUANT == QuantFormat::Q4_1, M_BLOCK = 1, BLOCK_N = 16, BLOCK_K = QUANT.k_tile(512), num_warps = 8),
            (when = QUANT == QuantFormat::Q4_1, M_BLOCK = 1, BLOCK_N = 32, BLOCK_K = QUANT.k_tile(256), num_warps = 8),
            (when = QUANT == QuantFormat::Q4_1, M_BLOCK = 1, BLOCK_N = 16, BLOCK_K = QUANT.k_tile(256), num_warps = 8),
            (when = QUANT == QuantFormat::Q4_1, M_BLOCK = 1, BLOCK_N = 4, BLOCK_K = QUANT.k_tile(1024), num_warps = 4),
            (when = QUANT == QuantFormat::Q4_1, M_BLOCK = 1, BLOCK_N = 8, BLOCK_K = QUANT.k_tile(1024), num_warps = 8),
        ],
        key = [m, n, k]
    )
)]
#[allow(clippy::too_many_arguments)]
pub fn gemv<T: Float, O: Float>(
    x_ptr: Ptr<T>,
    q_ptr: Ptr<u8>,
    s_ptr: Ptr<f16>,
    out_ptr: Ptr<O>,
    m: i32,
    n: i32,
    k: i32,
    #[constexpr] QUANT: QuantFormat,
    #[constexpr] SILU: bool,
    #[constexpr] M_BLOCK: usize,
    #[constexpr] BLOCK_N: usize,
    #[constexpr] BLOCK_K: usize,
) {
    // The norm weights and `eps` are not read: `x_ptr` and `k` stand in.
    let fuse = Fuse::NONE.with_silu(SILU);
    gemv_body(x_ptr, q_ptr, s_ptr, out_ptr, m, n, n, k, x_ptr, k, QUANT, fuse, T, M_BLOCK, BLOCK_N, BLOCK_K);
}
