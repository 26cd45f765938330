//! Batch invariance on the real model (SmolLM2-135M Q4_1, fetched by `make
//! model`) on the native CPU backend: greedy generation of each golden
//! prompt alone equals its generation in one continuous batch with the
//! others, token for token, and the whole invariance matrix
//! ([`super::invariance`]) holds for the golden prompts in f32, the CPU's
//! default dtype.

use super::Request;
use crate::app::{EngineTask, LoadOptions, Session, run_task};
use crate::error::Result;
use crate::model::ActElem;
use crate::model::Device;
use crate::parity::Golden;

/// New tokens per prompt.
const NEW_TOKENS: usize = 16;

/// Greedy generation of each prompt alone, then of all of them at once.
struct AloneAndBatched(Vec<Vec<u32>>);

impl EngineTask for AloneAndBatched {
    type Output = (Vec<Vec<u32>>, Vec<Vec<u32>>);

    fn run<D: Device, T: ActElem>(self, s: Session<'_, D, T>) -> Result<(Vec<Vec<u32>>, Vec<Vec<u32>>)> {
        let Session { dev, engine, .. } = s;
        let request = |prompt: &Vec<u32>| Request::greedy(prompt.clone(), NEW_TOKENS);
        let mut alone = Vec::new();
        for p in &self.0 {
            let done = engine.run(dev, vec![request(p)], |_| {})?;
            alone.extend(done.into_iter().map(|c| c.tokens));
        }
        let batched = engine.run(dev, self.0.iter().map(request).collect(), |_| {})?;
        Ok((alone, batched.into_iter().map(|c| c.tokens).collect()))
    }
}

#[test]
fn smollm2_greedy_alone_equals_greedy_in_a_batch_on_the_native_backend() {
    let golden = Golden::bundled();
    let prompts = golden.prompts();
    // A prompt alone must not reuse the cached blocks of its earlier run.
    let opts = LoadOptions { prefix_caching: false, ..LoadOptions::native_test(128, 32) };
    let (alone, batched) = run_task(&opts, AloneAndBatched(prompts)).unwrap();
    assert_eq!(alone.len(), golden.cases.len());
    for (i, (a, b)) in alone.iter().zip(&batched).enumerate() {
        assert_eq!(a.len(), NEW_TOKENS);
        assert_eq!(a, b, "prompt {i}");
    }
}

#[test]
fn smollm2_keeps_the_batch_invariance_guarantee_on_the_native_backend() {
    use super::invariance::{Matrix, Setup, run_matrix};
    use codegen::host::Host;
    let path = crate::app::resolve_model(std::path::Path::new(crate::app::DEFAULT_MODEL));
    let gguf = crate::gguf::Gguf::open(path).unwrap();
    let targets = crate::check::invariance::golden_targets(6).unwrap();
    assert!(targets.len() >= 4, "{}", targets.len());
    let mut host = Host::new();
    let results =
        run_matrix::<Host, f32>(&mut host, &gguf, &targets, Setup::roomy(128), &Matrix::default()).unwrap();
    assert!(results.len() >= 17, "{results:?}");
    for r in &results {
        assert!(r.pass(), "{r:?}");
    }
}
