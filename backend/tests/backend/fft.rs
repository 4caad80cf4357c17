//! The lowering of `rfft` and `irfft`, run on the XLA CPU plugin: burn-router 0.21 stops at a
//! placeholder panic before it records either operation, so no Burn program reaches them yet; these
//! tests build the operations of Burn's IR by hand, lower them, compile and run the module
//! through PJRT, and compare with the direct transform.

use burn_ir::{IRfftOpIr, ModuleOperationIr, OperationIr, RfftOpIr, TensorStatus};
use burn_trainium::lower::{boundary_of, lower_segment};
use trainium_ffi::pjrt::{Client, CompileOptions, ElementType, Plugin, ProgramFormat};

use super::support::{self, tensor};

/// Lowers `operation` (its inputs are the segment's), runs it on the CPU plugin with `inputs`
/// and returns each output's values.
fn run(operation: OperationIr, inputs: &[Vec<f32>]) -> Vec<Vec<f32>> {
    let operations = [operation];
    let program = lower_segment(&operations, &boundary_of(&operations)).expect("lowers");
    let plugin = Plugin::load(support::plugin_path()).unwrap();
    let client = Client::new(&plugin, &[]).unwrap();
    let device = client.devices()[0];
    let executable = client
        .compile(
            &program.bytes,
            ProgramFormat::Hlo,
            &CompileOptions::on_device(device.id),
        )
        .expect("the plugin compiles the module");
    let buffers: Vec<_> = program
        .inputs
        .iter()
        .zip(inputs)
        .map(|(input, values)| {
            let dims: Vec<i64> = input.shape.iter().map(|&d| d as i64).collect();
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            client
                .buffer_from_host(&bytes, ElementType::F32, &dims, &device)
                .unwrap()
        })
        .collect();
    let outputs = executable
        .execute(&buffers.iter().collect::<Vec<_>>())
        .expect("the module runs");
    program
        .outputs
        .iter()
        .zip(outputs)
        .map(|(output, buffer)| {
            let mut bytes = vec![0u8; output.shape.num_elements() * 4];
            buffer.copy_to_host(&mut bytes).unwrap();
            bytes
                .chunks_exact(4)
                .map(|chunk| f32::from_le_bytes(chunk.try_into().unwrap()))
                .collect()
        })
        .collect()
}

/// Deterministic values in [-2, 2).
fn signal(count: usize) -> Vec<f32> {
    (0..count)
        .map(|i| ((i * 37 + 11) % 64) as f32 / 16.0 - 2.0)
        .collect()
}

/// The bins `k < n / 2 + 1` of the direct transform of each row of `rows × length` values
/// (cut or zero-padded to `n`), as `[rows, bins]` real and imaginary parts.
fn direct_rfft(values: &[f32], length: usize, n: usize) -> (Vec<f32>, Vec<f32>) {
    let (mut real, mut imaginary) = (Vec::new(), Vec::new());
    for row in values.chunks(length) {
        for k in 0..n / 2 + 1 {
            let (mut re, mut im) = (0.0f64, 0.0f64);
            for (t, &x) in row.iter().take(n).enumerate() {
                let angle = 2.0 * std::f64::consts::PI * (k * t) as f64 / n as f64;
                re += f64::from(x) * angle.cos();
                im -= f64::from(x) * angle.sin();
            }
            real.push(re as f32);
            imaginary.push(im as f32);
        }
    }
    (real, imaginary)
}

fn assert_close(what: &str, expected: &[f32], actual: &[f32]) {
    assert_eq!(expected.len(), actual.len(), "{what}: lengths");
    for (index, (e, a)) in expected.iter().zip(actual).enumerate() {
        assert!(
            (e - a).abs() <= 1e-4 * (1.0 + e.abs()),
            "{what}: element {index} is {a}, expected {e}"
        );
    }
}

#[test]
fn rfft_gives_the_direct_transform_at_any_length() {
    let rows = 3;
    let length = 8;
    let values = signal(rows * length);
    for n in [None, Some(16), Some(4)] {
        let size = n.unwrap_or(length);
        let bins = size / 2 + 1;
        // The signal along dimension 1 of [rows, length, 1], so the transform moves it last.
        let operation = OperationIr::Module(ModuleOperationIr::Rfft(RfftOpIr {
            signal: tensor(1, &[rows, length, 1], TensorStatus::ReadOnly),
            dim: 1,
            n,
            out_re: tensor(2, &[rows, bins, 1], TensorStatus::NotInit),
            out_im: tensor(3, &[rows, bins, 1], TensorStatus::NotInit),
        }));
        let outputs = run(operation, std::slice::from_ref(&values));
        let (real, imaginary) = direct_rfft(&values, length, size);
        assert_close(&format!("real part at {size}"), &real, &outputs[0]);
        assert_close(
            &format!("imaginary part at {size}"),
            &imaginary,
            &outputs[1],
        );
    }
}

#[test]
fn irfft_inverts_rfft_and_pads_the_spectrum() {
    let rows = 2;
    let length = 8;
    let values = signal(rows * length);
    let (real, imaginary) = direct_rfft(&values, length, length);
    let bins = length / 2 + 1;
    let inverse = |n: Option<usize>, samples: usize| {
        OperationIr::Module(ModuleOperationIr::IRfft(IRfftOpIr {
            input_re: tensor(1, &[rows, bins], TensorStatus::ReadOnly),
            input_im: tensor(2, &[rows, bins], TensorStatus::ReadOnly),
            dim: 1,
            n,
            out_signal: tensor(3, &[rows, samples], TensorStatus::NotInit),
        }))
    };
    let back = run(inverse(None, length), &[real.clone(), imaginary.clone()]);
    assert_close("irfft of rfft", &values, &back[0]);
    assert_close(
        "irfft of rfft",
        &direct_irfft(&real, &imaginary, bins, length),
        &back[0],
    );
    // To 16 samples: the 5 bins are the first of 9, the others zero (NumPy's `irfft(x, n)`).
    let longer = run(inverse(Some(16), 16), &[real.clone(), imaginary.clone()]);
    assert_close(
        "irfft to 16 samples",
        &direct_irfft(&real, &imaginary, bins, 16),
        &longer[0],
    );
}

/// The direct inverse of each row of `bins` bins as a real signal of `n` samples: the bins
/// beyond those given are zero, the first's imaginary part is ignored, and so is the last's
/// (`n / 2`) when `n` is even; the others count twice (their conjugates); scaled by `1 / n`.
fn direct_irfft(real: &[f32], imaginary: &[f32], bins: usize, n: usize) -> Vec<f32> {
    let mut signal = Vec::new();
    for (re, im) in real.chunks(bins).zip(imaginary.chunks(bins)) {
        for t in 0..n {
            let mut sum = f64::from(re[0]);
            for k in 1..=n / 2 {
                if k >= bins {
                    break;
                }
                let angle = 2.0 * std::f64::consts::PI * (k * t) as f64 / n as f64;
                let term = f64::from(re[k]) * angle.cos() - f64::from(im[k]) * angle.sin();
                let nyquist = n.is_multiple_of(2) && k == n / 2;
                sum += if nyquist {
                    f64::from(re[k]) * angle.cos()
                } else {
                    2.0 * term
                };
            }
            signal.push((sum / n as f64) as f32);
        }
    }
    signal
}
