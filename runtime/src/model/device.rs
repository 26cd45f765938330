//! [`Device`]: what the forward pass needs from a backend (buffers, pointers
//! into them, stream-ordered copies, kernel launches and, where the backend
//! has them, graphs of launches), implemented for the CPU interpreter
//! ([`dsl_core::interp::Cpu`]) and the GPU ([`crate::cuda::Cuda`]), so that
//! one generic forward runs on both.
//!
//! Invariants: a buffer handle is only meaningful on the device that created
//! it and always names a whole buffer (as [`Device::upload`] and
//! [`Device::zeros`] return it); pointers are formed from a buffer and an
//! element offset inside it (checked on the GPU, where
//! [`crate::cuda::DevPtr::offset`] bounds it); every launch goes through the
//! backend's validating launcher; writes, fills and reads are ordered with
//! the launches around them (on the GPU: one stream); while a graph is being
//! captured only launches may be issued (the callers allocate, copy and read
//! before or after).

use crate::cuda::{Cuda, DevBuf, DeviceElem, GpuGraph};
use crate::error::{Error, Result};
use dsl_core::interp::{Buffer, Cpu, CpuPtr, Element};
use dsl_core::launch::{Backend, Kernel, PtrElem};

/// A backend the model runs on: owns or hands out buffers, forms typed kernel
/// pointers into them and launches `#[kernel]`s.
pub trait Device: Backend + Sized {
    /// A typed buffer of `T` elements.
    type Buf<T: DeviceElem>;
    /// A captured sequence of launches that can be replayed (a CUDA graph).
    type Graph;

    /// A one-line description of the device (for logs and the CLI).
    fn describe(&self) -> String;

    /// The device's parallelism in the sense of the decode split plan
    /// ([`kernels::decode_attention::split_plan`]): multiprocessors on a GPU,
    /// 1 on the interpreter.
    fn sm_count(&self) -> usize;

    /// Whether tensor-core products run on Hopper's `wgmma` (sm_90a), which
    /// prefers other tiles (`kernels::flash_attention::config_for`).
    fn wgmma(&self) -> bool;

    /// Whether `dot` runs on tensor cores (a GPU), whose products the
    /// batch-invariant linear layer feeds f16 operands and any tiles
    /// (`kernels::dequant::linear_tiles`); the interpreter keeps f32
    /// operands and a fixed K tile.
    fn tensor_cores(&self) -> bool;

    /// A new buffer holding a copy of `data`.
    fn upload<T: DeviceElem>(&mut self, data: &[T]) -> Result<Self::Buf<T>>;

    /// A new zero-filled buffer of `len` elements.
    fn zeros<T: DeviceElem>(&mut self, len: usize) -> Result<Self::Buf<T>>;

    /// The whole contents of `buf`.
    fn download<T: DeviceElem>(&self, buf: &Self::Buf<T>) -> Result<Vec<T>>;

    /// The first `n` elements of `buf` (after all earlier launches).
    fn download_prefix<T: DeviceElem>(&self, buf: &Self::Buf<T>, n: usize) -> Result<Vec<T>>;

    /// Copies `data` into the first `data.len()` elements of `buf`, after all
    /// earlier launches and before all later ones. May return before the copy
    /// has reached the device; `data` may be reused at once.
    fn write<T: DeviceElem>(&mut self, buf: &Self::Buf<T>, data: &[T]) -> Result<()>;

    /// Sets elements `offset..offset + len` of `buf` to zero, ordered like
    /// [`Device::write`].
    fn fill_zero<T: DeviceElem>(&mut self, buf: &Self::Buf<T>, offset: usize, len: usize) -> Result<()>;

    /// A pointer to element `offset` (in `T` elements) of `buf`, viewed as
    /// pointing to `U` (as `ptrcast` does; `U` is usually `T` or
    /// [`dsl_core::launch::AnyDType`] for a kernel's dtype generic; a `u8`
    /// buffer may be viewed as any element type, its offset counting bytes).
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

    /// Whether [`Device::begin_capture`] works on this device.
    fn supports_graphs(&self) -> bool;

    /// Starts recording launches into a graph instead of running them.
    /// Errors on devices without graphs.
    fn begin_capture(&mut self) -> Result<()>;

    /// Ends the recording begun by [`Device::begin_capture`] (call it also
    /// when something failed in between) and returns the graph.
    fn end_capture(&mut self) -> Result<Self::Graph>;

    /// Replays `graph`: its launches run again, with the arguments they were
    /// recorded with, on the buffers' current contents.
    fn replay(&mut self, graph: &Self::Graph) -> Result<()>;
}

/// The interpreter cannot capture graphs.
fn no_graphs() -> Error {
    Error::Unsupported("the CPU interpreter cannot capture graphs".into())
}

/// Writes `data` as little-endian bytes over the start of `bytes`, or says
/// why it does not fit.
pub(crate) fn write_elements<T: DeviceElem>(bytes: &mut [u8], data: &[T]) -> Result<()> {
    let size = <T as Element>::DTYPE.size_bytes();
    let need = data.len() * size;
    if need > bytes.len() {
        return Err(Error::Usage(format!(
            "cannot write {} elements of {} into a buffer of {} bytes",
            data.len(),
            <T as Element>::DTYPE,
            bytes.len()
        )));
    }
    for (v, out) in data.iter().zip(bytes.chunks_exact_mut(size)) {
        v.write_le(out);
    }
    Ok(())
}

/// The byte range of elements `offset..offset + len` of `T` in a buffer of
/// `total` bytes, or an error.
pub(crate) fn element_range<T: DeviceElem>(
    offset: usize,
    len: usize,
    total: usize,
) -> Result<std::ops::Range<usize>> {
    let size = <T as Element>::DTYPE.size_bytes();
    let range = offset
        .checked_add(len)
        .and_then(|end| Some(offset.checked_mul(size)?..end.checked_mul(size)?))
        .filter(|r| r.end <= total);
    range.ok_or_else(|| {
        Error::Usage(format!("elements {offset}..{offset}+{len} are outside a buffer of {total} bytes"))
    })
}

impl Device for Cpu {
    type Buf<T: DeviceElem> = CpuPtr<T>;
    type Graph = std::convert::Infallible;

    fn describe(&self) -> String {
        "CPU interpreter".to_string()
    }

    fn sm_count(&self) -> usize {
        1
    }

    fn wgmma(&self) -> bool {
        false
    }

    fn tensor_cores(&self) -> bool {
        false
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

    fn download_prefix<T: DeviceElem>(&self, buf: &CpuPtr<T>, n: usize) -> Result<Vec<T>> {
        let b: &Buffer = self.buffer(*buf);
        let range = element_range::<T>(0, n, b.size_bytes())?;
        let size = <T as Element>::DTYPE.size_bytes();
        Ok(b.as_bytes()[range].chunks_exact(size).map(T::read_le).collect())
    }

    fn write<T: DeviceElem>(&mut self, buf: &CpuPtr<T>, data: &[T]) -> Result<()> {
        write_elements(self.buffer_mut(*buf).as_bytes_mut(), data)
    }

    fn fill_zero<T: DeviceElem>(&mut self, buf: &CpuPtr<T>, offset: usize, len: usize) -> Result<()> {
        let bytes = self.buffer_mut(*buf).as_bytes_mut();
        let range = element_range::<T>(offset, len, bytes.len())?;
        bytes[range].fill(0);
        Ok(())
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

    fn supports_graphs(&self) -> bool {
        false
    }

    fn begin_capture(&mut self) -> Result<()> {
        Err(no_graphs())
    }

    fn end_capture(&mut self) -> Result<Self::Graph> {
        Err(no_graphs())
    }

    fn replay(&mut self, graph: &Self::Graph) -> Result<()> {
        match *graph {}
    }
}

impl Device for Cuda {
    type Buf<T: DeviceElem> = DevBuf<T>;
    type Graph = GpuGraph;

    fn describe(&self) -> String {
        format!("GPU {} ({:?})", self.gpu().info().name, self.target())
    }

    fn sm_count(&self) -> usize {
        self.gpu().info().sm_count as usize
    }

    fn wgmma(&self) -> bool {
        Cuda::wgmma(self)
    }

    fn tensor_cores(&self) -> bool {
        true
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

    fn download_prefix<T: DeviceElem>(&self, buf: &DevBuf<T>, n: usize) -> Result<Vec<T>> {
        buf.download_prefix(n)
    }

    fn write<T: DeviceElem>(&mut self, buf: &DevBuf<T>, data: &[T]) -> Result<()> {
        buf.write_at(0, data)
    }

    fn fill_zero<T: DeviceElem>(&mut self, buf: &DevBuf<T>, offset: usize, len: usize) -> Result<()> {
        buf.fill_range_async(offset, len, 0)
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

    fn supports_graphs(&self) -> bool {
        true
    }

    fn begin_capture(&mut self) -> Result<()> {
        self.gpu().begin_capture()
    }

    fn end_capture(&mut self) -> Result<GpuGraph> {
        self.gpu().end_capture()
    }

    fn replay(&mut self, graph: &GpuGraph) -> Result<()> {
        self.gpu().replay(graph)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpreter_writes_fills_and_reads_prefixes() {
        let mut cpu = Cpu::new();
        let b = Device::zeros::<i32>(&mut cpu, 6).unwrap();
        Device::write(&mut cpu, &b, &[1, 2, 3, 4]).unwrap();
        Device::fill_zero(&mut cpu, &b, 1, 2).unwrap();
        assert_eq!(Device::download(&cpu, &b).unwrap(), vec![1, 0, 0, 4, 0, 0]);
        assert_eq!(Device::download_prefix(&cpu, &b, 4).unwrap(), vec![1, 0, 0, 4]);
        assert!(Device::write(&mut cpu, &b, &[0; 7]).is_err());
        assert!(Device::fill_zero(&mut cpu, &b, 5, 2).is_err());
        assert!(Device::download_prefix(&cpu, &b, 7).is_err());
        assert!(Device::begin_capture(&mut cpu).is_err());
        assert!(!cpu.supports_graphs());
    }
}
