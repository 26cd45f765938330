//! The kernel language: the functions and operators kernel bodies use (what
//! Triton exposes as `tl.*`). `#[kernel]` bodies call these; hand-written IR
//! tests call them inside [`crate::builder::KernelBuilder::build`].
//!
//! Every public function is `#[track_caller]`, so the op it creates carries the
//! location of the kernel author's expression. Operands follow Triton's
//! promotion and broadcasting rules (see [`crate::builder::computation_type`]);
//! errors are recorded and reported together when the build finishes.

/// Defines `#[track_caller]` functions that differ only in the op they
/// build: `$f(params) -> Tensor` is `$imp(op, params..., extra..., location)`,
/// with the location of the kernel author's call; the extra trailing
/// arguments, in brackets, are optional.
macro_rules! located_fns {
    (@one $imp:ident ($($arg:ident: $ty:ty),*) [$($extra:expr),*] $(#[$m:meta])* $f:ident => $op:expr) => {
        $(#[$m])*
        #[track_caller]
        pub fn $f($($arg: $ty),*) -> Tensor {
            $imp($op, $($arg,)* $($extra,)* &Location::caller())
        }
    };
    ($imp:ident $params:tt; $($rest:tt)*) => {
        located_fns!($imp $params []; $($rest)*);
    };
    ($imp:ident $params:tt $extra:tt; $($(#[$m:meta])* $f:ident => $op:expr;)*) => {$(
        located_fns!(@one $imp $params $extra $(#[$m])* $f => $op);
    )*};
}

mod control;
mod elementwise;
mod memory;
mod random;
mod reduce;
mod shape;
mod support;

pub use crate::builder::{
    KernelBuilder, Operand, Tensor, param, param_ptr, param_scalar, param_with_hints, report_error,
};
pub use crate::dtype::DType;
pub use control::*;
pub use elementwise::*;
pub use memory::*;
pub use random::*;
pub use reduce::*;
pub use shape::*;
pub use support::{__i32, __tensor, __u8, __u32, __usize, ConstInt, FromTensors, IntoTensors, Ptr, dtypes};

use crate::builder::{Ctx, with_ctx};
use crate::dtype::{Elem, Type};
use crate::ir::ops::{CastOp, CreationOp, ProgramOp, ShapeOp};
use crate::ir::{Op, Scalar, Value};
use crate::loc::Location;

/// Index of this program along `axis` (0, 1 or 2), an `i32` scalar.
#[track_caller]
pub fn program_id(axis: u8) -> Tensor {
    let loc = Location::caller();
    with_ctx(|c| {
        let v = c.push(Op::Program(ProgramOp::ProgramId { axis }), &[], &loc, &[Type::scalar(DType::I32)])[0];
        c.handle(v)
    })
}

/// Number of programs along `axis` (0, 1 or 2), an `i32` scalar.
#[track_caller]
pub fn num_programs(axis: u8) -> Tensor {
    let loc = Location::caller();
    with_ctx(|c| {
        let v =
            c.push(Op::Program(ProgramOp::NumPrograms { axis }), &[], &loc, &[Type::scalar(DType::I32)])[0];
        c.handle(v)
    })
}

/// The `i32` tile `start, start+1, ..., end-1`. A length that is not a power of
/// two is padded to the next one; the padding lanes are masked wherever they
/// could be observed (see `builder::padding`).
#[track_caller]
pub fn arange(start: i32, end: i32) -> Tensor {
    let loc = Location::caller();
    with_ctx(|c| {
        let n = i64::from(end) - i64::from(start);
        if n <= 0 {
            c.error(&loc, Some("arange"), format!("`arange` needs start < end, found {start}..{end}"));
            let v = c.placeholder(&Type::tile(Elem::Scalar(DType::I32), &[1]), &loc);
            return c.handle(v);
        }
        let p = (n as u64).next_power_of_two() as i64;
        let Ok(pend) = i32::try_from(i64::from(start) + p) else {
            c.error(
                &loc,
                Some("arange"),
                format!("`arange({start}, {end})` padded to {p} lanes overflows i32"),
            );
            let v = c.placeholder(&Type::tile(Elem::Scalar(DType::I32), &[p as usize]), &loc);
            return c.handle(v);
        };
        let ty = Type::tile(Elem::Scalar(DType::I32), &[p as usize]);
        let v = c.push(Op::Creation(CreationOp::Arange { start, end: pend }), &[], &loc, &[ty])[0];
        c.set_logical(v, [n as usize].into_iter().collect());
        c.handle(v)
    })
}

/// A scalar constant of `dtype`.
#[track_caller]
pub fn constant(value: impl Into<Operand>, dtype: DType) -> Tensor {
    let loc = Location::caller();
    let value = value.into();
    with_ctx(|c| {
        let v = literal(c, value, dtype, &loc);
        c.handle(v)
    })
}

/// The power-of-two shape a requested shape is padded to.
fn padded(shape: &[usize]) -> Vec<usize> {
    shape.iter().map(|d| d.max(&1).next_power_of_two()).collect()
}

/// A tile of `shape` filled with `value` converted to `dtype`. Dimensions that
/// are not powers of two are padded (see [`arange`]).
#[track_caller]
pub fn full(shape: &[usize], value: impl Into<Operand>, dtype: DType) -> Tensor {
    let loc = Location::caller();
    let value = value.into();
    with_ctx(|c| {
        let phys = padded(shape);
        let v = match value {
            Operand::Tensor(t) => {
                c.check(t);
                let v = cast_to(c, t.value(), dtype, &loc);
                broadcast_value(c, v, &phys, &loc)
            }
            lit => {
                let s = scalar_of(lit, dtype);
                let op = Op::Creation(CreationOp::Full { value: s, shape: phys.as_slice().into() });
                c.push(op, &[], &loc, &[Type::tile(Elem::Scalar(dtype), &phys)])[0]
            }
        };
        c.set_logical(v, shape.iter().copied().collect());
        c.handle(v)
    })
}

/// A tile of zeros; see [`full`].
#[track_caller]
pub fn zeros(shape: &[usize], dtype: DType) -> Tensor {
    let loc = Location::caller();
    with_ctx(|c| {
        let phys = padded(shape);
        let op = Op::Creation(CreationOp::Full { value: Scalar::zero(dtype), shape: phys.as_slice().into() });
        let v = c.push(op, &[], &loc, &[Type::tile(Elem::Scalar(dtype), &phys)])[0];
        c.set_logical(v, shape.iter().copied().collect());
        c.handle(v)
    })
}

/// Converts `x` to `dtype` (numeric conversion; `i1` means `!= 0`).
#[track_caller]
pub fn cast(x: Tensor, dtype: DType) -> Tensor {
    let loc = Location::caller();
    with_ctx(|c| {
        c.check(x);
        let v = cast_to(c, x.value(), dtype, &loc);
        c.handle(v)
    })
}

/// Reinterprets the bits of `x` as `dtype` (same width).
#[track_caller]
pub fn bitcast(x: Tensor, dtype: DType) -> Tensor {
    reinterpret_at(CastOp::Bitcast { to: dtype }, x, Elem::Scalar(dtype), &Location::caller())
}

/// Views pointer(s) `p` as pointing to `dtype` (same addresses).
#[track_caller]
pub fn ptrcast(p: Tensor, dtype: DType) -> Tensor {
    reinterpret_at(CastOp::PtrCast { to: dtype }, p, Elem::Ptr(dtype), &Location::caller())
}

/// Records cast `op` of `x` to a tile of the same shape of `elem`.
fn reinterpret_at(op: CastOp, x: Tensor, elem: Elem, loc: &Location) -> Tensor {
    with_ctx(|c| {
        c.check(x);
        let ty = c.func.ty(x.value()).with_elem(elem);
        let v = c.push(Op::Cast(op), &[x.value()], loc, &[ty])[0];
        c.handle(v)
    })
}

/// Records an error unless `cond` holds (evaluated while the kernel is built).
#[track_caller]
pub fn static_assert(cond: bool, message: &str) {
    if !cond {
        let loc = Location::caller();
        with_ctx(|c| c.error(&loc, None, format!("static assertion failed: {message}")));
    }
}

impl Tensor {
    /// Converts to `dtype`; see [`cast`].
    #[track_caller]
    pub fn to(self, dtype: DType) -> Tensor {
        cast(self, dtype)
    }
}

// ---- shared helpers -------------------------------------------------------

/// Reports tile shapes whose dimensions are not powers of two.
pub(crate) fn check_shape(c: &mut Ctx, loc: &Location, what: &'static str, shape: &[usize]) {
    if let Some(d) = shape.iter().find(|d| !d.is_power_of_two()) {
        c.error(
            loc,
            Some(what),
            format!(
                "tile dimensions must be powers of two, found {d} in {} (pad to {} and mask)",
                crate::dtype::fmt_shape(shape),
                d.next_power_of_two()
            ),
        );
    }
}

/// The scalar a literal denotes in `dtype`.
pub(crate) fn scalar_of(lit: Operand, dtype: DType) -> Scalar {
    match lit {
        Operand::Int(i) => Scalar::int(dtype, i),
        Operand::Float(f) => Scalar::float(dtype, f),
        Operand::Bool(b) => Scalar::int(dtype, b as i64),
        Operand::Tensor(_) => Scalar::zero(dtype),
    }
}

/// Materializes an operand as a value of `dtype` (literals become constants,
/// tensors are cast).
pub(crate) fn literal(c: &mut Ctx, op: Operand, dtype: DType, loc: &Location) -> Value {
    match op {
        Operand::Tensor(t) => {
            c.check(t);
            cast_to(c, t.value(), dtype, loc)
        }
        lit => {
            if let (Operand::Int(i), true) = (lit, dtype.is_int()) {
                let (lo, hi) = dtype.int_range().unwrap_or((i64::MIN, i64::MAX));
                if i < lo || i > hi {
                    c.error(loc, None, format!("integer literal {i} does not fit in {dtype}"));
                }
            }
            c.constant(scalar_of(lit, dtype), loc)
        }
    }
}

/// Casts `v` to `dtype` unless it already has it.
pub(crate) fn cast_to(c: &mut Ctx, v: Value, dtype: DType, loc: &Location) -> Value {
    let ty = c.func.ty(v).clone();
    if ty.elem == Elem::Scalar(dtype) {
        return v;
    }
    let fallback = ty.with_elem(Elem::Scalar(dtype));
    c.push(Op::Cast(CastOp::Cast { to: dtype }), &[v], loc, &[fallback])[0]
}

/// Broadcasts `v` to `shape`: splats scalars, prepends size-1 dimensions, then
/// broadcasts size-1 dimensions. Reports an error when impossible.
pub(crate) fn broadcast_value(c: &mut Ctx, v: Value, shape: &[usize], loc: &Location) -> Value {
    let ty = c.func.ty(v).clone();
    if ty.shape.as_slice() == shape {
        return v;
    }
    if ty.is_scalar() {
        let fallback = ty.with_shape(shape);
        return c.push(Op::Creation(CreationOp::Splat { shape: shape.into() }), &[v], loc, &[fallback])[0];
    }
    let mut v = v;
    let mut rank = ty.rank();
    while rank < shape.len() {
        let t = c.func.ty(v).clone();
        let mut s = t.shape.clone();
        s.insert(0, 1);
        v = c.push(Op::Shape(ShapeOp::ExpandDims { axis: 0 }), &[v], loc, &[t.with_shape(&s)])[0];
        rank += 1;
    }
    let t = c.func.ty(v).clone();
    if t.shape.as_slice() == shape {
        return v;
    }
    c.push(Op::Shape(ShapeOp::Broadcast { shape: shape.into() }), &[v], loc, &[t.with_shape(shape)])[0]
}
