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
