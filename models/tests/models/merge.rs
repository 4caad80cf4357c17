//! Model merging (`hlat::merge`) on checkpoints made from the transformers fixture: each method
//! against its closed form at the ends of its range, mergekit's documented YAML accepted, and
//! clear errors for models that do not fit together.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use hlat::merge::{MergeConfig, MergeError, merge};
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
    // One slice of every layer; the base model, not listed, is added as mergekit adds it.
    assert_eq!(config.slices.len(), 1);
    let sources: Vec<&str> = config.slices[0]
        .sources
        .iter()
        .map(|source| source.model.as_str())
        .collect();
    assert_eq!(
        sources,
        [
            "psmathur/orca_mini_v3_13b",
            "garage-bAInd/Platypus2-13B",
            "WizardLM/WizardMath-13B-V1.0",
            "TheBloke/Llama-2-13B-fp16"
        ]
    );
    assert_eq!(config.donor(), "TheBloke/Llama-2-13B-fp16");
}

/// The YAML of a merge of `a` and `b` by `method`, with `extra` lines after it.
fn pair(a: &Path, b: &Path, method: &str, extra: &str) -> String {
    format!(
        "models:\n  - model: {}\n  - model: {}\nmerge_method: {method}\n{extra}",
        a.display(),
        b.display()
    )
}

const WEIGHTS: &str = "parameters:\n  weight: 1.0\n";

/// A copy of the fixture in `dir` whose `config.json` has `from` replaced by `to`.
fn reconfigured(dir: &Path, from: &str, to: &str) -> PathBuf {
    let model = variant(dir, |value, _| value);
    let config = std::fs::read_to_string(model.join("config.json")).unwrap();
    assert!(config.contains(from), "{config}");
    std::fs::write(model.join("config.json"), config.replace(from, to)).unwrap();
    model
}

#[test]
fn models_of_other_sizes_are_refused_by_name() {
    let work = tempfile::tempdir().unwrap();
    let (a, _) = two_models(work.path());
    let deeper = reconfigured(
        &work.path().join("deeper"),
        "\"num_hidden_layers\": 2",
        "\"num_hidden_layers\": 3",
    );
    let error = run(work.path(), "deeper", &pair(&a, &deeper, "linear", WEIGHTS))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("deeper.yaml") && error.contains("different numbers of layers"),
        "{error}"
    );
    let wider = reconfigured(
        &work.path().join("wider"),
        "\"intermediate_size\": 172",
        "\"intermediate_size\": 180",
    );
    let error = run(work.path(), "wider", &pair(&a, &wider, "linear", WEIGHTS))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("intermediate_size") && error.contains("wider"),
        "{error}"
    );
}

/// A copy of `a` in `dir` whose tensors are those `change` returns for each (name, tensor).
fn retensored(
    a: &Path,
    dir: &Path,
    change: impl for<'a> Fn(&str, TensorView<'a>) -> Option<TensorView<'a>>,
) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(a.join("config.json"), dir.join("config.json")).unwrap();
    let bytes = std::fs::read(a.join("model.safetensors")).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<(String, TensorView<'_>)> = file
        .tensors()
        .into_iter()
        .filter_map(|(name, view)| change(&name, view).map(|view| (name, view)))
        .collect();
    safetensors::serialize_to_file(kept, None, &dir.join("model.safetensors")).unwrap();
    dir.to_path_buf()
}

#[test]
fn a_missing_tensor_or_another_shape_is_refused_and_nothing_is_written() {
    let work = tempfile::tempdir().unwrap();
    let (a, _) = two_models(work.path());
    let missing = retensored(&a, &work.path().join("missing"), |name, view| {
        (name != "model.norm.weight").then_some(view)
    });
    let error = run(
        work.path(),
        "missing",
        &pair(&a, &missing, "linear", WEIGHTS),
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("model.norm.weight") && error.contains("missing"),
        "{error}"
    );
    assert!(
        !work.path().join("out-missing").exists(),
        "nothing is written"
    );

    let reshaped = retensored(&a, &work.path().join("reshaped"), |name, view| {
        if name == "model.norm.weight" {
            // The first 32 of the 64 values.
            let data = &view.data()[..32 * 4];
            Some(TensorView::new(Dtype::F32, vec![32], data).unwrap())
        } else {
            Some(view)
        }
    });
    let error = run(
        work.path(),
        "reshaped",
        &pair(&a, &reshaped, "linear", WEIGHTS),
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("model.norm.weight") && error.contains("[32]") && error.contains("[64]"),
        "{error}"
    );
    // Nothing is left beside the output either (the staging folder is removed).
    let left: Vec<String> = std::fs::read_dir(work.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains("reshaped") && name != "reshaped")
        .collect();
    assert!(left.is_empty(), "{left:?}");

    // An existing output folder is refused and kept as it was.
    let existing = work.path().join("out-existing");
    std::fs::create_dir_all(&existing).unwrap();
    std::fs::write(existing.join("keep.txt"), "mine").unwrap();
    let error = run(
        work.path(),
        "existing",
        &pair(&a, &reshaped, "linear", WEIGHTS),
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("already exists"), "{error}");
    assert_eq!(
        std::fs::read_to_string(existing.join("keep.txt")).unwrap(),
        "mine"
    );
}

/// The message of the error reading `text` as `m.yml`.
fn config_error(text: &str) -> String {
    MergeConfig::from_yaml(text, Path::new("m.yml"))
        .unwrap_err()
        .to_string()
}

#[test]
fn configuration_errors_name_the_file_the_line_and_what_is_wrong() {
    let cases: &[(&str, &[&str])] = &[
        // Malformed YAML: a mapping where a sequence item continues.
        (
            "merge_method: linear\nmodels:\n  - model: a\n    parameters:\n      weight: [1, 2\n",
            &["m.yml", "line"],
        ),
        (
            "merge_method: blend\nmodels:\n  - model: a\n",
            &["m.yml", "blend", "line 1"],
        ),
        (
            "merge_method: linear\nmodels:\n  - model: a\n    weigth: 1\n",
            &["m.yml", "weigth", "line 4"],
        ),
        (
            "merge_method: ties\nbase_model: a\nmodels:\n  - model: b\n    parameters:\n      densty: 0.5\n",
            &["m.yml", "unknown parameter `densty` of `b`", "density"],
        ),
        (
            "merge_method: ties\nmodels:\n  - model: x\n",
            &["m.yml", "ties needs `base_model`"],
        ),
        (
            "merge_method: slerp\nbase_model: a\nmodels:\n  - model: b\n  - model: c\nparameters:\n  t: 0.5\n",
            &["slerp merges exactly 2 models, found 3"],
        ),
        (
            "merge_method: linear\ntokenizer_source: union\nbase_model: a\nmodels:\n  - model: a\n",
            &["m.yml", "tokenizer_source: union", "base"],
        ),
        (
            "merge_method: linear\ntokenizer_source: other/model\nbase_model: a\nmodels:\n  - model: a\n",
            &["tokenizer_source: other/model"],
        ),
        (
            "merge_method: linear\ndtype: float8\nmodels:\n  - model: a\n",
            &["`dtype`", "float8"],
        ),
        (
            "merge_method: passthrough\nslices:\n  - sources:\n      - model: a\n        layer_range: [0, 2]\n      - model: b\n        layer_range: [0, 3]\n",
            &["slice 0", "different numbers of layers"],
        ),
        (
            "merge_method: linear\n",
            &["exactly one of `models` and `slices`"],
        ),
    ];
    for (text, names) in cases {
        let error = config_error(text);
        for name in *names {
            assert!(error.contains(name), "`{name}` not in: {error}\n{text}");
        }
    }
}

#[test]
fn a_parameter_of_the_wrong_kind_or_missing_is_refused_before_writing() {
    let work = tempfile::tempdir().unwrap();
    let (a, b) = two_models(work.path());
    let cases = [
        (
            "text",
            "parameters:\n  weight: heavy\n",
            "expected a number, found \"heavy\"",
        ),
        ("none", "", "parameter `weight` is missing"),
        (
            "flag",
            "parameters:\n  weight: 1.0\n  normalize: 2\n",
            "true or false",
        ),
    ];
    for (name, extra, expected) in cases {
        let error = run(work.path(), name, &pair(&a, &b, "linear", extra))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains(expected) && error.contains(&format!("{name}.yaml")),
            "{error}"
        );
        assert!(!work.path().join(format!("out-{name}")).exists());
    }
}

/// Every tensor of `dir`'s `model.safetensors` as f32 values.
fn values(dir: &Path) -> BTreeMap<String, Vec<f32>> {
    tensors(dir)
}

#[test]
fn random_methods_keep_about_density_rescale_and_repeat() {
    let work = tempfile::tempdir().unwrap();
    let (a, b) = two_models(work.path());
    let (base, other) = (values(&a), values(&b));
    let embeddings = "model.embed_tokens.weight"; // 1024 × 64 = 65,536 elements
    for method in ["dare_linear", "dare_ties", "della_linear", "della"] {
        let extra = "parameters:\n  weight: 1.0\n  density: 0.3\n  normalize: false\n";
        let text = pair(
            &a,
            &b,
            method,
            &format!("base_model: {}\n{extra}", a.display()),
        );
        let merged = run(work.path(), method, &text).unwrap();
        let again = run(work.path(), &format!("{method}-again"), &text).unwrap();
        assert_eq!(merged, again, "{method}: a merge repeats exactly");
        let (m, x, y) = (&merged[embeddings], &base[embeddings], &other[embeddings]);
        let kept = m.iter().zip(x).filter(|(m, x)| m != x).count();
        let fraction = kept as f64 / m.len() as f64;
        // Binomial(65536, 0.3): standard deviation 0.0018 of the fraction.
        assert!((fraction - 0.3).abs() < 0.01, "{method}: kept {fraction}");
        // Rescaled to the L1 norm of the whole difference (mergekit's `rescale`, on by default).
        let l1 = |pairs: &mut dyn Iterator<Item = (&f32, &f32)>| -> f64 {
            pairs.map(|(p, q)| f64::from(p - q).abs()).sum()
        };
        let (merged_l1, full_l1) = (l1(&mut m.iter().zip(x)), l1(&mut y.iter().zip(x)));
        assert!(
            (merged_l1 - full_l1).abs() < 1e-4 * full_l1,
            "{method}: L1 {merged_l1} against {full_l1}"
        );
        // Each kept difference is the model's, scaled by one factor: the L1 norm of all the
        // differences over that of the kept ones, about 1 / 0.3 for DARE, less for DELLA, which
        // keeps large differences more often.
        let kept_l1: f64 = (0..m.len())
            .filter(|&i| m[i] != x[i])
            .map(|i| f64::from(y[i] - x[i]).abs())
            .sum();
        let expected_scale = full_l1 / kept_l1;
        let index = (0..m.len()).find(|&i| m[i] != x[i]).unwrap();
        let scale = f64::from(m[index] - x[index]) / f64::from(y[index] - x[index]);
        assert!(
            (scale - expected_scale).abs() < 1e-3 * expected_scale,
            "{method}: {scale}"
        );
        if method.starts_with("dare") {
            assert!(
                (expected_scale - 1.0 / 0.3).abs() < 0.1,
                "{method}: {expected_scale}"
            );
        } else {
            assert!(expected_scale < 3.0, "{method}: {expected_scale}");
        }
        // Two tensors of the same shape draw differently.
        let (q, k) = (
            &merged["model.layers.0.self_attn.q_proj.weight"],
            &merged["model.layers.0.self_attn.o_proj.weight"],
        );
        let (qb, kb) = (
            &base["model.layers.0.self_attn.q_proj.weight"],
            &base["model.layers.0.self_attn.o_proj.weight"],
        );
        let pattern =
            |m: &[f32], x: &[f32]| -> Vec<bool> { m.iter().zip(x).map(|(m, x)| m != x).collect() };
        assert_ne!(pattern(q, qb), pattern(k, kb), "{method}");
    }
}
