//! `dot a, b, acc`: tile matrix product with accumulation, `acc + a @ b`.
//!
//! `a` is `[M, K]`, `b` is `[K, N]`, `acc` and the result `[M, N]`. Inputs are
//! f16, bf16, f32, f8e4m3 or f8e5m2 (both the same) with an f32 accumulator,
//! or i8 with an i32 accumulator. Products are formed exactly and summed in
//! the accumulator's precision.

use super::{Attr, Attrs, attr, attr_word, expect_args};
use crate::dtype::{DType, Elem, Type, fmt_shape};

/// Precision of f32 inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum DotPrecision {
    /// Full f32 products.
    #[default]
    Ieee,
    /// Inputs may be rounded to tf32 (tensor cores).
    Tf32,
}

/// The dot family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct DotOp {
    /// Precision of f32 inputs.
    pub precision: DotPrecision,
}

impl DotOp {
    /// The mnemonic.
    pub fn name(&self) -> &'static str {
        "dot"
    }

    /// Attributes for printing (the default is omitted).
    pub fn attrs(&self) -> Attrs {
        match self.precision {
            DotPrecision::Ieee => Vec::new(),
            DotPrecision::Tf32 => vec![("precision", Attr::Word("tf32".into()))],
        }
    }

    /// Parses from mnemonic and attributes.
    pub fn parse(name: &str, attrs: &[(String, Attr)]) -> Result<Option<DotOp>, String> {
        if name != "dot" {
            return Ok(None);
        }
        let precision = match attr(attrs, "precision") {
            None => DotPrecision::Ieee,
            Some(_) => match attr_word(attrs, "precision")? {
                "ieee" => DotPrecision::Ieee,
                "tf32" => DotPrecision::Tf32,
                w => return Err(format!("unknown dot precision `{w}`")),
            },
        };
        Ok(Some(DotOp { precision }))
    }

    /// Result types.
    pub fn infer(&self, args: &[Type]) -> Result<Vec<Type>, String> {
        expect_args("dot", args, 3)?;
        let (a, b, c) = (&args[0], &args[1], &args[2]);
        for (t, what) in [(a, "a"), (b, "b"), (c, "acc")] {
            if t.rank() != 2 || t.is_ptr() {
                return Err(format!("`dot` operand {what} must be a 2-D number tile, found {t}"));
            }
        }
        if a.elem != b.elem {
            return Err(format!("`dot` inputs must share a dtype: {} vs {}", a.elem, b.elem));
        }
        let want_acc = match a.dtype() {
            DType::F16 | DType::BF16 | DType::F32 | DType::F8E4M3 | DType::F8E5M2 => DType::F32,
            DType::I8 => DType::I32,
            d => {
                return Err(format!(
                    "`dot` supports f16, bf16, f32, f8e4m3, f8e5m2 and i8 inputs, found {d}"
                ));
            }
        };
        if c.elem != Elem::Scalar(want_acc) {
            return Err(format!(
                "`dot` accumulator must be {want_acc} for {} inputs, found {}",
                a.dtype(),
                c.elem
            ));
        }
        let (m, k) = (a.shape[0], a.shape[1]);
        let (k2, n) = (b.shape[0], b.shape[1]);
        if k != k2 {
            return Err(format!(
                "`dot` inner dimensions differ: a is {} and b is {} (K {k} vs {k2})",
                fmt_shape(&a.shape),
                fmt_shape(&b.shape)
            ));
        }
        if c.shape.as_slice() != [m, n] {
            return Err(format!("`dot` accumulator must be [{m}, {n}], found {}", fmt_shape(&c.shape)));
        }
        Ok(vec![c.clone()])
    }
}
