//! The text of one choice, token by token: incremental UTF-8 assembly of the
//! tokens' bytes and stop-string matching with hold-back.
//!
//! [`Utf8Stream`] (the tokenizer's, which its streaming detokenizer is
//! built on) is used with owned state (no borrow of the [`Tokenizer`], so a
//! request's state can live in a plain struct across `await`s): only whole
//! characters come out, the bytes of a character split across tokens wait
//! for the rest, invalid bytes become U+FFFD as soon as they are known to be
//! invalid.
//!
//! [`StopBuffer`] holds back the longest tail of the text that could still
//! grow into a stop string, so streamed text never has to be taken back;
//! when a stop string appears, the text before its first occurrence is
//! released and the choice ends.
//!
//! Invariants: the concatenation of everything [`ChoiceText`] releases
//! equals the decoded text cut before the first occurrence of any stop
//! string (the whole text when none occurs); nothing after a stop is
//! released.

use crate::error::Result;
use crate::tokenizer::{Tokenizer, Utf8Stream};

/// Stop-string matching over streamed text (see the module doc).
#[derive(Debug, Default)]
pub struct StopBuffer {
    stops: Vec<String>,
    held: String,
    stopped: bool,
}

impl StopBuffer {
    /// A buffer for `stops` (non-empty strings).
    pub fn new(stops: Vec<String>) -> StopBuffer {
        StopBuffer { stops, held: String::new(), stopped: false }
    }

    /// Adds `text`; returns the text safe to release and, when a stop string
    /// occurred, its index (the buffer is then done and ignores more text).
    pub fn push(&mut self, text: &str) -> (String, Option<usize>) {
        if self.stopped {
            return (String::new(), None);
        }
        if self.stops.is_empty() {
            return (text.to_string(), None);
        }
        self.held.push_str(text);
        let first = self
            .stops
            .iter()
            .enumerate()
            .filter_map(|(i, s)| self.held.find(s.as_str()).map(|pos| (pos, i)))
            .min();
        if let Some((pos, i)) = first {
            self.stopped = true;
            let mut out = std::mem::take(&mut self.held);
            out.truncate(pos);
            return (out, Some(i));
        }
        let keep = self.stops.iter().map(|s| held_suffix(&self.held, s)).max().unwrap_or(0);
        let out = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        (out, None)
    }

    /// Ends the text: the held-back tail is released (no stop string can
    /// complete any more).
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Whether a stop string occurred.
    pub fn stopped(&self) -> bool {
        self.stopped
    }
}

/// The length of the longest proper prefix of `stop` that `text` ends with.
fn held_suffix(text: &str, stop: &str) -> usize {
    let max = stop.len().saturating_sub(1).min(text.len());
    (1..=max).rev().find(|&k| stop.is_char_boundary(k) && text.ends_with(&stop[..k])).unwrap_or(0)
}

/// What one token (or the end) released.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Released {
    /// Text to send.
    pub text: String,
    /// The index of the stop string that ended the choice.
    pub stop: Option<usize>,
}

/// The text of one choice (UTF-8 assembly, then stop strings).
#[derive(Debug, Default)]
pub struct ChoiceText {
    utf8: Utf8Stream,
    stops: StopBuffer,
    decoded_bytes: usize,
}

impl ChoiceText {
    /// A choice that ends at any of `stops`.
    pub fn new(stops: Vec<String>) -> ChoiceText {
        ChoiceText { utf8: Utf8Stream::default(), stops: StopBuffer::new(stops), decoded_bytes: 0 }
    }

    /// Bytes of text decoded so far (the `text_offset` of the next token).
    pub fn decoded_bytes(&self) -> usize {
        self.decoded_bytes
    }

    /// Adds token `id` (rendered without control tokens).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<Released> {
        let text = self.utf8.push(tok.token_bytes(id, false)?);
        self.decoded_bytes += text.len();
        let (text, stop) = self.stops.push(&text);
        Ok(Released { text, stop })
    }

    /// Ends the choice: incomplete bytes and held-back text are released
    /// (unless a stop string already ended it).
    pub fn finish(&mut self) -> Released {
        let tail = self.utf8.finish();
        let (mut text, stop) = self.stops.push(&tail);
        if stop.is_none() && !self.stops.stopped() {
            text.push_str(&self.stops.flush());
        }
        Released { text, stop }
    }

    /// Whether a stop string ended the choice.
    pub fn stopped(&self) -> bool {
        self.stops.stopped()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces` through a buffer and returns the released text and stop.
    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, Option<usize>) {
        let mut b = StopBuffer::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = Vec::new();
        for p in pieces {
            let (t, s) = b.push(p);
            out.push(t);
            if s.is_some() {
                return (out, s);
            }
        }
        out.push(b.flush());
        (out, None)
    }

    #[test]
    fn stop_strings_cut_the_text_and_hold_back_prefixes() {
        // "END" split over pieces: "E" and "EN" are held until resolved.
        let (out, stop) = run(&["END"], &["abc E", "N", "D tail"]);
        assert_eq!(out, ["abc ", "", ""]);
        assert_eq!(stop, Some(0));
        // A held prefix that does not complete is released.
        let (out, stop) = run(&["END"], &["abE", "Nx", "y"]);
        assert_eq!(out.concat(), "abENxy");
        assert_eq!(out[0], "ab");
        assert_eq!(stop, None);
        // The earliest occurrence wins, whichever stop it is.
        let (out, stop) = run(&["zz", "b"], &["aabzz"]);
        assert_eq!((out.concat(), stop), ("aa".to_string(), Some(1)));
        // A stop inside one piece, and text at the end held then flushed.
        let (out, _) = run(&["\n\n"], &["x\n"]);
        assert_eq!(out, ["x", "\n"]);
        // No stops: everything passes straight through.
        let (out, _) = run(&[], &["a", "b"]);
        assert_eq!(out, ["a", "b", ""]);
    }

    #[test]
    fn multibyte_stops_hold_on_char_boundaries() {
        let (out, stop) = run(&["é!"], &["caf", "é", "!"]);
        assert_eq!((out.concat(), stop), ("caf".to_string(), Some(0)));
        let (out, stop) = run(&["éa"], &["xé", "b"]);
        assert_eq!(out, ["x", "éb", ""]);
        assert_eq!(stop, None);
    }

    #[test]
    fn utf8_stream_holds_split_characters() {
        let mut u = Utf8Stream::default();
        let e = "é".as_bytes();
        assert_eq!(u.push(&[b'a', e[0]]), "a");
        assert_eq!(u.push(&e[1..]), "é");
        assert_eq!(u.push(&[0xff, b'b']), "\u{fffd}b");
        assert_eq!(u.push(&[e[0]]), "");
        assert_eq!(u.finish(), "\u{fffd}");
        assert_eq!(u.finish(), "");
    }
}
