//! Target-independent passes: canonicalization (constant folding, DCE, CSE),
//! the `load_block` expansion, FP8 `dot` operands widened to f16
//! ([`f8_dot`]), and the axis analysis codegen uses to vectorize and
//! coalesce accesses.
//!
//! One file per pass: [`canonicalize`] drives folding and control-flow
//! simplification to a fixed point together with [`cse`] and [`dce`], which can
//! also run alone; [`axis`] is an analysis and never changes the IR;
//! [`block_load`] expands `load_block` into a masked `load` (the codegen runs
//! it; the interpreter executes `load_block` itself). `eval` holds the exact
//! scalar evaluation both share.
//!
//! Invariant: every transformation leaves IR that `crate::verify::verify`
//! accepts and that computes what the input computed (as the interpreter
//! defines it), except that an instruction whose result is unused and that has
//! no side effects may disappear with the errors it would have raised, and
//! that the `load_block` expansion computes offsets in `i32` (see there).

pub mod axis;
pub mod block_load;
pub mod canonicalize;
pub mod cse;
pub mod dce;
mod eval;
pub mod f8_dot;

pub use axis::{AxisAnalysis, AxisInfo, analyze};
pub use canonicalize::{CanonicalizeStats, canonicalize};
pub use cse::cse;
pub use dce::dce;

use crate::ir::{Block, Function, Region};

/// A pass that rewrites the instructions of one block at a time (and the
/// regions nested in them, through [`BlockPass::region`]).
trait BlockPass {
    /// Rewrites the instructions of block `b`.
    fn block(&mut self, f: &mut Function, b: Block);

    /// Rewrites every block of region `r`, in order.
    fn region(&mut self, f: &mut Function, r: Region) {
        for b in f.regions[r].blocks.clone() {
            self.block(f, b);
        }
    }
}

#[cfg(test)]
mod axis_tests;
#[cfg(test)]
mod block_load_tests;
#[cfg(test)]
mod canonicalize_tests;
#[cfg(test)]
mod test_eval;
