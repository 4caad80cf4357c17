//! The `neuron` executor in compile-only mode, on this machine (no Neuron runtime): segments are
//! lowered, compiled by the stand-in compiler of `neuron_support` into the NEFF cache, and not
//! run. Checks the wiring of lowering, cache and statistics, and that a second executor (another
//! process in real use) finds the programs in the cache. A replicated device compiles its
//! collectives into the module `neuronx-cc` receives. The devices are served in the process
//! (`burn_trainium::device`).

use burn::tensor::{DType, Device, Tensor, TensorData};
use burn_trainium::collective::{self, ReduceOp, ReplicaGroups, SourceTargetPairs};
use burn_trainium::hlo::{HloInstructionProto, HloModuleProto};
use burn_trainium::neuron::{INPUT_NAMES_ATTRIBUTE, OUTPUT_NAMES_ATTRIBUTE};
use burn_trainium::{TrainiumDevice, check_device, stats};
use prost::Message;

use super::neuron_support::{
    Workspace, cached_modules, stand_in_settings, use_stand_in_for_the_executor,
    use_stand_ins_with_flash_attention,
};

/// The Burn device serving `device` in the process.
fn served(device: &TrainiumDevice) -> Device {
    burn_trainium::device(&device.to_string()).expect("the device is served")
}

fn small_program(device: &TrainiumDevice) -> TensorData {
    let device = &served(device);
    let a = Tensor::<2>::from_data(TensorData::new(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]), device);
    let b = Tensor::<2>::from_data(
        TensorData::new(vec![0.5f32, -1.0, 0.25, 2.0], [2, 2]),
        device,
    );
    (a.matmul(b).exp() + 1.0).into_data()
}

/// The `neuron` settings are the process's: the tests of this file, the only ones of this binary
/// that open `neuron` devices, take turns.
fn exclusive_neuron_settings() -> std::sync::MutexGuard<'static, ()> {
    static SETTINGS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SETTINGS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[test]
fn compile_only_mode_fills_the_cache_and_reuses_it() {
    let _settings = exclusive_neuron_settings();
    let workspace = Workspace::new("compile-only");
    use_stand_in_for_the_executor(&workspace);
    let device = TrainiumDevice::neuron(0);
    check_device(&device).unwrap();

    let result = small_program(&device);
    // Nothing runs in compile-only mode: results read as zeros of the right shape and type.
    assert_eq!(result, TensorData::new(vec![0.0f32; 4], [2, 2]));
    let first = stats(&device);
    assert!(first.compiles >= 1, "{first:?}");
    assert_eq!(workspace.invocations() as u64, first.compiles);
    let modules = cached_modules(&workspace.cache_root());
    assert_eq!(modules.len() as u64, first.compiles);
    for module in &modules {
        assert!(
            module.with_file_name("model.neff").is_file(),
            "{}",
            module.display()
        );
    }
    // An f32 matrix product: the compiler is told not to cast it to bf16.
    assert_eq!(
        workspace.last_arguments(),
        "--framework XLA --target trn1 --model-type transformer --auto-cast none --output model.neff"
    );

    // The same program again: found in memory, no compile.
    small_program(&device);
    let second = stats(&device);
    assert_eq!(second.compiles, first.compiles);
    assert!(second.cache_hits > first.cache_hits, "{second:?}");

    // A new executor (as in a new process) finds every program in the cache on disk.
    let other = TrainiumDevice::neuron(1);
    small_program(&other);
    let other_stats = stats(&other);
    assert_eq!(other_stats.compiles, 0, "{other_stats:?}");
    assert_eq!(other_stats.cache_hits, first.compiles);
    assert_eq!(workspace.invocations() as u64, first.compiles);

    bf16_products_keep_the_compilers_default_cast(&workspace);
    attention_runs_as_the_sdk_flash_kernel(&workspace);
    flash_attention_on_needs_a_working_tracer(&workspace);
}

/// Causal bf16 attention over 1,024 positions on `device`, read back.
fn long_attention(device: &TrainiumDevice) -> Result<TensorData, String> {
    use burn::tensor::module::attention;
    use burn::tensor::ops::AttentionModuleOptions;

    let device = &served(device);
    let input = || Tensor::<4>::ones([1, 2, 1024, 64], device).cast(DType::BF16);
    let causal = AttentionModuleOptions {
        scale: None,
        softcap: None,
        is_causal: true,
    };
    attention(input(), input(), input(), None, None, causal)
        .try_into_data()
        .map_err(|error| format!("{error:?}"))
}

/// A tracer that cannot run: with `HLAT_NEURON_FLASH_ATTENTION=on` the device does not open,
/// and the error names the tracer and the setting; with `auto` the device opens and attention is
/// lowered with HLO operations. A tracer that passes the probe and fails on a request fails the
/// program's compile with what it said.
fn flash_attention_on_needs_a_working_tracer(workspace: &Workspace) {
    use burn_trainium::lower::KERNEL_REQUEST_TARGET;
    use burn_trainium::neuron::{FlashAttention, KERNEL_TRACER_ENV, NeuronSettings};

    let missing = NeuronSettings {
        kernel_tracer: Some("/nonexistent/kernel-tracer".into()),
        lint: Default::default(),
        ..stand_in_settings(workspace, FlashAttention::On)
    };
    burn_trainium::neuron::set_settings(Some(missing.clone()));
    let message = check_device(&TrainiumDevice::neuron(5))
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("/nonexistent/kernel-tracer") && message.contains(KERNEL_TRACER_ENV),
        "{message}"
    );
    // Serving it is the same error.
    let message = burn_trainium::device("neuron:5").unwrap_err().to_string();
    assert!(
        message.contains("/nonexistent/kernel-tracer") && message.contains(KERNEL_TRACER_ENV),
        "{message}"
    );

    burn_trainium::neuron::set_settings(Some(NeuronSettings {
        flash_attention: FlashAttention::Auto,
        ..missing
    }));
    let before = cached_modules(&workspace.cache_root());
    long_attention(&TrainiumDevice::neuron(6)).unwrap();
    let new_modules: Vec<_> = cached_modules(&workspace.cache_root())
        .into_iter()
        .filter(|path| !before.contains(path))
        .collect();
    assert!(!new_modules.is_empty());
    for path in new_modules {
        let module = HloModuleProto::decode(std::fs::read(&path).unwrap().as_slice()).unwrap();
        assert!(
            instructions(&module)
                .iter()
                .all(|instruction| instruction.custom_call_target != KERNEL_REQUEST_TARGET)
        );
    }

    let refusing = workspace.write_tracer(
        "refusing-tracer",
        "#!/bin/sh\n[ \"$1\" = --probe ] && exit 0\necho 'no flash kernel for this shape' >&2\nexit 1\n",
    );
    burn_trainium::neuron::set_settings(Some(NeuronSettings {
        kernel_tracer: Some(refusing.clone()),
        lint: Default::default(),
        ..stand_in_settings(workspace, FlashAttention::On)
    }));
    let message = long_attention(&TrainiumDevice::neuron(7)).unwrap_err();
    assert!(
        message.contains("no flash kernel for this shape")
            && message.contains(refusing.to_str().unwrap()),
        "{message}"
    );
}

/// The instructions of every computation of `module`.
fn instructions(module: &HloModuleProto) -> Vec<&burn_trainium::hlo::HloInstructionProto> {
    module
        .computations
        .iter()
        .flat_map(|computation| &computation.instructions)
        .collect()
}

/// Burn's attention module with the SDK's flash kernel on: the cached module holds one kernel
/// request per call and no product of queries and keys; the stand-in compiler receives the
/// tracer's calls in their place; two calls of one shape are traced once.
fn attention_runs_as_the_sdk_flash_kernel(workspace: &Workspace) {
    use burn::tensor::Distribution;
    use burn::tensor::module::attention;
    use burn::tensor::ops::AttentionModuleOptions;
    use burn_trainium::lower::{KERNEL_REQUEST_TARGET, KernelRequest};
    use burn_trainium::neuron::{NEFF_FILE, NEURON_KERNEL_TARGET};

    use_stand_ins_with_flash_attention(workspace);
    let device = served(&TrainiumDevice::neuron(4));
    let before = cached_modules(&workspace.cache_root());
    let random = |seed| {
        Tensor::<4>::random([2, 3, 1024, 64], Distribution::Default, &device)
            .cast(DType::BF16)
            .add_scalar(seed as f32)
    };
    let [query, key, value] = [random(0), random(1), random(2)];
    let causal = AttentionModuleOptions {
        scale: None,
        softcap: None,
        is_causal: true,
    };
    let first = attention(
        query.clone(),
        key.clone(),
        value.clone(),
        None,
        None,
        causal,
    );
    let second = attention(query * 2.0, key, value, None, None, causal);
    // Compile-only: the program is compiled, not run; the result reads as zeros.
    let result = (first + second).into_data();
    assert_eq!(result.shape().to_vec(), [2, 3, 1024, 64]);

    let new_modules: Vec<_> = cached_modules(&workspace.cache_root())
        .into_iter()
        .filter(|module| !before.contains(module))
        .collect();
    let decode = |path: &std::path::Path| {
        HloModuleProto::decode(std::fs::read(path).unwrap().as_slice()).unwrap()
    };
    let requested = new_modules
        .iter()
        .map(|path| decode(path))
        .find(|module| {
            instructions(module)
                .iter()
                .any(|instruction| instruction.custom_call_target == KERNEL_REQUEST_TARGET)
        })
        .expect("a module with kernel requests");
    let requests: Vec<KernelRequest> = instructions(&requested)
        .iter()
        .filter_map(|instruction| KernelRequest::of_instruction(instruction))
        .map(Result::unwrap)
        .collect();
    assert_eq!(requests.len(), 2);
    let request = &requests[0];
    assert_eq!(request.kernel, "flash_fwd");
    assert_eq!(request.grid, [2, 3]);
    let shapes: Vec<_> = request
        .inputs
        .iter()
        .map(|input| &input.shape[..])
        .collect();
    assert_eq!(
        shapes,
        [&[2, 3, 64, 1024][..], &[2, 3, 64, 1024], &[2, 3, 1024, 64]]
    );
    assert_eq!(request.outputs[0].shape, [2, 3, 1024, 64]);
    assert_eq!(request.outputs[0].dtype, "bfloat16");
    assert_eq!(request.arguments["softmax_scale"], 0.125);
    assert_eq!(request.arguments["use_causal_mask"], true);
    assert_eq!(request.arguments["mixed_precision"], true);
    assert_eq!(request.arguments["seq_tile_size"], 1024);
    // No [1024 x 1024] scores: the queries meet the keys only inside the kernel.
    assert!(
        instructions(&requested)
            .iter()
            .all(|instruction| instruction.opcode != "dot"),
        "{}",
        burn_trainium::hlo::module_to_text(&requested)
    );

    // What the compiler received (the stand-in's "NEFF" wraps it): the SDK's calls instead.
    let neff_path = new_modules
        .iter()
        .find(|path| decode(path) == requested)
        .unwrap()
        .with_file_name(NEFF_FILE);
    let neff = std::fs::read(neff_path).unwrap();
    let compiled = HloModuleProto::decode(test_support::stand_in::module_of_neff(&neff)).unwrap();
    let calls: Vec<_> = instructions(&compiled)
        .into_iter()
        .filter(|instruction| instruction.opcode == "custom-call")
        .collect();
    assert_eq!(calls.len(), 2);
    for call in calls {
        assert_eq!(call.custom_call_target, NEURON_KERNEL_TARGET);
        assert_eq!(call.backend_config, b"stand-in-config:flash_fwd");
    }
    // One trace for the two calls of one shape, for the configured target.
    let traced = workspace.traced_requests();
    assert_eq!(traced.len(), 1, "{traced:?}");
    assert_eq!(
        traced[0]["arguments"],
        serde_json::json!(["--target", "trn1"])
    );
    assert_eq!(
        serde_json::from_value::<KernelRequest>(traced[0]["request"].clone()).unwrap(),
        *request
    );
}

/// A bf16 matrix product has nothing for `--auto-cast` to cast: the configured flags alone.
fn bf16_products_keep_the_compilers_default_cast(workspace: &Workspace) {
    let device = served(&TrainiumDevice::neuron(3));
    let a = Tensor::<2>::from_data(
        TensorData::new(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]),
        &device,
    )
    .cast(DType::BF16);
    let _ = a.clone().matmul(a).into_data();
    assert_eq!(
        workspace.last_arguments(),
        "--framework XLA --target trn1 --model-type transformer --output model.neff"
    );
}

/// The instructions of the one module compiled into the cache since `before` was listed.
fn new_module_instructions(
    workspace: &Workspace,
    before: &[std::path::PathBuf],
) -> Vec<HloInstructionProto> {
    let new_modules: Vec<_> = cached_modules(&workspace.cache_root())
        .into_iter()
        .filter(|module| !before.contains(module))
        .collect();
    assert_eq!(new_modules.len(), 1, "{new_modules:?}");
    let module =
        HloModuleProto::decode(std::fs::read(&new_modules[0]).unwrap().as_slice()).unwrap();
    module
        .computations
        .into_iter()
        .flat_map(|computation| computation.instructions)
        .collect()
}

/// The collective programs of a replicated device, as `neuronx-cc` receives them: an
/// `all-reduce` over the replica groups with a channel id, and the NEFF tensor names requested;
/// then a pipeline step, a `collective-permute` to the next replica (which the lint accepts).
#[test]
fn a_replicated_device_compiles_its_collectives() {
    let _settings = exclusive_neuron_settings();
    let workspace = Workspace::new("compile-only-replicas");
    use_stand_in_for_the_executor(&workspace);
    std::fs::create_dir_all(workspace.cache_root()).unwrap();
    let trainium = TrainiumDevice::neuron(2).with_replicas(2);
    let device = served(&trainium);
    assert_eq!(collective::replica_count(&device), 2, "{trainium}");
    let per_replica = || {
        vec![
            TensorData::new(vec![1.0f32, 2.0], [2]),
            TensorData::new(vec![3.0f32, 4.0], [2]),
        ]
    };
    let before = cached_modules(&workspace.cache_root());
    let x: Tensor<1> = collective::from_replicas(per_replica(), &device);
    let summed = collective::all_reduce(x * 2.0, ReduceOp::Sum, &ReplicaGroups::all(2));
    assert_eq!(collective::into_replicas(summed).unwrap().len(), 2);
    let device_stats = stats(&trainium);
    assert_eq!(device_stats.collectives, 1, "{device_stats:?}");
    let instructions = new_module_instructions(&workspace, &before);
    let all_reduce = instructions
        .iter()
        .find(|instruction| instruction.opcode == "all-reduce")
        .expect("an all-reduce in the module");
    assert!(all_reduce.channel_id > 0 && all_reduce.use_global_device_ids);
    assert_eq!(all_reduce.replica_groups.len(), 1);
    assert_eq!(all_reduce.replica_groups[0].replica_ids, [0, 1]);
    let named = |key: &str| {
        instructions.iter().any(|instruction| {
            instruction
                .frontend_attributes
                .as_ref()
                .is_some_and(|attributes| attributes.map.contains_key(key))
        })
    };
    assert!(named(INPUT_NAMES_ATTRIBUTE) && named(OUTPUT_NAMES_ATTRIBUTE));

    let before = cached_modules(&workspace.cache_root());
    let x: Tensor<1> = collective::from_replicas(per_replica(), &device);
    let stages = SourceTargetPairs::shift(&ReplicaGroups::all(2), 1, false);
    let passed = collective::permute(x * 2.0, &stages);
    assert_eq!(collective::into_replicas(passed).unwrap().len(), 2);
    let device_stats = stats(&trainium);
    assert_eq!(device_stats.collectives, 2, "{device_stats:?}");
    let instructions = new_module_instructions(&workspace, &before);
    let permute = instructions
        .iter()
        .find(|instruction| instruction.opcode == "collective-permute")
        .expect("a collective-permute in the module");
    assert_eq!(permute.source_target_pairs.len(), 1);
    let pair = &permute.source_target_pairs[0];
    assert_eq!((pair.source, pair.target, permute.channel_id), (0, 1, 0));
}
