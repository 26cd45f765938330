//! The CUDA side of the runtime, the only code in tessera that touches the
//! driver: [`Gpu`] and CUDA graphs ([`device`]; all work on one stream of
//! the `Gpu`'s own), device buffers and pointers ([`buffer`]), launch validation as pure functions
//! ([`validate`]), the [`Cuda`] backend ([`backend`]; a cheap launch path
//! keyed by kernel, config and specialization mask) and its autotuning cache
//! ([`autotune`]).
//!
//! The driver is loaded dynamically (cudarc's `dynamic-loading`), so binaries
//! build and run on machines without CUDA: [`Gpu::new`] then returns
//! [`crate::Error::NoDriver`] or [`crate::Error::NoDevice`] instead of panicking.

pub mod autotune;
pub mod backend;
pub mod buffer;
pub mod device;
pub mod tma;
pub mod validate;

pub use backend::{CompileProgress, Cuda, MAX_PARAMS, Prepared, facts_of_args, mask_of_args, target_for};
pub use buffer::{DevBuf, DevPtr, DeviceElem};
pub use device::{DeviceInfo, Gpu, GpuGraph, LoadedKernel, driver_present};
pub use validate::{
    GridLimits, KernelParam, OffsetRule, RawDevPtr, validate_args, validate_args_into, validate_grid,
};
