//! burn-signal's real FFTs, which Burn 0.22 sends to a remote device as custom operations
//! (`signal::rfft`, `signal::irfft`; scalars: the dimension, whether a length was given, the
//! length): XLA's `fft` of the dimension moved last, computed in f32.
//!
//! `rfft` truncates or zero-pads the signal to the length `n` and gives the `n/2 + 1` bins of
//! the one-sided spectrum as real and imaginary parts; `irfft` takes the first `n/2 + 1` bins
//! (zero-padded when fewer are given) and gives `n` samples, scaled by `1/n`.

use burn_ir::{CustomOpIr, ScalarIr};

use super::builder::{FftKind, Value};
use super::context::{Failure, Lowered, Lowering, dims};
use super::shape::last_to;
use crate::hlo::PrimitiveType;

/// The custom-operation id burn-signal gives a real FFT.
pub const RFFT: &str = "signal::rfft";
/// The custom-operation id burn-signal gives an inverse real FFT.
pub const IRFFT: &str = "signal::irfft";

/// Whether `custom` is one of burn-signal's FFTs.
pub(crate) fn is_fft(custom: &CustomOpIr) -> bool {
    custom.id == RFFT || custom.id == IRFFT
}

/// The dimension and the requested length of an FFT's scalars.
pub(crate) fn arguments(custom: &CustomOpIr) -> Result<(usize, Option<usize>), String> {
    match custom.scalars.as_slice() {
        [
            ScalarIr::UInt(dim),
            ScalarIr::Bool(has_length),
            ScalarIr::UInt(length),
        ] => Ok((*dim as usize, has_length.then_some(*length as usize))),
        other => Err(format!(
            "`{}` takes the scalars (dimension, whether a length is given, length), got {other:?}",
            custom.id
        )),
    }
}

/// `signal::rfft` or `signal::irfft`.
pub(crate) fn fft(cx: &mut Lowering, custom: &CustomOpIr) -> Lowered {
    let (dim, length) = arguments(custom).map_err(Failure::Invalid)?;
    let arity = if custom.id == RFFT { (1, 2) } else { (2, 1) };
    if (custom.inputs.len(), custom.outputs.len()) != arity {
        return Err(Failure::Invalid(format!(
            "`{}` takes {} input(s) and {} output(s), got {} and {}",
            custom.id,
            arity.0,
            arity.1,
            custom.inputs.len(),
            custom.outputs.len()
        )));
    }
    let rank = custom.inputs[0].shape.len();
    if dim >= rank {
        return Err(Failure::Invalid(format!(
            "`{}` along dimension {dim} of a tensor of rank {rank}",
            custom.id
        )));
    }
    if custom.id == RFFT {
        rfft(cx, custom, dim, length)
    } else {
        irfft(cx, custom, dim, length)
    }
}

/// `value` (in f32) with `dim` moved last, cut or zero-padded there to `length`.
fn last_dimension(cx: &mut Lowering, value: &Value, dim: usize, length: i64) -> Value {
    let rank = value.rank();
    let wide = cx.builder.convert(value, PrimitiveType::F32);
    let mut to_last: Vec<i64> = (0..rank as i64).filter(|&d| d != dim as i64).collect();
    to_last.push(dim as i64);
    let moved = cx.builder.transpose(&wide, &to_last);
    let current = moved.dims[rank - 1];
    if current > length {
        let mut limit = moved.dims.clone();
        limit[rank - 1] = length;
        cx.builder
            .slice(&moved, &vec![0; rank], &limit, &vec![1; rank])
    } else {
        let mut padding = vec![(0, 0, 0); rank];
        padding[rank - 1] = (0, length - current, 0);
        cx.builder.pad(&moved, 0.0, &padding)
    }
}

/// `value` (f32, the transformed dimension last) with that dimension moved back to `dim`, in
/// `out`'s type.
fn set_from_last(cx: &mut Lowering, out: &burn_ir::TensorIr, value: &Value, dim: usize) -> Lowered {
    let moved = cx.builder.transpose(value, &last_to(value.rank(), dim));
    let element_type = super::context::element_type(out.dtype)?;
    let value = cx.builder.convert(&moved, element_type);
    let value = cx.builder.reshape(&value, &dims(out));
    cx.set(out, value)
}

fn rfft(cx: &mut Lowering, custom: &CustomOpIr, dim: usize, length: Option<usize>) -> Lowered {
    let signal = cx.get(&custom.inputs[0])?;
    let length = length.unwrap_or(custom.inputs[0].shape[dim]) as i64;
    let signal = last_dimension(cx, &signal, dim, length);
    let mut spectrum_dims = signal.dims.clone();
    *spectrum_dims.last_mut().expect("a dimension") = length / 2 + 1;
    let spectrum = cx.builder.fft(
        &signal,
        FftKind::Real,
        length,
        PrimitiveType::C64,
        &spectrum_dims,
    );
    let real = cx.builder.complex_part(&spectrum, false);
    let imaginary = cx.builder.complex_part(&spectrum, true);
    set_from_last(cx, &custom.outputs[0], &real, dim)?;
    set_from_last(cx, &custom.outputs[1], &imaginary, dim)
}

fn irfft(cx: &mut Lowering, custom: &CustomOpIr, dim: usize, length: Option<usize>) -> Lowered {
    let bins = custom.inputs[0].shape[dim];
    let length = length.unwrap_or(2 * bins.saturating_sub(1)) as i64;
    if length == 0 {
        return Err(Failure::Invalid(format!(
            "`{}` of a spectrum of {bins} bin(s) gives no samples",
            custom.id
        )));
    }
    let real = cx.get(&custom.inputs[0])?;
    let imaginary = cx.get(&custom.inputs[1])?;
    let real = last_dimension(cx, &real, dim, length / 2 + 1);
    let imaginary = last_dimension(cx, &imaginary, dim, length / 2 + 1);
    let spectrum = cx.builder.complex(&real, &imaginary);
    let mut signal_dims = spectrum.dims.clone();
    *signal_dims.last_mut().expect("a dimension") = length;
    let signal = cx.builder.fft(
        &spectrum,
        FftKind::InverseReal,
        length,
        PrimitiveType::F32,
        &signal_dims,
    );
    set_from_last(cx, &custom.outputs[0], &signal, dim)
}
