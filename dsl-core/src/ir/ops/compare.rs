//! Comparisons (producing `i1`) and `select` (Triton's `where`).
//!
//! Float comparisons are ordered: any comparison with NaN is false except `ne`.
//! Pointers compare by address.

use super::{Attr, Attrs, attr_word, expect_args, same_shapes};
use crate::dtype::{DType, Elem, Type};

/// A comparison predicate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmpPred {
    /// Equal.
    Eq,
    /// Not equal.
    Ne,
    /// Less than.
    Lt,
    /// Less or equal.
    Le,
    /// Greater than.
    Gt,
    /// Greater or equal.
    Ge,
}

spellings! { CmpPred: Eq = "eq", Ne = "ne", Lt = "lt", Le = "le", Gt = "gt", Ge = "ge" }

impl CmpPred {
    /// Applies the predicate to an ordering result.
    pub fn holds(self, ord: Option<std::cmp::Ordering>) -> bool {
        use std::cmp::Ordering::*;
        match (self, ord) {
            (CmpPred::Ne, None) => true,
            (_, None) => false,
            (CmpPred::Eq, Some(o)) => o == Equal,
            (CmpPred::Ne, Some(o)) => o != Equal,
            (CmpPred::Lt, Some(o)) => o == Less,
            (CmpPred::Le, Some(o)) => o != Greater,
            (CmpPred::Gt, Some(o)) => o == Greater,
            (CmpPred::Ge, Some(o)) => o != Less,
        }
    }

    /// The predicate with operands swapped (`a < b` == `b > a`).
    pub fn swapped(self) -> CmpPred {
        match self {
            CmpPred::Lt => CmpPred::Gt,
            CmpPred::Le => CmpPred::Ge,
            CmpPred::Gt => CmpPred::Lt,
            CmpPred::Ge => CmpPred::Le,
            p => p,
        }
    }
}

/// The compare family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CompareOp {
    /// `cmp {pred} a, b`: operands of the same type; result `i1` of their shape.
    Cmp(CmpPred),
    /// `select c, a, b`: `c` is `i1`; `a` and `b` share a type, which is the result's.
    Select,
}

mnemonics! { CompareOp: Cmp = "cmp", Select = "select" }

impl CompareOp {
    /// Attributes for printing.
    pub fn attrs(&self) -> Attrs {
        match self {
            CompareOp::Cmp(p) => vec![("pred", Attr::Word(p.name().into()))],
            CompareOp::Select => Vec::new(),
        }
    }

    /// Parses from mnemonic and attributes.
    pub fn parse(name: &str, attrs: &[(String, Attr)]) -> Result<Option<CompareOp>, String> {
        Ok(Some(match name {
            "cmp" => {
                let p = attr_word(attrs, "pred")?;
                CompareOp::Cmp(CmpPred::from_name(p).ok_or(format!("unknown predicate `{p}`"))?)
            }
            "select" => CompareOp::Select,
            _ => return Ok(None),
        }))
    }

    /// Result types.
    pub fn infer(&self, args: &[Type]) -> Result<Vec<Type>, String> {
        match self {
            CompareOp::Cmp(_) => {
                expect_args("cmp", args, 2)?;
                same_shapes("cmp", args)?;
                if args[0].elem != args[1].elem {
                    return Err(format!(
                        "`cmp` operands must have the same dtype: {} vs {}",
                        args[0].elem, args[1].elem
                    ));
                }
                if matches!(args[0].elem, Elem::Scalar(d) if d.is_f8()) {
                    return Err(super::f8_arith("cmp", &args[0]));
                }
                Ok(vec![args[0].with_elem(Elem::Scalar(DType::I1))])
            }
            CompareOp::Select => {
                expect_args("select", args, 3)?;
                same_shapes("select", args)?;
                if !args[0].is_bool() {
                    return Err(format!("`select` needs an i1 condition, found {}", args[0]));
                }
                if args[1].elem != args[2].elem {
                    return Err(format!(
                        "`select` branches must have the same dtype: {} vs {}",
                        args[1].elem, args[2].elem
                    ));
                }
                Ok(vec![args[1].clone()])
            }
        }
    }
}
