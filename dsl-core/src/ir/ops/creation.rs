//! Creation ops: scalar constants, `full` tiles, `splat` of a scalar, `arange`.

use super::{Attr, Attrs, attr, attr_int, attr_ints, expect_args, to_usize};
use crate::dtype::{Elem, Shape, Type};
use crate::ir::constant::Scalar;

/// Ops that make values from nothing or from one scalar.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum CreationOp {
    /// `const {value}`: a scalar constant. No operands.
    Const(Scalar),
    /// `full {value, shape}`: a tile with every element equal to `value`. No operands.
    Full {
        /// The element value.
        value: Scalar,
        /// The tile shape.
        shape: Shape,
    },
    /// `splat {shape}`: operand 0 is a scalar (number or pointer); result is a tile
    /// of `shape` with every element equal to it.
    Splat {
        /// The tile shape.
        shape: Shape,
    },
    /// `arange {start, end}`: the 1-D `i32` tile `start, start+1, ..., end-1`.
    /// No operands; `end - start` must be a power of two.
    Arange {
        /// First value.
        start: i32,
        /// One past the last value.
        end: i32,
    },
}

mnemonics! { CreationOp: Const = "const", Full = "full", Splat = "splat", Arange = "arange" }

impl CreationOp {
    /// Attributes for printing.
    pub fn attrs(&self) -> Attrs {
        match self {
            CreationOp::Const(v) => vec![("value", Attr::Const(*v))],
            CreationOp::Full { value, shape } => vec![
                ("value", Attr::Const(*value)),
                ("shape", Attr::Ints(shape.iter().map(|&d| d as i64).collect())),
            ],
            CreationOp::Splat { shape } => {
                vec![("shape", Attr::Ints(shape.iter().map(|&d| d as i64).collect()))]
            }
            CreationOp::Arange { start, end } => {
                vec![("start", Attr::Int(*start as i64)), ("end", Attr::Int(*end as i64))]
            }
        }
    }

    /// Parses from mnemonic and attributes; `Ok(None)` if the name is not in this family.
    pub fn parse(
        name: &str,
        attrs: &[(String, Attr)],
        results: &[Type],
    ) -> Result<Option<CreationOp>, String> {
        let value = || -> Result<Scalar, String> {
            let dt = results.first().ok_or("missing result type")?.dtype();
            match attr(attrs, "value") {
                Some(Attr::Const(s)) if dt.is_int() => Ok(Scalar::int(dt, s.as_i64())),
                Some(Attr::Const(s)) => Ok(Scalar::float(dt, s.as_f64())),
                Some(Attr::Int(i)) => Ok(Scalar::int(dt, *i)),
                _ => Err("missing attribute `value`".to_string()),
            }
        };
        let shape = || -> Result<Shape, String> {
            attr_ints(attrs, "shape")?.into_iter().map(|d| to_usize(d, "dimension")).collect()
        };
        Ok(Some(match name {
            "const" => CreationOp::Const(value()?),
            "full" => CreationOp::Full { value: value()?, shape: shape()? },
            "splat" => CreationOp::Splat { shape: shape()? },
            "arange" => {
                let start = attr_int(attrs, "start")?;
                let end = attr_int(attrs, "end")?;
                let conv = |v: i64| i32::try_from(v).map_err(|_| format!("arange bound {v} exceeds i32"));
                CreationOp::Arange { start: conv(start)?, end: conv(end)? }
            }
            _ => return Ok(None),
        }))
    }

    /// Result types.
    pub fn infer(&self, args: &[Type]) -> Result<Vec<Type>, String> {
        match self {
            CreationOp::Const(v) => {
                expect_args("const", args, 0)?;
                Ok(vec![Type::scalar(v.dtype())])
            }
            CreationOp::Full { value, shape } => {
                expect_args("full", args, 0)?;
                Ok(vec![Type::tile(Elem::Scalar(value.dtype()), shape)])
            }
            CreationOp::Splat { shape } => {
                expect_args("splat", args, 1)?;
                if !args[0].is_scalar() {
                    return Err(format!("`splat` takes a scalar, found {}", args[0]));
                }
                Ok(vec![Type::tile(args[0].elem, shape)])
            }
            CreationOp::Arange { start, end } => {
                expect_args("arange", args, 0)?;
                let n = i64::from(*end) - i64::from(*start);
                if n <= 0 {
                    return Err(format!("`arange` needs start < end, found {start}..{end}"));
                }
                Ok(vec![Type::tile(Elem::Scalar(crate::DType::I32), &[n as usize])])
            }
        }
    }
}
