//! The host compile cache: linked kernels in memory, objects on disk, kept
//! like PTX in a `crate::cache::Store` (the directory, atomic writes).
//!
//! The key hashes the printed IR (after canonicalization), the host target
//! (triple, CPU name and feature string: an object is never loaded on a CPU
//! it was not compiled for) and the compiler (this crate's version, the
//! hash of its and `dsl-core`'s sources, the LLVM version). Disk entries are
//! `<key>.o` (the object) and `<key>.hostmeta` (name, symbol, frame size,
//! one line per runtime error site); an entry that does not parse is a miss
//! and is compiled again.

use super::launch::HostKernel;
use super::target::HostTarget;
use super::{ErrorSite, HostObject, compile};
use crate::Result;
use crate::cache::{Store, kernel_key};
use dsl_core::{Function, Location};
use std::path::PathBuf;
use std::sync::Arc;

/// A memory + disk cache of host kernels.
pub struct HostCache {
    store: Store<HostKernel>,
    target: HostTarget,
}

impl Default for HostCache {
    fn default() -> Self {
        HostCache::new()
    }
}

impl HostCache {
    /// A cache for this CPU in `$TESSERA_CACHE_DIR`, else `~/.cache/tessera`.
    pub fn new() -> HostCache {
        HostCache { store: Store::default(), target: HostTarget::native() }
    }

    /// A cache for this CPU in `dir` (`None`: memory only).
    pub fn with_dir(dir: Option<PathBuf>) -> HostCache {
        HostCache { store: Store::new(dir), target: HostTarget::native() }
    }

    /// The CPU the cache compiles for.
    pub fn target(&self) -> &HostTarget {
        &self.target
    }

    /// The cache key of `f` on this cache's target.
    pub fn key(&self, f: &Function) -> String {
        kernel_key(f, ("host", &self.target))
    }

    /// The linked kernel, from memory, disk, or a fresh compile (then stored).
    pub fn get_or_compile(&self, f: &Function) -> Result<Arc<HostKernel>> {
        self.get_or_compile_with(f, || {})
    }

    /// [`HostCache::get_or_compile`], calling `on_compile` just before a
    /// fresh compile (a miss in memory and on disk).
    pub fn get_or_compile_with(&self, f: &Function, on_compile: impl FnOnce()) -> Result<Arc<HostKernel>> {
        let key = self.key(f);
        self.store.get_or_make(&key, || {
            let obj = match self.read_disk(&key) {
                Some(o) => o,
                None => {
                    on_compile();
                    let o = compile(f, &self.target, &format!("tessera_{key}"))?;
                    // A failed disk write only costs a recompile later.
                    let _ = self.write_disk(&key, &o);
                    o
                }
            };
            HostKernel::load(&obj)
        })
    }

    fn read_disk(&self, key: &str) -> Option<HostObject> {
        let object = self.store.read(key, "o")?;
        let meta = self.store.read_text(key, "hostmeta")?;
        let mut lines = meta.lines();
        let name = lines.next()?.to_string();
        let symbol = lines.next()?.to_string();
        let frame_bytes = lines.next()?.parse().ok()?;
        let errors = lines.map(parse_site).collect::<Option<Vec<_>>>()?;
        Some(HostObject { name, symbol, object, errors, frame_bytes })
    }

    fn write_disk(&self, key: &str, o: &HostObject) -> Result<()> {
        self.store.write(key, "o", &o.object)?;
        let mut meta = format!("{}\n{}\n{}\n", o.name, o.symbol, o.frame_bytes);
        for e in &o.errors {
            meta.push_str(&site_line(e));
            meta.push('\n');
        }
        self.store.write(key, "hostmeta", meta.as_bytes())
    }
}

/// Escapes tabs, newlines and backslashes of one field.
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\t', "\\t").replace('\n', "\\n")
}

/// Undoes [`escape`].
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some(o) => out.push(o),
            None => {}
        }
    }
    out
}

/// One error site as a tab-separated line: op, line, column, file, message.
fn site_line(e: &ErrorSite) -> String {
    format!(
        "{}\t{}\t{}\t{}\t{}",
        escape(&e.op),
        e.loc.line,
        e.loc.col,
        escape(&e.loc.file),
        escape(&e.message)
    )
}

/// Parses [`site_line`]'s output.
fn parse_site(line: &str) -> Option<ErrorSite> {
    let mut it = line.split('\t');
    let op = unescape(it.next()?);
    let l = it.next()?.parse().ok()?;
    let c = it.next()?.parse().ok()?;
    let file = unescape(it.next()?);
    let message = unescape(it.next()?);
    Some(ErrorSite { op, message, loc: Location::new(file, l, c) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_sites_round_trip() {
        let e = ErrorSite {
            op: "assert".into(),
            message: "device assertion failed: a\tb\nc \\ d".into(),
            loc: Location::new("k.rs", 3, 7),
        };
        assert_eq!(parse_site(&site_line(&e)), Some(e));
        assert_eq!(parse_site("x\t1"), None);
    }
}
