//! Device memory: [`DevBuf`], a typed allocation on a [`super::Gpu`]'s
//! stream, and [`DevPtr`], a typed, bounded view of it for kernel
//! arguments; [`DeviceElem`] names the element types they hold.
//!
//! Invariants: a [`DevBuf`] owns its allocation and frees it on drop, after
//! waiting for the stream (queued work may still use it); its copies and
//! fills run on that stream; [`DevPtr`]s borrow the buffer, so no pointer
//! outlives its memory, and carry the bytes left in the allocation and the
//! dtype it holds, so the launcher checks both.

use super::validate::RawDevPtr;
use crate::error::{Error, Result};
use cudarc::driver::sys;
use cudarc::driver::{CudaStream, result};
use dsl_core::DType;
use dsl_core::interp::Element;
use dsl_core::launch::PtrElem;
use std::marker::PhantomData;
use std::sync::Arc;

/// Element types a [`DevBuf`] can hold: the numeric dtypes (not `bool`, whose
/// device bytes could be other than 0 or 1).
pub trait DeviceElem: Element + PtrElem + Send + Sync {
    /// The dtype (the same as `Element::DTYPE`, named apart to avoid ambiguity
    /// with `PtrElem::DTYPE`).
    const DEVICE_DTYPE: DType = <Self as Element>::DTYPE;
}

macro_rules! device_elem {
    ($($t:ty),*) => {$(impl DeviceElem for $t {})*};
}
device_elem!(
    i8,
    u8,
    i16,
    i32,
    u32,
    i64,
    half::f16,
    half::bf16,
    f32,
    f64,
    dsl_core::float8::F8E4M3,
    dsl_core::float8::F8E5M2
);

/// A typed device allocation of `len` elements, freed on drop.
pub struct DevBuf<T: DeviceElem> {
    ptr: sys::CUdeviceptr,
    len: usize,
    /// The stream all of the buffer's copies and fills run on (the
    /// [`Gpu`]'s), which also keeps the context alive.
    stream: Arc<CudaStream>,
    _t: PhantomData<T>,
}

impl<T: DeviceElem> std::fmt::Debug for DevBuf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevBuf({} x {} at {:#x})", self.len, T::DEVICE_DTYPE, self.ptr)
    }
}

impl<T: DeviceElem> Drop for DevBuf<T> {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        let _ = self.stream.context().bind_to_thread();
        // Queued launches may still read or write the buffer.
        let _ = self.stream.synchronize();
        // SAFETY: `ptr` was allocated by `malloc_sync` in this context and is
        // freed only here; no `DevPtr` borrows the buffer any more and the
        // stream's work has finished. A failure (a context poisoned by a
        // faulting kernel) cannot be reported from `drop` and leaks the
        // allocation.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

impl<T: DeviceElem> DevBuf<T> {
    /// Takes ownership of the allocation `ptr` of `len` elements (0 when
    /// empty) made in `stream`'s context: it is freed on drop.
    pub(super) fn owning(ptr: sys::CUdeviceptr, len: usize, stream: Arc<CudaStream>) -> DevBuf<T> {
        DevBuf { ptr, len, stream, _t: PhantomData }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> usize {
        self.len * size_of::<T>()
    }

    /// The device address of the first element (0 when empty).
    pub fn device_addr(&self) -> u64 {
        self.ptr
    }

    /// A typed pointer to the first element, for kernel arguments.
    pub fn ptr(&self) -> DevPtr<'_, T> {
        DevPtr {
            addr: self.ptr,
            bytes: self.size_bytes() as u64,
            dtype: Some(T::DEVICE_DTYPE),
            _t: PhantomData,
        }
    }

    fn bind(&self) -> Result<()> {
        self.stream.context().bind_to_thread().map_err(Error::driver("bind the CUDA context"))
    }

    /// Overwrites the buffer with `data`, which must have exactly `len` elements.
    pub fn write(&mut self, data: &[T]) -> Result<()> {
        if data.len() != self.len {
            return Err(Error::Usage(format!(
                "cannot write {} elements into a device buffer of {}",
                data.len(),
                self.len
            )));
        }
        self.write_at(0, data)
    }

    /// Copies `data` into elements `offset..offset + data.len()`, ordered on
    /// the stream after earlier work and before later launches. Returns once
    /// the driver has staged `data` (pageable memory), possibly before the
    /// copy reaches the device, so `data` may be reused at once. Not allowed
    /// during a graph capture.
    pub fn write_at(&self, offset: usize, data: &[T]) -> Result<()> {
        offset.checked_add(data.len()).filter(|&e| e <= self.len).ok_or_else(|| {
            Error::Usage(format!(
                "cannot write {} elements at offset {offset} into a device buffer of {}",
                data.len(),
                self.len
            ))
        })?;
        if data.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let dst = self.ptr + (offset * size_of::<T>()) as u64;
        // SAFETY: the destination range lies inside this allocation (checked
        // above) and stays allocated until the copy is done (`Drop` waits for
        // the stream). `data` is ordinary pageable host memory (this crate
        // never registers or pins host memory): for such a source the driver
        // copies it to a staging buffer before `cuMemcpyHtoDAsync` returns,
        // so it may be dropped or changed afterwards. The stream is this
        // buffer's (the `Gpu`'s), so the copy is ordered with the launches.
        unsafe { result::memcpy_htod_async(dst, data, self.stream.cu_stream()) }
            .map_err(Error::driver(format!("copy {} bytes to the device", size_of_val(data))))
    }

    /// Sets every byte of the buffer to `value` and waits until it is done.
    pub fn fill_bytes(&self, value: u8) -> Result<()> {
        self.fill_bytes_async(value)?;
        self.stream.synchronize().map_err(Error::driver("synchronize the stream"))
    }

    /// Sets every byte of the buffer to `value`, ordered on the stream (where
    /// every launch runs) and asynchronous to the host: the GPU stays busy
    /// while the host prepares the next launch. Benchmarks flush L2 with it so
    /// the host's launch preparation is not inside a timed range.
    pub fn fill_bytes_async(&self, value: u8) -> Result<()> {
        self.fill_range_async(0, self.len, value)
    }

    /// Sets every byte of elements `offset..offset + len` to `value`, ordered
    /// on the stream and asynchronous to the host.
    pub fn fill_range_async(&self, offset: usize, len: usize, value: u8) -> Result<()> {
        if offset.checked_add(len).is_none_or(|e| e > self.len) {
            return Err(Error::Usage(format!(
                "cannot fill {len} elements at offset {offset} of a device buffer of {}",
                self.len
            )));
        }
        if len == 0 {
            return Ok(());
        }
        self.bind()?;
        let dst = self.ptr + (offset * size_of::<T>()) as u64;
        // SAFETY: the range lies inside this allocation (checked above); it
        // outlives the queued memset because `Drop` waits for the stream
        // before freeing.
        unsafe { result::memset_d8_async(dst, value, len * size_of::<T>(), self.stream.cu_stream()) }
            .map_err(Error::driver("fill a device buffer"))
    }

    /// Copies the buffer to the host (after all earlier work on the stream).
    pub fn download(&self) -> Result<Vec<T>> {
        self.download_prefix(self.len)
    }

    /// Copies the first `n` elements to the host (after all earlier work on
    /// the stream; waits for the copy).
    pub fn download_prefix(&self, n: usize) -> Result<Vec<T>> {
        if n > self.len {
            return Err(Error::Usage(format!("cannot read {n} elements of a device buffer of {}", self.len)));
        }
        if n == 0 {
            return Ok(Vec::new());
        }
        self.bind()?;
        // Through bytes: valid for every element type, whatever the device holds.
        let mut bytes = vec![0u8; n * size_of::<T>()];
        // SAFETY: `bytes` has exactly the size of the first `n` elements,
        // which lie inside the allocation; the stream is synchronized below
        // before `bytes` is read (a copy to pageable memory also returns only
        // when it is done).
        unsafe { result::memcpy_dtoh_async(&mut bytes, self.ptr, self.stream.cu_stream()) }
            .map_err(Error::driver(format!("copy {} bytes from the device", bytes.len())))?;
        self.stream.synchronize().map_err(Error::driver("synchronize the stream"))?;
        let size = T::DEVICE_DTYPE.size_bytes();
        Ok(bytes.chunks_exact(size).map(T::read_le).collect())
    }
}

/// A typed view of device memory for kernel arguments: an address, the bytes
/// left in its allocation and the dtype it holds, borrowing the buffer.
pub struct DevPtr<'a, T> {
    addr: u64,
    bytes: u64,
    dtype: Option<DType>,
    _t: PhantomData<fn() -> &'a T>,
}

impl<T> Clone for DevPtr<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for DevPtr<'_, T> {}

impl<T> std::fmt::Debug for DevPtr<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevPtr({:#x}, {} bytes", self.addr, self.bytes)?;
        match self.dtype {
            Some(d) => write!(f, ", {d})"),
            None => write!(f, ")"),
        }
    }
}

impl<'a, T: PtrElem> DevPtr<'a, T> {
    /// The pointer `n` elements (of the dtype it holds) further, or `None` past
    /// the end of the allocation.
    pub fn offset(self, n: usize) -> Option<DevPtr<'a, T>> {
        let size = self.dtype.map_or(1, |d| d.size_bytes()) as u64;
        let skip = (n as u64).checked_mul(size)?;
        let bytes = self.bytes.checked_sub(skip)?;
        Some(DevPtr { addr: self.addr + skip, bytes, dtype: self.dtype, _t: PhantomData })
    }

    /// The same address viewed as another element type. Casting to
    /// [`dsl_core::launch::AnyDType`] (for kernels with dtype generics) keeps the
    /// dtype the memory holds, so the launcher still checks it.
    pub fn cast<U: PtrElem>(self) -> DevPtr<'a, U> {
        DevPtr { addr: self.addr, bytes: self.bytes, dtype: U::DTYPE.or(self.dtype), _t: PhantomData }
    }

    /// The device address.
    pub fn addr(self) -> u64 {
        self.addr
    }

    /// The erased form the launcher validates.
    pub fn raw(self) -> RawDevPtr {
        RawDevPtr { addr: self.addr, bytes: self.bytes, dtype: self.dtype }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_ptr_views_keep_bounds_and_dtype() {
        let p: DevPtr<'_, f32> = DevPtr { addr: 0x1000, bytes: 64, dtype: Some(DType::F32), _t: PhantomData };
        let q = p.offset(4).unwrap();
        assert_eq!((q.addr(), q.raw().bytes), (0x1010, 48));
        assert!(p.offset(17).is_none());
        assert_eq!(p.offset(16).unwrap().raw().bytes, 0);
        let any = p.cast::<dsl_core::launch::AnyDType>();
        assert_eq!(any.raw().dtype, Some(DType::F32));
        assert_eq!(p.cast::<u8>().raw().dtype, Some(DType::U8));
    }
}
