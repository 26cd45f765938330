//! Runtime values of the interpreter: a [`Tile`] is an element type, a shape
//! and shared, typed storage ([`Data`]).
//!
//! Storage classes (chosen so every op runs one tight loop over a plain slice):
//! - `Int(Vec<i64>)`: every integer dtype, `i1` included (0 or 1), and pointers
//!   (as virtual addresses, see `memory.rs`). Integers are kept wrapped to
//!   their dtype and sign- or zero-extended, so an `i64` comparison or a
//!   bitwise op gives the dtype's answer directly.
//! - `F32(Vec<f32>)`: `f32`, `f16` and `bf16`. Half-precision values are kept
//!   exactly (every f16/bf16 is an f32), rounded to their dtype after every op.
//! - `F64(Vec<f64>)`: `f64`.
//!
//! Invariants: `data.len()` equals the product of `shape` (1 for scalars),
//! except inside vectorized combine regions (see `reduce.rs`), where tiles are
//! flat and constants have one element; elementwise ops broadcast a
//! one-element operand to cover that case. Storage is behind an `Rc`, so
//! shape-only ops (`reshape`, `expand_dims`, `ptrcast`, hints) share it.

use crate::dtype::{DType, Elem, Shape};
use half::{bf16, f16};
use std::rc::Rc;

/// The typed storage of a tile.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Data {
    /// Integers, booleans and pointers.
    Int(Vec<i64>),
    /// `f32`, `f16` and `bf16` values.
    F32(Vec<f32>),
    /// `f64` values.
    F64(Vec<f64>),
}

/// The storage class of a dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// Stored as `Data::Int`.
    Int,
    /// Stored as `Data::F32`.
    F32,
    /// Stored as `Data::F64`.
    F64,
}

/// The storage class of an element type (pointers are addresses, so `Int`).
pub(crate) fn class_of(elem: Elem) -> Class {
    match elem {
        Elem::Ptr(_) => Class::Int,
        Elem::Scalar(d) => match d {
            DType::F16 | DType::BF16 | DType::F32 | DType::F8E4M3 | DType::F8E5M2 => Class::F32,
            DType::F64 => Class::F64,
            _ => Class::Int,
        },
    }
}

impl Data {
    /// Number of elements.
    pub(crate) fn len(&self) -> usize {
        match self {
            Data::Int(v) => v.len(),
            Data::F32(v) => v.len(),
            Data::F64(v) => v.len(),
        }
    }

    /// A storage of `n` zeros of the class of `elem`.
    pub(crate) fn zeros(elem: Elem, n: usize) -> Data {
        match class_of(elem) {
            Class::Int => Data::Int(vec![0; n]),
            Class::F32 => Data::F32(vec![0.0; n]),
            Class::F64 => Data::F64(vec![0.0; n]),
        }
    }

    /// The element at `i` formatted for messages (integers exactly).
    pub(crate) fn fmt_elem(&self, i: usize) -> String {
        match self {
            Data::Int(v) => v.get(i).map_or("?".into(), |x| x.to_string()),
            Data::F32(v) => v.get(i).map_or("?".into(), |x| format!("{x:?}")),
            Data::F64(v) => v.get(i).map_or("?".into(), |x| format!("{x:?}")),
        }
    }
}

/// Applies `$body` to the vector inside a `Data`, keeping its class; `$v` names
/// the vector (a slice reference) in the body, which must produce a `Vec` of the
/// same element type.
macro_rules! map_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            $crate::interp::tile::Data::Int($v) => $crate::interp::tile::Data::Int($body),
            $crate::interp::tile::Data::F32($v) => $crate::interp::tile::Data::F32($body),
            $crate::interp::tile::Data::F64($v) => $crate::interp::tile::Data::F64($body),
        }
    };
}
pub(crate) use map_data;

/// A runtime value: element type, shape and shared storage.
#[derive(Clone, Debug)]
pub(crate) struct Tile {
    /// Element type (a number dtype or a pointer).
    pub(crate) elem: Elem,
    /// Shape; empty for scalars.
    pub(crate) shape: Shape,
    /// The elements, row-major.
    pub(crate) data: Rc<Data>,
}

impl Tile {
    /// A tile from its parts.
    pub(crate) fn new(elem: Elem, shape: Shape, data: Data) -> Tile {
        Tile { elem, shape, data: Rc::new(data) }
    }

    /// A scalar integer (or boolean, or pointer) of element type `elem`.
    pub(crate) fn int_scalar(elem: Elem, v: i64) -> Tile {
        Tile::new(elem, Shape::new(), Data::Int(vec![v]))
    }

    /// Number of elements.
    pub(crate) fn len(&self) -> usize {
        self.data.len()
    }

    /// The element dtype (the pointee for pointers).
    pub(crate) fn dtype(&self) -> DType {
        self.elem.dtype()
    }

    /// The integer storage, or an internal error.
    pub(crate) fn ints(&self) -> Result<&[i64], String> {
        match &*self.data {
            Data::Int(v) => Ok(v),
            _ => Err(internal(format!("expected integer storage for {}", self.elem))),
        }
    }

    /// The same storage seen with another element type and shape.
    pub(crate) fn view(&self, elem: Elem, shape: Shape) -> Tile {
        Tile { elem, shape, data: Rc::clone(&self.data) }
    }
}

/// Formats an internal error (a broken interpreter invariant, not a user error).
pub(crate) fn internal(msg: String) -> String {
    format!("internal interpreter error (please report): {msg}")
}

/// The multi-dimensional index of flat `lane` in `shape`.
pub(crate) fn unflatten(shape: &[usize], mut lane: usize) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for (d, &n) in shape.iter().enumerate().rev() {
        if n > 0 {
            idx[d] = lane % n;
            lane /= n;
        }
    }
    idx
}

/// Describes lane `lane` of a tile of `shape` for messages: `lane 17 [0, 17]`,
/// or `the scalar` for rank 0.
pub(crate) fn lane_str(shape: &[usize], lane: usize) -> String {
    if shape.is_empty() {
        return "the scalar".into();
    }
    let idx: Vec<String> = unflatten(shape, lane).iter().map(|i| i.to_string()).collect();
    format!("lane {lane} [{}]", idx.join(", "))
}

/// Formats a program id.
pub(crate) fn pid_str(pid: [u32; 3]) -> String {
    format!("program ({}, {}, {})", pid[0], pid[1], pid[2])
}

// ---- float rounding -------------------------------------------------------

use crate::dtype::f64_to_f32_odd;

/// Rounds an `f64` to the f32-storage value of `dtype` (f32, f16 or bf16),
/// to nearest even, exactly as a single rounding would.
pub(crate) fn narrow_f64(dtype: DType, x: f64) -> f32 {
    match dtype {
        DType::F16 => f16::from_f32(f64_to_f32_odd(x)).to_f32(),
        DType::BF16 => bf16::from_f32(f64_to_f32_odd(x)).to_f32(),
        DType::F8E4M3 | DType::F8E5M2 => crate::dtype::f8_round(dtype, f64_to_f32_odd(x)),
        _ => x as f32,
    }
}

/// Rounds f32 values in place to `dtype` (a no-op for f32), to nearest even.
pub(crate) fn round_f32_slice(dtype: DType, v: &mut [f32]) {
    match dtype {
        DType::F16 => v.iter_mut().for_each(|x| *x = f16::from_f32(*x).to_f32()),
        DType::BF16 => v.iter_mut().for_each(|x| *x = bf16::from_f32(*x).to_f32()),
        DType::F8E4M3 | DType::F8E5M2 => v.iter_mut().for_each(|x| *x = crate::dtype::f8_round(dtype, *x)),
        _ => {}
    }
}

/// Rounds f64 values to the f32 storage of `dtype`.
pub(crate) fn narrow_vec(dtype: DType, v: &[f64]) -> Vec<f32> {
    match dtype {
        d if d.is_float() && d.bits() < 32 => v.iter().map(|&x| narrow_f64(dtype, x)).collect(),
        _ => v.iter().map(|&x| x as f32).collect(),
    }
}

/// Rounds `x` to tf32 (10 explicit significand bits), to nearest with ties
/// away from zero, as PTX `cvt.rna.tf32.f32` does.
pub(crate) fn round_tf32(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    let bits = x.to_bits();
    let rounded = bits.wrapping_add(1 << 12) & !((1u32 << 13) - 1);
    f32::from_bits(rounded)
}

/// Converts an integer to the storage of float `dtype`, rounding once.
pub(crate) fn int_to_float_f32(dtype: DType, v: i64) -> f32 {
    match dtype {
        DType::F32 => v as f32,
        // |v| < 2^53 converts to f64 exactly; above, the f64 rounding is a
        // negligible extra error far beyond the half range anyway.
        _ => narrow_f64(dtype, v as f64),
    }
}

/// Broadcasts a one-element slice to `n` elements (vectorized combine regions);
/// returns the slice itself when it already has `n` elements.
pub(crate) fn expand<T: Copy>(v: &[T], n: usize) -> std::borrow::Cow<'_, [T]> {
    if v.len() == 1 && n != 1 {
        std::borrow::Cow::Owned(vec![v[0]; n])
    } else {
        std::borrow::Cow::Borrowed(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_to_odd_avoids_double_rounding() {
        // 1 + 2^-11 + 2^-40 lies just above the midpoint between two f16 values
        // (spacing 2^-10 at 1.0): it must round up, although rounding to f32
        // first (nearest) lands exactly on the midpoint and would round to even.
        let x = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(narrow_f64(DType::F16, x), 1.0 + 2f32.powi(-10));
        let y = 1.0 + 2f64.powi(-8) + 2f64.powi(-40);
        assert_eq!(narrow_f64(DType::BF16, y), 1.0 + 2f32.powi(-7));
        assert_eq!(narrow_f64(DType::F16, 1e9), f32::INFINITY);
        assert_eq!(narrow_f64(DType::F32, 0.1), 0.1f32);
        assert!(narrow_f64(DType::BF16, f64::NAN).is_nan());
    }

    #[test]
    fn lanes_format() {
        assert_eq!(lane_str(&[4, 8], 17), "lane 17 [2, 1]");
        assert_eq!(lane_str(&[], 0), "the scalar");
        assert_eq!(round_tf32(1.0 + 2f32.powi(-11)), 1.0 + 2f32.powi(-10));
    }
}
