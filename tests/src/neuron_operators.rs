//! Every HLO module the `neuron` executor hands to `neuronx-cc` follows the Neuron lint (the
//! operator table and rules of `burn_trainium::neuron::lint_module`, from the Neuron SDK's
//! documentation), in every parallel layout: one device, dp 2, tp 2 with sequence parallelism,
//! dp 2 × tp 2 with sequence parallelism and ZeRO-1, activation checkpointing, bf16 with
//! stochastic rounding, a mixture of experts under dp 2 × ep 2 × tp 2 and dp 2 × ep 2 × pp 2;
//! and in generation and evaluation.
//!
//! The runs are traced on `neuron` devices in compile-only mode with the workspace's stand-in
//! compiler (`test_support::stand_in`, NOT the Neuron compiler); the modules are read back
//! from the NEFF cache, exactly as the compiler would receive them, and linted again here.

use std::collections::BTreeMap;
use std::path::Path;

use burn_trainium::hlo::HloModuleProto;
use burn_trainium::neuron::{NeuronSettings, NeuronTarget, Violation, lint_module};
use burn_trainium::{TrainiumDevice, stats};
use hlat::HlatConfig;
use hlat::generate::{GenerationOptions, Sampling, generate};
use hlat_train::config::TrainConfig;
use hlat_train::eval::perplexity_of_rows;
use hlat_train::parallel::ActivationCheckpointing;
use hlat_train::precision::Precision;
use hlat_train::pretrain::{DataChoice, DeviceInfo, PretrainOptions, pretrain};
use prost::Message;
use test_support::files::cached_modules;
use test_support::stand_in;

use crate::support::trainium;

/// What the modules under `root` use, and their lint violations.
#[derive(Debug, Default)]
struct ModuleScan {
    modules: usize,
    used: BTreeMap<String, usize>,
    violations: Vec<Violation>,
}

fn scan_modules(root: &Path) -> ModuleScan {
    let mut scan = ModuleScan::default();
    for path in cached_modules(root) {
        scan.modules += 1;
        let module = HloModuleProto::decode(std::fs::read(&path).unwrap().as_slice()).unwrap();
        for instruction in module.computations.iter().flat_map(|c| &c.instructions) {
            *scan.used.entry(instruction.opcode.clone()).or_default() += 1;
        }
        scan.violations.extend(lint_module(&module));
    }
    scan
}

/// The stand-in compiler's settings, with the NEFF cache in `cache_root`.
fn settings(compiler: &Path, cache_root: &Path) -> NeuronSettings {
    NeuronSettings {
        compiler: compiler.to_path_buf(),
        target: NeuronTarget::Trn1,
        compiler_flags: Vec::new(),
        cache_root: cache_root.to_path_buf(),
        retry_failed: false,
        // Training decomposes attention (Burn's autodiff): no kernel call to trace.
        flash_attention: burn_trainium::neuron::FlashAttention::Off,
        kernel_tracer: None,
        lint: Default::default(),
    }
}

/// One traced layout: data and tensor degrees, sequence parallelism, ZeRO-1, checkpointing,
/// precision.
type Layout = (usize, usize, bool, bool, ActivationCheckpointing, Precision);

/// Two steps of pretraining the model in `init_from` (else `hlat-test`) on the built-in corpus in
/// `layout`, its experts split over `expert` of the data-parallel replicas and its layers over
/// `pipeline` stages, on neuron devices starting at core `first_core`.
fn trace_pretraining(
    init_from: Option<&Path>,
    (expert, pipeline): (usize, usize),
    layout: Layout,
    first_core: u16,
    out: &Path,
) -> TrainiumDevice {
    let (data, tensor, sequence_parallel, zero1, checkpointing, precision) = layout;
    let replicas = (data * tensor * pipeline) as u16;
    let device = if replicas == 1 {
        TrainiumDevice::neuron(first_core)
    } else {
        TrainiumDevice::neuron(first_core).with_replicas(replicas)
    };
    let options = PretrainOptions {
        config: TrainConfig {
            preset: "hlat-test".into(),
            max_steps: 2,
            warmup_steps: 1,
            seq_len: 16,
            batch_tokens: 16 * 4,
            micro_batch_rows: 4 / data,
            data_parallel: data,
            expert_parallel: expert,
            tensor_parallel: tensor,
            pipeline_parallel: pipeline,
            sequence_parallel,
            zero1,
            activation_checkpointing: checkpointing,
            precision,
            eval_every: 0,
            checkpoint_every: 0,
            progress: false,
            ..TrainConfig::quickstart()
        },
        out: out.to_path_buf(),
        data: DataChoice::Builtin,
        init_from: init_from.map(Path::to_path_buf),
        init_adapter: None,
        share: hlat_train::checkpoint_state::ProcessShare::WHOLE,
    };
    let served = trainium(device);
    pretrain(&options, &served, DeviceInfo { compiles: None }).unwrap();
    served.sync().unwrap();
    device
}

#[test]
fn every_layout_compiles_within_the_neuron_rules() {
    let _random = crate::support::exclusive_random();
    let workspace = tempfile::tempdir().unwrap();
    let compiler = stand_in::compiler(workspace.path());
    burn_trainium::neuron::set_compile_only(true);
    use ActivationCheckpointing::{Full, None as Kept, Selective};
    let layouts: [Layout; 6] = [
        (1, 1, false, false, Kept, Precision::F32),
        (2, 1, false, false, Kept, Precision::F32),
        (1, 2, true, false, Kept, Precision::F32),
        (2, 2, true, true, Kept, Precision::F32),
        (
            1,
            2,
            true,
            false,
            Selective,
            Precision::Bf16StochasticRounding,
        ),
        (1, 1, false, false, Full, Precision::F32),
    ];
    // Each layout on cores of its own, with a cache of its own.
    let mut first_core = 0;
    // A mixture of experts split over 2 ranks and each expert over 2 more: tokens and routing
    // weights exchanged by all-to-all; and over 2 ranks and 2 pipeline stages, its router
    // statistics passed between the stages.
    let mixtral = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/hf-tiny-mixtral");
    let expert_layout: Layout = (2, 2, false, false, Kept, Precision::F32);
    let pipelined_experts: Layout = (2, 1, false, false, Kept, Precision::F32);
    let runs = layouts
        .into_iter()
        .map(|layout| (None, (1, 1), layout))
        .chain([
            (Some(mixtral.as_path()), (2, 1), expert_layout),
            (Some(mixtral.as_path()), (2, 2), pipelined_experts),
        ]);
    for (index, (init_from, (expert, pipeline), layout)) in runs.enumerate() {
        let cache_root = workspace.path().join(format!("cache-{index}"));
        // The only test of this binary that opens `neuron` devices.
        burn_trainium::neuron::set_settings(Some(settings(&compiler, &cache_root)));
        let out = workspace.path().join(format!("run-{index}"));
        let device = trace_pretraining(init_from, (expert, pipeline), layout, first_core, &out);
        first_core += device.replicas;
        let scan = scan_modules(&cache_root);
        if expert > 1 {
            assert!(scan.used.contains_key("all-to-all"), "{layout:?}: {scan:?}");
        }
        if pipeline > 1 {
            assert!(
                scan.used.contains_key("collective-permute"),
                "{layout:?}: {scan:?}"
            );
        }
        let compiles = stats(&device).compiles;
        assert!(
            compiles > 0 && scan.modules as u64 == compiles,
            "{layout:?}: {compiles} compiles, {scan:?}"
        );
        assert!(scan.used.contains_key("dot"), "{layout:?}: {scan:?}");
        assert!(
            scan.violations.is_empty(),
            "{layout:?}:\n{}",
            scan.violations
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    // Generation (prompt bucket and decoding steps, with the KV cache) and evaluation (padded
    // batches of rows scored), on one core.
    let cache_root = workspace.path().join("cache-inference");
    burn_trainium::neuron::set_settings(Some(settings(&compiler, &cache_root)));
    let device = trainium(TrainiumDevice::neuron(first_core));
    let model: hlat::Hlat = HlatConfig::preset("hlat-test").unwrap().init(&device);
    let options = GenerationOptions {
        max_new_tokens: 3,
        sampling: Sampling::Greedy,
        seed: 0,
        stop_ids: Vec::new(),
    };
    generate(&model, &[1, 5, 9], &options, |_| {}).unwrap();
    let rows: Vec<Vec<u32>> = vec![vec![1, 2, 3, 4, 5], vec![6, 7, 8]];
    perplexity_of_rows(&model, &rows, None, 2, &device).unwrap();
    device.sync().unwrap();
    let scan = scan_modules(&cache_root);
    assert!(scan.modules >= 3, "generation and evaluation: {scan:?}");
    assert!(scan.violations.is_empty(), "{:?}", scan.violations);

    hlat_inference_asks_for_the_flash_kernel(workspace.path(), &compiler);
    hlat_training_asks_for_the_flash_kernels(workspace.path(), &compiler);
}

/// The settings of the stand-in compiler with the SDK's flash kernels on, traced by the
/// stand-in tracer in `folder`, the NEFF cache in `cache_root`.
fn flash_settings(folder: &Path, compiler: &Path, cache_root: &Path) -> NeuronSettings {
    NeuronSettings {
        flash_attention: burn_trainium::neuron::FlashAttention::On,
        kernel_tracer: Some(stand_in::tracer(folder)),
        ..settings(compiler, cache_root)
    }
}

/// The kernel requests of the modules under `cache_root`, after checking that no program holds
/// scores of every one of `seq` positions against every other, that the modules pass the lint,
/// and that the module each compiler received holds one SDK call per request.
fn flash_requests(cache_root: &Path, seq: usize) -> Vec<burn_trainium::lower::KernelRequest> {
    use burn_trainium::lower::{KERNEL_REQUEST_TARGET, KernelRequest};
    use burn_trainium::neuron::{NEFF_FILE, NEURON_KERNEL_TARGET};

    // The stand-in compiler's "NEFF" wraps the module it received.
    let instructions = |module: &[u8]| {
        let module = HloModuleProto::decode(module).unwrap();
        assert_eq!(lint_module(&module), []);
        module
            .computations
            .into_iter()
            .flat_map(|computation| computation.instructions)
            .collect::<Vec<_>>()
    };
    let mut requests = Vec::new();
    let mut calls = 0;
    for module_path in cached_modules(cache_root) {
        for instruction in instructions(&std::fs::read(&module_path).unwrap()) {
            if let Some(request) = KernelRequest::of_instruction(&instruction) {
                requests.push(request.unwrap());
            }
            let shape = instruction.shape.as_ref().unwrap();
            let dims = &shape.dimensions;
            assert!(!dims.ends_with(&[seq as i64, seq as i64]), "{dims:?}");
        }
        let neff = std::fs::read(module_path.with_file_name(NEFF_FILE)).unwrap();
        for instruction in instructions(stand_in::module_of_neff(&neff)) {
            assert_ne!(instruction.custom_call_target, KERNEL_REQUEST_TARGET);
            calls += usize::from(instruction.custom_call_target == NEURON_KERNEL_TARGET);
        }
    }
    assert_eq!(calls, requests.len());
    requests
}

/// `hlat-test` made for `seq` positions on `device`, and one row of `seq` token ids.
fn hlat_test_over(
    seq: usize,
    device: &burn::tensor::Device,
) -> (
    HlatConfig,
    hlat::Hlat,
    burn::tensor::Tensor<2, burn::tensor::Int>,
) {
    use burn::tensor::{Int, Tensor, TensorData};

    let mut config = HlatConfig::preset("hlat-test").unwrap();
    config.max_seq_len = seq;
    let model: hlat::Hlat = config.init(device);
    let ids: Vec<i64> = (0..seq as i64).map(|i| i % 64).collect();
    let ids = Tensor::<2, Int>::from_data(TensorData::new(ids, [1, seq]), device);
    (config, model, ids)
}

/// HLAT's forward pass in inference over 1,024 positions, with the SDK's flash kernel on: the
/// layers' attention is a kernel request (Burn's attention module), no program holds scores of
/// every position against every position, and the module the compiler receives holds the
/// tracer's calls.
fn hlat_inference_asks_for_the_flash_kernel(folder: &Path, compiler: &Path) {
    let cache_root = folder.join("flash-cache");
    burn_trainium::neuron::set_settings(Some(flash_settings(folder, compiler, &cache_root)));
    let device = trainium(TrainiumDevice::neuron(30));
    let seq = 1024;
    let (config, model, ids) = hlat_test_over(seq, &device);
    let _ = model.forward(ids).into_data();
    device.sync().unwrap();

    // The layers run programs of one structure: each distinct program is compiled once.
    let requests = flash_requests(&cache_root, seq);
    assert!(!requests.is_empty());
    let heads = config.num_heads as i64;
    let width = config.head_dim() as i64;
    assert_eq!(requests[0].grid, [1, heads]);
    assert_eq!(requests[0].outputs[0].shape, [1, heads, seq as i64, width]);
}

/// A training step of HLAT over 512 positions, with the SDK's flash kernels on: its attention
/// is the fused operation, requested as `flash_fwd` in training (output and statistics) and
/// `flash_attn_bwd`; no program holds every position's scores and the modules pass the lint.
fn hlat_training_asks_for_the_flash_kernels(folder: &Path, compiler: &Path) {
    let cache_root = folder.join("flash-training-cache");
    burn_trainium::neuron::set_settings(Some(flash_settings(folder, compiler, &cache_root)));
    let device = trainium(TrainiumDevice::neuron(31)).autodiff();
    let seq = 512;
    let (config, model, ids) = hlat_test_over(seq, &device);
    let _grads = model.forward(ids).sum().backward();
    device.sync().unwrap();

    let requests = flash_requests(&cache_root, seq);
    let kernels: std::collections::BTreeSet<&str> = requests
        .iter()
        .map(|request| request.kernel.as_str())
        .collect();
    assert_eq!(
        kernels,
        ["flash_attn_bwd", "flash_fwd"].into(),
        "{requests:?}"
    );
    let grid = [1, config.num_kv_heads as i64];
    for request in &requests {
        assert_eq!(request.grid, grid, "{request:?}");
        if request.kernel == "flash_fwd" {
            assert_eq!(request.arguments["training"], serde_json::json!(true));
            assert_eq!(request.outputs.len(), 2);
        }
    }
}
