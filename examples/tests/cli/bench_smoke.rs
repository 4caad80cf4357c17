//! `hlat bench` runs end to end on `host` and `xla` (no timing is asserted), and what it reports
//! is physically possible: no matmul beats the machine's measured peak (a benchmark that skipped
//! the work would).

use std::path::Path;

use burn_trainium::XLA_CACHE_ENV;

use super::require_plugin;

/// Runs `hlat` in `folder`, without the persistent compile cache: the checks below count the
/// compiles of each phase.
fn hlat(arguments: &[&str], folder: &Path) -> std::process::Output {
    super::hlat()
        .args(arguments)
        .current_dir(folder)
        .env(XLA_CACHE_ENV, "off")
        .output()
        .expect("running hlat")
}

fn succeeded(output: &std::process::Output) {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Runs `hlat bench <arguments> --json <json>` in `folder`, which must succeed: what it printed
/// (its table) and the JSON report it wrote.
fn bench(arguments: &[&str], json: &str, folder: &Path) -> (String, serde_json::Value) {
    let output = hlat(&[&["bench"], arguments, &["--json", json]].concat(), folder);
    succeeded(&output);
    let report = serde_json::from_slice(&std::fs::read(folder.join(json)).unwrap()).unwrap();
    (String::from_utf8(output.stdout).unwrap(), report)
}

/// [`bench`] of `hlat bench train --preset hlat-test <arguments>`.
fn bench_train(arguments: &[&str], folder: &Path) -> (String, serde_json::Value) {
    let train = ["train", "--preset", "hlat-test"];
    bench(&[&train[..], arguments].concat(), "train.json", folder)
}

#[test]
fn bench_train_measures_host_xla_and_ndarray_and_writes_json_and_report() {
    require_plugin();
    let folder = tempfile::tempdir().unwrap();
    // A hand-written page is never the report's: refused before anything runs, left as it is.
    let hand_written = "# Performance\n\nMeasured by hand: 42 tokens/s.\n";
    let notes = folder.path().join("notes.md");
    std::fs::write(&notes, hand_written).unwrap();
    let refused = hlat(
        &[
            "bench",
            "train",
            "--preset",
            "hlat-test",
            "--report",
            "notes.md",
        ],
        folder.path(),
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--report notes.md"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), hand_written);
    // A report of an earlier run is replaced whole.
    std::fs::write(
        folder.path().join("report.md"),
        "<!-- Written by `hlat bench train --report`: the next run replaces the whole file. -->\n\nAn older report.\n",
    )
    .unwrap();
    let (table, report) = bench_train(
        &[
            "--backends",
            "host,xla,ndarray",
            "--baseline",
            "ndarray",
            "--warmup",
            "2",
            "--steps",
            "1",
            "--batch",
            "1",
            "--seq-len",
            "8",
            "--report",
            "report.md",
        ],
        folder.path(),
    );
    let results = report["results"].as_array().unwrap();
    let field = |backend: &str, key: &str| {
        results
            .iter()
            .find(|result| result["backend"] == backend)
            .unwrap_or_else(|| panic!("{backend} missing: {report}"))[key]
            .clone()
    };
    // host and ndarray draw the same initial weights from Burn's generator and train on the
    // same batch; xla draws its own on the device.
    let (host, ndarray) = (
        field("host", "final_loss").as_f64().unwrap(),
        field("ndarray", "final_loss").as_f64().unwrap(),
    );
    assert!(
        (host - ndarray).abs() < 1e-3 * ndarray.abs(),
        "{host} vs {ndarray}"
    );
    assert!(field("xla", "final_loss").as_f64().unwrap().is_finite());
    // The step compiles in the warmup and not after it.
    assert!(
        field("xla", "warmup_compiles").as_u64().unwrap() > 0,
        "{report}"
    );
    assert_eq!(field("xla", "timed_compiles").as_u64(), Some(0), "{report}");
    let peak = report["peak"]["flops_per_second"].as_f64().unwrap();
    for result in results {
        let mfu = result["mfu"].as_f64().unwrap();
        assert!(
            mfu > 0.0 && mfu <= 1.0,
            "MFU {mfu} of {result} against {peak}"
        );
    }
    assert!(
        table.contains("| host |") && table.contains("| xla |") && table.contains("1.00×"),
        "{table}"
    );
    let page = std::fs::read_to_string(folder.path().join("report.md")).unwrap();
    assert!(
        page.contains("Machine:")
            && page.contains("measured in this run")
            && page.contains("| xla |"),
        "{page}"
    );
    assert!(!page.contains("An older report"), "{page}");
    // The bar plot the page shows, beside it: a 720 × 420 PNG.
    assert!(page.contains("![tokens per second per backend](report.png)"));
    let plot = folder.path().join("report.png");
    assert_eq!(test_support::image::png_size(&plot), (720, 420));
}

#[test]
fn bench_ops_on_xla_reports_no_rate_above_the_measured_peak() {
    require_plugin();
    let folder = tempfile::tempdir().unwrap();
    let (_, report) = bench(
        &[
            "ops",
            "--preset",
            "bench-tiny",
            "--backends",
            "xla",
            "--batch",
            "2",
            "--seq-len",
            "64",
            "--repeats",
            "3",
        ],
        "ops.json",
        folder.path(),
    );
    let peak = report["peak"]["flops_per_second"].as_f64().unwrap();
    let operations = report["backends"][0]["operations"].as_array().unwrap();
    let names: Vec<&str> = operations
        .iter()
        .map(|operation| operation["operation"].as_str().unwrap())
        .collect();
    for expected in ["matmul", "softmax", "rmsnorm", "causal attention"] {
        assert!(
            names.iter().any(|name| name.starts_with(expected)),
            "{expected} missing: {names:?}"
        );
    }
    for operation in operations
        .iter()
        .filter(|operation| operation["unit"] == "GFLOP/s")
    {
        let rate = operation["throughput"].as_f64().unwrap() * 1e9;
        // The peak is itself a timed matmul, so a rate may exceed it by timing noise; a bench that
        // skipped the work would exceed it many times over.
        assert!(
            rate > 0.0 && rate <= 1.5 * peak,
            "{} runs at {:.1} GFLOP/s, above the measured peak of {:.1}",
            operation["operation"],
            rate / 1e9,
            peak / 1e9
        );
    }
}

/// A list of sequence lengths measures each with the same tokens per step; a length that does
/// not divide them is refused naming the flag.
#[test]
fn bench_train_measures_each_sequence_length_with_the_same_tokens() {
    let folder = tempfile::tempdir().unwrap();
    let arguments = |lengths: &'static str| {
        [
            "--backends",
            "host",
            "--batch",
            "2",
            "--seq-len",
            lengths,
            "--warmup",
            "0",
            "--steps",
            "1",
            "--peak-flops",
            "1e11",
        ]
    };
    let (_, report) = bench_train(&arguments("8,16"), folder.path());
    let layouts: Vec<(u64, u64)> = report["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|result| {
            (
                result["batch"].as_u64().unwrap(),
                result["seq_len"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(layouts, [(2, 8), (1, 16)], "{report}");
    // A peak passed on the command line is used as is and nothing is probed.
    assert_eq!(report["peak"]["flops_per_second"].as_f64(), Some(1e11));
    assert!(
        report["results"]
            .as_array()
            .unwrap()
            .iter()
            .all(|result| result["matmul_peak"].is_null()),
        "{report}"
    );
    let refused = hlat(
        &[&["bench", "train"], &arguments("8,3")[..]].concat(),
        folder.path(),
    );
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("--seq-len 3"), "{stderr}");
}

/// `--pp 2 --micro-batches 1,2` trains on xla:0-1 and prints a row per micro-batch count, each
/// next to the bubble two 1F1B stages predict, (p - 1) / (m + p - 1): 1/2 and 1/3 (timings are
/// not asserted). `ndarray`, a single device, is refused without stopping the others.
#[test]
fn bench_train_measures_each_micro_batch_count_next_to_the_predicted_bubble() {
    require_plugin();
    let folder = tempfile::tempdir().unwrap();
    let (table, report) = bench_train(
        &[
            "--backends",
            "xla,ndarray",
            "--pp",
            "2",
            "--micro-batches",
            "1,2",
            "--warmup",
            "1",
            "--steps",
            "2",
            "--batch",
            "1",
            "--seq-len",
            "8",
            "--peak-flops",
            "1e11",
        ],
        folder.path(),
    );
    // | backend | micro-batches | batch × seq | median step | per micro-batch | predicted bubble |
    // measured vs best | predicted (1 − bubble) vs best |
    let cells = |count: &str| -> Vec<String> {
        let line = table
            .lines()
            .find(|line| line.starts_with(&format!("| xla | {count} |")))
            .unwrap_or_else(|| panic!("no row of {count} micro-batches:\n{table}"));
        line.split('|')
            .map(|cell| cell.trim().to_string())
            .collect()
    };
    for (count, bubble) in [("1", "0.5000"), ("2", "0.3333")] {
        let row = cells(count);
        assert_eq!(row.len(), 10, "{row:?}");
        assert_eq!(row[6], bubble, "{row:?}\n{table}");
    }
    assert!(
        table.contains("Pipeline: 2 stages, schedule 1f1b"),
        "{table}"
    );
    assert_eq!(
        report["micro_batches"],
        serde_json::json!([1, 2]),
        "{report}"
    );
    assert_eq!(report["pipeline"]["stages"], 2, "{report}");
    assert_eq!(
        report["pipeline"]["layers_per_stage"],
        serde_json::json!([1, 1]),
        "{report}"
    );
    let results = report["results"].as_array().unwrap();
    let rows: Vec<(u64, u64, u64)> = results
        .iter()
        .map(|result| {
            (
                result["micro_batches"].as_u64().unwrap(),
                result["batch"].as_u64().unwrap(),
                result["pipeline_stages"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(rows, [(1, 1, 2), (2, 2, 2)], "{report}");
    let mut best = 0.0f64;
    for result in results {
        assert!(
            result["final_loss"].as_f64().unwrap().is_finite(),
            "{result}"
        );
        // Both programs compile in the warmup round, which runs every count.
        assert_eq!(result["timed_compiles"], 0, "{result}");
        let measured = result["measured_efficiency"].as_f64().unwrap();
        assert!(measured > 0.0 && measured <= 1.0, "{result}");
        best = best.max(measured);
    }
    assert_eq!(best, 1.0, "{report}");
    let failures = report["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{report}");
    assert_eq!(failures[0][0], "ndarray", "{report}");
    assert!(
        failures[0][1].as_str().unwrap().contains("single device"),
        "{report}"
    );
}

/// Generation compiles a fixed set of programs on `xla`, all during the warmup, and every
/// backend reports both phases.
#[test]
fn bench_generate_compiles_in_the_warmup_only() {
    require_plugin();
    let folder = tempfile::tempdir().unwrap();
    let (_, report) = bench(
        &[
            "generate",
            "--preset",
            "hlat-test",
            "--backends",
            "host,xla,ndarray",
            "--prompt-len",
            "5",
            "--new-tokens",
            "12",
            "--runs",
            "1",
        ],
        "generate.json",
        folder.path(),
    );
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), 3, "{report}");
    for result in results {
        for key in ["prefill_tokens_per_second", "decode_tokens_per_second"] {
            assert!(result[key].as_f64().unwrap() > 0.0, "{key}: {result}");
        }
        assert_eq!(result["tokens"].as_array().unwrap().len(), 12, "{result}");
        assert_eq!(result["timed_compiles"], 0, "{result}");
    }
    let xla = results
        .iter()
        .find(|result| result["backend"] == "xla")
        .unwrap();
    let compiles = xla["warmup_compiles"].as_u64().unwrap();
    assert!((1..=3).contains(&compiles), "{xla}");
}

/// Runs `hlat bench <arguments> --backends host,xla,ndarray` and checks that every backend
/// trained the same model (equal final losses), that the Trainium executors captured every
/// operation of a step, and that nothing fell back to the host on `xla`.
fn trains_the_same_model_everywhere(arguments: &[&str]) {
    require_plugin();
    let folder = tempfile::tempdir().unwrap();
    let backends = ["--backends", "host,xla,ndarray"];
    let (_, report) = bench(&[arguments, &backends].concat(), "loop.json", folder.path());
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), 3, "{report}");
    let loss = |result: &serde_json::Value| result["final_loss"].as_f64().unwrap();
    let reference = loss(&results[2]);
    for result in results {
        assert!(
            (loss(result) - reference).abs() <= 1e-4 * (1.0 + reference.abs()),
            "{result}"
        );
        if result["backend"] != "ndarray" {
            assert!(
                result["operations_per_step"].as_u64().unwrap() > 100,
                "{result}"
            );
        }
        if result["backend"] == "xla" {
            assert_eq!(result["host_fallbacks"].as_u64(), Some(0), "{result}");
        }
    }
}

/// The unrolled LSTM step trains the same model on every backend.
#[test]
fn bench_unrolled_trains_the_same_model_everywhere() {
    trains_the_same_model_everywhere(&[
        "unrolled",
        "--seq-len",
        "3",
        "--hidden",
        "4",
        "--batch",
        "2",
        "--warmup",
        "1",
        "--steps",
        "1",
    ]);
}

/// The small CNN trains the same model on every backend, every operation compiled on `xla`.
#[test]
fn bench_cnn_trains_the_same_model_everywhere() {
    trains_the_same_model_everywhere(&["cnn", "--batch", "4", "--warmup", "1", "--steps", "2"]);
}

#[test]
fn an_unknown_backend_or_an_empty_step_is_a_clear_error() {
    let folder = tempfile::tempdir().unwrap();
    let output = hlat(&["bench", "train", "--backends", "tpu"], folder.path());
    assert!(!output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("unknown backend `tpu`"), "{stderr}");
    for flag in ["--steps", "--batch", "--seq-len"] {
        let output = hlat(&["bench", "train", flag, "0"], folder.path());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{flag}: {stderr}");
        assert!(
            stderr.contains(flag) && !stderr.contains("panicked"),
            "{stderr}"
        );
    }
}

/// `--peer-allocator hlat,default` runs each peer twice, on `hlat`'s allocator settings and on
/// glibc's defaults, one row each: the peer process sees `hlat`'s variables in the first run and
/// none in the second. (A shell script stands in for Python and reports the variable it saw.)
#[test]
fn bench_train_runs_the_peers_on_both_allocator_settings() {
    let folder = tempfile::tempdir().unwrap();
    let (table, report) =
        bench_train_with_stand_in_peer(folder.path(), &["--peer-allocator", "hlat,default"]);
    let version = |backend: &str| peer_version(&report, backend);
    let hlat_terms = version("pytorch");
    assert!(
        hlat_terms.starts_with("stand-in, MALLOC_ARENA_MAX=1 args=")
            && hlat_terms.contains("allocator: hlat's (MALLOC_ARENA_MAX=1"),
        "{hlat_terms}"
    );
    let glibc_terms = version("pytorch (glibc default allocator)");
    assert!(
        glibc_terms.starts_with("stand-in, MALLOC_ARENA_MAX=unset args=")
            && glibc_terms.contains("allocator: glibc's defaults"),
        "{glibc_terms}"
    );
    assert!(
        table.contains("| pytorch |") && table.contains("| pytorch (glibc default allocator) |"),
        "{table}"
    );
}

/// `hlat bench train` on `host` with a stand-in PyTorch peer (a script that reports its
/// allocator variable and arguments as its version) and `extra` flags: the table and the report.
fn bench_train_with_stand_in_peer(folder: &Path, extra: &[&str]) -> (String, serde_json::Value) {
    let python = test_support::stand_in::write_executable(
        folder,
        "python",
        "#!/bin/sh\n\
         echo '{\"median_step_seconds\": 0.5, \"compiles\": 0, \"compile_seconds\": 0.0, \
         \"peak_rss_bytes\": 1, \"final_loss\": 1.0, \
         \"version\": \"stand-in, MALLOC_ARENA_MAX='\"${MALLOC_ARENA_MAX:-unset}\"' args='\"$*\"'\"}'\n",
    );
    let flags = [
        &[
            "--backends",
            "host",
            "--with-pytorch",
            "--python",
            python.to_str().unwrap(),
            "--warmup",
            "0",
            "--steps",
            "1",
        ][..],
        extra,
    ]
    .concat();
    bench_train(&flags, folder)
}

/// The version the row `backend` of a benchmark report records.
fn peer_version(report: &serde_json::Value, backend: &str) -> String {
    report["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["backend"] == backend)
        .unwrap_or_else(|| panic!("no {backend} row in {report}"))["version"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn bench_train_runs_the_pytorch_peer_on_the_gpu_eager_and_compiled() {
    let folder = tempfile::tempdir().unwrap();
    let (table, report) =
        bench_train_with_stand_in_peer(folder.path(), &["--peer-device", "cuda", "--peer-compile"]);
    let eager = peer_version(&report, "pytorch on cuda");
    assert!(
        eager.contains("--device cuda") && !eager.contains("--compile"),
        "{eager}"
    );
    let compiled = peer_version(&report, "pytorch on cuda, torch.compile");
    assert!(
        compiled.contains("--device cuda") && compiled.contains("--compile 1"),
        "{compiled}"
    );
    assert!(
        table.contains("| pytorch on cuda, torch.compile |"),
        "{table}"
    );
}

/// `hlat bench route` measures Flex, Flex behind Burn's remote route and the Trainium devices in
/// one run: every device in the order asked, each overhead its own figure less Flex's, and an
/// unknown device refused by name.
/// A command that compiles programs on in-process devices logs neither each compile's span
/// (tracing's `log` fallback) nor the in-process servers' ports.
#[test]
fn compiles_and_in_process_servers_stay_out_of_the_log() {
    require_plugin();
    let folder = tempfile::tempdir().unwrap();
    let output = super::hlat()
        .args(["bench", "route", "--devices", "xla", "--operations", "20"])
        .args(["--reads", "2", "--repeats", "1", "--json", "route.json"])
        .current_dir(folder.path())
        .output()
        .expect("running hlat");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    for noise in ["compile; cached", "Server started"] {
        assert!(!stderr.contains(noise), "{stderr}");
    }
}

/// In-process devices make Burn's remote clients send 64 operations a message instead of Burn's
/// 4, unless the application's `burn.toml` says otherwise.
#[test]
fn in_process_devices_batch_remote_operations_unless_burn_toml_says_otherwise() {
    let folder = tempfile::tempdir().unwrap();
    let route = ["route", "--devices", "host", "--operations", "20"];
    let quick = ["--reads", "2", "--repeats", "1"];
    let (_, report) = bench(&[&route[..], &quick].concat(), "route.json", folder.path());
    assert_eq!(report["remote_flush_threshold"], 64, "{report}");
    std::fs::write(
        folder.path().join("burn.toml"),
        "[remote]\nflush_threshold = 8\n",
    )
    .unwrap();
    let (_, report) = bench(&[&route[..], &quick].concat(), "route.json", folder.path());
    assert_eq!(report["remote_flush_threshold"], 8, "{report}");
}

#[test]
fn bench_route_reports_each_device_beside_flex() {
    require_plugin();
    let folder = tempfile::tempdir().unwrap();
    let devices = ["flex", "remote-flex", "host", "xla"];
    let (table, report) = bench(
        &[
            "route",
            "--devices",
            &devices.join(","),
            "--operations",
            "200",
            "--reads",
            "10",
            "--repeats",
            "1",
        ],
        "route.json",
        folder.path(),
    );
    let measured = report["devices"].as_array().unwrap();
    let names: Vec<&str> = measured
        .iter()
        .map(|device| device["device"].as_str().unwrap())
        .collect();
    assert_eq!(names, devices, "{report}");
    let flex = &measured[0];
    for device in measured {
        for (value, overhead, of_flex) in [
            ("micros_per_operation", "operation_overhead_micros", flex),
            ("micros_per_read", "read_overhead_micros", flex),
        ] {
            let value_micros = device[value].as_f64().unwrap();
            assert!(value_micros > 0.0, "{report}");
            let expected = value_micros - of_flex[value].as_f64().unwrap();
            assert!(
                (device[overhead].as_f64().unwrap() - expected).abs() < 1e-9,
                "{report}"
            );
        }
        assert!(
            table.contains(&format!("| {} |", device["device"].as_str().unwrap())),
            "{table}"
        );
    }

    let refused = hlat(&["bench", "route", "--devices", "flex,tpu"], folder.path());
    assert_eq!(refused.status.code(), Some(2));
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        message.contains("`tpu`") && message.contains("--devices"),
        "{message}"
    );
}
