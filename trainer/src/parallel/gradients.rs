//! Averaging gradients over data-parallel replicas: every gradient flattened into buckets, one
//! all-reduce per bucket, then cut back into the parameters' shapes (as PyTorch DDP buckets them).

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use burn_trainium::collective::{self, ReduceOp, ReplicaGroups};
use hlat::parallel::{ParamPath, PathVisitor, Placement, kv_copy_groups, visit_with_paths};

use crate::clip::kv_copies_of;

/// The most gradient bytes one all-reduce carries (PyTorch DDP's default bucket is 25 MiB).
pub const BUCKET_BYTES: usize = 25 * 1024 * 1024;

/// Replaces every gradient of `module` by its mean over `groups`, bucketed: one all-reduce per
/// [`BUCKET_BYTES`] of gradients.
pub fn average_gradients<M: Module>(
    module: &M,
    grads: &mut GradientsParams,
    groups: &ReplicaGroups,
) {
    let mut flatten = Flatten {
        grads,
        buckets: Vec::new(),
        bucket_bytes: 0,
    };
    module.visit(&mut flatten);
    let buckets = flatten.buckets;
    let mut restore = Restore {
        grads,
        buckets: buckets
            .into_iter()
            .map(|bucket| {
                let sizes = bucket
                    .iter()
                    .map(|grad| grad.shape().num_elements())
                    .collect();
                let averaged =
                    collective::all_reduce(Tensor::cat(bucket, 0), ReduceOp::Mean, groups);
                (averaged, sizes)
            })
            .collect::<Vec<_>>()
            .into_iter(),
        current: None,
    };
    module.visit(&mut restore);
}

/// Takes every gradient out of `grads`, flattened, into buckets of one dtype.
struct Flatten<'a> {
    grads: &'a mut GradientsParams,
    buckets: Vec<Vec<Tensor<1>>>,
    bucket_bytes: usize,
}

impl ModuleVisitor for Flatten<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let Some(grad) = self.grads.get::<D>(param.id) else {
            return;
        };
        let bytes = grad.shape().num_elements() * grad.dtype().size();
        let same_dtype = self
            .buckets
            .last()
            .and_then(|bucket| bucket.first())
            .is_some_and(|first| first.dtype() == grad.dtype());
        if !same_dtype || self.bucket_bytes + bytes > BUCKET_BYTES {
            self.buckets.push(Vec::new());
            self.bucket_bytes = 0;
        }
        self.bucket_bytes += bytes;
        let flat = grad.reshape([-1]);
        self.buckets
            .last_mut()
            .expect("a bucket was opened")
            .push(flat);
    }
}

/// An averaged bucket, the sizes of the gradients still to take from it, and where the next
/// one starts.
struct OpenBucket {
    values: Tensor<1>,
    sizes: std::vec::IntoIter<usize>,
    offset: usize,
}

/// Puts the averaged buckets back, in the order [`Flatten`] took the gradients out.
struct Restore<'a> {
    grads: &'a mut GradientsParams,
    buckets: std::vec::IntoIter<(Tensor<1>, Vec<usize>)>,
    current: Option<OpenBucket>,
}

impl ModuleVisitor for Restore<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let Some(grad) = self.grads.remove::<D>(param.id) else {
            return;
        };
        let mut next = self
            .current
            .as_mut()
            .and_then(|bucket| bucket.sizes.next().map(|size| (bucket, size)));
        if next.is_none() {
            let (values, sizes) = self.buckets.next().expect("a bucket per gradient");
            self.current = Some(OpenBucket {
                values,
                sizes: sizes.into_iter(),
                offset: 0,
            });
            next = self
                .current
                .as_mut()
                .and_then(|bucket| bucket.sizes.next().map(|size| (bucket, size)));
        }
        let (bucket, size) = next.expect("a bucket holds at least one gradient");
        let averaged: Tensor<D> = bucket
            .values
            .clone()
            .narrow(0, bucket.offset, size)
            .reshape(grad.shape());
        bucket.offset += size;
        self.grads.register(param.id, averaged);
    }
}

/// Sums over `groups` the gradients of the parameters every tensor-parallel rank holds whole but
/// computes only a part of the gradient of ([`hlat::parallel::partial_gradient`]): the per-head
/// query/key norms, and under `sequence_parallel` every whole parameter (each rank saw only its
/// slice of the sequence). When the tensor-parallel degree exceeds `num_kv_heads`, each KV head
/// is held by several consecutive ranks ([`kv_copies_of`]), each of which computed the part of
/// its gradient from its own query heads: those are summed over the ranks holding the head
/// ([`kv_copy_groups`]), so that the copies stay the same after the optimizer step.
pub fn reduce_replicated_gradients<M: Module + 'static>(
    module: &M,
    grads: &mut GradientsParams,
    groups: &ReplicaGroups,
    sequence_parallel: bool,
) {
    struct Reduce<'a> {
        grads: &'a mut GradientsParams,
        groups: &'a ReplicaGroups,
        /// The ranks holding the same KV head, when several do.
        copy_groups: Option<ReplicaGroups>,
        sequence_parallel: bool,
    }
    impl PathVisitor for Reduce<'_> {
        fn visit_float<const D: usize>(&mut self, path: &ParamPath, param: &Param<Tensor<D>>) {
            let groups = match (path.placement(), &self.copy_groups) {
                (Placement::ReplicatedHeads { .. }, Some(copy_groups)) => copy_groups,
                _ if path.partial_gradient(self.sequence_parallel) => self.groups,
                _ => return,
            };
            if let Some(grad) = self.grads.remove::<D>(param.id) {
                let summed = collective::all_reduce(grad, ReduceOp::Sum, groups);
                self.grads.register(param.id, summed);
            }
        }
    }
    let copies = kv_copies_of(module, groups.group_size());
    let mut reduce = Reduce {
        grads,
        groups,
        copy_groups: (copies > 1).then(|| kv_copy_groups(groups, copies)),
        sequence_parallel,
    };
    visit_with_paths(module, ParamPath::with_kv_copies(copies), &mut reduce);
}

/// Moves the gradients of the parameters of `module` whose path `moves` from `from` to `to`.
pub(crate) fn move_gradients_where<M: Module>(
    module: &M,
    from: &mut GradientsParams,
    to: &mut GradientsParams,
    moves: fn(&[String]) -> bool,
) {
    struct Move<'a> {
        from: &'a mut GradientsParams,
        to: &'a mut GradientsParams,
        moves: fn(&[String]) -> bool,
    }
    impl hlat::parallel::PathVisitor for Move<'_> {
        fn visit_float<const D: usize>(
            &mut self,
            path: &hlat::parallel::ParamPath,
            param: &Param<Tensor<D>>,
        ) {
            if (self.moves)(path.names())
                && let Some(grad) = self.from.remove::<D>(param.id)
            {
                self.to.register(param.id, grad);
            }
        }
    }
    let mut moving = Move { from, to, moves };
    hlat::parallel::visit_with_paths(module, hlat::parallel::ParamPath::default(), &mut moving);
}
