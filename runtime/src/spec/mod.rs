//! Speculative decoding, exact by construction.
//!
//! Each step, every decoding sequence may carry `k` draft tokens proposed by a
//! [`Drafter`] (prompt lookup: [`ngram::NgramDrafter`]; a smaller model:
//! [`draft::DraftModel`]). The scheduler appends
//! them to the sequence ([`crate::scheduler::Scheduler::propose`]) and plans
//! `[last token, d1..dk]` as one entry of `k + 1` positions through the paged
//! KV cache; the engine samples the target at all `k + 1` positions on the
//! device, each row with the request's own sampling transforms and the seed
//! step it would have in plain decoding (row `j` uses step `generated + j`).
//!
//! Acceptance ([`accept_len`]): `d_{j+1}` is accepted while the target's
//! sample at row `j` equals it; the first mismatching sample (or the bonus
//! sample after `k` acceptances) is output as the correction. For greedy
//! requests this is exact match with the target's argmax. For sampled
//! requests the drafter is deterministic, so its distribution `q` is a point
//! mass, and this rule *is* the rejection-sampling rule of Leviathan et al.
//! (arXiv:2211.17192) with that `q`: the draft is accepted with probability
//! `p(d)` and otherwise the output is drawn from `p` with `d` removed and
//! renormalised, so every output token follows the target distribution `p`.
//! Because each row is sampled with the seed step plain decoding would use,
//! speculation reproduces plain decoding token for token, greedy or seeded.
//!
//! Verification rows run as decode rows ([`split_verify_entries`]): the
//! `k + 1` positions of an entry become `k + 1` single-token entries that
//! share its block table, row `j` attending to the context up to its own
//! position (all `k + 1` keys and values are written before attention runs).
//! A verify step of decoding sequences is then an ordinary decode step of
//! `sum (k + 1)` rows: the paged decode kernel, the decode CUDA graphs (per
//! batch bucket, up to 64 rows; more rows run eagerly), and the same
//! attention numerics as plain decoding.
//!
//! Rollback: after verification the sequence is truncated to the accepted
//! length ([`crate::scheduler::Scheduler::rollback`]): whole KV blocks past it
//! are freed, a partial block is overwritten later, and no block holding a
//! rejected token is registered in the prefix cache (registration happens only
//! at the start of the next plan, after the rollback).
//!
//! Invariants: a run of accepted tokens never passes a stop token or
//! `max_tokens` (drafts are capped by the tokens the request may still
//! produce, and emission stops at the first stop condition); drafts never
//! carry a sequence past `max_model_len - 1`.

pub mod cli;
pub mod draft;
pub mod ngram;

#[cfg(test)]
mod real_model;
#[cfg(test)]
mod tests;

use crate::error::{Error, Result};

/// Where draft tokens come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecMethod {
    /// Prompt lookup: the continuation of the latest n-gram match in the
    /// sequence's own history.
    Ngram,
    /// A smaller model sharing the vocabulary, proposing greedily
    /// ([`draft::DraftModel`], installed with
    /// [`crate::engine::Engine::set_drafter`]).
    Draft,
}

impl std::str::FromStr for SpecMethod {
    type Err = Error;

    fn from_str(s: &str) -> Result<SpecMethod> {
        match s {
            "ngram" => Ok(SpecMethod::Ngram),
            "draft" => Ok(SpecMethod::Draft),
            _ => Err(Error::Usage(format!("unknown speculation method `{s}` (expected ngram or draft)"))),
        }
    }
}

/// Speculation settings of an engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpecConfig {
    /// The drafter.
    pub method: SpecMethod,
    /// Draft tokens proposed per sequence and step (`k`, at least 1).
    pub num_speculative_tokens: usize,
    /// Longest n-gram the prompt-lookup drafter matches.
    pub ngram_max: usize,
    /// Shortest n-gram the prompt-lookup drafter matches (at least 1).
    pub ngram_min: usize,
}

impl SpecConfig {
    /// Prompt lookup with `k` draft tokens and n-grams of 3 down to 1.
    pub fn ngram(k: usize) -> SpecConfig {
        SpecConfig { method: SpecMethod::Ngram, num_speculative_tokens: k, ngram_max: 3, ngram_min: 1 }
    }

    /// Checks the settings (user errors).
    pub fn validate(&self) -> Result<()> {
        if self.num_speculative_tokens == 0 {
            return Err(Error::Usage("--num-speculative-tokens must be at least 1".into()));
        }
        if self.ngram_min == 0 || self.ngram_min > self.ngram_max {
            return Err(Error::Usage(format!(
                "n-gram sizes must satisfy 1 <= min ({}) <= max ({})",
                self.ngram_min, self.ngram_max
            )));
        }
        Ok(())
    }
}

/// A source of draft tokens for an engine on device `D`.
pub trait Drafter<D> {
    /// For each `(history, k)` (a sequence's prompt and generated tokens, and
    /// the most drafts it may take), up to `k` proposed continuations; an
    /// empty proposal means no guess. Drafters must be deterministic (their
    /// distribution is a point mass; see the module doc).
    fn propose(&mut self, dev: &mut D, requests: &[(&[u32], usize)]) -> Result<Vec<Vec<u32>>>;
}

/// Counters of speculative work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Verification entries run (sequence-steps with at least one draft).
    pub verifications: u64,
    /// Draft tokens proposed and verified.
    pub proposed: u64,
    /// Draft tokens accepted.
    pub accepted: u64,
    /// Tokens emitted by verification entries (accepted drafts plus the
    /// correction or bonus token, cut at stop conditions).
    pub emitted: u64,
}

impl SpecStats {
    /// Accepted drafts over proposed drafts (0 when none were proposed).
    pub fn acceptance_rate(&self) -> f64 {
        if self.proposed == 0 { 0.0 } else { self.accepted as f64 / self.proposed as f64 }
    }

    /// Mean tokens emitted per verification entry (1 means no gain).
    pub fn mean_accepted_len(&self) -> f64 {
        if self.verifications == 0 { 0.0 } else { self.emitted as f64 / self.verifications as f64 }
    }
}

/// How many of `drafts` the target's per-row `samples` accept: the length of
/// the longest prefix with `samples[j] == drafts[j]` (`samples` has one more
/// row than `drafts`; see the module doc for why this is the exact rule).
pub fn accept_len(drafts: &[u32], samples: &[u32]) -> usize {
    drafts.iter().zip(samples).take_while(|(d, s)| d == s).count()
}

/// The per-entry arrays of a step (query offsets `cu` `[B + 1]`, context
/// lengths `lens` `[B]`, block tables `tables` `[B, stride]`) with every
/// verification entry among the first `decodes` entries (a decoding sequence
/// with drafts: `L = k + 1 > 1` query tokens) split into `L` single-token
/// entries that share its block table, entry `j` seeing the context up to
/// its own token (`len - L + 1 + j`). Attention of a split entry is causal
/// attention of the verification rows, so a verify step is a decode step
/// of `sum L` rows: it runs the paged decode kernel and the decode CUDA
/// graphs of plain decoding. Tokens, positions, slots and logit rows are
/// per token and do not change. Returns `None` when no entry is split.
pub fn split_verify_entries(
    cu: &[i32],
    lens: &[i32],
    tables: &[i32],
    stride: usize,
    decodes: usize,
) -> Option<(Vec<i32>, Vec<i32>, Vec<i32>)> {
    let q = |i: usize| (cu[i + 1] - cu[i]) as usize;
    if !(0..decodes.min(lens.len())).any(|i| q(i) > 1) {
        return None;
    }
    let mut out_cu = vec![0];
    let (mut out_lens, mut out_tables) = (Vec::new(), Vec::new());
    for (i, &len) in lens.iter().enumerate() {
        let row = &tables[i * stride..(i + 1) * stride];
        let l = q(i);
        if i < decodes && l > 1 {
            for j in 0..l {
                out_cu.push(cu[i] + j as i32 + 1);
                out_lens.push(len - l as i32 + 1 + j as i32);
                out_tables.extend_from_slice(row);
            }
        } else {
            out_cu.push(cu[i + 1]);
            out_lens.push(len);
            out_tables.extend_from_slice(row);
        }
    }
    Some((out_cu, out_lens, out_tables))
}
