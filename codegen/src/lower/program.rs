//! Grid queries: `program_id` reads `%ctaid.{x,y,z}`, `num_programs` reads
//! `%nctaid.{x,y,z}`; both are uniform `i32` scalars.

use super::Lowerer;
use crate::Result;
use dsl_core::ir::Inst;
use dsl_core::ir::ops::ProgramOp;

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    pub(super) fn lower_program(&mut self, inst: Inst, op: ProgramOp) -> Result<()> {
        let (reg, axis) = match op {
            ProgramOp::ProgramId { axis } => ("ctaid", axis),
            ProgramOp::NumPrograms { axis } => ("nctaid", axis),
        };
        let dim = match axis {
            0 => "x",
            1 => "y",
            2 => "z",
            _ => return Err(self.bug(inst, format!("axis {axis} out of range"))),
        };
        let v = self.sreg(&format!("llvm.nvvm.read.ptx.sreg.{reg}.{dim}"))?;
        let res = self.result(inst, 0)?;
        self.set(res, vec![v.into()]);
        Ok(())
    }
}
