//! The Llama forward pass made only of library kernels, on the GPU or the CPU
//! interpreter behind one trait.
//!
//! - [`device`]: [`Device`], the backend abstraction (buffers, pointers,
//!   launches) implemented for [`dsl_core::interp::Cpu`] (the
//!   interpreter), [`codegen::host::Host`] (native CPU code) and
//!   [`crate::cuda::Cuda`].
//! - [`weights`]: [`Weights`], a GGUF Llama repacked for the kernels (fused
//!   QKV, interleaved gate/up, tied Q8_0 head).
//! - [`forward`]: [`Model`] (weights, paged KV cache, scratch) and
//!   [`Step`], one varlen batch step: embedding, per layer (add+)RMSNorm, QKV
//!   product, RoPE + paged KV write, attention (prefill or decode kernel, with
//!   split-KV), O product, add+RMSNorm, fused gate/up SiLU product, down
//!   product; final norm and LM head for the requested rows.
//! - [`buffers`]: the device buffers of a launch sequence and the KV cache.
//! - [`args`]: the launch arguments of kernel families that share fields,
//!   built the same way by the model, the checks and the benches.
//! - [`inputs`]: a step's inputs packed into one device byte arena (one copy
//!   per step), decode buckets and padding.
//! - [`sampler`]: [`Model::forward_sample`], sampling on the device inside the
//!   step ([`SamplingParams`], [`SampleRow`], [`Sampled`]).
//! - [`graph`]: CUDA graphs of decode steps, one per batch-size bucket (and
//!   split plan), captured lazily ([`GraphMode`]).
//! - [`check`]: the GPU checks (`tessera gpu-check --only model`): the whole
//!   forward, sampling and graph replay on a tiny model.
//! - [`default_device`]: the GPU when one is usable, otherwise the native
//!   CPU backend, with a notice saying which and why.
//!
//! Invariants: the same generic code runs on both devices (no
//! device-specific branches in the forward); every step is validated on the
//! host before any launch.

pub mod args;
pub mod attention;
pub mod buffers;
pub mod device;
mod elem;
#[cfg(test)]
pub(crate) mod emu;
pub mod forward;
pub mod graph;
pub mod inputs;
pub mod layers;
pub mod mega;
pub mod products;
pub mod sampler;
pub mod weights;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_kv8;
#[cfg(test)]
mod tests_sampling;

pub use buffers::KvCacheDtype;
pub use device::Device;
pub use elem::ActElem;
pub use forward::{Cost, LaunchTime, Model, Step, by_kernel};
pub use graph::{GraphKey, GraphMode};
pub use sampler::{HostTimes, SampleRow, Sampled, SamplingParams, sample_logits};
pub use weights::{Layer, Matrix, Weights};

use crate::cuda::Cuda;
use codegen::host::Host;

/// The device the runtime picked.
pub enum AnyDevice {
    /// The first GPU.
    Cuda(Box<Cuda>),
    /// The native CPU backend (no usable GPU).
    Host(Box<Host>),
}

/// The first GPU when one is usable, otherwise the native CPU backend; the
/// string says which was chosen and, for the CPU, why.
pub fn default_device() -> (AnyDevice, String) {
    match Cuda::open(0) {
        Ok(cuda) => {
            let notice = format!("running on {}", cuda.describe());
            (AnyDevice::Cuda(Box::new(cuda)), notice)
        }
        Err(e) => {
            let host = Host::new();
            let notice = format!("no usable GPU ({e}); running on the {}", host.describe());
            (AnyDevice::Host(Box::new(host)), notice)
        }
    }
}
