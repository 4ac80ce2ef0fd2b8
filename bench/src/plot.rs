//! Line charts rendered to PNG files: the bench's latency-against-load and
//! memory-against-connections plots.
//!
//! Owns: axis ranges (linear or log, padded, degenerate data handled), ticks,
//! the legend, and writing the PNG atomically (temp file, then rename).
//! Text is rendered with `ab_glyph`, so a TrueType font must be available at
//! runtime: `$BENCH_PLOT_FONT` if set, else DejaVu Sans or Liberation Sans
//! from their usual Debian/Ubuntu locations.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use anyhow::{anyhow, Context, Result};
use plotters::coord::combinators::{BindKeyPoints, LogCoord, WithKeyPoints};
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One line of the chart.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series {
    /// Legend label.
    pub name: String,
    /// `(x, y)` points, connected in the order given.
    pub points: Vec<(f64, f64)>,
}

/// A line chart description.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log_x: bool,
    pub log_y: bool,
    pub series: Vec<Series>,
}

const WIDTH: u32 = 800;
const HEIGHT: u32 = 500;
const FONT: &str = "sans-serif";
const FONT_ENV: &str = "BENCH_PLOT_FONT";
const FONT_PATHS: [&str; 2] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// Colour-blind friendly palette that also survives greyscale printing
/// reasonably well (Tableau 10 subset). Cycled for more than 8 series.
const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),  // blue
    RGBColor(214, 39, 40),   // red
    RGBColor(44, 160, 44),   // green
    RGBColor(255, 127, 14),  // orange
    RGBColor(148, 103, 189), // purple
    RGBColor(140, 86, 75),   // brown
    RGBColor(227, 119, 194), // pink
    RGBColor(23, 190, 207),  // cyan
];

/// Draws `chart` as an 800x500 PNG at `path` (parent dirs created).
///
/// The file is written to a temporary sibling and renamed into place, so
/// readers never see a half-written PNG and `path` may have any extension.
pub fn draw(chart: &Chart, path: &Path) -> Result<()> {
    ensure_font()?;

    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("creating directory {}", dir.display()))?;
    let file_name = path
        .file_name()
        .ok_or_else(|| anyhow!("not a file path: {}", path.display()))?;

    // plotters picks the image format from the extension, hence `.png`.
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let tmp = dir.join(format!(
        ".{}.{}-{}.tmp.png",
        file_name.to_string_lossy(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));

    let result = render(chart, &tmp).and_then(|()| {
        std::fs::rename(&tmp, path)
            .with_context(|| format!("moving {} to {}", tmp.display(), path.display()))
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.with_context(|| format!("drawing chart {:?} to {}", chart.title, path.display()))
}

/// Axis range for `values`, padded by ~5%.
///
/// Non-finite values are ignored; with `log` non-positive values are ignored
/// too and the range is snapped outwards to powers of ten. Never returns an
/// empty or inverted range: no usable values gives `(0, 1)` (linear) or
/// `(1, 10)` (log), and all-equal values are padded around the value.
fn range(values: &[f64], log: bool) -> (f64, f64) {
    let usable = values.iter().copied().filter(|&v| usable(v, log));
    let (lo, hi) = usable.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if lo > hi {
        return if log { (1.0, 10.0) } else { (0.0, 1.0) };
    }

    if log {
        const EPS: f64 = 1e-9;
        let (llo, lhi) = (lo.log10(), hi.log10());
        let pad = 0.05 * (lhi - llo);
        // EPS keeps rounding noise (log10(1000) = 2.9999999999999996) from
        // adding a decade; clamping keeps 10^e finite and non-zero.
        let mut a = (llo - pad + EPS).floor().clamp(-300.0, 299.0);
        let mut b = (lhi + pad - EPS).ceil().clamp(-299.0, 300.0);
        if a >= b {
            // A single value sitting exactly on a power of ten.
            a -= 1.0;
            b += 1.0;
        }
        return (pow10(a as i32), pow10(b as i32));
    }

    let span = hi - lo;
    let (mut a, mut b) = if span <= 1e-9 * lo.abs().max(hi.abs()) {
        // All (nearly) equal: pad around the value.
        let mid = lo + span / 2.0;
        let pad = if mid == 0.0 { 1.0 } else { mid.abs() * 0.1 };
        (mid - pad, mid + pad)
    } else {
        let pad = span * 0.05;
        (lo - pad, hi + pad)
    };
    if !a.is_finite() {
        a = lo;
    }
    if !b.is_finite() {
        b = hi;
    }
    // Don't let padding push all-positive data below zero (or vice versa).
    if lo >= 0.0 && a < 0.0 {
        a = 0.0;
    }
    if hi <= 0.0 && b > 0.0 {
        b = 0.0;
    }
    if a >= b {
        // Only reachable for values around +-f64::MAX.
        b = a + a.abs().max(1.0);
        if !b.is_finite() {
            a = -1.0;
            b = 1.0;
        }
    }
    (a, b)
}

fn usable(v: f64, log: bool) -> bool {
    v.is_finite() && (!log || v > 0.0)
}

/// Exactly the double nearest to 10^e (powi accumulates rounding error).
fn pow10(e: i32) -> f64 {
    format!("1e{e}").parse().unwrap_or(1.0)
}

/// Short tick label: plain decimals for moderate magnitudes, `2.5e6` style
/// otherwise; never `1000.0000000002`.
fn fmt_tick(v: f64) -> String {
    let a = v.abs();
    if v == 0.0 {
        return "0".to_string();
    }
    if !(1e-3..1e4).contains(&a) {
        let s = format!("{v:.2e}");
        let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let mant = trim_zeros(mant);
        return format!("{mant}e{exp}");
    }
    trim_zeros(&format!("{v:.4}")).to_string()
}

fn trim_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

/// Registers a sans-serif font with plotters once per process.
fn ensure_font() -> Result<()> {
    static REGISTERED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            let mut candidates = Vec::new();
            if let Some(p) = std::env::var_os(FONT_ENV).filter(|p| !p.is_empty()) {
                candidates.push(PathBuf::from(p));
            }
            candidates.extend(FONT_PATHS.iter().map(PathBuf::from));
            register_first_font(&candidates)
                .map(|_| ())
                .map_err(|e| format!("{e:#}"))
        })
        .clone()
        .map_err(|e| anyhow!(e))
}

/// Registers the first readable, parseable font in `candidates` as
/// sans-serif and returns its path; the error names every path tried.
fn register_first_font(candidates: &[PathBuf]) -> Result<PathBuf> {
    let mut tried = Vec::new();
    for path in candidates {
        match std::fs::read(path) {
            Ok(bytes) => {
                // Leaked on purpose: plotters needs &'static, and this
                // happens at most once per candidate per process.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                match plotters::style::register_font(FONT, FontStyle::Normal, bytes) {
                    Ok(()) => return Ok(path.clone()),
                    Err(_) => tried.push(format!("{} (not a valid font)", path.display())),
                }
            }
            Err(e) => tried.push(format!("{} ({e})", path.display())),
        }
    }
    Err(anyhow!(
        "no usable TrueType font for chart text; set {FONT_ENV} to a .ttf file \
         (tried: {})",
        if tried.is_empty() {
            "nothing".to_string()
        } else {
            tried.join(", ")
        }
    ))
}

fn plot_err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("plotting failed: {e}")
}

/// Draws the chart to `png` (which must end in `.png`).
fn render(chart: &Chart, png: &Path) -> Result<()> {
    // Only points drawable on both axes take part in ranges and lines.
    let data: Vec<Vec<(f64, f64)>> = chart
        .series
        .iter()
        .map(|s| {
            s.points
                .iter()
                .copied()
                .filter(|&(x, y)| usable(x, chart.log_x) && usable(y, chart.log_y))
                .collect()
        })
        .collect();
    let xs: Vec<f64> = data.iter().flatten().map(|p| p.0).collect();
    let ys: Vec<f64> = data.iter().flatten().map(|p| p.1).collect();
    let (x0, x1) = range(&xs, chart.log_x);
    let (y0, y1) = range(&ys, chart.log_y);

    let root = BitMapBackend::new(png, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    match (chart.log_x, chart.log_y) {
        (false, false) => render_on(&root, chart, &data, x0..x1, y0..y1)?,
        (false, true) => render_on(&root, chart, &data, x0..x1, log_axis(y0, y1))?,
        (true, false) => render_on(&root, chart, &data, log_axis(x0, x1), y0..y1)?,
        (true, true) => render_on(&root, chart, &data, log_axis(x0, x1), log_axis(y0, y1))?,
    }
    root.present().map_err(plot_err)?;
    Ok(())
}

/// Log axis over `lo..hi` (powers of ten from [`range`]) with our own ticks:
/// plotters' log ticks sometimes drop the first decade to rounding.
fn log_axis(lo: f64, hi: f64) -> WithKeyPoints<LogCoord<f64>> {
    let (bold, light) = log_ticks(lo, hi);
    (lo..hi)
        .log_scale()
        .with_key_points(bold)
        .with_light_points(light)
}

/// (labelled, grid-only) tick values for a log axis from `lo` to `hi`,
/// both powers of ten.
fn log_ticks(lo: f64, hi: f64) -> (Vec<f64>, Vec<f64>) {
    let a = lo.log10().round() as i32;
    let b = (hi.log10().round() as i32).max(a + 1);
    let decades = b - a;
    let (mut bold, mut light) = (Vec::new(), Vec::new());
    for e in a..b {
        let d = pow10(e);
        for k in 1..10 {
            let v = f64::from(k) * d;
            let labelled = match decades {
                1 => true,
                2 => matches!(k, 1 | 2 | 5),
                // Keep at most ~10 labels: every `step`-th decade.
                n => k == 1 && e.rem_euclid((n + 9) / 10) == 0,
            };
            // Minor lines within decades only while they stay readable.
            if labelled {
                bold.push(v);
            } else if decades <= 20 || (k == 1 && decades <= 60) {
                light.push(v);
            }
        }
    }
    let step = ((decades + 9) / 10).max(1);
    if decades <= 2 || b.rem_euclid(step) == 0 {
        bold.push(pow10(b));
    } else {
        light.push(pow10(b));
    }
    (bold, light)
}

fn render_on<X, Y>(
    root: &DrawingArea<BitMapBackend<'_>, Shift>,
    chart: &Chart,
    data: &[Vec<(f64, f64)>],
    x_spec: X,
    y_spec: Y,
) -> Result<()>
where
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let mut ctx = ChartBuilder::on(root)
        .caption(&chart.title, (FONT, 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(x_spec, y_spec)
        .map_err(plot_err)?;

    ctx.configure_mesh()
        .x_desc(chart.x_label.as_str())
        .y_desc(chart.y_label.as_str())
        .axis_desc_style((FONT, 16))
        .label_style((FONT, 13))
        .x_label_formatter(&|v| fmt_tick(*v))
        .y_label_formatter(&|v| fmt_tick(*v))
        .bold_line_style(RGBColor(215, 215, 215))
        .light_line_style(RGBColor(240, 240, 240))
        .max_light_lines(4)
        .draw()
        .map_err(plot_err)?;

    if data.iter().all(Vec::is_empty) {
        let ((l, t), (r, b)) = {
            let (xr, yr) = ctx.plotting_area().get_pixel_range();
            ((xr.start, yr.start), (xr.end, yr.end))
        };
        let style = TextStyle::from((FONT, 28).into_font())
            .color(&RGBColor(120, 120, 120))
            .pos(Pos::new(HPos::Center, VPos::Center));
        root.draw(&Text::new("no data", ((l + r) / 2, (t + b) / 2), style))
            .map_err(plot_err)?;
        return Ok(());
    }

    for (i, (series, points)) in chart.series.iter().zip(data).enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let line = color.stroke_width(2);
        let anno = ctx
            .draw_series(LineSeries::new(points.iter().copied(), line))
            .map_err(plot_err)?;
        if !series.name.is_empty() {
            anno.label(series.name.as_str()).legend(move |(x, y)| {
                EmptyElement::at((x, y))
                    + PathElement::new(vec![(0, 0), (20, 0)], line)
                    + Circle::new((10, 0), 3, color.filled())
            });
        }
        ctx.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(plot_err)?;
    }

    if chart.series.iter().any(|s| !s.name.is_empty()) {
        ctx.configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .margin(10)
            .legend_area_size(26)
            .label_font((FONT, 14))
            .background_style(WHITE.mix(0.9))
            .border_style(RGBColor(160, 160, 160))
            .draw()
            .map_err(plot_err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
