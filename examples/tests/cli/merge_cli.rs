//! `hlat merge` on mergekit's own YAML files (`fixtures/mergekit/configs`, run from that folder as
//! mergekit ran them): the output has mergekit's tensors and layer count (their values are
//! compared in the `hlat` crate's tests); bad configurations exit 2 naming the file and what is
//! wrong, and leave nothing behind.

use std::path::Path;
use std::process::Output;

use serde_json::Value;

use super::{fixture, hlat};

/// Runs `hlat merge --config CONFIG --out OUT` from `fixtures/mergekit`.
fn merge_in_fixture(config: &Path, out: &Path) -> Output {
    hlat()
        .current_dir(fixture("mergekit"))
        .args(["merge", "--config"])
        .arg(config)
        .arg("--out")
        .arg(out)
        .output()
        .expect("running hlat")
}

/// The tensor names of a safetensors file, read from its JSON header.
fn tensor_names(file: &Path) -> Vec<String> {
    let bytes = std::fs::read(file).unwrap();
    let length = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, Value> =
        serde_json::from_slice(&bytes[8..8 + length]).unwrap();
    let mut names: Vec<String> = header
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| name != "__metadata__")
        .collect();
    names.sort();
    names
}

fn layers(folder: &Path) -> Value {
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(folder.join("config.json")).unwrap())
            .unwrap();
    config["num_hidden_layers"].clone()
}

#[test]
fn hlat_merge_on_mergekits_yaml_writes_mergekits_tensors() {
    let work = tempfile::tempdir().unwrap();
    for name in ["ties", "passthrough", "tied_linear", "qwen2_slerp"] {
        let out = work.path().join(name);
        let output = merge_in_fixture(Path::new(&format!("configs/{name}.yaml")), &out);
        assert!(
            output.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let expected = fixture("mergekit").join("expected").join(name);
        assert_eq!(
            tensor_names(&out.join("model.safetensors")),
            tensor_names(&expected.join("model.safetensors")),
            "{name}"
        );
        assert_eq!(layers(&out), layers(&expected), "{name}");
    }
}

#[test]
fn a_bad_configuration_exits_2_naming_the_file_and_leaves_no_output() {
    let work = tempfile::tempdir().unwrap();
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "malformed",
            "merge_method: linear\nmodels:\n  - model: models/llama-a\n    parameters: [weight\n",
            &["malformed.yaml", "line"],
        ),
        (
            "method",
            "merge_method: frankenstein\nmodels:\n  - model: models/llama-a\n",
            &["method.yaml", "frankenstein", "line 1"],
        ),
        (
            "parameter",
            "merge_method: ties\nbase_model: models/llama-a\nmodels:\n  - model: models/llama-b\n    parameters:\n      weight: 1\n      dense: 0.5\n",
            &[
                "parameter.yaml",
                "unknown parameter `dense` of `models/llama-b`",
            ],
        ),
        (
            "tensors",
            "merge_method: linear\nmodels:\n  - model: models/llama-a\n  - model: models/qwen3-a\nparameters:\n  weight: 0.5\n",
            &["models/llama-a", "self_attn.k_norm.weight", "missing"],
        ),
        (
            "sizes",
            "merge_method: linear\nmodels:\n  - model: models/llama-a\n  - model: ../hf-tiny-llama\nparameters:\n  weight: 0.5\n",
            &["../hf-tiny-llama", "vocab_size", "64", "1024"],
        ),
    ];
    for (name, text, names) in cases {
        let config = work.path().join(format!("{name}.yaml"));
        std::fs::write(&config, text).unwrap();
        let out = work.path().join(format!("out-{name}"));
        let output = merge_in_fixture(&config, &out);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{name}: {stderr}");
        for expected in *names {
            assert!(
                stderr.contains(expected),
                "{name}: `{expected}` not in {stderr}"
            );
        }
        assert!(!out.exists(), "{name}: no output folder");
    }
    let left: Vec<_> = std::fs::read_dir(work.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .filter(|name| name.to_string_lossy().contains("partial"))
        .collect();
    assert!(left.is_empty(), "no staging folder is left: {left:?}");
}
