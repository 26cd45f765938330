//! The Llama architecture in GGUF: metadata keys, [`LlamaConfig`] (validated
//! hyperparameters) and the tensors a file must hold ([`LlamaConfig::tensors`]).
//!
//! Defaults follow llama.cpp where a key is optional: `head_count_kv` defaults
//! to `head_count`, `rope.freq_base` to 10000, `rope.dimension_count` to the
//! head dimension, and the vocabulary size to the length of
//! `tokenizer.ggml.tokens` when `llama.vocab_size` is absent.
//!
//! Invariants of a [`LlamaConfig`] returned by [`LlamaConfig::from_metadata`]
//! (checked by [`LlamaConfig::validate`]): every size is positive and below the
//! `MAX_*` bounds (so buffers sized from it stay reasonable), `n_embd =
//! n_head * head_dim`, `n_head` is a multiple of `n_head_kv`, `rope_dim` is even
//! and at most `head_dim`, and `rms_norm_eps` and `rope_freq_base` are finite and
//! positive.

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

/// Upper bound on `n_layers`.
pub const MAX_LAYERS: usize = 1024;
/// Upper bound on `n_embd`, `n_ff` and `head_dim`.
pub const MAX_WIDTH: usize = 1 << 20;
/// Upper bound on `n_head`.
pub const MAX_HEADS: usize = 4096;
/// Upper bound on `context_length` and `vocab_size`.
pub const MAX_LENGTH: usize = 1 << 24;

/// The hyperparameters of a Llama model.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
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
    /// Dimension of one head (`n_embd / n_head`).
    pub head_dim: usize,
    /// Rotated dimensions per head (`llama.rope.dimension_count`).
    pub rope_dim: usize,
    /// RoPE theta (`llama.rope.freq_base`).
    pub rope_freq_base: f32,
    /// RMSNorm epsilon (`llama.attention.layer_norm_rms_epsilon`).
    pub rms_norm_eps: f32,
    /// Trained context length (`llama.context_length`).
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
        let arch = md.require_str(KEY_ARCHITECTURE)?;
        if arch != "llama" {
            return Err(GgufError::UnsupportedArchitecture(arch.to_string()));
        }
        let req = |key: &str| md.require_u32(key).map(|v| v as usize);
        let n_embd = req(KEY_EMBEDDING_LENGTH)?;
        let n_head = req(KEY_HEAD_COUNT)?;
        let n_head_kv = md.get_u32(KEY_HEAD_COUNT_KV)?.map_or(n_head, |v| v as usize);
        if n_head == 0 {
            return Err(invalid(KEY_HEAD_COUNT, "must be positive."));
        }
        let head_dim = n_embd / n_head;
        if let Some(k) = md.get_u32(KEY_KEY_LENGTH)?
            && k as usize != head_dim
        {
            return Err(invalid(
                KEY_KEY_LENGTH,
                &format!(
                    "{k} differs from embedding_length / head_count = {head_dim}, which is not supported."
                ),
            ));
        }
        let token_count = md.get_array(super::vocab::KEY_TOKENS)?.map(|a| a.len());
        let vocab_size = match (md.get_u32(KEY_VOCAB_SIZE)?, token_count) {
            (Some(v), Some(n)) if v as usize != n => {
                return Err(invalid(
                    KEY_VOCAB_SIZE,
                    &format!("{v} differs from the {n} tokens of the vocabulary."),
                ));
            }
            (Some(v), _) => v as usize,
            (None, Some(n)) => n,
            (None, None) => return Err(GgufError::MissingKey(KEY_VOCAB_SIZE.to_string())),
        };
        let config = LlamaConfig {
            n_layers: req(KEY_BLOCK_COUNT)?,
            n_embd,
            n_ff: req(KEY_FEED_FORWARD_LENGTH)?,
            n_head,
            n_head_kv,
            head_dim,
            rope_dim: md.get_u32(KEY_ROPE_DIMENSION_COUNT)?.map_or(head_dim, |v| v as usize),
            rope_freq_base: md.get_f32(KEY_ROPE_FREQ_BASE)?.unwrap_or(10000.0),
            rms_norm_eps: md.require_f32(KEY_RMS_EPS)?,
            context_length: req(KEY_CONTEXT_LENGTH)?,
            vocab_size,
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks the invariants listed in the module doc; errors name the key.
    pub fn validate(&self) -> Result<()> {
        let range = |key: &str, v: usize, max: usize| {
            if v == 0 || v > max { Err(invalid(key, &format!("{v} is outside 1..={max}."))) } else { Ok(()) }
        };
        range(KEY_BLOCK_COUNT, self.n_layers, MAX_LAYERS)?;
        range(KEY_EMBEDDING_LENGTH, self.n_embd, MAX_WIDTH)?;
        range(KEY_FEED_FORWARD_LENGTH, self.n_ff, MAX_WIDTH)?;
        range(KEY_HEAD_COUNT, self.n_head, MAX_HEADS)?;
        range(KEY_HEAD_COUNT_KV, self.n_head_kv, MAX_HEADS)?;
        range(KEY_CONTEXT_LENGTH, self.context_length, MAX_LENGTH)?;
        range(KEY_VOCAB_SIZE, self.vocab_size, MAX_LENGTH)?;
        if self.n_head.checked_mul(self.head_dim) != Some(self.n_embd) {
            return Err(invalid(
                KEY_HEAD_COUNT,
                &format!(
                    "embedding_length {} is not head_count {} times the head dimension.",
                    self.n_embd, self.n_head
                ),
            ));
        }
        if !self.n_head.is_multiple_of(self.n_head_kv) {
            return Err(invalid(
                KEY_HEAD_COUNT_KV,
                &format!("head_count {} is not a multiple of head_count_kv {}.", self.n_head, self.n_head_kv),
            ));
        }
        if self.rope_dim == 0 || self.rope_dim > self.head_dim || !self.rope_dim.is_multiple_of(2) {
            return Err(invalid(
                KEY_ROPE_DIMENSION_COUNT,
                &format!("{} must be even and in 2..={} (the head dimension).", self.rope_dim, self.head_dim),
            ));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return Err(invalid(KEY_RMS_EPS, &format!("{} must be finite and positive.", self.rms_norm_eps)));
        }
        if !(self.rope_freq_base.is_finite() && self.rope_freq_base > 0.0) {
            return Err(invalid(
                KEY_ROPE_FREQ_BASE,
                &format!("{} must be finite and positive.", self.rope_freq_base),
            ));
        }
        Ok(())
    }

    /// Width of the key (and value) projection: `n_head_kv * head_dim`.
    pub fn n_embd_kv(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// The tensors of the architecture, in the order of the real file, without
    /// the optional untied `output.weight`.
    pub fn tensors(&self) -> Vec<TensorSpec> {
        let (e, f, kv, v) =
            (self.n_embd as u64, self.n_ff as u64, self.n_embd_kv() as u64, self.vocab_size as u64);
        let spec = |name: String, dims: &[u64], role| TensorSpec { name, dims: dims.to_vec(), role };
        let mut out = vec![spec("token_embd.weight".into(), &[e, v], TensorRole::Embedding)];
        for layer in 0..self.n_layers {
            for name in LAYER_TENSORS {
                let (dims, role): (&[u64], _) = match name {
                    "attn_norm" | "ffn_norm" => (&[e], TensorRole::Norm),
                    "ffn_down" => (&[f, e], TensorRole::Matrix),
                    "ffn_gate" | "ffn_up" => (&[e, f], TensorRole::Matrix),
                    "attn_k" | "attn_v" => (&[e, kv], TensorRole::Matrix),
                    _ => (&[e, e], TensorRole::Matrix),
                };
                out.push(spec(layer_tensor(layer, name), dims, role));
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

    /// Checks that `gguf` holds every tensor of [`LlamaConfig::tensors`] (and
    /// `output.weight` if present) with the expected shape and a supported type;
    /// norms must be `F32`. Returns whether the LM head is tied to the embedding
    /// (no `output.weight`).
    pub fn check_tensors(&self, gguf: &Gguf) -> Result<bool> {
        let output = gguf.header().tensor("output.weight").map(|_| self.output_tensor());
        for spec in self.tensors().into_iter().chain(output.clone()) {
            let info = gguf.tensor_info(&spec.name)?;
            let mismatch = |message: String| GgufError::TensorMismatch { tensor: spec.name.clone(), message };
            if info.dims != spec.dims {
                return Err(mismatch(format!("shape {:?}, expected {:?}.", info.dims, spec.dims)));
            }
            if !info.ty.is_supported() {
                return Err(GgufError::UnsupportedType { tensor: spec.name.clone(), ty: info.ty });
            }
            if spec.role == TensorRole::Norm && info.ty != GgmlType::F32 {
                return Err(mismatch(format!("type {}, expected f32 for a norm weight.", info.ty)));
            }
        }
        Ok(output.is_none())
    }

    /// Writes the hyperparameter keys (as the real file stores them: `u32`
    /// sizes, `f32` theta and epsilon) and `general.architecture`.
    pub fn write_metadata(&self, w: &mut GgufWriter) -> Result<()> {
        let u = |v: usize| Value::U32(v as u32);
        w.set(KEY_ARCHITECTURE, "llama")?;
        w.set(KEY_BLOCK_COUNT, u(self.n_layers))?;
        w.set(KEY_CONTEXT_LENGTH, u(self.context_length))?;
        w.set(KEY_EMBEDDING_LENGTH, u(self.n_embd))?;
        w.set(KEY_FEED_FORWARD_LENGTH, u(self.n_ff))?;
        w.set(KEY_HEAD_COUNT, u(self.n_head))?;
        w.set(KEY_HEAD_COUNT_KV, u(self.n_head_kv))?;
        w.set(KEY_ROPE_FREQ_BASE, self.rope_freq_base)?;
        w.set(KEY_RMS_EPS, self.rms_norm_eps)?;
        w.set(KEY_VOCAB_SIZE, u(self.vocab_size))?;
        w.set(KEY_ROPE_DIMENSION_COUNT, u(self.rope_dim))?;
        Ok(())
    }
}

fn invalid(key: &str, message: &str) -> GgufError {
    GgufError::InvalidValue { key: key.to_string(), message: message.to_string() }
}
