//! Creation ops: `const`, `full`, `splat`, `arange`.
//!
//! Invariant: constants and splats fill every register with the same value;
//! `arange` computes each register's linear index from the layout, so no data
//! moves between threads.

use super::{Lowerer, reg_type};
use crate::Result;
use dsl_core::Scalar;
use dsl_core::dtype::{DType, Elem};
use dsl_core::ir::Inst;
use dsl_core::ir::ops::CreationOp;
use inkwell::values::BasicValueEnum;

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    /// The LLVM constant of a scalar.
    pub fn const_scalar(&self, s: Scalar) -> BasicValueEnum<'ctx> {
        let d = s.dtype();
        let ty = reg_type(self.ctx, Elem::Scalar(d));
        if d.is_f8() {
            // An 8-bit float register holds its code.
            let code = dsl_core::dtype::f8_bits(d, s.as_f64() as f32);
            ty.into_int_type().const_int(u64::from(code), false).into()
        } else if d.is_float() {
            ty.into_float_type().const_float(s.as_f64()).into()
        } else {
            let v = if d == DType::I1 { (s.as_i64() & 1) as u64 } else { s.as_i64() as u64 };
            ty.into_int_type().const_int(v, d.is_signed_int()).into()
        }
    }

    pub(super) fn lower_creation(&mut self, inst: Inst, op: &CreationOp) -> Result<()> {
        let res = self.result(inst, 0)?;
        let l = self.layout_of(res);
        let regs = match op {
            CreationOp::Const(s) | CreationOp::Full { value: s, .. } => vec![self.const_scalar(*s); l.regs()],
            CreationOp::Splat { .. } => {
                let a = self.args(inst)[0];
                let v = self.regs(a)?[0];
                vec![v; l.regs()]
            }
            CreationOp::Arange { start, .. } => {
                let base = self.thread_base(&l)?;
                let base = if *start != 0 {
                    self.b.build_int_add(base, self.i32c(*start as i64), "")?
                } else {
                    base
                };
                let mut out = Vec::with_capacity(l.regs());
                for s in 0..l.regs() {
                    out.push(self.linear_index(&l, base, s)?.into());
                }
                out
            }
        };
        self.set(res, regs);
        Ok(())
    }
}
