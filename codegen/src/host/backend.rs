//! [`Host`]: compiled host code as a [`Backend`], so `#[kernel]`s launch on
//! the CPU natively exactly as they do on the interpreter ([`dsl_core::interp::Cpu`])
//! and the GPU: the backend owns its buffers, [`HostPtr`]s are typed handles
//! into them (buffer index plus element offset, so arguments may alias),
//! and a launch builds the kernel once per config, specializes it on its
//! arguments as the GPU backend does (16-byte aligned pointers, integers
//! divisible by 16: the axis analysis then proves more contiguity),
//! compiles it through the [`HostCache`], validates the arguments and runs
//! the grid.
//!
//! Invariants: buffers are 64-byte aligned and never move while the `Host`
//! lives (a launch passes their addresses); a launch takes `&mut self`, so
//! nothing else touches the buffers while programs run.

use super::cache::HostCache;
use super::launch::HostKernel;
use crate::fnv::Fnv;
use dsl_core::error::{Error, Result};
use dsl_core::interp::{Buffer, Element};
use dsl_core::launch::{self, AnyDType, BufferBackend, ErasedLaunch, Kernel, PerConfig};
use dsl_core::{DType, Elem, Function};
use rustc_hash::FxHashMap;
use std::fmt::Write as _;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// A typed pointer into a [`Host`] buffer.
pub type HostPtr<T> = dsl_core::launch::BufferPtr<T>;

/// 64 bytes, 64-byte aligned: the unit of buffer storage.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// One buffer: a dtype and its bytes in aligned storage.
struct HostBuffer {
    dtype: DType,
    len: usize,
    data: Vec<Line>,
}

impl HostBuffer {
    fn zeroed(dtype: DType, bytes: usize) -> HostBuffer {
        HostBuffer { dtype, len: bytes, data: vec![Line([0; 64]); bytes.div_ceil(64)] }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `data` holds at least `len` initialized bytes (whole
        // 64-byte lines); `Line` is plain bytes.
        unsafe { std::slice::from_raw_parts(self.data.as_ptr().cast::<u8>(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `&mut self` makes the view exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.data.as_mut_ptr().cast::<u8>(), self.len) }
    }

    fn addr(&self) -> u64 {
        self.data.as_ptr() as u64
    }
}

/// A prepared specialization: its kernel and parameter types.
struct Prepared {
    name: &'static str,
    config_key: String,
    mask: u64,
    params: Vec<Elem>,
    kernel: Arc<HostKernel>,
}

/// Called with a kernel's name before each fresh compile.
pub type CompileHook = Box<dyn Fn(&str) + Send>;

/// The native CPU backend.
pub struct Host {
    buffers: Vec<HostBuffer>,
    cache: Arc<HostCache>,
    built: PerConfig<Function>,
    prepared: FxHashMap<u64, Vec<Arc<Prepared>>>,
    key_buf: String,
    on_compile: Option<CompileHook>,
}

impl Default for Host {
    fn default() -> Self {
        Host::new()
    }
}

impl Host {
    /// A backend with no buffers and the default on-disk cache.
    pub fn new() -> Host {
        Host::with_cache(Arc::new(HostCache::new()))
    }

    /// A backend compiling through `cache` (shared between backends).
    pub fn with_cache(cache: Arc<HostCache>) -> Host {
        Host {
            buffers: Vec::new(),
            cache,
            built: PerConfig::default(),
            prepared: FxHashMap::default(),
            key_buf: String::new(),
            on_compile: None,
        }
    }

    /// Calls `f` with the kernel's name before each fresh compile (a miss in
    /// memory and on disk), e.g. to count compiles on a progress bar.
    pub fn set_compile_hook(&mut self, f: Option<CompileHook>) {
        self.on_compile = f;
    }

    /// The compile cache.
    pub fn cache(&self) -> &Arc<HostCache> {
        &self.cache
    }

    /// A one-line description (CPU, threads).
    pub fn describe(&self) -> String {
        format!(
            "native CPU backend, {} on {} threads",
            self.cache.target().describe(),
            super::launch::threads()
        )
    }

    /// Copies `data` into a new buffer.
    pub fn upload<T: Element>(&mut self, data: &[T]) -> HostPtr<T> {
        let size = T::DTYPE.size_bytes();
        let mut b = HostBuffer::zeroed(T::DTYPE, data.len() * size);
        for (chunk, &x) in b.bytes_mut().chunks_exact_mut(size).zip(data) {
            x.write_le(chunk);
        }
        self.push(b).cast()
    }

    /// A new zero-filled buffer of `len` elements.
    pub fn zeros<T: Element>(&mut self, len: usize) -> HostPtr<T> {
        self.push(HostBuffer::zeroed(T::DTYPE, len * T::DTYPE.size_bytes())).cast()
    }

    /// Adds a copy of an interpreter buffer (for packed formats viewed
    /// through `ptrcast`).
    pub fn add_buffer(&mut self, b: &Buffer) -> HostPtr<AnyDType> {
        let mut h = HostBuffer::zeroed(b.dtype(), b.size_bytes());
        h.bytes_mut().copy_from_slice(b.as_bytes());
        self.push(h)
    }

    fn push(&mut self, b: HostBuffer) -> HostPtr<AnyDType> {
        self.buffers.push(b);
        HostPtr::start(self.buffers.len() - 1)
    }

    /// The bytes of the buffer `p` points into (all of it).
    pub fn bytes<T>(&self, p: HostPtr<T>) -> &[u8] {
        self.buffers[p.buffer()].bytes()
    }

    /// The bytes of the buffer `p` points into, mutably.
    pub fn bytes_mut<T>(&mut self, p: HostPtr<T>) -> &mut [u8] {
        self.buffers[p.buffer()].bytes_mut()
    }

    /// Reads the whole buffer `p` points into (from its start) as `T`.
    pub fn read<T: Element>(&self, p: HostPtr<T>) -> Vec<T> {
        let size = T::DTYPE.size_bytes();
        self.buffers[p.buffer()].bytes().chunks_exact(size).map(T::read_le).collect()
    }

    /// The IR of `K` for `config`, built once per config.
    fn built_ir<K: Kernel>(&mut self, config: &K::Config) -> Result<&Function> {
        Ok(self.built.get_or_try_insert::<K, _>(config, || K::build(config))?)
    }

    /// The specialization of `K` for `config` and argument mask `mask`.
    fn lookup<K: Kernel>(&mut self, config: &K::Config, mask: u64) -> Result<Arc<Prepared>> {
        self.key_buf.clear();
        // Writing into a String cannot fail.
        let _ = write!(self.key_buf, "{config:?}");
        let mut h = Fnv::new();
        K::NAME.hash(&mut h);
        self.key_buf.hash(&mut h);
        mask.hash(&mut h);
        let hash = h.finish();
        if let Some(list) = self.prepared.get(&hash)
            && let Some(p) =
                list.iter().find(|p| p.mask == mask && p.name == K::NAME && p.config_key == self.key_buf)
        {
            return Ok(p.clone());
        }
        let config_key = self.key_buf.clone();
        let base = self.built_ir::<K>(config)?;
        let facts: Vec<Option<u64>> =
            (0..base.params.len()).map(|i| Some(if i < 64 && mask >> i & 1 == 1 { 16 } else { 1 })).collect();
        let (mut func, _) = launch::specialize(base, &facts);
        dsl_core::passes::canonicalize(&mut func);
        let params = func.params.iter().map(|p| func.ty(p.value).elem).collect();
        let hook = &self.on_compile;
        let kernel = self
            .cache
            .get_or_compile_with(&func, || {
                if let Some(h) = hook {
                    h(K::NAME);
                }
            })
            .map_err(|e| into_dsl(K::NAME, e))?;
        let p = Arc::new(Prepared { name: K::NAME, config_key, mask, params, kernel });
        self.prepared.entry(hash).or_default().push(p.clone());
        Ok(p)
    }
}

/// A codegen error as `dsl_core`'s.
fn into_dsl(kernel: &str, e: crate::Error) -> Error {
    match e {
        crate::Error::Unsupported { .. } => Error::Unsupported(e.to_string()),
        other => Error::Launch { kernel: kernel.to_string(), message: other.to_string() },
    }
}

impl BufferBackend for Host {
    fn launch_buffers<K: Kernel>(&mut self, launch: ErasedLaunch<'_, K, (usize, usize)>) -> Result<()> {
        let ErasedLaunch { config, grid, args: raw } = launch;
        let launch_err = |message: String| Error::Launch { kernel: K::NAME.to_string(), message };
        // Addresses (pointers) and values (integers) for the specialization.
        let mut slots = Vec::with_capacity(raw.len());
        let mut mask = 0u64;
        for (i, a) in raw.iter().enumerate() {
            let (slot, divisible) = match *a {
                launch::Arg::Ptr((buffer, offset)) => {
                    let b = self.buffers.get(buffer).ok_or_else(|| {
                        launch_err(format!("argument {i} names an unknown buffer {buffer}"))
                    })?;
                    let byte = offset * b.dtype.size_bytes();
                    if byte > b.len {
                        return Err(launch_err(format!(
                            "argument {i} starts at element {offset} of a buffer of {} bytes",
                            b.len
                        )));
                    }
                    let addr = b.addr() + byte as u64;
                    (addr, addr.is_multiple_of(16))
                }
                launch::Arg::Scalar(s) => {
                    let d = s.dtype();
                    let bits = match d {
                        DType::F32 | DType::F16 | DType::BF16 => u64::from((s.as_f64() as f32).to_bits()),
                        DType::F64 => s.as_f64().to_bits(),
                        DType::I1 => u64::from(s.as_i64() != 0),
                        _ => s.as_i64() as u64,
                    };
                    (bits, d.is_int() && d != DType::I1 && s.as_i64().rem_euclid(16) == 0)
                }
            };
            if divisible && i < 64 {
                mask |= 1 << i;
            }
            slots.push(slot);
        }
        let p = self.lookup::<K>(config, mask)?;
        if p.params.len() != raw.len() {
            return Err(launch_err(format!(
                "it takes {} arguments, but {} were passed",
                p.params.len(),
                raw.len()
            )));
        }
        for (i, (a, &elem)) in raw.iter().zip(&p.params).enumerate() {
            match (a, elem) {
                (launch::Arg::Ptr((buffer, _)), Elem::Ptr(pointee)) => {
                    let bd = self.buffers[*buffer].dtype;
                    if bd != pointee && bd != DType::U8 {
                        return Err(launch_err(format!(
                            "argument {i} points to {pointee}, but its buffer holds {bd}"
                        )));
                    }
                    if !slots[i].is_multiple_of(pointee.size_bytes() as u64) {
                        return Err(launch_err(format!("argument {i} is not aligned to {pointee}")));
                    }
                }
                (launch::Arg::Scalar(s), Elem::Scalar(d)) if s.dtype() == d => {}
                (launch::Arg::Scalar(s), Elem::Scalar(d)) => {
                    return Err(launch_err(format!(
                        "argument {i} needs a {d} scalar, but a {} was passed",
                        s.dtype()
                    )));
                }
                (launch::Arg::Ptr(_), _) => {
                    return Err(launch_err(format!("argument {i} is a scalar; pass a scalar")));
                }
                (launch::Arg::Scalar(_), _) => {
                    return Err(launch_err(format!("argument {i} is a pointer; pass a pointer")));
                }
            }
        }
        // SAFETY: every pointer slot is an address inside a buffer this
        // backend owns (checked above); `&mut self` keeps the buffers alive
        // and untouched until the launch returns. Where the kernel's
        // programs access memory relative to those addresses is the
        // kernel's contract, as on the GPU: the interpreter checks it.
        unsafe { p.kernel.launch(grid, &slots) }.map_err(|e| into_dsl(K::NAME, e))
    }
}

/// Runs `f` (verified, canonicalized, compiled through `cache`) over
/// `grid` on copies of the interpreter's `buffers`, written back after: the
/// native twin of [`dsl_core::interp::launch`] for hand-built functions and
/// tests. `args` bind as on the interpreter (buffer index plus element
/// offset, scalars of the parameter's dtype).
///
/// Errors: [`Error::Launch`] for arguments that do not fit the parameters,
/// the kernel's runtime errors, and compile errors.
pub fn run_function(
    cache: &HostCache,
    f: &Function,
    grid: [u32; 3],
    buffers: &mut [Buffer],
    args: &[dsl_core::interp::Arg],
) -> Result<()> {
    let launch_err = |message: String| Error::Launch { kernel: f.name.clone(), message };
    if args.len() != f.params.len() {
        return Err(launch_err(format!(
            "it takes {} arguments, but {} were passed",
            f.params.len(),
            args.len()
        )));
    }
    let mut host: Vec<HostBuffer> = buffers
        .iter()
        .map(|b| {
            let mut h = HostBuffer::zeroed(b.dtype(), b.size_bytes());
            h.bytes_mut().copy_from_slice(b.as_bytes());
            h
        })
        .collect();
    let mut slots = Vec::with_capacity(args.len());
    for (i, (a, p)) in args.iter().zip(&f.params).enumerate() {
        let ty = f.ty(p.value);
        let slot = match (*a, ty.elem) {
            (dsl_core::interp::Arg::Ptr { buffer, offset }, Elem::Ptr(pointee)) => {
                let b = host
                    .get(buffer)
                    .ok_or_else(|| launch_err(format!("argument {i}: no buffer {buffer}")))?;
                let byte = offset * b.dtype.size_bytes();
                if byte > b.len || !byte.is_multiple_of(pointee.size_bytes()) {
                    return Err(launch_err(format!(
                        "argument {i}: element {offset} is outside or misaligned"
                    )));
                }
                b.addr() + byte as u64
            }
            (dsl_core::interp::Arg::Scalar(s), Elem::Scalar(d)) if s.dtype() == d => match d {
                DType::F32 | DType::F16 | DType::BF16 => u64::from((s.as_f64() as f32).to_bits()),
                DType::F64 => s.as_f64().to_bits(),
                DType::I1 => u64::from(s.as_i64() != 0),
                _ => s.as_i64() as u64,
            },
            _ => return Err(launch_err(format!("argument {i} does not match parameter `{}`", p.name))),
        };
        slots.push(slot);
    }
    let kernel = cache.get_or_compile(f).map_err(|e| into_dsl(&f.name, e))?;
    // SAFETY: every pointer slot points into one of `host`'s buffers, which
    // live (and are touched by nothing else) until the launch returns; where
    // the programs access memory from there is the kernel's contract.
    let r = unsafe { kernel.launch(grid, &slots) }.map_err(|e| into_dsl(&f.name, e));
    for (b, h) in buffers.iter_mut().zip(&mut host) {
        b.as_bytes_mut().copy_from_slice(h.bytes());
    }
    r
}
