//! A model cut into pipeline stages and joined again, and the per-replica choice of a chunk's
//! layers.

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::{Bool, Tensor};
use burn_trainium::collective;

use super::PipelineParallel;
use crate::block::DecoderLayer;
use crate::model::Hlat;

impl Hlat {
    /// This model, identical on every replica, cut into the stages of `pipeline`: each replica
    /// keeps the layers of its stage in its slots (padding slots all zeros), as new leaves that
    /// require a gradient as the parameters did. The embedding, final norm and head stay on
    /// every replica.
    ///
    /// Slots hold the same kind of layer on every stage: a layer of sliding-window attention and
    /// one of full attention, or a dense layer and a mixture of experts, cannot share a slot (an
    /// error names them). A slot that no stage fills is all zeros everywhere; a mixture's stages
    /// must have no such slot (its router would join the load-balancing loss).
    pub fn into_stages(self, pipeline: &PipelineParallel) -> Result<Self, String> {
        let stages = pipeline.stages();
        let mut layers = Vec::with_capacity(pipeline.local_layers());
        for slot in 0..pipeline.local_layers() {
            let held: Vec<Option<usize>> = (0..stages)
                .map(|stage| pipeline.layer_at(stage, slot))
                .collect();
            // A slot no stage fills (chunks of uneven length) is padding everywhere.
            let template = &self.layers[held.iter().flatten().next().copied().unwrap_or(0)];
            let mixture = self.config().moe.is_some();
            if mixture && held.iter().any(Option::is_none) {
                return Err(format!(
                    "slot {slot} is padding on some stages: the load-balancing loss of a \
                     mixture of experts would count a padding layer's router; choose stages of \
                     equal length (--pp-layers, or a number of layers the stages divide)"
                ));
            }
            for (stage, layer) in held.iter().enumerate() {
                if let Some(layer) = *layer {
                    let sparse = self.layers[layer].moe.is_some();
                    if sparse != template.moe.is_some() {
                        let kind = |sparse| {
                            if sparse {
                                "a mixture of experts"
                            } else {
                                "dense"
                            }
                        };
                        return Err(format!(
                            "layer {layer} (stage {stage}) is {} where the other stages' layers \
                             in its slot are {}: choose --pp-layers so that each slot holds one \
                             kind of layer",
                            kind(sparse),
                            kind(template.moe.is_some())
                        ));
                    }
                    let window = self.layers[layer].self_attn.sliding_window;
                    if window != template.self_attn.sliding_window {
                        return Err(format!(
                            "layer {layer} (stage {stage}) attends with sliding window {window:?} \
                             where the other stages' layers in its slot use {:?}: choose \
                             --pp-layers so that each slot holds one kind of attention",
                            template.self_attn.sliding_window
                        ));
                    }
                }
            }
            let candidates: Vec<Vec<Tensor<1>>> = held
                .iter()
                .map(|layer| match layer {
                    Some(layer) => flat_parameters(&self.layers[*layer]),
                    None => flat_parameters(template)
                        .into_iter()
                        .map(|flat| flat.zeros_like())
                        .collect(),
                })
                .collect();
            let values = (0..candidates[0].len())
                .map(|index| {
                    let stacked = Tensor::stack::<2>(
                        candidates.iter().map(|c| c[index].clone()).collect(),
                        0,
                    );
                    collective::split(stacked, 0, &pipeline.groups).flatten::<1>(0, 1)
                })
                .collect();
            layers.push(replace_parameters(template.clone(), values, Leaves::Fresh));
        }
        Ok(self.with_layers(layers))
    }

    /// The whole model again from the stages of `pipeline` (the inverse of
    /// [`Hlat::into_stages`]), on every replica.
    pub fn from_stages(self, pipeline: &PipelineParallel) -> Self {
        let num_layers = self.config().num_layers;
        let mut layers: Vec<Option<DecoderLayer>> = (0..num_layers).map(|_| None).collect();
        for (slot, layer) in self.layers.iter().enumerate() {
            let gathered: Vec<Tensor<2>> = flat_parameters(layer)
                .into_iter()
                .map(|flat| collective::all_gather(flat.unsqueeze::<2>(), 0, &pipeline.groups))
                .collect();
            for stage in 0..pipeline.stages() {
                if let Some(index) = pipeline.layer_at(stage, slot) {
                    let values = gathered
                        .iter()
                        .map(|all| all.clone().narrow(0, stage, 1).flatten::<1>(0, 1))
                        .collect();
                    layers[index] = Some(replace_parameters(layer.clone(), values, Leaves::Fresh));
                }
            }
        }
        let layers = layers
            .into_iter()
            .map(|layer| layer.expect("every layer is held by one stage"))
            .collect();
        self.with_layers(layers)
    }
}

/// For each slot of a chunk, the layer of the chunk `chunks[r]` says on each replica: `layers`
/// holds `chunks.len()` chunks of `slots` slots, `chunks[v]` is true on the replicas that take
/// chunk `v` (exactly one per replica). The chosen parameters keep their graph, so gradients
/// reach the slots they were chosen from.
pub(crate) fn choose_chunk(
    layers: &[DecoderLayer],
    chunks: &[Tensor<1, Bool>],
) -> Vec<DecoderLayer> {
    let slots = layers.len() / chunks.len();
    (0..slots)
        .map(|slot| {
            let candidates: Vec<Vec<Tensor<1>>> = (0..chunks.len())
                .map(|chunk| flat_parameters(&layers[chunk * slots + slot]))
                .collect();
            let values = (0..candidates[0].len())
                .map(|index| {
                    let mut chosen = candidates[0][index].clone();
                    for (candidate, mask) in candidates.iter().zip(chunks).skip(1) {
                        let mask = mask.clone().expand(chosen.dims());
                        chosen = chosen.mask_where(mask, candidate[index].clone());
                    }
                    chosen
                })
                .collect();
            replace_parameters(layers[slot].clone(), values, Leaves::Derived)
        })
        .collect()
}

/// Every float parameter of `module`, flattened, in visiting order.
fn flat_parameters<M: Module>(module: &M) -> Vec<Tensor<1>> {
    struct Flatten(Vec<Tensor<1>>);
    impl ModuleVisitor for Flatten {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0.push(param.val().flatten(0, D - 1));
        }
    }
    let mut flatten = Flatten(Vec::new());
    module.visit(&mut flatten);
    flatten.0
}

/// What the replaced parameters become.
#[derive(Clone, Copy)]
enum Leaves {
    /// New leaves of the autodiff graph, with new ids, requiring a gradient as the parameters
    /// they replace did.
    Fresh,
    /// The values as they are (computed from other parameters, keeping their graph).
    Derived,
}

/// `module` with its float parameters replaced, in visiting order, by `values` (flattened).
fn replace_parameters<M: Module>(module: M, values: Vec<Tensor<1>>, leaves: Leaves) -> M {
    struct Replace {
        values: std::vec::IntoIter<Tensor<1>>,
        leaves: Leaves,
    }
    impl ModuleMapper for Replace {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
            let require_grad = param.val().is_require_grad();
            let shape = param.shape();
            let (id, _, mapper) = param.consume();
            let value: Tensor<D> = self
                .values
                .next()
                .expect("one value per parameter")
                .reshape(shape);
            match self.leaves {
                Leaves::Fresh => Param::from_mapped_value(
                    ParamId::new(),
                    value.detach().set_require_grad(require_grad),
                    mapper,
                ),
                Leaves::Derived => Param::from_mapped_value(id, value, mapper),
            }
        }
    }
    module.map(&mut Replace {
        values: values.into_iter(),
        leaves,
    })
}
