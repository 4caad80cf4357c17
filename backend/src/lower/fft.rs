//! The real FFT and its inverse (`rfft`, `irfft`) as HLO `fft` along the last dimension: the
//! transformed dimension moved last, the signal (or the spectrum's bins) cut or zero-padded to
//! the transform's length, the complex spectrum split into (or built from) its real and
//! imaginary parts, computed in f32 (XLA's `fft` takes no narrower floats).

use burn_ir::{IRfftOpIr, RfftOpIr};

use super::builder::Value;
use super::context::{Lowered, Lowering, dims};
use super::shape::{last_to, to_last_order};
use crate::hlo::PrimitiveType;

/// XLA's `FftType::RFFT`.
const RFFT: i32 = 2;
/// XLA's `FftType::IRFFT`.
const IRFFT: i32 = 3;

/// `value` (f32, transformed dimension last) cut or zero-padded to `length` there.
fn resize_last(cx: &mut Lowering, value: &Value, length: i64) -> Value {
    let last = value.rank() - 1;
    let current = value.dims[last];
    let mut padding = vec![(0, 0, 0); value.rank()];
    padding[last].1 = length - current;
    cx.builder.pad(value, 0.0, &padding)
}

/// `operand` transformed by `fft_type` over its last dimension, of transform length `length`;
/// the result has `element_type` and `dims`.
fn fft(
    cx: &mut Lowering,
    operand: &Value,
    fft_type: i32,
    length: i64,
    element_type: PrimitiveType,
    dims: &[i64],
) -> Value {
    let mut instruction = cx.builder.op("fft", element_type, dims, &[operand]);
    instruction.fft_type = fft_type;
    instruction.fft_length = vec![length];
    cx.builder.push(instruction)
}

/// `rfft(signal, dim, n)`: the real and imaginary parts of the `n / 2 + 1` bins.
pub(crate) fn rfft(cx: &mut Lowering, ir: &RfftOpIr) -> Lowered {
    let signal = cx.get(&ir.signal)?;
    let rank = signal.rank();
    let length = ir.n.unwrap_or(ir.signal.shape[ir.dim]) as i64;
    let wide = cx.builder.convert(&signal, PrimitiveType::F32);
    let moved = cx.builder.transpose(&wide, &to_last_order(rank, ir.dim));
    let resized = resize_last(cx, &moved, length);
    let mut spectrum_dims = resized.dims.clone();
    spectrum_dims[rank - 1] = length / 2 + 1;
    let spectrum = fft(
        cx,
        &resized,
        RFFT,
        length,
        PrimitiveType::C64,
        &spectrum_dims,
    );
    for (opcode, out) in [("real", &ir.out_re), ("imag", &ir.out_im)] {
        let part = cx
            .builder
            .op(opcode, PrimitiveType::F32, &spectrum_dims, &[&spectrum]);
        let part = cx.builder.push(part);
        let part = cx.builder.transpose(&part, &last_to(rank, ir.dim));
        let part = cx.builder.convert(&part, signal.element_type);
        cx.set(out, part)?;
    }
    Ok(())
}

/// `irfft(re, im, dim, n)`: the real signal of `n` samples (default `2 · (bins − 1)`).
pub(crate) fn irfft(cx: &mut Lowering, ir: &IRfftOpIr) -> Lowered {
    let real = cx.get(&ir.input_re)?;
    let imaginary = cx.get(&ir.input_im)?;
    let rank = real.rank();
    let out_dims = dims(&ir.out_signal);
    let length = out_dims[ir.dim];
    let parts: Vec<Value> = [&real, &imaginary]
        .into_iter()
        .map(|part| {
            let wide = cx.builder.convert(part, PrimitiveType::F32);
            let moved = cx.builder.transpose(&wide, &to_last_order(rank, ir.dim));
            resize_last(cx, &moved, length / 2 + 1)
        })
        .collect();
    let complex = cx.builder.op(
        "complex",
        PrimitiveType::C64,
        &parts[0].dims.clone(),
        &[&parts[0], &parts[1]],
    );
    let complex = cx.builder.push(complex);
    let mut signal_dims = complex.dims.clone();
    signal_dims[rank - 1] = length;
    let signal = fft(
        cx,
        &complex,
        IRFFT,
        length,
        PrimitiveType::F32,
        &signal_dims,
    );
    let signal = cx.builder.transpose(&signal, &last_to(rank, ir.dim));
    let signal = cx.builder.convert(&signal, real.element_type);
    cx.set(&ir.out_signal, signal)
}
