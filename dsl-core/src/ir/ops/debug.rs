//! Device assert and print.

use super::{Attr, Attrs, attr_str};
use crate::dtype::Type;

/// The debug family.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum DebugOp {
    /// `assert cond`: every element of the `i1` operand must be true, otherwise
    /// the kernel fails with `message` and the op's location.
    Assert {
        /// The message shown on failure.
        message: String,
    },
    /// `print x...`: prints the operands, prefixed, from each program.
    Print {
        /// Text printed before the values.
        prefix: String,
    },
}

mnemonics! { DebugOp: Assert = "assert", Print = "print" }

impl DebugOp {
    /// Attributes for printing.
    pub fn attrs(&self) -> Attrs {
        match self {
            DebugOp::Assert { message } => vec![("message", Attr::Str(message.clone()))],
            DebugOp::Print { prefix } => vec![("prefix", Attr::Str(prefix.clone()))],
        }
    }

    /// Parses from mnemonic and attributes.
    pub fn parse(name: &str, attrs: &[(String, Attr)]) -> Result<Option<DebugOp>, String> {
        Ok(Some(match name {
            "assert" => DebugOp::Assert { message: attr_str(attrs, "message")? },
            "print" => DebugOp::Print { prefix: attr_str(attrs, "prefix")? },
            _ => return Ok(None),
        }))
    }

    /// Result types (none).
    pub fn infer(&self, args: &[Type]) -> Result<Vec<Type>, String> {
        match self {
            DebugOp::Assert { .. } => match args {
                [c] if c.is_bool() => Ok(Vec::new()),
                _ => Err("`assert` takes one i1 operand".into()),
            },
            DebugOp::Print { .. } => Ok(Vec::new()),
        }
    }
}
