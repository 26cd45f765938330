//! Kernel library: the stacked product of one row or a few
//! (`kernels::dequant::stacked`, the persistent decode step's products of
//! up to four rows) on the interpreter, bit for bit against the
//! batch-invariant `linear` on the same rows.

use crate::lib_dequant::{Act, activations, random_weight};
use crate::lib_linear::{Fuse as LinearFuse, product_args, run};
use dsl_core::half::bf16;
use dsl_core::interp::Cpu;
use dsl_macros::kernel;
use kernels::dequant::linear::LINEAR_BLOCK_K;
use kernels::dequant::stacked::{
    StackedShape, packed_epilogue, packed_sums, stacked_epilogue, stacked_load, stacked_rows, stacked_slot,
    stacked_sums,
};
use kernels::dequant::{Fuse, QuantFormat};
use kernels::rmsnorm::{rms_rstd, rms_rstd_live_rows};
use tests::reference::Rng;

const EPS: f32 = 1e-5;

/// One program per output tile of `BLOCK_N` rows (`PACK` blocks of them
/// when packed): the stacked product of the `m` rows of `x` (one row, or
/// at most `ROWS`) with `STACK` K tiles (slots) per dot, as the persistent
/// step runs it (weights of the first dot loaded first, the norm statistic
/// of each whole row, scratch slot per program).
#[kernel]
#[allow(clippy::too_many_arguments)]
fn stacked_probe<T: Float>(
    x_ptr: Ptr<T>,
    q_ptr: Ptr<u8>,
    s_ptr: Ptr<f16>,
    nw_ptr: Ptr<T>,
    out_ptr: Ptr<T>,
    ws_ptr: Ptr<f32>,
    m: i32,
    n: i32,
    k: i32,
    eps: f32,
    #[constexpr] QUANT: QuantFormat,
    #[constexpr] FUSE: Fuse,
    #[constexpr] F16: bool,
    #[constexpr] BLOCK_N: usize,
    #[constexpr] STACK: usize,
    #[constexpr] PACK: usize,
    #[constexpr] TILES: usize,
    #[constexpr] NORM_BLOCK: usize,
    #[constexpr] ROWS: usize,
) {
    let pid = program_id(0);
    let rows = if FUSE.silu() { n * 2 } else { n };
    let wrow = stacked_rows(pid, rows, BLOCK_N, STACK, PACK, TILES);
    let cycle = if PACK > 1 { TILES } else { 0 };
    let (wd, sr) = stacked_load(q_ptr, s_ptr, wrow, full([], 0, i32), cycle, k / 32, QUANT, BLOCK_N, STACK);
    let rs = if !FUSE.norm() {
        eps
    } else if ROWS > 1 {
        rms_rstd_live_rows(x_ptr, m, k, eps, ROWS, 2, NORM_BLOCK)
    } else {
        let cols = arange(0, NORM_BLOCK);
        rms_rstd(load(x_ptr + cols, mask = cols < k, other = 0.0).to(f32), k, eps, NORM_BLOCK)
    };
    let zero = full([], 0, i32);
    if PACK > 1 {
        packed_sums(
            x_ptr, nw_ptr, ws_ptr, k, m, rs, wd, sr, BLOCK_N, STACK, PACK, TILES, ROWS, QUANT, FUSE, F16, T,
        );
        packed_epilogue(ws_ptr, out_ptr, m, n, pid, FUSE, T, BLOCK_N, STACK, PACK, TILES, ROWS);
    } else {
        let (sums, _) = stacked_sums(
            x_ptr, q_ptr, s_ptr, nw_ptr, ws_ptr, k, m, rs, wrow, wd, sr, QUANT, FUSE, F16, T, BLOCK_N, STACK,
            TILES, ROWS, false,
        );
        stacked_epilogue(sums, out_ptr, m, n, pid, zero, FUSE, T, BLOCK_N, ROWS);
    };
}

/// Runs [`stacked_probe`] for the `m` rows `x` (`k` values each) in a
/// tile of `rows` rows (1: the one-row form) against the weight `w` (`n`
/// outputs, `2n` rows with SiLU); `out0` is the initial output (the
/// residual).
#[allow(clippy::too_many_arguments)]
fn run_stacked<T: Act>(
    format: QuantFormat,
    fuse: LinearFuse,
    f16_ops: bool,
    x: &[T],
    nw: &[T],
    out0: &[T],
    w: &kernels::dequant::Repacked,
    (m, rows_cap, n, k): (usize, usize, usize, usize),
    (stack, block_n, pack): (usize, usize, usize),
) -> Vec<T> {
    let mut cpu = Cpu::new();
    let rows = if fuse == LinearFuse::Silu { 2 * n } else { n };
    let tiles = k.div_ceil(LINEAR_BLOCK_K);
    let programs = rows.div_ceil(block_n * pack);
    let (xp, qp, sp, np) = (cpu.upload(x), cpu.upload(&w.quants), cpu.upload(&w.scales), cpu.upload(nw));
    let op = cpu.upload(out0);
    let wsp = cpu.zeros::<f32>(programs * stacked_slot(stack, block_n, k, rows_cap));
    let args = product_args!(
        stacked_probe::Args,
        [xp, qp, sp, np, op, wsp],
        m: m as i32,
        n: n as i32,
        k: k as i32,
        eps: EPS
    );
    let config = stacked_probe::Config::new(
        T::DTYPE,
        format,
        fuse.flags(),
        f16_ops,
        block_n,
        stack,
        pack,
        tiles,
        k.next_power_of_two(),
        rows_cap,
    );
    stacked_probe::interpret(&mut cpu, [programs as u32, 1, 1], &config, &args).unwrap();
    cpu.read(op)
}

/// The stacked product's row equals `linear`'s (split 16-row tiles, the
/// persistent step's other form, and every other tile by `linear`'s own
/// invariance) bit for bit: word-tiled formats, every fusion, f16 and f32
/// operands, f32 and bf16 activations; K of one partial tile, of several
/// with a partial one, and of more than one dot (17 K tiles, and 5 tiles in
/// dots of 4); packed tiles of 2 to 8 blocks (5 tiles in 16 slots as the
/// persistent step's gate/up, 3 tiles, one tile); output rows past the
/// matrix in the last tile. A product that took another K tile's block or
/// another block's rows, or summed out of K order, differs.
#[test]
fn stacked_rows_equal_linear() {
    stacked_cases::<f32>();
    stacked_cases::<bf16>();
}

fn stacked_cases<T: Act>() {
    let n = 40;
    let formats = [QuantFormat::Q4_1, QuantFormat::Q4_0, QuantFormat::Q8_0];
    for (i, format) in formats.into_iter().enumerate() {
        let shapes =
            [(96, 1, 1), (576, 8, 1), (576, 4, 1), (2080, 16, 1), (576, 16, 3), (320, 16, 5), (96, 8, 8)];
        for (k, stack, pack) in shapes {
            for fuse in [LinearFuse::None, LinearFuse::Silu, LinearFuse::Norm, LinearFuse::Residual] {
                let f16_ops = (i + k / 32) % 2 == 0 || fuse == LinearFuse::Norm;
                let mut rng = Rng::new(0x5A + i as u64 + k as u64);
                let silu = fuse == LinearFuse::Silu;
                let (w, _) = random_weight(&mut rng, format, n, k, silu);
                let x = activations::<T>(&mut rng, k);
                let nw = activations::<T>(&mut rng, k);
                let res = activations::<T>(&mut rng, n);
                let want =
                    run::<T, T>(format, fuse, f16_ops, (16, 16, true), &x, &nw, &res, &w, (1, n, k)).unwrap();
                let block_ns: &[usize] = if pack > 1 { &[4] } else { &[4, 16] };
                for &block_n in block_ns {
                    let tiling = (stack, block_n, pack);
                    let got =
                        run_stacked::<T>(format, fuse, f16_ops, &x, &nw, &res, &w, (1, 1, n, k), tiling);
                    let bits = |v: &[T]| v.iter().map(|x| x.to_f64().to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{:?} {format:?} {fuse:?} f16={f16_ops} k={k} stack={stack} block_n={block_n} pack={pack}",
                        T::DTYPE
                    );
                }
            }
        }
    }
}

/// Several rows in one stacked tile (the persistent step's steps of two to
/// four rows): each row's products equal `linear`'s on that row alone
/// (`linear`'s norm prologue takes one row) bit for bit, with a row past
/// `m` in the tile (three rows in a tile of four), every fusion, tiles of
/// one dot, of two dots and packed ones. A row that read another row's
/// activations or statistic, or its products from another row's scratch,
/// differs.
#[test]
fn stacked_tiles_of_several_rows_equal_linear() {
    let n = 40;
    let format = QuantFormat::Q4_1;
    for (m, rows_cap) in [(2, 2), (3, 4), (4, 4)] {
        for (k, stack, pack) in [(576, 8, 1), (2080, 16, 1), (320, 16, 5)] {
            for fuse in [LinearFuse::None, LinearFuse::Silu, LinearFuse::Norm, LinearFuse::Residual] {
                let mut rng = Rng::new(0xA5 + m as u64 + k as u64);
                let (w, _) = random_weight(&mut rng, format, n, k, fuse == LinearFuse::Silu);
                let x = activations::<bf16>(&mut rng, m * k);
                let nw = activations::<bf16>(&mut rng, k);
                let res = activations::<bf16>(&mut rng, m * n);
                let want: Vec<bf16> = (0..m)
                    .flat_map(|r| {
                        let (xr, rr) = (&x[r * k..(r + 1) * k], &res[r * n..(r + 1) * n]);
                        run::<bf16, bf16>(format, fuse, true, (16, 16, true), xr, &nw, rr, &w, (1, n, k))
                            .unwrap()
                    })
                    .collect();
                let shape = (m, rows_cap, n, k);
                let got = run_stacked::<bf16>(format, fuse, true, &x, &nw, &res, &w, shape, (stack, 4, pack));
                let bits = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "m={m} of {rows_cap} {fuse:?} k={k} stack={stack} pack={pack}"
                );
            }
        }
    }
}

/// The shapes the persistent step stacks: SmolLM2's four products, one K
/// tile per dot row up to 16, tiles of at least 4 rows and at most 256 of
/// them, 32 to 128 rows per dot; byte-per-weight formats stay split. Of
/// two or four rows, the products whose dot holds at most 1,024 results
/// (`STACKED_MAX_RESULT`): at two rows SmolLM2's QKV, O and packed gate/up,
/// at four its QKV and O; other row counts split.
#[test]
fn stacked_shapes_fit_the_grid_and_the_registers() {
    let q4 = QuantFormat::Q4_1;
    assert_eq!(q4.stacked_shape(1, 960, 576, 32), (8, 4));
    assert_eq!(q4.stacked_shape(1, 576, 576, 32), (8, 4));
    assert_eq!(q4.stacked_shape(1, 3072, 576, 32), (8, 16));
    assert_eq!(q4.stacked_shape(1, 576, 1536, 32), (16, 4));
    assert_eq!(q4.stacked_shape(1, 16384, 2048, 32), (0, 32));
    // The tiny model: one K tile, still 32 rows per dot.
    assert_eq!(q4.stacked_shape(1, 256, 64, 32), (1, 32));
    assert_eq!(q4.stacked_shape(0, 960, 576, 32), (0, 32));
    assert_eq!(QuantFormat::Q4_K.stacked_shape(1, 960, 576, 32), (0, 32));
    assert_eq!(QuantFormat::Q8_0.stacked_shape(1, 960, 576, 32), (8, 4));
    // Packed where the one dot would be wider than 64 rows with most of
    // them past K: gate/up in blocks of 4 rows, three per dot of 16 slots
    // (256 tasks); the others as stacked.
    assert_eq!(q4.stacked_tiling(1, 3072, 576, 32), (16, 4, 3));
    assert_eq!(q4.stacked_tiling(1, 960, 576, 32), (8, 4, 1));
    assert_eq!(q4.stacked_tiling(1, 576, 576, 32), (8, 4, 1));
    assert_eq!(q4.stacked_tiling(1, 576, 1536, 32), (16, 4, 1));
    assert_eq!(q4.stacked_tiling(1, 256, 64, 32), (1, 32, 1));
    assert_eq!(q4.stacked_tiling(0, 3072, 576, 32), (0, 32, 1));
    // Several rows.
    for (rows, want) in [(2, (8, 4, 1)), (4, (8, 4, 1)), (3, (0, 32, 1)), (8, (0, 32, 1))] {
        assert_eq!(q4.stacked_tiling(rows, 960, 576, 32), want, "{rows} rows");
        assert_eq!(q4.stacked_tiling(rows, 576, 576, 32), want, "{rows} rows");
    }
    assert_eq!(q4.stacked_tiling(2, 3072, 576, 32), (16, 4, 3));
    assert_eq!(q4.stacked_tiling(4, 3072, 576, 32), (0, 32, 1));
    assert_eq!(q4.stacked_tiling(2, 576, 1536, 32), (0, 32, 1));
    assert_eq!(q4.stacked_tiling(4, 576, 1536, 32), (0, 32, 1));
}
