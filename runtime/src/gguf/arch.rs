//! Where the supported model architectures differ, in one place: [`Arch`],
//! chosen by `general.architecture`, and [`RopeScaling`], read from
//! `{arch}.rope.scaling.*`.
//!
//! | `general.architecture` | models | RoPE pairs | QKV bias | Q/K head norm |
//! |---|---|---|---|---|
//! | `llama` | Llama 2/3, Mistral, SmolLM2 | adjacent (`NORM`) | no | no |
//! | `qwen2` | Qwen2, Qwen2.5 | halves (`NEOX`) | yes | no |
//! | `qwen3` | Qwen3 | halves (`NEOX`) | no | yes |
//!
//! Every architecture also takes, when its file has them: an untied LM head
//! (`output.weight`; otherwise the embedding is the head), RoPE frequency
//! factors (`rope_freqs.weight`, `[rope_dim / 2]` f32: Llama 3's `llama3`
//! scaling as llama.cpp's converter writes it), linear RoPE scaling
//! (`rope.scaling.type = linear`, `rope.scaling.factor`), an explicit head
//! dimension (`attention.key_length`, Qwen3's 128 at any width), and a
//! sliding attention window (`attention.sliding_window`, Mistral), which
//! caps the context length at the window (full attention within the
//! window is the same computation). The tensor names and metadata keys are
//! llama.cpp's (`src/llama-arch.cpp`).

use super::{GgufError, Result};

/// The `general.architecture` values the runtime loads.
pub const SUPPORTED: [&str; 3] = ["llama", "qwen2", "qwen3"];

/// How RoPE pairs the elements of a head (llama.cpp's rope types).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(x[2i], x[2i+1])` (`LLAMA_ROPE_TYPE_NORM`).
    Norm,
    /// Halves `(x[i], x[i + d/2])` (`LLAMA_ROPE_TYPE_NEOX`).
    Neox,
}

/// A model architecture: its GGUF name and what its forward pass does
/// differently from Llama's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arch {
    /// `general.architecture`, also the prefix of its hyperparameter keys.
    pub name: &'static str,
    /// RoPE pairing.
    pub rope: RopeStyle,
    /// Q, K and V projections have biases (`blk.N.attn_{q,k,v}.bias`).
    pub qkv_bias: bool,
    /// Q and K heads are RMSNormed before RoPE (`blk.N.attn_{q,k}_norm.weight`).
    pub qk_norm: bool,
}

impl Arch {
    /// Llama (and Mistral, SmolLM2).
    pub const LLAMA: Arch = Arch { name: "llama", rope: RopeStyle::Norm, qkv_bias: false, qk_norm: false };
    /// Qwen2 and Qwen2.5.
    pub const QWEN2: Arch = Arch { name: "qwen2", rope: RopeStyle::Neox, qkv_bias: true, qk_norm: false };
    /// Qwen3 (dense).
    pub const QWEN3: Arch = Arch { name: "qwen3", rope: RopeStyle::Neox, qkv_bias: false, qk_norm: true };

    /// The architecture named `name`, or an error listing the supported ones.
    pub fn from_name(name: &str) -> Result<Arch> {
        [Arch::LLAMA, Arch::QWEN2, Arch::QWEN3]
            .into_iter()
            .find(|a| a.name == name)
            .ok_or_else(|| GgufError::UnsupportedArchitecture(name.to_string()))
    }

    /// This architecture's spelling of a hyperparameter key given with the
    /// `llama.` prefix (the `KEY_*` constants of [`super::llama`]).
    pub fn key(&self, llama_key: &str) -> String {
        match llama_key.strip_prefix("llama.") {
            Some(rest) => format!("{}.{rest}", self.name),
            None => llama_key.to_string(),
        }
    }
}

/// RoPE frequency scaling from the metadata.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// None (or `rope.scaling.type = none`).
    None,
    /// `linear`: positions divided by the factor (every frequency divided by it).
    Linear(f32),
}

impl RopeScaling {
    /// The divisor of every pair's frequency (1 without scaling).
    pub fn divisor(&self) -> f32 {
        match *self {
            RopeScaling::None => 1.0,
            RopeScaling::Linear(f) => f,
        }
    }
}
