//! The Llama forward pass made only of library kernels, on the GPU or the CPU
//! interpreter behind one trait.
//!
//! - [`device`]: [`Device`], the backend abstraction (buffers, pointers,
//!   launches) implemented for [`dsl_core::interp::Cpu`] and
//!   [`crate::cuda::Cuda`].
//! - [`weights`]: [`Weights`], a GGUF Llama repacked for the kernels (fused
//!   QKV, interleaved gate/up, tied Q8_0 head).
//! - [`forward`]: [`Model`] (weights, paged KV cache, scratch) and
//!   [`Step`], one varlen batch step: embedding, per layer (add+)RMSNorm, QKV
//!   product, RoPE + paged KV write, attention (prefill or decode kernel), O
//!   product, add+RMSNorm, fused gate/up SiLU product, down product; final
//!   norm and LM head for the requested rows.
//! - [`check`]: the GPU check of the whole forward on a tiny model.
//! - [`default_device`]: the GPU when one is usable, otherwise the CPU
//!   interpreter, with a notice saying which and why.
//!
//! Invariants: the same generic code runs on both devices (no
//! device-specific branches in the forward); every step is validated on the
//! host before any launch.

pub mod check;
pub mod device;
pub mod forward;
pub mod weights;

#[cfg(test)]
mod tests;

pub use device::Device;
pub use forward::{Model, Profile, Step};
pub use weights::{Layer, Matrix, Weights};

use crate::cuda::Cuda;
use dsl_core::interp::Cpu;

/// The device the runtime picked.
pub enum AnyDevice {
    /// The first GPU.
    Cuda(Box<Cuda>),
    /// The CPU interpreter (no usable GPU).
    Cpu(Box<Cpu>),
}

/// The first GPU when one is usable, otherwise the CPU interpreter; the
/// string says which was chosen and, for the CPU, why (to be shown to the
/// user: the interpreter is orders of magnitude slower).
pub fn default_device() -> (AnyDevice, String) {
    match Cuda::open(0) {
        Ok(cuda) => {
            let notice = format!("running on {}", cuda.describe());
            (AnyDevice::Cuda(Box::new(cuda)), notice)
        }
        Err(e) => {
            let notice = format!("no usable GPU ({e}); running on the CPU interpreter (slow)");
            (AnyDevice::Cpu(Box::new(Cpu::new())), notice)
        }
    }
}
