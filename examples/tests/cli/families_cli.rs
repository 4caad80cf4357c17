//! Every LLaMA family through the command line, as a user brings a checkpoint today: greedy
//! generation and perplexity as transformers computes them, a tensor-parallel conversion that
//! exports the same bytes, continued pretraining from the checkpoint (tensor-parallel where the
//! key/value heads split), export and a merge with the base model that evaluates. Mixtures of
//! experts (Mixtral, Qwen2-MoE, Qwen3-MoE) the same way, unsplit, Mixtral through two pipeline
//! stages, and stages that would put a dense layer and a mixture in one slot refused by name.

use super::cpt_cli::{corpus, merge_config, merge_halves, perplexity};
use test_support::fixtures::{HF_FIXTURES, expected};

use super::{as_strs, fixture, short_steps, succeed};

#[test]
fn every_family_generates_evaluates_converts_trains_and_merges() {
    // Every fixture but `hf-tiny-llama`, whose whole workflow `cpt_cli` runs.
    let families = HF_FIXTURES
        .into_iter()
        .filter(|&name| name != "hf-tiny-llama");
    let work = tempfile::tempdir().unwrap();
    let text = |name: &str| work.path().join(name).to_str().unwrap().to_string();
    let domain: Vec<u32> = (0..24).map(|i| 100 + (i * 7) % 24).collect();
    corpus(&work.path().join("domain"), &domain, 40);
    for name in families {
        let base = fixture(name);
        let base = base.to_str().unwrap();
        let expected = expected(name);
        let ids = |value: &serde_json::Value| -> Vec<String> {
            value
                .as_array()
                .unwrap()
                .iter()
                .map(|id| id.to_string())
                .collect()
        };

        let generated = succeed(&[
            "generate",
            "--model",
            base,
            "--prompt-ids",
            &ids(&expected["greedy_prompt"]).join(","),
            "--format",
            "ids",
            "--max-new-tokens",
            "12",
        ]);
        assert_eq!(
            generated.trim(),
            ids(&expected["greedy_continuation"]).join(","),
            "{name}"
        );

        // The training batch's rows: their perplexity is exp of torch's first loss.
        let rows = text(&format!("{name}-rows.json"));
        std::fs::write(&rows, expected["train"]["batch"].to_string()).unwrap();
        let measured = perplexity(&succeed(&[
            "eval",
            "perplexity",
            "--model",
            base,
            "--ids",
            &rows,
        ]));
        let torch = expected["train"]["losses"][0].as_f64().unwrap().exp();
        assert!(
            (measured - torch).abs() <= 1e-4 * torch,
            "{name}: perplexity {measured}, transformers {torch}"
        );

        // Mistral's single key/value head does not split two ways.
        let mixture = name.contains("moe") || name.contains("mixtral");
        let tensor = if name == "hf-tiny-mistral" { "1" } else { "2" };
        let (native, direct, through) = (
            text(&format!("{name}-native")),
            text(&format!("{name}-direct")),
            text(&format!("{name}-through")),
        );
        succeed(&[
            "convert",
            "--from-hf",
            base,
            "--to",
            &native,
            "--tp",
            tensor,
        ]);
        succeed(&["convert", "--from", &native, "--to-hf", &through]);
        succeed(&["convert", "--from-hf", base, "--to-hf", &direct]);
        for file in ["config.json", "model.safetensors"] {
            let read = |dir: &str| std::fs::read(std::path::Path::new(dir).join(file)).unwrap();
            assert!(
                read(&direct) == read(&through),
                "{name}: {file} differs after --tp {tensor}"
            );
        }

        let run = text(&format!("{name}-run"));
        let device = if tensor == "2" { "host:0-1" } else { "host" };
        // `hlat pretrain` from the checkpoint on the domain corpus into `out`, then `extra`.
        let pretrain = |out: &str, steps: &str, extra: &[&str]| -> Vec<String> {
            [
                "pretrain",
                "--init-from-hf",
                base,
                "--data",
                &text("domain"),
            ]
            .into_iter()
            .chain(["--out", out, "--max-steps", steps])
            .chain(extra.iter().copied())
            .chain(short_steps())
            .map(str::to_string)
            .collect()
        };
        succeed(&as_strs(&pretrain(
            &run,
            "2",
            &["--tp", tensor, "--device", device],
        )));
        let metrics =
            std::fs::read_to_string(std::path::Path::new(&run).join("metrics.jsonl")).unwrap();
        for line in metrics.lines() {
            let record: serde_json::Value = serde_json::from_str(line).unwrap();
            let balance = record
                .get("load_balancing_loss")
                .and_then(|value| value.as_f64());
            assert_eq!(balance.is_some(), mixture, "{name}: {line}");
            assert!(balance.is_none_or(|balance| balance > 0.0 && balance.is_finite()));
        }
        // The capacity factor: GShard's dropping on the compiled device for a mixture, refused
        // by name for a dense model.
        let capacity_run = text(&format!("{name}-capacity"));
        let capacity = pretrain(
            &capacity_run,
            "2",
            &["--moe-capacity-factor", "0.5", "--device", "xla"],
        );
        let capacity = as_strs(&capacity);
        if mixture {
            super::require_plugin();
            succeed(&capacity);
            let metrics =
                std::fs::read_to_string(std::path::Path::new(&capacity_run).join("metrics.jsonl"))
                    .unwrap();
            assert_eq!(metrics.lines().count(), 2, "{name}: {metrics}");
        } else if name == "hf-tiny-llama3" {
            let output = super::run(&capacity);
            let refused = String::from_utf8_lossy(&output.stderr);
            assert_eq!(output.status.code(), Some(2), "{refused}");
            assert!(refused.contains("moe_capacity_factor"), "{refused}");
        }
        if mixture {
            // Two pipeline stages: Mixtral's sparse layers split evenly; the Qwen mixtures' first
            // layer is dense, so a slot would hold a dense layer on one stage and a mixture on
            // the other, refused by name.
            let pipelined_run = text(&format!("{name}-pipelined"));
            let pipelined = ["--pp", "2", "--device", "host:0-1"];
            let arguments = pretrain(&pipelined_run, "1", &pipelined);
            let arguments = as_strs(&arguments);
            if name == "hf-tiny-mixtral" {
                succeed(&arguments);
            } else {
                let output = super::run(&arguments);
                let refused = String::from_utf8_lossy(&output.stderr);
                assert_eq!(output.status.code(), Some(2), "{name}: {refused}");
                assert!(
                    refused.contains("pipeline_layers") && refused.contains("dense"),
                    "{name}: {refused}"
                );
            }
        }
        let exported = text(&format!("{name}-exported"));
        succeed(&["convert", "--from", &run, "--to-hf", &exported]);
        let config = work.path().join(format!("{name}-merge.yaml"));
        if name == "hf-tiny-qwen2-moe" {
            // mergekit defines no Qwen2-MoE architecture: refused by name, nothing written.
            let merged = text(&format!("{name}-merged"));
            let output = super::run(&[
                "merge",
                "--config",
                &merge_config(base, &exported, &config),
                "--out",
                &merged,
            ]);
            let refused = String::from_utf8_lossy(&output.stderr);
            assert_eq!(output.status.code(), Some(2), "{refused}");
            assert!(refused.contains("Qwen2MoeForCausalLM"), "{refused}");
            assert!(!std::path::Path::new(&merged).exists());
            continue;
        }
        let merged = merge_halves(base, &exported, &config, &text(&format!("{name}-merged")));
        let halfway = perplexity(&succeed(&[
            "eval",
            "perplexity",
            "--model",
            &merged,
            "--ids",
            &rows,
        ]));
        assert!(halfway.is_finite() && halfway > 1.0, "{name}: {halfway}");
    }
}
