//! The persistent decode path: a whole decode step as one launch of
//! [`kernels::decode_step::decode_step`], which also samples the rows when
//! every one is greedy without penalties or grammar masks
//! ([`samples_in_step`]); otherwise the sampler kernels follow as usual.
//!
//! [`DecodePath`] says which steps take it: `mega` every decode step it
//! can run, `graphs` none (the multi-kernel sequence of [`super::layers`]),
//! `auto` the decode steps of at most [`AUTO_MAX_ROWS`] rows. A step can run
//! it when every sequence has one query token, there are at most
//! [`MAX_ROWS`] of them, every row reaches the LM head, the plan is batch
//! invariant, the device runs persistent kernels ([`Device::persistent`]),
//! and the model's matrices lie at fixed strides ([`Weights::stride`]).
//! The persistent step computes bit for bit what the batch-invariant
//! multi-kernel step computes (see the kernel's module doc), so switching
//! paths never changes a request's tokens.

use super::attention::{INVARIANT_DECODE_STAGES, invariant_decode_shape};
use super::buffers::{KvCache, SampleBufs, Scratch, out_stride};
use super::device::Device;
use super::forward::{Launcher, Plan, usage};
use super::inputs::Layout;
use super::layers::arena_i32;
use super::sampler::SampleRow;
#[cfg(doc)]
use super::sampler::SamplingParams;
use super::weights::{Kind, KindStride, Weights};
use crate::error::Result;
use crate::model::ActElem;
use dsl_core::half::f16;
use dsl_core::launch::AnyDType;
use kernels::decode_step::{
    MAX_ROWS, STAGES_PER_LAYER, STRIDE_ALIGN, TRACE_PHASES, decode_step, stage_counters, stage_words,
    trace_width,
};
use kernels::dequant::QuantFormat;
use std::marker::PhantomData;

/// Which decode steps run as one persistent kernel (`--decode-path`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DecodePath {
    /// Every decode step the persistent kernel can run.
    Mega,
    /// None: the multi-kernel launch sequence (captured into graphs).
    Graphs,
    /// The persistent kernel for decode steps of at most [`AUTO_MAX_ROWS`] rows.
    #[default]
    Auto,
}

impl std::str::FromStr for DecodePath {
    type Err = String;

    /// Parses `mega`, `graphs` or `auto`.
    fn from_str(s: &str) -> std::result::Result<DecodePath, String> {
        match s {
            "mega" => Ok(DecodePath::Mega),
            "graphs" => Ok(DecodePath::Graphs),
            "auto" => Ok(DecodePath::Auto),
            other => Err(format!("`{other}`: expected mega, graphs or auto")),
        }
    }
}

impl DecodePath {
    /// The path's name as `--decode-path` takes it.
    pub fn name(self) -> &'static str {
        match self {
            DecodePath::Mega => "mega",
            DecodePath::Graphs => "graphs",
            DecodePath::Auto => "auto",
        }
    }

    /// The most rows of a decode step this path runs persistently.
    pub fn max_rows(self) -> usize {
        match self {
            DecodePath::Mega => MAX_ROWS,
            DecodePath::Graphs => 0,
            DecodePath::Auto => AUTO_MAX_ROWS,
        }
    }
}

/// The decode steps `auto` runs persistently: at most this many rows, every
/// step the kernel takes. With each row's norm statistic computed once (by
/// a task of its own) rather than in every normed product task, the
/// persistent step beats the multi-kernel graphs at every batch of 1 to 16
/// rows on an H200 (BENCHMARKS.md).
pub const AUTO_MAX_ROWS: usize = MAX_ROWS;

/// The most rows whose products the persistent step stacks (all rows' K
/// tiles in one `dot` per output tile); steps of more rows split them.
pub const MAX_STACK_ROWS: usize = 4;

/// The activation rows the stacked products of a persistent step of `m`
/// rows hold ([`decode_step`]'s `STACK_ROWS`; 1 for one row): the next
/// power of two of `m` up to [`MAX_STACK_ROWS`], 0 past it (split products).
pub(crate) fn stack_rows(m: usize) -> usize {
    if m <= MAX_STACK_ROWS { m.max(1).next_power_of_two() } else { 0 }
}

/// Whether a step that runs as the persistent kernel (`mega`) samples its
/// rows in that kernel: every row greedy (the sampler kernel's test, see
/// [`SamplingParams::is_greedy`]), no penalties and no grammar masks
/// (those rewrite the logits between the forward pass and the sampler).
/// The kernel writes what the sampler kernel writes for such rows, bit
/// for bit, so the choice never changes a token or a logprob.
pub(crate) fn samples_in_step(mega: bool, penalties: bool, masked: bool, rows: &[SampleRow<'_>]) -> bool {
    mega && !penalties && !masked && rows.iter().all(|r| r.params.is_greedy())
}

/// The largest persistent grid (programs) the trace buffer holds rows for.
pub const MAX_PROGRAMS: usize = 1024;

/// The smallest key block of the batch-invariant decode attention
/// ([`invariant_decode_shape`]): the scratch holds the persistent step's
/// attention partials for blocks of this many keys, enough for any.
pub const MIN_ATT_BLOCK_N: usize = 32;

/// Where one persistent step's time went, from its clock readings
/// (microseconds; stage `j` of a layer runs from the end of the stage
/// before it, over all programs, to its own end).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct StageTimes {
    /// Programs in the grid.
    pub programs: usize,
    /// From the first program's start to the embedding's end.
    pub embedding: f64,
    /// Per stage of a layer (QKV, attention with RoPE and the KV write, O,
    /// gate/up, down), summed over the layers.
    pub layer: [f64; STAGES_PER_LAYER],
    /// Of [`StageTimes::layer`], the hand-over: from the stage before's end
    /// until the last of the stage's tasks left its wait (so the rest is
    /// the longest task's own time), summed over the layers.
    pub handover: [f64; STAGES_PER_LAYER],
    /// Of [`StageTimes::layer`], the task that ended the stage (the program
    /// with the latest end) in its phases, summed over the layers: from the
    /// stage before's end to its wait exit, its prologue (a product's norm
    /// statistic, an attention task's RoPE), its products (an attention
    /// task's key loop and store) and the rest (a product's epilogue; the
    /// release).
    pub last_task: [[f64; TRACE_PHASES]; STAGES_PER_LAYER],
    /// The LM head.
    pub lm_head: f64,
    /// Of [`StageTimes::lm_head`], its last program's last task in the
    /// phases of [`StageTimes::last_task`] (a program takes several head
    /// tasks: the wait runs to its last task's wait exit, so it holds the
    /// program's earlier tasks).
    pub lm_head_task: [f64; TRACE_PHASES],
    /// From the first program's start to the last program's exit.
    pub total: f64,
}

/// The names of [`StageTimes::layer`]'s stages.
pub const LAYER_STAGES: [&str; STAGES_PER_LAYER] =
    ["qkv", "rope + KV write + attention", "o + residual", "gate/up + SiLU", "down + residual"];

impl StageTimes {
    /// The times of a trace of `programs` rows of `n_layers` layers'
    /// entries (see `kernels::decode_step`'s `TRACE`), in nanoseconds.
    pub fn of(trace: &[i64], programs: usize, n_layers: usize) -> StageTimes {
        let n = stage_counters(n_layers);
        let rows: Vec<&[i64]> = trace.chunks_exact(trace_width(n_layers)).take(programs).collect();
        let end = |j: usize| rows.iter().map(|r| r[j]).max().unwrap_or(0);
        let start = rows.iter().map(|r| r[n - 1]).min().unwrap_or(0);
        // The latest wait exit of a stage; readings from before this launch
        // are those of programs that had no task in it.
        let left_wait = |j: usize, after: i64| {
            rows.iter().map(|r| r[n + j]).filter(|&x| x >= start).max().unwrap_or(after)
        };
        let us = |a: i64, b: i64| (b - a) as f64 / 1e3;
        // The phases of the task that ended stage `i` (the program with the
        // latest end), from `prev` to the stage's end `e`: its readings,
        // each clamped to lie between the one before and `e`.
        let phases = |i: usize, prev: i64, e: i64| {
            let mut out = [0.0; TRACE_PHASES];
            if let Some(r) = rows.iter().max_by_key(|r| r[i]) {
                let mut at = prev;
                for (k, v) in out.iter_mut().enumerate() {
                    let next = if k + 1 < TRACE_PHASES { r[(k + 1) * n + i].clamp(at, e) } else { e };
                    *v = us(at, next);
                    at = next;
                }
            }
            out
        };
        let mut t = StageTimes { programs, embedding: us(start, end(0)), ..StageTimes::default() };
        let mut prev = end(0);
        for l in 0..n_layers {
            for j in 0..STAGES_PER_LAYER {
                let i = 1 + STAGES_PER_LAYER * l + j;
                let e = end(i);
                t.layer[j] += us(prev, e);
                t.handover[j] += us(prev, left_wait(i, prev).clamp(prev, e));
                for (v, x) in t.last_task[j].iter_mut().zip(phases(i, prev, e)) {
                    *v += x;
                }
                prev = e;
            }
        }
        t.lm_head_task = phases(n - 2, prev, end(n - 2));
        t.lm_head = us(prev, end(n - 2));
        t.total = us(start, end(n - 2));
        t
    }
}

/// The persistent grid on the interpreter.
const INTERP_PROGRAMS: usize = 5;

/// Why this model cannot run the persistent step on `dev`, if it cannot.
pub(super) fn unsupported<D: Device, T: ActElem>(
    dev: &D,
    w: &Weights<D, T>,
    kv: &KvCache<D, T>,
) -> Option<String> {
    if !dev.persistent() {
        return Some(format!("{} does not run persistent kernels", dev.describe()));
    }
    if w.layers.iter().any(|l| !l.qkv_rest.is_empty()) {
        return Some(
            "its QKV tasks take one matrix per layer, and this model's Q, K and V differ in format".into(),
        );
    }
    // The step's products: stacked or split in the word-tiled formats,
    // split in the K-quants (the LM head only the former).
    let formats = w.layers.iter().flat_map(|l| [l.qkv.format, l.o.format, l.gate_up.format, l.down.format]);
    if let Some(f) = formats.filter(|f| !f.is_k_quant()).chain([w.lm_head.format]).find(|f| !f.gpu_kernels())
    {
        return Some(format!(
            "its product tasks take Q4_0, Q4_1, Q8_0 (Q5_0 as Q8_0), Q4_K, Q5_K and Q6_K matrices (the LM head one of the first three), not {}",
            f.name()
        ));
    }
    if w.embedding_format != QuantFormat::Q8_0 {
        return Some(format!("its embedding kernel takes Q8_0 tables, not {}", w.embedding_format.name()));
    }
    // The persistent step's RoPE is the plain one (adjacent pairs, no bias,
    // factors or head norm), and its projections assume n_head * head_dim =
    // n_embd.
    let c = &w.config;
    if !w.arch.plain(c) {
        return Some(format!(
            "the persistent step does not implement the {} architecture's RoPE step (NEOX pairs, QKV bias, Q/K norm or frequency factors)",
            c.arch.name
        ));
    }
    if c.n_embd_q() != c.n_embd {
        return Some(format!(
            "the persistent step needs n_head * head_dim = n_embd ({} != {})",
            c.n_embd_q(),
            c.n_embd
        ));
    }
    // The kernel indexes every buffer with 32-bit offsets, and its byte
    // pointers (the weight planes) make the launcher count every argument's
    // span in bytes: each buffer must stay under 2 GiB.
    const LIMIT: usize = 1 << 31;
    let layers = w.layers.len();
    for kind in Kind::ALL {
        match w.stride(kind) {
            None => {
                return Some(format!(
                    "the {kind:?} matrices differ in shape between layers or come in more than two formats"
                ));
            }
            Some(st) if st.qs * layers >= LIMIT || 2 * st.ss * layers >= LIMIT => {
                return Some(format!("the {kind:?} matrices of all layers exceed 2 GiB"));
            }
            // The kernel promises the compiler that every layer's planes
            // start on a 16-byte line (`STRIDE_ALIGN`), so its loads can be
            // vectors and its key loop pipelined.
            Some(st) if !st.qs.is_multiple_of(STRIDE_ALIGN) || !(2 * st.ss).is_multiple_of(STRIDE_ALIGN) => {
                return Some(format!("the {kind:?} matrices of a layer are not whole 16-byte lines"));
            }
            // The attention stage rotates Q and K itself unless the QKV
            // tiles do, which they do in the word-tiled formats only.
            Some(KindStride { formats: [a, b], .. })
                if kind == Kind::Qkv && a.gpu_kernels() != b.gpu_kernels() =>
            {
                return Some(format!("its QKV matrices mix {} and {} between layers", a.name(), b.name()));
            }
            _ => {}
        }
    }
    if !kv.layer_len.is_multiple_of(STRIDE_ALIGN) {
        return Some("a layer's KV cache is not a whole number of 16-element lines".into());
    }
    let kv_bytes = kv.layer_len * layers * T::DEVICE_DTYPE.size_bytes();
    if kv_bytes >= LIMIT {
        return Some(format!(
            "the KV cache ({:.2} GiB per K and V) exceeds the persistent kernel's 2 GiB (fewer --kv-blocks)",
            kv_bytes as f64 / (1u64 << 30) as f64
        ));
    }
    let head = w.lm_head.format.gguf_bytes(w.lm_head.n, w.lm_head.k);
    if head >= LIMIT || w.config.vocab_size * w.config.n_embd / 32 * 34 >= LIMIT {
        return Some("the LM head or the embedding exceeds 2 GiB".into());
    }
    None
}

/// The kernel's configuration for a model of shape `c` in `dtype` with
/// pages of `page` tokens: the attention's key block and tile height `att`,
/// the formats of the QKV, O, gate/up and down matrices (each kind's first
/// and second, see [`KindStride`]) and of the head, f16 tensor-core operands
/// (`f16`), the step's rows `m` (one row, or the rows its stacked products
/// hold, [`stack_rows`]), and the trace.
#[allow(clippy::too_many_arguments)]
pub(crate) fn step_config(
    dtype: dsl_core::DType,
    c: &crate::gguf::LlamaConfig,
    page: usize,
    att: (usize, usize),
    formats: [[QuantFormat; 2]; 4],
    f_head: QuantFormat,
    f16: bool,
    m: usize,
    trace: bool,
) -> decode_step::Config {
    let [[f_qkv, f_qkv2], [f_o, f_o2], [f_gu, f_gu2], [f_dn, f_dn2]] = formats;
    decode_step::Config::new(
        dtype,
        c.n_layers,
        c.n_embd,
        c.n_head,
        c.n_head_kv,
        c.head_dim,
        c.n_ff,
        page,
        att.0,
        att.1,
        f_qkv,
        f_o,
        f_gu,
        f_dn,
        f_head,
        f_qkv2,
        f_o2,
        f_gu2,
        f_dn2,
        f16,
        m == 1,
        stack_rows(m),
        trace,
        false,
        false,
    )
    .with_warps(4)
    .with_stages(INVARIANT_DECODE_STAGES)
}

/// Launches the persistent step for `plan` (a decode step the path takes,
/// see the module doc), leaving the logits in the scratch logits as the
/// multi-kernel step does, and with `sample` (a step of greedy rows, see
/// [`samples_in_step`]) the sampled rows in its outputs as the sampler
/// kernel leaves them.
/// `s` and `arena` are the step's scratch buffers and input arena.
#[allow(clippy::too_many_arguments)]
pub(super) fn launch<D: Device, T: ActElem>(
    ln: &mut Launcher<'_, D>,
    w: &Weights<D, T>,
    kv: &KvCache<D, T>,
    s: &Scratch<D, T>,
    arena: &D::Buf<u8>,
    lay: &Layout,
    plan: &Plan,
    sample: Option<&SampleBufs<D>>,
) -> Result<()> {
    let c = &w.config;
    let m = plan.n;
    if m == 0 || m > MAX_ROWS || plan.max_q != 1 || plan.runs != [(0, 0, m)] {
        return Err(usage(format!("internal error: the persistent step cannot run {plan:?}")));
    }
    let strides = |kind: Kind| {
        w.stride(kind).ok_or_else(|| usage(format!("internal error: {kind:?} matrices are not stacked")))
    };
    let [qkv, o, gu, dn] = Kind::ALL.map(strides);
    let (qkv, o, gu, dn) = (qkv?, o?, gu?, dn?);
    let dtype = T::DEVICE_DTYPE;
    let group = c.n_head / c.n_head_kv;
    // The multi-kernel decode attention's key block and tile height: the
    // same arithmetic needs the same warps too (checked here: the
    // persistent kernel runs four).
    let (att_block_n, att_rows, att_warps) =
        invariant_decode_shape(dtype, ln.dev.wgmma(), group, c.head_dim, kv.block_size);
    if att_warps != 4 && ln.dev.compiles() {
        return Err(usage(format!(
            "internal error: the invariant decode attention runs {att_warps} warps, not 4"
        )));
    }
    // Profiled steps read the clock at every stage's end.
    let trace = ln.profile.is_some();
    let formats = [qkv.formats, o.formats, gu.formats, dn.formats];
    let att = (att_block_n, att_rows);
    let config =
        step_config(dtype, c, kv.block_size, att, formats, w.lm_head.format, ln.dev.tensor_cores(), m, trace);
    let config = decode_step::Config { KV8: kv.fp8, SAMPLE: sample.is_some(), ..config };
    if s.mega_stage_len < stage_words(c.n_layers, c.n_head_kv, c.vocab_size) {
        return Err(usage("internal error: too few stage counters for the persistent step".into()));
    }
    // The attention's key-block partials: one row per row, query head and
    // block of the longest context.
    let need = kernels::decode_step::attention_parts(m, c.n_head, att_block_n, plan.max_ctx);
    if s.parts < need {
        return Err(usage(format!(
            "internal error: the persistent step needs {need} attention partial rows, the scratch holds {}",
            s.parts
        )));
    }
    // The sampled ids, logprobs and thresholds, as the sampler kernel of
    // `m` rows writes them (without sampling the kernel reads none: any
    // buffer will do).
    let (tok_out, logprob_out, thresh_out) = match sample {
        Some(sb) => {
            if sb.rows < m {
                return Err(usage(format!("internal error: sampling buffers of {} rows for {m}", sb.rows)));
            }
            let stride = out_stride(m);
            (
                D::ptr_at::<u8, i32>(&sb.out, 0)?,
                D::ptr_at::<u8, f32>(&sb.out, 4 * stride)?,
                D::ptr_at::<u8, f32>(&sb.out, 8 * stride)?,
            )
        }
        None => (
            D::ptr_at::<i32, i32>(&s.lin_cnt, 0)?,
            D::ptr_at::<f32, f32>(&s.logits, 0)?,
            D::ptr_at::<f32, f32>(&s.logits, 0)?,
        ),
    };
    let mat = |kind: Kind| w.mat(0, kind);
    let q8 = |kind: Kind| D::ptr_at::<u8, u8>(mat(kind).quants, 0);
    let sc = |kind: Kind| D::ptr_at::<f16, f16>(mat(kind).scales, 0);
    let args = decode_step::Args {
        emb_ptr: D::ptr_at::<u8, u8>(&w.embedding, 0)?,
        ids_ptr: arena_i32::<D>(arena, lay.tokens)?,
        pos_ptr: arena_i32::<D>(arena, lay.positions)?,
        slot_ptr: arena_i32::<D>(arena, lay.slots)?,
        tables_ptr: arena_i32::<D>(arena, lay.tables)?,
        ctx_ptr: arena_i32::<D>(arena, lay.ctx)?,
        qkv_q: q8(Kind::Qkv)?,
        qkv_s: sc(Kind::Qkv)?,
        o_q: q8(Kind::O)?,
        o_s: sc(Kind::O)?,
        gu_q: q8(Kind::GateUp)?,
        gu_s: sc(Kind::GateUp)?,
        dn_q: q8(Kind::Down)?,
        dn_s: sc(Kind::Down)?,
        head_q: D::ptr_at::<u8, u8>(&w.lm_head.quants, 0)?,
        head_s: D::ptr_at::<f16, f16>(&w.lm_head.scales, 0)?,
        alt_ptr: D::ptr_at::<i32, i32>(&w.layer_alt, 0)?,
        attn_norm: D::ptr_at::<T, AnyDType>(&w.attn_norm, 0)?,
        ffn_norm: D::ptr_at::<T, AnyDType>(&w.ffn_norm, 0)?,
        out_norm: D::ptr_at::<T, AnyDType>(&w.output_norm, 0)?,
        k_cache: D::ptr_at::<T, AnyDType>(&kv.k, 0)?,
        v_cache: D::ptr_at::<T, AnyDType>(&kv.v, 0)?,
        h_ptr: D::ptr_at::<T, AnyDType>(&s.h, 0)?,
        qkv_ptr: D::ptr_at::<T, AnyDType>(&s.qkv, 0)?,
        q_ptr: D::ptr_at::<T, AnyDType>(&s.q, 0)?,
        attn_ptr: D::ptr_at::<T, AnyDType>(&s.attn, 0)?,
        act_ptr: D::ptr_at::<T, AnyDType>(&s.act, 0)?,
        logits_ptr: D::ptr_at::<f32, f32>(&s.logits, 0)?,
        tok_out,
        logprob_out,
        thresh_out,
        ws_ptr: D::ptr_at::<f32, f32>(&s.lin_ws, 0)?,
        cnt_ptr: D::ptr_at::<i32, i32>(&s.lin_cnt, 0)?,
        stage_ptr: D::ptr_at::<i32, i32>(&s.mega_stage, 0)?,
        part_ptr: D::ptr_at::<f32, f32>(&s.part_o, 0)?,
        trace_ptr: D::ptr_at::<i64, i64>(&s.mega_trace, 0)?,
        m: m as i32,
        bt_stride: lay.bt_stride as i32,
        vocab: c.vocab_size as i32,
        qkv_qs: qkv.qs as i32,
        qkv_ss: qkv.ss as i32,
        o_qs: o.qs as i32,
        o_ss: o.ss as i32,
        gu_qs: gu.qs as i32,
        gu_ss: gu.ss as i32,
        dn_qs: dn.qs as i32,
        dn_ss: dn.ss as i32,
        kv_stride: kv.layer_len as i32,
        eps: c.rms_norm_eps,
        theta: c.rope_freq_base,
        scale: 1.0 / (c.head_dim as f32).sqrt(),
        _marker: PhantomData,
    };
    // Every program must be resident: as many as the GPU holds at once (the
    // launcher refuses larger waiting grids). The interpreter runs a few programs
    // interleaved, so its runs exercise the hand-overs between them.
    let programs = if ln.dev.compiles() {
        ln.dev.resident::<decode_step::Kernel>(&config, &args)?.max(1)
    } else {
        INTERP_PROGRAMS
    } as u32;
    // Each program's stacked products keep their K tiles' products in its
    // own slot of the workspace: no more programs than it has slots for.
    let srows = if ln.dev.tensor_cores() { stack_rows(m) } else { 0 };
    let slot = [0, 1]
        .map(|i| super::products::mega_stacked_slot(c, formats.map(|f| f[i]), srows))
        .into_iter()
        .max()
        .unwrap_or(0);
    let programs = s.lin_ws_len.checked_div(slot).map_or(programs, |fit| programs.min(fit.max(1) as u32));
    if trace {
        // The profile's bytes and FLOPs: every matrix once, the cached K/V.
        let mats = (0..c.n_layers)
            .flat_map(|l| Kind::ALL.map(|k| w.mat(l, k)))
            .chain(std::iter::once(w.lm_head.view()));
        let (bytes, elems) =
            mats.fold((0, 0), |(b, e), mt| (b + mt.format.gguf_bytes(mt.n, mt.k), e + mt.n * mt.k));
        let kv_bytes = plan.ctx_tokens * c.n_layers * c.n_head_kv * c.head_dim * 2 * dtype.size_bytes();
        ln.cost(|| format!("decode step (persistent) m{m}"), bytes + kv_bytes, 2 * m * elems);
    }
    if programs as usize > s.mega_trace_rows {
        return Err(usage(format!("internal error: a persistent grid of {programs} programs")));
    }
    ln.run::<decode_step::Kernel>([programs, 1, 1], &config, &args)?;
    if trace {
        // Profiling only (no graph is being captured): wait for the step
        // and keep its stage times.
        let n = programs as usize * trace_width(c.n_layers);
        let readings = ln.dev.download_prefix(&s.mega_trace, n)?;
        let times = StageTimes::of(&readings, programs as usize, c.n_layers);
        if let Some(p) = ln.profile.as_mut() {
            p.stages.push(times);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::tiny::synth_shape;
    use crate::model::sampler::SamplingParams;
    use codegen::{CompileOptions, Target};
    use dsl_core::DType;
    use dsl_core::launch::Kernel;

    #[test]
    fn decode_paths_parse_and_name_themselves() {
        for p in [DecodePath::Mega, DecodePath::Graphs, DecodePath::Auto] {
            assert_eq!(p.name().parse::<DecodePath>(), Ok(p));
        }
        let err = "megakernel".parse::<DecodePath>().unwrap_err();
        assert!(err.contains("expected mega, graphs or auto"), "{err}");
        assert_eq!((DecodePath::Graphs.max_rows(), DecodePath::Mega.max_rows()), (0, MAX_ROWS));
    }

    /// The persistent kernel samples a step's rows only when it runs the
    /// step and every row is greedy (zero temperature or top-k 1), with no
    /// penalties and no grammar masks: those rewrite the logits between the
    /// forward pass and the sampler, and a sampled row needs the sampler
    /// kernel's draw.
    #[test]
    fn only_plain_greedy_persistent_steps_sample_in_the_kernel() {
        let greedy = SamplingParams::default();
        let top1 = SamplingParams { temperature: 0.7, top_k: 1, ..SamplingParams::default() };
        let hot = SamplingParams { temperature: 0.7, seed: 3, ..SamplingParams::default() };
        let row = |p| SampleRow { params: p, step: 0, tokens: &[], prompt_len: 0 };
        let plain = [row(&greedy), row(&top1)];
        assert!(samples_in_step(true, false, false, &plain));
        assert!(samples_in_step(true, false, false, &[]));
        assert!(!samples_in_step(false, false, false, &plain));
        assert!(!samples_in_step(true, true, false, &plain));
        assert!(!samples_in_step(true, false, true, &plain));
        assert!(!samples_in_step(true, false, false, &[row(&greedy), row(&hot)]));
    }

    /// Every batch-invariant decode attention's key block is at least
    /// [`MIN_ATT_BLOCK_N`] keys, so the scratch's partials fit every step.
    #[test]
    fn attention_blocks_are_at_least_the_sized_block() {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for wgmma in [false, true] {
                for head_dim in [64, 128] {
                    for page in [16, 32, 64, 128, 256] {
                        let (block_n, _, _) = invariant_decode_shape(dtype, wgmma, 3, head_dim, page);
                        assert!(block_n >= MIN_ATT_BLOCK_N, "{dtype:?} {wgmma} {head_dim} {page}: {block_n}");
                    }
                }
            }
        }
    }

    /// Stage times are the latest end of each stage over the programs,
    /// measured from the previous stage's latest end; a stage's hand-over
    /// runs from there to the latest wait exit of its tasks; the stage's
    /// last task splits its time into phases.
    #[test]
    fn stage_times_take_the_latest_program() {
        let (n, width) = (stage_counters(2), trace_width(2));
        // A synthetic trace of two programs and two layers: each program
        // leaves stage `j` at `2000 + 1000 j` (program 1 a further 300 later)
        // and program 1 starts first; program 0's reading for layer 0's QKV
        // is then moved past program 1's, so that stage ends later and the
        // next one is shorter by as much.
        let mut trace = vec![0i64; 2 * width];
        for p in 0..2 {
            let row = &mut trace[p * width..][..width];
            row[n - 1] = 1_000 - 500 * p as i64;
            for (j, v) in row[..n - 1].iter_mut().enumerate() {
                *v = 2_000 + 1_000 * j as i64 + 300 * p as i64;
            }
        }
        trace[1] = 3_800;
        // Program `p` leaves each stage's wait 100 + 200 p after the stage
        // before ended, except that program 1 has no task in layer 1's down
        // stage (its entry keeps an earlier launch's reading).
        let ends: Vec<i64> = (0..n - 1).map(|j| trace[j].max(trace[width + j])).collect();
        for p in 0..2 {
            for i in 1..n - 1 {
                trace[p * width + n + i] = ends[i - 1] + 100 + 200 * p as i64;
            }
        }
        let down1 = 1 + STAGES_PER_LAYER + 4;
        trace[width + n + down1] = 400;
        // Every task's prologue ends 50 after its wait exit, its products
        // 100 later.
        for p in 0..2 {
            for i in 1..n - 1 {
                let w = trace[p * width + n + i];
                trace[p * width + 2 * n + i] = w + 50;
                trace[p * width + 3 * n + i] = w + 150;
            }
        }
        let t = StageTimes::of(&trace, 2, 2);
        assert_eq!(t.programs, 2);
        assert!((t.embedding - 1.8).abs() < 1e-9, "{t:?}");
        assert!((t.layer[0] - 2.5).abs() < 1e-9, "{t:?}");
        assert!((t.layer[1] - 1.5).abs() < 1e-9, "{t:?}");
        assert!(t.layer[2..].iter().all(|&x| (x - 2.0).abs() < 1e-9), "{t:?}");
        assert!((t.lm_head - 1.0).abs() < 1e-9 && (t.total - 12.8).abs() < 1e-9, "{t:?}");
        let sum: f64 = t.embedding + t.layer.iter().sum::<f64>() + t.lm_head;
        assert!((sum - t.total).abs() < 1e-9, "{t:?}");
        assert!(t.handover[..4].iter().all(|&x| (x - 0.6).abs() < 1e-9), "{t:?}");
        assert!((t.handover[4] - 0.4).abs() < 1e-9, "{t:?}");
        // The last task of each stage is program 1's, except layer 0's QKV
        // (program 0's); program 1's readings in layer 1's down stage are
        // from before the launch and count as nothing.
        let want = [
            [0.4, 0.1, 0.2, 1.8],
            [0.6, 0.1, 0.2, 0.6],
            [0.6, 0.1, 0.2, 1.1],
            [0.6, 0.1, 0.2, 1.1],
            [0.3, 0.05, 0.1, 1.55],
        ];
        // The head: program 1 ends it, its task as every other stage's.
        assert!(
            t.lm_head_task.iter().zip([0.3, 0.05, 0.1, 0.55]).all(|(a, b)| (a - b).abs() < 1e-9),
            "{t:?}"
        );
        for (j, w) in want.iter().enumerate() {
            assert!(t.last_task[j].iter().zip(w).all(|(a, b)| (a - b).abs() < 1e-9), "{j}: {t:?}");
            assert!((t.last_task[j].iter().sum::<f64>() - t.layer[j]).abs() < 1e-9, "{j}: {t:?}");
        }
    }

    /// The persistent step of SmolLM2's shape compiles for Hopper with the
    /// waits, releases, prefetches and clock reads it is built on, in at
    /// most 200 KB of shared memory.
    #[test]
    fn the_smollm2_step_compiles_for_hopper() {
        let c = synth_shape("smollm2-135m").unwrap();
        let (block_n, rows, warps) = invariant_decode_shape(DType::BF16, true, 3, 64, 16);
        assert_eq!(warps, 4);
        let q4 = QuantFormat::Q4_1;
        let config =
            step_config(DType::BF16, &c, 16, (block_n, rows), [[q4; 2]; 4], QuantFormat::Q8_0, true, 1, true);
        let func = decode_step::Kernel::build(&config).unwrap();
        let opts = CompileOptions::for_launch(Target::Sm90a, &decode_step::Kernel::launch_options(&config));
        let compiled = codegen::compile(&func, &opts).unwrap();
        for needle in
            ["ld.acquire.gpu", "fence.acq_rel.gpu", "nanosleep", "prefetch.global.L2", "%globaltimer"]
        {
            assert!(compiled.ptx.contains(needle), "no {needle} in the persistent step's PTX");
        }
        assert!(compiled.shared_bytes <= 200 * 1024, "{} bytes of shared memory", compiled.shared_bytes);
    }
}
