//! `dot` on tensor cores: `mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}`
//! fed by `ldmatrix` from shared memory or straight from registers.
//!
//! Staging: `a` (`[M, K]`) is written row-major to shared memory with
//! [`ROW_PAD`] elements of padding per row; `b` is written either as `[K, N]`
//! (read with `ldmatrix.trans`) or, when the plan found `b = permute(x)`, as
//! `x`'s `[N, K]` (read with plain `ldmatrix`, and the permute is never
//! lowered). The 16-byte padding shifts consecutive rows by four banks, so
//! each 8-address `ldmatrix` phase is conflict-free. Operands the pipeline
//! copied into its ring stages are read in place; stages with rows of 128
//! bytes or more are XOR-swizzled instead of padded (`pipeline::swizzled`),
//! and the `ldmatrix` addresses XOR their column chunk with the row's phase. Each warp then loads, for
//! every 16-wide `k` step, one `ldmatrix.x4` per 16-row `m` tile (the A
//! fragment) and one `x4` per pair of 8-column `n` tiles (two B fragments),
//! and issues one `mma` per (m tile, n tile).
//!
//! An `a` held in an accumulator layout is staged from those registers.
//! `a` is not staged at all when its A fragments are already in registers: loaded
//! once before a loop for a loop-invariant operand (`hoist_a`), or, when
//! `a` is held in an accumulator layout whose warps own whole rows with the
//! same split of `M` (`assign::a_from_regs`), packed from those registers:
//! the C fragments of two adjacent 8-column n tiles are exactly the A
//! fragment of one 16-wide k step (FlashAttention-2's `p` never leaves the
//! registers).
//!
//! The accumulator operand is taken in the [`MmaLayout`] (converted when it
//! lives elsewhere, splatted when uniform) and the result stays there; where
//! it is needed blocked, the driver makes the copy (`assign.rs`).
//!
//! Numerics: products of f16/bf16 are exact and accumulate in f32 on the
//! tensor core (the summation order within an instruction is the hardware's).

use super::super::assign::a_from_regs;
use super::super::pipeline::Rows;
use super::super::{Lowerer, Regs};
use crate::Result;
use crate::fragment::{MmaLayout, ROW_PAD, RegLayout};
use dsl_core::dtype::DType;
use dsl_core::ir::{Inst, Value};
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValueEnum, IntValue, PointerValue};

/// A fragments: per 16-wide `k` step, per m tile of the warp, 4 registers.
pub(crate) type AFrags<'ctx> = Vec<Vec<Vec<IntValue<'ctx>>>>;

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    /// Lowers a planned `dot` with the accumulator layout `l`.
    pub(super) fn lower_dot_mma(&mut self, inst: Inst, l: MmaLayout) -> Result<()> {
        let args = self.args(inst);
        let res = self.result(inst, 0)?;
        let aty = self.f.ty(args[0]).clone();
        let (m, k, n) = (l.m, aty.shape[1], l.n);
        let d = aty.dtype();
        // The accumulator first: its conversion (if any) uses the scratch region.
        let mut acc = self.regs_as(args[2], RegLayout::Mma(l))?;
        let mut afr = self.a_frags_ready(inst, &l, k, d)?;
        if afr.is_none()
            && let Some(&off) = self.plan.pipe.mma_resident.get(&args[0])
        {
            // A resident `a` (`dot::resident`): its fragments are reloaded here.
            let base = self.smem_at(0)?;
            afr = Some(self.a_frags(base, off, &l, k, Rows::Padded)?);
        }
        let b_src = self.plan.mma.b_trans.get(&inst).copied();
        // A `b` formed from an FP8 ring's codes in the B fragments themselves
        // (`pipeline::FragB`, `frag.rs`): nothing to stage.
        let frag = self.plan.pipe.frag_b.get(&inst).filter(|fb| !fb.k_major).cloned();
        // Operands the pipeline already copied into shared memory (`pipeline/`).
        let a_ring = if afr.is_none() { self.pipe_operand(inst, 0)? } else { None };
        let b_ring = self.pipe_operand(inst, 1)?;
        let a_sw = a_ring.map_or(Rows::Padded, |r| r.1);
        let b_sw = b_ring.map_or(Rows::Padded, |r| r.1);
        let (a_ring, b_ring) = (a_ring.map(|r| r.0), b_ring.map(|r| r.0));
        let stage_a = afr.is_none() && a_ring.is_none();
        let a_elems = if stage_a { m * (k + ROW_PAD) } else { 0 };
        let b_elems = match (b_ring, b_src) {
            _ if frag.is_some() => 0,
            (Some(_), _) => 0,
            (None, Some(_)) => n * (k + ROW_PAD),
            (None, None) => k * (n + ROW_PAD),
        };
        let (a_off, b_off) = (0u64, (a_elems * 2) as u64);
        let smem = self.smem(b_off + (b_elems * 2) as u64)?;

        let stage_b = b_ring.is_none() && frag.is_none();
        if stage_a || stage_b {
            self.barrier()?;
            if stage_a {
                self.stage_a(smem, a_off, args[0])?;
            }
            if stage_b {
                let bv = b_src.unwrap_or(args[1]);
                let lb = self.layout_of(bv);
                let rb = self.regs(bv)?;
                self.stage_padded(smem, b_off, &lb, &rb, if b_src.is_some() { k } else { n }, d)?;
            }
            self.barrier()?;
        }
        let afr = match (afr, a_ring) {
            (Some(fr), _) => fr,
            (None, Some(ring)) => self.a_frags(ring, 0, &l, k, a_sw)?,
            (None, None) => self.a_frags(smem, a_off, &l, k, Rows::Padded)?,
        };
        if let Some(fb) = &frag {
            self.frag_t_loop(inst, fb, &afr, &l, k, d, &mut acc)?;
        } else {
            let (b_mem, b_at) = match b_ring {
                Some(ring) => (ring, 0),
                None => (smem, b_off),
            };
            self.mma_loop(b_mem, b_at, &afr, &l, k, d, b_src.is_some(), b_sw, &mut acc)?;
        }
        // The copies of a later iteration that the loop deferred to this
        // `dot` (`pipeline::PendingIssue`) follow its `mma`s.
        if self.loops.pipe_pending.as_ref().is_some_and(|p| p.pl.issue_after == Some(inst)) {
            self.pipe_flush()?;
        }
        self.set(res, acc);
        Ok(())
    }

    /// Loads the A fragments of the loop-invariant operand `v` for `dot`s of
    /// layout `l` (staged through shared memory once) and records them.
    pub(crate) fn hoist_a(&mut self, v: Value, l: &MmaLayout) -> Result<()> {
        let k = self.f.ty(v).shape[1];
        let smem = self.smem((l.m * (k + ROW_PAD) * 2) as u64)?;
        self.barrier()?;
        self.stage_a(smem, 0, v)?;
        self.barrier()?;
        // `dot`s that read B fragments from an FP8 ring take the A fragments
        // in their permuted order (`pipeline::FragB`), the others in the
        // plain one.
        let f = self.f;
        let plain =
            self.plan.mma.dots.iter().any(|(&d, dl)| {
                f.insts[d].args[0] == v && dl == l && !self.plan.pipe.frag_b.contains_key(&d)
            });
        if plain {
            let fr = self.a_frags(smem, 0, l, k, Rows::Padded)?;
            self.loops.afrags.insert((v, *l), fr);
        }
        if self.plan.pipe.frag_a.contains(&(v, *l)) {
            let fr = self.a_frags_perm(smem, 0, l, k)?;
            self.loops.afrags_perm.insert((v, *l), fr);
        }
        Ok(())
    }

    /// The A fragments of the `a` of `dot` `inst` (layout `l`, `k` columns
    /// of `d`) when they are in registers already: packed from the
    /// accumulator registers `a` was computed in (`assign::a_from_regs`),
    /// or hoisted before the loop ([`Self::hoist_a`]).
    pub(super) fn a_frags_ready(
        &mut self,
        inst: Inst,
        l: &MmaLayout,
        k: usize,
        d: DType,
    ) -> Result<Option<AFrags<'ctx>>> {
        let a = self.f.insts[inst].args[0];
        let a_lay = self.plan.lays.lay(a);
        if a_from_regs(a_lay, l) {
            let RegLayout::Mma(al) = a_lay else { return Err(self.bug(inst, "A operand layout")) };
            let regs = self.raw_regs(a)?;
            return Ok(Some(self.a_frags_from_regs(&regs, &al, k, d)?));
        }
        Ok(self.loops.afrags.get(&(a, *l)).cloned())
    }

    /// Writes the `[M, K]` operand `v` row-major with padded rows at byte
    /// `off` of `smem` (the caller fences with barriers): straight from the
    /// accumulator registers it was computed in, or from its own layout.
    pub(crate) fn stage_a(&mut self, smem: PointerValue<'ctx>, off: u64, v: Value) -> Result<()> {
        let ty = self.f.ty(v).clone();
        if let RegLayout::Mma(al) = self.plan.lays.lay(v) {
            let regs = self.raw_regs(v)?;
            self.mma_write(smem, off, &al, &regs, ty.dtype())
        } else {
            let lv = self.layout(&ty);
            let regs = self.regs(v)?;
            self.stage_padded(smem, off, &lv, &regs, ty.shape[1], ty.dtype())
        }
    }

    /// The A fragments of an `[M, K]` operand held in accumulator layout `al`
    /// (16-bit registers; `al.warps_n == 1`): for k step `kk` and m tile `i`,
    /// the register pairs of n tiles `2 kk` and `2 kk + 1`, packed as
    /// `{(g, 2t..), (g + 8, 2t..), (g, 8 + 2t..), (g + 8, 8 + 2t..)}`.
    fn a_frags_from_regs(
        &mut self,
        regs: &[BasicValueEnum<'ctx>],
        al: &MmaLayout,
        k: usize,
        d: DType,
    ) -> Result<AFrags<'ctx>> {
        let tn = al.tiles_n();
        let mut out = Vec::with_capacity(k / 16);
        for kk in 0..k / 16 {
            let mut per = Vec::with_capacity(al.tiles_m());
            for i in 0..al.tiles_m() {
                let t0 = (i * tn + 2 * kk) * 4;
                let t1 = (i * tn + 2 * kk + 1) * 4;
                per.push(vec![
                    self.pack16(regs[t0], regs[t0 + 1], d)?,
                    self.pack16(regs[t0 + 2], regs[t0 + 3], d)?,
                    self.pack16(regs[t1], regs[t1 + 1], d)?,
                    self.pack16(regs[t1 + 2], regs[t1 + 3], d)?,
                ]);
            }
            out.push(per);
        }
        Ok(out)
    }

    /// The A fragments of a staged `[M, K]` operand at byte `off` (rows
    /// padded to `K + ROW_PAD`, or XOR-swizzled, see
    /// `pipeline::swizzled`): per 16-wide `k` step, per m tile of this warp,
    /// the 4 registers of one `ldmatrix.x4` (rows `r8 + bit3`, columns
    /// `bit4`: matrices in a0..a3 order).
    pub(super) fn a_frags(
        &mut self,
        smem: PointerValue<'ctx>,
        off: u64,
        l: &MmaLayout,
        k: usize,
        rows: Rows,
    ) -> Result<AFrags<'ctx>> {
        let (wm, _, lane) = self.warp_coords(l)?;
        let r8 = self.b.build_and(lane, self.i32c(7), "")?;
        let bit3 = self.lane_bit8(lane, 3)?;
        let bit4 = self.lane_bit8(lane, 4)?;
        let a_row = self.b.build_int_add(self.mad(wm, l.tile_m(), r8)?, bit3, "")?;
        let sw = rows.swizzled();
        let stride = if sw { k } else { k + ROW_PAD };
        // Swizzled: the row's phase is `r8` (tile rows are multiples of 8),
        // and column chunk `2 kk + bit4 / 8` sits at `(2 kk) ^ t` with
        // `t = bit4 / 8 ^ r8` (the XOR touches the low three chunk bits only).
        let (a_base, t8) = if sw {
            let t8 = self.b.build_xor(bit4, self.b.build_left_shift(r8, self.i32c(3), "")?, "")?;
            (self.b.build_int_mul(a_row, self.i32c(stride as i64), "")?, Some(t8))
        } else {
            (self.mad(a_row, stride, bit4)?, None)
        };
        // In an aligned stage the lane's address for k step `kk` is one XOR
        // of its address for `kk = 0` (`xor_base`).
        let xb = match (rows, t8) {
            (Rows::SwizzledAligned, Some(t8)) if 2 * k <= 1024 => {
                Some(self.xor_base(smem, off, self.b.build_int_add(a_base, t8, "")?)?)
            }
            _ => None,
        };
        let mut out = Vec::with_capacity(k / 16);
        for kk in 0..k / 16 {
            let col = match t8 {
                Some(t8) if xb.is_none() => Some(self.b.build_xor(t8, self.i32c((kk * 16) as i64), "")?),
                _ => None,
            };
            let mut per = Vec::with_capacity(l.tiles_m());
            for i in 0..l.tiles_m() {
                if let Some(xb) = xb {
                    let p = self.xor_addr(xb, (kk * 32) as i64, ((i * 16) * stride * 2) as i64)?;
                    per.push(self.ldmatrix_at(p, 4, false)?);
                    continue;
                }
                let idx = match col {
                    Some(col) => {
                        let r = self.b.build_int_add(a_base, self.i32c(((i * 16) * stride) as i64), "")?;
                        self.b.build_int_add(r, col, "")?
                    }
                    None => {
                        self.b.build_int_add(a_base, self.i32c(((i * 16) * stride + kk * 16) as i64), "")?
                    }
                };
                per.push(self.ldmatrix(smem, off, idx, 4, false)?);
            }
            out.push(per);
        }
        Ok(out)
    }

    /// The byte address (as an integer) of 16-bit element `idx` of the
    /// aligned stage at byte `off` of `smem` (see [`Rows::SwizzledAligned`]).
    /// Computed from the stage's address, which changes with the iteration,
    /// so LLVM does not hoist the per-load XORs of [`Self::xor_addr`] out of
    /// the loop into a register each.
    fn xor_base(&self, smem: PointerValue<'ctx>, off: u64, idx: IntValue<'ctx>) -> Result<IntValue<'ctx>> {
        let i64t = self.ctx.i64_type();
        let p = self.b.build_ptr_to_int(smem, i64t, "")?;
        let p = self.b.build_int_add(p, i64t.const_int(off, false), "")?;
        let e = self.b.build_int_z_extend(self.b.build_left_shift(idx, self.i32c(1), "")?, i64t, "")?;
        Ok(self.b.build_int_add(p, e, "")?)
    }

    /// `(base ^ x) + add` as a shared-memory pointer: the address of a load
    /// whose swizzled column differs from `base`'s by the XOR `x` and whose
    /// row by the byte offset `add` (whole rows, so it commutes with the
    /// XOR of the low bits).
    fn xor_addr(&self, base: IntValue<'ctx>, x: i64, add: i64) -> Result<PointerValue<'ctx>> {
        let i64t = self.ctx.i64_type();
        let v = if x == 0 { base } else { self.b.build_xor(base, i64t.const_int(x as u64, false), "")? };
        let v = if add == 0 { v } else { self.b.build_int_add(v, i64t.const_int(add as u64, false), "")? };
        let pt = self.ctx.ptr_type(inkwell::AddressSpace::from(3u16));
        Ok(self.b.build_int_to_ptr(v, pt, "")?)
    }

    /// `((lane >> shift) & 1) * 8`.
    fn lane_bit8(&self, lane: IntValue<'ctx>, shift: i64) -> Result<IntValue<'ctx>> {
        let s = self.b.build_right_shift(lane, self.i32c(shift), false, "")?;
        let s = self.b.build_and(s, self.i32c(1), "")?;
        Ok(self.b.build_left_shift(s, self.i32c(3), "")?)
    }

    /// `ldmatrix.sync.aligned.m8n8.{x2,x4}[.trans].b16` at padded index `idx`
    /// of the 16-bit array at byte `off`; returns the 32-bit registers.
    fn ldmatrix(
        &self,
        smem: PointerValue<'ctx>,
        off: u64,
        idx: IntValue<'ctx>,
        count: u32,
        trans: bool,
    ) -> Result<Vec<IntValue<'ctx>>> {
        let p = self.smem_elem(smem, off, self.ctx.i16_type().into(), idx)?;
        self.ldmatrix_at(p, count, trans)
    }

    /// `ldmatrix.sync.aligned.m8n8.{x2,x4}[.trans].b16` at shared address `p`.
    pub(super) fn ldmatrix_at(
        &self,
        p: PointerValue<'ctx>,
        count: u32,
        trans: bool,
    ) -> Result<Vec<IntValue<'ctx>>> {
        let i32t = self.ctx.i32_type();
        let fields: Vec<BasicTypeEnum<'ctx>> = (0..count).map(|_| i32t.into()).collect();
        let st = self.ctx.struct_type(&fields, false);
        let name = format!(
            "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x{count}{}.b16.p3",
            if trans { ".trans" } else { "" }
        );
        let v = self.call1(&name, st.into(), &[p.into()])?.into_struct_value();
        (0..count).map(|i| Ok(self.b.build_extract_value(v, i, "")?.into_int_value())).collect()
    }

    /// One `mma.sync.m16n8k16` on fragments `a` (4 regs), `b` (2 regs) and
    /// accumulator `c` (4 f32), returning `d`.
    pub(super) fn mma16816(
        &self,
        d: DType,
        a: &[IntValue<'ctx>],
        b: &[IntValue<'ctx>],
        c: &[BasicValueEnum<'ctx>],
    ) -> Result<Vec<BasicValueEnum<'ctx>>> {
        let f32t = self.ctx.f32_type();
        let st = self.ctx.struct_type(&[f32t.into(); 4], false);
        let (name, conv): (&str, Option<BasicTypeEnum<'ctx>>) = if d == DType::BF16 {
            ("llvm.nvvm.mma.m16n8k16.row.col.bf16", None)
        } else {
            ("llvm.nvvm.mma.m16n8k16.row.col.f32.f32", Some(self.ctx.f16_type().vec_type(2).into()))
        };
        let mut ops: Vec<BasicValueEnum<'ctx>> = Vec::with_capacity(10);
        for &x in a.iter().chain(b) {
            ops.push(match conv {
                Some(t) => self.b.build_bit_cast(x, t, "")?,
                None => x.into(),
            });
        }
        ops.extend_from_slice(c);
        let r = self.call1(name, st.into(), &ops)?.into_struct_value();
        (0..4).map(|i| Ok(self.b.build_extract_value(r, i, "")?)).collect()
    }

    /// The fragment loads and `mma`s of one warp tile over all of `K`.
    #[allow(clippy::too_many_arguments)]
    fn mma_loop(
        &mut self,
        smem: PointerValue<'ctx>,
        b_off: u64,
        afrags: &[Vec<Vec<IntValue<'ctx>>>],
        l: &MmaLayout,
        k: usize,
        d: DType,
        b_nk: bool,
        rows: Rows,
        acc: &mut Regs<'ctx>,
    ) -> Result<()> {
        let (_, wn, lane) = self.warp_coords(l)?;
        let r8 = self.b.build_and(lane, self.i32c(7), "")?;
        let bit3 = self.lane_bit8(lane, 3)?;
        let bit4 = self.lane_bit8(lane, 4)?;
        let (tm, tn) = (l.tiles_m(), l.tiles_n());
        let addr = self.b_addr(l, k, b_nk, rows.swizzled(), (wn, r8, bit3, bit4))?;
        // In an aligned stage every B load is one XOR and one constant away
        // from the lane's first (see `xor_addr`). `[N, K]`: the column
        // (16 kk) ^ t8 is the XOR, the n-tile pair the rows added; `[K, N]`:
        // the column chunk (ncol / 8 + j0) ^ r8 = (ncol / 8 ^ r8) ^ j0 (`j0`
        // is even and below the warp tile's chunks, so its bits are disjoint
        // from `ncol / 8`'s), the k step the rows added.
        let xb = match (&addr, rows) {
            (BAddr::Swizzled { row, t8, r8x8 }, Rows::SwizzledAligned)
                if 2 * if b_nk { k } else { l.n } <= 1024 =>
            {
                let col = if b_nk { *t8 } else { self.b.build_xor(*t8, *r8x8, "")? };
                Some(self.xor_base(smem, b_off, self.b.build_int_add(*row, col, "")?)?)
            }
            _ => None,
        };
        for (kk, afr) in afrags.iter().enumerate().take(k / 16) {
            debug_assert_eq!(afr.len(), tm);
            // One pair of n tiles at a time: its B fragments, then its mmas.
            for j0 in (0..tn).step_by(2) {
                let count = if j0 + 1 < tn { 4 } else { 2 };
                let r = match xb {
                    Some(xb) => {
                        let (x, add) =
                            if b_nk { (kk * 32, (j0 * 8) * k * 2) } else { (j0 * 16, (kk * 16) * l.n * 2) };
                        let p = self.xor_addr(xb, x as i64, add as i64)?;
                        self.ldmatrix_at(p, count, !b_nk)?
                    }
                    None => {
                        let idx = self.b_index(&addr, l, k, b_nk, kk, j0)?;
                        self.ldmatrix(smem, b_off, idx, count, !b_nk)?
                    }
                };
                for (h, bfr) in r.chunks(2).enumerate() {
                    for (i, a) in afr.iter().enumerate() {
                        let s = (i * tn + j0 + h) * 4;
                        let out = self.mma16816(d, a, bfr, &acc[s..s + 4])?;
                        acc[s..s + 4].copy_from_slice(&out);
                    }
                }
            }
        }
        Ok(())
    }

    /// The lane's part of the B fragment addresses of [`Self::mma_loop`].
    /// B as `[N, K]`: rows `wn * tile_n + r8 + bit4` (n), columns `bit3`
    /// (k); B as `[K, N]`: rows `r8 + bit3` (k), columns `wn * tile_n + bit4`
    /// (n). A lone n tile (`tile_n == 8`) loads with `x2`, which reads the
    /// addresses of lanes 0-15 only; the others still get in-bounds ones
    /// (without `bit4`). With `sw` the stage is XOR-swizzled
    /// (`pipeline::swizzled`: chunk `c` of row `r` at `c ^ (r mod 8)`); every
    /// `ldmatrix` row address has phase `r8`, so each load's column chunk is
    /// XORed with `r8`.
    fn b_addr(
        &self,
        l: &MmaLayout,
        k: usize,
        b_nk: bool,
        sw: bool,
        (wn, r8, bit3, bit4): (IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>),
    ) -> Result<BAddr<'ctx>> {
        let tn = l.tiles_n();
        if sw {
            let r8x8 = self.b.build_left_shift(r8, self.i32c(3), "")?;
            // [N, K]: column chunk 2 kk + bit3 / 8, so the column is
            // (16 kk) ^ (bit3 ^ 8 r8). [K, N]: column chunk
            // wn * tile_n / 8 + j0 + bit4 / 8, XORed with r8.
            let bit4_n = if tn == 1 { self.i32c(0) } else { bit4 };
            let (row, t8) = if b_nk {
                let nrow = self.b.build_int_add(self.mad(wn, l.tile_n(), r8)?, bit4_n, "")?;
                let t8 = self.b.build_xor(bit3, r8x8, "")?;
                (self.b.build_int_mul(nrow, self.i32c(k as i64), "")?, t8)
            } else {
                let krow = self.b.build_int_add(r8, bit3, "")?;
                let ncol = self.mad(wn, l.tile_n(), bit4_n)?;
                (self.b.build_int_mul(krow, self.i32c(l.n as i64), "")?, ncol)
            };
            return Ok(BAddr::Swizzled { row, t8, r8x8 });
        }
        let b_base = if b_nk {
            let nrow = self.b.build_int_add(self.mad(wn, l.tile_n(), r8)?, bit4, "")?;
            self.mad(nrow, k + ROW_PAD, bit3)?
        } else {
            let krow = self.b.build_int_add(r8, bit3, "")?;
            let ncol = self.mad(wn, l.tile_n(), bit4)?;
            self.mad(krow, l.n + ROW_PAD, ncol)?
        };
        Ok(BAddr::Padded(if tn == 1 {
            let hi =
                self.b.build_int_mul(bit4, self.i32c(if b_nk { (k + ROW_PAD) as i64 } else { 1 }), "")?;
            self.b.build_int_sub(b_base, hi, "")?
        } else {
            b_base
        }))
    }

    /// The element index of the B fragment load of k step `kk` and n-tile
    /// pair `j0` (see [`Self::b_addr`]).
    fn b_index(
        &self,
        a: &BAddr<'ctx>,
        l: &MmaLayout,
        k: usize,
        b_nk: bool,
        kk: usize,
        j0: usize,
    ) -> Result<IntValue<'ctx>> {
        Ok(match *a {
            BAddr::Padded(base) => {
                let c = if b_nk {
                    (j0 * 8) * (k + ROW_PAD) + kk * 16
                } else {
                    (kk * 16) * (l.n + ROW_PAD) + j0 * 8
                };
                self.b.build_int_add(base, self.i32c(c as i64), "")?
            }
            BAddr::Swizzled { row, t8, .. } if b_nk => {
                let col = self.b.build_xor(t8, self.i32c((kk * 16) as i64), "")?;
                let r = self.b.build_int_add(row, self.i32c(((j0 * 8) * k) as i64), "")?;
                self.b.build_int_add(r, col, "")?
            }
            BAddr::Swizzled { row, t8, r8x8 } => {
                let col = self.b.build_int_add(t8, self.i32c((j0 * 8) as i64), "")?;
                let col = self.b.build_xor(col, r8x8, "")?;
                let r = self.b.build_int_add(row, self.i32c(((kk * 16) * l.n) as i64), "")?;
                self.b.build_int_add(r, col, "")?
            }
        })
    }
}

/// How [`Lowerer::mma_loop`] addresses the staged `b` (from [`Lowerer::b_addr`]).
enum BAddr<'ctx> {
    /// Padded rows: the lane's base index; each load adds a constant.
    Padded(IntValue<'ctx>),
    /// XOR-swizzled rows: the lane's row base, its column term and `8 r8`.
    Swizzled { row: IntValue<'ctx>, t8: IntValue<'ctx>, r8x8: IntValue<'ctx> },
}
