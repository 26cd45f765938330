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

use crate::check::dequant::fused::{Fuse, FusedKernels, LM_HEAD, SMOL_PROJECTIONS, VARIANTS, fused_case};
use crate::check::dequant::{GEMV_SHAPES, Launch, Oracle, Path};
use crate::check::{CheckRow, Rng};
use crate::error::Result;
use crate::model::Device;
use dsl_core::half::bf16;
use kernels::cpu_gemv::cpu_gemv_tiles;
use kernels::dequant::{QuantFormat, m_block_for};

/// The native backend's tiles for a case.
fn native_tiles(format: QuantFormat, silu: bool, m: usize, n: usize, k: usize) -> (usize, usize, usize) {
    let t = cpu_gemv_tiles(format, m, if silu { 2 * n } else { n }, k);
    (t.m_block, t.block_n, t.block_k)
}

/// A GEMV launch of `format` with `tiles` (whose accumulation bound is the
/// CPU kernels': elementwise f32 FMAs per K tile, one sum at the end).
fn launch(
    format: QuantFormat,
    silu: bool,
    (m, n, k): (usize, usize, usize),
    tiles: (usize, usize, usize),
) -> Launch {
    Launch { tiles, ..Launch::default_for(Path::Gemv, format, silu, m, n, k, false) }
}

/// The `cpu_gemv` check (see the module doc).
pub fn cpu_gemv<D: Device>(dev: &mut D, seed: u64) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let mut rows = Vec::new();
    let (kernels, interp) = (FusedKernels::Cpu, Oracle::Interpreter);
    for format in [QuantFormat::Q4_1, QuantFormat::Q4_0, QuantFormat::Q8_0] {
        for &(m, n, k) in &GEMV_SHAPES {
            for (silu, fuse) in VARIANTS {
                let native = launch(format, silu, (m, n, k), native_tiles(format, silu, m, n, k));
                let v = (kernels, native, fuse);
                rows.push(fused_case::<f32, _>(dev, &mut rng, v, (m, n, k), interp, "")?);
                rows.push(fused_case::<bf16, _>(dev, &mut rng, v, (m, n, k), interp, "")?);
                // 128-wide K tiles: a partial last step (or only one).
                let v = (kernels, launch(format, silu, (m, n, k), (m_block_for(m), 4, 128)), fuse);
                rows.push(fused_case::<f32, _>(dev, &mut rng, v, (m, n, k), interp, "")?);
            }
        }
    }
    for (silu, fuse, n, k, note) in SMOL_PROJECTIONS {
        for m in [1, 8] {
            let format = QuantFormat::Q4_1;
            let v = (kernels, launch(format, silu, (m, n, k), native_tiles(format, silu, m, n, k)), fuse);
            rows.push(fused_case::<f32, _>(dev, &mut rng, v, (m, n, k), interp, note)?);
            rows.push(fused_case::<bf16, _>(dev, &mut rng, v, (m, n, k), interp, note)?);
        }
    }
    let (format, ((m, n, k), note)) = (QuantFormat::Q8_0, LM_HEAD);
    let v = (kernels, launch(format, false, (m, n, k), native_tiles(format, false, m, n, k)), Fuse::Norm);
    rows.push(fused_case::<f32, _>(dev, &mut rng, v, (m, n, k), Oracle::Reference(193), note)?);
    rows.push(fused_case::<bf16, _>(dev, &mut rng, v, (m, n, k), Oracle::Reference(193), note)?);
    Ok(rows)
}
