//! Shape ops. `reshape` and `expand_dims` keep the element count, hence the
//! layout, and move no data. `broadcast`, `permute`, `join` and `split` go
//! through shared memory with [`Lowerer::exchange`]: the sources are written
//! at their row-major linear indices and each output register reads the
//! element its index maps to. Broadcasting a one-element value copies its
//! register instead, and a broadcast along leading dimensions only
//! (`[1, K] -> [N, K]`) copies registers when input and output chunks have
//! the same size; a broadcast along trailing dimensions that cover whole
//! chunks (`[R, 1] -> [R, C]`) reads shared memory once per chunk. A
//! `permute` stores its array swizzled ([`Lowerer::swizzled_index`]), so
//! that its strided reads spread over the banks.
//!
//! Invariant: every exchange is bracketed by barriers (one before the
//! writes, one between writes and reads), in uniform control flow.

use super::{Lowerer, Regs, elem_bytes, mem_type};
use crate::Result;
use crate::blocked::{BlockedLayout, strides};
use crate::fragment::RegLayout;
use dsl_core::dtype::{DType, Elem};
use dsl_core::ir::Inst;
use dsl_core::ir::ops::ShapeOp;
use inkwell::values::IntValue;

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    /// Sends data between layouts through shared memory. `srcs` (layout and
    /// registers, all of element `e`) are stored one after another; output `o`
    /// of layout `outs[o]` reads, for each register, the element of the
    /// concatenated sources that `map(o, linear_index)` names. With
    /// `chunk_uniform`, the caller promises that all elements of an output
    /// chunk read the same source element, which is then loaded once per
    /// chunk; with `swizzle`, the array is stored swizzled
    /// ([`Lowerer::swizzled_index`]), for reads that stride across it.
    pub fn exchange(
        &mut self,
        e: Elem,
        srcs: &[(BlockedLayout, Regs<'ctx>)],
        outs: &[BlockedLayout],
        map: &dyn Fn(&Self, usize, IntValue<'ctx>) -> Result<IntValue<'ctx>>,
        chunk_uniform: bool,
        swizzle: bool,
    ) -> Result<Vec<Regs<'ctx>>> {
        let total: usize = srcs.iter().map(|(l, _)| l.n).sum();
        let et = mem_type(self.ctx, e);
        let eb = elem_bytes(e);
        let bytes = total as u64 * u64::from(eb);
        let smem = self.smem(if swizzle { bytes.next_multiple_of(128) } else { bytes })?;
        let at = |lw: &Self, idx: IntValue<'ctx>| if swizzle { lw.swizzled_index(idx, eb) } else { Ok(idx) };
        let d = e.dtype();
        let is_bool = !e.is_ptr() && d == DType::I1;
        self.barrier()?;
        let mut start = 0usize;
        for (l, regs) in srcs {
            let base = self.thread_base(l)?;
            if let (true, Elem::Scalar(sd)) = (swizzle, e)
                && sd != DType::I1
            {
                // A swizzled array keeps each 16-byte chunk whole: the
                // chunk's elements are stored as one vector (LLVM would not
                // see that the XORed addresses are consecutive).
                let vec = l.spt.min(16 / eb as usize).max(1);
                for s in (0..regs.len()).step_by(vec) {
                    let idx = self.linear_index(l, base, s)?;
                    let idx = self.b.build_int_add(idx, self.i32c(start as i64), "")?;
                    let addr = self.smem_elem(smem, 0, et, at(self, idx)?)?;
                    self.store_run(addr.into(), sd, &regs[s..s + vec])?;
                }
                start += l.n;
                continue;
            }
            for (s, &v) in regs.iter().enumerate() {
                let idx = self.linear_index(l, base, s)?;
                let idx = self.b.build_int_add(idx, self.i32c(start as i64), "")?;
                let addr = self.smem_elem(smem, 0, et, at(self, idx)?)?;
                let mv = if is_bool {
                    self.b.build_int_z_extend(v.into_int_value(), self.ctx.i8_type(), "")?.into()
                } else {
                    v
                };
                self.b.build_store(addr, mv)?;
            }
            start += l.n;
        }
        self.barrier()?;
        let mut result = Vec::with_capacity(outs.len());
        for (o, l) in outs.iter().enumerate() {
            let base = self.thread_base(l)?;
            let mut regs = Vec::with_capacity(l.regs());
            for s in 0..l.regs() {
                if chunk_uniform && s % l.spt != 0 {
                    let v = regs[s - s % l.spt];
                    regs.push(v);
                    continue;
                }
                let lin = self.linear_index(l, base, s)?;
                let src = map(self, o, lin)?;
                let addr = self.smem_elem(smem, 0, et, at(self, src)?)?;
                let v = self.b.build_load(et, addr, "")?;
                let v = if is_bool {
                    let x = v.into_int_value();
                    self.b
                        .build_int_compare(inkwell::IntPredicate::NE, x, x.get_type().const_zero(), "")?
                        .into()
                } else {
                    v
                };
                regs.push(v);
            }
            result.push(regs);
        }
        Ok(result)
    }

    /// Element `idx` (of `eb` bytes, a power of two up to 16) of a
    /// swizzled exchange array: its 16-byte chunk is XORed, within its
    /// 128-byte line, with the line index's bits 0-2, 3-5 and 6-8 folded
    /// together. That is a bijection on every whole line that keeps each
    /// chunk whole (vector accesses stay vector, a line's accesses stay
    /// conflict-free) and spreads reads that stride by lines over the
    /// banks: a transpose reading 16 rows of 1 KB, 8 rows apart, hits 8
    /// chunks (2-way conflicts) instead of one (16-way). `swizzled` is
    /// the same map on integers, for the tests.
    pub fn swizzled_index(&self, idx: IntValue<'ctx>, eb: u32) -> Result<IntValue<'ctx>> {
        let per_line = 128 / eb.clamp(1, 16);
        let per_chunk = 16 / eb.clamp(1, 16);
        // The chunk's first element, swizzled, plus the offset in the chunk:
        // consecutive elements of a chunk stay visibly consecutive, so LLVM
        // still vectorizes their accesses.
        let within = self.b.build_and(idx, self.i32c(per_chunk as i64 - 1), "")?;
        let first = self.b.build_and(idx, self.i32c(!(per_chunk as i64 - 1)), "")?;
        let line = self.b.build_right_shift(first, self.i32c(per_line.trailing_zeros() as i64), false, "")?;
        let l3 = self.b.build_right_shift(line, self.i32c(3), false, "")?;
        let l6 = self.b.build_right_shift(line, self.i32c(6), false, "")?;
        let h = self.b.build_xor(self.b.build_xor(line, l3, "")?, l6, "")?;
        let h = self.b.build_and(h, self.i32c(7), "")?;
        let x = self.b.build_left_shift(h, self.i32c(per_chunk.trailing_zeros() as i64), "")?;
        let first = self.b.build_xor(first, x, "")?;
        Ok(self.b.build_int_add(first, within, "")?)
    }

    /// `(lin / stride) % size` for a power-of-two `stride` and `size`.
    pub fn dim_index(&self, lin: IntValue<'ctx>, stride: usize, size: usize) -> Result<IntValue<'ctx>> {
        let q = if stride > 1 {
            self.b.build_right_shift(lin, self.i32c(stride.trailing_zeros() as i64), false, "")?
        } else {
            lin
        };
        Ok(self.b.build_and(q, self.i32c(size as i64 - 1), "")?)
    }

    pub(super) fn lower_shape(&mut self, inst: Inst, op: &ShapeOp) -> Result<()> {
        let args = self.args(inst);
        let a = args[0];
        let res = self.result(inst, 0)?;
        match (self.plan.lays.lay(res), op) {
            (RegLayout::Row(r), ShapeOp::ExpandDims { .. } | ShapeOp::Reshape { .. }) => {
                // `[M]` <-> `[M, 1]` in the row slice: the same registers.
                let regs = self.regs_as(a, RegLayout::Row(r))?;
                self.set(res, regs);
                return Ok(());
            }
            (RegLayout::MmaT(l), ShapeOp::Permute { .. }) => {
                // The transpose of an accumulator: the same registers.
                let regs = self.regs_as(a, RegLayout::Mma(l))?;
                self.set(res, regs);
                return Ok(());
            }
            (RegLayout::Mma(l), ShapeOp::Broadcast { .. }) => {
                // `[M, 1]` row vector -> `[M, N]`: accumulator register
                // `[i][j][q]` is row register `2 i + q / 2`.
                let row = self.regs_as(a, RegLayout::Row(l.row()))?;
                let tn = l.tiles_n();
                let out = (0..l.regs()).map(|s| row[2 * (s / 4 / tn) + (s % 4) / 2]).collect();
                self.set(res, out);
                return Ok(());
            }
            _ => {}
        }
        let aty = self.f.ty(a).clone();
        let la = self.layout(&aty);
        let rty = self.f.ty(res).clone();
        let lr = self.layout(&rty);
        // A result computed from coordinates alone is evaluated where the
        // op would exchange its operand (`remat.rs`).
        let exchanges = match op {
            ShapeOp::Broadcast { .. } => {
                la != lr && la.n != 1 && !leading_broadcast(&aty.shape, &rty.shape, la, lr)
            }
            ShapeOp::Permute { .. } => true,
            _ => false,
        };
        if exchanges && super::remat::computable(self.f, res) {
            let out = self.remat_blocked(res)?;
            self.set(res, out);
            return Ok(());
        }
        let regs = self.regs(a)?;
        match op {
            ShapeOp::ExpandDims { .. } | ShapeOp::Reshape { .. } => self.set(res, regs),
            ShapeOp::Broadcast { shape } => {
                let (ashape, oshape) = (&aty.shape, shape);
                // Leading broadcast (`[1, .., 1, rest] -> [.., rest]`): the
                // output's linear index modulo the input's size is the input's
                // index, and with equal chunk sizes every thread already holds
                // it (see the layout module): register `s` is input register
                // `s mod regs`.
                if la == lr {
                    self.set(res, regs);
                } else if la.n == 1 {
                    self.set(res, vec![regs[0]; lr.regs()]);
                } else if leading_broadcast(ashape, oshape, la, lr) {
                    let out = (0..lr.regs()).map(|s| regs[s % regs.len()]).collect();
                    self.set(res, out);
                } else {
                    // Trailing broadcast dims whose extent covers whole chunks
                    // make every chunk read one source element.
                    let mut tb = 1usize;
                    for d in (0..oshape.len()).rev() {
                        if ashape[d] != 1 {
                            break;
                        }
                        tb *= oshape[d];
                    }
                    let chunk_uniform = tb.is_multiple_of(lr.spt);
                    let (ss, os) = (strides(&aty.shape), strides(shape));
                    let (ashape, oshape) = (aty.shape.to_vec(), shape.to_vec());
                    let map = move |lw: &Self, _: usize, lin: IntValue<'ctx>| -> Result<IntValue<'ctx>> {
                        let mut acc = lw.i32c(0);
                        for d in 0..oshape.len() {
                            if ashape[d] == 1 {
                                continue;
                            }
                            let i = lw.dim_index(lin, os[d], oshape[d])?;
                            let t = lw.b.build_int_mul(i, lw.i32c(ss[d] as i64), "")?;
                            acc = lw.b.build_int_add(acc, t, "")?;
                        }
                        Ok(acc)
                    };
                    let out = self.exchange(aty.elem, &[(la, regs)], &[lr], &map, chunk_uniform, false)?;
                    self.set(res, out.into_iter().next().unwrap_or_default());
                }
            }
            ShapeOp::Permute { order } => {
                let (ss, os) = (strides(&aty.shape), strides(&rty.shape));
                let (order, oshape) = (order.clone(), rty.shape.to_vec());
                let map = move |lw: &Self, _: usize, lin: IntValue<'ctx>| -> Result<IntValue<'ctx>> {
                    let mut acc = lw.i32c(0);
                    for i in 0..oshape.len() {
                        let j = lw.dim_index(lin, os[i], oshape[i])?;
                        let t = lw.b.build_int_mul(j, lw.i32c(ss[order[i]] as i64), "")?;
                        acc = lw.b.build_int_add(acc, t, "")?;
                    }
                    Ok(acc)
                };
                // Reads stride across the array (a transpose reads columns).
                let out = self.exchange(aty.elem, &[(la, regs)], &[lr], &map, false, true)?;
                self.set(res, out.into_iter().next().unwrap_or_default());
            }
            ShapeOp::Join => {
                let b = self.regs(args[1])?;
                let n = la.n as i64;
                let map = move |lw: &Self, _: usize, lin: IntValue<'ctx>| -> Result<IntValue<'ctx>> {
                    // Output element 2k + w comes from source w, element k.
                    let k = lw.b.build_right_shift(lin, lw.i32c(1), false, "")?;
                    let w = lw.b.build_and(lin, lw.i32c(1), "")?;
                    let off = lw.b.build_int_mul(w, lw.i32c(n), "")?;
                    Ok(lw.b.build_int_add(k, off, "")?)
                };
                let out = self.exchange(aty.elem, &[(la, regs), (la, b)], &[lr], &map, false, false)?;
                self.set(res, out.into_iter().next().unwrap_or_default());
            }
            ShapeOp::Split => {
                let map = |lw: &Self, o: usize, lin: IntValue<'ctx>| -> Result<IntValue<'ctx>> {
                    let k = lw.b.build_left_shift(lin, lw.i32c(1), "")?;
                    Ok(lw.b.build_int_add(k, lw.i32c(o as i64), "")?)
                };
                let out = self.exchange(aty.elem, &[(la, regs)], &[lr, lr], &map, false, false)?;
                let res1 = self.result(inst, 1)?;
                let mut it = out.into_iter();
                self.set(res, it.next().unwrap_or_default());
                self.set(res1, it.next().unwrap_or_default());
            }
        }
        Ok(())
    }
}

/// A leading broadcast (`[1, .., 1, rest] -> [.., rest]`) between layouts
/// of one chunk size: register `s` is input register `s mod regs`, no data
/// moves (see [`Lowerer::lower_shape`]).
fn leading_broadcast(ashape: &[usize], oshape: &[usize], la: BlockedLayout, lr: BlockedLayout) -> bool {
    let last_bcast = (0..oshape.len()).rev().find(|&d| ashape[d] == 1 && oshape[d] > 1);
    let first_kept = (0..oshape.len()).find(|&d| ashape[d] > 1);
    let leading = match (last_bcast, first_kept) {
        (Some(b), Some(k)) => b < k,
        _ => true,
    };
    leading && la.spt == lr.spt
}

/// What [`Lowerer::swizzled_index`] computes, for the tests.
#[cfg(test)]
pub(crate) fn swizzled(idx: usize, eb: usize) -> usize {
    let (per_line, per_chunk) = (128 / eb, 16 / eb);
    let line = idx / per_line;
    let h = (line ^ (line >> 3) ^ (line >> 6)) & 7;
    ((idx & !(per_chunk - 1)) ^ (h * per_chunk)) + idx % per_chunk
}

#[cfg(test)]
mod tests {
    use super::swizzled;

    #[test]
    fn swizzle_permutes_each_line_and_keeps_chunks_whole() {
        for eb in [1usize, 2, 4, 8] {
            let per_line = 128 / eb;
            for line in 0..600 {
                let mut seen = vec![false; per_line];
                for k in 0..per_line {
                    let i = line * per_line + k;
                    let j = swizzled(i, eb);
                    assert_eq!(j / per_line, line, "eb {eb}: {i} leaves its line");
                    assert!(!seen[j % per_line], "eb {eb}: {i} collides");
                    seen[j % per_line] = true;
                    // Consecutive elements of a 16-byte chunk stay consecutive.
                    assert_eq!(j % (16 / eb), i % (16 / eb));
                }
            }
        }
    }

    /// The transpose of the swapped dequant GEMM's epilogue: a `[128, 256]`
    /// f32 tile read as `[256, 128]`, 8 consecutive output elements per
    /// thread. Each warp-wide read hits every bank at most twice (16 times
    /// unswizzled).
    #[test]
    fn transposed_reads_spread_over_the_banks() {
        for sw in [false, true] {
            let mut worst = 0;
            for s in 0..64 {
                for warp in 0..8 {
                    let mut per_bank = [0usize; 32];
                    for lane in 0..32 {
                        let t = warp * 32 + lane;
                        let lin = 8 * t + 2048 * (s / 8) + s % 8;
                        let (i, j) = (lin / 128, lin % 128);
                        let idx = j * 256 + i;
                        per_bank[if sw { swizzled(idx, 4) } else { idx } % 32] += 1;
                    }
                    worst = worst.max(*per_bank.iter().max().unwrap());
                }
            }
            assert_eq!(worst, if sw { 2 } else { 16 });
        }
    }
}
