//! Element types (`DType`) and value types (`Type`): scalar, pointer-to-dtype,
//! and tiles of either with a static shape.
//!
//! Invariants: a rank-0 `Type` is a scalar (or a scalar pointer); tiles have a
//! non-empty shape whose every dimension is a power of two (the verifier checks
//! this; non-power-of-two sizes are padded and masked by the front end).

use std::fmt;

/// A scalar element type.
///
/// The 8-bit floats are the OCP FP8 formats as NVIDIA's hardware converts
/// to them: round to nearest even, and saturating (`.satfinite`: a finite
/// value or an infinity beyond the largest finite one becomes that value
/// with its sign; NaN stays NaN). They are storage and `dot` operand types:
/// the verifier allows them in memory, shape and select ops and in casts to
/// and from f16, bf16, f32 and each other, and rejects arithmetic on them
/// (cast to f32 first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// 1-bit boolean (`i1`), the type of masks and comparisons.
    I1,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 16-bit integer.
    I16,
    /// Signed 32-bit integer (the default index type).
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 64-bit integer.
    I64,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
    /// OCP FP8 E4M3 (`e4m3fn`): bias 7, no infinities, NaN `S.1111.111`, largest 448.
    F8E4M3,
    /// OCP FP8 E5M2: bias 15, infinities and NaNs as in IEEE, largest finite 57344.
    F8E5M2,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 13] = [
        DType::I1,
        DType::I8,
        DType::U8,
        DType::I16,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::F8E4M3,
        DType::F8E5M2,
    ];

    /// Width in bits (1 for `i1`).
    pub fn bits(self) -> u32 {
        match self {
            DType::I1 => 1,
            DType::I8 | DType::U8 | DType::F8E4M3 | DType::F8E5M2 => 8,
            DType::I16 | DType::F16 | DType::BF16 => 16,
            DType::I32 | DType::U32 | DType::F32 => 32,
            DType::I64 | DType::F64 => 64,
        }
    }

    /// Size in bytes when stored in memory (`i1` is stored as one byte).
    pub fn size_bytes(self) -> usize {
        match self {
            DType::I1 => 1,
            other => (other.bits() / 8) as usize,
        }
    }

    /// True for the floating-point types.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64 | DType::F8E4M3 | DType::F8E5M2)
    }

    /// True for the 8-bit floats (storage and `dot` operand types only).
    pub fn is_f8(self) -> bool {
        matches!(self, DType::F8E4M3 | DType::F8E5M2)
    }

    /// True for the integer types, `i1` included.
    pub fn is_int(self) -> bool {
        !self.is_float()
    }

    /// True for `i1`.
    pub fn is_bool(self) -> bool {
        self == DType::I1
    }

    /// True for signed integers (`i1` counts as unsigned).
    pub fn is_signed_int(self) -> bool {
        matches!(self, DType::I8 | DType::I16 | DType::I32 | DType::I64)
    }

    /// True for unsigned integers and `i1`.
    pub fn is_unsigned_int(self) -> bool {
        matches!(self, DType::I1 | DType::U8 | DType::U32)
    }

    /// The IR spelling (`f32`, `bf16`, `i1`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::I1 => "i1",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F8E4M3 => "f8e4m3",
            DType::F8E5M2 => "f8e5m2",
        }
    }

    /// Parses the IR spelling; `bool` is accepted for `i1`.
    pub fn from_name(s: &str) -> Option<DType> {
        Some(match s {
            "i1" | "bool" => DType::I1,
            "i8" => DType::I8,
            "u8" => DType::U8,
            "i16" => DType::I16,
            "i32" => DType::I32,
            "u32" => DType::U32,
            "i64" => DType::I64,
            "f16" => DType::F16,
            "bf16" => DType::BF16,
            "f32" => DType::F32,
            "f64" => DType::F64,
            "f8e4m3" => DType::F8E4M3,
            "f8e5m2" => DType::F8E5M2,
            _ => return None,
        })
    }

    /// Wraps an integer to this dtype's range, two's complement (`i1` keeps bit 0).
    /// Floats are returned unchanged.
    pub fn wrap_int(self, v: i64) -> i64 {
        match self {
            DType::I1 => v & 1,
            DType::I8 => v as i8 as i64,
            DType::U8 => v as u8 as i64,
            DType::I16 => v as i16 as i64,
            DType::I32 => v as i32 as i64,
            DType::U32 => v as u32 as i64,
            _ => v,
        }
    }

    /// Rounds a value to this float dtype, to nearest even, as the GPU stores it.
    /// Integers are returned unchanged.
    pub fn round_float(self, v: f64) -> f64 {
        match self {
            // Narrow to f32 with round-to-odd first: a second rounding from there
            // to 11 or 8 significand bits then equals one correct rounding.
            DType::F16 => half::f16::from_f32(f64_to_f32_odd(v)).to_f64(),
            DType::BF16 => half::bf16::from_f32(f64_to_f32_odd(v)).to_f64(),
            DType::F32 => v as f32 as f64,
            DType::F8E4M3 | DType::F8E5M2 => f8_round(self, f64_to_f32_odd(v)) as f64,
            _ => v,
        }
    }

    /// Smallest and largest value of an integer dtype, as `i64` (`None` for floats).
    pub fn int_range(self) -> Option<(i64, i64)> {
        Some(match self {
            DType::I1 => (0, 1),
            DType::I8 => (i8::MIN as i64, i8::MAX as i64),
            DType::U8 => (0, u8::MAX as i64),
            DType::I16 => (i16::MIN as i64, i16::MAX as i64),
            DType::I32 => (i32::MIN as i64, i32::MAX as i64),
            DType::U32 => (0, u32::MAX as i64),
            DType::I64 => (i64::MIN, i64::MAX),
            _ => return None,
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `x` rounded to the 8-bit float `d` and back to f32 (exact): to nearest
/// even, saturating to the largest finite value (infinities included), NaN
/// staying NaN, as PTX `cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32` converts.
/// Other dtypes return `x` unchanged.
pub fn f8_round(d: DType, x: f32) -> f32 {
    if d.is_f8() { f8_value(d, f8_bits(d, x)) } else { x }
}

/// The bits of `x` converted to the 8-bit float `d` (see [`f8_round`]); a
/// NaN becomes the all-ones code of its sign.
pub fn f8_bits(d: DType, x: f32) -> u8 {
    if x.is_nan() {
        // One NaN code per sign: `S.1111.111` (E4M3), `S.11111.11` (E5M2).
        return 0x7f | ((x.to_bits() >> 24) as u8 & 0x80);
    }
    match d {
        DType::F8E4M3 => float8::F8E4M3::from_f32(x).to_bits(),
        _ => float8::F8E5M2::from_f32(x).to_bits(),
    }
}

/// The value of the 8-bit float `d` with bits `b`, exactly (a NaN code reads
/// as the quiet NaN `0x7fc00000` with the code's sign).
pub fn f8_value(d: DType, b: u8) -> f32 {
    let v = match d {
        DType::F8E4M3 => float8::F8E4M3::from_bits(b).to_f32(),
        _ => float8::F8E5M2::from_bits(b).to_f32(),
    };
    // NaN codes read as the quiet NaN of their sign.
    if v.is_nan() { f32::from_bits(0x7fc0_0000 | (u32::from(b & 0x80) << 24)) } else { v }
}

/// `x` rounded to f32 with round-to-odd: the nearest f32 toward zero, with its
/// last significand bit set when the conversion was inexact. Rounding the result
/// again to fewer than 23 bits gives the correctly rounded value of `x`.
pub fn f64_to_f32_odd(x: f64) -> f32 {
    let r = x as f32;
    if !r.is_finite() && x.is_finite() {
        // Overflow: truncation gives the largest finite value, which is odd.
        return f32::MAX.copysign(r);
    }
    if r as f64 == x || x.is_nan() || r.is_infinite() {
        return r;
    }
    let mut bits = r.to_bits();
    if (r as f64).abs() > x.abs() {
        // `r` was rounded away from zero: step one ulp back toward zero.
        bits -= 1;
    }
    f32::from_bits(bits | 1)
}

/// What one element of a value is: a number or a pointer to numbers in global memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Elem {
    /// A number of the given dtype.
    Scalar(DType),
    /// A global-memory pointer whose pointee has the given dtype.
    Ptr(DType),
}

impl Elem {
    /// The dtype of a number, or the pointee dtype of a pointer.
    pub fn dtype(self) -> DType {
        match self {
            Elem::Scalar(d) | Elem::Ptr(d) => d,
        }
    }

    /// True for pointers.
    pub fn is_ptr(self) -> bool {
        matches!(self, Elem::Ptr(_))
    }
}

impl fmt::Display for Elem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Elem::Scalar(d) => write!(f, "{d}"),
            Elem::Ptr(d) => write!(f, "ptr<{d}>"),
        }
    }
}

/// A static tile shape (empty for scalars).
pub type Shape = smallvec::SmallVec<[usize; 4]>;

/// The `[outer, n, inner]` view of `shape` around `axis`: the product of
/// the dims before it, its length and the product of the dims after it
/// (`None` when `axis` is out of range).
pub fn split_axis(shape: &[usize], axis: usize) -> Option<(usize, usize, usize)> {
    let n = *shape.get(axis)?;
    Some((shape[..axis].iter().product(), n, shape[axis + 1..].iter().product()))
}

/// The type of an SSA value: an element type and a shape (rank 0 = scalar).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Type {
    /// Element type.
    pub elem: Elem,
    /// Tile shape; empty for scalars.
    pub shape: Shape,
}

impl Type {
    /// A scalar number.
    pub fn scalar(d: DType) -> Type {
        Type { elem: Elem::Scalar(d), shape: Shape::new() }
    }

    /// A scalar pointer to `d`.
    pub fn ptr(d: DType) -> Type {
        Type { elem: Elem::Ptr(d), shape: Shape::new() }
    }

    /// A tile of `elem` with `shape`.
    pub fn tile(elem: Elem, shape: &[usize]) -> Type {
        Type { elem, shape: Shape::from_slice(shape) }
    }

    /// The same shape with another element type.
    pub fn with_elem(&self, elem: Elem) -> Type {
        Type { elem, shape: self.shape.clone() }
    }

    /// The same element type with another shape.
    pub fn with_shape(&self, shape: &[usize]) -> Type {
        Type { elem: self.elem, shape: Shape::from_slice(shape) }
    }

    /// True for rank 0.
    pub fn is_scalar(&self) -> bool {
        self.shape.is_empty()
    }

    /// The dtype of the element (the pointee for pointers).
    pub fn dtype(&self) -> DType {
        self.elem.dtype()
    }

    /// True when elements are pointers.
    pub fn is_ptr(&self) -> bool {
        self.elem.is_ptr()
    }

    /// True when elements are floating-point numbers.
    pub fn is_float(&self) -> bool {
        matches!(self.elem, Elem::Scalar(d) if d.is_float())
    }

    /// True when elements are integers (`i1` included), not pointers.
    pub fn is_int(&self) -> bool {
        matches!(self.elem, Elem::Scalar(d) if d.is_int())
    }

    /// True when elements are `i1`.
    pub fn is_bool(&self) -> bool {
        self.elem == Elem::Scalar(DType::I1)
    }

    /// Number of elements (1 for scalars).
    pub fn numel(&self) -> usize {
        self.shape.iter().fold(1usize, |a, &d| a.saturating_mul(d))
    }

    /// Rank (0 for scalars).
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.shape.is_empty() {
            return write!(f, "{}", self.elem);
        }
        f.write_str("tensor<")?;
        for d in &self.shape {
            write!(f, "{d}x")?;
        }
        write!(f, "{}>", self.elem)
    }
}

/// Formats a shape as `[a, b]` for messages.
pub fn fmt_shape(shape: &[usize]) -> String {
    let parts: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
    }

    #[test]
    fn rounding_is_single() {
        let f16_case = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(DType::F16.round_float(f16_case), 1.0 + 2f64.powi(-10));
        let bf16_case = 1.0 + 2f64.powi(-8) + 2f64.powi(-40);
        assert_eq!(DType::BF16.round_float(bf16_case), 1.0 + 2f64.powi(-7));
        assert_eq!(DType::BF16.round_float(1.0 + 2f64.powi(-8)), 1.0);
    }

    #[test]
    fn type_display() {
        assert_eq!(Type::scalar(DType::F32).to_string(), "f32");
        assert_eq!(Type::ptr(DType::BF16).to_string(), "ptr<bf16>");
        assert_eq!(Type::tile(Elem::Ptr(DType::F16), &[64, 32]).to_string(), "tensor<64x32xptr<f16>>");
    }
}
