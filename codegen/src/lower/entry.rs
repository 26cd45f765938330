//! The kernel's entry: the planning passes that run before any lowering
//! (tensor-core plan, pipeline, resident operands, layouts, partial row
//! sums), the LLVM function with its parameters (hidden tensor maps last,
//! as 128-byte grid constants), its `nvvm.annotations` (`maxntid`, the
//! occupancy hint), and the lowering of the body.

use super::{Lowerer, PTX_KERNEL_CC, dot, layouts, partial, pipeline, reg_type};
use crate::{CompileOptions, Error, Result};
use dsl_core::Function;
use dsl_core::dtype::{DType, Elem};
use dsl_core::ir::Inst;
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
    pub tensor_maps: Vec<crate::tma::TensorMapSpec>,
}

/// Lowers `f` into `module` as a kernel (its `load_block`s expanded into the
/// loads of `blocks`, see `dsl_core::passes::block_load`); returns what its
/// launch needs.
pub(crate) fn lower_function<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    f: &Function,
    blocks: &FxHashMap<Inst, dsl_core::passes::block_load::BlockLoad>,
    opts: &CompileOptions,
) -> Result<Lowered> {
    let threads = 32 * opts.num_warps as usize;
    let axis = dsl_core::passes::axis::analyze(f);
    // The narrowest element any load or store moves decides how many elements a
    // chunk may hold, so that accesses can be 16 bytes wide.
    let mut min_bytes = 4usize;
    f.walk(|i| {
        if let dsl_core::Op::Memory(
            dsl_core::ir::ops::MemoryOp::Load { .. } | dsl_core::ir::ops::MemoryOp::Store { .. },
        ) = &f.insts[i].op
            && let Some(&p) = f.insts[i].args.first()
        {
            let d = f.ty(p).dtype();
            if d != dsl_core::DType::I1 {
                min_bytes = min_bytes.min(d.size_bytes());
            }
        }
    });
    let spt_cap = crate::layout::spt_cap_for(min_bytes);
    let stages = opts.num_stages.max(1) as usize;
    let mut mma = dot::plan::plan(f, threads / 32, opts.target, stages);
    let mut pipe = pipeline::analyze(f, &mma, &axis, blocks, threads, spt_cap, stages);
    // `wgmma` candidates the pipeline could not feed go back to the `mma.sync` warp grid.
    mma.settle_wgmma(f, &pipe.wgmma);
    dot::resident::plan(f, &mma, &mut pipe, threads);
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
    // Hidden tensor-map parameters: 128-byte grid constants (`crate::tma`).
    let ntm = pipe.tensor_maps.len();
    for _ in 0..ntm {
        params.push(ctx.ptr_type(AddressSpace::default()).into());
    }
    let fn_ty = ctx.void_type().fn_type(&params, false);
    let func = module.add_function(&f.name, fn_ty, None);
    func.set_call_conventions(PTX_KERNEL_CC);
    let tstr = threads.to_string();
    func.add_attribute(AttributeLoc::Function, ctx.create_string_attribute("nvvm.maxntid", &tstr));
    // `.minnctapersm`: the config's occupancy hint
    // (`CompileOptions::min_programs_per_sm`) when it gives one. Without
    // it, a loop that dequantizes `wgmma`'s A operand into a large
    // accumulator while the previous group runs (`Pipeline::body_forms_a`)
    // is built for one program per SM, as CUTLASS's Hopper kernels
    // declare, so ptxas schedules for registers rather than for more
    // programs (the stream-K GEMM with one program per tile at M256
    // N14336: 84.7 us without, 78.0 with, on two H100s). Other kernels keep
    // ptxas's choice: the swapped 64 x 64 dequant tile relies on its extra
    // programs per SM (61.1 us with the directive, 56.5 without). The hint
    // goes the other way too: FlashAttention's 64 x 128 tile at head dim
    // 64 asks for three programs (ptxas alone picks 173-178 registers, two).
    let min_ctas = match opts.min_programs_per_sm {
        0 => pipe.body_forms_a.then_some(1u64),
        n => Some(u64::from(n)),
    };
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
        axis,
        vals: FxHashMap::default(),
        threads,
        spt_cap,
        tid: i32t.const_zero(),
        smem: None,
        smem_bytes: 0,
        smem_floor: 0,
        in_pipeline: 0,
        pipe,
        pipe_stage: FxHashMap::default(),
        pipe_pending: None,
        extra_pred: None,
        mma,
        lays: layouts::Assignment::default(),
        partials: partial::Partials::default(),
        blocked: FxHashMap::default(),
        overrides: FxHashMap::default(),
        afrags: FxHashMap::default(),
        wgmma_pending: Vec::new(),
        opts: *opts,
        tmaps: Vec::new(),
    };
    lw.lays = layouts::assign(f, &lw.mma);
    lw.partials = partial::plan(f, &lw.lays);
    lw.smem_floor = lw.pipe.resident_bytes + lw.pipe.ring_bytes;
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
    let tensor_maps = lw.pipe.tensor_maps.clone();
    Ok(Lowered { smem_bytes: lw.smem_bytes, tensor_maps })
}

/// The LLVM parameter type of a scalar kernel parameter (`i1` travels as `i32`).
fn param_type(ctx: &Context, e: Elem) -> BasicTypeEnum<'_> {
    match e {
        Elem::Scalar(DType::I1) => ctx.i32_type().into(),
        other => reg_type(ctx, other),
    }
}
