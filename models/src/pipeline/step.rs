//! The pipelined forward and backward passes of one optimizer step, and the pipelined loss of
//! inference.

use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::{Bool, DType, Device, Int, Tensor, TensorData};
use burn_trainium::collective::{self, ReduceOp, ReplicaGroups};

use super::stages::choose_chunk;
use super::{PipelineParallel, Schedule};
use crate::attention::Context;
use crate::fully_sharded::FullySharded;
use crate::model::{Hlat, loss_from_logits};
use crate::moe::load_balancing_part;
use crate::parallel::Exchange;
use crate::recompute::{
    ActivationCheckpointing, ObjectiveGradients, OuterPart, StagedLayers, backpropagate, collect,
    into_slices,
};

/// Input ids and next-token targets `[rows, seq]` of one micro-batch.
pub type MicroBatch = (Tensor<2, Int>, Tensor<2, Int>);

/// A mixture's load-balancing loss across pipeline stages. The loss joins every layer's routers
/// (see [`crate::moe::load_balancing_loss`]): each micro-batch's router statistics (the experts'
/// choices and summed probabilities, `[1, 1, 2·experts]`) travel forward with its activations,
/// adding each stage's, so that the last stage holds the micro-batch's totals and computes the
/// loss; the total choices travel back with the gradients, and each stage's routers take the
/// gradient of their part of the loss, which is linear in their probabilities once the choices
/// are counted ([`crate::moe::load_balancing_part`]).
struct Routing {
    k: usize,
    experts: usize,
    coefficient: f64,
    /// Rows routed in a micro-batch: its tokens times the model's sparse layers.
    rows: usize,
}

impl Routing {
    /// The routing of `model`'s mixture over micro-batches of `tokens` tokens (`None`: dense).
    fn of(model: &Hlat, tokens: usize) -> Option<Self> {
        let config = model.config();
        let moe = config.moe.as_ref()?;
        let sparse = (0..config.num_layers)
            .filter(|&layer| moe.is_sparse(layer))
            .count();
        Some(Self {
            k: moe.experts_per_token,
            experts: moe.num_experts,
            coefficient: moe.router_aux_loss_coef,
            rows: sparse * tokens,
        })
    }

    /// The statistics `[1, 1, 2·experts]` of routers' `logits` (zeros without any).
    fn statistics(&self, logits: &[Tensor<2>], device: &Device) -> Tensor<3> {
        let statistics = match crate::moe::router_statistics(logits, self.k) {
            Some((choices, probabilities, _)) => {
                Tensor::cat(vec![choices, probabilities.detach()], 0)
            }
            None => Tensor::zeros([2 * self.experts], device),
        };
        statistics.reshape([1, 1, 2 * self.experts])
    }

    /// The choices `[experts]` of statistics.
    fn choices(&self, statistics: Tensor<3>) -> Tensor<1> {
        statistics
            .narrow(2, 0, self.experts)
            .reshape([self.experts])
    }

    /// The load-balancing loss `[1]` of a micro-batch's total statistics.
    fn loss(&self, statistics: Tensor<3>) -> Tensor<1> {
        let probabilities = statistics
            .clone()
            .narrow(2, self.experts, self.experts)
            .reshape([self.experts]);
        crate::moe::balance_of(self.choices(statistics), probabilities, self.rows)
    }
}

impl Hlat {
    /// One optimizer step's forward and backward passes over `micro_batches` on a model cut into
    /// the stages of `pipeline` ([`Hlat::into_stages`]), run by the ticks of [`Schedule`]: the
    /// sum of the micro-batches' objectives (their mean losses, plus a mixture's weighted
    /// load-balancing losses, whose sum is returned too; the same on every replica of a pipeline
    /// group, without graph) and the gradients of this replica's parameters, summed over the
    /// micro-batches. The gradients of the embedding, final norm and head are this stage's part
    /// (zero where it does not use them): sum them over the pipeline group.
    ///
    /// Each chunk runs forward without graph; its backward pass runs it again from the input the
    /// stage kept, through the stages of `checkpointing`. A mixture's load-balancing loss is
    /// computed across the stages (see [`Routing`]). Under fully sharded data parallelism
    /// (`sharded`: the stage holds slices) each layer, the embedding and the head are gathered
    /// whole where they run, and their gradients left as slices ([`crate::fully_sharded`]).
    ///
    /// # Panics
    /// When the model is not on an autodiff device (`Device::autodiff`).
    pub fn pipeline_loss_and_gradients(
        &self,
        micro_batches: &[MicroBatch],
        ignore_id: Option<u32>,
        exchange: &dyn Exchange,
        pipeline: &PipelineParallel,
        checkpointing: ActivationCheckpointing,
        sharded: Option<&FullySharded>,
    ) -> ObjectiveGradients {
        let (stages, chunks) = (pipeline.stages(), pipeline.virtual_stages);
        let schedule = Schedule::new(stages, chunks, micro_batches.len());
        let slots = Schedule::ring_slots(stages, chunks);
        let chunk_slots = pipeline.chunk_slots();
        let device = micro_batches[0].0.device();
        let [rows, seq] = micro_batches[0].0.dims();
        let rotary = self.rotary(0, seq, &device);
        let table = Table::new(&schedule, &pipeline.groups, &device);
        let (forward_pairs, backward_pairs) = (pipeline.forward_pairs(), pipeline.backward_pairs());
        let without_gradients = self.clone().no_grad();
        let routing = Routing::of(self, rows * seq);

        let mut ring: Vec<Option<Tensor<3>>> = vec![None; slots];
        let mut received: Option<Tensor<3>> = None;
        let mut returned: Option<Tensor<3>> = None;
        // A mixture's router statistics: kept per ring slot, received with the activations.
        let mut statistics_ring: Vec<Option<Tensor<3>>> = vec![None; slots];
        let mut received_statistics: Option<Tensor<3>> = None;
        let mut returned_choices: Option<Tensor<3>> = None;
        let mut loss_sum: Option<Tensor<1>> = None;
        let mut balance_sum: Option<Tensor<1>> = None;
        let mut gradients = GradientsParams::new();
        for (tick, work) in schedule.ticks.iter().enumerate() {
            if work.has_forward() {
                let embedded = schedule.embedding_forward(tick).map(|index| {
                    without_gradients
                        .outer_weights(sharded, OuterPart::Embedding)
                        .embed(micro_batches[index].0.clone(), exchange)
                });
                let starts = embedded.is_some();
                let input = match (embedded, received.take()) {
                    (Some(embedded), Some(received)) => {
                        let mask = table.mask(tick, Field::ForwardEmbedding, received.dims());
                        received.mask_where(mask, embedded)
                    }
                    (Some(input), None) | (None, Some(input)) => input,
                    (None, None) => unreachable!("a forward tick after the first receives"),
                };
                let layers = if chunks > 1 {
                    choose_chunk(
                        &without_gradients.layers,
                        &table.chunks(tick, Phase::Forward),
                    )
                } else {
                    without_gradients.layers.clone()
                };
                let mut router_logits = Vec::new();
                let output = layers.iter().fold(input.clone(), |x, layer| {
                    let gathered = sharded.map(|sharded| sharded.gather_leaves(layer.clone()));
                    let layer = gathered.as_ref().unwrap_or(layer);
                    let (output, logits) =
                        layer.forward_routed(x, &rotary, Context::Full, exchange);
                    router_logits.extend(logits);
                    output
                });
                ring[tick % slots] = Some(input);
                received = Some(collective::permute(output, &forward_pairs));
                if let Some(routing) = &routing {
                    let own = routing.statistics(&router_logits, &device);
                    // A micro-batch entering stage 0 starts from no statistics.
                    let incoming = match received_statistics.take() {
                        Some(incoming) if starts => {
                            let mask = table.mask(tick, Field::ForwardEmbedding, own.dims());
                            incoming.mask_where(mask, own.zeros_like())
                        }
                        Some(incoming) => incoming,
                        None => own.zeros_like(),
                    };
                    let outgoing = incoming + own;
                    statistics_ring[tick % slots] = Some(outgoing.clone());
                    received_statistics = Some(collective::permute(outgoing, &forward_pairs));
                }
            }
            if !work.has_backward() {
                continue;
            }
            // This stage's kept chunk input, and the embedding when stage 0 starts a micro-batch.
            let leaf = table.kept(tick, &ring).require_grad();
            let embedding = schedule
                .embedding_backward(tick)
                .map(|index| (index, self.outer_weights(sharded, OuterPart::Embedding)));
            let input = match &embedding {
                Some((index, weights)) => {
                    let mask = table.mask(tick, Field::BackwardEmbedding, leaf.dims());
                    let embedded = weights.embed(micro_batches[*index].0.clone(), exchange);
                    leaf.clone().mask_where(mask, embedded)
                }
                None => leaf.clone(),
            };
            let model = if chunks > 1 {
                let layers = choose_chunk(&self.layers, &table.chunks(tick, Phase::Backward));
                self.clone().with_layers(layers)
            } else {
                self.clone()
            };
            let mut staged = StagedLayers::forward(
                &model,
                0..chunk_slots,
                input.clone().detach(),
                (&rotary, seq),
                exchange,
                (checkpointing, sharded),
            );
            // The micro-batch's total statistics: the last stage's own (its loss), the choices
            // passed back by the next stage otherwise.
            let totals = routing.as_ref().map(|routing| {
                let kept = table.kept(tick, &statistics_ring);
                let totals = match returned_choices.take() {
                    Some(returned) => {
                        let mask = table.mask(tick, Field::Loss, kept.dims());
                        returned.mask_where(mask, kept)
                    }
                    None => kept,
                };
                // Only a stage working at this tick adds its routers' part.
                let working = table.value(tick, Field::Loss) + table.value(tick, Field::Returned);
                let choices = routing.choices(totals.clone());
                let weight = routing.coefficient / exchange.degree() as f64;
                staged.weigh_routers(
                    |logits| {
                        load_balancing_part(logits, choices, routing.rows)
                            .map(|part| part * working)
                    },
                    weight,
                );
                totals
            });
            let last = staged.output.clone().require_grad();
            let head_weights = schedule
                .loss(tick)
                .map(|_| self.outer_weights(sharded, OuterPart::Head));
            let loss = schedule.loss(tick).map(|index| {
                let targets = micro_batches[index].1.clone();
                let head = head_weights.as_ref().expect("gathered for the loss");
                let loss = loss_from_logits(
                    head.head(last.clone(), exchange),
                    targets,
                    ignore_id,
                    exchange,
                );
                loss * table.value(tick, Field::Loss)
            });
            if let Some(loss) = &loss {
                let loss = loss.clone().detach();
                loss_sum = Some(match loss_sum {
                    Some(sum) => sum + loss,
                    None => loss,
                });
                if let (Some(routing), Some(totals)) = (&routing, &totals) {
                    let balance = routing.loss(totals.clone()) * table.value(tick, Field::Loss);
                    balance_sum = Some(match balance_sum {
                        Some(sum) => sum + balance,
                        None => balance,
                    });
                }
            }
            let passed_back = returned.take().map(|gradient| {
                let dtype = gradient.dtype();
                let weight = table.value(tick, Field::Returned).cast(dtype);
                (last.clone() * (gradient * weight.inner().unsqueeze())).sum()
            });
            let surrogate = match (loss, passed_back) {
                (Some(loss), Some(passed)) => loss + passed.cast(DType::F32),
                (Some(loss), None) => loss,
                (None, Some(passed)) => passed,
                (None, None) => unreachable!("a backward tick starts from the loss or a gradient"),
            };
            let mut grads = surrogate.backward();
            let head_input = vec![last.grad_remove(&mut grads)];
            let upstream = match &head_weights {
                Some(weights) => into_slices(weights, sharded, &mut gradients, |into| {
                    collect(&**weights, &mut grads, into, head_input)
                }),
                None => collect(self, &mut grads, &mut gradients, head_input),
            };
            let upstream = staged.backward(&model, self, upstream, &mut gradients);
            let upstream = match &embedding {
                Some((_, weights)) => into_slices(weights, sharded, &mut gradients, |into| {
                    backpropagate(&**weights, vec![input], upstream, &[leaf], into)
                }),
                None => backpropagate(self, vec![input], upstream, &[leaf], &mut gradients),
            };
            returned = upstream
                .into_iter()
                .next()
                .flatten()
                .map(|gradient| collective::permute(gradient, &backward_pairs));
            returned_choices = totals.map(|totals| collective::permute(totals, &backward_pairs));
        }
        let loss_sum = loss_sum.expect("the last stage computes a loss");
        let loss_sum = collective::all_reduce(loss_sum, ReduceOp::Sum, &pipeline.groups);
        let balance_sum = balance_sum
            .map(|balance| collective::all_reduce(balance, ReduceOp::Sum, &pipeline.groups));
        let objective = match (&routing, &balance_sum) {
            (Some(routing), Some(balance)) => {
                loss_sum + balance.clone().mul_scalar(routing.coefficient)
            }
            _ => loss_sum,
        };
        ObjectiveGradients {
            objective,
            load_balancing: balance_sum,
            gradients,
        }
    }
}

impl Hlat {
    /// The mean next-token loss of one batch on a model cut into the stages of `pipeline`, the
    /// same on every replica of a pipeline group: the batch passes every virtual stage in turn
    /// (inference: no overlap to gain from one batch).
    pub fn pipeline_loss(
        &self,
        (input_ids, targets): MicroBatch,
        ignore_id: Option<u32>,
        exchange: &dyn Exchange,
        pipeline: &PipelineParallel,
    ) -> Tensor<1> {
        let [_, seq] = input_ids.dims();
        let device = input_ids.device();
        let rotary = self.rotary(0, seq, &device);
        let stages = pipeline.stages();
        let virtual_stages = stages * pipeline.virtual_stages;
        let slots = pipeline.chunk_slots();
        let forward_pairs = pipeline.forward_pairs();
        let mut x = self.embed(input_ids, exchange);
        for virtual_stage in 0..virtual_stages {
            let chunk = virtual_stage / stages;
            for layer in &self.layers[chunk * slots..(chunk + 1) * slots] {
                x = layer.forward(x, &rotary, Context::Full, exchange);
            }
            if virtual_stage + 1 < virtual_stages {
                x = collective::permute(x, &forward_pairs);
            }
        }
        let loss = loss_from_logits(self.head(x, exchange), targets, ignore_id, exchange);
        let last = per_replica(
            &[stage_flags(stages, stages - 1)],
            &pipeline.groups,
            &device,
        );
        collective::all_reduce(loss * last.reshape([1]), ReduceOp::Sum, &pipeline.groups)
    }
}

/// One value per stage: 1 for `stage`, 0 for the others.
fn stage_flags(stages: usize, stage: usize) -> Vec<f32> {
    (0..stages)
        .map(|other| f32::from(u8::from(other == stage)))
        .collect()
}

/// A table whose row `s` of `rows` (one per stage) each replica of a pipeline group gets as its
/// own: `rows[field][stage]`, laid out `[stage, field]`, split over the groups. Returns each
/// replica's `[1, fields]`.
fn per_replica(rows: &[Vec<f32>], groups: &ReplicaGroups, device: &Device) -> Tensor<2> {
    let stages = rows[0].len();
    let values: Vec<f32> = (0..stages)
        .flat_map(|stage| rows.iter().map(move |field| field[stage]))
        .collect();
    let table = Tensor::<2>::from_data(TensorData::new(values, [stages, rows.len()]), device);
    collective::split(table, 0, groups)
}

/// What a stage does at one tick, as the fields of its row of [`Table`].
#[derive(Debug, Clone, Copy)]
enum Field {
    /// 1 where the forward phase takes the embedding of a new micro-batch.
    ForwardEmbedding,
    /// 1 where the backward phase reaches the embedding.
    BackwardEmbedding,
    /// 1 where the backward phase starts from the loss.
    Loss,
    /// 1 where the backward phase starts from the gradient the next stage passed back.
    Returned,
    /// 1 where the forward phase runs chunk `n`.
    ForwardChunk(usize),
    /// 1 where the backward phase runs chunk `n`.
    BackwardChunk(usize),
    /// 1 where the backward phase reads ring slot `n`.
    Slot(usize),
}

/// The two phases of a tick.
#[derive(Debug, Clone, Copy)]
enum Phase {
    Forward,
    Backward,
}

/// Each replica's own part of the schedule on the device: per tick, what its stage does, as
/// 0/1 fields. Uploaded once per step and split over the pipeline groups, so every replica runs
/// the same program on its own values.
struct Table {
    /// `[ticks, fields]` of this replica's stage.
    values: Tensor<2>,
    chunks: usize,
}

impl Table {
    fn new(schedule: &Schedule, groups: &ReplicaGroups, device: &Device) -> Self {
        let (stages, chunks) = (schedule.stages, schedule.virtual_stages);
        let slots = Schedule::ring_slots(stages, chunks);
        let fields = Self::width(chunks, slots);
        let ticks = schedule.ticks.len();
        let mut rows = vec![vec![0.0f32; stages]; ticks * fields];
        for (tick, work) in schedule.ticks.iter().enumerate() {
            let mut set = |field: Field, stage: usize| {
                rows[tick * fields + Self::index(chunks, field)][stage] = 1.0;
            };
            for stage in 0..stages {
                let forward = work.forward[stage];
                set(Field::ForwardChunk(forward.map_or(0, |w| w.chunk)), stage);
                if forward.is_some_and(|w| stage == 0 && w.chunk == 0) {
                    set(Field::ForwardEmbedding, stage);
                }
                let Some(backward) = work.backward[stage] else {
                    set(Field::BackwardChunk(0), stage);
                    continue;
                };
                set(Field::BackwardChunk(backward.chunk), stage);
                set(Field::Slot(backward.slot), stage);
                if stage == 0 && backward.chunk == 0 {
                    set(Field::BackwardEmbedding, stage);
                }
                if stage + 1 == stages && backward.chunk + 1 == chunks {
                    set(Field::Loss, stage);
                } else {
                    set(Field::Returned, stage);
                }
            }
        }
        let values = per_replica(&rows, groups, device).reshape([ticks, fields]);
        Self { values, chunks }
    }

    fn width(chunks: usize, slots: usize) -> usize {
        4 + 2 * chunks + slots
    }

    fn index(chunks: usize, field: Field) -> usize {
        match field {
            Field::ForwardEmbedding => 0,
            Field::BackwardEmbedding => 1,
            Field::Loss => 2,
            Field::Returned => 3,
            Field::ForwardChunk(chunk) => 4 + chunk,
            Field::BackwardChunk(chunk) => 4 + chunks + chunk,
            Field::Slot(slot) => 4 + 2 * chunks + slot,
        }
    }

    /// This replica's value of `field` at `tick`, `[1]`.
    fn value(&self, tick: usize, field: Field) -> Tensor<1> {
        let index = Self::index(self.chunks, field);
        self.values
            .clone()
            .slice([tick..tick + 1, index..index + 1])
            .reshape([1])
    }

    /// What this replica's backward phase at `tick` reads of `ring` (a value per ring slot): the
    /// slot its schedule names.
    fn kept(&self, tick: usize, ring: &[Option<Tensor<3>>]) -> Tensor<3> {
        ring.iter()
            .enumerate()
            .filter_map(|(slot, kept)| kept.as_ref().map(|kept| (slot, kept)))
            .fold(None, |chosen: Option<Tensor<3>>, (slot, kept)| {
                Some(match chosen {
                    None => kept.clone(),
                    Some(chosen) => {
                        let mask = self.mask(tick, Field::Slot(slot), chosen.dims());
                        chosen.mask_where(mask, kept.clone())
                    }
                })
            })
            .expect("a backward tick follows a forward one")
    }

    /// This replica's `field` at `tick` as a mask of `dims`.
    fn mask(&self, tick: usize, field: Field, dims: [usize; 3]) -> Tensor<3, Bool> {
        self.value(tick, field)
            .greater_elem(0.5)
            .reshape([1, 1, 1])
            .expand(dims)
    }

    /// For each chunk, whether this replica runs it in `phase` of `tick`, `[1]`.
    fn chunks(&self, tick: usize, phase: Phase) -> Vec<Tensor<1, Bool>> {
        (0..self.chunks)
            .map(|chunk| {
                let field = match phase {
                    Phase::Forward => Field::ForwardChunk(chunk),
                    Phase::Backward => Field::BackwardChunk(chunk),
                };
                self.value(tick, field).greater_elem(0.5)
            })
            .collect()
    }
}
