//! The state of one lowering: the builder, the value of every tensor, the hoisted scalars.

use std::collections::HashMap;

use burn_backend::{DType, TensorData};
use burn_ir::{OperationIr, ScalarIr, TensorId, TensorIr};

use super::builder::{Builder, Value};
use super::{HoistedScalar, LowerError, LowerOptions, OperatorRules};
use crate::capture::SegmentBoundary;
use crate::hlo::{
    self, AliasEntryProto, BufferDonorEntryProto, HloBufferDonorProto, HloInputOutputAliasProto,
    PrimitiveType,
};

/// Why one operation could not be lowered; located by [`Failure::at`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Failure {
    /// No lowering exists for this operation or these arguments.
    Unsupported(String),
    /// The IR is inconsistent.
    Invalid(String),
}

impl Failure {
    /// The error for operation `index` of the segment.
    pub fn at(self, index: usize, operation: &OperationIr) -> LowerError {
        let operation = super::operation_name(operation);
        match self {
            Failure::Unsupported(reason) => LowerError::Unsupported {
                index,
                operation,
                reason,
            },
            Failure::Invalid(reason) => LowerError::Invalid {
                index,
                operation,
                reason,
            },
        }
    }

    /// The error for a segment output that has no value.
    pub fn at_outputs(self) -> LowerError {
        let reason = match self {
            Failure::Unsupported(reason) | Failure::Invalid(reason) => reason,
        };
        LowerError::Invalid {
            index: 0,
            operation: "outputs".into(),
            reason,
        }
    }
}

/// The result of lowering one operation.
pub(crate) type Lowered<T = ()> = Result<T, Failure>;

/// A `Failure::Unsupported` with `reason`.
pub(crate) fn unsupported<T>(reason: impl Into<String>) -> Lowered<T> {
    Err(Failure::Unsupported(reason.into()))
}

/// The type a computation in f32 is done in: f32 for half-precision floats, else `element_type`
/// (activations, normalisations and `hypot` round once, as the host computes them).
pub(crate) fn compute_type(element_type: PrimitiveType) -> PrimitiveType {
    match element_type {
        PrimitiveType::F16 | PrimitiveType::Bf16 => PrimitiveType::F32,
        other => other,
    }
}

/// The XLA element type of a Burn dtype.
pub(crate) fn element_type(dtype: DType) -> Lowered<PrimitiveType> {
    Ok(match dtype {
        DType::F64 => PrimitiveType::F64,
        DType::F32 | DType::Flex32 => PrimitiveType::F32,
        DType::F16 => PrimitiveType::F16,
        DType::BF16 => PrimitiveType::Bf16,
        DType::I64 => PrimitiveType::S64,
        DType::I32 => PrimitiveType::S32,
        DType::I16 => PrimitiveType::S16,
        DType::I8 => PrimitiveType::S8,
        DType::U64 => PrimitiveType::U64,
        DType::U32 => PrimitiveType::U32,
        DType::U16 => PrimitiveType::U16,
        DType::U8 => PrimitiveType::U8,
        DType::Bool(burn_backend::BoolStore::Native | burn_backend::BoolStore::U8) => {
            PrimitiveType::Pred
        }
        other => return unsupported(format!("data type {other:?}")),
    })
}

/// The dimensions of a tensor as XLA writes them.
pub(crate) fn dims(tensor: &TensorIr) -> Vec<i64> {
    tensor.shape.iter().map(|&d| d as i64).collect()
}

/// The scalars of one dtype, passed as one rank-1 parameter.
struct ScalarPack {
    dtype: DType,
    parameter: Value,
    values: Vec<ScalarIr>,
    /// The operation being lowered when each value was hoisted.
    origins: Vec<usize>,
}

/// A finished lowering: the module, its hoisted scalars, how many random states it draws, and
/// its collectives.
pub(crate) struct Finished {
    pub module: hlo::HloModuleProto,
    pub scalars: Vec<TensorData>,
    pub hoisted: Vec<Vec<HoistedScalar>>,
    pub replica_index: bool,
    pub random_draws: usize,
    pub collectives: usize,
    pub collective_bytes: u64,
}

/// One lowering in progress.
pub(crate) struct Lowering {
    pub builder: Builder,
    values: HashMap<TensorId, Value>,
    parameters: Vec<hlo::ShapeProto>,
    packs: Vec<ScalarPack>,
    /// The `s32[1]` parameter holding the running replica's index, once a collective asks.
    replica_index: Option<Value>,
    /// The `u64[2 * draws]` parameter of random states, once a random tensor is drawn.
    random_states: Option<Value>,
    random_draws: i64,
    /// Collectives that exchange data, and the bytes each replica sends into them.
    pub collectives: usize,
    pub collective_bytes: u64,
    /// Executor-dependent choices.
    pub options: LowerOptions,
    /// The index of the operation being lowered (where hoisted scalars come from).
    pub operation: usize,
}

impl Lowering {
    /// Starts a lowering whose first parameters are `inputs`.
    pub fn new(inputs: &[TensorIr], options: LowerOptions) -> Result<Self, String> {
        let mut lowering = Lowering {
            builder: Builder::default(),
            values: HashMap::new(),
            parameters: Vec::new(),
            packs: Vec::new(),
            replica_index: None,
            random_states: None,
            random_draws: 0,
            collectives: 0,
            collective_bytes: 0,
            options,
            operation: 0,
        };
        lowering.builder.bf16_dots_sum_in_f32 = lowering.options.rules == OperatorRules::Xla;
        for (number, input) in inputs.iter().enumerate() {
            let element_type =
                element_type(input.dtype).map_err(|failure| format!("{failure:?}"))?;
            let dims = dims(input);
            let value = lowering
                .builder
                .parameter(number as i64, element_type, &dims);
            lowering
                .parameters
                .push(hlo::array_shape(element_type, &dims));
            lowering.values.insert(input.id, value);
        }
        Ok(lowering)
    }

    /// The value of a tensor the segment reads.
    pub fn get(&self, tensor: &TensorIr) -> Lowered<Value> {
        self.values.get(&tensor.id).cloned().ok_or_else(|| {
            Failure::Invalid(format!(
                "tensor {} is used before it is produced",
                tensor.id
            ))
        })
    }

    /// Records `value` as the tensor `out`, converting it to `out`'s dtype and checking its shape.
    pub fn set(&mut self, out: &TensorIr, value: Value) -> Lowered {
        let expected = dims(out);
        if value.dims != expected {
            return Err(Failure::Invalid(format!(
                "lowered shape {:?} for tensor {} of shape {expected:?}",
                value.dims, out.id
            )));
        }
        let value = self.builder.convert(&value, element_type(out.dtype)?);
        self.values.insert(out.id, value);
        Ok(())
    }

    /// A rank-0 value holding `scalar` converted to `dtype`, read from the hoisted parameters.
    pub fn scalar(&mut self, scalar: ScalarIr, dtype: DType) -> Lowered<Value> {
        let element_type = element_type(dtype)?;
        let pack = match self.packs.iter().position(|pack| pack.dtype == dtype) {
            Some(position) => position,
            None => {
                // Numbered in `finish`, after the inputs; its length is set there too.
                let parameter = self.builder.parameter(-1, element_type, &[0]);
                self.packs.push(ScalarPack {
                    dtype,
                    parameter,
                    values: Vec::new(),
                    origins: Vec::new(),
                });
                self.packs.len() - 1
            }
        };
        let pack = &mut self.packs[pack];
        let position = pack.values.len() as i64;
        pack.values.push(scalar);
        pack.origins.push(self.operation);
        let parameter = pack.parameter.clone();
        let element = self
            .builder
            .slice(&parameter, &[position], &[position + 1], &[1]);
        Ok(self.builder.reshape(&element, &[]))
    }

    /// The running replica's global index, a rank-0 `s32` read from a parameter each replica
    /// gets its own value of ([`crate::lower::LoweredProgram::replica_index`]): the program needs
    /// no `replica-id`.
    pub fn replica_index(&mut self) -> Value {
        let parameter = match &self.replica_index {
            Some(parameter) => parameter.clone(),
            None => {
                // Numbered in `finish`, after the scalar packs.
                let parameter = self.builder.parameter(-1, PrimitiveType::S32, &[1]);
                self.replica_index = Some(parameter.clone());
                parameter
            }
        };
        self.builder.reshape(&parameter, &[])
    }

    /// A fresh `u64[2]` Threefry state, read from the random-state parameter.
    pub fn random_state(&mut self) -> Value {
        let states = match &self.random_states {
            Some(states) => states.clone(),
            None => {
                // Numbered and sized in `finish`, after the scalar packs.
                let states = self.builder.parameter(-1, PrimitiveType::U64, &[0]);
                self.random_states = Some(states.clone());
                states
            }
        };
        let start = 2 * self.random_draws;
        self.random_draws += 1;
        self.builder.slice(&states, &[start], &[start + 2], &[1])
    }

    /// `scalar` broadcast to `dims`.
    pub fn scalar_filled(
        &mut self,
        scalar: ScalarIr,
        dtype: DType,
        dims: &[i64],
    ) -> Lowered<Value> {
        let value = self.scalar(scalar, dtype)?;
        Ok(self.builder.broadcast(&value, dims, &[]))
    }

    /// Finishes the module and returns it with the hoisted scalar arguments. `aliases` pairs
    /// (output, input) positions that share a buffer; without them the released inputs are
    /// offered as buffer donors.
    pub fn finish(
        mut self,
        outputs: &[Value],
        boundary: &SegmentBoundary,
        aliases: Option<&[(usize, usize)]>,
    ) -> Finished {
        let first_pack = self.parameters.len() as i64;
        let mut scalars = Vec::new();
        for (position, pack) in self.packs.iter().enumerate() {
            let shape = self
                .builder
                .resize_parameter(&pack.parameter, &[pack.values.len() as i64]);
            self.builder
                .renumber_parameter(&pack.parameter, first_pack + position as i64);
            self.parameters.push(shape);
            scalars.push(scalar_data(&pack.values, pack.dtype));
        }
        if let Some(index) = &self.replica_index {
            self.builder
                .renumber_parameter(index, self.parameters.len() as i64);
            self.parameters
                .push(hlo::array_shape(PrimitiveType::S32, &[1]));
        }
        if let Some(states) = &self.random_states {
            let shape = self
                .builder
                .resize_parameter(states, &[2 * self.random_draws]);
            self.builder
                .renumber_parameter(states, self.parameters.len() as i64);
            self.parameters.push(shape);
        }
        let mut module = self.builder.finish("segment", self.parameters, outputs);
        match aliases {
            Some(aliases) if !aliases.is_empty() => {
                let entries = aliases
                    .iter()
                    .map(|&(output, input)| AliasEntryProto {
                        output_shape_index: vec![output as i64],
                        parameter_number: input as i64,
                        parameter_shape_index: Vec::new(),
                        kind: hlo::MAY_ALIAS,
                    })
                    .collect();
                module.input_output_alias = Some(HloInputOutputAliasProto { entries });
            }
            Some(_) => {}
            None => {
                let donors: Vec<BufferDonorEntryProto> = boundary
                    .inputs
                    .iter()
                    .enumerate()
                    .filter(|(_, input)| boundary.released_inputs.contains(&input.id))
                    .map(|(number, _)| BufferDonorEntryProto {
                        parameter_number: number as i64,
                        parameter_shape_index: Vec::new(),
                    })
                    .collect();
                if !donors.is_empty() {
                    module.buffer_donor = Some(HloBufferDonorProto { entries: donors });
                }
            }
        }
        let hoisted = self
            .packs
            .iter()
            .map(|pack| {
                pack.origins
                    .iter()
                    .zip(&pack.values)
                    .map(|(&operation, &value)| HoistedScalar { operation, value })
                    .collect()
            })
            .collect();
        Finished {
            module,
            scalars,
            hoisted,
            replica_index: self.replica_index.is_some(),
            random_draws: self.random_draws as usize,
            collectives: self.collectives,
            collective_bytes: self.collective_bytes,
        }
    }
}

/// The hoisted scalars of one pack as a rank-1 tensor of `dtype`.
pub(crate) fn scalar_data(values: &[ScalarIr], dtype: DType) -> TensorData {
    let shape = [values.len()];
    match dtype {
        DType::F64 => TensorData::new(values.iter().map(|v| v.elem::<f64>()).collect(), shape),
        DType::F16 => TensorData::new(
            values.iter().map(|v| v.elem::<half::f16>()).collect(),
            shape,
        ),
        DType::BF16 => TensorData::new(
            values.iter().map(|v| v.elem::<half::bf16>()).collect(),
            shape,
        ),
        DType::I64 => TensorData::new(values.iter().map(|v| v.elem::<i64>()).collect(), shape),
        DType::I32 => TensorData::new(values.iter().map(|v| v.elem::<i32>()).collect(), shape),
        DType::I16 => TensorData::new(values.iter().map(|v| v.elem::<i16>()).collect(), shape),
        DType::I8 => TensorData::new(values.iter().map(|v| v.elem::<i8>()).collect(), shape),
        DType::U64 => TensorData::new(values.iter().map(|v| v.elem::<u64>()).collect(), shape),
        DType::U32 => TensorData::new(values.iter().map(|v| v.elem::<u32>()).collect(), shape),
        DType::U16 => TensorData::new(values.iter().map(|v| v.elem::<u16>()).collect(), shape),
        DType::U8 => TensorData::new(values.iter().map(|v| v.elem::<u8>()).collect(), shape),
        DType::Bool(_) => TensorData::new(values.iter().map(|v| v.elem::<bool>()).collect(), shape),
        _ => TensorData::new(values.iter().map(|v| v.elem::<f32>()).collect(), shape),
    }
}
