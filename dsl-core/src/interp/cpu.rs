//! [`Cpu`]: the interpreter as a [`Backend`], so `#[kernel]`s launch on the CPU
//! exactly as they will on the GPU: typed arguments, one specialization built
//! (and canonicalized) per config and cached, argument validation at launch.
//!
//! The backend owns its host buffers; [`CpuPtr`]s are typed handles to them
//! (buffer index plus element offset), so several arguments may alias one
//! buffer, as device pointers can.

use super::{Arg, Buffer, Element, Kernel as Prepared};
use crate::error::{Error, Result};
use crate::launch::{self, Backend, Kernel, PtrElem};
use rustc_hash::FxHashMap;
use std::sync::Arc;

/// A typed pointer into a [`Cpu`] buffer.
pub type CpuPtr<T> = crate::launch::BufferPtr<T>;

/// The CPU interpreter backend.
#[derive(Default)]
pub struct Cpu {
    buffers: Vec<Buffer>,
    cache: FxHashMap<(&'static str, String), Arc<Prepared>>,
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

    /// Builds, verifies and prepares the specialization of `K` for `config`, or
    /// returns it from the cache.
    fn prepared<K: Kernel>(&mut self, config: &K::Config) -> Result<Arc<Prepared>> {
        let key = (K::NAME, K::config_key(config));
        if let Some(k) = self.cache.get(&key) {
            return Ok(k.clone());
        }
        let mut f = K::build(config)?;
        crate::passes::canonicalize(&mut f);
        let k = Arc::new(Prepared::new(&f)?);
        self.cache.insert(key, k.clone());
        Ok(k)
    }
}

impl Backend for Cpu {
    type Ptr<'a, T: PtrElem> = CpuPtr<T>;
    type Raw<'a> = (usize, usize);

    fn erase<'a, T: PtrElem>(p: Self::Ptr<'a, T>) -> Self::Raw<'a> {
        p.raw()
    }

    fn launch<'a, K: Kernel>(
        &mut self,
        grid: [u32; 3],
        config: &K::Config,
        args: &K::Args<'a, Self>,
    ) -> Result<()>
    where
        Self: 'a,
    {
        let kernel = self.prepared::<K>(config)?;
        let raw = K::erase_args(args);
        let args: Vec<Arg> = raw
            .into_iter()
            .map(|a| match a {
                launch::Arg::Ptr((buffer, offset)) => Arg::Ptr { buffer, offset },
                launch::Arg::Scalar(s) => Arg::Scalar(s),
            })
            .collect();
        kernel.launch(grid, &mut self.buffers, &args).map_err(|e| match e {
            Error::Launch { message, .. } => Error::Launch { kernel: K::NAME.to_string(), message },
            other => other,
        })
    }
}
