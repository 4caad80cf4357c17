//! LoRA against PEFT (`fixtures/lora-tiny-llama3`, made by `fixtures/regenerate_finetune.py`):
//! a PEFT adapter applied here gives PEFT's logits and greedy continuation, merging gives
//! `merge_and_unload`'s weights, and the adapter this crate writes is the checked-in one that
//! the script loads with PEFT (`--check-written`).

use std::path::Path;

use burn::module::Param;
use burn::tensor::{Device, Int, Tensor, TensorData};
use hlat::Hlat;
use hlat::generate::{GenerationOptions, Sampling, generate};
use hlat::hf::adapter::{
    ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, load_adapter, read_adapter, save_adapter,
};
use hlat::hf::{ExportOptions, WeightDtype, export_hf, import_hf};
use hlat::lora::{Lora, LoraConfig, LoraTarget};
use safetensors::SafeTensors;
use serde_json::Value;

use super::fixture;

fn expected() -> Value {
    let path = fixture("lora-tiny-llama3/expected.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn floats(value: &Value) -> Vec<f32> {
    match value {
        Value::Array(items) => items.iter().flat_map(floats).collect(),
        number => vec![number.as_f64().unwrap() as f32],
    }
}

fn ids(value: &Value) -> Vec<i32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| match row {
            Value::Array(items) => items.iter().map(|v| v.as_i64().unwrap() as i32).collect(),
            v => vec![v.as_i64().unwrap() as i32],
        })
        .collect()
}

fn base() -> Hlat {
    import_hf(
        &fixture("hf-tiny-llama3"),
        &Device::flex(),
        WeightDtype::F32,
    )
    .unwrap()
    .1
}

fn logits(model: &Hlat, input: &Value) -> Vec<f32> {
    let rows = input.as_array().unwrap().len();
    let flat = ids(input);
    let seq = flat.len() / rows;
    let input = Tensor::<2, Int>::from_data(TensorData::new(flat, [rows, seq]), &Device::flex());
    model
        .forward(input)
        .into_data()
        .try_to_vec::<f32>()
        .unwrap()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn a_peft_adapter_gives_pefts_logits_and_greedy_continuation() {
    let expected = expected();
    let model = base();
    let base_diff = max_diff(
        &logits(&model, &expected["input_ids"]),
        &floats(&expected["base_logits"]),
    );
    assert!(base_diff < 1e-4, "base logits differ by {base_diff}");

    let (config, adapted) =
        load_adapter(model, &fixture("lora-tiny-llama3/adapter"), &Device::flex()).unwrap();
    assert_eq!((config.rank, config.alpha), (4, 8.0));
    assert_eq!(config.targets, LoraTarget::ALL.to_vec());
    let diff = max_diff(
        &logits(&adapted, &expected["input_ids"]),
        &floats(&expected["logits"]),
    );
    assert!(diff < 1e-4, "adapted logits differ from PEFT's by {diff}");

    let prompt: Vec<u32> = ids(&expected["greedy"]["prompt"])
        .iter()
        .map(|&i| i as u32)
        .collect();
    let tokens: Vec<u32> = ids(&expected["greedy"]["tokens"])
        .iter()
        .map(|&i| i as u32)
        .collect();
    let options = GenerationOptions {
        max_new_tokens: tokens.len(),
        sampling: Sampling::Greedy,
        seed: 0,
        stop_ids: vec![],
    };
    assert_eq!(
        generate(&adapted, &prompt, &options, |_| {}).unwrap(),
        tokens
    );
}

#[test]
fn merging_equals_pefts_merge_and_unload() {
    let (_, adapted) = load_adapter(
        base(),
        &fixture("lora-tiny-llama3/adapter"),
        &Device::flex(),
    )
    .unwrap();
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("merged");
    export_hf(&adapted.merge_lora(), &dir, &ExportOptions::default(), None).unwrap();
    let ours = std::fs::read(dir.join("model.safetensors")).unwrap();
    let ours = SafeTensors::deserialize(&ours).unwrap();
    let peft = std::fs::read(fixture("lora-tiny-llama3/merged/model.safetensors")).unwrap();
    let peft = SafeTensors::deserialize(&peft).unwrap();
    let mut names: Vec<_> = peft.names().into_iter().map(str::to_string).collect();
    names.sort();
    let mut ours_names: Vec<_> = ours.names().into_iter().map(str::to_string).collect();
    ours_names.sort();
    assert_eq!(names, ours_names);
    let values = |view: safetensors::tensor::TensorView<'_>| -> Vec<f32> {
        view.data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    for name in names {
        let diff = max_diff(
            &values(ours.tensor(&name).unwrap()),
            &values(peft.tensor(&name).unwrap()),
        );
        assert!(diff < 1e-6, "{name}: merged weights differ by {diff}");
    }
}

/// The adapter of `fixtures/lora-tiny-llama3/written`: rank 2, alpha 3, on q, v and down, with
/// values from a fixed formula.
fn written_model() -> (LoraConfig, Hlat) {
    let config = LoraConfig {
        rank: 2,
        alpha: 3.0,
        dropout: 0.0,
        targets: vec![LoraTarget::Q, LoraTarget::V, LoraTarget::Down],
        rslora: false,
    };
    let model = with_formula_adapters(base(), &config);
    (config, model)
}

/// `model` with `config`'s adapters, A and B filled from a fixed formula (B non-zero, so the
/// adapters change the logits).
fn with_formula_adapters(model: Hlat, config: &LoraConfig) -> Hlat {
    let device = Device::flex();
    let mut model = model.with_lora(config, &device);
    let mut counter = 0usize;
    let mut values = |dims: [usize; 2]| {
        let data: Vec<f32> = (0..dims[0] * dims[1])
            .map(|i| {
                counter += 1;
                0.3 * ((i * 7 + counter * 13) as f32 * 0.37).sin()
            })
            .collect();
        Tensor::<2>::from_data(TensorData::new(data, dims), &device)
    };
    for layer in &mut model.layers {
        for &target in &config.targets {
            // A mixture-of-experts layer has no dense MLP to adapt.
            let Some(slot) = layer.lora_slot(target) else {
                assert!(layer.moe.is_some() && layer.mlp.is_none());
                continue;
            };
            let lora: &mut Lora = slot.as_mut().unwrap();
            lora.lora_a = Param::from_tensor(values(lora.lora_a.dims()));
            lora.lora_b = Param::from_tensor(values(lora.lora_b.dims()));
        }
    }
    model
}

/// LoRA on every family of `fixtures/` (Llama 2 and 3, Qwen2 with q/k/v biases, Qwen3 with q/k
/// norms, Mistral's sliding window, Llama with every bias, and the attention and dense layers of
/// the mixtures of experts), every projection adapted: the
/// adapted model's logits equal those of its merged weights, and an adapter written as a PEFT
/// folder and read back onto the base gives the same logits.
#[test]
fn adapters_work_on_every_family() {
    let config = LoraConfig {
        rank: 3,
        alpha: 6.0,
        dropout: 0.0,
        targets: LoraTarget::ALL.to_vec(),
        rslora: false,
    };
    let device = Device::flex();
    let input = Tensor::<2, Int>::from_data(
        TensorData::new(
            (0..10).map(|i| (i * 37 + 3) % 200).collect::<Vec<i64>>(),
            [1, 10],
        ),
        &device,
    );
    let logits_of = |model: &Hlat| {
        model
            .forward(input.clone())
            .into_data()
            .try_to_vec::<f32>()
            .unwrap()
    };
    for name in test_support::fixtures::HF_FIXTURES {
        let load = || {
            import_hf(&fixture(name), &device, WeightDtype::F32)
                .unwrap()
                .1
        };
        let base_logits = logits_of(&load());
        let adapted = with_formula_adapters(load(), &config);
        let adapted_logits = logits_of(&adapted);
        assert!(
            max_diff(&adapted_logits, &base_logits) > 1e-3,
            "{name}: the adapters change nothing"
        );
        let merged = logits_of(&adapted.clone().merge_lora());
        let scale = adapted_logits.iter().fold(1f32, |m, v| m.max(v.abs()));
        assert!(
            max_diff(&merged, &adapted_logits) <= 1e-5 * scale,
            "{name}: merged logits differ by {}",
            max_diff(&merged, &adapted_logits)
        );
        let out = tempfile::tempdir().unwrap();
        save_adapter(&adapted, &config, Some(name), WeightDtype::F32, out.path()).unwrap();
        let (_, read) = load_adapter(load(), out.path(), &device).unwrap();
        assert_eq!(
            logits_of(&read),
            adapted_logits,
            "{name}: the written adapter differs"
        );
    }
}

#[test]
fn written_adapter_is_the_checked_in_one_peft_reads() {
    let (config, model) = written_model();
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("written");
    save_adapter(
        &model,
        &config,
        Some("hf-tiny-llama3"),
        WeightDtype::F32,
        &dir,
    )
    .unwrap();

    // Read back: the same adapters.
    let (read_config, adapters) =
        read_adapter(&base(), &dir, burn::tensor::DType::F32, &Device::flex()).unwrap();
    assert_eq!(read_config, config);
    for (layer, adapters) in model.layers.iter().zip(&adapters) {
        for (target, lora) in adapters {
            let original = layer.lora(*target).unwrap();
            assert_eq!(
                lora.lora_a.val().into_data(),
                original.lora_a.val().into_data()
            );
            assert_eq!(
                lora.lora_b.val().into_data(),
                original.lora_b.val().into_data()
            );
        }
    }

    let expected = expected();
    let our_logits = logits(&model, &expected["input_ids"]);
    let checked_in = fixture("lora-tiny-llama3/written");
    if std::env::var_os("HLAT_REGENERATE_FIXTURES").is_some() {
        std::fs::create_dir_all(&checked_in).unwrap();
        for file in [ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE] {
            std::fs::copy(dir.join(file), checked_in.join(file)).unwrap();
        }
        let logits_json = serde_json::json!({
            "input_ids": expected["input_ids"],
            "logits": our_logits,
        });
        std::fs::write(
            checked_in.join("logits.json"),
            logits_json.to_string() + "\n",
        )
        .unwrap();
    }
    for file in [ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE] {
        assert!(
            std::fs::read(dir.join(file)).unwrap() == std::fs::read(checked_in.join(file)).unwrap(),
            "{file} differs from the checked-in one (HLAT_REGENERATE_FIXTURES=1 rewrites it; then \
             check it with PEFT: fixtures/regenerate_finetune.py lora --check-written)"
        );
    }
    let stored: Value =
        serde_json::from_str(&std::fs::read_to_string(checked_in.join("logits.json")).unwrap())
            .unwrap();
    let diff = max_diff(&our_logits, &floats(&stored["logits"]));
    assert!(
        diff < 1e-5,
        "logits differ from the checked-in ones by {diff}"
    );
}

#[test]
fn unsupported_adapters_are_refused_by_name() {
    let out = tempfile::tempdir().unwrap();
    let dir = out.path();
    let source = fixture("lora-tiny-llama3/adapter");
    std::fs::copy(
        source.join(ADAPTER_WEIGHTS_FILE),
        dir.join(ADAPTER_WEIGHTS_FILE),
    )
    .unwrap();
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(source.join(ADAPTER_CONFIG_FILE)).unwrap())
            .unwrap();
    for (field, value) in [
        ("use_dora", serde_json::json!(true)),
        ("target_modules", serde_json::json!(".*proj")),
        ("rank_pattern", serde_json::json!({"q_proj": 8})),
        ("peft_type", serde_json::json!("IA3")),
    ] {
        let mut changed = config.clone();
        changed[field] = value;
        std::fs::write(dir.join(ADAPTER_CONFIG_FILE), changed.to_string()).unwrap();
        let error = load_adapter(base(), Path::new(dir), &Device::flex())
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains(field), "{field}: {error}");
    }
    // A rank that does not match the stored tensors.
    let mut changed = config.clone();
    changed["r"] = serde_json::json!(8);
    std::fs::write(dir.join(ADAPTER_CONFIG_FILE), changed.to_string()).unwrap();
    let error = load_adapter(base(), Path::new(dir), &Device::flex())
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains("lora_A") && error.contains("shape"),
        "{error}"
    );
}
