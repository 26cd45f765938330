//! The prompt-lookup drafter: find the longest recent n-gram that ends the
//! history and occurs earlier in it, and propose the tokens that followed
//! that earlier occurrence.
//!
//! Invariants: proposals are copied from the history itself (so they are
//! always inside the vocabulary), at most `k` of them; the most recent
//! earlier occurrence followed by `k` tokens wins (else the most recent one);
//! n goes from `max` down to `min`.

use super::Drafter;
use crate::error::Result;

/// Prompt lookup (n-gram match against the prompt and the text so far).
#[derive(Clone, Copy, Debug)]
pub struct NgramDrafter {
    /// Longest n-gram tried.
    pub max: usize,
    /// Shortest n-gram tried (at least 1).
    pub min: usize,
}

impl<D> Drafter<D> for NgramDrafter {
    fn propose(&mut self, _dev: &mut D, requests: &[(&[u32], usize)]) -> Result<Vec<Vec<u32>>> {
        Ok(requests.iter().map(|&(h, k)| propose_ngram(h, k, self.max, self.min)).collect())
    }
}

/// The prompt-lookup proposal for `history` (see the module doc).
pub fn propose_ngram(history: &[u32], k: usize, max: usize, min: usize) -> Vec<u32> {
    let len = history.len();
    if k == 0 {
        return Vec::new();
    }
    for n in (min.max(1)..=max).rev() {
        if n >= len {
            continue;
        }
        let suffix = &history[len - n..];
        // Earlier occurrences start at `start < len - n`, latest first; the
        // latest one followed by `k` tokens wins, else the latest one (in a
        // periodic history the latest match is followed by only a few).
        let mut latest = None;
        for start in (0..len - n).rev() {
            if &history[start..start + n] == suffix {
                let from = start + n;
                if from + k <= len {
                    return history[from..from + k].to_vec();
                }
                latest.get_or_insert(from);
            }
        }
        if let Some(from) = latest {
            return history[from..(from + k).min(len)].to_vec();
        }
    }
    Vec::new()
}
