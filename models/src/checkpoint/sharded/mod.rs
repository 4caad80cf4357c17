//! Sharded checkpoints, as NeuronX Distributed saves them: one burnpack file per tensor-parallel
//! rank, or per pipeline stage × tensor-parallel rank.
//!
//! ```text
//! DIR/config.json               the whole model's configuration
//! DIR/tensor_parallel.json      {"degree": N}
//! DIR/model-rank-00-of-NN.bpk   rank 0's shard: each parameter named as in the whole model,
//! ...                           split parameters holding the rank's slice (see
//! DIR/model-rank-NN-of-NN.bpk   `parallel::placement`), replicated ones whole
//! DIR/tokenizer.json            optional
//! ```
//!
//! When the degree exceeds `num_kv_heads`, each KV head is held by `degree / num_kv_heads`
//! consecutive ranks ([`crate::parallel::kv_copies`]) and every rank file holds what its rank
//! holds: its head's columns of `k_proj` and `v_proj` (and their biases), so the holders of one
//! head write the same values. Loading takes each head from its first holder and checks that
//! the other holders agree bit for bit; the joined model is the ordinary one.
//!
//! A model cut into pipeline stages (and possibly split by tensor-parallel rank inside each)
//! is one file per stage and rank:
//!
//! ```text
//! DIR/config.json                               the whole model's configuration
//! DIR/pipeline_parallel.json                    {"stages": 2, "tensor_parallel": 2,
//!                                                "stage_layers": [[0, 1, 2], [3, 4]]}
//! DIR/model-stage-00-of-02-rank-00-of-02.bpk    stage 0, rank 0: `embed_tokens`, layers 0-2
//! DIR/model-stage-00-of-02-rank-01-of-02.bpk    stage 0, rank 1
//! DIR/model-stage-01-of-02-rank-00-of-02.bpk    stage 1, rank 0: layers 3-4, `norm`, `lm_head`
//! DIR/model-stage-01-of-02-rank-01-of-02.bpk    stage 1, rank 1
//! ```
//!
//! A stage's files hold its real layers under their names in the whole model (`layers.3.…`,
//! not the stage's slots; padding slots are not written) and the shared tensors the stage uses:
//! the embedding in the first stage, the final norm and the LM head in the last (a tied
//! embedding in both, identical). Inside a stage, tensors are split by rank as above.
//!
//! A training run writes each shard straight from the replica that holds it ([`read_ranks`],
//! [`read_stages`]); `hlat convert` splits a whole model on the host ([`save_split`],
//! [`save_stages`]); loading joins the shards on the host ([`read_joined`]), so a checkpoint of
//! any layout opens as the whole model and resumes under any layout. Splitting and joining copy
//! bytes, so split → join is bit-exact.

mod join;
mod layout;
mod replicas;
mod slices;
mod write;

pub use join::read_joined;
pub use layout::{ShardLayout, StageLayout};
pub use replicas::{read_ranks, read_stages, stage_replicas};
pub use write::{RankShards, save_split, save_stages};
