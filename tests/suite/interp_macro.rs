//! `#[kernel]` kernels on the CPU interpreter (through the `Cpu` backend) against
//! plain f64 references, on random non-zero inputs with ragged sizes.

use crate::common::cases;
use dsl_core::DType;
use dsl_core::half::bf16;
use dsl_core::interp::Cpu;
use proptest::prelude::*;
use std::marker::PhantomData;
use tests::dsl;
use tests::reference::{self as r, Rng, check_close};

proptest! {
    #![proptest_config(cases(24))]

    #[test]
    fn vector_add_ragged(n in 1usize..3000, block in prop::sample::select(vec![64usize, 256, 1024]), seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let (x, y) = (rng.vec(n, -5.0, 5.0), rng.vec(n, -5.0, 5.0));
        let mut cpu = Cpu::new();
        let (xp, yp, op) = (cpu.upload(&x), cpu.upload(&y), cpu.zeros::<f32>(n));
        let grid = [n.div_ceil(block) as u32, 1, 1];
        let args = dsl::vector_add::Args { x_ptr: xp.cast(), y_ptr: yp.cast(), out_ptr: op.cast(), n: n as i32, _marker: PhantomData };
        dsl::vector_add::interpret(&mut cpu, grid, &dsl::vector_add::Config::new(DType::F32, block), &args).unwrap();
        let got = cpu.read(op);
        for i in 0..n {
            prop_assert_eq!(got[i], x[i] + y[i]);
        }
    }

    /// f32 and bf16 storage; `BLOCK` is the exact (often not power-of-two) row length.
    #[test]
    fn softmax_ragged(rows in 1usize..9, cols in 1usize..700, bf in any::<bool>(), exact in any::<bool>(), seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let x = rng.vec(rows * cols, -4.0, 4.0);
        let block = if exact { cols } else { cols.next_power_of_two() };
        let mut cpu = Cpu::new();
        let got: Vec<f64>;
        let want: Vec<f64>;
        if bf {
            let xb: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
            want = r::softmax(&xb.iter().map(|v| v.to_f64()).collect::<Vec<_>>(), rows, cols);
            let (ip, op) = (cpu.upload(&xb), cpu.zeros::<bf16>(rows * cols));
            let args = dsl::softmax::Args { out_ptr: op.cast(), in_ptr: ip.cast(), n_cols: cols as i32, stride: cols as i32, _marker: PhantomData };
            dsl::softmax::interpret(&mut cpu, [rows as u32, 1, 1], &dsl::softmax::Config::new(DType::BF16, block), &args).unwrap();
            got = cpu.read(op).iter().map(|v| v.to_f64()).collect();
            check_close(&got, &want, 1e-6, 1.0 / 128.0).map_err(TestCaseError::fail)?;
        } else {
            want = r::softmax(&x.iter().map(|&v| v as f64).collect::<Vec<_>>(), rows, cols);
            let (ip, op) = (cpu.upload(&x), cpu.zeros::<f32>(rows * cols));
            let args = dsl::softmax::Args { out_ptr: op.cast(), in_ptr: ip.cast(), n_cols: cols as i32, stride: cols as i32, _marker: PhantomData };
            dsl::softmax::interpret(&mut cpu, [rows as u32, 1, 1], &dsl::softmax::Config::new(DType::F32, block), &args).unwrap();
            got = cpu.read(op).iter().map(|&v| v as f64).collect();
            check_close(&got, &want, 1e-7, 1e-5).map_err(TestCaseError::fail)?;
        }
    }
}

proptest! {
    #![proptest_config(cases(10))]

    #[test]
    fn matmul_ragged(m in 1usize..70, n in 1usize..70, k in 1usize..90, half in any::<bool>(), seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let (a, b) = (rng.vec(m * k, -1.0, 1.0), rng.vec(k * n, -1.0, 1.0));
        let mut cpu = Cpu::new();
        let (dtype, a64, b64, ap, bp) = if half {
            let ah: Vec<bf16> = a.iter().map(|&v| bf16::from_f32(v)).collect();
            let bh: Vec<bf16> = b.iter().map(|&v| bf16::from_f32(v)).collect();
            (DType::BF16, ah.iter().map(|v| v.to_f64()).collect::<Vec<_>>(), bh.iter().map(|v| v.to_f64()).collect::<Vec<_>>(),
             cpu.upload(&ah).cast(), cpu.upload(&bh).cast())
        } else {
            (DType::F32, a.iter().map(|&v| v as f64).collect(), b.iter().map(|&v| v as f64).collect(), cpu.upload(&a).cast(), cpu.upload(&b).cast())
        };
        let cp = cpu.zeros::<f32>(m * n);
        let (bm, bn, bk) = (32, 32, 16);
        let args = dsl::matmul::Args { a_ptr: ap, b_ptr: bp, c_ptr: cp, m: m as i32, n: n as i32, k: k as i32,
            stride_am: k as i32, stride_bk: n as i32, stride_cm: n as i32, _marker: PhantomData };
        let grid = [m.div_ceil(bm) as u32, n.div_ceil(bn) as u32, 1];
        dsl::matmul::interpret(&mut cpu, grid, &dsl::matmul::Config::new(dtype, bm, bn, bk), &args).unwrap();
        let got: Vec<f64> = cpu.read(cp).iter().map(|&v| v as f64).collect();
        check_close(&got, &r::matmul(&a64, &b64, m, n, k), 1e-5, 1e-5).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn layer_norm_argmax_cumsum_ragged(rows in 1usize..6, cols in 2usize..300, seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let x = rng.vec(rows * cols, -3.0, 3.0);
        let (w, b) = (rng.vec(cols, 0.5, 1.5), rng.vec(cols, -1.0, 1.0));
        let block = cols.next_power_of_two();
        let x64: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let mut cpu = Cpu::new();
        let (xp, yp, wp, bp) = (cpu.upload(&x), cpu.zeros::<f32>(rows * cols), cpu.upload(&w), cpu.upload(&b));
        let args = dsl::layer_norm::Args { x_ptr: xp, y_ptr: yp, w_ptr: wp, b_ptr: bp, n_cols: cols as i32, eps: 1e-5, _marker: PhantomData };
        dsl::layer_norm::interpret(&mut cpu, [rows as u32, 1, 1], &dsl::layer_norm::Config::new(block), &args).unwrap();
        let w64: Vec<f64> = w.iter().map(|&v| v as f64).collect();
        let b64: Vec<f64> = b.iter().map(|&v| v as f64).collect();
        let got: Vec<f64> = cpu.read(yp).iter().map(|&v| v as f64).collect();
        check_close(&got, &r::layer_norm(&x64, &w64, &b64, rows, cols, 1e-5), 1e-4, 1e-4).map_err(TestCaseError::fail)?;

        let ap = cpu.zeros::<i32>(rows);
        let args = dsl::argmax_rows::Args { x_ptr: xp, out_ptr: ap, n_cols: cols as i32, _marker: PhantomData };
        dsl::argmax_rows::interpret(&mut cpu, [rows as u32, 1, 1], &dsl::argmax_rows::Config::new(block), &args).unwrap();
        let got = cpu.read(ap);
        for rr in 0..rows {
            let row = &x[rr * cols..(rr + 1) * cols];
            let want = (0..cols).fold(0, |best, i| if row[i] > row[best] { i } else { best });
            prop_assert_eq!(got[rr] as usize, want);
        }

        let cp = cpu.zeros::<f32>(rows * cols);
        let args = dsl::cumsum_rows::Args { x_ptr: xp, out_ptr: cp, n_cols: cols as i32, _marker: PhantomData };
        dsl::cumsum_rows::interpret(&mut cpu, [rows as u32, 1, 1], &dsl::cumsum_rows::Config::new(block), &args).unwrap();
        let got: Vec<f64> = cpu.read(cp).iter().map(|&v| v as f64).collect();
        let want = r::cumsum_rows(&x64, cols);
        check_close(&got, &want, 1e-4, 1e-5).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn histogram_and_collatz(n in 1usize..2000, bins in 1usize..40, seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let data: Vec<i32> = (0..n).map(|_| rng.below(bins as u64) as i32).collect();
        let mut cpu = Cpu::new();
        let (dp, hp) = (cpu.upload(&data), cpu.zeros::<i32>(bins));
        let args = dsl::histogram::Args { bins_ptr: dp, hist_ptr: hp, n: n as i32, _marker: PhantomData };
        dsl::histogram::interpret(&mut cpu, [n.div_ceil(128) as u32, 1, 1], &dsl::histogram::Config::new(128), &args).unwrap();
        let mut want = vec![0i32; bins];
        for &d in &data {
            want[d as usize] += 1;
        }
        prop_assert_eq!(cpu.read(hp), want);

        let xs: Vec<i32> = (0..16).map(|_| 1 + rng.below(1000) as i32).collect();
        let (xp, op) = (cpu.upload(&xs), cpu.zeros::<i32>(16));
        let args = dsl::collatz::Args { x_ptr: xp, out_ptr: op, _marker: PhantomData };
        dsl::collatz::interpret(&mut cpu, [16, 1, 1], &dsl::collatz::Config::new(), &args).unwrap();
        let steps = |mut x: i64| { let mut s = 0; while x > 1 { x = if x % 2 == 0 { x / 2 } else { 3 * x + 1 }; s += 1; } s };
        let got = cpu.read(op);
        for i in 0..16 {
            prop_assert_eq!(got[i] as i64, steps(xs[i] as i64));
        }
    }
}
