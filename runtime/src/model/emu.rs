//! [`Emu`]: the interpreter as a [`Device`] *with graphs*, for testing the
//! graph logic of the model without a GPU. It owns host buffers like
//! [`dsl_core::interp::Cpu`]; while a capture is open, launches are recorded
//! (kernel, grid and erased arguments, exactly what a CUDA graph bakes in)
//! instead of run, and [`Device::replay`] runs the recording again on the
//! buffers' current contents.
//!
//! It enforces the rules of a CUDA capture strictly: during a capture, a
//! kernel that was never launched before (it would be compiled and loaded),
//! an allocation, a copy, a fill or a read is an error. A buffer that is
//! reallocated after a capture is a new buffer here too, so a graph that
//! kept pointing to the old one replays on stale data and a comparison with
//! eager execution fails.

use super::device::{Device, buffer_ptr_device, read_elements, write_elements, zero_elements};
use crate::cuda::DeviceElem;
use crate::error::{Error, Result};
use dsl_core::interp::{Arg, Buffer, Element, Kernel as Prepared, KernelCache};
use dsl_core::launch::{BufferBackend, ErasedLaunch, Kernel, PtrElem};
use std::sync::Arc;
use std::time::Instant;

/// A typed pointer into an [`Emu`] buffer (buffer index, element offset in
/// the buffer's own elements).
pub type EmuPtr<T> = dsl_core::launch::BufferPtr<T>;

/// One recorded launch.
#[derive(Clone)]
pub struct Recorded {
    kernel: Arc<Prepared>,
    grid: [u32; 3],
    args: Vec<Arg>,
}

/// The interpreter with graph capture (see the module doc).
#[derive(Default)]
pub struct Emu {
    buffers: Vec<Buffer>,
    cache: KernelCache,
    recording: Option<Vec<Recorded>>,
    /// Launches run (not recorded), for tests that check replays happen.
    pub launches: usize,
    /// Graph replays.
    pub replays: usize,
    /// Makes every capture fail at its end (as an invalidated CUDA capture does).
    pub fail_captures: bool,
    /// Answers as a Hopper GPU does (tensor cores, `wgmma` tiles,
    /// persistent kernels), so the model picks the kernels and
    /// configurations it runs there, interpreted.
    pub hopper: bool,
}

impl Emu {
    /// An empty device.
    pub fn new() -> Emu {
        Emu::default()
    }

    fn not_while_capturing(&self, what: &str) -> Result<()> {
        if self.recording.is_some() {
            return Err(Error::Usage(format!("{what} during a graph capture")));
        }
        Ok(())
    }

    fn add(&mut self, b: Buffer) -> usize {
        self.buffers.push(b);
        self.buffers.len() - 1
    }
}

impl BufferBackend for Emu {
    fn launch_buffers<K: Kernel>(
        &mut self,
        launch: ErasedLaunch<'_, K, (usize, usize)>,
    ) -> dsl_core::Result<()> {
        let ErasedLaunch { config, grid, args } = launch;
        if self.recording.is_some() && !self.cache.contains::<K>(config) {
            return Err(dsl_core::Error::Launch {
                kernel: K::NAME.into(),
                message: "first launch of this config during a graph capture (it would compile)".into(),
            });
        }
        let kernel = self.cache.get_or_build::<K>(config)?;
        let args: Vec<Arg> = args.into_iter().map(Arg::from).collect();
        if let Some(rec) = self.recording.as_mut() {
            rec.push(Recorded { kernel, grid, args });
            return Ok(());
        }
        self.launches += 1;
        kernel.launch_as(K::NAME, grid, &mut self.buffers, &args)
    }
}

impl Device for Emu {
    type Buf<T: DeviceElem> = EmuPtr<T>;
    type Graph = Vec<Recorded>;
    type Mark = Instant;

    fn describe(&self) -> String {
        "graph-recording interpreter (tests)".into()
    }

    fn compiles(&self) -> bool {
        false
    }

    fn persistent(&self) -> bool {
        self.hopper
    }

    fn wgmma(&self) -> bool {
        self.hopper
    }

    fn tensor_cores(&self) -> bool {
        self.hopper
    }

    fn upload<T: DeviceElem>(&mut self, data: &[T]) -> Result<EmuPtr<T>> {
        self.not_while_capturing("an upload")?;
        let buffer = self.add(Buffer::from_slice(data));
        Ok(EmuPtr::start(buffer))
    }

    fn zeros<T: DeviceElem>(&mut self, len: usize) -> Result<EmuPtr<T>> {
        self.not_while_capturing("an allocation")?;
        let buffer = self.add(Buffer::zeros(<T as Element>::DTYPE, len));
        Ok(EmuPtr::start(buffer))
    }

    fn download<T: DeviceElem>(&self, buf: &EmuPtr<T>) -> Result<Vec<T>> {
        self.not_while_capturing("a read")?;
        Ok(self.buffers[buf.buffer()].to_vec::<T>())
    }

    fn download_prefix<T: DeviceElem>(&self, buf: &EmuPtr<T>, n: usize) -> Result<Vec<T>> {
        self.not_while_capturing("a read")?;
        read_elements(self.buffers[buf.buffer()].as_bytes(), n)
    }

    fn write<T: DeviceElem>(&mut self, buf: &EmuPtr<T>, data: &[T]) -> Result<()> {
        self.not_while_capturing("a copy")?;
        write_elements(self.buffers[buf.buffer()].as_bytes_mut(), data)
    }

    fn fill_zero<T: DeviceElem>(&mut self, buf: &EmuPtr<T>, offset: usize, len: usize) -> Result<()> {
        self.not_while_capturing("a fill")?;
        zero_elements::<T>(self.buffers[buf.buffer()].as_bytes_mut(), offset, len)
    }

    fn supports_graphs(&self) -> bool {
        true
    }

    fn begin_capture(&mut self) -> Result<()> {
        self.not_while_capturing("a nested capture")?;
        self.recording = Some(Vec::new());
        Ok(())
    }

    fn end_capture(&mut self) -> Result<Vec<Recorded>> {
        let rec = self.recording.take().ok_or_else(|| Error::Usage("no capture is open".into()))?;
        if self.fail_captures {
            return Err(Error::Unsupported("the capture was invalidated (test)".into()));
        }
        if rec.is_empty() {
            return Err(Error::Usage("the capture recorded no work".into()));
        }
        Ok(rec)
    }

    fn replay(&mut self, graph: &Vec<Recorded>) -> Result<()> {
        self.not_while_capturing("a replay")?;
        self.replays += 1;
        for r in graph {
            r.kernel.launch(r.grid, &mut self.buffers, &r.args)?;
        }
        Ok(())
    }

    buffer_ptr_device!(EmuPtr);
}
