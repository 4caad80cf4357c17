//! `hlat finetune` end to end on the fixtures: the transformers tiny Llama 3
//! (`fixtures/hf-tiny-llama3`) with the Llama 3-style tokenizer and chat template
//! (`fixtures/chat-llama3`), a few LoRA steps on `host`: the loss falls, the PEFT adapter folder
//! is written into the output and each checkpoint, the base weights are saved bit-identical;
//! bad records exit 2 naming the file and line; `--pp` with LoRA is refused.

use std::path::{Path, PathBuf};

use burn::tensor::{Device, TensorData};
use hlat::hf::adapter::{ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, read_adapter_config};
use hlat::lora::LoraTarget;

use super::{as_strs, fixture, losses, run, succeed};

/// A model folder: the tiny Llama 3's weights with the chat fixture's tokenizer (its 1005 ids fit
/// the model's 1024).
pub(super) fn base_model(dir: &Path) -> PathBuf {
    base_model_of(dir, "hf-tiny-llama3")
}

/// A model folder: the weights of fixture `weights` (a vocabulary of 1024) with the chat
/// fixture's tokenizer.
pub(super) fn base_model_of(dir: &Path, weights: &str) -> PathBuf {
    let base = dir.join("base");
    std::fs::create_dir_all(&base).unwrap();
    for (folder, file) in [
        (weights, "config.json"),
        (weights, "generation_config.json"),
        (weights, "model.safetensors"),
        ("chat-llama3", "tokenizer.json"),
        ("chat-llama3", "tokenizer_config.json"),
    ] {
        std::fs::copy(fixture(folder).join(file), base.join(file)).unwrap();
    }
    base
}

/// Prompt/completion and conversation records with one answer each to learn.
fn records(path: &Path) {
    let mut lines = Vec::new();
    for i in 0..6 {
        lines.push(
            serde_json::json!({
                "prompt": format!("Question {i}: what colour is the sky?"),
                "completion": " The sky is blue."
            })
            .to_string(),
        );
        lines.push(
            serde_json::json!({"messages": [
                {"role": "user", "content": format!("Say hello {i}")},
                {"role": "assistant", "content": "Hello there, friend."}
            ]})
            .to_string(),
        );
    }
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

/// Every float parameter of the model in `dir` (which holds no adapters), in visiting order.
pub(super) fn weights(dir: &Path) -> Vec<TensorData> {
    let (_, model, _) = hlat::checkpoint::load_any(dir, &Device::flex()).unwrap();
    assert!(!model.has_lora(), "{} holds adapters", dir.display());
    test_support::module::parameters(&model)
}

/// `hlat finetune` of the model in `base` on the records in `data` into `out`, on `host`, then
/// `extra` flags.
fn finetune(base: &Path, data: &Path, out: &Path, extra: &[&str]) -> Vec<String> {
    tuning(
        &["finetune"],
        base,
        (data, out),
        &[&["--device", "host"], extra].concat(),
    )
}

/// `hlat COMMAND...` (`finetune`, `align --method M`) of the model in `base` on the records in
/// `data` into `out`, then `extra` flags.
pub(super) fn tuning(
    command: &[&str],
    base: &Path,
    (data, out): (&Path, &Path),
    extra: &[&str],
) -> Vec<String> {
    let text = |path: &Path| path.to_str().unwrap().to_string();
    command
        .iter()
        .chain(&["--model"])
        .map(|word| word.to_string())
        .chain([
            text(base),
            "--data".into(),
            text(data),
            "--out".into(),
            text(out),
        ])
        .chain(extra.iter().map(|flag| flag.to_string()))
        .collect()
}

#[test]
fn lora_fine_tuning_writes_a_peft_adapter_and_keeps_the_base_weights() {
    let work = tempfile::tempdir().unwrap();
    let base = base_model(work.path());
    let data = work.path().join("data.jsonl");
    records(&data);
    let out = work.path().join("out");
    let arguments = finetune(
        &base,
        &data,
        &out,
        &[
            "--max-steps",
            "6",
            "--checkpoint-every",
            "3",
            "--lr",
            "1e-2",
            "--lora-rank",
            "4",
            "--lora-alpha",
            "8",
            "--lora-targets",
            "q,v,down",
            "--no-progress",
        ],
    );
    let stdout = succeed(&as_strs(&arguments));
    assert!(stdout.contains("adapter: "), "{stdout}");
    let losses = losses(&out);
    assert_eq!(losses.len(), 6);
    assert!(
        losses[5] < losses[0] - 1.0,
        "the loss does not fall: {losses:?}"
    );
    let adapter = out.join("adapter");
    let config = read_adapter_config(&adapter).unwrap();
    assert_eq!((config.rank, config.alpha), (4, 8.0));
    assert_eq!(
        config.targets,
        [LoraTarget::Q, LoraTarget::V, LoraTarget::Down]
    );
    for step in ["step-00000003", "step-00000006"] {
        let checkpoint = out.join("checkpoints").join(step);
        assert!(
            checkpoint
                .join("adapter")
                .join(ADAPTER_CONFIG_FILE)
                .is_file()
        );
        assert_eq!(
            weights(&checkpoint.join("model")),
            weights(&base),
            "{step}: the base weights changed"
        );
    }
    // The output's adapter is the last checkpoint's.
    assert_eq!(
        std::fs::read(adapter.join(ADAPTER_WEIGHTS_FILE)).unwrap(),
        std::fs::read(
            out.join("checkpoints/step-00000006/adapter")
                .join(ADAPTER_WEIGHTS_FILE)
        )
        .unwrap()
    );
}

#[test]
fn bad_records_and_pipelined_lora_exit_2_naming_the_cause() {
    let work = tempfile::tempdir().unwrap();
    let base = base_model(work.path());
    let text = |path: &Path| path.to_str().unwrap().to_string();
    let cases: [(&str, &[&str], &str); 3] = [
        (
            "{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"prompt\": \"a\"}\n",
            &[],
            ":2: missing `completion`",
        ),
        (
            "{\"messages\": [{\"role\": \"robot\", \"content\": \"hi\"}]}\n",
            &[],
            ":1: ",
        ),
        (
            "{\"prompt\": \"a\", \"completion\": \"b\"}\n",
            &["--lora-rank", "2", "--pp", "2"],
            "pipeline parallelism",
        ),
    ];
    for (index, (data, extra, message)) in cases.into_iter().enumerate() {
        let path = work.path().join(format!("data-{index}.jsonl"));
        std::fs::write(&path, data).unwrap();
        let out = work.path().join(format!("out-{index}"));
        let arguments = finetune(
            &base,
            &path,
            &out,
            &[["--max-steps", "1"].as_slice(), extra].concat(),
        );
        let arguments = as_strs(&arguments);
        let output = run(&arguments);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{arguments:?}: {stderr}");
        assert!(stderr.contains(message), "{arguments:?}: {stderr}");
        if index < 2 {
            assert!(stderr.contains(&text(&path)), "{stderr}");
        }
    }
}

/// `--adapter DIR` continues a PEFT adapter (the fixture's, made by PEFT with non-zero B): the
/// run takes its rank and targets, starts from its weights (the first loss is not the fresh
/// adapters' one, which is the base model's), and `--lora-*` flags that disagree are refused
/// naming the folder.
#[test]
fn fine_tuning_continues_a_peft_adapter() {
    let work = tempfile::tempdir().unwrap();
    let base = base_model(work.path());
    let data = work.path().join("data.jsonl");
    records(&data);
    let text = |path: &Path| path.to_str().unwrap().to_string();
    let peft = fixture("lora-tiny-llama3").join("adapter");
    let first_loss = |out: &Path, adapter: &[&str]| {
        let flags = [["--max-steps", "1", "--no-progress"].as_slice(), adapter].concat();
        succeed(&as_strs(&finetune(&base, &data, out, &flags)));
        losses(out)[0]
    };
    let fresh = first_loss(&work.path().join("fresh"), &["--lora-rank", "4"]);
    let continued_out = work.path().join("continued");
    let continued = first_loss(&continued_out, &["--adapter", &text(&peft)]);
    assert!(
        (continued - fresh).abs() > 1e-3,
        "the PEFT adapter changed nothing: {continued} vs {fresh}"
    );
    let written = read_adapter_config(&continued_out.join("adapter")).unwrap();
    let stored = read_adapter_config(&peft).unwrap();
    assert_eq!(
        (written.rank, written.alpha, written.targets),
        (stored.rank, stored.alpha, stored.targets)
    );
    let peft_text = text(&peft);
    let refused = finetune(
        &base,
        &data,
        &work.path().join("refused"),
        &["--adapter", &peft_text, "--lora-rank", "16"],
    );
    let refused = run(&as_strs(&refused));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--adapter"), "{stderr}");
}

/// A mixture of experts (Qwen3-MoE) fine-tunes whole, with LoRA on its attention projections
/// and with LoRA on its experts too (PEFT adapters written, the experts' as PEFT's
/// `target_parameters`); an expert's gate adapted without its up projection (PEFT adapts them
/// as one) is refused naming the setting.
#[test]
fn a_mixture_of_experts_fine_tunes_whole_and_with_adapters() {
    let work = tempfile::tempdir().unwrap();
    let base = base_model_of(work.path(), "hf-tiny-qwen3-moe");
    let data = work.path().join("data.jsonl");
    records(&data);
    let steps = ["--max-steps", "3", "--lr", "1e-2", "--no-progress"];
    let whole = work.path().join("whole");
    succeed(&as_strs(&finetune(&base, &data, &whole, &steps)));
    let whole_losses = losses(&whole);
    assert_eq!(whole_losses.len(), 3);
    assert!(whole_losses[2] < whole_losses[0], "{whole_losses:?}");

    let adapted = work.path().join("adapted");
    let lora = [&steps[..], &["--lora-rank", "4", "--lora-targets", "q,v"]].concat();
    succeed(&as_strs(&finetune(&base, &data, &adapted, &lora)));
    let config = read_adapter_config(&adapted.join("adapter")).unwrap();
    assert_eq!(config.targets, vec![LoraTarget::Q, LoraTarget::V]);

    let experts_adapted = work.path().join("experts-adapted");
    let lora = [
        &steps[..],
        &["--lora-rank", "4", "--lora-targets", "q,gate,up,down"],
    ]
    .concat();
    succeed(&as_strs(&finetune(&base, &data, &experts_adapted, &lora)));
    let adapter = experts_adapted.join("adapter");
    let config = read_adapter_config(&adapter).unwrap();
    assert_eq!(
        config.targets,
        vec![
            LoraTarget::Q,
            LoraTarget::Gate,
            LoraTarget::Up,
            LoraTarget::Down
        ]
    );
    let written: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(adapter.join("adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(written["target_modules"], serde_json::json!(["q_proj"]));
    assert_eq!(
        written["target_parameters"],
        serde_json::json!(["experts.gate_up_proj", "experts.down_proj"])
    );
    let adapted_losses = losses(&experts_adapted);
    assert!(adapted_losses[2] < adapted_losses[0], "{adapted_losses:?}");

    let refused = work.path().join("refused");
    let experts = [
        &steps[..],
        &["--lora-rank", "4", "--lora-targets", "q,gate"],
    ]
    .concat();
    let output = run(&as_strs(&finetune(&base, &data, &refused, &experts)));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("lora targets")
            && stderr.contains("mixture-of-experts")
            && stderr.contains("gate and up"),
        "{stderr}"
    );
}
