//! The synchronisation checks (`gpu-check --only
//! handoff_chain,line_chain,task_chain`): programs that hand data to each
//! other through `wait_until`, acquire/release stores and release atomics,
//! or lines that carry their own flag (`wait_load`)
//! (`kernels::examples::{handoff_chain, line_chain, task_chain}`), on
//! the device against the interpreter (which interleaves the programs and
//! checks every hand-over) and against the values computed here.
//!
//! - `handoff_chain`: 1, 17 and up to 64 programs (at most the device's
//!   multiprocessors: all resident), ranks forwards and backwards over the
//!   grid, rows of 64 `i32`.
//! - `line_chain`: as `handoff_chain`, the rows as flagged lines; the rows
//!   past row 0 start as random data under the previous flag, which no
//!   reader may take.
//! - `task_chain`: persistent grids of 1, 7 and up to 32 programs over 200
//!   and 1000 tasks whose dependencies cross programs.
//!
//! The native CPU backend runs programs to completion in any order, so it
//! rejects waiting kernels: there a row passes when the launch fails with
//! an `Unsupported` error and the interpreter still runs the kernel.

use crate::check::{CheckRow, DevicePtr, Rng, over_cases};
use crate::error::Result;
use crate::model::Device;
use dsl_core::DType;
use dsl_core::interp::Cpu;
use kernels::examples::{handoff_chain, line_chain, task_chain};
use std::marker::PhantomData;

/// Row width of both kernels.
const BLOCK: usize = 64;

/// A row comparing `got` (or the launch error) with `want` and the interpreter's `interp`.
fn row(
    kernel: &str,
    shape: String,
    got: Result<Vec<i32>>,
    want: &[i32],
    interp: &[i32],
    gpu: bool,
) -> CheckRow {
    let (pass, shape) = match got {
        Ok(g) => {
            let bad = g.iter().zip(want).filter(|(a, b)| a != b).count() + g.len().abs_diff(want.len());
            (bad == 0 && interp == want, format!("{shape}: {bad} of {} differ", want.len()))
        }
        Err(e) => {
            let s = e.to_string();
            let rejected = !gpu && s.contains("interpreter runs them");
            (
                rejected && interp == want,
                format!("{shape}: launch refused ({})", s.lines().next().unwrap_or("")),
            )
        }
    };
    CheckRow { kernel: kernel.into(), shape, dtype: DType::I32, max_abs: 0.0, max_rel: 0.0, pass }
}

/// The rows after `handoff_chain` over `g` programs on `dev`.
fn handoff_on<D: Device>(dev: &mut D, vals: &[i32], flags: &[i32], g: usize, rev: bool) -> Result<Vec<i32>> {
    let (vd, fd) = (dev.upload(vals)?, dev.upload(flags)?);
    let args = handoff_chain::Args {
        vals: dev.ptr(&vd)?,
        flags: dev.ptr(&fd)?,
        rev: i32::from(rev),
        _marker: PhantomData,
    };
    dev.run::<handoff_chain::Kernel>([g as u32, 1, 1], &handoff_chain::Config::new(BLOCK), &args)?;
    dev.download(&vd)
}

/// The lines after `line_chain` over `g` programs on `dev`.
fn lines_on<D: Device>(dev: &mut D, lines: &[i64], flag: i32, g: usize, rev: bool) -> Result<Vec<i64>> {
    let ld = dev.upload(lines)?;
    let args = line_chain::Args { lines: dev.ptr(&ld)?, flag, rev: i32::from(rev), _marker: PhantomData };
    dev.run::<line_chain::Kernel>([g as u32, 1, 1], &line_chain::Config::new(BLOCK), &args)?;
    dev.download(&ld)
}

/// A line: `v` in the low 32 bits, `flag` in the high 32.
fn line(v: i32, flag: i32) -> i64 {
    (i64::from(flag) << 32) | i64::from(v as u32)
}

/// `line_chain` over `g` programs: the rows' values after the launch, with
/// every line's flag checked (a line with another flag reads as `i32::MIN`).
fn line_handoff<D: Device>(dev: &mut D, rng: &mut Rng, g: usize, rev: bool) -> Result<CheckRow> {
    let flag = 1 + (rng.next_u64() % 1_000_000) as i32;
    let mut want = vec![0i32; (g + 1) * BLOCK];
    for v in &mut want[..BLOCK] {
        *v = (rng.next_u64() % 1000) as i32;
    }
    for r in 0..g {
        for j in 0..BLOCK {
            want[(r + 1) * BLOCK + j] = want[r * BLOCK + j] + r as i32 + 1;
        }
    }
    let lines: Vec<i64> = (0..want.len())
        .map(|i| if i < BLOCK { line(want[i], flag) } else { line(rng.next_u64() as i32, flag - 1) })
        .collect();
    let values = |l: Vec<i64>| -> Vec<i32> {
        l.iter().map(|&x| if (x >> 32) as i32 == flag { x as i32 } else { i32::MIN }).collect()
    };
    let got = lines_on(dev, &lines, flag, g, rev).map(values);
    let interp = values(lines_on(&mut Cpu::new(), &lines, flag, g, rev)?);
    let order = if rev { "ranks backwards" } else { "ranks forwards" };
    Ok(row("line_chain", format!("{g} programs, {order}"), got, &want, &interp, dev.tensor_cores()))
}

/// The rows after `task_chain` with `g` programs over `n` tasks on `dev`.
fn tasks_on<D: Device>(dev: &mut D, vals: &[i32], done: &[i32], g: usize, n: usize) -> Result<Vec<i32>> {
    let (vd, dd) = (dev.upload(vals)?, dev.upload(done)?);
    let args =
        task_chain::Args { vals: dev.ptr(&vd)?, done: dev.ptr(&dd)?, n: n as i32, _marker: PhantomData };
    dev.run::<task_chain::Kernel>([g as u32, 1, 1], &task_chain::Config::new(BLOCK), &args)?;
    dev.download(&vd)
}

/// `handoff_chain` over `g` programs: rows `0..=g` after the launch.
fn handoff<D: Device>(dev: &mut D, rng: &mut Rng, g: usize, rev: bool) -> Result<CheckRow> {
    let mut vals = vec![0i32; (g + 1) * BLOCK];
    for v in &mut vals[..BLOCK] {
        *v = (rng.next_u64() % 1000) as i32;
    }
    let mut flags = vec![0i32; g + 1];
    flags[0] = 1;
    let mut want = vals.clone();
    for r in 0..g {
        for j in 0..BLOCK {
            want[(r + 1) * BLOCK + j] = want[r * BLOCK + j] + r as i32 + 1;
        }
    }
    let got = handoff_on(dev, &vals, &flags, g, rev);
    let interp = handoff_on(&mut Cpu::new(), &vals, &flags, g, rev)?;
    let order = if rev { "ranks backwards" } else { "ranks forwards" };
    Ok(row("handoff_chain", format!("{g} programs, {order}"), got, &want, &interp, dev.tensor_cores()))
}

/// `task_chain` with `g` programs over `n` tasks: rows `0..n + 2`.
fn tasks<D: Device>(dev: &mut D, rng: &mut Rng, g: usize, n: usize) -> Result<CheckRow> {
    let mut vals = vec![0i32; (n + 2) * BLOCK];
    for v in &mut vals[..2 * BLOCK] {
        *v = (rng.next_u64() % 65521) as i32;
    }
    let done = vec![0i32; n + 2];
    let mut want = vals.clone();
    for t in 0..n {
        for j in 0..BLOCK {
            let (a, b) = (want[(t + 1) * BLOCK + j], want[t * BLOCK + j]);
            want[(t + 2) * BLOCK + j] = (a + b) % 65521 + t as i32;
        }
    }
    let got = tasks_on(dev, &vals, &done, g, n);
    let interp = tasks_on(&mut Cpu::new(), &vals, &done, g, n)?;
    Ok(row("task_chain", format!("{g} programs, {n} tasks"), got, &want, &interp, dev.tensor_cores()))
}

/// The most programs a waiting grid may have on `dev` (all resident).
fn cap<D: Device>(dev: &D) -> usize {
    if dev.tensor_cores() { dev.sm_count().max(1) } else { usize::MAX }
}

/// The `handoff_chain` rows (see the module doc).
pub fn handoffs<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let cases = [1, 17, 64].into_iter().flat_map(|g| [false, true].map(|rev| (g, rev)));
    over_cases(dev, seed, cases, |dev, rng, (g, rev)| handoff(dev, rng, g.min(cap(dev)), rev))
}

/// The `line_chain` rows (see the module doc).
pub fn line_chains<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let cases = [1, 17, 64].into_iter().flat_map(|g| [false, true].map(|rev| (g, rev)));
    over_cases(dev, seed, cases, |dev, rng, (g, rev)| line_handoff(dev, rng, g.min(cap(dev)), rev))
}

/// The `task_chain` rows (see the module doc).
pub fn task_lists<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    over_cases(dev, seed, [(1, 200), (7, 200), (32, 1000)], |dev, rng, (g, n)| {
        tasks(dev, rng, g.min(cap(dev)), n)
    })
}
