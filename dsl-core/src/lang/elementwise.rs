//! Elementwise arithmetic, math, comparisons and `where`, plus Rust operator
//! overloading on [`Tensor`] (`+ - * / % & | ^ << >>`, unary `-` and `!`).

use super::{Operand, Tensor, broadcast_value, cast_to, literal};
use crate::builder::{Ctx, broadcast_shapes, computation_type, with_ctx};
use crate::dtype::{DType, Elem, Type};
use crate::ir::ops::{ArithOp, BinaryOp, CmpPred, CompareOp, UnaryOp};
use crate::ir::{Op, Value};
use crate::loc::Location;

/// The dtype a literal takes next to a tensor of dtype `other`.
fn literal_dtype(lit: Operand, other: DType) -> DType {
    match lit {
        Operand::Float(_) if !other.is_float() => DType::F32,
        Operand::Int(_) if other == DType::I1 => DType::I32,
        _ => other,
    }
}

/// The dtype a literal has on its own.
fn natural_dtype(lit: Operand) -> DType {
    match lit {
        Operand::Float(_) => DType::F32,
        Operand::Bool(_) => DType::I1,
        Operand::Int(i) if i32::try_from(i).is_ok() => DType::I32,
        _ => DType::I64,
    }
}

/// Promotes numeric operands to one dtype and one shape, materializing literals.
/// Pointer operands keep their type (only their shape is broadcast). On a shape
/// mismatch the error is recorded and every operand is replaced by the first, so
/// the op still type-checks and the one mistake is reported once.
pub(crate) fn promote_many(c: &mut Ctx, ops: &[Operand], loc: &Location, what: &'static str) -> Vec<Value> {
    let mut dtype: Option<DType> = None;
    for o in ops {
        if let Operand::Tensor(t) = o {
            c.check(*t);
            let ty = c.func.ty(t.value());
            if !ty.is_ptr() {
                dtype = Some(match dtype {
                    Some(d) => computation_type(d, ty.dtype()),
                    None => ty.dtype(),
                });
            }
        }
    }
    let dtype = match dtype {
        Some(d) => ops.iter().fold(d, |d, o| match o {
            Operand::Tensor(_) => d,
            lit => computation_type(d, literal_dtype(*lit, d)),
        }),
        None => ops
            .iter()
            .filter(|o| !matches!(o, Operand::Tensor(_)))
            .map(|o| natural_dtype(*o))
            .reduce(computation_type)
            .unwrap_or(DType::I32),
    };
    let vals: Vec<Value> = ops
        .iter()
        .map(|o| match o {
            Operand::Tensor(t) if c.func.ty(t.value()).is_ptr() => t.value(),
            Operand::Tensor(t) => cast_to(c, t.value(), dtype, loc),
            lit => literal(c, *lit, dtype, loc),
        })
        .collect();
    broadcast_all(c, vals, loc, what)
}

/// Broadcasts `vals` to their common shape; on a mismatch the error is
/// recorded and every value is replaced by the first (see [`promote_many`]).
pub(crate) fn broadcast_all(c: &mut Ctx, vals: Vec<Value>, loc: &Location, what: &'static str) -> Vec<Value> {
    let mut shape: Vec<usize> = Vec::new();
    for &v in &vals {
        match broadcast_shapes(&shape, &c.func.ty(v).shape) {
            Ok(s) => shape = s,
            Err(msg) => {
                c.error(loc, Some(what), msg);
                return vec![vals[0]; vals.len()];
            }
        }
    }
    vals.into_iter().map(|v| broadcast_value(c, v, &shape, loc)).collect()
}

/// [`promote_many`] for two operands.
pub(crate) fn promote_pair(
    c: &mut Ctx,
    a: Operand,
    b: Operand,
    loc: &Location,
    what: &'static str,
) -> (Value, Value) {
    let v = promote_many(c, &[a, b], loc, what);
    (v[0], v[1])
}

/// Applies a binary op with promotion and broadcasting.
pub(crate) fn binary_at(op: BinaryOp, a: Operand, b: Operand, loc: &Location) -> Tensor {
    with_ctx(|c| {
        let name = op.name();
        // Pointer arithmetic: `p + i`, `i + p`, `p - i`.
        let is_ptr = |c: &Ctx, o: Operand| matches!(o, Operand::Tensor(t) if c.func.ty(t.value()).is_ptr());
        let (pa, pb) = (is_ptr(c, a), is_ptr(c, b));
        if pa || pb {
            let (p, off, neg) = match (op, pa, pb) {
                (BinaryOp::Add, true, false) => (a, b, false),
                (BinaryOp::Add, false, true) => (b, a, false),
                (BinaryOp::Sub, true, false) => (a, b, true),
                _ => {
                    c.error(loc, Some(name), format!("`{name}` is not defined on pointers; only pointer + integer and pointer - integer are"));
                    let v = match a {
                        Operand::Tensor(t) => t.value(),
                        _ => c.placeholder(&Type::scalar(DType::I32), loc),
                    };
                    return c.handle(v);
                }
            };
            let (vp, mut voff) = promote_pair(c, p, off, loc, "addptr");
            if vp == voff {
                // Promotion failed and was reported; the pointer stands in for the result.
                return c.handle(vp);
            }
            if neg {
                let t = c.func.ty(voff).clone();
                voff = c.push(Op::Arith(ArithOp::Unary(UnaryOp::Neg)), &[voff], loc, &[t])[0];
            }
            let t = c.func.ty(vp).clone();
            let v = c.push(Op::Arith(ArithOp::AddPtr), &[vp, voff], loc, &[t])[0];
            return c.handle(v);
        }
        let (va, vb) = promote_pair(c, a, b, loc, name);
        let t = c.func.ty(va).clone();
        let v = c.push(Op::Arith(ArithOp::Binary(op)), &[va, vb], loc, &[t])[0];
        c.handle(v)
    })
}

fn unary_at(op: UnaryOp, x: Tensor, loc: &Location) -> Tensor {
    with_ctx(|c| {
        c.check(x);
        let t = c.func.ty(x.value()).clone();
        let v = c.push(Op::Arith(ArithOp::Unary(op)), &[x.value()], loc, &[t])[0];
        c.handle(v)
    })
}

fn compare_at(pred: CmpPred, a: Operand, b: Operand, loc: &Location) -> Tensor {
    with_ctx(|c| {
        let (va, vb) = promote_pair(c, a, b, loc, "cmp");
        let t = c.func.ty(va).with_elem(Elem::Scalar(DType::I1));
        let v = c.push(Op::Compare(CompareOp::Cmp(pred)), &[va, vb], loc, &[t])[0];
        c.handle(v)
    })
}

/// Functions (or methods) `$f(params)`, each building the op `$kind::$op`
/// with `$at` (`binary_at`, `unary_at`, `compare_at`) from `args` at the
/// caller's location.
macro_rules! op_fns {
    (@fn $at:ident, $kind:ident, ($($params:tt)*) => ($($arg:expr),*); $(#[$m:meta])* $f:ident => $op:ident) => {
        $(#[$m])*
        #[track_caller]
        pub fn $f($($params)*) -> Tensor {
            $at($kind::$op, $($arg,)* &Location::caller())
        }
    };
    ($at:ident, $kind:ident, $params:tt => $args:tt; $($(#[$m:meta])* $f:ident => $op:ident;)*) => {$(
        op_fns!(@fn $at, $kind, $params => $args; $(#[$m])* $f => $op);
    )*};
}

op_fns! {
    binary_at, BinaryOp, (a: impl Into<Operand>, b: impl Into<Operand>) => (a.into(), b.into());
    /// `a + b` (pointer + integer offsets too).
    add => Add;
    /// `a - b`.
    sub => Sub;
    /// `a * b`.
    mul => Mul;
    /// `a / b`; integer division truncates toward zero.
    div => Div;
    /// `a % b`, with the dividend's sign.
    rem => Rem;
    /// Elementwise minimum (Triton's `minimum`).
    minimum => Min;
    /// Elementwise maximum (Triton's `maximum`).
    maximum => Max;
    /// Bitwise (or logical, on `i1`) and.
    and => And;
    /// Bitwise (or logical, on `i1`) or.
    or => Or;
    /// Bitwise (or logical, on `i1`) xor.
    xor => Xor;
    /// Shift left.
    shl => Shl;
    /// Shift right (arithmetic for signed types).
    shr => Shr;
    /// High half of the integer product (`__umulhi`).
    umulhi => MulHi;
    /// `a ** b` for floats.
    pow => Pow;
}

op_fns! {
    unary_at, UnaryOp, (x: Tensor) => (x);
    /// Negation.
    neg => Neg;
    /// Bitwise not (logical not on `i1`).
    not => Not;
    /// Absolute value.
    abs => Abs;
    /// e^x.
    exp => Exp;
    /// 2^x.
    exp2 => Exp2;
    /// Natural logarithm.
    log => Log;
    /// Base-2 logarithm.
    log2 => Log2;
    /// Square root.
    sqrt => Sqrt;
    /// Reciprocal square root.
    rsqrt => Rsqrt;
    /// Sine.
    sin => Sin;
    /// Cosine.
    cos => Cos;
    /// Hyperbolic tangent.
    tanh => Tanh;
    /// Logistic sigmoid.
    sigmoid => Sigmoid;
    /// Round toward -inf.
    floor => Floor;
    /// Round toward +inf.
    ceil => Ceil;
    /// Error function.
    erf => Erf;
}

op_fns! {
    compare_at, CmpPred, (a: impl Into<Operand>, b: impl Into<Operand>) => (a.into(), b.into());
    /// `a == b`.
    eq => Eq;
    /// `a != b`.
    ne => Ne;
    /// `a < b`.
    lt => Lt;
    /// `a <= b`.
    le => Le;
    /// `a > b`.
    gt => Gt;
    /// `a >= b`.
    ge => Ge;
}

/// `cond ? a : b` elementwise (Triton's `where`), broadcasting all three.
#[track_caller]
pub fn where_(cond: Tensor, a: impl Into<Operand>, b: impl Into<Operand>) -> Tensor {
    let loc = Location::caller();
    let (a, b) = (a.into(), b.into());
    with_ctx(|c| {
        c.check(cond);
        let (va, vb) = promote_pair(c, a, b, &loc, "select");
        let shape = c.func.ty(va).shape.clone();
        let cshape = c.func.ty(cond.value()).shape.clone();
        let (mut vc, mut va, mut vb) = (cond.value(), va, vb);
        match broadcast_shapes(&cshape, &shape) {
            Ok(s) => {
                vc = broadcast_value(c, vc, &s, &loc);
                va = broadcast_value(c, va, &s, &loc);
                vb = broadcast_value(c, vb, &s, &loc);
            }
            Err(msg) => c.error(&loc, Some("select"), msg),
        }
        let t = c.func.ty(va).clone();
        let v = c.push(Op::Compare(CompareOp::Select), &[vc, va, vb], &loc, &[t])[0];
        c.handle(v)
    })
}

/// `c + sum_{i<4} byte_i(a) * byte_i(b)`: four products of packed bytes
/// (signed in `i32` operands, unsigned in `u32` ones) added to the 32-bit
/// accumulator `c` (`u32` when both operands are unsigned, else `i32`);
/// CUDA's `__dp4a`. Operands of other integer dtypes are not converted: the
/// bytes must already be packed into 32-bit words.
#[track_caller]
pub fn dp4a(a: impl Into<Operand>, b: impl Into<Operand>, acc: impl Into<Operand>) -> Tensor {
    let loc = Location::caller();
    ternary_at(ArithOp::Dp4a, [a.into(), b.into(), acc.into()], &loc, |c, ops| {
        // Operands keep their dtypes (no promotion: the bytes' signedness is
        // the dtype); literals are i32 words, the accumulator's u32 when both
        // words are unsigned.
        let word = |o: &Operand, c: &Ctx| match o {
            Operand::Tensor(t) => c.func.ty(t.value()).dtype(),
            _ => DType::I32,
        };
        let unsigned = word(&ops[0], c) == DType::U32 && word(&ops[1], c) == DType::U32;
        let acc_dtype = if unsigned { DType::U32 } else { DType::I32 };
        let vals: Vec<Value> = ops
            .iter()
            .enumerate()
            .map(|(i, o)| match o {
                Operand::Tensor(t) => {
                    c.check(*t);
                    t.value()
                }
                lit => super::literal(c, *lit, if i == 2 { acc_dtype } else { DType::I32 }, &loc),
            })
            .collect();
        broadcast_all(c, vals, &loc, "dp4a")
    })
}

/// `a * b + c` with a single rounding (floats).
#[track_caller]
pub fn fma(a: impl Into<Operand>, b: impl Into<Operand>, acc: impl Into<Operand>) -> Tensor {
    let loc = Location::caller();
    ternary_at(ArithOp::Fma, [a.into(), b.into(), acc.into()], &loc, |c, ops| {
        promote_many(c, ops, &loc, "fma")
    })
}

/// Builds the three-operand `op` (`dp4a`, `fma`) at `loc` on the values that
/// `operands` makes of `ops` (converted and broadcast); its result has the
/// type of the third (the accumulator).
fn ternary_at(
    op: ArithOp,
    ops: [Operand; 3],
    loc: &Location,
    operands: impl FnOnce(&mut Ctx, &[Operand; 3]) -> Vec<Value>,
) -> Tensor {
    with_ctx(|c| {
        let v = operands(c, &ops);
        let t = c.func.ty(v[2]).clone();
        let r = c.push(Op::Arith(op), &v, loc, &[t])[0];
        c.handle(r)
    })
}

/// Ceiling division `(a + b - 1) / b` for integers.
#[track_caller]
pub fn cdiv(a: impl Into<Operand>, b: impl Into<Operand>) -> Tensor {
    let loc = Location::caller();
    let (a, b) = (a.into(), b.into());
    let s = binary_at(BinaryOp::Add, a, b, &loc);
    let s = binary_at(BinaryOp::Sub, Operand::Tensor(s), Operand::Int(1), &loc);
    binary_at(BinaryOp::Div, Operand::Tensor(s), b, &loc)
}

macro_rules! op_impls {
    ($($tr:ident $m:ident => $op:ident;)*) => {$(
        impl<R: Into<Operand>> std::ops::$tr<R> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $m(self, rhs: R) -> Tensor {
                binary_at(BinaryOp::$op, Operand::Tensor(self), rhs.into(), &Location::caller())
            }
        }
        op_impls!(@lhs $tr $m $op; i32 i64 u32 f32 f64 bool usize);
    )*};
    (@lhs $tr:ident $m:ident $op:ident; $($t:ty)*) => {$(
        impl std::ops::$tr<Tensor> for $t {
            type Output = Tensor;
            #[track_caller]
            fn $m(self, rhs: Tensor) -> Tensor {
                binary_at(BinaryOp::$op, self.into(), Operand::Tensor(rhs), &Location::caller())
            }
        }
    )*};
}

op_impls! {
    Add add => Add;
    Sub sub => Sub;
    Mul mul => Mul;
    Div div => Div;
    Rem rem => Rem;
    BitAnd bitand => And;
    BitOr bitor => Or;
    BitXor bitxor => Xor;
    Shl shl => Shl;
    Shr shr => Shr;
}

impl std::ops::Neg for Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        unary_at(UnaryOp::Neg, self, &Location::caller())
    }
}

impl std::ops::Not for Tensor {
    type Output = Tensor;
    #[track_caller]
    fn not(self) -> Tensor {
        unary_at(UnaryOp::Not, self, &Location::caller())
    }
}

impl Tensor {
    op_fns! {
        compare_at, CmpPred, (self, rhs: impl Into<Operand>) => (Operand::Tensor(self), rhs.into());
        /// `self < rhs`.
        lt => Lt;
        /// `self <= rhs`.
        le => Le;
        /// `self > rhs`.
        gt => Gt;
        /// `self >= rhs`.
        ge => Ge;
        /// `self == rhs` elementwise.
        eq_ => Eq;
        /// `self != rhs` elementwise.
        ne_ => Ne;
    }
}
