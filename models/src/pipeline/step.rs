//! The pipelined forward and backward passes of one optimizer step, and the pipelined loss of
//! inference.

use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::{Bool, DType, Device, Int, Tensor, TensorData};
use burn_trainium::collective::{self, ReduceOp, ReplicaGroups};

use super::stages::choose_chunk;
use super::{PipelineParallel, Schedule};
use crate::attention::Context;
use crate::model::{Hlat, loss_from_logits};
use crate::parallel::Exchange;
use crate::recompute::{ActivationCheckpointing, StagedLayers, backpropagate, collect};

/// Input ids and next-token targets `[rows, seq]` of one micro-batch.
pub type MicroBatch = (Tensor<2, Int>, Tensor<2, Int>);

impl Hlat {
    /// One optimizer step's forward and backward passes over `micro_batches` on a model cut into
    /// the stages of `pipeline` ([`Hlat::into_stages`]), run by the ticks of [`Schedule`]: the
    /// sum of the micro-batches' mean losses (the same on every replica of a pipeline group,
    /// without graph) and the gradients of this replica's parameters, summed over the
    /// micro-batches. The gradients of the embedding, final norm and head are this stage's part
    /// (zero where it does not use them): sum them over the pipeline group.
    ///
    /// Each chunk runs forward without graph; its backward pass runs it again from the input the
    /// stage kept, through the stages of `checkpointing`.
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
    ) -> (Tensor<1>, GradientsParams) {
        let (stages, chunks) = (pipeline.stages(), pipeline.virtual_stages);
        let schedule = Schedule::new(stages, chunks, micro_batches.len());
        let slots = Schedule::ring_slots(stages, chunks);
        let chunk_slots = pipeline.chunk_slots();
        let device = micro_batches[0].0.device();
        let [_, seq] = micro_batches[0].0.dims();
        let rotary = self.rotary(0, seq, &device);
        let table = Table::new(&schedule, &pipeline.groups, &device);
        let (forward_pairs, backward_pairs) = (pipeline.forward_pairs(), pipeline.backward_pairs());
        let without_gradients = self.clone().no_grad();

        let mut ring: Vec<Option<Tensor<3>>> = vec![None; slots];
        let mut received: Option<Tensor<3>> = None;
        let mut returned: Option<Tensor<3>> = None;
        let mut loss_sum: Option<Tensor<1>> = None;
        let mut gradients = GradientsParams::new();
        for (tick, work) in schedule.ticks.iter().enumerate() {
            if work.has_forward() {
                let embedded = schedule
                    .embedding_forward(tick)
                    .map(|index| without_gradients.embed(micro_batches[index].0.clone(), exchange));
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
                let output = layers.iter().fold(input.clone(), |x, layer| {
                    layer.forward(x, &rotary, Context::Full, exchange)
                });
                ring[tick % slots] = Some(input);
                received = Some(collective::permute(output, &forward_pairs));
            }
            if !work.has_backward() {
                continue;
            }
            // This stage's kept chunk input, and the embedding when stage 0 starts a micro-batch.
            let kept = ring
                .iter()
                .enumerate()
                .filter_map(|(slot, kept)| kept.as_ref().map(|kept| (slot, kept)))
                .fold(None, |chosen: Option<Tensor<3>>, (slot, kept)| {
                    Some(match chosen {
                        None => kept.clone(),
                        Some(chosen) => {
                            let mask = table.mask(tick, Field::Slot(slot), chosen.dims());
                            chosen.mask_where(mask, kept.clone())
                        }
                    })
                })
                .expect("a backward tick follows a forward one");
            let leaf = kept.require_grad();
            let input = match schedule.embedding_backward(tick) {
                Some(index) => {
                    let mask = table.mask(tick, Field::BackwardEmbedding, leaf.dims());
                    let embedded = self.embed(micro_batches[index].0.clone(), exchange);
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
            let staged = StagedLayers::forward(
                &model,
                0..chunk_slots,
                input.clone().detach(),
                (&rotary, seq),
                exchange,
                checkpointing,
            );
            let last = staged.output.clone().require_grad();
            let loss = schedule.loss(tick).map(|index| {
                let targets = micro_batches[index].1.clone();
                let loss = loss_from_logits(
                    model.head(last.clone(), exchange),
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
            let upstream = collect(self, &mut grads, &mut gradients, head_input);
            let upstream = staged.backward(&model, self, upstream, &mut gradients);
            let upstream = backpropagate(self, vec![input], upstream, &[leaf], &mut gradients);
            returned = upstream
                .into_iter()
                .next()
                .flatten()
                .map(|gradient| collective::permute(gradient, &backward_pairs));
        }
        let loss_sum = loss_sum.expect("the last stage computes a loss");
        let loss_sum = collective::all_reduce(loss_sum, ReduceOp::Sum, &pipeline.groups);
        (loss_sum, gradients)
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
