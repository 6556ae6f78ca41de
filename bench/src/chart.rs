//! Benchmark charts (plotters), as SVG or PNG by the file's extension: the TTFT CDF per series,
//! and for a rate ladder p90 TTFT and output throughput against the offered rate.
//!
//! Text is drawn with a TrueType font found on the machine (DejaVu Sans, Debian's
//! `fonts-dejavu-core`, which `cargo xtask setup` installs) or named by `WARMPATH_FONT`.

use std::{path::Path, sync::OnceLock};

use plotters::{coord::Shift, prelude::*};

use super::Error;

/// Colours per series, in order (distinct for up to ten series).
const COLOURS: [RGBColor; 10] = [
    RED,
    BLUE,
    GREEN,
    MAGENTA,
    CYAN,
    BLACK,
    RGBColor(255, 140, 0),
    RGBColor(139, 69, 19),
    RGBColor(128, 128, 128),
    RGBColor(128, 128, 0),
];
/// Chart size in pixels.
const SIZE: (u32, u32) = (960, 600);
/// Where fonts are looked for, in order (after `WARMPATH_FONT`).
const FONT_PATHS: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// Registers a font for "sans-serif" once; the error says what to install.
fn ensure_font() -> Result<(), Error> {
    static FONT: OnceLock<Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let candidates = std::env::var("WARMPATH_FONT")
            .ok()
            .into_iter()
            .chain(FONT_PATHS.iter().map(|s| s.to_string()));
        for path in candidates {
            if let Ok(bytes) = std::fs::read(&path) {
                // Registered once for the life of the process.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return Ok(());
                }
            }
        }
        Err("charts need a TrueType font: install fonts-dejavu-core (cargo xtask setup does) or set WARMPATH_FONT=/path/to/font.ttf".into())
    })
    .clone()
    .map_err(Error::Setup)
}

/// Draws with the backend the extension asks for.
fn render(
    path: &Path,
    draw: impl Fn(&DrawingArea<SVGBackend<'_>, Shift>) -> Result<(), String>,
    draw_png: impl Fn(&DrawingArea<BitMapBackend<'_>, Shift>) -> Result<(), String>,
) -> Result<(), Error> {
    ensure_font()?;
    let fail = |e: String| Error::Setup(format!("chart {}: {e}", path.display()));
    match path.extension().and_then(|e| e.to_str()) {
        Some("png") => {
            let root = BitMapBackend::new(path, SIZE).into_drawing_area();
            draw_png(&root).map_err(fail)?;
            root.present().map_err(|e| fail(e.to_string()))
        }
        _ => {
            let root = SVGBackend::new(path, SIZE).into_drawing_area();
            draw(&root).map_err(fail)?;
            root.present().map_err(|e| fail(e.to_string()))
        }
    }
}

fn cdf<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    series: &[(String, Vec<f64>)],
) -> Result<(), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let max = series
        .iter()
        .filter_map(|(_, v)| v.last().copied())
        .fold(0.0f64, f64::max)
        .max(0.001);
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut chart = ChartBuilder::on(root)
        .caption("Time to first token (CDF)", ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..max * 1.02, 0.0..1.0)
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc("TTFT (s)")
        .y_desc("fraction of requests")
        .draw()
        .map_err(|x| e(&x))?;
    for (i, (name, sorted)) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let n = sorted.len().max(1) as f64;
        let points = sorted
            .iter()
            .enumerate()
            .map(|(k, t)| (*t, (k + 1) as f64 / n));
        chart
            .draw_series(LineSeries::new(points, colour.stroke_width(2)))
            .map_err(|x| e(&x))?
            .label(name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|x| e(&x))
}

/// Which figure of a `(rate, p90 TTFT, throughput)` point a panel plots.
type LadderPick = fn(&(f64, f64, f64)) -> f64;

fn ladder_chart<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    points: &[(f64, f64, f64)],
) -> Result<(), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let (left, right) = root.split_horizontally(SIZE.0 / 2);
    let max_rate = points.iter().map(|p| p.0).fold(0.0f64, f64::max).max(0.001) * 1.1;
    let p90: LadderPick = |p| p.1;
    let throughput: LadderPick = |p| p.2;
    let panels = [
        (&left, "p90 TTFT vs offered rate", "p90 TTFT (s)", p90),
        (
            &right,
            "Output throughput vs offered rate",
            "output tokens/s",
            throughput,
        ),
    ];
    for (area, title, y_desc, pick) in panels {
        let max_y = points
            .iter()
            .map(&pick)
            .filter(|v| v.is_finite())
            .fold(0.0f64, f64::max)
            .max(0.001)
            * 1.1;
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..max_rate, 0.0..max_y)
            .map_err(|x| e(&x))?;
        chart
            .configure_mesh()
            .x_desc("offered rate (req/s)")
            .y_desc(y_desc)
            .draw()
            .map_err(|x| e(&x))?;
        let series: Vec<(f64, f64)> = points
            .iter()
            .map(|p| (p.0, pick(p)))
            .filter(|p| p.1.is_finite())
            .collect();
        chart
            .draw_series(LineSeries::new(series.clone(), BLUE.stroke_width(2)))
            .map_err(|x| e(&x))?;
        chart
            .draw_series(series.into_iter().map(|p| Circle::new(p, 4, BLUE.filled())))
            .map_err(|x| e(&x))?;
    }
    Ok(())
}

/// The empirical TTFT CDF of each `(name, sorted TTFTs)` series.
pub fn ttft_cdf(path: &Path, series: &[(String, Vec<f64>)]) -> Result<(), Error> {
    render(path, |r| cdf(r, series), |r| cdf(r, series))
}

/// p90 TTFT and output throughput per offered rate: `(rate, p90 TTFT, output tokens/s)`.
pub fn ladder(path: &Path, points: &[(f64, f64, f64)]) -> Result<(), Error> {
    render(
        path,
        |r| ladder_chart(r, points),
        |r| ladder_chart(r, points),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("warmpath-chart-{}-{name}", std::process::id()))
    }

    #[test]
    fn writes_an_svg_with_one_line_per_policy() {
        let path = tmp("cdf.svg");
        let series = vec![
            ("RoundRobin".to_string(), vec![0.5, 1.0, 2.0]),
            ("Precise".to_string(), vec![0.1, 0.2, 0.3]),
        ];
        ttft_cdf(&path, &series).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("RoundRobin") && svg.contains("Precise"));
        // The mesh is drawn with polylines too: look for the series' own stroke colours.
        assert!(
            svg.contains("#FF0000") && svg.contains("#0000FF"),
            "red and blue series: {svg}"
        );
    }

    #[test]
    fn writes_pngs_of_both_charts() {
        for (name, f) in [
            (
                "cdf.png",
                Box::new(|p: &Path| ttft_cdf(p, &[("all".into(), vec![0.1, 0.4])]))
                    as Box<dyn Fn(&Path) -> Result<(), Error>>,
            ),
            (
                "ladder.png",
                Box::new(|p: &Path| ladder(p, &[(1.0, 0.1, 50.0), (2.0, 0.3, 90.0)])),
            ),
        ] {
            let path = tmp(name);
            f(&path).unwrap();
            let png = std::fs::read(&path).unwrap();
            std::fs::remove_file(&path).unwrap();
            assert!(png.starts_with(b"\x89PNG\r\n"), "{name}");
            assert!(png.len() > 5_000, "{name}: {} bytes", png.len());
        }
    }
}
