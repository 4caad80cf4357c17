//! LoRA training through the pretraining job: the adapters of a frozen base under data and
//! tensor parallelism train as on one device, and the base weights come out bit-identical.

use std::path::Path;

use burn_trainium::{ExecutorKind, TrainiumDevice};
use hlat::HlatConfig;
use hlat::recompute::ActivationCheckpointing;

use crate::parallel_training::{Layout, ONE_DEVICE, STEPS, assert_same_run, run_until};
use crate::support::xla;

/// `hlat-test` over the built-in corpus's 512 tokens, saved as a native checkpoint in `dir`.
fn start_model(dir: &Path) {
    let config = HlatConfig {
        vocab_size: 512,
        ..HlatConfig::preset("hlat-test").unwrap()
    };
    let device = crate::support::reference();
    device.seed(11);
    let model = config.init(&device);
    hlat::checkpoint::save_native(&model, &config, dir).unwrap();
}

/// Every parameter of the model in `dir` (a native checkpoint), as its bytes in visiting order.
fn weights(dir: &Path) -> Vec<Vec<u8>> {
    let (_, model, _) = hlat::checkpoint::load_any(dir, &crate::support::reference()).unwrap();
    test_support::module::parameters(&model)
        .into_iter()
        .map(|data| data.as_bytes().to_vec())
        .collect()
}

/// LoRA of rank 4 on every projection of a frozen `hlat-test`, on one device, data parallel 2
/// (with and without ZeRO-1, fully sharded with and without full activation checkpointing),
/// tensor parallel 2 (with sequence parallelism) and with full activation checkpointing, 10
/// steps on
/// `host` and `xla`: the losses and gradient norms equal one device's within 1e-4, and every
/// checkpoint's base weights equal the start's bit for bit.
#[test]
fn lora_under_data_and_tensor_parallelism_equals_one_device() {
    let _random = crate::support::exclusive_random();
    let start = tempfile::tempdir().unwrap();
    start_model(start.path());
    let base = weights(start.path());
    let adapters = Layout {
        lora: true,
        ..ONE_DEVICE
    };
    let layouts = [
        Layout {
            data: 2,
            ..adapters
        },
        Layout {
            data: 2,
            zero1: true,
            ..adapters
        },
        Layout {
            tensor: 2,
            sequence_parallel: true,
            ..adapters
        },
        // Recomputed stages under frozen weights: the embedding takes no gradient.
        Layout {
            checkpointing: ActivationCheckpointing::Full,
            ..adapters
        },
        // Fully sharded: the frozen base in slices too, gathered for each pass.
        Layout {
            data: 2,
            fsdp: true,
            ..adapters
        },
        Layout {
            data: 2,
            fsdp: true,
            checkpointing: ActivationCheckpointing::Full,
            ..adapters
        },
    ];
    for executor in [ExecutorKind::Host, ExecutorKind::Xla] {
        if executor == ExecutorKind::Xla {
            xla();
        }
        let run = |device: &TrainiumDevice, layout: Layout| {
            let out = tempfile::tempdir().unwrap();
            let summary = run_until(device, layout, out.path(), STEPS, Some(start.path()));
            let checkpoint = summary.checkpoint.clone().expect("a checkpoint at the end");
            assert_eq!(
                weights(&checkpoint.join("model")),
                base,
                "{layout:?}: the base weights changed"
            );
            summary
        };
        let expected = run(&TrainiumDevice::new(executor, 0), adapters);
        // The adapters do train: the frozen base alone would keep the loss where it starts.
        assert!(
            expected.losses[STEPS as usize - 1] < expected.losses[0] - 0.05,
            "{:?}",
            expected.losses
        );
        for layout in layouts {
            let device = TrainiumDevice::replicated(executor, layout.replicas());
            let actual = run(&device, layout);
            assert_same_run(&expected, &actual, 1e-4, &format!("{layout:?} on {device}"));
        }
    }
}
