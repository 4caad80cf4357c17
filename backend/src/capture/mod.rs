//! Capture: Burn's router hands every operation to the client of its device, which buffers them
//! into a [`Segment`] and runs the segment on the device's executor when a tensor is read or on
//! `sync`, as the pieces between its marked cuts: where the size cap is reached, and where other
//! streams' computations taught it (`cut_points`). Small tensors made from host data wait on the
//! host until a program uses them (`host_values`).

mod channel;
mod client;
mod cut_points;
mod fingerprint;
mod host_values;
pub(crate) mod limits;
mod live;
mod segment;

pub use channel::TrainiumChannel;
pub(crate) use client::next_tensor_id;
pub use client::{
    DEFAULT_SEGMENT_CAP, SEGMENT_CAP_ENV, TrainiumClient, check_device, set_segment_cap,
};
pub use fingerprint::{Fingerprint, FingerprintedSegment};
pub use limits::{MAX_TENSOR_BYTES_ENV, set_max_client_bytes, set_max_tensor_bytes};
pub use segment::{Segment, SegmentBoundary};
