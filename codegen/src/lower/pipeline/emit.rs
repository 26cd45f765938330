//! The pipeline's code generation (the decisions are the parent module's):
//! the resident operands' writes, the ring stages, the copies a prologue
//! or an iteration issues (`cp.async`; TMA boxes through `lower/tma.rs`),
//! the waits, and the stage pointers the `dot` lowerings read.

use super::*;

/// The copies of iteration `iv` (stage `stage`, predicate `valid`) that an
/// iteration of an `mma.sync` loop whose body has one tensor-core `dot` (a
/// GEMM's) issues right after that `dot`'s `mma`s instead of right after the
/// barrier (`control.rs`), branch-free ([`Lowerer::pipe_issue`] with
/// `fold`). In one basic block with the `mma`s, ptxas spreads the copies and
/// their address and mask arithmetic among the last `mma`s, and after the
/// barrier every warp goes straight to its `ldmatrix`es; at the top of the
/// body all warps computed the copies at once while the tensor cores
/// waited. (Issuing them after the first k step instead, with the A
/// fragments loaded per k step, was slower; BENCHMARKS.md has the runs.)
/// FlashAttention's two `dot`s are left alone: their loops spill more when
/// the copies' addresses stay live across a product.
pub(crate) struct PendingIssue<'ctx> {
    /// The loop; the copies follow the `mma`s of its `issue_after`.
    pub pl: PipeLoop,
    pub iv_arg: Value,
    pub iv: BasicValueEnum<'ctx>,
    pub valid: IntValue<'ctx>,
    pub stage: IntValue<'ctx>,
    pub fed: Vec<Regs<'ctx>>,
}

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    /// A pipelined loop's prologue, before its head (see the module
    /// documentation): the barrier that hands the ring region over, the
    /// stage mbarriers, the copies of the first `ahead` iterations, and the
    /// slice's loads of the first iteration the loop copies for (returned,
    /// to be carried).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn pipe_prologue(
        &mut self,
        pl: &PipeLoop,
        iv_arg: Value,
        lb: IntValue<'ctx>,
        step: IntValue<'ctx>,
        ub: IntValue<'ctx>,
        signed: bool,
    ) -> Result<Vec<Regs<'ctx>>> {
        // The rings overlap the scratch region used outside pipelined
        // loops: every thread must be done reading it before the first
        // copies land.
        self.barrier()?;
        self.loops.in_pipeline += 1;
        if pl.bars.is_some() {
            // The TMA loads' stage mbarriers (`tma.rs`).
            self.mbar_init(pl)?;
            self.barrier()?;
        }
        let at = |lw: &Self, j: usize| -> Result<IntValue<'ctx>> {
            let jj = step.get_type().const_int(j as u64, false);
            Ok(lw.b.build_int_add(lb, lw.b.build_int_mul(step, jj, "")?, "")?)
        };
        // In a `cp.async` loop the slice's loads (page numbers) of every
        // prologue iteration and of the first one the loop copies for go
        // out together, before any copy needs them: one memory round trip
        // before the first copies, not one per prologue iteration. (A TMA
        // loop's box coordinates keep one round trip per iteration, each
        // iteration's copies issued as its coordinates are formed: holding
        // them all costs its tiles more than the round trips.)
        let batch = pl.bars.is_none();
        let mut held: Vec<(IntValue<'ctx>, IntValue<'ctx>, Option<Vec<Regs<'ctx>>>)> = Vec::new();
        for j in 0..pl.ahead {
            let ivj = at(self, j)?;
            let valid = self.iv_less(signed, ivj, ub)?;
            if !batch {
                self.pipe_issue(pl, iv_arg, ivj.into(), valid, self.i32c(j as i64), None, None, false)?;
                continue;
            }
            let fed = if pl.feed.is_empty() {
                None
            } else {
                Some(self.pipe_feed(pl, iv_arg, ivj.into(), valid)?)
            };
            held.push((ivj, valid, fed));
        }
        let ivf = at(self, pl.ahead)?;
        let valid = self.iv_less(signed, ivf, ub)?;
        let carried = self.pipe_feed(pl, iv_arg, ivf.into(), valid)?;
        for (j, (ivj, valid, fed)) in held.into_iter().enumerate() {
            self.pipe_issue(pl, iv_arg, ivj.into(), valid, self.i32c(j as i64), fed.as_deref(), None, false)?;
        }
        Ok(carried)
    }

    /// A pipelined loop's exit: hands the ring region over (no copy in
    /// flight, no reader left; every TMA box issued was waited for in its
    /// iteration) and forgets the loop's stages.
    pub(crate) fn pipe_epilogue(&mut self, pl: &PipeLoop) -> Result<()> {
        if pl.cp_async() {
            self.pipe_wait(0)?;
        }
        self.barrier()?;
        if pl.bars.is_some() {
            self.mbar_inval(pl)?;
        }
        self.loops.in_pipeline -= 1;
        for ld in &pl.loads {
            self.loops.pipe_stage.remove(&ld.load);
        }
        for a in &pl.a_stages {
            self.loops.pipe_stage.remove(&a.dot);
        }
        Ok(())
    }
    /// The ring region's base: the bottom of shared memory, above the
    /// resident operands ([`Pipeline::resident`]).
    pub(in crate::lower) fn ring_base(&mut self) -> Result<PointerValue<'ctx>> {
        self.smem_at(self.plan.pipe.resident_bytes)
    }

    /// The resident copy of the loop-invariant `wgmma` operand `v`
    /// ([`Pipeline::resident`]), if it has one.
    pub(in crate::lower) fn resident_ptr(&mut self, v: Value) -> Result<Option<PointerValue<'ctx>>> {
        match self.plan.pipe.resident.get(&v) {
            Some(&off) => Ok(Some(self.smem_at(off)?)),
            None => Ok(None),
        }
    }

    /// Writes the resident operand `v` ([`Pipeline::resident`]) into its
    /// place in swizzle atoms and makes it visible to the tensor cores: a
    /// barrier first (products of an earlier pass may still read the
    /// place), the stores, a fence for the async proxy, a barrier.
    pub(in crate::lower) fn make_resident(&mut self, v: Value) -> Result<()> {
        if let Some(&off) = self.plan.pipe.mma_resident.get(&v) {
            // Padded rows for `ldmatrix` (`dot::resident`).
            let base = self.smem_at(0)?;
            self.barrier()?;
            self.stage_a(base, off, v)?;
            return self.barrier();
        }
        let Some(at) = self.resident_ptr(v)? else { return Ok(()) };
        let ty = self.f.ty(v).clone();
        let lv = self.layout(&ty);
        let regs = self.regs(v)?;
        self.barrier()?;
        self.stage_atoms(at, &lv, &regs, ty.shape[0], ty.shape[1], ty.dtype())?;
        self.fence_proxy_async()?;
        self.barrier()
    }

    /// Lowers the slice instructions `insts` with the induction variable
    /// `iv_arg` bound to `iv`, every load in them masked by `valid`, and the
    /// results of the loads in `fed` (with their registers) taken as given
    /// instead of loaded; then runs `read` on the slice's values and restores
    /// the body's bindings.
    fn with_slice<R>(
        &mut self,
        pl: &PipeLoop,
        insts: &[Inst],
        (iv_arg, iv): (Value, BasicValueEnum<'ctx>),
        valid: IntValue<'ctx>,
        fed: &[(Inst, Regs<'ctx>)],
        read: impl FnOnce(&mut Self) -> Result<R>,
    ) -> Result<R> {
        let saved: Vec<(Value, Option<Regs<'ctx>>)> = std::iter::once(iv_arg)
            .chain(insts.iter().flat_map(|&i| self.f.insts[i].results.iter().copied()))
            .map(|v| (v, self.vals.get(&v).cloned()))
            .collect();
        self.vals.insert(iv_arg, vec![iv]);
        for (i, regs) in fed {
            self.vals.insert(self.f.insts[*i].results[0], regs.clone());
        }
        let outer = self.loops.extra_pred.replace(valid);
        let outer_pred = std::mem::replace(&mut self.loops.predicated_slice, pl.bars.is_none());
        let mut res = Ok(());
        for &i in insts {
            if fed.iter().any(|(j, _)| *j == i) {
                continue;
            }
            let op = self.f.insts[i].op.clone();
            res = self.lower_op(i, op);
            if res.is_err() {
                break;
            }
        }
        self.loops.extra_pred = outer;
        self.loops.predicated_slice = outer_pred;
        let out = match res {
            Ok(()) => read(self),
            Err(e) => Err(e),
        };
        for (v, old) in saved {
            match old {
                Some(r) => self.vals.insert(v, r),
                None => self.vals.remove(&v),
            };
        }
        out
    }

    /// The registers of the slice's loads (`feed`) for the iteration whose
    /// induction variable is `iv`, masked off unless `valid`.
    pub(in crate::lower) fn pipe_feed(
        &mut self,
        pl: &PipeLoop,
        iv_arg: Value,
        iv: BasicValueEnum<'ctx>,
        valid: IntValue<'ctx>,
    ) -> Result<Vec<Regs<'ctx>>> {
        let feed = pl.feed.clone();
        self.with_slice(pl, &pl.feed_slice, (iv_arg, iv), valid, &[], |lw| {
            feed.iter().map(|&i| lw.raw_regs(lw.f.insts[i].results[0])).collect()
        })
    }

    /// Issues the copies of every load of loop `pl` for the iteration whose
    /// induction variable is `iv` into stage `stage` (an i32), all under the
    /// uniform predicate `valid`; then commits one group. `fed` holds the
    /// slice's load results for that iteration when they were loaded ahead
    /// ([`Lowerer::pipe_feed`]); otherwise they are loaded here. With
    /// `release` (loops whose stages are handed back by mbarriers, see
    /// [`PipeLoop::released`]) the TMA leader first waits for that phase
    /// parity of the stage's release mbarrier.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::lower) fn pipe_issue(
        &mut self,
        pl: &PipeLoop,
        iv_arg: Value,
        iv: BasicValueEnum<'ctx>,
        valid: IntValue<'ctx>,
        stage: IntValue<'ctx>,
        fed: Option<&[Regs<'ctx>]>,
        release: Option<IntValue<'ctx>>,
        fold: bool,
    ) -> Result<()> {
        let fed: Vec<(Inst, Regs<'ctx>)> = match fed {
            Some(r) => pl.feed.iter().copied().zip(r.iter().cloned()).collect(),
            None => Vec::new(),
        };
        let loads = pl.loads.clone();
        let (addrs, coords) = self.with_slice(pl, &pl.slice, (iv_arg, iv), valid, &fed, |lw| {
            let mut addrs = Vec::with_capacity(loads.len());
            let mut coords = Vec::new();
            for ld in &loads {
                if let Some(t) = &ld.tma {
                    let r = lw.regs(t.row0)?[0].into_int_value();
                    let c = lw.regs(t.col0)?[0].into_int_value();
                    coords.push((r, c));
                    continue;
                }
                let args = lw.f.insts[ld.load].args.to_vec();
                let p = lw.regs(args[0])?;
                let m = if args.len() > 1 { Some(lw.regs(args[1])?) } else { None };
                addrs.push((p, m));
            }
            Ok((addrs, coords))
        })?;
        if !coords.is_empty() {
            self.tma_issue(pl, stage, valid, &coords, release)?;
        }
        if !pl.cp_async() {
            return Ok(());
        }
        let ring = self.ring_base()?;
        for (ld, (p, m)) in pl.loads.iter().filter(|l| l.tma.is_none()).zip(addrs) {
            let ty = self.f.ty(self.f.insts[ld.load].results[0]).clone();
            let l = self.layout(&ty);
            let base = self.thread_base(&l)?;
            let off = self.b.build_int_mul(stage, self.i32c(ld.stage_bytes as i64), "")?;
            let off = self.b.build_int_add(off, self.i32c(ld.ring_off as i64), "")?;
            let i8t = self.ctx.i8_type();
            // SAFETY: the stage lies inside the ring region reserved at the bottom of shared memory.
            let stage_ptr = unsafe { self.b.build_in_bounds_gep(i8t, ring, &[off], "")? };
            let bytes = ld.width * ld.elem_bytes;
            // 16-byte copies are inline PTX ([`Self::cp_async_16`]); narrower
            // ones (which must go through L1, `.ca`) use LLVM's intrinsics.
            let (name, sized) = match (bytes, m.is_some() || fold) {
                (8, false) => ("llvm.nvvm.cp.async.ca.shared.global.8", false),
                (8, true) => ("llvm.nvvm.cp.async.ca.shared.global.8.s", true),
                (_, false) => ("llvm.nvvm.cp.async.ca.shared.global.4", false),
                (_, true) => ("llvm.nvvm.cp.async.ca.shared.global.4.s", true),
            };
            let et = self.mem_ty(ty.dtype());
            let nbytes = self.i32c(bytes as i64);
            let zero = self.i32c(0);
            let mut copies = Vec::with_capacity(p.len() / ld.width);
            // With runs (`PipeLoad::run`): one copy per chunk, by the chunks
            // that start a run (`starts`), into the run's element.
            let step = if ld.run > 1 { l.spt } else { ld.width };
            let mut starts = Vec::new();
            for s0 in (0..p.len()).step_by(step) {
                let idx = if ld.regs {
                    let (idx, start) = self.regs_index(ld, &l, base, s0)?;
                    starts.extend(start);
                    idx
                } else if ld.atoms {
                    self.atom_index(&l, base, s0, ld.rows, ld.cols)?
                } else {
                    self.chunk_index(&l, base, s0, ld.cols, swizzled(ld.cols))?
                };
                let dst = self.smem_elem(stage_ptr, 0, et, idx)?;
                let on = match (&m, fold) {
                    (Some(m), true) => Some(self.b.build_and(m[s0].into_int_value(), valid, "")?),
                    (Some(m), false) => Some(m[s0].into_int_value()),
                    (None, true) => Some(valid),
                    (None, false) => None,
                };
                let size = match on {
                    Some(on) => Some(self.b.build_select(on, nbytes, zero, "")?.into_int_value()),
                    None => None,
                };
                copies.push((dst, p[s0], size));
            }
            // The load's `cache_modifier = ".ca"` keeps 16-byte copies in L1
            // too (`cp.async.ca`); otherwise they bypass it (`.cg`).
            let l1 = matches!(
                self.f.insts[ld.load].op,
                Op::Memory(MemoryOp::Load { cache: CacheModifier::Ca, .. })
            );
            let emit = |lw: &mut Self| {
                for (k, (dst, src, size)) in copies.iter().enumerate() {
                    let copy = |lw: &mut Self| {
                        if bytes == 16 {
                            return lw.cp_async_16(*dst, *src, *size, l1);
                        }
                        let mut a: Vec<BasicValueEnum<'ctx>> = vec![(*dst).into(), *src];
                        if sized {
                            a.push(size.unwrap_or(nbytes).into());
                        }
                        lw.call(name, None, &a)?;
                        Ok(())
                    };
                    // A chunk inside a run copies nothing (a zero-filling
                    // copy would overwrite the run's element).
                    match starts.get(k) {
                        Some(&first) => lw.if_then(first, copy)?,
                        None => copy(lw)?,
                    }
                }
                Ok(())
            };
            // Folded: past the end every copy has source size 0 and only
            // zero-fills its stage, which no iteration reads. A replicated
            // tile read back into registers is copied by its owners only
            // (the replicas read the owners' chunks after the barrier).
            let owner = if ld.regs { self.owner_pred(&l)? } else { None };
            let guard = match (owner, fold) {
                (Some(o), true) => Some(o),
                (Some(o), false) => Some(self.b.build_and(o, valid, "")?),
                (None, true) => None,
                (None, false) => Some(valid),
            };
            match guard {
                Some(g) => self.if_then(g, emit)?,
                None => emit(self)?,
            }
        }
        self.call("llvm.nvvm.cp.async.commit.group", None, &[])?;
        Ok(())
    }

    /// The registers of the pipelined load `inst` read back from the
    /// current iteration's stage ([`PipeLoad::regs`]): the chunks this
    /// thread's slots of the load's blocked layout cover, at their linear
    /// indices (masked-off elements were zero-filled by the copies).
    pub(in crate::lower) fn pipe_read(&mut self, inst: Inst) -> Result<()> {
        let ld = self.pipe_load(inst)?;
        let stage = self.stage_ptr(inst)?.ok_or_else(|| self.bug(inst, "pipelined load outside its loop"))?;
        let res = self.f.insts[inst].results[0];
        let ty = self.f.ty(res).clone();
        let d = ty.dtype();
        let l = self.layout(&ty);
        let base = self.thread_base(&l)?;
        let et = self.mem_ty(d);
        let mut out = Vec::with_capacity(l.regs());
        // Within a run, one element for the whole chunk (`PipeLoad::run`).
        let step = if ld.run > 1 { l.spt } else { ld.width };
        for s0 in (0..l.regs()).step_by(step) {
            let at = self.smem_elem(stage, 0, et, self.regs_index(&ld, &l, base, s0)?.0)?;
            let vals = self.load_run(at.into(), d, ld.width, false, None)?;
            out.extend(vals.iter().cycle().take(step));
        }
        self.set(res, out);
        Ok(())
    }

    /// The plan of the pipelined load `inst` ([`PipeLoad`]), from its loop.
    pub(in crate::lower) fn pipe_load(&self, inst: Inst) -> Result<PipeLoad> {
        self.plan
            .pipe
            .loops
            .values()
            .find_map(|pl| pl.loads.iter().find(|l| l.load == inst))
            .cloned()
            .ok_or_else(|| self.bug(inst, "pipelined load without a loop"))
    }

    /// The stage element of the chunk holding slot `s0` of a load read back
    /// into registers ([`PipeLoad::regs`], layout `l`, thread base `base`):
    /// its linear index, or with runs the run's index, and then whether the
    /// chunk starts its run (the one that copies it).
    fn regs_index(
        &self,
        ld: &PipeLoad,
        l: &BlockedLayout,
        base: IntValue<'ctx>,
        s0: usize,
    ) -> Result<(IntValue<'ctx>, Option<IntValue<'ctx>>)> {
        let lin = self.linear_index(l, base, s0)?;
        if ld.frag {
            return Ok((self.frag_index(lin, ld.cols)?, None));
        }
        if ld.run == 1 {
            return Ok((lin, None));
        }
        let within = self.b.build_and(lin, self.i32c(ld.run as i64 - 1), "")?;
        let start = self.b.build_int_compare(IntPredicate::EQ, within, self.i32c(0), "")?;
        let shift = self.i32c(ld.run.trailing_zeros() as i64);
        Ok((self.b.build_right_shift(lin, shift, false, "")?, Some(start)))
    }

    /// The stage byte of element `lin` (linear, row-major) of a
    /// [`PipeLoad::frag`] tile with rows of `cols` bytes: its row's 16-byte
    /// chunks XOR-swizzled or the row padded ([`super::frag_swizzled`]).
    pub(in crate::lower) fn frag_index(&self, lin: IntValue<'ctx>, cols: usize) -> Result<IntValue<'ctx>> {
        let shift = self.i32c(cols.trailing_zeros() as i64);
        let row = self.b.build_right_shift(lin, shift, false, "")?;
        let col = self.b.build_and(lin, self.i32c(cols as i64 - 1), "")?;
        if super::frag_swizzled(cols) {
            let phase =
                self.b.build_left_shift(self.b.build_and(row, self.i32c(7), "")?, self.i32c(4), "")?;
            let col = self.b.build_xor(col, phase, "")?;
            return Ok(self.b.build_int_add(self.b.build_left_shift(row, shift, "")?, col, "")?);
        }
        self.mad(row, super::frag_row_bytes(cols), col)
    }

    /// Issues the copies an iteration deferred ([`PendingIssue`]), if any.
    pub(in crate::lower) fn pipe_flush(&mut self) -> Result<()> {
        let Some(p) = self.loops.pipe_pending.take() else { return Ok(()) };
        self.pipe_issue(&p.pl, p.iv_arg, p.iv, p.valid, p.stage, Some(&p.fed), None, true)
    }

    /// One 16-byte `cp.async` from global `src` to shared `dst` (through L2
    /// only, `.cg`, or also allocating in L1 with `l1`, `.ca`), zero-filling
    /// past the source size `size` when there is one, with CUTLASS's
    /// `.L2::128B` prefetch-size hint: a miss fetches the whole 128-byte line
    /// from DRAM at once (it helps decode attention's scattered pages and
    /// costs the dense kernels nothing). LLVM's intrinsic has no hint, so
    /// this is inline PTX.
    fn cp_async_16(
        &mut self,
        dst: PointerValue<'ctx>,
        src: BasicValueEnum<'ctx>,
        size: Option<IntValue<'ctx>>,
        l1: bool,
    ) -> Result<()> {
        let d = self.b.build_ptr_to_int(dst, self.ctx.i32_type(), "")?;
        let s = self.b.build_ptr_to_int(src.into_pointer_value(), self.ctx.i64_type(), "")?;
        let mode = if l1 { "ca" } else { "cg" };
        match size {
            Some(z) => self.asm(
                &format!("cp.async.{mode}.shared.global.L2::128B [$0], [$1], 16, $2;"),
                "r,l,r,~{memory}",
                &[d.into(), s.into(), z.into()],
            ),
            None => self.asm(
                &format!("cp.async.{mode}.shared.global.L2::128B [$0], [$1], 16;"),
                "r,l,~{memory}",
                &[d.into(), s.into()],
            ),
        }
    }

    /// The element index in a stage of 128-byte swizzle atoms of the chunk
    /// of register `slot` of `l` (a `[rows, cols]` tile; see [`atom_index`]).
    pub(in crate::lower) fn atom_index(
        &self,
        l: &BlockedLayout,
        base: IntValue<'ctx>,
        slot: usize,
        rows: usize,
        cols: usize,
    ) -> Result<IntValue<'ctx>> {
        let (lin, row) = self.linear_row(l, base, slot, cols)?;
        let col = self.b.build_and(lin, self.i32c(cols as i64 - 1), "")?;
        // ((col / 64) * rows + row) * 64 + ((col mod 64) ^ 8 (row mod 8))
        let atom = self.b.build_right_shift(col, self.i32c(6), false, "")?;
        let r = self.b.build_int_add(self.b.build_int_mul(atom, self.i32c(rows as i64), "")?, row, "")?;
        let r = self.b.build_left_shift(r, self.i32c(6), "")?;
        let phase = self.swizzle_phase(row)?;
        let within = self.b.build_xor(self.b.build_and(col, self.i32c(63), "")?, phase, "")?;
        Ok(self.b.build_or(r, within, "")?)
    }

    /// `fence.proxy.async.shared::cta`: this thread's shared-memory writes
    /// (its landed copies) become visible to the async proxy (`wgmma`).
    pub(in crate::lower) fn fence_proxy_async(&mut self) -> Result<()> {
        self.asm("fence.proxy.async.shared::cta;", "~{memory}", &[])
    }

    /// `cp.async.wait_group n`.
    pub(in crate::lower) fn pipe_wait(&mut self, n: usize) -> Result<()> {
        self.call("llvm.nvvm.cp.async.wait.group", None, &[self.i32c(n as i64).into()])?;
        Ok(())
    }

    /// The shared-memory stage pointer of a pipelined load in the current
    /// iteration, when `(dot, operand)` reads one,
    /// and whether that stage is XOR-swizzled ([`swizzled`]) rather than padded.
    pub(in crate::lower) fn pipe_operand(
        &mut self,
        dot: Inst,
        operand: usize,
    ) -> Result<Option<(PointerValue<'ctx>, Rows)>> {
        let Some(&ld) = self.plan.pipe.by_dot.get(&(dot, operand)) else { return Ok(None) };
        let cols = self.f.ty(self.f.insts[ld].results[0]).shape[1];
        let aligned = self
            .loops
            .pipe_stage
            .get(&ld)
            .is_some_and(|&(_, off, bytes)| off.is_multiple_of(1024) && bytes.is_multiple_of(1024));
        let rows = match (swizzled(cols), aligned) {
            (false, _) => Rows::Padded,
            (true, false) => Rows::Swizzled,
            (true, true) => Rows::SwizzledAligned,
        };
        Ok(self.stage_ptr(ld)?.map(|p| (p, rows)))
    }

    /// The current iteration's stage of the ring keyed `key` in `pipe_stage`:
    /// a pipelined load's, or the one a staged `dot` writes its computed
    /// `a` operand into ([`PipeLoop::a_stages`]).
    pub(in crate::lower) fn stage_ptr(&mut self, key: Inst) -> Result<Option<PointerValue<'ctx>>> {
        let Some(&(stage, ring_off, stage_bytes)) = self.loops.pipe_stage.get(&key) else { return Ok(None) };
        let ring = self.ring_base()?;
        let off = self.b.build_int_mul(stage, self.i32c(stage_bytes as i64), "")?;
        let off = self.b.build_int_add(off, self.i32c(ring_off as i64), "")?;
        // SAFETY: the stage lies inside the ring region reserved at the bottom of shared memory.
        Ok(Some(unsafe { self.b.build_in_bounds_gep(self.ctx.i8_type(), ring, &[off], "")? }))
    }

    /// `a < b` for the loop bound comparison (signed or unsigned).
    pub(in crate::lower) fn iv_less(
        &self,
        signed: bool,
        a: IntValue<'ctx>,
        b: IntValue<'ctx>,
    ) -> Result<IntValue<'ctx>> {
        let pred = if signed { IntPredicate::SLT } else { IntPredicate::ULT };
        Ok(self.b.build_int_compare(pred, a, b, "")?)
    }
}
