//! `tessera bench`: kernel throughput on the GPU, named and measured like the
//! peer baselines of `shared/bench/peers.py`, so ratios can be taken from one
//! run on one machine.
//!
//! Method: random non-zero inputs; `warmup` launches; then `runs` timed
//! launches, each preceded by a write of a scratch buffer twice the L2 size
//! (so no run reads inputs left in L2 by the previous one) and timed alone with
//! CUDA events; the median is reported. Throughput counts bytes read plus
//! bytes written: `2 * elements * element size / time` (TB/s = 10^12 B/s).
//!
//! Names: `softmax/<torch dtype name>/<rows>x<cols>` (`float32`, `bfloat16`, as
//! peers.py writes them) and `copy/f32/2^29`, the bandwidth ceiling every other
//! kernel is reported as a fraction of.
//!
//! `add_rmsnorm/bf16/<tokens>x<hidden>` (peers.py's names): TB/s with bytes =
//! `4 * tokens * hidden * 2` (read x and r, write out and h; the weight is not
//! counted, as peers.py counts it), except a single token (`1x<hidden>`, one
//! decode step), which is a latency in microseconds (metric `us`). For `us`
//! rows the ratio to a peer is the speedup `peer time / our time`, so a ratio
//! above 1 is better for every metric.
//!
//! With `--autotune`, each softmax row is followed by one of the same name
//! measured with the config [`Cuda::run_tuned`] picks (tuned on first use,
//! then read from the autotune cache); the table marks it `(tuned)` and the
//! JSON record carries the config in `tuned`.

use crate::check::Rng;
use crate::cuda::{Cuda, DevBuf};
use crate::error::{Error, Result};
use crate::model::args::{norm_args, softmax_args};
use crate::model::{ActElem, Device};
use dsl_core::DType;
use dsl_core::half::bf16;
use dsl_core::launch::Kernel;
use kernels::copy::copy;
use kernels::rmsnorm::{add_rmsnorm, block_for, warps_for};
use kernels::softmax::{softmax, softmax_warps};
use serde_json::json;
use std::marker::PhantomData;

pub mod attention;
pub mod decode;
pub mod dequant;
pub mod host;
pub mod linear;
pub mod model;
pub mod q8;
pub mod serve;
pub mod spec;

/// What to measure and how often.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchOptions {
    /// Untimed launches before measuring.
    pub warmup: usize,
    /// Timed launches (the median is reported).
    pub runs: usize,
    /// Softmax shapes (rows, cols).
    pub shapes: Vec<(usize, usize)>,
    /// Also measure the copy ceiling (`copy/f32/2^29`, 4 GiB of device memory).
    pub copy: bool,
    /// Also measure softmax with its autotuned config.
    pub autotune: bool,
    /// Add+RMSNorm shapes (tokens, hidden), bf16; a single token is timed in
    /// microseconds.
    pub add_rmsnorm: Vec<(usize, usize)>,
    /// Families to measure (`copy`, `softmax`, `add_rmsnorm`, `decode`,
    /// `attention`, `gemm`, `sampling`); all when empty.
    pub only: Vec<String>,
}

impl BenchOptions {
    /// Whether the family `name` is measured.
    pub fn wants(&self, name: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| o == name)
    }

    /// Whether each row is measured untuned, then (with `--autotune`) tuned.
    pub fn tunings(&self) -> &'static [bool] {
        if self.autotune { &[false, true] } else { &[false] }
    }
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            warmup: 5,
            runs: 25,
            shapes: vec![(8192, 1024), (4096, 16384)],
            copy: true,
            autotune: false,
            add_rmsnorm: vec![(8192, 4096), (32768, 576), (1, 576)],
            only: Vec::new(),
        }
    }
}

/// One measurement, in peers.py's record format plus the median time.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// The benchmark name (peers.py's scheme).
    pub name: String,
    /// The metric, `TB/s` (or `us` for latency rows).
    pub metric: &'static str,
    /// The value of the metric.
    pub value: f64,
    /// Median time of one launch, in milliseconds.
    pub ms: f64,
    /// The autotuned config in words, for rows measured with one.
    pub tuned: Option<String>,
    /// The row whose work this row does on other bytes, and what the table
    /// calls it (an FP8 cache's decode row: the 16-bit cache's row of the
    /// same shape, `16-bit cache`). The table compares such a row by time,
    /// with that row and with the peers on it: its bandwidth counts fewer
    /// bytes for the same tokens.
    pub work_of: Option<(String, String)>,
}

impl Record {
    /// An untuned row.
    pub fn new(name: String, metric: &'static str, value: f64, ms: f64) -> Record {
        Record { name, metric, value, ms, tuned: None, work_of: None }
    }

    /// An untuned latency row: `ms` per launch, shown in microseconds.
    pub fn latency(name: String, ms: f64) -> Record {
        Record::new(name, "us", ms * 1e3, ms)
    }

    /// This row, measured with the autotuned config `tuned` (in words) where
    /// there is one.
    pub fn with_tuned(self, tuned: Option<String>) -> Record {
        Record { tuned, ..self }
    }

    /// This row, doing the work of row `base` (called `label` in the
    /// table) on other bytes (see [`Record::work_of`]).
    pub fn with_work_of(self, base: String, label: &str) -> Record {
        Record { work_of: Some((base, label.to_string())), ..self }
    }

    /// The name as the table shows it (`(tuned)` after autotuned rows).
    pub fn display_name(&self) -> String {
        match self.tuned {
            Some(_) => format!("{} (tuned)", self.name),
            None => self.name.clone(),
        }
    }
}

/// The torch dtype name peers.py uses in benchmark names.
pub fn torch_dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "float32",
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        other => other.name(),
    }
}

/// Parses `RxC[,RxC...]` into shapes.
pub fn parse_shapes(s: &str) -> Result<Vec<(usize, usize)>> {
    s.split(',')
        .map(|part| {
            let bad = || Error::Usage(format!("bad shape `{part}`: expected ROWSxCOLS, e.g. 8192x1024"));
            let (r, c) = part.trim().split_once('x').ok_or_else(bad)?;
            let (r, c) = (r.parse::<usize>().map_err(|_| bad())?, c.parse::<usize>().map_err(|_| bad())?);
            if r == 0 || c == 0 || r > i32::MAX as usize || c > (1 << 20) {
                return Err(bad());
            }
            Ok((r, c))
        })
        .collect()
}

/// Median of `v` (sorted in place); 0 when empty.
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let m = v.len() / 2;
    if v.len() % 2 == 1 { v[m] } else { (v[m - 1] + v[m]) / 2.0 }
}

/// Times `launch` per the method above (`warmup` untimed launches, then `runs`
/// timed ones, each after an L2 flush) and returns the median in milliseconds.
/// Also what [`Cuda::run_tuned`] times candidates with.
pub fn time_median_ms(
    cuda: &mut Cuda,
    warmup: usize,
    runs: usize,
    mut launch: impl FnMut(&mut Cuda) -> Result<()>,
) -> Result<f64> {
    let flush_len = (2 * cuda.gpu().info().l2_bytes as usize).max(1 << 20);
    let scratch: DevBuf<u8> = cuda.gpu().zeros(flush_len)?;
    for _ in 0..warmup {
        launch(cuda)?;
    }
    cuda.gpu().synchronize()?;
    let mut times = Vec::with_capacity(runs);
    let (start, end) = (cuda.gpu().event()?, cuda.gpu().event()?);
    for i in 0..runs.max(1) {
        scratch.fill_bytes_async(i as u8)?;
        cuda.gpu().record(&start)?;
        launch(cuda)?;
        cuda.gpu().record(&end)?;
        times.push(f64::from(cuda.gpu().elapsed_ms(&start, &end)?));
    }
    cuda.gpu().synchronize()?;
    Ok(median(&mut times))
}

/// [`time_median_ms`] with the warm-up and runs of `opts`.
fn measure(cuda: &mut Cuda, opts: &BenchOptions, launch: impl FnMut(&mut Cuda) -> Result<()>) -> Result<f64> {
    time_median_ms(cuda, opts.warmup, opts.runs, launch)
}

/// Measures softmax on `rows x cols` in `T`: with the tutorial's warp heuristic,
/// or with the autotuned config when `tuned`.
fn softmax_record<T: ActElem>(
    cuda: &mut Cuda,
    opts: &BenchOptions,
    rows: usize,
    cols: usize,
    tuned: bool,
) -> Result<Record> {
    let n = rows * cols;
    let x = Rng::new((rows * 31 + cols) as u64).values::<T>(n, 4.0);
    let (xd, od) = (cuda.gpu().upload(&x)?, cuda.gpu().zeros::<T>(n)?);
    drop(x);
    let block = cols.next_power_of_two();
    let args = softmax_args!(softmax, (od.ptr().cast(), xd.ptr().cast()), cols);
    let grid = [rows as u32, 1, 1];
    let base = softmax::Config::new(T::DEVICE_DTYPE, block);
    let untuned = base.clone().with_warps(softmax_warps(block));
    let (config, tuned) = pick_config::<softmax::Kernel>(cuda, tuned, |_| grid, (&base, untuned), &args)?;
    let ms = measure(cuda, opts, |c| c.run::<softmax::Kernel>(grid, &config, &args))?;
    let bytes = 2.0 * n as f64 * T::DEVICE_DTYPE.size_bytes() as f64;
    let name = format!("softmax/{}/{rows}x{cols}", torch_dtype_name(T::DEVICE_DTYPE));
    Ok(Record::new(name, "TB/s", bytes / ms / 1e9, ms).with_tuned(tuned))
}

/// The config a row measures `K` with: `untuned`, or with `tuned` the one
/// [`Cuda::run_tuned`] picks among `K`'s declared configs around `base`,
/// with those words for the row's `tuned` column.
pub fn pick_config<'a, K: Kernel>(
    cuda: &mut Cuda,
    tuned: bool,
    grid_of: impl Fn(&K::Config) -> [u32; 3],
    (base, untuned): (&K::Config, K::Config),
    args: &K::Args<'a, Cuda>,
) -> Result<(K::Config, Option<String>)> {
    if !tuned {
        return Ok((untuned, None));
    }
    let config = cuda.run_tuned::<K>(grid_of, base, args)?;
    let words = crate::cuda::autotune::describe_config(&K::autotune_configs(base), &config);
    Ok((config, Some(words)))
}

/// Measures add+RMSNorm on `tokens x hidden` in bf16 (peers.py's
/// `add_rmsnorm`, eps 1e-5): with Triton's warp heuristic, or with the
/// autotuned config when `tuned`. A single token is reported in microseconds.
fn add_rmsnorm_record(
    cuda: &mut Cuda,
    opts: &BenchOptions,
    tokens: usize,
    hidden: usize,
    tuned: bool,
) -> Result<Record> {
    let n = tokens * hidden;
    let mut rng = Rng::new((tokens * 37 + hidden) as u64);
    let (x, r, w) = (rng.values::<bf16>(n, 4.0), rng.values::<bf16>(n, 4.0), rng.values::<bf16>(hidden, 2.0));
    let (xd, rd, wd) = (cuda.gpu().upload(&x)?, cuda.gpu().upload(&r)?, cuda.gpu().upload(&w)?);
    drop((x, r));
    let (od, hd) = (cuda.gpu().zeros::<bf16>(n)?, cuda.gpu().zeros::<bf16>(n)?);
    let block = block_for(hidden);
    let args = norm_args!(
        add_rmsnorm,
        (xd.ptr().cast(), wd.ptr().cast()),
        (hidden, hidden, 1e-5),
        r_ptr: rd.ptr().cast(),
        out_ptr: od.ptr().cast(),
        h_ptr: hd.ptr().cast(),
    );
    let grid = [tokens as u32, 1, 1];
    let base = add_rmsnorm::Config::new(DType::BF16, block);
    let untuned = base.clone().with_warps(warps_for(block));
    let (config, tuned) = pick_config::<add_rmsnorm::Kernel>(cuda, tuned, |_| grid, (&base, untuned), &args)?;
    let ms = measure(cuda, opts, |c| c.run::<add_rmsnorm::Kernel>(grid, &config, &args))?;
    let (metric, value) =
        if tokens == 1 { ("us", ms * 1e3) } else { ("TB/s", 4.0 * n as f64 * 2.0 / ms / 1e9) };
    Ok(Record::new(format!("add_rmsnorm/bf16/{tokens}x{hidden}"), metric, value, ms).with_tuned(tuned))
}

fn copy_record(cuda: &mut Cuda, opts: &BenchOptions) -> Result<Record> {
    let n = 1usize << 29;
    let x = Rng::new(29).values::<f32>(n, 4.0);
    let (xd, od) = (cuda.gpu().upload(&x)?, cuda.gpu().zeros::<f32>(n)?);
    drop(x);
    let config = copy::Config::new(DType::F32, 1024);
    let args =
        copy::Args { x_ptr: xd.ptr().cast(), out_ptr: od.ptr().cast(), n: n as i32, _marker: PhantomData };
    let grid = [n.div_ceil(1024) as u32, 1, 1];
    let ms = measure(cuda, opts, |c| c.run::<copy::Kernel>(grid, &config, &args))?;
    Ok(Record::new("copy/f32/2^29".into(), "TB/s", 2.0 * n as f64 * 4.0 / ms / 1e9, ms))
}

/// Appends `r` to `out`, saying on stderr that it was measured.
pub(crate) fn push_measured(out: &mut Vec<Record>, r: Record) {
    eprintln!("measured {}", r.display_name());
    out.push(r);
}

/// Runs every benchmark of `opts`, printing each record as it is measured.
pub fn run(cuda: &mut Cuda, opts: &BenchOptions) -> Result<Vec<Record>> {
    let mut out = Vec::new();
    if opts.copy && opts.wants("copy") {
        push_measured(&mut out, copy_record(cuda, opts)?);
    }
    for &(rows, cols) in opts.shapes.iter().filter(|_| opts.wants("softmax")) {
        for &tuned in opts.tunings() {
            push_measured(&mut out, softmax_record::<f32>(cuda, opts, rows, cols, tuned)?);
        }
        for &tuned in opts.tunings() {
            push_measured(&mut out, softmax_record::<bf16>(cuda, opts, rows, cols, tuned)?);
        }
    }
    for &(tokens, hidden) in opts.add_rmsnorm.iter().filter(|_| opts.wants("add_rmsnorm")) {
        for &tuned in opts.tunings() {
            push_measured(&mut out, add_rmsnorm_record(cuda, opts, tokens, hidden, tuned)?);
        }
    }
    for (name, records) in FAMILY_RECORDS {
        if opts.wants(name) {
            out.extend(records(cuda, opts)?);
        }
    }
    Ok(out)
}

/// A function that measures (and prints) the records of one benchmark family.
type FamilyRecords = fn(&mut Cuda, &BenchOptions) -> Result<Vec<Record>>;

/// The benchmark families whose records one function measures (and prints),
/// by the name `opts` selects them with, in the order they run.
const FAMILY_RECORDS: [(&str, FamilyRecords); 8] = [
    ("decode", crate::bench::decode::records),
    ("attention", crate::bench::attention::records),
    ("gemm", crate::bench::dequant::records),
    ("linear", crate::bench::linear::records),
    ("gemv_q8", crate::bench::q8::records),
    ("sampling", crate::check::sampling::bench_records),
    ("matmul", crate::check::matmul::bench_records),
    ("fp8", crate::check::fp8::bench_records),
];

/// Peer values by name, read from peers.py's JSON output.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Peers {
    /// The device the peers ran on.
    pub device: String,
    /// `(name, peer, metric, value)` records.
    pub records: Vec<(String, String, String, f64)>,
}

impl Peers {
    /// Parses peers.py's output: `{"device": .., "records": [{"name", "peer", "metric", "value"}]}`.
    pub fn parse(text: &str) -> Result<Peers> {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| Error::Usage(format!("peers file is not JSON: {e}")))?;
        let recs = v
            .get("records")
            .and_then(|r| r.as_array())
            .ok_or_else(|| Error::Usage("peers file has no `records` array".into()))?;
        let mut out = Peers { device: v["device"].as_str().unwrap_or("?").to_string(), records: Vec::new() };
        for r in recs {
            let s = |k: &str| r.get(k).and_then(|x| x.as_str()).map(str::to_string);
            let (Some(name), Some(peer), Some(metric), Some(value)) =
                (s("name"), s("peer"), s("metric"), r.get("value").and_then(|x| x.as_f64()))
            else {
                return Err(Error::Usage(format!("malformed peer record: {r}")));
            };
            out.records.push((name, peer, metric, value));
        }
        Ok(out)
    }

    /// The peers measured on `name` in `metric`.
    pub fn on<'a>(&'a self, name: &'a str, metric: &'a str) -> impl Iterator<Item = (&'a str, f64)> + 'a {
        self.records.iter().filter(move |r| r.0 == name && r.2 == metric).map(|r| (r.1.as_str(), r.3))
    }
}

/// Formats the results table: value, time, fraction of the copy ceiling and
/// the ratio to each peer on the same name (by time for a row doing another
/// row's work on other bytes, which is also compared with that row).
pub fn table(records: &[Record], peers: Option<&Peers>) -> String {
    let ceiling = records.iter().find(|r| r.name == "copy/f32/2^29").map(|r| r.value);
    let width = records.iter().map(|r| r.display_name().len()).max().unwrap_or(0).max(28);
    let mut s =
        format!("{:<width$} | {:>9} | {:>10} | {:>8} | vs peers\n", "name", "TB/s", "median ms", "of copy");
    s.push_str(&format!("{}\n", "-".repeat(width + 52)));
    for r in records {
        let frac = match ceiling {
            Some(c) if c > 0.0 && r.metric == "TB/s" => format!("{:.1}%", 100.0 * r.value / c),
            _ => "-".into(),
        };
        // Ratios above 1 are better: throughput ours / peer, latency peer / ours.
        let ratio = |v: f64| if r.metric == "us" { v / r.value } else { r.value / v };
        // A bracketed suffix names a variant of the same work (a config, a
        // kernel): it is compared with the peers' row of the base name.
        let base = r.name.split(" [").next().unwrap_or(&r.name);
        // A row doing another row's work on other bytes is compared by time:
        // a peer's time is that row's bytes at the peer's rate.
        let same_work = r
            .work_of
            .as_ref()
            .and_then(|(w, label)| records.iter().find(|b| &b.name == w && b.ms > 0.0).map(|b| (b, label)));
        let mut vs: Vec<String> = match same_work {
            Some((b, _)) if r.metric == "TB/s" && r.ms > 0.0 => peers
                .map(|p| {
                    p.on(base, r.metric)
                        .filter(|&(_, v)| v > 0.0)
                        .map(|(peer, v)| format!("{peer} {:.2}x", b.value * b.ms / v / r.ms))
                        .collect()
                })
                .unwrap_or_default(),
            _ => peers
                .map(|p| p.on(base, r.metric).map(|(peer, v)| format!("{peer} {:.2}x", ratio(v))).collect())
                .unwrap_or_default(),
        };
        if let Some((b, label)) = same_work.filter(|_| r.ms > 0.0) {
            vs.push(format!("{label} {:.2}x", b.ms / r.ms));
        }
        let value = if r.metric == "TB/s" {
            format!("{:.3}", r.value)
        } else {
            format!("{:.2} {}", r.value, r.metric)
        };
        s.push_str(&format!(
            "{:<width$} | {:>9} | {:>10.4} | {:>8} | {}\n",
            r.display_name(),
            value,
            r.ms,
            frac,
            if vs.is_empty() { "-".to_string() } else { vs.join(", ") }
        ));
    }
    s
}

/// The records as JSON in peers.py's format (peer `tessera`), plus the median
/// time and the fraction of the copy ceiling.
pub fn to_json(device: &str, records: &[Record]) -> serde_json::Value {
    let ceiling = records.iter().find(|r| r.name == "copy/f32/2^29").map(|r| r.value);
    let recs: Vec<serde_json::Value> = records
        .iter()
        .map(|r| {
            let mut v = json!({
                "name": r.name,
                "peer": "tessera",
                "metric": r.metric,
                "value": (r.value * 1e4).round() / 1e4,
                "ms": r.ms,
                "fraction_of_copy": ceiling.filter(|_| r.metric == "TB/s").map(|c| r.value / c),
            });
            if let Some(t) = &r.tuned {
                v["tuned"] = json!(t);
            }
            v
        })
        .collect();
    json!({ "device": device, "records": recs })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An untuned record.
    fn record(name: &str, metric: &'static str, value: f64, ms: f64) -> Record {
        Record::new(name.into(), metric, value, ms)
    }

    /// A peers file of an H100, parsed from its JSON text: `rows` of `(name,
    /// peer, metric, value)`, then the copy row (3 TB/s) the ceilings use.
    fn h100_peers(rows: &[(&str, &str, &str, f64)]) -> Peers {
        let mut records: Vec<serde_json::Value> = rows
            .iter()
            .map(|(name, peer, metric, value)| {
                serde_json::json!({"name": name, "peer": peer, "metric": metric, "value": value})
            })
            .collect();
        records.push(
            serde_json::json!({"name": "copy/f32/2^29", "peer": "torch", "metric": "TB/s", "value": 3.0}),
        );
        Peers::parse(&serde_json::json!({"device": "H100", "records": records}).to_string()).unwrap()
    }

    #[test]
    fn shapes_parse_and_reject_garbage() {
        assert_eq!(parse_shapes("8192x1024,4096x16384").unwrap(), vec![(8192, 1024), (4096, 16384)]);
        assert!(parse_shapes("8192").is_err());
        assert!(parse_shapes("0x5").is_err());
        assert!(parse_shapes("ax5").is_err());
    }

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&mut []), 0.0);
    }

    #[test]
    fn peers_ratios_and_json() {
        let p = h100_peers(&[
            ("softmax/float32/8192x1024", "torch", "TB/s", 2.0),
            ("softmax/float32/8192x1024", "triton", "TB/s", 2.5),
        ]);
        assert_eq!(p.device, "H100");
        let recs = vec![
            record("copy/f32/2^29", "TB/s", 3.0, 1.0),
            record("softmax/float32/8192x1024", "TB/s", 2.4, 0.03),
        ];
        let t = table(&recs, Some(&p));
        assert!(t.contains("torch 1.20x"), "{t}");
        assert!(t.contains("triton 0.96x"), "{t}");
        assert!(t.contains("80.0%"), "{t}");
        let j = to_json("H100", &recs);
        assert_eq!(j["records"][1]["name"], "softmax/float32/8192x1024");
        assert_eq!(j["records"][1]["peer"], "tessera");
        assert!(j["records"][1].get("tuned").is_none());
        // The default table keeps its layout: 28 columns of names, 80 of rule.
        assert!(t.lines().nth(1).is_some_and(|l| l.len() == 80), "{t}");

        // A tuned row keeps the peers' name (so ratios apply) and says so.
        let mut tuned = recs.clone();
        tuned.push(Record {
            tuned: Some("num_warps=8".into()),
            ..record("softmax/bfloat16/4096x16384", "TB/s", 2.4, 0.05)
        });
        let t = table(&tuned, Some(&p));
        assert!(t.contains("softmax/bfloat16/4096x16384 (tuned) |"), "{t}");
        let j = to_json("H100", &tuned);
        assert_eq!(j["records"][2]["name"], "softmax/bfloat16/4096x16384");
        assert_eq!(j["records"][2]["tuned"], "num_warps=8");
        assert!(Peers::parse("{}").is_err());
        assert!(Peers::parse("not json").is_err());
        assert!(Peers::parse(r#"{"records": [{"name": 1}]}"#).is_err());
    }

    #[test]
    fn fp8_cache_rows_compare_by_time() {
        let name = "decode/bf16/B64/L8192/hq32_hkv8_hd128";
        let p = h100_peers(&[(name, "sdpa_dense", "TB/s", 4.0)]);
        // The 16-bit row moves 2 GB in 0.5 ms; the FP8 row a bit over half of
        // it in 0.4 ms: the same tokens 1.25x as fast, whatever its TB/s.
        let recs = vec![
            record("copy/f32/2^29", "TB/s", 3.0, 1.0),
            record(name, "TB/s", 4.0, 0.5),
            record(&format!("{name} [fp8 KV]"), "TB/s", 2.6, 0.4)
                .with_work_of(name.to_string(), "16-bit cache"),
        ];
        let t = table(&recs, Some(&p));
        let fp8 = t.lines().find(|l| l.contains("[fp8 KV]")).unwrap();
        assert!(fp8.contains("sdpa_dense 1.25x") && fp8.contains("16-bit cache 1.25x"), "{t}");
        let plain = t.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap();
        assert!(plain.contains("sdpa_dense 1.00x") && !plain.contains("cache"), "{t}");
        // Without the base row the FP8 row falls back to its own bandwidth.
        let t = table(&[recs[0].clone(), recs[2].clone()], Some(&p));
        assert!(t.contains("sdpa_dense 0.65x") && !t.contains("16-bit cache"), "{t}");
    }

    #[test]
    fn add_rmsnorm_latency_rows() {
        let p = h100_peers(&[
            ("add_rmsnorm/bf16/1x576", "torch_eager", "us", 30.0),
            ("add_rmsnorm/bf16/8192x4096", "torch_compile", "TB/s", 2.0),
        ]);
        let recs = vec![
            record("copy/f32/2^29", "TB/s", 3.0, 1.0),
            record("add_rmsnorm/bf16/8192x4096", "TB/s", 2.5, 0.1),
            record("add_rmsnorm/bf16/1x576", "us", 6.0, 0.006),
        ];
        let t = table(&recs, Some(&p));
        // Throughput: ours / peer; latency: peer / ours (a speedup either way).
        assert!(t.contains("torch_compile 1.25x"), "{t}");
        assert!(t.contains("6.00 us") && t.contains("torch_eager 5.00x"), "{t}");
        let j = to_json("H100", &recs);
        assert_eq!(j["records"][2]["metric"], "us");
        assert!(j["records"][2]["fraction_of_copy"].is_null());
        assert!(BenchOptions::default().add_rmsnorm.contains(&(1, 576)));
    }

    #[test]
    fn names_follow_peers_py() {
        assert_eq!(torch_dtype_name(DType::F32), "float32");
        assert_eq!(torch_dtype_name(DType::BF16), "bfloat16");
    }
}
