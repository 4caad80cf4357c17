//! The data of a pretraining run: the built-in corpus or prepared shard folders mixed by weight,
//! split into training rows, validation rows and the tokenizer that made them.

use std::path::PathBuf;
use std::sync::Arc;

use crate::align::PreferencePairs;
use crate::config::TrainConfig;
use crate::data::{
    BuiltinDataConfig, DataError, Mixture, PackedRows, RowSource, ShardSet, Split, TextTokenizer,
    builtin_dataset,
};
use crate::data_spec::DataSource;
use crate::error::TrainError;
use crate::finetune::SftRows;
use crate::language_model::NOT_A_TARGET;

use super::TOKENIZER_FILE;

/// Training tokens of the built-in corpus.
const BUILTIN_TRAIN_TOKENS: usize = 512 * 1024;
/// Validation tokens of the built-in corpus.
const BUILTIN_VALIDATION_TOKENS: usize = 16 * 1024;

/// Where the training rows come from.
#[derive(Debug, Clone, PartialEq)]
pub enum DataChoice {
    /// The generated English-like corpus and its tokenizer (`data::builtin`).
    Builtin,
    /// Prepared shard folders, mixed by weight.
    Shards(Vec<DataSource>),
    /// Supervised fine-tuning examples, one per row (`hlat finetune`); the tokenizer is the
    /// starting model's. They are their own validation rows.
    Sft(SftRows),
    /// Preference pairs (`hlat align`), each two rows; no validation rows.
    Preference(PreferenceData),
}

/// The pairs of a preference run and, for DPO, its reference model.
#[derive(Debug, Clone, PartialEq)]
pub struct PreferenceData {
    /// The pairs (for DPO, with the reference log-probabilities already computed, or not).
    pub pairs: PreferencePairs,
    /// The model folder whose log-probabilities DPO compares with when `pairs` lacks them
    /// [default: the run's starting model, `PretrainOptions::init_from`].
    pub reference_model: Option<PathBuf>,
}

/// Training and validation rows with the tokenizer that made them.
pub(super) struct PreparedData {
    /// The training rows (sampled by the run's seed).
    pub train: Arc<dyn RowSource>,
    /// The validation rows, when the data has a validation split.
    pub validation: Option<Box<dyn RowSource>>,
    /// The tokenizer, saved with every checkpoint's model.
    pub tokenizer: Option<TextTokenizer>,
    /// Exclusive upper bound of the token ids in the data.
    pub vocab_size: usize,
    /// The preference pairs that `train` draws, in a preference run.
    pub pairs: Option<PreferencePairs>,
}

pub(super) fn data_error(error: DataError) -> TrainError {
    TrainError::Data(error.to_string())
}

/// The built-in corpus of a run: a fixed budget of training tokens (longer runs repeat it) and of
/// validation tokens, whatever the run's length, so that a resumed or extended run and `hlat
/// eval` see the same documents on the same side of the split.
fn builtin_config(config: &TrainConfig) -> BuiltinDataConfig {
    let row = config.seq_len + 1;
    BuiltinDataConfig {
        seq_len: config.seq_len,
        train_tokens: BUILTIN_TRAIN_TOKENS.max(row),
        validation_tokens: BUILTIN_VALIDATION_TOKENS.max(row),
        seed: config.seed,
    }
}

/// Builds the training rows, the validation rows and the tokenizer.
pub(super) fn prepare_data(
    choice: &DataChoice,
    config: &TrainConfig,
) -> Result<PreparedData, TrainError> {
    match choice {
        DataChoice::Builtin => {
            let dataset = builtin_dataset(&builtin_config(config)).map_err(data_error)?;
            Ok(PreparedData {
                vocab_size: dataset.tokenizer.vocab_size(),
                train: Arc::new(dataset.train),
                validation: Some(Box::new(dataset.validation)),
                tokenizer: Some(dataset.tokenizer),
                pairs: None,
            })
        }
        DataChoice::Shards(sources) => {
            let mut train = Vec::new();
            let mut vocab_size = 0;
            for source in sources {
                let shards =
                    ShardSet::open_split(&source.folder, Split::Train).map_err(data_error)?;
                vocab_size = vocab_size.max(shards.vocab_size() as usize);
                let rows = PackedRows::new(shards, config.seq_len).map_err(data_error)?;
                log::info!(
                    "data `{}`: {} training rows, weight {}",
                    source.name,
                    rows.num_rows(),
                    source.weight
                );
                train.push((Box::new(rows) as Box<dyn RowSource>, source.weight));
            }
            let train = mix(train, config.seed).map_err(data_error)?;
            let validation = match shard_validation(sources, config) {
                Ok(rows) => Some(rows),
                Err(error) => {
                    log::warn!("no validation: {error}");
                    None
                }
            };
            let tokenizer_path = sources[0].folder.join(TOKENIZER_FILE);
            let tokenizer = if tokenizer_path.is_file() {
                Some(TextTokenizer::from_file(&tokenizer_path).map_err(data_error)?)
            } else {
                log::warn!(
                    "{} not found: the checkpoints will hold no tokenizer",
                    tokenizer_path.display()
                );
                None
            };
            Ok(PreparedData {
                train: Arc::from(train),
                validation,
                tokenizer,
                vocab_size,
                pairs: None,
            })
        }
        DataChoice::Sft(rows) => {
            log::info!(
                "fine-tuning data: {} examples of {} tokens, {} trained on",
                rows.num_rows(),
                rows.row_len(),
                rows.trained_tokens()
            );
            Ok(PreparedData {
                vocab_size: sft_vocab(rows),
                train: Arc::new(rows.clone()),
                validation: Some(Box::new(rows.clone())),
                tokenizer: None,
                pairs: None,
            })
        }
        DataChoice::Preference(data) => {
            let pairs = &data.pairs;
            log::info!(
                "preference data: {} pairs in rows of {} tokens, {} completion tokens scored",
                pairs.examples().len(),
                pairs.seq_len() + 1,
                pairs.completion_tokens()
            );
            Ok(PreparedData {
                vocab_size: pairs.vocab_size(),
                train: Arc::new(pairs.clone()),
                validation: None,
                tokenizer: None,
                pairs: Some(pairs.clone()),
            })
        }
    }
}

/// One past the largest token id of fine-tuning rows (their loss marks left out).
fn sft_vocab(rows: &SftRows) -> usize {
    rows.rows()
        .iter()
        .flatten()
        .map(|&id| (id & !NOT_A_TARGET) as usize + 1)
        .max()
        .unwrap_or(0)
}

/// The validation rows of a data choice, as a run with `config` splits them.
pub fn validation_source(
    choice: &DataChoice,
    config: &TrainConfig,
) -> Result<Box<dyn RowSource>, TrainError> {
    match choice {
        DataChoice::Builtin => Ok(Box::new(
            builtin_dataset(&builtin_config(config))
                .map_err(data_error)?
                .validation,
        )),
        DataChoice::Shards(sources) => shard_validation(sources, config),
        DataChoice::Sft(rows) => Ok(Box::new(rows.clone())),
        DataChoice::Preference(_) => Err(TrainError::Mismatch(
            "preference pairs have no validation rows".to_string(),
        )),
    }
}

/// The first `count` rows of a validation source (fewer if it has fewer).
pub(super) fn validation_rows(rows: &dyn RowSource, count: usize) -> Vec<Vec<u32>> {
    (0..count.min(rows.num_rows()))
        .map(|index| rows.row(index))
        .collect()
}

/// Rows of each data source, by source name.
pub(super) type RowsBySource = Vec<(String, Vec<Vec<u32>>)>;

/// The first `count` validation rows of each source of a mixture of several, by source name
/// (none for the built-in corpus or a single source: the mixed validation is then the same).
pub(super) fn per_source_validation(
    choice: &DataChoice,
    config: &TrainConfig,
    count: usize,
) -> Result<RowsBySource, TrainError> {
    let DataChoice::Shards(sources) = choice else {
        return Ok(Vec::new());
    };
    if sources.len() < 2 {
        return Ok(Vec::new());
    }
    sources
        .iter()
        .map(|source| {
            let shards =
                ShardSet::open_split(&source.folder, Split::Validation).map_err(data_error)?;
            let rows = PackedRows::new(shards, config.seq_len).map_err(data_error)?;
            Ok((source.name.clone(), validation_rows(&rows, count)))
        })
        .collect()
}

/// The validation splits of shard folders, mixed by the same weights as training.
fn shard_validation(
    sources: &[DataSource],
    config: &TrainConfig,
) -> Result<Box<dyn RowSource>, TrainError> {
    let mut validation = Vec::new();
    for source in sources {
        let shards = ShardSet::open_split(&source.folder, Split::Validation).map_err(data_error)?;
        let rows = PackedRows::new(shards, config.seq_len).map_err(data_error)?;
        validation.push((Box::new(rows) as Box<dyn RowSource>, source.weight));
    }
    mix(validation, config.seed).map_err(data_error)
}

/// One source as is, several mixed by weight.
fn mix(
    mut sources: Vec<(Box<dyn RowSource>, f64)>,
    seed: u64,
) -> Result<Box<dyn RowSource>, DataError> {
    if sources.len() == 1 {
        return Ok(sources.remove(0).0);
    }
    Ok(Box::new(Mixture::new(sources, seed)?))
}
