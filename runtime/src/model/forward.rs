//! One forward step of a Llama over a varlen batch, made only of library
//! kernels, generic over the [`Device`] (CPU interpreter or GPU) and the
//! activation dtype `T`:
//!
//! ```text
//! h = embedding_q8_0(tokens)
//! per layer l:
//!     x    = l == 0 ? rmsnorm(h) : add_rmsnorm(down_{l-1}, h)     (h updated in place)
//!     qkv  = x @ Wqkv^T                                            (one fused product)
//!     q    = rope_kv_write(qkv) ; K, V written to the paged cache of layer l
//!     a    = flash_attention(q)      if some sequence has > 1 query token
//!          = paged_decode(q)         otherwise
//!     x    = add_rmsnorm(a @ Wo^T, h)
//!     down = silu(x @ Wg^T) * (x @ Wu^T)  @ Wd^T                  (fused SiLU-mul product)
//! logits = add_rmsnorm(down, h)[rows] @ Wlm^T                      (only the requested rows)
//! ```
//!
//! Steps of at most [`FUSED_MAX_TOKENS`] tokens (batch-1 decode) run the same
//! math with the norms and residual adds fused into the GEMVs
//! ([`kernels::dequant::fused`]), 6 launches per layer instead of 8:
//!
//! ```text
//! per layer l:
//!     qkv = rmsnorm(h) @ Wqkv^T          (norm in the GEMV prologue)
//!     rope_kv_write ; attention           (as above)
//!     h  += a @ Wo^T                      (residual in the GEMV epilogue)
//!     act = silu(x @ Wg^T) * (x @ Wu^T) with x = rmsnorm(h)
//!     h  += act @ Wd^T
//! logits = rmsnorm(h)[rows] @ Wlm^T      (norm in the LM head's prologue)
//! ```
//!
//! Products with few rows ([`kernels::dequant::uses_gemv`]: small decode
//! batches, by rows times weight rows) use the GEMV kernels, larger ones the
//! tensor-core GEMM kernels. Decode attention splits the context over several
//! programs (split-KV, then a merge kernel) when the batch alone would not
//! fill the device ([`kernels::decode_attention::split_plan`]).
//!
//! The launch sequence itself ([`launch_forward`]) reads every step input
//! from one device byte arena (see [`super::inputs`]) and writes the logits
//! to a scratch buffer: [`Model::forward`] stages and downloads around it,
//! [`Model::forward_sample`] (in [`super::sampler`]) samples on the device
//! after it, and [`super::graph`] captures the same sequence into CUDA graphs.
//!
//! # Inputs ([`Step`])
//!
//! Sequence `b` has `q_len_b = query_start[b + 1] - query_start[b]` new
//! tokens, which are the last `q_len_b` positions of its context of
//! `context_lens[b]` tokens: token `query_start[b] + i` sits at position
//! `context_lens[b] - q_len_b + i` (checked). Its K/V go to
//! `slot_mapping[t]` (`block * block_size + offset`, `-1` for none); earlier
//! positions must already be in the cache. `block_tables` is `[B,
//! max_blocks_per_seq]`. Every index is validated on the host before any
//! launch, so a bad step is an error, never an out-of-bounds access.
//!
//! # Invariants
//!
//! The KV cache of layer `l` is `[num_blocks, block_size, n_head_kv,
//! head_dim]` in `T` (the layout `rope_kv_write` writes and both attention
//! kernels read); the eager buffers grow to the largest step seen and are
//! reused (the interpreter cannot free buffers); buffers that a graph's
//! launches point to ([`Buffers::fixed`]) never move. Everything a launch
//! sequence bakes in (token count, sequence count, block-table stride, split
//! plan, logit rows) is in its [`Plan`] and [`Layout`].

use super::buffers::{Buffers, KvCache, KvCacheDtype};
use super::device::Device;
use super::graph::{GraphMode, GraphState};
use super::inputs::{Layout, Stager, StepArrays, stage_step};
use super::layers::launch_forward;
use super::mega::DecodePath;
use super::weights::Weights;
use crate::error::{Error, Result};
use crate::gguf::LlamaConfig;
use crate::model::ActElem;
use dsl_core::launch::Kernel;
use kernels::decode_attention::split_plan;
use kernels::kv_cache::cache_bytes;
use std::collections::BTreeMap;

/// The most tokens a step may have to take the fused decode path (norms in
/// the GEMV prologues, residual adds in the epilogues). At one row the fused
/// GEMVs save a launch and a round trip of the normed activations; at more
/// rows the norm prologue, recomputed by every program, raises the GEMV's
/// register use until the fused kernel is slower than the separate GEMV and
/// `add_rmsnorm` (see BENCHMARKS.md). Larger steps therefore keep the
/// separate norm kernels.
pub const FUSED_MAX_TOKENS: usize = 1;

/// Tokens per chunk of the decode-attention kernel (f32 caches), and the
/// granularity of decode split lengths.
pub(super) const DECODE_BLOCK_N: usize = 16;

/// Keys per block of the tensor-core decode kernel (bf16/f16 caches).
pub(super) const TC_BLOCK_N: usize = 64;

/// The inputs of one forward step (see the module doc).
#[derive(Clone, Copy, Debug)]
pub struct Step<'a> {
    /// Token ids, `[N]`.
    pub tokens: &'a [u32],
    /// Positions, `[N]`.
    pub positions: &'a [i32],
    /// Cache slots, `[N]` (`-1`: do not write).
    pub slot_mapping: &'a [i32],
    /// Block tables, `[B, max_blocks_per_seq]` row-major.
    pub block_tables: &'a [i32],
    /// Row stride of `block_tables`.
    pub max_blocks_per_seq: usize,
    /// Context lengths including the new tokens, `[B]`.
    pub context_lens: &'a [i32],
    /// Query offsets (`cu_seqlens_q`), `[B + 1]`, from 0 to `N`.
    pub query_start: &'a [i32],
    /// The token rows whose logits are returned, in this order.
    pub logit_rows: &'a [usize],
}

/// What a launch sequence bakes in besides buffer addresses: sizes, the
/// decode split plan and which rows reach the LM head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Plan {
    /// Tokens.
    pub n: usize,
    /// Sequences.
    pub b: usize,
    /// The longest query run (1: the decode kernels).
    pub max_q: usize,
    /// Decode split length (tokens per program, a multiple of
    /// [`DECODE_BLOCK_N`]) and split count (1: no split).
    pub split_len: usize,
    pub splits: usize,
    /// Final-norm runs `(first token row, first logit row, count)`.
    pub runs: Vec<(usize, usize, usize)>,
    /// Logit rows.
    pub rows: usize,
    /// The batch-invariant arrangement (see [`super::layers`]).
    pub invariant: bool,
    /// The step runs as one persistent kernel ([`super::mega`]).
    pub mega: bool,
    /// The persistent kernel also samples the step's rows (every row
    /// greedy, no penalties or grammar masks): no sampler launch follows.
    pub sample: bool,
    /// The longest context of the step (the persistent step's attention
    /// partials, [`Plan::parts`]).
    pub max_ctx: usize,
    /// Cached tokens of all sequences after the step (the profile's
    /// attention bytes).
    pub ctx_tokens: usize,
    /// Keys each query row attends to, summed over the rows (the profile's
    /// attention FLOPs).
    pub attended: usize,
}

/// Whether two rows of `step` are one sequence's: speculative verification
/// rows (`spec::split_verify_entries`), adjacent, with the same block-table
/// row (rows of different sequences never have the same one: each writes
/// its token to a block of its own). The persistent step must not run them:
/// where its attention tasks write the rows' keys and values (past two
/// rows, or with an FP8 cache) each writes its own token's while the other
/// rows' tasks read the cache, so a verification row would read its drafts'
/// entries while they are being written.
pub(super) fn rows_share_a_sequence(step: &Step<'_>) -> bool {
    let stride = step.max_blocks_per_seq;
    let rows = step.context_lens.len();
    stride > 0
        && step.block_tables.len() >= rows * stride
        && (1..rows).any(|i| {
            step.block_tables[(i - 1) * stride..i * stride] == step.block_tables[i * stride..(i + 1) * stride]
        })
}

/// Whether a decode step of `rows` rows (one token each, every row's
/// logits in row order; the graph path pads the step to `rows`) runs as
/// the persistent kernel: in the batch-invariant arrangement, at most
/// `mega_rows` rows (the model's limit for the persistent step), and no
/// two rows of one sequence ([`rows_share_a_sequence`]).
pub(super) fn runs_persistent(invariant: bool, rows: usize, mega_rows: usize, step: &Step<'_>) -> bool {
    invariant && rows <= mega_rows && !rows_share_a_sequence(step)
}

impl Plan {
    /// The plan of a validated step; decode steps split per
    /// [`split_plan`] for `sms` (or every `split_override` tokens) unless
    /// `invariant`.
    pub fn of(
        step: &Step<'_>,
        c: &LlamaConfig,
        sms: usize,
        split_override: Option<usize>,
        invariant: bool,
        mega_rows: usize,
    ) -> Plan {
        let max_q = step.query_start.windows(2).map(|w| (w[1] - w[0]) as usize).max().unwrap_or(0);
        let max_ctx = step.context_lens.iter().copied().max().unwrap_or(0).max(1) as usize;
        let b = step.context_lens.len();
        let (split_len, splits) = decode_split(b, c.n_head_kv, max_ctx, sms, split_override, invariant);
        Plan {
            n: step.tokens.len(),
            b,
            max_q,
            split_len,
            splits,
            runs: runs_of(step.logit_rows),
            rows: step.logit_rows.len(),
            invariant,
            mega: max_q == 1
                && step.logit_rows.iter().enumerate().all(|(i, &r)| r == i)
                && step.logit_rows.len() == step.tokens.len()
                && runs_persistent(invariant, step.tokens.len(), mega_rows, step),
            sample: false,
            max_ctx,
            ctx_tokens: step.context_lens.iter().map(|&c| c.max(0) as usize).sum(),
            attended: attended(step.query_start, step.context_lens),
        }
    }

    /// Split-KV partial rows the plan needs: the split decode's, or the
    /// persistent step's key-block partials.
    pub fn parts(&self, c: &LlamaConfig) -> usize {
        let split = if self.max_q <= 1 && self.splits > 1 { self.b * c.n_head * self.splits } else { 0 };
        let mega = if self.mega { mega_parts(self.n, c, self.max_ctx) } else { 0 };
        split.max(mega)
    }
}

/// The partial rows a persistent step of `m` rows needs for contexts of up
/// to `max_ctx` tokens (its attention's key blocks are at least
/// [`super::mega::MIN_ATT_BLOCK_N`] keys).
pub(super) fn mega_parts(m: usize, c: &LlamaConfig, max_ctx: usize) -> usize {
    kernels::decode_step::attention_parts(m, c.n_head, super::mega::MIN_ATT_BLOCK_N, max_ctx)
}

/// Keys attended to, summed over the query rows: a sequence of `ctx` cached
/// tokens whose last `q` are this step's queries attends causally, row `i`
/// of them to `ctx - q + 1 + i` keys.
fn attended(query_start: &[i32], context_lens: &[i32]) -> usize {
    query_start
        .windows(2)
        .zip(context_lens)
        .map(|(w, &ctx)| {
            let (q, ctx) = ((w[1] - w[0]).max(0) as usize, ctx.max(0) as usize);
            (q * ctx).saturating_sub(q * q.saturating_sub(1) / 2)
        })
        .sum()
}

/// The decode split `(split_len, splits)` for `b` sequences of at most
/// `max_ctx` tokens: never split when `invariant` (the batch-invariant
/// kernel folds its key blocks as it goes; only the persistent step
/// computes a row's blocks in several programs).
pub(super) fn decode_split(
    b: usize,
    h_kv: usize,
    max_ctx: usize,
    sms: usize,
    split_override: Option<usize>,
    invariant: bool,
) -> (usize, usize) {
    if invariant {
        // One split longer than any context: the bound only caps the keys.
        return (1 << 30, 1);
    }
    match split_override {
        Some(len) => {
            let len = len.div_ceil(DECODE_BLOCK_N).max(1) * DECODE_BLOCK_N;
            (len, max_ctx.max(1).div_ceil(len))
        }
        None => split_plan(b, h_kv, max_ctx, sms, DECODE_BLOCK_N),
    }
}

/// Consecutive runs of `rows` (token row `r + i` to logit row `j + i`).
pub(super) fn runs_of(rows: &[usize]) -> Vec<(usize, usize, usize)> {
    let mut runs: Vec<(usize, usize, usize)> = Vec::new();
    for (j, &r) in rows.iter().enumerate() {
        match runs.last_mut() {
            Some(last) if last.0 + last.2 == r => last.2 += 1,
            _ => runs.push((r, j, 1)),
        }
    }
    runs
}

/// A model on a device: weights, the paged KV cache of every layer and the
/// buffers of the forward pass (eager ones, and those of the decode graphs).
pub struct Model<D: Device, T: ActElem> {
    /// The weights.
    pub weights: Weights<D, T>,
    pub(super) kv: KvCache<D, T>,
    /// Buffers of steps run directly (they grow with the steps).
    pub(super) eager: Buffers<D, T>,
    /// Host staging of the step inputs (reused).
    pub(super) staging: Vec<u8>,
    /// Penalty token lists on the device (bytes) and their host staging.
    pub(super) pen_arena: Option<(D::Buf<u8>, usize)>,
    pub(super) pen_staging: Vec<u8>,
    /// How decode steps of [`Model::forward_sample`] run.
    pub(super) graph_mode: GraphMode,
    /// The decode graphs and their buffers (created on first use).
    pub(super) graphs: Option<GraphState<D, T>>,
    /// A fixed decode split length (tests), instead of the split plan.
    pub(super) split_override: Option<usize>,
    /// Where the last sampled step's logits are: `(graph buffers, rows)`.
    pub(super) last_sampled: Option<(bool, usize)>,
    /// Why graphs were turned off, if a capture failed.
    pub(super) graph_failure: Option<String>,
    /// The launches being recorded, while profiling.
    pub(super) profile: Option<Recording<D>>,
    /// Whether steps run the batch-invariant arrangement (the default).
    pub(super) invariant: bool,
    /// Which decode steps run as one persistent kernel.
    pub(super) decode_path: DecodePath,
    /// Why the persistent step cannot run here (`None`: it can).
    pub(super) mega_unsupported: Option<String>,
    /// Whether `auto` runs the persistent step (compiled devices).
    pub(super) mega_auto: bool,
    /// Steps launched as the persistent kernel (eager and captured).
    pub(super) mega_steps: usize,
    /// Of those, the steps that sampled their rows in the kernel.
    pub(super) mega_sampled: usize,
    /// The grammar masks on the device: `(rows, bitmasks, capacity in
    /// rows)`, grown as needed.
    pub(super) mask_bufs: super::sampler::MaskBufs<D>,
    /// Host time the last step spent computing grammar masks (zero without
    /// constrained rows).
    pub(super) last_mask_time: std::time::Duration,
    /// Where the host's time went in the last sampled step.
    pub(super) last_host_times: super::sampler::HostTimes,
}

/// What a launch reads and writes in device memory and computes, as the code
/// that launches it counts them (weights, activations, cache; not the
/// cache lines it re-reads): the profile's bytes and FLOPs.
#[derive(Clone, Debug, Default)]
pub struct Cost {
    /// The launch's role and shape (for example `linear 960x576`).
    pub what: String,
    /// Bytes moved.
    pub bytes: u64,
    /// Floating-point operations (a multiply-add is two).
    pub flops: u64,
}

/// One launch recorded while profiling, with its marks.
struct Timed<M> {
    kernel: &'static str,
    cost: Cost,
    start: M,
    end: M,
}

/// The launches recorded while profiling ([`Model::set_profiling`]).
pub struct Recording<D: Device> {
    launches: Vec<Timed<D::Mark>>,
    next: Option<Cost>,
    /// Per persistent step, its stage times ([`super::mega::StageTimes`]).
    pub(super) stages: Vec<super::mega::StageTimes>,
}

/// One launch of a profile: its kernel, cost and device time.
#[derive(Clone, Debug)]
pub struct LaunchTime {
    /// The kernel's name.
    pub kernel: &'static str,
    /// What the launch moved and computed.
    pub cost: Cost,
    /// Device milliseconds from before the launch to after it.
    pub ms: f64,
}

/// Launch counts and total milliseconds by kernel name.
pub fn by_kernel(launches: &[LaunchTime]) -> BTreeMap<&'static str, (usize, f64)> {
    let mut out = BTreeMap::<&'static str, (usize, f64)>::new();
    for l in launches {
        let e = out.entry(l.kernel).or_default();
        e.0 += 1;
        e.1 += l.ms;
    }
    out
}

/// A device plus the optional recording its launches are timed in.
pub(super) struct Launcher<'d, D: Device> {
    pub dev: &'d mut D,
    pub profile: &'d mut Option<Recording<D>>,
}

impl<D: Device> Launcher<'_, D> {
    /// Notes the cost of the next launch (`what` is built only while
    /// profiling).
    pub fn cost(&mut self, what: impl FnOnce() -> String, bytes: usize, flops: usize) {
        if let Some(p) = self.profile.as_mut() {
            p.next = Some(Cost { what: what(), bytes: bytes as u64, flops: flops as u64 });
        }
    }

    /// Launches `K`; while profiling, between two device marks, with the
    /// cost noted last.
    pub fn run<'a, K: Kernel>(
        &mut self,
        grid: [u32; 3],
        config: &K::Config,
        args: &K::Args<'a, D>,
    ) -> Result<()>
    where
        D: 'a,
    {
        let Launcher { dev, profile } = self;
        let Some(p) = profile.as_mut() else {
            return dev.run::<K>(grid, config, args);
        };
        let cost = p.next.take().unwrap_or_else(|| Cost { what: K::NAME.to_string(), ..Cost::default() });
        let start = dev.mark()?;
        dev.run::<K>(grid, config, args)?;
        let end = dev.mark()?;
        p.launches.push(Timed { kernel: K::NAME, cost, start, end });
        Ok(())
    }
}

pub(super) fn usage(msg: String) -> Error {
    Error::Usage(msg)
}

impl<D: Device, T: ActElem> Model<D, T> {
    /// A model over `weights` with a zeroed paged KV cache of `num_blocks`
    /// blocks of `block_size` tokens per layer.
    ///
    /// Errors: `block_size` not 16, 32 or 64 (the decode kernel's pages), an
    /// empty or too large cache (32-bit offsets), or a device error.
    pub fn new(
        dev: &mut D,
        weights: Weights<D, T>,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<Model<D, T>> {
        Model::with_kv_cache(dev, weights, num_blocks, block_size, KvCacheDtype::Auto)
    }

    /// [`Model::new`] with the KV cache in `kv_dtype`.
    ///
    /// Errors: those of [`Model::new`], and for an FP8 cache a head
    /// dimension that is not a multiple of 4 (its scales are f32 words).
    pub fn with_kv_cache(
        dev: &mut D,
        weights: Weights<D, T>,
        num_blocks: usize,
        block_size: usize,
        kv_dtype: KvCacheDtype,
    ) -> Result<Model<D, T>> {
        if ![16, 32, 64].contains(&block_size) {
            return Err(usage(format!("block size {block_size}: the decode kernel takes 16, 32 or 64")));
        }
        let c = &weights.config;
        let fp8 = kv_dtype == KvCacheDtype::Fp8;
        if fp8 && !c.head_dim.is_multiple_of(4) {
            return Err(usage(format!(
                "an FP8 KV cache needs a head dimension that is a multiple of 4, not {}",
                c.head_dim
            )));
        }
        // Elements (FP8: bytes) of a layer; the kernels' offsets are 32-bit.
        let per_layer = num_blocks
            .checked_mul(block_size)
            .filter(|&slots| slots > 0 && slots < 1 << 31)
            .and_then(|slots| {
                if fp8 {
                    Some(cache_bytes(slots, c.n_head_kv, c.head_dim))
                } else {
                    slots.checked_mul(c.n_head_kv * c.head_dim)
                }
            })
            .filter(|&n| n < 1 << 31)
            .ok_or_else(|| usage(format!("a KV cache of {num_blocks} blocks does not fit 32-bit offsets")))?;
        // An FP8 layer's bytes in elements of `T` (whole 128-byte groups
        // of slots, so it divides).
        let per_layer = if fp8 { per_layer / T::DEVICE_DTYPE.size_bytes() } else { per_layer };
        let total = per_layer
            .checked_mul(c.n_layers)
            .ok_or_else(|| usage(format!("a KV cache of {num_blocks} blocks per layer is too large")))?;
        let k = dev.zeros::<T>(total)?;
        let v = dev.zeros::<T>(total)?;
        Ok(Model {
            weights,
            kv: KvCache { k, v, layer_len: per_layer, num_blocks, block_size, fp8 },
            eager: Buffers::new(),
            staging: Vec::new(),
            pen_arena: None,
            pen_staging: Vec::new(),
            graph_mode: GraphMode::from_env(),
            graphs: None,
            split_override: None,
            last_sampled: None,
            graph_failure: None,
            profile: None,
            invariant: true,
            decode_path: DecodePath::default(),
            mega_unsupported: None,
            mega_auto: false,
            mega_steps: 0,
            mega_sampled: 0,
            mask_bufs: None,
            last_mask_time: std::time::Duration::ZERO,
            last_host_times: super::sampler::HostTimes::default(),
        }
        .with_mega_check(&*dev))
    }

    /// Starts (or, with `false`, stops) recording every launch between two
    /// device marks ([`Device::mark`]) with its cost. While recording, decode
    /// steps run their launches directly (graphs are neither captured nor
    /// replayed), so each kernel is timed on its own.
    pub fn set_profiling(&mut self, on: bool) {
        self.profile = on.then(|| Recording { launches: Vec::new(), next: None, stages: Vec::new() });
    }

    /// The stage times of the persistent steps recorded since the last call
    /// (or since profiling was turned on); empty when not profiling.
    pub fn take_mega_stages(&mut self) -> Vec<super::mega::StageTimes> {
        self.profile.as_mut().map(|p| std::mem::take(&mut p.stages)).unwrap_or_default()
    }

    /// The launches recorded since the last call (or since profiling was
    /// turned on) with their device times; empty when not profiling. Waits
    /// for the recorded work to finish.
    pub fn take_profile(&mut self, dev: &D) -> Result<Vec<LaunchTime>> {
        let Some(p) = self.profile.as_mut() else { return Ok(Vec::new()) };
        std::mem::take(&mut p.launches)
            .into_iter()
            .map(|t| Ok(LaunchTime { ms: dev.mark_ms(&t.start, &t.end)?, kernel: t.kernel, cost: t.cost }))
            .collect()
    }

    /// The paged cache's block size.
    pub fn block_size(&self) -> usize {
        self.kv.block_size
    }

    /// Blocks of the paged cache.
    pub fn num_blocks(&self) -> usize {
        self.kv.num_blocks
    }

    /// Turns the batch-invariant arrangement on (the default) or off (the
    /// fast path of `--no-batch-invariance`, see [`super::layers`]). Drops
    /// the decode graphs (captured for the other arrangement).
    pub fn set_batch_invariance(&mut self, on: bool) {
        if on != self.invariant {
            self.graphs = None;
        }
        self.invariant = on;
    }

    /// Whether steps run the batch-invariant arrangement.
    pub fn batch_invariance(&self) -> bool {
        self.invariant
    }

    /// Records whether the persistent step can run on `dev`.
    fn with_mega_check(mut self, dev: &D) -> Model<D, T> {
        self.mega_unsupported = super::mega::unsupported(dev, &self.weights, &self.kv);
        // `auto` takes the persistent step where it runs compiled; the
        // interpreter keeps the multi-kernel sequence unless asked.
        self.mega_auto = dev.compiles();
        self
    }

    /// Chooses which decode steps run as one persistent kernel (see
    /// [`super::mega`]). `Mega` where the persistent step cannot run here is
    /// an error naming why; drops the decode graphs (captured for the other
    /// path).
    pub fn set_decode_path(&mut self, path: DecodePath) -> Result<()> {
        if path == DecodePath::Mega
            && let Some(why) = &self.mega_unsupported
        {
            return Err(Error::Unsupported(format!("--decode-path mega: {why}")));
        }
        if path != self.decode_path {
            self.graphs = None;
        }
        self.decode_path = path;
        Ok(())
    }

    /// The decode path in use.
    pub fn decode_path(&self) -> DecodePath {
        self.decode_path
    }

    /// How many steps ran as the persistent kernel (a captured graph counts
    /// each replay).
    pub fn mega_steps(&self) -> usize {
        self.mega_steps
    }

    /// How many sampled steps the persistent kernel sampled itself
    /// ([`super::mega::samples_in_step`]; a replay counts as a step).
    pub fn mega_sampled_steps(&self) -> usize {
        self.mega_sampled
    }

    /// The most rows of a decode step that runs persistently (0: none).
    pub(super) fn mega_rows(&self) -> usize {
        match self.decode_path {
            _ if self.mega_unsupported.is_some() => 0,
            DecodePath::Auto if !self.mega_auto => 0,
            path => path.max_rows(),
        }
    }

    /// Uses a fixed decode split length of `len` tokens (rounded up to the
    /// decode chunk) instead of the split plan; `None` restores the plan. For
    /// tests of the split-KV path on small contexts. Drops the decode graphs
    /// and their buffers (sized for the split plan).
    pub fn set_split_override(&mut self, len: Option<usize>) {
        if len != self.split_override {
            self.graphs = None;
        }
        self.split_override = len;
    }

    /// Checks `step` against the model and the cache (see the module doc).
    pub(super) fn validate(&self, s: &Step<'_>) -> Result<()> {
        let c = &self.weights.config;
        let n = s.tokens.len();
        if n == 0 {
            return Err(usage("a step needs at least one token".into()));
        }
        if s.positions.len() != n || s.slot_mapping.len() != n {
            return Err(usage(format!(
                "{n} tokens but {} positions and {} slots",
                s.positions.len(),
                s.slot_mapping.len()
            )));
        }
        if let Some(t) = s.tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(usage(format!("token id {t} is outside the vocabulary of {}", c.vocab_size)));
        }
        let b = s.context_lens.len();
        if b == 0 || s.query_start.len() != b + 1 || s.query_start[0] != 0 || s.query_start[b] as usize != n {
            return Err(usage(format!(
                "query_start must run from 0 to {n} over {} sequences (got {:?})",
                b, s.query_start
            )));
        }
        let mbs = s.max_blocks_per_seq;
        if s.block_tables.len() != b * mbs {
            return Err(usage(format!(
                "block tables have {} entries, not {b} x {mbs}",
                s.block_tables.len()
            )));
        }
        let slots = self.kv.num_blocks * self.kv.block_size;
        if let Some(&bad) = s.slot_mapping.iter().find(|&&x| x < -1 || x >= slots as i32) {
            return Err(usage(format!("slot {bad} is outside the cache of {slots} slots")));
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(&dup) = s.slot_mapping.iter().find(|&&x| x >= 0 && !seen.insert(x)) {
            return Err(usage(format!("slot {dup} is written twice in one step")));
        }
        for i in 0..b {
            let (lo, hi) = (s.query_start[i], s.query_start[i + 1]);
            let ctx = s.context_lens[i];
            if hi <= lo || ctx < hi - lo {
                return Err(usage(format!("sequence {i}: {} query tokens, context {ctx}", hi - lo)));
            }
            let pages = (ctx as usize).div_ceil(self.kv.block_size);
            if pages > mbs {
                return Err(usage(format!(
                    "sequence {i}: context {ctx} needs {pages} blocks, the table has {mbs}"
                )));
            }
            for &blk in &s.block_tables[i * mbs..i * mbs + pages] {
                if blk < 0 || blk as usize >= self.kv.num_blocks {
                    return Err(usage(format!("sequence {i}: block {blk} is outside the cache")));
                }
            }
            for (j, t) in (lo..hi).enumerate() {
                let want = ctx - (hi - lo) + j as i32;
                if s.positions[t as usize] != want {
                    return Err(usage(format!(
                        "token {t} has position {}, but sequence {i}'s query token {j} sits at {want}",
                        s.positions[t as usize]
                    )));
                }
            }
        }
        if let Some(&r) = s.logit_rows.iter().find(|&&r| r >= n) {
            return Err(usage(format!("logit row {r} is not a token of this step ({n} tokens)")));
        }
        // The final norm updates the residual of each requested row in place.
        let mut rows = std::collections::HashSet::new();
        if let Some(&r) = s.logit_rows.iter().find(|&&r| !rows.insert(r)) {
            return Err(usage(format!("logit row {r} is requested twice")));
        }
        Ok(())
    }

    /// Stages a validated step into the eager buffers (sized for it, with
    /// sampling settings of `rows` rows when given) and returns its layout
    /// and plan. The sampling settings are staged by the caller through
    /// `stage_rows`, before the single copy.
    pub(super) fn stage_eager(
        &mut self,
        dev: &mut D,
        step: &Step<'_>,
        sample_rows: Option<usize>,
        stage_rows: impl FnOnce(&mut Stager<'_>, &Layout),
    ) -> Result<(Layout, Plan)> {
        let c = &self.weights.config;
        let plan = Plan::of(step, c, dev.sm_count(), self.split_override, self.invariant, self.mega_rows());
        self.mega_steps += usize::from(plan.mega);
        let b = step.context_lens.len();
        let lay = Layout::new(step.tokens.len(), b, step.max_blocks_per_seq, sample_rows);
        self.eager.ensure_arena(dev, lay.len)?;
        self.eager.ensure_scratch(dev, c, plan.n, plan.rows, plan.parts(c))?;
        let mut st = Stager::new(&mut self.staging, lay.copy_len(b));
        let arrays = StepArrays {
            tokens: step.tokens,
            positions: step.positions,
            slots: step.slot_mapping,
            ctx: step.context_lens,
            cu: step.query_start,
            tables: step.block_tables,
            src_stride: step.max_blocks_per_seq,
        };
        stage_step(&mut st, &lay, &arrays);
        stage_rows(&mut st, &lay);
        let arena =
            &self.eager.arena.as_ref().ok_or_else(|| usage("the input arena was not allocated".into()))?.0;
        dev.write(arena, st.bytes())?;
        Ok((lay, plan))
    }

    /// Runs one step and returns the f32 logits of `step.logit_rows`,
    /// `[rows, vocab]` row-major, writing the step's K/V into the cache.
    pub fn forward(&mut self, dev: &mut D, step: &Step<'_>) -> Result<Vec<f32>> {
        self.validate(step)?;
        let (lay, plan) = self.stage_eager(dev, step, None, |_, _| ())?;
        let Model { weights, kv, eager, profile, .. } = self;
        launch_forward(&mut Launcher { dev, profile }, weights, kv, eager, &lay, &plan)?;
        if plan.rows == 0 {
            return Ok(Vec::new());
        }
        let s = eager.scratch.as_ref().ok_or_else(|| usage("scratch buffers were not allocated".into()))?;
        dev.download_prefix(&s.logits, plan.rows * weights.config.vocab_size)
    }
}
