//! The GPU checks of the dequant GEMV/GEMM kernels (`kernels::dequant`),
//! one registry entry per kernel (`gemv_q4_1`, `gemv_q4_0`, `gemv_q8_0`,
//! `gemv_q4_k`, `gemv_q6_k` (with Q5_K's and Q5_1's ragged shapes),
//! `gemm_q4_1`, `gemm_q4_0`, `gemm_q8_0`), each covering the plain and the
//! fused SiLU-mul variant (`silu` in the shape column). K-quant shapes
//! round K up to whole super-blocks.
//!
//! Inputs: random GGUF weights (finite f16 scales of either sign over several
//! binades, random Q4_1 mins, random quant bytes) repacked as the runtime
//! does, random non-zero activations, f32 and bf16.
//!
//! - Ragged shapes with the untuned tiles (`M` odd and up to 15 for the GEMV,
//!   `N` and `K` not multiples of the tiles), and every declared autotune
//!   config on one ragged shape: GPU against the CPU interpreter.
//! - SmolLM2 shapes (M = 1, K = 576, N = 1536, gate/up fused and not; the
//!   Q8_0 LM head M = 1, K = 576, N = 49152 on a row subset): GPU against
//!   the interpreter or the f64 reference.
//! - The bench shape M = 1, K = 4096, N = 14336 (and M = 16 / 256 for the
//!   GEMM): GPU against the f64 reference of
//!   `kernels::reference::quant` on a subset of rows (the interpreter is too
//!   slow there).
//!
//! Tolerance per element (see `kernels::reference::quant`): the f32
//! accumulation bound `error_bound` (the GEMM's `gemm_error_bound`, which
//! adds the f16 rounding of its tensor-core operands; plus the SiLU
//! propagation bound), plus
//! one rounding to the output dtype; against the interpreter, twice that (both
//! sides are within it of the exact value).

use crate::check::DevicePtr;
use crate::check::{CheckRow, Rng, compare_each, to_f64};
use crate::cuda::DeviceElem;
use crate::error::{Error, Result};
use crate::model::ActElem;
use crate::model::Device;
use crate::model::args::product_args;
use dsl_core::DType;
use dsl_core::half::{bf16, f16};
use dsl_core::interp::Cpu;
use kernels::dequant::stream_k::gemm_stream_k;
use kernels::dequant::{
    GemvTiles, QuantFormat, Repacked, gemm_grid, gemm_tiles, gemv_grid, gemv_tiles, interleave_gate_up,
    repack, stream_k,
};
use kernels::reference::quant as r;

/// Which kernel family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    /// The decode GEMV.
    Gemv,
    /// The prefill GEMM.
    Gemm,
}

/// One launch: kernel, tiles `(a, b, c)` = GEMV `(M_BLOCK, BLOCK_N,
/// BLOCK_K)` or GEMM `(BLOCK_M, BLOCK_N, BLOCK_K)`, and warps.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Launch {
    /// The kernel family.
    pub path: Path,
    /// The weight format.
    pub format: QuantFormat,
    /// Fused SiLU-mul.
    pub silu: bool,
    /// The three tile constexprs.
    pub tiles: (usize, usize, usize),
    /// Warps per program.
    pub warps: u32,
    /// The GEMM's swapped product (`SWAP`).
    pub swap: bool,
    /// Software-pipelining depth.
    pub stages: u32,
    /// The stream-K GEMM (`gemm_stream_k`, swapped) on this many programs.
    pub stream_k: Option<u32>,
}

impl Launch {
    /// The untuned launch for `m x n x k` (`n` output columns).
    pub(crate) fn default_for(
        path: Path,
        format: QuantFormat,
        silu: bool,
        m: usize,
        n: usize,
        k: usize,
        swap_ok: bool,
    ) -> Launch {
        let rows = if silu { 2 * n } else { n };
        match path {
            Path::Gemv => {
                let GemvTiles { m_block, block_n, block_k, num_warps } = gemv_tiles(format, m, rows, k);
                let tiles = (m_block, block_n, block_k);
                Launch { path, format, silu, tiles, warps: num_warps, swap: false, stages: 2, stream_k: None }
            }
            Path::Gemm => {
                let t = gemm_tiles(format, m, rows, k, swap_ok);
                let tiles = (t.block_m, t.block_n, t.block_k);
                let (warps, swap, stages) = (t.num_warps, t.swap, t.num_stages);
                Launch { path, format, silu, tiles, warps, swap, stages, stream_k: None }
            }
        }
    }

    /// The runtime's launch: [`Launch::default_for`], or stream-K where
    /// `kernels::dequant::stream_k` takes it on a device with `sms` SMs.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn runtime_for(
        path: Path,
        format: QuantFormat,
        silu: bool,
        (m, n, k): (usize, usize, usize),
        swap_ok: bool,
        sms: usize,
    ) -> Launch {
        let mut l = Launch::default_for(path, format, silu, m, n, k, swap_ok);
        let rows = if silu { 2 * n } else { n };
        if let (Path::Gemm, Some((t, g))) = (path, stream_k(format, m, rows, k, swap_ok, sms)) {
            l.tiles = (t.block_m, t.block_n, t.block_k);
            (l.warps, l.swap, l.stages, l.stream_k) = (t.num_warps, true, t.num_stages, Some(g));
        }
        l
    }

    /// The grid for `m x n` outputs.
    pub(crate) fn grid(&self, m: usize, n: usize) -> [u32; 3] {
        let (a, b, _) = self.tiles;
        if let Some(g) = self.stream_k {
            return [g, 1, 1];
        }
        match self.path {
            Path::Gemv => gemv_grid(m, n, self.silu, a, b),
            Path::Gemm => gemm_grid(m, n, self.silu, a, b),
        }
    }

    /// The launch in words.
    fn describe(&self) -> String {
        let (a, b, c) = self.tiles;
        let first = if self.path == Path::Gemv { "M_BLOCK" } else { "BLOCK_M" };
        let swap = if self.swap { ", swapped" } else { "" };
        let sk = self.stream_k.map(|g| format!(", stream-K on {g} programs")).unwrap_or_default();
        format!("{first} {a}, BLOCK_N {b}, BLOCK_K {c}, {}w, {} stages{swap}{sk}", self.warps, self.stages)
    }
}

/// Expands `$body` with `$kk` bound to the kernel module of `$launch` and
/// `$cfg` to its configuration for activation dtype `$dt`.
macro_rules! with_kernel {
    ($launch:expr, $dt:expr, $kk:ident, $cfg:ident => $body:expr) => {{
        let (a, b, c) = $launch.tiles;
        match $launch.path {
            Path::Gemv => {
                use kernels::dequant::gemv::gemv as $kk;
                let $cfg = $kk::Config::new($dt, $dt, $launch.format, $launch.silu, a, b, c)
                    .with_warps($launch.warps)
                    .with_stages($launch.stages);
                $body
            }
            Path::Gemm => {
                use kernels::dequant::gemm::gemm as $kk;
                let $cfg = $kk::Config::new($dt, $dt, $launch.format, $launch.silu, a, b, c, $launch.swap)
                    .with_warps($launch.warps)
                    .with_stages($launch.stages);
                $body
            }
        }
    }};
}
/// The declared autotune configs of the kernel of `base`, as launches.
fn tuned_launches(base: Launch) -> Vec<Launch> {
    let (a, b, c) = base.tiles;
    let with = |tiles: (usize, usize, usize), warps: u32, swap: bool, stages: u32| Launch {
        tiles,
        warps,
        swap,
        stages,
        ..base
    };
    match base.path {
        Path::Gemv => {
            use kernels::dequant::gemv::gemv as kk;
            let cfg = kk::Config::new(DType::BF16, DType::BF16, base.format, base.silu, a, b, c);
            kk::autotune_configs(&cfg)
                .into_iter()
                .map(|t| with((t.M_BLOCK, t.BLOCK_N, t.BLOCK_K), t.num_warps, false, t.num_stages))
                .collect()
        }
        Path::Gemm => {
            use kernels::dequant::gemm::gemm as kk;
            let cfg = kk::Config::new(DType::BF16, DType::BF16, base.format, base.silu, a, b, c, false);
            kk::autotune_configs(&cfg)
                .into_iter()
                .map(|t| with((t.BLOCK_M, t.BLOCK_N, t.BLOCK_K), t.num_warps, t.SWAP, t.num_stages))
                .collect()
        }
    }
}

/// Random GGUF bytes of a weight `[n, k]` in `format`: random quant bytes
/// with random finite f16 scales (and mins) of either sign; for the formats
/// beyond Q4_0/Q4_1/Q8_0, random bytes with each block's f16 fields (`d`,
/// `dmin`/`m`, or the float weights) set finite.
pub(crate) fn gguf_weight(rng: &mut Rng, format: QuantFormat, n: usize, k: usize) -> Vec<u8> {
    let scale = |rng: &mut Rng, lo: i32, span: u64| {
        let v = (1.0 + rng.unit()) * 2f64.powi(lo + (rng.next_u64() % span) as i32);
        f16::from_f64(if rng.next_u64() & 1 == 0 { v } else { -v }).to_le_bytes()
    };
    if !matches!(format, QuantFormat::Q4_0 | QuantFormat::Q4_1 | QuantFormat::Q8_0) {
        let mut out: Vec<u8> = (0..format.gguf_bytes(n, k)).map(|_| rng.next_u64() as u8).collect();
        for b in out.chunks_exact_mut(format.block_bytes()) {
            let halves: &[usize] = match format {
                QuantFormat::Q6_K => &[208],
                QuantFormat::Q4_K | QuantFormat::Q5_K | QuantFormat::Q5_1 => &[0, 2],
                _ => &[0],
            };
            for &at in halves {
                let (lo, span) = if format.is_k_quant() { (-12, 6) } else { (-8, 8) };
                let v = if format == QuantFormat::BF16 {
                    dsl_core::half::bf16::from_f32(f16::from_le_bytes(scale(rng, lo, span)).to_f32())
                        .to_le_bytes()
                } else {
                    scale(rng, lo, span)
                };
                b[at..at + 2].copy_from_slice(&v);
            }
        }
        return out;
    }
    let blocks = n * k / 32;
    let mut out = Vec::with_capacity(blocks * format.block_bytes());
    for _ in 0..blocks {
        out.extend_from_slice(&scale(rng, -8, 8));
        if format == QuantFormat::Q4_1 {
            out.extend_from_slice(&scale(rng, -6, 7));
        }
        let mut q = [0u8; 32];
        for c in q.chunks_exact_mut(8) {
            c.copy_from_slice(&rng.next_u64().to_le_bytes());
        }
        out.extend_from_slice(&q[..format.quant_bytes()]);
    }
    out
}

/// Repacks `raw`, mapping the error to a usage error.
pub(crate) fn repacked(format: QuantFormat, raw: &[u8], n: usize, k: usize) -> Result<Repacked> {
    repack(format, raw, n, k).map_err(|e| Error::Usage(e.to_string()))
}

/// A random weight `[n, k]` of a check: the GGUF bytes of the gate (or
/// only) weight and, for SiLU, of the up weight, and what the kernels read
/// (repacked; gate and up interleaved).
pub(crate) struct Weight {
    /// The GGUF bytes of the gate (or only) weight.
    pub gate: Vec<u8>,
    /// The GGUF bytes of the up weight (SiLU-mul only).
    pub up: Option<Vec<u8>>,
    /// The repacked weight the kernels read.
    pub repacked: Repacked,
}

impl Weight {
    /// Random weights of `n` rows of `k` in `format` (two with `silu`).
    pub(crate) fn random(
        rng: &mut Rng,
        format: QuantFormat,
        silu: bool,
        n: usize,
        k: usize,
    ) -> Result<Weight> {
        let gate = gguf_weight(rng, format, n, k);
        let up = if silu { Some(gguf_weight(rng, format, n, k)) } else { None };
        let repacked = match &up {
            Some(u) => interleave_gate_up(&repacked(format, &gate, n, k)?, &repacked(format, u, n, k)?)
                .map_err(|e| Error::Usage(e.to_string()))?,
            None => repacked(format, &gate, n, k)?,
        };
        Ok(Weight { gate, up, repacked })
    }

    /// The GGUF bytes `(gate, up)`, as the expectations take them.
    pub(crate) fn raws(&self) -> (&[u8], Option<&[u8]>) {
        (&self.gate, self.up.as_deref())
    }
}

/// The rows `rows` of a GGUF weight with `k` columns, as their own weight.
pub(crate) fn gguf_rows(format: QuantFormat, raw: &[u8], k: usize, rows: &[usize]) -> Vec<u8> {
    let rb = format.gguf_bytes(1, k);
    rows.iter().flat_map(|&i| raw[i * rb..(i + 1) * rb].iter().copied()).collect()
}

/// Fails unless the stream-K flags are all zero again after a launch.
fn flags_zero(flags: &[i32]) -> Result<()> {
    match flags.iter().position(|&v| v != 0) {
        None => Ok(()),
        Some(i) => Err(Error::Usage(format!("stream-K flag {i} left at {} after the launch", flags[i]))),
    }
}

/// Runs `launch` on `dev` (the GPU, the native CPU backend or the
/// interpreter): `out[m, n]` as f64.
pub(crate) fn run<T: DeviceElem, D: Device>(
    dev: &mut D,
    launch: Launch,
    x: &[T],
    w: &Repacked,
    m: usize,
    n: usize,
) -> Result<Vec<f64>> {
    let (xd, qd, sd) = (dev.upload(x)?, dev.upload(&w.quants)?, dev.upload(&w.scales)?);
    let od = dev.zeros::<T>(m * n)?;
    if let Some(g) = launch.stream_k {
        let (a, b, c) = launch.tiles;
        let ws = dev.upload(&vec![f32::NAN; g as usize * a * b])?;
        let flags = dev.zeros::<i32>(g as usize)?;
        let args = product_args!(
            gemm_stream_k,
            (dev.ptr(&qd)?, dev.ptr(&sd)?, dev.ptr(&od)?),
            (m, n, w.k),
            x_ptr: dev.ptr(&xd)?,
            ws_ptr: dev.ptr(&ws)?,
            flag_ptr: dev.ptr(&flags)?,
        );
        let config = gemm_stream_k::Config::new(T::DEVICE_DTYPE, launch.format, launch.silu, a, b, c)
            .with_warps(launch.warps)
            .with_stages(launch.stages);
        dev.run::<gemm_stream_k::Kernel>(launch.grid(m, n), &config, &args)?;
        flags_zero(&dev.download(&flags)?)?;
    } else {
        with_kernel!(launch, T::DEVICE_DTYPE, kk, config => {
            let planes = (dev.ptr(&qd)?, dev.ptr(&sd)?, dev.ptr(&od)?);
            let args = product_args!(kk, planes, (m, n, w.k), x_ptr: dev.ptr(&xd)?);
            dev.run::<kk::Kernel>(launch.grid(m, n), &config, &args)?;
        });
    }
    Ok(to_f64(&dev.download(&od)?))
}

/// The relative half-ulp bound of the final rounding to `dtype`.
fn rounding(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 1.0 / 256.0,
        DType::F16 => 1.0 / 2048.0,
        _ => 1.0 / 16_777_216.0,
    }
}

/// Exact outputs and their tolerances (kernel vs exact) for the `cols`
/// output columns of a case: `want[i * cols.len() + j]` is `out[i, cols[j]]`.
pub(crate) struct Expected {
    /// The exact outputs.
    pub want: Vec<f64>,
    /// Their tolerances.
    pub tol: Vec<f64>,
}

/// The expected outputs of `launch` on `x` (as f64, `[m, k]`) for the gate
/// (or only) weight `g_raw` and the up weight `u_raw` (SiLU), restricted to
/// output columns `cols`.
fn expected(
    launch: Launch,
    dtype: DType,
    x: &[f64],
    (g_raw, u_raw): (&[u8], Option<&[u8]>),
    m: usize,
    k: usize,
    cols: &[usize],
) -> Expected {
    let f = launch.format;
    let bk = launch.tiles.2;
    let g = r::gemv(f, &gguf_rows(f, g_raw, k, cols), cols.len(), k, x, m);
    let u = u_raw.map(|u| r::gemv(f, &gguf_rows(f, u, k, cols), cols.len(), k, x, m));
    let mut e = Expected { want: Vec::with_capacity(g.y.len()), tol: Vec::with_capacity(g.y.len()) };
    // The GEMM rounds its operands to f16 (see `kernels::reference::quant`).
    let bound = |y: &r::Gemv, i: usize| match launch.path {
        Path::Gemv => r::error_bound(f, k, bk, y.abs[i]),
        Path::Gemm if launch.swap => r::gemm_swap_error_bound(f, k, y.abs[i], y.l1[i], dtype),
        Path::Gemm => r::gemm_error_bound(f, k, bk, y.abs[i], y.l1[i]),
    };
    for i in 0..g.y.len() {
        let eg = bound(&g, i);
        let (want, tol) = match &u {
            Some(u) => {
                let eu = bound(u, i);
                (r::silu_mul(g.y[i], u.y[i]), r::silu_mul_bound(g.y[i], u.y[i], eg, eu))
            }
            None => (g.y[i], eg),
        };
        e.want.push(want);
        e.tol.push(tol + rounding(dtype) * (want.abs() + tol));
    }
    e
}

/// How a case is judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Oracle {
    /// Against the interpreter, every output.
    Interpreter,
    /// Against the f64 reference, on about `n` evenly spread output columns
    /// (all rows of `M`).
    Reference(usize),
}

/// Judges the device's `got` (`[m, n]`) by `oracle`. `expected` gives the
/// exact outputs and their bounds on a set of columns and `interpreter`
/// runs the case on the interpreter. Against the interpreter, the device
/// must be within twice the bound of it and the interpreter within the
/// bound of the exact value (both sides are within it); against the
/// reference, the device within the bound on the picked columns.
#[allow(clippy::too_many_arguments)]
pub(crate) fn judge(
    name: &str,
    mut shape: String,
    dtype: DType,
    got: &[f64],
    (m, n): (usize, usize),
    oracle: Oracle,
    expected: impl Fn(&[usize]) -> Expected,
    interpreter: impl FnOnce() -> Result<Vec<f64>>,
) -> Result<CheckRow> {
    match oracle {
        Oracle::Interpreter => {
            let cols: Vec<usize> = (0..n).collect();
            let e = expected(&cols);
            let want = interpreter()?;
            let tol: Vec<f64> = e.tol.iter().map(|t| 2.0 * t).collect();
            let mut row = compare_each(name, shape.clone(), dtype, got, &want, &tol);
            row.pass &= compare_each(name, shape, dtype, &want, &e.want, &e.tol).pass;
            Ok(row)
        }
        Oracle::Reference(count) => {
            let step = (n / count.max(1)).max(1);
            let mut cols: Vec<usize> = (0..n).step_by(step).collect();
            if cols.last() != Some(&(n - 1)) {
                cols.push(n - 1);
            }
            shape.push_str(&format!(", f64 reference on {} columns", cols.len()));
            let e = expected(&cols);
            let picked: Vec<f64> =
                (0..m).flat_map(|i| cols.iter().map(move |&j| (i, j))).map(|(i, j)| got[i * n + j]).collect();
            Ok(compare_each(name, shape, dtype, &picked, &e.want, &e.tol))
        }
    }
}

/// One check: random weight(s) `[n, k]` and activations `[m, k]` in `T`,
/// `launch` on the device, judged by `oracle`.
#[allow(clippy::too_many_arguments)]
fn case<T: ActElem, D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    name: &str,
    launch: Launch,
    (m, n, k): (usize, usize, usize),
    oracle: Oracle,
    note: &str,
) -> Result<CheckRow> {
    let dtype = T::DEVICE_DTYPE;
    let x = rng.values::<T>(m * k, 2.0);
    let xf = to_f64(&x);
    let w = Weight::random(rng, launch.format, launch.silu, n, k)?;
    let got = run(dev, launch, &x, &w.repacked, m, n)?;
    let silu = if launch.silu { ", silu" } else { "" };
    let shape = format!("M{m} K{k} N{n}{silu}, {}{note}", launch.describe());
    let expected = |cols: &[usize]| expected(launch, dtype, &xf, w.raws(), m, k, cols);
    let interpreter = || run(&mut Cpu::new(), launch, &x, &w.repacked, m, n);
    judge(name, shape, dtype, &got, (m, n), oracle, expected, interpreter)
}

/// Ragged GEMV shapes `(m, n, k)` checked against the interpreter.
pub(crate) const GEMV_SHAPES: [(usize, usize, usize); 5] =
    [(1, 1, 32), (3, 37, 96), (5, 130, 608), (7, 64, 1024), (15, 21, 160)];
/// Ragged GEMM shapes `(m, n, k)` checked against the interpreter.
const GEMM_SHAPES: [(usize, usize, usize); 4] =
    [(17, 33, 96), (64, 64, 576), (100, 75, 160), (130, 200, 608)];

/// `k` rounded up to whole rows of `format` (the K-quants' super-blocks of
/// 256), so the ragged shapes fit every format.
fn whole_k(format: QuantFormat, k: usize) -> usize {
    k.next_multiple_of(format.row_multiple())
}

/// The ragged shapes of a kernel against the interpreter, f32 and bf16,
/// with and without SiLU.
fn ragged<D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    name: &str,
    path: Path,
    format: QuantFormat,
) -> Result<Vec<CheckRow>> {
    let mut rows = Vec::new();
    let shapes: &[(usize, usize, usize)] = if path == Path::Gemv { &GEMV_SHAPES } else { &GEMM_SHAPES };
    for &(m, n, k) in shapes {
        let k = whole_k(format, k);
        for silu in [false, true] {
            let l = Launch::default_for(path, format, silu, m, n, k, false);
            rows.push(case::<f32, _>(dev, rng, name, l, (m, n, k), Oracle::Interpreter, "")?);
            rows.push(case::<bf16, _>(dev, rng, name, l, (m, n, k), Oracle::Interpreter, "")?);
        }
    }
    Ok(rows)
}

/// The checks of one kernel (`name`): ragged shapes in f32 and bf16 with
/// and without SiLU, every autotune config (on a ragged shape and, for the
/// GEMV, at K = 4096), model shapes, bench shapes; `also` are formats whose
/// ragged shapes run too (formats that share this one's weight formation).
fn checks<D: Device>(
    dev: &mut D,
    seed: u64,
    name: &str,
    path: Path,
    (format, also): (QuantFormat, &[QuantFormat]),
) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let mut rows = ragged(dev, &mut rng, name, path, format)?;
    for &f in also {
        rows.extend(ragged(dev, &mut rng, &format!("{name} ({})", f.name()), path, f)?);
    }
    let interp = Oracle::Interpreter;
    // Every declared autotune config on one ragged shape.
    let (m, n, k) = if path == Path::Gemv { (3, 45, 608) } else { (70, 90, 608) };
    let k = whole_k(format, k);
    for silu in [false, true] {
        for l in tuned_launches(Launch::default_for(path, format, silu, m, n, k, false)) {
            rows.push(case::<bf16, _>(dev, &mut rng, name, l, (m, n, k), interp, " (autotune config)")?);
        }
    }
    // Every GEMV autotune config at K = 4096, where every K tile size up to
    // 4096 runs whole tiles through the software-pipelined main loop.
    if path == Path::Gemv {
        for l in tuned_launches(Launch::default_for(path, format, false, 2, 40, 4096, false)) {
            rows.push(case::<bf16, _>(
                dev,
                &mut rng,
                name,
                l,
                (2, 40, 4096),
                interp,
                " (autotune config, K 4096)",
            )?);
        }
    }
    // SmolLM2 shapes: the gate/up projection (fused and not; the
    // K-quants: the down projection, the matrix llama.cpp's K-quant files
    // store in them) and, for Q8_0, the LM head.
    let smol_m = if path == Path::Gemv { 1 } else { 33 };
    let (smol_n, smol_k) = if format.is_k_quant() { (576, 1536) } else { (1536, 576) };
    for silu in [false, true] {
        let l = Launch::default_for(path, format, silu, smol_m, smol_n, smol_k, false);
        let shape = (smol_m, smol_n, smol_k);
        rows.push(case::<bf16, _>(dev, &mut rng, name, l, shape, interp, " (SmolLM2)")?);
    }
    if format == QuantFormat::Q8_0 {
        let l = Launch::default_for(path, format, false, smol_m, 49152, 576, false);
        let oracle = Oracle::Reference(193);
        rows.push(case::<bf16, _>(dev, &mut rng, name, l, (smol_m, 49152, 576), oracle, " (LM head)")?);
    }
    // The bench shapes, against the reference on a column subset.
    let mns: &[(usize, usize)] = if path == Path::Gemv {
        &[(1, 14336), (16, 14336)]
    } else {
        &[(64, 14336), (256, 14336), (256, 4096)]
    };
    for &(m, n) in mns {
        for silu in [false, true] {
            // The runtime's launch for bf16 on this device (swapped on
            // sm_90a, stream-K where it leaves SMs idle).
            let sms = dev.sm_count();
            let l = Launch::runtime_for(path, format, silu, (m, n, 4096), dev.wgmma(), sms);
            let oracle = Oracle::Reference(if m == 1 { 257 } else { 31 });
            rows.push(case::<bf16, _>(dev, &mut rng, name, l, (m, n, 4096), oracle, " (bench)")?);
        }
    }
    if path == Path::Gemm {
        rows.extend(stream_k_checks(dev, &mut rng, name, format)?);
    }
    Ok(rows)
}

/// The stream-K GEMM against the interpreter: every declared config on one
/// output tile (every piece a partial sum of the same tile) and on six
/// tiles, on grids from one program per tile to more programs than K
/// iterations (some ranges empty), bf16, with and without SiLU.
fn stream_k_checks<D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    name: &str,
    format: QuantFormat,
) -> Result<Vec<CheckRow>> {
    let mut rows = Vec::new();
    let base = gemm_stream_k::Config::new(DType::BF16, format, false, 256, 128, 64);
    for c in gemm_stream_k::autotune_configs(&base) {
        for (m, n, k) in [(70usize, 90usize, 640usize), (300, 150, 1024)] {
            for silu in [false, true] {
                let wrows = if silu { 2 * n } else { n };
                let tiles = m.div_ceil(c.BLOCK_M) * wrows.div_ceil(c.BLOCK_N);
                let iterations = tiles * k / c.BLOCK_K;
                for g in [tiles, tiles + 1, 2 * tiles + 1, iterations + 2] {
                    let l = Launch {
                        path: Path::Gemm,
                        format,
                        silu,
                        tiles: (c.BLOCK_M, c.BLOCK_N, c.BLOCK_K),
                        warps: c.num_warps,
                        swap: true,
                        stages: c.num_stages,
                        stream_k: Some(g as u32),
                    };
                    rows.push(case::<bf16, _>(dev, rng, name, l, (m, n, k), Oracle::Interpreter, "")?);
                }
            }
        }
    }
    Ok(rows)
}

/// The registered checks of the GEMV and GEMM paths, one a format: each is
/// [`checks`] under its own name.
macro_rules! format_checks {
    ($($(#[$doc:meta])* $name:ident: $path:ident, $format:ident $(+ $also:ident)*;)*) => {
        $(
            $(#[$doc])*
            pub fn $name<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
                let formats = (QuantFormat::$format, &[$(QuantFormat::$also),*][..]);
                checks(dev, seed, stringify!($name), Path::$path, formats)
            }
        )*
    };
}

format_checks! {
    /// The `gemv_q4_1` check (Q4_1 GEMV, plain and SiLU-fused).
    gemv_q4_1: Gemv, Q4_1;
    /// The `gemv_q4_0` check (Q4_0 GEMV, plain and SiLU-fused).
    gemv_q4_0: Gemv, Q4_0;
    /// The `gemv_q8_0` check (Q8_0 GEMV, plain and SiLU-fused, and the LM head).
    gemv_q8_0: Gemv, Q8_0;
    /// The `gemv_q4_k` check (Q4_K GEMV, plain and SiLU-fused).
    gemv_q4_k: Gemv, Q4_K;
    /// The `gemv_q6_k` check (Q6_K GEMV, plain and SiLU-fused; the ragged
    /// shapes also in Q5_K and Q5_1, the unsigned byte formats).
    gemv_q6_k: Gemv, Q6_K + Q5_K + Q5_1;
    /// The `gemm_q4_1` check (Q4_1 GEMM, plain and SiLU-fused).
    gemm_q4_1: Gemm, Q4_1;
    /// The `gemm_q4_0` check (Q4_0 GEMM, plain and SiLU-fused).
    gemm_q4_0: Gemm, Q4_0;
    /// The `gemm_q8_0` check (Q8_0 GEMM, plain and SiLU-fused, and the LM head).
    gemm_q8_0: Gemm, Q8_0;
}

pub(crate) mod fused;

#[cfg(test)]
mod tests;
