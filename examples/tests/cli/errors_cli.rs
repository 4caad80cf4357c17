//! Predictable mistakes end in one line naming the device, flag or value at fault and exit
//! status 2, never a panic.

use burn_trainium::{DEVICE_ENV, PLUGIN_ENV, SEGMENT_CAP_ENV};

/// One bad invocation: environment changes, arguments, and what the message must name.
struct Case {
    environment: &'static [(&'static str, Option<&'static str>)],
    arguments: Vec<&'static str>,
    names: &'static [&'static str],
}

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/hf-tiny-llama");
/// A mixture of 4 experts, 2 a token.
const MIXTRAL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/hf-tiny-mixtral");

const NO_PLUGIN: (&str, Option<&str>) = (PLUGIN_ENV, None);
/// No plugin where `scripts/install-xla-cpu` would have put one.
const NO_INSTALL: (&str, Option<&str>) = ("XDG_CACHE_HOME", Some("/nonexistent/cache"));
const GPU: (&str, Option<&str>) = (DEVICE_ENV, Some("gpu"));

#[test]
fn bad_invocations_exit_with_status_2_and_a_message_naming_the_cause() {
    let out = tempfile::tempdir().unwrap();
    let cases = [
        Case {
            environment: &[GPU],
            arguments: pretrain_one_step(&[]),
            names: &[DEVICE_ENV, "gpu"],
        },
        Case {
            environment: &[GPU],
            arguments: vec!["eval", "--model", FIXTURE],
            names: &[DEVICE_ENV, "gpu"],
        },
        Case {
            environment: &[GPU],
            arguments: generate_ids(FIXTURE),
            names: &[DEVICE_ENV, "gpu"],
        },
        Case {
            environment: &[GPU],
            arguments: vec!["convert", "--from-hf", FIXTURE, "--to", "unused"],
            names: &[DEVICE_ENV, "gpu"],
        },
        Case {
            environment: &[],
            arguments: vec!["info", "hlat-tiny", "--pp", "3", "--pp-layers", "1,1"],
            names: &["--pp-layers", "2", "3"],
        },
        Case {
            environment: &[],
            arguments: vec!["info", "hlat-tiny", "--pp", "2", "--virtual-stages", "2"],
            names: &["--virtual-stages", "interleaved"],
        },
        Case {
            environment: &[],
            arguments: pretrain_one_step(&["--moe-capacity-factor", "1"]),
            names: &["moe_capacity_factor", "dense"],
        },
        Case {
            environment: &[],
            arguments: vec![
                "bench",
                "train",
                "--preset",
                "hlat-test",
                "--backends",
                "flex",
                "--moe-capacity-factor",
                "1",
            ],
            names: &["--moe-capacity-factor", "dense"],
        },
        Case {
            environment: &[],
            arguments: vec!["info", "mixtral-8x7b", "--dp", "6", "--ep", "3"],
            names: &["--ep 3", "8 experts"],
        },
        Case {
            environment: &[],
            arguments: vec!["info", "hlat-tiny", "--dp", "2", "--ep", "2"],
            names: &["--ep 2", "dense"],
        },
        Case {
            environment: &[],
            arguments: pretrain_one_step(&["--ep", "2"]),
            names: &["expert_parallel", "2", "data_parallel (1)"],
        },
        Case {
            environment: &[],
            arguments: pretrain_one_step(&["--device", "host:0-1", "--dp", "2", "--ep", "2"]),
            names: &["expert_parallel", "dense"],
        },
        Case {
            environment: &[],
            arguments: pretrain_one_step(&[
                "--init-from-hf",
                MIXTRAL,
                "--device",
                "host:0-2",
                "--dp",
                "3",
                "--ep",
                "3",
                "--micro-batch-rows",
                "1",
                "--batch-tokens",
                "384",
            ]),
            names: &["expert_parallel", "4 experts", "3"],
        },
        Case {
            environment: &[],
            arguments: pretrain_one_step(&["--fsdp"]),
            names: &["fsdp", "data-parallel degree above 1"],
        },
        Case {
            environment: &[],
            arguments: pretrain_one_step(&[
                "--init-from-hf",
                MIXTRAL,
                "--device",
                "host:0-1",
                "--dp",
                "2",
                "--ep",
                "2",
                "--fsdp",
            ]),
            names: &["fsdp", "expert parallelism"],
        },
        Case {
            environment: &[],
            arguments: vec!["info", "hlat-tiny", "--fsdp"],
            names: &["--fsdp", "--dp"],
        },
        Case {
            environment: &[],
            arguments: pretrain_one_step(&[
                "--device",
                "host:0-3",
                "--dp",
                "2",
                "--pp",
                "2",
                "--pp-schedule",
                "interleaved",
                "--virtual-stages",
                "2",
                "--fsdp",
            ]),
            names: &["fsdp", "interleaved"],
        },
        Case {
            environment: &[],
            arguments: vec!["info", "mixtral-8x7b", "--dp", "2", "--ep", "2", "--fsdp"],
            names: &["--fsdp", "--ep"],
        },
        Case {
            environment: &[],
            arguments: pretrain_one_step(&["--pp", "2", "--pp-layers", "3,3"]),
            names: &["--pp-layers", "6"],
        },
        Case {
            environment: &[],
            arguments: pretrain_one_step(&["--pp", "2", "--precision", "bf16-mixed"]),
            names: &["pipeline_parallel", "bf16-mixed"],
        },
        Case {
            environment: &[(SEGMENT_CAP_ENV, Some("lots"))],
            arguments: pretrain_one_step(&[]),
            names: &[SEGMENT_CAP_ENV, "lots"],
        },
        Case {
            environment: &[("TRAINIUM_HOST_FALLBACK", Some("never"))],
            arguments: pretrain_one_step(&[]),
            names: &["TRAINIUM_HOST_FALLBACK", "never"],
        },
        Case {
            environment: &[("TRAINIUM_FUSED_ATTENTION", Some("maybe"))],
            arguments: pretrain_one_step(&[]),
            names: &["TRAINIUM_FUSED_ATTENTION", "maybe"],
        },
        Case {
            environment: &[NO_PLUGIN, NO_INSTALL],
            arguments: pretrain_one_step(&["--device", "xla:0"]),
            names: &["xla:0", PLUGIN_ENV],
        },
        Case {
            environment: &[NO_PLUGIN, NO_INSTALL, (DEVICE_ENV, Some("xla:0"))],
            arguments: generate_ids(FIXTURE),
            names: &["xla:0", PLUGIN_ENV],
        },
        Case {
            environment: &[],
            arguments: pretrain_one_step(&["--device", "xla:9"]),
            names: &["xla:9"],
        },
        Case {
            environment: &[("NEURON_RT_LIB_DIR", Some("/nonexistent"))],
            arguments: vec!["eval", "--device", "neuron:0", "--model", FIXTURE],
            names: &["neuron:0", "NEURON_RT_LIB_DIR"],
        },
        Case {
            environment: &[],
            arguments: [
                generate_ids(FIXTURE),
                vec!["--max-new-tokens", "18446744073709551615"],
            ]
            .concat(),
            names: &["18446744073709551615 new tokens"],
        },
        Case {
            environment: &[],
            arguments: vec!["bench", "train", "--steps", "0"],
            names: &["--steps"],
        },
        Case {
            environment: &[],
            arguments: vec![
                "eval",
                "perplexity",
                "--model",
                FIXTURE,
                "--ids",
                "missing-rows.json",
            ],
            names: &["missing-rows.json"],
        },
        Case {
            environment: &[],
            arguments: vec!["eval", "choice", "--model", FIXTURE, "--task", "task.jsonl"],
            names: &["no tokenizer.json"],
        },
        Case {
            environment: &[],
            arguments: vec!["merge", "--config", "missing.yaml", "--out", "merged"],
            names: &["missing.yaml"],
        },
        Case {
            environment: &[
                ("RANK", Some("1")),
                ("WORLD_SIZE", Some("2")),
                ("LOCAL_RANK", Some("1")),
                ("LOCAL_WORLD_SIZE", Some("2")),
                ("MASTER_ADDR", Some("localhost")),
                ("MASTER_PORT", Some("29500")),
            ],
            arguments: pretrain_one_step(&[]),
            names: &["torchrun", "process 1 of 2", "--dp 2"],
        },
        Case {
            environment: &[("RANK", Some("0")), ("WORLD_SIZE", Some("2"))],
            arguments: pretrain_one_step(&[]),
            names: &["MASTER_ADDR", "torchrun"],
        },
        Case {
            environment: &[],
            arguments: vec!["bench", "train", "--seq-len", "0"],
            names: &["--seq-len"],
        },
    ];
    for case in cases {
        expect_refused(case.environment, &case.arguments, case.names, out.path());
    }
}

/// Links the plugin the tests run with (`TRAINIUM_PJRT_PLUGIN`) at `library`, a stand-in found
/// where discovery looks.
fn link_plugin_under_test(library: &std::path::Path) {
    let plugin =
        std::path::PathBuf::from(std::env::var_os(PLUGIN_ENV).expect(
            "the tests run with the XLA CPU plugin (scripts/test sets TRAINIUM_PJRT_PLUGIN)",
        ));
    std::fs::create_dir_all(library.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&plugin, library).unwrap();
}

/// Generates two tokens on `xla:0` with `TRAINIUM_PJRT_PLUGIN` unset and `environment` set, so
/// the executor discovers its plugin; returns what `hlat` wrote on stderr once it succeeded.
fn generate_with_a_discovered_plugin(environment: &[(&str, &std::path::Path)]) -> String {
    let output = super::hlat()
        .args(["generate", "--model", FIXTURE, "--prompt-ids", "1,2"])
        .args(["--format", "ids", "--max-new-tokens", "2"])
        .env(burn_trainium::DEVICE_ENV, "xla:0")
        .env_remove(PLUGIN_ENV)
        .envs(environment.iter().copied())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{stderr}");
    stderr
}

/// With `TRAINIUM_PJRT_PLUGIN` unset, `--device xla` finds the plugin `scripts/install-xla-cpu`
/// installed (here a cache laid out as the installer lays it, linking to the plugin under test)
/// and says which it chose.
#[test]
fn an_unset_plugin_is_found_where_the_installer_put_it() {
    let cache = tempfile::tempdir().unwrap();
    let library = cache
        .path()
        .join("burn-trainium/xla-cpu-2026.6.23/fastatomstruct_xla_cpu/libpjrt_cpu.so");
    link_plugin_under_test(&library);
    let stderr = generate_with_a_discovered_plugin(&[("XDG_CACHE_HOME", cache.path())]);
    assert!(
        stderr.contains(&library.display().to_string())
            && stderr.contains("scripts/install-xla-cpu's cache"),
        "{stderr}"
    );
}

/// With `TRAINIUM_PJRT_PLUGIN` unset and the Neuron SDK's `libneuronxla` package importable (here
/// a stand-in: the plugin under test as `libneuronxla/libneuronpjrt.so` on `PYTHONPATH`),
/// `--device xla` loads the Neuron plugin before the installer's, says so and reports its
/// devices' kind.
#[test]
fn the_neuron_sdks_plugin_is_found_in_the_python_packages_and_loaded() {
    let packages = tempfile::tempdir().unwrap();
    let library = packages.path().join("libneuronxla/libneuronpjrt.so");
    link_plugin_under_test(&library);
    let empty_cache = tempfile::tempdir().unwrap();
    let stderr = generate_with_a_discovered_plugin(&[
        ("PYTHONPATH", packages.path()),
        ("XDG_CACHE_HOME", empty_cache.path()),
    ]);
    assert!(
        stderr.contains(&library.display().to_string())
            && stderr.contains("the Neuron SDK's plugin")
            && stderr.contains("devices of kind `"),
        "{stderr}"
    );
}

/// Numeric flags out of range, and model configurations whose sizes would overflow.
#[test]
fn numbers_out_of_range_are_refused_naming_the_flag_or_field() {
    let out = tempfile::tempdir().unwrap();
    let flags: [(&[&str], &[&str]); 6] = [
        (&["pretrain", "--lr", "0"], &["--lr"]),
        (&["pretrain", "--dp", "0"], &["--dp"]),
        (&["pretrain", "--max-steps", "0"], &["--max-steps"]),
        (&["eval", "--model", FIXTURE, "--rows", "0"], &["--rows"]),
        (&["info", "--device-memory", "nan"], &["--device-memory"]),
        (
            &[
                "data",
                "train-tokenizer",
                "--input",
                ".",
                "--vocab-size",
                "0",
                "--out",
                "x",
            ],
            &["--vocab-size"],
        ),
    ];
    for (arguments, names) in flags {
        expect_refused(&[], arguments, names, out.path());
    }
    // The fixture with one size made huge (and `head_dim`, which the fixture states, left out
    // unless it is the one): the error names the field and its value, before any weight is read.
    let huge = 1u64 << 62;
    for field in ["head_dim", "hidden_size", "vocab_size", "num_hidden_layers"] {
        let model = edited_fixture(out.path(), field, |fields| {
            fields.remove("head_dim");
            fields.insert(field.to_string(), huge.into());
        });
        let (named, value) = (format!("`{field}`"), huge.to_string());
        expect_refused(
            &[],
            &["eval", "--model", &model],
            &[&named, &value],
            out.path(),
        );
    }
}

/// Configurations of the families the decoder does not implement, or that lack a field their
/// RoPE type needs, or whose head width does not fit: `hlat generate`, `eval` and `convert`
/// refuse each naming the file, the field and its value.
#[test]
fn bad_family_configurations_are_refused_naming_file_field_and_value() {
    let out = tempfile::tempdir().unwrap();
    type Edit = fn(&mut serde_json::Map<String, serde_json::Value>);
    let cases: [(&str, Edit, &[&str]); 5] = [
        (
            "dynamic",
            |c| {
                c.insert(
                    "rope_parameters".into(),
                    serde_json::json!({"rope_type": "dynamic", "factor": 2.0}),
                );
            },
            &["rope_parameters.rope_type", "\"dynamic\""],
        ),
        (
            "no-low-freq",
            |c| {
                c.insert(
                    "rope_parameters".into(),
                    serde_json::json!({"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
                );
            },
            &["rope_parameters.low_freq_factor", "null"],
        ),
        (
            "odd-head",
            |c| {
                c.insert("head_dim".into(), 15.into());
            },
            &["`head_dim` = 15"],
        ),
        (
            "moe",
            |c| {
                c.insert("num_local_experts".into(), 8.into());
            },
            &["`num_local_experts` = 8", "mixtral"],
        ),
        (
            "sliding-pattern",
            |c| {
                c.insert("model_type".into(), "qwen2".into());
                c.insert("use_sliding_window".into(), true.into());
                c.insert("sliding_window".into(), 8.into());
                c.insert(
                    "layer_types".into(),
                    serde_json::json!(["sliding_attention", "full_attention"]),
                );
            },
            &["layer_types"],
        ),
    ];
    for (label, edit, names) in cases {
        let model = edited_fixture(out.path(), label, edit);
        let config = format!("{model}/config.json");
        let mut names = names.to_vec();
        names.push(&config);
        for arguments in [
            &["eval", "--model", &model][..],
            &generate_ids(&model),
            &["convert", "--from-hf", &model, "--to", "unused"],
        ] {
            expect_refused(&[], arguments, &names, out.path());
        }
    }
}

/// One step of `hlat pretrain` with `flags`.
fn pretrain_one_step(flags: &[&'static str]) -> Vec<&'static str> {
    [&["pretrain", "--max-steps", "1"][..], flags].concat()
}

/// `hlat generate` of one token on `model`, printing token ids.
fn generate_ids(model: &str) -> Vec<&str> {
    vec![
        "generate",
        "--model",
        model,
        "--prompt-ids",
        "1",
        "--format",
        "ids",
    ]
}

/// A copy of the fixture in `folder/label` whose `config.json` `edit` changed; its path.
fn edited_fixture(
    folder: &std::path::Path,
    label: &str,
    edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
) -> String {
    let model = folder.join(label);
    std::fs::create_dir_all(&model).unwrap();
    for entry in std::fs::read_dir(FIXTURE).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), model.join(entry.file_name())).unwrap();
    }
    let path = model.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(config.as_object_mut().unwrap());
    std::fs::write(&path, config.to_string()).unwrap();
    model.display().to_string()
}

/// Runs `hlat` with `arguments` and `environment` in `folder`: it must exit with status 2,
/// print no panic, and its `error:` line must contain every one of `names`.
fn expect_refused(
    environment: &[(&str, Option<&str>)],
    arguments: &[&str],
    names: &[&str],
    folder: &std::path::Path,
) {
    let mut command = super::hlat();
    command.args(arguments).current_dir(folder);
    for (name, value) in environment {
        match value {
            Some(value) => command.env(name, value),
            None => command.env_remove(name),
        };
    }
    let output = command.output().expect("running hlat");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let what = format!("{environment:?} {arguments:?}");
    assert_eq!(output.status.code(), Some(2), "{what}: {stderr}");
    assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    let message = stderr
        .lines()
        .find(|line| line.starts_with("error:"))
        .unwrap_or_else(|| panic!("{what}: no error line in {stderr}"));
    for name in names {
        assert!(message.contains(name), "{what}: `{name}` not in {message}");
    }
}
