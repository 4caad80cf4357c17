//! Preference alignment (DPO and ORPO as TRL computes them): preference records tokenized as
//! TRL tokenizes them ([`records`]) and the losses with the metrics TRL logs ([`loss`]).

pub mod loss;
pub mod records;

pub use loss::{DpoLoss, PairLogProbs, PreferenceLoss, dpo, orpo};
pub use records::{AlignMethod, PreferenceExample, PreferenceSequence, PreferenceTokenizer};
