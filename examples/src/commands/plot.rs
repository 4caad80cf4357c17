//! Charts written by the tool itself: an RGB canvas with rectangles, lines and text (TrueType
//! labels through `ab_glyph`), saved as PNG.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

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

/// The font of plot labels: `HLAT_FONT`, else the first of [`FONT_PATHS`] present.
pub fn load_font() -> anyhow::Result<ab_glyph::FontVec> {
    let mut candidates: Vec<PathBuf> = std::env::var_os("HLAT_FONT")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    candidates.extend(FONT_PATHS.iter().map(PathBuf::from));
    for candidate in &candidates {
        if let Ok(bytes) = std::fs::read(candidate) {
            return ab_glyph::FontVec::try_from_vec(bytes)
                .with_context(|| format!("{} is not a usable TrueType font", candidate.display()));
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

/// An RGB canvas with just what the project's charts need: rectangles, lines and text.
pub struct Canvas {
    width: usize,
    height: usize,
    pixels: Vec<[u8; 3]>,
}

impl Canvas {
    /// A white canvas.
    pub fn new(width: usize, height: usize) -> Self {
        Self {
            width,
            height,
            pixels: vec![[255, 255, 255]; width * height],
        }
    }

    /// Fills the rectangle `[x0, x1) × [y0, y1)`.
    pub fn fill(&mut self, x0: usize, y0: usize, x1: usize, y1: usize, color: [u8; 3]) {
        for y in y0.min(self.height)..y1.min(self.height) {
            for x in x0.min(self.width)..x1.min(self.width) {
                self.pixels[y * self.width + x] = color;
            }
        }
    }

    /// Draws `text` with its baseline at `y`, starting at `x` (or centred on `x`).
    pub fn text(
        &mut self,
        font: &ab_glyph::FontVec,
        text: &str,
        x: f32,
        y: f32,
        size: f32,
        centred: bool,
    ) {
        use ab_glyph::{Font, ScaleFont};
        let scaled = font.as_scaled(size);
        let width: f32 = text
            .chars()
            .map(|c| scaled.h_advance(scaled.glyph_id(c)))
            .sum();
        let mut caret = if centred { x - width / 2.0 } else { x };
        for character in text.chars() {
            let glyph = scaled
                .glyph_id(character)
                .with_scale_and_position(size, ab_glyph::point(caret, y));
            caret += scaled.h_advance(glyph.id);
            if let Some(outline) = font.outline_glyph(glyph) {
                let bounds = outline.px_bounds();
                outline.draw(|gx, gy, coverage| {
                    let px = bounds.min.x as i64 + gx as i64;
                    let py = bounds.min.y as i64 + gy as i64;
                    if px >= 0
                        && py >= 0
                        && (px as usize) < self.width
                        && (py as usize) < self.height
                    {
                        let pixel = &mut self.pixels[py as usize * self.width + px as usize];
                        for channel in pixel.iter_mut() {
                            *channel = (*channel as f32 * (1.0 - coverage)) as u8;
                        }
                    }
                });
            }
        }
    }

    /// Draws the two axes of a plot area: the left edge at `left`, the bottom edge at `bottom`,
    /// from `top` down and to `right`.
    pub fn axes(&mut self, left: usize, top: usize, right: usize, bottom: usize) {
        self.fill(left, top, left + 1, bottom, [0, 0, 0]);
        self.fill(left, bottom, right, bottom + 1, [0, 0, 0]);
    }

    /// Draws a line two pixels wide from `(x0, y0)` to `(x1, y1)`.
    pub fn line(&mut self, (x0, y0): (f64, f64), (x1, y1): (f64, f64), color: [u8; 3]) {
        let steps = (x1 - x0).abs().max((y1 - y0).abs()).ceil().max(1.0) as usize;
        for step in 0..=steps {
            let along = step as f64 / steps as f64;
            let x = (x0 + (x1 - x0) * along).round() as usize;
            let y = (y0 + (y1 - y0) * along).round() as usize;
            self.fill(x, y, x + 2, y + 2, color);
        }
    }

    /// Writes the canvas as a PNG file.
    pub fn save_png(&self, path: &Path) -> anyhow::Result<()> {
        let mut bytes = Vec::new();
        {
            let mut encoder = png::Encoder::new(&mut bytes, self.width as u32, self.height as u32);
            encoder.set_color(png::ColorType::Rgb);
            encoder.set_depth(png::BitDepth::Eight);
            let mut writer = encoder.write_header()?;
            writer.write_image_data(&self.pixels.concat())?;
        }
        write_atomically(path, &bytes)
    }
}
