//! Custom reductions and scans: the combine region applied in the
//! interpreter's order (`dsl_core::interp`, reduce.rs), so the results agree
//! for any combine, associative or not in floating point.
//!
//! - Reductions combine adjacent pairs level by level: along the axis of
//!   length `m`, element `j` of the next level is `combine(x[2j], x[2j+1])`
//!   (`log2 n` levels). A level is written over the first half of its own
//!   array in increasing order, which never overwrites an element before
//!   it is read.
//! - Scans double (Hillis-Steele): at distance `d`, element `k` becomes
//!   `combine(x[k - d], x[k])` (`x[k + d]` in reverse), updated in place in
//!   the order that reads only old values (decreasing `k` forward,
//!   increasing in reverse).
//!
//! The region is lowered as scalar code inside the loops, once per level;
//! it may use scalars of enclosing regions, not tiles.

use super::eval::Idx;
use super::{Lower, Repr};
use crate::Result;
use dsl_core::dtype::split_axis;
use dsl_core::ir::ops::ControlOp;
use dsl_core::ir::{Inst, Op, Value};
use inkwell::values::{BasicValueEnum, IntValue, PointerValue};

/// `[outer, n, inner]` element counts around an axis.
type Dims = (usize, usize, usize);

impl<'ctx> Lower<'ctx, '_> {
    /// Copies the operands of a custom combine along `axis` into fresh
    /// arrays and checks that its region uses no outer tiles. Returns the
    /// `[outer, n, inner]` view of the operands around `axis` and the arrays.
    fn combine_operands(&mut self, i: Inst, axis: usize) -> Result<(Dims, Vec<PointerValue<'ctx>>)> {
        let f = self.f;
        let d = &f.insts[i];
        let dims = split_axis(&f.ty(d.args[0]).shape, axis)
            .ok_or_else(|| self.unsupported(i, "a combine along a missing axis"))?;
        let r = d.regions[0];
        let mut tile_use = false;
        let mut check = |j: Inst| {
            for &a in &f.insts[j].args {
                if f.ty(a).rank() > 0 {
                    tile_use = true;
                }
            }
        };
        for &b in &f.regions[r].blocks {
            for &j in &f.blocks[b].insts {
                check(j);
                for &sub in &f.insts[j].regions {
                    for &bb in &f.regions[sub].blocks {
                        for &jj in &f.blocks[bb].insts {
                            check(jj);
                        }
                    }
                }
            }
        }
        if tile_use {
            return Err(self.unsupported(i, "a combine region that uses tiles"));
        }
        let mut arrays = Vec::with_capacity(d.args.len());
        for &a in &d.args.clone() {
            let t = f.ty(a).clone();
            let arr = self.alloc_array(t.elem, t.numel())?;
            self.write_value(a, arr, t.elem, t.numel())?;
            arrays.push(arr);
        }
        Ok((dims, arrays))
    }

    /// Runs the combine region of `i` on the elements at `left` and
    /// `right` of `arrays` and stores the results at `dst`.
    fn combine_at(
        &mut self,
        i: Inst,
        arrays: &[PointerValue<'ctx>],
        left: IntValue<'ctx>,
        right: IntValue<'ctx>,
        dst: IntValue<'ctx>,
    ) -> Result<()> {
        let f = self.f;
        let d = &f.insts[i];
        let elems: Vec<_> = d.args.iter().map(|&a| f.ty(a).elem).collect();
        let mut vals: Vec<BasicValueEnum<'ctx>> = Vec::with_capacity(2 * arrays.len());
        for (k, &arr) in arrays.iter().enumerate() {
            vals.push(self.load_elem(elems[k], arr, left)?);
        }
        for (k, &arr) in arrays.iter().enumerate() {
            vals.push(self.load_elem(elems[k], arr, right)?);
        }
        let b = f.entry(d.regions[0]);
        for (&arg, &v) in f.blocks[b].args.iter().zip(&vals) {
            self.set(arg, Repr::Scalar(v));
        }
        let term = self.block(b)?.ok_or_else(|| self.unsupported(i, "a combine region without `yield`"))?;
        if !matches!(f.insts[term].op, Op::Control(ControlOp::Yield)) {
            return Err(self.unsupported(i, "a combine region not ending in `yield`"));
        }
        let ys: Vec<Value> = f.insts[term].args.to_vec();
        for (k, &y) in ys.iter().enumerate() {
            let v = self.scalar(y)?;
            let arr =
                *arrays.get(k).ok_or_else(|| self.unsupported(i, "a combine yielding too many values"))?;
            self.store_strip(elems[k], arr, dst, self.splat(v, 1)?)?;
        }
        Ok(())
    }

    /// A custom `reduce` along `axis`.
    pub(super) fn lower_custom_reduce(&mut self, i: Inst, axis: usize) -> Result<()> {
        let f = self.f;
        let d = &f.insts[i];
        let ((outer, n, inner), arrays) = self.combine_operands(i, axis)?;
        let mut m = n;
        while m > 1 {
            let half = m / 2;
            let total = outer * half * inner;
            let (hi_sh, in_sh) = ((half * inner).trailing_zeros() as i64, inner.trailing_zeros() as i64);
            let arrs = arrays.clone();
            self.emit_loop(self.c32(0), self.c32(total as i64), 1, true, |l, e| {
                // e = (o * half + j) * inner + ii; reads (o * m + 2j) * inner + ii and + inner.
                let o = l.b.build_right_shift(e, l.c32(hi_sh), false, "")?;
                let j = l.b.build_and(
                    l.b.build_right_shift(e, l.c32(in_sh), false, "")?,
                    l.c32(half as i64 - 1),
                    "",
                )?;
                let ii = l.b.build_and(e, l.c32(inner as i64 - 1), "")?;
                let row = l.b.build_int_add(
                    l.b.build_int_mul(o, l.c32(m as i64), "")?,
                    l.b.build_int_mul(j, l.c32(2), "")?,
                    "",
                )?;
                let left = l.b.build_int_add(l.b.build_int_mul(row, l.c32(inner as i64), "")?, ii, "")?;
                let right = l.b.build_int_add(left, l.c32(inner as i64), "")?;
                l.combine_at(i, &arrs, left, right, e)
            })?;
            m = half;
        }
        for (k, &r) in d.results.iter().enumerate() {
            let arr = arrays[k];
            if f.ty(r).rank() == 0 {
                let v = self.load_elem(f.ty(r).elem, arr, self.c32(0))?;
                self.set(r, Repr::Scalar(v));
            } else {
                self.set(r, Repr::Array(arr));
            }
        }
        Ok(())
    }

    /// A custom `scan` along `axis`.
    pub(super) fn lower_custom_scan(&mut self, i: Inst, axis: usize, reverse: bool) -> Result<()> {
        let f = self.f;
        let d = &f.insts[i];
        let ((outer, n, inner), arrays) = self.combine_operands(i, axis)?;
        let in_sh = inner.trailing_zeros() as i64;
        let mut dist = 1;
        while dist < n {
            let arrs = arrays.clone();
            let count = n - dist;
            self.emit_loop(self.c32(0), self.c32((outer * inner) as i64), 1, true, |l, line| {
                let o = l.b.build_right_shift(line, l.c32(in_sh), false, "")?;
                let ii = l.b.build_and(line, l.c32(inner as i64 - 1), "")?;
                let start =
                    l.b.build_int_add(l.b.build_int_mul(o, l.c32((n * inner) as i64), "")?, ii, "")?;
                l.emit_loop(l.c32(0), l.c32(count as i64), 1, true, |l, t| {
                    // Forward: k = n - 1 - t (down to dist), partner k - dist.
                    // Reverse: k = t (up to n - dist - 1), partner k + dist.
                    let (k, p) = if reverse {
                        (t, l.b.build_int_add(t, l.c32(dist as i64), "")?)
                    } else {
                        let k = l.b.build_int_sub(l.c32(n as i64 - 1), t, "")?;
                        (k, l.b.build_int_sub(k, l.c32(dist as i64), "")?)
                    };
                    let at = |l: &Lower<'ctx, '_>, x: IntValue<'ctx>| -> Result<IntValue<'ctx>> {
                        Ok(l.b.build_int_add(start, l.b.build_int_mul(x, l.c32(inner as i64), "")?, "")?)
                    };
                    let (ka, pa) = (at(l, k)?, at(l, p)?);
                    l.combine_at(i, &arrs, pa, ka, ka)
                })
            })?;
            dist *= 2;
        }
        for (k, &r) in d.results.iter().enumerate() {
            self.set(r, Repr::Array(arrays[k]));
        }
        Ok(())
    }

    /// Writes tile `v` (inline or an array) into the array `dst` of `n`
    /// elements of `elem`, strip by strip.
    pub(super) fn write_value(
        &mut self,
        v: Value,
        dst: PointerValue<'ctx>,
        elem: dsl_core::Elem,
        n: usize,
    ) -> Result<()> {
        let lanes = self.lanes.min(n as u32).max(1);
        self.emit_strips(n, lanes, |l, base| {
            l.memo.clear();
            let x = l.eval(v, &Idx::affine(base, lanes))?;
            l.store_strip(elem, dst, base, x)
        })?;
        self.memo.clear();
        Ok(())
    }
}
