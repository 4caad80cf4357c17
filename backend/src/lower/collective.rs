//! Collectives (captured as custom operations, see [`crate::collective`]) lowered to the HLO
//! collectives `all-reduce`, `all-gather`, `reduce-scatter`, `all-to-all`, `collective-permute` (the permute,
//! its pairs as replica ids: without a channel id), to a `dynamic-slice` at the replica's
//! position (split), and to `opt-barrier`.
//!
//! Reductions of 16-bit floats run in f32 and round once, as the host reference does; the
//! permute moves values unchanged, in their own type.

use burn_ir::{CustomOpIr, TensorIr};

use super::OperatorRules;
use super::builder::{Combiner, Direction, Value};
use super::context::{Failure, Lowered, Lowering, dims, unsupported};
use crate::collective::{Collective, ReduceOp, ReplicaGroups};
use crate::hlo::PrimitiveType;

/// Lowers a custom operation: a collective, or an error for custom operations of others.
pub(crate) fn custom(lowering: &mut Lowering, custom: &CustomOpIr) -> Lowered {
    let collective = match Collective::from_ir(custom) {
        None => return unsupported(format!("custom operation `{}`", custom.id)),
        Some(collective) => collective.map_err(Failure::Invalid)?,
    };
    collective
        .check_replicas(lowering.options.replicas)
        .map_err(|error| Failure::Invalid(format!("{collective}: {error}")))?;
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
            // HLO's array all-to-all: cut and joined along its one split dimension.
            Collective::AllToAll { dim, groups } => {
                lowering.builder.all_to_all(&value, groups.groups(), *dim)
            }
            Collective::Split { dim, groups } => split(lowering, &value, *dim, groups, output),
            Collective::Permute { pairs } => {
                lowering.builder.collective_permute(&value, pairs.pairs())
            }
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

/// The chunk along `dim` of the running replica's position in its group.
fn split(
    lowering: &mut Lowering,
    value: &Value,
    dim: usize,
    groups: &ReplicaGroups,
    output: &TensorIr,
) -> Value {
    let out_dims = dims(output);
    let chunk = out_dims[dim];
    let ranks: Vec<i32> = (0..groups.replica_count())
        .map(|replica| groups.locate(replica).map_or(0, |(_, rank)| rank as i32))
        .collect();
    match lowering.options.rules {
        OperatorRules::Xla => {
            // The offset looked up by `replica-id` in a table of every replica's, then a slice
            // at that run-time offset.
            let offsets: Vec<i32> = ranks.iter().map(|rank| rank * chunk as i32).collect();
            let builder = &mut lowering.builder;
            let table = builder.constant_s32(&offsets);
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
        OperatorRules::Neuron => {
            // The replica's rank from its index (a parameter) and the table of ranks, with
            // listed operators: a compare against every replica, a select, a sum. Then the
            // chunks at constant offsets, the rank's selected.
            let index = lowering.replica_index();
            let builder = &mut lowering.builder;
            let replicas = [ranks.len() as i64];
            let table = builder.constant_s32(&ranks);
            let every = builder.iota(PrimitiveType::S32, &replicas, 0);
            let index = builder.broadcast(&index, &replicas, &[]);
            let mine = builder.compare(Direction::Eq, &every, &index);
            let zeros = builder.filled(PrimitiveType::S32, 0.0, &replicas);
            let picked = builder.select(&mine, &table, &zeros);
            let rank = builder.reduce(&picked, 0.0, &[0], Combiner::Add);
            let mut selected: Option<Value> = None;
            for position in 0..groups.group_size() as i64 {
                let mut start = vec![0; value.rank()];
                let mut limit = value.dims.clone();
                start[dim] = position * chunk;
                limit[dim] = (position + 1) * chunk;
                let strides = vec![1; value.rank()];
                let piece = builder.slice(value, &start, &limit, &strides);
                selected = Some(match selected {
                    None => piece,
                    Some(previous) => {
                        let here = builder.filled(PrimitiveType::S32, position as f64, &[]);
                        let hit = builder.compare(Direction::Eq, &rank, &here);
                        let hit = builder.broadcast(&hit, &out_dims, &[]);
                        builder.select(&hit, &piece, &previous)
                    }
                });
            }
            selected.expect("a group of at least one replica")
        }
    }
}
