//! Grid queries: `program_id` reads `%ctaid.{x,y,z}`, `num_programs` reads
//! `%nctaid.{x,y,z}`; both are uniform `i32` scalars.
//!
//! Grid dependency control (sm_90+): `gdc_wait` is `griddepcontrol.wait` and
//! `gdc_launch_dependents` is `griddepcontrol.launch_dependents`, each an
//! inline-assembly statement with a memory clobber so LLVM moves no memory
//! access across it. Before sm_90 there is no programmatic dependent launch
//! (the runtime never overlaps launches there), so both lower to nothing.

use super::Lowerer;
use crate::Result;
use crate::target::Target;
use dsl_core::ir::Inst;
use dsl_core::ir::ops::ProgramOp;

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    pub(super) fn lower_program(&mut self, inst: Inst, op: ProgramOp) -> Result<()> {
        let (reg, axis) = match op {
            ProgramOp::ProgramId { axis } => ("ctaid", axis),
            ProgramOp::NumPrograms { axis } => ("nctaid", axis),
            ProgramOp::GdcWait | ProgramOp::GdcLaunchDependents => {
                if self.opts.target != Target::Sm80 {
                    let asm = if op == ProgramOp::GdcWait {
                        "griddepcontrol.wait;"
                    } else {
                        "griddepcontrol.launch_dependents;"
                    };
                    self.asm(asm, "~{memory}", &[])?;
                }
                return Ok(());
            }
            ProgramOp::Barrier => {
                self.barrier()?;
                return Ok(());
            }
            ProgramOp::GlobalTimer => {
                // A volatile read (side effects): never merged with another.
                let i64t = self.ctx.i64_type();
                let v =
                    self.asm_value("mov.u64 $0, %globaltimer;", "=l,~{memory}", i64t.into(), &[], true)?;
                let res = self.result(inst, 0)?;
                self.set(res, vec![v]);
                return Ok(());
            }
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
