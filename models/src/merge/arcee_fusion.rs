//! Arcee Fusion (mergekit's `arcee_fusion`): the other model's differences from the base kept
//! where their importance is an outlier.

/// Arcee Fusion of `other` into `base` (tensors of `shape`). The importance of an element is
/// `|other − base|` times the KL divergence between the softmax of the other's and the base's
/// row (the last axis; a vector is one row); the differences whose importance reaches
/// `median + 1.5 · (q3 − q1)` of all importances are kept. Quantiles are read from the sorted
/// importances at index `⌊q · (n − 1)⌋`, as mergekit reads them (mergekit samples a million
/// elements of larger tensors at random; every element counts here).
pub fn arcee_fusion(base: &[f32], other: &[f32], shape: &[usize]) -> Vec<f64> {
    let length = shape.last().copied().unwrap_or(1).max(1);
    let softmax = |row: &[f32]| -> Vec<f64> {
        let max = row
            .iter()
            .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
        let exp: Vec<f64> = row.iter().map(|&v| (f64::from(v) - max).exp()).collect();
        let sum: f64 = exp.iter().sum();
        exp.iter().map(|e| e / sum + 1e-8).collect()
    };
    let mut importance = vec![0.0; base.len()];
    for row in 0..base.len() / length {
        let range = row * length..(row + 1) * length;
        let p = softmax(&other[range.clone()]);
        let q = softmax(&base[range.clone()]);
        let divergence: f64 = p.iter().zip(&q).map(|(p, q)| p * (p / q).ln()).sum();
        for i in range {
            importance[i] = f64::from(other[i] - base[i]).abs() * divergence;
        }
    }
    let mut sorted = importance.clone();
    sorted.sort_by(f64::total_cmp);
    let last = (sorted.len() - 1) as f32;
    let quantile = |q: f32| sorted[(q * last) as usize];
    let threshold = quantile(0.5) + 1.5 * (quantile(0.75) - quantile(0.25));
    base.iter()
        .zip(other)
        .zip(&importance)
        .map(|((&a, &b), &importance)| {
            let kept = if importance >= threshold { 1.0 } else { 0.0 };
            f64::from(a) + f64::from(b - a) * kept
        })
        .collect()
}
