//! GPU targets and the LLVM NVPTX target machine for them.
//!
//! Invariant: only the NVPTX target is initialized; every compile creates its
//! own target machine (target machines are cheap and not shared across threads).

use crate::{Error, Result};
use inkwell::OptimizationLevel;
use inkwell::targets::{CodeModel, InitializationConfig, RelocMode, TargetMachine, TargetTriple};

/// A GPU architecture the compiler emits PTX for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// Ampere (`sm_80`), the baseline.
    Sm80,
    /// Hopper with architecture-specific features (`sm_90a`).
    Sm90a,
}

impl Target {
    /// The PTX architecture name (`sm_80`, `sm_90a`), also the LLVM CPU name.
    pub fn arch(self) -> &'static str {
        match self {
            Target::Sm80 => "sm_80",
            Target::Sm90a => "sm_90a",
        }
    }

    /// The LLVM feature string selecting the PTX ISA version. PTX 8.0 is the
    /// first version that knows `sm_90a`, and ptxas 12.x/13.x accept it for
    /// `sm_80` too, so both targets use it (one PTX dialect to snapshot).
    pub fn features(self) -> &'static str {
        "+ptx80"
    }

    /// The most shared memory one program of this architecture may use
    /// (opted in): 163 KiB on the A100 (`sm_80`), 227 KiB on Hopper.
    pub fn max_shared_bytes(self) -> u64 {
        match self {
            Target::Sm80 => 163 * 1024,
            Target::Sm90a => 227 * 1024,
        }
    }
}

/// The LLVM target triple of every module.
pub const TRIPLE: &str = "nvptx64-nvidia-cuda";

/// Creates the NVPTX target machine for `target` at `-O3`.
pub fn target_machine(target: Target) -> Result<TargetMachine> {
    inkwell::targets::Target::initialize_nvptx(&InitializationConfig::default());
    let triple = TargetTriple::create(TRIPLE);
    let t = inkwell::targets::Target::from_triple(&triple).map_err(|e| Error::Llvm(e.to_string()))?;
    t.create_target_machine(
        &triple,
        target.arch(),
        target.features(),
        OptimizationLevel::Aggressive,
        RelocMode::Default,
        CodeModel::Default,
    )
    .ok_or_else(|| {
        Error::Llvm(format!("LLVM could not create an NVPTX target machine for {}", target.arch()))
    })
}

/// The version string of the LLVM this crate links (part of the cache key).
pub fn llvm_version() -> String {
    let (major, minor, patch) = inkwell::support::get_llvm_version();
    format!("{major}.{minor}.{patch}")
}
