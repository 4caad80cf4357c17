//! What the tool's charts share: `plotters` draws them into an RGB buffer, with TrueType labels
//! (a font found at run time, through plotters' `ab_glyph`), and the buffer is saved as a PNG
//! file atomically.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, anyhow, bail};
use plotters::backend::BitMapBackend;
use plotters::coord::Shift;
use plotters::drawing::{DrawingArea, IntoDrawingArea};
use plotters::style::{FontFamily, FontStyle, RGBColor, WHITE};

/// Writes `bytes` to `path` with [`burn_trainium::write_atomically`], creating the parent folder
/// first.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    if let Some(parent) = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    burn_trainium::write_atomically(path, bytes)
        .with_context(|| format!("writing {}", path.display()))
}

/// Fonts tried for the plot's labels, after `HLAT_FONT`.
const FONT_PATHS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
];

/// The name the labels' font is registered under with plotters.
const FONT: &str = "hlat-labels";

/// The series colours of every chart, in order (matplotlib's first five).
pub const COLOURS: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
];

/// Reads the labels' font, `HLAT_FONT`, else the first of [`FONT_PATHS`] present: its path and
/// bytes.
fn read_font() -> anyhow::Result<(PathBuf, Vec<u8>)> {
    let mut candidates: Vec<PathBuf> = std::env::var_os("HLAT_FONT")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    candidates.extend(FONT_PATHS.iter().map(PathBuf::from));
    for candidate in &candidates {
        if let Ok(bytes) = std::fs::read(candidate) {
            return Ok((candidate.clone(), bytes));
        }
    }
    let tried: Vec<String> = candidates
        .iter()
        .map(|path| path.display().to_string())
        .collect();
    bail!(
        "no font for the plot labels; tried {} (set HLAT_FONT to a .ttf file)",
        tried.join(", ")
    )
}

/// The font family of plot labels, registered with plotters on first use (the font is read
/// once per process and kept for its lifetime, as plotters requires).
pub fn label_font() -> anyhow::Result<FontFamily<'static>> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            let (path, bytes) = read_font().map_err(|error| format!("{error:#}"))?;
            plotters::style::register_font(FONT, FontStyle::Normal, bytes.leak())
                .map_err(|_| format!("{} is not a usable TrueType font", path.display()))
        })
        .clone()
        .map_err(|error| anyhow!(error))?;
    Ok(FontFamily::Name(FONT))
}

/// The drawing area of a chart: a white bitmap that `plotters` draws into.
pub type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

/// Draws a `width` × `height` chart with `draw` on a white background and saves it as a PNG
/// file at `path` (written atomically, its folder created).
pub fn save_png(
    path: &Path,
    (width, height): (u32, u32),
    draw: impl FnOnce(&Area<'_>) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut pixels = vec![0u8; width as usize * height as usize * 3];
    {
        let area = BitMapBackend::with_buffer(&mut pixels, (width, height)).into_drawing_area();
        area.fill(&WHITE).map_err(drawing_error)?;
        draw(&area)?;
        area.present().map_err(drawing_error)?;
    }
    let mut bytes = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut bytes, width, height);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        encoder.write_header()?.write_image_data(&pixels)?;
    }
    write_atomically(path, &bytes)
}

/// A plotters drawing error as an `anyhow` error (plotters' errors borrow the backend's).
pub fn drawing_error(error: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("drawing the chart: {error}")
}
