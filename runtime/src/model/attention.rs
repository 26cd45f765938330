//! The attention kernels' configurations for a model: FlashAttention's
//! tiles for prefill rows ([`prefill_tiles`]) and the batch-invariant decode
//! kernel's ([`invariant_decode`]), which computes for each row what the
//! prefill kernel computes for it. The launches are
//! [`super::layers`]' `attention` step and the persistent kernel's.

use dsl_core::DType;
use kernels::decode_attention::{default_rows, paged_decode_tc};
use kernels::flash_attention as fa;

/// FlashAttention's tiles for `head_dim`, `dtype`, the device (`wgmma`)
/// and pages of `page` tokens ([`fa::config_for`]), with the
/// batch-invariant softmax when `invariant`.
pub(crate) fn prefill_tiles(
    head_dim: usize,
    dtype: DType,
    wgmma: bool,
    page: usize,
    invariant: bool,
) -> fa::TileConfig {
    fa::TileConfig { invariant, ..fa::config_for(head_dim, dtype, wgmma, page) }
}

/// The batch-invariant decode kernel's configuration: each row computes
/// what [`prefill_tiles`]' prefill kernel computes for it, with the same key
/// block, the same softmax arithmetic, and no split. The tile is the
/// query heads of a KV head padded to 16 rows, its keys spread over four
/// warps: the products' sums run over the head dimension and the keys in
/// the same 16-wide steps whatever the warp layout, and the block's row
/// sum is the fixed-point one ([`fa::fixed_row_sum`]), so the bits do not
/// depend on the prefill kernel's layout (a warpgroup of 64 rows on
/// `wgmma`, warps of 16 rows per `mma.sync`).
pub(crate) fn invariant_decode(
    dtype: DType,
    wgmma: bool,
    h_kv: usize,
    group: usize,
    head_dim: usize,
    page: usize,
) -> paged_decode_tc::Config {
    let (block_n, rows, warps) = invariant_decode_shape(dtype, wgmma, group, head_dim, page);
    paged_decode_tc::Config::new(dtype, h_kv, group, head_dim, page, block_n, false, rows, true, false)
        .with_warps(warps)
        .with_stages(INVARIANT_DECODE_STAGES)
}

/// The pipeline depth of the batch-invariant decode kernel.
pub(crate) const INVARIANT_DECODE_STAGES: u32 = 3;

/// [`invariant_decode`]'s key block, tile height and warps.
pub(crate) fn invariant_decode_shape(
    dtype: DType,
    wgmma: bool,
    group: usize,
    head_dim: usize,
    page: usize,
) -> (usize, usize, u32) {
    let t = prefill_tiles(head_dim, dtype, wgmma, page, true);
    (t.block_n, default_rows(group), 4)
}
