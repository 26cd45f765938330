//! The copy kernel: the bandwidth ceiling that `tessera bench` and
//! `tessera profile` measure every other kernel against.

use dsl_macros::kernel;

/// `out[i] = x[i]` for `i < n`: the bandwidth ceiling of the bench.
#[kernel]
pub fn copy<T: Float>(x_ptr: Ptr<T>, out_ptr: Ptr<T>, n: i32, #[constexpr] BLOCK: usize) {
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    store(out_ptr + offs, load(x_ptr + offs, mask = mask), mask = mask);
}
