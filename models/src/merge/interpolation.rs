//! The interpolating methods on one tensor's values, as mergekit computes them (in f64 here):
//! `linear`, `slerp`, `nuslerp`, `multislerp` and `karcher`.

/// `Σ wᵢ θᵢ`, divided by `Σ wᵢ` when `normalize`. Weights that sum to 0 cannot be normalised:
/// an error.
pub fn linear(models: &[(&[f32], f64)], normalize: bool) -> Result<Vec<f64>, String> {
    let total: f64 = models.iter().map(|(_, weight)| weight).sum();
    if normalize && total == 0.0 {
        return Err("the weights sum to 0 and `normalize` is true".into());
    }
    let divisor = if normalize { total } else { 1.0 };
    Ok((0..models[0].0.len())
        .map(|index| {
            let sum: f64 = models
                .iter()
                .map(|(values, weight)| weight * f64::from(values[index]))
                .sum();
            sum / divisor
        })
        .collect())
}

fn norm(values: &[f64]) -> f64 {
    values.iter().map(|v| v * v).sum::<f64>().sqrt()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Spherical interpolation from `from` (`t` = 0) to `to` (`t` = 1) along the great circle
/// between their directions; nearly parallel or opposite tensors (|cos| > 0.9995) are
/// interpolated linearly.
pub fn slerp(t: f64, from: &[f64], to: &[f64]) -> Vec<f64> {
    let nonzero = |norm: f64| if norm > 1e-8 { norm } else { 1.0 };
    let (from_norm, to_norm) = (nonzero(norm(from)), nonzero(norm(to)));
    let cosine = from
        .iter()
        .zip(to)
        .map(|(a, b)| (a / from_norm) * (b / to_norm))
        .sum::<f64>()
        .clamp(-1.0, 1.0);
    let (from_scale, to_scale) = if cosine.abs() > 0.9995 {
        (1.0 - t, t)
    } else {
        let angle = cosine.acos();
        let sine = angle.sin();
        (((1.0 - t) * angle).sin() / sine, (t * angle).sin() / sine)
    };
    from.iter()
        .zip(to)
        .map(|(a, b)| from_scale * a + to_scale * b)
        .collect()
}

/// The vectors `nuslerp` interpolates: the whole tensor, or its vectors along one axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VectorAxis {
    /// The flattened tensor (`nuslerp_flatten`, the default).
    Flattened,
    /// Along the last axis: the rows of a matrix.
    Last,
    /// Along the first axis (`nuslerp_row_wise`): the columns of a matrix.
    First,
}

/// The element indices of each vector of a tensor of `shape` along `axis`.
fn vectors(shape: &[usize], axis: VectorAxis) -> Vec<Vec<usize>> {
    let count: usize = shape.iter().product();
    match (axis, shape) {
        (VectorAxis::Flattened, _) | (_, [] | [_]) => vec![(0..count).collect()],
        (VectorAxis::Last, _) => {
            let length = shape[shape.len() - 1];
            (0..count / length)
                .map(|row| (row * length..(row + 1) * length).collect())
                .collect()
        }
        (VectorAxis::First, _) => {
            let stride = count / shape[0];
            (0..stride)
                .map(|offset| (0..shape[0]).map(|k| offset + k * stride).collect())
                .collect()
        }
    }
}

/// NuSLERP: `from` and `to` interpolated at `t` vector by vector (see [`VectorAxis`]), each
/// pair spherically between the unnormalised vectors, linearly where they are parallel.
pub fn nuslerp(t: f64, from: &[f64], to: &[f64], shape: &[usize], axis: VectorAxis) -> Vec<f64> {
    let mut result = vec![0.0; from.len()];
    for indices in vectors(shape, axis) {
        let a: Vec<f64> = indices.iter().map(|&i| from[i]).collect();
        let b: Vec<f64> = indices.iter().map(|&i| to[i]).collect();
        let (a_norm, b_norm) = (norm(&a).max(1e-7), norm(&b).max(1e-7));
        let cosine = (a.iter().zip(&b).map(|(x, y)| (x / a_norm) * (y / b_norm)))
            .sum::<f64>()
            .clamp(-1.0, 1.0);
        let (a_scale, b_scale) = if 1.0 - cosine * cosine <= 1e-16 {
            (1.0 - t, t)
        } else {
            let angle = cosine.acos();
            let sine = angle.sin();
            (((1.0 - t) * angle).sin() / sine, (t * angle).sin() / sine)
        };
        for (k, &i) in indices.iter().enumerate() {
            result[i] = a_scale * a[k] + b_scale * b[k];
        }
    }
    result
}

/// Multi-SLERP: barycentric interpolation of `tensors` (already less the base, when there is
/// one) with `weights`, on the hypersphere through their weighted mean direction, scaled by their
/// weighted mean norm.
pub fn multislerp(
    tensors: &[Vec<f64>],
    weights: &[f64],
    normalize_weights: bool,
    eps: f64,
) -> Result<Vec<f64>, String> {
    let total: f64 = weights.iter().sum();
    let weights: Vec<f64> = if normalize_weights {
        weights.iter().map(|w| w / total).collect()
    } else {
        weights.to_vec()
    };
    let norms: Vec<f64> = tensors.iter().map(|tensor| norm(tensor)).collect();
    let units: Vec<Vec<f64>> = tensors
        .iter()
        .zip(&norms)
        .map(|(tensor, norm)| tensor.iter().map(|v| v / (norm + eps)).collect())
        .collect();
    let length = tensors[0].len();
    let weighted_sum = |vectors: &[Vec<f64>]| -> Vec<f64> {
        (0..length)
            .map(|i| vectors.iter().zip(&weights).map(|(v, w)| v[i] * w).sum())
            .collect()
    };
    let mean = weighted_sum(&units);
    let mean_norm = norm(&mean);
    if mean_norm < eps {
        if tensors.len() == 2 {
            return Ok((0..length)
                .map(|i| tensors[0][i] * weights[0] + tensors[1][i] * weights[1])
                .collect());
        }
        return Err(
            "the weighted sum of the models' directions is 0 (opposite models whose \
                    weights cancel): choose other weights"
                .into(),
        );
    }
    let mean: Vec<f64> = mean.iter().map(|v| v / mean_norm).collect();
    let tangents: Vec<Vec<f64>> = units
        .iter()
        .map(|unit| {
            let along = dot(unit, &mean);
            unit.iter().zip(&mean).map(|(u, m)| u - along * m).collect()
        })
        .collect();
    let tangent = weighted_sum(&tangents);
    let tangent_norm = norm(&tangent) + eps;
    let average_norm: f64 = norms.iter().zip(&weights).map(|(n, w)| n * w).sum();
    Ok(mean
        .iter()
        .zip(&tangent)
        .map(|(m, v)| {
            (m * tangent_norm.cos() + v * (tangent_norm.sin() / tangent_norm)) * average_norm
        })
        .collect())
}

/// The Karcher mean of `tensors` with equal weights: the point of the unit hypersphere that
/// minimises the weighted squared geodesic distances to their directions (at most `max_iter`
/// steps, stopping when a step is shorter than `tol`), scaled by their mean norm.
pub fn karcher(tensors: &[&[f32]], max_iter: usize, tol: f64) -> Vec<f64> {
    let tensors: Vec<Vec<f64>> = tensors
        .iter()
        .map(|t| t.iter().map(|&v| f64::from(v)).collect())
        .collect();
    if tensors.len() == 1 {
        return tensors.into_iter().next().expect("one tensor");
    }
    let alpha = 1.0 / tensors.len() as f64;
    let norms: Vec<f64> = tensors.iter().map(|t| norm(t)).collect();
    let valid: Vec<Vec<f64>> = tensors
        .iter()
        .zip(&norms)
        .filter(|(_, norm)| **norm > tol)
        .map(|(tensor, norm)| tensor.iter().map(|v| v / norm).collect())
        .collect();
    let length = tensors[0].len();
    if valid.is_empty() {
        return vec![0.0; length];
    }
    let weight = 1.0 / valid.len() as f64;
    let sum: Vec<f64> = (0..length)
        .map(|i| valid.iter().map(|unit| weight * unit[i]).sum())
        .collect();
    let sum_norm = norm(&sum);
    let mut mean = if sum_norm < tol {
        valid[0].clone()
    } else {
        sum.iter().map(|v| v / sum_norm).collect()
    };
    for _ in 0..max_iter {
        let mut tangent = vec![0.0; length];
        for unit in &valid {
            let cosine = dot(&mean, unit).clamp(-1.0, 1.0);
            let angle = cosine.acos();
            if angle < tol {
                continue;
            }
            let scale = weight * angle / angle.sin();
            for i in 0..length {
                tangent[i] += scale * (unit[i] - cosine * mean[i]);
            }
        }
        let tangent_norm = norm(&tangent);
        if tangent_norm < tol {
            break;
        }
        for i in 0..length {
            mean[i] =
                tangent_norm.cos() * mean[i] + tangent_norm.sin() * (tangent[i] / tangent_norm);
        }
        let mean_norm = norm(&mean);
        if mean_norm > tol {
            mean.iter_mut().for_each(|v| *v /= mean_norm);
        }
    }
    let scale: f64 = norms.iter().map(|n| alpha * n).sum();
    mean.iter().map(|v| scale * v).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_along_each_axis_of_a_matrix() {
        assert_eq!(
            vectors(&[2, 3], VectorAxis::Last),
            vec![vec![0, 1, 2], vec![3, 4, 5]]
        );
        assert_eq!(
            vectors(&[2, 3], VectorAxis::First),
            vec![vec![0, 3], vec![1, 4], vec![2, 5]]
        );
        assert_eq!(vectors(&[3], VectorAxis::First), vec![vec![0, 1, 2]]);
    }

    #[test]
    fn slerp_of_orthogonal_unit_vectors_stays_on_the_circle() {
        let half = slerp(0.5, &[1.0, 0.0], &[0.0, 1.0]);
        let expected = std::f64::consts::FRAC_1_SQRT_2;
        assert!((half[0] - expected).abs() < 1e-15 && (half[1] - expected).abs() < 1e-15);
    }

    #[test]
    fn karcher_mean_of_two_directions_is_their_bisector() {
        let mean = karcher(&[&[2.0, 0.0], &[0.0, 2.0]], 10, 1e-5);
        let expected = 2.0 * std::f64::consts::FRAC_1_SQRT_2;
        assert!((mean[0] - expected).abs() < 1e-9 && (mean[1] - expected).abs() < 1e-9);
    }
}
