//! The main job end to end through the `hlat` binary: `hlat pretrain` on a small preset, then
//! every command the README runs on its run folder, as the README writes them, in its order.

use std::path::Path;

use super::{NO_VARIABLES, run, step_flags, succeed, succeed_in};

/// The README's commands after the main job (its first `hlat` code block): each as the
/// arguments after `cargo run -p hlat-cli --`.
fn readme_commands() -> Vec<Vec<String>> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let section = readme
        .split("## The `hlat` command line")
        .nth(1)
        .expect("the README's command-line section");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a code block of commands");
    block
        .lines()
        .map(|line| {
            let arguments = line
                .strip_prefix("cargo run -p hlat-cli -- ")
                .unwrap_or_else(|| panic!("not an hlat command: {line}"));
            shlex::split(arguments).unwrap_or_else(|| panic!("unbalanced quotes: {line}"))
        })
        .collect()
}

/// The inputs the README's commands name, written into `folder`.
fn readme_inputs(folder: &Path) {
    std::fs::write(
        folder.join("notes.txt"),
        "The cat sat on the mat. The dog ran in the park.",
    )
    .unwrap();
    let task = [
        r#"{"context": "The cat", "choices": ["sat", "flew"], "gold": 0}"#,
        r#"{"context": "The dog", "choices": ["ran", "sang"], "gold": 0}"#,
        r#"{"context": "A bird", "choices": ["flew"], "gold": 0, "split": "train"}"#,
    ];
    std::fs::write(folder.join("task.jsonl"), task.join("\n")).unwrap();
    let sft = [
        r#"{"prompt": "The cat", "completion": " sat on the mat."}"#,
        r#"{"prompt": "The dog", "completion": " ran in the park."}"#,
    ];
    std::fs::write(folder.join("sft.jsonl"), sft.join("\n")).unwrap();
}

#[test]
fn pretrain_then_every_command_of_the_readme_on_its_run_folder() {
    let folder = tempfile::tempdir().unwrap();
    let in_folder = |arguments: &[&str]| succeed_in(folder.path(), arguments, NO_VARIABLES);
    // The main job, shortened: fewer steps of shorter rows.
    in_folder(
        &[
            &[
                "pretrain",
                "--max-steps",
                "30",
                "--lr",
                "0.01",
                "--warmup-steps",
                "5",
                "--eval-every",
                "0",
                "--checkpoint-every",
                "30",
                "--no-progress",
            ][..],
            &step_flags("32", "256", "8"),
        ]
        .concat(),
    );
    let out = folder.path().join("runs/hlat-tiny");

    let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let losses: Vec<f64> = metrics
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .inspect(|record| {
            for key in ["step", "loss", "lr", "grad_norm", "tokens_per_s"] {
                assert!(
                    record.get(key).is_some(),
                    "metrics.jsonl lacks `{key}`: {record}"
                );
            }
        })
        .map(|record| record["loss"].as_f64().unwrap())
        .collect();
    assert_eq!(losses.len(), 30);
    let first: f64 = losses[..5].iter().sum::<f64>() / 5.0;
    let last: f64 = losses[25..].iter().sum::<f64>() / 5.0;
    assert!(
        last < first * 0.8,
        "the loss must fall clearly: first steps {first:.3}, last steps {last:.3}"
    );

    let generated = in_folder(&[
        "generate",
        "--model",
        "runs/hlat-tiny",
        "--prompt-ids",
        "1,5,6",
        "--max-new-tokens",
        "5",
        "--greedy",
        "--format",
        "ids",
        "--stats",
    ]);
    let mut lines = generated.lines();
    let ids: Vec<u32> = lines
        .next()
        .unwrap()
        .trim()
        .split(',')
        .map(|id| id.trim().parse().unwrap())
        .collect();
    assert!(!ids.is_empty() && ids.len() <= 5, "{generated}");
    // On the host executor nothing compiles; the statistics still say so.
    assert!(lines.any(|line| line == "compiles: 0"), "{generated}");

    readme_inputs(folder.path());
    let commands = readme_commands();
    let names: Vec<String> = commands
        .iter()
        .map(|command| command[..2].join(" "))
        .collect();
    for expected in [
        "generate --model",
        "eval choice",
        "finetune --model",
        "convert --from",
    ] {
        assert!(names.contains(&expected.to_string()), "{names:?}");
    }
    for command in &commands {
        let mut arguments: Vec<&str> = command.iter().map(String::as_str).collect();
        if arguments[0] == "finetune" {
            // The README's fine-tuning, shortened.
            arguments.extend(["--max-steps", "2", "--no-progress"]);
        }
        let output = in_folder(&arguments);
        let expected: &[&str] = match &arguments[..2] {
            ["eval", "perplexity"] => &["perplexity: ", "bits per byte: "],
            ["eval", "choice"] => &["questions: 2", "acc: ", "acc_norm: "],
            ["eval", _] => &["perplexity"],
            ["finetune", _] => &["trained steps 1..2"],
            ["convert", _] => &["wrote Hugging Face folder"],
            _ => &[],
        };
        for text in expected {
            assert!(output.contains(text), "hlat {arguments:?}: {output}");
        }
    }
}

#[test]
fn pretrain_rejects_an_unknown_preset_by_name() {
    let folder = tempfile::tempdir().unwrap();
    let output = run(&[
        "pretrain",
        "--preset",
        "hlat-13b",
        "--out",
        folder.path().to_str().unwrap(),
    ]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("hlat-13b"), "{stderr}");
}

#[test]
fn info_sizes_hlat_7b_in_the_papers_layout() {
    let text = succeed(&[
        "info",
        "hlat-7b",
        "--tp",
        "8",
        "--dp",
        "32",
        "--zero1",
        "--sequence-parallel",
        "--activation-checkpointing",
        "full",
        "--seq-len",
        "4096",
        "--micro-batch-rows",
        "1",
    ]);
    // Per device: the embedding, head and projections split 8 ways, the 65 norm gains whole.
    let split = (6_738_415_616u64 - 65 * 4096) / 8 + 65 * 4096;
    assert!(
        text.contains(&format!("\nparameters per device: {split}\n")),
        "{text}"
    );
    assert!(text.contains("of 16 GiB: fits"), "{text}");
    let whole = succeed(&["info", "hlat-7b"]);
    assert!(whole.contains("of 16 GiB: does not fit"), "{whole}");
}

/// Llama 3.1 8B fully sharded over 32 data-parallel devices with full activation checkpointing
/// fits a 16 GiB device, where ZeRO-1 does not: each device holds ⌈n / 32⌉ elements of each of
/// its 291 tensors, and gathers one part at a time (the largest is the embedding or the head,
/// 128,256 × 4,096 in bf16).
#[test]
fn info_sizes_llama_8b_fully_sharded() {
    let flags = [
        "info",
        "llama-3.1-8b",
        "--dp",
        "32",
        "--seq-len",
        "8192",
        "--activation-checkpointing",
        "full",
    ];
    let sharded = succeed(&[&flags[..], &["--fsdp"]].concat());
    let total = 8_030_261_248u64;
    let per_device: u64 = sharded
        .lines()
        .find_map(|line| line.strip_prefix("parameters per device: "))
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("{sharded}"));
    assert!(
        (total / 32..=total / 32 + 291).contains(&per_device),
        "{per_device}: {sharded}"
    );
    let gathered = 128_256.0 * 4096.0 * 2.0 / (1u64 << 30) as f64;
    assert!(
        sharded.contains(&format!("gathered weights {gathered:.2} GiB"))
            && sharded.contains("fully sharded")
            && sharded.contains("of 16 GiB: fits"),
        "{sharded}"
    );
    let zero1 = succeed(&[&flags[..], &["--zero1"]].concat());
    assert!(zero1.contains("of 16 GiB: does not fit"), "{zero1}");
}

/// Mixtral 8x7B with its experts split over 8 data-parallel ranks: each device holds the
/// attention, the routers, the embedding and the head, and one expert of each layer's eight
/// (32 layers × 3 projections of 4,096 × 14,336 each).
#[test]
fn info_sizes_mixtral_with_its_experts_split() {
    let expert = 3 * 4096 * 14_336u64;
    let experts = 32 * 8 * expert;
    let per_device = 46_702_792_704 - experts + experts / 8;
    let text = succeed(&["info", "mixtral-8x7b", "--dp", "8", "--ep", "8"]);
    assert!(
        text.contains(&format!("\nparameters per device: {per_device}\n"))
            && text.contains("dp 8 (experts split over 8)"),
        "{text}"
    );
    let whole = succeed(&["info", "mixtral-8x7b", "--dp", "8"]);
    assert!(
        whole.contains("\nparameters per device: 46702792704\n"),
        "{whole}"
    );
}

/// HLAT-70B as it was trained (TP 32 × PP 8, KV heads replicated 4 ways): the parameters one
/// device holds, counted by hand from the configuration, and the schedule's bubble.
#[test]
fn info_sizes_hlat_70b_in_its_pipeline_layout() {
    // The layout HLAT-70B was trained in.
    let trained = ["info", "hlat-70b", "--tp", "32", "--pp", "8", "--dp", "4"];
    let text = succeed(
        &[
            &trained[..],
            &[
                "--zero1",
                "--sequence-parallel",
                "--activation-checkpointing",
                "selective",
                "--seq-len",
                "4096",
                "--micro-batch-rows",
                "1",
            ],
        ]
        .concat(),
    );
    let (hidden, head_dim, ffn, vocab, tp) = (8192u64, 128u64, 28672u64, 32000u64, 32u64);
    // Per layer and device: 2 of the 64 query heads (q and o), 1 of the 8 KV heads (k and v,
    // each held by 4 devices), 1/32 of the MLP, the two norm gains whole.
    let per_layer =
        2 * hidden * (2 * head_dim) + 2 * hidden * head_dim + 3 * hidden * (ffn / tp) + 2 * hidden;
    // 80 layers over 8 stages: 10 per device, with the embedding, head (1/32 of the vocabulary
    // each) and final norm every stage holds.
    let per_device = 10 * per_layer + 2 * (vocab / tp) * hidden + hidden;
    assert!(
        text.contains(&format!("\nparameters per device: {per_device}\n")),
        "{text}"
    );
    // 4M tokens of 4096-token rows over dp 4: 256 micro-batches; bubble 7 / 263.
    assert!(
        text.contains("layers per stage 10,10,10,10,10,10,10,10"),
        "{text}"
    );
    assert!(text.contains("256 micro-batches, bubble 0.0266"), "{text}");
    assert!(text.contains("of 16 GiB: fits"), "{text}");
    let interleaved = succeed(
        &[
            &trained[..],
            &[
                "--pp-schedule",
                "interleaved",
                "--virtual-stages",
                "2",
                "--seq-len",
                "4096",
            ],
        ]
        .concat(),
    );
    // (p - 1) / (m·V + p - 1) = 7 / 519.
    assert!(interleaved.contains("bubble 0.0135"), "{interleaved}");
    let llama = succeed(&["info", "llama-3.1-8b", "--tp", "16"]);
    assert!(llama.contains("parameters per device: "), "{llama}");
}

/// LoRA on a frozen Llama-3.1-8B at tp 8: the trainable parameters per device, counted by hand
/// (A `[r, in]` and B `[out, r]` of each projection, B split with a column-parallel projection's
/// outputs, A with a row-parallel one's inputs), and no gradients or optimizer state for the rest.
#[test]
fn info_counts_the_trainable_adapters_of_lora() {
    let text = succeed(&[
        "info",
        "llama-3.1-8b",
        "--tp",
        "8",
        "--lora-rank",
        "16",
        "--seq-len",
        "4096",
    ]);
    let (r, hidden, kv, ffn, tp, layers) = (16u64, 4096u64, 1024u64, 14336u64, 8u64, 32u64);
    let column = |input: u64, out: u64| r * input + out / tp * r;
    let row = |input: u64, out: u64| r * input / tp + out * r;
    let per_layer = column(hidden, hidden)
        + 2 * column(hidden, kv)
        + row(hidden, hidden)
        + 2 * column(hidden, ffn)
        + row(ffn, hidden);
    assert!(
        text.contains(&format!(
            "trainable parameters per device: {} (LoRA rank 16",
            layers * per_layer
        )),
        "{text}"
    );
    let full = succeed(&["info", "llama-3.1-8b", "--tp", "8", "--seq-len", "4096"]);
    let gib = super::number_after;
    // Frozen weights: the gradients and AdamW state shrink to the adapters'.
    assert!(
        gib(&text, "gradients ") < 0.05 * gib(&full, "gradients "),
        "{text}"
    );
    assert!(
        gib(&text, "optimizer state ") < 0.05 * gib(&full, "optimizer state "),
        "{text}"
    );
}
