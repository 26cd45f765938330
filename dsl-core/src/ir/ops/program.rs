//! Grid queries: `program_id` and `num_programs` along axis 0, 1 or 2 (`i32`).

use super::{Attr, Attrs, attr_int, expect_args};
use crate::dtype::{DType, Type};

/// The program family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProgramOp {
    /// Index of this program along `axis`.
    ProgramId {
        /// 0, 1 or 2.
        axis: u8,
    },
    /// Number of programs along `axis`.
    NumPrograms {
        /// 0, 1 or 2.
        axis: u8,
    },
}

impl ProgramOp {
    /// The mnemonic.
    pub fn name(&self) -> &'static str {
        match self {
            ProgramOp::ProgramId { .. } => "program_id",
            ProgramOp::NumPrograms { .. } => "num_programs",
        }
    }

    /// The axis.
    pub fn axis(&self) -> u8 {
        match *self {
            ProgramOp::ProgramId { axis } | ProgramOp::NumPrograms { axis } => axis,
        }
    }

    /// Attributes for printing.
    pub fn attrs(&self) -> Attrs {
        vec![("axis", Attr::Int(self.axis() as i64))]
    }

    /// Parses from mnemonic and attributes.
    pub fn parse(name: &str, attrs: &[(String, Attr)]) -> Result<Option<ProgramOp>, String> {
        let axis = || -> Result<u8, String> {
            let a = attr_int(attrs, "axis")?;
            u8::try_from(a).map_err(|_| format!("axis {a} out of range"))
        };
        Ok(Some(match name {
            "program_id" => ProgramOp::ProgramId { axis: axis()? },
            "num_programs" => ProgramOp::NumPrograms { axis: axis()? },
            _ => return Ok(None),
        }))
    }

    /// Result types.
    pub fn infer(&self, args: &[Type]) -> Result<Vec<Type>, String> {
        expect_args(self.name(), args, 0)?;
        if self.axis() > 2 {
            return Err(format!("`{}` axis must be 0, 1 or 2, found {}", self.name(), self.axis()));
        }
        Ok(vec![Type::scalar(DType::I32)])
    }
}
