//! The fused attention on Burn 0.22 tensors: what models call.

use burn::backend::Dispatch;
use burn::tensor::{Device, Tensor};

use super::extension::AttentionExtension;
use super::options::FusedAttentionOptions;
use super::reference::{checked_shape, materialized_attention};
use crate::collective::remote_device;
use crate::error::BackendError;
use std::sync::OnceLock;

/// Whether [`fused_attention`] on `device` is the fused operation (a Trainium device served as a
/// Burn device, unless `TRAINIUM_FUSED_ATTENTION=off`) rather than [`materialized_attention`].
pub fn is_fused_on(device: &Device) -> bool {
    // The setting was validated when the device opened (`check_device` reports a bad value).
    remote_device(device).is_some()
        && fused_attention_from_env().map_or(true, |setting| setting != FusedAttentionSetting::Off)
}

/// What `TRAINIUM_FUSED_ATTENTION` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FusedAttentionSetting {
    /// One operation forward and one backward, lowered as the executor's platform does best.
    On,
    /// The materialised form in Burn's operations.
    Off,
    /// One operation each way, lowered as cuDNN's flash attention whatever the platform: the
    /// HLO a CUDA plugin would be given, to read (`TRAINIUM_DUMP_DIR`) where there is none.
    Cudnn,
}

/// `TRAINIUM_FUSED_ATTENTION` (read once; `on` when unset), or the error naming its bad value.
pub(crate) fn fused_attention_from_env() -> Result<FusedAttentionSetting, BackendError> {
    static SETTING: OnceLock<Result<FusedAttentionSetting, BackendError>> = OnceLock::new();
    let variable = crate::settings::FUSED_ATTENTION;
    SETTING
        .get_or_init(|| match variable.value().as_deref().map(str::trim) {
            None | Some("") | Some("on") => Ok(FusedAttentionSetting::On),
            Some("off") => Ok(FusedAttentionSetting::Off),
            Some("cudnn") => Ok(FusedAttentionSetting::Cudnn),
            Some(other) => Err(BackendError::InvalidSetting {
                variable: variable.name,
                value: other.to_string(),
                reason: "expected `on`, `off` or `cudnn`".to_string(),
            }),
        })
        .clone()
}

/// `softmax(cap(q kᵀ · scale), masked, sinks) v` of `query [b, h, q, d]` over `key [b, kv, k, d]`
/// and `value [b, kv, k, dv]` (`h` a multiple of `kv`: each key/value head serves `h / kv` query
/// heads), with one learned logit per head in each row's denominator when `sinks [h]` is given.
/// Computed in f32, the output in the query's dtype `[b, h, q, dv]`.
///
/// On a Trainium device it is one operation forward and one backward (see the
/// [module](super)); elsewhere it is [`materialized_attention`].
///
/// # Panics
/// When the tensors or the options do not fit together, naming what does not.
pub fn fused_attention(
    query: Tensor<4>,
    key: Tensor<4>,
    value: Tensor<4>,
    sinks: Option<Tensor<1>>,
    options: &FusedAttentionOptions,
) -> Tensor<4> {
    if !is_fused_on(&query.device()) {
        return materialized_attention(query, key, value, sinks, options);
    }
    fused_attention_with_statistics(query, key, value, sinks, options).0
}

/// [`fused_attention`] on a Trainium device, with the f32 log-sum-exp statistics of each query
/// row `[b, h, q]` (not differentiable): what joins partial attentions over pieces of the keys.
///
/// # Panics
/// When `query` is not on a Trainium device, or as [`fused_attention`] does.
pub fn fused_attention_with_statistics(
    query: Tensor<4>,
    key: Tensor<4>,
    value: Tensor<4>,
    sinks: Option<Tensor<1>>,
    options: &FusedAttentionOptions,
) -> (Tensor<4>, Tensor<3>) {
    checked_shape(&query, &key, &value, sinks.as_ref(), options);
    assert!(
        is_fused_on(&query.device()),
        "fused attention statistics need a Trainium device, not {:?}",
        query.device()
    );
    let (query, key, value) = (
        query.into_dispatch(),
        key.into_dispatch(),
        value.into_dispatch(),
    );
    let (output, statistics) = match sinks {
        None => Dispatch::fused_attention_forward(query, key, value, *options),
        Some(sinks) => Dispatch::fused_attention_forward_with_sinks(
            query,
            key,
            value,
            sinks.into_dispatch(),
            *options,
        ),
    };
    (
        Tensor::from_dispatch(output),
        Tensor::from_dispatch(statistics),
    )
}
