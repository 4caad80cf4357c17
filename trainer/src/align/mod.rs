//! Preference alignment (DPO and ORPO as TRL computes them): preference records tokenized as
//! TRL tokenizes them ([`records`]), pairs as batches of the language model ([`batch`]; the
//! trainer's optimizer step trains them under data and tensor parallelism), and the losses with
//! the metrics TRL logs ([`loss`]). A run (`hlat align`) draws [`pairs`] and, for DPO, computes
//! the reference model's log-probabilities once before training ([`reference`]), pinned with
//! the run's settings in its folder ([`run_state`]).

pub mod batch;
pub mod loss;
pub mod pairs;
pub mod records;
pub mod reference;
pub mod run_state;

pub use batch::{PreferenceBatch, PreferenceObjective};
pub use loss::{DpoLoss, PairLogProbs, PreferenceLoss, PreferenceMetrics, dpo, orpo};
pub use pairs::PreferencePairs;
pub use records::{AlignMethod, PreferenceExample, PreferenceSequence, PreferenceTokenizer};
