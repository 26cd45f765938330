//! Mappings from the tile IR to LLVM that the NVPTX lowering (`lower`) and
//! the host lowering (`host::lower`) share.

use dsl_core::dtype::DType;
use dsl_core::ir::ops::CmpPred;
use inkwell::context::Context;
use inkwell::types::BasicTypeEnum;
use inkwell::{FloatPredicate, IntPredicate};

/// The LLVM type of a scalar of dtype `d` (`i1` as `i1`, halves as `half`
/// and `bfloat`).
pub(crate) fn scalar_type(ctx: &Context, d: DType) -> BasicTypeEnum<'_> {
    match d {
        DType::I1 => ctx.bool_type().into(),
        DType::I8 | DType::U8 => ctx.i8_type().into(),
        DType::I16 => ctx.i16_type().into(),
        DType::I32 | DType::U32 => ctx.i32_type().into(),
        DType::I64 => ctx.i64_type().into(),
        DType::F16 => ctx.f16_type().into(),
        DType::BF16 => ctx.bf16_type().into(),
        DType::F32 => ctx.f32_type().into(),
        DType::F64 => ctx.f64_type().into(),
    }
}

/// The integer predicate of `cmp p` on operands of the given signedness.
pub(crate) fn int_predicate(p: CmpPred, signed: bool) -> IntPredicate {
    match (p, signed) {
        (CmpPred::Eq, _) => IntPredicate::EQ,
        (CmpPred::Ne, _) => IntPredicate::NE,
        (CmpPred::Lt, true) => IntPredicate::SLT,
        (CmpPred::Le, true) => IntPredicate::SLE,
        (CmpPred::Gt, true) => IntPredicate::SGT,
        (CmpPred::Ge, true) => IntPredicate::SGE,
        (CmpPred::Lt, false) => IntPredicate::ULT,
        (CmpPred::Le, false) => IntPredicate::ULE,
        (CmpPred::Gt, false) => IntPredicate::UGT,
        (CmpPred::Ge, false) => IntPredicate::UGE,
    }
}

/// The float predicate of `cmp p`: ordered, except `ne`, which is unordered
/// (true with NaN).
pub(crate) fn float_predicate(p: CmpPred) -> FloatPredicate {
    match p {
        CmpPred::Eq => FloatPredicate::OEQ,
        CmpPred::Ne => FloatPredicate::UNE,
        CmpPred::Lt => FloatPredicate::OLT,
        CmpPred::Le => FloatPredicate::OLE,
        CmpPred::Gt => FloatPredicate::OGT,
        CmpPred::Ge => FloatPredicate::OGE,
    }
}

/// The integer predicate under which `b` beats `a` in a running maximum
/// (`max`: `b > a`) or minimum (`b < a`).
pub(crate) fn int_order(max: bool, signed: bool) -> IntPredicate {
    int_predicate(if max { CmpPred::Gt } else { CmpPred::Lt }, signed)
}
