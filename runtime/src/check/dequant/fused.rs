//! The checks of the fused decode GEMVs: `kernels::dequant::fused` (the
//! `gemv_fused` rows) and the CPU-shaped `kernels::cpu_gemv`
//! (`crate::check::cpu_gemv`), which share their arguments, epilogues and
//! accumulation structure and so their inputs, runner and bounds.

use super::{Expected, Launch, Oracle, Path, Weight, gguf_rows, judge, rounding};
use crate::check::{CheckRow, DevicePtr, Rng, to_f64};
use crate::cuda::DeviceElem;
use crate::error::Result;
use crate::model::args::product_args;
use crate::model::{ActElem, Device};
use dsl_core::DType;
use dsl_core::half::bf16;
use dsl_core::interp::Cpu;
use kernels::dequant::{QuantFormat, Repacked};
use kernels::reference::quant as r;

/// Which fused decode GEMV kernels a fused check launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FusedKernels {
    /// `kernels::dequant::fused` (the GPU's).
    Dequant,
    /// `kernels::cpu_gemv` (the native CPU backend's).
    Cpu,
}

/// Which fusion a fused check runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fuse {
    /// The RMSNorm prologue.
    Norm,
    /// The residual-add epilogue.
    Residual,
}

/// Expands `$body` with `$kk` bound to the fused GEMV kernel module of
/// `$kernels`.
macro_rules! with_fused {
    ($kernels:expr, $kk:ident => $body:expr) => {
        match $kernels {
            FusedKernels::Dequant => {
                use kernels::dequant::fused::gemv_fused as $kk;
                $body
            }
            FusedKernels::Cpu => {
                use kernels::cpu_gemv::cpu_gemv as $kk;
                $body
            }
        }
    };
}

/// The epsilon of the fused norm checks (SmolLM2's `rms_norm_eps`).
pub(crate) const FUSED_EPS: f32 = 1e-5;

/// The inputs of one fused GEMV: activations, norm weights, the initial
/// `out` (the residual) and the weight.
pub(crate) struct FusedInputs<'a, T> {
    /// Activations `[m, k]`.
    pub x: &'a [T],
    /// Norm weights `[k]`.
    pub nw: &'a [T],
    /// The initial output `[m, n]`.
    pub out0: &'a [T],
    /// The repacked weight.
    pub w: &'a Repacked,
}

/// Runs a fused GEMV of `kernels` (`launch` is a GEMV launch; the CPU
/// kernels take its tiles, not its warps) on `dev`: `out[m, n]` as f64.
pub(crate) fn run_fused<T: DeviceElem, D: Device>(
    dev: &mut D,
    kernels: FusedKernels,
    launch: Launch,
    fuse: Fuse,
    inp: &FusedInputs<'_, T>,
    (m, n): (usize, usize),
) -> Result<Vec<f64>> {
    let (a, b, c) = launch.tiles;
    let flags = kernels::dequant::Fuse::NONE
        .with_silu(launch.silu)
        .with_norm(fuse == Fuse::Norm)
        .with_residual(fuse == Fuse::Residual);
    let (xd, qd, sd) = (dev.upload(inp.x)?, dev.upload(&inp.w.quants)?, dev.upload(&inp.w.scales)?);
    let (nd, od) = (dev.upload(inp.nw)?, dev.upload(inp.out0)?);
    with_fused!(kernels, kk => {
        let args = product_args!(
            kk,
            (dev.ptr(&qd)?, dev.ptr(&sd)?, dev.ptr(&od)?),
            (m, n, inp.w.k),
            x_ptr: dev.ptr(&xd)?,
            nw_ptr: dev.ptr(&nd)?,
            ldo: n as i32,
            eps: FUSED_EPS,
        );
        let mut config = kk::Config::new(T::DEVICE_DTYPE, T::DEVICE_DTYPE, launch.format, flags, a, b, c);
        if kernels == FusedKernels::Dequant {
            config = config.with_warps(launch.warps);
        }
        dev.run::<kk::Kernel>(launch.grid(m, n), &config, &args)?;
    });
    Ok(to_f64(&dev.download(&od)?))
}

/// The expected outputs of a fused GEMV on the columns `cols` (see
/// `tests/suite/lib_dequant.rs`): the plain GEMV's bound on the normed
/// activations of `reference::quant::rms_normed`, widened by two units of
/// their roundings and the f32 `rstd` error; the residual epilogue adds two
/// roundings.
#[allow(clippy::too_many_arguments)]
pub(crate) fn fused_expected(
    launch: Launch,
    fuse: Fuse,
    dtype: DType,
    (x, nw, out0): (&[f64], &[f64], &[f64]),
    raws: (&[u8], Option<&[u8]>),
    (m, n, k): (usize, usize, usize),
    cols: &[usize],
) -> Expected {
    let xn = if fuse == Fuse::Norm {
        r::rms_normed(x, nw, m, k, f64::from(FUSED_EPS), dtype, 1.0)
    } else {
        x.to_vec()
    };
    let slack = if fuse == Fuse::Norm { 4.0 * rounding(dtype) + 32.0 * f64::powi(2.0, -24) } else { 0.0 };
    let f = launch.format;
    let bk = launch.tiles.2;
    let g = r::gemv(f, &gguf_rows(f, raws.0, k, cols), cols.len(), k, &xn, m);
    let u = raws.1.map(|u| r::gemv(f, &gguf_rows(f, u, k, cols), cols.len(), k, &xn, m));
    let round = rounding(dtype);
    let mut e = Expected { want: Vec::new(), tol: Vec::new() };
    for i in 0..g.y.len() {
        let eg = r::error_bound(f, k, bk, g.abs[i]) + slack * g.abs[i];
        let (y, tol) = match &u {
            Some(u) => {
                let eu = r::error_bound(f, k, bk, u.abs[i]) + slack * u.abs[i];
                (r::silu_mul(g.y[i], u.y[i]), r::silu_mul_bound(g.y[i], u.y[i], eg, eu))
            }
            None => (g.y[i], eg),
        };
        let tol = tol + round * (y.abs() + tol);
        let (row, col) = (i / cols.len(), cols[i % cols.len()]);
        let (want, tol) = match fuse {
            Fuse::Norm => (y, tol),
            Fuse::Residual => {
                let want = r::residual_add(y, out0[row * n + col], dtype);
                (want, tol + round * (want.abs() + 2.0 * tol))
            }
        };
        e.want.push(want);
        e.tol.push(tol + 1e-30);
    }
    e
}

/// One fused check row: random inputs in `T`, `launch` of `kernels` on the
/// device, judged by `oracle` against the bound of a GEMV launch with its
/// tiles.
pub(crate) fn fused_case<T: ActElem, D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    (kernels, launch, fuse): (FusedKernels, Launch, Fuse),
    (m, n, k): (usize, usize, usize),
    oracle: Oracle,
    note: &str,
) -> Result<CheckRow> {
    let dtype = T::DEVICE_DTYPE;
    let (format, silu) = (launch.format, launch.silu);
    let x = rng.values::<T>(m * k, 2.0);
    let nw = rng.values::<T>(k, 2.0);
    let out0 = rng.values::<T>(m * n, 2.0);
    let w = Weight::random(rng, format, silu, n, k)?;
    let inp = FusedInputs { x: &x, nw: &nw, out0: &out0, w: &w.repacked };
    let got = run_fused(dev, kernels, launch, fuse, &inp, (m, n))?;
    let (xf, nf, of) = (to_f64(&x), to_f64(&nw), to_f64(&out0));
    let ins = (xf.as_slice(), nf.as_slice(), of.as_slice());
    let silu_s = if silu { ", silu" } else { "" };
    let (name, tiles) = match kernels {
        FusedKernels::Dequant => ("gemv_fused", launch.describe()),
        FusedKernels::Cpu => {
            let (a, b, c) = launch.tiles;
            ("cpu_gemv", format!("tiles {a}x{b}x{c}"))
        }
    };
    let shape = format!("{format:?} {fuse:?} M{m} K{k} N{n}{silu_s}, {tiles}{note}");
    let expected = |cols: &[usize]| fused_expected(launch, fuse, dtype, ins, w.raws(), (m, n, k), cols);
    let interpreter = || run_fused(&mut Cpu::new(), kernels, launch, fuse, &inp, (m, n));
    judge(name, shape, dtype, &got, (m, n), oracle, expected, interpreter)
}

/// The fusions checked: RMSNorm prologue without and with SiLU-mul, and the
/// residual epilogue.
pub(crate) const VARIANTS: [(bool, Fuse); 3] =
    [(false, Fuse::Norm), (true, Fuse::Norm), (false, Fuse::Residual)];

/// SmolLM2's decode projections `(silu, fusion, N, K, note)`: QKV, gate/up,
/// O and down.
pub(crate) const SMOL_PROJECTIONS: [(bool, Fuse, usize, usize, &str); 4] = [
    (false, Fuse::Norm, 960, 576, " (SmolLM2 QKV)"),
    (true, Fuse::Norm, 1536, 576, " (SmolLM2 gate/up)"),
    (false, Fuse::Residual, 576, 576, " (SmolLM2 O)"),
    (false, Fuse::Residual, 576, 1536, " (SmolLM2 down)"),
];

/// The Q8_0 LM head's shape `(M, N, K)` and its row note.
pub(crate) const LM_HEAD: ((usize, usize, usize), &str) = ((1, 49152, 576), " (LM head + final norm)");

/// The `gemv_fused` check (`kernels::dequant::fused`): the RMSNorm prologue
/// (with and without SiLU-mul) and the residual epilogue, Q4_1, Q4_0, Q8_0,
/// Q4_K and Q6_K, on ragged shapes against the interpreter in f32 and bf16,
/// the SmolLM2 decode projections (QKV N 960, gate/up, O, down; the
/// K-quants: down) and the Q8_0 LM head against the reference.
pub fn gemv_fused<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let mut rows = Vec::new();
    let interp = Oracle::Interpreter;
    let launch = |format, silu, (m, n, k)| Launch::default_for(Path::Gemv, format, silu, m, n, k, false);
    let kernels = FusedKernels::Dequant;
    for format in [QuantFormat::Q4_1, QuantFormat::Q4_0, QuantFormat::Q8_0] {
        for &shape in &super::GEMV_SHAPES {
            for (silu, fuse) in VARIANTS {
                let v = (kernels, launch(format, silu, shape), fuse);
                rows.push(fused_case::<f32, _>(dev, &mut rng, v, shape, interp, "")?);
                rows.push(fused_case::<bf16, _>(dev, &mut rng, v, shape, interp, "")?);
            }
        }
    }
    for (silu, fuse, n, k, note) in SMOL_PROJECTIONS {
        for m in [1, 8] {
            let v = (kernels, launch(QuantFormat::Q4_1, silu, (m, n, k)), fuse);
            rows.push(fused_case::<f32, _>(dev, &mut rng, v, (m, n, k), interp, note)?);
            rows.push(fused_case::<bf16, _>(dev, &mut rng, v, (m, n, k), interp, note)?);
        }
    }
    // Q4_K and Q6_K (formats of llama.cpp's K-quant files): every fusion
    // on a ragged shape of whole super-blocks, and SmolLM2's down
    // projection, the matrix those files store in them.
    for format in [QuantFormat::Q4_K, QuantFormat::Q6_K] {
        for (silu, fuse) in VARIANTS {
            let shape = (3, 37, 512);
            let v = (kernels, launch(format, silu, shape), fuse);
            rows.push(fused_case::<f32, _>(dev, &mut rng, v, shape, interp, "")?);
            rows.push(fused_case::<bf16, _>(dev, &mut rng, v, shape, interp, "")?);
        }
        let (silu, fuse, n, k, note) = SMOL_PROJECTIONS[3];
        for m in [1, 8] {
            let v = (kernels, launch(format, silu, (m, n, k)), fuse);
            rows.push(fused_case::<bf16, _>(dev, &mut rng, v, (m, n, k), interp, note)?);
        }
    }
    let (shape, note) = LM_HEAD;
    let v = (kernels, launch(QuantFormat::Q8_0, false, shape), Fuse::Norm);
    rows.push(fused_case::<f32, _>(dev, &mut rng, v, shape, Oracle::Reference(193), note)?);
    rows.push(fused_case::<bf16, _>(dev, &mut rng, v, shape, Oracle::Reference(193), note)?);
    Ok(rows)
}
