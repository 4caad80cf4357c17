//! The arithmetic of each merge method on one tensor's values (f32, combined in f64).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// One model's contribution to a task-vector merge.
#[derive(Debug, Clone)]
pub struct TaskVector<'a> {
    /// The model's values of the tensor.
    pub values: &'a [f32],
    /// Its `weight`.
    pub weight: f64,
    /// The fraction of its differences kept (`density`).
    pub density: f64,
}

/// Which differences a task-vector merge keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sparsification {
    /// All of them.
    None,
    /// The `density` fraction of largest magnitude (TIES).
    Magnitude,
    /// Each one with probability `density`, drawn from this seed (DARE).
    Random(u64),
}

/// The options of a task-vector merge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskArithmetic {
    /// Which differences are kept.
    pub sparsification: Sparsification,
    /// Whether each element keeps only the differences whose sign agrees with the sign of their
    /// weighted sum (TIES' sign election).
    pub sign_consensus: bool,
    /// Whether the mixed difference is divided by the sum of the weights that contributed.
    pub normalize: bool,
    /// Whether kept differences are divided by `density`.
    pub rescale: bool,
}

/// `Σ wᵢ θᵢ`, divided by `Σ wᵢ` when `normalize` (a sum of weights near 0 divides by 1).
pub fn linear(models: &[(&[f32], f64)], normalize: bool) -> Vec<f32> {
    let total: f64 = models.iter().map(|(_, weight)| weight).sum();
    let divisor = if normalize && total.abs() >= 1e-8 {
        total
    } else {
        1.0
    };
    (0..models[0].0.len())
        .map(|index| {
            let sum: f64 = models
                .iter()
                .map(|(values, weight)| weight * f64::from(values[index]))
                .sum();
            (sum / divisor) as f32
        })
        .collect()
}

/// Spherical interpolation from `from` (`t` = 0) to `to` (`t` = 1), along the great circle
/// between their directions; nearly parallel tensors (|cos| > 0.9995) are interpolated linearly.
pub fn slerp(t: f64, from: &[f32], to: &[f32]) -> Vec<f32> {
    let norm = |values: &[f32]| {
        let norm = values
            .iter()
            .map(|&v| f64::from(v) * f64::from(v))
            .sum::<f64>()
            .sqrt();
        if norm > 1e-8 { norm } else { 1.0 }
    };
    let (from_norm, to_norm) = (norm(from), norm(to));
    let cosine: f64 = from
        .iter()
        .zip(to)
        .map(|(&a, &b)| (f64::from(a) / from_norm) * (f64::from(b) / to_norm))
        .sum();
    let (from_scale, to_scale) = if cosine.abs() > 0.9995 {
        (1.0 - t, t)
    } else {
        let angle = cosine.acos();
        let sine = angle.sin();
        (((1.0 - t) * angle).sin() / sine, (t * angle).sin() / sine)
    };
    from.iter()
        .zip(to)
        .map(|(&a, &b)| (from_scale * f64::from(a) + to_scale * f64::from(b)) as f32)
        .collect()
}

/// `base + mix(wᵢ · kept(θᵢ − base))` as `options` say.
pub fn task_arithmetic(
    base: &[f32],
    models: &[TaskVector<'_>],
    options: TaskArithmetic,
) -> Vec<f32> {
    // Each model's weighted, sparsified differences.
    let weighted: Vec<Vec<f64>> = models
        .iter()
        .enumerate()
        .map(|(number, model)| {
            let mut delta: Vec<f64> = model
                .values
                .iter()
                .zip(base)
                .map(|(&value, &base)| f64::from(value) - f64::from(base))
                .collect();
            sparsify(&mut delta, model.density, options, number as u64);
            delta.iter().map(|d| d * model.weight).collect()
        })
        .collect();
    (0..base.len())
        .map(|index| {
            let elected = if options.sign_consensus {
                let total: f64 = weighted.iter().map(|delta| delta[index]).sum();
                Some(if total >= 0.0 { 1.0 } else { -1.0 })
            } else {
                None
            };
            let mut mixed = 0.0;
            let mut divisor = 0.0;
            for (delta, model) in weighted.iter().zip(models) {
                let value = delta[index];
                let counted = match elected {
                    Some(sign) => value != 0.0 && value.signum() == sign,
                    None => true,
                };
                if counted {
                    mixed += value;
                    divisor += model.weight;
                }
            }
            let divisor = if elected.is_some() {
                if divisor == 0.0 { 1.0 } else { divisor }
            } else if divisor.abs() < 1e-8 {
                1.0
            } else {
                divisor
            };
            if options.normalize {
                mixed /= divisor;
            }
            (f64::from(base[index]) + mixed) as f32
        })
        .collect()
}

/// Keeps the `density` fraction of `delta` as `options.sparsification` says (zeroing the rest),
/// dividing what is kept by `density` when `options.rescale`.
fn sparsify(delta: &mut [f64], density: f64, options: TaskArithmetic, stream: u64) {
    if density >= 1.0 {
        return;
    }
    match options.sparsification {
        Sparsification::None => return,
        Sparsification::Magnitude => {
            let keep = (density * delta.len() as f64) as usize;
            if keep == 0 {
                delta.fill(0.0);
                return;
            }
            let mut magnitudes: Vec<f64> = delta.iter().map(|d| d.abs()).collect();
            let threshold_index = delta.len() - keep;
            magnitudes.select_nth_unstable_by(threshold_index, f64::total_cmp);
            let threshold = magnitudes[threshold_index];
            // Ties at the threshold are kept in order until `keep` elements are.
            let mut kept = delta.iter().filter(|d| d.abs() > threshold).count();
            for value in delta.iter_mut() {
                if value.abs() > threshold {
                    continue;
                }
                if value.abs() == threshold && kept < keep {
                    kept += 1;
                } else {
                    *value = 0.0;
                }
            }
        }
        Sparsification::Random(seed) => {
            let mut random =
                StdRng::seed_from_u64(seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            for value in delta.iter_mut() {
                if !random.random_bool(density.clamp(0.0, 1.0)) {
                    *value = 0.0;
                }
            }
        }
    }
    if options.rescale && density > 0.0 {
        delta.iter_mut().for_each(|value| *value /= density);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIES: TaskArithmetic = TaskArithmetic {
        sparsification: Sparsification::Magnitude,
        sign_consensus: true,
        normalize: true,
        rescale: false,
    };

    #[test]
    fn magnitude_sparsification_keeps_the_largest_differences() {
        let mut delta = vec![0.1, -3.0, 2.0, -0.5, 0.0];
        sparsify(&mut delta, 0.4, TIES, 0);
        assert_eq!(delta, vec![0.0, -3.0, 2.0, 0.0, 0.0]);
    }

    #[test]
    fn sign_election_drops_the_minority_and_divides_by_the_weights_that_agree() {
        let base = [0.0f32, 0.0];
        let first = [1.0f32, 2.0];
        let second = [-3.0f32, 4.0];
        let models = [
            TaskVector {
                values: &first,
                weight: 1.0,
                density: 1.0,
            },
            TaskVector {
                values: &second,
                weight: 1.0,
                density: 1.0,
            },
        ];
        // Element 0: 1 − 3 < 0 elects minus, only the second counts; element 1: both agree.
        assert_eq!(task_arithmetic(&base, &models, TIES), vec![-3.0, 3.0]);
    }

    #[test]
    fn random_sparsification_keeps_about_density_and_rescales() {
        let mut delta = vec![1.0; 10_000];
        let options = TaskArithmetic {
            sparsification: Sparsification::Random(7),
            sign_consensus: false,
            normalize: false,
            rescale: true,
        };
        sparsify(&mut delta, 0.25, options, 0);
        let kept = delta.iter().filter(|d| **d != 0.0).count();
        assert!((2300..2700).contains(&kept), "{kept}");
        assert!(delta.iter().all(|d| *d == 0.0 || *d == 4.0));
    }
}
