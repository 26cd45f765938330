//! `TESSERA_DUMP`: which compile stages to print to standard error.
//!
//! A comma-separated list of stage names (`ir`, `plan`, `llvm`, `ptx` for
//! the GPU; `ir`, `plan`, `llvm`, `asm`, `obj` for the host) or `all`. The
//! older name `DSL_DUMP` is still read, with a warning, when `TESSERA_DUMP`
//! is not set.

use std::sync::Once;

/// The stages the environment asks to print.
#[derive(Clone, Debug, Default)]
pub(crate) struct DumpRequest {
    stages: Vec<String>,
}

impl DumpRequest {
    /// Reads `TESSERA_DUMP` (or the deprecated `DSL_DUMP`).
    pub(crate) fn from_env() -> DumpRequest {
        let v = match std::env::var("TESSERA_DUMP") {
            Ok(v) => v,
            Err(_) => match std::env::var("DSL_DUMP") {
                Ok(v) => {
                    static WARN: Once = Once::new();
                    WARN.call_once(|| eprintln!("warning: DSL_DUMP is deprecated; use TESSERA_DUMP={v}"));
                    v
                }
                Err(_) => String::new(),
            },
        };
        DumpRequest { stages: v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect() }
    }

    /// Whether stage `k` is asked for.
    pub(crate) fn has(&self, k: &str) -> bool {
        self.stages.iter().any(|s| s == k || s == "all")
    }
}

/// Prints one stage's text for kernel `name`.
pub(crate) fn print(stage: &str, name: &str, text: &str) {
    eprintln!("// ---- TESSERA_DUMP {stage}: {name} ----\n{text}");
}
