//! The compiler's casting follows the module's precision. By default `neuronx-cc` casts FP32
//! matrix multiplications to BF16 (`--auto-cast matmult`), so a program written in f32 would not
//! compute in f32. A module with an f32 (or f64) matrix multiplication is therefore compiled with
//! `--auto-cast none`; a module whose matrix multiplications are all BF16 or FP16 has nothing to
//! cast and keeps the compiler's default. Flags that already choose a cast (any `--auto-cast…`
//! word in `NEURON_CC_FLAGS`) are the user's decision and are left alone.

use crate::hlo::{HloModuleProto, PrimitiveType};

/// The prefix of the compiler's casting flags (`--auto-cast`, `--auto-cast-type`).
pub const AUTO_CAST_PREFIX: &str = "--auto-cast";

/// The flags added to a module that holds full-precision matrix multiplications.
pub const FULL_PRECISION_FLAGS: [&str; 2] = ["--auto-cast", "none"];

/// Whether `module` multiplies f32 or f64 matrices (a `dot` or `convolution` of that type).
pub fn has_full_precision_matmul(module: &HloModuleProto) -> bool {
    let wide = [PrimitiveType::F32 as i32, PrimitiveType::F64 as i32];
    module
        .computations
        .iter()
        .flat_map(|computation| &computation.instructions)
        .filter(|instruction| matches!(instruction.opcode.as_str(), "dot" | "convolution"))
        .filter_map(|instruction| instruction.shape.as_ref())
        .any(|shape| wide.contains(&shape.element_type))
}

/// The flags `module` is compiled with: `configured`, plus `--auto-cast none` when the module
/// multiplies f32 matrices and `configured` chooses no cast itself.
pub fn flags_for_module(configured: &[String], module: &HloModuleProto) -> Vec<String> {
    let mut flags = configured.to_vec();
    let user_chose = configured
        .iter()
        .any(|flag| flag.starts_with(AUTO_CAST_PREFIX));
    if !user_chose && has_full_precision_matmul(module) {
        flags.extend(FULL_PRECISION_FLAGS.map(String::from));
    }
    flags
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hlo::{HloComputationProto, HloInstructionProto, ShapeProto};

    fn module_with(opcode: &str, element_type: PrimitiveType) -> HloModuleProto {
        let instruction = HloInstructionProto {
            name: "product".into(),
            opcode: opcode.into(),
            shape: Some(ShapeProto {
                element_type: element_type as i32,
                dimensions: vec![2, 2],
                ..Default::default()
            }),
            ..Default::default()
        };
        HloModuleProto {
            computations: vec![HloComputationProto {
                instructions: vec![instruction],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn words(flags: &[&str]) -> Vec<String> {
        flags.iter().map(|flag| flag.to_string()).collect()
    }

    #[test]
    fn f32_matmuls_are_compiled_without_casting() {
        let configured = words(&["--model-type", "transformer"]);
        for opcode in ["dot", "convolution"] {
            assert_eq!(
                flags_for_module(&configured, &module_with(opcode, PrimitiveType::F32)),
                words(&["--model-type", "transformer", "--auto-cast", "none"]),
                "{opcode}"
            );
        }
    }

    #[test]
    fn bf16_matmuls_and_other_f32_work_keep_the_default() {
        let configured = words(&["--model-type", "transformer"]);
        for module in [
            module_with("dot", PrimitiveType::Bf16),
            module_with("dot", PrimitiveType::F16),
            module_with("add", PrimitiveType::F32),
        ] {
            assert_eq!(flags_for_module(&configured, &module), configured);
        }
    }

    #[test]
    fn a_cast_chosen_in_the_flags_wins() {
        let module = module_with("dot", PrimitiveType::F32);
        for configured in [
            words(&["--auto-cast", "matmult"]),
            words(&["--auto-cast=all", "--auto-cast-type", "fp8_e4m3"]),
            words(&["--auto-cast-type", "fp16"]),
        ] {
            assert_eq!(flags_for_module(&configured, &module), configured);
        }
    }
}
