//! The differential suite of the `xla` executor: every lowered operation family runs on `xla:0`
//! and on the host executor (the reference) with the same random inputs, in f32 and bf16.
//! None of them may fall back to the host.

mod xla_support;

use burn::tensor::activation::{log_softmax, relu, softmax};
use burn::tensor::module::{attention, embedding, linear};
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, DType, IndexingUpdateOp, Int, Tensor, TensorData};
use burn_trainium::{Trainium, TrainiumDevice, stats};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use xla_support::{assert_close, xla};

type B = Trainium;

/// Random f32 data in `[low, high)`.
fn uniform(shape: &[usize], low: f32, high: f32, seed: u64) -> TensorData {
    let mut rng = StdRng::seed_from_u64(seed);
    let count = shape.iter().product();
    let values: Vec<f32> = (0..count).map(|_| rng.random_range(low..high)).collect();
    TensorData::new(values, shape.to_vec())
}

/// Random integers in `[0, bound)`.
fn integers(shape: &[usize], bound: i32, seed: u64) -> TensorData {
    let mut rng = StdRng::seed_from_u64(seed);
    let count = shape.iter().product();
    let values: Vec<i32> = (0..count).map(|_| rng.random_range(0..bound)).collect();
    TensorData::new(values, shape.to_vec())
}

/// A float tensor on `device` from `data`, cast to `dtype`.
fn float<const D: usize>(data: &TensorData, dtype: DType, device: &TrainiumDevice) -> Tensor<B, D> {
    Tensor::<B, D>::from_data(data.clone(), device).cast(dtype)
}

fn int<const D: usize>(data: &TensorData, device: &TrainiumDevice) -> Tensor<B, D, Int> {
    Tensor::<B, D, Int>::from_data(data.clone(), device)
}

/// The tolerance of a dtype (bf16 keeps 8 significant bits).
fn tolerance(dtype: DType) -> f64 {
    if dtype == DType::BF16 { 2e-2 } else { 1e-5 }
}

/// Runs `build` on the host and on `xla:0` and compares the results.
fn differential(name: &str, tolerance: f64, build: impl Fn(&TrainiumDevice) -> TensorData) {
    let device = xla(0);
    let expected = build(&TrainiumDevice::HOST);
    let programs = |device| {
        let stats = stats(device);
        stats.compiles + stats.cache_hits
    };
    let before = programs(&device);
    let actual = build(&device);
    assert!(
        programs(&device) > before,
        "{name}: no program ran on {device}"
    );
    assert_close(name, &expected, &actual, tolerance);
    assert_eq!(
        stats(&device).host_fallbacks,
        0,
        "{name}: an operation fell back to the host"
    );
}

const FLOATS: [DType; 2] = [DType::F32, DType::BF16];

#[test]
fn binary_arithmetic_with_broadcasting() {
    let a = uniform(&[3, 4, 5], -2.0, 2.0, 1);
    let b = uniform(&[3, 1, 5], 0.5, 2.0, 2);
    for dtype in FLOATS {
        let t = tolerance(dtype);
        differential("add", t, |d| {
            (float::<3>(&a, dtype, d) + float::<3>(&b, dtype, d)).into_data()
        });
        differential("sub", t, |d| {
            (float::<3>(&a, dtype, d) - float::<3>(&b, dtype, d)).into_data()
        });
        differential("mul", t, |d| {
            (float::<3>(&a, dtype, d) * float::<3>(&b, dtype, d)).into_data()
        });
        differential("div", t, |d| {
            (float::<3>(&a, dtype, d) / float::<3>(&b, dtype, d)).into_data()
        });
        differential("remainder", t, |d| {
            float::<3>(&a, dtype, d)
                .remainder(float::<3>(&b, dtype, d))
                .into_data()
        });
        differential("powf", t, |d| {
            float::<3>(&b, dtype, d)
                .powf(float::<3>(&a, dtype, d))
                .into_data()
        });
        differential("scalars", t, |d| {
            let x = float::<3>(&a, dtype, d);
            ((x.clone() + 1.5) * 0.25 - 3.0)
                .div_scalar(1.7)
                .remainder_scalar(0.6)
                .into_data()
        });
    }
}

#[test]
fn unary_functions() {
    let a = uniform(&[4, 6], -3.0, 3.0, 3);
    let positive = uniform(&[4, 6], 0.1, 4.0, 4);
    for dtype in FLOATS {
        let t = tolerance(dtype);
        differential("exp", t, |d| float::<2>(&a, dtype, d).exp().into_data());
        differential("log", t, |d| {
            float::<2>(&positive, dtype, d).log().into_data()
        });
        differential("log1p", t, |d| {
            float::<2>(&positive, dtype, d).log1p().into_data()
        });
        differential("sqrt", t, |d| {
            float::<2>(&positive, dtype, d).sqrt().into_data()
        });
        differential("abs", t, |d| float::<2>(&a, dtype, d).abs().into_data());
        differential("tanh", t, |d| float::<2>(&a, dtype, d).tanh().into_data());
        differential("sin", t, |d| float::<2>(&a, dtype, d).sin().into_data());
        differential("cos", t, |d| float::<2>(&a, dtype, d).cos().into_data());
        differential("erf", t, |d| float::<2>(&a, dtype, d).erf().into_data());
        differential("recip", t, |d| {
            float::<2>(&positive, dtype, d).recip().into_data()
        });
        differential("floor", t, |d| float::<2>(&a, dtype, d).floor().into_data());
        differential("ceil", t, |d| float::<2>(&a, dtype, d).ceil().into_data());
        differential("round", t, |d| float::<2>(&a, dtype, d).round().into_data());
        differential("powf_scalar", t, |d| {
            float::<2>(&positive, dtype, d).powf_scalar(1.7).into_data()
        });
        differential("powi_scalar", t, |d| {
            float::<2>(&a, dtype, d).powi_scalar(3).into_data()
        });
        differential("neg_clamp", t, |d| {
            (-float::<2>(&a, dtype, d)).clamp(-1.0, 0.5).into_data()
        });
        differential("relu", t, |d| relu(float::<2>(&a, dtype, d)).into_data());
        differential("sigmoid", t, |d| {
            burn::tensor::activation::sigmoid(float::<2>(&a, dtype, d)).into_data()
        });
        differential("gelu", t, |d| {
            burn::tensor::activation::gelu(float::<2>(&a, dtype, d)).into_data()
        });
        differential("silu", t, |d| {
            burn::tensor::activation::silu(float::<2>(&a, dtype, d)).into_data()
        });
    }
}

#[test]
fn comparisons_and_masks() {
    let a = uniform(&[5, 4], -1.0, 1.0, 5);
    let b = uniform(&[1, 4], -1.0, 1.0, 6);
    for dtype in FLOATS {
        let t = tolerance(dtype);
        differential("greater", 0.0, |d| {
            float::<2>(&a, dtype, d)
                .greater(float::<2>(&b, dtype, d))
                .into_data()
        });
        differential("lower_equal_elem", 0.0, |d| {
            float::<2>(&a, dtype, d).lower_equal_elem(0.25).into_data()
        });
        differential("equal", 0.0, |d| {
            let x = float::<2>(&a, dtype, d);
            x.clone().equal(x.floor()).into_data()
        });
        differential("mask_where", t, |d| {
            let x = float::<2>(&a, dtype, d);
            let mask = x.clone().greater_elem(0.0);
            x.mask_where(mask, float::<2>(&b, dtype, d).expand([5, 4]))
                .into_data()
        });
        differential("mask_fill", t, |d| {
            let x = float::<2>(&a, dtype, d);
            let mask: Tensor<B, 2, Bool> = x.clone().lower_elem(0.1);
            x.mask_fill(mask, -1e4).into_data()
        });
        differential("bool logic", 0.0, |d| {
            let x = float::<2>(&a, dtype, d);
            let p = x.clone().greater_elem(-0.5);
            let q = x.lower_elem(0.5);
            p.clone()
                .bool_and(q.clone())
                .bool_or(p.bool_not())
                .int()
                .into_data()
        });
    }
}

#[test]
fn reductions() {
    let a = uniform(&[3, 5, 7], -2.0, 2.0, 7);
    for dtype in FLOATS {
        let t = tolerance(dtype) * 4.0;
        differential("sum", t, |d| float::<3>(&a, dtype, d).sum().into_data());
        differential("mean", t, |d| float::<3>(&a, dtype, d).mean().into_data());
        differential("sum_dim", t, |d| {
            float::<3>(&a, dtype, d).sum_dim(1).into_data()
        });
        differential("mean_dim", t, |d| {
            float::<3>(&a, dtype, d).mean_dim(2).into_data()
        });
        differential("max_dim", t, |d| {
            float::<3>(&a, dtype, d).max_dim(2).into_data()
        });
        differential("min_dim", t, |d| {
            float::<3>(&a, dtype, d).min_dim(0).into_data()
        });
        differential("max", t, |d| float::<3>(&a, dtype, d).max().into_data());
        differential("prod_dim", t, |d| {
            float::<3>(&a, dtype, d).prod_dim(0).into_data()
        });
        differential("argmax", 0.0, |d| {
            float::<3>(&a, dtype, d).argmax(2).into_data()
        });
        differential("argmin", 0.0, |d| {
            float::<3>(&a, dtype, d).argmin(1).into_data()
        });
        differential("max_dim_with_indices", 0.0, |d| {
            float::<3>(&a, dtype, d)
                .max_dim_with_indices(1)
                .1
                .into_data()
        });
        differential("softmax", t, |d| {
            softmax(float::<3>(&a, dtype, d), 2).into_data()
        });
        differential("log_softmax", t, |d| {
            log_softmax(float::<3>(&a, dtype, d), 2).into_data()
        });
    }
}

#[test]
fn matrix_products() {
    let a = uniform(&[2, 3, 4, 5], -1.0, 1.0, 8);
    let b = uniform(&[1, 3, 5, 6], -1.0, 1.0, 9);
    let x = uniform(&[2, 7, 5], -1.0, 1.0, 10);
    let w = uniform(&[5, 3], -1.0, 1.0, 11);
    let bias = uniform(&[3], -1.0, 1.0, 12);
    for dtype in FLOATS {
        let t = tolerance(dtype) * 4.0;
        differential("matmul 2d", t, |d| {
            float::<2>(&w, dtype, d)
                .transpose()
                .matmul(float::<2>(&w, dtype, d))
                .into_data()
        });
        differential("batched matmul", t, |d| {
            float::<4>(&a, dtype, d)
                .matmul(float::<4>(&b, dtype, d))
                .into_data()
        });
        differential("linear", t, |d| {
            linear(
                float::<3>(&x, dtype, d),
                float::<2>(&w, dtype, d),
                Some(float::<1>(&bias, dtype, d)),
            )
            .into_data()
        });
    }
}

#[test]
fn layout_operations() {
    let a = uniform(&[2, 3, 4], -1.0, 1.0, 13);
    let v = uniform(&[2, 2, 4], -1.0, 1.0, 14);
    for dtype in FLOATS {
        let t = tolerance(dtype);
        differential("reshape", t, |d| {
            float::<3>(&a, dtype, d).reshape([4, 6]).into_data()
        });
        differential("swap_dims", t, |d| {
            float::<3>(&a, dtype, d).swap_dims(0, 2).into_data()
        });
        differential("permute", t, |d| {
            float::<3>(&a, dtype, d).permute([1, 2, 0]).into_data()
        });
        differential("flip", t, |d| {
            float::<3>(&a, dtype, d).flip([0, 2]).into_data()
        });
        differential("expand", t, |d| {
            float::<3>(&a, dtype, d)
                .reshape([2, 1, 3, 4])
                .expand([2, 5, 3, 4])
                .into_data()
        });
        differential("slice", t, |d| {
            float::<3>(&a, dtype, d)
                .slice([0..2, 1..3, 0..4])
                .into_data()
        });
        differential("slice step", t, |d| {
            float::<3>(&a, dtype, d)
                .slice(burn::tensor::s![.., 0..3;2, 1..])
                .into_data()
        });
        differential("slice_assign", t, |d| {
            float::<3>(&a, dtype, d)
                .slice_assign([0..2, 1..3, 0..4], float::<3>(&v, dtype, d))
                .into_data()
        });
        differential("cat", t, |d| {
            Tensor::cat(vec![float::<3>(&a, dtype, d), float::<3>(&v, dtype, d)], 1).into_data()
        });
        differential("repeat_dim", t, |d| {
            float::<3>(&a, dtype, d).repeat_dim(1, 3).into_data()
        });
        differential("zeros ones full", t, |d| {
            let shape = [2, 3];
            (Tensor::<B, 2>::zeros(shape, d)
                + Tensor::<B, 2>::ones(shape, d)
                + Tensor::<B, 2>::full(shape, 2.5, d))
            .cast(dtype)
            .into_data()
        });
    }
}

#[test]
fn indexing_operations() {
    let table = uniform(&[6, 4], -1.0, 1.0, 15);
    let rows = integers(&[5], 6, 16);
    let positions = integers(&[6, 4], 4, 17);
    let tokens = integers(&[2, 3], 6, 18);
    let updates = uniform(&[5, 4], -1.0, 1.0, 19);
    for dtype in FLOATS {
        let t = tolerance(dtype);
        differential("select", t, |d| {
            float::<2>(&table, dtype, d)
                .select(0, int::<1>(&rows, d))
                .into_data()
        });
        differential("select_add", t, |d| {
            float::<2>(&table, dtype, d)
                .select_assign(
                    0,
                    int::<1>(&rows, d),
                    float::<2>(&updates, dtype, d),
                    IndexingUpdateOp::Add,
                )
                .into_data()
        });
        differential("gather", t, |d| {
            float::<2>(&table, dtype, d)
                .gather(1, int::<2>(&positions, d))
                .into_data()
        });
        differential("scatter_add", t, |d| {
            let x = float::<2>(&table, dtype, d);
            x.clone()
                .scatter(1, int::<2>(&positions, d), x, IndexingUpdateOp::Add)
                .into_data()
        });
        differential("embedding", t, |d| {
            embedding(float::<2>(&table, dtype, d), int::<2>(&tokens, d)).into_data()
        });
    }
}

#[test]
fn casts_and_integers() {
    let a = uniform(&[3, 4], -100.0, 100.0, 20);
    let i = integers(&[3, 4], 50, 21);
    let j = integers(&[3, 4], 7, 22);
    differential("f32 to bf16", 0.0, |d| {
        float::<2>(&a, DType::F32, d).cast(DType::BF16).into_data()
    });
    differential("bf16 to f32", 0.0, |d| {
        float::<2>(&a, DType::BF16, d).cast(DType::F32).into_data()
    });
    differential("float to int", 0.0, |d| {
        float::<2>(&a, DType::F32, d).int().into_data()
    });
    differential("int arithmetic", 0.0, |d| {
        let x = int::<2>(&i, d);
        let y = int::<2>(&j, d) + 1;
        ((x.clone() * 3 + y.clone()) / y.clone() - x.clone().remainder(y)).into_data()
    });
    differential("int to float", 0.0, |d| {
        (int::<2>(&i, d).float() * 0.5).into_data()
    });
    differential("int comparisons", 0.0, |d| {
        int::<2>(&i, d).greater_equal(int::<2>(&j, d)).into_data()
    });
    differential("int sum_dim", 0.0, |d| {
        int::<2>(&i, d).sum_dim(1).into_data()
    });
    differential("bool to float", 0.0, |d| {
        int::<2>(&i, d).lower_elem(20).float().into_data()
    });
}

#[test]
fn inverse_trigonometry() {
    let unit = uniform(&[3, 5], -0.9, 0.9, 23);
    let above_one = uniform(&[3, 5], 1.1, 4.0, 24);
    for dtype in FLOATS {
        let t = tolerance(dtype) * 2.0;
        differential("acos", t, |d| {
            float::<2>(&unit, dtype, d).acos().into_data()
        });
        differential("asin", t, |d| {
            float::<2>(&unit, dtype, d).asin().into_data()
        });
        differential("atan", t, |d| {
            float::<2>(&above_one, dtype, d).atan().into_data()
        });
        differential("atanh", t, |d| {
            float::<2>(&unit, dtype, d).atanh().into_data()
        });
        differential("asinh", t, |d| {
            float::<2>(&unit, dtype, d).asinh().into_data()
        });
        differential("acosh", t, |d| {
            float::<2>(&above_one, dtype, d).acosh().into_data()
        });
    }
}

#[test]
fn cumulative_operations() {
    let a = uniform(&[3, 6], 0.5, 1.5, 25);
    let i = integers(&[3, 6], 9, 26);
    for dtype in FLOATS {
        let t = tolerance(dtype) * 4.0;
        differential("cumsum", t, |d| {
            float::<2>(&a, dtype, d).cumsum(1).into_data()
        });
        differential("cumprod", t, |d| {
            float::<2>(&a, dtype, d).cumprod(1).into_data()
        });
        differential("cummin", t, |d| {
            float::<2>(&a, dtype, d).cummin(0).into_data()
        });
        differential("cummax", t, |d| {
            float::<2>(&a, dtype, d).cummax(1).into_data()
        });
    }
    differential("int cumsum", 0.0, |d| int::<2>(&i, d).cumsum(1).into_data());
}

#[test]
fn attention_module() {
    let q = uniform(&[2, 3, 5, 4], -1.0, 1.0, 27);
    let k = uniform(&[2, 3, 7, 4], -1.0, 1.0, 28);
    let v = uniform(&[2, 3, 7, 6], -1.0, 1.0, 29);
    let bias = uniform(&[2, 3, 5, 7], -0.5, 0.5, 30);
    let mask = uniform(&[2, 3, 5, 7], 0.0, 1.0, 31);
    for dtype in FLOATS {
        let t = tolerance(dtype) * 4.0;
        differential("attention causal", t, |d| {
            let options = AttentionModuleOptions {
                scale: None,
                softcap: None,
                is_causal: true,
            };
            attention(
                float(&q, dtype, d),
                float(&k, dtype, d),
                float(&v, dtype, d),
                None,
                None,
                options,
            )
            .into_data()
        });
        differential("attention mask bias softcap", t, |d| {
            let options = AttentionModuleOptions {
                scale: Some(0.3),
                softcap: Some(2.0),
                is_causal: false,
            };
            let hidden = float::<4>(&mask, DType::F32, d).greater_elem(0.8);
            let bias = Some(float(&bias, dtype, d));
            attention(
                float(&q, dtype, d),
                float(&k, dtype, d),
                float(&v, dtype, d),
                Some(hidden),
                bias,
                options,
            )
            .into_data()
        });
    }
}
