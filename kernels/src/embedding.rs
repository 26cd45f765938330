//! Token-embedding gather from a Q8_0 table (GGUF's `Q8_0`, as SmolLM2's
//! `token_embd.weight` is stored: vocab 49152, hidden 576); the gather from
//! tables in the other formats, repacked ([`embedding_repacked`]), is at the
//! end.
//!
//! # Format
//!
//! A Q8_0 row of `hidden` values is `hidden / 32` blocks of 34 bytes each: an
//! fp16 scale `d` (little-endian) followed by 32 signed bytes `q`; value `j` of
//! block `b` is `x = d * q[j]`. Rows are contiguous: row `id` starts at byte
//! `id * (hidden / 32) * 34`.
//!
//! # Math and rounding
//!
//! For token `t` with `id = ids[t]` and column `c` (block `b = c / 32`, `j = c % 32`):
//!
//! ```text
//! out[t, c] = round_T(f32(d_b) * f32(q_{b,j}))
//! ```
//!
//! The product of an f16 (11-bit significand) and an i8 (8 bits) is exact in
//! f32, so an f32 output is exact and a bf16/f16 output is one rounding
//! (nearest-even) of the exact value.
//!
//! # Tiling
//!
//! One program per token (grid `[n_tokens, 1, 1]`); the row is walked in tiles
//! of `BLOCK` columns by a runtime loop (one iteration when `BLOCK >= hidden`).
//! Per column the scale is loaded (from a `u8` pointer advanced by a byte
//! offset and viewed as f16 with `ptrcast`; lanes of the same block hit the
//! same address) and the quant byte is loaded as i8.
//!
//! # Contract
//!
//! - `w_ptr`: the Q8_0 table as raw bytes, `vocab * (hidden / 32) * 34` bytes,
//!   its base 2-byte aligned (each block's scale is then 2-byte aligned, as
//!   34 is even). `hidden` must be a multiple of 32 (Q8_0 has no partial blocks).
//! - `ids_ptr`: `n_tokens` i32 token ids; `out_ptr`: row-major
//!   `[n_tokens, hidden]`, contiguous.
//! - Invalid ids (`id < 0` or `id >= vocab`) read nothing: the row index is
//!   clamped to 0 and every load is masked off, so their output row is all
//!   zeros (no out-of-bounds access whatever the ids). Callers that want an
//!   error should validate ids on the host.
//! - Offsets are 32-bit: `vocab * (hidden / 32) * 34 < 2^31` and
//!   `n_tokens * hidden < 2^31`.
//!
//! # Parameters
//!
//! - `T: Float`: the output dtype (f32, bf16, f16).
//! - `hidden: i32`, `vocab: i32`: the table's shape.
//! - `#[constexpr] BLOCK`: the column tile, a power of two ([`block_for`]).

use crate::cpu_gemv::{byte_weights, weight_tile_any};
use crate::dequant::QuantFormat;
use dsl_core::DType;
use dsl_macros::{kernel, kernel_fn};

/// Bytes of one Q8_0 block: fp16 scale + 32 int8.
pub const Q8_0_BLOCK_BYTES: usize = 34;
/// Values per Q8_0 block.
pub const Q8_0_BLOCK_VALUES: usize = 32;

/// `out[t, :] = dequant_q8_0(w[ids[t], :])` rounded to `T`; zeros for ids
/// outside `[0, vocab)`. See the module doc.
#[kernel]
pub fn embedding_q8_0<T: Float>(
    w_ptr: Ptr<u8>,
    ids_ptr: Ptr<i32>,
    out_ptr: Ptr<T>,
    hidden: i32,
    vocab: i32,
    #[constexpr] BLOCK: usize,
) {
    // Programmatic dependent launch (sm_90): every input may come from the
    // previous kernel, so wait first; then let the next kernel start early.
    gdc_wait();
    gdc_launch_dependents();
    embedding_row(w_ptr, ids_ptr, out_ptr, hidden, vocab, program_id(0), T, BLOCK);
}

/// Token `t`'s table row and whether its id is in `[0, vocab)`; an invalid
/// id's row is 0, so that even masked-off addresses stay inside the table.
#[kernel_fn]
pub fn token_row(ids_ptr: Tensor, vocab: Tensor, t: Tensor) -> (Tensor, Tensor) {
    let id = load(ids_ptr + t);
    let valid = id >= 0 && id < vocab;
    (where_(valid, id, 0), valid)
}

/// The body of [`embedding_q8_0`] for token `t` (see the module doc).
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn embedding_row(
    w_ptr: Tensor,
    ids_ptr: Tensor,
    out_ptr: Tensor,
    hidden: Tensor,
    vocab: Tensor,
    t: Tensor,
    dt: DType,
    block: usize,
) {
    let (row, valid) = token_row(ids_ptr, vocab, t);
    let row_base = row * ((hidden / 32) * 34);
    for c0 in range(0, hidden, block) {
        let cols = c0 + arange(0, block);
        let in_row = cols < hidden;
        let mask = in_row && valid;
        let blk = row_base + (cols / 32) * 34;
        let d = load(ptrcast(w_ptr + blk, f16), mask = mask, other = 0.0).to(f32);
        let q = load(ptrcast(w_ptr + (blk + 2 + cols % 32), i8), mask = mask, other = 0).to(f32);
        store(out_ptr + t * hidden + cols, (d * q).to(dt), mask = in_row);
    }
}

/// `out[t, :] = w[ids[t], :]` rounded to `T` from a table repacked by
/// [`crate::dequant::repack`] in the format `QUANT` (every format but Q8_0,
/// whose GGUF bytes [`embedding_q8_0`] reads: the 16-bit floats, Q4_0,
/// Q4_1, Q5_0, Q5_1 and the K-quants, as llama.cpp's K-quant files store
/// `token_embd`): each weight as the products form it ([`weight_tile_any`];
/// Q8_0 planes, which Q5_0 becomes, as [`byte_weights`]), so a float table
/// is exact in f32; zeros for ids outside `[0, vocab)`.
/// Offsets 32-bit: `vocab * hidden < 2^31`. Each format is its own
/// specialization (IR name `embedding_repacked_q4_k`, ...).
#[kernel(name = "embedding_repacked_{QUANT}")]
pub fn embedding_repacked<T: Float>(
    q_ptr: Ptr<u8>,
    s_ptr: Ptr<f16>,
    ids_ptr: Ptr<i32>,
    out_ptr: Ptr<T>,
    hidden: i32,
    vocab: i32,
    #[constexpr] QUANT: QuantFormat,
    #[constexpr] BLOCK: usize,
) {
    gdc_wait();
    gdc_launch_dependents();
    let t = program_id(0);
    let (row, valid) = token_row(ids_ptr, vocab, t);
    for c0 in range(0, hidden, BLOCK) {
        let cols = c0 + arange(0, BLOCK);
        // Clamped columns (and row): every load stays inside the table.
        let col = minimum(cols, hidden - 1);
        let in_row = cols < hidden;
        let w = if QUANT.kernel_format() == QuantFormat::Q8_0 {
            let q = load(q_ptr + (row * hidden + col)).to(i32);
            byte_weights(q, load(s_ptr + (row * (hidden / 32) + col / 32)).to(f32))
        } else {
            weight_tile_any(q_ptr, s_ptr, row, col, hidden, QUANT)
        };
        store(out_ptr + t * hidden + cols, where_(in_row && valid, w, 0.0).to(T), mask = in_row);
    }
}

/// The formats [`embedding_repacked`] gathers from: every one but Q8_0.
pub fn repacked_formats() -> impl Iterator<Item = QuantFormat> {
    QuantFormat::ALL.into_iter().filter(|&f| f != QuantFormat::Q8_0)
}

/// The column tile for `hidden` columns: its next power of two, at most 1024
/// (longer rows loop).
pub fn block_for(hidden: usize) -> usize {
    hidden.next_power_of_two().min(1024)
}

/// Warps for a tile of `block` columns: 4 (a gather is pure memory traffic;
/// 128 threads cover a 1024-column tile with 8 values each).
pub fn warps_for(_block: usize) -> u32 {
    4
}
