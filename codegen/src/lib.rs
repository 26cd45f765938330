//! NVPTX code generation for the tile IR: a verified `dsl_core::Function` is
//! canonicalized, its `load_block`s expanded into masked loads
//! (`dsl_core::passes::block_load`), analyzed (axis analysis), lowered to
//! LLVM IR with inkwell, optimized at `-O3` and emitted as PTX by LLVM's
//! NVPTX backend.
//!
//! Invariants: this crate depends on neither cudarc nor NVRTC; PTX comes only
//! from LLVM (no hand-written PTX, no inline assembly). Every compile creates
//! its own LLVM context. Unsupported constructs return [`Error::Unsupported`]
//! naming the op and its source location; nothing a kernel author controls
//! makes this crate panic.
//!
//! Kernel ABI (what the runtime launches): one `.entry` named after the
//! function; parameters in IR order (pointers as 64-bit global pointers, `i1`
//! scalars as `i32`, other scalars as themselves); block `(32 * num_warps, 1, 1)`;
//! grid = programs; `shared_bytes` of dynamic shared memory.

pub mod blocked;
pub mod cache;
mod dump;
mod fnv;
pub mod fragment;
pub mod host;
mod llvm;
mod lower;
pub mod target;
pub mod tensor_map;

pub use cache::PtxCache;
pub use target::Target;

use dsl_core::Location;
use inkwell::context::Context;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::FileType;

/// Options of one compile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CompileOptions {
    /// The GPU architecture.
    pub target: Target,
    /// Warps per program (block = 32 * num_warps threads); a power of two, 1..=32.
    pub num_warps: u32,
    /// Software pipelining depth of loops that feed tensor-core `dot`
    /// operands (`cp.async` stages, see the pipeline pass); 1 disables it.
    pub num_stages: u32,
    /// Occupancy hint: `.minnctapersm` (ptxas keeps registers low enough
    /// for this many programs per SM); 0 emits none and leaves ptxas its
    /// own choice.
    pub min_programs_per_sm: u32,
}

impl CompileOptions {
    /// The options of a launch (`dsl_core::launch::LaunchOptions`) for `target`.
    pub fn for_launch(target: Target, launch: &dsl_core::launch::LaunchOptions) -> CompileOptions {
        CompileOptions {
            target,
            num_warps: launch.num_warps,
            num_stages: launch.num_stages,
            min_programs_per_sm: launch.min_programs_per_sm,
        }
    }
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions { target: Target::Sm80, num_warps: 4, num_stages: 1, min_programs_per_sm: 0 }
    }
}

/// A compiled kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compiled {
    /// The kernel (and `.entry`) name.
    pub name: String,
    /// The PTX text.
    pub ptx: String,
    /// Dynamic shared memory the launch must provide, in bytes.
    pub shared_bytes: u32,
    /// Warps per program (block = 32 * num_warps threads).
    pub num_warps: u32,
    /// The architecture the PTX is for.
    pub target: Target,
    /// Hidden tensor-map parameters the launch appends after the kernel's
    /// own, in order (see [`tensor_map`]).
    pub tensor_maps: Vec<tensor_map::TensorMapSpec>,
}

/// Every stage of one compile, as text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dumps {
    /// The printed IR after canonicalization.
    pub ir: String,
    /// The kernel plan (`TESSERA_DUMP=plan`): every lowering decision taken
    /// before LLVM is emitted.
    pub plan: String,
    /// The LLVM IR before optimization, then after `-O3`.
    pub llvm: String,
    /// The PTX.
    pub ptx: String,
}

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Unsupported: the op (or one of its operand types) has no lowering yet.
    #[error("{loc}: `{op}` is not supported by the {target} code generator: {why}")]
    Unsupported {
        /// Which code generator (`GPU` or `host`).
        target: &'static str,
        /// The op mnemonic.
        op: String,
        /// The op's source location.
        loc: Location,
        /// What exactly is missing.
        why: String,
    },
    /// User error: a compiled host kernel stopped at a runtime check (a
    /// failed `device_assert`, a `for` step that is not positive).
    #[error("{loc}: in `{op}`: program ({}, {}, {}): {message}", program[0], program[1], program[2])]
    Kernel {
        /// The op mnemonic.
        op: String,
        /// The op's source location.
        loc: Location,
        /// What went wrong.
        message: String,
        /// The first failing program's coordinates.
        program: [u32; 3],
    },
    /// User error: the function does not verify, or the options are invalid.
    #[error("invalid input: {0}")]
    Invalid(String),
    /// Bug: LLVM rejected what this crate built (or could not emit it).
    #[error("LLVM error (a code generator bug): {0}")]
    Llvm(String),
    /// The compile cache could not read or write its directory.
    #[error("compile cache I/O error: {0}")]
    Io(#[from] std::io::Error),
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<inkwell::builder::BuilderError> for Error {
    fn from(e: inkwell::builder::BuilderError) -> Self {
        Error::Llvm(format!("builder: {e}"))
    }
}

/// Compiles `f` (a clone of it is canonicalized first) to PTX.
pub fn compile(f: &dsl_core::Function, opts: &CompileOptions) -> Result<Compiled> {
    compile_inner(f, opts, false).map(|(c, _)| c)
}

/// Compiles `f` like [`compile`] and returns the text of every stage too.
pub fn compile_with_dumps(f: &dsl_core::Function, opts: &CompileOptions) -> Result<(Compiled, Dumps)> {
    compile_inner(f, opts, true)
}

/// Verifies `module` and runs LLVM's `default<O3>` pipeline on it for `tm`.
/// Returns the module's text before and after when `keep` or `print` asks
/// for it (`print`: also to standard error, as kernel `name`'s `llvm` dump).
pub(crate) fn optimize(
    module: &inkwell::module::Module<'_>,
    tm: &inkwell::targets::TargetMachine,
    name: &str,
    keep: bool,
    print: bool,
) -> Result<String> {
    let mut text = String::new();
    if keep || print {
        text = format!("; ---- before optimization ----\n{}", module.print_to_string().to_string());
    }
    module.verify().map_err(|e| Error::Llvm(format!("module verification failed: {}", e.to_string())))?;
    module
        .run_passes("default<O3>", tm, PassBuilderOptions::create())
        .map_err(|e| Error::Llvm(format!("O3 pipeline: {}", e.to_string())))?;
    if keep || print {
        text.push_str(&format!("\n; ---- after O3 ----\n{}", module.print_to_string().to_string()));
        if print {
            dump::print("llvm", name, &text);
        }
    }
    Ok(text)
}

/// The kernel plan of `f` for `opts` as text (what `TESSERA_DUMP=plan`
/// prints): `f` is verified, canonicalized and planned as [`compile`] does
/// (its FP8 `dot`s native or widened, its `load_block`s expanded); nothing
/// is emitted.
pub fn plan_text(f: &dsl_core::Function, opts: &CompileOptions) -> Result<String> {
    let (_, f, plan) = planned(prepared(f, opts)?, opts);
    Ok(plan.print(&f))
}

/// Rejects options no kernel can be compiled with.
fn check_options(opts: &CompileOptions) -> Result<()> {
    if opts.num_warps == 0 || !opts.num_warps.is_power_of_two() || opts.num_warps > 32 {
        return Err(Error::Invalid(format!(
            "num_warps must be a power of two in 1..=32, got {}",
            opts.num_warps
        )));
    }
    // What one SM can hold at once on sm_80 and sm_90: 2048 threads, 32
    // programs (u64: an absurd hint must not overflow the product).
    let threads = u64::from(opts.min_programs_per_sm) * 32 * u64::from(opts.num_warps);
    if opts.min_programs_per_sm > 32 || threads > 2048 {
        return Err(Error::Invalid(format!(
            "min_programs_per_sm = {} with {} warps asks for {threads} threads per SM; an SM holds at most 2048 threads in 32 programs",
            opts.min_programs_per_sm, opts.num_warps
        )));
    }
    Ok(())
}

/// `f` checked against `opts`, verified and canonicalized (what both
/// [`compile`] and [`plan_text`] plan from).
fn prepared(f: &dsl_core::Function, opts: &CompileOptions) -> Result<dsl_core::Function> {
    check_options(opts)?;
    dsl_core::verify::verify(f).map_err(|e| Error::Invalid(e.to_string()))?;
    let mut f = f.clone();
    dsl_core::passes::canonicalize::canonicalize(&mut f);
    Ok(f)
}

/// The prepared `f` as it is lowered (its `load_block`s expanded into
/// ordinary masked loads, which the lowering copies with TMA where it can)
/// and its plan. FP8 `dot`s run natively where the plan
/// confirms them (`KernelPlan::fp8_native`, sm_90a); otherwise their
/// operands are widened to f16 (exact), so they take the f16 tensor-core
/// paths, and `f` is planned again. Returns the function before expansion
/// too (what the IR dump shows).
fn planned(
    mut f: dsl_core::Function,
    opts: &CompileOptions,
) -> (dsl_core::Function, dsl_core::Function, lower::plan::KernelPlan) {
    let plan_of = |f: &dsl_core::Function| {
        let mut g = f.clone();
        let blocks = dsl_core::passes::block_load::expand(&mut g);
        let plan = lower::plan::KernelPlan::build(&g, &blocks, opts);
        (g, plan)
    };
    if opts.target == Target::Sm90a && has_f8_dot(&f) {
        let (g, plan) = plan_of(&f);
        if plan.fp8_native(&g) {
            return (f, g, plan);
        }
    }
    dsl_core::passes::f8_dot::widen(&mut f);
    let (g, plan) = plan_of(&f);
    (f, g, plan)
}

/// Whether `f` has a `dot` of FP8 operands.
fn has_f8_dot(f: &dsl_core::Function) -> bool {
    let mut any = false;
    f.walk(|i| {
        any |= matches!(f.insts[i].op, dsl_core::ir::Op::Dot(_)) && f.ty(f.insts[i].args[0]).dtype().is_f8();
    });
    any
}

fn compile_inner(f: &dsl_core::Function, opts: &CompileOptions, want: bool) -> Result<(Compiled, Dumps)> {
    let (ir, f, plan) = planned(prepared(f, opts)?, opts);
    let env = dump::DumpRequest::from_env();
    let (env_ir, env_plan, env_llvm, env_ptx) =
        (env.has("ir"), env.has("plan"), env.has("llvm"), env.has("ptx"));
    let mut dumps = Dumps::default();
    if want || env_ir {
        dumps.ir = dsl_core::print::print(&ir);
        if env_ir {
            dump::print("ir", &f.name, &dumps.ir);
        }
    }
    if want || env_plan {
        dumps.plan = plan.print(&f);
        if env_plan {
            dump::print("plan", &f.name, &dumps.plan);
        }
    }
    let tm = target::target_machine(opts.target)?;
    let ctx = Context::create();
    let module = ctx.create_module(&f.name);
    module.set_triple(&tm.get_triple());
    module.set_data_layout(&tm.get_target_data().get_data_layout());
    let lowered = lower::lower_planned(&ctx, &module, &f, &plan)?;
    dumps.llvm = optimize(&module, &tm, &f.name, want, env_llvm)?;
    let buf = tm
        .write_to_memory_buffer(&module, FileType::Assembly)
        .map_err(|e| Error::Llvm(format!("PTX emission: {}", e.to_string())))?;
    let ptx = String::from_utf8_lossy(buf.as_slice()).trim_end_matches('\0').to_string();
    if env_ptx {
        dump::print("ptx", &f.name, &ptx);
    }
    if want {
        dumps.ptx = ptx.clone();
    }
    let compiled = Compiled {
        name: f.name.clone(),
        ptx,
        shared_bytes: lowered.smem_bytes,
        num_warps: opts.num_warps,
        target: opts.target,
        tensor_maps: lowered.tensor_maps,
    };
    Ok((compiled, dumps))
}
