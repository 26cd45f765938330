//! Reductions along one axis and scans (inclusive prefix combines).
//!
//! Built-in kinds cover sum/max/min/argmax/argmin; `custom` reductions and
//! scans own one region whose block takes `2n` scalar arguments (the running
//! values, then the new values) and yields `n` combined scalars. The combine
//! must be associative; the GPU may apply it in tree order.
//!
//! `argmax`/`argmin` return the `i32` index along the axis; ties resolve to the
//! smallest index; NaN is ignored unless every element is NaN.

use super::{Attr, Attrs, attr_flag, attr_int, attr_word, to_usize};
use crate::dtype::{DType, Elem, Type, fmt_shape};

/// What a reduction computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceKind {
    /// Sum (in the element dtype).
    Sum,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
    /// Index of the maximum.
    Argmax,
    /// Index of the minimum.
    Argmin,
    /// A combine region.
    Custom,
}

/// What a scan computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScanKind {
    /// Running sum.
    Sum,
    /// Running maximum.
    Max,
    /// Running minimum.
    Min,
    /// A combine region.
    Custom,
}

/// `reduce {axis, kind} x...`: removes `axis` from the operands' common shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReduceOp {
    /// The reduced axis.
    pub axis: usize,
    /// The combine.
    pub kind: ReduceKind,
}

/// `scan {axis, kind[, reverse]} x...`: same shapes in and out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ScanOp {
    /// The scanned axis.
    pub axis: usize,
    /// The combine.
    pub kind: ScanKind,
    /// Scan from the last element to the first.
    pub reverse: bool,
}

spellings! { ReduceKind:
    Sum = "sum", Max = "max", Min = "min", Argmax = "argmax", Argmin = "argmin", Custom = "custom",
}
spellings! { ScanKind: Sum = "sum", Max = "max", Min = "min", Custom = "custom" }

/// The `axis` and `kind` attributes of a `reduce` or `scan` (`op`), the
/// kind read by `from_name`.
fn axis_and_kind<K>(
    attrs: &[(String, Attr)],
    from_name: fn(&str) -> Option<K>,
    op: &str,
) -> Result<(usize, K), String> {
    let axis = to_usize(attr_int(attrs, "axis")?, "axis")?;
    let k = attr_word(attrs, "kind")?;
    let kind = from_name(k).ok_or(format!("unknown {op} kind `{k}`"))?;
    Ok((axis, kind))
}

/// Checks the shared operand rules and returns the common shape.
fn common_shape<'a>(name: &str, args: &'a [Type], axis: usize) -> Result<&'a [usize], String> {
    let first = args.first().ok_or(format!("`{name}` needs at least one operand"))?;
    for a in args {
        if a.shape != first.shape {
            return Err(format!(
                "`{name}` operands must share a shape: {} vs {}",
                fmt_shape(&first.shape),
                fmt_shape(&a.shape)
            ));
        }
        if a.is_ptr() {
            return Err(format!("`{name}` needs numbers, found {a}"));
        }
    }
    if axis >= first.rank() {
        return Err(format!("`{name}` axis {axis} is out of range for a rank-{} tile", first.rank()));
    }
    Ok(&first.shape)
}

impl ReduceOp {
    /// The mnemonic.
    pub fn name(&self) -> &'static str {
        "reduce"
    }

    /// Attributes for printing.
    pub fn attrs(&self) -> Attrs {
        vec![("axis", Attr::Int(self.axis as i64)), ("kind", Attr::Word(self.kind.name().into()))]
    }

    /// Parses from mnemonic and attributes.
    pub fn parse(name: &str, attrs: &[(String, Attr)]) -> Result<Option<ReduceOp>, String> {
        if name != "reduce" {
            return Ok(None);
        }
        let (axis, kind) = axis_and_kind(attrs, ReduceKind::from_name, "reduce")?;
        Ok(Some(ReduceOp { axis, kind }))
    }

    /// Result types.
    pub fn infer(&self, args: &[Type]) -> Result<Vec<Type>, String> {
        let shape = common_shape("reduce", args, self.axis)?;
        if let Some(a) = args.iter().find(|a| matches!(a.elem, Elem::Scalar(d) if d.is_f8())) {
            return Err(super::f8_arith("reduce", a));
        }
        if self.kind != ReduceKind::Custom && args.len() != 1 {
            return Err(format!("`reduce` of kind {} takes one operand", self.kind.name()));
        }
        let mut out: Vec<usize> = shape.to_vec();
        out.remove(self.axis);
        Ok(args
            .iter()
            .map(|a| {
                let elem = match self.kind {
                    ReduceKind::Argmax | ReduceKind::Argmin => Elem::Scalar(DType::I32),
                    _ => a.elem,
                };
                Type::tile(elem, &out)
            })
            .collect())
    }
}

impl ScanOp {
    /// The mnemonic.
    pub fn name(&self) -> &'static str {
        "scan"
    }

    /// Attributes for printing.
    pub fn attrs(&self) -> Attrs {
        let mut a =
            vec![("axis", Attr::Int(self.axis as i64)), ("kind", Attr::Word(self.kind.name().into()))];
        if self.reverse {
            a.push(("reverse", Attr::Flag));
        }
        a
    }

    /// Parses from mnemonic and attributes.
    pub fn parse(name: &str, attrs: &[(String, Attr)]) -> Result<Option<ScanOp>, String> {
        if name != "scan" {
            return Ok(None);
        }
        let (axis, kind) = axis_and_kind(attrs, ScanKind::from_name, "scan")?;
        Ok(Some(ScanOp { axis, kind, reverse: attr_flag(attrs, "reverse") }))
    }

    /// Result types.
    pub fn infer(&self, args: &[Type]) -> Result<Vec<Type>, String> {
        common_shape("scan", args, self.axis)?;
        if self.kind != ScanKind::Custom && args.len() != 1 {
            return Err(format!("`scan` of kind {} takes one operand", self.kind.name()));
        }
        Ok(args.to_vec())
    }
}
