//! Exact compile-time evaluation of scalar ops, following the numeric semantics
//! documented on the op families (`ir::ops::arith`, `cast`, `compare`). Shared by
//! constant folding and the axis analysis.
//!
//! Invariant: every function here returns `None` rather than a value whenever
//! the op would raise an error in the interpreter (signed overflow, division by
//! zero), whenever its result is not exactly specified (transcendentals and
//! `pow`, which the GPU evaluates approximately, and `sqrt`), or whenever the
//! exact result would need a second rounding this code cannot rule out. A value
//! it does return is the one the interpreter computes, bit for bit (up to NaN
//! payloads, which `Scalar` does not keep).

use crate::dtype::DType;
use crate::ir::Scalar;
use crate::ir::ops::{BinaryOp, CmpPred, UnaryOp};

/// The largest magnitude an `f64` holds for every integer up to it.
const F64_EXACT_INT: u64 = 1 << 53;

/// Folds a binary op on two constants of one dtype.
pub(crate) fn binary(op: BinaryOp, a: Scalar, b: Scalar) -> Option<Scalar> {
    let d = a.dtype();
    if b.dtype() != d {
        return None;
    }
    if d.is_int() {
        return int_binary(op, d, a.as_i64(), b.as_i64()).map(|v| Scalar::int(d, v));
    }
    let (x, y) = (a.as_f64(), b.as_f64());
    let r = match op {
        // `x op y` in f64 followed by one rounding to `d` equals the correctly
        // rounded result in `d` for these ops: f64 carries more than 2p+2 bits
        // of every narrower format (double rounding is innocuous).
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
        // fmod is exact: the result is representable in the operands' format.
        BinaryOp::Rem => x % y,
        BinaryOp::Min | BinaryOp::Max => {
            if x.is_nan() || y.is_nan() {
                // Min/max return the non-NaN operand when exactly one is NaN.
                if x.is_nan() { y } else { x }
            } else if x == 0.0 && y == 0.0 && x.is_sign_negative() != y.is_sign_negative() {
                // The order of signed zeros is not specified: leave it to the target.
                return None;
            } else if op == BinaryOp::Min {
                x.min(y)
            } else {
                x.max(y)
            }
        }
        _ => return None,
    };
    Some(Scalar::float(d, r))
}

/// Folds an integer binary op of dtype `d` on values given as `i64` (signed
/// types sign-extended, unsigned ones zero-extended, as `Scalar::as_i64` does).
/// Returns the result with the same convention.
pub(crate) fn int_binary(op: BinaryOp, d: DType, a: i64, b: i64) -> Option<i64> {
    let (lo, hi) = d.int_range()?;
    let signed = d.is_signed_int();
    let bits = d.bits();
    // Signed results out of range are errors (not folded); unsigned ones wrap.
    let fit = |r: i128| -> Option<i64> {
        if signed {
            (i128::from(lo)..=i128::from(hi)).contains(&r).then_some(r as i64)
        } else {
            Some(d.wrap_int(r as i64))
        }
    };
    let (wa, wb) = (i128::from(a), i128::from(b));
    match op {
        BinaryOp::Add => fit(wa + wb),
        BinaryOp::Sub => fit(wa - wb),
        BinaryOp::Mul => fit(wa * wb),
        BinaryOp::Div => {
            if b == 0 {
                return None;
            }
            fit(wa / wb)
        }
        BinaryOp::Rem => {
            // `MIN % -1` overflows in the hardware's division: leave it alone.
            if b == 0 || (signed && a == lo && b == -1) {
                return None;
            }
            fit(wa % wb)
        }
        BinaryOp::Min => Some(a.min(b)),
        BinaryOp::Max => Some(a.max(b)),
        BinaryOp::And => Some(d.wrap_int(a & b)),
        BinaryOp::Or => Some(d.wrap_int(a | b)),
        BinaryOp::Xor => Some(d.wrap_int(a ^ b)),
        BinaryOp::Shl => {
            // A negative amount of a signed type has no documented clamp: leave it.
            if b < 0 {
                return None;
            }
            if b >= i64::from(bits) {
                return Some(0);
            }
            Some(d.wrap_int(a.wrapping_shl(b as u32)))
        }
        BinaryOp::Shr => {
            if b < 0 {
                return None;
            }
            if signed {
                // Arithmetic: shifting by the full width or more fills with the sign.
                Some(a >> b.min(i64::from(bits) - 1))
            } else if b >= i64::from(bits) {
                Some(0)
            } else {
                // Unsigned values are zero-extended, so this shift is logical.
                Some(a >> b)
            }
        }
        BinaryOp::MulHi => Some(d.wrap_int(((wa * wb) >> bits) as i64)),
        BinaryOp::Pow => None,
    }
}

/// Folds a unary op on a constant. Transcendentals and `sqrt` are never folded.
pub(crate) fn unary(op: UnaryOp, a: Scalar) -> Option<Scalar> {
    let d = a.dtype();
    if d.is_int() {
        let v = a.as_i64();
        let (lo, _) = d.int_range()?;
        return match op {
            UnaryOp::Neg if d.is_signed_int() && v != lo => Some(Scalar::int(d, -v)),
            UnaryOp::Abs if d.is_signed_int() && v != lo => Some(Scalar::int(d, v.abs())),
            UnaryOp::Abs if !d.is_signed_int() => Some(a),
            UnaryOp::Not => Some(Scalar::int(d, !v)),
            _ => None,
        };
    }
    let x = a.as_f64();
    let r = match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        _ => return None,
    };
    Some(Scalar::float(d, r))
}

/// Folds `fma a, b, c` (one rounding) when that single rounding can be done
/// exactly here.
pub(crate) fn fma(a: Scalar, b: Scalar, c: Scalar) -> Option<Scalar> {
    let d = a.dtype();
    if !d.is_float() || b.dtype() != d || c.dtype() != d {
        return None;
    }
    let (x, y, z) = (a.as_f64(), b.as_f64(), c.as_f64());
    if d == DType::F64 {
        return Some(Scalar::float(d, x.mul_add(y, z)));
    }
    // For f32 and narrower the product is exact in f64. When the f64 sum is
    // exact too (checked with Knuth's TwoSum), rounding it once to `d` is the fma.
    let p = x * y;
    let s = p + z;
    let bp = s - z;
    let err = (p - bp) + (z - (s - bp));
    if !s.is_finite() || err != 0.0 {
        return None;
    }
    Some(Scalar::float(d, s))
}

/// Evaluates a comparison of two constants of one dtype.
pub(crate) fn compare(pred: CmpPred, a: Scalar, b: Scalar) -> Option<bool> {
    let d = a.dtype();
    if b.dtype() != d {
        return None;
    }
    let ord =
        if d.is_int() { Some(a.as_i64().cmp(&b.as_i64())) } else { a.as_f64().partial_cmp(&b.as_f64()) };
    Some(pred.holds(ord))
}

/// Folds a numeric `cast` of a constant to `to`.
pub(crate) fn cast(to: DType, a: Scalar) -> Option<Scalar> {
    let from = a.dtype();
    if from.is_int() {
        let v = a.as_i64();
        if to == DType::I1 {
            return Some(Scalar::bool(v != 0));
        }
        if to.is_int() {
            // `v` is already sign- or zero-extended by the source's signedness;
            // wrapping it to `to` truncates.
            return Some(Scalar::int(to, v));
        }
        // Above 2^53 the conversion to f64 would round before the rounding to `to`.
        return (v.unsigned_abs() <= F64_EXACT_INT).then(|| Scalar::float(to, v as f64));
    }
    let x = a.as_f64();
    if to.is_float() {
        // `x` is exact in f64, so this is the single rounding to `to`.
        return Some(Scalar::float(to, x));
    }
    if to == DType::I1 {
        // `!= 0` is unordered: NaN gives true (as the interpreter and Triton do).
        return Some(Scalar::bool(x != 0.0));
    }
    // Truncate toward zero and saturate to `to` (NaN becomes 0), like `cvt.rzi.sat`.
    let (lo, hi) = to.int_range()?;
    let v = if x.is_nan() { 0 } else { (x as i64).clamp(lo, hi) };
    Some(Scalar::int(to, v))
}

/// The raw bits of a constant in its dtype (`None` for NaN, whose payload
/// `Scalar` does not keep).
fn raw_bits(a: Scalar) -> Option<u64> {
    let d = a.dtype();
    if d.is_int() {
        let mask = if d.bits() >= 64 { u64::MAX } else { (1u64 << d.bits()) - 1 };
        return Some(a.as_i64() as u64 & mask);
    }
    let x = a.as_f64();
    if x.is_nan() {
        return None;
    }
    Some(match d {
        DType::F16 => u64::from(half::f16::from_f64(x).to_bits()),
        DType::BF16 => u64::from(half::bf16::from_f64(x).to_bits()),
        DType::F32 => u64::from((x as f32).to_bits()),
        DType::F8E4M3 | DType::F8E5M2 => u64::from(crate::dtype::f8_bits(d, x as f32)),
        _ => x.to_bits(),
    })
}

/// Folds a `bitcast` of a constant to `to` (same width), except through NaNs.
pub(crate) fn bitcast(to: DType, a: Scalar) -> Option<Scalar> {
    if a.dtype().bits() != to.bits() || to == DType::I1 {
        return None;
    }
    let bits = raw_bits(a)?;
    if to.is_int() {
        return Some(Scalar::int(to, bits as i64));
    }
    let x = match to {
        DType::F16 => half::f16::from_bits(bits as u16).to_f64(),
        DType::BF16 => half::bf16::from_bits(bits as u16).to_f64(),
        DType::F32 => f64::from(f32::from_bits(bits as u32)),
        DType::F8E4M3 | DType::F8E5M2 => f64::from(crate::dtype::f8_value(to, bits as u8)),
        _ => f64::from_bits(bits),
    };
    (!x.is_nan()).then(|| Scalar::float(to, x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int_semantics() {
        let i32max = i64::from(i32::MAX);
        assert_eq!(int_binary(BinaryOp::Add, DType::I32, i32max, 1), None);
        assert_eq!(int_binary(BinaryOp::Add, DType::U32, u32::MAX as i64, 1), Some(0));
        assert_eq!(int_binary(BinaryOp::Sub, DType::U8, 0, 1), Some(255));
        assert_eq!(int_binary(BinaryOp::Div, DType::I32, 7, 0), None);
        assert_eq!(int_binary(BinaryOp::Div, DType::I32, -7, 2), Some(-3));
        assert_eq!(int_binary(BinaryOp::Rem, DType::I32, -7, 2), Some(-1));
        assert_eq!(int_binary(BinaryOp::Div, DType::I32, i64::from(i32::MIN), -1), None);
        assert_eq!(int_binary(BinaryOp::Rem, DType::I32, i64::from(i32::MIN), -1), None);
        assert_eq!(int_binary(BinaryOp::Shl, DType::I32, 1, 40), Some(0));
        assert_eq!(int_binary(BinaryOp::Shl, DType::I32, 1, 31), Some(i64::from(i32::MIN)));
        assert_eq!(int_binary(BinaryOp::Shr, DType::I32, -8, 40), Some(-1));
        assert_eq!(int_binary(BinaryOp::Shr, DType::U32, u32::MAX as i64, 31), Some(1));
        assert_eq!(int_binary(BinaryOp::MulHi, DType::U32, u32::MAX as i64, 2), Some(1));
        assert_eq!(int_binary(BinaryOp::MulHi, DType::I32, -1, 1), Some(-1));
        assert_eq!(int_binary(BinaryOp::Xor, DType::I1, 1, 1), Some(0));
        assert_eq!(int_binary(BinaryOp::Add, DType::I64, i64::MAX, 1), None);
    }

    #[test]
    fn float_semantics() {
        let bf = |v| Scalar::float(DType::BF16, v);
        assert_eq!(binary(BinaryOp::Add, bf(1.0), bf(1.0 / 256.0)).map(|s| s.as_f64()), Some(1.0));
        let f = |v| Scalar::float(DType::F32, v);
        assert_eq!(binary(BinaryOp::Max, f(f64::NAN), f(2.0)).map(|s| s.as_f64()), Some(2.0));
        assert_eq!(binary(BinaryOp::Min, f(0.0), f(-0.0)), None);
        assert_eq!(binary(BinaryOp::Pow, f(2.0), f(2.0)), None);
        assert_eq!(unary(UnaryOp::Exp, f(0.0)), None);
        assert_eq!(unary(UnaryOp::Neg, Scalar::int(DType::I8, -128)), None);
        assert_eq!(unary(UnaryOp::Not, Scalar::bool(true)), Some(Scalar::bool(false)));
        assert_eq!(fma(f(2.0), f(3.0), f(1.0)), Some(f(7.0)));
        // One rounding: f32(1/3) * 3 - 1 is 2^-25, which mul-then-add rounds away.
        let third = f(f64::from(1.0f32 / 3.0));
        assert_eq!(fma(third, f(3.0), f(-1.0)).map(|s| s.as_f64()), Some(2f64.powi(-25)));
        // 1 + 2^-60 is not exact in f64: the fold is declined.
        assert_eq!(fma(f(2f64.powi(-30)), f(2f64.powi(-30)), f(1.0)), None);
    }

    #[test]
    fn casts() {
        let f = |v| Scalar::float(DType::F32, v);
        assert_eq!(cast(DType::I32, f(3e9)), Some(Scalar::int(DType::I32, i64::from(i32::MAX))));
        assert_eq!(cast(DType::I32, f(-2.7)), Some(Scalar::int(DType::I32, -2)));
        assert_eq!(cast(DType::U8, f(-2.7)), Some(Scalar::int(DType::U8, 0)));
        assert_eq!(cast(DType::I32, f(f64::NAN)), Some(Scalar::int(DType::I32, 0)));
        assert_eq!(cast(DType::I1, f(f64::NAN)), Some(Scalar::bool(true)));
        assert_eq!(cast(DType::I1, f(-0.0)), Some(Scalar::bool(false)));
        assert_eq!(cast(DType::I1, Scalar::int(DType::I32, 2)), Some(Scalar::bool(true)));
        assert_eq!(
            cast(DType::I32, Scalar::int(DType::U32, u32::MAX as i64)),
            Some(Scalar::int(DType::I32, -1))
        );
        assert_eq!(
            cast(DType::I64, Scalar::int(DType::U32, u32::MAX as i64)).map(|s| s.as_i64()),
            Some(u32::MAX as i64)
        );
        assert_eq!(cast(DType::F32, Scalar::int(DType::I64, i64::MAX)), None);
        assert_eq!(bitcast(DType::I32, f(1.0)), Some(Scalar::int(DType::I32, 0x3f80_0000)));
        assert_eq!(bitcast(DType::F32, Scalar::int(DType::U32, 0x3f80_0000)), Some(f(1.0)));
        assert_eq!(bitcast(DType::F32, Scalar::int(DType::I32, -1)), None);
    }
}
