//! `tessera bench serve`: a load generator for an OpenAI-compatible server
//! (`tessera serve`, vLLM, llama.cpp's server): it replays N streaming
//! `/v1/completions` requests at a fixed concurrency, optionally with
//! Poisson arrivals at a given rate, and reports, per run, vLLM's
//! `benchmark_serving` numbers: TTFT, TPOT and ITL (mean, p50, p99),
//! end-to-end latency, request throughput and token throughput.
//!
//! Workload: every request's prompt is `input_len` random token ids (seeded,
//! drawn from `[min_token_id, max_token_id)`, so the prefix cache sees no
//! shared prefixes) and asks for exactly `output_len` tokens (`ignore_eos`,
//! greedy), streamed with `stream_options.include_usage`.
//!
//! Definitions: TTFT = first chunk with text minus send time; ITL = gaps
//! between consecutive text chunks; TPOT = (end-to-end - TTFT) / (output
//! tokens - 1) per request; output tokens come from the usage chunk; request
//! and token throughput divide by the run's wall time (first send to last
//! finish). Failed requests are counted and left out of the latencies.
//!
//! Invariant: only the addresses given by `--url` are contacted; every run
//! is bounded by its request count and a per-request timeout.

use crate::error::{Error, Result};
use crate::rng::Rng;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Arguments of `bench serve`.
#[derive(Clone, Debug, clap::Args)]
pub struct BenchServeArgs {
    /// The server's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub url: String,
    /// The model name to request (default: the first of /v1/models).
    #[arg(long)]
    pub model: Option<String>,
    /// Requests per run.
    #[arg(long, default_value_t = 200)]
    pub num_prompts: usize,
    /// Concurrency levels, one run each (the most requests in flight).
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    pub concurrency: Vec<usize>,
    /// Request rate in requests/s (Poisson arrivals); unlimited when absent.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 256)]
    pub input_len: usize,
    /// Generated tokens per request.
    #[arg(long, default_value_t = 128)]
    pub output_len: usize,
    /// Smallest random prompt token id.
    #[arg(long, default_value_t = 1000)]
    pub min_token_id: u32,
    /// Largest random prompt token id, exclusive (keep it inside the vocabulary).
    #[arg(long, default_value_t = 10000)]
    pub max_token_id: u32,
    /// Seed of the prompts and arrival times.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 600.0)]
    pub timeout: f64,
    /// Also write the reports as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// What one request measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestRecord {
    /// Whether it completed.
    pub ok: bool,
    /// Prompt tokens (from usage, or the prompt's length).
    pub prompt_tokens: usize,
    /// Output tokens (from usage, or the text chunks counted).
    pub output_tokens: usize,
    /// Time to first token, seconds.
    pub ttft: f64,
    /// Gaps between text chunks, seconds.
    pub itl: Vec<f64>,
    /// Send to last byte, seconds.
    pub e2e: f64,
    /// The error, for a failed request.
    pub error: Option<String>,
}

/// Mean, median and 99th percentile of one latency, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Stat {
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
}

impl Stat {
    /// The statistics of `seconds` (nearest-rank percentiles), in ms.
    pub fn of(seconds: &[f64]) -> Stat {
        if seconds.is_empty() {
            return Stat::default();
        }
        let mut v: Vec<f64> = seconds.iter().map(|s| s * 1e3).collect();
        v.sort_by(f64::total_cmp);
        let pct = |p: f64| v[((p / 100.0 * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Stat { mean: v.iter().sum::<f64>() / v.len() as f64, p50: pct(50.0), p99: pct(99.0) }
    }
}

/// The summary of one run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunReport {
    /// Concurrency limit.
    pub concurrency: usize,
    /// Request rate (requests/s), `None` for unlimited.
    pub rate: Option<f64>,
    /// Requests sent.
    pub requests: usize,
    /// Requests completed.
    pub completed: usize,
    /// First send to last finish, seconds.
    pub duration: f64,
    /// Prompt tokens of completed requests.
    pub prompt_tokens: usize,
    /// Output tokens of completed requests.
    pub output_tokens: usize,
    /// Time to first token.
    pub ttft: Stat,
    /// Time per output token (after the first).
    pub tpot: Stat,
    /// Inter-token latency.
    pub itl: Stat,
    /// End-to-end latency.
    pub e2e: Stat,
    /// The first error seen, if any.
    pub first_error: Option<String>,
}

impl RunReport {
    /// Summarizes `records` of a run that took `duration` seconds.
    pub fn new(concurrency: usize, rate: Option<f64>, records: &[RequestRecord], duration: f64) -> RunReport {
        let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.ok).collect();
        let ttft: Vec<f64> = ok.iter().map(|r| r.ttft).collect();
        let tpot: Vec<f64> = ok
            .iter()
            .filter(|r| r.output_tokens > 1)
            .map(|r| (r.e2e - r.ttft) / (r.output_tokens - 1) as f64)
            .collect();
        let itl: Vec<f64> = ok.iter().flat_map(|r| r.itl.iter().copied()).collect();
        let e2e: Vec<f64> = ok.iter().map(|r| r.e2e).collect();
        RunReport {
            concurrency,
            rate,
            requests: records.len(),
            completed: ok.len(),
            duration,
            prompt_tokens: ok.iter().map(|r| r.prompt_tokens).sum(),
            output_tokens: ok.iter().map(|r| r.output_tokens).sum(),
            ttft: Stat::of(&ttft),
            tpot: Stat::of(&tpot),
            itl: Stat::of(&itl),
            e2e: Stat::of(&e2e),
            first_error: records.iter().find_map(|r| r.error.clone()),
        }
    }

    /// Completed requests per second.
    pub fn request_throughput(&self) -> f64 {
        self.completed as f64 / self.duration.max(1e-9)
    }

    /// Output tokens per second.
    pub fn output_throughput(&self) -> f64 {
        self.output_tokens as f64 / self.duration.max(1e-9)
    }

    /// Prompt plus output tokens per second.
    pub fn total_throughput(&self) -> f64 {
        (self.prompt_tokens + self.output_tokens) as f64 / self.duration.max(1e-9)
    }

    /// The report as JSON.
    pub fn to_json(&self) -> Value {
        let stat = |s: &Stat| json!({"mean_ms": s.mean, "p50_ms": s.p50, "p99_ms": s.p99});
        json!({
            "concurrency": self.concurrency, "rate": self.rate, "requests": self.requests,
            "completed": self.completed, "duration_s": self.duration, "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens, "request_throughput": self.request_throughput(),
            "output_throughput": self.output_throughput(), "total_throughput": self.total_throughput(),
            "ttft": stat(&self.ttft), "tpot": stat(&self.tpot), "itl": stat(&self.itl), "e2e": stat(&self.e2e),
        })
    }
}

/// The table of `reports` (one row per run).
pub fn table(reports: &[RunReport]) -> String {
    let mut out = format!(
        "{:>5} {:>7} {:>9} {:>8} {:>7} {:>9} {:>9} | {:>8} {:>8} | {:>8} {:>8} | {:>8} {:>8} | {:>8}\n",
        "conc",
        "rate",
        "ok/sent",
        "time s",
        "req/s",
        "out tok/s",
        "tot tok/s",
        "TTFT p50",
        "p99",
        "TPOT p50",
        "p99",
        "ITL p50",
        "p99",
        "E2E p50"
    );
    for r in reports {
        let rate = r.rate.map_or("inf".to_string(), |x| format!("{x:.1}"));
        out.push_str(&format!(
            "{:>5} {:>7} {:>9} {:>8.2} {:>7.2} {:>9.1} {:>9.1} | {:>8.2} {:>8.2} | {:>8.2} {:>8.2} | {:>8.2} {:>8.2} | \
             {:>8.1}\n",
            r.concurrency,
            rate,
            format!("{}/{}", r.completed, r.requests),
            r.duration,
            r.request_throughput(),
            r.output_throughput(),
            r.total_throughput(),
            r.ttft.p50,
            r.ttft.p99,
            r.tpot.p50,
            r.tpot.p99,
            r.itl.p50,
            r.itl.p99,
            r.e2e.p50,
        ));
    }
    out.push_str("(latencies in ms)\n");
    out
}

/// The prompts of a run: `n` lists of `len` ids in `[lo, hi)`.
pub fn prompts(n: usize, len: usize, lo: u32, hi: u32, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = Rng::new(seed);
    let span = u64::from(hi.saturating_sub(lo).max(1));
    (0..n).map(|_| (0..len).map(|_| lo + (rng.next_u64() % span) as u32).collect()).collect()
}

fn usage(m: impl Into<String>) -> Error {
    Error::Usage(m.into())
}

/// Runs every concurrency level of `args` and prints the table; returns the reports.
pub fn run(args: &BenchServeArgs) -> Result<Vec<RunReport>> {
    if args.num_prompts == 0 || args.input_len == 0 || args.output_len == 0 {
        return Err(usage("--num-prompts, --input-len and --output-len must be at least 1"));
    }
    if args.concurrency.is_empty() || args.concurrency.contains(&0) {
        return Err(usage("--concurrency levels must be at least 1"));
    }
    if args.min_token_id >= args.max_token_id {
        return Err(usage("--min-token-id must be below --max-token-id"));
    }
    if args.rate.is_some_and(|r| !(r > 0.0 && r.is_finite())) {
        return Err(usage("--rate must be a positive number of requests per second"));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| usage(format!("cannot start the tokio runtime: {e}")))?;
    let reports = rt.block_on(bench(args))?;
    print!("{}", table(&reports));
    if let Some(path) = &args.json {
        let all: Vec<Value> = reports.iter().map(RunReport::to_json).collect();
        let text = serde_json::to_string_pretty(&json!({"url": args.url, "runs": all}))
            .map_err(|e| usage(format!("cannot encode the reports: {e}")))?;
        std::fs::write(path, text)
            .map_err(|source| Error::Io { path: path.display().to_string(), source })?;
    }
    Ok(reports)
}

/// The benchmark proper (inside a tokio runtime).
pub async fn bench(args: &BenchServeArgs) -> Result<Vec<RunReport>> {
    let base = args.url.trim_end_matches('/').to_string();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs_f64(args.timeout))
        .build()
        .map_err(|e| usage(format!("cannot build the HTTP client: {e}")))?;
    let model = match &args.model {
        Some(m) => m.clone(),
        None => first_model(&client, &base).await?,
    };
    println!(
        "# bench serve: {base}, model `{model}`, {} requests of {} prompt -> {} output tokens per run",
        args.num_prompts, args.input_len, args.output_len
    );
    let mut reports = Vec::new();
    for (k, &conc) in args.concurrency.iter().enumerate() {
        let seed = args.seed.wrapping_add(k as u64 * 0x1_0000);
        let ps = prompts(args.num_prompts, args.input_len, args.min_token_id, args.max_token_id, seed);
        reports.push(run_level(&client, &base, &model, args, ps, conc, seed).await);
        if let Some(e) = &reports.last().and_then(|r| r.first_error.clone()) {
            eprintln!("tessera: bench serve: concurrency {conc}: first error: {e}");
        }
    }
    Ok(reports)
}

/// The id of the first model the server lists.
async fn first_model(client: &reqwest::Client, base: &str) -> Result<String> {
    let url = format!("{base}/v1/models");
    let r = client.get(&url).send().await.map_err(|e| usage(format!("GET {url}: {e}")))?;
    let text = r.text().await.map_err(|e| usage(format!("GET {url}: {e}")))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| usage(format!("GET {url}: {e}: {text}")))?;
    v["data"][0]["id"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| usage(format!("GET {url}: no model in {text}")))
}

/// One run: all prompts at concurrency `conc` (and the rate, if any).
async fn run_level(
    client: &reqwest::Client,
    base: &str,
    model: &str,
    args: &BenchServeArgs,
    prompts: Vec<Vec<u32>>,
    conc: usize,
    seed: u64,
) -> RunReport {
    let slots = Arc::new(tokio::sync::Semaphore::new(conc));
    let mut rng = Rng::new(seed ^ 0xA11_0CA7E);
    let t0 = Instant::now();
    let mut tasks = Vec::with_capacity(prompts.len());
    for prompt in prompts {
        if let Some(rate) = args.rate {
            let gap = -rng.unit_nonzero().ln() / rate;
            tokio::time::sleep(Duration::from_secs_f64(gap)).await;
        }
        let Ok(permit) = slots.clone().acquire_owned().await else { break };
        let body = json!({
            "model": model, "prompt": prompt, "max_tokens": args.output_len, "temperature": 0,
            "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true},
        });
        let (client, url) = (client.clone(), format!("{base}/v1/completions"));
        tasks.push(tokio::spawn(async move {
            let r = one_request(&client, &url, body.to_string(), prompt.len()).await;
            drop(permit);
            r
        }));
    }
    let mut records = Vec::with_capacity(tasks.len());
    for t in tasks {
        records.push(
            t.await.unwrap_or_else(|e| RequestRecord { error: Some(e.to_string()), ..Default::default() }),
        );
    }
    RunReport::new(conc, args.rate, &records, t0.elapsed().as_secs_f64())
}

/// Sends one streaming request and times its chunks.
async fn one_request(client: &reqwest::Client, url: &str, body: String, prompt_len: usize) -> RequestRecord {
    let t0 = Instant::now();
    let mut rec = RequestRecord { prompt_tokens: prompt_len, ..Default::default() };
    let fail = |mut rec: RequestRecord, e: String| {
        rec.error = Some(e);
        rec
    };
    let mut resp = match client.post(url).header("content-type", "application/json").body(body).send().await {
        Ok(r) => r,
        Err(e) => return fail(rec, format!("POST {url}: {e}")),
    };
    if !resp.status().is_success() {
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        return fail(rec, format!("POST {url}: {status}: {text}"));
    }
    let mut buf: Vec<u8> = Vec::new();
    let mut last: Option<Instant> = None;
    let mut chunks = 0usize;
    let mut usage_tokens = None;
    let mut done = false;
    loop {
        let bytes = match resp.chunk().await {
            Ok(Some(b)) => b,
            Ok(None) => break,
            Err(e) => return fail(rec, format!("reading the stream: {e}")),
        };
        let now = Instant::now();
        buf.extend_from_slice(&bytes);
        while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buf.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event);
            let Some(data) = text.trim().strip_prefix("data:").map(str::trim) else { continue };
            if data == "[DONE]" {
                done = true;
                continue;
            }
            let Ok(v) = serde_json::from_str::<Value>(data) else {
                return fail(rec, format!("a stream event is not JSON: {data}"));
            };
            if let Some(e) = v.get("error") {
                return fail(rec, format!("the server reported: {e}"));
            }
            if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
                usage_tokens = Some(n as usize);
                if let Some(p) = v["usage"]["prompt_tokens"].as_u64() {
                    rec.prompt_tokens = p as usize;
                }
            }
            let has_text = v["choices"][0]["text"].as_str().is_some_and(|t| !t.is_empty())
                || v["choices"][0]["delta"]["content"].as_str().is_some_and(|t| !t.is_empty());
            if has_text {
                chunks += 1;
                match last {
                    None => rec.ttft = (now - t0).as_secs_f64(),
                    Some(t) => rec.itl.push((now - t).as_secs_f64()),
                }
                last = Some(now);
            }
        }
    }
    rec.e2e = t0.elapsed().as_secs_f64();
    if !done {
        return fail(rec, "the stream ended without data: [DONE]".into());
    }
    if last.is_none() {
        rec.ttft = rec.e2e;
    }
    rec.output_tokens = usage_tokens.unwrap_or(chunks);
    rec.ok = true;
    rec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_use_nearest_rank_percentiles() {
        let s = Stat::of(&(1..=100).map(|i| i as f64 / 1000.0).collect::<Vec<_>>());
        assert!((s.p50 - 50.0).abs() < 1e-9 && (s.p99 - 99.0).abs() < 1e-9 && (s.mean - 50.5).abs() < 1e-9);
        assert_eq!(Stat::of(&[]), Stat::default());
        let one = Stat::of(&[0.002]);
        assert_eq!((one.p50, one.p99), (2.0, 2.0));
    }

    #[test]
    fn reports_count_only_completed_requests() {
        let ok = RequestRecord {
            ok: true,
            prompt_tokens: 10,
            output_tokens: 5,
            ttft: 0.1,
            itl: vec![0.01; 4],
            e2e: 0.14,
            error: None,
        };
        let bad = RequestRecord { error: Some("boom".into()), ..Default::default() };
        let r = RunReport::new(4, None, &[ok.clone(), ok, bad], 2.0);
        assert_eq!((r.requests, r.completed, r.prompt_tokens, r.output_tokens), (3, 2, 20, 10));
        assert!((r.tpot.p50 - 10.0).abs() < 1e-9, "{:?}", r.tpot);
        assert!((r.request_throughput() - 1.0).abs() < 1e-12);
        assert!((r.total_throughput() - 15.0).abs() < 1e-12);
        assert_eq!(r.first_error.as_deref(), Some("boom"));
        assert!(table(&[r]).contains("2/3"));
        let p = prompts(3, 5, 10, 20, 1);
        assert_eq!(p.len(), 3);
        assert!(p.iter().all(|q| q.len() == 5 && q.iter().all(|&t| (10..20).contains(&t))));
        assert_ne!(p[0], p[1]);
    }
}
