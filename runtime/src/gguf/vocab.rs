//! The tokenizer vocabulary stored in GGUF metadata (`tokenizer.ggml.*` and
//! `tokenizer.chat_template`), read into a validated [`Vocab`] and written back,
//! plus GPT-2's byte-to-character table, which defines how byte-level BPE
//! (`tokenizer.ggml.model = "gpt2"`) spells token bytes as text.
//!
//! Invariants of a [`Vocab`] from [`Vocab::from_metadata`]: `token_types` has one
//! entry per token, `scores` none or one per token, every special-token id is
//! below the token count, and the token list is non-empty. Merges are kept as
//! stored (`"left right"`); the tokenizer parses them.

use super::metadata::Metadata;
use super::types::{Array, Value};
use super::writer::GgufWriter;
use super::{GgufError, Result};

/// `tokenizer.ggml.model` (`"gpt2"` for byte-level BPE).
pub const KEY_MODEL: &str = "tokenizer.ggml.model";
/// `tokenizer.ggml.pre`: the pre-tokenizer name (`"smollm"`, ...).
pub const KEY_PRE: &str = "tokenizer.ggml.pre";
/// `tokenizer.ggml.tokens`: the token strings, by id.
pub const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
/// `tokenizer.ggml.token_type`: the [`TokenType`] of each token (`i32`).
pub const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
/// `tokenizer.ggml.scores`: SentencePiece token scores (`f32`, or `i32`).
pub const KEY_SCORES: &str = "tokenizer.ggml.scores";
/// `tokenizer.ggml.merges`: BPE merges by rank, `"left right"`.
pub const KEY_MERGES: &str = "tokenizer.ggml.merges";
/// `tokenizer.ggml.bos_token_id`.
pub const KEY_BOS: &str = "tokenizer.ggml.bos_token_id";
/// `tokenizer.ggml.eos_token_id`.
pub const KEY_EOS: &str = "tokenizer.ggml.eos_token_id";
/// `tokenizer.ggml.eot_token_id` (end of turn, optional).
pub const KEY_EOT: &str = "tokenizer.ggml.eot_token_id";
/// `tokenizer.ggml.unknown_token_id`.
pub const KEY_UNK: &str = "tokenizer.ggml.unknown_token_id";
/// `tokenizer.ggml.padding_token_id`.
pub const KEY_PAD: &str = "tokenizer.ggml.padding_token_id";
/// `tokenizer.ggml.add_bos_token`.
pub const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
/// `tokenizer.ggml.add_eos_token`.
pub const KEY_ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
/// `tokenizer.ggml.add_space_prefix`.
pub const KEY_ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
/// `tokenizer.chat_template`: the Jinja chat template.
pub const KEY_CHAT_TEMPLATE: &str = "tokenizer.chat_template";

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenType {
    /// 0: undefined.
    Undefined,
    /// 1: an ordinary token.
    Normal,
    /// 2: the unknown token.
    Unknown,
    /// 3: a control token (`<|im_start|>`), special: rendered only on request.
    Control,
    /// 4: a user-defined token, always matched as a whole in text.
    UserDefined,
    /// 5: unused.
    Unused,
    /// 6: a byte token (`<0x0A>`, SentencePiece byte fallback).
    Byte,
}

impl TokenType {
    /// The type with id `id`, or `None` outside 0..=6.
    pub fn from_id(id: i128) -> Option<TokenType> {
        use TokenType::*;
        Some(match id {
            0 => Undefined,
            1 => Normal,
            2 => Unknown,
            3 => Control,
            4 => UserDefined,
            5 => Unused,
            6 => Byte,
            _ => return None,
        })
    }

    /// The stored id.
    pub fn id(self) -> i32 {
        self as i32
    }
}

/// A tokenizer vocabulary as stored in GGUF.
#[derive(Debug, Clone, PartialEq)]
pub struct Vocab {
    /// `tokenizer.ggml.model` (`"gpt2"`, `"llama"`, ...).
    pub model: String,
    /// `tokenizer.ggml.pre`, if present.
    pub pre: Option<String>,
    /// Token strings by id.
    pub tokens: Vec<String>,
    /// Token types by id (all [`TokenType::Normal`] when the key is absent).
    pub token_types: Vec<TokenType>,
    /// BPE merges by rank, as stored (`"left right"`).
    pub merges: Vec<String>,
    /// Token scores by id (SentencePiece's merge priorities), empty when the
    /// key is absent.
    pub scores: Vec<f32>,
    /// Beginning-of-sequence token.
    pub bos: Option<u32>,
    /// End-of-sequence token.
    pub eos: Option<u32>,
    /// End-of-turn token.
    pub eot: Option<u32>,
    /// Unknown token.
    pub unk: Option<u32>,
    /// Padding token.
    pub pad: Option<u32>,
    /// `add_bos_token`, if present (the tokenizer applies llama.cpp's default
    /// per tokenizer model when absent).
    pub add_bos: Option<bool>,
    /// Whether encoding adds EOS (`add_eos_token`, default false).
    pub add_eos: bool,
    /// `add_space_prefix`, if present.
    pub add_space_prefix: Option<bool>,
    /// The Jinja chat template, if present.
    pub chat_template: Option<String>,
}

impl Vocab {
    /// Reads and validates the vocabulary keys of `md`.
    pub fn from_metadata(md: &Metadata) -> Result<Vocab> {
        let tokens = md.require_strings(KEY_TOKENS)?.to_vec();
        if tokens.is_empty() {
            return Err(invalid(KEY_TOKENS, "the token list is empty."));
        }
        let token_types = match md.get_array(KEY_TOKEN_TYPE)? {
            None => vec![TokenType::Normal; tokens.len()],
            Some(a) => {
                let ids = a.to_i128_vec().ok_or_else(|| GgufError::WrongType {
                    key: KEY_TOKEN_TYPE.to_string(),
                    expected: "array of integers",
                    found: format!("array of {}", a.element_type()),
                })?;
                if ids.len() != tokens.len() {
                    return Err(invalid(
                        KEY_TOKEN_TYPE,
                        &format!("{} entries for {} tokens.", ids.len(), tokens.len()),
                    ));
                }
                ids.iter()
                    .enumerate()
                    .map(|(i, &t)| {
                        TokenType::from_id(t).ok_or_else(|| {
                            invalid(KEY_TOKEN_TYPE, &format!("token {i} has unknown type {t}."))
                        })
                    })
                    .collect::<Result<_>>()?
            }
        };
        let scores = match md.get_array(KEY_SCORES)? {
            None => Vec::new(),
            Some(Array::F32(v)) => v.clone(),
            Some(Array::I32(v)) => v.iter().map(|&x| x as f32).collect(),
            Some(a) => {
                return Err(GgufError::WrongType {
                    key: KEY_SCORES.to_string(),
                    expected: "array of f32 or i32",
                    found: format!("array of {}", a.element_type()),
                });
            }
        };
        if !scores.is_empty() && scores.len() != tokens.len() {
            return Err(invalid(
                KEY_SCORES,
                &format!("{} entries for {} tokens.", scores.len(), tokens.len()),
            ));
        }
        let merges = match md.get(KEY_MERGES) {
            None => Vec::new(),
            Some(_) => md.require_strings(KEY_MERGES)?.to_vec(),
        };
        let id = |key: &str| -> Result<Option<u32>> {
            match md.get_u32(key)? {
                Some(i) if i as usize >= tokens.len() => {
                    Err(invalid(key, &format!("token id {i} is outside the {} tokens.", tokens.len())))
                }
                other => Ok(other),
            }
        };
        Ok(Vocab {
            model: md.require_str(KEY_MODEL)?.to_string(),
            pre: md.get_str(KEY_PRE)?.map(str::to_string),
            bos: id(KEY_BOS)?,
            eos: id(KEY_EOS)?,
            eot: id(KEY_EOT)?,
            unk: id(KEY_UNK)?,
            pad: id(KEY_PAD)?,
            add_bos: md.get_bool(KEY_ADD_BOS)?,
            add_eos: md.get_bool(KEY_ADD_EOS)?.unwrap_or(false),
            add_space_prefix: md.get_bool(KEY_ADD_SPACE_PREFIX)?,
            chat_template: md.get_str(KEY_CHAT_TEMPLATE)?.map(str::to_string),
            tokens,
            token_types,
            merges,
            scores,
        })
    }

    /// Writes the vocabulary keys in the order of SmolLM2's file.
    pub fn write_metadata(&self, w: &mut GgufWriter) -> Result<()> {
        if let Some(b) = self.add_space_prefix {
            w.set(KEY_ADD_SPACE_PREFIX, b)?;
        }
        if let Some(b) = self.add_bos {
            w.set(KEY_ADD_BOS, b)?;
        }
        if self.add_eos {
            w.set(KEY_ADD_EOS, true)?;
        }
        w.set(KEY_MODEL, self.model.as_str())?;
        if let Some(pre) = &self.pre {
            w.set(KEY_PRE, pre.as_str())?;
        }
        w.set(KEY_TOKENS, Array::String(self.tokens.clone()))?;
        w.set(KEY_TOKEN_TYPE, Array::I32(self.token_types.iter().map(|t| t.id()).collect()))?;
        if !self.scores.is_empty() {
            w.set(KEY_SCORES, Array::F32(self.scores.clone()))?;
        }
        w.set(KEY_MERGES, Array::String(self.merges.clone()))?;
        for (key, id) in [
            (KEY_BOS, self.bos),
            (KEY_EOS, self.eos),
            (KEY_EOT, self.eot),
            (KEY_UNK, self.unk),
            (KEY_PAD, self.pad),
        ] {
            if let Some(id) = id {
                w.set(key, Value::U32(id))?;
            }
        }
        if let Some(t) = &self.chat_template {
            w.set(KEY_CHAT_TEMPLATE, t.as_str())?;
        }
        Ok(())
    }
}

fn invalid(key: &str, message: &str) -> GgufError {
    GgufError::InvalidValue { key: key.to_string(), message: message.to_string() }
}

const fn gpt2_printable(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// Code point of each byte's character (see [`gpt2_byte_to_char`]).
const BYTE_TO_CHAR: [u16; 256] = {
    let mut table = [0u16; 256];
    let (mut b, mut next) = (0usize, 0x100u16);
    while b < 256 {
        if gpt2_printable(b as u8) {
            table[b] = b as u16;
        } else {
            table[b] = next;
            next += 1;
        }
        b += 1;
    }
    table
};

/// One past the largest code point of the table (0x100 + 68 non-printable bytes).
const CHAR_LIMIT: usize = 0x144;

/// The byte of each code point below [`CHAR_LIMIT`], or -1.
const CHAR_TO_BYTE: [i16; CHAR_LIMIT] = {
    let mut table = [-1i16; CHAR_LIMIT];
    let mut b = 0usize;
    while b < 256 {
        table[BYTE_TO_CHAR[b] as usize] = b as i16;
        b += 1;
    }
    table
};

/// GPT-2's byte-to-character table: printable Latin-1 bytes (`!`..=`~`,
/// `¡`..=`¬`, `®`..=`ÿ`) map to themselves, the other 68 bytes to U+0100 and up
/// in byte order (so space is `Ġ`, newline `Ċ`).
pub fn gpt2_byte_to_char(b: u8) -> char {
    // Every entry is below 0x144, a valid scalar value.
    char::from_u32(u32::from(BYTE_TO_CHAR[b as usize])).unwrap_or(char::REPLACEMENT_CHARACTER)
}

/// The inverse of [`gpt2_byte_to_char`]; `None` for characters outside the table.
pub fn gpt2_char_to_byte(c: char) -> Option<u8> {
    let b = *CHAR_TO_BYTE.get(c as usize)?;
    u8::try_from(b).ok()
}
