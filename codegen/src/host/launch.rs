//! Running a linked kernel over a grid: programs are handed out in
//! increasing row-major order (axis 2 fastest, the interpreter's order)
//! from one atomic counter to every thread of a pool, so a program that
//! waits for an earlier one (a stream-K handshake) always waits for one
//! that is already running. Each program is one call of the kernel's entry
//! with its coordinates.
//!
//! The pool ([`super::pool`]) runs programs on one thread per core
//! (`TESSERA_THREADS` overrides it), the calling thread among them when the
//! kernel's frame fits its stack; the helpers have large stacks, since a
//! program's tiles live on its thread's stack. A launch of one program with
//! a small frame runs on the calling thread alone.
//!
//! Errors: a program that stops at a runtime error site (a failed
//! `device_assert`, ...) makes the launch fail with the error of the lowest
//! failing program, whatever the schedule; the other programs still run.

use super::jit::Jit;
use super::pool::Pool;
use super::{ErrorSite, HostObject};
use crate::{Error, Result};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Stack bytes of each pool thread.
const STACK_BYTES: usize = 256 << 20;

/// The largest frame a program may have (the rest of the stack is LLVM's
/// spills and calls).
const MAX_FRAME: u64 = (STACK_BYTES as u64) / 2;

/// A frame small enough to run on any thread that calls a launch.
const INLINE_FRAME: u64 = 256 << 10;

/// The entry of one program: `(args, pid0, pid1, pid2, grid0, grid1, grid2)
/// -> 0 | error code`.
type Entry = unsafe extern "C" fn(*const u64, u32, u32, u32, u32, u32, u32) -> u32;

/// A kernel linked into this process, ready to launch.
pub struct HostKernel {
    name: String,
    entry: Entry,
    errors: Vec<ErrorSite>,
    frame_bytes: u64,
}

impl std::fmt::Debug for HostKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostKernel")
            .field("name", &self.name)
            .field("frame_bytes", &self.frame_bytes)
            .finish()
    }
}

/// The process's pool of program threads.
fn pool() -> Result<&'static Pool> {
    static POOL: OnceLock<std::result::Result<Pool, String>> = OnceLock::new();
    POOL.get_or_init(|| {
        let threads = std::env::var("TESSERA_THREADS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        Pool::new(threads, STACK_BYTES).map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| Error::Llvm(format!("cannot start the host thread pool: {e}")))
}

/// The number of threads programs run on.
pub fn threads() -> usize {
    pool().map_or(1, |p| p.threads())
}

impl HostKernel {
    /// Links `obj` into the process.
    pub(crate) fn load(obj: &HostObject) -> Result<HostKernel> {
        if obj.frame_bytes > MAX_FRAME {
            return Err(Error::Invalid(format!(
                "kernel `{}` needs {} bytes of tiles per program, more than the host's {MAX_FRAME}",
                obj.name, obj.frame_bytes
            )));
        }
        let addr = Jit::global()?.load(&obj.symbol, &obj.object)?;
        // SAFETY: `addr` is the address of the object's entry symbol, which
        // the lowering defines with exactly the `Entry` signature; the JIT
        // keeps the code mapped for the life of the process.
        let entry: Entry = unsafe { std::mem::transmute::<usize, Entry>(addr) };
        if crate::dump::DumpRequest::from_env().has("obj") {
            eprintln!("// ---- TESSERA_DUMP obj: {} linked at {addr:#x} ----", obj.symbol);
        }
        Ok(HostKernel {
            name: obj.name.clone(),
            entry,
            errors: obj.errors.clone(),
            frame_bytes: obj.frame_bytes,
        })
    }

    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Bytes of stack arrays one program allocates.
    pub fn frame_bytes(&self) -> u64 {
        self.frame_bytes
    }

    /// Runs every program of `grid` with the argument slots `args` (one per
    /// kernel parameter: addresses, integer bits, f32 bits for
    /// f32/f16/bf16, f64 bits).
    ///
    /// # Safety
    /// `args` must hold one slot per parameter of the kernel, of its kind;
    /// every address must point into memory that stays valid (and is not
    /// accessed by anything else) for the whole launch, wherever the
    /// kernel's programs read or write through it. The compiled code checks
    /// no bounds.
    pub unsafe fn launch(&self, grid: [u32; 3], args: &[u64]) -> Result<()> {
        let total = grid.iter().map(|&g| u64::from(g)).product::<u64>();
        if total == 0 {
            return Ok(());
        }
        if total > u64::from(u32::MAX) || grid.iter().any(|&g| g > i32::MAX as u32) {
            return Err(Error::Invalid(format!("kernel `{}`: grid {grid:?} is too large", self.name)));
        }
        let total = total as u32;
        let (gy, gz) = (grid[1], grid[2]);
        let first_error = AtomicU64::new(u64::MAX);
        let run = |linear: u32| {
            let (x, y, z) = (linear / (gy * gz), (linear / gz) % gy, linear % gz);
            // SAFETY: the caller guarantees the arguments (see above); the
            // coordinates are inside the grid.
            let code = unsafe { (self.entry)(args.as_ptr(), x, y, z, grid[0], grid[1], grid[2]) };
            if code != 0 {
                first_error.fetch_min((u64::from(linear) << 32) | u64::from(code), Ordering::Relaxed);
            }
        };
        let caller = self.frame_bytes <= INLINE_FRAME;
        if total == 1 && caller {
            run(0);
        } else {
            let next = AtomicU32::new(0);
            let run = &run;
            let job = || {
                loop {
                    let p = next.fetch_add(1, Ordering::Relaxed);
                    if p >= total {
                        break;
                    }
                    run(p);
                }
            };
            pool()?.run(&job, caller);
        }
        let e = first_error.load(Ordering::Relaxed);
        if e == u64::MAX {
            return Ok(());
        }
        let (linear, code) = ((e >> 32) as u32, (e & 0xffff_ffff) as u32);
        let program = [linear / (gy * gz), (linear / gz) % gy, linear % gz];
        let site = self.errors.get(code as usize - 1).cloned().unwrap_or_else(|| ErrorSite {
            op: "?".into(),
            message: format!("unknown runtime error {code}"),
            loc: dsl_core::Location::unknown(),
        });
        Err(Error::Kernel { op: site.op, loc: site.loc, message: site.message, program })
    }
}
