//! LoRA against PEFT (`fixtures/lora-tiny-llama3`, and on the experts of mixtures
//! `fixtures/lora-tiny-mixtral` and `lora-tiny-qwen3-moe`, made by
//! `fixtures/regenerate_finetune.py`): a PEFT adapter applied here gives PEFT's logits and greedy
//! continuation, merging gives `merge_and_unload`'s weights, and the adapters this crate writes
//! are the checked-in ones that the script loads with PEFT (`--check-written`).

use std::path::Path;

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::{Device, Int, Tensor, TensorData};
use hlat::Hlat;
use hlat::generate::{GenerationOptions, Sampling, generate};
use hlat::hf::adapter::{
    ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, load_adapter, read_adapter, save_adapter,
};
use hlat::hf::{ExportOptions, WeightDtype, export_hf, import_hf};
use hlat::lora::{LayerAdapters, LoraConfig, LoraTarget};
use safetensors::SafeTensors;
use serde_json::Value;

use super::fixture;

/// A PEFT fixture: its folder under `fixtures/` and the base model's.
#[derive(Clone, Copy)]
struct PeftFixture {
    folder: &'static str,
    base: &'static str,
}

const LLAMA3: PeftFixture = PeftFixture {
    folder: "lora-tiny-llama3",
    base: "hf-tiny-llama3",
};
const MIXTRAL: PeftFixture = PeftFixture {
    folder: "lora-tiny-mixtral",
    base: "hf-tiny-mixtral",
};
const QWEN3_MOE: PeftFixture = PeftFixture {
    folder: "lora-tiny-qwen3-moe",
    base: "hf-tiny-qwen3-moe",
};

impl PeftFixture {
    fn expected(self) -> Value {
        let path = fixture(&format!("{}/expected.json", self.folder));
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    fn path(self, name: &str) -> std::path::PathBuf {
        fixture(&format!("{}/{name}", self.folder))
    }

    fn base(self) -> Hlat {
        import_hf(&fixture(self.base), &Device::flex(), WeightDtype::F32)
            .unwrap()
            .1
    }
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

/// The adapter of `fixture` gives PEFT's logits and greedy continuation on its base; returns the
/// adapter's configuration.
fn assert_gives_pefts_logits_and_tokens(fixture: PeftFixture) -> LoraConfig {
    let expected = fixture.expected();
    let model = fixture.base();
    let base_diff = max_diff(
        &logits(&model, &expected["input_ids"]),
        &floats(&expected["base_logits"]),
    );
    assert!(
        base_diff < 1e-4,
        "{}: base logits differ by {base_diff}",
        fixture.folder
    );

    let (config, adapted) = load_adapter(model, &fixture.path("adapter"), &Device::flex()).unwrap();
    let diff = max_diff(
        &logits(&adapted, &expected["input_ids"]),
        &floats(&expected["logits"]),
    );
    assert!(
        diff < 1e-4,
        "{}: adapted logits differ from PEFT's by {diff}",
        fixture.folder
    );

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
        tokens,
        "{}",
        fixture.folder
    );
    config
}

#[test]
fn a_peft_adapter_gives_pefts_logits_and_greedy_continuation() {
    let config = assert_gives_pefts_logits_and_tokens(LLAMA3);
    assert_eq!((config.rank, config.alpha), (4, 8.0));
    assert_eq!(config.targets, LoraTarget::ALL.to_vec());
}

/// PEFT's adapters of transformers 5's fused experts (`target_parameters`
/// `experts.gate_up_proj`, `experts.down_proj`) with the attention's, on Mixtral and on a
/// Qwen3-MoE whose first layer is dense (PEFT adapts no dense MLP of a mixture).
#[test]
fn a_peft_adapter_on_experts_gives_pefts_logits_and_greedy_continuation() {
    for fixture in [MIXTRAL, QWEN3_MOE] {
        let config = assert_gives_pefts_logits_and_tokens(fixture);
        assert_eq!((config.rank, config.alpha), (4, 8.0));
        assert_eq!(
            config.targets,
            LoraTarget::ALL.to_vec(),
            "{}",
            fixture.folder
        );
    }
}

#[test]
fn merging_equals_pefts_merge_and_unload() {
    for fixture in [LLAMA3, MIXTRAL, QWEN3_MOE] {
        let (_, adapted) =
            load_adapter(fixture.base(), &fixture.path("adapter"), &Device::flex()).unwrap();
        let out = tempfile::tempdir().unwrap();
        let dir = out.path().join("merged");
        export_hf(&adapted.merge_lora(), &dir, &ExportOptions::default(), None).unwrap();
        let ours = std::fs::read(dir.join("model.safetensors")).unwrap();
        let ours = SafeTensors::deserialize(&ours).unwrap();
        let peft = std::fs::read(fixture.path("merged/model.safetensors")).unwrap();
        let peft = SafeTensors::deserialize(&peft).unwrap();
        let mut names: Vec<_> = peft.names().into_iter().map(str::to_string).collect();
        names.sort();
        let mut ours_names: Vec<_> = ours.names().into_iter().map(str::to_string).collect();
        ours_names.sort();
        assert_eq!(names, ours_names, "{}", fixture.folder);
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
            assert!(
                diff < 1e-6,
                "{} {name}: merged weights differ by {diff}",
                fixture.folder
            );
        }
    }
}

/// The adapter of `fixture`'s `written/`: rank 2, alpha 3, with values from a fixed formula; on
/// q, v and down of Llama 3, on q and every expert's projections of Mixtral.
fn written_model(fixture: PeftFixture) -> (LoraConfig, Hlat) {
    let targets = match fixture.folder {
        "lora-tiny-mixtral" => vec![
            LoraTarget::Q,
            LoraTarget::Gate,
            LoraTarget::Up,
            LoraTarget::Down,
        ],
        _ => vec![LoraTarget::Q, LoraTarget::V, LoraTarget::Down],
    };
    let config = LoraConfig {
        rank: 2,
        alpha: 3.0,
        dropout: 0.0,
        targets,
        rslora: false,
    };
    let model = with_formula_adapters(fixture.base(), &config);
    (config, model)
}

/// `model` with `config`'s adapters, every factor of every adapter (an expert's included) filled
/// from a fixed formula (B non-zero, so the adapters change the logits).
fn with_formula_adapters(model: Hlat, config: &LoraConfig) -> Hlat {
    /// Fills the parameters of modules named `…lora` in visiting order, counting elements.
    struct Formula {
        modules: Vec<String>,
        counter: usize,
    }
    impl ModuleMapper for Formula {
        fn enter_module(&mut self, name: &str, _container_type: &str) {
            self.modules.push(name.to_string());
        }
        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.modules.pop();
        }
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
            // The last name entered is the parameter's own; the one before, its module's.
            let module = self.modules.iter().rev().nth(1);
            if !module.is_some_and(|name| name.ends_with("lora")) {
                return param;
            }
            let counter = &mut self.counter;
            param.map(|tensor| {
                let shape = tensor.shape();
                let data: Vec<f32> = (0..shape.num_elements())
                    .map(|i| {
                        *counter += 1;
                        0.3 * ((i * 7 + *counter * 13) as f32 * 0.37).sin()
                    })
                    .collect();
                Tensor::from_data(TensorData::new(data, shape), &tensor.device())
            })
        }
    }
    model.with_lora(config, &Device::flex()).map(&mut Formula {
        modules: Vec::new(),
        counter: 0,
    })
}

/// LoRA on every family of `fixtures/` (Llama 2 and 3, Qwen2 with q/k/v biases, Qwen3 with q/k
/// norms, Mistral's sliding window, Llama with every bias, and the attention and experts of the
/// mixtures of experts), every projection adapted: the
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

/// The adapters this crate writes (Llama 3's, and one on Mixtral's experts) are the checked-in
/// ones, which `fixtures/regenerate_finetune.py … --check-written` loads with PEFT.
#[test]
fn written_adapters_are_the_checked_in_ones_peft_reads() {
    for fixture in [LLAMA3, MIXTRAL] {
        check_written_adapter(fixture);
    }
}

fn check_written_adapter(fixture: PeftFixture) {
    let (config, model) = written_model(fixture);
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("written");
    save_adapter(&model, &config, Some(fixture.base), WeightDtype::F32, &dir).unwrap();

    // Read back: the same adapters.
    let (read_config, adapters) = read_adapter(
        &fixture.base(),
        &dir,
        burn::tensor::DType::F32,
        &Device::flex(),
    )
    .unwrap();
    assert_eq!(read_config, config);
    let values = |adapters: &[LayerAdapters]| -> Vec<TensorData> {
        let mut values = Vec::new();
        for layer in adapters {
            for (_, lora) in &layer.projections {
                values.extend([lora.lora_a.val().into_data(), lora.lora_b.val().into_data()]);
            }
            for expert in &layer.experts {
                if let Some(lora) = &expert.gate_up {
                    values.extend([
                        lora.lora_a.val().into_data(),
                        lora.lora_b_gate.val().into_data(),
                        lora.lora_b_up.val().into_data(),
                    ]);
                }
                if let Some(lora) = &expert.down {
                    values.extend([lora.lora_a.val().into_data(), lora.lora_b.val().into_data()]);
                }
            }
        }
        values
    };
    let written = values(&model.adapters());
    assert!(!written.is_empty());
    assert_eq!(values(&adapters), written, "{}", fixture.folder);

    let expected = fixture.expected();
    let our_logits = logits(&model, &expected["input_ids"]);
    let checked_in = fixture.path("written");
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
            "{}: {file} differs from the checked-in one (HLAT_REGENERATE_FIXTURES=1 rewrites it; \
             then check it with PEFT: fixtures/regenerate_finetune.py … --check-written)",
            fixture.folder
        );
    }
    let stored: Value =
        serde_json::from_str(&std::fs::read_to_string(checked_in.join("logits.json")).unwrap())
            .unwrap();
    let diff = max_diff(&our_logits, &floats(&stored["logits"]));
    assert!(
        diff < 1e-5,
        "{}: logits differ from the checked-in ones by {diff}",
        fixture.folder
    );
}

#[test]
fn unsupported_adapters_are_refused_by_name() {
    let out = tempfile::tempdir().unwrap();
    let dir = out.path();
    let source = LLAMA3.path("adapter");
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
        let error = load_adapter(LLAMA3.base(), Path::new(dir), &Device::flex())
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains(field), "{field}: {error}");
    }
    // A rank that does not match the stored tensors.
    let mut changed = config.clone();
    changed["r"] = serde_json::json!(8);
    std::fs::write(dir.join(ADAPTER_CONFIG_FILE), changed.to_string()).unwrap();
    let error = load_adapter(LLAMA3.base(), Path::new(dir), &Device::flex())
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains("lora_A") && error.contains("shape"),
        "{error}"
    );
}
