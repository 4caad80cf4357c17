//! The recipe's closed-form pieces: warmup-cosine schedule, configuration files, `--data` specs.

use std::f64::consts::PI;

use hlat_train::config::TrainConfig;
use hlat_train::data_spec::parse_data_spec;
use hlat_train::precision::Precision;
use hlat_train::schedule::WarmupCosine;

fn close(actual: f64, expected: f64) {
    assert!(
        (actual - expected).abs() <= 1e-12 * expected.abs().max(1.0),
        "{actual} != {expected}"
    );
}

#[test]
fn warmup_cosine_matches_closed_form() {
    // HLAT: 2000 warmup steps to 3e-4, cosine to 10% over the rest of 10 000 steps.
    let schedule = WarmupCosine {
        peak: 3e-4,
        warmup_steps: 2000,
        decay_steps: 8000,
        min_ratio: 0.1,
    };
    close(schedule.lr(1), 3e-4 / 2000.0);
    close(schedule.lr(1000), 1.5e-4);
    close(schedule.lr(2000), 3e-4);
    // Halfway through the decay the cosine term is 1/2: floor + (peak - floor) / 2.
    close(schedule.lr(6000), 3e-5 + 2.7e-4 * 0.5);
    // A quarter of the way: (1 + cos(pi / 4)) / 2.
    close(
        schedule.lr(4000),
        3e-5 + 2.7e-4 * 0.5 * (1.0 + (PI / 4.0).cos()),
    );
    close(schedule.lr(10_000), 3e-5);
    close(schedule.lr(50_000), 3e-5);
}

#[test]
fn recipe_defaults_are_hlat() {
    let config = TrainConfig::default();
    assert_eq!((config.beta1, config.beta2, config.eps), (0.9, 0.95, 1e-8));
    assert_eq!((config.weight_decay, config.lr), (0.1, 3e-4));
    assert_eq!((config.warmup_steps, config.min_lr_ratio), (2000, 0.1));
    assert_eq!((config.clip_grad_norm, config.seq_len), (1.0, 4096));
    assert!(!config.exclude_norms_from_weight_decay);
    config.validate().unwrap();
    TrainConfig::quickstart().validate().unwrap();
}

#[test]
fn toml_overrides_only_the_fields_it_names() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.toml");
    std::fs::write(
        &path,
        "lr = 1e-4\nprecision = \"bf16-mixed\"\nexclude_norms_from_weight_decay = true\n",
    )
    .unwrap();
    let config = TrainConfig::load_toml(&path, &TrainConfig::default()).unwrap();
    assert_eq!(config.lr, 1e-4);
    assert_eq!(config.precision, Precision::Bf16Mixed);
    assert!(config.exclude_norms_from_weight_decay);
    assert_eq!(config.warmup_steps, 2000);

    // What a run writes, it reads back.
    let saved = dir.path().join("saved.toml");
    config.save_toml(&saved).unwrap();
    assert_eq!(
        TrainConfig::load_toml(&saved, &TrainConfig::quickstart()).unwrap(),
        config
    );

    std::fs::write(&path, "learning_rate = 1e-4\n").unwrap();
    let error = TrainConfig::load_toml(&path, &TrainConfig::default()).unwrap_err();
    assert!(error.to_string().contains("learning_rate"), "{error}");

    std::fs::write(&path, "batch_tokens = 1000\n").unwrap();
    let error = TrainConfig::load_toml(&path, &TrainConfig::default()).unwrap_err();
    assert!(error.to_string().contains("batch_tokens"), "{error}");
}

#[test]
fn toml_values_out_of_range_are_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.toml");
    let cases = [
        ("lr = 0.0", "lr"),
        ("lr = nan", "lr"),
        ("eps = -1e-8", "eps"),
        ("beta2 = 1.0", "beta2"),
        ("min_lr_ratio = 1.5", "min_lr_ratio"),
        ("weight_decay = -0.1", "weight_decay"),
        ("clip_grad_norm = inf", "clip_grad_norm"),
        ("seq_len = 0", "seq_len"),
        ("micro_batch_rows = 0", "micro_batch_rows"),
        ("data_parallel = 0", "data_parallel"),
        ("max_steps = 0", "max_steps"),
        ("keep_checkpoints = 0", "keep_checkpoints"),
        ("peak_flops = -1.0", "peak_flops"),
        ("eval_rows = 0", "eval_rows"),
        (
            "seq_len = 9223372036854775807\nmicro_batch_rows = 4",
            "micro_batch_rows",
        ),
    ];
    for (line, field) in cases {
        std::fs::write(&path, format!("{line}\n")).unwrap();
        let error = TrainConfig::load_toml(&path, &TrainConfig::default()).expect_err(line);
        assert!(error.to_string().contains(field), "{line}: {error}");
    }
}

#[test]
fn data_spec_names_folders_and_weights() {
    let sources = parse_data_spec("domain=shards/a:0.99,general=shards/b:0.01").unwrap();
    assert_eq!(sources.len(), 2);
    assert_eq!(
        (
            sources[0].name.as_str(),
            sources[0].folder.to_str().unwrap(),
            sources[0].weight
        ),
        ("domain", "shards/a", 0.99)
    );
    assert_eq!(sources[1].weight, 0.01);

    let single = parse_data_spec("shards/only").unwrap();
    assert_eq!(
        (single[0].name.as_str(), single[0].weight),
        ("shards/only", 1.0)
    );

    for bad in ["a=x:zero", "a=x:-1", "a=x,", "=:1"] {
        assert!(parse_data_spec(bad).is_err(), "{bad} was accepted");
    }
}
