//! Packing as HLAT does: documents, each followed by EOS, concatenated and cut into rows.
//!
//! A token stream (see [`TokenStream`]: every document already followed by EOS) is cut into
//! consecutive, non-overlapping rows of `seq_len + 1` tokens: row `i` is the tokens
//! `i * (seq_len + 1) .. (i + 1) * (seq_len + 1)`. A row's inputs are its first `seq_len` tokens
//! and its targets the last `seq_len`, so rows may start or end inside a document and a document
//! may span rows; attention is not masked at document boundaries (the EOS tells the model).
//!
//! **Tail policy:** the last `num_tokens % (seq_len + 1)` tokens, too few for a full row, are
//! dropped; [`PackedRows::dropped_tail_tokens`] reports how many, and the constructor logs it. No
//! row is padded, so no loss mask is needed.

use super::error::DataError;
use super::rows::RowSource;
use super::tokens::TokenStream;

/// The rows of a token stream.
pub struct PackedRows<T> {
    tokens: T,
    row_len: usize,
    num_rows: usize,
}

impl<T: TokenStream> PackedRows<T> {
    /// Cuts `tokens` into rows of `seq_len + 1` tokens. Fails when not even one row fits.
    pub fn new(tokens: T, seq_len: usize) -> Result<Self, DataError> {
        if seq_len == 0 {
            return Err(DataError::setting("sequence length", "0 tokens"));
        }
        let row_len = seq_len + 1;
        let num_rows = tokens.num_tokens() / row_len;
        if num_rows == 0 {
            return Err(DataError::EmptyInput(format!(
                "{} tokens are fewer than one row of {row_len} (sequence length {seq_len} plus one)",
                tokens.num_tokens()
            )));
        }
        let packed = Self {
            tokens,
            row_len,
            num_rows,
        };
        log::debug!(
            "packed {} tokens into {num_rows} rows of {row_len}, dropping a tail of {}",
            packed.tokens.num_tokens(),
            packed.dropped_tail_tokens()
        );
        Ok(packed)
    }

    /// The number of tokens at the end of the stream that fill no row and are never used.
    pub fn dropped_tail_tokens(&self) -> usize {
        self.tokens.num_tokens() - self.num_rows * self.row_len
    }

    /// The underlying token stream.
    pub fn tokens(&self) -> &T {
        &self.tokens
    }
}

impl<T: TokenStream> RowSource for PackedRows<T> {
    fn row_len(&self) -> usize {
        self.row_len
    }

    fn num_rows(&self) -> usize {
        self.num_rows
    }

    fn row(&self, index: usize) -> Vec<u32> {
        assert!(
            index < self.num_rows,
            "row {index} of {} rows",
            self.num_rows
        );
        let mut row = vec![0; self.row_len];
        self.tokens.copy_tokens(index * self.row_len, &mut row);
        row
    }
}
