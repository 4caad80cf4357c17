//! NEFF tensor names requested in the HLO module, as torch-neuronx does: the frontend attribute
//! `neff_input_names="input<N>"` on parameter N of the entry computation and
//! `neff_output_names="output0,output1,..."` on its root tuple. `neuronx-cc` names the NEFF's
//! tensors after them, which is the rule [`super::bind`] relies on.

use crate::hlo::{FrontendAttributes, HloModuleProto};

/// The attribute naming a NEFF input.
pub const INPUT_NAMES_ATTRIBUTE: &str = "neff_input_names";
/// The attribute naming the NEFF outputs.
pub const OUTPUT_NAMES_ATTRIBUTE: &str = "neff_output_names";

fn single_attribute(key: &str, value: String) -> FrontendAttributes {
    FrontendAttributes {
        map: [(key.to_string(), value)].into(),
    }
}

/// Requests the NEFF tensor names on the entry computation of `module`, whose root must be a
/// tuple (the lowering always returns one).
pub fn request_neff_names(module: &mut HloModuleProto) -> Result<(), String> {
    let entry_id = module.entry_computation_id;
    let entry = module
        .computations
        .iter_mut()
        .find(|computation| computation.id == entry_id)
        .ok_or("the module has no entry computation")?;
    let root_id = entry.root_id;
    let outputs = entry
        .instructions
        .iter()
        .find(|instruction| instruction.id == root_id)
        .filter(|root| root.opcode == "tuple")
        .map(|root| root.operand_ids.len())
        .ok_or("the entry computation does not return a tuple")?;
    for instruction in &mut entry.instructions {
        if instruction.opcode == "parameter" {
            instruction.frontend_attributes = Some(single_attribute(
                INPUT_NAMES_ATTRIBUTE,
                format!("input{}", instruction.parameter_number),
            ));
        } else if instruction.id == root_id {
            let names: Vec<String> = (0..outputs).map(|index| format!("output{index}")).collect();
            instruction.frontend_attributes =
                Some(single_attribute(OUTPUT_NAMES_ATTRIBUTE, names.join(",")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hlo::{HloComputationProto, HloInstructionProto};

    fn instruction(
        id: i64,
        opcode: &str,
        parameter_number: i64,
        operands: &[i64],
    ) -> HloInstructionProto {
        HloInstructionProto {
            name: format!("{opcode}.{id}"),
            opcode: opcode.to_string(),
            id,
            parameter_number,
            operand_ids: operands.to_vec(),
            ..Default::default()
        }
    }

    fn module() -> HloModuleProto {
        let reduction = HloComputationProto {
            name: "add".into(),
            instructions: vec![
                instruction(1, "parameter", 0, &[]),
                instruction(2, "parameter", 1, &[]),
            ],
            id: 7,
            root_id: 2,
            ..Default::default()
        };
        let entry = HloComputationProto {
            name: "main".into(),
            instructions: vec![
                instruction(10, "parameter", 1, &[]),
                instruction(11, "parameter", 0, &[]),
                instruction(12, "add", 0, &[10, 11]),
                instruction(13, "tuple", 0, &[12, 10]),
            ],
            id: 8,
            root_id: 13,
            ..Default::default()
        };
        HloModuleProto {
            name: "segment".into(),
            entry_computation_name: "main".into(),
            computations: vec![reduction, entry],
            entry_computation_id: 8,
            ..Default::default()
        }
    }

    #[test]
    fn entry_parameters_and_root_are_named_and_nothing_else_changes() {
        let original = module();
        let mut named = original.clone();
        request_neff_names(&mut named).unwrap();
        let attribute = |computation: usize, index: usize| {
            named.computations[computation].instructions[index]
                .frontend_attributes
                .as_ref()
                .map(|attributes| attributes.map.clone())
        };
        let pair = |key: &str, value: &str| Some([(key.to_string(), value.to_string())].into());
        assert_eq!(
            attribute(0, 0),
            None,
            "parameters of other computations are not inputs"
        );
        assert_eq!(attribute(1, 0), pair("neff_input_names", "input1"));
        assert_eq!(attribute(1, 1), pair("neff_input_names", "input0"));
        assert_eq!(attribute(1, 2), None);
        assert_eq!(
            attribute(1, 3),
            pair("neff_output_names", "output0,output1")
        );
        // Only the attributes differ.
        for computation in &mut named.computations {
            for instruction in &mut computation.instructions {
                instruction.frontend_attributes = None;
            }
        }
        assert_eq!(named, original);
    }

    #[test]
    fn modules_without_a_tuple_result_are_refused() {
        let mut module = module();
        module.computations[1].root_id = 12;
        let error = request_neff_names(&mut module).unwrap_err();
        assert!(error.contains("tuple"), "{error}");
    }
}
