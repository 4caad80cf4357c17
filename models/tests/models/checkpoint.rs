//! Native checkpoints and folder detection of `load_any`.

use super::fixture;
use burn::tensor::{Device, Int, Tensor, TensorData};
use hlat::HlatConfig;
use hlat::checkpoint::{CheckpointError, load_any, load_native, save_native};
use hlat::hf::{WeightDtype, import_hf};

fn logits(model: &hlat::Hlat) -> TensorData {
    let ids = Tensor::<2, Int>::from_data(
        TensorData::new(vec![1i64, 7, 3, 9, 12], [1, 5]),
        &Device::flex(),
    );
    model.forward(ids).into_data()
}

/// An `hlat-test` model saved as a native checkpoint in `model/` of a temporary folder.
fn saved_test_model() -> (
    HlatConfig,
    hlat::Hlat,
    tempfile::TempDir,
    std::path::PathBuf,
) {
    let config = HlatConfig::preset("hlat-test").unwrap();
    let model = config.init(&Device::flex());
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("model");
    save_native(&model, &config, &dir).unwrap();
    (config, model, work, dir)
}

#[test]
fn native_save_then_load_gives_the_same_model() {
    let device = Device::flex();
    let (config, model, work, dir) = saved_test_model();
    // Saving again replaces the checkpoint atomically and leaves no temporary folder.
    save_native(&model, &config, &dir).unwrap();
    assert_eq!(std::fs::read_dir(work.path()).unwrap().count(), 1);
    let (loaded_config, loaded) = load_native(&dir, &device).unwrap();
    assert_eq!(loaded_config, config);
    logits(&loaded).assert_eq(&logits(&model), true);
}

/// A native checkpoint whose config.json asks for a bigger model than its weights hold is
/// refused before the model is built (which would allocate for the configuration).
#[test]
fn a_configuration_larger_than_the_weights_is_refused_before_building() {
    let device = Device::flex();
    let (config, _, _work, dir) = saved_test_model();
    let mut larger = config.clone();
    larger.hidden_size = 65536;
    larger.num_layers = 64;
    larger.save(&dir.join("config.json")).unwrap();
    let Err(error) = load_native(&dir, &device) else {
        panic!("a configuration larger than the weights was loaded");
    };
    let message = error.to_string();
    assert!(
        message.contains(&format!("needs {}", larger.num_params()))
            && message.contains(&format!("hold {} parameters", config.num_params())),
        "{message}"
    );
}

#[test]
fn load_any_reads_hf_native_and_run_folders() {
    let device = Device::flex();
    let (config, model) = import_hf(&fixture("hf-tiny-llama"), &device, WeightDtype::F32).unwrap();
    let (from_hf_config, from_hf, tokenizer) =
        load_any(&fixture("hf-tiny-llama"), &device).unwrap();
    assert_eq!(from_hf_config, config);
    assert!(tokenizer.is_none());
    logits(&from_hf).assert_eq(&logits(&model), true);

    let run = tempfile::tempdir().unwrap();
    let step = run.path().join("checkpoints/step-00000010/model");
    save_native(&model, &config, &step).unwrap();
    std::fs::write(run.path().join("checkpoints/newest"), "step-00000010\n").unwrap();
    // Until its completion marker is written, the checkpoint does not count.
    assert!(matches!(
        load_any(run.path(), &device),
        Err(CheckpointError::NoCompleteCheckpoint { .. })
    ));
    let marker = run
        .path()
        .join("checkpoints/step-00000010")
        .join(hlat::checkpoint::run_folder::COMPLETION_MARKER);
    std::fs::write(marker, "{}").unwrap();
    let (_, from_run, _) = load_any(run.path(), &device).unwrap();
    logits(&from_run).assert_eq(&logits(&model), true);

    let (_, from_native, _) = load_any(&step, &device).unwrap();
    logits(&from_native).assert_eq(&logits(&model), true);

    let empty = tempfile::tempdir().unwrap();
    assert!(matches!(
        load_any(empty.path(), &device),
        Err(CheckpointError::NotAModel { .. })
    ));
}
