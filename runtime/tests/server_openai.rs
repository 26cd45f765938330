//! The `tessera serve` binary end to end: it serves a tiny random GGUF on
//! the CPU interpreter at 127.0.0.1 on a free port, the official `openai`
//! Python client (pinned; installed by `.ci/setup` under
//! `target/tools/openai-*/`) runs `openai_client.py` against it (both
//! endpoints, streaming and not, usage, logprobs, n, stop strings, error
//! classes, `response_format` and `tools`), and SIGTERM then stops the server with exit status 0.
//!
//! The test fails (it does not skip) when python3 or the client is missing:
//! run `.ci/setup` (or `make test`, which runs it) first.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Kills the server if the test fails before stopping it.
struct Server {
    child: Child,
    log: Arc<Mutex<String>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes the tiny random Llama (with the SmolLM2 vocabulary layout and chat
/// template) to a fresh file.
fn tiny_gguf() -> PathBuf {
    let mut t = runtime::check::model::tiny_llama();
    // Room for the tool prompt in the byte-level tiny vocabulary.
    t.config.context_length = 1024;
    let dir = std::env::temp_dir().join(format!("tessera-serve-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tiny.gguf");
    std::fs::write(&path, t.to_bytes().unwrap()).unwrap();
    path
}

/// The pinned openai client's directory under target/tools.
fn openai_dir() -> PathBuf {
    let tools = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tools");
    let found = std::fs::read_dir(&tools).ok().and_then(|entries| {
        entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("openai-")))
            .find(|p| p.join(".complete").is_file())
    });
    found.unwrap_or_else(|| {
        panic!("the openai Python client is not installed under {}: run .ci/setup", tools.display())
    })
}

/// Starts `tessera serve` on a free port and returns it with its base URL.
fn start(model: &Path) -> (Server, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["serve", "--device", "cpu", "--host", "127.0.0.1", "--port", "0"])
        .args(["--served-model-name", "tiny", "--max-model-len", "1024", "--kv-blocks", "256", "--quiet"])
        .args(["--shutdown-timeout", "10", "--model"])
        .arg(model)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning tessera serve");
    let stderr = child.stderr.take().unwrap();
    let log = Arc::new(Mutex::new(String::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let sink = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(i) = line.find("listening on http://") {
                let _ = tx.send(line[i + "listening on ".len()..].trim().to_string());
            }
            let mut l = sink.lock().unwrap();
            l.push_str(&line);
            l.push('\n');
        }
    });
    let server = Server { child, log };
    let url = rx
        .recv_timeout(Duration::from_secs(120))
        .unwrap_or_else(|_| panic!("the server did not start:\n{}", server.log.lock().unwrap()));
    (server, url)
}

#[test]
fn official_openai_client_talks_to_tessera_serve() {
    let openai = openai_dir();
    let model = tiny_gguf();
    let (mut server, url) = start(&model);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(&url)
        .arg("tiny")
        .env("PYTHONPATH", &openai)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .output()
        .expect("running python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    assert!(
        out.status.success(),
        "openai_client.py failed:\n{stdout}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.log.lock().unwrap()
    );
    assert!(stdout.contains("checks passed"), "{stdout}");

    // SIGTERM: graceful shutdown, exit status 0.
    let pid = server.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = server.child.try_wait().unwrap() {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "the server ignored SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    // The log thread may still be reading the last lines.
    std::thread::sleep(Duration::from_millis(100));
    let log = server.log.lock().unwrap().clone();
    assert!(status.success(), "exit status {status:?}; log:\n{log}");
    assert!(log.contains("shutting down") && log.contains("server stopped"), "{log}");
    let _ = std::fs::remove_file(&model);
    let _ = std::fs::remove_dir(model.parent().unwrap());
}
