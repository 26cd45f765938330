//! The GPU check and bench rows of the dense half-precision matmul
//! (`kernels::matmul`, the tensor-core example).
//!
//! Check: random inputs in `(-1, 1)` (bf16 and f16), ragged shapes (`M`, `N`
//! not multiples of any tile, `K` not a multiple of `BLOCK_K`, one-row and
//! one-column outputs) on every configuration of `kernels::matmul::CONFIGS`,
//! compared with the f64 reference `kernels::reference::matmul` (not the
//! interpreter: the larger shapes would take it minutes). Tolerance per
//! element: `reference::matmul::error_bound` (f32 accumulation of exact
//! products in any order, doubled, plus one rounding to the output dtype),
//! times 2 for the tensor cores' accumulation, which is not IEEE
//! round-to-nearest inside one instruction.
//!
//! Bench: `matmul/bf16/{M}x{N}x{K}` (output `M x N`, reduction `K`) at
//! 8192^3 and the prefill shape `M = 256, N = 14336, K = 4096` (Llama-3-8B's
//! gate/up projection), with the configuration of `kernels::matmul::config_for`.
//! Metric `TFLOP/s` with `flops = 2 M N K`; timing as in [`crate::bench`].

use crate::bench::{BenchOptions, Record, push_measured, time_median_ms};
use crate::check::{CheckRow, Rng, compare_each, to_f64};
use crate::cuda::Cuda;
use crate::error::Result;
use crate::model::ActElem;
use crate::model::Device;
use dsl_core::DType;
use dsl_core::half::{bf16, f16};
use kernels::matmul::{CONFIGS, TileConfig, config_for, grid, half_matmul};
use kernels::reference::matmul as r;
use std::marker::PhantomData;

/// The arguments of `half_matmul` for row-major `c[m, n] = a[m, k] b[k, n]`
/// in the buffers `a`, `b` and `c` of `D`.
fn args<'a, T: ActElem, D: Device + 'a>(
    [a, b, c]: [&'a D::Buf<T>; 3],
    (m, n, k): (usize, usize, usize),
) -> Result<half_matmul::Args<'a, D>> {
    Ok(half_matmul::Args {
        a_ptr: D::ptr_at(a, 0)?,
        b_ptr: D::ptr_at(b, 0)?,
        c_ptr: D::ptr_at(c, 0)?,
        m: m as i32,
        n: n as i32,
        k: k as i32,
        stride_am: k as i32,
        stride_bk: n as i32,
        stride_cm: n as i32,
        _marker: PhantomData,
    })
}

/// Runs `matmul` on the device for `m x n x k` with `cfg`; returns the output as f64.
fn run_gpu<T: ActElem, D: Device>(
    dev: &mut D,
    a: &[T],
    b: &[T],
    (m, n, k): (usize, usize, usize),
    cfg: TileConfig,
) -> Result<Vec<f64>> {
    let (ad, bd) = (dev.upload(a)?, dev.upload(b)?);
    let cd = dev.zeros::<T>((m * n).max(1))?;
    let args = args::<T, D>([&ad, &bd, &cd], (m, n, k))?;
    let config = cfg.config(T::DEVICE_DTYPE);
    dev.run::<half_matmul::Kernel>(grid(m, n, &cfg), &config, &args)?;
    Ok(to_f64(&dev.download(&cd)?))
}

/// One check row: `m x n x k` in `T` on `cfg`.
fn case<T: ActElem, D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    (m, n, k): (usize, usize, usize),
    cfg: TileConfig,
) -> Result<CheckRow> {
    let (a, b) = (rng.values::<T>(m * k, 1.0), rng.values::<T>(k * n, 1.0));
    let got = run_gpu(dev, &a, &b, (m, n, k), cfg)?;
    let (a64, b64) = (to_f64(&a), to_f64(&b));
    let want = r::matmul(&a64, &b64, m, n, k);
    let mag = r::abs_products(&a64, &b64, m, n, k);
    let u = if T::DEVICE_DTYPE == DType::BF16 { 1.0 / 256.0 } else { 1.0 / 2048.0 };
    let shape = format!("{m}x{n}x{k} ({})", cfg.describe());
    let tol: Vec<f64> = want.iter().zip(&mag).map(|(&w, &a)| 2.0 * r::error_bound(w, a, k, u)).collect();
    Ok(compare_each("half_matmul", shape, T::DEVICE_DTYPE, &got, &want, &tol))
}

/// The `half_matmul` check: ragged shapes on every configuration, bf16 and f16.
pub fn check<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let mut rows = Vec::new();
    for shape in
        // The last three have K and N multiples of 16, so on sm_90a the
        // wgmma tiles' `load_block`s are TMA boxes: ragged M, N and K edges
        // read as zeros by the hardware.
        [
            (1, 1, 1),
            (37, 45, 70),
            (130, 66, 33),
            (1, 300, 64),
            (300, 1, 48),
            (257, 250, 200),
            (300, 272, 208),
            (129, 256, 1040),
            (512, 512, 512),
        ]
    {
        for cfg in CONFIGS {
            rows.push(case::<bf16, _>(dev, &mut rng, shape, cfg)?);
        }
        rows.push(case::<f16, _>(dev, &mut rng, shape, CONFIGS[0])?);
    }
    Ok(rows)
}

/// One `matmul/bf16/{M}x{N}x{K}` record on `cfg` (the name carries the
/// configuration unless it is the default of `config_for`).
fn record(
    cuda: &mut Cuda,
    opts: &BenchOptions,
    (m, n, k): (usize, usize, usize),
    cfg: TileConfig,
) -> Result<Record> {
    let mut rng = Rng::new((m + n + k) as u64);
    let a = rng.values::<bf16>(m * k, 1.0);
    let b = rng.values::<bf16>(k * n, 1.0);
    let (ad, bd) = (cuda.upload(&a)?, cuda.upload(&b)?);
    drop((a, b));
    let cd = cuda.zeros::<bf16>(m * n)?;
    let args = args::<bf16, Cuda>([&ad, &bd, &cd], (m, n, k))?;
    let config = cfg.config(DType::BF16);
    let g = grid(m, n, &cfg);
    let ms = time_median_ms(cuda, opts.warmup, opts.runs, |c: &mut Cuda| {
        c.run::<half_matmul::Kernel>(g, &config, &args)
    })?;
    let base = format!("matmul/bf16/{m}x{n}x{k}");
    let name =
        if cfg == config_for(m, n, cuda.wgmma()) { base } else { format!("{base} [{}]", cfg.describe()) };
    Ok(Record::new(name, "TFLOP/s", 2.0 * (m * n) as f64 * k as f64 / ms / 1e9, ms))
}

/// The matmul bench records: each shape on its default configuration, then
/// on the others (named with their tile), printing each as it is measured.
pub fn bench_records(cuda: &mut Cuda, opts: &BenchOptions) -> Result<Vec<Record>> {
    let mut out = Vec::new();
    for shape in [(8192, 8192, 8192), (256, 14336, 4096)] {
        let default = config_for(shape.0, shape.1, cuda.wgmma());
        let others = CONFIGS.into_iter().filter(|c| *c != default);
        for cfg in std::iter::once(default).chain(others) {
            push_measured(&mut out, record(cuda, opts, shape, cfg)?);
        }
    }
    Ok(out)
}
