//! Reference for [`crate::fp8::quantize_fp8`]: the per-group scales and
//! 8-bit codes in the kernel's f32 arithmetic (so the interpreter and the
//! GPU must match it bit for bit), and the error bound of the dequantized
//! values against the inputs in f64.

use dsl_core::DType;
use dsl_core::dtype::{f8_bits, f8_round};

/// What `quantize_fp8` stores for one input: per row, the group scales
/// (`s`, row-major `[rows, groups]`) and the codes (`q`, `[rows, n]`).
pub struct Fp8Quant {
    /// Scales, `[rows, ceil(n / group)]`.
    pub scales: Vec<f32>,
    /// Codes, `[rows, n]`.
    pub codes: Vec<u8>,
    /// The dequantized values `q * s`, `[rows, n]`.
    pub values: Vec<f64>,
}

/// Quantizes `x` (`[rows, n]`, the inputs as stored, in f32) to `f8` in
/// groups of `group` columns: `s = amax / F8_MAX` (1 for an all-zero
/// group), `q = round_f8(round_f32(x / s))`. Each f32 operation is the
/// correctly rounded one (an f64 quotient of f32 operands rounded to f32
/// is).
pub fn quantize_fp8(x: &[f32], rows: usize, n: usize, group: usize, f8: DType) -> Fp8Quant {
    let max = f64::from(crate::fp8::f8_max(f8));
    let groups = n.div_ceil(group);
    let mut scales = vec![0f32; rows * groups];
    let mut codes = vec![0u8; rows * n];
    let mut values = vec![0f64; rows * n];
    for r in 0..rows {
        for g in 0..groups {
            let cols = g * group..((g + 1) * group).min(n);
            let amax = cols.clone().map(|c| x[r * n + c].abs()).fold(0f32, f32::max);
            let s = if amax > 0.0 { (f64::from(amax) / max) as f32 } else { 1.0 };
            scales[r * groups + g] = s;
            for c in cols {
                let v = (f64::from(x[r * n + c]) / f64::from(s)) as f32;
                codes[r * n + c] = f8_bits(f8, v);
                values[r * n + c] = f64::from(f8_round(f8, v)) * f64::from(s);
            }
        }
    }
    Fp8Quant { scales, codes, values }
}

/// The bound on `|q * s - x|` for one input `x` quantized with scale `s` to
/// `f8`: half an ulp of the format at `x / s` (relative `2^-(m+1)` in the
/// normal range, `2^-(bias+m)` absolute below it, `m` the mantissa bits),
/// plus the f32 rounding of the quotient, times `s`.
pub fn quantize_bound(x: f64, s: f64, f8: DType) -> f64 {
    let (m, bias) = if f8 == DType::F8E4M3 { (3, 7) } else { (2, 15) };
    let v = (x / s).abs();
    s * (v * 2f64.powi(-(m + 1)) + 2f64.powi(-(bias + m)) + v * 2f64.powi(-23))
}

/// How a block's products are summed, for the bound of [`scaled_matmul`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockSums {
    /// In f32 (the interpreter, and `mma.sync`/`wgmma` on f16-widened
    /// operands).
    F32,
    /// By Hopper's native FP8 `wgmma` (`m64nNk32`), whose adder keeps only
    /// about 14 significant bits: each k step aligns its 32 products and the
    /// running sum to the largest of them and truncates what falls below
    /// that term's 13th fractional bit, so each of the 33 terms loses less
    /// than `2^-13` of the largest, itself at most the block's sum of
    /// magnitudes (`2^-12` is taken, for margin). The reason DeepSeek-V3's
    /// recipe, and [`crate::fp8::scaled_matmul_fp8`], scale and add each
    /// 128-wide block in f32.
    Fp8Wgmma,
}

/// [`crate::fp8::scaled_matmul_fp8`] in f64 (no rounding): `c[i, j] = sum_t
/// sa[t, i] sb[j / 128, t] sum_{k in block t} a[i, k] b[j, k]` (`sa`
/// K-block-major `[ceil(k / 128), m]`, `sb` `[ceil(n / 128), ceil(k /
/// 128)]`, as the kernel takes them), `a` and `b`
/// the codes' values; and per element the bound of the kernel's arithmetic
/// against it: each block's sum of exact products (at most 128 terms,
/// summed as `sums` says) and its scaling in f32, the sum over blocks, then
/// the rounding to an output with unit roundoff `u_out`. With `per_tensor`
/// `sa` and `sb` hold one scale each (every block's), and the products of
/// the whole K are summed into one accumulator instead, and scaled once.
#[allow(clippy::too_many_arguments)]
pub fn scaled_matmul(
    a: &[f64],
    sa: &[f32],
    b: &[f64],
    sb: &[f32],
    (m, n, k): (usize, usize, usize),
    sums: BlockSums,
    per_tensor: bool,
    u_out: f64,
) -> (Vec<f64>, Vec<f64>) {
    const B: usize = crate::fp8::SCALE_BLOCK;
    let kb = k.div_ceil(B);
    let u = 2f64.powi(-24);
    // Products summed into one accumulator, and the tensor cores' error
    // over them relative to their sum of magnitudes (see
    // `BlockSums::Fp8Wgmma`): 33 terms per 32-wide k step.
    let run = if per_tensor { k } else { B };
    let block_err = match sums {
        BlockSums::F32 => 0.0,
        BlockSums::Fp8Wgmma => (run.div_ceil(32) * 33) as f64 * 2f64.powi(-12),
    };
    let (mut c, mut tol) = (vec![0f64; m * n], vec![0f64; m * n]);
    for i in 0..m {
        for j in 0..n {
            let (mut sum, mut mag) = (0f64, 0f64);
            for t in 0..kb {
                let (ia, ib) = if per_tensor { (0, 0) } else { (t * m + i, j / B * kb + t) };
                let s = f64::from(sa[ia]) * f64::from(sb[ib]);
                let (mut p, mut pm) = (0f64, 0f64);
                for kk in t * B..((t + 1) * B).min(k) {
                    p += a[i * k + kk] * b[j * k + kk];
                    pm += (a[i * k + kk] * b[j * k + kk]).abs();
                }
                sum += s * p;
                mag += s.abs() * pm;
            }
            c[i * n + j] = sum;
            // Block sums (up to 128 roundings), scale product and multiply
            // (2), the sum over blocks (kb), doubled for the tensor cores'
            // accumulation; then the output rounding.
            let steps = (run + 2 + kb) as f64;
            let arith = 2.0 * steps * u * mag + block_err * mag;
            tol[i * n + j] = arith + u_out * (sum.abs() + arith);
        }
    }
    (c, tol)
}
