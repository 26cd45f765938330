//! The `generate` and `chat` commands as [`EngineTask`]s.
//!
//! `generate` encodes each prompt (through the chat template with `--chat`),
//! runs them as one continuous batch and prints, per prompt, the text (a
//! single prompt streams token by token) or, with `--json`, one JSON object
//! per line: `{"prompt", "token_ids", "text"}` with the generated ids only.
//! A summary line (tokens, time, tok/s) goes to stderr. With
//! `--json-schema FILE` or `--grammar FILE` (Lark), every output is
//! constrained to the schema or grammar ([`crate::grammar`]).
//!
//! `chat` reads user turns from stdin, renders the whole conversation with
//! the model's chat template, and streams the assistant's reply; the
//! prefix cache makes each turn recompute only the new tokens' blocks.
//!
//! Invariants: stdout carries only generated text (or JSON); notices go to
//! stderr; streaming never splits a UTF-8 character (the detokenizer holds
//! incomplete bytes back).

use crate::app::{Context, EngineTask, Session};
use crate::chat::Message;
use crate::engine::{Completion, Request};
use crate::error::{Error, Result};
use crate::model::ActElem;
use crate::model::Device;
use crate::model::sampler::SamplingParams;
use crate::tokenizer::Detokenizer;
use std::io::{BufRead, Write};
use std::time::Instant;

/// The `generate` command.
pub struct Generate {
    /// Prompt texts.
    pub prompts: Vec<String>,
    /// Wrap each prompt as a user turn of the chat template.
    pub chat: bool,
    /// Sampling settings (the seed is offset per prompt: prompt `i` uses
    /// `seed + i`).
    pub params: SamplingParams,
    /// The most new tokens per prompt.
    pub max_tokens: usize,
    /// Keep generating past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Print JSON lines instead of text.
    pub json: bool,
    /// Structured output: the constraint every output must match.
    pub grammar: Option<crate::grammar::GrammarSpec>,
}

/// A prompt's ids: through the chat template or as a raw completion prompt.
fn encode(ctx: &Context, text: &str, chat: bool) -> Result<Vec<u32>> {
    if chat {
        let t = ctx
            .template
            .as_ref()
            .ok_or_else(|| Error::Usage("the model has no chat template; run without --chat".into()))?;
        let rendered = t.render(&[Message::user(text)], true)?;
        ctx.tokenizer.encode(&rendered, true)
    } else {
        ctx.tokenizer.encode_prompt(text)
    }
}

/// Prints the end-of-run summary to stderr.
fn summary(done: &[Completion], secs: f64, ctx: &Context) {
    let generated: usize = done.iter().map(|c| c.tokens.len()).sum();
    let prompt: usize = done.iter().map(|c| c.prompt.len()).sum();
    let ttft = done.iter().map(|c| c.ttft.as_secs_f64()).fold(0.0, f64::max);
    eprintln!(
        "tessera: {} prompt(s), {prompt} prompt tokens, {generated} generated in {secs:.2} s ({:.1} tok/s, \
         max TTFT {:.0} ms) on {}",
        done.len(),
        generated as f64 / secs.max(1e-9),
        ttft * 1e3,
        ctx.device
    );
}

/// Streams token `t`: writes the text it completes to `out` at once, or
/// keeps the detokenization error in `err` (the command returns it after the
/// run).
fn echo(detok: &mut Detokenizer<'_>, out: &mut impl Write, err: &mut Option<Error>, t: u32) {
    match detok.push(t) {
        Ok(s) => {
            let _ = write!(out, "{s}");
            let _ = out.flush();
        }
        Err(x) => *err = Some(x),
    }
}

impl EngineTask for Generate {
    type Output = Vec<Completion>;

    fn run<D: Device, T: ActElem>(self, s: Session<'_, D, T>) -> Result<Vec<Completion>> {
        let Session { dev, engine, ctx } = s;
        if self.prompts.is_empty() {
            return Err(Error::Usage("no prompt given (use --prompt or --prompts-file)".into()));
        }
        let stop = if self.ignore_eos { Vec::new() } else { ctx.tokenizer.eog_tokens().to_vec() };
        let constraint = match &self.grammar {
            Some(spec) => {
                let vocab = engine.model().weights.config.vocab_size;
                let compiler = crate::grammar::GrammarCompiler::new(&ctx.tokenizer, vocab)?;
                let what = if matches!(spec, crate::grammar::GrammarSpec::Lark(_)) {
                    "--grammar"
                } else {
                    "--json-schema"
                };
                Some(compiler.compile(spec).map_err(|e| Error::Usage(format!("{what}: {e}")))?)
            }
            None => None,
        };
        let mut requests = Vec::with_capacity(self.prompts.len());
        for (i, p) in self.prompts.iter().enumerate() {
            let mut params = self.params.clone();
            params.seed = params.seed.wrapping_add(i as u64);
            requests.push(Request {
                prompt: encode(ctx, p, self.chat)?,
                params,
                max_tokens: self.max_tokens,
                stop_tokens: stop.clone(),
                constraint: constraint.clone(),
            });
        }
        let stream = self.prompts.len() == 1 && !self.json;
        let mut detok = ctx.tokenizer.detokenizer(false);
        let mut out = std::io::stdout().lock();
        let mut err = None;
        let t0 = Instant::now();
        let done = engine.run(dev, requests, |e| {
            if stream && let Some(t) = e.token {
                echo(&mut detok, &mut out, &mut err, t);
            }
        })?;
        let secs = t0.elapsed().as_secs_f64();
        if let Some(e) = err {
            return Err(e);
        }
        if stream {
            let _ = writeln!(out, "{}", detok.finish());
        } else {
            for (p, c) in self.prompts.iter().zip(&done) {
                let text = ctx.tokenizer.decode(&c.tokens, false)?;
                if self.json {
                    let line = serde_json::json!({"prompt": p, "token_ids": c.tokens, "text": text});
                    let _ = writeln!(out, "{line}");
                } else {
                    let _ = writeln!(out, "### {p}\n{text}\n");
                }
            }
        }
        summary(&done, secs, ctx);
        Ok(done)
    }
}

/// The `chat` command: an interactive conversation over stdin/stdout.
pub struct Chat {
    /// An optional system prompt.
    pub system: Option<String>,
    /// Sampling settings.
    pub params: SamplingParams,
    /// The most new tokens per reply.
    pub max_tokens: usize,
}

impl EngineTask for Chat {
    type Output = ();

    fn run<D: Device, T: ActElem>(self, s: Session<'_, D, T>) -> Result<()> {
        let template =
            s.ctx.template.as_ref().ok_or_else(|| {
                Error::Usage("the model has no chat template (tokenizer.chat_template)".into())
            })?;
        let Session { dev, engine, ctx } = s;
        let mut messages: Vec<Message> = self.system.iter().map(Message::system).collect();
        let stdin = std::io::stdin();
        let mut out = std::io::stdout().lock();
        eprintln!("tessera chat: type a message and press Enter; an empty line or end of input quits.");
        let mut turn = 0u64;
        loop {
            let _ = write!(out, "> ");
            let _ = out.flush();
            let mut line = String::new();
            if stdin.lock().read_line(&mut line).map_err(|e| Error::Usage(format!("reading stdin: {e}")))?
                == 0
            {
                break;
            }
            let line = line.trim_end_matches(['\n', '\r']);
            if line.trim().is_empty() {
                break;
            }
            messages.push(Message::user(line));
            let prompt = ctx.tokenizer.encode(&template.render(&messages, true)?, true)?;
            let mut params = self.params.clone();
            params.seed = params.seed.wrapping_add(turn);
            turn += 1;
            let req = Request {
                prompt,
                params,
                max_tokens: self.max_tokens,
                stop_tokens: ctx.tokenizer.eog_tokens().to_vec(),
                constraint: None,
            };
            let mut detok = ctx.tokenizer.detokenizer(false);
            let mut err = None;
            let done = engine.run(dev, vec![req], |e| {
                if let Some(t) = e.token {
                    echo(&mut detok, &mut out, &mut err, t);
                }
            })?;
            if let Some(e) = err {
                return Err(e);
            }
            let _ = writeln!(out, "{}", detok.finish());
            let reply = done.first().map(|c| ctx.tokenizer.decode(&c.tokens, false)).transpose()?;
            messages.push(Message::assistant(reply.unwrap_or_default()));
        }
        Ok(())
    }
}
