//! [`Device`]: what the forward pass needs from a backend (buffers, pointers
//! into them, stream-ordered copies, kernel launches and, where the backend
//! has them, graphs of launches), implemented for the CPU interpreter
//! ([`dsl_core::interp::Cpu`]), the native CPU backend
//! ([`codegen::host::Host`]) and the GPU ([`crate::cuda::Cuda`]), so that
//! one generic forward runs on all three.
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
use codegen::host::{Host, HostPtr};
use cudarc::driver::CudaEvent;
use dsl_core::interp::{Cpu, CpuPtr, Element};
use dsl_core::launch::{Backend, ErasedLaunch, Kernel, PtrElem};
use kernels::dequant::{GemmTiles, GemvTiles, QuantFormat};
use std::time::Instant;

/// A backend the model runs on: owns or hands out buffers, forms typed kernel
/// pointers into them and launches `#[kernel]`s.
pub trait Device: Backend + Sized {
    /// A typed buffer of `T` elements.
    type Buf<T: DeviceElem>;
    /// A captured sequence of launches that can be replayed (a CUDA graph).
    type Graph;
    /// A point in the device's order of work ([`Device::mark`]), for timing.
    type Mark;

    /// A one-line description of the device (for logs and the CLI).
    fn describe(&self) -> String;

    /// The device's parallelism in the sense of the decode split plan
    /// ([`kernels::decode_attention::split_plan`]): multiprocessors on a GPU,
    /// 1 on the CPU backends, whatever the core count: the split plan (a
    /// launch configuration) then never depends on the machine, so the
    /// native backend computes the same logits on every host, and the
    /// interpreter's (whose launches are the same).
    fn sm_count(&self) -> usize {
        1
    }

    /// Whether tensor-core products run on Hopper's `wgmma` (sm_90a), which
    /// prefers other tiles (`kernels::flash_attention::config_for`); false
    /// off the GPU.
    fn wgmma(&self) -> bool {
        false
    }

    /// The GEMV tiles of `m` activation rows times a weight of `rows` rows
    /// and `k` columns in `format`: [`kernels::dequant::gemv_tiles`]
    /// (tuned for GPUs) unless the device prefers others.
    fn gemv_tiles(&self, format: QuantFormat, m: usize, rows: usize, k: usize) -> GemvTiles {
        kernels::dequant::gemv_tiles(format, m, rows, k)
    }

    /// The GEMM tiles of the same product (prefill and larger batches):
    /// [`kernels::dequant::gemm_tiles`] unless the device prefers others.
    fn gemm_tiles(&self, format: QuantFormat, m: usize, rows: usize, k: usize, swap_ok: bool) -> GemmTiles {
        kernels::dequant::gemm_tiles(format, m, rows, k, swap_ok)
    }

    /// Whether the fused decode GEMVs run [`kernels::cpu_gemv`]'s kernels
    /// (shaped for CPUs, with this device's [`Device::gemv_tiles`]) instead
    /// of [`kernels::dequant::fused`]'s.
    fn cpu_gemv(&self) -> bool {
        false
    }

    /// Whether launches run compiled code (GPU, native CPU), so a warm-up
    /// compiles the kernels before the first request; false for the
    /// interpreter.
    fn compiles(&self) -> bool;

    /// Whether it runs persistent kernels whose programs wait for each other
    /// (`kernels::decode_step`) with the batch-invariant arithmetic: the
    /// interpreter and Hopper GPUs (whose invariant decode attention runs the
    /// persistent kernel's four warps); not the native CPU backend, which
    /// does not run waits.
    fn persistent(&self) -> bool {
        false
    }

    /// Whether `dot` runs on tensor cores (a GPU), whose products the
    /// batch-invariant linear layer feeds f16 operands and any tiles
    /// (`kernels::dequant::linear_tiles`); the interpreter keeps f32
    /// operands and a fixed K tile.
    fn tensor_cores(&self) -> bool {
        false
    }

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

    /// How many programs of `K` run at once (the largest grid whose
    /// programs may wait on each other): the occupancy on a GPU, the
    /// multiprocessor count where there is no such query.
    fn resident<'a, K: Kernel>(&mut self, _config: &K::Config, _args: &K::Args<'a, Self>) -> Result<usize>
    where
        Self: 'a,
    {
        Ok(self.sm_count())
    }

    /// Launches `K` with `config` over `grid` through [`Device::run_erased`].
    fn run<'a, K: Kernel>(
        &mut self,
        grid: [u32; 3],
        config: &K::Config,
        args: &K::Args<'a, Self>,
    ) -> Result<()>
    where
        Self: 'a,
    {
        self.run_erased::<K>(ErasedLaunch { config, grid, args: K::erase_args(args) })
    }

    /// Runs a launch of `K` whose arguments are erased: through the
    /// backend's [`Backend::launch_erased`] unless the device has a launcher
    /// of its own.
    fn run_erased<'a, K: Kernel>(&mut self, launch: ErasedLaunch<'_, K, Self::Raw<'a>>) -> Result<()>
    where
        Self: 'a,
    {
        Ok(self.launch_erased::<K>(launch)?)
    }

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

    /// A mark after the work enqueued so far: a recorded CUDA event on the
    /// GPU, the current instant on the CPU backends (whose launches finish
    /// before they return).
    fn mark(&mut self) -> Result<Self::Mark>;

    /// Milliseconds from `start` to `end`, waiting for `end`'s work.
    fn mark_ms(&self, start: &Self::Mark, end: &Self::Mark) -> Result<f64>;
}

/// The CPU backends cannot capture graphs.
fn no_graphs() -> Error {
    Error::Unsupported("the CPU backends cannot capture graphs".into())
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

/// The first `n` elements of `T` stored in `bytes`, or an error when the
/// buffer is shorter.
pub(crate) fn read_elements<T: DeviceElem>(bytes: &[u8], n: usize) -> Result<Vec<T>> {
    let range = element_range::<T>(0, n, bytes.len())?;
    let size = <T as Element>::DTYPE.size_bytes();
    Ok(bytes[range].chunks_exact(size).map(T::read_le).collect())
}

/// Zeroes elements `offset..offset + len` of `T` stored in `bytes`, or says
/// why they are outside it.
pub(crate) fn zero_elements<T: DeviceElem>(bytes: &mut [u8], offset: usize, len: usize) -> Result<()> {
    let range = element_range::<T>(offset, len, bytes.len())?;
    bytes[range].fill(0);
    Ok(())
}

/// The [`Device`] methods every backend whose buffers are
/// [`dsl_core::launch::BufferPtr`]s shares (the two CPU backends and the
/// graph-recording interpreter): pointers are buffer pointers moved by an
/// offset, marks are instants (launches finish before they return).
macro_rules! buffer_ptr_device {
    ($ptr:ident) => {
        fn ptr_at<'a, T: DeviceElem, U: PtrElem>(buf: &'a $ptr<T>, offset: usize) -> Result<$ptr<U>>
        where
            Self: 'a,
        {
            Ok(buf.offset(offset).cast())
        }

        fn mark(&mut self) -> Result<Instant> {
            Ok(Instant::now())
        }

        fn mark_ms(&self, start: &Instant, end: &Instant) -> Result<f64> {
            Ok(end.saturating_duration_since(*start).as_secs_f64() * 1e3)
        }
    };
}
// The test-only graph-recording interpreter (`super::emu`) uses it too.
#[cfg(test)]
pub(crate) use buffer_ptr_device;

/// The [`Device`] methods the two CPU backends ([`Cpu`], [`Host`]) share:
/// buffers in host memory (`$bytes` and `$bytes_mut` give the bytes of
/// buffer `$b` of backend `$s`), synchronous launches through their
/// [`Backend`], no graphs, and [`buffer_ptr_device`]'s pointers and marks.
macro_rules! host_memory_device {
    ($ptr:ident, |$s:ident, $b:ident| $bytes:expr, $bytes_mut:expr) => {
        fn upload<T: DeviceElem>(&mut self, data: &[T]) -> Result<$ptr<T>> {
            Ok(Self::upload(self, data))
        }

        fn zeros<T: DeviceElem>(&mut self, len: usize) -> Result<$ptr<T>> {
            Ok(Self::zeros(self, len))
        }

        fn download<T: DeviceElem>(&self, buf: &$ptr<T>) -> Result<Vec<T>> {
            Ok(self.read(*buf))
        }

        fn download_prefix<T: DeviceElem>(&self, buf: &$ptr<T>, n: usize) -> Result<Vec<T>> {
            let ($s, $b) = (self, *buf);
            read_elements($bytes, n)
        }

        fn write<T: DeviceElem>(&mut self, buf: &$ptr<T>, data: &[T]) -> Result<()> {
            let ($s, $b) = (self, *buf);
            write_elements($bytes_mut, data)
        }

        fn fill_zero<T: DeviceElem>(&mut self, buf: &$ptr<T>, offset: usize, len: usize) -> Result<()> {
            let ($s, $b) = (self, *buf);
            zero_elements::<T>($bytes_mut, offset, len)
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

        buffer_ptr_device!($ptr);
    };
}

impl Device for Cpu {
    type Buf<T: DeviceElem> = CpuPtr<T>;
    type Graph = std::convert::Infallible;
    type Mark = Instant;

    fn describe(&self) -> String {
        "CPU interpreter".to_string()
    }

    fn persistent(&self) -> bool {
        true
    }

    fn compiles(&self) -> bool {
        false
    }

    host_memory_device!(CpuPtr, |cpu, b| cpu.buffer(b).as_bytes(), cpu.buffer_mut(b).as_bytes_mut());
}

impl Device for Host {
    type Buf<T: DeviceElem> = HostPtr<T>;
    type Graph = std::convert::Infallible;
    type Mark = Instant;

    fn describe(&self) -> String {
        Host::describe(self)
    }

    fn compiles(&self) -> bool {
        true
    }

    /// The CPU GEMVs' tiles ([`kernels::cpu_gemv::cpu_gemv_tiles`]), which
    /// the unfused GEMVs take too.
    fn gemv_tiles(&self, format: QuantFormat, m: usize, rows: usize, k: usize) -> GemvTiles {
        kernels::cpu_gemv::cpu_gemv_tiles(format, m, rows, k)
    }

    /// Decode GEMVs run [`kernels::cpu_gemv`]: the fused GEMVs' loads of
    /// 32-bit words, per-element indices and software pipelining cost a
    /// CPU several times the arithmetic.
    fn cpu_gemv(&self) -> bool {
        true
    }

    /// Output tiles of up to 128 activation rows by 64 weight rows, K steps
    /// of 64 weights (Q8_0: 32), four pipeline-free warps: a host program
    /// dequantizes its weight tile once per K step for every activation row
    /// of its tile, so tall tiles amortize it (the GPU's 32 x 32 tiles spend
    /// as much time dequantizing and transposing as multiplying).
    fn gemm_tiles(&self, format: QuantFormat, m: usize, rows: usize, k: usize, _swap_ok: bool) -> GemmTiles {
        let _ = (rows, k);
        let block_m = m.next_power_of_two().clamp(16, 128);
        let block_k = if format == QuantFormat::Q8_0 { 32 } else { 64 };
        GemmTiles { block_m, block_n: 64, block_k, num_warps: 4, swap: false, num_stages: 1 }
    }

    host_memory_device!(HostPtr, |host, b| host.bytes(b), host.bytes_mut(b));
}

impl Device for Cuda {
    type Buf<T: DeviceElem> = DevBuf<T>;
    type Graph = GpuGraph;
    type Mark = CudaEvent;

    fn describe(&self) -> String {
        format!("GPU {} ({:?})", self.gpu().info().name, self.target())
    }

    fn sm_count(&self) -> usize {
        self.gpu().info().sm_count as usize
    }

    fn persistent(&self) -> bool {
        self.wgmma()
    }

    fn wgmma(&self) -> bool {
        Cuda::wgmma(self)
    }

    fn compiles(&self) -> bool {
        true
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

    fn run_erased<'a, K: Kernel>(&mut self, launch: ErasedLaunch<'_, K, Self::Raw<'a>>) -> Result<()>
    where
        Self: 'a,
    {
        Cuda::run_erased::<K>(self, launch)
    }

    fn resident<'a, K: Kernel>(&mut self, config: &K::Config, args: &K::Args<'a, Self>) -> Result<usize>
    where
        Self: 'a,
    {
        Cuda::resident::<K>(self, config, args)
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

    fn mark(&mut self) -> Result<CudaEvent> {
        let event = self.gpu().event()?;
        self.gpu().record(&event)?;
        Ok(event)
    }

    fn mark_ms(&self, start: &CudaEvent, end: &CudaEvent) -> Result<f64> {
        Ok(f64::from(self.gpu().elapsed_ms(start, end)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes, zero fills and prefix reads on `dev`, in range and past the
    /// buffer's end; no graph capture.
    fn writes_fills_and_reads_prefixes<D: Device>(dev: &mut D) {
        let b = dev.zeros::<i32>(6).unwrap();
        dev.write(&b, &[1, 2, 3, 4]).unwrap();
        dev.fill_zero(&b, 1, 2).unwrap();
        assert_eq!(dev.download(&b).unwrap(), vec![1, 0, 0, 4, 0, 0]);
        assert_eq!(dev.download_prefix(&b, 4).unwrap(), vec![1, 0, 0, 4]);
        assert!(dev.write(&b, &[0; 7]).is_err());
        assert!(dev.fill_zero(&b, 5, 2).is_err());
        assert!(dev.download_prefix(&b, 7).is_err());
        assert!(dev.begin_capture().is_err());
    }

    #[test]
    fn native_backend_writes_fills_and_reads_prefixes() {
        let mut host = Host::new();
        writes_fills_and_reads_prefixes(&mut host);
        assert_eq!(host.sm_count(), 1);
    }

    #[test]
    fn interpreter_writes_fills_and_reads_prefixes() {
        let mut cpu = Cpu::new();
        writes_fills_and_reads_prefixes(&mut cpu);
        assert!(!cpu.supports_graphs());
    }
}
