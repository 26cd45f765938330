//! The HTTP handlers: `/v1/completions`, `/v1/chat/completions`,
//! `/v1/models`, `/health`, `/metrics`, and the per-request machinery
//! between a handler and the engine thread.
//!
//! A generation request is parsed and validated (400/404 on bad input),
//! tokenized, checked against the context length, then admitted: it takes
//! one slot of the admission semaphore per engine request (`n` per prompt),
//! waiting in a queue of at most `queue_limit` requests (429 beyond, 503
//! once shutting down). Each engine request is sent to the engine thread
//! with its own event channel; a [`Run`] merges the choices' events,
//! detokenizes, applies stop strings, and yields [`Update`]s that the
//! non-streaming path collects and the streaming path turns into SSE.
//!
//! Cancellation: every engine request has an [`AbortGuard`]; dropping it
//! before the request finished sends `Abort`. The non-streaming handler's
//! future is dropped when the client disconnects; the streaming task stops
//! as soon as its body channel closes. Either way the guards fire and the
//! engine frees the request's KV blocks.

use super::AppState;
use super::api::{ChatRequest, CompletionRequest, GenSpec, Prompt, resolve_max_tokens};
use super::error::{ApiError, parse_json};
use super::metrics::Outcome;
use super::sse::{self, Api, ChoiceOut, Finish, Header, TokenLogprob};
use super::text::ChoiceText;
use super::tools::Tools;
use super::worker::{Command, Event, Submit};
use crate::engine::Request;
use crate::scheduler::FinishReason;
use crate::tokenizer::Tokenizer;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::SyncSender;
use std::time::Instant;
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};

type Shared = State<Arc<AppState>>;

/// `GET /health`: 200 while serving, 503 while shutting down.
pub async fn health(State(st): Shared) -> Response {
    if st.draining.load(Ordering::Relaxed) {
        ApiError::unavailable("The server is shutting down.").into_response()
    } else {
        StatusCode::OK.into_response()
    }
}

/// `GET /v1/models`.
pub async fn models(State(st): Shared) -> Response {
    let body = json!({
        "object": "list",
        "data": [{
            "id": st.model, "object": "model", "created": st.created, "owned_by": "tessera",
            "root": st.model, "max_model_len": st.limits.max_model_len,
        }],
    });
    ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// `GET /metrics`: Prometheus text.
pub async fn metrics(State(st): Shared) -> Response {
    let queued = st.queued.load(Ordering::Relaxed);
    st.metrics.update(|v| v.queued = queued);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], st.metrics.render())
        .into_response()
}

/// Any other path: an OpenAI-style 404.
pub async fn not_found() -> Response {
    ApiError {
        status: StatusCode::NOT_FOUND,
        kind: "not_found_error",
        message:
            "No such endpoint (this server has /v1/completions, /v1/chat/completions, /v1/models, /health \
                  and /metrics)."
                .into(),
        param: None,
        code: None,
    }
    .into_response()
}

/// `POST /v1/completions`.
pub async fn completions(State(st): Shared, body: Result<Bytes, BytesRejection>) -> Response {
    let arrival = Instant::now();
    match completions_job(&st, body).await {
        Ok(job) => start(st, job, arrival).await.unwrap_or_else(IntoResponse::into_response),
        Err(e) => e.into_response(),
    }
}

/// `POST /v1/chat/completions`.
pub async fn chat(State(st): Shared, body: Result<Bytes, BytesRejection>) -> Response {
    let arrival = Instant::now();
    match chat_job(&st, body).await {
        Ok(job) => start(st, job, arrival).await.unwrap_or_else(IntoResponse::into_response),
        Err(e) => e.into_response(),
    }
}

/// A validated request: prompts, their token limits, settings.
#[derive(Debug)]
pub struct Job {
    api: Api,
    prompts: Vec<Vec<u32>>,
    max_tokens: Vec<usize>,
    spec: GenSpec,
    /// The compiled structured-output constraint (each choice gets a copy).
    constraint: Option<crate::grammar::Constraint>,
    /// The chat request's tools (outputs are parsed for calls).
    tools: Option<Tools>,
}

/// The body, or a 4xx for an unreadable one.
fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|r| ApiError { status: r.status(), ..ApiError::bad_request(r.body_text()) })
}

fn check_model(st: &AppState, model: &Option<String>) -> Result<(), ApiError> {
    match model {
        Some(m) if m != &st.model => Err(ApiError::unknown_model(m, &st.model)),
        _ => Ok(()),
    }
}

async fn completions_job(st: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Job, ApiError> {
    let body = body_bytes(body)?;
    let req: CompletionRequest = parse_json(&body)?;
    check_model(st, &req.params.model)?;
    let spec = req.spec(&st.limits)?;
    let vocab = st.limits.vocab_size;
    let ids = |p: &[i64]| -> Result<Vec<u32>, ApiError> {
        p.iter()
            .map(|&t| {
                u32::try_from(t).ok().filter(|&t| (t as usize) < vocab).ok_or_else(|| {
                    ApiError::invalid(
                        "prompt",
                        format!("Prompt token {t} is outside the vocabulary of {vocab} tokens."),
                    )
                })
            })
            .collect()
    };
    let text =
        |s: &str| st.tokenizer.encode_prompt(s).map_err(|e| ApiError::invalid("prompt", e.to_string()));
    let prompts = match &req.prompt {
        None => return Err(ApiError::invalid("prompt", "`prompt` is required.")),
        Some(Prompt::Text(s)) => vec![text(s)?],
        Some(Prompt::Texts(v)) => v.iter().map(|s| text(s)).collect::<Result<_, _>>()?,
        Some(Prompt::Tokens(t)) => vec![ids(t)?],
        Some(Prompt::TokenBatches(b)) => b.iter().map(|t| ids(t)).collect::<Result<_, _>>()?,
    };
    if prompts.is_empty() {
        return Err(ApiError::invalid("prompt", "`prompt` must not be empty."));
    }
    // OpenAI's completions default: 16 new tokens.
    let max_tokens = prompts
        .iter()
        .map(|p| resolve_max_tokens("prompt", p.len(), spec.max_tokens, Some(16), &st.limits))
        .collect::<Result<_, _>>()?;
    let constraint = spec.grammar.as_ref().map(|g| st.compile_grammar(g, "response_format")).transpose()?;
    Ok(Job { api: Api::Completions, prompts, max_tokens, spec, constraint, tools: None })
}

async fn chat_job(st: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Job, ApiError> {
    let body = body_bytes(body)?;
    let req: ChatRequest = parse_json(&body)?;
    check_model(st, &req.params.model)?;
    let spec = req.spec(&st.limits)?;
    let messages = req.messages()?;
    let template = st
        .template
        .as_ref()
        .ok_or_else(|| ApiError::bad_request("The model has no chat template; use /v1/completions."))?;
    let tools = super::tools::parse(req.tools.as_ref(), req.tool_choice.as_ref(), req.parallel_tool_calls)?;
    let rendered = match &tools {
        None => template.render(&messages, true),
        Some(t) if template.renders_tools() => {
            template.render_with_tools(&req.messages_json()?, &t.template_value(), true)
        }
        Some(t) => template.render(&req.messages_hermes(&t.system_prompt())?, true),
    }
    .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    let prompt =
        st.tokenizer.encode(&rendered, true).map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    // Chat's default: whatever the context has left.
    let max_tokens = vec![resolve_max_tokens("messages", prompt.len(), spec.max_tokens, None, &st.limits)?];
    let mut constraint =
        spec.grammar.as_ref().map(|g| st.compile_grammar(g, "response_format")).transpose()?;
    if let Some(g) = tools.as_ref().and_then(Tools::grammar) {
        if constraint.is_some() {
            return Err(ApiError::invalid(
                "tool_choice",
                "`tool_choice` `required` or a named function cannot be combined with `response_format`.",
            ));
        }
        constraint = Some(st.compile_grammar(&g, "tool_choice")?);
    }
    Ok(Job { api: Api::Chat, prompts: vec![prompt], max_tokens, spec, constraint, tools })
}

/// Decrements the admission queue's length when a waiter leaves.
struct Queued<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Takes `n` engine slots, waiting in the bounded queue when none are free.
async fn admit(st: &Arc<AppState>, n: usize) -> Result<OwnedSemaphorePermit, ApiError> {
    let shutting_down = || {
        st.metrics.update(|v| v.rejected_shutdown += 1);
        ApiError::unavailable("The server is shutting down.")
    };
    if st.draining.load(Ordering::Relaxed) {
        return Err(shutting_down());
    }
    if n > st.max_concurrent {
        return Err(ApiError::invalid(
            "n",
            format!(
                "The request needs {n} sequences but the server runs at most {} at once.",
                st.max_concurrent
            ),
        ));
    }
    let n32 = n as u32;
    match st.slots.clone().try_acquire_many_owned(n32) {
        Ok(p) => return Ok(p),
        Err(tokio::sync::TryAcquireError::Closed) => return Err(shutting_down()),
        Err(tokio::sync::TryAcquireError::NoPermits) => {}
    }
    if st.queued.fetch_add(1, Ordering::Relaxed) >= st.queue_limit {
        st.queued.fetch_sub(1, Ordering::Relaxed);
        st.metrics.update(|v| v.rejected_full += 1);
        return Err(ApiError::overloaded(st.queue_limit));
    }
    let _queued = Queued(&st.queued);
    st.slots.clone().acquire_many_owned(n32).await.map_err(|_| shutting_down())
}

/// Sends `Abort` for an engine request when dropped before it finished.
#[derive(Debug)]
pub struct AbortGuard {
    id: u64,
    commands: SyncSender<Command>,
    armed: bool,
}

impl AbortGuard {
    /// The request finished on its own: nothing to abort.
    fn disarm(&mut self) {
        self.armed = false;
    }

    /// Ends the engine request now (once), counted as `outcome`.
    fn abort(&mut self, outcome: Outcome) {
        if self.armed {
            self.armed = false;
            // The channel has room for every admitted request's Add and
            // Abort; if the engine thread is gone there is nothing to free.
            let _ = self.commands.try_send(Command::Abort { id: self.id, outcome });
        }
    }
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        self.abort(Outcome::Abort);
    }
}

/// One choice in flight.
struct Choice {
    guard: AbortGuard,
    text: ChoiceText,
    stops: Vec<String>,
    user_stop_ids: Vec<u32>,
    tokens: usize,
    finished: bool,
}

/// What a [`Run`] reports: new text of one choice, its tokens' logprobs,
/// and the finish when the choice ended.
#[derive(Debug, PartialEq)]
pub struct Update {
    /// The choice.
    pub index: usize,
    /// Text released by this update.
    pub text: String,
    /// Logprob entries of the tokens consumed (when asked for).
    pub logprobs: Vec<TokenLogprob>,
    /// Set on the choice's last update.
    pub finish: Option<Finish>,
}

/// The choices of one HTTP request, in flight.
pub struct Run {
    choices: Vec<Choice>,
    events: tokio_stream::StreamMap<usize, UnboundedReceiverStream<Event>>,
    logprobs: bool,
    prompt_tokens: usize,
}

impl Run {
    /// Tokens generated so far over all choices.
    pub fn completion_tokens(&self) -> usize {
        self.choices.iter().map(|c| c.tokens).sum()
    }

    /// The next update, or `None` when every choice has finished.
    pub async fn next(&mut self, tok: &Tokenizer) -> Option<Update> {
        while !self.choices.iter().all(|c| c.finished) {
            let Some((index, ev)) = self.events.next().await else { break };
            if let Some(u) = self.apply(index, ev, tok) {
                return Some(u);
            }
        }
        // A choice whose channel closed without a finish: the engine thread is gone.
        let c = self.choices.iter_mut().enumerate().find(|(_, c)| !c.finished)?;
        c.1.finished = true;
        c.1.guard.disarm();
        let finish = Finish::Error("the engine stopped before the request finished".into());
        Some(Update { index: c.0, text: String::new(), logprobs: Vec::new(), finish: Some(finish) })
    }

    fn apply(&mut self, index: usize, ev: Event, tok: &Tokenizer) -> Option<Update> {
        let want_logprobs = self.logprobs;
        let c = self.choices.get_mut(index)?;
        if c.finished {
            return None;
        }
        let (token, logprob, top, finish) = match ev {
            Event::Failed(message) => {
                c.finished = true;
                c.guard.disarm();
                self.events.remove(&index);
                let finish = Some(Finish::Error(message));
                return Some(Update { index, text: String::new(), logprobs: Vec::new(), finish });
            }
            Event::Token { token, logprob, top, finish } => (token, logprob, top, finish),
        };
        let mut text = String::new();
        let mut logprobs = Vec::new();
        let mut stop = None;
        if let Some(t) = token {
            c.tokens += 1;
            if want_logprobs {
                logprobs.push(TokenLogprob { token: t, logprob, top, offset: c.text.decoded_bytes() });
            }
            match c.text.push(tok, t) {
                Ok(r) => {
                    text = r.text;
                    stop = r.stop;
                }
                Err(e) => {
                    c.finished = true;
                    c.guard.abort(Outcome::Abort);
                    self.events.remove(&index);
                    return Some(Update {
                        index,
                        text,
                        logprobs,
                        finish: Some(Finish::Error(e.to_string())),
                    });
                }
            }
        }
        let finish = if let Some(i) = stop {
            // A stop string: the engine does not know it, so abort there.
            c.guard.abort(Outcome::Stop);
            Some(Finish::Stop(Some(json!(c.stops[i]))))
        } else if let Some(reason) = finish {
            c.guard.disarm();
            let tail = c.text.finish();
            text.push_str(&tail.text);
            Some(match (tail.stop, reason) {
                (Some(i), _) => Finish::Stop(Some(json!(c.stops[i]))),
                (None, FinishReason::StopToken(t)) if c.user_stop_ids.contains(&t) => {
                    Finish::Stop(Some(json!(t)))
                }
                (None, FinishReason::Eos | FinishReason::StopToken(_)) => Finish::Stop(None),
                (None, FinishReason::MaxTokens | FinishReason::MaxModelLen) => Finish::Length,
                (None, FinishReason::Aborted) => Finish::Abort,
                (None, FinishReason::Grammar) => Finish::Grammar,
            })
        } else {
            None
        };
        if finish.is_some() {
            c.finished = true;
            // After a stop string the receiver stays open until the run
            // ends, so the engine thread counts the request by the Abort
            // just sent (as a stop), not as a client that went away.
            if stop.is_none() {
                self.events.remove(&index);
            }
        } else if text.is_empty() && logprobs.is_empty() {
            return None;
        }
        Some(Update { index, text, logprobs, finish })
    }
}

/// Admits the job, sends its engine requests and answers (JSON or SSE).
async fn start(st: Arc<AppState>, job: Job, arrival: Instant) -> Result<Response, ApiError> {
    let Job { api, prompts, max_tokens, spec, constraint, tools } = job;
    let n = spec.n;
    let mut permit = admit(&st, prompts.len() * n).await?;
    let eog: &[u32] = if spec.ignore_eos { &[] } else { &st.eog };
    let stop_tokens: Vec<u32> = eog.iter().chain(&spec.stop_token_ids).copied().collect();
    let top = spec.logprobs.unwrap_or(0);
    let mut run = Run {
        choices: Vec::new(),
        events: tokio_stream::StreamMap::new(),
        logprobs: spec.logprobs.is_some(),
        prompt_tokens: prompts.iter().map(Vec::len).sum(),
    };
    for (p, prompt) in prompts.iter().enumerate() {
        for j in 0..n {
            let index = p * n + j;
            let id = st.next_id.fetch_add(1, Ordering::Relaxed);
            let mut params = spec.params.clone();
            params.seed = params.seed.wrapping_add(index as u64);
            let request = Request {
                prompt: prompt.clone(),
                params,
                max_tokens: max_tokens[p],
                stop_tokens: stop_tokens.clone(),
                constraint: constraint.clone(),
            };
            let (tx, rx) = mpsc::unbounded_channel();
            let slot = permit.split(1).ok_or_else(|| ApiError::internal("admission slots miscounted"))?;
            let submit = Submit { id, request, top_logprobs: top, arrival, events: tx, permit: slot };
            st.commands
                .try_send(Command::Add(Box::new(submit)))
                .map_err(|_| ApiError::unavailable("The engine is not accepting requests."))?;
            run.choices.push(Choice {
                guard: AbortGuard { id, commands: st.commands.clone(), armed: true },
                text: ChoiceText::new(spec.stop.clone()),
                stops: spec.stop.clone(),
                user_stop_ids: spec.stop_token_ids.clone(),
                tokens: 0,
                finished: false,
            });
            run.events.insert(index, UnboundedReceiverStream::new(rx));
        }
    }
    let created =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let prefix = if api == Api::Chat { "chatcmpl" } else { "cmpl" };
    let header = Header {
        id: format!("{prefix}-{:016x}", super::api::random_seed()),
        created,
        model: st.model.clone(),
        api,
        logprobs: spec.logprobs.is_some(),
    };
    if spec.stream {
        Ok(stream(st, run, header, spec.include_usage, tools))
    } else {
        collect(&st, run, header, tools.as_ref()).await
    }
}

/// `n` choices with no text yet, ended by an abort until their run says otherwise.
fn empty_choices(n: usize) -> Vec<ChoiceOut> {
    (0..n)
        .map(|_| ChoiceOut {
            text: String::new(),
            logprobs: Vec::new(),
            finish: Finish::Abort,
            tool_calls: Vec::new(),
        })
        .collect()
}

/// Runs every choice to its end and answers with one JSON body.
async fn collect(
    st: &AppState,
    mut run: Run,
    header: Header,
    tools: Option<&Tools>,
) -> Result<Response, ApiError> {
    let mut out: Vec<ChoiceOut> = empty_choices(run.choices.len());
    while let Some(u) = run.next(&st.tokenizer).await {
        let c = &mut out[u.index];
        c.text.push_str(&u.text);
        c.logprobs.extend(u.logprobs);
        if let Some(f) = u.finish {
            if let Finish::Error(m) = &f {
                return Err(ApiError::internal(format!("The engine failed: {m}")));
            }
            c.finish = f;
        }
    }
    if let Some(t) = tools {
        for c in &mut out {
            if let Some((content, calls)) = tool_calls_of(c, t, false) {
                c.text = content;
                c.tool_calls = calls;
                c.finish = Finish::ToolCalls;
            }
        }
    }
    let body = sse::response(&header, &st.tokenizer, &out, run.prompt_tokens, run.completion_tokens());
    Ok(([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response())
}

/// The tool calls of a finished choice (OpenAI entries) and the content
/// left around them, trimmed (only at its end after streamed content,
/// `sent`, which began the content); `None` when it holds none or did not
/// end normally.
fn tool_calls_of(c: &ChoiceOut, tools: &Tools, sent: bool) -> Option<(String, Vec<serde_json::Value>)> {
    if !matches!(c.finish, Finish::Stop(_) | Finish::Grammar) {
        return None;
    }
    let (content, calls) = super::tools::parse_calls(&c.text, tools)?;
    let content = if sent { content.trim_end() } else { content.trim() }.to_string();
    let calls = calls.iter().enumerate().map(|(i, k)| k.json(i, &super::tools::call_id(), false)).collect();
    Some((content, calls))
}

/// Streams the choices as server-sent events from a task that stops (and
/// so aborts the engine requests) as soon as the client goes away. With
/// tools, a choice's text streams up to where a call could begin
/// ([`super::tools::releasable`]); the rest is held until the choice ends,
/// and its last chunk carries either that text or `delta.tool_calls` with
/// the content left around them.
fn stream(
    st: Arc<AppState>,
    mut run: Run,
    header: Header,
    include_usage: bool,
    tools: Option<Tools>,
) -> Response {
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(32);
    let mut held: Vec<ChoiceOut> = empty_choices(run.choices.len());
    let mut sent = vec![false; run.choices.len()];
    tokio::spawn(async move {
        if header.api == Api::Chat {
            for i in 0..run.choices.len() {
                let first = sse::chunk(&header, &st.tokenizer, i, "", &[], None, true);
                if tx.send(Ok(sse::event(&first))).await.is_err() {
                    return;
                }
            }
        }
        loop {
            let update = tokio::select! {
                _ = tx.closed() => return,
                u = run.next(&st.tokenizer) => u,
            };
            let Some(mut u) = update else { break };
            if let Some(t) = &tools {
                let c = &mut held[u.index];
                c.text.push_str(&u.text);
                c.logprobs.append(&mut u.logprobs);
                let Some(f) = u.finish.clone() else {
                    let n = super::tools::releasable(&c.text, sent[u.index]);
                    if n == 0 {
                        continue;
                    }
                    let text: String = c.text.drain(..n).collect();
                    let lp = std::mem::take(&mut c.logprobs);
                    sent[u.index] = true;
                    let ev = sse::chunk(&header, &st.tokenizer, u.index, &text, &lp, None, false);
                    if tx.send(Ok(sse::event(&ev))).await.is_err() {
                        return;
                    }
                    continue;
                };
                if !matches!(f, Finish::Error(_)) {
                    c.finish = f;
                    let ev = match tool_calls_of(c, t, sent[u.index]) {
                        Some((content, calls)) => {
                            let calls: Vec<serde_json::Value> = calls
                                .into_iter()
                                .enumerate()
                                .map(|(i, mut k)| {
                                    k["index"] = json!(i);
                                    k
                                })
                                .collect();
                            sse::tool_calls_chunk(
                                &header,
                                &st.tokenizer,
                                u.index,
                                &content,
                                &calls,
                                &c.logprobs,
                                &Finish::ToolCalls,
                            )
                        }
                        None => sse::chunk(
                            &header,
                            &st.tokenizer,
                            u.index,
                            &c.text,
                            &c.logprobs,
                            Some(&c.finish),
                            false,
                        ),
                    };
                    if tx.send(Ok(sse::event(&ev))).await.is_err() {
                        return;
                    }
                    continue;
                }
            }
            let bytes = match &u.finish {
                Some(Finish::Error(m)) => sse::event(&sse::error_event(m)),
                f => sse::event(&sse::chunk(
                    &header,
                    &st.tokenizer,
                    u.index,
                    &u.text,
                    &u.logprobs,
                    f.as_ref(),
                    false,
                )),
            };
            if tx.send(Ok(bytes)).await.is_err() {
                return;
            }
        }
        if include_usage {
            let last = sse::usage_chunk(&header, run.prompt_tokens, run.completion_tokens());
            if tx.send(Ok(sse::event(&last))).await.is_err() {
                return;
            }
        }
        let _ = tx.send(Ok(Bytes::from_static(sse::DONE.as_bytes()))).await;
    });
    let body = Body::from_stream(ReceiverStream::new(rx));
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(body)
        .unwrap_or_else(|_| ApiError::internal("cannot build the stream response").into_response())
}
