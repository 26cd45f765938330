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

use super::buffer::{Arg, Buffer};
use super::exec::{Exec, World, fill};
use super::memory::{MAX_BUFFERS, Memory, base_addr};
use super::plan::{Plan, plan};
use super::tile::Tile;
use crate::dtype::{DType, Elem};
use crate::error::{Error, Result};
use crate::ir::{EntityRef, Function};
use std::io::Write;

/// A verified kernel, prepared to run on the interpreter many times.
#[derive(Clone, Debug)]
pub struct Kernel {
    func: Function,
    plan: Plan,
}

impl Kernel {
    /// Verifies `f` and prepares it (liveness and combine analysis).
    ///
    /// Errors: [`Error::Verify`] for malformed IR; [`Error::Unsupported`] for
    /// tiles beyond the interpreter's size limit (2^24 elements).
    pub fn new(f: &Function) -> Result<Kernel> {
        crate::verify::verify(f)?;
        let plan = plan(f).map_err(Error::Unsupported)?;
        Ok(Kernel { func: f.clone(), plan })
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
        let mem = Memory::new(buffers, names, self.races && total > 1, grid);
        let world = World { mem, pid: [0; 3], grid, sink: &mut *self.sink };
        let mut exec = Exec { f, plan: &kernel.plan, env: vec![None; f.values.len()], world };
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

/// Validates `args` against `f`'s parameters; returns the parameter values and,
/// per buffer, the names of the parameters bound to it.
fn bind(f: &Function, buffers: &[Buffer], args: &[Arg]) -> Result<(Vec<Tile>, Vec<String>), String> {
    if args.len() != f.params.len() {
        let sig: Vec<String> = f.params.iter().map(|p| format!("{}: {}", p.name, f.ty(p.value))).collect();
        return Err(format!(
            "it takes {} argument(s) ({}), but {} were passed",
            f.params.len(),
            sig.join(", "),
            args.len()
        ));
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
