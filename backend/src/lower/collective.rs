//! Collectives (captured as custom operations, see [`crate::collective`]) lowered to the HLO
//! collectives `all-reduce`, `all-gather`, `reduce-scatter`, to a `dynamic-slice` at the
//! replica's position (split), and to `opt-barrier`.
//!
//! Reductions of 16-bit floats run in f32 and round once, as the host reference does.

use burn_ir::{CustomOpIr, TensorIr};

use super::builder::{Combiner, Value};
use super::context::{Failure, Lowered, Lowering, dims, unsupported};
use crate::collective::{Collective, ReduceOp, ReplicaGroups};
use crate::hlo::PrimitiveType;

/// Lowers a custom operation: a collective, or an error for custom operations of others.
pub(crate) fn custom(lowering: &mut Lowering, custom: &CustomOpIr) -> Lowered {
    let collective = match Collective::from_ir(custom) {
        None => return unsupported(format!("custom operation `{}`", custom.id)),
        Some(collective) => collective.map_err(Failure::Invalid)?,
    };
    if let Some(groups) = collective.groups() {
        groups
            .check_covers(lowering.options.replicas)
            .map_err(|error| Failure::Invalid(format!("{collective}: {error}")))?;
    }
    if collective == Collective::Barrier {
        let values = custom
            .inputs
            .iter()
            .map(|input| lowering.get(input))
            .collect::<Result<Vec<_>, _>>()?;
        let fenced = lowering.builder.optimization_barrier(&values);
        for (output, value) in custom.outputs.iter().zip(fenced) {
            lowering.set(output, value)?;
        }
        return Ok(());
    }
    for (input, output) in custom.inputs.iter().zip(&custom.outputs) {
        let value = lowering.get(input)?;
        let result = match &collective {
            Collective::AllReduce { op, groups } => all_reduce(lowering, &value, *op, groups),
            Collective::AllGather { dim, groups } => lowering.builder.collective(
                "all-gather",
                &value,
                groups.groups(),
                None,
                Some(*dim),
                &dims(output),
            ),
            Collective::ReduceScatter { dim, groups } => {
                let wide = widen(lowering, &value);
                let scattered = lowering.builder.collective(
                    "reduce-scatter",
                    &wide,
                    groups.groups(),
                    Some(Combiner::Add),
                    Some(*dim),
                    &dims(output),
                );
                lowering.builder.convert(&scattered, value.element_type)
            }
            Collective::Split { dim, groups } => split(lowering, &value, *dim, groups, output),
            Collective::Barrier => unreachable!("handled above"),
        };
        if collective.communicates() {
            lowering.collectives += 1;
            lowering.collective_bytes += (input.shape.num_elements() * input.dtype.size()) as u64;
        }
        lowering.set(output, result)?;
    }
    Ok(())
}

/// `value` in f32 when it is a 16-bit float (reductions accumulate in f32).
fn widen(lowering: &mut Lowering, value: &Value) -> Value {
    match value.element_type {
        PrimitiveType::Bf16 | PrimitiveType::F16 => {
            lowering.builder.convert(value, PrimitiveType::F32)
        }
        _ => value.clone(),
    }
}

fn all_reduce(
    lowering: &mut Lowering,
    value: &Value,
    op: ReduceOp,
    groups: &ReplicaGroups,
) -> Value {
    let wide = widen(lowering, value);
    let combiner = match op {
        ReduceOp::Sum | ReduceOp::Mean => Combiner::Add,
        ReduceOp::Max => Combiner::Maximum,
    };
    let builder = &mut lowering.builder;
    let mut reduced = builder.collective(
        "all-reduce",
        &wide,
        groups.groups(),
        Some(combiner),
        None,
        &wide.dims.clone(),
    );
    if op == ReduceOp::Mean {
        let count = builder.filled(
            wide.element_type,
            groups.group_size() as f64,
            &wide.dims.clone(),
        );
        reduced = builder.binary("divide", &reduced, &count);
    }
    builder.convert(&reduced, value.element_type)
}

/// The chunk along `dim` of the running replica's position in its group: the position is looked
/// up by `replica-id` in a table of every replica's rank.
fn split(
    lowering: &mut Lowering,
    value: &Value,
    dim: usize,
    groups: &ReplicaGroups,
    output: &TensorIr,
) -> Value {
    let out_dims = dims(output);
    let ranks: Vec<i32> = (0..groups.replica_count())
        .map(|replica| {
            groups
                .locate(replica)
                .map_or(0, |(_, rank)| rank as i32 * out_dims[dim] as i32)
        })
        .collect();
    let builder = &mut lowering.builder;
    let table = builder.constant_s32(&ranks);
    let replica = builder.replica_id();
    let replica = builder.convert(&replica, PrimitiveType::S32);
    let offset = builder.dynamic_slice(&table, &[replica], &[1]);
    let offset = builder.reshape(&offset, &[]);
    let zero = builder.constant(PrimitiveType::S32, 0.0);
    let starts: Vec<Value> = (0..value.rank())
        .map(|d| {
            if d == dim {
                offset.clone()
            } else {
                zero.clone()
            }
        })
        .collect();
    builder.dynamic_slice(value, &starts, &out_dims)
}
