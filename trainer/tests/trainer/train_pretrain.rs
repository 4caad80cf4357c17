//! `hlat pretrain`'s job on a tiny preset: the loss falls, metrics are logged every step (in
//! `metrics.jsonl` and by Burn's Learner, which runs it), and the run folder holds a checkpoint
//! the model crate loads with its tokenizer.

use burn::tensor::Device;
use hlat_train::config::TrainConfig;
use hlat_train::metrics::METRICS_FILE;
use hlat_train::pretrain::{DataChoice, DeviceInfo, PretrainOptions, pretrain};

#[test]
fn pretraining_a_tiny_preset_lowers_the_loss() {
    // Flex's generator is the process's, which the `host` device draws from too.
    let _random = crate::exclusive_random();
    let out = tempfile::tempdir().unwrap();
    let options = PretrainOptions {
        config: TrainConfig {
            preset: "hlat-test".into(),
            lr: 1e-2,
            warmup_steps: 5,
            max_steps: 40,
            seq_len: 32,
            batch_tokens: 32 * 8,
            micro_batch_rows: 8,
            eval_rows: 8,
            eval_every: 20,
            progress: false,
            ..TrainConfig::quickstart()
        },
        out: out.path().to_path_buf(),
        data: DataChoice::Builtin,
        init_from: None,
        init_adapter: None,
        share: hlat_train::checkpoint_state::ProcessShare::WHOLE,
    };
    let device = Device::flex();
    let summary = pretrain(&options, &device, DeviceInfo { compiles: None }).unwrap();

    let mean = |losses: &[f64]| losses.iter().sum::<f64>() / losses.len() as f64;
    let first = mean(&summary.losses[..5]);
    let last = mean(&summary.losses[35..]);
    assert!(last < first - 1.0, "loss went from {first:.3} to {last:.3}");
    let val_loss = summary.val_loss.unwrap();
    assert!(val_loss < first - 1.0, "validation loss {val_loss:.3}");

    let log = std::fs::read_to_string(out.path().join(METRICS_FILE)).unwrap();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 40);
    for (index, line) in lines.iter().enumerate() {
        assert_eq!(line["step"], index as u64 + 1);
        for key in ["loss", "lr", "grad_norm", "tokens_per_s"] {
            assert!(line[key].is_number(), "step {}: no {key}", index + 1);
        }
    }

    // The run went through Burn's Learner: its metric logger holds every step's loss and
    // learning rate, as metrics.jsonl does, and the validation loss. Each line is one entry
    // (`value` or `value,count`); Burn 0.22 ends an epoch's file with the epoch's aggregate
    // (`value,final`), which is no step's.
    let burn_log = |name: &str| -> Vec<f64> {
        std::fs::read_to_string(out.path().join(name))
            .unwrap()
            .lines()
            .filter(|line| !line.ends_with(",final"))
            .map(|line| line.split(',').next().unwrap().parse().unwrap())
            .collect()
    };
    let burn_losses = burn_log("train/epoch-1/Loss.log");
    assert_eq!(
        burn_losses.len(),
        40,
        "train/epoch-1/Loss.log: {burn_losses:?}"
    );
    for (step, (burn, ours)) in burn_losses.iter().zip(&summary.losses).enumerate() {
        assert!(
            (burn - ours).abs() <= 1e-6 * ours.abs(),
            "step {}: {burn} vs {ours}",
            step + 1
        );
    }
    let burn_lrs = burn_log("train/epoch-1/Learning_Rate.log");
    assert_eq!(
        burn_lrs.len(),
        40,
        "train/epoch-1/Learning_Rate.log: {burn_lrs:?}"
    );
    for (line, burn) in lines.iter().zip(&burn_lrs) {
        let ours = line["lr"].as_f64().unwrap();
        assert!((burn - ours).abs() <= 1e-12 * ours, "lr {burn} vs {ours}");
    }
    assert!(!burn_log("valid/epoch-1/Loss.log").is_empty());

    let (config, _model, tokenizer) = hlat::checkpoint::load_any(out.path(), &device).unwrap();
    assert!(tokenizer.is_some(), "the checkpoint holds no tokenizer");
    assert_eq!(config.num_layers, 2);
}
