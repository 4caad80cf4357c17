//! `hlat eval`: validation loss and perplexity of a checkpoint.

use std::path::PathBuf;

use burn::backend::NdArray;
use burn_trainium::Trainium;
use clap::Args;
use hlat_train::config::TrainConfig;
use hlat_train::data_spec::parse_data_spec;
use hlat_train::eval::evaluate_checkpoint;
use hlat_train::pretrain::{DataChoice, RUN_CONFIG_FILE};

use super::pretrain::DeviceChoice;

/// Arguments of `hlat eval`.
#[derive(Args)]
pub struct EvalArgs {
    /// A training run folder, a native checkpoint or a Hugging Face folder.
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    /// Prepared shard folders with mixing weights (`[NAME=]FOLDER[:WEIGHT],...`); their
    /// validation splits are measured [default: the built-in corpus].
    #[arg(long, value_name = "SPEC")]
    data: Option<String>,
    /// Tokens per row [default: the run's, else 128].
    #[arg(long, value_name = "N", value_parser = super::ranges::at_least_one::<usize>())]
    seq_len: Option<usize>,
    /// Validation rows measured.
    #[arg(long, value_name = "N", default_value_t = 32, value_parser = super::ranges::at_least_one::<usize>())]
    rows: usize,
    /// Device: `ndarray`, or a Trainium device such as `host:0`, `xla:0`
    /// [default: TRAINIUM_DEVICE, else host:0].
    #[arg(long)]
    device: Option<String>,
}

/// Runs `hlat eval`.
pub fn run(args: EvalArgs) -> anyhow::Result<()> {
    // A run folder records its configuration, which fixes the validation split and row length.
    let run_config = args.model.join(RUN_CONFIG_FILE);
    let mut config = if run_config.is_file() {
        TrainConfig::load_toml(&run_config, &TrainConfig::default())?
    } else {
        TrainConfig::quickstart()
    };
    if let Some(seq_len) = args.seq_len {
        config.seq_len = seq_len;
    }
    let data = match &args.data {
        Some(spec) => DataChoice::Shards(parse_data_spec(spec)?),
        None => DataChoice::Builtin,
    };
    let report = match DeviceChoice::parse(args.device.as_deref())?.checked()? {
        DeviceChoice::NdArray => evaluate_checkpoint::<NdArray>(
            &args.model,
            &data,
            &config,
            args.rows,
            &Default::default(),
        )?,
        DeviceChoice::Trainium(device) => {
            evaluate_checkpoint::<Trainium>(&args.model, &data, &config, args.rows, &device)?
        }
    };
    println!(
        "rows: {}\ntokens: {}\nvalidation loss: {:.6}\nperplexity: {:.4}",
        report.rows, report.tokens, report.loss, report.perplexity
    );
    Ok(())
}
