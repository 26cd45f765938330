//! Device assert and print.
//!
//! `assert` calls the CUDA runtime's `__assertfail(msg, file, line, func,
//! charsize)` (resolved by the driver's PTX linker) for every register whose
//! condition is false; the kernel then traps with the message. In a kernel
//! with `wgmma` it executes `trap` instead: a call anywhere in the kernel
//! makes ptxas serialize every `wgmma` (warning C7510), so there the
//! message is only the interpreter's. `print` is not
//! supported yet (it needs `vprintf` argument buffers).

use super::Lowerer;
use crate::Result;
use dsl_core::ir::Inst;
use dsl_core::ir::ops::DebugOp;
use inkwell::AddressSpace;
use inkwell::module::Linkage;
use inkwell::values::BasicValueEnum;

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    /// A private constant C string in global memory, as a generic pointer.
    fn cstring(&mut self, s: &str) -> Result<BasicValueEnum<'ctx>> {
        let init = self.ctx.const_string(s.as_bytes(), true);
        let g = self.module.add_global(init.get_type(), Some(AddressSpace::from(1u16)), "__tessera_str");
        g.set_initializer(&init);
        g.set_constant(true);
        g.set_linkage(Linkage::Private);
        let generic = self.ctx.ptr_type(AddressSpace::default());
        Ok(self.b.build_address_space_cast(g.as_pointer_value(), generic, "")?.into())
    }

    pub(super) fn lower_debug(&mut self, inst: Inst, op: &DebugOp) -> Result<()> {
        match op {
            DebugOp::Print { .. } => {
                Err(self.unsupported(inst, "device_print is not implemented in codegen"))
            }
            DebugOp::Assert { message } => {
                let cond = self.regs(self.args(inst)[0])?;
                if !self.plan.pipe.wgmma.is_empty() {
                    // A call anywhere in the kernel makes ptxas serialize
                    // every `wgmma` (C7510), so these asserts trap without
                    // their message (the interpreter reports it).
                    for c in cond {
                        let bad = self.b.build_not(c.into_int_value(), "")?;
                        self.if_then(bad, |lw| {
                            lw.call("llvm.trap", None, &[])?;
                            Ok(())
                        })?;
                    }
                    return Ok(());
                }
                let loc = self.f.insts[inst].loc.clone();
                let msg = self.cstring(message)?;
                let file = self.cstring(&loc.file)?;
                let func = self.cstring(&self.f.name.clone())?;
                let line = self.i32c(i64::from(loc.line));
                let one = self.ctx.i64_type().const_int(1, false);
                for c in cond {
                    let bad = self.b.build_not(c.into_int_value(), "")?;
                    self.if_then(bad, |lw| {
                        lw.call("__assertfail", None, &[msg, file, line.into(), func, one.into()])?;
                        Ok(())
                    })?;
                }
                Ok(())
            }
        }
    }
}
