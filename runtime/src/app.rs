//! Start-up shared by the commands that run a model (`generate`, `chat`,
//! `parity`, the model benchmark): open and validate the GGUF, build the
//! tokenizer and chat template, pick the device (the GPU when one is usable,
//! otherwise the native CPU backend, saying so; the interpreter on request),
//! compute and print the memory plan, load the weights and build the
//! [`Engine`].
//!
//! The engine's type depends on the device and the activation dtype, so a
//! command is an [`EngineTask`], a generic function the loader calls with the
//! concrete engine ([`run_task`]).
//!
//! Activation and KV-cache dtype (`--dtype auto`, the default): bf16 on the
//! GPU (half the activation and KV traffic of f32), f32 on the native CPU
//! backend and the interpreter; `--dtype f32` or `--dtype bf16` forces one
//! (the interpreter runs f32 only).

use crate::chat::ChatTemplate;
use crate::cuda::{CompileProgress, Cuda};
use crate::engine::{Engine, Request};
use crate::error::{Error, Result};
use crate::gguf::{Gguf, LlamaConfig, Vocab};
use crate::memory_plan::{Bytes, KvShape, MemoryPlan, MemoryPlanInputs};
use crate::model::ActElem;
use crate::model::mega::DecodePath;
use crate::model::{Device, KvCacheDtype, Model, Weights};
use crate::tokenizer::Tokenizer;
use codegen::host::Host;
use dsl_core::half::bf16;
use dsl_core::interp::Cpu;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The bundled reference model, relative to the workspace root.
pub const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// Which device to run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceChoice {
    /// The GPU when one is usable, otherwise the native CPU backend.
    Auto,
    /// The GPU (an error when none is usable).
    Gpu,
    /// The native CPU backend: the kernels compiled by LLVM for this CPU.
    Cpu,
    /// The CPU interpreter (the semantic oracle: checks bounds and races;
    /// orders of magnitude slower).
    Interp,
}

/// Activation and KV-cache dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DtypeChoice {
    /// bf16 on the GPU, f32 on the CPU backends. Both meet the golden
    /// parity rules on SmolLM2; bf16 halves the activation and KV traffic,
    /// which decode on the GPU is bound by.
    Auto,
    /// 32-bit floats.
    F32,
    /// bfloat16 (the GPU or the native CPU backend).
    Bf16,
}

impl DtypeChoice {
    /// The dtype this choice runs on a GPU (`gpu`) or a CPU backend:
    /// `Auto` resolved, the others as given.
    pub fn resolve(self, gpu: bool) -> DtypeChoice {
        match self {
            DtypeChoice::Auto if gpu => DtypeChoice::Bf16,
            DtypeChoice::Auto => DtypeChoice::F32,
            d => d,
        }
    }
}

/// How to load the model and size the engine.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// The GGUF file.
    pub model: PathBuf,
    /// The device.
    pub device: DeviceChoice,
    /// The activation dtype.
    pub dtype: DtypeChoice,
    /// Sequences running at once.
    pub max_num_seqs: usize,
    /// Longest sequence (prompt plus output); 0 means the model's context
    /// length, capped at 2048.
    pub max_model_len: usize,
    /// Token budget of one step.
    pub max_num_batched_tokens: usize,
    /// Tokens per KV block (16, 32 or 64).
    pub block_size: usize,
    /// A cap on the KV blocks (default: enough for every sequence at full
    /// length, within memory).
    pub max_blocks: Option<usize>,
    /// Reuse full KV blocks across requests with the same prefix.
    pub prefix_caching: bool,
    /// Print the device notice and the memory plan to stderr.
    pub verbose: bool,
    /// Speculative decoding (off when `None`; see [`crate::spec::cli`]).
    pub speculation: Option<crate::spec::cli::Speculation>,
    /// The batch-invariant arrangement of every step (the default; see
    /// [`crate::model::layers`]): a request's tokens and logprobs do not
    /// depend on what else runs with it.
    pub batch_invariance: bool,
    /// Which decode steps run as one persistent kernel.
    pub decode_path: DecodePath,
    /// What the KV cache stores.
    pub kv_cache_dtype: KvCacheDtype,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            model: PathBuf::from(DEFAULT_MODEL),
            device: DeviceChoice::Auto,
            dtype: DtypeChoice::Auto,
            max_num_seqs: 64,
            max_model_len: 0,
            max_num_batched_tokens: 2048,
            block_size: 16,
            max_blocks: None,
            prefix_caching: true,
            verbose: true,
            speculation: None,
            batch_invariance: true,
            decode_path: DecodePath::default(),
            kv_cache_dtype: KvCacheDtype::Auto,
        }
    }
}

/// What a task sees besides the engine.
pub struct Context {
    /// The model's hyperparameters.
    pub config: LlamaConfig,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
    /// The chat template, when the model has one.
    pub template: Option<ChatTemplate>,
    /// The memory plan the engine was sized by.
    pub plan: MemoryPlan,
    /// A one-line description of the device.
    pub device: String,
    /// Whether the device is a GPU.
    pub is_gpu: bool,
}

/// What an [`EngineTask`] runs with: the device, the engine loaded on it
/// and the model's [`Context`].
pub struct Session<'a, D: Device, T: ActElem> {
    /// The device.
    pub dev: &'a mut D,
    /// The engine.
    pub engine: &'a mut Engine<D, T>,
    /// What the task sees besides the engine.
    pub ctx: &'a Context,
}

/// A command that runs on a loaded engine, whatever its device and dtype.
pub trait EngineTask {
    /// What the task returns.
    type Output;
    /// Runs the task.
    fn run<D: Device, T: ActElem>(self, s: Session<'_, D, T>) -> Result<Self::Output>;
}

/// The model path as given, or, for the default relative path, found from
/// the current directory or the workspace root of this build.
pub fn resolve_model(path: &Path) -> PathBuf {
    if path.is_file() || path.is_absolute() {
        return path.to_path_buf();
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
    if root.is_file() { root } else { path.to_path_buf() }
}

/// The most sequences at once the loader accepts.
pub const MAX_NUM_SEQS: usize = 1 << 16;
/// The longest sequence the loader accepts (tokens).
pub const MAX_MODEL_LEN: usize = 1 << 24;
/// The largest step token budget the loader accepts.
pub const MAX_BATCHED_TOKENS: usize = 1 << 20;
/// The most KV blocks the loader accepts.
pub const MAX_KV_BLOCKS: usize = 1 << 26;

impl LoadOptions {
    /// Checks the sizes before anything is computed from them: a usage error
    /// naming the flag for a block size other than 16, 32 or 64, no
    /// sequences, no KV blocks, or a size beyond the loader's limits (whose
    /// products could otherwise overflow).
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::Usage(msg));
        if ![16, 32, 64].contains(&self.block_size) {
            return bad(format!("--block-size must be 16, 32 or 64, not {}", self.block_size));
        }
        if !(1..=MAX_NUM_SEQS).contains(&self.max_num_seqs) {
            return bad(format!("--max-num-seqs must be 1..={MAX_NUM_SEQS}, not {}", self.max_num_seqs));
        }
        if self.max_model_len > MAX_MODEL_LEN {
            return bad(format!(
                "--max-model-len must be at most {MAX_MODEL_LEN} (0: the model's context), not {}",
                self.max_model_len
            ));
        }
        if self.max_num_batched_tokens > MAX_BATCHED_TOKENS {
            return bad(format!(
                "--max-num-batched-tokens must be at most {MAX_BATCHED_TOKENS}, not {}",
                self.max_num_batched_tokens
            ));
        }
        if let Some(b) = self.max_blocks.filter(|b| !(1..=MAX_KV_BLOCKS).contains(b)) {
            return bad(format!("--kv-blocks must be 1..={MAX_KV_BLOCKS}, not {b}"));
        }
        Ok(())
    }
}

impl LoadOptions {
    /// The bundled model on the native CPU backend for the real-model tests
    /// (and the GPU's structured-output matrix, with the device changed):
    /// 4 sequences of up to `max_model_len` tokens in `blocks` KV blocks,
    /// quiet.
    pub(crate) fn native_test(max_model_len: usize, blocks: usize) -> LoadOptions {
        LoadOptions {
            device: DeviceChoice::Cpu,
            max_num_seqs: 4,
            max_model_len,
            max_blocks: Some(blocks),
            verbose: false,
            ..LoadOptions::default()
        }
    }
}

/// Loads the model per `opts` and runs `task` on it.
pub fn run_task<K: EngineTask>(opts: &LoadOptions, task: K) -> Result<K::Output> {
    opts.validate()?;
    let path = resolve_model(&opts.model);
    if !path.is_file() {
        return Err(Error::Usage(format!(
            "model file {} not found (fetch the bundled model with `make model`, or pass --model PATH)",
            path.display()
        )));
    }
    let gguf = Gguf::open(&path)?;
    let config = LlamaConfig::from_metadata(gguf.metadata())?;
    let vocab = Vocab::from_metadata(gguf.metadata())?;
    let tokenizer = Tokenizer::from_vocab(&vocab)?;
    let template = ChatTemplate::from_vocab(&vocab).ok();
    let (device, notice) = match opts.device {
        DeviceChoice::Interp => {
            (Picked::Interp, "running on the CPU interpreter (--device interp; slow)".to_string())
        }
        DeviceChoice::Cpu => {
            let host = Host::new();
            let n = format!("running on the {} (--device cpu)", host.describe());
            (Picked::Host(host), n)
        }
        DeviceChoice::Gpu => {
            let cuda = Cuda::open(0)?;
            let n = format!("running on {}", Device::describe(&cuda));
            (Picked::Cuda(Box::new(cuda)), n)
        }
        DeviceChoice::Auto => match Cuda::open(0) {
            Ok(cuda) => {
                let n = format!("running on {}", Device::describe(&cuda));
                (Picked::Cuda(Box::new(cuda)), n)
            }
            Err(e) => {
                let host = Host::new();
                let n = format!("no usable GPU ({e}); running on the {}", host.describe());
                (Picked::Host(host), n)
            }
        },
    };
    let dtype = opts.dtype.resolve(matches!(device, Picked::Cuda(_)));
    if opts.verbose {
        let name = if dtype == DtypeChoice::Bf16 { "bf16" } else { "f32" };
        eprintln!("tessera: {notice}, {name} activations");
    }
    let parts_progress = CompileProgress::default();
    let parts = Parts { gguf: &gguf, config, tokenizer, template, compiles: parts_progress.clone() };
    // The GPU plans with 90% of its memory; the CPU backends with a fixed
    // host budget (every cache block costs time to clear).
    match (device, dtype) {
        (Picked::Cuda(mut cuda), dtype) => {
            cuda.set_compile_progress(parts_progress.clone());
            let available = (cuda.gpu().info().total_mem as u64) / 10 * 9;
            match dtype {
                DtypeChoice::F32 => {
                    let install = crate::spec::cli::install::<Cuda, f32>;
                    load::<Cuda, f32, K>(&mut cuda, parts, Some(available), opts, task, install)
                }
                DtypeChoice::Auto | DtypeChoice::Bf16 => {
                    let install = crate::spec::cli::install::<Cuda, bf16>;
                    load::<Cuda, bf16, K>(&mut cuda, parts, Some(available), opts, task, install)
                }
            }
        }
        (Picked::Host(mut host), dtype) => {
            let progress = parts_progress.clone();
            host.set_compile_hook(Some(Box::new(move |name: &str| {
                if let Some(bar) = progress.lock().ok().as_deref().and_then(Option::as_ref) {
                    bar.set_message(format!("compiling {name}"));
                    bar.inc(1);
                }
            })));
            match dtype {
                DtypeChoice::Bf16 => {
                    let install = crate::spec::cli::install::<Host, bf16>;
                    load::<Host, bf16, K>(&mut host, parts, None, opts, task, install)
                }
                DtypeChoice::Auto | DtypeChoice::F32 => {
                    let install = crate::spec::cli::install::<Host, f32>;
                    load::<Host, f32, K>(&mut host, parts, None, opts, task, install)
                }
            }
        }
        (Picked::Interp, DtypeChoice::Auto | DtypeChoice::F32) => {
            let install = crate::spec::cli::install::<Cpu, f32>;
            load::<Cpu, f32, K>(&mut Cpu::new(), parts, None, opts, task, install)
        }
        (Picked::Interp, DtypeChoice::Bf16) => Err(Error::Usage(
            "--dtype bf16 needs the GPU or the native CPU backend; the interpreter runs f32".into(),
        )),
    }
}

/// The device [`run_task`] chose.
enum Picked {
    Cuda(Box<Cuda>),
    Host(Host),
    Interp,
}

/// Device-side bytes of the weights, for the memory plan: every matrix as
/// repacked (still quantized, but the byte formats at one byte per weight,
/// so a Q6_K or Q5_0 matrix takes more than its GGUF bytes), a Q8_0 token
/// table as stored plus its repacked copy as the tied LM head, vectors as
/// stored.
fn weight_bytes(gguf: &Gguf) -> u64 {
    let tied = gguf.tensors().iter().all(|t| t.name != "output.weight");
    let repacked = |t: &crate::gguf::TensorInfo| match (t.ty.quant_format(), t.dims.as_slice()) {
        (Some(f), &[k, n]) => Some(f.repacked_bytes(n as usize, k as usize) as u64),
        _ => None,
    };
    let mut total = 0;
    for t in gguf.tensors() {
        let stored = t.n_bytes().unwrap_or(0);
        total += match repacked(t) {
            // A Q8_0 table is gathered as stored, and repacked again as a tied
            // head; any other table is repacked once (a tied head shares it).
            Some(r) if t.name == "token_embd.weight" && t.ty == crate::gguf::GgmlType::Q8_0 => {
                stored + if tied { r } else { 0 }
            }
            // The matrices, repacked (byte formats take one byte per weight).
            Some(r) => r,
            None => stored,
        };
    }
    // Vectors (norm weights, biases) are held as stored or narrower.
    total
}

/// Bytes of the forward's scratch buffers at the largest step.
fn workspace_bytes(c: &LlamaConfig, opts: &LoadOptions, elem: u64) -> u64 {
    let tokens = opts.max_num_batched_tokens as u64;
    let per_token = (5 * c.n_embd + c.n_embd + 2 * c.n_embd_kv() + 2 * c.n_ff) as u64;
    let rows = opts.max_num_seqs as u64;
    // Per sampled row and vocabulary entry, 4-byte words: the eager set's
    // logits, sampling workspace and f32 logits (3), the decode graphs' fixed
    // set of the same (3), and the prompt/output penalty counts (2).
    let per_row = c.vocab_size as u64 * 4 * 8;
    // The graphs' fixed activation set holds one token per row.
    (tokens + rows) * per_token * elem + rows * per_row
}

/// What the loader read from the GGUF.
struct Parts<'g> {
    gguf: &'g Gguf,
    config: LlamaConfig,
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
    /// The GPU backend's compile reporter (unused on the CPU).
    compiles: CompileProgress,
}

/// A progress bar on stderr (drawn only when stderr is a terminal, and only
/// when `verbose`).
fn bar(verbose: bool, len: Option<u64>, what: &str) -> ProgressBar {
    if !verbose {
        return ProgressBar::hidden();
    }
    let (bar, template) = match len {
        Some(n) => (ProgressBar::new(n), "tessera: {prefix} [{bar:32}] {pos}/{len} {msg}"),
        None => (ProgressBar::new_spinner(), "tessera: {prefix} {spinner} {pos} {msg}"),
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(what.to_string());
    bar
}

/// Runs one short greedy request through `engine` (prefill, then a decode
/// step) so the kernels a first request needs are compiled, or read from the
/// compile cache, before the task starts; a progress bar counts fresh
/// compiles.
fn warm_up<D: Device, T: ActElem>(
    dev: &mut D,
    engine: &mut Engine<D, T>,
    compiles: &CompileProgress,
    verbose: bool,
) -> Result<()> {
    let spinner = bar(verbose, None, "kernels");
    spinner.enable_steady_tick(std::time::Duration::from_millis(100));
    if let Ok(mut slot) = compiles.lock() {
        *slot = Some(spinner.clone());
    }
    let t0 = Instant::now();
    let req = Request::greedy((0..4).collect(), 2);
    let run = engine.add(req).and_then(|_| {
        while engine.has_unfinished() {
            engine.step(dev)?;
        }
        Ok(())
    });
    engine.take_completions();
    let compiled = spinner.position();
    spinner.finish_and_clear();
    if let Ok(mut slot) = compiles.lock() {
        *slot = None;
    }
    run?;
    if verbose {
        eprintln!(
            "tessera: kernels ready in {:.2} s ({compiled} compiled, the rest from the compile cache)",
            t0.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// Builds the speculation an engine gets from [`LoadOptions::speculation`]
/// (see [`crate::spec::cli::install`]); instantiated per concrete device and
/// dtype by [`run_task`].
type Install<D, T> =
    fn(&mut D, &mut Engine<D, T>, &Gguf, &crate::spec::cli::Speculation, &LoadOptions, bool) -> Result<()>;

/// Plans the memory of `gguf`'s model (`config`) on `dev`, loads its weights
/// in dtype `T` and builds its engine per `opts`; `gpu_memory` is the GPU's
/// plannable memory (`None` on the CPU). Prints the plan and the load time
/// when `opts.verbose`.
pub fn build_engine<D: Device, T: ActElem>(
    dev: &mut D,
    gguf: &Gguf,
    config: &LlamaConfig,
    gpu_memory: Option<u64>,
    opts: &LoadOptions,
) -> Result<(Engine<D, T>, MemoryPlan)> {
    opts.validate()?;
    let elem = std::mem::size_of::<T>() as u64;
    let is_gpu = gpu_memory.is_some();
    let max_model_len =
        if opts.max_model_len == 0 { config.context_length.min(2048) } else { opts.max_model_len };
    let weights = weight_bytes(gguf);
    let available = gpu_memory.unwrap_or(1 << 30);
    let per_seq_blocks = max_model_len.div_ceil(opts.block_size);
    let want_blocks = opts.max_blocks.unwrap_or(per_seq_blocks * opts.max_num_seqs);
    let inputs = MemoryPlanInputs {
        kv: KvShape {
            fp8: opts.kv_cache_dtype == KvCacheDtype::Fp8,
            ..KvShape::from_llama(config, elem as usize)
        },
        weight_bytes: weights,
        workspace_bytes: workspace_bytes(config, opts, elem),
        available_bytes: available,
        reserve_bytes: if is_gpu { 1 << 30 } else { 256 << 20 },
        block_size: opts.block_size,
        max_num_seqs: opts.max_num_seqs,
        max_model_len,
        max_blocks: Some(want_blocks.max(per_seq_blocks)),
    };
    let plan = MemoryPlan::new(inputs)?;
    if opts.verbose {
        eprintln!("{plan}");
    }
    let t0 = Instant::now();
    let loading = bar(opts.verbose, Some(config.n_layers as u64 + 1), "weights");
    let w = Weights::<D, T>::load_with_progress(dev, gguf, &mut |done, _| loading.set_position(done as u64));
    loading.finish_and_clear();
    let mut model = Model::with_kv_cache(dev, w?, plan.num_blocks, opts.block_size, opts.kv_cache_dtype)?;
    model.set_batch_invariance(opts.batch_invariance);
    model.set_decode_path(opts.decode_path)?;
    if opts.verbose {
        eprintln!(
            "tessera: loaded {} ({} weights) in {:.2} s",
            gguf_name(gguf),
            Bytes(weights),
            t0.elapsed().as_secs_f64()
        );
    }
    let sched =
        plan.scheduler_config(opts.max_num_batched_tokens.max(opts.max_num_seqs), opts.prefix_caching);
    Ok((Engine::new(model, sched)?, plan))
}

/// Loads the weights on `dev` in dtype `T`, builds the engine (with the
/// speculation `install` sets up, when asked for) and runs the task;
/// `gpu_memory` is the GPU's plannable memory (`None` on the CPU).
fn load<D: Device, T: ActElem, K: EngineTask>(
    dev: &mut D,
    parts: Parts<'_>,
    gpu_memory: Option<u64>,
    opts: &LoadOptions,
    task: K,
    install: Install<D, T>,
) -> Result<K::Output> {
    let Parts { gguf, config, tokenizer, template, compiles } = parts;
    let is_gpu = gpu_memory.is_some();
    let (mut engine, plan) = build_engine::<D, T>(dev, gguf, &config, gpu_memory, opts)?;
    // Compiled backends compile (or load from the cache) before the task;
    // the interpreter has nothing to compile.
    if dev.compiles() {
        warm_up(dev, &mut engine, &compiles, opts.verbose)?;
    }
    if let Some(spec) = &opts.speculation {
        install(dev, &mut engine, gguf, spec, opts, is_gpu)?;
    }
    let ctx = Context { config, tokenizer, template, plan, device: dev.describe(), is_gpu };
    let out = task.run(Session { dev, engine: &mut engine, ctx: &ctx });
    if let Some(spec) = opts.speculation.as_ref().filter(|_| opts.verbose && out.is_ok()) {
        eprintln!("tessera: {}", crate::spec::cli::summary(spec, &engine.spec_stats()));
    }
    out
}

/// The model's name from its metadata, or "the model".
fn gguf_name(gguf: &Gguf) -> String {
    gguf.metadata().get_str("general.name").ok().flatten().unwrap_or("the model").to_string()
}

#[cfg(test)]
mod tests {
    use super::DtypeChoice::{self, Auto, Bf16, F32};

    /// The memory plan's weight estimate is the repacked size: Q4_1 20 and
    /// Q8_0 34 bytes per 32 weights, a Q8_0 table counted twice when tied
    /// (gathered raw, repacked as the head) and a Q4_1 one once (shared).
    #[test]
    fn weight_bytes_count_the_repacked_planes() {
        use crate::gguf::tiny::TinyLlama;
        use crate::gguf::{GgmlType, Gguf};
        let base = crate::check::model::tiny_llama();
        let c = base.config.clone();
        let (e, f, v) = (c.n_embd, c.n_ff, c.vocab_size);
        let (q, kv) = (c.n_head * c.head_dim, c.n_head_kv * c.head_dim);
        // f32 attention and MLP norms per layer, and the output norm.
        let vectors = c.n_layers * 2 * 4 * e + 4 * e;
        let per_layer =
            |qk: usize, vb: usize| (q + kv) * e / 32 * qk + kv * e / 32 * vb + (q * e + 3 * f * e) / 32 * qk;
        let cases = [
            // Q4_1 matrices, a tied Q8_0 table: stored once, repacked once.
            (base.clone(), c.n_layers * per_layer(20, 20) + 2 * (v * e / 32 * 34)),
            // V in Q8_0, a tied Q4_1 table (the head's planes).
            (
                TinyLlama {
                    matrix_types: vec![("attn_v".into(), GgmlType::Q8_0)],
                    embedding_type: GgmlType::Q4_1,
                    ..base
                },
                c.n_layers * per_layer(20, 34) + v * e / 32 * 20,
            ),
        ];
        for (i, (t, matrices)) in cases.into_iter().enumerate() {
            let g = Gguf::from_bytes(t.to_bytes().unwrap()).unwrap();
            assert_eq!(super::weight_bytes(&g), (matrices + vectors) as u64, "case {i}");
        }
    }

    #[test]
    fn auto_is_bf16_on_the_gpu_and_f32_on_the_interpreter() {
        let cases: [(DtypeChoice, bool, DtypeChoice); 6] = [
            (Auto, true, Bf16),
            (Auto, false, F32),
            (F32, true, F32),
            (F32, false, F32),
            (Bf16, true, Bf16),
            (Bf16, false, Bf16),
        ];
        for (choice, gpu, want) in cases {
            assert_eq!(choice.resolve(gpu), want, "{choice:?} on gpu={gpu}");
        }
    }
}
