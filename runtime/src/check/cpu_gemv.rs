//! The check of the CPU-shaped decode GEMVs (`kernels::cpu_gemv`, registry
//! entry `cpu_gemv_q4_1`, rows `cpu_gemv`), the native backend's fused
//! GEMVs: the RMSNorm prologue (with and without SiLU-mul) and the
//! residual epilogue, every format, f32 and bf16, with the tiles the
//! native backend takes
//! (`cpu_gemv_tiles`: one block per K step) and with 128-wide K tiles
//! whose last step is partial (masked), on the ragged shapes of the fused
//! GEMV's check against the interpreter (within twice the f32 accumulation
//! bound, the interpreter within it of the f64 reference), SmolLM2's decode
//! projections at M 1 and 8, and the Q8_0 LM head against the reference on
//! a subset of columns. Inputs and bounds are `check_dequant`'s.

use crate::check::dequant::{
    FUSED_EPS, Fuse, FusedInputs, GEMV_SHAPES, Launch, Path, account, fused_expected, gguf_weight, repacked,
};
use crate::check::{CheckRow, DevicePtr, Rng};
use crate::cuda::DeviceElem;
use crate::error::{Error, Result};
use crate::model::ActElem;
use crate::model::Device;
use dsl_core::half::bf16;
use dsl_core::interp::Cpu;
use kernels::cpu_gemv::cpu_gemv_tiles;
use kernels::dequant::{QuantFormat, gemv_grid, interleave_gate_up, m_block_for};
use std::marker::PhantomData;

/// One launch: format, SiLU, fusion and tiles `(M_BLOCK, BLOCK_N, BLOCK_K)`.
#[derive(Clone, Copy, Debug)]
struct Case {
    format: QuantFormat,
    silu: bool,
    fuse: Fuse,
    tiles: (usize, usize, usize),
}

/// Runs `case` on the device (`dev`) or the interpreter (`None`): `out[m,
/// n]` as f64.
fn run<T: DeviceElem, D: Device>(
    dev: Option<&mut D>,
    case: Case,
    inp: &FusedInputs<'_, T>,
    m: usize,
    n: usize,
) -> Result<Vec<f64>> {
    let (a, b, c) = case.tiles;
    let (norm, residual) = (case.fuse == Fuse::Norm, case.fuse == Fuse::Residual);
    let grid = gemv_grid(m, n, case.silu, a, b);
    let k = inp.w.k as i32;
    use kernels::cpu_gemv::cpu_gemv as kk;
    let config = kk::Config::new(T::DEVICE_DTYPE, case.format, case.silu, norm, residual, a, b, c);
    macro_rules! args {
        ($kk:ident, $x:expr, $q:expr, $s:expr, $nw:expr, $o:expr) => {
            $kk::Args {
                x_ptr: $x,
                q_ptr: $q,
                s_ptr: $s,
                nw_ptr: $nw,
                out_ptr: $o,
                m: m as i32,
                n: n as i32,
                k,
                eps: FUSED_EPS,
                _marker: PhantomData,
            }
        };
    }
    match dev {
        Some(dev) => {
            let (xd, qd, sd) = (dev.upload(inp.x)?, dev.upload(&inp.w.quants)?, dev.upload(&inp.w.scales)?);
            let (nd, od) = (dev.upload(inp.nw)?, dev.upload(inp.out0)?);
            let args = args!(kk, dev.ptr(&xd)?, dev.ptr(&qd)?, dev.ptr(&sd)?, dev.ptr(&nd)?, dev.ptr(&od)?);
            dev.run::<kk::Kernel>(grid, &config, &args)?;
            Ok(dev.download(&od)?.iter().map(|v| v.to_f64()).collect())
        }
        None => {
            let mut cpu = Cpu::new();
            let (xc, qc, sc) = (cpu.upload(inp.x), cpu.upload(&inp.w.quants), cpu.upload(&inp.w.scales));
            let (nc, oc) = (cpu.upload(inp.nw), cpu.upload(inp.out0));
            let args = args!(kk, xc.cast(), qc.cast(), sc.cast(), nc.cast(), oc.cast());
            kk::interpret(&mut cpu, grid, &config, &args)?;
            Ok(cpu.read(oc).iter().map(|v| v.to_f64()).collect())
        }
    }
}

/// One check row: random inputs in `T`, `case` on the device against the
/// interpreter (`reference: None`) or against the f64 reference on about
/// `Some(count)` columns.
fn check_case<T: ActElem, D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    case: Case,
    (m, n, k): (usize, usize, usize),
    reference: Option<usize>,
    note: &str,
) -> Result<CheckRow> {
    let dtype = T::DEVICE_DTYPE;
    let format = case.format;
    let x = rng.values::<T>(m * k, 2.0);
    let nw = rng.values::<T>(k, 2.0);
    let out0 = rng.values::<T>(m * n, 2.0);
    let g_raw = gguf_weight(rng, format, n, k);
    let u_raw = if case.silu { Some(gguf_weight(rng, format, n, k)) } else { None };
    let w = match &u_raw {
        Some(u) => interleave_gate_up(&repacked(format, &g_raw, n, k)?, &repacked(format, u, n, k)?)
            .map_err(|e| Error::Usage(e.to_string()))?,
        None => repacked(format, &g_raw, n, k)?,
    };
    let inp = FusedInputs { x: &x, nw: &nw, out0: &out0, w: &w };
    let got = run::<T, _>(Some(dev), case, &inp, m, n)?;
    let f64s = |v: &[T]| v.iter().map(|e| e.to_f64()).collect::<Vec<f64>>();
    let (xf, nf, of) = (f64s(&x), f64s(&nw), f64s(&out0));
    let ins = (xf.as_slice(), nf.as_slice(), of.as_slice());
    let raws = (g_raw.as_slice(), u_raw.as_deref());
    // The bound of a GEMV launch with these tiles (the accumulation is the
    // fused GEMV's: elementwise f32 FMAs per K tile, one sum at the end).
    let mut launch = Launch::default_for(Path::Gemv, format, case.silu, m, n, k, false);
    launch.tiles = case.tiles;
    let silu_s = if case.silu { ", silu" } else { "" };
    let (a, b, c) = case.tiles;
    let mut shape = format!("{format:?} {:?} M{m} K{k} N{n}{silu_s}, tiles {a}x{b}x{c}{note}", case.fuse);
    let name = "cpu_gemv";
    match reference {
        None => {
            let cols: Vec<usize> = (0..n).collect();
            let e = fused_expected(launch, case.fuse, dtype, ins, raws, (m, n, k), &cols);
            let want = run::<T, D>(None, case, &inp, m, n)?;
            let tol: Vec<f64> = e.tol.iter().map(|t| 2.0 * t).collect();
            let mut row = account(name, shape.clone(), dtype, &got, &want, &tol);
            row.pass &= account(name, shape, dtype, &want, &e.want, &e.tol).pass;
            Ok(row)
        }
        Some(count) => {
            let step = (n / count.max(1)).max(1);
            let mut cols: Vec<usize> = (0..n).step_by(step).collect();
            if cols.last() != Some(&(n - 1)) {
                cols.push(n - 1);
            }
            shape.push_str(&format!(", f64 reference on {} columns", cols.len()));
            let e = fused_expected(launch, case.fuse, dtype, ins, raws, (m, n, k), &cols);
            let picked: Vec<f64> =
                (0..m).flat_map(|i| cols.iter().map(move |&j| (i, j))).map(|(i, j)| got[i * n + j]).collect();
            Ok(account(name, shape, dtype, &picked, &e.want, &e.tol))
        }
    }
}

/// The native backend's tiles for a case.
fn native_tiles(format: QuantFormat, silu: bool, m: usize, n: usize, k: usize) -> (usize, usize, usize) {
    let t = cpu_gemv_tiles(format, m, if silu { 2 * n } else { n }, k);
    (t.m_block, t.block_n, t.block_k)
}

/// The `cpu_gemv` check (see the module doc).
pub fn cpu_gemv<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let mut rows = Vec::new();
    let variants = [(false, Fuse::Norm), (true, Fuse::Norm), (false, Fuse::Residual)];
    for format in [QuantFormat::Q4_1, QuantFormat::Q4_0, QuantFormat::Q8_0] {
        for &(m, n, k) in &GEMV_SHAPES {
            for (silu, fuse) in variants {
                let tiles = native_tiles(format, silu, m, n, k);
                let case = Case { format, silu, fuse, tiles };
                rows.push(check_case::<f32, _>(dev, &mut rng, case, (m, n, k), None, "")?);
                rows.push(check_case::<bf16, _>(dev, &mut rng, case, (m, n, k), None, "")?);
                // 128-wide K tiles: a partial last step (or only one).
                let case = Case { tiles: (m_block_for(m), 4, 128), ..case };
                rows.push(check_case::<f32, _>(dev, &mut rng, case, (m, n, k), None, "")?);
            }
        }
    }
    let smol = [
        (false, Fuse::Norm, 960, 576, " (SmolLM2 QKV)"),
        (true, Fuse::Norm, 1536, 576, " (SmolLM2 gate/up)"),
        (false, Fuse::Residual, 576, 576, " (SmolLM2 O)"),
        (false, Fuse::Residual, 576, 1536, " (SmolLM2 down)"),
    ];
    for (silu, fuse, n, k, note) in smol {
        for m in [1, 8] {
            let format = QuantFormat::Q4_1;
            let case = Case { format, silu, fuse, tiles: native_tiles(format, silu, m, n, k) };
            rows.push(check_case::<f32, _>(dev, &mut rng, case, (m, n, k), None, note)?);
            rows.push(check_case::<bf16, _>(dev, &mut rng, case, (m, n, k), None, note)?);
        }
    }
    let format = QuantFormat::Q8_0;
    let (m, n, k) = (1, 49152, 576);
    let case = Case { format, silu: false, fuse: Fuse::Norm, tiles: native_tiles(format, false, m, n, k) };
    let note = " (LM head + final norm)";
    rows.push(check_case::<f32, _>(dev, &mut rng, case, (m, n, k), Some(193), note)?);
    rows.push(check_case::<bf16, _>(dev, &mut rng, case, (m, n, k), Some(193), note)?);
    Ok(rows)
}
