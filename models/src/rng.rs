//! The project's one seeded random number generator: SplitMix64 (Steele, Lea and Flood, 2014),
//! whose sequence never changes between releases.
//!
//! Reproducible shuffles, splits, generated text and generated benchmark inputs must not depend
//! on a dependency's choice of algorithm, so everything seeded in the project draws from this
//! generator: the data pipeline (`hlat_train::data::rng` re-exports it for the sampler's stable
//! stream), [`crate::vision::generated_batch`] and the benchmarks' generated inputs.

/// The SplitMix64 generator.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// A generator for a seed and a stream number (epoch, document index...): different streams
    /// of one seed are independent.
    pub fn for_stream(seed: u64, stream: u64) -> Self {
        Self::new(mix(seed ^ mix(stream.wrapping_add(0x632b_e59b_d9b4_e019))))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.state)
    }

    /// A uniform integer in `0..bound` (`bound` > 0), without modulo bias.
    pub fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0, "SplitMix64::below needs a positive bound");
        let zone = u64::MAX - u64::MAX % bound;
        loop {
            let value = self.next_u64();
            if value < zone {
                return value % bound;
            }
        }
    }

    /// A uniform float in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Shuffles `items` in place (Fisher-Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for last in (1..items.len()).rev() {
            let pick = self.below(last as u64 + 1) as usize;
            items.swap(last, pick);
        }
    }
}

/// The SplitMix64 output function: a bijective mix of 64 bits (also the project's hash of a
/// seed and a number into a new seed).
pub fn mix(value: u64) -> u64 {
    let mut z = value;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference outputs of SplitMix64 for seed 1234567 (Vigna's `splitmix64.c`): the
    /// stream every seeded result of the project rests on.
    #[test]
    fn the_stream_is_the_reference_splitmix64() {
        let mut rng = SplitMix64::new(1234567);
        let first: Vec<u64> = (0..5).map(|_| rng.next_u64()).collect();
        assert_eq!(
            first,
            [
                6457827717110365317,
                3203168211198807973,
                9817491932198370423,
                4593380528125082431,
                16408922859458223821,
            ]
        );
    }
}
