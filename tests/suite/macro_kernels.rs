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
