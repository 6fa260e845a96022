//! SVG plots of a report (plotters, SVG backend): one chart per metric with
//! every sample of every variant as a dot, the median as a bar and the
//! min–max range as a line; and for metrics measured at several sizes
//! (names ending in `_n<N>`), the medians against N on a log axis.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use plotters::prelude::*;

use crate::{Report, Series};

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
    Ok(written)
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
}
