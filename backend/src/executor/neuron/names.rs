//! NEFF tensor names requested in the HLO module, as torch-neuronx does: the frontend attribute
//! `neff_input_names="input<N>"` on parameter N of the entry computation and
//! `neff_output_names="output0,output1,..."` on its root tuple. `neuronx-cc` names the NEFF's
//! tensors after them, which is the rule [`super::bind`] relies on.
//!
//! `HloInstructionProto.frontend_attributes` (field 68, an `xla.FrontendAttributes` holding
//! `map<string, string> map = 1`) is not among the fields of the shared HLO messages, so the
//! attribute is appended to the serialized instructions: protobuf allows fields in any order, and
//! every other byte of the module is kept as the lowering wrote it.

use prost::Message;

use crate::hlo::{HloComputationProto, HloInstructionProto, HloModuleProto};

const MODULE_COMPUTATIONS: u32 = 3;
const COMPUTATION_INSTRUCTIONS: u32 = 2;
const INSTRUCTION_FRONTEND_ATTRIBUTES: u32 = 68;
const LENGTH_DELIMITED: u64 = 2;

/// One field of a serialized message: its tag, its whole encoding, and its payload when it is
/// length-delimited.
struct Field<'a> {
    tag: u32,
    raw: &'a [u8],
    payload: Option<&'a [u8]>,
}

fn read_varint(bytes: &[u8], position: &mut usize) -> Result<u64, String> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*position).ok_or("truncated varint")?;
        *position += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("varint longer than 10 bytes".into())
}

fn fields(bytes: &[u8]) -> Result<Vec<Field<'_>>, String> {
    let mut fields = Vec::new();
    let mut position = 0;
    while position < bytes.len() {
        let start = position;
        let key = read_varint(bytes, &mut position)?;
        let mut payload = None;
        match key & 7 {
            0 => {
                read_varint(bytes, &mut position)?;
            }
            1 => position += 8,
            5 => position += 4,
            LENGTH_DELIMITED => {
                let length = read_varint(bytes, &mut position)? as usize;
                let end = position
                    .checked_add(length)
                    .filter(|&end| end <= bytes.len());
                let end = end.ok_or("length-delimited field past the end")?;
                payload = Some(&bytes[position..end]);
                position = end;
            }
            other => return Err(format!("unsupported wire type {other}")),
        }
        if position > bytes.len() {
            return Err("field past the end".into());
        }
        fields.push(Field {
            tag: (key >> 3) as u32,
            raw: &bytes[start..position],
            payload,
        });
    }
    Ok(fields)
}

fn write_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn write_bytes_field(out: &mut Vec<u8>, tag: u32, bytes: &[u8]) {
    write_varint(out, (u64::from(tag) << 3) | LENGTH_DELIMITED);
    write_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// An `xla.FrontendAttributes` holding the single entry `key = value`.
fn frontend_attributes(key: &str, value: &str) -> Vec<u8> {
    let mut entry = Vec::new();
    write_bytes_field(&mut entry, 1, key.as_bytes());
    write_bytes_field(&mut entry, 2, value.as_bytes());
    let mut attributes = Vec::new();
    write_bytes_field(&mut attributes, 1, &entry);
    attributes
}

/// The entry computation with `neff_*_names` on its parameters and root tuple.
fn name_entry(computation: &[u8], root_id: i64, outputs: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(computation.len() + 64);
    for field in fields(computation)? {
        let Some(payload) = field
            .payload
            .filter(|_| field.tag == COMPUTATION_INSTRUCTIONS)
        else {
            out.extend_from_slice(field.raw);
            continue;
        };
        let instruction =
            HloInstructionProto::decode(payload).map_err(|error| error.to_string())?;
        let attribute = if instruction.opcode == "parameter" {
            Some((
                "neff_input_names",
                format!("input{}", instruction.parameter_number),
            ))
        } else if instruction.id == root_id {
            let names: Vec<String> = (0..outputs).map(|index| format!("output{index}")).collect();
            Some(("neff_output_names", names.join(",")))
        } else {
            None
        };
        match attribute {
            None => out.extend_from_slice(field.raw),
            Some((key, value)) => {
                let mut named = payload.to_vec();
                write_bytes_field(
                    &mut named,
                    INSTRUCTION_FRONTEND_ATTRIBUTES,
                    &frontend_attributes(key, &value),
                );
                write_bytes_field(&mut out, COMPUTATION_INSTRUCTIONS, &named);
            }
        }
    }
    Ok(out)
}

/// `module` (a serialized `HloModuleProto` whose entry computation returns a tuple) with the NEFF
/// tensor names requested on its entry computation.
pub fn request_neff_names(module: &[u8]) -> Result<Vec<u8>, String> {
    let decoded =
        HloModuleProto::decode(module).map_err(|error| format!("not an HLO module: {error}"))?;
    let entry = decoded
        .computations
        .iter()
        .find(|computation| computation.id == decoded.entry_computation_id)
        .ok_or("the module has no entry computation")?;
    let root = entry
        .instructions
        .iter()
        .find(|instruction| instruction.id == entry.root_id);
    let outputs = match root {
        Some(root) if root.opcode == "tuple" => root.operand_ids.len(),
        _ => return Err("the entry computation does not return a tuple".into()),
    };
    let mut out = Vec::with_capacity(module.len() + 64 * entry.instructions.len());
    for field in fields(module)? {
        let entry_payload = field.payload.filter(|payload| {
            field.tag == MODULE_COMPUTATIONS
                && HloComputationProto::decode(*payload)
                    .is_ok_and(|computation| computation.id == entry.id)
        });
        match entry_payload {
            Some(payload) => write_bytes_field(
                &mut out,
                MODULE_COMPUTATIONS,
                &name_entry(payload, entry.root_id, outputs)?,
            ),
            None => out.extend_from_slice(field.raw),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// The fields of the XLA messages this test reads back, including the frontend attributes.
    #[derive(Clone, PartialEq, prost::Message)]
    struct Attributes {
        #[prost(map = "string, string", tag = "1")]
        map: HashMap<String, String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct Instruction {
        #[prost(string, tag = "2")]
        opcode: String,
        #[prost(message, optional, tag = "68")]
        frontend_attributes: Option<Attributes>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct Computation {
        #[prost(message, repeated, tag = "2")]
        instructions: Vec<Instruction>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct Module {
        #[prost(message, repeated, tag = "3")]
        computations: Vec<Computation>,
    }

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
        let named = request_neff_names(&original.encode_to_vec()).unwrap();
        // Read through the shared messages, the module is unchanged.
        assert_eq!(HloModuleProto::decode(named.as_slice()).unwrap(), original);

        let read = Module::decode(named.as_slice()).unwrap();
        let attribute = |computation: usize, index: usize| {
            read.computations[computation].instructions[index]
                .frontend_attributes
                .as_ref()
                .map(|attributes| attributes.map.clone())
        };
        let pair =
            |key: &str, value: &str| Some(HashMap::from([(key.to_string(), value.to_string())]));
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
    }

    #[test]
    fn modules_without_a_tuple_result_are_refused() {
        let mut module = module();
        module.computations[1].root_id = 12;
        let error = request_neff_names(&module.encode_to_vec()).unwrap_err();
        assert!(error.contains("tuple"), "{error}");
        assert!(request_neff_names(b"\xff\xff").is_err());
    }
}
