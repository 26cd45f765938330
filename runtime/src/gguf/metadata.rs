//! The metadata of a GGUF file: [`Metadata`], its key-value pairs in file
//! order with unique keys, and typed accessors whose errors name the key and
//! the type found.

use super::types::{Array, Value};
use super::{GgufError, Result};
use std::collections::HashMap;

/// The metadata of a GGUF file: key-value pairs in file order, with unique keys.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    /// An empty metadata set.
    pub fn new() -> Metadata {
        Metadata::default()
    }

    /// Adds a pair; an existing key is an error.
    pub fn insert(&mut self, key: impl Into<String>, value: Value) -> Result<()> {
        let key = key.into();
        if self.index.contains_key(&key) {
            return Err(GgufError::DuplicateKey(key));
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        Ok(())
    }

    /// Sets a pair, replacing the value of an existing key in place.
    pub fn set(&mut self, key: impl Into<String>, value: Value) {
        let key = key.into();
        match self.index.get(&key) {
            Some(&i) => self.entries[i].1 = value,
            None => {
                self.index.insert(key.clone(), self.entries.len());
                self.entries.push((key, value));
            }
        }
    }

    /// The pairs in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// The value of `key`, or [`GgufError::MissingKey`].
    pub fn require(&self, key: &str) -> Result<&Value> {
        self.get(key).ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    /// An optional integer key (any integer type) converted to `u32`; out of
    /// range is [`GgufError::InvalidValue`], a non-integer [`GgufError::WrongType`].
    pub fn get_u32(&self, key: &str) -> Result<Option<u32>> {
        self.get(key).map(|v| integer(key, v)).transpose()
    }

    /// A required integer key converted to `u32` (see [`Metadata::get_u32`]).
    pub fn require_u32(&self, key: &str) -> Result<u32> {
        integer(key, self.require(key)?)
    }

    /// An optional float key (`f32` or `f64`) as `f32`.
    pub fn get_f32(&self, key: &str) -> Result<Option<f32>> {
        self.get(key).map(|v| float(key, v)).transpose()
    }

    /// A required float key as `f32`.
    pub fn require_f32(&self, key: &str) -> Result<f32> {
        float(key, self.require(key)?)
    }

    /// An optional string key.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| wrong_type(key, "string", v)),
        }
    }

    /// A required string key.
    pub fn require_str(&self, key: &str) -> Result<&str> {
        self.get_str(key)?.ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    /// An optional bool key.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| wrong_type(key, "bool", v)),
        }
    }

    /// An optional array key.
    pub fn get_array(&self, key: &str) -> Result<Option<&Array>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_array().map(Some).ok_or_else(|| wrong_type(key, "array", v)),
        }
    }

    /// A required array-of-strings key.
    pub fn require_strings(&self, key: &str) -> Result<&[String]> {
        let v = self.require(key)?;
        v.as_array().and_then(Array::as_strings).ok_or_else(|| wrong_type(key, "array of strings", v))
    }
}

/// A stored type, in words (`"array of u8"` for arrays).
pub(crate) fn type_words(v: &Value) -> String {
    match v {
        Value::Array(a) => format!("array of {}", a.element_type()),
        other => other.value_type().to_string(),
    }
}

pub(crate) fn wrong_type(key: &str, expected: &'static str, v: &Value) -> GgufError {
    GgufError::WrongType { key: key.to_string(), expected, found: type_words(v) }
}

fn integer(key: &str, v: &Value) -> Result<u32> {
    let i = v.as_i128().ok_or_else(|| wrong_type(key, "integer", v))?;
    u32::try_from(i).map_err(|_| GgufError::InvalidValue {
        key: key.to_string(),
        message: format!("{i} is outside the range of a u32."),
    })
}

fn float(key: &str, v: &Value) -> Result<f32> {
    v.as_f64().map(|f| f as f32).ok_or_else(|| wrong_type(key, "float", v))
}
