//! Mutation fuzzing of every parser that reads a user's file: Hugging Face `config.json`,
//! safetensors weights, `tokenizer.json`, token shards, native checkpoint folders and TOML run
//! configurations; and of what a served device reads from the network (`server.rs`). Each starts from a valid input, which must load, then feeds mutated copies
//! (see `mutate.rs`) and requires of every one: an `Ok` or an error, never a panic; no hang (the
//! whole run of a parser has a time limit); no allocation beyond a small multiple of the input's
//! size (the test binary's allocator refuses it, see `allocation.rs`).
//!
//! `HLAT_FUZZ_INPUTS` sets the number of mutated inputs per parser (CI runs the default; run
//! longer by hand, e.g. `HLAT_FUZZ_INPUTS=200000 cargo test -p integration-tests --lib fuzz`).
//! Inputs are deterministic: a failure names the parser and input number, which reproduce it.

mod allocation;
mod mutate;
mod server;

use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hlat::HlatConfig;
use hlat::hf::{ExportOptions, WeightDtype};
use hlat_train::config::TrainConfig;
use hlat_train::data::shard::ShardWriter;
use hlat_train::data::{Split, TextTokenizer, TokenShard, TokenStream};

use crate::support::reference;
use mutate::{Random, mutate};

/// The environment variable that sets the mutated inputs per parser.
const INPUTS_ENV: &str = "HLAT_FUZZ_INPUTS";
/// Mutated inputs per parser when [`INPUTS_ENV`] is unset.
const DEFAULT_INPUTS: usize = 2000;
/// The longest one parser's whole run may take, per thousand inputs.
const TIME_PER_THOUSAND: Duration = Duration::from_secs(120);
/// A parse may allocate this many times its input's size...
const ALLOCATION_FACTOR: usize = 16;
/// ...plus this much.
const ALLOCATION_SLACK: usize = 32 << 20;

/// One parser and the valid input its mutations start from.
struct Target {
    name: &'static str,
    /// The files of a valid input (name, bytes), written into one folder.
    files: Vec<(&'static str, Vec<u8>)>,
    /// The leading bytes where half of the mutations fall (a binary header).
    focus: usize,
    /// Reads the folder; an error is a fine answer to a mutated input.
    parse: fn(&Path) -> Result<(), String>,
}

fn inputs() -> usize {
    std::env::var(INPUTS_ENV)
        .ok()
        .map(|text| {
            text.parse()
                .unwrap_or_else(|_| panic!("{INPUTS_ENV}={text} is not a count"))
        })
        .unwrap_or(DEFAULT_INPUTS)
}

/// Runs `target` on its valid input and on [`inputs`] mutations of it, on a thread of its own
/// that must finish in time.
fn fuzz(target: Target) {
    allocation::lift_the_cap_on_panic();
    let count = inputs();
    let name = target.name;
    let progress = Arc::new(AtomicUsize::new(0));
    let (done, finished) = std::sync::mpsc::channel();
    let worker_progress = progress.clone();
    std::thread::Builder::new()
        .name(format!("fuzz {name}"))
        .spawn(move || {
            let _ = done.send(run(&target, count, &worker_progress));
        })
        .expect("starting the fuzz thread");
    let limit = TIME_PER_THOUSAND * (count.div_ceil(1000).max(1) as u32);
    match finished.recv_timeout(limit) {
        Ok(Ok(report)) => eprintln!("fuzz {name}: {report}"),
        Ok(Err(failure)) => panic!("fuzz {name}: {failure}"),
        Err(_) => panic!(
            "fuzz {name}: not finished after {limit:?}, stuck on input {} of {count}",
            progress.load(Ordering::Relaxed)
        ),
    }
}

fn run(target: &Target, count: usize, progress: &AtomicUsize) -> Result<String, String> {
    let folder = tempfile::tempdir().map_err(|error| error.to_string())?;
    let write = |name: &str, bytes: &[u8]| {
        std::fs::write(folder.path().join(name), bytes).map_err(|error| error.to_string())
    };
    for (name, bytes) in &target.files {
        write(name, bytes)?;
    }
    (target.parse)(folder.path()).map_err(|error| format!("the valid input fails: {error}"))?;
    let name_seed = target
        .name
        .bytes()
        .fold(0u64, |hash, byte| hash.rotate_left(5) ^ u64::from(byte));
    let valid_size: usize = target.files.iter().map(|(_, bytes)| bytes.len()).sum();
    let (mut accepted, mut largest) = (0, (0, 0));
    for index in 0..count {
        progress.store(index, Ordering::Relaxed);
        let mut random =
            Random::new(name_seed ^ (index as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
        let (file, seed) = &target.files[random.below(target.files.len())];
        let mutated = mutate(seed, target.focus, &mut random);
        write(file, &mutated)?;
        let size = valid_size - seed.len() + mutated.len();
        let label = format!("parsing {} input {index} ({file} mutated)", target.name);
        allocation::limit(ALLOCATION_FACTOR * size + ALLOCATION_SLACK, &label);
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| (target.parse)(folder.path())));
        let peak = allocation::unlimit();
        largest = largest.max((peak, size));
        match outcome {
            Ok(result) => accepted += usize::from(result.is_ok()),
            Err(panic) => {
                let message = burn_trainium::panic_message(&*panic);
                let kept = folder.keep();
                return Err(format!(
                    "input {index} ({file} mutated) panicked: {message}; the input is in {}",
                    kept.display()
                ));
            }
        }
        write(file, seed)?;
    }
    Ok(format!(
        "{count} mutated inputs, {accepted} accepted, the rest refused with an error; largest \
         allocation {} bytes (for an input of {} bytes)",
        largest.0, largest.1
    ))
}

fn text_error(error: impl ToString) -> String {
    error.to_string()
}

/// The small HLAT model the model-folder inputs hold, its parameters drawn while this test
/// holds the random state (Burn draws a parameter when it is first read).
fn test_model() -> (HlatConfig, hlat::Hlat) {
    let _random = crate::support::exclusive_random();
    let config = HlatConfig::preset("hlat-test").unwrap();
    let device = reference();
    device.seed(7);
    let model = config.init(&device);
    test_support::module::parameters(&model);
    (config, model)
}

/// The files of a folder written by `save` into a temporary folder.
fn files_written_by(
    names: &[&'static str],
    save: impl FnOnce(&Path),
) -> Vec<(&'static str, Vec<u8>)> {
    let folder = tempfile::tempdir().unwrap();
    let dir = folder.path().join("input");
    save(&dir);
    names
        .iter()
        .map(|name| (*name, std::fs::read(dir.join(name)).unwrap()))
        .collect()
}

fn load_model_folder(dir: &Path) -> Result<(), String> {
    hlat::checkpoint::load_any(dir, &reference())
        .map(drop)
        .map_err(text_error)
}

#[test]
fn hugging_face_config() {
    let config = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/hf-tiny-llama/config.json"
    ))
    .unwrap();
    fuzz(Target {
        name: "config.json",
        files: vec![("config.json", config)],
        focus: 0,
        parse: |dir| hlat::hf::read_hf_config(dir).map(drop).map_err(text_error),
    });
}

#[test]
fn hugging_face_weights() {
    let (_, model) = test_model();
    let files = files_written_by(&["config.json", "model.safetensors"], |dir| {
        let options = ExportOptions {
            dtype: WeightDtype::BF16,
            ..Default::default()
        };
        hlat::hf::export_hf(&model, dir, &options, None).unwrap();
    });
    let header = 8 + u64::from_le_bytes(files[1].1[..8].try_into().unwrap()) as usize;
    fuzz(Target {
        name: "model.safetensors",
        files,
        focus: header,
        parse: load_model_folder,
    });
}

#[test]
fn native_checkpoint() {
    let (config, model) = test_model();
    let files = files_written_by(&["config.json", "model.bpk"], |dir| {
        hlat::checkpoint::save_native(&model, &config, dir).unwrap();
    });
    fuzz(Target {
        name: "native checkpoint",
        files,
        focus: 4096,
        parse: load_model_folder,
    });
}

#[test]
fn tokenizer() {
    let documents = [
        "The quick brown fox jumps over the lazy dog.",
        "Trainium runs LLaMA-style models; HLAT is one of them.",
        "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich.",
    ];
    let tokenizer = TextTokenizer::train_byte_level_bpe(&documents, 300).unwrap();
    let json = tokenizer.to_json().unwrap().into_bytes();
    fuzz(Target {
        name: "tokenizer.json",
        files: vec![("tokenizer.json", json)],
        focus: 0,
        parse: |dir| {
            let tokenizer =
                TextTokenizer::from_file(dir.join("tokenizer.json")).map_err(text_error)?;
            let ids = tokenizer
                .encode("the lazy fox über", true)
                .map_err(text_error)?;
            tokenizer.decode(&ids).map(drop).map_err(text_error)
        },
    });
}

#[test]
fn token_shard() {
    let folder = tempfile::tempdir().unwrap();
    let mut writer = ShardWriter::new(folder.path(), Split::Train, 10_000, 300).unwrap();
    let tokens: Vec<u32> = (0..2000).map(|index| (index * 7 % 300) as u32).collect();
    writer.write(&tokens).unwrap();
    let paths = writer.commit().unwrap();
    let shard = std::fs::read(&paths[0]).unwrap();
    fuzz(Target {
        name: "token shard",
        files: vec![("train-00000.bin", shard)],
        focus: 32,
        parse: |dir| {
            let shard = TokenShard::open(dir.join("train-00000.bin")).map_err(text_error)?;
            let mut tokens = vec![0; shard.len()];
            shard.copy_tokens(0, &mut tokens);
            let set =
                hlat_train::data::ShardSet::open_split(dir, Split::Train).map_err(text_error)?;
            let mut all = vec![0; set.num_tokens()];
            set.copy_tokens(0, &mut all);
            Ok(())
        },
    });
}

#[test]
fn toml_run_configuration() {
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("run.toml");
    TrainConfig::quickstart().save_toml(&path).unwrap();
    fuzz(Target {
        name: "run.toml",
        files: vec![("run.toml", std::fs::read(&path).unwrap())],
        focus: 0,
        parse: |dir| {
            TrainConfig::load_toml(&dir.join("run.toml"), &TrainConfig::quickstart())
                .map(drop)
                .map_err(text_error)
        },
    });
}
