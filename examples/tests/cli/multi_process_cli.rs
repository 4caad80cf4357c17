//! `hlat pretrain` as a job of two processes on this machine (torchrun's variables, loopback):
//! the same losses as one process driving both replicas, checkpoints sharded over the ranks (and
//! resumed by one process), a lost rank stopping the other with an error naming it, and a restart
//! resuming from the newest step both ranks completed.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use burn_trainium::hlo::HloModuleProto;
use prost::Message;

use super::disk_faults::{self, DiskFault};
use super::{hlat, require_plugin, run, succeed, wait_until};

/// Data parallel across the two processes.
const DATA_PARALLEL: &[&str] = &["--dp", "2"];
/// Tensor parallel (with sequence parallelism) inside each process, data parallel and ZeRO-1
/// across them.
const TENSOR_INSIDE_DATA_ACROSS: &[&str] =
    &["--dp", "2", "--tp", "2", "--sequence-parallel", "--zero1"];

/// Fully sharded data parallelism across the two processes, each layer gathered again for its
/// recomputation.
const FULLY_SHARDED_ACROSS: &[&str] =
    &["--dp", "2", "--fsdp", "--activation-checkpointing", "full"];

/// Pipeline stages across the two processes (one stage each), tensor parallel with sequence
/// parallelism inside each.
const STAGES_ACROSS_TENSOR_INSIDE: &[&str] = &["--pp", "2", "--tp", "2", "--sequence-parallel"];

/// Flags of the small run of `layout` the tests here train.
fn run_flags(out: &Path, max_steps: u64, layout: &[&str]) -> Vec<String> {
    ["pretrain", "--preset", "hlat-test", "--device", "host:0"]
        .into_iter()
        .chain(layout.iter().copied())
        .chain([
            "--max-steps",
            &max_steps.to_string(),
            "--seq-len",
            "32",
            "--batch-tokens",
            "256",
            "--micro-batch-rows",
            "4",
            "--lr",
            "0.01",
            "--warmup-steps",
            "2",
            "--eval-every",
            "0",
            "--checkpoint-every",
            "5",
            "--no-progress",
            "--out",
            out.to_str().unwrap(),
        ])
        .map(str::to_string)
        .collect()
}

/// A base port with the three after it free (rank 0's listener, the Neuron collectives' meeting
/// point, the job's key-value store).
fn free_base_port() -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if port < 65000
            && (1..4).all(|offset| TcpListener::bind(("127.0.0.1", port + offset)).is_ok())
        {
            return port;
        }
    }
}

/// Starts rank `rank` of a job of two with `flags`.
fn start_rank(rank: usize, port: u16, flags: &[String]) -> Child {
    start_rank_with(rank, port, flags, &[])
}

/// Starts rank `rank` of a job of two with `flags` and the variables `environment` besides the
/// launcher's.
fn start_rank_with(
    rank: usize,
    port: u16,
    flags: &[String],
    environment: &[(&str, String)],
) -> Child {
    let mut command: Command = hlat();
    command
        .args(flags)
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", "2")
        .env("LOCAL_RANK", rank.to_string())
        .env("LOCAL_WORLD_SIZE", "2")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("TRAINIUM_JOIN_TIMEOUT_S", "120")
        .env("RUST_LOG", "warn")
        .envs(environment.iter().map(|(name, value)| (name, value)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting hlat")
}

/// Waits for `child` at most `limit`; kills it past that.
fn finish(mut child: Child, limit: Duration) -> (Output, Duration) {
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            child.kill().unwrap();
            let output = child.wait_with_output().unwrap();
            panic!(
                "hlat ran past {limit:?}:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    (child.wait_with_output().unwrap(), started.elapsed())
}

/// Runs a job of two processes to its end; both must succeed. Returns each rank's output.
fn run_job(flags: &[String]) -> Vec<String> {
    run_job_with(flags, free_base_port(), &[])
        .into_iter()
        .map(|output| String::from_utf8(output.stdout).unwrap())
        .collect()
}

/// Runs a job of two processes on `port` with `environment` to its end; both must succeed.
fn run_job_with(flags: &[String], port: u16, environment: &[(&str, String)]) -> Vec<Output> {
    let ranks: Vec<Child> = (0..2)
        .map(|rank| start_rank_with(rank, port, flags, environment))
        .collect();
    ranks
        .into_iter()
        .enumerate()
        .map(|(rank, child)| {
            let (output, _) = finish(child, Duration::from_secs(600));
            assert!(
                output.status.success(),
                "rank {rank} failed:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
            output
        })
        .collect()
}

/// `(step, loss)` of every record of a run folder's metrics.jsonl.
fn losses(out: &Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .map(|record| {
            (
                record["step"].as_u64().unwrap(),
                record["loss"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// Steps with a complete checkpoint in a run folder.
fn complete_steps(out: &Path) -> Vec<u64> {
    let mut steps: Vec<u64> = std::fs::read_dir(out.join("checkpoints"))
        .map(|entries| {
            entries
                .filter_map(|entry| {
                    let entry = entry.ok()?;
                    let name = entry.file_name().to_string_lossy().into_owned();
                    let step = name.strip_prefix("step-")?.parse().ok()?;
                    entry.path().join("state.json").is_file().then_some(step)
                })
                .collect()
        })
        .unwrap_or_default();
    steps.sort();
    steps
}

fn assert_close(found: &[(u64, f64)], expected: &[(u64, f64)]) {
    assert_eq!(found.len(), expected.len(), "{found:?} vs {expected:?}");
    for (&(step, loss), &(expected_step, expected_loss)) in found.iter().zip(expected) {
        assert_eq!(step, expected_step);
        assert!(
            (loss - expected_loss).abs() <= 1e-4 * expected_loss.abs(),
            "step {step}: loss {loss} vs {expected_loss} for one process"
        );
    }
}

#[test]
fn two_processes_train_as_one_process_driving_every_replica() {
    let folder = tempfile::tempdir().unwrap();
    for (name, layout) in [
        ("dp", DATA_PARALLEL),
        ("tp-inside-dp-across", TENSOR_INSIDE_DATA_ACROSS),
        ("fsdp-across", FULLY_SHARDED_ACROSS),
        ("tp-inside-pp-across", STAGES_ACROSS_TENSOR_INSIDE),
    ] {
        let single = folder.path().join(name).join("single");
        let flags = run_flags(&single, 10, layout);
        succeed(&flags.iter().map(String::as_str).collect::<Vec<_>>());
        let job = folder.path().join(name).join("job");
        run_job(&run_flags(&job, 10, layout));

        let expected = losses(&single);
        assert_eq!(expected.len(), 10, "{name}");
        assert_close(&losses(&job), &expected);
        // Rank 1 writes its own folder, with the same checkpoints.
        let rank1 = job.join("ranks/rank-01");
        assert_eq!(complete_steps(&job), complete_steps(&rank1), "{name}");
        assert_close(&losses(&rank1), &expected);
        // Each checkpoint is sharded: rank 0 writes the model and half the optimizer state, rank
        // 1 the other half, each with its own completion marker.
        let step = Path::new("checkpoints/step-00000010");
        assert_eq!(
            entries(&job.join(step)),
            ["model", "optimizer-rank-00-of-02.bpk", "state.json"],
            "{name}"
        );
        assert_eq!(
            entries(&rank1.join(step)),
            ["optimizer-rank-01-of-02.bpk", "state.json"],
            "{name}"
        );

        // One process resumes the job's checkpoint (both shares of the optimizer state) and
        // trains on as the one-process run does from its own.
        let single_on = run_flags(&single, 12, layout);
        succeed(&single_on.iter().map(String::as_str).collect::<Vec<_>>());
        let job_on = run_flags(&job, 12, layout);
        let job_on: Vec<&str> = job_on.iter().map(String::as_str).collect();
        // A share gone behind its marker is an error naming it, not a silent fresh state.
        let share = rank1.join(step).join("optimizer-rank-01-of-02.bpk");
        let moved = share.with_extension("moved");
        std::fs::rename(&share, &moved).unwrap();
        let failed = run(&job_on);
        let stderr = String::from_utf8_lossy(&failed.stderr);
        assert!(!failed.status.success(), "{name}: resumed without a share");
        assert!(
            stderr.contains(share.to_str().unwrap()),
            "{name}: the error does not name the missing share:\n{stderr}"
        );
        std::fs::rename(&moved, &share).unwrap();
        let output = succeed(&job_on);
        assert!(output.contains("trained steps 11..12"), "{name}: {output}");
        let expected = losses(&single);
        assert_eq!(expected.len(), 12, "{name}");
        assert_close(&losses(&job), &expected);
    }
}

/// The names in a folder, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_lost_rank_stops_the_job_and_a_restart_resumes_where_both_ranks_were() {
    let folder = tempfile::tempdir().unwrap();
    let job = folder.path().join("job");
    let rank1_folder = job.join("ranks/rank-01");
    let flags = run_flags(&job, 40, DATA_PARALLEL);
    let port = free_base_port();
    let rank0 = start_rank(0, port, &flags);
    let mut rank1 = start_rank(1, port, &flags);

    // Rank 1 dies (SIGKILL, as a failed node would) once it has written step 10.
    wait_until(Duration::from_secs(600), "rank 1 writing step 10", || {
        complete_steps(&rank1_folder).contains(&10)
    });
    rank1.kill().unwrap();
    rank1.wait().unwrap();
    let (output, waited) = finish(rank0, Duration::from_secs(120));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "rank 0 went on alone:\n{stderr}");
    assert!(
        stderr.contains("rank 1 was lost"),
        "rank 0's error does not name the lost rank:\n{stderr}"
    );
    assert!(
        waited < Duration::from_secs(60),
        "rank 0 took {waited:?} to stop"
    );

    // Restarted, both ranks resume from the newest step both completed.
    let ours = complete_steps(&job);
    let theirs = complete_steps(&rank1_folder);
    let resume = *ours
        .iter()
        .rev()
        .find(|step| theirs.contains(step))
        .expect("a step both ranks completed");
    assert!(resume >= 10, "{ours:?} {theirs:?}");
    let outputs = run_job(&flags);
    for output in &outputs {
        assert!(
            output.contains(&format!("trained steps {}..40", resume + 1)),
            "the restart did not resume from step {resume}:\n{output}"
        );
    }
    let steps: Vec<u64> = losses(&job).iter().map(|&(step, _)| step).collect();
    assert_eq!(steps, (1..=40).collect::<Vec<_>>());
}

#[test]
fn a_rank_killed_while_it_writes_in_the_background_resumes_as_a_job_never_killed() {
    let folder = tempfile::tempdir().unwrap();
    let background = |out: &Path| {
        let mut flags = run_flags(out, 20, DATA_PARALLEL);
        flags.push("--async-checkpoint".to_string());
        flags
    };
    let whole = folder.path().join("whole");
    run_job(&background(&whole));
    let expected = losses(&whole);
    assert_eq!(expected.len(), 20);

    // Rank 1's write of its share of step 10 never ends; its training goes on to the checkpoint
    // of step 15, which waits for it, while rank 0 writes steps 10 and 15. Rank 1 is then killed.
    let job = folder.path().join("job");
    let flags = background(&job);
    let marker = folder.path().join("stalled");
    let stall = DiskFault::StallWrite {
        path: "rank-01/checkpoints/.tmp-step-00000010/",
        marker: &marker,
    };
    let port = free_base_port();
    let rank0 = start_rank(0, port, &flags);
    let mut rank1 = start_rank_with(1, port, &flags, &disk_faults::variables(&stall));
    wait_until(
        Duration::from_secs(600),
        "rank 1 stalling at step 10 and rank 0 writing step 15",
        || marker.exists() && complete_steps(&job).contains(&15),
    );
    rank1.kill().unwrap();
    rank1.wait().unwrap();
    let (output, _) = finish(rank0, Duration::from_secs(120));
    assert!(!output.status.success(), "rank 0 went on alone");
    // Rank 0 keeps three checkpoints in the background (two would have deleted step 5, the
    // only one rank 1 completed).
    assert_eq!(complete_steps(&job), [5, 10, 15]);
    assert_eq!(complete_steps(&job.join("ranks/rank-01")), [5]);

    for output in run_job(&flags) {
        assert!(output.contains("trained steps 6..20"), "{output}");
    }
    let found = losses(&job);
    assert_eq!(found.len(), 20);
    for (&(step, loss), &(_, expected)) in found.iter().zip(&expected) {
        assert!(
            (loss - expected).abs() <= 1e-6,
            "step {step}: loss {loss} against {expected} of the job never killed"
        );
    }
}

/// The HLO modules under a Neuron compile cache, decoded.
pub(super) fn cached_modules(dir: &Path) -> Vec<HloModuleProto> {
    test_support::files::cached_modules(dir)
        .iter()
        .map(|path| HloModuleProto::decode(&*std::fs::read(path).unwrap()).unwrap())
        .collect()
}

#[test]
fn two_processes_trace_a_neuron_job_each_on_its_own_cores() {
    // `hlat compile` traces the job in compile-only mode (no NeuronCore here): every process
    // opens its share of the `neuron` device, gets its cores and the collectives' meeting point,
    // and compiles the job's programs, whose collectives name the replicas of both processes.
    // A run trained into the job's folder is left as it was: `--out` names where the report
    // goes, so the run's own folder is refused by both processes, and the trace's checkpoints
    // go to scratch folders.
    let folder = tempfile::tempdir().unwrap();
    let job = folder.path().join("job");
    let trained = run_flags(&job, 2, DATA_PARALLEL);
    let status = hlat()
        .args(&trained)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "training the run to keep");
    let before = test_support::files::snapshot(&job);
    let as_compile = |mut flags: Vec<String>| {
        flags[0] = "compile".into();
        flags[4] = "neuron:0".into();
        flags
    };
    refused_by_both(&as_compile(trained), &["`hlat pretrain`"]);
    assert_eq!(test_support::files::snapshot(&job), before);
    let compiler = test_support::stand_in::compiler(folder.path());
    let cache = folder.path().join("cache");
    let report = folder.path().join("report");
    let flags = as_compile(run_flags(&report, 2, DATA_PARALLEL));
    let port = free_base_port();
    let environment = [
        ("NEURON_CC", compiler.to_str().unwrap().to_string()),
        (
            "NEURON_COMPILE_CACHE_URL",
            cache.to_str().unwrap().to_string(),
        ),
        ("TRAINIUM_DEVICE", "neuron:0".to_string()),
        // Burn 0.22 logs every tracing span at `info` (tracing's `log` feature); `hlat`'s own
        // filter keeps them out, which a `RUST_LOG` replaces: the children's piped standard
        // error is read only once they exit, so a flood of spans would block them.
        ("RUST_LOG", "info,tracing::span=warn".to_string()),
    ];
    let outputs = run_job_with(&flags, port, &environment);
    for (rank, output) in outputs.iter().enumerate() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        for expected in [
            format!("NEURON_RT_VISIBLE_CORES={rank}"),
            format!("NEURON_RT_ROOT_COMM_ID=127.0.0.1:{}", port + 2),
        ] {
            assert!(
                stderr.contains(&expected),
                "rank {rank}: no {expected}:\n{stderr}"
            );
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            stdout.contains("traced 2 training steps on neuron:0-1") && !stdout.contains("trained"),
            "rank {rank}: {stdout}"
        );
        let (compiled, found) = stdout
            .lines()
            .find_map(|line| {
                let (compiled, rest) = line.split_once(" programs compiled in ")?;
                let found = rest.split(", ").nth(1)?.split_once(" found")?.0;
                Some((compiled.parse::<u64>().ok()?, found.parse::<u64>().ok()?))
            })
            .unwrap_or_else(|| panic!("rank {rank}: no compile summary: {stdout}"));
        assert!(compiled + found > 0, "rank {rank}: {stdout}");
    }
    // The gradients' mean over data parallel 2 is one all-reduce over both processes' replicas.
    let groups: Vec<Vec<Vec<i64>>> = cached_modules(&cache)
        .iter()
        .flat_map(|module| &module.computations)
        .flat_map(|computation| &computation.instructions)
        .filter(|instruction| instruction.opcode == "all-reduce")
        .map(|instruction| {
            instruction
                .replica_groups
                .iter()
                .map(|group| group.replica_ids.clone())
                .collect()
        })
        .collect();
    assert_eq!(test_support::files::snapshot(&job), before);
    assert!(report.join("compile-report.json").is_file());
    assert!(!groups.is_empty(), "no all-reduce compiled");
    assert!(
        groups.iter().all(|groups| groups == &[vec![0, 1]]),
        "{groups:?}"
    );

    // A process told to meet elsewhere than rank 0 stops, naming both places.
    let port = free_base_port();
    let elsewhere = [
        environment.to_vec(),
        vec![("NEURON_RT_ROOT_COMM_ID", "10.0.0.9:1234".to_string())],
    ]
    .concat();
    let rank0 = start_rank_with(0, port, &flags, &environment);
    let rank1 = start_rank_with(1, port, &flags, &elsewhere);
    let (output, _) = finish(rank1, Duration::from_secs(120));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "rank 1 ran:\n{stderr}");
    let expected = format!(
        "NEURON_RT_ROOT_COMM_ID is `10.0.0.9:1234` in process 1 but `127.0.0.1:{}` in rank 0",
        port + 2
    );
    assert!(stderr.contains(&expected), "no `{expected}`:\n{stderr}");
    finish(rank0, Duration::from_secs(120));
}

/// Runs a job of two processes with `flags` that both must refuse: exit status 2, with every
/// one of `expected` in their errors.
fn refused_by_both(flags: &[String], expected: &[&str]) {
    let port = free_base_port();
    let ranks: Vec<Child> = (0..2).map(|rank| start_rank(rank, port, flags)).collect();
    for (rank, child) in ranks.into_iter().enumerate() {
        let (output, _) = finish(child, Duration::from_secs(120));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "rank {rank}:\n{stderr}");
        for expected in expected {
            assert!(
                stderr.contains(expected),
                "rank {rank}: no `{expected}`:\n{stderr}"
            );
        }
    }
}

#[test]
fn an_xla_job_of_two_processes_is_refused_when_the_plugin_does_not_join_them() {
    // The client is created with the job's node id, node count and key-value store; the XLA CPU
    // plugin ignores them and reports only its own devices, which both processes say plainly.
    require_plugin();
    let folder = tempfile::tempdir().unwrap();
    let mut flags = run_flags(&folder.path().join("job"), 2, DATA_PARALLEL);
    flags[4] = "xla:0".into();
    refused_by_both(
        &flags,
        &[
            "xla:0-1 across the 2 processes",
            "`cpu` PJRT plugin did not join",
        ],
    );
}

#[test]
fn a_tensor_parallel_group_across_processes_is_refused_before_training() {
    let folder = tempfile::tempdir().unwrap();
    let flags = run_flags(&folder.path().join("job"), 2, &["--tp", "2"]);
    refused_by_both(&flags, &["tensor_parallel = 2 does not fit the 1 replicas"]);
    assert!(!folder.path().join("job/checkpoints").exists());
}

/// `hlat align --method dpo` as a job of two processes (`--dp 2`, a replica each) equals one
/// process driving both replicas, losses and rewards: each process computes its replica's
/// reference log-probabilities and the processes share them.
#[test]
fn a_dpo_job_of_two_processes_aligns_as_one_process() {
    let folder = tempfile::tempdir().unwrap();
    let base = super::finetune_cli::base_model(folder.path());
    let records = super::fixture("align-tiny-llama3/prefs.jsonl");
    let reference = super::fixture("align-tiny-llama3/reference");
    let flags = |out: &Path| {
        let layout = [
            "--device",
            "host:0",
            "--dp",
            "2",
            "--max-steps",
            "3",
            "--lr",
            "1e-3",
            "--seq-len",
            "64",
            "--micro-batch-rows",
            "4",
            "--no-progress",
            "--ref-model",
            reference.to_str().unwrap(),
        ];
        super::finetune_cli::tuning(
            &["align", "--method", "dpo"],
            &base,
            (&records, out),
            &layout,
        )
    };
    let single = folder.path().join("single");
    succeed(
        &flags(&single)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    let job = folder.path().join("job");
    // Each process computes its replica's rows alone: a row no process shared would stop the
    // job (`reference_log_probs`).
    run_job(&flags(&job));
    assert_close(&losses(&job), &losses(&single));
    let rewards = |out: &Path| -> Vec<(u64, f64)> {
        test_support::training::logged_steps(out)
            .iter()
            .map(|line| (line.step, line.rewards_margins.expect("margins logged")))
            .collect()
    };
    assert_close(&rewards(&job), &rewards(&single));
}
