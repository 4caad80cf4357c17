//! HLAT's whole training step as a CUDA plugin would get it: `TRAINIUM_FUSED_ATTENTION=cudnn`
//! lowers the fused attention as cuDNN's flash kernels on the CPU plugin too, which cannot
//! compile them, so the run stops at its step's program with the modules dumped
//! (`TRAINIUM_DUMP_DIR`) for reading.

use burn_trainium::hlo::{HloInstructionProto, HloModuleProto};

use super::require_plugin;

/// The cuDNN kernels' custom-call targets, forward and backward.
const CUDNN_TARGETS: [&str; 2] = ["__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward"];

/// The positions of the step's rows ([`super::short_steps`]).
const POSITIONS: i64 = 16;

#[test]
fn hlat_training_step_lowered_for_cuda_calls_cudnn_in_every_layer_and_holds_no_score_matrix() {
    require_plugin();
    let folder = tempfile::tempdir().unwrap();
    let dump = folder.path().join("modules");
    let output = super::hlat()
        .args(["pretrain", "--preset", "hlat-test", "--device", "xla:0"])
        .args(["--precision", "bf16-mixed", "--max-steps", "1"])
        .args(["--out", folder.path().join("run").to_str().unwrap()])
        .args(super::short_steps())
        .env("TRAINIUM_FUSED_ATTENTION", "cudnn")
        .env(burn_trainium::lower::DUMP_DIR_ENV, &dump)
        .env(burn_trainium::XLA_CACHE_ENV, "off")
        .output()
        .expect("running hlat");
    let stderr = String::from_utf8_lossy(&output.stderr);
    // The CPU plugin has no cuDNN: the step's program does not compile, and the run says so.
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("__cudnn$fmhaSoftmax"), "{stderr}");

    let modules = super::dumped_modules(&dump);
    let calls = |module: &HloModuleProto, target: &str| {
        instructions(module)
            .filter(|instruction| instruction.custom_call_target == target)
            .count()
    };
    // The parameters' initialisation compiles; the step's program, the next, does not.
    let steps: Vec<&HloModuleProto> = modules
        .iter()
        .filter(|module| calls(module, CUDNN_TARGETS[0]) > 0)
        .collect();
    assert_eq!(steps.len(), 1, "{} modules", modules.len());
    // hlat-test's 2 layers each attend once forward and once backward, all in the step's program.
    for target in CUDNN_TARGETS {
        assert_eq!(calls(steps[0], target), 2, "{target}");
    }
    // No instruction holds a [batch, heads, .., T, T] block of scores (the blocked form's, one
    // block at these positions): cuDNN computes them in its kernel.
    let scores: Vec<_> = modules
        .iter()
        .flat_map(instructions)
        .filter_map(|instruction| instruction.shape.as_ref())
        .filter(|shape| {
            shape.dimensions.len() >= 4 && shape.dimensions.ends_with(&[POSITIONS, POSITIONS])
        })
        .collect();
    assert!(scores.is_empty(), "{scores:?}");
}

/// Every instruction of `module`, in every computation.
fn instructions(module: &HloModuleProto) -> impl Iterator<Item = &HloInstructionProto> {
    module
        .computations
        .iter()
        .flat_map(|computation| &computation.instructions)
}
