//! `assert` and `print`. A failed assertion stops the program with its
//! error site's code (the launcher reports the message and the op's
//! location); `print` runs on the interpreter only.

use super::Lower;
use super::eval::Idx;
use crate::Result;
use dsl_core::ir::Inst;
use dsl_core::ir::ops::{DebugOp, Op};

impl<'ctx> Lower<'ctx, '_> {
    /// `assert` (scalar or tile condition) and `print`.
    pub(super) fn lower_debug(&mut self, i: Inst) -> Result<()> {
        let f = self.f;
        let d = &f.insts[i];
        let Op::Debug(op) = &d.op else { return Err(self.unsupported(i, "not a debug op")) };
        let message = match op {
            DebugOp::Assert { message } => message.clone(),
            DebugOp::Print { .. } => {
                return Err(self.unsupported(i, "`print` runs only on the interpreter (`--device interp`)"));
            }
        };
        let code = self.error_site(i, format!("device assertion failed: {message}"));
        let c = d.args[0];
        let ty = f.ty(c).clone();
        if ty.rank() == 0 {
            let v = self.scalar(c)?.into_int_value();
            let bad = self.b.build_not(v, "")?;
            return self.fail_if(bad, code);
        }
        let n = ty.numel();
        let lanes = self.lanes.min(n as u32).max(1);
        self.emit_loop(self.c32(0), self.c32(n as i64), i64::from(lanes), true, |l, base| {
            l.memo.clear();
            let v = l.eval(c, &Idx::affine(base, lanes))?;
            let all = l.call1("llvm.vector.reduce.and", &[v])?.into_int_value();
            let bad = l.b.build_not(all, "")?;
            l.fail_if(bad, code)
        })?;
        self.memo.clear();
        Ok(())
    }
}
