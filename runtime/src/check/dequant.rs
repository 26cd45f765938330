//! The GPU checks of the dequant GEMV/GEMM kernels (`kernels::dequant`),
//! one registry entry per kernel (`gemv_q4_1`, `gemv_q4_0`, `gemv_q8_0`,
//! `gemm_q4_1`, `gemm_q4_0`, `gemm_q8_0`), each covering the plain and the
//! fused SiLU-mul variant (`silu` in the shape column).
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
use crate::check::{CheckRow, Rng};
use crate::cuda::DeviceElem;
use crate::error::{Error, Result};
use crate::model::ActElem;
use crate::model::Device;
use dsl_core::DType;
use dsl_core::half::{bf16, f16};
use dsl_core::interp::Cpu;
use kernels::dequant::stream_k::gemm_stream_k;
use kernels::dequant::{
    GemvTiles, QuantFormat, Repacked, gemm_grid, gemm_tiles, gemv_grid, gemv_tiles, interleave_gate_up,
    repack, stream_k,
};
use kernels::reference::quant as r;
use std::marker::PhantomData;

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
                let $cfg = $kk::Config::new($dt, $launch.format, $launch.silu, a, b, c)
                    .with_warps($launch.warps)
                    .with_stages($launch.stages);
                $body
            }
            Path::Gemm => {
                use kernels::dequant::gemm::gemm as $kk;
                let $cfg = $kk::Config::new($dt, $launch.format, $launch.silu, a, b, c, $launch.swap)
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
            let cfg = kk::Config::new(DType::BF16, base.format, base.silu, a, b, c);
            kk::autotune_configs(&cfg)
                .into_iter()
                .map(|t| with((t.M_BLOCK, t.BLOCK_N, t.BLOCK_K), t.num_warps, false, t.num_stages))
                .collect()
        }
        Path::Gemm => {
            use kernels::dequant::gemm::gemm as kk;
            let cfg = kk::Config::new(DType::BF16, base.format, base.silu, a, b, c, false);
            kk::autotune_configs(&cfg)
                .into_iter()
                .map(|t| with((t.BLOCK_M, t.BLOCK_N, t.BLOCK_K), t.num_warps, t.SWAP, t.num_stages))
                .collect()
        }
    }
}

/// Random GGUF bytes of a weight `[n, k]` in `format`.
pub(crate) fn gguf_weight(rng: &mut Rng, format: QuantFormat, n: usize, k: usize) -> Vec<u8> {
    let blocks = n * k / 32;
    let mut out = Vec::with_capacity(blocks * format.block_bytes());
    let scale = |rng: &mut Rng, lo: i32, span: u64| {
        let v = (1.0 + rng.unit()) * 2f64.powi(lo + (rng.next_u64() % span) as i32);
        f16::from_f64(if rng.next_u64() & 1 == 0 { v } else { -v }).to_le_bytes()
    };
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

/// The rows `rows` of a GGUF weight with `k` columns, as their own weight.
fn gguf_rows(format: QuantFormat, raw: &[u8], k: usize, rows: &[usize]) -> Vec<u8> {
    let rb = k / 32 * format.block_bytes();
    rows.iter().flat_map(|&i| raw[i * rb..(i + 1) * rb].iter().copied()).collect()
}

/// The arguments and config of a stream-K `launch` on the pointers `(x,
/// quants, scales, out, workspace, flags)` (GPU or interpreter).
macro_rules! stream_k_launch {
    ($launch:expr, $t:ty, ($x:expr, $q:expr, $s:expr, $o:expr, $ws:expr, $fl:expr), $m:expr, $n:expr, $k:expr) => {{
        let (a, b, c) = $launch.tiles;
        let f = $launch.format;
        let args = gemm_stream_k::Args {
            x_ptr: $x,
            q_ptr: $q,
            s_ptr: $s,
            out_ptr: $o,
            ws_ptr: $ws,
            flag_ptr: $fl,
            m: $m as i32,
            n: $n as i32,
            k: $k as i32,
            _marker: PhantomData,
        };
        let config = gemm_stream_k::Config::new(<$t>::DEVICE_DTYPE, f, $launch.silu, a, b, c)
            .with_warps($launch.warps)
            .with_stages($launch.stages);
        (args, config)
    }};
}

/// Fails unless the stream-K flags are all zero again after a launch.
fn flags_zero(flags: &[i32]) -> Result<()> {
    match flags.iter().position(|&v| v != 0) {
        None => Ok(()),
        Some(i) => Err(Error::Usage(format!("stream-K flag {i} left at {} after the launch", flags[i]))),
    }
}

/// Runs `launch` on the device (the GPU or the native CPU backend): `out[m, n]` as f64.
pub(crate) fn run_gpu<T: DeviceElem, D: Device>(
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
        let (a, b, _) = launch.tiles;
        let ws = dev.upload(&vec![f32::NAN; g as usize * a * b])?;
        let flags = dev.zeros::<i32>(g as usize)?;
        let (args, config) = stream_k_launch!(
            launch,
            T,
            (dev.ptr(&xd)?, dev.ptr(&qd)?, dev.ptr(&sd)?, dev.ptr(&od)?, dev.ptr(&ws)?, dev.ptr(&flags)?),
            m,
            n,
            w.k
        );
        dev.run::<gemm_stream_k::Kernel>(launch.grid(m, n), &config, &args)?;
        flags_zero(&dev.download(&flags)?)?;
        return Ok(dev.download(&od)?.iter().map(|v| v.to_f64()).collect());
    }
    with_kernel!(launch, T::DEVICE_DTYPE, kk, config => {
        let args = kk::Args {
            x_ptr: dev.ptr(&xd)?,
            q_ptr: dev.ptr(&qd)?,
            s_ptr: dev.ptr(&sd)?,
            out_ptr: dev.ptr(&od)?,
            m: m as i32,
            n: n as i32,
            k: w.k as i32,
            _marker: PhantomData,
        };
        dev.run::<kk::Kernel>(launch.grid(m, n), &config, &args)?;
    });
    Ok(dev.download(&od)?.iter().map(|v| v.to_f64()).collect())
}

/// Runs `launch` on the CPU interpreter: `out[m, n]` as f64.
fn run_cpu<T: DeviceElem>(launch: Launch, x: &[T], w: &Repacked, m: usize, n: usize) -> Result<Vec<f64>> {
    let mut cpu = Cpu::new();
    let (xc, qc, sc) = (cpu.upload(x), cpu.upload(&w.quants), cpu.upload(&w.scales));
    let oc = cpu.zeros::<T>(m * n);
    if let Some(g) = launch.stream_k {
        let (a, b, _) = launch.tiles;
        let ws = cpu.upload(&vec![f32::NAN; g as usize * a * b]);
        let flags = cpu.zeros::<i32>(g as usize);
        let (args, config) = stream_k_launch!(
            launch,
            T,
            (xc.cast(), qc.cast(), sc.cast(), oc.cast(), ws.cast(), flags.cast()),
            m,
            n,
            w.k
        );
        gemm_stream_k::interpret(&mut cpu, launch.grid(m, n), &config, &args)?;
        flags_zero(&cpu.read(flags))?;
        return Ok(cpu.read(oc).iter().map(|v| v.to_f64()).collect());
    }
    with_kernel!(launch, T::DEVICE_DTYPE, kk, config => {
        let args = kk::Args {
            x_ptr: xc.cast(),
            q_ptr: qc.cast(),
            s_ptr: sc.cast(),
            out_ptr: oc.cast(),
            m: m as i32,
            n: n as i32,
            k: w.k as i32,
            _marker: PhantomData,
        };
        kk::interpret(&mut cpu, launch.grid(m, n), &config, &args)?;
    });
    Ok(cpu.read(oc).iter().map(|v| v.to_f64()).collect())
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

/// Folds `got` against `want` within `tol` into a check row.
pub(crate) fn account(
    kernel: &str,
    shape: String,
    dtype: DType,
    got: &[f64],
    want: &[f64],
    tol: &[f64],
) -> CheckRow {
    let mut row = CheckRow { kernel: kernel.into(), shape, dtype, max_abs: 0.0, max_rel: 0.0, pass: true };
    if got.len() != want.len() {
        row.pass = false;
        row.max_abs = f64::INFINITY;
        return row;
    }
    for ((&g, &w), &t) in got.iter().zip(want).zip(tol) {
        let d = (g - w).abs();
        let d = if d.is_nan() { f64::INFINITY } else { d };
        row.max_abs = row.max_abs.max(d);
        if w != 0.0 {
            row.max_rel = row.max_rel.max(d / w.abs());
        }
        if d > t {
            row.pass = false;
        }
    }
    row
}

/// How a case is judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Oracle {
    /// Against the interpreter, every output.
    Interpreter,
    /// Against the f64 reference, on about `n` evenly spread output columns
    /// (all rows of `M`).
    Reference(usize),
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
    let xf: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
    let f = launch.format;
    let g_raw = gguf_weight(rng, f, n, k);
    let u_raw = if launch.silu { Some(gguf_weight(rng, f, n, k)) } else { None };
    let w = match &u_raw {
        Some(u) => interleave_gate_up(&repacked(f, &g_raw, n, k)?, &repacked(f, u, n, k)?)
            .map_err(|e| Error::Usage(e.to_string()))?,
        None => repacked(f, &g_raw, n, k)?,
    };
    let got = run_gpu::<T, _>(dev, launch, &x, &w, m, n)?;
    let silu = if launch.silu { ", silu" } else { "" };
    let mut shape = format!("M{m} K{k} N{n}{silu}, {}{note}", launch.describe());
    let raws = (g_raw.as_slice(), u_raw.as_deref());
    let row = match oracle {
        Oracle::Interpreter => {
            let cols: Vec<usize> = (0..n).collect();
            let e = expected(launch, dtype, &xf, raws, m, k, &cols);
            let want = run_cpu::<T>(launch, &x, &w, m, n)?;
            let tol: Vec<f64> = e.tol.iter().map(|t| 2.0 * t).collect();
            let mut row = account(name, shape.clone(), dtype, &got, &want, &tol);
            // Both sides must also be within the bound of the exact value.
            let exact = account(name, shape, dtype, &want, &e.want, &e.tol);
            row.pass &= exact.pass;
            row
        }
        Oracle::Reference(count) => {
            let step = (n / count.max(1)).max(1);
            let mut cols: Vec<usize> = (0..n).step_by(step).collect();
            if cols.last() != Some(&(n - 1)) {
                cols.push(n - 1);
            }
            shape.push_str(&format!(", f64 reference on {} columns", cols.len()));
            let e = expected(launch, dtype, &xf, raws, m, k, &cols);
            let picked: Vec<f64> =
                (0..m).flat_map(|i| cols.iter().map(move |&j| (i, j))).map(|(i, j)| got[i * n + j]).collect();
            account(name, shape, dtype, &picked, &e.want, &e.tol)
        }
    };
    Ok(row)
}

/// Ragged GEMV shapes `(m, n, k)` checked against the interpreter.
pub(crate) const GEMV_SHAPES: [(usize, usize, usize); 5] =
    [(1, 1, 32), (3, 37, 96), (5, 130, 608), (7, 64, 1024), (15, 21, 160)];
/// Ragged GEMM shapes `(m, n, k)` checked against the interpreter.
const GEMM_SHAPES: [(usize, usize, usize); 4] =
    [(17, 33, 96), (64, 64, 576), (100, 75, 160), (130, 200, 608)];

/// The checks of one kernel (`name`): ragged shapes in f32 and bf16 with
/// and without SiLU, every autotune config (on a ragged shape and, for the
/// GEMV, at K = 4096), model shapes, bench shapes.
fn checks<D: Device>(
    dev: &mut D,
    seed: u64,
    name: &str,
    path: Path,
    format: QuantFormat,
) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let mut rows = Vec::new();
    let shapes: &[(usize, usize, usize)] = if path == Path::Gemv { &GEMV_SHAPES } else { &GEMM_SHAPES };
    let interp = Oracle::Interpreter;
    for &(m, n, k) in shapes {
        for silu in [false, true] {
            let l = Launch::default_for(path, format, silu, m, n, k, false);
            rows.push(case::<f32, _>(dev, &mut rng, name, l, (m, n, k), interp, "")?);
            rows.push(case::<bf16, _>(dev, &mut rng, name, l, (m, n, k), interp, "")?);
        }
    }
    // Every declared autotune config on one ragged shape.
    let (m, n, k) = if path == Path::Gemv { (3, 45, 608) } else { (70, 90, 608) };
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
    // SmolLM2 shapes: the gate/up projection (fused and not) and, for Q8_0,
    // the LM head.
    let smol_m = if path == Path::Gemv { 1 } else { 33 };
    for silu in [false, true] {
        let l = Launch::default_for(path, format, silu, smol_m, 1536, 576, false);
        rows.push(case::<bf16, _>(dev, &mut rng, name, l, (smol_m, 1536, 576), interp, " (SmolLM2)")?);
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

/// The `gemv_q4_1` check (Q4_1 GEMV, plain and SiLU-fused).
pub fn gemv_q4_1<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    checks(dev, seed, "gemv_q4_1", Path::Gemv, QuantFormat::Q4_1)
}

/// The `gemv_q4_0` check (Q4_0 GEMV, plain and SiLU-fused).
pub fn gemv_q4_0<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    checks(dev, seed, "gemv_q4_0", Path::Gemv, QuantFormat::Q4_0)
}

/// The `gemv_q8_0` check (Q8_0 GEMV, plain and SiLU-fused, and the LM head).
pub fn gemv_q8_0<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    checks(dev, seed, "gemv_q8_0", Path::Gemv, QuantFormat::Q8_0)
}

/// The `gemm_q4_1` check (Q4_1 GEMM, plain and SiLU-fused).
pub fn gemm_q4_1<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    checks(dev, seed, "gemm_q4_1", Path::Gemm, QuantFormat::Q4_1)
}

/// The `gemm_q4_0` check (Q4_0 GEMM, plain and SiLU-fused).
pub fn gemm_q4_0<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    checks(dev, seed, "gemm_q4_0", Path::Gemm, QuantFormat::Q4_0)
}

/// The `gemm_q8_0` check (Q8_0 GEMM, plain and SiLU-fused, and the LM head).
pub fn gemm_q8_0<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    checks(dev, seed, "gemm_q8_0", Path::Gemm, QuantFormat::Q8_0)
}

/// Which fusion of `kernels::dequant::fused` a fused check runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fuse {
    /// The RMSNorm prologue.
    Norm,
    /// The residual-add epilogue.
    Residual,
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

/// Runs a fused GEMV (`launch` is a GEMV launch) on the device (`dev`) or
/// the interpreter (`None`): `out[m, n]` as f64.
pub(crate) fn run_fused<T: DeviceElem, D: Device>(
    dev: Option<&mut D>,
    launch: Launch,
    fuse: Fuse,
    inp: &FusedInputs<'_, T>,
    m: usize,
    n: usize,
) -> Result<Vec<f64>> {
    let (a, b, c) = launch.tiles;
    let (norm, residual) = (fuse == Fuse::Norm, fuse == Fuse::Residual);
    let grid = launch.grid(m, n);
    let k = inp.w.k as i32;
    use kernels::dequant::fused::gemv_fused as kk;
    let config = kk::Config::new(T::DEVICE_DTYPE, launch.format, launch.silu, norm, residual, a, b, c)
        .with_warps(launch.warps);
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

/// One fused check: random inputs in `T`, the GPU against the interpreter
/// (within twice the bound, and the interpreter within it of the f64
/// reference) or, with `Oracle::Reference`, against the reference on a
/// subset of columns.
fn fused_case<T: ActElem, D: Device>(
    dev: &mut D,
    rng: &mut Rng,
    (format, silu, fuse): (QuantFormat, bool, Fuse),
    (m, n, k): (usize, usize, usize),
    oracle: Oracle,
    note: &str,
) -> Result<CheckRow> {
    let dtype = T::DEVICE_DTYPE;
    let launch = Launch::default_for(Path::Gemv, format, silu, m, n, k, false);
    let x = rng.values::<T>(m * k, 2.0);
    let nw = rng.values::<T>(k, 2.0);
    let out0 = rng.values::<T>(m * n, 2.0);
    let g_raw = gguf_weight(rng, format, n, k);
    let u_raw = if silu { Some(gguf_weight(rng, format, n, k)) } else { None };
    let w = match &u_raw {
        Some(u) => interleave_gate_up(&repacked(format, &g_raw, n, k)?, &repacked(format, u, n, k)?)
            .map_err(|e| Error::Usage(e.to_string()))?,
        None => repacked(format, &g_raw, n, k)?,
    };
    let inp = FusedInputs { x: &x, nw: &nw, out0: &out0, w: &w };
    let got = run_fused::<T, _>(Some(dev), launch, fuse, &inp, m, n)?;
    let f64s = |v: &[T]| v.iter().map(|e| e.to_f64()).collect::<Vec<f64>>();
    let (xf, nf, of) = (f64s(&x), f64s(&nw), f64s(&out0));
    let ins = (xf.as_slice(), nf.as_slice(), of.as_slice());
    let raws = (g_raw.as_slice(), u_raw.as_deref());
    let silu_s = if silu { ", silu" } else { "" };
    let mut shape = format!("{format:?} {fuse:?} M{m} K{k} N{n}{silu_s}, {}{note}", launch.describe());
    let name = "gemv_fused";
    match oracle {
        Oracle::Interpreter => {
            let cols: Vec<usize> = (0..n).collect();
            let e = fused_expected(launch, fuse, dtype, ins, raws, (m, n, k), &cols);
            let want = run_fused::<T, D>(None, launch, fuse, &inp, m, n)?;
            let tol: Vec<f64> = e.tol.iter().map(|t| 2.0 * t).collect();
            let mut row = account(name, shape.clone(), dtype, &got, &want, &tol);
            row.pass &= account(name, shape, dtype, &want, &e.want, &e.tol).pass;
            Ok(row)
        }
        Oracle::Reference(count) => {
            let step = (n / count.max(1)).max(1);
            let mut cols: Vec<usize> = (0..n).step_by(step).collect();
            if cols.last() != Some(&(n - 1)) {
                cols.push(n - 1);
            }
            shape.push_str(&format!(", f64 reference on {} columns", cols.len()));
            let e = fused_expected(launch, fuse, dtype, ins, raws, (m, n, k), &cols);
            let picked: Vec<f64> =
                (0..m).flat_map(|i| cols.iter().map(move |&j| (i, j))).map(|(i, j)| got[i * n + j]).collect();
            Ok(account(name, shape, dtype, &picked, &e.want, &e.tol))
        }
    }
}

/// The `gemv_fused` check (`kernels::dequant::fused`): the RMSNorm prologue
/// (with and without SiLU-mul) and the residual epilogue, every format, on
/// ragged shapes against the interpreter in f32 and bf16, the SmolLM2 decode
/// projections (QKV N 960, gate/up, O, down) and the Q8_0 LM head against the
/// reference.
pub fn gemv_fused<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let mut rows = Vec::new();
    let interp = Oracle::Interpreter;
    let variants = [(false, Fuse::Norm), (true, Fuse::Norm), (false, Fuse::Residual)];
    for format in [QuantFormat::Q4_1, QuantFormat::Q4_0, QuantFormat::Q8_0] {
        for &(m, n, k) in &GEMV_SHAPES {
            for (silu, fuse) in variants {
                let v = (format, silu, fuse);
                rows.push(fused_case::<f32, _>(dev, &mut rng, v, (m, n, k), interp, "")?);
                rows.push(fused_case::<bf16, _>(dev, &mut rng, v, (m, n, k), interp, "")?);
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
            let v = (QuantFormat::Q4_1, silu, fuse);
            rows.push(fused_case::<f32, _>(dev, &mut rng, v, (m, n, k), interp, note)?);
            rows.push(fused_case::<bf16, _>(dev, &mut rng, v, (m, n, k), interp, note)?);
        }
    }
    let lm = (QuantFormat::Q8_0, false, Fuse::Norm);
    for dt_bf16 in [false, true] {
        let (shape, oracle, note) = ((1, 49152, 576), Oracle::Reference(193), " (LM head + final norm)");
        rows.push(if dt_bf16 {
            fused_case::<bf16, _>(dev, &mut rng, lm, shape, oracle, note)?
        } else {
            fused_case::<f32, _>(dev, &mut rng, lm, shape, oracle, note)?
        });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The GPU check's stream-K path on the interpreter: the launch the
    /// runtime picks at M 256 x N 4096 is stream-K on an H100's 132 SMs
    /// (and not at N 14336, without `wgmma`, at 64 rows, short K or with
    /// more than half the SMs busy), and the
    /// check's stream-K runner (workspace of NaNs, flags zero after) agrees
    /// with the exact product on a ragged six-tile case.
    #[test]
    fn stream_k_launches() {
        let q41 = QuantFormat::Q4_1;
        let sk = Launch::runtime_for(Path::Gemm, q41, false, (256, 4096, 4096), true, 132);
        assert_eq!((sk.stream_k, sk.tiles, sk.swap), (Some(132), (256, 128, 64), true));
        assert_eq!(sk.grid(256, 4096), [132, 1, 1]);
        // SiLU doubles the weight rows: 64 tiles still leave half of 132 SMs idle.
        let silu = Launch::runtime_for(Path::Gemm, q41, true, (256, 4096, 4096), true, 132);
        assert_eq!(silu.stream_k, Some(132));
        for (m, n, k, swap_ok, sms, why) in [
            (256, 14336, 4096, true, 132, "112 tiles: the tiled grid wins"),
            (256, 4096, 4096, false, 132, "no wgmma"),
            (64, 4096, 4096, true, 132, "64 rows in a 256-row tile"),
            (256, 4096, 1024, true, 132, "short K"),
            (256, 4096, 4096, true, 63, "more than half the SMs busy"),
        ] {
            let l = Launch::runtime_for(Path::Gemm, q41, false, (m, n, k), swap_ok, sms);
            assert_eq!(l.stream_k, None, "{why}");
        }
        assert!(stream_k(QuantFormat::Q8_0, 256, 4096, 4096, true, 132).is_none(), "Q8_0 is never swapped");
        let mut rng = Rng::new(5);
        let (m, n, k) = (300, 150, 1024);
        let x = rng.values::<bf16>(m * k, 2.0);
        let xf: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
        let raw = gguf_weight(&mut rng, QuantFormat::Q4_1, n, k);
        let w = repacked(QuantFormat::Q4_1, &raw, n, k).unwrap();
        let l = Launch {
            path: Path::Gemm,
            format: QuantFormat::Q4_1,
            silu: false,
            tiles: (256, 128, 64),
            warps: 8,
            swap: true,
            stages: 3,
            stream_k: Some(9),
        };
        let got = run_cpu::<bf16>(l, &x, &w, m, n).unwrap();
        let cols: Vec<usize> = (0..n).collect();
        let e = expected(l, DType::BF16, &xf, (&raw, None), m, k, &cols);
        assert!(account("sk", String::new(), DType::BF16, &got, &e.want, &e.tol).pass);
    }

    /// The declared autotune configs are valid SiLU launches (even
    /// `BLOCK_N`, power-of-two `BLOCK_K >= 32`) whose grid covers the
    /// output, and the untuned GEMV grid is one program row per column tile.
    #[test]
    fn launches_are_consistent() {
        for format in [QuantFormat::Q4_0, QuantFormat::Q4_1, QuantFormat::Q8_0] {
            for path in [Path::Gemv, Path::Gemm] {
                let base = Launch::default_for(path, format, true, 3, 45, 608, false);
                let tuned = tuned_launches(base);
                assert!(tuned.len() >= 4, "{format:?} {path:?}");
                for l in tuned {
                    let (a, bn, bk) = l.tiles;
                    assert!(bn % 2 == 0 && bk.is_power_of_two() && bk >= 32, "{l:?}");
                    let g = l.grid(3, 45);
                    let (rows, ms) = if path == Path::Gemv { (g[0], g[1]) } else { (g[1], g[0]) };
                    assert!(rows as usize * bn >= 90 && ms as usize * a >= 3, "{l:?}: {g:?}");
                }
            }
        }
        let g = Launch::default_for(Path::Gemv, QuantFormat::Q4_1, false, 1, 14336, 4096, false);
        assert_eq!(g.grid(1, 14336), [14336 / g.tiles.1 as u32, 1, 1]);
    }

    /// Every untuned GEMM tile choice the runtime can make (any batch the
    /// GEMV does not take, prefill chunks, SmolLM2's and the bench's
    /// weights) and every declared config fits whole `mma.sync`
    /// instructions, so the GEMM's dots run on tensor cores.
    #[test]
    fn gemm_tiles_fit_tensor_cores() {
        use codegen::fragment::MmaLayout;
        for format in [QuantFormat::Q4_0, QuantFormat::Q4_1, QuantFormat::Q8_0] {
            let width = |bk: usize| if format == QuantFormat::Q8_0 { bk } else { bk / 2 };
            let fits = |(bm, bn, bk): (usize, usize, usize), warps: u32| {
                MmaLayout::choose(bm, bn, width(bk), warps as usize).is_some()
            };
            for m in (1..=300).chain([512, 2048, 8192]) {
                for rows in [576, 960, 1152, 3072, 4096, 14336, 28672, 49152] {
                    for (swap_ok, k) in [(false, 576), (true, 576), (true, 4096)] {
                        let t = gemm_tiles(format, m, rows, k, swap_ok);
                        // The swapped product is `[BLOCK_N, BLOCK_K] x [BLOCK_K, BLOCK_M]`.
                        let tiles = if t.swap {
                            (t.block_n, t.block_m, t.block_k)
                        } else {
                            (t.block_m, t.block_n, t.block_k)
                        };
                        assert!(fits(tiles, t.num_warps), "{format:?} m {m} rows {rows}: {t:?}");
                        assert!(!t.swap || (swap_ok && format != QuantFormat::Q8_0), "{t:?}");
                    }
                }
            }
            // The bench shape swaps on sm_90a (Q4), SmolLM2's K never does.
            let q4 = format != QuantFormat::Q8_0;
            assert_eq!(gemm_tiles(format, 256, 14336, 4096, true).swap, q4);
            assert!(!gemm_tiles(format, 256, 14336, 4096, false).swap);
            assert!(!gemm_tiles(format, 8192, 3072, 576, true).swap);
            // Smaller products with enough 64 x 64 programs swap on that tile.
            let t = gemm_tiles(format, 64, 14336, 4096, true);
            assert_eq!(t.swap, q4);
            if q4 {
                assert_eq!((t.block_m, t.block_n, t.num_stages), (64, 64, 4));
            }
            assert!(!gemm_tiles(format, 64, 4096, 4096, true).swap);
            for l in tuned_launches(Launch::default_for(Path::Gemm, format, false, 70, 90, 608, false)) {
                let (a, b, c) = l.tiles;
                assert!(fits(if l.swap { (b, a, c) } else { l.tiles }, l.warps), "{l:?}");
            }
        }
    }

    /// The fused check's interpreter path and expectations agree on every
    /// variant (the judgement the GPU rows use), and a skipped fusion fails it.
    #[test]
    fn fused_interpreter_matches_reference() {
        let mut rng = Rng::new(2);
        let (m, n, k) = (3, 10, 96);
        for format in [QuantFormat::Q4_0, QuantFormat::Q4_1, QuantFormat::Q8_0] {
            for (silu, fuse) in [(false, Fuse::Norm), (true, Fuse::Norm), (false, Fuse::Residual)] {
                let l = Launch::default_for(Path::Gemv, format, silu, m, n, k, false);
                let (x, nw, out0) =
                    (rng.values::<f32>(m * k, 2.0), rng.values::<f32>(k, 2.0), rng.values::<f32>(m * n, 2.0));
                let g = gguf_weight(&mut rng, format, n, k);
                let u = silu.then(|| gguf_weight(&mut rng, format, n, k));
                let w = match &u {
                    Some(u) => interleave_gate_up(
                        &repack(format, &g, n, k).unwrap(),
                        &repack(format, u, n, k).unwrap(),
                    )
                    .unwrap(),
                    None => repack(format, &g, n, k).unwrap(),
                };
                let inp = FusedInputs { x: &x, nw: &nw, out0: &out0, w: &w };
                let got = run_fused::<f32, Cpu>(None, l, fuse, &inp, m, n).unwrap();
                let f64s = |v: &[f32]| v.iter().map(|&e| f64::from(e)).collect::<Vec<f64>>();
                let (xf, nf, of) = (f64s(&x), f64s(&nw), f64s(&out0));
                let cols: Vec<usize> = (0..n).collect();
                let ins = (xf.as_slice(), nf.as_slice(), of.as_slice());
                let e = fused_expected(l, fuse, DType::F32, ins, (&g, u.as_deref()), (m, n, k), &cols);
                assert!(
                    account("t", String::new(), DType::F32, &got, &e.want, &e.tol).pass,
                    "{format:?} {fuse:?}"
                );
                // The other fusion's expectation must not pass.
                let other = if fuse == Fuse::Norm { Fuse::Residual } else { Fuse::Norm };
                let e = fused_expected(l, other, DType::F32, ins, (&g, u.as_deref()), (m, n, k), &cols);
                assert!(
                    !account("t", String::new(), DType::F32, &got, &e.want, &e.tol).pass,
                    "{format:?} {fuse:?}"
                );
            }
        }
    }

    /// The interpreter path of a case runs without a GPU and matches the
    /// reference (the same judgement the GPU rows use).
    #[test]
    fn interpreter_matches_reference() {
        let mut rng = Rng::new(1);
        for format in [QuantFormat::Q4_0, QuantFormat::Q4_1, QuantFormat::Q8_0] {
            let (m, n, k) = (3, 10, 96);
            let l = Launch::default_for(Path::Gemv, format, true, m, n, k, false);
            let x = rng.values::<f32>(m * k, 2.0);
            let xf: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
            let (g, u) = (gguf_weight(&mut rng, format, n, k), gguf_weight(&mut rng, format, n, k));
            let w =
                interleave_gate_up(&repack(format, &g, n, k).unwrap(), &repack(format, &u, n, k).unwrap())
                    .unwrap();
            let got = run_cpu::<f32>(l, &x, &w, m, n).unwrap();
            let cols: Vec<usize> = (0..n).collect();
            let e = expected(l, DType::F32, &xf, (&g, Some(&u)), m, k, &cols);
            assert!(account("t", String::new(), DType::F32, &got, &e.want, &e.tol).pass, "{format:?}");
        }
    }
}
