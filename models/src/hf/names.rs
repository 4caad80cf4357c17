//! The Hugging Face `LlamaForCausalLM` tensor names of an HLAT model, and their Burn paths.

use crate::config::HlatConfig;

/// One weight: its Hugging Face name and shape, its Burn path, and whether the stored matrix is
/// the transpose of Burn's (torch `Linear` is `[out, in]`, Burn's `[in, out]`).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    /// Hugging Face name, e.g. `model.layers.0.self_attn.q_proj.weight`.
    pub hf_name: String,
    /// Burn module path, e.g. `layers.0.self_attn.q_proj.weight`.
    pub burn_path: String,
    /// Shape as stored by Hugging Face.
    pub hf_shape: Vec<usize>,
    /// Whether the Burn tensor is the transpose of the stored one.
    pub transposed: bool,
}

/// Every weight of a model of `config`, in the order transformers saves them, made one at a
/// time (a configuration read from a file may ask for any number of layers).
pub fn tensor_specs(config: &HlatConfig) -> impl Iterator<Item = TensorSpec> + '_ {
    let hidden = config.hidden_size;
    let embedding = TensorSpec {
        hf_name: "model.embed_tokens.weight".into(),
        burn_path: "embed_tokens.weight".into(),
        hf_shape: vec![config.vocab_size, hidden],
        transposed: false,
    };
    let mut lm_head = linear("lm_head.weight".into(), config.vocab_size, hidden);
    lm_head.hf_name = "lm_head.weight".into();
    std::iter::once(embedding)
        .chain((0..config.num_layers).flat_map(move |layer| layer_specs(config, layer)))
        .chain([vector("norm.weight".into(), hidden), lm_head])
}

/// A norm gain of `size` at Burn path `path`.
fn vector(path: String, size: usize) -> TensorSpec {
    TensorSpec {
        hf_name: format!("model.{path}"),
        burn_path: path,
        hf_shape: vec![size],
        transposed: false,
    }
}

/// A projection at Burn path `path`, stored `[out, input]` as torch does.
fn linear(path: String, out: usize, input: usize) -> TensorSpec {
    TensorSpec {
        hf_name: format!("model.{path}"),
        burn_path: path,
        hf_shape: vec![out, input],
        transposed: true,
    }
}

/// The weights of decoder layer `layer`.
fn layer_specs(config: &HlatConfig, layer: usize) -> [TensorSpec; 9] {
    let hidden = config.hidden_size;
    let kv_width = config.num_kv_heads * config.head_dim();
    let q_width = config.num_heads * config.head_dim();
    let ffn = config.ffn_size;
    let prefix = format!("layers.{layer}");
    [
        vector(format!("{prefix}.input_layernorm.weight"), hidden),
        linear(format!("{prefix}.self_attn.q_proj.weight"), q_width, hidden),
        linear(
            format!("{prefix}.self_attn.k_proj.weight"),
            kv_width,
            hidden,
        ),
        linear(
            format!("{prefix}.self_attn.v_proj.weight"),
            kv_width,
            hidden,
        ),
        linear(format!("{prefix}.self_attn.o_proj.weight"), hidden, q_width),
        vector(format!("{prefix}.post_attention_layernorm.weight"), hidden),
        linear(format!("{prefix}.mlp.gate_proj.weight"), ffn, hidden),
        linear(format!("{prefix}.mlp.up_proj.weight"), ffn, hidden),
        linear(format!("{prefix}.mlp.down_proj.weight"), hidden, ffn),
    ]
}

/// Buffers older transformers versions saved that carry no weights (recomputed from the config).
pub fn is_derived_buffer(name: &str) -> bool {
    name.ends_with(".self_attn.rotary_emb.inv_freq")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_cover_every_parameter_once() {
        let config = HlatConfig::preset("hlat-tiny").unwrap();
        let specs: Vec<_> = tensor_specs(&config).collect();
        let total: usize = specs
            .iter()
            .map(|s| s.hf_shape.iter().product::<usize>())
            .sum();
        assert_eq!(total as u64, config.num_params());
        assert_eq!(specs.len(), 2 + 9 * config.num_layers + 1);
        assert_eq!(specs.last().unwrap().hf_name, "lm_head.weight");
    }
}
