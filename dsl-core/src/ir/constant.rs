//! Compile-time scalar constants (`Scalar`): a dtype and a value that is exactly
//! representable in it.
//!
//! Invariant: integers are stored wrapped to their dtype and sign-extended to
//! `i64`; floats are stored rounded to their dtype, as `f64` bits (so constants
//! are hashable and compare bit-exactly, which CSE relies on).

use crate::dtype::DType;
use std::fmt;

/// A typed compile-time constant.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Scalar {
    dtype: DType,
    bits: u64,
}

impl Scalar {
    /// An integer constant, wrapped to `dtype`; for a float `dtype` it is converted.
    pub fn int(dtype: DType, v: i64) -> Scalar {
        if dtype.is_float() {
            return Scalar::float(dtype, v as f64);
        }
        Scalar { dtype, bits: dtype.wrap_int(v) as u64 }
    }

    /// A float constant, rounded to `dtype`; for an integer `dtype` it is truncated
    /// toward zero and saturated to the dtype's range (NaN becomes 0).
    pub fn float(dtype: DType, v: f64) -> Scalar {
        if dtype.is_int() {
            // Cast semantics: truncate toward zero, saturate to the dtype, NaN is 0.
            let (lo, hi) = dtype.int_range().unwrap_or((i64::MIN, i64::MAX));
            let t = if v.is_nan() { 0.0 } else { v.trunc() };
            let i = if t <= lo as f64 {
                lo
            } else if t >= hi as f64 {
                hi
            } else {
                t as i64
            };
            return Scalar::int(dtype, i);
        }
        // NaNs are canonicalized: the IR has one NaN per dtype (sign and payload
        // are not observable through the language), so constants compare by bits.
        let v = if v.is_nan() { f64::NAN } else { dtype.round_float(v) };
        Scalar { dtype, bits: v.to_bits() }
    }

    /// A boolean constant (`i1`).
    pub fn bool(v: bool) -> Scalar {
        Scalar::int(DType::I1, v as i64)
    }

    /// Zero of `dtype`.
    pub fn zero(dtype: DType) -> Scalar {
        Scalar::int(dtype, 0)
    }

    /// The dtype.
    pub fn dtype(self) -> DType {
        self.dtype
    }

    /// The value as an integer (floats truncate toward zero).
    pub fn as_i64(self) -> i64 {
        if self.dtype.is_float() { f64::from_bits(self.bits) as i64 } else { self.bits as i64 }
    }

    /// The value as a float.
    pub fn as_f64(self) -> f64 {
        if self.dtype.is_float() { f64::from_bits(self.bits) } else { self.bits as i64 as f64 }
    }

    /// True when the value equals zero.
    pub fn is_zero(self) -> bool {
        if self.dtype.is_float() { self.as_f64() == 0.0 } else { self.bits == 0 }
    }

    /// True when the value equals one.
    pub fn is_one(self) -> bool {
        if self.dtype.is_float() { self.as_f64() == 1.0 } else { self.bits == 1 }
    }
}

impl fmt::Debug for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self} : {}", self.dtype)
    }
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.dtype == DType::I1 {
            return write!(f, "{}", self.bits != 0);
        }
        if self.dtype.is_int() {
            return write!(f, "{}", self.as_i64());
        }
        let v = self.as_f64();
        if v.is_nan() {
            f.write_str("nan")
        } else if v.is_infinite() {
            f.write_str(if v > 0.0 { "inf" } else { "-inf" })
        } else {
            // `{:?}` prints the shortest string that round-trips and always has a
            // decimal point or exponent, so the parser can tell floats from ints.
            write!(f, "{v:?}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_and_rounds() {
        assert_eq!(Scalar::int(DType::I8, 200).as_i64(), -56);
        assert_eq!(Scalar::int(DType::U32, -1).as_i64(), u32::MAX as i64);
        assert_eq!(Scalar::float(DType::BF16, 1.0 + 1.0 / 512.0).as_f64(), 1.0);
        assert_eq!(Scalar::float(DType::F32, 0.1).to_string(), "0.10000000149011612");
        assert_eq!(Scalar::bool(true).to_string(), "true");
        assert_eq!(Scalar::float(DType::F32, f64::NEG_INFINITY).to_string(), "-inf");
    }
}
