//! Builds HLO instructions and computations with fresh ids, checking nothing but bookkeeping:
//! the shapes given are the shapes written (the lowering computes them from Burn's IR).

use std::collections::HashMap;

use crate::hlo::{
    self, ConvolutionDimensionNumbers, DotDimensionNumbers, GatherDimensionNumbers,
    HloComputationProto, HloInstructionProto, LiteralProto, OpMetadata, PaddingConfig,
    PaddingConfigDimension, PrimitiveType, ProgramShapeProto, ReplicaGroup,
    ScatterDimensionNumbers, SliceDimensions, SourceTarget, Window,
};

/// A value of the computation being built: an instruction id and its array shape.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Value {
    pub id: i64,
    pub element_type: PrimitiveType,
    pub dims: Vec<i64>,
}

impl Value {
    pub fn rank(&self) -> usize {
        self.dims.len()
    }
}

/// The binary computations used by reductions and scatters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Combiner {
    Add,
    Multiply,
    Maximum,
    Minimum,
    Or,
    And,
    /// Keeps the update (scatter assignment).
    Replace,
}

impl Combiner {
    /// The elementwise opcode that combines two values (none for [`Combiner::Replace`]).
    pub(crate) fn opcode(self) -> Option<&'static str> {
        match self {
            Combiner::Add => Some("add"),
            Combiner::Multiply => Some("multiply"),
            Combiner::Maximum => Some("maximum"),
            Combiner::Minimum => Some("minimum"),
            Combiner::Or => Some("or"),
            Combiner::And => Some("and"),
            Combiner::Replace => None,
        }
    }
}

/// An HLO comparison direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Direction {
    fn name(self) -> &'static str {
        match self {
            Direction::Eq => "EQ",
            Direction::Ne => "NE",
            Direction::Lt => "LT",
            Direction::Le => "LE",
            Direction::Gt => "GT",
            Direction::Ge => "GE",
        }
    }
}

/// Builds the entry computation of one module, and the small computations it calls.
#[derive(Default)]
pub(crate) struct Builder {
    next_id: i64,
    instructions: Vec<HloInstructionProto>,
    computations: Vec<HloComputationProto>,
    combiners: HashMap<(Combiner, PrimitiveType), i64>,
    /// The channel id of the last collective (each collective gets its own, from 1).
    last_channel: i64,
    /// The Burn operation being lowered, recorded as metadata of each instruction.
    pub op_name: String,
    /// Whether bf16 matrix products the compiler's matrix library takes as bf16 × bf16 → f32
    /// are written that way ([`Builder::dot`]).
    pub bf16_dots_sum_in_f32: bool,
}

fn fresh_id(next_id: &mut i64) -> i64 {
    *next_id += 1;
    *next_id
}

fn instruction(
    id: i64,
    opcode: &str,
    element_type: PrimitiveType,
    dims: &[i64],
    operands: &[&Value],
) -> HloInstructionProto {
    HloInstructionProto {
        name: format!("{}.{id}", opcode.replace('-', "_")),
        opcode: opcode.to_string(),
        shape: Some(hlo::array_shape(element_type, dims)),
        id,
        operand_ids: operands.iter().map(|operand| operand.id).collect(),
        ..Default::default()
    }
}

/// A scalar literal of `element_type` holding `value`.
fn scalar_literal(element_type: PrimitiveType, value: f64) -> LiteralProto {
    let mut literal = LiteralProto {
        shape: Some(hlo::array_shape(element_type, &[])),
        ..Default::default()
    };
    match element_type {
        PrimitiveType::Pred => literal.preds = vec![value != 0.0],
        PrimitiveType::S8 => literal.s8s = vec![value as i8 as u8],
        PrimitiveType::U8 => literal.u8s = vec![value as u8],
        PrimitiveType::S16 => literal.s16s = (value as i16).to_le_bytes().to_vec(),
        PrimitiveType::U16 => literal.u16s = (value as u16).to_le_bytes().to_vec(),
        PrimitiveType::S32 => literal.s32s = vec![value as i32],
        PrimitiveType::S64 => literal.s64s = vec![value as i64],
        PrimitiveType::U32 => literal.u32s = vec![value as u32],
        PrimitiveType::U64 => literal.u64s = vec![value as u64],
        PrimitiveType::F16 => literal.f16s = half::f16::from_f64(value).to_le_bytes().to_vec(),
        PrimitiveType::Bf16 => literal.bf16s = half::bf16::from_f64(value).to_le_bytes().to_vec(),
        PrimitiveType::F32 => literal.f32s = vec![value as f32],
        PrimitiveType::F64 => literal.f64s = vec![value],
        PrimitiveType::C64 | PrimitiveType::Tuple | PrimitiveType::Invalid => {}
    }
    literal
}

impl Builder {
    pub(super) fn push(&mut self, mut instruction: HloInstructionProto) -> Value {
        if !self.op_name.is_empty() {
            instruction.metadata = Some(OpMetadata {
                op_type: String::new(),
                op_name: self.op_name.clone(),
            });
        }
        let shape = instruction
            .shape
            .as_ref()
            .expect("array instructions have a shape");
        let value = Value {
            id: instruction.id,
            element_type: PrimitiveType::try_from(shape.element_type)
                .unwrap_or(PrimitiveType::Invalid),
            dims: shape.dimensions.clone(),
        };
        self.instructions.push(instruction);
        value
    }

    pub(super) fn op(
        &mut self,
        opcode: &str,
        element_type: PrimitiveType,
        dims: &[i64],
        operands: &[&Value],
    ) -> HloInstructionProto {
        let id = fresh_id(&mut self.next_id);
        instruction(id, opcode, element_type, dims, operands)
    }

    /// The entry parameter `number`.
    pub fn parameter(&mut self, number: i64, element_type: PrimitiveType, dims: &[i64]) -> Value {
        let mut parameter = self.op("parameter", element_type, dims, &[]);
        parameter.parameter_number = number;
        parameter.name = format!("p{number}.{}", parameter.id);
        self.push(parameter)
    }

    /// A scalar constant.
    pub fn constant(&mut self, element_type: PrimitiveType, value: f64) -> Value {
        let mut constant = self.op("constant", element_type, &[], &[]);
        constant.literal = Some(scalar_literal(element_type, value));
        self.push(constant)
    }

    /// A constant of shape `dims`, every element `value`.
    pub fn filled(&mut self, element_type: PrimitiveType, value: f64, dims: &[i64]) -> Value {
        let scalar = self.constant(element_type, value);
        self.broadcast(&scalar, dims, &[])
    }

    /// An elementwise operation on one operand.
    pub fn unary(&mut self, opcode: &str, operand: &Value) -> Value {
        let instruction = self.op(opcode, operand.element_type, &operand.dims, &[operand]);
        self.push(instruction)
    }

    /// An elementwise operation on two operands of the same shape; the result has their type.
    pub fn binary(&mut self, opcode: &str, lhs: &Value, rhs: &Value) -> Value {
        let instruction = self.op(opcode, lhs.element_type, &lhs.dims, &[lhs, rhs]);
        self.push(instruction)
    }

    /// An elementwise comparison of two operands of the same shape and type.
    pub fn compare(&mut self, direction: Direction, lhs: &Value, rhs: &Value) -> Value {
        let mut instruction = self.op("compare", PrimitiveType::Pred, &lhs.dims, &[lhs, rhs]);
        instruction.comparison_direction = direction.name().to_string();
        self.push(instruction)
    }

    /// `on_true` where `predicate`, else `on_false` (all of one shape).
    pub fn select(&mut self, predicate: &Value, on_true: &Value, on_false: &Value) -> Value {
        let instruction = self.op(
            "select",
            on_true.element_type,
            &on_true.dims,
            &[predicate, on_true, on_false],
        );
        self.push(instruction)
    }

    /// Converts the element type (round to nearest even for floats, truncation toward zero
    /// from float to integer).
    pub fn convert(&mut self, operand: &Value, element_type: PrimitiveType) -> Value {
        if operand.element_type == element_type {
            return operand.clone();
        }
        let instruction = self.op("convert", element_type, &operand.dims, &[operand]);
        self.push(instruction)
    }

    /// Broadcasts `operand` into `dims`; operand dimension `i` becomes result dimension
    /// `mapping[i]`.
    pub fn broadcast(&mut self, operand: &Value, dims: &[i64], mapping: &[i64]) -> Value {
        if operand.dims == dims && mapping.iter().enumerate().all(|(i, d)| i as i64 == *d) {
            return operand.clone();
        }
        let mut instruction = self.op("broadcast", operand.element_type, dims, &[operand]);
        instruction.dimensions = mapping.to_vec();
        self.push(instruction)
    }

    /// Changes the dimensions, keeping the row-major element order.
    pub fn reshape(&mut self, operand: &Value, dims: &[i64]) -> Value {
        if operand.dims == dims {
            return operand.clone();
        }
        let instruction = self.op("reshape", operand.element_type, dims, &[operand]);
        self.push(instruction)
    }

    /// Permutes dimensions: result dimension `i` is operand dimension `permutation[i]`.
    pub fn transpose(&mut self, operand: &Value, permutation: &[i64]) -> Value {
        if permutation.iter().enumerate().all(|(i, d)| i as i64 == *d) {
            return operand.clone();
        }
        let dims: Vec<i64> = permutation
            .iter()
            .map(|&d| operand.dims[d as usize])
            .collect();
        let mut instruction = self.op("transpose", operand.element_type, &dims, &[operand]);
        instruction.dimensions = permutation.to_vec();
        self.push(instruction)
    }

    /// Reverses the order of elements along `dims`.
    pub fn reverse(&mut self, operand: &Value, dims: &[i64]) -> Value {
        if dims.is_empty() {
            return operand.clone();
        }
        let mut instruction = self.op("reverse", operand.element_type, &operand.dims, &[operand]);
        instruction.dimensions = dims.to_vec();
        self.push(instruction)
    }

    /// A static strided slice `[start, limit)` with `stride` per dimension.
    pub fn slice(
        &mut self,
        operand: &Value,
        start: &[i64],
        limit: &[i64],
        stride: &[i64],
    ) -> Value {
        let dims: Vec<i64> = (0..operand.rank())
            .map(|d| (limit[d] - start[d] + stride[d] - 1).max(0) / stride[d])
            .collect();
        if dims == operand.dims {
            return operand.clone();
        }
        let mut instruction = self.op("slice", operand.element_type, &dims, &[operand]);
        instruction.slice_dimensions = (0..operand.rank())
            .map(|d| SliceDimensions {
                start: start[d],
                limit: limit[d],
                stride: stride[d],
            })
            .collect();
        self.push(instruction)
    }

    /// Joins `operands` along `dimension`.
    pub fn concatenate(&mut self, operands: &[Value], dimension: usize) -> Value {
        if operands.len() == 1 {
            return operands[0].clone();
        }
        let mut dims = operands[0].dims.clone();
        dims[dimension] = operands.iter().map(|operand| operand.dims[dimension]).sum();
        let references: Vec<&Value> = operands.iter().collect();
        let mut instruction = self.op("concatenate", operands[0].element_type, &dims, &references);
        instruction.dimensions = vec![dimension as i64];
        self.push(instruction)
    }

    /// Writes `update` into `operand` at the static offsets `start`.
    pub fn update_slice(&mut self, operand: &Value, update: &Value, start: &[i64]) -> Value {
        let offsets: Vec<Value> = start
            .iter()
            .map(|&s| self.constant(PrimitiveType::S32, s as f64))
            .collect();
        let mut operands = vec![operand, update];
        operands.extend(offsets.iter());
        let instruction = self.op(
            "dynamic-update-slice",
            operand.element_type,
            &operand.dims,
            &operands,
        );
        self.push(instruction)
    }

    /// Counts `0, 1, ...` along `dimension` of an array of `dims`.
    pub fn iota(&mut self, element_type: PrimitiveType, dims: &[i64], dimension: usize) -> Value {
        let mut instruction = self.op("iota", element_type, dims, &[]);
        instruction.dimensions = vec![dimension as i64];
        self.push(instruction)
    }

    /// A general dot product; the result has `dims` and the type of `lhs`.
    ///
    /// With [`bf16_dots_sum_in_f32`](Self::bf16_dots_sum_in_f32), a bf16 product the XLA CPU
    /// plugin's matrix library (YNNPACK) takes is written as bf16 × bf16 → f32 and rounded to
    /// bf16 once: the same values as the bf16 dot (whose operands XLA widens to f32 and
    /// multiplies in f32), computed by the CPU's bf16 instructions at twice the f32 rate. The
    /// plugin's other dot kernels have no bf16 × bf16 → f32 form, so a product the library
    /// would not take (a vector, a tiny one, a column-major operand such as a weight gradient's
    /// `xᵀ g`, or a batched one whose operand is a transpose XLA folds into it) keeps its bf16
    /// result.
    pub fn dot(
        &mut self,
        lhs: &Value,
        rhs: &Value,
        numbers: DotDimensionNumbers,
        dims: &[i64],
    ) -> Value {
        let summed_in = match self.bf16_dots_sum_in_f32 && self.library_takes(lhs, rhs, &numbers) {
            true => PrimitiveType::F32,
            false => lhs.element_type,
        };
        let mut instruction = self.op("dot", summed_in, dims, &[lhs, rhs]);
        instruction.dot_dimension_numbers = Some(numbers);
        let product = self.push(instruction);
        self.convert(&product, lhs.element_type)
    }

    /// Whether XLA CPU's matrix library takes a bf16 × bf16 → f32 product of `lhs` and `rhs`
    /// (its conditions: both operands bf16, neither side a vector, some side of at least 8;
    /// operands in canonical form, which a transposed operand would not keep).
    fn library_takes(&self, lhs: &Value, rhs: &Value, numbers: &DotDimensionNumbers) -> bool {
        if lhs.element_type != PrimitiveType::Bf16 || rhs.element_type != PrimitiveType::Bf16 {
            return false;
        }
        let free = |value: &Value, contracting: &[i64], batch: &[i64]| -> i64 {
            (0..value.rank() as i64)
                .filter(|d| !contracting.contains(d) && !batch.contains(d))
                .map(|d| value.dims[d as usize])
                .product()
        };
        let m = free(
            lhs,
            &numbers.lhs_contracting_dimensions,
            &numbers.lhs_batch_dimensions,
        );
        let n = free(
            rhs,
            &numbers.rhs_contracting_dimensions,
            &numbers.rhs_batch_dimensions,
        );
        let k: i64 = numbers
            .lhs_contracting_dimensions
            .iter()
            .map(|&d| lhs.dims[d as usize])
            .product();
        if m < 2 || n < 2 || m.max(n).max(k) < 8 {
            return false;
        }
        // Canonical operands only, batched or not: `lhs [batch.., m, k]`, `rhs [batch.., k, n]`.
        // The library refuses a column-major side (a weight gradient's `xᵀ g` contracts the
        // first dimension of both), and XLA CPU's own dot then cannot run bf16 × bf16 → f32.
        let batch = numbers.lhs_batch_dimensions.len() as i64;
        numbers.lhs_batch_dimensions == (0..batch).collect::<Vec<_>>()
            && numbers.rhs_batch_dimensions == numbers.lhs_batch_dimensions
            && numbers.lhs_contracting_dimensions == [lhs.rank() as i64 - 1]
            && numbers.rhs_contracting_dimensions == [batch]
            && !self.is_transposed(lhs)
            && !self.is_transposed(rhs)
    }

    /// Whether `value` is a transpose, possibly behind conversions and reshapes.
    fn is_transposed(&self, value: &Value) -> bool {
        let mut id = value.id;
        loop {
            let Some(instruction) = self.instructions.iter().rev().find(|i| i.id == id) else {
                return false;
            };
            match instruction.opcode.as_str() {
                "transpose" => return true,
                "convert" | "reshape" | "bitcast" | "copy" => id = instruction.operand_ids[0],
                _ => return false,
            }
        }
    }

    /// Reduces `dimensions` of `operand` with `combiner`, starting from `init`.
    pub fn reduce(
        &mut self,
        operand: &Value,
        init: f64,
        dimensions: &[usize],
        combiner: Combiner,
    ) -> Value {
        let element_type = operand.element_type;
        let init = self.constant(element_type, init);
        let computation = self.combiner(combiner, element_type);
        let dims: Vec<i64> = (0..operand.rank())
            .filter(|d| !dimensions.contains(d))
            .map(|d| operand.dims[d])
            .collect();
        let mut instruction = self.op("reduce", element_type, &dims, &[operand, &init]);
        instruction.dimensions = dimensions.iter().map(|&d| d as i64).collect();
        instruction.called_computation_ids = vec![computation];
        self.push(instruction)
    }

    /// A gather (see XLA's operation semantics); the result has `dims`.
    pub fn gather(
        &mut self,
        operand: &Value,
        indices: &Value,
        numbers: GatherDimensionNumbers,
        slice_sizes: &[i64],
        dims: &[i64],
    ) -> Value {
        let mut instruction = self.op("gather", operand.element_type, dims, &[operand, indices]);
        instruction.gather_dimension_numbers = Some(numbers);
        instruction.gather_slice_sizes = slice_sizes.to_vec();
        self.push(instruction)
    }

    /// A scatter of `updates` into `operand` combined with `combiner`. Sums and products of
    /// bf16 or f16 values accumulate in f32, as the other reductions do (a bf16 accumulator
    /// stops growing once an update is below its rounding step), then round once.
    pub fn scatter(
        &mut self,
        operand: &Value,
        indices: &Value,
        updates: &Value,
        numbers: ScatterDimensionNumbers,
        combiner: Combiner,
    ) -> Value {
        let narrow = matches!(
            operand.element_type,
            PrimitiveType::Bf16 | PrimitiveType::F16
        );
        if narrow && matches!(combiner, Combiner::Add | Combiner::Multiply) {
            let wide_operand = self.convert(operand, PrimitiveType::F32);
            let wide_updates = self.convert(updates, PrimitiveType::F32);
            let result = self.scatter(&wide_operand, indices, &wide_updates, numbers, combiner);
            return self.convert(&result, operand.element_type);
        }
        let computation = self.combiner(combiner, operand.element_type);
        let mut instruction = self.op(
            "scatter",
            operand.element_type,
            &operand.dims,
            &[operand, indices, updates],
        );
        instruction.scatter_dimension_numbers = Some(numbers);
        instruction.called_computation_ids = vec![computation];
        self.push(instruction)
    }

    /// The id of the computation `(a, b) -> combiner(a, b)` on scalars of `element_type`.
    fn combiner(&mut self, combiner: Combiner, element_type: PrimitiveType) -> i64 {
        if let Some(&id) = self.combiners.get(&(combiner, element_type)) {
            return id;
        }
        let scalar = hlo::array_shape(element_type, &[]);
        let mut lhs = instruction(
            fresh_id(&mut self.next_id),
            "parameter",
            element_type,
            &[],
            &[],
        );
        lhs.name = format!("lhs.{}", lhs.id);
        let mut rhs = instruction(
            fresh_id(&mut self.next_id),
            "parameter",
            element_type,
            &[],
            &[],
        );
        rhs.name = format!("rhs.{}", rhs.id);
        rhs.parameter_number = 1;
        let lhs_value = Value {
            id: lhs.id,
            element_type,
            dims: Vec::new(),
        };
        let rhs_value = Value {
            id: rhs.id,
            element_type,
            dims: Vec::new(),
        };
        let mut instructions = vec![lhs, rhs];
        let root_id = match combiner.opcode() {
            Some(opcode) => {
                let root = instruction(
                    fresh_id(&mut self.next_id),
                    opcode,
                    element_type,
                    &[],
                    &[&lhs_value, &rhs_value],
                );
                let id = root.id;
                instructions.push(root);
                id
            }
            None => rhs_value.id,
        };
        let id = fresh_id(&mut self.next_id);
        let name = format!("{combiner:?}_{element_type:?}.{id}").to_lowercase();
        self.computations.push(HloComputationProto {
            name,
            instructions,
            program_shape: Some(ProgramShapeProto {
                parameters: vec![scalar.clone(), scalar.clone()],
                result: Some(scalar),
                parameter_names: vec!["lhs".into(), "rhs".into()],
            }),
            id,
            root_id,
        });
        self.combiners.insert((combiner, element_type), id);
        id
    }

    /// Finishes the module: the entry computation returns a tuple of `outputs`.
    pub fn finish(
        mut self,
        name: &str,
        parameters: Vec<hlo::ShapeProto>,
        outputs: &[Value],
    ) -> hlo::HloModuleProto {
        self.op_name.clear();
        let shapes: Vec<hlo::ShapeProto> = outputs
            .iter()
            .map(|output| hlo::array_shape(output.element_type, &output.dims))
            .collect();
        let result = hlo::tuple_shape(shapes);
        let id = fresh_id(&mut self.next_id);
        let tuple = HloInstructionProto {
            name: format!("tuple.{id}"),
            opcode: "tuple".to_string(),
            shape: Some(result.clone()),
            id,
            operand_ids: outputs.iter().map(|output| output.id).collect(),
            ..Default::default()
        };
        self.instructions.push(tuple);
        let program_shape = ProgramShapeProto {
            parameter_names: (0..parameters.len())
                .map(|number| format!("p{number}"))
                .collect(),
            parameters,
            result: Some(result),
        };
        let entry_id = fresh_id(&mut self.next_id);
        let entry_name = format!("main.{entry_id}");
        self.computations.push(HloComputationProto {
            name: entry_name.clone(),
            instructions: self.instructions,
            program_shape: Some(program_shape.clone()),
            id: entry_id,
            root_id: id,
        });
        hlo::HloModuleProto {
            name: name.to_string(),
            entry_computation_name: entry_name,
            computations: self.computations,
            host_program_shape: Some(program_shape),
            id: 0,
            entry_computation_id: entry_id,
            input_output_alias: None,
            buffer_donor: None,
        }
    }
}

impl Builder {
    /// Sets the dimensions of an already built parameter (scalar packs grow while lowering).
    pub fn resize_parameter(&mut self, parameter: &Value, dims: &[i64]) -> hlo::ShapeProto {
        let shape = hlo::array_shape(parameter.element_type, dims);
        if let Some(instruction) = self
            .instructions
            .iter_mut()
            .find(|instruction| instruction.id == parameter.id)
        {
            instruction.shape = Some(shape.clone());
        }
        shape
    }
}

impl Builder {
    /// Sets the number of an already built parameter.
    pub fn renumber_parameter(&mut self, parameter: &Value, number: i64) {
        if let Some(instruction) = self
            .instructions
            .iter_mut()
            .find(|instruction| instruction.id == parameter.id)
        {
            instruction.parameter_number = number;
            instruction.name = format!("p{number}.{}", instruction.id);
        }
    }
}

impl Builder {
    /// Broadcasts `operand` to `dims` with NumPy rules: dimensions aligned on the right, size-1
    /// dimensions stretched, missing leading dimensions added.
    pub fn broadcast_to(&mut self, operand: &Value, dims: &[i64]) -> Value {
        if operand.dims == dims {
            return operand.clone();
        }
        let offset = dims.len() - operand.rank();
        let kept: Vec<usize> = (0..operand.rank())
            .filter(|&d| operand.dims[d] == dims[d + offset])
            .collect();
        let kept_dims: Vec<i64> = kept.iter().map(|&d| operand.dims[d]).collect();
        let squeezed = self.reshape(operand, &kept_dims);
        let mapping: Vec<i64> = kept.iter().map(|&d| (d + offset) as i64).collect();
        self.broadcast(&squeezed, dims, &mapping)
    }
}

impl Builder {
    /// The running `combiner` of `operand` along `dimension` (inclusive prefix: a window of the
    /// whole dimension, padded before with `init`).
    pub fn cumulative(
        &mut self,
        operand: &Value,
        init: f64,
        dimension: usize,
        combiner: Combiner,
    ) -> Value {
        let axes: Vec<WindowAxis> = operand
            .dims
            .iter()
            .enumerate()
            .map(|(d, &size)| {
                if d == dimension {
                    WindowAxis {
                        padding_low: size - 1,
                        ..WindowAxis::new(size, 1)
                    }
                } else {
                    WindowAxis::new(1, 1)
                }
            })
            .collect();
        self.reduce_window(operand, init, &axes, combiner)
    }
}

/// The window of a convolution or a windowed reduction along one dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WindowAxis {
    pub size: i64,
    pub stride: i64,
    pub padding_low: i64,
    pub padding_high: i64,
    /// Holes between the window's taps, plus one (a dilated kernel).
    pub window_dilation: i64,
    /// Holes between the operand's elements, plus one (a transposed convolution's input).
    pub base_dilation: i64,
}

impl WindowAxis {
    /// A window of `size` moved by `stride`, neither padded nor dilated.
    pub fn new(size: i64, stride: i64) -> Self {
        Self {
            size,
            stride,
            padding_low: 0,
            padding_high: 0,
            window_dilation: 1,
            base_dilation: 1,
        }
    }

    /// The number of window positions over an operand dimension of `length`.
    pub fn positions(&self, length: i64) -> i64 {
        let dilated_base = if length == 0 {
            0
        } else {
            (length - 1) * self.base_dilation + 1
        };
        let padded = dilated_base + self.padding_low + self.padding_high;
        let extent = (self.size - 1) * self.window_dilation + 1;
        if padded < extent {
            0
        } else {
            (padded - extent) / self.stride + 1
        }
    }
}

fn window(axes: &[WindowAxis]) -> Window {
    Window {
        dimensions: axes
            .iter()
            .map(|axis| hlo::WindowDimension {
                size: axis.size,
                stride: axis.stride,
                padding_low: axis.padding_low,
                padding_high: axis.padding_high,
                window_dilation: axis.window_dilation,
                base_dilation: axis.base_dilation,
            })
            .collect(),
    }
}

impl Builder {
    /// A convolution of `input` with `kernel` over the `spatial` windows; `numbers` name the
    /// dimensions, the result has `dims` and the input's type.
    pub fn convolution(
        &mut self,
        input: &Value,
        kernel: &Value,
        spatial: &[WindowAxis],
        numbers: ConvolutionDimensionNumbers,
        groups: (i64, i64),
        dims: &[i64],
    ) -> Value {
        let (feature_groups, batch_groups) = groups;
        let mut instruction = self.op("convolution", input.element_type, dims, &[input, kernel]);
        instruction.window = Some(window(spatial));
        instruction.convolution_dimension_numbers = Some(numbers);
        instruction.feature_group_count = feature_groups;
        instruction.batch_group_count = batch_groups;
        self.push(instruction)
    }

    /// Reduces every window of `operand` (one [`WindowAxis`] per dimension) with `combiner`,
    /// padding with `init`.
    pub fn reduce_window(
        &mut self,
        operand: &Value,
        init: f64,
        axes: &[WindowAxis],
        combiner: Combiner,
    ) -> Value {
        let element_type = operand.element_type;
        let init = self.constant(element_type, init);
        let computation = self.combiner(combiner, element_type);
        let dims: Vec<i64> = axes
            .iter()
            .zip(&operand.dims)
            .map(|(axis, &length)| axis.positions(length))
            .collect();
        let mut instruction = self.op("reduce-window", element_type, &dims, &[operand, &init]);
        instruction.window = Some(window(axes));
        instruction.called_computation_ids = vec![computation];
        self.push(instruction)
    }

    /// Pads every dimension of `operand` with `value`: `(low, high, interior)` elements per
    /// dimension (negative edges cut).
    pub fn pad(&mut self, operand: &Value, value: f64, padding: &[(i64, i64, i64)]) -> Value {
        if padding.iter().all(|&edges| edges == (0, 0, 0)) {
            return operand.clone();
        }
        let fill = self.constant(operand.element_type, value);
        let dims: Vec<i64> = operand
            .dims
            .iter()
            .zip(padding)
            .map(|(&length, &(low, high, interior))| {
                low + high + length + (length - 1).max(0) * interior
            })
            .collect();
        let mut instruction = self.op("pad", operand.element_type, &dims, &[operand, &fill]);
        instruction.padding_config = Some(PaddingConfig {
            dimensions: padding
                .iter()
                .map(|&(edge_padding_low, edge_padding_high, interior_padding)| {
                    PaddingConfigDimension {
                        edge_padding_low,
                        edge_padding_high,
                        interior_padding,
                    }
                })
                .collect(),
        });
        self.push(instruction)
    }
}

impl Builder {
    /// Sorts `keys` along `dimension` in descending (or ascending) order, stably (equal keys
    /// keep their order), carrying `values` (of the same shape) along: the sorted keys and
    /// values.
    pub fn sort(
        &mut self,
        keys: &Value,
        values: &Value,
        dimension: usize,
        descending: bool,
    ) -> (Value, Value) {
        let direction = if descending {
            Direction::Gt
        } else {
            Direction::Lt
        };
        let comparator = self.comparator(direction, keys.element_type, values.element_type);
        let id = fresh_id(&mut self.next_id);
        let mut sort = HloInstructionProto {
            name: format!("sort.{id}"),
            opcode: "sort".to_string(),
            shape: Some(hlo::tuple_shape(vec![
                hlo::array_shape(keys.element_type, &keys.dims),
                hlo::array_shape(values.element_type, &values.dims),
            ])),
            id,
            operand_ids: vec![keys.id, values.id],
            dimensions: vec![dimension as i64],
            called_computation_ids: vec![comparator],
            is_stable: true,
            ..Default::default()
        };
        if !self.op_name.is_empty() {
            sort.metadata = Some(OpMetadata {
                op_type: String::new(),
                op_name: self.op_name.clone(),
            });
        }
        self.instructions.push(sort);
        let mut element = |index: i64, value: &Value| {
            let mut element = self.op("get-tuple-element", value.element_type, &value.dims, &[]);
            element.operand_ids = vec![id];
            element.tuple_index = index;
            self.push(element)
        };
        (element(0, keys), element(1, values))
    }

    /// The comparator `(key a, key b, value a, value b) -> key a <direction> key b` of a sort
    /// (`Gt`: descending, `Lt`: ascending), floats in IEEE's total order.
    fn comparator(
        &mut self,
        direction: Direction,
        key_type: PrimitiveType,
        value_type: PrimitiveType,
    ) -> i64 {
        let types = [key_type, key_type, value_type, value_type];
        let parameters: Vec<HloInstructionProto> = types
            .iter()
            .enumerate()
            .map(|(number, &element_type)| {
                let mut parameter = instruction(
                    fresh_id(&mut self.next_id),
                    "parameter",
                    element_type,
                    &[],
                    &[],
                );
                parameter.parameter_number = number as i64;
                parameter.name = format!("p{number}.{}", parameter.id);
                parameter
            })
            .collect();
        let scalar = |parameter: &HloInstructionProto, element_type| Value {
            id: parameter.id,
            element_type,
            dims: Vec::new(),
        };
        let (a, b) = (
            scalar(&parameters[0], key_type),
            scalar(&parameters[1], key_type),
        );
        let mut root = instruction(
            fresh_id(&mut self.next_id),
            "compare",
            PrimitiveType::Pred,
            &[],
            &[&a, &b],
        );
        root.comparison_direction = direction.name().to_string();
        if matches!(
            key_type,
            PrimitiveType::F16 | PrimitiveType::Bf16 | PrimitiveType::F32 | PrimitiveType::F64
        ) {
            // IEEE's total order, as Burn's reference sorts (`f32::total_cmp`): -NaN < -∞ < … <
            // -0 < +0 < … < +∞ < NaN, so NaN sorts last ascending and first descending.
            root.comparison_type = "TOTALORDER".to_string();
        }
        let root_id = root.id;
        let id = fresh_id(&mut self.next_id);
        let program_shape = ProgramShapeProto {
            parameters: types
                .iter()
                .map(|&element_type| hlo::array_shape(element_type, &[]))
                .collect(),
            result: Some(hlo::array_shape(PrimitiveType::Pred, &[])),
            parameter_names: ["a", "b", "value_a", "value_b"]
                .iter()
                .map(|name| name.to_string())
                .collect(),
        };
        let mut instructions = parameters;
        instructions.push(root);
        self.computations.push(HloComputationProto {
            name: format!("compare.{id}"),
            instructions,
            program_shape: Some(program_shape),
            id,
            root_id,
        });
        id
    }
}

impl Builder {
    /// Reinterprets the bits of `operand` as `element_type` (of the same width).
    pub fn bitcast(&mut self, operand: &Value, element_type: PrimitiveType) -> Value {
        let instruction = self.op(
            "bitcast-convert",
            element_type,
            &operand.dims.clone(),
            &[operand],
        );
        self.push(instruction)
    }

    /// Random `u32` bits of shape `dims` from a Threefry `u64[2]` state.
    pub fn random_bits(&mut self, state: &Value, dims: &[i64]) -> Value {
        let id = fresh_id(&mut self.next_id);
        let shape = hlo::tuple_shape(vec![
            hlo::array_shape(PrimitiveType::U64, &[2]),
            hlo::array_shape(PrimitiveType::U32, dims),
        ]);
        let mut generator = HloInstructionProto {
            name: format!("rng_bit_generator.{id}"),
            opcode: "rng-bit-generator".to_string(),
            shape: Some(shape),
            id,
            operand_ids: vec![state.id],
            rng_algorithm: hlo::RNG_THREE_FRY,
            ..Default::default()
        };
        if !self.op_name.is_empty() {
            generator.metadata = Some(OpMetadata {
                op_type: String::new(),
                op_name: self.op_name.clone(),
            });
        }
        self.instructions.push(generator);
        let mut bits = self.op("get-tuple-element", PrimitiveType::U32, dims, &[]);
        bits.operand_ids = vec![id];
        bits.tuple_index = 1;
        self.push(bits)
    }
}

impl Builder {
    /// A rank-1 `s32` constant holding `values`.
    pub fn constant_s32(&mut self, values: &[i32]) -> Value {
        let literal = LiteralProto {
            s32s: values.to_vec(),
            ..Default::default()
        };
        self.array_constant(PrimitiveType::S32, &[values.len() as i64], literal)
    }

    /// An `f32` constant of shape `dims` holding `values` in row-major order.
    pub fn constant_f32(&mut self, values: &[f32], dims: &[i64]) -> Value {
        let literal = LiteralProto {
            f32s: values.to_vec(),
            ..Default::default()
        };
        self.array_constant(PrimitiveType::F32, dims, literal)
    }

    fn array_constant(
        &mut self,
        element_type: PrimitiveType,
        dims: &[i64],
        mut literal: LiteralProto,
    ) -> Value {
        let mut constant = self.op("constant", element_type, dims, &[]);
        literal.shape = Some(hlo::array_shape(element_type, dims));
        constant.literal = Some(literal);
        self.push(constant)
    }

    /// The index of the replica running the program (`u32[]`).
    pub fn replica_id(&mut self) -> Value {
        let instruction = self.op("replica-id", PrimitiveType::U32, &[], &[]);
        self.push(instruction)
    }

    /// The slice of `sizes` starting at the run-time scalar indices `starts` (one per dimension).
    pub fn dynamic_slice(&mut self, operand: &Value, starts: &[Value], sizes: &[i64]) -> Value {
        let mut operands = vec![operand];
        operands.extend(starts.iter());
        let mut instruction = self.op("dynamic-slice", operand.element_type, sizes, &operands);
        instruction.dynamic_slice_sizes = sizes.to_vec();
        self.push(instruction)
    }

    /// A collective over `groups` of replicas (`all-reduce`, `all-gather`, `reduce-scatter`),
    /// with a fresh channel id and the groups read as global device ids (one partition per
    /// replica, so they are the replica indices). `combiner` reduces, `dimension` gathers or
    /// scatters; the result has `dims`.
    pub fn collective(
        &mut self,
        opcode: &str,
        operand: &Value,
        groups: &[Vec<usize>],
        combiner: Option<Combiner>,
        dimension: Option<usize>,
        dims: &[i64],
    ) -> Value {
        let mut instruction = self.op(opcode, operand.element_type, dims, &[operand]);
        self.last_channel += 1;
        instruction.channel_id = self.last_channel;
        instruction.use_global_device_ids = true;
        instruction.replica_groups = replica_groups(groups);
        if let Some(combiner) = combiner {
            instruction.called_computation_ids =
                vec![self.combiner(combiner, operand.element_type)];
        }
        if let Some(dimension) = dimension {
            instruction.dimensions = vec![dimension as i64];
        }
        self.push(instruction)
    }

    /// An `all-to-all` of `operand` over `groups`, cut and joined along `dimension`.
    ///
    /// Without a channel id or global device ids, for the reason [`Self::collective_permute`]
    /// gives: XLA reads an all-to-all's groups as partition ids when it has a channel id, and as
    /// replica ids without one.
    pub fn all_to_all(
        &mut self,
        operand: &Value,
        groups: &[Vec<usize>],
        dimension: usize,
    ) -> Value {
        let mut instruction = self.op(
            "all-to-all",
            operand.element_type,
            &operand.dims,
            &[operand],
        );
        instruction.replica_groups = replica_groups(groups);
        instruction.dimensions = vec![dimension as i64];
        self.push(instruction)
    }

    /// A `collective-permute` of `operand`: each `(source, target)` pair sends the source
    /// replica's operand to the target replica; a replica that is no target gets zeros.
    ///
    /// Without a channel id, unlike the other collectives: XLA reads the pairs of a
    /// collective-permute with a channel id as partition ids (there is no
    /// `use_global_device_ids` for it), and the program has one partition, so every replica
    /// would be partition 0. Without one they are replica ids, as torch-xla and JAX's `pmap`
    /// emit it.
    pub fn collective_permute(&mut self, operand: &Value, pairs: &[(usize, usize)]) -> Value {
        let mut instruction = self.op(
            "collective-permute",
            operand.element_type,
            &operand.dims,
            &[operand],
        );
        instruction.source_target_pairs = pairs
            .iter()
            .map(|&(source, target)| SourceTarget {
                source: source as i64,
                target: target as i64,
            })
            .collect();
        self.push(instruction)
    }

    /// A call of `target`, a library routine XLA's compiler knows by name (cuDNN's attention),
    /// on `operands` in the layouts given, returning `results`: a `custom-call` with constrained
    /// layouts and the status-returning convention, then each result (`get-tuple-element`).
    pub fn library_call(
        &mut self,
        target: &str,
        operands: &[(Value, LaidOut)],
        results: &[LaidOut],
        backend_config: Vec<u8>,
    ) -> Vec<Value> {
        let values: Vec<&Value> = operands.iter().map(|(value, _)| value).collect();
        let mut call = self.op("custom-call", PrimitiveType::Tuple, &[], &values);
        call.custom_call_target = target.to_string();
        call.backend_config = backend_config;
        call.constrain_layout = true;
        call.operand_shapes_with_layout = operands.iter().map(|(_, laid)| laid.shape()).collect();
        call.custom_call_api_version = hlo::CUSTOM_CALL_STATUS_RETURNING;
        self.tuple_elements(call, results.iter().map(LaidOut::shape).collect())
    }

    /// `call`, an instruction returning the tuple of `elements`, and each of its elements
    /// (`get-tuple-element`, with the element's shape and layout).
    pub(super) fn tuple_elements(
        &mut self,
        mut call: HloInstructionProto,
        elements: Vec<hlo::ShapeProto>,
    ) -> Vec<Value> {
        call.shape = Some(hlo::tuple_shape(elements.clone()));
        let call_id = call.id;
        self.push(call);
        elements
            .into_iter()
            .enumerate()
            .map(|(index, shape)| {
                let element_type =
                    PrimitiveType::try_from(shape.element_type).unwrap_or(PrimitiveType::Invalid);
                let mut element =
                    self.op("get-tuple-element", element_type, &shape.dimensions, &[]);
                element.operand_ids = vec![call_id];
                element.tuple_index = index as i64;
                element.shape = Some(shape);
                self.push(element)
            })
            .collect()
    }

    /// `values` passed through an optimization barrier (`opt-barrier` of their tuple).
    pub fn optimization_barrier(&mut self, values: &[Value]) -> Vec<Value> {
        let shapes: Vec<hlo::ShapeProto> = values
            .iter()
            .map(|value| hlo::array_shape(value.element_type, &value.dims))
            .collect();
        let tuple_id = fresh_id(&mut self.next_id);
        self.instructions.push(HloInstructionProto {
            name: format!("tuple.{tuple_id}"),
            opcode: "tuple".to_string(),
            shape: Some(hlo::tuple_shape(shapes.clone())),
            id: tuple_id,
            operand_ids: values.iter().map(|value| value.id).collect(),
            ..Default::default()
        });
        let mut barrier = self.op("opt-barrier", PrimitiveType::Tuple, &[], &[]);
        barrier.operand_ids = vec![tuple_id];
        self.tuple_elements(barrier, shapes)
    }
}

/// An array a library call takes or returns, in the physical layout the library needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaidOut {
    /// The element type.
    pub element_type: PrimitiveType,
    /// The dimensions, outermost first.
    pub dims: Vec<i64>,
    /// The dimensions from the fastest varying in memory to the slowest.
    pub minor_to_major: Vec<i64>,
}

impl LaidOut {
    /// An array of `dims` in HLO's default layout (the last dimension fastest).
    pub fn row_major(element_type: PrimitiveType, dims: &[i64]) -> Self {
        Self {
            element_type,
            dims: dims.to_vec(),
            minor_to_major: (0..dims.len() as i64).rev().collect(),
        }
    }

    fn shape(&self) -> hlo::ShapeProto {
        let mut shape = hlo::array_shape(self.element_type, &self.dims);
        shape.layout = Some(hlo::LayoutProto {
            minor_to_major: self.minor_to_major.clone(),
        });
        shape
    }
}

/// The kind of an `fft` instruction (`xla.FftType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FftKind {
    /// Real input to the one-sided complex spectrum.
    Real = 2,
    /// The one-sided complex spectrum to real output.
    InverseReal = 3,
}

impl Builder {
    /// A discrete Fourier transform of the last dimension of `operand` (of length `length` in
    /// the transform's time domain); the result has `element_type` and `dims`.
    pub fn fft(
        &mut self,
        operand: &Value,
        kind: FftKind,
        length: i64,
        element_type: PrimitiveType,
        dims: &[i64],
    ) -> Value {
        let mut instruction = self.op("fft", element_type, dims, &[operand]);
        instruction.fft_type = kind as i32;
        instruction.fft_length = vec![length];
        self.push(instruction)
    }

    /// The real (`imaginary` false) or imaginary part of a complex `operand`, as f32.
    pub fn complex_part(&mut self, operand: &Value, imaginary: bool) -> Value {
        let opcode = if imaginary { "imag" } else { "real" };
        let instruction = self.op(opcode, PrimitiveType::F32, &operand.dims, &[operand]);
        self.push(instruction)
    }

    /// The complex numbers `real + i·imaginary` (f32 parts of one shape).
    pub fn complex(&mut self, real: &Value, imaginary: &Value) -> Value {
        let instruction = self.op(
            "complex",
            PrimitiveType::C64,
            &real.dims,
            &[real, imaginary],
        );
        self.push(instruction)
    }
}

/// `groups` of replica indices as HLO's replica groups.
fn replica_groups(groups: &[Vec<usize>]) -> Vec<ReplicaGroup> {
    groups
        .iter()
        .map(|group| ReplicaGroup {
            replica_ids: group.iter().map(|&replica| replica as i64).collect(),
        })
        .collect()
}
