//! The flags and steps `hlat finetune` and `hlat align` share: the starting model and its
//! tokenizer and chat template, the records, the output folder, LoRA (fresh or continued from a
//! PEFT adapter), and `hlat pretrain`'s training flags; and the end of such a run (the summary,
//! the adapter copied into the output folder).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;
use hlat::hf::adapter::{ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE};
use hlat::lora::{LoraConfig, LoraTarget};
use hlat_train::config::TrainConfig;
use hlat_train::data::TextTokenizer;
use hlat_train::finetune::chat_template::TOKENIZER_CONFIG_FILE;
use hlat_train::finetune::{ChatTemplate, bucket_len};
use hlat_train::pretrain::{ADAPTER_DIR, DataChoice, PretrainOptions, TOKENIZER_FILE};

use super::output_folder;
use super::pretrain::{Job, print_summary, train};
use super::train_args::TrainArgs;

/// The longest row when neither `--seq-len` nor the model's configuration bounds it.
const DEFAULT_MAX_SEQ_LEN: usize = 4096;

/// The shared flags (see the module documentation).
#[derive(Args)]
pub struct TuningArgs {
    /// The model to start from: a Hugging Face or native model folder, or a run folder of `hlat
    /// pretrain`, `finetune` or `align` (its newest checkpoint), with its `tokenizer.json` (and
    /// `tokenizer_config.json`, whose `chat_template` renders conversational records).
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// Training records, one JSON object per line, in TRL's formats (described above).
    #[arg(long, value_name = "FILE.jsonl")]
    pub data: PathBuf,
    /// Output folder: checkpoints, metrics.jsonl, train.toml and, with LoRA, `adapter/`.
    /// Running the same command again resumes from its newest checkpoint; a folder another
    /// command wrote (a pretraining run, a model) or a run of another `--model` is refused and
    /// left as it is.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// A Jinja chat template for conversational records, instead of the tokenizer's.
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
    /// Continue training the PEFT LoRA adapter in DIR (`adapter_config.json` +
    /// `adapter_model.safetensors`) on the frozen model: its rank, alpha and targets are the
    /// run's (`--lora-*` must agree when given).
    #[arg(long, value_name = "DIR")]
    pub adapter: Option<PathBuf>,
    /// Train LoRA adapters of rank R on frozen weights [default: every weight is trained].
    #[arg(long, value_name = "R", value_parser = super::ranges::at_least_one::<usize>())]
    pub lora_rank: Option<usize>,
    /// LoRA's alpha: the update is scaled by alpha / R [default: 2 × R].
    #[arg(long, value_name = "A", requires = "lora_rank", value_parser = super::ranges::positive)]
    pub lora_alpha: Option<f64>,
    /// Dropout on the adapters' input while training, in [0, 1).
    #[arg(long, value_name = "P", requires = "lora_rank")]
    pub lora_dropout: Option<f64>,
    /// The projections adapted in every layer, among q, k, v, o, gate, up, down
    /// [default: all of them].
    #[arg(long, value_name = "q,k,...", requires = "lora_rank")]
    pub lora_targets: Option<String>,
    /// The device, precision, parallel layout, schedule, checkpoint and resume flags of
    /// `hlat pretrain`. Without `--seq-len`, rows are as long as the smallest power of two that
    /// holds the longest sequence; without `--batch-tokens`, a step is one micro-batch per
    /// data-parallel replica.
    #[command(flatten)]
    pub train: TrainArgs,
}

/// The starting model's folder and what reads its records.
pub struct StartingModel {
    /// The folder holding the model's weights and tokenizer (a run folder's newest checkpoint).
    pub dir: PathBuf,
    /// Its tokenizer.
    pub tokenizer: TextTokenizer,
    /// The chat template of conversational records: `--chat-template`, else the tokenizer's.
    pub template: Option<ChatTemplate>,
}

impl StartingModel {
    /// The longest row the model takes (its context), when its configuration says.
    fn max_seq_len(&self) -> usize {
        hlat::hf::read_hf_config(&self.dir)
            .map(|model| model.max_seq_len)
            .unwrap_or(DEFAULT_MAX_SEQ_LEN)
    }
}

impl TuningArgs {
    /// The run's configuration: `defaults(lora)` under `--config` and the flags, with the LoRA
    /// adapters the flags (or `--adapter`) ask for.
    pub fn config(&self, defaults: impl Fn(bool) -> TrainConfig) -> anyhow::Result<TrainConfig> {
        let lora = self.lora()?;
        let mut config = self.train.config(defaults(lora.is_some()))?;
        if lora.is_some() {
            config.lora = lora;
        }
        Ok(config)
    }

    /// The starting model's folder, tokenizer and chat template; `purpose` names the command's
    /// work in the error when the tokenizer is missing.
    pub fn starting_model(&self, purpose: &str) -> anyhow::Result<StartingModel> {
        let dir = model_folder(&self.model, "--model")?;
        let tokenizer_path = dir.join(TOKENIZER_FILE);
        if !tokenizer_path.is_file() {
            bail!(
                "{}: not found: {purpose} needs the model's tokenizer",
                tokenizer_path.display()
            );
        }
        let tokenizer = TextTokenizer::from_file(&tokenizer_path)?;
        let tokenizer_config = dir.join(TOKENIZER_CONFIG_FILE);
        let template = match &self.chat_template {
            Some(path) => Some(ChatTemplate::from_file(path, Some(&tokenizer_config))?),
            None if tokenizer_config.is_file() => {
                ChatTemplate::from_tokenizer_config(&tokenizer_config)?
            }
            None => None,
        };
        Ok(StartingModel {
            dir,
            tokenizer,
            template,
        })
    }

    /// The run's row length: `--seq-len`, else the bucket (`bucket_len`) of sequences of
    /// `lengths` tokens, at most the model's context.
    pub fn seq_len(
        &self,
        model: &StartingModel,
        lengths: impl IntoIterator<Item = usize>,
    ) -> usize {
        self.train
            .seq_len
            .unwrap_or_else(|| bucket_len(lengths, model.max_seq_len()))
    }

    /// The adapters the flags ask for, if any: `--adapter`'s (its dropout replaced by
    /// `--lora-dropout`), which the other `--lora-*` flags must agree with, or fresh ones.
    fn lora(&self) -> anyhow::Result<Option<LoraConfig>> {
        let flags = self.lora_flags()?;
        let Some(adapter) = &self.adapter else {
            return Ok(flags);
        };
        let stored = hlat::hf::adapter::read_adapter_config(adapter)?;
        if let Some(flags) = &flags {
            let alpha_differs = self.lora_alpha.is_some() && flags.alpha != stored.alpha;
            let targets_differ = self.lora_targets.is_some() && flags.targets != stored.targets;
            if flags.rank != stored.rank || alpha_differs || targets_differ {
                bail!(
                    "--adapter {}: holds an adapter of rank {}, alpha {}, targets {:?}; the \
                     --lora-* flags ask for rank {}, alpha {}, targets {:?}",
                    adapter.display(),
                    stored.rank,
                    stored.alpha,
                    stored.targets,
                    flags.rank,
                    flags.alpha,
                    flags.targets
                );
            }
        }
        let dropout = flags.map_or(stored.dropout, |flags| flags.dropout);
        Ok(Some(LoraConfig { dropout, ..stored }))
    }

    /// The fresh adapters the `--lora-*` flags describe, if `--lora-rank` is given.
    fn lora_flags(&self) -> anyhow::Result<Option<LoraConfig>> {
        let Some(rank) = self.lora_rank else {
            return Ok(None);
        };
        let targets = match &self.lora_targets {
            Some(text) => LoraConfig::parse_targets(text)
                .map_err(anyhow::Error::msg)
                .context("--lora-targets")?,
            None => LoraTarget::ALL.to_vec(),
        };
        let config = LoraConfig {
            rank,
            alpha: self.lora_alpha.unwrap_or(2.0 * rank as f64),
            dropout: self.lora_dropout.unwrap_or(0.0),
            targets,
            rslora: false,
        };
        config
            .validate()
            .map_err(anyhow::Error::msg)
            .context("--lora-rank/--lora-dropout")?;
        Ok(Some(config))
    }

    /// Runs the job on `data` with `config` (its `seq_len` the rows'; without `--batch-tokens`,
    /// one micro-batch per data-parallel replica a step) as `hlat COMMAND`, recording the output
    /// folder as the command's, then prints the summary, copies a LoRA run's adapter into
    /// `OUT/adapter` and leaves the job.
    pub fn run(
        &self,
        command: &str,
        job: &Job,
        mut config: TrainConfig,
        data: DataChoice,
    ) -> anyhow::Result<()> {
        if self.train.batch_tokens.is_none() {
            config.batch_tokens = config.seq_len * config.micro_batch_rows * config.data_parallel;
        }
        let mut options = job.options(config, self.out.clone(), data, Some(self.model.clone()))?;
        options.init_adapter = self.adapter.clone();
        output_folder::record(&self.out, command, Some(&self.model), "--out")?;
        let (summary, _) = train(&self.train, job, options.clone())?;
        print_summary(&summary, &options);
        copy_run_adapter(&summary, &options, &self.out)?;
        println!("model: {}", options.out.display());
        burn_trainium::distributed::leave();
        Ok(())
    }

    /// Refuses the output folder before any work when another command (or another `--model`)
    /// made it.
    pub fn check_out(&self, command: &str) -> anyhow::Result<()> {
        output_folder::check(&self.out, command, Some(&self.model), "--out")
    }
}

/// The model folder `dir` names (a run folder's newest checkpoint's `model/`), for the flag
/// `flag`: an error naming the flag when there is none, or when it is a LoRA run's, whose
/// `model/` lacks the adapter (its base model and `OUT/adapter` are what to name instead).
pub fn model_folder(dir: &Path, flag: &str) -> anyhow::Result<PathBuf> {
    let model =
        hlat::checkpoint::model_folder(dir).with_context(|| format!("{flag} {}", dir.display()))?;
    if hlat::checkpoint::folder_kind(&model).is_none() {
        bail!(
            "{flag} {}: not a model folder (no Hugging Face or native weights in {})",
            dir.display(),
            model.display()
        );
    }
    hlat_train::pretrain::refuse_lora_checkpoint(&model, &format!("{flag} {}", dir.display()))?;
    Ok(model)
}

/// Copies a LoRA run's adapter from its last checkpoint into `out/adapter` (rank 0 only).
fn copy_run_adapter(
    summary: &hlat_train::pretrain::PretrainSummary,
    options: &PretrainOptions,
    out: &Path,
) -> anyhow::Result<()> {
    if options.config.lora.is_none() || options.share.rank != 0 {
        return Ok(());
    }
    let Some(checkpoint) = &summary.checkpoint else {
        return Ok(());
    };
    let adapter = out.join(ADAPTER_DIR);
    copy_adapter(&checkpoint.join(ADAPTER_DIR), &adapter)?;
    println!("adapter: {}", adapter.display());
    Ok(())
}

/// Copies the PEFT adapter folder `from` (a checkpoint's) to `to`, replacing what was there.
fn copy_adapter(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to).with_context(|| to.display().to_string())?;
    for file in [ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE] {
        std::fs::copy(from.join(file), to.join(file)).with_context(|| {
            format!("copying {} to {}", from.join(file).display(), to.display())
        })?;
    }
    Ok(())
}
