//! Llama-family models in GGUF: metadata keys, [`LlamaConfig`] (validated
//! hyperparameters of any [`Arch`] of [`super::arch`]) and the tensors a file
//! must hold ([`LlamaConfig::tensors`]).
//!
//! The `KEY_*` constants are the `llama.` spellings; an architecture's keys
//! use its own prefix ([`Arch::key`]: `qwen2.block_count`).
//! Defaults follow llama.cpp where a key is optional: `head_count_kv` defaults
//! to `head_count`, `rope.freq_base` to 10000, `attention.key_length` (the
//! head dimension) to `embedding_length / head_count`, `rope.dimension_count`
//! to the head dimension, and the vocabulary size to the length of
//! `tokenizer.ggml.tokens` when `vocab_size` is absent.
//!
//! Invariants of a [`LlamaConfig`] returned by [`LlamaConfig::from_metadata`]
//! (checked by [`LlamaConfig::validate`]): every size is positive and below the
//! `MAX_*` bounds (so buffers sized from it stay reasonable), `head_dim` is
//! even, `n_head` is a multiple of `n_head_kv`, `rope_dim` is even and at most
//! `head_dim`, `rms_norm_eps` and `rope_freq_base` are finite and positive, and
//! a linear RoPE scaling factor is finite and at least 1.

use super::arch::{Arch, RopeScaling};
use super::metadata::Metadata;
use super::reader::Gguf;
use super::types::{GgmlType, Value};
use super::writer::GgufWriter;
use super::{GgufError, Result};

/// `general.architecture`.
pub const KEY_ARCHITECTURE: &str = "general.architecture";
/// `llama.block_count`: the number of transformer layers.
pub const KEY_BLOCK_COUNT: &str = "llama.block_count";
/// `llama.context_length`: the trained context length.
pub const KEY_CONTEXT_LENGTH: &str = "llama.context_length";
/// `llama.embedding_length`: the hidden size.
pub const KEY_EMBEDDING_LENGTH: &str = "llama.embedding_length";
/// `llama.feed_forward_length`: the FFN inner size.
pub const KEY_FEED_FORWARD_LENGTH: &str = "llama.feed_forward_length";
/// `llama.attention.head_count`: query heads.
pub const KEY_HEAD_COUNT: &str = "llama.attention.head_count";
/// `llama.attention.head_count_kv`: key/value heads.
pub const KEY_HEAD_COUNT_KV: &str = "llama.attention.head_count_kv";
/// `llama.attention.key_length`: an explicit head dimension (optional).
pub const KEY_KEY_LENGTH: &str = "llama.attention.key_length";
/// `llama.rope.freq_base`: RoPE theta.
pub const KEY_ROPE_FREQ_BASE: &str = "llama.rope.freq_base";
/// `llama.rope.dimension_count`: rotated dimensions per head.
pub const KEY_ROPE_DIMENSION_COUNT: &str = "llama.rope.dimension_count";
/// `llama.attention.layer_norm_rms_epsilon`: RMSNorm epsilon.
pub const KEY_RMS_EPS: &str = "llama.attention.layer_norm_rms_epsilon";
/// `llama.vocab_size`: the vocabulary size (optional).
pub const KEY_VOCAB_SIZE: &str = "llama.vocab_size";
/// `llama.attention.value_length`: an explicit value head dimension (optional).
pub const KEY_VALUE_LENGTH: &str = "llama.attention.value_length";
/// `llama.rope.scaling.type`: `none` or `linear` (others are not supported).
pub const KEY_ROPE_SCALING_TYPE: &str = "llama.rope.scaling.type";
/// `llama.rope.scaling.factor`: the linear scaling factor.
pub const KEY_ROPE_SCALING_FACTOR: &str = "llama.rope.scaling.factor";
/// `llama.attention.sliding_window`: a sliding attention window (Mistral).
pub const KEY_SLIDING_WINDOW: &str = "llama.attention.sliding_window";
/// The RoPE frequency factors tensor (`[rope_dim / 2]` f32, optional).
pub const ROPE_FREQS: &str = "rope_freqs.weight";

/// Upper bound on `n_layers`.
pub const MAX_LAYERS: usize = 1024;
/// Upper bound on `n_embd`, `n_ff` and `head_dim`.
pub const MAX_WIDTH: usize = 1 << 20;
/// Upper bound on `n_head`.
pub const MAX_HEADS: usize = 4096;
/// Upper bound on `context_length` and `vocab_size`.
pub const MAX_LENGTH: usize = 1 << 24;

/// The hyperparameters of a model of a supported architecture.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    /// The architecture (`general.architecture`).
    pub arch: Arch,
    /// Transformer layers (`llama.block_count`).
    pub n_layers: usize,
    /// Hidden size (`llama.embedding_length`).
    pub n_embd: usize,
    /// FFN inner size (`llama.feed_forward_length`).
    pub n_ff: usize,
    /// Query heads (`llama.attention.head_count`).
    pub n_head: usize,
    /// Key/value heads (`llama.attention.head_count_kv`).
    pub n_head_kv: usize,
    /// Dimension of one head (`attention.key_length`, else `n_embd / n_head`).
    pub head_dim: usize,
    /// Rotated dimensions per head (`llama.rope.dimension_count`).
    pub rope_dim: usize,
    /// RoPE theta (`llama.rope.freq_base`).
    pub rope_freq_base: f32,
    /// RoPE frequency scaling from the metadata (the `rope_freqs.weight`
    /// factors are a tensor, read with the weights).
    pub rope_scaling: RopeScaling,
    /// RMSNorm epsilon (`llama.attention.layer_norm_rms_epsilon`).
    pub rms_norm_eps: f32,
    /// Trained context length (`llama.context_length`), capped at the
    /// sliding window when the file has one.
    pub context_length: usize,
    /// Vocabulary size (`llama.vocab_size`, or the token list's length).
    pub vocab_size: usize,
}

/// What a tensor of the architecture is, which decides the type a writer
/// gives it (see [`super::tiny`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorRole {
    /// The token embedding table (`token_embd.weight`).
    Embedding,
    /// An RMSNorm weight vector.
    Norm,
    /// A projection's bias vector (f32).
    Bias,
    /// A projection matrix.
    Matrix,
    /// The untied LM head (`output.weight`), absent when tied to the embedding.
    Output,
}

/// A tensor the architecture expects: name, shape (ggml order) and role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// The tensor's name.
    pub name: String,
    /// Its dimensions, `dims[0]` contiguous (the input dimension of a matrix).
    pub dims: Vec<u64>,
    /// Its role.
    pub role: TensorRole,
}

/// The per-layer tensors, as named in GGUF (`blk.{layer}.{name}.weight`), in the
/// order llama.cpp's converter writes them for SmolLM2.
pub const LAYER_TENSORS: [&str; 9] =
    ["attn_norm", "ffn_down", "ffn_gate", "ffn_up", "ffn_norm", "attn_k", "attn_output", "attn_q", "attn_v"];

/// The name of per-layer tensor `name` (one of [`LAYER_TENSORS`]) of `layer`.
pub fn layer_tensor(layer: usize, name: &str) -> String {
    format!("blk.{layer}.{name}.weight")
}

impl LlamaConfig {
    /// Reads and validates the hyperparameters from `md`.
    pub fn from_metadata(md: &Metadata) -> Result<LlamaConfig> {
        let arch = Arch::from_name(md.require_str(KEY_ARCHITECTURE)?)?;
        let key = |k: &str| arch.key(k);
        let req = |k: &str| md.require_u32(&key(k)).map(|v| v as usize);
        let opt = |k: &str| md.get_u32(&key(k)).map(|v| v.map(|v| v as usize));
        let n_embd = req(KEY_EMBEDDING_LENGTH)?;
        let n_head = req(KEY_HEAD_COUNT)?;
        let n_head_kv = opt(KEY_HEAD_COUNT_KV)?.unwrap_or(n_head);
        if n_head == 0 {
            return Err(invalid(&key(KEY_HEAD_COUNT), "must be positive."));
        }
        let head_dim = opt(KEY_KEY_LENGTH)?.unwrap_or(n_embd / n_head);
        if opt(KEY_KEY_LENGTH)?.is_none() && !n_embd.is_multiple_of(n_head) {
            return Err(invalid(
                &key(KEY_HEAD_COUNT),
                &format!("embedding_length {n_embd} is not a multiple of head_count {n_head}."),
            ));
        }
        if let Some(v) = opt(KEY_VALUE_LENGTH)?
            && v != head_dim
        {
            return Err(invalid(
                &key(KEY_VALUE_LENGTH),
                &format!("{v} differs from the key length {head_dim}, which is not supported."),
            ));
        }
        let token_count = md.get_array(super::vocab::KEY_TOKENS)?.map(|a| a.len());
        let vocab_size = match (opt(KEY_VOCAB_SIZE)?, token_count) {
            (Some(v), Some(n)) if v != n => {
                return Err(invalid(
                    &key(KEY_VOCAB_SIZE),
                    &format!("{v} differs from the {n} tokens of the vocabulary."),
                ));
            }
            (Some(v), _) => v,
            (None, Some(n)) => n,
            (None, None) => return Err(GgufError::MissingKey(key(KEY_VOCAB_SIZE))),
        };
        let rope_scaling = match md.get_str(&key(KEY_ROPE_SCALING_TYPE))? {
            None | Some("none") => RopeScaling::None,
            Some("linear") => match md.get_f32(&key(KEY_ROPE_SCALING_FACTOR))? {
                None => RopeScaling::None,
                Some(f) if f == 0.0 || f == 1.0 => RopeScaling::None,
                Some(f) => RopeScaling::Linear(f),
            },
            Some(other) => {
                return Err(invalid(
                    &key(KEY_ROPE_SCALING_TYPE),
                    &format!("`{other}` is not supported (none, linear)."),
                ));
            }
        };
        let mut context_length = req(KEY_CONTEXT_LENGTH)?;
        if let Some(window) = opt(KEY_SLIDING_WINDOW)? {
            if window == 0 {
                return Err(invalid(&key(KEY_SLIDING_WINDOW), "must be positive."));
            }
            context_length = context_length.min(window);
        }
        let config = LlamaConfig {
            arch,
            n_layers: req(KEY_BLOCK_COUNT)?,
            n_embd,
            n_ff: req(KEY_FEED_FORWARD_LENGTH)?,
            n_head,
            n_head_kv,
            head_dim,
            rope_dim: opt(KEY_ROPE_DIMENSION_COUNT)?.unwrap_or(head_dim),
            rope_freq_base: md.get_f32(&key(KEY_ROPE_FREQ_BASE))?.unwrap_or(10000.0),
            rope_scaling,
            rms_norm_eps: md.require_f32(&key(KEY_RMS_EPS))?,
            context_length,
            vocab_size,
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks the invariants listed in the module doc; errors name the key.
    pub fn validate(&self) -> Result<()> {
        let key = |k: &str| self.arch.key(k);
        let range = |k: &str, v: usize, max: usize| {
            if v == 0 || v > max {
                Err(invalid(&key(k), &format!("{v} is outside 1..={max}.")))
            } else {
                Ok(())
            }
        };
        range(KEY_BLOCK_COUNT, self.n_layers, MAX_LAYERS)?;
        range(KEY_EMBEDDING_LENGTH, self.n_embd, MAX_WIDTH)?;
        range(KEY_FEED_FORWARD_LENGTH, self.n_ff, MAX_WIDTH)?;
        range(KEY_HEAD_COUNT, self.n_head, MAX_HEADS)?;
        range(KEY_HEAD_COUNT_KV, self.n_head_kv, MAX_HEADS)?;
        range(KEY_KEY_LENGTH, self.head_dim, MAX_WIDTH)?;
        range(KEY_CONTEXT_LENGTH, self.context_length, MAX_LENGTH)?;
        range(KEY_VOCAB_SIZE, self.vocab_size, MAX_LENGTH)?;
        if self.n_head.checked_mul(self.head_dim).is_none_or(|w| w > MAX_WIDTH) {
            return Err(invalid(
                &key(KEY_HEAD_COUNT),
                &format!(
                    "head_count {} times the head dimension {} is too wide.",
                    self.n_head, self.head_dim
                ),
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(invalid(&key(KEY_KEY_LENGTH), &format!("head dimension {} is odd.", self.head_dim)));
        }
        if !self.n_head.is_multiple_of(self.n_head_kv) {
            return Err(invalid(
                &key(KEY_HEAD_COUNT_KV),
                &format!("head_count {} is not a multiple of head_count_kv {}.", self.n_head, self.n_head_kv),
            ));
        }
        if self.rope_dim == 0 || self.rope_dim > self.head_dim || !self.rope_dim.is_multiple_of(2) {
            return Err(invalid(
                &key(KEY_ROPE_DIMENSION_COUNT),
                &format!("{} must be even and in 2..={} (the head dimension).", self.rope_dim, self.head_dim),
            ));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return Err(invalid(
                &key(KEY_RMS_EPS),
                &format!("{} must be finite and positive.", self.rms_norm_eps),
            ));
        }
        if !(self.rope_freq_base.is_finite() && self.rope_freq_base > 0.0) {
            return Err(invalid(
                &key(KEY_ROPE_FREQ_BASE),
                &format!("{} must be finite and positive.", self.rope_freq_base),
            ));
        }
        if let RopeScaling::Linear(f) = self.rope_scaling
            && !(f.is_finite() && f >= 1.0)
        {
            return Err(invalid(
                &key(KEY_ROPE_SCALING_FACTOR),
                &format!("{f} must be finite and at least 1."),
            ));
        }
        Ok(())
    }

    /// Width of the query projection: `n_head * head_dim`.
    pub fn n_embd_q(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of the key (and value) projection: `n_head_kv * head_dim`.
    pub fn n_embd_kv(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// The tensors of the architecture, in the order of the real file, without
    /// the optional untied `output.weight` and `rope_freqs.weight`.
    pub fn tensors(&self) -> Vec<TensorSpec> {
        let (e, f, kv, v) =
            (self.n_embd as u64, self.n_ff as u64, self.n_embd_kv() as u64, self.vocab_size as u64);
        let (q, hd) = (self.n_embd_q() as u64, self.head_dim as u64);
        let spec = |name: String, dims: &[u64], role| TensorSpec { name, dims: dims.to_vec(), role };
        let mut out = vec![spec("token_embd.weight".into(), &[e, v], TensorRole::Embedding)];
        for layer in 0..self.n_layers {
            for name in LAYER_TENSORS {
                let (dims, role): (&[u64], _) = match name {
                    "attn_norm" | "ffn_norm" => (&[e], TensorRole::Norm),
                    "ffn_down" => (&[f, e], TensorRole::Matrix),
                    "ffn_gate" | "ffn_up" => (&[e, f], TensorRole::Matrix),
                    "attn_k" | "attn_v" => (&[e, kv], TensorRole::Matrix),
                    "attn_q" => (&[e, q], TensorRole::Matrix),
                    _ => (&[q, e], TensorRole::Matrix),
                };
                out.push(spec(layer_tensor(layer, name), dims, role));
            }
            if self.arch.qkv_bias {
                for (name, n) in [("attn_q", q), ("attn_k", kv), ("attn_v", kv)] {
                    out.push(spec(format!("blk.{layer}.{name}.bias"), &[n], TensorRole::Bias));
                }
            }
            if self.arch.qk_norm {
                for name in ["attn_q_norm", "attn_k_norm"] {
                    out.push(spec(layer_tensor(layer, name), &[hd], TensorRole::Norm));
                }
            }
        }
        out.push(spec("output_norm.weight".into(), &[e], TensorRole::Norm));
        out
    }

    /// The spec of the untied LM head, `output.weight`.
    pub fn output_tensor(&self) -> TensorSpec {
        TensorSpec {
            name: "output.weight".into(),
            dims: vec![self.n_embd as u64, self.vocab_size as u64],
            role: TensorRole::Output,
        }
    }

    /// The spec of the RoPE frequency factors, `rope_freqs.weight`.
    pub fn rope_freqs_tensor(&self) -> TensorSpec {
        TensorSpec { name: ROPE_FREQS.into(), dims: vec![self.rope_dim as u64 / 2], role: TensorRole::Bias }
    }

    /// Checks that `gguf` holds every tensor of [`LlamaConfig::tensors`] (and
    /// `output.weight` and `rope_freqs.weight` if present) with the expected
    /// shape and a supported type; norms, biases and frequency factors must be
    /// `F32`. Returns whether the LM head is tied to the embedding (no
    /// `output.weight`).
    pub fn check_tensors(&self, gguf: &Gguf) -> Result<bool> {
        let output = gguf.header().tensor("output.weight").map(|_| self.output_tensor());
        let freqs = gguf.header().tensor(ROPE_FREQS).map(|_| self.rope_freqs_tensor());
        for spec in self.tensors().into_iter().chain(output.clone()).chain(freqs) {
            let info = gguf.tensor_info(&spec.name)?;
            let mismatch = |message: String| GgufError::TensorMismatch { tensor: spec.name.clone(), message };
            if info.dims != spec.dims {
                return Err(mismatch(format!("shape {:?}, expected {:?}.", info.dims, spec.dims)));
            }
            if !info.ty.is_supported() {
                return Err(GgufError::UnsupportedType { tensor: spec.name.clone(), ty: info.ty });
            }
            if matches!(spec.role, TensorRole::Norm | TensorRole::Bias) && info.ty != GgmlType::F32 {
                return Err(mismatch(format!("type {}, expected f32 for a vector.", info.ty)));
            }
        }
        Ok(output.is_none())
    }

    /// Writes the hyperparameter keys with the architecture's prefix (as the
    /// real file stores them: `u32` sizes, `f32` theta and epsilon) and
    /// `general.architecture`; `attention.key_length` when the head
    /// dimension is not `n_embd / n_head`, the linear RoPE scaling when set.
    pub fn write_metadata(&self, w: &mut GgufWriter) -> Result<()> {
        let u = |v: usize| Value::U32(v as u32);
        let key = |k: &str| self.arch.key(k);
        w.set(KEY_ARCHITECTURE, self.arch.name)?;
        w.set(&key(KEY_BLOCK_COUNT), u(self.n_layers))?;
        w.set(&key(KEY_CONTEXT_LENGTH), u(self.context_length))?;
        w.set(&key(KEY_EMBEDDING_LENGTH), u(self.n_embd))?;
        w.set(&key(KEY_FEED_FORWARD_LENGTH), u(self.n_ff))?;
        w.set(&key(KEY_HEAD_COUNT), u(self.n_head))?;
        w.set(&key(KEY_HEAD_COUNT_KV), u(self.n_head_kv))?;
        w.set(&key(KEY_ROPE_FREQ_BASE), self.rope_freq_base)?;
        w.set(&key(KEY_RMS_EPS), self.rms_norm_eps)?;
        w.set(&key(KEY_VOCAB_SIZE), u(self.vocab_size))?;
        w.set(&key(KEY_ROPE_DIMENSION_COUNT), u(self.rope_dim))?;
        if self.n_embd_q() != self.n_embd {
            w.set(&key(KEY_KEY_LENGTH), u(self.head_dim))?;
            w.set(&key(KEY_VALUE_LENGTH), u(self.head_dim))?;
        }
        if let RopeScaling::Linear(f) = self.rope_scaling {
            w.set(&key(KEY_ROPE_SCALING_TYPE), "linear")?;
            w.set(&key(KEY_ROPE_SCALING_FACTOR), f)?;
        }
        Ok(())
    }
}

fn invalid(key: &str, message: &str) -> GgufError {
    GgufError::InvalidValue { key: key.to_string(), message: message.to_string() }
}
