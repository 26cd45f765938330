//! The lowering driver: builds the kernel function, maps every IR value to its
//! per-thread registers and lowers regions op by op (one file per op family).
//!
//! Invariants:
//! - A value of type `T` lowers to `BlockedLayout::with_cap(numel(T), threads, spt_cap).regs()` LLVM
//!   values (its registers); scalars have one, uniform across the program.
//!   The exception are the values `assign.rs` assigns a tensor-core layout
//!   ([`RegLayout::Mma`], [`RegLayout::Row`]): their registers follow that layout, and
//!   those with a user that needs blocked registers also get a blocked copy
//!   right after their definition. [`Lowerer::regs`] always returns blocked
//!   registers; layout-aware lowerings use [`Lowerer::regs_as`].
//! - Register element types: `i1` as `i1`, integers by width, `f16` as `half`,
//!   `bf16` as `bfloat`, pointers as `ptr addrspace(1)`. In memory `i1` is a byte.
//! - Every op that moves data between threads uses the one dynamic shared
//!   memory region, bracketed by barriers; `smem_bytes` is the largest use.
//! - Barriers are only emitted in uniform control flow: `if`/`while`
//!   conditions are scalars, which every thread computes identically.

mod arith;
pub(crate) mod assign;
mod cast;
mod compare;
mod control;
mod convert;
mod creation;
mod dead_rows;
mod debug;
mod dot;
mod entry;
mod memory;
mod partial;
mod pipeline;
pub(crate) mod plan;
mod program;
mod ptx_load;
mod reduce;
mod remat;
mod shape;
mod sync;
mod tma;

pub(crate) use entry::lower_planned;

use crate::blocked::BlockedLayout;
use crate::fragment::RegLayout;
use crate::{CompileOptions, Error, Result};
use dsl_core::dtype::{DType, Elem, Type};
use dsl_core::ir::{Block, Inst, Op, Region};
use dsl_core::{Function, Value};
use inkwell::AddressSpace;
use inkwell::basic_block::BasicBlock;
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::types::{BasicMetadataTypeEnum, BasicType, BasicTypeEnum, FunctionType};
use inkwell::values::{
    BasicMetadataValueEnum, BasicValue, BasicValueEnum, CallSiteValue, FunctionValue, IntValue, PointerValue,
};
use rustc_hash::FxHashMap;

/// Registers of one value.
pub(crate) type Regs<'ctx> = Vec<BasicValueEnum<'ctx>>;

/// The body of [`Lowerer::loop_n`]: (index, carried values) -> next carried values.
pub(crate) type LoopBody<'b, 'a, 'ctx> =
    dyn FnMut(&mut Lowerer<'a, 'ctx>, IntValue<'ctx>, &[BasicValueEnum<'ctx>]) -> Result<Regs<'ctx>> + 'b;

/// The LLVM calling convention number of `ptx_kernel`.
const PTX_KERNEL_CC: u32 = 71;

/// State of one function's lowering.
pub(crate) struct Lowerer<'a, 'ctx> {
    pub ctx: &'ctx Context,
    pub module: &'a Module<'ctx>,
    pub b: Builder<'ctx>,
    pub func: FunctionValue<'ctx>,
    pub f: &'a Function,
    /// Every decision taken before emission (`plan.rs`).
    pub plan: &'a plan::KernelPlan,
    pub vals: FxHashMap<Value, Regs<'ctx>>,
    pub tid: IntValue<'ctx>,
    smem: Option<PointerValue<'ctx>>,
    pub smem_bytes: u32,
    /// The state of the loops being emitted.
    pub loops: LoopState<'ctx>,
    /// Blocked copies of values held in another layout.
    blocked: FxHashMap<Value, Regs<'ctx>>,
    /// Operand registers prepared for the instruction being lowered (in its
    /// result's layout), returned by [`Lowerer::regs`] before anything else.
    overrides: FxHashMap<Value, Regs<'ctx>>,
    /// The compile options (the target selects sm_90-only instructions).
    pub opts: CompileOptions,
    /// The generic addresses (i64) of the hidden tensor-map parameters
    /// (`Pipeline::tensor_maps`).
    pub tmaps: Vec<IntValue<'ctx>>,
}

/// What the emission of the loops being lowered keeps between ops: set up
/// at a loop's entry (its prologue, its hoisted fragments) and dropped at
/// its exit.
#[derive(Default)]
pub(crate) struct LoopState<'ctx> {
    /// Pipelined loops being lowered (from their prologue to their exit).
    pub in_pipeline: usize,
    /// For each pipelined load of the loop being lowered (and each `dot`
    /// whose computed `a` it stages, `PipeLoop::a_stages`): the stage its
    /// `dot` reads this iteration (i32), its ring offset and stage bytes.
    pub pipe_stage: FxHashMap<Inst, (IntValue<'ctx>, u64, u64)>,
    /// The copies of a later iteration that a pipelined loop's iteration
    /// leaves to follow its only tensor-core `dot` (`pipeline::PendingIssue`).
    pub pipe_pending: Option<pipeline::PendingIssue<'ctx>>,
    /// An extra uniform predicate ANDed into every load's mask (the
    /// pipeline's prefetch of an iteration that may not exist).
    pub extra_pred: Option<IntValue<'ctx>>,
    /// Whether the slice being lowered under `extra_pred` predicates its
    /// masked loads instead of branching around them (`memory.rs`): the
    /// slices of `cp.async` loops (a TMA loop's box coordinates keep their
    /// branches, which hold fewer registers there).
    pub predicated_slice: bool,
    /// A fragments of hoisted `dot` operands: per 16-wide `k` step, per m tile, 4 registers.
    pub afrags: FxHashMap<(Value, crate::fragment::MmaLayout), Vec<Vec<Vec<IntValue<'ctx>>>>>,
    /// The same in the permuted `k` order of `dot`s that read their B
    /// fragments from an FP8 ring (`pipeline::FragB`).
    pub afrags_perm: FxHashMap<(Value, crate::fragment::MmaLayout), Vec<Vec<Vec<IntValue<'ctx>>>>>,
    /// Values defined before the loops being lowered, in the layouts their
    /// bodies take them in (`KernelPlan::convert_ahead`).
    pub converted: FxHashMap<(Value, RegLayout), Regs<'ctx>>,
    /// `wgmma` groups committed in the current block and not waited for
    /// yet, oldest first (`dot/wgmma.rs`: the wait comes before the first
    /// use of the result).
    pub wgmma_pending: Vec<dot::PendingWgmma<'ctx>>,
}

/// The register type of an element.
pub(crate) fn reg_type(ctx: &Context, e: Elem) -> BasicTypeEnum<'_> {
    match e {
        Elem::Ptr(_) => ctx.ptr_type(AddressSpace::from(1u16)).into(),
        Elem::Scalar(d) => crate::llvm::scalar_type(ctx, d),
    }
}

/// The in-memory type of an element (`i1` is stored as a byte).
pub(crate) fn mem_type(ctx: &Context, e: Elem) -> BasicTypeEnum<'_> {
    match e {
        Elem::Scalar(DType::I1) => ctx.i8_type().into(),
        other => reg_type(ctx, other),
    }
}

/// Bytes of one element in shared memory.
pub(crate) fn elem_bytes(e: Elem) -> u32 {
    match e {
        Elem::Ptr(_) => 8,
        Elem::Scalar(d) => d.size_bytes() as u32,
    }
}

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    /// An `Unsupported` error for `inst`.
    pub fn unsupported(&self, inst: Inst, why: impl Into<String>) -> Error {
        let d = &self.f.insts[inst];
        Error::Unsupported { target: "GPU", op: d.op.name().to_string(), loc: d.loc.clone(), why: why.into() }
    }

    /// An internal error: the IR broke an invariant the verifier should have caught.
    pub fn bug(&self, inst: Inst, why: impl Into<String>) -> Error {
        let d = &self.f.insts[inst];
        Error::Invalid(format!("{}: `{}`: {}", d.loc, d.op.name(), why.into()))
    }

    /// The layout of values of type `t`.
    pub fn layout(&self, t: &Type) -> BlockedLayout {
        BlockedLayout::with_cap(t.numel(), self.plan.threads, self.plan.spt_cap)
    }

    /// The layout of value `v`.
    pub fn layout_of(&self, v: Value) -> BlockedLayout {
        self.layout(self.f.ty(v))
    }

    /// The blocked registers of `v` (its own, or the blocked copy of a value
    /// held in a tensor-core layout).
    pub fn regs(&self, v: Value) -> Result<Regs<'ctx>> {
        if let Some(r) = self.overrides.get(&v) {
            return Ok(r.clone());
        }
        let lay = self.plan.lays.lay(v);
        let found = if lay == RegLayout::Blocked { self.vals.get(&v) } else { self.blocked.get(&v) };
        found.cloned().ok_or_else(|| {
            if self.vals.contains_key(&v) {
                Error::Invalid(format!("value {v} is held in {lay:?} and has no blocked copy"))
            } else {
                Error::Invalid(format!("value {v} used before its definition"))
            }
        })
    }

    /// The registers of `v` in its assigned layout.
    pub fn raw_regs(&self, v: Value) -> Result<Regs<'ctx>> {
        self.vals
            .get(&v)
            .cloned()
            .ok_or_else(|| Error::Invalid(format!("value {v} used before its definition")))
    }

    /// The registers of `v` in layout `lay`: its own when it is held there,
    /// a splat when it is uniform, otherwise converted from its blocked
    /// registers through shared memory (barriers: uniform control flow only).
    pub fn regs_as(&mut self, v: Value, lay: RegLayout) -> Result<Regs<'ctx>> {
        let cur = self.plan.lays.lay(v);
        if cur == lay {
            return self.raw_regs(v);
        }
        if let Some(r) = self.loops.converted.get(&(v, lay)) {
            return Ok(r.clone());
        }
        let ty = self.f.ty(v).clone();
        if assign::is_uniform(self.f, v) {
            let r = self.raw_regs(v)?[0];
            return Ok(vec![r; self.count(&ty, lay)]);
        }
        // A tile computed from coordinates alone is evaluated in place of
        // an exchange (`remat.rs`).
        if let RegLayout::Mma(l) = lay
            && ty.shape.as_slice() == [l.m, l.n]
            && remat::computable(self.f, v)
        {
            return self.remat_mma(v, &l);
        }
        if let RegLayout::Row(r) = lay
            && matches!(ty.shape.as_slice(), [m] | [m, 1] if *m == r.m)
            && remat::computable(self.f, v)
        {
            return self.remat_row(v, &r);
        }
        let b = self.regs(v)?;
        match lay {
            RegLayout::Blocked => Ok(b),
            _ => self.convert_blocked(&ty, &b, lay, false),
        }
    }

    /// Registers per thread of a value of type `ty` in layout `lay`.
    pub fn count(&self, ty: &Type, lay: RegLayout) -> usize {
        match lay {
            RegLayout::Blocked => self.layout(ty).regs(),
            RegLayout::Mma(l) | RegLayout::MmaT(l) => l.regs(),
            RegLayout::Row(r) => r.regs(),
        }
    }

    /// Records the registers of `v` (in its assigned layout).
    pub fn set(&mut self, v: Value, regs: Regs<'ctx>) {
        self.vals.insert(v, regs);
    }

    /// Makes the blocked copy of `v` when it is held in a tensor-core
    /// layout and some user needs blocked registers (call right after `v`
    /// is defined, in uniform control flow).
    pub(crate) fn materialize_blocked(&mut self, v: Value) -> Result<()> {
        let lay = self.plan.lays.lay(v);
        if lay == RegLayout::Blocked || !self.plan.lays.needs_blocked.contains(&v) {
            return Ok(());
        }
        let ty = self.f.ty(v).clone();
        let raw = self.raw_regs(v)?;
        let b = self.convert_blocked(&ty, &raw, lay, true)?;
        self.blocked.insert(v, b);
        Ok(())
    }

    /// The integer type of `bits` bits (1, 8, 16, 32, 64 or 128; others round up to 128).
    pub fn int_ty(&self, bits: u32) -> inkwell::types::IntType<'ctx> {
        match bits {
            1 => self.ctx.bool_type(),
            2..=8 => self.ctx.i8_type(),
            9..=16 => self.ctx.i16_type(),
            17..=32 => self.ctx.i32_type(),
            33..=64 => self.ctx.i64_type(),
            _ => self.ctx.i128_type(),
        }
    }

    /// The i32 constant `v`.
    pub fn i32c(&self, v: i64) -> IntValue<'ctx> {
        self.ctx.i32_type().const_int(v as u64, true)
    }

    /// Calls (declaring on first use) the function or intrinsic `name`.
    pub fn call(
        &self,
        name: &str,
        ret: Option<BasicTypeEnum<'ctx>>,
        args: &[BasicValueEnum<'ctx>],
    ) -> Result<Option<BasicValueEnum<'ctx>>> {
        let fv = match self.module.get_function(name) {
            Some(fv) => fv,
            None => self.module.add_function(name, self.fn_type(ret, args), Some(Linkage::External)),
        };
        let margs: Vec<BasicMetadataValueEnum<'ctx>> = args.iter().map(|&a| a.into()).collect();
        Ok(self.b.build_call(fv, &margs, "")?.try_as_basic_value().basic())
    }

    /// The type of a function of `args` returning `ret` (or nothing).
    fn fn_type(&self, ret: Option<BasicTypeEnum<'ctx>>, args: &[BasicValueEnum<'ctx>]) -> FunctionType<'ctx> {
        let ps: Vec<BasicMetadataTypeEnum<'ctx>> = args.iter().map(|a| a.get_type().into()).collect();
        match ret {
            Some(r) => r.fn_type(&ps, false),
            None => self.ctx.void_type().fn_type(&ps, false),
        }
    }

    /// Calls an intrinsic that returns a value.
    pub fn call1(
        &self,
        name: &str,
        ret: BasicTypeEnum<'ctx>,
        args: &[BasicValueEnum<'ctx>],
    ) -> Result<BasicValueEnum<'ctx>> {
        self.call(name, Some(ret), args)?.ok_or_else(|| Error::Llvm(format!("`{name}` returned no value")))
    }

    /// Emits one PTX statement as inline assembly (for forms LLVM's NVPTX
    /// intrinsics lack, such as cache and prefetch hints): `asm` with its
    /// operands `$0..` and `constraints` in LLVM's syntax. It has side
    /// effects, so it is never removed.
    pub fn asm(&self, asm: &str, constraints: &str, args: &[BasicValueEnum<'ctx>]) -> Result<()> {
        self.call_asm(self.fn_type(None, args), asm, constraints, true, args)?;
        Ok(())
    }

    /// [`Lowerer::asm`] returning a value of type `ret` (a struct for several
    /// outputs), with side effects chosen by `side_effects` (a statement
    /// with results and side effects is never removed or reordered with
    /// other such statements: volatile loads, `wgmma`'s tied fences).
    pub fn asm_value(
        &self,
        asm: &str,
        constraints: &str,
        ret: BasicTypeEnum<'ctx>,
        args: &[BasicValueEnum<'ctx>],
        side_effects: bool,
    ) -> Result<BasicValueEnum<'ctx>> {
        let cs = self.call_asm(self.fn_type(Some(ret), args), asm, constraints, side_effects, args)?;
        cs.try_as_basic_value().basic().ok_or_else(|| Error::Llvm(format!("`{asm}` returned no value")))
    }

    /// Calls the inline assembly `asm` (of function type `ty`) on `args`.
    fn call_asm(
        &self,
        ty: FunctionType<'ctx>,
        asm: &str,
        constraints: &str,
        side_effects: bool,
        args: &[BasicValueEnum<'ctx>],
    ) -> Result<CallSiteValue<'ctx>> {
        let f = self.ctx.create_inline_asm(
            ty,
            asm.to_string(),
            constraints.to_string(),
            side_effects,
            false,
            None,
            false,
        );
        let margs: Vec<BasicMetadataValueEnum<'ctx>> = args.iter().map(|&a| a.into()).collect();
        Ok(self.b.build_indirect_call(ty, f, &margs, "")?)
    }

    /// Reads a 32-bit special register through its NVVM intrinsic.
    pub fn sreg(&self, name: &str) -> Result<IntValue<'ctx>> {
        Ok(self.call1(name, self.ctx.i32_type().into(), &[])?.into_int_value())
    }

    /// A CTA-wide barrier (`bar.sync 0`).
    pub fn barrier(&self) -> Result<()> {
        self.call("llvm.nvvm.barrier.cta.sync.aligned.all", None, &[self.i32c(0).into()])?;
        Ok(())
    }

    /// `(tid mod nchunks) * spt`: the per-thread base of linear indices of `l`.
    pub fn thread_base(&self, l: &BlockedLayout) -> Result<IntValue<'ctx>> {
        let m = (l.nchunks().min(l.threads) - 1) as i64;
        let t = if m == 0 { self.i32c(0) } else { self.b.build_and(self.tid, self.i32c(m), "")? };
        Ok(if l.spt > 1 { self.b.build_int_mul(t, self.i32c(l.spt as i64), "")? } else { t })
    }

    /// The linear index (i32) of register `slot` of layout `l`, given its thread base.
    pub fn linear_index(
        &self,
        l: &BlockedLayout,
        base: IntValue<'ctx>,
        slot: usize,
    ) -> Result<IntValue<'ctx>> {
        let off = l.slot_offset(slot) as i64;
        Ok(if off == 0 { base } else { self.b.build_int_add(base, self.i32c(off), "")? })
    }

    /// `tid < nchunks` when `l` is replicated (only owners may have side effects).
    pub fn owner_pred(&self, l: &BlockedLayout) -> Result<Option<IntValue<'ctx>>> {
        if !l.replicated() {
            return Ok(None);
        }
        let n = self.i32c(l.nchunks() as i64);
        Ok(Some(self.b.build_int_compare(inkwell::IntPredicate::ULT, self.tid, n, "owner")?))
    }

    /// The scratch region of shared memory for a use of `bytes` (above the
    /// pipeline rings while a pipelined loop runs, from the bottom elsewhere),
    /// declaring the dynamic shared memory array on first use.
    pub fn smem(&mut self, bytes: u64) -> Result<PointerValue<'ctx>> {
        let floor =
            if self.loops.in_pipeline > 0 { self.plan.smem_floor } else { self.plan.pipe.resident_bytes };
        let total = u32::try_from(floor + bytes)
            .map_err(|_| Error::Invalid(format!("shared memory use of {bytes} bytes is too large")))?;
        self.smem_bytes = self.smem_bytes.max(total);
        self.smem_at(floor)
    }

    /// Byte `off` of the dynamic shared memory array.
    pub fn smem_at(&mut self, off: u64) -> Result<PointerValue<'ctx>> {
        let base = self.smem_raw()?;
        if off == 0 {
            return Ok(base);
        }
        let o = self.ctx.i32_type().const_int(off, false);
        // SAFETY: `off` lies inside the array, whose size covers the resident
        // operands and the rings (`smem_raw`) and every scratch use (`smem`).
        Ok(unsafe { self.b.build_in_bounds_gep(self.ctx.i8_type(), base, &[o], "")? })
    }

    /// The bottom of the dynamic shared memory array (declared on first use;
    /// it always covers the resident operands and the pipeline rings).
    pub fn smem_raw(&mut self) -> Result<PointerValue<'ctx>> {
        let ring = u32::try_from(self.plan.smem_floor).map_err(|_| {
            Error::Invalid(format!("pipeline rings of {} bytes are too large", self.plan.smem_floor))
        })?;
        self.smem_bytes = self.smem_bytes.max(ring);
        if let Some(p) = self.smem {
            return Ok(p);
        }
        let ty = self.ctx.i8_type().array_type(0);
        let g = self.module.add_global(ty, Some(AddressSpace::from(3u16)), "__tessera_smem");
        g.set_linkage(Linkage::External);
        // `wgmma` operands are 1024-byte swizzle atoms, and swizzled rings
        // may start 1024-byte aligned (`pipeline/`).
        let swizzled = self.plan.pipe.loops.values().any(|pl| {
            pl.loads.iter().any(|l| l.ring_off.is_multiple_of(1024) && pipeline::swizzled(l.units()))
        });
        g.set_alignment(if self.plan.pipe.wgmma.is_empty() && !swizzled { 16 } else { 1024 });
        let p = g.as_pointer_value();
        self.smem = Some(p);
        Ok(p)
    }

    /// The address of element `idx` of type `ty` in a shared memory array at byte `offset`.
    pub fn smem_elem(
        &self,
        base: PointerValue<'ctx>,
        offset: u64,
        ty: BasicTypeEnum<'ctx>,
        idx: IntValue<'ctx>,
    ) -> Result<PointerValue<'ctx>> {
        let i8t = self.ctx.i8_type();
        // SAFETY: the offsets stay inside the dynamic shared memory array, whose
        // size (`smem_bytes`) covers every use; GEP itself only computes an address.
        unsafe {
            let arr = if offset == 0 {
                base
            } else {
                let o = self.ctx.i32_type().const_int(offset, false);
                self.b.build_in_bounds_gep(i8t, base, &[o], "")?
            };
            Ok(self.b.build_in_bounds_gep(ty, arr, &[idx], "")?)
        }
    }

    /// Runs `body` only where `cond` holds (no results).
    pub fn if_then(
        &mut self,
        cond: IntValue<'ctx>,
        body: impl FnOnce(&mut Self) -> Result<()>,
    ) -> Result<()> {
        let then_bb = self.ctx.append_basic_block(self.func, "then");
        let cont = self.ctx.append_basic_block(self.func, "cont");
        self.b.build_conditional_branch(cond, then_bb, cont)?;
        self.b.position_at_end(then_bb);
        body(self)?;
        self.b.build_unconditional_branch(cont)?;
        self.b.position_at_end(cont);
        Ok(())
    }

    /// `cond ? body() : other` where `body` (e.g. a load) runs only when `cond` holds.
    pub fn guarded(
        &mut self,
        cond: IntValue<'ctx>,
        body: impl FnOnce(&mut Self) -> Result<Vec<BasicValueEnum<'ctx>>>,
        other: &[BasicValueEnum<'ctx>],
    ) -> Result<Vec<BasicValueEnum<'ctx>>> {
        let start = self.cur_block()?;
        let then_bb = self.ctx.append_basic_block(self.func, "guard");
        let cont = self.ctx.append_basic_block(self.func, "join");
        self.b.build_conditional_branch(cond, then_bb, cont)?;
        self.b.position_at_end(then_bb);
        let vals = body(self)?;
        let then_end = self.cur_block()?;
        self.b.build_unconditional_branch(cont)?;
        self.b.position_at_end(cont);
        let mut out = Vec::with_capacity(vals.len());
        for (v, o) in vals.iter().zip(other) {
            let phi = self.b.build_phi(v.get_type(), "")?;
            phi.add_incoming(&[(v as &dyn BasicValue<'ctx>, then_end), (o as &dyn BasicValue<'ctx>, start)]);
            out.push(phi.as_basic_value());
        }
        Ok(out)
    }

    /// The block the builder is positioned in.
    pub fn cur_block(&self) -> Result<BasicBlock<'ctx>> {
        self.b.get_insert_block().ok_or_else(|| Error::Llvm("builder is not positioned".into()))
    }

    /// Starts a loop: appends its head, body and exit blocks (named
    /// `names`), branches from the current block to the head and moves
    /// there. Returns the block it came from (the head's entry edge) and the
    /// three blocks.
    pub(crate) fn enter_loop(&self, names: [&str; 3]) -> Result<(BasicBlock<'ctx>, [BasicBlock<'ctx>; 3])> {
        let pre = self.cur_block()?;
        let blocks = names.map(|n| self.ctx.append_basic_block(self.func, n));
        self.b.build_unconditional_branch(blocks[0])?;
        self.b.position_at_end(blocks[0]);
        Ok((pre, blocks))
    }

    /// A runtime loop `for i in 0..count` (an i32, possibly zero) carrying
    /// `init`; `body` maps the index and the current carried values to the
    /// next ones. Returns the final carried values.
    pub fn loop_n(
        &mut self,
        count: IntValue<'ctx>,
        init: Vec<BasicValueEnum<'ctx>>,
        body: &mut LoopBody<'_, 'a, 'ctx>,
    ) -> Result<Vec<BasicValueEnum<'ctx>>> {
        let (pre, [head, bb, exit]) = self.enter_loop(["loop", "loop.body", "loop.exit"])?;
        let i32t = self.ctx.i32_type();
        let iv = self.b.build_phi(i32t, "k")?;
        iv.add_incoming(&[(&i32t.const_zero(), pre)]);
        let mut phis = Vec::new();
        for v in &init {
            let p = self.b.build_phi(v.get_type(), "")?;
            p.add_incoming(&[(v as &dyn BasicValue<'ctx>, pre)]);
            phis.push(p);
        }
        let ivv = iv.as_basic_value().into_int_value();
        let c = self.b.build_int_compare(inkwell::IntPredicate::SLT, ivv, count, "")?;
        self.b.build_conditional_branch(c, bb, exit)?;
        self.b.position_at_end(bb);
        let cur: Vec<BasicValueEnum<'ctx>> = phis.iter().map(|p| p.as_basic_value()).collect();
        let next = body(self, ivv, &cur)?;
        let ivn = self.b.build_int_add(ivv, i32t.const_int(1, false), "")?;
        let latch = self.cur_block()?;
        iv.add_incoming(&[(&ivn, latch)]);
        for (p, v) in phis.iter().zip(&next) {
            p.add_incoming(&[(v as &dyn BasicValue<'ctx>, latch)]);
        }
        self.b.build_unconditional_branch(head)?;
        self.b.position_at_end(exit);
        Ok(cur)
    }

    /// Lowers the instructions of `block`; returns the operands of its terminator.
    pub fn lower_block(&mut self, block: Block) -> Result<Vec<Value>> {
        // `wgmma` groups never stay pending across a block boundary.
        let outer = std::mem::take(&mut self.loops.wgmma_pending);
        let insts = self.f.blocks[block].insts.clone();
        let mut carried = self.carried_products(block);
        let mut term = None;
        for inst in insts {
            self.wgmma_wait_for(inst)?;
            self.wgmma_tie_carried(inst, &mut carried)?;
            let op = &self.f.insts[inst].op;
            if op.is_terminator() {
                term = Some(self.f.insts[inst].args.to_vec());
                break;
            }
            self.lower_inst(inst)?;
            // A `wgmma` operand that resides in shared memory is
            // written there once, right after its definition.
            if let Some(&r) = self.f.insts[inst].results.first()
                && (self.plan.pipe.resident.contains_key(&r) || self.plan.pipe.mma_resident.contains_key(&r))
            {
                self.make_resident(r)?;
            }
        }
        self.wgmma_wait_all()?;
        self.loops.wgmma_pending = outer;
        Ok(term.unwrap_or_default())
    }

    /// Lowers the single block of region `r`, binding its arguments to `args`
    /// (registers in the arguments' assigned layouts); returns the yielded
    /// registers in blocked layout.
    pub fn lower_region(&mut self, r: Region, args: &[Regs<'ctx>]) -> Result<Vec<Regs<'ctx>>> {
        self.lower_region_as(r, args, &[])
    }

    /// [`Lowerer::lower_region`] with the yielded values in layouts `want`
    /// (blocked past its end).
    pub fn lower_region_as(
        &mut self,
        r: Region,
        args: &[Regs<'ctx>],
        want: &[RegLayout],
    ) -> Result<Vec<Regs<'ctx>>> {
        let block = self.f.entry(r);
        let bargs = self.f.blocks[block].args.clone();
        for (v, regs) in bargs.iter().zip(args) {
            self.set(*v, regs.clone());
            self.materialize_blocked(*v)?;
        }
        let term = self.lower_block(block)?;
        term.iter()
            .enumerate()
            .map(|(k, &v)| self.regs_as(v, want.get(k).copied().unwrap_or(RegLayout::Blocked)))
            .collect()
    }

    /// Lowers one instruction, then makes the blocked copies its results need.
    fn lower_inst(&mut self, inst: Inst) -> Result<()> {
        if self.plan.pipe.regs.contains(&inst) {
            // A pipelined load read back from its stage into registers.
            return self.pipe_read(inst);
        }
        if self.plan.mma.skipped.contains(&inst)
            || self.plan.pipe.loads.contains(&inst)
            || self.plan.pipe.dead.contains(&inst)
            || self.plan.pipe.frag_chain.contains(&inst)
        {
            // A transpose that its only user (a tensor-core `dot`) reads in
            // place, a load the pipeline copies asynchronously, an address
            // computation only such loads used, or the math forming a B
            // operand that its `dot` lowers on the fragments
            // (`pipeline::FragB`).
            return Ok(());
        }
        let op = self.f.insts[inst].op.clone();
        let drops_dead = assign::is_elementwise(&op) || matches!(op, Op::Shape(_));
        if assign::is_elementwise(&op)
            && let Some(&res) = self.f.insts[inst].results.first()
            && self.plan.lays.lay(res) != RegLayout::Blocked
        {
            // Compute in the result's layout: operands are brought there first.
            let lay = self.plan.lays.lay(res);
            for a in self.args(inst) {
                let r = self.regs_as(a, lay)?;
                self.overrides.insert(a, r);
            }
            let done = self.lower_op(inst, op);
            self.overrides.clear();
            done?;
        } else {
            self.lower_op(inst, op)?;
        }
        if drops_dead {
            self.drop_dead_slots(inst)?;
        }
        let f = self.f;
        for &r in &f.insts[inst].results {
            // A pending `wgmma` result is copied once it has been waited for.
            if !self.loops.wgmma_pending.iter().any(|p| p.value == r) {
                self.materialize_blocked(r)?;
            }
        }
        Ok(())
    }

    /// Leaves the dead register slots of `inst`'s results undefined
    /// (`dead_rows.rs`): nothing reads them, so LLVM drops what computed them.
    fn drop_dead_slots(&mut self, inst: Inst) -> Result<()> {
        let f = self.f;
        for &r in &f.insts[inst].results {
            let Some(dead) = self.plan.dead.slots.get(&r) else { continue };
            if self.loops.wgmma_pending.iter().any(|p| p.value == r) {
                continue;
            }
            let mut regs = self.raw_regs(r)?;
            if regs.len() != dead.len() {
                continue;
            }
            for (reg, &d) in regs.iter_mut().zip(dead) {
                if d {
                    *reg = undef_like(*reg);
                }
            }
            self.set(r, regs);
        }
        Ok(())
    }

    /// Dispatches one instruction to its op family's lowering.
    fn lower_op(&mut self, inst: Inst, op: Op) -> Result<()> {
        match op {
            Op::Creation(o) => self.lower_creation(inst, &o),
            Op::Arith(o) => self.lower_arith(inst, o),
            Op::Compare(o) => self.lower_compare(inst, o),
            Op::Cast(o) => self.lower_cast(inst, o),
            Op::Memory(o) => self.lower_memory(inst, &o),
            Op::Reduce(o) => self.lower_reduce(inst, o),
            Op::Scan(o) => self.lower_scan(inst, o),
            Op::Shape(o) => self.lower_shape(inst, &o),
            Op::Dot(o) => self.lower_dot(inst, o),
            Op::Control(o) => self.lower_control(inst, o),
            Op::Program(o) => self.lower_program(inst, o),
            Op::Hint(_) => {
                // Hints only feed the axis analysis: the result is the operand.
                let d = &self.f.insts[inst];
                let regs = self.regs(d.args[0])?;
                self.set(d.results[0], regs);
                Ok(())
            }
            Op::Debug(o) => self.lower_debug(inst, &o),
        }
    }

    /// Operands of `inst`.
    pub fn args(&self, inst: Inst) -> Vec<Value> {
        self.f.insts[inst].args.to_vec()
    }

    /// Result `i` of `inst`.
    pub fn result(&self, inst: Inst, i: usize) -> Result<Value> {
        self.f.insts[inst]
            .results
            .get(i)
            .copied()
            .ok_or_else(|| self.bug(inst, format!("missing result {i}")))
    }
}

/// An undefined value of `v`'s type.
fn undef_like(v: BasicValueEnum<'_>) -> BasicValueEnum<'_> {
    match v {
        BasicValueEnum::IntValue(x) => x.get_type().get_undef().into(),
        BasicValueEnum::FloatValue(x) => x.get_type().get_undef().into(),
        BasicValueEnum::PointerValue(x) => x.get_type().get_undef().into(),
        BasicValueEnum::VectorValue(x) => x.get_type().get_undef().into(),
        other => other,
    }
}
