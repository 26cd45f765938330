//! Dequant GEMV/GEMM throughput on peers.py's GEMM shapes: the Q4_1 kernel
//! (`kernels::dequant`) against cuBLAS' bf16 `a @ w.t()` on the same shape.
//!
//! Rows, per shape `M x K x N` with M in {1, 16, 64, 256} and (K, N) in
//! {(4096, 14336), (4096, 4096), (576, 1536), (1536, 576)}:
//! - `gemm/bf16/M<m>xK<k>xN<n>`, metric `us`: our time for `out[M, N] = x[M,
//!   K] @ W^T` with bf16 activations and output and `W` repacked Q4_1, so the
//!   ratio to peers.py's cuBLAS row of the same name is the speedup. The
//!   kernel is the one the runtime picks (`kernels::dequant::uses_gemv`):
//!   the GEMV (decode) kernel for small `M`, the tiled tensor-core GEMM
//!   above.
//! - `q4_1_weights/bf16/M<m>xK<k>xN<n>`, metric `TB/s`: the same time as the
//!   bandwidth of the quantized weight bytes read (quants plus f16 `d`/`m`,
//!   `N * K * 5 / 8` bytes; activations and outputs not counted), so the
//!   table shows it as a fraction of the copy ceiling.
//!
//! - `gemv/bf16/{q4_1,q4_k,q6_k}/M1xK4096xN14336`, metric `us`, and
//!   `gguf_weights/bf16/<format>/M1xK4096xN14336`, metric `TB/s`: the GEMV
//!   kernel (untuned tiles) on a weight of each format, and its rate in
//!   GGUF weight bytes (Q4_1 0.625, Q4_K 0.5625, Q6_K 0.8203 bytes a
//!   weight), so formats compare per byte.
//! - `path/{gemv,gemm}/bf16/M<m>xK<k>xN<n>`, metric `us`: both kernels on
//!   SmolLM2's shapes at `M` in {8, 16, 32, 64} (untuned), the measurement
//!   behind the crossover in `uses_gemv`.
//! - `grid/{tiled,stream_k}/bf16/M<m>xK<k>xN<n>`, metric `us`: the GEMM
//!   at K 4096, M in {64, 256}, on `gemm_tiles`' tiled grid and as the
//!   stream-K kernel (256 x 128 x 64 swapped tile, one program per SM;
//!   `stream_k_per_tile`: one program per output tile, no partial sums),
//!   untuned: the measurement behind `kernels::dequant::stream_k`.
//! - `gemv_fused/bf16/<what>/M<m>xK<k>xN<n>`, metric `us`: the fused decode
//!   GEMVs of `kernels::dequant::fused` at the SmolLM2 shapes with the
//!   runtime's tiles (M in {1, 8}): `qkv_norm` (Q4_1, RMSNorm prologue, N
//!   960), `gate_up_norm_silu` (N 1536 outputs of 3072 rows), `o_residual`
//!   and `down_residual` (residual epilogue), and `lm_head_norm` (Q8_0, N
//!   49152, final norm). Compare with the plain rows of the same shapes: the
//!   difference is the fusion's cost, against the launch it removes.
//!
//! Untuned rows use `gemv_tiles` / `gemm_tiles`; with `--autotune` each is
//! followed by a row measured with the config `Cuda::run_tuned` picks from
//! the kernel's declared configs.
//!
//! Timing (`time_launch_ms`): as `bench::time_median_ms` (L2 flushed
//! before every run, so the weights come from DRAM; median of CUDA-event
//! times), but with the host work of a launch kept out of the timed span,
//! as in peers.py's `do_bench`: the kernel is prepared (built, specialized,
//! arguments validated) once, and every timed launch is enqueued behind a
//! short spacer kernel, so the start event fires when the kernel is already
//! queued. `time_median_ms` flushes with an asynchronous memset, which
//! hides the host path of a launch on `Cuda` (IR specialization, cache lookups,
//! validation, the driver call) only while the memset outlasts it; the
//! autotuner times that way, so its medians and these rows can still differ
//! by a few microseconds on the smallest shapes.

use crate::bench::{BenchOptions, Record, pick_config, push_measured};
use crate::check::Rng;
use crate::check::dequant::gguf_weight;
use crate::cuda::Cuda;
use crate::cuda::validate::validate_args;
use crate::cuda::{DevBuf, DevPtr};
use crate::error::{Error, Result};
use crate::model::Device;
use crate::model::args::product_args;
use dsl_core::DType;
use dsl_core::half::{bf16, f16};
use dsl_core::launch::{AnyDType, Kernel};
use kernels::dequant::gemm::gemm;
use kernels::dequant::gemv::gemv;
use kernels::dequant::stream_k::gemm_stream_k;
use kernels::dequant::{
    Fuse, GemmTiles, QuantFormat, SWAPPED_WIDE, gemm_grid, gemm_tiles, gemv_grid, gemv_tiles, repack,
    stream_k, uses_gemv,
};
use kernels::examples::vector_add;
use std::marker::PhantomData;

/// peers.py's GEMM shapes `(K, N)`.
pub const SHAPES: [(usize, usize); 4] = [(4096, 14336), (4096, 4096), (576, 1536), (1536, 576)];
/// SmolLM2-135M's other projection shapes (QKV `576 -> 960`, gate/up `576
/// -> 3072`), measured at decode batch sizes without a peer row.
pub const MODEL_SHAPES: [(usize, usize); 2] = [(576, 960), (576, 3072)];
/// Decode batch sizes of [`MODEL_SHAPES`].
pub const MODEL_BATCHES: [usize; 2] = [1, 8];
/// Batch sizes of the `path/` rows (both kernels).
pub const CROSSOVER_BATCHES: [usize; 4] = [8, 16, 32, 64];
/// peers.py's batch sizes `M`.
pub const BATCHES: [usize; 4] = [1, 16, 64, 256];

/// Elements of each buffer of the spacer kernel (`vector_add` in f32: 3 x
/// 16 MiB moved, a few microseconds of device time, longer than the host
/// needs to record an event and enqueue the timed launch).
const SPACER_LEN: usize = 4 << 20;

/// A kernel launch prepared for [`time_prepared_ms`]: built, specialized and
/// with its arguments validated and packed.
pub(crate) struct Timed {
    p: std::sync::Arc<crate::cuda::backend::Prepared>,
    grid: [u32; 3],
    params: Vec<crate::cuda::KernelParam>,
}

impl Timed {
    /// Enqueues the launch, overlapping the previous kernel when `overlap`
    /// (whatever the kernel declares: only the PDL check's negative control
    /// overrides it).
    pub(crate) fn launch_with(&self, cuda: &Cuda, overlap: bool) -> Result<()> {
        let mut maps = [crate::cuda::tma::blank(); crate::cuda::tma::MAX_MAPS];
        let nm = self.p.encode_maps(&self.params, &mut maps)?;
        cuda.gpu().launch_raw(&self.p.kernel, self.grid, self.p.threads, &self.params, &maps[..nm], overlap)
    }
}

/// Uploaded operands of a quantized product: bf16 activations, the weight's
/// quants and its scales.
pub(crate) type ProductOperands = (DevBuf<bf16>, DevBuf<u8>, DevBuf<f16>);

/// The pointers `(quants, scales, out)` of a product with the uploaded
/// weight planes `q`, `s` and the output `out`, as [`product_args`] takes
/// them.
pub(crate) fn product_planes<'a>(
    q: &'a DevBuf<u8>,
    s: &'a DevBuf<f16>,
    out: &'a DevBuf<bf16>,
) -> (DevPtr<'a, u8>, DevPtr<'a, f16>, DevPtr<'a, AnyDType>) {
    (q.ptr().cast(), s.ptr().cast(), out.ptr().cast())
}

/// The seeded operands of a quantized product, uploaded: `m` bf16 rows of
/// `k` activations (magnitudes up to 2) and a random `format` weight of
/// `rows` rows repacked as `(quants, scales)`; with the generator that drew
/// them, for further inputs.
pub(crate) fn product_operands(
    cuda: &Cuda,
    format: QuantFormat,
    (m, k, rows): (usize, usize, usize),
) -> Result<(Rng, ProductOperands)> {
    let mut rng = Rng::new((m * 7919 + k * 31 + rows) as u64);
    let raw = gguf_weight(&mut rng, format, rows, k);
    let w = repack(format, &raw, rows, k).map_err(|e| Error::Usage(e.to_string()))?;
    drop(raw);
    let x = rng.values::<bf16>(m * k, 2.0);
    let gpu = cuda.gpu();
    let uploaded = (gpu.upload(&x)?, gpu.upload(&w.quants)?, gpu.upload(&w.scales)?);
    Ok((rng, uploaded))
}

/// Prepares `K` on `config` and `args` over `grid` for [`time_prepared_ms`].
pub(crate) fn prepared<'a, K: Kernel>(
    cuda: &mut Cuda,
    grid: [u32; 3],
    config: &K::Config,
    args: &K::Args<'a, Cuda>,
) -> Result<Timed> {
    let raw = K::erase_args(args);
    let p = cuda.prepare::<K>(config, &crate::cuda::facts_of_args(&raw))?;
    let params = validate_args(&p.func, &p.offsets, &raw)
        .map_err(|message| Error::Launch { kernel: K::NAME.to_string(), message })?;
    Ok(Timed { p, grid, params })
}

/// Median CUDA-event time in milliseconds of the prepared `launches`, in
/// order, between one pair of events (see the module docs): `opts.warmup`
/// untimed rounds, then `opts.runs` timed ones, each after an L2 flush and
/// behind the spacer kernel.
pub(crate) fn time_prepared_ms(cuda: &mut Cuda, opts: &BenchOptions, launches: &[Timed]) -> Result<f64> {
    let gpu = cuda.gpu();
    let flush_len = (2 * gpu.info().l2_bytes as usize).max(1 << 20);
    let scratch = gpu.zeros::<u8>(flush_len)?;
    let (sa, sb, so) =
        (gpu.zeros::<f32>(SPACER_LEN)?, gpu.zeros::<f32>(SPACER_LEN)?, gpu.zeros::<f32>(SPACER_LEN)?);
    let spacer_args = vector_add::Args {
        x_ptr: sa.ptr().cast(),
        y_ptr: sb.ptr().cast(),
        out_ptr: so.ptr().cast(),
        n: SPACER_LEN as i32,
        _marker: PhantomData,
    };
    let spacer_config = vector_add::Config::new(DType::F32, 1024);
    let spacer_grid = [SPACER_LEN.div_ceil(1024) as u32, 1, 1];
    let round = |cuda: &mut Cuda| -> Result<()> {
        for l in launches {
            l.launch_with(cuda, l.p.overlap)?;
        }
        Ok(())
    };
    for _ in 0..opts.warmup {
        round(cuda)?;
    }
    cuda.gpu().synchronize()?;
    let (start, end) = (cuda.gpu().event()?, cuda.gpu().event()?);
    let mut times = Vec::with_capacity(opts.runs.max(1));
    for i in 0..opts.runs.max(1) {
        scratch.fill_bytes(i as u8)?;
        cuda.run::<vector_add::Kernel>(spacer_grid, &spacer_config, &spacer_args)?;
        cuda.gpu().record(&start)?;
        round(cuda)?;
        let gpu = cuda.gpu();
        gpu.record(&end)?;
        times.push(f64::from(gpu.elapsed_ms(&start, &end)?));
    }
    cuda.gpu().synchronize()?;
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Median CUDA-event time in milliseconds of launching `K` over `grid`
/// ([`time_prepared_ms`] of one launch).
pub(crate) fn time_launch_ms<'a, K: Kernel>(
    cuda: &mut Cuda,
    opts: &BenchOptions,
    grid: [u32; 3],
    config: &K::Config,
    args: &K::Args<'a, Cuda>,
) -> Result<f64> {
    let t = prepared::<K>(cuda, grid, config, args)?;
    time_prepared_ms(cuda, opts, &[t])
}

/// Times `K` ([`time_launch_ms`]) in the config [`pick_config`] gives for
/// `(base, untuned)`, over the grid `grid_of` gives for it; the time in
/// milliseconds and the tuned config in words.
fn time_picked<'a, K: Kernel>(
    cuda: &mut Cuda,
    opts: &BenchOptions,
    tuned: bool,
    grid_of: impl Fn(&K::Config) -> [u32; 3],
    (base, untuned): (&K::Config, K::Config),
    args: &K::Args<'a, Cuda>,
) -> Result<(f64, Option<String>)> {
    let (config, words) = pick_config::<K>(cuda, tuned, &grid_of, (base, untuned), args)?;
    let ms = time_launch_ms::<K>(cuda, opts, grid_of(&config), &config, args)?;
    Ok((ms, words))
}

/// Whether a GEMM measurement runs the stream-K kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StreamK {
    /// When the runtime would (`kernels::dequant::stream_k`).
    Runtime,
    /// Never: the tiled grid of `gemm_tiles`.
    Never,
    /// Always, on the 256 x 128 x 64 swapped tile and one program per SM.
    Always,
    /// Stream-K's code on as many programs as output tiles (each program
    /// one whole tile, no partial sums): its cost against the tiled grid.
    OnePerTile,
}

/// Measures the product on `m x k x n` (bf16) of a `format` weight with
/// the GEMV (`gemv`) or the GEMM kernel, untuned or autotuned; returns the
/// time in milliseconds and the tuned config in words.
#[allow(clippy::too_many_arguments)]
fn measure(
    cuda: &mut Cuda,
    opts: &BenchOptions,
    format: QuantFormat,
    m: usize,
    k: usize,
    n: usize,
    tuned: bool,
    gemv: bool,
    sk_mode: StreamK,
) -> Result<(f64, Option<String>)> {
    let (_, (xd, qd, sd)) = product_operands(cuda, format, (m, k, n))?;
    let od = cuda.gpu().zeros::<bf16>(m * n)?;
    let planes = product_planes(&qd, &sd, &od);
    if gemv {
        let args = product_args!(gemv, planes, (m, n, k), x_ptr: xd.ptr().cast());
        let t = gemv_tiles(format, m, n, k);
        let base =
            gemv::Config::new(DType::BF16, DType::BF16, format, false, t.m_block, t.block_n, t.block_k);
        let grid_of = |c: &gemv::Config| gemv_grid(m, n, false, c.M_BLOCK, c.BLOCK_N);
        let untuned = base.clone().with_warps(t.num_warps);
        time_picked::<gemv::Kernel>(cuda, opts, tuned, grid_of, (&base, untuned), &args)
    } else {
        let args = product_args!(gemm, planes, (m, n, k), x_ptr: xd.ptr().cast());
        let t = gemm_tiles(format, m, n, k, cuda.wgmma());
        let sms = cuda.gpu().info().sm_count as usize;
        let sk = match sk_mode {
            StreamK::Runtime => stream_k(format, m, n, k, cuda.wgmma(), sms),
            StreamK::Never => None,
            StreamK::Always | StreamK::OnePerTile => {
                let t = SWAPPED_WIDE;
                let tiles = m.div_ceil(t.block_m) * n.div_ceil(t.block_n);
                Some((t, if sk_mode == StreamK::Always { sms.max(tiles) } else { tiles } as u32))
            }
        };
        if let Some((t, g)) = sk {
            return measure_stream_k(cuda, opts, format, (&xd, &qd, &sd, &od), (m, k, n), t, g, tuned);
        }
        let base = gemm::Config::new(
            DType::BF16,
            DType::BF16,
            format,
            false,
            t.block_m,
            t.block_n,
            t.block_k,
            t.swap,
        )
        .with_stages(t.num_stages);
        let grid_of = |c: &gemm::Config| gemm_grid(m, n, false, c.BLOCK_M, c.BLOCK_N);
        let untuned = base.clone().with_warps(t.num_warps);
        time_picked::<gemm::Kernel>(cuda, opts, tuned, grid_of, (&base, untuned), &args)
    }
}

/// Times the stream-K GEMM ([`gemm_stream_k`] of a `format` weight, bf16)
/// on `g` programs with the tiles `t` (autotuned over its declared configs
/// with `tuned`) on uploaded buffers `(x, quants, scales, out)`.
#[allow(clippy::too_many_arguments)]
fn measure_stream_k(
    cuda: &mut Cuda,
    opts: &BenchOptions,
    format: QuantFormat,
    (xd, qd, sd, od): (&DevBuf<bf16>, &DevBuf<u8>, &DevBuf<f16>, &DevBuf<bf16>),
    (m, k, n): (usize, usize, usize),
    t: GemmTiles,
    g: u32,
    tuned: bool,
) -> Result<(f64, Option<String>)> {
    let gpu = cuda.gpu();
    // Room for the largest declared tile.
    let ws = gpu.zeros::<f32>(g as usize * 256 * 128)?;
    let flags = gpu.zeros::<i32>(g as usize)?;
    let args = product_args!(
        gemm_stream_k,
        product_planes(qd, sd, od),
        (m, n, k),
        x_ptr: xd.ptr().cast(),
        ws_ptr: ws.ptr().cast(),
        flag_ptr: flags.ptr().cast(),
    );
    let base = gemm_stream_k::Config::new(DType::BF16, format, false, t.block_m, t.block_n, t.block_k)
        .with_warps(t.num_warps)
        .with_stages(t.num_stages);
    let (ms, words) =
        time_picked::<gemm_stream_k::Kernel>(cuda, opts, tuned, |_| [g, 1, 1], (&base, base.clone()), &args)?;
    let words = Some(match words {
        Some(words) => format!("stream-K on {g} programs, {words}"),
        None => format!("stream-K on {g} programs"),
    });
    Ok((ms, words))
}

/// The fused GEMV rows (see the module docs): `(label, format, silu, norm,
/// residual, k, n)`.
const FUSED_ROWS: [(&str, QuantFormat, bool, bool, bool, usize, usize); 5] = [
    ("qkv_norm", QuantFormat::Q4_1, false, true, false, 576, 960),
    ("gate_up_norm_silu", QuantFormat::Q4_1, true, true, false, 576, 1536),
    ("o_residual", QuantFormat::Q4_1, false, false, true, 576, 576),
    ("down_residual", QuantFormat::Q4_1, false, false, true, 1536, 576),
    ("lm_head_norm", QuantFormat::Q8_0, false, true, false, 576, 49152),
];

/// Times one fused GEMV row in bf16 (milliseconds).
#[allow(clippy::too_many_arguments)]
fn measure_fused(
    cuda: &mut Cuda,
    opts: &BenchOptions,
    format: QuantFormat,
    (silu, norm, residual): (bool, bool, bool),
    m: usize,
    k: usize,
    n: usize,
) -> Result<f64> {
    let rows = if silu { 2 * n } else { n };
    let (mut rng, (xd, qd, sd)) = product_operands(cuda, format, (m, k, rows))?;
    let nw = rng.values::<bf16>(k, 2.0);
    let gpu = cuda.gpu();
    let (nd, od) = (gpu.upload(&nw)?, gpu.zeros::<bf16>(m * n)?);
    let t = gemv_tiles(format, m, rows, k);
    let grid = gemv_grid(m, n, silu, t.m_block, t.block_n);
    use kernels::dequant::fused::gemv_fused as kk;
    let args = product_args!(
        kk,
        product_planes(&qd, &sd, &od),
        (m, n, k),
        x_ptr: xd.ptr().cast(),
        nw_ptr: nd.ptr().cast(),
        ldo: n as i32,
        eps: 1e-5,
    );
    let fuse = Fuse::NONE.with_silu(silu).with_norm(norm).with_residual(residual);
    let config = kk::Config::new(DType::BF16, DType::BF16, format, fuse, t.m_block, t.block_n, t.block_k)
        .with_warps(t.num_warps);
    time_launch_ms::<kk::Kernel>(cuda, opts, grid, &config, &args)
}

/// The fused GEMV records (see the module docs).
pub(crate) fn fused_records(cuda: &mut Cuda, opts: &BenchOptions) -> Result<Vec<Record>> {
    let mut out = Vec::new();
    for (label, format, silu, norm, residual, k, n) in FUSED_ROWS {
        for m in MODEL_BATCHES {
            let ms = measure_fused(cuda, opts, format, (silu, norm, residual), m, k, n)?;
            push_measured(&mut out, Record::latency(format!("gemv_fused/bf16/{label}/M{m}xK{k}xN{n}"), ms));
        }
    }
    Ok(out)
}

/// Every dequant record (see the module docs), printing each as measured.
pub fn records(cuda: &mut Cuda, opts: &BenchOptions) -> Result<Vec<Record>> {
    let mut out = Vec::new();
    let peer_shapes = SHAPES.iter().flat_map(|&s| BATCHES.iter().map(move |&m| (s, m)));
    let model_shapes = MODEL_SHAPES.iter().flat_map(|&s| MODEL_BATCHES.iter().map(move |&m| (s, m)));
    for ((k, n), m) in peer_shapes.chain(model_shapes) {
        {
            for &tuned in opts.tunings() {
                let q4_1 = QuantFormat::Q4_1;
                let (ms, words) =
                    measure(cuda, opts, q4_1, m, k, n, tuned, uses_gemv(m, n), StreamK::Runtime)?;
                let shape = format!("M{m}xK{k}xN{n}");
                // Quants (K / 2 bytes per row) plus the f16 (d, m) pair per block.
                let weight_bytes = (n * k / 2 + n * (k / 32) * 4) as f64;
                out.push(Record::latency(format!("gemm/bf16/{shape}"), ms).with_tuned(words.clone()));
                eprintln!(
                    "measured {} {}",
                    out[out.len() - 1].display_name(),
                    words.as_deref().unwrap_or("")
                );
                let name = format!("q4_1_weights/bf16/{shape}");
                out.push(Record::new(name, "TB/s", weight_bytes / ms / 1e9, ms).with_tuned(words));
            }
        }
    }
    for (k, n) in SHAPES.into_iter().skip(2).chain(MODEL_SHAPES) {
        for m in CROSSOVER_BATCHES {
            for (label, gemv) in [("gemv", true), ("gemm", false)] {
                let (ms, _) = measure(cuda, opts, QuantFormat::Q4_1, m, k, n, false, gemv, StreamK::Never)?;
                push_measured(&mut out, Record::latency(format!("path/{label}/bf16/M{m}xK{k}xN{n}"), ms));
            }
        }
    }
    // Stream-K against the tiled grid on the large products (untuned).
    for (k, n) in SHAPES.into_iter().take(2) {
        for m in [64, 256] {
            let variants = [
                ("tiled", StreamK::Never),
                ("stream_k", StreamK::Always),
                ("stream_k_per_tile", StreamK::OnePerTile),
            ];
            for (label, sk) in variants {
                let (ms, _) = measure(cuda, opts, QuantFormat::Q4_1, m, k, n, false, false, sk)?;
                push_measured(&mut out, Record::latency(format!("grid/{label}/bf16/M{m}xK{k}xN{n}"), ms));
            }
        }
    }
    // The GEMV of the K-quants at the large decode shape, and each format's
    // rate in GGUF weight bytes (Q4_1 0.625, Q4_K 0.5625, Q6_K 0.8203 bytes
    // a weight): the ratio of two formats' rates is the inverse ratio of
    // their times per GGUF byte.
    let (k, n) = SHAPES[0];
    for format in [QuantFormat::Q4_1, QuantFormat::Q4_K, QuantFormat::Q6_K] {
        let (ms, _) = measure(cuda, opts, format, 1, k, n, false, true, StreamK::Never)?;
        let f = format.name().to_lowercase();
        push_measured(&mut out, Record::latency(format!("gemv/bf16/{f}/M1xK{k}xN{n}"), ms));
        let bytes = format.gguf_bytes(n, k) as f64;
        let name = format!("gguf_weights/bf16/{f}/M1xK{k}xN{n}");
        push_measured(&mut out, Record::new(name, "TB/s", bytes / ms / 1e9, ms));
    }
    out.extend(fused_records(cuda, opts)?);
    Ok(out)
}
