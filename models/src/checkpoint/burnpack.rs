//! Reading the tensors of a burnpack file (burn-store's format, a native checkpoint's weights)
//! lazily, each checked against its entry when it is read.

use std::collections::BTreeMap;
use std::path::Path;

use burn_store::{BurnpackStore, ModuleStore, TensorSnapshot, TensorSnapshotError};

use super::error::CheckpointError;

/// The tensors of a burnpack file by parameter path (read lazily, when their data is asked for;
/// see [`length_checked`]).
pub(super) fn read_burnpack(
    path: &Path,
) -> Result<BTreeMap<String, TensorSnapshot>, CheckpointError> {
    let snapshots = BurnpackStore::from_file(path)
        .get_all_snapshots()
        .cloned()
        .map_err(|error| CheckpointError::burnpack(path, error.to_string()))?;
    Ok(snapshots
        .into_iter()
        .map(|(name, snapshot)| (name, length_checked(snapshot)))
        .collect())
}

/// `snapshot`, whose data is checked when it is read: a burnpack entry's byte range must hold
/// exactly the bytes of its shape and dtype. Burn's backends assume so (a corrupt file would make
/// them panic); here it is an error of the load that names the tensor.
fn length_checked(snapshot: TensorSnapshot) -> TensorSnapshot {
    let expected = snapshot.data_len();
    let (dtype, shape) = (snapshot.dtype, snapshot.shape.clone());
    let name = snapshot.full_path();
    let read = snapshot.clone_data_fn();
    let checked = move || {
        let data = read()?;
        if data.dtype != dtype || data.shape != shape || data.as_bytes().len() != expected {
            return Err(TensorSnapshotError::DataError(format!(
                "tensor `{name}` holds {} bytes of {:?} {:?}; its entry says {:?} {:?}, {expected} \
                 bytes",
                data.as_bytes().len(),
                data.dtype,
                data.shape,
                dtype,
                shape
            )));
        }
        Ok(data)
    };
    TensorSnapshot::from_closure(
        std::rc::Rc::new(checked),
        snapshot.dtype,
        snapshot.shape.clone(),
        snapshot.path_stack.clone().unwrap_or_default(),
        snapshot.container_stack.clone().unwrap_or_default(),
        snapshot.tensor_id.unwrap_or_default(),
    )
}
