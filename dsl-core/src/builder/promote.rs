//! Operand promotion and broadcasting, following Triton's rules.
//!
//! Dtype promotion for two tensors: if either is a float, the wider float wins
//! (f16 with bf16 gives f32; a float with an int gives the float); two ints give
//! the wider one, and on equal width with mixed signedness the unsigned one;
//! `i1` loses to any other int. Rust literals are weakly typed: an integer
//! literal takes the other operand's dtype (f32 if that is `i1`... see
//! [`Operand`]), a float literal takes a float operand's dtype and makes an int
//! operand f32.
//!
//! Broadcasting: ranks are aligned on the right by prepending size-1
//! dimensions; each dimension pair must be equal or contain a 1.

use crate::dtype::DType;

/// A binary-op operand: a tensor handle or a weakly typed Rust literal.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Operand {
    /// A value of the kernel.
    Tensor(super::Tensor),
    /// An integer literal.
    Int(i64),
    /// A float literal.
    Float(f64),
    /// A boolean literal.
    Bool(bool),
}

impl From<super::Tensor> for Operand {
    fn from(t: super::Tensor) -> Operand {
        Operand::Tensor(t)
    }
}

macro_rules! int_operand {
    ($($t:ty),*) => {$(
        impl From<$t> for Operand {
            fn from(v: $t) -> Operand {
                Operand::Int(v as i64)
            }
        }
    )*};
}
int_operand!(i8, u8, i16, u16, i32, u32, i64, usize, isize);

impl From<f32> for Operand {
    fn from(v: f32) -> Operand {
        Operand::Float(v as f64)
    }
}

impl From<f64> for Operand {
    fn from(v: f64) -> Operand {
        Operand::Float(v)
    }
}

impl From<bool> for Operand {
    fn from(v: bool) -> Operand {
        Operand::Bool(v)
    }
}

/// The dtype two tensor dtypes are promoted to before an arithmetic op.
pub fn computation_type(a: DType, b: DType) -> DType {
    if a == b {
        return a;
    }
    match (a.is_float(), b.is_float()) {
        (true, true) => {
            if a == DType::F64 || b == DType::F64 {
                DType::F64
            } else if a == DType::F32 || b == DType::F32 {
                DType::F32
            } else {
                // f16 with bf16: neither holds the other.
                DType::F32
            }
        }
        (true, false) => a,
        (false, true) => b,
        (false, false) => {
            if a == DType::I1 {
                return b;
            }
            if b == DType::I1 {
                return a;
            }
            match a.bits().cmp(&b.bits()) {
                std::cmp::Ordering::Greater => a,
                std::cmp::Ordering::Less => b,
                std::cmp::Ordering::Equal => {
                    if a.is_unsigned_int() {
                        a
                    } else {
                        b
                    }
                }
            }
        }
    }
}

/// The broadcast of two shapes, or a message naming the first incompatible dimension.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Result<Vec<usize>, String> {
    let rank = a.len().max(b.len());
    let pad = |s: &[usize]| -> Vec<usize> {
        let mut v = vec![1; rank - s.len()];
        v.extend_from_slice(s);
        v
    };
    let (pa, pb) = (pad(a), pad(b));
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let (x, y) = (pa[i], pb[i]);
        if x == y || y == 1 {
            out.push(x);
        } else if x == 1 {
            out.push(y);
        } else {
            return Err(format!(
                "shapes {} and {} cannot be broadcast: dimension {i} is {x} vs {y}",
                super::shape_str(a),
                super::shape_str(b)
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promotion_follows_triton() {
        assert_eq!(computation_type(DType::F16, DType::BF16), DType::F32);
        assert_eq!(computation_type(DType::I32, DType::F16), DType::F16);
        assert_eq!(computation_type(DType::I32, DType::U32), DType::U32);
        assert_eq!(computation_type(DType::I64, DType::U32), DType::I64);
        assert_eq!(computation_type(DType::I1, DType::I8), DType::I8);
    }

    #[test]
    fn broadcasting() {
        assert_eq!(broadcast_shapes(&[64, 1], &[32]).unwrap(), vec![64, 32]);
        assert_eq!(broadcast_shapes(&[], &[8, 4]).unwrap(), vec![8, 4]);
        assert!(broadcast_shapes(&[64], &[32]).unwrap_err().contains("dimension 0 is 64 vs 32"));
    }
}
