//! burn-signal's real FFTs on the host executor: the custom operations `signal::rfft` and
//! `signal::irfft` answered by burn-flex's FFT kernels (which take power-of-two lengths, as
//! burn-signal's API requires).

use burn_backend::DType;
use burn_flex::Flex;
use burn_flex::ops::fft;
use burn_ir::{CustomOpIr, HandleContainer};
use burn_router::CustomOpRegistry;

use crate::lower::fft::{IRFFT, RFFT, arguments};

type Handles = HandleContainer<<Flex as burn_ir::BackendIr>::Handle>;

/// A registry answering burn-signal's FFTs.
pub(super) fn registry() -> CustomOpRegistry<Flex> {
    let mut registry = CustomOpRegistry::new();
    registry.register(RFFT, |handles, custom, _device| rfft(handles, custom));
    registry.register(IRFFT, |handles, custom, _device| irfft(handles, custom));
    registry
}

fn rfft(handles: &mut Handles, custom: &CustomOpIr) {
    let (dim, length) = arguments(custom).unwrap_or_else(|reason| panic!("{reason}"));
    let ([input], [real_out, imaginary_out]) = custom.as_fixed();
    let signal = handles.get_float_tensor::<Flex>(input);
    let (real, imaginary) = match signal.dtype() {
        DType::F64 => fft::rfft_f64(signal, dim, length),
        DType::F16 => fft::rfft_f16(signal, dim, length),
        DType::BF16 => fft::rfft_bf16(signal, dim, length),
        _ => fft::rfft_f32(signal, dim, length),
    };
    handles.register_float_tensor::<Flex>(&real_out.id, real);
    handles.register_float_tensor::<Flex>(&imaginary_out.id, imaginary);
}

fn irfft(handles: &mut Handles, custom: &CustomOpIr) {
    let (dim, length) = arguments(custom).unwrap_or_else(|reason| panic!("{reason}"));
    let ([real_in, imaginary_in], [output]) = custom.as_fixed();
    let real = handles.get_float_tensor::<Flex>(real_in);
    let imaginary = handles.get_float_tensor::<Flex>(imaginary_in);
    let signal = match real.dtype() {
        DType::F64 => fft::irfft_f64(real, imaginary, dim, length),
        DType::F16 => fft::irfft_f16(real, imaginary, dim, length),
        DType::BF16 => fft::irfft_bf16(real, imaginary, dim, length),
        _ => fft::irfft_f32(real, imaginary, dim, length),
    };
    handles.register_float_tensor::<Flex>(&output.id, signal);
}
