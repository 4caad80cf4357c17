//! The built-in corpus: generated English-like text with structure a small model can learn, so
//! `hlat pretrain` runs anywhere without downloading data.
//!
//! The text describes a small fixed world: people who each live in one city, work one job, keep
//! one kind of pet and like one color; animals that each eat one food and make one sound; plus
//! counting and additions with correct results. The facts never change, so they can be learned;
//! which facts a document tells, in which words and order, is drawn from the seed. Every document
//! is a function of the seed and its index, so any part of the corpus is reproducible.
//!
//! [`default_tokenizer`] trains the matching byte-level BPE tokenizer (512 tokens) on a fixed
//! sample of the corpus, and [`builtin_dataset`] gives packed train and validation rows.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use rayon::prelude::*;

use super::error::DataError;
use super::packing::PackedRows;
use super::rng::SplitMix64;
use super::split::is_validation;
use super::tokenizer::TextTokenizer;
use super::tokens::append_document;

/// The vocabulary size of [`default_tokenizer`].
pub const DEFAULT_VOCAB_SIZE: usize = 512;
/// The seed of the corpus sample [`default_tokenizer`] is trained on.
const TOKENIZER_SEED: u64 = 0x4e4c_4154;
/// The number of documents [`default_tokenizer`] is trained on.
const TOKENIZER_DOCUMENTS: u64 = 2_000;
/// Documents generated and tokenized together by [`builtin_dataset`].
const GENERATION_BATCH: u64 = 1_024;

const PEOPLE: [(&str, &str); 16] = [
    ("Alice", "she"),
    ("Bob", "he"),
    ("Carol", "she"),
    ("David", "he"),
    ("Emma", "she"),
    ("Frank", "he"),
    ("Grace", "she"),
    ("Henry", "he"),
    ("Irene", "she"),
    ("James", "he"),
    ("Karen", "she"),
    ("Leo", "he"),
    ("Maria", "she"),
    ("Nathan", "he"),
    ("Olivia", "she"),
    ("Peter", "he"),
];
const CITIES: [&str; 8] = [
    "Paris", "London", "Tokyo", "Cairo", "Lima", "Oslo", "Madrid", "Dublin",
];
const JOBS: [&str; 8] = [
    "baker", "doctor", "teacher", "farmer", "pilot", "painter", "writer", "nurse",
];
const COLORS: [&str; 6] = ["red", "blue", "green", "yellow", "purple", "orange"];
/// Animals: singular, plural, food, sound.
const ANIMALS: [(&str, &str, &str, &str); 6] = [
    ("cat", "cats", "fish", "meows"),
    ("dog", "dogs", "meat", "barks"),
    ("cow", "cows", "grass", "moos"),
    ("bird", "birds", "seeds", "sings"),
    ("horse", "horses", "hay", "neighs"),
    ("duck", "ducks", "bread", "quacks"),
];
const NUMBER_WORDS: [&str; 10] = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
];

/// The fixed facts about person `index`.
struct Person {
    name: &'static str,
    pronoun: &'static str,
    city: &'static str,
    job: &'static str,
    color: &'static str,
    pet: usize,
    pets: usize,
}

fn person(index: usize) -> Person {
    let (name, pronoun) = PEOPLE[index];
    Person {
        name,
        pronoun,
        city: CITIES[(index * 3 + 1) % CITIES.len()],
        job: JOBS[(index * 5 + 2) % JOBS.len()],
        color: COLORS[(index * 7 + 3) % COLORS.len()],
        pet: (index * 5 + 1) % ANIMALS.len(),
        pets: 1 + index % 4,
    }
}

/// Capitalizes the first letter.
fn capitalized(text: &str) -> String {
    let mut chars = text.chars();
    chars
        .next()
        .map(|first| first.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// One sentence about person `who`, in one of several phrasings.
fn person_sentence(rng: &mut SplitMix64, who: &Person) -> String {
    let (name, he) = (who.name, who.pronoun);
    let (animal, animals, food, sound) = ANIMALS[who.pet];
    let pet_words = if who.pets == 1 {
        format!("one {animal}")
    } else {
        format!("{} {animals}", NUMBER_WORDS[who.pets])
    };
    match rng.below(9) {
        0 => format!("{name} lives in {}.", who.city),
        1 => format!("{name} works as a {} in {}.", who.job, who.city),
        2 => format!(
            "{name} is a {}. {} likes the color {}.",
            who.job,
            capitalized(he),
            who.color
        ),
        3 => format!("{name} has {pet_words}."),
        4 => format!("Every morning {name} feeds {food} to the {animals}."),
        5 => format!(
            "Where does {name} live? {} lives in {}.",
            capitalized(he),
            who.city
        ),
        6 => format!("What does {name} do? {} is a {}.", capitalized(he), who.job),
        7 => format!("The favorite color of {name} is {}.", who.color),
        _ => format!("{name} has a {animal}. The {animal} {sound}."),
    }
}

/// One sentence about the world at large: animals, counting or arithmetic.
fn world_sentence(rng: &mut SplitMix64) -> String {
    match rng.below(5) {
        0 => {
            let (animal, _, food, sound) = ANIMALS[rng.below(ANIMALS.len() as u64) as usize];
            format!("The {animal} eats {food} and {sound}.")
        }
        1 => {
            let (_, animals, food, _) = ANIMALS[rng.below(ANIMALS.len() as u64) as usize];
            format!("All {animals} like {food}.")
        }
        2 => {
            let start = rng.below(90);
            let count: Vec<String> = (start..start + 5).map(|n| n.to_string()).collect();
            format!("Counting up: {}.", count.join(", "))
        }
        3 => {
            let (a, b) = (rng.below(50), rng.below(50));
            format!("{a} plus {b} is {}.", a + b)
        }
        _ => {
            let n = rng.below(9) as usize;
            format!("After {} comes {}.", NUMBER_WORDS[n], NUMBER_WORDS[n + 1])
        }
    }
}

/// Document number `index` of the corpus of `seed`: a title and a few paragraphs about one main
/// person, another person who visits, and the world.
pub fn builtin_document(seed: u64, index: u64) -> String {
    let mut rng = SplitMix64::for_stream(seed, index);
    let people = PEOPLE.len() as u64;
    let main_index = rng.below(people);
    let other_index = (main_index + 1 + rng.below(people - 1)) % people;
    let (main, other) = (person(main_index as usize), person(other_index as usize));
    let mut text = format!("A story about {}.\n\n", main.name);
    let paragraphs = 1 + rng.below(3);
    for paragraph in 0..paragraphs {
        let sentences = 3 + rng.below(4);
        let mut parts = Vec::with_capacity(sentences as usize);
        for _ in 0..sentences {
            parts.push(match rng.below(6) {
                0..=2 => person_sentence(&mut rng, &main),
                3 => person_sentence(&mut rng, &other),
                4 => format!("{} visits {} in {}.", other.name, main.name, main.city),
                _ => world_sentence(&mut rng),
            });
        }
        text.push_str(&parts.join(" "));
        if paragraph + 1 < paragraphs {
            text.push_str("\n\n");
        }
    }
    text.push('\n');
    text
}

/// The default tokenizer for the built-in corpus: a byte-level BPE of [`DEFAULT_VOCAB_SIZE`]
/// tokens with `<pad>`, `<s>` and `</s>`, trained on a fixed sample of the corpus. The same on
/// every run and machine.
///
/// Trained once per process and cloned after that.
pub fn default_tokenizer() -> Result<TextTokenizer, DataError> {
    static TRAINED: Mutex<Option<TextTokenizer>> = Mutex::new(None);
    let mut trained = TRAINED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(tokenizer) = trained.as_ref() {
        return Ok(tokenizer.clone());
    }
    let sample: Vec<String> = (0..TOKENIZER_DOCUMENTS)
        .into_par_iter()
        .map(|index| builtin_document(TOKENIZER_SEED, index))
        .collect();
    let tokenizer = TextTokenizer::train_byte_level_bpe(&sample, DEFAULT_VOCAB_SIZE)?;
    *trained = Some(tokenizer.clone());
    Ok(tokenizer)
}

/// What [`builtin_dataset`] builds.
#[derive(Debug, Clone, Copy)]
pub struct BuiltinDataConfig {
    /// The sequence length: rows hold `seq_len + 1` tokens.
    pub seq_len: usize,
    /// At least this many training tokens are generated (whole documents).
    pub train_tokens: usize,
    /// At least this many validation tokens are generated (whole documents).
    pub validation_tokens: usize,
    /// The corpus seed.
    pub seed: u64,
}

/// The built-in data: its tokenizer and packed train and validation rows.
pub struct BuiltinDataset {
    /// The tokenizer the rows are encoded with ([`default_tokenizer`]).
    pub tokenizer: TextTokenizer,
    /// Training rows.
    pub train: PackedRows<Vec<u32>>,
    /// Validation rows, from documents held out of training.
    pub validation: PackedRows<Vec<u32>>,
}

/// Generates, tokenizes (on all cores, once per process) and packs the built-in corpus.
/// Documents go to training or validation by [`is_validation`] until both budgets are met.
pub fn builtin_dataset(config: &BuiltinDataConfig) -> Result<BuiltinDataset, DataError> {
    let row_len = config.seq_len + 1;
    for (name, tokens) in [
        ("training token budget", config.train_tokens),
        ("validation token budget", config.validation_tokens),
    ] {
        if tokens < row_len {
            return Err(DataError::setting(
                name,
                format!("{tokens} tokens are fewer than one row of {row_len}"),
            ));
        }
    }
    let tokenizer = default_tokenizer()?;
    let streams = corpus_streams(config, &tokenizer)?;
    Ok(BuiltinDataset {
        train: PackedRows::new(streams.train.clone(), config.seq_len)?,
        validation: PackedRows::new(streams.validation.clone(), config.seq_len)?,
        tokenizer,
    })
}

/// The training and validation token streams of a corpus, EOS after each document.
struct CorpusStreams {
    train: Vec<u32>,
    validation: Vec<u32>,
}

/// The token streams of `config`'s corpus, generated and encoded once per process for each seed
/// and pair of budgets (a few MiB each): a process that prepares several runs on the built-in
/// data (the test suites, a run and its evaluation) asks for the same streams again.
fn corpus_streams(
    config: &BuiltinDataConfig,
    tokenizer: &TextTokenizer,
) -> Result<Arc<CorpusStreams>, DataError> {
    type Key = (u64, usize, usize);
    static GENERATED: Mutex<BTreeMap<Key, Arc<CorpusStreams>>> = Mutex::new(BTreeMap::new());
    let key = (config.seed, config.train_tokens, config.validation_tokens);
    let mut generated = GENERATED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(streams) = generated.get(&key) {
        return Ok(streams.clone());
    }
    let eos = tokenizer.eos_id()?;
    let total = config.train_tokens + config.validation_tokens;
    let fraction = config.validation_tokens as f64 / total as f64;
    let mut train = Vec::with_capacity(config.train_tokens + config.seq_len);
    let mut validation = Vec::with_capacity(config.validation_tokens + config.seq_len);
    let mut next = 0u64;
    while train.len() < config.train_tokens || validation.len() < config.validation_tokens {
        let indices: Vec<u64> = (next..next + GENERATION_BATCH).collect();
        next += GENERATION_BATCH;
        let documents: Vec<String> = indices
            .par_iter()
            .map(|&index| builtin_document(config.seed, index))
            .collect();
        let encoded = tokenizer.encode_documents(&documents)?;
        for (index, tokens) in indices.into_iter().zip(encoded) {
            let (stream, budget) = if is_validation(config.seed, index, fraction) {
                (&mut validation, config.validation_tokens)
            } else {
                (&mut train, config.train_tokens)
            };
            if stream.len() < budget {
                append_document(stream, &tokens, eos);
            }
        }
    }
    log::info!(
        "built-in corpus: {} train and {} validation tokens from {next} generated documents",
        train.len(),
        validation.len()
    );
    let streams = Arc::new(CorpusStreams { train, validation });
    generated.insert(key, streams.clone());
    Ok(streams)
}
