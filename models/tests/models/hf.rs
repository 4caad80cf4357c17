//! Hugging Face import/export against the transformers fixtures in `fixtures/`.

use super::fixture;
use std::collections::HashMap;
use std::path::Path;

use crate::host;
use burn::tensor::{Device, Int, Tensor, TensorData};
use burn_store::{ModuleSnapshot, bridge};
use hlat::generate::{GenerationOptions, Sampling, generate};
use hlat::hf::{ExportOptions, HfError, WeightDtype, export_hf, import_hf, load_tokenizer};
use hlat::{Hlat, HlatConfig};
use safetensors::SafeTensors;
use serde_json::Value;
use test_support::fixtures::HF_FIXTURES;

fn expected(name: &str) -> Value {
    let text = std::fs::read_to_string(fixture(name).join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn floats(value: &Value) -> Vec<f32> {
    match value {
        Value::Array(items) => items.iter().flat_map(floats).collect(),
        number => vec![number.as_f64().unwrap() as f32],
    }
}

fn ints(value: &Value) -> Vec<i64> {
    match value {
        Value::Array(items) => items.iter().flat_map(ints).collect(),
        number => vec![number.as_i64().unwrap()],
    }
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Checks the logits and greedy continuation of fixture `name` on backend `B`.
fn check_fixture(name: &str, device: &Device) {
    let expected = expected(name);
    let (config, model) = import_hf(&fixture(name), device, WeightDtype::F32).unwrap();
    assert_eq!(
        config.num_params(),
        expected["num_parameters"].as_u64().unwrap(),
        "{name}"
    );

    let input_ids = ints(&expected["input_ids"]);
    let seq = input_ids.len() / 2;
    let ids = Tensor::<2, Int>::from_data(TensorData::new(input_ids, [2, seq]), device);
    let logits = model.forward(ids);
    let vocab = config.vocab_size;
    let first = logits
        .clone()
        .narrow(1, 0, 4)
        .into_data()
        .try_into_vec::<f32>()
        .unwrap();
    let last = logits
        .clone()
        .narrow(1, seq - 1, 1)
        .into_data()
        .try_into_vec::<f32>()
        .unwrap();
    assert_eq!(last.len(), 2 * vocab);
    let first_diff = max_abs_diff(&first, &floats(&expected["logits_first_positions"]));
    let last_diff = max_abs_diff(&last, &floats(&expected["logits_last_position"]));
    assert!(
        first_diff <= 1e-4,
        "{name}: first positions differ by {first_diff}"
    );
    assert!(
        last_diff <= 1e-4,
        "{name}: last position differs by {last_diff}"
    );
    let sum: f64 = logits.into_data().iter::<f32>().map(|v| v as f64).sum();
    let expected_sum = expected["logits_sum"].as_f64().unwrap();
    assert!(
        (sum - expected_sum).abs() < 1e-2,
        "{name}: logits sum {sum} vs {expected_sum}"
    );

    let prompt: Vec<u32> = ints(&expected["greedy_prompt"])
        .iter()
        .map(|&id| id as u32)
        .collect();
    let continuation: Vec<u32> = ints(&expected["greedy_continuation"])
        .iter()
        .map(|&id| id as u32)
        .collect();
    let options = GenerationOptions {
        max_new_tokens: continuation.len(),
        sampling: Sampling::Greedy,
        seed: 0,
        stop_ids: vec![config.eos_token_id],
    };
    let mut streamed = Vec::new();
    let generated = generate(&model, &prompt, &options, |token| streamed.push(token)).unwrap();
    assert_eq!(generated, continuation, "{name}");
    assert_eq!(streamed, continuation, "{name}");
}

#[test]
fn fixture_logits_and_greedy_continuation_on_ndarray() {
    for name in HF_FIXTURES {
        check_fixture(name, &Device::flex());
    }
}

#[test]
fn fixture_logits_and_greedy_continuation_on_trainium_host() {
    for name in HF_FIXTURES {
        check_fixture(name, &host());
    }
}

/// The mixtures of experts on the compiled `xla` device, with no host fallback: the routing
/// (softmax, the top-k rounds of argmax, the masked weights) and every expert run in the program.
#[test]
fn mixtures_of_experts_give_transformers_logits_and_tokens_on_xla() {
    // A device of this test's own, so that refusing host fallbacks touches no other test.
    let xla = test_support::plugin::xla(2);
    burn_trainium::set_host_fallback(&xla, burn_trainium::HostFallback::Error);
    let device = crate::trainium(xla);
    let before = burn_trainium::stats(&xla).host_fallbacks;
    for name in HF_FIXTURES
        .iter()
        .filter(|name| name.contains("moe") || name.contains("mixtral"))
    {
        check_fixture(name, &device);
    }
    device.sync().expect("the device syncs");
    let stats = burn_trainium::stats(&xla);
    assert_eq!(stats.host_fallbacks, before);
    assert!(stats.segments_run > 0, "the models ran on {xla}");
}

fn parameters(model: &Hlat) -> HashMap<String, TensorData> {
    model
        .collect(None, None, false)
        .into_iter()
        .map(|snapshot| (snapshot.name.clone(), bridge::to_data(&snapshot).unwrap()))
        .collect()
}

/// Exports `model` as `dtype` and imports it back as `dtype` on backend `B`: every parameter
/// must keep its exact bits.
fn check_round_trip(model: &Hlat, device: &Device, dtype: WeightDtype, max_shard_size: u64) {
    let work = tempfile::tempdir().unwrap();
    let out = work.path().join("exported");
    let options = ExportOptions {
        dtype,
        max_shard_size,
    };
    export_hf(model, &out, &options, None).unwrap();
    let sharded = out.join("model.safetensors.index.json").is_file();
    assert_eq!(sharded, max_shard_size < 1_000_000, "sharding of {dtype:?}");
    let (_, back) = import_hf(&out, device, dtype).unwrap();
    let (before, after) = (parameters(model), parameters(&back));
    assert_eq!(before.len(), after.len());
    for (path, data) in &before {
        let as_exported = |data: &TensorData| data.clone().convert_dtype(dtype.burn());
        assert_eq!(
            as_exported(data).as_bytes(),
            as_exported(&after[path]).as_bytes(),
            "{path} changed"
        );
    }
    // Exporting the imported model again writes the same bytes.
    let again = work.path().join("again");
    export_hf(&back, &again, &options, None).unwrap();
    for entry in std::fs::read_dir(&out).unwrap() {
        let name = entry.unwrap().file_name();
        let first = std::fs::read(out.join(&name)).unwrap();
        assert_eq!(
            first,
            std::fs::read(again.join(&name)).unwrap(),
            "{name:?} differs"
        );
    }
    // Nothing is overwritten.
    let overwrite = export_hf(model, &out, &options, None);
    assert!(matches!(overwrite, Err(HfError::OutputExists { .. })));
}

#[test]
fn export_then_import_round_trips_bit_exactly_in_f32() {
    let device = Device::flex();
    for name in HF_FIXTURES {
        let (_, model) = import_hf(&fixture(name), &device, WeightDtype::F32).unwrap();
        check_round_trip(&model, &device, WeightDtype::F32, 5_000_000_000);
    }
}

/// Every field of the fixture's `config.json` (as transformers 5 wrote it) is in the exported
/// one with the same value: the family's own fields (`model_type`, `architectures`, the RoPE
/// parameters, `tie_word_embeddings`, biases, `head_dim`, the sliding window, ...).
#[test]
fn exported_config_holds_every_field_transformers_wrote() {
    let device = Device::flex();
    for name in HF_FIXTURES {
        let (_, model) = import_hf(&fixture(name), &device, WeightDtype::F32).unwrap();
        let work = tempfile::tempdir().unwrap();
        let out = work.path().join("exported");
        export_hf(&model, &out, &ExportOptions::default(), None).unwrap();
        let read = |dir: &Path| -> Value {
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap()
        };
        let (theirs, ours) = (read(&fixture(name)), read(&out));
        for (key, value) in theirs.as_object().unwrap() {
            if key != "transformers_version" {
                assert!(
                    same_json(&ours[key], value),
                    "{name}: `{key}` = {} in the export, {value} in the fixture",
                    ours[key]
                );
            }
        }
    }
}

/// JSON equality with numbers compared as f64 (`16` equals `16.0`), objects by the keys of
/// `expected`.
fn same_json(found: &Value, expected: &Value) -> bool {
    match (found, expected) {
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same_json(a, b))
        }
        (Value::Object(a), Value::Object(b)) => b
            .iter()
            .all(|(key, value)| a.get(key).is_some_and(|found| same_json(found, value))),
        (a, b) => a == b,
    }
}

#[test]
fn export_then_import_round_trips_bit_exactly_in_bf16_and_shards() {
    let device = host();
    let (_, model) = import_hf(&fixture("hf-tiny-llama"), &device, WeightDtype::BF16).unwrap();
    check_round_trip(&model, &device, WeightDtype::BF16, 200_000);
}

#[test]
fn exported_folder_opens_with_python_safetensors() {
    let device = Device::flex();
    let (_, model) = import_hf(&fixture("hf-tiny-llama"), &device, WeightDtype::F32).unwrap();
    let work = tempfile::tempdir().unwrap();
    let out = work.path().join("exported");
    let options = ExportOptions {
        dtype: WeightDtype::BF16,
        max_shard_size: 200_000,
    };
    export_hf(&model, &out, &options, None).unwrap();
    let script = r#"
import json, sys, os
try:
    from safetensors.numpy import load_file
    from safetensors import safe_open
except ImportError as error:
    print("MISSING", error)
    sys.exit(3)
folder = sys.argv[1]
index = json.load(open(os.path.join(folder, "model.safetensors.index.json")))
found = {}
for name in sorted(set(index["weight_map"].values())):
    with safe_open(os.path.join(folder, name), framework="numpy") as handle:
        assert handle.metadata().get("format") == "pt", handle.metadata()
    # numpy has no bfloat16: read the header through the torch-free metadata API.
    import struct
    with open(os.path.join(folder, name), "rb") as raw:
        size = struct.unpack("<Q", raw.read(8))[0]
        header = json.loads(raw.read(size))
    for tensor, info in header.items():
        if tensor != "__metadata__":
            assert index["weight_map"][tensor] == name
            found[tensor] = [info["dtype"], info["shape"]]
print(json.dumps(found))
"#;
    let output = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&out)
        .output()
        .expect("python3 must be installed");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.code() != Some(3),
        "the Python `safetensors` package is missing ({stdout}): run `pip install safetensors numpy`"
    );
    assert!(
        output.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let found: HashMap<String, (String, Vec<usize>)> = serde_json::from_str(&stdout).unwrap();
    let specs: Vec<_> = hlat::hf::tensor_specs(model.config()).collect();
    assert_eq!(found.len(), specs.len());
    for spec in specs {
        assert_eq!(
            found[&spec.hf_name],
            ("BF16".to_string(), spec.hf_shape),
            "{}",
            spec.hf_name
        );
    }
}

#[test]
fn exported_f32_weights_equal_the_fixture_file_in_python() {
    for name in HF_FIXTURES {
        exported_f32_weights_equal_in_python(name);
    }
}

/// Exports fixture `name` in f32 and compares, in Python, every tensor of the export with the
/// fixture's file: the same names (a tied model has no `lm_head.weight` in either), dtypes,
/// shapes and values.
fn exported_f32_weights_equal_in_python(name: &str) {
    let device = Device::flex();
    let (_, model) = import_hf(&fixture(name), &device, WeightDtype::F32).unwrap();
    let work = tempfile::tempdir().unwrap();
    let out = work.path().join("exported");
    export_hf(&model, &out, &ExportOptions::default(), None).unwrap();
    let script = r#"
import sys
try:
    from safetensors.numpy import load_file
except ImportError as error:
    print("MISSING", error)
    sys.exit(3)
ours = load_file(sys.argv[1] + "/model.safetensors")
theirs = load_file(sys.argv[2] + "/model.safetensors")
assert sorted(ours) == sorted(theirs), (sorted(ours), sorted(theirs))
for name, value in theirs.items():
    assert ours[name].dtype == value.dtype and ours[name].shape == value.shape, name
    assert (ours[name] == value).all(), name
print("ok", len(ours))
"#;
    let output = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&out)
        .arg(fixture(name))
        .output()
        .expect("python3 must be installed");
    assert!(
        output.status.code() != Some(3),
        "the Python `safetensors` package is missing: run `pip install safetensors numpy`"
    );
    assert!(
        output.status.success(),
        "{name}: python failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn tokenizer_matches_the_python_tokenizers_library() {
    let tokenizer = load_tokenizer(&fixture("llama2-tokenizer/tokenizer.json")).unwrap();
    let text = std::fs::read_to_string(fixture("llama2-tokenizer/expected.json")).unwrap();
    let expected: Value = serde_json::from_str(&text).unwrap();
    for case in expected["cases"].as_array().unwrap() {
        let input = case["text"].as_str().unwrap();
        let encoding = tokenizer.encode(input, true).unwrap();
        let ids: Vec<i64> = encoding.get_ids().iter().map(|&id| id as i64).collect();
        assert_eq!(ids, ints(&case["ids"]), "ids of {input:?}");
        let decoded = tokenizer.decode(encoding.get_ids(), true).unwrap();
        assert_eq!(
            decoded,
            case["decoded"].as_str().unwrap(),
            "decoding of {input:?}"
        );
    }
}

/// A copy of the fixture (config.json edited by `edit_config`, tensors by `edit_tensors`).
fn broken_fixture(
    edit_config: impl FnOnce(&mut Value),
    edit_tensors: impl FnOnce(&mut Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>),
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let source = fixture("hf-tiny-llama");
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(source.join("config.json")).unwrap())
            .unwrap();
    edit_config(&mut config);
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let bytes = std::fs::read(source.join("model.safetensors")).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<_> = file
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            (
                name,
                view.dtype(),
                view.shape().to_vec(),
                view.data().to_vec(),
            )
        })
        .collect();
    edit_tensors(&mut tensors);
    let views: Vec<_> = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            (
                name.clone(),
                safetensors::tensor::TensorView::new(*dtype, shape.clone(), data).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.path().join("model.safetensors")).unwrap();
    dir
}

fn import_error(dir: &Path) -> HfError {
    match import_hf(dir, &Device::flex(), WeightDtype::F32) {
        Ok(_) => panic!("importing {} should fail", dir.display()),
        Err(error) => error,
    }
}

/// Mixture-of-experts configurations the decoder cannot build or does not implement: each error
/// names the file and the `config.json` field.
#[test]
fn bad_mixture_configurations_name_the_field() {
    type Edit = fn(&mut Value);
    let cases: [(&str, &str, Edit); 7] = [
        ("hf-tiny-mixtral", "num_experts_per_tok", |c| {
            c["num_experts_per_tok"] = 9.into()
        }),
        ("hf-tiny-mixtral", "router_jitter_noise", |c| {
            c["router_jitter_noise"] = 0.1.into()
        }),
        ("hf-tiny-qwen3-moe", "scoring_func", |c| {
            c["scoring_func"] = "sigmoid".into()
        }),
        ("hf-tiny-qwen3-moe", "decoder_sparse_step", |c| {
            c["decoder_sparse_step"] = 0.into()
        }),
        ("hf-tiny-qwen2-moe", "mlp_only_layers", |c| {
            c["mlp_only_layers"] = serde_json::json!([5])
        }),
        ("hf-tiny-qwen2-moe", "use_sliding_window", |c| {
            c["use_sliding_window"] = true.into()
        }),
        ("hf-tiny-llama", "num_experts", |c| {
            c["num_experts"] = 8.into()
        }),
    ];
    for (name, field, edit) in cases {
        let dir = tempfile::tempdir().unwrap();
        let mut config: Value = serde_json::from_str(
            &std::fs::read_to_string(fixture(name).join("config.json")).unwrap(),
        )
        .unwrap();
        edit(&mut config);
        std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
        let error = hlat::hf::read_hf_config(dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            error.contains(&format!("`{field}`")) || error.contains(&format!("{field}:")),
            "{name} {field}: {error}"
        );
        assert!(error.contains("config.json"), "{name} {field}: {error}");
    }
}

#[test]
fn each_bad_input_gets_its_own_error() {
    let unchanged = |_: &mut Value| {};
    let keep = |_: &mut Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>| {};

    let dir = broken_fixture(unchanged, |t| {
        t.retain(|(name, ..)| name != "model.layers.1.mlp.up_proj.weight")
    });
    let error = import_error(dir.path());
    assert!(
        matches!(&error, HfError::MissingTensor { file, tensor } if tensor == "model.layers.1.mlp.up_proj.weight" && file.ends_with("model.safetensors")),
        "{error}"
    );

    let dir = broken_fixture(unchanged, |t| {
        t.push((
            "model.layers.0.self_attn.q_proj.bias".into(),
            safetensors::Dtype::F32,
            vec![64],
            vec![0; 256],
        ))
    });
    let error = import_error(dir.path());
    assert!(
        matches!(&error, HfError::UnexpectedTensor { tensor, .. } if tensor == "model.layers.0.self_attn.q_proj.bias"),
        "{error}"
    );

    let dir = broken_fixture(unchanged, |t| {
        let norm = t
            .iter_mut()
            .find(|(name, ..)| name == "model.norm.weight")
            .unwrap();
        norm.2 = vec![32];
        norm.3.truncate(128);
    });
    let error = import_error(dir.path());
    assert!(
        matches!(&error, HfError::ShapeMismatch { tensor, expected, found, .. } if tensor == "model.norm.weight" && expected == &vec![64] && found == &vec![32]),
        "{error}"
    );
    assert!(error.to_string().contains("model.safetensors"), "{error}");

    // What the decoder does not implement, and RoPE parameters that are missing or wrong: each
    // error names config.json, the field (inside `rope_parameters` where it lies there) and
    // the value.
    let rope = |parameters: Value| move |c: &mut Value| c["rope_parameters"] = parameters.clone();
    type Edit = Box<dyn Fn(&mut Value)>;
    let cases: [(&str, &str, Edit); 6] = [
        (
            "rope_parameters.rope_type",
            "\"dynamic\"",
            Box::new(rope(
                serde_json::json!({"rope_type": "dynamic", "factor": 2.0}),
            )),
        ),
        (
            "rope_parameters.low_freq_factor",
            "null",
            Box::new(rope(serde_json::json!({
                "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192
            }))),
        ),
        (
            "rope_parameters.factor",
            "\"two\"",
            Box::new(rope(
                serde_json::json!({"rope_type": "linear", "factor": "two"}),
            )),
        ),
        (
            "rope_scaling.rope_type",
            "\"longrope\"",
            Box::new(|c: &mut Value| {
                c.as_object_mut().unwrap().remove("rope_parameters");
                c["rope_scaling"] = serde_json::json!({"type": "longrope", "factor": 2.0});
            }),
        ),
        (
            "model_type",
            "\"gemma\"",
            Box::new(|c: &mut Value| c["model_type"] = "gemma".into()),
        ),
        (
            "hidden_act",
            "\"gelu\"",
            Box::new(|c: &mut Value| c["hidden_act"] = "gelu".into()),
        ),
    ];
    for (field, value, edit) in cases {
        let dir = broken_fixture(edit, keep);
        let error = import_error(dir.path());
        assert!(
            matches!(&error, HfError::UnsupportedConfig { field: found, path, value: shown, .. }
                if found == field && shown == value && path.ends_with("config.json")),
            "{field}: {error}"
        );
    }
    // A head width that does not fit: odd, or zero.
    for width in [15, 0] {
        let dir = broken_fixture(|c| c["head_dim"] = width.into(), keep);
        let error = import_error(dir.path());
        assert!(
            matches!(&error, HfError::InvalidConfig { file_field: "head_dim", path, .. }
                if path.ends_with("config.json")),
            "head_dim {width}: {error}"
        );
        assert!(
            error.to_string().contains(&format!("`head_dim` = {width}")),
            "{error}"
        );
    }

    // A config.json with 60000 layers: the first missing layer is reported, and no list
    // of 540000 tensors is built on the way (see the fuzz harness's allocation cap).
    let dir = broken_fixture(|c| c["num_hidden_layers"] = 60_000.into(), keep);
    let error = import_error(dir.path());
    assert!(
        matches!(&error, HfError::MissingTensor { tensor, .. } if tensor == "model.layers.2.input_layernorm.weight"),
        "{error}"
    );

    let dir = broken_fixture(unchanged, keep);
    let weights = dir.path().join("model.safetensors");
    let length = std::fs::metadata(&weights).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&weights)
        .unwrap()
        .set_len(length - 100)
        .unwrap();
    let error = import_error(dir.path());
    assert!(
        matches!(&error, HfError::CorruptSafetensors { file, .. } if file == &weights),
        "{error}"
    );
}

#[test]
fn legacy_rope_theta_and_defaults_are_read() {
    let dir = broken_fixture(
        |c| {
            let object = c.as_object_mut().unwrap();
            object.remove("rope_parameters");
            object.remove("num_key_value_heads");
            object.remove("dtype");
            object.insert("rope_theta".into(), serde_json::json!(500000.0));
            object.insert("torch_dtype".into(), serde_json::json!("float32"));
        },
        |_| {},
    );
    let config = hlat::hf::read_hf_config(dir.path()).unwrap();
    assert_eq!(config.rope_theta, 500000.0);
    assert_eq!(config.num_kv_heads, config.num_heads);
    let expected = HlatConfig {
        rope_theta: 500000.0,
        ..hlat::hf::read_hf_config(&fixture("hf-tiny-llama")).unwrap()
    };
    assert_eq!(config, expected);
}

/// An import in a dtype the device lacks is an error naming it; in one it has, a model of that
/// dtype. (Flex, the reference device, supports every weight dtype, so only the second half runs
/// here: the error path needs a device without bf16 or f16, which NdArray was on Burn 0.21.)
#[test]
fn a_dtype_the_backend_lacks_is_an_error() {
    let device = Device::flex();
    for dtype in [WeightDtype::BF16, WeightDtype::F16] {
        let result = import_hf(&fixture("hf-tiny-llama"), &device, dtype);
        if device.supports_dtype(dtype.burn()) {
            let (_, model) = result.unwrap_or_else(|error| panic!("{dtype:?}: {error}"));
            assert_eq!(model.embed_tokens.weight.val().dtype(), dtype.burn());
        } else {
            assert!(
                matches!(result, Err(HfError::BackendDtype { .. })),
                "{dtype:?}"
            );
        }
    }
}

/// A template post-processor naming a special token it does not define makes the tokenizers
/// library panic at every encoding: loading such a file is an error naming it, not a panic.
#[test]
fn a_tokenizer_that_would_panic_when_used_is_refused_when_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    let post_processor = serde_json::json!({
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": "<s>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}}
        ],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {}
    });
    let vocab = serde_json::json!({"a": 0, "[UNK]": 1});
    let template = test_support::tokenizer::word_level_json(vocab, "[UNK]", post_processor);
    std::fs::write(&path, template.to_string()).unwrap();
    let error = load_tokenizer(&path).expect_err("the tokenizer cannot encode anything");
    assert!(
        error.to_string().contains(&path.display().to_string()),
        "{error}"
    );
}

/// As transformers 5 reads them: a `rope_scaling` block added to a saved configuration (Qwen's
/// recipe for YaRN) wins over its `rope_parameters`, whose theta it keeps; Qwen's
/// `use_sliding_window` with a null window is no window.
#[test]
fn added_rope_scaling_wins_and_a_null_qwen_window_is_none() {
    let dir = broken_fixture(
        |c| c["rope_scaling"] = serde_json::json!({"rope_type": "linear", "factor": 2.0}),
        |_| {},
    );
    let config = hlat::hf::read_hf_config(dir.path()).unwrap();
    assert_eq!(
        config.rope_scaling,
        hlat::RopeScaling::Linear { factor: 2.0 }
    );
    assert_eq!(config.rope_theta, 1e4);

    let dir = tempfile::tempdir().unwrap();
    let mut qwen: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("hf-tiny-qwen2").join("config.json")).unwrap(),
    )
    .unwrap();
    qwen["use_sliding_window"] = true.into();
    qwen.as_object_mut().unwrap().remove("layer_types");
    std::fs::write(dir.path().join("config.json"), qwen.to_string()).unwrap();
    assert_eq!(
        hlat::hf::read_hf_config(dir.path()).unwrap().sliding_window,
        None
    );
    qwen["sliding_window"] = 8.into();
    qwen["max_window_layers"] = 1.into();
    std::fs::write(dir.path().join("config.json"), qwen.to_string()).unwrap();
    assert_eq!(
        hlat::hf::read_hf_config(dir.path()).unwrap().sliding_window,
        Some(hlat::SlidingWindow {
            size: 8,
            first_layer: 1
        })
    );
}
