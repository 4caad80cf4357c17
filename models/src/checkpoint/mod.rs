//! Checkpoints: saving a model and loading one, whole or sharded, and the folders training runs
//! keep them in.
//!
//! Each submodule depends only on those listed before it:
//! - [`run_folder`]: the layout of a training run's output folder (its checkpoints, the newest
//!   complete one, the shares of a job's processes).
//! - `error`: [`CheckpointError`].
//! - [`files`]: the files of a native checkpoint folder, whole or sharded.
//! - `burnpack`: the tensors of a burnpack file, read lazily and checked.
//! - [`sharded`]: checkpoints split by tensor-parallel rank and pipeline stage, written from the
//!   replicas or cut on the host, joined on the host.
//! - `native`: [`save_native`] and [`load_native`], whole or sharded.
//! - `load`: [`load_any`], whatever model folder a user points at.

mod burnpack;
mod error;
pub mod files;
mod load;
mod native;
pub mod run_folder;
pub mod sharded;

pub use error::CheckpointError;
pub use load::{FolderKind, folder_kind, load_any, model_folder};
pub use native::{load_native, save_native, save_native_with_tokenizer};
