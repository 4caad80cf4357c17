//! Parallel training through the pretraining job (`hlat pretrain --dp N`): the same global batch
//! on one device and on the replicas of a device, the same losses step by step.

use burn::backend::Autodiff;
use burn_trainium::{ExecutorKind, Trainium, TrainiumDevice, stats};
use hlat_train::config::TrainConfig;
use hlat_train::pretrain::{DataChoice, DeviceInfo, PretrainOptions, PretrainSummary, pretrain};

use crate::support::xla;

type B = Autodiff<Trainium>;

const STEPS: u64 = 6;

/// A short run of `hlat-test` on the built-in corpus with `data_parallel` replicas.
fn run(device: &TrainiumDevice, data_parallel: usize) -> PretrainSummary {
    let out = tempfile::tempdir().unwrap();
    let options = PretrainOptions {
        config: TrainConfig {
            preset: "hlat-test".into(),
            lr: 1e-2,
            warmup_steps: 2,
            max_steps: STEPS,
            seq_len: 16,
            batch_tokens: 16 * 8,
            micro_batch_rows: 8 / (2 * data_parallel),
            data_parallel,
            eval_every: 0,
            checkpoint_every: 0,
            progress: false,
            ..TrainConfig::quickstart()
        },
        out: out.path().to_path_buf(),
        data: DataChoice::Builtin,
        init_from: None,
    };
    let compiles = || stats(device).compiles;
    pretrain::<B>(
        &options,
        device,
        DeviceInfo {
            compiles: Some(&compiles),
        },
    )
    .unwrap()
}

fn assert_same_losses(expected: &PretrainSummary, actual: &PretrainSummary, what: &str) {
    assert_eq!(actual.losses.len(), STEPS as usize, "{what}");
    for (step, (e, a)) in expected.losses.iter().zip(&actual.losses).enumerate() {
        assert!(
            (e - a).abs() <= 1e-5 * e.abs(),
            "{what}, step {}: loss {a}, one device {e}",
            step + 1
        );
    }
}

#[test]
fn data_parallel_pretraining_equals_one_device_on_host_and_xla() {
    let _random = crate::support::exclusive_random();
    for (executor, replicas) in [(ExecutorKind::Host, 2), (ExecutorKind::Xla, 4)] {
        if executor == ExecutorKind::Xla {
            xla();
        }
        let single = TrainiumDevice::new(executor, 0);
        let replicated = TrainiumDevice::replicated(executor, replicas as u16);
        let expected = run(&single, 1);
        let actual = run(&replicated, replicas);
        assert_same_losses(
            &expected,
            &actual,
            &format!("dp {replicas} on {replicated}"),
        );
        if executor == ExecutorKind::Xla {
            let after = stats(&replicated);
            assert!(after.collectives > 0, "{after:?}");
            assert_eq!(after.host_fallbacks, 0, "{after:?}");
        }
    }
}
