//! Tool calls in chat completions (OpenAI's `tools` and `tool_choice`).
//!
//! - The tools reach the model through the chat template: a template that
//!   mentions `tools` renders them itself (Qwen-style templates); otherwise
//!   the server adds a system message in the Hermes format that SmolLM2-
//!   and Qwen-style models know (the signatures inside `<tools></tools>`,
//!   calls asked for as `<tool_call>{"name": ..., "arguments": ...}</tool_call>`)
//!   and renders earlier calls and tool results in that format.
//! - `tool_choice`: `none` (the tools are not shown and output is text),
//!   `auto` (default: the output is parsed for calls), `required` (the
//!   output is constrained to one or more calls of the given tools) and
//!   `{"type": "function", "function": {"name"}}` (constrained to one call
//!   of that function). The constraint is a Lark grammar over the
//!   `<tool_call>` blocks with each function's `parameters` schema inside
//!   (`%json`), compiled like any `response_format`.
//! - Parsing ([`parse_calls`]): `<tool_call>` blocks whose JSON has a known
//!   `name` and an object `arguments`, or an output that is such a JSON
//!   object alone. Found calls become `tool_calls` (ids `call_...`,
//!   `arguments` as a JSON string), the rest of the text the `content`
//!   (`null` when empty), and `finish_reason` is `"tool_calls"`. A stream
//!   sends the text as it comes up to where a call could begin
//!   ([`releasable`]) and holds the rest until the end, when the calls go
//!   out in `delta.tool_calls` (each call whole, in the last chunk).
//!
//! Errors: malformed `tools` or `tool_choice`, a named function that is not
//! among the tools, or a `tool_choice` without tools are 400s naming the
//! field.

use super::error::ApiError;
use crate::grammar::GrammarSpec;
use serde_json::{Value, json};

/// One function the model may call.
#[derive(Clone, Debug, PartialEq)]
pub struct Function {
    /// Its name.
    pub name: String,
    /// The request's whole tool object (`{"type": "function", "function": {...}}`).
    pub tool: Value,
    /// Its parameters' JSON schema (`{"type": "object"}` when absent).
    pub parameters: Value,
}

/// `tool_choice`.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolChoice {
    /// The model may call tools or answer in text.
    Auto,
    /// The model must call one or more tools.
    Required,
    /// The model must call this function.
    Named(String),
}

/// The validated tools of a chat request (absent with `tool_choice: none`).
#[derive(Clone, Debug, PartialEq)]
pub struct Tools {
    /// The functions.
    pub functions: Vec<Function>,
    /// What the model must do.
    pub choice: ToolChoice,
    /// Whether several calls may come in one answer (`parallel_tool_calls`).
    pub parallel: bool,
}

/// The most calls one constrained answer may hold.
const MAX_CALLS: usize = 4;

/// Validates `tools`, `tool_choice` and `parallel_tool_calls`; `None` when
/// no tool is in play (none given, or `tool_choice: none`).
pub fn parse(
    tools: Option<&Vec<Value>>,
    choice: Option<&Value>,
    parallel: Option<bool>,
) -> Result<Option<Tools>, ApiError> {
    let tools = tools.filter(|t| !t.is_empty());
    let choice = match choice {
        None => None,
        Some(Value::String(s)) if s == "none" => return Ok(None),
        Some(Value::String(s)) if s == "auto" => Some(ToolChoice::Auto),
        Some(Value::String(s)) if s == "required" => Some(ToolChoice::Required),
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| o.get("type").and_then(Value::as_str) == Some("function"));
            match name {
                Some(n) => Some(ToolChoice::Named(n.to_string())),
                None => {
                    return Err(ApiError::invalid(
                        "tool_choice",
                        "`tool_choice` must be `none`, `auto`, `required` or {\"type\": \"function\", \
                         \"function\": {\"name\": ...}}.",
                    ));
                }
            }
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "tool_choice",
                "`tool_choice` must be `none`, `auto`, `required` or a named function.",
            ));
        }
    };
    let Some(tools) = tools else {
        return match choice {
            None | Some(ToolChoice::Auto) => Ok(None),
            Some(_) => Err(ApiError::invalid("tool_choice", "`tool_choice` needs `tools`.")),
        };
    };
    let mut functions = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        let bad = |m: &str| ApiError::invalid("tools", format!("`tools[{i}]`: {m}"));
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(bad("only tools of type `function` are supported."));
        }
        let f = t.get("function").and_then(Value::as_object).ok_or_else(|| bad("`function` is required."))?;
        let name = f.get("name").and_then(Value::as_str).filter(|n| !n.is_empty());
        let name = name.ok_or_else(|| bad("`function.name` is required (a non-empty string)."))?;
        if name.len() > 64 || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
            return Err(bad("`function.name` must be at most 64 of a-z, A-Z, 0-9, `_` and `-`."));
        }
        if functions.iter().any(|g: &Function| g.name == name) {
            return Err(bad(&format!("the function name `{name}` is repeated.")));
        }
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object"}),
            Some(p) if p.is_object() => p.clone(),
            Some(_) => return Err(bad("`function.parameters` must be a JSON schema (an object).")),
        };
        functions.push(Function { name: name.to_string(), tool: t.clone(), parameters });
    }
    let choice = choice.unwrap_or(ToolChoice::Auto);
    if let ToolChoice::Named(n) = &choice
        && !functions.iter().any(|f| &f.name == n)
    {
        return Err(ApiError::invalid(
            "tool_choice",
            format!("`tool_choice` names `{n}`, which is not in `tools`."),
        ));
    }
    Ok(Some(Tools { functions, choice, parallel: parallel.unwrap_or(true) }))
}

impl Tools {
    /// The tool objects as the chat template sees them.
    pub fn template_value(&self) -> Value {
        Value::Array(self.functions.iter().map(|f| f.tool.clone()).collect())
    }

    /// The Hermes-format system text that presents the tools to a model
    /// whose template does not render them.
    pub fn system_prompt(&self) -> String {
        let mut s = String::from(
            "You are a function calling AI model. You are provided with function signatures within \
             <tools></tools> XML tags. You may call one or more functions to assist with the user query. \
             Don't make assumptions about what values to plug into functions.\n<tools>\n",
        );
        for f in &self.functions {
            s.push_str(&f.tool["function"].to_string());
            s.push('\n');
        }
        s.push_str(
            "</tools>\nFor each function call return a JSON object with the function name and arguments \
             within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \
             \"arguments\": <args-json-object>}\n</tool_call>",
        );
        s
    }

    /// The output constraint of `required` and named choices (`None` for
    /// `auto`): `<tool_call>` blocks whose JSON is a call of an allowed
    /// function with arguments valid against its `parameters`.
    pub fn grammar(&self) -> Option<GrammarSpec> {
        let allowed: Vec<&Function> = match &self.choice {
            ToolChoice::Auto => return None,
            ToolChoice::Required => self.functions.iter().collect(),
            ToolChoice::Named(n) => self.functions.iter().filter(|f| &f.name == n).collect(),
        };
        let calls: Vec<Value> = allowed
            .iter()
            .map(|f| {
                json!({
                    "type": "object",
                    "properties": {"name": {"const": f.name}, "arguments": f.parameters},
                    "required": ["name", "arguments"],
                    "additionalProperties": false,
                })
            })
            .collect();
        let mut schema = if calls.len() == 1 { calls[0].clone() } else { json!({"anyOf": calls}) };
        schema["x-guidance"] =
            json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "});
        let more = matches!(self.choice, ToolChoice::Required) && self.parallel;
        let repeat = if more { format!(" (\"\\n\" call){{0,{}}}", MAX_CALLS - 1) } else { String::new() };
        Some(GrammarSpec::Lark(format!(
            "start: call{repeat}\ncall: \"<tool_call>\\n\" %json {schema} \"\\n</tool_call>\"\n"
        )))
    }
}

/// One parsed tool call.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    /// The function's name.
    pub name: String,
    /// Its arguments, as JSON text.
    pub arguments: String,
}

impl ToolCall {
    /// The OpenAI `tool_calls` entry (`index` for stream deltas).
    pub fn json(&self, index: usize, id: &str, delta: bool) -> Value {
        let mut v = json!({
            "id": id, "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        });
        if delta {
            v["index"] = json!(index);
        }
        v
    }
}

/// A call in `v` (`{"name", "arguments"}`) of a function of `tools`.
fn call_of(v: &Value, tools: &Tools) -> Option<ToolCall> {
    let name = v.get("name")?.as_str()?;
    if !tools.functions.iter().any(|f| f.name == name) {
        return None;
    }
    let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
        None => "{}".to_string(),
        Some(Value::String(s)) => serde_json::from_str::<Value>(s).ok().filter(Value::is_object)?.to_string(),
        Some(a) if a.is_object() => a.to_string(),
        Some(_) => return None,
    };
    Some(ToolCall { name: name.to_string(), arguments })
}

/// The tool calls in a model's `text` and the text left around them,
/// untrimmed (see the module doc); `None` when it holds no call.
pub fn parse_calls(text: &str, tools: &Tools) -> Option<(String, Vec<ToolCall>)> {
    const OPEN: &str = "<tool_call>";
    const CLOSE: &str = "</tool_call>";
    let mut calls = Vec::new();
    let mut rest = String::new();
    let mut at = 0;
    while let Some(i) = text[at..].find(OPEN) {
        let start = at + i;
        let body_start = start + OPEN.len();
        let (body, end) = match text[body_start..].find(CLOSE) {
            Some(j) => (&text[body_start..body_start + j], body_start + j + CLOSE.len()),
            None => (&text[body_start..], text.len()),
        };
        let Some(call) = serde_json::from_str::<Value>(body.trim()).ok().and_then(|v| call_of(&v, tools))
        else {
            break;
        };
        rest.push_str(&text[at..start]);
        calls.push(call);
        at = end;
    }
    rest.push_str(&text[at..]);
    if calls.is_empty() {
        let v: Value = serde_json::from_str(text.trim()).ok()?;
        let list = match v {
            Value::Array(a) => a,
            one => vec![one],
        };
        let calls: Option<Vec<ToolCall>> = list.iter().map(|v| call_of(v, tools)).collect();
        return calls.filter(|c| !c.is_empty()).map(|c| (String::new(), c));
    }
    Some((rest, calls))
}

/// How much of `held`, the text of a streamed choice with tools not yet
/// sent (`sent`: whether any was), may go out now as content: nothing while
/// the answer could still be a call written as bare JSON (nothing sent, and
/// the text is blank or starts with `{` or `[` after whitespace); otherwise
/// the text before the first `<tool_call>` and before an end that could
/// begin one, without its trailing whitespace (which waits for what follows
/// it, so that content before a call ends as the unstreamed answer's
/// trimmed content does).
pub fn releasable(held: &str, sent: bool) -> usize {
    const OPEN: &str = "<tool_call>";
    let rest = held.trim_start();
    if !sent && (rest.is_empty() || rest.starts_with('{') || rest.starts_with('[')) {
        return 0;
    }
    let open = held.find(OPEN).unwrap_or_else(|| {
        let partial = (1..OPEN.len()).rev().find(|&n| held.ends_with(&OPEN[..n])).unwrap_or(0);
        held.len() - partial
    });
    held[..open].trim_end().len()
}

/// A fresh tool call id.
pub fn call_id() -> String {
    format!("call_{:016x}", super::api::random_seed())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Vec<Value> {
        vec![json!({"type": "function", "function": {"name": "get_weather", "description": "Weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}},
                           "required": ["city"], "additionalProperties": false}}})]
    }

    #[test]
    fn streamed_text_goes_out_up_to_a_possible_call() {
        fn r(held: &str, sent: bool) -> &str {
            &held[..releasable(held, sent)]
        }
        // Bare JSON (or nothing yet) could be a call: held.
        for held in ["", "  \n", " {\"name\"", "[{", "{"] {
            assert_eq!(r(held, false), "", "{held:?}");
        }
        // Text goes out without its trailing whitespace.
        assert_eq!(r("  Hello there ", false), "  Hello there");
        assert_eq!(r(" more {x} ", true), " more {x}");
        assert_eq!(r("{\"a\": 1}", true), "{\"a\": 1}");
        // Up to a call, or an end that could begin one.
        assert_eq!(r("Sure.\n<tool_call>{", false), "Sure.");
        assert_eq!(r("Sure. <tool", false), "Sure.");
        assert_eq!(r("a <b", true), "a <b");
        assert_eq!(r("<tool_call>", true), "");
        assert_eq!(r("<", false), "");
        assert_eq!(r("x é <to", true), "x é");
    }

    #[test]
    fn choices_parse_and_bad_ones_are_400s() {
        let t = weather();
        assert_eq!(parse(Some(&t), None, None).unwrap().unwrap().choice, ToolChoice::Auto);
        assert!(parse(Some(&t), Some(&json!("none")), None).unwrap().is_none());
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        assert_eq!(
            parse(Some(&t), Some(&named), Some(false)).unwrap().unwrap().choice,
            ToolChoice::Named("get_weather".into())
        );
        for (tools, choice) in [
            (Some(t.clone()), json!("sometimes")),
            (Some(t.clone()), json!({"type": "function", "function": {"name": "nope"}})),
            (None, json!("required")),
            (Some(vec![json!({"type": "retrieval"})]), json!("auto")),
            (Some(vec![json!({"type": "function", "function": {"name": "a b"}})]), json!("auto")),
        ] {
            let e = parse(tools.as_ref(), Some(&choice), None).unwrap_err();
            assert_eq!(e.status, 400, "{e:?}");
        }
    }

    #[test]
    fn calls_are_parsed_from_tags_or_bare_json() {
        let t = parse(Some(&weather()), None, None).unwrap().unwrap();
        let text = "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
        let (rest, calls) = parse_calls(text, &t).unwrap();
        assert_eq!(rest, "Sure.\n");
        assert_eq!(
            calls,
            vec![ToolCall { name: "get_weather".into(), arguments: "{\"city\":\"Oslo\"}".into() }]
        );
        let (rest, calls) = parse_calls("{\"name\": \"get_weather\", \"arguments\": {}}", &t).unwrap();
        assert_eq!((rest.as_str(), calls.len()), ("", 1));
        assert!(parse_calls("It is sunny.", &t).is_none());
        assert!(parse_calls("<tool_call>{\"name\": \"other\", \"arguments\": {}}</tool_call>", &t).is_none());
    }

    #[test]
    fn required_and_named_choices_compile_to_grammars() {
        let tok = crate::tokenizer::Tokenizer::from_vocab(
            &crate::gguf::tiny::tiny_vocab(crate::gguf::tiny::tiny_vocab_min_size()).unwrap(),
        )
        .unwrap();
        let g = crate::grammar::GrammarCompiler::new(&tok, tok.vocab_size()).unwrap();
        let t = parse(Some(&weather()), Some(&json!("required")), None).unwrap().unwrap();
        let spec = t.grammar().unwrap();
        let mut c = g.compile(&spec).unwrap();
        let call =
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>";
        let ids = tok.encode(call, false).unwrap();
        assert_eq!(c.valid_prefix(&ids), ids.len(), "{spec:?}");
        for &id in &ids {
            c.consume(id).unwrap();
        }
        assert!(c.is_accepting());
        let auto = parse(Some(&weather()), None, None).unwrap().unwrap();
        assert!(auto.grammar().is_none());
    }

    #[test]
    fn a_template_without_tools_gets_the_hermes_format() {
        let req: crate::server::api::ChatRequest = serde_json::from_value(json!({
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
            ],
            "tools": weather()
        }))
        .unwrap();
        let t = parse(req.tools.as_ref(), None, None).unwrap().unwrap();
        let template =
            crate::chat::ChatTemplate::new(crate::gguf::tiny::SMOLLM2_CHAT_TEMPLATE, "", "").unwrap();
        assert!(!template.renders_tools());
        let text = template.render(&req.messages_hermes(&t.system_prompt()).unwrap(), true).unwrap();
        assert!(text.starts_with("<|im_start|>system\nYou are a function calling AI model."), "{text}");
        assert!(text.contains("<tools>\n{\"name\":\"get_weather\",\"description\":\"Weather\""), "{text}");
        assert!(
            text.contains(
                "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}\n</tool_call>"
            ),
            "{text}"
        );
        assert!(text.contains("<|im_start|>tool\n<tool_response>\nsunny\n</tool_response>"), "{text}");
        // A template that reads `tools` renders them itself.
        let own = crate::chat::ChatTemplate::new(
            "{% for t in tools %}{{ t.function.name }}{% endfor %}|{{ messages[1].tool_calls[0].function.arguments.city }}",
            "",
            "",
        )
        .unwrap();
        assert!(own.renders_tools());
        let text = own.render_with_tools(&req.messages_json().unwrap(), &t.template_value(), true).unwrap();
        assert_eq!(text, "get_weather|Oslo");
    }
}
