//! The part of YAML that merge configurations use, read into JSON values: block mappings and
//! sequences by indentation (a sequence item may open a mapping on its own line, `- model: x`),
//! one-line flow collections (`[0, 0.5, 1]`, `{weight: 0.5}`), quoted and plain scalars,
//! numbers, booleans, `null`/`~`, and `#` comments. Anchors, tags, multi-line scalars and
//! several documents are refused with the line that holds them.

use serde_json::{Map, Number, Value};

/// Why a YAML text could not be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct YamlError {
    /// The line (from 1).
    pub line: usize,
    /// What is wrong there.
    pub message: String,
}

/// One non-empty line without its comment: its number, indentation and content.
#[derive(Debug, Clone)]
struct Line {
    number: usize,
    indent: usize,
    text: String,
}

/// Reads `text` as one YAML document.
pub fn parse(text: &str) -> Result<Value, YamlError> {
    let mut lines = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let number = index + 1;
        let content = strip_comment(raw);
        let trimmed = content.trim_end();
        if trimmed.trim().is_empty() {
            continue;
        }
        let text = trimmed.trim_start();
        if trimmed[..trimmed.len() - text.len()].contains('\t') {
            return Err(error(number, "tabs cannot indent YAML"));
        }
        if text == "---" && lines.is_empty() {
            continue;
        }
        if text == "---" || text == "..." {
            return Err(error(number, "only one YAML document is supported"));
        }
        if text.starts_with(['&', '*', '!', '|', '>']) || text.contains(": &") {
            return Err(error(
                number,
                "anchors, aliases, tags and block scalars are not supported",
            ));
        }
        lines.push(Line {
            number,
            indent: trimmed.len() - text.len(),
            text: text.to_string(),
        });
    }
    if lines.is_empty() {
        return Ok(Value::Null);
    }
    let mut position = 0;
    let indent = lines[0].indent;
    let value = block(&mut lines, &mut position, indent)?;
    if let Some(line) = lines.get(position) {
        return Err(error(line.number, "unexpected indentation"));
    }
    Ok(value)
}

fn error(line: usize, message: impl Into<String>) -> YamlError {
    YamlError {
        line,
        message: message.into(),
    }
}

/// The line without a `#` comment (one that starts the line or follows a space, outside quotes).
fn strip_comment(line: &str) -> &str {
    let mut quote = None;
    let mut previous = ' ';
    for (index, character) in line.char_indices() {
        match (quote, character) {
            (None, '"' | '\'') => quote = Some(character),
            (Some(open), _) if character == open => quote = None,
            (None, '#') if previous.is_whitespace() => return &line[..index],
            _ => {}
        }
        previous = character;
    }
    line
}

/// A block node whose lines are indented by `indent`.
fn block(lines: &mut [Line], position: &mut usize, indent: usize) -> Result<Value, YamlError> {
    if is_item(&lines[*position].text) {
        sequence(lines, position, indent)
    } else {
        mapping(lines, position, indent)
    }
}

fn is_item(text: &str) -> bool {
    text == "-" || text.starts_with("- ")
}

/// A block sequence at `indent`.
fn sequence(lines: &mut [Line], position: &mut usize, indent: usize) -> Result<Value, YamlError> {
    let mut items = Vec::new();
    while let Some(line) = lines.get(*position) {
        if line.indent < indent || !is_item(&line.text) {
            break;
        }
        if line.indent > indent {
            return Err(error(line.number, "unexpected indentation"));
        }
        let number = line.number;
        let rest = line.text[1..].trim_start().to_string();
        if rest.is_empty() {
            *position += 1;
            items.push(nested(lines, position, indent, number)?);
        } else if is_item(&rest) || key_split(&rest).is_some() {
            // `- key: value` opens a mapping (or `- - x` a sequence) at the item's column.
            let column = indent + (line.text.len() - rest.len());
            lines[*position] = Line {
                number,
                indent: column,
                text: rest,
            };
            items.push(block(lines, position, column)?);
        } else {
            *position += 1;
            items.push(inline(&rest, number)?);
        }
    }
    Ok(Value::Array(items))
}

/// The node after `key:` or `-` on line `number`: a deeper block, or null.
fn nested(
    lines: &mut [Line],
    position: &mut usize,
    indent: usize,
    number: usize,
) -> Result<Value, YamlError> {
    match lines.get(*position) {
        Some(next) if next.indent > indent => {
            let deeper = next.indent;
            block(lines, position, deeper)
        }
        Some(next) if next.indent == indent && is_item(&next.text) && number != next.number => {
            // A sequence may sit at its key's own indentation.
            sequence(lines, position, indent)
        }
        _ => Ok(Value::Null),
    }
}

/// A block mapping at `indent`.
fn mapping(lines: &mut [Line], position: &mut usize, indent: usize) -> Result<Value, YamlError> {
    let mut map = Map::new();
    while let Some(line) = lines.get(*position) {
        if line.indent < indent || (line.indent == indent && is_item(&line.text)) {
            break;
        }
        if line.indent > indent {
            return Err(error(line.number, "unexpected indentation"));
        }
        let number = line.number;
        let (key, rest) = key_split(&line.text).ok_or_else(|| {
            error(
                number,
                format!("expected `key: value`, found `{}`", line.text),
            )
        })?;
        let key = match scalar(key, number)? {
            Value::String(key) => key,
            other => other.to_string(),
        };
        let rest = rest.to_string();
        *position += 1;
        let value = if rest.is_empty() {
            nested(lines, position, indent, number)?
        } else {
            inline(&rest, number)?
        };
        if map.insert(key.clone(), value).is_some() {
            return Err(error(number, format!("duplicate key `{key}`")));
        }
    }
    Ok(Value::Object(map))
}

/// Splits `key: value` (or `key:`) at its first `:` outside quotes and brackets.
fn key_split(text: &str) -> Option<(&str, &str)> {
    let mut quote = None;
    let mut depth = 0i32;
    for (index, character) in text.char_indices() {
        match (quote, character) {
            (None, '"' | '\'') => quote = Some(character),
            (Some(open), _) if character == open => quote = None,
            (None, '[' | '{') => depth += 1,
            (None, ']' | '}') => depth -= 1,
            (None, ':') if depth == 0 => {
                let after = &text[index + 1..];
                if after.is_empty() || after.starts_with(' ') {
                    return Some((text[..index].trim(), after.trim()));
                }
            }
            _ => {}
        }
    }
    None
}

/// A value written on one line: a flow collection or a scalar.
fn inline(text: &str, line: usize) -> Result<Value, YamlError> {
    let mut reader = Flow {
        characters: text.chars().collect(),
        index: 0,
        line,
    };
    let value = reader.value()?;
    reader.spaces();
    if reader.index != reader.characters.len() {
        return Err(error(
            line,
            format!("unexpected text after the value in `{text}`"),
        ));
    }
    Ok(value)
}

/// A reader of flow values on one line.
struct Flow {
    characters: Vec<char>,
    index: usize,
    line: usize,
}

impl Flow {
    fn spaces(&mut self) {
        while self.characters.get(self.index) == Some(&' ') {
            self.index += 1;
        }
    }

    fn value(&mut self) -> Result<Value, YamlError> {
        self.spaces();
        match self.characters.get(self.index) {
            Some('[') => self.collection(']'),
            Some('{') => self.collection('}'),
            _ => {
                let start = self.index;
                let mut quote = None;
                while let Some(&character) = self.characters.get(self.index) {
                    match (quote, character) {
                        (None, '"' | '\'') if self.index == start => quote = Some(character),
                        (Some(open), _) if character == open && self.index > start => {
                            self.index += 1;
                            break;
                        }
                        (None, ',' | ']' | '}') => break,
                        (None, ':')
                            if self
                                .characters
                                .get(self.index + 1)
                                .is_none_or(|c| *c == ' ') =>
                        {
                            break;
                        }
                        _ => {}
                    }
                    self.index += 1;
                }
                let text: String = self.characters[start..self.index].iter().collect();
                scalar(text.trim(), self.line)
            }
        }
    }

    /// `[a, b]` or `{k: v}`, opened at the current character and closed by `close`.
    fn collection(&mut self, close: char) -> Result<Value, YamlError> {
        self.index += 1;
        let mut items = Vec::new();
        let mut map = Map::new();
        loop {
            self.spaces();
            if self.characters.get(self.index) == Some(&close) {
                self.index += 1;
                break;
            }
            let value = self.value()?;
            if close == '}' {
                self.spaces();
                if self.characters.get(self.index) != Some(&':') {
                    return Err(error(self.line, "expected `:` in a flow mapping"));
                }
                self.index += 1;
                let key = match value {
                    Value::String(key) => key,
                    other => other.to_string(),
                };
                let entry = self.value()?;
                map.insert(key, entry);
            } else {
                items.push(value);
            }
            self.spaces();
            match self.characters.get(self.index) {
                Some(',') => self.index += 1,
                Some(&character) if character == close => {}
                _ => return Err(error(self.line, format!("unclosed `{close}`"))),
            }
        }
        Ok(if close == '}' {
            Value::Object(map)
        } else {
            Value::Array(items)
        })
    }
}

/// A plain or quoted scalar.
fn scalar(text: &str, line: usize) -> Result<Value, YamlError> {
    let quoted = |quote: char| text.len() >= 2 && text.starts_with(quote) && text.ends_with(quote);
    if quoted('"') {
        return serde_json::from_str(text)
            .map_err(|reason| error(line, format!("bad quoted string {text}: {reason}")));
    }
    if quoted('\'') {
        return Ok(Value::String(text[1..text.len() - 1].replace("''", "'")));
    }
    Ok(match text {
        "" | "~" | "null" | "Null" | "NULL" => Value::Null,
        "true" | "True" | "TRUE" => Value::Bool(true),
        "false" | "False" | "FALSE" => Value::Bool(false),
        _ => {
            if let Ok(integer) = text.parse::<i64>() {
                Value::Number(integer.into())
            } else if let Some(number) = text
                .parse::<f64>()
                .ok()
                .filter(|value| value.is_finite())
                .and_then(Number::from_f64)
            {
                Value::Number(number)
            } else {
                Value::String(text.to_string())
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn reads_the_layouts_of_merge_configurations() {
        let text = "\
# a TIES merge
models:
  - model: ./base
    # no parameters for the base
  - model: ./math
    parameters:
      density: [1, 0.7, 0.1] # a gradient
      weight: 1.0
  - model: \"./code model\"
    parameters: {density: 0.5, weight: [0, 0.3, 1]}
merge_method: ties
base_model: ./base
parameters:
  normalize: true
  t:
    - filter: self_attn
      value: [0, 0.5]
    - value: 0.5
dtype: bfloat16
";
        let value = parse(text).unwrap();
        assert_eq!(
            value,
            json!({
                "models": [
                    {"model": "./base"},
                    {"model": "./math", "parameters": {"density": [1, 0.7, 0.1], "weight": 1.0}},
                    {"model": "./code model", "parameters": {"density": 0.5, "weight": [0, 0.3, 1]}},
                ],
                "merge_method": "ties",
                "base_model": "./base",
                "parameters": {
                    "normalize": true,
                    "t": [{"filter": "self_attn", "value": [0, 0.5]}, {"value": 0.5}],
                },
                "dtype": "bfloat16",
            })
        );
    }

    #[test]
    fn a_sequence_may_sit_at_its_keys_indentation() {
        let value = parse("slices:\n- sources:\n  - model: a\n    layer_range: [0, 2]\n").unwrap();
        assert_eq!(
            value,
            json!({"slices": [{"sources": [{"model": "a", "layer_range": [0, 2]}]}]})
        );
    }

    #[test]
    fn errors_name_the_line() {
        let cases = [
            ("a: 1\n  b: 2\n", 2),
            ("a: 1\na: 2\n", 2),
            ("a: [1, 2\n", 1),
            ("a: &anchor 1\n", 1),
            ("just text\n", 1),
        ];
        for (text, line) in cases {
            let error = parse(text).unwrap_err();
            assert_eq!(error.line, line, "{text:?}: {error}");
        }
    }
}
