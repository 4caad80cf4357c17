//! `hlat convert` between whole, tensor-parallel and pipeline checkpoints: the Hugging Face
//! fixture split into 2 rank files, or into 2 stages of 2 rank files, and merged back (natively
//! and into Hugging Face format) is bit-exact.

use burn::tensor::{Device, TensorData};
use hlat::Hlat;
use hlat::checkpoint::files::{
    PIPELINE_PARALLEL_FILE, TENSOR_PARALLEL_FILE, rank_file, stage_file,
};
use hlat::checkpoint::load_native;

use super::{fixture, run, succeed};

/// Every parameter's values, in visiting order, of the native checkpoint in `dir`.
fn parameters(dir: &std::path::Path) -> Vec<TensorData> {
    let (_, model): (_, Hlat) = load_native(dir, &Device::flex()).unwrap();
    test_support::module::parameters(&model)
}

#[test]
fn convert_splits_a_checkpoint_by_rank_and_merges_it_back_bit_exactly() {
    let folder = tempfile::tempdir().unwrap();
    let path = |name: &str| folder.path().join(name).to_str().unwrap().to_string();
    let hf = fixture("hf-tiny-llama");
    let hf = hf.to_str().unwrap();
    succeed(&["convert", "--from-hf", hf, "--to", &path("direct")]);
    succeed(&[
        "convert",
        "--from-hf",
        hf,
        "--to",
        &path("tp2"),
        "--tp",
        "2",
    ]);
    let tp2 = folder.path().join("tp2");
    assert!(tp2.join(TENSOR_PARALLEL_FILE).is_file());
    for rank in 0..2 {
        assert!(tp2.join(rank_file(rank, 2)).is_file(), "rank {rank}");
    }

    succeed(&["convert", "--from", &path("tp2"), "--to", &path("merged")]);
    let expected = parameters(&folder.path().join("direct"));
    assert_eq!(parameters(&folder.path().join("merged")), expected);
    // Straight to Hugging Face format, and back.
    succeed(&["convert", "--from", &path("tp2"), "--to-hf", &path("hf")]);
    succeed(&[
        "convert",
        "--from-hf",
        &path("hf"),
        "--to",
        &path("round-trip"),
    ]);
    assert_eq!(parameters(&folder.path().join("round-trip")), expected);

    let output = run(&[
        "convert",
        "--from-hf",
        hf,
        "--to",
        &path("tp3"),
        "--tp",
        "3",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("tensor-parallel degree 3"), "{stderr}");
    assert!(
        !folder.path().join("tp3").exists(),
        "nothing is left behind"
    );
}

/// The bytes of every file of `dir`, by name.
fn files(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_str().unwrap().to_string();
            (name, std::fs::read(&path).unwrap())
        })
        .collect();
    files.sort();
    files
}

#[test]
fn convert_splits_a_checkpoint_into_pipeline_stages_and_merges_it_back_bit_exactly() {
    let folder = tempfile::tempdir().unwrap();
    let path = |name: &str| folder.path().join(name).to_str().unwrap().to_string();
    let hf = fixture("hf-tiny-llama");
    succeed(&[
        "convert",
        "--from-hf",
        hf.to_str().unwrap(),
        "--to",
        &path("native"),
    ]);
    let output = succeed(&[
        "convert",
        "--from",
        &path("native"),
        "--to",
        &path("pp2-tp2"),
        "--pp",
        "2",
        "--tp",
        "2",
    ]);
    assert!(output.contains("2 pipeline stages"), "{output}");
    let staged = folder.path().join("pp2-tp2");
    assert!(staged.join(PIPELINE_PARALLEL_FILE).is_file());
    for stage in 0..2 {
        for rank in 0..2 {
            let file = staged.join(stage_file(stage, 2, rank, 2));
            assert!(file.is_file(), "{}", file.display());
        }
    }

    // Merged into Hugging Face format: byte for byte what the whole checkpoint exports.
    succeed(&[
        "convert",
        "--from",
        &path("native"),
        "--to-hf",
        &path("direct"),
    ]);
    succeed(&[
        "convert",
        "--from",
        &path("pp2-tp2"),
        "--to-hf",
        &path("merged"),
    ]);
    assert_eq!(
        files(&folder.path().join("merged")),
        files(&folder.path().join("direct"))
    );
    // Merged natively, and a pipeline alone (one rank per stage): the same tensors.
    let expected = parameters(&folder.path().join("native"));
    succeed(&[
        "convert",
        "--from",
        &path("pp2-tp2"),
        "--to",
        &path("whole"),
    ]);
    assert_eq!(parameters(&folder.path().join("whole")), expected);
    succeed(&[
        "convert",
        "--from",
        &path("native"),
        "--to",
        &path("pp2"),
        "--pp",
        "2",
        "--pp-layers",
        "1,1",
    ]);
    assert_eq!(parameters(&folder.path().join("pp2")), expected);

    // Layers that do not add up to the model's are refused before anything is written.
    let output = run(&[
        "convert",
        "--from",
        &path("native"),
        "--to",
        &path("pp-bad"),
        "--pp",
        "2",
        "--pp-layers",
        "2,1",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("the model has 2"), "{stderr}");
    assert!(!folder.path().join("pp-bad").exists());
}
