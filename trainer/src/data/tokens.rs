//! Token streams: documents' tokens, each document followed by EOS, one after another.

/// A read-only stream of tokens with random access, such as token shards or a vector.
pub trait TokenStream: Send + Sync {
    /// The number of tokens.
    fn num_tokens(&self) -> usize;

    /// Copies the tokens `start..start + out.len()` into `out`.
    ///
    /// # Panics
    /// When the range passes the end of the stream.
    fn copy_tokens(&self, start: usize, out: &mut [u32]);
}

impl TokenStream for Vec<u32> {
    fn num_tokens(&self) -> usize {
        self.len()
    }

    fn copy_tokens(&self, start: usize, out: &mut [u32]) {
        out.copy_from_slice(&self[start..start + out.len()]);
    }
}

/// Appends `document` and then `eos` to `stream`: the layout every token stream follows.
pub fn append_document(stream: &mut Vec<u32>, document: &[u32], eos: u32) {
    stream.extend_from_slice(document);
    stream.push(eos);
}
