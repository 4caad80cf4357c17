//! The field that holds a document's text: `text` by default, `--text-field NAME` otherwise, a
//! dotted path (`meta.body`) for a field inside nested JSON objects or Parquet structs.

use std::fmt;

use super::error::DataError;

/// A field name or a dotted path to a nested field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextField {
    parts: Vec<String>,
}

impl Default for TextField {
    /// The field `text`.
    fn default() -> Self {
        Self {
            parts: vec!["text".into()],
        }
    }
}

impl fmt::Display for TextField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.parts.join("."))
    }
}

impl TextField {
    /// Parses `name`: a field, or fields separated by dots, none empty.
    pub fn parse(name: &str) -> Result<Self, DataError> {
        let parts: Vec<String> = name.split('.').map(str::to_owned).collect();
        if parts.iter().any(String::is_empty) {
            return Err(DataError::setting(
                "text field",
                format!("`{name}` has an empty part (write `a.b` for field b inside a)"),
            ));
        }
        Ok(Self { parts })
    }

    /// The names from the outermost to the field itself.
    pub fn parts(&self) -> &[String] {
        &self.parts
    }

    /// The field's value in a JSON object, `None` when a part is missing. A key holding a dot
    /// is found too (`{"a.b": ...}` for `a.b`): at each level, the rest of the path as one key is
    /// tried first.
    pub fn lookup<'a>(&self, value: &'a serde_json::Value) -> Option<&'a serde_json::Value> {
        lookup_parts(value, &self.parts)
    }
}

fn lookup_parts<'a>(
    value: &'a serde_json::Value,
    parts: &[String],
) -> Option<&'a serde_json::Value> {
    let object = value.as_object()?;
    if let Some(found) = object.get(&parts.join(".")) {
        return Some(found);
    }
    (1..parts.len()).find_map(|split| {
        let inner = object.get(&parts[..split].join("."))?;
        lookup_parts(inner, &parts[split..])
    })
}
