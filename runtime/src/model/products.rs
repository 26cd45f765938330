//! The launches of the model's products (`out = x @ w^T` on quantized
//! weights, optionally SiLU-mul of gate and up): the batch-invariant
//! [`linear`] with its RMSNorm prologue and residual epilogue, and the fast
//! path's GEMV / tensor-core GEMM / fused decode GEMV, chosen by shape and
//! device. [`super::layers`] says which product a step runs and with which
//! fusion; this file turns that into a kernel, tiles and a grid.

use super::buffers::Scratch;
use super::device::Device;
use super::forward::{Launcher, usage};
use super::layers::{At, any, typed};
use super::weights::MatRef;
use crate::error::Result;
use crate::gguf::LlamaConfig;
use crate::model::ActElem;
use crate::model::args::product_args;
use dsl_core::DType;
use dsl_core::launch::AnyDType;
use kernels::dequant::linear::linear;
use kernels::dequant::{
    Fuse as KernelFuse, LINEAR_SPLIT_LONG_MAX_M, LINEAR_SPLIT_MAX_M, QuantFormat, gemm_grid, gemv_grid,
    linear_grid, linear_min_programs, linear_tiles, linear_workspace, uses_gemv,
};

/// What a projection fuses: `Norm` is the RMSNorm prologue with its weight
/// and epsilon (single-token steps only), `Residual` the in-place residual
/// add of the epilogue.
pub(super) enum Fuse<'a, D: Device, T: ActElem> {
    None,
    Norm(At<'a, D::Buf<T>>, f32),
    Residual,
}

// By hand: a derive would ask `D` and `T` themselves to be `Copy`.
impl<D: Device, T: ActElem> Clone for Fuse<'_, D, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<D: Device, T: ActElem> Copy for Fuse<'_, D, T> {}

/// One product `out = x @ w^T` (or the fused SiLU-mul of gate and up,
/// `n = w.n / 2`) of `m` rows: the weight, the activations and the output
/// (each a buffer and an offset in elements), output rows `ldo` elements
/// apart. The output is in `O`: the activations' `T`, or f32 for the LM
/// head, whose logits keep the accumulator's bits.
pub(super) struct Product<'a, D: Device, T: ActElem, O: ActElem = T> {
    pub w: MatRef<'a, D>,
    pub x: At<'a, D::Buf<T>>,
    pub out: At<'a, D::Buf<O>>,
    pub ldo: usize,
    pub m: usize,
    pub silu: bool,
}

// By hand, as for `Fuse`.
impl<D: Device, T: ActElem, O: ActElem> Clone for Product<'_, D, T, O> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<D: Device, T: ActElem, O: ActElem> Copy for Product<'_, D, T, O> {}

/// The configuration and grid of the batch-invariant product ([`linear`])
/// with `dtype` activations and an `out_dtype` output of `m` rows with a `format` weight of `rows` rows and `k` columns, with
/// its fusions, on the device's tiles ([`linear_tiles`]; f16 operands on
/// tensor cores), and the workspace entries and counters it needs.
#[allow(clippy::too_many_arguments)]
pub(crate) fn linear_config(
    dtype: DType,
    out_dtype: DType,
    format: QuantFormat,
    m: usize,
    rows: usize,
    k: usize,
    silu: bool,
    norm: bool,
    residual: bool,
    tensor_cores: bool,
) -> (linear::Config, [u32; 3], (usize, usize)) {
    let t = linear_tiles(format, m, rows, k, tensor_cores);
    let n = if silu { rows / 2 } else { rows };
    let fuse = KernelFuse::NONE.with_silu(silu).with_norm(norm).with_residual(residual);
    let config = linear::Config::new(
        dtype,
        out_dtype,
        format,
        fuse,
        t.split,
        tensor_cores,
        t.block_m,
        t.block_n,
        if norm { k.next_power_of_two() } else { 1 },
    )
    .with_warps(t.num_warps)
    .with_min_programs(linear_min_programs(format, &t));
    let grid = linear_grid(m, n, k, silu, &t);
    (config, grid, linear_workspace(grid, &t))
}

/// The workspace entries and counters every split product of a model of
/// shape `c` fits in (its split batches have at most
/// [`LINEAR_SPLIT_LONG_MAX_M`] rows, and a batch's split grid covers
/// every smaller one of its tiles).
pub(crate) fn linear_workspace_for(c: &LlamaConfig, tensor_cores: bool) -> (usize, usize) {
    let qkv = (c.n_head + 2 * c.n_head_kv) * c.head_dim;
    let shapes = [
        (qkv, c.n_embd),
        (c.n_embd, c.n_head * c.head_dim),
        (2 * c.n_ff, c.n_embd),
        (c.n_embd, c.n_ff),
        (c.vocab_size, c.n_embd),
    ];
    let mut need = (0, 0);
    for (rows, k) in shapes {
        for format in [QuantFormat::Q4_0, QuantFormat::Q8_0] {
            for m in [LINEAR_SPLIT_MAX_M, LINEAR_SPLIT_LONG_MAX_M] {
                let t = linear_tiles(format, m, rows, k, tensor_cores);
                let (ws, cnt) = linear_workspace(linear_grid(m, rows, k, false, &t), &t);
                need = (need.0.max(ws), need.1.max(cnt));
            }
        }
    }
    need
}

/// The (weight rows, columns) of the persistent step's QKV, O, gate/up and
/// down products for a model of shape `c`.
fn mega_shapes(c: &LlamaConfig) -> [(usize, usize); 4] {
    let qkv = (c.n_head + 2 * c.n_head_kv) * c.head_dim;
    [(qkv, c.n_embd), (c.n_embd, c.n_head * c.head_dim), (2 * c.n_ff, c.n_embd), (c.n_embd, c.n_ff)]
}

/// The persistent grids the workspace holds stacked-product scratch for
/// (a grid is capped to what it holds; see [`mega_stacked_slot`]).
pub(crate) const MEGA_SCRATCH_PROGRAMS: usize = 1024;

/// The workspace entries and tile counters the persistent step's split
/// products, and the stacked ones' scratch for [`MEGA_SCRATCH_PROGRAMS`]
/// programs in any format, need for a model of shape `c`.
pub(crate) fn mega_workspace_for(c: &LlamaConfig) -> (usize, usize) {
    let mut need = (0, 0);
    for (rows, k) in mega_shapes(c) {
        let (ws, cnt) = kernels::decode_step::workspace(rows, k);
        need = (need.0.max(ws), need.1.max(cnt));
    }
    use super::mega::{MAX_STACK_ROWS, stack_rows};
    let slot = (1..=MAX_STACK_ROWS)
        .map(|m| mega_stacked_slot(c, [QuantFormat::Q4_0; 4], stack_rows(m)))
        .max()
        .unwrap_or(0);
    (need.0.max(slot * MEGA_SCRATCH_PROGRAMS), need.1)
}

/// The scratch entries one program of the persistent step needs for its
/// stacked products (formats of QKV, O, gate/up, down) of `stack_rows` rows
/// ([`super::mega::stack_rows`]; 0: none stack).
pub(crate) fn mega_stacked_slot(c: &LlamaConfig, formats: [QuantFormat; 4], stack_rows: usize) -> usize {
    use kernels::dequant::stacked::{StackedShape, stacked_slot};
    let mut slot = 0;
    for ((rows, k), f) in mega_shapes(c).into_iter().zip(formats) {
        let (stack, block_n, _) = f.stacked_tiling(stack_rows, rows, k, 0);
        if stack > 0 {
            slot = slot.max(stacked_slot(stack, block_n, k, stack_rows));
        }
    }
    slot
}

/// `w`'s output columns ([`MatRef::n_out`]), checked to fit in output rows
/// `ldo` elements apart.
fn out_columns<D: Device>(w: MatRef<'_, D>, silu: bool, ldo: usize) -> Result<usize> {
    let n_out = w.n_out(silu);
    if ldo < n_out {
        return Err(usage(format!("internal error: output rows {ldo} apart hold {n_out} columns")));
    }
    Ok(n_out)
}

/// The `nw_ptr` and `eps` arguments of a product with the RMSNorm prologue
/// `norm` (its weights and epsilon); without one, `x` stands in for the
/// weights, with epsilon 0.
fn prologue_args<'a, D: Device + 'a, T: ActElem>(
    norm: Option<(At<'a, D::Buf<T>>, f32)>,
    x: At<'a, D::Buf<T>>,
) -> Result<(D::Ptr<'a, AnyDType>, f32)> {
    Ok(match norm {
        Some((nw, eps)) => (any::<D, T>(nw.0, nw.1)?, eps),
        None => (any::<D, T>(x.0, x.1)?, 0.0),
    })
}

/// The batch-invariant product `p` with its fusions: [`linear`], or on
/// devices with [`Device::cpu_gemv`] the CPU GEMV at every batch size.
pub(super) fn linear_launch<D: Device, T: ActElem, O: ActElem>(
    l: &mut Launcher<'_, D>,
    scratch: &Scratch<D, T>,
    p: Product<'_, D, T, O>,
    fuse: Fuse<'_, D, T>,
) -> Result<()> {
    let Product { w, x, out, ldo, m, silu } = p;
    let n = out_columns(w, silu, ldo)?;
    let norm = match fuse {
        Fuse::Norm(nw, eps) if m == 1 => Some((nw, eps)),
        Fuse::Norm(..) => return Err(usage(format!("the fused RMSNorm takes one row, not {m}"))),
        _ => None,
    };
    let residual = matches!(fuse, Fuse::Residual);
    if l.dev.cpu_gemv() {
        // The native CPU's invariant product: `cpu_gemv`'s row arithmetic is
        // fixed by its K tile alone (the same for every `m`), and its fusions
        // give the separate kernels' bits.
        return gemv_fused::<D, T, O>(l, p, norm, residual);
    }
    let (np, eps) = prologue_args::<D, T>(norm, x)?;
    let tc = l.dev.tensor_cores();
    let (config, grid, (ws, cnt)) = linear_config(
        T::DEVICE_DTYPE,
        O::DEVICE_DTYPE,
        w.format,
        m,
        w.n,
        w.k,
        silu,
        norm.is_some(),
        residual,
        tc,
    );
    let s = scratch;
    if ws > 0 && (ws > s.lin_ws_len || cnt > s.lin_cnt_len) {
        return Err(usage(format!(
            "internal error: the split product needs {ws} workspace entries and {cnt} counters"
        )));
    }
    let (qp, sp) = w.planes()?;
    let args = product_args!(
        linear,
        (qp, sp, any::<D, O>(out.0, out.1)?),
        (m, n, w.k),
        x_ptr: any::<D, T>(x.0, x.1)?,
        nw_ptr: np,
        ws_ptr: typed::<D, f32>(&s.lin_ws)?,
        cnt_ptr: typed::<D, i32>(&s.lin_cnt)?,
        ldo: ldo as i32,
        eps,
    );
    l.run::<linear::Kernel>(grid, &config, &args)
}

/// The product `p` with dense output rows (`ldo` is the output width) on
/// the fast path: the GEMV for small products, the tensor-core GEMM above.
pub(super) fn matmul<D: Device, T: ActElem, O: ActElem>(
    l: &mut Launcher<'_, D>,
    p: Product<'_, D, T, O>,
) -> Result<()> {
    let Product { w, x, out, m, silu, .. } = p;
    let (dtype, out_dtype) = (T::DEVICE_DTYPE, O::DEVICE_DTYPE);
    let n = w.n_out(silu);
    let (xp, op) = (any::<D, T>(x.0, x.1)?, any::<D, O>(out.0, out.1)?);
    let (qp, sp) = w.planes()?;
    macro_rules! launch {
        ($family:ident, $kernel:ident, $tiles:expr, $grid:expr $(, $extra:expr)*) => {{
            use kernels::dequant::$family::$kernel as kk;
            let (a, b, c, warps, stages) = $tiles;
            let args = product_args!(kk, (qp, sp, op), (m, n, w.k), x_ptr: xp);
            let config =
                kk::Config::new(dtype, out_dtype, w.format, silu, a, b, c $(, $extra)*)
                    .with_warps(warps)
                    .with_stages(stages);
            l.run::<kk::Kernel>($grid, &config, &args)
        }};
    }
    if uses_gemv(m, w.n) {
        let t = l.dev.gemv_tiles(w.format, m, w.n, w.k);
        let grid = gemv_grid(m, n, silu, t.m_block, t.block_n);
        let tiles = (t.m_block, t.block_n, t.block_k, t.num_warps, 2);
        launch!(gemv, gemv, tiles, grid)
    } else {
        // The swapped product needs 16-bit activations and `wgmma`.
        let swap_ok = dtype != DType::F32 && l.dev.wgmma();
        let t = l.dev.gemm_tiles(w.format, m, w.n, w.k, swap_ok);
        let grid = gemm_grid(m, n, silu, t.block_m, t.block_n);
        let tiles = (t.block_m, t.block_n, t.block_k, t.num_warps, t.num_stages);
        launch!(gemm, gemm, tiles, grid, t.swap)
    }
}

/// A fused decode GEMV of the fast path ([`kernels::dequant::fused`], or
/// [`kernels::cpu_gemv`] where [`Device::cpu_gemv`]) of the product `p`:
/// `out = norm(x) @ w^T` (or the fused SiLU-mul) with `norm = Some((weights,
/// eps))` the RMSNorm prologue, or `out += x @ w^T` in place with
/// `residual` (one row with `norm`).
pub(super) fn gemv_fused<D: Device, T: ActElem, O: ActElem>(
    l: &mut Launcher<'_, D>,
    p: Product<'_, D, T, O>,
    norm: Option<(At<'_, D::Buf<T>>, f32)>,
    residual: bool,
) -> Result<()> {
    let Product { w, x, out, ldo, m, silu } = p;
    let n = out_columns(w, silu, ldo)?;
    let (dtype, out_dtype) = (T::DEVICE_DTYPE, O::DEVICE_DTYPE);
    let (xp, op) = (any::<D, T>(x.0, x.1)?, any::<D, O>(out.0, out.1)?);
    let (np, eps) = prologue_args::<D, T>(norm, x)?;
    let (qp, sp) = w.planes()?;
    let t = l.dev.gemv_tiles(w.format, m, w.n, w.k);
    let grid = gemv_grid(m, n, silu, t.m_block, t.block_n);
    let fuse = KernelFuse::NONE.with_silu(silu).with_norm(norm.is_some()).with_residual(residual);
    macro_rules! launch {
        ($($kernel:ident)::+) => {{
            use kernels::$($kernel)::+ as kk;
            let args =
                product_args!(kk, (qp, sp, op), (m, n, w.k), x_ptr: xp, nw_ptr: np, ldo: ldo as i32, eps);
            let config =
                kk::Config::new(dtype, out_dtype, w.format, fuse, t.m_block, t.block_n, t.block_k)
                    .with_warps(t.num_warps);
            l.run::<kk::Kernel>(grid, &config, &args)
        }};
    }
    if l.dev.cpu_gemv() { launch!(cpu_gemv::cpu_gemv) } else { launch!(dequant::fused::gemv_fused) }
}
