//! Conversions between the blocked layout and the tensor-core layouts
//! ([`RegLayout::Mma`], [`RegLayout::Row`]) through shared memory, and the padded
//! staging helpers they share with the tensor-core `dot`.
//!
//! An `[M, N]` tile is exchanged as a row-major `[M, N + ROW_PAD]` array of
//! its memory type (`i1` as a byte): blocked chunks are written and read as
//! vectors of at most 16 bytes, accumulator registers as pairs (two adjacent
//! columns). A transposed accumulator ([`RegLayout::MmaT`], `[N, M]`) is exchanged
//! as `[N, M + 16 bytes]`, its registers one by one (a pair of adjacent
//! columns of the accumulator is two rows here). A row vector is exchanged as a plain `[M]` array; every thread
//! that holds a row writes it (replicas write the same value).
//!
//! Invariant: every exchange starts with a barrier (earlier users of the
//! scratch region may still read it) and has one between writes and reads;
//! callers lower them in uniform control flow.

use super::{Lowerer, Regs, mem_type};
use crate::Result;
use crate::blocked::BlockedLayout;
use crate::fragment::{MmaLayout, ROW_PAD, RegLayout, RowLayout};
use dsl_core::dtype::{DType, Elem, Type};
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValue, BasicValueEnum, IntValue, PointerValue, VectorValue};

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    /// The in-memory type of dtype `d` (`i1` is a byte).
    pub(super) fn mem_ty(&self, d: DType) -> BasicTypeEnum<'ctx> {
        mem_type(self.ctx, Elem::Scalar(d))
    }

    /// Converts the registers of a value of type `ty` through a scratch
    /// array in shared memory (see the module documentation): from the
    /// blocked layout to `lay`, or with `to_blocked` from `lay` to blocked.
    pub(super) fn convert_blocked(
        &mut self,
        ty: &Type,
        regs: &[BasicValueEnum<'ctx>],
        lay: RegLayout,
        to_blocked: bool,
    ) -> Result<Regs<'ctx>> {
        let d = ty.dtype();
        let bytes = u64::from(super::elem_bytes(ty.elem));
        let lb = self.layout(ty);
        let elems = match lay {
            RegLayout::Blocked => return Ok(regs.to_vec()),
            RegLayout::Mma(l) => l.m * (l.n + ROW_PAD),
            RegLayout::MmaT(l) => l.n * (l.m + Self::mma_t_pad(d)),
            RegLayout::Row(r) => r.m,
        };
        let smem = self.smem(elems as u64 * bytes)?;
        self.barrier()?;
        self.scratch_access(smem, &lb, lay, d, Some(regs), !to_blocked)?;
        self.barrier()?;
        self.scratch_access(smem, &lb, lay, d, None, to_blocked)
    }

    /// Writes (`regs` given) or reads the registers (dtype `d`) of a value
    /// exchanged between blocked layout `lb` and `lay`: with `blocked` the
    /// blocked registers, else those of `lay`.
    fn scratch_access(
        &mut self,
        smem: PointerValue<'ctx>,
        lb: &BlockedLayout,
        lay: RegLayout,
        d: DType,
        regs: Option<&[BasicValueEnum<'ctx>]>,
        blocked: bool,
    ) -> Result<Regs<'ctx>> {
        let written = |r: Result<()>| r.map(|()| Vec::new());
        match (lay, blocked, regs) {
            (RegLayout::Mma(l), false, Some(regs)) => written(self.mma_write(smem, 0, &l, regs, d)),
            (RegLayout::Mma(l), false, None) => self.mma_read(smem, 0, &l, d),
            (RegLayout::MmaT(l), false, _) => self.mma_t_access(smem, &l, d, regs),
            (RegLayout::Mma(l) | RegLayout::MmaT(l), true, _) => {
                let (cols, pad) = match lay {
                    RegLayout::Mma(_) => (l.n, ROW_PAD),
                    _ => (l.m, Self::mma_t_pad(d)),
                };
                match regs {
                    Some(regs) => written(self.stage_padded_at(smem, 0, lb, regs, cols, pad, d)),
                    None => self.load_padded(smem, 0, lb, cols, pad, d),
                }
            }
            (RegLayout::Row(r), false, _) => {
                let n = regs.map_or(r.regs(), <[_]>::len);
                self.scalar_access(smem, d, n, regs, |lw, q| lw.row_index(&r, q))
            }
            (RegLayout::Row(_), true, _) => {
                let base = self.thread_base(lb)?;
                let n = regs.map_or(lb.regs(), <[_]>::len);
                self.scalar_access(smem, d, n, regs, |lw, s| lw.linear_index(lb, base, s))
            }
            (RegLayout::Blocked, ..) => unreachable!("a blocked value is not exchanged"),
        }
    }

    /// The row padding (16 bytes) of the scratch array of a transposed
    /// accumulator of dtype `d`.
    fn mma_t_pad(d: DType) -> usize {
        16 / super::elem_bytes(Elem::Scalar(d)) as usize
    }

    /// Writes (`regs` given) or reads `n` registers (dtype `d`), one scalar
    /// access each, register `s` at element `index(self, s)` of `smem`.
    fn scalar_access(
        &mut self,
        smem: PointerValue<'ctx>,
        d: DType,
        n: usize,
        regs: Option<&[BasicValueEnum<'ctx>]>,
        index: impl Fn(&Self, usize) -> Result<IntValue<'ctx>>,
    ) -> Result<Regs<'ctx>> {
        let et = self.mem_ty(d);
        let mut out = Vec::with_capacity(n);
        for s in 0..n {
            let p = self.smem_elem(smem, 0, et, index(self, s)?)?;
            match regs {
                Some(regs) => {
                    self.b.build_store(p, self.reg_to_mem(regs[s], d)?)?;
                }
                None => {
                    let v = self.b.build_load(et, p, "")?;
                    out.push(self.mem_to_reg(v, d)?);
                }
            }
        }
        Ok(out)
    }

    /// The row held in register `q` of row layout `r` by this thread:
    /// `wm * tile_m + (q / 2) * 16 + 8 * (q mod 2) + lane / 4`.
    pub(super) fn row_index(&self, r: &RowLayout, q: usize) -> Result<IntValue<'ctx>> {
        let warp = self.b.build_right_shift(self.tid, self.i32c(5), false, "")?;
        let wm = self.b.build_and(warp, self.i32c(r.warps_m as i64 - 1), "")?;
        let lane = self.b.build_and(self.tid, self.i32c(31), "")?;
        let g = self.b.build_right_shift(lane, self.i32c(2), false, "")?;
        let base = self.b.build_int_mul(wm, self.i32c(r.tile_m() as i64), "")?;
        let base = self.b.build_int_add(base, g, "")?;
        let c = (q / 2) * 16 + 8 * (q % 2);
        Ok(self.b.build_int_add(base, self.i32c(c as i64), "")?)
    }

    /// `(warp mod warps_m, warp / warps_m, lane)` of this thread.
    pub(super) fn warp_coords(
        &self,
        l: &MmaLayout,
    ) -> Result<(IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>)> {
        let warp = self.b.build_right_shift(self.tid, self.i32c(5), false, "warp")?;
        let lane = self.b.build_and(self.tid, self.i32c(31), "lane")?;
        let wm = self.b.build_and(warp, self.i32c(l.warps_m as i64 - 1), "")?;
        let wn = self.b.build_right_shift(warp, self.i32c(l.warps_m.trailing_zeros() as i64), false, "")?;
        Ok((wm, wn, lane))
    }

    /// `x * c + y` on i32 values with constant `c`.
    pub(super) fn mad(&self, x: IntValue<'ctx>, c: usize, y: IntValue<'ctx>) -> Result<IntValue<'ctx>> {
        let p = self.b.build_int_mul(x, self.i32c(c as i64), "")?;
        Ok(self.b.build_int_add(p, y, "")?)
    }

    /// The padded index of this thread's accumulator register 0 (row `g`,
    /// column `2t` of its warp tile) in a `[M, N + ROW_PAD]` array.
    fn mma_base(&self, l: &MmaLayout) -> Result<IntValue<'ctx>> {
        let (row, col) = self.mma_origin(l)?;
        self.mad(row, l.n + ROW_PAD, col)
    }

    /// The row and column of this thread's accumulator register 0 in
    /// layout `l` (its warp's tile origin plus `g = lane / 4` rows and
    /// `2 (lane mod 4)` columns); register `s` is [`MmaLayout::slot_delta`]
    /// away.
    pub(super) fn mma_origin(&self, l: &MmaLayout) -> Result<(IntValue<'ctx>, IntValue<'ctx>)> {
        let (wm, wn, lane) = self.warp_coords(l)?;
        let g = self.b.build_right_shift(lane, self.i32c(2), false, "")?;
        // `MmaLayout::lane_col`: 2 t, or 4 t with interleaved n tiles.
        let sh = if l.interleaved { 2 } else { 1 };
        let t2 = self.b.build_left_shift(self.b.build_and(lane, self.i32c(3), "")?, self.i32c(sh), "")?;
        Ok((self.mad(wm, l.tile_m(), g)?, self.mad(wn, l.tile_n(), t2)?))
    }

    /// The constant index offset of register `slot` from
    /// [`Lowerer::mma_base`].
    fn mma_slot_offset(l: &MmaLayout, slot: usize) -> usize {
        let (dr, dc) = l.slot_delta(slot);
        dr * (l.n + ROW_PAD) + dc
    }

    /// Reads accumulator registers of layout `l` (dtype `d`) from a padded array.
    pub(super) fn mma_read(
        &mut self,
        smem: PointerValue<'ctx>,
        off: u64,
        l: &MmaLayout,
        d: DType,
    ) -> Result<Regs<'ctx>> {
        let base = self.mma_base(l)?;
        let mut out: Vec<Option<BasicValueEnum<'ctx>>> = vec![None; l.regs()];
        // One vector access per pair of registers on adjacent columns.
        for (a, b) in l.column_pairs() {
            let idx = self.b.build_int_add(base, self.i32c(Self::mma_slot_offset(l, a) as i64), "")?;
            let v = self.load_vector(smem, off, idx, 2, d)?;
            out[a] = Some(v[0]);
            out[b] = Some(v[1]);
        }
        out.into_iter()
            .map(|r| r.ok_or_else(|| crate::Error::Invalid("accumulator register unread".into())))
            .collect()
    }

    /// Writes accumulator registers of layout `l` (dtype `d`) into a padded array.
    pub(super) fn mma_write(
        &mut self,
        smem: PointerValue<'ctx>,
        off: u64,
        l: &MmaLayout,
        regs: &[BasicValueEnum<'ctx>],
        d: DType,
    ) -> Result<()> {
        let base = self.mma_base(l)?;
        let et = self.mem_ty(d);
        for (a, b) in l.column_pairs() {
            let idx = self.b.build_int_add(base, self.i32c(Self::mma_slot_offset(l, a) as i64), "")?;
            let p = self.smem_elem(smem, off, et, idx)?;
            let v = self.pack(&[regs[a], regs[b]], d)?;
            self.store_vector(p, v, d)?;
        }
        Ok(())
    }

    /// Loads `n` consecutive elements (dtype `d`) at element `idx` of the
    /// array at byte `off` of `smem` in one vector access aligned to its
    /// size, as registers.
    fn load_vector(
        &mut self,
        smem: PointerValue<'ctx>,
        off: u64,
        idx: IntValue<'ctx>,
        n: usize,
        d: DType,
    ) -> Result<Regs<'ctx>> {
        let et = self.mem_ty(d);
        let vt = super::memory::vec_type(et, n as u32)?;
        let p = self.smem_elem(smem, off, et, idx)?;
        let v = self.b.build_load(vt, p, "")?;
        if let Some(i) = v.as_instruction_value() {
            let align = n as u32 * super::elem_bytes(Elem::Scalar(d));
            i.set_alignment(align).map_err(|e| crate::Error::Llvm(e.to_string()))?;
        }
        let mut out = Vec::with_capacity(n);
        for e in 0..n {
            let x = self.b.build_extract_element(v.into_vector_value(), self.i32c(e as i64), "")?;
            out.push(self.mem_to_reg(x, d)?);
        }
        Ok(out)
    }

    /// Registers `regs` (dtype `d`) as one vector of memory values.
    fn pack(&self, regs: &[BasicValueEnum<'ctx>], d: DType) -> Result<VectorValue<'ctx>> {
        let vt = super::memory::vec_type(self.mem_ty(d), regs.len() as u32)?;
        let mut v = vt.get_undef();
        for (e, &r) in regs.iter().enumerate() {
            let x = self.reg_to_mem(r, d)?;
            v = self.b.build_insert_element(v, x, self.i32c(e as i64), "")?;
        }
        Ok(v)
    }

    /// Stores the packed vector `v` (elements of dtype `d`) at `p`, aligned
    /// to its size.
    fn store_vector(&self, p: PointerValue<'ctx>, v: VectorValue<'ctx>, d: DType) -> Result<()> {
        let st = self.b.build_store(p, v)?;
        let align = v.get_type().get_size() * super::elem_bytes(Elem::Scalar(d));
        st.set_alignment(align).map_err(|e| crate::Error::Llvm(e.to_string()))?;
        Ok(())
    }

    /// Writes (`regs` given) or reads the registers of the transposed
    /// accumulator layout [`RegLayout::MmaT`] of `l` (dtype `d`) to or from a
    /// row-major `[l.n, l.m + pad]` array ([`Lowerer::mma_t_pad`]): register
    /// `(r, c)` of `l` is element `(c, r)`, one scalar access each. With
    /// `pad` 16 bytes and `l.m` a multiple of 32 words, the 32 lanes of one
    /// access hit 32 distinct banks (rows `g`, columns `2 t`: bank `g + 8 t`
    /// for 4-byte elements).
    fn mma_t_access(
        &mut self,
        smem: PointerValue<'ctx>,
        l: &MmaLayout,
        d: DType,
        regs: Option<&[BasicValueEnum<'ctx>]>,
    ) -> Result<Regs<'ctx>> {
        let (row, col) = self.mma_origin(l)?;
        let stride = l.m + Self::mma_t_pad(d);
        let base = self.mad(col, stride, row)?;
        self.scalar_access(smem, d, l.regs(), regs, |lw, slot| {
            let (dr, dc) = l.slot_delta(slot);
            Ok(lw.b.build_int_add(base, lw.i32c((dc * stride + dr) as i64), "")?)
        })
    }

    /// The staged index of the first element of the chunk holding `slot` of
    /// a `[rows, cols]` tile: rows padded by [`ROW_PAD`], or with `swizzle`
    /// (16-bit elements, `cols >= 64`) chunk `c` of row `r` at `c ^ (r mod 8)`
    /// (`pipeline::swizzled`; the XOR touches the chunk bits of the column
    /// only).
    pub(super) fn chunk_index(
        &self,
        l: &BlockedLayout,
        base: IntValue<'ctx>,
        slot: usize,
        cols: usize,
        swizzle: bool,
    ) -> Result<IntValue<'ctx>> {
        // A later round of chunks (`threads * spt` elements on) whose rows
        // have the first round's phases (whole groups of 8 rows when
        // swizzled, whole rows when padded) sits at a constant distance
        // from the first round's chunk: added last, so that LLVM keeps one
        // loop-invariant index per thread and folds the rest into the
        // address (`[reg + imm]`) instead of holding an index per chunk.
        let (round, r) = (l.threads * l.spt, slot / l.spt);
        let period = if swizzle { 8 * cols } else { cols };
        if r > 0 && round.is_multiple_of(period) {
            let first = self.chunk_index(l, base, slot % l.spt, cols, swizzle)?;
            let rows = r * round / cols;
            let k = r * round + if swizzle { 0 } else { rows * ROW_PAD };
            return Ok(self.b.build_int_nsw_add(first, self.i32c(k as i64), "")?);
        }
        if swizzle {
            let (lin, row) = self.linear_row(l, base, slot, cols)?;
            let phase = self.swizzle_phase(row)?;
            return Ok(self.b.build_xor(lin, phase, "")?);
        }
        self.padded_index(l, base, slot, cols, ROW_PAD)
    }

    /// The index of the first element of the chunk holding `slot` of a
    /// `[rows, cols]` tile whose rows are padded by `pad` elements.
    fn padded_index(
        &self,
        l: &BlockedLayout,
        base: IntValue<'ctx>,
        slot: usize,
        cols: usize,
        pad: usize,
    ) -> Result<IntValue<'ctx>> {
        let (lin, row) = self.linear_row(l, base, slot, cols)?;
        let pad = self.b.build_int_mul(row, self.i32c(pad as i64), "")?;
        Ok(self.b.build_int_add(lin, pad, "")?)
    }

    /// The linear index of register `slot` of `l` (given its thread base) and
    /// its row in a tile of `cols` columns (a power of two).
    pub(super) fn linear_row(
        &self,
        l: &BlockedLayout,
        base: IntValue<'ctx>,
        slot: usize,
        cols: usize,
    ) -> Result<(IntValue<'ctx>, IntValue<'ctx>)> {
        let lin = self.linear_index(l, base, slot)?;
        let row = self.b.build_right_shift(lin, self.i32c(cols.trailing_zeros() as i64), false, "")?;
        Ok((lin, row))
    }

    /// The XOR phase of row `row` in a 128-byte swizzle of 16-bit elements:
    /// `(row mod 8) * 8` elements (whole 16-byte chunks).
    pub(super) fn swizzle_phase(&self, row: IntValue<'ctx>) -> Result<IntValue<'ctx>> {
        let phase = self.b.build_and(row, self.i32c(7), "")?;
        Ok(self.b.build_left_shift(phase, self.i32c(3), "")?)
    }

    /// Elements per piece (at most 16 bytes) that one chunk of `l` of dtype
    /// `d` is moved in.
    pub(super) fn piece(l: &BlockedLayout, d: DType) -> usize {
        let bytes = super::elem_bytes(Elem::Scalar(d)) as usize;
        l.spt.min(16 / bytes).max(1)
    }

    /// Writes blocked registers (dtype `d`) of a `[rows, cols]` tile into a
    /// padded array at byte `off` (chunks never cross a row: `spt <= cols`).
    pub(super) fn stage_padded(
        &mut self,
        smem: PointerValue<'ctx>,
        off: u64,
        l: &BlockedLayout,
        regs: &[BasicValueEnum<'ctx>],
        cols: usize,
        d: DType,
    ) -> Result<()> {
        self.stage_padded_at(smem, off, l, regs, cols, ROW_PAD, d)
    }

    /// [`Lowerer::stage_padded`] with rows padded by `pad` elements.
    #[allow(clippy::too_many_arguments)]
    fn stage_padded_at(
        &mut self,
        smem: PointerValue<'ctx>,
        off: u64,
        l: &BlockedLayout,
        regs: &[BasicValueEnum<'ctx>],
        cols: usize,
        pad: usize,
        d: DType,
    ) -> Result<()> {
        self.stage_pieces(smem, off, l, regs, d, |lw, base, s0| lw.padded_index(l, base, s0, cols, pad))
    }

    /// Writes blocked registers (dtype `d`, 16-bit) of a `[rows, cols]` tile
    /// into 128-byte swizzle atoms at `smem` (`pipeline::atom_index`, `cols`
    /// a power of two of at least 64): the `wgmma` operand layout.
    pub(super) fn stage_atoms(
        &mut self,
        smem: PointerValue<'ctx>,
        l: &BlockedLayout,
        regs: &[BasicValueEnum<'ctx>],
        rows: usize,
        cols: usize,
        d: DType,
    ) -> Result<()> {
        self.stage_pieces(smem, 0, l, regs, d, |lw, base, s0| lw.atom_index(l, base, s0, rows, cols))
    }

    /// Writes blocked registers (dtype `d`) of layout `l` to shared memory
    /// at byte `off` of `smem`, one vector store per thread chunk piece
    /// ([`Lowerer::piece`]) at the element index `index(self, thread base,
    /// first register)`.
    fn stage_pieces(
        &mut self,
        smem: PointerValue<'ctx>,
        off: u64,
        l: &BlockedLayout,
        regs: &[BasicValueEnum<'ctx>],
        d: DType,
        index: impl Fn(&Self, IntValue<'ctx>, usize) -> Result<IntValue<'ctx>>,
    ) -> Result<()> {
        let base = self.thread_base(l)?;
        let pc = Self::piece(l, d);
        let et = self.mem_ty(d);
        for s0 in (0..regs.len()).step_by(pc) {
            let idx = index(self, base, s0)?;
            let v = self.pack(&regs[s0..s0 + pc], d)?;
            let p = self.smem_elem(smem, off, et, idx)?;
            self.store_vector(p, v, d)?;
        }
        Ok(())
    }

    /// Reads blocked registers (dtype `d`) of a `[rows, cols]` tile from an
    /// array at byte `off` whose rows are padded by `pad` elements.
    fn load_padded(
        &mut self,
        smem: PointerValue<'ctx>,
        off: u64,
        l: &BlockedLayout,
        cols: usize,
        pad: usize,
        d: DType,
    ) -> Result<Regs<'ctx>> {
        let base = self.thread_base(l)?;
        let pc = Self::piece(l, d);
        let mut out = Vec::with_capacity(l.regs());
        for s0 in (0..l.regs()).step_by(pc) {
            let idx = self.padded_index(l, base, s0, cols, pad)?;
            out.extend(self.load_vector(smem, off, idx, pc, d)?);
        }
        Ok(out)
    }
}
