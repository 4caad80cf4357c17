//! `hlat align`: preference alignment of a model on prompt/chosen/rejected records, by DPO
//! against a frozen reference model or by ORPO on top of the SFT loss, as TRL's `DPOTrainer` and
//! `ORPOTrainer` compute them (`hlat_train::align`), every weight trained or LoRA adapters, on
//! `hlat finetune`'s flags and `hlat pretrain`'s machinery. DPO's reference log-probabilities
//! are computed once on the run's device before training, so that training holds one model.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use hlat_train::align::{
    AlignMethod, DpoLoss, PreferenceObjective, PreferencePairs, PreferenceTokenizer,
};
use hlat_train::config::TrainConfig;
use hlat_train::data::DataError;
use hlat_train::pretrain::{DataChoice, PreferenceData};

use super::finetune::tuning_defaults;
use super::pretrain::Job;
use super::tuning_args::{TuningArgs, model_folder};

/// How `hlat align` names itself in the run folders it records.
const ALIGN_COMMAND: &str = "align";

/// The preference methods, as `--method` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MethodArg {
    /// Direct preference optimisation against a frozen reference model.
    Dpo,
    /// Odds-ratio preference optimisation: the SFT loss on the chosen completions minus β times
    /// the log-sigmoid of the log odds ratio; no reference model.
    Orpo,
}

impl From<MethodArg> for AlignMethod {
    fn from(method: MethodArg) -> Self {
        match method {
            MethodArg::Dpo => AlignMethod::Dpo,
            MethodArg::Orpo => AlignMethod::Orpo,
        }
    }
}

/// DPO's losses, as `--loss-type` names them (TRL's `loss_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LossTypeArg {
    /// `−logσ(β·h)` (TRL's default); with `--label-smoothing ε`, conservative DPO:
    /// `−(1 − ε)·logσ(β·h) − ε·logσ(−β·h)`.
    Sigmoid,
    /// The robust loss for noisy preferences, unbiased for labels flipped with chance
    /// `--label-smoothing`.
    Robust,
}

/// Arguments of `hlat align` (its records are described in its help, `main.rs`).
#[derive(Args)]
pub struct AlignArgs {
    /// The preference method.
    #[arg(long, value_enum)]
    method: MethodArg,
    /// β: DPO's temperature of the implicit reward, ORPO's weight of the odds-ratio term
    /// [default: 0.1, TRL's].
    #[arg(long, value_parser = super::ranges::positive)]
    beta: Option<f64>,
    /// DPO's reference model [default: --model, without --adapter's adapter]. Its
    /// log-probabilities are computed before training and the model is then released.
    #[arg(long, value_name = "DIR")]
    ref_model: Option<PathBuf>,
    /// DPO's loss.
    #[arg(long, value_enum, default_value = "sigmoid")]
    loss_type: LossTypeArg,
    /// DPO's label smoothing ε, the chance that a pair's labels are flipped, in [0, 0.5).
    #[arg(long, value_name = "EPS")]
    label_smoothing: Option<f64>,
    /// The model, records, output folder, LoRA and training flags `hlat finetune` shares.
    #[command(flatten)]
    tuning: TuningArgs,
}

/// TRL's β.
const DEFAULT_BETA: f64 = 0.1;

/// The recipe of `hlat align` before `--config` and the flags: `hlat finetune`'s, at TRL's
/// learning rate for preference training (higher for adapters).
fn defaults(lora: bool) -> TrainConfig {
    TrainConfig {
        lr: if lora { 5e-6 } else { 1e-6 },
        ..tuning_defaults()
    }
}

impl AlignArgs {
    /// What the pairs are trained with, from the flags; a flag the method does not take is an
    /// error naming it.
    fn objective(&self) -> anyhow::Result<PreferenceObjective> {
        let beta = self.beta.unwrap_or(DEFAULT_BETA);
        match self.method {
            MethodArg::Orpo => {
                for (given, flag) in [
                    (self.ref_model.is_some(), "--ref-model"),
                    (self.label_smoothing.is_some(), "--label-smoothing"),
                    (self.loss_type != LossTypeArg::Sigmoid, "--loss-type"),
                ] {
                    if given {
                        bail!(
                            "{flag}: ORPO has no reference model nor DPO loss; it is for --method dpo"
                        );
                    }
                }
                Ok(PreferenceObjective::Orpo { beta })
            }
            MethodArg::Dpo => {
                let smoothing = self.label_smoothing.unwrap_or(0.0);
                if !(0.0..0.5).contains(&smoothing) {
                    bail!("--label-smoothing {smoothing}: must be in [0, 0.5)");
                }
                let loss = match self.loss_type {
                    LossTypeArg::Sigmoid if smoothing == 0.0 => DpoLoss::Sigmoid,
                    LossTypeArg::Sigmoid => DpoLoss::Conservative {
                        label_smoothing: smoothing,
                    },
                    LossTypeArg::Robust => DpoLoss::Robust {
                        label_smoothing: smoothing,
                    },
                };
                Ok(PreferenceObjective::Dpo { beta, loss })
            }
        }
    }
}

/// Runs `hlat align`.
pub fn run(args: AlignArgs) -> anyhow::Result<()> {
    let tuning = &args.tuning;
    let job = Job::from_env()?;
    tuning.check_out(ALIGN_COMMAND)?;
    let objective = args.objective()?;
    if let Some(reference) = &args.ref_model {
        model_folder(reference, "--ref-model")?;
    }
    let mut config = tuning.config(defaults)?;
    if tuning.train.micro_batch_rows.is_none() && !config.micro_batch_rows.is_multiple_of(2) {
        // `--dp` cut the default micro-batch below a pair: one pair per replica.
        config.micro_batch_rows += 1;
    }
    hlat_train::align::pairs::check_config(&config)?;
    let model = tuning.starting_model("preference alignment")?;
    let tokenizer = &model.tokenizer;
    let eos_id = tokenizer.eos_id()?;
    let eos_text = tokenizer.inner().id_to_token(eos_id).with_context(|| {
        format!("the tokenizer has no text for its end-of-sequence id {eos_id}")
    })?;
    let examples = PreferenceTokenizer {
        tokenizer: tokenizer.inner(),
        template: model.template.as_ref(),
        bos_id: match tokenizer.bos_id() {
            Ok(id) => Some(id),
            // A tokenizer without BOS (Qwen's): TRL adds none.
            Err(DataError::MissingSpecialToken { .. }) => None,
            Err(error) => return Err(error.into()),
        },
        eos: (eos_id, &eos_text),
        method: args.method.into(),
    }
    .read_file(&tuning.data)?;
    let sides = examples
        .iter()
        .flat_map(|pair| [pair.chosen.ids.len(), pair.rejected.ids.len()]);
    let seq_len = tuning.seq_len(&model, sides);
    let pad_id = tokenizer.pad_id().unwrap_or(eos_id);
    let (pairs, dropped) = PreferencePairs::new(&examples, seq_len, pad_id, objective);
    if pairs.examples().is_empty() {
        bail!(
            "{}: no pair keeps a completion token on both sides within rows of {seq_len} tokens",
            tuning.data.display()
        );
    }
    log::info!(
        "{}: {} pairs in rows of {seq_len} tokens ({dropped} dropped), {objective:?}",
        tuning.data.display(),
        pairs.examples().len()
    );
    config.seq_len = seq_len;
    let data = DataChoice::Preference(PreferenceData {
        pairs,
        reference_model: args.ref_model.clone(),
    });
    tuning.run(ALIGN_COMMAND, &job, config, data)
}
