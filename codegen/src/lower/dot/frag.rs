//! `mma.sync` products whose B fragments are read from an FP8 ring and
//! widened in registers (`pipeline::FragB`): no staging of the widened
//! tile.
//!
//! `ldmatrix` reads 16-bit lane pairs; on a tile of bytes each pair is two
//! codes. For `b = trans(x)` (`x`: `[N, K]`, the keys), matrix `m` (rows
//! `8 j .. 8 j + 7` of `x`, bytes `16 kk .. 16 kk + 15`) gives lane `(g,
//! t)` the four codes `x[8 j + g][16 kk + 4 t .. 4 t + 3]` in one register,
//! one `ldmatrix` per n tile and four `k` steps. Those fill the B
//! fragment's `k` slots `2t, 2t+1, 2t+8, 2t+9`; the A fragments are loaded
//! from padded rows in the same order (two 8-byte loads per m tile and `k`
//! step), so every `mma.sync.m16n8k16` sums the same products as the staged
//! lowering's, in a permuted slot order, which the tensor cores sum to the
//! same bits.
//!
//! For `b = x` (`[K, N]`, the values), `ldmatrix.trans` on rows `0..7` and
//! `8..15` of a `k` step and one 16-byte column chunk gives lane `(g, t)`
//! the codes of rows `2t, 2t+1` (and `2t+8, 2t+9`) at columns `2g, 2g+1`
//! in one register each. The chain widens the registers' bytes in order
//! (each 16-bit half one `cvt` on sm_90a); bytes `p` and `p + 2`, widened,
//! are the B fragment of column `2g + p`, the n tile `2c + p` of the
//! interleaved accumulator (`MmaLayout::interleaved`). The `k` slots keep
//! their order, so the A fragments are the usual ones.

use super::super::pipeline::{FragB, frag_row_bytes, frag_swizzled};
use super::super::{Lowerer, Regs};
use super::mma::AFrags;
use crate::Result;
use crate::fragment::{MmaLayout, ROW_PAD, RegLayout};
use dsl_core::dtype::DType;
use dsl_core::ir::Inst;
use inkwell::values::{BasicValue, BasicValueEnum, IntValue, PointerValue};

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    /// Lowers the planned `dot` `inst` (accumulator layout `l`) whose `b`
    /// is a [`FragB`] operand: per n tile and group of up to four `k` steps,
    /// one `ldmatrix`, the chain on its codes, then those steps' `mma`s (each
    /// accumulator tile still sums its `k` steps in order), so only one
    /// group's widened values are live at a time.
    pub(super) fn lower_dot_frag(&mut self, inst: Inst, l: MmaLayout) -> Result<()> {
        let fb = self
            .plan
            .pipe
            .frag_b
            .get(&inst)
            .cloned()
            .ok_or_else(|| self.bug(inst, "no FP8 fragment plan"))?;
        let args = self.args(inst);
        let res = self.result(inst, 0)?;
        let aty = self.f.ty(args[0]).clone();
        let (k, d) = (aty.shape[1], aty.dtype());
        let mut acc = self.regs_as(args[2], RegLayout::Mma(l))?;
        let afr = self.frag_a_operand(inst, &l, k)?;
        let lanes = self.frag_lanes(inst, &fb, &l, k)?;
        let (tn, ks) = (l.tiles_n(), k / 16);
        for j in 0..tn {
            let rows = self.frag_rows(&fb, k, &lanes, j)?;
            for q in 0..ks / lanes.count {
                let x = self.frag_group(inst, &fb, &lanes, &rows, j, q)?;
                for m in 0..lanes.count {
                    let e = &x[m * 4..m * 4 + 4];
                    let bfr = [self.pack16(e[0], e[1], d)?, self.pack16(e[2], e[3], d)?];
                    for (i, a) in afr[q * lanes.count + m].iter().enumerate() {
                        let s = (i * tn + j) * 4;
                        let out = self.mma16816(d, a, &bfr, &acc[s..s + 4])?;
                        acc[s..s + 4].copy_from_slice(&out);
                    }
                }
            }
        }
        // The copies of a later iteration that the loop deferred to this
        // `dot` (`pipeline::PendingIssue`) follow its `mma`s.
        if self.loops.pipe_pending.as_ref().is_some_and(|p| p.pl.issue_after == Some(inst)) {
            self.pipe_flush()?;
        }
        self.set(res, acc);
        Ok(())
    }

    /// The permuted A fragments of `dot` `inst`: hoisted before its loop,
    /// read from its resident rows, or staged here.
    fn frag_a_operand(&mut self, inst: Inst, l: &MmaLayout, k: usize) -> Result<AFrags<'ctx>> {
        let a = self.f.insts[inst].args[0];
        if let Some(fr) = self.loops.afrags_perm.get(&(a, *l)) {
            return Ok(fr.clone());
        }
        if let Some(&off) = self.plan.pipe.mma_resident.get(&a) {
            let base = self.smem_at(0)?;
            return self.a_frags_perm(base, off, l, k);
        }
        let smem = self.smem((l.m * (k + ROW_PAD) * 2) as u64)?;
        self.barrier()?;
        self.stage_a(smem, 0, a)?;
        self.barrier()?;
        self.a_frags_perm(smem, 0, l, k)
    }

    /// The A fragments of the `[M, K]` 16-bit operand staged in padded rows
    /// at byte `off` of `smem`, in the `k` order of [`FragB`]: for k step
    /// `kk` and m tile `i`, lane `(g, t)` loads columns `16 kk + 4 t .. + 3`
    /// of rows `g` and `g + 8` (8 bytes each), which fill the slots `2t,
    /// 2t+1` (first half) and `2t+8, 2t+9` (second half).
    pub(crate) fn a_frags_perm(
        &mut self,
        smem: PointerValue<'ctx>,
        off: u64,
        l: &MmaLayout,
        k: usize,
    ) -> Result<AFrags<'ctx>> {
        let (wm, _, lane) = self.warp_coords(l)?;
        let g = self.b.build_right_shift(lane, self.i32c(2), false, "")?;
        let t4 = self.b.build_left_shift(self.b.build_and(lane, self.i32c(3), "")?, self.i32c(2), "")?;
        let stride = k + ROW_PAD;
        let row = self.mad(wm, l.tile_m(), g)?;
        let base = self.mad(row, stride, t4)?;
        let i32t = self.ctx.i32_type();
        let v2 = i32t.vec_type(2);
        let mut out = Vec::with_capacity(k / 16);
        for kk in 0..k / 16 {
            let mut per = Vec::with_capacity(l.tiles_m());
            for i in 0..l.tiles_m() {
                let mut halves = Vec::with_capacity(2);
                for h in 0..2 {
                    let c = (i * 16 + 8 * h) * stride + kk * 16;
                    let idx = self.b.build_int_add(base, self.i32c(c as i64), "")?;
                    let p = self.smem_elem(smem, off, self.ctx.i16_type().into(), idx)?;
                    let ld = self.b.build_load(v2, p, "")?;
                    if let Some(x) = ld.as_instruction_value() {
                        x.set_alignment(8).map_err(|e| crate::Error::Llvm(e.to_string()))?;
                    }
                    let v = ld.into_vector_value();
                    let lo = self.b.build_extract_element(v, self.i32c(0), "")?.into_int_value();
                    let hi = self.b.build_extract_element(v, self.i32c(1), "")?.into_int_value();
                    halves.push((lo, hi));
                }
                per.push(vec![halves[0].0, halves[1].0, halves[0].1, halves[1].1]);
            }
            out.push(per);
        }
        Ok(out)
    }

    /// The lane terms of the fragment loads of [`FragB`] `fb` (of `dot`
    /// `inst`, layout `l`, `K = k`).
    fn frag_lanes(&mut self, inst: Inst, fb: &FragB, l: &MmaLayout, k: usize) -> Result<FragLanes<'ctx>> {
        let stage =
            self.stage_ptr(fb.codes)?.ok_or_else(|| self.bug(inst, "FP8 fragments outside their loop"))?;
        let (_, wn, lane) = self.warp_coords(l)?;
        let r8 = self.b.build_and(lane, self.i32c(7), "")?;
        let count = (k / 16).min(4);
        // The matrix a lane addresses: k step `q * count + mi`.
        let mi = self.b.build_right_shift(lane, self.i32c(3), false, "")?;
        let mi = self.b.build_and(mi, self.i32c(count as i64 - 1), "")?;
        let g = self.b.build_right_shift(lane, self.i32c(2), false, "")?;
        // The byte of matrix row `r8` of n tile 0, and the row of `g`.
        let nrow = self.mad(wn, l.tile_n(), r8)?;
        let rbase = self.b.build_int_mul(nrow, self.i32c(frag_row_bytes(k) as i64), "")?;
        let n0 = self.mad(wn, l.tile_n(), g)?;
        Ok(FragLanes { stage, r8, mi, rbase, n0, count, k })
    }

    /// The per-row values of [`FragB`] `fb` for this lane's row of n tile
    /// `j`, one register per per-row load: element `(n, c)` of a load
    /// with runs of `run` elements sits at `(n k + c) / run` of its stage,
    /// the same for the whole row as `run` is a multiple of `k`.
    fn frag_rows(
        &mut self,
        fb: &FragB,
        k: usize,
        lanes: &FragLanes<'ctx>,
        j: usize,
    ) -> Result<Vec<BasicValueEnum<'ctx>>> {
        let mut out = Vec::with_capacity(fb.rows.len());
        for &r in &fb.rows {
            let (stage, dt, run) = self.row_stage(r)?;
            let n = self.b.build_int_add(lanes.n0, self.i32c((j * 8) as i64), "")?;
            let per_row = run / k;
            let idx = if per_row == 1 {
                n
            } else {
                self.b.build_right_shift(n, self.i32c(per_row.trailing_zeros() as i64), false, "")?
            };
            let et = self.mem_ty(dt);
            let p = self.smem_elem(stage, 0, et, idx)?;
            out.push(self.load_run(p.into(), dt, 1, false, None)?[0]);
        }
        Ok(out)
    }

    /// `x`'s elements for n tile `j` and `k` steps `q * count ..` of
    /// [`FragB`] `fb` (per step, the four columns `16 kk + 4 t ..` of row
    /// `8 j + g` of the warp's rows): one `ldmatrix` of the codes, then the
    /// chain lowered on those registers, `rows` the per-row values.
    fn frag_group(
        &mut self,
        inst: Inst,
        fb: &FragB,
        lanes: &FragLanes<'ctx>,
        rows: &[BasicValueEnum<'ctx>],
        j: usize,
        q: usize,
    ) -> Result<Vec<BasicValueEnum<'ctx>>> {
        let (count, k) = (lanes.count, lanes.k);
        let row_bytes = frag_row_bytes(k);
        let i8t = self.ctx.i8_type();
        let kk = self.b.build_int_add(lanes.mi, self.i32c((q * count) as i64), "")?;
        let chunk = if frag_swizzled(k) { self.b.build_xor(kk, lanes.r8, "")? } else { kk };
        let col = self.b.build_left_shift(chunk, self.i32c(4), "")?;
        let at = self.b.build_int_add(lanes.rbase, self.i32c((j * 8 * row_bytes) as i64), "")?;
        let at = self.b.build_int_add(at, col, "")?;
        let p = self.smem_elem(lanes.stage, 0, i8t.into(), at)?;
        let words = self.ldmatrix_at(p, count as u32, false)?;
        // The codes, four to a register, low byte first.
        let mut codes = Vec::with_capacity(count * 4);
        for w in &words {
            for e in 0..4 {
                let s =
                    if e == 0 { *w } else { self.b.build_right_shift(*w, self.i32c(8 * e), false, "")? };
                codes.push(self.b.build_int_truncate(s, i8t, "")?.into());
            }
        }
        let per: Vec<Vec<BasicValueEnum<'ctx>>> = rows.iter().map(|&v| vec![v; codes.len()]).collect();
        self.frag_chain(inst, fb, codes, per)
    }

    /// `x`'s elements computed from `codes` (the FP8 tile's registers, i8)
    /// and, per per-row load of `fb`, the values of the same elements: the
    /// chain lowered on those registers (uniform operands splatted).
    fn frag_chain(
        &mut self,
        inst: Inst,
        fb: &FragB,
        codes: Vec<BasicValueEnum<'ctx>>,
        rows: Vec<Vec<BasicValueEnum<'ctx>>>,
    ) -> Result<Vec<BasicValueEnum<'ctx>>> {
        let n_elems = codes.len();
        let mut leaves = vec![(self.f.insts[fb.codes].results[0], codes)];
        for (&r, vals) in fb.rows.iter().zip(rows) {
            leaves.push((self.f.insts[r].results[0], vals));
        }
        // Uniform operands of the chain take any layout: one register each.
        let chain_results: Vec<_> = fb.chain.iter().map(|&i| self.f.insts[i].results[0]).collect();
        for &i in &fb.chain {
            for &a in &self.f.insts[i].args.clone() {
                if chain_results.contains(&a) || leaves.iter().any(|(v, _)| *v == a) {
                    continue;
                }
                let r = self.regs(a)?;
                let first = *r.first().ok_or_else(|| self.bug(i, "operand without registers"))?;
                leaves.push((a, vec![first; n_elems]));
            }
        }
        for (v, regs) in &leaves {
            self.overrides.insert(*v, regs.clone());
        }
        let mut done = Ok(());
        for &i in &fb.chain {
            if self.plan.lays.lay(self.f.insts[i].results[0]) != RegLayout::Blocked {
                done = Err(self.bug(i, "FP8 fragment math in a tensor-core layout"));
                break;
            }
            let op = self.f.insts[i].op.clone();
            if let Err(e) = self.lower_op(i, op) {
                done = Err(e);
                break;
            }
        }
        for (v, _) in &leaves {
            self.overrides.remove(v);
        }
        done?;
        let x = self.regs(fb.x)?;
        if x.len() != n_elems {
            return Err(self.bug(inst, "FP8 fragment math changed the register count"));
        }
        Ok(x)
    }

    /// The `mma`s of `dot` `inst` whose `b = x` (`[K, N]`) is a [`FragB`]
    /// operand read by `ldmatrix.trans` (`k_major` false) into the
    /// interleaved accumulator `l` (A fragments `afr` as usual, `K = k`):
    /// per 16-row `k` step, its four per-row values for this lane's rows
    /// `2t, 2t+1, 2t+8, 2t+9`, then per one or two 16-column chunks of the
    /// warp's columns one `ldmatrix.trans` (rows `0..7` and `8..15` of the
    /// step per chunk); register byte `p` and `p + 2` hold rows `2t, 2t+1`
    /// (or `2t+8, 2t+9`) of column `2g + p`, the B fragment of n tile `2c + p`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn frag_t_loop(
        &mut self,
        inst: Inst,
        fb: &FragB,
        afr: &AFrags<'ctx>,
        l: &MmaLayout,
        k: usize,
        d: DType,
        acc: &mut Regs<'ctx>,
    ) -> Result<()> {
        let n = l.n;
        let row_bytes = frag_row_bytes(n);
        let stage =
            self.stage_ptr(fb.codes)?.ok_or_else(|| self.bug(inst, "FP8 fragments outside their loop"))?;
        let (_, wn, lane) = self.warp_coords(l)?;
        let i8t = self.ctx.i8_type();
        let r8 = self.b.build_and(lane, self.i32c(7), "")?;
        let mi = self.b.build_right_shift(lane, self.i32c(3), false, "")?;
        let t = self.b.build_and(lane, self.i32c(3), "")?;
        let (tn, chunks) = (l.tiles_n(), l.tile_n() / 16);
        // Two chunks per `ldmatrix.x4` when the warp has them, else `x2`.
        let per = if chunks >= 2 { 2 } else { 1 };
        let half = self.b.build_and(mi, self.i32c(1), "")?;
        let second =
            if per == 2 { self.b.build_right_shift(mi, self.i32c(1), false, "")? } else { self.i32c(0) };
        let key0 = self.b.build_int_add(self.b.build_left_shift(half, self.i32c(3), "")?, r8, "")?;
        let chunk0 = self.mad(wn, l.tile_n() / 16, second)?;
        // The per-row loads' stages and the lane's rows `2t, 2t+1, 2t+8, 2t+9` of a step.
        let mut rstages = Vec::with_capacity(fb.rows.len());
        for &r in &fb.rows {
            let (st, dt, run) = self.row_stage(r)?;
            rstages.push((st, dt, run / n));
        }
        let t2 = self.b.build_left_shift(t, self.i32c(1), "")?;
        for (kk, afk) in afr.iter().enumerate().take(k / 16) {
            // Per per-row load, the values of rows 16 kk + (2t, 2t+1, 2t+8, 2t+9).
            let mut rows: Vec<[BasicValueEnum<'ctx>; 4]> = Vec::with_capacity(rstages.len());
            for &(st, dt, per_row) in &rstages {
                let et = self.mem_ty(dt);
                let mut v = Vec::with_capacity(4);
                for off in [0, 8] {
                    let key = self.b.build_int_add(t2, self.i32c((16 * kk + off) as i64), "")?;
                    if per_row == 1 {
                        // Rows 2t and 2t + 1 are adjacent elements of the stage.
                        let p = self.smem_elem(st, 0, et, key)?;
                        v.extend(self.load_run(p.into(), dt, 2, false, None)?);
                        continue;
                    }
                    for e in 0..2 {
                        let key = self.b.build_int_add(key, self.i32c(e), "")?;
                        let sh = self.i32c(per_row.trailing_zeros() as i64);
                        let idx = self.b.build_right_shift(key, sh, false, "")?;
                        let p = self.smem_elem(st, 0, et, idx)?;
                        v.push(self.load_run(p.into(), dt, 1, false, None)?[0]);
                    }
                }
                rows.push([v[0], v[1], v[2], v[3]]);
            }
            let key = self.b.build_int_add(key0, self.i32c((16 * kk) as i64), "")?;
            let rbase = self.b.build_int_mul(key, self.i32c(row_bytes as i64), "")?;
            for cp in 0..chunks / per {
                let chunk = self.b.build_int_add(chunk0, self.i32c((cp * per) as i64), "")?;
                let phys = if frag_swizzled(n) { self.b.build_xor(chunk, r8, "")? } else { chunk };
                let at = self.b.build_int_add(rbase, self.b.build_left_shift(phys, self.i32c(4), "")?, "")?;
                let p = self.smem_elem(stage, 0, i8t.into(), at)?;
                let words = self.ldmatrix_at(p, (2 * per) as u32, true)?;
                let byte = |lw: &Self, w: IntValue<'ctx>, e: u64| -> Result<BasicValueEnum<'ctx>> {
                    let s =
                        if e == 0 { w } else { lw.b.build_right_shift(w, lw.i32c(8 * e as i64), false, "")? };
                    Ok(lw.b.build_int_truncate(s, i8t, "")?.into())
                };
                let mut codes = Vec::with_capacity(per * 8);
                let mut vals: Vec<Vec<BasicValueEnum<'ctx>>> = vec![Vec::with_capacity(per * 8); rows.len()];
                // In register order (bytes 0..3 of the low rows' register,
                // then the high rows'), so the chain widens each register's
                // halves as they are; the B fragments pair its bytes `p`
                // and `p + 2` after the widening.
                for u in 0..per {
                    for w in [words[2 * u], words[2 * u + 1]] {
                        for e in 0..4 {
                            codes.push(byte(self, w, e)?);
                        }
                    }
                    for (v, r) in vals.iter_mut().zip(&rows) {
                        v.extend_from_slice(&[r[0], r[0], r[1], r[1], r[2], r[2], r[3], r[3]]);
                    }
                }
                let x = self.frag_chain(inst, fb, codes, vals)?;
                for u in 0..per {
                    for par in 0..2 {
                        let (lo, hi) = (&x[u * 8..u * 8 + 4], &x[u * 8 + 4..u * 8 + 8]);
                        let bfr =
                            [self.pack16(lo[par], lo[par + 2], d)?, self.pack16(hi[par], hi[par + 2], d)?];
                        let j = 2 * (cp * per + u) + par;
                        for (i, a) in afk.iter().enumerate() {
                            let s = (i * tn + j) * 4;
                            let out = self.mma16816(d, a, &bfr, &acc[s..s + 4])?;
                            acc[s..s + 4].copy_from_slice(&out);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The current stage of the per-row load `r` of a [`FragB`], its
    /// dtype and its run length (`PipeLoad::run`).
    fn row_stage(&mut self, r: Inst) -> Result<(PointerValue<'ctx>, DType, usize)> {
        let run = self.pipe_load(r)?.run;
        let dt = self.f.ty(self.f.insts[r].results[0]).dtype();
        let stage = self.stage_ptr(r)?.ok_or_else(|| self.bug(r, "per-row load outside its loop"))?;
        Ok((stage, dt, run))
    }

    /// Two 16-bit values of `d` packed low and high in an i32 (one operand
    /// register of `mma.sync`).
    pub(super) fn pack16(
        &self,
        lo: BasicValueEnum<'ctx>,
        hi: BasicValueEnum<'ctx>,
        d: DType,
    ) -> Result<IntValue<'ctx>> {
        let vt = super::super::memory::vec_type(self.mem_ty(d), 2)?;
        let v = vt.get_undef();
        let v = self.b.build_insert_element(v, lo, self.i32c(0), "")?;
        let v = self.b.build_insert_element(v, hi, self.i32c(1), "")?;
        Ok(self.b.build_bit_cast(v, self.ctx.i32_type(), "")?.into_int_value())
    }
}

/// Per-lane terms of the fragment loads of one [`FragB`] `dot`.
struct FragLanes<'ctx> {
    /// The codes' stage of this iteration.
    stage: PointerValue<'ctx>,
    /// `lane mod 8`: the matrix row this lane addresses.
    r8: IntValue<'ctx>,
    /// The matrix this lane addresses within one `ldmatrix`.
    mi: IntValue<'ctx>,
    /// The stage byte of row `r8` of the warp's first n tile.
    rbase: IntValue<'ctx>,
    /// The row of `x` this lane's B fragments hold in n tile 0 (`g`).
    n0: IntValue<'ctx>,
    /// `k` steps per `ldmatrix` (at most four).
    count: usize,
    /// `K`.
    k: usize,
}
