//! The task-arithmetic family (mergekit's generalized task arithmetic): `task_arithmetic`,
//! `ties`, `dare_*`, `breadcrumbs*` and `della*` on one tensor's values.

use rand::SeedableRng;
use rand::rngs::StdRng;

use super::method::TaskArithmeticOptions;
use super::sparsify::{SparsifyOptions, sparsify};
use crate::hf::WeightDtype;

/// One model's contribution: its values and parameters for the tensor.
#[derive(Debug, Clone)]
pub struct TaskVector<'a> {
    /// The model's values of the tensor.
    pub values: &'a [f32],
    /// Its `weight`.
    pub weight: f64,
    /// The fraction of its differences kept (`density`).
    pub density: f64,
    /// Breadcrumbs' `gamma`.
    pub gamma: f64,
    /// DELLA's `epsilon`.
    pub epsilon: f64,
}

/// The shared parameters of a task-arithmetic merge of one tensor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TaskArithmetic {
    /// The method's fixed options.
    pub options: TaskArithmeticOptions,
    /// Whether the mixed difference is divided by the sum of the weights that contributed.
    pub normalize: bool,
    /// Whether sparsified differences keep their L1 norm.
    pub rescale: bool,
    /// The factor of the mixed difference (`lambda`).
    pub lambda: f64,
    /// The seed of the random sparsifications; model `i` draws from `seed ^ i·φ` (see
    /// [`stream_seed`]).
    pub seed: u64,
    /// The merge's dtype: the sign election sums the weighted differences in it, as mergekit
    /// does, so that a sum near zero elects the sign mergekit elects.
    pub working: WeightDtype,
}

/// The seed model number `stream` draws from, for a tensor seeded `seed`.
pub fn stream_seed(seed: u64, stream: usize) -> u64 {
    seed ^ (stream as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The sign mergekit's `sum` election gives an element whose models hold `values` (in the
/// merge's dtype): their sum, taken in f32 in model order as torch sums a short axis (a bf16 sum
/// accumulates in f32 too), at least zero elects plus.
pub(super) fn elected_sign(values: impl Iterator<Item = f32>) -> f64 {
    if values.sum::<f32>() >= 0.0 {
        1.0
    } else {
        -1.0
    }
}

/// `base + λ · mix(wᵢ · sparsified(θᵢ − base))`, the mix as `merge` says. Differences are taken
/// in f32, as mergekit takes them, so that magnitudes rank alike.
pub fn task_arithmetic(
    base: &[f32],
    shape: &[usize],
    models: &[TaskVector<'_>],
    merge: TaskArithmetic,
) -> Result<Vec<f64>, String> {
    let mut weighted = Vec::with_capacity(models.len());
    // The weighted differences as mergekit holds them (in the merge's dtype), for the election.
    let mut election: Vec<Vec<f32>> = Vec::with_capacity(models.len());
    let working = merge.working;
    for (number, model) in models.iter().enumerate() {
        let mut delta: Vec<f64> = model
            .values
            .iter()
            .zip(base)
            .map(|(&value, &base)| f64::from(value - base))
            .collect();
        if let Some(method) = merge.options.sparsification {
            let options = SparsifyOptions {
                method,
                density: model.density,
                gamma: model.gamma,
                epsilon: model.epsilon,
                rescale: merge.rescale,
            };
            let mut random = StdRng::seed_from_u64(stream_seed(merge.seed, number));
            sparsify(&mut delta, shape, options, &mut random)?;
        }
        if merge.options.sign_consensus {
            let weight = working.round(model.weight as f32);
            election.push(
                delta
                    .iter()
                    .map(|&d| working.round(working.round(d as f32) * weight))
                    .collect(),
            );
        }
        delta.iter_mut().for_each(|d| *d *= model.weight);
        weighted.push(delta);
    }
    Ok((0..base.len())
        .map(|index| {
            let (mut mixed, divisor) = if merge.options.sign_consensus {
                let elected = elected_sign(election.iter().map(|terms| terms[index]));
                let (mut mixed, mut divisor) = (0.0, 0.0);
                for (delta, model) in weighted.iter().zip(models) {
                    let value = delta[index];
                    if value != 0.0 && value.signum() == elected {
                        mixed += value;
                        divisor += model.weight;
                    }
                }
                (mixed, if divisor == 0.0 { 1.0 } else { divisor })
            } else {
                let mixed: f64 = weighted.iter().map(|delta| delta[index]).sum();
                let divisor: f64 = models.iter().map(|model| model.weight).sum();
                (mixed, if divisor.abs() < 1e-8 { 1.0 } else { divisor })
            };
            if merge.normalize {
                mixed /= divisor;
            }
            f64::from(base[index]) + mixed * merge.lambda
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::merge::MergeMethod;
    use crate::merge::fixture_cases::{cases, dtype, list};

    fn vector(values: &[f32]) -> TaskVector<'_> {
        TaskVector {
            values,
            weight: 1.0,
            density: 1.0,
            gamma: 0.01,
            epsilon: 0.15,
        }
    }

    /// Weighted differences summing to nearly zero
    /// (`fixtures/mergekit/ties-sign-election.json`, mergekit's own election): held in the
    /// merge's dtype, the sum elects the sign mergekit elects, where a float64 sum elects the
    /// other. With one model kept and `normalize`, the merge is that model's difference.
    #[test]
    fn the_sign_election_is_mergekits_near_zero() {
        let cases = cases("ties-sign-election.json");
        assert_eq!(cases.len(), 2);
        for case in cases {
            let deltas = list(&case, "deltas", serde_json::Value::as_f64);
            let weights = list(&case, "weights", serde_json::Value::as_f64);
            let mask = list(&case, "mask", serde_json::Value::as_bool);
            let values: Vec<[f32; 1]> = deltas.iter().map(|&d| [d as f32]).collect();
            let models: Vec<TaskVector<'_>> = values
                .iter()
                .zip(&weights)
                .map(|(values, &weight)| TaskVector {
                    weight,
                    ..vector(values)
                })
                .collect();
            let merged = task_arithmetic(&[0.0], &[1], &models, ties(dtype(&case))).unwrap()[0];
            let kept = mask.iter().position(|&kept| kept).unwrap();
            assert_eq!(mask.iter().filter(|&&kept| kept).count(), 1);
            assert!(
                (merged - deltas[kept]).abs() < 1e-6,
                "{}: merged {merged}, mergekit keeps model {kept} ({})",
                case["dtype"],
                deltas[kept]
            );
        }
    }

    /// TIES, normalised, λ 1, merged in `working`.
    fn ties(working: WeightDtype) -> TaskArithmetic {
        TaskArithmetic {
            options: MergeMethod::Ties.task_arithmetic().unwrap(),
            normalize: true,
            rescale: false,
            lambda: 1.0,
            seed: 0,
            working,
        }
    }

    #[test]
    fn sign_election_drops_the_minority_and_divides_by_the_weights_that_agree() {
        let base = [0.0f32, 0.0];
        let models = [vector(&[1.0, 2.0]), vector(&[-3.0, 4.0])];
        let merge = ties(WeightDtype::F32);
        // Element 0: 1 − 3 < 0 elects minus, only the second counts; element 1: both agree.
        assert_eq!(
            task_arithmetic(&base, &[2], &models, merge).unwrap(),
            vec![-3.0, 3.0]
        );
    }
}
