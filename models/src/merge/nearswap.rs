//! NearSwap (mergekit's `nearswap`): the other model's value where it lies within `t` of the
//! base's, the base moved towards it by `t / |a − b|` elsewhere.

/// NearSwap of `other` into `base` at `t`.
pub fn nearswap(t: f64, base: &[f32], other: &[f32]) -> Vec<f64> {
    base.iter()
        .zip(other)
        .map(|(&a, &b)| {
            let (a, b) = (f64::from(a), f64::from(b));
            let weight = (t / (a - b).abs().max(1e-6)).clamp(0.0, 1.0);
            weight * b + (1.0 - weight) * a
        })
        .collect()
}
