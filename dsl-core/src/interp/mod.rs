//! The CPU interpreter: runs a function over a grid, program by program.

use crate::loc::Location;

/// An error raised while interpreting a kernel, naming the op and its location.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{loc}: in `{op}`: {message}")]
pub struct InterpError {
    /// Location of the failing op in the kernel source.
    pub loc: Location,
    /// The failing op's mnemonic.
    pub op: &'static str,
    /// What went wrong.
    pub message: String,
}
