//! `hlat info`: print a configuration, its parameter count, and the memory one device needs to
//! train it in a parallel layout.

use std::path::Path;

use anyhow::Context;
use clap::Args;
use hlat::checkpoint::files::NATIVE_CONFIG_FILE;
use hlat::checkpoint::{FolderKind, folder_kind};
use hlat::lora::{LoraConfig, LoraTarget};
use hlat::{ConfigError, HlatConfig, RopeScaling};
use hlat_train::config::TrainConfig;
use hlat_train::parallel::{
    ActivationCheckpointing, CheckpointStaging, DeviceMemory, LoraShape, ParallelLayout,
    PipelineShape, StepShape,
};
use hlat_train::precision::Precision;

use super::align::MethodArg;

/// Arguments of `hlat info`.
#[derive(Args)]
pub struct InfoArgs {
    /// A preset name (`hlat-7b`, `hlat-70b`, `hlat-tiny`, `hlat-test`, `bench-tiny`,
    /// `llama-3.1-8b`, `llama-3.2-1b`, `mistral-7b`, `qwen2.5-0.5b`, `mixtral-8x7b`,
    /// `qwen3-30b-a3b`, `bench-tiny-moe`), an HLAT or
    /// Hugging Face `config.json`, or a model folder (native checkpoint or Hugging Face).
    pub model: String,
    /// Data-parallel degree of the layout whose memory is estimated.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = super::ranges::at_least_one::<usize>())]
    pub dp: usize,
    /// Tensor-parallel degree.
    #[arg(long, value_name = "M", default_value_t = 1, value_parser = super::ranges::at_least_one::<usize>())]
    pub tp: usize,
    /// Expert-parallel degree of a mixture: its experts split over N of the --dp replicas.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = super::ranges::at_least_one::<usize>())]
    pub ep: usize,
    /// Pipeline parallelism (`--pp N`, `--pp-layers`, `--pp-schedule`, `--virtual-stages`).
    #[command(flatten)]
    pub pipeline: super::pipeline_args::PipelineArgs,
    /// Tokens per optimizer step (over every data-parallel replica): with --pp, the micro-batches
    /// the schedule overlaps (`batch_tokens / (seq_len × micro_batch_rows × dp)`).
    #[arg(long, value_name = "N", value_parser = super::ranges::at_least_one::<usize>())]
    pub batch_tokens: Option<usize>,
    /// Sequence parallelism inside the tensor-parallel groups.
    #[arg(long)]
    pub sequence_parallel: bool,
    /// The AdamW state partitioned over the data-parallel replicas.
    #[arg(long)]
    pub zero1: bool,
    /// Fully sharded data parallelism: parameters, gradients and AdamW state partitioned over the
    /// data-parallel replicas, each layer gathered whole just before use.
    #[arg(long)]
    pub fsdp: bool,
    /// What the backward pass recomputes: none, full or selective.
    #[arg(long, value_name = "MODE", default_value = "none")]
    pub activation_checkpointing: ActivationCheckpointing,
    /// Tokens per row (default: the model's context).
    #[arg(long, value_name = "N", value_parser = super::ranges::at_least_one::<usize>())]
    pub seq_len: Option<usize>,
    /// Rows per micro-batch on each data-parallel replica [default: 1; with --align, 2: one
    /// pair].
    #[arg(long, value_name = "N", value_parser = super::ranges::at_least_one::<usize>())]
    pub micro_batch_rows: Option<usize>,
    /// The memory of a preference run (`hlat align --method M`): pairs of rows, and for DPO the
    /// reference model's pass before training.
    #[arg(long, value_name = "METHOD", value_enum)]
    pub align: Option<super::align::MethodArg>,
    /// Parameter and compute precision: f32, bf16-sr or bf16-mixed.
    #[arg(long, value_name = "P", default_value = "bf16-sr")]
    pub precision: Precision,
    /// LoRA adapters of rank R on frozen weights: only they take gradients and optimizer state.
    #[arg(long, value_name = "R", value_parser = super::ranges::at_least_one::<usize>())]
    pub lora_rank: Option<usize>,
    /// The projections the adapters adapt, among q, k, v, o, gate, up, down [default: all].
    #[arg(long, value_name = "q,k,...", requires = "lora_rank")]
    pub lora_targets: Option<String>,
    /// A mixture of experts' capacity factor (as `hlat pretrain --moe-capacity-factor`): its
    /// experts' activations over their slots instead of every token.
    #[arg(long, value_name = "F", value_parser = super::ranges::positive)]
    pub moe_capacity_factor: Option<f64>,
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
    let micro_batch_rows =
        args.micro_batch_rows
            .unwrap_or(if args.align.is_some() { 2 } else { 1 });
    anyhow::ensure!(micro_batch_rows > 0, "--micro-batch-rows must be positive");
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
    anyhow::ensure!(!args.fsdp || args.dp > 1, "--fsdp needs --dp above 1");
    anyhow::ensure!(
        !args.fsdp || args.ep == 1,
        "--fsdp is not supported with --ep yet"
    );
    anyhow::ensure!(
        args.dp.is_multiple_of(args.ep),
        "--ep {} does not divide --dp {}: expert-parallel ranks are data-parallel ranks",
        args.ep,
        args.dp
    );
    if args.ep > 1 {
        let experts = config.moe.as_ref().map(|moe| moe.num_experts);
        anyhow::ensure!(
            experts.is_some_and(|experts| experts.is_multiple_of(args.ep)),
            "--ep {}: {}",
            args.ep,
            match experts {
                Some(experts) => format!("the model's {experts} experts do not divide by it"),
                None => format!("the {} model is dense (no experts to split)", config.family),
            }
        );
    }
    hlat::parallel::check_degree(config, args.tp)
        .map_err(|reason| anyhow::anyhow!("--tp: {reason}"))?;
    let seq_len = args.seq_len.unwrap_or(config.max_seq_len);
    anyhow::ensure!(seq_len > 0, "--seq-len must be positive");
    anyhow::ensure!(
        !args.sequence_parallel || seq_len.is_multiple_of(args.tp),
        "--seq-len {seq_len} does not divide by --tp {} (sequence parallelism)",
        args.tp
    );
    let mut pipeline_config = TrainConfig::default();
    args.pipeline.apply(&mut pipeline_config);
    if args.align.is_some() {
        // The same refusals as a preference run's.
        hlat_train::align::pairs::check_config(&TrainConfig {
            micro_batch_rows,
            activation_checkpointing: args.activation_checkpointing,
            eval_every: 0,
            ..pipeline_config.clone()
        })
        .map_err(|error| anyhow::anyhow!("--align: {error}"))?;
    }
    anyhow::ensure!(
        !args.fsdp || pipeline_config.virtual_stages == 1,
        "--fsdp is not supported with --virtual-stages above 1 yet"
    );
    let layout = ParallelLayout {
        data: args.dp,
        expert: args.ep,
        tensor: args.tp,
        pipeline: pipeline_config.pipeline_parallel,
        sequence_parallel: args.sequence_parallel,
        zero1: args.zero1,
        fsdp: args.fsdp,
    };
    let batch_tokens = args.batch_tokens.unwrap_or(pipeline_config.batch_tokens);
    let micro_tokens = seq_len * micro_batch_rows * args.dp;
    anyhow::ensure!(
        batch_tokens.is_multiple_of(micro_tokens),
        "--batch-tokens {batch_tokens} is not a multiple of seq_len × micro_batch_rows × dp = \
         {micro_tokens}"
    );
    let micro_batches = batch_tokens / micro_tokens;
    let (pipeline, pipeline_text) =
        describe_pipeline(config, &layout, &pipeline_config, micro_batches)?;
    let lora = match args.lora_rank {
        None => None,
        Some(rank) => {
            let targets = match &args.lora_targets {
                Some(text) => LoraConfig::parse_targets(text)
                    .map_err(|reason| anyhow::anyhow!("--lora-targets: {reason}"))?,
                None => LoraTarget::ALL.to_vec(),
            };
            Some(LoraShape::of(&LoraConfig {
                targets,
                ..LoraConfig::new(rank, 2.0 * rank as f64)
            }))
        }
    };
    let shape = StepShape {
        seq_len,
        micro_batch_rows,
        precision: args.precision,
        checkpointing: args.activation_checkpointing,
        pipeline,
        lora,
        moe_capacity_factor: args.moe_capacity_factor,
    };
    let memory = DeviceMemory::estimate(config, &layout, &shape);
    let staging = CheckpointStaging::estimate(config, &shape);
    let gib = |bytes: u64| bytes as f64 / (1u64 << 30) as f64;
    let budget = args.device_memory;
    let (alignment, reference_pass) = describe_alignment(config, &layout, &shape, args.align);
    let total = memory.total_bytes().max(reference_pass);
    let fits = gib(total) <= budget;
    let mut features = Vec::new();
    if layout.sequence_parallel {
        features.push("sequence parallel".to_string());
    }
    if layout.fsdp {
        features.push("fully sharded".to_string());
    } else if layout.zero1 {
        features.push("ZeRO-1".to_string());
    }
    features.push(format!(
        "activation checkpointing {}",
        args.activation_checkpointing
    ));
    Ok(format!(
        "layout: dp {}{} x tp {} x pp {} ({} devices), {}\n\
         {pipeline_text}\
         parameters per device: {}\n\
         {}\
         memory per device: parameters {:.2} GiB ({}), gradients {:.2} GiB, optimizer state \
         {:.2} GiB, {}activations {:.2} GiB (estimate: {} x {} tokens per micro-batch)\n\
         {alignment}\
         total per device: {:.2} GiB of {budget} GiB: {}\n\
         checkpoint staging (--async-checkpoint): {:.2} GiB of host memory (the model in f32 \
         {:.2} GiB, optimizer state {:.2} GiB; in a job, rank 0 holds the model and each \
         process its share of the optimizer state)\n",
        layout.data,
        match layout.expert {
            1 => String::new(),
            expert => format!(" (experts split over {expert})"),
        },
        layout.tensor,
        layout.pipeline,
        layout.replicas(),
        features.join(", "),
        memory.parameters_per_device,
        match lora {
            Some(lora) => format!(
                "trainable parameters per device: {} (LoRA rank {}; the model's weights frozen: \
                 no gradients, no optimizer state)\n",
                memory.trainable_per_device, lora.rank
            ),
            None => String::new(),
        },
        gib(memory.parameter_bytes),
        args.precision,
        gib(memory.gradient_bytes),
        gib(memory.optimizer_bytes),
        match (layout.fsdp, args.activation_checkpointing) {
            (false, _) => String::new(),
            (true, ActivationCheckpointing::Full) => format!(
                "gathered weights {:.2} GiB (one layer, the embedding or the head at a time), ",
                gib(memory.gathered_bytes)
            ),
            (true, _) => format!(
                "gathered weights {:.2} GiB (every layer's, kept for the backward pass; \
                 --activation-checkpointing full gathers one at a time), ",
                gib(memory.gathered_bytes)
            ),
        },
        gib(memory.activation_bytes),
        micro_batch_rows,
        seq_len,
        gib(total),
        if fits { "fits" } else { "does not fit" },
        gib(staging.model_bytes + staging.optimizer_bytes),
        gib(staging.model_bytes),
        gib(staging.optimizer_bytes),
    ))
}

/// What a preference run of `method` adds to the description, and the peak bytes per device of
/// DPO's reference pass (0 without one): its weights (the policy's are not loaded yet) and one
/// micro-batch's f32 logits, the largest tensor of a forward pass.
fn describe_alignment(
    config: &HlatConfig,
    layout: &ParallelLayout,
    shape: &StepShape,
    method: Option<MethodArg>,
) -> (String, u64) {
    let Some(method) = method else {
        return (String::new(), 0);
    };
    let gib = |bytes: u64| bytes as f64 / (1u64 << 30) as f64;
    let pairs = shape.micro_batch_rows / 2;
    let rows = format!(
        "alignment: {}, pairs per micro-batch: {pairs} (each its chosen and its rejected row)",
        match method {
            MethodArg::Dpo => "dpo",
            MethodArg::Orpo => "orpo",
        }
    );
    if method == MethodArg::Orpo {
        return (format!("{rows}; no reference model\n"), 0);
    }
    let frozen = StepShape {
        lora: None,
        ..*shape
    };
    let weights = DeviceMemory::estimate(config, layout, &frozen).parameter_bytes;
    let vocab_per_device = config.vocab_size.div_ceil(layout.tensor) as u64;
    let logits = (shape.micro_batch_rows * shape.seq_len) as u64 * vocab_per_device * 4;
    let pass = weights + logits;
    (
        format!(
            "{rows}; the reference model's log-probabilities are computed before training \
             (forward only: {:.2} GiB per device, its weights and a micro-batch's logits), so \
             training holds one model (a reference kept through training would add {:.2} GiB \
             per device)\n",
            gib(pass),
            gib(weights)
        ),
        pass,
    )
}

/// The stages of a pipelined layout as memory sees them, and their description: stages, layers
/// per stage, schedule, micro-batches and bubble (nothing without --pp).
fn describe_pipeline(
    config: &HlatConfig,
    layout: &ParallelLayout,
    settings: &TrainConfig,
    micro_batches: usize,
) -> anyhow::Result<(Option<PipelineShape>, String)> {
    settings
        .pipeline_schedule
        .check(settings.virtual_stages)
        .map_err(|reason| anyhow::anyhow!(reason))?;
    let stages = layout
        .pipeline_parallel(
            config.num_layers,
            settings.pipeline_layers.clone(),
            settings.virtual_stages,
        )
        .map_err(|reason| anyhow::anyhow!("--pp: {reason}"))?;
    let Some(stages) = stages else {
        anyhow::ensure!(
            settings.pipeline_layers.is_none() && settings.virtual_stages == 1,
            "--pp-layers and --virtual-stages need --pp above 1"
        );
        return Ok((None, String::new()));
    };
    let per_stage: Vec<String> = (0..stages.stages())
        .map(|stage| stages.stage_layers(stage).len().to_string())
        .collect();
    let bubble =
        hlat::pipeline::bubble_fraction(stages.stages(), stages.virtual_stages, micro_batches);
    let text = format!(
        "pipeline: {} stages, schedule {}{}, layers per stage {} ({} layer slots per device), \
         {micro_batches} micro-batches, bubble {:.4} ((p - 1) / (m·V + p - 1))\n",
        stages.stages(),
        stages.schedule(),
        if stages.virtual_stages > 1 {
            format!(" ({} virtual stages)", stages.virtual_stages)
        } else {
            String::new()
        },
        per_stage.join(","),
        stages.local_layers(),
        bubble,
    );
    let shape = PipelineShape {
        layer_slots: stages.local_layers(),
        virtual_stages: stages.virtual_stages,
        micro_batches,
    };
    Ok((Some(shape), text))
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
    let yes_no = |value: bool| if value { "yes" } else { "no" }.to_string();
    let biases: Vec<&str> = [
        (config.qkv_bias, "q/k/v"),
        (config.o_proj_bias, "o"),
        (config.mlp_bias, "mlp"),
    ]
    .into_iter()
    .filter_map(|(present, name)| present.then_some(name))
    .collect();
    let window = config.sliding_window.map_or("none".to_string(), |window| {
        format!("{} (from layer {})", window.size, window.first_layer)
    });
    let lines = [
        ("model_type", config.family.to_string()),
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
        ("rope_scaling", rope_scaling(&config.rope_scaling)),
        ("tie_word_embeddings", yes_no(config.tie_word_embeddings)),
        (
            "biases",
            if biases.is_empty() {
                "none".to_string()
            } else {
                biases.join(", ")
            },
        ),
        ("qk_norm", yes_no(config.qk_norm)),
        ("sliding_window", window),
        ("init_std", config.init_std.to_string()),
        ("bos_token_id", config.bos_token_id.to_string()),
        ("eos_token_id", config.eos_token_id.to_string()),
        ("pad_token_id", pad),
        ("experts", experts(config)),
        ("parameters", config.num_params().to_string()),
        ("active_parameters", config.num_active_params().to_string()),
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

/// A mixture of experts as `E experts, k per token, ...`; `none` for a dense model.
fn experts(config: &HlatConfig) -> String {
    let Some(moe) = &config.moe else {
        return "none".into();
    };
    let sparse = (0..config.num_layers)
        .filter(|&layer| moe.is_sparse(layer))
        .count();
    let shared = moe.shared_expert_ffn_size.map_or(String::new(), |width| {
        format!(", a shared expert of FFN {width}")
    });
    format!(
        "{} of FFN {}, {} per token{}{shared}, in {sparse} of {} layers, router_aux_loss_coef {}",
        moe.num_experts,
        moe.expert_ffn_size,
        moe.experts_per_token,
        if moe.normalize_top_k {
            " (renormalised)"
        } else {
            ""
        },
        config.num_layers,
        moe.router_aux_loss_coef
    )
}

/// RoPE scaling as `type (field value, ...)`.
fn rope_scaling(scaling: &RopeScaling) -> String {
    let json = serde_json::to_value(scaling).expect("RoPE scaling serializes to JSON");
    let fields: Vec<String> = json
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(key, _)| key.as_str() != "rope_type")
        .map(|(key, value)| format!("{key} {value}"))
        .collect();
    if fields.is_empty() {
        scaling.rope_type().to_string()
    } else {
        format!("{} ({})", scaling.rope_type(), fields.join(", "))
    }
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
        let (_, config) = resolve("qwen3-30b-a3b").unwrap();
        let described = describe(&config);
        assert!(described.contains("\nparameters: 30532122624\nactive_parameters: 3353032704\n"));
        assert!(
            described.contains(
                "\nexperts: 128 of FFN 768, 8 per token (renormalised), in 48 of 48 layers"
            )
        );
    }

    /// The published presets print their exact parameter counts and what sets their family
    /// apart.
    #[test]
    fn published_presets_describe_their_family() {
        let cases = [
            ("llama-3.1-8b", "8030261248", "rope_scaling: llama3 ("),
            ("llama-3.2-1b", "1235814400", "tie_word_embeddings: yes"),
            ("mistral-7b", "7248023552", "model_type: mistral"),
            ("qwen2.5-0.5b", "494032768", "biases: q/k/v"),
        ];
        for (name, parameters, feature) in cases {
            let (_, config) = resolve(name).unwrap();
            let text = describe(&config);
            assert!(
                text.contains(&format!("\nparameters: {parameters}\n")),
                "{text}"
            );
            assert!(text.contains(feature), "{name}: {text}");
        }
    }
}
