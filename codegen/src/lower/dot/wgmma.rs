//! `dot` on Hopper's warpgroup tensor cores: `wgmma.mma_async` (sm_90a).
//!
//! Used for the `dot`s the pipeline confirmed (`pipeline/`): both operands
//! are `cp.async`-pipelined into ring stages of 128-byte swizzle atoms
//! (`pipeline::atom_index`), which is the canonical `wgmma` shared-memory
//! layout with 128-byte swizzling, so the tensor cores read them in place
//! through matrix descriptors: no `ldmatrix`, no operand registers.
//!
//! Shapes (`plan::wgmma_shape`): warpgroup `g` (warps `4g..4g+3`) computes
//! rows `64g..64g+63` of the `[M, N]` accumulator with one
//! `wgmma.mma_async.sync.aligned.m64nNk16` per 16-wide `k` step. Its D
//! fragment is the `mma.sync` C fragment repeated over `N / 8` column tiles,
//! warp `w` holding rows `16w..16w+15`: exactly the [`MmaLayout`] with every
//! warp along `M` (`tile_m = 16`, register `4j + r` of column tile `j`), so
//! the accumulator's conversions, elementwise math and stores are shared
//! with the `mma.sync` path.
//!
//! Operands:
//! - `a` (`[M, K]`, K-major): the warpgroup's 64 rows start `64g * 128`
//!   bytes into each 64-column block; k step `kk` is 32 bytes into block
//!   `kk / 4` (`kk mod 4` of the four k steps of a 128-byte row). The
//!   hardware applies the swizzle to the final address bits, which is why
//!   stages are 1024-byte aligned. Stride between 8-row atoms (SBO): 1024.
//! - `b` staged `[K, N]` (N-major, `imm-trans-b = 1`): k step `kk` starts
//!   at row `16 kk` (`kk * 2048` bytes); the 64-column blocks of `N` are
//!   `K * 128` bytes apart (LBO), 8-row atoms along `K` 1024 (SBO).
//! - `b = permute(x)` with `x` staged `[N, K]` (K-major, like `a`).
//! - `a` computed by the loop body from loads (a dequantized weight tile,
//!   `pipeline::Pipeline::wgmma_staged`): each thread writes its registers
//!   into the iteration's stage of the operand's own ring in the same
//!   atoms (16-byte `st.shared`), fences them for the async proxy
//!   (`fence.proxy.async`), and one barrier later the tensor cores read
//!   the stage like a pipelined `a`. Compared with register A (staging,
//!   `ldmatrix` into fragments, which must stay untouched until the group
//!   is done), this needs no A registers and lets the deferred group run
//!   on while the next tile is computed (the swapped dequant GEMM). The
//!   fence waits for the thread's outstanding loads (ptxas emits
//!   `MEMBAR.ALL.CTA`), so loads issued just before it are waited for
//!   there.
//! - `a` computed from an earlier product of the body (attention's
//!   probabilities) stays register A: its accumulator registers are the
//!   fragments.
//!
//! Synchronisation per `dot`: `wgmma.fence` (the accumulator registers
//! were last written by ordinary instructions), the k steps, one
//! `commit_group`, and a wait before the result is first used: the block
//! lowering (`Lowerer::lower_block`) keeps the committed groups pending and,
//! before the first instruction that reads one of their results (or any
//! instruction with regions), waits with `wait_group n`, `n` the number of
//! newer groups that may keep running (so what lies between, another
//! product's issue or unrelated math, overlaps the tensor cores); nothing
//! stays pending past the end of the block. A deferred loop-carried
//! accumulator (`pipeline/`) instead waits with `wait_group 1` at once:
//! its group runs on while the next iteration waits for its copies, and the
//! loop waits for the last one at its exit; a deferred group whose A
//! fragments are formed in the body is not waited for in its iteration: the
//! next one waits (`wait_group 0`) just before it loads its own fragments
//! into the same registers. The fence and the wait take the
//! accumulator registers (and A fragments computed for the product) as
//! tied operands, so LLVM cannot move a read or write of them across
//! either. The copies that filled the stage are ordered before the
//! async-proxy reads by a `fence.proxy.async` ahead of the loop's barrier
//! (`control.rs`).
//!
//! FP8 operands (`e4m3`/`e5m2`, `dot::plan`): `m64nNk32` steps, each 32
//! bytes of K like a 16-bit step, so the descriptors walk the rows exactly
//! as above with `K` counted in 16-bit units; both operands K-major from
//! rings (the instruction has no transpose).
//!
//! Numerics: as `mma.sync` (exact products, f32 accumulation in the tensor
//! core's order).

use super::super::Lowerer;
use super::super::assign::a_from_regs;
use super::super::pipeline::Rows;
use super::super::plan::WgmmaA;
use super::mma::AFrags;
use crate::Result;
use crate::fragment::{MmaLayout, ROW_PAD, RegLayout};
use dsl_core::dtype::DType;
use dsl_core::ir::ops::ControlOp;
use dsl_core::ir::{Block, Inst, Op, Value};
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValueEnum, IntValue, PointerValue};

/// The swizzle-mode field of a matrix descriptor: 128-byte swizzling.
const SWIZZLE_128B: u64 = 1;

/// Bytes between consecutive 8-row swizzle atoms along a block's rows.
const ATOM_BYTES: u64 = 1024;

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    /// Lowers a `dot` the pipeline confirmed for `wgmma`, with accumulator layout `l`.
    pub(super) fn lower_dot_wgmma(
        &mut self,
        inst: Inst,
        l: MmaLayout,
        a_src: WgmmaA,
        deferred: bool,
    ) -> Result<()> {
        let args = self.args(inst);
        let res = self.result(inst, 0)?;
        let aty = self.f.ty(args[0]).clone();
        let d = aty.dtype();
        // `k` in 16-bit units: an FP8 k step covers 32 elements, the same
        // 32 bytes of each row as a 16-bit one's 16 (`dot::plan::k_units`).
        let (m, k, n) = (l.m, super::plan::k_units(aty.shape[1], d), l.n);
        let staged = a_src == WgmmaA::Staged;
        let rs = a_src == WgmmaA::Registers;
        if l.warps_m * 16 != m || l.warps_n != 1 || n > 256 || !k.is_multiple_of(if rs { 16 } else { 64 }) {
            return Err(self.bug(inst, "wgmma layout"));
        }
        let b_nk = self.plan.mma.b_trans.contains_key(&inst);
        if d.is_f8() && (a_src != WgmmaA::Ring || !b_nk) {
            return Err(self.bug(inst, "an FP8 wgmma reads both operands K-major from rings"));
        }
        // A zero accumulator is never read: the first k step scales it by 0.
        let zero_acc = self.f.as_constant(args[2]).is_some_and(|s| s.as_f64() == 0.0);
        let acc = if zero_acc {
            vec![self.ctx.f32_type().get_undef().into(); l.regs()]
        } else {
            self.regs_as(args[2], RegLayout::Mma(l))?
        };
        // `a`: A fragments in registers (this warp's 16 rows), or this
        // warpgroup's 64 rows of its pipelined stage.
        let hoisted = rs && self.loops.afrags.contains_key(&(args[0], l));
        // A deferred group whose A fragments are formed here: the previous
        // iteration's group still reads its own fragments, whose registers
        // these reuse, so it is waited for just before they are loaded (what
        // precedes, the math forming `a` and its staging, overlaps it).
        let late_wait = rs && !hoisted && deferred;
        let mut acc = acc;
        let a = if rs {
            let wait = if late_wait { Some(&mut acc) } else { None };
            AOperand::Regs(self.a_frags_rs(inst, &l, k, d, wait)?)
        } else {
            let resident =
                if matches!(a_src, WgmmaA::Resident(_)) { self.resident_ptr(args[0])? } else { None };
            let a_ring = if let Some(at) = resident {
                at
            } else if staged {
                let Some(stage) = self.stage_ptr(inst)? else {
                    return Err(self.bug(inst, "wgmma a has no staging ring"));
                };
                self.stage_a_atoms(stage, args[0])?;
                stage
            } else {
                let Some((a_ring, _)) = self.pipe_operand(inst, 0)? else {
                    return Err(self.bug(inst, "wgmma a is not pipelined"));
                };
                a_ring
            };
            let wg = self.b.build_right_shift(self.tid, self.i32c(7), false, "")?;
            let a_rows = self.b.build_int_mul(wg, self.i32c(64 * 128), "")?;
            let a_addr = self.b.build_int_add(self.shared_addr(a_ring)?, a_rows, "")?;
            AOperand::Desc(self.matrix_desc(a_addr, 16, ATOM_BYTES)?)
        };
        let Some((b_ring, _)) = self.pipe_operand(inst, 1)? else {
            return Err(self.bug(inst, "wgmma b is not pipelined"));
        };
        let b_addr = self.shared_addr(b_ring)?;
        let b_desc = if b_nk {
            self.matrix_desc(b_addr, 16, ATOM_BYTES)?
        } else {
            self.matrix_desc(b_addr, (k * 128) as u64, ATOM_BYTES)?
        };
        // Byte offset of k step `kk` in a K-major operand of `rows` rows.
        let k_major = |kk: usize, rows: usize| ((kk / 4) * rows * 128 + (kk % 4) * 32) as u64;
        // Fragments computed here are tied through the fence (so they are
        // written before it) and the wait (so they live until the tensor
        // cores have read them); hoisted ones are loop-invariant.
        let a_regs: Vec<IntValue<'ctx>> = match &a {
            AOperand::Regs(fr) => fr.iter().flatten().flatten().copied().collect(),
            AOperand::Desc(_) => Vec::new(),
        };
        let fresh = if hoisted { Vec::new() } else { a_regs.clone() };
        let (mut acc, fresh) = self.wgmma_tied("wgmma.fence.sync.aligned;", &acc, &fresh)?;
        let a_regs = if hoisted { a_regs } else { fresh };
        for kk in 0..k / 16 {
            let bd = self.desc_add(b_desc, if b_nk { k_major(kk, n) } else { (kk * 16 * 128) as u64 })?;
            let a_k = match a {
                AOperand::Desc(ad) => AStep::Desc(self.desc_add(ad, k_major(kk, m))?),
                AOperand::Regs(_) => AStep::Regs(&a_regs[4 * kk..4 * kk + 4]),
            };
            let accumulate = !(zero_acc && kk == 0);
            acc = self.wgmma(d, n, a_k, bd, !b_nk, accumulate, &acc)?;
        }
        self.asm("wgmma.commit_group.sync.aligned;", "~{memory}", &[])?;
        if deferred {
            // A deferred group keeps running into the next iteration; the one
            // before it must be done (its stage is refilled next, `pipeline/`).
            // Register A fragments formed here were loaded after the
            // previous group was waited for (above), so this group is left
            // running with no wait: the next iteration waits for it before
            // it loads its own fragments.
            let acc = if late_wait {
                acc
            } else {
                self.wgmma_tied("wgmma.wait_group.sync.aligned 1;", &acc, &[])?.0
            };
            self.set(res, acc);
        } else {
            // Waited for before the first use of the result (or the end of
            // the block): what runs in between overlaps the tensor cores.
            self.set(res, acc);
            let a_regs = if hoisted { Vec::new() } else { a_regs };
            self.loops.wgmma_pending.push(PendingWgmma { value: res, a_regs });
        }
        Ok(())
    }

    /// Before instruction `inst` of the block being lowered: when it uses
    /// the result of a pending `wgmma` group (or has regions, which could
    /// use anything), waits until that group and all older ones are done
    /// (`wait_group` with the number of newer pending groups), ties their
    /// accumulators and A fragments through the wait and makes the blocked
    /// copies their results need.
    pub(crate) fn wgmma_wait_for(&mut self, inst: Inst) -> Result<()> {
        if self.loops.wgmma_pending.is_empty() {
            return Ok(());
        }
        let f = self.f;
        let nested = !f.insts[inst].regions.is_empty();
        let reads = |v: Value| f.insts[inst].args.contains(&v);
        let Some(idx) = self.loops.wgmma_pending.iter().rposition(|p| nested || reads(p.value)) else {
            return Ok(());
        };
        self.wgmma_wait_upto(idx)
    }

    /// The arguments of `block`, when it is a `for` body, that carry a
    /// `wgmma` product of the previous iteration (its `yield` passes a
    /// product of the body that is not deferred, so the group was waited
    /// for before the iteration ended).
    pub(crate) fn carried_products(&self, block: Block) -> Vec<Value> {
        let f = self.f;
        let Some(owner) = f.blocks[block].parent.and_then(|r| f.regions[r].parent) else { return Vec::new() };
        let Some(&y) = f.blocks[block].insts.last() else { return Vec::new() };
        if !matches!(f.insts[owner].op, Op::Control(ControlOp::For)) {
            return Vec::new();
        }
        let pipe = &self.plan.pipe;
        let product =
            |v: Value| f.def_inst(v).is_some_and(|d| pipe.wgmma.contains(&d) && !pipe.deferred.contains(&d));
        f.insts[y]
            .args
            .iter()
            .enumerate()
            .filter(|&(_, &v)| product(v))
            .filter_map(|(k, _)| f.blocks[block].args.get(k + 1).copied())
            .collect()
    }

    /// Before instruction `inst`: ties the registers of the carried
    /// products it reads (see [`Lowerer::carried_products`]; each is taken
    /// off `carried`) through a `wait_group` that leaves this iteration's
    /// groups running. The previous iteration's group is done already;
    /// without the explicit wait ptxas cannot tell across the loop's back
    /// edge and its single-thread copy issue, and serializes every `wgmma`
    /// of the function. With it, scaling the previous product overlaps the
    /// groups issued before it (the block-scaled FP8 product).
    pub(crate) fn wgmma_tie_carried(&mut self, inst: Inst, carried: &mut Vec<Value>) -> Result<()> {
        // A `dot` accumulating into it ties its registers itself; with no
        // group of this iteration issued yet, ptxas needs no help (the
        // rescaled attention accumulator).
        let d = &self.f.insts[inst];
        if carried.is_empty() || matches!(d.op, Op::Dot(_)) || self.loops.wgmma_pending.is_empty() {
            return Ok(());
        }
        let reads: Vec<Value> = carried.iter().copied().filter(|v| d.args.contains(v)).collect();
        if reads.is_empty() {
            return Ok(());
        }
        carried.retain(|v| !reads.contains(v));
        let newer = self.loops.wgmma_pending.len();
        for v in reads {
            let regs = self.raw_regs(v)?;
            let (tied, _) =
                self.wgmma_tied(&format!("wgmma.wait_group.sync.aligned {newer};"), &regs, &[])?;
            self.set(v, tied);
        }
        Ok(())
    }

    /// Waits for every pending `wgmma` group (at the end of a block).
    pub(crate) fn wgmma_wait_all(&mut self) -> Result<()> {
        match self.loops.wgmma_pending.len() {
            0 => Ok(()),
            n => self.wgmma_wait_upto(n - 1),
        }
    }

    /// Waits for pending groups `0..=idx` (`wait_group` leaves the newer
    /// ones running) and rebinds their results to the tied registers.
    fn wgmma_wait_upto(&mut self, idx: usize) -> Result<()> {
        let newer = self.loops.wgmma_pending.len() - idx - 1;
        let done: Vec<PendingWgmma<'ctx>> = self.loops.wgmma_pending.drain(..=idx).collect();
        let mut acc = Vec::new();
        let mut lens = Vec::with_capacity(done.len());
        let mut ints = Vec::new();
        for p in &done {
            let regs = self.raw_regs(p.value)?;
            lens.push(regs.len());
            acc.extend(regs);
            ints.extend(p.a_regs.iter().copied());
        }
        let (acc, _) = self.wgmma_tied(&format!("wgmma.wait_group.sync.aligned {newer};"), &acc, &ints)?;
        let mut at = 0;
        for (p, r) in done.iter().zip(lens) {
            self.set(p.value, acc[at..at + r].to_vec());
            at += r;
            self.materialize_blocked(p.value)?;
        }
        Ok(())
    }

    /// The A fragments of a register-A `wgmma` (`m64nNk16` takes the
    /// `mma.sync` A fragment of each warp's 16 rows): already in registers,
    /// or `ldmatrix`ed from `a`'s pipelined stage, or staged once here.
    /// With `wait`, every pending group is waited for (`wait_group 0`, the
    /// accumulator `wait` tied through it) right before the fragments are
    /// loaded.
    fn a_frags_rs(
        &mut self,
        inst: Inst,
        l: &MmaLayout,
        k: usize,
        d: DType,
        wait: Option<&mut Vec<BasicValueEnum<'ctx>>>,
    ) -> Result<AFrags<'ctx>> {
        let wait_all = |lw: &Self, acc: Option<&mut Vec<BasicValueEnum<'ctx>>>| -> Result<()> {
            if let Some(acc) = acc {
                *acc = lw.wgmma_tied("wgmma.wait_group.sync.aligned 0;", acc, &[])?.0;
            }
            Ok(())
        };
        let a = self.f.insts[inst].args[0];
        if a_from_regs(self.plan.lays.lay(a), l) || self.loops.afrags.contains_key(&(a, *l)) {
            wait_all(self, wait)?;
            let Some(fr) = self.a_frags_ready(inst, l, k, d)? else {
                return Err(self.bug(inst, "A fragments not ready"));
            };
            return Ok(fr);
        }
        if let Some((ring, rows)) = self.pipe_operand(inst, 0)? {
            wait_all(self, wait)?;
            return self.a_frags(ring, 0, l, k, rows);
        }
        let smem = self.smem((l.m * (k + ROW_PAD) * 2) as u64)?;
        self.barrier()?;
        self.stage_a(smem, 0, self.f.insts[inst].args[0])?;
        self.barrier()?;
        wait_all(self, wait)?;
        self.a_frags(smem, 0, l, k, Rows::Padded)
    }

    /// Writes the computed `a` operand `v` into this iteration's stage of
    /// its ring (`pipeline::PipeLoop::a_stages`) in swizzle atoms, fences the
    /// writes for the async proxy and waits for every thread's: the tensor
    /// cores then read the stage in place. No barrier comes before the
    /// writes: the group that last read the stage is one ring turn old, and
    /// was waited for (`wait_group 1` of the next iteration at the latest)
    /// before the barrier that opens the iteration that refills its loads'
    /// stage of the same index.
    fn stage_a_atoms(&mut self, stage: PointerValue<'ctx>, v: Value) -> Result<()> {
        let ty = self.f.ty(v).clone();
        let lv = self.layout(&ty);
        let regs = self.regs(v)?;
        self.stage_atoms(stage, &lv, &regs, ty.shape[0], ty.shape[1], ty.dtype())?;
        self.fence_proxy_async()?;
        self.barrier()
    }

    /// The 32-bit shared-window address of `p`.
    fn shared_addr(&self, p: PointerValue<'ctx>) -> Result<IntValue<'ctx>> {
        Ok(self.b.build_ptr_to_int(p, self.ctx.i32_type(), "")?)
    }

    /// A `wgmma` matrix descriptor (i64) for the operand at shared address
    /// `addr`: start address, leading and stride byte offsets (all in
    /// 16-byte units), 128-byte swizzling, base offset 0.
    fn matrix_desc(&self, addr: IntValue<'ctx>, lbo: u64, sbo: u64) -> Result<IntValue<'ctx>> {
        let i64t = self.ctx.i64_type();
        let start = self.b.build_right_shift(addr, self.i32c(4), false, "")?;
        let start = self.b.build_and(start, self.i32c(0x3fff), "")?;
        let start = self.b.build_int_z_extend(start, i64t, "")?;
        let fields = ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (SWIZZLE_128B << 62);
        Ok(self.b.build_or(start, i64t.const_int(fields, false), "")?)
    }

    /// `desc` with its start address advanced by `bytes` (shared memory is
    /// below 256 KiB, so the 14-bit field never carries).
    fn desc_add(&self, desc: IntValue<'ctx>, bytes: u64) -> Result<IntValue<'ctx>> {
        if bytes == 0 {
            return Ok(desc);
        }
        Ok(self.b.build_int_add(desc, self.ctx.i64_type().const_int(bytes >> 4, false), "")?)
    }

    /// The inline-assembly statement `text` (with side effects and a memory
    /// clobber) taking the f32 registers `acc` and the 32-bit registers
    /// `ints` as tied in/out operands: LLVM can move no read or write of
    /// them across it.
    pub(crate) fn wgmma_tied(
        &self,
        text: &str,
        acc: &[BasicValueEnum<'ctx>],
        ints: &[IntValue<'ctx>],
    ) -> Result<(Vec<BasicValueEnum<'ctx>>, Vec<IntValue<'ctx>>)> {
        let (r, q) = (acc.len(), ints.len());
        let outs: Vec<&str> = std::iter::repeat_n("=f", r).chain(std::iter::repeat_n("=r", q)).collect();
        let ins: Vec<String> = (0..r + q).map(|i| i.to_string()).collect();
        let cons = format!("{},{},~{{memory}}", outs.join(","), ins.join(","));
        let f32t: BasicTypeEnum<'ctx> = self.ctx.f32_type().into();
        let i32t: BasicTypeEnum<'ctx> = self.ctx.i32_type().into();
        let mut fields = vec![f32t; r];
        fields.extend(std::iter::repeat_n(i32t, q));
        let st = self.ctx.struct_type(&fields, false).into();
        let mut ops: Vec<BasicValueEnum<'ctx>> = acc.to_vec();
        ops.extend(ints.iter().map(|&x| BasicValueEnum::from(x)));
        let v = self.asm_value(text, &cons, st, &ops, true)?;
        let all = self.unpack(v, r + q)?;
        let ints = all[r..].iter().map(|x| x.into_int_value()).collect();
        Ok((all[..r].to_vec(), ints))
    }

    /// One `wgmma.mma_async.sync.aligned.m64n{n}k16.f32` (`k32` for FP8
    /// operands) with `a` from a descriptor or four A-fragment registers
    /// and `b` from a descriptor (`trans_b`: `b` is N-major; never for FP8,
    /// whose instruction has no transpose), adding to `acc` (or, without
    /// `accumulate`, ignoring it).
    #[allow(clippy::too_many_arguments)]
    fn wgmma(
        &self,
        d: DType,
        n: usize,
        a: AStep<'_, 'ctx>,
        b: IntValue<'ctx>,
        trans_b: bool,
        accumulate: bool,
        acc: &[BasicValueEnum<'ctx>],
    ) -> Result<Vec<BasicValueEnum<'ctx>>> {
        let r = acc.len();
        debug_assert_eq!(r, n / 2);
        let (ab, kstep) = match d {
            DType::BF16 => ("bf16", 16),
            DType::F8E4M3 => ("e4m3", 32),
            DType::F8E5M2 => ("e5m2", 32),
            _ => ("f16", 16),
        };
        // The transpose immediates exist for 16-bit operands only.
        let f8 = kstep == 32;
        let regs: Vec<String> = (0..r).map(|i| format!("${i}")).collect();
        let mut ops: Vec<BasicValueEnum<'ctx>> = acc.to_vec();
        // Operand numbers: the `r` outputs, then the inputs (the `r` tied
        // accumulators first), so input `j` of `ops` is operand `r + j`.
        let a0 = 2 * r;
        let (a_text, a_cons, trans_a) = match a {
            AStep::Desc(ad) => {
                ops.push(ad.into());
                (format!("${a0}"), ",l", if f8 { "" } else { ", 0" })
            }
            AStep::Regs(fr) => {
                ops.extend(fr.iter().map(|&x| BasicValueEnum::from(x)));
                (format!("{{${}, ${}, ${}, ${}}}", a0, a0 + 1, a0 + 2, a0 + 3), ",r,r,r,r", "")
            }
        };
        let (db, s) = (r + ops.len(), r + ops.len() + 1);
        ops.extend::<[BasicValueEnum<'ctx>; 2]>([b.into(), self.i32c(i64::from(accumulate)).into()]);
        let tb = if f8 { String::new() } else { format!(", {}", u8::from(trans_b)) };
        let text = format!(
            "{{\n.reg .pred p;\nsetp.ne.b32 p, ${s}, 0;\nwgmma.mma_async.sync.aligned.m64n{n}k{kstep}.f32.{ab}.{ab} \
             {{{}}}, {a_text}, ${db}, p, 1, 1{trans_a}{tb};\n}}",
            regs.join(", "),
        );
        let cons = tied_constraints(r, &format!("{a_cons},l,r"));
        let v = self.asm_value(&text, &cons, self.acc_struct(r), &ops, true)?;
        self.unpack(v, r)
    }

    /// `{f32 x r}`.
    fn acc_struct(&self, r: usize) -> BasicTypeEnum<'ctx> {
        let f32t: BasicTypeEnum<'ctx> = self.ctx.f32_type().into();
        self.ctx.struct_type(&vec![f32t; r], false).into()
    }

    /// The `r` fields of the struct `v`.
    fn unpack(&self, v: BasicValueEnum<'ctx>, r: usize) -> Result<Vec<BasicValueEnum<'ctx>>> {
        let s = v.into_struct_value();
        (0..r).map(|i| Ok(self.b.build_extract_value(s, i as u32, "")?)).collect()
    }
}

/// A committed `wgmma` group whose result is not waited for yet.
pub(crate) struct PendingWgmma<'ctx> {
    /// The `dot`'s result (bound to the registers the tensor cores write).
    pub value: Value,
    /// A fragments computed for it, kept alive up to the wait.
    pub a_regs: Vec<IntValue<'ctx>>,
}

/// The `a` operand of a `wgmma` `dot`.
enum AOperand<'ctx> {
    /// A matrix descriptor of the warpgroup's rows of a pipelined stage.
    Desc(IntValue<'ctx>),
    /// A fragments: per k step, per m tile (one), four registers.
    Regs(AFrags<'ctx>),
}

/// The `a` of one k step.
#[derive(Clone, Copy)]
enum AStep<'r, 'ctx> {
    /// Its descriptor.
    Desc(IntValue<'ctx>),
    /// Its four A-fragment registers.
    Regs(&'r [IntValue<'ctx>]),
}

/// `=f` x `r`, the `r` inputs tied to them, then `extra`, and a memory clobber.
fn tied_constraints(r: usize, extra: &str) -> String {
    let outs = vec!["=f"; r].join(",");
    let ins: Vec<String> = (0..r).map(|i| i.to_string()).collect();
    format!("{outs},{}{extra},~{{memory}}", ins.join(","))
}
