//! The `tessera` command line: the subcommands, [`run`] (which dispatches
//! them) and the implementations of those that are not a task of their own
//! module. Each subcommand's arguments are in `args.rs`. `main.rs` only
//! parses and calls [`run`].
//!
//! Invariants: user input never panics (bad names, files and shapes are
//! [`Error::Usage`]); a missing GPU or driver is a one-line error, not a crash;
//! the exit status is 0 on success, 1 on errors and failed checks.

use crate::app::{self, DeviceChoice, LoadOptions};
use crate::bench::{self, BenchOptions, Peers};
use crate::check;
use crate::cuda::Cuda;
use crate::error::{Error, Result};
use crate::generate::{Chat, Generate};
use crate::model::KvCacheDtype;
use crate::model::mega::DecodePath;
use crate::parity::{Golden, Parity};
use crate::registry;
use clap::{Parser, Subcommand};

mod args;
mod sass;

pub use args::{
    BenchArgs, BenchMode, ChatArgs, DumpArgs, GenerateArgs, GpuCheckArgs, HostCheckArgs, KernelsAction,
    ModelArgs, ParityArgs, ProfileArgs, SamplingArgs, SynthArgs, TargetArg,
};

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
            let margins = a.margins.as_ref().map(|_| golden.clone());
            let reports = app::run_task(&a.model.load_options(), Parity { golden, full: a.full })?;
            if let (Some(path), Some(golden)) = (&a.margins, margins) {
                let json = crate::parity::margins_json(&golden, &reports);
                std::fs::write(path, json.to_string())
                    .map_err(|e| Error::Usage(format!("cannot write {}: {e}", path.display())))?;
            }
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

/// Reads the structured-output constraint of `generate` or `bench`, if any:
/// a JSON schema file, or a grammar file in Lark or GBNF syntax (GBNF is
/// read into Lark; compiled once the tokenizer is loaded).
pub fn grammar_of(
    json_schema: Option<&std::path::Path>,
    grammar: Option<&std::path::Path>,
) -> Result<Option<crate::grammar::GrammarSpec>> {
    use crate::grammar::GrammarSpec;
    let read = |path: &std::path::Path| {
        std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.display().to_string(), source })
    };
    if let Some(path) = json_schema {
        let value: serde_json::Value = serde_json::from_str(&read(path)?).map_err(|e| {
            Error::Usage(format!("--json-schema {}: the file is not valid JSON: {e}", path.display()))
        })?;
        if !(value.is_object() || value.is_boolean()) {
            return Err(Error::Usage(format!(
                "--json-schema {}: a JSON schema is an object (or true/false)",
                path.display()
            )));
        }
        return Ok(Some(GrammarSpec::JsonSchema(value)));
    }
    if let Some(path) = grammar {
        let text = read(path)?;
        if text.trim().is_empty() {
            return Err(Error::Usage(format!("--grammar {}: the grammar file is empty", path.display())));
        }
        if crate::grammar::gbnf::looks_like_gbnf(&text) {
            let lark = crate::grammar::gbnf::gbnf_to_lark(&text)
                .map_err(|e| Error::Usage(format!("--grammar {} (GBNF): {e}", path.display())))?;
            return Ok(Some(GrammarSpec::Lark(lark)));
        }
        return Ok(Some(GrammarSpec::Lark(text)));
    }
    Ok(None)
}

fn generate_cmd(a: GenerateArgs) -> Result<Vec<crate::engine::Completion>> {
    let task = Generate {
        prompts: prompts_of(&a)?,
        chat: a.chat,
        params: a.sampling.params(),
        max_tokens: a.max_tokens,
        ignore_eos: a.ignore_eos,
        json: a.json,
        grammar: grammar_of(a.json_schema.as_deref(), a.grammar.as_deref())?,
    };
    let opts = LoadOptions { speculation: a.spec.speculation()?, ..a.model.load_options() };
    app::run_task(&opts, task)
}

/// `tessera synth`: writes the random-weight model `a` asks for
/// ([`synth_model`]).
fn synth(a: &SynthArgs) -> Result<()> {
    let bytes = synth_model(a)?.to_bytes()?;
    std::fs::write(&a.out, &bytes)
        .map_err(|source| Error::Io { path: a.out.display().to_string(), source })?;
    eprintln!("tessera: wrote {} ({} bytes, shape {})", a.out.display(), bytes.len(), a.shape);
    Ok(())
}

/// The model `tessera synth` writes: a Llama of a benchmark shape, or a
/// small model of one of the supported architectures
/// (`gguf::tiny::synth_arch`, which needs `--vocab-from`), with the tensor
/// types of `--mix` if given.
fn synth_model(a: &SynthArgs) -> Result<crate::gguf::tiny::TinyLlama> {
    use crate::gguf::tiny::{
        SYNTH_ARCHS, SYNTH_MIXES, SYNTH_SHAPES, TinyLlama, synth_arch, synth_arch_vocab, synth_mix,
        synth_shape,
    };
    if let Some(mix) = a.mix.as_deref().filter(|m| !SYNTH_MIXES.contains(m)) {
        return Err(Error::Usage(format!(
            "unknown --mix {mix:?}: expected one of {}",
            SYNTH_MIXES.join(", ")
        )));
    }
    let vocab = match &a.vocab_from {
        Some(p) => Some(crate::gguf::Vocab::from_metadata(crate::gguf::Gguf::open(p)?.metadata())?),
        None => None,
    };
    let t = if let Some(file) = synth_arch_vocab(&a.shape) {
        let vocab = vocab.ok_or_else(|| {
            Error::Usage(format!("--shape {} needs --vocab-from (models/vocab/{file})", a.shape))
        })?;
        let t = synth_arch(&a.shape, vocab).expect("every SYNTH_ARCHS name has a model");
        TinyLlama { seed: t.seed ^ a.seed.wrapping_sub(1), ..t }
    } else {
        let config = synth_shape(&a.shape).ok_or_else(|| {
            Error::Usage(format!(
                "unknown --shape {:?}: expected one of {}, {}",
                a.shape,
                SYNTH_SHAPES.join(", "),
                SYNTH_ARCHS.join(", ")
            ))
        })?;
        TinyLlama { config, seed: a.seed, embedding_scale: 0.05, vocab, ..TinyLlama::default() }
    };
    Ok(match &a.mix {
        Some(m) => {
            let mix = synth_mix(m, &t.config, t.untied_output).expect("checked against SYNTH_MIXES");
            t.with_mix(mix)
        }
        None => t,
    })
}

fn dump(a: &DumpArgs) -> Result<()> {
    print!("{}", dump_text(a)?);
    Ok(())
}

/// What `kernels dump` prints for `a`.
pub(crate) fn dump_text(a: &DumpArgs) -> Result<String> {
    use std::fmt::Write as _;
    let entry = registry::find(&a.name).ok_or_else(|| {
        let names: Vec<&str> = registry::ENTRIES.iter().map(|e| e.name).collect();
        Error::Usage(format!("no kernel named `{}`; registered: {}", a.name, names.join(", ")))
    })?;
    let (mut func, opts) = (entry.build)()?;
    if a.aligned {
        // What the launcher does when every argument allows it.
        func = dsl_core::launch::specialize(&func, &vec![Some(0); func.params.len()]).0;
    }
    let mut out = String::new();
    // One section: its title line, then its text.
    let mut section = |title: String, text: &str| {
        let _ = writeln!(out, "// ---- {}{title} ----\n{text}", entry.name);
    };
    let ir_title = || format!(" ({}): tile IR", entry.default_config);
    let all = !(a.ir || a.plan || a.llvm || a.ptx || a.sass);
    if a.ir && !a.plan && !a.llvm && !a.ptx && !a.sass {
        // The IR alone needs no code generator.
        dsl_core::passes::canonicalize(&mut func);
        section(ir_title(), &dsl_core::print::print(&func));
        return Ok(out);
    }
    let copts = codegen::CompileOptions::for_launch(a.target.into(), &opts);
    let (compiled, dumps) = codegen::compile_with_dumps(&func, &copts)?;
    let arch = copts.target.arch();
    if all || a.ir {
        section(ir_title(), &dumps.ir);
    }
    if all || a.plan {
        section(format!(": kernel plan for {arch}"), &dumps.plan);
    }
    if all || a.llvm {
        section(": LLVM IR".to_string(), &dumps.llvm);
    }
    if all || a.ptx {
        section(
            format!(": PTX for {arch} ({} bytes of shared memory)", compiled.shared_bytes),
            &compiled.ptx,
        );
    }
    if a.sass {
        let (report, code) =
            sass::sass(&compiled.ptx, arch, &std::env::temp_dir(), &sass::Tools::from_env())?;
        section(format!(": SASS for {arch}"), &format!("{report}\n{code}"));
    }
    Ok(out)
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
        let records = crate::bench::host::run(&opts, &a.model, !a.run.no_batch_invariance)?;
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
            batch_invariance: !a.run.no_batch_invariance,
            decode_path: a.run.decode_path,
            kv_cache_dtype: a.run.kv_cache_dtype,
            ..LoadOptions::default()
        };
        let mut tags = Vec::new();
        if a.run.no_batch_invariance {
            tags.push("no-batch-invariance".to_string());
        }
        if a.run.kv_cache_dtype == KvCacheDtype::Fp8 {
            tags.push("fp8 KV".to_string());
        }
        if a.run.decode_path != DecodePath::Auto {
            tags.push(format!("decode-path {}", a.run.decode_path.name()));
        }
        let grammar = grammar_of(a.json_schema.as_deref(), None)?;
        if grammar.is_some() {
            tags.push("json-schema".to_string());
        }
        let variant = (!tags.is_empty()).then(|| tags.join(", "));
        let task = crate::bench::model::ModelBench {
            batches: a.batches.clone(),
            variant,
            grammar,
            repeats: a.repeats as usize,
            ..Default::default()
        };
        records.extend(app::run_task(&load, task)?);
    }
    if opts.wants("spec") {
        let load = LoadOptions {
            model: a.model.clone(),
            device: DeviceChoice::Gpu,
            dtype: a.dtype,
            max_num_seqs: 4,
            batch_invariance: !a.run.no_batch_invariance,
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

/// `tessera profile`: sizes the engine for the task and prints the report.
fn profile_cmd(a: &ProfileArgs) -> Result<()> {
    let task = crate::profile::ProfileTask {
        batches: a.batches.clone(),
        context: a.context,
        prefill: a.prefill,
        steps: a.steps,
        grammar: grammar_of(a.json_schema.as_deref(), None)?,
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

#[cfg(test)]
mod tests;
