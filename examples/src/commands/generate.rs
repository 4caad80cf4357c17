//! `hlat generate`: continue a prompt with a model folder.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueEnum};
use hlat::Tokenizer;
use hlat::checkpoint::load_any;
use hlat::generate::{GenerationOptions, Sampling, generate};

use super::micros_per;

/// What `hlat generate` prints.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// The prompt and its continuation as text, streamed (needs a tokenizer).
    Text,
    /// Only the generated ids, comma-separated, on one line.
    Ids,
}

/// Arguments of `hlat generate`.
#[derive(Args)]
pub struct GenerateArgs {
    /// Model folder: Hugging Face, native checkpoint, or training run (newest checkpoint).
    #[arg(long)]
    pub model: PathBuf,
    /// Prompt text (encoded with the folder's tokenizer.json, BOS added as it specifies).
    #[arg(
        long,
        conflicts_with = "prompt_ids",
        required_unless_present = "prompt_ids"
    )]
    pub prompt: Option<String>,
    /// Prompt token ids, e.g. 1,2,3.
    #[arg(long, value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,
    /// Maximum number of generated tokens.
    #[arg(long, default_value_t = 64)]
    pub max_new_tokens: usize,
    /// Pick the most likely token (the default when no sampling flag is given).
    #[arg(long, conflicts_with_all = ["temperature", "top_k", "top_p"])]
    pub greedy: bool,
    /// Sampling temperature (sampling flags default to temperature 1).
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Sample among the K most likely tokens.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Sample among the most likely tokens of cumulative probability P.
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop ids (default: the model's EOS id).
    #[arg(long, value_delimiter = ',')]
    pub stop_ids: Option<Vec<u32>>,
    /// Output: `text` or `ids`.
    #[arg(long, value_enum, default_value = "text")]
    pub format: OutputFormat,
    /// Print the device's statistics at the end (operations, segments, `compiles: N`, cache
    /// hits, host fallbacks, bytes moved).
    #[arg(long)]
    pub stats: bool,
    #[command(flatten)]
    pub adapter: super::adapter_arg::AdapterArg,
}

/// Runs `hlat generate`.
pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let (trainium, device) = super::device_from_env()?;
    let (config, model, tokenizer) = load_any(&args.model, &device)
        .with_context(|| format!("loading {}", args.model.display()))?;
    let model = args.adapter.apply(model, &device)?;
    let needs_tokenizer = || {
        tokenizer.as_ref().with_context(|| {
            format!(
                "{} has no tokenizer.json: use --prompt-ids and --format ids",
                args.model.display()
            )
        })
    };
    let prompt: Vec<u32> = match (&args.prompt, &args.prompt_ids) {
        (Some(text), _) => needs_tokenizer()?
            .encode(text.as_str(), true)
            .map_err(|error| anyhow::anyhow!("cannot encode the prompt: {error}"))?
            .get_ids()
            .to_vec(),
        (None, Some(ids)) => ids.clone(),
        (None, None) => anyhow::bail!("give --prompt TEXT or --prompt-ids 1,2,3"),
    };
    let sampling = if args.greedy
        || (args.temperature.is_none() && args.top_k.is_none() && args.top_p.is_none())
    {
        Sampling::Greedy
    } else {
        Sampling::Sample {
            temperature: args.temperature.unwrap_or(1.0),
            top_k: args.top_k,
            top_p: args.top_p,
        }
    };
    let options = GenerationOptions {
        max_new_tokens: args.max_new_tokens,
        sampling,
        seed: args.seed,
        stop_ids: args.stop_ids.unwrap_or_else(|| vec![config.eos_token_id]),
    };
    match args.format {
        OutputFormat::Ids => {
            let generated = generate(&model, &prompt, &options, |_| {})?;
            let ids: Vec<String> = generated.iter().map(u32::to_string).collect();
            println!("{}", ids.join(","));
        }
        OutputFormat::Text => {
            let tokenizer = needs_tokenizer()?;
            let mut stream = TextStream::new(tokenizer, &prompt)?;
            let mut failure = None;
            generate(&model, &prompt, &options, |token| {
                if failure.is_none() {
                    failure = stream.push(token).err();
                }
            })?;
            if let Some(error) = failure {
                return Err(error);
            }
            println!();
        }
    }
    if args.stats {
        let stats = burn_trainium::stats(&trainium);
        println!("device: {trainium}");
        println!("operations captured: {}", stats.operations_captured);
        println!("segments run: {}", stats.segments_run);
        println!(
            "segments reused (not lowered again): {}",
            stats.segments_reused
        );
        println!(
            "capture µs per operation: {:.2}",
            micros_per(stats.capture_seconds, stats.operations_captured)
        );
        println!(
            "prepare µs per segment: {:.1}",
            micros_per(stats.prepare_seconds, stats.segments_run)
        );
        println!("compiles: {}", stats.compiles);
        println!("compile seconds: {:.2}", stats.compile_seconds);
        println!(
            "programs loaded from the compile cache: {}",
            stats.programs_loaded
        );
        println!("cache hits: {}", stats.cache_hits);
        match burn_trainium::host_fallback_report(&trainium) {
            Some(report) => println!("{report}"),
            None => println!("host fallbacks: 0"),
        }
        println!("bytes to device: {}", stats.bytes_to_device);
        println!("bytes to host: {}", stats.bytes_to_host);
    }
    Ok(())
}

/// Prints decoded text as tokens arrive: the whole sequence is decoded again at each token and
/// only the new suffix is written, so multi-token characters appear once complete.
struct TextStream<'a> {
    tokenizer: &'a Tokenizer,
    ids: Vec<u32>,
    printed: String,
}

impl<'a> TextStream<'a> {
    /// Starts with the prompt printed.
    fn new(tokenizer: &'a Tokenizer, prompt: &[u32]) -> anyhow::Result<Self> {
        let mut stream = Self {
            tokenizer,
            ids: prompt.to_vec(),
            printed: String::new(),
        };
        stream.flush()?;
        Ok(stream)
    }

    fn push(&mut self, token: u32) -> anyhow::Result<()> {
        self.ids.push(token);
        self.flush()
    }

    fn flush(&mut self) -> anyhow::Result<()> {
        let text = self
            .tokenizer
            .decode(&self.ids, true)
            .map_err(|error| anyhow::anyhow!("cannot decode: {error}"))?;
        // A partial UTF-8 sequence decodes to U+FFFD until it is complete: wait for it.
        if text.ends_with('\u{FFFD}') {
            return Ok(());
        }
        // Decoding may rewrite the end of the text (e.g. a leading space): print what changed.
        print!("{}", &text[common_prefix(&text, &self.printed)..]);
        std::io::stdout().flush()?;
        self.printed = text;
        Ok(())
    }
}

/// Byte length of the longest common prefix ending on a character boundary.
fn common_prefix(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .take_while(|((_, x), y)| x == y)
        .last()
        .map_or(0, |((index, x), _)| index + x.len_utf8())
}
