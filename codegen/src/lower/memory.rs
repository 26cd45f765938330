//! Loads, stores and atomics in global memory.
//!
//! Vectorization: a thread's chunk of `spt` consecutive elements is accessed
//! with LLVM vector loads/stores of `w` elements (at most 16 bytes) when the
//! axis analysis proves the pointers contiguous and aligned along the last
//! dimension and the mask constant over `w` lanes (`masked_vector_width`);
//! otherwise element by element. Masked-off lanes never touch memory: the
//! access is branched around and loads yield `other` (zero without it).
//!
//! Replication: where a layout holds replicas (fewer chunks than threads, and
//! every scalar), only owner threads store or perform atomics; atomic results
//! are sent from owners to replicas through shared memory.
//!
//! A load with a cache modifier or eviction policy is inline PTX with those
//! qualifiers (`ptx_load.rs`); `volatile` loads are volatile. A load in a
//! row layout (`assign::pulled_row`) reads the rows its thread holds.
//! Atomics are `atomicrmw`/`cmpxchg` with the op's ordering and scope (`gpu`
//! -> `syncscope("device")`, `cta` -> `"block"`, `sys` -> system).
//!
//! Ordered loads and stores, `wait_until` and `prefetch_l2` are lowered by
//! `sync.rs`.
//!
//! Program order: a program is one logical thread, so an atomic orders the
//! program's accesses, not only those of the threads that perform it. One
//! with release semantics is preceded by a CTA barrier (the other threads'
//! earlier stores happen before it, and the release makes them visible with
//! it: CUTLASS's semaphore pattern); one with acquire semantics is followed
//! by one (the broadcast of a replicated result already has it), so the
//! program's later loads see what it acquired. A result is broadcast only
//! when something reads it: otherwise the owners do not wait for their
//! `atom`s to return (the persistent decode step's releases). This is what a cross-program
//! handshake needs (store a tile, `atomic_xchg` a flag; spin on the flag,
//! load the tile: `dequant::gemm`'s stream-K fix-up).

use super::{Lowerer, Regs, elem_bytes, mem_type};
use crate::blocked::BlockedLayout;
use crate::fragment::RegLayout;
use crate::{Error, Result};
use dsl_core::dtype::{DType, Elem};
use dsl_core::ir::Inst;
use dsl_core::ir::ops::{AtomicKind, MemScope, MemSem, MemoryOp};
use inkwell::llvm_sys::LLVMAtomicOrdering;
use inkwell::llvm_sys::LLVMAtomicRMWBinOp;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{AsValueRef, BasicValue, BasicValueEnum, IntValue};

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    /// The vector width for accessing `ptr` (with `mask`) under layout `l`.
    pub(super) fn access_width(
        &self,
        ptr: dsl_core::Value,
        mask: Option<dsl_core::Value>,
        l: &BlockedLayout,
    ) -> usize {
        let ty = self.f.ty(ptr);
        if ty.rank() == 0 {
            return 1;
        }
        let bytes = elem_bytes(Elem::Scalar(ty.dtype()));
        let w = self.plan.axis.masked_vector_width(ptr, mask, ty.rank() - 1, bytes) as usize;
        w.clamp(1, l.spt)
    }

    /// How many consecutive registers of a load share one address, mask and
    /// `other` value (a power of two dividing `spt`; 1 when unknown): the
    /// axis analysis' aligned runs of equal values along the last dimension,
    /// which must be at least that long so a chunk stays inside one row.
    fn equal_run(
        &self,
        ptr: dsl_core::Value,
        mask: Option<dsl_core::Value>,
        other: Option<dsl_core::Value>,
        l: &BlockedLayout,
    ) -> usize {
        let ty = self.f.ty(ptr);
        let Some(&last) = ty.shape.last() else {
            return 1;
        };
        let dim = ty.rank() - 1;
        let run = |v: dsl_core::Value| -> usize {
            let info = self.plan.axis.get(v);
            if self.f.ty(v).rank() == 0 {
                return usize::MAX;
            }
            info.constancy.get(dim).copied().unwrap_or(1).max(1).min(usize::MAX as u64) as usize
        };
        let mut k = run(ptr).min(l.spt).min(last);
        for v in mask.into_iter().chain(other) {
            k = k.min(run(v));
        }
        if k < 2 { 1 } else { 1 << k.ilog2() }
    }

    /// Converts a loaded memory value to its register form (`i1` from a byte).
    pub(super) fn mem_to_reg(&self, v: BasicValueEnum<'ctx>, d: DType) -> Result<BasicValueEnum<'ctx>> {
        if d == DType::I1 {
            let x = v.into_int_value();
            return Ok(self
                .b
                .build_int_compare(inkwell::IntPredicate::NE, x, x.get_type().const_zero(), "")?
                .into());
        }
        Ok(v)
    }

    /// Converts a register to its memory form (`i1` to a byte).
    pub(super) fn reg_to_mem(&self, v: BasicValueEnum<'ctx>, d: DType) -> Result<BasicValueEnum<'ctx>> {
        if d == DType::I1 {
            return Ok(self.b.build_int_z_extend(v.into_int_value(), self.ctx.i8_type(), "")?.into());
        }
        Ok(v)
    }

    /// Loads `w` consecutive elements starting at pointer `p` (one vector when
    /// `w > 1`), with the PTX qualifiers of `hints` when there are any.
    pub(super) fn load_run(
        &self,
        p: BasicValueEnum<'ctx>,
        d: DType,
        w: usize,
        volatile: bool,
        hints: Option<&str>,
    ) -> Result<Vec<BasicValueEnum<'ctx>>> {
        let et = mem_type(self.ctx, Elem::Scalar(d));
        let eb = elem_bytes(Elem::Scalar(d));
        let ptr = p.into_pointer_value();
        if let Some(q) = hints {
            let v = self.hinted_load(ptr, et, w, eb as usize * w, q)?;
            if w == 1 {
                return Ok(vec![self.mem_to_reg(v, d)?]);
            }
            let vv = v.into_vector_value();
            let i32t = self.ctx.i32_type();
            return (0..w)
                .map(|k| {
                    self.mem_to_reg(self.b.build_extract_element(vv, i32t.const_int(k as u64, false), "")?, d)
                })
                .collect();
        }
        if w == 1 {
            let v = self.b.build_load(et, ptr, "")?;
            if let Some(i) = v.as_instruction_value() {
                i.set_alignment(eb).map_err(|e| Error::Llvm(e.to_string()))?;
                if volatile {
                    i.set_volatile(true).map_err(|e| Error::Llvm(e.to_string()))?;
                }
            }
            return Ok(vec![self.mem_to_reg(v, d)?]);
        }
        let vt = vec_type(et, w as u32)?;
        let v = self.b.build_load(vt, ptr, "")?;
        if let Some(i) = v.as_instruction_value() {
            i.set_alignment(eb * w as u32).map_err(|e| Error::Llvm(e.to_string()))?;
            if volatile {
                i.set_volatile(true).map_err(|e| Error::Llvm(e.to_string()))?;
            }
        }
        let vv = v.into_vector_value();
        (0..w)
            .map(|k| {
                let e =
                    self.b.build_extract_element(vv, self.ctx.i32_type().const_int(k as u64, false), "")?;
                self.mem_to_reg(e, d)
            })
            .collect()
    }

    /// Stores `vals` to consecutive elements starting at pointer `p`.
    pub(super) fn store_run(
        &self,
        p: BasicValueEnum<'ctx>,
        d: DType,
        vals: &[BasicValueEnum<'ctx>],
    ) -> Result<()> {
        let et = mem_type(self.ctx, Elem::Scalar(d));
        let eb = elem_bytes(Elem::Scalar(d));
        let ptr = p.into_pointer_value();
        let st = if vals.len() == 1 {
            self.b.build_store(ptr, self.reg_to_mem(vals[0], d)?)?
        } else {
            let vt = vec_type(et, vals.len() as u32)?;
            let mut v = vt.get_undef();
            for (k, &x) in vals.iter().enumerate() {
                let idx = self.ctx.i32_type().const_int(k as u64, false);
                v = self.b.build_insert_element(v, self.reg_to_mem(x, d)?, idx, "")?;
            }
            self.b.build_store(ptr, v)?
        };
        st.set_alignment(eb * vals.len() as u32).map_err(|e| Error::Llvm(e.to_string()))?;
        Ok(())
    }

    /// `a && b` where either may be absent.
    fn and_pred(
        &self,
        a: Option<IntValue<'ctx>>,
        b: Option<IntValue<'ctx>>,
    ) -> Result<Option<IntValue<'ctx>>> {
        Ok(match (a, b) {
            (Some(x), Some(y)) => Some(self.b.build_and(x, y, "")?),
            (x, None) => x,
            (None, y) => y,
        })
    }

    pub(super) fn lower_memory(&mut self, inst: Inst, op: &MemoryOp) -> Result<()> {
        let args = self.args(inst);
        let ptr = args[0];
        let pty = self.f.ty(ptr).clone();
        let d = pty.dtype();
        let l = self.layout(&pty);
        // The synchronisation ops are lowered by `sync.rs`.
        match *op {
            MemoryOp::Load { order: Some(o), .. } => return self.lower_ordered_load(inst, o),
            MemoryOp::Store { order: Some(o), has_mask, .. } => {
                return self.lower_ordered_store(inst, o, has_mask);
            }
            MemoryOp::WaitUntil { cmp, sem, scope } => {
                return self.lower_wait(inst, cmp, dsl_core::ir::ops::MemOrder { sem, scope });
            }
            MemoryOp::WaitLoad { has_mask, scope } => return self.lower_wait_load(inst, has_mask, scope),
            MemoryOp::PrefetchL2 { has_mask } => return self.lower_prefetch(inst, has_mask),
            _ => {}
        }
        // A plain load assigned a row layout (`assign::pulled_row`) reads
        // the rows this thread holds, one element each.
        let row = match (op, self.f.insts[inst].results.first().map(|&r| self.plan.lays.lay(r))) {
            (MemoryOp::Load { .. }, Some(lay @ RegLayout::Row(_))) => Some(lay),
            _ => None,
        };
        let operand = |lw: &mut Self, v| match row {
            Some(lay) => lw.regs_as(v, lay),
            None => lw.regs(v),
        };
        let p = operand(self, ptr)?;
        match *op {
            MemoryOp::Load { volatile, cache, evict, order: None, .. } => {
                let hints = super::ptx_load::load_qualifiers(cache, evict);
                let ops = op.load_operands(&args).ok_or_else(|| self.bug(inst, "load operands"))?;
                let mask = ops.mask;
                let w = if row.is_some() { 1 } else { self.access_width(ptr, mask, &l) };
                let m = match mask {
                    Some(m) => Some(operand(self, m)?),
                    None => None,
                };
                // The pipeline's prefetch of a possibly missing iteration.
                let m = match (m, self.loops.extra_pred) {
                    (Some(m), Some(x)) => Some(
                        m.iter()
                            .map(|v| Ok(self.b.build_and(v.into_int_value(), x, "")?.into()))
                            .collect::<Result<Regs<'ctx>>>()?,
                    ),
                    (None, Some(x)) => Some(vec![x.into(); p.len()]),
                    (m, None) => m,
                };
                let other: Regs<'ctx> = if let Some(o) = ops.other {
                    operand(self, o)?
                } else {
                    vec![self.const_scalar(dsl_core::Scalar::zero(d)); p.len()]
                };
                // Runs of equal addresses (a gather whose pointer repeats
                // along the last axis, e.g. a block-table entry per token
                // broadcast over a page) load once per run.
                let same = if w == 1 && !volatile && row.is_none() {
                    self.equal_run(ptr, mask, ops.other, &l)
                } else {
                    1
                };
                let mut out = Vec::with_capacity(p.len());
                if same > 1 {
                    for s in (0..p.len()).step_by(same) {
                        let v = match &m {
                            None => self.load_run(p[s], d, 1, false, hints)?,
                            Some(m) if self.predicate_loads(d, false) => {
                                vec![self.predicated_load(p[s], d, m[s].into_int_value(), other[s], hints)?]
                            }
                            Some(m) => {
                                let pv = p[s];
                                self.guarded(
                                    m[s].into_int_value(),
                                    |lw| lw.load_run(pv, d, 1, false, hints),
                                    &other[s..s + 1],
                                )?
                            }
                        };
                        for _ in 0..same {
                            out.push(v[0]);
                        }
                    }
                    self.set(self.result(inst, 0)?, out);
                    return Ok(());
                }
                for s in (0..p.len()).step_by(w) {
                    let vals = match &m {
                        None => self.load_run(p[s], d, w, volatile, hints)?,
                        Some(m) if w == 1 && !volatile && self.predicate_loads(d, row.is_some()) => {
                            vec![self.predicated_load(p[s], d, m[s].into_int_value(), other[s], hints)?]
                        }
                        Some(m) => {
                            let pv = p[s];
                            self.guarded(
                                m[s].into_int_value(),
                                |lw| lw.load_run(pv, d, w, volatile, hints),
                                &other[s..s + w],
                            )?
                        }
                    };
                    out.extend(vals);
                }
                self.set(self.result(inst, 0)?, out);
            }
            MemoryOp::Store { has_mask, order: None, .. } => {
                let mask = if has_mask { Some(args[2]) } else { None };
                let w = self.access_width(ptr, mask, &l);
                let vals = self.regs(args[1])?;
                let m = match mask {
                    Some(m) => Some(self.regs(m)?),
                    None => None,
                };
                let owner = self.owner_pred(&l)?;
                for s in (0..p.len()).step_by(w) {
                    let ms = m.as_ref().map(|m| m[s].into_int_value());
                    let cond = self.and_pred(ms, owner)?;
                    let (pv, chunk) = (p[s], vals[s..s + w].to_vec());
                    match cond {
                        None => self.store_run(pv, d, &chunk)?,
                        Some(c) => self.if_then(c, |lw| lw.store_run(pv, d, &chunk))?,
                    }
                }
            }
            MemoryOp::Atomic { kind, has_mask, sem, scope } => {
                let vals = self.regs(args[1])?;
                let m = if has_mask { Some(self.regs(args[2])?) } else { None };
                let owner = self.owner_pred(&l)?;
                self.order_before_atomic(sem)?;
                let zero = self.const_scalar(dsl_core::Scalar::zero(d));
                let mut out = Vec::with_capacity(p.len());
                for s in 0..p.len() {
                    let cond = self.and_pred(m.as_ref().map(|m| m[s].into_int_value()), owner)?;
                    let (pv, v) = (p[s], vals[s]);
                    let r = match cond {
                        None => self.atomic_rmw(inst, kind, d, pv, v, sem, scope)?,
                        Some(c) => self.guarded(
                            c,
                            |lw| Ok(vec![lw.atomic_rmw(inst, kind, d, pv, v, sem, scope)?]),
                            &[zero],
                        )?[0],
                    };
                    out.push(r);
                }
                let read = self.read(inst)?;
                let out = if read { self.owners_to_replicas(&l, Elem::Scalar(d), out)? } else { out };
                self.order_after_atomic(sem, &l, read)?;
                self.set(self.result(inst, 0)?, out);
            }
            // `compile` expands every `load_block` into a masked `load` first
            // (`dsl_core::passes::block_load`), so none reaches lowering.
            MemoryOp::LoadBlock { .. } => {
                return Err(Error::Llvm("load_block must be expanded before lowering".into()));
            }
            MemoryOp::Load { order: Some(_), .. }
            | MemoryOp::Store { order: Some(_), .. }
            | MemoryOp::WaitUntil { .. }
            | MemoryOp::WaitLoad { .. }
            | MemoryOp::PrefetchL2 { .. } => {
                return Err(self.bug(inst, "a synchronisation op reached `lower_memory`"));
            }
            MemoryOp::AtomicCas { sem, scope } => {
                let (cmp, new) = (self.regs(args[1])?, self.regs(args[2])?);
                let owner = self.owner_pred(&l)?;
                self.order_before_atomic(sem)?;
                let zero = self.const_scalar(dsl_core::Scalar::zero(d));
                let mut out = Vec::with_capacity(p.len());
                for s in 0..p.len() {
                    let (pv, c, n) = (p[s], cmp[s], new[s]);
                    let r = match owner {
                        None => self.atomic_cas(d, pv, c, n, sem, scope)?,
                        Some(o) => {
                            self.guarded(o, |lw| Ok(vec![lw.atomic_cas(d, pv, c, n, sem, scope)?]), &[zero])?
                                [0]
                        }
                    };
                    out.push(r);
                }
                let read = self.read(inst)?;
                let out = if read { self.owners_to_replicas(&l, Elem::Scalar(d), out)? } else { out };
                self.order_after_atomic(sem, &l, read)?;
                self.set(self.result(inst, 0)?, out);
            }
        }
        Ok(())
    }

    /// Whether anything reads the result of the atomic `inst`: only then is
    /// it given to the replicas ([`Self::owners_to_replicas`]); a result
    /// nothing reads is left as it is, so the owners go on without waiting
    /// for their `atom`s to return (a release's counter update is then a
    /// fire-and-forget reduction).
    fn read(&self, inst: Inst) -> Result<bool> {
        let r = self.result(inst, 0)?;
        let mut read = false;
        self.f.walk(|i| read |= self.f.insts[i].args.contains(&r));
        Ok(read)
    }

    /// The CTA barrier before an atomic with release semantics (see the
    /// module doc: the program's earlier accesses, by any thread, come first).
    fn order_before_atomic(&self, sem: MemSem) -> Result<()> {
        if matches!(sem, MemSem::Release | MemSem::AcqRel) {
            self.barrier()?;
        }
        Ok(())
    }

    /// The CTA barrier after an atomic with acquire semantics, unless the
    /// broadcast of its replicated result (`owners_to_replicas`, when the
    /// result is `read`) had one.
    fn order_after_atomic(&self, sem: MemSem, l: &BlockedLayout, read: bool) -> Result<()> {
        if matches!(sem, MemSem::Acquire | MemSem::AcqRel) && !(l.replicated() && read) {
            self.barrier()?;
        }
        Ok(())
    }

    /// Replaces replicas' registers with the owners' values (through shared
    /// memory); identity when `l` has no replicas.
    pub fn owners_to_replicas(&mut self, l: &BlockedLayout, e: Elem, regs: Regs<'ctx>) -> Result<Regs<'ctx>> {
        if !l.replicated() {
            return Ok(regs);
        }
        let et = mem_type(self.ctx, e);
        let smem = self.smem(l.n as u64 * u64::from(elem_bytes(e)))?;
        let base = self.thread_base(l)?;
        let owner = self.owner_pred(l)?;
        self.barrier()?;
        let d = e.dtype();
        for (s, &v) in regs.iter().enumerate() {
            let idx = self.linear_index(l, base, s)?;
            let addr = self.smem_elem(smem, 0, et, idx)?;
            let mv = if e.is_ptr() { v } else { self.reg_to_mem(v, d)? };
            match owner {
                Some(o) => self.if_then(o, |lw| {
                    lw.b.build_store(addr, mv)?;
                    Ok(())
                })?,
                None => {
                    self.b.build_store(addr, mv)?;
                }
            }
        }
        self.barrier()?;
        let mut out = Vec::with_capacity(regs.len());
        for s in 0..regs.len() {
            let idx = self.linear_index(l, base, s)?;
            let addr = self.smem_elem(smem, 0, et, idx)?;
            let v = self.b.build_load(et, addr, "")?;
            out.push(if e.is_ptr() { v } else { self.mem_to_reg(v, d)? });
        }
        Ok(out)
    }

    /// The sync scope id of `scope`.
    fn sync_scope(&self, scope: MemScope) -> u32 {
        let name: &[u8] = match scope {
            MemScope::Gpu => b"device",
            MemScope::Cta => b"block",
            MemScope::Sys => b"",
        };
        // SAFETY: the context is alive and the name is a valid byte slice of the given length.
        unsafe {
            inkwell::llvm_sys::core::LLVMGetSyncScopeID(self.ctx.raw(), name.as_ptr().cast(), name.len())
        }
    }

    /// One `atomicrmw` on a scalar pointer.
    #[allow(clippy::too_many_arguments)]
    fn atomic_rmw(
        &self,
        inst: Inst,
        kind: AtomicKind,
        d: DType,
        p: BasicValueEnum<'ctx>,
        v: BasicValueEnum<'ctx>,
        sem: MemSem,
        scope: MemScope,
    ) -> Result<BasicValueEnum<'ctx>> {
        use LLVMAtomicRMWBinOp::*;
        let s = d.is_signed_int();
        let op = match (kind, d.is_float()) {
            (AtomicKind::Add, true) => LLVMAtomicRMWBinOpFAdd,
            (AtomicKind::Add, false) => LLVMAtomicRMWBinOpAdd,
            (AtomicKind::Max, true) => LLVMAtomicRMWBinOpFMax,
            (AtomicKind::Max, false) if s => LLVMAtomicRMWBinOpMax,
            (AtomicKind::Max, false) => LLVMAtomicRMWBinOpUMax,
            (AtomicKind::Min, true) => LLVMAtomicRMWBinOpFMin,
            (AtomicKind::Min, false) if s => LLVMAtomicRMWBinOpMin,
            (AtomicKind::Min, false) => LLVMAtomicRMWBinOpUMin,
            (AtomicKind::And, false) => LLVMAtomicRMWBinOpAnd,
            (AtomicKind::Or, false) => LLVMAtomicRMWBinOpOr,
            (AtomicKind::Xor, false) => LLVMAtomicRMWBinOpXor,
            (AtomicKind::Xchg, _) => LLVMAtomicRMWBinOpXchg,
            _ => return Err(self.unsupported(inst, format!("`{}` on {d}", kind.name()))),
        };
        let ssid = self.sync_scope(scope);
        // The NVPTX backend of LLVM 22 emits plain (relaxed) `atom` for
        // `atomicrmw` whatever its ordering, so the ordering is also enforced
        // with fences of the same scope around it.
        if matches!(sem, MemSem::Release | MemSem::AcqRel) {
            self.fence(LLVMAtomicOrdering::LLVMAtomicOrderingRelease, ssid);
        }
        // SAFETY: the builder is positioned, `p` is a pointer and `v` a value of
        // the pointee type, all from this context; the result is an instruction
        // of `v`'s type, which `BasicValueEnum::new` accepts.
        unsafe {
            let r = inkwell::llvm_sys::core::LLVMBuildAtomicRMWSyncScope(
                self.b.as_mut_ptr(),
                op,
                p.as_value_ref(),
                v.as_value_ref(),
                ordering(sem),
                ssid,
            );
            let r = BasicValueEnum::new(r);
            if matches!(sem, MemSem::Acquire | MemSem::AcqRel) {
                self.fence(LLVMAtomicOrdering::LLVMAtomicOrderingAcquire, ssid);
            }
            Ok(r)
        }
    }

    /// A `fence` with `ordering` in sync scope `ssid`.
    fn fence(&self, ordering: LLVMAtomicOrdering, ssid: u32) {
        // SAFETY: the builder is positioned and the name is a NUL-terminated string.
        unsafe {
            inkwell::llvm_sys::core::LLVMBuildFenceSyncScope(
                self.b.as_mut_ptr(),
                ordering,
                ssid,
                c"".as_ptr(),
            );
        }
    }

    /// One `cmpxchg` on a scalar pointer; floats go through their bits.
    fn atomic_cas(
        &self,
        d: DType,
        p: BasicValueEnum<'ctx>,
        cmp: BasicValueEnum<'ctx>,
        new: BasicValueEnum<'ctx>,
        sem: MemSem,
        scope: MemScope,
    ) -> Result<BasicValueEnum<'ctx>> {
        let it: BasicTypeEnum<'ctx> = self.int_ty(d.bits()).into();
        let (c, n) = if d.is_float() {
            (self.b.build_bit_cast(cmp, it, "")?, self.b.build_bit_cast(new, it, "")?)
        } else {
            (cmp, new)
        };
        let fail = match sem {
            MemSem::Relaxed | MemSem::Release => LLVMAtomicOrdering::LLVMAtomicOrderingMonotonic,
            MemSem::Acquire | MemSem::AcqRel => LLVMAtomicOrdering::LLVMAtomicOrderingAcquire,
        };
        let ssid = self.sync_scope(scope);
        // SAFETY: as in `atomic_rmw`; the result is a `{ iN, i1 }` struct whose
        // field 0 (the old value) is extracted through inkwell.
        let pair = unsafe {
            let r = inkwell::llvm_sys::core::LLVMBuildAtomicCmpXchgSyncScope(
                self.b.as_mut_ptr(),
                p.as_value_ref(),
                c.as_value_ref(),
                n.as_value_ref(),
                ordering(sem),
                fail,
                ssid,
            );
            inkwell::values::StructValue::new(r)
        };
        let old = self.b.build_extract_value(pair, 0, "")?;
        Ok(if d.is_float() { self.b.build_bit_cast(old, new.get_type(), "")? } else { old })
    }
}

/// The LLVM ordering of an atomic's semantics.
fn ordering(sem: MemSem) -> LLVMAtomicOrdering {
    match sem {
        MemSem::Relaxed => LLVMAtomicOrdering::LLVMAtomicOrderingMonotonic,
        MemSem::Acquire => LLVMAtomicOrdering::LLVMAtomicOrderingAcquire,
        MemSem::Release => LLVMAtomicOrdering::LLVMAtomicOrderingRelease,
        MemSem::AcqRel => LLVMAtomicOrdering::LLVMAtomicOrderingAcquireRelease,
    }
}

/// The vector type of `n` elements of `et`.
pub(crate) fn vec_type(et: BasicTypeEnum<'_>, n: u32) -> Result<inkwell::types::VectorType<'_>> {
    Ok(match et {
        BasicTypeEnum::IntType(t) => t.vec_type(n),
        BasicTypeEnum::FloatType(t) => t.vec_type(n),
        BasicTypeEnum::PointerType(t) => t.vec_type(n),
        other => return Err(Error::Llvm(format!("no vector of {}", other.print_to_string()))),
    })
}
