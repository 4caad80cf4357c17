//! One file per `hlat` subcommand.

pub mod bench;
pub mod compile;
pub mod convert;
pub mod data;
pub mod eval;
pub mod generate;
pub mod info;
pub mod pretrain;
