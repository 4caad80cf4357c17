//! Arcee Fusion (mergekit's `arcee_fusion`): the other model's differences from the base kept
//! where their importance is an outlier.

use crate::hf::WeightDtype;

/// Arcee Fusion of `other` into `base` (tensors of `shape`, holding values of the merge's
/// `dtype`). The importance of an element is `|other − base|` times the KL divergence between
/// the softmax of the other's and the base's row (the last axis; a vector is one row); the
/// differences whose importance reaches `median + 1.5 · (q3 − q1)` of all importances are kept.
/// Quantiles are read from the sorted importances at index `⌊q · (n − 1)⌋`, as mergekit reads
/// them (mergekit samples a million elements of larger tensors at random; every element counts
/// here).
///
/// Every step is computed as mergekit's torch operations compute it on the merge's dtype: in
/// f32, each operation's result rounded to `dtype`. The mask is a comparison with a threshold
/// made of three importances, so the same arithmetic keeps the same elements; in f64, elements
/// lying between the f64 and the `dtype` threshold land on the other side.
pub fn arcee_fusion(base: &[f32], other: &[f32], shape: &[usize], dtype: WeightDtype) -> Vec<f64> {
    let importance = importance(base, other, shape, dtype);
    let mask = fusion_mask(&importance, dtype);
    base.iter()
        .zip(other)
        .zip(mask)
        .map(|((&a, &b), kept)| {
            let kept = if kept { 1.0 } else { 0.0 };
            f64::from(round(a + round(round(b - a, dtype) * kept, dtype), dtype))
        })
        .collect()
}

/// `|other − base| · KL(softmax(other row) ‖ softmax(base row))` per element, each operation
/// rounded to `dtype` (torch's `(params - base).abs()`, `softmax + eps`, `p * log(p / q)` summed
/// over the row, times the difference).
fn importance(base: &[f32], other: &[f32], shape: &[usize], dtype: WeightDtype) -> Vec<f32> {
    const EPS: f32 = 1e-8;
    let length = shape.last().copied().unwrap_or(1).max(1);
    let softmax = |row: &[f32]| -> Vec<f32> {
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let exp: Vec<f32> = row.iter().map(|&v| (v - max).exp()).collect();
        let sum: f32 = exp.iter().sum();
        exp.iter()
            .map(|e| round(round(e / sum, dtype) + EPS, dtype))
            .collect()
    };
    let mut importance = vec![0.0; base.len()];
    for row in 0..base.len() / length {
        let range = row * length..(row + 1) * length;
        let p = softmax(&other[range.clone()]);
        let q = softmax(&base[range.clone()]);
        let divergence: f32 = p
            .iter()
            .zip(&q)
            .map(|(&p, &q)| round(p * round(round(p / q, dtype).ln(), dtype), dtype))
            .sum();
        let divergence = round(divergence, dtype);
        for i in range {
            let difference = round(round(other[i] - base[i], dtype).abs(), dtype);
            importance[i] = round(difference * divergence, dtype);
        }
    }
    importance
}

/// Which `importance` values reach the dynamic threshold `median + 1.5 · (q3 − q1)`, computed as
/// mergekit computes it: quantile `q` at sorted index `⌊q · (n − 1)⌋` with the product in f32,
/// and the threshold's arithmetic in `dtype`.
pub fn fusion_mask(importance: &[f32], dtype: WeightDtype) -> Vec<bool> {
    let mut sorted = importance.to_vec();
    sorted.sort_by(f32::total_cmp);
    let last = (sorted.len().max(1) - 1) as f32;
    let quantile = |q: f32| sorted[(q * last) as usize];
    let spread = round(quantile(0.75) - quantile(0.25), dtype);
    let threshold = round(quantile(0.5) + round(1.5 * spread, dtype), dtype);
    importance.iter().map(|&value| value >= threshold).collect()
}

/// `value` rounded to `dtype` ([`WeightDtype::round`]).
fn round(value: f32, dtype: WeightDtype) -> f32 {
    dtype.round(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::merge::fixture_cases::{cases, dtype, list};

    /// Importances placed at the threshold (`fixtures/mergekit/arcee-fusion-thresholds.json`,
    /// made by mergekit's own `DynamicThresholdFusion`): in float32 and in bfloat16, one case
    /// where float64 arithmetic would drop an element mergekit keeps and one where it would keep
    /// one mergekit drops. The mask must be mergekit's, element for element.
    #[test]
    fn the_mask_is_mergekits_at_the_threshold() {
        let cases = cases("arcee-fusion-thresholds.json");
        assert_eq!(cases.len(), 4);
        for case in cases {
            let importance = list(&case, "importance", |v| v.as_f64().map(|v| v as f32));
            let expected = list(&case, "mask", serde_json::Value::as_bool);
            assert_eq!(
                fusion_mask(&importance, dtype(&case)),
                expected,
                "{}",
                case["what"]
            );
        }
    }
}
