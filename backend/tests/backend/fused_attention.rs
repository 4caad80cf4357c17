//! The fused attention (`burn_trainium::attention`): on `host` and `xla` its values and
//! gradients equal the materialised form's on Flex, for every option it takes; its HLO holds at
//! most one block of scores.

use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::{DType, Device, Tensor, TensorData};
use burn_ir::{CustomOpIr, OperationIr, TensorIr, TensorStatus};
use burn_trainium::attention::{
    BACKWARD, FORWARD, FusedAttentionOptions, QUERY_BLOCK, fused_attention, materialized_attention,
};
use burn_trainium::lower::{boundary_of, lower_segment};
use burn_trainium::neuron::lint_module;

use super::support::{adam_losses, assert_close, linear, tensor, values};

/// One attention to compare: its sizes and options.
pub(super) struct Case {
    pub name: &'static str,
    pub heads: usize,
    pub kv_heads: usize,
    pub queries: usize,
    pub keys: usize,
    pub depth: usize,
    pub sinks: bool,
    pub options: FusedAttentionOptions,
}

impl Case {
    pub fn causal(name: &'static str, heads: usize, kv_heads: usize, positions: usize) -> Self {
        Self {
            name,
            heads,
            kv_heads,
            queries: positions,
            keys: positions,
            depth: 8,
            sinks: false,
            options: FusedAttentionOptions::causal(),
        }
    }
}

/// Every option alone and together, over one block and over several.
fn cases() -> Vec<Case> {
    let window = |window| FusedAttentionOptions {
        sliding_window: Some(window),
        ..FusedAttentionOptions::causal()
    };
    let capped = FusedAttentionOptions {
        scale: Some(0.3),
        softcap: Some(2.0),
        ..FusedAttentionOptions::causal()
    };
    vec![
        Case::causal("causal", 2, 2, 24),
        Case::causal("grouped", 4, 2, 24),
        Case {
            options: window(7),
            ..Case::causal("window", 4, 1, 40)
        },
        Case {
            options: capped,
            ..Case::causal("scale and cap", 2, 2, 16)
        },
        Case {
            sinks: true,
            options: window(5),
            ..Case::causal("sinks", 4, 2, 24)
        },
        Case {
            queries: 6,
            options: FusedAttentionOptions::default(),
            ..Case::causal("not causal, fewer queries", 2, 1, 20)
        },
        Case {
            queries: 6,
            ..Case::causal("causal over a cache", 2, 1, 20)
        },
        Case {
            depth: 4,
            ..Case::causal("blocks", 2, 1, QUERY_BLOCK + 88)
        },
        Case {
            depth: 4,
            sinks: true,
            options: FusedAttentionOptions {
                sliding_window: Some(100),
                softcap: Some(3.0),
                ..FusedAttentionOptions::causal()
            },
            ..Case::causal("blocks, window, sinks, cap", 2, 1, QUERY_BLOCK + 88)
        },
    ]
}

/// The output and the gradients of query, key, value (and sinks) of `case` in `dtype`, through
/// the fused operation or the materialised form, under a loss that weighs every output.
fn run(case: &Case, device: &Device, fused: bool, dtype: DType) -> Vec<(String, TensorData)> {
    let device = device.clone().autodiff();
    let input = |seed: u64, shape: [usize; 4]| {
        let count = shape.iter().product();
        let data = TensorData::new(values(seed, count), shape);
        Tensor::<4>::from_data(data, &device)
            .mul_scalar(2.0)
            .cast(dtype)
            .require_grad()
    };
    let query = input(1, [2, case.heads, case.queries, case.depth]);
    let key = input(2, [2, case.kv_heads, case.keys, case.depth]);
    let value = input(3, [2, case.kv_heads, case.keys, case.depth]);
    let sinks = case.sinks.then(|| {
        Tensor::<1>::from_data(
            TensorData::new(values(4, case.heads), [case.heads]),
            &device,
        )
        .cast(dtype)
        .require_grad()
    });
    let weights = Tensor::<4>::from_data(
        TensorData::new(
            values(5, 2 * case.heads * case.queries * case.depth),
            [2, case.heads, case.queries, case.depth],
        ),
        &device,
    );
    let attend = if fused {
        fused_attention
    } else {
        materialized_attention
    };
    let output = attend(
        query.clone(),
        key.clone(),
        value.clone(),
        sinks.clone(),
        &case.options,
    );
    let grads = (output.clone().cast(DType::F32) * weights).sum().backward();
    let mut results = vec![
        ("output".to_string(), output.into_data()),
        ("query grad".into(), query.grad(&grads).unwrap().into_data()),
        ("key grad".into(), key.grad(&grads).unwrap().into_data()),
        ("value grad".into(), value.grad(&grads).unwrap().into_data()),
    ];
    if let Some(sinks) = sinks {
        results.push(("sink grad".into(), sinks.grad(&grads).unwrap().into_data()));
    }
    results
}

/// Compares `case` on the served devices with the materialised form on Flex.
fn compare(case: &Case, dtype: DType, tolerance: f64) {
    let expected = run(case, &Device::flex(), false, dtype);
    for spec in ["host:1", "xla:1"] {
        let device = burn_trainium::device(spec).expect("the device is served");
        let actual = run(case, &device, true, dtype);
        for ((name, expected), (_, actual)) in expected.iter().zip(&actual) {
            let what = format!("{} ({dtype:?}), {name} on {spec}", case.name);
            assert_eq!(actual.dtype(), expected.dtype(), "{what}");
            assert_close(&what, expected, actual, tolerance);
        }
    }
}

#[test]
fn fused_attention_equals_the_materialised_form_in_f32() {
    test_support::plugin::plugin_path();
    for case in cases() {
        compare(&case, DType::F32, 1e-5);
    }
}

#[test]
fn fused_attention_equals_the_materialised_form_in_bf16() {
    test_support::plugin::plugin_path();
    for case in cases().iter().filter(|case| case.queries < QUERY_BLOCK) {
        compare(case, DType::BF16, 2e-2);
    }
}

/// A self-attention layer as a Burn user writes one: projections to 4 query heads and 2
/// key/value heads of 4, a window of 5 positions and learned sinks, attending through
/// [`fused_attention`].
#[derive(Module, Debug)]
struct SlidingAttention {
    query: Linear,
    key: Linear,
    value: Linear,
    output: Linear,
    sinks: Param<Tensor<1>>,
}

impl SlidingAttention {
    fn new(device: &Device) -> Self {
        let sinks = TensorData::new(values(40, 4), [4]);
        Self {
            query: linear(41, 8, 16, device),
            key: linear(43, 8, 8, device),
            value: linear(45, 8, 8, device),
            output: linear(47, 16, 8, device),
            sinks: Param::from_tensor(Tensor::from_data(sinks, device)),
        }
    }

    fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let [batch, positions, _] = x.dims();
        let heads =
            |t: Tensor<3>, count: usize| t.reshape([batch, positions, count, 4]).swap_dims(1, 2);
        let options = FusedAttentionOptions {
            sliding_window: Some(5),
            ..FusedAttentionOptions::causal()
        };
        let attended = fused_attention(
            heads(self.query.forward(x.clone()), 4),
            heads(self.key.forward(x.clone()), 2),
            heads(self.value.forward(x), 2),
            Some(self.sinks.val()),
            &options,
        );
        let joined = attended.swap_dims(1, 2).reshape([batch, positions, 16]);
        self.output.forward(joined)
    }
}

/// The loss of each of `steps` Adam steps of [`SlidingAttention`] on `device`.
fn attention_losses(device: Device, steps: usize) -> Vec<f32> {
    let device = device.autodiff();
    let model = SlidingAttention::new(&device);
    let data = |seed, count| TensorData::new(values(seed, count), [2, 12, 8]);
    let inputs = Tensor::<3>::from_data(data(50, 2 * 12 * 8), &device);
    let targets = Tensor::<3>::from_data(data(51, 2 * 12 * 8), &device);
    adam_losses(
        model,
        SlidingAttention::forward,
        (inputs, targets),
        3e-2,
        steps,
    )
}

/// A Burn model that calls the fused attention trains on `host` and `xla` with the losses of
/// the materialised form on Flex, its sinks included.
#[test]
fn a_burn_model_trains_through_the_fused_attention_with_flexs_losses() {
    test_support::plugin::plugin_path();
    let reference = attention_losses(Device::flex(), 6);
    assert!(reference[5] < reference[0], "{reference:?}");
    for (spec, tolerance) in [("host:1", 1e-5), ("xla:1", 1e-4)] {
        let device = burn_trainium::device(spec).expect("the device is served");
        let losses = attention_losses(device, 6);
        for (step, (expected, actual)) in reference.iter().zip(&losses).enumerate() {
            assert!(
                (expected - actual).abs() <= tolerance * expected.abs().max(1.0),
                "{spec}, step {step}: {losses:?} against Flex's {reference:?}"
            );
        }
    }
}

/// The forward and backward operations of `case` over `batch` rows of `dtype`, by hand.
pub(super) fn attention_operations(case: &Case, batch: usize, dtype: DType) -> [OperationIr; 2] {
    let mut next = 0;
    let mut fresh = |shape: &[usize], status| {
        next += 1;
        TensorIr {
            dtype,
            ..tensor(next, shape, status)
        }
    };
    let Case {
        heads,
        kv_heads,
        queries,
        keys,
        depth,
        ..
    } = *case;
    let query = fresh(&[batch, heads, queries, depth], TensorStatus::ReadOnly);
    let key = fresh(&[batch, kv_heads, keys, depth], TensorStatus::ReadOnly);
    let value = fresh(&[batch, kv_heads, keys, depth], TensorStatus::ReadOnly);
    let sink = fresh(&[heads], TensorStatus::ReadOnly);
    let output = fresh(&[batch, heads, queries, depth], TensorStatus::NotInit);
    let statistics = TensorIr {
        dtype: DType::F32,
        ..fresh(&[batch, heads, queries], TensorStatus::NotInit)
    };
    let output_grad = fresh(&[batch, heads, queries, depth], TensorStatus::ReadOnly);
    let grads: Vec<TensorIr> = [&query, &key, &value, &sink]
        .map(|like| fresh(&like.shape.to_vec(), TensorStatus::NotInit))
        .into_iter()
        .take(if case.sinks { 4 } else { 3 })
        .collect();
    let read = |tensor: &TensorIr| TensorIr {
        status: TensorStatus::ReadOnly,
        ..tensor.clone()
    };
    let mut inputs = vec![query.clone(), key.clone(), value.clone()];
    inputs.extend(case.sinks.then(|| sink.clone()));
    let forward = CustomOpIr {
        id: FORWARD.to_string(),
        inputs: inputs.clone(),
        outputs: vec![output.clone(), statistics.clone()],
        scalars: case.options.to_scalars(),
    };
    let mut backward_inputs = inputs;
    backward_inputs.extend([read(&output), read(&statistics), output_grad]);
    let backward = CustomOpIr {
        id: BACKWARD.to_string(),
        inputs: backward_inputs,
        outputs: grads,
        scalars: case.options.to_scalars(),
    };
    [OperationIr::Custom(forward), OperationIr::Custom(backward)]
}

/// Over 1,100 positions the lowered forward and backward passes hold no `[positions ×
/// positions]` scores: no instruction is larger than one block's, and the Neuron lint accepts
/// the module.
#[test]
fn the_lowered_attention_holds_one_block_of_scores() {
    let positions = 1100;
    for sinks in [false, true] {
        let case = Case {
            depth: 8,
            sinks,
            options: FusedAttentionOptions {
                sliding_window: Some(300),
                softcap: Some(5.0),
                ..FusedAttentionOptions::causal()
            },
            ..Case::causal("long", 4, 2, positions)
        };
        let operations = attention_operations(&case, 1, DType::F32);
        let program =
            lower_segment(&operations, &boundary_of(&operations)).expect("the attention lowers");
        let largest = program
            .module
            .computations
            .iter()
            .flat_map(|computation| &computation.instructions)
            .filter_map(|instruction| instruction.shape.as_ref())
            .map(|shape| shape.dimensions.iter().product::<i64>())
            .max()
            .unwrap();
        // One block: 2 key/value heads × 2 query heads each × 512 rows × every key.
        let block = (2 * 2 * QUERY_BLOCK * positions) as i64;
        assert!(largest <= block, "{largest} elements in one instruction");
        assert!(largest < (4 * positions * positions) as i64);
        assert_eq!(lint_module(&program.module), [], "sinks: {sinks}");
    }
}
