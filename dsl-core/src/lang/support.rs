//! Conversions the `#[kernel]` expansion calls (hidden from docs). Build-time
//! integers may be any Rust integer type (constexprs are plain Rust values);
//! out-of-range values become build errors at the caller's location.

use super::{Operand, Tensor};
use crate::builder::{report_error_at, with_ctx};
use crate::dtype::DType;
use crate::loc::Location;

/// Rust integer types usable as build-time integers (tile sizes, axes, bounds).
pub trait ConstInt: Copy {
    /// The value as `i64` (saturating for `u64`/`usize` beyond `i64::MAX`).
    fn to_i64(self) -> i64;
}

macro_rules! const_int {
    ($($t:ty),*) => {$(
        impl ConstInt for $t {
            fn to_i64(self) -> i64 {
                i64::try_from(self).unwrap_or(i64::MAX)
            }
        }
    )*};
}
const_int!(i8, u8, i16, u16, i32, u32, i64, u64, usize, isize);

fn checked<T: TryFrom<i64>>(v: impl ConstInt, what: &str, loc: Location) -> Option<T> {
    let v = v.to_i64();
    let r = T::try_from(v).ok();
    if r.is_none() {
        report_error_at(loc, format!("{what} {v} is out of range"));
    }
    r
}

/// Build-time integer conversions for `#[kernel]` bodies: `$f(v)` is `v` as
/// `$t`, or `$default` after reporting `$what` out of range.
macro_rules! const_int_fns {
    ($($(#[$m:meta])* $f:ident -> $t:ty, $what:literal, $default:literal;)*) => {$(
        $(#[$m])*
        #[doc(hidden)]
        #[track_caller]
        pub fn $f(v: impl ConstInt) -> $t {
            checked(v, $what, Location::caller()).unwrap_or($default)
        }
    )*};
}

const_int_fns! {
    /// A build-time integer as `i32` (tile bounds).
    __i32 -> i32, "integer", 0;
    /// A build-time integer as `u32`.
    __u32 -> u32, "integer", 1;
    /// A build-time integer as `u8` (grid axes).
    __u8 -> u8, "axis", 0;
    /// A build-time integer as a tile dimension.
    __usize -> usize, "tile dimension", 1;
}

/// Materializes a literal or constexpr as a tensor of its natural dtype (Rust
/// ints -> i32 when they fit, else i64; floats -> f32; bools -> i1); tensors
/// pass through.
#[doc(hidden)]
#[track_caller]
pub fn __tensor(v: impl Into<Operand>) -> Tensor {
    let loc = Location::caller();
    match v.into() {
        Operand::Tensor(t) => t,
        Operand::Int(i) => {
            let d = if i32::try_from(i).is_ok() { DType::I32 } else { DType::I64 };
            with_ctx(|c| {
                let v = super::literal(c, Operand::Int(i), d, &loc);
                c.handle(v)
            })
        }
        Operand::Float(f) => with_ctx(|c| {
            let v = super::literal(c, Operand::Float(f), DType::F32, &loc);
            c.handle(v)
        }),
        Operand::Bool(b) => with_ctx(|c| {
            let v = super::literal(c, Operand::Bool(b), DType::I1, &loc);
            c.handle(v)
        }),
    }
}

/// Values a kernel function or combine function can return: a tensor or a tuple.
pub trait IntoTensors {
    /// Flattens into a list.
    fn into_tensors(self) -> Vec<Tensor>;
}

impl IntoTensors for Tensor {
    fn into_tensors(self) -> Vec<Tensor> {
        vec![self]
    }
}

impl IntoTensors for Vec<Tensor> {
    fn into_tensors(self) -> Vec<Tensor> {
        self
    }
}

macro_rules! tuple_into {
    ($($n:ident),*) => {
        impl IntoTensors for ($(tuple_into!(@t $n),)*) {
            #[allow(non_snake_case)]
            fn into_tensors(self) -> Vec<Tensor> {
                let ($($n,)*) = self;
                vec![$($n),*]
            }
        }
    };
    (@t $n:ident) => { Tensor };
}
tuple_into!(A, B);
tuple_into!(A, B, C);
tuple_into!(A, B, C, D);

/// Rebuilds a tensor or tuple from a list (the inverse of [`IntoTensors`]).
pub trait FromTensors: Sized {
    /// Takes the leading values.
    fn from_tensors(v: &[Tensor]) -> Self;
}

impl FromTensors for Tensor {
    fn from_tensors(v: &[Tensor]) -> Self {
        v[0]
    }
}

impl FromTensors for (Tensor, Tensor) {
    fn from_tensors(v: &[Tensor]) -> Self {
        (v[0], v[1])
    }
}

impl FromTensors for (Tensor, Tensor, Tensor) {
    fn from_tensors(v: &[Tensor]) -> Self {
        (v[0], v[1], v[2])
    }
}

/// Dtypes as values, so kernels can write `x.to(bf16)` like Triton's `x.to(tl.bfloat16)`.
#[allow(non_upper_case_globals)]
pub mod dtypes {
    use crate::dtype::DType;

    /// One documented `pub const name: DType` per `name = Variant`, with
    /// an optional note on the dtype.
    macro_rules! dtype_values {
        ($($name:ident = $variant:ident $(($note:literal))?),+ $(,)?) => {
            $(
                #[doc = concat!("`", stringify!($name), "`", $(" (", $note, ")",)? ".")]
                pub const $name: DType = DType::$variant;
            )+
        };
    }

    dtype_values! {
        i1 = I1 ("booleans, masks"), i8 = I8, u8 = U8, i16 = I16, i32 = I32, u32 = U32, i64 = I64,
        f16 = F16, bf16 = BF16, f32 = F32, f64 = F64,
        f8e4m3 = F8E4M3 ("OCP FP8 E4M3"), f8e5m2 = F8E5M2 ("OCP FP8 E5M2"),
    }
}

/// Marker type for kernel signatures: `Ptr<f32>` is a global pointer to f32.
pub struct Ptr<T: ?Sized>(std::marker::PhantomData<T>);
