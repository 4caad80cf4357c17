//! `hlat convert`: between Hugging Face folders and native checkpoints, whole or sharded by
//! tensor-parallel rank and pipeline stage (a sharded checkpoint read with `--from` is joined;
//! `--tp N` splits the output into N rank files, `--pp N` into N stages of `--tp` rank files
//! each).

use std::path::PathBuf;

use anyhow::Context;
use burn_trainium::collective::ReplicaGroups;
use clap::Args;
use hlat::checkpoint::sharded::{StageLayout, save_split, save_stages};
use hlat::checkpoint::{load_any, save_native_with_tokenizer};
use hlat::hf::{ExportOptions, WeightDtype, export_hf, find_tokenizer, import_hf};
use hlat::pipeline::PipelineParallel;

/// Arguments of `hlat convert`.
#[derive(Args)]
pub struct ConvertArgs {
    /// Hugging Face folder to read (`llama`, `mistral`, `qwen2` or `qwen3`).
    #[arg(long, conflicts_with = "from", required_unless_present = "from")]
    pub from_hf: Option<PathBuf>,
    /// Native checkpoint, whole or sharded by tensor-parallel rank and pipeline stage (joined),
    /// or training run folder (its newest checkpoint), to read.
    #[arg(long)]
    pub from: Option<PathBuf>,
    /// New native checkpoint folder to write (an existing path is refused and left as it is).
    #[arg(long, conflicts_with = "to_hf", required_unless_present = "to_hf")]
    pub to: Option<PathBuf>,
    /// New Hugging Face folder to write (an existing path is refused and left as it is).
    #[arg(long)]
    pub to_hf: Option<PathBuf>,
    /// Write the native checkpoint as N tensor-parallel rank files, as a `hlat pretrain --tp N`
    /// run checkpoints it (1: one whole file).
    #[arg(long, value_name = "N", requires = "to", value_parser = super::ranges::at_least_one::<usize>())]
    pub tp: Option<usize>,
    /// Write the native checkpoint as N pipeline stages (each as --tp rank files), as a `hlat
    /// pretrain --pp N` run checkpoints it: a stage's files hold its layers, the first stage's
    /// the embedding, the last stage's the final norm and the LM head (1: no stages).
    #[arg(long, value_name = "N", requires = "to", value_parser = super::ranges::at_least_one::<usize>())]
    pub pp: Option<usize>,
    /// Layers of each stage (of each virtual stage with --virtual-stages), in order, e.g.
    /// `--pp-layers 9,10,10,11`; evenly cut by default.
    #[arg(long, value_name = "L,L,...", value_delimiter = ',', requires = "pp")]
    pub pp_layers: Option<Vec<usize>>,
    /// Chunks of layers per stage, as `hlat pretrain --virtual-stages V` takes them (stage s
    /// holds virtual stages s, p + s, ...).
    #[arg(long, value_name = "V", requires = "pp", value_parser = super::ranges::at_least_one::<usize>())]
    pub virtual_stages: Option<usize>,
    /// Element type of the written weights: f32, bf16 or f16.
    #[arg(long, default_value = "f32")]
    pub dtype: WeightDtype,
    /// Shard limit of Hugging Face output, e.g. 5GB, 500MB, 2GiB or a byte count.
    #[arg(long, default_value = "5GB", value_parser = parse_size)]
    pub max_shard_size: u64,
    /// Fold this PEFT LoRA adapter folder into the weights before writing (PEFT's
    /// `merge_and_unload`): the output is a full checkpoint of the adapted model.
    #[arg(long, value_name = "DIR")]
    pub merge_adapter: Option<PathBuf>,
}

/// Runs `hlat convert`.
pub fn run(args: ConvertArgs) -> anyhow::Result<()> {
    let (_, device) = super::device_from_env()?;
    let (model, tokenizer) = match (&args.from_hf, &args.from) {
        (Some(dir), _) => {
            let (_, model) = import_hf(dir, &device, args.dtype)?;
            (model, find_tokenizer(dir)?)
        }
        (None, Some(dir)) => {
            let (_, model, tokenizer) = load_any(dir, &device)?;
            (model, tokenizer)
        }
        (None, None) => anyhow::bail!("give --from-hf DIR or --from DIR"),
    };
    let model = match &args.merge_adapter {
        Some(dir) => {
            let (config, model) = hlat::hf::adapter::load_adapter(model, dir, &device)
                .with_context(|| format!("--merge-adapter {}", dir.display()))?;
            println!(
                "merged adapter {} (rank {}, alpha {})",
                dir.display(),
                config.rank,
                config.alpha
            );
            model.merge_lora()
        }
        None => model,
    };
    match (&args.to, &args.to_hf) {
        (Some(out), _) => {
            anyhow::ensure!(
                !out.exists(),
                "{}: already exists; choose a new output folder",
                out.display()
            );
            let stages = args.pp.unwrap_or(1);
            anyhow::ensure!(
                stages > 1 || (args.pp_layers.is_none() && args.virtual_stages.is_none()),
                "--pp-layers and --virtual-stages need --pp above 1"
            );
            let written =
                |what: String| println!("wrote native checkpoint {}{what}", out.display());
            match (stages, args.tp.unwrap_or(1)) {
                (_, 0) => anyhow::bail!("--tp 0: the tensor-parallel degree must be at least 1"),
                (1, 1) => {
                    save_native_with_tokenizer(&model, model.config(), tokenizer.as_ref(), out)
                        .with_context(|| format!("writing {}", out.display()))?;
                    written(String::new());
                }
                (1, degree) => {
                    save_split(&model, degree, tokenizer.as_ref(), out)
                        .with_context(|| format!("writing {}", out.display()))?;
                    written(format!(" as {degree} tensor-parallel rank files"));
                }
                (stages, degree) => {
                    let pipeline = pipeline_stages(
                        stages,
                        model.config().num_layers,
                        args.pp_layers.clone(),
                        args.virtual_stages.unwrap_or(1),
                    )?;
                    let layout = StageLayout::of_pipeline(&pipeline, degree);
                    let layers = layout.stage_layers.clone();
                    save_stages(&model, layout, tokenizer.as_ref(), out)
                        .with_context(|| format!("writing {}", out.display()))?;
                    written(format!(
                        " as {stages} pipeline stages (layers {layers:?}) of {degree} \
                         tensor-parallel rank files each"
                    ));
                }
            }
        }
        (None, Some(out)) => {
            let options = ExportOptions {
                dtype: args.dtype,
                max_shard_size: args.max_shard_size,
            };
            export_hf(&model, out, &options, tokenizer.as_ref())?;
            println!("wrote Hugging Face folder {}", out.display());
        }
        (None, None) => anyhow::bail!("give --to DIR or --to-hf DIR"),
    }
    Ok(())
}

/// `num_layers` layers cut into `stages` stages of `virtual_stages` chunks each, as `hlat pretrain
/// --pp` cuts them: as `layers` lists them, or evenly.
fn pipeline_stages(
    stages: usize,
    num_layers: usize,
    layers: Option<Vec<usize>>,
    virtual_stages: usize,
) -> anyhow::Result<PipelineParallel> {
    let groups = ReplicaGroups::all(stages);
    let parts = stages * virtual_stages;
    match layers {
        Some(layers) => PipelineParallel::with_layers(groups, layers, num_layers, virtual_stages),
        None if num_layers < parts => Err(format!(
            "{num_layers} layers cannot fill {parts} pipeline stages"
        )),
        None => PipelineParallel::even(groups, num_layers, virtual_stages),
    }
    .map_err(anyhow::Error::msg)
}

/// Parses `5GB` (10^9), `500MB`, `2GiB` (2^30), `64KB` or a plain byte count.
fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a size like 5GB"))?;
    let scale: u64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "KIB" => 1 << 10,
        "MIB" => 1 << 20,
        "GIB" => 1 << 30,
        other => return Err(format!("unknown size unit `{other}` in `{text}`")),
    };
    let bytes = (number * scale as f64) as u64;
    if bytes == 0 {
        return Err(format!("the shard size `{text}` must be positive"));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hlat::hf::DEFAULT_MAX_SHARD_SIZE;

    #[test]
    fn sizes_parse_like_transformers() {
        assert_eq!(parse_size("5GB"), Ok(DEFAULT_MAX_SHARD_SIZE));
        assert_eq!(parse_size("500MB"), Ok(500_000_000));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1234"), Ok(1234));
        assert!(parse_size("5XB").is_err());
        assert!(parse_size("0").is_err());
    }
}
