//! The text tokenizer of a GGUF model, built from the file's vocabulary
//! (`tokenizer.ggml.*`, see [`crate::gguf::Vocab`]) to give llama.cpp's ids,
//! plus a streaming, UTF-8-safe [`Detokenizer`].
//!
//! # Vocabulary types
//!
//! - `tokenizer.ggml.model = "gpt2"`: byte-level BPE through the HF
//!   `tokenizers` crate, reproducing llama.cpp's `llm_tokenizer_bpe`. The
//!   pre-tokenizer (`tokenizer.ggml.pre`) picks llama.cpp's regexes (see
//!   `tokenizer/pre.rs`): SmolLM2's family (`smollm`, `starcoder`, ...: first `\p{N}`, each
//!   number character its own piece, then GPT-2's regex; in `tokenizers` terms
//!   `Digits(individual_digits)` then `ByteLevel`), GPT-2's regex alone
//!   (`gpt-2`, `mpt`, `olmo`, ...), Llama 3's (`llama-bpe`, `llama3`, ...,
//!   with `ignore_merges`), Qwen2's (`qwen2`, ...), Qwen3.5's (`qwen35`),
//!   DeepSeek LLM's (`deepseek-llm`) and DeepSeek Coder's
//!   (`deepseek-coder`). Pieces are merged by BPE rank
//!   (`tokenizer.ggml.merges`), without byte fallback.
//! - `tokenizer.ggml.model = "llama"`: SentencePiece (Llama 2, Phi-3, ...) as
//!   llama.cpp's `llm_tokenizer_spm` (see `tokenizer/spm.rs`): spaces become `▁`, a `▁` is
//!   prepended to each text fragment that starts the text or follows a special
//!   token (`add_space_prefix`, default true), pieces merge by token score and
//!   characters without a token become byte tokens `<0xNN>`.
//!
//! Any other model or pre-tokenizer name is an error naming it and listing the
//! supported ones.
//!
//! Control tokens (`<|im_start|>`, token type 3) are matched in the text only
//! when `parse_special` is set; user-defined tokens (type 4) always are.
//! [`Tokenizer::encode_prompt`] adds BOS when the vocabulary asks for it, with
//! llama.cpp's default when `add_bos_token` is absent (true for SentencePiece
//! and Llama 3, false otherwise).
//!
//! # Decoding
//!
//! Each token has a byte string, as llama.cpp's `token_to_piece`: the GPT-2
//! byte decoding of normal BPE tokens, the text of normal SentencePiece tokens
//! with `▁` as a space, the byte of byte tokens (`<0x0A>`), the raw text of
//! user-defined tokens, and for control and unknown tokens their raw text only
//! when special tokens are rendered (else nothing). Unused and undefined
//! tokens render as nothing. [`Tokenizer::decode`] joins the bytes and replaces
//! invalid UTF-8 with U+FFFD (`String::from_utf8_lossy`); a [`Detokenizer`] fed
//! the same ids one at a time emits exactly the same text, holding back an
//! incomplete UTF-8 sequence until the bytes that complete (or break) it
//! arrive.

use crate::error::{Error, Result};
use crate::gguf::vocab::gpt2_char_to_byte;
use crate::gguf::{Gguf, TokenType, Vocab};
use spm::{Fragment, Special, Spm};
use tokenizers::AddedToken;
use tokenizers::models::bpe::BPE;

pub(crate) mod pre;
pub(crate) mod spm;

/// Texts of control tokens that end generation (llama.cpp's end-of-generation
/// heuristics), in addition to the EOS and EOT ids.
const EOG_TEXTS: [&str; 8] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
];

/// Texts of tokens llama.cpp always treats as control tokens, whatever their
/// stored type (its end-of-turn, fill-in-the-middle and end-of-generation
/// token detection): not matched in text without `parse_special`, rendered
/// only when special tokens are (Phi-3's user-defined `</s>`, Qwen2's normal
/// `</s>`).
const CONTROL_TEXTS: [&str; 57] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
    "<end_of_utterance>",
    "<|eom_id|>",
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<\u{ff5c}fim\u{2581}begin\u{ff5c}>",
    "<PRE>",
    "\u{2581}<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<\u{ff5c}fim\u{2581}hole\u{ff5c}>",
    "<SUF>",
    "\u{2581}<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<\u{ff5c}fim\u{2581}end\u{ff5c}>",
    "<MID>",
    "\u{2581}<MID>",
    "<|code_middle|>",
    "<|middle|>",
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<PAD>",
    "[PAD]",
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
    "<|file_sep|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "</s>",
    "[EOS]",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "[e~[",
];

/// The type llama.cpp gives a token: its stored type, but
/// [`TokenType::Control`] for the texts of [`CONTROL_TEXTS`].
fn effective_type(text: &str, ty: TokenType) -> TokenType {
    if ty != TokenType::Unknown && CONTROL_TEXTS.contains(&text) { TokenType::Control } else { ty }
}

/// The supported `tokenizer.ggml.model` values.
const MODELS: &str = "gpt2 (byte-level BPE), llama (SentencePiece)";

/// SentencePiece's space marker.
const SPACE_MARK: &str = "\u{2581}";

fn tok_err(message: impl std::fmt::Display) -> Error {
    Error::Tokenizer(message.to_string())
}

/// How text becomes ids.
enum Encoder {
    /// Byte-level BPE through `tokenizers`.
    Bpe {
        /// Encodes text, matching control tokens in it.
        with_special: Box<tokenizers::Tokenizer>,
        /// Encodes text, treating control tokens as plain text.
        plain: Box<tokenizers::Tokenizer>,
    },
    /// SentencePiece.
    Spm {
        spm: Spm,
        /// Tokens matched as a whole in the text, longest first.
        specials: Vec<Special>,
        add_space_prefix: bool,
    },
}

/// A tokenizer built from a GGUF vocabulary.
pub struct Tokenizer {
    encoder: Encoder,
    /// The bytes each token renders as.
    pieces: Vec<Vec<u8>>,
    /// Whether a token renders only when special tokens are rendered.
    special_only: Vec<bool>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    eog: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.pieces.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eog", &self.eog)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// The tokenizer of a GGUF model file (its `general.name` selects
    /// llama.cpp's per-model token attributes, as for Phi-3).
    pub fn from_gguf(gguf: &Gguf) -> Result<Tokenizer> {
        let name = gguf.metadata().get_str("general.name").ok().flatten();
        Tokenizer::build(&Vocab::from_metadata(gguf.metadata())?, name)
    }

    /// Builds the tokenizer of `vocab`: its model must be `gpt2` (byte-level
    /// BPE) with a supported pre-tokenizer, or `llama` (SentencePiece); see the
    /// module doc.
    pub fn from_vocab(vocab: &Vocab) -> Result<Tokenizer> {
        Tokenizer::build(vocab, None)
    }

    fn build(vocab: &Vocab, model_name: Option<&str>) -> Result<Tokenizer> {
        let (encoder, default_add_bos, bos, eos) = match vocab.model.as_str() {
            "gpt2" => {
                let (encoder, add_bos) = bpe_encoder(vocab)?;
                (encoder, add_bos, vocab.bos, vocab.eos)
            }
            "llama" => {
                let encoder = spm_encoder(vocab, model_name)?;
                // llama.cpp's defaults for SentencePiece when the keys are absent.
                let n = vocab.tokens.len() as u32;
                let default = |id: u32| (id < n).then_some(id);
                (encoder, true, vocab.bos.or(default(1)), vocab.eos.or(default(2)))
            }
            other => {
                return Err(tok_err(format!(
                    "tokenizer model `{other}` (tokenizer.ggml.model) is not supported (supported: {MODELS})"
                )));
            }
        };
        let spm = matches!(encoder, Encoder::Spm { .. });

        let mut pieces = Vec::with_capacity(vocab.tokens.len());
        let mut special_only = Vec::with_capacity(vocab.tokens.len());
        for (t, &ty) in vocab.tokens.iter().zip(&vocab.token_types) {
            let (bytes, special) = match effective_type(t, ty) {
                TokenType::Normal if spm => (t.replace(SPACE_MARK, " ").into_bytes(), false),
                TokenType::Normal => (byte_decode(t), false),
                TokenType::Byte => (byte_token(t).map(|b| vec![b]).unwrap_or_default(), false),
                TokenType::UserDefined => (t.as_bytes().to_vec(), false),
                TokenType::Control | TokenType::Unknown => (t.as_bytes().to_vec(), true),
                TokenType::Undefined | TokenType::Unused => (Vec::new(), false),
            };
            pieces.push(bytes);
            special_only.push(special);
        }

        let mut eog: Vec<u32> = [eos, vocab.eot].into_iter().flatten().collect();
        for (i, (t, ty)) in vocab.tokens.iter().zip(&vocab.token_types).enumerate() {
            if matches!(ty, TokenType::Control | TokenType::UserDefined) && EOG_TEXTS.contains(&t.as_str()) {
                eog.push(i as u32);
            }
        }
        eog.sort_unstable();
        eog.dedup();

        Ok(Tokenizer {
            encoder,
            pieces,
            special_only,
            bos,
            eos,
            add_bos: vocab.add_bos.unwrap_or(default_add_bos),
            add_eos: vocab.add_eos,
            eog,
        })
    }

    /// Number of tokens.
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// The beginning-of-sequence token, if the vocabulary has one.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence token, if the vocabulary has one.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// Whether a prompt starts with BOS (`add_bos_token`, or llama.cpp's
    /// default for the vocabulary type when absent).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `id` ends generation (EOS, EOT, or a control token such as
    /// `<|im_end|>` or `<|endoftext|>`).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// The end-of-generation tokens, sorted.
    pub fn eog_tokens(&self) -> &[u32] {
        &self.eog
    }

    /// Token ids of `text`, with no BOS or EOS added. With `parse_special`,
    /// control tokens written in the text (`<|im_start|>`) become their ids;
    /// without, they are tokenized as plain text.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        match &self.encoder {
            Encoder::Bpe { with_special, plain } => {
                let hf = if parse_special { with_special } else { plain };
                let encoding =
                    hf.encode(text, false).map_err(|e| tok_err(format!("encoding failed: {e}")))?;
                Ok(encoding.get_ids().to_vec())
            }
            Encoder::Spm { spm, specials, add_space_prefix } => {
                let mut ids = Vec::new();
                let mut prev_special = true;
                for fragment in spm::partition(text, specials, parse_special) {
                    match fragment {
                        Fragment::Token(id) => {
                            ids.push(id);
                            prev_special = true;
                        }
                        Fragment::Text(t) => {
                            let mut escaped = String::with_capacity(t.len() + 3);
                            if *add_space_prefix && prev_special {
                                escaped.push_str(SPACE_MARK);
                            }
                            escaped.push_str(&t.replace(' ', SPACE_MARK));
                            spm.encode(&escaped, &mut ids);
                            prev_special = false;
                        }
                    }
                }
                Ok(ids)
            }
        }
    }

    /// Token ids of a prompt as llama.cpp's completion API makes them: control
    /// tokens parsed, BOS/EOS added when the vocabulary asks for them
    /// (`add_bos_token`, `add_eos_token`; SmolLM2 asks for neither).
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        if self.add_bos
            && let Some(bos) = self.bos
        {
            ids.push(bos);
        }
        ids.extend(self.encode(text, true)?);
        if self.add_eos
            && let Some(eos) = self.eos
        {
            ids.push(eos);
        }
        Ok(ids)
    }

    /// The id of the token whose text (as stored in the vocabulary) is `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        match &self.encoder {
            Encoder::Bpe { with_special, .. } => with_special.token_to_id(text),
            Encoder::Spm { spm, .. } => spm.id(text),
        }
    }

    /// The bytes token `id` renders as (empty for control tokens unless
    /// `special`); an id outside the vocabulary is an error.
    pub fn token_bytes(&self, id: u32, special: bool) -> Result<&[u8]> {
        let i = id as usize;
        let bytes = self.pieces.get(i).ok_or_else(|| {
            tok_err(format!("token id {id} is outside the vocabulary of {} tokens", self.pieces.len()))
        })?;
        Ok(if self.special_only[i] && !special { &[] } else { bytes })
    }

    /// The text of `ids`; invalid UTF-8 becomes U+FFFD. Control tokens render as
    /// their text only when `special` is set.
    pub fn decode(&self, ids: &[u32], special: bool) -> Result<String> {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.token_bytes(id, special)?);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// A streaming decoder over this vocabulary.
    pub fn detokenizer(&self, special: bool) -> Detokenizer<'_> {
        Detokenizer { tokenizer: self, special, utf8: Utf8Stream::default() }
    }

    /// The HF `tokenizers` pipeline behind [`Tokenizer::encode`] with
    /// `parse_special` for byte-level BPE vocabularies (`None` for
    /// SentencePiece), for cross-checks.
    pub fn hf(&self) -> Option<&tokenizers::Tokenizer> {
        match &self.encoder {
            Encoder::Bpe { with_special, .. } => Some(with_special),
            Encoder::Spm { .. } => None,
        }
    }
}

/// The byte-level BPE encoder of `vocab` and llama.cpp's default `add_bos`
/// for its pre-tokenizer.
fn bpe_encoder(vocab: &Vocab) -> Result<(Encoder, bool)> {
    let (pre_tokenizer, flags) = match vocab.pre.as_deref() {
        Some(name) => pre::lookup(name).ok_or_else(|| {
            tok_err(format!(
                "pre-tokenizer `{name}` (tokenizer.ggml.pre) is not supported (supported: {})",
                pre::supported_names()
            ))
        })?,
        None => {
            return Err(tok_err(format!(
                "the vocabulary names no pre-tokenizer (tokenizer.ggml.pre), which is not supported \
                 (llama.cpp falls back to a default that degrades quality; supported: {})",
                pre::supported_names()
            )));
        }
    };

    // Token ids: llama.cpp keeps the last id of a duplicated token string.
    let token_ids: tokenizers::models::bpe::Vocab =
        vocab.tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let merges = vocab
        .merges
        .iter()
        .enumerate()
        .map(|(rank, m)| {
            // As llama.cpp: split at the first space after the first byte.
            match m.char_indices().skip(1).find(|&(_, c)| c == ' ') {
                Some((i, _)) => Ok((m[..i].to_string(), m[i + 1..].to_string())),
                None => Err(tok_err(format!("merge {rank} `{m}` has no space separating its two parts"))),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(token_ids, merges)
        .byte_fallback(false)
        .ignore_merges(flags.ignore_merges)
        .build()
        .map_err(|e| tok_err(format!("building the BPE model: {e}")))?;

    let mut hf = tokenizers::Tokenizer::new(bpe);
    hf.with_pre_tokenizer(Some(pre_tokenizer.build().map_err(|e| tok_err(format!("pre-tokenizer: {e}")))?));
    hf.with_decoder(Some(tokenizers::pre_tokenizers::byte_level::ByteLevel::new(false, true, true)));
    let mut control = Vec::new();
    let mut user = Vec::new();
    for (t, &ty) in vocab.tokens.iter().zip(&vocab.token_types) {
        match effective_type(t, ty) {
            TokenType::Control | TokenType::Unknown => control.push(AddedToken::from(t.clone(), true)),
            TokenType::UserDefined => user.push(AddedToken::from(t.clone(), false).normalized(false)),
            _ => {}
        }
    }
    hf.add_special_tokens(&control);
    hf.add_tokens(&user);
    let mut plain = hf.clone();
    plain.set_encode_special_tokens(true);
    Ok((Encoder::Bpe { with_special: Box::new(hf), plain: Box::new(plain) }, flags.add_bos))
}

/// The SentencePiece encoder of `vocab`. `model_name` (`general.name`) gives
/// Phi-3's special tokens llama.cpp's `rstrip` attribute.
fn spm_encoder(vocab: &Vocab, model_name: Option<&str>) -> Result<Encoder> {
    if vocab.scores.len() != vocab.tokens.len() {
        return Err(tok_err(format!(
            "a SentencePiece vocabulary needs one score per token (tokenizer.ggml.scores): {} scores for {} tokens",
            vocab.scores.len(),
            vocab.tokens.len()
        )));
    }
    let name = model_name.unwrap_or_default().to_lowercase();
    let phi3 = name.contains("phi-3") || name.contains("phi3");
    let mut specials: Vec<Special> = vocab
        .tokens
        .iter()
        .zip(&vocab.token_types)
        .enumerate()
        .map(|(i, (t, &ty))| (i, t, effective_type(t, ty)))
        .filter(|(_, t, ty)| {
            !t.is_empty() && matches!(ty, TokenType::Control | TokenType::Unknown | TokenType::UserDefined)
        })
        .map(|(i, t, ty)| Special {
            id: i as u32,
            text: t.clone(),
            needs_parse_special: ty != TokenType::UserDefined,
            rstrip: phi3 && !matches!(t.as_str(), "<unk>" | "<s>" | "<|endoftext|>"),
        })
        .collect();
    // Longest first (a stable sort: among equal lengths, by id).
    specials.sort_by_key(|s| std::cmp::Reverse(s.text.len()));
    Ok(Encoder::Spm {
        spm: Spm::new(&vocab.tokens, &vocab.scores, vocab.unk),
        specials,
        add_space_prefix: vocab.add_space_prefix.unwrap_or(true),
    })
}

/// The byte of a byte token's text `<0xNN>`.
fn byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    u8::from_str_radix(hex, 16).ok()
}

/// GPT-2 byte decoding of a normal token's text; a token with a character
/// outside the byte table keeps its raw UTF-8 (as HF's ByteLevel decoder).
fn byte_decode(token: &str) -> Vec<u8> {
    token
        .chars()
        .map(gpt2_char_to_byte)
        .collect::<Option<Vec<u8>>>()
        .unwrap_or_else(|| token.as_bytes().to_vec())
}

/// Streaming detokenization: feed token ids one at a time, get the text they
/// complete. Only whole UTF-8 characters are emitted; the bytes of a character
/// split across tokens are held back until it is complete. The concatenation
/// of every [`Detokenizer::push`] and the final [`Detokenizer::finish`] equals
/// [`Tokenizer::decode`] of the same ids.
#[derive(Debug)]
pub struct Detokenizer<'t> {
    tokenizer: &'t Tokenizer,
    special: bool,
    utf8: Utf8Stream,
}

impl Detokenizer<'_> {
    /// Adds token `id` and returns the text that is now complete (possibly
    /// empty). Invalid UTF-8 is emitted as U+FFFD as soon as it is known to be
    /// invalid.
    pub fn push(&mut self, id: u32) -> Result<String> {
        Ok(self.utf8.push(self.tokenizer.token_bytes(id, self.special)?))
    }

    /// Whether bytes of an incomplete character are held back.
    pub fn has_pending(&self) -> bool {
        self.utf8.has_pending()
    }

    /// Ends the stream: held-back bytes (an incomplete character) become U+FFFD.
    pub fn finish(&mut self) -> String {
        self.utf8.finish()
    }
}

/// Incremental UTF-8 decoding of byte chunks: only whole characters come
/// out; the bytes of a character split across chunks are held back until it
/// is complete; invalid bytes become U+FFFD as soon as they are known to be
/// invalid.
#[derive(Debug, Default)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// Adds `bytes` and returns the characters now complete.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(&String::from_utf8_lossy(&self.pending[..valid]));
                    match e.error_len() {
                        // An incomplete sequence at the end: hold it back.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + n);
                        }
                    }
                }
            }
        }
    }

    /// Whether bytes of an incomplete character are held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Ends the stream: an incomplete character becomes U+FFFD.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod vocab_tests;
