//! The bundled kernel library. Every kernel is DSL: no `unsafe`, no PTX, no CUDA C.
//!
//! Today it holds the example kernels (`examples`); the kernel-library issue
//! adds FlashAttention, fused softmax, add+RMSNorm, RoPE/KV write, paged decode,
//! dequant GEMM/GEMV and sampling, one file each.
#![forbid(unsafe_code)]

pub mod examples;
