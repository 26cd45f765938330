//! The `tessera` command line: argument definitions (clap derive) and the
//! subcommands' implementations. `main.rs` only parses and calls [`run`].
//!
//! Invariants: user input never panics (bad names, files and shapes are
//! [`Error::Usage`]); a missing GPU or driver is a one-line error, not a crash;
//! the exit status is 0 on success, 1 on errors and failed checks.

use crate::bench::{self, BenchOptions, Peers};
use crate::check;
use crate::cuda::Cuda;
use crate::error::{Error, Result};
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
    /// Measure kernel throughput on the GPU (softmax, add+RMSNorm and the copy ceiling).
    Bench(BenchArgs),
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
    /// add_rmsnorm, decode, attention, gemm, sampling); all when empty.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
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
        Command::Bench(a) => bench_cmd(&a).map(|()| true),
    }
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
    let copts = codegen::CompileOptions {
        target: a.target.into(),
        num_warps: opts.num_warps,
        num_stages: opts.num_stages,
    };
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
        if registry::find(name).is_none() {
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
        match (e.check)(&mut cuda, a.seed.wrapping_add(i as u64)) {
            Ok(r) => rows.extend(r),
            Err(err) => {
                // A kernel that fails to compile or launch fails the check but
                // does not hide the others.
                eprintln!("error: {}: {err}", e.name);
                rows.push(check::CheckRow {
                    kernel: e.name.into(),
                    shape: "(error)".into(),
                    dtype: dsl_core::DType::F32,
                    max_abs: f64::INFINITY,
                    max_rel: f64::INFINITY,
                    pass: false,
                });
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
    let records = bench::run(&mut cuda, &opts)?;
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
