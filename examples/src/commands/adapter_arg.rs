//! `--adapter DIR`, the flag of `hlat generate`, `hlat eval perplexity` and `hlat eval choice`
//! that applies a PEFT LoRA adapter folder to the loaded model (as `PeftModel.from_pretrained`
//! does, the adapter kept apart from the weights).

use std::path::PathBuf;

use anyhow::Context;
use burn::tensor::Device;
use clap::Args;
use hlat::Hlat;

/// A PEFT adapter to apply to the model.
#[derive(Args, Debug, Clone, Default)]
pub struct AdapterArg {
    /// A PEFT LoRA adapter folder (`adapter_config.json` + `adapter_model.safetensors`, as
    /// PEFT or `hlat finetune` writes it) applied to the model.
    #[arg(long, value_name = "DIR")]
    pub adapter: Option<PathBuf>,
}

impl AdapterArg {
    /// `model` with the adapter attached, or as it is without `--adapter`.
    pub fn apply(&self, model: Hlat, device: &Device) -> anyhow::Result<Hlat> {
        match &self.adapter {
            Some(dir) => hlat::hf::adapter::load_adapter(model, dir, device)
                .map(|(_, model)| model)
                .with_context(|| format!("--adapter {}", dir.display())),
            None => Ok(model),
        }
    }
}
