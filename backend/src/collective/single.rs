//! Collectives on single-device backends: every device is its own only replica, every group has
//! one member, and each collective returns its input. Models written with collectives thus run
//! unchanged on `NdArray` and `Flex`.

use burn_backend::tensor::{FloatTensor, IntTensor};
use burn_backend::{Backend, ExecutionError, TensorData, TensorMetadata};

use burn_ndarray::{
    FloatNdArrayElement, IntNdArrayElement, NdArray, NdArrayTensor, QuantElement, SharedArray,
};

use super::Collective;

/// The one replica's data of a single-device backend.
fn only_replica(mut data: Vec<TensorData>) -> TensorData {
    assert_eq!(
        data.len(),
        1,
        "a single device holds one replica, {} were given",
        data.len()
    );
    data.remove(0)
}

/// Checks that `collective` involves one replica per group and returns its inputs (zeros for a
/// permute that sends the one replica nothing).
fn identity<B: Backend>(
    collective: Collective,
    tensors: Vec<FloatTensor<B>>,
) -> Vec<FloatTensor<B>> {
    if let Collective::Permute { pairs } = &collective {
        if let Err(error) = pairs.check_within(1) {
            panic!(
                "{collective}: a single-device backend ({}) has one replica: {error}",
                B::name(&Default::default())
            );
        }
        if pairs.source_of(0).is_none() {
            return tensors
                .into_iter()
                .map(|tensor| {
                    let device = B::float_device(&tensor);
                    B::float_zeros(tensor.shape(), &device, tensor.dtype().into())
                })
                .collect();
        }
    }
    if let Some(groups) = collective.groups()
        && groups.replica_count() != 1
    {
        panic!(
            "{collective}: a single-device backend ({}) has one replica, the groups {groups} \
             name {}",
            B::name(&Default::default()),
            groups.replica_count()
        );
    }
    tensors
}

/// Implements `CollectiveBackend` for single-device backends.
macro_rules! single_device_collectives {
    ($(impl$(<$($generic:ident: $bound:path),*>)? for $backend:ty $(where $($bounded:ty: $constraint:path),*)?;)*) => {$(
        impl$(<$($generic: $bound),*>)? super::CollectiveBackend for $backend
        $(where $($bounded: $constraint),*)?
        {
            fn replica_count(_device: &Self::Device) -> usize {
                1
            }

            fn float_from_replicas(data: Vec<TensorData>, device: &Self::Device) -> FloatTensor<Self> {
                <Self as burn_backend::ops::FloatTensorOps<Self>>::float_from_data(only_replica(data), device)
            }

            fn int_from_replicas(data: Vec<TensorData>, device: &Self::Device) -> IntTensor<Self> {
                <Self as burn_backend::ops::IntTensorOps<Self>>::int_from_data(only_replica(data), device)
            }

            fn float_into_replicas(tensor: FloatTensor<Self>) -> Result<Vec<TensorData>, ExecutionError> {
                burn_backend::read_sync(<Self as burn_backend::ops::FloatTensorOps<Self>>::float_into_data(tensor))
                    .map(|data| vec![data])
            }

            fn float_into_local_replicas(tensor: FloatTensor<Self>, _count: usize) -> Result<(usize, Vec<TensorData>), ExecutionError> {
                Self::float_into_replicas(tensor).map(|data| (0, data))
            }

            fn collective(collective: Collective, tensors: Vec<FloatTensor<Self>>) -> Vec<FloatTensor<Self>> {
                identity::<Self>(collective, tensors)
            }
        }
    )*};
}

single_device_collectives! {
    impl<E: FloatNdArrayElement, I: IntNdArrayElement, Q: QuantElement> for NdArray<E, I, Q>
        where NdArrayTensor: From<SharedArray<E>>, NdArrayTensor: From<SharedArray<I>>;
    impl for burn_flex::Flex;
}
