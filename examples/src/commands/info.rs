//! `hlat info`: print a configuration, its parameter count, and the memory one device needs to
//! train it in a parallel layout.

use std::path::Path;

use anyhow::Context;
use clap::Args;
use hlat::checkpoint::{FolderKind, NATIVE_CONFIG_FILE, folder_kind};
use hlat::{ConfigError, HlatConfig};
use hlat_train::parallel::{ActivationCheckpointing, DeviceMemory, ParallelLayout, StepShape};
use hlat_train::precision::Precision;

/// Arguments of `hlat info`.
#[derive(Args)]
pub struct InfoArgs {
    /// A preset name (`hlat-7b`, `hlat-70b`, `hlat-tiny`, `hlat-test`, `bench-tiny`), an HLAT or
    /// Hugging Face `config.json`, or a model folder (native checkpoint or Hugging Face).
    pub model: String,
    /// Data-parallel degree of the layout whose memory is estimated.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = super::ranges::at_least_one::<usize>())]
    pub dp: usize,
    /// Tensor-parallel degree.
    #[arg(long, value_name = "M", default_value_t = 1, value_parser = super::ranges::at_least_one::<usize>())]
    pub tp: usize,
    /// Sequence parallelism inside the tensor-parallel groups.
    #[arg(long)]
    pub sequence_parallel: bool,
    /// The AdamW state partitioned over the data-parallel replicas.
    #[arg(long)]
    pub zero1: bool,
    /// What the backward pass recomputes: none, full or selective.
    #[arg(long, value_name = "MODE", default_value = "none")]
    pub activation_checkpointing: ActivationCheckpointing,
    /// Tokens per row (default: the model's context).
    #[arg(long, value_name = "N", value_parser = super::ranges::at_least_one::<usize>())]
    pub seq_len: Option<usize>,
    /// Rows per micro-batch on each data-parallel replica.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = super::ranges::at_least_one::<usize>())]
    pub micro_batch_rows: usize,
    /// Parameter and compute precision: f32, bf16-sr or bf16-mixed.
    #[arg(long, value_name = "P", default_value = "bf16-sr")]
    pub precision: Precision,
    /// Memory of one device in GiB (default: a trn1 NeuronCore's 16 GiB).
    #[arg(long, value_name = "GIB", default_value_t = 16.0, value_parser = super::ranges::positive)]
    pub device_memory: f64,
}

/// Runs `hlat info`.
pub fn run(args: InfoArgs) -> anyhow::Result<()> {
    let (source, config) = resolve(&args.model)?;
    let memory = describe_memory(&config, &args)?;
    println!("source: {source}");
    print!("{}{memory}", describe(&config));
    Ok(())
}

/// The layout, the parameters per device and the memory per device, against `device_memory`.
fn describe_memory(config: &HlatConfig, args: &InfoArgs) -> anyhow::Result<String> {
    anyhow::ensure!(args.dp > 0, "--dp must be positive");
    anyhow::ensure!(args.tp > 0, "--tp must be positive");
    anyhow::ensure!(
        args.micro_batch_rows > 0,
        "--micro-batch-rows must be positive"
    );
    anyhow::ensure!(
        args.device_memory.is_finite() && args.device_memory > 0.0,
        "--device-memory must be a positive number of GiB, got {}",
        args.device_memory
    );
    // The same rules as `hlat pretrain` (TrainConfig::validate): no flag is silently ignored.
    anyhow::ensure!(
        !args.sequence_parallel || args.tp > 1,
        "--sequence-parallel needs --tp above 1"
    );
    anyhow::ensure!(!args.zero1 || args.dp > 1, "--zero1 needs --dp above 1");
    hlat::parallel::check_degree(config, args.tp)
        .map_err(|reason| anyhow::anyhow!("--tp: {reason}"))?;
    let seq_len = args.seq_len.unwrap_or(config.max_seq_len);
    anyhow::ensure!(seq_len > 0, "--seq-len must be positive");
    anyhow::ensure!(
        !args.sequence_parallel || seq_len.is_multiple_of(args.tp),
        "--seq-len {seq_len} does not divide by --tp {} (sequence parallelism)",
        args.tp
    );
    let layout = ParallelLayout {
        data: args.dp,
        tensor: args.tp,
        sequence_parallel: args.sequence_parallel,
        zero1: args.zero1,
    };
    let shape = StepShape {
        seq_len,
        micro_batch_rows: args.micro_batch_rows,
        precision: args.precision,
        checkpointing: args.activation_checkpointing,
    };
    let memory = DeviceMemory::estimate(config, &layout, &shape);
    let gib = |bytes: u64| bytes as f64 / (1u64 << 30) as f64;
    let budget = args.device_memory;
    let fits = gib(memory.total_bytes()) <= budget;
    let mut features = Vec::new();
    if layout.sequence_parallel {
        features.push("sequence parallel".to_string());
    }
    if layout.zero1 {
        features.push("ZeRO-1".to_string());
    }
    features.push(format!(
        "activation checkpointing {}",
        args.activation_checkpointing
    ));
    Ok(format!(
        "layout: dp {} x tp {} ({} devices), {}\n\
         parameters per device: {}\n\
         memory per device: parameters {:.2} GiB ({}), gradients {:.2} GiB, optimizer state \
         {:.2} GiB, activations {:.2} GiB (estimate: {} x {} tokens per micro-batch)\n\
         total per device: {:.2} GiB of {budget} GiB: {}\n",
        layout.data,
        layout.tensor,
        layout.replicas(),
        features.join(", "),
        memory.parameters_per_device,
        gib(memory.parameter_bytes),
        args.precision,
        gib(memory.gradient_bytes),
        gib(memory.optimizer_bytes),
        gib(memory.activation_bytes),
        args.micro_batch_rows,
        seq_len,
        gib(memory.total_bytes()),
        if fits { "fits" } else { "does not fit" },
    ))
}

/// The configuration named by `model`, and a description of where it came from.
fn resolve(model: &str) -> anyhow::Result<(String, HlatConfig)> {
    if HlatConfig::preset_names().contains(&model) {
        return Ok((format!("preset {model}"), HlatConfig::preset(model)?));
    }
    let path = Path::new(model);
    if path.is_dir() {
        return match folder_kind(path) {
            Some(FolderKind::Native) => {
                let config = HlatConfig::load(&path.join(NATIVE_CONFIG_FILE))?;
                Ok((format!("native checkpoint {}", path.display()), config))
            }
            Some(FolderKind::HuggingFace) | None if path.join(hlat::hf::CONFIG_FILE).is_file() => {
                let config = hlat::hf::read_hf_config(path)?;
                Ok((format!("Hugging Face folder {}", path.display()), config))
            }
            _ => anyhow::bail!(
                "{}: no config.json (expected a native checkpoint or a Hugging Face folder)",
                path.display()
            ),
        };
    }
    if path.is_file() {
        // Our own JSON first; a file that is not one is read as a Hugging Face config.json.
        return match HlatConfig::load(path) {
            Ok(config) => Ok((format!("HLAT config {}", path.display()), config)),
            Err(ConfigError::Json { .. }) => {
                let config = hlat::hf::read_hf_config_file(path)?;
                Ok((format!("Hugging Face config {}", path.display()), config))
            }
            Err(error) => Err(error.into()),
        };
    }
    Err(ConfigError::UnknownPreset {
        name: model.to_string(),
    })
    .with_context(|| format!("`{model}` is neither a preset nor an existing file or folder"))
}

/// One `key: value` line per field, then the derived sizes.
fn describe(config: &HlatConfig) -> String {
    let pad = config
        .pad_token_id
        .map_or("none".to_string(), |id| id.to_string());
    let lines = [
        ("vocab_size", config.vocab_size.to_string()),
        ("hidden_size", config.hidden_size.to_string()),
        ("num_layers", config.num_layers.to_string()),
        ("num_heads", config.num_heads.to_string()),
        ("num_kv_heads", config.num_kv_heads.to_string()),
        ("head_dim", config.head_dim().to_string()),
        ("ffn_size", config.ffn_size.to_string()),
        ("max_seq_len", config.max_seq_len.to_string()),
        ("rms_norm_eps", config.rms_norm_eps.to_string()),
        ("rope_theta", config.rope_theta.to_string()),
        ("init_std", config.init_std.to_string()),
        ("bos_token_id", config.bos_token_id.to_string()),
        ("eos_token_id", config.eos_token_id.to_string()),
        ("pad_token_id", pad),
        ("parameters", config.num_params().to_string()),
        (
            "train_flops_per_token",
            format!(
                "{:.4e} (at {} tokens)",
                config.train_flops_per_token(config.max_seq_len),
                config.max_seq_len
            ),
        ),
    ];
    lines
        .iter()
        .map(|(key, value)| format!("{key}: {value}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_and_hf_folders_print_their_parameter_count() {
        let (_, config) = resolve("hlat-70b").unwrap();
        assert!(describe(&config).contains("\nparameters: 68976648192\n"));
        let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/hf-tiny-llama");
        let (source, config) = resolve(fixture).unwrap();
        assert!(source.starts_with("Hugging Face folder"), "{source}");
        assert!(describe(&config).contains("\nparameters: 230208\n"));
        assert!(resolve("hlat-13b").is_err());
    }
}
