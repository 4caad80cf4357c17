//! A parameter's setting as written in the YAML, evaluated for one tensor as mergekit evaluates
//! it: a value; a gradient (a list of values spread over the layers of a slice); or a list of
//! `{filter, value}` entries, the first whose `filter` is in the tensor's name giving the value.

use serde_json::Value;

use super::method::ParameterKind;

/// A parameter's value for one tensor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    /// A number (whole for integer parameters).
    Number(f64),
    /// A flag.
    Flag(bool),
}

impl Scalar {
    /// The number, for numeric parameters (a flag reads as 0 or 1).
    pub fn number(self) -> f64 {
        match self {
            Scalar::Number(number) => number,
            Scalar::Flag(flag) => f64::from(u8::from(flag)),
        }
    }

    /// The flag, for flag parameters (a number reads as whether it is not 0).
    pub fn flag(self) -> bool {
        match self {
            Scalar::Number(number) => number != 0.0,
            Scalar::Flag(flag) => flag,
        }
    }
}

/// Evaluates `setting` for the tensor `tensor` at position `t` of its slice (0 at the slice's
/// first layer, 1 at its last; 0 for the tensors outside the layers). `None` when no filter
/// matches (the next, less specific, setting then applies) or the setting is an empty list.
/// An error says what is wrong with the setting.
pub fn evaluate(
    setting: &Value,
    kind: ParameterKind,
    tensor: &str,
    t: f64,
) -> Result<Option<Scalar>, String> {
    match setting {
        Value::Object(_) => evaluate_filters(std::slice::from_ref(setting), kind, tensor, t),
        Value::Array(items) if items.is_empty() => Ok(None),
        Value::Array(items) if items.iter().all(is_scalar) => {
            let values = items
                .iter()
                .map(|item| validate(item, kind))
                .collect::<Result<Vec<_>, _>>()?;
            gradient(&values, kind, t).map(Some)
        }
        Value::Array(items) => evaluate_filters(items, kind, tensor, t),
        scalar => validate(scalar, kind).map(Some),
    }
}

fn is_scalar(value: &Value) -> bool {
    matches!(value, Value::Bool(_) | Value::Number(_) | Value::String(_))
}

/// The value of a gradient at `t`: numbers are interpolated linearly between the two nearest
/// points, flags take the point at or before `t`.
fn gradient(values: &[Scalar], kind: ParameterKind, t: f64) -> Result<Scalar, String> {
    let last = (values.len() - 1) as f64;
    if values.iter().any(|value| matches!(value, Scalar::Flag(_))) {
        return Ok(values[(t * last) as usize]);
    }
    let scaled = t * last;
    let below = scaled as usize;
    let above = (below + 1).min(values.len() - 1);
    let within = scaled - below as f64;
    let value = (1.0 - within) * values[below].number() + within * values[above].number();
    if kind == ParameterKind::Integer && value.fract() != 0.0 {
        return Err(format!(
            "the gradient gives {value} here, not a whole number"
        ));
    }
    Ok(Scalar::Number(value))
}

fn evaluate_filters(
    entries: &[Value],
    kind: ParameterKind,
    tensor: &str,
    t: f64,
) -> Result<Option<Scalar>, String> {
    for entry in entries {
        let Value::Object(fields) = entry else {
            return Err(format!(
                "a list mixes values and `{{filter, value}}` entries ({entry})"
            ));
        };
        if let Some(unknown) = fields
            .keys()
            .find(|key| *key != "filter" && *key != "value")
        {
            return Err(format!(
                "unknown key `{unknown}` in a filtered value (filter, value)"
            ));
        }
        let value = fields
            .get("value")
            .ok_or_else(|| "a filtered entry without `value`".to_string())?;
        let matches = match fields.get("filter") {
            None | Some(Value::Null) => true,
            Some(Value::String(filter)) => {
                filter == "*" || (!tensor.is_empty() && tensor.contains(filter.as_str()))
            }
            Some(other) => return Err(format!("a filter must be text, found {other}")),
        };
        if matches {
            return evaluate(value, kind, tensor, t);
        }
    }
    Ok(None)
}

/// A single value checked against the parameter's kind (numbers may be written as text, as
/// `1e-3` is in YAML 1.1).
fn validate(value: &Value, kind: ParameterKind) -> Result<Scalar, String> {
    let number = match value {
        Value::Number(number) => number.as_f64(),
        Value::String(text) if kind != ParameterKind::Flag => text.trim().parse::<f64>().ok(),
        _ => None,
    };
    match (kind, value, number) {
        (ParameterKind::Flag, Value::Bool(flag), _) => Ok(Scalar::Flag(*flag)),
        (ParameterKind::Float, _, Some(number)) => Ok(Scalar::Number(number)),
        (ParameterKind::Integer, _, Some(number)) if number.fract() == 0.0 => {
            Ok(Scalar::Number(number))
        }
        (ParameterKind::Flag, _, _) => Err(format!("expected true or false, found {value}")),
        (ParameterKind::Integer, _, _) => Err(format!("expected a whole number, found {value}")),
        (ParameterKind::Float, _, _) => Err(format!("expected a number, found {value}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn number(setting: Value, tensor: &str, t: f64) -> Option<f64> {
        evaluate(&setting, ParameterKind::Float, tensor, t)
            .unwrap()
            .map(Scalar::number)
    }

    #[test]
    fn gradients_interpolate_between_their_nearest_points() {
        let points = json!([1.0, 0.7, 0.3]);
        assert_eq!(number(points.clone(), "x", 0.0), Some(1.0));
        assert_eq!(number(points.clone(), "x", 1.0), Some(0.3));
        let quarter = number(points, "x", 0.25).unwrap();
        assert!((quarter - 0.85).abs() < 1e-15, "{quarter}");
    }

    #[test]
    fn the_first_matching_filter_gives_the_value_and_none_falls_through() {
        let filtered = json!([{"filter": "mlp", "value": 0.2}, {"filter": "*", "value": 0.3}]);
        assert_eq!(
            number(filtered.clone(), "model.layers.0.mlp.up_proj.weight", 0.0),
            Some(0.2)
        );
        assert_eq!(number(filtered, "lm_head.weight", 0.0), Some(0.3));
        let only_mlp = json!({"filter": "mlp", "value": [0.0, 1.0]});
        assert_eq!(number(only_mlp.clone(), "a.mlp.b", 0.5), Some(0.5));
        assert_eq!(number(only_mlp, "lm_head.weight", 0.5), None);
    }

    #[test]
    fn values_of_the_wrong_kind_are_refused() {
        let error = evaluate(&json!("many"), ParameterKind::Float, "x", 0.0).unwrap_err();
        assert!(error.contains("\"many\""), "{error}");
        let error = evaluate(&json!(1), ParameterKind::Flag, "x", 0.0).unwrap_err();
        assert!(error.contains("true or false"), "{error}");
        assert_eq!(
            evaluate(&json!("1e-3"), ParameterKind::Float, "x", 0.0).unwrap(),
            Some(Scalar::Number(1e-3))
        );
    }
}
