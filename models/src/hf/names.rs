//! The Hugging Face tensor names of a LLaMA-family model (`LlamaForCausalLM` and the families
//! that share its names), and their Burn paths.

use crate::config::HlatConfig;
use crate::family::ModelFamily;

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
/// time (a configuration read from a file may ask for any number of layers). A tied model has
/// no `lm_head.weight`: transformers neither saves nor expects it.
pub fn tensor_specs(config: &HlatConfig) -> impl Iterator<Item = TensorSpec> + '_ {
    let hidden = config.hidden_size;
    let embedding = TensorSpec {
        hf_name: "model.embed_tokens.weight".into(),
        burn_path: "embed_tokens.weight".into(),
        hf_shape: vec![config.vocab_size, hidden],
        transposed: false,
    };
    let lm_head = (!config.tie_word_embeddings).then(|| {
        let mut lm_head = linear("lm_head.weight".into(), config.vocab_size, hidden);
        lm_head.hf_name = "lm_head.weight".into();
        lm_head
    });
    std::iter::once(embedding)
        .chain((0..config.num_layers).flat_map(move |layer| layer_specs(config, layer)))
        .chain(std::iter::once(vector("norm.weight".into(), hidden)))
        .chain(lm_head)
}

/// A vector (a norm gain or a bias) of `size` at Burn path `path`.
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

/// The weights of decoder layer `layer`: each projection's weight followed by its bias when the
/// configuration has one, the per-head norms after the attention projections.
fn layer_specs(config: &HlatConfig, layer: usize) -> Vec<TensorSpec> {
    let hidden = config.hidden_size;
    let head_dim = config.head_dim();
    let kv_width = config.num_kv_heads * head_dim;
    let q_width = config.num_heads * head_dim;
    let prefix = format!("layers.{layer}");
    let projection = |module: &str, out: usize, input: usize, bias: bool| {
        let path = format!("{prefix}.{module}");
        let bias = bias.then(|| vector(format!("{path}.bias"), out));
        std::iter::once(linear(format!("{path}.weight"), out, input)).chain(bias)
    };
    let head_norms = config.qk_norm.then(|| {
        ["q_norm", "k_norm"]
            .map(|norm| vector(format!("{prefix}.self_attn.{norm}.weight"), head_dim))
    });
    std::iter::once(vector(format!("{prefix}.input_layernorm.weight"), hidden))
        .chain(projection(
            "self_attn.q_proj",
            q_width,
            hidden,
            config.qkv_bias,
        ))
        .chain(projection(
            "self_attn.k_proj",
            kv_width,
            hidden,
            config.qkv_bias,
        ))
        .chain(projection(
            "self_attn.v_proj",
            kv_width,
            hidden,
            config.qkv_bias,
        ))
        .chain(projection(
            "self_attn.o_proj",
            hidden,
            q_width,
            config.o_proj_bias,
        ))
        .chain(head_norms.into_iter().flatten())
        .chain(std::iter::once(vector(
            format!("{prefix}.post_attention_layernorm.weight"),
            hidden,
        )))
        .chain(feed_forward_specs(config, layer))
        .collect()
}

/// The weights of layer `layer`'s feed-forward network: the dense SwiGLU projections, or a
/// mixture's router, experts and shared expert under the family's names (Mixtral's
/// `block_sparse_moe.experts.N.w1/w2/w3`, Qwen's `mlp.experts.N.{gate,up,down}_proj`).
fn feed_forward_specs(config: &HlatConfig, layer: usize) -> Vec<TensorSpec> {
    let hidden = config.hidden_size;
    let prefix = format!("layers.{layer}");
    let Some(moe) = config.moe.as_ref().filter(|moe| moe.is_sparse(layer)) else {
        let ffn = config.ffn_size;
        let bias = config.mlp_bias;
        return ["gate_proj", "up_proj", "down_proj"]
            .into_iter()
            .flat_map(|name| {
                let path = format!("{prefix}.mlp.{name}");
                let (out, input) = if name == "down_proj" {
                    (hidden, ffn)
                } else {
                    (ffn, hidden)
                };
                let bias = bias.then(|| vector(format!("{path}.bias"), out));
                std::iter::once(linear(format!("{path}.weight"), out, input)).chain(bias)
            })
            .collect();
    };
    let mixtral = config.family == ModelFamily::Mixtral;
    let block = if mixtral { "block_sparse_moe" } else { "mlp" };
    let hf = |name: String| format!("model.{prefix}.{block}.{name}");
    let burn = |name: String| format!("{prefix}.moe.{name}");
    let mut specs = vec![renamed(
        hf("gate.weight".into()),
        burn("router.weight".into()),
        [moe.num_experts, hidden],
    )];
    // (Burn's name, Mixtral's name, whether it is the down projection)
    let projections = [
        ("gate_proj", "w1", false),
        ("up_proj", "w3", false),
        ("down_proj", "w2", true),
    ];
    let swiglu = |hf_module: &dyn Fn(&str, &str) -> String, burn_module: &str, width: usize| {
        projections.map(|(name, mixtral_name, down)| {
            let shape = if down {
                [hidden, width]
            } else {
                [width, hidden]
            };
            renamed(
                hf_module(name, mixtral_name),
                burn(format!("{burn_module}.{name}.weight")),
                shape,
            )
        })
    };
    for expert in 0..moe.num_experts {
        let hf_name = |name: &str, mixtral_name: &str| {
            let name = if mixtral { mixtral_name } else { name };
            hf(format!("experts.{expert}.{name}.weight"))
        };
        specs.extend(swiglu(
            &hf_name,
            &format!("experts.{expert}"),
            moe.expert_ffn_size,
        ));
    }
    if let Some(width) = moe.shared_expert_ffn_size {
        let hf_name = |name: &str, _: &str| hf(format!("shared_expert.{name}.weight"));
        specs.extend(swiglu(&hf_name, "shared_expert", width));
        specs.push(renamed(
            hf("shared_expert_gate.weight".into()),
            burn("shared_expert_gate.weight".into()),
            [1, hidden],
        ));
    }
    specs
}

/// A projection stored `[out, input]` under `hf_name`, whose Burn path `burn_path` is not the
/// Hugging Face name without `model.` (a mixture's tensors).
fn renamed(hf_name: String, burn_path: String, shape: [usize; 2]) -> TensorSpec {
    TensorSpec {
        hf_name,
        burn_path,
        hf_shape: shape.to_vec(),
        transposed: true,
    }
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
