//! How many bytes one device holds to train a model in a parallel layout (`hlat info`): the
//! parameters, gradients and AdamW state counted exactly as the trainer shards them, and the
//! activations kept for the backward pass estimated from the model's shapes.

use hlat::HlatConfig;
use hlat::blocked_attention::{ATTENTION_BLOCK, attends_by_block};
use hlat::lora::{LoraConfig, LoraTarget};
use hlat::parallel::{Placement, kv_copies, placement_with};
use hlat::recompute::ActivationCheckpointing;

use super::ParallelLayout;
use crate::precision::Precision;

/// The shape of one training step on one device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepShape {
    /// Tokens per row.
    pub seq_len: usize,
    /// Rows per micro-batch on each data-parallel replica.
    pub micro_batch_rows: usize,
    /// Parameter and compute precision.
    pub precision: Precision,
    /// What the backward pass recomputes.
    pub checkpointing: ActivationCheckpointing,
    /// The pipeline stages of the layout, when it has several.
    pub pipeline: Option<PipelineShape>,
    /// LoRA adapters on frozen weights, when the step trains those alone.
    pub lora: Option<LoraShape>,
    /// A mixture of experts' capacity factor (`--moe-capacity-factor`); `None`: dropless.
    pub moe_capacity_factor: Option<f64>,
}

/// LoRA adapters as memory sees them: their rank and the projections they adapt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoraShape {
    /// The rank `r` of every adapter.
    pub rank: usize,
    /// Which of [`LoraTarget::ALL`] are adapted.
    pub targets: [bool; 7],
}

impl LoraShape {
    /// The shape of `lora`'s adapters.
    pub fn of(lora: &LoraConfig) -> Self {
        Self {
            rank: lora.rank,
            targets: LoraTarget::ALL.map(|target| lora.targets.contains(&target)),
        }
    }

    /// Whether the projection module `module` (`q_proj`, …) is adapted.
    fn adapts(&self, module: &str) -> bool {
        LoraTarget::ALL
            .iter()
            .zip(self.targets)
            .any(|(target, adapted)| adapted && target.module_name() == module)
    }
}

/// A pipeline stage as one device holds it (every stage holds the same slots: one SPMD program).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipelineShape {
    /// Decoder-layer slots on the device (the most layers of any stage, padded, × the chunks).
    pub layer_slots: usize,
    /// Chunks per stage (the interleaved schedule above 1).
    pub virtual_stages: usize,
    /// Micro-batches per optimizer step.
    pub micro_batches: usize,
}

impl PipelineShape {
    /// The chunk inputs a stage keeps at most between their forward and backward passes: the
    /// schedule's ring of `2pV - 1` slots, fewer when the step has fewer forward ticks.
    pub fn kept_inputs(&self, stages: usize) -> usize {
        let ring = hlat::pipeline::Schedule::ring_slots(stages, self.virtual_stages);
        ring.min(self.micro_batches * self.virtual_stages + stages - 1)
    }
}

/// Bytes held by one device, by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMemory {
    /// Parameter elements on the device (its tensor-parallel shard of the model, and the
    /// adapters under LoRA).
    pub parameters_per_device: u64,
    /// The elements of those that train (all of them, or the LoRA adapters alone).
    pub trainable_per_device: u64,
    /// The parameters (and, in mixed precision, their bf16 compute copy).
    pub parameter_bytes: u64,
    /// One gradient per parameter, in the parameters' dtype.
    pub gradient_bytes: u64,
    /// The AdamW moments (two f32 per element; a `1/dp` slice of each parameter under ZeRO-1
    /// and fully sharded data parallelism).
    pub optimizer_bytes: u64,
    /// Under fully sharded data parallelism, the whole weights gathered during a step (in the
    /// compute dtype): the largest layer (or embedding, or head) at a time with full activation
    /// checkpointing, else every layer's, which the backward pass keeps; 0 otherwise.
    pub gathered_bytes: u64,
    /// Activations kept for the backward pass of one micro-batch (an estimate).
    pub activation_bytes: u64,
}

impl DeviceMemory {
    /// The memory of one device training `config` in `layout` with steps of `shape`.
    pub fn estimate(config: &HlatConfig, layout: &ParallelLayout, shape: &StepShape) -> Self {
        let tensor = layout.tensor as u64;
        // ZeRO-1 slices each moment over the data-parallel group, a split expert's over the
        // replicas holding the same experts; fully sharded data parallelism slices the
        // parameters, their gradients and their moments over it.
        let zero_degree = if layout.zero1 || layout.fsdp {
            layout.data as u64
        } else {
            1
        };
        let fsdp_degree = if layout.fsdp { layout.data as u64 } else { 1 };
        let expert_zero_degree = if layout.zero1 {
            (layout.data / layout.expert) as u64
        } else {
            1
        };
        // Each parameter's elements on one device: split ones divided by the tensor degree;
        // replicated KV heads are counted once per holder (each rank holds one head's columns).
        let copies = kv_copies(config.num_kv_heads, layout.tensor);
        // Under pipeline parallelism each device holds its stage's layer slots (every stage the
        // same number) and, as every stage, the embedding, final norm and head.
        let layer_slots = shape.pipeline.map(|pipeline| pipeline.layer_slots as u64);
        // The elements a device holds of `per_device` elements at `path` in every layer: under
        // pipeline parallelism, layer 0's for each of its stage's slots.
        let held = |path: &[String], per_device: u64| match (
            layer_slots,
            path.first().map(String::as_str),
            path.get(1),
        ) {
            (Some(slots), Some("layers"), Some(index)) => {
                (index == "0").then_some(per_device * slots)
            }
            _ => Some(per_device),
        };
        // Elements per device of each parameter, with the ranks its moments are sliced over and
        // the part of the model it is gathered with under fully sharded data parallelism.
        let parameters: Vec<Held> = hlat::hf::tensor_specs(config)
            .filter_map(|spec| {
                let elements = hlat::element_count(&spec.hf_shape);
                let path: Vec<String> = spec.burn_path.split('.').map(str::to_string).collect();
                let per_device = match placement_with(&path, copies) {
                    Placement::Split(_) => elements / tensor,
                    Placement::ReplicatedHeads { copies, .. } => elements * copies as u64 / tensor,
                    Placement::Replicated => elements,
                };
                // Each expert-parallel rank holds its share of the experts.
                let (per_device, sliced_over) = match hlat::expert_parallel::expert_of(&path) {
                    Some(_) => (per_device / layout.expert as u64, expert_zero_degree),
                    None => (per_device, zero_degree),
                };
                held(&path, per_device).map(|held| Held::new(held, sliced_over, &path, layer_slots))
            })
            .collect();
        // LoRA: the adapters alone train (A `[r, in]`, B `[out, r]`, split as their projection:
        // B with a column-parallel one's outputs, A with a row-parallel one's inputs). In a
        // mixture the MLP targets adapt the experts alone, and an expert's gate and up
        // projections share one A (PEFT's fused `gate_up_proj`).
        let mixture = config.moe.is_some();
        let adapters: Vec<Held> = match shape.lora {
            None => Vec::new(),
            Some(lora) => hlat::hf::tensor_specs(config)
                .filter_map(|spec| {
                    let path: Vec<String> = spec.burn_path.split('.').map(str::to_string).collect();
                    let module = path.iter().rev().nth(1)?;
                    if path.last()? != "weight" || !lora.adapts(module) {
                        return None;
                    }
                    let expert = hlat::expert_parallel::expert_of(&path).is_some();
                    let mlp = matches!(module.as_str(), "gate_proj" | "up_proj" | "down_proj");
                    if mixture && mlp && !expert {
                        return None;
                    }
                    let [out, input] = [spec.hf_shape[0] as u64, spec.hf_shape[1] as u64];
                    let rank = lora.rank as u64;
                    let (a, b) = match placement_with(&path, copies) {
                        Placement::Split(0) => (rank * input / tensor, out * rank),
                        Placement::Split(_) => (rank * input, out / tensor * rank),
                        Placement::ReplicatedHeads { copies, .. } => {
                            (rank * input, out * copies as u64 / tensor * rank)
                        }
                        Placement::Replicated => (rank * input, out * rank),
                    };
                    let elements = if expert && module == "up_proj" {
                        b
                    } else {
                        a + b
                    };
                    let (per_device, sliced_over) = if expert {
                        (elements / layout.expert as u64, expert_zero_degree)
                    } else {
                        (elements, zero_degree)
                    };
                    held(&path, per_device)
                        .map(|held| Held::new(held, sliced_over, &path, layer_slots))
                })
                .collect(),
        };
        let trainable = if shape.lora.is_some() {
            &adapters
        } else {
            &parameters
        };
        // What a device keeps: under fully sharded data parallelism, its slice of each.
        let elements = |entries: &[Held]| {
            entries
                .iter()
                .map(|held| held.elements.div_ceil(fsdp_degree))
                .sum::<u64>()
        };
        let trainable_per_device = elements(trainable);
        let parameters_per_device = elements(&parameters) + elements(&adapters);
        let stored = shape.precision.param_dtype().size() as u64;
        let compute = shape
            .precision
            .compute_cast()
            .map_or(stored, |dtype| dtype.size() as u64);
        let compute_copy = if compute != stored { compute } else { 0 };
        let moments: u64 = trainable
            .iter()
            .map(|held| 2 * 4 * held.elements.div_ceil(held.sliced_over))
            .sum();
        // Under fully sharded data parallelism, the whole weights gathered for the step (every
        // layer's are kept where the backward pass keeps their activations), and one part's
        // whole gradients until they are reduce-scattered.
        let (gathered_bytes, whole_gradient_bytes) = if layout.fsdp {
            let all = parameters.iter().chain(&adapters);
            let gathered = match shape.checkpointing {
                ActivationCheckpointing::Full => largest_part(all),
                _ => all.map(|held| held.elements).sum(),
            };
            (gathered * compute, largest_part(trainable.iter()) * stored)
        } else {
            (0, 0)
        };

        Self {
            parameters_per_device,
            trainable_per_device,
            parameter_bytes: parameters_per_device * (stored + compute_copy),
            gradient_bytes: trainable_per_device * stored + whole_gradient_bytes,
            optimizer_bytes: moments,
            gathered_bytes,
            activation_bytes: activations(config, layout, shape),
        }
    }

    /// Everything together.
    pub fn total_bytes(&self) -> u64 {
        self.parameter_bytes
            + self.gradient_bytes
            + self.optimizer_bytes
            + self.gathered_bytes
            + self.activation_bytes
    }
}

/// The elements one device holds of one parameter (before fully sharded data parallelism slices
/// them), the ranks its moments are sliced over, the part of the model it is gathered with, and
/// how many layers' copies of it the elements count (a pipeline stage's slots, counted as layer
/// 0's).
#[derive(Debug, Clone)]
struct Held {
    elements: u64,
    sliced_over: u64,
    part: String,
    copies: u64,
}

impl Held {
    fn new(elements: u64, sliced_over: u64, path: &[String], layer_slots: Option<u64>) -> Self {
        let (part, copies) = match (path.first().map(String::as_str), path.get(1)) {
            (Some("layers"), Some(index)) => (format!("layers.{index}"), layer_slots.unwrap_or(1)),
            (Some("embed_tokens"), _) => ("embed_tokens".to_string(), 1),
            _ => ("head".to_string(), 1),
        };
        Self {
            elements,
            sliced_over,
            part,
            copies,
        }
    }
}

/// The elements of the largest part of the model (one layer, the embedding, or the final norm
/// and head) among `entries`.
fn largest_part<'a>(entries: impl Iterator<Item = &'a Held>) -> u64 {
    let mut parts: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    for held in entries {
        *parts.entry(&held.part).or_default() += held.elements / held.copies;
    }
    parts.into_values().max().unwrap_or(0)
}

/// Host memory of one checkpoint of `config` trained with steps of `shape`, as
/// `--async-checkpoint` copies it before writing it: the model in f32 (its adapters too under
/// LoRA) and the AdamW moments of what trains (two f32 per element), in whole shapes whatever
/// the layout. In a job of several processes rank 0 holds the model and each process its share
/// of the moments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointStaging {
    /// The model's bytes in f32.
    pub model_bytes: u64,
    /// The optimizer state's bytes.
    pub optimizer_bytes: u64,
}

impl CheckpointStaging {
    /// The staging copy of a checkpoint of `config` (see the type's documentation).
    pub fn estimate(config: &HlatConfig, shape: &StepShape) -> Self {
        let whole = DeviceMemory::estimate(config, &ParallelLayout::SINGLE, shape);
        Self {
            model_bytes: 4 * whole.parameters_per_device,
            optimizer_bytes: whole.optimizer_bytes,
        }
    }
}

/// Bytes of the activations one micro-batch keeps for its backward pass on one device: the
/// tensors Burn's autodiff saves for HLAT's layers, counted from the model's shapes and
/// calibrated against what a replica holds after a forward pass (the device's live-bytes gauge;
/// `tests/src/parallel_training.rs` checks the two agree). Per layer: five hidden-sized tensors
/// of the norms and residuals (sequence-sharded under sequence parallelism), the two gathered
/// inputs of the projections and two more full-sequence hidden-sized tensors, five head-sized tensors of the local heads (queries, keys and values
/// at the query heads, rotated, and the attention output, also flattened for the output
/// projection), the scores twice in f32 (raw and probabilities) with their mask, five FFN-sized
/// tensors of SwiGLU (gate and up projections; sigmoid, SiLU and product, which selective
/// checkpointing recomputes), and the broadcast forms of the norm gains, rotary tables and
/// key/value projections. Then the final norm and the local logits in f32. Over a sequence that attends by blocks (without a
/// cast compute copy), the scores of one block of queries instead of every layer's.
fn activations(config: &HlatConfig, layout: &ParallelLayout, shape: &StepShape) -> u64 {
    let tensor = layout.tensor as u64;
    let tokens = (shape.seq_len * shape.micro_batch_rows) as u64;
    let rows = shape.micro_batch_rows as u64;
    let seq = shape.seq_len as u64;
    let element = match shape.precision {
        Precision::F32 => 4,
        Precision::Bf16StochasticRounding | Precision::Bf16Mixed => 2,
    };
    let hidden = config.hidden_size as u64;
    let head_dim = config.head_dim() as u64;
    let local_heads = config.num_heads as u64 / tensor;
    let local_ffn = config.ffn_size as u64 / tensor;
    let sequence_share = if layout.sequence_parallel { tensor } else { 1 };

    let layer_input = tokens * hidden * element / sequence_share;
    let norms = 5 * layer_input;
    // The gathered inputs of the attention and the MLP, and two more full-sequence hidden-sized
    // tensors Burn 0.22's autodiff keeps per layer (measured with the live-bytes gauge, not yet
    // attributed to an operation).
    let gathered = 4 * tokens * hidden * element;
    let attention_heads = 5 * tokens * local_heads * head_dim * element;
    // Two f32 copies of the scores (raw and probabilities: Burn 0.22's softmax keeps its output)
    // and a one-byte mask, for `queries` rows of queries.
    let attention_core = |queries: u64| rows * local_heads * queries * seq * (2 * 4 + 1);
    // The MLPs' projections and activations per layer (averaged over the layers), the part of
    // the activations selective checkpointing recomputes (a dense MLP's; a mixture's feed-forward
    // network is kept whole), and the most of it one layer recomputes at a time.
    let (mlp_projections, mlp_activation, (recomputable, recomputed_mlp)) = match &config.moe {
        None => {
            let activation = 3 * tokens * local_ffn * element;
            (
                2 * tokens * local_ffn * element,
                activation,
                (activation, activation),
            )
        }
        // A mixture routed dropless runs every expert on every token (under a capacity factor,
        // on its slots): each expert's five FFN-sized tensors and its weighted output, the
        // router's logits and probabilities in f32, averaged with the dense layers (not
        // calibrated against the live-bytes gauge).
        Some(moe) => {
            let layers = config.num_layers.max(1) as u64;
            let sparse = (0..config.num_layers)
                .filter(|&layer| moe.is_sparse(layer))
                .count() as u64;
            let experts = moe.num_experts as u64;
            // The rows each expert runs on.
            let routed = match shape.moe_capacity_factor {
                None => tokens,
                Some(factor) => {
                    let share = tokens as f64 * moe.experts_per_token as f64 / experts as f64;
                    ((factor * share).ceil() as u64).clamp(1, tokens)
                }
            };
            let expert_ffn = moe.expert_ffn_size as u64
                + moe.shared_expert_ffn_size.map_or(0, |width| width as u64) / experts;
            let sparse_projections =
                experts * (2 * routed * expert_ffn + routed * hidden) * element
                    + 2 * tokens * experts * 4;
            let sparse_activation = 3 * experts * routed * expert_ffn * element;
            let dense_projections = 2 * tokens * local_ffn * element;
            let dense_activation = 3 * tokens * local_ffn * element;
            let mean = |sparse_bytes: u64, dense_bytes: u64| {
                (sparse * sparse_bytes + (layers - sparse) * dense_bytes) / layers
            };
            let dense_recomputed = if sparse < layers { dense_activation } else { 0 };
            (
                mean(sparse_projections, dense_projections),
                mean(sparse_activation, dense_activation),
                (mean(0, dense_activation), dense_recomputed),
            )
        }
    };
    // Burn 0.22's autodiff keeps the broadcast forms of what a layer multiplies its activations
    // by, which a device holds as tensors of their own: the two norm gains, the rotary tables of
    // the queries and keys, and the key and value projections made 3-d for the batched product.
    let local_kv_heads = (config.num_kv_heads as u64 / tensor).max(1);
    let broadcast_views =
        (2 * hidden + 4 * seq * head_dim + 2 * hidden * local_kv_heads * head_dim) * element;
    let around_core =
        norms + gathered + attention_heads + mlp_projections + mlp_activation + broadcast_views;

    // A Trainium device trains through the fused attention (`burn_trainium::attention`): a layer
    // keeps the f32 log-sum-exp statistics of its rows, never its scores. Over a long sequence
    // (without a cast compute copy) the backward pass recomputes one block of queries at a time.
    let statistics = rows * local_heads * seq * 4;
    let by_block = attends_by_block(shape.seq_len) && shape.precision.compute_cast().is_none();
    let (kept_core, recomputed_core) = if by_block {
        (0, attention_core(ATTENTION_BLOCK as u64))
    } else {
        (statistics, attention_core(seq))
    };
    // A pipeline stage keeps its chunk inputs, and runs one chunk's layers with a graph at a
    // time (its backward pass).
    let (layers, kept_inputs) = match shape.pipeline {
        Some(pipeline) => (
            (pipeline.layer_slots / pipeline.virtual_stages) as u64,
            pipeline.kept_inputs(layout.pipeline) as u64 * layer_input,
        ),
        None => (config.num_layers as u64, 0),
    };
    let per_model = match shape.checkpointing {
        ActivationCheckpointing::None if by_block => layers * around_core + recomputed_core,
        ActivationCheckpointing::None => layers * (around_core + kept_core),
        // Every layer's input, and one layer's activations while it is run again.
        ActivationCheckpointing::Full => layers * layer_input + around_core + recomputed_core,
        ActivationCheckpointing::Selective => {
            layers * (around_core - recomputable) + recomputed_core + recomputed_mlp
        }
    };
    // The final norm's input and output and its broadcast gain, and the local logits in f32.
    let head =
        (2 * tokens * hidden + hidden) * element + tokens * (config.vocab_size as u64 / tensor) * 4;
    kept_inputs + per_model + head
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(data: usize, tensor: usize, zero1: bool) -> ParallelLayout {
        ParallelLayout {
            data,
            expert: 1,
            tensor,
            pipeline: 1,
            sequence_parallel: tensor > 1,
            zero1,
            fsdp: false,
        }
    }

    /// A mixture routed dropless keeps every expert's activations over every token; a capacity
    /// factor of 1 over `k / experts` of them: the FFN part shrinks by `experts / k`.
    #[test]
    fn a_capacity_factor_shrinks_a_mixtures_activations() {
        let config = HlatConfig::preset("mixtral-8x7b").unwrap();
        let dense = HlatConfig {
            moe: None,
            family: hlat::ModelFamily::Mistral,
            ..config.clone()
        };
        let mut shape = shape(ActivationCheckpointing::None);
        let bytes = |config: &HlatConfig, shape: &StepShape| {
            DeviceMemory::estimate(config, &layout(1, 1, false), shape).activation_bytes
        };
        let dropless = bytes(&config, &shape);
        shape.moe_capacity_factor = Some(1.0);
        let capacity = bytes(&config, &shape);
        let dense = bytes(&dense, &shape);
        assert!(
            dropless > capacity && capacity > dense,
            "{dropless} {capacity} {dense}"
        );
        // Mixtral's experts have the dense FFN's width: at capacity 1 the 8 experts run on a
        // quarter of the tokens each, twice the dense FFN's rows in all.
        let tokens = (shape.seq_len * shape.micro_batch_rows) as u64;
        let (ffn, hidden, element) = (14336u64, 4096u64, 2u64);
        let per_layer = |rows: u64| 8 * (5 * rows * ffn + rows * hidden) * element;
        let layers = 32;
        assert_eq!(
            dropless - capacity,
            layers * (per_layer(tokens) - per_layer(tokens / 4))
        );
    }

    /// Under ZeRO-1 with `--dp 8 --ep 2`, each expert is held by 4 replicas, which share its
    /// moments; the other parameters' moments are shared by all 8.
    #[test]
    fn zero1_slices_split_experts_over_the_replicas_holding_them() {
        let config = HlatConfig::preset("mixtral-8x7b").unwrap();
        let shape = shape(ActivationCheckpointing::None);
        let layout = ParallelLayout {
            expert: 2,
            ..layout(8, 1, true)
        };
        let memory = DeviceMemory::estimate(&config, &layout, &shape);
        let moe = config.moe.as_ref().unwrap();
        let expert_elements = (config.num_layers * moe.num_experts * 3) as u64
            * (config.hidden_size * moe.expert_ffn_size) as u64;
        let held_experts = expert_elements / 2;
        let others = memory.parameters_per_device - held_experts;
        // Every Mixtral tensor divides by 8: no slice is padded.
        assert_eq!(memory.optimizer_bytes, 8 * (held_experts / 4 + others / 8));
    }

    /// Fully sharded over 32 devices, each keeps ⌈n / 32⌉ elements of every tensor and of its
    /// moments; with full checkpointing it gathers one part at a time (Llama 3.1 8B's largest is
    /// its head with the final norm, in bf16), without it every layer's, kept for the backward
    /// pass.
    #[test]
    fn fully_sharded_devices_keep_slices_and_gather_one_part_at_a_time() {
        let config = HlatConfig::preset("llama-3.1-8b").unwrap();
        let sharded = ParallelLayout {
            fsdp: true,
            ..layout(32, 1, false)
        };
        let full = DeviceMemory::estimate(&config, &sharded, &shape(ActivationCheckpointing::Full));
        let kept = DeviceMemory::estimate(&config, &sharded, &shape(ActivationCheckpointing::None));
        let whole = DeviceMemory::estimate(
            &config,
            &layout(1, 1, false),
            &shape(ActivationCheckpointing::Full),
        );
        let tensors = hlat::hf::tensor_specs(&config).count() as u64;
        let slices = whole.parameters_per_device / 32;
        assert!(
            (slices..=slices + tensors).contains(&full.parameters_per_device),
            "{full:?}"
        );
        assert_eq!(full.optimizer_bytes, 8 * full.parameters_per_device);
        // The head with the final norm's gain.
        let head = (128_256 + 1) * 4096 * 2;
        assert_eq!(full.gathered_bytes, head);
        assert_eq!(kept.gathered_bytes, whole.parameter_bytes);
        // The head's whole gradients wait for their reduce-scatter beside the slices.
        assert_eq!(full.gradient_bytes, 2 * full.parameters_per_device + head);
    }

    fn shape(checkpointing: ActivationCheckpointing) -> StepShape {
        StepShape {
            seq_len: 4096,
            micro_batch_rows: 1,
            precision: Precision::Bf16StochasticRounding,
            checkpointing,
            pipeline: None,
            lora: None,
            moe_capacity_factor: None,
        }
    }

    /// The staging copy of a checkpoint is the whole model in f32 and two f32 moments of what
    /// trains, whatever the training precision; under LoRA the moments are the adapters' alone.
    #[test]
    fn a_checkpoints_staging_copy_is_the_model_in_f32_and_the_moments_of_what_trains() {
        let config = HlatConfig::preset("hlat-7b").unwrap();
        let parameters = config.num_params();
        let staging = CheckpointStaging::estimate(&config, &shape(ActivationCheckpointing::None));
        assert_eq!(staging.model_bytes, 4 * parameters);
        assert_eq!(staging.optimizer_bytes, 8 * parameters);

        let lora = LoraShape::of(&LoraConfig::new(8, 16.0));
        let adapted = StepShape {
            lora: Some(lora),
            ..shape(ActivationCheckpointing::None)
        };
        let staging = CheckpointStaging::estimate(&config, &adapted);
        // Rank-8 adapters on the 7 projections of each of hlat-7b's 32 layers.
        let (hidden, ffn) = (config.hidden_size as u64, config.ffn_size as u64);
        let per_layer = 8 * (4 * (hidden + hidden) + 3 * (hidden + ffn));
        let adapters = config.num_layers as u64 * per_layer;
        assert_eq!(staging.model_bytes, 4 * (parameters + adapters));
        assert_eq!(staging.optimizer_bytes, 8 * adapters);
    }

    #[test]
    fn one_device_holds_the_whole_model_and_its_state() {
        let config = HlatConfig::preset("hlat-7b").unwrap();
        let memory = DeviceMemory::estimate(
            &config,
            &layout(1, 1, false),
            &shape(ActivationCheckpointing::None),
        );
        let parameters = config.num_params();
        assert_eq!(memory.parameters_per_device, parameters);
        assert_eq!(memory.parameter_bytes, 2 * parameters);
        assert_eq!(memory.gradient_bytes, 2 * parameters);
        assert_eq!(memory.optimizer_bytes, 8 * parameters);
    }

    #[test]
    fn tensor_parallel_and_zero1_divide_the_state() {
        let config = HlatConfig::preset("hlat-7b").unwrap();
        let none = ActivationCheckpointing::None;
        let whole = DeviceMemory::estimate(&config, &layout(1, 1, false), &shape(none));
        let split = DeviceMemory::estimate(&config, &layout(32, 8, true), &shape(none));
        // Only the norm gains (2 per layer and the final one) stay whole on every rank.
        let norms = (2 * config.num_layers as u64 + 1) * config.hidden_size as u64;
        assert_eq!(
            split.parameters_per_device,
            (whole.parameters_per_device - norms) / 8 + norms
        );
        let moments = split.optimizer_bytes as f64 / (8.0 * split.parameters_per_device as f64);
        assert!((moments - 1.0 / 32.0).abs() < 1e-3, "{moments}");
        let full = DeviceMemory::estimate(
            &config,
            &layout(32, 8, true),
            &shape(ActivationCheckpointing::Full),
        );
        let selective = DeviceMemory::estimate(
            &config,
            &layout(32, 8, true),
            &shape(ActivationCheckpointing::Selective),
        );
        assert!(full.activation_bytes < selective.activation_bytes);
        assert!(selective.activation_bytes < split.activation_bytes);
    }

    #[test]
    fn replicated_kv_heads_count_once_per_holder() {
        // hlat-70b at tp 32: 2 query heads per rank, each of the 8 KV heads on 4 ranks.
        let config = HlatConfig::preset("hlat-70b").unwrap();
        let (hidden, heads, kv_heads, head_dim, ffn, vocab, layers) =
            (8192u64, 64u64, 8u64, 128u64, 28672u64, 32000u64, 80u64);
        assert_eq!(
            (
                config.hidden_size,
                config.num_heads,
                config.num_kv_heads,
                config.head_dim(),
                config.ffn_size,
                config.vocab_size,
                config.num_layers,
                config.tie_word_embeddings,
            ),
            (8192, 64, 8, 128, 28672, 32000, 80, false)
        );
        let tp = 32;
        let query_and_output = 2 * hidden * (heads / tp * head_dim);
        // Each KV head is held by tp / kv_heads = 4 ranks: one head's columns of k and v per
        // rank (not kv_heads / tp of a head).
        assert_eq!(tp / kv_heads, 4);
        let key_and_value = 2 * hidden * head_dim;
        let mlp = 3 * hidden * (ffn / tp);
        let norms = 2 * hidden;
        let per_layer = query_and_output + key_and_value + mlp + norms;
        let embedding_and_head = 2 * (vocab / tp) * hidden;
        let expected = layers * per_layer + embedding_and_head + hidden;
        assert_eq!(expected, 2_282_627_072);
        let memory = DeviceMemory::estimate(
            &config,
            &layout(1, tp as usize, false),
            &shape(ActivationCheckpointing::None),
        );
        assert_eq!(memory.parameters_per_device, expected);
    }

    #[test]
    fn activations_grow_linearly_with_the_sequence_through_the_fused_attention() {
        let config = HlatConfig::preset("hlat-7b").unwrap();
        let activations = |seq_len: usize, precision: Precision| {
            let shape = StepShape {
                seq_len,
                micro_batch_rows: 1,
                precision,
                checkpointing: ActivationCheckpointing::None,
                pipeline: None,
                lora: None,
                moe_capacity_factor: None,
            };
            DeviceMemory::estimate(&config, &layout(1, 1, false), &shape).activation_bytes
        };
        // Linear: the broadcast weights do not depend on the sequence, and no layer keeps its
        // scores, with or without a cast compute copy (only its rows' statistics).
        for precision in [Precision::Bf16StochasticRounding, Precision::Bf16Mixed] {
            assert_eq!(
                activations(16384, precision) - activations(8192, precision),
                2 * (activations(8192, precision) - activations(4096, precision)),
                "{precision:?}"
            );
        }
    }
}
