//! The merge methods, each with mergekit's parameters, defaults and rules on its inputs.

use serde::Deserialize;

/// How tensors are combined: every method of mergekit 0.1.5 except `ram` and `ramplus_tl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MergeMethod {
    /// `Σ wᵢ θᵢ`, divided by `Σ wᵢ` with `normalize` (default true).
    Linear,
    /// Spherical interpolation from the base model (`t` = 0) to the other model (`t` = 1).
    Slerp,
    /// SLERP of two models (or of their differences from a base) at `t = w₂ / (w₁ + w₂)`, over
    /// the flattened tensor, its rows or its columns.
    Nuslerp,
    /// Barycentric interpolation of any number of models on the hypersphere.
    Multislerp,
    /// The weighted Karcher (Riemannian) mean of every input's direction, scaled by their mean
    /// norm.
    Karcher,
    /// Model Stock: the base moved towards the average by a factor set by the angle between the
    /// models' differences.
    ModelStock,
    /// `base + λ · Σ wᵢ (θᵢ − base)` (divided by `Σ wᵢ` with `normalize`, default false).
    TaskArithmetic,
    /// Task arithmetic over the `density` largest-magnitude differences of each model, with the
    /// signs elected per element (`normalize` default true).
    Ties,
    /// TIES with each difference kept at random with probability `density`, rescaled.
    DareTies,
    /// Task arithmetic with each difference kept at random with probability `density`, rescaled.
    DareLinear,
    /// Task arithmetic over the differences left after dropping the `gamma` fraction of largest
    /// magnitude and the smallest ones, down to `density`.
    Breadcrumbs,
    /// Breadcrumbs with TIES' sign election.
    BreadcrumbsTies,
    /// TIES with each difference kept at random with a probability that grows with its
    /// magnitude rank (`density` ± `epsilon`), rescaled.
    Della,
    /// DELLA's random pruning without sign election.
    DellaLinear,
    /// Select (by variance across models), calculate (weights from the differences' energy),
    /// erase (sign election).
    Sce,
    /// Takes the other model's value where it lies within `t` of the base's, moving towards it
    /// by `t / |a − b|` elsewhere.
    Nearswap,
    /// Keeps the other model's differences whose importance (size times the divergence of the
    /// rows' softmax) is an outlier.
    ArceeFusion,
    /// Copies one model's tensors (multiplied by `scale` when given): with `slices`, layers are
    /// stacked or dropped.
    Passthrough,
}

/// The value type of a parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParameterKind {
    /// A number.
    Float,
    /// A whole number.
    Integer,
    /// `true` or `false`.
    Flag,
}

/// Which inputs a parameter is given for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParameterScope {
    /// One value for the tensor.
    Shared,
    /// One value per input model, the base included.
    Input,
    /// One value per input model other than the base.
    NonBase,
}

/// The default of a parameter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ParameterDefault {
    /// The parameter must be given.
    Required,
    /// Absent unless given (`passthrough`'s `scale`).
    Unset,
    /// This number.
    Number(f64),
    /// This flag.
    Flag(bool),
}

/// A parameter a method reads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ParameterSpec {
    /// Its name in the YAML.
    pub name: &'static str,
    /// Its value type.
    pub kind: ParameterKind,
    /// Which inputs it is given for.
    pub scope: ParameterScope,
    /// Its default.
    pub default: ParameterDefault,
}

/// What a method does with the base model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BasePolicy {
    /// The base must be one of the inputs.
    Required,
    /// The base, when given, must be one of the inputs; it may be absent.
    Optional,
    /// The base is one input like the others.
    Ignored,
}

/// The inputs a method accepts for one tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputContract {
    /// What it does with the base model.
    pub base: BasePolicy,
    /// The fewest inputs (the base included).
    pub min_inputs: usize,
    /// The most inputs (the base included).
    pub max_inputs: Option<usize>,
    /// The fewest and most inputs other than the base.
    pub non_base: Option<(usize, Option<usize>)>,
}

const fn parameter(
    name: &'static str,
    kind: ParameterKind,
    scope: ParameterScope,
    default: ParameterDefault,
) -> ParameterSpec {
    ParameterSpec {
        name,
        kind,
        scope,
        default,
    }
}

use ParameterDefault::{Flag as FlagDefault, Number, Required, Unset};
use ParameterKind::{Flag, Float, Integer};
use ParameterScope::{Input, NonBase, Shared};

const WEIGHT_PER_NON_BASE: ParameterSpec = parameter("weight", Float, NonBase, Required);
const INT8_MASK: ParameterSpec = parameter("int8_mask", Flag, Shared, FlagDefault(false));

impl MergeMethod {
    /// Every method, in the order of the enum.
    pub const ALL: [MergeMethod; 18] = [
        MergeMethod::Linear,
        MergeMethod::Slerp,
        MergeMethod::Nuslerp,
        MergeMethod::Multislerp,
        MergeMethod::Karcher,
        MergeMethod::ModelStock,
        MergeMethod::TaskArithmetic,
        MergeMethod::Ties,
        MergeMethod::DareTies,
        MergeMethod::DareLinear,
        MergeMethod::Breadcrumbs,
        MergeMethod::BreadcrumbsTies,
        MergeMethod::Della,
        MergeMethod::DellaLinear,
        MergeMethod::Sce,
        MergeMethod::Nearswap,
        MergeMethod::ArceeFusion,
        MergeMethod::Passthrough,
    ];

    /// The name mergekit gives the method.
    pub fn name(self) -> &'static str {
        match self {
            MergeMethod::Linear => "linear",
            MergeMethod::Slerp => "slerp",
            MergeMethod::Nuslerp => "nuslerp",
            MergeMethod::Multislerp => "multislerp",
            MergeMethod::Karcher => "karcher",
            MergeMethod::ModelStock => "model_stock",
            MergeMethod::TaskArithmetic => "task_arithmetic",
            MergeMethod::Ties => "ties",
            MergeMethod::DareTies => "dare_ties",
            MergeMethod::DareLinear => "dare_linear",
            MergeMethod::Breadcrumbs => "breadcrumbs",
            MergeMethod::BreadcrumbsTies => "breadcrumbs_ties",
            MergeMethod::Della => "della",
            MergeMethod::DellaLinear => "della_linear",
            MergeMethod::Sce => "sce",
            MergeMethod::Nearswap => "nearswap",
            MergeMethod::ArceeFusion => "arcee_fusion",
            MergeMethod::Passthrough => "passthrough",
        }
    }

    /// The parameters the method reads, with mergekit's defaults.
    pub fn parameters(self) -> Vec<ParameterSpec> {
        match self {
            MergeMethod::Linear => vec![
                parameter("weight", Float, Input, Required),
                parameter("normalize", Flag, Shared, FlagDefault(true)),
            ],
            MergeMethod::Slerp => vec![parameter("t", Float, Shared, Required)],
            MergeMethod::Nuslerp => vec![
                WEIGHT_PER_NON_BASE,
                parameter("nuslerp_row_wise", Flag, Shared, FlagDefault(false)),
                parameter("nuslerp_flatten", Flag, Shared, FlagDefault(true)),
            ],
            MergeMethod::Multislerp => vec![
                WEIGHT_PER_NON_BASE,
                parameter("normalize_weights", Flag, Shared, FlagDefault(true)),
                parameter("eps", Float, Shared, Number(1e-8)),
            ],
            MergeMethod::Karcher => vec![
                parameter("max_iter", Integer, Shared, Number(10.0)),
                parameter("tol", Float, Shared, Number(1e-5)),
            ],
            MergeMethod::ModelStock => {
                vec![parameter("filter_wise", Flag, Shared, FlagDefault(false))]
            }
            MergeMethod::Sce => vec![
                INT8_MASK,
                parameter("select_topk", Float, Shared, Number(1.0)),
            ],
            MergeMethod::Nearswap => vec![parameter("t", Float, Shared, Required)],
            MergeMethod::ArceeFusion => Vec::new(),
            MergeMethod::Passthrough => vec![parameter("scale", Float, Input, Unset)],
            task_arithmetic => {
                let options = task_arithmetic
                    .task_arithmetic()
                    .expect("the other methods are matched above");
                let mut parameters = vec![
                    INT8_MASK,
                    parameter("normalize", Flag, Shared, FlagDefault(options.normalize)),
                    parameter("rescale", Flag, Shared, FlagDefault(options.rescale)),
                    parameter("lambda", Float, Shared, Number(1.0)),
                    WEIGHT_PER_NON_BASE,
                    parameter("density", Float, NonBase, Number(1.0)),
                ];
                match options.sparsification {
                    Some(Sparsification::MagnitudeOutliers) => {
                        parameters.push(parameter("gamma", Float, NonBase, Number(0.01)))
                    }
                    Some(Sparsification::RankedRandom) => {
                        parameters.push(parameter("epsilon", Float, NonBase, Number(0.15)))
                    }
                    _ => {}
                }
                parameters
            }
        }
    }

    /// The inputs the method accepts for one tensor.
    pub fn contract(self) -> InputContract {
        let contract = |base, min_inputs, max_inputs, non_base| InputContract {
            base,
            min_inputs,
            max_inputs,
            non_base,
        };
        match self {
            MergeMethod::Linear | MergeMethod::Karcher => {
                contract(BasePolicy::Ignored, 1, None, None)
            }
            MergeMethod::Passthrough => contract(BasePolicy::Ignored, 1, Some(1), None),
            MergeMethod::Slerp | MergeMethod::Nearswap | MergeMethod::ArceeFusion => {
                contract(BasePolicy::Required, 2, Some(2), None)
            }
            MergeMethod::Nuslerp => contract(BasePolicy::Optional, 1, None, Some((2, Some(2)))),
            MergeMethod::Multislerp => contract(BasePolicy::Optional, 1, None, Some((1, None))),
            MergeMethod::ModelStock => contract(BasePolicy::Required, 3, None, None),
            _ => contract(BasePolicy::Required, 1, None, None),
        }
    }

    /// The options of a method of the task-arithmetic family, `None` for the others.
    pub fn task_arithmetic(self) -> Option<TaskArithmeticOptions> {
        let options = |sparsification, sign_consensus, normalize, rescale| {
            Some(TaskArithmeticOptions {
                sparsification,
                sign_consensus,
                normalize,
                rescale,
            })
        };
        match self {
            MergeMethod::TaskArithmetic => options(None, false, false, false),
            MergeMethod::Ties => options(Some(Sparsification::Magnitude), true, true, false),
            MergeMethod::DareTies => options(Some(Sparsification::Random), true, false, true),
            MergeMethod::DareLinear => options(Some(Sparsification::Random), false, false, true),
            MergeMethod::Breadcrumbs => {
                options(Some(Sparsification::MagnitudeOutliers), false, false, false)
            }
            MergeMethod::BreadcrumbsTies => {
                options(Some(Sparsification::MagnitudeOutliers), true, false, false)
            }
            MergeMethod::Della => options(Some(Sparsification::RankedRandom), true, true, true),
            MergeMethod::DellaLinear => {
                options(Some(Sparsification::RankedRandom), false, false, true)
            }
            _ => None,
        }
    }

    /// Whether the method draws random numbers (its output then follows hlat's seed rule, not
    /// mergekit's generator).
    pub fn is_random(self) -> bool {
        self.task_arithmetic()
            .and_then(|options| options.sparsification)
            .is_some_and(|sparsification| {
                matches!(
                    sparsification,
                    Sparsification::Random | Sparsification::RankedRandom
                )
            })
    }
}

/// Which differences a task-arithmetic method keeps (mergekit's `sparsify`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sparsification {
    /// The `density` fraction of largest magnitude (TIES).
    Magnitude,
    /// Each one with probability `density` (DARE).
    Random,
    /// The `density` fraction below the `gamma` fraction of largest magnitude (breadcrumbs).
    MagnitudeOutliers,
    /// Each one with a probability from `density − epsilon` (smallest magnitude of its row) to
    /// `density + epsilon` (largest) (DELLA).
    RankedRandom,
}

/// The fixed options of a task-arithmetic method; `normalize` and `rescale` are the defaults of
/// the parameters of the same names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskArithmeticOptions {
    /// Which differences are kept, if not all.
    pub sparsification: Option<Sparsification>,
    /// Whether each element keeps only the differences whose sign agrees with the sign of their
    /// weighted sum (TIES' sign election).
    pub sign_consensus: bool,
    /// The default of `normalize`.
    pub normalize: bool,
    /// The default of `rescale`.
    pub rescale: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_is_listed_once_under_the_name_its_configuration_uses() {
        let mut names: Vec<&str> = MergeMethod::ALL
            .iter()
            .map(|method| method.name())
            .collect();
        for method in MergeMethod::ALL {
            let parsed: MergeMethod =
                serde_json::from_value(serde_json::Value::from(method.name())).unwrap();
            assert_eq!(parsed, method);
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), MergeMethod::ALL.len());
    }
}
