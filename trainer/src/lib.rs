//! HLAT training: the data pipeline, Burn learner wiring, optimizer and schedule, parallelism.

pub mod data;
