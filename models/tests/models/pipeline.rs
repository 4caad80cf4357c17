//! Pipeline parallelism against one device: the stages of a model on `host` replicas give the
//! losses and gradients of the whole model, under each schedule.

use burn::module::Module;
use burn::tensor::{Device, Tensor, TensorData};
use burn_trainium::collective::{ReplicaGroups, into_replicas};
use burn_trainium::{ExecutorKind, TrainiumDevice};
use hlat::moe::MoeConfig;
use hlat::parallel::Unsharded;
use hlat::pipeline::{MicroBatch, PipelineParallel};
use hlat::recompute::ActivationCheckpointing;
use hlat::{Hlat, HlatConfig, ModelFamily};

use crate::parallel_support::{assert_close, batch_of, by_path};
use crate::{host, trainium};

/// `hlat-test` with `layers` layers, tied or not.
fn config(layers: usize, tied: bool) -> HlatConfig {
    HlatConfig {
        num_layers: layers,
        tie_word_embeddings: tied,
        ..HlatConfig::preset("hlat-test").unwrap()
    }
}

/// `count` micro-batches of 2 rows of 8 tokens, each its own.
fn micro_batches(device: &Device, count: usize) -> Vec<MicroBatch> {
    (0..count)
        .map(|index| {
            let (inputs, targets) = batch_of(device, 2 + index, 8);
            (inputs.narrow(0, index, 2), targets.narrow(0, index, 2))
        })
        .collect()
}

/// The summed loss and gradients by path of `micro_batches` on the whole model, one device.
fn one_device(model: &Hlat, micro_batches: &[MicroBatch]) -> (f32, Vec<(String, TensorData)>) {
    let mut total = 0.0;
    let mut sums: Vec<(String, TensorData)> = Vec::new();
    for (inputs, targets) in micro_batches {
        let step = model.loss_and_gradients(
            inputs.clone(),
            targets.clone(),
            None,
            &Unsharded,
            ActivationCheckpointing::None,
            None,
        );
        let (loss, grads) = (step.objective, step.gradients);
        total += loss.into_scalar::<f32>();
        for (index, (path, mut replicas)) in by_path(model, &grads, None).into_iter().enumerate() {
            let grad = replicas.remove(0);
            match sums.get_mut(index) {
                Some((_, sum)) => *sum = add(sum, &grad),
                None => sums.push((path, grad)),
            }
        }
    }
    (total, sums)
}

fn add(a: &TensorData, b: &TensorData) -> TensorData {
    let values: Vec<f32> = a
        .try_to_vec::<f32>()
        .unwrap()
        .iter()
        .zip(b.try_to_vec::<f32>().unwrap())
        .map(|(x, y)| x + y)
        .collect();
    TensorData::new(values, a.shape().clone())
}

/// Runs `micro_batches` through `pipeline`'s stages of `model` on `host` replicas and checks the
/// loss and every gradient against one device: a layer's on the replica of its stage, the
/// shared parameters' summed over the stages.
fn check(
    model_config: HlatConfig,
    pipeline: PipelineParallel,
    count: usize,
    checkpointing: ActivationCheckpointing,
) {
    let stages = pipeline.stages();
    let single = host().autodiff();
    let replicated = trainium(TrainiumDevice::replicated(
        ExecutorKind::Host,
        stages as u16,
    ))
    .autodiff();
    // Parameters are drawn when first read: one record serves both models.
    let record = model_config.init(&single).into_record();
    let model: Hlat = model_config.init(&single).load_record(record);
    let (expected_loss, expected) = one_device(&model, &micro_batches(&single, count));

    let whole: Hlat = model_config.init(&replicated);
    let whole = whole.load_record(model.clone().into_record());
    let staged = whole.into_stages(&pipeline).unwrap();
    let step = staged.pipeline_loss_and_gradients(
        &micro_batches(&replicated, count),
        None,
        &Unsharded,
        &pipeline,
        checkpointing,
        None,
    );
    let (loss, grads) = (step.objective, step.gradients);
    for (replica, loss) in into_replicas(loss).unwrap().iter().enumerate() {
        let loss = loss.try_to_vec::<f32>().unwrap()[0];
        assert!(
            (loss - expected_loss).abs() <= 1e-5 * expected_loss.abs(),
            "replica {replica}: loss {loss}, one device {expected_loss}"
        );
    }
    let actual = by_path(&staged, &grads, None);
    let expected_by_path = |path: &str| {
        &expected
            .iter()
            .find(|(name, _)| name == path)
            .unwrap_or_else(|| panic!("no gradient of {path}"))
            .1
    };
    for (path, replicas) in actual {
        let parts: Vec<&str> = path.splitn(3, '.').collect();
        if parts[0] == "layers" {
            let slot: usize = parts[1].parse().unwrap();
            for (stage, grad) in replicas.iter().enumerate() {
                let zeros = TensorData::zeros::<f32, _>(grad.shape().clone());
                let reference = match pipeline.layer_at(stage, slot) {
                    Some(layer) => expected_by_path(&format!("layers.{layer}.{}", parts[2])),
                    None => &zeros,
                };
                assert_close(grad, reference, 1e-4, &format!("{path} on stage {stage}"));
            }
        } else {
            let summed = replicas[1..]
                .iter()
                .fold(replicas[0].clone(), |sum, grad| add(&sum, grad));
            assert_close(
                &summed,
                expected_by_path(&path),
                1e-4,
                &format!("{path}, summed"),
            );
        }
    }
}

fn groups(stages: usize) -> ReplicaGroups {
    ReplicaGroups::all(stages)
}

#[test]
fn one_forward_one_backward_equals_one_device() {
    let pipeline = PipelineParallel::even(groups(2), 4, 1).unwrap();
    check(config(4, false), pipeline, 3, ActivationCheckpointing::None);
}

#[test]
fn uneven_stages_tied_embeddings_and_checkpointing_equal_one_device() {
    let pipeline = PipelineParallel::with_layers(groups(2), vec![1, 3], 4, 1).unwrap();
    check(
        config(4, true),
        pipeline.clone(),
        2,
        ActivationCheckpointing::Full,
    );
    check(
        config(4, false),
        pipeline,
        4,
        ActivationCheckpointing::Selective,
    );
}

#[test]
fn the_interleaved_schedule_equals_one_device() {
    let pipeline = PipelineParallel::even(groups(2), 4, 2).unwrap();
    check(config(4, false), pipeline, 4, ActivationCheckpointing::None);
    let three = PipelineParallel::even(groups(3), 6, 2).unwrap();
    check(config(6, true), three, 5, ActivationCheckpointing::None);
    // Chunks of 2, 1, 1, 1 layers: the second slot of stage 1's chunks and of stage 0's second
    // chunk are padding, and one slot is padding on both stages.
    let uneven = PipelineParallel::even(groups(2), 5, 2).unwrap();
    assert_eq!(uneven.chunk_layers, [2, 1, 1, 1]);
    check(config(5, false), uneven, 3, ActivationCheckpointing::None);
}

/// `hlat-test` with `layers` layers as a Mixtral of 4 experts, 2 per token, with a
/// load-balancing loss (coefficient 0.5), which joins every stage's routers.
fn mixture_config(layers: usize) -> HlatConfig {
    HlatConfig {
        family: ModelFamily::Mixtral,
        moe: Some(MoeConfig::routed(4, 2, 8, 0.5)),
        init_std: 0.5,
        ..config(layers, false)
    }
}

/// A mixture's objective (the cross-entropy and the load-balancing loss across stages) and every
/// gradient, routers included, equal one device's under 1F1B, with checkpointing, and under the
/// interleaved schedule.
#[test]
fn a_mixture_of_experts_pipelines_as_one_device() {
    let pipeline = PipelineParallel::even(groups(2), 4, 1).unwrap();
    check(
        mixture_config(4),
        pipeline.clone(),
        3,
        ActivationCheckpointing::None,
    );
    check(
        mixture_config(4),
        pipeline,
        2,
        ActivationCheckpointing::Full,
    );
    let interleaved = PipelineParallel::even(groups(2), 4, 2).unwrap();
    check(
        mixture_config(4),
        interleaved,
        3,
        ActivationCheckpointing::None,
    );
}

/// Stages that would pad a mixture's slots, or hold a dense layer and a mixture in one slot, are
/// refused by name when the model is cut.
#[test]
fn stages_a_mixture_cannot_take_are_refused() {
    let replicated = trainium(TrainiumDevice::replicated(ExecutorKind::Host, 2));
    let uneven = PipelineParallel::even(groups(2), 3, 1).unwrap();
    let error = mixture_config(3)
        .init(&replicated)
        .into_stages(&uneven)
        .err()
        .unwrap();
    assert!(error.contains("padding"), "{error}");
    let mut mixed = mixture_config(4);
    mixed.family = ModelFamily::Qwen3Moe;
    mixed.qk_norm = true;
    mixed.moe.as_mut().unwrap().dense_layers = vec![0];
    let even = PipelineParallel::even(groups(2), 4, 1).unwrap();
    let error = mixed.init(&replicated).into_stages(&even).err().unwrap();
    assert!(
        error.contains("layer 2") && error.contains("dense"),
        "{error}"
    );
}

#[test]
fn stages_join_back_into_the_model_and_compute_its_loss() {
    let pipeline = PipelineParallel::with_layers(groups(2), vec![3, 2], 5, 1).unwrap();
    let replicated = trainium(TrainiumDevice::replicated(ExecutorKind::Host, 2));
    let record = config(5, false).init(&replicated).into_record();
    let model: Hlat = config(5, false).init(&replicated).load_record(record);
    let staged = model.clone().into_stages(&pipeline).unwrap();
    assert_eq!(staged.layers.len(), 3);
    let (inputs, targets) = batch_of(&replicated, 2, 8);
    let expected: f32 = model
        .loss(inputs.clone(), targets.clone(), None)
        .into_scalar::<f32>();
    let loss = staged.pipeline_loss((inputs, targets), None, &Unsharded, &pipeline);
    for value in into_replicas(loss).unwrap() {
        let value = value.try_to_vec::<f32>().unwrap()[0];
        assert!(
            (value - expected).abs() <= 1e-5 * expected.abs(),
            "{value} vs {expected}"
        );
    }
    let joined = staged.from_stages(&pipeline);
    let original = by_path_values(&model);
    for (path, values) in by_path_values(&joined) {
        let (_, reference) = original.iter().find(|(name, _)| *name == path).unwrap();
        for replica in &values {
            assert_eq!(replica, &reference[0], "{path}: joined differs");
        }
    }
}

/// Every parameter of `model` by path, one value per replica.
fn by_path_values(model: &Hlat) -> Vec<(String, Vec<TensorData>)> {
    use burn::module::{ModuleVisitor, Param};
    use hlat::parallel::ParamPath;
    struct Values(ParamPath, Vec<(String, Vec<TensorData>)>);
    impl ModuleVisitor for Values {
        fn enter_module(&mut self, name: &str, _container_type: &str) {
            self.0.enter(name);
        }
        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.0.exit();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let values = into_replicas(param.val()).unwrap();
            self.1.push((self.0.names().join("."), values));
        }
    }
    let mut values = Values(ParamPath::default(), Vec::new());
    model.visit(&mut values);
    values.1
}
