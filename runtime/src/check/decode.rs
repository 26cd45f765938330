//! GPU checks of paged decode attention (`kernels::decode_attention`) and of
//! the row-reduction example (`kernels::examples::row_stats`), each against
//! the CPU interpreter on the same random non-zero inputs.
//!
//! Decode: ragged contexts (1 to a few thousand tokens, ending mid-page, one
//! empty), odd batch sizes, SmolLM2's grouping (9 query heads on 3 KV heads,
//! head dim 64) and a Llama-style 32:8 grouping with head dim 128, pages of 16,
//! 32 and 64 tokens behind shuffled block tables, chunks of 16 and 32 tokens,
//! 4 and 8 warps, direct and split-KV (then the reduce kernel), f32 and bf16.
//! The GPU sums scores and streams in another order and uses `ex2.approx`;
//! outputs are averages of values of magnitude <= 2, so f32 gets `1e-4 +
//! 1e-3 |x|` and bf16 one unit of the final rounding on top.
//!
//! Row statistics: shapes that hit every branch of the row-wise reduction
//! (rows shorter than a chunk, rows within a warp, rows across warps, rows
//! longer than one pass of all threads); max, argmax and the broadcasts are
//! exact, sums within `F32_SUM`.

use crate::check::{
    CheckRow, DevicePtr, EXACT, F32_SUM, Rng, Tol, compare_each, outcome, to_f64, unit_roundoff,
};
use crate::error::Result;
use crate::model::ActElem;
use crate::model::Device;
use crate::model::args::decode_args;
use dsl_core::DType;
use dsl_core::half::{bf16, f16};
use dsl_core::interp::Cpu;
use dsl_core::launch::{AnyDType, Backend};
use kernels::decode_attention::{paged_decode, paged_decode_reduce, paged_decode_tc, tc_config};
use kernels::examples::row_stats;
use kernels::reference::attention::{self as r, PagedKv};
use std::marker::PhantomData;

/// One decode problem.
#[derive(Clone, Copy, Debug)]
struct Case {
    batch: usize,
    max_ctx: usize,
    h_kv: usize,
    group: usize,
    head_dim: usize,
    page: usize,
    block_n: usize,
    warps: u32,
    /// Tokens per split (a multiple of `block_n`), `None` for direct.
    split_len: Option<usize>,
}

/// The random inputs of one decode problem: ragged contexts (the first at
/// `max_ctx`, the second empty when there are three or more), a shuffled
/// block table, random non-zero Q and caches.
struct Inputs<T> {
    ctx: Vec<i32>,
    tables: Vec<i32>,
    max_pages: usize,
    q: Vec<T>,
    k: Vec<T>,
    v: Vec<T>,
    split_len: usize,
    splits: usize,
}

fn inputs<T: ActElem>(rng: &mut Rng, c: &Case) -> Inputs<T> {
    let d = c.head_dim;
    let n_q = c.h_kv * c.group;
    let mut ctx: Vec<i32> = (0..c.batch).map(|_| 1 + rng.next_u64() as i32 % c.max_ctx as i32).collect();
    ctx.iter_mut().for_each(|x| *x = x.abs().max(1));
    ctx[0] = c.max_ctx as i32;
    if c.batch > 2 {
        ctx[1] = 0;
    }
    let max_pages = c.max_ctx.div_ceil(c.page);
    let num_blocks = c.batch * max_pages + 5;
    let mut pages: Vec<i32> = (0..num_blocks as i32).collect();
    for i in (1..pages.len()).rev() {
        pages.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    let tables = pages[..c.batch * max_pages].to_vec();
    let cache = num_blocks * c.page * c.h_kv * d;
    let (q, k, v) =
        (rng.values::<T>(c.batch * n_q * d, 2.0), rng.values::<T>(cache, 2.0), rng.values::<T>(cache, 2.0));
    let (split_len, splits) = match c.split_len {
        Some(len) => (len, c.max_ctx.div_ceil(len)),
        None => (c.max_ctx.div_ceil(c.block_n) * c.block_n, 1),
    };
    Inputs { ctx, tables, max_pages, q, k, v, split_len, splits }
}

/// Which decode kernel a case runs.
#[derive(Clone, Copy, Debug)]
enum Variant {
    /// `paged_decode` (FMAs).
    Plain,
    /// `paged_decode_tc` with this many pipeline stages.
    Tc { stages: u32 },
}

/// The buffers of one decode problem on one backend.
struct Side<'a, B: Backend + 'a> {
    q: B::Ptr<'a, AnyDType>,
    k: B::Ptr<'a, AnyDType>,
    v: B::Ptr<'a, AnyDType>,
    tables: B::Ptr<'a, i32>,
    ctx: B::Ptr<'a, i32>,
    out: B::Ptr<'a, AnyDType>,
    part_o: B::Ptr<'a, f32>,
    part_m: B::Ptr<'a, f32>,
    part_l: B::Ptr<'a, f32>,
}

/// Runs the decode kernel `v` of case `c` on backend `be`, then the split
/// reduce when `c` splits the context.
fn launch<'a, B: Backend + 'a>(
    be: &mut B,
    s: &Side<'a, B>,
    c: &Case,
    v: Variant,
    dtype: DType,
    inp: (usize, usize, usize),
) -> dsl_core::Result<()> {
    let (max_pages, split_len, splits) = inp;
    let d = c.head_dim;
    let split = c.split_len.is_some();
    let grid = [c.batch as u32, c.h_kv as u32, splits as u32];
    // The same arguments for both decode kernels.
    macro_rules! args {
        ($k:ident) => {{
            let parts = ((s.part_o, s.part_m, s.part_l), split_len);
            decode_args!(
                $k,
                (s.q, s.k, s.v, s.out),
                (s.tables, max_pages),
                s.ctx,
                parts,
                1.0 / (d as f32).sqrt()
            )
        }};
    }
    match v {
        Variant::Plain => {
            let config = paged_decode::Config::new(dtype, c.h_kv, c.group, d, c.page, c.block_n, split)
                .with_warps(c.warps);
            be.launch::<paged_decode::Kernel>(grid, &config, &args!(paged_decode))?;
        }
        Variant::Tc { stages } => {
            let config = tc_config(dtype, c.h_kv, c.group, d, c.page, c.block_n, split)
                .with_warps(c.warps)
                .with_stages(stages);
            be.launch::<paged_decode_tc::Kernel>(grid, &config, &args!(paged_decode_tc))?;
        }
    }
    if split {
        let config = paged_decode_reduce::Config::new(dtype, c.group, d);
        let args = paged_decode_reduce::Args {
            part_o: s.part_o,
            part_m: s.part_m,
            part_l: s.part_l,
            seq_lens: s.ctx,
            out_ptr: s.out,
            split_len: split_len as i32,
            max_splits: splits as i32,
            _marker: PhantomData,
        };
        be.launch::<paged_decode_reduce::Kernel>(
            [c.batch as u32, (c.h_kv * c.group) as u32, 1],
            &config,
            &args,
        )?;
    }
    Ok(())
}

/// The output of case `c` with kernel `v` on `dev` for inputs `inp`.
fn decode_on<T: ActElem, D: Device>(dev: &mut D, inp: &Inputs<T>, c: &Case, v: Variant) -> Result<Vec<T>> {
    let parts = c.batch * c.h_kv * inp.splits * c.group;
    let (qd, kd, vd) = (dev.upload(&inp.q)?, dev.upload(&inp.k)?, dev.upload(&inp.v)?);
    let (bd, sd) = (dev.upload(&inp.tables)?, dev.upload(&inp.ctx)?);
    let od = dev.zeros::<T>(c.batch * c.h_kv * c.group * c.head_dim)?;
    let (pod, pmd, pld) =
        (dev.zeros::<f32>(parts * c.head_dim)?, dev.zeros::<f32>(parts)?, dev.zeros::<f32>(parts)?);
    let side = Side::<D> {
        q: dev.ptr(&qd)?,
        k: dev.ptr(&kd)?,
        v: dev.ptr(&vd)?,
        tables: dev.ptr(&bd)?,
        ctx: dev.ptr(&sd)?,
        out: dev.ptr(&od)?,
        part_o: dev.ptr(&pod)?,
        part_m: dev.ptr(&pmd)?,
        part_l: dev.ptr(&pld)?,
    };
    launch(dev, &side, c, v, T::DEVICE_DTYPE, (inp.max_pages, inp.split_len, inp.splits))?;
    dev.download(&od)
}

/// Runs case `c` with kernel `v` on the device and in the interpreter, on the
/// same fresh [`inputs`]: returns them with both outputs.
fn run_case<T: ActElem, D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    c: &Case,
    v: Variant,
) -> Result<(Inputs<T>, Vec<T>, Vec<T>)> {
    let inp = inputs::<T>(rng, c);
    let got = decode_on(dev, &inp, c, v)?;
    let interp = decode_on(&mut Cpu::new(), &inp, c, v)?;
    Ok((inp, got, interp))
}

/// `B../L../hq.._hkv.._hd../page../bn../w..`, the shape part both checks share.
fn shape_of(c: &Case) -> String {
    format!(
        "B{}/L{}/hq{}_hkv{}_hd{}/page{}/bn{}/w{}",
        c.batch,
        c.max_ctx,
        c.h_kv * c.group,
        c.h_kv,
        c.head_dim,
        c.page,
        c.block_n,
        c.warps
    )
}

fn decode_case<T: ActElem, D: Device>(dev: &mut D, rng: &mut Rng, c: Case) -> Result<CheckRow> {
    let (_, got, interp) = run_case::<T, _>(dev, rng, &c, Variant::Plain)?;
    let tol = match T::DEVICE_DTYPE {
        DType::F32 => Tol { atol: 1e-4, rtol: 1e-3 },
        _ => Tol { atol: 1e-3, rtol: 1.0 / 64.0 },
    };
    let split = match c.split_len {
        Some(l) => format!("split{l}"),
        None => "direct".into(),
    };
    let shape = format!("{}/{split}", shape_of(&c));
    Ok(outcome("paged_decode", shape, T::DEVICE_DTYPE, &got, &interp, tol))
}

/// The `paged_decode` check (see the module doc).
pub fn paged_decode<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let smol = |batch, max_ctx, page, block_n, warps, split_len| Case {
        batch,
        max_ctx,
        h_kv: 3,
        group: 3,
        head_dim: 64,
        page,
        block_n,
        warps,
        split_len,
    };
    let llama = |batch, max_ctx, page, block_n, warps, split_len| Case {
        batch,
        max_ctx,
        h_kv: 8,
        group: 4,
        head_dim: 128,
        page,
        block_n,
        warps,
        split_len,
    };
    let cases = [
        smol(5, 333, 16, 16, 4, None),
        smol(3, 2049, 16, 16, 4, Some(256)),
        smol(1, 17, 32, 32, 8, None),
        llama(3, 1000, 16, 16, 8, None),
        llama(2, 3001, 64, 32, 8, Some(512)),
        llama(5, 129, 32, 16, 4, Some(32)),
    ];
    let mut out = Vec::new();
    for c in cases {
        out.push(decode_case::<f32, _>(dev, &mut rng, c)?);
        out.push(decode_case::<bf16, _>(dev, &mut rng, c)?);
    }
    Ok(out)
}

/// One `paged_decode_tc` problem on the inputs of [`inputs`] with `BLOCK_N`
/// of `c.block_n`, `c.warps` warps and `stages` pipeline stages: checked
/// against the f64 reference with FlashAttention's error model
/// ([`r::Attention::error_bound`], `p` rounded to `T`; the keys term widened
/// for the split merge) and against the interpreter within twice that bound.
fn decode_tc_case<T: ActElem, D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    c: Case,
    stages: u32,
) -> Result<CheckRow> {
    let d = c.head_dim;
    let n_q = c.h_kv * c.group;
    let (inp, got, interp) = run_case::<T, _>(dev, rng, &c, Variant::Tc { stages })?;
    let Inputs { ctx, tables, max_pages, q, k, v, split_len, splits } = inp;
    let (got, interp) = (to_f64(&got), to_f64(&interp));
    // The f64 reference: each sequence's query (its last position) against its whole context.
    let (k64, v64) = (to_f64(&k), to_f64(&v));
    let kv = PagedKv { k: &k64, v: &v64, block_size: c.page, n_kv: c.h_kv, head_dim: d };
    let q64 = to_f64(&q);
    let ut = unit_roundoff(T::DEVICE_DTYPE);
    let split = if c.split_len.is_some() { format!("split{split_len}") } else { "direct".into() };
    let shape = format!("{}/s{stages}/{split}", shape_of(&c));
    let scale = 1.0 / (d as f32).sqrt();
    let per = n_q * d;
    let (mut want, mut bound) = (Vec::with_capacity(got.len()), Vec::with_capacity(got.len()));
    for b in 0..c.batch {
        let n = ctx[b].max(0) as usize;
        let table = &tables[b * max_pages..(b + 1) * max_pages];
        let exact = r::attend(
            &q64[b * per..(b + 1) * per],
            &[n as i64 - 1],
            n_q,
            n,
            table,
            &kv,
            f64::from(scale),
            false,
        );
        bound.extend((0..per).map(|e| exact.error_bound(e, d, n + 8 * splits, ut)));
        want.extend(exact.out);
    }
    // Within the bound of the exact value, and within twice it of the interpreter.
    let dtype = T::DEVICE_DTYPE;
    let mut row = compare_each("paged_decode_tc", shape.clone(), dtype, &got, &want, &bound);
    let twice: Vec<f64> = bound.iter().map(|b| 2.0 * b).collect();
    row.pass &= compare_each("paged_decode_tc", shape, dtype, &got, &interp, &twice).pass;
    Ok(row)
}

/// The `paged_decode_tc` check: Llama-style 32:8 grouping at head dim 128
/// and SmolLM2's 9:3 at 64, pages of 16/32/64, every autotune config of the
/// kernel (tensor cores), one config below the tensor-core shape rule (`dot`
/// on FMAs), direct and split-KV, bf16 and one f16 case.
pub fn paged_decode_tc<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let case = |batch, max_ctx, h_kv, group, head_dim, page, block_n, warps, split_len| Case {
        batch,
        max_ctx,
        h_kv,
        group,
        head_dim,
        page,
        block_n,
        warps,
        split_len,
    };
    let mut out = Vec::new();
    // The autotune configs `(BLOCK_N, warps, stages)`.
    for (bn, w, st) in [(64, 4, 3), (64, 4, 2), (32, 4, 4), (128, 4, 2), (64, 2, 3), (128, 8, 3)] {
        out.push(decode_tc_case::<bf16, _>(dev, &mut rng, case(3, 1000, 8, 4, 128, 16, bn, w, None), st)?);
        out.push(decode_tc_case::<bf16, _>(dev, &mut rng, case(5, 333, 3, 3, 64, 32, bn, w, Some(128)), st)?);
    }
    out.push(decode_tc_case::<bf16, _>(dev, &mut rng, case(2, 3001, 8, 4, 128, 64, 64, 4, Some(512)), 3)?);
    out.push(decode_tc_case::<f16, _>(dev, &mut rng, case(3, 777, 8, 4, 128, 32, 64, 4, Some(256)), 3)?);
    out.push(decode_tc_case::<bf16, _>(dev, &mut rng, case(4, 61, 3, 3, 64, 16, 16, 4, None), 2)?);
    out.push(decode_tc_case::<bf16, _>(dev, &mut rng, case(1, 17, 3, 3, 64, 16, 64, 4, None), 3)?);
    // The FP8 KV cache's writer and readers (`kernels::kv_cache`).
    out.extend(super::kv8::rows(dev, seed ^ 0x006b_7638)?);
    Ok(out)
}

/// The outputs of `row_stats`: per-row sums, maxima and argmaxima, and `y`.
type RowStats = (Vec<f32>, Vec<f32>, Vec<i32>, Vec<f32>);

/// `row_stats` of `x` (rows of `bias.len()` columns) with `(BR, BC)` tiles on `dev`.
fn row_stats_on<D: Device>(
    dev: &mut D,
    x: &[f32],
    bias: &[f32],
    (br, bc): (usize, usize),
    warps: u32,
) -> Result<RowStats> {
    let (cols, rows) = (bias.len(), x.len() / bias.len());
    let (xd, bd) = (dev.upload(x)?, dev.upload(bias)?);
    let (sd, md, ad) = (dev.zeros::<f32>(rows)?, dev.zeros::<f32>(rows)?, dev.zeros::<i32>(rows)?);
    let yd = dev.zeros::<f32>(rows * cols)?;
    let args = row_stats::Args {
        x_ptr: dev.ptr(&xd)?,
        bias_ptr: dev.ptr(&bd)?,
        sums_ptr: dev.ptr(&sd)?,
        maxs_ptr: dev.ptr(&md)?,
        args_ptr: dev.ptr(&ad)?,
        y_ptr: dev.ptr(&yd)?,
        n_rows: rows as i32,
        n_cols: cols as i32,
        _marker: PhantomData,
    };
    let config = row_stats::Config::new(br, bc).with_warps(warps);
    dev.run::<row_stats::Kernel>([rows.div_ceil(br) as u32, 1, 1], &config, &args)?;
    Ok((dev.download(&sd)?, dev.download(&md)?, dev.download(&ad)?, dev.download(&yd)?))
}

fn row_stats_case<D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    rows: usize,
    cols: usize,
    br: usize,
    bc: usize,
    warps: u32,
) -> Result<Vec<CheckRow>> {
    let x = rng.values::<f32>(rows * cols, 4.0);
    let bias = rng.values::<f32>(cols, 1.0);
    let (sums, maxs, args, y) = row_stats_on(dev, &x, &bias, (br, bc), warps)?;
    let want = row_stats_on(&mut Cpu::new(), &x, &bias, (br, bc), warps)?;
    let shape = format!("{rows}x{cols}/{br}x{bc}/w{warps}");
    Ok(vec![
        outcome("row_stats.sum", shape.clone(), DType::F32, &sums, &want.0, F32_SUM),
        outcome("row_stats.max", shape.clone(), DType::F32, &maxs, &want.1, EXACT),
        outcome("row_stats.argmax", shape.clone(), DType::I32, &args, &want.2, EXACT),
        outcome("row_stats.y", shape, DType::F32, &y, &want.3, EXACT),
    ])
}

/// The `row_stats` check (see the module doc).
pub fn row_stats<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    // (rows, cols, BR, BC, warps): rows of 2 (shorter than a 4-element chunk),
    // 64 (16 lanes), 2048 (4 warps of one row), 4096 with 4 warps (longer than
    // one pass of 512 elements), and a 3-row tile of 33 columns.
    for (rows, cols, br, bc, warps) in [
        (301, 2, 64, 2, 4),
        (77, 61, 16, 64, 4),
        (9, 2000, 2, 2048, 8),
        (5, 4096, 4, 4096, 4),
        (3, 33, 4, 64, 1),
    ] {
        out.extend(row_stats_case(dev, &mut rng, rows, cols, br, bc, warps)?);
    }
    Ok(out)
}

/// No separate check: `paged_decode_reduce` runs inside every split case of
/// [`paged_decode()`].
pub fn none<D: Device>(_: &mut D, _: u64) -> Result<Vec<CheckRow>> {
    Ok(Vec::new())
}
