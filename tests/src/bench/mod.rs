//! Benchmark plumbing: variants measured interleaved (A B C … A B C …),
//! medians and spread, ratios to a baseline from the same run, results as
//! JSON and Markdown under `target/bench/<timestamp>/`.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
};

use serde::Serialize;

pub mod cni;
pub mod conn;
pub mod control;
pub mod guard;
pub mod nat;
pub mod overlay;
pub mod plot;
pub mod pps;
pub mod progcost;
pub mod same_node;

/// Sizes of a run.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Interleaved measured rounds.
    pub rounds: u32,
    /// Seconds per throughput sample.
    pub secs: u32,
    /// Pods per CNI measurement.
    pub pods: usize,
}

/// One-line progress on stderr (overwritten in place).
pub fn progress(text: &str) {
    use std::io::Write as _;
    eprint!("\r\x1b[2K{text}");
    let _ = std::io::stderr().flush();
}

/// Samples of one metric for one variant.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Series {
    /// Every sample, in measurement order.
    pub samples: Vec<f64>,
}

impl Series {
    /// Median (NaN when empty).
    pub fn median(&self) -> f64 {
        percentile(&self.samples, 50.0)
    }

    /// (min, max).
    pub fn spread(&self) -> (f64, f64) {
        let min = self.samples.iter().copied().fold(f64::INFINITY, f64::min);
        let max = self
            .samples
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        (min, max)
    }
}

/// Median of per-round ratios `a[i] / b[i]`: samples of the same round were
/// taken back to back, so machine drift between rounds cancels out.
pub fn paired_ratio(a: &Series, b: &Series) -> f64 {
    let ratios: Vec<f64> = a
        .samples
        .iter()
        .zip(&b.samples)
        .filter(|(_, y)| **y != 0.0)
        .map(|(x, y)| x / y)
        .collect();
    percentile(&ratios, 50.0)
}

/// Linear-interpolated percentile of unsorted samples.
pub fn percentile(samples: &[f64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = (p / 100.0) * (v.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    v[lo] + (v[hi] - v[lo]) * (rank - lo as f64)
}

/// One benchmark's results: metric → variant → samples.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Benchmark name.
    pub name: String,
    /// Variant names in display order.
    pub variants: Vec<String>,
    /// Baseline variant for ratios.
    pub baseline: String,
    /// metric → variant → samples.
    pub metrics: BTreeMap<String, BTreeMap<String, Series>>,
    /// metric → "higher" or "lower" (which is better).
    pub better: BTreeMap<String, String>,
    /// Free-form notes (setup facts).
    pub notes: Vec<String>,
}

impl Report {
    /// Records one sample.
    pub fn add(&mut self, metric: &str, variant: &str, value: f64) {
        self.metrics
            .entry(metric.to_owned())
            .or_default()
            .entry(variant.to_owned())
            .or_default()
            .samples
            .push(value);
    }

    /// Markdown table: per metric, median, spread and ratio to the baseline.
    pub fn markdown(&self) -> String {
        let mut s = format!("## {}\n\n", self.name);
        for (metric, by_variant) in &self.metrics {
            let base = by_variant.get(&self.baseline).map(Series::median);
            let better = self.better.get(metric).map_or("", String::as_str);
            let _ = writeln!(
                s,
                "| {metric} ({better} is better) | median | min | max | n | × {b} (medians) | × {b} (paired) |\n|---|---:|---:|---:|---:|---:|---:|",
                b = self.baseline
            );
            for v in &self.variants {
                let Some(series) = by_variant.get(v) else {
                    continue;
                };
                let (min, max) = series.spread();
                let ratio = base.map_or(f64::NAN, |b| series.median() / b);
                let paired = by_variant
                    .get(&self.baseline)
                    .map_or(f64::NAN, |b| paired_ratio(series, b));
                let _ = writeln!(
                    s,
                    "| {v} | {:.3} | {min:.3} | {max:.3} | {} | {ratio:.3} | {paired:.3} |",
                    series.median(),
                    series.samples.len()
                );
            }
            s.push('\n');
        }
        for n in &self.notes {
            let _ = writeln!(s, "- {n}");
        }
        s
    }
}

/// Machine facts recorded with every run.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// `uname -r`.
    pub kernel: String,
    /// CPU model.
    pub cpu: String,
    /// Online CPUs.
    pub cpus: usize,
    /// rivet version.
    pub rivet: String,
    /// iperf3 version line.
    pub iperf3: String,
}

impl Machine {
    /// Reads the facts.
    pub fn read() -> Self {
        let cmd = |p: &str, a: &[&str]| {
            Command::new(p)
                .args(a)
                .output()
                .map(|o| {
                    String::from_utf8_lossy(&o.stdout)
                        .lines()
                        .next()
                        .unwrap_or("")
                        .trim()
                        .to_owned()
                })
                .unwrap_or_default()
        };
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .unwrap_or_default()
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name")
                    .map(|r| r.trim_start_matches([' ', '\t', ':']).to_owned())
            })
            .unwrap_or_default();
        Self {
            kernel: cmd("uname", &["-r"]),
            cpu,
            cpus: std::thread::available_parallelism().map_or(1, usize::from),
            rivet: env!("CARGO_PKG_VERSION").to_owned(),
            iperf3: cmd("iperf3", &["--version"]),
        }
    }
}

/// UTC timestamp `YYYYmmdd-HHMMSS` (no time crate needed).
pub fn timestamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Output directory `target/bench/<timestamp>/` under the workspace.
pub fn out_dir() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    root.join("target/bench").join(timestamp())
}

/// Writes `report.json` and `report.md` into `dir`.
pub fn write(dir: &Path, machine: &Machine, reports: &[Report]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let json = serde_json::json!({ "machine": machine, "reports": reports });
    std::fs::write(dir.join("report.json"), serde_json::to_vec_pretty(&json)?)?;
    let mut md = format!(
        "# rivet benchmarks\n\nkernel {}, {} × {}, rivet {}, {}\n\n",
        machine.kernel, machine.cpus, machine.cpu, machine.rivet, machine.iperf3
    );
    for r in reports {
        md.push_str(&r.markdown());
        md.push('\n');
    }
    std::fs::write(dir.join("report.md"), md)?;
    for r in reports {
        plot::write_svgs(dir, r)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 50.0), 2.0);
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 50.0), 2.5);
        assert!(percentile(&[], 50.0).is_nan());
        assert_eq!(percentile(&[5.0], 99.0), 5.0);
    }

    #[test]
    fn timestamp_shape() {
        let t = timestamp();
        assert_eq!(t.len(), 15, "{t}");
        assert_eq!(&t[8..9], "-");
        assert!(t.starts_with("20"));
    }

    #[test]
    fn markdown_has_ratios() {
        let mut r = Report {
            name: "x".into(),
            variants: vec!["a".into(), "b".into()],
            baseline: "a".into(),
            ..Default::default()
        };
        r.add("gbps", "a", 2.0);
        r.add("gbps", "b", 3.0);
        let md = r.markdown();
        assert!(
            md.contains("| b | 3.000 | 3.000 | 3.000 | 1 | 1.500 |"),
            "{md}"
        );
    }
}
