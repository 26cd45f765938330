//! [`Cpu`]: the interpreter as a [`Backend`], so `#[kernel]`s launch on the CPU
//! exactly as they will on the GPU: typed arguments, one specialization built
//! (and canonicalized) per config and cached, argument validation at launch.
//!
//! The backend owns its host buffers; [`CpuPtr`]s are typed handles to them
//! (buffer index plus element offset), so several arguments may alias one
//! buffer, as device pointers can.

use super::{Arg, Buffer, Element, Kernel as Prepared};
use crate::error::Result;
use crate::launch::{self, BufferBackend, ErasedLaunch, Kernel};
use std::sync::Arc;

/// A typed pointer into a [`Cpu`] buffer.
pub type CpuPtr<T> = crate::launch::BufferPtr<T>;

/// The CPU interpreter backend.
#[derive(Default)]
pub struct Cpu {
    buffers: Vec<Buffer>,
    cache: KernelCache,
}

impl Cpu {
    /// A backend with no buffers.
    pub fn new() -> Cpu {
        Cpu::default()
    }

    /// Copies `data` into a new buffer.
    pub fn upload<T: Element>(&mut self, data: &[T]) -> CpuPtr<T> {
        self.add_buffer(Buffer::from_slice(data)).cast()
    }

    /// A new zero-filled buffer of `len` elements.
    pub fn zeros<T: Element>(&mut self, len: usize) -> CpuPtr<T> {
        self.add_buffer(Buffer::zeros(T::DTYPE, len)).cast()
    }

    /// Adds an existing buffer (for packed formats viewed through `ptrcast`).
    pub fn add_buffer(&mut self, b: Buffer) -> CpuPtr<launch::AnyDType> {
        self.buffers.push(b);
        CpuPtr::start(self.buffers.len() - 1)
    }

    /// The buffer `p` points into.
    pub fn buffer<T>(&self, p: CpuPtr<T>) -> &Buffer {
        &self.buffers[p.buffer()]
    }

    /// The buffer `p` points into, mutably (to refill inputs between launches).
    pub fn buffer_mut<T>(&mut self, p: CpuPtr<T>) -> &mut Buffer {
        &mut self.buffers[p.buffer()]
    }

    /// Reads the whole buffer `p` points into (from its start).
    pub fn read<T: Element>(&self, p: CpuPtr<T>) -> Vec<T> {
        self.buffers[p.buffer()].to_vec::<T>()
    }
}

/// Prepared specializations of `#[kernel]`s, one per kernel and config key:
/// what a backend running kernels on the interpreter keeps between launches.
pub type KernelCache = launch::PerConfig<Arc<Prepared>>;

impl KernelCache {
    /// Builds, canonicalizes, verifies and prepares the specialization of
    /// `K` for `config`, or returns it from the cache.
    pub fn get_or_build<K: Kernel>(&mut self, config: &K::Config) -> Result<Arc<Prepared>> {
        let k = self.get_or_try_insert::<K, crate::Error>(config, || {
            let mut f = K::build(config)?;
            crate::passes::canonicalize(&mut f);
            Ok(Arc::new(Prepared::new(&f)?))
        })?;
        Ok(k.clone())
    }
}

impl From<launch::Arg<(usize, usize)>> for Arg {
    fn from(a: launch::Arg<(usize, usize)>) -> Arg {
        match a {
            launch::Arg::Ptr((buffer, offset)) => Arg::Ptr { buffer, offset },
            launch::Arg::Scalar(s) => Arg::Scalar(s),
        }
    }
}

impl BufferBackend for Cpu {
    fn launch_buffers<K: Kernel>(&mut self, launch: ErasedLaunch<'_, K, (usize, usize)>) -> Result<()> {
        let ErasedLaunch { config, grid, args } = launch;
        let kernel = self.cache.get_or_build::<K>(config)?;
        let args: Vec<Arg> = args.into_iter().map(Arg::from).collect();
        kernel.launch_as(K::NAME, grid, &mut self.buffers, &args)
    }
}
