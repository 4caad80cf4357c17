//! SCE (mergekit's `sce`): select the elements whose differences vary most across the models,
//! calculate each model's weight from the energy of its differences, erase the differences
//! against the elected sign.

use super::task_arithmetic::elected_sign;
use crate::hf::WeightDtype;

/// SCE of `models` around `base`, keeping the `select_topk` fraction of elements of largest
/// variance across the models (of those that vary at all). What selects and erases elements
/// (the differences, their variance, the kept count, the sign election) is computed as mergekit
/// computes it in the merge's dtype `working`; the weights and the mix in f64.
pub fn sce(base: &[f32], models: &[&[f32]], select_topk: f64, working: WeightDtype) -> Vec<f64> {
    if models.is_empty() {
        return base.iter().map(|&v| f64::from(v)).collect();
    }
    let length = base.len();
    let mut deltas: Vec<Vec<f64>> = models
        .iter()
        .map(|model| {
            model
                .iter()
                .zip(base)
                .map(|(&m, &b)| f64::from(working.round(m - b)))
                .collect()
        })
        .collect();
    if select_topk < 1.0 {
        let mut selected = vec![select_topk > 0.0; length];
        if select_topk > 0.0 {
            // torch.var(unbiased=False) on the merge's dtype: mean, then mean square deviation.
            let count = deltas.len() as f32;
            let variance: Vec<f32> = (0..length)
                .map(|i| {
                    let mean =
                        working.round(deltas.iter().map(|d| d[i] as f32).sum::<f32>() / count);
                    let squares: f32 = deltas.iter().map(|d| (d[i] as f32 - mean).powi(2)).sum();
                    working.round(squares / count)
                })
                .collect();
            let varying = variance.iter().filter(|v| **v != 0.0).count();
            // `int(count_nonzero(var) * select_topk)`: a float32 product.
            let kept = (varying as f32 * select_topk as f32) as usize;
            let mut order: Vec<usize> = (0..length).collect();
            order.sort_by(|&a, &b| variance[b].total_cmp(&variance[a]));
            selected = vec![false; length];
            order[..kept].iter().for_each(|&i| selected[i] = true);
        }
        for delta in &mut deltas {
            delta
                .iter_mut()
                .zip(&selected)
                .filter(|(_, selected)| !**selected)
                .for_each(|(d, _)| *d = 0.0);
        }
    }
    let energies: Vec<f64> = deltas
        .iter()
        .map(|d| d.iter().map(|v| v * v).sum::<f64>() / length as f64)
        .collect();
    let total: f64 = energies.iter().sum();
    let weights: Vec<f64> = if total.abs() < 1e-6 {
        vec![1.0 / energies.len() as f64; energies.len()]
    } else {
        energies.iter().map(|e| e / total).collect()
    };
    (0..length)
        .map(|i| {
            let elected = elected_sign(deltas.iter().map(|d| d[i] as f32));
            let (mut mixed, mut divisor) = (0.0, 0.0);
            for (delta, weight) in deltas.iter().zip(&weights) {
                if delta[i] != 0.0 && delta[i].signum() == elected {
                    mixed += delta[i] * weight;
                    divisor += weight;
                }
            }
            f64::from(base[i]) + mixed / divisor.max(1e-6)
        })
        .collect()
}
