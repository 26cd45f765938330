//! llama.cpp's byte-level BPE pre-tokenizers (`tokenizer.ggml.pre`) as HF
//! `tokenizers` pipelines.
//!
//! llama.cpp maps each `tokenizer.ggml.pre` name to a pre-tokenizer type (the
//! name table in `llama-vocab.cpp`), and each type to a list of regexes applied
//! in turn: every regex splits every piece the previous ones left, keeping both
//! its matches and the text between them as pieces. That is `tokenizers`'
//! [`Split`] with [`SplitDelimiterBehavior::Isolated`], one per regex, followed
//! by [`ByteLevel`] without its own regex (the GPT-2 byte-to-character
//! mapping). The GPT-2 regex alone is `ByteLevel` with its regex, and SmolLM2's
//! family keeps the `Digits` + `ByteLevel` pipeline it has always had.
//!
//! Only names whose family is covered by tests against llama.cpp's ids (on
//! llama.cpp's vocabulary files of each family) are listed; any other name is
//! an error listing these.

use tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};

/// A pre-tokenizer family: the regexes of one llama.cpp pre-tokenizer type (or
/// of several types that share them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PreTokenizer {
    /// `\p{N}` (each number character alone), then GPT-2's regex: llama.cpp's
    /// STARCODER, REFACT, COMMAND_R, SMOLLM, CODESHELL, EXAONE, MINERVA, MELLUM2.
    Smollm,
    /// GPT-2's regex: GPT2, MPT, OLMO, JAIS, TRILLION, GRANITE_DOCLING.
    Gpt2,
    /// Llama 3's regex (numbers in runs of up to three digits, case-insensitive
    /// contractions, newlines kept apart): LLAMA3, DBRX, SMAUG.
    Llama3,
    /// Qwen2's regex: Llama 3's with each number character alone: QWEN2,
    /// STABLELM2, HUNYUAN, SOLAR_OPEN.
    Qwen2,
    /// Qwen3.5's regex: Qwen2's with combining marks (`\p{M}`) joining letters.
    Qwen35,
    /// DeepSeek LLM's six regexes (newlines, Latin/Greek/Cyrillic... letter
    /// runs, punctuation runs, trailing whitespace, CJK runs, numbers).
    DeepseekLlm,
    /// DeepSeek Coder's five regexes (newlines, letter runs, punctuation runs,
    /// CJK runs, each number character alone).
    DeepseekCoder,
}

/// `tokenizer.ggml.pre` names, as llama.cpp spells them, with their family and
/// whether llama.cpp sets `ignore_merges` (a piece that is a whole token is
/// that token, without merging) and `add_bos` (BOS by default) for them.
pub(crate) const PRE_TOKENIZERS: &[(&str, PreTokenizer, Flags)] = {
    use PreTokenizer::*;
    const NONE: Flags = Flags { ignore_merges: false, add_bos: false };
    const LLAMA3: Flags = Flags { ignore_merges: true, add_bos: true };
    &[
        ("smollm", Smollm, NONE),
        ("starcoder", Smollm, NONE),
        ("refact", Smollm, NONE),
        ("command-r", Smollm, NONE),
        ("codeshell", Smollm, NONE),
        ("exaone", Smollm, NONE),
        ("minerva-7b", Smollm, NONE),
        ("mellum2", Smollm, NONE),
        ("gpt-2", Gpt2, NONE),
        ("phi-2", Gpt2, NONE),
        ("jina-es", Gpt2, NONE),
        ("jina-de", Gpt2, NONE),
        ("gigachat", Gpt2, NONE),
        ("jina-v2-es", Gpt2, NONE),
        ("jina-v2-de", Gpt2, NONE),
        ("a.x-4.0", Gpt2, NONE),
        ("mellum", Gpt2, NONE),
        ("modern-bert", Gpt2, NONE),
        ("exaone4", Gpt2, NONE),
        ("mpt", Gpt2, NONE),
        ("olmo", Gpt2, NONE),
        ("jais", Gpt2, NONE),
        ("trillion", Gpt2, NONE),
        ("granite-docling", Gpt2, NONE),
        ("llama3", Llama3, LLAMA3),
        ("llama-v3", Llama3, LLAMA3),
        ("llama-bpe", Llama3, LLAMA3),
        ("falcon3", Llama3, LLAMA3),
        ("falcon-h1", Llama3, LLAMA3),
        ("pixtral", Llama3, LLAMA3),
        ("midm-2.0", Llama3, LLAMA3),
        ("lfm2", Llama3, LLAMA3),
        ("jina-v5-nano", Llama3, LLAMA3),
        ("dbrx", Llama3, NONE),
        ("smaug-bpe", Llama3, NONE),
        ("qwen2", Qwen2, NONE),
        ("deepseek-r1-qwen", Qwen2, NONE),
        ("kormo", Qwen2, NONE),
        ("f2llmv2", Qwen2, NONE),
        ("megrez", Qwen2, NONE),
        ("stablelm2", Qwen2, NONE),
        ("hunyuan", Qwen2, NONE),
        ("solar-open", Qwen2, NONE),
        ("qwen35", Qwen35, NONE),
        ("deepseek-llm", DeepseekLlm, NONE),
        ("deepseek-coder", DeepseekCoder, NONE),
    ]
};

/// What llama.cpp sets besides the regexes for a pre-tokenizer name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Flags {
    /// A pre-tokenized piece that is a token is emitted as that token.
    pub ignore_merges: bool,
    /// BOS is added by default (`add_bos_token` absent).
    pub add_bos: bool,
}

/// The family and flags of `tokenizer.ggml.pre` name `name`.
pub(crate) fn lookup(name: &str) -> Option<(PreTokenizer, Flags)> {
    PRE_TOKENIZERS.iter().find(|(n, _, _)| *n == name).map(|&(_, p, f)| (p, f))
}

/// The supported names, comma-separated (for errors).
pub(crate) fn supported_names() -> String {
    PRE_TOKENIZERS.iter().map(|(n, _, _)| *n).collect::<Vec<_>>().join(", ")
}

/// Llama 3's regex, with the case-insensitive contractions spelled out as
/// llama.cpp does (`(?i:'s)` would also match `'ſ`).
const LLAMA3_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's regex: Llama 3's with `\p{N}` instead of `\p{N}{1,3}`.
const QWEN2_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5's regex.
const QWEN35_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// DeepSeek Coder's regexes, in llama.cpp's order.
const DEEPSEEK_CODER_REGEXES: [&str; 5] = [
    r"[\r\n]",
    r"\s?\p{L}+",
    r"\s?\p{P}+",
    r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+",
    r"\p{N}",
];
/// DeepSeek LLM's regexes, in llama.cpp's order (non-ASCII characters as
/// `\x{..}` escapes: some, such as U+1F7D, change under Unicode normalization).
const DEEPSEEK_LLM_REGEXES: [&str; 6] = [
    r"[\r\n]",
    r"\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+",
    r"\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+",
    r"\s+$",
    r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+",
    r"\p{N}+",
];

impl PreTokenizer {
    /// The `tokenizers` pre-tokenizer of this family.
    pub(crate) fn build(self) -> Result<Sequence, String> {
        let regexes: &[&str] = match self {
            PreTokenizer::Smollm => {
                return Ok(Sequence::new(vec![
                    PreTokenizerWrapper::Digits(Digits::new(true)),
                    PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true)),
                ]));
            }
            PreTokenizer::Gpt2 => {
                return Ok(Sequence::new(vec![PreTokenizerWrapper::ByteLevel(ByteLevel::new(
                    false, true, true,
                ))]));
            }
            PreTokenizer::Llama3 => &[LLAMA3_REGEX],
            PreTokenizer::Qwen2 => &[QWEN2_REGEX],
            PreTokenizer::Qwen35 => &[QWEN35_REGEX],
            PreTokenizer::DeepseekLlm => &DEEPSEEK_LLM_REGEXES,
            PreTokenizer::DeepseekCoder => &DEEPSEEK_CODER_REGEXES,
        };
        let mut steps = Vec::new();
        for r in regexes {
            let split =
                Split::new(SplitPattern::Regex(r.to_string()), SplitDelimiterBehavior::Isolated, false)
                    .map_err(|e| format!("regex {r:?}: {e}"))?;
            steps.push(PreTokenizerWrapper::Split(split));
        }
        steps.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, false)));
        Ok(Sequence::new(steps))
    }
}
