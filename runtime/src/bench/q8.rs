//! `tessera bench --only gemv_q8`: the 8-bit-activation GEMVs
//! (`kernels::dequant::q8`) on peers.py's decode GEMM shapes.
//!
//! Rows (metric `us`, bf16 activations in and out), per shape `M x K x N`:
//! - `gemm/bf16/M<m>xK<k>xN<n> [q8: quantize + dp4a GEMV]`: the whole path
//!   from bf16 activations, `quantize_q8` then the GEMV (both launches between
//!   one pair of events), compared with peers.py's cuBLAS row of the base
//!   name (which reads the bf16 activations directly);
//! - `... [q8: dp4a GEMV alone]`: the GEMV on already quantized activations
//!   (what a decoder pays when the previous kernel writes them);
//! - `q4_1_weights/bf16/M<m>xK<k>xN<n> [q8]`, metric `TB/s`: the GEMV alone as
//!   the bandwidth of the quantized weight bytes (`N * K * 5 / 8`).
//!
//! - `rmsnorm/bf16/M1xK<k> [plain | fused q8 | plain + quantize_q8]`
//!   (K 576 and 4096): `rmsnorm` alone, `rmsnorm_q8` (the norm fused with
//!   the quantization), and `rmsnorm` then `quantize_q8`.
//!
//! Shapes: Q4_1 at M 1 and 16 with (K, N) in peers.py's set, and the Q8_0
//! LM head of SmolLM2 (M 1, K 576, N 49152; no peer row). Untuned rows use
//! the kernels' first declared config; with `--autotune` each is followed by
//! the tuner's pick. Timing as `bench_dequant` (L2 flushed, spacer kernel,
//! host work outside the events).

use crate::bench::dequant::{prepared, product_operands, product_planes, time_prepared_ms};
use crate::bench::{BenchOptions, Record};
use crate::check::Rng;
use crate::check::q8::quantize_block;
use crate::cuda::{Cuda, DevBuf};
use crate::error::{Error, Result};
use crate::model::Device;
use crate::model::args::{norm_args, product_args};
use dsl_core::DType;
use dsl_core::half::bf16;
use kernels::dequant::q8::{gemv_q8, quantize_q8};
use kernels::dequant::{QuantFormat, gemv_grid};
use std::marker::PhantomData;

/// `(format, m, k, n)` of the rows.
const SHAPES: [(QuantFormat, usize, usize, usize); 7] = [
    (QuantFormat::Q4_1, 1, 4096, 14336),
    (QuantFormat::Q4_1, 1, 4096, 4096),
    (QuantFormat::Q4_1, 1, 576, 1536),
    (QuantFormat::Q4_1, 1, 1536, 576),
    (QuantFormat::Q4_1, 16, 4096, 14336),
    (QuantFormat::Q4_1, 16, 1536, 576),
    (QuantFormat::Q8_0, 1, 576, 49152),
];

/// The `quantize_q8` launch of `m` bf16 rows of `k` values of `x` into
/// quants `xq` and block scales `xs`: its grid, config and arguments.
fn quantize_launch<'a>(
    x: &'a DevBuf<bf16>,
    (xq, xs): (&'a DevBuf<i8>, &'a DevBuf<f32>),
    m: usize,
    k: usize,
) -> ([u32; 3], quantize_q8::Config, quantize_q8::Args<'a, Cuda>) {
    let block = quantize_block(k);
    let args = quantize_q8::Args {
        x_ptr: x.ptr().cast(),
        xq_ptr: xq.ptr(),
        xd_ptr: xs.ptr(),
        k: k as i32,
        _marker: PhantomData,
    };
    ([k.div_ceil(block) as u32, m as u32, 1], quantize_q8::Config::new(DType::BF16, block), args)
}

/// The rows of one shape (untuned, or tuned with `tuned`).
fn shape_records(
    cuda: &mut Cuda,
    opts: &BenchOptions,
    (format, m, k, n): (QuantFormat, usize, usize, usize),
    tuned: bool,
) -> Result<Vec<Record>> {
    let (_, (xd, qd, sd)) = product_operands(cuda, format, (m, k, n))?;
    let gpu = cuda.gpu();
    let (xqd, xsd) = (gpu.zeros::<i8>(m * k)?, gpu.zeros::<f32>(m * k / 32)?);
    let od = gpu.zeros::<bf16>(m * n)?;
    let (qgrid, qconfig, qargs) = quantize_launch(&xd, (&xqd, &xsd), m, k);
    // Real quantized activations for the tuner and the GEMV-alone rows.
    cuda.run::<quantize_q8::Kernel>(qgrid, &qconfig, &qargs)?;
    let quant = prepared::<quantize_q8::Kernel>(cuda, qgrid, &qconfig, &qargs)?;
    macro_rules! gemv {
        ($k:ident, $quant:expr) => {{
            let planes = product_planes(&qd, &sd, &od);
            let args = product_args!($k, planes, (m, n, k), xq_ptr: xqd.ptr(), xd_ptr: xsd.ptr());
            let first = $k::autotune_configs(&$k::Config::new(DType::BF16, $quant, false, 1, 8, 2048))
                .into_iter()
                .next()
                .ok_or_else(|| Error::Usage("no autotune configs".into()))?;
            let grid_of = |c: &$k::Config| gemv_grid(m, n, false, c.M_BLOCK, c.BLOCK_N);
            let (config, words) = if tuned {
                let c = cuda.run_tuned::<$k::Kernel>(grid_of, &first, &args)?;
                let words = crate::cuda::autotune::describe_config(&$k::autotune_configs(&first), &c);
                (c, Some(words))
            } else {
                (first, None)
            };
            (prepared::<$k::Kernel>(cuda, grid_of(&config), &config, &args)?, words)
        }};
    }
    let (g, words) = match format {
        QuantFormat::Q8_0 => gemv!(gemv_q8, QuantFormat::Q8_0),
        _ => gemv!(gemv_q8, QuantFormat::Q4_1),
    };
    let alone = time_prepared_ms(cuda, opts, std::slice::from_ref(&g))?;
    let both = time_prepared_ms(cuda, opts, &[quant, g])?;
    let shape = format!("M{m}xK{k}xN{n}");
    let base = if format == QuantFormat::Q8_0 {
        format!("lm_head/bf16/{shape}")
    } else {
        format!("gemm/bf16/{shape}")
    };
    let bytes = (n * k) as f64 * format.block_bytes() as f64 / 32.0;
    let wname = if format == QuantFormat::Q8_0 { "q8_0_weights" } else { "q4_1_weights" };
    Ok(vec![
        Record::latency(format!("{base} [q8: quantize + dp4a GEMV]"), both).with_tuned(words.clone()),
        Record::latency(format!("{base} [q8: dp4a GEMV alone]"), alone).with_tuned(words.clone()),
        Record::new(format!("{wname}/bf16/{shape} [q8]"), "TB/s", bytes / alone / 1e9, alone)
            .with_tuned(words),
    ])
}

/// The producers of 8-bit activations for one bf16 row of `k` values
/// (`rmsnorm/bf16/M1xK<k>` rows, metric `us`): `[plain]` the `rmsnorm`
/// kernel writing bf16, `[fused q8]` `rmsnorm_q8` writing the quants and
/// scales instead, `[plain + quantize_q8]` the two unfused launches. The
/// difference between the first two is what the fusion costs a decoder that
/// feeds the dp4a GEMVs; the third is what it saves.
fn norm_records(cuda: &mut Cuda, opts: &BenchOptions, k: usize) -> Result<Vec<Record>> {
    use kernels::dequant::q8::rmsnorm_q8;
    use kernels::rmsnorm::{block_for, rmsnorm, warps_for};
    let mut rng = Rng::new(k as u64 * 17 + 5);
    let x = rng.values::<bf16>(k, 2.0);
    let w = rng.values::<bf16>(k, 1.5);
    let gpu = cuda.gpu();
    let (xd, wd, yd) = (gpu.upload(&x)?, gpu.upload(&w)?, gpu.zeros::<bf16>(k)?);
    let (xqd, xsd) = (gpu.zeros::<i8>(k)?, gpu.zeros::<f32>(k / 32)?);
    let (block, warps) = (block_for(k), warps_for(block_for(k)));
    let row = (k, k, 1e-5f32);
    let nconfig = rmsnorm::Config::new(DType::BF16, block, false).with_warps(warps);
    let nargs = norm_args!(rmsnorm, (xd.ptr().cast(), wd.ptr().cast()), row, out_ptr: yd.ptr().cast());
    let fconfig = rmsnorm_q8::Config::new(DType::BF16, block).with_warps(warps);
    let xw = (xd.ptr().cast(), wd.ptr().cast());
    let fargs = norm_args!(rmsnorm_q8, xw, row, xq_ptr: xqd.ptr(), xd_ptr: xsd.ptr());
    let (qgrid, qconfig, qargs) = quantize_launch(&yd, (&xqd, &xsd), 1, k);
    let plain = prepared::<rmsnorm::Kernel>(cuda, [1, 1, 1], &nconfig, &nargs)?;
    let fused = prepared::<rmsnorm_q8::Kernel>(cuda, [1, 1, 1], &fconfig, &fargs)?;
    let quant = prepared::<quantize_q8::Kernel>(cuda, qgrid, &qconfig, &qargs)?;
    let t_plain = time_prepared_ms(cuda, opts, std::slice::from_ref(&plain))?;
    let t_fused = time_prepared_ms(cuda, opts, std::slice::from_ref(&fused))?;
    let t_both = time_prepared_ms(cuda, opts, &[plain, quant])?;
    let rec = |what: &str, ms: f64| Record::latency(format!("rmsnorm/bf16/M1xK{k} [{what}]"), ms);
    Ok(vec![rec("plain", t_plain), rec("fused q8", t_fused), rec("plain + quantize_q8", t_both)])
}

/// The `gemv_q8` records, printing each shape as it is measured.
pub fn records(cuda: &mut Cuda, opts: &BenchOptions) -> Result<Vec<Record>> {
    let mut out = Vec::new();
    for k in [576, 4096] {
        out.extend(norm_records(cuda, opts, k)?);
        eprintln!("measured rmsnorm/bf16/M1xK{k}");
    }
    for shape in SHAPES {
        for &tuned in opts.tunings() {
            out.extend(shape_records(cuda, opts, shape, tuned)?);
            eprintln!("measured {}", out[out.len() - 3].display_name());
        }
    }
    Ok(out)
}
