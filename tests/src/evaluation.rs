//! Evaluation on a compiled device runs one program per batch shape: a ragged last batch is
//! padded to the shape of the others, and the loss leaves the padding out; scored rows of any
//! length are padded to a few bucket lengths.

use burn_trainium::{TrainiumDevice, reset_stats};
use hlat::HlatConfig;
use hlat_train::config::TrainConfig;
use hlat_train::eval::{ScoreRequest, evaluate_model, log_likelihoods};
use hlat_train::pretrain::DataChoice;

use crate::support::{programs, reference, trainium, xla};

/// `hlat eval`'s settings for `hlat-test` on the built-in corpus, `micro_batch_rows` rows a batch.
fn eval_config() -> TrainConfig {
    TrainConfig {
        preset: "hlat-test".into(),
        seq_len: 16,
        micro_batch_rows: 4,
        ..TrainConfig::quickstart()
    }
}

#[test]
fn evaluation_with_a_ragged_last_batch_compiles_only_its_bucket() {
    let _random = crate::support::exclusive_random();
    xla();
    // A device of its own: no other test compiles on it, so its statistics count only this one.
    let xla = TrainiumDevice::xla(2);
    let device = trainium(xla);
    // The built-in corpus's tokenizer has 512 tokens (a run on it sizes the model so).
    let model_config = HlatConfig {
        vocab_size: 512,
        ..HlatConfig::preset("hlat-test").unwrap()
    };
    let folder = tempfile::tempdir().unwrap();
    let initial = model_config.init(&reference());
    hlat::checkpoint::save_native(&initial, &model_config, folder.path()).unwrap();
    let (_, model) = hlat::checkpoint::load_native(folder.path(), &device).unwrap();
    device.sync().unwrap();
    let config = eval_config();

    reset_stats(&xla);
    let mut first_count = None;
    // Two full batches, a full and a ragged one, a single short one.
    for rows in [8, 6, 3] {
        let report =
            evaluate_model(model.clone(), &DataChoice::Builtin, &config, rows, &device).unwrap();
        assert_eq!(report.rows, rows);
        assert_eq!(report.tokens, rows * config.seq_len);
        device.sync().unwrap();
        let count = programs(&xla);
        let first = *first_count.get_or_insert(count);
        assert!(first > 0, "evaluation compiled (or loaded) its program");
        assert_eq!(
            count, first,
            "{rows} rows in batches of {}: no new program",
            config.micro_batch_rows
        );
        // The padding is left out: the same loss as unpadded batches of one row on Flex.
        let one_row = TrainConfig {
            micro_batch_rows: 1,
            ..eval_config()
        };
        let expected = evaluate_model(
            initial.clone(),
            &DataChoice::Builtin,
            &one_row,
            rows,
            &reference(),
        )
        .unwrap();
        assert!(
            (report.loss - expected.loss).abs() <= 1e-5 * expected.loss,
            "{rows} rows: loss {} on {xla}, {} on Flex",
            report.loss,
            expected.loss
        );
    }

    // Scoring (`hlat eval perplexity` and `choice`): rows of any length take one program per
    // bucket length, and a second set of lengths in the same buckets none.
    let rows = |lengths: &[usize]| -> Vec<ScoreRequest> {
        lengths
            .iter()
            .map(|&length| ScoreRequest {
                tokens: (0..length as u32).map(|i| (i * 37 + 11) % 512).collect(),
                first_scored: 1,
            })
            .collect()
    };
    let before = programs(&xla);
    let first = rows(&[5, 9, 12, 17, 20, 30]);
    let scores = log_likelihoods(&model, &first, 2, &device).unwrap();
    device.sync().unwrap();
    let buckets = programs(&xla) - before;
    assert!(
        buckets <= 2,
        "two bucket lengths (16, 32), {buckets} programs"
    );
    let expected = log_likelihoods(&initial, &first, 1, &reference()).unwrap();
    for (score, expected) in scores.iter().zip(&expected) {
        assert!(
            (score - expected).abs() <= 1e-4 * expected.abs().max(1.0),
            "{score} vs {expected}"
        );
    }
    log_likelihoods(&model, &rows(&[3, 16, 25, 32, 7]), 2, &device).unwrap();
    device.sync().unwrap();
    assert_eq!(
        programs(&xla) - before,
        buckets,
        "same buckets: no new program"
    );
}
