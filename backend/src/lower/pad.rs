//! Padding (`pad`, new in Burn 0.22): with a constant, by reflection (the edge element not
//! repeated, as PyTorch's `reflect`) or by repeating the edge element; one `(before, after)` pair
//! per dimension.

use burn_ir::{PadModeIr, PadOpIr};

use super::builder::{Builder, Value};
use super::context::{Lowered, Lowering, unsupported};

/// Lowers `pad`.
pub(crate) fn pad(cx: &mut Lowering, ir: &PadOpIr) -> Lowered {
    let input = cx.get(&ir.input)?;
    if ir.padding.len() != input.rank() {
        return unsupported(format!(
            "padding of {} dimensions for a tensor of rank {}",
            ir.padding.len(),
            input.rank()
        ));
    }
    let value = match &ir.mode {
        PadModeIr::Constant(value) => {
            let edges: Vec<(i64, i64, i64)> = ir
                .padding
                .iter()
                .map(|&(before, after)| (before as i64, after as i64, 0))
                .collect();
            cx.builder.pad(&input, value.elem::<f64>(), &edges)
        }
        PadModeIr::Reflect | PadModeIr::Edge => {
            let reflect = matches!(ir.mode, PadModeIr::Reflect);
            let mut value = input;
            for (dim, &(before, after)) in ir.padding.iter().enumerate() {
                value = pad_dimension(
                    &mut cx.builder,
                    &value,
                    dim,
                    (before as i64, after as i64),
                    reflect,
                );
            }
            value
        }
    };
    cx.set(&ir.out, value)
}

/// `value` padded along `dim` by reflection or edge repetition.
fn pad_dimension(
    builder: &mut Builder,
    value: &Value,
    dim: usize,
    (before, after): (i64, i64),
    reflect: bool,
) -> Value {
    if before == 0 && after == 0 {
        return value.clone();
    }
    let size = value.dims[dim];
    let mut pieces = Vec::new();
    if before > 0 {
        pieces.push(if reflect {
            // x[before], ..., x[1]
            let part = range(builder, value, dim, 1, 1 + before);
            builder.reverse(&part, &[dim as i64])
        } else {
            repeated_edge(builder, value, dim, 0, before)
        });
    }
    pieces.push(value.clone());
    if after > 0 {
        pieces.push(if reflect {
            // x[size - 2], ..., x[size - 1 - after]
            let part = range(builder, value, dim, size - 1 - after, size - 1);
            builder.reverse(&part, &[dim as i64])
        } else {
            repeated_edge(builder, value, dim, size - 1, after)
        });
    }
    builder.concatenate(&pieces, dim)
}

/// Elements `[start, limit)` of `value` along `dim`.
fn range(builder: &mut Builder, value: &Value, dim: usize, start: i64, limit: i64) -> Value {
    let mut starts = vec![0; value.rank()];
    let mut limits = value.dims.clone();
    starts[dim] = start;
    limits[dim] = limit;
    builder.slice(value, &starts, &limits, &vec![1; value.rank()])
}

/// Element `index` of `value` along `dim`, repeated `count` times there.
fn repeated_edge(
    builder: &mut Builder,
    value: &Value,
    dim: usize,
    index: i64,
    count: i64,
) -> Value {
    let edge = range(builder, value, dim, index, index + 1);
    let mut dims = value.dims.clone();
    dims[dim] = count;
    builder.broadcast_to(&edge, &dims)
}
