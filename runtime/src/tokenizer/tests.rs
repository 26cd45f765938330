//! Tests of the tokenizer: the golden prompts of llama.cpp encode to exactly
//! their ids with SmolLM2's real vocabulary, decoding round-trips arbitrary
//! text, the streaming detokenizer agrees with a full decode, and a tiny
//! vocabulary built by the GGUF writer tokenizes as its merges say.

use super::*;
use crate::gguf::tests::real_model_path;
use crate::gguf::tiny::{TinyLlama, tiny_vocab, tiny_vocab_min_size};
use proptest::prelude::*;
use std::sync::OnceLock;

/// SmolLM2's tokenizer, built once per test binary.
fn smollm2() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let gguf = Gguf::open(real_model_path()).unwrap();
        Tokenizer::from_gguf(&gguf).unwrap()
    })
}

fn golden() -> serde_json::Value {
    serde_json::from_str(include_str!("../../tests/data/smollm2-135m-q4_1.json")).unwrap()
}

fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// llama.cpp's prompt ids (no BOS) for every golden case, including the chat
/// prompt whose control tokens must be parsed.
#[test]
fn golden_prompts_encode_to_llama_cpp_ids() {
    let t = smollm2();
    let golden = golden();
    let cases = golden["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 4);
    for case in cases {
        let prompt = case["prompt"].as_str().unwrap();
        let expected = ids_of(&case["prompt_ids"]);
        assert_eq!(t.encode(prompt, true).unwrap(), expected, "{prompt:?}");
        assert_eq!(t.encode_prompt(prompt).unwrap(), expected, "{prompt:?}");
        assert_eq!(t.decode(&expected, true).unwrap(), prompt);
    }
}

/// 214 texts (hand-picked edge cases: whitespace runs, digits, contractions,
/// scripts, emoji, code, control-token text; and random mixes) tokenized and
/// detokenized by llama.cpp itself (`tests/data/smollm2-tokenizer-cases.json`,
/// from llama-cpp-python with the vocabulary only), with and without special
/// parsing: ids and text must match exactly.
#[test]
fn llama_cpp_tokenizer_cases() {
    let t = smollm2();
    let data: serde_json::Value =
        serde_json::from_str(include_str!("../../tests/data/smollm2-tokenizer-cases.json")).unwrap();
    let cases = data["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 428);
    let mut failures = Vec::new();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let special = case["parse_special"].as_bool().unwrap();
        let expected = ids_of(&case["ids"]);
        let ids = t.encode(text, special).unwrap();
        if ids != expected {
            failures.push(format!("{text:?} (special {special}): got {ids:?}, llama.cpp {expected:?}"));
        }
        let detok = t.decode(&expected, false).unwrap();
        if detok != case["detok"].as_str().unwrap() {
            failures.push(format!("decode of {expected:?}: got {detok:?}, llama.cpp {:?}", case["detok"]));
        }
    }
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

/// llama.cpp's generated ids decode to its generated text.
#[test]
fn golden_continuations_decode_to_llama_cpp_text() {
    let t = smollm2();
    for case in golden()["cases"].as_array().unwrap() {
        let ids = ids_of(&case["token_ids"]);
        assert_eq!(t.decode(&ids, false).unwrap(), case["text"].as_str().unwrap());
    }
}

fn pieces(t: &Tokenizer, text: &str) -> Vec<String> {
    t.encode(text, false).unwrap().iter().map(|&id| t.decode(&[id], true).unwrap()).collect()
}

/// The pieces of the HF pre-tokenizer (byte-level characters: `Ġ` is a space).
fn pre_pieces(t: &Tokenizer, text: &str) -> Vec<String> {
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
    let mut pre = PreTokenizedString::from(text);
    t.hf().unwrap().get_pre_tokenizer().unwrap().pre_tokenize(&mut pre).unwrap();
    pre.get_splits(OffsetReferential::Original, OffsetType::Byte)
        .into_iter()
        .map(|(s, _, _)| s.to_string())
        .collect()
}

/// The `smollm` pre-tokenizer: each number character is its own piece, spaces
/// attach to the following word, whitespace runs leave one space for the word.
#[test]
fn smollm_pre_tokenizer_splits() {
    let t = smollm2();
    assert_eq!(pieces(t, "12345"), ["1", "2", "3", "4", "5"]);
    assert_eq!(pieces(t, "in 2024!"), ["in", " ", "2", "0", "2", "4", "!"]);
    assert_eq!(pieces(t, "Hello world"), ["Hello", " world"]);
    assert_eq!(pieces(t, "a  b"), ["a", " ", " b"]);
    assert_eq!(pre_pieces(t, "x\n\n  y"), ["x", "ĊĊĠ", "Ġy"]);
    assert_eq!(pre_pieces(t, "v1.25 is"), ["v", "1", ".", "2", "5", "Ġis"]);
    assert_eq!(pre_pieces(t, "a \t b  "), ["a", "Ġĉ", "Ġb", "ĠĠ"]);
    assert_eq!(pieces(t, "don't"), ["don", "'t"]);
    assert!(t.encode("", true).unwrap().is_empty());
}

/// Control tokens are ids with `parse_special` and plain text without; either
/// way the text round-trips when special tokens are rendered.
#[test]
fn control_tokens() {
    let t = smollm2();
    let text = "<|im_start|>user\nHi<|im_end|>";
    let ids = t.encode(text, true).unwrap();
    assert_eq!((ids[0], ids[ids.len() - 1]), (1, 2));
    assert_eq!(t.decode(&ids, true).unwrap(), text);
    assert_eq!(t.decode(&ids, false).unwrap(), "user\nHi");
    let plain = t.encode(text, false).unwrap();
    assert!(!plain.contains(&1) && !plain.contains(&2), "{plain:?}");
    assert_eq!(t.decode(&plain, false).unwrap(), text);
    assert!(t.is_eog(2) && t.is_eog(0) && !t.is_eog(1));
    assert_eq!(t.eog_tokens(), [0, 2]);
    assert_eq!((t.bos(), t.eos(), t.vocab_size()), (Some(1), Some(2), 49152));
}

const SAMPLES: [&str; 9] = [
    "Здравствуй, мир! 你好，世界。こんにちは 안녕하세요 مرحبا بالعالم שלום Ελληνικά",
    "emoji: 🙂👍🏽 👨‍👩‍👧 🇫🇷 ❤️ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "a  b   c\t\td\n\n\n  e \r\n f      ",
    "    leading and trailing    ",
    "digits 3.14159 1,000,000 ٣٤٥ ⅷ ²³ 0x7f",
    "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n",
    "I'm, you're, they've, we'll, she'd, it's, DON'T",
    "\u{0}\u{1}\u{7f} control \u{feff}bom \u{200b}zwsp",
    "",
];

/// Decoding inverts encoding on multilingual text, emoji, whitespace runs,
/// digits, code and control characters, and agrees with HF's decoder.
#[test]
fn decode_inverts_encode() {
    let t = smollm2();
    for s in SAMPLES {
        for parse_special in [false, true] {
            let ids = t.encode(s, parse_special).unwrap();
            assert_eq!(t.decode(&ids, false).unwrap(), s);
            assert_eq!(t.hf().unwrap().decode(&ids, false).unwrap(), s);
        }
    }
}

/// Feeding ids one at a time emits the full decode, and holds back the bytes
/// of a character split across tokens.
#[test]
fn detokenizer_streams_whole_characters() {
    let t = smollm2();
    for s in SAMPLES {
        let ids = t.encode(s, false).unwrap();
        let mut d = t.detokenizer(false);
        let mut out = String::new();
        for &id in &ids {
            let piece = d.push(id).unwrap();
            assert!(!piece.contains(char::REPLACEMENT_CHARACTER), "{s:?}");
            out.push_str(&piece);
        }
        assert!(!d.has_pending());
        assert_eq!(out + &d.finish(), s);
    }
    // A rare character is split into byte tokens: nothing is emitted until the
    // last one.
    let ids = t.encode("𝔘", false).unwrap();
    assert!(ids.len() > 1, "{ids:?}");
    let mut d = t.detokenizer(false);
    for &id in &ids[..ids.len() - 1] {
        assert_eq!(d.push(id).unwrap(), "");
        assert!(d.has_pending());
    }
    assert_eq!(d.push(ids[ids.len() - 1]).unwrap(), "𝔘");
    // An incomplete character at the end of the stream becomes U+FFFD.
    let mut d = t.detokenizer(false);
    assert_eq!(d.push(ids[0]).unwrap(), "");
    assert_eq!(d.finish(), "\u{FFFD}");
    assert!(t.decode(&[49152], false).is_err());
    assert!(t.detokenizer(true).push(u32::MAX).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Any text round-trips through encode and decode.
    #[test]
    fn any_text_round_trips(s in "\\PC{0,40}|[ \t\n a-z0-9]{0,40}") {
        let t = smollm2();
        let ids = t.encode(&s, false).unwrap();
        prop_assert_eq!(t.decode(&ids, false).unwrap(), s);
    }

    /// Any id sequence, including ones that split or break UTF-8, streams to
    /// exactly the full decode.
    #[test]
    fn detokenizer_matches_decode(ids in prop::collection::vec(0u32..49152, 0..24), special in any::<bool>()) {
        let t = smollm2();
        let mut d = t.detokenizer(special);
        let mut out = String::new();
        for &id in &ids {
            out.push_str(&d.push(id).unwrap());
        }
        out.push_str(&d.finish());
        prop_assert_eq!(out, t.decode(&ids, special).unwrap());
    }

    /// Byte-level tokens chosen to split characters stream correctly too (bytes
    /// without a token of their own are left out).
    #[test]
    fn detokenizer_matches_decode_on_bytes(bytes in prop::collection::vec(any::<u8>(), 0..24)) {
        let t = smollm2();
        let (bytes, ids): (Vec<u8>, Vec<u32>) = bytes
            .iter()
            .filter_map(|&b| {
                let c = crate::gguf::vocab::gpt2_byte_to_char(b).to_string();
                t.token_id(&c).map(|id| (b, id))
            })
            .unzip();
        let mut d = t.detokenizer(false);
        let mut out = String::new();
        for &id in &ids {
            out.push_str(&d.push(id).unwrap());
        }
        out.push_str(&d.finish());
        prop_assert_eq!(&out, &String::from_utf8_lossy(&bytes).into_owned());
        prop_assert_eq!(out, t.decode(&ids, false).unwrap());
    }
}

/// SmolLM2 has no token for 21 of the 256 bytes (0x04, 0x06, 0x13, 0x14, 0x16,
/// 0x1D, 0xC0, 0xC1, 0xF1, 0xF2, 0xF5 to 0xFF): like llama.cpp, encoding drops
/// them.
#[test]
fn bytes_without_a_token_are_dropped() {
    let t = smollm2();
    let missing: Vec<u8> = (0..=255u8)
        .filter(|&b| t.token_id(&crate::gguf::vocab::gpt2_byte_to_char(b).to_string()).is_none())
        .collect();
    assert_eq!(
        missing,
        [
            0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2, 0xF5, 0xF6, 0xF7, 0xF8, 0xF9, 0xFA,
            0xFB, 0xFC, 0xFD, 0xFE, 0xFF
        ]
    );
    let ids = t.encode("a\u{4}b \u{40000}", false).unwrap();
    assert_eq!(t.decode(&ids, false).unwrap(), "ab \u{FFFD}\u{FFFD}\u{FFFD}");
}

/// The tiny model's vocabulary tokenizes by its merge ranks.
#[test]
fn tiny_vocabulary_merges_by_rank() {
    let gguf = Gguf::from_bytes(TinyLlama::default().to_bytes().unwrap()).unwrap();
    let t = Tokenizer::from_gguf(&gguf).unwrap();
    let vocab = Vocab::from_metadata(gguf.metadata()).unwrap();
    let id = |s: &str| vocab.tokens.iter().position(|t| t == s).unwrap() as u32;
    // " the": Ġ t -> Ġt (rank 0), h e -> he (1), Ġt he -> Ġthe (4).
    // " cat": a t (rank 9) before Ġ c (15).
    assert_eq!(t.encode(" the cat", false).unwrap(), [id("Ġthe"), id("Ġc"), id("at")]);
    assert_eq!(t.encode("<|im_start|>7", true).unwrap(), [1, id("7")]);
    assert_eq!(t.decode(&t.encode("héllo wörld 🙂", false).unwrap(), false).unwrap(), "héllo wörld 🙂");
    // Padding tokens render as nothing.
    let padded = tiny_vocab(tiny_vocab_min_size() + 3).unwrap();
    let t = Tokenizer::from_vocab(&padded).unwrap();
    assert_eq!(t.decode(&[tiny_vocab_min_size() as u32 + 1], true).unwrap(), "");
}

#[test]
fn unsupported_vocabularies_are_errors() {
    let base = tiny_vocab(tiny_vocab_min_size()).unwrap();
    let err = |v: Vocab| match Tokenizer::from_vocab(&v) {
        Err(Error::Tokenizer(m)) => m,
        other => panic!("expected a tokenizer error, got {other:?}"),
    };
    assert!(err(Vocab { model: "bert".into(), ..base.clone() }).contains("`bert`"));
    // SentencePiece needs scores.
    assert!(err(Vocab { model: "llama".into(), ..base.clone() }).contains("tokenizer.ggml.scores"));
    assert!(err(Vocab { pre: Some("default".into()), ..base.clone() }).contains("`default`"));
    // The errors name the key and list the supported names.
    let m = err(Vocab { pre: Some("llama5".into()), ..base.clone() });
    for part in ["`llama5`", "tokenizer.ggml.pre", "smollm", "gpt-2", "llama-bpe", "qwen2", "deepseek-llm"] {
        assert!(m.contains(part), "{m}");
    }
    let m = err(Vocab { model: "t5".into(), ..base.clone() });
    for part in ["`t5`", "tokenizer.ggml.model", "gpt2", "llama"] {
        assert!(m.contains(part), "{m}");
    }
    assert!(err(Vocab { pre: None, ..base.clone() }).contains("not supported"));
    let mut bad = base.clone();
    bad.merges.push("abc".into());
    assert!(err(bad).contains("merge 18"));
    let mut bad = base.clone();
    bad.merges.push("Ġthe cat".into());
    assert!(err(bad).contains("BPE"));
    // With a merge "1 2", the GPT-2-only pre-tokenizer (digit runs stay one
    // piece) merges the digits; `smollm` (each digit its own piece) cannot.
    let mut digits = base.clone();
    digits.tokens.push("12".into());
    digits.token_types.push(TokenType::Normal);
    digits.merges.push("1 2".into());
    let twelve = digits.tokens.len() as u32 - 1;
    let t = Tokenizer::from_vocab(&Vocab { pre: Some("gpt-2".into()), ..digits.clone() }).unwrap();
    let (space, one) = (t.encode(" ", false).unwrap()[0], t.encode("1", false).unwrap()[0]);
    assert_eq!(t.encode(" 12", false).unwrap(), [space, twelve]);
    let t = Tokenizer::from_vocab(&digits).unwrap();
    assert_eq!(t.encode(" 12", false).unwrap(), [space, one, one + 1]);
}
