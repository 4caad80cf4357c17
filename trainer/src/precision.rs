//! Precision modes: what dtype the parameters are stored in and the forward pass runs in.

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::{DType, Tensor};
use serde::{Deserialize, Serialize};

/// How parameters are stored, updated and used in the forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Precision {
    /// f32 parameters, optimizer state and compute.
    #[serde(rename = "f32")]
    F32,
    /// bf16 parameters and compute; the update is computed in f32 against f32 optimizer state
    /// and rounded stochastically to bf16 (HLAT-7B).
    #[serde(rename = "bf16-sr")]
    Bf16StochasticRounding,
    /// f32 master parameters and optimizer state; the forward and backward passes run on a bf16
    /// copy (HLAT-70B).
    #[serde(rename = "bf16-mixed")]
    Bf16Mixed,
}

impl Precision {
    /// The dtype parameters are stored in.
    pub fn param_dtype(self) -> DType {
        match self {
            Precision::F32 | Precision::Bf16Mixed => DType::F32,
            Precision::Bf16StochasticRounding => DType::BF16,
        }
    }

    /// The dtype the forward pass casts the parameters to, when it differs from storage.
    pub fn compute_cast(self) -> Option<DType> {
        match self {
            Precision::Bf16Mixed => Some(DType::BF16),
            Precision::F32 | Precision::Bf16StochasticRounding => None,
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name {
            "f32" => Ok(Precision::F32),
            "bf16-sr" => Ok(Precision::Bf16StochasticRounding),
            "bf16-mixed" => Ok(Precision::Bf16Mixed),
            other => Err(format!(
                "unknown precision `{other}` (expected f32, bf16-sr or bf16-mixed)"
            )),
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Precision::F32 => "f32",
            Precision::Bf16StochasticRounding => "bf16-sr",
            Precision::Bf16Mixed => "bf16-mixed",
        })
    }
}

/// Casts every float parameter of `module` to `dtype`, keeping parameters that require a
/// gradient as fresh leaves of the autodiff graph (used once, when a run sets up its precision).
pub fn cast_params<M: Module>(module: M, dtype: DType) -> M {
    module.map(&mut CastLeaves { dtype })
}

struct CastLeaves {
    dtype: DType,
}

impl ModuleMapper for CastLeaves {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (id, tensor, mapper) = param.consume();
        if tensor.dtype() == self.dtype {
            return Param::from_mapped_value(id, tensor, mapper);
        }
        let require_grad = tensor.is_require_grad();
        let cast = tensor
            .cast(self.dtype)
            .detach()
            .set_require_grad(require_grad);
        Param::from_mapped_value(id, cast, mapper)
    }
}
