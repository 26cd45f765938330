//! Plain references for the kernel library, in f64 (one module per kernel
//! family). Tests compare every kernel against these on random inputs.

pub mod attention;
pub mod embedding;
pub mod fp8;
pub mod kv_cache;
pub mod matmul;
pub mod norm;
pub mod quant;
pub mod rope;
pub mod sampling;
pub mod scan;
pub mod softmax;

/// One step of SplitMix64 on `state`: the next 64 random bits of the seeded
/// generators of the runtime's checks and of the tests (which seed `state`
/// each their own way).
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
