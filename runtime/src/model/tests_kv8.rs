//! The FP8 KV cache through the whole model on the interpreter: the
//! persistent step and the multi-kernel step agree bit for bit with it (on
//! the plain interpreter and on the Hopper emulation, whose one-row steps
//! then run RoPE and the cache write in the attention tasks), and its
//! logits stay close to the 16-bit cache's.

use super::emu::Emu;
use super::graph::GraphMode;
use super::mega::DecodePath;
use super::{Device, KvCacheDtype};
use crate::check::model::{Scenario, compare_exact, decode_scenario_kv, scenario_params, tiny_flat_model};
use crate::model::ActElem;
use dsl_core::half::bf16;
use dsl_core::interp::Cpu;

fn scenario(decode_path: DecodePath) -> Scenario {
    Scenario { seqs: 3, prompt: 40, batches: vec![3, 1, 2, 3, 1], split: None, invariant: true, decode_path }
}

fn mega_matches_multi_kernel<D: Device, T: ActElem>(dev: &mut D) {
    let (g, params) = (tiny_flat_model().unwrap(), scenario_params());
    let fp8 = KvCacheDtype::Fp8;
    let run = |dev: &mut D, path| {
        decode_scenario_kv::<D, T>(dev, &g, GraphMode::Off, &scenario(path), &params, fp8)
    };
    let (multi, m0) = run(dev, DecodePath::Graphs).unwrap();
    let (mega, m1) = run(dev, DecodePath::Mega).unwrap();
    assert_eq!((m0.mega_steps(), m1.mega_steps()), (0, 5));
    let (ids, logits, max_abs) = compare_exact(&multi, &mega);
    assert_eq!(
        (ids, logits),
        (0, 0),
        "FP8 cache: persistent vs multi-kernel, max |logit difference| {max_abs}"
    );
}

#[test]
fn fp8_kv_persistent_step_matches_multi_kernel() {
    mega_matches_multi_kernel::<Cpu, f32>(&mut Cpu::new());
    let mut emu = Emu::new();
    emu.hopper = true;
    mega_matches_multi_kernel::<Emu, bf16>(&mut emu);
}

/// The FP8 cache's logits against the f32 cache's: close (each cached
/// value within 2^-4 of its head's largest, relatively), not equal.
#[test]
fn fp8_kv_logits_track_the_f32_cache() {
    let (g, params) = (tiny_flat_model().unwrap(), scenario_params());
    let sc = scenario(DecodePath::Graphs);
    let mut cpu = Cpu::new();
    let (plain, _) =
        decode_scenario_kv::<Cpu, f32>(&mut cpu, &g, GraphMode::Off, &sc, &params, KvCacheDtype::Auto)
            .unwrap();
    let (fp8, _) =
        decode_scenario_kv::<Cpu, f32>(&mut cpu, &g, GraphMode::Off, &sc, &params, KvCacheDtype::Fp8)
            .unwrap();
    let (_, differ, max_abs) = compare_exact(&plain, &fp8);
    assert!(differ > 0, "the FP8 cache changed no logit");
    let scale = plain.iter().flat_map(|s| s.logits.iter()).fold(0f32, |m, v| m.max(v.abs())) as f64;
    assert!(max_abs < 0.05 * scale, "max |logit difference| {max_abs} against logits up to {scale}");
}
