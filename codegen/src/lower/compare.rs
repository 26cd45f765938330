//! Comparisons and `select`, register by register.
//!
//! Float comparisons are ordered except `ne`, which is unordered (true with
//! NaN); halves are compared after an exact widening to f32. Integers compare
//! by their dtype's signedness (`i1` unsigned); pointers by address.

use super::Lowerer;
use crate::Result;
use crate::llvm::{float_predicate, int_predicate};
use dsl_core::ir::Inst;
use dsl_core::ir::ops::CompareOp;

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    pub(super) fn lower_compare(&mut self, inst: Inst, op: CompareOp) -> Result<()> {
        let args = self.args(inst);
        let res = self.result(inst, 0)?;
        match op {
            CompareOp::Select => {
                let (c, a, b) = (self.regs(args[0])?, self.regs(args[1])?, self.regs(args[2])?);
                let mut out = Vec::with_capacity(a.len());
                for i in 0..a.len() {
                    out.push(self.b.build_select(c[i].into_int_value(), a[i], b[i], "")?);
                }
                self.set(res, out);
            }
            CompareOp::Cmp(p) => {
                let ty = self.f.ty(args[0]).clone();
                let (a, b) = (self.regs(args[0])?, self.regs(args[1])?);
                let mut out = Vec::with_capacity(a.len());
                for i in 0..a.len() {
                    let v = if ty.is_float() {
                        let d = ty.dtype();
                        let x = self.fwiden(a[i], d)?;
                        let y = self.fwiden(b[i], d)?;
                        self.b.build_float_compare(float_predicate(p), x, y, "")?
                    } else {
                        let signed = !ty.is_ptr() && ty.dtype().is_signed_int();
                        let (x, y) = if ty.is_ptr() {
                            let i64t = self.ctx.i64_type();
                            (
                                self.b.build_ptr_to_int(a[i].into_pointer_value(), i64t, "")?,
                                self.b.build_ptr_to_int(b[i].into_pointer_value(), i64t, "")?,
                            )
                        } else {
                            (a[i].into_int_value(), b[i].into_int_value())
                        };
                        self.b.build_int_compare(int_predicate(p, signed), x, y, "")?
                    };
                    out.push(v.into());
                }
                self.set(res, out);
            }
        }
        Ok(())
    }
}
