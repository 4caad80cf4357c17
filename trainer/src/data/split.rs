//! The validation split: which documents are held out.

use super::rng::SplitMix64;

/// Whether document number `index` belongs to the validation split that holds out `fraction` of
/// the documents. The choice depends only on the seed and the index, so a document stays on its
/// side of the split however the data is processed.
pub fn is_validation(seed: u64, index: u64, fraction: f64) -> bool {
    fraction > 0.0 && SplitMix64::for_stream(seed, index).unit() < fraction
}
