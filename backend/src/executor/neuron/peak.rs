//! The published peak compute of a NeuronCore, the denominator of MFU on `neuron`.
//!
//! A Trainium chip (trn1) holds two NeuronCore-v2 and delivers 190 FP16/BF16/TF32 TFLOPS and
//! 47.5 FP32 TFLOPS (the Neuron SDK's Trainium architecture page): per NeuronCore, half of each.

/// Peak FLOP/s of one trn1 NeuronCore-v2 in BF16 (FP16, TF32 alike).
pub const NEURON_CORE_PEAK_BF16: f64 = 95e12;

/// Peak FLOP/s of one trn1 NeuronCore-v2 in FP32.
pub const NEURON_CORE_PEAK_F32: f64 = 23.75e12;

/// The peak FLOP/s of `cores` NeuronCores computing their matrix products in BF16 (`bf16`) or
/// FP32.
pub fn neuron_peak_flops(cores: usize, bf16: bool) -> f64 {
    let per_core = if bf16 {
        NEURON_CORE_PEAK_BF16
    } else {
        NEURON_CORE_PEAK_F32
    };
    per_core * cores as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trn1_chip_is_two_cores() {
        assert_eq!(neuron_peak_flops(2, true), 190e12);
        assert_eq!(neuron_peak_flops(2, false), 47.5e12);
        // A trn1.32xlarge: 16 chips, 32 cores.
        assert_eq!(neuron_peak_flops(32, true), 3040e12);
    }
}
