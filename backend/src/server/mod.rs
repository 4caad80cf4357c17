//! The executors as a Burn 0.22 device.
//!
//! Burn 0.22 dispatches `Tensor` over a compiled-in list of backends; the route it gives a backend
//! outside that list is its remote target: a `burn_remote::server::BackendServer` serves the
//! backend, and a client reaches it as a `burn::tensor::Device`. This module runs that server for
//! [`crate::Trainium`]:
//!
//! - [`device`] serves a Trainium device inside the calling process (a loopback WebSocket on a
//!   port the system picks, open only to this process's own random token) and returns the Burn
//!   device that reaches it: `burn_trainium::device("xla:0")?`. Autodiff runs on the client
//!   side (`device.autodiff()`); the server sees the forward and backward operations as one
//!   stream, captured and compiled as with the backend used directly.
//! - [`set_default_device`] serves one the same way but makes it Burn's default device
//!   (`Device::default()`), for programs that create tensors there (Burn's own examples do).
//! - [`serve`] serves devices to other processes and machines (`hlat serve`): loopback unless told
//!   otherwise, and a non-loopback address only with a shared secret.

mod access;
mod custom_ops;
mod frames;
mod gate;
pub(crate) mod in_process;
mod standalone;

pub use access::Access;
pub use gate::DEFAULT_MAX_CONNECTIONS;
pub use in_process::{device, device_from_env, flex_device, set_default_device};
pub use standalone::{BoundServer, ServeOptions, bind, serve};
