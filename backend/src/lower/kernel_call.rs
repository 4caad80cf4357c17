//! Requests for vendor kernels that a module cannot name by itself.
//!
//! A vendor kernel call (the Neuron SDK's NKI kernels: `AwsNeuronCustomNativeKernel`) carries a
//! configuration that only the vendor's own tracer can write. The lowering therefore leaves a
//! *request* in its place: a custom call with target [`KERNEL_REQUEST_TARGET`] whose backend
//! configuration is a JSON [`KernelRequest`] naming the kernel, its grid, its tensors and its
//! compile-time arguments. The executor that compiles the module replaces every request by the
//! vendor's call before its compiler sees the module (`neuron`: `executor/neuron/kernels.rs`), so
//! the request, not the traced kernel, is what program hashes and compile caches see.

use serde::{Deserialize, Serialize};

use super::builder::{Builder, Value};
use crate::hlo::{self, HloInstructionProto, PrimitiveType};

/// The custom-call target of a kernel request.
pub const KERNEL_REQUEST_TARGET: &str = "HlatKernelRequest";

/// A tensor a kernel takes or returns: its NumPy dtype name and its dimensions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelTensor {
    /// `float32`, `bfloat16`, `float16` or `int32`.
    pub dtype: String,
    /// The dimensions, outermost first.
    pub shape: Vec<i64>,
}

/// What a tracer needs to write a vendor kernel call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelRequest {
    /// The kernel, as the tracer knows it (`flash_fwd`).
    pub kernel: String,
    /// The launch grid (the kernel runs once per index of it).
    pub grid: Vec<i64>,
    /// The tensors the call takes, in operand order.
    pub inputs: Vec<KernelTensor>,
    /// The tensors the call returns, in order (several: a tuple).
    pub outputs: Vec<KernelTensor>,
    /// The kernel's compile-time arguments, by name.
    pub arguments: serde_json::Map<String, serde_json::Value>,
}

/// The element types a kernel can take, with their NumPy names.
const NUMPY_DTYPES: [(PrimitiveType, &str); 4] = [
    (PrimitiveType::F32, "float32"),
    (PrimitiveType::Bf16, "bfloat16"),
    (PrimitiveType::F16, "float16"),
    (PrimitiveType::S32, "int32"),
];

/// The NumPy name of an element type a kernel can take.
pub(crate) fn numpy_dtype(element_type: PrimitiveType) -> Option<&'static str> {
    NUMPY_DTYPES
        .iter()
        .find(|(known, _)| *known == element_type)
        .map(|(_, name)| *name)
}

impl KernelTensor {
    /// The kernel tensor of a lowered value, if the kernel interface has its element type.
    pub(crate) fn of(value: &Value) -> Option<Self> {
        Some(Self {
            dtype: numpy_dtype(value.element_type)?.to_string(),
            shape: value.dims.clone(),
        })
    }
}

impl KernelRequest {
    /// A request for `kernel` launched over `grid`, on `inputs`, returning `outputs`, with the
    /// compile-time `arguments` (a JSON object).
    ///
    /// # Panics
    /// When `arguments` is not a JSON object.
    pub fn new(
        kernel: &str,
        grid: Vec<i64>,
        inputs: Vec<KernelTensor>,
        outputs: Vec<KernelTensor>,
        arguments: serde_json::Value,
    ) -> Self {
        let serde_json::Value::Object(arguments) = arguments else {
            panic!("a kernel's arguments are a JSON object, not {arguments}");
        };
        Self {
            kernel: kernel.to_string(),
            grid,
            inputs,
            outputs,
            arguments,
        }
    }

    /// The request an instruction carries, if it is one.
    pub fn of_instruction(instruction: &HloInstructionProto) -> Option<Result<Self, String>> {
        (instruction.opcode == "custom-call"
            && instruction.custom_call_target == KERNEL_REQUEST_TARGET)
            .then(|| {
                serde_json::from_slice(&instruction.backend_config).map_err(|error| {
                    format!(
                        "kernel request {} has an unreadable configuration: {error}",
                        instruction.name
                    )
                })
            })
    }
}

impl KernelTensor {
    /// The element type of this tensor's NumPy dtype.
    fn element_type(&self) -> PrimitiveType {
        NUMPY_DTYPES
            .iter()
            .find(|(_, name)| *name == self.dtype)
            .map_or(PrimitiveType::Invalid, |(known, _)| *known)
    }
}

impl Builder {
    /// A kernel request on `operands` returning the request's outputs (see the module
    /// documentation): one output is the call itself, several are a tuple's elements.
    pub fn kernel_request(&mut self, request: &KernelRequest, operands: &[&Value]) -> Vec<Value> {
        let array = |tensor: &KernelTensor| hlo::array_shape(tensor.element_type(), &tensor.shape);
        let first = &request.outputs[0];
        let mut instruction = self.op("custom-call", first.element_type(), &first.shape, operands);
        instruction.custom_call_target = KERNEL_REQUEST_TARGET.to_string();
        instruction.backend_config =
            serde_json::to_vec(request).expect("a kernel request is plain JSON");
        if let [_] = request.outputs.as_slice() {
            return vec![self.push(instruction)];
        }
        let elements = request.outputs.iter().map(array).collect();
        self.tuple_elements(instruction, elements)
    }
}
