//! The GPU: [`Gpu`] (device, primary context and one stream of its own,
//! opened with a probe that turns a missing driver or GPU into an error
//! instead of a panic), allocation of the typed device buffers of
//! `buffer.rs` ([`DevBuf`]), loaded kernels cached by name and PTX hash,
//! CUDA-event timing, and CUDA graphs ([`GpuGraph`]: capture of the stream's
//! launches, replay).
//!
//! Invariants:
//! - every driver call binds the context to the calling thread first (cudarc's
//!   `bind_to_thread` is a no-op when it is already current);
//! - everything (launches, copies, memsets, events, graph replays) runs on the
//!   [`Gpu`]'s one stream, created by this module (non-blocking: the legacy
//!   default stream cannot be captured into a graph), so work is ordered by
//!   issue order without explicit waits; host-to-device copies are
//!   asynchronous from pageable memory (the driver stages the data before the
//!   call returns, so the source may be reused at once) and device-to-host
//!   copies wait for the stream;
//! - a [`DevBuf`] is allocated on the [`Gpu`]'s stream and owns its memory
//!   (see `buffer.rs`);
//! - during a capture ([`Gpu::begin_capture`] to [`Gpu::end_capture`]) nothing
//!   may allocate, free, copy or synchronize: only launches are recorded (the
//!   capture mode is thread-local, so the driver reports such a call as an
//!   error instead of running it).

use super::buffer::{DevBuf, DeviceElem};
use super::validate::{GridLimits, KernelParam};
use crate::error::{Error, Result};
use cudarc::driver::sys::{self, CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{CudaContext, CudaEvent, CudaFunction, CudaGraph, CudaStream, result};
use std::collections::HashMap;
use std::ffi::c_void;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

/// The most parameters [`Gpu::launch_raw`] packs (the launcher's limit).
const MAX_LAUNCH_PARAMS: usize = super::backend::MAX_PARAMS;

/// Dynamic shared memory a kernel may use without opting in (48 KiB).
const DEFAULT_MAX_DYNAMIC_SHARED: u32 = 48 * 1024;

/// What the runtime knows about the device it opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device ordinal.
    pub ordinal: usize,
    /// The device name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Total device memory in bytes.
    pub total_mem: usize,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// L2 cache size in bytes.
    pub l2_bytes: u32,
    /// Maximum grid dimensions.
    pub grid: GridLimits,
    /// The most dynamic shared memory a block can opt into.
    pub max_shared_optin: u32,
}

/// A kernel loaded into the context, ready to launch.
#[derive(Clone, Debug)]
pub struct LoadedKernel {
    func: CudaFunction,
    /// The entry name.
    pub name: String,
    /// Dynamic shared memory per block, in bytes.
    pub shared_bytes: u32,
}

impl LoadedKernel {
    /// How many blocks of `threads` threads (with its dynamic shared
    /// memory) one multiprocessor holds at once, by the driver's occupancy
    /// calculator.
    pub fn resident_per_sm(&self, threads: u32) -> Result<u32> {
        self.func
            .occupancy_max_active_blocks_per_multiprocessor(threads, self.shared_bytes as usize, None)
            .map_err(Error::driver(format!("query the occupancy of `{}`", self.name)))
    }
}

/// Checks that the CUDA driver library can be loaded, without letting cudarc
/// panic when it cannot.
///
/// cudarc's dynamic loading panics on its first driver call if no candidate
/// library (`libcuda.so`, `libcuda.so.1`, ...) loads; `is_culib_present` tries
/// the same candidates and reports instead.
pub fn driver_present() -> bool {
    // SAFETY: loading the driver library runs its initializers, exactly as
    // cudarc's own lazy loading would; the handle is dropped right away.
    unsafe { sys::is_culib_present() }
}

/// Runs a driver call that may panic inside cudarc (a symbol missing from an old
/// driver library), turning the panic into [`Error::NoDriver`].
fn guarded<T>(what: &str, f: impl FnOnce() -> T + std::panic::UnwindSafe) -> Result<T> {
    std::panic::catch_unwind(f).map_err(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "unknown panic".into());
        Error::NoDriver(format!("{what}: the CUDA driver library is unusable ({msg})"))
    })
}

/// An open GPU: device, primary context, the stream all work runs on and a
/// cache of loaded kernels.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
    kernels: Mutex<HashMap<(String, u64), LoadedKernel>>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu").field("info", &self.info).finish_non_exhaustive()
    }
}

impl Gpu {
    /// Opens GPU `ordinal`.
    ///
    /// Errors: [`Error::NoDriver`] when the driver library is missing or unusable,
    /// [`Error::NoDevice`] when the driver cannot initialize (no GPU, driver and
    /// kernel module mismatch) or there is no GPU `ordinal`, [`Error::Driver`]
    /// when creating the context fails. Never panics for these.
    pub fn new(ordinal: usize) -> Result<Gpu> {
        if !driver_present() {
            return Err(Error::NoDriver(
                "the CUDA driver library (libcuda.so.1) could not be loaded; install the NVIDIA driver \
                 or add its directory to LD_LIBRARY_PATH (the CPU interpreter needs neither)"
                    .into(),
            ));
        }
        guarded("cuInit", result::init)?
            .map_err(|e| Error::NoDevice(format!("the CUDA driver failed to initialize: {e}")))?;
        let count = guarded("cuDeviceGetCount", result::device::get_count)?
            .map_err(|e| Error::NoDevice(format!("cannot count CUDA devices: {e}")))?;
        if ordinal >= count.max(0) as usize {
            return Err(Error::NoDevice(format!(
                "GPU {ordinal} was requested, but {count} GPU(s) are visible"
            )));
        }
        let ctx = guarded("cuDevicePrimaryCtxRetain", move || CudaContext::new(ordinal))?
            .map_err(Error::driver(format!("create a context on GPU {ordinal}")))?;
        let stream = ctx.new_stream().map_err(Error::driver(format!("create a stream on GPU {ordinal}")))?;
        let info = Self::query(&ctx, ordinal)?;
        Ok(Gpu { ctx, stream, info, kernels: Mutex::new(HashMap::new()) })
    }

    fn query(ctx: &Arc<CudaContext>, ordinal: usize) -> Result<DeviceInfo> {
        let attr = |a: CUdevice_attribute| -> Result<u32> {
            ctx.attribute(a).map(|v| v.max(0) as u32).map_err(Error::driver(format!("query {a:?}")))
        };
        Ok(DeviceInfo {
            ordinal,
            name: ctx.name().map_err(Error::driver("query the device name"))?,
            compute_capability: ctx
                .compute_capability()
                .map_err(Error::driver("query the compute capability"))?,
            total_mem: ctx.total_mem().map_err(Error::driver("query the device memory"))?,
            sm_count: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            l2_bytes: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?,
            grid: GridLimits {
                max: [
                    attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)?,
                    attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y)?,
                    attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)?,
                ],
            },
            max_shared_optin: attr(
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )?,
        })
    }

    /// The device's properties.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(Error::driver("bind the CUDA context"))
    }

    /// Waits until all work on the device has finished; reports errors of earlier
    /// asynchronous work (a faulting kernel shows up here).
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        self.stream.synchronize().map_err(Error::driver("synchronize the stream"))
    }

    /// Allocates `len` elements, zero-filled.
    pub fn zeros<T: DeviceElem>(&self, len: usize) -> Result<DevBuf<T>> {
        let buf = self.alloc::<T>(len)?;
        buf.fill_bytes(0)?;
        Ok(buf)
    }

    /// Allocates a buffer holding a copy of `data`.
    pub fn upload<T: DeviceElem>(&self, data: &[T]) -> Result<DevBuf<T>> {
        let mut buf = self.alloc::<T>(data.len())?;
        buf.write(data)?;
        Ok(buf)
    }

    fn alloc<T: DeviceElem>(&self, len: usize) -> Result<DevBuf<T>> {
        let bytes = len.checked_mul(size_of::<T>()).ok_or_else(|| {
            Error::Unsupported(format!(
                "a buffer of {len} x {} does not fit the address space",
                T::DEVICE_DTYPE
            ))
        })?;
        self.bind()?;
        let ptr = if bytes == 0 {
            0
        } else {
            // SAFETY: the context is current; the returned allocation is owned by
            // the `DevBuf` and freed exactly once, in its `Drop`.
            unsafe { result::malloc_sync(bytes) }
                .map_err(Error::driver(format!("allocate {bytes} bytes on the device")))?
        };
        Ok(DevBuf::owning(ptr, len, self.stream.clone()))
    }

    /// A new event for timing (see [`Gpu::time_ms`]).
    pub fn event(&self) -> Result<CudaEvent> {
        self.ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(Error::driver("create a CUDA event"))
    }

    /// Records `event` on the stream.
    pub fn record(&self, event: &CudaEvent) -> Result<()> {
        event.record(&self.stream).map_err(Error::driver("record a CUDA event"))
    }

    /// Milliseconds between two recorded events (waits for `end`).
    pub fn elapsed_ms(&self, start: &CudaEvent, end: &CudaEvent) -> Result<f32> {
        start.elapsed_ms(end).map_err(Error::driver("read a CUDA event timer"))
    }

    /// Times the device work `f` enqueues, in milliseconds, with CUDA events
    /// (waits for the work to finish).
    pub fn time_ms<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<(T, f32)> {
        let (start, end) = (self.event()?, self.event()?);
        self.record(&start)?;
        let out = f()?;
        self.record(&end)?;
        Ok((out, self.elapsed_ms(&start, &end)?))
    }

    /// Loads the entry `name` of `ptx` (cached by name and PTX hash) and, when
    /// `shared_bytes` exceeds 48 KiB, opts the function into that much dynamic
    /// shared memory.
    pub fn load_kernel(&self, name: &str, ptx: &str, shared_bytes: u32) -> Result<LoadedKernel> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        ptx.hash(&mut h);
        let key = (name.to_string(), h.finish());
        let mut cache = self.kernels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = cache.get(&key) {
            return Ok(k.clone());
        }
        if shared_bytes > self.info.max_shared_optin.max(DEFAULT_MAX_DYNAMIC_SHARED) {
            return Err(Error::Unsupported(format!(
                "kernel `{name}` needs {shared_bytes} bytes of shared memory; {} offers at most {}",
                self.info.name, self.info.max_shared_optin
            )));
        }
        if ptx.contains('\0') {
            return Err(Error::Unsupported(format!("the PTX of `{name}` contains a NUL byte")));
        }
        self.bind()?;
        let module = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
            .map_err(Error::driver(format!("load the PTX module of `{name}`")))?;
        let func =
            module.load_function(name).map_err(Error::driver(format!("find entry `{name}` in its PTX")))?;
        if shared_bytes > DEFAULT_MAX_DYNAMIC_SHARED {
            func.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                shared_bytes as i32,
            )
            .map_err(Error::driver(format!("allow {shared_bytes} bytes of shared memory for `{name}`")))?;
        }
        let k = LoadedKernel { func, name: name.to_string(), shared_bytes };
        cache.insert(key, k.clone());
        Ok(k)
    }

    /// Enqueues `kernel` with already validated, packed `params`: `grid`
    /// programs of `threads` threads each.
    ///
    /// With `overlap`, the launch allows programmatic stream serialization
    /// (Hopper's programmatic dependent launch): its programs may start before
    /// the previous kernel of the stream ends. Only kernels that call
    /// `gdc_wait` before touching memory an earlier kernel writes may be
    /// launched so (see [`dsl_core::ir::Function::waits_on_grid`]). Captured
    /// into a graph, the launch becomes a programmatic dependency edge.
    ///
    /// The caller guarantees that `params` match the kernel's parameters (see
    /// [`super::validate::validate_args`]) and point into live buffers.
    pub(crate) fn launch_raw(
        &self,
        kernel: &LoadedKernel,
        grid: [u32; 3],
        threads: u32,
        params: &[KernelParam],
        maps: &[super::tma::TensorMap],
        overlap: bool,
    ) -> Result<()> {
        let n = params.len() + maps.len();
        if n > MAX_LAUNCH_PARAMS {
            return Err(Error::Launch {
                kernel: kernel.name.clone(),
                message: format!("{n} parameters; at most {MAX_LAUNCH_PARAMS} are supported"),
            });
        }
        self.bind()?;
        let mut slots = [0u64; MAX_LAUNCH_PARAMS];
        for (slot, p) in slots.iter_mut().zip(params) {
            *slot = p.slot();
        }
        let mut ptrs = [std::ptr::null_mut::<c_void>(); MAX_LAUNCH_PARAMS];
        for (ptr, slot) in ptrs.iter_mut().zip(slots.iter_mut()) {
            *ptr = slot as *mut u64 as *mut c_void;
        }
        // The hidden tensor maps follow the kernel's parameters, each passed
        // by pointer to its 128 bytes.
        for (ptr, m) in ptrs[params.len()..].iter_mut().zip(maps) {
            *ptr = m as *const super::tma::TensorMap as *mut c_void;
        }
        if overlap {
            return self.launch_overlapping(kernel, grid, threads, &mut ptrs[..n]);
        }
        // SAFETY: the function comes from a module that `kernel.func` keeps
        // loaded; `ptrs[..n]` holds one pointer per kernel parameter (validated
        // against the IR the PTX was compiled from), each to an 8-byte slot
        // holding the parameter's value in its first bytes, alive until this
        // call returns (the driver copies parameters at launch, also when the
        // launch is captured into a graph), then one pointer per hidden
        // tensor map to its 128 bytes in `maps`, also alive until the call
        // returns. Pointer parameters are addresses of live allocations
        // borrowed by the caller's `DevPtr`s.
        unsafe {
            result::launch_kernel(
                kernel.func.cu_function(),
                (grid[0], grid[1], grid[2]),
                (threads, 1, 1),
                kernel.shared_bytes,
                self.stream.cu_stream(),
                &mut ptrs[..n],
            )
        }
        .map_err(Error::driver(format!("launch `{}`", kernel.name)))
    }

    /// [`Gpu::launch_raw`] with programmatic stream serialization allowed
    /// (`cuLaunchKernelEx` with one launch attribute).
    fn launch_overlapping(
        &self,
        kernel: &LoadedKernel,
        grid: [u32; 3],
        threads: u32,
        ptrs: &mut [*mut c_void],
    ) -> Result<()> {
        // SAFETY: an all-zero launch attribute is a valid (ignored) value of
        // this plain C struct; the fields set below select the attribute.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: grid[0],
            gridDimY: grid[1],
            gridDimZ: grid[2],
            blockDimX: threads,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: kernel.shared_bytes,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: as in `launch_raw` for the function and `ptrs`; `config`
        // and the attribute it points to live until the call returns (the
        // driver copies both).
        unsafe {
            sys::cuLaunchKernelEx(&config, kernel.func.cu_function(), ptrs.as_mut_ptr(), std::ptr::null_mut())
                .result()
        }
        .map_err(Error::driver(format!("launch `{}` (programmatic dependent launch)", kernel.name)))
    }

    /// Starts recording the stream's launches into a graph instead of running
    /// them (thread-local capture mode: a forbidden call from this thread,
    /// such as an allocation or a synchronization, fails instead of running).
    /// Every `begin_capture` must be followed by [`Gpu::end_capture`], also
    /// when something in between fails.
    pub fn begin_capture(&self) -> Result<()> {
        self.bind()?;
        let stream = self.stream.clone();
        guarded(
            "cuStreamBeginCapture",
            std::panic::AssertUnwindSafe(move || {
                stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            }),
        )?
        .map_err(Error::driver("begin a CUDA graph capture"))
    }

    /// Ends the capture begun by [`Gpu::begin_capture`] and instantiates the
    /// recorded graph (uploaded to the device, so its first replay is not
    /// slower than the others).
    ///
    /// Errors: the capture was invalidated (a forbidden call happened during
    /// it), recorded nothing, or the driver cannot instantiate it.
    pub fn end_capture(&self) -> Result<GpuGraph> {
        self.bind()?;
        let stream = self.stream.clone();
        let graph = guarded(
            "cuStreamEndCapture",
            std::panic::AssertUnwindSafe(move || stream.end_capture(sys::CUgraphInstantiate_flags(0))),
        )?
        .map_err(Error::driver("end a CUDA graph capture (it was invalidated or cannot be instantiated)"))?
        .ok_or_else(|| Error::Usage("the CUDA graph capture recorded no work".into()))?;
        graph.upload().map_err(Error::driver("upload a CUDA graph"))?;
        Ok(GpuGraph { graph })
    }

    /// Replays `graph` on the stream (asynchronously, like a launch).
    pub fn replay(&self, graph: &GpuGraph) -> Result<()> {
        self.bind()?;
        graph.graph.launch().map_err(Error::driver("replay a CUDA graph"))
    }
}

/// An instantiated CUDA graph of launches captured on a [`Gpu`]'s stream
/// (see [`Gpu::begin_capture`]); it replays on that stream and keeps the
/// stream alive. The launches' pointer arguments are baked in: the buffers
/// they point to must stay allocated (and at the same addresses) for as
/// long as the graph is replayed.
pub struct GpuGraph {
    graph: CudaGraph,
}

impl std::fmt::Debug for GpuGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GpuGraph")
    }
}

// SAFETY: a graph and its executable are plain driver handles that any
// thread may use once the context is bound (every use binds it); the driver
// requires that calls on one graph are not concurrent, which `GpuGraph`
// guarantees by not being `Sync` (replay takes `&self` of a value that one
// thread owns at a time).
unsafe impl Send for GpuGraph {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_returns_an_error_without_a_driver_or_gpu() {
        // This machine has no GPU; on one that has, opening GPU 0 must work.
        match Gpu::new(0) {
            Err(Error::NoDriver(m)) => assert!(m.contains("libcuda"), "{m}"),
            Err(Error::NoDevice(m)) => assert!(!m.is_empty()),
            Err(other) => panic!("unexpected error: {other}"),
            Ok(gpu) => assert!(gpu.info().sm_count > 0),
        }
        // An absurd ordinal is never a panic either.
        assert!(Gpu::new(1 << 20).is_err());
    }
}
