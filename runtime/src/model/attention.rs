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
/// block, the same warp layout of a row (a warpgroup of 64 rows on `wgmma`,
/// one warp of 16 rows per `mma.sync`), the same softmax arithmetic, and no
/// split.
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
    let half = matches!(dtype, DType::BF16 | DType::F16);
    let (rows, warps) = match (half, wgmma) {
        (true, true) => (64, 4),
        (true, false) => (16, 1),
        (false, _) => (default_rows(group), 4),
    };
    (t.block_n, rows.max(group), warps)
}
