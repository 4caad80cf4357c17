//! Cross-crate integration tests of burn-trainium and HLAT, in one test binary (`cargo test -p
//! integration-tests`):
//!
//! - `differential`: every operation family on `Trainium`'s `host` and `xla` executors against
//!   Flex (Burn's CPU backend), in f32 and bf16, with one tolerance table (`support`);
//! - `autodiff`: gradients against Flex with autodiff;
//! - `cnn_training`: a small CNN trained on `xla` with host fallbacks refused, against Flex;
//! - `module_ops`: convolutions, pooling and interpolation, forward and backward, against Flex
//!   with autodiff;
//! - `fuzz`: mutated inputs for every parser of user files: no panic, no hang, bounded memory;
//! - `evaluation` and `generation`: fixed sets of programs on a compiled device;
//! - `families`: every LLaMA-family fixture on `xla`, and under tensor parallelism;
//! - `hlat_training`: the real HLAT model trained for a few steps with the project's trainer on
//!   `host` and `xla`, against Flex;
//! - `neuron_operators`: the HLO modules of an HLAT training step, as `neuronx-cc` would receive
//!   them, use only operators of the Neuron compiler's published list;
//! - `lora_training`: LoRA adapters of a frozen base under data and tensor parallelism;
//! - `expert_parallel`: a mixture's experts split over replicas against the whole layer;
//! - `parallel_training`: the pretraining job on replicated devices against one device;
//! - `pipeline_training`: the same with the layers cut into pipeline stages;
//! - `segments`: how the lazy client cuts and runs segments;
//! - `served_clients`: a client process of a served device killed in the middle of its steps;
//! - `repository`: no tracked file refers to a path outside the repository.

#[cfg(test)]
mod autodiff;
#[cfg(test)]
mod cnn_training;
#[cfg(test)]
mod differential;
#[cfg(test)]
mod evaluation;
#[cfg(test)]
mod expert_parallel;
#[cfg(test)]
mod families;
#[cfg(test)]
mod fully_sharded;
#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod generation;
#[cfg(test)]
mod hlat_training;
#[cfg(test)]
mod lora_training;
#[cfg(test)]
mod module_ops;
#[cfg(test)]
mod neuron_operators;
#[cfg(test)]
mod parallel_training;
#[cfg(test)]
mod pipeline_training;
#[cfg(test)]
mod repository;
#[cfg(test)]
mod segments;
#[cfg(test)]
mod served_clients;
#[cfg(test)]
mod support;
