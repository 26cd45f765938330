//! [`Device`]: what the forward pass needs from a backend (buffers, pointers
//! into them, kernel launches), implemented for the CPU interpreter
//! ([`dsl_core::interp::Cpu`]) and the GPU ([`crate::cuda::Cuda`]), so that one
//! generic forward runs on both.
//!
//! Invariants: a buffer handle is only meaningful on the device that created
//! it; pointers are formed from a buffer and an element offset inside it
//! (checked on the GPU, where [`crate::cuda::DevPtr::offset`] bounds it);
//! every launch goes through the backend's validating launcher.

use crate::cuda::{Cuda, DevBuf, DeviceElem};
use crate::error::{Error, Result};
use dsl_core::interp::{Cpu, CpuPtr};
use dsl_core::launch::{Backend, Kernel, PtrElem};

/// A backend the model runs on: owns or hands out buffers, forms typed kernel
/// pointers into them and launches `#[kernel]`s.
pub trait Device: Backend + Sized {
    /// A typed buffer of `T` elements.
    type Buf<T: DeviceElem>;

    /// A one-line description of the device (for logs and the CLI).
    fn describe(&self) -> String;

    /// A new buffer holding a copy of `data`.
    fn upload<T: DeviceElem>(&mut self, data: &[T]) -> Result<Self::Buf<T>>;

    /// A new zero-filled buffer of `len` elements.
    fn zeros<T: DeviceElem>(&mut self, len: usize) -> Result<Self::Buf<T>>;

    /// The whole contents of `buf`.
    fn download<T: DeviceElem>(&self, buf: &Self::Buf<T>) -> Result<Vec<T>>;

    /// A pointer to element `offset` (in `T` elements) of `buf`, viewed as
    /// pointing to `U` (as `ptrcast` does; `U` is usually `T` or
    /// [`dsl_core::launch::AnyDType`] for a kernel's dtype generic).
    fn ptr_at<'a, T: DeviceElem, U: PtrElem>(
        buf: &'a Self::Buf<T>,
        offset: usize,
    ) -> Result<Self::Ptr<'a, U>>
    where
        Self: 'a;

    /// Launches `K` with `config` over `grid`.
    fn run<'a, K: Kernel>(
        &mut self,
        grid: [u32; 3],
        config: &K::Config,
        args: &K::Args<'a, Self>,
    ) -> Result<()>
    where
        Self: 'a;
}

impl Device for Cpu {
    type Buf<T: DeviceElem> = CpuPtr<T>;

    fn describe(&self) -> String {
        "CPU interpreter".to_string()
    }

    fn upload<T: DeviceElem>(&mut self, data: &[T]) -> Result<CpuPtr<T>> {
        Ok(Cpu::upload(self, data))
    }

    fn zeros<T: DeviceElem>(&mut self, len: usize) -> Result<CpuPtr<T>> {
        Ok(Cpu::zeros(self, len))
    }

    fn download<T: DeviceElem>(&self, buf: &CpuPtr<T>) -> Result<Vec<T>> {
        Ok(self.read(*buf))
    }

    fn ptr_at<'a, T: DeviceElem, U: PtrElem>(buf: &'a CpuPtr<T>, offset: usize) -> Result<CpuPtr<U>>
    where
        Self: 'a,
    {
        Ok(buf.offset(offset).cast())
    }

    fn run<'a, K: Kernel>(
        &mut self,
        grid: [u32; 3],
        config: &K::Config,
        args: &K::Args<'a, Self>,
    ) -> Result<()>
    where
        Self: 'a,
    {
        Ok(<Cpu as Backend>::launch::<K>(self, grid, config, args)?)
    }
}

impl Device for Cuda {
    type Buf<T: DeviceElem> = DevBuf<T>;

    fn describe(&self) -> String {
        format!("GPU {} ({:?})", self.gpu().info().name, self.target())
    }

    fn upload<T: DeviceElem>(&mut self, data: &[T]) -> Result<DevBuf<T>> {
        self.gpu().upload(data)
    }

    fn zeros<T: DeviceElem>(&mut self, len: usize) -> Result<DevBuf<T>> {
        self.gpu().zeros(len)
    }

    fn download<T: DeviceElem>(&self, buf: &DevBuf<T>) -> Result<Vec<T>> {
        buf.download()
    }

    fn ptr_at<'a, T: DeviceElem, U: PtrElem>(
        buf: &'a DevBuf<T>,
        offset: usize,
    ) -> Result<crate::cuda::DevPtr<'a, U>>
    where
        Self: 'a,
    {
        let p = buf.ptr().offset(offset).ok_or_else(|| {
            Error::Usage(format!("offset {offset} is outside a device buffer of {} elements", buf.len()))
        })?;
        Ok(p.cast())
    }

    fn run<'a, K: Kernel>(
        &mut self,
        grid: [u32; 3],
        config: &K::Config,
        args: &K::Args<'a, Self>,
    ) -> Result<()>
    where
        Self: 'a,
    {
        Cuda::run::<K>(self, grid, config, args)
    }
}
