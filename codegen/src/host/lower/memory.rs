//! Loads, stores and atomics on global memory (the kernel's buffers).
//!
//! A strip of a pointer tile is accessed as one vector load or store when
//! the axis analysis proves it contiguous (`Access::Contiguous`, masked
//! with `llvm.masked.load`/`store`), as one scalar load when it proves the
//! addresses equal (`Access::Uniform`), and as a gather/scatter otherwise.
//! Masked-off lanes never touch memory and load `other` (or zero).
//! Scatters write lanes in order, so when lanes collide the last one wins,
//! as in the interpreter.
//!
//! Element formats in memory: booleans are bytes, f16/bf16 are 16-bit
//! patterns converted to and from f32 registers (`math.rs`).
//!
//! Atomics run lane by lane in lane order (the interpreter's serialization)
//! with LLVM atomics: `atomicrmw` for integers; compare-and-swap loops that
//! compute the new value exactly as the interpreter does for floats (f32
//! `add` in f32, f16/bf16 in f64 with one rounding, `max`/`min` with NaN
//! ignored). Float atomic adds from several programs of a grid are the one
//! result that depends on scheduling: the order in which programs reach one
//! address decides the rounding.

use super::eval::Idx;
use super::{Lower, Repr};
use crate::llvm::Values;
use crate::{Error, Result};
use dsl_core::ir::Inst;
use dsl_core::ir::ops::{AtomicKind, MemSem, MemoryOp, Op};
use dsl_core::{DType, Elem};
use inkwell::AtomicOrdering;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValue, BasicValueEnum, InstructionOpcode::*};
use inkwell::{AddressSpace, IntPredicate};

/// How a strip accesses memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// Consecutive addresses from lane 0's.
    Contiguous,
    /// Every lane's address (and mask) is lane 0's.
    Uniform,
    /// Any addresses.
    Gather,
}

impl<'ctx> Lower<'ctx, '_> {
    /// The memory type of one element of `d` in a buffer.
    fn mem_global(&self, d: DType) -> BasicTypeEnum<'ctx> {
        match d {
            DType::I1 => self.ctx.i8_type().into(),
            DType::F16 | DType::BF16 => self.ctx.i16_type().into(),
            DType::F8E4M3 | DType::F8E5M2 => self.ctx.i8_type().into(),
            d => self.reg_elem(Elem::Scalar(d)),
        }
    }

    /// Memory form to register form.
    fn global_to_reg(&self, d: DType, v: BasicValueEnum<'ctx>) -> Result<BasicValueEnum<'ctx>> {
        match d {
            DType::I1 => self.icmp(IntPredicate::NE, v, self.int_like(v, 0)?),
            DType::F16 | DType::BF16 => self.half_bits_to_f32(d, v),
            DType::F8E4M3 | DType::F8E5M2 => self.f8_bits_to_f32(d, v),
            _ => Ok(v),
        }
    }

    /// Register form to memory form.
    fn reg_to_global(&self, d: DType, v: BasicValueEnum<'ctx>) -> Result<BasicValueEnum<'ctx>> {
        match d {
            DType::I1 => self.cast_to(ZExt, v, self.ctx.i8_type().into()),
            DType::F16 | DType::BF16 => self.f32_to_half_bits(d, v),
            DType::F8E4M3 | DType::F8E5M2 => self.f32_to_f8_bits(d, v),
            _ => Ok(v),
        }
    }

    /// A vector of pointers from a vector of `i64` addresses.
    fn ptr_vec(&self, addrs: BasicValueEnum<'ctx>) -> Result<BasicValueEnum<'ctx>> {
        let pt: BasicTypeEnum<'ctx> = self.ctx.ptr_type(AddressSpace::default()).into();
        self.cast_to(IntToPtr, addrs, pt)
    }

    /// All-true mask of `lanes` lanes.
    fn all_true(&self, lanes: u32) -> Result<BasicValueEnum<'ctx>> {
        self.splat(self.ctx.bool_type().const_all_ones().into(), lanes)
    }

    /// Loads the elements of dtype `elem` at `ptrs` (`<lanes x i64>`) where
    /// `mask` is set, `other` (or zero) elsewhere; registers out.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn load_lanes(
        &mut self,
        i: Inst,
        elem: Elem,
        lanes: u32,
        ptrs: BasicValueEnum<'ctx>,
        mask: Option<BasicValueEnum<'ctx>>,
        other: Option<BasicValueEnum<'ctx>>,
        access: Access,
        volatile: bool,
    ) -> Result<BasicValueEnum<'ctx>> {
        let Elem::Scalar(d) = elem else { return Err(self.unsupported(i, "a load of pointers")) };
        let mt = self.mem_global(d);
        let vt = self.vec_of(mt, lanes);
        if volatile {
            return self.load_volatile(d, ptrs, mask, other);
        }
        let raw: BasicValueEnum<'ctx> = match access {
            Access::Contiguous => {
                let a0 = self.lane(ptrs, 0)?.into_int_value();
                let p = self.addr_ptr(a0)?;
                match mask {
                    None => {
                        let v = self.b.build_load(vt, p, "")?;
                        super::types::set_align(v, d.size_bytes() as u32);
                        v
                    }
                    Some(m) => {
                        let pass = vt.const_zero().into();
                        let v = self.intrinsic(
                            "llvm.masked.load",
                            &[vt.into(), p.get_type().into()],
                            &[p.into(), m, pass],
                        )?;
                        v.ok_or_else(|| Error::Llvm("masked.load returned no value".into()))?
                    }
                }
            }
            Access::Uniform => {
                let a0 = self.lane(ptrs, 0)?.into_int_value();
                let p = self.addr_ptr(a0)?;
                let one = self.vec_of(mt, 1);
                let v = match mask {
                    None => {
                        let v = self.b.build_load(mt, p, "")?;
                        super::types::set_align(v, d.size_bytes() as u32);
                        self.splat(v, 1)?
                    }
                    Some(m) => {
                        let m0 = self.splat(self.lane(m, 0)?, 1)?;
                        let v = self.intrinsic(
                            "llvm.masked.load",
                            &[one.into(), p.get_type().into()],
                            &[p.into(), m0, one.const_zero().into()],
                        )?;
                        v.ok_or_else(|| Error::Llvm("masked.load returned no value".into()))?
                    }
                };
                self.splat(v, lanes)?
            }
            Access::Gather => {
                let pv = self.ptr_vec(ptrs)?;
                let m = match mask {
                    Some(m) => m,
                    None => self.all_true(lanes)?,
                };
                let v = self.intrinsic(
                    "llvm.masked.gather",
                    &[vt.into(), pv.get_type()],
                    &[pv, m, vt.const_zero().into()],
                )?;
                v.ok_or_else(|| Error::Llvm("masked.gather returned no value".into()))?
            }
        };
        let v = self.global_to_reg(d, raw)?;
        match (mask, other) {
            (Some(m), Some(o)) => self.select(m, v, o),
            (Some(m), None) => {
                // Masked-off lanes are zero: the memory form's zero may not be
                // the register's (booleans, halves), so select explicitly.
                let z = self.reg_vec(elem, lanes).const_zero().into();
                self.select(m, v, z)
            }
            _ => Ok(v),
        }
    }

    /// A volatile load, lane by lane (each active lane's load is a
    /// volatile access of its own, in lane order).
    fn load_volatile(
        &mut self,
        d: DType,
        ptrs: BasicValueEnum<'ctx>,
        mask: Option<BasicValueEnum<'ctx>>,
        other: Option<BasicValueEnum<'ctx>>,
    ) -> Result<BasicValueEnum<'ctx>> {
        let lanes = self.lanes_of(ptrs).unwrap_or(1);
        let mt = self.mem_global(d);
        let elem = Elem::Scalar(d);
        let mut parts = Vec::with_capacity(lanes as usize);
        for l in 0..lanes {
            let a = self.lane(ptrs, l)?.into_int_value();
            let dflt = match other {
                Some(o) => self.lane(o, l)?,
                None => self.reg_elem(elem).const_zero(),
            };
            let on = match mask {
                Some(m) => self.lane(m, l)?.into_int_value(),
                None => self.ctx.bool_type().const_all_ones(),
            };
            let pre = self.cur_block()?;
            let yes = self.ctx.append_basic_block(self.func, "vload");
            let join = self.ctx.append_basic_block(self.func, "vload.end");
            self.b.build_conditional_branch(on, yes, join)?;
            self.b.position_at_end(yes);
            let p = self.addr_ptr(a)?;
            let v = self.b.build_load(mt, p, "")?;
            if let Some(inst) = v.as_instruction_value() {
                let _ = inst.set_volatile(true);
                let _ = inst.set_alignment(d.size_bytes() as u32);
            }
            let v = self.global_to_reg(d, v)?;
            let yes_end = self.cur_block()?;
            self.b.build_unconditional_branch(join)?;
            self.b.position_at_end(join);
            let phi = self.b.build_phi(self.reg_elem(elem), "")?;
            phi.add_incoming(&[(&v, yes_end), (&dflt, pre)]);
            parts.push(phi.as_basic_value());
        }
        // Later plain accesses may not move before the volatile ones.
        self.b.build_fence(AtomicOrdering::Acquire, false, "")?;
        Ok(self.gather_lanes(self.reg_elem(elem), &parts)?.into())
    }

    /// `store ptr, value [, mask]` (a tile or a scalar).
    pub(super) fn lower_store(&mut self, i: Inst) -> Result<()> {
        let f = self.f;
        let d = &f.insts[i];
        let Op::Memory(MemoryOp::Store { has_mask, .. }) = d.op else {
            return Err(self.unsupported(i, "not a store"));
        };
        let pty = f.ty(d.args[0]).clone();
        let Elem::Ptr(dt) = pty.elem else {
            return Err(self.unsupported(i, "a store through a non-pointer"));
        };
        let (ptr_v, val_v) = (d.args[0], d.args[1]);
        let mask_v = has_mask.then(|| d.args[2]);
        if pty.rank() == 0 {
            let ptrs = self.splat(self.scalar(ptr_v)?, 1)?;
            let val = self.splat(self.scalar(val_v)?, 1)?;
            let mask = match mask_v {
                Some(m) => Some(self.splat(self.scalar(m)?, 1)?),
                None => None,
            };
            return self.store_lanes(dt, 1, ptrs, val, mask, Access::Contiguous);
        }
        let n = pty.numel();
        let lanes = self.lanes.min(n as u32).max(1);
        self.emit_strips(n, lanes, |l, base| {
            l.memo.clear();
            let idx = Idx::affine(base, lanes);
            let val = l.eval(val_v, &idx)?;
            let mask = match mask_v {
                Some(m) => Some(l.eval(m, &idx)?),
                None => None,
            };
            let mut access = l.access(ptr_v, mask_v, &pty, &idx);
            if access == Access::Uniform {
                access = Access::Gather;
            }
            // A contiguous store needs lane 0's address only.
            let ptrs = match access {
                Access::Contiguous => l.eval(ptr_v, &Idx::affine(base, 1))?,
                _ => l.eval(ptr_v, &idx)?,
            };
            l.store_lanes(dt, lanes, ptrs, val, mask, access)
        })?;
        self.memo.clear();
        Ok(())
    }

    /// `prefetch_l2`: `llvm.prefetch` (read, high locality, data) of the
    /// lines the tile's active lanes address. A contiguous or uniform strip
    /// asks for lane 0's line and, when the strip is wider than a line, the
    /// last lane's; other strips ask lane by lane. A prefetch never faults
    /// and changes no value; masked-off lanes ask for nothing.
    pub(super) fn lower_prefetch(&mut self, i: Inst) -> Result<()> {
        let f = self.f;
        let d = &f.insts[i];
        let Op::Memory(MemoryOp::PrefetchL2 { has_mask }) = d.op else {
            return Err(self.unsupported(i, "not a prefetch"));
        };
        let pty = f.ty(d.args[0]).clone();
        let Elem::Ptr(dt) = pty.elem else {
            return Err(self.unsupported(i, "a prefetch through a non-pointer"));
        };
        let ptr_v = d.args[0];
        let mask_v = has_mask.then(|| d.args[1]);
        if pty.rank() == 0 {
            let a = self.scalar(ptr_v)?;
            let on = match mask_v {
                Some(m) => Some(self.scalar(m)?),
                None => None,
            };
            return self.prefetch_one(a, on);
        }
        let n = pty.numel();
        let lanes = self.lanes.min(n as u32).max(1);
        let elem_bytes = dt.size_bytes().max(1) as u32;
        self.emit_strips(n, lanes, |l, base| {
            l.memo.clear();
            let idx = Idx::affine(base, lanes);
            let mask = match mask_v {
                Some(m) => Some(l.eval(m, &idx)?),
                None => None,
            };
            let access = l.access(ptr_v, mask_v, &pty, &idx);
            let ptrs = l.eval(ptr_v, &idx)?;
            let which: Vec<u32> = match access {
                Access::Uniform => vec![0],
                Access::Contiguous if lanes * elem_bytes > 64 => vec![0, lanes - 1],
                Access::Contiguous => vec![0],
                Access::Gather => (0..lanes).collect(),
            };
            for lane in which {
                let a = l.lane(ptrs, lane)?;
                let on = match mask {
                    Some(m) => Some(l.lane(m, lane)?),
                    None => None,
                };
                l.prefetch_one(a, on)?;
            }
            Ok(())
        })?;
        self.memo.clear();
        Ok(())
    }

    /// One `llvm.prefetch` of address `a` (`i64`), under `on` when given.
    fn prefetch_one(&mut self, a: BasicValueEnum<'ctx>, on: Option<BasicValueEnum<'ctx>>) -> Result<()> {
        let join = match on {
            Some(on) => {
                let yes = self.ctx.append_basic_block(self.func, "prefetch");
                let join = self.ctx.append_basic_block(self.func, "prefetch.end");
                self.b.build_conditional_branch(on.into_int_value(), yes, join)?;
                self.b.position_at_end(yes);
                Some(join)
            }
            None => None,
        };
        let p = self.addr_ptr(a.into_int_value())?;
        let i32t = self.ctx.i32_type();
        // (address, read, locality 3: keep in all levels, data cache)
        let args = [
            p.into(),
            i32t.const_zero().into(),
            i32t.const_int(3, false).into(),
            i32t.const_int(1, false).into(),
        ];
        self.intrinsic("llvm.prefetch", &[p.get_type().into()], &args)?;
        if let Some(join) = join {
            self.b.build_unconditional_branch(join)?;
            self.b.position_at_end(join);
        }
        Ok(())
    }

    /// Stores register values `val` of dtype `d` to `ptrs` where `mask` is set.
    fn store_lanes(
        &mut self,
        d: DType,
        lanes: u32,
        ptrs: BasicValueEnum<'ctx>,
        val: BasicValueEnum<'ctx>,
        mask: Option<BasicValueEnum<'ctx>>,
        access: Access,
    ) -> Result<()> {
        let m = self.reg_to_global(d, val)?;
        match access {
            Access::Contiguous => {
                let a0 = self.lane(ptrs, 0)?.into_int_value();
                let p = self.addr_ptr(a0)?;
                match mask {
                    None => {
                        let st = self.b.build_store(p, m)?;
                        let _ = st.set_alignment(d.size_bytes() as u32);
                    }
                    Some(mk) => {
                        self.intrinsic(
                            "llvm.masked.store",
                            &[m.get_type(), p.get_type().into()],
                            &[m, p.into(), mk],
                        )?;
                    }
                }
            }
            Access::Uniform | Access::Gather => {
                let pv = self.ptr_vec(ptrs)?;
                let mk = match mask {
                    Some(mk) => mk,
                    None => self.all_true(lanes)?,
                };
                self.intrinsic("llvm.masked.scatter", &[m.get_type(), pv.get_type()], &[m, pv, mk])?;
            }
        }
        Ok(())
    }

    /// `atomic_<kind>` and `atomic_cas` (tiles or scalars): lane by lane in
    /// lane order; the old values go to the result.
    pub(super) fn lower_atomic(&mut self, i: Inst) -> Result<()> {
        let f = self.f;
        let d = &f.insts[i];
        let pty = f.ty(d.args[0]).clone();
        let Elem::Ptr(dt) = pty.elem else { return Err(self.unsupported(i, "an atomic on a non-pointer")) };
        let (kind, sem, mask_v, cmp_v, val_v) = match d.op {
            Op::Memory(MemoryOp::Atomic { kind, has_mask, sem, .. }) => {
                (Some(kind), sem, has_mask.then(|| d.args[2]), None, d.args[1])
            }
            Op::Memory(MemoryOp::AtomicCas { sem, .. }) => (None, sem, None, Some(d.args[1]), d.args[2]),
            _ => return Err(self.unsupported(i, "not an atomic")),
        };
        let ord = match sem {
            MemSem::Relaxed => AtomicOrdering::Monotonic,
            MemSem::Acquire => AtomicOrdering::Acquire,
            MemSem::Release => AtomicOrdering::Release,
            MemSem::AcqRel => AtomicOrdering::AcquireRelease,
        };
        let r = d.results[0];
        if pty.rank() == 0 {
            let ptr = self.scalar(d.args[0])?;
            let val = self.scalar(val_v)?;
            let on = match mask_v {
                Some(m) => Some(self.scalar(m)?),
                None => None,
            };
            let cmp = match cmp_v {
                Some(c) => Some(self.scalar(c)?),
                None => None,
            };
            let old = self.atomic_lane(i, kind, dt, ord, ptr, val, cmp, on)?;
            self.set(r, Repr::Scalar(old));
            return Ok(());
        }
        let n = pty.numel();
        let arr = self.alloc_array(Elem::Scalar(dt), n)?;
        let lanes = self.lanes.min(n as u32).max(1);
        let ptr_v = d.args[0];
        self.emit_loop(self.c32(0), self.c32(n as i64), i64::from(lanes), true, |l, base| {
            l.memo.clear();
            let idx = Idx::affine(base, lanes);
            let ptrs = l.eval(ptr_v, &idx)?;
            let vals = l.eval(val_v, &idx)?;
            let mask = match mask_v {
                Some(m) => Some(l.eval(m, &idx)?),
                None => None,
            };
            let cmps = match cmp_v {
                Some(c) => Some(l.eval(c, &idx)?),
                None => None,
            };
            let mut olds = Vec::with_capacity(lanes as usize);
            for k in 0..lanes {
                let p = l.lane(ptrs, k)?;
                let v = l.lane(vals, k)?;
                let on = match mask {
                    Some(m) => Some(l.lane(m, k)?),
                    None => None,
                };
                let c = match cmps {
                    Some(c) => Some(l.lane(c, k)?),
                    None => None,
                };
                olds.push(l.atomic_lane(i, kind, dt, ord, p, v, c, on)?);
            }
            let v = l.gather_lanes(l.reg_elem(Elem::Scalar(dt)), &olds)?;
            l.store_strip(Elem::Scalar(dt), arr, base, v.into())
        })?;
        self.memo.clear();
        self.set(r, Repr::Array(arr));
        Ok(())
    }

    /// One lane's atomic update at address `ptr` (when `on`, else nothing:
    /// the old value is 0); returns the old value in register form.
    #[allow(clippy::too_many_arguments)]
    fn atomic_lane(
        &mut self,
        i: Inst,
        kind: Option<AtomicKind>,
        d: DType,
        ord: AtomicOrdering,
        ptr: BasicValueEnum<'ctx>,
        val: BasicValueEnum<'ctx>,
        cmp: Option<BasicValueEnum<'ctx>>,
        on: Option<BasicValueEnum<'ctx>>,
    ) -> Result<BasicValueEnum<'ctx>> {
        let reg = self.reg_elem(Elem::Scalar(d));
        let pre = self.cur_block()?;
        let (go, join) = match on {
            Some(c) => {
                let go = self.ctx.append_basic_block(self.func, "atomic");
                let join = self.ctx.append_basic_block(self.func, "atomic.end");
                self.b.build_conditional_branch(c.into_int_value(), go, join)?;
                self.b.position_at_end(go);
                (Some(go), Some(join))
            }
            None => (None, None),
        };
        let _ = go;
        let p = self.addr_ptr(ptr.into_int_value())?;
        let old = match (kind, d.is_float()) {
            (None, _) => self.cas_exchange(
                d,
                ord,
                p,
                cmp.ok_or_else(|| self.unsupported(i, "cas without compare"))?,
                val,
            )?,
            (Some(k), false) => {
                let op = match (k, d.is_signed_int()) {
                    (AtomicKind::Add, _) => inkwell::AtomicRMWBinOp::Add,
                    (AtomicKind::Max, true) => inkwell::AtomicRMWBinOp::Max,
                    (AtomicKind::Max, false) => inkwell::AtomicRMWBinOp::UMax,
                    (AtomicKind::Min, true) => inkwell::AtomicRMWBinOp::Min,
                    (AtomicKind::Min, false) => inkwell::AtomicRMWBinOp::UMin,
                    (AtomicKind::And, _) => inkwell::AtomicRMWBinOp::And,
                    (AtomicKind::Or, _) => inkwell::AtomicRMWBinOp::Or,
                    (AtomicKind::Xor, _) => inkwell::AtomicRMWBinOp::Xor,
                    (AtomicKind::Xchg, _) => inkwell::AtomicRMWBinOp::Xchg,
                };
                self.b.build_atomicrmw(op, p, val.into_int_value(), ord)?.into()
            }
            (Some(k), true) => self.float_rmw(i, k, d, ord, p, val)?,
        };
        match join {
            None => Ok(old),
            Some(join) => {
                let end = self.cur_block()?;
                self.b.build_unconditional_branch(join)?;
                self.b.position_at_end(join);
                let phi = self.b.build_phi(reg, "")?;
                phi.add_incoming(&[(&old, end), (&reg.const_zero(), pre)]);
                Ok(phi.as_basic_value())
            }
        }
    }

    /// `cmpxchg` of `cmp` for `new` at `p` with ordering `ord` on success;
    /// a failed exchange only reads, so it orders as `ord`'s read half.
    fn cmpxchg(
        &self,
        p: inkwell::values::PointerValue<'ctx>,
        cmp: BasicValueEnum<'ctx>,
        new: BasicValueEnum<'ctx>,
        ord: AtomicOrdering,
    ) -> Result<inkwell::values::StructValue<'ctx>> {
        let fail = if ord == AtomicOrdering::Release || ord == AtomicOrdering::Monotonic {
            AtomicOrdering::Monotonic
        } else {
            AtomicOrdering::Acquire
        };
        Ok(self.b.build_cmpxchg(p, cmp, new, ord, fail)?)
    }

    /// `atomic_cas`: compares bit patterns, stores `val` on a match.
    fn cas_exchange(
        &mut self,
        d: DType,
        ord: AtomicOrdering,
        p: inkwell::values::PointerValue<'ctx>,
        cmp: BasicValueEnum<'ctx>,
        val: BasicValueEnum<'ctx>,
    ) -> Result<BasicValueEnum<'ctx>> {
        let bits: BasicTypeEnum<'ctx> = self.int_type(d.bits()).into();
        let to_bits = |v: BasicValueEnum<'ctx>| -> Result<BasicValueEnum<'ctx>> {
            if d.is_float() { self.cast_to(BitCast, v, bits) } else { Ok(v) }
        };
        let (c, v) = (to_bits(cmp)?, to_bits(val)?);
        let pair = self.cmpxchg(p, c, v, ord)?;
        let old = self.b.build_extract_value(pair, 0, "")?;
        if d.is_float() { self.cast_to(BitCast, old, self.reg_elem(Elem::Scalar(d))) } else { Ok(old) }
    }

    /// A float read-modify-write as a compare-and-swap loop on the bits.
    fn float_rmw(
        &mut self,
        i: Inst,
        k: AtomicKind,
        d: DType,
        ord: AtomicOrdering,
        p: inkwell::values::PointerValue<'ctx>,
        val: BasicValueEnum<'ctx>,
    ) -> Result<BasicValueEnum<'ctx>> {
        let bits = self.int_type(d.bits());
        let fty = self.reg_elem(Elem::Scalar(d));
        let from_bits = |l: &Self, b: BasicValueEnum<'ctx>| -> Result<BasicValueEnum<'ctx>> {
            match d {
                DType::F16 | DType::BF16 => l.half_bits_to_f32(d, b),
                _ => l.cast_to(BitCast, b, fty),
            }
        };
        let to_bits = |l: &Self, v: BasicValueEnum<'ctx>| -> Result<BasicValueEnum<'ctx>> {
            match d {
                DType::F16 | DType::BF16 => l.f32_to_half_bits(d, v),
                _ => l.cast_to(BitCast, v, bits.into()),
            }
        };
        let pre = self.cur_block()?;
        let first = self.b.build_load(bits, p, "")?;
        if let Some(inst) = first.as_instruction_value() {
            let _ = inst.set_atomic_ordering(AtomicOrdering::Monotonic);
            let _ = inst.set_alignment(d.size_bytes() as u32);
        }
        let head = self.ctx.append_basic_block(self.func, "cas");
        let done = self.ctx.append_basic_block(self.func, "cas.end");
        self.b.build_unconditional_branch(head)?;
        self.b.position_at_end(head);
        let cur = self.b.build_phi(bits, "")?;
        cur.add_incoming(&[(&first, pre)]);
        let old_bits = cur.as_basic_value();
        let old = from_bits(self, old_bits)?;
        let new = match k {
            AtomicKind::Add => match d {
                DType::F64 | DType::F32 => self.bin(FAdd, old, val)?,
                _ => {
                    let f64t: BasicTypeEnum<'ctx> = self.ctx.f64_type().into();
                    let s =
                        self.bin(FAdd, self.cast_to(FPExt, old, f64t)?, self.cast_to(FPExt, val, f64t)?)?;
                    self.narrow(d, s)?
                }
            },
            AtomicKind::Max => self.call1("llvm.maxnum", &[old, val])?,
            AtomicKind::Min => self.call1("llvm.minnum", &[old, val])?,
            AtomicKind::Xchg => val,
            _ => return Err(self.unsupported(i, format!("`{}` on {d}", k.name()))),
        };
        let new_bits = to_bits(self, new)?;
        let pair = self.cmpxchg(p, old_bits, new_bits, ord)?;
        let seen = self.b.build_extract_value(pair, 0, "")?;
        let ok = self.b.build_extract_value(pair, 1, "")?.into_int_value();
        let latch = self.cur_block()?;
        cur.add_incoming(&[(&seen, latch)]);
        self.b.build_conditional_branch(ok, done, head)?;
        self.b.position_at_end(done);
        Ok(old)
    }
}
