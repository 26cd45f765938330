//! Dense half-precision matmul: `C[M, N] = A[M, K] @ B[K, N]` with f16 or
//! bf16 inputs and output and an f32 accumulator (the tensor-core example).
//!
//! # Math
//!
//! `C[i, j] = round_T(sum_k A[i, k] * B[k, j])`: the products of two halves
//! are exact in f32 and the sum accumulates in f32; the result is rounded to
//! `T` once.
//!
//! # Tiling
//!
//! Grid `[cdiv(M, BLOCK_M), cdiv(N, BLOCK_N), 1]`: one program per output
//! tile `[BLOCK_M, BLOCK_N]`, taken in grouped order ([`grouped_tile`];
//! with `PREFETCH` in launch order). A K
//! loop in steps of `BLOCK_K` loads the A tile `[BLOCK_M, BLOCK_K]` and the B
//! tile `[BLOCK_K, BLOCK_N]` as boxes of the row-major matrices
//! (`load_block`: along their contiguous axis, 16-byte loads where the
//! strides allow; rows `>= M`, columns `>= N`, `k >= K` read as zero), and
//! accumulates with
//! `acc = dot(a, b, acc)`; on sm_80+ the codegen keeps this loop-carried
//! accumulator in the tensor-core layout for the whole loop. With
//! `PREFETCH`, the tiles of the next step are loaded before each product (a
//! register prefetch: more registers, load latency overlapped within the
//! program; the last step loads a fully masked tile, which touches no memory).
//! Without it, the codegen pipelines the loop `num_stages` deep: the A and B
//! tiles of the next steps are copied into shared memory with `cp.async`
//! (on sm_90a with `wgmma`: TMA boxes) while the current product runs (the
//! loads feed only the `dot`).
//!
//! # Layout contract
//!
//! Row-major `A` (row stride `stride_am`), `B` (row stride `stride_bk`) and
//! `C` (row stride `stride_cm`), unit stride along the last axis; offsets
//! fit in i32. Any `M, N, K >= 0`.
//!
//! # Constexprs
//!
//! `BLOCK_M`, `BLOCK_N` (powers of two, multiples of 16 per warp row for
//! tensor cores; see [`config_for`]), `BLOCK_K` (a multiple of 16) and
//! `PREFETCH` (the register prefetch above).

use dsl_macros::{kernel, kernel_fn};

/// Output rows per group of a product's programs (see [`grouped_tile`]):
/// at 8192^3 the programs resident at once then share their rows of `A`
/// and columns of `B` in L2 instead of each wave reading all of `A`.
pub const RASTER_GROUP_ROWS: usize = 2048;

/// The output tile `(row, column)` of this program in a grid `[rows of
/// tiles, columns of tiles]` of `block_m`-row tiles, in grouped order
/// (Triton's): in launch order (`program_id(0)` fastest) the programs take
/// the tiles [`RASTER_GROUP_ROWS`] output rows at a time (between 16 and 32
/// rows of tiles: 32 of 64 rows, 16 of 128, the faster of the two sizes
/// for each in `bench --only matmul,fp8`), column by column within a group.
/// With a group at least the grid's rows it is the plain order.
#[kernel_fn]
pub fn grouped_tile(block_m: usize) -> (Tensor, Tensor) {
    let group_m = (RASTER_GROUP_ROWS / block_m).clamp(16, 32);
    let (rows, cols) = (num_programs(0), num_programs(1));
    let pid = program_id(1) * rows + program_id(0);
    let per_group = (group_m as i32) * cols;
    let first = pid / per_group * (group_m as i32);
    let size = minimum(rows - first, group_m as i32);
    (first + pid % per_group % size, pid % per_group / size)
}

/// `C = A @ B` over `[BLOCK_M, BLOCK_N]` output tiles; see the module documentation.
#[kernel]
#[allow(clippy::too_many_arguments)]
pub fn half_matmul<T: Float>(
    a_ptr: Ptr<T>,
    b_ptr: Ptr<T>,
    c_ptr: Ptr<T>,
    m: i32,
    n: i32,
    k: i32,
    stride_am: i32,
    stride_bk: i32,
    stride_cm: i32,
    #[constexpr] BLOCK_M: usize,
    #[constexpr] BLOCK_N: usize,
    #[constexpr] BLOCK_K: usize,
    #[constexpr] PREFETCH: bool,
) {
    // The register-prefetch form keeps the plain order: there the group's
    // index arithmetic stays live through the loop and costs it a program
    // per SM (`bench --only matmul`).
    let (pm, pn) = if PREFETCH { (program_id(0), program_id(1)) } else { grouped_tile(BLOCK_M) };
    let m0 = pm * BLOCK_M;
    let n0 = pn * BLOCK_N;
    let mut acc = zeros([BLOCK_M, BLOCK_N], f32);
    // The tiles are boxes of the row-major A and B (`load_block`: zeros past
    // the edges); on sm_90a the pipelined ones are TMA copies.
    if PREFETCH {
        // Register prefetch: the tiles of step `k0 + BLOCK_K` are loaded
        // before the product of step `k0`, so their latency overlaps it.
        let mut a = load_block(a_ptr, m, k, stride_am, m0, 0, [BLOCK_M, BLOCK_K]);
        let mut b = load_block(b_ptr, k, n, stride_bk, 0, n0, [BLOCK_K, BLOCK_N]);
        for k0 in range(0, k, BLOCK_K) {
            let k1 = k0 + BLOCK_K;
            let a_next = load_block(a_ptr, m, k, stride_am, m0, k1, [BLOCK_M, BLOCK_K]);
            let b_next = load_block(b_ptr, k, n, stride_bk, k1, n0, [BLOCK_K, BLOCK_N]);
            acc = dot(a, b, acc);
            a = a_next;
            b = b_next;
        }
    } else {
        for k0 in range(0, k, BLOCK_K) {
            let a = load_block(a_ptr, m, k, stride_am, m0, k0, [BLOCK_M, BLOCK_K]);
            let b = load_block(b_ptr, k, n, stride_bk, k0, n0, [BLOCK_K, BLOCK_N]);
            acc = dot(a, b, acc);
        }
    }
    let rows = expand_dims(m0 + arange(0, BLOCK_M), 1);
    let cols = expand_dims(n0 + arange(0, BLOCK_N), 0);
    let row_ok = rows < m;
    let col_ok = cols < n;
    store(c_ptr + rows * stride_cm + cols, acc.to(T), mask = row_ok && col_ok);
}

/// A launch configuration: output tile, K step and warps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileConfig {
    /// Output rows per program (`BLOCK_M`).
    pub block_m: usize,
    /// Output columns per program (`BLOCK_N`).
    pub block_n: usize,
    /// K per loop iteration (`BLOCK_K`).
    pub block_k: usize,
    /// Warps per program.
    pub num_warps: u32,
    /// Whether the K loop prefetches the next tiles into registers (`PREFETCH`).
    pub prefetch: bool,
    /// Software-pipelining depth (`num_stages`): without the register
    /// prefetch, the codegen copies the A and B tiles of the next
    /// `stages - 1` K steps into shared memory with `cp.async` while the
    /// current one is multiplied.
    pub stages: u32,
}

/// The configurations the checks and benches exercise: the default large
/// tile (128 x 256 x 64, 8 warps, three `cp.async` stages; four on Hopper,
/// where this tile runs on `wgmma`, see [`config_for`]), the register-prefetch variants, the default small tile
/// (64 x 64, the smallest also fits tiny `M`), and other pipelined tiles
/// for the benches (128 x 128 at 3 stages, 32-deep K steps, 256 x 128, four
/// stages, 64-deep K steps at four stages and on 256 x 128).
pub const CONFIGS: [TileConfig; 10] = [
    TileConfig { block_m: 128, block_n: 256, block_k: 64, num_warps: 8, prefetch: false, stages: 3 },
    TileConfig { block_m: 128, block_n: 64, block_k: 32, num_warps: 4, prefetch: true, stages: 1 },
    TileConfig { block_m: 64, block_n: 64, block_k: 32, num_warps: 4, prefetch: false, stages: 3 },
    TileConfig { block_m: 128, block_n: 128, block_k: 32, num_warps: 8, prefetch: true, stages: 1 },
    TileConfig { block_m: 128, block_n: 128, block_k: 32, num_warps: 8, prefetch: false, stages: 3 },
    TileConfig { block_m: 128, block_n: 256, block_k: 32, num_warps: 8, prefetch: false, stages: 3 },
    TileConfig { block_m: 256, block_n: 128, block_k: 32, num_warps: 8, prefetch: false, stages: 3 },
    TileConfig { block_m: 128, block_n: 256, block_k: 32, num_warps: 8, prefetch: false, stages: 4 },
    TileConfig { block_m: 128, block_n: 256, block_k: 64, num_warps: 8, prefetch: false, stages: 4 },
    TileConfig { block_m: 256, block_n: 128, block_k: 64, num_warps: 8, prefetch: false, stages: 3 },
];

/// The configuration for an `m x n` output: the largest tile both sides fill
/// (128 x 256, then 128 x 128), the smallest otherwise. On Hopper
/// (`wgmma`: sm_90a, 227 KiB of shared memory per block) the large tile runs
/// four stages deep (192 KiB of rings): its `wgmma` groups then overlap the
/// next iteration (see the codegen's pipeline), which three stages do not
/// allow. Ampere's 163 KiB hold three.
pub fn config_for(m: usize, n: usize, wgmma: bool) -> TileConfig {
    if m >= 128 && n >= 256 && wgmma {
        CONFIGS[8]
    } else if m >= 128 && n >= 256 {
        CONFIGS[0]
    } else if m >= 128 && n >= 128 {
        CONFIGS[4]
    } else {
        CONFIGS[2]
    }
}

impl TileConfig {
    /// The kernel configuration for storage dtype `dtype`.
    pub fn config(&self, dtype: dsl_core::DType) -> half_matmul::Config {
        half_matmul::Config::new(dtype, self.block_m, self.block_n, self.block_k, self.prefetch)
            .with_warps(self.num_warps)
            .with_stages(self.stages)
    }

    /// The tile in words, e.g. `128x128x32, 8 warps, 3 stages` or `.., prefetch`.
    pub fn describe(&self) -> String {
        let p = if self.prefetch { ", prefetch".to_string() } else { format!(", {} stages", self.stages) };
        format!("{}x{}x{}, {} warps{p}", self.block_m, self.block_n, self.block_k, self.num_warps)
    }
}

/// The launch grid `[cdiv(m, block_m), cdiv(n, block_n), 1]`.
pub fn grid(m: usize, n: usize, cfg: &TileConfig) -> [u32; 3] {
    [m.div_ceil(cfg.block_m).max(1) as u32, n.div_ceil(cfg.block_n).max(1) as u32, 1]
}
