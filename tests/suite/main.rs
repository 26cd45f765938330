//! The cross-crate test suite, one binary (linking is slow once codegen links LLVM).

mod ir_snapshots;
mod diagnostics;
