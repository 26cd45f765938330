//! Autotuning support for [`super::Cuda::run_tuned`]: the pure parts (cache
//! keys, the on-disk file format, choosing the winner from timings, mapping the
//! kernel's autotune key names to argument values, the one-line note) and the
//! [`Tuner`] that keeps winners in memory and in `autotune.json`.
//!
//! A result is keyed by device name, compute capability, kernel name, the
//! config key of the base config (the "family": what the candidates leave
//! open, such as dtype generics and block sizes), the values of the kernel's
//! key parameters, the compiler version (runtime version plus LLVM
//! version) and the PTX cache key of the base config's function (its IR,
//! the compiler's sources, LLVM and the target: a changed kernel or lowering
//! is tuned again). The value stored is the winner's [`Kernel::config_key`] and its
//! median time.
//!
//! The cache lives in `$TESSERA_CACHE_DIR/autotune.json`, else in
//! `~/.cache/tessera/autotune.json`. It is written atomically (a temporary file
//! renamed over it), merged with what is on disk at the time of writing, and a
//! file that cannot be read or parsed is never fatal: the tuner warns once on
//! stderr and tunes again (overwriting it with a good file).
//!
//! With `TESSERA_TUNE_VERBOSE=1` every candidate's median is printed on
//! stderr as it is timed (as Triton's `TRITON_PRINT_AUTOTUNING`).
//!
//! [`Kernel::config_key`]: dsl_core::launch::Kernel::config_key

use crate::error::{Error, Result};
use dsl_core::launch::Arg;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::fmt::Debug;
use std::path::{Path, PathBuf};

/// Untimed launches of each candidate before timing it.
pub const WARMUP: usize = 2;
/// Timed launches of each candidate (the median counts).
pub const RUNS: usize = 10;
/// The cache file's name inside the cache directory.
pub const CACHE_FILE: &str = "autotune.json";
/// The version of the cache file format.
pub const FORMAT_VERSION: u64 = 1;

/// True when `TESSERA_TUNE_VERBOSE` is set to anything but `0` or empty:
/// print every candidate's time.
pub fn verbose() -> bool {
    std::env::var_os("TESSERA_TUNE_VERBOSE").is_some_and(|v| !v.is_empty() && v != "0")
}

/// Everything an autotune result depends on.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TuneKey {
    /// The device name, e.g. `NVIDIA H100 80GB HBM3`.
    pub device: String,
    /// The device's compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// The kernel's name.
    pub kernel: String,
    /// The config key of the base config the candidates were applied to.
    pub family: String,
    /// `(parameter name, value)` of each autotune key parameter, in key order.
    pub key: Vec<(String, String)>,
    /// The compiler version (see [`compiler_version`]).
    pub compiler: String,
    /// The PTX cache key of the base config's function
    /// ([`codegen::PtxCache::key`]), which hashes its IR, the compiler's own
    /// sources, LLVM's version and the target: a choice tuned before the
    /// kernel or the lowering changed is tuned again instead of reused
    /// (a change that only alters candidates' IR, not the base's, is not
    /// seen).
    pub code: String,
}

impl TuneKey {
    /// The text key of this result in the caches: a JSON array of every
    /// component, so no choice of names can make two keys collide.
    pub fn cache_key(&self) -> String {
        let key: Vec<Value> = self.key.iter().map(|(n, v)| json!([n, v])).collect();
        json!([
            self.device,
            format!("sm_{}{}", self.compute_capability.0, self.compute_capability.1),
            self.kernel,
            self.family,
            key,
            self.compiler,
            self.code
        ])
        .to_string()
    }

    /// The key values in words: `n_cols=16384, stride=16384`.
    pub fn describe_key(&self) -> String {
        self.key.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>().join(", ")
    }
}

/// The compiler version that tuned results depend on: this crate's version
/// (the workspace's, shared with `codegen`) and the LLVM `codegen` links.
pub fn compiler_version() -> String {
    format!("tessera {} llvm {}", env!("CARGO_PKG_VERSION"), codegen::target::llvm_version())
}

/// The values of the autotune key parameters `names` among a kernel's IR
/// parameters `params`, read from the erased launch arguments `args` (in
/// parameter order).
///
/// Errors ([`Error::Launch`]): a name that is not a parameter, or whose
/// argument is missing or is not a scalar.
pub fn key_values<P>(
    kernel: &str,
    names: &[&str],
    params: &[String],
    args: &[Arg<P>],
) -> Result<Vec<(String, String)>> {
    let err = |message: String| Error::Launch { kernel: kernel.to_string(), message };
    names
        .iter()
        .map(|&name| {
            let i = params.iter().position(|p| p == name).ok_or_else(|| {
                err(format!(
                    "autotune key `{name}` is not a parameter of the kernel (parameters: {})",
                    params.join(", ")
                ))
            })?;
            match args.get(i) {
                Some(Arg::Scalar(s)) => Ok((name.to_string(), s.to_string())),
                Some(Arg::Ptr(_)) => Err(err(format!("autotune key `{name}` is a pointer, not a scalar"))),
                None => Err(err(format!(
                    "autotune key `{name}` is parameter {i}, but only {} arguments were passed",
                    args.len()
                ))),
            }
        })
        .collect()
}

/// The index of the winner among candidates' median times (`None` for one that
/// failed): the smallest finite median, the first on ties; `None` when every
/// candidate failed.
pub fn choose_winner(medians: &[Option<f64>]) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (i, m) in medians.iter().enumerate() {
        if let Some(m) = *m
            && m.is_finite()
            && best.is_none_or(|(_, b)| m < b)
        {
            best = Some((i, m));
        }
    }
    best.map(|(i, _)| i)
}

/// The fields of a derived `Debug` struct (`Name { a: 1, b: F32 }`), or `None`
/// when `text` does not look like one.
fn debug_fields(text: &str) -> Option<Vec<(String, String)>> {
    let open = text.find('{')?;
    let inner = text[open + 1..].trim_end().strip_suffix('}')?.trim();
    let mut fields = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    let mut parts = Vec::new();
    for (i, ch) in inner.char_indices() {
        match ch {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    for p in parts.into_iter().map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = p.split_once(':')?;
        fields.push((k.trim().to_string(), v.trim().to_string()));
    }
    Some(fields)
}

/// `chosen` in words: the fields in which the candidates differ (`num_warps=8`),
/// or its `Debug` form when that cannot be worked out.
pub fn describe_config<C: Debug>(candidates: &[C], chosen: &C) -> String {
    let full = format!("{chosen:?}");
    let Some(mine) = debug_fields(&full) else { return full };
    let Some(all) = candidates.iter().map(|c| debug_fields(&format!("{c:?}"))).collect::<Option<Vec<_>>>()
    else {
        return full;
    };
    let differing: Vec<String> = mine
        .iter()
        .filter(|(k, v)| all.iter().any(|f| f.iter().find(|(k2, _)| k2 == k).is_none_or(|(_, v2)| v2 != v)))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if differing.is_empty() { full } else { differing.join(", ") }
}

/// The note printed when tuning happens:
/// `autotune softmax n_cols=16384: num_warps=8 best (0.078 ms) of 3 configs`.
pub fn tune_note(key: &TuneKey, winner: &str, ms: f64, candidates: usize, failed: usize) -> String {
    let k = key.describe_key();
    let sep = if k.is_empty() { "" } else { " " };
    let failed = if failed > 0 { format!(" ({failed} failed)") } else { String::new() };
    format!("autotune {}{sep}{k}: {winner} best ({ms:.3} ms) of {candidates} configs{failed}", key.kernel)
}

/// One cached result.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheEntry {
    /// The winner's config key.
    pub config: String,
    /// Its median time in milliseconds.
    pub ms: f64,
}

/// Parses a cache file: `{"format": 1, "entries": {KEY: {"config": .., "ms": ..}}}`.
pub fn parse_cache(text: &str) -> std::result::Result<BTreeMap<String, CacheEntry>, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    match v.get("format").and_then(Value::as_u64) {
        Some(FORMAT_VERSION) => {}
        Some(other) => return Err(format!("format {other}, expected {FORMAT_VERSION}")),
        None => return Err("no `format` field".into()),
    }
    let entries = v.get("entries").and_then(Value::as_object).ok_or("no `entries` object")?;
    let mut out = BTreeMap::new();
    for (k, e) in entries {
        let config =
            e.get("config").and_then(Value::as_str).ok_or_else(|| format!("entry {k} has no config"))?;
        let ms = e.get("ms").and_then(Value::as_f64).unwrap_or(f64::NAN);
        out.insert(k.clone(), CacheEntry { config: config.to_string(), ms });
    }
    Ok(out)
}

/// Renders `entries` in the format [`parse_cache`] reads.
pub fn render_cache(entries: &BTreeMap<String, CacheEntry>) -> String {
    let map: serde_json::Map<String, Value> = entries
        .iter()
        .map(|(k, e)| {
            let ms = if e.ms.is_finite() { json!(e.ms) } else { Value::Null };
            (k.clone(), json!({ "config": e.config, "ms": ms }))
        })
        .collect();
    let v = json!({ "format": FORMAT_VERSION, "entries": map });
    serde_json::to_string_pretty(&v).unwrap_or_default() + "\n"
}

/// Reads the cache file at `path`: its entries and, when it exists but cannot
/// be read or parsed, a warning (the entries are then empty). A missing file is
/// an empty cache without a warning.
pub fn load_cache(path: &Path) -> (BTreeMap<String, CacheEntry>, Option<String>) {
    match std::fs::read_to_string(path) {
        Ok(text) => match parse_cache(&text) {
            Ok(entries) => (entries, None),
            Err(e) => (
                BTreeMap::new(),
                Some(format!("{}: ignoring a corrupt autotune cache ({e})", path.display())),
            ),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (BTreeMap::new(), None),
        Err(e) => {
            (BTreeMap::new(), Some(format!("{}: cannot read the autotune cache ({e})", path.display())))
        }
    }
}

/// Writes `entries` to `path` atomically: into a temporary file next to it,
/// then renamed over it (creating the directory first).
pub fn save_cache(path: &Path, entries: &BTreeMap<String, CacheEntry>) -> std::io::Result<()> {
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir)?;
    }
    let name =
        path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| CACHE_FILE.into());
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let tmp = path.with_file_name(format!(".{name}.{}.{nanos}.tmp", std::process::id()));
    let result = std::fs::write(&tmp, render_cache(entries)).and_then(|()| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The cache directory from the values of `TESSERA_CACHE_DIR` and `HOME`:
/// the former when set and non-empty, else `$HOME/.cache/tessera`, else none
/// (results then live in memory only).
pub fn cache_dir_from(tessera_cache_dir: Option<OsString>, home: Option<OsString>) -> Option<PathBuf> {
    match (tessera_cache_dir, home) {
        (Some(d), _) if !d.is_empty() => Some(PathBuf::from(d)),
        (_, Some(h)) if !h.is_empty() => Some(PathBuf::from(h).join(".cache").join("tessera")),
        _ => None,
    }
}

/// The cache directory of this process's environment (see [`cache_dir_from`]).
pub fn cache_dir() -> Option<PathBuf> {
    cache_dir_from(std::env::var_os("TESSERA_CACHE_DIR"), std::env::var_os("HOME"))
}

/// Autotune results in memory, backed by the cache file.
#[derive(Debug, Default)]
pub struct Tuner {
    /// The cache directory: `None` until first used, then the resolved one.
    dir: Option<Option<PathBuf>>,
    /// Winners (config keys) by cache key, from this process or the file.
    memory: HashMap<String, String>,
    /// The file's entries, read on first lookup.
    disk: Option<BTreeMap<String, CacheEntry>>,
    /// Whether a warning about the file was printed already.
    warned: bool,
}

impl Tuner {
    /// A tuner whose file lives in `dir` (`None`: memory only) instead of the
    /// environment's cache directory.
    pub fn with_dir(dir: Option<PathBuf>) -> Tuner {
        Tuner { dir: Some(dir), ..Tuner::default() }
    }

    /// The cache file, if any.
    pub fn path(&mut self) -> Option<PathBuf> {
        self.dir.get_or_insert_with(cache_dir).as_ref().map(|d| d.join(CACHE_FILE))
    }

    fn warn(&mut self, message: &str) {
        if !self.warned {
            self.warned = true;
            eprintln!("warning: {message}; autotuning again");
        }
    }

    fn disk(&mut self) -> &mut BTreeMap<String, CacheEntry> {
        if self.disk.is_none() {
            let (entries, warning) = match self.path() {
                Some(p) => load_cache(&p),
                None => (BTreeMap::new(), None),
            };
            if let Some(w) = warning {
                self.warn(&w);
            }
            self.disk = Some(entries);
        }
        self.disk.get_or_insert_with(BTreeMap::new)
    }

    /// The winner's config key stored under `key`, from memory or the file.
    pub fn lookup(&mut self, key: &str) -> Option<String> {
        if let Some(c) = self.memory.get(key) {
            return Some(c.clone());
        }
        let c = self.disk().get(key)?.config.clone();
        self.memory.insert(key.to_string(), c.clone());
        Some(c)
    }

    /// Forgets `key` in memory (its winner no longer matches any candidate).
    pub fn forget(&mut self, key: &str) {
        self.memory.remove(key);
        if let Some(d) = &mut self.disk {
            d.remove(key);
        }
    }

    /// Stores `entry` under `key` in memory and in the file (merged with what
    /// the file holds now, so concurrent writers lose at most a race on the
    /// same key). A failed write is a warning, not an error.
    pub fn store(&mut self, key: &str, entry: CacheEntry) {
        self.memory.insert(key.to_string(), entry.config.clone());
        self.disk().insert(key.to_string(), entry.clone());
        let Some(path) = self.path() else { return };
        let (mut current, _) = load_cache(&path);
        current.insert(key.to_string(), entry);
        match save_cache(&path, &current) {
            Ok(()) => self.disk = Some(current),
            Err(e) => {
                if !self.warned {
                    self.warned = true;
                    eprintln!("warning: {}: cannot write the autotune cache ({e})", path.display());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsl_core::{DType, Scalar};

    fn temp_dir(tag: &str) -> PathBuf {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let d = std::env::temp_dir().join(format!("tessera-autotune-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn key() -> TuneKey {
        TuneKey {
            device: "NVIDIA H100 80GB HBM3".into(),
            compute_capability: (9, 0),
            kernel: "softmax".into(),
            family: "Config { T: F32, BLOCK: 16384, num_warps: 4, num_stages: 2 }".into(),
            key: vec![("n_cols".into(), "16384".into())],
            compiler: "tessera 0.1.0 llvm 22.1.0".into(),
            code: "softmax-0123456789abcdef".into(),
        }
    }

    #[test]
    fn cache_key_includes_every_component() {
        let k = key();
        let base = k.cache_key();
        for part in [
            "NVIDIA H100 80GB HBM3",
            "sm_90",
            "softmax",
            "BLOCK: 16384",
            "n_cols",
            "16384",
            "llvm 22.1.0",
            "0123456789abcdef",
        ] {
            assert!(base.contains(part), "{part} missing from {base}");
        }
        let variants: Vec<TuneKey> = vec![
            TuneKey { device: "NVIDIA H200".into(), ..k.clone() },
            TuneKey { compute_capability: (8, 0), ..k.clone() },
            TuneKey { kernel: "softmax2".into(), ..k.clone() },
            TuneKey {
                family: "Config { T: BF16, BLOCK: 16384, num_warps: 4, num_stages: 2 }".into(),
                ..k.clone()
            },
            TuneKey { key: vec![("n_cols".into(), "16383".into())], ..k.clone() },
            TuneKey { key: vec![("stride".into(), "16384".into())], ..k.clone() },
            TuneKey { key: vec![], ..k.clone() },
            TuneKey { compiler: "tessera 0.2.0 llvm 22.1.0".into(), ..k.clone() },
            TuneKey { code: "softmax-0123456789abcdee".into(), ..k.clone() },
        ];
        let mut seen = std::collections::HashSet::new();
        seen.insert(base.clone());
        for v in &variants {
            assert!(seen.insert(v.cache_key()), "{v:?} collides");
        }
        // Separators inside names cannot make two keys collide.
        let a = TuneKey { device: "a\",\"b".into(), kernel: "c".into(), ..k.clone() };
        let b = TuneKey { device: "a".into(), kernel: "b\",\"c".into(), ..k.clone() };
        assert_ne!(a.cache_key(), b.cache_key());
        assert!(compiler_version().contains(env!("CARGO_PKG_VERSION")));
        assert!(compiler_version().contains("llvm"));
    }

    #[test]
    fn winner_is_the_smallest_median_first_on_ties() {
        assert_eq!(choose_winner(&[Some(0.3), Some(0.1), Some(0.2)]), Some(1));
        assert_eq!(choose_winner(&[Some(0.1), Some(0.1), Some(0.05), Some(0.05)]), Some(2));
        assert_eq!(choose_winner(&[None, Some(0.2), None]), Some(1));
        assert_eq!(choose_winner(&[Some(f64::NAN), Some(0.5)]), Some(1));
        assert_eq!(choose_winner(&[None, None]), None);
        assert_eq!(choose_winner(&[]), None);
    }

    #[test]
    fn key_values_come_from_the_named_scalar_arguments() {
        let params: Vec<String> = ["out_ptr", "in_ptr", "n_cols", "stride"].map(String::from).to_vec();
        let args: Vec<Arg<u64>> = vec![
            Arg::Ptr(0x1000),
            Arg::Ptr(0x2000),
            Arg::Scalar(Scalar::int(DType::I32, 16384)),
            Arg::Scalar(Scalar::int(DType::I32, 16400)),
        ];
        let kv = key_values("softmax", &["n_cols"], &params, &args).unwrap();
        assert_eq!(kv, vec![("n_cols".to_string(), "16384".to_string())]);
        let kv = key_values("softmax", &["stride", "n_cols"], &params, &args).unwrap();
        assert_eq!(kv[0], ("stride".to_string(), "16400".to_string()));
        assert!(key_values("softmax", &[], &params, &args).unwrap().is_empty());

        let e = key_values("softmax", &["n_rows"], &params, &args).unwrap_err();
        assert!(
            matches!(&e, Error::Launch { kernel, message }
            if kernel == "softmax" && message.contains("`n_rows` is not a parameter")),
            "{e}"
        );
        let e = key_values("softmax", &["in_ptr"], &params, &args).unwrap_err();
        assert!(e.to_string().contains("pointer"), "{e}");
        let e = key_values("softmax", &["stride"], &params, &args[..2]).unwrap_err();
        assert!(e.to_string().contains("only 2 arguments"), "{e}");
    }

    #[test]
    fn softmax_key_names_are_parameters_of_its_ir() {
        use dsl_core::launch::Kernel;
        use kernels::softmax::softmax;
        let base = softmax::Config::new(DType::F32, 1024);
        let f = softmax::Kernel::build(&base).unwrap();
        let params: Vec<String> = f.params.iter().map(|p| p.name.clone()).collect();
        let args: Vec<Arg<u64>> = vec![
            Arg::Ptr(0x1000),
            Arg::Ptr(0x2000),
            Arg::Scalar(Scalar::int(DType::I32, 1000)),
            Arg::Scalar(Scalar::int(DType::I32, 1024)),
        ];
        let kv = key_values(softmax::NAME, softmax::Kernel::autotune_key(), &params, &args).unwrap();
        assert_eq!(kv, vec![("n_cols".to_string(), "1000".to_string())]);
        let cands = softmax::Kernel::autotune_configs(&base);
        assert_eq!(cands.len(), 3);
        assert_eq!(describe_config(&cands, &cands[2]), "num_warps=16");
    }

    #[derive(Debug)]
    #[allow(non_snake_case, dead_code)]
    struct Cfg {
        T: DType,
        BLOCK: usize,
        num_warps: u32,
        num_stages: u32,
    }

    #[test]
    fn configs_are_described_by_what_differs() {
        let c = |w| Cfg { T: DType::F32, BLOCK: 1024, num_warps: w, num_stages: 2 };
        let cands = [c(4), c(8), c(16)];
        assert_eq!(describe_config(&cands, &cands[1]), "num_warps=8");
        // Nothing differs: the Debug form.
        assert!(describe_config(&cands[..1], &cands[0]).starts_with("Cfg {"));
        assert_eq!(describe_config(&[1, 2], &2), "2");
        let note = tune_note(&key(), "num_warps=8", 0.0781, 3, 0);
        assert_eq!(note, "autotune softmax n_cols=16384: num_warps=8 best (0.078 ms) of 3 configs");
        let note = tune_note(&TuneKey { key: vec![], ..key() }, "num_warps=8", 0.0781, 3, 1);
        assert_eq!(note, "autotune softmax: num_warps=8 best (0.078 ms) of 3 configs (1 failed)");
    }

    #[test]
    fn cache_file_round_trips_and_hits() {
        let dir = temp_dir("roundtrip");
        let k = key().cache_key();
        let mut t = Tuner::with_dir(Some(dir.clone()));
        assert_eq!(t.lookup(&k), None);
        t.store(&k, CacheEntry { config: "Config { num_warps: 8 }".into(), ms: 0.078 });
        assert_eq!(t.lookup(&k).as_deref(), Some("Config { num_warps: 8 }"));

        // A later run reads it back from the file.
        let path = dir.join(CACHE_FILE);
        let (entries, warning) = load_cache(&path);
        assert!(warning.is_none());
        assert_eq!(entries[&k], CacheEntry { config: "Config { num_warps: 8 }".into(), ms: 0.078 });
        let mut later = Tuner::with_dir(Some(dir.clone()));
        assert_eq!(later.lookup(&k).as_deref(), Some("Config { num_warps: 8 }"));
        assert_eq!(later.lookup("other"), None);

        // Writers merge with the file instead of clobbering it.
        let mut other = Tuner::with_dir(Some(dir.clone()));
        other.store("k2", CacheEntry { config: "c2".into(), ms: 1.0 });
        let (entries, _) = load_cache(&path);
        assert_eq!(entries.len(), 2);
        // No temporary files are left behind.
        let names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into())
            .collect();
        assert_eq!(names, vec![CACHE_FILE.to_string()]);

        // Forgetting drops it from memory.
        later.forget(&k);
        assert_eq!(later.memory.get(&k), None);

        // Render and parse are inverse.
        let mut m = BTreeMap::new();
        m.insert("a".to_string(), CacheEntry { config: "x".into(), ms: 0.5 });
        assert_eq!(parse_cache(&render_cache(&m)).unwrap(), m);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn corrupt_or_unreadable_cache_is_empty_not_fatal() {
        let dir = temp_dir("corrupt");
        let path = dir.join(CACHE_FILE);
        for bad in
            ["{not json", "[]", r#"{"format": 99, "entries": {}}"#, r#"{"format": 1, "entries": {"k": {}}}"#]
        {
            std::fs::write(&path, bad).unwrap();
            let (entries, warning) = load_cache(&path);
            assert!(entries.is_empty(), "{bad}");
            assert!(warning.is_some_and(|w| w.contains("corrupt")), "{bad}");
        }
        // A tuner over the corrupt file misses, then replaces it with a good one.
        let mut t = Tuner::with_dir(Some(dir.clone()));
        assert_eq!(t.lookup("k"), None);
        assert!(t.warned);
        t.store("k", CacheEntry { config: "c".into(), ms: 0.1 });
        assert_eq!(load_cache(&path).0["k"].config, "c");
        // A directory where the file should be: unreadable, still no panic.
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        let (entries, warning) = load_cache(&path);
        assert!(entries.is_empty() && warning.is_some());
        let mut t = Tuner::with_dir(Some(dir.clone()));
        assert_eq!(t.lookup("k"), None);
        t.store("k", CacheEntry { config: "c".into(), ms: 0.1 });
        assert_eq!(t.lookup("k").as_deref(), Some("c"));
        // No file at all: empty, no warning.
        assert_eq!(load_cache(&dir.join("missing.json")), (BTreeMap::new(), None));
        // Memory only.
        let mut t = Tuner::with_dir(None);
        t.store("k", CacheEntry { config: "c".into(), ms: 0.1 });
        assert_eq!(t.lookup("k").as_deref(), Some("c"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn cache_dir_prefers_the_env_override() {
        let d = cache_dir_from(Some("/x/y".into()), Some("/home/u".into()));
        assert_eq!(d, Some(PathBuf::from("/x/y")));
        let d = cache_dir_from(Some("".into()), Some("/home/u".into()));
        assert_eq!(d, Some(PathBuf::from("/home/u/.cache/tessera")));
        assert_eq!(cache_dir_from(None, None), None);
    }
}
