// Burn 0.22.0-pre's pooling and interpolation signatures on the pinned Burn crates, for suite
// revisions that still call them (main before the options structs). `run` copies this file to
// the harness's tests/common/, declares it in tests/tensor.rs and tests/autodiff.rs, and points
// the copied tests' `burn_tensor::module::` imports of these functions here. Every other item of
// `burn_tensor::module` is re-exported unchanged (a local item shadows the glob).
#![allow(unused, clippy::too_many_arguments)]

pub mod module {
    pub use burn_tensor::module::*;

    use burn_tensor::ops::{AvgPoolOptions, InterpolateOptions, MaxPoolOptions};
    use burn_tensor::{Int, Tensor};

    pub fn max_pool1d(
        x: Tensor<3>,
        kernel_size: usize,
        stride: usize,
        padding: usize,
        dilation: usize,
        ceil_mode: bool,
    ) -> Tensor<3> {
        burn_tensor::module::max_pool1d(
            x,
            MaxPoolOptions::new([kernel_size])
                .with_stride([stride])
                .with_padding([padding])
                .with_dilation([dilation])
                .with_ceil_mode(ceil_mode),
        )
    }

    pub fn max_pool1d_with_indices(
        x: Tensor<3>,
        kernel_size: usize,
        stride: usize,
        padding: usize,
        dilation: usize,
        ceil_mode: bool,
    ) -> (Tensor<3>, Tensor<3, Int>) {
        burn_tensor::module::max_pool1d_with_indices(
            x,
            MaxPoolOptions::new([kernel_size])
                .with_stride([stride])
                .with_padding([padding])
                .with_dilation([dilation])
                .with_ceil_mode(ceil_mode),
        )
    }

    pub fn max_pool2d(
        x: Tensor<4>,
        kernel_size: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        ceil_mode: bool,
    ) -> Tensor<4> {
        burn_tensor::module::max_pool2d(
            x,
            MaxPoolOptions::new(kernel_size)
                .with_stride(stride)
                .with_padding(padding)
                .with_dilation(dilation)
                .with_ceil_mode(ceil_mode),
        )
    }

    pub fn max_pool2d_with_indices(
        x: Tensor<4>,
        kernel_size: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        ceil_mode: bool,
    ) -> (Tensor<4>, Tensor<4, Int>) {
        burn_tensor::module::max_pool2d_with_indices(
            x,
            MaxPoolOptions::new(kernel_size)
                .with_stride(stride)
                .with_padding(padding)
                .with_dilation(dilation)
                .with_ceil_mode(ceil_mode),
        )
    }

    pub fn avg_pool1d(
        x: Tensor<3>,
        kernel_size: usize,
        stride: usize,
        padding: usize,
        count_include_pad: bool,
        ceil_mode: bool,
    ) -> Tensor<3> {
        burn_tensor::module::avg_pool1d(
            x,
            AvgPoolOptions::new([kernel_size])
                .with_stride([stride])
                .with_padding([padding])
                .with_count_include_pad(count_include_pad)
                .with_ceil_mode(ceil_mode),
        )
    }

    pub fn avg_pool2d(
        x: Tensor<4>,
        kernel_size: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        count_include_pad: bool,
        ceil_mode: bool,
    ) -> Tensor<4> {
        burn_tensor::module::avg_pool2d(
            x,
            AvgPoolOptions::new(kernel_size)
                .with_stride(stride)
                .with_padding(padding)
                .with_count_include_pad(count_include_pad)
                .with_ceil_mode(ceil_mode),
        )
    }

    pub fn interpolate(
        x: Tensor<4>,
        output_size: [usize; 2],
        options: InterpolateOptions,
    ) -> Tensor<4> {
        burn_tensor::module::interpolate(x, options.with_output_size(output_size))
    }
}
