//! Lowering of the tile IR to LLVM IR for the host CPU: one function runs
//! one program.
//!
//! Entry ABI: `i32 @<symbol>(ptr args, i32 pid0, i32 pid1, i32 pid2, i32
//! grid0, i32 grid1, i32 grid2)`. `args` holds one 64-bit slot per kernel
//! parameter: a pointer's address, an integer's bits (zero-extended), an
//! f32/f16/bf16 scalar's f32 bits, an f64's bits. The function returns 0,
//! or `k + 1` when it stopped at runtime error site `k` of
//! [`Lowered::errors`] (a failed `device_assert`, a `for` step that is not
//! positive).
//!
//! The driver walks each block in program order (`mod.rs`): rank-0 ops are
//! emitted where they stand; tiles follow the storage plan (`super::plan`):
//! inline tiles emit nothing where they are defined and are computed by the
//! roots that use them (`eval.rs`), arrays are written where they are
//! defined. One file per op family does the rest (`arith.rs`, `cast.rs`,
//! `memory.rs`, `reduce.rs`, `scan.rs`, `dot.rs`, `control.rs`, `debug.rs`),
//! plus `types.rs` (types, arrays, loops) and `math.rs` (rounding and the
//! math library).
//!
//! Invariant: every value an op produces agrees with the interpreter's
//! (`dsl_core::interp`) bit for bit where the interpreter is exact, with the
//! same rounding points; an op (or operand type) without a lowering is an
//! `Unsupported` error naming it, never silently different code.

mod arith;
mod cast;
mod combine;
mod control;
mod debug;
mod dot;
mod eval;
mod math;
mod memory;
mod reduce;
mod scan;
mod types;

use super::plan::{Plan, Storage};
use super::target::HostTarget;
use crate::{Error, Result};
use dsl_core::Location;
use dsl_core::ir::ops::{ControlOp, MemoryOp, ProgramOp, ReduceKind, ScanKind};
use dsl_core::ir::{Block, EntityRef, Function, Inst, Op, Value};
use dsl_core::passes::axis::AxisAnalysis;
use dsl_core::{DType, Elem};
use inkwell::AddressSpace;
use inkwell::basic_block::BasicBlock;
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::values::{BasicValueEnum, FunctionValue, IntValue, PointerValue};
use rustc_hash::FxHashMap;

/// Where a value is, while its block is being lowered.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Repr<'ctx> {
    /// A rank-0 value.
    Scalar(BasicValueEnum<'ctx>),
    /// A materialized tile: its stack array.
    Array(PointerValue<'ctx>),
    /// A tile computed where it is used.
    Inline,
}

/// A runtime error the compiled function can stop with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorSite {
    /// The op's mnemonic.
    pub op: String,
    /// What went wrong.
    pub message: String,
    /// The op's source location.
    pub loc: Location,
}

/// What lowering produced besides the LLVM function.
#[derive(Clone, Debug, Default)]
pub struct Lowered {
    /// Runtime error sites, by code - 1.
    pub errors: Vec<ErrorSite>,
    /// Bytes of stack arrays the function allocates (an upper bound of its
    /// frame beyond LLVM's own spills).
    pub frame_bytes: u64,
}

/// The state of one lowering.
pub(crate) struct Lower<'ctx, 'a> {
    ctx: &'ctx Context,
    module: &'a Module<'ctx>,
    b: Builder<'ctx>,
    f: &'a Function,
    plan: &'a Plan,
    axis: &'a AxisAnalysis,
    target: &'a HostTarget,
    /// Lanes of a strip.
    lanes: u32,
    func: FunctionValue<'ctx>,
    /// The entry block holding every `alloca`.
    allocas: BasicBlock<'ctx>,
    vals: Vec<Option<Repr<'ctx>>>,
    /// Inline values already computed in the current strip.
    memo: FxHashMap<eval::MemoKey, BasicValueEnum<'ctx>>,
    pid: [IntValue<'ctx>; 3],
    grid: [IntValue<'ctx>; 3],
    errors: Vec<ErrorSite>,
    frame_bytes: u64,
}

/// Lowers `f` into `module` as the function `symbol`.
pub(crate) fn lower_function<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    f: &Function,
    plan: &Plan,
    axis: &AxisAnalysis,
    target: &HostTarget,
    symbol: &str,
) -> Result<Lowered> {
    let i32t = ctx.i32_type();
    let ptr = ctx.ptr_type(AddressSpace::default());
    let fty = i32t.fn_type(
        &[ptr.into(), i32t.into(), i32t.into(), i32t.into(), i32t.into(), i32t.into(), i32t.into()],
        false,
    );
    let func = module.add_function(symbol, fty, Some(Linkage::External));
    // Large stack frames probe each page, so a frame beyond the stack ends
    // on the guard page instead of past it.
    let probe = ctx.create_string_attribute("probe-stack", "inline-asm");
    func.add_attribute(inkwell::attributes::AttributeLoc::Function, probe);
    let allocas = ctx.append_basic_block(func, "allocas");
    let start = ctx.append_basic_block(func, "start");
    let b = ctx.create_builder();
    b.position_at_end(allocas);
    b.build_unconditional_branch(start)?;
    b.position_at_end(start);
    let p = |k: u32| func.get_nth_param(k).map(|v| v.into_int_value());
    let (Some(p0), Some(p1), Some(p2), Some(g0), Some(g1), Some(g2)) = (p(1), p(2), p(3), p(4), p(5), p(6))
    else {
        return Err(Error::Llvm("the host entry has too few parameters".into()));
    };
    let mut l = Lower {
        ctx,
        module,
        b,
        f,
        plan,
        axis,
        target,
        lanes: target.strip_lanes(),
        func,
        allocas,
        vals: vec![None; f.values.len()],
        memo: FxHashMap::default(),
        pid: [p0, p1, p2],
        grid: [g0, g1, g2],
        errors: Vec::new(),
        frame_bytes: 0,
    };
    l.params()?;
    l.block(f.body_block())?;
    l.b.build_return(Some(&i32t.const_zero()))?;
    Ok(Lowered { errors: l.errors, frame_bytes: l.frame_bytes })
}

impl<'ctx> Lower<'ctx, '_> {
    /// Binds the kernel parameters from the argument slots.
    fn params(&mut self) -> Result<()> {
        let args = self
            .func
            .get_nth_param(0)
            .map(|v| v.into_pointer_value())
            .ok_or_else(|| Error::Llvm("the host entry has no argument pointer".into()))?;
        let i64t = self.ctx.i64_type();
        for (k, p) in self.f.params.iter().enumerate() {
            let slot = self.elem_ptr(i64t.into(), args, self.c32(k as i64))?;
            let raw = self.b.build_load(i64t, slot, "")?.into_int_value();
            types::set_align(raw.into(), 8);
            let ty = self.f.ty(p.value);
            let v: BasicValueEnum<'ctx> = match ty.elem {
                Elem::Ptr(_) | Elem::Scalar(DType::I64) => raw.into(),
                Elem::Scalar(DType::F64) => self.b.build_bit_cast(raw, self.ctx.f64_type(), "")?,
                Elem::Scalar(DType::F32 | DType::F16 | DType::BF16) => {
                    let w = self.b.build_int_truncate(raw, self.i32t(), "")?;
                    self.b.build_bit_cast(w, self.ctx.f32_type(), "")?
                }
                Elem::Scalar(d) => {
                    let t = self.reg_elem(Elem::Scalar(d)).into_int_type();
                    self.b.build_int_truncate(raw, t, "")?.into()
                }
            };
            self.set(p.value, Repr::Scalar(v));
        }
        Ok(())
    }

    /// Records where `v` is.
    fn set(&mut self, v: Value, r: Repr<'ctx>) {
        if let Some(slot) = self.vals.get_mut(v.index()) {
            *slot = Some(r);
        }
    }

    /// Where `v` is (an internal error when it was never bound).
    fn get(&self, v: Value) -> Result<Repr<'ctx>> {
        self.vals
            .get(v.index())
            .copied()
            .flatten()
            .ok_or_else(|| Error::Llvm(format!("host lowering: {v} is used before it is bound")))
    }

    /// The scalar `v` is.
    fn scalar(&self, v: Value) -> Result<BasicValueEnum<'ctx>> {
        match self.get(v)? {
            Repr::Scalar(s) => Ok(s),
            other => Err(Error::Llvm(format!("host lowering: {v} is {other:?}, not a scalar"))),
        }
    }

    /// An `Unsupported` error for instruction `i`.
    fn unsupported(&self, i: Inst, why: impl Into<String>) -> Error {
        let d = &self.f.insts[i];
        Error::Unsupported {
            target: "host",
            op: d.op.name().to_string(),
            loc: d.loc.clone(),
            why: why.into(),
        }
    }

    /// Registers a runtime error site of instruction `i`; returns its code.
    fn error_site(&mut self, i: Inst, message: String) -> u32 {
        let d = &self.f.insts[i];
        self.errors.push(ErrorSite { op: d.op.name().to_string(), message, loc: d.loc.clone() });
        self.errors.len() as u32
    }

    /// Returns `code` from the function when `cond` (an `i1`) is true.
    fn fail_if(&mut self, cond: IntValue<'ctx>, code: u32) -> Result<()> {
        let fail = self.ctx.append_basic_block(self.func, "fail");
        let ok = self.ctx.append_basic_block(self.func, "ok");
        self.b.build_conditional_branch(cond, fail, ok)?;
        self.b.position_at_end(fail);
        self.b.build_return(Some(&self.i32t().const_int(u64::from(code), false)))?;
        self.b.position_at_end(ok);
        Ok(())
    }

    /// Lowers the instructions of block `b` up to its terminator, which is
    /// returned (not lowered: its owner writes the yielded values).
    fn block(&mut self, b: Block) -> Result<Option<Inst>> {
        let f = self.f;
        for &i in &f.blocks[b].insts {
            if f.insts[i].op.is_terminator() {
                return Ok(Some(i));
            }
            self.inst(i)?;
        }
        Ok(None)
    }

    /// Lowers one non-terminator instruction.
    fn inst(&mut self, i: Inst) -> Result<()> {
        let f = self.f;
        let d = &f.insts[i];
        match &d.op {
            Op::Control(ControlOp::For) => return self.lower_for(i),
            Op::Control(ControlOp::If) => return self.lower_if(i),
            Op::Control(ControlOp::While) => return self.lower_while(i),
            Op::Control(_) => return Err(self.unsupported(i, "a terminator in the middle of a block")),
            // The pool runs programs to completion in any order, so a program
            // waiting on another could wait forever; ordered loads and stores
            // exist for such hand-overs.
            Op::Memory(MemoryOp::WaitUntil { .. } | MemoryOp::WaitLoad { .. }) => {
                return Err(
                    self.unsupported(i, "programs that wait on each other (the interpreter runs them)")
                );
            }
            Op::Memory(MemoryOp::Load { order: Some(_), .. } | MemoryOp::Store { order: Some(_), .. }) => {
                return Err(
                    self.unsupported(i, "acquire/release loads and stores (the interpreter runs them)")
                );
            }
            // A cache hint with no effect on results.
            Op::Memory(MemoryOp::PrefetchL2 { .. }) => return self.lower_prefetch(i),
            _ => {}
        }
        if !d.results.is_empty() && d.results.iter().all(|&r| self.plan.storage(r) == Storage::Inline) {
            for &r in &d.results {
                self.set(r, Repr::Inline);
            }
            return Ok(());
        }
        match &d.op {
            Op::Memory(MemoryOp::Store { .. }) => self.lower_store(i),
            Op::Memory(MemoryOp::Atomic { .. } | MemoryOp::AtomicCas { .. }) => self.lower_atomic(i),
            Op::Memory(MemoryOp::LoadBlock { .. }) => {
                Err(self.unsupported(i, "block loads are expanded before lowering"))
            }
            Op::Reduce(r) if r.kind == ReduceKind::Custom => self.lower_custom_reduce(i, r.axis),
            Op::Reduce(r) => self.lower_reduce(i, *r),
            Op::Scan(s) if s.kind == ScanKind::Custom => self.lower_custom_scan(i, s.axis, s.reverse),
            Op::Scan(s) => self.lower_scan(i, *s),
            Op::Dot(_) => self.lower_dot(i),
            Op::Debug(_) => self.lower_debug(i),
            Op::Program(p) => self.lower_program(i, *p),
            _ => {
                if d.results.iter().all(|&r| f.ty(r).rank() == 0) {
                    self.lower_scalar(i)
                } else {
                    self.materialize(i)
                }
            }
        }
    }

    /// `program_id`, `num_programs` and the dependency-control ops (no-ops:
    /// a launch never overlaps its predecessor on the host).
    fn lower_program(&mut self, i: Inst, p: ProgramOp) -> Result<()> {
        let r = match p {
            ProgramOp::ProgramId { axis } => self.pid[usize::from(axis.min(2))],
            ProgramOp::NumPrograms { axis } => self.grid[usize::from(axis.min(2))],
            // One thread runs a program's operations in order.
            ProgramOp::GdcWait | ProgramOp::GdcLaunchDependents | ProgramOp::Barrier => return Ok(()),
            ProgramOp::GlobalTimer => {
                return Err(
                    self.unsupported(i, "globaltimer (the GPU and the interpreter time persistent kernels)")
                );
            }
        };
        let v = self.f.insts[i].results[0];
        self.set(v, Repr::Scalar(r.into()));
        Ok(())
    }

    /// A pure op on rank-0 values (and a rank-0 load).
    fn lower_scalar(&mut self, i: Inst) -> Result<()> {
        let f = self.f;
        let d = &f.insts[i];
        let outs = match &d.op {
            Op::Creation(
                dsl_core::ir::ops::CreationOp::Const(s)
                | dsl_core::ir::ops::CreationOp::Full { value: s, .. },
            ) => {
                vec![self.constant(*s, None)?]
            }
            Op::Memory(op @ MemoryOp::Load { volatile, .. }) => {
                let args: Vec<BasicValueEnum<'ctx>> =
                    d.args.iter().map(|&a| self.scalar(a)).collect::<Result<_>>()?;
                let ops = op.load_operands(&args).ok_or_else(|| self.unsupported(i, "load operands"))?;
                let ptr = self.splat(ops.ptr, 1)?;
                let mask = ops.mask.map(|m| self.splat(m, 1)).transpose()?;
                let other = ops.other.map(|o| self.splat(o, 1)).transpose()?;
                let elem = Elem::Scalar(f.ty(d.args[0]).dtype());
                let v = self.load_lanes(i, elem, 1, ptr, mask, other, memory::Access::Gather, *volatile)?;
                vec![self.lane(v, 0)?]
            }
            _ => {
                let args: Vec<BasicValueEnum<'ctx>> =
                    d.args.iter().map(|&a| self.scalar(a)).collect::<Result<_>>()?;
                self.elementwise(i, &args)?
            }
        };
        for (&r, v) in d.results.iter().zip(outs) {
            self.set(r, Repr::Scalar(v));
        }
        Ok(())
    }

    /// A tile result (of a pure op or a load) stored in its array where it
    /// is defined.
    fn materialize(&mut self, i: Inst) -> Result<()> {
        let f = self.f;
        let d = &f.insts[i];
        let mut arrays = Vec::new();
        for &r in &d.results {
            let t = f.ty(r);
            let arr = self.alloc_array(t.elem, t.numel())?;
            arrays.push(arr);
        }
        let ty = f.ty(d.results[0]).clone();
        let n = ty.numel();
        let lanes = self.lanes.min(n as u32).max(1);
        let results = d.results.clone();
        self.emit_strips(n, lanes, |l, base| {
            l.memo.clear();
            let idx = eval::Idx::affine(base, lanes);
            for (k, (&r, &arr)) in results.iter().zip(&arrays).enumerate() {
                let v = l.eval_inst(i, k, &idx)?;
                l.store_strip(f.ty(r).elem, arr, base, v)?;
            }
            Ok(())
        })?;
        self.memo.clear();
        for (&r, arr) in results.iter().zip(arrays) {
            self.set(r, Repr::Array(arr));
        }
        Ok(())
    }
}
