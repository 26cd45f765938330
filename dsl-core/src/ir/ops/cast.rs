//! Casts: numeric conversions, bitcasts and pointer casts.
//!
//! Numeric `cast` semantics: float to float and int to float round to nearest
//! even; float to int truncates toward zero and saturates (NaN becomes 0), as
//! PTX `cvt.rzi.sat` does; int to int sign- or zero-extends by the source's
//! signedness, or truncates; to `i1` means an unordered `!= 0` (NaN gives true).

use super::expect_args;
use crate::dtype::{DType, Elem, Type};

/// The cast family; the target dtype is also the result's dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CastOp {
    /// `cast`: numeric conversion of a number (tile) to `to`.
    Cast {
        /// Target dtype.
        to: DType,
    },
    /// `bitcast`: reinterpret the bits as `to`, which has the same width.
    Bitcast {
        /// Target dtype.
        to: DType,
    },
    /// `ptrcast`: a pointer (tile) to another pointee dtype, same addresses.
    PtrCast {
        /// New pointee dtype.
        to: DType,
    },
}

/// The dtypes an 8-bit float casts to and from: the 16- and 32-bit floats
/// and the 8-bit floats (each converts through f32 exactly but for the one
/// rounding to the target).
fn f8_partner(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16 | DType::F32 | DType::F8E4M3 | DType::F8E5M2)
}

mnemonics! { CastOp: Cast = "cast", Bitcast = "bitcast", PtrCast = "ptrcast" }

impl CastOp {
    /// Parses; the target dtype comes from the printed result type.
    pub fn parse(name: &str, results: &[Type]) -> Result<Option<CastOp>, String> {
        let to = || results.first().map(|t| t.dtype()).ok_or("missing result type".to_string());
        Ok(Some(match name {
            "cast" => CastOp::Cast { to: to()? },
            "bitcast" => CastOp::Bitcast { to: to()? },
            "ptrcast" => CastOp::PtrCast { to: to()? },
            _ => return Ok(None),
        }))
    }

    /// Result types.
    pub fn infer(&self, args: &[Type]) -> Result<Vec<Type>, String> {
        let name = self.name();
        expect_args(name, args, 1)?;
        let a = &args[0];
        match *self {
            CastOp::Cast { to } => match a.elem {
                Elem::Scalar(from)
                    if (from.is_f8() || to.is_f8()) && !(f8_partner(from) && f8_partner(to)) =>
                {
                    Err(format!(
                        "`cast` from {from} to {to}: 8-bit floats convert to and from f16, bf16 and f32 only \
                         (cast through f32)"
                    ))
                }
                Elem::Scalar(_) => Ok(vec![a.with_elem(Elem::Scalar(to))]),
                Elem::Ptr(_) => Err(format!("`cast` converts numbers; use `ptrcast` for {a}")),
            },
            CastOp::Bitcast { to } => match a.elem {
                Elem::Scalar(from) if from.bits() == to.bits() && from != DType::I1 => {
                    Ok(vec![a.with_elem(Elem::Scalar(to))])
                }
                _ => Err(format!("`bitcast` needs a number of the same width as {to}, found {a}")),
            },
            CastOp::PtrCast { to } => match a.elem {
                Elem::Ptr(_) => Ok(vec![a.with_elem(Elem::Ptr(to))]),
                Elem::Scalar(_) => Err(format!("`ptrcast` needs a pointer, found {a}")),
            },
        }
    }
}
