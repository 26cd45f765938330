//! A tiny random-weight Llama written as GGUF with the layout of the real
//! SmolLM2 file (same tensor names, order, roles and types, same metadata keys
//! including the tokenizer and chat template), so that tests can build a model
//! in milliseconds.
//!
//! The vocabulary ([`tiny_vocab`]) is a real byte-level BPE vocabulary: three
//! control tokens as in SmolLM2 (`<|endoftext|>` 0, `<|im_start|>` 1 = BOS,
//! `<|im_end|>` 2 = EOS), the 256 byte tokens, and a few merges, padded with
//! unused tokens up to the configured vocabulary size.
//!
//! Invariant: the output is a deterministic function of the [`TinyLlama`]
//! value (weights come from a seeded [`Rng`]), and it always passes
//! [`LlamaConfig::from_metadata`] and [`LlamaConfig::check_tensors`].

use super::llama::{LlamaConfig, TensorRole, TensorSpec};
use super::types::{GgmlType, Value};
use super::vocab::{TokenType, Vocab, gpt2_byte_to_char};
use super::writer::GgufWriter;
use super::{GgufError, Result};
use crate::rng::Rng;

/// SmolLM2-135M-Instruct's chat template (`tokenizer.chat_template`), verbatim.
pub const SMOLLM2_CHAT_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// The merges of the tiny vocabulary, by rank.
const TINY_MERGES: [&str; 18] = [
    "Ġ t", "h e", "Ġ a", "i n", "Ġt he", "e r", "o n", "Ġ s", "r e", "a t", "e n", "o r", "Ġ w", "l l",
    "Ġ o", "Ġ c", "i s", "e s",
];

/// The tokens of the unpadded tiny vocabulary and their types.
fn base_tokens() -> (Vec<String>, Vec<TokenType>) {
    let mut tokens: Vec<String> =
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"].iter().map(|s| s.to_string()).collect();
    let mut token_types = vec![TokenType::Control; 3];
    for b in 0..=255u8 {
        tokens.push(gpt2_byte_to_char(b).to_string());
        token_types.push(TokenType::Normal);
    }
    for m in TINY_MERGES {
        let merged = m.replace(' ', "");
        if !tokens.contains(&merged) {
            tokens.push(merged);
            token_types.push(TokenType::Normal);
        }
    }
    (tokens, token_types)
}

/// The tiny byte-level BPE vocabulary, padded with unused tokens to `size`
/// entries (at least [`tiny_vocab_min_size`]).
pub fn tiny_vocab(size: usize) -> Result<Vocab> {
    let (mut tokens, mut token_types) = base_tokens();
    if size < tokens.len() {
        return Err(GgufError::InvalidValue {
            key: super::llama::KEY_VOCAB_SIZE.to_string(),
            message: format!("{size} is smaller than the {} tokens of the tiny vocabulary.", tokens.len()),
        });
    }
    for i in tokens.len()..size {
        tokens.push(format!("<unused{i}>"));
        token_types.push(TokenType::Unused);
    }
    Ok(Vocab {
        model: "gpt2".into(),
        pre: Some("smollm".into()),
        tokens,
        token_types,
        merges: TINY_MERGES.iter().map(|s| s.to_string()).collect(),
        scores: Vec::new(),
        bos: Some(1),
        eos: Some(2),
        eot: None,
        unk: Some(0),
        pad: Some(2),
        add_bos: Some(false),
        add_eos: false,
        add_space_prefix: Some(false),
        chat_template: Some(SMOLLM2_CHAT_TEMPLATE.into()),
    })
}

/// The size of the unpadded tiny vocabulary.
pub fn tiny_vocab_min_size() -> usize {
    base_tokens().0.len()
}

/// A tiny Llama to write: hyperparameters, seed and tensor types.
#[derive(Debug, Clone, PartialEq)]
pub struct TinyLlama {
    /// The hyperparameters (validated when written). Matrix widths must be
    /// multiples of 32 for the quantized types.
    pub config: LlamaConfig,
    /// Seed of the weights.
    pub seed: u64,
    /// Type of `token_embd.weight` (SmolLM2: `Q8_0`).
    pub embedding_type: GgmlType,
    /// Type of the projection matrices (SmolLM2: `Q4_1`).
    pub matrix_type: GgmlType,
    /// Types of some quantized tensors (projections, the embedding, the
    /// untied head) instead of their role's type, as llama.cpp's mixed
    /// quantizations write them (see [`q4_k_m_types`]). A key matches the
    /// tensor `{key}.weight` and every tensor whose name ends with
    /// `.{key}.weight`: a kind (`"attn_v"`: every layer's
    /// `blk.N.attn_v.weight`) or one tensor (`"blk.3.ffn_down"`,
    /// `"output"`). The first matching entry wins.
    pub matrix_types: Vec<(String, GgmlType)>,
    /// Whether to write an untied `output.weight` (SmolLM2 ties it: no).
    pub untied_output: bool,
    /// Half-width of the uniform token embeddings. With the tied head the
    /// logits scale with its square: 0.5 makes the current token's own logit
    /// dominate (near-deterministic outputs), a few hundredths give spread
    /// distributions whose logprobs show every rounding difference.
    pub embedding_scale: f32,
    /// The vocabulary to write (`None`: [`tiny_vocab`] of the configured
    /// size); its size must be the configured one.
    pub vocab: Option<Vocab>,
    /// Multiplier of the untied LM head's weights (1: the projections'
    /// scale). Large values widen the gaps between the top logits, which a
    /// golden comparison needs.
    pub output_scale: f32,
    /// Multiplier of the projection matrices' weights (1: uniform with
    /// half-width `1 / sqrt(fan_in)`).
    pub matrix_scale: f32,
    /// `rope_freqs.weight` to write (`[rope_dim / 2]` frequency divisors).
    pub rope_freqs: Option<Vec<f32>>,
    /// `{arch}.attention.sliding_window` to write.
    pub sliding_window: Option<u32>,
    /// `general.name`.
    pub name: String,
}

impl Default for TinyLlama {
    /// Two layers, hidden 64, FFN 128, 4 query heads and 2 KV heads of
    /// dimension 16, the tiny vocabulary unpadded, SmolLM2's types.
    fn default() -> Self {
        TinyLlama {
            config: LlamaConfig {
                arch: crate::gguf::Arch::LLAMA,
                n_layers: 2,
                n_embd: 64,
                n_ff: 128,
                n_head: 4,
                n_head_kv: 2,
                head_dim: 16,
                rope_dim: 16,
                rope_freq_base: 100000.0,
                rope_scaling: crate::gguf::RopeScaling::None,
                rms_norm_eps: 1e-5,
                context_length: 256,
                vocab_size: tiny_vocab_min_size(),
            },
            seed: 0x5EED,
            embedding_type: GgmlType::Q8_0,
            matrix_type: GgmlType::Q4_1,
            matrix_types: Vec::new(),
            untied_output: false,
            embedding_scale: 0.5,
            vocab: None,
            output_scale: 1.0,
            matrix_scale: 1.0,
            rope_freqs: None,
            sliding_window: None,
            name: "Tiny Llama".into(),
        }
    }
}

impl TinyLlama {
    /// The model as a writer (metadata and tensors), ready for `to_bytes`.
    pub fn writer(&self) -> Result<GgufWriter> {
        let c = &self.config;
        c.validate()?;
        let mut w = GgufWriter::new();
        w.set("general.type", "model")?;
        w.set("general.name", self.name.as_str())?;
        c.write_metadata(&mut w)?;
        if let Some(window) = self.sliding_window {
            w.set(&c.arch.key(super::llama::KEY_SLIDING_WINDOW), Value::U32(window))?;
        }
        // LLAMA_FTYPE_MOSTLY_Q4_1 when the matrices are Q4_1 (the real file's value).
        w.set("general.file_type", Value::U32(if self.matrix_type == GgmlType::Q4_1 { 3 } else { 0 }))?;
        match &self.vocab {
            Some(v) if v.tokens.len() != c.vocab_size => {
                return Err(GgufError::InvalidValue {
                    key: super::llama::KEY_VOCAB_SIZE.to_string(),
                    message: format!("the vocabulary has {} tokens, not {}", v.tokens.len(), c.vocab_size),
                });
            }
            Some(v) => v.write_metadata(&mut w)?,
            None => tiny_vocab(c.vocab_size)?.write_metadata(&mut w)?,
        }
        w.set("general.quantization_version", Value::U32(2))?;

        let mut rng = Rng::new(self.seed);
        if let Some(f) = &self.rope_freqs {
            let spec = c.rope_freqs_tensor();
            w.add_f32_tensor(&spec.name, GgmlType::F32, &spec.dims, f)?;
        }
        let specs = c.tensors().into_iter().chain(self.untied_output.then(|| c.output_tensor()));
        for spec in specs {
            let n: u64 = spec.dims.iter().product();
            let fan_in = spec.dims[0] as f32;
            let values: Vec<f32> = match spec.role {
                TensorRole::Norm => (0..n).map(|_| 1.0 + 0.1 * rng.signed_f32()).collect(),
                TensorRole::Bias => (0..n).map(|_| 0.5 * rng.signed_f32()).collect(),
                TensorRole::Embedding => (0..n).map(|_| self.embedding_scale * rng.signed_f32()).collect(),
                TensorRole::Matrix => {
                    (0..n).map(|_| self.matrix_scale * rng.signed_f32() / fan_in.sqrt()).collect()
                }
                TensorRole::Output => {
                    (0..n).map(|_| self.output_scale * rng.signed_f32() / fan_in.sqrt()).collect()
                }
            };
            let ty = self.tensor_type(&spec);
            w.add_f32_tensor(&spec.name, ty, &spec.dims, &values)?;
        }
        Ok(w)
    }

    /// The type the writer gives tensor `spec`: `F32` for norms and biases;
    /// for the others the first entry of `matrix_types` that matches its
    /// name, else `embedding_type` (the embedding, the untied head) or
    /// `matrix_type` (the projections).
    pub fn tensor_type(&self, spec: &TensorSpec) -> GgmlType {
        let default = match spec.role {
            TensorRole::Norm | TensorRole::Bias => return GgmlType::F32,
            TensorRole::Embedding | TensorRole::Output => self.embedding_type,
            TensorRole::Matrix => self.matrix_type,
        };
        let matches = |key: &str| {
            (spec.name.strip_suffix(".weight").and_then(|stem| stem.strip_suffix(key)))
                .is_some_and(|rest| rest.is_empty() || rest.ends_with('.'))
        };
        self.matrix_types.iter().find(|(key, _)| matches(key)).map_or(default, |&(_, ty)| ty)
    }

    /// The model with the tensor types of `mix`.
    pub fn with_mix(self, mix: QuantMix) -> TinyLlama {
        let QuantMix { embedding_type, matrix_type, matrix_types } = mix;
        TinyLlama { embedding_type, matrix_type, matrix_types, ..self }
    }

    /// The model's GGUF bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        Ok(self.writer()?.to_bytes())
    }
}

/// The Llama shapes `tessera synth` writes: SmolLM2-135M's, Llama-3.2-1B's
/// and Llama-3-8B's layer shapes (layers, hidden, FFN, heads, head dim) with
/// SmolLM2's vocabulary size, Q4_1 projections and a tied Q8_0 head.
pub fn synth_shape(name: &str) -> Option<LlamaConfig> {
    let (n_layers, n_embd, n_ff, n_head, n_head_kv, head_dim) = match name {
        "smollm2-135m" => (30, 576, 1536, 9, 3, 64),
        "llama-1b" => (16, 2048, 8192, 32, 8, 64),
        "llama-8b" => (32, 4096, 14336, 32, 8, 128),
        _ => return None,
    };
    Some(LlamaConfig {
        arch: crate::gguf::Arch::LLAMA,
        n_layers,
        n_embd,
        n_ff,
        n_head,
        n_head_kv,
        head_dim,
        rope_dim: head_dim,
        rope_freq_base: 100000.0,
        rope_scaling: crate::gguf::RopeScaling::None,
        rms_norm_eps: 1e-5,
        context_length: 8192,
        vocab_size: 49152,
    })
}

/// The shape names [`synth_shape`] knows.
pub const SYNTH_SHAPES: [&str; 3] = ["smollm2-135m", "llama-1b", "llama-8b"];

/// The tensor types of a quantization mix, as [`TinyLlama`]'s type fields
/// take them ([`TinyLlama::with_mix`]).
#[derive(Debug, Clone, PartialEq)]
pub struct QuantMix {
    /// The embedding's type (tied: the head's as well).
    pub embedding_type: GgmlType,
    /// The projections' default type.
    pub matrix_type: GgmlType,
    /// The tensors whose type is not their role's, by name without `.weight`.
    pub matrix_types: Vec<(String, GgmlType)>,
}

/// The mixes `tessera synth --mix` knows.
pub const SYNTH_MIXES: [&str; 1] = ["q4_k_m"];

/// The [`SYNTH_MIXES`] mix `name` for the model `c` (head untied or not).
pub fn synth_mix(name: &str, c: &LlamaConfig, untied_output: bool) -> Option<QuantMix> {
    match name {
        "q4_k_m" => Some(q4_k_m_types(c, untied_output)),
        _ => None,
    }
}

/// llama.cpp's `use_more_bits(i, n)`: layer `i` of `n` is in the first or
/// last eighth, or every third one between (integer division throughout).
fn use_more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// `ty`, or llama.cpp's fallback for a K-quant when the tensor's rows
/// (`width` values, GGUF `dims[0]`) are not whole super-blocks of 256:
/// Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0.
fn k_quant_or_fallback(ty: GgmlType, width: u64) -> GgmlType {
    match ty {
        _ if width.is_multiple_of(256) => ty,
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        other => other,
    }
}

/// llama.cpp's type choice for `Q4_K_M` (`llama_tensor_get_type` with
/// `LLAMA_FTYPE_MOSTLY_Q4_K_M`) for the tensors of the dense model `c`:
/// Q4_K by default; `attn_v` and `ffn_down` of layer `i` of `n` in Q6_K
/// where llama.cpp's `use_more_bits(i, n)` holds (`i < n / 8 || i >= 7 n / 8
/// || (i - n / 8) % 3 == 2`); the head (`output.weight`, or the
/// embedding when tied) in Q6_K, an untied embedding in Q4_K; then each
/// K-quant falls back to Q5_0/Q5_1/Q8_0 (for Q4_K/Q5_K/Q6_K) where the
/// tensor's rows are not a multiple of 256 values. llama.cpp's special cases
/// for Falcon, 70B models, fused QKV and experts do not apply to the shapes
/// written here and are left out.
///
/// SmolLM2-135M (hidden 576, FFN 1536, 30 layers) gets Q, K, O, gate and up
/// in Q5_0, V in Q8_0 or Q5_0 and down in Q6_K or Q4_K by layer, and a tied
/// Q8_0 table, as its published Q4_K_M file has them.
pub fn q4_k_m_types(c: &LlamaConfig, untied_output: bool) -> QuantMix {
    let layer_kind = |name: &str| -> Option<(usize, String)> {
        let (layer, kind) = name.strip_prefix("blk.")?.strip_suffix(".weight")?.split_once('.')?;
        Some((layer.parse().ok()?, kind.to_string()))
    };
    let width = c.n_embd as u64;
    let mut matrix_types = Vec::new();
    if untied_output {
        matrix_types.push(("output".to_string(), k_quant_or_fallback(GgmlType::Q6_K, width)));
    }
    for spec in c.tensors().into_iter().filter(|s| s.role == TensorRole::Matrix) {
        let more_bits = layer_kind(&spec.name).is_some_and(|(i, kind)| {
            (kind == "attn_v" || kind == "ffn_down") && use_more_bits(i, c.n_layers)
        });
        let ty = k_quant_or_fallback(if more_bits { GgmlType::Q6_K } else { GgmlType::Q4_K }, spec.dims[0]);
        if ty != GgmlType::Q4_K {
            let stem = spec.name.strip_suffix(".weight").unwrap_or(&spec.name);
            matrix_types.push((stem.to_string(), ty));
        }
    }
    let table = if untied_output { GgmlType::Q4_K } else { GgmlType::Q6_K };
    QuantMix { embedding_type: k_quant_or_fallback(table, width), matrix_type: GgmlType::Q4_K, matrix_types }
}

/// The architectures `tessera synth --shape` writes as small test models
/// (hidden 256, 4 layers, FFN 512, GQA with head dimension 64, a real
/// vocabulary), each with what its real files have:
///
/// - `llama3`: Llama 3's `rope_freqs.weight` (the `llama3` scaling, factor 8,
///   with an original context of 16 so that it matters at short positions),
///   theta 500000, matrices scaled by 2 (sharper attention), an untied head,
///   Q4_0 matrices; the `llama-bpe` vocabulary.
/// - `mistral`: arch `llama` with a sliding window of 4096 and a 32768
///   context, theta 1e6, an untied head, Q4_1 matrices; the SentencePiece
///   `llama-spm` vocabulary.
/// - `qwen2.5`: arch `qwen2` (QKV biases, NEOX RoPE), theta 1e6, the head tied
///   to the embedding (scale 0.5, matrices scaled by 4 so that the layers,
///   not the token's own embedding, decide), Q8_0 matrices; the `qwen2`
///   vocabulary.
/// - `qwen3`: arch `qwen3` (Q/K head norms, NEOX RoPE), 8 query heads of 64
///   (wider than the hidden size, as Qwen3's `key_length` makes them), an
///   untied head, Q4_1 matrices; the `qwen2` vocabulary.
pub const SYNTH_ARCHS: [&str; 4] = ["llama3", "mistral", "qwen2.5", "qwen3"];

/// The vocabulary file (under `models/vocab/`) of a [`SYNTH_ARCHS`] model.
pub fn synth_arch_vocab(name: &str) -> Option<&'static str> {
    Some(match name {
        "llama3" => "ggml-vocab-llama-bpe.gguf",
        "mistral" => "ggml-vocab-llama-spm.gguf",
        "qwen2.5" | "qwen3" => "ggml-vocab-qwen2.gguf",
        _ => return None,
    })
}

/// Llama 3's RoPE frequency divisors (the converter's `llama3` rule) for
/// `head_dim` and `theta`, with the scaling `factor`, low and high frequency
/// factors and original context `orig`.
pub fn llama3_rope_freqs(
    head_dim: usize,
    theta: f32,
    factor: f32,
    low: f32,
    high: f32,
    orig: f32,
) -> Vec<f32> {
    let (low_wavelen, high_wavelen) = (orig / low, orig / high);
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / theta.powf(2.0 * i as f32 / head_dim as f32);
            let wavelen = 2.0 * std::f32::consts::PI / freq;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (orig / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            }
        })
        .collect()
}

/// The [`SYNTH_ARCHS`] model `name` with `vocab` (its [`synth_arch_vocab`]).
/// The embedding's and head's scales make the top logits stand apart (gaps of
/// a few units), so most greedy positions are clear of ties.
pub fn synth_arch(name: &str, vocab: Vocab) -> Option<TinyLlama> {
    use super::arch::Arch;
    let base = LlamaConfig {
        arch: Arch::LLAMA,
        n_layers: 4,
        n_embd: 256,
        n_ff: 512,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        rope_dim: 64,
        rope_freq_base: 1_000_000.0,
        rope_scaling: super::arch::RopeScaling::None,
        rms_norm_eps: 1e-6,
        context_length: 4096,
        vocab_size: vocab.tokens.len(),
    };
    let model = TinyLlama {
        config: base.clone(),
        seed: 0x5EED_0039,
        embedding_type: GgmlType::Q8_0,
        matrix_type: GgmlType::Q4_1,
        matrix_types: Vec::new(),
        untied_output: true,
        embedding_scale: 1.0,
        vocab: Some(vocab),
        output_scale: 8.0,
        matrix_scale: 1.0,
        rope_freqs: None,
        sliding_window: None,
        name: format!("synthetic {name}"),
    };
    Some(match name {
        "llama3" => TinyLlama {
            config: LlamaConfig {
                rope_freq_base: 500_000.0,
                rms_norm_eps: 1e-5,
                context_length: 8192,
                ..base
            },
            matrix_type: GgmlType::Q4_0,
            // Sharper attention (larger Q/K products) makes positions matter.
            matrix_scale: 2.0,
            // An original context of 16 (Llama 3.1's is 8192) scales most pairs
            // within the short test prompts, so the factors decide tokens.
            rope_freqs: Some(llama3_rope_freqs(64, 500_000.0, 8.0, 1.0, 4.0, 16.0)),
            ..model
        },
        "mistral" => TinyLlama {
            config: LlamaConfig { rms_norm_eps: 1e-5, context_length: 32768, ..base },
            sliding_window: Some(4096),
            ..model
        },
        "qwen2.5" => TinyLlama {
            config: LlamaConfig { arch: Arch::QWEN2, context_length: 32768, ..base },
            matrix_type: GgmlType::Q8_0,
            untied_output: false,
            // Tied: a smaller embedding and larger layer outputs keep the
            // current token's own logit from dominating every prediction.
            embedding_scale: 0.35,
            matrix_scale: 2.0,
            ..model
        },
        "qwen3" => TinyLlama {
            config: LlamaConfig { arch: Arch::QWEN3, n_head: 8, context_length: 40960, ..base },
            ..model
        },
        _ => return None,
    })
}
