//! Speculative decoding on the command line: the flags `generate` and `serve`
//! share ([`SpecArgs`]), their checked form ([`Speculation`], carried by
//! [`crate::app::LoadOptions::speculation`]), and [`install`], which the
//! loader calls to set a freshly built engine up (prompt lookup, or a draft
//! model loaded from a GGUF file or cut from the target's first layers by
//! [`truncate_layers`], on the same device and in the same dtype).
//!
//! Invariants: a draft model must share the target's vocabulary (checked by
//! size); its engine has prefix caching on and the target's `max_model_len`
//! (what [`DraftModel`] needs); flag combinations that would be silently
//! ignored (draft flags without `--speculate draft`) are usage errors.

use super::draft::{DraftModel, truncate_layers};
use super::{SpecConfig, SpecMethod, SpecStats};
use crate::app::{self, LoadOptions};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::gguf::{Gguf, LlamaConfig};
use crate::model::ActElem;
use crate::model::Device;
use std::path::PathBuf;

/// Where a draft model comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DraftSource {
    /// A GGUF file sharing the target's vocabulary.
    File(PathBuf),
    /// The target's own first `n` layers ([`truncate_layers`]).
    Layers(usize),
}

/// Checked speculation settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Speculation {
    /// The drafter.
    pub method: SpecMethod,
    /// Draft tokens per sequence and step (at least 1).
    pub k: usize,
    /// The draft model (`Some` exactly when `method` is [`SpecMethod::Draft`]).
    pub draft: Option<DraftSource>,
}

impl Speculation {
    /// Prompt lookup with `k` drafts per step.
    pub fn ngram(k: usize) -> Speculation {
        Speculation { method: SpecMethod::Ngram, k, draft: None }
    }

    /// A draft of the target's first `layers` layers with `k` drafts per step.
    pub fn draft_layers(layers: usize, k: usize) -> Speculation {
        Speculation { method: SpecMethod::Draft, k, draft: Some(DraftSource::Layers(layers)) }
    }

    /// A short description, e.g. `ngram, k = 4` or `draft of 8 layers, k = 4`.
    pub fn describe(&self) -> String {
        match &self.draft {
            None => format!("ngram, k = {}", self.k),
            Some(DraftSource::Layers(n)) => format!("draft of {n} layers, k = {}", self.k),
            Some(DraftSource::File(p)) => format!("draft {}, k = {}", p.display(), self.k),
        }
    }
}

/// Parses `--speculate`.
fn parse_method(s: &str) -> std::result::Result<SpecMethod, String> {
    s.parse::<SpecMethod>().map_err(|e| e.to_string())
}

/// The speculation flags of `generate` and `serve`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct SpecArgs {
    /// Speculative decoding: `ngram` (prompt lookup) or `draft` (a smaller
    /// model; needs --draft-model or --draft-layers). Outputs are unchanged.
    #[arg(long, value_parser = parse_method)]
    pub speculate: Option<SpecMethod>,
    /// The draft model of `--speculate draft`: a GGUF sharing the target's vocabulary.
    #[arg(long)]
    pub draft_model: Option<PathBuf>,
    /// `--speculate draft` with the target's own first N layers as the draft (no file).
    #[arg(long)]
    pub draft_layers: Option<usize>,
    /// Draft tokens proposed per sequence and step.
    #[arg(long, default_value_t = 4)]
    pub num_speculative_tokens: usize,
}

impl SpecArgs {
    /// The checked settings (`None`: speculation off); errors on missing or
    /// contradictory flags.
    pub fn speculation(&self) -> Result<Option<Speculation>> {
        let draft_flags = self.draft_model.is_some() || self.draft_layers.is_some();
        let Some(method) = self.speculate else {
            if draft_flags {
                return Err(Error::Usage("--draft-model and --draft-layers need --speculate draft".into()));
            }
            return Ok(None);
        };
        if self.num_speculative_tokens == 0 {
            return Err(Error::Usage("--num-speculative-tokens must be at least 1".into()));
        }
        let draft = match (method, &self.draft_model, self.draft_layers) {
            (SpecMethod::Ngram, None, None) => None,
            (SpecMethod::Ngram, _, _) => {
                return Err(Error::Usage("--draft-model and --draft-layers need --speculate draft".into()));
            }
            (SpecMethod::Draft, Some(p), None) => Some(DraftSource::File(p.clone())),
            (SpecMethod::Draft, None, Some(n)) => Some(DraftSource::Layers(n)),
            (SpecMethod::Draft, None, None) => {
                return Err(Error::Usage(
                    "--speculate draft needs --draft-model PATH (a GGUF sharing the model's vocabulary) \
                     or --draft-layers N (the model's first N layers)"
                        .into(),
                ));
            }
            (SpecMethod::Draft, Some(_), Some(_)) => {
                return Err(Error::Usage("give --draft-model or --draft-layers, not both".into()));
            }
        };
        Ok(Some(Speculation { method, k: self.num_speculative_tokens, draft }))
    }
}

/// Free device memory in bytes (the GPU the current context is on).
fn free_gpu_memory() -> Result<u64> {
    let (free, _) = cudarc::driver::result::mem_get_info()
        .map_err(|e| Error::Usage(format!("cannot query free GPU memory for the draft model: {e}")))?;
    Ok(free as u64)
}

/// Sets `engine` (built from `gguf` per `opts`) up for `spec`: prompt lookup,
/// or a draft model built on `dev` in dtype `T` with the loader's options
/// (sized by the GPU's free memory when `is_gpu`, else the host budget).
pub fn install<D: Device, T: ActElem>(
    dev: &mut D,
    engine: &mut Engine<D, T>,
    gguf: &Gguf,
    spec: &Speculation,
    opts: &LoadOptions,
    is_gpu: bool,
) -> Result<()>
where
    DraftModel<D, T>: Send + 'static,
{
    let source = match (spec.method, &spec.draft) {
        (SpecMethod::Ngram, _) => return engine.set_speculation(Some(SpecConfig::ngram(spec.k))),
        (SpecMethod::Draft, Some(s)) => s,
        (SpecMethod::Draft, None) => {
            return Err(Error::Usage("--speculate draft needs a draft model".into()));
        }
    };
    let draft = match source {
        DraftSource::File(p) => {
            let path = app::resolve_model(p);
            if !path.is_file() {
                return Err(Error::Usage(format!("draft model file {} not found", path.display())));
            }
            Gguf::open(&path)?
        }
        DraftSource::Layers(n) => Gguf::from_bytes(truncate_layers(gguf, *n)?)?,
    };
    let target = LlamaConfig::from_metadata(gguf.metadata())?;
    let config = LlamaConfig::from_metadata(draft.metadata())?;
    if config.vocab_size != target.vocab_size {
        return Err(Error::Usage(format!(
            "the draft model's vocabulary ({} tokens) differs from the model's ({})",
            config.vocab_size, target.vocab_size
        )));
    }
    let draft_opts = LoadOptions {
        max_model_len: engine.scheduler().config().max_model_len,
        prefix_caching: true,
        speculation: None,
        ..opts.clone()
    };
    if opts.verbose {
        eprintln!("tessera: speculative decoding ({}); loading the draft model", spec.describe());
    }
    let available = if is_gpu { Some(free_gpu_memory()?) } else { None };
    let (draft_engine, _) = app::build_engine::<D, T>(dev, &draft, &config, available, &draft_opts)?;
    engine.set_drafter(spec.k, Box::new(DraftModel::new(draft_engine)?))
}

/// A one-line report of speculative work, e.g. for `generate`'s stderr.
pub fn summary(spec: &Speculation, stats: &SpecStats) -> String {
    format!(
        "speculation ({}): {}/{} drafts accepted ({:.1}%), mean accepted length {:.2} tokens per \
         verification ({} verifications)",
        spec.describe(),
        stats.accepted,
        stats.proposed,
        100.0 * stats.acceptance_rate(),
        stats.mean_accepted_len(),
        stats.verifications
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cmd {
        #[command(flatten)]
        spec: SpecArgs,
    }

    fn parse(args: &[&str]) -> Result<Option<Speculation>> {
        let mut all = vec!["x"];
        all.extend_from_slice(args);
        Cmd::try_parse_from(all).map_err(|e| Error::Usage(e.to_string()))?.spec.speculation()
    }

    #[test]
    fn flags_parse_and_check() {
        assert_eq!(parse(&[]).unwrap(), None);
        assert_eq!(parse(&["--speculate", "ngram"]).unwrap(), Some(Speculation::ngram(4)));
        assert_eq!(
            parse(&["--speculate", "draft", "--draft-layers", "8", "--num-speculative-tokens", "3"]).unwrap(),
            Some(Speculation::draft_layers(8, 3))
        );
        assert_eq!(
            parse(&["--speculate", "draft", "--draft-model", "d.gguf"]).unwrap().unwrap().draft,
            Some(DraftSource::File(PathBuf::from("d.gguf")))
        );
        let usage = |args: &[&str], needle: &str| match parse(args) {
            Err(Error::Usage(m)) => assert!(m.contains(needle), "{args:?}: {m}"),
            other => panic!("{args:?}: {other:?}"),
        };
        usage(&["--speculate", "draft"], "--speculate draft needs --draft-model PATH");
        usage(&["--speculate", "draft", "--draft-model", "d", "--draft-layers", "2"], "not both");
        usage(&["--draft-layers", "2"], "need --speculate draft");
        usage(&["--speculate", "ngram", "--draft-model", "d"], "need --speculate draft");
        usage(&["--speculate", "ngram", "--num-speculative-tokens", "0"], "at least 1");
        usage(&["--speculate", "medusa"], "unknown speculation method");
    }

    #[test]
    fn summary_reports_the_rates() {
        let st = SpecStats { verifications: 4, proposed: 16, accepted: 8, emitted: 12 };
        let s = summary(&Speculation::ngram(4), &st);
        assert!(s.contains("8/16 drafts accepted (50.0%)") && s.contains("3.00 tokens"), "{s}");
    }
}
