//! Model merging (`hlat::merge`) on checkpoints made from the transformers fixture: each method
//! against its closed form at the ends of its range, mergekit's documented YAML accepted, and
//! clear errors for models that do not fit together.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use hlat::merge::{MergeConfig, MergeError, TensorPlace, evaluate, merge};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

use crate::fixture;

/// Every tensor of a folder's `model.safetensors`, as f32.
fn tensors(dir: &Path) -> BTreeMap<String, Vec<f32>> {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    file.tensors()
        .into_iter()
        .map(|(name, view)| {
            assert_eq!(view.dtype(), Dtype::F32, "{name}");
            let values = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            (name, values)
        })
        .collect()
}

/// A copy of the fixture in `dir` with every value `v` at index `i` of each tensor replaced by
/// `change(v, i)`.
fn variant(dir: &Path, change: impl Fn(f32, usize) -> f32) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let source = fixture("hf-tiny-llama");
    std::fs::copy(source.join("config.json"), dir.join("config.json")).unwrap();
    let bytes = std::fs::read(source.join("model.safetensors")).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let changed: Vec<(String, Vec<usize>, Vec<u8>)> = file
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let data = view
                .data()
                .chunks_exact(4)
                .enumerate()
                .flat_map(|(index, b)| {
                    change(f32::from_le_bytes([b[0], b[1], b[2], b[3]]), index).to_le_bytes()
                })
                .collect();
            (name, view.shape().to_vec(), data)
        })
        .collect();
    let views: Vec<(String, TensorView<'_>)> = changed
        .iter()
        .map(|(name, shape, data)| {
            (
                name.clone(),
                TensorView::new(Dtype::F32, shape.clone(), data).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    dir.to_path_buf()
}

/// Merges with the YAML `text` (model folders written as given) into `work/out-NAME`.
fn run(work: &Path, name: &str, text: &str) -> Result<BTreeMap<String, Vec<f32>>, MergeError> {
    let config = MergeConfig::from_yaml(text, &work.join(format!("{name}.yaml")))?;
    let out = work.join(format!("out-{name}"));
    merge(&config, &out)?;
    Ok(tensors(&out))
}

fn assert_close(
    actual: &BTreeMap<String, Vec<f32>>,
    expected: &BTreeMap<String, Vec<f32>>,
    what: &str,
) {
    assert_eq!(
        actual.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>()
    );
    for (name, values) in actual {
        for (index, (a, e)) in values.iter().zip(&expected[name]).enumerate() {
            assert!(
                (a - e).abs() <= 1e-6 * e.abs().max(1.0),
                "{what}: {name}[{index}] = {a}, expected {e}"
            );
        }
    }
}

/// Two models: the fixture `a` and `b`, every value of `a` moved by a pattern.
fn two_models(work: &Path) -> (PathBuf, PathBuf) {
    let a = variant(&work.join("a"), |value, _| value);
    let b = variant(&work.join("b"), |value, index| {
        value * 0.5 + ((index % 7) as f32 - 3.0) * 0.01
    });
    (a, b)
}

#[test]
fn linear_merge_of_identical_models_is_the_identity() {
    let work = tempfile::tempdir().unwrap();
    let (a, _) = two_models(work.path());
    let copy = variant(&work.path().join("copy"), |value, _| value);
    let text = format!(
        "models:\n  - model: {}\n    parameters:\n      weight: 0.3\n  - model: {}\n    parameters:\n      weight: 0.7\nmerge_method: linear\ndtype: float32\n",
        a.display(),
        copy.display()
    );
    let merged = run(work.path(), "linear", &text).unwrap();
    assert_eq!(merged, tensors(&a), "bit for bit");
    // The output is a Hugging Face folder transformers can read: its configuration came along.
    let config = std::fs::read_to_string(work.path().join("out-linear/config.json")).unwrap();
    assert!(config.contains("\"torch_dtype\": \"float32\""), "{config}");
}

#[test]
fn slerp_returns_its_ends_at_t_0_and_1() {
    let work = tempfile::tempdir().unwrap();
    let (a, b) = two_models(work.path());
    for (t, end) in [(0.0, &a), (1.0, &b)] {
        let text = format!(
            "slices:\n  - sources:\n      - model: {a}\n        layer_range: [0, 2]\n      - model: {b}\n        layer_range: [0, 2]\nmerge_method: slerp\nbase_model: {a}\nparameters:\n  t: {t}\ndtype: float32\n",
            a = a.display(),
            b = b.display()
        );
        let merged = run(work.path(), &format!("slerp-{t}"), &text).unwrap();
        assert_close(&merged, &tensors(end), &format!("slerp t = {t}"));
    }
}

#[test]
fn ties_of_one_model_at_density_1_equals_task_arithmetic_and_its_closed_form() {
    let work = tempfile::tempdir().unwrap();
    let (a, b) = two_models(work.path());
    let config = |method: &str, weight: f64| {
        format!(
            "models:\n  - model: {a}\n  - model: {b}\n    parameters:\n      weight: {weight}\n      density: 1.0\nmerge_method: {method}\nbase_model: {a}\ndtype: float32\n",
            a = a.display(),
            b = b.display()
        )
    };
    let ties = run(work.path(), "ties", &config("ties", 1.0)).unwrap();
    let arithmetic = run(work.path(), "arithmetic", &config("task_arithmetic", 1.0)).unwrap();
    assert_eq!(ties, arithmetic);
    assert_close(&arithmetic, &tensors(&b), "a + 1·(b − a)");
    // Half of the task vector is the midpoint; DARE at density 1 keeps every difference.
    let half = run(work.path(), "half", &config("task_arithmetic", 0.5)).unwrap();
    let dare = run(work.path(), "dare", &config("dare_linear", 0.5)).unwrap();
    assert_eq!(half, dare);
    let (ta, tb) = (tensors(&a), tensors(&b));
    let midpoint = ta
        .iter()
        .map(|(name, values)| {
            let mid = values
                .iter()
                .zip(&tb[name])
                .map(|(x, y)| (x + y) / 2.0)
                .collect();
            (name.clone(), mid)
        })
        .collect();
    assert_close(&half, &midpoint, "a + 0.5·(b − a)");
}

#[test]
fn a_configuration_written_as_mergekit_documents_it_is_accepted() {
    // The TIES example of mergekit's README, with its density and weight gradients.
    let text = "\
models:
  - model: psmathur/orca_mini_v3_13b
    parameters:
      density: [1, 0.7, 0.1] # density gradient
      weight: 1.0
  - model: garage-bAInd/Platypus2-13B
    parameters:
      density: 0.5
      weight: [0, 0.3, 0.7, 1] # weight gradient
  - model: WizardLM/WizardMath-13B-V1.0
    parameters:
      density: 0.33
      weight:
        - filter: mlp
          value: 0.5
        - value: 0
merge_method: ties
base_model: TheBloke/Llama-2-13B-fp16
parameters:
  normalize: true
  int8_mask: true
dtype: float16
";
    let config = MergeConfig::from_yaml(text, Path::new("ties.yml")).unwrap();
    assert_eq!(config.models.len(), 3);
    let first = TensorPlace::of("model.layers.0.mlp.up_proj.weight", 41);
    let middle = TensorPlace::of("model.layers.20.self_attn.q_proj.weight", 41);
    let last = TensorPlace::of("lm_head.weight", 41);
    let gradient = &config.models[1].parameters["weight"];
    assert_eq!(evaluate(gradient, &first).unwrap(), 0.0);
    assert!((evaluate(gradient, &middle).unwrap() - 0.5).abs() < 1e-12);
    assert_eq!(evaluate(gradient, &last).unwrap(), 1.0);
    let filtered = &config.models[2].parameters["weight"];
    assert_eq!(evaluate(filtered, &first).unwrap(), 0.5);
    assert_eq!(evaluate(filtered, &middle).unwrap(), 0.0);
}

#[test]
fn models_that_do_not_fit_together_are_refused_by_name() {
    let work = tempfile::tempdir().unwrap();
    let (a, _) = two_models(work.path());
    // Another architecture: one more layer in the configuration.
    let other = variant(&work.path().join("other"), |value, _| value);
    let config = std::fs::read_to_string(other.join("config.json")).unwrap();
    std::fs::write(
        other.join("config.json"),
        config.replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3"),
    )
    .unwrap();
    let text = |b: &Path| {
        format!(
            "models:\n  - model: {}\n  - model: {}\nmerge_method: linear\n",
            a.display(),
            b.display()
        )
    };
    let error = run(work.path(), "architecture", &text(&other))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("num_hidden_layers") && error.contains("other"),
        "{error}"
    );

    // A missing tensor.
    let missing = work.path().join("missing");
    std::fs::create_dir_all(&missing).unwrap();
    std::fs::copy(a.join("config.json"), missing.join("config.json")).unwrap();
    let bytes = std::fs::read(a.join("model.safetensors")).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<(String, TensorView<'_>)> = file
        .tensors()
        .into_iter()
        .filter(|(name, _)| name != "model.norm.weight")
        .collect();
    safetensors::serialize_to_file(kept, None, &missing.join("model.safetensors")).unwrap();
    let error = run(work.path(), "missing", &text(&missing))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("model.norm.weight") && error.contains("missing"),
        "{error}"
    );
    assert!(
        !work.path().join("out-missing").exists(),
        "nothing half-written is left"
    );

    // Configuration errors name the file and what is wrong.
    let error = MergeConfig::from_yaml(
        "merge_method: ties\nmodels:\n  - model: x\n",
        Path::new("m.yml"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("m.yml") && error.contains("base_model"),
        "{error}"
    );
    let error = MergeConfig::from_yaml("merge_method: blend\nmodels: []\n", Path::new("m.yml"))
        .unwrap_err()
        .to_string();
    assert!(error.contains("blend"), "{error}");
}
