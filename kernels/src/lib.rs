//! The bundled kernel library. Every kernel is DSL: no `unsafe`, no PTX, no CUDA C.
//!
//! One file per kernel family, each with a module doc (math, tiling,
//! shape/layout contract, constexprs); plain f64 references in `reference`.
//! `examples` holds the tutorial/test kernels.
#![forbid(unsafe_code)]

pub mod copy;
pub mod cpu_gemv;
pub mod decode_attention;
pub mod decode_step;
pub mod dequant;
pub mod embedding;
pub mod examples;
pub mod flash_attention;
pub mod fp8;
pub mod kv_cache;
pub mod matmul;
pub mod reference;
pub mod rmsnorm;
pub mod rope;
pub mod sampling;
pub mod softmax;

/// The warps of the row kernels' launch policy (`warps_for` of
/// [`rmsnorm`], [`softmax`], [`sampling`]): 4 for a tile of `block`
/// elements (rounded up to a power of two) up to `four`, 8 up to `eight`,
/// 16 beyond.
pub fn warps_by_tile(block: usize, four: usize, eight: usize) -> u32 {
    match block.next_power_of_two() {
        b if b <= four => 4,
        b if b <= eight => 8,
        _ => 16,
    }
}
