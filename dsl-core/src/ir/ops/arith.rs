//! Elementwise arithmetic and math ops, and pointer offsetting (`addptr`).
//!
//! Semantics (the interpreter and codegen both follow them):
//! - Integer `add`/`sub`/`mul` wrap for unsigned types; for signed types an
//!   overflow is an error in the interpreter (it is undefined on the GPU).
//! - Integer `div` truncates toward zero and `rem` takes the dividend's sign
//!   (Rust/C semantics); division by zero is an error in the interpreter.
//! - `rem` of the most negative value by -1 is 0 (no overflow).
//! - Float `min`/`max` return the non-NaN operand when exactly one is NaN; which
//!   zero `min(+0, -0)` returns is unspecified.
//! - `shl`/`shr` treat the shift amount as unsigned and clamp it to the bit width
//!   (a negative amount shifts everything out); `shr` is arithmetic for signed and
//!   logical for unsigned types.
//! - `mulhi` is the high half of the full-width integer product (Philox uses it).
//! - Transcendentals may be approximate on the GPU (`ex2.approx` and friends);
//!   `exp`/`exp2` results below 2^-126 (f32 subnormals) may be 0 there.

use super::{expect_args, expect_num, same_shapes};
use crate::dtype::{DType, Elem, Type};

/// Binary elementwise ops; operands 0 and 1 have the same type, and so has the result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// Addition.
    Add,
    /// Subtraction.
    Sub,
    /// Multiplication.
    Mul,
    /// Division (truncating for integers).
    Div,
    /// Remainder (sign of the dividend).
    Rem,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Bitwise/logical and (integers).
    And,
    /// Bitwise/logical or (integers).
    Or,
    /// Bitwise/logical xor (integers).
    Xor,
    /// Shift left (integers).
    Shl,
    /// Shift right (integers).
    Shr,
    /// High half of the product (integers).
    MulHi,
    /// `a ** b` (floats).
    Pow,
}

/// Unary elementwise ops; the result has the operand's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// Negation (floats and signed integers).
    Neg,
    /// Bitwise not (integers; logical not for `i1`).
    Not,
    /// Absolute value.
    Abs,
    /// e^x.
    Exp,
    /// 2^x.
    Exp2,
    /// Natural logarithm.
    Log,
    /// Base-2 logarithm.
    Log2,
    /// Square root.
    Sqrt,
    /// 1/sqrt(x).
    Rsqrt,
    /// Sine.
    Sin,
    /// Cosine.
    Cos,
    /// Hyperbolic tangent.
    Tanh,
    /// 1/(1+e^-x).
    Sigmoid,
    /// Round toward -inf.
    Floor,
    /// Round toward +inf.
    Ceil,
    /// Error function.
    Erf,
}

/// The arithmetic family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ArithOp {
    /// `a op b`.
    Binary(BinaryOp),
    /// `op a`.
    Unary(UnaryOp),
    /// `fma a, b, c` = a*b+c with one rounding (floats).
    Fma,
    /// `dp4a a, b, c` = `c + sum_{i<4} byte_i(a) * byte_i(b)`: `a` and `b` are
    /// 32-bit integer tiles read as four bytes each, signed for `i32` and
    /// unsigned for `u32` operands; `c` and the result are `u32` when both
    /// are unsigned and `i32` otherwise (CUDA's `__dp4a`, wrapping on
    /// overflow like integer addition).
    Dp4a,
    /// `addptr p, off`: operand 0 is a pointer (tile), operand 1 an integer (tile) of
    /// the same shape; the result points `off` elements of the pointee past `p`.
    AddPtr,
}

spellings! { BinaryOp:
    Add = "add", Sub = "sub", Mul = "mul", Div = "div", Rem = "rem", Min = "min", Max = "max",
    And = "and", Or = "or", Xor = "xor", Shl = "shl", Shr = "shr", MulHi = "mulhi", Pow = "pow",
}

spellings! { UnaryOp:
    Neg = "neg", Not = "not", Abs = "abs", Exp = "exp", Exp2 = "exp2", Log = "log", Log2 = "log2",
    Sqrt = "sqrt", Rsqrt = "rsqrt", Sin = "sin", Cos = "cos", Tanh = "tanh", Sigmoid = "sigmoid",
    Floor = "floor", Ceil = "ceil", Erf = "erf",
}

impl BinaryOp {
    /// True for ops that accept only integer operands.
    pub fn int_only(self) -> bool {
        matches!(
            self,
            BinaryOp::And | BinaryOp::Or | BinaryOp::Xor | BinaryOp::Shl | BinaryOp::Shr | BinaryOp::MulHi
        )
    }

    /// True for ops with `op(a, b) == op(b, a)`.
    pub fn is_commutative(self) -> bool {
        matches!(
            self,
            BinaryOp::Add
                | BinaryOp::Mul
                | BinaryOp::Min
                | BinaryOp::Max
                | BinaryOp::And
                | BinaryOp::Or
                | BinaryOp::Xor
                | BinaryOp::MulHi
        )
    }
}

impl UnaryOp {
    /// True for ops that accept only floating-point operands.
    pub fn float_only(self) -> bool {
        !matches!(self, UnaryOp::Neg | UnaryOp::Not | UnaryOp::Abs)
    }
}

mnemonics! { ArithOp:
    Fma = "fma", Dp4a = "dp4a", AddPtr = "addptr";
    ArithOp::Binary(b) => b.name(), ArithOp::Unary(u) => u.name()
}

impl ArithOp {
    /// Parses a mnemonic of this family.
    pub fn parse(name: &str) -> Option<ArithOp> {
        if let Some(b) = BinaryOp::from_name(name) {
            return Some(ArithOp::Binary(b));
        }
        if let Some(u) = UnaryOp::from_name(name) {
            return Some(ArithOp::Unary(u));
        }
        match name {
            "fma" => Some(ArithOp::Fma),
            "dp4a" => Some(ArithOp::Dp4a),
            "addptr" => Some(ArithOp::AddPtr),
            _ => None,
        }
    }

    /// Result types.
    pub fn infer(&self, args: &[Type]) -> Result<Vec<Type>, String> {
        let name = self.name();
        match self {
            ArithOp::Binary(b) => {
                expect_args(name, args, 2)?;
                same_shapes(name, args)?;
                if args[0].elem != args[1].elem {
                    return Err(format!(
                        "`{name}` operands must have the same dtype: {} vs {}",
                        args[0].elem, args[1].elem
                    ));
                }
                if b.int_only() {
                    expect_num(name, &args[0], "integer operands", DType::is_int)?;
                } else if *b == BinaryOp::Pow {
                    expect_num(name, &args[0], "floating-point operands", DType::is_float)?;
                } else {
                    expect_num(name, &args[0], "numeric operands", |_| true)?;
                }
                Ok(vec![args[0].clone()])
            }
            ArithOp::Unary(u) => {
                expect_args(name, args, 1)?;
                if u.float_only() {
                    expect_num(name, &args[0], "a floating-point operand", DType::is_float)?;
                } else if *u == UnaryOp::Not {
                    expect_num(name, &args[0], "an integer or boolean operand", DType::is_int)?;
                } else if *u == UnaryOp::Neg {
                    expect_num(name, &args[0], "a float or signed integer operand", |d| {
                        d.is_float() || d.is_signed_int()
                    })?;
                } else {
                    expect_num(name, &args[0], "a numeric operand", |_| true)?;
                }
                Ok(vec![args[0].clone()])
            }
            ArithOp::Fma => {
                expect_args(name, args, 3)?;
                same_shapes(name, args)?;
                expect_num(name, &args[0], "floating-point operands", DType::is_float)?;
                if args.iter().any(|a| a.elem != args[0].elem) {
                    return Err("`fma` operands must have the same dtype".into());
                }
                Ok(vec![args[0].clone()])
            }
            ArithOp::Dp4a => {
                expect_args(name, args, 3)?;
                same_shapes(name, args)?;
                let word = |t: &Type| matches!(t.elem, Elem::Scalar(DType::I32 | DType::U32));
                if !word(&args[0]) || !word(&args[1]) {
                    return Err(format!(
                        "`dp4a` needs i32 or u32 operands (four packed bytes each), found {} and {}",
                        args[0], args[1]
                    ));
                }
                let unsigned = args[0].dtype() == DType::U32 && args[1].dtype() == DType::U32;
                let acc = if unsigned { DType::U32 } else { DType::I32 };
                if args[2].elem != Elem::Scalar(acc) {
                    return Err(format!("`dp4a` of these operands accumulates in {acc}, found {}", args[2]));
                }
                Ok(vec![args[2].clone()])
            }
            ArithOp::AddPtr => {
                expect_args(name, args, 2)?;
                same_shapes(name, args)?;
                if !args[0].is_ptr() {
                    return Err(format!("`addptr` needs a pointer as operand 0, found {}", args[0]));
                }
                match args[1].elem {
                    Elem::Scalar(d) if d.is_int() && d != DType::I1 => Ok(vec![args[0].clone()]),
                    _ => Err(format!("`addptr` needs an integer offset, found {}", args[1])),
                }
            }
        }
    }
}
