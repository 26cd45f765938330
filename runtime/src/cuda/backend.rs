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
//! [`Cuda::run_tuned`] autotunes kernels that declare configs and a key (see
//! [`super::autotune`]): each candidate is timed once per device, kernel, key
//! values and compiler version, and the winner is kept in memory and on disk.
//!
//! Invariant: launches are asynchronous; errors of the kernel itself surface at
//! the next synchronizing call ([`Gpu::synchronize`], a download).

use super::autotune::{self, CacheEntry, TuneKey, Tuner};
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
    /// Autotune results (memory and the on-disk cache).
    tuner: Tuner,
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
        Ok(Cuda {
            gpu,
            target,
            ptx: PtxCache::new(),
            built: HashMap::new(),
            prepared: HashMap::new(),
            tuner: Tuner::default(),
        })
    }

    /// The GPU (for buffers, timing, synchronization).
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The compile target of this device.
    pub fn target(&self) -> Target {
        self.target
    }

    /// Keeps autotune results in `dir` (`None`: in memory only) instead of
    /// `$TESSERA_CACHE_DIR` or `~/.cache/tessera`; forgets results in memory.
    pub fn set_autotune_dir(&mut self, dir: Option<std::path::PathBuf>) {
        self.tuner = Tuner::with_dir(dir);
    }

    /// The IR of `K` for `config` before specialization (built once per config key).
    fn built_ir<K: Kernel>(&mut self, config: &K::Config) -> Result<&Function> {
        let ckey = (K::NAME, K::config_key(config));
        if !self.built.contains_key(&ckey) {
            let func = K::build(config)?;
            self.built.insert(ckey.clone(), func);
        }
        Ok(&self.built[&ckey])
    }

    /// Builds, compiles and loads the specialization of `K` for `config`, with the
    /// parameters in `spec` promised divisible by 16 (see
    /// [`dsl_core::launch::specialize`]), or returns it from the cache.
    pub fn prepare<K: Kernel>(&mut self, config: &K::Config, facts: &[Option<u64>]) -> Result<Arc<Prepared>> {
        let ckey = (K::NAME, K::config_key(config));
        let base = self.built_ir::<K>(config)?;
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

impl Cuda {
    /// Runs `K` with the best of its declared autotune configs for these
    /// arguments and returns that config. `grid_fn` gives the grid of a config
    /// (it may depend on block sizes); `base` fixes what the configs leave open.
    ///
    /// The key is the device, the kernel, the values of the kernel's
    /// [`Kernel::autotune_key`] parameters, the compiler version and the config
    /// key of `base` (see [`TuneKey`]). On a miss (in memory, then in the cache
    /// file) every candidate of [`Kernel::autotune_configs`] is compiled, run
    /// [`autotune::WARMUP`] times, then timed [`autotune::RUNS`] times with CUDA
    /// events after an L2 flush each (as `tessera bench` does); the smallest
    /// median wins, is stored, and a note goes to stderr. A candidate that
    /// fails to compile or launch is skipped with a note. Kernels that declare
    /// no configs run `base`; a single candidate runs without timing.
    ///
    /// Candidates run on `args` while they are timed: kernels that update their
    /// inputs in place see their own output.
    ///
    /// Errors: a key name that is not a scalar parameter ([`Error::Launch`]);
    /// the first candidate's error when every candidate fails; errors of the
    /// final launch.
    pub fn run_tuned<'a, K: Kernel>(
        &mut self,
        grid_fn: impl Fn(&K::Config) -> [u32; 3],
        base: &K::Config,
        args: &K::Args<'a, Self>,
    ) -> Result<K::Config>
    where
        Self: 'a,
    {
        let candidates = K::autotune_configs(base);
        if candidates.len() <= 1 {
            let config = candidates.into_iter().next().unwrap_or_else(|| base.clone());
            self.run::<K>(grid_fn(&config), &config, args)?;
            return Ok(config);
        }
        let raw = K::erase_args(args);
        let params: Vec<String> = self.built_ir::<K>(base)?.params.iter().map(|p| p.name.clone()).collect();
        let info = self.gpu.info();
        let key = TuneKey {
            device: info.name.clone(),
            compute_capability: info.compute_capability,
            kernel: K::NAME.to_string(),
            family: K::config_key(base),
            key: autotune::key_values(K::NAME, K::autotune_key(), &params, &raw)?,
            compiler: autotune::compiler_version(),
        };
        let cache_key = key.cache_key();
        let cached = self
            .tuner
            .lookup(&cache_key)
            .and_then(|stored| candidates.iter().find(|c| K::config_key(c) == stored).cloned());
        let winner = match cached {
            Some(c) => c,
            None => {
                self.tuner.forget(&cache_key);
                self.tune::<K>(&grid_fn, &candidates, args, &key, &cache_key)?
            }
        };
        self.run::<K>(grid_fn(&winner), &winner, args)?;
        Ok(winner)
    }

    /// Times every candidate and stores the winner under `cache_key`.
    fn tune<'a, K: Kernel>(
        &mut self,
        grid_fn: &impl Fn(&K::Config) -> [u32; 3],
        candidates: &[K::Config],
        args: &K::Args<'a, Self>,
        key: &TuneKey,
        cache_key: &str,
    ) -> Result<K::Config>
    where
        Self: 'a,
    {
        let mut medians = Vec::with_capacity(candidates.len());
        let mut first_err = None;
        for c in candidates {
            let grid = grid_fn(c);
            let timed = crate::bench::time_median_ms(self, autotune::WARMUP, autotune::RUNS, |cuda| {
                cuda.run::<K>(grid, c, args)
            });
            match timed {
                Ok(ms) => medians.push(Some(ms)),
                Err(e) => {
                    eprintln!(
                        "autotune {}: skipping {}: {e}",
                        K::NAME,
                        autotune::describe_config(candidates, c)
                    );
                    first_err.get_or_insert(e);
                    medians.push(None);
                }
            }
        }
        let Some(w) = autotune::choose_winner(&medians) else {
            return Err(first_err.unwrap_or_else(|| Error::Launch {
                kernel: K::NAME.into(),
                message: "no autotune config could be timed".into(),
            }));
        };
        let ms = medians[w].unwrap_or(f64::NAN);
        let winner = candidates[w].clone();
        let failed = medians.iter().filter(|m| m.is_none()).count();
        eprintln!(
            "{}",
            autotune::tune_note(
                key,
                &autotune::describe_config(candidates, &winner),
                ms,
                candidates.len(),
                failed
            )
        );
        self.tuner.store(cache_key, CacheEntry { config: K::config_key(&winner), ms });
        Ok(winner)
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
