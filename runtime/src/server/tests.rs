//! Server tests over loopback: a real server (engine thread on the CPU
//! interpreter with the tiny random Llama, axum on its own thread) and a
//! reqwest client.
//!
//! Covered: every bad-input case gets its status and OpenAI error JSON;
//! both endpoints answer with usage, logprobs and stop strings; the SSE
//! wire format; 64 concurrent streams equal the same greedy requests run
//! without streaming; a full queue answers 429; a client that disconnects
//! (streaming or not) frees its KV blocks (seen in /metrics); shutdown lets
//! in-flight requests finish, or aborts them at the deadline; `bench serve`
//! measures a running server.

use super::api::Limits;
use super::metrics::sample;
use super::{ModelInfo, ServeOptions, serve_engine};
use crate::chat::ChatTemplate;
use crate::check::model::tiny_model;
use crate::engine::Engine;
use crate::gguf::tiny::tiny_vocab;
use crate::model::{Model, Weights};
use crate::scheduler::SchedulerConfig;
use crate::tokenizer::Tokenizer;
use dsl_core::interp::Cpu;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// The served model's name in these tests.
const NAME: &str = "tiny";
/// Context length of the test engine.
const MAX_MODEL_LEN: usize = 128;

/// A server on 127.0.0.1 with its engine thread.
struct TestServer {
    addr: SocketAddr,
    stop: Arc<Notify>,
    thread: Option<JoinHandle<crate::Result<()>>>,
}

impl TestServer {
    /// Starts a server over the tiny model: `max_num_seqs` running at once,
    /// 160 KV blocks of 16 tokens.
    fn start(opts: ServeOptions, max_num_seqs: usize) -> TestServer {
        TestServer::start_with(opts, max_num_seqs, None, MAX_MODEL_LEN)
    }

    /// [`TestServer::start`] with another chat template and context length
    /// (at most the tiny model's 256).
    fn start_with(
        opts: ServeOptions,
        max_num_seqs: usize,
        template: Option<&'static str>,
        max_model_len: usize,
    ) -> TestServer {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(Notify::new());
        let opts = ServeOptions { handle_signals: false, stop: Some(stop.clone()), ..opts };
        let thread = std::thread::spawn(move || {
            let mut cpu = Cpu::new();
            let gguf = tiny_model()?;
            let weights = Weights::<Cpu, f32>::load(&mut cpu, &gguf)?;
            let vocab_size = weights.config.vocab_size;
            let model = Model::new(&mut cpu, weights, 160, 16)?;
            let config = SchedulerConfig {
                max_num_batched_tokens: 512,
                max_num_seqs,
                max_model_len,
                num_blocks: 160,
                block_size: 16,
                enable_prefix_caching: true,
            };
            let mut engine = Engine::new(model, config)?;
            let vocab = tiny_vocab(vocab_size)?;
            let tokenizer = Tokenizer::from_vocab(&vocab)?;
            let info = ModelInfo {
                name: NAME.into(),
                eog: tokenizer.eog_tokens().to_vec(),
                tokenizer,
                template: Some(match template {
                    Some(t) => ChatTemplate::new(t, "<|im_start|>", "<|im_end|>")?,
                    None => ChatTemplate::from_vocab(&vocab)?,
                }),
                limits: Limits { max_model_len, vocab_size },
            };
            serve_engine(&mut cpu, &mut engine, info, listener, &opts)
        });
        TestServer { addr, stop, thread: Some(thread) }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Triggers shutdown and waits for the server to stop; returns its result.
    fn shutdown(mut self) -> crate::Result<()> {
        self.stop.notify_one();
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.stop.notify_one();
            let _ = t.join();
        }
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().build().unwrap()
}

/// A server with the default options and 8 sequences at once, and a client.
fn default_server() -> (TestServer, reqwest::Client) {
    (TestServer::start(ServeOptions::default(), 8), client())
}

/// POSTs raw `body`; returns the status and the parsed JSON answer.
async fn post_raw(c: &reqwest::Client, url: &str, body: String) -> (u16, Value) {
    let r = c.post(url).header("content-type", "application/json").body(body).send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")))
}

async fn post(c: &reqwest::Client, url: &str, body: &Value) -> (u16, Value) {
    post_raw(c, url, body.to_string()).await
}

/// POSTs a streaming request and returns the `data:` payloads in order
/// (checking the framing on the way).
async fn stream(c: &reqwest::Client, url: &str, body: &Value) -> Vec<String> {
    let r =
        c.post(url).header("content-type", "application/json").body(body.to_string()).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let text = r.text().await.unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    events
        .iter()
        .map(|e| {
            e.strip_prefix("data: ").unwrap_or_else(|| panic!("not an SSE data event: {e:?}")).to_string()
        })
        .collect()
}

/// The server's metrics text.
async fn metrics(c: &reqwest::Client, s: &TestServer) -> String {
    c.get(s.url("/metrics")).send().await.unwrap().text().await.unwrap()
}

/// Polls /metrics until `ok` holds (at most 20 s).
async fn wait_metrics(c: &reqwest::Client, s: &TestServer, what: &str, ok: impl Fn(&str) -> bool) -> String {
    let t0 = Instant::now();
    loop {
        let m = metrics(c, s).await;
        if ok(&m) {
            return m;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "timed out waiting for {what}:\n{m}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn metric(m: &str, name: &str) -> f64 {
    sample(m, name).unwrap_or_else(|| panic!("no sample {name}"))
}

/// Asserts an OpenAI error answer.
fn assert_error(got: &(u16, Value), status: u16, kind: &str, param: Option<&str>, needle: &str) {
    let (s, v) = got;
    assert_eq!(*s, status, "{v}");
    let e = &v["error"];
    assert_eq!(e["type"], kind, "{v}");
    assert_eq!(e["param"].as_str(), param, "{v}");
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_inputs_get_their_status_and_an_openai_error() {
    let (s, c) = default_server();
    let comp = s.url("/v1/completions");
    let chat = s.url("/v1/chat/completions");
    let ok = json!({"model": NAME, "prompt": "hi", "max_tokens": 1});
    let with = |k: &str, v: Value| {
        let mut b = ok.clone();
        b[k] = v;
        b
    };
    assert_error(
        &post_raw(&c, &comp, "{\"model\": ".into()).await,
        400,
        "invalid_request_error",
        None,
        "not a valid",
    );
    assert_error(
        &post_raw(&c, &comp, "[1, 2]".into()).await,
        400,
        "invalid_request_error",
        None,
        "not a valid",
    );
    let wrong_type = with("temperature", json!("hot"));
    assert_error(&post(&c, &comp, &wrong_type).await, 400, "invalid_request_error", None, "invalid type");
    let r = post(&c, &comp, &with("model", json!("gpt-9"))).await;
    assert_error(&r, 404, "not_found_error", Some("model"), "gpt-9");
    assert_eq!(r.1["error"]["code"], "model_not_found");
    assert_error(
        &post(&c, &comp, &json!({"model": NAME})).await,
        400,
        "invalid_request_error",
        Some("prompt"),
        "required",
    );
    for (k, v) in [
        ("temperature", json!(2.5)),
        ("temperature", json!(-1)),
        ("top_p", json!(0)),
        ("top_p", json!(1.5)),
        ("top_k", json!(-2)),
        ("min_p", json!(1.5)),
        ("presence_penalty", json!(3)),
        ("frequency_penalty", json!(-2.5)),
        ("repetition_penalty", json!(0)),
        ("n", json!(0)),
        ("n", json!(17)),
        ("max_tokens", json!(0)),
        ("max_tokens", json!(-5)),
        ("logprobs", json!(21)),
        ("stop_token_ids", json!([100000])),
        ("best_of", json!(3)),
    ] {
        let got = post(&c, &comp, &with(k, v.clone())).await;
        assert_error(&got, 400, "invalid_request_error", Some(k), "");
        assert!(got.1["error"]["message"].as_str().unwrap().contains(k), "{k}={v}: {}", got.1);
    }
    assert_error(
        &post(&c, &comp, &with("stop", json!([""]))).await,
        400,
        "invalid_request_error",
        Some("stop"),
        "empty",
    );
    assert_error(
        &post(&c, &comp, &with("echo", json!(true))).await,
        400,
        "invalid_request_error",
        Some("echo"),
        "not supported",
    );
    // Fields the server does not know or does not implement are named, never ignored.
    let r = post(&c, &comp, &with("temprature", json!(0.5))).await;
    assert_error(&r, 400, "invalid_request_error", Some("temprature"), "Unknown request field");
    // A malformed response_format or an invalid schema: 400 with the reason.
    let msgs = json!([{"role": "user", "content": "hi"}]);
    for (rf, needle) in [
        (json!({"type": "xml"}), "not supported"),
        (json!("json"), "must be an object"),
        (json!({"type": "json_schema"}), "json_schema` is required"),
        (json!({"type": "json_schema", "json_schema": {"schema": {}}}), "name` is required"),
        (
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frob"}}}),
            "invalid JSON schema",
        ),
        (json!({"type": "json_object", "extra": 1}), "Unknown field `response_format.extra`"),
    ] {
        let r = post(&c, &chat, &json!({"model": NAME, "messages": msgs, "response_format": rf})).await;
        assert_error(&r, 400, "invalid_request_error", Some("response_format"), needle);
        let r = post(&c, &comp, &with("response_format", rf)).await;
        assert_error(&r, 400, "invalid_request_error", Some("response_format"), needle);
    }
    let r = post(
        &c,
        &chat,
        &json!({"model": NAME, "messages": [{"role": "user", "content": "hi"}],
        "tool_choice": "required"}),
    )
    .await;
    assert_error(&r, 400, "invalid_request_error", Some("tool_choice"), "needs `tools`");
    let r = post(&c, &comp, &with("prompt", json!([5, 100000]))).await;
    assert_error(&r, 400, "invalid_request_error", Some("prompt"), "outside the vocabulary");
    // Prompts beyond the context, with and without an explicit max_tokens.
    let long = "a ".repeat(200);
    let r = post(&c, &comp, &with("prompt", json!(long))).await;
    assert_error(&r, 400, "invalid_request_error", Some("prompt"), "maximum context length is 128 tokens");
    assert_eq!(r.1["error"]["code"], "context_length_exceeded");
    let r = post(&c, &comp, &json!({"model": NAME, "prompt": "hello", "max_tokens": 127})).await;
    assert_error(&r, 400, "invalid_request_error", Some("prompt"), "maximum context length");
    let r = post(&c, &comp, &json!({"model": NAME, "prompt": "hello", "max_tokens": 500})).await;
    assert_error(&r, 400, "invalid_request_error", Some("max_tokens"), "maximum context length");
    let r = post(&c, &chat, &json!({"model": NAME, "messages": [{"role": "user", "content": long}]})).await;
    assert_error(&r, 400, "invalid_request_error", Some("messages"), "maximum context length");
    // Chat-specific cases.
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let r = post(&c, &chat, &json!({"model": NAME, "messages": []})).await;
    assert_error(&r, 400, "invalid_request_error", Some("messages"), "empty");
    let r = post(&c, &chat, &json!({"model": NAME})).await;
    assert_error(&r, 400, "invalid_request_error", Some("messages"), "required");
    let image = json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]);
    let r = post(&c, &chat, &json!({"model": NAME, "messages": image})).await;
    assert_error(&r, 400, "invalid_request_error", Some("messages"), "image_url");
    let r = post(&c, &chat, &json!({"model": NAME, "messages": msgs, "top_logprobs": 2})).await;
    assert_error(&r, 400, "invalid_request_error", Some("top_logprobs"), "logprobs");
    let r = post(&c, &chat, &json!({"model": NAME, "messages": msgs, "logprobs": true, "top_logprobs": 30}))
        .await;
    assert_error(&r, 400, "invalid_request_error", Some("top_logprobs"), "out of range");
    let r = post(&c, &chat, &json!({"model": "other", "messages": msgs})).await;
    assert_error(&r, 404, "not_found_error", Some("model"), "other");
    // Unknown paths.
    let r = c.get(s.url("/v1/nothing")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let v: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    assert_eq!(v["error"]["type"], "not_found_error");
    // Nothing reached the engine.
    let m = metrics(&c, &s).await;
    assert_eq!(metric(&m, "tessera_prompt_tokens_total"), 0.0);
    s.shutdown().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_and_chat_answer_with_usage_logprobs_and_stops() {
    let (s, c) = default_server();
    let comp = s.url("/v1/completions");
    let models: Value =
        serde_json::from_str(&c.get(s.url("/v1/models")).send().await.unwrap().text().await.unwrap())
            .unwrap();
    assert_eq!(models["data"][0]["id"], NAME);
    assert_eq!(c.get(s.url("/health")).send().await.unwrap().status().as_u16(), 200);

    let base = json!({"model": NAME, "prompt": "the cat sat on", "max_tokens": 12, "temperature": 0, "ignore_eos": true,
        "user": "accepted and ignored"});
    let (st, full) = post(&c, &comp, &base).await;
    assert_eq!(st, 200, "{full}");
    assert_eq!(full["object"], "text_completion");
    let text = full["choices"][0]["text"].as_str().unwrap().to_string();
    assert_eq!(full["choices"][0]["finish_reason"], "length");
    let prompt_tokens = full["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens > 3);
    assert_eq!(full["usage"]["completion_tokens"], 12);
    assert_eq!(full["usage"]["total_tokens"], prompt_tokens + 12);

    // Logprobs: the greedy token is the best alternative, with the same logprob.
    let mut b = base.clone();
    b["logprobs"] = json!(3);
    let (_, v) = post(&c, &comp, &b).await;
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(v["choices"][0]["text"], text.as_str());
    let tokens = lp["token_logprobs"].as_array().unwrap();
    assert_eq!(tokens.len(), 12);
    for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let top = top.as_object().unwrap();
        assert!(!top.is_empty() && top.len() <= 3);
        let best = top.values().map(|x| x.as_f64().unwrap()).fold(f64::MIN, f64::max);
        let chosen = tokens[i].as_f64().unwrap();
        assert!((best - chosen).abs() < 1e-4, "token {i}: best {best} chosen {chosen}");
        assert!(chosen <= 0.0);
    }
    assert_eq!(lp["text_offset"][0], 0);

    // A stop string from the middle of the greedy text cuts it there.
    let chars: Vec<char> = text.chars().collect();
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let cut = &text[..text.find(&stop).unwrap()];
    let mut b = base.clone();
    b["stop"] = json!([stop]);
    let (_, v) = post(&c, &comp, &b).await;
    assert_eq!(v["choices"][0]["text"], cut, "stop {stop:?} in {text:?}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["stop_reason"], stop.as_str());
    b["stream"] = json!(true);
    let events = stream(&c, &comp, &b).await;
    let streamed: String = events[..events.len() - 1]
        .iter()
        .map(|e| {
            serde_json::from_str::<Value>(e).unwrap()["choices"][0]["text"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(streamed, cut);
    // Both stop-string requests count as stops, not as aborts.
    let m = wait_metrics(&c, &s, "stops counted", |m| {
        metric(m, "tessera_request_success_total{finished_reason=\"stop\"}") == 2.0
    })
    .await;
    assert_eq!(metric(&m, "tessera_request_success_total{finished_reason=\"abort\"}"), 0.0);

    // n = 2 with a seed: two choices, reproducible.
    let sampled = json!({"model": NAME, "prompt": "hello", "max_tokens": 6, "temperature": 1.0, "n": 2, "seed": 7, "ignore_eos": true});
    let (_, a) = post(&c, &comp, &sampled).await;
    let (_, b2) = post(&c, &comp, &sampled).await;
    assert_eq!(a["choices"].as_array().unwrap().len(), 2);
    assert_eq!(a["choices"][1]["index"], 1);
    assert_eq!(a["choices"], b2["choices"]);
    assert_eq!(a["usage"]["completion_tokens"], 12);

    // Chat: the template renders, usage counts the rendered prompt.
    let chat = json!({"model": NAME, "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                      "max_tokens": 5, "temperature": 0, "ignore_eos": true, "logprobs": true, "top_logprobs": 2});
    let (st, v) = post(&c, &s.url("/v1/chat/completions"), &chat).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["usage"]["completion_tokens"], 5);
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 10);
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 5);
    assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 2);
    s.shutdown().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_are_sse_chunks_ending_with_done_and_usage() {
    let (s, c) = default_server();
    let body = json!({"model": NAME, "messages": [{"role": "user", "content": "Tell me"}], "max_tokens": 6,
                      "temperature": 0, "ignore_eos": true});
    let chat = s.url("/v1/chat/completions");
    let (_, whole) = post(&c, &chat, &body).await;
    let mut b = body.clone();
    b["stream"] = json!(true);
    b["stream_options"] = json!({"include_usage": true});
    let events = stream(&c, &chat, &b).await;
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> =
        events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let id = chunks[0]["id"].as_str().unwrap();
    assert!(id.starts_with("chatcmpl-"));
    for ch in &chunks {
        assert_eq!(ch["object"], "chat.completion.chunk");
        assert_eq!(ch["id"], id);
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"].as_array().unwrap().len(), 0);
    assert_eq!(usage["usage"], whole["usage"]);
    let finishing: Vec<&Value> =
        chunks.iter().filter(|c| !c["choices"][0]["finish_reason"].is_null()).collect();
    assert_eq!(finishing.len(), 1);
    assert_eq!(finishing[0]["choices"][0]["finish_reason"], "length");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect::<Vec<_>>()
        .concat();
    assert_eq!(text, whole["choices"][0]["message"]["content"].as_str().unwrap());
    // Without include_usage there is no usage chunk.
    b["stream_options"] = json!({"include_usage": false});
    let events = stream(&c, &chat, &b).await;
    assert!(events.iter().all(|e| !e.contains("\"usage\"")));
    s.shutdown().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_streams_equal_the_non_streamed_greedy_outputs() {
    let s = Arc::new(TestServer::start(ServeOptions::default(), 64));
    let c = client();
    let body = |i: usize, stream: bool| {
        let words = ["the", "cat", "on", "a", "hat", "is", "in", "or"];
        let prompt: Vec<&str> = (0..3 + i % 5).map(|j| words[(i * 7 + j * 3) % words.len()]).collect();
        json!({"model": NAME, "prompt": format!("{i} {}", prompt.join(" ")), "max_tokens": 4 + i % 3,
               "temperature": 0, "ignore_eos": true, "stream": stream})
    };
    let mut tasks = Vec::new();
    for i in 0..64 {
        let (c, s) = (c.clone(), s.clone());
        tasks.push(tokio::spawn(async move {
            let (st, v) = post(&c, &s.url("/v1/completions"), &body(i, false)).await;
            assert_eq!(st, 200, "{v}");
            v["choices"][0]["text"].as_str().unwrap().to_string()
        }));
    }
    let mut want = Vec::new();
    for t in tasks {
        want.push(t.await.unwrap());
    }
    // The outputs differ between prompts, so a token sent to the wrong
    // stream would show.
    let distinct: std::collections::HashSet<&String> = want.iter().collect();
    assert!(distinct.len() >= 8, "{want:?}");
    let mut tasks = Vec::new();
    for i in 0..64 {
        let (c, s) = (c.clone(), s.clone());
        tasks.push(tokio::spawn(async move {
            let events = stream(&c, &s.url("/v1/completions"), &body(i, true)).await;
            let mut text = String::new();
            let mut finish = Vec::new();
            for e in &events[..events.len() - 1] {
                let v: Value = serde_json::from_str(e).unwrap();
                assert_eq!(v["choices"].as_array().unwrap().len(), 1, "{v}");
                text.push_str(v["choices"][0]["text"].as_str().unwrap());
                if !v["choices"][0]["finish_reason"].is_null() {
                    finish.push(v["choices"][0]["finish_reason"].clone());
                }
            }
            assert_eq!(finish, [json!("length")]);
            text
        }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        assert_eq!(t.await.unwrap(), want[i], "request {i}");
    }
    let m = metrics(&c, &s).await;
    assert_eq!(metric(&m, "tessera_request_success_total{finished_reason=\"length\"}"), 128.0);
    assert_eq!(metric(&m, "tessera_time_to_first_token_seconds_count"), 128.0);
    assert_eq!(metric(&m, "tessera_kv_cache_blocks_used"), 0.0);
    let gen_tokens: usize = (0..64).map(|i| 4 + i % 3).sum::<usize>() * 2;
    assert_eq!(metric(&m, "tessera_generation_tokens_total"), gen_tokens as f64);
    Arc::try_unwrap(s).ok().unwrap().shutdown().unwrap();
}

/// A request that runs for a long time (ignores EOS, fills the context).
fn long_request(stream: bool) -> Value {
    json!({"model": NAME, "prompt": "x", "max_tokens": MAX_MODEL_LEN - 2, "temperature": 0, "ignore_eos": true,
           "stream": stream})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_429_and_recovers() {
    let opts = ServeOptions { max_concurrent: 1, queue_limit: 1, ..ServeOptions::default() };
    let s = Arc::new(TestServer::start(opts, 4));
    let c = client();
    // A occupies the only engine slot.
    let a = c.post(s.url("/v1/completions")).body(long_request(true).to_string()).send().await.unwrap();
    assert_eq!(a.status().as_u16(), 200);
    // B waits in the queue.
    let b = {
        let (c, s) = (c.clone(), s.clone());
        let short = json!({"model": NAME, "prompt": "y", "max_tokens": 2});
        tokio::spawn(async move { post(&c, &s.url("/v1/completions"), &short).await })
    };
    wait_metrics(&c, &s, "B queued", |m| metric(m, "tessera_num_requests_queued") == 1.0).await;
    // C finds the queue full.
    let r = post(&c, &s.url("/v1/completions"), &json!({"model": NAME, "prompt": "z"})).await;
    assert_error(&r, 429, "rate_limit_error", None, "overloaded");
    let m = metrics(&c, &s).await;
    assert_eq!(metric(&m, "tessera_requests_rejected_total{reason=\"queue_full\"}"), 1.0);
    // A goes away; B gets the slot and completes.
    drop(a);
    let (st, v) = b.await.unwrap();
    assert_eq!(st, 200, "{v}");
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() <= 2);
    Arc::try_unwrap(s).ok().unwrap().shutdown().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnected_clients_free_their_kv_blocks() {
    let (s, c) = default_server();
    // Streaming: read the first chunk, then hang up.
    let mut r = c.post(s.url("/v1/completions")).body(long_request(true).to_string()).send().await.unwrap();
    let first = r.chunk().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    let m = metrics(&c, &s).await;
    assert!(metric(&m, "tessera_kv_cache_blocks_used") >= 1.0, "{m}");
    assert_eq!(metric(&m, "tessera_num_requests_running"), 1.0);
    drop(r);
    let m = wait_metrics(&c, &s, "blocks freed", |m| {
        metric(m, "tessera_kv_cache_blocks_used") == 0.0 && metric(m, "tessera_num_requests_running") == 0.0
    })
    .await;
    assert_eq!(metric(&m, "tessera_request_success_total{finished_reason=\"abort\"}"), 1.0);
    assert_eq!(metric(&m, "tessera_kv_cache_usage_ratio"), 0.0);
    assert!(metric(&m, "tessera_generation_tokens_total") < (MAX_MODEL_LEN - 2) as f64);
    // Non-streaming: the client gives up (timeout) while the request runs.
    let impatient = reqwest::Client::builder().timeout(Duration::from_millis(300)).build().unwrap();
    let r = impatient.post(s.url("/v1/completions")).body(long_request(false).to_string()).send().await;
    assert!(r.is_err());
    let m = wait_metrics(&c, &s, "blocks freed again", |m| {
        metric(m, "tessera_request_success_total{finished_reason=\"abort\"}") == 2.0
            && metric(m, "tessera_kv_cache_blocks_used") == 0.0
    })
    .await;
    assert_eq!(metric(&m, "tessera_num_requests_running"), 0.0);
    s.shutdown().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_in_flight_requests_then_aborts_at_the_deadline() {
    // A long deadline: the in-flight stream runs to its end.
    let (s, c) = default_server();
    let body = json!({"model": NAME, "prompt": "x", "max_tokens": 24, "temperature": 0, "ignore_eos": true, "stream": true});
    let mut r = c.post(s.url("/v1/completions")).body(body.to_string()).send().await.unwrap();
    let mut text = String::from_utf8(r.chunk().await.unwrap().unwrap().to_vec()).unwrap();
    s.stop.notify_one();
    while let Some(b) = r.chunk().await.unwrap() {
        text.push_str(std::str::from_utf8(&b).unwrap());
    }
    assert!(text.ends_with("data: [DONE]\n\n"));
    assert!(text.contains("\"finish_reason\":\"length\""), "{text}");
    s.shutdown().unwrap();

    // A short deadline: the stream ends as aborted, and the server still stops cleanly.
    let opts = ServeOptions { shutdown_timeout: Duration::from_millis(200), ..ServeOptions::default() };
    let s = TestServer::start(opts, 8);
    let mut r = c.post(s.url("/v1/completions")).body(long_request(true).to_string()).send().await.unwrap();
    let mut text = String::from_utf8(r.chunk().await.unwrap().unwrap().to_vec()).unwrap();
    s.stop.notify_one();
    while let Some(b) = r.chunk().await.unwrap() {
        text.push_str(std::str::from_utf8(&b).unwrap());
    }
    assert!(text.contains("\"finish_reason\":\"abort\""), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"));
    // New connections are refused once the server has stopped.
    s.shutdown().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_serve_measures_a_running_server() {
    let s = TestServer::start(ServeOptions::default(), 8);
    let args = crate::bench::serve::BenchServeArgs {
        url: s.url(""),
        model: None,
        num_prompts: 4,
        concurrency: vec![1, 4],
        rate: None,
        input_len: 6,
        output_len: 3,
        min_token_id: 3,
        max_token_id: 200,
        seed: 1,
        timeout: 60.0,
        json: None,
    };
    let reports = crate::bench::serve::bench(&args).await.unwrap();
    assert_eq!(reports.len(), 2);
    for r in &reports {
        assert_eq!((r.requests, r.completed), (4, 4), "{r:?}");
        assert_eq!((r.prompt_tokens, r.output_tokens), (24, 12), "{r:?}");
        assert!(r.ttft.p50 > 0.0 && r.tpot.p50 > 0.0 && r.e2e.p50 >= r.ttft.p50, "{r:?}");
        assert!(r.output_throughput() > 0.0);
    }
    assert_eq!(reports[1].concurrency, 4);
    let m = metrics(&client(), &s).await;
    assert_eq!(metric(&m, "tessera_request_success_total{finished_reason=\"length\"}"), 8.0);
    s.shutdown().unwrap();
}

/// The server side of batch invariance: a seeded sampled request served
/// alone and as 64 concurrent copies (which share the engine's steps in
/// every combination) gets 65 identical answers, logprobs included, on the
/// tiny model whose distributions are spread.
#[test]
fn a_request_alone_and_its_64_concurrent_copies_get_identical_answers() {
    use crate::check::model::tiny_flat_model;
    use crate::engine::invariance::{Setup, engine};
    let mut cpu = Cpu::new();
    let gguf = tiny_flat_model().unwrap();
    let mut e = engine::<Cpu, f32>(&mut cpu, &gguf, Setup::roomy(MAX_MODEL_LEN)).unwrap();
    let vocab_size = e.model().weights.config.vocab_size;
    let vocab = tiny_vocab(vocab_size).unwrap();
    let tokenizer = Tokenizer::from_vocab(&vocab).unwrap();
    let info = ModelInfo {
        name: NAME.into(),
        eog: tokenizer.eog_tokens().to_vec(),
        tokenizer,
        template: None,
        limits: Limits { max_model_len: MAX_MODEL_LEN, vocab_size },
    };
    let body = json!({"model": NAME, "prompt": "the cat on a hat is in the hat", "max_tokens": 10,
                      "temperature": 0.9, "seed": 5, "logprobs": 1, "ignore_eos": true});
    let answers = super::copies::serve_copies(&mut cpu, &mut e, info, body, 64).unwrap();
    assert_eq!(answers.len(), 65);
    let (text, lps) = &answers[0];
    assert_eq!(lps.len(), 10, "{answers:?}");
    assert!(lps.iter().all(|l| l.parse::<f64>().unwrap() < -0.01), "{lps:?}");
    for (i, a) in answers.iter().enumerate() {
        assert_eq!((&a.0, &a.1), (text, lps), "copy {i}");
    }
}

/// Accepted connections have TCP_NODELAY set, so each streamed token
/// leaves as soon as it is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_connections_do_not_wait_for_acks() {
    use axum::serve::Listener;
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    std_listener.set_nonblocking(true).unwrap();
    let addr = std_listener.local_addr().unwrap();
    let mut listener = super::nodelay_listener(std_listener).unwrap();
    let client = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (stream, _) = listener.accept().await;
    assert!(stream.nodelay().unwrap());
    drop(client);
}

/// With an API key, every `/v1/*` route (an unknown one too, and streaming
/// requests) answers 401 without the right bearer token and works with it;
/// `/health` and `/metrics` stay open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_key_guards_every_v1_route() {
    const KEY: &str = "sk-test-0123456789";
    let s = TestServer::start(ServeOptions { api_key: Some(KEY.into()), ..ServeOptions::default() }, 4);
    let c = client();
    let comp = json!({"model": NAME, "prompt": "the cat", "max_tokens": 3, "temperature": 0});
    let chat = json!({"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3});
    let with_stream = |v: &Value| {
        let mut v = v.clone();
        v["stream"] = json!(true);
        v
    };
    let routes: Vec<(&str, &str, Option<Value>)> = vec![
        ("GET", "/v1/models", None),
        ("POST", "/v1/completions", Some(comp.clone())),
        ("POST", "/v1/completions", Some(with_stream(&comp))),
        ("POST", "/v1/chat/completions", Some(chat.clone())),
        ("POST", "/v1/chat/completions", Some(with_stream(&chat))),
        ("GET", "/v1/nothing", None),
    ];
    for (method, path, body) in &routes {
        for auth in
            [None, Some("Bearer wrong-key"), Some("sk-test-0123456789"), Some("Bearer sk-test-01234567890")]
        {
            let mut rq = if *method == "GET" { c.get(s.url(path)) } else { c.post(s.url(path)) };
            if let Some(b) = body {
                rq = rq.header("content-type", "application/json").body(b.to_string());
            }
            if let Some(a) = auth {
                rq = rq.header("authorization", a);
            }
            let r = rq.send().await.unwrap();
            assert_eq!(r.status().as_u16(), 401, "{method} {path} with {auth:?}");
            let v: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
            assert_eq!(v["error"]["code"], "invalid_api_key", "{method} {path}");
            let want = if auth.is_none() { "needs an API key" } else { "Incorrect API key" };
            assert!(v["error"]["message"].as_str().unwrap().contains(want), "{v}");
        }
        let mut rq = if *method == "GET" { c.get(s.url(path)) } else { c.post(s.url(path)) };
        if let Some(b) = body {
            rq = rq.header("content-type", "application/json").body(b.to_string());
        }
        let r = rq.header("authorization", format!("Bearer {KEY}")).send().await.unwrap();
        let want = if *path == "/v1/nothing" { 404 } else { 200 };
        assert_eq!(r.status().as_u16(), want, "{method} {path} with the key");
        let text = r.text().await.unwrap();
        if body.as_ref().is_some_and(|b| b["stream"] == json!(true)) {
            assert!(text.trim_end().ends_with("data: [DONE]"), "{path}: {text}");
        }
    }
    for open in ["/health", "/metrics"] {
        assert_eq!(c.get(s.url(open)).send().await.unwrap().status().as_u16(), 200, "{open}");
    }
    // Nothing that was refused reached the engine: only the four authorized
    // generations (at most 3 tokens each) ran.
    let m = metrics(&c, &s).await;
    let generated = metric(&m, "tessera_generation_tokens_total");
    assert!(generated > 0.0 && generated <= 12.0, "{m}");
    s.shutdown().unwrap();
}

/// A chat template that renders `tools` (their names) and tool calls.
const TOOLS_TEMPLATE: &str = "{% if tools %}T:{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}\
{% for m in messages %}{{ m.role }}:{{ m.content }}{% if m.tool_calls %}{{ m.tool_calls[0].function.name }}\
{% endif %}\n{% endfor %}A:";

/// A bounded schema: every output of the tiny model must finish inside it.
fn bounded_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "n": {"type": "integer", "minimum": 0, "maximum": 99},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 2}
        },
        "required": ["name", "n", "tags"],
        "additionalProperties": false
    })
}

/// Checks `text` against `schema` with a JSON-schema validator.
fn assert_valid(schema: &Value, text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    let validator = jsonschema::validator_for(schema).unwrap();
    assert!(validator.is_valid(&v), "{text} does not match {schema}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_format_constrains_both_endpoints_streaming_or_not() {
    let s = TestServer::start_with(ServeOptions::default(), 8, None, 256);
    let c = client();
    let schema = bounded_schema();
    let rf =
        json!({"type": "json_schema", "json_schema": {"name": "item", "schema": schema, "strict": true}});
    let chat_body = json!({"model": NAME, "messages": [{"role": "user", "content": "Give me an item"}],
                           "max_tokens": 100, "temperature": 0.8, "seed": 3, "n": 3, "response_format": rf});
    let (st, v) = post(&c, &s.url("/v1/chat/completions"), &chat_body).await;
    assert_eq!(st, 200, "{v}");
    for ch in v["choices"].as_array().unwrap() {
        assert_eq!(ch["finish_reason"], "stop", "{v}");
        assert_valid(&schema, ch["message"]["content"].as_str().unwrap());
    }
    let comp_body = json!({"model": NAME, "prompt": ["Item:", "Another item:"], "max_tokens": 100,
                           "temperature": 0, "response_format": rf});
    let (st, v) = post(&c, &s.url("/v1/completions"), &comp_body).await;
    assert_eq!(st, 200, "{v}");
    let texts: Vec<String> =
        v["choices"].as_array().unwrap().iter().map(|ch| ch["text"].as_str().unwrap().to_string()).collect();
    for t in &texts {
        assert_valid(&schema, t);
    }
    // Streamed: the same greedy text, chunk by chunk.
    let mut b = comp_body.clone();
    b["prompt"] = json!("Item:");
    b["stream"] = json!(true);
    let events = stream(&c, &s.url("/v1/completions"), &b).await;
    let text: String = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|ch| ch["choices"][0]["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(text, texts[0]);
    // json_object: a JSON object whenever the output finished.
    let mut b = chat_body.clone();
    b["response_format"] = json!({"type": "json_object"});
    b["max_tokens"] = json!(40);
    let (st, v) = post(&c, &s.url("/v1/chat/completions"), &b).await;
    assert_eq!(st, 200, "{v}");
    for ch in v["choices"].as_array().unwrap() {
        let text = ch["message"]["content"].as_str().unwrap();
        assert!(text.starts_with('{'), "{text:?}");
        if ch["finish_reason"] == "stop" {
            assert!(serde_json::from_str::<Value>(text).unwrap().is_object());
        }
    }
    // type text: free text, as without response_format.
    let mut b = comp_body.clone();
    b["response_format"] = json!({"type": "text"});
    b["max_tokens"] = json!(5);
    let (st, with_text) = post(&c, &s.url("/v1/completions"), &b).await;
    b.as_object_mut().unwrap().remove("response_format");
    let (_, without) = post(&c, &s.url("/v1/completions"), &b).await;
    assert_eq!(st, 200);
    assert_eq!(with_text["choices"], without["choices"]);
    s.shutdown().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_named_and_required_answer_with_tool_calls_streaming_or_not() {
    // A short template that renders the tools itself (the byte-level tiny
    // vocabulary cannot fit the Hermes tool prompt in its context).
    let s = TestServer::start_with(ServeOptions::default(), 8, Some(TOOLS_TEMPLATE), 256);
    let c = client();
    let chat = s.url("/v1/chat/completions");
    let params = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                        "required": ["city", "days"], "additionalProperties": false});
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": params}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
            "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"], "additionalProperties": false}}}
    ]);
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    let body = |choice: Value, stream: bool| {
        json!({"model": NAME, "messages": [{"role": "user", "content": "Weather in Oslo?"}], "max_tokens": 120,
               "temperature": 0, "tools": tools, "tool_choice": choice, "parallel_tool_calls": false,
               "stream": stream})
    };
    for choice in [named.clone(), json!("required")] {
        let (st, v) = post(&c, &chat, &body(choice.clone(), false)).await;
        assert_eq!(st, 200, "{v}");
        let ch = &v["choices"][0];
        assert_eq!(ch["finish_reason"], "tool_calls", "{v}");
        assert!(ch["message"]["content"].is_null(), "{v}");
        let calls = ch["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{v}");
        assert_eq!(calls[0]["type"], "function");
        assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
        let name = calls[0]["function"]["name"].as_str().unwrap();
        if choice == named {
            assert_eq!(name, "get_weather");
        }
        let args: Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
        let schema = &tools.as_array().unwrap().iter().find(|t| t["function"]["name"] == name).unwrap()["function"]
            ["parameters"];
        assert!(jsonschema::validator_for(schema).unwrap().is_valid(&args), "{args} vs {schema}");
        // Streamed: the same call in delta.tool_calls on the finishing chunk.
        let events = stream(&c, &chat, &body(choice, true)).await;
        let chunks: Vec<Value> =
            events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
        let last = chunks.iter().find(|c| !c["choices"][0]["finish_reason"].is_null()).unwrap();
        assert_eq!(last["choices"][0]["finish_reason"], "tool_calls");
        let delta = &last["choices"][0]["delta"]["tool_calls"][0];
        assert_eq!(delta["index"], 0);
        assert_eq!(delta["function"]["name"], calls[0]["function"]["name"]);
        assert_eq!(delta["function"]["arguments"], calls[0]["function"]["arguments"]);
    }
    // auto and none: answered (text or calls), never an error.
    for choice in [json!("auto"), json!("none")] {
        let (st, v) = post(&c, &chat, &body(choice, false)).await;
        assert_eq!(st, 200, "{v}");
    }
    // auto, streamed: text goes out as it is generated (up to where a call
    // could begin) and adds up to the unstreamed answer's content.
    let (_, v) = post(&c, &chat, &body(json!("auto"), false)).await;
    let want = v["choices"][0]["message"]["content"].as_str().unwrap_or("").to_string();
    let events = stream(&c, &chat, &body(json!("auto"), true)).await;
    let parts: Vec<String> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|ch| ch["choices"][0]["delta"]["content"].as_str().map(str::to_string))
        .filter(|t| !t.is_empty())
        .collect();
    assert_eq!(parts.concat(), want, "{v}");
    if v["choices"][0]["finish_reason"] != "tool_calls" && !want.trim_start().starts_with(['{', '[']) {
        assert!(parts.len() > 1, "the text came in one chunk: {parts:?}");
    }
    // A conversation with an earlier call and its result renders and runs.
    let mut b = body(json!("auto"), false);
    b["messages"] = json!([
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"days\": 1}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    ]);
    let (st, v) = post(&c, &chat, &b).await;
    assert_eq!(st, 200, "{v}");
    // Bad tools and a named function outside them are 400s.
    let mut b = body(json!({"type": "function", "function": {"name": "nope"}}), false);
    assert_error(&post(&c, &chat, &b).await, 400, "invalid_request_error", Some("tool_choice"), "nope");
    b["tool_choice"] = json!("auto");
    b["tools"] = json!([{"type": "function", "function": {"name": "x", "parameters": {"type": "frob"}}}]);
    b["tool_choice"] = json!("required");
    assert_error(&post(&c, &chat, &b).await, 400, "invalid_request_error", Some("tool_choice"), "invalid");
    s.shutdown().unwrap();
}
