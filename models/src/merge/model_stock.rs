//! Model Stock (mergekit's `model_stock`): the base moved towards the models' average by
//! `t = N·cos / (1 + (N − 1)·cos)`, `cos` the mean cosine between the models' differences.

/// Model Stock of `models` around `base` (a tensor of `shape`): over the whole tensor, or row by
/// row with `filter_wise` (a vector is one row). A row whose `1 + (N − 1)·cos` is 0 keeps the
/// base.
pub fn model_stock(
    base: &[f32],
    models: &[&[f32]],
    shape: &[usize],
    filter_wise: bool,
) -> Vec<f64> {
    let length = match shape {
        [.., last] if filter_wise && shape.len() >= 2 => *last,
        _ => base.len().max(1),
    };
    let count = models.len() as f64;
    let mut result = vec![0.0; base.len()];
    for row in 0..base.len() / length {
        let range = row * length..(row + 1) * length;
        let offsets: Vec<Vec<f64>> = models
            .iter()
            .map(|model| {
                model[range.clone()]
                    .iter()
                    .zip(&base[range.clone()])
                    .map(|(&m, &b)| f64::from(m - b))
                    .collect()
            })
            .collect();
        let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
        let mut cosines = Vec::new();
        for (i, a) in offsets.iter().enumerate() {
            for b in &offsets[i + 1..] {
                let product: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
                cosines.push((product / (norm(a) * norm(b)).max(1e-6)).clamp(-1.0, 1.0));
            }
        }
        let cosine = cosines.iter().sum::<f64>() / cosines.len() as f64;
        let denominator = 1.0 + (count - 1.0) * cosine;
        let t = if denominator.abs() < 1e-6 {
            0.0
        } else {
            count * cosine / denominator
        };
        for i in range {
            let average = models.iter().map(|m| f64::from(m[i])).sum::<f64>() / count;
            result[i] = t * average + (1.0 - t) * f64::from(base[i]);
        }
    }
    result
}
