//! Golden parity against llama.cpp (`tessera parity FILE`): the file (the
//! format of `runtime/tests/data/smollm2-135m-q4_1.json`) holds prompts, their
//! ids, llama.cpp's greedy continuation and, per generated position, the
//! gap between its top-1 and top-2 logits. Two rules are checked on the
//! chosen backend:
//!
//! 1. **Free-running greedy**: generating greedily from each prompt (all
//!    prompts as one continuous batch), the first `must_match` tokens equal
//!    llama.cpp's (`must_match` is the first position whose gap is below
//!    `tie_gap`, after which either choice is legitimate).
//! 2. **Teacher-forced argmax**: feeding `prompt_ids + token_ids` in one
//!    prefill, the argmax at every generated position whose gap is at least
//!    `tie_gap` equals llama.cpp's token there.
//!
//! Also checked: each prompt's text encodes to exactly `prompt_ids`.
//!
//! The teacher-forced pass runs the model directly through
//! [`Engine::score`] (logits of every position), before any request, so it
//! shares nothing with the free-running pass.

use crate::app::{EngineTask, Session};
use crate::engine::Request;
use crate::error::{Error, Result};
use crate::model::ActElem;
use crate::model::Device;
use kernels::reference::sampling::argmax;
use std::path::Path;
use std::time::Instant;

/// One golden case.
#[derive(Clone, Debug)]
pub struct Case {
    /// The prompt text.
    pub prompt: String,
    /// Its ids.
    pub prompt_ids: Vec<u32>,
    /// llama.cpp's greedy continuation.
    pub token_ids: Vec<u32>,
    /// Top-1 minus top-2 logit per continuation position.
    pub gaps: Vec<f64>,
    /// How many leading continuation tokens must match when free-running.
    pub must_match: usize,
}

/// A golden file.
#[derive(Clone, Debug)]
pub struct Golden {
    /// Gaps below this are ties.
    pub tie_gap: f64,
    /// The cases.
    pub cases: Vec<Case>,
}

impl Golden {
    /// The bundled model's golden file, `runtime/tests/data/smollm2-135m-q4_1.json`
    /// (tests).
    #[cfg(test)]
    pub(crate) fn bundled() -> Golden {
        let path =
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/smollm2-135m-q4_1.json");
        Golden::load(&path).unwrap()
    }

    /// Each case's prompt ids.
    pub fn prompts(&self) -> Vec<Vec<u32>> {
        self.cases.iter().map(|c| c.prompt_ids.clone()).collect()
    }

    /// Reads and validates a golden file.
    pub fn load(path: &Path) -> Result<Golden> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Usage(format!("reading {}: {e}", path.display())))?;
        Golden::parse(&text).map_err(|m| Error::Usage(format!("{}: {m}", path.display())))
    }

    /// Parses the JSON text of a golden file.
    pub fn parse(text: &str) -> std::result::Result<Golden, String> {
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let tie_gap = v["tie_gap"].as_f64().ok_or("missing number `tie_gap`")?;
        let cases = v["cases"].as_array().ok_or("missing array `cases`")?;
        let ids = |c: &serde_json::Value, k: &str, i: usize| -> std::result::Result<Vec<u32>, String> {
            c[k].as_array()
                .ok_or(format!("case {i}: missing array `{k}`"))?
                .iter()
                .map(|x| {
                    x.as_u64().and_then(|x| u32::try_from(x).ok()).ok_or(format!("case {i}: bad id in `{k}`"))
                })
                .collect()
        };
        let mut out = Vec::with_capacity(cases.len());
        for (i, c) in cases.iter().enumerate() {
            let gaps: Vec<f64> = c["top2_gaps"]
                .as_array()
                .ok_or(format!("case {i}: missing array `top2_gaps`"))?
                .iter()
                .map(|x| x.as_f64().ok_or(format!("case {i}: bad gap")))
                .collect::<std::result::Result<_, _>>()?;
            let case = Case {
                prompt: c["prompt"].as_str().ok_or(format!("case {i}: missing string `prompt`"))?.to_string(),
                prompt_ids: ids(c, "prompt_ids", i)?,
                token_ids: ids(c, "token_ids", i)?,
                gaps,
                must_match: c["must_match"].as_u64().ok_or(format!("case {i}: missing `must_match`"))?
                    as usize,
            };
            if case.prompt_ids.is_empty()
                || case.token_ids.is_empty()
                || case.gaps.len() != case.token_ids.len()
                || case.must_match > case.token_ids.len()
            {
                return Err(format!("case {i}: inconsistent lengths"));
            }
            out.push(case);
        }
        Ok(Golden { tie_gap, cases: out })
    }
}

/// The outcome of one case.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CaseReport {
    /// The prompt text encodes to `prompt_ids`.
    pub encodes: bool,
    /// Leading free-running tokens equal to llama.cpp's.
    pub free_prefix: usize,
    /// The case's `must_match`.
    pub must_match: usize,
    /// Tokens generated free-running.
    pub free_len: usize,
    /// Teacher-forced positions with a clear gap whose argmax agrees.
    pub forced_agree: usize,
    /// Teacher-forced positions with a clear gap.
    pub forced_clear: usize,
    /// Positions (continuation index) of clear disagreements.
    pub forced_wrong: Vec<usize>,
    /// Our margin for llama.cpp's token at each clear position: its logit
    /// minus the largest other logit (negative where we disagree; at zero,
    /// a tie, the argmax takes the lower token id).
    pub forced_margins: Vec<(usize, f32)>,
}

impl CaseReport {
    /// The clear position where our margin for llama.cpp's token is the
    /// smallest, and that margin.
    pub fn closest(&self) -> Option<(usize, f32)> {
        self.forced_margins.iter().copied().min_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// Whether both rules (and the encoding) hold.
    pub fn passed(&self) -> bool {
        self.encodes && self.free_prefix >= self.must_match && self.forced_wrong.is_empty()
    }
}

/// The `parity` command.
pub struct Parity {
    /// The golden data.
    pub golden: Golden,
    /// Free-running: generate the whole continuation (otherwise only
    /// `must_match` tokens, which is what the rule needs).
    pub full: bool,
}

impl EngineTask for Parity {
    type Output = Vec<CaseReport>;

    fn run<D: Device, T: ActElem>(self, s: Session<'_, D, T>) -> Result<Vec<CaseReport>> {
        let Session { dev, engine, ctx } = s;
        let g = &self.golden;
        let vocab = ctx.config.vocab_size;
        let mut reports = Vec::with_capacity(g.cases.len());
        let t0 = Instant::now();
        for (i, c) in g.cases.iter().enumerate() {
            if let Some(&t) = c.prompt_ids.iter().chain(&c.token_ids).find(|&&t| t as usize >= vocab) {
                return Err(Error::Usage(format!(
                    "golden case {i}: token id {t} is outside the model's vocabulary of {vocab}"
                )));
            }
        }
        for c in &g.cases {
            let encodes = ctx.tokenizer.encode_prompt(&c.prompt)? == c.prompt_ids;
            let mut seq = c.prompt_ids.clone();
            seq.extend_from_slice(&c.token_ids[..c.token_ids.len() - 1]);
            let first = c.prompt_ids.len() - 1;
            let logits = engine.score(dev, &seq, first..seq.len())?;
            let mut r = CaseReport { encodes, must_match: c.must_match, ..CaseReport::default() };
            for (i, row) in logits.chunks_exact(vocab).enumerate() {
                if c.gaps[i] >= g.tie_gap {
                    r.forced_clear += 1;
                    r.forced_margins.push((i, margin(row, c.token_ids[i] as usize)));
                    if argmax(row) == c.token_ids[i] as usize {
                        r.forced_agree += 1;
                    } else {
                        r.forced_wrong.push(i);
                    }
                }
            }
            reports.push(r);
        }
        let forced_secs = t0.elapsed().as_secs_f64();
        let requests = g
            .cases
            .iter()
            .map(|c| {
                let max_tokens = if self.full { c.token_ids.len() } else { c.must_match.max(1) };
                Request::greedy(c.prompt_ids.clone(), max_tokens)
            })
            .collect();
        let t1 = Instant::now();
        let done = engine.run(dev, requests, |_| {})?;
        let free_secs = t1.elapsed().as_secs_f64();
        for ((c, r), d) in g.cases.iter().zip(&mut reports).zip(&done) {
            r.free_len = d.tokens.len();
            r.free_prefix = d.tokens.iter().zip(&c.token_ids).take_while(|(a, b)| a == b).count();
        }
        for (i, (c, r)) in g.cases.iter().zip(&reports).enumerate() {
            println!(
                "case {i} {:?}: encode {}, free-running {}/{} (must match {}), teacher-forced {}/{} clear \
                 positions{}{}: {}",
                truncate(&c.prompt, 32),
                if r.encodes { "ok" } else { "DIFFERS" },
                r.free_prefix,
                r.free_len,
                r.must_match,
                r.forced_agree,
                r.forced_clear,
                wrong_positions(&r.forced_wrong, &c.gaps),
                closest_position(r.closest(), &c.gaps),
                if r.passed() { "PASS" } else { "FAIL" }
            );
        }
        let agree: usize = reports.iter().map(|r| r.forced_agree).sum();
        let clear: usize = reports.iter().map(|r| r.forced_clear).sum();
        println!(
            "parity on {}: teacher-forced {agree}/{clear} clear positions agree ({forced_secs:.1} s); free-running \
             {} case(s) ({free_secs:.1} s)",
            ctx.device,
            reports.len()
        );
        Ok(reports)
    }
}

/// The teacher-forced positions a case got wrong, each with llama.cpp's
/// top-1 minus top-2 logit gap there (empty when none): ` (wrong at [56]
/// gap 0.375)`.
fn wrong_positions(wrong: &[usize], gaps: &[f64]) -> String {
    if wrong.is_empty() {
        return String::new();
    }
    let each: Vec<String> = wrong.iter().map(|&i| format!("[{i}] gap {:.3}", gaps[i])).collect();
    format!(" (wrong at {})", each.join(", "))
}

/// Every case's teacher-forced clear positions as JSON, `[{"case": i,
/// "margins": [[position, our margin, llama.cpp's gap], ...]}, ...]`
/// (`parity --margins`).
pub fn margins_json(golden: &Golden, reports: &[CaseReport]) -> serde_json::Value {
    let cases = reports.iter().zip(&golden.cases).enumerate().map(|(i, (r, c))| {
        let rows: Vec<serde_json::Value> =
            r.forced_margins.iter().map(|&(p, m)| serde_json::json!([p, m, c.gaps[p]])).collect();
        serde_json::json!({ "case": i, "margins": rows })
    });
    serde_json::Value::Array(cases.collect())
}

/// The logit of token `tok` minus the largest other logit of `row`.
fn margin(row: &[f32], tok: usize) -> f32 {
    let other =
        row.iter().enumerate().filter(|&(j, _)| j != tok).map(|(_, &x)| x).fold(f32::NEG_INFINITY, f32::max);
    row[tok] - other
}

/// The clear position of a case where our margin for llama.cpp's token is
/// the smallest: `, closest [56] margin -0.012 (gap 0.375)`; empty when the
/// case has no clear position.
fn closest_position(closest: Option<(usize, f32)>, gaps: &[f64]) -> String {
    closest.map_or(String::new(), |(i, m)| format!(", closest [{i}] margin {m:.3} (gap {:.3})", gaps[i]))
}

/// The first `n` characters of `s`, with an ellipsis when cut.
fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}...", s.chars().take(n).collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::{LoadOptions, run_task};

    #[test]
    fn wrong_positions_name_their_gaps() {
        assert_eq!(wrong_positions(&[], &[1.0]), "");
        assert_eq!(
            wrong_positions(&[1, 3], &[0.1, 0.3754, 0.2, 2.0]),
            " (wrong at [1] gap 0.375, [3] gap 2.000)"
        );
    }

    #[test]
    fn the_closest_position_is_the_smallest_margin() {
        assert_eq!(margin(&[1.0, 3.0, 2.5], 1), 0.5);
        assert_eq!(margin(&[1.0, 3.0, 2.5], 2), -0.5);
        let r =
            CaseReport { forced_margins: vec![(3, 0.25), (7, -0.125), (9, 2.0)], ..CaseReport::default() };
        assert_eq!(r.closest(), Some((7, -0.125)));
        let gaps = [0.0; 10].map(|_| 0.5);
        assert_eq!(closest_position(r.closest(), &gaps), ", closest [7] margin -0.125 (gap 0.500)");
        assert_eq!(closest_position(None, &gaps), "");
    }

    #[test]
    fn margins_json_lists_each_clear_position_with_its_gap() {
        let g = Golden::parse(
            r#"{"tie_gap": 0.3, "cases": [
                {"prompt": "a", "prompt_ids": [1], "token_ids": [2, 3, 4], "top2_gaps": [0.5, 0.1, 1.25], "must_match": 1},
                {"prompt": "b", "prompt_ids": [5], "token_ids": [6], "top2_gaps": [0.75], "must_match": 1}]}"#,
        )
        .unwrap();
        let reports = [
            CaseReport { forced_margins: vec![(0, 0.25), (2, -0.5)], ..CaseReport::default() },
            CaseReport { forced_margins: vec![(0, 1.0)], ..CaseReport::default() },
        ];
        assert_eq!(
            margins_json(&g, &reports).to_string(),
            r#"[{"case":0,"margins":[[0,0.25,0.5],[2,-0.5,1.25]]},{"case":1,"margins":[[0,1.0,0.75]]}]"#
        );
    }

    #[test]
    fn parses_the_golden_file_and_rejects_broken_ones() {
        let g = Golden::bundled();
        assert_eq!(g.cases.len(), 4);
        assert!((g.tie_gap - 0.35).abs() < 1e-12);
        let clear: usize = g.cases.iter().map(|c| c.gaps.iter().filter(|&&x| x >= g.tie_gap).count()).sum();
        assert_eq!(clear, 217);
        for c in &g.cases {
            // must_match is the first position whose gap is below tie_gap.
            let first = c.gaps.iter().position(|&x| x < g.tie_gap).unwrap_or(c.gaps.len());
            assert_eq!(c.must_match, first);
        }
        assert!(Golden::parse("[]").is_err());
        assert!(Golden::parse(r#"{"tie_gap": 0.3, "cases": [{"prompt": "a"}]}"#).is_err());
        let short = r#"{"tie_gap": 0.3, "cases": [{"prompt": "a", "prompt_ids": [1], "token_ids": [2, 3],
            "top2_gaps": [1.0], "must_match": 1}]}"#;
        assert!(Golden::parse(short).unwrap_err().contains("inconsistent"));
    }

    /// Both golden rules on the real model through the native CPU backend,
    /// free-running the whole continuation of every case (the model is
    /// fetched by `make model`, which `make test` runs first).
    #[test]
    fn smollm2_meets_both_golden_rules_on_the_native_backend() {
        let opts = LoadOptions::native_test(256, 32);
        let golden = Golden::bundled();
        let lens: Vec<usize> = golden.cases.iter().map(|c| c.token_ids.len()).collect();
        let reports = run_task(&opts, Parity { golden, full: true }).unwrap();
        assert_eq!(reports.len(), 4);
        for (i, r) in reports.iter().enumerate() {
            assert!(r.passed(), "case {i}: {r:?}");
            assert_eq!(r.free_len, lens[i]);
        }
        assert_eq!(reports.iter().map(|r| r.forced_clear).sum::<usize>(), 217);
    }

    /// A golden token id outside the model's vocabulary is a usage error
    /// naming the case, before anything runs (the last continuation token
    /// is never fed to the model, only looked up in the logits).
    #[test]
    fn golden_token_ids_outside_the_vocabulary_are_refused() {
        let mut golden = Golden::bundled();
        let last = golden.cases[2].token_ids.len() - 1;
        golden.cases[2].token_ids[last] = 49152;
        let err = run_task(&LoadOptions::native_test(256, 32), Parity { golden, full: false }).unwrap_err();
        assert!(
            matches!(&err, Error::Usage(m) if m.contains("case 2: token id 49152") && m.contains("49152")),
            "{err}"
        );
    }

    /// Both golden rules on each synthetic architecture
    /// (`gguf::tiny::synth_arch`: Llama 3, Mistral, Qwen2.5, Qwen3) through
    /// the native CPU backend, against llama.cpp's goldens of the same files
    /// (`runtime/tests/data/synth-*.json`, written by `make golden-synth`).
    /// The model is written from its description (the vocabulary from
    /// `models/vocab/`, fetched by `make vocab`), so it is the golden's file
    /// byte for byte.
    #[test]
    fn synthetic_architectures_meet_both_golden_rules_on_the_native_backend() {
        use crate::gguf::tiny::{SYNTH_ARCHS, synth_arch, synth_arch_vocab};
        use crate::gguf::{Gguf, Vocab};
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let mut clear = Vec::new();
        for name in SYNTH_ARCHS {
            let vocab_path = root.join("../models/vocab").join(synth_arch_vocab(name).unwrap());
            assert!(vocab_path.is_file(), "{} is missing: run `make vocab`", vocab_path.display());
            let vocab = Vocab::from_metadata(Gguf::open(&vocab_path).unwrap().metadata()).unwrap();
            let bytes = synth_arch(name, vocab).unwrap().to_bytes().unwrap();
            let model =
                std::env::temp_dir().join(format!("tessera-synth-{name}-{}.gguf", std::process::id()));
            std::fs::write(&model, bytes).unwrap();
            let golden = Golden::load(&root.join(format!("tests/data/synth-{name}.json"))).unwrap();
            let opts = LoadOptions { model: model.clone(), ..LoadOptions::native_test(256, 32) };
            let reports = run_task(&opts, Parity { golden, full: false });
            std::fs::remove_file(&model).unwrap();
            let reports = reports.unwrap();
            for (i, r) in reports.iter().enumerate() {
                assert!(r.passed(), "{name} case {i}: {r:?}");
            }
            clear.push(reports.iter().map(|r| r.forced_clear).sum::<usize>());
        }
        // Teacher-forced positions with a clear llama.cpp gap, per architecture.
        assert_eq!(clear, [51, 53, 47, 60]);
    }

    /// Both golden rules on the bundled model requantized by llama.cpp
    /// (`make kquant-models`), through the native CPU backend, against
    /// llama.cpp's goldens of the same files (`make golden-kquant`):
    /// Q4_K_M, Q6_K, Q8_0 and F16 (K-quant, Q5_0/Q8_0 fallback and float
    /// matrices, Q8_0 and F16 tables). Q5_K_M is not in the list: it breaks
    /// the teacher-forced rule at one position (case 2, token 15, llama.cpp
    /// gap 0.51; 58 of 59 clear positions agree), where the exact f64
    /// forward of the file's weights ranks the tokens as we do
    /// (`model::tests::q5_k_m_parity_violation_is_not_ours`). Files that are
    /// absent are skipped with a message.
    #[test]
    fn requantized_models_meet_both_golden_rules_on_the_native_backend() {
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        for (t, clear) in [("Q4_K_M", 59), ("Q6_K", 58), ("Q8_0", 53), ("F16", 51)] {
            let Some(model) = crate::check::model::requantized_model(t) else { continue };
            let name = format!("tests/data/smollm2-135m-{}.json", t.to_lowercase());
            let golden = Golden::load(&root.join(name)).unwrap();
            let opts = LoadOptions { model, ..LoadOptions::native_test(256, 32) };
            let reports = run_task(&opts, Parity { golden, full: false }).unwrap();
            for (i, r) in reports.iter().enumerate() {
                assert!(r.passed(), "{t} case {i}: {r:?}");
            }
            assert_eq!(reports.iter().map(|r| r.forced_clear).sum::<usize>(), clear, "{t}");
        }
    }
}
