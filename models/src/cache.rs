//! The key/value cache of incremental decoding.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// Keys and values of one layer, `[batch, kv_heads, positions, head_dim]`, after rotary.
#[derive(Debug, Clone)]
pub struct LayerCache<B: Backend> {
    keys: Tensor<B, 4>,
    values: Tensor<B, 4>,
}

/// Keys and values of every layer for the positions already processed.
///
/// Create it empty with [`KvCache::new`], then pass it to [`crate::Hlat::forward_cached`]
/// with the prompt and, afterwards, one new token at a time.
#[derive(Debug, Clone)]
pub struct KvCache<B: Backend> {
    layers: Vec<Option<LayerCache<B>>>,
    len: usize,
}

impl<B: Backend> KvCache<B> {
    /// An empty cache for a model of `num_layers` layers.
    pub fn new(num_layers: usize) -> Self {
        Self {
            layers: vec![None; num_layers],
            len: 0,
        }
    }

    /// Number of positions cached (the position of the next token).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing has been cached yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `keys`/`values` of `layer` and returns all keys and values cached for it.
    pub(crate) fn append(
        &mut self,
        layer: usize,
        keys: Tensor<B, 4>,
        values: Tensor<B, 4>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let entry = match self.layers[layer].take() {
            Some(cached) => LayerCache {
                keys: Tensor::cat(vec![cached.keys, keys], 2),
                values: Tensor::cat(vec![cached.values, values], 2),
            },
            None => LayerCache { keys, values },
        };
        let all = (entry.keys.clone(), entry.values.clone());
        self.layers[layer] = Some(entry);
        all
    }

    /// Records that `count` more positions have been processed by every layer.
    pub(crate) fn advance(&mut self, count: usize) {
        self.len += count;
    }
}
