//! Constrained decoding in the engine on the tiny random Llama and the CPU
//! interpreter: outputs match their grammar (alone, in a mixed batch, under
//! preemption, with speculation), unconstrained rows are bitwise unchanged by
//! constrained neighbours, stop tokens only where the grammar accepts, and a
//! grammar that allows nothing ends the request with `FinishReason::Grammar`.

use super::*;
use crate::check::model::tiny_model;
use crate::gguf::tiny::{tiny_vocab, tiny_vocab_min_size};
use crate::grammar::{GrammarCompiler, GrammarSpec};
use crate::tokenizer::Tokenizer;
use dsl_core::interp::Cpu;

fn engine(cpu: &mut Cpu, num_blocks: usize) -> Engine<Cpu, f32> {
    super::tests::engine_over(cpu, &tiny_model().unwrap(), num_blocks, (8, 64, 64))
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_vocab(&tiny_vocab(tiny_vocab_min_size()).unwrap()).unwrap()
}

/// What every test starts from: the tokenizer, the CPU device, an engine
/// with 64 KV blocks and a grammar compiler for the model's vocabulary.
fn setup() -> (Tokenizer, Cpu, Engine<Cpu, f32>, GrammarCompiler) {
    let tok = tokenizer();
    let mut cpu = Cpu::new();
    let e = engine(&mut cpu, 64);
    let g = GrammarCompiler::new(&tok, e.model().weights.config.vocab_size).unwrap();
    (tok, cpu, e, g)
}

/// The end token of the tiny vocabulary (`<|im_end|>`).
const EOS: u32 = 2;

fn prompt(i: u32, n: u32) -> Vec<u32> {
    (0..n).map(|j| (j * 29 + 13 * i + 5) % 250 + 3).collect()
}

fn request(prompt: Vec<u32>, max_tokens: usize, constraint: Option<crate::grammar::Constraint>) -> Request {
    Request { prompt, params: SamplingParams::default(), max_tokens, stop_tokens: vec![EOS], constraint }
}

/// A regex with a bounded length: every output must finish with EOS.
const REGEX: &str = "(ab|ba|[0-9]){2,5}x";

fn matches_regex(text: &str) -> bool {
    let (body, last) = text.split_at(text.len().saturating_sub(1));
    if last != "x" {
        return false;
    }
    let mut n = 0;
    let mut rest = body;
    while !rest.is_empty() {
        if rest.starts_with("ab") || rest.starts_with("ba") {
            rest = &rest[2..];
        } else if rest.as_bytes()[0].is_ascii_digit() {
            rest = &rest[1..];
        } else {
            return false;
        }
        n += 1;
    }
    (2..=5).contains(&n)
}

fn constrained_batch(e: &mut Engine<Cpu, f32>, cpu: &mut Cpu, g: &GrammarCompiler) -> Vec<Completion> {
    let spec = GrammarSpec::Regex(REGEX.into());
    let reqs = (0..6)
        .map(|i| {
            let c = (i % 2 == 0).then(|| g.compile(&spec).unwrap());
            request(prompt(i, 3 + 7 * i), 20, c)
        })
        .collect();
    e.run(cpu, reqs, |_| {}).unwrap()
}

#[test]
fn constrained_outputs_match_and_unconstrained_rows_are_untouched() {
    let (tok, mut cpu, mut e, g) = setup();
    let mixed = constrained_batch(&mut e, &mut cpu, &g);
    for (i, c) in mixed.iter().enumerate() {
        if i % 2 == 0 {
            let text = tok.decode(&c.tokens, false).unwrap();
            assert!(matches_regex(&text), "request {i}: {text:?}");
            assert_eq!(c.finish, FinishReason::StopToken(EOS), "request {i}: {text:?}");
            assert!(c.logprobs.iter().all(|l| l.is_finite() && *l <= 0.0));
        }
    }
    // The unconstrained requests alone: bitwise the same tokens and logprobs.
    for i in [1u32, 3, 5] {
        let mut e = engine(&mut cpu, 64);
        let alone = e.run(&mut cpu, vec![request(prompt(i, 3 + 7 * i), 20, None)], |_| {}).unwrap();
        let m = &mixed[i as usize];
        assert_eq!(alone[0].tokens, m.tokens, "request {i}");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&alone[0].logprobs), bits(&m.logprobs), "request {i}");
    }
    // A constrained request alone gives what it gave in the batch.
    let mut alone = engine(&mut cpu, 64);
    let c = g.compile(&GrammarSpec::Regex(REGEX.into())).unwrap();
    let one = alone.run(&mut cpu, vec![request(prompt(2, 17), 20, Some(c))], |_| {}).unwrap();
    assert_eq!(one[0].tokens, mixed[2].tokens);
}

#[test]
fn preemption_and_speculation_keep_the_constraint() {
    let (tok, mut cpu, mut roomy, g) = setup();
    let want = constrained_batch(&mut roomy, &mut cpu, &g);
    // Few blocks: requests are preempted and recompute their history.
    let mut tight = engine(&mut cpu, 5);
    let got = constrained_batch(&mut tight, &mut cpu, &g);
    assert!(tight.stats().preemptions > 0, "{:?}", tight.stats());
    for (i, (a, b)) in want.iter().zip(&got).enumerate() {
        assert_eq!(a.tokens, b.tokens, "request {i}");
        assert_eq!(a.finish, b.finish, "request {i}");
    }
    // Prompt-lookup drafts and drafts the grammar rejects (a constant
    // letter): cut before verification, the output is unchanged.
    let mut spec = engine(&mut cpu, 64);
    spec.set_speculation(Some(crate::spec::SpecConfig::ngram(3))).unwrap();
    let got = constrained_batch(&mut spec, &mut cpu, &g);
    let tokens = |v: &[Completion]| v.iter().map(|c| c.tokens.clone()).collect::<Vec<_>>();
    assert_eq!(tokens(&got), tokens(&want));
    struct Constant(u32);
    impl crate::spec::Drafter<Cpu> for Constant {
        fn propose(&mut self, _dev: &mut Cpu, requests: &[(&[u32], usize)]) -> Result<Vec<Vec<u32>>> {
            Ok(requests.iter().map(|&(_, k)| vec![self.0; k]).collect())
        }
    }
    let digit = tok.encode("7", false).unwrap()[0];
    for t in [digit, tok.encode("q", false).unwrap()[0]] {
        let mut spec = engine(&mut cpu, 64);
        spec.set_drafter(4, Box::new(Constant(t))).unwrap();
        let got = constrained_batch(&mut spec, &mut cpu, &g);
        for (i, (a, b)) in want.iter().zip(&got).enumerate() {
            assert_eq!(a.tokens, b.tokens, "request {i}, drafts of {t}");
        }
    }
}

#[test]
fn a_grammar_that_allows_nothing_ends_the_request() {
    let (tok, mut cpu, mut e, g) = setup();
    let c = g.compile(&GrammarSpec::Lark("start: \"ok\"\n".into())).unwrap();
    // No stop tokens: after "ok" nothing is allowed.
    let req = Request {
        prompt: prompt(1, 5),
        params: SamplingParams::default(),
        max_tokens: 10,
        stop_tokens: Vec::new(),
        constraint: Some(c),
    };
    let mut events = Vec::new();
    let done = e.run(&mut cpu, vec![req], |ev| events.push(*ev)).unwrap();
    assert_eq!(tok.decode(&done[0].tokens, false).unwrap(), "ok");
    assert_eq!(done[0].finish, FinishReason::Grammar);
    let last = events.last().unwrap();
    assert_eq!((last.token, last.finish), (None, Some(FinishReason::Grammar)));
    assert!(!e.has_unfinished());
}

#[test]
fn emitted_tokens_reach_the_grammar_at_the_next_step_and_a_rejection_sticks() {
    let (tok, _, _, g) = setup();
    let id = |s: &str| tok.encode(s, false).unwrap()[0];
    let mut guide = Guide::new(g.compile(&GrammarSpec::Lark("start: \"a\" \"b\"\n".into())).unwrap());
    // Nothing pending: the state is the start, where "b" is rejected.
    assert!(guide.catch_up());
    assert_eq!(guide.constraint.valid_prefix(&[id("b")]), 0);
    guide.pending.push(id("a"));
    assert_eq!(guide.constraint.valid_prefix(&[id("b")]), 0, "pending tokens wait for catch_up");
    assert!(guide.catch_up());
    assert!(guide.pending.is_empty());
    assert_eq!(guide.constraint.valid_prefix(&[id("b")]), 1);
    // "a" again is rejected; the guide stays rejected with nothing pending.
    guide.pending.extend([id("a"), id("b")]);
    assert!(!guide.catch_up());
    assert!(guide.pending.is_empty());
    assert!(!guide.catch_up());
}
