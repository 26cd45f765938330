//! SentencePiece tokenization as llama.cpp does it for `tokenizer.ggml.model =
//! "llama"` (`llm_tokenizer_spm`): a bigram merge by token score over the
//! characters of a text fragment, with byte fallback.
//!
//! The text (spaces already replaced by `▁`, see [`super::Tokenizer`]) starts
//! as one symbol per UTF-8 character. Every adjacent pair whose concatenation
//! is a token is a candidate; the candidate whose token has the highest score
//! is merged first, the leftmost one among equal scores, and the pairs it forms
//! with its neighbours become new candidates, until none is left. Each final
//! symbol is its token, or, when a single character is no token, the byte
//! tokens `<0xNN>` of its UTF-8 bytes.
//!
//! `tokenizers`' BPE cannot reproduce this exactly: its merges carry distinct
//! ranks, while llama.cpp orders pairs by the score of the token they form,
//! and real vocabularies have tokens with equal scores (16 pairs in Phi-3's),
//! which llama.cpp breaks by position. So this small implementation follows
//! llama.cpp's algorithm directly.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// A SentencePiece vocabulary: token ids by text, scores, byte tokens.
#[derive(Debug)]
pub(crate) struct Spm {
    ids: HashMap<String, u32>,
    scores: Vec<f32>,
    /// The token of each byte (`<0xNN>`, else the one-byte text), if any.
    bytes: Vec<Option<u32>>,
    unk: Option<u32>,
}

/// One symbol: a byte range of the text, linked to its live neighbours.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge of symbols `left` and `right` into a token of `score`.
#[derive(Debug)]
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    /// The byte length of the merged text (a stale candidate's differs).
    len: usize,
}

impl Ord for Bigram {
    /// Higher score first, then the leftmost (llama.cpp's comparator; equal
    /// and incomparable scores tie).
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.partial_cmp(&other.score).unwrap_or(Ordering::Equal).then(other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

impl Spm {
    /// The vocabulary of `tokens` with `scores` (one per token); a duplicated
    /// text maps to its last id, as in llama.cpp.
    pub(crate) fn new(tokens: &[String], scores: &[f32], unk: Option<u32>) -> Spm {
        let ids: HashMap<String, u32> =
            tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
        let bytes = (0..=255u8)
            .map(|b| {
                ids.get(&format!("<0x{b:02X}>"))
                    .or_else(|| std::str::from_utf8(&[b]).ok().and_then(|s| ids.get(s)))
                    .copied()
            })
            .collect();
        Spm { ids, scores: scores.to_vec(), bytes, unk }
    }

    /// The id of token text `text`.
    pub(crate) fn id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    /// Appends the ids of `text` to `out`. A byte without a byte token becomes
    /// the unknown token (llama.cpp aborts there), or nothing without one.
    pub(crate) fn encode(&self, text: &str, out: &mut Vec<u32>) {
        let mut symbols: Vec<Symbol> = Vec::new();
        for (i, (start, c)) in text.char_indices().enumerate() {
            symbols.push(Symbol { start, len: c.len_utf8(), prev: i.checked_sub(1), next: Some(i + 1) });
        }
        let Some(last) = symbols.last_mut() else { return };
        last.next = None;

        let mut queue = BinaryHeap::new();
        for i in 1..symbols.len() {
            self.push_bigram(text, &symbols, i - 1, i, &mut queue);
        }
        while let Some(b) = queue.pop() {
            let (l, r) = (symbols[b.left], symbols[b.right]);
            // Skip candidates one of whose symbols has since been merged.
            if l.len == 0 || r.len == 0 || l.len + r.len != b.len {
                continue;
            }
            symbols[b.left].len += r.len;
            symbols[b.right].len = 0;
            symbols[b.left].next = r.next;
            if let Some(n) = r.next {
                symbols[n].prev = Some(b.left);
            }
            if let Some(p) = l.prev {
                self.push_bigram(text, &symbols, p, b.left, &mut queue);
            }
            if let Some(n) = r.next {
                self.push_bigram(text, &symbols, b.left, n, &mut queue);
            }
        }

        let mut i = Some(0);
        while let Some(s) = i {
            let sym = symbols[s];
            let piece = &text[sym.start..sym.start + sym.len];
            match self.ids.get(piece) {
                Some(&id) => out.push(id),
                None => out.extend(piece.bytes().filter_map(|b| self.bytes[b as usize].or(self.unk))),
            }
            i = sym.next;
        }
    }

    fn push_bigram(
        &self,
        text: &str,
        symbols: &[Symbol],
        left: usize,
        right: usize,
        queue: &mut BinaryHeap<Bigram>,
    ) {
        let (l, r) = (symbols[left], symbols[right]);
        let merged = &text[l.start..r.start + r.len];
        if let Some(&id) = self.ids.get(merged) {
            let score = self.scores.get(id as usize).copied().unwrap_or(0.0);
            queue.push(Bigram { score, left, right, len: merged.len() });
        }
    }
}

/// A piece of text to tokenize, or a special token found in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fragment<'a> {
    /// Text between special tokens.
    Text(&'a str),
    /// A special token's id.
    Token(u32),
}

/// A token matched as a whole in text before tokenization.
#[derive(Debug, Clone)]
pub(crate) struct Special {
    pub id: u32,
    pub text: String,
    /// Matched only with `parse_special` (control and unknown tokens); user-
    /// defined tokens always are.
    pub needs_parse_special: bool,
    /// Whitespace after the token is dropped.
    pub rstrip: bool,
}

/// Splits `text` at the special tokens of `specials` (longest first, as
/// llama.cpp's `tokenizer_st_partition`: each token in turn splits every text
/// fragment left by the previous ones at each of its occurrences, left to
/// right). Empty text fragments are dropped.
pub(crate) fn partition<'a>(text: &'a str, specials: &[Special], parse_special: bool) -> Vec<Fragment<'a>> {
    let mut fragments = if text.is_empty() { Vec::new() } else { vec![Fragment::Text(text)] };
    for special in specials {
        if special.needs_parse_special && !parse_special {
            continue;
        }
        let mut next = Vec::with_capacity(fragments.len());
        for f in fragments {
            let Fragment::Text(mut rest) = f else {
                next.push(f);
                continue;
            };
            while let Some(at) = rest.find(special.text.as_str()) {
                if at > 0 {
                    next.push(Fragment::Text(&rest[..at]));
                }
                next.push(Fragment::Token(special.id));
                rest = &rest[at + special.text.len()..];
                if special.rstrip {
                    // C's isspace: space, \t, \n, \v, \f, \r.
                    rest = rest.trim_start_matches([' ', '\t', '\n', '\u{b}', '\u{c}', '\r']);
                }
            }
            if !rest.is_empty() {
                next.push(Fragment::Text(rest));
            }
        }
        fragments = next;
    }
    fragments
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spm(tokens: &[(&str, f32)]) -> Spm {
        let texts: Vec<String> = tokens.iter().map(|(t, _)| t.to_string()).collect();
        let scores: Vec<f32> = tokens.iter().map(|&(_, s)| s).collect();
        Spm::new(&texts, &scores, Some(0))
    }

    fn encode(s: &Spm, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        s.encode(text, &mut out);
        out
    }

    /// The pair forming the highest-scoring token merges first; equal scores
    /// merge the leftmost pair first.
    #[test]
    fn merges_by_score_then_position() {
        let s = spm(&[("<unk>", 0.0), ("a", -1.0), ("b", -1.0), ("ab", -3.0), ("ba", -2.0), ("aa", -5.0)]);
        // "aba": "ba" (-2) beats "ab" (-3).
        assert_eq!(encode(&s, "aba"), [1, 4]);
        // "aaa": both "aa" pairs tie; the leftmost wins.
        assert_eq!(encode(&s, "aaa"), [5, 1]);
        assert_eq!(encode(&s, ""), Vec::<u32>::new());
    }

    /// A character without a token becomes its byte tokens, or the unknown
    /// token for bytes without one.
    #[test]
    fn byte_fallback() {
        let s = spm(&[("<unk>", 0.0), ("<0xC3>", 0.0), ("<0xA9>", 0.0), ("x", -1.0)]);
        assert_eq!(encode(&s, "xé"), [3, 1, 2]);
        assert_eq!(encode(&s, "ü"), [1, 0]);
    }

    /// Special tokens split text longest first, user-defined ones even
    /// without `parse_special`, and `rstrip` drops the whitespace after them.
    #[test]
    fn partition_at_special_tokens() {
        let special = |id, text: &str, needs_parse_special, rstrip| Special {
            id,
            text: text.to_string(),
            needs_parse_special,
            rstrip,
        };
        let specials = [
            special(7, "<|end|>", true, true),
            special(8, "</s>", false, false),
            special(9, "<s>", true, false),
        ];
        use Fragment::{Text, Token};
        assert_eq!(
            partition("a<s>b<|end|> \n c</s>", &specials, true),
            [Text("a"), Token(9), Text("b"), Token(7), Text("c"), Token(8)]
        );
        assert_eq!(partition("a<s>b<|end|> c</s>", &specials, false), [Text("a<s>b<|end|> c"), Token(8)]);
        assert_eq!(partition("", &specials, true), []);
    }
}
