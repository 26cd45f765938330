//! Plan snapshot tests (cranelift filetest style): each `inputs/NAME.tir` is
//! a kernel's IR as `dsl_core::print` writes it, after a first line naming
//! the compile options (`// target: sm_90a, warps: 4, stages: 3, programs
//! per SM: 0`). The test parses it, builds its kernel plan
//! (`codegen::plan_text`, what `TESSERA_DUMP=plan` prints) and pins the plan
//! with an insta snapshot, so a change to any planning decision (which `dot`
//! takes which instruction and operand sources, which loads are pipelined
//! how deep, what resides in shared memory, which values live in which
//! register layout) shows up here as a readable diff, before any PTX.
//!
//! The inputs are bundled kernels at the configurations the runtime
//! launches (specialized on 16-byte aligned pointers), printed once; they
//! do not change when a kernel's source does.

use codegen::{CompileOptions, Target, plan_text};
use dsl_core::Function;
use std::path::Path;

/// The compile options of a `.tir` file's first line.
fn options(header: &str, name: &str) -> CompileOptions {
    let body = header.strip_prefix("// ").unwrap_or_else(|| panic!("{name}: no options line"));
    let mut opts = CompileOptions::default();
    for field in body.split(", ") {
        let (key, value) = field.split_once(": ").unwrap_or_else(|| panic!("{name}: bad field {field:?}"));
        let num = || value.parse::<u32>().unwrap_or_else(|_| panic!("{name}: {key} = {value:?}"));
        match key {
            "target" => {
                opts.target = match value {
                    "sm_80" => Target::Sm80,
                    "sm_90a" => Target::Sm90a,
                    other => panic!("{name}: unknown target {other}"),
                }
            }
            "warps" => opts.num_warps = num(),
            "stages" => opts.num_stages = num(),
            "programs per SM" => opts.min_programs_per_sm = num(),
            other => panic!("{name}: unknown option {other}"),
        }
    }
    opts
}

/// The plan of `inputs/NAME.tir`.
/// The function and options of `inputs/{name}.tir`.
pub(crate) fn input(name: &str) -> (Function, CompileOptions) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/plan/inputs").join(format!("{name}.tir"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (header, ir) = text.split_once('\n').unwrap_or_else(|| panic!("{name}: empty"));
    let opts = options(header, name);
    (dsl_core::parse::parse(ir).unwrap_or_else(|e| panic!("{name}: {e}")), opts)
}

fn plan_of(name: &str) -> String {
    let (f, opts) = input(name);
    plan_text(&f, &opts).unwrap_or_else(|e| panic!("{name}: {e}"))
}

macro_rules! plan_tests {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            insta::assert_snapshot!(stringify!($name), plan_of(stringify!($name)));
        }
    )*};
}

plan_tests!(
    cumsum_rows_b256,
    decode_step_smollm2_persistent,
    flash_attention_32q8kv128_causal_tma,
    flash_attention_32q8kv128_full_sm80,
    flash_attention_32q8kv128_full_wgmma,
    flash_attention_9q3kv64_causal_sm80,
    flash_attention_9q3kv64_causal_wgmma,
    gemm_q4_1_swapped_256x128x64_s4,
    gemm_q4_1_swapped_256x128x64_sm80,
    gemm_stream_k_256x128x64,
    linear_q4_1_qkv_m1_norm_split,
    linear_q4_1_qkv_m64,
    matmul_bf16_128x128x32_sm80,
    matmul_bf16_128x128x32_sm90a,
    matmul_bf16_128x256x64_sm80,
    matmul_bf16_128x256x64_sm90a,
    matmul_f16_32x32x16,
    matmul_f32_64x64x32_fma,
    paged_decode_hkv8_g4_hd128,
    paged_decode_tc_hkv8_g4_hd128_split,
    paged_decode_tc_invariant_hd64_wgmma,
    paged_decode_tc_kv8_hkv8_g4_hd128,
    scaled_matmul_fp8_128x128_sm90a,
    scaled_matmul_fp8_64x128_sm90a,
    scaled_matmul_fp8_ahead_64x128_sm90a,
    scaled_matmul_fp8_paired_64x128_sm90a,
    scaled_matmul_fp8_64x128_unaligned_k_sm90a,
    scaled_matmul_fp8_per_tensor_128x256_sm90a,
    softmax_b1024,
);

/// Every `.tir` file has a test above (a new input is not silently skipped).
#[test]
fn every_input_has_a_test() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/plan/inputs");
    let src = include_str!("mod.rs");
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "tir") {
            let stem = p.file_stem().unwrap().to_string_lossy().to_string();
            assert!(src.contains(&format!("    {stem},\n")), "inputs/{stem}.tir has no test");
        }
    }
}

/// Options no kernel compiles with are an error, not a plan.
#[test]
fn bad_options_are_rejected() {
    let f = dsl_core::parse::parse("kernel @k() {\n}\n").unwrap();
    let opts = CompileOptions { num_warps: 3, ..CompileOptions::default() };
    let e = plan_text(&f, &opts).unwrap_err().to_string();
    assert!(e.contains("num_warps"), "{e}");
}
