//! The arguments of each `tessera` subcommand (clap derive) and the
//! settings they turn into (`ModelArgs::load_options`,
//! `SamplingArgs::params`). Checking values that clap cannot (sizes that
//! must fit together) is the commands' job (`LoadOptions::validate`).

use crate::app::{DeviceChoice, DtypeChoice, LoadOptions};
use crate::model::KvCacheDtype;
use crate::model::mega::DecodePath;
use crate::model::sampler::SamplingParams;
use clap::{Args, Subcommand, ValueEnum};
use std::path::PathBuf;

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
    /// Constrain the profiled decode requests to the JSON schema in FILE
    /// and report the host's token-mask time per step (choose a schema
    /// whose outputs run longer than the profiled steps).
    #[arg(long, value_name = "FILE")]
    pub json_schema: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `tessera synth`.
#[derive(Debug, Args)]
pub struct SynthArgs {
    /// The shape: smollm2-135m, llama-1b or llama-8b (Llama benchmarks), or
    /// a small test model of an architecture: llama3, mistral, qwen2.5 or
    /// qwen3 (these need --vocab-from; the default seed 1 gives the files the
    /// golden tests use).
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
    /// The tensor types of a llama.cpp quantization mix: q4_k_m (Q4_K_M's
    /// type per tensor, with its fallbacks for rows that are not multiples
    /// of 256). Default: the shape's own types (Q4_1 projections and a Q8_0
    /// table for the Llama benchmarks).
    #[arg(long)]
    pub mix: Option<String>,
}

/// Where the model comes from and how the engine is sized.
#[derive(Debug, Args, Clone)]
pub struct ModelArgs {
    /// A GGUF file of a supported architecture (llama, qwen2, qwen3; F32/F16/BF16
    /// norms; Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K/F16/BF16 matrices).
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
    /// How the model's steps run.
    #[command(flatten)]
    pub run: RunArgs,
}

/// How a model's steps run: the model commands' flags, and `bench`'s for
/// its `model` and `spec` families (rows tagged with the choices made).
#[derive(Debug, Args, Clone)]
pub struct RunArgs {
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
    /// What the KV cache stores: `auto` (the activation dtype) or `fp8`
    /// (E4M3 values with a power-of-two scale per token and KV head, about
    /// half of bf16's bytes; see README, "FP8 KV cache").
    #[arg(long, value_enum, default_value_t = KvCacheDtype::Auto)]
    pub kv_cache_dtype: KvCacheDtype,
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
            batch_invariance: !self.run.no_batch_invariance,
            decode_path: self.run.decode_path,
            kv_cache_dtype: self.run.kv_cache_dtype,
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
    /// Structured output: every output is JSON valid against the JSON schema
    /// in FILE (constrained decoding; llguidance's JSON-schema subset).
    #[arg(long, value_name = "FILE", conflicts_with = "grammar")]
    pub json_schema: Option<PathBuf>,
    /// Structured output: every output matches the grammar in FILE, written
    /// in llguidance's Lark syntax (rules `name: ...`, start rule `start`,
    /// /regex/ terminals, `{m,n}` repeats, `%json {schema}`) or in
    /// llama.cpp's GBNF (rules `name ::= ...`, start rule `root`; read when
    /// the first rule uses `::=`).
    #[arg(long, value_name = "FILE")]
    pub grammar: Option<PathBuf>,
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
    /// Also write every teacher-forced clear position's margin (our logit
    /// of llama.cpp's token minus our largest other) and llama.cpp's gap to
    /// this JSON file, to compare numerics changes position by position.
    #[arg(long, value_name = "FILE")]
    pub margins: Option<PathBuf>,
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
    /// Print the kernel plan (every layout, instruction and pipelining
    /// decision of the code generator, before any LLVM is emitted).
    #[arg(long)]
    pub plan: bool,
    /// Print the PTX.
    #[arg(long)]
    pub ptx: bool,
    /// Print the SASS ptxas makes of the PTX, after ptxas's report
    /// (registers, spills, shared memory): needs `ptxas` and `nvdisasm`
    /// (`$PTXAS` / `$NVDISASM`, else on `PATH`; `.ci/setup` installs both
    /// under target/tools). Not part of the default set of stages.
    #[arg(long)]
    pub sass: bool,
    /// The GPU architecture to compile for.
    #[arg(long, value_enum, default_value_t = TargetArg::Sm80)]
    pub target: TargetArg,
    /// Compile as a launch with 16-byte aligned pointers and integer
    /// arguments that are multiples of 16 specializes the kernel (the
    /// runtime's usual case); without it, no argument is assumed aligned.
    #[arg(long)]
    pub aligned: bool,
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
    /// add_rmsnorm, decode, attention, gemm, linear, gemv_q8, sampling, matmul, fp8, model, spec); all when empty.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// The model of the `model` family.
    #[arg(long, default_value = crate::app::DEFAULT_MODEL)]
    pub model: PathBuf,
    /// Batch sizes of the `model` family.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,64")]
    pub batches: Vec<usize>,
    /// Timed runs per batch size of the `model` family (each on new
    /// prompts, after one warm-up); each rate is its median over the runs,
    /// the latency quantiles are over all runs.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeats: u32,
    /// Activation dtype of the `model` family (auto: bf16).
    #[arg(long, value_enum, default_value_t = DtypeChoice::Auto)]
    pub dtype: DtypeChoice,
    /// Constrain every request of the `model` family to the JSON schema in
    /// FILE (rows tagged `[json-schema]`); the token masks are computed on
    /// the host during each step's forward pass.
    #[arg(long, value_name = "FILE")]
    pub json_schema: Option<PathBuf>,
    /// Measure the native CPU backend instead of the GPU: the host copy rate,
    /// copy, softmax, add+RMSNorm and the CPU decode GEMVs (Q4_1, Q8_0) in
    /// GB/s, and SmolLM2 prefill (512 tokens) and decode (128 tokens)
    /// (`--only model` for those alone).
    #[arg(long)]
    pub host: bool,
    /// How the `model` and `spec` families' steps run (rows tagged
    /// `[no-batch-invariance]`, `[decode-path ..]`, `[fp8 KV]`).
    #[command(flatten)]
    pub run: RunArgs,
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
