//! The sampler: per-epoch shuffles, and resuming from a saved state.

use hlat_train::data::{RowSource, Sampler, SamplerState};

/// Row `i` is `[i, i, i]`, so a row names itself.
pub(crate) struct Numbered(pub(crate) usize);

impl RowSource for Numbered {
    fn row_len(&self) -> usize {
        3
    }

    fn num_rows(&self) -> usize {
        self.0
    }

    fn row(&self, index: usize) -> Vec<u32> {
        vec![index as u32; 3]
    }
}

fn ids(batch: Vec<Vec<u32>>) -> Vec<u32> {
    batch.into_iter().map(|row| row[0]).collect()
}

#[test]
fn every_epoch_is_a_different_permutation_of_all_rows() {
    let mut sampler = Sampler::new(Numbered(97), 3).unwrap();
    let mut epochs = Vec::new();
    for _ in 0..3 {
        let epoch = ids(sampler.next_batch(97));
        let mut sorted = epoch.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..97).collect::<Vec<u32>>());
        epochs.push(epoch);
    }
    assert_ne!(epochs[0], epochs[1]);
    assert_ne!(epochs[1], epochs[2]);
    assert_ne!(
        epochs[0],
        (0..97).collect::<Vec<u32>>(),
        "rows are shuffled"
    );
    assert_eq!(
        sampler.state(),
        SamplerState {
            epoch: 2,
            position: 97,
            seed: 3
        }
    );
    // Another seed, another order; the same seed, the same order.
    let other = ids(Sampler::new(Numbered(97), 4).unwrap().next_batch(97));
    assert_ne!(other, epochs[0]);
    assert_eq!(
        ids(Sampler::new(Numbered(97), 3).unwrap().next_batch(97)),
        epochs[0]
    );
}

#[test]
fn a_resumed_sampler_returns_the_rows_of_an_uninterrupted_one() {
    let batch_size = 8;
    let mut uninterrupted = Sampler::new(Numbered(50), 11).unwrap();
    let reference: Vec<Vec<u32>> = (0..40)
        .map(|_| ids(uninterrupted.next_batch(batch_size)))
        .collect();
    // Interrupt at several steps, including inside and at the end of an epoch (50 rows).
    for stop in [0, 1, 6, 7, 13, 25] {
        let mut first = Sampler::new(Numbered(50), 11).unwrap();
        for expected in &reference[..stop] {
            assert_eq!(&ids(first.next_batch(batch_size)), expected);
        }
        let saved = serde_json::to_string(&first.state()).unwrap();
        drop(first);
        let mut resumed = Sampler::new(Numbered(50), 0).unwrap();
        resumed
            .restore(serde_json::from_str(&saved).unwrap())
            .unwrap();
        for expected in &reference[stop..] {
            assert_eq!(
                &ids(resumed.next_batch(batch_size)),
                expected,
                "resumed at {stop}"
            );
        }
    }
}

#[test]
fn a_state_from_other_data_and_an_empty_source_are_errors() {
    let mut sampler = Sampler::new(Numbered(10), 1).unwrap();
    let error = sampler
        .restore(SamplerState {
            epoch: 0,
            position: 11,
            seed: 1,
        })
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains("position 11") && error.contains("10 rows"),
        "{error}"
    );
    assert!(Sampler::new(Numbered(0), 1).is_err());
}

#[test]
fn an_advanced_state_is_the_state_after_drawing_that_many_rows() {
    let start = SamplerState {
        epoch: 2,
        position: 5,
        seed: 9,
    };
    for drawn in [0u64, 1, 6, 7, 8, 13, 20, 31, 50] {
        let mut sampler = Sampler::new(Numbered(13), 9).unwrap();
        sampler.restore(start).unwrap();
        for _ in 0..drawn {
            sampler.next_batch(1);
        }
        assert_eq!(
            start.advanced(drawn, 13),
            sampler.state(),
            "{drawn} rows drawn"
        );
    }
}
