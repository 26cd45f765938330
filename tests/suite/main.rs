//! The cross-crate test suite, one binary (linking is slow once codegen links LLVM).

mod common;
mod diagnostics;
mod interp_macro;
mod ir_snapshots;
mod lib_decode;
mod lib_dequant;
mod lib_embedding;
mod lib_flash_attention;
mod lib_fp8;
mod lib_kquant;
mod lib_kv_cache;
mod lib_linear;
mod lib_matmul;
mod lib_norm;
mod lib_q8;
mod lib_rope;
mod lib_sampling;
mod lib_softmax;
mod lib_stacked;
mod macro_kernels;
mod ui;
