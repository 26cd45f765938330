//! Strip evaluation of inline tiles: the value of a tile at a strip of
//! element indices, computed from its operands at the indices they need.
//!
//! A strip is `lanes` flat (row-major) indices of the tile being computed
//! ([`Idx`]): either `base, base + 1, ..., base + lanes - 1` (`Affine`, the
//! strips of a root's loop; `base` is a multiple of `lanes`) or any vector
//! of indices (`General`). Elementwise ops evaluate their operands at the
//! same strip; `reshape`/`expand_dims` keep flat indices; a `broadcast`
//! maps the strip to the source's indices, which stay `Affine` when the
//! strip lies within one row whose last dimension is not broadcast, and
//! become one index repeated over the lanes (one evaluation, then a splat)
//! when the last dimension is broadcast; `permute`, `join` and `split` map
//! indices lane by lane unless a shuffle does it. Loads use the axis
//! analysis: an `Affine` strip of a pointer tile contiguous over the strip
//! is one vector load, a constant one a scalar load, anything else a
//! gather.
//!
//! Within one strip of a root, each (value, strip) is computed once
//! ([`MemoKey`]); the memo is cleared at the start of every strip.

use super::memory::Access;
use super::{Lower, Repr};
use crate::llvm::Values;
use crate::{Error, Result};
use dsl_core::ir::ops::{CreationOp, MemoryOp, Op, ShapeOp};
use dsl_core::ir::{EntityRef, Inst, Value};
use dsl_core::{Elem, Type};
use inkwell::values::{AsValueRef, BasicValueEnum, InstructionOpcode::*, IntValue, VectorValue};

/// A strip of element indices.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Idx<'ctx> {
    /// Number of lanes.
    pub lanes: u32,
    /// Which indices.
    pub kind: IdxKind<'ctx>,
}

/// The indices of a strip.
#[derive(Clone, Copy, Debug)]
pub(crate) enum IdxKind<'ctx> {
    /// `base + lane` (an `i32` scalar base).
    Affine(IntValue<'ctx>),
    /// Any indices (an `<lanes x i32>` vector).
    General(VectorValue<'ctx>),
}

impl<'ctx> Idx<'ctx> {
    /// The strip `base, ..., base + lanes - 1`.
    pub(crate) fn affine(base: IntValue<'ctx>, lanes: u32) -> Idx<'ctx> {
        Idx { lanes, kind: IdxKind::Affine(base) }
    }
}

/// A memo entry: a value at a strip.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct MemoKey {
    value: u32,
    lanes: u32,
    general: bool,
    index: usize,
}

impl MemoKey {
    fn new(v: Value, idx: &Idx<'_>) -> MemoKey {
        let (general, index) = match idx.kind {
            IdxKind::Affine(b) => (false, b.as_value_ref() as usize),
            IdxKind::General(g) => (true, g.as_value_ref() as usize),
        };
        MemoKey { value: v.index() as u32, lanes: idx.lanes, general, index }
    }
}

/// Where a broadcast or permute reads its operand for a strip.
enum Source<'ctx> {
    /// At this strip.
    At(Idx<'ctx>),
    /// At one index for every lane (evaluate one lane, then splat).
    Uniform(IntValue<'ctx>),
    /// At the `lanes / times` indices from `base`, each repeated `times`
    /// times (a broadcast along trailing dimensions shorter than a strip).
    Repeat { base: IntValue<'ctx>, times: u32 },
    /// At the `period` indices from `base`, the strip repeating them (a
    /// broadcast along leading dimensions of a source shorter than a strip).
    Tile { base: IntValue<'ctx>, period: u32 },
}

impl<'ctx> Lower<'ctx, '_> {
    /// The value of tile (or scalar) `v` at strip `idx`, as an `<lanes x T>`
    /// vector.
    pub(super) fn eval(&mut self, v: Value, idx: &Idx<'ctx>) -> Result<BasicValueEnum<'ctx>> {
        let key = MemoKey::new(v, idx);
        if let Some(&x) = self.memo.get(&key) {
            return Ok(x);
        }
        let out = match self.get(v)? {
            Repr::Scalar(s) => self.splat(s, idx.lanes)?,
            Repr::Array(arr) => self.read_array(self.f.ty(v).elem, arr, idx)?,
            Repr::Inline => {
                let (i, k) = match self.f.values[v].def {
                    dsl_core::ir::ValueDef::Result(i, k) => (i, k as usize),
                    dsl_core::ir::ValueDef::BlockArg(..) => {
                        return Err(Error::Llvm(format!("host lowering: block argument {v} is inline")));
                    }
                };
                match self.uniform_base(v, idx) {
                    // Equal over the strip: computed once, as a scalar.
                    Some(base) => {
                        let one = self.eval_inst(i, k, &Idx::affine(base, 1))?;
                        self.splat(one, idx.lanes)?
                    }
                    None => self.eval_inst(i, k, idx)?,
                }
            }
        };
        self.memo.insert(key, out);
        Ok(out)
    }

    /// The strip's first index when the axis analysis proves every element
    /// of `v` in strip `idx` equal (runs of equal values along the last
    /// dimension at least a strip long, the strip within one row).
    pub(super) fn uniform_base(&self, v: Value, idx: &Idx<'ctx>) -> Option<IntValue<'ctx>> {
        let IdxKind::Affine(base) = idx.kind else { return None };
        let shape = &self.f.ty(v).shape;
        let last = *shape.last()? as u64;
        let lanes = u64::from(idx.lanes);
        let k = self.axis.get(v).constancy.get(shape.len() - 1).copied().unwrap_or(1);
        (lanes > 1 && lanes <= last && k >= lanes).then_some(base)
    }

    /// The run length `c` (`1 < c < lanes`) of equal addresses (and mask
    /// values) along the last dimension of pointer tile `ptr` over strip
    /// `idx`, when the axis analysis proves one.
    fn repeats(&self, ptr: Value, mask: Option<Value>, idx: &Idx<'ctx>) -> Option<u32> {
        let IdxKind::Affine(_) = idx.kind else { return None };
        let shape = &self.f.ty(ptr).shape;
        let last = *shape.last()? as u64;
        let lanes = u64::from(idx.lanes);
        let dim = shape.len() - 1;
        let k = |v: Value| self.axis.get(v).constancy.get(dim).copied().unwrap_or(1);
        let c = k(ptr).min(mask.map_or(u64::MAX, k));
        (lanes <= last && c > 1 && c < lanes).then(|| 1u32 << c.ilog2())
    }

    /// For a pointer tile `p + off...` whose base `p` is equal over strip
    /// `idx`: the base and the offsets (`addptr` operands, one pointee).
    fn splits(&self, ptr: Value, idx: &Idx<'ctx>) -> Option<(Value, Vec<Value>)> {
        let mut offs = Vec::new();
        let mut p = ptr;
        loop {
            if !matches!(self.get(p), Ok(Repr::Inline)) {
                break;
            }
            let i = self.f.def_inst(p)?;
            let d = &self.f.insts[i];
            match d.op {
                Op::Arith(dsl_core::ir::ops::ArithOp::AddPtr) => {
                    offs.push(d.args[1]);
                    p = d.args[0];
                }
                _ => break,
            }
        }
        let uniform = match self.get(p) {
            Ok(Repr::Scalar(_)) => true,
            Ok(Repr::Inline) => {
                self.uniform_base(p, idx).is_some()
                    || self
                        .f
                        .def_inst(p)
                        .is_some_and(|i| matches!(self.f.insts[i].op, Op::Creation(CreationOp::Splat { .. })))
            }
            _ => false,
        };
        (uniform && !offs.is_empty() && self.f.ty(p).rank() > 0).then_some((p, offs))
    }

    /// The addresses of a gather from a strip-uniform base plus offsets,
    /// as a vector of pointers formed by one GEP (so the CPU's gather takes
    /// the base and 32-bit indices), or `None` when `ptr` is not of that
    /// form.
    /// `b0` is the strip's first index (where the base is evaluated).
    pub(super) fn split_gather(
        &mut self,
        ptr: Value,
        idx: &Idx<'ctx>,
        b0: IntValue<'ctx>,
    ) -> Result<Option<BasicValueEnum<'ctx>>> {
        let Some((p, offs)) = self.splits(ptr, &Idx::affine(b0, idx.lanes.max(2))) else { return Ok(None) };
        let base = self.eval(p, &Idx::affine(b0, 1))?;
        let base = self.lane(base, 0)?.into_int_value();
        let all_i32 = offs.iter().all(|&o| self.f.ty(o).dtype() == dsl_core::DType::I32);
        let mut sum: Option<BasicValueEnum<'ctx>> = None;
        for &o in &offs {
            let v = self.eval(o, idx)?;
            let v = if all_i32 { v } else { self.widen_i64(self.f.ty(o).elem, v)? };
            sum = Some(match sum {
                None => v,
                Some(s) => self.bin(Add, s, v)?,
            });
        }
        let Some(sum) = sum else { return Ok(None) };
        let pointee = self.f.ty(ptr).dtype();
        let elem_ty = self.int_type(8 * pointee.size_bytes() as u32);
        let base_ptr = self.addr_ptr(base)?;
        Ok(Some(self.vector_gep(elem_ty.into(), base_ptr, sum.into_vector_value())?))
    }

    /// Elements `idx` of the array `arr` of `elem`.
    pub(super) fn read_array(
        &self,
        elem: Elem,
        arr: inkwell::values::PointerValue<'ctx>,
        idx: &Idx<'ctx>,
    ) -> Result<BasicValueEnum<'ctx>> {
        match idx.kind {
            IdxKind::Affine(base) => self.load_strip(elem, arr, base, idx.lanes),
            IdxKind::General(g) => {
                let mut parts = Vec::with_capacity(idx.lanes as usize);
                for l in 0..idx.lanes {
                    let at = self.b.build_extract_element(g, self.c32(i64::from(l)), "")?.into_int_value();
                    parts.push(self.load_elem(elem, arr, at)?);
                }
                Ok(self.gather_lanes(self.reg_elem(elem), &parts)?.into())
            }
        }
    }

    /// The indices of a strip as an `<lanes x i32>` vector.
    pub(super) fn idx_vector(&self, idx: &Idx<'ctx>) -> Result<VectorValue<'ctx>> {
        match idx.kind {
            IdxKind::General(g) => Ok(g),
            IdxKind::Affine(base) => {
                let s = self.splat(base.into(), idx.lanes)?.into_vector_value();
                Ok(self.b.build_int_add(s, self.iota(idx.lanes), "")?)
            }
        }
    }

    /// Result `k` of instruction `i` (an inline op) at strip `idx`.
    pub(super) fn eval_inst(&mut self, i: Inst, k: usize, idx: &Idx<'ctx>) -> Result<BasicValueEnum<'ctx>> {
        let f = self.f;
        let d = &f.insts[i];
        let rty = f.ty(d.results[k]).clone();
        match &d.op {
            Op::Creation(CreationOp::Full { value, .. }) | Op::Creation(CreationOp::Const(value)) => {
                self.constant(*value, Some(idx.lanes))
            }
            Op::Creation(CreationOp::Splat { .. }) => {
                let s = self.scalar(d.args[0])?;
                self.splat(s, idx.lanes)
            }
            Op::Creation(CreationOp::Arange { start, .. }) => {
                let v = self.idx_vector(idx)?;
                let s = self.splat(self.c32(i64::from(*start)).into(), idx.lanes)?.into_vector_value();
                Ok(self.b.build_int_add(v, s, "")?.into())
            }
            Op::Shape(s) => self.eval_shape(i, k, s, &rty, idx),
            Op::Memory(op @ MemoryOp::Load { volatile, .. }) => {
                let volatile = *volatile;
                let ops = op.load_operands(&d.args).ok_or_else(|| self.unsupported(i, "load operands"))?;
                let (ptr_v, mask_v) = (ops.ptr, ops.mask);
                let access = if volatile { Access::Gather } else { self.access(ptr_v, mask_v, &rty, idx) };
                if access == Access::Gather
                    && !volatile
                    && let Some(c) = self.repeats(ptr_v, mask_v, idx)
                {
                    // Runs of `c` equal addresses (and masks): gather one
                    // lane per run, then repeat each `c` times.
                    let sub = idx.lanes / c;
                    let IdxKind::Affine(base) = idx.kind else {
                        return Err(self.unsupported(i, "strided gather"));
                    };
                    let step = self.splat(self.c32(i64::from(c)).into(), sub)?;
                    let at = self.bin(Mul, self.iota(sub).into(), step)?;
                    let at = self.bin(Add, self.splat(base.into(), sub)?, at)?.into_vector_value();
                    let sidx = Idx { lanes: sub, kind: IdxKind::General(at) };
                    let mask = ops.mask.map(|m| self.eval(m, &sidx)).transpose()?;
                    let other = ops.other.map(|o| self.eval(o, &sidx)).transpose()?;
                    let ptrs = match self.split_gather(ptr_v, &sidx, base)? {
                        Some(p) => p,
                        None => self.eval(ptr_v, &sidx)?,
                    };
                    let v = self.load_lanes(i, rty.elem, sub, ptrs, mask, other, Access::Gather, false)?;
                    let m: Vec<u32> = (0..idx.lanes).map(|l| l / c).collect();
                    let v = v.into_vector_value();
                    return Ok(self.b.build_shuffle_vector(v, v, self.const_i32s(&m), "")?.into());
                }
                // Contiguous and uniform accesses need lane 0's address only;
                // gathers may take a scalar base and offsets apart.
                let ptr = match (access, idx.kind) {
                    (Access::Contiguous | Access::Uniform, IdxKind::Affine(base)) => {
                        self.eval(ptr_v, &Idx::affine(base, 1))?
                    }
                    (Access::Gather, IdxKind::Affine(base)) if !volatile => {
                        match self.split_gather(ptr_v, idx, base)? {
                            Some(p) => p,
                            None => self.eval(ptr_v, idx)?,
                        }
                    }
                    _ => self.eval(ptr_v, idx)?,
                };
                let mask = ops.mask.map(|m| self.eval(m, idx)).transpose()?;
                let other = ops.other.map(|o| self.eval(o, idx)).transpose()?;
                self.load_lanes(i, rty.elem, idx.lanes, ptr, mask, other, access, volatile)
            }
            Op::Arith(_) | Op::Compare(_) | Op::Cast(_) | Op::Hint(_) => {
                let mut args = Vec::with_capacity(d.args.len());
                for &a in &d.args {
                    args.push(self.eval(a, idx)?);
                }
                let mut outs = self.elementwise(i, &args)?;
                if k < outs.len() {
                    Ok(outs.swap_remove(k))
                } else {
                    Err(self.unsupported(i, "missing result"))
                }
            }
            _ => Err(self.unsupported(i, "this op cannot be computed inline on the host")),
        }
    }

    /// How a load (or store) of pointer tile `ptr` accesses memory at `idx`.
    pub(super) fn access(&self, ptr: Value, mask: Option<Value>, ty: &Type, idx: &Idx<'ctx>) -> Access {
        let IdxKind::Affine(_) = idx.kind else { return Access::Gather };
        let last = ty.shape.last().copied().unwrap_or(1) as u64;
        let lanes = u64::from(idx.lanes);
        if ty.rank() == 0 || lanes > last {
            return Access::Gather;
        }
        let info = self.axis.get(ptr);
        let dim = ty.rank() - 1;
        let c = info.contiguity.get(dim).copied().unwrap_or(1);
        let k = info.constancy.get(dim).copied().unwrap_or(1);
        let mask_uniform =
            mask.is_none_or(|m| self.axis.get(m).constancy.get(dim).copied().unwrap_or(1) >= lanes);
        if c >= lanes && lanes > 1 {
            Access::Contiguous
        } else if k >= lanes && mask_uniform {
            Access::Uniform
        } else {
            Access::Gather
        }
    }

    /// The shape ops.
    fn eval_shape(
        &mut self,
        i: Inst,
        k: usize,
        op: &ShapeOp,
        rty: &Type,
        idx: &Idx<'ctx>,
    ) -> Result<BasicValueEnum<'ctx>> {
        let f = self.f;
        let d = &f.insts[i];
        let src = d.args[0];
        let sty = f.ty(src).clone();
        match op {
            ShapeOp::ExpandDims { .. } | ShapeOp::Reshape { .. } => self.eval(src, idx),
            ShapeOp::Broadcast { .. } => {
                let mapped = self.map_broadcast(&rty.shape, &sty.shape, idx)?;
                self.eval_at(src, mapped, idx.lanes)
            }
            ShapeOp::Permute { order } => {
                let mapped = self.map_permute(&rty.shape, &sty.shape, order, idx)?;
                self.eval_at(src, mapped, idx.lanes)
            }
            ShapeOp::Join => self.eval_join(d.args[0], d.args[1], idx),
            ShapeOp::Split => self.eval_split(src, k, idx),
        }
    }

    /// `v` at a mapped source strip, splatting a uniform one.
    fn eval_at(&mut self, v: Value, s: Source<'ctx>, lanes: u32) -> Result<BasicValueEnum<'ctx>> {
        match s {
            Source::At(idx) => self.eval(v, &idx),
            Source::Uniform(at) => {
                let one = self.eval(v, &Idx::affine(at, 1))?;
                self.splat(one, lanes)
            }
            Source::Repeat { base, times } => {
                let part = self.eval(v, &Idx::affine(base, lanes / times))?.into_vector_value();
                let mask: Vec<u32> = (0..lanes).map(|l| l / times).collect();
                Ok(self.b.build_shuffle_vector(part, part, self.const_i32s(&mask), "")?.into())
            }
            Source::Tile { base, period } => {
                let part = self.eval(v, &Idx::affine(base, period))?.into_vector_value();
                let mask: Vec<u32> = (0..lanes).map(|l| l % period).collect();
                Ok(self.b.build_shuffle_vector(part, part, self.const_i32s(&mask), "")?.into())
            }
        }
    }

    /// Coordinate `d` of flat index `x` (an `i32` scalar or vector) in `shape`.
    fn coord(&self, x: BasicValueEnum<'ctx>, shape: &[usize], d: usize) -> Result<BasicValueEnum<'ctx>> {
        let st = super::types::strides(shape);
        let q = self.bin(LShr, x, self.int_like(x, st[d].trailing_zeros() as u64)?)?;
        self.bin(And, q, self.int_like(x, shape[d] as u64 - 1)?)
    }

    /// The flat source index of a broadcast from `from` to `to`, for the
    /// result index `x` (scalar or vector): the sum over the dimensions the
    /// source keeps of coordinate times source stride.
    fn broadcast_index(
        &self,
        x: BasicValueEnum<'ctx>,
        to: &[usize],
        from: &[usize],
    ) -> Result<BasicValueEnum<'ctx>> {
        let fs = super::types::strides(from);
        let mut acc = self.int_like(x, 0)?;
        for d in 0..to.len() {
            if from[d] == 1 {
                continue;
            }
            let c = self.coord(x, to, d)?;
            let c = self.bin(Shl, c, self.int_like(x, fs[d].trailing_zeros() as u64)?)?;
            acc = self.bin(Add, acc, c)?;
        }
        Ok(acc)
    }

    /// Where a broadcast from `from` to `to` reads for strip `idx`.
    fn map_broadcast(&self, to: &[usize], from: &[usize], idx: &Idx<'ctx>) -> Result<Source<'ctx>> {
        let last = to.last().copied().unwrap_or(1) as u32;
        if let IdxKind::Affine(base) = idx.kind
            && idx.lanes <= last
        {
            let src = self.broadcast_index(base.into(), to, from)?.into_int_value();
            if from.last() == to.last() {
                return Ok(Source::At(Idx::affine(src, idx.lanes)));
            }
            return Ok(Source::Uniform(src));
        }
        if let IdxKind::Affine(base) = idx.kind {
            let n = to.len();
            // Broadcast along trailing dimensions only: the source index is
            // the result index divided by their extent.
            let k = (0..n).rev().take_while(|&d| from[d] == 1).count();
            if from[..n - k] == to[..n - k] {
                let r = to[n - k..].iter().product::<usize>() as u32;
                let src =
                    self.b.build_right_shift(base, self.c32(i64::from(r.trailing_zeros())), false, "")?;
                if r >= idx.lanes {
                    return Ok(Source::Uniform(src));
                }
                return Ok(Source::Repeat { base: src, times: r });
            }
            // Broadcast along leading dimensions only: the source index is
            // the result index modulo the source's size.
            let j = (0..n).take_while(|&d| from[d] == 1).count();
            if from[j..] == to[j..] {
                let t = from.iter().product::<usize>() as u32;
                let src = self.b.build_and(base, self.c32(i64::from(t) - 1), "")?;
                if t >= idx.lanes {
                    return Ok(Source::At(Idx::affine(src, idx.lanes)));
                }
                return Ok(Source::Tile { base: src, period: t });
            }
        }
        let x = self.idx_vector(idx)?;
        let src = self.broadcast_index(x.into(), to, from)?.into_vector_value();
        Ok(Source::At(Idx { lanes: idx.lanes, kind: IdxKind::General(src) }))
    }

    /// Where a permute with `order` (result dimension `i` is source
    /// dimension `order[i]`) reads for strip `idx`.
    fn map_permute(
        &self,
        to: &[usize],
        from: &[usize],
        order: &[usize],
        idx: &Idx<'ctx>,
    ) -> Result<Source<'ctx>> {
        let fs = super::types::strides(from);
        let n = to.len();
        let last = to.last().copied().unwrap_or(1) as u32;
        let keeps_last = order.last() == Some(&(n - 1));
        let affine = match idx.kind {
            IdxKind::Affine(base) if idx.lanes <= last && keeps_last => Some(base),
            _ => None,
        };
        let x: BasicValueEnum<'ctx> = match affine {
            Some(base) => base.into(),
            None => self.idx_vector(idx)?.into(),
        };
        let mut acc = self.int_like(x, 0)?;
        for (dd, &o) in order.iter().enumerate() {
            let c = self.coord(x, to, dd)?;
            let c = self.bin(Shl, c, self.int_like(x, fs[o].trailing_zeros() as u64)?)?;
            acc = self.bin(Add, acc, c)?;
        }
        Ok(Source::At(match acc {
            BasicValueEnum::VectorValue(g) => Idx { lanes: idx.lanes, kind: IdxKind::General(g) },
            other => Idx::affine(other.into_int_value(), idx.lanes),
        }))
    }

    /// `join a, b` at `idx`: element `2j + h` is `a[j]` (`h = 0`) or `b[j]`.
    fn eval_join(&mut self, a: Value, b: Value, idx: &Idx<'ctx>) -> Result<BasicValueEnum<'ctx>> {
        let lanes = idx.lanes;
        if let IdxKind::Affine(base) = idx.kind
            && lanes >= 2
        {
            let half = Idx::affine(self.b.build_right_shift(base, self.c32(1), false, "")?, lanes / 2);
            let va = self.eval(a, &half)?.into_vector_value();
            let vb = self.eval(b, &half)?.into_vector_value();
            let mask: Vec<u32> = (0..lanes).map(|l| (l / 2) + (l % 2) * (lanes / 2)).collect();
            return Ok(self.b.build_shuffle_vector(va, vb, self.const_i32s(&mask), "")?.into());
        }
        let x = self.idx_vector(idx)?;
        let one = self.splat(self.c32(1).into(), lanes)?.into_vector_value();
        let src = self.b.build_right_shift(x, one, false, "")?;
        let sidx = Idx { lanes, kind: IdxKind::General(src) };
        let va = self.eval(a, &sidx)?;
        let vb = self.eval(b, &sidx)?;
        let odd = self.b.build_and(x, one, "")?;
        let is_odd = self.b.build_int_compare(
            inkwell::IntPredicate::NE,
            odd,
            self.i32t().vec_type(lanes).const_zero(),
            "",
        )?;
        Ok(self.b.build_select(is_odd, vb, va, "")?)
    }

    /// Result `k` of `split x` at `idx`: element `j` is `x[2j + k]`.
    fn eval_split(&mut self, x: Value, k: usize, idx: &Idx<'ctx>) -> Result<BasicValueEnum<'ctx>> {
        let lanes = idx.lanes;
        if let IdxKind::Affine(base) = idx.kind {
            let wide = Idx::affine(self.b.build_left_shift(base, self.c32(1), "")?, 2 * lanes);
            let vx = self.eval(x, &wide)?.into_vector_value();
            let mask: Vec<u32> = (0..lanes).map(|l| 2 * l + k as u32).collect();
            return Ok(self.b.build_shuffle_vector(vx, vx, self.const_i32s(&mask), "")?.into());
        }
        let v = self.idx_vector(idx)?;
        let one = self.splat(self.c32(1).into(), lanes)?.into_vector_value();
        let kk = self.splat(self.c32(k as i64).into(), lanes)?.into_vector_value();
        let two = self.b.build_left_shift(v, one, "")?;
        let src = self.b.build_int_add(two, kk, "")?;
        self.eval(x, &Idx { lanes, kind: IdxKind::General(src) })
    }
}
