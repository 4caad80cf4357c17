//! Pipeline checkpoints (`hlat::checkpoint::sharded`, one file per stage × tensor-parallel rank):
//! a model cut into stages on `host` replicas writes exactly the host split, each stage's files
//! hold its layers under their model names and the shared tensors it uses, loading joins them
//! into the whole model bit for bit, and damaged folders are errors naming the file.

use std::collections::BTreeMap;
use std::path::Path;

use burn::module::Module;
use burn::tensor::{Device, TensorData};
use burn_store::burn_pack::{Tensor as PackTensor, Writer};
use burn_store::{BurnpackStore, ModuleStore, bridge};
use burn_trainium::collective::ReplicaGroups;
use burn_trainium::{ExecutorKind, TrainiumDevice};
use hlat::checkpoint::files::{PIPELINE_PARALLEL_FILE, is_sharded, stage_file};
use hlat::checkpoint::sharded::{StageLayout, read_stages, save_stages};
use hlat::checkpoint::{load_native, save_native};
use hlat::parallel::TensorParallel;
use hlat::pipeline::PipelineParallel;
use hlat::{Hlat, HlatConfig};

use super::sharded_checkpoint::shard_tensors;
use crate::{host, trainium};

/// `hlat-test` with `layers` layers, tied or not.
fn config(layers: usize, tied: bool) -> HlatConfig {
    HlatConfig {
        num_layers: layers,
        tie_word_embeddings: tied,
        ..HlatConfig::preset("hlat-test").unwrap()
    }
}

/// A model of `config` on `device` with its parameters drawn (the same on every replica).
fn model(config: &HlatConfig, device: &Device) -> Hlat {
    let model: Hlat = config.init(device);
    model.clone().load_record(model.into_record())
}

/// Every parameter's values, in visiting order.
fn parameters(model: &Hlat) -> Vec<TensorData> {
    test_support::module::parameters(model)
}

/// The parameters of `whole` as one host device holds them (saved and loaded natively).
fn on_host(whole: &Hlat, dir: &Path) -> Vec<TensorData> {
    save_native(whole, whole.config(), dir).unwrap();
    let (_, model) = load_native(dir, &host()).unwrap();
    parameters(&model)
}

/// The layers named in a shard file's tensors, and its other (shared) tensors.
fn contents(tensors: &BTreeMap<String, TensorData>) -> (Vec<usize>, Vec<String>) {
    let mut layers = Vec::new();
    let mut shared = Vec::new();
    for name in tensors.keys() {
        match name.strip_prefix("layers.") {
            Some(rest) => layers.push(rest.split('.').next().unwrap().parse().unwrap()),
            None => shared.push(name.clone()),
        }
    }
    layers.sort_unstable();
    layers.dedup();
    (layers, shared)
}

/// Every file of a pipeline checkpoint of `stages` × `degree`, by name.
fn files(dir: &Path, stages: usize, degree: usize) -> Vec<(String, BTreeMap<String, TensorData>)> {
    (0..stages)
        .flat_map(|stage| (0..degree).map(move |rank| stage_file(stage, stages, rank, degree)))
        .map(|name| {
            let tensors = shard_tensors(&dir.join(&name));
            (name, tensors)
        })
        .collect()
}

/// pp 2 × tp 2 on `host:0-3` (tp ranks consecutive, stages outermost, as `hlat-train` lays them
/// out), 5 layers cut 3 + 2 and 6 layers interleaved (chunks of 2, 1, 1, 2 layers: stage 0
/// holds layers 0, 1, 4 and stage 1 layers 2, 3, 5, each with a padding slot), untied and tied: each stage's replicas write exactly the host split, the files hold the
/// stage's real layers by model name and its shared tensors, and loading gives the whole model
/// bit for bit; merged and split again, the same files.
#[test]
fn stages_write_the_host_split_and_join_back_into_the_whole_model_bit_exactly() {
    let device = trainium(TrainiumDevice::replicated(ExecutorKind::Host, 4));
    let tensor_parallel = TensorParallel {
        groups: ReplicaGroups::contiguous(4, 2).unwrap(),
        sequence_parallel: false,
    };
    let stage_groups = || ReplicaGroups::strided(4, 2).unwrap();
    let pipelines = [
        PipelineParallel::with_layers(stage_groups(), vec![3, 2], 5, 1).unwrap(),
        PipelineParallel::with_layers(stage_groups(), vec![2, 1, 1, 2], 6, 2).unwrap(),
    ];
    for tied in [false, true] {
        for pipeline in &pipelines {
            let config = config(pipeline.chunk_layers.iter().sum(), tied);
            let whole = model(&config, &device);
            let what = format!("tied {tied}, layers {:?}", pipeline.chunk_layers);
            let folder = tempfile::tempdir().unwrap();
            let expected = on_host(&whole, &folder.path().join("whole"));
            let layout = StageLayout::of_pipeline(pipeline, 2);
            let from_host = folder.path().join("host");
            save_stages(&whole, layout.clone(), None, &from_host).unwrap();
            let staged = whole
                .clone()
                .shard(&tensor_parallel)
                .into_stages(pipeline)
                .unwrap();
            let from_replicas = folder.path().join("replicas");
            read_stages(&staged, pipeline, 2, &from_replicas)
                .unwrap()
                .write(&config, None, &from_replicas)
                .unwrap();

            let written = files(&from_replicas, 2, 2);
            assert_eq!(written, files(&from_host, 2, 2), "{what}");
            for (name, tensors) in &written {
                let stage = usize::from(name.contains("stage-01"));
                let (layers, shared) = contents(tensors);
                assert_eq!(layers, pipeline.stage_layers(stage), "{what}: {name}");
                let mut expected_shared: Vec<&str> = match (stage, tied) {
                    (0, _) => vec!["embed_tokens.weight"],
                    (_, false) => vec!["lm_head.weight", "norm.weight"],
                    (_, true) => vec!["embed_tokens.weight", "norm.weight"],
                };
                expected_shared.sort_unstable();
                assert_eq!(shared, expected_shared, "{what}: {name}");
            }
            let recorded: StageLayout = serde_json::from_str(
                &std::fs::read_to_string(from_replicas.join(PIPELINE_PARALLEL_FILE)).unwrap(),
            )
            .unwrap();
            assert_eq!(recorded, layout, "{what}");
            assert!(is_sharded(&from_replicas));

            let (_, joined) = load_native(&from_replicas, &host())
                .unwrap_or_else(|error| panic!("{what}: {error}"));
            assert_eq!(parameters(&joined), expected, "{what}");
            // Merged into one native checkpoint and split again: the same files.
            let merged = folder.path().join("merged");
            save_native(&joined, joined.config(), &merged).unwrap();
            let (_, reloaded) = load_native(&merged, &host()).unwrap();
            let again = folder.path().join("again");
            save_stages(&reloaded, layout, None, &again).unwrap();
            assert_eq!(files(&again, 2, 2), written, "{what}");
        }
    }
}

/// Rewrites the shard `path` with `change` applied to its snapshots.
fn rewrite(path: &Path, change: impl Fn(Vec<PackTensor>) -> Vec<PackTensor>) {
    let snapshots: Vec<PackTensor> = BurnpackStore::from_file(path)
        .get_all_tensors()
        .unwrap()
        .values()
        .cloned()
        .collect();
    let damaged = path.with_extension("damaged");
    Writer::new(change(snapshots))
        .write_to_file(&damaged)
        .unwrap();
    std::fs::rename(&damaged, path).unwrap();
}

/// `snapshot` with every value `value`.
fn filled(snapshot: &PackTensor, value: f32) -> PackTensor {
    let values = vec![value; snapshot.shape.num_elements()];
    let data = TensorData::new(values, snapshot.shape.clone());
    let path = snapshot.name.clone();
    bridge::from_data(data, path, None)
}

/// The error of loading `dir`.
fn load_error(dir: &Path) -> String {
    match load_native(dir, &host()) {
        Ok(_) => panic!("{}: the damaged checkpoint loads", dir.display()),
        Err(error) => error.to_string(),
    }
}

/// A missing stage file, a tied embedding whose copies disagree, a replicated tensor whose tp
/// ranks disagree, a layer in the wrong stage, a layer missing, and a layout that does not
/// cover the model are each refused, naming the file.
#[test]
fn damaged_pipeline_checkpoints_are_errors_naming_the_file() {
    let config = config(5, true);
    let whole = model(&config, &host());
    let layout = StageLayout::new(vec![vec![0, 1, 2], vec![3, 4]], 2);
    let folder = tempfile::tempdir().unwrap();
    let fresh = |name: &str| {
        let dir = folder.path().join(name);
        save_stages(&whole, layout.clone(), None, &dir).unwrap();
        dir
    };
    let last = stage_file(1, 2, 1, 2);
    let first = stage_file(0, 2, 0, 2);

    let dir = fresh("missing");
    std::fs::remove_file(dir.join(&last)).unwrap();
    let error = load_error(&dir);
    assert!(
        error.contains(&last) && error.contains("missing"),
        "{error}"
    );

    // The last stage's copy of the tied embedding (both ranks, so that the tp join agrees).
    let dir = fresh("tied");
    for rank in 0..2 {
        rewrite(&dir.join(stage_file(1, 2, rank, 2)), |snapshots| {
            snapshots
                .iter()
                .map(|s| match s.name.as_str() {
                    "embed_tokens.weight" => filled(s, 0.25),
                    _ => s.clone(),
                })
                .collect()
        });
    }
    let error = load_error(&dir);
    assert!(
        error.contains(&stage_file(1, 2, 0, 2)) && error.contains("`embed_tokens.weight` differs"),
        "{error}"
    );

    // Rank 1 of stage 1 disagrees on the final norm's gain.
    let dir = fresh("replicated");
    rewrite(&dir.join(&last), |snapshots| {
        snapshots
            .iter()
            .map(|s| match s.name.as_str() {
                "norm.weight" => filled(s, 0.5),
                _ => s.clone(),
            })
            .collect()
    });
    let error = load_error(&dir);
    assert!(
        error.contains(&last) && error.contains("differs"),
        "{error}"
    );

    // Stage 0's files hold a tensor of layer 3 (stage 1's) too.
    let dir = fresh("wrong stage");
    for rank in 0..2 {
        rewrite(&dir.join(stage_file(0, 2, rank, 2)), |mut snapshots| {
            let stray = snapshots
                .iter()
                .find(|s| s.name == "layers.0.input_layernorm.weight")
                .unwrap();
            let path = stray.name.replacen("layers.0.", "layers.3.", 1);
            let data = bridge::to_data(stray).unwrap();
            snapshots.push(bridge::from_data(data, path, None));
            snapshots
        });
    }
    let error = load_error(&dir);
    assert!(
        error.contains(&first) && error.contains("`layers.3.input_layernorm.weight`"),
        "{error}"
    );

    // Stage 0's files lack a tensor of layer 1.
    let dir = fresh("layer missing");
    for rank in 0..2 {
        rewrite(&dir.join(stage_file(0, 2, rank, 2)), |snapshots| {
            snapshots
                .into_iter()
                .filter(|s| s.name != "layers.1.mlp.up_proj.weight")
                .collect()
        });
    }
    let error = load_error(&dir);
    assert!(
        error.contains(&first) && error.contains("`layers.1.mlp.up_proj.weight`"),
        "{error}"
    );

    // A layout listing layer 2 twice and layer 4 nowhere.
    let dir = fresh("layout");
    let bad = StageLayout::new(vec![vec![0, 1, 2], vec![2, 3]], 2);
    std::fs::write(
        dir.join(PIPELINE_PARALLEL_FILE),
        serde_json::to_string(&bad).unwrap(),
    )
    .unwrap();
    let error = load_error(&dir);
    assert!(
        error.contains(PIPELINE_PARALLEL_FILE) && error.contains("layer 2"),
        "{error}"
    );

    // Writing refuses a layout that leaves a layer out.
    let error = save_stages(
        &whole,
        StageLayout::new(vec![vec![0, 1], vec![3, 4]], 1),
        None,
        &folder.path().join("gap"),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(error.contains("no stage lists layer 2"), "{error}");
    assert!(!folder.path().join("gap").exists());
}
