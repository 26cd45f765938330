//! Test-only kernels written with `#[kernel]`; the shared example kernels live
//! in `kernels::examples` (re-exported here so tests read `dsl::matmul`).

use dsl_macros::kernel;
pub use kernels::examples::*;

/// A masked copy whose two loads carry cache hints (Triton's
/// `eviction_policy` and `cache_modifier`): the values are those of plain
/// loads; only the PTX differs.
#[kernel]
pub fn hinted_copy(x_ptr: Ptr<f32>, y_ptr: Ptr<f32>, out_ptr: Ptr<f32>, n: i32, #[constexpr] BLOCK: usize) {
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let ok = offs < n;
    let x = load(x_ptr + offs, mask = ok, other = 0.0, eviction_policy = "evict_first");
    let y = load(y_ptr + offs, mask = ok, other = 0.0, cache_modifier = ".cg");
    store(out_ptr + offs, x + y, mask = ok);
}

/// A load with both hints: PTX has no such load, so `build` reports it.
#[kernel]
pub fn both_hints(x_ptr: Ptr<f32>, #[constexpr] BLOCK: usize) {
    let offs = arange(0, BLOCK);
    let x = load(x_ptr + offs, cache_modifier = ".cs", eviction_policy = "evict_last");
    store(x_ptr + offs, x * 2.0);
}

/// Deliberately wrong when `A != B`: the shapes depend on constexprs, so the
/// mismatch is found when the kernel is built, at this line.
#[kernel]
pub fn mismatched(x_ptr: Ptr<f32>, #[constexpr] A: usize, #[constexpr] B: usize) {
    let bad = arange(0, A) + arange(0, B);
    store(x_ptr + arange(0, A), bad);
}

/// A tiled copy through `load_block` (Triton's tensor-descriptor load):
/// program `(pid_m, pid_n)` copies the `[BM, BN]` box at
/// `(row0 + pid_m BM, col0 + pid_n BN)` of the `m x n` matrix `x` (rows
/// `stride_x` apart) to the same place of the dense `out` (rows `out_stride`
/// apart); elements outside the matrix are zero.
#[kernel]
#[allow(clippy::too_many_arguments)]
pub fn block_copy<T: Num>(
    x_ptr: Ptr<T>,
    out_ptr: Ptr<T>,
    m: i32,
    n: i32,
    stride_x: i32,
    row0: i32,
    col0: i32,
    out_stride: i32,
    #[constexpr] BM: usize,
    #[constexpr] BN: usize,
) {
    let pid_m = program_id(0);
    let pid_n = program_id(1);
    let box_row = row0 + pid_m * BM;
    let tile = load_block(
        x_ptr,
        m,
        n,
        stride_x,
        box_row,
        col0 + pid_n * BN,
        [BM, BN],
        eviction_policy = "evict_first",
    );
    let rows = expand_dims(pid_m * BM + arange(0, BM), 1);
    let cols = expand_dims(pid_n * BN + arange(0, BN), 0);
    store(out_ptr + rows * out_stride + cols, tile);
}
