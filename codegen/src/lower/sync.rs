//! The synchronisation between programs: ordered loads and stores,
//! `wait_until` and `prefetch_l2` (see `dsl_core::ir::ops::memory`).
//!
//! Ordered accesses are inline PTX with a memory clobber and side effects
//! (`ld.acquire.gpu.global.b32`, `st.release.gpu.global.b64`, ...), so LLVM
//! neither removes, merges, hoists nor reorders them with other memory
//! accesses, whatever its NVPTX backend does with atomic loads and stores.
//!
//! A program is one logical thread, so an ordering is the program's, not
//! only that of the threads that execute the instruction:
//! - An ordered load is performed by the owner threads only (one thread for
//!   a scalar) and its value reaches the replicas through shared memory
//!   (`owners_to_replicas`), so every thread of the program sees the same
//!   value of a flag. An acquire is followed by a CTA barrier (the broadcast
//!   has one): the producer's release synchronises with the owner's acquire,
//!   the barrier orders the owner's acquire before every other thread's
//!   later accesses, and causality order is transitive, so every thread sees
//!   what the producer released.
//! - A release store is preceded by a CTA barrier, then the owner threads
//!   store with `st.release`. The barrier makes every thread's earlier
//!   writes happen before the owners' release (`bar.sync` is morally strong
//!   within the CTA), and a release is cumulative (it publishes what its
//!   thread has observed, not only its own writes), so a program that
//!   acquires the stored value sees all of them; one elected thread's
//!   `st.release.gpu` after `bar.sync` is CUTLASS's semaphore release. A
//!   separate `fence.acq_rel.gpu` would add nothing: `st.release` is a
//!   release fence and a relaxed store in one.
//! - `wait_until` is one elected thread (the scalar's owner, thread 0)
//!   spinning on `ld.<sem>.<scope>` until the comparison holds, sleeping
//!   with `nanosleep` between reads (16 ns doubling up to 64 ns, so a long
//!   wait does not steal issue slots from the programs it waits for), then a
//!   CTA barrier, after which the whole program proceeds with the acquire
//!   ordering described above. Every read is an acquire (on Hopper a strong
//!   load and an L1 invalidation) rather than relaxed reads and one
//!   `fence.acq_rel` after the last: that fence is a `MEMBAR` that waits for
//!   the thread's loads in flight, such as a persistent task's weights
//!   issued before its wait (see BENCHMARKS.md). The loop is a real loop in
//!   the LLVM IR whose load is a side-effecting asm statement, so it is
//!   neither hoisted nor folded into an infinite loop LLVM could assume
//!   away.
//! - `wait_load` is every thread reading its own lanes (replicas too, so no
//!   broadcast and no barrier is needed: every copy of a line that passes
//!   holds the same data) with `ld.relaxed.<scope>.global.b64`, in a loop
//!   that leaves once every active lane's high half is the flag and
//!   otherwise sleeps with the same backoff as `wait_until`. A 64-bit
//!   access is single-copy atomic, so a line that passes carries the
//!   producer's data; the threads of a program leave the loop at different
//!   times, which needs no ordering because each uses only its own lanes.
//! - `prefetch_l2` issues `prefetch.global.L2` at the first address of each
//!   owner thread's run of contiguous elements (the vector width the axis
//!   analysis proves, as for a load), guarded by the mask; prefetches of one
//!   line by several threads cost no registers and are merged by the memory
//!   system. On sm_90a a whole unmasked tile the axis analysis proves
//!   contiguous and 16-byte aligned, of a multiple of 16 bytes, is one
//!   `cp.async.bulk.prefetch.L2.global` by thread 0 instead.

use super::{Lowerer, Regs, elem_bytes, mem_type};
use crate::Result;
use crate::llvm::int_predicate;
use crate::target::Target;
use dsl_core::dtype::{DType, Elem};
use dsl_core::ir::ops::{CmpPred, MemOrder, MemScope, MemSem};
use dsl_core::ir::{Inst, Op};
use inkwell::IntPredicate;
use inkwell::basic_block::BasicBlock;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValueEnum, IntValue, PhiValue};

/// The first nanosleep of a wait, in nanoseconds.
const SLEEP_MIN_NS: u64 = 16;
/// The longest nanosleep of a wait, in nanoseconds.
const SLEEP_MAX_NS: u64 = 64;

/// The PTX qualifiers of an ordering: `.acquire.gpu`, `.relaxed.sys`, ...
fn qualifiers(o: MemOrder) -> String {
    let sem = match o.sem {
        MemSem::Relaxed => "relaxed",
        MemSem::Acquire => "acquire",
        MemSem::Release => "release",
        MemSem::AcqRel => "acq_rel",
    };
    let scope = match o.scope {
        MemScope::Gpu => "gpu",
        MemScope::Cta => "cta",
        MemScope::Sys => "sys",
    };
    format!(".{sem}.{scope}")
}

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    /// The integer type and PTX register constraint of a 32- or 64-bit element.
    fn word(&self, d: DType) -> (inkwell::types::IntType<'ctx>, &'static str, u32) {
        if d.bits() == 64 { (self.ctx.i64_type(), "l", 64) } else { (self.ctx.i32_type(), "r", 32) }
    }

    /// One strong load of the element of dtype `d` at `p`, as a register.
    fn strong_load(&self, p: BasicValueEnum<'ctx>, d: DType, o: MemOrder) -> Result<BasicValueEnum<'ctx>> {
        let (it, c, bits) = self.word(d);
        let a = self.b.build_ptr_to_int(p.into_pointer_value(), self.ctx.i64_type(), "")?;
        let text = format!("ld{}.global.b{bits} $0, [$1];", qualifiers(o));
        let r = self.asm_value(&text, &format!("={c},l,~{{memory}}"), it.into(), &[a.into()], true)?;
        let et: BasicTypeEnum<'ctx> = mem_type(self.ctx, Elem::Scalar(d));
        Ok(self.b.build_bit_cast(r, et, "")?)
    }

    /// One strong store of the register `v` of dtype `d` at `p`.
    fn strong_store(
        &self,
        p: BasicValueEnum<'ctx>,
        v: BasicValueEnum<'ctx>,
        d: DType,
        o: MemOrder,
    ) -> Result<()> {
        let (it, c, bits) = self.word(d);
        let a = self.b.build_ptr_to_int(p.into_pointer_value(), self.ctx.i64_type(), "")?;
        let w = self.b.build_bit_cast(self.reg_to_mem(v, d)?, it, "")?;
        let text = format!("st{}.global.b{bits} [$0], $1;", qualifiers(o));
        self.asm(&text, &format!("l,{c},~{{memory}}"), &[a.into(), w])
    }

    /// An ordered `load` (see the module documentation).
    pub(super) fn lower_ordered_load(&mut self, inst: Inst, o: MemOrder) -> Result<()> {
        let args = self.args(inst);
        let Op::Memory(op) = &self.f.insts[inst].op else { return Err(self.bug(inst, "not a load")) };
        let ops = op.load_operands(&args).ok_or_else(|| self.bug(inst, "load operands"))?;
        let pty = self.f.ty(ops.ptr).clone();
        let (d, l) = (pty.dtype(), self.layout(&pty));
        let p = self.regs(ops.ptr)?;
        let m = match ops.mask {
            Some(m) => Some(self.regs(m)?),
            None => None,
        };
        let other: Regs<'ctx> = if let Some(o) = ops.other {
            self.regs(o)?
        } else {
            vec![self.const_scalar(dsl_core::Scalar::zero(d)); p.len()]
        };
        let owner = self.owner_pred(&l)?;
        let mut out = Vec::with_capacity(p.len());
        for s in 0..p.len() {
            let cond = match (m.as_ref().map(|m| m[s].into_int_value()), owner) {
                (Some(x), Some(y)) => Some(self.b.build_and(x, y, "")?),
                (x, None) => x,
                (None, y) => y,
            };
            let pv = p[s];
            out.push(match cond {
                None => self.strong_load(pv, d, o)?,
                Some(c) => self.guarded(c, |lw| Ok(vec![lw.strong_load(pv, d, o)?]), &other[s..s + 1])?[0],
            });
        }
        let out = self.owners_to_replicas(&l, Elem::Scalar(d), out)?;
        if o.sem == MemSem::Acquire && !l.replicated() {
            self.barrier()?;
        }
        self.set(self.result(inst, 0)?, out);
        Ok(())
    }

    /// An ordered `store` (see the module documentation).
    pub(super) fn lower_ordered_store(&mut self, inst: Inst, o: MemOrder, has_mask: bool) -> Result<()> {
        let args = self.args(inst);
        let pty = self.f.ty(args[0]).clone();
        let (d, l) = (pty.dtype(), self.layout(&pty));
        let p = self.regs(args[0])?;
        let vals = self.regs(args[1])?;
        let m = if has_mask { Some(self.regs(args[2])?) } else { None };
        let owner = self.owner_pred(&l)?;
        if o.sem == MemSem::Release {
            self.barrier()?;
        }
        for s in 0..p.len() {
            let cond = match (m.as_ref().map(|m| m[s].into_int_value()), owner) {
                (Some(x), Some(y)) => Some(self.b.build_and(x, y, "")?),
                (x, None) => x,
                (None, y) => y,
            };
            let (pv, v) = (p[s], vals[s]);
            match cond {
                None => self.strong_store(pv, v, d, o)?,
                Some(c) => self.if_then(c, |lw| lw.strong_store(pv, v, d, o))?,
            }
        }
        Ok(())
    }

    /// `wait_until` (see the module documentation).
    pub(super) fn lower_wait(&mut self, inst: Inst, cmp: CmpPred, o: MemOrder) -> Result<()> {
        let args = self.args(inst);
        let pty = self.f.ty(args[0]).clone();
        let (d, l) = (pty.dtype(), self.layout(&pty));
        let p = self.regs(args[0])?[0];
        let want = self.regs(args[1])?[0].into_int_value();
        match self.owner_pred(&l)? {
            Some(c) => self.if_then(c, |lw| lw.spin(p, want, d, cmp, o))?,
            None => self.spin(p, want, d, cmp, o)?,
        }
        self.barrier()
    }

    /// The spin loop of `wait_until`: read `*p`, leave when `read cmp want`,
    /// else sleep (exponential backoff) and read again.
    fn spin(
        &mut self,
        p: BasicValueEnum<'ctx>,
        want: IntValue<'ctx>,
        d: DType,
        cmp: CmpPred,
        o: MemOrder,
    ) -> Result<()> {
        let i32t = self.ctx.i32_type();
        let (entry, [head, sleep, done]) = self.enter_loop(["wait", "wait_sleep", "wait_done"])?;
        let ns = self.b.build_phi(i32t, "ns")?;
        let seen = self.strong_load(p, d, o)?.into_int_value();
        let pred = int_predicate(cmp, d.is_signed_int());
        let holds = self.b.build_int_compare(pred, seen, want, "holds")?;
        self.b.build_conditional_branch(holds, done, sleep)?;
        self.backoff(ns, entry, head, sleep)?;
        self.b.position_at_end(done);
        Ok(())
    }

    /// The sleep block of a spin loop entered from `entry` at `head`, whose
    /// phi `ns` is the next sleep: sleep `ns`, double it up to the cap,
    /// read again.
    fn backoff(
        &mut self,
        ns: PhiValue<'ctx>,
        entry: BasicBlock<'ctx>,
        head: BasicBlock<'ctx>,
        sleep: BasicBlock<'ctx>,
    ) -> Result<()> {
        let i32t = self.ctx.i32_type();
        self.b.position_at_end(sleep);
        let cur = ns.as_basic_value().into_int_value();
        self.asm("nanosleep.u32 $0;", "r,~{memory}", &[cur.into()])?;
        let doubled = self.b.build_int_mul(cur, i32t.const_int(2, false), "")?;
        let cap = i32t.const_int(SLEEP_MAX_NS, false);
        let small = self.b.build_int_compare(IntPredicate::ULT, doubled, cap, "")?;
        let next = self.b.build_select(small, doubled, cap, "")?.into_int_value();
        self.b.build_unconditional_branch(head)?;
        ns.add_incoming(&[(&i32t.const_int(SLEEP_MIN_NS, false), entry), (&next, sleep)]);
        Ok(())
    }

    /// `wait_load` (see the module documentation).
    pub(super) fn lower_wait_load(&mut self, inst: Inst, has_mask: bool, scope: MemScope) -> Result<()> {
        let args = self.args(inst);
        let p = self.regs(args[0])?;
        let flag = self.regs(args[1])?[0].into_int_value();
        let m = if has_mask { Some(self.regs(args[2])?) } else { None };
        let o = MemOrder { sem: MemSem::Relaxed, scope };
        let (i32t, i64t) = (self.ctx.i32_type(), self.ctx.i64_type());
        let zero: BasicValueEnum<'ctx> = i64t.const_zero().into();
        let (entry, [head, sleep, done]) =
            self.enter_loop(["wait_load", "wait_load_sleep", "wait_load_done"])?;
        let ns = self.b.build_phi(i32t, "ns")?;
        let mut all = self.ctx.bool_type().const_all_ones();
        let mut lines = Vec::with_capacity(p.len());
        for (s, &pv) in p.iter().enumerate() {
            let on = m.as_ref().map(|m| m[s].into_int_value());
            let line = match on {
                None => self.strong_load(pv, DType::I64, o)?,
                Some(c) => self.guarded(c, |lw| Ok(vec![lw.strong_load(pv, DType::I64, o)?]), &[zero])?[0],
            };
            let hi = self.b.build_right_shift(line.into_int_value(), i64t.const_int(32, false), false, "")?;
            let hi = self.b.build_int_truncate(hi, i32t, "")?;
            let mut ok = self.b.build_int_compare(IntPredicate::EQ, hi, flag, "")?;
            if let Some(c) = on {
                ok = self.b.build_or(ok, self.b.build_not(c, "")?, "")?;
            }
            all = self.b.build_and(all, ok, "")?;
            lines.push(line);
        }
        self.b.build_conditional_branch(all, done, sleep)?;
        self.backoff(ns, entry, head, sleep)?;
        self.b.position_at_end(done);
        self.set(self.result(inst, 0)?, lines);
        Ok(())
    }

    /// `prefetch_l2` (see the module documentation).
    pub(super) fn lower_prefetch(&mut self, inst: Inst, has_mask: bool) -> Result<()> {
        let args = self.args(inst);
        let ptr = args[0];
        let pty = self.f.ty(ptr).clone();
        let (d, l) = (pty.dtype(), self.layout(&pty));
        let p = self.regs(ptr)?;
        let eb = u64::from(elem_bytes(Elem::Scalar(d)));
        let n = pty.shape.iter().product::<usize>() as u64;
        let info = self.plan.axis.get(ptr);
        let contiguous = pty.rank() == 1
            && info.contiguity.first().is_some_and(|&c| c >= n)
            && info.divisibility.first().is_some_and(|&v| v.is_multiple_of(16));
        if self.opts.target == Target::Sm90a && !has_mask && contiguous && (n * eb).is_multiple_of(16) {
            // One bulk prefetch of the whole range, by thread 0.
            let first = p[0];
            let is0 = self.b.build_int_compare(IntPredicate::EQ, self.tid, self.i32c(0), "")?;
            let bytes = self.i32c((n * eb) as i64);
            return self.if_then(is0, |lw| {
                let a = lw.b.build_ptr_to_int(first.into_pointer_value(), lw.ctx.i64_type(), "")?;
                lw.asm(
                    "cp.async.bulk.prefetch.L2.global [$0], $1;",
                    "l,r,~{memory}",
                    &[a.into(), bytes.into()],
                )?;
                Ok(())
            });
        }
        let mask = if has_mask { Some(args[1]) } else { None };
        let w = self.access_width(ptr, mask, &l);
        let m = match mask {
            Some(m) => Some(self.regs(m)?),
            None => None,
        };
        let owner = self.owner_pred(&l)?;
        for s in (0..p.len()).step_by(w) {
            let cond = match (m.as_ref().map(|m| m[s].into_int_value()), owner) {
                (Some(x), Some(y)) => Some(self.b.build_and(x, y, "")?),
                (x, None) => x,
                (None, y) => y,
            };
            let pv = p[s];
            let issue = |lw: &mut Self| -> Result<()> {
                let a = lw.b.build_ptr_to_int(pv.into_pointer_value(), lw.ctx.i64_type(), "")?;
                lw.asm("prefetch.global.L2 [$0];", "l,~{memory}", &[a.into()])?;
                Ok(())
            };
            match cond {
                None => issue(self)?,
                Some(c) => self.if_then(c, issue)?,
            }
        }
        Ok(())
    }
}
