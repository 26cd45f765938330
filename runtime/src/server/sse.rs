//! Response bodies: server-sent-event framing and the JSON of completions,
//! chat completions, their stream chunks, logprobs and usage.
//!
//! SSE framing is OpenAI's: every event is one `data: <json>` line followed
//! by a blank line, and a stream ends with `data: [DONE]`. Chunks carry
//! `object` = `text_completion` (completions) or `chat.completion.chunk`;
//! the first chunk of each chat choice carries `delta.role`; a choice's last
//! chunk carries its `finish_reason`; with `stream_options.include_usage` a
//! final chunk has empty `choices` and the `usage`.
//!
//! Invariant: every function here is pure (JSON in, JSON out), so the wire
//! format is tested without a server.

use crate::tokenizer::Tokenizer;
use axum::body::Bytes;
use serde_json::{Value, json};

/// The end of a stream.
pub const DONE: &str = "data: [DONE]\n\n";

/// One SSE event carrying `value`.
pub fn event(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// Which API a response belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// `/v1/completions`.
    Completions,
    /// `/v1/chat/completions`.
    Chat,
}

/// Why a choice ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Finish {
    /// A stop token, end-of-generation token or stop string; `stop_reason`
    /// is the matched stop string or user stop token (`None` for EOS).
    Stop(Option<Value>),
    /// `max_tokens` or the context length.
    Length,
    /// Aborted (server shutdown).
    Abort,
    /// The request's grammar (structured output) allows no further token:
    /// `finish_reason` `"grammar"`.
    Grammar,
    /// The answer is tool calls (`finish_reason` `"tool_calls"`).
    ToolCalls,
    /// The engine failed.
    Error(String),
}

impl Finish {
    /// The OpenAI `finish_reason`.
    pub fn reason(&self) -> &'static str {
        match self {
            Finish::Stop(_) => "stop",
            Finish::Length => "length",
            Finish::Abort => "abort",
            Finish::Grammar => "grammar",
            Finish::ToolCalls => "tool_calls",
            Finish::Error(_) => "error",
        }
    }

    /// vLLM's `stop_reason`: the stop string or token id that matched.
    pub fn stop_reason(&self) -> Value {
        match self {
            Finish::Stop(Some(v)) => v.clone(),
            _ => Value::Null,
        }
    }
}

/// One generated token's logprob entry.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The token.
    pub token: u32,
    /// Its log-probability.
    pub logprob: f32,
    /// The best alternatives, best first.
    pub top: Vec<(u32, f32)>,
    /// Byte offset of its text in the choice's text.
    pub offset: usize,
}

/// What a response needs to know about its request.
#[derive(Clone, Debug)]
pub struct Header {
    /// `cmpl-...` or `chatcmpl-...`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The served model's name.
    pub model: String,
    /// The endpoint.
    pub api: Api,
    /// Whether logprobs were asked for.
    pub logprobs: bool,
}

/// A token's text for logprobs (control tokens by name, bytes lossy).
fn piece(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tok.token_bytes(id, true).map(<[u8]>::to_vec).unwrap_or_default();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// The logprobs object of `entries` in the endpoint's shape.
pub fn logprobs_json(tok: &Tokenizer, api: Api, entries: &[TokenLogprob]) -> Value {
    match api {
        Api::Completions => {
            let mut tokens = Vec::new();
            let mut lps = Vec::new();
            let mut tops = Vec::new();
            let mut offsets = Vec::new();
            for e in entries {
                tokens.push(piece(tok, e.token).0);
                lps.push(e.logprob);
                let mut top = serde_json::Map::new();
                for &(t, lp) in &e.top {
                    top.insert(piece(tok, t).0, json!(lp));
                }
                tops.push(if e.top.is_empty() { Value::Null } else { Value::Object(top) });
                offsets.push(e.offset);
            }
            json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
        }
        Api::Chat => {
            let content: Vec<Value> = entries
                .iter()
                .map(|e| {
                    let (text, bytes) = piece(tok, e.token);
                    let top: Vec<Value> = e
                        .top
                        .iter()
                        .map(|&(t, lp)| {
                            let (text, bytes) = piece(tok, t);
                            json!({"token": text, "logprob": lp, "bytes": bytes})
                        })
                        .collect();
                    json!({"token": text, "logprob": e.logprob, "bytes": bytes, "top_logprobs": top})
                })
                .collect();
            json!({"content": content})
        }
    }
}

/// The `usage` object.
pub fn usage(prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    })
}

/// A stream chunk for choice `index`: new `text`, its tokens' logprobs, the
/// finish when this is the choice's last chunk; `role` marks a chat choice's
/// first chunk.
pub fn chunk(
    h: &Header,
    tok: &Tokenizer,
    index: usize,
    text: &str,
    logprobs: &[TokenLogprob],
    finish: Option<&Finish>,
    role: bool,
) -> Value {
    let lp = if h.logprobs { logprobs_json(tok, h.api, logprobs) } else { Value::Null };
    let reason = finish.map(Finish::reason);
    let stop_reason = finish.map_or(Value::Null, Finish::stop_reason);
    let choice = match h.api {
        Api::Completions => json!({
            "index": index, "text": text, "logprobs": lp, "finish_reason": reason, "stop_reason": stop_reason,
        }),
        Api::Chat => {
            let delta =
                if role { json!({"role": "assistant", "content": text}) } else { json!({"content": text}) };
            json!({
                "index": index, "delta": delta, "logprobs": lp, "finish_reason": reason, "stop_reason": stop_reason,
            })
        }
    };
    json!({"id": h.id, "object": object(h.api, true), "created": h.created, "model": h.model, "choices": [choice]})
}

/// A chat stream chunk that carries tool calls (`delta.tool_calls`, each
/// with its `index`), any content left around them, and the finish.
pub fn tool_calls_chunk(
    h: &Header,
    tok: &Tokenizer,
    index: usize,
    content: &str,
    calls: &[Value],
    logprobs: &[TokenLogprob],
    finish: &Finish,
) -> Value {
    let mut v = chunk(h, tok, index, content, logprobs, Some(finish), false);
    let delta = &mut v["choices"][0]["delta"];
    if content.is_empty() {
        *delta = json!({});
    }
    delta["tool_calls"] = Value::Array(calls.to_vec());
    v
}

/// The final usage chunk of a stream.
pub fn usage_chunk(h: &Header, prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({
        "id": h.id, "object": object(h.api, true), "created": h.created, "model": h.model,
        "choices": [], "usage": usage(prompt_tokens, completion_tokens),
    })
}

/// An error event inside a stream.
pub fn error_event(message: &str) -> Value {
    json!({"error": {"message": message, "type": "internal_error", "param": null, "code": null}})
}

/// One finished choice of a non-streamed response.
#[derive(Clone, Debug, PartialEq)]
pub struct ChoiceOut {
    /// The text.
    pub text: String,
    /// Logprob entries of its tokens.
    pub logprobs: Vec<TokenLogprob>,
    /// Why it ended.
    pub finish: Finish,
    /// Its tool calls (chat with tools), as OpenAI `tool_calls` entries;
    /// `text` is then the content left around them.
    pub tool_calls: Vec<Value>,
}

/// A whole (non-streamed) response.
pub fn response(
    h: &Header,
    tok: &Tokenizer,
    choices: &[ChoiceOut],
    prompt_tokens: usize,
    completion_tokens: usize,
) -> Value {
    let choices: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(index, c)| {
            let lp = if h.logprobs { logprobs_json(tok, h.api, &c.logprobs) } else { Value::Null };
            let (reason, stop_reason) = (c.finish.reason(), c.finish.stop_reason());
            match h.api {
                Api::Completions => json!({
                    "index": index, "text": c.text, "logprobs": lp, "finish_reason": reason,
                    "stop_reason": stop_reason,
                }),
                Api::Chat => {
                    let mut message = json!({"role": "assistant", "content": c.text});
                    if !c.tool_calls.is_empty() {
                        message["tool_calls"] = Value::Array(c.tool_calls.clone());
                        if c.text.is_empty() {
                            message["content"] = Value::Null;
                        }
                    }
                    json!({
                        "index": index, "message": message, "logprobs": lp,
                        "finish_reason": reason, "stop_reason": stop_reason,
                    })
                }
            }
        })
        .collect();
    json!({
        "id": h.id, "object": object(h.api, false), "created": h.created, "model": h.model,
        "choices": choices, "usage": usage(prompt_tokens, completion_tokens),
    })
}

/// The `object` field.
fn object(api: Api, chunk: bool) -> &'static str {
    match (api, chunk) {
        (Api::Completions, _) => "text_completion",
        (Api::Chat, false) => "chat.completion",
        (Api::Chat, true) => "chat.completion.chunk",
    }
}
