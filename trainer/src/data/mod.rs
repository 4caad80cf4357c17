//! The data pipeline: tokenizers, token shards, packing, mixing and resumable sampling.
