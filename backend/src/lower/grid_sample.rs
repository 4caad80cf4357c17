//! `grid_sample_2d` as Burn defines it (`burn-flex`'s reference, PyTorch's `grid_sample`): each
//! output point `[n, :, i, j]` samples the input `[n, c, h, w]` at the normalised coordinates
//! `grid[n, i, j] = (x, y)` in `[-1, 1]`, bilinearly or at the nearest element (ties to even),
//! with the padding mode deciding what lies outside: zeros, the border's value, or the input
//! reflected at its edges.
//!
//! The coordinates depend on the data, so the samples are gathers from the flattened input planes:
//! one per corner for bilinear sampling, one for nearest. Computed in f32 (f64 for f64 inputs).
//! Burn's autodiff has no gradient for it, so there is no backward pass to lower.

use burn_ir::{GridSample2dOpIr, GridSamplePaddingModeIr, InterpolateModeIr};

use super::builder::{Direction, Value};
use super::context::{Lowered, Lowering, compute_type, unsupported};
use super::index::gather_along;
use crate::hlo::PrimitiveType;

/// The sizes of one sampling: input planes `height × width`, `points` output points per batch.
struct Planes {
    batch: i64,
    channels: i64,
    height: i64,
    width: i64,
    points: i64,
}

impl Planes {
    /// `[batch, points]`: one entry per output point.
    fn point_dims(&self) -> [i64; 2] {
        [self.batch, self.points]
    }

    /// `[batch, channels, points]`: one entry per output point and channel.
    fn sample_dims(&self) -> [i64; 3] {
        [self.batch, self.channels, self.points]
    }
}

/// `grid_sample_2d`: the input sampled at the grid's points.
pub(crate) fn grid_sample_2d(cx: &mut Lowering, ir: &GridSample2dOpIr) -> Lowered {
    let nearest = match ir.options.mode {
        InterpolateModeIr::Bilinear => false,
        InterpolateModeIr::Nearest => true,
        ref other => {
            return unsupported(format!(
                "grid_sample_2d with {other:?} interpolation (Burn defines bilinear and nearest)"
            ));
        }
    };
    let input = cx.get(&ir.tensor)?;
    let grid = cx.get(&ir.grid)?;
    if input.rank() != 4 || grid.rank() != 4 || grid.dims[3] != 2 {
        return unsupported(format!(
            "grid_sample_2d of a {:?} input on a {:?} grid (it takes [n, c, h, w] and [n, h, w, 2])",
            input.dims, grid.dims
        ));
    }
    let planes = Planes {
        batch: input.dims[0],
        channels: input.dims[1],
        height: input.dims[2],
        width: input.dims[3],
        points: grid.dims[1] * grid.dims[2],
    };
    let wide = compute_type(input.element_type);
    let input_wide = cx.builder.convert(&input, wide);
    let flat = cx.builder.reshape(
        &input_wide,
        &[planes.batch, planes.channels, planes.height * planes.width],
    );
    let grid = cx.builder.convert(&grid, wide);
    let grid = cx.builder.reshape(&grid, &[planes.batch, planes.points, 2]);
    let normalised = |cx: &mut Lowering, axis: i64| {
        let part = cx.builder.slice(
            &grid,
            &[0, 0, axis],
            &[planes.batch, planes.points, axis + 1],
            &[1, 1, 1],
        );
        cx.builder.reshape(&part, &planes.point_dims())
    };
    let x = normalised(cx, 0);
    let y = normalised(cx, 1);
    let align = ir.options.align_corners;
    let x = unnormalise(cx, &x, planes.width, align);
    let y = unnormalise(cx, &y, planes.height, align);
    let padding = &ir.options.padding_mode;
    let (x, y) = pad_coordinates(cx, (x, y), &planes, padding, align);
    let sampler = Sampler {
        flat,
        planes,
        zeros_outside: matches!(padding, GridSamplePaddingModeIr::Zeros),
        wide,
    };
    let samples = if nearest {
        sampler.nearest(cx, &x, &y)
    } else {
        sampler.bilinear(cx, &x, &y)
    };
    let out_dims = [
        sampler.planes.batch,
        sampler.planes.channels,
        ir.grid.shape[1] as i64,
        ir.grid.shape[2] as i64,
    ];
    let samples = cx.builder.reshape(&samples, &out_dims);
    let samples = cx.builder.convert(&samples, input.element_type);
    cx.set(&ir.out, samples)
}

/// A normalised coordinate in `[-1, 1]` as a position along an axis of `size` elements:
/// `(c + 1)·(size − 1)/2` with `align_corners`, else `(c + 1)·size/2 − 1/2`.
fn unnormalise(cx: &mut Lowering, coordinate: &Value, size: i64, align_corners: bool) -> Value {
    let dims = coordinate.dims.clone();
    let constant =
        |cx: &mut Lowering, value: f64| cx.builder.filled(coordinate.element_type, value, &dims);
    let one = constant(cx, 1.0);
    let shifted = cx.builder.binary("add", coordinate, &one);
    let span = if align_corners { size - 1 } else { size };
    let scale = constant(cx, span as f64 / 2.0);
    let position = cx.builder.binary("multiply", &shifted, &scale);
    if align_corners {
        position
    } else {
        let half = constant(cx, 0.5);
        cx.builder.binary("subtract", &position, &half)
    }
}

/// The positions after the padding mode: clamped to the border (a point with a non-finite
/// coordinate goes to the centre, as Burn's reference sends it), reflected at the edges, or
/// left as they are for zeros.
fn pad_coordinates(
    cx: &mut Lowering,
    (x, y): (Value, Value),
    planes: &Planes,
    padding: &GridSamplePaddingModeIr,
    align_corners: bool,
) -> (Value, Value) {
    match padding {
        GridSamplePaddingModeIr::Zeros => (x, y),
        GridSamplePaddingModeIr::Border => {
            let finite_x = is_finite(cx, &x);
            let finite_y = is_finite(cx, &y);
            let finite = cx.builder.binary("and", &finite_x, &finite_y);
            let clamp = |cx: &mut Lowering, value: &Value, size: i64| {
                let last = (size - 1) as f64;
                let low = cx.builder.filled(value.element_type, 0.0, &value.dims);
                let high = cx.builder.filled(value.element_type, last, &value.dims);
                let centre = cx
                    .builder
                    .filled(value.element_type, last / 2.0, &value.dims);
                let clamped = cx.builder.binary("maximum", value, &low);
                let clamped = cx.builder.binary("minimum", &clamped, &high);
                cx.builder.select(&finite, &clamped, &centre)
            };
            (clamp(cx, &x, planes.width), clamp(cx, &y, planes.height))
        }
        GridSamplePaddingModeIr::Reflection => (
            reflect(cx, &x, planes.width, align_corners),
            reflect(cx, &y, planes.height, align_corners),
        ),
    }
}

/// Whether each element is finite: `|v| < ∞` (false for NaN).
fn is_finite(cx: &mut Lowering, value: &Value) -> Value {
    let magnitude = cx.builder.unary("abs", value);
    let infinity = cx
        .builder
        .filled(value.element_type, f64::INFINITY, &value.dims);
    cx.builder.compare(Direction::Lt, &magnitude, &infinity)
}

/// A position reflected into `[0, size − 1]` (with `align_corners`) or `[−1/2, size − 1/2]`:
/// `span − |((|p − low|) mod 2·span) − span| + low`.
fn reflect(cx: &mut Lowering, position: &Value, size: i64, align_corners: bool) -> Value {
    let (low, high) = if align_corners {
        (0.0, size as f64 - 1.0)
    } else {
        (-0.5, size as f64 - 0.5)
    };
    let span = high - low;
    let element_type = position.element_type;
    let dims = position.dims.clone();
    if span <= 0.0 {
        return cx.builder.filled(element_type, low, &dims);
    }
    let constant = |cx: &mut Lowering, value: f64| cx.builder.filled(element_type, value, &dims);
    let low_value = constant(cx, low);
    let span_value = constant(cx, span);
    let period = constant(cx, 2.0 * span);
    let from_low = cx.builder.binary("subtract", position, &low_value);
    let distance = cx.builder.unary("abs", &from_low);
    let periods = cx.builder.binary("divide", &distance, &period);
    let periods = cx.builder.unary("floor", &periods);
    let whole = cx.builder.binary("multiply", &periods, &period);
    let within = cx.builder.binary("subtract", &distance, &whole);
    let from_span = cx.builder.binary("subtract", &within, &span_value);
    let from_span = cx.builder.unary("abs", &from_span);
    let reflected = cx.builder.binary("subtract", &span_value, &from_span);
    cx.builder.binary("add", &reflected, &low_value)
}

/// Reads the input planes at integer positions.
struct Sampler {
    /// The input as `[batch, channels, height · width]`, in the compute type.
    flat: Value,
    planes: Planes,
    /// Whether a position outside the input reads zero (else it reads the clamped position).
    zeros_outside: bool,
    wide: PrimitiveType,
}

impl Sampler {
    /// The input at integer positions `(column, row)` (`[batch, points]`, in the compute type),
    /// per channel (`[batch, channels, points]`).
    fn read(&self, cx: &mut Lowering, column: &Value, row: &Value) -> Value {
        let point_dims = self.planes.point_dims();
        let sample_dims = self.planes.sample_dims();
        let mut inside = None;
        let mut indices = Vec::new();
        for (position, size) in [(row, self.planes.height), (column, self.planes.width)] {
            let low = cx.builder.filled(self.wide, 0.0, &point_dims);
            let high = cx.builder.filled(self.wide, (size - 1) as f64, &point_dims);
            if self.zeros_outside {
                let above = cx.builder.compare(Direction::Ge, position, &low);
                let below = cx.builder.compare(Direction::Le, position, &high);
                let within = cx.builder.binary("and", &above, &below);
                inside = Some(match inside {
                    None => within,
                    Some(previous) => cx.builder.binary("and", &previous, &within),
                });
            }
            let clamped = cx.builder.binary("maximum", position, &low);
            let clamped = cx.builder.binary("minimum", &clamped, &high);
            indices.push(cx.builder.convert(&clamped, PrimitiveType::S32));
        }
        let width = cx
            .builder
            .filled(PrimitiveType::S32, self.planes.width as f64, &point_dims);
        let row_start = cx.builder.binary("multiply", &indices[0], &width);
        let index = cx.builder.binary("add", &row_start, &indices[1]);
        let index = cx.builder.broadcast(&index, &sample_dims, &[0, 2]);
        let values = gather_along(cx, &self.flat, &index, 2);
        match inside {
            Some(inside) => {
                let inside = cx.builder.broadcast(&inside, &sample_dims, &[0, 2]);
                let zero = cx.builder.filled(self.wide, 0.0, &sample_dims);
                cx.builder.select(&inside, &values, &zero)
            }
            None => values,
        }
    }

    /// The element nearest each point, ties to even.
    fn nearest(&self, cx: &mut Lowering, x: &Value, y: &Value) -> Value {
        let column = cx.builder.unary("round-nearest-even", x);
        let row = cx.builder.unary("round-nearest-even", y);
        self.read(cx, &column, &row)
    }

    /// The four elements around each point weighted by their distance to it.
    fn bilinear(&self, cx: &mut Lowering, x: &Value, y: &Value) -> Value {
        let point_dims = self.planes.point_dims();
        let sample_dims = self.planes.sample_dims();
        let left = cx.builder.unary("floor", x);
        let top = cx.builder.unary("floor", y);
        let one = cx.builder.filled(self.wide, 1.0, &point_dims);
        let right = cx.builder.binary("add", &left, &one);
        let bottom = cx.builder.binary("add", &top, &one);
        let x_fraction = cx.builder.binary("subtract", x, &left);
        let y_fraction = cx.builder.binary("subtract", y, &top);
        let x_complement = cx.builder.binary("subtract", &one, &x_fraction);
        let y_complement = cx.builder.binary("subtract", &one, &y_fraction);
        let corners = [
            (&left, &top, &x_complement, &y_complement),
            (&left, &bottom, &x_complement, &y_fraction),
            (&right, &top, &x_fraction, &y_complement),
            (&right, &bottom, &x_fraction, &y_fraction),
        ];
        let mut sum: Option<Value> = None;
        for (column, row, x_weight, y_weight) in corners {
            let weight = cx.builder.binary("multiply", x_weight, y_weight);
            let weight = cx.builder.broadcast(&weight, &sample_dims, &[0, 2]);
            let values = self.read(cx, column, row);
            let weighted = cx.builder.binary("multiply", &values, &weight);
            sum = Some(match sum {
                None => weighted,
                Some(previous) => cx.builder.binary("add", &previous, &weighted),
            });
        }
        sum.expect("four corners")
    }
}
