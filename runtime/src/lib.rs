//! The runtime: the only crate that touches the CUDA driver (cudarc, loaded
//! dynamically), the Llama generation runtime built on the kernel library,
//! and the `tessera` CLI and HTTP server.
//!
//! - [`cuda`]: the GPU ([`cuda::Gpu`], device buffers, timing, graphs),
//!   launch validation as pure functions, and the [`cuda::Cuda`] backend
//!   that runs `#[kernel]`s through `codegen`'s PTX.
//! - [`gguf`]: GGUF model files (validating mmap reader, writer, Llama
//!   hyperparameters and tensor names, a tiny random-weight model for tests).
//! - [`tokenizer`]: byte-level BPE from the GGUF vocabulary (llama.cpp's
//!   pre-tokenizers) and the streaming UTF-8-safe detokenizer.
//! - [`chat`]: the model's Jinja chat template (minijinja).
//! - [`grammar`]: structured output (JSON schemas, regexes, Lark grammars
//!   through `llguidance`): per-request constraints and their token masks.
//! - [`kv`], [`scheduler`], [`memory_plan`]: the paged KV cache's block
//!   manager (refcounts, prefix caching, copy-on-write), the continuous-batching
//!   scheduler (token budget, chunked prefill, preemption by recompute) and the
//!   start-up memory plan; pure host code.
//! - [`model`]: the Llama forward pass made of library kernels, generic over
//!   the device (GPU, native CPU backend, interpreter), on-device sampling,
//!   CUDA graphs and the persistent decode kernel's launch.
//! - [`engine`], [`spec`]: the continuous-batching step loop over model and
//!   scheduler, and speculative decoding inside it.
//! - [`app`]: start-up shared by the model commands (device and dtype
//!   choice, memory plan, weights, engine); [`generate`], [`parity`],
//!   [`profile`], [`server`]: the commands that run an engine.
//! - [`registry`]: the kernels the CLI knows by name.
//! - [`check`]: device against CPU-interpreter comparison (`tessera
//!   gpu-check`; [`check::host`]: `tessera host-check` on the native CPU
//!   backend).
//! - [`mod@bench`]: throughput measurement (`tessera bench`).
//! - [`cli`]: the command line.
//!
//! Invariants: no panic or abort on a machine without a driver or GPU (those
//! are [`Error::NoDriver`] / [`Error::NoDevice`]); every launch is validated
//! against the kernel's IR before it reaches the driver.

pub mod app;
pub mod bench;
pub mod chat;
pub mod check;
pub mod cli;
pub mod cuda;
pub mod engine;
pub mod error;
pub mod generate;
pub mod gguf;
pub mod grammar;
pub mod kv;
pub mod memory_plan;
pub mod model;
pub mod parity;
pub mod profile;
pub mod registry;
pub mod rng;
pub mod scheduler;
pub mod server;
pub mod spec;
pub mod tokenizer;

pub use error::{Error, Result};
