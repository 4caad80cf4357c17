//! Which of a model's differences from the base a task-arithmetic merge keeps (mergekit's
//! `sparsify`): the others are set to 0 and, with `rescale`, the kept ones are scaled so that
//! the L1 norm of the differences is unchanged.

use rand::Rng;
use rand::rngs::StdRng;

use super::method::Sparsification;

/// The options of one sparsification.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SparsifyOptions {
    /// How differences are chosen.
    pub method: Sparsification,
    /// The fraction kept (`density`); 1 or more keeps every difference as it is.
    pub density: f64,
    /// The fraction of largest magnitude dropped first (`gamma`, breadcrumbs).
    pub gamma: f64,
    /// Half the spread of the keep probabilities (`epsilon`, DELLA).
    pub epsilon: f64,
    /// Whether the kept differences are rescaled to the L1 norm of all of them (`rescale`).
    pub rescale: bool,
}

/// Sparsifies `delta` (a tensor of `shape`) in place. `random` draws the choices of the random
/// methods. An error says which parameters cannot be used together.
pub fn sparsify(
    delta: &mut [f64],
    shape: &[usize],
    options: SparsifyOptions,
    random: &mut StdRng,
) -> Result<(), String> {
    let density = options.density;
    if density >= 1.0 {
        return Ok(());
    }
    let count = delta.len();
    let keep: Vec<bool> = match options.method {
        Sparsification::Magnitude => {
            if density <= 0.0 || count == 0 {
                delta.fill(0.0);
                return Ok(());
            }
            let kept = ((density * count as f64) as usize).max(1);
            let order = by_magnitude(delta, 0..count);
            let mut keep = vec![false; count];
            order[count - kept..].iter().for_each(|&i| keep[i] = true);
            keep
        }
        Sparsification::MagnitudeOutliers => {
            let kept = (density * count as f64) as usize;
            let top = (options.gamma * count as f64) as usize;
            let bottom = count.saturating_sub(kept + top);
            let order = by_magnitude(delta, 0..count);
            let mut keep = vec![false; count];
            order[bottom..(bottom + kept).min(count)]
                .iter()
                .for_each(|&i| keep[i] = true);
            keep
        }
        Sparsification::Random => (0..count).map(|_| random.random_bool(density)).collect(),
        Sparsification::RankedRandom => {
            if density <= 0.0 {
                delta.fill(0.0);
                return Ok(());
            }
            let epsilon = options.epsilon;
            if density + epsilon >= 1.0 || density - epsilon <= 0.0 {
                return Err(format!(
                    "`density` {density} ± `epsilon` {epsilon} must lie within (0, 1)"
                ));
            }
            // The rows of a matrix are ranked separately, a vector as one row.
            let length = if shape.len() >= 2 {
                shape[shape.len() - 1]
            } else {
                count.max(1)
            };
            let mut probability = vec![0.0; count];
            for row in 0..count / length {
                let order = by_magnitude(delta, row * length..(row + 1) * length);
                for (rank, &i) in order.iter().enumerate() {
                    // A row of one element has no spread: it takes the lowest probability.
                    let position = if length > 1 {
                        rank as f64 / (length - 1) as f64
                    } else {
                        0.0
                    };
                    probability[i] = density - epsilon + position * 2.0 * epsilon;
                }
            }
            probability.iter().map(|&p| random.random_bool(p)).collect()
        }
    };
    let before: f64 = delta.iter().map(|d| d.abs()).sum();
    delta
        .iter_mut()
        .zip(&keep)
        .filter(|(_, keep)| !**keep)
        .for_each(|(value, _)| *value = 0.0);
    if options.rescale {
        let after: f64 = delta.iter().map(|d| d.abs()).sum();
        if before >= 1e-7 && after >= 1e-7 {
            delta.iter_mut().for_each(|value| *value *= before / after);
        }
    }
    Ok(())
}

/// The indices of `range`, by increasing magnitude of `delta`.
fn by_magnitude(delta: &[f64], range: std::ops::Range<usize>) -> Vec<usize> {
    let mut order: Vec<usize> = range.collect();
    order.sort_by(|&a, &b| delta[a].abs().total_cmp(&delta[b].abs()));
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn options(method: Sparsification, density: f64) -> SparsifyOptions {
        SparsifyOptions {
            method,
            density,
            gamma: 0.0,
            epsilon: 0.0,
            rescale: false,
        }
    }

    fn run(delta: &[f64], options: SparsifyOptions) -> Vec<f64> {
        let mut delta = delta.to_vec();
        let shape = [delta.len()];
        sparsify(&mut delta, &shape, options, &mut StdRng::seed_from_u64(7)).unwrap();
        delta
    }

    #[test]
    fn magnitude_keeps_the_largest_differences() {
        let kept = run(
            &[0.1, -3.0, 2.0, -0.5, 0.0],
            options(Sparsification::Magnitude, 0.4),
        );
        assert_eq!(kept, vec![0.0, -3.0, 2.0, 0.0, 0.0]);
    }

    #[test]
    fn breadcrumbs_drop_the_outliers_then_the_smallest() {
        let delta = [0.1, -3.0, 2.0, -0.5, 0.2, 1.0, -0.05, 0.3, 0.4, 0.6];
        let kept = run(
            &delta,
            SparsifyOptions {
                gamma: 0.2,
                ..options(Sparsification::MagnitudeOutliers, 0.3)
            },
        );
        // 10 elements: the 2 largest (−3, 2) dropped, the 3 next kept (1, 0.6, −0.5).
        assert_eq!(
            kept,
            vec![0.0, 0.0, 0.0, -0.5, 0.0, 1.0, 0.0, 0.0, 0.0, 0.6]
        );
    }

    #[test]
    fn rescaling_keeps_the_l1_norm() {
        let delta: Vec<f64> = (0..1000).map(|i| f64::from(i % 13) - 6.0).collect();
        let kept = run(
            &delta,
            SparsifyOptions {
                rescale: true,
                ..options(Sparsification::Random, 0.3)
            },
        );
        let l1 = |values: &[f64]| values.iter().map(|v| v.abs()).sum::<f64>();
        assert!((l1(&kept) - l1(&delta)).abs() < 1e-9 * l1(&delta));
    }

    #[test]
    fn random_keeps_about_density() {
        let kept = run(&vec![1.0; 20_000], options(Sparsification::Random, 0.25));
        let count = kept.iter().filter(|d| **d != 0.0).count();
        // Binomial(20000, 0.25): mean 5000, standard deviation 61.
        assert!((4700..5300).contains(&count), "{count}");
    }

    #[test]
    fn ranked_random_keeps_large_differences_more_often() {
        let delta: Vec<f64> = (0..20_000).map(f64::from).collect();
        let options = SparsifyOptions {
            epsilon: 0.2,
            ..options(Sparsification::RankedRandom, 0.5)
        };
        let kept = run(&delta, options);
        let kept_in =
            |range: std::ops::Range<usize>| kept[range].iter().filter(|d| **d != 0.0).count();
        // Probabilities 0.3 → 0.7 along the ranks: about 0.35 of the lowest 5000, 0.65 of the
        // highest, 0.5 overall.
        let (low, high) = (kept_in(0..5000), kept_in(15_000..20_000));
        assert!((1600..1900).contains(&low), "{low}");
        assert!((3100..3400).contains(&high), "{high}");
        let error = sparsify(
            &mut delta.clone(),
            &[delta.len()],
            SparsifyOptions {
                epsilon: 0.6,
                ..options
            },
            &mut StdRng::seed_from_u64(0),
        )
        .unwrap_err();
        assert!(error.contains("epsilon"), "{error}");
    }
}
