//! An HLAT-like training step for the `neuron_operator*` tests, and a scan of the HLO modules it
//! leaves in the NEFF cache against the published operator list.
//!
//! The step is a tiny LLaMA-style decoder built from burn-nn (the `hlat` crate is not a
//! dependency of the backend): token embedding, RMSNorm, causal self-attention with RoPE,
//! SwiGLU feed-forward, untied output head, cross-entropy, backward, and AdamW with HLAT's
//! hyper-parameters.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use burn::backend::Autodiff;
use burn::module::Module;
use burn::nn::attention::generate_autoregressive_mask;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{
    Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig, RotaryEncoding,
    RotaryEncodingConfig,
};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::prelude::Backend;
use burn::tensor::activation::{silu, softmax};
use burn::tensor::{Int, Tensor, TensorData};
use burn_trainium::hlo::{HloInstructionProto, HloModuleProto};
use burn_trainium::{Trainium, TrainiumDevice};
use prost::Message;

use super::cached_modules;

type B = Autodiff<Trainium>;

const VOCAB: usize = 32;
const HIDDEN: usize = 16;
const HEADS: usize = 2;
const FFN: usize = 24;
const BATCH: usize = 2;
const SEQUENCE: usize = 8;

/// The published list: documented name | HLO opcodes | restriction.
const SUPPORTED_OPERATORS: &str = include_str!("../../src/neuron/supported_operators.txt");

/// Reductions the list allows in `reduce` ("Min, Max, Add and Mul are the only supported
/// computations").
const REDUCE_COMPUTATIONS: [&str; 4] = ["add", "maximum", "minimum", "multiply"];

/// Every HLO opcode of the published list.
pub fn supported_opcodes() -> BTreeSet<String> {
    SUPPORTED_OPERATORS
        .lines()
        .filter(|line| !line.trim_start().starts_with('#') && !line.trim().is_empty())
        .flat_map(|line| {
            let opcodes = line
                .split('|')
                .nth(1)
                .unwrap_or_else(|| panic!("malformed line `{line}`"));
            opcodes
                .split(',')
                .map(|opcode| opcode.trim().to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[derive(Module, Debug)]
struct TinyDecoder<B: Backend> {
    embedding: Embedding<B>,
    attention_norm: RmsNorm<B>,
    query: Linear<B>,
    key: Linear<B>,
    value: Linear<B>,
    attention_output: Linear<B>,
    ffn_norm: RmsNorm<B>,
    gate: Linear<B>,
    up: Linear<B>,
    down: Linear<B>,
    final_norm: RmsNorm<B>,
    output: Linear<B>,
    rotary: RotaryEncoding<B>,
}

impl<B: Backend> TinyDecoder<B> {
    fn new(device: &B::Device) -> Self {
        let linear = |input, output| {
            LinearConfig::new(input, output)
                .with_bias(false)
                .init(device)
        };
        let norm = || RmsNormConfig::new(HIDDEN).with_epsilon(1e-5).init(device);
        Self {
            embedding: EmbeddingConfig::new(VOCAB, HIDDEN).init(device),
            attention_norm: norm(),
            query: linear(HIDDEN, HIDDEN),
            key: linear(HIDDEN, HIDDEN),
            value: linear(HIDDEN, HIDDEN),
            attention_output: linear(HIDDEN, HIDDEN),
            ffn_norm: norm(),
            gate: linear(HIDDEN, FFN),
            up: linear(HIDDEN, FFN),
            down: linear(FFN, HIDDEN),
            final_norm: norm(),
            output: linear(HIDDEN, VOCAB),
            rotary: RotaryEncodingConfig::new(SEQUENCE, HIDDEN / HEADS)
                .with_theta(10_000.0)
                .init(device),
        }
    }

    fn heads(&self, x: Tensor<B, 3>) -> Tensor<B, 4> {
        x.reshape([BATCH, SEQUENCE, HEADS, HIDDEN / HEADS])
            .swap_dims(1, 2)
    }

    fn loss(&self, tokens: Tensor<B, 2, Int>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
        let device = tokens.device();
        let x = self.embedding.forward(tokens);
        let h = self.attention_norm.forward(x.clone());
        let q = self
            .rotary
            .forward(self.heads(self.query.forward(h.clone())));
        let k = self.rotary.forward(self.heads(self.key.forward(h.clone())));
        let v = self.heads(self.value.forward(h));
        let scores = q.matmul(k.swap_dims(2, 3)) / ((HIDDEN / HEADS) as f64).sqrt();
        let mask = generate_autoregressive_mask::<B>(BATCH, SEQUENCE, &device)
            .unsqueeze_dim::<4>(1)
            .repeat_dim(1, HEADS);
        let attention = softmax(scores.mask_fill(mask, f32::NEG_INFINITY), 3).matmul(v);
        let attention = attention.swap_dims(1, 2).reshape([BATCH, SEQUENCE, HIDDEN]);
        let x = x + self.attention_output.forward(attention);
        let h = self.ffn_norm.forward(x.clone());
        let x = x + self
            .down
            .forward(silu(self.gate.forward(h.clone())) * self.up.forward(h));
        let logits = self.output.forward(self.final_norm.forward(x));
        CrossEntropyLossConfig::new().init(&device).forward(
            logits.reshape([BATCH * SEQUENCE, VOCAB]),
            targets.reshape([BATCH * SEQUENCE]),
        )
    }
}

/// Two training steps on `device`, as HLAT trains (AdamW 0.9/0.95, eps 1e-8, weight decay 0.1).
pub fn train(device: &TrainiumDevice) {
    B::seed(&TrainiumDevice::HOST, 11);
    let mut model = TinyDecoder::<B>::new(&TrainiumDevice::HOST).to_device(device);
    let tokens: Vec<i64> = (0..BATCH * SEQUENCE)
        .map(|i| (i * 7 % VOCAB) as i64)
        .collect();
    let targets: Vec<i64> = (0..BATCH * SEQUENCE)
        .map(|i| ((i * 7 + 3) % VOCAB) as i64)
        .collect();
    let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(tokens, [BATCH, SEQUENCE]), device);
    let targets =
        Tensor::<B, 2, Int>::from_data(TensorData::new(targets, [BATCH, SEQUENCE]), device);
    let mut optimizer = AdamWConfig::new()
        .with_beta_1(0.9)
        .with_beta_2(0.95)
        .with_epsilon(1e-8)
        .with_weight_decay(0.1)
        .init::<B, TinyDecoder<B>>();
    for _ in 0..2 {
        let loss = model.loss(tokens.clone(), targets.clone());
        loss.clone().into_data();
        let gradients = GradientsParams::from_grads(loss.backward(), &model);
        model = optimizer.step(3e-4, model, gradients);
    }
    model.output.weight.val().into_data();
}

/// The instruction an operand's value comes from, looking through shape-only operations.
fn exponent_origin(by_id: &HashMap<i64, &HloInstructionProto>, mut id: i64) -> String {
    loop {
        let Some(instruction) = by_id.get(&id) else {
            return "?".to_string();
        };
        match instruction.opcode.as_str() {
            "broadcast" | "reshape" | "convert" | "slice" | "transpose" => {
                id = instruction.operand_ids[0]
            }
            other => return other.to_string(),
        }
    }
}

/// What the modules under a cache root use, and where they break the published list.
#[derive(Debug, Default)]
pub struct ModuleScan {
    /// How many modules were read.
    pub modules: usize,
    /// How often each opcode appears.
    pub used: BTreeMap<String, usize>,
    /// Opcodes outside the list, with their module.
    pub unsupported: Vec<String>,
    /// `reduce` instructions whose computation is not add, max, min or multiply.
    pub unsupported_reductions: Vec<String>,
    /// `power` instructions whose exponent is not a compile-time constant.
    pub runtime_exponents: Vec<String>,
}

/// Reads every cached module under `root` and checks it against the published list.
pub fn scan_modules(root: &Path) -> ModuleScan {
    let supported = supported_opcodes();
    let mut scan = ModuleScan::default();
    for path in cached_modules(root) {
        scan.modules += 1;
        let module = HloModuleProto::decode(std::fs::read(&path).unwrap().as_slice()).unwrap();
        let roots: HashMap<i64, String> = module
            .computations
            .iter()
            .map(|computation| {
                let root = computation
                    .instructions
                    .iter()
                    .find(|i| i.id == computation.root_id);
                (
                    computation.id,
                    root.map(|i| i.opcode.clone()).unwrap_or_default(),
                )
            })
            .collect();
        for computation in &module.computations {
            let by_id: HashMap<i64, &HloInstructionProto> =
                computation.instructions.iter().map(|i| (i.id, i)).collect();
            for instruction in &computation.instructions {
                *scan.used.entry(instruction.opcode.clone()).or_default() += 1;
                if !supported.contains(&instruction.opcode) {
                    scan.unsupported
                        .push(format!("{}: `{}`", module.name, instruction.opcode));
                }
                if instruction.opcode == "reduce" {
                    for called in &instruction.called_computation_ids {
                        let root = roots.get(called).map(String::as_str).unwrap_or("?");
                        if !REDUCE_COMPUTATIONS.contains(&root) {
                            scan.unsupported_reductions
                                .push(format!("{}: reduce with `{root}`", module.name));
                        }
                    }
                }
                if instruction.opcode == "power" {
                    let origin = exponent_origin(&by_id, instruction.operand_ids[1]);
                    if origin != "constant" {
                        scan.runtime_exponents.push(format!(
                            "{}: power with an exponent from a `{origin}`",
                            module.name
                        ));
                    }
                }
            }
        }
    }
    scan
}
