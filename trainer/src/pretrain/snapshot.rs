//! [`CheckpointSnapshot`]: a checkpoint of a pretraining run copied into host memory. Reading it
//! ([`CheckpointSnapshot::read`]) does every device read and every collective a checkpoint needs,
//! on the training thread and at the same point in every process; writing it
//! ([`CheckpointSnapshot::write`]) touches files only, so a thread of its own can do it while
//! training goes on.

use std::path::Path;

use burn::module::Module;
use burn::tensor::{DType, Device};
use hlat::checkpoint::run_folder::MODEL_DIR;
use hlat::checkpoint::sharded::RankShards;
use hlat::lora::LoraConfig;
use hlat::{Hlat, HlatConfig, Tokenizer};

use crate::checkpoint_state::{CheckpointState, OptimizerSnapshot, sync, write_state};
use crate::data::TextTokenizer;
use crate::error::TrainError;
use crate::language_model::LanguageModel;
use crate::optimizer::OptimizerRecord;
use crate::parallel::ParallelLayout;
use crate::precision::cast_params;

use super::run::RunOutputs;

/// What a checkpoint holds, in host memory (see the module documentation).
pub(super) struct CheckpointSnapshot {
    /// The step it is the checkpoint of.
    pub step: u64,
    /// The model, when this process writes it (rank 0).
    model: Option<ModelSnapshot>,
    /// The LoRA adapters of a run that trains them, when this process writes them.
    adapter: Option<AdapterSnapshot>,
    /// This process's share of the optimizer state.
    optimizer: OptimizerSnapshot,
    /// `state.json`, written last.
    state: CheckpointState,
}

/// The model of a checkpoint, in f32 whatever the training precision (bf16 → f32 is exact; the
/// loader casts back), so that any tool can read it, with the run's tokenizer.
struct ModelSnapshot {
    weights: ModelWeights,
    /// The whole model's configuration.
    config: HlatConfig,
    tokenizer: Option<Tokenizer>,
}

/// A checkpoint's model weights on the host.
enum ModelWeights {
    /// The whole model (on Flex), for the native layout.
    Whole(Box<Hlat>),
    /// A split model's shards, one file per tensor-parallel rank (or stage and rank).
    Shards(RankShards),
}

/// The LoRA adapters of a checkpoint: the whole model with its adapters, on the host.
struct AdapterSnapshot {
    hlat: Hlat,
    lora: LoraConfig,
    base_model: Option<String>,
}

impl CheckpointSnapshot {
    /// Copies the checkpoint of `model` after `state.progress` into host memory (see the module
    /// documentation; every process of a job calls this at the same point).
    pub fn read(
        outputs: &RunOutputs,
        model: &LanguageModel,
        state: CheckpointState,
    ) -> Result<Self, TrainError> {
        let config = &outputs.config;
        let layout = config.layout();
        // Experts split over ranks are saved whole, with their optimizer state, and so are
        // parameters kept in slices (their state is joined as ZeRO-1's).
        let mut record = outputs.optimizer.lock().to_record();
        let gathered = model.gathered();
        let model = gathered.as_ref().unwrap_or(model);
        let joined = join_experts(model, &mut record, &layout);
        let model = joined.as_ref().unwrap_or(model);
        let model_snapshot = read_model(outputs, model)?;
        let adapter = read_adapter(outputs, model)?;
        let optimizer = OptimizerSnapshot::read(
            record,
            model,
            &layout,
            model.pipeline.as_ref(),
            outputs.share,
        )?;
        Ok(Self {
            step: state.progress.step,
            model: model_snapshot,
            adapter,
            optimizer,
            state,
        })
    }

    /// Bytes of host memory the snapshot holds (the model, adapters and optimizer state).
    pub fn bytes(&self) -> u64 {
        let model = self.model.as_ref().map_or(0, ModelSnapshot::bytes);
        let adapter = self.adapter.as_ref().map_or(0, |adapter| {
            f32_bytes(&adapter.hlat) - f32_bytes(&adapter.hlat.clone().without_lora())
        });
        model + adapter + self.optimizer.bytes()
    }

    /// Writes the checkpoint's files into the folder `dir`, `state.json` last.
    pub fn write(self, dir: &Path) -> Result<(), TrainError> {
        if let Some(model) = self.model {
            model.write(&dir.join(MODEL_DIR))?;
        }
        if let Some(adapter) = self.adapter {
            adapter.write(&dir.join(super::ADAPTER_DIR))?;
        }
        self.optimizer.write(dir)?;
        write_state(dir, &self.state)
    }
}

/// Bytes of `hlat`'s parameters in f32.
fn f32_bytes(hlat: &Hlat) -> u64 {
    hlat.num_params() as u64 * 4
}

impl ModelSnapshot {
    /// Bytes of host memory the weights hold.
    fn bytes(&self) -> u64 {
        match &self.weights {
            ModelWeights::Whole(hlat) => f32_bytes(hlat),
            ModelWeights::Shards(shards) => shards.bytes(),
        }
    }

    fn write(self, model_dir: &Path) -> Result<(), TrainError> {
        let tokenizer = self.tokenizer.as_ref();
        match self.weights {
            ModelWeights::Whole(hlat) => hlat::checkpoint::save_native_with_tokenizer(
                &hlat,
                &self.config,
                tokenizer,
                model_dir,
            ),
            ModelWeights::Shards(shards) => shards.write(&self.config, tokenizer, model_dir),
        }
        .map_err(model_error)
    }
}

impl AdapterSnapshot {
    fn write(self, dir: &Path) -> Result<(), TrainError> {
        hlat::hf::adapter::save_adapter(
            &self.hlat,
            &self.lora,
            self.base_model.as_deref(),
            hlat::hf::WeightDtype::F32,
            dir,
        )
        .map_err(|error| TrainError::Model(format!("{}: {error}", dir.display())))
    }
}

fn model_error(error: hlat::checkpoint::CheckpointError) -> TrainError {
    TrainError::Model(error.to_string())
}

/// `hlat` on the host: every parameter read from the device.
fn on_host(hlat: Hlat) -> Hlat {
    hlat.to_device(&Device::flex())
}

/// `model` with the whole set of experts on every rank, and the experts' optimizer state in
/// `record` joined with them, when its experts are split (a collective every process runs);
/// `None` otherwise.
fn join_experts(
    model: &LanguageModel,
    record: &mut OptimizerRecord,
    layout: &ParallelLayout,
) -> Option<LanguageModel> {
    model.hlat.expert_parallel()?;
    let joined = model.hlat.clone().join_experts();
    crate::parallel::reshard_expert_states(
        &model.hlat,
        &joined,
        record,
        (
            crate::parallel::ExpertStates::Join,
            layout.zero1_of_experts().as_ref(),
        ),
    );
    Some(LanguageModel {
        hlat: joined,
        ..model.clone()
    })
}

/// Reads the checkpoint's model, in f32, when this process writes it. Only rank 0 of a job
/// writes (and reads) it: its replicas hold every tensor-parallel rank, and the others queue
/// nothing they would not run.
///
/// A pipelined model is read as one shard per stage and tensor-parallel rank, each from its
/// stage's replica (`hlat::checkpoint::sharded::read_stages`), when rank 0's replicas hold
/// every stage (one process). When the stages span the job's processes, rank 0 cannot read the
/// others' replicas: every process then joins the stages on the device (`Hlat::from_stages`, a
/// collective over the pipeline groups that every process must run), and rank 0 reads the
/// joined model as a run without pipeline stages does.
fn read_model(
    outputs: &RunOutputs,
    model: &LanguageModel,
) -> Result<Option<ModelSnapshot>, TrainError> {
    let tokenizer = || {
        outputs
            .tokenizer
            .as_ref()
            .map(TextTokenizer::inner)
            .cloned()
    };
    let degree = model
        .tensor_parallel
        .as_ref()
        .map_or(1, |parallel| parallel.groups.group_size());
    let mut hlat = None;
    if let Some(pipeline) = &model.pipeline {
        let local = burn_trainium::collective::replica_count(&outputs.device)
            / outputs.share.processes.max(1);
        let replicas = hlat::checkpoint::sharded::stage_replicas(pipeline, degree);
        if replicas.iter().flatten().all(|&replica| replica < local) {
            if !outputs.share.writes_model() {
                return Ok(None);
            }
            let staged = cast_params(model.hlat.valid(), DType::F32);
            let shards = hlat::checkpoint::sharded::read_stages(
                &staged,
                pipeline,
                degree,
                Path::new(MODEL_DIR),
            )
            .map_err(model_error)?;
            return Ok(Some(ModelSnapshot {
                weights: ModelWeights::Shards(shards),
                config: staged.config().clone(),
                tokenizer: tokenizer(),
            }));
        }
        let joined = cast_params(model.hlat.valid(), DType::F32).from_stages(pipeline);
        sync(model)
            .map_err(|error| TrainError::Model(format!("joining the pipeline stages: {error}")))?;
        hlat = Some(joined);
    }
    if !outputs.share.writes_model() {
        return Ok(None);
    }
    // The base weights alone: the adapters go to their own PEFT folder (`read_adapter`).
    let hlat = hlat
        .unwrap_or_else(|| cast_params(model.hlat.valid(), DType::F32))
        .without_lora();
    let config = hlat.config().clone();
    let weights = match &model.tensor_parallel {
        Some(_) => ModelWeights::Shards(
            hlat::checkpoint::sharded::read_ranks(&hlat, degree, Path::new(MODEL_DIR))
                .map_err(model_error)?,
        ),
        None => ModelWeights::Whole(Box::new(on_host(hlat))),
    };
    Ok(Some(ModelSnapshot {
        weights,
        config,
        tokenizer: tokenizer(),
    }))
}

/// Reads the LoRA adapters of `model` (a run with `lora` set), in f32, when this process writes
/// them. Under tensor parallelism the split factors are joined first (a collective every process
/// runs); rank 0 writes.
fn read_adapter(
    outputs: &RunOutputs,
    model: &LanguageModel,
) -> Result<Option<AdapterSnapshot>, TrainError> {
    let Some(lora) = &outputs.config.lora else {
        return Ok(None);
    };
    let hlat = cast_params(model.hlat.valid(), DType::F32);
    let hlat = match &model.tensor_parallel {
        Some(parallel) => hlat.unshard(parallel),
        None => hlat,
    };
    if !outputs.share.writes_model() {
        return Ok(None);
    }
    Ok(Some(AdapterSnapshot {
        hlat: on_host(hlat),
        lora: lora.clone(),
        base_model: outputs.base_model.clone(),
    }))
}
