//! The data pipeline's seeded generator: the project's one SplitMix64, [`hlat::rng`], whose
//! sequence never changes between releases, so shuffles, splits and generated text stay the same
//! from run to run and release to release.

pub use hlat::rng::{SplitMix64, mix};
