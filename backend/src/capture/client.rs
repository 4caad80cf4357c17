//! The router client: captures operations into a segment and runs it on the device's executor.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use burn_backend::{Backend, DType, DTypeUsageSet, ExecutionError, TensorData};
use burn_flex::{Flex, FlexDevice};
use std::collections::{HashMap, HashSet};

use burn_ir::{
    BaseOperationIr, GraphBindings, GraphId, OperationIr, ShapeOpIr, TensorId, TensorIr,
    TensorStatus,
};
use burn_router::{Graph, RouterClient, RouterTensor};
use burn_std::future::DynFut;

use super::Segment;
use super::cut_points::{self, CutPoints, NEARBY_OPERATIONS};
use super::host_values::HostValues;
use super::live::{self, LiveTensors};
use super::segment::computed_elements;
use crate::executor::{self, Executor};
use crate::per_device::PerDevice;
use crate::profile::phase;
use crate::stats::{self, StatsCounters};
use crate::{BackendError, TrainiumDevice};
use burn_std::id::StreamId;

/// The number of captured operations (drops aside) after which a segment is cut into a program of
/// its own even if nothing is read (the pieces run at the next read or sync). Unless a cap is
/// set, the `xla` executor cuts a segment of small tensors sooner
/// ([`SMALL_TENSOR_SEGMENT_CAP`](crate::SMALL_TENSOR_SEGMENT_CAP)).
pub const DEFAULT_SEGMENT_CAP: usize = 65_536;

/// The environment variable that sets the segment cap of every device (unless
/// [`set_segment_cap`] sets one for a device): a positive number of operations. A step longer
/// than the cap runs as several programs, each compiled on its own: compile time grows faster
/// than the program, so smaller programs compile sooner (docs/performance.md, `hlat bench unrolled`).
pub const SEGMENT_CAP_ENV: &str = crate::settings::SEGMENT_CAP.name;

/// The segment cap `TRAINIUM_SEGMENT_CAP` sets, if it is set (and not empty); read once per
/// process (the cap is consulted at every captured operation).
fn segment_cap_from_env() -> Result<Option<usize>, BackendError> {
    static CAP: OnceLock<Result<Option<usize>, BackendError>> = OnceLock::new();
    CAP.get_or_init(read_segment_cap_env).clone()
}

fn read_segment_cap_env() -> Result<Option<usize>, BackendError> {
    let value = match crate::settings::SEGMENT_CAP.var() {
        Ok(value) if !value.trim().is_empty() => value,
        Ok(_) | Err(std::env::VarError::NotPresent) => return Ok(None),
        Err(std::env::VarError::NotUnicode(value)) => {
            return Err(BackendError::InvalidSetting {
                variable: SEGMENT_CAP_ENV,
                value: value.to_string_lossy().into_owned(),
                reason: "not valid UTF-8".to_string(),
            });
        }
    };
    match value.trim().parse::<usize>() {
        Ok(cap) if cap > 0 => Ok(Some(cap)),
        _ => Err(BackendError::InvalidSetting {
            variable: SEGMENT_CAP_ENV,
            value,
            reason: "expected a positive number of operations".to_string(),
        }),
    }
}

/// The waiting operations after which a segment runs through its last marked cut without a read
/// or a sync.
const HELD_OPERATIONS_LIMIT: usize = 4 * DEFAULT_SEGMENT_CAP;

/// Tensor ids are unique across every device of the process.
static NEXT_TENSOR_ID: AtomicU64 = AtomicU64::new(0);

/// A tensor id no other tensor of the process has.
pub(crate) fn next_tensor_id() -> TensorId {
    TensorId::new(NEXT_TENSOR_ID.fetch_add(1, Ordering::Relaxed))
}

/// The segment caps set in code ([`set_segment_cap`]).
static SEGMENT_CAPS: PerDevice<usize> = PerDevice::new();

/// The segment cap set for `device` ([`set_segment_cap`], else `TRAINIUM_SEGMENT_CAP`), if any.
fn configured_cap(device: &TrainiumDevice) -> Option<usize> {
    // The environment was checked when the device was opened: an invalid value never reaches
    // here.
    SEGMENT_CAPS
        .get(device)
        .or_else(|| segment_cap_from_env().ok().flatten())
}

/// Sets how many operations (drops aside) a segment of `device` may hold before it is cut into a
/// program of its own.
///
/// Takes effect at the next captured operation. A cap of 0 is treated as 1 (run every operation).
pub fn set_segment_cap(device: &TrainiumDevice, cap: usize) {
    SEGMENT_CAPS.set(device, cap.max(1));
}

/// Checks that the executor of `device` can be opened on this machine.
///
/// Burn creates clients lazily and cannot report an error there, so a program that wants a clear
/// message instead of a panic on first use calls this first.
pub fn check_device(device: &TrainiumDevice) -> Result<(), BackendError> {
    open_executor(device).map(|_| ())
}

/// Opens the executor of `device` once the settings its client reads are known to be valid.
fn open_executor(device: &TrainiumDevice) -> Result<Box<dyn Executor>, BackendError> {
    segment_cap_from_env()?;
    super::limits::limit_from_env()?;
    crate::executor::host_fallback_from_env()?;
    crate::executor::host_operations_from_env()?;
    crate::attention::fused_attention_from_env()?;
    executor::open(device)
}

/// The mutable state behind one device's client.
struct ClientState {
    segment: Segment,
    executor: Box<dyn Executor>,
    /// Tensors held by the executor once the waiting segment has run.
    live: LiveTensors,
    /// An execution error not yet reported (operations are captured without a return value).
    pending_error: Option<BackendError>,
    /// Tensors left without a value by a failed segment, with the failure: a read of one, or a
    /// segment using one, reports that failure rather than a missing tensor. Forgotten when the
    /// tensor is dropped.
    failed: HashMap<TensorId, String>,
    /// Tensors whose operation was refused before it ran (above the device's largest tensor,
    /// [`super::limits`]): never made, their reason in `failed`.
    refused: HashSet<TensorId>,
    /// The stream (Burn's `StreamId`: a client thread, which a device server applies its
    /// operations under) that captured the last computing operation: the one the segment
    /// follows. Reads and drops from other streams (Burn's metrics thread) must not change
    /// where that stream is cut.
    capturing_stream: Option<StreamId>,
    /// Operations of other streams captured while operations of the capturing stream wait
    /// (Burn's metrics thread taking the mean of a step's loss in the middle of the next step):
    /// they run at the end of the program that computes what they need of the waiting segment,
    /// so that where another stream's operations arrive never changes the capturing stream's
    /// programs.
    side: Segment,
    /// Drops from other streams, applied once no waiting operation uses their tensors, so that
    /// they do not land in a program at a point that varies from step to step.
    deferred_drops: Vec<OperationIr>,
    /// Cut points reads from other streams taught ([`CutPoints`]).
    cut_points: CutPoints,
    /// The [structure](super::cut_points::structure) of the last computing operation captured:
    /// the context of the next one's signature.
    previous_structure: u64,
    /// Indices of the waiting operations after which the segment is cut when it runs: those
    /// with a learned cut point's signature, and those where the size cap was reached.
    marks: Vec<usize>,
    /// Computing operations captured since the last mark, and the elements they produce: where
    /// the size cap is reached.
    since_mark: (usize, u64),
    /// Tensors made from host data and not yet uploaded ([`HostValues`]).
    host_values: HostValues,
    /// The signature of the learned cut the last run ended at, when a read from another stream
    /// ran it: a cut learned a few operations after it replaces it.
    last_read_cut: Option<u64>,
    /// Operation graphs registered by id (`RouterClient::register_and_execute_graph`), replayed
    /// as the operations they stand for.
    graphs: HashMap<GraphId, Graph>,
}

impl ClientState {
    /// Whether the calling stream is not the one the segment follows.
    fn is_other_stream(&self) -> bool {
        self.capturing_stream
            .is_some_and(|stream| stream != StreamId::current())
    }
}

/// The router client of one Trainium device, shared by every tensor on it.
#[derive(Clone)]
pub struct TrainiumClient {
    device: TrainiumDevice,
    state: Arc<Mutex<ClientState>>,
    counters: Arc<StatsCounters>,
}

impl TrainiumClient {
    /// Opens the executor of `device`.
    ///
    /// # Panics
    /// When the executor is unavailable or `TRAINIUM_SEGMENT_CAP` is invalid; [`check_device`]
    /// reports the same error as a value.
    pub(crate) fn new(device: &TrainiumDevice) -> Self {
        let executor = open_executor(device).unwrap_or_else(|error| panic!("{error}"));
        log::debug!("opened Trainium device {device}");
        Self {
            device: *device,
            state: Arc::new(Mutex::new(ClientState {
                segment: Segment::default(),
                side: Segment::default(),
                executor,
                live: LiveTensors::default(),
                pending_error: None,
                failed: HashMap::new(),
                refused: HashSet::new(),
                capturing_stream: None,
                deferred_drops: Vec::new(),
                cut_points: CutPoints::default(),
                previous_structure: 0,
                marks: Vec::new(),
                since_mark: (0, 0),
                host_values: HostValues::default(),
                last_read_cut: None,
                graphs: HashMap::new(),
            })),
            counters: stats::counters(device),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ClientState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs the waiting segment, if any, and reports the first unreported error.
    fn flush(&self, state: &mut ClientState) -> Result<(), BackendError> {
        state.last_read_cut = None;
        self.run_through(state, None, Segment::default());
        self.run_side(state);
        state.pending_error.take().map_or(Ok(()), Err)
    }

    /// Runs the other streams' waiting operations ([`ClientState::side`]) at the end of the
    /// program that runs the waiting operations they need (cut where a read teaches), or on
    /// their own when those already ran.
    fn run_side(&self, state: &mut ClientState) {
        if state.side.is_empty() {
            return;
        }
        let side = &state.side;
        let needed = state
            .segment
            .operations()
            .iter()
            .rposition(|operation| operation.outputs().any(|output| side.reads(&output.id)));
        let side = state.side.take();
        match needed {
            Some(index) => self.run_prefix_through(state, index, side),
            None => {
                self.run_segment(state, side);
                self.apply_deferred_drops(state);
            }
        }
    }

    /// Runs the waiting operations up to index `last` (all of them for `None`), cut at the
    /// marked cut points, with the operations of `tail` at the end of the last piece; leaves the
    /// later ones waiting, and releases what deferred drops can.
    fn run_through(&self, state: &mut ClientState, last: Option<usize>, tail: Segment) {
        let last = match last {
            Some(last) => last,
            None if state.segment.is_empty() => {
                self.apply_deferred_drops(state);
                return;
            }
            None => state.segment.len() - 1,
        };
        let mut done = 0;
        let cuts: Vec<usize> = state
            .marks
            .iter()
            .copied()
            .filter(|&mark| mark < last)
            .chain([last])
            .collect();
        let mut tail = Some(tail);
        for cut in cuts {
            let later = state.segment.split_after(cut - done);
            let mut piece = std::mem::replace(&mut state.segment, later);
            done = cut + 1;
            if cut == last
                && let Some(tail) = tail.take()
            {
                piece.append(tail);
            }
            self.run_segment(state, piece);
        }
        state.marks = state
            .marks
            .iter()
            .filter(|&&mark| mark > last)
            .map(|&mark| mark - done)
            .collect();
        if state.segment.is_empty() {
            // Everything ran: the size cap counts from here.
            state.since_mark = (0, 0);
        }
        self.apply_deferred_drops(state);
    }

    /// Runs `segment` (unless it is empty). When it fails, every tensor it should have made is
    /// marked failed with the reason, reported by the reads of those tensors (and of what is
    /// computed from them); a failure that leaves no tensor is kept for the next read or sync.
    /// A segment of drops
    /// alone (a client releases what it dropped after its last read) computes nothing and is
    /// not counted as a segment run.
    fn run_segment(&self, state: &mut ClientState, segment: Segment) {
        if segment.is_empty() {
            return;
        }
        if segment.computing_len() > 0 {
            StatsCounters::add(&self.counters.segments_run, 1);
        }
        log::debug!(
            "{}: running a segment of {} operations ({:?})",
            self.device,
            segment.len(),
            stats::stats(&self.device)
        );
        let mut outputs = Vec::new();
        let mut cause = None;
        for operation in segment.operations() {
            if let OperationIr::Drop(tensor) = operation {
                state.failed.remove(&tensor.id);
                continue;
            }
            outputs.extend(operation.outputs().map(|tensor| tensor.id));
            if cause.is_none() && !state.failed.is_empty() {
                cause = operation
                    .inputs()
                    .find_map(|tensor| state.failed.get(&tensor.id).cloned());
            }
        }
        if let Err(error) = state.executor.run(segment) {
            if outputs.is_empty() {
                state.pending_error.get_or_insert(error);
                return;
            }
            // The failure is reported by reads of what the segment left without a value (never
            // to another client's read or sync); a segment that used a failed tensor fails for
            // that tensor's reason.
            let cause = cause.unwrap_or_else(|| error.to_string());
            for id in outputs {
                state.failed.insert(id, cause.clone());
            }
        }
    }

    /// Runs the waiting operations through the one at `index` (which another stream's waiting
    /// operations need), cut at the marked cut points, with the operations of `tail` at the end
    /// of the last program; leaves the later ones waiting.
    ///
    /// The run goes on through a learned cut point at most [`NEARBY_OPERATIONS`] computing
    /// operations further (a step's loss, when its outputs are read first). Where no such point
    /// is marked, a cut point is learned and the waiting operations like it are marked too: at
    /// the [summary](Self::summary_after) computed from the needed tensor, if there is one, else
    /// at the needed operation; if the last run, for another read, ended at a learned cut just
    /// before it, the new point replaces that one. Nothing is learned where an earlier waiting
    /// operation has the same signature (a loop's step, read after it ran several times).
    fn run_prefix_through(&self, state: &mut ClientState, index: usize, tail: Segment) {
        let through = match self.nearby_learned_mark(state, index) {
            Some(mark) => mark,
            None => {
                let index = Self::summary_after(state, index).unwrap_or(index);
                let signature = state.segment.signatures()[index];
                if state.segment.signatures()[..index].contains(&signature) {
                    // The same step of a loop that ran several times before the read (a chain
                    // read at its end): a cut learned here would cut every repetition.
                    self.run_through(state, Some(index), tail);
                    state.last_read_cut = None;
                    return;
                }
                let computing_before = state.segment.operations()[..index]
                    .iter()
                    .filter(|operation| !matches!(operation, OperationIr::Drop(_)))
                    .count();
                if let Some(previous) = state.last_read_cut
                    && computing_before < NEARBY_OPERATIONS
                {
                    state.cut_points.forget(previous);
                }
                state
                    .cut_points
                    .learn(signature, &state.segment.operations()[index]);
                self.mark_cuts(state, Some(index));
                index
            }
        };
        let signature = state.segment.signatures()[through];
        self.run_through(state, Some(through), tail);
        state.last_read_cut = Some(signature);
    }

    /// The waiting operation, at most [`NEARBY_OPERATIONS`] computing operations after
    /// `index`, that makes the first one-element tensor no later waiting operation uses — a
    /// value made to be read, such as the loss computed from a step's outputs — when the
    /// operation at `index` makes a larger tensor. A read of the outputs that learns its cut there
    /// leaves the read of the loss that follows nothing to cut, so the first step already runs
    /// as the one program every later step runs.
    fn summary_after(state: &ClientState, index: usize) -> Option<usize> {
        let operations = state.segment.operations();
        let one_element = |operation: &OperationIr| {
            let mut outputs = operation.outputs();
            matches!((outputs.next(), outputs.next()), (Some(out), None) if out.shape.num_elements() == 1)
        };
        if one_element(&operations[index]) {
            return None;
        }
        let computing = operations
            .iter()
            .enumerate()
            .skip(index + 1)
            .filter(|(_, operation)| !matches!(operation, OperationIr::Drop(_)))
            .take(NEARBY_OPERATIONS);
        for (position, operation) in computing {
            if !one_element(operation) {
                continue;
            }
            let out = operation.outputs().next()?.id;
            let used_later = operations[position + 1..].iter().any(|later| {
                !matches!(later, OperationIr::Drop(_))
                    && later.inputs().any(|input| input.id == out)
            });
            if !used_later {
                return Some(position);
            }
        }
        None
    }

    /// The first mark at or after waiting operation `index` that a learned cut point set, if at
    /// most [`NEARBY_OPERATIONS`] computing operations follow `index` up to it.
    fn nearby_learned_mark(&self, state: &ClientState, index: usize) -> Option<usize> {
        let mark = state.marks.iter().copied().find(|&mark| mark >= index)?;
        let operations = state.segment.operations();
        let between = operations[index + 1..=mark]
            .iter()
            .filter(|operation| !matches!(operation, OperationIr::Drop(_)))
            .count();
        let learned = state
            .cut_points
            .cuts_after(state.segment.signatures()[mark]);
        (learned && between <= NEARBY_OPERATIONS).then_some(mark)
    }

    /// Marks the cuts of the waiting operations again, from the first: after `read` (where a
    /// read cut), after those with a learned signature, and where the size cap is reached
    /// counting from the last cut.
    fn mark_cuts(&self, state: &mut ClientState, read: Option<usize>) {
        state.marks.clear();
        state.since_mark = (0, 0);
        for position in 0..state.segment.len() {
            let operation = &state.segment.operations()[position];
            if matches!(operation, OperationIr::Drop(_)) {
                continue;
            }
            let elements = computed_elements(operation);
            let signature = state.segment.signatures()[position];
            if read == Some(position) || self.marks_after(state, signature, elements) {
                state.marks.push(position);
                state.since_mark = (0, 0);
            }
        }
    }

    /// Counts one more computing operation (its `signature`, the `elements` it produces) and
    /// says whether the segment is cut after it: a learned cut point, or the size cap reached.
    fn marks_after(&self, state: &mut ClientState, signature: u64, elements: u64) -> bool {
        let (computing, produced) = &mut state.since_mark;
        *computing += 1;
        *produced += elements;
        let (computing, produced) = (*computing, *produced);
        state.cut_points.cuts_after(signature)
            || match configured_cap(&self.device) {
                Some(cap) => computing >= cap,
                None => {
                    computing >= DEFAULT_SEGMENT_CAP
                        || state.executor.cuts_early(computing, produced)
                }
            }
    }

    /// Uploads the tensors of `ids` still held on the host ([`HostValues`]).
    fn upload_held(&self, state: &mut ClientState, ids: impl IntoIterator<Item = TensorId>) {
        if state.host_values.is_empty() {
            return;
        }
        for id in ids {
            if let Some(data) = state.host_values.take(&id)
                && let Err(error) = state.executor.register_data(id, data)
            {
                state.pending_error.get_or_insert(error);
            }
        }
    }

    /// Releases the tensors of deferred drops that no waiting operation uses any more.
    fn apply_deferred_drops(&self, state: &mut ClientState) {
        if state.deferred_drops.is_empty() {
            return;
        }
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut state.deferred_drops)
            .into_iter()
            .partition(|drop| {
                drop.inputs().all(|input| {
                    !state.segment.touches(&input.id) && !state.side.touches(&input.id)
                })
            });
        state.deferred_drops = waiting;
        if !ready.is_empty()
            && let Err(error) = state.executor.run(Segment::from_operations(ready))
        {
            state.pending_error.get_or_insert(error);
        }
    }

    fn update_live_gauge(&self, state: &ClientState) {
        self.counters
            .live_tensors
            .store(state.live.count(), Ordering::Relaxed);
        self.counters
            .live_bytes
            .store(state.live.bytes(), Ordering::Relaxed);
    }

    /// Copies a tensor to the host (its first replica), running the waiting segment first if
    /// the tensor depends on it.
    pub(crate) fn read_data(&self, tensor: &TensorIr) -> Result<TensorData, BackendError> {
        if let Some(data) = self.read_held(tensor) {
            return Ok(data);
        }
        self.read_with(tensor, |executor| executor.read(tensor))
    }

    /// The value of `tensor` when it is host data not yet uploaded: read without the executor
    /// (every replica holds it, and an executor that only compiles, such as `neuron` without a
    /// chip, reads zeros). A last read forgets it.
    fn read_held(&self, tensor: &TensorIr) -> Option<TensorData> {
        let mut state = self.lock();
        let data = match tensor.status {
            TensorStatus::ReadWrite => state.host_values.take(&tensor.id)?,
            _ => state.host_values.get(&tensor.id)?.clone(),
        };
        if tensor.status == TensorStatus::ReadWrite {
            state.live.remove(&tensor.id);
            self.update_live_gauge(&state);
        }
        Some(data)
    }

    /// Copies every replica of a tensor to the host, running the waiting segment first if the
    /// tensor depends on it.
    pub(crate) fn read_replicas(&self, tensor: &TensorIr) -> Result<Vec<TensorData>, BackendError> {
        self.read_with(tensor, |executor| executor.read_replicas(tensor))
    }

    /// Reads this process's first `count` replicas of `tensor`, and the index of the first.
    pub(crate) fn read_local_replicas(
        &self,
        tensor: &TensorIr,
        count: usize,
    ) -> Result<(usize, Vec<TensorData>), BackendError> {
        self.read_with(tensor, |executor| {
            executor.read_local_replicas(tensor, count)
        })
    }

    /// Reads `tensor` with `read`, once what it needs has run. A tensor that already has its
    /// value is read without running anything.
    fn read_with<T>(
        &self,
        tensor: &TensorIr,
        read: impl FnOnce(&mut dyn Executor) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        let mut state = self.lock();
        if let Some(cause) = state.refusal_of(tensor) {
            return Err(BackendError::NotComputed {
                tensor: tensor.id.to_string(),
                cause,
            });
        }
        self.upload_held(&mut state, [tensor.id]);
        if state.side.must_run_before_reading(tensor) {
            // Another stream's operations (Burn's metrics thread taking the mean of a loss) run
            // with what they need of the capturing stream, cut where the read teaches.
            self.run_side(&mut state);
            if let Some(error) = state.pending_error.take() {
                return Err(error);
            }
        } else if state.segment.must_run_before_reading(tensor) {
            // Burn 0.22's server reads on its runtime's threads, outside the reading stream (its
            // `into_data` runs when the read's future is polled): a read of the capturing
            // stream's tensors is taken for that stream's own and runs everything waiting.
            self.flush(&mut state)?;
        } else if let Some(error) = state.pending_error.take() {
            return Err(error);
        }
        let data = match read(state.executor.as_mut()) {
            Ok(data) => data,
            Err(error) => {
                let cause = if tensor.status == TensorStatus::ReadWrite {
                    state.failed.remove(&tensor.id)
                } else {
                    state.failed.get(&tensor.id).cloned()
                };
                return Err(match cause {
                    Some(cause) => BackendError::NotComputed {
                        tensor: tensor.id.to_string(),
                        cause,
                    },
                    None => error,
                });
            }
        };
        if tensor.status == TensorStatus::ReadWrite {
            state.live.remove(&tensor.id);
            self.update_live_gauge(&state);
        }
        Ok(data)
    }

    /// A new tensor whose replica `r` holds `data[r]` (one entry per replica of the device).
    ///
    /// # Panics
    /// When `data` does not hold one entry per replica, or the entries differ in shape or type.
    pub(crate) fn register_replicas(&self, data: Vec<TensorData>) -> RouterTensor<Self> {
        let replicas = usize::from(self.device.replicas);
        assert_eq!(
            data.len(),
            replicas,
            "{} has {replicas} replicas, data for {} was given",
            self.device,
            data.len()
        );
        let (shape, dtype) = (data[0].shape().clone(), data[0].dtype());
        assert!(
            data.iter()
                .all(|replica| *replica.shape() == shape && replica.dtype() == dtype),
            "the replicas of one tensor must share a shape and a type"
        );
        self.register_host_data(shape, dtype, |executor, id| {
            executor.register_replicas(id, data)
        })
    }

    /// Registers host data with the executor under a fresh id (errors are reported at the next
    /// read or sync).
    fn register_host_data(
        &self,
        shape: burn_backend::Shape,
        dtype: DType,
        register: impl FnOnce(&mut dyn Executor, TensorId) -> Result<(), BackendError>,
    ) -> RouterTensor<Self> {
        let id = next_tensor_id();
        let mut state = self.lock();
        if let Err(error) = register(state.executor.as_mut(), id) {
            state.pending_error.get_or_insert(error);
        }
        state.live.insert(id, &shape, dtype);
        self.update_live_gauge(&state);
        drop(state);
        RouterTensor::new(id, shape, dtype, self.clone())
    }
    /// Appends `operation` to the waiting segment with its signature, marking a cut after it
    /// where a learned cut point or the size cap says so.
    fn capture(&self, state: &mut ClientState, operation: OperationIr) {
        let is_drop = matches!(operation, OperationIr::Drop(_));
        let mut signature = 0;
        let mut marked = false;
        if !is_drop {
            let structure = cut_points::structure(&operation);
            signature = cut_points::signature(structure, state.previous_structure);
            state.previous_structure = structure;
            marked = self.marks_after(state, signature, computed_elements(&operation));
        }
        if marked {
            let index = state.segment.len();
            state.marks.push(index);
            state.since_mark = (0, 0);
        }
        state.segment.push_signed(operation, signature);
    }
}

impl TrainiumClient {
    /// Whether `operation` is refused: it makes a tensor above the device's limits
    /// ([`super::limits`]), or it uses one a refused operation was to make. Its outputs are
    /// then never made: reading one reports why. The drop of a refused tensor is consumed here.
    fn refuse(&self, state: &mut ClientState, operation: &OperationIr, is_drop: bool) -> bool {
        if is_drop {
            return operation
                .inputs()
                .next()
                .is_some_and(|input| state.forget_refused(&input.id).is_some());
        }
        let cause = operation
            .inputs()
            .find(|input| state.refused.contains(&input.id))
            .and_then(|input| state.failed.get(&input.id).cloned())
            .or_else(|| {
                operation.outputs().find_map(|output| {
                    super::limits::tensor_refusal(&self.device, &output.shape, output.dtype)
                })
            })
            .or_else(|| self.client_refusal(state, operation));
        let Some(cause) = cause else {
            return false;
        };
        log::warn!("{cause}");
        for output in operation.outputs() {
            state.refuse(output.id, &cause);
        }
        true
    }

    /// Why `operation` would take its client above the most one client may hold, if it would:
    /// its outputs' bytes, less those of the client's inputs it consumes.
    fn client_refusal(&self, state: &ClientState, operation: &OperationIr) -> Option<String> {
        let client = live::current_client();
        let made: u64 = operation
            .outputs()
            .map(|output| {
                super::limits::tensor_bytes(&output.shape, output.dtype).unwrap_or(u64::MAX)
            })
            .fold(0, u64::saturating_add);
        let consumed: u64 = operation
            .inputs()
            .filter(|input| input.status == TensorStatus::ReadWrite)
            .map(|input| state.live.bytes_held_by(&input.id, client))
            .sum();
        super::limits::client_refusal(
            &self.device,
            state.live.client_bytes(client),
            made.saturating_sub(consumed),
        )
    }
}

impl TrainiumClient {
    /// Why data of `shape` and `dtype` the client uploads is not kept, if it is not: above the
    /// device's largest tensor, or the most its client may hold.
    fn upload_refusal(&self, shape: &burn_backend::Shape, dtype: DType) -> Option<String> {
        super::limits::tensor_refusal(&self.device, shape, dtype).or_else(|| {
            let held = self.lock().live.client_bytes(live::current_client());
            let bytes = super::limits::tensor_bytes(shape, dtype).unwrap_or(u64::MAX);
            super::limits::client_refusal(&self.device, held, bytes)
        })
    }
}

impl ClientState {
    /// Records that tensor `id` is never made, and why.
    fn refuse(&mut self, id: TensorId, cause: &str) {
        self.refused.insert(id);
        self.failed.insert(id, cause.to_string());
    }

    /// Why `tensor` was refused, if it was; a last read forgets it.
    fn refusal_of(&mut self, tensor: &TensorIr) -> Option<String> {
        if tensor.status == TensorStatus::ReadWrite {
            return self.forget_refused(&tensor.id);
        }
        if !self.refused.contains(&tensor.id) {
            return None;
        }
        self.failed.get(&tensor.id).cloned()
    }

    /// Forgets refused tensor `id` (dropped, consumed or read for the last time): why it was
    /// refused, if it was.
    fn forget_refused(&mut self, id: &TensorId) -> Option<String> {
        self.refused
            .remove(id)
            .then(|| self.failed.remove(id).unwrap_or_default())
    }
}

impl RouterClient for TrainiumClient {
    type Device = TrainiumDevice;

    fn register_op(&self, operation: OperationIr) {
        let _span = tracing::info_span!(phase::CAPTURE).entered();
        let start = Instant::now();
        StatsCounters::add(&self.counters.operations_captured, 1);
        // The data of an `Init` was registered with the executor already.
        if matches!(operation, OperationIr::Init(_)) {
            return;
        }
        let mut state = self.lock();
        let is_drop = matches!(operation, OperationIr::Drop(_));
        if self.refuse(&mut state, &operation, is_drop) {
            // What the refused operation consumed is freed, as its drop (which never comes)
            // would free it.
            let consumed: Vec<TensorIr> = operation
                .inputs()
                .filter(|input| !is_drop && input.status == TensorStatus::ReadWrite)
                // A refused tensor consumed here was never made: only forgotten.
                .filter(|input| state.forget_refused(&input.id).is_none())
                .cloned()
                .collect();
            drop(state);
            StatsCounters::add_elapsed(&self.counters.capture_micros, start);
            for tensor in consumed {
                self.register_op(OperationIr::Drop(tensor));
            }
            return;
        }
        for input in operation.inputs() {
            if is_drop || input.status == TensorStatus::ReadWrite {
                state.live.remove(&input.id);
            }
        }
        for output in operation.outputs() {
            state.live.insert(output.id, &output.shape, output.dtype);
        }
        self.update_live_gauge(&state);
        if !state.host_values.is_empty() {
            if is_drop
                && operation
                    .inputs()
                    .all(|input| state.host_values.contains(&input.id))
            {
                for input in operation.inputs() {
                    state.host_values.take(&input.id);
                }
                return;
            }
            if state.host_values.can_fold(&operation) {
                match state.host_values.fold(operation) {
                    Ok(()) => StatsCounters::add(&self.counters.host_folded, 1),
                    Err(error) => {
                        state.pending_error.get_or_insert(error);
                    }
                }
                StatsCounters::add_elapsed(&self.counters.capture_micros, start);
                return;
            }
            self.upload_held(&mut state, operation.inputs().map(|input| input.id));
        }
        let reads_side = operation
            .inputs()
            .any(|input| state.side.touches(&input.id));
        if is_drop && (state.is_other_stream() || reads_side) {
            state.deferred_drops.push(operation);
            self.apply_deferred_drops(&mut state);
            StatsCounters::add_elapsed(&self.counters.capture_micros, start);
            return;
        }
        if !is_drop {
            if state.is_other_stream() && (state.segment.computing_len() > 0 || reads_side) {
                state.side.push(operation);
                StatsCounters::add_elapsed(&self.counters.capture_micros, start);
                return;
            }
            if reads_side {
                // The capturing stream uses what another stream computed: those operations
                // join its segment here.
                for side in state.side.take().into_operations() {
                    self.capture(&mut state, side);
                }
            }
            state.capturing_stream = Some(StreamId::current());
        }
        self.capture(&mut state, operation);
        StatsCounters::add_elapsed(&self.counters.capture_micros, start);
        // Cuts are only marked as the size cap is reached: the segment runs (as the pieces
        // between its marks) when something is read or synced, so that where a stream is cut
        // never depends on when another stream's reads ran part of it. It runs through its last
        // mark on its own only when it grows far beyond the cap.
        if state.segment.computing_len() >= HELD_OPERATIONS_LIMIT
            && let Some(&last) = state.marks.last()
        {
            self.run_through(&mut state, Some(last), Segment::default());
        }
    }

    fn read_tensor_async(&self, tensor: TensorIr) -> DynFut<Result<TensorData, ExecutionError>> {
        let result = self.read_data(&tensor).map_err(ExecutionError::from);
        Box::pin(async move { result })
    }

    fn sync(&self) -> Result<(), ExecutionError> {
        let mut state = self.lock();
        // After a sync every tensor is on the device, those made from host data included.
        let held: Vec<TensorId> = state.host_values.ids().collect();
        self.upload_held(&mut state, held);
        self.flush(&mut state).map_err(ExecutionError::from)
    }

    fn create_empty_handle(&self) -> TensorId {
        next_tensor_id()
    }

    fn register_tensor_data(&self, data: TensorData) -> RouterTensor<Self> {
        let (shape, dtype) = (data.shape().clone(), data.dtype());
        if let Some(cause) = self.upload_refusal(&shape, dtype) {
            log::warn!("{cause}");
            let id = next_tensor_id();
            self.lock().refuse(id, &cause);
            return RouterTensor::new(id, shape, dtype, self.clone());
        }
        if HostValues::holds_data_of(&data) {
            let id = next_tensor_id();
            let mut state = self.lock();
            state.host_values.insert(id, data);
            state.live.insert(id, &shape, dtype);
            self.update_live_gauge(&state);
            drop(state);
            return RouterTensor::new(id, shape, dtype, self.clone());
        }
        self.register_host_data(shape, dtype, |executor, id| {
            executor.register_data(id, data)
        })
    }

    fn device(&self) -> Self::Device {
        self.device
    }

    fn seed(&self, seed: u64) {
        // Random operations captured before the seed must draw from the old state: they run
        // first. Without any, the waiting operations stay for the program after the seed (a
        // training step seeded before its update stays one program).
        let mut state = self.lock();
        let draws = |operations: &[OperationIr]| operations.iter().any(draws_random);
        if (draws(state.segment.operations()) || !state.side.is_empty())
            && let Err(error) = self.flush(&mut state)
        {
            state.pending_error.get_or_insert(error);
        }
        state.executor.seed(seed);
    }

    fn dtype_usage(&self, dtype: DType) -> DTypeUsageSet {
        Flex::dtype_usage(&FlexDevice, dtype)
    }

    /// Runs the waiting segment (a step boundary, like torch-xla's `mark_step`); an error is
    /// reported by the next read or sync.
    fn flush(&self) {
        let mut state = self.lock();
        if let Err(error) = self.flush(&mut state) {
            state.pending_error.get_or_insert(error);
        }
    }

    fn register_and_execute_graph(
        &self,
        graph_id: GraphId,
        relative_graph: Vec<OperationIr>,
        bindings: GraphBindings,
    ) {
        let graph = Graph::new(relative_graph);
        self.lock().graphs.insert(graph_id, graph.clone());
        self.register_bound(&graph, bindings);
    }

    fn execute_graph(&self, graph_id: GraphId, bindings: GraphBindings) {
        let graph = self.lock().graphs.get(&graph_id).cloned();
        match graph {
            Some(graph) => self.register_bound(&graph, bindings),
            None => {
                let error = BackendError::Execution {
                    executor: "capture",
                    reason: format!("graph {graph_id:?} was never registered"),
                };
                self.lock().pending_error.get_or_insert(error);
            }
        }
    }

    /// `new_id` becomes a second tensor with `src_id`'s value: captured as a reshape to the same
    /// shape, which every executor computes as a copy or an alias.
    fn register_alias(&self, new_id: TensorId, src_id: TensorId) {
        let known = self.lock().live.get(&src_id);
        let Some((shape, dtype)) = known else {
            let error = BackendError::Execution {
                executor: "capture",
                reason: format!("alias of tensor {} which is not live", src_id.value()),
            };
            self.lock().pending_error.get_or_insert(error);
            return;
        };
        let reshape = BaseOperationIr::Reshape(ShapeOpIr {
            input: TensorIr {
                id: src_id,
                shape: shape.clone(),
                status: TensorStatus::ReadOnly,
                dtype,
            },
            out: TensorIr {
                id: new_id,
                shape,
                status: TensorStatus::NotInit,
                dtype,
            },
        });
        let operation = if dtype.is_float() {
            OperationIr::BaseFloat(reshape)
        } else if dtype.is_bool() {
            OperationIr::BaseBool(reshape)
        } else {
            OperationIr::BaseInt(reshape)
        };
        self.register_op(operation);
    }
}

impl TrainiumClient {
    /// Captures the operations of `graph` bound to one invocation.
    fn register_bound(&self, graph: &Graph, bindings: GraphBindings) {
        for operation in graph.bind(bindings).operations {
            self.register_op(operation);
        }
    }
}

/// Whether `operation` draws random numbers (from the generator a seed resets).
fn draws_random(operation: &OperationIr) -> bool {
    use burn_ir::{FloatOperationIr, NumericOperationIr};
    matches!(
        operation,
        OperationIr::Float(_, FloatOperationIr::Random(_))
            | OperationIr::NumericFloat(_, NumericOperationIr::IntRandom(_))
            | OperationIr::NumericInt(_, NumericOperationIr::IntRandom(_))
    )
}
