//! Row sources: training examples of a fixed number of tokens.

/// Rows of `row_len()` tokens (`seq_len + 1`: the inputs are `row[..seq_len]` and the targets
/// `row[1..]`), with random access.
pub trait RowSource: Send + Sync {
    /// The number of tokens in every row: the sequence length plus one.
    fn row_len(&self) -> usize;

    /// The number of rows.
    fn num_rows(&self) -> usize;

    /// The row at `index` (`index < num_rows()`).
    fn row(&self, index: usize) -> Vec<u32>;
}

/// Rows behind a smart pointer are rows: `Box<dyn RowSource>` owns a source,
/// `Arc<dyn RowSource>` shares one between data loaders.
macro_rules! forward_row_source {
    ($($pointer:ty),*) => {$(
        impl<R: RowSource + ?Sized> RowSource for $pointer {
            fn row_len(&self) -> usize {
                (**self).row_len()
            }

            fn num_rows(&self) -> usize {
                (**self).num_rows()
            }

            fn row(&self, index: usize) -> Vec<u32> {
                (**self).row(index)
            }
        }
    )*};
}

forward_row_source!(Box<R>, std::sync::Arc<R>);

/// Splits a row into the model's inputs (`row[..seq_len]`) and targets (`row[1..]`).
pub fn inputs_and_targets(row: &[u32]) -> (&[u32], &[u32]) {
    (&row[..row.len() - 1], &row[1..])
}
