//! Tensor-parallel checkpoints (`hlat::checkpoint::sharded`): splitting on the host and joining
//! back is bit-exact, a sharded model's ranks write exactly the host split, and damaged shards
//! are errors naming the file.

use std::collections::BTreeMap;
use std::path::Path;

use crate::{host, trainium};
use burn::module::Module;
use burn::tensor::{Device, TensorData};
use burn_store::burn_pack::{Tensor as PackTensor, Writer};
use burn_store::{BurnpackStore, ModuleStore, bridge};
use burn_trainium::collective::ReplicaGroups;
use burn_trainium::{ExecutorKind, TrainiumDevice};
use hlat::checkpoint::files::{TENSOR_PARALLEL_FILE, rank_file};
use hlat::checkpoint::sharded::{read_ranks, save_split};
use hlat::checkpoint::{load_native, save_native};
use hlat::parallel::TensorParallel;
use hlat::{Hlat, HlatConfig};

/// Every parameter's values, in visiting order.
fn parameters(model: &Hlat) -> Vec<TensorData> {
    test_support::module::parameters(model)
}

/// A shard file's tensors (a tensor-parallel rank's, or a pipeline stage's) by path.
pub(super) fn shard_tensors(path: &Path) -> BTreeMap<String, TensorData> {
    BurnpackStore::from_file(path)
        .get_all_tensors()
        .unwrap()
        .iter()
        .map(|(name, snapshot)| (name.clone(), bridge::to_data(snapshot).unwrap()))
        .collect()
}

fn model(device: &Device) -> Hlat {
    let config = HlatConfig::preset("hlat-test").unwrap();
    let model: Hlat = config.init(device);
    model.clone().load_record(model.into_record())
}

#[test]
fn a_split_checkpoint_joins_back_bit_exactly() {
    let device = host();
    let whole = model(&device);
    let folder = tempfile::tempdir().unwrap();
    let sharded = folder.path().join("tp2");
    save_split(&whole, 2, None, &sharded).unwrap();

    let ranks: Vec<_> = (0..2)
        .map(|rank| shard_tensors(&sharded.join(rank_file(rank, 2))))
        .collect();
    let up = "layers.0.mlp.up_proj.weight";
    let down = "layers.0.mlp.down_proj.weight";
    let norm = "layers.0.input_layernorm.weight";
    let ffn = whole.config().ffn_size;
    let hidden = whole.config().hidden_size;
    assert_eq!(
        ranks[0][up].shape().to_vec(),
        [hidden, ffn / 2],
        "column-parallel"
    );
    assert_eq!(
        ranks[1][down].shape().to_vec(),
        [ffn / 2, hidden],
        "row-parallel"
    );
    assert_eq!(ranks[0][norm], ranks[1][norm], "replicated");

    let (_, joined) = load_native(&sharded, &device).unwrap();
    assert_eq!(parameters(&joined), parameters(&whole));
    // Merged into one native checkpoint and split again: the same rank files.
    let merged = folder.path().join("merged");
    save_native(&joined, joined.config(), &merged).unwrap();
    let (_, reloaded) = load_native(&merged, &device).unwrap();
    let again = folder.path().join("again");
    save_split(&reloaded, 2, None, &again).unwrap();
    for (rank, tensors) in ranks.iter().enumerate() {
        assert_eq!(&shard_tensors(&again.join(rank_file(rank, 2))), tensors);
    }
}

#[test]
fn the_ranks_of_a_sharded_model_write_the_host_split() {
    let device = trainium(TrainiumDevice::replicated(ExecutorKind::Host, 2));
    let whole = model(&device);
    let parallel = TensorParallel {
        groups: ReplicaGroups::all(2),
        sequence_parallel: false,
    };
    let folder = tempfile::tempdir().unwrap();
    let from_host = folder.path().join("host");
    let from_ranks = folder.path().join("ranks");
    save_split(&whole, 2, None, &from_host).unwrap();
    let sharded = whole.clone().shard(&parallel);
    read_ranks(&sharded, 2, &from_ranks)
        .unwrap()
        .write(whole.config(), None, &from_ranks)
        .unwrap();
    for rank in 0..2 {
        let name = rank_file(rank, 2);
        assert_eq!(
            shard_tensors(&from_ranks.join(&name)),
            shard_tensors(&from_host.join(&name)),
            "{name}"
        );
    }
}

#[test]
fn damaged_shards_are_errors_naming_the_file() {
    let device = host();
    let whole = model(&device);
    let folder = tempfile::tempdir().unwrap();
    let sharded = folder.path().join("tp2");
    save_split(&whole, 2, None, &sharded).unwrap();

    // A rank whose replicated tensor (the final norm's gain) disagrees with rank 0's.
    let rank1 = rank_file(1, 2);
    let snapshots: Vec<PackTensor> = BurnpackStore::from_file(sharded.join(&rank1))
        .get_all_tensors()
        .unwrap()
        .values()
        .map(|snapshot| {
            if snapshot.name != "norm.weight" {
                return snapshot.clone();
            }
            let gain = vec![0.5f32; snapshot.shape.num_elements()];
            let data = TensorData::new(gain, snapshot.shape.clone());
            let path = snapshot.name.clone();
            bridge::from_data(data, path, None)
        })
        .collect();
    let damaged = folder.path().join("damaged.bpk");
    Writer::new(snapshots).write_to_file(&damaged).unwrap();
    std::fs::rename(&damaged, sharded.join(&rank1)).unwrap();
    let error = load_native(&sharded, &device).err().unwrap().to_string();
    assert!(
        error.contains(&rank1) && error.contains("differs"),
        "{error}"
    );

    // A missing rank.
    std::fs::remove_file(sharded.join(&rank1)).unwrap();
    let error = load_native(&sharded, &device).err().unwrap().to_string();
    assert!(
        error.contains(&rank1) && error.contains("missing"),
        "{error}"
    );

    // A degree that does not divide the heads.
    let error = save_split(&whole, 3, None, &folder.path().join("tp3"))
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("tensor-parallel degree 3"), "{error}");
    std::fs::write(sharded.join(TENSOR_PARALLEL_FILE), "{\"degree\": 0}").unwrap();
    let error = load_native(&sharded, &device).err().unwrap().to_string();
    assert!(error.contains("degree"), "{error}");
}

/// Rewrites the rank file `path` with the tensor `name` set to `value` everywhere.
fn overwrite(path: &Path, name: &str, value: f32) {
    let snapshots: Vec<PackTensor> = BurnpackStore::from_file(path)
        .get_all_tensors()
        .unwrap()
        .values()
        .map(|snapshot| {
            if snapshot.name != name {
                return snapshot.clone();
            }
            let values = vec![value; snapshot.shape.num_elements()];
            let data = TensorData::new(values, snapshot.shape.clone());
            let path = snapshot.name.clone();
            bridge::from_data(data, path, None)
        })
        .collect();
    let damaged = path.with_extension("damaged");
    Writer::new(snapshots).write_to_file(&damaged).unwrap();
    std::fs::rename(&damaged, path).unwrap();
}

/// At tp 4 the 2 KV heads of `hlat-test` are each held by 2 ranks: every rank file holds its
/// rank's head (ranks 0 and 1 head 0, ranks 2 and 3 head 1), the ranks of a sharded model write
/// exactly that, the checkpoint loads as the whole model, and a copy that disagrees with its
/// head's first holder is an error naming its file.
#[test]
fn replicated_kv_heads_are_written_by_every_holder_and_joined_from_the_first() {
    let device = trainium(TrainiumDevice::replicated(ExecutorKind::Host, 4));
    let whole = model(&device);
    let config = whole.config().clone();
    assert_eq!(config.num_kv_heads, 2);
    let folder = tempfile::tempdir().unwrap();
    let from_host = folder.path().join("host");
    save_split(&whole, 4, None, &from_host).unwrap();
    let ranks: Vec<_> = (0..4)
        .map(|rank| shard_tensors(&from_host.join(rank_file(rank, 4))))
        .collect();
    for name in [
        "layers.0.self_attn.k_proj.weight",
        "layers.1.self_attn.v_proj.weight",
    ] {
        assert_eq!(
            ranks[0][name].shape().to_vec(),
            [config.hidden_size, config.head_dim()],
            "{name}: one head per rank"
        );
        assert_eq!(ranks[0][name], ranks[1][name], "{name}: head 0's copies");
        assert_eq!(ranks[2][name], ranks[3][name], "{name}: head 1's copies");
        assert_ne!(ranks[1][name], ranks[2][name], "{name}: two heads");
    }
    let query = "layers.0.self_attn.q_proj.weight";
    assert_eq!(
        ranks[3][query].shape().to_vec(),
        [config.hidden_size, config.head_dim()],
        "one query head per rank"
    );

    // Loaded (on the host) as the whole model, bit for bit.
    let host = host();
    let (_, joined) = load_native(&from_host, &host).unwrap();
    let (_, expected) = {
        let merged = folder.path().join("whole");
        save_native(&whole, whole.config(), &merged).unwrap();
        load_native(&merged, &host).unwrap()
    };
    assert_eq!(parameters(&joined), parameters(&expected));

    // A model sharded over the 4 replicas writes the host split.
    let parallel = TensorParallel {
        groups: ReplicaGroups::all(4),
        sequence_parallel: false,
    };
    let from_ranks = folder.path().join("ranks");
    read_ranks(&whole.clone().shard(&parallel), 4, &from_ranks)
        .unwrap()
        .write(&config, None, &from_ranks)
        .unwrap();
    for (rank, tensors) in ranks.iter().enumerate() {
        let name = rank_file(rank, 4);
        assert_eq!(&shard_tensors(&from_ranks.join(&name)), tensors, "{name}");
    }

    // Rank 3's copy of head 1 no longer agrees with rank 2's.
    let rank3 = rank_file(3, 4);
    overwrite(
        &from_ranks.join(&rank3),
        "layers.1.self_attn.k_proj.weight",
        0.5,
    );
    let error = load_native(&from_ranks, &host).err().unwrap().to_string();
    assert!(
        error.contains(&rank3) && error.contains("KV head 1 differs from rank 2's"),
        "{error}"
    );
}
