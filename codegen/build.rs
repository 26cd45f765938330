//! Hashes the compiler's own sources (this crate's and `dsl-core`'s) into
//! `TESSERA_COMPILER_HASH`, part of the PTX cache key (`src/cache.rs`): a
//! change to the lowering that leaves a kernel's IR as it was must not
//! reuse PTX compiled by an earlier build.

use std::hash::Hasher;
use std::path::{Path, PathBuf};

// The hasher the PTX cache key uses too.
#[path = "src/fnv.rs"]
mod fnv;
use fnv::Fnv;

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
    let mut h = Fnv::new();
    for f in &files {
        h.write(f.strip_prefix(&root).unwrap_or(f).to_string_lossy().as_bytes());
        h.write(&std::fs::read(f)?);
    }
    println!("cargo::rustc-env=TESSERA_COMPILER_HASH={:016x}", h.finish());
    Ok(())
}
