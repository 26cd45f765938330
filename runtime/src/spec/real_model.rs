//! Speculative decoding on the real model (SmolLM2-135M Q4_1, fetched by
//! `make model`) through the native CPU backend and the whole loader path
//! ([`crate::app::run_task`] with [`crate::app::LoadOptions::speculation`]):
//! greedy generation of the golden prompts with prompt lookup and with a
//! draft of the model's first layers equals plain greedy generation token
//! for token.

use super::cli::Speculation;
use crate::app::{EngineTask, LoadOptions, Session, run_task};
use crate::engine::Request;
use crate::error::Result;
use crate::model::ActElem;
use crate::model::Device;
use crate::parity::Golden;
use crate::spec::SpecStats;

/// New tokens per golden prompt.
const NEW_TOKENS: usize = 24;

/// Greedy generation of every prompt in one batch, with the engine's
/// speculation counters afterwards.
struct Greedy(Vec<Vec<u32>>);

impl EngineTask for Greedy {
    type Output = (Vec<Vec<u32>>, SpecStats);

    fn run<D: Device, T: ActElem>(self, s: Session<'_, D, T>) -> Result<(Vec<Vec<u32>>, SpecStats)> {
        let Session { dev, engine, .. } = s;
        let reqs = self.0.into_iter().map(|prompt| Request::greedy(prompt, NEW_TOKENS)).collect();
        let done = engine.run(dev, reqs, |_| {})?;
        Ok((done.into_iter().map(|c| c.tokens).collect(), engine.spec_stats()))
    }
}

#[test]
fn smollm2_greedy_with_speculation_equals_plain_greedy_on_the_native_backend() {
    let prompts = Golden::bundled().prompts();
    let opts = LoadOptions::native_test(128, 32);
    let t0 = std::time::Instant::now();
    let (want, _) = run_task(&opts, Greedy(prompts.clone())).unwrap();
    assert_eq!(want.len(), prompts.len());
    assert!(want.iter().all(|t| t.len() == NEW_TOKENS));
    eprintln!("plain: {:.1} s", t0.elapsed().as_secs_f64());
    for spec in [Speculation::ngram(3), Speculation::draft_layers(2, 3)] {
        let t = std::time::Instant::now();
        let o = LoadOptions { speculation: Some(spec.clone()), ..opts.clone() };
        let (got, stats) = run_task(&o, Greedy(prompts.clone())).unwrap();
        eprintln!("{}: {:.1} s, {stats:?}", spec.describe(), t.elapsed().as_secs_f64());
        assert!(stats.proposed > 0, "{}: nothing was proposed", spec.describe());
        for (i, (w, g)) in want.iter().zip(&got).enumerate() {
            assert_eq!(w, g, "{}: prompt {i} differs", spec.describe());
        }
    }
}
