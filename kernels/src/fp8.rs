//! FP8 (OCP E4M3 / E5M2) kernels: activations quantized to 8-bit floats
//! with one f32 scale per group of consecutive columns, the operand form of
//! block-scaled FP8 products (1 x `GROUP` activation scales), and the
//! scaled products themselves, block-scaled or per-tensor
//! ([`scaled_matmul_fp8`]).
//!
//! # Math
//!
//! For each row and each group of `GROUP` consecutive columns (the last
//! group of a row may be partial), in f32:
//!
//! ```text
//! amax = max_i |x_i|                            (exact)
//! s    = amax / F8_MAX   if amax > 0, else 1    (one rounding)
//! q_i  = round_F8(x_i / s)                      (one rounding to f32, then the format's)
//! ```
//!
//! `F8_MAX` is the format's largest finite value (448 for E4M3, 57344 for
//! E5M2); `round_F8` rounds to nearest even and saturates (the `cast`
//! semantics of the language), so a quotient that the division rounds past
//! `F8_MAX` still lands on it. Dequantized, `q_i * s` is within the format's
//! half ulp of `x_i / s` (relative 2^-4 for E4M3 and 2^-3 for E5M2 in the
//! normal range, absolute half the smallest subnormal below it), times `s`,
//! plus the division's f32 rounding. The reference with that bound is
//! [`crate::reference::fp8::quantize_fp8`]. Inputs are finite.
//!
//! # Tiling
//!
//! Program `(row, j)` quantizes `GROUPS` groups of row `row` from group
//! `j * GROUPS` as one `[GROUPS, GROUP]` tile (`GROUP` a power of two);
//! columns past `n` are masked and count as zero in `amax`. Grid `[rows,
//! ceil(n / (GROUPS * GROUP)), 1]`.
//!
//! # Layout contract
//!
//! `x` row-major `[rows, n]` (rows `stride` elements apart), `q` the same
//! shape and stride in the 8-bit format `F`, `s` row-major `[rows,
//! ceil(n / GROUP)]`, or with `GROUP_MAJOR` (quantization only) group-major
//! `[ceil(n / GROUP), rows]` (`rows` the grid's first dimension), the
//! activation-scale layout of [`scaled_matmul_fp8`].

use dsl_macros::{kernel, kernel_fn};

/// The largest finite value of the 8-bit float `f` (E4M3: 448, E5M2: 57344).
pub fn f8_max(f: dsl_core::DType) -> f32 {
    if f == dsl_core::DType::F8E4M3 { 448.0 } else { 57344.0 }
}

/// This program's `[GROUPS, GROUP]` tile of a row (see the module docs):
/// the element offsets and their mask, then the offsets of its groups'
/// scales (row-major, or group-major with `group_major`) and their mask.
#[kernel_fn]
pub fn group_tile(
    n: Tensor,
    stride: Tensor,
    group: usize,
    groups: usize,
    group_major: bool,
) -> (Tensor, Tensor, Tensor, Tensor) {
    let row = program_id(0);
    let g = program_id(1) * groups + arange(0, groups);
    let cols = expand_dims(g * group, 1) + expand_dims(arange(0, group), 0);
    let n_groups = (n + (group as i32 - 1)) / group as i32;
    let (offs, mask) = (row * stride + cols, cols < n);
    (offs, mask, if group_major { g * num_programs(0) + row } else { row * n_groups + g }, g < n_groups)
}

/// Per-group FP8 quantization: `q = round_F(x / s)` with `s = max|x| /
/// F8_MAX` per `GROUP` columns of a row (see the module docs); the scales
/// row-major, or group-major with `GROUP_MAJOR` (the activation scales of
/// [`scaled_matmul_fp8`] with `GROUP` 128).
#[kernel(name = "quantize_fp8")]
#[allow(clippy::too_many_arguments)]
pub fn quantize_fp8<T: Float, F: Float>(
    x_ptr: Ptr<T>,
    q_ptr: Ptr<F>,
    s_ptr: Ptr<f32>,
    n: i32,
    stride: i32,
    #[constexpr] GROUP: usize,
    #[constexpr] GROUPS: usize,
    #[constexpr] GROUP_MAJOR: bool,
) {
    let (offs, mask, s_offs, s_mask) = group_tile(n, stride, GROUP, GROUPS, GROUP_MAJOR);
    let x = load(x_ptr + offs, mask = mask, other = 0.0).to(f32);
    let amax = max(abs(x), 1);
    let s = where_(amax > 0.0, amax / f8_max(F), 1.0);
    let q = (x / expand_dims(s, 1)).to(F);
    store(q_ptr + offs, q, mask = mask);
    store(s_ptr + s_offs, s, mask = s_mask);
}

/// The inverse of [`quantize_fp8`]: `out = round_T(f32(q) * s)` with `s` the
/// scale of the element's group (every code's value is exact in f32, so the
/// product rounds once, to f32, and then to `T`). Same tiling and layout;
/// NaN codes give NaN.
#[kernel(name = "dequantize_fp8")]
#[allow(clippy::too_many_arguments)]
pub fn dequantize_fp8<F: Float, T: Float>(
    q_ptr: Ptr<F>,
    s_ptr: Ptr<f32>,
    out_ptr: Ptr<T>,
    n: i32,
    stride: i32,
    #[constexpr] GROUP: usize,
    #[constexpr] GROUPS: usize,
) {
    let (offs, mask, s_offs, s_mask) = group_tile(n, stride, GROUP, GROUPS, false);
    let s = load(s_ptr + s_offs, mask = s_mask, other = 1.0);
    let q = load(q_ptr + offs, mask = mask).to(f32);
    store(out_ptr + offs, (q * expand_dims(s, 1)).to(T), mask = mask);
}

/// The K and weight-row extent of one weight scale of [`scaled_matmul_fp8`]
/// (its 128 x 128 blocks), and the K extent of one activation scale.
pub const SCALE_BLOCK: usize = 128;

/// The scales of K block `b` of a block-scaled product's rows `rm`
/// (`ok`: inside `m`), activation times weight: zero past the last block
/// (`kb` blocks), whose weight scale the index clamps to a valid one.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn block_scales(
    sa_ptr: Tensor,
    sb_ptr: Tensor,
    sb_row: Tensor,
    rm: Tensor,
    ok: Tensor,
    m: Tensor,
    kb: Tensor,
    b: Tensor,
) -> Tensor {
    load(sa_ptr + b * m + rm, mask = ok && b < kb, other = 0.0) * load(sb_ptr + sb_row + minimum(b, kb - 1))
}

/// Scaled FP8 product, in one of two forms, rounded to `T` once.
///
/// Block-scaled (DeepSeek-V3's layout, `PER_TENSOR` false): `c[i, j] =
/// sum_t sa[t, i] * sb[j / 128, t] * sum_{k in block t} a[i, k] * b[j, k]`,
/// the blocks `t` of 128 columns of K, in f32. `sa` holds one scale per row
/// of `a` and 128 columns, K-block-major (`[ceil(k / 128), m]`: `sa[t, i]`
/// at `t m + i`, so a K block's scales are one contiguous run, as
/// DeepGEMM lays them out; [`quantize_fp8`] with `GROUP_MAJOR` writes
/// them so with groups of 128), `sb` one per 128 x 128 block of `b`
/// (`[ceil(n / 128), ceil(k / 128)]`, row-major). Each K block's `dot`
/// starts from zero and is scaled into the f32 accumulator (`acc = fma(p,
/// sa * sb, acc)`, one rounding, blocks in K order: one instruction per
/// accumulator element and block), so the tensor cores sum at most 128
/// products before the scales apply (Hopper's FP8 `wgmma` adds with about
/// 14 significant bits,
/// `reference::fp8::BlockSums`). `BLOCK_N` divides 128, so a tile's weight
/// rows share their scales.
///
/// Per-tensor (`torch._scaled_mm`'s form, `PER_TENSOR` true): `c = sa[0] *
/// sb[0] * (a @ b^T)`, the whole K summed by the tensor cores into one
/// accumulator (cuBLASLt's fast accumulation), scaled once.
///
/// `a` is `[m, k]` and `b` `[n, k]` (row `j` the weights of output `j`, K
/// contiguous) in format `F`, `c` is `[m, n]`, all row-major with rows `k`
/// and `n` elements apart. The grid is `[ceil(m / BLOCK_M), ceil(n /
/// BLOCK_N)]`, one program per `[BLOCK_M, BLOCK_N]` tile; in launch order
/// the programs take the tiles in groups of rows of tiles
/// ([`crate::matmul::grouped_tile`]), so the programs resident at
/// once share their rows of `a` and columns of `b` in L2. Loads past `m`, `n` and `k` read zeros.
///
/// `SCALES_AHEAD` (block-scaled only) loads each K block's scales one block
/// ahead and carries them, so their latency overlaps a whole block's
/// product: the same bits, faster where the grid is short (prefill-sized
/// `m`), slower on large squares (`bench --only fp8` times both).
///
/// `PAIRED` (block-scaled only, not with `SCALES_AHEAD`) runs two K blocks
/// a trip: each block's product is issued before the previous one is
/// scaled in, so the scaling overlaps the tensor cores; the same bits, and
/// a third product's registers (`bench --only fp8` times it too).
#[kernel(name = "scaled_matmul_fp8")]
#[allow(clippy::too_many_arguments)]
pub fn scaled_matmul_fp8<F: Float, T: Float>(
    a_ptr: Ptr<F>,
    sa_ptr: Ptr<f32>,
    b_ptr: Ptr<F>,
    sb_ptr: Ptr<f32>,
    c_ptr: Ptr<T>,
    m: i32,
    n: i32,
    k: i32,
    #[constexpr] BLOCK_M: usize,
    #[constexpr] BLOCK_N: usize,
    #[constexpr] PER_TENSOR: bool,
    #[constexpr] SCALES_AHEAD: bool,
    #[constexpr] PAIRED: bool,
) {
    static_assert(PER_TENSOR || SCALE_BLOCK % BLOCK_N == 0, "BLOCK_N must divide the weight scale block");
    static_assert(!(PER_TENSOR && SCALES_AHEAD), "SCALES_AHEAD is for the block-scaled form");
    static_assert(!(PER_TENSOR || SCALES_AHEAD) || !PAIRED, "PAIRED is a block-scaled form of its own");
    let bk = SCALE_BLOCK as i32;
    let (pid_m, pid_n) = crate::matmul::grouped_tile(BLOCK_M);
    let rm = pid_m * BLOCK_M + arange(0, BLOCK_M);
    let rn = pid_n * BLOCK_N + arange(0, BLOCK_N);
    let kb = (k + (bk - 1)) / bk;
    let sb_row = pid_n * BLOCK_N / bk * kb;
    let (m_ok, n_ok) = (rm < m, rn < n);
    let (m0, n0) = (pid_m * BLOCK_M, pid_n * BLOCK_N);
    let mut acc = zeros([BLOCK_M, BLOCK_N], f32);
    if PAIRED {
        // Two K blocks a trip, `t` and `u = t + 1` (past the last block
        // when `kb` is odd: zero boxes, zero scales). Each block's product
        // is issued before the one ahead of it is scaled in, so that
        // scaling overlaps the tensor cores; `p1` carries block `u` into
        // the next trip. A trip scales in block `t - 1` early (`e`) and
        // block `t` late (`l`), and loads the next trip's two scales, so
        // their latency overlaps a whole trip.
        let mut p1 = zeros([BLOCK_M, BLOCK_N], f32);
        let mut e = zeros([BLOCK_M], f32);
        let mut l = block_scales(sa_ptr, sb_ptr, sb_row, rm, m_ok, m, kb, constant(0, i32));
        for t in range(0, kb, 2) {
            let a0 = load_block(a_ptr, m, k, k, m0, t * bk, [BLOCK_M, SCALE_BLOCK]);
            let b0 = load_block(b_ptr, n, k, k, n0, t * bk, [BLOCK_N, SCALE_BLOCK]);
            let p0 = dot(a0, trans(b0), zeros([BLOCK_M, BLOCK_N], f32));
            let u = t + 1;
            let e_next = block_scales(sa_ptr, sb_ptr, sb_row, rm, m_ok, m, kb, u);
            let l_next = block_scales(sa_ptr, sb_ptr, sb_row, rm, m_ok, m, kb, t + 2);
            acc = fma(p1, expand_dims(e, 1), acc);
            let a1 = load_block(a_ptr, m, k, k, m0, u * bk, [BLOCK_M, SCALE_BLOCK]);
            let b1 = load_block(b_ptr, n, k, k, n0, u * bk, [BLOCK_N, SCALE_BLOCK]);
            p1 = dot(a1, trans(b1), zeros([BLOCK_M, BLOCK_N], f32));
            acc = fma(p0, expand_dims(l, 1), acc);
            e = e_next;
            l = l_next;
        }
        acc = fma(p1, expand_dims(e, 1), acc);
    } else {
        // With SCALES_AHEAD: block 0's scales, then each block loads the next's.
        // Without it nothing reads them: the names are bound to values that
        // exist anyway, so the kernel gains no op.
        let (mut sa_ahead, mut sb_ahead) = if SCALES_AHEAD {
            (load(sa_ptr + rm, mask = m_ok, other = 0.0), load(sb_ptr + sb_row))
        } else {
            (rm, kb)
        };
        for t in range(0, kb) {
            // Boxes of the row-major operands (zeros past their edges): TMA
            // copies on sm_90a, which feed the native FP8 `wgmma`.
            let a = load_block(a_ptr, m, k, k, m0, t * bk, [BLOCK_M, SCALE_BLOCK]);
            let b = load_block(b_ptr, n, k, k, n0, t * bk, [BLOCK_N, SCALE_BLOCK]);
            if PER_TENSOR {
                acc = dot(a, trans(b), acc);
            } else if SCALES_AHEAD {
                let p = dot(a, trans(b), zeros([BLOCK_M, BLOCK_N], f32));
                let next = t + 1;
                let sa_next = load(sa_ptr + next * m + rm, mask = m_ok && next < kb, other = 0.0);
                let sb_next = load(sb_ptr + sb_row + minimum(next, kb - 1));
                acc = fma(p, expand_dims(sa_ahead * sb_ahead, 1), acc);
                sa_ahead = sa_next;
                sb_ahead = sb_next;
            } else {
                let p = dot(a, trans(b), zeros([BLOCK_M, BLOCK_N], f32));
                let sa = load(sa_ptr + t * m + rm, mask = m_ok, other = 0.0);
                let sb = load(sb_ptr + sb_row + t);
                acc = fma(p, expand_dims(sa * sb, 1), acc);
            }
        }
    }
    let y = if PER_TENSOR { acc * (load(sa_ptr) * load(sb_ptr)) } else { acc };
    let at = expand_dims(rm * n, 1) + expand_dims(rn, 0);
    store(c_ptr + at, y.to(T), mask = expand_dims(m_ok, 1) && expand_dims(n_ok, 0));
}
