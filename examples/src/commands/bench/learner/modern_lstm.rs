//! The network of Burn's `modern-lstm` example, built as the example builds it: stacked LSTM
//! cells with layer normalisation, written out step by step with Burn's tensor operations (no
//! fused LSTM), run in both directions, with dropout, and a linear head on the last step. Its
//! optimizer is Adam with gradients clipped to norm 1.
//!
//! Each training batch is a few thousand small operations (2 directions × 2 layers × 10 steps
//! of cells, their backward pass and Adam's update of 26 parameters): the shape of program where
//! a lazy backend's per-operation and per-program costs show.

use burn::grad_clipping::GradientClippingConfig;
use burn::module::{Module, Param};
use burn::nn::{
    Dropout, DropoutConfig, Initializer, LayerNorm, LayerNormConfig, Linear, LinearConfig,
    LstmState,
};
use burn::optim::AdamConfig;
use burn::tensor::activation::{sigmoid, tanh};
use burn::tensor::{Device, Tensor, s};
use burn::train::RegressionOutput;

use super::tasks::{SequenceBatch, regression, supervised_steps};

/// The width of each cell's hidden and cell states.
const HIDDEN: usize = 32;
/// Cells stacked in each direction.
const LAYERS: usize = 2;
/// The dropout probability (every layer but the last, and before the head).
const DROPOUT: f64 = 0.1;
/// The gradient norm Adam clips each parameter's gradient to.
const CLIP_NORM: f32 = 1.0;

/// Adam as the example configures it: gradients clipped to norm [`CLIP_NORM`].
pub fn optimizer() -> AdamConfig {
    AdamConfig::new().with_grad_clipping(Some(GradientClippingConfig::Norm(CLIP_NORM)))
}

/// One LSTM cell: the four gates projected from the input and from the previous hidden state,
/// the input's projection layer-normalised, and the new cell and hidden states normalised too.
#[derive(Module, Debug)]
pub struct NormalisedCell {
    input_gates: Linear,
    hidden_gates: Linear,
    gates_norm: LayerNorm,
    cell_norm: LayerNorm,
    hidden_norm: LayerNorm,
    dropout: Dropout,
}

impl NormalisedCell {
    /// A cell reading `input` features, Xavier-initialised, its forget gates' biases set to 1.
    fn new(input: usize, dropout: f64, device: &Device) -> Self {
        let gates = |input: usize| {
            let mut linear = LinearConfig::new(input, 4 * HIDDEN)
                .with_initializer(Initializer::XavierNormal { gain: 1.0 })
                .init(device);
            // The forget gate is the second quarter: a bias of 1 keeps state early in training.
            let forget_bias = linear
                .bias
                .as_ref()
                .expect("a linear layer has a bias by default")
                .val()
                .slice_assign(s![HIDDEN..2 * HIDDEN], Tensor::<1>::ones([HIDDEN], device))
                .detach()
                .require_grad();
            linear.bias = Some(Param::from_tensor(forget_bias));
            linear
        };
        Self {
            input_gates: gates(input),
            hidden_gates: gates(HIDDEN),
            gates_norm: LayerNormConfig::new(4 * HIDDEN).init(device),
            cell_norm: LayerNormConfig::new(HIDDEN).init(device),
            hidden_norm: LayerNormConfig::new(HIDDEN).init(device),
            dropout: DropoutConfig::new(dropout).init(),
        }
    }

    /// One step: `input` `[batch, features]` and the previous state to the next state.
    fn forward(&self, input: Tensor<2>, state: LstmState<2>) -> LstmState<2> {
        let gates = self.gates_norm.forward(self.input_gates.forward(input))
            + self.hidden_gates.forward(state.hidden);
        let [input_gate, forget_gate, candidate, output_gate] =
            <[Tensor<2>; 4]>::try_from(gates.chunk(4, 1)).expect("four gates");
        let cell = sigmoid(forget_gate) * state.cell + sigmoid(input_gate) * tanh(candidate);
        let cell = self.cell_norm.forward(cell);
        let hidden = self
            .hidden_norm
            .forward(sigmoid(output_gate) * tanh(cell.clone()));
        LstmState::new(cell, self.dropout.forward(hidden))
    }
}

/// Cells stacked over the steps of a sequence, from zero states.
#[derive(Module, Debug)]
pub struct StackedCells {
    layers: Vec<NormalisedCell>,
}

impl StackedCells {
    fn new(device: &Device) -> Self {
        let layers = (0..LAYERS)
            .map(|layer| {
                let input = if layer == 0 { 1 } else { HIDDEN };
                // No dropout after the last layer.
                let dropout = if layer + 1 < LAYERS { DROPOUT } else { 0.0 };
                NormalisedCell::new(input, dropout, device)
            })
            .collect();
        Self { layers }
    }

    /// The last layer's hidden state at each step of `sequences` `[batch, steps, 1]`:
    /// `[batch, steps, HIDDEN]`.
    fn forward(&self, sequences: Tensor<3>) -> Tensor<3> {
        let [batch, steps, _] = sequences.dims();
        let device = sequences.device();
        let mut states: Vec<LstmState<2>> = self
            .layers
            .iter()
            .map(|_| LstmState::initial([batch, HIDDEN], &device))
            .collect();
        let outputs = (0..steps)
            .map(|step| {
                let mut input = sequences
                    .clone()
                    .slice(s![.., step..step + 1, ..])
                    .squeeze_dim::<2>(1);
                for (cell, state) in self.layers.iter().zip(&mut states) {
                    let previous = LstmState::new(state.cell.clone(), state.hidden.clone());
                    *state = cell.forward(input, previous);
                    input = state.hidden.clone();
                }
                input
            })
            .collect();
        Tensor::stack(outputs, 1)
    }
}

/// The example's network: stacked cells forwards and over the reversed sequence, their outputs
/// joined, dropout, and a linear head on the last step.
#[derive(Module, Debug)]
pub struct ModernLstm {
    forwards: StackedCells,
    backwards: StackedCells,
    dropout: Dropout,
    head: Linear,
}

impl ModernLstm {
    /// The network with the example's initialisation on `device`.
    pub fn new(device: &Device) -> Self {
        Self {
            forwards: StackedCells::new(device),
            backwards: StackedCells::new(device),
            dropout: DropoutConfig::new(DROPOUT).init(),
            head: LinearConfig::new(2 * HIDDEN, 1).init(device),
        }
    }

    /// The prediction for each sequence and the mean squared error against the targets.
    pub fn forward_regression(&self, batch: SequenceBatch) -> RegressionOutput {
        let sequences = batch.sequences;
        let forwards = self.forwards.forward(sequences.clone());
        let backwards = self.backwards.forward(sequences.flip([1])).flip([1]);
        let joined = self
            .dropout
            .forward(Tensor::cat(vec![forwards, backwards], 2));
        let output = self
            .head
            .forward(joined.slice_dim(1, -1).squeeze_dim::<2>(1));
        regression(output, batch.targets)
    }
}

supervised_steps!(
    ModernLstm,
    SequenceBatch,
    RegressionOutput,
    forward_regression
);
