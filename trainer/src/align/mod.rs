//! Preference alignment (DPO and ORPO as TRL computes them): preference records tokenized as
//! TRL tokenizes them ([`records`]), pairs as batches of the language model ([`batch`]; the
//! trainer's optimizer step trains them under data and tensor parallelism), and the losses with
//! the metrics TRL logs ([`loss`]).

pub mod batch;
pub mod loss;
pub mod records;

pub use batch::{PreferenceBatch, PreferenceObjective};
pub use loss::{DpoLoss, PairLogProbs, PreferenceLoss, dpo, orpo};
pub use records::{AlignMethod, PreferenceExample, PreferenceSequence, PreferenceTokenizer};
