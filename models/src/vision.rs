//! A small convolutional network in the style of Burn's MNIST example (conv2d → ReLU → max-pool
//! → conv2d → ReLU → adaptive average pool → linear), with deterministic generated images: the
//! project's check and benchmark of Burn's vision operations on a compiled device (the same model
//! runs in PyTorch for `hlat bench cnn`).

use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::pool::{AdaptiveAvgPool2d, AdaptiveAvgPool2dConfig, MaxPool2d, MaxPool2dConfig};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::tensor::{Device, Int, Tensor, TensorData};

use crate::rng::SplitMix64;

/// Side of the square grey images.
pub const IMAGE_SIZE: usize = 28;
/// Classes the network tells apart.
pub const CLASSES: usize = 10;
/// Channels of the first and second convolutions.
const CHANNELS: [usize; 2] = [8, 16];
/// The adaptive pool's output side.
const POOLED: usize = 4;

/// The network.
#[derive(Module, Debug)]
pub struct SmallCnn {
    conv1: Conv2d,
    pool: MaxPool2d,
    conv2: Conv2d,
    adaptive: AdaptiveAvgPool2d,
    head: Linear,
    activation: Relu,
}

impl SmallCnn {
    /// A network with Burn's default initialisation on `device`.
    pub fn new(device: &Device) -> Self {
        let [first, second] = CHANNELS;
        Self {
            conv1: Conv2dConfig::new([1, first], [3, 3]).init(device),
            pool: MaxPool2dConfig::new([2, 2]).with_strides([2, 2]).init(),
            conv2: Conv2dConfig::new([first, second], [3, 3]).init(device),
            adaptive: AdaptiveAvgPool2dConfig::new([POOLED, POOLED]).init(),
            head: LinearConfig::new(second * POOLED * POOLED, CLASSES).init(device),
            activation: Relu::new(),
        }
    }

    /// Images `[batch, 1, 28, 28]` to class logits `[batch, 10]`.
    pub fn forward(&self, images: Tensor<4>) -> Tensor<2> {
        let x = self.activation.forward(self.conv1.forward(images));
        let x = self.pool.forward(x);
        let x = self.activation.forward(self.conv2.forward(x));
        let x = self.adaptive.forward(x);
        self.head.forward(x.flatten(1, 3))
    }

    /// The mean cross-entropy of the logits of `images` against `labels`.
    pub fn loss(&self, images: Tensor<4>, labels: Tensor<1, Int>) -> Tensor<1> {
        let logits = self.forward(images);
        CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits, labels)
    }
}

/// `count` deterministic generated images in `[0, 1)` (a bright square on noise, its position
/// telling the class), row by row one after the other, and their labels, drawn from the
/// project's SplitMix64 with `seed`: the same for every backend and run.
pub fn generated_images(count: usize, seed: u64) -> (Vec<f32>, Vec<i64>) {
    let mut rng = SplitMix64::new(seed);
    let mut pixels = Vec::with_capacity(count * IMAGE_SIZE * IMAGE_SIZE);
    let mut labels = Vec::with_capacity(count);
    for _ in 0..count {
        let label = rng.below(CLASSES as u64) as usize;
        let (row, column) = (2 + 2 * (label / 5) * 6, 2 + (label % 5) * 5);
        for y in 0..IMAGE_SIZE {
            for x in 0..IMAGE_SIZE {
                let noise = rng.below(256) as f32 / 1024.0;
                let inside = (row..row + 6).contains(&y) && (column..column + 5).contains(&x);
                pixels.push(if inside { 0.75 + noise } else { noise });
            }
        }
        labels.push(label as i64);
    }
    (pixels, labels)
}

/// A batch of `batch` [`generated_images`] drawn with `seed`, as tensors on `device`: images
/// `[batch, 1, 28, 28]` and labels `[batch]`.
pub fn generated_batch(batch: usize, seed: u64, device: &Device) -> (Tensor<4>, Tensor<1, Int>) {
    let (pixels, labels) = generated_images(batch, seed);
    let images = Tensor::from_data(
        TensorData::new(pixels, [batch, 1, IMAGE_SIZE, IMAGE_SIZE]),
        device,
    );
    let labels = Tensor::from_data(TensorData::new(labels, [batch]), device);
    (images, labels)
}
