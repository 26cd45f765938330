//! The activation element types: what `T` is in [`super::Model`], its
//! buffers and the kernels it launches (f32, bf16, f16). The GPU checks and
//! benchmarks draw their random inputs in the same types.

use crate::cuda::DeviceElem;
use dsl_core::half::{bf16, f16};
use dsl_core::interp::FloatElement;

/// A float element type of activations and KV caches; its `from_f64` (from
/// [`FloatElement`]) gives the nearest value of this type.
pub trait ActElem: DeviceElem + FloatElement {}

impl ActElem for f32 {}

impl ActElem for bf16 {}

impl ActElem for f16 {}
