//! PEFT adapters on the command line, against PEFT itself (`fixtures/lora-tiny-llama3`, made by
//! `fixtures/regenerate_finetune.py lora`): `hlat generate --adapter` continues the fixture's
//! prompt with PEFT's greedy tokens, and `hlat convert --merge-adapter` writes the weights of
//! PEFT's `merge_and_unload` (within 1e-6).

use std::path::Path;

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{Device, Tensor, Tolerance};

use super::{fixture, hlat};

fn text(path: &Path) -> String {
    path.to_str().unwrap().to_string()
}

#[test]
fn generate_with_a_peft_adapter_gives_pefts_greedy_tokens() {
    let expected: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("lora-tiny-llama3").join("expected.json")).unwrap(),
    )
    .unwrap();
    let ids = |key: &str| -> Vec<String> {
        expected["greedy"][key]
            .as_array()
            .unwrap()
            .iter()
            .map(|id| id.as_u64().unwrap().to_string())
            .collect()
    };
    let (prompt, tokens) = (ids("prompt"), ids("tokens"));
    let output = hlat()
        .env(burn_trainium::DEVICE_ENV, "host")
        .args([
            "generate",
            "--model",
            &text(&fixture("hf-tiny-llama3")),
            "--adapter",
            &text(&fixture("lora-tiny-llama3").join("adapter")),
            "--prompt-ids",
            &prompt.join(","),
            "--max-new-tokens",
            &tokens.len().to_string(),
            "--greedy",
            "--stop-ids",
            "1023",
            "--format",
            "ids",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let generated = stdout.lines().last().unwrap();
    assert!(
        generated.ends_with(&tokens.join(",")),
        "generated {generated}, PEFT {tokens:?}"
    );
}

/// Every float parameter of a model, in visiting order.
struct Collect(Vec<Tensor<1>>);

impl ModuleVisitor for Collect {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        self.0.push(param.val().flatten(0, D - 1));
    }
}

fn weights(dir: &Path) -> Vec<Tensor<1>> {
    let (_, model, _) = hlat::checkpoint::load_any(dir, &Device::flex()).unwrap();
    let mut collect = Collect(Vec::new());
    model.visit(&mut collect);
    collect.0
}

#[test]
fn convert_merge_adapter_equals_pefts_merge_and_unload() {
    let out = tempfile::tempdir().unwrap();
    let merged = out.path().join("merged");
    let output = hlat()
        .env(burn_trainium::DEVICE_ENV, "host")
        .args([
            "convert",
            "--from-hf",
            &text(&fixture("hf-tiny-llama3")),
            "--merge-adapter",
            &text(&fixture("lora-tiny-llama3").join("adapter")),
            "--to-hf",
            &text(&merged),
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let ours = weights(&merged);
    let peft = weights(&fixture("lora-tiny-llama3").join("merged"));
    assert_eq!(ours.len(), peft.len());
    for (ours, peft) in ours.into_iter().zip(peft) {
        ours.into_data()
            .assert_approx_eq::<f32>(&peft.into_data(), Tolerance::absolute(1e-6));
    }
    // Something changed: the adapter's B matrices are not zero.
    let base = weights(&fixture("hf-tiny-llama3"));
    let changed = weights(&merged)
        .into_iter()
        .zip(base)
        .any(|(merged, base)| (merged - base).abs().max().into_scalar::<f32>() > 1e-3);
    assert!(changed, "the merged weights equal the base's");
}
