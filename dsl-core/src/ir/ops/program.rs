//! Grid queries and grid dependency control.
//!
//! `program_id` and `num_programs` along axis 0, 1 or 2 (`i32`).
//!
//! `gdc_wait` and `gdc_launch_dependents` (no operands, no results) are
//! Hopper's programmatic dependent launch, under Triton's names
//! (`tl.extra.cuda.gdc_wait`): a kernel launched with programmatic stream
//! serialization may start while the kernel before it in the stream is still
//! running, and `gdc_wait` blocks until that kernel has completed and its
//! memory writes are visible. `gdc_launch_dependents` lets the next kernel in
//! the stream start early (once every program has called it or exited).
//! Both are no-ops on the interpreter and on targets before sm_90, where no
//! launch overlaps.
//!
//! Invariant (checked by the verifier): `gdc_wait` appears at most once, in
//! the kernel's top-level block, with no store, atomic or volatile load
//! before it, so every write of the kernel happens after the previous kernel
//! has finished. Plain loads before it are the author's promise that they
//! read memory no earlier kernel of the stream writes (weights, for example).

use super::{Attr, Attrs, attr_int, expect_args};
use crate::dtype::{DType, Type};

/// The program family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProgramOp {
    /// Index of this program along `axis`.
    ProgramId {
        /// 0, 1 or 2.
        axis: u8,
    },
    /// Number of programs along `axis`.
    NumPrograms {
        /// 0, 1 or 2.
        axis: u8,
    },
    /// `gdc_wait`: waits for the kernels this launch depends on to complete
    /// and their writes to become visible (`griddepcontrol.wait`).
    GdcWait,
    /// `gdc_launch_dependents`: allows the next kernel of the stream to be
    /// scheduled (`griddepcontrol.launch_dependents`).
    GdcLaunchDependents,
    /// `globaltimer`: a nanosecond clock shared by every program of the
    /// launch (`%globaltimer`), an `i64` scalar; for timing the phases of a
    /// persistent kernel. Never moved or merged with another read.
    GlobalTimer,
    /// `barrier`: every thread of the program waits here until all have
    /// arrived, and the global-memory writes any of them made before it are
    /// visible to all of them after it (`bar.sync`); for a program that
    /// reads back what it just stored. Never moved.
    Barrier,
}

mnemonics! { ProgramOp:
    ProgramId = "program_id", NumPrograms = "num_programs", GdcWait = "gdc_wait",
    GdcLaunchDependents = "gdc_launch_dependents", GlobalTimer = "globaltimer", Barrier = "barrier",
}

impl ProgramOp {
    /// The axis of a grid query (`None` for the dependency-control ops).
    pub fn axis(&self) -> Option<u8> {
        match *self {
            ProgramOp::ProgramId { axis } | ProgramOp::NumPrograms { axis } => Some(axis),
            ProgramOp::GdcWait
            | ProgramOp::GdcLaunchDependents
            | ProgramOp::GlobalTimer
            | ProgramOp::Barrier => None,
        }
    }

    /// True for the grid dependency-control ops, which order the kernel
    /// against its neighbours in the stream, and the clock: never removed or
    /// moved.
    pub fn has_side_effects(&self) -> bool {
        self.axis().is_none()
    }

    /// Attributes for printing.
    pub fn attrs(&self) -> Attrs {
        self.axis().map(|a| vec![("axis", Attr::Int(a as i64))]).unwrap_or_default()
    }

    /// Parses from mnemonic and attributes.
    pub fn parse(name: &str, attrs: &[(String, Attr)]) -> Result<Option<ProgramOp>, String> {
        let axis = || -> Result<u8, String> {
            let a = attr_int(attrs, "axis")?;
            u8::try_from(a).map_err(|_| format!("axis {a} out of range"))
        };
        Ok(Some(match name {
            "program_id" => ProgramOp::ProgramId { axis: axis()? },
            "num_programs" => ProgramOp::NumPrograms { axis: axis()? },
            "gdc_wait" => ProgramOp::GdcWait,
            "gdc_launch_dependents" => ProgramOp::GdcLaunchDependents,
            "globaltimer" => ProgramOp::GlobalTimer,
            "barrier" => ProgramOp::Barrier,
            _ => return Ok(None),
        }))
    }

    /// Result types.
    pub fn infer(&self, args: &[Type]) -> Result<Vec<Type>, String> {
        expect_args(self.name(), args, 0)?;
        match self.axis() {
            None if *self == ProgramOp::GlobalTimer => Ok(vec![Type::scalar(DType::I64)]),
            None => Ok(Vec::new()),
            Some(axis) if axis > 2 => Err(format!("`{}` axis must be 0, 1 or 2, found {axis}", self.name())),
            Some(_) => Ok(vec![Type::scalar(DType::I32)]),
        }
    }
}
