//! `dot a, b, acc` = `acc + a @ b`, the simple correct lowering: `a` and `b`
//! are staged in shared memory, then every thread computes the accumulator
//! elements it holds with one FMA per `k`, in `k` order (f32 accumulation of
//! exactly widened f16/bf16/f32 products; i8 inputs accumulate in i32).
//! `tf32` precision is computed as full f32 (at least as accurate).
//!
//! This is the fallback for shapes and dtypes the `mma.sync` lowering
//! (`mma.rs`) does not take; it is not fast.

use super::super::{Lowerer, Regs, elem_bytes, mem_type};
use crate::Result;
use dsl_core::dtype::DType;
use dsl_core::ir::Inst;

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    /// Lowers `dot` by FMAs from shared memory (every operand blocked).
    pub(super) fn lower_dot_fma(&mut self, inst: Inst) -> Result<()> {
        let args = self.args(inst);
        let (aty, bty) = (self.f.ty(args[0]).clone(), self.f.ty(args[1]).clone());
        let (m, k) = (aty.shape[0], aty.shape[1]);
        let n = bty.shape[1];
        let d = aty.dtype();
        let (la, lb) = (self.layout(&aty), self.layout(&bty));
        let (ra, rb, rc) = (self.regs(args[0])?, self.regs(args[1])?, self.regs(args[2])?);
        let res = self.result(inst, 0)?;
        let lc = self.layout_of(res);
        let eb = u64::from(elem_bytes(aty.elem));
        let b_off = (m * k) as u64 * eb;
        let smem = self.smem(b_off + (k * n) as u64 * eb)?;
        let et = mem_type(self.ctx, aty.elem);
        self.barrier()?;
        for (l, regs, off) in [(la, &ra, 0u64), (lb, &rb, b_off)] {
            let base = self.thread_base(&l)?;
            for (s, &v) in regs.iter().enumerate() {
                let idx = self.linear_index(&l, base, s)?;
                let addr = self.smem_elem(smem, off, et, idx)?;
                self.b.build_store(addr, v)?;
            }
        }
        self.barrier()?;
        let base = self.thread_base(&lc)?;
        let mut rows = Vec::with_capacity(lc.regs());
        let mut cols = Vec::with_capacity(lc.regs());
        for s in 0..lc.regs() {
            let lin = self.linear_index(&lc, base, s)?;
            let r = self.b.build_right_shift(lin, self.i32c(n.trailing_zeros() as i64), false, "")?;
            rows.push(self.b.build_int_mul(r, self.i32c(k as i64), "")?);
            cols.push(self.b.build_and(lin, self.i32c(n as i64 - 1), "")?);
        }
        let count = self.i32c(k as i64);
        let fin = self.loop_n(count, rc, &mut |lw, kk, cur| {
            let brow = lw.b.build_int_mul(kk, lw.i32c(n as i64), "")?;
            let mut next = Vec::with_capacity(cur.len());
            for s in 0..cur.len() {
                let ai = lw.b.build_int_add(rows[s], kk, "")?;
                let bi = lw.b.build_int_add(brow, cols[s], "")?;
                let pa = lw.smem_elem(smem, 0, et, ai)?;
                let pb = lw.smem_elem(smem, b_off, et, bi)?;
                let av = lw.b.build_load(et, pa, "")?;
                let bv = lw.b.build_load(et, pb, "")?;
                let v = if d == DType::I8 {
                    let i32t = lw.ctx.i32_type();
                    let x = lw.b.build_int_s_extend(av.into_int_value(), i32t, "")?;
                    let y = lw.b.build_int_s_extend(bv.into_int_value(), i32t, "")?;
                    let p = lw.b.build_int_mul(x, y, "")?;
                    lw.b.build_int_add(cur[s].into_int_value(), p, "")?.into()
                } else {
                    let x = lw.fwiden(av, d)?;
                    let y = lw.fwiden(bv, d)?;
                    lw.fintr("fma", &[x, y, cur[s].into_float_value()])?.into()
                };
                next.push(v);
            }
            Ok(next)
        })?;
        let out: Regs<'ctx> = fin;
        self.set(res, out);
        Ok(())
    }
}
