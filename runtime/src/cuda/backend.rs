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
//! The launch path is kept cheap because a decode step launches hundreds of
//! kernels: the specialization mask is computed from the arguments alone
//! (bit `i` set when argument `i` is a pointer or integer whose value is a
//! multiple of 16, exactly the facts [`dsl_core::launch::specialize`] acts
//! on, so the mask determines the specialization), the config's `Debug` text
//! is formatted into a reused string (its config key), and the prepared
//! kernel is found by a hash of (kernel, key, mask) and confirmed by
//! comparing the key text. Only a miss clones and specializes the IR.
//! Validation and packing write into stack arrays; the only allocation left
//! per launch is the argument vector of [`Kernel::erase_args`].
//!
//! [`Cuda::run_tuned`] autotunes kernels that declare configs and a key (see
//! [`super::autotune`]): each candidate is timed once per device, kernel, key
//! values and compiler version, and the winner is kept in memory and on disk.
//!
//! Invariant: launches are asynchronous; errors of the kernel itself surface at
//! the next synchronizing call ([`Gpu::synchronize`], a download).

use super::autotune::{self, CacheEntry, TuneKey, Tuner};
use super::buffer::{DevBuf, DevPtr};
use super::device::{Gpu, LoadedKernel};
use super::tma::{MAX_MAPS, TensorMap};
use super::validate::{KernelParam, OffsetRule, RawDevPtr, validate_args_into, validate_grid};
use crate::error::{Error, Result};
use crate::model::Device;
use codegen::{CompileOptions, Compiled, PtxCache, Target};
use dsl_core::Function;
use dsl_core::launch::{Backend, ErasedLaunch, Kernel, PerConfig, PtrElem};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// The most threads a block may have on every supported GPU.
const MAX_THREADS: u32 = 1024;

/// The most parameters a kernel may have (the specialization mask is a `u64`
/// and launches pack parameters into fixed arrays of this length).
pub const MAX_PARAMS: usize = 64;

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
    /// The kernel's name.
    pub name: &'static str,
    /// The config's `Debug` text it was built for (the lookup key; equal to
    /// [`Kernel::config_key`] unless a kernel overrides that).
    pub config_key: String,
    /// The specialization mask of the arguments it serves (see the module doc).
    pub mask: u64,
    /// The kernel calls `gdc_wait` and was compiled for sm_90a, so it may be
    /// launched overlapping the previous kernel (programmatic dependent
    /// launch).
    pub overlap: bool,
    /// The kernel waits on other programs (`wait_until`): every program of a
    /// launch must be resident at once, or a wait may never end.
    pub waits: bool,
    /// Programs one multiprocessor holds at once (queried for kernels that
    /// wait; 1 otherwise).
    pub resident: u32,
    /// For kernels with hidden tensor maps: 256 zeroed bytes that the map of
    /// an empty matrix points at (see [`super::tma`]).
    pub zeros: Option<DevBuf<u8>>,
}

impl Prepared {
    /// Encodes the hidden tensor maps of a launch with the packed `params`
    /// into `out`; returns how many.
    pub fn encode_maps(&self, params: &[KernelParam], out: &mut [TensorMap; MAX_MAPS]) -> Result<usize> {
        let specs = &self.compiled.tensor_maps;
        if specs.is_empty() {
            return Ok(0);
        }
        let zeros = self.zeros.as_ref().map_or(0, |z| z.device_addr());
        super::tma::encode_all(specs, params, zeros, out)
            .map_err(|message| Error::Launch { kernel: self.name.to_string(), message })
    }
}

/// The CUDA backend: a [`Gpu`] plus the compile and specialization caches.
pub struct Cuda {
    gpu: Gpu,
    target: Target,
    ptx: PtxCache,
    /// Built IR per (kernel, config key), before specialization.
    built: PerConfig<Function>,
    /// The PTX cache key of each built base config of an autotuned launch
    /// (per kernel and config key, as [`Cuda::built`]): [`TuneKey::code`].
    tune_codes: HashMap<(&'static str, String), String>,
    /// Compiled specializations by the hash of (kernel, config key,
    /// specialization mask); entries are confirmed against the full key.
    prepared: HashMap<u64, Vec<Arc<Prepared>>>,
    /// The config key of the launch being looked up (reused: no allocation
    /// per launch once it has grown).
    key_buf: String,
    /// Autotune results (memory and the on-disk cache).
    tuner: Tuner,
    /// Where fresh compiles are reported (see [`Cuda::set_compile_progress`]).
    progress: CompileProgress,
    /// Launch kernels that call `gdc_wait` with programmatic dependent launch
    /// (sm_90a; `TESSERA_PDL=0` turns it off, see [`pdl_enabled`]).
    overlap: bool,
}

/// Whether programmatic dependent launch is wanted: on unless the environment
/// sets `TESSERA_PDL=0` (for A/B measurements and as an escape hatch).
pub fn pdl_enabled() -> bool {
    std::env::var("TESSERA_PDL").map(|v| v.trim() != "0").unwrap_or(true)
}

/// A shared, optional progress bar that counts fresh kernel compiles (misses
/// of the memory and disk PTX caches). The owner may take the bar out (set
/// `None`) when its phase ends; later compiles are then silent.
pub type CompileProgress = std::sync::Arc<std::sync::Mutex<Option<indicatif::ProgressBar>>>;

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

/// The compile target for a device of compute capability `cc` when the
/// environment asks for `want` (`TESSERA_TARGET`, see [`target_request`]):
/// `sm_80` on any GPU of capability 8.0 or newer (Hopper runs `mma.sync`
/// PTX too, so the Ampere path can be measured there), `sm_90a` only on
/// Hopper; without a request, [`target_for`].
///
/// Errors: a text naming the request and the capability when it cannot be met.
pub fn resolve_target(cc: (i32, i32), want: Option<Target>) -> std::result::Result<Target, String> {
    let native = target_for(cc).ok_or_else(|| {
        format!("compute capability {}.{}; tessera needs 8.0 (Ampere) or newer", cc.0, cc.1)
    })?;
    match want {
        None | Some(Target::Sm80) => Ok(want.unwrap_or(native)),
        Some(Target::Sm90a) if native == Target::Sm90a => Ok(Target::Sm90a),
        Some(t) => Err(format!(
            "TESSERA_TARGET={} needs a Hopper GPU (compute capability 9.0), not {}.{}",
            t.arch(),
            cc.0,
            cc.1
        )),
    }
}

/// The target `TESSERA_TARGET` asks for: `sm_80` or `sm_90a`; unset or
/// empty: none (the device's own, [`target_for`]).
///
/// Errors: [`Error::Usage`] for any other value.
pub fn target_request(value: Option<&str>) -> Result<Option<Target>> {
    match value.map(str::trim) {
        None | Some("") => Ok(None),
        Some("sm_80") => Ok(Some(Target::Sm80)),
        Some("sm_90a") => Ok(Some(Target::Sm90a)),
        Some(other) => Err(Error::Usage(format!("TESSERA_TARGET={other}: expected sm_80 or sm_90a"))),
    }
}

impl Cuda {
    /// Opens GPU `ordinal` (see [`Gpu::new`] for the errors).
    pub fn open(ordinal: usize) -> Result<Cuda> {
        Cuda::new(Gpu::new(ordinal)?)
    }

    /// Wraps an open GPU, compiling for its target ([`target_for`]) or the
    /// one `TESSERA_TARGET` names ([`resolve_target`]: `sm_80` measures the
    /// `mma.sync` path on Hopper).
    ///
    /// Errors: [`Error::Unsupported`] for GPUs below compute capability 8.0
    /// and for `TESSERA_TARGET=sm_90a` off Hopper; [`Error::Usage`] for an
    /// unknown `TESSERA_TARGET`.
    pub fn new(gpu: Gpu) -> Result<Cuda> {
        let cc = gpu.info().compute_capability;
        let want = target_request(std::env::var("TESSERA_TARGET").ok().as_deref())?;
        let target =
            resolve_target(cc, want).map_err(|e| Error::Unsupported(format!("{}: {e}", gpu.info().name)))?;
        Ok(Cuda {
            gpu,
            target,
            ptx: PtxCache::new(),
            built: PerConfig::default(),
            tune_codes: HashMap::new(),
            prepared: HashMap::new(),
            key_buf: String::new(),
            tuner: Tuner::default(),
            progress: CompileProgress::default(),
            overlap: target == Target::Sm90a && pdl_enabled(),
        })
    }

    /// Reports every fresh kernel compile to `progress` from now on (its bar,
    /// while it holds one, advances by one per compile with the kernel's name).
    pub fn set_compile_progress(&mut self, progress: CompileProgress) {
        self.progress = progress;
    }

    /// The GPU (for buffers, timing, synchronization).
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The compile target of this device.
    pub fn target(&self) -> Target {
        self.target
    }

    /// Whether tensor-core products run on Hopper's `wgmma` (sm_90a), which
    /// prefers other tiles (`kernels::matmul::config_for`,
    /// `kernels::flash_attention::config_for`).
    pub fn wgmma(&self) -> bool {
        self.target == Target::Sm90a
    }

    /// Whether kernels that call `gdc_wait` are launched overlapping their
    /// predecessor (sm_90a unless `TESSERA_PDL=0`).
    pub fn overlaps_launches(&self) -> bool {
        self.overlap
    }

    /// Keeps autotune results in `dir` (`None`: in memory only) instead of
    /// `$TESSERA_CACHE_DIR` or `~/.cache/tessera`; forgets results in memory.
    pub fn set_autotune_dir(&mut self, dir: Option<std::path::PathBuf>) {
        self.tuner = Tuner::with_dir(dir);
    }

    /// The IR of `K` for `config` before specialization (built once per config key).
    fn built_ir<K: Kernel>(&mut self, config: &K::Config) -> Result<&Function> {
        Ok(self.built.get_or_try_insert::<K, _>(config, || K::build(config))?)
    }

    /// Builds, compiles and loads the specialization of `K` for `config`, with the
    /// parameters in `spec` promised divisible by 16 (see
    /// [`dsl_core::launch::specialize`]), or returns it from the cache.
    ///
    /// `facts[i]` is the address (pointers) or value (integer scalars) of
    /// argument `i`, `None` for other arguments.
    pub fn prepare<K: Kernel>(&mut self, config: &K::Config, facts: &[Option<u64>]) -> Result<Arc<Prepared>> {
        let mask = mask_of_facts(K::NAME, facts)?;
        self.lookup::<K>(config, mask)
    }

    /// The prepared specialization of `K` for `config` and the arguments'
    /// specialization `mask`, built on a miss.
    fn lookup<K: Kernel>(&mut self, config: &K::Config, mask: u64) -> Result<Arc<Prepared>> {
        self.key_buf.clear();
        // Writing into a String cannot fail.
        let _ = write!(self.key_buf, "{config:?}");
        let hash = prepared_hash(K::NAME, &self.key_buf, mask);
        if let Some(list) = self.prepared.get(&hash)
            && let Some(p) =
                list.iter().find(|p| p.mask == mask && p.name == K::NAME && p.config_key == self.key_buf)
        {
            return Ok(p.clone());
        }
        let p = self.build_prepared::<K>(config, mask)?;
        self.prepared.entry(hash).or_default().push(p.clone());
        Ok(p)
    }

    /// The cache miss of [`Cuda::lookup`] (whose `key_buf` holds the config's
    /// `Debug` text): specializes the built IR for `mask`, canonicalizes,
    /// verifies, compiles and loads it.
    fn build_prepared<K: Kernel>(&mut self, config: &K::Config, mask: u64) -> Result<Arc<Prepared>> {
        let config_key = self.key_buf.clone();
        let base = self.built_ir::<K>(config)?;
        // Facts that reproduce exactly the bits of `mask` (16 for a set bit,
        // 1 for a clear one): `specialize` only asks whether a fact is a
        // multiple of 16, so the result is the one the real arguments give.
        let facts: Vec<Option<u64>> =
            (0..base.params.len()).map(|i| Some(if i < 64 && mask >> i & 1 == 1 { 16 } else { 1 })).collect();
        let (mut func, _) = dsl_core::launch::specialize(base, &facts);
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
        let copts = CompileOptions::for_launch(self.target, &opts);
        let progress = &self.progress;
        let compiled = self.ptx.get_or_compile_with(&func, &copts, || {
            if let Some(bar) = progress.lock().ok().as_deref().and_then(Option::as_ref) {
                bar.set_message(format!("compiling {}", K::NAME));
                bar.inc(1);
            }
        })?;
        let kernel = self.gpu.load_kernel(&compiled.name, &compiled.ptx, compiled.shared_bytes)?;
        let offsets = OffsetRule::of(&func);
        let overlap = self.overlap && func.waits_on_grid();
        let waits = func.waits_on_programs();
        let resident = if waits { kernel.resident_per_sm(threads)?.max(1) } else { 1 };
        let zeros = if compiled.tensor_maps.is_empty() { None } else { Some(self.gpu.upload(&[0u8; 256])?) };
        Ok(Arc::new(Prepared {
            func,
            offsets,
            compiled,
            kernel,
            threads,
            name: K::NAME,
            config_key,
            mask,
            overlap,
            waits,
            resident,
            zeros,
        }))
    }

    /// How many programs of `K` with `config` and `args` the GPU holds at
    /// once (the largest grid whose programs may wait on each other).
    pub fn resident<'a, K: Kernel>(&mut self, config: &K::Config, args: &K::Args<'a, Self>) -> Result<usize>
    where
        Self: 'a,
    {
        let raw = K::erase_args(args);
        let mask = mask_of_args(K::NAME, &raw)?;
        let p = self.lookup::<K>(config, mask)?;
        let per_sm = if p.waits { p.resident } else { p.kernel.resident_per_sm(p.threads)?.max(1) };
        Ok(self.gpu.info().sm_count as usize * per_sm as usize)
    }

    /// A launch of `K` on erased arguments, with the runtime's own error
    /// type: what [`Device::run`] reaches on this device (the [`Backend`]
    /// implementation maps the error to `dsl_core`'s).
    pub(crate) fn run_erased<K: Kernel>(&mut self, launch: ErasedLaunch<'_, K, RawDevPtr>) -> Result<()> {
        let ErasedLaunch { config, grid, args: raw } = launch;
        // Specialize on what the arguments allow (16-byte aligned pointers,
        // integers divisible by 16), as Triton's launcher does.
        let mask = mask_of_args(K::NAME, &raw)?;
        let p = self.lookup::<K>(config, mask)?;
        let launch_err = |message: String| Error::Launch { kernel: K::NAME.to_string(), message };
        let mut params = [KernelParam::I32(0); MAX_PARAMS];
        let n = validate_args_into(&p.func, &p.offsets, &raw, &mut params).map_err(launch_err)?;
        if !validate_grid(grid, self.gpu.info().grid).map_err(launch_err)? {
            return Ok(());
        }
        let programs = grid.iter().map(|&g| u64::from(g)).product::<u64>();
        let sms = u64::from(self.gpu.info().sm_count);
        let resident = sms * u64::from(p.resident);
        if p.waits && programs > resident {
            // Programs that wait on each other must all be resident at once:
            // as many per multiprocessor as the occupancy calculator allows.
            return Err(launch_err(format!(
                "its programs wait on each other, so all must be resident at once: \
                 a grid of {programs} programs exceeds the {resident} the {sms} multiprocessors hold \
                 ({} each)",
                p.resident
            )));
        }
        let mut maps = [super::tma::blank(); MAX_MAPS];
        let nm = p.encode_maps(&params[..n], &mut maps)?;
        self.gpu.launch_raw(&p.kernel, grid, p.threads, &params[..n], &maps[..nm], p.overlap)
    }
}

/// The hash key of a prepared specialization.
fn prepared_hash(name: &str, config_key: &str, mask: u64) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut h);
    config_key.hash(&mut h);
    mask.hash(&mut h);
    h.finish()
}

/// The error for a kernel with more parameters than the launcher packs.
fn too_many_params(kernel: &str, n: usize) -> Error {
    Error::Launch {
        kernel: kernel.to_string(),
        message: format!("it has {n} parameters; the launcher supports at most {MAX_PARAMS}"),
    }
}

/// The specialization mask of erased arguments: bit `i` when argument `i` is
/// a pointer whose address, or an integer scalar whose value, is a multiple
/// of [`dsl_core::launch::SPECIALIZE_DIVISIBILITY`].
pub fn mask_of_args(kernel: &str, raw: &[dsl_core::launch::Arg<RawDevPtr>]) -> Result<u64> {
    if raw.len() > MAX_PARAMS {
        return Err(too_many_params(kernel, raw.len()));
    }
    let div = u64::from(dsl_core::launch::SPECIALIZE_DIVISIBILITY);
    let mut mask = 0u64;
    for (i, a) in raw.iter().enumerate() {
        if arg_fact(a).is_some_and(|v| v % div == 0) {
            mask |= 1 << i;
        }
    }
    Ok(mask)
}

/// What specialization looks at in an erased argument: a pointer's address,
/// an integer scalar's value, nothing for other scalars.
fn arg_fact(a: &dsl_core::launch::Arg<RawDevPtr>) -> Option<u64> {
    match a {
        dsl_core::launch::Arg::Ptr(p) => Some(p.addr),
        dsl_core::launch::Arg::Scalar(s) if s.dtype().is_int() => Some(s.as_i64() as u64),
        dsl_core::launch::Arg::Scalar(_) => None,
    }
}

/// The facts of erased arguments, one [`arg_fact`] each (see
/// [`Cuda::prepare`]).
pub fn facts_of_args(raw: &[dsl_core::launch::Arg<RawDevPtr>]) -> Vec<Option<u64>> {
    raw.iter().map(arg_fact).collect()
}

/// The specialization mask of `facts` (see [`Cuda::prepare`]).
fn mask_of_facts(kernel: &str, facts: &[Option<u64>]) -> Result<u64> {
    if facts.len() > MAX_PARAMS {
        return Err(too_many_params(kernel, facts.len()));
    }
    let div = u64::from(dsl_core::launch::SPECIALIZE_DIVISIBILITY);
    Ok(facts
        .iter()
        .enumerate()
        .filter(|(_, f)| f.is_some_and(|v| v % div == 0))
        .fold(0, |m, (i, _)| m | 1 << i))
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
        let family = K::config_key(base);
        let code_key = (K::NAME, family.clone());
        if !self.tune_codes.contains_key(&code_key) {
            let opts = K::launch_options(base);
            let copts = CompileOptions::for_launch(self.target, &opts);
            let code = PtxCache::key(self.built_ir::<K>(base)?, &copts);
            self.tune_codes.insert(code_key.clone(), code);
        }
        let params: Vec<String> = self.built_ir::<K>(base)?.params.iter().map(|p| p.name.clone()).collect();
        let info = self.gpu.info();
        let key = TuneKey {
            device: info.name.clone(),
            compute_capability: info.compute_capability,
            kernel: K::NAME.to_string(),
            family,
            key: autotune::key_values(K::NAME, K::autotune_key(), &params, &raw)?,
            compiler: autotune::compiler_version(),
            code: self.tune_codes[&code_key].clone(),
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
                Ok(ms) => {
                    if autotune::verbose() {
                        eprintln!(
                            "autotune {}: {} {ms:.4} ms",
                            K::NAME,
                            autotune::describe_config(candidates, c)
                        );
                    }
                    medians.push(Some(ms))
                }
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

    fn launch_erased<'a, K: Kernel>(&mut self, launch: ErasedLaunch<'_, K, RawDevPtr>) -> dsl_core::Result<()>
    where
        Self: 'a,
    {
        self.run_erased(launch).map_err(|e| e.into_dsl(K::NAME))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `out[i] = x[i] * s` for `i < n`, with an `i1` flag (never specialized).
    #[dsl_macros::kernel]
    fn scaled(x: Ptr<f32>, out: Ptr<f32>, n: i32, m: i64, s: f32, flag: bool, #[constexpr] BLOCK: usize) {
        let offs = program_id(0) * BLOCK + arange(0, BLOCK);
        let mask = offs < n && offs.to(i64) < m && flag;
        store(out + offs, load(x + offs, mask = mask) * s, mask = mask);
    }

    #[test]
    fn the_argument_mask_determines_the_specialization() {
        use dsl_core::launch::{Arg, specialize};
        use dsl_core::{DType, Scalar};
        let base = scaled::build(&scaled::Config::new(128)).unwrap();
        let ptr = |addr| Arg::Ptr(RawDevPtr { addr, bytes: 4096, dtype: Some(DType::F32) });
        let cases = [
            [ptr(0x1000), ptr(0x2004), Arg::Scalar(Scalar::int(DType::I32, 48))],
            [ptr(0x1008), ptr(0x2000), Arg::Scalar(Scalar::int(DType::I32, -32))],
            [ptr(0x1004), ptr(0x2008), Arg::Scalar(Scalar::int(DType::I32, 7))],
        ];
        for (k, head) in cases.iter().enumerate() {
            let mut raw = head.to_vec();
            raw.push(Arg::Scalar(Scalar::int(DType::I64, 16 * k as i64)));
            raw.push(Arg::Scalar(Scalar::float(DType::F32, 32.0)));
            raw.push(Arg::Scalar(Scalar::bool(false)));
            let facts = facts_of_args(&raw);
            let mask = mask_of_args("scaled", &raw).unwrap();
            assert_eq!(mask, mask_of_facts("scaled", &facts).unwrap());
            let synthetic: Vec<Option<u64>> =
                (0..raw.len()).map(|i| Some(if mask >> i & 1 == 1 { 16 } else { 1 })).collect();
            let (real, _) = specialize(&base, &facts);
            let (from_mask, _) = specialize(&base, &synthetic);
            assert_eq!(dsl_core::print::print(&real), dsl_core::print::print(&from_mask), "case {k}");
        }
        assert!(mask_of_facts("k", &[None; MAX_PARAMS + 1]).is_err());
    }

    #[test]
    fn a_requested_target_is_met_or_refused() {
        assert_eq!(target_request(None).unwrap(), None);
        assert_eq!(target_request(Some(" ")).unwrap(), None);
        assert_eq!(target_request(Some("sm_80")).unwrap(), Some(Target::Sm80));
        assert_eq!(target_request(Some("sm_90a")).unwrap(), Some(Target::Sm90a));
        let e = target_request(Some("sm_90")).unwrap_err().to_string();
        assert!(e.contains("TESSERA_TARGET=sm_90") && e.contains("sm_80 or sm_90a"), "{e}");
        assert_eq!(resolve_target((9, 0), None), Ok(Target::Sm90a));
        assert_eq!(resolve_target((9, 0), Some(Target::Sm80)), Ok(Target::Sm80));
        assert_eq!(resolve_target((8, 0), Some(Target::Sm80)), Ok(Target::Sm80));
        assert_eq!(resolve_target((9, 0), Some(Target::Sm90a)), Ok(Target::Sm90a));
        let e = resolve_target((8, 6), Some(Target::Sm90a)).unwrap_err();
        assert!(e.contains("needs a Hopper GPU") && e.contains("8.6"), "{e}");
        let e = resolve_target((7, 5), Some(Target::Sm80)).unwrap_err();
        assert!(e.contains("7.5") && e.contains("8.0 (Ampere)"), "{e}");
    }

    #[test]
    fn targets_follow_compute_capability() {
        assert_eq!(target_for((9, 0)), Some(Target::Sm90a));
        assert_eq!(target_for((8, 0)), Some(Target::Sm80));
        assert_eq!(target_for((8, 9)), Some(Target::Sm80));
        assert_eq!(target_for((10, 0)), Some(Target::Sm80));
        assert_eq!(target_for((7, 5)), None);
    }
}
