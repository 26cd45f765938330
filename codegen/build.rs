//! Hashes the compiler's own sources (this crate's and `dsl-core`'s) into
//! `TESSERA_COMPILER_HASH`, part of the PTX cache key (`src/cache.rs`): a
//! change to the lowering that leaves a kernel's IR as it was must not
//! reuse PTX compiled by an earlier build.

use std::hash::Hasher;
use std::path::{Path, PathBuf};

/// FNV-1a, 64 bits (stable across Rust releases, unlike std's hasher).
struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Every `.rs` file under `dir`, recursively.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let p = entry?.path();
        if p.is_dir() {
            sources(&p, out)?;
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
    Ok(())
}

fn main() -> std::io::Result<()> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let dirs = [root.join("src"), root.join("../dsl-core/src")];
    let mut files = Vec::new();
    for d in &dirs {
        println!("cargo::rerun-if-changed={}", d.display());
        sources(d, &mut files)?;
    }
    files.sort();
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    for f in &files {
        h.write(f.strip_prefix(&root).unwrap_or(f).to_string_lossy().as_bytes());
        h.write(&std::fs::read(f)?);
    }
    println!("cargo::rustc-env=TESSERA_COMPILER_HASH={:016x}", h.finish());
    Ok(())
}
