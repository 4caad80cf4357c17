//! Bindings to the PJRT C API (`xla/pjrt/c/pjrt_c_api.h`), loaded at run time from any plugin
//! (XLA CPU, CUDA, Neuron), and safe wrappers that free what they own on drop.
//!
//! ```no_run
//! use trainium_ffi::pjrt::{Client, CompileOptions, Plugin, ProgramFormat};
//! let plugin = Plugin::load("libpjrt_cpu.so")?;
//! let client = Client::new(&plugin, &[])?;
//! let device = client.devices()[0];
//! # let hlo_module_proto: Vec<u8> = Vec::new();
//! let executable = client.compile(&hlo_module_proto, ProgramFormat::Hlo, &CompileOptions::on_device(device.id))?;
//! # Ok::<(), trainium_ffi::pjrt::PjrtError>(())
//! ```
//!
//! Every failing call returns a [`PjrtError`] carrying the plugin's message; compile options are
//! always passed (a plugin aborts the process without them).

mod buffer;
mod client;
mod compile_options;
mod element_type;
mod error;
mod event;
mod executable;
mod key_value;
mod plugin;
pub mod raw;

pub use buffer::Buffer;
pub use client::{Client, CreateOption, Device, ProgramFormat};
pub use compile_options::{CompileOptions, OptionValue};
pub use element_type::ElementType;
pub use error::PjrtError;
pub use executable::{CompiledMemoryStats, LoadedExecutable};
pub use key_value::{Distributed, KeyValueError, KeyValueStore};
pub use plugin::Plugin;
