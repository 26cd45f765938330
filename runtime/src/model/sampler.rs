//! On-device sampling inside the step: [`Model::forward_sample`] runs the
//! forward pass and samples one token per logit row with the library kernels
//! of [`kernels::sampling`] (read its module doc for the exact math), so only
//! the sampled ids and their logprobs come back to the host.
//!
//! Per step, after the LM head (which writes f32 logits whatever the
//! activation dtype):
//!
//! ```text
//! penalties(logits, counts)                  (only when a row uses penalties)
//! apply_token_mask(logits, masks)            (only when a row is constrained)
//! ids, logprobs = sample(logits, settings)   (one program per row)
//! ```
//!
//! Settings are vLLM's ([`SamplingParams`]): temperature (greedy below
//! `1e-5`), top-k, top-p, min-p, repetition/presence/frequency penalties and
//! a seed; the Philox counter of a row is its request's generation step
//! ([`SampleRow::step`]), so a seeded request draws the same tokens whatever
//! batch it is in. Greedy rows return the argmax of the logits that
//! [`Model::forward`] returns (lowest index on ties).
//!
//! Penalties (the simplest correct scheme): for the rows that use them, the
//! prompt and output token counts are rebuilt on the device every step from
//! the request's tokens (zeroed count rows, then `token_counts_add` over the
//! prompt and over the output), so the host keeps no per-request device
//! state. Rows without penalties pay nothing: no counts, and when no row of
//! a step uses them the penalties kernel is not launched.
//!
//! Grammar masks (structured output, [`crate::grammar`]): with
//! [`Model::forward_sample_masked`], the host computes the bitmasks of the
//! constrained rows while the device runs the step's forward pass (the
//! launches are asynchronous; the masker runs right after them), uploads
//! them, and `apply_token_mask` sets the logits of disallowed tokens to
//! `-inf` after the penalties and before `sample`. Sampling and logprobs are
//! then those of the constrained distribution (the softmax over the allowed
//! tokens). Unconstrained rows are never touched, and a step without
//! constrained rows launches no mask kernel at all.
//!
//! Invariants: `rows[i]` samples logit row `step.logit_rows[i]`; settings
//! are validated on the host before any launch (errors, never panics); the
//! sampled ids and logprobs are read back with one copy, the step's only
//! synchronization.

use super::buffers::{Buffers, Counts, SampleBufs, out_stride};
use super::device::Device;
use super::forward::{Launcher, Model, Step, usage};
use super::inputs::{ALIGN, Layout, SamplingLayout, Stager, stage_sampling, uses_penalties};
use super::layers::{arena_i32, launch_forward};
use crate::error::{Error, Result};
use crate::model::ActElem;
use dsl_core::DType;
use dsl_core::launch::AnyDType;
use kernels::sampling::{self, apply_token_mask, penalties, sample, token_counts_add};
use std::marker::PhantomData;

/// Per-request sampling settings (vLLM semantics; defaults = greedy, no penalties).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; below `1e-5` (vLLM's epsilon) the row is greedy.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (`0` or `-1`: off; `1`: greedy).
    pub top_k: i32,
    /// Keep the smallest most-likely set whose mass reaches `top_p` (`1`: off).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one (`0`: off).
    pub min_p: f32,
    /// Divides positive (multiplies negative) logits of tokens seen in the
    /// prompt or the output (`1`: off).
    pub repetition_penalty: f32,
    /// Subtracted from the logits of tokens present in the output (`0`: off).
    pub presence_penalty: f32,
    /// Subtracted once per occurrence in the output (`0`: off).
    pub frequency_penalty: f32,
    /// The Philox key of the request's draws.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Checks every setting against vLLM's ranges: temperature finite and
    /// `>= 0`; `top_k >= -1`; `0 < top_p <= 1`; `0 <= min_p <= 1`;
    /// repetition penalty finite and `> 0`; presence and frequency penalties
    /// in `[-2, 2]`. NaN is rejected everywhere.
    ///
    /// Errors: [`Error::Usage`] naming the setting and its value.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str, v: &dyn std::fmt::Display, want: &str| {
            Err(Error::Usage(format!("sampling setting {what} = {v} is invalid: it must be {want}")))
        };
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad("temperature", &self.temperature, "a finite number >= 0 (0: greedy)");
        }
        if self.top_k < -1 {
            return bad("top_k", &self.top_k, ">= 1, or 0 or -1 to turn it off");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", &self.top_p, "in (0, 1] (1: off)");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", &self.min_p, "in [0, 1] (0: off)");
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return bad("repetition_penalty", &self.repetition_penalty, "a finite number > 0 (1: off)");
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) {
            return bad("presence_penalty", &self.presence_penalty, "in [-2, 2] (0: off)");
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return bad("frequency_penalty", &self.frequency_penalty, "in [-2, 2] (0: off)");
        }
        Ok(())
    }

    /// Whether rows with these settings return the argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature.is_nan() || self.temperature < sampling::MIN_TEMPERATURE || self.top_k == 1
    }
}

/// One logit row to sample: its settings, the generation step (number of
/// tokens this request has generated so far; the Philox counter), and the
/// request's tokens so far (prompt then output, for penalties).
#[derive(Clone, Copy, Debug)]
pub struct SampleRow<'a> {
    /// The request's settings.
    pub params: &'a SamplingParams,
    /// Tokens generated so far (the Philox counter of this draw).
    pub step: u32,
    /// Prompt then output tokens (only read when the row uses penalties).
    pub tokens: &'a [u32],
    /// How many of `tokens` are the prompt.
    pub prompt_len: usize,
}

/// A sampled token and its logprob (raw logits' log-softmax, as the kernel defines).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampled {
    /// The token id.
    pub token: u32,
    /// `log softmax(logits)[token]` of the logits the sampler saw (after
    /// penalties, before temperature and the filters).
    pub logprob: f32,
}

/// The grammar masks of one step's constrained rows, as a
/// [`Model::forward_sample_masked`] masker returns them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RowMasks {
    /// The masked rows (indices into the step's sample rows), each at most
    /// once.
    pub rows: Vec<u32>,
    /// Their bitmasks, [`crate::grammar::mask_words`]`(vocab)` words each in
    /// the order of `rows`: bit `t % 32` of word `t / 32` set when token `t`
    /// is allowed.
    pub bits: Vec<u32>,
}

/// Computes a step's grammar masks on the host (called once per step, after
/// the forward pass is launched and before the sampler).
pub type Masker<'a> = &'a mut dyn FnMut() -> Result<RowMasks>;

/// The grammar masks on the device: `(rows, bitmasks, capacity in rows)`.
pub(super) type MaskBufs<D> = Option<(<D as Device>::Buf<i32>, <D as Device>::Buf<i32>, usize)>;

/// Uploaded grammar masks: row indices and bitmasks (`n` rows of `words`).
pub(super) struct MaskView<'a, D: Device> {
    rows: &'a D::Buf<i32>,
    bits: &'a D::Buf<i32>,
    n: usize,
    words: usize,
}

/// Checks `m` against a step of `rows` sample rows over `vocab` tokens and
/// copies it into `bufs` (grown as needed); `None` when no row is masked.
pub(super) fn upload_masks<'a, D: Device>(
    dev: &mut D,
    bufs: &'a mut MaskBufs<D>,
    m: Option<&RowMasks>,
    rows: usize,
    vocab: usize,
) -> Result<Option<MaskView<'a, D>>> {
    let Some(m) = m.filter(|m| !m.rows.is_empty()) else { return Ok(None) };
    let words = crate::grammar::mask_words(vocab);
    let n = m.rows.len();
    if m.bits.len() != n * words {
        return Err(usage(format!("grammar masks: {} words for {n} rows of {words} words", m.bits.len())));
    }
    let mut seen = vec![false; rows];
    for &r in &m.rows {
        let r = r as usize;
        if r >= rows || std::mem::replace(&mut seen[r], true) {
            return Err(usage(format!(
                "grammar masks: row {r} is repeated or outside the step's {rows} rows"
            )));
        }
    }
    if bufs.as_ref().is_none_or(|b| b.2 < n) {
        let cap = rows.max(n).next_power_of_two();
        *bufs = None;
        *bufs = Some((dev.zeros::<i32>(cap)?, dev.zeros::<i32>(cap * words)?, cap));
    }
    let (rb, bb, _) = bufs.as_ref().ok_or_else(|| usage("internal error: no mask buffers".into()))?;
    let ids: Vec<i32> = m.rows.iter().map(|&r| r as i32).collect();
    let bits: Vec<i32> = m.bits.iter().map(|&w| w as i32).collect();
    dev.write(rb, &ids)?;
    dev.write(bb, &bits)?;
    Ok(Some(MaskView { rows: rb, bits: bb, n, words }))
}

/// Vocabulary entries per program of `apply_token_mask`.
const MASK_BLOCK: usize = 1024;
/// Vocabulary entries per program of the penalties kernel.
const PENALTY_BLOCK: usize = 1024;
/// Entries per program of `token_counts_add`.
const COUNT_BLOCK: usize = 128;

/// Checks `rows` against a step with `logit_rows` rows and a vocabulary of `vocab`.
pub(super) fn validate_rows(rows: &[SampleRow<'_>], logit_rows: usize, vocab: usize) -> Result<()> {
    if rows.len() != logit_rows {
        return Err(usage(format!(
            "{} sample rows were given for a step with {logit_rows} logit rows",
            rows.len()
        )));
    }
    for (i, r) in rows.iter().enumerate() {
        r.params.validate().map_err(|e| usage(format!("sample row {i}: {e}")))?;
        if r.prompt_len > r.tokens.len() {
            return Err(usage(format!(
                "sample row {i}: prompt length {} exceeds its {} tokens",
                r.prompt_len,
                r.tokens.len()
            )));
        }
        if uses_penalties(r)
            && let Some(t) = r.tokens.iter().find(|&&t| t as usize >= vocab)
        {
            return Err(usage(format!("sample row {i}: token {t} is outside the vocabulary of {vocab}")));
        }
    }
    Ok(())
}

/// Launches the sampler over the first `rows` logit rows of `bufs` (cast,
/// penalties when `penalties_on`, sample), reading settings at `sl` in the
/// arena. Issues only launches, so it can be captured into a graph.
pub(super) fn launch_sampling<D: Device, T: ActElem>(
    ln: &mut Launcher<'_, D>,
    vocab: usize,
    bufs: &Buffers<D, T>,
    sl: &SamplingLayout,
    rows: usize,
    penalties_on: bool,
    masks: Option<&MaskView<'_, D>>,
) -> Result<()> {
    let missing = |what: &str| usage(format!("the {what} buffers were not allocated"));
    let s = bufs.scratch.as_ref().ok_or_else(|| missing("scratch"))?;
    let sb = bufs.sample.as_ref().ok_or_else(|| missing("sampling"))?;
    let arena = &bufs.arena.as_ref().ok_or_else(|| missing("input"))?.0;
    let counts =
        if penalties_on { Some(bufs.counts.as_ref().ok_or_else(|| missing("penalty count"))?) } else { None };
    launch_sampler(ln, vocab, &s.logits, sb, counts, arena, sl, rows, masks)
}

/// The sampler's launches on explicit buffers: on the f32 `logits` `[rows,
/// vocab]`, the penalties kernel when `counts` is given and the grammar
/// masks when given (both rewrite the logits in place), then `sample` into
/// `sb`'s outputs.
#[allow(clippy::too_many_arguments)]
fn launch_sampler<D: Device>(
    ln: &mut Launcher<'_, D>,
    vocab: usize,
    logits_buf: &D::Buf<f32>,
    sb: &SampleBufs<D>,
    counts: Option<&Counts<D>>,
    arena: &D::Buf<u8>,
    sl: &SamplingLayout,
    rows: usize,
    masks: Option<&MaskView<'_, D>>,
) -> Result<()> {
    let n = rows * vocab;
    let logits = D::ptr_at::<f32, f32>(logits_buf, 0)?;
    let f32_at = |off: usize| D::ptr_at::<u8, f32>(arena, off);
    if let Some(c) = counts {
        let config = penalties::Config::new(PENALTY_BLOCK);
        let args = penalties::Args {
            logits_ptr: logits,
            slot_ptr: arena_i32::<D>(arena, sl.pen_slot)?,
            prompt_ptr: D::ptr_at::<i32, i32>(&c.prompt, 0)?,
            output_ptr: D::ptr_at::<i32, i32>(&c.output, 0)?,
            repetition_ptr: f32_at(sl.repetition)?,
            presence_ptr: f32_at(sl.presence)?,
            frequency_ptr: f32_at(sl.frequency)?,
            vocab: vocab as i32,
            stride: vocab as i32,
            _marker: PhantomData,
        };
        let grid = [rows as u32, vocab.div_ceil(PENALTY_BLOCK) as u32, 1];
        // The logits read and written, two count rows read.
        ln.cost(|| format!("penalties {rows} rows"), 4 * rows * vocab * 4, 0);
        ln.run::<penalties::Kernel>(grid, &config, &args)?;
    }
    if let Some(m) = masks {
        let config = apply_token_mask::Config::new(MASK_BLOCK);
        let args = apply_token_mask::Args {
            logits_ptr: logits,
            rows_ptr: D::ptr_at::<i32, i32>(m.rows, 0)?,
            mask_ptr: D::ptr_at::<i32, i32>(m.bits, 0)?,
            vocab: vocab as i32,
            stride: vocab as i32,
            words: m.words as i32,
            _marker: PhantomData,
        };
        let grid = [m.n as u32, vocab.div_ceil(MASK_BLOCK) as u32, 1];
        // The mask words read, the masked logits written (at most).
        ln.cost(|| format!("token mask {} rows", m.n), m.n * (m.words * 4 + vocab * 4), 0);
        ln.run::<apply_token_mask::Kernel>(grid, &config, &args)?;
    }
    let block = sampling::block_for(vocab);
    let config = sample::Config::new(DType::F32, block).with_warps(sampling::warps_for(block));
    let stride = out_stride(rows);
    let args = sample::Args {
        logits_ptr: D::ptr_at::<f32, AnyDType>(logits_buf, 0)?,
        ws_ptr: D::ptr_at::<f32, f32>(&sb.ws, 0)?,
        temperature_ptr: f32_at(sl.temperature)?,
        top_k_ptr: arena_i32::<D>(arena, sl.top_k)?,
        top_p_ptr: f32_at(sl.top_p)?,
        min_p_ptr: f32_at(sl.min_p)?,
        seed_ptr: D::ptr_at::<u8, i64>(arena, sl.seed)?,
        step_ptr: arena_i32::<D>(arena, sl.step)?,
        ids_ptr: D::ptr_at::<u8, i32>(&sb.out, 0)?,
        logprobs_ptr: D::ptr_at::<u8, f32>(&sb.out, 4 * stride)?,
        thresh_ptr: D::ptr_at::<u8, f32>(&sb.out, 8 * stride)?,
        vocab: vocab as i32,
        stride: vocab as i32,
        _marker: PhantomData,
    };
    // The logits read, the filtered row written to the workspace.
    ln.cost(|| format!("sample {rows} rows"), n * (4 + 4), 0);
    ln.run::<sample::Kernel>([rows as u32, 1, 1], &config, &args)
}

/// Samples `rows` rows of `logits` (`[rows.len(), vocab]` f32) on `dev` with
/// the same launches as [`Model::forward_sample`] (penalties included), in
/// fresh buffers: for checks (the GPU against the interpreter on the same
/// logits) and for sampling logits computed elsewhere.
///
/// Errors: invalid settings or sizes ([`Error::Usage`]), a device error.
pub fn sample_logits<D: Device>(
    dev: &mut D,
    logits: &[f32],
    vocab: usize,
    rows: &[SampleRow<'_>],
) -> Result<Vec<Sampled>> {
    if vocab == 0 || logits.len() != rows.len() * vocab {
        return Err(usage(format!(
            "{} logits are not {} rows of a vocabulary of {vocab}",
            logits.len(),
            rows.len()
        )));
    }
    validate_rows(rows, rows.len(), vocab)?;
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let r = rows.len();
    let lay = Layout::new(1, 1, 1, Some(r));
    let sl = lay.sampling.ok_or_else(|| usage("internal error: no sampling layout".into()))?;
    let mut staging = Vec::new();
    let mut st = Stager::new(&mut staging, lay.len);
    let pen = stage_sampling(&mut st, &sl, rows, 0);
    let arena = dev.zeros::<u8>(lay.len)?;
    dev.write(&arena, st.bytes())?;
    let logits_buf = dev.upload(logits)?;
    let sb = SampleBufs::<D> { rows: r, ws: dev.zeros(r * vocab)?, out: dev.zeros(12 * out_stride(r))? };
    let counts = if pen > 0 {
        Some(Counts::<D> { rows: pen, prompt: dev.zeros(pen * vocab)?, output: dev.zeros(pen * vocab)? })
    } else {
        None
    };
    let mut profile = None;
    let ln = &mut Launcher { dev, profile: &mut profile };
    if let Some(c) = &counts {
        let (mut pen_arena, mut pen_staging) = (None, Vec::new());
        build_counts(ln, &mut pen_arena, &mut pen_staging, c, rows, vocab)?;
    }
    launch_sampler::<D>(ln, vocab, &logits_buf, &sb, counts.as_ref(), &arena, &sl, r, None)?;
    read_out(ln.dev, &sb, r, r)
}

/// Rebuilds the penalty counts of the rows of `rows` that use penalties
/// (their count rows are their order among those rows, as
/// [`stage_sampling`] numbers them): zeroes the rows, then adds the prompt
/// and output tokens with `token_counts_add`. Runs eagerly (copies and
/// launches whose sizes vary per step), before the forward pass.
pub(super) fn build_counts<D: Device>(
    ln: &mut Launcher<'_, D>,
    pen_arena: &mut Option<(D::Buf<u8>, usize)>,
    staging: &mut Vec<u8>,
    counts: &Counts<D>,
    rows: &[SampleRow<'_>],
    vocab: usize,
) -> Result<()> {
    let pen: Vec<&SampleRow<'_>> = rows.iter().filter(|r| uses_penalties(r)).collect();
    if pen.is_empty() {
        return Ok(());
    }
    if pen.len() > counts.rows {
        return Err(usage(format!(
            "internal error: {} rows use penalties but the count buffers hold {}",
            pen.len(),
            counts.rows
        )));
    }
    let n_prompt: usize = pen.iter().map(|r| r.prompt_len).sum();
    let n_output: usize = pen.iter().map(|r| r.tokens.len() - r.prompt_len).sum();
    let arr = |n: usize| (4 * n).div_ceil(ALIGN) * ALIGN;
    let (ps, pi, os, oi) = (0, arr(n_prompt), 2 * arr(n_prompt), 2 * arr(n_prompt) + arr(n_output));
    let len = (2 * arr(n_prompt) + 2 * arr(n_output)).max(ALIGN);
    let mut st = Stager::new(staging, len);
    let (mut p, mut o) = (0, 0);
    for (j, r) in pen.iter().enumerate() {
        for (k, &t) in r.tokens.iter().enumerate() {
            if k < r.prompt_len {
                st.i32(ps, p, j as i32);
                st.i32(pi, p, t as i32);
                p += 1;
            } else {
                st.i32(os, o, j as i32);
                st.i32(oi, o, t as i32);
                o += 1;
            }
        }
    }
    if pen_arena.as_ref().is_none_or(|a| a.1 < len) {
        *pen_arena = None;
        let cap = len.next_power_of_two().max(4096);
        *pen_arena = Some((ln.dev.zeros::<u8>(cap)?, cap));
    }
    let arena = &pen_arena.as_ref().ok_or_else(|| usage("the penalty arena was not allocated".into()))?.0;
    ln.dev.write(arena, st.bytes())?;
    ln.dev.fill_zero(&counts.prompt, 0, pen.len() * vocab)?;
    ln.dev.fill_zero(&counts.output, 0, pen.len() * vocab)?;
    for (buf, slots, ids, n) in [(&counts.prompt, ps, pi, n_prompt), (&counts.output, os, oi, n_output)] {
        if n == 0 {
            continue;
        }
        let config = token_counts_add::Config::new(COUNT_BLOCK);
        let args = token_counts_add::Args {
            counts_ptr: D::ptr_at::<i32, i32>(buf, 0)?,
            slot_ptr: arena_i32::<D>(arena, slots)?,
            ids_ptr: arena_i32::<D>(arena, ids)?,
            n: n as i32,
            vocab: vocab as i32,
            _marker: PhantomData,
        };
        ln.cost(|| format!("token counts {n} ids"), 16 * n, 0);
        ln.run::<token_counts_add::Kernel>([n.div_ceil(COUNT_BLOCK) as u32, 1, 1], &config, &args)?;
    }
    Ok(())
}

/// Reads the first `rows` sampled ids and logprobs of `bufs` (one copy; waits
/// for the step).
pub(super) fn read_sampled<D: Device, T: ActElem>(
    dev: &D,
    bufs: &Buffers<D, T>,
    launched: usize,
    rows: usize,
) -> Result<Vec<Sampled>> {
    let sb = bufs.sample.as_ref().ok_or_else(|| usage("the sampling buffers were not allocated".into()))?;
    read_out(dev, sb, launched, rows)
}

/// Reads the first `rows` sampled ids and logprobs of `sb`, written by a
/// sampler launch over `launched >= rows` rows (whose output arrays are
/// [`out_stride`]`(launched)` entries apart: a padded decode step's bucket,
/// not its real rows).
fn read_out<D: Device>(dev: &D, sb: &SampleBufs<D>, launched: usize, rows: usize) -> Result<Vec<Sampled>> {
    if rows > launched {
        return Err(usage(format!("internal error: reading {rows} sampled rows of {launched}")));
    }
    let stride = out_stride(launched);
    let bytes = dev.download_prefix(&sb.out, 8 * stride)?;
    let word = |at: usize| -> [u8; 4] { [bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]] };
    (0..rows)
        .map(|i| {
            let id = i32::from_le_bytes(word(4 * i));
            let logprob = f32::from_le_bytes(word(4 * (stride + i)));
            let token = u32::try_from(id)
                .map_err(|_| usage(format!("internal error: the sampler returned token {id} for row {i}")))?;
            Ok(Sampled { token, logprob })
        })
        .collect()
}

/// Where the host's time went in a sampled step ([`Model::last_host_times`]),
/// phases one after the other from the call to its return.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostTimes {
    /// Checking the step and its rows, staging its inputs and settings and
    /// issuing their copy to the device.
    pub prepare: std::time::Duration,
    /// Issuing the launches: a graph replay, or each kernel (the penalty
    /// counts' included).
    pub launch: std::time::Duration,
    /// From the launches issued to the sampled tokens on the host: the
    /// device's time, the read-back and, on a step with grammar masks, the
    /// masks computed meanwhile and the sampler launched after them.
    pub wait: std::time::Duration,
}

impl<D: Device, T: ActElem> Model<D, T> {
    /// Runs the step and samples one token per `step.logit_rows` entry
    /// (rows.len() must equal it), on the device; only the ids/logprobs come
    /// back to the host.
    ///
    /// Decode steps (one token per sequence, logit rows `0..B` in order, at
    /// most 64 sequences) run padded to a batch-size bucket through CUDA
    /// graphs when the mode allows ([`Model::set_graph_mode`]); other steps run
    /// their launches directly.
    ///
    /// Errors: an invalid step or settings ([`Error::Usage`]), a device error.
    pub fn forward_sample(
        &mut self,
        dev: &mut D,
        step: &Step<'_>,
        rows: &[SampleRow<'_>],
    ) -> Result<Vec<Sampled>> {
        self.forward_sample_masked(dev, step, rows, None)
    }

    /// [`Model::forward_sample`] with grammar masks: `masker` (when given)
    /// runs on the host after the forward pass is launched, while the device
    /// computes it, and its masks are applied before sampling (see the
    /// module doc). Its time is [`Model::last_mask_time`].
    ///
    /// Errors: as [`Model::forward_sample`], the masker's errors, masks
    /// that do not fit the step.
    pub fn forward_sample_masked(
        &mut self,
        dev: &mut D,
        step: &Step<'_>,
        rows: &[SampleRow<'_>],
        masker: Option<Masker<'_>>,
    ) -> Result<Vec<Sampled>> {
        let start = std::time::Instant::now();
        let mut masker = masker;
        self.last_mask_time = std::time::Duration::ZERO;
        self.last_host_times = HostTimes::default();
        self.validate(step)?;
        let vocab = self.weights.config.vocab_size;
        validate_rows(rows, step.logit_rows.len(), vocab)?;
        self.last_sampled = None;
        if rows.is_empty() {
            self.forward(dev, step)?;
            return Ok(Vec::new());
        }
        if let Some(out) = self.graph_step(dev, step, rows, &mut masker, start)? {
            return Ok(out);
        }
        let mut pen = 0;
        let (lay, mut plan) = self.stage_eager(dev, step, Some(rows.len()), |st, lay| {
            if let Some(sl) = &lay.sampling {
                pen = stage_sampling(st, sl, rows, 0);
            }
        })?;
        plan.sample = super::mega::samples_in_step(plan.mega, pen > 0, masker.is_some(), rows);
        self.mega_sampled += usize::from(plan.sample);
        let sl = lay.sampling.ok_or_else(|| usage("internal error: no sampling layout".into()))?;
        self.eager.ensure_sample(dev, vocab, rows.len())?;
        if pen > 0 {
            self.eager.ensure_counts(dev, vocab, pen)?;
        }
        let Model {
            weights,
            kv,
            eager,
            profile,
            pen_arena,
            pen_staging,
            mask_bufs,
            last_mask_time,
            last_host_times,
            ..
        } = self;
        let staged = std::time::Instant::now();
        let ln = &mut Launcher { dev, profile };
        if let Some(counts) = eager.counts.as_ref().filter(|_| pen > 0) {
            build_counts(ln, pen_arena, pen_staging, counts, rows, vocab)?;
        }
        launch_forward(ln, weights, kv, eager, &lay, &plan)?;
        let launched = std::time::Instant::now();
        // The forward pass is launched: the host computes the masks while
        // the device runs it.
        let t = std::time::Instant::now();
        let m = masker.as_mut().map(|f| f()).transpose()?;
        *last_mask_time = t.elapsed();
        let dm = upload_masks(ln.dev, mask_bufs, m.as_ref(), rows.len(), vocab)?;
        if !plan.sample {
            launch_sampling(ln, vocab, eager, &sl, rows.len(), pen > 0, dm.as_ref())?;
        }
        let out = read_sampled(ln.dev, eager, rows.len(), rows.len())?;
        *last_host_times =
            HostTimes { prepare: staged - start, launch: launched - staged, wait: launched.elapsed() };
        self.last_sampled = Some((false, rows.len()));
        Ok(out)
    }

    /// Host time the last [`Model::forward_sample_masked`] spent in its
    /// masker (the engine's grammar advance and masks; zero without one).
    pub fn last_mask_time(&self) -> std::time::Duration {
        self.last_mask_time
    }

    /// Where the host's time went in the last [`Model::forward_sample_masked`]
    /// that sampled rows (all zero before the first, or after a failed one).
    pub fn last_host_times(&self) -> HostTimes {
        self.last_host_times
    }

    /// The f32 logits the sampler read in the last [`Model::forward_sample`]
    /// (`[rows, vocab]`, after penalties), for checks and debugging.
    ///
    /// Errors: no step was sampled since the last one without rows.
    pub fn last_logits(&self, dev: &D) -> Result<Vec<f32>> {
        let (graph, rows) = self.last_sampled.ok_or_else(|| usage("no step has been sampled yet".into()))?;
        let bufs = if graph {
            &self.graphs.as_ref().ok_or_else(|| usage("the graph buffers are gone".into()))?.bufs
        } else {
            &self.eager
        };
        let n = rows * self.weights.config.vocab_size;
        let s =
            bufs.scratch.as_ref().ok_or_else(|| usage("the scratch buffers were not allocated".into()))?;
        dev.download_prefix(&s.logits, n)
    }
}
