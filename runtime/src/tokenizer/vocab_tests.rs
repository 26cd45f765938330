//! Tests of every supported vocabulary type against llama.cpp: the
//! vocabulary-only GGUF files of llama.cpp's own tokenizer tests
//! (`models/vocab/`, fetched by `.ci/fetch-vocab`) must give exactly
//! llama.cpp's ids for its test inputs (`.gguf.inp`, `.gguf.out`) and for 200
//! varied texts (`tests/data/vocab/vocab-cases.json`, made by
//! `vocab-cases.py` with llama.cpp itself; the 57 with `<`, `[` or `▁` also
//! with `parse_special`), and llama.cpp's ids must decode to llama.cpp's text.
//! The files missing is a failure, not a skip.

use super::*;
use std::path::PathBuf;

/// The path of `models/vocab/<name>`, or a panic telling how to fetch it.
fn vocab_file(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/vocab").join(name);
    assert!(
        path.is_file(),
        "{} is missing: run `.ci/fetch-vocab` (or `make vocab`) from the workspace root to download it",
        path.display()
    );
    path
}

fn tokenizer(vocab: &str) -> Tokenizer {
    let gguf = Gguf::open(vocab_file(&format!("ggml-vocab-{vocab}.gguf"))).unwrap();
    Tokenizer::from_gguf(&gguf).unwrap()
}

/// llama.cpp's test inputs for `vocab` (`inputs`: the vocabulary whose
/// `.gguf.inp` it uses; most share one) and the expected ids, parsed as
/// llama.cpp's `test-tokenizer-0` does.
fn llama_cpp_cases(vocab: &str, inputs: &str) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(vocab_file(&format!("ggml-vocab-{inputs}.gguf.inp"))).unwrap();
    let out = std::fs::read_to_string(vocab_file(&format!("ggml-vocab-{vocab}.gguf.out"))).unwrap();
    let sep = "\n__ggml_vocab_test__\n";
    let mut inputs = Vec::new();
    let mut rest = inp.as_str();
    while !rest.is_empty() {
        match rest.find(sep) {
            Some(i) => {
                inputs.push(rest[..i].to_string());
                rest = &rest[i + sep.len()..];
            }
            None => {
                inputs.push(rest.to_string());
                rest = "";
            }
        }
    }
    let outputs: Vec<Vec<u32>> =
        out.lines().map(|l| l.split_whitespace().map(|x| x.parse().unwrap()).collect()).collect();
    assert_eq!(inputs.len(), outputs.len(), "{vocab}: inputs and outputs differ in number");
    inputs.into_iter().zip(outputs).collect()
}

fn vocab_cases() -> &'static serde_json::Value {
    static CASES: std::sync::OnceLock<serde_json::Value> = std::sync::OnceLock::new();
    CASES.get_or_init(|| {
        serde_json::from_str(include_str!("../../tests/data/vocab/vocab-cases.json")).unwrap()
    })
}

/// Checks `vocab` against llama.cpp's test cases, the 200 texts, and the
/// special-token-looking ones among them with `parse_special`; returns the
/// numbers of cases checked.
fn check_vocab(vocab: &str, inputs: &str) -> (usize, usize, usize) {
    let t = tokenizer(vocab);
    let mut failures = Vec::new();
    let cases = llama_cpp_cases(vocab, inputs);
    for (text, expected) in &cases {
        let ids = t.encode(text, false).unwrap();
        if &ids != expected {
            failures.push(format!("llama.cpp case {text:?}: got {ids:?}, llama.cpp {expected:?}"));
        }
    }
    let data = vocab_cases();
    let texts = data["texts"].as_array().unwrap();
    let v = &data["vocabs"][vocab];
    let all_ids = v["ids"].as_array().unwrap();
    assert_eq!((texts.len(), all_ids.len()), (200, 200), "{vocab}");
    for (i, (text, expected)) in texts.iter().zip(all_ids).enumerate() {
        let text = text.as_str().unwrap();
        let expected: Vec<u32> =
            expected.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let ids = t.encode(text, false).unwrap();
        if ids != expected {
            failures.push(format!("text {i} {text:?}: got {ids:?}, llama.cpp {expected:?}"));
        }
        let detok = v["detok"].get(i.to_string()).map_or(text, |d| d.as_str().unwrap());
        let ours = t.decode(&expected, false).unwrap();
        if ours != detok {
            failures
                .push(format!("decode of text {i}'s ids {expected:?}: got {ours:?}, llama.cpp {detok:?}"));
        }
    }
    let special = v["parse_special_ids"].as_object().unwrap();
    for (i, expected) in special {
        let text = texts[i.parse::<usize>().unwrap()].as_str().unwrap();
        let expected: Vec<u32> =
            expected.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let ids = t.encode(text, true).unwrap();
        if ids != expected {
            failures
                .push(format!("text {i} {text:?} with parse_special: got {ids:?}, llama.cpp {expected:?}"));
        }
    }
    assert!(failures.is_empty(), "{vocab}: {} mismatches:\n{}", failures.len(), failures.join("\n"));
    (cases.len(), texts.len(), special.len())
}

macro_rules! vocab_tests {
    ($($name:ident: $vocab:literal, $inputs:literal, $n:literal;)*) => {$(
        #[test]
        fn $name() {
            assert_eq!(check_vocab($vocab, $inputs), ($n, 200, 57));
        }
    )*};
}

vocab_tests! {
    llama3_bpe_matches_llama_cpp: "llama-bpe", "llama-spm", 46;
    qwen2_matches_llama_cpp: "qwen2", "llama-spm", 46;
    qwen35_matches_llama_cpp: "qwen35", "qwen35", 50;
    deepseek_llm_matches_llama_cpp: "deepseek-llm", "llama-spm", 46;
    deepseek_coder_matches_llama_cpp: "deepseek-coder", "llama-spm", 46;
    gpt2_matches_llama_cpp: "gpt-2", "llama-spm", 46;
    mpt_matches_llama_cpp: "mpt", "llama-spm", 46;
    starcoder_matches_llama_cpp: "starcoder", "llama-spm", 46;
    refact_matches_llama_cpp: "refact", "llama-spm", 46;
    llama_spm_matches_llama_cpp: "llama-spm", "llama-spm", 46;
    phi3_spm_matches_llama_cpp: "phi-3", "llama-spm", 46;
}

/// BOS is added as llama.cpp does: by `add_bos_token`, else by default for
/// SentencePiece and Llama 3 and not for other BPE vocabularies.
#[test]
fn bos_follows_llama_cpp_defaults() {
    for (vocab, add_bos, bos) in
        [("llama-bpe", true, 128000), ("qwen2", false, 151643), ("llama-spm", true, 1)]
    {
        let t = tokenizer(vocab);
        assert_eq!((t.add_bos(), t.bos()), (add_bos, Some(bos)), "{vocab}");
        let ids = t.encode_prompt("Hello").unwrap();
        assert_eq!(ids[0] == bos, add_bos, "{vocab}: {ids:?}");
    }
}

/// SentencePiece: `▁` renders as a space, a character without a token is
/// byte tokens that stream as one character, control tokens render only on
/// request.
#[test]
fn sentencepiece_decodes_and_streams() {
    let t = tokenizer("llama-spm");
    let text = "a 𝔘 b";
    let ids = t.encode(text, false).unwrap();
    assert_eq!(t.decode(&ids, false).unwrap(), " a 𝔘 b");
    let bytes: Vec<u32> =
        ids.iter().copied().filter(|&id| t.token_bytes(id, false).unwrap().len() == 1).collect();
    assert!(bytes.len() >= 4, "{ids:?}");
    let mut d = t.detokenizer(false);
    let mut out = String::new();
    for &id in &ids {
        let piece = d.push(id).unwrap();
        assert!(!piece.contains(char::REPLACEMENT_CHARACTER));
        out.push_str(&piece);
    }
    assert_eq!(out + &d.finish(), " a 𝔘 b");
    let ids = t.encode("<s>hi</s>", true).unwrap();
    assert_eq!((ids[0], ids[ids.len() - 1]), (1, 2));
    assert_eq!(t.decode(&ids, true).unwrap(), "<s> hi</s>");
    assert_eq!(t.decode(&ids, false).unwrap(), " hi");
    assert!(t.is_eog(2));
}
