//! `hlat finetune`: supervised fine-tuning of a model on prompt/completion or conversation
//! records, every weight trained or (with `--lora-rank`) LoRA adapters on frozen weights, on
//! `hlat pretrain`'s machinery (the same device, precision, layout, checkpoint and resume flags).
//! A LoRA run writes its adapter as a PEFT folder into `OUT/adapter` (and into each
//! checkpoint); the base weights stay as they were.

use anyhow::bail;
use clap::Args;
use hlat_train::config::TrainConfig;
use hlat_train::finetune::{SftRows, SftTokenizer};
use hlat_train::pretrain::DataChoice;

use super::pretrain::Job;
use super::tuning_args::TuningArgs;

/// How `hlat finetune` names itself in the run folders it records.
const FINETUNE_COMMAND: &str = "finetune";

/// Arguments of `hlat finetune` (its records are described in its help, `main.rs`).
#[derive(Args)]
pub struct FinetuneArgs {
    /// The model, records, output folder, LoRA and training flags `hlat align` shares.
    #[command(flatten)]
    tuning: TuningArgs,
}

/// The recipe of `hlat finetune` before `--config` and the flags: a short run at a learning rate
/// suited to fine-tuning (higher for adapters), no warmup, no weight decay, f32.
fn defaults(lora: bool) -> TrainConfig {
    TrainConfig {
        lr: if lora { 2e-4 } else { 2e-5 },
        ..tuning_defaults()
    }
}

/// What `hlat finetune` and `hlat align` start from besides the learning rate: a short run, no
/// warmup, no weight decay, eight rows a micro-batch, a checkpoint at the end, no validation.
pub fn tuning_defaults() -> TrainConfig {
    TrainConfig {
        warmup_steps: 0,
        max_steps: 100,
        weight_decay: 0.0,
        micro_batch_rows: 8,
        checkpoint_every: 0,
        keep_checkpoints: 2,
        eval_every: 0,
        ..TrainConfig::quickstart()
    }
}

/// Runs `hlat finetune`.
pub fn run(args: FinetuneArgs) -> anyhow::Result<()> {
    let tuning = &args.tuning;
    let job = Job::from_env()?;
    tuning.check_out(FINETUNE_COMMAND)?;
    let mut config = tuning.config(defaults)?;
    let model = tuning.starting_model("fine-tuning")?;
    let eos_id = model.tokenizer.eos_id()?;
    let examples = SftTokenizer {
        tokenizer: model.tokenizer.inner(),
        template: model.template.as_ref(),
        eos_id,
    }
    .read_file(&tuning.data)?;
    let seq_len = tuning.seq_len(&model, examples.iter().map(|example| example.ids.len()));
    let pad_id = model.tokenizer.pad_id().unwrap_or(eos_id);
    let (rows, dropped) = SftRows::new(&examples, seq_len, pad_id);
    if rows.rows().is_empty() {
        bail!(
            "{}: no example keeps a token to train on within rows of {seq_len} tokens",
            tuning.data.display()
        );
    }
    log::info!(
        "{}: {} examples in rows of {seq_len} tokens ({dropped} dropped)",
        tuning.data.display(),
        rows.rows().len()
    );
    config.seq_len = seq_len;
    tuning.run(FINETUNE_COMMAND, &job, config, DataChoice::Sft(rows))
}
