//! `hlat finetune`: supervised fine-tuning of a model on prompt/completion or conversation
//! records, every weight trained or (with `--lora-rank`) LoRA adapters on frozen weights, on
//! `hlat pretrain`'s machinery (the same device, precision, layout, checkpoint and resume flags).
//! A LoRA run writes its adapter as a PEFT folder into `OUT/adapter` (and into each
//! checkpoint); the base weights stay as they were.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;
use hlat::hf::adapter::{ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE};
use hlat::lora::{LoraConfig, LoraTarget};
use hlat_train::config::TrainConfig;
use hlat_train::data::TextTokenizer;
use hlat_train::finetune::chat_template::TOKENIZER_CONFIG_FILE;
use hlat_train::finetune::{ChatTemplate, SftRows, SftTokenizer, bucket_len};
use hlat_train::pretrain::{ADAPTER_DIR, DataChoice, TOKENIZER_FILE};

use super::output_folder;
use super::pretrain::{Job, print_summary, train};
use super::train_args::TrainArgs;

/// How `hlat finetune` names itself in the run folders it records.
const FINETUNE_COMMAND: &str = "finetune";

/// The longest row when neither `--seq-len` nor the model's configuration bounds it.
const DEFAULT_MAX_SEQ_LEN: usize = 4096;

/// Arguments of `hlat finetune`.
#[derive(Args)]
pub struct FinetuneArgs {
    /// The model to fine-tune: a Hugging Face or native model folder with its `tokenizer.json`
    /// (and `tokenizer_config.json`, whose `chat_template` renders `messages` records).
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    /// Training examples, one JSON object per line: `{"prompt", "completion"}` or
    /// `{"messages": [{"role", "content"}, ...]}` (TRL's formats). The loss counts the
    /// completion and the assistant messages only.
    #[arg(long, value_name = "FILE.jsonl")]
    data: PathBuf,
    /// Output folder: checkpoints, metrics.jsonl, train.toml and, with LoRA, `adapter/`.
    /// Running the same command again resumes from its newest checkpoint; a folder another
    /// command wrote (a pretraining run, a model) or a fine-tuning run of another `--model` is
    /// refused and left as it is.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// A Jinja chat template for `messages` records, instead of the tokenizer's.
    #[arg(long, value_name = "FILE")]
    chat_template: Option<PathBuf>,
    /// Continue training the PEFT LoRA adapter in DIR (`adapter_config.json` +
    /// `adapter_model.safetensors`) on the frozen model: its rank, alpha and targets are the
    /// run's (`--lora-*` must agree when given).
    #[arg(long, value_name = "DIR")]
    adapter: Option<PathBuf>,
    /// Train LoRA adapters of rank R on frozen weights [default: every weight is trained].
    #[arg(long, value_name = "R", value_parser = super::ranges::at_least_one::<usize>())]
    lora_rank: Option<usize>,
    /// LoRA's alpha: the update is scaled by alpha / R [default: 2 × R].
    #[arg(long, value_name = "A", requires = "lora_rank", value_parser = super::ranges::positive)]
    lora_alpha: Option<f64>,
    /// Dropout on the adapters' input while training, in [0, 1).
    #[arg(long, value_name = "P", requires = "lora_rank")]
    lora_dropout: Option<f64>,
    /// The projections adapted in every layer, among q, k, v, o, gate, up, down
    /// [default: all of them].
    #[arg(long, value_name = "q,k,...", requires = "lora_rank")]
    lora_targets: Option<String>,
    /// The device, precision, parallel layout, schedule, checkpoint and resume flags of
    /// `hlat pretrain`. Without `--seq-len`, rows are as long as the smallest power of two that
    /// holds the longest example; without `--batch-tokens`, a step is one micro-batch per
    /// data-parallel replica.
    #[command(flatten)]
    train: TrainArgs,
}

/// The recipe of `hlat finetune` before `--config` and the flags: a short run at a learning rate
/// suited to fine-tuning (higher for adapters), no warmup, no weight decay, f32.
fn defaults(lora: bool) -> TrainConfig {
    TrainConfig {
        lr: if lora { 2e-4 } else { 2e-5 },
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

impl FinetuneArgs {
    /// The adapters the flags ask for, if any.
    fn lora(&self) -> anyhow::Result<Option<LoraConfig>> {
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
}

/// Runs `hlat finetune`.
pub fn run(args: FinetuneArgs) -> anyhow::Result<()> {
    let job = Job::from_env()?;
    output_folder::check(&args.out, FINETUNE_COMMAND, Some(&args.model), "--out")?;
    let lora = match (&args.adapter, args.lora()?) {
        (Some(adapter), flags) => {
            let stored = hlat::hf::adapter::read_adapter_config(adapter)?;
            if let Some(flags) = &flags {
                let alpha_differs = args.lora_alpha.is_some() && flags.alpha != stored.alpha;
                let targets_differ = args.lora_targets.is_some() && flags.targets != stored.targets;
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
            Some(LoraConfig { dropout, ..stored })
        }
        (None, flags) => flags,
    };
    let mut config = args.train.config(defaults(lora.is_some()))?;
    if lora.is_some() {
        config.lora = lora;
    }
    // A run folder of `hlat pretrain` or `hlat finetune` holds its model (and tokenizer) in its
    // newest checkpoint.
    let model_dir = hlat::checkpoint::model_folder(&args.model)
        .with_context(|| format!("--model {}", args.model.display()))?;
    let tokenizer_path = model_dir.join(TOKENIZER_FILE);
    if !tokenizer_path.is_file() {
        bail!(
            "{}: not found: fine-tuning needs the model's tokenizer",
            tokenizer_path.display()
        );
    }
    let tokenizer = TextTokenizer::from_file(&tokenizer_path)?;
    let tokenizer_config = model_dir.join(TOKENIZER_CONFIG_FILE);
    let template = match &args.chat_template {
        Some(path) => Some(ChatTemplate::from_file(path, Some(&tokenizer_config))?),
        None if tokenizer_config.is_file() => {
            ChatTemplate::from_tokenizer_config(&tokenizer_config)?
        }
        None => None,
    };
    let eos_id = tokenizer.eos_id()?;
    let examples = SftTokenizer {
        tokenizer: tokenizer.inner(),
        template: template.as_ref(),
        eos_id,
    }
    .read_file(&args.data)?;
    let seq_len = match args.train.seq_len {
        Some(seq_len) => seq_len,
        None => {
            let limit = hlat::hf::read_hf_config(&model_dir)
                .map(|model| model.max_seq_len)
                .unwrap_or(DEFAULT_MAX_SEQ_LEN);
            bucket_len(&examples, limit)
        }
    };
    let pad_id = tokenizer.pad_id().unwrap_or(eos_id);
    let (rows, dropped) = SftRows::new(&examples, seq_len, pad_id);
    if rows.rows().is_empty() {
        bail!(
            "{}: no example keeps a token to train on within rows of {seq_len} tokens",
            args.data.display()
        );
    }
    log::info!(
        "{}: {} examples in rows of {seq_len} tokens ({dropped} dropped)",
        args.data.display(),
        rows.rows().len()
    );
    config.seq_len = seq_len;
    if args.train.batch_tokens.is_none() {
        config.batch_tokens = seq_len * config.micro_batch_rows * config.data_parallel;
    }
    let mut options = job.options(
        config,
        args.out.clone(),
        DataChoice::Sft(rows),
        Some(args.model.clone()),
    )?;
    options.init_adapter = args.adapter.clone();
    output_folder::record(&args.out, FINETUNE_COMMAND, Some(&args.model), "--out")?;
    let (summary, _) = train(&args.train, &job, options.clone())?;
    print_summary(&summary, &options);
    if options.config.lora.is_some()
        && options.share.rank == 0
        && let Some(checkpoint) = &summary.checkpoint
    {
        let adapter = args.out.join(ADAPTER_DIR);
        copy_adapter(&checkpoint.join(ADAPTER_DIR), &adapter)?;
        println!("adapter: {}", adapter.display());
    }
    println!("model: {}", options.out.display());
    burn_trainium::distributed::leave();
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
