//! The host CPU as a compile target: the LLVM target machine for the
//! running CPU (its name and feature string as LLVM detects them), and the
//! strip width the lowering uses for tiles.
//!
//! Invariants: the X86 and AArch64 backends are the only host targets
//! initialized; every compile creates its own target machine (they are
//! cheap and not shared across threads). The target's name and features are
//! part of the object cache key, so an object compiled for one CPU is never
//! loaded on another.

use crate::{Error, Result};
use inkwell::OptimizationLevel;
use inkwell::targets::{CodeModel, InitializationConfig, RelocMode, TargetMachine, TargetTriple};

/// The CPU host code is compiled for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HostTarget {
    /// The LLVM target triple (`x86_64-unknown-linux-gnu`, ...).
    pub triple: String,
    /// The LLVM CPU name (`sapphirerapids`, `neoverse-v1`, ...).
    pub cpu: String,
    /// The LLVM feature string (`+avx2,+fma,...`).
    pub features: String,
}

impl HostTarget {
    /// The CPU this process runs on, as LLVM detects it.
    pub fn native() -> HostTarget {
        init();
        HostTarget {
            triple: TargetMachine::get_default_triple().as_str().to_string_lossy().into_owned(),
            cpu: TargetMachine::get_host_cpu_name().to_string(),
            features: TargetMachine::get_host_cpu_features().to_string(),
        }
    }

    /// True when the feature string enables `feature` (`"avx512f"`, ...).
    pub fn has(&self, feature: &str) -> bool {
        self.features.split(',').any(|f| f.strip_prefix('+') == Some(feature))
    }

    /// Lanes of one strip: the f32 elements of the widest vector register
    /// the CPU has (16 with AVX-512, 8 with AVX, 4 otherwise). Tiles are
    /// processed in strips of this many consecutive elements; the width
    /// changes no result (every reduction has a fixed order independent of
    /// it), only speed.
    pub fn strip_lanes(&self) -> u32 {
        if self.has("avx512f") {
            16
        } else if self.has("avx") {
            8
        } else {
            4
        }
    }

    /// True when the CPU converts between f32 and f16 in hardware (x86
    /// F16C, or any AArch64 CPU), so `fptrunc`/`fpext` to `half` lower to
    /// instructions instead of library calls.
    pub fn has_f16_conversions(&self) -> bool {
        self.triple.starts_with("aarch64") || self.has("f16c")
    }

    /// One line naming the target (for logs and the cache key).
    pub fn describe(&self) -> String {
        format!("{} ({})", self.cpu, self.triple)
    }
}

/// Initializes the host backends LLVM needs (idempotent).
fn init() {
    let config = InitializationConfig::default();
    inkwell::targets::Target::initialize_x86(&config);
    inkwell::targets::Target::initialize_aarch64(&config);
}

/// Creates the target machine for `target` at `-O3`, position-independent
/// (objects are linked at an address chosen when they are loaded).
pub fn target_machine(target: &HostTarget) -> Result<TargetMachine> {
    init();
    let triple = TargetTriple::create(&target.triple);
    let t = inkwell::targets::Target::from_triple(&triple)
        .map_err(|e| Error::Llvm(format!("no LLVM backend for the host triple {}: {e}", target.triple)))?;
    t.create_target_machine(
        &triple,
        &target.cpu,
        &target.features,
        OptimizationLevel::Aggressive,
        RelocMode::PIC,
        CodeModel::Default,
    )
    .ok_or_else(|| Error::Llvm(format!("LLVM could not create a target machine for {}", target.describe())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_target_is_detected() {
        let t = HostTarget::native();
        assert!(!t.cpu.is_empty() && !t.triple.is_empty());
        assert!([4, 8, 16].contains(&t.strip_lanes()));
        assert!(target_machine(&t).is_ok());
    }
}
