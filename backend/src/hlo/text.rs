//! A readable text form of an `HloModuleProto`, close to XLA's HLO text, for dumps and logs.

use std::collections::HashMap;
use std::fmt::Write;

use super::{HloInstructionProto, HloModuleProto, PrimitiveType, ShapeProto};

fn type_name(element_type: i32) -> &'static str {
    match PrimitiveType::try_from(element_type) {
        Ok(PrimitiveType::Pred) => "pred",
        Ok(PrimitiveType::S8) => "s8",
        Ok(PrimitiveType::S16) => "s16",
        Ok(PrimitiveType::S32) => "s32",
        Ok(PrimitiveType::S64) => "s64",
        Ok(PrimitiveType::U8) => "u8",
        Ok(PrimitiveType::U16) => "u16",
        Ok(PrimitiveType::U32) => "u32",
        Ok(PrimitiveType::U64) => "u64",
        Ok(PrimitiveType::F16) => "f16",
        Ok(PrimitiveType::F32) => "f32",
        Ok(PrimitiveType::F64) => "f64",
        Ok(PrimitiveType::Bf16) => "bf16",
        Ok(PrimitiveType::C64) => "c64",
        Ok(PrimitiveType::Tuple) => "tuple",
        Ok(PrimitiveType::Invalid) | Err(_) => "invalid",
    }
}

fn shape_text(shape: &ShapeProto) -> String {
    if shape.element_type == PrimitiveType::Tuple as i32 {
        let elements: Vec<String> = shape.tuple_shapes.iter().map(shape_text).collect();
        return format!("({})", elements.join(", "));
    }
    let dims: Vec<String> = shape.dimensions.iter().map(i64::to_string).collect();
    let text = format!("{}[{}]", type_name(shape.element_type), dims.join(","));
    match &shape.layout {
        // Only a layout other than the default says something.
        Some(layout)
            if !layout
                .minor_to_major
                .iter()
                .rev()
                .copied()
                .eq(0..layout.minor_to_major.len() as i64) =>
        {
            format!("{text}{}", list(&layout.minor_to_major))
        }
        _ => text,
    }
}

fn list(values: &[i64]) -> String {
    let values: Vec<String> = values.iter().map(i64::to_string).collect();
    format!("{{{}}}", values.join(","))
}

/// The text inside the parentheses besides operands (parameter number, literal) and the
/// attributes that follow them.
fn attributes(
    instruction: &HloInstructionProto,
    computations: &HashMap<i64, &str>,
) -> (String, Vec<String>) {
    let mut inline = String::new();
    if instruction.opcode == "parameter" {
        inline = instruction.parameter_number.to_string();
    }
    if let Some(literal) = &instruction.literal {
        inline = literal
            .f32s
            .first()
            .map(f32::to_string)
            .or_else(|| literal.f64s.first().map(f64::to_string))
            .or_else(|| literal.s32s.first().map(i32::to_string))
            .or_else(|| literal.s64s.first().map(i64::to_string))
            .or_else(|| literal.preds.first().map(bool::to_string))
            .unwrap_or_else(|| "…".to_string());
    }
    let mut extra = Vec::new();
    if !instruction.dimensions.is_empty() || instruction.opcode == "broadcast" {
        extra.push(format!("dimensions={}", list(&instruction.dimensions)));
    }
    if instruction.opcode == "get-tuple-element" {
        extra.push(format!("index={}", instruction.tuple_index));
    }
    if !instruction.slice_dimensions.is_empty() {
        let ranges: Vec<String> = instruction
            .slice_dimensions
            .iter()
            .map(|slice| format!("[{}:{}:{}]", slice.start, slice.limit, slice.stride))
            .collect();
        extra.push(format!("slice={{{}}}", ranges.join(", ")));
    }
    if !instruction.custom_call_target.is_empty() {
        extra.push(format!(
            "custom_call_target=\"{}\", backend_config={:?}",
            instruction.custom_call_target,
            String::from_utf8_lossy(&instruction.backend_config)
        ));
    }
    if instruction.constrain_layout {
        let operands: Vec<String> = instruction
            .operand_shapes_with_layout
            .iter()
            .map(shape_text)
            .collect();
        extra.push(format!(
            "operand_layout_constraints={{{}}}",
            operands.join(", ")
        ));
    }
    if !instruction.comparison_direction.is_empty() {
        extra.push(format!("direction={}", instruction.comparison_direction));
    }
    if let Some(dot) = &instruction.dot_dimension_numbers {
        extra.push(format!(
            "lhs_batch_dims={}, lhs_contracting_dims={}, rhs_batch_dims={}, rhs_contracting_dims={}",
            list(&dot.lhs_batch_dimensions),
            list(&dot.lhs_contracting_dimensions),
            list(&dot.rhs_batch_dimensions),
            list(&dot.rhs_contracting_dimensions)
        ));
    }
    if let Some(window) = &instruction.window {
        let field = |name: &str, value: fn(&crate::hlo::WindowDimension) -> String| {
            let values: Vec<String> = window.dimensions.iter().map(value).collect();
            format!("{name}={}", values.join("x"))
        };
        extra.push(format!(
            "window={{{} {} {} {} {}}}",
            field("size", |d| d.size.to_string()),
            field("stride", |d| d.stride.to_string()),
            field("pad", |d| format!("{}_{}", d.padding_low, d.padding_high)),
            field("lhs_dilate", |d| d.base_dilation.to_string()),
            field("rhs_dilate", |d| d.window_dilation.to_string()),
        ));
    }
    if let Some(convolution) = &instruction.convolution_dimension_numbers {
        extra.push(format!(
            "dim_numbers={{input b={} f={} s={}, kernel o={} i={} s={}, output b={} f={} s={}}}, \
             feature_group_count={}, batch_group_count={}",
            convolution.input_batch_dimension,
            convolution.input_feature_dimension,
            list(&convolution.input_spatial_dimensions),
            convolution.kernel_output_feature_dimension,
            convolution.kernel_input_feature_dimension,
            list(&convolution.kernel_spatial_dimensions),
            convolution.output_batch_dimension,
            convolution.output_feature_dimension,
            list(&convolution.output_spatial_dimensions),
            instruction.feature_group_count,
            instruction.batch_group_count,
        ));
    }
    if let Some(padding) = &instruction.padding_config {
        let edges: Vec<String> = padding
            .dimensions
            .iter()
            .map(|d| {
                format!(
                    "{}_{}_{}",
                    d.edge_padding_low, d.edge_padding_high, d.interior_padding
                )
            })
            .collect();
        extra.push(format!("padding={}", edges.join("x")));
    }
    if let Some(gather) = &instruction.gather_dimension_numbers {
        extra.push(format!(
            "offset_dims={}, collapsed_slice_dims={}, start_index_map={}, index_vector_dim={}, slice_sizes={}",
            list(&gather.offset_dims),
            list(&gather.collapsed_slice_dims),
            list(&gather.start_index_map),
            gather.index_vector_dim,
            list(&instruction.gather_slice_sizes)
        ));
    }
    if let Some(scatter) = &instruction.scatter_dimension_numbers {
        extra.push(format!(
            "update_window_dims={}, inserted_window_dims={}, scatter_dims_to_operand_dims={}, index_vector_dim={}",
            list(&scatter.update_window_dims),
            list(&scatter.inserted_window_dims),
            list(&scatter.scatter_dims_to_operand_dims),
            scatter.index_vector_dim
        ));
    }
    for id in &instruction.called_computation_ids {
        extra.push(format!(
            "to_apply=%{}",
            computations.get(id).copied().unwrap_or("?")
        ));
    }
    if let Some(metadata) = &instruction.metadata {
        extra.push(format!("metadata={{op_name=\"{}\"}}", metadata.op_name));
    }
    (inline, extra)
}

/// Writes `module` as text: one computation per block, one instruction per line.
pub fn module_to_text(module: &HloModuleProto) -> String {
    let computations: HashMap<i64, &str> = module
        .computations
        .iter()
        .map(|computation| (computation.id, computation.name.as_str()))
        .collect();
    let mut text = format!("HloModule {}", module.name);
    if let Some(alias) = &module.input_output_alias {
        // As XLA prints it: output index: (parameter, parameter index).
        let entries: Vec<String> = alias
            .entries
            .iter()
            .map(|entry| {
                format!(
                    "{}: ({}, {})",
                    list(&entry.output_shape_index),
                    entry.parameter_number,
                    list(&entry.parameter_shape_index)
                )
            })
            .collect();
        let _ = write!(text, ", input_output_alias={{ {} }}", entries.join(", "));
    }
    text.push('\n');
    for computation in &module.computations {
        let entry = if computation.id == module.entry_computation_id {
            "ENTRY "
        } else {
            ""
        };
        let names: HashMap<i64, &str> = computation
            .instructions
            .iter()
            .map(|instruction| (instruction.id, instruction.name.as_str()))
            .collect();
        let _ = writeln!(text, "\n{entry}{} {{", computation.name);
        for instruction in &computation.instructions {
            let root = if instruction.id == computation.root_id {
                "ROOT "
            } else {
                ""
            };
            let shape = instruction
                .shape
                .as_ref()
                .map(shape_text)
                .unwrap_or_default();
            let operands: Vec<String> = instruction
                .operand_ids
                .iter()
                .map(|id| format!("%{}", names.get(id).copied().unwrap_or("?")))
                .collect();
            let (inline, extra) = attributes(instruction, &computations);
            let mut arguments = operands.join(", ");
            if !inline.is_empty() {
                arguments = if arguments.is_empty() {
                    inline
                } else {
                    format!("{arguments}, {inline}")
                };
            }
            let extra = if extra.is_empty() {
                String::new()
            } else {
                format!(", {}", extra.join(", "))
            };
            let _ = writeln!(
                text,
                "  {root}%{} = {shape} {}({arguments}){extra}",
                instruction.name, instruction.opcode
            );
        }
        let _ = writeln!(text, "}}");
    }
    text
}
