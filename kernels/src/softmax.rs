//! Fused row softmax of any row length, with an optional scale and causal
//! mask: the attention-score softmax `softmax(scale * q k^T + causal)`.
//!
//! # Math
//!
//! For row `r` of `n = n_cols` elements, with `scale` and, when `CAUSAL`, the
//! key offset `o = causal_offset`:
//!
//! ```text
//! x_c   = f32(in_c) * scale                    (f32 multiply)
//! x_c   = -inf  if CAUSAL and c > r + o        (masked)
//! m     = max_c x_c
//! l     = sum_c exp(x_c - m)
//! out_c = exp(x_c - m) * (1 / l)               (one reciprocal per row)
//! ```
//!
//! Causal convention: query row `r` attends keys `0..=r + causal_offset`.
//! `causal_offset = 0` is the square causal mask; `causal_offset = n_kv -
//! n_q` aligns the last query with the last key (decode / chunked prefill).
//! Masked columns are written as `0`. A row whose every column is masked
//! (`r + causal_offset < 0`) is written as all zeros, not NaN: the running
//! max starts at the lowest finite f32 rather than `-inf` (so `exp(m_old -
//! m_new)` is never `exp(-inf - -inf)`), and the reciprocal is `0` when `l = 0`.
//!
//! # Online softmax (two passes over the row)
//!
//! The row is walked in `BLOCK` chunks (`for c0 in range(0, n_cols, BLOCK)`),
//! so any row length works with a fixed tile. Pass 1 keeps a running max `m`
//! and running sum `l`, rescaling the sum whenever the max grows:
//!
//! ```text
//! m_new = max(m, max(x_chunk))
//! l     = l * exp(m - m_new) + sum(exp(x_chunk - m_new))
//! m     = m_new
//! ```
//!
//! Pass 2 reads the row again and writes `exp(x - m) * (1 / l)`. A row that
//! fits in one `BLOCK` does one iteration of each loop (the second read then
//! mostly hits L2). All arithmetic is f32; the output is rounded to `T` once.
//!
//! # Tiling
//!
//! One program per row (grid `[rows, 1, 1]`). `BLOCK` is the chunk length
//! (a power of two, e.g. 1024; a non-power-of-two is padded by the front end);
//! columns `>= n_cols` are masked in every load and store, and causally masked
//! columns are not loaded.
//!
//! # Shape and layout contract
//!
//! Row-major `[rows, n_cols]` tensors whose rows start `stride` elements apart
//! (`stride >= n_cols`, contiguous within a row); `in` and `out` share
//! `stride`. `out` may alias `in` exactly (in-place): each program reads its
//! row fully in pass 1, and pass 2 reads each chunk before writing it. Offsets
//! are 32-bit: `rows * stride < 2^31`.
//!
//! # Parameters
//!
//! - `T: Float`: the storage dtype (f32, bf16, f16); math is f32.
//! - `n_cols: i32`: the row length; `stride: i32`: the row stride in elements.
//! - `scale: f32`: multiplies the inputs before the softmax (e.g. `1/sqrt(d)`).
//! - `causal_offset: i32`: see the causal convention above (ignored unless `CAUSAL`).
//! - `#[constexpr] CAUSAL`: apply the causal mask.
//! - `#[constexpr] BLOCK`: the chunk length.
//! - `num_warps`: autotune configs 4/8/16 keyed on `n_cols` are declared.

use dsl_macros::{kernel, kernel_fn};

/// Row softmax of `in * scale` (optionally causally masked), any row length,
/// in `BLOCK` chunks with the online max/sum rescaling; see the module doc.
#[kernel(autotune(configs = [(num_warps = 4), (num_warps = 8), (num_warps = 16)], key = [n_cols]))]
#[allow(clippy::too_many_arguments)]
pub fn softmax_online<T: Float>(
    out_ptr: Ptr<T>,
    in_ptr: Ptr<T>,
    n_cols: i32,
    stride: i32,
    scale: f32,
    causal_offset: i32,
    #[constexpr] CAUSAL: bool,
    #[constexpr] BLOCK: usize,
) {
    let row = program_id(0);
    let cols = arange(0, BLOCK);
    // Lowest finite f32, not -inf: exp(m_old - m_new) stays defined (1) while
    // every column seen so far is masked.
    let mut m = f32::MIN;
    let mut l = 0.0;
    for c0 in range(0, n_cols, BLOCK) {
        let c = c0 + cols;
        let mut valid = c < n_cols;
        if CAUSAL {
            // c - row cannot overflow (both in [0, 2^31)); c + offset could.
            valid = valid && c - row <= causal_offset;
        }
        let x = load(in_ptr + row * stride + c, mask = valid, other = 0.0).to(f32) * scale;
        let x = where_(valid, x, f32::NEG_INFINITY);
        let m_new = maximum(m, max(x, 0));
        l = l * exp(m - m_new) + sum(exp(x - m_new), 0);
        m = m_new;
    }
    // One reciprocal per row, then multiplies; a fully masked row has l = 0
    // and is written as zeros.
    let inv = where_(l > 0.0, 1.0 / l, 0.0);
    for c0 in range(0, n_cols, BLOCK) {
        let c = c0 + cols;
        let in_row = c < n_cols;
        let mut valid = in_row;
        if CAUSAL {
            valid = valid && c - row <= causal_offset;
        }
        let x = load(in_ptr + row * stride + c, mask = valid, other = 0.0).to(f32) * scale;
        let x = where_(valid, x, f32::NEG_INFINITY);
        store(out_ptr + row * stride + c, (exp(x - m) * inv).to(T), mask = in_row);
    }
}

/// Warps for a chunk of `block` elements: 4 up to 1024, 8 up to 4096, 16 beyond.
pub fn warps_for(block: usize) -> u32 {
    crate::warps_by_tile(block, 1024, 4096)
}

/// The chunk for rows of `n_cols` columns: the whole row (next power of two)
/// up to 4096, else 4096-element chunks with the online loop.
pub fn block_for(n_cols: usize) -> usize {
    n_cols.next_power_of_two().min(4096)
}

/// The numerators of a one-tile row softmax: `exp(x - max(x))` in f32 of
/// this program's row (`program_id(0)`, rows `stride` apart, `n_cols <=
/// block` elements; masked-off lanes load `-inf`, so they add nothing), with
/// the row, the column tile and its mask.
#[kernel_fn]
pub fn row_exp(
    in_ptr: Tensor,
    n_cols: Tensor,
    stride: Tensor,
    block: usize,
) -> (Tensor, Tensor, Tensor, Tensor) {
    let row = program_id(0);
    let cols = arange(0, block);
    let mask = cols < n_cols;
    let x = load(in_ptr + row * stride + cols, mask = mask, other = f32::NEG_INFINITY).to(f32);
    let x = x - max(x, 0);
    (row, cols, mask, exp(x))
}

/// Row softmax, computed in f32 and stored in `T`; one program per row of
/// `n_cols <= BLOCK` elements.
#[kernel(autotune(configs = [(num_warps = 4), (num_warps = 8), (num_warps = 16)], key = [n_cols]))]
pub fn softmax<T: Float>(
    out_ptr: Ptr<T>,
    in_ptr: Ptr<T>,
    n_cols: i32,
    stride: i32,
    #[constexpr] BLOCK: usize,
) {
    let (row, cols, mask, e) = row_exp(in_ptr, n_cols, stride, BLOCK);
    // One reciprocal per row, then a multiply per element: a division per
    // element costs more than the memory traffic of a bf16 row.
    let y = e * (1.0 / sum(e, 0));
    store(out_ptr + row * stride + cols, y, mask = mask);
}

/// Warps for a softmax row of `block` elements (Triton's tutorial heuristic, as
/// the peer baseline uses it).
pub fn softmax_warps(block: usize) -> u32 {
    if block >= 4096 { 8 } else { 4 }
}
