//! The per-phase summary of a profile: each span's own time (less its children's), added up by
//! phase, inside the steps and outside them.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;
use tracing::Subscriber;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

use super::phase;

/// The time of one phase.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseTime {
    /// The phase ([`super::phase`]), or `host (model code, autodiff)` for the steps' own time.
    pub phase: String,
    /// Seconds of its own time.
    pub seconds: f64,
    /// Spans of it that ended.
    pub count: u64,
}

/// What a profile recorded, by phase.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PhaseSummary {
    /// Steps that ended.
    pub steps: u64,
    /// Their time together, in seconds.
    pub step_seconds: f64,
    /// The phases inside the steps, by own time, largest first; they add up to `step_seconds`.
    pub in_steps: Vec<PhaseTime>,
    /// The phases outside any step (start-up, validation, checkpoints, inference), largest first.
    pub outside_steps: Vec<PhaseTime>,
}

/// The name of the steps' own time: what no phase of its own covers.
const STEP_SELF: &str = "host (model code, autodiff)";

impl fmt::Display for PhaseSummary {
    /// A table of the phases and their share of the steps, then what ran outside them.
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = self
            .in_steps
            .iter()
            .chain(&self.outside_steps)
            .map(|time| time.phase.len())
            .max()
            .unwrap_or(5)
            .max(5);
        if self.steps > 0 {
            writeln!(
                formatter,
                "{} steps, {:.3} s ({:.1} ms per step):",
                self.steps,
                self.step_seconds,
                1e3 * self.step_seconds / self.steps as f64
            )?;
            writeln!(
                formatter,
                "  {:width$}  {:>10}  {:>7}",
                "phase", "seconds", "share"
            )?;
            for time in &self.in_steps {
                writeln!(
                    formatter,
                    "  {:width$}  {:>10.4}  {:>6.1}%",
                    time.phase,
                    time.seconds,
                    100.0 * time.seconds / self.step_seconds.max(f64::MIN_POSITIVE)
                )?;
            }
        }
        if !self.outside_steps.is_empty() {
            writeln!(formatter, "outside the steps:")?;
            for time in &self.outside_steps {
                writeln!(
                    formatter,
                    "  {:width$}  {:>10.4}  ({} spans)",
                    time.phase, time.seconds, time.count
                )?;
            }
        }
        Ok(())
    }
}

/// The totals so far.
#[derive(Debug, Default)]
pub(super) struct Recorder {
    in_steps: BTreeMap<String, (f64, u64)>,
    outside_steps: BTreeMap<String, (f64, u64)>,
    steps: u64,
    step_seconds: f64,
}

impl Recorder {
    fn add(&mut self, phase: &str, own: f64, in_step: bool) {
        let totals = if in_step {
            &mut self.in_steps
        } else {
            &mut self.outside_steps
        };
        let entry = totals.entry(phase.to_string()).or_default();
        entry.0 += own;
        entry.1 += 1;
    }

    pub(super) fn summary(&self) -> PhaseSummary {
        let sorted = |totals: &BTreeMap<String, (f64, u64)>| {
            let mut times: Vec<PhaseTime> = totals
                .iter()
                .map(|(phase, &(seconds, count))| PhaseTime {
                    phase: phase.clone(),
                    seconds,
                    count,
                })
                .collect();
            times.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
            times
        };
        PhaseSummary {
            steps: self.steps,
            step_seconds: self.step_seconds,
            in_steps: sorted(&self.in_steps),
            outside_steps: sorted(&self.outside_steps),
        }
    }
}

/// What the layer keeps in each span's extensions.
struct Timing {
    start: Instant,
    /// Time of the children that ended, in seconds.
    children: f64,
    /// Inside a step (or a step itself).
    in_step: bool,
    /// A compile span that found its program in a cache.
    cached: bool,
}

/// The `tracing` layer that times every span into a [`Recorder`].
pub(super) struct SummaryLayer {
    recorder: Arc<Mutex<Recorder>>,
}

impl SummaryLayer {
    pub(super) fn new(recorder: Arc<Mutex<Recorder>>) -> Self {
        Self { recorder }
    }
}

/// Reads the `cached` field of a compile span.
struct Cached(bool);

impl Visit for Cached {
    fn record_bool(&mut self, field: &Field, value: bool) {
        if field.name() == "cached" {
            self.0 = value;
        }
    }

    fn record_debug(&mut self, _field: &Field, _value: &dyn fmt::Debug) {}
}

impl<S> Layer<S> for SummaryLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attributes: &Attributes<'_>, id: &Id, context: Context<'_, S>) {
        let Some(span) = context.span(id) else {
            return;
        };
        let in_step = attributes.metadata().name() == phase::STEP
            || span.parent().is_some_and(|parent| {
                parent
                    .extensions()
                    .get::<Timing>()
                    .is_some_and(|timing| timing.in_step)
            });
        let mut cached = Cached(false);
        attributes.record(&mut cached);
        span.extensions_mut().insert(Timing {
            start: Instant::now(),
            children: 0.0,
            in_step,
            cached: cached.0,
        });
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, context: Context<'_, S>) {
        let Some(span) = context.span(id) else {
            return;
        };
        let mut cached = Cached(false);
        values.record(&mut cached);
        if cached.0
            && let Some(timing) = span.extensions_mut().get_mut::<Timing>()
        {
            timing.cached = true;
        }
    }

    fn on_close(&self, id: Id, context: Context<'_, S>) {
        let Some(span) = context.span(&id) else {
            return;
        };
        let Some(timing) = span.extensions_mut().remove::<Timing>() else {
            return;
        };
        let total = timing.start.elapsed().as_secs_f64();
        if let Some(parent) = span.parent()
            && let Some(parent_timing) = parent.extensions_mut().get_mut::<Timing>()
        {
            parent_timing.children += total;
        }
        let name = span.metadata().name();
        let phase = match name {
            phase::STEP => STEP_SELF,
            phase::COMPILE if timing.cached => phase::CACHE_LOAD,
            other => other,
        };
        let own = (total - timing.children).max(0.0);
        let mut recorder = super::lock(&self.recorder);
        if name == phase::STEP {
            recorder.steps += 1;
            recorder.step_seconds += total;
        }
        recorder.add(phase, own, timing.in_step);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spans nested in a step: each phase gets its own time, and the phases add up to the step.
    #[test]
    fn own_times_add_up_to_the_steps() {
        let recorder = Arc::new(Mutex::new(Recorder::default()));
        let subscriber = tracing_subscriber::layer::SubscriberExt::with(
            tracing_subscriber::registry(),
            SummaryLayer::new(recorder.clone()),
        );
        let pause = || std::thread::sleep(std::time::Duration::from_millis(20));
        tracing::subscriber::with_default(subscriber, || {
            for _ in 0..2 {
                let _step = tracing::info_span!("step").entered();
                pause();
                {
                    let _lower = tracing::info_span!("lower").entered();
                    pause();
                    let compile = tracing::info_span!("compile", cached = false).entered();
                    compile.record("cached", true);
                    pause();
                }
                let _execute = tracing::info_span!("execute").entered();
                pause();
            }
            let _outside = tracing::info_span!("checkpoint").entered();
        });
        let summary = recorder.lock().unwrap().summary();
        assert_eq!(summary.steps, 2);
        let phases: Vec<&str> = summary.in_steps.iter().map(|t| t.phase.as_str()).collect();
        for expected in [STEP_SELF, "lower", "cache load", "execute"] {
            assert!(phases.contains(&expected), "{phases:?}");
        }
        let total: f64 = summary.in_steps.iter().map(|time| time.seconds).sum();
        assert!((total - summary.step_seconds).abs() < 1e-6, "{summary:?}");
        assert!(
            summary.in_steps.iter().all(|time| time.seconds >= 0.035),
            "{summary:?}"
        );
        assert_eq!(summary.outside_steps[0].phase, "checkpoint");
        assert!(summary.to_string().contains("2 steps"));
    }
}
