//! XLA HLO: the protobuf messages of an `HloModuleProto` and a readable text form of them.

mod proto;
mod text;

pub use proto::*;
pub use text::module_to_text;

/// A dense array shape with XLA's default (row-major) layout.
pub fn array_shape(element_type: PrimitiveType, dimensions: &[i64]) -> ShapeProto {
    ShapeProto {
        element_type: element_type as i32,
        dimensions: dimensions.to_vec(),
        tuple_shapes: Vec::new(),
        layout: Some(LayoutProto {
            minor_to_major: (0..dimensions.len() as i64).rev().collect(),
        }),
    }
}

/// A tuple shape of `elements`.
pub fn tuple_shape(elements: Vec<ShapeProto>) -> ShapeProto {
    ShapeProto {
        element_type: PrimitiveType::Tuple as i32,
        dimensions: Vec::new(),
        tuple_shapes: elements,
        layout: None,
    }
}
