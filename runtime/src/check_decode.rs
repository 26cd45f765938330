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
    CheckRow, EXACT, F32_SUM, Rng, Sample, Tol, outcome, to_f64, unit_roundoff, upload_both, zeros_both,
};
use crate::cuda::Cuda;
use crate::error::Result;
use dsl_core::DType;
use dsl_core::half::{bf16, f16};
use dsl_core::interp::Cpu;
use kernels::decode_attention::{paged_decode, paged_decode_reduce, paged_decode_tc};
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

fn inputs<T: Sample>(rng: &mut Rng, c: &Case) -> Inputs<T> {
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

fn decode_case<T: Sample>(cuda: &mut Cuda, rng: &mut Rng, c: Case) -> Result<CheckRow> {
    let d = c.head_dim;
    let n_q = c.h_kv * c.group;
    let Inputs { ctx, tables, max_pages, q, k, v, split_len, splits } = inputs::<T>(rng, &c);
    let parts = c.batch * c.h_kv * splits * c.group;
    let mut cpu = Cpu::new();
    let ((qd, qc), (kd, kc), (vd, vc)) = (
        upload_both(cuda, &mut cpu, &q)?,
        upload_both(cuda, &mut cpu, &k)?,
        upload_both(cuda, &mut cpu, &v)?,
    );
    let ((bd, bc), (sd, sc)) = (upload_both(cuda, &mut cpu, &tables)?, upload_both(cuda, &mut cpu, &ctx)?);
    let (od, oc) = zeros_both::<T>(cuda, &mut cpu, c.batch * n_q * d)?;
    let (pod, poc) = zeros_both::<f32>(cuda, &mut cpu, parts * d)?;
    let (pmd, pmc) = zeros_both::<f32>(cuda, &mut cpu, parts)?;
    let (pld, plc) = zeros_both::<f32>(cuda, &mut cpu, parts)?;
    let split = c.split_len.is_some();
    let config = paged_decode::Config::new(T::DEVICE_DTYPE, c.h_kv, c.group, d, c.page, c.block_n, split)
        .with_warps(c.warps);
    let scale = 1.0 / (d as f32).sqrt();
    let grid = [c.batch as u32, c.h_kv as u32, splits as u32];
    let (bt_stride, sl) = (max_pages as i32, split_len as i32);
    let args = paged_decode::Args {
        q_ptr: qd.ptr().cast(),
        k_cache: kd.ptr().cast(),
        v_cache: vd.ptr().cast(),
        block_tables: bd.ptr(),
        bt_stride,
        seq_lens: sd.ptr(),
        out_ptr: od.ptr().cast(),
        part_o: pod.ptr(),
        part_m: pmd.ptr(),
        part_l: pld.ptr(),
        scale,
        split_len: sl,
        _marker: PhantomData,
    };
    cuda.run::<paged_decode::Kernel>(grid, &config, &args)?;
    let args = paged_decode::Args {
        q_ptr: qc.cast(),
        k_cache: kc.cast(),
        v_cache: vc.cast(),
        block_tables: bc,
        bt_stride,
        seq_lens: sc,
        out_ptr: oc.cast(),
        part_o: poc,
        part_m: pmc,
        part_l: plc,
        scale,
        split_len: sl,
        _marker: PhantomData,
    };
    paged_decode::interpret(&mut cpu, grid, &config, &args)?;
    if split {
        let rconfig = paged_decode_reduce::Config::new(T::DEVICE_DTYPE, c.group, d);
        let rgrid = [c.batch as u32, n_q as u32, 1];
        let ms = splits as i32;
        let args = paged_decode_reduce::Args {
            part_o: pod.ptr(),
            part_m: pmd.ptr(),
            part_l: pld.ptr(),
            seq_lens: sd.ptr(),
            out_ptr: od.ptr().cast(),
            split_len: sl,
            max_splits: ms,
            _marker: PhantomData,
        };
        cuda.run::<paged_decode_reduce::Kernel>(rgrid, &rconfig, &args)?;
        let args = paged_decode_reduce::Args {
            part_o: poc,
            part_m: pmc,
            part_l: plc,
            seq_lens: sc,
            out_ptr: oc.cast(),
            split_len: sl,
            max_splits: ms,
            _marker: PhantomData,
        };
        paged_decode_reduce::interpret(&mut cpu, rgrid, &rconfig, &args)?;
    }
    let tol = match T::DEVICE_DTYPE {
        DType::F32 => Tol { atol: 1e-4, rtol: 1e-3 },
        _ => Tol { atol: 1e-3, rtol: 1.0 / 64.0 },
    };
    let shape = format!(
        "B{}/L{}/hq{}_hkv{}_hd{}/page{}/bn{}/w{}/{}",
        c.batch,
        c.max_ctx,
        n_q,
        c.h_kv,
        d,
        c.page,
        c.block_n,
        c.warps,
        match c.split_len {
            Some(l) => format!("split{l}"),
            None => "direct".into(),
        }
    );
    Ok(outcome("paged_decode", shape, T::DEVICE_DTYPE, &od.download()?, &cpu.read(oc), tol))
}

/// The `paged_decode` check (see the module doc).
pub fn paged_decode(cuda: &mut Cuda, seed: u64) -> Result<Vec<CheckRow>> {
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
        out.push(decode_case::<f32>(cuda, &mut rng, c)?);
        out.push(decode_case::<bf16>(cuda, &mut rng, c)?);
    }
    Ok(out)
}

/// One `paged_decode_tc` problem on the inputs of [`inputs`] with `BLOCK_N`
/// of `c.block_n`, `c.warps` warps and `stages` pipeline stages: checked
/// against the f64 reference with FlashAttention's error model
/// ([`r::Attention::error_bound`], `p` rounded to `T`; the keys term widened
/// for the split merge) and against the interpreter within twice that bound.
fn decode_tc_case<T: Sample>(cuda: &mut Cuda, rng: &mut Rng, c: Case, stages: u32) -> Result<CheckRow> {
    let d = c.head_dim;
    let n_q = c.h_kv * c.group;
    let Inputs { ctx, tables, max_pages, q, k, v, split_len, splits } = inputs::<T>(rng, &c);
    let parts = c.batch * c.h_kv * splits * c.group;
    let mut cpu = Cpu::new();
    let ((qd, qc), (kd, kc), (vd, vc)) = (
        upload_both(cuda, &mut cpu, &q)?,
        upload_both(cuda, &mut cpu, &k)?,
        upload_both(cuda, &mut cpu, &v)?,
    );
    let ((bd, bc), (sd, sc)) = (upload_both(cuda, &mut cpu, &tables)?, upload_both(cuda, &mut cpu, &ctx)?);
    let (od, oc) = zeros_both::<T>(cuda, &mut cpu, c.batch * n_q * d)?;
    let (pod, poc) = zeros_both::<f32>(cuda, &mut cpu, parts * d)?;
    let (pmd, pmc) = zeros_both::<f32>(cuda, &mut cpu, parts)?;
    let (pld, plc) = zeros_both::<f32>(cuda, &mut cpu, parts)?;
    let split = c.split_len.is_some();
    let config = paged_decode_tc::Config::new(T::DEVICE_DTYPE, c.h_kv, c.group, d, c.page, c.block_n, split)
        .with_warps(c.warps)
        .with_stages(stages);
    let scale = 1.0 / (d as f32).sqrt();
    let grid = [c.batch as u32, c.h_kv as u32, splits as u32];
    let (bt_stride, sl, ms) = (max_pages as i32, split_len as i32, splits as i32);
    macro_rules! args {
        ($q:expr, $k:expr, $v:expr, $bt:expr, $s:expr, $o:expr, $po:expr, $pm:expr, $pl:expr) => {
            paged_decode_tc::Args {
                q_ptr: $q,
                k_cache: $k,
                v_cache: $v,
                block_tables: $bt,
                bt_stride,
                seq_lens: $s,
                out_ptr: $o,
                part_o: $po,
                part_m: $pm,
                part_l: $pl,
                scale,
                split_len: sl,
                _marker: PhantomData,
            }
        };
    }
    let a = args!(
        qd.ptr().cast(),
        kd.ptr().cast(),
        vd.ptr().cast(),
        bd.ptr(),
        sd.ptr(),
        od.ptr().cast(),
        pod.ptr(),
        pmd.ptr(),
        pld.ptr()
    );
    cuda.run::<paged_decode_tc::Kernel>(grid, &config, &a)?;
    let a = args!(qc.cast(), kc.cast(), vc.cast(), bc, sc, oc.cast(), poc, pmc, plc);
    paged_decode_tc::interpret(&mut cpu, grid, &config, &a)?;
    if split {
        let rconfig = paged_decode_reduce::Config::new(T::DEVICE_DTYPE, c.group, d);
        let rgrid = [c.batch as u32, n_q as u32, 1];
        macro_rules! rargs {
            ($po:expr, $pm:expr, $pl:expr, $s:expr, $o:expr) => {
                paged_decode_reduce::Args {
                    part_o: $po,
                    part_m: $pm,
                    part_l: $pl,
                    seq_lens: $s,
                    out_ptr: $o,
                    split_len: sl,
                    max_splits: ms,
                    _marker: PhantomData,
                }
            };
        }
        let a = rargs!(pod.ptr(), pmd.ptr(), pld.ptr(), sd.ptr(), od.ptr().cast());
        cuda.run::<paged_decode_reduce::Kernel>(rgrid, &rconfig, &a)?;
        let a = rargs!(poc, pmc, plc, sc, oc.cast());
        paged_decode_reduce::interpret(&mut cpu, rgrid, &rconfig, &a)?;
    }
    let got = to_f64(&od.download()?);
    let interp = to_f64(&cpu.read(oc));
    // The f64 reference: each sequence's query (its last position) against its whole context.
    let (k64, v64) = (to_f64(&k), to_f64(&v));
    let kv = PagedKv { k: &k64, v: &v64, block_size: c.page, n_kv: c.h_kv, head_dim: d };
    let q64 = to_f64(&q);
    let ut = unit_roundoff(T::DEVICE_DTYPE);
    let dtype = T::DEVICE_DTYPE;
    let mut row = CheckRow {
        kernel: "paged_decode_tc".into(),
        shape: format!(
            "B{}/L{}/hq{n_q}_hkv{}_hd{d}/page{}/bn{}/w{}/s{stages}/{}",
            c.batch,
            c.max_ctx,
            c.h_kv,
            c.page,
            c.block_n,
            c.warps,
            if split { format!("split{split_len}") } else { "direct".into() }
        ),
        dtype,
        max_abs: 0.0,
        max_rel: 0.0,
        pass: true,
    };
    let per = n_q * d;
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
        for e in 0..per {
            let (g, w, i) = (got[b * per + e], exact.out[e], interp[b * per + e]);
            let bound = exact.error_bound(e, d, n + 8 * splits, ut);
            let diff = (g - w).abs();
            let diff = if diff.is_nan() { f64::INFINITY } else { diff };
            row.max_abs = row.max_abs.max(diff);
            if w != 0.0 {
                row.max_rel = row.max_rel.max(diff / w.abs());
            }
            let vs_interp = (g - i).abs();
            if diff > bound || vs_interp.is_nan() || vs_interp > 2.0 * bound {
                row.pass = false;
            }
        }
    }
    Ok(row)
}

/// The `paged_decode_tc` check: Llama-style 32:8 grouping at head dim 128
/// and SmolLM2's 9:3 at 64, pages of 16/32/64, every autotune config of the
/// kernel (tensor cores), one config below the tensor-core shape rule (`dot`
/// on FMAs), direct and split-KV, bf16 and one f16 case.
pub fn paged_decode_tc(cuda: &mut Cuda, seed: u64) -> Result<Vec<CheckRow>> {
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
        out.push(decode_tc_case::<bf16>(cuda, &mut rng, case(3, 1000, 8, 4, 128, 16, bn, w, None), st)?);
        out.push(decode_tc_case::<bf16>(cuda, &mut rng, case(5, 333, 3, 3, 64, 32, bn, w, Some(128)), st)?);
    }
    out.push(decode_tc_case::<bf16>(cuda, &mut rng, case(2, 3001, 8, 4, 128, 64, 64, 4, Some(512)), 3)?);
    out.push(decode_tc_case::<f16>(cuda, &mut rng, case(3, 777, 8, 4, 128, 32, 64, 4, Some(256)), 3)?);
    out.push(decode_tc_case::<bf16>(cuda, &mut rng, case(4, 61, 3, 3, 64, 16, 16, 4, None), 2)?);
    out.push(decode_tc_case::<bf16>(cuda, &mut rng, case(1, 17, 3, 3, 64, 16, 64, 4, None), 3)?);
    Ok(out)
}

fn row_stats_case(
    cuda: &mut Cuda,
    rng: &mut Rng,
    rows: usize,
    cols: usize,
    br: usize,
    bc: usize,
    warps: u32,
) -> Result<Vec<CheckRow>> {
    let x = rng.values::<f32>(rows * cols, 4.0);
    let bias = rng.values::<f32>(cols, 1.0);
    let mut cpu = Cpu::new();
    let ((xd, xc), (bd, bcpu)) = (upload_both(cuda, &mut cpu, &x)?, upload_both(cuda, &mut cpu, &bias)?);
    let (sd, sc) = zeros_both::<f32>(cuda, &mut cpu, rows)?;
    let (md, mc) = zeros_both::<f32>(cuda, &mut cpu, rows)?;
    let (ad, ac) = zeros_both::<i32>(cuda, &mut cpu, rows)?;
    let (yd, yc) = zeros_both::<f32>(cuda, &mut cpu, rows * cols)?;
    let config = row_stats::Config::new(br, bc).with_warps(warps);
    let grid = [rows.div_ceil(br) as u32, 1, 1];
    let (nr, nc) = (rows as i32, cols as i32);
    let args = row_stats::Args {
        x_ptr: xd.ptr(),
        bias_ptr: bd.ptr(),
        sums_ptr: sd.ptr(),
        maxs_ptr: md.ptr(),
        args_ptr: ad.ptr(),
        y_ptr: yd.ptr(),
        n_rows: nr,
        n_cols: nc,
        _marker: PhantomData,
    };
    cuda.run::<row_stats::Kernel>(grid, &config, &args)?;
    let args = row_stats::Args {
        x_ptr: xc,
        bias_ptr: bcpu,
        sums_ptr: sc,
        maxs_ptr: mc,
        args_ptr: ac,
        y_ptr: yc,
        n_rows: nr,
        n_cols: nc,
        _marker: PhantomData,
    };
    row_stats::interpret(&mut cpu, grid, &config, &args)?;
    let shape = format!("{rows}x{cols}/{br}x{bc}/w{warps}");
    Ok(vec![
        outcome("row_stats.sum", shape.clone(), DType::F32, &sd.download()?, &cpu.read(sc), F32_SUM),
        outcome("row_stats.max", shape.clone(), DType::F32, &md.download()?, &cpu.read(mc), EXACT),
        outcome("row_stats.argmax", shape.clone(), DType::I32, &ad.download()?, &cpu.read(ac), EXACT),
        outcome("row_stats.y", shape, DType::F32, &yd.download()?, &cpu.read(yc), EXACT),
    ])
}

/// The `row_stats` check (see the module doc).
pub fn row_stats(cuda: &mut Cuda, seed: u64) -> Result<Vec<CheckRow>> {
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
        out.extend(row_stats_case(cuda, &mut rng, rows, cols, br, bc, warps)?);
    }
    Ok(out)
}

/// No separate check: `paged_decode_reduce` runs inside every split case of
/// [`paged_decode()`].
pub fn none(_: &mut Cuda, _: u64) -> Result<Vec<CheckRow>> {
    Ok(Vec::new())
}
