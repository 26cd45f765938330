//! The PTX cache: compiled kernels in memory and on disk.
//!
//! The key hashes the printed IR (after canonicalization), the target, the
//! warp count and stage count, and the compiler: this crate's version, a
//! hash of its and `dsl-core`'s sources (`build.rs`; a lowering change that
//! leaves the IR as it was gets fresh PTX) and the LLVM version. Disk entries live in `$TESSERA_CACHE_DIR` or `~/.cache/tessera`
//! as `<key>.ptx` with a small `<key>.meta` (shared bytes, warps, name).
//!
//! Invariant: a disk entry is written to a temporary file and renamed, so a
//! reader never sees a partial entry; unreadable entries are recompiled.

use crate::fnv::Fnv;
use crate::{CompileOptions, Compiled, Result, Target, compile};
use dsl_core::Function;
use rustc_hash::FxHashMap;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// A memory + disk cache of compiled kernels (by default in
/// `$TESSERA_CACHE_DIR`, else `~/.cache/tessera`).
#[derive(Default)]
pub struct PtxCache {
    store: Store<Compiled>,
}

impl PtxCache {
    /// A cache in `$TESSERA_CACHE_DIR`, else `~/.cache/tessera` (memory only
    /// when neither can be determined).
    pub fn new() -> PtxCache {
        PtxCache::default()
    }

    /// A cache in `dir` (`None`: memory only).
    pub fn with_dir(dir: Option<PathBuf>) -> PtxCache {
        PtxCache { store: Store::new(dir) }
    }

    /// The cache key of `f` compiled with `opts`.
    pub fn key(f: &Function, opts: &CompileOptions) -> String {
        let options = (opts.target.arch(), opts.num_warps, opts.num_stages, opts.min_programs_per_sm);
        kernel_key(f, options)
    }

    /// The compiled kernel, from memory, disk, or a fresh compile (then stored).
    pub fn get_or_compile(&self, f: &Function, opts: &CompileOptions) -> Result<Arc<Compiled>> {
        self.get_or_compile_with(f, opts, || {})
    }

    /// [`PtxCache::get_or_compile`], calling `on_compile` just before a fresh
    /// compile (a miss in memory and on disk), e.g. to report progress.
    pub fn get_or_compile_with(
        &self,
        f: &Function,
        opts: &CompileOptions,
        on_compile: impl FnOnce(),
    ) -> Result<Arc<Compiled>> {
        let key = PtxCache::key(f, opts);
        self.store.get_or_make(&key, || {
            if let Some(c) = self.read_disk(&key, opts.target) {
                return Ok(c);
            }
            on_compile();
            let c = compile(f, opts)?;
            // A failed disk write only costs a recompile later.
            let _ = self.write_disk(&key, &c);
            Ok(c)
        })
    }

    fn read_disk(&self, key: &str, target: Target) -> Option<Compiled> {
        let ptx = self.store.read_text(key, "ptx")?;
        let meta = self.store.read_text(key, "meta")?;
        let mut lines = meta.lines();
        let name = lines.next()?.to_string();
        let shared_bytes = lines.next()?.parse().ok()?;
        let num_warps = lines.next()?.parse().ok()?;
        // Then one line per hidden tensor-map parameter; a line that does
        // not parse makes the entry a miss (recompiled), never a wrong launch.
        let tensor_maps = lines.map(crate::tensor_map::TensorMapSpec::parse).collect::<Option<Vec<_>>>()?;
        Some(Compiled { name, ptx, shared_bytes, num_warps, target, tensor_maps })
    }

    fn write_disk(&self, key: &str, c: &Compiled) -> Result<()> {
        self.store.write(key, "ptx", c.ptx.as_bytes())?;
        let mut meta = format!("{}\n{}\n{}\n", c.name, c.shared_bytes, c.num_warps);
        for m in &c.tensor_maps {
            meta.push_str(&m.to_line());
            meta.push('\n');
        }
        self.store.write(key, "meta", meta.as_bytes())
    }
}

/// Where a cache keeps its entries: values by key in memory and, with a
/// directory, files `<key>.<ext>` on disk that the cache encodes and decodes
/// itself.
pub(crate) struct Store<T> {
    dir: Option<PathBuf>,
    mem: Mutex<FxHashMap<String, Arc<T>>>,
}

/// A store in `$TESSERA_CACHE_DIR`, else `~/.cache/tessera` (memory only
/// when neither can be determined).
impl<T> Default for Store<T> {
    fn default() -> Self {
        Store::new(default_dir())
    }
}

impl<T> Store<T> {
    /// A store with its files in `dir` (`None`: memory only).
    pub(crate) fn new(dir: Option<PathBuf>) -> Store<T> {
        Store { dir, mem: Mutex::new(FxHashMap::default()) }
    }

    /// The entry `key` from memory, else the one `make` gives (then kept in
    /// memory).
    pub(crate) fn get_or_make(&self, key: &str, make: impl FnOnce() -> Result<T>) -> Result<Arc<T>> {
        if let Some(v) = self.mem.lock().ok().and_then(|m| m.get(key).cloned()) {
            return Ok(v);
        }
        let v = Arc::new(make()?);
        if let Ok(mut m) = self.mem.lock() {
            m.insert(key.to_string(), v.clone());
        }
        Ok(v)
    }

    /// The file `<key>.<ext>`, if there is one.
    pub(crate) fn read(&self, key: &str, ext: &str) -> Option<Vec<u8>> {
        std::fs::read(self.dir.as_ref()?.join(format!("{key}.{ext}"))).ok()
    }

    /// The file `<key>.<ext>` as text, if there is one and it is UTF-8.
    pub(crate) fn read_text(&self, key: &str, ext: &str) -> Option<String> {
        String::from_utf8(self.read(key, ext)?).ok()
    }

    /// Writes `bytes` as the file `<key>.<ext>` (nothing without a
    /// directory): to a temporary file first, then renamed, so a reader
    /// never sees a partial entry.
    pub(crate) fn write(&self, key: &str, ext: &str, bytes: &[u8]) -> Result<()> {
        let Some(dir) = self.dir.as_ref() else { return Ok(()) };
        let name = format!("{key}.{ext}");
        std::fs::create_dir_all(dir)?;
        let tmp = dir.join(format!("{name}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, dir.join(name))?;
        Ok(())
    }
}

/// The cache key of `f` compiled for `target` (what selects the output
/// besides the IR): the kernel's name and a hash of its printed IR (after
/// canonicalization), of `target` and of the compiler (this crate's
/// version, the hash of its and `dsl-core`'s sources, the LLVM version).
pub(crate) fn kernel_key(f: &Function, target: impl Hash) -> String {
    let mut g = f.clone();
    dsl_core::passes::canonicalize::canonicalize(&mut g);
    let mut h = Fnv::new();
    dsl_core::print::print(&g).hash(&mut h);
    target.hash(&mut h);
    env!("CARGO_PKG_VERSION").hash(&mut h);
    env!("TESSERA_COMPILER_HASH").hash(&mut h);
    crate::target::llvm_version().hash(&mut h);
    format!("{}-{:016x}", sanitize(&f.name), h.finish())
}

/// The default cache directory: `$TESSERA_CACHE_DIR`, else
/// `~/.cache/tessera` (`None`: memory only).
fn default_dir() -> Option<PathBuf> {
    std::env::var_os("TESSERA_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("tessera")))
}

/// A file-name-safe version of a kernel name.
pub(crate) fn sanitize(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect()
}

#[cfg(test)]
mod tests {
    use super::Store;

    #[test]
    fn store_files_round_trip() {
        let dir = std::env::temp_dir().join(format!("tessera-store-{}", std::process::id()));
        let store = Store::<()>::new(Some(dir.clone()));
        store.write("k", "meta", b"name\n3\n").unwrap();
        assert_eq!(store.read_text("k", "meta").as_deref(), Some("name\n3\n"));
        assert_eq!(store.read("k", "o"), None);
        let memory = Store::<()>::new(None);
        memory.write("k", "meta", b"x").unwrap();
        assert_eq!(memory.read("k", "meta"), None);
        let _ = std::fs::remove_dir_all(dir);
    }
}
