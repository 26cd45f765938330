//! Chat prompts: a model's Jinja chat template (`tokenizer.chat_template`)
//! rendered with minijinja the way HF `transformers` renders it.
//!
//! The environment matches `transformers`' `apply_chat_template`: `trim_blocks`
//! and `lstrip_blocks` on, loop controls (`break`/`continue`) available, the
//! context variables `messages` (a list of `{role, content}` maps),
//! `add_generation_prompt`, `bos_token` and `eos_token`, the
//! `raise_exception(message)` function, and Python string and dict methods
//! (`.strip()`, `.startswith()`, `.items()`, ...) through minijinja-contrib's
//! `pycompat`.
//!
//! Invariant: a [`ChatTemplate`] compiled once; rendering is a pure function
//! of the messages and flags, and every template error (syntax at compile time,
//! `raise_exception` or undefined behaviour at render time) is an
//! [`Error::ChatTemplate`] naming the template location.

use crate::error::{Error, Result};
use crate::gguf::Vocab;
use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, ErrorKind, Value};
use std::collections::BTreeMap;

/// The name the template is registered under (appears in error messages).
const TEMPLATE_NAME: &str = "chat_template";

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user` or `assistant` (any string is passed through).
    pub role: String,
    /// The message text.
    pub content: String,
}

impl Message {
    /// A message with `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message { role: role.into(), content: content.into() }
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Message {
        Message::new("system", content)
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Message {
        Message::new("user", content)
    }

    /// An assistant message.
    pub fn assistant(content: impl Into<String>) -> Message {
        Message::new("assistant", content)
    }
}

/// A JSON value as a template value (objects become maps, keys sorted).
fn json_value(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::from(()),
        serde_json::Value::Bool(b) => Value::from(*b),
        serde_json::Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Value::from(i),
            (None, Some(f)) => Value::from(f),
            _ => Value::from(n.to_string()),
        },
        serde_json::Value::String(s) => Value::from(s.as_str()),
        serde_json::Value::Array(a) => Value::from(a.iter().map(json_value).collect::<Vec<_>>()),
        serde_json::Value::Object(o) => Value::from(
            o.iter().map(|(k, v)| (k.clone(), json_value(v))).collect::<BTreeMap<String, Value>>(),
        ),
    }
}

fn template_err(e: minijinja::Error) -> Error {
    // The alternate form adds the template location and the failing line.
    Error::ChatTemplate(format!("{e:#}"))
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    /// Whether the template reads a `tools` variable (renders tool
    /// signatures itself).
    renders_tools: bool,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token` and `eos_token` are the texts the
    /// template sees as `bos_token` and `eos_token`.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        let syntax =
            SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build().map_err(template_err)?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> Result<Value, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
        });
        env.add_template_owned(TEMPLATE_NAME, source.to_string()).map_err(template_err)?;
        let renders_tools = source.contains("tools");
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            renders_tools,
        })
    }

    /// The template of a vocabulary (`tokenizer.chat_template`), with its BOS and
    /// EOS token texts; a vocabulary without a template is an error.
    pub fn from_vocab(vocab: &Vocab) -> Result<ChatTemplate> {
        let source = vocab.chat_template.as_deref().ok_or_else(|| {
            Error::ChatTemplate("the model has no chat template (tokenizer.chat_template)".to_string())
        })?;
        let text =
            |id: Option<u32>| id.and_then(|i| vocab.tokens.get(i as usize)).cloned().unwrap_or_default();
        ChatTemplate::new(source, &text(vocab.bos), &text(vocab.eos))
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends with the
    /// opening of an assistant turn.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| {
                let mut map = BTreeMap::new();
                map.insert("role", Value::from(m.role.as_str()));
                map.insert("content", Value::from(m.content.as_str()));
                Value::from(map)
            })
            .collect();
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        self.env.get_template(TEMPLATE_NAME).and_then(|t| t.render(ctx)).map_err(template_err)
    }

    /// Whether the template renders a `tools` list itself.
    pub fn renders_tools(&self) -> bool {
        self.renders_tools
    }

    /// Renders messages given as JSON objects (OpenAI's shape: `role`,
    /// `content`, `tool_calls`, `tool_call_id`, ...) with `tools` (the
    /// request's tool objects) as the template's `tools` variable.
    pub fn render_with_tools(
        &self,
        messages: &[serde_json::Value],
        tools: &serde_json::Value,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let ctx = minijinja::context! {
            messages => messages.iter().map(json_value).collect::<Vec<Value>>(),
            tools => json_value(tools),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        self.env.get_template(TEMPLATE_NAME).and_then(|t| t.render(ctx)).map_err(template_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::tiny::SMOLLM2_CHAT_TEMPLATE;

    fn smollm2() -> ChatTemplate {
        ChatTemplate::new(SMOLLM2_CHAT_TEMPLATE, "<|im_start|>", "<|im_end|>").unwrap()
    }

    const DEFAULT_SYSTEM: &str = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n";

    /// Without a system message the template adds SmolLM2's default one; the
    /// generation prompt opens an assistant turn.
    #[test]
    fn smollm2_adds_default_system_and_generation_prompt() {
        let out = smollm2().render(&[Message::user("What is the tallest mountain on Earth?")], true).unwrap();
        assert_eq!(
            out,
            format!(
                "{DEFAULT_SYSTEM}<|im_start|>user\nWhat is the tallest mountain on Earth?<|im_end|>\n<|im_start|>assistant\n"
            )
        );
    }

    /// The golden chat prompt (shared/golden, case 3) is exactly this rendering.
    #[test]
    fn smollm2_matches_the_golden_chat_prompt() {
        let golden: serde_json::Value =
            serde_json::from_str(include_str!("../tests/data/smollm2-135m-q4_1.json")).unwrap();
        let prompt = golden["cases"][2]["prompt"].as_str().unwrap();
        let out = smollm2().render(&[Message::user("What is the tallest mountain on Earth?")], true).unwrap();
        assert_eq!(out, prompt);
    }

    /// A given system message replaces the default; a multi-turn conversation
    /// without the generation prompt ends after the last message.
    #[test]
    fn smollm2_multi_turn() {
        let msgs = [
            Message::system("Be brief."),
            Message::user("Hi"),
            Message::assistant("Hello!"),
            Message::user("2+2?"),
        ];
        let out = smollm2().render(&msgs, false).unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
             <|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
        );
        let first_is_user = smollm2().render(&msgs[1..2], false).unwrap();
        assert_eq!(first_is_user, format!("{DEFAULT_SYSTEM}<|im_start|>user\nHi<|im_end|>\n"));
        assert_eq!(smollm2().render(&[], true).unwrap(), "<|im_start|>assistant\n");
    }

    /// HF conventions: trim/lstrip blocks, bos/eos variables, Python methods,
    /// loop controls and `raise_exception`.
    #[test]
    fn hf_conventions() {
        let t = ChatTemplate::new(
            "{{ bos_token }}\n  {% for m in messages %}\n{% if m.role == 'skip' %}{% continue %}{% endif %}\
             [{{ m.role.upper() }}:{{ m['content'].strip() }}]\n  {% endfor %}\n{{ eos_token }}",
            "<s>",
            "</s>",
        )
        .unwrap();
        let out =
            t.render(&[Message::user("  hi  "), Message::new("skip", "x"), Message::assistant("yo")], false);
        assert_eq!(out.unwrap(), "<s>\n[USER:hi]\n[ASSISTANT:yo]\n</s>");

        let t = ChatTemplate::new(
            "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}ok",
            "",
            "",
        )
        .unwrap();
        assert_eq!(t.render(&[Message::user("a")], false).unwrap(), "ok");
        let e = t.render(&[Message::system("a")], false).unwrap_err();
        assert!(
            matches!(&e, Error::ChatTemplate(m) if m.contains("first message must be from the user")),
            "{e}"
        );
    }

    #[test]
    fn syntax_errors_are_reported() {
        let e = ChatTemplate::new("{% for m in messages %}{{ m.content }}", "", "").unwrap_err();
        assert!(matches!(&e, Error::ChatTemplate(m) if m.contains("chat_template")), "{e}");
    }

    #[test]
    fn vocab_without_template_is_an_error() {
        let mut v = crate::gguf::tiny::tiny_vocab(crate::gguf::tiny::tiny_vocab_min_size()).unwrap();
        let t = ChatTemplate::from_vocab(&v).unwrap();
        assert_eq!((t.bos_token.as_str(), t.eos_token.as_str()), ("<|im_start|>", "<|im_end|>"));
        v.chat_template = None;
        assert!(matches!(ChatTemplate::from_vocab(&v), Err(Error::ChatTemplate(_))));
    }
}
