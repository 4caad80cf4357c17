//! Pipeline parallelism through the pretraining job (`hlat pretrain --pp N`): a 4-layer model on
//! one device and cut into stages, alone and with the other layouts, the same losses and
//! gradient norms step by step, on `host` and on `xla`.

use std::path::Path;

use burn_trainium::{ExecutorKind, TrainiumDevice};
use hlat::HlatConfig;
use hlat_train::parallel::ActivationCheckpointing;

use hlat::checkpoint::files::{PIPELINE_PARALLEL_FILE, stage_file};
use hlat::checkpoint::sharded::StageLayout;

use crate::parallel_training::{
    Layout, ONE_DEVICE, assert_layouts_run_as_one_device, assert_resumes_as_one_device,
    exchanged_in_the_programs,
};
use crate::support::trainium;

/// `hlat-test` with 4 layers, saved as a native checkpoint in `dir` (the runs start from it),
/// over the 512 tokens of the built-in corpus's tokenizer.
fn four_layers(dir: &Path) {
    let config = HlatConfig {
        num_layers: 4,
        vocab_size: 512,
        ..HlatConfig::preset("hlat-test").unwrap()
    };
    let device = crate::support::reference();
    device.seed(7);
    let model = config.init(&device);
    hlat::checkpoint::save_native(&model, &config, dir).unwrap();
}

/// Two stages alone, with tensor parallelism, with data parallelism and ZeRO-1, with full
/// activation checkpointing, with two chunks per stage (interleaved), with tensor and sequence
/// parallelism and selective checkpointing, and fully sharded (with and without full
/// checkpointing), each against one device over 10 steps (relative 1e-4).
#[test]
fn pipelined_pretraining_equals_one_device_on_host_and_xla() {
    let _random = crate::support::exclusive_random();
    let start = tempfile::tempdir().unwrap();
    four_layers(start.path());
    let two_stages = Layout {
        pipeline: 2,
        ..ONE_DEVICE
    };
    let layouts = [
        two_stages,
        Layout {
            tensor: 2,
            ..two_stages
        },
        Layout {
            data: 2,
            zero1: true,
            ..two_stages
        },
        Layout {
            checkpointing: ActivationCheckpointing::Full,
            ..two_stages
        },
        Layout {
            virtual_stages: 2,
            ..two_stages
        },
        Layout {
            tensor: 2,
            sequence_parallel: true,
            checkpointing: ActivationCheckpointing::Selective,
            ..two_stages
        },
        // Fully sharded stages: each layer gathered for its forward pass and again for its
        // backward pass, and with its recomputation.
        Layout {
            data: 2,
            fsdp: true,
            ..two_stages
        },
        Layout {
            data: 2,
            fsdp: true,
            checkpointing: ActivationCheckpointing::Full,
            ..two_stages
        },
    ];
    // Stages pass activations inside the programs, nothing through the host.
    assert_layouts_run_as_one_device(&layouts, Some(start.path()), |_, device, before| {
        exchanged_in_the_programs(device, before);
    });
}

/// Checkpoints of pipelined runs hold one model file per stage × tensor rank, read from the
/// stage's replica (`pipeline_parallel.json` lists each stage's layers; the files name layers as
/// the whole model does), and the optimizer state (the AdamW moments of each stage's layers under
/// the layers' own positions): pp 2 resumed on one device, pp 2 × tp 2 resumed as dp 2, dp 2
/// with ZeRO-1 resumed as an interleaved pp 2, and fully sharded pp 2 × dp 2 resumed as fully
/// sharded dp 2 continue as one device would.
#[test]
fn pipelined_checkpoints_resume_under_any_layout() {
    let _random = crate::support::exclusive_random();
    let start = tempfile::tempdir().unwrap();
    four_layers(start.path());
    let single = TrainiumDevice::new(ExecutorKind::Host, 0);
    let pairs = TrainiumDevice::replicated(ExecutorKind::Host, 2);
    let quads = TrainiumDevice::replicated(ExecutorKind::Host, 4);
    let two_stages = Layout {
        pipeline: 2,
        ..ONE_DEVICE
    };
    let orders = [
        ((&pairs, two_stages), (&single, ONE_DEVICE)),
        (
            (
                &quads,
                Layout {
                    tensor: 2,
                    ..two_stages
                },
            ),
            (
                &pairs,
                Layout {
                    data: 2,
                    ..ONE_DEVICE
                },
            ),
        ),
        (
            (
                &pairs,
                Layout {
                    data: 2,
                    zero1: true,
                    ..ONE_DEVICE
                },
            ),
            (
                &pairs,
                Layout {
                    virtual_stages: 2,
                    ..two_stages
                },
            ),
        ),
        // Fully sharded stages resumed fully sharded without stages.
        (
            (
                &quads,
                Layout {
                    data: 2,
                    fsdp: true,
                    ..two_stages
                },
            ),
            (
                &pairs,
                Layout {
                    data: 2,
                    fsdp: true,
                    ..ONE_DEVICE
                },
            ),
        ),
    ];
    assert_resumes_as_one_device(&orders, Some(start.path()), |first, model_dir| {
        if first.pipeline == 1 {
            return;
        }
        // One file per stage × tensor rank, read from the stage's replica; the layout lists
        // each stage's layers under the whole model's numbers.
        let text = std::fs::read_to_string(model_dir.join(PIPELINE_PARALLEL_FILE)).unwrap();
        let layout: StageLayout = serde_json::from_str(&text).unwrap();
        assert_eq!(
            layout,
            StageLayout::new(vec![vec![0, 1], vec![2, 3]], first.tensor),
            "{first:?}"
        );
        for stage in 0..2 {
            for rank in 0..first.tensor {
                let file = model_dir.join(stage_file(stage, 2, rank, first.tensor));
                assert!(file.is_file(), "{first:?}: {}", file.display());
            }
        }
    });
}

/// Burn's `TrainStep` on a pipelined model (what a user's own `Learner` calls) runs the batch
/// through the stages: the loss, the shared embedding's gradient (summed over the stages) and a
/// layer's gradient on its stage equal one device's.
#[test]
fn train_step_on_stages_equals_one_device() {
    use burn::module::Module;
    use burn::train::TrainStep;

    let _random = crate::support::exclusive_random();
    use burn_trainium::collective::into_replicas;
    use hlat_train::language_model::{LanguageModel, LmBatch};
    use hlat_train::parallel::ParallelLayout;

    let config = HlatConfig {
        num_layers: 4,
        ..HlatConfig::preset("hlat-test").unwrap()
    };
    let single = trainium(TrainiumDevice::new(ExecutorKind::Host, 0)).autodiff();
    let pair = trainium(TrainiumDevice::replicated(ExecutorKind::Host, 2)).autodiff();
    let record = config.init(&single).into_record();
    let whole: hlat::Hlat = config.init(&single).load_record(record);
    let layout = ParallelLayout {
        pipeline: 2,
        ..ParallelLayout::SINGLE
    };
    let pipeline = layout.pipeline_parallel(4, None, 1).unwrap().unwrap();
    let staged: hlat::Hlat = config.init(&pair).load_record(whole.clone().into_record());
    let staged = LanguageModel {
        pipeline: Some(pipeline.clone()),
        ..LanguageModel::new(staged.into_stages(&pipeline).unwrap(), None)
    };
    let whole = LanguageModel::new(whole, None);
    let rows: Vec<Vec<u32>> = (0..4u32)
        .map(|row| (0..9).map(|i| (row * 7 + i * 3) % 64).collect())
        .collect();
    let expected = whole.step(LmBatch::from_rows(&rows, &single));
    let actual = staged.step(LmBatch::for_layout(&rows, &layout, &pair));
    let loss = |tensor: burn::tensor::Tensor<1>| -> Vec<f32> {
        into_replicas(tensor)
            .unwrap()
            .iter()
            .map(|data| data.try_to_vec::<f32>().unwrap()[0])
            .collect()
    };
    let expected_loss = loss(expected.item.loss)[0];
    for found in loss(actual.item.loss) {
        assert!((found - expected_loss).abs() <= 1e-5 * expected_loss.abs());
    }
    let gradient = |model: &LanguageModel, grads: &burn::optim::GradientsParams, slot: usize| {
        let embedding = grads.get::<2>(model.hlat.embed_tokens.weight.id).unwrap();
        let layer = grads
            .get::<2>(
                model.hlat.layers[slot]
                    .dense_mlp()
                    .unwrap()
                    .down_proj
                    .weight
                    .id,
            )
            .unwrap();
        (
            into_replicas(embedding).unwrap(),
            into_replicas(layer).unwrap(),
        )
    };
    let (expected_embedding, expected_layer) = gradient(&whole, &expected.grads, 2);
    let (embedding, layer) = gradient(&staged, &actual.grads, 0);
    for replica in &embedding {
        replica.assert_approx_eq::<f32>(
            &expected_embedding[0],
            burn::tensor::Tolerance::rel_abs(1e-4, 1e-6),
        );
    }
    // Slot 0 of stage 1 is layer 2.
    layer[1].assert_approx_eq::<f32>(
        &expected_layer[0],
        burn::tensor::Tolerance::rel_abs(1e-4, 1e-6),
    );
}
