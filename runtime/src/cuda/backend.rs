//! [`Cuda`]: the GPU as a [`dsl_core::launch::Backend`], so `#[kernel]`s launch
//! on the GPU exactly as they do on the CPU interpreter: typed arguments
//! ([`DevPtr`]s), one specialization per config, validation before launch.
//!
//! Per `(kernel, config key)` the backend builds the IR once, canonicalizes and
//! verifies it, compiles it through [`codegen::PtxCache`] (memory and disk
//! cache) for the device's target, loads the module and keeps all of it
//! ([`Prepared`]). Every launch validates the erased arguments against the IR's
//! parameters and the grid against the device limits (see [`super::validate`])
//! before it reaches the driver.
//!
//! Invariant: launches are asynchronous; errors of the kernel itself surface at
//! the next synchronizing call ([`Gpu::synchronize`], a download).

use super::device::{DevPtr, Gpu, LoadedKernel};
use super::validate::{OffsetRule, RawDevPtr, validate_args, validate_grid};
use crate::error::{Error, Result};
use codegen::{CompileOptions, Compiled, PtxCache, Target};
use dsl_core::Function;
use dsl_core::launch::{Backend, Kernel, PtrElem};
use std::collections::HashMap;
use std::sync::Arc;

/// The most threads a block may have on every supported GPU.
const MAX_THREADS: u32 = 1024;

/// One specialization, compiled and loaded.
#[derive(Debug)]
pub struct Prepared {
    /// The canonicalized IR that was compiled (its parameters are the ABI).
    pub func: Function,
    /// The offset rule derived from `func`.
    pub offsets: OffsetRule,
    /// The compiler's output.
    pub compiled: Arc<Compiled>,
    /// The loaded entry.
    pub kernel: LoadedKernel,
    /// Threads per block (`32 * num_warps`).
    pub threads: u32,
}

/// The CUDA backend: a [`Gpu`] plus the compile and specialization caches.
pub struct Cuda {
    gpu: Gpu,
    target: Target,
    ptx: PtxCache,
    /// Built IR per (kernel, config key), before specialization.
    built: HashMap<(&'static str, String), Function>,
    /// Compiled specializations per (kernel, config key, specialization mask).
    prepared: HashMap<(&'static str, String, u64), Arc<Prepared>>,
}

impl std::fmt::Debug for Cuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cuda").field("gpu", &self.gpu).field("target", &self.target).finish_non_exhaustive()
    }
}

/// The compile target for a device of compute capability `cc`: `sm_90a` on
/// Hopper (9.0), `sm_80` PTX (JIT-compiled forward) on every other GPU of
/// capability 8.0 or newer, and `None` below 8.0. (`sm_90a` code is not forward
/// compatible, so Blackwell gets `sm_80` PTX.)
pub fn target_for(cc: (i32, i32)) -> Option<Target> {
    match cc {
        (9, 0) => Some(Target::Sm90a),
        (major, _) if major >= 8 => Some(Target::Sm80),
        _ => None,
    }
}

impl Cuda {
    /// Opens GPU `ordinal` (see [`Gpu::new`] for the errors).
    pub fn open(ordinal: usize) -> Result<Cuda> {
        Cuda::new(Gpu::new(ordinal)?)
    }

    /// Wraps an open GPU.
    ///
    /// Errors: [`Error::Unsupported`] for GPUs below compute capability 8.0.
    pub fn new(gpu: Gpu) -> Result<Cuda> {
        let cc = gpu.info().compute_capability;
        let target = target_for(cc).ok_or_else(|| {
            Error::Unsupported(format!(
                "{} has compute capability {}.{}; tessera needs 8.0 (Ampere) or newer",
                gpu.info().name,
                cc.0,
                cc.1
            ))
        })?;
        Ok(Cuda { gpu, target, ptx: PtxCache::new(), built: HashMap::new(), prepared: HashMap::new() })
    }

    /// The GPU (for buffers, timing, synchronization).
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The compile target of this device.
    pub fn target(&self) -> Target {
        self.target
    }

    /// Builds, compiles and loads the specialization of `K` for `config`, with the
    /// parameters in `spec` promised divisible by 16 (see
    /// [`dsl_core::launch::specialize`]), or returns it from the cache.
    pub fn prepare<K: Kernel>(&mut self, config: &K::Config, facts: &[Option<u64>]) -> Result<Arc<Prepared>> {
        let ckey = (K::NAME, K::config_key(config));
        if !self.built.contains_key(&ckey) {
            let func = K::build(config)?;
            self.built.insert(ckey.clone(), func);
        }
        let base = &self.built[&ckey];
        let (mut func, mask) = dsl_core::launch::specialize(base, facts);
        let key = (ckey.0, ckey.1, mask);
        if let Some(p) = self.prepared.get(&key) {
            return Ok(p.clone());
        }
        dsl_core::passes::canonicalize(&mut func);
        dsl_core::verify::verify(&func)?;
        let opts = K::launch_options(config);
        let threads = opts.num_warps.checked_mul(32).filter(|&t| (32..=MAX_THREADS).contains(&t));
        let Some(threads) = threads else {
            return Err(Error::Launch {
                kernel: K::NAME.into(),
                message: format!("num_warps = {} is outside 1..=32", opts.num_warps),
            });
        };
        let copts =
            CompileOptions { target: self.target, num_warps: opts.num_warps, num_stages: opts.num_stages };
        let compiled = self.ptx.get_or_compile(&func, &copts)?;
        let kernel = self.gpu.load_kernel(&compiled.name, &compiled.ptx, compiled.shared_bytes)?;
        let offsets = OffsetRule::of(&func);
        let p = Arc::new(Prepared { func, offsets, compiled, kernel, threads });
        self.prepared.insert(key, p.clone());
        Ok(p)
    }

    /// Launches `K` over `grid` with the runtime's own error type (the
    /// [`Backend`] implementation maps it to `dsl_core`'s).
    pub fn run<'a, K: Kernel>(
        &mut self,
        grid: [u32; 3],
        config: &K::Config,
        args: &K::Args<'a, Self>,
    ) -> Result<()>
    where
        Self: 'a,
    {
        let raw = K::erase_args(args);
        // Specialize on what the arguments allow (16-byte aligned pointers,
        // integers divisible by 16), as Triton's launcher does.
        let facts: Vec<Option<u64>> = raw
            .iter()
            .map(|a| match a {
                dsl_core::launch::Arg::Ptr(p) => Some(p.addr),
                dsl_core::launch::Arg::Scalar(s) if s.dtype().is_int() => Some(s.as_i64() as u64),
                dsl_core::launch::Arg::Scalar(_) => None,
            })
            .collect();
        let p = self.prepare::<K>(config, &facts)?;
        let launch_err = |message: String| Error::Launch { kernel: K::NAME.to_string(), message };
        let params = validate_args(&p.func, &p.offsets, &raw).map_err(launch_err)?;
        if !validate_grid(grid, self.gpu.info().grid).map_err(launch_err)? {
            return Ok(());
        }
        self.gpu.launch_raw(&p.kernel, grid, p.threads, &params)
    }
}

impl Backend for Cuda {
    type Ptr<'a, T: PtrElem> = DevPtr<'a, T>;
    type Raw<'a> = RawDevPtr;

    fn erase<'a, T: PtrElem>(p: Self::Ptr<'a, T>) -> Self::Raw<'a> {
        p.raw()
    }

    fn launch<'a, K: Kernel>(
        &mut self,
        grid: [u32; 3],
        config: &K::Config,
        args: &K::Args<'a, Self>,
    ) -> dsl_core::Result<()>
    where
        Self: 'a,
    {
        self.run::<K>(grid, config, args).map_err(|e| e.into_dsl(K::NAME))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_follow_compute_capability() {
        assert_eq!(target_for((9, 0)), Some(Target::Sm90a));
        assert_eq!(target_for((8, 0)), Some(Target::Sm80));
        assert_eq!(target_for((8, 9)), Some(Target::Sm80));
        assert_eq!(target_for((10, 0)), Some(Target::Sm80));
        assert_eq!(target_for((7, 5)), None);
    }
}
