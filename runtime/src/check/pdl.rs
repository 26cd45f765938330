//! The GPU check of programmatic dependent launch (`gpu-check --only pdl`):
//! kernels that call `gdc_wait` are launched overlapping their predecessor
//! on sm_90a (see [`dsl_core::ir::ops::program`]), and this checks that the
//! overlap is real and that the wait makes it safe.
//!
//! [`pdl_step`] adds one to every element of `x` into `y`; 64 launches
//! ping-pong between two buffers of 4 Mi random f32 values, every other
//! launch walking the tiles in reverse, so a launch's first programs read the
//! tiles its predecessor writes last. The grid is two programs per SM
//! looping over the tiles, so the next kernel's programs fit beside the
//! running ones. The result must equal `x + 64` exactly (the same f32 adds on
//! the host):
//!
//! - `pdl_chain eager`: the 64 launches as the runtime issues them;
//! - `pdl_chain graph`: the same launches captured into a CUDA graph and
//!   replayed (programmatic dependency edges);
//! - `pdl_no_wait control`: the step without `gdc_wait`, forced to overlap
//!   the same way. Where launches overlap (sm_90a, `TESSERA_PDL` not `0`)
//!   it must produce wrong elements, which shows that the two rows above
//!   would catch a missing wait (except under compute-sanitizer or ncu, which
//!   serialize launches); elsewhere launches do not overlap and it must be
//!   exact.

use crate::bench::dequant::prepared;
use crate::check::{CheckRow, Rng};
use crate::cuda::{Cuda, DevBuf};
use crate::error::Result;
use crate::model::Device;
use dsl_core::DType;
use dsl_macros::kernel;

/// Elements per buffer.
const N: usize = 4 << 20;
/// Launches per chain.
const LAUNCHES: usize = 64;
/// Elements per tile.
const TILE: usize = 1024;

/// `y = x + 1` over `n` elements in tiles of `BLOCK`, programs striding over
/// the tiles (in reverse order when `reverse != 0`); waits for the previous
/// kernel first when `WAIT`.
#[kernel]
pub fn pdl_step(
    x_ptr: Ptr<f32>,
    y_ptr: Ptr<f32>,
    n: i32,
    reverse: i32,
    #[constexpr] WAIT: bool,
    #[constexpr] BLOCK: usize,
) {
    if WAIT {
        gdc_wait();
    }
    gdc_launch_dependents();
    let tiles = (n + (BLOCK as i32 - 1)) / BLOCK;
    for t in range(program_id(0), tiles, num_programs(0)) {
        let tile = where_(reverse != 0, tiles - 1 - t, t);
        let offs = tile * BLOCK + arange(0, BLOCK);
        let m = offs < n;
        store(y_ptr + offs, load(x_ptr + offs, mask = m, other = 0.0) + 1.0, mask = m);
    }
}

/// How a chain is issued.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Eager,
    Graph,
    /// Without the wait, launched overlapping when the device overlaps.
    NoWait,
}

/// Runs one chain of [`LAUNCHES`] steps from `init`; returns the final values.
fn chain(cuda: &mut Cuda, init: &[f32], mode: Mode) -> Result<Vec<f32>> {
    if mode == Mode::Graph {
        // Compile outside the capture (a capture records launches only).
        chain(cuda, init, Mode::Eager)?;
    }
    let gpu = cuda.gpu();
    let bufs: [DevBuf<f32>; 2] = [gpu.upload(init)?, gpu.zeros::<f32>(N)?];
    let grid = [2 * gpu.info().sm_count, 1, 1];
    let config = pdl_step::Config::new(mode != Mode::NoWait, TILE);
    let args = |i: usize| pdl_step::Args {
        x_ptr: bufs[i % 2].ptr(),
        y_ptr: bufs[(i + 1) % 2].ptr(),
        n: N as i32,
        reverse: (i % 2) as i32,
        _marker: std::marker::PhantomData,
    };
    match mode {
        Mode::Eager => {
            for i in 0..LAUNCHES {
                cuda.run::<pdl_step::Kernel>(grid, &config, &args(i))?;
            }
        }
        Mode::Graph => {
            cuda.gpu().begin_capture()?;
            let issued =
                (0..LAUNCHES).try_for_each(|i| cuda.run::<pdl_step::Kernel>(grid, &config, &args(i)));
            let graph = cuda.gpu().end_capture();
            issued?;
            cuda.gpu().replay(&graph?)?;
        }
        Mode::NoWait => {
            let overlap = cuda.overlaps_launches();
            let launches: Vec<_> = (0..2)
                .map(|i| prepared::<pdl_step::Kernel>(cuda, grid, &config, &args(i)))
                .collect::<Result<_>>()?;
            for i in 0..LAUNCHES {
                launches[i % 2].launch_with(cuda, overlap)?;
            }
        }
    }
    bufs[LAUNCHES % 2].download()
}

/// The three rows of the module doc.
pub fn pdl_checks(cuda: &mut Cuda, seed: u64) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed ^ 0x9d1);
    let init: Vec<f32> = rng.values::<f32>(N, 8.0);
    let want: Vec<f32> = init.iter().map(|&v| (0..LAUNCHES).fold(v, |a, _| a + 1.0)).collect();
    let overlap = cuda.overlaps_launches();
    // compute-sanitizer and ncu (which inject through this variable)
    // serialize launches, so the control cannot race under them.
    let serialized = std::env::var_os("CUDA_INJECTION64_PATH").is_some();
    let mut rows = Vec::new();
    for (name, mode) in
        [("pdl_chain", Mode::Eager), ("pdl_chain", Mode::Graph), ("pdl_no_wait_control", Mode::NoWait)]
    {
        let got = chain(cuda, &init, mode)?;
        let bad = got.iter().zip(&want).filter(|(g, w)| g.to_bits() != w.to_bits()).count();
        let max_abs = got.iter().zip(&want).map(|(g, w)| f64::from((g - w).abs())).fold(0.0, f64::max);
        let how = match mode {
            Mode::Eager => "eager",
            Mode::Graph => "graph",
            Mode::NoWait => "no gdc_wait",
        };
        let shape = format!(
            "{LAUNCHES} launches x {N} f32, {how}, launches {}overlap: {bad} wrong elements",
            if overlap { "" } else { "do not " }
        );
        let pass = match mode {
            Mode::NoWait if overlap => bad > 0 || serialized,
            _ => bad == 0,
        };
        let shape = if mode == Mode::NoWait && overlap && serialized {
            format!("{shape} (under a sanitizer or profiler, which serializes launches: not judged)")
        } else {
            shape
        };
        rows.push(CheckRow { kernel: name.into(), shape, dtype: DType::F32, max_abs, max_rel: 0.0, pass });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsl_core::interp::Cpu;

    /// The step on the interpreter, both orders and with and without the
    /// wait, over a ragged length: `y = x + 1` everywhere, nothing past `n`.
    #[test]
    fn the_step_adds_one_in_either_order() {
        let n = 5000;
        let x: Vec<f32> = Rng::new(3).values::<f32>(n, 8.0);
        for (wait, reverse) in [(true, 0), (true, 1), (false, 1)] {
            let mut cpu = Cpu::new();
            let (xp, yp) = (cpu.upload(&x), cpu.zeros::<f32>(n + 64));
            let args = pdl_step::Args {
                x_ptr: xp.cast(),
                y_ptr: yp.cast(),
                n: n as i32,
                reverse,
                _marker: std::marker::PhantomData,
            };
            pdl_step::interpret(&mut cpu, [3, 1, 1], &pdl_step::Config::new(wait, 256), &args).unwrap();
            let y = cpu.read(yp);
            assert!(y[..n].iter().zip(&x).all(|(a, b)| *a == b + 1.0), "wait {wait}, reverse {reverse}");
            assert!(y[n..].iter().all(|&v| v == 0.0));
        }
    }
}
