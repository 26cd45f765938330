//! The OpenAI request types the server accepts and their validation into a
//! [`GenSpec`]; every rejection is an [`ApiError`] ([`super::error`]).
//!
//! Requests are parsed from the raw body with serde, then checked against
//! the model's limits. A field the server does not know, or knows and does
//! not implement (`audio`, say), is a 400 naming it, so a client
//! never gets an answer that silently ignored part of its request; the
//! fields that change nothing in the answer (`user`) are accepted.
//!
//! `response_format` (both endpoints, as OpenAI defines it): `{"type":
//! "text"}` (free text), `{"type": "json_object"}` (any JSON object) or
//! `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`;
//! the output is constrained to it by grammar-constrained decoding
//! ([`crate::grammar`]), whatever `strict` says. A malformed
//! `response_format` or an invalid schema is a 400 with the reason.
//!
//! Ranges (OpenAI's where it defines them, vLLM's otherwise): `temperature`
//! in `[0, 2]`, `top_p` in `(0, 1]`, `top_k >= -1`, `min_p` in `[0, 1]`,
//! presence/frequency penalties in `[-2, 2]`, `repetition_penalty` in
//! `(0, 2]`, `n` in `1..=MAX_N`, `logprobs`/`top_logprobs` in
//! `0..=MAX_LOGPROBS`, `max_tokens >= 1`, at most `MAX_STOP` non-empty stop
//! strings, stop token ids inside the vocabulary.
//!
//! Invariant: a [`GenSpec`] that validation returns always passes
//! [`SamplingParams::validate`], so the engine never rejects its settings.

use crate::model::sampler::SamplingParams;
use serde::Deserialize;

use super::error::ApiError;

/// The most choices one request may ask for (`n`).
pub const MAX_N: usize = 16;
/// The most alternatives per token (`logprobs`, `top_logprobs`).
pub const MAX_LOGPROBS: usize = 20;
/// The most stop strings per request.
pub const MAX_STOP: usize = 16;

/// A string or a list of strings (`stop`).
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    /// One string.
    One(String),
    /// Several strings.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with the request's token usage.
    pub include_usage: Option<bool>,
}

/// The generation fields shared by both endpoints.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct GenParams {
    /// The served model's name.
    pub model: Option<String>,
    /// The most tokens to generate per choice.
    pub max_tokens: Option<i64>,
    /// Chat's newer name for `max_tokens`.
    pub max_completion_tokens: Option<i64>,
    /// Softmax temperature (default 1; 0 is greedy).
    pub temperature: Option<f32>,
    /// Nucleus sampling mass.
    pub top_p: Option<f32>,
    /// Keep the k most likely tokens (vLLM extension).
    pub top_k: Option<i32>,
    /// Drop tokens less likely than `min_p` times the most likely (vLLM extension).
    pub min_p: Option<f32>,
    /// Seed of the sampler (choice `i` draws with `seed + i`).
    pub seed: Option<i64>,
    /// Strings that end a choice (not included in its text).
    pub stop: Option<OneOrMany>,
    /// Token ids that end a choice (vLLM extension).
    pub stop_token_ids: Option<Vec<i64>>,
    /// Penalty on tokens present in the output.
    pub presence_penalty: Option<f32>,
    /// Penalty per occurrence in the output.
    pub frequency_penalty: Option<f32>,
    /// Multiplicative penalty on tokens of the prompt and output (vLLM extension).
    pub repetition_penalty: Option<f32>,
    /// Choices per prompt.
    pub n: Option<i64>,
    /// Keep generating past end-of-generation tokens (vLLM extension).
    pub ignore_eos: Option<bool>,
    /// Stream server-sent events.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Must equal `n` when given (no server-side best-of).
    pub best_of: Option<i64>,
    /// Unsupported when non-empty.
    pub logit_bias: Option<serde_json::Map<String, serde_json::Value>>,
    /// Structured output (see the module doc).
    pub response_format: Option<serde_json::Value>,
}

/// A completion prompt: text, token ids, or a batch of either.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// One text prompt.
    Text(String),
    /// Several text prompts.
    Texts(Vec<String>),
    /// One prompt as token ids.
    Tokens(Vec<i64>),
    /// Several prompts as token ids.
    TokenBatches(Vec<Vec<i64>>),
}

/// `POST /v1/completions`.
#[derive(Clone, Debug, Deserialize)]
pub struct CompletionRequest {
    /// The prompt(s).
    pub prompt: Option<Prompt>,
    /// Top alternatives per token (0: only the sampled token's logprob).
    pub logprobs: Option<i64>,
    /// Unsupported when true.
    pub echo: Option<bool>,
    /// Unsupported when non-empty.
    pub suffix: Option<String>,
    /// The shared fields.
    #[serde(flatten)]
    pub params: GenParams,
    /// Every other field (rejected, see [`reject_other_fields`]).
    #[serde(flatten)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

/// A chat message's content: text or a list of parts.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Parts; only `{"type": "text", "text": ...}` is supported.
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Clone, Debug, Deserialize)]
pub struct ContentPart {
    /// The part's type (`text`).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a text part.
    pub text: Option<String>,
}

/// One chat message.
#[derive(Clone, Debug, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// The content (`null` is an empty message).
    pub content: Option<Content>,
    /// An assistant message's earlier tool calls.
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A tool message's call id.
    pub tool_call_id: Option<String>,
    /// A tool message's function name.
    pub name: Option<String>,
}

/// `POST /v1/chat/completions`.
#[derive(Clone, Debug, Deserialize)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Option<Vec<ChatMessage>>,
    /// Return the sampled tokens' logprobs.
    pub logprobs: Option<bool>,
    /// Alternatives per token (needs `logprobs`).
    pub top_logprobs: Option<i64>,
    /// Functions the model may call (see [`super::tools`]).
    pub tools: Option<Vec<serde_json::Value>>,
    /// `none`, `auto`, `required` or a named function.
    pub tool_choice: Option<serde_json::Value>,
    /// Whether one answer may hold several calls (default true).
    pub parallel_tool_calls: Option<bool>,
    /// The shared fields.
    #[serde(flatten)]
    pub params: GenParams,
    /// Every other field (rejected, see [`reject_other_fields`]).
    #[serde(flatten)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

/// The validated generation settings of a request.
#[derive(Clone, Debug, PartialEq)]
pub struct GenSpec {
    /// Sampler settings; `seed` is the base seed (choice `i` uses `seed + i`).
    pub params: SamplingParams,
    /// The asked-for token limit (`None`: the endpoint's default).
    pub max_tokens: Option<usize>,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Extra stop token ids.
    pub stop_token_ids: Vec<u32>,
    /// Choices per prompt.
    pub n: usize,
    /// Do not stop at end-of-generation tokens.
    pub ignore_eos: bool,
    /// Logprobs: `None` off, `Some(k)` the sampled token's plus `k` alternatives.
    pub logprobs: Option<usize>,
    /// Stream server-sent events.
    pub stream: bool,
    /// Send a usage chunk at the end of a stream.
    pub include_usage: bool,
    /// The structured-output constraint (`response_format`), not compiled yet.
    pub grammar: Option<crate::grammar::GrammarSpec>,
}

/// What validation checks against.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Longest sequence (prompt plus output).
    pub max_model_len: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
}

/// A `[lo, hi]` range check of an optional float.
fn in_range(param: &str, v: Option<f32>, lo: f32, hi: f32, default: f32) -> Result<f32, ApiError> {
    match v {
        None => Ok(default),
        Some(x) if x >= lo && x <= hi => Ok(x),
        Some(x) => Err(ApiError::invalid(
            param,
            format!("`{param}` = {x} is out of range: it must be in [{lo}, {hi}]."),
        )),
    }
}

/// A `(0, hi]` range check of an optional float (no default: 1).
fn in_positive_range(param: &str, v: Option<f32>, hi: f32) -> Result<f32, ApiError> {
    match v {
        None => Ok(1.0),
        Some(x) if x > 0.0 && x <= hi => Ok(x),
        Some(x) => Err(ApiError::invalid(
            param,
            format!("`{param}` = {x} is out of range: it must be in (0, {hi}]."),
        )),
    }
}

impl GenParams {
    /// Validates the shared fields; `logprobs` comes from the endpoint's own
    /// field(s), already range-checked.
    pub fn validate(&self, limits: &Limits, logprobs: Option<usize>) -> Result<GenSpec, ApiError> {
        let temperature = in_range("temperature", self.temperature, 0.0, 2.0, 1.0)?;
        let top_p = in_positive_range("top_p", self.top_p, 1.0)?;
        let top_k = match self.top_k {
            None => 0,
            Some(k) if k >= -1 => k,
            Some(k) => {
                return Err(ApiError::invalid(
                    "top_k",
                    format!("`top_k` = {k} is out of range: it must be >= 1, or 0 or -1 (off)."),
                ));
            }
        };
        let min_p = in_range("min_p", self.min_p, 0.0, 1.0, 0.0)?;
        let presence_penalty = in_range("presence_penalty", self.presence_penalty, -2.0, 2.0, 0.0)?;
        let frequency_penalty = in_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0, 0.0)?;
        let repetition_penalty = in_positive_range("repetition_penalty", self.repetition_penalty, 2.0)?;
        let n = match self.n {
            None => 1,
            Some(n) if n >= 1 && n as usize <= MAX_N => n as usize,
            Some(n) => {
                return Err(ApiError::invalid(
                    "n",
                    format!("`n` = {n} is out of range: it must be in [1, {MAX_N}]."),
                ));
            }
        };
        if let Some(b) = self.best_of
            && b as usize != n
        {
            return Err(ApiError::invalid(
                "best_of",
                format!("`best_of` = {b} is not supported: it must equal `n` ({n})."),
            ));
        }
        if self.logit_bias.as_ref().is_some_and(|m| !m.is_empty()) {
            return Err(ApiError::invalid("logit_bias", "`logit_bias` is not supported."));
        }
        let max_tokens = match self.max_tokens.or(self.max_completion_tokens) {
            None => None,
            Some(m) if m >= 1 => Some(m as usize),
            Some(m) => {
                return Err(ApiError::invalid(
                    "max_tokens",
                    format!("`max_tokens` = {m} is out of range: it must be at least 1."),
                ));
            }
        };
        if let Some(m) = max_tokens
            && m > limits.max_model_len
        {
            return Err(ApiError {
                code: Some("context_length_exceeded"),
                ..ApiError::invalid(
                    "max_tokens",
                    format!(
                        "`max_tokens` = {m} is more than this model's maximum context length of {} tokens.",
                        limits.max_model_len
                    ),
                )
            });
        }
        let stop = match &self.stop {
            None => Vec::new(),
            Some(OneOrMany::One(s)) => vec![s.clone()],
            Some(OneOrMany::Many(v)) => v.clone(),
        };
        if stop.len() > MAX_STOP {
            return Err(ApiError::invalid(
                "stop",
                format!("At most {MAX_STOP} stop strings are allowed ({} given).", stop.len()),
            ));
        }
        if stop.iter().any(String::is_empty) {
            return Err(ApiError::invalid("stop", "Stop strings must not be empty."));
        }
        let mut stop_token_ids = Vec::new();
        for &t in self.stop_token_ids.iter().flatten() {
            if t < 0 || t as usize >= limits.vocab_size {
                return Err(ApiError::invalid(
                    "stop_token_ids",
                    format!(
                        "`stop_token_ids` holds {t}, outside the vocabulary of {} tokens.",
                        limits.vocab_size
                    ),
                ));
            }
            stop_token_ids.push(t as u32);
        }
        let seed = match self.seed {
            Some(s) => s as u64,
            None => random_seed(),
        };
        let params = SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            repetition_penalty,
            presence_penalty,
            frequency_penalty,
            seed,
        };
        params.validate().map_err(|e| ApiError::bad_request(e.to_string()))?;
        let stream = self.stream.unwrap_or(false);
        let include_usage = self.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false);
        if self.stream_options.is_some() && !stream {
            return Err(ApiError::invalid("stream_options", "`stream_options` needs `stream` = true."));
        }
        let grammar = self.response_format.as_ref().map(response_format).transpose()?.flatten();
        Ok(GenSpec {
            params,
            max_tokens,
            stop,
            stop_token_ids,
            n,
            ignore_eos: self.ignore_eos.unwrap_or(false),
            logprobs,
            stream,
            include_usage,
            grammar,
        })
    }
}

/// Reads OpenAI's `response_format` (see the module doc): `None` for free
/// text, a 400 naming what is wrong otherwise.
pub fn response_format(v: &serde_json::Value) -> Result<Option<crate::grammar::GrammarSpec>, ApiError> {
    use crate::grammar::GrammarSpec;
    const P: &str = "response_format";
    let bad = |m: String| Err(ApiError::invalid(P, m));
    let Some(obj) = v.as_object() else {
        return bad("`response_format` must be an object with a `type`.".into());
    };
    let allowed: &[&str] = match obj.get("type").and_then(|t| t.as_str()) {
        Some("text") | Some("json_object") => &["type"],
        Some("json_schema") => &["type", "json_schema"],
        Some(other) => {
            return bad(format!(
                "`response_format.type` `{other}` is not supported (use `text`, `json_object` or `json_schema`)."
            ));
        }
        None => return bad("`response_format.type` is required (a string).".into()),
    };
    if let Some(k) = obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        return bad(format!("Unknown field `response_format.{k}`."));
    }
    match obj["type"].as_str() {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(GrammarSpec::JsonObject)),
        _ => {
            let Some(js) = obj.get("json_schema").and_then(|j| j.as_object()) else {
                return bad(
                    "`response_format.json_schema` is required for type `json_schema` (an object).".into()
                );
            };
            if let Some(k) =
                js.keys().find(|k| !["name", "schema", "strict", "description"].contains(&k.as_str()))
            {
                return bad(format!("Unknown field `response_format.json_schema.{k}`."));
            }
            match js.get("name") {
                Some(serde_json::Value::String(n)) if !n.is_empty() && n.len() <= 64 => {}
                _ => {
                    return bad("`response_format.json_schema.name` is required (a non-empty string).".into());
                }
            }
            if js.get("strict").is_some_and(|s| !s.is_boolean() && !s.is_null()) {
                return bad("`response_format.json_schema.strict` must be a boolean.".into());
            }
            match js.get("schema") {
                None | Some(serde_json::Value::Null) => {
                    Ok(Some(GrammarSpec::JsonSchema(serde_json::json!({}))))
                }
                Some(s) if s.is_object() || s.is_boolean() => Ok(Some(GrammarSpec::JsonSchema(s.clone()))),
                Some(_) => {
                    bad("`response_format.json_schema.schema` must be a JSON schema (an object).".into())
                }
            }
        }
    }
}

/// A `0..=MAX_LOGPROBS` check.
pub fn check_logprobs(param: &str, v: i64) -> Result<usize, ApiError> {
    if (0..=MAX_LOGPROBS as i64).contains(&v) {
        Ok(v as usize)
    } else {
        Err(ApiError::invalid(
            param,
            format!("`{param}` = {v} is out of range: it must be in [0, {MAX_LOGPROBS}]."),
        ))
    }
}

/// OpenAI request fields that change nothing in an answer, accepted and
/// ignored: `user` (an end-user id for the caller's abuse monitoring).
const IGNORED_FIELDS: [&str; 1] = ["user"];

/// OpenAI request fields the server knows but does not implement yet.
const UNSUPPORTED_FIELDS: [&str; 3] = ["functions", "function_call", "audio"];

/// A 400 for the first field of `other` (a request's fields that no
/// endpoint field took) unless it is one of [`IGNORED_FIELDS`].
pub fn reject_other_fields(other: &serde_json::Map<String, serde_json::Value>) -> Result<(), ApiError> {
    let Some(name) = other.keys().find(|k| !IGNORED_FIELDS.contains(&k.as_str())) else { return Ok(()) };
    let message = if UNSUPPORTED_FIELDS.contains(&name.as_str()) {
        format!("`{name}` is not supported by this server.")
    } else {
        format!("Unknown request field `{name}`.")
    };
    Err(ApiError::invalid(name, message))
}

impl CompletionRequest {
    /// Validates the request's fields (not the prompt's tokens).
    pub fn spec(&self, limits: &Limits) -> Result<GenSpec, ApiError> {
        reject_other_fields(&self.other)?;
        if self.echo == Some(true) {
            return Err(ApiError::invalid("echo", "`echo` is not supported."));
        }
        if self.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::invalid("suffix", "`suffix` is not supported."));
        }
        let logprobs = self.logprobs.map(|v| check_logprobs("logprobs", v)).transpose()?;
        self.params.validate(limits, logprobs)
    }
}

impl ChatRequest {
    /// Validates the request's fields (not the rendered prompt).
    pub fn spec(&self, limits: &Limits) -> Result<GenSpec, ApiError> {
        reject_other_fields(&self.other)?;
        let top = self.top_logprobs.map(|v| check_logprobs("top_logprobs", v)).transpose()?;
        let logprobs = match (self.logprobs.unwrap_or(false), top) {
            (true, t) => Some(t.unwrap_or(0)),
            (false, Some(t)) if t > 0 => {
                return Err(ApiError::invalid("top_logprobs", "`top_logprobs` needs `logprobs` = true."));
            }
            (false, _) => None,
        };
        self.params.validate(limits, logprobs)
    }

    /// The conversation as JSON messages for a template that renders tools
    /// itself: text content, earlier calls with their `arguments` as objects
    /// (as templates expect), tool results with their ids.
    pub fn messages_json(&self) -> Result<Vec<serde_json::Value>, ApiError> {
        let plain = self.messages()?;
        let raw = self.messages.as_deref().unwrap_or_default();
        Ok(plain
            .iter()
            .zip(raw)
            .map(|(m, r)| {
                let mut v = serde_json::json!({"role": m.role, "content": m.content});
                if let Some(calls) = &r.tool_calls {
                    let calls: Vec<serde_json::Value> = calls
                        .iter()
                        .map(|c| {
                            let mut f = c.get("function").cloned().unwrap_or(serde_json::Value::Null);
                            if let Some(a) = f.get("arguments").and_then(|a| a.as_str())
                                && let Ok(parsed) = serde_json::from_str::<serde_json::Value>(a)
                            {
                                f["arguments"] = parsed;
                            }
                            serde_json::json!({"id": c.get("id"), "type": "function", "function": f})
                        })
                        .collect();
                    v["tool_calls"] = serde_json::Value::Array(calls);
                }
                if let Some(id) = &r.tool_call_id {
                    v["tool_call_id"] = serde_json::json!(id);
                }
                if let Some(n) = &r.name {
                    v["name"] = serde_json::json!(n);
                }
                v
            })
            .collect())
    }

    /// The conversation for a template that does not render tools, with the
    /// tools and calls in the Hermes format ([`super::tools`]): `system` (the
    /// tool prompt) joins the first system message or opens the
    /// conversation, earlier calls become `<tool_call>` blocks and tool
    /// results `<tool_response>` blocks.
    pub fn messages_hermes(&self, system: &str) -> Result<Vec<crate::chat::Message>, ApiError> {
        let mut out = self.messages()?;
        let raw = self.messages.as_deref().unwrap_or_default();
        for (m, r) in out.iter_mut().zip(raw) {
            for c in r.tool_calls.iter().flatten() {
                let f = c.get("function").cloned().unwrap_or(serde_json::Value::Null);
                let args = match f.get("arguments") {
                    Some(serde_json::Value::String(s)) => {
                        serde_json::from_str(s).unwrap_or(serde_json::Value::String(s.clone()))
                    }
                    Some(a) => a.clone(),
                    None => serde_json::json!({}),
                };
                let call = serde_json::json!({"name": f.get("name"), "arguments": args});
                if !m.content.is_empty() {
                    m.content.push('\n');
                }
                m.content.push_str(&format!("<tool_call>\n{call}\n</tool_call>"));
            }
            if m.role == "tool" {
                m.content = format!("<tool_response>\n{}\n</tool_response>", m.content);
            }
        }
        match out.first_mut() {
            Some(first) if first.role == "system" => first.content = format!("{}\n\n{system}", first.content),
            _ => out.insert(0, crate::chat::Message::system(system)),
        }
        Ok(out)
    }

    /// The conversation as template messages; a part other than text is a 400.
    pub fn messages(&self) -> Result<Vec<crate::chat::Message>, ApiError> {
        let messages =
            self.messages.as_ref().ok_or_else(|| ApiError::invalid("messages", "`messages` is required."))?;
        if messages.is_empty() {
            return Err(ApiError::invalid("messages", "`messages` must not be empty."));
        }
        let mut out = Vec::with_capacity(messages.len());
        for m in messages {
            let content = match &m.content {
                None => String::new(),
                Some(Content::Text(t)) => t.clone(),
                Some(Content::Parts(parts)) => {
                    let mut text = String::new();
                    for p in parts {
                        match (p.kind.as_str(), &p.text) {
                            ("text", Some(t)) => text.push_str(t),
                            (kind, _) => {
                                return Err(ApiError::invalid(
                                    "messages",
                                    format!(
                                        "Content parts of type `{kind}` are not supported (only `text`)."
                                    ),
                                ));
                            }
                        }
                    }
                    text
                }
            };
            out.push(crate::chat::Message::new(m.role.clone(), content));
        }
        Ok(out)
    }
}

/// A seed for requests that give none (time and a counter, so concurrent
/// requests differ).
pub fn random_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let c = COUNTER.fetch_add(1, Ordering::Relaxed);
    // SplitMix64 finalizer over the mix, so nearby inputs give unrelated seeds.
    let mut z = t ^ c.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// How many tokens a choice may generate: the asked-for limit (or the
/// endpoint's default, clamped to what is left) such that prompt plus output
/// fits `max_model_len`; an error when it does not.
pub fn resolve_max_tokens(
    param: &str,
    prompt_len: usize,
    asked: Option<usize>,
    default: Option<usize>,
    limits: &Limits,
) -> Result<usize, ApiError> {
    let left = limits.max_model_len.saturating_sub(prompt_len);
    let too_long = |requested: usize| ApiError {
        code: Some("context_length_exceeded"),
        ..ApiError::invalid(
            param,
            format!(
                "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in \
                 the prompt, {} for the completion). Please reduce the length of the prompt or completion.",
                limits.max_model_len,
                prompt_len + requested,
                prompt_len,
                requested
            ),
        )
    };
    if prompt_len == 0 {
        return Err(ApiError::invalid(param, "The prompt is empty (it encodes to no tokens)."));
    }
    match asked {
        Some(m) if m > left => Err(too_long(m)),
        Some(m) => Ok(m),
        None if left == 0 => Err(too_long(1)),
        None => Ok(default.map_or(left, |d| d.min(left))),
    }
}
