//! The server on the real model (SmolLM2-135M Q4_1, fetched by `make
//! model`) on the native CPU backend, through the whole loader path: greedy
//! completions of the golden prompts over HTTP equal llama.cpp's
//! continuation (the clear-gap prefix the golden rule requires), streamed
//! and not, and the chat endpoint answers the `make run` question.

use super::api::Limits;
use super::{ModelInfo, ServeOptions, serve_engine};
use crate::app::{EngineTask, LoadOptions, Session, resolve_model, run_task};
use crate::chat::ChatTemplate;
use crate::error::Result;
use crate::model::ActElem;
use crate::model::Device;
use crate::parity::Golden;
use crate::tokenizer::Tokenizer;
use serde_json::{Value, json};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::Notify;

/// Serves the loaded engine on a bound listener until `stop`.
struct ServeOn {
    listener: TcpListener,
    stop: Arc<Notify>,
}

impl EngineTask for ServeOn {
    type Output = ();

    fn run<D: Device, T: ActElem>(self, s: Session<'_, D, T>) -> Result<()> {
        let Session { dev, engine, ctx } = s;
        let gguf = crate::gguf::Gguf::open(resolve_model(&PathBuf::from(crate::app::DEFAULT_MODEL)))?;
        let vocab = crate::gguf::Vocab::from_metadata(gguf.metadata())?;
        let tokenizer = Tokenizer::from_vocab(&vocab)?;
        let template = ChatTemplate::from_vocab(&vocab).ok();
        let limits = Limits {
            max_model_len: engine.scheduler().config().max_model_len,
            vocab_size: ctx.config.vocab_size,
        };
        let eog = tokenizer.eog_tokens().to_vec();
        let info = ModelInfo { name: "smollm2".into(), tokenizer, template, limits, eog };
        let opts = ServeOptions { handle_signals: false, stop: Some(self.stop), ..ServeOptions::default() };
        serve_engine(dev, engine, info, self.listener, &opts)
    }
}

/// POSTs `body` as JSON.
async fn post(c: &reqwest::Client, url: &str, body: &Value) -> reqwest::Response {
    c.post(url).header("content-type", "application/json").body(body.to_string()).send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm2_serves_the_golden_continuations_on_the_native_backend() {
    let golden = Golden::bundled();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = Arc::new(Notify::new());
    let task = ServeOn { listener, stop: stop.clone() };
    let opts = LoadOptions::native_test(256, 64);
    let server = std::thread::spawn(move || run_task(&opts, task));
    let c = reqwest::Client::new();
    let url = |p: &str| format!("http://{addr}{p}");
    // The listener is bound already: requests made while the model loads
    // wait in its backlog.
    let tokenizer = {
        let gguf = crate::gguf::Gguf::open(resolve_model(&PathBuf::from(crate::app::DEFAULT_MODEL))).unwrap();
        Tokenizer::from_vocab(&crate::gguf::Vocab::from_metadata(gguf.metadata()).unwrap()).unwrap()
    };
    for (i, case) in golden.cases.iter().enumerate() {
        let n = case.must_match.max(1);
        let want = tokenizer.decode(&case.token_ids[..n], false).unwrap();
        for stream in [false, true] {
            let body = json!({"model": "smollm2", "prompt": case.prompt, "max_tokens": n, "temperature": 0,
                              "ignore_eos": true, "stream": stream});
            let r = post(&c, &url("/v1/completions"), &body).await;
            assert_eq!(r.status(), 200);
            let raw = r.text().await.unwrap();
            let text = if stream {
                raw.lines()
                    .filter_map(|l| l.strip_prefix("data: "))
                    .filter(|d| *d != "[DONE]")
                    .map(|d| {
                        let v: Value = serde_json::from_str(d).unwrap();
                        v["choices"][0]["text"].as_str().unwrap_or("").to_string()
                    })
                    .collect::<String>()
            } else {
                let v: Value = serde_json::from_str(&raw).unwrap();
                v["choices"][0]["text"].as_str().unwrap().to_string()
            };
            assert_eq!(text, want, "case {i}, stream {stream}");
        }
    }
    let body = json!({"model": "smollm2", "max_tokens": 24, "temperature": 0,
                      "messages": [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]});
    let raw = post(&c, &url("/v1/chat/completions"), &body).await.text().await.unwrap();
    let v: Value = serde_json::from_str(&raw).unwrap();
    let answer = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(answer.contains("Paris"), "{answer}");
    stop.notify_one();
    server.join().unwrap().unwrap();
}
