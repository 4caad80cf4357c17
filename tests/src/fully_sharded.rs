//! Fully sharded data parallelism through the pretraining job (`hlat pretrain --dp N --fsdp`):
//! every replica keeps a slice of each parameter, and the runs equal one device's step by step,
//! alone and with tensor parallelism and activation checkpointing, and across checkpoints.

use burn::module::Module;
use burn_trainium::{ExecutorKind, TrainiumDevice};
use hlat::HlatConfig;
use hlat::fully_sharded::FullySharded;
use hlat_train::language_model::{LanguageModel, LmBatch};
use hlat_train::parallel::{ActivationCheckpointing, DeviceMemory, ParallelLayout, split_rows};

use crate::parallel_training::{
    HeldBytes, Layout, ONE_DEVICE, ROWS_OF_EIGHT, assert_layouts_run_as_one_device,
    assert_resumes_as_one_device, exchanged_in_the_programs, one_step, token_rows,
};
use crate::support::trainium;

/// Data parallel 2 and 4, data parallel 2 × tensor parallel 2 with sequence parallelism, and data
/// parallel 2 with full and with selective activation checkpointing (the layers gathered again
/// for their recomputation), all fully sharded, each against one device within 1e-4 over 10
/// steps on `host` and `xla` (collectives compiled into the programs).
#[test]
fn fully_sharded_layouts_pretrain_as_one_device_on_host_and_xla() {
    let _random = crate::support::exclusive_random();
    let sharded = Layout {
        data: 2,
        fsdp: true,
        ..ONE_DEVICE
    };
    let layouts = [
        sharded,
        Layout { data: 4, ..sharded },
        Layout {
            tensor: 2,
            sequence_parallel: true,
            ..sharded
        },
        Layout {
            checkpointing: ActivationCheckpointing::Full,
            ..sharded
        },
        Layout {
            tensor: 2,
            checkpointing: ActivationCheckpointing::Selective,
            ..sharded
        },
    ];
    assert_layouts_run_as_one_device(&layouts, None, |_, device, before| {
        exchanged_in_the_programs(device, before)
    });
}

/// A fully sharded run checkpoints the whole model and resumes in any layout, and any layout's
/// checkpoint resumes fully sharded: fsdp pairs resumed on one device, one device resumed as
/// fsdp quads, ZeRO-1 pairs as fsdp pairs with tensor parallelism, and fsdp pairs as tensor
/// pairs, each continuing as one device would (the AdamW moments joined and split too).
#[test]
fn checkpoints_resume_across_fully_sharded_layouts() {
    let _random = crate::support::exclusive_random();
    let single = TrainiumDevice::new(ExecutorKind::Host, 0);
    let pairs = TrainiumDevice::replicated(ExecutorKind::Host, 2);
    let quads = TrainiumDevice::replicated(ExecutorKind::Host, 4);
    let sharded_pairs = Layout {
        data: 2,
        fsdp: true,
        ..ONE_DEVICE
    };
    let sharded_quads = Layout {
        data: 4,
        ..sharded_pairs
    };
    let zero_pairs = Layout {
        data: 2,
        zero1: true,
        ..ONE_DEVICE
    };
    let sharded_tensor_quads = Layout {
        tensor: 2,
        ..sharded_pairs
    };
    let tensor_pairs = Layout {
        tensor: 2,
        ..ONE_DEVICE
    };
    let orders = [
        ((&pairs, sharded_pairs), (&single, ONE_DEVICE)),
        ((&single, ONE_DEVICE), (&quads, sharded_quads)),
        ((&pairs, zero_pairs), (&quads, sharded_tensor_quads)),
        ((&pairs, sharded_pairs), (&pairs, tensor_pairs)),
    ];
    assert_resumes_as_one_device(&orders, None, |_, _| {});
}

/// Under `--dp N --fsdp` a replica holds `1/N` of every parameter (its slice, padded) and of
/// its AdamW moments after a step, as `hlat info` counts them: half with 2 replicas, a quarter
/// with 4.
#[test]
fn a_fully_sharded_replica_holds_a_slice_of_every_parameter() {
    let _random = crate::support::exclusive_random();
    let config = HlatConfig::preset("hlat-test").unwrap();
    let tensors = hlat::hf::tensor_specs(&config).count() as u64;
    let rows = token_rows(4, 9, 64);
    for replicas in [2, 4] {
        let device = trainium(TrainiumDevice::replicated(
            ExecutorKind::Host,
            replicas as u16,
        ))
        .autodiff();
        let layout = ParallelLayout {
            data: replicas,
            fsdp: true,
            ..ParallelLayout::SINGLE
        };
        let whole = LanguageModel::new(config.init(&device), None);
        let whole_bytes = whole.num_params() as u64 * 4;
        let (hlat, sharded) = FullySharded::shard(whole.hlat, layout.data_groups());
        let model = LanguageModel {
            hlat,
            fully_sharded: Some(sharded),
            ..whole
        };
        let batch = LmBatch::from_replica_rows(&split_rows(&rows, replicas), &device);
        let (trained, record) = one_step(model, layout, batch);
        let held = HeldBytes::of(&trained, record);
        let estimate = DeviceMemory::estimate(&config, &layout, &ROWS_OF_EIGHT);
        assert_eq!(held.parameter_bytes, estimate.parameter_bytes);
        assert_eq!(held.optimizer_bytes, estimate.optimizer_bytes);
        assert_eq!(estimate.optimizer_bytes, 2 * estimate.parameter_bytes);
        // `1/N` of the whole model, and less than one element of padding per tensor.
        let share = whole_bytes / replicas as u64;
        assert!(
            (share..share + 4 * tensors).contains(&held.parameter_bytes),
            "a replica of {replicas} holds {} bytes of a {whole_bytes}-byte model",
            held.parameter_bytes
        );
    }
}
