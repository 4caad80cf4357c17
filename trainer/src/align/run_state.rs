//! [`PinnedPairs`]: what a preference run trains with, written into its output folder before its
//! first step (`preference.json`), so that the same command run again resumes the same run: the
//! objective, the row length, a digest of the pairs' tokens and, for DPO, the reference model and
//! its log-probabilities, which a resumed run reuses instead of computing them again (from a
//! reference that may have changed since: a run folder's newest checkpoint).

use std::path::{Path, PathBuf};

use hlat::checkpoint::run_folder::write_atomic;
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

use super::batch::PreferenceObjective;
use super::pairs::PreferencePairs;
use crate::error::TrainError;

/// The file in a preference run's output folder.
pub const PINNED_PAIRS_FILE: &str = "preference.json";

/// DPO's reference, as the run computed it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PinnedReference {
    /// The model folder the log-probabilities came from (a run folder's checkpoint resolved).
    pub model: PathBuf,
    /// Each row's summed completion log-probability (chosen, rejected, ... in pair order).
    pub log_probs: Vec<f32>,
}

/// What a preference run trains with (see the module documentation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PinnedPairs {
    /// The method and its settings.
    pub objective: PreferenceObjective,
    /// Targets per row.
    pub seq_len: usize,
    /// How many pairs.
    pub pairs: usize,
    /// The xxh3 digest of the pairs' tokens and prompt lengths.
    pub digest: String,
    /// DPO's reference.
    pub reference: Option<PinnedReference>,
}

impl PinnedPairs {
    /// What `pairs` (without their reference) pin.
    pub fn of(pairs: &PreferencePairs) -> Self {
        Self {
            objective: pairs.objective(),
            seq_len: pairs.seq_len(),
            pairs: pairs.examples().len(),
            digest: digest(pairs),
            reference: None,
        }
    }

    /// The state pinned in the output folder `out`, if the run wrote one.
    pub fn read(out: &Path) -> Result<Option<Self>, TrainError> {
        let path = out.join(PINNED_PAIRS_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(TrainError::Io { path, source }),
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|error| TrainError::Mismatch(format!("{}: {error}", path.display())))
    }

    /// Writes the state into the output folder `out` (atomically).
    pub fn write(&self, out: &Path) -> Result<(), TrainError> {
        let bytes = serde_json::to_vec(self).expect("the pinned state serializes");
        write_atomic(&out.join(PINNED_PAIRS_FILE), &bytes).map_err(TrainError::from)
    }

    /// Checks that this run (`wanted`, its reference model `reference` for DPO) is the one pinned
    /// in `out` (`self`): an error naming what differs, the file and what to do otherwise.
    pub fn check_same_run(
        &self,
        wanted: &Self,
        reference: Option<&Path>,
        out: &Path,
    ) -> Result<(), TrainError> {
        let pinned_reference = self.reference.as_ref().map(|pinned| pinned.model.as_path());
        let differs = if self.objective != wanted.objective {
            Some(format!(
                "it was trained with {:?}, this run asks for {:?}",
                self.objective, wanted.objective
            ))
        } else if (self.seq_len, self.pairs, &self.digest)
            != (wanted.seq_len, wanted.pairs, &wanted.digest)
        {
            Some(format!(
                "it was trained on {} pairs in rows of {} tokens (digest {}), this run has {} \
                 pairs in rows of {} (digest {})",
                self.pairs,
                self.seq_len + 1,
                self.digest,
                wanted.pairs,
                wanted.seq_len + 1,
                wanted.digest
            ))
        } else if reference.is_some() && pinned_reference.is_some() && reference != pinned_reference
        {
            Some(format!(
                "its reference model was {}, this run names {}",
                pinned_reference.unwrap_or(Path::new("")).display(),
                reference.unwrap_or(Path::new("")).display()
            ))
        } else {
            None
        };
        match differs {
            Some(what) => Err(TrainError::Mismatch(format!(
                "{}: {what}; resume with the run's own settings and data, or start a new --out",
                out.join(PINNED_PAIRS_FILE).display()
            ))),
            None => Ok(()),
        }
    }
}

/// The xxh3 digest of `pairs`' tokens and prompt lengths, in hex.
fn digest(pairs: &PreferencePairs) -> String {
    let mut hasher = Xxh3::new();
    for pair in pairs.examples() {
        for side in [&pair.chosen, &pair.rejected] {
            hasher.update(&(side.prompt_len as u64).to_le_bytes());
            hasher.update(&(side.ids.len() as u64).to_le_bytes());
            for id in &side.ids {
                hasher.update(&id.to_le_bytes());
            }
        }
    }
    format!("{:032x}", hasher.digest128())
}
