//! Reductions and scans.
//!
//! Fast path (built-in kinds, every dimension but the reduced one of size 1,
//! which is what softmax and RMSNorm hit): each thread folds its registers,
//! warps combine with `shfl.sync.bfly` (the lower lane's value always on the
//! left, so every lane computes the same tree and the result is uniform),
//! then one value per warp goes through shared memory and every thread folds
//! the warp values in order. Replicas never double count: only the butterfly
//! steps and warps that span distinct chunks are combined.
//!
//! Row-wise fast path (built-in kinds, the reduced axis is the last non-unit
//! one, other dimensions not all 1, e.g. `[R, C] -> [R]`): each thread folds
//! the elements of each row it holds, the lanes that share a row combine with
//! butterfly shuffles within their aligned lane group, and one value per
//! (row, warp of the row) goes through shared memory to the result layout.
//! Its cost is independent of the row length beyond the in-thread folds.
//!
//! Generic path (other axes, custom combines): the operands go to shared
//! memory and each thread folds, in index order, the line of every output it
//! holds (a runtime loop over the axis). Scans use the same scheme: each
//! output element folds its prefix (O(n) per element for now).
//!
//! Numerics: f16/bf16 accumulate in f32 and round once at the end; float
//! `max`/`min` are `maxnum`/`minnum` (NaN ignored unless all are NaN);
//! `argmax`/`argmin` carry (value, index) pairs, ties and NaN as documented in
//! `dsl_core::ir::ops::reduce`. Integer sums wrap.

use super::{Lowerer, Regs, elem_bytes, mem_type};
use crate::Result;
use crate::blocked::{BlockedLayout, strides};
use crate::fragment::{MmaLayout, RegLayout};
use crate::llvm::int_order;
use dsl_core::dtype::{DType, Elem};
use dsl_core::ir::ops::{BinaryOp, ReduceKind, ReduceOp, ScanKind, ScanOp};
use dsl_core::ir::{Inst, Region};
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValueEnum, IntValue};
use inkwell::{FloatPredicate, IntPredicate};

/// A combine: built-in or a region.
#[derive(Clone, Copy)]
pub(super) enum Comb {
    Sum,
    Max,
    Min,
    Arg { max: bool },
    Custom(Region),
}

pub(super) type Vals<'ctx> = Vec<BasicValueEnum<'ctx>>;

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    /// The compute form of a register for a built-in combine (halves widen).
    fn to_compute(&self, c: Comb, v: BasicValueEnum<'ctx>, d: DType) -> Result<BasicValueEnum<'ctx>> {
        Ok(match c {
            Comb::Custom(_) => v,
            _ if matches!(d, DType::F16 | DType::BF16) => self.fwiden(v, d)?.into(),
            _ => v,
        })
    }

    /// `combine(a, b)` with `a` first in index order.
    fn combine(
        &mut self,
        c: Comb,
        d: DType,
        a: &[BasicValueEnum<'ctx>],
        b: &[BasicValueEnum<'ctx>],
    ) -> Result<Vals<'ctx>> {
        let bl = &self.b;
        Ok(match c {
            Comb::Sum if d.is_float() => {
                vec![bl.build_float_add(a[0].into_float_value(), b[0].into_float_value(), "")?.into()]
            }
            Comb::Sum => vec![bl.build_int_add(a[0].into_int_value(), b[0].into_int_value(), "")?.into()],
            Comb::Max | Comb::Min if d.is_float() => {
                let n = if matches!(c, Comb::Max) { "maxnum" } else { "minnum" };
                vec![self.fintr(n, &[a[0].into_float_value(), b[0].into_float_value()])?.into()]
            }
            Comb::Max | Comb::Min => {
                let op = if matches!(c, Comb::Max) { BinaryOp::Max } else { BinaryOp::Min };
                vec![self.int_binary(op, d, a[0].into_int_value(), b[0].into_int_value())?.into()]
            }
            Comb::Arg { max } => {
                let (ai, bi) = (a[1].into_int_value(), b[1].into_int_value());
                let idx_lt = bl.build_int_compare(IntPredicate::SLT, bi, ai, "")?;
                let take_b = if d.is_float() {
                    let (av, bv) = (a[0].into_float_value(), b[0].into_float_value());
                    let better = bl.build_float_compare(
                        if max { FloatPredicate::OGT } else { FloatPredicate::OLT },
                        bv,
                        av,
                        "",
                    )?;
                    let eq = bl.build_float_compare(FloatPredicate::OEQ, bv, av, "")?;
                    let a_nan = bl.build_float_compare(FloatPredicate::UNO, av, av, "")?;
                    let b_nan = bl.build_float_compare(FloatPredicate::UNO, bv, bv, "")?;
                    // Both NaN: smaller index; only `a` NaN: `b`; only `b` NaN: `a`.
                    let both = bl.build_and(a_nan, b_nan, "")?;
                    let tie = bl.build_and(bl.build_or(eq, both, "")?, idx_lt, "")?;
                    let a_only = bl.build_and(a_nan, bl.build_not(b_nan, "")?, "")?;
                    bl.build_or(bl.build_or(better, tie, "")?, a_only, "")?
                } else {
                    let (av, bv) = (a[0].into_int_value(), b[0].into_int_value());
                    let better = bl.build_int_compare(int_order(max, d.is_signed_int()), bv, av, "")?;
                    let eq = bl.build_int_compare(IntPredicate::EQ, bv, av, "")?;
                    bl.build_or(better, bl.build_and(eq, idx_lt, "")?, "")?
                };
                vec![bl.build_select(take_b, b[0], a[0], "")?, bl.build_select(take_b, b[1], a[1], "")?]
            }
            Comb::Custom(r) => {
                let args: Vec<Regs<'ctx>> = a.iter().chain(b).map(|&v| vec![v]).collect();
                let out = self.lower_region(r, &args)?;
                out.into_iter()
                    .map(|v| v.first().copied().ok_or_else(|| crate::Error::Invalid("empty yield".into())))
                    .collect::<Result<_>>()?
            }
        })
    }

    /// Folds `items` pairwise (adjacent pairs, order kept) into one.
    fn tree_fold(&mut self, c: Comb, d: DType, mut items: Vec<Vals<'ctx>>) -> Result<Vals<'ctx>> {
        while items.len() > 1 {
            let mut next = Vec::with_capacity(items.len().div_ceil(2));
            let mut it = items.into_iter();
            while let Some(x) = it.next() {
                match it.next() {
                    Some(y) => next.push(self.combine(c, d, &x, &y)?),
                    None => next.push(x),
                }
            }
            items = next;
        }
        items.into_iter().next().ok_or_else(|| crate::Error::Invalid("empty reduction".into()))
    }

    /// `shfl.sync.bfly` of any register type (split into 32-bit pieces).
    fn shfl_xor(&self, v: BasicValueEnum<'ctx>, off: u32) -> Result<BasicValueEnum<'ctx>> {
        let i32t = self.ctx.i32_type();
        let shfl = |x: BasicValueEnum<'ctx>, f32: bool| -> Result<BasicValueEnum<'ctx>> {
            let (name, ty): (&str, BasicTypeEnum<'ctx>) = if f32 {
                ("llvm.nvvm.shfl.sync.bfly.f32", self.ctx.f32_type().into())
            } else {
                ("llvm.nvvm.shfl.sync.bfly.i32", i32t.into())
            };
            let mask = i32t.const_all_ones();
            self.call1(name, ty, &[mask.into(), x, self.i32c(off as i64).into(), self.i32c(0x1f).into()])
        };
        let ty = v.get_type();
        if ty == self.ctx.f32_type().into() {
            return shfl(v, true);
        }
        if ty == i32t.into() {
            return shfl(v, false);
        }
        let bits = match ty {
            BasicTypeEnum::IntType(t) => t.get_bit_width(),
            BasicTypeEnum::FloatType(_) => 64,
            _ => return Err(crate::Error::Llvm("shuffle of a non-scalar".into())),
        };
        let it = self.int_ty(bits);
        let x = if ty.is_float_type() {
            self.b.build_bit_cast(v, it, "")?.into_int_value()
        } else {
            v.into_int_value()
        };
        let r = if bits < 32 {
            let w = self.b.build_int_z_extend(x, i32t, "")?;
            let s = shfl(w.into(), false)?.into_int_value();
            self.b.build_int_truncate(s, it, "")?
        } else {
            let lo = self.b.build_int_truncate(x, i32t, "")?;
            let hi = self.b.build_right_shift(x, it.const_int(32, false), false, "")?;
            let hi = self.b.build_int_truncate(hi, i32t, "")?;
            let lo = self.b.build_int_z_extend(shfl(lo.into(), false)?.into_int_value(), it, "")?;
            let hi = self.b.build_int_z_extend(shfl(hi.into(), false)?.into_int_value(), it, "")?;
            let hi = self.b.build_left_shift(hi, it.const_int(32, false), "")?;
            self.b.build_or(lo, hi, "")?
        };
        Ok(if ty.is_float_type() { self.b.build_bit_cast(r, ty, "")? } else { r.into() })
    }

    /// Combines `acc` across aligned groups of `lanes` consecutive lanes with
    /// `shfl.sync.bfly` (the lower lane's value on the left, so every lane of a
    /// group computes the same tree and ends with the group's total).
    fn butterfly(&mut self, c: Comb, d: DType, mut acc: Vals<'ctx>, lanes: u32) -> Result<Vals<'ctx>> {
        let mut off = 1u32;
        while off < lanes {
            let other: Vals<'ctx> = acc.iter().map(|&v| self.shfl_xor(v, off)).collect::<Result<_>>()?;
            if matches!(c, Comb::Sum) || (matches!(c, Comb::Max | Comb::Min) && !d.is_float()) {
                // Commutative: `a + b` and `b + a` are the same IEEE result,
                // integer max/min are symmetric, so both lanes of a pair agree
                // without ordering the operands. (Float max/min keep the
                // order: the sign of a zero result may depend on it.)
                acc = self.combine(c, d, &acc, &other)?;
                off *= 2;
                continue;
            }
            let bit = self.b.build_and(self.tid, self.i32c(off as i64), "")?;
            let upper = self.b.build_int_compare(IntPredicate::NE, bit, self.i32c(0), "")?;
            let mut lo = Vec::new();
            let mut hi = Vec::new();
            for (&mine, &theirs) in acc.iter().zip(&other) {
                lo.push(self.b.build_select(upper, theirs, mine, "")?);
                hi.push(self.b.build_select(upper, mine, theirs, "")?);
            }
            acc = self.combine(c, d, &lo, &hi)?;
            off *= 2;
        }
        Ok(acc)
    }

    /// `f32` row partials (`partial.rs`) added over the four lanes of each
    /// quad: the butterfly that ends a full row sum of an accumulator tile.
    pub(super) fn quad_sum(&mut self, regs: &[BasicValueEnum<'ctx>]) -> Result<Regs<'ctx>> {
        regs.iter().map(|&v| Ok(self.butterfly(Comb::Sum, DType::F32, vec![v], 4)?[0])).collect()
    }

    /// The row-wise fast path: reduces a tile of `rows` rows of `cext`
    /// contiguous elements (the reduced axis is the last non-unit one) to the
    /// `rows` values of layout `lo`.
    ///
    /// Each thread folds the elements of one row it holds (a chunk, a segment
    /// of a chunk when rows are shorter than a chunk, or several chunks when a
    /// row is longer than one pass of all threads); the lanes that hold the
    /// same row combine with butterfly shuffles; then the group leaders write
    /// one value per (row, warp of the row) to shared memory and every thread
    /// folds, for each result register, the row's per-warp values.
    fn reduce_rows(
        &mut self,
        c: Comb,
        d: DType,
        l: &BlockedLayout,
        x: &Regs<'ctx>,
        cext: usize,
        lo: &BlockedLayout,
    ) -> Result<Vec<Vals<'ctx>>> {
        let rows = l.n / cext;
        let seg = l.spt.min(cext);
        let pass = l.threads * l.spt;
        let kmerge = if cext > pass { cext / pass } else { 1 };
        let base = self.thread_base(l)?;
        // One partial per (segment group): segments are `seg` consecutive slots.
        let nseg = x.len() / seg;
        let mut partials = Vec::with_capacity(nseg / kmerge);
        let mut first_lin = Vec::with_capacity(nseg / kmerge);
        for q in 0..nseg / kmerge {
            let mut segs = Vec::with_capacity(kmerge);
            for j in q * kmerge..(q + 1) * kmerge {
                let mut items = Vec::with_capacity(seg);
                for (s, &xs) in x.iter().enumerate().skip(j * seg).take(seg) {
                    let mut comps = vec![self.to_compute(c, xs, d)?];
                    if matches!(c, Comb::Arg { .. }) {
                        let lin = self.linear_index(l, base, s)?;
                        comps.push(self.b.build_and(lin, self.i32c(cext as i64 - 1), "")?.into());
                    }
                    items.push(comps);
                }
                segs.push(self.tree_fold(c, d, items)?);
            }
            partials.push(self.tree_fold(c, d, segs)?);
            first_lin.push(self.linear_index(l, base, q * kmerge * seg)?);
        }
        // Lanes holding one row (consecutive, aligned: chunks are assigned to
        // threads in order and every extent is a power of two).
        let lpr = if cext >= l.spt { (cext / l.spt).min(l.threads) } else { 1 };
        let group = lpr.min(32);
        let wpr = (lpr / 32).max(1);
        for p in partials.iter_mut() {
            *p = self.butterfly(c, d, std::mem::take(p), group as u32)?;
        }
        let tys: Vec<BasicTypeEnum<'ctx>> = partials[0].iter().map(|v| v.get_type()).collect();
        let slots = (rows * wpr) as u64;
        let smem = self.smem(tys.len() as u64 * slots * 8)?;
        self.barrier()?;
        let lane_in_group = self.b.build_and(self.tid, self.i32c(group as i64 - 1), "")?;
        let mut writer = self.b.build_int_compare(IntPredicate::EQ, lane_in_group, self.i32c(0), "")?;
        if let Some(owner) = self.owner_pred(l)? {
            writer = self.b.build_and(writer, owner, "")?;
        }
        let wi = if wpr > 1 {
            let w = self.b.build_right_shift(self.tid, self.i32c(5), false, "")?;
            self.b.build_and(w, self.i32c(wpr as i64 - 1), "")?
        } else {
            self.i32c(0)
        };
        let shift = self.i32c(cext.trailing_zeros() as i64);
        let writes: Vec<(IntValue<'ctx>, Vals<'ctx>)> = first_lin
            .iter()
            .zip(&partials)
            .map(|(&lin, p)| {
                let r = self.b.build_right_shift(lin, shift, false, "")?;
                let r = self.b.build_int_mul(r, self.i32c(wpr as i64), "")?;
                Ok((self.b.build_int_add(r, wi, "")?, p.clone()))
            })
            .collect::<Result<_>>()?;
        let tys2 = tys.clone();
        self.if_then(writer, |lw| {
            for (slot, vals) in &writes {
                for (k, (&v, &t)) in vals.iter().zip(&tys2).enumerate() {
                    let addr = lw.smem_elem(smem, k as u64 * slots * 8, t, *slot)?;
                    lw.b.build_store(addr, v)?;
                }
            }
            Ok(())
        })?;
        self.barrier()?;
        let obase = self.thread_base(lo)?;
        let mut out = Vec::with_capacity(lo.regs());
        for s in 0..lo.regs() {
            let r = self.linear_index(lo, obase, s)?;
            let r = self.b.build_int_mul(r, self.i32c(wpr as i64), "")?;
            let mut items = Vec::with_capacity(wpr);
            for w in 0..wpr {
                let idx = self.b.build_int_add(r, self.i32c(w as i64), "")?;
                let mut comps = Vec::with_capacity(tys.len());
                for (k, &t) in tys.iter().enumerate() {
                    let addr = self.smem_elem(smem, k as u64 * slots * 8, t, idx)?;
                    comps.push(self.b.build_load(t, addr, "")?);
                }
                items.push(comps);
            }
            let acc = self.tree_fold(c, d, items)?;
            out.push(self.finish(c, d, acc)?);
        }
        Ok(out)
    }

    /// Combines per-warp row values (`rows[q]`: one per row slot of `l`'s
    /// row layout, folded over each warp's quads) across the warps along
    /// `N` through shared memory: each quad leader writes its warp's value,
    /// every thread folds the warps' values in warp order (uniform control
    /// flow: barriers).
    pub(super) fn cross_warp_rows(
        &mut self,
        c: Comb,
        d: DType,
        l: &MmaLayout,
        rows: Vec<Vals<'ctx>>,
    ) -> Result<Vec<Vals<'ctx>>> {
        let mut partials = rows;
        let ty = partials[0][0].get_type();
        let smem = self.smem((l.warps_n * l.m * 8) as u64)?;
        let r = l.row();
        self.barrier()?;
        let (_, wn, lane) = self.warp_coords(l)?;
        let quad0 = self.b.build_int_compare(
            IntPredicate::EQ,
            self.b.build_and(lane, self.i32c(3), "")?,
            self.i32c(0),
            "",
        )?;
        let mut slots = Vec::with_capacity(partials.len());
        for q in 0..partials.len() {
            slots.push(self.row_index(&r, q)?);
        }
        let base = self.b.build_int_mul(wn, self.i32c(l.m as i64), "")?;
        let vals: Vec<BasicValueEnum<'ctx>> = partials.iter().map(|p| p[0]).collect();
        let slots2 = slots.clone();
        self.if_then(quad0, |lw| {
            for (row, &v) in slots2.iter().zip(&vals) {
                let idx = lw.b.build_int_add(base, *row, "")?;
                let addr = lw.smem_elem(smem, 0, ty, idx)?;
                lw.b.build_store(addr, v)?;
            }
            Ok(())
        })?;
        self.barrier()?;
        for (q, row) in slots.iter().enumerate() {
            let mut items = Vec::with_capacity(l.warps_n);
            for w in 0..l.warps_n {
                let idx = self.b.build_int_add(*row, self.i32c((w * l.m) as i64), "")?;
                let addr = self.smem_elem(smem, 0, ty, idx)?;
                items.push(vec![self.b.build_load(ty, addr, "")?]);
            }
            partials[q] = self.tree_fold(c, d, items)?;
        }
        Ok(partials)
    }

    /// Reduces an `[M, N]` tile held in accumulator layout `l` along `N` to
    /// its row slice: each thread folds, per row it holds, its registers in
    /// column order; the four lanes of a quad (the columns `2t, 2t + 1` of
    /// each 8-column tile) combine with shuffles; with several warps along
    /// `N`, one value per (warp, row) goes through shared memory and every
    /// thread folds the warps' values in order. A `partial` sum (one warp
    /// along `N`, `partial.rs`) stops after each lane's fold.
    fn reduce_mma_rows(
        &mut self,
        c: Comb,
        d: DType,
        l: &MmaLayout,
        x: &Regs<'ctx>,
        partial: bool,
    ) -> Result<Regs<'ctx>> {
        let (tm, tn) = (l.tiles_m(), l.tiles_n());
        let mut partials = Vec::with_capacity(2 * tm);
        for i in 0..tm {
            for h in 0..2 {
                let mut items = Vec::with_capacity(2 * tn);
                for j in 0..tn {
                    for e in 0..2 {
                        items.push(vec![self.to_compute(c, x[(i * tn + j) * 4 + 2 * h + e], d)?]);
                    }
                }
                let p = self.tree_fold(c, d, items)?;
                partials.push(if partial { p } else { self.butterfly(c, d, p, 4)? });
            }
        }
        // Partial sums stay per lane and per warp (`partial.rs`).
        if l.warps_n > 1 && !partial {
            partials = self.cross_warp_rows(c, d, l, partials)?;
        }
        partials.into_iter().map(|p| Ok(self.finish(c, d, p)?[0])).collect()
    }

    /// The fast reduction of all registers of a tile to one uniform value.
    fn reduce_fast(&mut self, c: Comb, d: DType, l: &BlockedLayout, x: &Regs<'ctx>) -> Result<Vals<'ctx>> {
        let base = self.thread_base(l)?;
        let mut items = Vec::with_capacity(x.len());
        for (s, &v) in x.iter().enumerate() {
            let mut comps = vec![self.to_compute(c, v, d)?];
            if matches!(c, Comb::Arg { .. }) {
                comps.push(self.linear_index(l, base, s)?.into());
            }
            items.push(comps);
        }
        let acc = self.tree_fold(c, d, items)?;
        let distinct = l.nchunks().min(l.threads);
        let mut acc = self.butterfly(c, d, acc, distinct.min(32) as u32)?;
        let warps = distinct / 32;
        if warps > 1 {
            let tys: Vec<BasicTypeEnum<'ctx>> = acc.iter().map(|v| v.get_type()).collect();
            let smem = self.smem(acc.len() as u64 * warps as u64 * 8)?;
            self.barrier()?;
            let lane = self.b.build_and(self.tid, self.i32c(31), "")?;
            let first = self.b.build_int_compare(IntPredicate::EQ, lane, self.i32c(0), "")?;
            let warp = self.b.build_right_shift(self.tid, self.i32c(5), false, "")?;
            let in_range = self.b.build_int_compare(IntPredicate::ULT, warp, self.i32c(warps as i64), "")?;
            let writer = self.b.build_and(first, in_range, "")?;
            let vals = acc.clone();
            let tys2 = tys.clone();
            self.if_then(writer, |lw| {
                for (k, (&v, &t)) in vals.iter().zip(&tys2).enumerate() {
                    let addr = lw.smem_elem(smem, k as u64 * warps as u64 * 8, t, warp)?;
                    lw.b.build_store(addr, v)?;
                }
                Ok(())
            })?;
            self.barrier()?;
            let mut items = Vec::with_capacity(warps);
            for w in 0..warps {
                let mut comps = Vec::with_capacity(tys.len());
                for (k, &t) in tys.iter().enumerate() {
                    let addr = self.smem_elem(smem, k as u64 * warps as u64 * 8, t, self.i32c(w as i64))?;
                    comps.push(self.b.build_load(t, addr, "")?);
                }
                items.push(comps);
            }
            acc = self.tree_fold(c, d, items)?;
        }
        Ok(acc)
    }

    /// Stores operands to shared memory (each at its own byte offset, 8-aligned);
    /// returns the offsets and reserves the space.
    fn stage_operands(&mut self, xs: &[(Elem, BlockedLayout, Regs<'ctx>)]) -> Result<Vec<u64>> {
        let mut offs = Vec::with_capacity(xs.len());
        let mut total = 0u64;
        for (e, l, _) in xs {
            offs.push(total);
            total += (l.n as u64 * u64::from(elem_bytes(*e))).div_ceil(8) * 8;
        }
        let smem = self.smem(total)?;
        self.barrier()?;
        for ((e, l, regs), &off) in xs.iter().zip(&offs) {
            let et = mem_type(self.ctx, *e);
            let base = self.thread_base(l)?;
            for (s, &v) in regs.iter().enumerate() {
                let idx = self.linear_index(l, base, s)?;
                let addr = self.smem_elem(smem, off, et, idx)?;
                let mv = if e.dtype() == DType::I1 && !e.is_ptr() {
                    self.b.build_int_z_extend(v.into_int_value(), self.ctx.i8_type(), "")?.into()
                } else {
                    v
                };
                self.b.build_store(addr, mv)?;
            }
        }
        self.barrier()?;
        Ok(offs)
    }

    /// Loads element `idx` of every staged operand, in compute form.
    fn load_staged(
        &mut self,
        c: Comb,
        elems: &[Elem],
        offs: &[u64],
        idx: IntValue<'ctx>,
    ) -> Result<Vals<'ctx>> {
        let smem = self.smem(0)?;
        let mut out = Vec::with_capacity(elems.len());
        for (e, &off) in elems.iter().zip(offs) {
            let et = mem_type(self.ctx, *e);
            let addr = self.smem_elem(smem, off, et, idx)?;
            let v = self.b.build_load(et, addr, "")?;
            let v = if e.dtype() == DType::I1 {
                let x = v.into_int_value();
                self.b.build_int_compare(IntPredicate::NE, x, x.get_type().const_zero(), "")?.into()
            } else {
                v
            };
            out.push(self.to_compute(c, v, e.dtype())?);
        }
        Ok(out)
    }

    /// Converts a finished accumulator to the result registers' form.
    fn finish(&self, c: Comb, d: DType, acc: Vals<'ctx>) -> Result<Vals<'ctx>> {
        Ok(match c {
            Comb::Arg { .. } => vec![acc[1]],
            Comb::Custom(_) => acc,
            _ if matches!(d, DType::F16 | DType::BF16) => vec![self.fnarrow(acc[0].into_float_value(), d)?],
            _ => acc,
        })
    }

    /// The combine of `inst`, a reduce or scan (`what`) of `kind`: the
    /// built-in one, or its region for a custom combine.
    fn comb_of(&self, inst: Inst, kind: ReduceKind, what: &str) -> Result<Comb> {
        Ok(match kind {
            ReduceKind::Sum => Comb::Sum,
            ReduceKind::Max => Comb::Max,
            ReduceKind::Min => Comb::Min,
            ReduceKind::Argmax => Comb::Arg { max: true },
            ReduceKind::Argmin => Comb::Arg { max: false },
            ReduceKind::Custom => match self.f.insts[inst].regions.first() {
                Some(&r) => Comb::Custom(r),
                None => return Err(self.bug(inst, format!("custom {what} without a region"))),
            },
        })
    }

    pub(super) fn lower_reduce(&mut self, inst: Inst, op: ReduceOp) -> Result<()> {
        let args = self.args(inst);
        let ty = self.f.ty(args[0]).clone();
        let d = ty.dtype();
        let c = self.comb_of(inst, op.kind, "reduce")?;
        let results = self.f.insts[inst].results.to_vec();
        if let (RegLayout::Mma(ml), RegLayout::Row(_)) =
            (self.plan.lays.lay(args[0]), self.plan.lays.lay(results[0]))
        {
            let x = self.raw_regs(args[0])?;
            let partial = self.plan.partials.sums.contains(&inst);
            let out = self.reduce_mma_rows(c, d, &ml, &x, partial)?;
            self.set(results[0], out);
            return Ok(());
        }
        let l = self.layout(&ty);
        let fast = !matches!(c, Comb::Custom(_))
            && ty.shape.iter().enumerate().all(|(i, &s)| i == op.axis || s == 1);
        if fast {
            let x = self.regs(args[0])?;
            let acc = self.reduce_fast(c, d, &l, &x)?;
            let out = self.finish(c, d, acc)?;
            let lo = self.layout_of(results[0]);
            self.set(results[0], vec![out[0]; lo.regs()]);
            return Ok(());
        }
        let n = ty.shape[op.axis];
        let inner: usize = ty.shape[op.axis + 1..].iter().product();
        if !matches!(c, Comb::Custom(_)) && inner == 1 && n > 1 {
            let x = self.regs(args[0])?;
            let lo = self.layout_of(results[0]);
            let outs = self.reduce_rows(c, d, &l, &x, n, &lo)?;
            self.set(results[0], outs.into_iter().map(|v| v[0]).collect());
            return Ok(());
        }
        let xs: Vec<(Elem, BlockedLayout, Regs<'ctx>)> =
            args.iter().map(|&a| Ok((self.f.ty(a).elem, l, self.regs(a)?))).collect::<Result<_>>()?;
        let elems: Vec<Elem> = xs.iter().map(|x| x.0).collect();
        let offs = self.stage_operands(&xs)?;
        let lo = self.layout_of(results[0]);
        let obase = self.thread_base(&lo)?;
        let mut bases = Vec::with_capacity(lo.regs());
        let mut init = Vec::new();
        for s in 0..lo.regs() {
            let lin = self.linear_index(&lo, obase, s)?;
            let outer = self.b.build_right_shift(lin, self.i32c(inner.trailing_zeros() as i64), false, "")?;
            let inn = self.b.build_and(lin, self.i32c(inner as i64 - 1), "")?;
            let ob = self.b.build_int_mul(outer, self.i32c((n * inner) as i64), "")?;
            let base = self.b.build_int_add(ob, inn, "")?;
            bases.push(base);
            let mut comps = self.load_staged(c, &elems, &offs, base)?;
            if matches!(c, Comb::Arg { .. }) {
                comps.push(self.i32c(0).into());
            }
            init.extend(comps);
        }
        let per = init.len() / lo.regs().max(1);
        let count = self.i32c(n as i64 - 1);
        let fin = self.loop_n(count, init, &mut |lw, k, cur| {
            let k1 = lw.b.build_int_add(k, lw.i32c(1), "")?;
            let step = lw.b.build_int_mul(k1, lw.i32c(inner as i64), "")?;
            let mut next = Vec::with_capacity(cur.len());
            for (s, base) in bases.iter().enumerate() {
                let idx = lw.b.build_int_add(*base, step, "")?;
                let mut new = lw.load_staged(c, &elems, &offs, idx)?;
                if matches!(c, Comb::Arg { .. }) {
                    new.push(k1.into());
                }
                next.extend(lw.combine(c, d, &cur[s * per..(s + 1) * per], &new)?);
            }
            Ok(next)
        })?;
        let mut outs: Vec<Regs<'ctx>> = vec![Vec::new(); results.len()];
        for s in 0..lo.regs() {
            let vals = self.finish(c, d, fin[s * per..(s + 1) * per].to_vec())?;
            for (o, v) in outs.iter_mut().zip(vals) {
                o.push(v);
            }
        }
        for (r, regs) in results.iter().zip(outs) {
            self.set(*r, regs);
        }
        Ok(())
    }

    pub(super) fn lower_scan(&mut self, inst: Inst, op: ScanOp) -> Result<()> {
        let args = self.args(inst);
        let ty = self.f.ty(args[0]).clone();
        let d = ty.dtype();
        let kind = match op.kind {
            ScanKind::Sum => ReduceKind::Sum,
            ScanKind::Max => ReduceKind::Max,
            ScanKind::Min => ReduceKind::Min,
            ScanKind::Custom => ReduceKind::Custom,
        };
        let c = self.comb_of(inst, kind, "scan")?;
        let l = self.layout(&ty);
        let results = self.f.insts[inst].results.to_vec();
        let n = ty.shape[op.axis];
        let stride = strides(&ty.shape)[op.axis];
        let xs: Vec<(Elem, BlockedLayout, Regs<'ctx>)> =
            args.iter().map(|&a| Ok((self.f.ty(a).elem, l, self.regs(a)?))).collect::<Result<_>>()?;
        let elems: Vec<Elem> = xs.iter().map(|x| x.0).collect();
        let offs = self.stage_operands(&xs)?;
        let base = self.thread_base(&l)?;
        let mut outs: Vec<Regs<'ctx>> = vec![Vec::new(); results.len()];
        for s in 0..l.regs() {
            let lin = self.linear_index(&l, base, s)?;
            let k = self.dim_index(lin, stride, n)?;
            let kst = self.b.build_int_mul(k, self.i32c(stride as i64), "")?;
            let line = self.b.build_int_sub(lin, kst, "")?;
            // Forward: fold positions 0..=k; reverse: n-1 down to k.
            let (first, count) = if op.reverse {
                let last = self.b.build_int_add(line, self.i32c(((n - 1) * stride) as i64), "")?;
                (last, self.b.build_int_sub(self.i32c(n as i64 - 1), k, "")?)
            } else {
                (line, k)
            };
            let init = self.load_staged(c, &elems, &offs, first)?;
            let rev = op.reverse;
            let fin = self.loop_n(count, init, &mut |lw, t, cur| {
                let t1 = lw.b.build_int_add(t, lw.i32c(1), "")?;
                let step = lw.b.build_int_mul(t1, lw.i32c(stride as i64), "")?;
                let idx = if rev {
                    lw.b.build_int_sub(first, step, "")?
                } else {
                    lw.b.build_int_add(first, step, "")?
                };
                let new = lw.load_staged(c, &elems, &offs, idx)?;
                lw.combine(c, d, cur, &new)
            })?;
            let vals = self.finish(c, d, fin)?;
            for (o, v) in outs.iter_mut().zip(vals) {
                o.push(v);
            }
        }
        for (r, regs) in results.iter().zip(outs) {
            self.set(*r, regs);
        }
        Ok(())
    }
}
