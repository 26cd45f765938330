//! Value annotations for the axis analysis (Triton's `multiple_of`,
//! `max_contiguous`, `max_constancy`). They return their operand unchanged;
//! the author promises the property, and the interpreter checks the promise.

use super::{Attr, Attrs, attr_ints, expect_args};
use crate::dtype::Type;

/// The hint family; each list has one entry per dimension (one for scalars).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum HintOp {
    /// Every element is a multiple of the value (per dimension: the first
    /// element of each run); for pointers the value counts bytes of the address.
    MultipleOf(Vec<u32>),
    /// Runs of this many consecutive elements along each dimension are
    /// contiguous (`x, x+1, ...`).
    MaxContiguous(Vec<u32>),
    /// Runs of this many consecutive elements along each dimension are equal.
    MaxConstancy(Vec<u32>),
}

mnemonics! { HintOp:
    MultipleOf = "multiple_of", MaxContiguous = "max_contiguous", MaxConstancy = "max_constancy",
}

impl HintOp {
    /// The per-dimension values.
    pub fn values(&self) -> &[u32] {
        match self {
            HintOp::MultipleOf(v) | HintOp::MaxContiguous(v) | HintOp::MaxConstancy(v) => v,
        }
    }

    /// Attributes for printing.
    pub fn attrs(&self) -> Attrs {
        vec![("values", Attr::Ints(self.values().iter().map(|&v| v as i64).collect()))]
    }

    /// Parses from mnemonic and attributes.
    pub fn parse(name: &str, attrs: &[(String, Attr)]) -> Result<Option<HintOp>, String> {
        let vals = || -> Result<Vec<u32>, String> {
            attr_ints(attrs, "values")?
                .into_iter()
                .map(|v| u32::try_from(v).map_err(|_| format!("hint value {v} out of range")))
                .collect()
        };
        Ok(Some(match name {
            "multiple_of" => HintOp::MultipleOf(vals()?),
            "max_contiguous" => HintOp::MaxContiguous(vals()?),
            "max_constancy" => HintOp::MaxConstancy(vals()?),
            _ => return Ok(None),
        }))
    }

    /// Result types.
    pub fn infer(&self, args: &[Type]) -> Result<Vec<Type>, String> {
        expect_args(self.name(), args, 1)?;
        let a = &args[0];
        if !(a.is_int() || a.is_ptr()) || a.is_bool() {
            return Err(format!("`{}` applies to integers and pointers, found {a}", self.name()));
        }
        if self.values().len() != a.rank().max(1) {
            return Err(format!(
                "`{}` needs one value per dimension ({}), found {}",
                self.name(),
                a.rank().max(1),
                self.values().len()
            ));
        }
        if self.values().iter().any(|&v| v == 0 || !v.is_power_of_two()) {
            return Err(format!("`{}` values must be powers of two, found {:?}", self.name(), self.values()));
        }
        Ok(vec![a.clone()])
    }
}
