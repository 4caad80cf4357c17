//! What a fused attention computes besides its tensors, and how it travels as a custom
//! operation's scalars.

use burn_ir::ScalarIr;

/// Query rows per block when the executors cut an attention ([`QueryBlock`]): the live scores
/// are one block's `[rows × keys]` per head.
pub const QUERY_BLOCK: usize = 512;

/// The options of [`super::fused_attention`]: `softmax(cap(q kᵀ · scale), masked, sinks) v`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FusedAttentionOptions {
    /// The factor of the products (`None`: `1/√head_dim`).
    pub scale: Option<f64>,
    /// Whether a query sees only the keys up to its own position. With fewer queries than keys
    /// the queries are the last positions (the keys before them a cache's).
    pub causal: bool,
    /// The positions a query sees, its own included (`None`: every earlier one). Needs `causal`.
    pub sliding_window: Option<usize>,
    /// Soft capping of the scaled products: `cap · tanh(s / cap)` (Gemma 2's logit cap).
    pub softcap: Option<f64>,
}

/// Why a fused attention's options or tensors do not fit together.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("fused attention: {0}")]
pub struct FusedAttentionError(pub String);

/// The dimensions of one fused attention, read from its tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    /// Rows of the batch.
    pub batch: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (`heads` is a multiple of them: grouped-query attention).
    pub kv_heads: usize,
    /// Query positions.
    pub queries: usize,
    /// Key positions.
    pub keys: usize,
    /// Width of a query and key head.
    pub depth: usize,
    /// Width of a value head.
    pub value_depth: usize,
}

impl AttentionShape {
    /// The shape of `query [b, h, q, d]`, `key [b, kv, k, d]`, `value [b, kv, k, dv]` and sinks
    /// `[h]` attended with `options`, or why they do not fit together.
    pub fn of(
        query: &[usize],
        key: &[usize],
        value: &[usize],
        sinks: Option<&[usize]>,
        options: &FusedAttentionOptions,
    ) -> Result<Self, FusedAttentionError> {
        let fail = |what: String| Err(FusedAttentionError(what));
        let four = |name: &str, dims: &[usize]| {
            <[usize; 4]>::try_from(dims).map_err(|_| {
                FusedAttentionError(format!(
                    "{name} of shape {dims:?} (not [batch, heads, positions, width])"
                ))
            })
        };
        let [b, h, q, d] = four("query", query)?;
        let [kb, kv, k, kd] = four("key", key)?;
        let [vb, vkv, vk, dv] = four("value", value)?;
        if kb != b || vb != b || vkv != kv || vk != k || kd != d {
            return fail(format!(
                "query {query:?}, key {key:?} and value {value:?} are not [batch, heads, \
                 positions, width] of one batch, one key width and one set of key/value heads"
            ));
        }
        if kv == 0 || h % kv != 0 {
            return fail(format!(
                "{h} query heads are not a multiple of {kv} key/value heads"
            ));
        }
        if let Some(sinks) = sinks
            && sinks != [h]
        {
            return fail(format!("sinks of shape {sinks:?} for {h} heads"));
        }
        let shape = Self {
            batch: b,
            heads: h,
            kv_heads: kv,
            queries: q,
            keys: k,
            depth: d,
            value_depth: dv,
        };
        options.check_shape(&shape)?;
        Ok(shape)
    }

    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.heads / self.kv_heads
    }

    /// The shape of the output `[b, h, q, dv]`.
    pub fn output(&self) -> [usize; 4] {
        [self.batch, self.heads, self.queries, self.value_depth]
    }

    /// The shape of the log-sum-exp statistics `[b, h, q]`.
    pub fn statistics(&self) -> [usize; 3] {
        [self.batch, self.heads, self.queries]
    }
}

/// A block of query rows and the keys its rows see, together: how the executors cut an
/// attention so that its live scores are one block's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryBlock {
    /// The query rows.
    pub rows: std::ops::Range<usize>,
    /// The keys from the first any row sees to the one past the last any row sees.
    pub keys: std::ops::Range<usize>,
}

impl FusedAttentionOptions {
    /// Plain causal attention with the default scale.
    pub fn causal() -> Self {
        Self {
            causal: true,
            ..Self::default()
        }
    }

    /// The factor of the products for heads of `depth`.
    pub fn scale_for(&self, depth: usize) -> f64 {
        self.scale.unwrap_or(1.0 / (depth as f64).sqrt())
    }

    /// Checks the options on their own.
    pub fn check(&self) -> Result<(), FusedAttentionError> {
        if self.sliding_window.is_some() && !self.causal {
            return Err(FusedAttentionError(
                "a sliding window needs causal attention".into(),
            ));
        }
        if self.sliding_window == Some(0) {
            return Err(FusedAttentionError(
                "a sliding window of 0 positions hides every key".into(),
            ));
        }
        if let Some(cap) = self.softcap
            && !(cap > 0.0 && cap.is_finite())
        {
            return Err(FusedAttentionError(format!(
                "a soft cap of {cap} (it must be positive)"
            )));
        }
        if let Some(scale) = self.scale
            && !scale.is_finite()
        {
            return Err(FusedAttentionError(format!("a scale of {scale}")));
        }
        Ok(())
    }

    /// Checks the options against the tensors' `shape`: every query row must see some key.
    fn check_shape(&self, shape: &AttentionShape) -> Result<(), FusedAttentionError> {
        self.check()?;
        if shape.keys == 0 {
            return Err(FusedAttentionError("attention over no keys".into()));
        }
        if self.causal && shape.queries > shape.keys {
            return Err(FusedAttentionError(format!(
                "causal attention of {} queries over {} keys (the queries are the last \
                 positions, so some would see no key)",
                shape.queries, shape.keys
            )));
        }
        Ok(())
    }

    /// The first key query `row` of `queries` over `keys` sees, and the one past its last (the
    /// queries are the last positions when causal).
    pub fn visible_keys(&self, row: usize, queries: usize, keys: usize) -> (usize, usize) {
        if !self.causal {
            return (0, keys);
        }
        let position = row + keys.saturating_sub(queries);
        let end = (position + 1).min(keys);
        let start = self
            .sliding_window
            .map_or(0, |window| (position + 1).saturating_sub(window));
        (start, end)
    }

    /// The rows of `shape` cut into blocks of `size` queries, each with the keys its rows see.
    pub fn query_blocks(&self, shape: &AttentionShape, size: usize) -> Vec<QueryBlock> {
        let AttentionShape { queries, keys, .. } = *shape;
        (0..queries)
            .step_by(size.max(1))
            .map(|first| {
                let end = (first + size).min(queries);
                let (start, _) = self.visible_keys(first, queries, keys);
                let (_, last) = self.visible_keys(end - 1, queries, keys);
                QueryBlock {
                    rows: first..end,
                    keys: start..last,
                }
            })
            .collect()
    }

    /// Whether some row of `block` does not see some key of the block.
    pub fn hides_keys_in(&self, block: &QueryBlock, shape: &AttentionShape) -> bool {
        block.rows.clone().any(|row| {
            let (start, end) = self.visible_keys(row, shape.queries, shape.keys);
            start > block.keys.start || end < block.keys.end
        })
    }

    /// The options as a custom operation's scalars: scale (NaN for the default), causal,
    /// window (0 for none), soft cap (0 for none).
    pub fn to_scalars(&self) -> Vec<ScalarIr> {
        vec![
            ScalarIr::Float(self.scale.unwrap_or(f64::NAN)),
            ScalarIr::Bool(self.causal),
            ScalarIr::UInt(self.sliding_window.unwrap_or(0) as u64),
            ScalarIr::Float(self.softcap.unwrap_or(0.0)),
        ]
    }

    /// The options [`FusedAttentionOptions::to_scalars`] wrote.
    pub fn from_scalars(scalars: &[ScalarIr]) -> Result<Self, FusedAttentionError> {
        match scalars {
            [
                ScalarIr::Float(scale),
                ScalarIr::Bool(causal),
                ScalarIr::UInt(window),
                ScalarIr::Float(softcap),
            ] => {
                let options = Self {
                    scale: (!scale.is_nan()).then_some(*scale),
                    causal: *causal,
                    sliding_window: (*window > 0).then_some(*window as usize),
                    softcap: (*softcap != 0.0).then_some(*softcap),
                };
                options.check()?;
                Ok(options)
            }
            other => Err(FusedAttentionError(format!(
                "the scalars (scale, causal, window, soft cap) were expected, not {other:?}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_travel_through_their_scalars() {
        let options = [
            FusedAttentionOptions::default(),
            FusedAttentionOptions::causal(),
            FusedAttentionOptions {
                scale: Some(0.125),
                causal: true,
                sliding_window: Some(3),
                softcap: Some(30.0),
            },
        ];
        for options in options {
            let back = FusedAttentionOptions::from_scalars(&options.to_scalars()).unwrap();
            assert_eq!(back, options);
        }
    }

    #[test]
    fn visible_keys_follow_the_causal_window() {
        let window = FusedAttentionOptions {
            sliding_window: Some(2),
            ..FusedAttentionOptions::causal()
        };
        // Four queries over six keys: the queries are positions 2..6.
        assert_eq!(window.visible_keys(0, 4, 6), (1, 3));
        assert_eq!(window.visible_keys(3, 4, 6), (4, 6));
        assert_eq!(
            FusedAttentionOptions::causal().visible_keys(0, 4, 4),
            (0, 1)
        );
        assert_eq!(
            FusedAttentionOptions::default().visible_keys(0, 4, 4),
            (0, 4)
        );
    }

    #[test]
    fn shapes_that_do_not_fit_are_named() {
        let causal = FusedAttentionOptions::causal();
        let error = AttentionShape::of(&[1, 6, 4, 8], &[1, 4, 4, 8], &[1, 4, 4, 8], None, &causal)
            .unwrap_err();
        assert!(error.to_string().contains("6 query heads"), "{error}");
        let error = AttentionShape::of(&[1, 4, 6, 8], &[1, 2, 4, 8], &[1, 2, 4, 8], None, &causal)
            .unwrap_err();
        assert!(
            error.to_string().contains("6 queries over 4 keys"),
            "{error}"
        );
        let error = FusedAttentionOptions {
            sliding_window: Some(4),
            ..FusedAttentionOptions::default()
        }
        .check()
        .unwrap_err();
        assert!(error.to_string().contains("causal"), "{error}");
    }
}
