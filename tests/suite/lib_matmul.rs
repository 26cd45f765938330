//! Kernel library: the dense f16/bf16 matmul (`kernels::matmul`) on the
//! interpreter against the f64 reference of `kernels::reference::matmul`.
//!
//! Random inputs in `[-2, 2)` rounded to the storage dtype; ragged shapes
//! (`M`, `N` not multiples of the tiles, `K` not a multiple of `BLOCK_K`,
//! so every masked edge runs, plus `K = 0`), row strides wider than the rows
//! (padding filled with large values, so a read past `K` or `N` fails), all
//! three tile configurations. The output starts filled with 100 and its
//! padding columns must stay 100. Tolerance per element:
//! `reference::matmul::error_bound` (f32 accumulation of exact products plus
//! one rounding to the output dtype); one wrong product is off by up to 4,
//! far outside it.

use crate::common::cases;
use dsl_core::half::{bf16, f16};
use dsl_core::interp::{Cpu, Element};
use kernels::matmul::{CONFIGS, TileConfig, grid, half_matmul};
use kernels::reference::matmul as r;
use proptest::prelude::*;
use std::marker::PhantomData;
use tests::reference::Rng;

/// Half-precision storage types.
trait Half: Element {
    /// Rounds an f64 to the storage type.
    fn from_f64(v: f64) -> Self;
    /// Unit roundoff.
    const U: f64;
}

impl Half for bf16 {
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
    const U: f64 = 1.0 / 256.0;
}

impl Half for f16 {
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
    const U: f64 = 1.0 / 2048.0;
}

/// Runs one `m x n x k` case with row padding `pad` on config `cfg`.
fn case<T: Half>(
    seed: u64,
    (m, n, k): (usize, usize, usize),
    pad: usize,
    cfg: TileConfig,
) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let (sa, sb, sc) = (k + pad, n + pad, n + pad);
    let mut fill = |rows: usize, cols: usize, stride: usize| -> Vec<T> {
        (0..rows * stride)
            .map(|i| {
                let v = if i % stride < cols { f64::from(rng.uniform(-2.0, 2.0)) } else { 1e4 };
                T::from_f64(v)
            })
            .collect()
    };
    let (a, b) = (fill(m, k, sa), fill(k, n, sb));
    let dense = |x: &[T], rows: usize, cols: usize, stride: usize| -> Vec<f64> {
        (0..rows).flat_map(|i| x[i * stride..i * stride + cols].iter().map(|v| v.to_f64())).collect()
    };
    let (a64, b64) = (dense(&a, m, k, sa), dense(&b, k, n, sb));
    let mut cpu = Cpu::new();
    let (ap, bp) = (cpu.upload(&a), cpu.upload(&b));
    let cp = cpu.upload(&vec![T::from_f64(100.0); m.max(1) * sc]);
    let args = half_matmul::Args {
        a_ptr: ap.cast(),
        b_ptr: bp.cast(),
        c_ptr: cp.cast(),
        m: m as i32,
        n: n as i32,
        k: k as i32,
        stride_am: sa as i32,
        stride_bk: sb as i32,
        stride_cm: sc as i32,
        _marker: PhantomData,
    };
    let config = cfg.config(T::DTYPE);
    half_matmul::interpret(&mut cpu, grid(m, n, &cfg), &config, &args).map_err(|e| e.to_string())?;
    let out = cpu.read(cp);
    let want = r::matmul(&a64, &b64, m, n, k);
    let mag = r::abs_products(&a64, &b64, m, n, k);
    for i in 0..m {
        for j in 0..sc {
            let got = out[i * sc + j].to_f64();
            if j >= n {
                if got != 100.0 {
                    return Err(format!("padding ({i}, {j}) written: {got}"));
                }
                continue;
            }
            let (w, tol) = (want[i * n + j], r::error_bound(want[i * n + j], mag[i * n + j], k, T::U));
            if (got - w).abs() > tol || got.is_nan() {
                return Err(format!("({i}, {j}) of {m}x{n}x{k}: got {got}, want {w} (tol {tol})"));
            }
        }
    }
    Ok(())
}

/// `(m, n, k)` of the ragged products: `M` and `N` from 1 to 149, `K` 0 or
/// 1 to 99.
fn ragged_shapes() -> impl Strategy<Value = (usize, usize, usize)> {
    (1usize..150, 1usize..150, prop_oneof![Just(0usize), 1usize..100])
}

proptest! {
    #![proptest_config(cases(24))]

    #[test]
    fn matmul_ragged(
        shape in ragged_shapes(),
        pad in 0usize..3,
        cfg in prop::sample::select(CONFIGS.to_vec()),
        bf in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let r = if bf { case::<bf16>(seed, shape, 8 * pad, cfg) } else { case::<f16>(seed, shape, 8 * pad, cfg) };
        r.map_err(TestCaseError::fail)?;
    }
}

/// The configurations that build distinct IR (warps and pipelining stages
/// change only the GPU code, not what the interpreter runs).
fn interpreted_configs() -> Vec<TileConfig> {
    let mut out: Vec<TileConfig> = Vec::new();
    for c in CONFIGS {
        let same = |o: &TileConfig| {
            (o.block_m, o.block_n, o.block_k, o.prefetch) == (c.block_m, c.block_n, c.block_k, c.prefetch)
        };
        if !out.iter().any(same) {
            out.push(c);
        }
    }
    out
}

/// Fixed corners: exact tiles, one row, one column, a K of exactly one step.
#[test]
fn corners() {
    for (i, &shape) in
        [(128, 128, 64), (1, 130, 32), (130, 1, 17), (64, 64, 32), (3, 5, 7)].iter().enumerate()
    {
        for cfg in interpreted_configs() {
            case::<bf16>(i as u64, shape, 0, cfg).unwrap();
        }
    }
}

/// A wrong product is caught: one input element off by 1 changes the output
/// by up to 2, beyond the tolerance.
#[test]
fn tolerance_catches_one_wrong_product() {
    let (m, n, k) = (4, 4, 64);
    let a = vec![1.0; m * k];
    let b = vec![0.5; k * n];
    let want = r::matmul(&a, &b, m, n, k);
    let mag = r::abs_products(&a, &b, m, n, k);
    let tol = r::error_bound(want[0], mag[0], k, bf16::U);
    assert!(tol < 0.5, "tolerance {tol} too loose");
}

/// Writes each program's `grouped_tile` to `out[2 pid]`, `out[2 pid + 1]`,
/// `pid` its index in launch order.
#[dsl_macros::kernel]
fn tile_order(out_ptr: Ptr<i32>, #[constexpr] BLOCK_M: usize) {
    let (pm, pn) = kernels::matmul::grouped_tile(BLOCK_M);
    let pid = program_id(1) * num_programs(0) + program_id(0);
    store(out_ptr + 2 * pid, pm);
    store(out_ptr + 2 * pid + 1, pn);
}

/// `grouped_tile` is a bijection from launch order onto the tiles of any
/// grid (rows of tiles a multiple of the group or not), and within a group
/// it walks a column of tiles before the next: groups of 32 rows of 64-row
/// tiles, 16 of 128-row ones, one group when the grid has fewer rows.
#[test]
fn grouped_tiles_cover_every_tile_once_in_group_order() {
    for (block_m, group) in [(64usize, 32usize), (128, 16), (256, 16), (16, 32)] {
        for (rows, cols) in [(1usize, 1usize), (3, 5), (40, 3), (33, 7), (64, 2), (17, 1)] {
            let mut cpu = Cpu::new();
            let out = cpu.zeros::<i32>(2 * rows * cols);
            let args = tile_order::Args { out_ptr: out, _marker: PhantomData };
            let config = tile_order::Config::new(block_m);
            tile_order::interpret(&mut cpu, [rows as u32, cols as u32, 1], &config, &args).unwrap();
            let got = cpu.read(out);
            let mut seen = vec![false; rows * cols];
            for pid in 0..rows * cols {
                let (pm, pn) = (got[2 * pid] as usize, got[2 * pid + 1] as usize);
                assert!(pm < rows && pn < cols, "{block_m} {rows}x{cols}: pid {pid} -> ({pm}, {pn})");
                assert!(!seen[pm * cols + pn], "{block_m} {rows}x{cols}: ({pm}, {pn}) twice");
                seen[pm * cols + pn] = true;
                // The order: group by group, column by column within one.
                let (g, in_group) = (pid / (group * cols), pid % (group * cols));
                let size = group.min(rows - g * group);
                assert_eq!(
                    (pm, pn),
                    (g * group + in_group % size, in_group / size),
                    "{block_m} {rows}x{cols} pid {pid}"
                );
            }
        }
    }
}
