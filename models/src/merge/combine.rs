//! One output tensor merged from its inputs' values by the configured method.

use super::arcee_fusion::arcee_fusion;
use super::interpolation::{VectorAxis, karcher, linear, multislerp, nuslerp, slerp};
use super::method::MergeMethod;
use super::model_stock::model_stock;
use super::nearswap::nearswap;
use super::plan::{PlannedInput, PlannedTensor};
use super::sce::sce;
use super::task_arithmetic::{TaskArithmetic, TaskVector, task_arithmetic};
use crate::hf::WeightDtype;

/// The merged values of `tensor`, whose inputs hold `values` (in the order of its inputs) of
/// the merge's dtype `working`. An error says why these values cannot be merged.
pub fn combine(
    method: MergeMethod,
    tensor: &PlannedTensor,
    values: &[Vec<f32>],
    working: WeightDtype,
) -> Result<Vec<f64>, String> {
    let shared = |name: &str| tensor.shared[name];
    let own = |input: &PlannedInput, name: &str| input.parameters[name].number();
    let widen = |values: &[f32]| values.iter().map(|&v| f64::from(v)).collect::<Vec<f64>>();
    let base = tensor.base.map(|index| values[index].as_slice());
    let others: Vec<(&PlannedInput, &[f32])> = tensor
        .inputs
        .iter()
        .zip(values)
        .enumerate()
        .filter(|(index, _)| Some(*index) != tensor.base)
        .map(|(_, (input, values))| (input, values.as_slice()))
        .collect();
    let required_base = || base.expect("checked: the method has a base model");
    match method {
        MergeMethod::Linear => {
            let models: Vec<(&[f32], f64)> = tensor
                .inputs
                .iter()
                .zip(values)
                .map(|(input, values)| (values.as_slice(), own(input, "weight")))
                .collect();
            linear(&models, shared("normalize").flag())
        }
        MergeMethod::Slerp => Ok(slerp(
            shared("t").number(),
            &widen(required_base()),
            &widen(others[0].1),
        )),
        MergeMethod::Nearswap => Ok(nearswap(shared("t").number(), required_base(), others[0].1)),
        MergeMethod::ArceeFusion => Ok(arcee_fusion(
            required_base(),
            others[0].1,
            &tensor.shape,
            working,
        )),
        MergeMethod::Nuslerp => {
            let (first, second) = (own(others[0].0, "weight"), own(others[1].0, "weight"));
            let total = first + second;
            let t = if total.abs() < 1e-6 {
                0.5
            } else {
                second / total
            };
            let axis = if shared("nuslerp_flatten").flag() {
                VectorAxis::Flattened
            } else if shared("nuslerp_row_wise").flag() {
                VectorAxis::First
            } else {
                VectorAxis::Last
            };
            let relative = |model: &[f32]| differences(model, base);
            let merged = nuslerp(
                t,
                &relative(others[0].1),
                &relative(others[1].1),
                &tensor.shape,
                axis,
            );
            Ok(add_base(merged, base))
        }
        MergeMethod::Multislerp => {
            if others.len() == 1 {
                return Ok(widen(others[0].1));
            }
            let tensors: Vec<Vec<f64>> = others.iter().map(|(_, v)| differences(v, base)).collect();
            let weights: Vec<f64> = others
                .iter()
                .map(|(input, _)| own(input, "weight"))
                .collect();
            let merged = multislerp(
                &tensors,
                &weights,
                shared("normalize_weights").flag(),
                shared("eps").number(),
            )?;
            Ok(add_base(merged, base))
        }
        MergeMethod::Karcher => {
            let all: Vec<&[f32]> = values.iter().map(Vec::as_slice).collect();
            Ok(karcher(
                &all,
                shared("max_iter").number() as usize,
                shared("tol").number(),
            ))
        }
        MergeMethod::ModelStock => {
            let models: Vec<&[f32]> = others.iter().map(|(_, v)| *v).collect();
            Ok(model_stock(
                required_base(),
                &models,
                &tensor.shape,
                shared("filter_wise").flag(),
            ))
        }
        MergeMethod::Sce => {
            let models: Vec<&[f32]> = others.iter().map(|(_, v)| *v).collect();
            Ok(sce(
                required_base(),
                &models,
                shared("select_topk").number(),
                working,
            ))
        }
        MergeMethod::Passthrough => {
            let scale = tensor.inputs[0].parameters.get("scale").map(|s| s.number());
            Ok(values[0]
                .iter()
                .map(|&v| scale.map_or(f64::from(v), |scale| f64::from(v) * scale))
                .collect())
        }
        family => {
            let options = family
                .task_arithmetic()
                .expect("every other method is matched above");
            let models: Vec<TaskVector<'_>> = others
                .iter()
                .map(|(input, values)| TaskVector {
                    values,
                    weight: own(input, "weight"),
                    density: own(input, "density"),
                    gamma: input.parameters.get("gamma").map_or(0.0, |g| g.number()),
                    epsilon: input.parameters.get("epsilon").map_or(0.0, |e| e.number()),
                })
                .collect();
            let merge = TaskArithmetic {
                options,
                normalize: shared("normalize").flag(),
                rescale: shared("rescale").flag(),
                lambda: shared("lambda").number(),
                seed: tensor_seed(&tensor.name),
                working,
            };
            task_arithmetic(required_base(), &tensor.shape, &models, merge)
        }
    }
}

/// `model − base` (taken in f32, as mergekit takes it), or the model itself without a base.
fn differences(model: &[f32], base: Option<&[f32]>) -> Vec<f64> {
    match base {
        Some(base) => model
            .iter()
            .zip(base)
            .map(|(&m, &b)| f64::from(m - b))
            .collect(),
        None => model.iter().map(|&m| f64::from(m)).collect(),
    }
}

/// `merged + base`, or `merged` without a base.
fn add_base(merged: Vec<f64>, base: Option<&[f32]>) -> Vec<f64> {
    match base {
        Some(base) => merged
            .iter()
            .zip(base)
            .map(|(m, &b)| m + f64::from(b))
            .collect(),
        None => merged,
    }
}

/// The seed of a tensor's random choices (`dare_*`, `della*`): the 64-bit FNV-1a hash of its
/// output name, so that a merge is repeatable and every tensor draws differently.
pub fn tensor_seed(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
