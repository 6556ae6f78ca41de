//! The comparison chart: TTFT CDF per policy, as SVG (plotters).

use std::path::Path;

use plotters::prelude::*;

use super::Error;

/// Colours per series, in order.
const COLOURS: [RGBColor; 6] = [RED, BLUE, GREEN, MAGENTA, CYAN, BLACK];

/// Writes an SVG of the empirical TTFT CDF of each `(policy, sorted TTFTs)` series.
pub fn ttft_cdf(path: &Path, series: &[(String, Vec<f64>)]) -> Result<(), Error> {
    let max = series
        .iter()
        .filter_map(|(_, v)| v.last().copied())
        .fold(0.0f64, f64::max)
        .max(0.001);
    let chart_err =
        |e: &dyn std::fmt::Display| Error::Setup(format!("chart {}: {e}", path.display()));
    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| chart_err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Time to first token (CDF, modelled seconds)",
            ("sans-serif", 24),
        )
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..max * 1.02, 0.0..1.0)
        .map_err(|e| chart_err(&e))?;
    chart
        .configure_mesh()
        .x_desc("TTFT (s)")
        .y_desc("fraction of requests")
        .draw()
        .map_err(|e| chart_err(&e))?;
    for (i, (name, sorted)) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let n = sorted.len().max(1) as f64;
        let points = sorted
            .iter()
            .enumerate()
            .map(|(k, t)| (*t, (k + 1) as f64 / n));
        chart
            .draw_series(LineSeries::new(points, colour.stroke_width(2)))
            .map_err(|e| chart_err(&e))?
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
        .map_err(|e| chart_err(&e))?;
    root.present().map_err(|e| chart_err(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_an_svg_with_one_line_per_policy() {
        let path =
            std::env::temp_dir().join(format!("warmpath-chart-test-{}.svg", std::process::id()));
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
}
