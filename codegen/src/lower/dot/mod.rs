//! `dot a, b, acc` = `acc + a @ b`: tensor cores (`mma.sync.m16n8k16`, see
//! `mma.rs`) for f16/bf16 inputs whose shape fits whole instructions on every
//! warp ([`crate::fragment::MmaLayout::choose`]), warpgroup-wide `wgmma` on sm_90a
//! when both operands are pipelined into swizzle atoms (`wgmma.rs`), FMAs
//! from shared memory (`fma.rs`) otherwise. `plan.rs` decides, once per function, which `dot`s
//! take tensor cores; the kernel plan (`lower/plan.rs`) records each `dot`'s
//! [`DotLowering`] and its operand sources, which these files follow.

mod fma;
mod frag;
mod mma;
pub(crate) mod plan;
pub(crate) mod resident;
mod wgmma;

pub(crate) use wgmma::PendingWgmma;

use super::Lowerer;
use super::plan::{DotLowering, MmaB};
use crate::Result;
use dsl_core::ir::Inst;
use dsl_core::ir::ops::DotOp;

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    pub(super) fn lower_dot(&mut self, inst: Inst, _op: DotOp) -> Result<()> {
        match self.plan.dot(inst) {
            DotLowering::Wgmma { layout, a, deferred } => self.lower_dot_wgmma(inst, layout, a, deferred),
            DotLowering::MmaSync { layout, b: MmaB::Fragments(_), .. } => self.lower_dot_frag(inst, layout),
            DotLowering::MmaSync { layout, .. } => self.lower_dot_mma(inst, layout),
            DotLowering::Fma => self.lower_dot_fma(inst),
        }
    }
}
