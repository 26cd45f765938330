//! Token-embedding gather from a Q8_0 table (GGUF's `Q8_0`, as SmolLM2's
//! `token_embd.weight` is stored: vocab 49152, hidden 576).
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
    let id = load(ids_ptr + t);
    let valid = id >= 0 && id < vocab;
    // Clamped so that even the (masked-off) addresses stay inside the table.
    let row = where_(valid, id, 0);
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

/// `out[t, :] = w[ids[t], :]` rounded to `T` from a 16-bit float table
/// (`BF16`: bfloat16, else IEEE half; GGUF's F16/BF16 `token_embd`), raw
/// little-endian bytes `vocab * hidden * 2` long (2-byte aligned); zeros for
/// ids outside `[0, vocab)`. Exact for f32 outputs; one rounding otherwise.
/// Offsets 32-bit: `vocab * hidden < 2^31`.
#[kernel]
pub fn embedding_f16<T: Float>(
    w_ptr: Ptr<u8>,
    ids_ptr: Ptr<i32>,
    out_ptr: Ptr<T>,
    hidden: i32,
    vocab: i32,
    #[constexpr] BF16: bool,
    #[constexpr] BLOCK: usize,
) {
    gdc_wait();
    gdc_launch_dependents();
    let t = program_id(0);
    let id = load(ids_ptr + t);
    let valid = id >= 0 && id < vocab;
    let row = where_(valid, id, 0);
    for c0 in range(0, hidden, BLOCK) {
        let cols = c0 + arange(0, BLOCK);
        let in_row = cols < hidden;
        let h = load(ptrcast(w_ptr, i16) + (row * hidden + cols), mask = in_row && valid, other = 0);
        let v = if BF16 { bitcast(h, bf16).to(f32) } else { bitcast(h, f16).to(f32) };
        store(out_ptr + t * hidden + cols, v.to(T), mask = in_row);
    }
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
