//! `dot` on tensor cores: `mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}`
//! fed by `ldmatrix` from shared memory.
//!
//! Staging: `a` (`[M, K]`) is written row-major to shared memory with
//! [`ROW_PAD`] elements of padding per row; `b` is written either as `[K, N]`
//! (read with `ldmatrix.trans`) or, when the plan found `b = permute(x)`, as
//! `x`'s `[N, K]` (read with plain `ldmatrix`, and the permute is never
//! lowered). The 16-byte padding shifts consecutive rows by four banks, so
//! each 8-address `ldmatrix` phase is conflict-free. Each warp then loads, for
//! every 16-wide `k` step, one `ldmatrix.x4` per 16-row `m` tile (the A
//! fragment) and one `x4` per pair of 8-column `n` tiles (two B fragments),
//! and issues one `mma` per (m tile, n tile).
//!
//! The accumulator lives in [`MmaLayout`] registers. A held accumulator
//! (loop-carried, see `plan.rs`) is used and produced as is; a constant one is
//! splatted; any other goes through shared memory (`[M, N + ROW_PAD]` f32)
//! together with `a` and `b`, and a result that is not held goes back to the
//! blocked layout through the same region.
//!
//! Numerics: products of f16/bf16 are exact and accumulate in f32 on the
//! tensor core (the summation order within an instruction is the hardware's).

use super::super::{Lowerer, Regs};
use crate::Result;
use crate::layout::Layout;
use crate::mma::{MmaLayout, ROW_PAD};
use dsl_core::dtype::DType;
use dsl_core::ir::{Inst, Value};
use inkwell::types::{BasicTypeEnum, FloatType};
use inkwell::values::{BasicValue, BasicValueEnum, IntValue, PointerValue};

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    /// Lowers a planned `dot` with the accumulator layout `l`.
    pub(super) fn lower_dot_mma(&mut self, inst: Inst, l: MmaLayout) -> Result<()> {
        let args = self.args(inst);
        let res = self.result(inst, 0)?;
        let aty = self.f.ty(args[0]).clone();
        let (m, k, n) = (l.m, aty.shape[1], l.n);
        let d = aty.dtype();
        let b_src = self.mma.b_trans.get(&inst).copied();
        let hoisted = self.afrags.get(&(args[0], l)).cloned();
        let a_elems = if hoisted.is_some() { 0 } else { m * (k + ROW_PAD) };
        let b_elems = if b_src.is_some() { n * (k + ROW_PAD) } else { k * (n + ROW_PAD) };
        let (a_off, b_off) = (0u64, (a_elems * 2) as u64);
        let c_off = b_off + (b_elems * 2) as u64;
        let acc_held = self.mma.held.contains_key(&args[2]);
        let acc_const = !acc_held && self.f.as_constant(args[2]).is_some();
        let res_held = self.mma.held.contains_key(&res);
        let needs_c = !(acc_held || acc_const) || !res_held;
        let c_bytes = if needs_c { (m * (n + ROW_PAD) * 4) as u64 } else { 0 };
        let smem = self.smem(c_off + c_bytes)?;
        let et = self.mem_float(d);
        let f32t = self.ctx.f32_type();
        let acc_regs = self.regs(args[2])?;

        self.barrier()?;
        if hoisted.is_none() {
            let la = self.layout(&aty);
            let ra = self.regs(args[0])?;
            self.stage_padded(smem, a_off, &la, &ra, k, et)?;
        }
        let bv = b_src.unwrap_or(args[1]);
        let lb = self.layout_of(bv);
        let rb = self.regs(bv)?;
        self.stage_padded(smem, b_off, &lb, &rb, if b_src.is_some() { k } else { n }, et)?;
        let lc = self.layout_of(res);
        if !(acc_held || acc_const) {
            self.stage_padded(smem, c_off, &lc, &acc_regs, n, f32t)?;
        }
        self.barrier()?;
        let mut acc: Regs<'ctx> = if acc_held {
            acc_regs
        } else if acc_const {
            vec![acc_regs[0]; l.regs()]
        } else {
            self.mma_read(smem, c_off, &l)?
        };
        let afr = match hoisted {
            Some(fr) => fr,
            None => self.a_frags(smem, a_off, &l, k)?,
        };
        self.mma_loop(smem, b_off, &afr, &l, k, d, b_src.is_some(), &mut acc)?;
        if res_held {
            self.set(res, acc);
        } else {
            self.barrier()?;
            self.mma_write(smem, c_off, &l, &acc)?;
            self.barrier()?;
            let out = self.load_padded(smem, c_off, &lc, n, f32t)?;
            self.set(res, out);
        }
        Ok(())
    }

    /// Loads the A fragments of the loop-invariant operand `v` for `dot`s of
    /// layout `l` (staged through shared memory once) and records them.
    pub(crate) fn hoist_a(&mut self, v: Value, l: &MmaLayout) -> Result<()> {
        let ty = self.f.ty(v).clone();
        let k = ty.shape[1];
        let smem = self.smem((l.m * (k + ROW_PAD) * 2) as u64)?;
        let lv = self.layout(&ty);
        let regs = self.regs(v)?;
        let et = self.mem_float(ty.dtype());
        self.barrier()?;
        self.stage_padded(smem, 0, &lv, &regs, k, et)?;
        self.barrier()?;
        let fr = self.a_frags(smem, 0, l, k)?;
        self.afrags.insert((v, *l), fr);
        Ok(())
    }

    /// The A fragments of a staged `[M, K + ROW_PAD]` operand at byte `off`:
    /// per 16-wide `k` step, per m tile of this warp, the 4 registers of one
    /// `ldmatrix.x4` (rows `r8 + bit3`, columns `bit4`: matrices in a0..a3 order).
    fn a_frags(
        &mut self,
        smem: PointerValue<'ctx>,
        off: u64,
        l: &MmaLayout,
        k: usize,
    ) -> Result<Vec<Vec<Vec<IntValue<'ctx>>>>> {
        let (wm, _, lane) = self.warp_coords(l)?;
        let r8 = self.b.build_and(lane, self.i32c(7), "")?;
        let bit3 = self.lane_bit8(lane, 3)?;
        let bit4 = self.lane_bit8(lane, 4)?;
        let a_row = self.b.build_int_add(self.mad(wm, l.tile_m(), r8)?, bit3, "")?;
        let a_base = self.mad(a_row, k + ROW_PAD, bit4)?;
        let mut out = Vec::with_capacity(k / 16);
        for kk in 0..k / 16 {
            let mut per = Vec::with_capacity(l.tiles_m());
            for i in 0..l.tiles_m() {
                let c = (i * 16) * (k + ROW_PAD) + kk * 16;
                let idx = self.b.build_int_add(a_base, self.i32c(c as i64), "")?;
                per.push(self.ldmatrix(smem, off, idx, 4, false)?);
            }
            out.push(per);
        }
        Ok(out)
    }

    /// Converts `v` (blocked) to the accumulator layout `l` through shared
    /// memory, or by splatting when `v` is a constant.
    pub(crate) fn convert_to_mma(&mut self, v: Value, l: &MmaLayout) -> Result<Regs<'ctx>> {
        let regs = self.regs(v)?;
        if self.f.as_constant(v).is_some() {
            return Ok(vec![regs[0]; l.regs()]);
        }
        let smem = self.smem((l.m * (l.n + ROW_PAD) * 4) as u64)?;
        let lv = self.layout_of(v);
        self.barrier()?;
        self.stage_padded(smem, 0, &lv, &regs, l.n, self.ctx.f32_type())?;
        self.barrier()?;
        self.mma_read(smem, 0, l)
    }

    /// Converts accumulator registers of layout `l` to the blocked layout `lc`.
    pub(crate) fn convert_from_mma(
        &mut self,
        regs: &[BasicValueEnum<'ctx>],
        l: &MmaLayout,
    ) -> Result<Regs<'ctx>> {
        let smem = self.smem((l.m * (l.n + ROW_PAD) * 4) as u64)?;
        let lc = Layout::with_cap(l.m * l.n, self.threads, self.spt_cap);
        self.barrier()?;
        self.mma_write(smem, 0, l, regs)?;
        self.barrier()?;
        self.load_padded(smem, 0, &lc, l.n, self.ctx.f32_type())
    }

    /// The in-memory float type of a 16-bit input dtype.
    fn mem_float(&self, d: DType) -> FloatType<'ctx> {
        if d == DType::BF16 { self.ctx.bf16_type() } else { self.ctx.f16_type() }
    }

    /// Element `(row, col)` of a `[rows, cols + ROW_PAD]` array of `et` at
    /// byte `off`, as a pointer, with `idx = row * (cols + ROW_PAD) + col`.
    fn padded_ptr(
        &self,
        smem: PointerValue<'ctx>,
        off: u64,
        et: FloatType<'ctx>,
        idx: IntValue<'ctx>,
    ) -> Result<PointerValue<'ctx>> {
        self.smem_elem(smem, off, et.into(), idx)
    }

    /// The padded index of the first element of the chunk holding `slot`.
    fn chunk_index(
        &self,
        l: &Layout,
        base: IntValue<'ctx>,
        slot: usize,
        cols: usize,
    ) -> Result<IntValue<'ctx>> {
        let lin = self.linear_index(l, base, slot)?;
        let row = self.b.build_right_shift(lin, self.i32c(cols.trailing_zeros() as i64), false, "")?;
        let pad = self.b.build_int_mul(row, self.i32c(ROW_PAD as i64), "")?;
        Ok(self.b.build_int_add(lin, pad, "")?)
    }

    /// Pieces of at most 16 bytes that one chunk of `l` is moved in.
    fn piece(l: &Layout, et: FloatType<'ctx>) -> usize {
        let bytes = if et.get_bit_width() == 32 { 4 } else { 2 };
        l.spt.min(16 / bytes)
    }

    /// Writes blocked registers of a `[rows, cols]` tile into a padded array
    /// at byte `off` (chunks never cross a row: `spt <= cols`).
    fn stage_padded(
        &mut self,
        smem: PointerValue<'ctx>,
        off: u64,
        l: &Layout,
        regs: &[BasicValueEnum<'ctx>],
        cols: usize,
        et: FloatType<'ctx>,
    ) -> Result<()> {
        let base = self.thread_base(l)?;
        let pc = Self::piece(l, et);
        let vt = et.vec_type(pc as u32);
        for s0 in (0..regs.len()).step_by(pc) {
            let idx = self.chunk_index(l, base, s0, cols)?;
            let mut vec = vt.get_undef();
            for e in 0..pc {
                let v = regs[s0 + e].into_float_value();
                let v = if v.get_type() == et { v } else { self.b.build_float_trunc(v, et, "")? };
                vec = self.b.build_insert_element(vec, v, self.i32c(e as i64), "")?;
            }
            let p = self.padded_ptr(smem, off, et, idx)?;
            let st = self.b.build_store(p, vec)?;
            st.set_alignment((pc * (et.get_bit_width() as usize / 8)) as u32)
                .map_err(|e| crate::Error::Llvm(e.to_string()))?;
        }
        Ok(())
    }

    /// Reads blocked registers of a `[rows, cols]` tile from a padded array.
    fn load_padded(
        &mut self,
        smem: PointerValue<'ctx>,
        off: u64,
        l: &Layout,
        cols: usize,
        et: FloatType<'ctx>,
    ) -> Result<Regs<'ctx>> {
        let base = self.thread_base(l)?;
        let pc = Self::piece(l, et);
        let vt = et.vec_type(pc as u32);
        let mut out = Vec::with_capacity(l.regs());
        for s0 in (0..l.regs()).step_by(pc) {
            let idx = self.chunk_index(l, base, s0, cols)?;
            let p = self.padded_ptr(smem, off, et, idx)?;
            let v = self.b.build_load(vt, p, "")?;
            if let Some(i) = v.as_instruction_value() {
                i.set_alignment((pc * (et.get_bit_width() as usize / 8)) as u32)
                    .map_err(|e| crate::Error::Llvm(e.to_string()))?;
            }
            for e in 0..pc {
                out.push(self.b.build_extract_element(v.into_vector_value(), self.i32c(e as i64), "")?);
            }
        }
        Ok(out)
    }

    /// `(warp mod warps_m, warp / warps_m, lane)` of this thread.
    fn warp_coords(&self, l: &MmaLayout) -> Result<(IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>)> {
        let warp = self.b.build_right_shift(self.tid, self.i32c(5), false, "warp")?;
        let lane = self.b.build_and(self.tid, self.i32c(31), "lane")?;
        let wm = self.b.build_and(warp, self.i32c(l.warps_m as i64 - 1), "")?;
        let wn = self.b.build_right_shift(warp, self.i32c(l.warps_m.trailing_zeros() as i64), false, "")?;
        Ok((wm, wn, lane))
    }

    /// `x * c + y` on i32 values with constant `c`.
    fn mad(&self, x: IntValue<'ctx>, c: usize, y: IntValue<'ctx>) -> Result<IntValue<'ctx>> {
        let p = self.b.build_int_mul(x, self.i32c(c as i64), "")?;
        Ok(self.b.build_int_add(p, y, "")?)
    }

    /// `((lane >> shift) & 1) * 8`.
    fn lane_bit8(&self, lane: IntValue<'ctx>, shift: i64) -> Result<IntValue<'ctx>> {
        let s = self.b.build_right_shift(lane, self.i32c(shift), false, "")?;
        let s = self.b.build_and(s, self.i32c(1), "")?;
        Ok(self.b.build_left_shift(s, self.i32c(3), "")?)
    }

    /// The padded index of this thread's accumulator register 0 (row `g`,
    /// column `2t` of its warp tile) in a `[M, N + ROW_PAD]` array.
    fn mma_base(&self, l: &MmaLayout) -> Result<IntValue<'ctx>> {
        let (wm, wn, lane) = self.warp_coords(l)?;
        let g = self.b.build_right_shift(lane, self.i32c(2), false, "")?;
        let t2 = self.b.build_left_shift(self.b.build_and(lane, self.i32c(3), "")?, self.i32c(1), "")?;
        let row = self.mad(wm, l.tile_m(), g)?;
        let col = self.mad(wn, l.tile_n(), t2)?;
        self.mad(row, l.n + ROW_PAD, col)
    }

    /// The constant index offset of accumulator pair `pair` (registers
    /// `2 * pair`, `2 * pair + 1`) from [`Lowerer::mma_base`].
    fn mma_pair_offset(l: &MmaLayout, pair: usize) -> usize {
        let (tile, half) = (pair / 2, pair % 2);
        let (i, j) = (tile / l.tiles_n(), tile % l.tiles_n());
        (i * 16 + 8 * half) * (l.n + ROW_PAD) + j * 8
    }

    /// Reads accumulator registers of layout `l` from a padded f32 array.
    fn mma_read(&mut self, smem: PointerValue<'ctx>, off: u64, l: &MmaLayout) -> Result<Regs<'ctx>> {
        let base = self.mma_base(l)?;
        let f32t = self.ctx.f32_type();
        let vt = f32t.vec_type(2);
        let mut out = Vec::with_capacity(l.regs());
        for pair in 0..l.regs() / 2 {
            let idx = self.b.build_int_add(base, self.i32c(Self::mma_pair_offset(l, pair) as i64), "")?;
            let p = self.padded_ptr(smem, off, f32t, idx)?;
            let v = self.b.build_load(vt, p, "")?;
            if let Some(i) = v.as_instruction_value() {
                i.set_alignment(8).map_err(|e| crate::Error::Llvm(e.to_string()))?;
            }
            for e in 0..2 {
                out.push(self.b.build_extract_element(v.into_vector_value(), self.i32c(e), "")?);
            }
        }
        Ok(out)
    }

    /// Writes accumulator registers of layout `l` into a padded f32 array.
    fn mma_write(
        &mut self,
        smem: PointerValue<'ctx>,
        off: u64,
        l: &MmaLayout,
        regs: &[BasicValueEnum<'ctx>],
    ) -> Result<()> {
        let base = self.mma_base(l)?;
        let f32t = self.ctx.f32_type();
        let vt = f32t.vec_type(2);
        for pair in 0..l.regs() / 2 {
            let idx = self.b.build_int_add(base, self.i32c(Self::mma_pair_offset(l, pair) as i64), "")?;
            let p = self.padded_ptr(smem, off, f32t, idx)?;
            let mut v = vt.get_undef();
            for e in 0..2 {
                v = self.b.build_insert_element(v, regs[2 * pair + e], self.i32c(e as i64), "")?;
            }
            let st = self.b.build_store(p, v)?;
            st.set_alignment(8).map_err(|e| crate::Error::Llvm(e.to_string()))?;
        }
        Ok(())
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
    fn mma16816(
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
        acc: &mut Regs<'ctx>,
    ) -> Result<()> {
        let (_, wn, lane) = self.warp_coords(l)?;
        let r8 = self.b.build_and(lane, self.i32c(7), "")?;
        let bit3 = self.lane_bit8(lane, 3)?;
        let bit4 = self.lane_bit8(lane, 4)?;
        // B as [N, K]: rows wn * tile_n + r8 + bit4 (n), columns bit3 (k).
        // B as [K, N]: rows r8 + bit3 (k), columns wn * tile_n + bit4 (n).
        let b_base = if b_nk {
            let nrow = self.b.build_int_add(self.mad(wn, l.tile_n(), r8)?, bit4, "")?;
            self.mad(nrow, k + ROW_PAD, bit3)?
        } else {
            let krow = self.b.build_int_add(r8, bit3, "")?;
            let ncol = self.b.build_int_add(
                self.b.build_int_mul(wn, self.i32c(l.tile_n() as i64), "")?,
                bit4,
                "",
            )?;
            self.mad(krow, l.n + ROW_PAD, ncol)?
        };
        let (tm, tn) = (l.tiles_m(), l.tiles_n());
        // A lone n tile (`tile_n == 8`) loads with `x2`, which reads the
        // addresses of lanes 0-15 only; the others still get in-bounds ones.
        let b_base = if tn == 1 {
            let hi =
                self.b.build_int_mul(bit4, self.i32c(if b_nk { (k + ROW_PAD) as i64 } else { 1 }), "")?;
            self.b.build_int_sub(b_base, hi, "")?
        } else {
            b_base
        };
        for (kk, afr) in afrags.iter().enumerate().take(k / 16) {
            debug_assert_eq!(afr.len(), tm);
            // One pair of n tiles at a time: its B fragments, then its mmas.
            for j0 in (0..tn).step_by(2) {
                let c = if b_nk {
                    (j0 * 8) * (k + ROW_PAD) + kk * 16
                } else {
                    (kk * 16) * (l.n + ROW_PAD) + j0 * 8
                };
                let idx = self.b.build_int_add(b_base, self.i32c(c as i64), "")?;
                let count = if j0 + 1 < tn { 4 } else { 2 };
                let r = self.ldmatrix(smem, b_off, idx, count, !b_nk)?;
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
}
