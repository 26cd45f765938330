//! `#[kernel]` kernels: their IR equals the hand-built IR of the same kernel
//! (by printed text), and they run on the interpreter against references.

use dsl_core::DType;
use dsl_core::print::print;
use tests::{dsl, hand};

fn same_ir(
    macro_built: dsl_core::Result<dsl_core::Function>,
    hand_built: dsl_core::Result<dsl_core::Function>,
) {
    let (m, h) = (print(&macro_built.unwrap()), print(&hand_built.unwrap()));
    assert_eq!(m, h, "macro-built IR differs from the hand-built IR");
}

#[test]
fn macro_ir_equals_hand_built_ir() {
    same_ir(dsl::vector_add::build(&dsl::vector_add::Config::new(DType::F32, 1024)), hand::vector_add(1024));
    same_ir(
        dsl::softmax::build(&dsl::softmax::Config::new(DType::BF16, 1024)),
        hand::softmax(1024, DType::BF16),
    );
    same_ir(
        dsl::matmul::build(&dsl::matmul::Config::new(DType::F16, 32, 32, 16)),
        hand::matmul(32, 32, 16, DType::F16),
    );
    same_ir(dsl::argmax_rows::build(&dsl::argmax_rows::Config::new(256)), hand::argmax_rows(256));
    same_ir(dsl::cumsum_rows::build(&dsl::cumsum_rows::Config::new(256)), hand::cumsum_rows(256));
    same_ir(dsl::collatz::build(&dsl::collatz::Config::new()), hand::collatz());
    same_ir(dsl::histogram::build(&dsl::histogram::Config::new(128)), hand::histogram(128));
    same_ir(dsl::layer_norm::build(&dsl::layer_norm::Config::new(512)), hand::layer_norm(512));
}

#[test]
fn autotune_metadata_is_generated() {
    use dsl_core::launch::Kernel;
    let base = dsl::softmax::Config::new(DType::F32, 1024);
    let configs = dsl::softmax::Kernel::autotune_configs(&base);
    assert_eq!(configs.len(), 2);
    assert_eq!((configs[0].num_warps, configs[1].num_warps), (4, 8));
    assert!(configs.iter().all(|c| c.BLOCK == 1024 && c.T == DType::F32));
    assert_eq!(dsl::softmax::Kernel::autotune_key(), &["n_cols"]);
    assert!(
        dsl::vector_add::Kernel::autotune_configs(&dsl::vector_add::Config::new(DType::F32, 128)).is_empty()
    );
}

/// A shape error that depends on constexpr values is reported by `build` with the
/// file, line and column of the offending Rust expression in the kernel.
#[test]
fn build_errors_point_at_the_kernel_source() {
    let err = dsl::mismatched::build(&dsl::mismatched::Config::new(64, 32)).unwrap_err();
    let dsl_core::Error::Build { kernel, diagnostics } = err else { panic!("expected a build error") };
    assert_eq!(kernel, "mismatched");
    let src = include_str!("../src/dsl.rs");
    let line = src.lines().position(|l| l.contains("let bad = arange(0, A) + arange(0, B);")).unwrap() + 1;
    let col = src.lines().nth(line - 1).unwrap().find("arange").unwrap() + 1;
    assert_eq!(diagnostics.len(), 1, "{diagnostics:?}");
    let d = &diagnostics[0];
    assert!(d.loc.file.ends_with("tests/src/dsl.rs"), "{d}");
    assert_eq!((d.loc.line as usize, d.loc.col as usize), (line, col), "{d}");
    assert!(d.message.contains("dimension 0 is 64 vs 32"), "{d}");
    assert!(dsl::mismatched::build(&dsl::mismatched::Config::new(64, 64)).is_ok());
}

/// Load hints (`eviction_policy`, `cache_modifier`) reach the IR as the load's
/// `evict`/`cache` attributes, survive the text round trip, and do not change
/// what the load reads (interpreter, ragged tail masked); a load with both is
/// a build error that names the problem.
#[test]
fn load_hints_reach_the_ir_and_keep_values() {
    use dsl_core::interp::Cpu;
    use std::marker::PhantomData;
    let f = dsl::hinted_copy::build(&dsl::hinted_copy::Config::new(256)).unwrap();
    let text = print(&f);
    assert!(text.contains("evict = first") || text.contains("evict=first"), "{text}");
    assert!(text.contains("cache = cg") || text.contains("cache=cg"), "{text}");
    let parsed = dsl_core::parse::parse(&text).unwrap();
    assert_eq!(print(&parsed), text);

    let n = 300;
    let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() + 1.5).collect();
    let y: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos() - 0.25).collect();
    let mut cpu = Cpu::new();
    let (xp, yp, op) = (cpu.upload(&x), cpu.upload(&y), cpu.zeros::<f32>(n));
    let args = dsl::hinted_copy::Args {
        x_ptr: xp.cast(),
        y_ptr: yp.cast(),
        out_ptr: op.cast(),
        n: n as i32,
        _marker: PhantomData,
    };
    dsl::hinted_copy::interpret(&mut cpu, [2, 1, 1], &dsl::hinted_copy::Config::new(256), &args).unwrap();
    let got = cpu.read(op);
    for i in 0..n {
        assert_eq!(got[i], x[i] + y[i], "element {i}");
    }

    let err = dsl::both_hints::build(&dsl::both_hints::Config::new(64)).unwrap_err();
    let dsl_core::Error::Build { diagnostics, .. } = err else { panic!("expected a build error") };
    assert!(diagnostics.iter().any(|d| d.message.contains("not both")), "{diagnostics:?}");
}

/// `load_block` through `#[kernel]`: the constexpr block shape and the
/// eviction hint reach the op, and the interpreter copies exactly the
/// elements inside the matrix (zeros elsewhere) for ragged matrices, padded
/// rows and negative box origins, in f32, bf16 and i32.
#[test]
fn load_block_copies_boxes_with_zero_fill() {
    use dsl_core::half::bf16;
    use dsl_core::interp::Cpu;
    use std::marker::PhantomData;
    use tests::reference::Rng;

    let f = dsl::block_copy::build(&dsl::block_copy::Config::new(DType::BF16, 16, 32)).unwrap();
    let text = print(&f);
    assert!(text.contains("load_block") && text.contains("{br = 16, bc = 32, evict = first}"), "{text}");

    // (m, n, stride_x, row0, col0, BM, BN)
    let cases: [(usize, usize, usize, i64, i64, usize, usize); 5] = [
        (37, 29, 29, 0, 0, 16, 8),
        (20, 13, 17, -5, -3, 8, 16),
        (5, 70, 80, 3, -40, 4, 32),
        (9, 9, 9, 50, 0, 8, 8),
        (1, 1, 1, -1, -1, 2, 2),
    ];
    for (seed, &(m, n, stride, row0, col0, bm, bn)) in cases.iter().enumerate() {
        let mut rng = Rng::new(seed as u64);
        let len = (m - 1) * stride + n;
        let x: Vec<f64> = rng
            .vec(len, -100.0, 100.0)
            .iter()
            .map(|&v| if v == 0.0 { 0.5 } else { v.round() as f64 })
            .collect();
        let grid = [3u32, 2, 1];
        let (h, w) = (3 * bm, 2 * bn);
        let mut want = vec![0.0; h * w];
        for r in 0..h {
            for c in 0..w {
                let (i, j) = (row0 + r as i64, col0 + c as i64);
                if (0..m as i64).contains(&i) && (0..n as i64).contains(&j) {
                    want[r * w + c] = x[i as usize * stride + j as usize];
                }
            }
        }
        for dtype in [DType::F32, DType::BF16, DType::I32] {
            let mut cpu = Cpu::new();
            let cfg = dsl::block_copy::Config::new(dtype, bm, bn);
            let args = |xp, op| dsl::block_copy::Args {
                x_ptr: xp,
                out_ptr: op,
                m: m as i32,
                n: n as i32,
                stride_x: stride as i32,
                row0: row0 as i32,
                col0: col0 as i32,
                out_stride: w as i32,
                _marker: PhantomData,
            };
            let got: Vec<f64> = match dtype {
                DType::F32 => {
                    let xs: Vec<f32> = x.iter().map(|&v| v as f32).collect();
                    let (xp, op) = (cpu.upload(&xs), cpu.upload(&vec![-1.0f32; h * w]));
                    dsl::block_copy::interpret(&mut cpu, grid, &cfg, &args(xp.cast(), op.cast())).unwrap();
                    cpu.read(op).iter().map(|&v| v as f64).collect()
                }
                DType::BF16 => {
                    let xs: Vec<bf16> = x.iter().map(|&v| bf16::from_f64(v)).collect();
                    let (xp, op) = (cpu.upload(&xs), cpu.upload(&vec![bf16::from_f32(-1.0); h * w]));
                    dsl::block_copy::interpret(&mut cpu, grid, &cfg, &args(xp.cast(), op.cast())).unwrap();
                    cpu.read(op).iter().map(|v| v.to_f64()).collect()
                }
                _ => {
                    let xs: Vec<i32> = x.iter().map(|&v| v as i32).collect();
                    let (xp, op) = (cpu.upload(&xs), cpu.upload(&vec![-1i32; h * w]));
                    dsl::block_copy::interpret(&mut cpu, grid, &cfg, &args(xp.cast(), op.cast())).unwrap();
                    cpu.read(op).iter().map(|&v| v as f64).collect()
                }
            };
            // Integers in [-100, 100] are exact in every dtype here.
            assert_eq!(got, want, "{dtype} case {seed}");
        }
    }

    // A block that is not a power of two is a build error at the call.
    let err = dsl::block_copy::build(&dsl::block_copy::Config::new(DType::F32, 16, 24)).unwrap_err();
    let dsl_core::Error::Build { diagnostics, .. } = err else { panic!("expected a build error") };
    let src = include_str!("../src/dsl.rs");
    let line = src.lines().position(|l| l.contains("let tile = load_block(")).unwrap() + 1;
    assert_eq!(diagnostics.len(), 1, "{diagnostics:?}");
    assert_eq!(diagnostics[0].loc.line as usize, line, "{}", diagnostics[0]);
    assert!(
        diagnostics[0].message.contains("two powers of two `[BR, BC]`, found [16, 24]"),
        "{}",
        diagnostics[0]
    );
}

/// A build-time choice as an enum constexpr (as the dequant kernels take
/// their quantization format).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Width {
    Narrow,
    Wide,
}

impl dsl_core::launch::Constexpr for Width {
    fn name_part(&self) -> String {
        format!("{self:?}").to_lowercase()
    }
}

impl Width {
    fn scale(self) -> usize {
        if self == Width::Wide { 2 } else { 1 }
    }
}

/// Fills `BLOCK * WIDTH.scale()` elements; the IR name and the autotune
/// configs follow `WIDTH`.
#[dsl_macros::kernel(
    name = "fill_{WIDTH}",
    autotune(
        configs = [(BLOCK = 32 * WIDTH.scale(), num_warps = 1), (when = WIDTH == Width::Wide, BLOCK = 128)],
        key = [n]
    )
)]
fn fill(out_ptr: Ptr<f32>, n: i32, #[constexpr] WIDTH: Width, #[constexpr] BLOCK: usize) {
    let offs = arange(0, BLOCK * WIDTH.scale());
    let v = if WIDTH == Width::Wide { 2.0 } else { 1.0 };
    store(out_ptr + offs, full([BLOCK * WIDTH.scale()], v, f32), mask = offs < n);
}

#[test]
fn enum_constexprs_name_and_tune_specializations() {
    let narrow = fill::Config::new(Width::Narrow, 16);
    let wide = fill::Config::new(Width::Wide, 16);
    assert_eq!(fill::build(&narrow).unwrap().name, "fill_narrow");
    assert_eq!(fill::build(&wide).unwrap().name, "fill_wide");
    // The specialization key (the config's Debug text) holds the variant.
    assert!(format!("{wide:?}").contains("WIDTH: Wide"), "{wide:?}");
    let blocks = |c: &fill::Config| fill::autotune_configs(c).iter().map(|c| c.BLOCK).collect::<Vec<_>>();
    assert_eq!(blocks(&narrow), [32]);
    assert_eq!(blocks(&wide), [64, 128]);
    let mut cpu = dsl_core::interp::Cpu::new();
    let out = cpu.zeros::<f32>(32);
    let args = fill::Args { out_ptr: out, n: 32, _marker: std::marker::PhantomData };
    fill::interpret(&mut cpu, [1, 1, 1], &wide, &args).unwrap();
    assert!(cpu.read(out).iter().all(|&v| v == 2.0));
}

/// Ends in expressions with no semicolon: a build-time `if` whose branches
/// end in a loop and a call, after a plain call. A kernel returns nothing,
/// so each is a statement whose stores must reach the IR.
#[dsl_macros::kernel]
fn tail_stores(out_ptr: Ptr<f32>, #[constexpr] SPLIT: bool, #[constexpr] BLOCK: usize) {
    let offs = arange(0, BLOCK);
    if SPLIT {
        for h in static_range(0, 2) {
            store(out_ptr + BLOCK as i32 * h as i32 + offs, full([BLOCK], 1.0 + h as f32, f32));
        }
    } else {
        store(out_ptr + offs, full([BLOCK], 3.0, f32))
    }
}

#[test]
fn a_kernel_body_ending_in_an_expression_runs_it() {
    for (split, want) in [(true, [1.0, 1.0, 2.0, 2.0]), (false, [3.0, 3.0, 0.0, 0.0])] {
        let mut cpu = dsl_core::interp::Cpu::new();
        let out = cpu.zeros::<f32>(4);
        let args = tail_stores::Args { out_ptr: out, _marker: std::marker::PhantomData };
        tail_stores::interpret(&mut cpu, [1, 1, 1], &tail_stores::Config::new(split, 2), &args).unwrap();
        assert_eq!(cpu.read(out), want, "SPLIT = {split}");
    }
}

/// Stores `a` at `ptr` where `n > 1`, else `b`: a helper that returns
/// nothing and ends in a runtime `if`.
#[dsl_macros::kernel_fn]
fn store_either(ptr: Tensor, n: Tensor, a: Tensor, b: Tensor) {
    if n > 1 { store(ptr, a) } else { store(ptr, b) }
}

/// Runtime `if`s whose branches end in calls with no semicolon: as a
/// statement, as a loop body's last expression, as the last expression of
/// a helper that returns nothing and as the kernel's last expression. Each
/// branch's call is a statement whose stores reach the IR.
#[dsl_macros::kernel]
fn runtime_if_tails(out_ptr: Ptr<f32>, n: i32, #[constexpr] BLOCK: usize) {
    let offs = arange(0, BLOCK);
    store_either(out_ptr + 4 * BLOCK as i32 + offs, n, full([BLOCK], 6.0, f32), full([BLOCK], 7.0, f32));
    if n > 1 {
        store(out_ptr + offs, full([BLOCK], 1.0, f32))
    } else {
        store(out_ptr + offs, full([BLOCK], 2.0, f32))
    };
    for i in range(0, 2) {
        if n > 1 {
            store(out_ptr + (i + 1) * BLOCK as i32 + offs, full([BLOCK], 3.0, f32))
        }
    }
    if n > 1 {
        store(out_ptr + 3 * BLOCK as i32 + offs, full([BLOCK], 4.0, f32))
    } else {
        store(out_ptr + 3 * BLOCK as i32 + offs, full([BLOCK], 5.0, f32))
    }
}

#[test]
fn runtime_ifs_ending_in_calls_run_them() {
    for (n, want) in [(2, [1.0, 3.0, 3.0, 4.0, 6.0]), (0, [2.0, 0.0, 0.0, 5.0, 7.0])] {
        let mut cpu = dsl_core::interp::Cpu::new();
        let out = cpu.zeros::<f32>(10);
        let args = runtime_if_tails::Args { out_ptr: out, n, _marker: std::marker::PhantomData };
        runtime_if_tails::interpret(&mut cpu, [1, 1, 1], &runtime_if_tails::Config::new(2), &args).unwrap();
        let want: Vec<f32> = want.iter().flat_map(|&v| [v, v]).collect();
        assert_eq!(cpu.read(out), want, "n = {n}");
    }
}

/// Row `r`'s start and stride in a `[rows, stride]` matrix, as one group of
/// tensors.
#[derive(Clone, Copy)]
struct RowAt {
    base: dsl_core::lang::Tensor,
    stride: dsl_core::lang::Tensor,
}

/// `at` moved down `r` rows: a helper taking and returning a group.
#[dsl_macros::kernel_fn]
fn row_below(#[tensors] at: RowAt, r: Tensor) -> RowAt {
    RowAt { base: at.base + r * at.stride, stride: at.stride }
}

/// Program `r` copies row `r` of `x` into `out`, both reached through
/// groups: one built from a struct literal, one bound by a `let` typed as
/// the group from a helper's result.
#[dsl_macros::kernel]
fn copy_rows(x_ptr: Ptr<f32>, out_ptr: Ptr<f32>, stride: i32, #[constexpr] BLOCK: usize) {
    let r = program_id(0);
    let cols = arange(0, BLOCK);
    let src: RowAt = row_below(RowAt { base: x_ptr, stride }, r);
    let dst = RowAt { base: out_ptr + r * stride, stride };
    store(
        dst.base + cols,
        load(src.base + cols, mask = cols < src.stride, other = 0.0),
        mask = cols < dst.stride,
    );
}

#[test]
fn groups_of_tensors_pass_through_helpers() {
    let mut cpu = dsl_core::interp::Cpu::new();
    let x: Vec<f32> = (0..3 * 5).map(|i| 0.5 + i as f32).collect();
    let (xp, out) = (cpu.upload(&x), cpu.zeros::<f32>(15));
    let args = copy_rows::Args { x_ptr: xp, out_ptr: out, stride: 5, _marker: std::marker::PhantomData };
    copy_rows::interpret(&mut cpu, [3, 1, 1], &copy_rows::Config::new(8), &args).unwrap();
    assert_eq!(cpu.read(out), x);
}
