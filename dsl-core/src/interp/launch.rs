//! Launching a kernel on the interpreter: preparing it once ([`Kernel`]),
//! validating and binding the arguments, and running the grid.
//!
//! Launch rules (violations are [`Error::Launch`]):
//! - one [`Arg`] per parameter, in order; pointer parameters take
//!   [`Arg::Ptr`], scalar parameters [`Arg::Scalar`] of exactly their dtype;
//! - a `ptr<T>` parameter binds a buffer of dtype `T`, or a `u8` buffer (raw
//!   bytes, e.g. packed GGUF blocks); the element offset must stay inside the
//!   buffer and give a byte address aligned to `T`;
//! - `divisibility` hints of parameters are promises of the launcher and are
//!   checked (a pointer's byte offset, an integer's value);
//! - grid dimensions must fit `i32` (`program_id` is `i32`) and the grid at most
//!   2^32 - 1 programs; a grid with a zero dimension runs nothing, as Triton's
//!   launcher does.
//!
//! Programs run one at a time in row-major grid order (axis 2 fastest), so a
//! run is deterministic; races between programs are detected (see `memory.rs`).
//!
//! Kernels that call `wait_until` run their programs interleaved instead,
//! still one at a time and deterministically (cooperative scheduling): a
//! program runs until it ends or reaches a wait that does not hold, and then
//! keeps its position (its frame stack and environment, `exec.rs`). The
//! scheduler then resumes, in round-robin order after the program that
//! stopped, the first waiting program whose memory may have changed since it
//! last checked (a store or atomic happened since), or else starts the next
//! program of the grid. When no program can run and every program has
//! started, every live program waits on a value nothing will change: that
//! deadlock is an error naming each wait (program, location, address,
//! comparison, the value it reads). Kernels without waits take the plain
//! loop above, which keeps no state per program.

use super::InterpError;
use super::buffer::{Arg, Buffer};
use super::exec::{Blocked, Exec, Stack, World, fill, start};
use super::memory::{MAX_BUFFERS, Memory, base_addr, coords};
use super::plan::{Plan, plan};
use super::tile::{Tile, pid_str};
use crate::dtype::{DType, Elem};
use crate::error::{Error, Result};
use crate::ir::ops::MemoryOp;
use crate::ir::{EntityRef, Function, Op};
use std::io::Write;

/// A verified kernel, prepared to run on the interpreter many times.
#[derive(Clone, Debug)]
pub struct Kernel {
    func: Function,
    plan: Plan,
    /// The kernel calls `wait_until`: its programs run interleaved.
    waits: bool,
    /// The kernel synchronises programs: the happens-before check runs.
    synchronizes: bool,
}

impl Kernel {
    /// Verifies `f` and prepares it (liveness and combine analysis).
    ///
    /// Errors: [`Error::Verify`] for malformed IR; [`Error::Unsupported`] for
    /// tiles beyond the interpreter's size limit (2^24 elements).
    pub fn new(f: &Function) -> Result<Kernel> {
        crate::verify::verify(f)?;
        let plan = plan(f).map_err(Error::Unsupported)?;
        Ok(Kernel {
            func: f.clone(),
            plan,
            waits: f.waits_on_programs(),
            synchronizes: f.synchronizes_programs(),
        })
    }

    /// The kernel's IR.
    pub fn function(&self) -> &Function {
        &self.func
    }

    /// Runs the kernel over `grid` with default options (prints go to stdout,
    /// race detection on).
    pub fn launch(&self, grid: [u32; 3], buffers: &mut [Buffer], args: &[Arg]) -> Result<()> {
        Interpreter::new().launch(self, grid, buffers, args)
    }

    /// Runs the kernel as [`Kernel::launch`] does, for a backend that
    /// launches it as the kernel `name`: a [`Error::Launch`] names `name`.
    pub fn launch_as(&self, name: &str, grid: [u32; 3], buffers: &mut [Buffer], args: &[Arg]) -> Result<()> {
        self.launch(grid, buffers, args).map_err(|e| match e {
            Error::Launch { message, .. } => Error::Launch { kernel: name.to_string(), message },
            other => other,
        })
    }
}

/// Interpreter options: where `print` writes and whether races are checked.
pub struct Interpreter<'w> {
    sink: Box<dyn Write + 'w>,
    races: bool,
}

impl Default for Interpreter<'static> {
    fn default() -> Self {
        Interpreter::new()
    }
}

impl std::fmt::Debug for Interpreter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interpreter").field("race_detection", &self.races).finish_non_exhaustive()
    }
}

impl Interpreter<'static> {
    /// Default options: `print` writes to stdout, race detection is on.
    pub fn new() -> Interpreter<'static> {
        Interpreter { sink: Box::new(std::io::stdout()), races: true }
    }
}

impl<'w> Interpreter<'w> {
    /// Sends `print` output to `sink` (for example a `&mut Vec<u8>`).
    pub fn with_print_sink<'x>(self, sink: impl Write + 'x) -> Interpreter<'x> {
        Interpreter { sink: Box::new(sink), races: self.races }
    }

    /// Turns write-race detection between programs on or off (on by default;
    /// off saves the shadow memory and a check per stored byte).
    pub fn with_race_detection(mut self, on: bool) -> Interpreter<'w> {
        self.races = on;
        self
    }

    /// Runs `kernel` over `grid` with `args` bound to its parameters; pointer
    /// arguments index into `buffers`, which the kernel reads and writes.
    ///
    /// Errors: [`Error::Launch`] for invalid arguments or grid (nothing runs);
    /// [`Error::Interp`] for the first runtime error (out-of-bounds access,
    /// race, overflow, failed assert, ...), after which buffers hold whatever
    /// the programs before it wrote.
    pub fn launch(
        &mut self,
        kernel: &Kernel,
        grid: [u32; 3],
        buffers: &mut [Buffer],
        args: &[Arg],
    ) -> Result<()> {
        let f = &kernel.func;
        let launch_err = |message: String| Error::Launch { kernel: f.name.clone(), message };
        let (params, names) = bind(f, buffers, args).map_err(launch_err)?;
        if let Some(axis) = grid.iter().position(|&g| g > i32::MAX as u32) {
            return Err(launch_err(format!("grid dimension {axis} is {}, more than i32::MAX", grid[axis])));
        }
        let total = grid.iter().map(|&g| u64::from(g)).product::<u64>();
        if total > u64::from(u32::MAX) {
            return Err(launch_err(format!("the grid has {total} programs, more than 2^32 - 1")));
        }
        if total == 0 {
            return Ok(());
        }
        let mem = Memory::new(buffers, names, self.races && total > 1, grid, kernel.synchronizes);
        let world = World { mem, pid: [0; 3], grid, sink: &mut *self.sink };
        let mut exec = Exec { f, plan: &kernel.plan, env: vec![None; f.values.len()], world };
        if kernel.waits {
            let res = interleaved(&mut exec, &params, total as u32);
            let _ = exec.world.sink.flush();
            return res.map_err(Error::from);
        }
        let body = f.body_block();
        let mut linear = 0u32;
        for x in 0..grid[0] {
            for y in 0..grid[1] {
                for z in 0..grid[2] {
                    exec.world.pid = [x, y, z];
                    exec.world.mem.set_program(linear);
                    exec.env.iter_mut().for_each(|slot| *slot = None);
                    for (p, t) in f.params.iter().zip(&params) {
                        if let Some(slot) = exec.env.get_mut(p.value.index()) {
                            *slot = Some(t.clone());
                        }
                    }
                    exec.run_block(body)?;
                    linear = linear.wrapping_add(1);
                }
            }
        }
        let _ = exec.world.sink.flush();
        Ok(())
    }
}

/// A started program of an interleaved run.
struct Program {
    /// Linear id (row-major over the grid).
    linear: u32,
    /// Its values.
    env: Vec<Option<Tile>>,
    /// Its position.
    stack: Stack,
    /// The wait it stopped at, and the memory version it read it at.
    blocked: Option<(Blocked, u64)>,
}

/// Runs the `total` programs of a kernel that waits, interleaved (see the
/// module documentation).
fn interleaved(exec: &mut Exec<'_, '_>, params: &[Tile], total: u32) -> std::result::Result<(), InterpError> {
    let f = exec.f;
    let grid = exec.world.grid;
    let mut live: Vec<Program> = Vec::new();
    let mut next_new = 0u32;
    // The index in `live` after which the round-robin search starts.
    let mut cursor = 0usize;
    loop {
        let version = exec.world.mem.version;
        let n = live.len();
        let ready = (0..n)
            .map(|k| (cursor + k) % n)
            .find(|&k| live[k].blocked.as_ref().is_none_or(|b| b.1 != version));
        let k = match ready {
            Some(k) => k,
            None if next_new < total => {
                let mut env = vec![None; f.values.len()];
                for (p, t) in f.params.iter().zip(params) {
                    if let Some(slot) = env.get_mut(p.value.index()) {
                        *slot = Some(t.clone());
                    }
                }
                live.push(Program { linear: next_new, env, stack: start(f.body_block()), blocked: None });
                next_new += 1;
                live.len() - 1
            }
            None if live.is_empty() => return Ok(()),
            None => return Err(deadlock(exec, &live, grid)),
        };
        let prog = &mut live[k];
        exec.world.pid = coords(grid, prog.linear);
        exec.world.mem.set_program(prog.linear);
        std::mem::swap(&mut exec.env, &mut prog.env);
        let run = exec.run(&mut prog.stack);
        std::mem::swap(&mut exec.env, &mut prog.env);
        match run? {
            super::exec::Run::Done(_) => {
                live.remove(k);
                cursor = if live.is_empty() { 0 } else { k % live.len() };
            }
            super::exec::Run::Blocked(w) => {
                prog.blocked = Some((w, exec.world.mem.version));
                cursor = (k + 1) % live.len();
            }
        }
    }
}

/// The error of an interleaved run in which every live program waits on a
/// value no other program will change.
fn deadlock(exec: &Exec<'_, '_>, live: &[Program], grid: [u32; 3]) -> InterpError {
    let f = exec.f;
    let mut lines = Vec::new();
    for p in live {
        let Some((w, _)) = &p.blocked else { continue };
        let d = &f.insts[w.inst];
        let dtype = f.ty(d.args[0]).dtype();
        let who = pid_str(coords(grid, p.linear));
        let at = exec.world.mem.describe(w.addr);
        lines.push(if matches!(d.op, Op::Memory(MemoryOp::WaitLoad { .. })) {
            format!(
                "{who} waits at {} (`wait_load`) until the flag (high 32 bits) of the line at {at} is {} \
                 (it is {})",
                d.loc, w.want, w.seen
            )
        } else {
            format!(
                "{who} waits at {} until the {dtype} at {at} {} {} (it holds {})",
                d.loc,
                w.cmp.name(),
                w.want,
                w.seen
            )
        });
    }
    let first = live.iter().find_map(|p| p.blocked.as_ref().map(|(w, _)| (p.linear, w.inst)));
    let (loc, pid, op) = match first {
        Some((linear, i)) => (f.insts[i].loc.clone(), Some(coords(grid, linear)), f.insts[i].op.name()),
        None => (f.loc.clone(), None, "wait_until"),
    };
    InterpError {
        loc,
        op,
        message: format!(
            "deadlock: every live program waits and no store or atomic of another program can \
             release any of them ({} program(s) waiting, {} finished):\n  {}",
            lines.len(),
            (grid.iter().map(|&g| u64::from(g)).product::<u64>() as usize).saturating_sub(live.len()),
            lines.join("\n  ")
        ),
        program: pid,
    }
}

/// Validates `args` against `f`'s parameters; returns the parameter values and,
/// per buffer, the names of the parameters bound to it.
fn bind(f: &Function, buffers: &[Buffer], args: &[Arg]) -> Result<(Vec<Tile>, Vec<String>), String> {
    if let Some(e) = crate::launch::arity_error(f, args.len()) {
        return Err(e);
    }
    if buffers.len() > MAX_BUFFERS {
        return Err(format!(
            "{} buffers were passed; the interpreter takes at most {MAX_BUFFERS}",
            buffers.len()
        ));
    }
    let mut names: Vec<Vec<&str>> = vec![Vec::new(); buffers.len()];
    let mut vals = Vec::with_capacity(args.len());
    for (j, (p, arg)) in f.params.iter().zip(args).enumerate() {
        let ty = f.ty(p.value);
        let what = format!("argument {j} (`{}`: {ty})", p.name);
        let div = p.hints.divisibility.map(i64::from).filter(|&d| d > 1);
        match (ty.elem, arg) {
            (Elem::Ptr(pointee), Arg::Ptr { buffer, offset }) => {
                let Some(buf) = buffers.get(*buffer) else {
                    return Err(format!(
                        "{what} names buffer {buffer}, but {} buffer(s) were passed",
                        buffers.len()
                    ));
                };
                let bd = buf.dtype();
                if bd != pointee && bd != DType::U8 {
                    return Err(format!(
                        "{what} points to {pointee}, but buffer {buffer} holds {bd} (pass a {pointee} buffer, \
                         or a u8 buffer of raw bytes)"
                    ));
                }
                if *offset > buf.len() {
                    return Err(format!(
                        "{what} starts at element {offset} of buffer {buffer}, which has {} elements",
                        buf.len()
                    ));
                }
                let byte_off = (*offset * bd.size_bytes()) as i64;
                if byte_off % pointee.size_bytes() as i64 != 0 {
                    return Err(format!(
                        "{what} starts at byte {byte_off}, which is not aligned to {pointee}"
                    ));
                }
                if let Some(d) = div
                    && byte_off % d != 0
                {
                    return Err(format!(
                        "{what} starts at byte {byte_off}, but the kernel was specialized for addresses divisible by {d}"
                    ));
                }
                names[*buffer].push(&p.name);
                vals.push(Tile::int_scalar(ty.elem, base_addr(*buffer) + byte_off));
            }
            (Elem::Scalar(d), Arg::Scalar(s)) => {
                if s.dtype() != d {
                    return Err(format!("{what} needs a {d} scalar, but a {} was passed", s.dtype()));
                }
                if let Some(k) = div
                    && d.is_int()
                    && s.as_i64() % k != 0
                {
                    return Err(format!(
                        "{what} is {}, but the kernel was specialized for values divisible by {k}",
                        s.as_i64()
                    ));
                }
                vals.push(fill(*s, &[]));
            }
            (Elem::Ptr(_), Arg::Scalar(_)) => return Err(format!("{what} is a pointer; pass Arg::Ptr")),
            (Elem::Scalar(_), Arg::Ptr { .. }) => {
                return Err(format!("{what} is a scalar; pass Arg::Scalar"));
            }
        }
    }
    Ok((vals, names.into_iter().map(|n| n.join("/")).collect()))
}
