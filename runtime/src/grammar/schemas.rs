//! Structured output on the real model (SmolLM2-135M Q4_1, fetched by `make
//! model`): ten JSON schemas (nested objects, bounded arrays, enums, numbers
//! with bounds, required and optional fields, strings with patterns) times
//! twenty chat prompts, each schema's prompts in one batch; every output
//! must finish with a stop token, parse, and validate against its schema
//! (the `jsonschema` validator). The native CPU backend runs it as a test,
//! the GPU as `tessera gpu-check --only schemas` ([`schema_checks`]).

use super::{GrammarCompiler, GrammarSpec};
use crate::app::{DEFAULT_MODEL, DeviceChoice, EngineTask, LoadOptions, Session, resolve_model, run_task};
use crate::chat::Message;
use crate::check::CheckRow;
use crate::engine::Request;
use crate::error::{Error, Result};
use crate::model::ActElem;
use crate::model::Device;
use crate::model::sampler::SamplingParams;
use crate::scheduler::FinishReason;
use serde_json::{Value, json};

/// The ten schemas, bounded so that every output finishes.
fn schemas() -> Vec<Value> {
    let obj = |props: Value, required: Value| json!({"type": "object", "properties": props, "required": required, "additionalProperties": false});
    vec![
        obj(
            json!({"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120}}),
            json!(["name", "age"]),
        ),
        obj(
            json!({"user": obj(json!({"id": {"type": "integer", "minimum": 1, "maximum": 9999},
                "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"}}), json!(["id", "email"])),
                "active": {"type": "boolean"}}),
            json!(["user", "active"]),
        ),
        obj(
            json!({"tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 3}}),
            json!(["tags"]),
        ),
        obj(
            json!({"color": {"enum": ["red", "green", "blue"]}, "size": {"type": "string", "enum": ["S", "M", "L"]}}),
            json!(["color", "size"]),
        ),
        obj(
            json!({"price": {"type": "number", "minimum": 0, "maximum": 1000},
                   "qty": {"type": "integer", "minimum": 1, "maximum": 50}}),
            json!(["price", "qty"]),
        ),
        obj(
            json!({"title": {"type": "string", "maxLength": 20}, "subtitle": {"type": "string", "maxLength": 10},
                   "year": {"type": "integer", "minimum": 1900, "maximum": 2100}}),
            json!(["title"]),
        ),
        obj(
            json!({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
                   "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}),
            json!(["code", "zip"]),
        ),
        obj(
            json!({"items": {"type": "array", "minItems": 1, "maxItems": 2, "items": obj(
                json!({"name": {"type": "string", "maxLength": 8}, "count": {"type": "integer", "minimum": 0, "maximum": 9}}),
                json!(["name", "count"]))}}),
            json!(["items"]),
        ),
        obj(
            json!({"a": obj(json!({"b": obj(json!({"c": obj(json!({"value": {"enum": [1, 2, 3]}}), json!(["value"]))}),
                json!(["c"]))}), json!(["b"]))}),
            json!(["a"]),
        ),
        obj(
            json!({"status": {"enum": ["ok", "error"]}, "code": {"type": "integer", "minimum": 100, "maximum": 599},
                   "messages": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 2},
                   "meta": obj(json!({"retry": {"type": "boolean"}}), json!(["retry"]))}),
            json!(["status", "code"]),
        ),
    ]
}

/// Twenty requests for data, one per topic.
const TOPICS: [&str; 20] = [
    "a person",
    "a user account",
    "a blog post",
    "a T-shirt",
    "a shop item",
    "a book",
    "a parcel",
    "an order",
    "a config",
    "an HTTP reply",
    "a cat",
    "a city",
    "a car",
    "a movie",
    "a song",
    "a recipe",
    "a team",
    "a laptop",
    "a flight",
    "a plant",
];

/// Runs every schema's twenty prompts as one batch; returns, per schema,
/// the outputs' texts and finish reasons.
pub(crate) struct Schemas;

impl EngineTask for Schemas {
    type Output = Vec<Vec<(String, FinishReason)>>;

    fn run<D: Device, T: ActElem>(self, s: Session<'_, D, T>) -> Result<Self::Output> {
        let Session { dev, engine, ctx } = s;
        let compiler = GrammarCompiler::new(&ctx.tokenizer, ctx.config.vocab_size)?;
        let template = ctx
            .template
            .as_ref()
            .ok_or_else(|| Error::Usage("the model file has no chat template".into()))?;
        let mut out = Vec::new();
        for schema in schemas() {
            let constraint = compiler.compile(&GrammarSpec::JsonSchema(schema.clone()))?;
            let mut requests = Vec::new();
            for topic in TOPICS {
                let text = format!("Describe {topic} as JSON matching this schema: {schema}");
                let prompt = ctx.tokenizer.encode(&template.render(&[Message::user(text)], true)?, true)?;
                requests.push(Request {
                    prompt,
                    params: SamplingParams::default(),
                    max_tokens: 160,
                    stop_tokens: ctx.tokenizer.eog_tokens().to_vec(),
                    constraint: Some(constraint.clone()),
                });
            }
            let done = engine.run(dev, requests, |_| {})?;
            let texts = done
                .iter()
                .map(|c| Ok((ctx.tokenizer.decode(&c.tokens, false)?, c.finish)))
                .collect::<Result<Vec<_>>>()?;
            out.push(texts);
        }
        Ok(out)
    }
}

/// Why output `j` of schema `i` fails (it did not finish with a stop token,
/// does not parse, or does not validate), for every failing output.
fn failures(i: usize, schema: &Value, outputs: &[(String, FinishReason)]) -> Result<Vec<String>> {
    let validator = jsonschema::validator_for(schema)
        .map_err(|e| Error::Usage(format!("schema {i} is not a valid JSON schema: {e}")))?;
    let mut bad = Vec::new();
    if outputs.len() != TOPICS.len() {
        bad.push(format!("schema {i}: {} outputs for {} prompts", outputs.len(), TOPICS.len()));
    }
    for (j, (text, finish)) in outputs.iter().enumerate() {
        if !matches!(finish, FinishReason::StopToken(_)) {
            bad.push(format!("schema {i}, prompt {j}: finished {finish:?}: {text:?}"));
            continue;
        }
        match serde_json::from_str::<Value>(text) {
            Err(e) => bad.push(format!("schema {i}, prompt {j}: {e}: {text:?}")),
            Ok(v) => {
                let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
                if !errors.is_empty() {
                    bad.push(format!("schema {i}, prompt {j}: {text} does not validate: {errors:?}"));
                }
            }
        }
    }
    Ok(bad)
}

/// `tessera gpu-check --only schemas`: the ten schemas times twenty prompts
/// on the GPU (bf16, the default arrangement) with the real model
/// (`$TESSERA_MODEL` or the bundled file); one row per schema, passing when
/// all twenty outputs finish, parse and validate.
pub fn schema_checks(_cuda: &mut crate::cuda::Cuda, _seed: u64) -> Result<Vec<CheckRow>> {
    let model =
        std::env::var(crate::check::invariance::MODEL_ENV).unwrap_or_else(|_| DEFAULT_MODEL.to_string());
    let path = resolve_model(std::path::Path::new(&model));
    let row = |what: String, differing: usize, pass: bool| CheckRow {
        kernel: "schemas".into(),
        shape: what,
        dtype: dsl_core::DType::BF16,
        max_abs: differing as f64,
        max_rel: 0.0,
        pass,
    };
    if !path.is_file() {
        return Ok(vec![row(format!("model {} not found", path.display()), 0, false)]);
    }
    let opts = LoadOptions { model: path, device: DeviceChoice::Gpu, ..options() };
    let results = run_task(&opts, Schemas)?;
    let mut rows = Vec::new();
    for (i, (schema, outputs)) in schemas().iter().zip(&results).enumerate() {
        let bad = failures(i, schema, outputs)?;
        let what = match bad.first() {
            None => format!("schema {i}: {n}/{n} outputs valid", n = TOPICS.len()),
            Some(first) => format!("{} of {} outputs fail; first: {first}", bad.len(), TOPICS.len()),
        };
        rows.push(row(what, bad.len(), bad.is_empty()));
    }
    Ok(rows)
}

/// The engine's settings for the matrix: every schema's twenty prompts in
/// one batch.
fn options() -> LoadOptions {
    LoadOptions { max_num_seqs: 20, ..LoadOptions::native_test(512, 448) }
}

#[cfg(test)]
#[test]
fn smollm2_outputs_validate_against_ten_schemas_on_the_native_backend() {
    let results = run_task(&options(), Schemas).unwrap();
    let schemas = schemas();
    assert_eq!(results.len(), schemas.len());
    let bad: Vec<String> = schemas
        .iter()
        .zip(&results)
        .enumerate()
        .map(|(i, (schema, outputs))| failures(i, schema, outputs))
        .collect::<Result<Vec<_>>>()
        .unwrap()
        .concat();
    assert!(bad.is_empty(), "{} outputs fail: {bad:#?}", bad.len());
}
