//! The key/value cache of incremental decoding, with a fixed capacity so that every decoding
//! step is the same program on a compiled device.
//!
//! The cache is allocated once, `[batch, kv_heads, capacity, head_dim]` per layer. New keys and
//! values are written at the current position by a placement matrix (a one-hot `[capacity, seq]`
//! made on the host) and attention masks out positions not yet written by comparing key slots
//! with the query positions, also made on the host. The position is data, never a shape or a
//! slice bound: decoding token 10 and token 1000 run the same program (as NeuronX Distributed
//! Inference does with its static KV cache).

use burn::tensor::{Bool, DType, Device, Tensor, TensorData};

use crate::config::HlatConfig;

/// Keys and values of one layer, `[batch, kv_heads, capacity, head_dim]`, after rotary.
#[derive(Debug, Clone)]
struct LayerCache {
    keys: Tensor<4>,
    values: Tensor<4>,
}

/// Keys and values of every layer for up to `capacity` positions.
///
/// Create it with [`KvCache::new`], then pass it to [`crate::Hlat::forward_cached`] with the
/// prompt and, afterwards, one new token at a time.
#[derive(Debug, Clone)]
pub struct KvCache {
    layers: Vec<LayerCache>,
    len: usize,
    capacity: usize,
    /// The model's sliding window, if some layer slides.
    window: Option<usize>,
}

/// Where one forward pass writes into the cache and what its queries see, as run-time data
/// (made by [`KvCache::write_for`]).
#[derive(Debug, Clone)]
pub struct CacheWrite {
    /// `[capacity, seq]`: 1 where slot `c` receives input position `s`.
    placement: Tensor<2>,
    /// `[capacity]`: 1 for the slots kept, 0 for those overwritten.
    keep: Tensor<1>,
    /// `[seq, capacity]`: true where a key slot lies after the query's position (or is unwritten).
    future: Tensor<2, Bool>,
    /// `[seq, capacity]`: `future`, and true where a slot lies before the query's sliding window
    /// (when the model has one).
    outside_window: Option<Tensor<2, Bool>>,
}

impl KvCache {
    /// An empty cache of `capacity` positions for `batch` rows of a model of `config`, in
    /// `dtype` on `device`.
    pub fn new(
        config: &HlatConfig,
        batch: usize,
        capacity: usize,
        dtype: DType,
        device: &Device,
    ) -> Self {
        let shape = [batch, config.num_kv_heads, capacity, config.head_dim()];
        let zeros = || Tensor::<4>::zeros(shape, device).cast(dtype);
        Self {
            layers: (0..config.num_layers)
                .map(|_| LayerCache {
                    keys: zeros(),
                    values: zeros(),
                })
                .collect(),
            len: 0,
            capacity,
            window: config.sliding_window.map(|window| window.size),
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

    /// The number of positions the cache holds at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The run-time data of a forward pass over `seq` positions from [`KvCache::len`].
    ///
    /// # Panics
    /// When the positions do not fit the capacity.
    pub fn write_for(&self, seq: usize, device: &Device) -> CacheWrite {
        let (start, capacity) = (self.len, self.capacity);
        assert!(
            start + seq <= capacity,
            "positions {start}..{} exceed the cache's capacity of {capacity}",
            start + seq
        );
        let mut placement = vec![0f32; capacity * seq];
        let mut keep = vec![1f32; capacity];
        for position in 0..seq {
            placement[(start + position) * seq + position] = 1.0;
            keep[start + position] = 0.0;
        }
        // Slot c holds position c: a query at position p sees the slots p - window < c <= p.
        let mask = |window: Option<usize>| {
            let hidden: Vec<bool> = (0..seq)
                .flat_map(|query| {
                    let position = start + query;
                    (0..capacity).map(move |slot| {
                        slot > position || window.is_some_and(|window| slot + window <= position)
                    })
                })
                .collect();
            Tensor::from_data(TensorData::new(hidden, [seq, capacity]), device)
        };
        CacheWrite {
            placement: Tensor::from_data(TensorData::new(placement, [capacity, seq]), device),
            keep: Tensor::from_data(TensorData::new(keep, [capacity]), device),
            future: mask(None),
            outside_window: self.window.map(|window| mask(Some(window))),
        }
    }

    /// Writes `keys`/`values` `[batch, kv_heads, seq, head_dim]` of `layer` where `write`
    /// places them; returns the layer's whole cache and the mask of the slots each query must not
    /// see, `[seq, capacity]` (those before its window too when the layer `slides`).
    pub(crate) fn write(
        &mut self,
        layer: usize,
        keys: Tensor<4>,
        values: Tensor<4>,
        write: &CacheWrite,
        slides: bool,
    ) -> (Tensor<4>, Tensor<4>, Tensor<2, Bool>) {
        let dtype = keys.dtype();
        let placement = write.placement.clone().cast(dtype).unsqueeze::<4>();
        let keep = write
            .keep
            .clone()
            .cast(dtype)
            .reshape([1, 1, self.capacity, 1]);
        // One non-zero term per written slot: the new values land exactly.
        let place = |cached: Tensor<4>, new: Tensor<4>| {
            cached * keep.clone() + placement.clone().matmul(new)
        };
        let entry = &mut self.layers[layer];
        entry.keys = place(entry.keys.clone(), keys);
        entry.values = place(entry.values.clone(), values);
        let hidden = match (&write.outside_window, slides) {
            (Some(outside_window), true) => outside_window.clone(),
            _ => write.future.clone(),
        };
        (entry.keys.clone(), entry.values.clone(), hidden)
    }

    /// Records that `count` more positions have been processed by every layer.
    pub(crate) fn advance(&mut self, count: usize) {
        self.len += count;
    }

    /// Forgets positions from `len` on (they are overwritten by the next writes and masked until
    /// then): after a prompt padded to a bucket, the cache continues from the prompt's length.
    pub(crate) fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}
