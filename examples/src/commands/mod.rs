//! One file per `hlat` subcommand.

pub mod adapter_arg;
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
pub mod train_args;
pub mod validation_plot;

use anyhow::Context;
use burn_trainium::{DEVICE_ENV, TrainiumDevice};

/// The Trainium device `TRAINIUM_DEVICE` names, its executor opened once: an invalid name, a
/// missing plugin or runtime, or an index the executor does not have is an error naming the
/// device and what to do, before any work.
pub fn device_from_env() -> anyhow::Result<TrainiumDevice> {
    let device = TrainiumDevice::from_env()?;
    burn_trainium::check_device(&device).with_context(|| format!("{DEVICE_ENV}={device}"))?;
    Ok(device)
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
