//! The activation element types: what `T` is in [`super::Model`], its
//! buffers and the kernels it launches (f32, bf16, f16). The GPU checks and
//! benchmarks draw their random inputs in the same types.

use crate::cuda::DeviceElem;
use dsl_core::half::{bf16, f16};

/// A float element type of activations and KV caches.
pub trait ActElem: DeviceElem {
    /// The nearest value of this type.
    fn from_f64(v: f64) -> Self;
}

impl ActElem for f32 {
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}

impl ActElem for bf16 {
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
}

impl ActElem for f16 {
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
}
