//! The server side of the batch-invariance guarantee: one completion request
//! served alone, then `n` copies of it at once, over loopback, on a server
//! whose engine loop runs on the calling thread (so a GPU opened there can
//! serve). The caller compares the answers; they must be identical.

use super::{ModelInfo, ServeOptions, serve_engine};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::model::ActElem;
use crate::model::Device;
use serde_json::Value;
use std::net::TcpListener;
use std::sync::Arc;
use tokio::sync::Notify;

/// What `/v1/completions` answered for one request: the text and the
/// chosen tokens' logprobs (as the JSON numbers the server wrote).
pub type Answer = (String, Vec<String>);

fn failed(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Usage(format!("serving copies: {what}: {e}"))
}

/// The text and logprobs of a completions answer.
fn answer(v: &Value) -> Result<Answer> {
    let c = &v["choices"][0];
    let text = c["text"].as_str().ok_or_else(|| failed("no text in the answer", v))?.to_string();
    let lps = c["logprobs"]["token_logprobs"]
        .as_array()
        .ok_or_else(|| failed("no logprobs in the answer", v))?
        .iter()
        .map(|x| x.to_string())
        .collect();
    Ok((text, lps))
}

/// Serves `engine` on loopback while a client thread posts `body` (a
/// `/v1/completions` request, which should ask for `logprobs`) once alone
/// and then `copies` times concurrently; returns the `copies + 1` answers,
/// the lone one first. The server stops when the client is done.
pub fn serve_copies<D: Device, T: ActElem>(
    dev: &mut D,
    engine: &mut Engine<D, T>,
    info: ModelInfo,
    body: Value,
    copies: usize,
) -> Result<Vec<Answer>> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| failed("binding 127.0.0.1", e))?;
    let addr = listener.local_addr().map_err(|e| failed("the listening socket", e))?;
    let stop = Arc::new(Notify::new());
    let opts = ServeOptions { handle_signals: false, stop: Some(stop.clone()), ..ServeOptions::default() };
    let url = format!("http://{addr}/v1/completions");
    let client = std::thread::spawn(move || {
        let answers = client_requests(&url, &body, copies);
        stop.notify_one();
        answers
    });
    serve_engine(dev, engine, info, listener, &opts)?;
    client.join().map_err(|_| failed("the client thread", "panicked"))?
}

/// The client side of [`serve_copies`].
fn client_requests(url: &str, body: &Value, copies: usize) -> Result<Vec<Answer>> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| failed("the client runtime", e))?;
    rt.block_on(async {
        let c = reqwest::Client::new();
        let post = |c: reqwest::Client, url: String, body: String| async move {
            let r = c
                .post(&url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .map_err(|e| failed("posting", e))?;
            let status = r.status().as_u16();
            let text = r.text().await.map_err(|e| failed("reading the answer", e))?;
            if status != 200 {
                return Err(failed(&format!("status {status}"), text));
            }
            let v: Value = serde_json::from_str(&text).map_err(|e| failed("parsing the answer", e))?;
            answer(&v)
        };
        let mut out = vec![post(c.clone(), url.to_string(), body.to_string()).await?];
        let tasks: Vec<_> =
            (0..copies).map(|_| tokio::spawn(post(c.clone(), url.to_string(), body.to_string()))).collect();
        for t in tasks {
            out.push(t.await.map_err(|e| failed("a client task", e))??);
        }
        Ok(out)
    })
}
