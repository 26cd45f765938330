//! Structured control flow: `for` becomes a loop whose header has one phi per
//! register of the induction variable and every carried value; `if` becomes a
//! branch with phis at the merge; `while` becomes a header running the
//! "before" region, a conditional exit, and the "after" region as the body.
//!
//! Carried values keep the layouts `assign.rs` assigned them (a `for`'s
//! initial values are converted before the loop, the values a region yields
//! at its end), and a `for` loads the A fragments of loop-invariant `dot`
//! operands before the loop (`dot/plan.rs`) and forgets them after it.
//!
//! Invariant: conditions are scalars, so every thread takes the same path and
//! barriers inside regions stay uniform. A `for` whose bounds are signed
//! compares signed, unsigned types compare unsigned.

use super::pipeline::{PendingIssue, PipeLoop};
use super::{Lowerer, Regs};
use crate::Result;
use crate::fragment::RegLayout;
use dsl_core::ir::ops::ControlOp;
use dsl_core::ir::{Inst, Region, Value};
use inkwell::IntPredicate;
use inkwell::basic_block::BasicBlock;
use inkwell::values::{BasicValue, BasicValueEnum, IntValue, PhiValue};

/// What one iteration of a `for` starts from and hands to the next.
#[derive(Clone)]
struct ForIter<'ctx> {
    /// The induction variable.
    iv: IntValue<'ctx>,
    /// The carried values.
    carried: Vec<Regs<'ctx>>,
    /// The pipeline's slice loads for the copies this iteration issues.
    fed: Vec<Regs<'ctx>>,
    /// The ring stage its `dot`s read (pipelined loops).
    stage: Option<IntValue<'ctx>>,
    /// The parity of its stage's TMA phase (TMA loads).
    parity: Option<IntValue<'ctx>>,
}

/// The parts of a `for` every iteration needs.
struct ForShape<'p, 'ctx> {
    pipe: Option<&'p PipeLoop>,
    iv_arg: Value,
    step: IntValue<'ctx>,
    ub: IntValue<'ctx>,
    signed: bool,
    body: Region,
}

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    /// One phi per register of `regs`, with `regs` flowing in from `from`.
    fn phis(&self, regs: &[Regs<'ctx>], from: BasicBlock<'ctx>) -> Result<Vec<Vec<PhiValue<'ctx>>>> {
        let mut out = Vec::new();
        for r in regs {
            let mut ps = Vec::new();
            for v in r {
                let p = self.b.build_phi(v.get_type(), "")?;
                p.add_incoming(&[(v as &dyn BasicValue<'ctx>, from)]);
                ps.push(p);
            }
            out.push(ps);
        }
        Ok(out)
    }

    /// Adds the incoming `regs` from `from` to `phis`.
    fn add_incoming(phis: &[Vec<PhiValue<'ctx>>], regs: &[Regs<'ctx>], from: BasicBlock<'ctx>) {
        for (ps, r) in phis.iter().zip(regs) {
            for (p, v) in ps.iter().zip(r) {
                p.add_incoming(&[(v as &dyn BasicValue<'ctx>, from)]);
            }
        }
    }

    /// The values of `phis`.
    fn phi_values(phis: &[Vec<PhiValue<'ctx>>]) -> Vec<Regs<'ctx>> {
        phis.iter().map(|ps| ps.iter().map(|p| p.as_basic_value()).collect()).collect()
    }

    /// Emits one iteration of a `for` at the current position: for a
    /// pipelined loop, the wait for its stage, the barrier, the prefetch of
    /// the iteration `ahead` on and the next slice loads (`pipeline/`);
    /// then the body. Returns what the next iteration starts from.
    fn for_iteration(
        &mut self,
        sh: &ForShape<'_, 'ctx>,
        lays: &[RegLayout],
        it: ForIter<'ctx>,
    ) -> Result<ForIter<'ctx>> {
        let (ivv, step, ub, signed) = (it.iv, sh.step, sh.ub, sh.signed);
        let mut next_stage = None;
        let mut next_parity = None;
        let mut fed_next: Vec<Regs<'ctx>> = Vec::new();
        if let (Some(pl), Some(rs)) = (sh.pipe, it.stage) {
            let (s, ah) = (pl.stages, pl.ahead);
            // This iteration's tiles have landed (S - 2 younger groups
            // may still fly), and every thread is done with the stage
            // read last iteration, which the prefetch below refills.
            if let Some(p) = it.parity {
                self.mbar_wait(pl, rs, p)?;
            }
            if pl.cp_async() {
                self.pipe_wait(ah - 1)?;
                if pl.wgmma {
                    // `wgmma` reads the stage through the async proxy:
                    // order this thread's landed copies before it.
                    self.fence_proxy_async()?;
                }
            }
            // The stage the prefetch refills was read last iteration: with
            // release mbarriers only the TMA leader waits for its readers
            // (below); otherwise every thread meets here.
            let release = if pl.released {
                debug_assert_eq!(ah, s - 1, "released stages are never deferred");
                // Refilling it starts phase `t / S` of the stage (t = i + S - 1)
                // and needs phase `t / S - 1` of its release barrier done: the
                // parity of this iteration's phase, flipped when `rs == 0`
                // (a fresh barrier's phase "-1", parity 1, counts as done).
                let p = it.parity.expect("released stages have landing mbarriers");
                let first = self.b.build_int_compare(IntPredicate::EQ, rs, self.i32c(0), "")?;
                let flip = self.b.build_int_z_extend(first, self.ctx.i32_type(), "")?;
                Some(self.b.build_xor(p, flip, "")?)
            } else {
                self.barrier()?;
                None
            };
            let ahead = step.get_type().const_int(ah as u64, false);
            let ivn = self.b.build_int_add(ivv, self.b.build_int_mul(step, ahead, "")?, "")?;
            let valid = self.iv_less(signed, ivn, ub)?;
            // The stage `ahead` iterations on: `(rs + ahead) mod S`.
            let ws = if ah == s - 1 {
                let first = self.b.build_int_compare(IntPredicate::EQ, rs, self.i32c(0), "")?;
                let prev = self.b.build_int_sub(rs, self.i32c(1), "")?;
                self.b.build_select(first, self.i32c(s as i64 - 1), prev, "")?.into_int_value()
            } else {
                let t = self.b.build_int_add(rs, self.i32c(ah as i64), "")?;
                let wrap = self.b.build_int_compare(IntPredicate::SGE, t, self.i32c(s as i64), "")?;
                let back = self.b.build_int_sub(t, self.i32c(s as i64), "")?;
                self.b.build_select(wrap, back, t, "")?.into_int_value()
            };
            // An `mma.sync` GEMM's loop leaves the copies to follow its
            // `dot`'s `mma`s (`pipeline::PendingIssue`).
            if pl.issue_after.is_some() {
                self.loops.pipe_pending = Some(PendingIssue {
                    pl: pl.clone(),
                    iv_arg: sh.iv_arg,
                    iv: ivn.into(),
                    valid,
                    stage: ws,
                    fed: it.fed.clone(),
                });
            } else {
                self.pipe_issue(pl, sh.iv_arg, ivn.into(), valid, ws, Some(&it.fed), release, false)?;
            }
            // The slice's loads one iteration further ahead.
            let ivf = self.b.build_int_add(ivn, step, "")?;
            let vf = self.iv_less(signed, ivf, ub)?;
            fed_next = self.pipe_feed(pl, sh.iv_arg, ivf.into(), vf)?;
            for ld in &pl.loads {
                self.loops.pipe_stage.insert(ld.load, (rs, ld.ring_off, ld.stage_bytes));
            }
            for a in &pl.a_stages {
                self.loops.pipe_stage.insert(a.dot, (rs, a.ring_off, a.stage_bytes));
            }
            let inc = self.b.build_int_add(rs, self.i32c(1), "")?;
            let wrap = self.b.build_int_compare(IntPredicate::EQ, inc, self.i32c(s as i64), "")?;
            next_stage = Some(self.b.build_select(wrap, self.i32c(0), inc, "")?.into_int_value());
            if let Some(p) = it.parity {
                let flipped = self.b.build_xor(p, self.i32c(1), "")?;
                next_parity = Some(self.b.build_select(wrap, flipped, p, "")?.into_int_value());
            }
        }
        let mut bargs = vec![vec![ivv.into()]];
        bargs.extend(it.carried);
        let carried = self.lower_region_as(sh.body, &bargs, lays)?;
        // The `dot` normally issued the deferred copies; this is a no-op then.
        self.pipe_flush()?;
        if let (Some(pl), Some(rs)) = (sh.pipe, it.stage)
            && pl.released
        {
            // Every group reading the stage was waited for in the body.
            self.mbar_release(pl, rs)?;
        }
        let iv = self.b.build_int_add(ivv, step, "")?;
        Ok(ForIter { iv, carried, fed: fed_next, stage: next_stage, parity: next_parity })
    }

    pub(super) fn lower_control(&mut self, inst: Inst, op: ControlOp) -> Result<()> {
        let args = self.args(inst);
        let results = self.f.insts[inst].results.to_vec();
        let regions = self.f.insts[inst].regions.to_vec();
        match op {
            ControlOp::For => {
                let signed = self.f.ty(args[0]).dtype().is_signed_int();
                let lb = self.regs(args[0])?[0];
                let ub = self.regs(args[1])?[0].into_int_value();
                let step = self.regs(args[2])?[0].into_int_value();
                // Carried values enter the layouts their body arguments have.
                let body_args = self.f.blocks[self.f.entry(regions[0])].args.clone();
                let lays: Vec<RegLayout> = body_args[1..].iter().map(|&b| self.plan.lays.lay(b)).collect();
                let mut init: Vec<Regs<'ctx>> = Vec::with_capacity(lays.len());
                for (&a, &lay) in args[3..].iter().zip(&lays) {
                    init.push(self.regs_as(a, lay)?);
                }
                // Loop-invariant values the body takes in another layout,
                // converted once here (`KernelPlan::convert_ahead`).
                let ahead = self.plan.convert_ahead.get(&inst).cloned().unwrap_or_default();
                for &(v, lay) in &ahead {
                    let r = self.regs_as(v, lay)?;
                    self.loops.converted.insert((v, lay), r);
                }
                // A loop with deferred `wgmma` groups runs only when it has
                // an iteration: on a path that skips it, ptxas would see the
                // initial accumulators' moves inside the exit's `wgmma`
                // pipeline stage and serialize every `wgmma` (C7515).
                let guard = match self.plan.pipe.loops.get(&inst) {
                    Some(pl) if pl.deferred() => {
                        let lbi = lb.into_int_value();
                        let runs = self.iv_less(signed, lbi, ub)?;
                        let from = self.cur_block()?;
                        let run = self.ctx.append_basic_block(self.func, "for.runs");
                        let join = self.ctx.append_basic_block(self.func, "for.join");
                        self.b.build_conditional_branch(runs, run, join)?;
                        self.b.position_at_end(run);
                        Some((from, join, init.clone()))
                    }
                    _ => None,
                };
                // Carried row sums enter as per-lane partials (`partial.rs`).
                let partial = self.plan.partials.carried.get(&inst).cloned().unwrap_or_default();
                for (k, l) in &partial {
                    init[*k] = self.quad_partials(&init[*k], l)?;
                }
                // Loop-invariant `dot` operands become A fragments here
                // (`KernelPlan::hoist`).
                let hoisted = self.plan.hoist.get(&inst).cloned().unwrap_or_default();
                for &(v, l) in &hoisted {
                    self.hoist_a(v, &l)?;
                }
                // Pipelined `dot` operands: the prologue copies the first
                // `S - 1` iterations' tiles (see `pipeline/`).
                let pipe = self.plan.pipe.loops.get(&inst).cloned();
                let iv_arg = body_args[0];
                let lbi = lb.into_int_value();
                let mut fed0: Vec<Regs<'ctx>> = Vec::new();
                if let Some(pl) = &pipe {
                    fed0 = self.pipe_prologue(pl, iv_arg, lbi, step, ub, signed)?;
                }
                let (pre, [head, body, exit]) = self.enter_loop(["for.head", "for.body", "for.exit"])?;
                let iv = self.b.build_phi(lb.get_type(), "iv")?;
                iv.add_incoming(&[(&lb as &dyn BasicValue<'ctx>, pre)]);
                let phis = self.phis(&init, pre)?;
                let fed_phis = self.phis(&fed0, pre)?;
                // The stage this iteration's `dot`s read (pipelined loops).
                let stage_phi = match &pipe {
                    Some(_) => {
                        let p = self.b.build_phi(self.ctx.i32_type(), "stage")?;
                        p.add_incoming(&[(&self.i32c(0) as &dyn BasicValue<'ctx>, pre)]);
                        Some(p)
                    }
                    None => None,
                };
                // The parity of the phase its TMA boxes complete (`tma.rs`).
                let parity_phi = match &pipe {
                    Some(pl) if pl.bars.is_some() => {
                        let p = self.b.build_phi(self.ctx.i32_type(), "parity")?;
                        p.add_incoming(&[(&self.i32c(0) as &dyn BasicValue<'ctx>, pre)]);
                        Some(p)
                    }
                    _ => None,
                };
                let ivv = iv.as_basic_value().into_int_value();
                let c = self.iv_less(signed, ivv, ub)?;
                self.b.build_conditional_branch(c, body, exit)?;
                self.b.position_at_end(body);
                let first = ForIter {
                    iv: iv.as_basic_value().into_int_value(),
                    carried: Self::phi_values(&phis),
                    fed: Self::phi_values(&fed_phis),
                    stage: stage_phi.map(|p| p.as_basic_value().into_int_value()),
                    parity: parity_phi.map(|p| p.as_basic_value().into_int_value()),
                };
                let shape = ForShape { pipe: pipe.as_ref(), iv_arg, step, ub, signed, body: regions[0] };
                let mut it = self.for_iteration(&shape, &lays, first)?;
                // An unrolled loop runs its body twice per trip, leaving
                // between the copies when the second has no iteration.
                let mut mid = None;
                if pipe.as_ref().is_some_and(|pl| pl.unroll) {
                    let more = self.iv_less(signed, it.iv, ub)?;
                    let second = self.ctx.append_basic_block(self.func, "for.body2");
                    mid = Some((self.cur_block()?, it.carried.clone()));
                    self.b.build_conditional_branch(more, second, exit)?;
                    self.b.position_at_end(second);
                    it = self.for_iteration(&shape, &lays, it)?;
                }
                let latch = self.cur_block()?;
                iv.add_incoming(&[(&it.iv as &dyn BasicValue<'ctx>, latch)]);
                Self::add_incoming(&phis, &it.carried, latch);
                Self::add_incoming(&fed_phis, &it.fed, latch);
                if let (Some(sp), Some(ns)) = (stage_phi, it.stage) {
                    sp.add_incoming(&[(&ns as &dyn BasicValue<'ctx>, latch)]);
                }
                if let (Some(pp), Some(np)) = (parity_phi, it.parity) {
                    pp.add_incoming(&[(&np as &dyn BasicValue<'ctx>, latch)]);
                }
                self.b.build_unconditional_branch(head)?;
                self.b.position_at_end(exit);
                let mut outs = match mid {
                    // The exit is reached from the head and between the copies.
                    Some((from, carried)) => {
                        let ps = self.phis(&Self::phi_values(&phis), head)?;
                        Self::add_incoming(&ps, &carried, from);
                        Self::phi_values(&ps)
                    }
                    None => Self::phi_values(&phis),
                };
                for (k, l) in &partial {
                    outs[*k] = self.warp_row_sums(&outs[*k], l)?;
                }
                // Deferred `wgmma` groups (`pipeline/`) finish before their
                // accumulators are read and before the ring is handed over.
                let body_block = self.f.entry(regions[0]);
                if let Some(&y) = self.f.blocks[body_block].insts.last() {
                    let deferred: Vec<usize> = (self.f.insts[y].args.iter().enumerate())
                        .filter(|(_, v)| {
                            self.f.def_inst(**v).is_some_and(|d| self.plan.pipe.deferred.contains(&d))
                        })
                        .map(|(i, _)| i)
                        .collect();
                    for i in deferred {
                        outs[i] = self.wgmma_tied("wgmma.wait_group.sync.aligned 0;", &outs[i], &[])?.0;
                    }
                }
                if let Some(pl) = &pipe {
                    self.pipe_epilogue(pl)?;
                }
                // The fragments dominate only this loop: later `dot`s stage again.
                for key in &hoisted {
                    self.loops.afrags.remove(key);
                    self.loops.afrags_perm.remove(key);
                }
                for key in &ahead {
                    self.loops.converted.remove(key);
                }
                if let Some((from, join, init)) = guard {
                    let end = self.cur_block()?;
                    self.b.build_unconditional_branch(join)?;
                    self.b.position_at_end(join);
                    let ps = self.phis(&outs, end)?;
                    Self::add_incoming(&ps, &init, from);
                    outs = Self::phi_values(&ps);
                }
                for (r, regs) in results.iter().zip(outs) {
                    self.set(*r, regs);
                }
            }
            ControlOp::If => {
                let c = self.regs(args[0])?[0].into_int_value();
                let then_bb = self.ctx.append_basic_block(self.func, "if.then");
                let else_bb = self.ctx.append_basic_block(self.func, "if.else");
                let merge = self.ctx.append_basic_block(self.func, "if.end");
                self.b.build_conditional_branch(c, then_bb, else_bb)?;
                self.b.position_at_end(then_bb);
                let want: Vec<RegLayout> = results.iter().map(|&r| self.plan.lays.lay(r)).collect();
                let tv = self.lower_region_as(regions[0], &[], &want)?;
                let tend = self.cur_block()?;
                self.b.build_unconditional_branch(merge)?;
                self.b.position_at_end(else_bb);
                let ev = self.lower_region_as(regions[1], &[], &want)?;
                let eend = self.cur_block()?;
                self.b.build_unconditional_branch(merge)?;
                self.b.position_at_end(merge);
                for (i, r) in results.iter().enumerate() {
                    let (t, e) = match (tv.get(i), ev.get(i)) {
                        (Some(t), Some(e)) => (t, e),
                        _ => return Err(self.bug(inst, "branches yield fewer values than results")),
                    };
                    let mut regs: Vec<BasicValueEnum<'ctx>> = Vec::with_capacity(t.len());
                    for (a, b) in t.iter().zip(e) {
                        let p = self.b.build_phi(a.get_type(), "")?;
                        p.add_incoming(&[
                            (a as &dyn BasicValue<'ctx>, tend),
                            (b as &dyn BasicValue<'ctx>, eend),
                        ]);
                        regs.push(p.as_basic_value());
                    }
                    self.set(*r, regs);
                }
            }
            ControlOp::While => {
                let init: Vec<Regs<'ctx>> = args.iter().map(|&a| self.regs(a)).collect::<Result<_>>()?;
                let (pre, [head, body, exit]) =
                    self.enter_loop(["while.head", "while.body", "while.exit"])?;
                let phis = self.phis(&init, pre)?;
                let cond = self.lower_region(regions[0], &Self::phi_values(&phis))?;
                let Some((c, fwd)) = cond.split_first() else {
                    return Err(self.bug(inst, "`condition` without operands"));
                };
                let c = c[0].into_int_value();
                let fwd = fwd.to_vec();
                self.b.build_conditional_branch(c, body, exit)?;
                self.b.position_at_end(body);
                let next = self.lower_region(regions[1], &fwd)?;
                let latch = self.cur_block()?;
                Self::add_incoming(&phis, &next, latch);
                self.b.build_unconditional_branch(head)?;
                self.b.position_at_end(exit);
                for (r, regs) in results.iter().zip(fwd) {
                    self.set(*r, regs);
                }
            }
            ControlOp::Yield | ControlOp::Condition => {
                return Err(self.bug(inst, "terminator outside the end of a region"));
            }
        }
        Ok(())
    }
}
