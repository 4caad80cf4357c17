//! Mixing sources by weight, in tokens.

use hlat_train::data::{Mixture, PackedRows, RowSource, Sampler};

/// A source of `rows` rows of 16 tokens, every token `tag * 1_000_000 + position`.
fn source(tag: u32, rows: usize) -> Box<dyn RowSource> {
    let tokens: Vec<u32> = (0..rows as u32 * 16).map(|t| tag * 1_000_000 + t).collect();
    Box::new(PackedRows::new(tokens, 15).unwrap())
}

fn tag(token: u32) -> usize {
    (token / 1_000_000) as usize
}

#[test]
fn sampled_tokens_follow_the_weights_within_one_percent() {
    let mixture = Mixture::new(
        vec![(source(0, 60_000), 0.99), (source(1, 40_000), 0.01)],
        5,
    )
    .unwrap();
    // Without repetition the domain source limits the mixture: 60000 / 0.99 rows.
    assert_eq!(mixture.num_rows(), 60_606);
    assert_eq!(mixture.rows_per_source(), vec![60_000, 606]);
    let mut sampler = Sampler::new(mixture, 9).unwrap();
    let mut tokens = [0usize; 2];
    for _ in 0..40 {
        for row in sampler.next_batch(500) {
            assert!(
                row.iter().all(|&t| tag(t) == tag(row[0])),
                "a row comes from one source"
            );
            tokens[tag(row[0])] += row.len();
        }
    }
    let total = (tokens[0] + tokens[1]) as f64;
    let general = tokens[1] as f64 / total;
    assert!(
        (general - 0.01).abs() < 0.01 * 0.01 + 0.001,
        "general share {general}"
    );
    assert!(
        (tokens[0] as f64 / total - 0.99).abs() < 0.01,
        "domain share"
    );
}

#[test]
fn three_sources_split_a_token_budget_exactly_and_repeat_small_sources() {
    let mixture = Mixture::with_total_tokens(
        vec![
            (source(0, 100), 0.5),
            (source(1, 100), 0.3),
            (source(2, 7), 0.2),
        ],
        1,
        16 * 1000 + 5,
    )
    .unwrap();
    assert_eq!(mixture.num_rows(), 1000);
    assert_eq!(mixture.rows_per_source(), vec![500, 300, 200]);
    // Source 2 (7 rows) is repeated: each full pass uses every one of its rows once.
    let mut counts = [0usize; 7];
    for index in 800..1000 {
        let (source, row) = mixture.locate(index);
        assert_eq!(source, 2);
        counts[row] += 1;
    }
    assert_eq!(counts.iter().sum::<usize>(), 200);
    assert!(counts.iter().all(|&c| c == 28 || c == 29), "{counts:?}");
    // A large source contributes distinct rows.
    let mut rows: Vec<usize> = (0..500).map(|index| mixture.locate(index).1).collect();
    rows.sort_unstable();
    rows.dedup();
    assert_eq!(rows.len(), 100);
}

#[test]
fn the_mixture_is_deterministic_for_a_seed() {
    let build =
        |seed| Mixture::new(vec![(source(0, 1000), 0.9), (source(1, 1000), 0.1)], seed).unwrap();
    let (first, second, other) = (build(3), build(3), build(4));
    let rows = |mixture: &Mixture| {
        (0..mixture.num_rows())
            .map(|i| mixture.row(i))
            .collect::<Vec<_>>()
    };
    assert_eq!(rows(&first), rows(&second));
    assert_ne!(rows(&first), rows(&other));
    // The general source's 111 rows are spread over all of it, not its first rows.
    let general: Vec<usize> = (1000..first.num_rows())
        .map(|i| first.locate(i).1)
        .collect();
    assert_eq!(general.len(), 111);
    assert!(general.iter().any(|&row| row > 800), "{general:?}");
}

#[test]
fn bad_weights_and_row_lengths_are_errors() {
    let error = Mixture::new(vec![(source(0, 10), 1.0), (source(1, 10), 0.0)], 0)
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("source 1 has weight 0"), "{error}");
    let short: Box<dyn RowSource> =
        Box::new(PackedRows::new((0..100).collect::<Vec<u32>>(), 7).unwrap());
    let error = Mixture::new(vec![(source(0, 10), 1.0), (short, 1.0)], 0)
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("rows of 8 tokens"), "{error}");
    assert!(Mixture::new(Vec::new(), 0).is_err());
}

/// Weights are relative: huge ones mix as equal ones (their sum would overflow to infinity), and
/// one too small beside the others to draw a row is an error naming it.
#[test]
fn extreme_weights_mix_by_ratio_or_are_errors() {
    let huge = Mixture::new(vec![(source(0, 10), 1e308), (source(1, 10), 1e308)], 0).unwrap();
    assert_eq!(huge.rows_per_source(), vec![10, 10]);
    let error = Mixture::new(vec![(source(0, 10), 1e308), (source(1, 10), 1e-308)], 0)
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("source 1 has weight 1e-308"), "{error}");
}
