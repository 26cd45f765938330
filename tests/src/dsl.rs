//! Test-only kernels written with `#[kernel]`; the shared example kernels live
//! in `kernels::examples` (re-exported here so tests read `dsl::matmul`).

use dsl_macros::kernel;
pub use kernels::examples::*;

/// Deliberately wrong when `A != B`: the shapes depend on constexprs, so the
/// mismatch is found when the kernel is built, at this line.
#[kernel]
pub fn mismatched(x_ptr: Ptr<f32>, #[constexpr] A: usize, #[constexpr] B: usize) {
    let bad = arange(0, A) + arange(0, B);
    store(x_ptr + arange(0, A), bad);
}
