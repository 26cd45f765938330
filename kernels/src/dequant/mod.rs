//! Dequantizing matrix products for GGUF block formats: `y[M, N] = x[M, K] @
//! W^T` with `W` stored Q4_1, Q4_0 or Q8_0 (repacked, still quantized), for
//! the projections of a decoder (SmolLM2-135M: Q4_1 projections with K and N
//! in {576, 1536}, a Q8_0 tied LM head of 49152 x 576). Q5_0 is repacked as
//! Q8_0; Q5_1, Q4_K, Q5_K, Q6_K, F16 and BF16 have their planes (see
//! [`repack::Repacked`]) and run in [`crate::cpu_gemv`] and in
//! [`linear`] (element-wise tile loads, [`crate::cpu_gemv::weight_tile_any`]),
//! and all but the floats in the GEMV ([`gemv`], [`fused`]: the quant planes
//! of Q4_K and of Q5_1, Q5_K, Q6_K are laid out as Q4_1's and Q8_0's);
//! [`QuantFormat::gpu_kernels`] says which formats the other GPU bodies take.
//!
//! # Math
//!
//! Blocks of 32 weights along K share an f16 scale `d` (and, for Q4_1, an
//! f16 min `m`): Q4_0 `w = d * (q - 8)`, Q4_1 `w = d * q + m` (`q` a nibble),
//! Q8_0 `w = d * q` (`q` a signed byte). The kernels form every weight in f32
//! without an integer-to-float conversion: the quant goes into the mantissa
//! of a power of two (`f = 16 + q` for a nibble, `f = 256 + (q + 128)` for a
//! byte) and one FMA applies the scale: `w = d * f + off` with `off = m - 16
//! d` (Q4_1, two roundings), `-24 d` (Q4_0, exact) or `-384 d` (Q8_0, exact).
//! The swapped GEMM places nibbles at `f = 128 + q` instead, with `off - 112
//! d` (see [`gemm::swap_weights`]).
//! Products with the activations (f32 or bf16, converted exactly to f32) are
//! accumulated in f32 by FMAs; the result is rounded once to the activation
//! dtype `T`. The error model and tolerances are in
//! [`crate::reference::quant`].
//!
//! Fused SiLU-mul (`SILU = true`, for the gate/up projections): the weight
//! is [`repack::interleave_gate_up`]'s `[2N, K]` interleave (row `2j` the
//! gate's row `j`, row `2j + 1` the up's), and `out[M, N] = silu(g) * u`
//! with `g`, `u` the two f32 products, `silu(g) = g * sigmoid(g)`.
//!
//! The batch-invariant product ([`linear`], the runtime's default for
//! every batch size) computes each output row the same way whatever the
//! batch: one `dot` per 128-column K tile on f16 operands, the tiles' f32
//! products added in K order (see its module doc). The kernels below are
//! the fast path's (`--no-batch-invariance`), whose rounding follows the
//! batch size.
//!
//! Fused decode GEMVs ([`fused`]): the same GEMV with an RMSNorm prologue
//! (each program recomputes its rows' `rstd` and normalizes the activations
//! as it loads them) or a residual-add epilogue (`out += x @ W^T` in place),
//! which removes the separate norm kernels from a decode step.
//!
//! # Layout contract
//!
//! - `x`: row-major `[M, K]` in `T`, contiguous (row stride `K`).
//! - `q_ptr`, `s_ptr`: the planes of a [`repack::Repacked`] weight (quants as
//!   bytes, scales as f16), each 16-byte aligned for full-width loads (the
//!   runtime's allocations are); quant rows are `K / 2` (Q4) or `K` (Q8_0)
//!   bytes, so every row is 16-byte aligned too. The kernels read the quant
//!   plane as 32-bit little-endian words.
//! - `out`: row-major `[M, N]` in `T`, contiguous (`N` the output columns;
//!   with `SILU` the weight has `2N` rows).
//! - `K % 32 == 0` (whole blocks); `M, N >= 1`. Offsets are 32-bit: `M * K`,
//!   `M * N` and `rows * K` below `2^31` (the repack checks the weight).
//!
//! # Tiling
//!
//! GEMV (decode, `M` up to 16, [`gemv`]). Program `(i, j)` owns the
//! `BLOCK_N` weight rows from row `i * BLOCK_N` and the `M_BLOCK`
//! activation rows from row `j * M_BLOCK`. It walks K in `BLOCK_K` tiles
//! and keeps an f32 accumulator tile `[M_BLOCK, BLOCK_N, BLOCK_K / 2]` for
//! Q4 (one element per quant byte: its two weights' products) or
//! `[M_BLOCK, BLOCK_N, BLOCK_K]` for Q8_0, updated elementwise with FMAs
//! and reduced along its last axis once, after the loop.
//!
//! Each thread holds chunks of `c` consecutive elements (the codegen's
//! 16 bytes of the narrowest element loaded: `c = 8` with bf16 activations
//! or an f16 scale plane, `c = 4` for Q4_1 with f32 activations), so a
//! chunk is `c` quant bytes of one block. Per K tile, each thread loads
//! its chunks of the W tile as 32-bit words, one scale entry per chunk (the
//! `(d, m)` word for Q4_1) and the activations of its chunk (for Q4 the `c`
//! low-nibble activations at `32 b + j` and the `c` high-nibble ones 16
//! further: contiguous vector loads). The weights are dequantized once and
//! reused for the `M_BLOCK` rows (a leading broadcast, no data movement).
//! A thread's chunks are `32 * num_warps * c` elements apart, so when
//! `BLOCK_K / 2` (Q4) or `BLOCK_K` (Q8_0) divides that, all its chunks sit
//! at the same K offset in different rows and share one set of activation
//! loads. The per-chunk indices are computed per block (or per 8 bytes)
//! and broadcast along it, which makes the index registers of a chunk
//! identical, so each chunk's scale and word loads are single loads.
//!
//! The main loop runs the whole K tiles, software-pipelined: the loads of
//! tile `t + 1` are issued before tile `t` is computed (the last tile
//! reloads itself), so two tiles of loads are in flight per thread. It has
//! no masks: rows past `N` (or `2N`) and `M` are clamped to the last row
//! (valid addresses; their results are not stored). A last partial K tile
//! (`K % BLOCK_K != 0`) runs once more with its block indices clamped to
//! the row's last block and the activations of blocks past K zeroed.
//!
//! The first weight tile is loaded before `gdc_wait` (programmatic dependent
//! launch, see `dsl_core::ir::ops::program`): no kernel writes the weights,
//! so on sm_90a their latency overlaps the previous kernel's tail; the
//! activations, the norm's statistic and the output come after the wait.
//!
//! GEMM (prefill and decode batches above [`uses_gemv`]'s range, [`gemm`]).
//! Program `(i, j)` owns the output rows from row `i * BLOCK_M` and the
//! weight rows from row `j * BLOCK_N`; per K tile it dequantizes the W tile
//! to f32 exactly as the GEMV does, rounds it and the activation tile to
//! f16 and adds `x_tile @ w_tile^T` with `dot` (for Q4 two dots: the
//! low-nibble and high-nibble halves of the tile against the matching
//! activation columns; the order of the reduced axis does not matter).
//! `dot` on f16 operands lowers to tensor cores (`mma.sync.m16n8k16`, f32
//! accumulators) when `BLOCK_M` is a multiple of 16 per warp row, `BLOCK_N`
//! of 8 per warp column and the reduced width (`BLOCK_K / 2` for Q4,
//! `BLOCK_K` for Q8_0) of 16, as every declared config and [`gemm_tiles`]
//! are; the accumulator stays in the mma layout across the K loop. The f16
//! operands change the error model (see [`crate::reference::quant`]) and
//! need activations within f16's range (`|x| < 65504`, true of normed
//! decoder activations).
//! The K tail, clamping and epilogues are the GEMV's.
//!
//! Swapped GEMM (`SWAP`, [`gemm::gemm_swap`], the runtime's choice for
//! large products with 16-bit activations on sm_90a, see [`gemm_tiles`]).
//! The program computes `out_tile^T = W_tile @ x_tile^T` as one `dot`
//! per K tile: the W tile `[BLOCK_N, BLOCK_K]` dequantized in K order and
//! rounded to the activation dtype is the `a` operand, which `wgmma` takes
//! from registers (the codegen stages it once through shared memory into A
//! fragments), and the activation tile `[BLOCK_M, BLOCK_K]`, loaded as it
//! is, is the `b` operand, which the codegen pipelines with `cp.async` into
//! swizzle atoms that `wgmma` reads in place. The weight words and scales
//! are prefetched one tile ahead in registers. A thread's nibbles of one
//! word differ in their byte, a constant of each register, and in the
//! nibble half, which varies between threads: each word is shifted once by
//! the latter, and constant shifts do the rest. `BLOCK_N` is 64 rows per
//! warpgroup and `BLOCK_M` at most 256 (one `m64nNk16` per warpgroup and k
//! step). With bf16 activations the weights are rounded to bf16 (8
//! significant bits against f16's 11; the activations are exact), which is
//! what a bf16 GEMM on dequantized weights computes; f32 activations fall
//! back to f16 operands (`mma.sync`).
//!
//! # Constexprs
//!
//! - `T: Float`: activation and output dtype (f32 or bf16; f16 works too).
//! - `QUANT: QuantFormat`: the weight's format. One kernel per shape serves
//!   every format: it picks the nibble or the byte body, and each format is
//!   its own specialization, named after it (`gemv_q4_1`, `gemm_q8_0`).
//!   The bodies read the format through [`QuantFormat`]'s properties
//!   (`is_q4`, `has_min`), and the shared epilogues take their fusions as
//!   named flags ([`Fuse`]).
//! - `SILU`: fused gate/up epilogue (weights interleaved, `BLOCK_N` even).
//!   The kernels with more fusions ([`fused`], [`linear`]) take them as one
//!   constexpr, `FUSE: Fuse` (SiLU-mul, RMSNorm prologue, residual add).
//! - GEMV: `M_BLOCK` (activation rows per program, [`m_block_for`]),
//!   `BLOCK_N` (weight rows per program), `BLOCK_K` (K tile, a power of two
//!   `>= 32`). The accumulator holds `M_BLOCK * BLOCK_N * BLOCK_K / 2` (Q4)
//!   or `M_BLOCK * BLOCK_N * BLOCK_K` (Q8_0) f32 values over `32 *
//!   num_warps` threads; the declared configs keep it at 16 to 64 per thread.
//! - GEMM: `BLOCK_M`, `BLOCK_N`, `BLOCK_K` (powers of two, `BLOCK_K >= 32`;
//!   with `SWAP`, `BLOCK_K >= 64` and `BLOCK_N` a multiple of 16 per warp)
//!   and `SWAP` (the swapped product above).
//! - `num_warps`: autotune configs are declared (keyed on `m, n, k`); the
//!   untuned defaults are [`gemv_tiles`] and [`gemm_tiles`].

pub mod fused;
pub mod gemm;
pub mod gemv;
pub mod linear;
pub mod q8;
pub mod repack;
pub mod stacked;
pub mod stream_k;

pub use repack::{
    Family, QuantFormat, RepackError, Repacked, interleave_gate_up, q8_0_as_q5_1, repack, repack_q4_0,
    repack_q4_1, repack_q8_0,
};

/// What a dequant product fuses around itself, as named flags: the SiLU-mul
/// epilogue of gate/up weights, the RMSNorm prologue and the in-place
/// residual add (see the module doc and [`fused`]). The kernels that fuse
/// take it as one constexpr (`#[constexpr] FUSE: Fuse`, built with
/// [`Fuse::NONE`] and the `with_*` methods) and pass it to their shared
/// bodies as it is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fuse {
    silu: bool,
    norm: bool,
    residual: bool,
}

impl Fuse {
    /// The plain product.
    pub const NONE: Fuse = Fuse { silu: false, norm: false, residual: false };

    /// The same fusions, with the SiLU-mul epilogue `on` or off.
    pub const fn with_silu(self, on: bool) -> Fuse {
        Fuse { silu: on, ..self }
    }

    /// The same fusions, with the RMSNorm prologue `on` or off.
    pub const fn with_norm(self, on: bool) -> Fuse {
        Fuse { norm: on, ..self }
    }

    /// The same fusions, with the residual-add epilogue `on` or off.
    pub const fn with_residual(self, on: bool) -> Fuse {
        Fuse { residual: on, ..self }
    }

    /// Gate/up rows interleaved, `out = silu(gate) * up`.
    pub const fn silu(self) -> bool {
        self.silu
    }

    /// The activations are RMS-normalized as they are loaded.
    pub const fn norm(self) -> bool {
        self.norm
    }

    /// `out = round_T(round_T(y) + out)` in place.
    pub const fn residual(self) -> bool {
        self.residual
    }
}

impl dsl_core::launch::Constexpr for Fuse {
    /// The fusions that are on, joined by `_` (`silu_norm`), or `none`.
    fn name_part(&self) -> String {
        let on = [(self.silu, "silu"), (self.norm, "norm"), (self.residual, "residual")];
        let names: Vec<&str> = on.iter().filter(|(f, _)| *f).map(|(_, n)| *n).collect();
        if names.is_empty() { "none".to_string() } else { names.join("_") }
    }
}

/// The largest `M` the GEMV path is tuned for (its tiles hold at most 8
/// rows per program); [`uses_gemv`] decides which kernel a product runs.
pub const GEMV_MAX_M: usize = 16;

/// Tile sizes and warps of one GEMV launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemvTiles {
    /// Activation rows per program.
    pub m_block: usize,
    /// Weight rows per program.
    pub block_n: usize,
    /// The K tile.
    pub block_k: usize,
    /// Warps per program.
    pub num_warps: u32,
}

/// Tile sizes and warps of one GEMM launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmTiles {
    /// Activation rows per program.
    pub block_m: usize,
    /// Weight rows per program.
    pub block_n: usize,
    /// The K tile.
    pub block_k: usize,
    /// Warps per program.
    pub num_warps: u32,
    /// The swapped product (`SWAP`, see [`gemm::gemm_swap`]).
    pub swap: bool,
    /// Software-pipelining depth (`num_stages`).
    pub num_stages: u32,
}

/// Activation rows per GEMV program for `m` rows: `m` rounded up to a power
/// of two, at most 8 (so the f32 accumulators stay in registers; 9..16 rows
/// take two programs per column tile, the second reading W from L2).
pub fn m_block_for(m: usize) -> usize {
    m.max(1).next_power_of_two().min(8)
}

/// The largest power of two `<= cap` that divides `k` (at least 32 for
/// `k % 32 == 0`), so K needs no partial tile when possible.
fn dividing_tile(k: usize, cap: usize) -> usize {
    let mut t = cap;
    while t > 32 && !k.is_multiple_of(t) {
        t /= 2;
    }
    t
}

/// The largest power of two `<= n` (`n >= 1`).
fn prev_power_of_two(n: usize) -> usize {
    1 << (usize::BITS - 1 - n.max(1).leading_zeros())
}

/// Untuned GEMV tiles for `m` activation rows, a weight of `rows` rows
/// (`2N` with SILU) and `k` columns: a K tile dividing `k` when it is at
/// least 256 wide, otherwise the largest power of two up to the cap plus a
/// masked tail step (at most 256 quant bytes per row; 512 for a single-row
/// Q4 GEMV on a weight of fewer than 8192 rows, whose few programs are
/// latency-bound: fewer, longer K steps are fewer dependent load round
/// trips), 16 rows per program for large weights and 8 otherwise, shrunk so
/// that each thread holds at most `4 / M_BLOCK` 8-byte chunks of the W tile
/// (the f32 accumulators, `M_BLOCK` per chunk element, stay within 64
/// registers), and 1 to 4 warps to cover the tile (a single-row Q4 GEMV
/// takes enough warps for two chunks per thread: more programs' worth of
/// loads in flight).
pub fn gemv_tiles(format: QuantFormat, m: usize, rows: usize, k: usize) -> GemvTiles {
    let q4 = format.is_q4();
    let m_block = m_block_for(m);
    let chunks = (4 / m_block).max(1);
    let single_q4 = q4 && m_block == 1;
    let cap = match (q4, single_q4 && rows < 8192) {
        (true, true) => 1024,
        (true, false) => 512,
        (false, _) => 256,
    };
    let block_k = match dividing_tile(k, cap) {
        // A K with a small power-of-two factor (SmolLM2's 576 = 9 x 64)
        // would loop over many small tiles, one dependent load round trip
        // each; one large tile plus the masked tail step is fewer trips.
        t if t < 256 && k > t => prev_power_of_two(k.min(cap)),
        t => t,
    };
    let row_bytes = if q4 { block_k / 2 } else { block_k };
    let block_n = (if rows >= 8192 { 16 } else { 8 }).min((1024 * chunks / row_bytes).max(2));
    let per_warp = if single_q4 { 512 } else { 256 * chunks };
    let num_warps = (block_n * row_bytes / per_warp).clamp(1, 4) as u32;
    GemvTiles { m_block, block_n, block_k, num_warps }
}

/// The GEMV grid: `[ceil(rows / BLOCK_N), ceil(m / M_BLOCK), 1]` with
/// `rows = n` (or `2n` with SILU).
pub fn gemv_grid(m: usize, n: usize, silu: bool, m_block: usize, block_n: usize) -> [u32; 3] {
    let rows = if silu { 2 * n } else { n };
    [rows.div_ceil(block_n) as u32, m.div_ceil(m_block) as u32, 1]
}

/// Whether a product of `m` activation rows with a weight of `rows` rows
/// (`2N` with SILU) runs the GEMV (`true`) or the tensor-core GEMM. The
/// GEMV streams the weights once per 8 rows and multiplies with FMAs: ideal
/// while memory-bound (up to 4 rows), then FMA-bound, its time growing with
/// `m * rows * k`; the GEMM's time grows with `k` alone at these sizes (its
/// K loop's latency), so the crossover is at a fixed `m * rows` (the bench
/// rows `path/` compare both sides of it: 16 x 960 is about even).
pub fn uses_gemv(m: usize, rows: usize) -> bool {
    m <= 4 || m * rows <= 16 * 1024
}

/// The most activation rows at which the fast path runs the GEMV on a
/// format the word-tiled GEMM does not take (Q5_1, the K-quants): their
/// alternative is [`linear`]'s tensor-core tile, which from 4 rows is the
/// faster of the two (measured on a decoder's projections; see
/// BENCHMARKS.md).
pub const LINEAR_ALTERNATIVE_GEMV_MAX_M: usize = 2;

/// Whether the fast path (`--no-batch-invariance`) runs a product of `m`
/// activation rows with a `format` weight of `rows` rows on the GEMV (the
/// word-tiled formats against their GEMM, [`uses_gemv`]; the other block
/// formats against [`linear`], [`LINEAR_ALTERNATIVE_GEMV_MAX_M`]). `false`
/// for the 16-bit floats, which have no GEMV.
pub fn fast_path_gemv(format: QuantFormat, m: usize, rows: usize) -> bool {
    if format.gpu_kernels() {
        uses_gemv(m, rows)
    } else {
        format.gemv_kernels() && m <= LINEAR_ALTERNATIVE_GEMV_MAX_M
    }
}

/// The swapped 256 x 128 x 64 tile (8 warps, 4 stages) of the large
/// bf16 products on sm_90a: [`gemm_tiles`]' choice for wide grids and the
/// stream-K kernel's tile ([`stream_k()`]). Its deferred `wgmma` group
/// leaves the activation copies `stages - 2` tiles ahead, so the fourth
/// stage (192 KB of rings with the staged weight tiles) keeps two tiles of
/// copies in flight.
pub const SWAPPED_WIDE: GemmTiles =
    GemmTiles { block_m: 256, block_n: 128, block_k: 64, num_warps: 8, swap: true, num_stages: 4 };

/// Untuned GEMM tiles for `m` activation rows, a weight of `rows` rows
/// (`2N` with SILU) and `k` columns, the first that fits of: 128 x 128
/// output tiles with K tiles of 64 (Q4) or 32 (Q8_0) weights over 8 warps
/// when that makes at least 200 programs; 64 x 128 with K tiles of 128 (Q4)
/// or 64 (Q8_0) over 8 warps for at least 128 programs; otherwise 32 x 32
/// (4 warps), or 16 x 32 (2 warps) for at most 16 rows, with the wider K
/// tiles. Without a cp.async pipeline, programs hide each other's load
/// latency, so smaller tiles win everywhere but on the largest products.
/// Every choice fits whole `mma.sync` instructions.
///
/// With `swap_ok` (16-bit activations on a `wgmma` device, sm_90a), a Q4
/// weight with K of at least 2048, at least 256 activation rows and 100
/// programs of 256 x 128 takes the swapped product ([`gemm::gemm_swap`])
/// on that tile, K tiles of 64, 8 warps (see [`SWAPPED_WIDE`]), well ahead
/// of the best unswapped tile. Since the activation tile is a TMA copy,
/// smaller products with at least 64 rows and 132 programs of 64 x 64 (one
/// per H100 SM) take the swapped 64 x 64 tile (K tiles of 64, 4 warps, 4
/// stages). With fewer programs the two forms are even, and for short K
/// (a few K tiles, too few to fill the swapped pipeline) the unswapped
/// tiles win, so they stay.
pub fn gemm_tiles(format: QuantFormat, m: usize, rows: usize, k: usize, swap_ok: bool) -> GemmTiles {
    let q8 = !format.is_q4();
    let (narrow_k, wide_k) = if q8 { (32, 64) } else { (64, 128) };
    let programs = |bm: usize, bn: usize| m.div_ceil(bm) * rows.div_ceil(bn);
    if swap_ok && !q8 && k >= 2048 && m >= 256 && programs(256, 128) >= 100 {
        return SWAPPED_WIDE;
    }
    if swap_ok && !q8 && k >= 2048 && m >= 64 && programs(64, 64) >= 132 {
        return GemmTiles { block_m: 64, block_n: 64, block_k: 64, num_warps: 4, swap: true, num_stages: 4 };
    }
    let (block_m, block_n, block_k, num_warps) = if programs(128, 128) >= 200 {
        (128, 128, narrow_k, 8)
    } else if programs(64, 128) >= 128 {
        (64, 128, wide_k, 8)
    } else if m > 16 {
        (32, 32, wide_k, 4)
    } else {
        (16, 32, wide_k, 2)
    };
    GemmTiles { block_m, block_n, block_k, num_warps, swap: false, num_stages: 2 }
}

/// The stream-K launch ([`stream_k::gemm_stream_k`]) for `m` activation rows,
/// a weight of `rows` rows and `k` columns on a device with `sms` SMs: its
/// tiles ([`SWAPPED_WIDE`]) and grid
/// (one program per SM), or `None` when [`gemm_tiles`]' tiled grid is the
/// better launch. Stream-K pays where the 256 x 128 tiles would leave at
/// least half the SMs idle (M 256 x N 4096: 32 tiles on 132 SMs). With
/// more tiles it loses, because handing a 128 KB partial sum over (32
/// stores per thread, which stall on the store queue) costs more than the
/// few idle SMs it recovers. Q4 weights with 16-bit activations on a
/// `wgmma` device (`swap_ok`), K of at least 2048 in whole K tiles, and
/// more than 128 activation rows (the tile is 256 rows).
pub fn stream_k(
    format: QuantFormat,
    m: usize,
    rows: usize,
    k: usize,
    swap_ok: bool,
    sms: usize,
) -> Option<(GemmTiles, u32)> {
    let t = SWAPPED_WIDE;
    let tiles = m.div_ceil(t.block_m) * rows.div_ceil(t.block_n);
    let iterations = tiles * (k / t.block_k);
    let fits = iterations.checked_mul(sms).is_some_and(|v| v < 1 << 31);
    let shape = k >= 2048 && k.is_multiple_of(t.block_k) && m > 128 && 2 * tiles <= sms;
    (swap_ok && format.is_q4() && shape && fits).then_some((t, sms as u32))
}

/// The GEMM grid: `[ceil(m / BLOCK_M), ceil(rows / BLOCK_N), 1]` with
/// `rows = n` (or `2n` with SILU).
pub fn gemm_grid(m: usize, n: usize, silu: bool, block_m: usize, block_n: usize) -> [u32; 3] {
    let rows = if silu { 2 * n } else { n };
    [m.div_ceil(block_m) as u32, rows.div_ceil(block_n) as u32, 1]
}

/// The largest batch the batch-invariant product runs split on 16-row
/// tiles, one K tile per program ([`LinearTiles::split`]).
pub const LINEAR_SPLIT_MAX_M: usize = 16;

/// The largest batch a long-K product ([`LINEAR_SPLIT_LONG_K`] columns or
/// more: the down projection) runs split, on 32 x 32 tiles.
pub const LINEAR_SPLIT_LONG_MAX_M: usize = 128;

/// The K from which a product counts as long for
/// [`LINEAR_SPLIT_LONG_MAX_M`]: eight K tiles or more.
pub const LINEAR_SPLIT_LONG_K: usize = 1024;

/// A long product runs split at up to [`LINEAR_SPLIT_LONG_MAX_M`] rows only
/// while its unsplit 32 x 32 grid has fewer programs than this (about one
/// per SM): a grid that fills the GPU gains nothing from more programs and
/// pays the hand-over.
pub const LINEAR_SPLIT_PROGRAMS: usize = 128;

/// Tiles of one batch-invariant product ([`linear::linear`]); its K tile
/// is always [`linear::LINEAR_BLOCK_K`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearTiles {
    /// Activation rows per program.
    pub block_m: usize,
    /// Weight rows per program.
    pub block_n: usize,
    /// Warps per program.
    pub num_warps: u32,
    /// One K tile per program, the tiles' products summed by the last one
    /// (`SPLIT`): many short programs instead of a few long loops.
    pub split: bool,
}

/// The weight elements (`rows * k`) from which a small batch's split
/// product takes 64 weight rows per program in a nibble format too: a
/// large model's projections, whose programs then each stream twice the
/// weights per K tile.
pub const LINEAR_SPLIT_WIDE_WEIGHTS: usize = 1 << 24;

/// Tiles of the batch-invariant product for `m` activation rows, a weight
/// of `rows` rows (`2N` with SILU) and `k` columns, on tensor cores
/// (`tensor_cores`: the GPU) or on the interpreter. Every tile and both
/// forms compute the same bits (see [`linear`]), so the choice follows
/// speed alone (`bench --only linear` times every candidate). On tensor
/// cores:
/// - up to [`LINEAR_SPLIT_MAX_M`] rows run split on 16-row tiles of 4 warps
///   (32 weight rows; 64 for the byte formats, the head, and for weights
///   of at least [`LINEAR_SPLIT_WIDE_WEIGHTS`] elements), the small decode
///   batches;
/// - up to [`LINEAR_SPLIT_LONG_MAX_M`] rows of a product of at least
///   [`LINEAR_SPLIT_LONG_K`] columns whose unsplit grid would not fill the
///   GPU ([`LINEAR_SPLIT_PROGRAMS`]) run split on 32 x 32 tiles: the K loop
///   of a long product is the longer wait there;
/// - prefill chunks of 1024 rows or more loop over K on 128 x 128 tiles of
///   8 warps, whatever the number of programs (the tile that moves the
///   fewest operand bytes per product is the fastest even below one
///   program per SM);
/// - other batches loop over K on 128 x 128 tiles of 8 warps (more than 64
///   rows, at least 200 programs), or on 64 x 128 tiles of 8 warps when
///   those give at least 128 programs (64 for the decode batches of at most
///   64 rows: a large model's products), else on 32 x 32 tiles (64 x 64 for
///   the byte formats above 128 rows).
///
/// The interpreter loops over K with 64 weight rows and up to 64
/// activation rows per program (its cost is the dequantization per row
/// tile).
pub fn linear_tiles(format: QuantFormat, m: usize, rows: usize, k: usize, tensor_cores: bool) -> LinearTiles {
    if !tensor_cores {
        let block_m = m.max(1).next_power_of_two().min(64);
        return LinearTiles { block_m, block_n: 64, num_warps: 4, split: false };
    }
    let q8 = !format.is_q4();
    if m <= LINEAR_SPLIT_MAX_M {
        let wide = q8 || rows * k >= LINEAR_SPLIT_WIDE_WEIGHTS;
        return LinearTiles { block_m: 16, block_n: if wide { 64 } else { 32 }, num_warps: 4, split: true };
    }
    let programs = |bm: usize, bn: usize| m.div_ceil(bm) * rows.div_ceil(bn);
    if m <= LINEAR_SPLIT_LONG_MAX_M && k >= LINEAR_SPLIT_LONG_K && programs(32, 32) < LINEAR_SPLIT_PROGRAMS {
        return LinearTiles { block_m: 32, block_n: 32, num_warps: 4, split: true };
    }
    let (block_m, block_n, num_warps) = if m >= 1024 || (m > 64 && programs(128, 128) >= 200) {
        (128, 128, 8)
    } else if programs(64, 128) >= if m <= 64 { 64 } else { 128 } {
        (64, 128, 8)
    } else if q8 && m > 128 {
        (64, 64, 4)
    } else {
        (32, 32, 4)
    };
    LinearTiles { block_m, block_n, num_warps, split: false }
}

/// The programs per SM whose registers a batch-invariant product on tiles
/// `t` is compiled for (`min_programs_per_sm`; 0 leaves ptxas its own
/// budget). The split 16 x 64 tiles of 4 warps run short programs, so how
/// many are resident at once bounds the weights in flight: 8 for Q4_1 and
/// Q4_K weights, 6 for Q6_K (whose weights take more registers to form;
/// at 8 it loses), ptxas's own budget for the formats not measured.
pub fn linear_min_programs(format: QuantFormat, t: &LinearTiles) -> u32 {
    let short = t.split && t.block_m == 16 && t.block_n == 64 && t.num_warps == 4;
    match format {
        QuantFormat::Q4_1 | QuantFormat::Q4_K if short => 8,
        QuantFormat::Q6_K if short => 6,
        _ => 0,
    }
}

/// The grid of a batch-invariant product: `[ceil(m / BLOCK_M), ceil(rows /
/// BLOCK_N), K tiles or 1]` with `rows = n` (or `2n` with SILU).
pub fn linear_grid(m: usize, n: usize, k: usize, silu: bool, t: &LinearTiles) -> [u32; 3] {
    let [a, b, _] = gemm_grid(m, n, silu, t.block_m, t.block_n);
    let z = if t.split { k.div_ceil(linear::LINEAR_BLOCK_K) } else { 1 };
    [a, b, z as u32]
}

/// The f32 workspace entries and i32 counters a split product of `m` rows
/// on `grid` needs ([`linear::split_finish`]; none unsplit).
pub fn linear_workspace(grid: [u32; 3], t: &LinearTiles) -> (usize, usize) {
    if !t.split {
        return (0, 0);
    }
    let tiles = grid[0] as usize * grid[1] as usize;
    (tiles * grid[2] as usize * t.block_m * t.block_n, tiles)
}

#[cfg(test)]
mod tests {
    use super::Fuse;
    use dsl_core::launch::Constexpr;

    /// A `FUSE` constexpr names the fusions that are on (as a `{FUSE}` of
    /// a kernel name template would show them).
    #[test]
    fn fuse_name_parts() {
        assert_eq!(Fuse::NONE.name_part(), "none");
        assert_eq!(Fuse::NONE.with_silu(true).with_norm(true).name_part(), "silu_norm");
        assert_eq!(Fuse::NONE.with_norm(true).with_residual(true).name_part(), "norm_residual");
    }
}
