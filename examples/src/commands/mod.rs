//! One file per `hlat` subcommand.

pub mod adapter_arg;
pub mod align;
pub mod bench;
pub mod cache;
pub mod compile;
pub mod convert;
pub mod data;
pub mod eval;
pub mod finetune;
pub mod generate;
pub mod info;
pub mod merge;
pub mod output_folder;
pub mod pipeline_args;
pub mod plot;
pub mod pretrain;
pub mod profile;
pub mod ranges;
pub mod serve;
pub mod train_args;
pub mod tuning_args;
pub mod validation_plot;

use anyhow::Context;
use burn::tensor::Device;
use burn_trainium::{DEVICE_ENV, TrainiumDevice};

/// The Trainium device `TRAINIUM_DEVICE` names, its executor opened once (an invalid name, a
/// missing plugin or runtime, or an index the executor does not have is an error naming the
/// device and what to do, before any work), and the Burn device that serves it in this process.
/// The Trainium device is what its statistics are kept under (`burn_trainium::stats`).
pub fn device_from_env() -> anyhow::Result<(TrainiumDevice, Device)> {
    let trainium = TrainiumDevice::from_env()?;
    burn_trainium::check_device(&trainium).with_context(|| format!("{DEVICE_ENV}={trainium}"))?;
    let device = served(&trainium).with_context(|| format!("{DEVICE_ENV}={trainium}"))?;
    Ok((trainium, device))
}

/// The Burn device that serves `trainium` in this process (`burn_trainium::device`): its
/// executor opens, and a loopback server only this process can reach starts, on first use.
pub fn served(trainium: &TrainiumDevice) -> anyhow::Result<Device> {
    burn_trainium::device(&trainium.to_string()).with_context(|| format!("device {trainium}"))
}

/// `seconds` per item of `count`, in microseconds (0 when there are none): the capture and
/// prepare costs the device statistics report per operation and per segment.
pub fn micros_per(seconds: f64, count: u64) -> f64 {
    if count == 0 {
        0.0
    } else {
        seconds * 1e6 / count as f64
    }
}
