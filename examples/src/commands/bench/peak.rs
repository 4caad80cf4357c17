//! The peak matrix-multiply rate of a backend on this machine: what MFU is measured against
//! (unless the user passes a peak), and the ceiling no measured operation may exceed.

use std::time::Instant;

use anyhow::Context;
use burn::tensor::{DType, Device, Distribution, Tensor};
use serde::{Deserialize, Serialize};

/// Square f32 matmul sizes of the probe (compute bound on a CPU; the largest takes ~17 GFLOP).
const SIZES: [usize; 3] = [512, 1024, 2048];
/// Timed repetitions of each size; the best is kept.
const REPEATS: usize = 3;

/// The best rate one backend reached on the probe.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PeakProbe {
    /// FLOP/s of the fastest repetition.
    pub flops_per_second: f64,
    /// The matmul size `n` (`[n x n] x [n x n]`) that reached it.
    pub size: usize,
}

/// Times `[n x n] x [n x n]` f32 matmuls on `device` and returns the best rate. Each timed
/// region ends once the device has finished (the result is kept alive across the sync, so a
/// lazy backend computes it inside the region).
pub fn probe(device: &Device) -> anyhow::Result<PeakProbe> {
    let mut best = PeakProbe {
        flops_per_second: 0.0,
        size: 0,
    };
    for size in SIZES {
        let random = || {
            Tensor::<2>::random([size, size], Distribution::Normal(0.0, 1.0), device)
                .cast(DType::F32)
        };
        let (a, b) = (random(), random());
        device.sync().context("synchronising the device")?;
        for repeat in 0..=REPEATS {
            let start = Instant::now();
            let product = a.clone().matmul(b.clone());
            device.sync().context("synchronising the device")?;
            let seconds = start.elapsed().as_secs_f64();
            drop(product);
            // The first run compiles on `xla`: untimed.
            let rate = 2.0 * (size * size * size) as f64 / seconds;
            if repeat > 0 && rate > best.flops_per_second {
                best = PeakProbe {
                    flops_per_second: rate,
                    size,
                };
            }
        }
    }
    Ok(best)
}

/// Which peak a report divides by: one the user passed, or the best probe of the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Peak {
    /// FLOP/s.
    pub flops_per_second: f64,
    /// Where it comes from, for the report.
    pub source: String,
}

impl Peak {
    /// `given` (from `--peak-flops`), else the best of `probes` (`(backend, probe)`).
    pub fn choose(given: Option<f64>, probes: &[(String, PeakProbe)]) -> Option<Peak> {
        if let Some(flops_per_second) = given {
            return Some(Peak {
                flops_per_second,
                source: "passed with --peak-flops".into(),
            });
        }
        probes
            .iter()
            .max_by(|a, b| a.1.flops_per_second.total_cmp(&b.1.flops_per_second))
            .map(|(backend, probe)| Peak {
                flops_per_second: probe.flops_per_second,
                source: format!(
                    "measured in this run: the fastest f32 matmul [{0}x{0}]x[{0}x{0}] of the \
                     backends measured ({backend})",
                    probe.size
                ),
            })
    }
}
