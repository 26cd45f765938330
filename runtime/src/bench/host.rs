//! `tessera bench --host`: the native CPU backend's benchmark rows.
//!
//! - `host/memcpy/<bytes>`: the machine's copy rate, every core copying its
//!   share of a buffer far larger than the caches (`copy_from_slice`, the C
//!   library's `memcpy`): the ceiling the kernel rows are compared with.
//! - `host/copy`, `host/softmax`, `host/add_rmsnorm`, `host/gemv_*`: the
//!   library kernels (f32; the GEMVs are `cpu_gemv`'s, which the model's
//!   decode runs) at representative shapes, in GB/s of the bytes
//!   they must read and write (a GEMV: the quantized weights, scales and
//!   activations), with their fraction of the copy rate.
//! - `model/...` (unless `--only` leaves `model` out): SmolLM2-135M through the engine on
//!   the native backend, the two tests of llama.cpp's `llama-bench -p 512
//!   -n 128`: `model/prefill/pp512` (one prompt of 512 tokens) and
//!   `model/decode/tg128` (128 tokens generated at batch 1 from an empty
//!   context: a one-token prompt, then 128 decode steps), with the decode
//!   run's latency rows.
//!
//! Each row is the median of `runs` timed repetitions after `warmup`
//! untimed ones (the first compiles the kernel or reads it from the cache).

use crate::bench::model::ModelBench;
use crate::bench::{BenchOptions, Record};
use crate::check::Rng;
use crate::error::Result;
use crate::model::args::{norm_args, softmax_args};
use codegen::host::Host;
use dsl_core::DType;
use dsl_core::launch::Backend;
use kernels::copy::copy;
use kernels::cpu_gemv::cpu_gemv_tiles;
use kernels::dequant::{Fuse, QuantFormat, gemv_grid, repack};
use kernels::rmsnorm::{self, add_rmsnorm};
use kernels::softmax::softmax;
use std::marker::PhantomData;
use std::time::Instant;

/// The bytes of weights the GEMV rows cycle through: twice this machine
/// class's largest last-level cache (300 MiB).
const COLD_BYTES: usize = 600 << 20;

/// The median wall time of `f` in milliseconds.
fn median_ms(opts: &BenchOptions, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..opts.warmup.max(1) {
        f()?;
    }
    let mut t = Vec::with_capacity(opts.runs.max(1));
    for _ in 0..opts.runs.max(1) {
        let t0 = Instant::now();
        f()?;
        t.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

/// A GB/s row: `bytes` moved in `ms`.
fn gbs(name: String, bytes: f64, ms: f64) -> Record {
    let value = bytes / ms / 1e6;
    eprintln!("measured {name}: {value:.2} GB/s ({ms:.3} ms)");
    Record::new(name, "GB/s", value, ms)
}

/// The machine's copy rate: every core copies its share of 256 MiB.
fn memcpy_row(opts: &BenchOptions) -> Result<Record> {
    let n = 256usize << 20;
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    let threads = codegen::host::launch::threads().max(1);
    let chunk = n.div_ceil(threads);
    let ms = median_ms(opts, || {
        std::thread::scope(|s| {
            for (d, c) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
                s.spawn(move || d.copy_from_slice(c));
            }
        });
        Ok(())
    })?;
    Ok(gbs(format!("host/memcpy/{}MiB", n >> 20), 2.0 * n as f64, ms))
}

/// The kernel rows.
fn kernel_rows(host: &mut Host, opts: &BenchOptions) -> Result<Vec<Record>> {
    let mut out = Vec::new();
    let mut rng = Rng::new(7);
    // copy: 64 Mi f32 read and written.
    let n = 1usize << 26;
    let (x, o) = (host.upload(&rng.values::<f32>(n, 1.0)), host.zeros::<f32>(n));
    let args = copy::Args { x_ptr: x.cast(), out_ptr: o.cast(), n: n as i32, _marker: PhantomData };
    let config = copy::Config::new(DType::F32, 1024);
    let grid = [n.div_ceil(1024) as u32, 1, 1];
    let ms = median_ms(opts, || Ok(host.launch::<copy::Kernel>(grid, &config, &args)?))?;
    out.push(gbs("host/copy/f32/2^26".into(), 8.0 * n as f64, ms));
    // softmax over rows (the shapes of `--shapes`).
    for &(rows, cols) in &opts.shapes {
        let (x, o) = (host.upload(&rng.values::<f32>(rows * cols, 4.0)), host.zeros::<f32>(rows * cols));
        let block = cols.next_power_of_two();
        let config = softmax::Config::new(DType::F32, block);
        let args = softmax_args!(softmax, (o.cast(), x.cast()), cols);
        let ms =
            median_ms(opts, || Ok(host.launch::<softmax::Kernel>([rows as u32, 1, 1], &config, &args)?))?;
        out.push(gbs(format!("host/softmax/f32/{rows}x{cols}"), 8.0 * (rows * cols) as f64, ms));
    }
    // add+RMSNorm: x and r read, out and h written, the weights once.
    for &(tokens, hidden) in &opts.add_rmsnorm {
        let len = tokens * hidden;
        let (x, r) = (host.upload(&rng.values::<f32>(len, 2.0)), host.upload(&rng.values::<f32>(len, 2.0)));
        let w = host.upload(&rng.values::<f32>(hidden, 1.0));
        let (o, h) = (host.zeros::<f32>(len), host.zeros::<f32>(len));
        let block = rmsnorm::block_for(hidden);
        let config = add_rmsnorm::Config::new(DType::F32, block);
        let row = (hidden, hidden, 1e-5);
        let xw = (x.cast(), w.cast());
        let args = norm_args!(add_rmsnorm, xw, row, r_ptr: r.cast(), out_ptr: o.cast(), h_ptr: h.cast());
        let grid = [tokens as u32, 1, 1];
        let ms = median_ms(opts, || Ok(host.launch::<add_rmsnorm::Kernel>(grid, &config, &args)?))?;
        let bytes = 4.0 * (4 * len + hidden) as f64;
        out.push(gbs(format!("host/add_rmsnorm/f32/{tokens}x{hidden}"), bytes, ms));
    }
    // The decode GEMVs the native backend runs (`cpu_gemv`, no fusions) at
    // batch 1: SmolLM2's gate/up, down and LM head, and a 7B-sized one.
    let shapes = [
        (QuantFormat::Q4_1, 3072usize, 576usize, false, false, false),
        (QuantFormat::Q4_1, 3072, 576, true, true, false),
        (QuantFormat::Q4_1, 576, 1536, false, false, false),
        (QuantFormat::Q4_1, 576, 1536, false, false, true),
        (QuantFormat::Q4_1, 14336, 4096, false, false, false),
        (QuantFormat::Q8_0, 49152, 576, false, false, false),
        (QuantFormat::Q8_0, 49152, 576, false, true, false),
    ];
    for (format, rows, k, silu, norm, residual) in shapes {
        let n = if silu { rows / 2 } else { rows };
        let raw = crate::check::dequant::gguf_weight(&mut rng, format, rows, k);
        let w = repack(format, &raw, rows, k).map_err(|e| crate::Error::Usage(e.to_string()))?;
        // Decode streams each weight from memory once per step, so every
        // launch reads its own copy of the weights, the copies together
        // larger than the last-level cache and read oldest-written first.
        let copies = (COLD_BYTES / (w.quants.len() + 2 * w.scales.len())).max(opts.warmup + opts.runs + 1);
        let (xq, q, s) = (
            host.upload(&rng.values::<f32>(k, 1.0)),
            host.upload(&w.quants.repeat(copies)),
            host.upload(&w.scales.repeat(copies)),
        );
        let mut copy = 0usize;
        let o = host.zeros::<f32>(n);
        let t = cpu_gemv_tiles(format, 1, rows, k);
        let grid = gemv_grid(1, n, silu, t.m_block, t.block_n);
        macro_rules! run {
            ($quant:expr) => {{
                use kernels::cpu_gemv::cpu_gemv as kk;
                let fuse = Fuse::NONE.with_silu(silu).with_norm(norm).with_residual(residual);
                let config =
                    kk::Config::new(DType::F32, DType::F32, $quant, fuse, t.m_block, t.block_n, t.block_k);
                let mut args = kk::Args {
                    x_ptr: xq.cast(),
                    q_ptr: q,
                    s_ptr: s,
                    nw_ptr: xq.cast(),
                    out_ptr: o.cast(),
                    m: 1,
                    n: n as i32,
                    ldo: n as i32,
                    k: k as i32,
                    eps: 1e-5,
                    _marker: PhantomData,
                };
                median_ms(opts, || {
                    args.q_ptr = q.offset(copy * w.quants.len());
                    args.s_ptr = s.offset(copy * w.scales.len());
                    copy = (copy + 1) % copies;
                    Ok(host.launch::<kk::Kernel>(grid, &config, &args)?)
                })?
            }};
        }
        let (ms, tag) = match format {
            QuantFormat::Q8_0 => (run!(QuantFormat::Q8_0), "q8_0"),
            _ => (run!(QuantFormat::Q4_1), "q4_1"),
        };
        let fused = [(silu, "+silu"), (norm, "+norm"), (residual, "+residual")];
        let tag: String = std::iter::once(tag).chain(fused.iter().filter(|f| f.0).map(|f| f.1)).collect();
        let extra = if norm { k } else { 0 } + if residual { n } else { 0 };
        let bytes = (w.quants.len() + 2 * w.scales.len() + 4 * (k + n + extra)) as f64;
        out.push(gbs(format!("host/gemv_{tag}/f32/1x{k}x{rows}"), bytes, ms));
    }
    Ok(out)
}

/// Runs the host rows `opts` asks for (kernels unless only `model`; the
/// model unless only kernel families): the records, memcpy first. The model
/// rows run batch-invariant unless `batch_invariance` is false (rows named
/// `... [no-batch-invariance]`).
pub fn run(opts: &BenchOptions, model: &std::path::Path, batch_invariance: bool) -> Result<Vec<Record>> {
    let mut out = Vec::new();
    let kernels = opts.only.is_empty() || opts.only.iter().any(|o| o != "model");
    if kernels {
        out.push(memcpy_row(opts)?);
        let mut host = Host::new();
        out.extend(kernel_rows(&mut host, opts)?);
    }
    if opts.wants("model") {
        let load = crate::app::LoadOptions {
            model: model.to_path_buf(),
            device: crate::app::DeviceChoice::Cpu,
            max_num_seqs: 1,
            max_model_len: 1024,
            batch_invariance,
            ..crate::app::LoadOptions::default()
        };
        let variant = (!batch_invariance).then(|| "no-batch-invariance".to_string());
        // pp512: the prefill of one 512-token prompt.
        let pp = ModelBench {
            batches: vec![1],
            prompt_len: 512,
            new_tokens: 1,
            variant: variant.clone(),
            ..ModelBench::default()
        };
        for r in crate::app::run_task(&load, pp)? {
            if r.name.starts_with("model/prefill/bs1") {
                out.push(Record {
                    name: r.name.replacen("model/prefill/bs1", "model/prefill/pp512", 1),
                    ..r
                });
            }
        }
        // tg128: the prompt's one token (which yields the first new token),
        // then 128 decode steps at contexts 2 to 129.
        let tg =
            ModelBench { batches: vec![1], prompt_len: 1, new_tokens: 129, variant, ..ModelBench::default() };
        for r in crate::app::run_task(&load, tg)? {
            if !r.name.starts_with("model/prefill/") && !r.name.starts_with("model/ttft") {
                out.push(Record { name: r.name.replacen("model/decode/bs1", "model/decode/tg128", 1), ..r });
            }
        }
    }
    Ok(out)
}

/// The host table: name, value and unit, median ms, fraction of memcpy.
pub fn table(records: &[Record]) -> String {
    let ceiling = records.iter().find(|r| r.name.starts_with("host/memcpy/")).map(|r| r.value);
    let width = records.iter().map(|r| r.name.len()).max().unwrap_or(0).max(28);
    let mut s = format!(
        "{:<width$} | {:>10} | {:>6} | {:>10} | {:>9}\n",
        "name", "value", "unit", "median ms", "of memcpy"
    );
    s.push_str(&format!("{}\n", "-".repeat(width + 48)));
    for r in records {
        let frac = match ceiling {
            Some(c) if c > 0.0 && r.metric == "GB/s" => format!("{:.1}%", 100.0 * r.value / c),
            _ => "-".into(),
        };
        s.push_str(&format!(
            "{:<width$} | {:>10.2} | {:>6} | {:>10.3} | {:>9}\n",
            r.name, r.value, r.metric, r.ms, frac
        ));
    }
    s
}
