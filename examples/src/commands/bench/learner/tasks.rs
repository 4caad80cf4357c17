//! The two tasks of `hlat bench learner`, written as Burn's own examples write them: a dataset of
//! items, a batcher that makes one tensor per item and stacks them, and a model implementing
//! burn-train's `TrainStep` and `InferenceStep` with Burn's output types, so Burn's loss and
//! accuracy metrics read them.
//!
//! - **Recurrent** (Burn's `modern-lstm` example): sequences where each value is the sum of the
//!   two before it plus noise; an LSTM and a linear head predict the next value (mean squared
//!   error, [`RegressionOutput`]).
//! - **CNN** (Burn's MNIST example): [`SmallCnn`] on generated 28×28 images, ten classes
//!   (cross-entropy, [`ClassificationOutput`], loss and accuracy).

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::module::Module;
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Linear, LinearConfig, Lstm, LstmConfig};
use burn::tensor::{Device, Int, Tensor, TensorData};
use burn::train::{ClassificationOutput, RegressionOutput};
use hlat::rng::SplitMix64;
use hlat::vision::{IMAGE_SIZE, SmallCnn, generated_images};

/// Values per recurrent sequence (the target is the value after them).
pub const SEQUENCE_LENGTH: usize = 10;
/// The width of the recurrent model's LSTM state.
const HIDDEN: usize = 32;
/// The standard deviation of the noise added to each value of a sequence.
const NOISE: f64 = 0.1;

/// One recurrent example: a sequence and the value that follows it.
#[derive(Debug, Clone)]
pub struct SequenceItem {
    /// The sequence's values.
    pub sequence: Vec<f32>,
    /// The value after them.
    pub target: f32,
}

/// `count` sequences drawn from `seed`: two values in [0, 1), then each the sum of the two before
/// it plus uniform noise of standard deviation [`NOISE`].
pub fn sequences(count: usize, seed: u64) -> InMemDataset<SequenceItem> {
    let mut rng = SplitMix64::new(seed);
    // Uniform on [-a, a) has standard deviation a / sqrt(3).
    let amplitude = NOISE * 3f64.sqrt();
    let items = (0..count)
        .map(|_| {
            let mut values = vec![rng.unit(), rng.unit()];
            while values.len() <= SEQUENCE_LENGTH {
                let [before, last] = [values[values.len() - 2], values[values.len() - 1]];
                values.push(before + last + (2.0 * rng.unit() - 1.0) * amplitude);
            }
            let target = values.pop().expect("the sequence is not empty") as f32;
            SequenceItem {
                sequence: values.into_iter().map(|value| value as f32).collect(),
                target,
            }
        })
        .collect();
    InMemDataset::new(items)
}

/// A batch of sequences: `[batch, SEQUENCE_LENGTH, 1]` and the targets `[batch, 1]`.
#[derive(Debug, Clone)]
pub struct SequenceBatch {
    /// The sequences, one feature per step.
    pub sequences: Tensor<3>,
    /// The value after each sequence.
    pub targets: Tensor<2>,
}

/// Batches sequences as `modern-lstm` does: a tensor per item, stacked.
#[derive(Debug, Clone, Copy, Default)]
pub struct SequenceBatcher;

impl Batcher<SequenceItem, SequenceBatch> for SequenceBatcher {
    fn batch(&self, items: Vec<SequenceItem>, device: &Device) -> SequenceBatch {
        let sequences = items
            .iter()
            .map(|item| {
                Tensor::<1>::from_floats(item.sequence.as_slice(), device).unsqueeze_dim::<2>(1)
            })
            .collect();
        let targets = items
            .iter()
            .map(|item| Tensor::<1>::from_floats([item.target], device))
            .collect();
        SequenceBatch {
            sequences: Tensor::stack(sequences, 0),
            targets: Tensor::stack(targets, 0),
        }
    }
}

/// The loss of a batch, as a loop written by hand computes it.
pub trait BatchLoss<B> {
    /// The batch's mean loss.
    fn batch_loss(&self, batch: B) -> Tensor<1>;
}

/// burn-train's `TrainStep` and `InferenceStep` and the hand-written loop's [`BatchLoss`] for
/// `$model`, whose `$forward(batch: $batch) -> $output` computes a batch's output with its loss:
/// training backpropagates the loss, inference and the hand-written loop take the output.
macro_rules! supervised_steps {
    ($model:ty, $batch:ty, $output:ty, $forward:ident) => {
        impl $crate::commands::bench::learner::tasks::BatchLoss<$batch> for $model {
            fn batch_loss(&self, batch: $batch) -> burn::tensor::Tensor<1> {
                self.$forward(batch).loss
            }
        }

        impl burn::train::TrainStep for $model {
            type Input = $batch;
            type Output = $output;

            fn step(&self, batch: $batch) -> burn::train::TrainOutput<$output> {
                let item = self.$forward(batch);
                burn::train::TrainOutput::new(self, item.loss.backward(), item)
            }
        }

        impl burn::train::InferenceStep for $model {
            type Input = $batch;
            type Output = $output;

            fn step(&self, batch: $batch) -> $output {
                self.$forward(batch)
            }
        }
    };
}
pub(super) use supervised_steps;

/// The mean squared error of `output` against `targets`, with both, as Burn's loss metric reads
/// a regression.
pub fn regression(output: Tensor<2>, targets: Tensor<2>) -> RegressionOutput {
    let loss = MseLoss::new().forward(output.clone(), targets.clone(), Reduction::Mean);
    RegressionOutput::new(loss, output, targets)
}

/// The recurrent model: an LSTM over the sequence, a linear head on its last hidden state.
#[derive(Module, Debug)]
pub struct SequenceRegressor {
    lstm: Lstm,
    head: Linear,
}

impl SequenceRegressor {
    /// A model with Burn's default initialisation on `device`.
    pub fn new(device: &Device) -> Self {
        Self {
            lstm: LstmConfig::new(1, HIDDEN, true).init(device),
            head: LinearConfig::new(HIDDEN, 1).init(device),
        }
    }

    /// The prediction for each sequence and the mean squared error against the targets.
    pub fn forward_regression(&self, batch: SequenceBatch) -> RegressionOutput {
        let (_, state) = self.lstm.forward(batch.sequences, None);
        regression(self.head.forward(state.hidden), batch.targets)
    }
}

supervised_steps!(
    SequenceRegressor,
    SequenceBatch,
    RegressionOutput,
    forward_regression
);

/// One image example: its grey pixels, row by row, and its class.
#[derive(Debug, Clone)]
pub struct ImageItem {
    /// `IMAGE_SIZE × IMAGE_SIZE` values in [0, 1).
    pub pixels: Vec<f32>,
    /// The class, below [`hlat::vision::CLASSES`].
    pub label: i64,
}

/// `count` generated images drawn from `seed` ([`generated_images`]).
pub fn images(count: usize, seed: u64) -> InMemDataset<ImageItem> {
    let (pixels, labels) = generated_images(count, seed);
    let items = pixels
        .chunks(IMAGE_SIZE * IMAGE_SIZE)
        .zip(labels)
        .map(|(pixels, label)| ImageItem {
            pixels: pixels.to_vec(),
            label,
        })
        .collect();
    InMemDataset::new(items)
}

/// A batch of images `[batch, 1, 28, 28]` and their classes `[batch]`.
#[derive(Debug, Clone)]
pub struct ImageBatch {
    /// The images, normalised.
    pub images: Tensor<4>,
    /// Their classes.
    pub labels: Tensor<1, Int>,
}

/// The mean and standard deviation the MNIST example normalises with.
const NORMALISATION: (f64, f64) = (0.1307, 0.3081);

/// Batches images as Burn's MNIST example does: a tensor per image, reshaped and normalised,
/// then concatenated.
#[derive(Debug, Clone, Copy, Default)]
pub struct ImageBatcher;

impl Batcher<ImageItem, ImageBatch> for ImageBatcher {
    fn batch(&self, items: Vec<ImageItem>, device: &Device) -> ImageBatch {
        let (mean, deviation) = NORMALISATION;
        let images = items
            .iter()
            .map(|item| {
                let image = Tensor::<2>::from_data(
                    TensorData::new(item.pixels.clone(), [IMAGE_SIZE, IMAGE_SIZE]),
                    device,
                );
                (image.reshape([1, 1, IMAGE_SIZE, IMAGE_SIZE]) - mean) / deviation
            })
            .collect();
        let labels = items
            .iter()
            .map(|item| Tensor::<1, Int>::from_data(TensorData::from([item.label]), device))
            .collect();
        ImageBatch {
            images: Tensor::cat(images, 0),
            labels: Tensor::cat(labels, 0),
        }
    }
}

/// The CNN task's model: [`SmallCnn`] with burn-train's steps.
#[derive(Module, Debug)]
pub struct ImageClassifier {
    network: SmallCnn,
}

impl ImageClassifier {
    /// A model with Burn's default initialisation on `device`.
    pub fn new(device: &Device) -> Self {
        Self {
            network: SmallCnn::new(device),
        }
    }

    /// The logits of each image and the mean cross-entropy against the labels.
    pub fn forward_classification(&self, batch: ImageBatch) -> ClassificationOutput {
        let logits = self.network.forward(batch.images);
        let loss = burn::nn::loss::CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits.clone(), batch.labels.clone());
        ClassificationOutput::new(loss, logits, batch.labels)
    }
}

supervised_steps!(
    ImageClassifier,
    ImageBatch,
    ClassificationOutput,
    forward_classification
);
