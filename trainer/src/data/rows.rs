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

impl<R: RowSource + ?Sized> RowSource for Box<R> {
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

/// Splits a row into the model's inputs (`row[..seq_len]`) and targets (`row[1..]`).
pub fn inputs_and_targets(row: &[u32]) -> (&[u32], &[u32]) {
    (&row[..row.len() - 1], &row[1..])
}
