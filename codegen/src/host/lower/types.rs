//! Types, constants, arrays and loops of host code.
//!
//! Register representation of an element (`reg_elem`): `i1` for booleans,
//! `iN` for integers, `f32` for f32/f16/bf16 (halves are f32 values already
//! rounded to their dtype, as the interpreter keeps them), `f64`, and `i64`
//! addresses for pointers. A value of a strip of `lanes` elements is an LLVM
//! vector `<lanes x elem>` (also for one lane); a rank-0 value is a plain
//! scalar. Arrays store the same elements, booleans as `i8` (0 or 1).
//! Flat element indices are `i32` (tiles hold at most 2^24 elements).

use super::Lower;
use crate::llvm::{BV, Values, scalar_type};
use crate::{Error, Result};
use dsl_core::{DType, Elem};
use inkwell::AddressSpace;
use inkwell::IntPredicate;
use inkwell::basic_block::BasicBlock;
use inkwell::context::Context;
use inkwell::types::{BasicType, BasicTypeEnum, IntType, VectorType};
use inkwell::values::{BasicValue, BasicValueEnum, InstructionOpcode, IntValue, PointerValue, VectorValue};

impl<'ctx> Lower<'ctx, '_> {
    /// The register type of one element of `elem`.
    pub(super) fn reg_elem(&self, elem: Elem) -> BasicTypeEnum<'ctx> {
        match elem {
            // Addresses are integers; halves and 8-bit floats are held as
            // their (exact) f32 values.
            Elem::Ptr(_) => self.ctx.i64_type().into(),
            Elem::Scalar(d) if d.is_float() && d.bits() < 32 => self.ctx.f32_type().into(),
            Elem::Scalar(d) => scalar_type(self.ctx, d),
        }
    }

    /// The array (storage) type of one element of `elem`.
    pub(super) fn mem_elem(&self, elem: Elem) -> BasicTypeEnum<'ctx> {
        match elem {
            Elem::Scalar(DType::I1) => self.ctx.i8_type().into(),
            e => self.reg_elem(e),
        }
    }

    /// `<lanes x ty>`.
    pub(super) fn vec_of(&self, ty: BasicTypeEnum<'ctx>, lanes: u32) -> VectorType<'ctx> {
        match ty {
            BasicTypeEnum::IntType(t) => t.vec_type(lanes),
            BasicTypeEnum::FloatType(t) => t.vec_type(lanes),
            BasicTypeEnum::PointerType(t) => t.vec_type(lanes),
            BasicTypeEnum::VectorType(t) => t,
            other => other.into_int_type().vec_type(lanes),
        }
    }

    /// The register type of a strip of `lanes` elements of `elem`.
    pub(super) fn reg_vec(&self, elem: Elem, lanes: u32) -> VectorType<'ctx> {
        self.vec_of(self.reg_elem(elem), lanes)
    }

    /// The integer type of `bits` bits (1, 8, 16, 32, 64 or 128).
    pub(super) fn int_type(&self, bits: u32) -> IntType<'ctx> {
        match bits {
            1 => self.ctx.bool_type(),
            8 => self.ctx.i8_type(),
            16 => self.ctx.i16_type(),
            32 => self.ctx.i32_type(),
            128 => self.ctx.i128_type(),
            _ => self.ctx.i64_type(),
        }
    }

    /// `i32`.
    pub(super) fn i32t(&self) -> IntType<'ctx> {
        self.ctx.i32_type()
    }

    /// The `i32` constant `v`.
    pub(super) fn c32(&self, v: i64) -> IntValue<'ctx> {
        self.ctx.i32_type().const_int(v as u64, true)
    }

    /// The constant of register element type `ty` with integer value `v`
    /// (floats convert), as a scalar.
    pub(super) fn const_scalar(&self, ty: BasicTypeEnum<'ctx>, v: f64, bits: u64) -> BasicValueEnum<'ctx> {
        match ty {
            BasicTypeEnum::IntType(t) => t.const_int(bits, false).into(),
            BasicTypeEnum::FloatType(t) => t.const_float(v).into(),
            other => other.const_zero(),
        }
    }

    /// `x` repeated over `lanes` lanes (a scalar, or a one-lane vector).
    pub(super) fn splat(&self, x: BasicValueEnum<'ctx>, lanes: u32) -> Result<BasicValueEnum<'ctx>> {
        let x = match x {
            BasicValueEnum::VectorValue(v) => {
                if v.get_type().get_size() == lanes {
                    return Ok(x);
                }
                self.b.build_extract_element(v, self.c32(0), "")?
            }
            s => s,
        };
        let vt = self.vec_of(x.get_type(), lanes);
        let one = self.b.build_insert_element(vt.get_undef(), x, self.c32(0), "")?;
        let zeros = self.i32t().vec_type(lanes).const_zero();
        Ok(self.b.build_shuffle_vector(one, vt.get_undef(), zeros, "")?.into())
    }

    /// The constant vector `<0, 1, ..., lanes - 1>` (`i32`).
    pub(super) fn iota(&self, lanes: u32) -> VectorValue<'ctx> {
        let t = self.i32t();
        let items: Vec<IntValue<'ctx>> = (0..lanes).map(|i| t.const_int(u64::from(i), false)).collect();
        VectorType::const_vector(&items)
    }

    /// The constant `i32` vector with `items`.
    pub(super) fn const_i32s(&self, items: &[u32]) -> VectorValue<'ctx> {
        let t = self.i32t();
        let v: Vec<IntValue<'ctx>> = items.iter().map(|&i| t.const_int(u64::from(i), false)).collect();
        VectorType::const_vector(&v)
    }

    /// Lane `i` of a vector.
    pub(super) fn lane(&self, v: BasicValueEnum<'ctx>, i: u32) -> Result<BasicValueEnum<'ctx>> {
        match v {
            BasicValueEnum::VectorValue(v) => {
                Ok(self.b.build_extract_element(v, self.c32(i64::from(i)), "")?)
            }
            s => Ok(s),
        }
    }

    /// The lanes `start..start + n` of a vector.
    pub(super) fn sub_vector(&self, v: VectorValue<'ctx>, start: u32, n: u32) -> Result<VectorValue<'ctx>> {
        let mask: Vec<u32> = (start..start + n).collect();
        Ok(self.b.build_shuffle_vector(v, v.get_type().get_undef(), self.const_i32s(&mask), "")?)
    }

    /// Builds a vector of `lanes` lanes from `parts`, lane by lane.
    pub(super) fn gather_lanes(
        &self,
        ty: BasicTypeEnum<'ctx>,
        parts: &[BasicValueEnum<'ctx>],
    ) -> Result<VectorValue<'ctx>> {
        let mut v = self.vec_of(ty, parts.len() as u32).get_undef();
        for (i, &p) in parts.iter().enumerate() {
            v = self.b.build_insert_element(v, p, self.c32(i as i64), "")?;
        }
        Ok(v)
    }

    /// A pointer to element `idx` of an array of `elem` at `base`.
    pub(super) fn elem_ptr(
        &self,
        elem_ty: BasicTypeEnum<'ctx>,
        base: PointerValue<'ctx>,
        idx: IntValue<'ctx>,
    ) -> Result<PointerValue<'ctx>> {
        // SAFETY: building a GEP instruction has no effect on this process;
        // the lowering only forms indices inside the array it addresses.
        Ok(unsafe { self.b.build_gep(elem_ty, base, &[idx], "")? })
    }

    /// The vector of pointers `base + idx[l] * sizeof(elem_ty)` (one GEP
    /// with a vector index, which the CPU's gathers take as base and
    /// indices).
    pub(super) fn vector_gep(
        &self,
        elem_ty: BasicTypeEnum<'ctx>,
        base: PointerValue<'ctx>,
        idx: VectorValue<'ctx>,
    ) -> Result<BasicValueEnum<'ctx>> {
        use inkwell::llvm_sys::core::LLVMBuildGEP2;
        use inkwell::types::AsTypeRef;
        use inkwell::values::AsValueRef;
        let mut indices = [idx.as_value_ref()];
        let name = c"";
        // SAFETY: the builder is positioned (the lowering only emits into a
        // block); the operands are live values of this context; a GEP with
        // a scalar base and a vector index is valid IR and yields a vector
        // of pointers, which `BasicValueEnum::new` wraps.
        unsafe {
            let v = LLVMBuildGEP2(
                self.b.as_mut_ptr(),
                elem_ty.as_type_ref(),
                base.as_value_ref(),
                indices.as_mut_ptr(),
                1,
                name.as_ptr(),
            );
            Ok(BasicValueEnum::new(v))
        }
    }

    /// A fresh stack array of `n` elements of `elem` (64-byte aligned),
    /// allocated in the entry block.
    pub(super) fn alloc_array(&mut self, elem: Elem, n: usize) -> Result<PointerValue<'ctx>> {
        let ty = self.mem_elem(elem);
        let size = ty.size_of().and_then(|s| s.get_zero_extended_constant()).unwrap_or(8);
        self.frame_bytes += size * n as u64;
        let arr =
            ty.array_type(u32::try_from(n).map_err(|_| Error::Invalid(format!("a tile of {n} elements")))?);
        self.alloca(arr.as_basic_type_enum(), 64)
    }

    /// A stack slot of type `ty` in the entry block.
    pub(super) fn alloca(&self, ty: BasicTypeEnum<'ctx>, align: u32) -> Result<PointerValue<'ctx>> {
        let here = self.b.get_insert_block();
        match self.allocas.get_terminator() {
            Some(t) => self.b.position_before(&t),
            None => self.b.position_at_end(self.allocas),
        }
        let p = self.b.build_alloca(ty, "")?;
        if let Some(inst) = p.as_instruction_value() {
            let _ = inst.set_alignment(align);
        }
        if let Some(h) = here {
            self.b.position_at_end(h);
        }
        Ok(p)
    }

    /// Loads `lanes` consecutive elements of `elem` from `arr` at `idx`, in
    /// register form.
    pub(super) fn load_strip(
        &self,
        elem: Elem,
        arr: PointerValue<'ctx>,
        idx: IntValue<'ctx>,
        lanes: u32,
    ) -> Result<BasicValueEnum<'ctx>> {
        let mt = self.mem_elem(elem);
        let p = self.elem_ptr(mt, arr, idx)?;
        let vt = self.vec_of(mt, lanes);
        let v = self.b.build_load(vt, p, "")?;
        set_align(v, elem_size(elem));
        self.to_reg(elem, v)
    }

    /// Stores a register strip `v` of `elem` to `arr` at `idx`.
    pub(super) fn store_strip(
        &self,
        elem: Elem,
        arr: PointerValue<'ctx>,
        idx: IntValue<'ctx>,
        v: BasicValueEnum<'ctx>,
    ) -> Result<()> {
        let mt = self.mem_elem(elem);
        let p = self.elem_ptr(mt, arr, idx)?;
        let m = self.to_mem(elem, v)?;
        let st = self.b.build_store(p, m)?;
        let _ = st.set_alignment(elem_size(elem));
        Ok(())
    }

    /// Loads one element (a scalar) of `elem` from `arr` at `idx`.
    pub(super) fn load_elem(
        &self,
        elem: Elem,
        arr: PointerValue<'ctx>,
        idx: IntValue<'ctx>,
    ) -> Result<BasicValueEnum<'ctx>> {
        let mt = self.mem_elem(elem);
        let p = self.elem_ptr(mt, arr, idx)?;
        let v = self.b.build_load(mt, p, "")?;
        set_align(v, elem_size(elem));
        self.to_reg(elem, v)
    }

    /// Array form to register form (booleans: `i8` to `i1`).
    fn to_reg(&self, elem: Elem, v: BasicValueEnum<'ctx>) -> Result<BasicValueEnum<'ctx>> {
        if elem != Elem::Scalar(DType::I1) {
            return Ok(v);
        }
        let z = v.get_type().const_zero();
        self.icmp(inkwell::IntPredicate::NE, v, z)
    }

    /// Register form to array form (booleans: `i1` to `i8`).
    fn to_mem(&self, elem: Elem, v: BasicValueEnum<'ctx>) -> Result<BasicValueEnum<'ctx>> {
        if elem != Elem::Scalar(DType::I1) {
            return Ok(v);
        }
        let lanes = match v {
            BasicValueEnum::VectorValue(x) => Some(x.get_type().get_size()),
            _ => None,
        };
        let to: BasicTypeEnum<'ctx> = match lanes {
            Some(n) => self.ctx.i8_type().vec_type(n).into(),
            None => self.ctx.i8_type().into(),
        };
        Ok(self.b.build_cast(inkwell::values::InstructionOpcode::ZExt, v, to, "")?)
    }

    /// Emits `body` for each strip of `lanes` elements of an `n`-element
    /// tile (its base element the argument): unrolled, every strip at a
    /// constant offset, for at most [`UNROLL_TRIPS`] strips (so LLVM keeps a
    /// small tile carried by a loop, an accumulator, in registers rather
    /// than in its stack array), else a loop ([`Lower::emit_loop`]).
    pub(super) fn emit_strips(
        &mut self,
        n: usize,
        lanes: u32,
        mut body: impl FnMut(&mut Self, IntValue<'ctx>) -> Result<()>,
    ) -> Result<()> {
        let lanes = lanes.max(1) as usize;
        if n.div_ceil(lanes) <= UNROLL_TRIPS {
            for base in (0..n).step_by(lanes) {
                body(self, self.c32(base as i64))?;
            }
            return Ok(());
        }
        self.emit_loop(self.c32(0), self.c32(n as i64), lanes as i64, true, body)
    }

    /// Emits `for iv in (start..end).step_by(step)` with a body that runs at
    /// least once when `at_least_once` (the bounds are constants with
    /// `start < end`): a bottom-tested loop with an `i32` induction phi.
    pub(super) fn emit_loop(
        &mut self,
        start: IntValue<'ctx>,
        end: IntValue<'ctx>,
        step: i64,
        at_least_once: bool,
        mut body: impl FnMut(&mut Self, IntValue<'ctx>) -> Result<()>,
    ) -> Result<()> {
        let pre = self.cur_block()?;
        let head = self.ctx.append_basic_block(self.func, "loop");
        let exit = self.ctx.append_basic_block(self.func, "loop.end");
        if at_least_once {
            self.b.build_unconditional_branch(head)?;
        } else {
            let go = self.b.build_int_compare(inkwell::IntPredicate::SLT, start, end, "")?;
            self.b.build_conditional_branch(go, head, exit)?;
        }
        self.b.position_at_end(head);
        let iv = self.b.build_phi(self.i32t(), "iv")?;
        iv.add_incoming(&[(&start, pre)]);
        let ivv = iv.as_basic_value().into_int_value();
        body(self, ivv)?;
        let next = self.b.build_int_add(ivv, self.c32(step), "")?;
        let latch = self.cur_block()?;
        iv.add_incoming(&[(&next, latch)]);
        let more = self.b.build_int_compare(inkwell::IntPredicate::SLT, next, end, "")?;
        self.b.build_conditional_branch(more, head, exit)?;
        self.b.position_at_end(exit);
        Ok(())
    }

    /// Element type `elem` with the shape of `v` (scalar, or as many lanes).
    pub(super) fn like(&self, v: BasicValueEnum<'ctx>, elem: BasicTypeEnum<'ctx>) -> BasicTypeEnum<'ctx> {
        match v {
            BasicValueEnum::VectorValue(x) => self.vec_of(elem, x.get_type().get_size()).into(),
            _ => elem,
        }
    }

    /// The number of lanes of `v` (`None` for a scalar).
    pub(super) fn lanes_of(&self, v: BasicValueEnum<'ctx>) -> Option<u32> {
        match v {
            BasicValueEnum::VectorValue(x) => Some(x.get_type().get_size()),
            _ => None,
        }
    }

    /// The block the builder is in.
    pub(super) fn cur_block(&self) -> Result<BasicBlock<'ctx>> {
        self.b.get_insert_block().ok_or_else(|| Error::Llvm("the builder is not positioned".into()))
    }

    /// A pointer to the `i64` address `a` (a scalar).
    pub(super) fn addr_ptr(&self, a: IntValue<'ctx>) -> Result<PointerValue<'ctx>> {
        Ok(self.b.build_int_to_ptr(a, self.ctx.ptr_type(AddressSpace::default()), "")?)
    }
}

/// The most strips [`Lower::emit_strips`] emits unrolled.
const UNROLL_TRIPS: usize = 32;

/// Sets the alignment of a load or store instruction (ignored otherwise).
pub(super) fn set_align(v: BasicValueEnum<'_>, align: u32) {
    if let Some(i) = v.as_instruction_value() {
        let _ = i.set_alignment(align);
    }
}

/// The size in bytes of one array element of `elem` (`i1` takes a byte).
pub(super) fn elem_size(elem: Elem) -> u32 {
    match elem {
        Elem::Ptr(_) => 8,
        Elem::Scalar(d) => match d {
            d if d.is_float() && d.bits() < 32 => 4,
            d => d.size_bytes() as u32,
        },
    }
}

/// The row-major strides of `shape`.
pub(super) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// The value operations on scalars or vectors alike: constants and cast
/// types take the shape (scalar, or as many lanes) of the value they go with.
impl<'ctx> Values<'ctx> for Lower<'ctx, '_> {
    fn bin(&self, op: InstructionOpcode, a: BV<'ctx>, b: BV<'ctx>) -> Result<BV<'ctx>> {
        Ok(self.b.build_binop(op, a, b, "")?)
    }

    fn icmp(&self, p: IntPredicate, a: BV<'ctx>, b: BV<'ctx>) -> Result<BV<'ctx>> {
        Ok(match (a, b) {
            (BasicValueEnum::IntValue(x), BasicValueEnum::IntValue(y)) => {
                self.b.build_int_compare(p, x, y, "")?.into()
            }
            (BasicValueEnum::VectorValue(x), BasicValueEnum::VectorValue(y)) => {
                self.b.build_int_compare(p, x, y, "")?.into()
            }
            _ => return Err(Error::Llvm("host lowering: icmp of mismatched operands".into())),
        })
    }

    fn select(&self, c: BV<'ctx>, a: BV<'ctx>, b: BV<'ctx>) -> Result<BV<'ctx>> {
        Ok(match c {
            BasicValueEnum::IntValue(x) => self.b.build_select(x, a, b, "")?,
            BasicValueEnum::VectorValue(x) => self.b.build_select(x, a, b, "")?,
            _ => return Err(Error::Llvm("host lowering: select on a non-boolean".into())),
        })
    }

    fn int_like(&self, v: BV<'ctx>, c: u64) -> Result<BV<'ctx>> {
        Ok(match v {
            BasicValueEnum::IntValue(x) => x.get_type().const_int(c, false).into(),
            BasicValueEnum::VectorValue(x) => {
                let et = x.get_type().get_element_type().into_int_type();
                self.splat(et.const_int(c, false).into(), x.get_type().get_size())?
            }
            _ => return Err(Error::Llvm("host lowering: an integer constant for a non-integer".into())),
        })
    }

    fn float_like(&self, v: BV<'ctx>, c: f64) -> Result<BV<'ctx>> {
        Ok(match v {
            BasicValueEnum::FloatValue(x) => x.get_type().const_float(c).into(),
            BasicValueEnum::VectorValue(x) => {
                let et = x.get_type().get_element_type().into_float_type();
                self.splat(et.const_float(c).into(), x.get_type().get_size())?
            }
            _ => return Err(Error::Llvm("host lowering: a float constant for a non-float".into())),
        })
    }

    fn cast_to(&self, op: InstructionOpcode, v: BV<'ctx>, to: BasicTypeEnum<'ctx>) -> Result<BV<'ctx>> {
        let ty = self.like(v, to);
        Ok(self.b.build_cast(op, v, ty, "")?)
    }

    fn context(&self) -> &'ctx Context {
        self.ctx
    }
}
