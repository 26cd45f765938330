//! The text tokenizer of a GGUF model: GPT-2 style byte-level BPE built with the
//! HF `tokenizers` crate from the file's vocabulary (`tokenizer.ggml.*`, see
//! [`crate::gguf::Vocab`]), plus a streaming, UTF-8-safe [`Detokenizer`].
//!
//! # Matching llama.cpp
//!
//! Encoding reproduces llama.cpp's `llm_tokenizer_bpe` for the supported
//! pre-tokenizers (`tokenizer.ggml.pre`):
//!
//! - `smollm` (and `starcoder`, `refact`, `command-r`, `codeshell`, `exaone`,
//!   `minerva`, which share its regexes in `llama-vocab.cpp`): first `\p{N}`
//!   (every number character is its own piece), then GPT-2's
//!   `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)` on
//!   the remaining text. In `tokenizers` terms: `Digits(individual_digits)`
//!   (which splits on `char::is_numeric`, the Unicode `N` categories) followed
//!   by `ByteLevel` without a prefix space.
//! - `gpt2` (and `mpt`, `olmo`, `jais`, `trillion`, `granite-docling`): GPT-2's
//!   regex alone.
//!
//! Pieces are then merged by BPE rank (`tokenizer.ggml.merges`), with neither
//! `ignore_merges` nor byte fallback, as llama.cpp does for these models.
//! Control tokens (`<|im_start|>`, token type 3) are matched in the text only
//! when `parse_special` is set; user-defined tokens (type 4) always are.
//!
//! # Decoding
//!
//! Each token has a byte string: the GPT-2 byte decoding of normal tokens, the
//! raw text of user-defined tokens, and for control and unknown tokens their
//! raw text only when special tokens are rendered (else nothing), as
//! llama.cpp's `token_to_piece`. Unused and other tokens render as nothing.
//! [`Tokenizer::decode`] joins the bytes and replaces invalid UTF-8 with U+FFFD
//! (`String::from_utf8_lossy`); a [`Detokenizer`] fed the same ids one at a time
//! emits exactly the same text, holding back an incomplete UTF-8 sequence until
//! the bytes that complete (or break) it arrive.

use crate::error::{Error, Result};
use crate::gguf::vocab::gpt2_char_to_byte;
use crate::gguf::{Gguf, TokenType, Vocab};
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{AddedToken, PreTokenizerWrapper};

/// Pre-tokenizers (`tokenizer.ggml.pre`) that use SmolLM2's regexes.
const SMOLLM_LIKE: [&str; 7] =
    ["smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"];
/// Pre-tokenizers that use GPT-2's regex alone.
const GPT2_LIKE: [&str; 6] = ["gpt2", "mpt", "olmo", "jais", "trillion", "granite-docling"];
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

fn tok_err(message: impl std::fmt::Display) -> Error {
    Error::Tokenizer(message.to_string())
}

/// A byte-level BPE tokenizer built from a GGUF vocabulary.
pub struct Tokenizer {
    /// Encodes text, matching control tokens in it.
    with_special: tokenizers::Tokenizer,
    /// Encodes text, treating control tokens as plain text.
    plain: tokenizers::Tokenizer,
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
    /// The tokenizer of a GGUF model file.
    pub fn from_gguf(gguf: &Gguf) -> Result<Tokenizer> {
        Tokenizer::from_vocab(&Vocab::from_metadata(gguf.metadata())?)
    }

    /// Builds the tokenizer of `vocab`: its model must be `gpt2` (byte-level BPE)
    /// with a supported pre-tokenizer (see the module doc).
    pub fn from_vocab(vocab: &Vocab) -> Result<Tokenizer> {
        if vocab.model != "gpt2" {
            return Err(tok_err(format!(
                "tokenizer model `{}` is not supported (only `gpt2`, byte-level BPE)",
                vocab.model
            )));
        }
        let pre = vocab.pre.as_deref().unwrap_or("(none)");
        let digits_first = if SMOLLM_LIKE.contains(&pre) {
            true
        } else if GPT2_LIKE.contains(&pre) {
            false
        } else {
            return Err(tok_err(format!(
                "pre-tokenizer `{pre}` is not supported (supported: {}, {})",
                SMOLLM_LIKE.join(", "),
                GPT2_LIKE.join(", ")
            )));
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
            .ignore_merges(false)
            .build()
            .map_err(|e| tok_err(format!("building the BPE model: {e}")))?;

        let mut steps = Vec::new();
        if digits_first {
            steps.push(PreTokenizerWrapper::Digits(Digits::new(true)));
        }
        steps.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true)));
        let mut hf = tokenizers::Tokenizer::new(bpe);
        hf.with_pre_tokenizer(Some(Sequence::new(steps)));
        hf.with_decoder(Some(ByteLevel::new(false, true, true)));
        let mut control = Vec::new();
        let mut user = Vec::new();
        for (t, ty) in vocab.tokens.iter().zip(&vocab.token_types) {
            match ty {
                TokenType::Control | TokenType::Unknown => control.push(AddedToken::from(t.clone(), true)),
                TokenType::UserDefined => user.push(AddedToken::from(t.clone(), false).normalized(false)),
                _ => {}
            }
        }
        hf.add_special_tokens(&control);
        hf.add_tokens(&user);
        let mut plain = hf.clone();
        plain.set_encode_special_tokens(true);

        let mut pieces = Vec::with_capacity(vocab.tokens.len());
        let mut special_only = Vec::with_capacity(vocab.tokens.len());
        for (t, ty) in vocab.tokens.iter().zip(&vocab.token_types) {
            let (bytes, special) = match ty {
                TokenType::Normal => (byte_decode(t), false),
                TokenType::UserDefined => (t.as_bytes().to_vec(), false),
                TokenType::Control | TokenType::Unknown => (t.as_bytes().to_vec(), true),
                TokenType::Undefined | TokenType::Unused | TokenType::Byte => (Vec::new(), false),
            };
            pieces.push(bytes);
            special_only.push(special);
        }

        let mut eog: Vec<u32> = [vocab.eos, vocab.eot].into_iter().flatten().collect();
        for (i, (t, ty)) in vocab.tokens.iter().zip(&vocab.token_types).enumerate() {
            if matches!(ty, TokenType::Control | TokenType::UserDefined) && EOG_TEXTS.contains(&t.as_str()) {
                eog.push(i as u32);
            }
        }
        eog.sort_unstable();
        eog.dedup();

        Ok(Tokenizer {
            with_special: hf,
            plain,
            pieces,
            special_only,
            bos: vocab.bos,
            eos: vocab.eos,
            add_bos: vocab.add_bos,
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
        let hf = if parse_special { &self.with_special } else { &self.plain };
        let encoding = hf.encode(text, false).map_err(|e| tok_err(format!("encoding failed: {e}")))?;
        Ok(encoding.get_ids().to_vec())
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
    /// `parse_special`, for cross-checks.
    pub fn hf(&self) -> &tokenizers::Tokenizer {
        &self.with_special
    }
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
