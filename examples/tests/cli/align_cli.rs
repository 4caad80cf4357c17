//! `hlat align` end to end on the fixtures: the transformers tiny Llama 3 with the chat fixture's
//! tokenizer, TRL's preference records (`fixtures/align-tiny-llama3`, plain and
//! conversational). DPO against the fixture's reference model and ORPO log the loss, rewards,
//! margins and accuracy of every step; a run on `xla` compiles a fixed set of programs; LoRA
//! writes a PEFT adapter and keeps the base weights; bad records and settings a run of pairs
//! cannot honour exit 2 naming the cause.

use std::path::Path;

use hlat::hf::adapter::read_adapter_config;
use hlat_train::metrics::StepMetrics;
use test_support::training::logged_steps;

use super::finetune_cli::{base_model, tuning, weights};
use super::{as_strs, fixture, number_after, require_plugin, run, succeed};

/// The fixture's preference records in `file` (`prefs.jsonl` plain, `prefs-chat.jsonl`
/// conversational).
fn records(file: &str) -> std::path::PathBuf {
    fixture("align-tiny-llama3").join(file)
}

/// `hlat align --method METHOD` of `base` on `data` into `out` on `device`: `max_steps` steps at
/// lr 1e-3 of rows of 64 tokens, then `extra`.
fn align(
    (method, device): (&str, &str),
    base: &Path,
    (data, out): (&Path, &Path),
    max_steps: &str,
    extra: &[&str],
) -> Vec<String> {
    let flags = [
        "--device",
        device,
        "--max-steps",
        max_steps,
        "--lr",
        "1e-3",
        "--seq-len",
        "64",
        "--no-progress",
    ];
    tuning(
        &["align", "--method", method],
        base,
        (data, out),
        &[&flags[..], extra].concat(),
    )
}

/// Every step's line holds the loss, the rewards of both sides, their margin (chosen minus
/// rejected) and the accuracy (a fraction of the step's pairs).
fn assert_rewards_logged(out: &Path, steps: usize) -> Vec<StepMetrics> {
    let logged = logged_steps(out);
    assert_eq!(logged.len(), steps, "{}", out.display());
    for line in &logged {
        let step = line.step;
        let value = |value: Option<f64>, name: &str| {
            value.unwrap_or_else(|| panic!("step {step}: no {name} in metrics.jsonl"))
        };
        let chosen = value(line.rewards_chosen, "rewards_chosen");
        let rejected = value(line.rewards_rejected, "rewards_rejected");
        let margins = value(line.rewards_margins, "rewards_margins");
        let accuracy = value(line.rewards_accuracies, "rewards_accuracies");
        assert!(line.loss.is_finite(), "step {step}: loss {}", line.loss);
        assert!(
            (margins - (chosen - rejected)).abs() < 1e-5,
            "step {step}: margins {margins}, rewards {chosen} and {rejected}"
        );
        // Four pairs a step: the accuracy counts quarters.
        assert!(
            (0.0..=1.0).contains(&accuracy) && (accuracy * 4.0).fract() == 0.0,
            "step {step}: accuracy {accuracy}"
        );
    }
    logged
}

/// DPO against the fixture's reference model on plain records, and ORPO on conversational ones,
/// log every step's rewards (in `metrics.jsonl`, and the margin and accuracy in the dashboard's
/// metric logs); the DPO loss falls and its first is not ln 2 (the reference differs
/// from the policy); the same command again finds the run finished; on `xla`, tensor parallel
/// with full activation checkpointing, the run equals the host's and compiles its programs in
/// the first steps and none after.
#[test]
fn dpo_and_orpo_log_their_rewards_every_step() {
    let work = tempfile::tempdir().unwrap();
    let base = base_model(work.path());
    let reference = fixture("align-tiny-llama3/reference");
    let reference = reference.to_str().unwrap();
    let out = work.path().join("dpo");
    let dpo = align(
        ("dpo", "host"),
        &base,
        (&records("prefs.jsonl"), &out),
        "6",
        &["--ref-model", reference],
    );
    succeed(&as_strs(&dpo));
    let logged = assert_rewards_logged(&out, 6);
    assert!((logged[0].loss - std::f64::consts::LN_2).abs() > 1e-3);
    assert!(
        logged[5].loss < logged[0].loss,
        "the DPO loss does not fall: {} -> {}",
        logged[0].loss,
        logged[5].loss
    );
    // The dashboard's metrics, as Burn's metric logs record them: each step's margin and
    // accuracy (in percent).
    let burn_log = |name: &str| -> Vec<f64> {
        std::fs::read_to_string(out.join("train/epoch-1").join(name))
            .unwrap()
            .lines()
            .filter(|line| !line.ends_with(",final"))
            .map(|line| line.split(',').next().unwrap().parse().unwrap())
            .collect()
    };
    let margins = burn_log("Reward_margin.log");
    let accuracies = burn_log("Reward_accuracy.log");
    assert_eq!((margins.len(), accuracies.len()), (6, 6));
    for (line, (margin, accuracy)) in logged.iter().zip(margins.iter().zip(&accuracies)) {
        assert!((margin - line.rewards_margins.unwrap()).abs() < 1e-6);
        assert!((accuracy - 100.0 * line.rewards_accuracies.unwrap()).abs() < 1e-6);
    }
    // The same command again finds the run finished, and computes no reference.
    let again = run(&as_strs(&dpo));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&again.stdout),
        String::from_utf8_lossy(&again.stderr),
    );
    assert!(again.status.success(), "{stderr}");
    assert!(stdout.contains("nothing to train"), "{stdout}");
    assert!(!stderr.contains("reference model:"), "{stderr}");
    // With another β, it is refused naming the folder's pinned settings.
    let other_beta = as_strs(&dpo)
        .into_iter()
        .chain(["--beta", "0.5"])
        .collect::<Vec<_>>();
    let refused = run(&other_beta);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("preference.json"), "{stderr}");

    let out = work.path().join("orpo");
    let orpo = align(
        ("orpo", "host"),
        &base,
        (&records("prefs-chat.jsonl"), &out),
        "3",
        &[],
    );
    succeed(&as_strs(&orpo));
    assert_rewards_logged(&out, 3);

    // On `xla`, tensor parallel 2 with full activation checkpointing: the host run's losses and
    // margins (the same pairs drawn), and programs compiled in the first steps only.
    require_plugin();
    let out = work.path().join("dpo-xla");
    let on_xla = align(
        ("dpo", "xla:0-1"),
        &base,
        (&records("prefs.jsonl"), &out),
        "6",
        &[
            "--ref-model",
            reference,
            "--tp",
            "2",
            "--activation-checkpointing",
            "full",
        ],
    );
    succeed(&as_strs(&on_xla));
    let on_xla = assert_rewards_logged(&out, 6);
    for (xla, host) in on_xla.iter().zip(&logged) {
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-4 * b.abs().max(1.0);
        assert!(
            close(xla.loss, host.loss)
                && close(xla.rewards_margins.unwrap(), host.rewards_margins.unwrap()),
            "step {}: xla {xla:?}, host {host:?}",
            xla.step
        );
    }
    let compiles: Vec<u64> = on_xla
        .iter()
        .map(|line| line.compiles.expect("xla counts its programs"))
        .collect();
    assert_eq!(
        compiles[2], compiles[5],
        "programs compiled late: {compiles:?}"
    );
    assert!(compiles[5] <= 8, "too many programs: {compiles:?}");
}

/// `--lora-rank` trains adapters on frozen weights: the PEFT adapter folder is written into the
/// output, the checkpoint's base weights are the starting model's. Fresh adapters (B = 0) start
/// as the reference, the starting model: the first DPO loss is ln 2. `--adapter` continues a
/// PEFT adapter whose reference is the model without it, as TRL's: the first loss is not ln 2.
#[test]
fn lora_alignment_writes_a_peft_adapter_and_keeps_the_base_weights() {
    let work = tempfile::tempdir().unwrap();
    let base = base_model(work.path());
    let out = work.path().join("out");
    let arguments = align(
        ("dpo", "host"),
        &base,
        (&records("prefs.jsonl"), &out),
        "3",
        &["--lora-rank", "4", "--lora-targets", "q,v"],
    );
    let stdout = succeed(&as_strs(&arguments));
    assert!(stdout.contains("adapter: "), "{stdout}");
    assert_rewards_logged(&out, 3);
    let config = read_adapter_config(&out.join("adapter")).unwrap();
    assert_eq!((config.rank, config.alpha), (4, 8.0));
    assert_eq!(
        weights(&out.join("checkpoints/step-00000003/model")),
        weights(&base),
        "the base weights changed"
    );
    // A LoRA run's folder is not a model (its checkpoints keep the adapter apart): refused as
    // the reference or the starting model, naming the flag.
    for flag in ["--ref-model", "--model"] {
        let arguments = align(
            ("dpo", "host"),
            &base,
            (&records("prefs.jsonl"), &work.path().join("refused")),
            "1",
            &[],
        );
        let mut arguments = as_strs(&arguments);
        match flag {
            "--model" => {
                let at = arguments
                    .iter()
                    .position(|word| *word == "--model")
                    .unwrap();
                arguments[at + 1] = out.to_str().unwrap();
            }
            _ => arguments.extend([flag, out.to_str().unwrap()]),
        }
        let output = run(&arguments);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{flag}: {stderr}");
        assert!(stderr.contains(&format!("{flag} ")), "{flag}: {stderr}");
        assert!(stderr.contains("a LoRA run"), "{flag}: {stderr}");
    }
    let first_loss = |out: &Path| logged_steps(out)[0].loss;
    assert!((first_loss(&out) - std::f64::consts::LN_2).abs() < 1e-5);

    let peft = fixture("lora-tiny-llama3").join("adapter");
    let continued = work.path().join("continued");
    let arguments = align(
        ("dpo", "host"),
        &base,
        (&records("prefs.jsonl"), &continued),
        "1",
        &["--adapter", peft.to_str().unwrap()],
    );
    succeed(&as_strs(&arguments));
    assert!(
        (first_loss(&continued) - std::f64::consts::LN_2).abs() > 1e-3,
        "the adapter's policy scored as its own reference"
    );
    let (written, stored) = (
        read_adapter_config(&continued.join("adapter")).unwrap(),
        read_adapter_config(&peft).unwrap(),
    );
    assert_eq!(
        (written.rank, written.alpha, written.targets),
        (stored.rank, stored.alpha, stored.targets)
    );
}

/// A bad record exits 2 naming the file and line; so do flags the method does not take and
/// settings a run of pairs cannot honour, naming the flag or setting.
#[test]
fn bad_records_and_settings_exit_2_naming_the_cause() {
    let work = tempfile::tempdir().unwrap();
    let base = base_model(work.path());
    let good = "{\"prompt\": \"a\", \"chosen\": \" b\", \"rejected\": \" c\"}\n";
    let cases: [(&str, &str, &[&str], &str); 8] = [
        (
            "dpo",
            "{\"prompt\": \"a\", \"chosen\": \" b\", \"rejected\": \" c\"}\n{\"prompt\": \"a\", \
             \"chosen\": \" b\"}\n",
            &[],
            ":2: ",
        ),
        ("orpo", good, &["--ref-model", "x"], "--ref-model"),
        (
            "orpo",
            good,
            &["--label-smoothing", "0.1"],
            "--label-smoothing",
        ),
        (
            "dpo",
            good,
            &["--label-smoothing", "0.5"],
            "--label-smoothing 0.5",
        ),
        ("dpo", good, &["--pp", "2"], "pipeline_parallel"),
        (
            "dpo",
            good,
            &["--micro-batch-rows", "3"],
            "micro_batch_rows",
        ),
        ("dpo", good, &["--eval-every", "2"], "eval_every"),
        (
            "dpo",
            good,
            &["--ref-model", "no-such-folder"],
            "--ref-model no-such-folder",
        ),
    ];
    for (index, (method, data, extra, message)) in cases.into_iter().enumerate() {
        let path = work.path().join(format!("prefs-{index}.jsonl"));
        std::fs::write(&path, data).unwrap();
        let out = work.path().join(format!("out-{index}"));
        let arguments = align((method, "host"), &base, (&path, &out), "1", extra);
        let arguments = as_strs(&arguments);
        let output = run(&arguments);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{arguments:?}: {stderr}");
        assert!(stderr.contains(message), "{arguments:?}: {stderr}");
        if index == 0 {
            assert!(stderr.contains(path.to_str().unwrap()), "{stderr}");
        }
        assert!(
            !out.join("checkpoints").exists(),
            "{arguments:?}: a refused run wrote checkpoints"
        );
    }
}

/// `hlat info --align dpo` on Llama-3.1-8B at tp 8: pairs of rows (the activations of as many
/// rows of a next-token run), and the reference pass before training: the model's weights per device and a micro-batch's
/// f32 logits (2 rows × 4096 × 128256 / 8 × 4 bytes). ORPO has no reference; the settings a
/// run of pairs refuses are refused by name.
#[test]
fn info_sizes_a_preference_run() {
    let layout = ["info", "llama-3.1-8b", "--tp", "8", "--seq-len", "4096"];
    let dpo = succeed(&[&layout[..], &["--align", "dpo"]].concat());
    assert!(
        dpo.contains("alignment: dpo, pairs per micro-batch: 1"),
        "{dpo}"
    );
    let weights = number_after(&dpo, "memory per device: parameters ");
    let pass = number_after(&dpo, "forward only: ");
    let logits = (2 * 4096 * 128256 / 8 * 4) as f64 / (1u64 << 30) as f64;
    assert!((pass - (weights + logits)).abs() <= 0.011, "{dpo}");
    assert_eq!(number_after(&dpo, "would add "), weights, "{dpo}");
    // A pair's rows take the backward pass of any two rows (attention by blocks past 512).
    let rows = succeed(&[&layout[..], &["--micro-batch-rows", "2"]].concat());
    assert_eq!(
        number_after(&dpo, "activations "),
        number_after(&rows, "activations "),
        "{dpo}\n{rows}"
    );
    let orpo = succeed(&[&layout[..], &["--align", "orpo"]].concat());
    assert!(orpo.contains("no reference model"), "{orpo}");
    for (extra, message) in [
        (["--pp", "2"], "pipeline_parallel"),
        (["--micro-batch-rows", "3"], "micro_batch_rows"),
    ] {
        let arguments = [&layout[..], &["--align", "dpo"], &extra[..]].concat();
        let output = run(&arguments);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{arguments:?}: {stderr}");
        assert!(stderr.contains(message), "{arguments:?}: {stderr}");
    }
}
