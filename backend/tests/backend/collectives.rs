//! Collectives on replicated devices served in the process (`host:0-3` and `xla:0-3`, the latter
//! also under the Neuron compiler's operator rules), against results computed with Flex from the
//! per-replica inputs: every collective with groups `[[0, 1], [2, 3]]`, `[[0, 2], [1, 3]]`
//! and `[[0, 1, 2, 3]]` in f32 and bf16 (permutes: shifts within those groups, forward and
//! cyclic, and pairs that follow no group), and the gradients through them against the
//! closed-form backward rules.
//!
//! Every test holds the replicated device it uses (`lock_device`): one of them counts the
//! device's collectives.

use burn::tensor::{DType, Device, Tensor, TensorData};
use burn_trainium::collective::{self, Collective, ReduceOp, ReplicaGroups, SourceTargetPairs};
use burn_trainium::lower::OperatorRules;
use burn_trainium::{ExecutorKind, TrainiumDevice, set_operator_rules, stats};

use super::support::{assert_close, lock_device, plugin_path};

const REPLICAS: usize = 4;

/// The replicated devices under test, the host reference and the `xla` executor: each served in
/// the process (the Burn device), with the Trainium device it serves (its statistics, settings
/// and lock).
fn devices() -> [(Device, TrainiumDevice); 2] {
    plugin_path();
    [ExecutorKind::Host, ExecutorKind::Xla].map(|executor| {
        let trainium = TrainiumDevice::replicated(executor, REPLICAS as u16);
        let device = burn_trainium::device(&trainium.to_string()).expect("the device is served");
        assert_eq!(collective::replica_count(&device), REPLICAS, "{trainium}");
        (device, trainium)
    })
}

fn group_layouts() -> [ReplicaGroups; 3] {
    [
        ReplicaGroups::contiguous(REPLICAS, 2).unwrap(),
        // [[0, 2], [1, 3]]: the data-parallel groups of dp 2 × tp 2.
        ReplicaGroups::strided(REPLICAS, 2).unwrap(),
        ReplicaGroups::all(REPLICAS),
    ]
}

/// Replica `replica`'s input: multiples of 1/8 in `[-4, 4)` (exact in bf16), distinct per replica.
fn input(replica: usize, seed: usize) -> TensorData {
    let values: Vec<f32> = (0..32)
        .map(|index| (((index * 7 + replica * 13 + seed * 5) % 64) as f32 - 32.0) / 8.0)
        .collect();
    TensorData::new(values, [4, 8])
}

fn reference(data: &TensorData) -> Tensor<2> {
    Tensor::from_data(data.clone(), &Device::flex())
}

/// What replica `replica` must hold after `collective` of `inputs`, computed with Flex.
fn expected(collective: &Collective, inputs: &[TensorData], replica: usize) -> TensorData {
    if let Collective::Permute { pairs } = collective {
        return match pairs.source_of(replica) {
            Some(source) => inputs[source].clone(),
            None => reference(&inputs[replica]).zeros_like().into_data(),
        };
    }
    let Some(groups) = collective.groups() else {
        return inputs[replica].clone();
    };
    let (group, rank) = groups.locate(replica).unwrap();
    let members: Vec<Tensor<2>> = group.iter().map(|&m| reference(&inputs[m])).collect();
    let sum = || {
        members
            .iter()
            .cloned()
            .reduce(|total, member| total + member)
            .unwrap()
    };
    let chunk = |tensor: Tensor<2>, dim: usize| {
        let size = tensor.dims()[dim] / group.len();
        tensor.narrow(dim, rank * size, size)
    };
    let result = match collective {
        Collective::AllReduce { op, .. } => match op {
            ReduceOp::Sum => sum(),
            ReduceOp::Mean => sum() / group.len() as f64,
            ReduceOp::Max => members
                .iter()
                .cloned()
                .reduce(|maximum, member| maximum.max_pair(member))
                .unwrap(),
        },
        Collective::AllGather { dim, .. } => Tensor::cat(members.clone(), *dim),
        Collective::ReduceScatter { dim, .. } => chunk(sum(), *dim),
        Collective::Split { dim, .. } => chunk(members[rank].clone(), *dim),
        Collective::AllToAll { dim, .. } => Tensor::cat(
            members
                .iter()
                .map(|member| chunk(member.clone(), *dim))
                .collect(),
            *dim,
        ),
        Collective::Permute { .. } | Collective::Barrier => {
            unreachable!("the permute and the barrier have no groups")
        }
    };
    result.into_data()
}

fn collectives_over(groups: &ReplicaGroups) -> Vec<Collective> {
    let mut all: Vec<Collective> = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max]
        .into_iter()
        .map(|op| Collective::AllReduce {
            op,
            groups: groups.clone(),
        })
        .collect();
    for dim in [0, 1] {
        let groups = groups.clone();
        all.push(Collective::AllGather {
            dim,
            groups: groups.clone(),
        });
        all.push(Collective::ReduceScatter {
            dim,
            groups: groups.clone(),
        });
        all.push(Collective::AllToAll {
            dim,
            groups: groups.clone(),
        });
        all.push(Collective::Split { dim, groups });
    }
    // Within each group: forward (the first members get zeros) and backward around the group.
    for (offset, cyclic) in [(1, false), (-1, true)] {
        all.push(Collective::Permute {
            pairs: SourceTargetPairs::shift(groups, offset, cyclic),
        });
    }
    all
}

/// Runs `collective` on `device` with `inputs` cast to `dtype`; returns every replica's result.
fn run(
    device: &Device,
    collective: &Collective,
    inputs: &[TensorData],
    dtype: DType,
) -> Vec<TensorData> {
    let x: Tensor<2> = collective::from_replicas(inputs.to_vec(), device);
    let x = x.cast(dtype);
    let y = match collective {
        Collective::AllReduce { op, groups } => collective::all_reduce(x, *op, groups),
        Collective::AllGather { dim, groups } => collective::all_gather(x, *dim, groups),
        Collective::ReduceScatter { dim, groups } => collective::reduce_scatter(x, *dim, groups),
        Collective::Split { dim, groups } => collective::split(x, *dim, groups),
        Collective::AllToAll { dim, groups } => collective::all_to_all(x, *dim, groups),
        Collective::Permute { pairs } => collective::permute(x, pairs),
        Collective::Barrier => collective::optimization_barrier(vec![x]).remove(0),
    };
    collective::into_replicas(y).unwrap()
}

/// Runs `collective` on `device` in f32 and in bf16 and compares every replica's result with
/// [`expected`].
fn assert_runs_as_expected(
    (device, trainium): &(Device, TrainiumDevice),
    collective: &Collective,
    inputs: &[TensorData],
) {
    for (dtype, tolerance) in [(DType::F32, 1e-6), (DType::BF16, 1e-2)] {
        let results = run(device, collective, inputs, dtype);
        assert_eq!(results.len(), REPLICAS);
        for (replica, result) in results.iter().enumerate() {
            assert_eq!(result.dtype(), dtype, "{collective} on {trainium}");
            let expected = expected(collective, inputs, replica)
                .convert_dtype(dtype)
                .convert::<f32>();
            assert_close(
                &format!("{collective} {dtype:?} on {trainium}, replica {replica}"),
                &expected,
                &result.clone().convert::<f32>(),
                tolerance,
            );
        }
    }
}

/// On `host`, on `xla`, and on `xla` lowered under the Neuron compiler's rules (the split
/// reading the replica's index from a parameter instead of `replica-id`).
#[test]
fn every_collective_equals_the_result_computed_from_the_replicas_inputs() {
    let inputs: Vec<TensorData> = (0..REPLICAS).map(|replica| input(replica, 1)).collect();
    let [host, xla] = devices();
    for (served, rules) in [
        (host, None),
        (xla.clone(), Some(OperatorRules::Xla)),
        (xla, Some(OperatorRules::Neuron)),
    ] {
        let device = served.1;
        let _exclusive = lock_device(&device);
        if let Some(rules) = rules {
            set_operator_rules(&device, rules);
        }
        let before = stats(&device);
        let mut communicating = 0;
        for groups in group_layouts() {
            for collective in collectives_over(&groups) {
                communicating += u64::from(collective.communicates());
                assert_runs_as_expected(&served, &collective, &inputs);
            }
        }
        let after = stats(&device);
        assert_eq!(after.host_fallbacks, before.host_fallbacks, "{device}");
        if device.executor == ExecutorKind::Xla {
            assert_eq!(
                after.collectives - before.collectives,
                2 * communicating,
                "one collective per run and dtype on {device}: {after:?}"
            );
        }
        if rules.is_some() {
            set_operator_rules(&device, OperatorRules::Xla);
        }
    }
}

/// Pairs that follow no group: a replica sending to itself, one receiving from a replica that
/// receives nothing (zeros), and none at all (zeros everywhere).
#[test]
fn permutes_with_any_pairs_deliver_each_source_to_its_target() {
    let inputs: Vec<TensorData> = (0..REPLICAS).map(|replica| input(replica, 4)).collect();
    for served in devices() {
        let _exclusive = lock_device(&served.1);
        for pairs in ["3>0,0>2,2>3,1>1", "2>0,0>1", ""] {
            let pairs = SourceTargetPairs::parse(pairs).unwrap();
            assert_runs_as_expected(&served, &Collective::Permute { pairs }, &inputs);
        }
    }
}

#[test]
fn the_barrier_returns_its_inputs_unchanged() {
    let inputs: Vec<TensorData> = (0..REPLICAS).map(|replica| input(replica, 2)).collect();
    for (device, trainium) in devices() {
        let _exclusive = lock_device(&trainium);
        let results = run(&device, &Collective::Barrier, &inputs, DType::F32);
        assert_eq!(results, inputs, "{trainium}");
    }
}

/// The gradient each replica gets for its input of `apply` when the loss is the sum over replicas
/// of `sum(apply(x_r) * weight_r)`.
fn gradients(
    device: &Device,
    inputs: &[TensorData],
    weights: &[TensorData],
    apply: impl FnOnce(Tensor<2>) -> Tensor<2>,
) -> Vec<TensorData> {
    let device = device.clone().autodiff();
    let x: Tensor<2> = collective::from_replicas(inputs.to_vec(), &device);
    let x = x.require_grad();
    let weight: Tensor<2> = collective::from_replicas(weights.to_vec(), &device);
    let loss = (apply(x.clone()) * weight).sum();
    let grads = loss.backward();
    collective::into_replicas(x.grad(&grads).unwrap()).unwrap()
}

#[test]
fn gradients_follow_the_backward_rules_of_tensor_parallelism() {
    let groups = ReplicaGroups::contiguous(REPLICAS, 2).unwrap();
    let inputs: Vec<TensorData> = (0..REPLICAS).map(|replica| input(replica, 3)).collect();
    // The weights have the shape of each collective's output.
    let weights_like = |rows: usize, columns: usize| -> Vec<TensorData> {
        (0..REPLICAS)
            .map(|replica| {
                let values: Vec<f32> = (0..rows * columns)
                    .map(|index| ((index * 5 + replica * 3) % 11) as f32 / 4.0 - 1.0)
                    .collect();
                TensorData::new(values, [rows, columns])
            })
            .collect()
    };
    let same_shape = weights_like(4, 8);
    let gathered = weights_like(8, 8);
    let scattered = weights_like(2, 8);
    // Sum over the group of replica `replica`.
    let group_sum = |weights: &[TensorData], replica: usize| {
        let (group, _) = groups.locate(replica).unwrap();
        group
            .iter()
            .map(|&member| reference(&weights[member]))
            .reduce(|total, member| total + member)
            .unwrap()
    };
    for (device, trainium) in devices() {
        let _exclusive = lock_device(&trainium);
        let check =
            |what: &str, actual: Vec<TensorData>, expected: &dyn Fn(usize) -> TensorData| {
                assert_eq!(actual.len(), REPLICAS, "gradient of {what} on {trainium}");
                for (replica, actual) in actual.iter().enumerate() {
                    assert_close(
                        &format!("gradient of {what} on {trainium}, replica {replica}"),
                        &expected(replica),
                        actual,
                        1e-6,
                    );
                }
            };
        // All-reduce: the identity (sum), divided by the group size (mean).
        let sum = gradients(&device, &inputs, &same_shape, |x| {
            collective::all_reduce(x, ReduceOp::Sum, &groups)
        });
        check("all-reduce sum", sum, &|r| same_shape[r].clone());
        let mean = gradients(&device, &inputs, &same_shape, |x| {
            collective::all_reduce(x, ReduceOp::Mean, &groups)
        });
        check("all-reduce mean", mean, &|r| {
            (reference(&same_shape[r]) / 2.0).into_data()
        });
        // All-gather: a reduce-scatter of the gradient (along rows here).
        let gather = gradients(&device, &inputs, &gathered, |x| {
            collective::all_gather(x, 0, &groups)
        });
        check("all-gather", gather, &|r| {
            let (_, rank) = groups.locate(r).unwrap();
            group_sum(&gathered, r).narrow(0, rank * 4, 4).into_data()
        });
        // Reduce-scatter and split: an all-gather of the gradient.
        let all_gathered = |r: usize| {
            let (group, _) = groups.locate(r).unwrap();
            let members = group.iter().map(|&m| reference(&scattered[m])).collect();
            Tensor::cat(members, 0).into_data()
        };
        let scatter = gradients(&device, &inputs, &scattered, |x| {
            collective::reduce_scatter(x, 0, &groups)
        });
        check("reduce-scatter", scatter, &all_gathered);
        let split = gradients(&device, &inputs, &scattered, |x| {
            collective::split(x, 0, &groups)
        });
        check("split", split, &all_gathered);
        // All-to-all: the same exchange of the gradient (along columns here): replica `r` gets
        // its rank's chunk of every member's weight.
        let exchanged = gradients(&device, &inputs, &same_shape, |x| {
            collective::all_to_all(x, 1, &groups)
        });
        check("all-to-all", exchanged, &|r| {
            let (group, rank) = groups.locate(r).unwrap();
            let chunks = group
                .iter()
                .map(|&m| reference(&same_shape[m]).narrow(1, rank * 4, 4))
                .collect();
            Tensor::cat(chunks, 1).into_data()
        });
        // Copy to the group: the identity forward, an all-reduce of the gradient.
        let copy = gradients(&device, &inputs, &same_shape, |x| {
            collective::copy_to_group(x, &groups)
        });
        check("copy to the group", copy, &|r| {
            group_sum(&same_shape, r).into_data()
        });
        // Permute: the permute of the gradient the other way round (the weight of the replica
        // each one sent to; zeros for the last stage, which sends to none).
        for (offset, cyclic) in [(1, false), (-1, true)] {
            let stages = SourceTargetPairs::shift(&ReplicaGroups::all(REPLICAS), offset, cyclic);
            let permuted = gradients(&device, &inputs, &same_shape, |x| {
                collective::permute(x, &stages)
            });
            check(
                &format!("permute {stages}"),
                permuted,
                &|r| match stages.reversed().source_of(r) {
                    Some(target) => same_shape[target].clone(),
                    None => reference(&same_shape[r]).zeros_like().into_data(),
                },
            );
        }
    }
}
