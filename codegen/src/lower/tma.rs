//! Tensor Memory Accelerator copies of pipelined `load_block`s (sm_90a; see
//! `crate::tensor_map` for the tensor maps and `pipeline/` for the schedule).
//!
//! Each stage of a loop with TMA loads has an mbarrier (8 bytes in the ring
//! region, `PipeLoop::bars`). Thread 0 initializes them (arrival count 1)
//! before the prologue; copying iteration `t` into stage `s = t mod S`, it
//! arrives on stage `s`'s barrier announcing the bytes of every box of that
//! stage (`expect_tx`) and issues the boxes, which complete the transaction
//! on that barrier as they land. Iteration `t` waits, in every thread, for
//! phase `(t / S) mod 2` of its stage's barrier (the loop carries that
//! parity, flipping it when the stage wraps).
//!
//! Nobody may still read a stage the next boxes overwrite. When every load
//! of the loop is a box, no `wgmma` group is deferred and the body stages
//! no `a` (`PipeLoop::released`), each stage also has a release mbarrier
//! (arrival count: every thread): a thread arrives on it at the end of its
//! iteration, when every product that read the stage was waited for, and
//! thread 0 waits for the matching phase before it refills the stage (the
//! phase before the first one counts as complete: a fresh barrier's parity
//! 1). No CTA barrier is left in the loop, so warpgroups drift apart: one
//! warpgroup's softmax overlaps the other's products (FlashAttention's
//! 8-warp tiles over 128-token pages; figures in BENCHMARKS.md).
//! Other loops keep the CTA barrier after the wait.
//!
//! At the exit, after the loop's last barrier, thread 0 invalidates the
//! mbarriers and one more barrier hands their bytes back to other uses.

use super::Lowerer;
use super::pipeline::PipeLoop;
use crate::Result;
use crate::tensor_map::{BOX_ROW_BYTES, box_cols};
use inkwell::IntPredicate;
use inkwell::values::{BasicValueEnum, IntValue};

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    /// The shared-memory address (32 bits) of the mbarrier of stage `stage` of `pl`.
    fn mbar_addr(&mut self, pl: &PipeLoop, stage: IntValue<'ctx>) -> Result<IntValue<'ctx>> {
        let bars = pl.bars.expect("a loop with TMA loads has stage mbarriers");
        let ring = self.ring_base()?;
        let base = self.b.build_ptr_to_int(ring, self.ctx.i32_type(), "")?;
        let off = self.b.build_int_add(
            self.b.build_int_mul(stage, self.i32c(8), "")?,
            self.i32c(bars as i64),
            "",
        )?;
        Ok(self.b.build_int_add(base, off, "")?)
    }

    /// The shared-memory address of the release mbarrier of stage `stage` of
    /// `pl` ([`PipeLoop::released`]): the `stages` barriers after the landing ones.
    fn release_addr(&mut self, pl: &PipeLoop, stage: IntValue<'ctx>) -> Result<IntValue<'ctx>> {
        let s = self.b.build_int_add(stage, self.i32c(pl.stages as i64), "")?;
        self.mbar_addr(pl, s)
    }

    /// The addresses of every stage's landing mbarrier of `pl`.
    fn mbar_addrs(&mut self, pl: &PipeLoop) -> Result<Vec<IntValue<'ctx>>> {
        (0..pl.stages).map(|s| self.mbar_addr(pl, self.i32c(s as i64))).collect()
    }

    /// The addresses of every stage's release mbarrier of `pl` (none unless
    /// [`PipeLoop::released`]).
    fn release_addrs(&mut self, pl: &PipeLoop) -> Result<Vec<IntValue<'ctx>>> {
        if !pl.released {
            return Ok(Vec::new());
        }
        (0..pl.stages).map(|s| self.release_addr(pl, self.i32c(s as i64))).collect()
    }

    /// `tid == 0`, the thread that drives the mbarriers and issues the boxes.
    fn tma_leader(&self) -> Result<IntValue<'ctx>> {
        Ok(self.b.build_int_compare(IntPredicate::EQ, self.tid, self.i32c(0), "")?)
    }

    /// Thread 0 applies `op` (PTX with an mbarrier's address as `$0` and
    /// `{count}` standing for its arrival count) to every stage mbarrier of
    /// `pl` (landing: one arrival, the leader's; release: every thread's),
    /// then the operand-free `tail` if any.
    fn mbar_each(&mut self, pl: &PipeLoop, op: &str, tail: Option<&str>) -> Result<()> {
        let mut addrs: Vec<(IntValue<'ctx>, usize)> =
            self.mbar_addrs(pl)?.into_iter().map(|a| (a, 1)).collect();
        let threads = self.plan.threads;
        addrs.extend(self.release_addrs(pl)?.into_iter().map(|a| (a, threads)));
        let leader = self.tma_leader()?;
        self.if_then(leader, |lw| {
            for &(a, count) in &addrs {
                let text = op.replace("{count}", &count.to_string());
                lw.asm(&text, "r,~{memory}", &[a.into()])?;
            }
            if let Some(t) = tail {
                lw.asm(t, "~{memory}", &[])?;
            }
            Ok(())
        })
    }

    /// Initializes the stage mbarriers of `pl` (thread 0; every thread must
    /// pass a barrier before using them). The fence makes the initialization
    /// visible to the async proxy (the copies' complete-tx) before any box
    /// is issued.
    pub(super) fn mbar_init(&mut self, pl: &PipeLoop) -> Result<()> {
        self.mbar_each(
            pl,
            "mbarrier.init.shared::cta.b64 [$0], {count};",
            Some("fence.mbarrier_init.release.cluster;"),
        )
    }

    /// Invalidates the stage mbarriers of `pl` (thread 0, after every thread's
    /// last wait), then a barrier: their bytes may be reused.
    pub(super) fn mbar_inval(&mut self, pl: &PipeLoop) -> Result<()> {
        self.mbar_each(pl, "mbarrier.inval.shared::cta.b64 [$0];", None)?;
        self.barrier()
    }

    /// Every thread hands stage `stage` of `pl` back (its iteration's reads
    /// of it are complete: every `wgmma` reading it was waited for): one
    /// arrival on the stage's release mbarrier ([`PipeLoop::released`]).
    pub(super) fn mbar_release(&mut self, pl: &PipeLoop, stage: IntValue<'ctx>) -> Result<()> {
        let addr = self.release_addr(pl, stage)?;
        self.asm("mbarrier.arrive.shared::cta.b64 _, [$0];", "r,~{memory}", &[addr.into()])
    }

    /// Waits (every thread) until phase `parity` (an i32, 0 or 1) of stage
    /// `stage`'s mbarrier completed: its boxes landed.
    pub(super) fn mbar_wait(
        &mut self,
        pl: &PipeLoop,
        stage: IntValue<'ctx>,
        parity: IntValue<'ctx>,
    ) -> Result<()> {
        let addr = self.mbar_addr(pl, stage)?;
        self.mbar_wait_at(addr, parity)
    }

    /// Waits until phase `parity` of the mbarrier at `addr` completed.
    fn mbar_wait_at(&mut self, addr: IntValue<'ctx>, parity: IntValue<'ctx>) -> Result<()> {
        let head = self.ctx.append_basic_block(self.func, "mbar.wait");
        let done = self.ctx.append_basic_block(self.func, "mbar.done");
        self.b.build_unconditional_branch(head)?;
        self.b.position_at_end(head);
        // `try_wait` suspends the thread for a while before it reports
        // failure, so this loop does not spin hot.
        let ok = self
            .asm_value(
                "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2; selp.b32 $0, 1, 0, p; }",
                "=r,r,r,~{memory}",
                self.ctx.i32_type().into(),
                &[addr.into(), parity.into()],
                false,
            )?
            .into_int_value();
        let landed = self.b.build_int_compare(IntPredicate::NE, ok, self.i32c(0), "")?;
        self.b.build_conditional_branch(landed, done, head)?;
        self.b.position_at_end(done);
        Ok(())
    }

    /// Issues the boxes of the TMA loads of `pl` into stage `stage` for the
    /// iteration whose tiles start at `coords` (per TMA load, in the order of
    /// `pl.loads`: its first row and column), when `valid`; thread 0 only.
    pub(super) fn tma_issue(
        &mut self,
        pl: &PipeLoop,
        stage: IntValue<'ctx>,
        valid: IntValue<'ctx>,
        coords: &[(IntValue<'ctx>, IntValue<'ctx>)],
        release: Option<IntValue<'ctx>>,
    ) -> Result<()> {
        let bar = self.mbar_addr(pl, stage)?;
        let ring = self.ring_base()?;
        let ring = self.b.build_ptr_to_int(ring, self.ctx.i32_type(), "")?;
        let mut boxes: Vec<[BasicValueEnum<'ctx>; 5]> = Vec::new();
        let mut bytes = 0u64;
        for (ld, &(row0, col0)) in pl.loads.iter().filter(|l| l.tma.is_some()).zip(coords) {
            let t = ld.tma.as_ref().expect("filtered");
            let map = self.tmaps[t.map];
            let spec = self.plan.pipe.tensor_maps[t.map];
            let stage_off = self.b.build_int_mul(stage, self.i32c(ld.stage_bytes as i64), "")?;
            let stage_at = self.b.build_int_add(ring, stage_off, "")?;
            let stage_at = self.b.build_int_add(stage_at, self.i32c(ld.ring_off as i64), "")?;
            let box_rows = spec.box_rows as usize;
            let bc = box_cols(spec.dtype) as usize;
            // Column block `cb` of the atoms holds the 128-byte column span
            // from column `bc * cb`, its rows one after another
            // (`pipeline::atom_index`).
            for cb in 0..ld.cols / bc {
                for rb in 0..ld.rows.div_ceil(box_rows) {
                    let off = (cb * ld.rows + rb * box_rows) * BOX_ROW_BYTES as usize;
                    let dst = self.b.build_int_add(stage_at, self.i32c(off as i64), "")?;
                    let c = self.b.build_int_add(col0, self.i32c((cb * bc) as i64), "")?;
                    let r = self.b.build_int_add(row0, self.i32c((rb * box_rows) as i64), "")?;
                    boxes.push([dst.into(), map.into(), c.into(), r.into(), bar.into()]);
                    bytes += spec.box_bytes() as u64;
                }
            }
        }
        let freed = match release {
            Some(parity) => Some((self.release_addr(pl, stage)?, parity)),
            None => None,
        };
        let leader = self.tma_leader()?;
        let go = self.b.build_and(valid, leader, "")?;
        self.if_then(go, |lw| {
            // Every thread is done with the stage's previous tiles.
            if let Some((addr, parity)) = freed {
                lw.mbar_wait_at(addr, parity)?;
            }
            lw.asm(
                "mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;",
                "r,r,~{memory}",
                &[bar.into(), lw.i32c(bytes as i64).into()],
            )?;
            for a in &boxes {
                lw.asm(
                    "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes \
                     [$0], [$1, {$2, $3}], [$4];",
                    "r,l,r,r,r,~{memory}",
                    a,
                )?;
            }
            Ok(())
        })
    }
}
