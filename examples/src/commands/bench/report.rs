//! Tables, the Markdown performance page and its PNG plot.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, bail};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::generate::GenerateReport;
use super::train::{TrainMeasurement, TrainReport};
use super::training_loop::LoopMeasurement;
use crate::commands::plot::{Area, COLOURS, drawing_error, label_font, save_png, write_atomically};

/// The command line of this process, as typed (`hlat bench ...`).
pub fn command_line() -> String {
    let mut words = vec!["hlat".to_string()];
    words.extend(std::env::args().skip(1));
    words.join(" ")
}

/// How this binary was built: the cargo profile family and the Burn release.
pub fn build_description() -> String {
    let profile = if cfg!(debug_assertions) {
        "dev profile (burn-trainium and the kernels it calls at opt-level 2, the rest at 0: the \
         ndarray and flex rows run generic kernels instantiated unoptimised)"
    } else {
        "release profile"
    };
    format!(
        "hlat {} built in the {profile}, Burn 0.22.1",
        env!("CARGO_PKG_VERSION")
    )
}

/// A one-line description of this machine: processor, cores and memory.
pub fn machine_description() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let processor = cpuinfo
        .lines()
        .find_map(|line| {
            line.strip_prefix("model name")
                .and_then(|rest| rest.split(':').nth(1))
        })
        .map(str::trim)
        .unwrap_or("unknown processor");
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory_gib = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<f64>().ok())
        .map(|kilobytes| kilobytes / 1024.0 / 1024.0)
        .unwrap_or(0.0);
    format!("{processor}, {cores} cores, {memory_gib:.0} GiB memory")
}

/// The results as a Markdown table, with tokens/s ratios against the report's baseline.
pub fn train_table(report: &TrainReport) -> String {
    // The baseline at the same sequence length and micro-batch count.
    let baseline_of = |measured: &TrainMeasurement| {
        report
            .results
            .iter()
            .find(|result| {
                result.backend == report.baseline
                    && result.seq_len == measured.seq_len
                    && result.micro_batches == measured.micro_batches
            })
            .map(|result| result.tokens_per_second)
    };
    let mut table = String::from(
        "| backend | batch × seq | median step | tokens/s | vs baseline | MFU | compiles (warmup + timed) | compile s | host fallbacks | ops/step | capture µs/op | prepare µs/segment (warmup / timed) | peak RSS | beyond start | final loss |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for result in &report.results {
        let ratio = baseline_of(result)
            .map(|base| format!("{:.2}×", result.tokens_per_second / base))
            .unwrap_or_else(|| "n/a".to_string());
        let mfu = result
            .mfu
            .map_or_else(|| "n/a".to_string(), |mfu| format!("{:.1}%", mfu * 100.0));
        let _ = writeln!(
            table,
            "| {} | {} × {} | {:.1} ms | {:.0} | {} | {} | {} + {} | {:.1} | {} | {} | {:.2} | {:.1} / {:.1} | {:.0} MiB | {} | {:.4} |",
            result.backend,
            result.batch,
            result.seq_len,
            result.median_step_seconds * 1e3,
            result.tokens_per_second,
            ratio,
            mfu,
            result.warmup_compiles,
            result.timed_compiles,
            result.compile_seconds,
            result.host_fallbacks,
            result.operations_per_step,
            result.capture_micros_per_operation,
            result.warmup_prepare_micros_per_segment,
            result.prepare_micros_per_segment,
            mebibytes(result.peak_rss_bytes),
            beyond_start(result).map_or_else(
                || "n/a".to_string(),
                |bytes| format!("{:.0} MiB", mebibytes(bytes))
            ),
            result.final_loss
        );
    }
    failure_rows(&mut table, &report.failures, 15);
    table.push_str(&memory_growth(report));
    table
}

/// With `--micro-batches`, the step time of each micro-batch count next to the bubble the
/// pipeline schedule predicts: time per micro-batch, and both as ratios against the backend's
/// best row (the least time per micro-batch): measured, that time over the row's; predicted,
/// the row's `1 - bubble` over the best row's (what the ratio would be were the bubble all that
/// changes with the micro-batch count).
pub fn micro_batch_table(report: &TrainReport) -> String {
    let mut table = match &report.pipeline {
        Some(pipeline) => {
            let layers: Vec<String> = pipeline
                .layers_per_stage
                .iter()
                .map(usize::to_string)
                .collect();
            format!(
                "Pipeline: {} stages, schedule {}{}, layers per stage {}; predicted bubble \
                 (p − 1) / (m·V + p − 1) for m micro-batches of {} × {} tokens.\n\n",
                pipeline.stages,
                pipeline.schedule,
                if pipeline.virtual_stages > 1 {
                    format!(" ({} virtual stages)", pipeline.virtual_stages)
                } else {
                    String::new()
                },
                layers.join(", "),
                report.batch,
                report.seq_len
            )
        }
        None => format!(
            "No pipeline (no --pp): the bubble is 0; m micro-batches of {} × {} tokens.\n\n",
            report.batch, report.seq_len
        ),
    };
    table.push_str(
        "| backend | micro-batches | batch × seq | median step | per micro-batch | predicted bubble | measured vs best | predicted (1 − bubble) vs best |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    let ratio = |value: Option<f64>| value.map_or_else(|| "n/a".to_string(), |v| format!("{v:.2}"));
    for result in &report.results {
        let _ = writeln!(
            table,
            "| {} | {} | {} × {} | {:.1} ms | {:.1} ms | {:.4} | {} | {} |",
            result.backend,
            result.micro_batches,
            result.batch,
            result.seq_len,
            result.median_step_seconds * 1e3,
            result.seconds_per_micro_batch * 1e3,
            result.predicted_bubble,
            ratio(result.measured_efficiency),
            ratio(result.predicted_efficiency)
        );
    }
    failure_rows(&mut table, &report.failures, 8);
    table
}

/// The peak resident memory a backend's steps added beyond what it held before the first step
/// (`None` where the start was not measured). The peak is the one from the start on where known
/// (the Rust backends), else the process's (the peers, which do nothing heavier before it).
fn beyond_start(result: &TrainMeasurement) -> Option<u64> {
    let peak = match result.peak_since_start_bytes {
        0 => result.peak_rss_bytes,
        since_start => since_start,
    };
    (result.resident_at_start_bytes > 0)
        .then(|| peak.saturating_sub(result.resident_at_start_bytes))
}

/// With several sequence lengths, one line per backend: the peak memory beyond the start at the
/// shortest and the longest length, and their ratio (the long-context memory goal's figure).
fn memory_growth(report: &TrainReport) -> String {
    let (Some(&shortest), Some(&longest)) =
        (report.seq_lens.iter().min(), report.seq_lens.iter().max())
    else {
        return String::new();
    };
    if shortest == longest {
        return String::new();
    }
    // With several micro-batch counts, the first one's rows.
    let micro_batches = report.micro_batches.first().copied().unwrap_or(1);
    let beyond_at = |backend: &str, seq_len: usize| {
        report
            .results
            .iter()
            .find(|result| {
                result.backend == backend
                    && result.seq_len == seq_len
                    && result.micro_batches == micro_batches
            })
            .and_then(beyond_start)
    };
    let mut lines = format!(
        "\nPeak memory beyond the start (peak RSS − RSS before the first step), {shortest} vs \
         {longest} tokens per sequence, same tokens per step:\n\n"
    );
    let mut backends: Vec<&str> = Vec::new();
    for result in &report.results {
        if !backends.contains(&result.backend.as_str()) {
            backends.push(&result.backend);
        }
    }
    for backend in backends {
        if let (Some(short), Some(long)) =
            (beyond_at(backend, shortest), beyond_at(backend, longest))
        {
            let _ = writeln!(
                lines,
                "- {backend}: {:.0} MiB → {:.0} MiB ({:.2}×)",
                mebibytes(short),
                mebibytes(long),
                long as f64 / short.max(1) as f64
            );
        }
    }
    lines
}

/// Appends a row per backend that did not run to a table of `columns` columns: its name, the
/// first line of the reason, empty cells.
fn failure_rows(table: &mut String, failures: &[(String, String)], columns: usize) {
    for (backend, reason) in failures {
        let reason = reason.lines().next().unwrap_or_default();
        let empty = " |".repeat(columns - 2);
        let _ = writeln!(table, "| {backend} | did not run: {reason} |{empty}");
    }
}

/// `bytes` in MiB, for the peak memory columns.
fn mebibytes(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// The report of a training-loop benchmark (`hlat bench unrolled`, `hlat bench cnn`): the
/// command, what the loop ran with (`P`, its fields written beside the command's), and each
/// backend's measurement.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct LoopReport<P> {
    /// The command line that produced the report.
    pub command: String,
    /// What the loop ran with.
    #[serde(flatten)]
    pub parameters: P,
    /// The baseline of the ratios.
    pub baseline: String,
    /// One entry per backend that ran.
    pub results: Vec<LoopMeasurement>,
    /// Backends that could not run, with the reason.
    pub failures: Vec<(String, String)>,
    /// A description of the machine.
    pub machine: String,
    /// How this `hlat` binary was built.
    pub build: String,
}

impl<P: serde::Serialize> LoopReport<P> {
    /// The report of this process's run of the loop with `parameters`: `results` against
    /// `baseline`, and the backends that failed.
    pub fn new(
        parameters: P,
        baseline: &str,
        results: Vec<LoopMeasurement>,
        failures: Vec<(String, String)>,
    ) -> Self {
        Self {
            command: command_line(),
            parameters,
            baseline: baseline.to_string(),
            results,
            failures,
            machine: machine_description(),
            build: build_description(),
        }
    }

    /// Prints the report's table ([`loop_table`]) and writes the report as JSON to `json`.
    pub fn publish(&self, json: &Path) -> anyhow::Result<()> {
        let table = loop_table(&self.results, &self.baseline, &self.failures);
        publish(&table, self, json)
    }
}

/// Prints a benchmark's `table` and writes its `report` as JSON to `json`.
pub fn publish(table: &str, report: &impl serde::Serialize, json: &Path) -> anyhow::Result<()> {
    println!("{table}");
    std::fs::write(json, serde_json::to_string_pretty(report)?)
        .with_context(|| format!("writing {}", json.display()))?;
    eprintln!("wrote {}", json.display());
    Ok(())
}

/// The Markdown table of a generation benchmark: prefill and decode speed, ratios of decode
/// speed against the baseline, compiles, memory, and whether each backend generated the
/// baseline's tokens (all Rust backends run the same weights; a near-tie of two logits can
/// still go either way between backends).
pub fn generate_table(report: &GenerateReport) -> String {
    let baseline = report
        .results
        .iter()
        .find(|result| result.backend == report.baseline);
    let mut table = String::from(
        "| backend | prefill | prefill tokens/s | decode ms/token | decode tokens/s | decode vs baseline | compiles (warmup + timed) | compile s | peak RSS | same tokens as baseline |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
    );
    for result in &report.results {
        let ratio = baseline.map_or_else(
            || "n/a".to_string(),
            |base| {
                format!(
                    "{:.2}×",
                    result.decode_tokens_per_second / base.decode_tokens_per_second
                )
            },
        );
        let same = match baseline {
            _ if result.tokens.is_empty() => "n/a (other weights)",
            Some(base) if base.tokens == result.tokens => "yes",
            Some(_) => "no",
            None => "n/a",
        };
        let _ = writeln!(
            table,
            "| {} | {:.1} ms | {:.0} | {:.2} | {:.0} | {} | {} + {} | {:.1} | {:.0} MiB | {} |",
            result.backend,
            result.prefill_seconds * 1e3,
            result.prefill_tokens_per_second,
            result.decode_seconds_per_token * 1e3,
            result.decode_tokens_per_second,
            ratio,
            result.warmup_compiles,
            result.timed_compiles,
            result.compile_seconds,
            mebibytes(result.peak_rss_bytes),
            same
        );
    }
    failure_rows(&mut table, &report.failures, 10);
    table
}

/// The Markdown table of a training-loop benchmark (`hlat bench unrolled`, `hlat bench cnn`):
/// time to the first step, compiles, the steady step time with its ratio against `baseline`,
/// host fallbacks and memory.
pub fn loop_table(
    results: &[LoopMeasurement],
    baseline: &str,
    failures: &[(String, String)],
) -> String {
    let baseline = results
        .iter()
        .find(|result| result.backend == baseline)
        .map(|result| result.timing.median_step_seconds);
    let mut table = String::from(
        "| backend | first step | compiles (first step + later) | compile s | median step | vs baseline | ops/step | host fallbacks | peak RSS | final loss |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for result in results {
        let timing = &result.timing;
        let ratio = baseline.map_or_else(
            || "n/a".to_string(),
            |base| format!("{:.2}×", base / timing.median_step_seconds),
        );
        let _ = writeln!(
            table,
            "| {} | {:.2} s | {} + {} | {:.1} | {:.1} ms | {} | {} | {} | {:.0} MiB | {:.6} |",
            result.backend,
            timing.first_step_seconds,
            timing.first_step_compiles,
            timing.later_compiles,
            timing.compile_seconds,
            timing.median_step_seconds * 1e3,
            ratio,
            timing.operations_per_step,
            timing.host_fallbacks,
            mebibytes(result.peak_rss_bytes),
            timing.final_loss
        );
    }
    failure_rows(&mut table, failures, 10);
    table
}

/// The first line of every page [`write_train_report`] writes: a file without it holds someone's
/// text, which `--report` never replaces ([`check_report_target`]).
pub const REPORT_MARKER: &str =
    "<!-- Written by `hlat bench train --report`: the next run replaces the whole file. -->";

/// Refuses `path` as a `--report` target when it exists and is not a page
/// [`write_train_report`] wrote: hand-written measurements (docs/performance.md) are never
/// overwritten.
pub fn check_report_target(path: &Path) -> anyhow::Result<()> {
    match std::fs::read(path) {
        Ok(bytes) if bytes.starts_with(REPORT_MARKER.as_bytes()) => Ok(()),
        Ok(_) => bail!(
            "--report {}: the file was not written by `hlat bench train --report`, which \
             replaces only its own pages; it is left as it is (give another path)",
            path.display()
        ),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => bail!("--report {}: {error}", path.display()),
    }
}

/// Writes the Markdown performance page and a PNG bar plot of tokens/s beside it; every word
/// of the page comes from the run, and the next run replaces it whole.
pub fn write_train_report(report: &TrainReport, path: &Path) -> anyhow::Result<()> {
    let plot_path = path.with_extension("png");
    draw_tokens_per_second(report, &plot_path)?;
    let plot_name = plot_path
        .file_name()
        .and_then(|name| name.to_str())
        .unwrap_or("performance.png");
    let model = &report.model;
    let mut page = String::new();
    let _ = writeln!(page, "{REPORT_MARKER}\n");
    let _ = writeln!(page, "# Performance\n");
    let _ = writeln!(
        page,
        "Written by `{}`: every word comes from that run.\n",
        report.command
    );
    let _ = writeln!(page, "- Machine: {}.", report.machine);
    let _ = writeln!(page, "- Build: {}.", report.build);
    let _ = writeln!(
        page,
        "- Model: `{}`, {} parameters: {} layers, hidden {}, {} heads ({} key/value heads), FFN {}, \
         vocabulary {}.",
        report.preset,
        model.num_params(),
        model.num_layers,
        model.hidden_size,
        model.num_heads,
        model.num_kv_heads,
        model.ffn_size,
        model.vocab_size
    );
    let _ = writeln!(
        page,
        "- Step: {} sequences of {} tokens, precision {}: forward, cross-entropy, backward, \
         global-norm clipping 1.0 and AdamW (0.9, 0.95, weight decay 0.1); {} untimed warmup \
         steps, then the median of {} timed steps, each ending once the device has finished.",
        report.batch, report.seq_len, report.precision, report.warmup, report.steps
    );
    if !report.micro_batches.is_empty() {
        let counts: Vec<String> = report.micro_batches.iter().map(usize::to_string).collect();
        let _ = writeln!(
            page,
            "- Micro-batches: {} per step, each a micro-batch of the shape above (gradients \
             accumulated); one worker per backend trains them all, alternating the counts step \
             by step.",
            counts.join(", ")
        );
    }
    let _ = writeln!(
        page,
        "- MFU: {:.3e} training FLOPs per token (6·N + 12·L·H·T) × tokens/s ÷ peak; {}.",
        report.flops_per_token,
        match &report.peak {
            Some(peak) => format!(
                "peak {:.1} GFLOP/s, {}",
                peak.flops_per_second / 1e9,
                peak.source
            ),
            None => "no peak was measured or given".to_string(),
        }
    );
    let _ = writeln!(
        page,
        "- Every backend ran in its own process, one after the other, in this one run; ratios are \
         tokens/s against `{}` from the same run.\n",
        report.baseline
    );
    page.push_str(&train_table(report));
    if !report.micro_batches.is_empty() {
        page.push('\n');
        page.push_str(&micro_batch_table(report));
    }
    let _ = writeln!(page, "\nWhat ran:\n");
    for result in &report.results {
        let probe = result.matmul_peak.map_or_else(String::new, |probe| {
            format!(
                "; best f32 matmul [{0}x{0}]x[{0}x{0}]: {1:.1} GFLOP/s",
                probe.size,
                probe.flops_per_second / 1e9
            )
        });
        let _ = writeln!(page, "- `{}`: {}{probe}", result.backend, result.version);
    }
    let _ = writeln!(page, "\n![tokens per second per backend]({plot_name})");
    write_atomically(path, page.as_bytes())
}

/// The bar plot's size in pixels.
pub const PLOT_SIZE: (u32, u32) = (720, 420);

/// Draws a bar plot of tokens/s per backend.
fn draw_tokens_per_second(report: &TrainReport, path: &Path) -> anyhow::Result<()> {
    let bars: Vec<(String, f64)> = report
        .results
        .iter()
        .map(|result| {
            let mut name = result.backend.clone();
            if report.seq_lens.len() > 1 {
                let _ = write!(name, " @{}", result.seq_len);
            }
            if report.micro_batches.len() > 1 {
                let _ = write!(name, " m{}", result.micro_batches);
            }
            (name, result.tokens_per_second)
        })
        .collect();
    let title = format!(
        "HLAT training step, {} {}: tokens/s",
        report.preset, report.precision
    );
    save_png(path, PLOT_SIZE, |area| bar_chart(area, &title, &bars))
}

/// One bar per `(name, value)`, its value written above it.
fn bar_chart(area: &Area<'_>, title: &str, bars: &[(String, f64)]) -> anyhow::Result<()> {
    let font = label_font()?;
    let maximum = bars.iter().map(|(_, value)| *value).fold(0.0, f64::max);
    let top = if maximum > 0.0 { maximum * 1.1 } else { 1.0 };
    let mut chart = ChartBuilder::on(area)
        .caption(title, (font, 20).into_font())
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60)
        // plotters counts a range of integers with its end: one segment per bar.
        .build_cartesian_2d((0..bars.len().saturating_sub(1)).into_segmented(), 0.0..top)
        .map_err(drawing_error)?;
    chart
        .configure_mesh()
        .disable_mesh()
        .y_labels(5)
        .y_label_formatter(&|value| format!("{value:.0}"))
        .x_label_formatter(&|segment| match segment {
            SegmentValue::CenterOf(index) | SegmentValue::Exact(index) => bars
                .get(*index)
                .map_or_else(String::new, |(name, _)| name.clone()),
            SegmentValue::Last => String::new(),
        })
        .label_style((font, 14).into_font())
        .draw()
        .map_err(drawing_error)?;
    chart
        .draw_series(
            Histogram::vertical(&chart)
                .margin(20)
                .style_func(|segment, _| {
                    let index = match segment {
                        SegmentValue::CenterOf(index) | SegmentValue::Exact(index) => *index,
                        SegmentValue::Last => 0,
                    };
                    COLOURS[index % COLOURS.len()].filled()
                })
                .data(
                    bars.iter()
                        .enumerate()
                        .map(|(index, (_, value))| (index, *value)),
                ),
        )
        .map_err(drawing_error)?;
    let label_style =
        TextStyle::from((font, 13).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom));
    chart
        .draw_series(bars.iter().enumerate().map(|(index, (_, value))| {
            Text::new(
                format!("{value:.0}"),
                (SegmentValue::CenterOf(index), *value),
                label_style.clone(),
            )
        }))
        .map_err(drawing_error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bar_plot_is_a_png_of_its_size() {
        let out = tempfile::tempdir().unwrap();
        let path = out.path().join("report.png");
        let bars = [
            ("host".to_string(), 1200.0),
            ("xla @64 m2".to_string(), 3400.5),
        ];
        save_png(&path, PLOT_SIZE, |area| bar_chart(area, "tokens/s", &bars)).unwrap();
        assert_eq!(test_support::image::png_size(&path), PLOT_SIZE);
        // No measurement at all still draws the axes.
        save_png(&path, PLOT_SIZE, |area| bar_chart(area, "tokens/s", &[])).unwrap();
        assert_eq!(test_support::image::png_size(&path), PLOT_SIZE);
    }
}
