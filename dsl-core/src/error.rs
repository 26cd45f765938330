//! The crate's error type. Every variant says whether it is a user error, a bug
//! in the IR producer, or something unsupported.

use crate::loc::Location;
use std::fmt;

/// One located problem: a build-time type/shape error or a verifier finding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// Where in the kernel source the offending op was written.
    pub loc: Location,
    /// The op's mnemonic, when the problem belongs to an op.
    pub op: Option<&'static str>,
    /// What is wrong, as a full sentence.
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.op {
            Some(op) => write!(f, "{}: in `{}`: {}", self.loc, op, self.message),
            None => write!(f, "{}: {}", self.loc, self.message),
        }
    }
}

/// Formats a list of diagnostics, one per line.
pub fn fmt_diagnostics(diags: &[Diagnostic]) -> String {
    diags.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("\n")
}

/// Errors of `dsl-core`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// User error: the kernel body has type or shape errors (all of them are listed).
    #[error("kernel `{kernel}` failed to build:\n{}", fmt_diagnostics(.diagnostics))]
    Build {
        /// Name of the kernel.
        kernel: String,
        /// Every problem found, in program order.
        diagnostics: Vec<Diagnostic>,
    },
    /// Bug in the IR producer: the IR violates an invariant (all violations are listed).
    #[error("IR of `{kernel}` is malformed:\n{}", fmt_diagnostics(.diagnostics))]
    Verify {
        /// Name of the function.
        kernel: String,
        /// Every violation found.
        diagnostics: Vec<Diagnostic>,
    },
    /// User error: IR text could not be parsed.
    #[error("parse error at line {line}, column {col}: {message}")]
    Parse {
        /// 1-based line in the text.
        line: usize,
        /// 1-based column in the text.
        col: usize,
        /// What was expected.
        message: String,
    },
    /// User error: the kernel did something invalid while running in the interpreter
    /// (out-of-bounds access, race between programs, integer overflow, failed assert).
    #[error("{0}")]
    Interp(#[from] crate::interp::InterpError),
    /// User error: the launch itself is invalid (wrong argument count or kinds, bad grid).
    #[error("invalid launch of `{kernel}`: {message}")]
    Launch {
        /// Name of the kernel.
        kernel: String,
        /// What is wrong.
        message: String,
    },
    /// Unsupported: the construct is valid but not implemented by this component.
    #[error("unsupported: {0}")]
    Unsupported(String),
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
