//! The model zoo bridge: Hugging Face folders of the LLaMA family in and out.
//!
//! - [`import_hf`]: `config.json` (+ `model.safetensors` or a sharded index) to [`crate::Hlat`].
//! - [`export_hf`]: [`crate::Hlat`] to the same layout, loadable by transformers.
//! - [`read_hf_config`]: only the configuration; [`load_tokenizer`]: `tokenizer.json`.

pub mod adapter;
mod config;
mod dtype;
mod error;
mod export;
mod import;
mod names;
mod reader;
mod tokenizer;

pub use config::{CONFIG_FILE, hf_config_json, read_hf_config, read_hf_config_file};
pub use dtype::{UnknownDtype, WeightDtype};
pub use error::HfError;
pub use export::{DEFAULT_MAX_SHARD_SIZE, ExportOptions, export_hf};
pub use import::import_hf;
pub use names::{TensorSpec, tensor_specs};
pub use reader::{INDEX_FILE, WEIGHTS_FILE};
pub use tokenizer::{TOKENIZER_FILE, find_tokenizer, load_tokenizer, save_tokenizer};

pub(crate) use dtype::{decode, encode};
pub(crate) use export::{write_json, write_safetensors_with};
pub(crate) use reader::Weights;
