//! The kernel's entry: its plan (`plan.rs`, built before any LLVM is
//! emitted), the LLVM function with its parameters (hidden tensor maps last,
//! as 128-byte grid constants), its `nvvm.annotations` (`maxntid`, the
//! occupancy hint), and the lowering of the body.

use super::plan::KernelPlan;
use super::{LoopState, Lowerer, PTX_KERNEL_CC, reg_type};
use crate::{Error, Result};
use dsl_core::Function;
use dsl_core::dtype::{DType, Elem};
use inkwell::AddressSpace;
use inkwell::attributes::AttributeLoc;
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::types::{BasicMetadataTypeEnum, BasicTypeEnum};
use rustc_hash::FxHashMap;

/// What lowering a kernel decided that its launch needs.
pub(crate) struct Lowered {
    /// Dynamic shared memory in bytes.
    pub smem_bytes: u32,
    /// The hidden tensor-map parameters after the author's, in order.
    pub tensor_maps: Vec<crate::tensor_map::TensorMapSpec>,
}

/// Lowers `f` (canonicalized, its `load_block`s expanded) into `module` as
/// a kernel, as `plan` decided; returns what its launch needs.
pub(crate) fn lower_planned<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    f: &Function,
    plan: &KernelPlan,
) -> Result<Lowered> {
    let threads = plan.threads;
    let mut params: Vec<BasicMetadataTypeEnum<'ctx>> = Vec::new();
    for p in &f.params {
        let ty = f.ty(p.value);
        if !ty.is_scalar() {
            return Err(Error::Invalid(format!(
                "kernel parameter `{}` must be a scalar, found {ty}",
                p.name
            )));
        }
        params.push(param_type(ctx, ty.elem).into());
    }
    // Hidden tensor-map parameters: 128-byte grid constants (`crate::tensor_map`).
    let ntm = plan.pipe.tensor_maps.len();
    for _ in 0..ntm {
        params.push(ctx.ptr_type(AddressSpace::default()).into());
    }
    let fn_ty = ctx.void_type().fn_type(&params, false);
    let func = module.add_function(&f.name, fn_ty, None);
    func.set_call_conventions(PTX_KERNEL_CC);
    let tstr = threads.to_string();
    func.add_attribute(AttributeLoc::Function, ctx.create_string_attribute("nvvm.maxntid", &tstr));
    let min_ctas = plan.min_ctas;
    if let Some(n) = min_ctas {
        func.add_attribute(
            AttributeLoc::Function,
            ctx.create_string_attribute("nvvm.minctasm", &n.to_string()),
        );
    }
    let i32t = ctx.i32_type();
    let annotations = [("kernel", Some(1u64)), ("maxntid", Some(threads as u64)), ("minctasm", min_ctas)];
    for (key, val) in annotations.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))) {
        let md = ctx.metadata_node(&[
            func.as_global_value().as_pointer_value().into(),
            ctx.metadata_string(key).into(),
            i32t.const_int(val, false).into(),
        ]);
        module.add_global_metadata("nvvm.annotations", &md).map_err(|e| Error::Llvm(e.to_string()))?;
    }
    for (i, p) in f.params.iter().enumerate() {
        if let Some(pv) = func.get_nth_param(i as u32) {
            pv.set_name(&p.name);
        }
    }
    let map_ty = ctx.i8_type().array_type(128);
    let kind = inkwell::attributes::Attribute::get_named_enum_kind_id;
    for j in 0..ntm {
        let at = AttributeLoc::Param((f.params.len() + j) as u32);
        func.add_attribute(
            at,
            ctx.create_type_attribute(kind("byval"), inkwell::types::AnyType::as_any_type_enum(&map_ty)),
        );
        func.add_attribute(at, ctx.create_enum_attribute(kind("align"), 64));
        func.add_attribute(at, ctx.create_string_attribute("nvvm.grid_constant", ""));
    }
    let entry = ctx.append_basic_block(func, "entry");
    let b = ctx.create_builder();
    b.position_at_end(entry);
    let mut lw = Lowerer {
        ctx,
        module,
        b,
        func,
        f,
        plan,
        vals: FxHashMap::default(),
        tid: i32t.const_zero(),
        smem: None,
        smem_bytes: 0,
        loops: LoopState::default(),
        blocked: FxHashMap::default(),
        overrides: FxHashMap::default(),
        opts: plan.opts,
        tmaps: Vec::new(),
    };
    lw.tid = lw.sreg("llvm.nvvm.read.ptx.sreg.tid.x")?;
    for (i, p) in f.params.iter().enumerate() {
        let pv =
            func.get_nth_param(i as u32).ok_or_else(|| Error::Llvm(format!("missing LLVM parameter {i}")))?;
        let v = if f.ty(p.value).elem == Elem::Scalar(DType::I1) {
            let z = i32t.const_zero();
            lw.b.build_int_compare(inkwell::IntPredicate::NE, pv.into_int_value(), z, "")?.into()
        } else {
            pv
        };
        lw.vals.insert(p.value, vec![v]);
    }
    for j in 0..ntm {
        let i = f.params.len() + j;
        let pv =
            func.get_nth_param(i as u32).ok_or_else(|| Error::Llvm(format!("missing LLVM parameter {i}")))?;
        pv.set_name(&format!("tensor_map_{j}"));
        // The generic address of the grid constant (`cvta.param`).
        let a = lw.b.build_ptr_to_int(pv.into_pointer_value(), ctx.i64_type(), "")?;
        lw.tmaps.push(a);
    }
    lw.lower_block(f.body_block())?;
    lw.b.build_return(None)?;
    let tensor_maps = plan.pipe.tensor_maps.clone();
    Ok(Lowered { smem_bytes: lw.smem_bytes, tensor_maps })
}

/// The LLVM parameter type of a scalar kernel parameter (`i1` travels as `i32`).
fn param_type(ctx: &Context, e: Elem) -> BasicTypeEnum<'_> {
    match e {
        Elem::Scalar(DType::I1) => ctx.i32_type().into(),
        other => reg_type(ctx, other),
    }
}
