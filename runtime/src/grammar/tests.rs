//! The grammar plumbing on the tiny test vocabulary and on hand-made
//! vocabularies: masks, stop tokens, rollback, draft prefixes, errors.

use super::*;
use crate::gguf::tiny::{tiny_vocab, tiny_vocab_min_size};

/// The tiny model's byte-level BPE vocabulary (control tokens 0..3, the
/// byte tokens, a few merges; `<|im_end|>` = 2 is EOS).
fn tokenizer() -> Tokenizer {
    Tokenizer::from_vocab(&tiny_vocab(tiny_vocab_min_size()).unwrap()).unwrap()
}

fn allowed(mask: &[u32], t: u32) -> bool {
    mask[t as usize / 32] >> (t % 32) & 1 == 1
}

#[test]
fn json_schema_masks_follow_the_output() {
    let tok = tokenizer();
    let n = tok.vocab_size();
    let g = GrammarCompiler::new(&tok, n + 5).unwrap();
    let schema =
        serde_json::json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]});
    let mut c = g.compile(&GrammarSpec::JsonSchema(schema)).unwrap();
    let eos = tok.eos().unwrap();
    let mut mask = vec![0u32; mask_words(n + 5)];
    assert!(c.fill_mask(&[eos], &mut mask));
    let brace = tok.encode("{", false).unwrap();
    assert!(allowed(&mask, brace[0]));
    assert!(!allowed(&mask, eos), "the end token before the object is complete");
    for t in n as u32..n as u32 + 5 {
        assert!(!allowed(&mask, t), "ids past the tokenizer are never allowed");
    }
    let x = tok.encode("x", false).unwrap();
    assert!(!allowed(&mask, x[0]));
    // Feed a complete object, byte token by byte token.
    for t in tok.encode("{\"a\": 12}", false).unwrap() {
        c.fill_mask(&[eos], &mut mask);
        assert!(allowed(&mask, t), "token {t} should be allowed");
        c.consume(t).unwrap();
    }
    assert!(c.is_accepting());
    assert!(c.fill_mask(&[eos], &mut mask));
    assert!(allowed(&mask, eos), "the end token once the object is complete");
    assert!(c.consume(x[0]).is_err());
}

#[test]
fn rollback_and_draft_prefixes() {
    let tok = tokenizer();
    let g = GrammarCompiler::new(&tok, tok.vocab_size()).unwrap();
    let mut c = g.compile(&GrammarSpec::Regex("ab+c".into())).unwrap();
    let ids = |s: &str| tok.encode(s, false).unwrap();
    let (a, b, cc) = (ids("a")[0], ids("b")[0], ids("c")[0]);
    assert_eq!(c.valid_prefix(&[a, b, b, a, cc]), 3);
    assert_eq!(c.valid_prefix(&[b]), 0);
    c.consume(a).unwrap();
    c.consume(b).unwrap();
    c.rollback(1).unwrap();
    assert_eq!(c.valid_prefix(&[b, cc]), 2);
    assert!(!c.is_accepting());
}

#[test]
fn invalid_specs_are_usage_errors_with_the_reason() {
    let tok = tokenizer();
    let g = GrammarCompiler::new(&tok, tok.vocab_size()).unwrap();
    for spec in [
        GrammarSpec::Lark("start: foo\n".into()),
        GrammarSpec::Regex("(".into()),
        GrammarSpec::JsonSchema(serde_json::json!({"type": "no-such-type"})),
    ] {
        match g.compile(&spec) {
            Err(Error::Usage(m)) => assert!(m.starts_with("invalid"), "{m}"),
            other => panic!("{spec:?}: {other:?}"),
        }
    }
    assert!(GrammarCompiler::new(&tok, tok.vocab_size() - 1).is_err());
}

#[test]
fn a_finished_grammar_allows_only_the_stop_tokens() {
    let tok = tokenizer();
    let n = tok.vocab_size();
    let g = GrammarCompiler::new(&tok, n).unwrap();
    let mut c = g.compile(&GrammarSpec::Lark("start: \"ok\"\n".into())).unwrap();
    for t in tok.encode("ok", false).unwrap() {
        c.consume(t).unwrap();
    }
    let mut mask = vec![0u32; mask_words(n)];
    // No stop tokens: nothing is allowed (the engine ends the request).
    assert!(!c.fill_mask(&[], &mut mask));
    let stops = [1u32, 2];
    assert!(c.fill_mask(&stops, &mut mask));
    let set: Vec<u32> = (0..n as u32).filter(|&t| allowed(&mask, t)).collect();
    assert_eq!(set, stops);
}
