//! The bundled kernel library. Every kernel is DSL: no `unsafe`, no PTX, no CUDA C.
//!
//! Empty until the kernel-library issue lands.
#![forbid(unsafe_code)]
