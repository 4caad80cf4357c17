//! `validation.png` of a pretraining run over a data mixture: the validation perplexity of each
//! source against the tokens seen, read from `metrics.jsonl` (continual pretraining watches the
//! general data's perplexity beside the domain's).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use hlat_train::metrics::{METRICS_FILE, StepMetrics};

use super::plot::{Canvas, load_font};

/// The plot's file name in the run folder.
pub const VALIDATION_PLOT: &str = "validation.png";

/// Line colours, one per source.
const COLOURS: [[u8; 3]; 5] = [
    [31, 119, 180],
    [255, 127, 14],
    [44, 160, 44],
    [214, 39, 40],
    [148, 103, 189],
];

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
                .push((step.tokens_seen as f64, perplexity.ln()));
        }
    }
    if series.is_empty() {
        return Ok(None);
    }
    let points = series.values().flatten();
    let (x_max, y_min, y_max) = points.fold(
        (1.0f64, f64::INFINITY, f64::NEG_INFINITY),
        |(x, lo, hi), &(px, py)| (x.max(px), lo.min(py), hi.max(py)),
    );
    let y_span = (y_max - y_min).max(1e-6);

    let font = load_font()?;
    let (width, height) = (720usize, 420usize);
    let (left, right, top, bottom) = (80usize, 150usize, 50usize, 60usize);
    let mut canvas = Canvas::new(width, height);
    canvas.text(
        &font,
        "validation perplexity per source (log scale)",
        width as f32 / 2.0,
        30.0,
        20.0,
        true,
    );
    canvas.axes(left, top, width - right, height - bottom);
    let plot_width = (width - left - right) as f64;
    let plot_height = (height - top - bottom) as f64;
    let place = |(x, y): (f64, f64)| {
        (
            left as f64 + x / x_max * plot_width,
            (height - bottom) as f64 - (y - y_min) / y_span * plot_height,
        )
    };
    for tick in 0..=4 {
        let fraction = tick as f64 / 4.0;
        let y = (height - bottom) as f64 - fraction * plot_height;
        let perplexity = (y_min + fraction * y_span).exp();
        canvas.fill(left - 5, y as usize, left, y as usize + 1, [0, 0, 0]);
        canvas.text(
            &font,
            &format!("{perplexity:.1}"),
            left as f32 - 38.0,
            y as f32 + 5.0,
            13.0,
            true,
        );
        let x = left as f64 + fraction * plot_width;
        canvas.fill(
            x as usize,
            height - bottom,
            x as usize + 1,
            height - bottom + 5,
            [0, 0, 0],
        );
        canvas.text(
            &font,
            &format!("{:.0}", fraction * x_max),
            x as f32,
            (height - bottom + 20) as f32,
            13.0,
            true,
        );
    }
    canvas.text(
        &font,
        "tokens seen",
        (left as f32 + (width - right) as f32) / 2.0,
        (height - 15) as f32,
        14.0,
        true,
    );
    for (index, (name, points)) in series.iter().enumerate() {
        let colour = COLOURS[index % COLOURS.len()];
        for pair in points.windows(2) {
            canvas.line(place(pair[0]), place(pair[1]), colour);
        }
        if let [only] = points.as_slice() {
            let (x, y) = place(*only);
            canvas.fill(
                x as usize,
                y as usize,
                x as usize + 4,
                y as usize + 4,
                colour,
            );
        }
        let legend_y = top + 20 + index * 22;
        canvas.fill(
            width - right + 15,
            legend_y - 8,
            width - right + 35,
            legend_y - 4,
            colour,
        );
        canvas.text(
            &font,
            name,
            (width - right + 42) as f32,
            legend_y as f32,
            14.0,
            false,
        );
    }
    let path = out.join(VALIDATION_PLOT);
    canvas.save_png(&path)?;
    Ok(Some(path))
}
