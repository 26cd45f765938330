//! `tessera serve`: an OpenAI-compatible HTTP server over the [`Engine`].
//!
//! Endpoints: `POST /v1/completions`, `POST /v1/chat/completions` (both
//! streaming as server-sent events or not, with `usage`), `GET /v1/models`,
//! `GET /health`, `GET /metrics` (Prometheus text).
//!
//! Who may use it: with an API key (`--api-key` or `TESSERA_API_KEY`), every
//! `/v1/*` request (unknown routes included) must carry `Authorization:
//! Bearer <key>`, else it gets a 401 (`auth.rs`, compared in constant time);
//! `/health` and `/metrics` stay open. The default bind is 127.0.0.1;
//! binding elsewhere without a key prints a warning.
//!
//! Threads and channels:
//!
//! ```text
//! calling thread (owns Engine + device)      tessera-http thread (tokio runtime, axum)
//!   worker::run  <--- Command (sync_channel, 2 x max_concurrent + 16) ---  handlers
//!                ---- Event (one unbounded channel per engine request) --> Run -> JSON / SSE
//!   publishes gauges ---------------> Metrics <------------------------- /metrics
//! ```
//!
//! The engine is single-threaded and owns the device, so the thread that
//! loaded it runs the engine loop ([`worker`]); the HTTP side runs on its
//! own thread with a tokio runtime. Tokenization, chat templates,
//! detokenization and stop strings run on the HTTP side.
//!
//! Bounds: at most `max_concurrent` engine requests exist at once (an
//! admission semaphore whose permits travel with the requests into the
//! engine thread and are released when the engine is done with them); at
//! most `queue_limit` HTTP requests wait for a slot, beyond that a request
//! gets 429; request bodies are capped by axum's 2 MB default. So memory is
//! bounded by `(max_concurrent + queue_limit)` requests.
//!
//! Shutdown (SIGINT/SIGTERM, or [`ServeOptions::stop`]): stop accepting
//! connections, answer 503 to new requests, let in-flight requests finish
//! for up to `shutdown_timeout`, then abort the rest (their streams end
//! with `finish_reason` = `abort`); when the last connection closes the
//! engine loop stops and [`serve_engine`] returns `Ok` (exit status 0). A
//! second signal aborts at once.

pub mod api;
mod auth;
pub mod copies;
pub mod error;
pub mod handlers;
pub mod metrics;
pub mod sse;
pub mod text;
pub mod tools;
pub mod worker;

#[cfg(test)]
mod real_model;
#[cfg(test)]
mod tests;

use crate::app::{EngineTask, Session, resolve_model};
use crate::chat::ChatTemplate;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::model::ActElem;
use crate::model::Device;
use crate::tokenizer::Tokenizer;
use api::Limits;
use axum::Router;
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use metrics::Metrics;
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{SyncSender, sync_channel};
use std::time::Duration;
use tokio::sync::{Notify, Semaphore};
use worker::Command;

/// How the server listens, admits and shuts down.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The name clients pass as `model` (default: the GGUF file's stem).
    pub served_model_name: Option<String>,
    /// Engine requests (running or queued in the scheduler) at once.
    pub max_concurrent: usize,
    /// HTTP requests waiting for an engine slot; beyond this, 429.
    pub queue_limit: usize,
    /// How long in-flight requests may run after a shutdown signal.
    pub shutdown_timeout: Duration,
    /// Shut down on SIGINT/SIGTERM.
    pub handle_signals: bool,
    /// An extra shutdown trigger (tests), notified once.
    pub stop: Option<Arc<Notify>>,
    /// The bearer token `/v1/*` requests must carry (`None`: open).
    pub api_key: Option<String>,
}

impl AppState {
    /// Compiles a request's structured-output constraint: a 400 naming
    /// `param` with the grammar engine's reason when it is invalid.
    pub fn compile_grammar(
        &self,
        spec: &crate::grammar::GrammarSpec,
        param: &str,
    ) -> std::result::Result<crate::grammar::Constraint, error::ApiError> {
        let compiler = self
            .grammar
            .get_or_init(|| {
                crate::grammar::GrammarCompiler::new(&self.tokenizer, self.limits.vocab_size)
                    .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| {
                error::ApiError::invalid(param, format!("Structured output is unavailable: {e}."))
            })?;
        compiler.compile(spec).map_err(|e| error::ApiError::invalid(param, format!("`{param}`: {e}")))
    }
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            served_model_name: None,
            max_concurrent: 256,
            queue_limit: 1024,
            shutdown_timeout: Duration::from_secs(30),
            handle_signals: true,
            stop: None,
            api_key: None,
        }
    }
}

/// What the HTTP side knows about the model.
pub struct ModelInfo {
    /// The served name.
    pub name: String,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
    /// The chat template (chat requests are 400 without one).
    pub template: Option<ChatTemplate>,
    /// Context length and vocabulary size.
    pub limits: Limits,
    /// End-of-generation tokens (stop tokens unless `ignore_eos`).
    pub eog: Vec<u32>,
}

/// State shared by the handlers.
pub struct AppState {
    /// The served model's name.
    pub model: String,
    /// Start time (unix seconds), reported by `/v1/models`.
    pub created: u64,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
    /// The chat template.
    pub template: Option<ChatTemplate>,
    /// Validation limits.
    pub limits: Limits,
    /// End-of-generation tokens.
    pub eog: Vec<u32>,
    /// Commands to the engine thread.
    pub commands: SyncSender<Command>,
    /// Admission slots (one per engine request).
    pub slots: Arc<Semaphore>,
    /// Total admission slots.
    pub max_concurrent: usize,
    /// Longest admission queue.
    pub queue_limit: usize,
    /// Requests waiting for slots now.
    pub queued: AtomicUsize,
    /// Set once shutdown begins.
    pub draining: AtomicBool,
    /// The next engine request id.
    pub next_id: AtomicU64,
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// The bearer token `/v1/*` requests must carry (`None`: open).
    pub api_key: Option<String>,
    /// The grammar compiler of structured output, built on first use (or
    /// why it cannot be built for this tokenizer).
    pub grammar: std::sync::OnceLock<std::result::Result<crate::grammar::GrammarCompiler, String>>,
}

/// The router over `state`.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(handlers::health))
        .route("/metrics", get(handlers::metrics))
        .route("/v1/models", get(handlers::models))
        .route("/v1/completions", post(handlers::completions))
        .route("/v1/chat/completions", post(handlers::chat))
        .fallback(handlers::not_found)
        .layer(axum::middleware::from_fn_with_state(state.clone(), auth::require_key))
        .with_state(state)
}

/// Serves `engine` on `listener` until shutdown; the calling thread runs the
/// engine loop (see the module doc).
pub fn serve_engine<D: Device, T: ActElem>(
    dev: &mut D,
    engine: &mut Engine<D, T>,
    info: ModelInfo,
    listener: TcpListener,
    opts: &ServeOptions,
) -> Result<()> {
    if opts.max_concurrent == 0 || opts.max_concurrent > Semaphore::MAX_PERMITS.min(u32::MAX as usize) {
        return Err(Error::Usage(format!("--max-concurrent {} is out of range", opts.max_concurrent)));
    }
    let (tx, rx) = sync_channel(2 * opts.max_concurrent + 16);
    let metrics = Arc::new(Metrics::default());
    let created =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let state = Arc::new(AppState {
        model: info.name,
        created,
        tokenizer: info.tokenizer,
        template: info.template,
        limits: info.limits,
        eog: info.eog,
        commands: tx.clone(),
        slots: Arc::new(Semaphore::new(opts.max_concurrent)),
        max_concurrent: opts.max_concurrent,
        queue_limit: opts.queue_limit,
        queued: AtomicUsize::new(0),
        draining: AtomicBool::new(false),
        next_id: AtomicU64::new(0),
        metrics: metrics.clone(),
        api_key: opts.api_key.clone(),
        grammar: std::sync::OnceLock::new(),
    });
    listener.set_nonblocking(true).map_err(|e| io_err("the listening socket", e))?;
    let stop = opts.stop.clone().unwrap_or_default();
    let http = {
        let (opts, stop) = (opts.clone(), stop.clone());
        std::thread::Builder::new()
            .name("tessera-http".into())
            .spawn(move || http_main(state, listener, opts, stop, tx))
            .map_err(|e| io_err("the HTTP thread", e))?
    };
    let result = worker::run(dev, engine, &rx, &metrics);
    // If the engine loop ended on its own (an error), the HTTP side must stop too.
    stop.notify_one();
    drop(rx);
    let served = http.join().map_err(|_| Error::Usage("the HTTP thread panicked".into()))?;
    result.and(served)
}

fn io_err(what: &str, source: std::io::Error) -> Error {
    Error::Io { path: what.to_string(), source }
}

/// The HTTP thread: a tokio runtime serving the router until shutdown, then
/// the engine loop's `Shutdown`.
fn http_main(
    state: Arc<AppState>,
    listener: TcpListener,
    opts: ServeOptions,
    stop: Arc<Notify>,
    commands: SyncSender<Command>,
) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("tessera-http")
        .build()
        .map_err(|e| io_err("the tokio runtime", e))?;
    let served = rt.block_on(async {
        let listener = nodelay_listener(listener)?;
        let signal = shutdown_signal(state.clone(), opts, stop);
        axum::serve(listener, router(state)).with_graceful_shutdown(signal).await
    });
    drop(rt);
    // Every connection is closed, so no request is left: stop the engine loop.
    let _ = commands.send(Command::Shutdown);
    served.map_err(|e| io_err("serving HTTP", e))
}

/// The tokio listener over `listener` whose accepted connections have
/// TCP_NODELAY set: a streamed token is one small write, which Nagle's
/// algorithm would otherwise hold back until the client acknowledges the
/// previous one, so tokens would leave in bursts.
fn nodelay_listener(listener: TcpListener) -> std::io::Result<NodelayListener> {
    Ok(tokio::net::TcpListener::from_std(listener)?.tap_io(set_nodelay as fn(&mut tokio::net::TcpStream)))
}

/// The listener of [`nodelay_listener`].
type NodelayListener = axum::serve::TapIo<tokio::net::TcpListener, fn(&mut tokio::net::TcpStream)>;

/// Sets TCP_NODELAY on an accepted connection (a failure is only reported:
/// the connection still works, with Nagle's delays).
fn set_nodelay(stream: &mut tokio::net::TcpStream) {
    if let Err(e) = stream.set_nodelay(true) {
        eprintln!("warning: cannot set TCP_NODELAY on a connection: {e}");
    }
}

/// Waits for a signal or `stop`, then starts draining; after the timeout
/// (or a second signal) aborts what is left.
async fn shutdown_signal(st: Arc<AppState>, opts: ServeOptions, stop: Arc<Notify>) {
    wait_for_stop(opts.handle_signals, &stop).await;
    st.draining.store(true, Ordering::Relaxed);
    st.slots.close();
    let live = st.max_concurrent - st.slots.available_permits().min(st.max_concurrent);
    eprintln!(
        "tessera: shutting down: no new requests; {live} in flight get up to {:.0} s to finish",
        opts.shutdown_timeout.as_secs_f64()
    );
    let timeout = opts.shutdown_timeout;
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::time::sleep(timeout) => {}
            _ = wait_for_stop(opts.handle_signals, &stop) => {}
        }
        eprintln!("tessera: aborting the requests still in flight");
        let _ = st.commands.try_send(Command::AbortAll);
    });
}

/// Resolves on SIGINT, SIGTERM (when `signals`) or a notification of `stop`.
async fn wait_for_stop(signals: bool, stop: &Notify) {
    if !signals {
        stop.notified().await;
        return;
    }
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
        _ = stop.notified() => {}
    }
}

/// The `serve` command as an [`EngineTask`]: binds, prints the address,
/// serves until shutdown.
pub struct Serve {
    /// The GGUF file (its tokenizer and template are read again for the
    /// HTTP side, which needs its own copies).
    pub model_path: PathBuf,
    /// Address to bind.
    pub host: String,
    /// Port (0: any free port; the chosen one is printed).
    pub port: u16,
    /// Server options.
    pub options: ServeOptions,
}

impl EngineTask for Serve {
    type Output = ();

    fn run<D: Device, T: ActElem>(self, s: Session<'_, D, T>) -> Result<()> {
        let Session { dev, engine, ctx } = s;
        let path = resolve_model(&self.model_path);
        let gguf = crate::gguf::Gguf::open(&path)?;
        let vocab = crate::gguf::Vocab::from_metadata(gguf.metadata())?;
        let tokenizer = Tokenizer::from_vocab(&vocab)?;
        let template = ChatTemplate::from_vocab(&vocab).ok();
        drop(gguf);
        let name = self.options.served_model_name.clone().unwrap_or_else(|| {
            path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into())
        });
        let limits = Limits {
            max_model_len: engine.scheduler().config().max_model_len,
            vocab_size: ctx.config.vocab_size,
        };
        let eog = tokenizer.eog_tokens().to_vec();
        let info = ModelInfo { name: name.clone(), tokenizer, template, limits, eog };
        let listener = TcpListener::bind((self.host.as_str(), self.port))
            .map_err(|e| io_err(&format!("binding {}:{}", self.host, self.port), e))?;
        let addr = listener.local_addr().map_err(|e| io_err("the listening socket", e))?;
        eprintln!(
            "tessera: serving `{name}` on {} (max_model_len {}, {} concurrent, queue {}); listening on http://{addr}",
            ctx.device, limits.max_model_len, self.options.max_concurrent, self.options.queue_limit
        );
        serve_engine(dev, engine, info, listener, &self.options)?;
        eprintln!("tessera: server stopped");
        Ok(())
    }
}

/// Arguments of `tessera serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// The model and engine.
    #[command(flatten)]
    pub model: crate::cli::ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// The model name clients send (default: the GGUF file name without extension).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Engine requests at once, running or queued in the scheduler (`n` > 1 counts n).
    #[arg(long, default_value_t = 256)]
    pub max_concurrent: usize,
    /// HTTP requests that may wait for an engine slot; beyond this, 429.
    #[arg(long, default_value_t = 1024)]
    pub queue_limit: usize,
    /// Seconds in-flight requests may run after SIGINT/SIGTERM before they are aborted.
    #[arg(long, default_value_t = 30.0)]
    pub shutdown_timeout: f64,
    /// The bearer token every `/v1/*` request must carry (default: the
    /// environment variable TESSERA_API_KEY; neither: no key is needed).
    #[arg(long)]
    pub api_key: Option<String>,
    /// Speculative decoding.
    #[command(flatten)]
    pub spec: crate::spec::cli::SpecArgs,
}

/// Runs `tessera serve`: loads the model, serves until a signal.
pub fn serve_cmd(a: &ServeArgs) -> Result<()> {
    if !(a.shutdown_timeout >= 0.0 && a.shutdown_timeout.is_finite()) {
        return Err(Error::Usage("--shutdown-timeout must be a non-negative number of seconds".into()));
    }
    let api_key = auth::key_from(a.api_key.clone(), std::env::var("TESSERA_API_KEY").ok())?;
    if api_key.is_none() && !auth::is_loopback(&a.host) {
        eprintln!(
            "tessera: warning: serving on {} without an API key: anyone who can reach it may use it \
             (set --api-key or TESSERA_API_KEY)",
            a.host
        );
    }
    let task = Serve {
        model_path: a.model.model.clone(),
        host: a.host.clone(),
        port: a.port,
        options: ServeOptions {
            served_model_name: a.served_model_name.clone(),
            max_concurrent: a.max_concurrent,
            queue_limit: a.queue_limit,
            shutdown_timeout: Duration::from_secs_f64(a.shutdown_timeout),
            handle_signals: true,
            stop: None,
            api_key,
        },
    };
    let opts = crate::app::LoadOptions { speculation: a.spec.speculation()?, ..a.model.load_options() };
    crate::app::run_task(&opts, task)
}
