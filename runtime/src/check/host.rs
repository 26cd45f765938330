//! `tessera host-check`: every registered kernel runs on the native CPU
//! backend ([`codegen::host::Host`]) and on the CPU interpreter (the
//! semantic oracle) with the same fresh random inputs at ragged shapes, and
//! the outputs are compared: the CPU twin of `gpu-check`, with the same
//! checks (each registry entry's check is one function generic over the
//! device). `make test` runs it through a test of this module.
//!
//! The GPU-only check families (CUDA graphs, programmatic dependent
//! launch) have no host twin; the whole forward pass is checked on the
//! native backend by the real-model tests instead.

use crate::check::{self, CheckRow};
use crate::error::{Error, Result};
use crate::registry;
use codegen::host::Host;

/// Runs the checks of the registered kernels named in `only` (all when
/// empty) on `host`, entry `i` with seed `seed + i`; returns every row
/// (an entry that fails to compile or launch gives one failing row, and the
/// others still run). `on_row` sees each entry's rows as they come.
pub fn run(
    host: &mut Host,
    only: &[String],
    seed: u64,
    mut on_entry: impl FnMut(&str, &[CheckRow]),
) -> Result<Vec<CheckRow>> {
    for name in only {
        if registry::find(name).is_none() {
            return Err(Error::Usage(format!("no kernel named `{name}`")));
        }
    }
    let mut rows = Vec::new();
    for (i, e) in registry::ENTRIES.iter().enumerate() {
        if !only.is_empty() && !only.iter().any(|n| n == e.name) {
            continue;
        }
        let got = match (e.check.host)(host, seed.wrapping_add(i as u64)) {
            Ok(r) => r,
            Err(err) => {
                eprintln!("error: {}: {err}", e.name);
                vec![check::error_row(e.name)]
            }
        };
        on_entry(e.name, &got);
        rows.extend(got);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every registered kernel on the native backend against the
    /// interpreter (the `host-check` command's checks, in `make test`).
    #[test]
    fn host_check_passes_on_every_registered_kernel() {
        let mut host = Host::new();
        let t0 = std::time::Instant::now();
        let rows = run(&mut host, &[], 0x7e55e4a, |name, r| {
            eprintln!("{name}: {} rows, {:.1} s", r.len(), t0.elapsed().as_secs_f64());
        })
        .unwrap();
        let (text, ok) = check::table(&rows);
        assert!(ok, "{text}");
        assert!(rows.len() >= registry::ENTRIES.len());
    }
}
