//! The CUDA side of the runtime, the only code in tessera that touches the
//! driver: [`Gpu`] and device buffers ([`device`]), launch validation as pure
//! functions ([`validate`]), the [`Cuda`] backend ([`backend`]) and its
//! autotuning cache ([`autotune`]).
//!
//! The driver is loaded dynamically (cudarc's `dynamic-loading`), so binaries
//! build and run on machines without CUDA: [`Gpu::new`] then returns
//! [`crate::Error::NoDriver`] or [`crate::Error::NoDevice`] instead of panicking.

pub mod autotune;
pub mod backend;
pub mod device;
pub mod validate;

pub use backend::{Cuda, Prepared, target_for};
pub use device::{DevBuf, DevPtr, DeviceElem, DeviceInfo, Gpu, LoadedKernel, driver_present};
pub use validate::{GridLimits, KernelParam, OffsetRule, RawDevPtr, validate_args, validate_grid};
