//! Every HLO module the `neuron` executor hands to `neuronx-cc` for an HLAT training step (the
//! real model and trainer) uses only operators of the Neuron compiler's published XLA operator
//! list (`backend/src/executor/neuron/supported_operators.txt`, which says where the list comes
//! from), `reduce` only with the computations the list allows, and `power` only with constant
//! exponents ("Exponent argument must be a compile-time integer constant").
//!
//! The step runs on `neuron:0` in compile-only mode with a stand-in compiler that copies the
//! module as its "NEFF" (it is NOT the Neuron compiler); the modules are read back from the NEFF
//! cache, exactly as the compiler would receive them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use burn::backend::Autodiff;
use burn_trainium::hlo::{HloInstructionProto, HloModuleProto};
use burn_trainium::neuron::{MODULE_FILE, NeuronSettings, NeuronTarget};
use burn_trainium::{Trainium, TrainiumDevice, stats};
use hlat::HlatConfig;
use hlat_train::optimizer::AdamWSettings;
use hlat_train::schedule::WarmupCosine;
use hlat_train::step::{LanguageModel, LmBatch};
use hlat_train::trainer::Trainer;
use prost::Message;

/// The published list: documented name | HLO opcodes | restriction.
const SUPPORTED_OPERATORS: &str =
    include_str!("../../backend/src/executor/neuron/supported_operators.txt");

/// Reductions the list allows in `reduce` ("Min, Max, Add and Mul are the only supported
/// computations").
const REDUCE_COMPUTATIONS: [&str; 4] = ["add", "maximum", "minimum", "multiply"];

/// A stand-in for `neuronx-cc`: answers `--version` and "compiles" by copying the module.
const STAND_IN_COMPILER: &str = r#"#!/bin/sh
# Stand-in for neuronx-cc written by the integration tests. NOT the Neuron compiler.
if [ "$1" = "--version" ]; then echo "NeuronX Compiler version 0.0.0+stand-in"; exit 0; fi
input=$2; output=""
while [ $# -gt 0 ]; do [ "$1" = "--output" ] && output=$2; shift; done
cp "$input" "$output"
"#;

/// A stand-in for the kernel tracer: answers the probe and every request with a fixed call.
const STAND_IN_TRACER: &str = r#"#!/usr/bin/env python3
# Stand-in for the NKI kernel tracer written by the integration tests. NOT the Neuron SDK.
import json, sys
if "--probe" in sys.argv:
    sys.exit(0)
request = json.load(sys.stdin)
json.dump({"custom_call_target": "AwsNeuronCustomNativeKernel",
           "backend_config": "stand-in", "output": request["output"]}, sys.stdout)
"#;

/// Writes an executable `body` as `name` in `folder`.
fn executable(folder: &Path, name: &str, body: &str) -> PathBuf {
    let path = folder.join(name);
    std::fs::write(&path, body).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// Every HLO opcode of the published list.
fn supported_opcodes() -> BTreeSet<String> {
    SUPPORTED_OPERATORS
        .lines()
        .filter(|line| !line.trim_start().starts_with('#') && !line.trim().is_empty())
        .flat_map(|line| {
            let opcodes = line
                .split('|')
                .nth(1)
                .unwrap_or_else(|| panic!("malformed line `{line}`"));
            opcodes
                .split(',')
                .map(|opcode| opcode.trim().to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Every module file under `root`, sorted.
fn cached_modules(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.file_name().is_some_and(|name| name == MODULE_FILE) {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// The instruction an operand's value comes from, looking through shape-only operations.
fn origin(by_id: &HashMap<i64, &HloInstructionProto>, mut id: i64) -> String {
    loop {
        let Some(instruction) = by_id.get(&id) else {
            return "?".to_string();
        };
        match instruction.opcode.as_str() {
            "broadcast" | "reshape" | "convert" | "slice" | "transpose" => {
                id = instruction.operand_ids[0]
            }
            other => return other.to_string(),
        }
    }
}

/// What the modules use, and where they break the published list.
#[derive(Debug, Default)]
struct ModuleScan {
    modules: usize,
    used: BTreeMap<String, usize>,
    unsupported: Vec<String>,
    unsupported_reductions: Vec<String>,
    runtime_exponents: Vec<String>,
}

fn scan_modules(root: &Path) -> ModuleScan {
    let supported = supported_opcodes();
    let mut scan = ModuleScan::default();
    for path in cached_modules(root) {
        scan.modules += 1;
        let module = HloModuleProto::decode(std::fs::read(&path).unwrap().as_slice()).unwrap();
        let roots: HashMap<i64, String> = module
            .computations
            .iter()
            .map(|computation| {
                let root = computation
                    .instructions
                    .iter()
                    .find(|i| i.id == computation.root_id);
                (
                    computation.id,
                    root.map(|i| i.opcode.clone()).unwrap_or_default(),
                )
            })
            .collect();
        for computation in &module.computations {
            let by_id: HashMap<i64, &HloInstructionProto> =
                computation.instructions.iter().map(|i| (i.id, i)).collect();
            for instruction in &computation.instructions {
                *scan.used.entry(instruction.opcode.clone()).or_default() += 1;
                if !supported.contains(&instruction.opcode) {
                    scan.unsupported
                        .push(format!("{}: `{}`", module.name, instruction.opcode));
                }
                if instruction.opcode == "reduce" {
                    for called in &instruction.called_computation_ids {
                        let root = roots.get(called).map(String::as_str).unwrap_or("?");
                        if !REDUCE_COMPUTATIONS.contains(&root) {
                            scan.unsupported_reductions
                                .push(format!("{}: reduce with `{root}`", module.name));
                        }
                    }
                }
                if instruction.opcode == "power" {
                    let exponent = origin(&by_id, instruction.operand_ids[1]);
                    if exponent != "constant" {
                        scan.runtime_exponents.push(format!(
                            "{}: power with an exponent from a `{exponent}`",
                            module.name
                        ));
                    }
                }
            }
        }
    }
    scan
}

/// Two HLAT training steps (HLAT's AdamW, warmup, clipping) on `device`.
fn train_two_steps(device: &TrainiumDevice) {
    type B = Autodiff<Trainium>;
    let config = HlatConfig::preset("hlat-test").unwrap();
    let model = config.init::<B>(device);
    let mut trainer = Trainer::new(
        LanguageModel::new(model, None),
        AdamWSettings {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            exclude_norms_from_weight_decay: false,
        },
        WarmupCosine {
            peak: 3e-4,
            warmup_steps: 2,
            decay_steps: 2,
            min_ratio: 0.1,
        },
        1.0,
        7,
        3,
    );
    let rows: Vec<Vec<u32>> = (0..2)
        .map(|row| (0..9).map(|i| ((row * 9 + i) * 7 % 64) as u32).collect())
        .collect();
    for _ in 0..2 {
        trainer
            .train_step(vec![LmBatch::from_rows(&rows, device)])
            .unwrap();
    }
}

#[test]
fn an_hlat_training_step_uses_only_supported_neuron_operators() {
    let _random = crate::support::exclusive_random();
    let workspace = tempfile::tempdir().unwrap();
    let compiler = executable(workspace.path(), "stand-in-neuronx-cc", STAND_IN_COMPILER);
    let cache_root = workspace.path().join("cache");
    // The only test of this binary that opens `neuron` devices.
    burn_trainium::neuron::set_settings(Some(NeuronSettings {
        compiler: compiler.clone(),
        target: NeuronTarget::Trn1,
        compiler_flags: Vec::new(),
        cache_root: cache_root.clone(),
        retry_failed: false,
        // Training decomposes attention (Burn's autodiff): no kernel call to trace.
        flash_attention: burn_trainium::neuron::FlashAttention::Off,
        kernel_tracer: None,
    }));
    burn_trainium::neuron::set_compile_only(true);
    let device = TrainiumDevice::neuron(0);
    train_two_steps(&device);

    let supported = supported_opcodes();
    assert!(
        supported.contains("dot") && supported.contains("parameter"),
        "{supported:?}"
    );
    let scan = scan_modules(&cache_root);
    let compiles = stats(&device).compiles;
    assert!(
        compiles > 0 && scan.modules as u64 == compiles,
        "{compiles} compiles, {scan:?}"
    );
    assert!(
        scan.used.contains_key("dot") && scan.used.contains_key("reduce"),
        "{scan:?}"
    );
    assert!(
        scan.unsupported.is_empty(),
        "not in the published list:\n{}",
        scan.unsupported.join("\n")
    );
    assert!(
        scan.unsupported_reductions.is_empty(),
        "{}",
        scan.unsupported_reductions.join("\n")
    );
    assert!(
        scan.runtime_exponents.is_empty(),
        "{}",
        scan.runtime_exponents.join("\n")
    );

    hlat_inference_asks_for_the_flash_kernel(workspace.path(), &compiler);
}

/// HLAT's forward pass in inference over 1,024 positions, with the SDK's flash kernel on: the
/// layers' attention is a kernel request (Burn's attention module), no program holds scores of
/// every position against every position, and the module the compiler receives holds the
/// tracer's calls.
fn hlat_inference_asks_for_the_flash_kernel(folder: &Path, compiler: &Path) {
    use burn::tensor::{Int, Tensor, TensorData};
    use burn_trainium::lower::{KERNEL_REQUEST_TARGET, KernelRequest};
    use burn_trainium::neuron::{FlashAttention, NEFF_FILE, NEURON_KERNEL_TARGET};

    let cache_root = folder.join("flash-cache");
    burn_trainium::neuron::set_settings(Some(NeuronSettings {
        compiler: compiler.to_path_buf(),
        target: NeuronTarget::Trn1,
        compiler_flags: Vec::new(),
        cache_root: cache_root.clone(),
        retry_failed: false,
        flash_attention: FlashAttention::On,
        kernel_tracer: Some(executable(folder, "stand-in-tracer", STAND_IN_TRACER)),
    }));
    let device = TrainiumDevice::neuron(1);
    let mut config = HlatConfig::preset("hlat-test").unwrap();
    let seq = 1024;
    config.max_seq_len = seq;
    let model: hlat::Hlat<Trainium> = config.init(&device);
    let ids: Vec<i64> = (0..seq as i64).map(|i| i % 64).collect();
    let ids = Tensor::<Trainium, 2, Int>::from_data(TensorData::new(ids, [1, seq]), &device);
    let _ = model.forward(ids).into_data();

    // The stand-in compiler's "NEFF" is the module it received.
    let instructions = |path: &Path| {
        let module = HloModuleProto::decode(std::fs::read(path).unwrap().as_slice()).unwrap();
        module
            .computations
            .into_iter()
            .flat_map(|computation| computation.instructions)
            .collect::<Vec<_>>()
    };
    let mut requests = Vec::new();
    let mut calls = 0;
    for module_path in cached_modules(&cache_root) {
        for instruction in instructions(&module_path) {
            if let Some(request) = KernelRequest::of_instruction(&instruction) {
                requests.push(request.unwrap());
            }
            // No scores of every position against every position.
            let dims = &instruction.shape.as_ref().unwrap().dimensions;
            assert!(
                !(instruction.opcode == "dot" && dims.ends_with(&[seq as i64, seq as i64])),
                "{dims:?}"
            );
        }
        for instruction in instructions(&module_path.with_file_name(NEFF_FILE)) {
            assert_ne!(instruction.custom_call_target, KERNEL_REQUEST_TARGET);
            calls += usize::from(instruction.custom_call_target == NEURON_KERNEL_TARGET);
        }
    }
    // The layers run programs of one structure: each distinct program is compiled once.
    assert!(!requests.is_empty());
    assert_eq!(calls, requests.len());
    let heads = config.num_heads as i64;
    let width = config.head_dim() as i64;
    assert_eq!(requests[0].grid, [1, heads]);
    assert_eq!(requests[0].output.shape, [1, heads, seq as i64, width]);
}
