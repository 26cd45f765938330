//! The device buffers of the forward pass and of on-device sampling:
//! activations ([`Scratch`]), sampling workspace and outputs
//! ([`SampleBufs`]), penalty token counts ([`Counts`]) and the step-input
//! arena, grouped per launch sequence in [`Buffers`]; and the paged KV cache
//! ([`KvCache`]).
//!
//! Invariants: eager buffer sets grow to the largest step seen (the old
//! buffers are dropped first; on the GPU a drop waits for queued work);
//! fixed sets ([`Buffers::fixed`], the decode graphs') allocate each buffer
//! once, at the size first asked for (their final size), and a request
//! beyond it is an error, never a reallocation, because captured graphs
//! point into them.

use super::device::Device;
use crate::error::{Error, Result};
use crate::gguf::LlamaConfig;
use crate::model::ActElem;

/// Activation buffers, sized for `tokens` rows, `rows` logit rows and `parts`
/// split-KV partial rows.
pub(super) struct Scratch<D: Device, T: ActElem> {
    /// Token capacity.
    pub tokens: usize,
    /// Logit-row capacity.
    pub rows: usize,
    /// Split-KV partial-row capacity (`B * n_head * splits`).
    pub parts: usize,
    /// The residual stream, `[tokens, n_embd]`.
    pub h: D::Buf<T>,
    /// Normed activations, `[tokens, n_embd]`.
    pub normed: D::Buf<T>,
    /// Projection outputs added to the residual, `[tokens, n_embd]`.
    pub tmp: D::Buf<T>,
    /// Fused QKV, `[tokens, (n_head + 2 n_head_kv) * head_dim]`.
    pub qkv: D::Buf<T>,
    /// Queries after RoPE, `[tokens, n_head * head_dim]`.
    pub q: D::Buf<T>,
    /// Attention outputs, `[tokens, n_head * head_dim]`.
    pub attn: D::Buf<T>,
    /// SiLU(gate) * up, `[tokens, n_ff]`.
    pub act: D::Buf<T>,
    /// Final-normed logit rows, `[rows, n_embd]`.
    pub last: D::Buf<T>,
    /// Logits, `[rows, vocab]`, in f32 whatever `T` is: the LM head stores
    /// its f32 sums unrounded, so the sampler's argmax and logprobs see no
    /// ties a 16-bit rounding would make.
    pub logits: D::Buf<f32>,
    /// Split-KV partial outputs, `[parts, head_dim]` (and the persistent
    /// step's key-block partials, `[parts, head_dim + 2]`).
    pub part_o: D::Buf<f32>,
    /// Split-KV partial maxima, `[parts]`.
    pub part_m: D::Buf<f32>,
    /// Split-KV partial sums, `[parts]`.
    pub part_l: D::Buf<f32>,
    /// The split batch-invariant products' K-tile products (see
    /// `kernels::dequant::linear::split_finish`), enough for any product of
    /// the model.
    pub lin_ws: D::Buf<f32>,
    /// Their per-output-tile counters (zero between launches).
    pub lin_cnt: D::Buf<i32>,
    /// Entries of `lin_ws` and `lin_cnt`.
    pub lin_ws_len: usize,
    pub lin_cnt_len: usize,
    /// The persistent step's stage counters and key-block counts (zero
    /// between launches) and its rows' norm statistics
    /// ([`kernels::decode_step::stage_words`]).
    pub mega_stage: D::Buf<i32>,
    pub mega_stage_len: usize,
    /// The persistent step's clock readings when profiled: one row of
    /// `mega_stage_len` entries per program, for up to `mega_trace_rows`.
    pub mega_trace: D::Buf<i64>,
    pub mega_trace_rows: usize,
}

/// The buffers of on-device sampling, for `rows` rows.
pub(super) struct SampleBufs<D: Device> {
    /// Row capacity.
    pub rows: usize,
    /// The sampler's workspace, `[rows, vocab]`.
    pub ws: D::Buf<f32>,
    /// Sampled ids (i32), logprobs (f32) and thresholds (f32), each
    /// [`out_stride`]`(rows)` entries, back to back.
    pub out: D::Buf<u8>,
}

/// Entries per output array of [`SampleBufs::out`] for `rows` rows.
pub(super) fn out_stride(rows: usize) -> usize {
    rows.div_ceil(16).max(1) * 16
}

/// Prompt and output token counts of the rows that use penalties, `[rows, vocab]` i32 each.
pub(super) struct Counts<D: Device> {
    /// Row capacity.
    pub rows: usize,
    /// Prompt token counts.
    pub prompt: D::Buf<i32>,
    /// Output token counts.
    pub output: D::Buf<i32>,
}

/// Everything one launch sequence reads and writes besides the weights and
/// the KV cache.
pub(super) struct Buffers<D: Device, T: ActElem> {
    /// The step inputs (see [`super::inputs`]) and their capacity in bytes.
    pub arena: Option<(D::Buf<u8>, usize)>,
    /// Activations.
    pub scratch: Option<Scratch<D, T>>,
    /// Sampling workspace and outputs (allocated on the first sampled step).
    pub sample: Option<SampleBufs<D>>,
    /// Penalty counts (allocated on the first step that uses penalties).
    pub counts: Option<Counts<D>>,
    /// Graph buffers: allocated once at their final sizes, never grown (a
    /// graph's launches point into them).
    pub fixed: bool,
}

/// The error when a fixed buffer set is too small (a bug in the sizing).
fn fixed_too_small(what: &str) -> Error {
    Error::Usage(format!("internal error: the graph's {what} buffers are too small for this step"))
}

impl<D: Device, T: ActElem> Buffers<D, T> {
    /// An empty, growable set.
    pub fn new() -> Buffers<D, T> {
        Buffers { arena: None, scratch: None, sample: None, counts: None, fixed: false }
    }

    /// The capacity to allocate for `n`: `n` itself for fixed sets, the next
    /// power of two for growing ones (so a batch that grows one sequence at a
    /// time reallocates rarely).
    fn grow(&self, n: usize) -> usize {
        if self.fixed || n == 0 { n } else { n.next_power_of_two() }
    }

    /// The arena, holding at least `len` bytes.
    pub fn ensure_arena(&mut self, dev: &mut D, len: usize) -> Result<()> {
        if self.arena.as_ref().is_some_and(|a| a.1 >= len) {
            return Ok(());
        }
        if self.fixed && self.arena.is_some() {
            return Err(fixed_too_small("input"));
        }
        let len = len.next_power_of_two().max(4096);
        self.arena = Some((dev.zeros::<u8>(len)?, len));
        Ok(())
    }

    /// Activation buffers for `tokens` tokens, `rows` logit rows and `parts`
    /// split-KV partial rows (each grows to the largest seen).
    pub fn ensure_scratch(
        &mut self,
        dev: &mut D,
        c: &LlamaConfig,
        tokens: usize,
        rows: usize,
        parts: usize,
    ) -> Result<()> {
        if self.scratch.as_ref().is_some_and(|s| s.tokens >= tokens && s.rows >= rows && s.parts >= parts) {
            return Ok(());
        }
        if self.fixed && self.scratch.is_some() {
            return Err(fixed_too_small("activation"));
        }
        let (tokens, rows, parts) = match &self.scratch {
            Some(s) => (s.tokens.max(tokens), s.rows.max(rows), s.parts.max(parts)),
            None => (tokens, rows, parts),
        };
        let (tokens, rows, parts) = (self.grow(tokens), self.grow(rows), self.grow(parts));
        // Drop the old buffers first (their memory may be needed).
        self.scratch = None;
        let (lin_ws, lin_cnt) = super::products::linear_workspace_for(c, dev.tensor_cores());
        let (mega_ws, mega_cnt) = super::products::mega_workspace_for(c);
        let (lin_ws, lin_cnt) = (lin_ws.max(mega_ws), lin_cnt.max(mega_cnt));
        let stages = kernels::decode_step::stage_words(c.n_layers, c.n_head_kv, c.vocab_size);
        let (e, qd) = (c.n_embd, c.n_head * c.head_dim);
        let qkv = (c.n_head + 2 * c.n_head_kv) * c.head_dim;
        self.scratch = Some(Scratch {
            tokens,
            rows,
            parts,
            h: dev.zeros(tokens * e)?,
            normed: dev.zeros(tokens * e)?,
            tmp: dev.zeros(tokens * e)?,
            qkv: dev.zeros(tokens * qkv)?,
            q: dev.zeros(tokens * qd)?,
            attn: dev.zeros(tokens * qd)?,
            act: dev.zeros(tokens * c.n_ff)?,
            last: dev.zeros(rows.max(1) * e)?,
            logits: dev.zeros(rows.max(1) * c.vocab_size)?,
            // (The persistent step keeps its partials' maxima and sums
            // after the sums: two entries more a row.)
            part_o: dev.zeros((parts * (c.head_dim + 2)).max(16))?,
            part_m: dev.zeros(parts.max(16))?,
            part_l: dev.zeros(parts.max(16))?,
            lin_ws: dev.zeros(lin_ws.max(16))?,
            lin_cnt: dev.zeros(lin_cnt.max(16))?,
            lin_ws_len: lin_ws.max(16),
            lin_cnt_len: lin_cnt.max(16),
            mega_stage: dev.zeros(stages)?,
            mega_stage_len: stages,
            mega_trace: dev
                .zeros(kernels::decode_step::trace_width(c.n_layers) * super::mega::MAX_PROGRAMS)?,
            mega_trace_rows: super::mega::MAX_PROGRAMS,
        });
        Ok(())
    }

    /// The rows to allocate a set of per-row buffers (the `what` buffers,
    /// now `held` rows of them) at so that it holds `rows`: `None` where it
    /// already does; an error where the set is fixed.
    fn rows_to_allocate(&self, held: Option<usize>, rows: usize, what: &str) -> Result<Option<usize>> {
        if held.is_some_and(|h| h >= rows) {
            return Ok(None);
        }
        if self.fixed && held.is_some() {
            return Err(fixed_too_small(what));
        }
        Ok(Some(self.grow(held.map_or(rows, |h| h.max(rows)).max(1))))
    }

    /// Sampling buffers for `rows` rows of `vocab` logits.
    pub fn ensure_sample(&mut self, dev: &mut D, vocab: usize, rows: usize) -> Result<()> {
        let held = self.sample.as_ref().map(|s| s.rows);
        let Some(rows) = self.rows_to_allocate(held, rows, "sampling")? else {
            return Ok(());
        };
        self.sample = None;
        self.sample = Some(SampleBufs {
            rows,
            ws: dev.zeros(rows * vocab)?,
            out: dev.zeros(3 * 4 * out_stride(rows))?,
        });
        Ok(())
    }

    /// Penalty count buffers for `rows` rows of `vocab` tokens.
    pub fn ensure_counts(&mut self, dev: &mut D, vocab: usize, rows: usize) -> Result<()> {
        let held = self.counts.as_ref().map(|c| c.rows);
        let Some(rows) = self.rows_to_allocate(held, rows, "penalty count")? else {
            return Ok(());
        };
        self.counts = None;
        self.counts =
            Some(Counts { rows, prompt: dev.zeros(rows * vocab)?, output: dev.zeros(rows * vocab)? });
        Ok(())
    }
}

/// The paged KV cache of every layer: layer `l`'s keys (values) are the
/// `layer_len` elements from `l * layer_len` of `k` (`v`). With `fp8` the
/// buffers hold FP8 slots ([`kernels::kv_cache`]) and `layer_len` counts
/// their bytes in elements of `T`.
pub(super) struct KvCache<D: Device, T: ActElem> {
    pub k: D::Buf<T>,
    pub v: D::Buf<T>,
    pub layer_len: usize,
    pub num_blocks: usize,
    pub block_size: usize,
    pub fp8: bool,
}

/// What the KV cache stores.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum KvCacheDtype {
    /// The activations' dtype (f32, bf16 or f16).
    #[default]
    Auto,
    /// One OCP E4M3 byte per value and a power-of-two f32 scale per token
    /// and KV head: about half of bf16's bytes, read back exactly as the
    /// values the attention then computes with (README, "FP8 KV cache").
    Fp8,
}
