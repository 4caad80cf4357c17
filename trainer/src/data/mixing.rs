//! Mixing several row sources by weight, measured in tokens.
//!
//! A [`Mixture`] is itself a [`RowSource`] of `total` rows, of which source `s` contributes
//! `weight_s * total` rows (largest-remainder rounding, so the counts are exact to one row). All
//! sources have the same row length, so the proportions hold in tokens too. By default `total` is
//! the largest mixture in which no source repeats a row (the source with the least data for its
//! weight is used exactly once); [`Mixture::with_total_tokens`] sets it instead, and a source then
//! repeats its rows as often as needed.
//!
//! The mixture's rows are grouped by source (rows `0..n_0` from the first source, then the
//! second...); read them through a [`super::Sampler`], whose shuffle interleaves the sources.
//! Which rows of a source are taken, and in which order, is a seeded permutation per pass over
//! that source, so the mixture is deterministic for a seed and a smaller share of a large source
//! is spread over all of it.

use super::error::DataError;
use super::rng::SplitMix64;
use super::rows::RowSource;

/// Rows drawn from several sources in proportion to their weights.
pub struct Mixture {
    sources: Vec<Box<dyn RowSource>>,
    /// `starts[s]` is the mixture row of source `s`'s first row; the last entry is the total.
    starts: Vec<usize>,
    row_len: usize,
    seed: u64,
}

impl Mixture {
    /// Mixes `sources` (each with a positive weight; the weights are normalized) into the
    /// largest mixture in which no source repeats a row.
    pub fn new(sources: Vec<(Box<dyn RowSource>, f64)>, seed: u64) -> Result<Self, DataError> {
        Self::build(sources, seed, None)
    }

    /// Mixes `sources` into a mixture of `total_tokens` tokens (rounded down to whole rows).
    pub fn with_total_tokens(
        sources: Vec<(Box<dyn RowSource>, f64)>,
        seed: u64,
        total_tokens: u64,
    ) -> Result<Self, DataError> {
        Self::build(sources, seed, Some(total_tokens))
    }

    fn build(
        sources: Vec<(Box<dyn RowSource>, f64)>,
        seed: u64,
        total_tokens: Option<u64>,
    ) -> Result<Self, DataError> {
        let Some(row_len) = sources.first().map(|(source, _)| source.row_len()) else {
            return Err(DataError::EmptyInput("no source to mix".into()));
        };
        for (index, (source, weight)) in sources.iter().enumerate() {
            if !(weight.is_finite() && *weight > 0.0) {
                return Err(DataError::setting(
                    "mixture weight",
                    format!("source {index} has weight {weight}; weights must be positive"),
                ));
            }
            if source.row_len() != row_len {
                return Err(DataError::setting(
                    "mixture row length",
                    format!(
                        "source {index} has rows of {} tokens, source 0 of {row_len}",
                        source.row_len()
                    ),
                ));
            }
            if source.num_rows() == 0 {
                return Err(DataError::EmptyInput(format!(
                    "mixture source {index} has no row"
                )));
            }
        }
        // Scaled by the largest weight first, so huge weights cannot sum to infinity.
        let largest = sources
            .iter()
            .map(|(_, weight)| *weight)
            .fold(0.0, f64::max);
        let scaled: Vec<f64> = sources.iter().map(|(_, weight)| weight / largest).collect();
        let scaled_sum: f64 = scaled.iter().sum();
        let shares: Vec<f64> = scaled.iter().map(|weight| weight / scaled_sum).collect();
        if let Some(index) = shares.iter().position(|share| *share <= 0.0) {
            return Err(DataError::setting(
                "mixture weight",
                format!(
                    "source {index} has weight {:e}, too small beside the largest ({largest:e}) \
                     to draw any row",
                    sources[index].1
                ),
            ));
        }
        let total = match total_tokens {
            Some(tokens) => (tokens / row_len as u64) as usize,
            None => sources
                .iter()
                .zip(&shares)
                .map(|((source, _), share)| (source.num_rows() as f64 / share).floor() as usize)
                .min()
                .unwrap(),
        };
        let counts = apportion(total, &shares);
        let mut starts = vec![0];
        for count in &counts {
            starts.push(starts.last().unwrap() + count);
        }
        log::info!("mixing {total} rows of {row_len} tokens: {counts:?} per source");
        Ok(Self {
            sources: sources.into_iter().map(|(source, _)| source).collect(),
            starts,
            row_len,
            seed,
        })
    }

    /// The number of mixture rows each source contributes.
    pub fn rows_per_source(&self) -> Vec<usize> {
        self.starts
            .windows(2)
            .map(|pair| pair[1] - pair[0])
            .collect()
    }

    /// The source and the source row behind mixture row `index`.
    pub fn locate(&self, index: usize) -> (usize, usize) {
        let source = self.starts.partition_point(|&start| start <= index) - 1;
        let draw = (index - self.starts[source]) as u64;
        let rows = self.sources[source].num_rows() as u64;
        let (pass, offset) = (draw / rows, draw % rows);
        let stream = ((source as u64) << 32) ^ pass;
        let row = AffinePermutation::new(rows, &mut SplitMix64::for_stream(self.seed, stream))
            .apply(offset);
        (source, row as usize)
    }
}

impl RowSource for Mixture {
    fn row_len(&self) -> usize {
        self.row_len
    }

    fn num_rows(&self) -> usize {
        *self.starts.last().unwrap()
    }

    fn row(&self, index: usize) -> Vec<u32> {
        let (source, row) = self.locate(index);
        self.sources[source].row(row)
    }
}

/// Splits `total` into integer parts proportional to `shares` (which sum to 1), by largest
/// remainder: the parts sum to `total` and each is within one of its exact share.
fn apportion(total: usize, shares: &[f64]) -> Vec<usize> {
    let exact: Vec<f64> = shares.iter().map(|share| share * total as f64).collect();
    let mut counts: Vec<usize> = exact.iter().map(|value| value.floor() as usize).collect();
    let mut by_remainder: Vec<usize> = (0..shares.len()).collect();
    by_remainder.sort_by(|&a, &b| {
        let remainder = |i: usize| exact[i] - counts[i] as f64;
        remainder(b).total_cmp(&remainder(a)).then(a.cmp(&b))
    });
    let missing = total.saturating_sub(counts.iter().sum());
    for &index in by_remainder.iter().cycle().take(missing) {
        counts[index] += 1;
    }
    counts
}

/// The permutation `x -> (a * x + b) mod n` of `0..n`, with `a` coprime to `n`.
struct AffinePermutation {
    n: u64,
    a: u64,
    b: u64,
}

impl AffinePermutation {
    fn new(n: u64, rng: &mut SplitMix64) -> Self {
        let a = loop {
            let candidate = 1 + rng.below(n.max(2) - 1);
            if gcd(candidate, n) == 1 {
                break candidate;
            }
        };
        let b = rng.below(n);
        Self { n, a, b }
    }

    fn apply(&self, x: u64) -> u64 {
        ((self.a as u128 * x as u128 + self.b as u128) % self.n as u128) as u64
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}
