//! Reading the tensors of a burnpack file (burn-pack's format, a native checkpoint's weights)
//! lazily, each checked against its entry.

use std::collections::BTreeMap;
use std::path::Path;

use burn_store::burn_pack::Tensor as PackTensor;
use burn_store::{BurnpackStore, ModuleStore};

use super::error::CheckpointError;

/// The tensors of a burnpack file by parameter path (read lazily, when their data is asked for).
///
/// Every entry's byte range is checked against its shape and dtype when the file is opened
/// (burn-pack's reader refuses a file whose entries disagree, naming the tensor): Burn's
/// backends assume they agree, and a corrupt file is an error of the load, not a panic.
pub(super) fn read_burnpack(path: &Path) -> Result<BTreeMap<String, PackTensor>, CheckpointError> {
    BurnpackStore::from_file(path)
        .get_all_tensors()
        .cloned()
        .map_err(|error| CheckpointError::burnpack(path, error.to_string()))
}
