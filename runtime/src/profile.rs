//! `tessera profile`: where a step's time goes, kernel by kernel.
//!
//! For each decode batch size (`b` sequences with `context` cached tokens
//! each) and for one prefill of `prefill` tokens, the report gives:
//!
//! - the step total: the median wall time of a step as the engine runs it
//!   (CUDA graphs where they are used, scheduling and the sampled tokens'
//!   read-back included);
//! - per kernel and shape: launches per step, device time per step (each
//!   launch between two marks, [`Device::mark`]: CUDA events on the GPU),
//!   bytes moved and FLOPs as the launching code counts them
//!   ([`crate::model::Cost`]: weights, activations, cache), the achieved
//!   GB/s and TFLOP/s, the fraction of the measured ceiling and a class;
//! - the sum of the kernel times, the gap between it and the step total
//!   (launch latency, idle time between kernels, host work), the launches,
//!   the bytes and the MBU (bytes per step / step total / copy ceiling);
//! - for decode steps, the host's phases of a step as the engine runs it
//!   ([`HostPhases`]: scheduling, preparing the inputs, issuing the
//!   launches, waiting for the device and the read-back, recording the
//!   tokens; medians over the timed steps), so the part of the step total
//!   the device spends idle between steps is visible.
//!
//! The kernel times come from steps that run every launch directly (no
//! graph replay, no overlap with the next kernel), queued behind a few
//! milliseconds of copies on a GPU so that the marks time the kernels and
//! not the host's launch latency. Their sum can still exceed the step total
//! (the gap is then negative): inside a graph consecutive kernels overlap
//! their prologues and epilogues (programmatic dependent launch).
//!
//! Ceilings are measured in the same run: the copy ceiling is the `copy`
//! kernel over two buffers far larger than the caches; the matmul ceiling
//! (tensor-core devices only) is the library's bf16 matmul at 4096^3.
//!
//! Class: a kernel at half or more of the copy ceiling is `bandwidth`, at
//! half or more of the matmul ceiling `compute`, otherwise `latency` (it
//! waits on launches, dependencies or too little parallelism; `-` without a
//! cost).

use crate::app::{EngineTask, Session};
use crate::check::Rng;
use crate::engine::{Engine, Request, StepTimes};
use crate::error::{Error, Result};
use crate::grammar::{Constraint, GrammarCompiler, GrammarSpec};
use crate::model::ActElem;
use crate::model::mega::{LAYER_STAGES, StageTimes};
use crate::model::{Device, LaunchTime};
use dsl_core::DType;
use dsl_core::half::bf16;
use kernels::copy::copy;
use serde::Serialize;
use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::time::Instant;

/// What to profile.
#[derive(Clone, Debug)]
pub struct ProfileTask {
    /// Decode batch sizes.
    pub batches: Vec<usize>,
    /// Cached tokens per sequence when the decode steps are measured.
    pub context: usize,
    /// Prompt tokens of the profiled prefill (0: none).
    pub prefill: usize,
    /// Decode steps measured per batch size (each way).
    pub steps: usize,
    /// A constraint on every profiled request (structured output), if any:
    /// the report then gives the host's token-mask time per step.
    pub grammar: Option<GrammarSpec>,
}

impl ProfileTask {
    /// The longest sequence the task runs: the context, warm-up and both
    /// measured runs of decode steps, or the prefill and its one token.
    pub fn max_len(&self) -> usize {
        (self.context + WARMUP + 2 * self.steps + 1).max(self.prefill + 1)
    }
}

/// Decode steps run before measuring (graph capture, kernel compilation).
const WARMUP: usize = 3;

/// One kernel and shape of a section.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// The kernel's name.
    pub kernel: String,
    /// Its role and shape.
    pub what: String,
    /// Launches per step.
    pub launches: f64,
    /// Device milliseconds per step.
    pub ms: f64,
    /// Bytes moved per step.
    pub bytes: f64,
    /// FLOPs per step.
    pub flops: f64,
    /// Achieved GB/s.
    pub gbs: f64,
    /// Achieved TFLOP/s.
    pub tflops: f64,
    /// Fraction of the copy ceiling.
    pub of_copy: Option<f64>,
    /// Fraction of the matmul ceiling.
    pub of_matmul: Option<f64>,
    /// `bandwidth`, `compute`, `latency` or `-`.
    pub class: &'static str,
}

/// One measured situation: a decode batch size or a prefill.
#[derive(Clone, Debug, Serialize)]
pub struct Section {
    /// What ran, e.g. `decode bs8 ctx128`.
    pub name: String,
    /// Tokens a step computes.
    pub tokens_per_step: usize,
    /// Steps measured.
    pub steps: usize,
    /// Median wall milliseconds of a step as the engine runs it.
    pub step_ms: f64,
    /// Tokens per second at that step time.
    pub tokens_per_s: f64,
    /// Sum of the kernel times per step.
    pub kernel_ms: f64,
    /// `step_ms - kernel_ms`.
    pub gap_ms: f64,
    /// Launches per step.
    pub launches: f64,
    /// Bytes per step.
    pub bytes: f64,
    /// Bytes per step / step time / copy ceiling.
    pub mbu: Option<f64>,
    /// The kernels, longest first.
    pub rows: Vec<Row>,
    /// Where a persistent step's time went (decode steps of the persistent
    /// path): per stage, the median over the profiled steps.
    pub stages: Option<StageTimes>,
    /// With a constraint: the median host time per step advancing the
    /// rows' grammars by the previous step's tokens and computing their
    /// token masks (during the step's forward pass on the device).
    pub mask_ms: Option<f64>,
    /// Decode steps: where the host's time went, per phase the median over
    /// the timed steps.
    pub host: Option<HostPhases>,
}

/// The host's phases of a decode step as the engine runs it (medians over
/// the timed steps, in microseconds): what of the step total is host work
/// with the device idle, and what is waiting for the device.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct HostPhases {
    /// Drafting, scheduling, the step's arrays and sampling rows.
    pub schedule_us: f64,
    /// Checks, staging the inputs and settings and issuing their copy.
    pub prepare_us: f64,
    /// Issuing the launches (a graph replay; on the CPU backends, whose
    /// launches are synchronous, the computation itself).
    pub launch_us: f64,
    /// From the launches issued to the sampled tokens on the host: the
    /// device's time and the read-back.
    pub wait_us: f64,
    /// Recording the sampled tokens.
    pub accept_us: f64,
}

impl HostPhases {
    /// Per phase the median of `steps`.
    fn median_of(steps: &[StepTimes]) -> Option<HostPhases> {
        if steps.is_empty() {
            return None;
        }
        let med = |f: &dyn Fn(&StepTimes) -> std::time::Duration| {
            median(&mut steps.iter().map(|t| f(t).as_nanos() as f64 / 1e3).collect::<Vec<_>>())
        };
        Some(HostPhases {
            schedule_us: med(&|t| t.schedule),
            prepare_us: med(&|t| t.model.prepare),
            launch_us: med(&|t| t.model.launch),
            wait_us: med(&|t| t.model.wait),
            accept_us: med(&|t| t.accept),
        })
    }
}

/// The whole report.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The device.
    pub device: String,
    /// The activation dtype.
    pub dtype: String,
    /// Whether the steps ran the batch-invariant kernels.
    pub batch_invariance: bool,
    /// The measured copy ceiling in GB/s.
    pub copy_gbs: f64,
    /// The measured matmul ceiling in TFLOP/s (tensor-core devices).
    pub matmul_tflops: Option<f64>,
    /// The sections.
    pub sections: Vec<Section>,
}

impl EngineTask for ProfileTask {
    type Output = Report;

    fn run<D: Device, T: ActElem>(self, s: Session<'_, D, T>) -> Result<Report> {
        let Session { dev, engine: e, ctx } = s;
        if self.batches.is_empty() && self.prefill == 0 {
            return Err(Error::Usage("nothing to profile: give --batches or --prefill".into()));
        }
        if self.steps == 0 {
            return Err(Error::Usage("--steps must be at least 1".into()));
        }
        let bufs = CopyBufs::new(dev)?;
        let copy_gbs = bufs.ceiling(dev)?;
        let matmul_tflops = if dev.tensor_cores() { Some(matmul_ceiling(dev)?) } else { None };
        let ceilings = Ceilings { copy_gbs, matmul_tflops, bufs };
        let vocab = ctx.config.vocab_size;
        let constraint = match &self.grammar {
            Some(g) => Some(GrammarCompiler::new(&ctx.tokenizer, vocab)?.compile(g)?),
            None => None,
        };
        let mut sections = Vec::new();
        for (i, &b) in self.batches.iter().enumerate() {
            sections.push(self.decode(dev, e, &ceilings, b, vocab, i as u64, constraint.as_ref())?);
        }
        if self.prefill > 0 {
            sections.push(self.prefill_section(dev, e, &ceilings, vocab)?);
        }
        Ok(Report {
            device: ctx.device.clone(),
            dtype: format!("{}", T::DEVICE_DTYPE),
            batch_invariance: e.model().batch_invariance(),
            copy_gbs,
            matmul_tflops,
            sections,
        })
    }
}

/// The measured ceilings, and the copy buffers.
struct Ceilings<D: Device> {
    copy_gbs: f64,
    matmul_tflops: Option<f64>,
    bufs: CopyBufs<D>,
}

impl ProfileTask {
    /// Decode at batch `b`: prefill `b` prompts of `context` tokens, warm
    /// up, time `steps` steps as the engine runs them, then `steps` more with
    /// every launch timed. Every request carries `constraint` when given.
    #[allow(clippy::too_many_arguments)]
    fn decode<D: Device, T: ActElem>(
        &self,
        dev: &mut D,
        e: &mut Engine<D, T>,
        c: &Ceilings<D>,
        b: usize,
        vocab: usize,
        salt: u64,
        constraint: Option<&Constraint>,
    ) -> Result<Section> {
        let prompts = crate::bench::model::prompts(b, self.context.max(1), vocab, 0x5eed ^ salt);
        let max_tokens = WARMUP + 2 * self.steps + 1;
        for p in prompts {
            e.add(Request { constraint: constraint.cloned(), ..greedy(p, max_tokens) })?;
        }
        // Prefill (possibly in chunks), then the warm-up decode steps.
        let mut decoded = 0;
        while decoded < WARMUP {
            if !e.has_unfinished() {
                return Err(Error::Usage(format!(
                    "the {b} sequences never decoded together (too few KV blocks or --max-num-seqs?)"
                )));
            }
            let before = e.stats();
            e.step(dev)?;
            let after = e.stats();
            // Only steps where every sequence decodes count.
            if after.prefill_tokens == before.prefill_tokens
                && after.decode_tokens - before.decode_tokens == b as u64
            {
                decoded += 1;
            }
        }
        let mut walls = Vec::new();
        let mut masks = Vec::new();
        let mut host = Vec::new();
        for _ in 0..self.steps {
            let t = Instant::now();
            e.step(dev)?;
            walls.push(t.elapsed().as_secs_f64() * 1e3);
            masks.push(e.model().last_mask_time().as_secs_f64() * 1e3);
            host.push(e.last_step_times());
        }
        e.model_mut().set_profiling(true);
        let profiled = (0..self.steps)
            .map(|_| {
                c.bufs.stall(dev)?;
                e.step(dev).map(drop)
            })
            .collect::<Result<Vec<()>>>();
        let launches = e.model_mut().take_profile(dev);
        let stages = median_stages(e.model_mut().take_mega_stages());
        e.model_mut().set_profiling(false);
        profiled?;
        let launches = launches?;
        while e.has_unfinished() {
            e.step(dev)?;
        }
        e.take_completions();
        let name = format!("decode bs{b} ctx{}", self.context);
        let step_ms = median(&mut walls);
        let mask_ms = constraint.map(|_| median(&mut masks));
        let host = HostPhases::median_of(&host);
        Ok(Section { stages, mask_ms, host, ..section(name, b, self.steps, step_ms, &launches, c) })
    }

    /// One prompt of `prefill` tokens: its step timed as the engine runs it,
    /// then another prompt's with every launch timed.
    fn prefill_section<D: Device, T: ActElem>(
        &self,
        dev: &mut D,
        e: &mut Engine<D, T>,
        c: &Ceilings<D>,
        vocab: usize,
    ) -> Result<Section> {
        let prompts = crate::bench::model::prompts(3, self.prefill, vocab, 0x9f11);
        let mut run = |p: Vec<u32>, profile: bool| -> Result<(f64, Vec<LaunchTime>)> {
            e.add(greedy(p, 1))?;
            if profile {
                c.bufs.stall(dev)?;
            }
            e.model_mut().set_profiling(profile);
            let t = Instant::now();
            let mut steps = 0;
            let ran = (|| {
                while e.has_unfinished() {
                    e.step(dev)?;
                    steps += 1;
                }
                Ok::<_, Error>(())
            })();
            let wall = t.elapsed().as_secs_f64() * 1e3;
            let launches = e.model_mut().take_profile(dev);
            e.model_mut().set_profiling(false);
            ran?;
            e.take_completions();
            if steps != 1 {
                return Err(Error::Usage(format!(
                    "the {}-token prefill took {steps} steps: raise --max-num-batched-tokens",
                    self.prefill
                )));
            }
            Ok((wall, launches?))
        };
        let [warm, timed, profiled] = <[Vec<u32>; 3]>::try_from(prompts)
            .map_err(|_| Error::Usage("internal error: three prefill prompts".into()))?;
        run(warm, false)?;
        let (wall, _) = run(timed, false)?;
        let (_, launches) = run(profiled, true)?;
        Ok(section(format!("prefill {} tokens", self.prefill), self.prefill, 1, wall, &launches, c))
    }
}

/// A greedy request for `n` tokens that never stops early.
fn greedy(prompt: Vec<u32>, n: usize) -> Request {
    Request::greedy(prompt, n)
}

/// The median of `v` (sorted in place; NaN when empty).
fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A section from `steps` steps' `launches`.
fn section<D: Device>(
    name: String,
    tokens: usize,
    steps: usize,
    step_ms: f64,
    launches: &[LaunchTime],
    c: &Ceilings<D>,
) -> Section {
    let mut groups = BTreeMap::<(&str, &str), (usize, f64, u64, u64)>::new();
    for l in launches {
        let g = groups.entry((l.kernel, l.cost.what.as_str())).or_default();
        g.0 += 1;
        g.1 += l.ms;
        g.2 += l.cost.bytes;
        g.3 += l.cost.flops;
    }
    let per = steps.max(1) as f64;
    let mut rows: Vec<Row> = groups
        .into_iter()
        .map(|((kernel, what), (n, ms, bytes, flops))| {
            let (ms, bytes, flops) = (ms / per, bytes as f64 / per, flops as f64 / per);
            let gbs = if ms > 0.0 { bytes / ms / 1e6 } else { 0.0 };
            let tflops = if ms > 0.0 { flops / ms / 1e9 } else { 0.0 };
            let of_copy = (bytes > 0.0 && c.copy_gbs > 0.0).then(|| gbs / c.copy_gbs);
            let of_matmul = c.matmul_tflops.filter(|&m| flops > 0.0 && m > 0.0).map(|m| tflops / m);
            let class = classify(bytes > 0.0 || flops > 0.0, of_copy, of_matmul);
            Row {
                kernel: kernel.to_string(),
                what: what.to_string(),
                launches: n as f64 / per,
                ms,
                bytes,
                flops,
                gbs,
                tflops,
                of_copy,
                of_matmul,
                class,
            }
        })
        .collect();
    rows.sort_by(|a, b| b.ms.total_cmp(&a.ms));
    let kernel_ms: f64 = rows.iter().map(|r| r.ms).sum();
    let bytes: f64 = rows.iter().map(|r| r.bytes).sum();
    let mbu = (step_ms > 0.0 && c.copy_gbs > 0.0).then(|| bytes / step_ms / 1e6 / c.copy_gbs);
    Section {
        name,
        tokens_per_step: tokens,
        steps,
        step_ms,
        tokens_per_s: tokens as f64 / step_ms * 1e3,
        kernel_ms,
        gap_ms: step_ms - kernel_ms,
        launches: launches.len() as f64 / per,
        bytes,
        mbu,
        rows,
        stages: None,
        mask_ms: None,
        host: None,
    }
}

/// The median, field by field, of the stage times of several steps.
fn median_stages(mut v: Vec<StageTimes>) -> Option<StageTimes> {
    let first = v.first()?.clone();
    let med = |f: &dyn Fn(&StageTimes) -> f64| {
        let mut xs: Vec<f64> = v.iter().map(f).collect();
        median(&mut xs)
    };
    let mut t = StageTimes {
        programs: first.programs,
        embedding: med(&|s| s.embedding),
        lm_head: med(&|s| s.lm_head),
        total: med(&|s| s.total),
        ..StageTimes::default()
    };
    for j in 0..t.layer.len() {
        t.layer[j] = med(&|s| s.layer[j]);
        t.handover[j] = med(&|s| s.handover[j]);
        for k in 0..t.last_task[j].len() {
            t.last_task[j][k] = med(&|s| s.last_task[j][k]);
        }
    }
    for k in 0..t.lm_head_task.len() {
        t.lm_head_task[k] = med(&|s| s.lm_head_task[k]);
    }
    v.clear();
    Some(t)
}

/// The class of a kernel (see the module doc).
fn classify(costed: bool, of_copy: Option<f64>, of_matmul: Option<f64>) -> &'static str {
    if !costed {
        return "-";
    }
    let (bw, fl) = (of_copy.unwrap_or(0.0), of_matmul.unwrap_or(0.0));
    if fl >= 0.5 && fl >= bw {
        "compute"
    } else if bw >= 0.5 {
        "bandwidth"
    } else {
        "latency"
    }
}

/// The best of five runs of `f` between two marks, in milliseconds.
fn best_ms<D: Device>(dev: &mut D, mut f: impl FnMut(&mut D) -> Result<()>) -> Result<f64> {
    f(dev)?;
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let start = dev.mark()?;
        f(dev)?;
        let end = dev.mark()?;
        best = best.min(dev.mark_ms(&start, &end)?);
    }
    Ok(best)
}

/// Two f32 buffers of 1 GiB on a GPU, 128 MiB on a CPU (far larger than
/// the caches either way) and the `copy` between them: the copy ceiling,
/// and on a GPU the stall before each profiled step.
struct CopyBufs<D: Device> {
    x: D::Buf<f32>,
    out: D::Buf<f32>,
    n: usize,
}

impl<D: Device> CopyBufs<D> {
    fn new(dev: &mut D) -> Result<Self> {
        let n: usize = if dev.tensor_cores() { 1 << 28 } else { 1 << 25 };
        let x = Rng::new(5).values::<f32>(n, 1.0);
        Ok(CopyBufs { x: dev.upload(&x)?, out: dev.zeros::<f32>(n)?, n })
    }

    /// Enqueues one copy.
    fn copy(&self, dev: &mut D) -> Result<()> {
        let config = copy::Config::new(DType::F32, 1024);
        let args = copy::Args {
            x_ptr: D::ptr_at::<f32, dsl_core::launch::AnyDType>(&self.x, 0)?,
            out_ptr: D::ptr_at::<f32, dsl_core::launch::AnyDType>(&self.out, 0)?,
            n: self.n as i32,
            _marker: PhantomData,
        };
        dev.run::<copy::Kernel>([self.n.div_ceil(1024) as u32, 1, 1], &config, &args)
    }

    /// The copy ceiling in GB/s.
    fn ceiling(&self, dev: &mut D) -> Result<f64> {
        let ms = best_ms(dev, |d| self.copy(d))?;
        Ok(8.0 * self.n as f64 / ms / 1e6)
    }

    /// On a GPU, keeps it busy for a few milliseconds (copies), so the
    /// next step's launches are all queued before the first one starts and
    /// each launch's marks time the kernel alone, not the host's launch
    /// latency. Nothing on the CPU backends, whose launches are synchronous.
    fn stall(&self, dev: &mut D) -> Result<()> {
        if dev.tensor_cores() {
            for _ in 0..8 {
                self.copy(dev)?;
            }
        }
        Ok(())
    }
}

/// The matmul ceiling in TFLOP/s: the library's bf16 matmul at 4096^3 with
/// its own tiles for the device.
fn matmul_ceiling<D: Device>(dev: &mut D) -> Result<f64> {
    use kernels::matmul::{self, half_matmul};
    let s = 4096usize;
    let v = Rng::new(9).values::<bf16>(s * s, 1.0);
    let (a, b, out) = (dev.upload(&v)?, dev.upload(&v)?, dev.zeros::<bf16>(s * s)?);
    let t = matmul::config_for(s, s, dev.wgmma());
    let config = t.config(DType::BF16);
    let si = s as i32;
    let args = half_matmul::Args {
        a_ptr: D::ptr_at::<bf16, dsl_core::launch::AnyDType>(&a, 0)?,
        b_ptr: D::ptr_at::<bf16, dsl_core::launch::AnyDType>(&b, 0)?,
        c_ptr: D::ptr_at::<bf16, dsl_core::launch::AnyDType>(&out, 0)?,
        m: si,
        n: si,
        k: si,
        stride_am: si,
        stride_bk: si,
        stride_cm: si,
        _marker: PhantomData,
    };
    let grid = matmul::grid(s, s, &t);
    let ms = best_ms(dev, |d| d.run::<half_matmul::Kernel>(grid, &config, &args))?;
    Ok(2.0 * (s as f64).powi(3) / ms / 1e9)
}

/// The report as text tables.
pub fn table(r: &Report) -> String {
    let mut s = format!(
        "# {} | {} | batch invariance {} | copy ceiling {:.1} GB/s{}\n",
        r.device,
        r.dtype,
        if r.batch_invariance { "on" } else { "off" },
        r.copy_gbs,
        r.matmul_tflops.map(|m| format!(" | matmul ceiling {m:.1} TFLOP/s")).unwrap_or_default()
    );
    let pct = |f: Option<f64>| f.map(|f| format!("{:.1}%", 100.0 * f)).unwrap_or_else(|| "-".into());
    for sec in &r.sections {
        s.push_str(&format!(
            "\n## {}: step {:.3} ms ({:.0} tok/s), kernels {:.3} ms, gaps {:.3} ms, {:.0} launches, {:.2} MB, MBU {}\n",
            sec.name,
            sec.step_ms,
            sec.tokens_per_s,
            sec.kernel_ms,
            sec.gap_ms,
            sec.launches,
            sec.bytes / 1e6,
            pct(sec.mbu)
        ));
        let w = sec.rows.iter().map(|x| x.kernel.len() + x.what.len() + 3).max().unwrap_or(10).max(10);
        s.push_str(&format!(
            "{:<w$} | {:>8} | {:>9} | {:>8} | {:>9} | {:>8} | {:>7} | {:>7} | {}\n",
            "kernel (what)",
            "launches",
            "ms/step",
            "us/launch",
            "MB/step",
            "GB/s",
            "TFLOP/s",
            "of ceil",
            "class"
        ));
        s.push_str(&format!("{}\n", "-".repeat(w + 92)));
        if let Some(h) = &sec.host {
            s.push_str(&format!(
                "host per step (medians): schedule {:.1} us, prepare {:.1} us, launch {:.1} us, device and read-back {:.1} us, accept {:.1} us\n",
                h.schedule_us, h.prepare_us, h.launch_us, h.wait_us, h.accept_us
            ));
        }
        if let Some(m) = sec.mask_ms {
            s.push_str(&format!(
                "grammar advance + token masks (host, during the forward pass): {:.3} ms per step, {:.0}% of the step\n",
                m,
                100.0 * m / sec.step_ms.max(1e-12)
            ));
        }
        if let Some(t) = &sec.stages {
            s.push_str(&format!(
                "persistent step on {} programs: {:.1} us from the first start to the last exit\n",
                t.programs, t.total
            ));
            let mut line = |what: &str, us: f64, detail: String| {
                let share = 100.0 * us / t.total.max(1e-9);
                s.push_str(&format!("  {what:<28} {us:>9.1} us {share:>5.1}%{detail}\n"))
            };
            line("embedding", t.embedding, String::new());
            let phases = |[w, pro, prod, rest]: [f64; 4]| {
                format!("wait {w:.1}, prologue {pro:.1}, products {prod:.1}, rest {rest:.1}")
            };
            for (j, name) in LAYER_STAGES.iter().enumerate() {
                let detail =
                    format!("  (hand-over {:.1} us; last task: {})", t.handover[j], phases(t.last_task[j]));
                line(name, t.layer[j], detail);
            }
            line("lm head", t.lm_head, format!("  (last program: {})", phases(t.lm_head_task)));
        }
        for x in &sec.rows {
            let of = if x.class == "compute" { x.of_matmul } else { x.of_copy };
            s.push_str(&format!(
                "{:<w$} | {:>8.1} | {:>9.4} | {:>9.2} | {:>9.3} | {:>8.1} | {:>7.2} | {:>7} | {}\n",
                format!("{} ({})", x.kernel, x.what),
                x.launches,
                x.ms,
                if x.launches > 0.0 { 1e3 * x.ms / x.launches } else { 0.0 },
                x.bytes / 1e6,
                x.gbs,
                x.tflops,
                pct(of),
                x.class
            ));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Cost;

    fn launch(kernel: &'static str, what: &str, ms: f64, bytes: u64, flops: u64) -> LaunchTime {
        LaunchTime { kernel, cost: Cost { what: what.into(), bytes, flops }, ms }
    }

    #[test]
    fn host_phases_are_per_phase_medians() {
        use crate::engine::StepTimes;
        use crate::model::HostTimes;
        use std::time::Duration;
        let us = Duration::from_micros;
        let step = |k: u64| StepTimes {
            schedule: us(k),
            model: HostTimes { prepare: us(10 * k), launch: us(100 * k), wait: us(1000 * k) },
            accept: us(10_000 * k),
        };
        assert_eq!(HostPhases::median_of(&[]), None);
        let h = HostPhases::median_of(&[step(3), step(1), step(2)]).unwrap();
        assert_eq!(
            (h.schedule_us, h.prepare_us, h.launch_us, h.wait_us, h.accept_us),
            (2.0, 20.0, 200.0, 2000.0, 20_000.0)
        );
    }

    #[test]
    fn sections_group_launches_per_step_and_classify_them() {
        let mut cpu = dsl_core::interp::Cpu::new();
        let bufs = CopyBufs::<dsl_core::interp::Cpu> { x: cpu.zeros(1), out: cpu.zeros(1), n: 1 };
        let c = Ceilings { copy_gbs: 1000.0, matmul_tflops: Some(100.0), bufs };
        // Two steps: per step one 0.1 ms linear moving 80 MB (800 GB/s),
        // one 1 ms matmul of 80 TFLOP (80 TFLOP/s), one slow small norm,
        // one launch without a cost.
        let mut v = Vec::new();
        for _ in 0..2 {
            v.push(launch("linear", "qkv", 0.1, 80_000_000, 0));
            v.push(launch("mm", "big", 1.0, 1_000, 80_000_000_000));
            v.push(launch("rmsnorm", "r", 0.01, 1_000, 0));
            v.push(launch("x", "x", 0.001, 0, 0));
        }
        let s = section("t".into(), 4, 2, 2.0, &v, &c);
        assert_eq!(s.rows.len(), 4);
        assert_eq!(s.launches, 4.0);
        let row = |k: &str| s.rows.iter().find(|r| r.kernel == k).unwrap();
        assert_eq!(row("linear").class, "bandwidth");
        assert!((row("linear").gbs - 800.0).abs() < 1e-6, "{}", row("linear").gbs);
        assert_eq!(row("mm").class, "compute");
        assert!((row("mm").tflops - 80.0).abs() < 1e-6);
        assert_eq!(row("rmsnorm").class, "latency");
        assert_eq!(row("x").class, "-");
        assert_eq!(s.rows[0].kernel, "mm", "longest first");
        assert!((s.kernel_ms - 1.111).abs() < 1e-9);
        assert!((s.gap_ms - (2.0 - 1.111)).abs() < 1e-9);
        assert!((s.tokens_per_s - 2000.0).abs() < 1e-9);
        let text = table(&Report {
            device: "d".into(),
            dtype: "bf16".into(),
            batch_invariance: true,
            copy_gbs: 1000.0,
            matmul_tflops: Some(100.0),
            sections: vec![s],
        });
        assert!(text.contains("linear (qkv)") && text.contains("80.0%"), "{text}");
    }
}
