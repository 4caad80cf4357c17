//! The `host` executor: replays segments on `burn-flex` through Burn's own IR interpreter, one
//! interpreter per replica of this process. Collectives combine the replicas' data in process (and
//! with the other processes' replicas when the device spans processes, see
//! [`crate::distributed`]); random tensors are drawn once and given to every replica, as a
//! compiled program does.

mod attention;
mod checks;
mod collective;
mod fft;
mod ordered_sum;
mod top_k;
mod widen;

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};

use burn_backend::{Backend, TensorData};
use burn_flex::{Flex, FlexDevice};
use burn_ir::{
    BaseOperationIr, CastOpIr, FloatOperationIr, NumericOperationIr, OperationIr, TensorId,
    TensorIr, TensorStatus,
};
use burn_router::TensorInterpreter;

/// The interpreter of one replica: Burn's IR replayed on `burn-flex`.
pub(crate) type Runner = TensorInterpreter<Flex>;

use super::Executor;
use crate::capture::Segment;
use crate::collective::Collective;
use crate::distributed::ReplicaSpan;
use crate::{BackendError, panic_message};

/// Replays captured operations one by one on the embedded CPU backend, once per replica.
pub(crate) struct HostExecutor {
    /// The runners of this process's replicas.
    replicas: Vec<Runner>,
    /// Which replicas of the device those are.
    span: ReplicaSpan,
    /// Why the runners can no longer be used: a panic inside a `burn-flex` kernel poisons a
    /// runner's tensor store for good, so every later call reports the first failure instead.
    broken: Option<String>,
    /// Tensors an earlier failed operation left uncomputed, with the reason: operations that
    /// read them fail the same way (instead of a panic in the runner), and so do reads.
    uncomputed: HashMap<TensorId, String>,
}

pub(crate) fn failure(reason: impl ToString) -> BackendError {
    BackendError::Execution {
        executor: "host",
        reason: reason.to_string(),
    }
}

/// The custom operations a runner answers beyond Burn's own: burn-signal's FFTs and the fused
/// attention.
fn custom_ops() -> burn_router::CustomOpRegistry<Flex> {
    let mut registry = fft::registry();
    attention::register(&mut registry);
    registry
}

/// Whether an operation draws random numbers (drawn once, then copied to every replica).
fn is_random(operation: &OperationIr) -> bool {
    matches!(
        operation,
        OperationIr::Float(_, FloatOperationIr::Random(_))
            | OperationIr::NumericInt(_, NumericOperationIr::IntRandom(_))
    )
}

impl HostExecutor {
    /// A host executor of the replicas `span` gives this process, with empty tensor stores.
    pub fn new(span: ReplicaSpan) -> Self {
        Self {
            replicas: (0..span.local.max(1))
                .map(|_| Runner::with_custom_ops(FlexDevice, custom_ops()))
                .collect(),
            span,
            broken: None,
            uncomputed: HashMap::new(),
        }
    }

    /// Runs `work` on the runners; a panic becomes an error (described by `what`) and marks the
    /// executor as broken.
    fn guarded<T>(
        &mut self,
        what: impl FnOnce() -> String,
        work: impl FnOnce(&mut [Runner]) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        if let Some(reason) = &self.broken {
            return Err(failure(format!(
                "the host device is unusable after an earlier failure: {reason}"
            )));
        }
        match catch_unwind(AssertUnwindSafe(|| work(&mut self.replicas))) {
            Ok(result) => result,
            Err(payload) => {
                let reason = format!("{} panicked: {}", what(), panic_message(payload.as_ref()));
                self.broken = Some(reason.clone());
                Err(failure(reason))
            }
        }
    }

    /// This process's replicas of a tensor.
    fn read_local(&mut self, tensor: &TensorIr) -> Result<Vec<TensorData>, BackendError> {
        self.read_first(tensor, usize::MAX)
    }

    /// This process's first `count` replicas of a tensor (all, if it holds fewer).
    fn read_first(
        &mut self,
        tensor: &TensorIr,
        count: usize,
    ) -> Result<Vec<TensorData>, BackendError> {
        if let Some(reason) = self.uncomputed.get(&tensor.id) {
            return Err(uncomputed(tensor.id, reason));
        }
        self.guarded(
            || format!("reading tensor {:?}", tensor.id),
            |runners| {
                runners
                    .iter_mut()
                    .take(count)
                    .map(|runner| read(runner, tensor))
                    .collect()
            },
        )
    }

    /// Runs `operation` unless it reads a tensor an earlier failure left uncomputed: then its
    /// outputs are uncomputed too (a `Drop` of such a tensor just forgets it).
    fn run_unless_uncomputed(&mut self, operation: &OperationIr) -> Result<(), BackendError> {
        if let OperationIr::Drop(tensor) = operation
            && self.uncomputed.remove(&tensor.id).is_some()
        {
            return Ok(());
        }
        let missing = operation
            .inputs()
            .find_map(|input| Some((input.id, self.uncomputed.get(&input.id)?.clone())));
        match missing {
            Some((id, reason)) => Err(uncomputed(id, &reason)),
            None => self.run_operation(operation),
        }
    }

    fn run_operation(&mut self, operation: &OperationIr) -> Result<(), BackendError> {
        let describe = || format!("{operation:?}").chars().take(200).collect();
        match operation {
            OperationIr::Distributed(_) => Err(BackendError::Unsupported {
                executor: "host",
                what: "Burn's all-reduce across devices (`burn::tensor::distributed`); the \
                       replicas of one Trainium device combine with `burn_trainium::collective`"
                    .to_string(),
            }),
            // The fused attention and burn-signal's FFTs are answered by the runners' own
            // registry (`custom_ops`), as any other operation is below.
            OperationIr::Custom(custom)
                if !crate::lower::fft::is_fft(custom)
                    && !crate::attention::is_fused_attention(custom) =>
            {
                let collective = Collective::from_ir(custom)
                    .ok_or_else(|| BackendError::Unsupported {
                        executor: "host",
                        what: format!("custom operation `{}`", custom.id),
                    })?
                    .map_err(failure)?;
                let span = self.span.clone();
                self.guarded(describe, |runners| {
                    collective::run(runners, &span, &collective, &custom.inputs, &custom.outputs)
                })
            }
            OperationIr::BaseInt(BaseOperationIr::Cast(cast)) => {
                self.guarded(describe, |runners| {
                    runners
                        .iter_mut()
                        .try_for_each(|runner| cast_int(runner, cast))
                })
            }
            OperationIr::NumericFloat(_, NumericOperationIr::ArgTopK(ir))
            | OperationIr::NumericInt(_, NumericOperationIr::ArgTopK(ir)) => {
                self.guarded(describe, |runners| {
                    runners.iter_mut().try_for_each(|runner| {
                        let input = read(runner, &readable(&ir.input))?;
                        register(runner, ir.out.id, top_k::arg_top_k(input, ir))?;
                        drop_if_consumed(runner, &ir.input);
                        Ok(())
                    })
                })
            }
            _ if is_random(operation) && self.replicas.len() > 1 => {
                self.guarded(describe, |runners| {
                    runners[0].register_op(operation.clone());
                    for output in operation.outputs() {
                        let data = read(&mut runners[0], &readable(output))?;
                        for runner in &mut runners[1..] {
                            runner.register_tensor_data_id(output.id, data.clone());
                        }
                    }
                    Ok(())
                })
            }
            _ => self.guarded(describe, |runners| {
                checks::check_operation(runners, operation)?;
                let replacement =
                    widen::widened(operation).or_else(|| ordered_sum::ordered(operation));
                for runner in runners.iter_mut() {
                    match &replacement {
                        Some(operations) => operations
                            .iter()
                            .for_each(|operation| runner.register_op(operation.clone())),
                        None => runner.register_op(operation.clone()),
                    }
                }
                Ok(())
            }),
        }
    }
}

/// The error of an operation or read of tensor `id`, which an earlier failure left uncomputed.
fn uncomputed(id: TensorId, reason: &str) -> BackendError {
    failure(format!(
        "tensor {} was not computed, an earlier operation failed: {reason}",
        id.value()
    ))
}

/// `tensor` with a status that keeps it alive when read.
fn readable(tensor: &TensorIr) -> TensorIr {
    TensorIr {
        status: TensorStatus::ReadOnly,
        ..tensor.clone()
    }
}

/// Registers `data` under `id` in `runner`.
fn register(runner: &mut Runner, id: TensorId, data: TensorData) -> Result<(), BackendError> {
    runner.register_tensor_data_id(id, data);
    Ok(())
}

/// An integer cast, which burn-router's interpreter leaves unimplemented: the input read,
/// converted on the host and registered as the output.
fn cast_int(runner: &mut Runner, cast: &CastOpIr) -> Result<(), BackendError> {
    let data = read(runner, &readable(&cast.input))?;
    register(runner, cast.out.id, data.convert_dtype(cast.out.dtype))?;
    drop_if_consumed(runner, &cast.input);
    Ok(())
}

/// Frees `input` in `runner` when the operation that read it was its last use.
fn drop_if_consumed(runner: &mut Runner, input: &TensorIr) {
    if input.status == TensorStatus::ReadWrite {
        runner.register_op(OperationIr::Drop(input.clone()));
    }
}

/// Reads one tensor of one runner.
fn read(runner: &mut Runner, tensor: &TensorIr) -> Result<TensorData, BackendError> {
    burn_backend::read_sync(runner.read_tensor_async(tensor.clone())).map_err(failure)
}

impl Executor for HostExecutor {
    fn register_data(&mut self, id: TensorId, data: TensorData) -> Result<(), BackendError> {
        self.guarded(
            || format!("registering tensor {id:?}"),
            |runners| {
                for runner in runners.iter_mut() {
                    register(runner, id, data.clone())?;
                }
                Ok(())
            },
        )
    }

    fn register_replicas(
        &mut self,
        id: TensorId,
        data: Vec<TensorData>,
    ) -> Result<(), BackendError> {
        let data = self.span.local_share(data);
        self.guarded(
            || format!("registering tensor {id:?}"),
            |runners| {
                for (runner, data) in runners.iter_mut().zip(data) {
                    register(runner, id, data)?;
                }
                Ok(())
            },
        )
    }

    fn run(&mut self, segment: Segment) -> Result<(), BackendError> {
        let _span = tracing::info_span!(crate::profile::phase::EXECUTE).entered();
        let operations = segment.operations();
        for (index, operation) in operations.iter().enumerate() {
            if let Err(error) = self.run_unless_uncomputed(operation) {
                // The rest of the segment does not run: its outputs are never computed.
                let reason = error.to_string();
                for later in &operations[index..] {
                    for output in later.outputs() {
                        self.uncomputed.insert(output.id, reason.clone());
                    }
                }
                return Err(error);
            }
        }
        Ok(())
    }

    /// This process's first replica (the device's first when it does not span processes).
    fn read(&mut self, tensor: &TensorIr) -> Result<TensorData, BackendError> {
        self.read_local_replicas(tensor, 1)
            .map(|(_, mut replicas)| replicas.remove(0))
    }

    fn read_replicas(&mut self, tensor: &TensorIr) -> Result<Vec<TensorData>, BackendError> {
        let local = self.read_local(tensor)?;
        self.span.gather(local).map_err(failure)
    }

    fn read_local_replicas(
        &mut self,
        tensor: &TensorIr,
        count: usize,
    ) -> Result<(usize, Vec<TensorData>), BackendError> {
        // A `ReadWrite` read is what releases the tensor in each runner: then every one is read.
        let read = match tensor.status {
            TensorStatus::ReadWrite => usize::MAX,
            _ => count,
        };
        let mut local = self.read_first(tensor, read)?;
        local.truncate(count);
        Ok((self.span.first, local))
    }

    fn seed(&mut self, seed: u64) {
        Flex::seed(&FlexDevice, seed);
    }
}
