//! The chart the `contention` and `realclient` benches draw: goodput and p99 latency against
//! the number of clients, one line per contender, side by side, with a legend.

use std::path::Path;

use plotters::prelude::*;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One contender's line: its legend label, its style, and its points (clients, value).
pub(crate) struct Line {
    pub(crate) label: String,
    pub(crate) style: ShapeStyle,
    pub(crate) goodput: Vec<(f64, f64)>,
    pub(crate) p99_ms: Vec<(f64, f64)>,
}

impl Line {
    /// A line whose points are given in any order (they are sorted by client count); p99
    /// values below 0.1 ms are drawn at 0.1 ms (the axis is logarithmic).
    pub(crate) fn new(
        label: String,
        style: ShapeStyle,
        mut goodput: Vec<(f64, f64)>,
        mut p99_ms: Vec<(f64, f64)>,
    ) -> Self {
        goodput.sort_by(|a, b| a.0.total_cmp(&b.0));
        p99_ms.sort_by(|a, b| a.0.total_cmp(&b.0));
        for p in &mut p99_ms {
            p.1 = p.1.max(0.1);
        }
        Self {
            label,
            style,
            goodput,
            p99_ms,
        }
    }
}

/// The axes' texts.
pub(crate) struct Labels<'a> {
    pub(crate) title: &'a str,
    /// What the x axis counts (`connections`, `concurrent clients`).
    pub(crate) clients: &'a str,
    pub(crate) goodput_caption: &'a str,
}

/// Draws the chart to `path` (SVG); nothing when there is no point.
pub(crate) fn goodput_and_p99(
    path: &Path,
    labels: &Labels<'_>,
    lines: &[Line],
) -> Result<(), BoxError> {
    let mut clients: Vec<f64> = lines
        .iter()
        .flat_map(|l| l.goodput.iter().chain(&l.p99_ms).map(|p| p.0))
        .collect();
    clients.sort_by(f64::total_cmp);
    clients.dedup();
    let (Some(&first), Some(&last)) = (clients.first(), clients.last()) else {
        return Ok(());
    };
    let (x_min, x_max) = (first / 1.4, last * 1.4);
    let max_goodput = lines
        .iter()
        .flat_map(|l| l.goodput.iter().map(|p| p.1))
        .fold(1.0, f64::max);
    let p99s = || lines.iter().flat_map(|l| l.p99_ms.iter().map(|p| p.1));
    let p99_min = p99s().fold(f64::INFINITY, f64::min) / 1.5;
    let p99_max = p99s().fold(1.0, f64::max) * 1.5;

    let root = SVGBackend::new(path, (1500, 620)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(labels.title, ("sans-serif", 20))?;
    let (charts, legend) = root.split_horizontally(1220);
    let (left, right) = charts.split_horizontally(610);

    let mut goodput = ChartBuilder::on(&left)
        .caption(labels.goodput_caption, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(
            (x_min..x_max).log_scale().with_key_points(clients.clone()),
            0.0..max_goodput * 1.1,
        )?;
    goodput
        .configure_mesh()
        .x_desc(labels.clients)
        .y_desc("writes/s")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()?;
    let mut p99 = ChartBuilder::on(&right)
        .caption(
            "p99 latency (ms, log scale, all requests)",
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(
            (x_min..x_max).log_scale().with_key_points(clients),
            (p99_min..p99_max).log_scale(),
        )?;
    p99.configure_mesh()
        .x_desc(labels.clients)
        .y_desc("ms")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()?;
    for (i, line) in lines.iter().enumerate() {
        let st = line.style;
        goodput.draw_series(LineSeries::new(line.goodput.clone(), st))?;
        goodput.draw_series(line.goodput.iter().map(|p| Circle::new(*p, 3, st.filled())))?;
        p99.draw_series(LineSeries::new(line.p99_ms.clone(), st))?;
        p99.draw_series(line.p99_ms.iter().map(|p| Circle::new(*p, 3, st.filled())))?;
        let y = 70 + 26 * i as i32;
        legend.draw(&PathElement::new(vec![(10, y), (40, y)], st))?;
        legend.draw(&Text::new(
            line.label.clone(),
            (48, y - 8),
            ("sans-serif", 14),
        ))?;
    }
    root.present()?;
    Ok(())
}
