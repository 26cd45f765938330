//! The `tessera` command line: argument definitions (clap derive) and the
//! subcommands' implementations. `main.rs` only parses and calls [`run`].
//!
//! Invariants: user input never panics (bad names, files and shapes are
//! [`Error::Usage`]); a missing GPU or driver is a one-line error, not a crash;
//! the exit status is 0 on success, 1 on errors and failed checks.

use crate::app::{self, DeviceChoice, DtypeChoice, LoadOptions};
use crate::bench::{self, BenchOptions, Peers};
use crate::check;
use crate::cuda::Cuda;
use crate::error::{Error, Result};
use crate::generate::{Chat, Generate};
use crate::model::mega::DecodePath;
use crate::model::sampler::SamplingParams;
use crate::parity::{Golden, Parity};
use crate::registry;
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// tessera: a Triton-style GPU kernel DSL in Rust.
#[derive(Debug, Parser)]
#[command(name = "tessera", version)]
pub struct Cli {
    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List kernels or dump their IR, LLVM IR and PTX.
    Kernels {
        /// What to do with the kernels.
        #[command(subcommand)]
        action: KernelsAction,
    },
    /// Run every registered kernel on the GPU and on the CPU interpreter and
    /// compare (exits non-zero on any mismatch).
    GpuCheck(GpuCheckArgs),
    /// Run every registered kernel on the native CPU backend and on the CPU
    /// interpreter and compare (exits non-zero on any mismatch).
    HostCheck(HostCheckArgs),
    /// Measure kernel throughput on the GPU (softmax, add+RMSNorm and the copy ceiling).
    Bench(BenchArgs),
    /// Generate text from prompts (one continuous batch; a single prompt streams).
    Generate(GenerateArgs),
    /// Chat interactively with the model's chat template.
    Chat(ChatArgs),
    /// Check golden llama.cpp parity (free-running greedy and teacher-forced
    /// argmax); exits non-zero on a violation.
    Parity(ParityArgs),
    /// Serve the model over an OpenAI-compatible HTTP API (/v1/completions,
    /// /v1/chat/completions, /v1/models, /health, /metrics).
    Serve(crate::server::ServeArgs),
    /// Write a random-weight Llama GGUF of a known shape (Q4_1 projections,
    /// tied Q8_0 head): for benchmarks and tests at real model sizes.
    Synth(SynthArgs),
    /// Where a step's time goes: decode steps and a prefill, kernel by
    /// kernel (launches, device time, bytes, GB/s, TFLOP/s, % of the measured
    /// ceilings, class), the step total and the gaps.
    Profile(ProfileArgs),
}

/// Arguments of `tessera profile`.
#[derive(Debug, Args)]
pub struct ProfileArgs {
    /// The model and engine.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Decode batch sizes (empty: none).
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    pub batches: Vec<usize>,
    /// Cached tokens per sequence during the decode steps.
    #[arg(long, default_value_t = 128)]
    pub context: usize,
    /// Prompt tokens of the profiled prefill (0: none).
    #[arg(long, default_value_t = 512)]
    pub prefill: usize,
    /// Decode steps measured per batch size.
    #[arg(long, default_value_t = 20)]
    pub steps: usize,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `tessera synth`.
#[derive(Debug, Args)]
pub struct SynthArgs {
    /// The shape: smollm2-135m, llama-1b or llama-8b.
    #[arg(long)]
    pub shape: String,
    /// The GGUF file to write.
    #[arg(long)]
    pub out: PathBuf,
    /// Seed of the weights.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Copy the vocabulary (tokenizer and chat template) of this GGUF, which
    /// must have the shape's 49152 tokens (SmolLM2's); default: a small
    /// byte-level vocabulary padded to that size.
    #[arg(long)]
    pub vocab_from: Option<PathBuf>,
}

/// Where the model comes from and how the engine is sized.
#[derive(Debug, Args, Clone)]
pub struct ModelArgs {
    /// A Llama-family GGUF file (F32/F16/BF16 norms, Q4_0/Q4_1/Q8_0 matrices).
    #[arg(long, default_value = crate::app::DEFAULT_MODEL)]
    pub model: PathBuf,
    /// The device: the GPU when usable (auto), or force one.
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto)]
    pub device: DeviceChoice,
    /// Activation and KV-cache dtype (auto: bf16 on the GPU, f32 on the CPU).
    #[arg(long, value_enum, default_value_t = DtypeChoice::Auto)]
    pub dtype: DtypeChoice,
    /// Sequences running at once.
    #[arg(long, default_value_t = 64)]
    pub max_num_seqs: usize,
    /// Longest sequence, prompt plus output (0: the model's context, at most 2048).
    #[arg(long, default_value_t = 0)]
    pub max_model_len: usize,
    /// Token budget of one step (chunked prefill beyond it).
    #[arg(long, default_value_t = 2048)]
    pub max_num_batched_tokens: usize,
    /// Tokens per KV block (16, 32 or 64).
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Cap the KV cache at this many blocks.
    #[arg(long)]
    pub kv_blocks: Option<usize>,
    /// Do not reuse KV blocks of shared prompt prefixes.
    #[arg(long)]
    pub no_prefix_caching: bool,
    /// Do not print the device notice and memory plan.
    #[arg(long, short)]
    pub quiet: bool,
    /// Run each step's fastest kernels instead of the batch-invariant ones:
    /// a request's tokens and logprobs may then change with the batch it
    /// runs in (see README, "Batch invariance").
    #[arg(long)]
    pub no_batch_invariance: bool,
    /// Which decode steps run as one persistent kernel: `mega` (every
    /// decode step of at most 16 sequences), `graphs` (none: one kernel per
    /// operation, in CUDA graphs) or `auto` (where it is measured to win).
    #[arg(long, default_value = "auto")]
    pub decode_path: DecodePath,
}

impl ModelArgs {
    /// The loader options these arguments ask for.
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            model: self.model.clone(),
            device: self.device,
            dtype: self.dtype,
            max_num_seqs: self.max_num_seqs,
            max_model_len: self.max_model_len,
            max_num_batched_tokens: self.max_num_batched_tokens,
            block_size: self.block_size,
            max_blocks: self.kv_blocks,
            prefix_caching: !self.no_prefix_caching,
            verbose: !self.quiet,
            speculation: None,
            batch_invariance: !self.no_batch_invariance,
            decode_path: self.decode_path,
        }
    }
}

/// Sampling settings (vLLM semantics; the defaults are greedy).
#[derive(Debug, Args, Clone)]
pub struct SamplingArgs {
    /// Temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Keep the k most likely tokens (0: off).
    #[arg(long, default_value_t = 0)]
    pub top_k: i32,
    /// Keep the smallest set of tokens whose mass reaches p (1: off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Drop tokens less likely than min_p times the most likely (0: off).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Repetition penalty over prompt and output (1: off).
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    /// Presence penalty over the output (0: off).
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Frequency penalty over the output (0: off).
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Seed of the sampler (per prompt: seed + index).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl SamplingArgs {
    /// The sampler settings.
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
        }
    }
}

/// Arguments of `generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// The model and engine.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Sampling.
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// A prompt (repeat for a batch).
    #[arg(long, short)]
    pub prompt: Vec<String>,
    /// A file of prompts: one per line, or a JSON array of strings (`.json`).
    #[arg(long)]
    pub prompts_file: Option<PathBuf>,
    /// Wrap each prompt as a user turn of the chat template.
    #[arg(long)]
    pub chat: bool,
    /// The most new tokens per prompt.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Do not stop at end-of-generation tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print one JSON object per prompt: {"prompt", "token_ids", "text"}.
    #[arg(long)]
    pub json: bool,
    /// Speculative decoding.
    #[command(flatten)]
    pub spec: crate::spec::cli::SpecArgs,
}

/// Arguments of `chat`.
#[derive(Debug, Args)]
pub struct ChatArgs {
    /// The model and engine.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Sampling.
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// A system prompt.
    #[arg(long)]
    pub system: Option<String>,
    /// The most new tokens per reply.
    #[arg(long, default_value_t = 512)]
    pub max_tokens: usize,
}

/// Arguments of `parity`.
#[derive(Debug, Args)]
pub struct ParityArgs {
    /// The golden file (the format of ../shared/golden/).
    pub file: PathBuf,
    /// The model and engine.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Generate each whole continuation free-running (by default only the
    /// `must_match` tokens the rule needs).
    #[arg(long)]
    pub full: bool,
}

/// `tessera kernels ...`.
#[derive(Debug, Subcommand)]
pub enum KernelsAction {
    /// List the registered kernels.
    List,
    /// Compile a kernel's default config and print the stages asked for (all
    /// of them when none is named).
    Dump(DumpArgs),
}

/// Arguments of `kernels dump`.
#[derive(Debug, Args)]
pub struct DumpArgs {
    /// The kernel's name (see `tessera kernels list`).
    pub name: String,
    /// Print the tile IR (after canonicalization).
    #[arg(long)]
    pub ir: bool,
    /// Print the LLVM IR (before and after -O3).
    #[arg(long)]
    pub llvm: bool,
    /// Print the PTX.
    #[arg(long)]
    pub ptx: bool,
    /// The GPU architecture to compile for.
    #[arg(long, value_enum, default_value_t = TargetArg::Sm80)]
    pub target: TargetArg,
}

/// A compile target on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TargetArg {
    /// Ampere and newer.
    #[value(name = "sm_80")]
    Sm80,
    /// Hopper with architecture-specific features.
    #[value(name = "sm_90a")]
    Sm90a,
}

impl From<TargetArg> for codegen::Target {
    fn from(t: TargetArg) -> Self {
        match t {
            TargetArg::Sm80 => codegen::Target::Sm80,
            TargetArg::Sm90a => codegen::Target::Sm90a,
        }
    }
}

/// Arguments of `gpu-check`.
#[derive(Debug, Args)]
pub struct GpuCheckArgs {
    /// The GPU ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 0x7e55e4a)]
    pub seed: u64,
    /// Check only these kernels or check families (comma-separated names; `model`: the tiny
    /// Llama forward, sampling and CUDA graphs).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
}

/// Arguments of `host-check`.
#[derive(Debug, Args)]
pub struct HostCheckArgs {
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 0x7e55e4a)]
    pub seed: u64,
    /// Check only these kernels (comma-separated names).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
}

/// `tessera profile`: sizes the engine for the task and prints the report.
fn profile_cmd(a: &ProfileArgs) -> Result<()> {
    let task = crate::profile::ProfileTask {
        batches: a.batches.clone(),
        context: a.context,
        prefill: a.prefill,
        steps: a.steps,
    };
    if a.context > app::MAX_MODEL_LEN || a.prefill > app::MAX_MODEL_LEN || a.steps > 1 << 20 {
        return Err(Error::Usage(format!(
            "--context and --prefill must be at most {} and --steps at most {}",
            app::MAX_MODEL_LEN,
            1 << 20
        )));
    }
    if let Some(&b) = a.batches.iter().find(|&&b| b == 0 || b > a.model.max_num_seqs) {
        return Err(Error::Usage(format!(
            "batch size {b} is outside 1..=--max-num-seqs ({})",
            a.model.max_num_seqs
        )));
    }
    let mut load = a.model.load_options();
    if load.max_model_len == 0 {
        load.max_model_len = task.max_len().next_multiple_of(16);
    } else if load.max_model_len < task.max_len() {
        return Err(Error::Usage(format!(
            "--max-model-len {} is below the {} tokens the profile needs",
            load.max_model_len,
            task.max_len()
        )));
    }
    let report = app::run_task(&load, task)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report).map_err(|e| Error::Usage(e.to_string()))?);
    } else {
        print!("{}", crate::profile::table(&report));
    }
    Ok(())
}

/// Arguments of `bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The GPU ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Untimed launches before measuring.
    #[arg(long, default_value_t = 5)]
    pub warmup: usize,
    /// Timed launches; the median is reported.
    #[arg(long, default_value_t = 25)]
    pub runs: usize,
    /// Softmax shapes, `ROWSxCOLS[,ROWSxCOLS...]`.
    #[arg(long, default_value = "8192x1024,4096x16384")]
    pub shapes: String,
    /// Skip the copy ceiling (`copy/f32/2^29`, 4 GiB of device memory).
    #[arg(long)]
    pub no_copy: bool,
    /// peers.py output to compare with (ratios on the same benchmark name).
    #[arg(long)]
    pub peers: Option<PathBuf>,
    /// Also write the records as JSON (peers.py's format, peer `tessera`).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also measure softmax with its autotuned config (rows marked `(tuned)`;
    /// results are cached in `$TESSERA_CACHE_DIR` or `~/.cache/tessera`).
    #[arg(long)]
    pub autotune: bool,
    /// Add+RMSNorm shapes (bf16), `TOKENSxHIDDEN[,...]`; a single token is
    /// timed in microseconds.
    #[arg(long, default_value = "8192x4096,32768x576,1x576")]
    pub add_rmsnorm_shapes: String,
    /// Skip the add+RMSNorm rows.
    #[arg(long)]
    pub no_add_rmsnorm: bool,
    /// Measure only these families (comma-separated: copy, softmax,
    /// add_rmsnorm, decode, attention, gemm, linear, gemv_q8, sampling, matmul, model, spec); all when empty.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// The model of the `model` family.
    #[arg(long, default_value = crate::app::DEFAULT_MODEL)]
    pub model: PathBuf,
    /// Batch sizes of the `model` family.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,64")]
    pub batches: Vec<usize>,
    /// Activation dtype of the `model` family (auto: bf16).
    #[arg(long, value_enum, default_value_t = DtypeChoice::Auto)]
    pub dtype: DtypeChoice,
    /// Measure the native CPU backend instead of the GPU: the host copy rate,
    /// copy, softmax, add+RMSNorm and the CPU decode GEMVs (Q4_1, Q8_0) in
    /// GB/s, and SmolLM2 prefill (512 tokens) and decode (128 tokens)
    /// (`--only model` for those alone).
    #[arg(long)]
    pub host: bool,
    /// The `model` and `spec` families on the fast, batch-dependent kernels
    /// (rows named `... [no-batch-invariance]`).
    #[arg(long)]
    pub no_batch_invariance: bool,
    /// The `model` family's decode path (see `generate --help`).
    #[arg(long, default_value = "auto")]
    pub decode_path: DecodePath,
    /// `bench serve`: load-test a running server instead of the kernels.
    #[command(subcommand)]
    pub mode: Option<BenchMode>,
}

/// What `bench` measures besides the kernels.
#[derive(Debug, Subcommand)]
pub enum BenchMode {
    /// Replay streaming requests against an OpenAI-compatible server
    /// (`tessera serve`) and report TTFT, TPOT, ITL and throughput.
    Serve(crate::bench::serve::BenchServeArgs),
}

/// Runs a parsed command line; `Ok(false)` means checks failed.
pub fn run(cli: Cli) -> Result<bool> {
    match cli.command {
        Command::Kernels { action: KernelsAction::List } => {
            println!("{:<12} {:<42} default config", "name", "computes");
            for e in registry::ENTRIES {
                println!("{:<12} {:<42} {}", e.name, e.description, e.default_config);
            }
            Ok(true)
        }
        Command::Kernels { action: KernelsAction::Dump(a) } => dump(&a).map(|()| true),
        Command::GpuCheck(a) => gpu_check(&a),
        Command::HostCheck(a) => {
            let mut host = codegen::host::Host::new();
            println!("# {}, seed {:#x}", host.describe(), a.seed);
            let rows = crate::check::host::run(&mut host, &a.only, a.seed, |_, _| {})?;
            let (text, ok) = check::table(&rows);
            print!("{text}");
            Ok(ok)
        }
        Command::Bench(a) => match &a.mode {
            Some(BenchMode::Serve(s)) => crate::bench::serve::run(s).map(|_| true),
            None => bench_cmd(&a).map(|()| true),
        },
        Command::Generate(a) => generate_cmd(a).map(|_| true),
        Command::Chat(a) => {
            let task = Chat { system: a.system, params: a.sampling.params(), max_tokens: a.max_tokens };
            app::run_task(&a.model.load_options(), task).map(|()| true)
        }
        Command::Serve(a) => crate::server::serve_cmd(&a).map(|()| true),
        Command::Synth(a) => synth(&a).map(|()| true),
        Command::Profile(a) => profile_cmd(&a).map(|()| true),
        Command::Parity(a) => {
            let golden = Golden::load(&a.file)?;
            let reports = app::run_task(&a.model.load_options(), Parity { golden, full: a.full })?;
            Ok(reports.iter().all(|r| r.passed()))
        }
    }
}

/// Reads the prompts of `generate`: `--prompt`s, then the file's.
fn prompts_of(a: &GenerateArgs) -> Result<Vec<String>> {
    let mut prompts = a.prompt.clone();
    if let Some(path) = &a.prompts_file {
        let text = std::fs::read_to_string(path)
            .map_err(|source| Error::Io { path: path.display().to_string(), source })?;
        if path.extension().is_some_and(|e| e == "json") {
            let list: Vec<String> = serde_json::from_str(&text).map_err(|e| {
                Error::Usage(format!("{}: expected a JSON array of strings: {e}", path.display()))
            })?;
            prompts.extend(list);
        } else {
            prompts.extend(text.lines().filter(|l| !l.trim().is_empty()).map(str::to_string));
        }
    }
    Ok(prompts)
}

fn generate_cmd(a: GenerateArgs) -> Result<Vec<crate::engine::Completion>> {
    let task = Generate {
        prompts: prompts_of(&a)?,
        chat: a.chat,
        params: a.sampling.params(),
        max_tokens: a.max_tokens,
        ignore_eos: a.ignore_eos,
        json: a.json,
    };
    let opts = LoadOptions { speculation: a.spec.speculation()?, ..a.model.load_options() };
    app::run_task(&opts, task)
}

/// `tessera synth`: writes the random-weight model `a` asks for.
fn synth(a: &SynthArgs) -> Result<()> {
    use crate::gguf::tiny::{SYNTH_SHAPES, TinyLlama, synth_shape};
    let config = synth_shape(&a.shape).ok_or_else(|| {
        Error::Usage(format!("unknown --shape {:?}: expected one of {}", a.shape, SYNTH_SHAPES.join(", ")))
    })?;
    let vocab = match &a.vocab_from {
        Some(p) => Some(crate::gguf::Vocab::from_metadata(crate::gguf::Gguf::open(p)?.metadata())?),
        None => None,
    };
    let t = TinyLlama { config, seed: a.seed, embedding_scale: 0.05, vocab, ..TinyLlama::default() };
    let bytes = t.to_bytes()?;
    std::fs::write(&a.out, &bytes)
        .map_err(|source| Error::Io { path: a.out.display().to_string(), source })?;
    eprintln!("tessera: wrote {} ({} bytes, shape {})", a.out.display(), bytes.len(), a.shape);
    Ok(())
}

fn dump(a: &DumpArgs) -> Result<()> {
    let entry = registry::find(&a.name).ok_or_else(|| {
        let names: Vec<&str> = registry::ENTRIES.iter().map(|e| e.name).collect();
        Error::Usage(format!("no kernel named `{}`; registered: {}", a.name, names.join(", ")))
    })?;
    let (mut func, opts) = (entry.build)()?;
    let all = !(a.ir || a.llvm || a.ptx);
    if a.ir && !a.llvm && !a.ptx {
        // The IR alone needs no code generator.
        dsl_core::passes::canonicalize(&mut func);
        println!(
            "// ---- {} ({}): tile IR ----\n{}",
            entry.name,
            entry.default_config,
            dsl_core::print::print(&func)
        );
        return Ok(());
    }
    let copts = codegen::CompileOptions::for_launch(a.target.into(), &opts);
    let (compiled, dumps) = codegen::compile_with_dumps(&func, &copts)?;
    if all || a.ir {
        println!("// ---- {} ({}): tile IR ----\n{}", entry.name, entry.default_config, dumps.ir);
    }
    if all || a.llvm {
        println!("// ---- {}: LLVM IR ----\n{}", entry.name, dumps.llvm);
    }
    if all || a.ptx {
        println!(
            "// ---- {}: PTX for {} ({} bytes of shared memory) ----",
            entry.name,
            copts.target.arch(),
            compiled.shared_bytes
        );
        println!("{}", compiled.ptx);
    }
    Ok(())
}

fn gpu_check(a: &GpuCheckArgs) -> Result<bool> {
    for name in &a.only {
        if registry::find(name).is_none() && registry::find_family(name).is_none() {
            return Err(Error::Usage(format!("no kernel named `{name}`")));
        }
    }
    let mut cuda = Cuda::open(a.device)?;
    let info = cuda.gpu().info().clone();
    println!(
        "# {} (sm_{}{}), target {}, seed {:#x}",
        info.name,
        info.compute_capability.0,
        info.compute_capability.1,
        cuda.target().arch(),
        a.seed
    );
    let mut rows = Vec::new();
    for (i, e) in registry::ENTRIES.iter().enumerate() {
        if !a.only.is_empty() && !a.only.iter().any(|n| n == e.name) {
            continue;
        }
        match (e.check.gpu)(&mut cuda, a.seed.wrapping_add(i as u64)) {
            Ok(r) => rows.extend(r),
            Err(err) => {
                // A kernel that fails to compile or launch fails the check but
                // does not hide the others.
                eprintln!("error: {}: {err}", e.name);
                rows.push(check::error_row(e.name));
            }
        }
    }
    for (j, &(name, _, family_check)) in registry::FAMILIES.iter().enumerate() {
        if !a.only.is_empty() && !a.only.iter().any(|n| n == name) {
            continue;
        }
        let seed = a.seed.wrapping_add((registry::ENTRIES.len() + j) as u64);
        match family_check(&mut cuda, seed) {
            Ok(r) => rows.extend(r),
            Err(err) => {
                eprintln!("error: {name}: {err}");
                rows.push(check::error_row(name));
            }
        }
    }
    let (text, ok) = check::table(&rows);
    print!("{text}");
    Ok(ok)
}

fn bench_cmd(a: &BenchArgs) -> Result<()> {
    let peers = match &a.peers {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(|source| Error::Io { path: p.display().to_string(), source })?;
            Some(Peers::parse(&text)?)
        }
        None => None,
    };
    let opts = BenchOptions {
        warmup: a.warmup,
        runs: a.runs,
        shapes: bench::parse_shapes(&a.shapes)?,
        copy: !a.no_copy,
        autotune: a.autotune,
        add_rmsnorm: if a.no_add_rmsnorm { Vec::new() } else { bench::parse_shapes(&a.add_rmsnorm_shapes)? },
        only: a.only.clone(),
    };
    if a.host {
        let target = codegen::host::HostTarget::native();
        println!(
            "# native CPU backend, {} on {} threads, median of {} runs after {} warm-up",
            target.describe(),
            codegen::host::launch::threads(),
            opts.runs,
            opts.warmup
        );
        let records = crate::bench::host::run(&opts, &a.model, !a.no_batch_invariance)?;
        print!("{}", crate::bench::host::table(&records));
        return Ok(());
    }
    let mut cuda = Cuda::open(a.device)?;
    let device = cuda.gpu().info().name.clone();
    println!(
        "# {device}, target {}, median of {} runs after {} warm-up",
        cuda.target().arch(),
        opts.runs,
        opts.warmup
    );
    if let Some(p) = &peers
        && p.device != device
    {
        println!("# warning: peers were measured on `{}`, not on this device", p.device);
    }
    let kernels = opts.only.is_empty() || opts.only.iter().any(|o| o != "model" && o != "spec");
    let mut records = if kernels { bench::run(&mut cuda, &opts)? } else { Vec::new() };
    drop(cuda);
    if opts.wants("model") {
        let load = LoadOptions {
            model: a.model.clone(),
            device: DeviceChoice::Gpu,
            dtype: a.dtype,
            max_num_seqs: a.batches.iter().copied().max().unwrap_or(1).max(1),
            batch_invariance: !a.no_batch_invariance,
            decode_path: a.decode_path,
            ..LoadOptions::default()
        };
        let mut tags = Vec::new();
        if a.no_batch_invariance {
            tags.push("no-batch-invariance".to_string());
        }
        if a.decode_path != DecodePath::Auto {
            tags.push(format!("decode-path {}", a.decode_path.name()));
        }
        let variant = (!tags.is_empty()).then(|| tags.join(", "));
        let task =
            crate::bench::model::ModelBench { batches: a.batches.clone(), variant, ..Default::default() };
        records.extend(app::run_task(&load, task)?);
    }
    if opts.wants("spec") {
        let load = LoadOptions {
            model: a.model.clone(),
            device: DeviceChoice::Gpu,
            dtype: a.dtype,
            max_num_seqs: 4,
            batch_invariance: !a.no_batch_invariance,
            ..LoadOptions::default()
        };
        records.extend(crate::bench::spec::run(&load, &crate::bench::spec::SpecBenchOptions::default())?);
    }
    print!("{}", bench::table(&records, peers.as_ref()));
    if let Some(path) = &a.json {
        let text = serde_json::to_string_pretty(&bench::to_json(&device, &records))
            .map_err(|e| Error::Usage(format!("cannot encode the records: {e}")))?;
        std::fs::write(path, text)
            .map_err(|source| Error::Io { path: path.display().to_string(), source })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    /// A block size the cache cannot page by, and sizes whose products would
    /// overflow, end a command with a usage error naming the flag (before the
    /// model is read), never a panic or a wrapped number.
    #[test]
    fn bad_engine_sizes_are_usage_errors() {
        let cases: [(&[&str], &str); 6] = [
            (&["--block-size", "0"], "--block-size"),
            (&["--block-size", "48"], "--block-size"),
            (&["--max-num-seqs", "0"], "--max-num-seqs"),
            (&["--max-num-seqs", "18446744073709551615"], "--max-num-seqs"),
            (&["--max-model-len", "18446744073709551615"], "--max-model-len"),
            (&["--kv-blocks", "0"], "--kv-blocks"),
        ];
        for (flags, name) in cases {
            for cmd in ["generate", "profile"] {
                let mut argv = vec!["tessera", cmd, "--model", "/nonexistent.gguf"];
                if cmd == "generate" {
                    argv.extend(["--prompt", "hi"]);
                }
                argv.extend(flags);
                let cli = Cli::try_parse_from(&argv).unwrap();
                match run(cli) {
                    Err(Error::Usage(m)) => assert!(m.contains(name), "{argv:?}: {m}"),
                    other => panic!("{argv:?}: {other:?}"),
                }
            }
        }
        let sizes = |f: &[&str]| {
            let mut argv = vec!["tessera", "generate", "--prompt", "hi"];
            argv.extend(f);
            match Cli::try_parse_from(&argv).unwrap().command {
                Command::Generate(a) => a.model.load_options().validate(),
                other => panic!("{other:?}"),
            }
        };
        assert!(sizes(&["--block-size", "64", "--max-num-seqs", "256", "--max-model-len", "8192"]).is_ok());
        assert!(sizes(&["--max-num-batched-tokens", "99999999999"]).is_err());
    }

    #[test]
    fn decode_paths_parse() {
        let path = |p: &str| {
            let argv = ["tessera", "generate", "--prompt", "hi", "--decode-path", p];
            Cli::try_parse_from(argv).map(|c| match c.command {
                Command::Generate(a) => a.model.load_options().decode_path,
                other => panic!("{other:?}"),
            })
        };
        assert_eq!(path("mega").unwrap(), DecodePath::Mega);
        assert_eq!(path("graphs").unwrap(), DecodePath::Graphs);
        assert_eq!(path("auto").unwrap(), DecodePath::Auto);
        let err = path("persistent").unwrap_err().to_string();
        assert!(err.contains("expected mega, graphs or auto"), "{err}");
    }

    #[test]
    fn parses_the_subcommands() {
        let c = Cli::try_parse_from(["tessera", "kernels", "dump", "softmax", "--ptx", "--target", "sm_90a"])
            .unwrap();
        match c.command {
            Command::Kernels { action: KernelsAction::Dump(d) } => {
                assert_eq!(d.name, "softmax");
                assert!(d.ptx && !d.ir && !d.llvm);
                assert_eq!(d.target, TargetArg::Sm90a);
            }
            other => panic!("{other:?}"),
        }
        let c =
            Cli::try_parse_from(["tessera", "bench", "--peers", "p.json", "--json", "o.json", "--runs", "3"])
                .unwrap();
        match c.command {
            Command::Bench(b) => {
                assert_eq!(b.runs, 3);
                assert_eq!(b.peers, Some(PathBuf::from("p.json")));
                assert_eq!(b.shapes, "8192x1024,4096x16384");
                assert!(!b.autotune);
            }
            other => panic!("{other:?}"),
        }
        match Cli::try_parse_from(["tessera", "bench", "--autotune"]).unwrap().command {
            Command::Bench(b) => assert!(b.autotune),
            other => panic!("{other:?}"),
        }
        let c = Cli::try_parse_from(["tessera", "gpu-check", "--only", "softmax,copy"]).unwrap();
        assert!(matches!(c.command, Command::GpuCheck(ref g) if g.only == ["softmax", "copy"]));
        assert!(Cli::try_parse_from(["tessera", "kernels", "dump", "x", "--target", "sm_70"]).is_err());
        assert!(Cli::try_parse_from(["tessera", "frobnicate"]).is_err());
    }

    #[test]
    fn list_and_unknown_names() {
        assert!(run(Cli::try_parse_from(["tessera", "kernels", "list"]).unwrap()).unwrap());
        let e = run(Cli::try_parse_from(["tessera", "kernels", "dump", "nope"]).unwrap()).unwrap_err();
        assert!(matches!(e, Error::Usage(ref m) if m.contains("no kernel named `nope`")), "{e}");
        let e = run(Cli::try_parse_from(["tessera", "gpu-check", "--only", "nope"]).unwrap()).unwrap_err();
        assert!(matches!(e, Error::Usage(_)), "{e}");
    }

    #[test]
    fn dump_compiles_every_kernel() {
        for e in registry::ENTRIES {
            for target in ["sm_80", "sm_90a"] {
                let cli =
                    Cli::try_parse_from(["tessera", "kernels", "dump", e.name, "--ptx", "--target", target]);
                run(cli.unwrap()).unwrap_or_else(|err| panic!("{} for {target}: {err}", e.name));
            }
        }
    }

    #[test]
    fn gpu_commands_fail_cleanly_without_a_gpu() {
        if crate::cuda::Gpu::new(0).is_ok() {
            return;
        }
        let e = run(Cli::try_parse_from(["tessera", "gpu-check"]).unwrap()).unwrap_err();
        assert!(matches!(e, Error::NoDriver(_) | Error::NoDevice(_)), "{e}");
        let e = run(Cli::try_parse_from(["tessera", "bench", "--no-copy"]).unwrap()).unwrap_err();
        assert!(matches!(e, Error::NoDriver(_) | Error::NoDevice(_)), "{e}");
    }
}
