//! The runtime: the only crate that touches the CUDA driver (cudarc), plus model
//! loading, tokenizer, KV cache, scheduler and the `tessera` CLI.
//!
//! Empty until the codegen and runtime issues land.
