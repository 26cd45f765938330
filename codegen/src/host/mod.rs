//! The host target: the same verified, canonicalized tile IR compiled by
//! LLVM for the CPU this process runs on, linked into the process and run
//! program by program on a thread pool.
//!
//! Pipeline: verify, canonicalize, expand `load_block`s
//! (`dsl_core::passes::block_load`), axis analysis, the storage plan
//! (`plan.rs`: which tiles are computed inline in fused strip loops and
//! which are stack arrays), lowering to LLVM IR (`lower/`: one function per
//! kernel that runs one program), `default<O3>` for the host's CPU name and
//! features (`target.rs`), a relocatable object, cached in memory and on
//! disk (`cache.rs`, keyed by the IR, the CPU and the compiler), linked by
//! LLVM's ORC JIT (`jit.rs`) and launched over a grid by `launch.rs`;
//! `backend.rs` is the [`dsl_core::launch::Backend`] that owns host buffers
//! (`Host`).
//!
//! Invariants: every op computes what the interpreter computes, bit for bit
//! where the interpreter is exact (integers, comparisons, casts, rounding,
//! f16/bf16, reductions and scans in the interpreter's order, `dot` with
//! f64 sums in `k` order), so a result depends on the inputs and the tile
//! shapes only, never on the thread count, the schedule or the CPU's
//! vector width; float atomic adds from several programs are the one
//! exception (their order decides the rounding). An op without a lowering
//! is an [`Error::Unsupported`] naming it and its location. The compiled
//! code checks no bounds and detects no races: the interpreter
//! (`--device interp`) stays the oracle that does.

pub mod backend;
pub mod cache;
mod jit;
pub mod launch;
mod lower;
mod plan;
mod pool;
pub mod target;
#[cfg(test)]
mod tests;

pub use backend::{Host, HostPtr};
pub use cache::HostCache;
pub use launch::HostKernel;
pub use lower::ErrorSite;
pub use target::HostTarget;

use crate::{Error, Result};
use dsl_core::Function;
use inkwell::context::Context;
use inkwell::targets::FileType;

/// A kernel compiled for the host: a relocatable object defining `symbol`,
/// the entry of one program (see `lower/mod.rs` for its ABI).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostObject {
    /// The kernel's name.
    pub name: String,
    /// The entry symbol (unique per kernel, target and compiler).
    pub symbol: String,
    /// The object file's bytes.
    pub object: Vec<u8>,
    /// Runtime error sites, by code - 1.
    pub errors: Vec<ErrorSite>,
    /// Bytes of stack arrays one program allocates.
    pub frame_bytes: u64,
}

/// Every stage of one host compile, as text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostDumps {
    /// The printed IR after canonicalization.
    pub ir: String,
    /// The storage plan (one line per tile value).
    pub plan: String,
    /// The LLVM IR before optimization, then after `-O3`.
    pub llvm: String,
    /// The host assembly.
    pub asm: String,
}

/// Compiles `f` (a clone of it is canonicalized first) for `target`.
pub fn compile(f: &Function, target: &HostTarget, symbol: &str) -> Result<HostObject> {
    compile_inner(f, target, symbol, false).map(|(o, _)| o)
}

/// Compiles `f` like [`compile`] and returns the text of every stage too.
pub fn compile_with_dumps(
    f: &Function,
    target: &HostTarget,
    symbol: &str,
) -> Result<(HostObject, HostDumps)> {
    compile_inner(f, target, symbol, true)
}

fn compile_inner(
    f: &Function,
    target: &HostTarget,
    symbol: &str,
    want: bool,
) -> Result<(HostObject, HostDumps)> {
    dsl_core::verify::verify(f).map_err(|e| Error::Invalid(e.to_string()))?;
    let mut f = f.clone();
    dsl_core::passes::canonicalize::canonicalize(&mut f);
    dsl_core::passes::f8_dot::widen(&mut f);
    // `obj` writes each object to the temporary directory and prints where
    // its entry was linked (for profilers).
    let env = crate::dump::DumpRequest::from_env();
    let [env_ir, env_plan, env_llvm, env_asm, env_obj] =
        ["ir", "plan", "llvm", "asm", "obj"].map(|k| env.has(k));
    let mut dumps = HostDumps::default();
    if want || env_ir {
        dumps.ir = dsl_core::print::print(&f);
        if env_ir {
            crate::dump::print("ir", &f.name, &dumps.ir);
        }
    }
    dsl_core::passes::block_load::expand(&mut f);
    let axis = dsl_core::passes::axis::analyze(&f);
    let storage = plan::plan(&f);
    if want || env_plan {
        dumps.plan = plan::print(&f, &storage);
        if env_plan {
            crate::dump::print("plan", &f.name, &dumps.plan);
        }
    }
    let tm = target::target_machine(target)?;
    let ctx = Context::create();
    let module = ctx.create_module(&f.name);
    module.set_triple(&tm.get_triple());
    module.set_data_layout(&tm.get_target_data().get_data_layout());
    let lowered = lower::lower_function(&ctx, &module, &f, &storage, &axis, target, symbol)?;
    dumps.llvm = crate::optimize(&module, &tm, &f.name, want, env_llvm)?;
    if want || env_asm {
        let asm = tm
            .write_to_memory_buffer(&module, FileType::Assembly)
            .map_err(|e| Error::Llvm(format!("host assembly: {}", e.to_string())))?;
        dumps.asm = String::from_utf8_lossy(asm.as_slice()).trim_end_matches('\0').to_string();
        if env_asm {
            crate::dump::print("asm", &f.name, &dumps.asm);
        }
    }
    let obj = tm
        .write_to_memory_buffer(&module, FileType::Object)
        .map_err(|e| Error::Llvm(format!("host object: {}", e.to_string())))?;
    if env_obj {
        let path = std::env::temp_dir().join(format!("{symbol}.o"));
        if std::fs::write(&path, obj.as_slice()).is_ok() {
            eprintln!("// ---- TESSERA_DUMP obj: {} -> {} ----", f.name, path.display());
        }
    }
    let object = HostObject {
        name: f.name.clone(),
        symbol: symbol.to_string(),
        object: obj.as_slice().to_vec(),
        errors: lowered.errors,
        frame_bytes: lowered.frame_bytes,
    };
    Ok((object, dumps))
}
