//! The draft-model drafter: a smaller Llama sharing the target's vocabulary
//! proposes `k` tokens greedily, and [`truncate_layers`] builds such a model
//! from a Llama GGUF by keeping its first layers.
//!
//! The draft runs in its own [`Engine`] (its own KV pool and scheduler). Each
//! proposal is one batched request per sequence whose prompt is the sequence's
//! whole history; the draft engine's prefix cache keeps the full blocks of
//! earlier proposals, so a proposal mostly prefills the few tokens accepted
//! since the last one. Rollback of the draft state is implicit: a request ends
//! after its `k` tokens, and blocks holding rejected drafts are cached under
//! their own token content only, so they can never serve a different history.
//!
//! Invariants: the drafter is greedy (deterministic), so the engine's
//! acceptance rule is exactly Leviathan's with a point-mass `q` (see
//! [`crate::spec`]); proposals are draft-model argmaxes, always inside the
//! shared vocabulary.

use super::Drafter;
use crate::engine::{Engine, Request};
use crate::error::{Error, Result};
use crate::gguf::llama::KEY_BLOCK_COUNT;
use crate::gguf::{Gguf, GgufWriter};
use crate::model::ActElem;
use crate::model::Device;

/// A drafter backed by a second (smaller) model's engine.
pub struct DraftModel<D: Device, T: ActElem> {
    engine: Engine<D, T>,
}

impl<D: Device, T: ActElem> DraftModel<D, T> {
    /// A drafter over `engine` (built on the draft GGUF, with prefix caching
    /// on and `max_model_len` at least the target's). Errors when the engine
    /// has live requests or speculation of its own.
    pub fn new(engine: Engine<D, T>) -> Result<DraftModel<D, T>> {
        if engine.has_unfinished() {
            return Err(Error::Usage("the draft engine must be idle".into()));
        }
        Ok(DraftModel { engine })
    }

    /// The draft engine (statistics).
    pub fn engine(&self) -> &Engine<D, T> {
        &self.engine
    }
}

impl<D: Device, T: ActElem> Drafter<D> for DraftModel<D, T> {
    fn propose(&mut self, dev: &mut D, requests: &[(&[u32], usize)]) -> Result<Vec<Vec<u32>>> {
        let max_len = self.engine.scheduler().config().max_model_len;
        let mut out = vec![Vec::new(); requests.len()];
        let mut batch = Vec::new();
        let mut which = Vec::new();
        for (i, &(history, k)) in requests.iter().enumerate() {
            // A history the draft cannot hold gets no proposal (never an error).
            if k > 0 && !history.is_empty() && history.len() < max_len {
                which.push(i);
                batch.push(Request::greedy(history.to_vec(), k));
            }
        }
        if batch.is_empty() {
            return Ok(out);
        }
        for (i, c) in which.into_iter().zip(self.engine.run(dev, batch, |_| {})?) {
            out[i] = c.tokens;
        }
        Ok(out)
    }
}

/// The bytes of a GGUF holding the first `keep` layers of the Llama in `src`:
/// every metadata pair (with `llama.block_count = keep`), the embedding,
/// final norm and output tensors, and the tensors of blocks `0..keep`; the
/// vocabulary is shared exactly. Errors when `keep` is 0 or more than the
/// model's layers.
pub fn truncate_layers(src: &Gguf, keep: usize) -> Result<Vec<u8>> {
    let layers = src.metadata().require_u32(KEY_BLOCK_COUNT)? as usize;
    if keep == 0 || keep > layers {
        return Err(Error::Usage(format!("cannot keep {keep} of {layers} layers")));
    }
    let mut w = GgufWriter::new();
    for (key, value) in src.metadata().iter() {
        if key == KEY_BLOCK_COUNT {
            w.set(key, keep as u32)?;
        } else {
            w.set(key, value.clone())?;
        }
    }
    for t in src.tensors() {
        let layer =
            t.name.strip_prefix("blk.").and_then(|r| r.split('.').next()).and_then(|n| n.parse().ok());
        if layer.is_some_and(|l: usize| l >= keep) {
            continue;
        }
        w.add_tensor(&t.name, t.ty, &t.dims, src.tensor_bytes(&t.name)?.to_vec())?;
    }
    Ok(w.to_bytes())
}
