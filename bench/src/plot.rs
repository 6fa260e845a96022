//! SVG plots of a report (plotters, SVG backend): one chart per metric with
//! every sample of every variant as a dot, the median as a bar and the
//! min–max range as a line; and for metrics measured at several sizes
//! (names ending in `_n<N>`), the medians against N on a log axis; and the
//! report's cell charts ([`CellChart`]): per panel, every variant's samples
//! and median in each cell.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use plotters::prelude::*;

use crate::{CellChart, CellPanel, Report, Series};

const PALETTE: [RGBColor; 6] = [
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
];

fn slug(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect::<String>()
        .split('-')
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("-")
}

/// A metric name as a file name part: `throughput_gbps (nic)` →
/// `throughput_gbps-nic`.
fn file_part(metric: &str) -> String {
    metric
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("-")
}

fn err(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

/// A metric measured at size N: (N, variant → samples).
type SizedSeries<'a> = (f64, &'a BTreeMap<String, Series>);

/// `name_n123` → (`name`, 123).
fn sized(metric: &str) -> Option<(&str, f64)> {
    let (base, n) = metric.rsplit_once("_n")?;
    n.parse::<u32>().ok().map(|n| (base, f64::from(n)))
}

/// Writes the report's SVGs into `dir`; returns their paths.
pub fn write_svgs(dir: &Path, report: &Report) -> std::io::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let name = slug(&report.name);
    for (metric, by_variant) in &report.metrics {
        let path = dir.join(format!("{name}-{}.svg", file_part(metric)));
        metric_chart(&path, report, metric, by_variant)?;
        written.push(path);
    }
    // metric families over N.
    let mut families: BTreeMap<&str, Vec<SizedSeries<'_>>> = BTreeMap::new();
    for (metric, by_variant) in &report.metrics {
        if let Some((base, n)) = sized(metric) {
            families.entry(base).or_default().push((n, by_variant));
        }
    }
    for (base, mut points) in families {
        if points.len() < 2 {
            continue;
        }
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let path = dir.join(format!("{name}-{}-vs-n.svg", file_part(base)));
        family_chart(&path, report, base, &points)?;
        written.push(path);
    }
    for chart in &report.cell_charts {
        let path = dir.join(format!("{name}-{}.svg", slug(&chart.file)));
        cell_chart(&path, report, chart)?;
        written.push(path);
    }
    Ok(written)
}

/// A [`CellChart`]: the panels stacked, each with its cells along x.
fn cell_chart(path: &Path, report: &Report, chart: &CellChart) -> std::io::Result<()> {
    let panels = chart.panels.len().max(1);
    let height = 330 * u32::try_from(panels).unwrap_or(1) + 40;
    let root = SVGBackend::new(path, (1100, height)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let root = root
        .titled(
            &format!("{} — {}", report.name, chart.title),
            ("sans-serif", 18),
        )
        .map_err(err)?;
    for (panel, area) in chart.panels.iter().zip(root.split_evenly((panels, 1))) {
        cell_panel(&area, report, panel)?;
    }
    root.present().map_err(err)
}

/// A panel's y axis: linear from 0 (or below, for negative values), or
/// in decades when every value is positive and they span more than 30×
/// (e.g. a limit that is not enforced next to one that is).
#[derive(Clone, Copy)]
struct YAxis {
    log: bool,
    lo: f64,
    hi: f64,
}

impl YAxis {
    fn new(values: &[f64]) -> Self {
        let (min, max) = values
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
                (a.min(*v), b.max(*v))
            });
        if values.is_empty() {
            return Self {
                log: false,
                lo: 0.0,
                hi: 1.0,
            };
        }
        if min > 0.0 && max / min > 30.0 {
            return Self {
                log: true,
                lo: min.log10().floor(),
                hi: max.log10().ceil().max(min.log10().floor() + 1.0),
            };
        }
        let hi = if max > 0.0 { max * 1.15 } else { 1.0 };
        let lo = if min < 0.0 { min * 1.15 } else { 0.0 };
        Self { log: false, lo, hi }
    }

    /// Where `v` is drawn (`None`: not drawable on a log axis).
    fn at(&self, v: f64) -> Option<f64> {
        match (self.log, v.is_finite()) {
            (_, false) => None,
            (true, _) if v <= 0.0 => None,
            (true, _) => Some(v.log10()),
            (false, _) => Some(v),
        }
    }
}

fn cell_panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    report: &Report,
    panel: &CellPanel,
) -> std::io::Result<()> {
    let samples = |metric: &str, v: &str| {
        report
            .metrics
            .get(metric)
            .and_then(|m| m.get(v))
            .map_or(&[][..], |s| s.samples.as_slice())
    };
    let mut values: Vec<f64> = panel
        .cells
        .iter()
        .flat_map(|(_, m)| report.variants.iter().flat_map(move |v| samples(m, v)))
        .copied()
        .filter(|v| v.is_finite())
        .collect();
    if let Some((lo, hi)) = panel.band {
        values.extend([lo, hi]);
    }
    let y = YAxis::new(&values);
    let n = panel.cells.len().max(1);
    let mut chart = ChartBuilder::on(area)
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), y.lo..y.hi)
        .map_err(err)?;
    let labels: Vec<String> = panel.cells.iter().map(|(l, _)| l.clone()).collect();
    let log = y.log;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n + 1)
        .x_label_style(("sans-serif", 11))
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 0.01 && i >= 0.0 {
                labels.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|v| {
            if log {
                // Decades only.
                let d = v.round();
                if (v - d).abs() < 1e-6 {
                    format!("{}", 10f64.powi(d as i32))
                } else {
                    String::new()
                }
            } else {
                format!("{v:.3}")
                    .trim_end_matches('0')
                    .trim_end_matches('.')
                    .to_owned()
            }
        })
        .y_desc(if log {
            format!("{} (log)", panel.y_desc)
        } else {
            panel.y_desc.clone()
        })
        .draw()
        .map_err(err)?;
    if let Some((lo, hi)) = panel.band
        && let (Some(lo), Some(hi)) = (y.at(lo), y.at(hi))
    {
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(-0.5, lo), (n as f64 - 0.5, hi)],
                GREEN.mix(0.15).filled(),
            )))
            .map_err(err)?;
    }
    let nv = report.variants.len().max(1);
    let width = 0.7 / nv as f64;
    let base = if y.log { y.lo } else { 0f64.max(y.lo) };
    for (vi, v) in report.variants.iter().enumerate() {
        let color = PALETTE[vi % PALETTE.len()];
        let offset = (vi as f64 - (nv as f64 - 1.0) / 2.0) * width;
        let bars: Vec<_> = panel
            .cells
            .iter()
            .enumerate()
            .filter_map(|(i, (_, m))| {
                let median = Series {
                    samples: samples(m, v).to_vec(),
                }
                .median();
                let x = i as f64 + offset;
                y.at(median).map(|top| {
                    Rectangle::new(
                        [(x - width * 0.4, base), (x + width * 0.4, top)],
                        color.mix(0.35).filled(),
                    )
                })
            })
            .collect();
        chart
            .draw_series(bars)
            .map_err(err)?
            .label(v.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
        let dots: Vec<_> = panel
            .cells
            .iter()
            .enumerate()
            .flat_map(|(i, (_, m))| {
                samples(m, v)
                    .iter()
                    .filter_map(move |s| y.at(*s).map(|s| (i as f64 + offset, s)))
            })
            .map(|p| Circle::new(p, 3, color.filled()))
            .collect();
        chart.draw_series(dots).map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(err)
}

fn better(report: &Report, metric: &str) -> String {
    report
        .better
        .get(metric)
        .map_or_else(String::new, |b| format!(" ({b} is better)"))
}

fn metric_chart(
    path: &Path,
    report: &Report,
    metric: &str,
    by_variant: &BTreeMap<String, Series>,
) -> std::io::Result<()> {
    let variants: Vec<&String> = report
        .variants
        .iter()
        .filter(|v| by_variant.contains_key(*v))
        .collect();
    if variants.is_empty() {
        return Ok(());
    }
    let top = by_variant
        .values()
        .flat_map(|s| s.samples.iter().copied())
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    let top = if top > 0.0 { top * 1.15 } else { 1.0 };
    let root = SVGBackend::new(path, (760, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let title = format!("{} — {metric}{}", report.name, better(report, metric));
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5f64..(variants.len() as f64 - 0.5), 0f64..top)
        .map_err(err)?;
    let labels: Vec<String> = variants.iter().map(|v| (*v).clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(variants.len())
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 0.01 && i >= 0.0 {
                labels.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc(metric)
        .draw()
        .map_err(err)?;
    for (i, v) in variants.iter().enumerate() {
        let s = &by_variant[*v];
        let x = i as f64;
        let color = PALETTE[i % PALETTE.len()];
        let median = s.median();
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(x - 0.3, 0.0), (x + 0.3, median)],
                color.mix(0.25).filled(),
            )))
            .map_err(err)?;
        let (lo, hi) = s.spread();
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(x, lo), (x, hi)],
                color.stroke_width(2),
            )))
            .map_err(err)?;
        chart
            .draw_series(
                s.samples
                    .iter()
                    .map(|v| Circle::new((x, *v), 3, color.filled())),
            )
            .map_err(err)?;
    }
    root.present().map_err(err)
}

fn family_chart(
    path: &Path,
    report: &Report,
    base: &str,
    points: &[SizedSeries<'_>],
) -> std::io::Result<()> {
    let (lo_n, hi_n) = (points[0].0, points[points.len() - 1].0);
    let top = points
        .iter()
        .flat_map(|(_, m)| m.values().map(Series::median))
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max)
        * 1.15;
    let top = if top > 0.0 { top } else { 1.0 };
    let root = SVGBackend::new(path, (760, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let title = format!(
        "{} — {base} vs N{}",
        report.name,
        better(report, &format!("{base}_n{}", points[0].0))
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(70)
        .build_cartesian_2d((lo_n.max(1.0)..hi_n * 1.5).log_scale(), 0f64..top)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("N (log)")
        .y_desc(base)
        .draw()
        .map_err(err)?;
    for (i, v) in report.variants.iter().enumerate() {
        let line: Vec<(f64, f64)> = points
            .iter()
            .filter_map(|(n, m)| m.get(v).map(|s| (n.max(1.0), s.median())))
            .collect();
        if line.is_empty() {
            continue;
        }
        let color = PALETTE[i % PALETTE.len()];
        chart
            .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))
            .map_err(err)?
            .label(v.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        chart
            .draw_series(line.iter().map(|p| Circle::new(*p, 4, color.filled())))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_chart_per_metric_and_per_family() {
        let mut r = Report {
            name: "hostPort vs N".into(),
            variants: vec!["rivet".into(), "iptables".into()],
            baseline: "iptables".into(),
            ..Default::default()
        };
        for (n, rivet, ipt) in [(1, 95.0, 107.0), (1000, 94.0, 161.0), (10_000, 99.0, 439.0)] {
            r.add(&format!("p50_us_n{n}"), "rivet", rivet);
            r.add(&format!("p50_us_n{n}"), "iptables", ipt);
        }
        let dir = std::env::temp_dir().join(format!("rivet-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let files = write_svgs(&dir, &r).expect("svgs");
        assert_eq!(files.len(), 4, "{files:?}");
        assert_eq!(file_part("throughput_gbps (nic)"), "throughput_gbps-nic");
        let family =
            std::fs::read_to_string(dir.join("hostport-vs-n-p50_us-vs-n.svg")).expect("family");
        assert!(
            family.starts_with("<svg") && family.contains("iptables"),
            "legend"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn writes_a_cell_chart() {
        let mut r = Report {
            name: "bandwidth".into(),
            variants: vec!["rivet".into(), "reference".into()],
            baseline: "reference".into(),
            ..Default::default()
        };
        for (cell, rivet, reference) in [("a", 1.0, 0.95), ("b", 400.0, 0.97)] {
            r.add(&format!("accuracy ({cell})"), "rivet", rivet);
            r.add(&format!("accuracy ({cell})"), "reference", reference);
            r.add(&format!("added_ms ({cell})"), "rivet", -0.2);
            r.add(&format!("added_ms ({cell})"), "reference", 80.0);
        }
        let panel = |y: &str, metric: &str, band| CellPanel {
            y_desc: y.into(),
            cells: ["a", "b"]
                .iter()
                .map(|c| ((*c).to_owned(), format!("{metric} ({c})")))
                .collect(),
            band,
        };
        r.cell_charts.push(CellChart {
            file: "cells".into(),
            title: "per cell".into(),
            panels: vec![
                panel("accuracy", "accuracy", Some((0.9, 1.02))),
                panel("ms", "added_ms", None),
            ],
        });
        let dir = std::env::temp_dir().join(format!("rivet-plot-cells-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let files = write_svgs(&dir, &r).expect("svgs");
        let chart = std::fs::read_to_string(dir.join("bandwidth-cells.svg")).expect("cell chart");
        assert!(files.len() == 5, "{files:?}");
        assert!(
            chart.contains("reference") && chart.contains("(log)"),
            "legend, log axis"
        );
        let _ = std::fs::remove_dir_all(&dir);
        assert!(YAxis::new(&[-1.0, 2.0]).lo < 0.0);
        assert!(!YAxis::new(&[1.0, 2.0]).log);
    }
}
