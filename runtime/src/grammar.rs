//! Grammar-constrained decoding (structured output) on top of the
//! `llguidance` grammar engine: JSON schemas, `json_object`, regular
//! expressions and Lark grammars (llguidance's Lark variant, which also takes
//! GBNF-style `{m,n}` repeats and `%json` schemas inside a grammar).
//!
//! - [`GrammarCompiler`] is built once per tokenizer: it turns every token
//!   into its bytes (the token trie `llguidance` walks) and compiles a
//!   [`GrammarSpec`] into a [`Constraint`]. Control and end-of-generation
//!   tokens get `llguidance`'s special-token marker byte in front, so grammar
//!   text never matches them; the end of the grammar is the trie's EOS token.
//! - A [`Constraint`] is one request's parser state. It follows the request's
//!   committed output tokens only ([`Constraint::consume`]): preemption and
//!   recompute, the prefix cache and batching never touch it. Speculative
//!   drafts are checked against it ([`Constraint::valid_prefix`]) and the
//!   masks of verification rows are computed on the drafts with a rollback.
//! - [`Constraint::fill_mask`] writes the row's bitmask (one bit per token,
//!   bit `t % 32` of word `t / 32`, as the `apply_token_mask` kernel reads
//!   it): the grammar's allowed tokens, plus the request's stop tokens exactly
//!   when the grammar accepts here (so EOS is only sampled on complete
//!   output). It reports a row that allows nothing at all, which the engine
//!   ends with [`crate::scheduler::FinishReason::Grammar`] instead of
//!   sampling.
//!
//! Errors: an invalid schema, regex or grammar is an [`Error::Usage`] with
//! `llguidance`'s reason, raised when the request is built (a server answers
//! it with a 400).

use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use std::sync::Arc;

/// What a constrained request's output must match.
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarSpec {
    /// A JSON schema (llguidance's JSON-schema subset; unsupported keywords
    /// are errors). Output is laid out as [`json_layout`] says.
    JsonSchema(serde_json::Value),
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// A regular expression (Rust `regex` syntax) the whole output matches.
    Regex(String),
    /// A grammar in llguidance's Lark syntax (`start` is the start rule).
    Lark(String),
}

impl GrammarSpec {
    /// A short name of the kind of constraint, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            GrammarSpec::JsonSchema(_) => "JSON schema",
            GrammarSpec::JsonObject => "JSON object",
            GrammarSpec::Regex(_) => "regex",
            GrammarSpec::Lark(_) => "Lark grammar",
        }
    }

    fn top_level(&self) -> TopLevelGrammar {
        match self {
            GrammarSpec::JsonSchema(v) => TopLevelGrammar::from_json_schema(json_layout(v)),
            GrammarSpec::JsonObject => {
                TopLevelGrammar::from_json_schema(json_layout(&serde_json::json!({"type": "object"})))
            }
            GrammarSpec::Regex(r) => TopLevelGrammar::from_regex(r),
            GrammarSpec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        }
    }
}

/// The JSON layout of constrained output: `", "` between items, `": "`
/// between a key and its value, and no other whitespace, so that a schema
/// whose strings, arrays and objects are bounded bounds the output too (free
/// whitespace would let a model pad forever). A schema's own `x-guidance`
/// options win. A boolean schema becomes its object form.
fn json_layout(schema: &serde_json::Value) -> serde_json::Value {
    let mut v = match schema {
        serde_json::Value::Bool(true) => serde_json::json!({}),
        serde_json::Value::Bool(false) => serde_json::json!({"not": {}}),
        other => other.clone(),
    };
    if let Some(obj) = v.as_object_mut()
        && !obj.contains_key("x-guidance")
    {
        obj.insert(
            "x-guidance".into(),
            serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    v
}

/// Compiles grammars for one tokenizer (see the module doc).
pub struct GrammarCompiler {
    factory: ParserFactory,
    vocab: usize,
    eos: u32,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler").field("vocab", &self.vocab).field("eos", &self.eos).finish()
    }
}

impl GrammarCompiler {
    /// The compiler for `tok`, over a model vocabulary of `vocab_size` ids
    /// (at least the tokenizer's; ids past it have no bytes and are never
    /// allowed).
    ///
    /// Errors: a model vocabulary smaller than the tokenizer's, a tokenizer
    /// without an end token, or `llguidance` refusing the vocabulary.
    pub fn new(tok: &Tokenizer, vocab_size: usize) -> Result<GrammarCompiler> {
        let n = tok.vocab_size();
        if vocab_size < n {
            return Err(Error::Usage(format!(
                "the model's vocabulary ({vocab_size}) is smaller than the tokenizer's ({n})"
            )));
        }
        let eos = tok
            .eos()
            .or_else(|| tok.eog_tokens().first().copied())
            .ok_or_else(|| Error::Usage("structured output needs a tokenizer with an end token".into()))?;
        let mut words = Vec::with_capacity(vocab_size);
        for id in 0..n as u32 {
            let plain = tok.token_bytes(id, false)?;
            let full = tok.token_bytes(id, true)?;
            // Control tokens (empty unless rendered as special) and
            // end-of-generation tokens are special: marker byte first.
            let word = if (plain.is_empty() && !full.is_empty()) || tok.is_eog(id) {
                let mut w = Vec::with_capacity(full.len() + 1);
                w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                w.extend_from_slice(full);
                w
            } else {
                plain.to_vec()
            };
            words.push(word);
        }
        words.resize(vocab_size, Vec::new());
        let info = TokRxInfo::new(vocab_size as u32, eos);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(TokTrie::from(&info, &words)));
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| Error::Usage(format!("the grammar engine refused the vocabulary: {e}")))?;
        factory.quiet();
        Ok(GrammarCompiler { factory, vocab: vocab_size, eos })
    }

    /// The model vocabulary the masks cover.
    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// Compiles `spec` into a fresh constraint.
    ///
    /// Errors: [`Error::Usage`] with the grammar engine's reason for an
    /// invalid or unsupported schema, regex or grammar.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Constraint> {
        let parser = self
            .factory
            .create_parser(spec.top_level())
            .map_err(|e| Error::Usage(format!("invalid {}: {e}", spec.kind())))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher_error(&matcher) {
            return Err(Error::Usage(format!("invalid {}: {e}", spec.kind())));
        }
        Ok(Constraint { matcher, vocab: self.vocab, eos: self.eos })
    }
}

/// The error a matcher is in, if any.
fn matcher_error(m: &Matcher) -> Option<String> {
    m.is_error().then(|| m.get_error().unwrap_or_else(|| "the grammar engine failed".into()))
}

/// One request's grammar state (see the module doc).
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    vocab: usize,
    eos: u32,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("vocab", &self.vocab).finish_non_exhaustive()
    }
}

/// Words of a bitmask over `vocab` tokens.
pub fn mask_words(vocab: usize) -> usize {
    vocab.div_ceil(32)
}

impl Constraint {
    /// Writes the allowed tokens of the current state into `out`
    /// ([`mask_words`]`(vocab)` words): the grammar's tokens, plus every one
    /// of `stop` when the grammar may end here. Returns whether any token is
    /// allowed; a failed grammar engine allows none.
    pub fn fill_mask(&mut self, stop: &[u32], out: &mut [u32]) -> bool {
        out.fill(0);
        let Ok(vob) = self.matcher.compute_mask_or_eos() else { return false };
        let src = vob.as_slice();
        let n = out.len().min(src.len());
        out[..n].copy_from_slice(&src[..n]);
        let bit = |m: &[u32], t: u32| m.get(t as usize / 32).is_some_and(|w| w >> (t % 32) & 1 == 1);
        let accepting = bit(out, self.eos);
        if let Some(w) = out.get_mut(self.eos as usize / 32) {
            *w &= !(1 << (self.eos % 32));
        }
        if accepting {
            for &t in stop {
                if let Some(w) = out.get_mut(t as usize / 32) {
                    *w |= 1 << (t % 32);
                }
            }
        }
        // Padding bits past the vocabulary stay clear.
        if !self.vocab.is_multiple_of(32)
            && let Some(w) = out.get_mut(self.vocab / 32)
        {
            *w &= (1u32 << (self.vocab % 32)) - 1;
        }
        out.iter().any(|&w| w != 0)
    }

    /// Advances the state by one committed (or draft) token.
    ///
    /// Errors: the grammar rejects `token`.
    pub fn consume(&mut self, token: u32) -> Result<()> {
        self.matcher
            .consume_token(token)
            .map_err(|e| Error::Usage(format!("the grammar rejects token {token}: {e}")))
    }

    /// Undoes the last `n` consumed tokens.
    pub fn rollback(&mut self, n: usize) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        self.matcher.rollback(n).map_err(|e| Error::Usage(format!("grammar rollback of {n} tokens: {e}")))
    }

    /// How many of `tokens` (in order, from the current state) the grammar
    /// accepts before the first one it rejects. A stop token ends the run.
    pub fn valid_prefix(&mut self, tokens: &[u32]) -> usize {
        let n = self.matcher.validate_tokens(tokens).unwrap_or(0);
        n.min(tokens.len())
    }

    /// Whether the output so far is a complete match of the grammar.
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }
}

pub mod gbnf;
pub mod schemas;
#[cfg(test)]
mod tests;
