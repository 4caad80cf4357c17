//! Optimizer state that `hlat` wrote on Burn 0.21 (`optimizer[-rank-RR-of-WW].bin`), read so
//! that checkpoints made before the move to Burn 0.22 still resume.
//!
//! Burn 0.21's binary file recorder wrote a `BurnRecord` (metadata, then the item) with bincode's
//! standard configuration over serde. The item maps each parameter's position to burn-optim's
//! adaptor record: version 1, the parameter's rank (0 to 8), then HLAT's AdamW state (the two
//! moments as Burn's `TensorData`, whose serde form Burn 0.22 reads unchanged, and the update
//! count). The types below mirror that layout; nothing here writes it.

use std::collections::HashMap;
use std::path::Path;

use burn::module::ParamId;
use burn::tensor::TensorData;
use serde::Deserialize;

/// The optimizer state of one parameter, as Burn 0.21 recorded it.
#[derive(Debug)]
pub(crate) struct LegacyState {
    /// The parameter's position in the module (as [`crate::checkpoint_state`] numbers them).
    pub position: usize,
    /// The parameter's rank.
    pub rank: usize,
    /// First moment.
    pub moment1: TensorData,
    /// Second moment.
    pub moment2: TensorData,
    /// Updates applied so far.
    pub time: usize,
}

#[derive(Deserialize)]
#[allow(dead_code)] // Read to move past it; the checks below need none of it.
struct Metadata {
    float: String,
    int: String,
    format: String,
    version: String,
    settings: String,
}

#[derive(Deserialize)]
struct File {
    #[allow(dead_code)]
    metadata: Metadata,
    item: HashMap<String, AdaptorRecord>,
}

#[derive(Deserialize)]
enum AdaptorRecord {
    V1(RankRecord),
}

/// burn-optim 0.21's `AdaptorRecordItemV1`: one variant per rank, 0 to 8.
#[derive(Deserialize)]
enum RankRecord {
    Rank0(AdamWState),
    Rank1(AdamWState),
    Rank2(AdamWState),
    Rank3(AdamWState),
    Rank4(AdamWState),
    Rank5(AdamWState),
    Rank6(AdamWState),
    Rank7(AdamWState),
    Rank8(AdamWState),
}

#[derive(Deserialize)]
struct AdamWState {
    moment1: TensorData,
    moment2: TensorData,
    time: usize,
}

impl RankRecord {
    fn into_parts(self) -> (usize, AdamWState) {
        match self {
            RankRecord::Rank0(state) => (0, state),
            RankRecord::Rank1(state) => (1, state),
            RankRecord::Rank2(state) => (2, state),
            RankRecord::Rank3(state) => (3, state),
            RankRecord::Rank4(state) => (4, state),
            RankRecord::Rank5(state) => (5, state),
            RankRecord::Rank6(state) => (6, state),
            RankRecord::Rank7(state) => (7, state),
            RankRecord::Rank8(state) => (8, state),
        }
    }
}

/// The states in the Burn 0.21 optimizer file `path`, or why it cannot be read.
pub(crate) fn read(path: &Path) -> Result<Vec<LegacyState>, String> {
    let bytes = std::fs::read(path).map_err(|error| error.to_string())?;
    let (file, read): (File, usize) =
        bincode::serde::decode_from_slice(&bytes, bincode::config::standard())
            .map_err(|error| format!("is not an optimizer file of Burn 0.21: {error}"))?;
    if read != bytes.len() {
        return Err(format!(
            "holds {} bytes after the optimizer state of Burn 0.21",
            bytes.len() - read
        ));
    }
    let mut states = Vec::with_capacity(file.item.len());
    for (id, record) in file.item {
        // hlat numbered parameters by position; Burn 0.21 wrote the number as a parameter id
        // (base32 of its little-endian bytes), which Burn 0.22's `ParamId` still parses.
        let position = id
            .parse::<ParamId>()
            .map_err(|_| format!("holds a parameter id `{id}` that is not a position"))?
            .val() as usize;
        let AdaptorRecord::V1(record) = record;
        let (rank, state) = record.into_parts();
        states.push(LegacyState {
            position,
            rank,
            moment1: state.moment1,
            moment2: state.moment2,
            time: state.time,
        });
    }
    Ok(states)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use burn::module::{Module, ModuleVisitor, Param};
    use burn::tensor::{Device, Tensor};

    use crate::checkpoint_state::load_optimizer;
    use crate::config::TrainConfig;
    use crate::optimizer::{AdamWSettings, HlatAdamW, HlatOptimizer};
    use crate::parallel::ParallelLayout;

    /// The checkpoint of step 3 that `hlat pretrain` wrote on Burn 0.21
    /// (`fixtures/regenerate_run_burn_021.sh`).
    fn checkpoint() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/run-burn-0.21/step-00000003")
    }

    #[test]
    fn the_optimizer_state_burn_021_wrote_is_read_whole() {
        let states = super::read(&checkpoint().join("optimizer.bin")).unwrap();
        assert!(!states.is_empty());
        let mut positions: Vec<usize> = states.iter().map(|state| state.position).collect();
        positions.sort_unstable();
        assert_eq!(positions, (0..states.len()).collect::<Vec<_>>());
        for state in &states {
            assert_eq!(state.time, 3, "parameter {}: three updates", state.position);
            assert_eq!(state.moment1.shape(), state.moment2.shape());
            assert_eq!(state.moment1.shape().len(), state.rank);
            let second: Vec<f32> = state.moment2.clone().try_to_vec().unwrap();
            assert!(
                second
                    .iter()
                    .all(|value| value.is_finite() && *value >= 0.0)
            );
            assert!(
                second.iter().any(|value| *value > 0.0),
                "{}",
                state.position
            );
        }
    }

    #[test]
    fn a_burn_021_checkpoint_resumes_its_optimizer_state_for_every_parameter() {
        let device = Device::flex();
        let (_, model) =
            hlat::checkpoint::load_native(&checkpoint().join("model"), &device).unwrap();
        let settings = AdamWSettings::from_config(&TrainConfig::default());
        let optimizer = load_optimizer(
            &checkpoint(),
            1,
            HlatOptimizer::new(HlatAdamW::new(settings)),
            &model,
            &ParallelLayout::SINGLE,
            None,
            &device,
        )
        .unwrap();
        let record = optimizer.to_record();
        // Every parameter has state of its own shape.
        struct Shapes(Vec<(burn::module::ParamId, Vec<usize>)>);
        impl ModuleVisitor for Shapes {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
                self.0.push((param.id, param.val().shape().to_vec()));
            }
        }
        let mut shapes = Shapes(Vec::new());
        model.visit(&mut shapes);
        assert_eq!(record.len(), shapes.0.len());
        for (id, shape) in shapes.0 {
            let state = record.get(&id).expect("every parameter has state");
            assert_eq!(state.rank(), shape.len());
        }
    }
}
