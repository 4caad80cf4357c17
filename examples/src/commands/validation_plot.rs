//! `validation.png` of a pretraining run over a data mixture: the validation perplexity of each
//! source against the tokens seen, read from `metrics.jsonl` (continual pretraining watches the
//! general data's perplexity beside the domain's).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use hlat_train::metrics::{METRICS_FILE, StepMetrics};
use plotters::prelude::*;

use super::plot::{COLOURS, drawing_error, label_font, save_png};

/// The plot's file name in the run folder.
pub const VALIDATION_PLOT: &str = "validation.png";

/// The plot's size in pixels.
pub const SIZE: (u32, u32) = (720, 420);

/// Draws `OUT/validation.png` from `OUT/metrics.jsonl` when its steps hold per-source validation
/// perplexities; returns its path, or `None` when there is nothing to draw.
pub fn draw(out: &Path) -> anyhow::Result<Option<PathBuf>> {
    let metrics_path = out.join(METRICS_FILE);
    let text = std::fs::read_to_string(&metrics_path)
        .with_context(|| format!("reading {}", metrics_path.display()))?;
    let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for (index, line) in text.lines().enumerate() {
        let step: StepMetrics = serde_json::from_str(line)
            .with_context(|| format!("{}:{}", metrics_path.display(), index + 1))?;
        for (name, perplexity) in step.val_perplexity_by_source.unwrap_or_default() {
            series
                .entry(name)
                .or_default()
                .push((step.tokens_seen as f64, perplexity));
        }
    }
    if series.is_empty() {
        return Ok(None);
    }
    let path = out.join(VALIDATION_PLOT);
    save_png(&path, SIZE, |area| chart(area, &series))?;
    Ok(Some(path))
}

/// The perplexity of each source against the tokens seen, on a logarithmic axis.
fn chart(
    area: &super::plot::Area<'_>,
    series: &BTreeMap<String, Vec<(f64, f64)>>,
) -> anyhow::Result<()> {
    let font = label_font()?;
    let points = series.values().flatten();
    let (x_max, y_min, y_max) = points.fold(
        (1.0f64, f64::INFINITY, f64::NEG_INFINITY),
        |(x, lo, hi), &(px, py)| (x.max(px), lo.min(py), hi.max(py)),
    );
    let y_max = y_max.max(y_min * (1.0 + 1e-6));
    let mut chart = ChartBuilder::on(area)
        .caption(
            "validation perplexity per source (log scale)",
            (font, 20).into_font(),
        )
        .margin(10)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, (y_min..y_max).log_scale())
        .map_err(drawing_error)?;
    chart
        .configure_mesh()
        .disable_mesh()
        .x_labels(5)
        .y_labels(5)
        .x_desc("tokens seen")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.1}"))
        .label_style((font, 13).into_font())
        .axis_desc_style((font, 14).into_font())
        .draw()
        .map_err(drawing_error)?;
    for (index, (name, points)) in series.iter().enumerate() {
        let colour = COLOURS[index % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                colour.stroke_width(2),
            ))
            .map_err(drawing_error)?
            .label(name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 2), (x + 20, y + 2)], colour.filled()));
        if let [only] = points.as_slice() {
            chart
                .draw_series(std::iter::once(Circle::new(*only, 3, colour.filled())))
                .map_err(drawing_error)?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font((font, 14).into_font())
        .draw()
        .map_err(drawing_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A metrics line of `step` with the validation perplexity of each source.
    fn line(step: u64, perplexities: &[(&str, f64)]) -> String {
        let by_source: BTreeMap<&str, f64> = perplexities.iter().copied().collect();
        serde_json::json!({
            "step": step, "loss": 1.0, "perplexity": 2.7, "lr": 1e-3, "grad_norm": 1.0,
            "tokens": 64, "tokens_seen": step * 64, "tokens_per_s": 100.0,
            "elapsed_seconds": 1.0, "skipped": false,
            "val_perplexity_by_source": by_source,
        })
        .to_string()
    }

    #[test]
    fn the_plot_is_a_png_of_its_size_and_absent_without_validation() {
        let out = tempfile::tempdir().unwrap();
        let metrics = out.path().join(METRICS_FILE);
        std::fs::write(&metrics, "").unwrap();
        assert_eq!(draw(out.path()).unwrap(), None);

        let lines = [
            line(8, &[("domain", 40.0), ("general", 900.0)]),
            line(16, &[("domain", 12.0), ("general", 950.0)]),
            // One point of a source drawn alone.
            line(24, &[("domain", 6.5), ("general", 990.0), ("late", 50.0)]),
        ];
        std::fs::write(&metrics, lines.join("\n")).unwrap();
        let path = draw(out.path()).unwrap().unwrap();
        assert_eq!(path, out.path().join(VALIDATION_PLOT));
        assert_eq!(test_support::image::png_size(&path), SIZE);
    }
}
