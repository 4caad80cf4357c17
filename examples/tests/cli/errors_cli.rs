//! Predictable mistakes end in one line naming the device, flag or value at fault and exit
//! status 2, never a panic.

use burn_trainium::{DEVICE_ENV, PLUGIN_ENV};

/// One bad invocation: environment changes, arguments, and what the message must name.
struct Case {
    environment: &'static [(&'static str, Option<&'static str>)],
    arguments: &'static [&'static str],
    names: &'static [&'static str],
}

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/hf-tiny-llama");

const NO_PLUGIN: (&str, Option<&str>) = (PLUGIN_ENV, None);
const GPU: (&str, Option<&str>) = (DEVICE_ENV, Some("gpu"));

#[test]
fn bad_invocations_exit_with_status_2_and_a_message_naming_the_cause() {
    let out = tempfile::tempdir().unwrap();
    let cases = [
        Case {
            environment: &[GPU],
            arguments: &["pretrain", "--max-steps", "1"],
            names: &[DEVICE_ENV, "gpu"],
        },
        Case {
            environment: &[GPU],
            arguments: &["eval", "--model", FIXTURE],
            names: &[DEVICE_ENV, "gpu"],
        },
        Case {
            environment: &[GPU],
            arguments: &[
                "generate",
                "--model",
                FIXTURE,
                "--prompt-ids",
                "1",
                "--format",
                "ids",
            ],
            names: &[DEVICE_ENV, "gpu"],
        },
        Case {
            environment: &[GPU],
            arguments: &["convert", "--from-hf", FIXTURE, "--to", "unused"],
            names: &[DEVICE_ENV, "gpu"],
        },
        Case {
            environment: &[NO_PLUGIN],
            arguments: &["pretrain", "--device", "xla:0", "--max-steps", "1"],
            names: &["xla:0", PLUGIN_ENV],
        },
        Case {
            environment: &[NO_PLUGIN, (DEVICE_ENV, Some("xla:0"))],
            arguments: &[
                "generate",
                "--model",
                FIXTURE,
                "--prompt-ids",
                "1",
                "--format",
                "ids",
            ],
            names: &["xla:0", PLUGIN_ENV],
        },
        Case {
            environment: &[],
            arguments: &["pretrain", "--device", "xla:9", "--max-steps", "1"],
            names: &["xla:9"],
        },
        Case {
            environment: &[("NEURON_RT_LIB_DIR", Some("/nonexistent"))],
            arguments: &["eval", "--device", "neuron:0", "--model", FIXTURE],
            names: &["neuron:0", "NEURON_RT_LIB_DIR"],
        },
        Case {
            environment: &[],
            arguments: &[
                "generate",
                "--model",
                FIXTURE,
                "--prompt-ids",
                "1",
                "--format",
                "ids",
                "--max-new-tokens",
                "18446744073709551615",
            ],
            names: &["18446744073709551615 new tokens"],
        },
        Case {
            environment: &[],
            arguments: &["bench", "train", "--steps", "0"],
            names: &["--steps"],
        },
        Case {
            environment: &[],
            arguments: &["bench", "train", "--seq-len", "0"],
            names: &["--seq-len"],
        },
    ];
    for case in cases {
        let mut command = super::hlat();
        command.args(case.arguments).current_dir(out.path());
        for (name, value) in case.environment {
            match value {
                Some(value) => command.env(name, value),
                None => command.env_remove(name),
            };
        }
        let output = command.output().expect("running hlat");
        let stderr = String::from_utf8_lossy(&output.stderr);
        let what = format!("{:?} {:?}", case.environment, case.arguments);
        assert_eq!(output.status.code(), Some(2), "{what}: {stderr}");
        assert!(!stderr.contains("panicked"), "{what}: {stderr}");
        let message = stderr
            .lines()
            .find(|line| line.starts_with("error:"))
            .unwrap_or_else(|| panic!("{what}: no error line in {stderr}"));
        for name in case.names {
            assert!(message.contains(name), "{what}: `{name}` not in {message}");
        }
    }
}
