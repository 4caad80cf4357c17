//! `hlat::merge` against mergekit itself: every configuration of `fixtures/mergekit/configs`,
//! merged here, gives every tensor mergekit wrote for it (`fixtures/mergekit/expected`, made by
//! `fixtures/regenerate_mergekit.py` with mergekit 0.1.5) within 1e-6 relative to the tensor's
//! largest magnitude, with the same names, shapes, layer count and tied embeddings.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use hlat::merge::{MergeConfig, merge};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

use crate::fixture;

/// The configurations, each exercising what its name says (see the regeneration script).
const MERGES: &[&str] = &[
    "linear",
    "linear_bf16",
    "slerp",
    "slerp_slices",
    "task_arithmetic",
    "ties",
    "ties_unnormalized",
    "breadcrumbs",
    "breadcrumbs_ties",
    "model_stock",
    "model_stock_filter_wise",
    "nuslerp",
    "nuslerp_base_row_wise",
    "multislerp",
    "multislerp_base",
    "karcher",
    "sce",
    "nearswap",
    "arcee_fusion",
    "passthrough",
    "tied_linear",
    "qwen2_slerp",
    "qwen2_ties",
    "qwen3_task_arithmetic",
];

/// A tensor's shape and values (as f32).
pub(crate) type Tensors = BTreeMap<String, (Vec<usize>, Vec<f32>)>;

/// Every tensor of a folder's `model.safetensors`, which must be float32.
pub(crate) fn read_tensors(dir: &Path) -> Tensors {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    file.tensors()
        .into_iter()
        .map(|(name, view)| {
            assert_eq!(view.dtype(), Dtype::F32, "{}: {name}", dir.display());
            let values = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            (name, (view.shape().to_vec(), values))
        })
        .collect()
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn mergekit_folder() -> PathBuf {
    fixture("mergekit")
}

/// Merges `configs/NAME.yaml` into `work/NAME` and returns the output folder.
fn merge_fixture(work: &Path, name: &str) -> PathBuf {
    let path = mergekit_folder().join(format!("configs/{name}.yaml"));
    let config = MergeConfig::from_file(&path)
        .unwrap()
        .with_models_in(&mergekit_folder());
    let out = work.join(name);
    merge(&config, &out).unwrap_or_else(|error| panic!("{name}: {error}"));
    out
}

/// The largest difference between `actual` and `expected`, relative to the largest magnitude of
/// the expected tensor, with where it is. (mergekit computes in float32: its rounding is of
/// order 1e-7 of the values it adds, so an element that cancels to near 0 keeps that absolute
/// error; hlat computes in f64.)
fn largest_difference(actual: &Tensors, expected: &Tensors) -> (f64, String) {
    let mut largest = (0.0, String::new());
    for (name, (shape, values)) in expected {
        let (actual_shape, actual_values) = &actual[name];
        assert_eq!(actual_shape, shape, "{name}");
        let scale = values
            .iter()
            .fold(0.0f32, |m, v| m.max(v.abs()))
            .max(f32::MIN_POSITIVE);
        for (index, (a, e)) in actual_values.iter().zip(values).enumerate() {
            let difference = f64::from((a - e).abs()) / f64::from(scale);
            if difference > largest.0 {
                largest = (difference, format!("{name}[{index}]: {a}, mergekit {e}"));
            }
        }
    }
    largest
}

#[test]
fn every_deterministic_method_gives_mergekits_tensors() {
    let work = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    let mut configs: Vec<String> = std::fs::read_dir(mergekit_folder().join("configs"))
        .unwrap()
        .map(|entry| {
            let path = entry.unwrap().path();
            path.file_stem().unwrap().to_string_lossy().into_owned()
        })
        .collect();
    configs.sort();
    let mut listed: Vec<String> = MERGES.iter().map(|name| name.to_string()).collect();
    listed.sort();
    assert_eq!(configs, listed, "every fixture configuration is checked");
    for name in MERGES {
        let out = merge_fixture(work.path(), name);
        let expected_dir = mergekit_folder().join(format!("expected/{name}"));
        let (actual, expected) = (read_tensors(&out), read_tensors(&expected_dir));
        assert_eq!(
            actual.keys().collect::<Vec<_>>(),
            expected.keys().collect::<Vec<_>>(),
            "{name}: the same tensor names"
        );
        let (difference, place) = largest_difference(&actual, &expected);
        eprintln!("{name}: largest relative difference {difference:.2e} at {place}");
        if difference > 1e-6 {
            failures.push(format!("{name}: {difference:.2e} at {place}"));
        }
        let (config, expected_config) = (
            read_json(&out.join("config.json")),
            read_json(&expected_dir.join("config.json")),
        );
        for field in [
            "architectures",
            "num_hidden_layers",
            "tie_word_embeddings",
            "vocab_size",
            "hidden_size",
            "dtype",
        ] {
            assert_eq!(config[field], expected_config[field], "{name}: `{field}`");
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn merges_of_each_family_keep_its_tensors_and_tied_embeddings() {
    let work = tempfile::tempdir().unwrap();
    let families = [
        ("tied_linear", "tied-a", true),
        ("qwen2_slerp", "qwen2-a", true),
        ("qwen2_ties", "qwen2-a", true),
        ("qwen3_task_arithmetic", "qwen3-a", false),
    ];
    for (name, input, tied) in families {
        let out = merge_fixture(work.path(), name);
        let config = read_json(&out.join("config.json"));
        assert_eq!(config["tie_word_embeddings"], Value::Bool(tied), "{name}");
        let merged = read_tensors(&out);
        assert_eq!(merged.contains_key("lm_head.weight"), !tied, "{name}");
        // The same names and shapes as the inputs: biases and q/k norms come along.
        let inputs = read_tensors(&mergekit_folder().join(format!("models/{input}")));
        let shapes = |tensors: &Tensors| -> Vec<(String, Vec<usize>)> {
            tensors
                .iter()
                .map(|(name, (shape, _))| (name.clone(), shape.clone()))
                .collect()
        };
        assert_eq!(shapes(&merged), shapes(&inputs), "{name}");
    }
    let qwen2 = read_tensors(&work.path().join("qwen2_slerp"));
    assert!(qwen2.contains_key("model.layers.3.self_attn.q_proj.bias"));
    let qwen3 = read_tensors(&work.path().join("qwen3_task_arithmetic"));
    assert!(qwen3.contains_key("model.layers.3.self_attn.k_norm.weight"));
}

#[test]
fn passthrough_slices_stack_layers_and_renumber_them() {
    let work = tempfile::tempdir().unwrap();
    let out = merge_fixture(work.path(), "passthrough");
    assert_eq!(read_json(&out.join("config.json"))["num_hidden_layers"], 6);
    let merged = read_tensors(&out);
    let a = read_tensors(&mergekit_folder().join("models/llama-a"));
    let b = read_tensors(&mergekit_folder().join("models/llama-b"));
    // Output layers 0-2 are A's 0-2; 3-5 are B's 1-3, `o_proj` scaled by 0.5.
    let layer = |tensors: &Tensors, index: usize, suffix: &str| {
        tensors[&format!("model.layers.{index}.{suffix}")].1.clone()
    };
    assert_eq!(
        layer(&merged, 2, "mlp.up_proj.weight"),
        layer(&a, 2, "mlp.up_proj.weight")
    );
    assert_eq!(
        layer(&merged, 3, "mlp.up_proj.weight"),
        layer(&b, 1, "mlp.up_proj.weight")
    );
    let halved: Vec<f32> = layer(&b, 3, "self_attn.o_proj.weight")
        .iter()
        .map(|v| v * 0.5)
        .collect();
    assert_eq!(layer(&merged, 5, "self_attn.o_proj.weight"), halved);
    assert!(!merged.contains_key("model.layers.6.mlp.up_proj.weight"));
}
