//! HLAT's whole training step as a CUDA plugin would get it: `TRAINIUM_FUSED_ATTENTION=cudnn`
//! lowers the fused attention as cuDNN's flash kernels on the CPU plugin too, which cannot
//! compile them, so the run stops at its step's program with the modules dumped
//! (`TRAINIUM_DUMP_DIR`) for reading.

use burn_trainium::hlo::{HloInstructionProto, HloModuleProto, PrimitiveType};

use super::require_plugin;

/// The cuDNN kernels' custom-call targets, forward and backward.
const CUDNN_TARGETS: [&str; 2] = ["__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward"];

/// The positions of the step's rows (not hlat-tiny's half head of 16, which RoPE's halves have).
const POSITIONS: i64 = 8;

/// hlat-tiny's vocabulary (its hidden size is 128 and its MLP's 352).
const VOCABULARY: i64 = 512;

/// hlat-tiny's layers.
const LAYERS: usize = 4;

#[test]
fn hlat_training_step_lowered_for_cuda_calls_cudnn_in_every_layer_and_holds_no_score_matrix() {
    require_plugin();
    let folder = tempfile::tempdir().unwrap();
    let dump = folder.path().join("modules");
    let output = super::hlat()
        .args(["pretrain", "--preset", "hlat-tiny", "--device", "xla:0"])
        .args(["--precision", "bf16-mixed", "--max-steps", "1"])
        .args(["--out", folder.path().join("run").to_str().unwrap()])
        .args(super::step_flags("8", "32", "4"))
        .args(["--eval-every", "0", "--no-progress"])
        .env("TRAINIUM_FUSED_ATTENTION", "cudnn")
        // The whole step in one program, as on an accelerator (the CPU plugin's cut of small
        // tensors left out).
        .env(burn_trainium::SEGMENT_CAP_ENV, "65536")
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
    // hlat-tiny's layers each attend once forward and once backward, all in the step's program.
    for target in CUDNN_TARGETS {
        assert_eq!(calls(steps[0], target), LAYERS, "{target}");
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

    // The logits' product runs in bf16 (the cross-entropy upcasts its result): the products of
    // the step whose result ends in the vocabulary (the output projection forward and its
    // weight's gradient) take bf16 operands.
    let by_id: std::collections::HashMap<i64, &HloInstructionProto> = instructions(steps[0])
        .map(|instruction| (instruction.id, instruction))
        .collect();
    let element_type = |id: &i64| by_id[id].shape.as_ref().unwrap().element_type;
    let products: Vec<&HloInstructionProto> = instructions(steps[0])
        .filter(|instruction| instruction.opcode == "dot")
        .filter(|instruction| {
            instruction
                .shape
                .as_ref()
                .is_some_and(|shape| shape.dimensions.last() == Some(&VOCABULARY))
        })
        .collect();
    assert_eq!(products.len(), 2, "{products:?}");
    for product in products {
        let operands: Vec<i32> = product.operand_ids.iter().map(element_type).collect();
        assert_eq!(
            operands,
            [PrimitiveType::Bf16 as i32; 2],
            "the product {} of shape {:?}",
            product.name,
            product.shape
        );
    }
}

/// Every instruction of `module`, in every computation.
fn instructions(module: &HloModuleProto) -> impl Iterator<Item = &HloInstructionProto> {
    module
        .computations
        .iter()
        .flat_map(|computation| &computation.instructions)
}
