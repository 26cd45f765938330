//! `kernels dump --sass`: the machine code ptxas makes of a kernel's PTX,
//! with ptxas's resource report (registers, spills, shared memory), as
//! NVIDIA's `nvdisasm` prints it. Both tools come from the CUDA toolkit's
//! PyPI wheels (`.ci/setup` installs them under `target/tools`); no GPU is
//! needed.

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The two tools `--sass` runs.
#[derive(Clone, Debug)]
pub(crate) struct Tools {
    /// The assembler.
    pub ptxas: PathBuf,
    /// The disassembler.
    pub nvdisasm: PathBuf,
}

impl Tools {
    /// `$PTXAS` and `$NVDISASM` where set, else `ptxas` and `nvdisasm` on `PATH`.
    pub fn from_env() -> Tools {
        let tool =
            |var: &str, name: &str| std::env::var_os(var).map_or_else(|| PathBuf::from(name), PathBuf::from);
        Tools { ptxas: tool("PTXAS", "ptxas"), nvdisasm: tool("NVDISASM", "nvdisasm") }
    }
}

/// Runs `cmd`, returning its standard output and standard error; a tool
/// that cannot be started or that fails is a usage error naming it and how
/// to get it.
fn run(mut cmd: Command, what: &str, var: &str) -> Result<(String, String)> {
    let out = cmd.output().map_err(|e| {
        Error::Usage(format!(
            "`--sass` needs {what} ({e}): set ${var} to its path or put it on PATH (`.ci/setup` installs it \
             under target/tools)"
        ))
    })?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    if !out.status.success() {
        return Err(Error::Usage(format!("{what} failed ({}): {}", out.status, stderr.trim())));
    }
    Ok((stdout, stderr))
}

/// ptxas's report (`-v`) and the disassembly of `ptx` assembled for `arch`
/// (`sm_80`, `sm_90a`) with `tools`, in a scratch directory under `dir`
/// that is removed afterwards.
pub(crate) fn sass(ptx: &str, arch: &str, dir: &Path, tools: &Tools) -> Result<(String, String)> {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let scratch = dir.join(format!("tessera-sass-{}-{call}", std::process::id()));
    std::fs::create_dir_all(&scratch)
        .map_err(|source| Error::Io { path: scratch.display().to_string(), source })?;
    let result = assemble(ptx, arch, &scratch, tools);
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

fn assemble(ptx: &str, arch: &str, scratch: &Path, tools: &Tools) -> Result<(String, String)> {
    let (src, cubin) = (scratch.join("kernel.ptx"), scratch.join("kernel.cubin"));
    std::fs::write(&src, ptx).map_err(|source| Error::Io { path: src.display().to_string(), source })?;
    let mut ptxas = Command::new(&tools.ptxas);
    ptxas.arg(format!("-arch={arch}")).arg("-v").arg("-o").arg(&cubin).arg(&src);
    let (_, report) = run(ptxas, "ptxas", "PTXAS")?;
    let mut nvdisasm = Command::new(&tools.nvdisasm);
    nvdisasm.arg("-c").arg(&cubin);
    let (code, _) = run(nvdisasm, "nvdisasm", "NVDISASM")?;
    Ok((report.trim_end().to_string(), code))
}
