//! rivet's benchmarks (`rivet-bench`, run by `cargo xtask bench`; method
//! and results in BENCHMARKS.md): one module per benchmark, each building
//! its own world with the harness of `rivet-tests` (namespaces, agents,
//! traffic, packets, `BPF_PROG_TEST_RUN`), interleaving variants and
//! writing `report.json`, `report.md` and SVG plots ([`plot`]).
//!
//! This module is the plumbing: variants measured interleaved (A B C,
//! B C A, C A B, …: each round starts one variant later), medians and
//! spread, ratios to a baseline from the same run, the kernel settings
//! every variant runs with, results as JSON and Markdown under
//! `target/bench/<timestamp>/`.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
};

use serde::Serialize;

use rivet_tests::{Netns, World};

pub mod bandwidth;
pub mod bgp;
pub mod cni;
pub mod conn;
pub mod control;
pub mod nat;
pub mod overlay;
pub mod plot;
pub mod policy;
pub mod pps;
pub mod progcost;
pub mod same_node;
pub mod services;

/// Sizes of a run.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Interleaved measured rounds.
    pub rounds: u32,
    /// Seconds per throughput sample.
    pub secs: u32,
    /// Pods per CNI measurement.
    pub pods: usize,
    /// A smoke run (`--quick`): benchmarks shorten their probes, warm-ups
    /// and sweeps to keep the whole suite within minutes; the variants and
    /// metrics stay the same.
    pub quick: bool,
}

impl Options {
    /// `full` in a full run, `quick` in a smoke run.
    pub fn pick<T>(&self, full: T, quick: T) -> T {
        if self.quick { quick } else { full }
    }
}

/// `run_time_ns`, `run_cnt` of a node's pinned program (kernel BPF
/// statistics: they count only while `BPF_ENABLE_STATS` is held).
pub fn prog_stats(world: &rivet_tests::World, node: usize, prog: &str) -> (u64, u64) {
    let path = world.nodes[node].pin_dir().join("progs").join(prog);
    let info = aya::programs::ProgramInfo::from_pin(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (info.run_time().as_nanos() as u64, info.run_count())
}

/// A node's pinned Service frontends (`SVC_FRONTENDS`), opened beside its
/// agent.
pub fn pinned_frontends(
    pin_dir: &std::path::Path,
) -> aya::maps::HashMap<aya::maps::MapData, rivet_common::SvcKey, rivet_common::SvcInfo> {
    let path = rivet::pins::PinLayout::new(pin_dir).map(rivet_common::map_names::SVC_FRONTENDS);
    let data = aya::maps::MapData::from_pin(&path)
        .unwrap_or_else(|e| panic!("opening the pinned {}: {e}", path.display()));
    aya::maps::HashMap::try_from(aya::maps::Map::HashMap(data))
        .unwrap_or_else(|e| panic!("{} is not the frontends hash: {e}", path.display()))
}

/// Records, for `variant`, a program's ns per run (`per_run`, lower is
/// better) and its runs per unit of `per` (`rate`: per second, per
/// connection) between two [`prog_stats`] readings; fails when it did not
/// run at all.
pub fn record_prog_runs(
    r: &mut Report,
    variant: &str,
    prog: &str,
    (before, after): ((u64, u64), (u64, u64)),
    per_run: &str,
    rate: &str,
    per: f64,
) {
    let (ns, runs) = (after.0 - before.0, after.1 - before.1);
    assert!(
        runs > 0,
        "{prog}: the program did not run during the sample"
    );
    r.better.insert(per_run.to_owned(), "lower".into());
    r.add(per_run, variant, ns as f64 / runs as f64);
    r.add(rate, variant, runs as f64 / per);
}

/// A process's resident memory (VmRSS) in MiB; NaN when it cannot be
/// read (the process is gone).
pub fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kib| kib / 1024.0)
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
    /// Wall time of the whole benchmark in seconds, its worlds' setup and
    /// teardown included (set by the runner).
    pub elapsed_s: Option<f64>,
    /// sysctl → its value in every namespace the benchmark built, read
    /// back from them (see [`bridge_nf_off`]).
    pub kernel_settings: BTreeMap<String, String>,
    /// Charts of medians per cell (conditions such as rate × streams ×
    /// direction), drawn beside the per-metric ones ([`plot`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cell_charts: Vec<CellChart>,
}

/// A chart of one benchmark measured in several cells (e.g. rate × TCP
/// streams × direction): one panel per quantity, the cells along x, each
/// variant a series (its samples as dots, its median as a bar).
#[derive(Debug, Clone, Default, Serialize)]
pub struct CellChart {
    /// File name part: `<benchmark>-<file>.svg`.
    pub file: String,
    /// Title, after the benchmark's name.
    pub title: String,
    /// The panels, top to bottom.
    pub panels: Vec<CellPanel>,
}

/// One panel of a [`CellChart`].
#[derive(Debug, Clone, Default, Serialize)]
pub struct CellPanel {
    /// The y axis' description.
    pub y_desc: String,
    /// Each cell's label and the metric read for it.
    pub cells: Vec<(String, String)>,
    /// A range to shade (e.g. the accepted one).
    pub band: Option<(f64, f64)>,
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
            let better = match self.better_of(metric) {
                Some(b) => format!(" ({b} is better)"),
                None => " (informative)".to_owned(),
            };
            let _ = writeln!(
                s,
                "| {metric}{better} | median | min | max | n | × {b} (medians) | × {b} (paired) |\n|---|---:|---:|---:|---:|---:|---:|",
                b = self.baseline
            );
            for v in &self.variants {
                let Some(series) = by_variant.get(v) else {
                    continue;
                };
                let (min, max) = series.spread();
                // A metric measured without the baseline variant (e.g. the
                // live rows of prog-cost) has no ratio: "–", not NaN.
                // Nor has one whose baseline is 0 (e.g. no loss at all).
                let cell = |r: Option<f64>| {
                    r.filter(|r| r.is_finite())
                        .map_or_else(|| "–".to_owned(), |r| format!("{r:.3}"))
                };
                let ratio = cell(base.map(|b| series.median() / b));
                let paired = cell(
                    by_variant
                        .get(&self.baseline)
                        .map(|b| paired_ratio(series, b)),
                );
                let _ = writeln!(
                    s,
                    "| {v} | {:.3} | {min:.3} | {max:.3} | {} | {ratio} | {paired} |",
                    series.median(),
                    series.samples.len()
                );
            }
            s.push('\n');
        }
        for n in &self.notes {
            let _ = writeln!(s, "- {n}");
        }
        for (key, value) in &self.kernel_settings {
            let _ = writeln!(s, "- kernel: {key} = {value}");
        }
        if let Some(t) = self.elapsed_s {
            let _ = writeln!(s, "- run time: {t:.0} s (setup and teardown included)");
        }
        s
    }

    /// Which way `metric` is better: as the benchmark recorded it, else
    /// from its unit — rates and throughput higher, times lower; `None`
    /// for counts that describe rather than rank (e.g. skbs per second
    /// under iperf3, flow events seen).
    pub fn better_of(&self, metric: &str) -> Option<&str> {
        if let Some(b) = self.better.get(metric) {
            return Some(b);
        }
        better_from_unit(metric)
    }

    /// The `better` map with every metric's direction filled in (for the
    /// JSON).
    fn with_better_filled(&self) -> Self {
        let mut r = self.clone();
        for m in self.metrics.keys() {
            if let Some(b) = self.better_of(m) {
                r.better.insert(m.clone(), b.to_owned());
            }
        }
        r
    }
}

/// How every interleaving benchmark orders its variants (stated in the
/// report).
pub const ROTATION: &str = "variants are measured interleaved, one sample each per round, and the order rotates: round r starts with variant r mod n and keeps the listed order from there (A B C, B C A, C A B, …), so over n rounds each variant takes each position (first to last) once and none always runs first, on a machine that has just been idle or busy with something else; where a benchmark has a warm-up round it is round 0";

/// `items` in the order of round `round`: rotated to start at
/// `round mod len` (see [`ROTATION`]).
pub fn rotated<T: Copy>(items: &[T], round: usize) -> impl Iterator<Item = T> + '_ {
    let start = if items.is_empty() {
        0
    } else {
        round % items.len()
    };
    items[start..].iter().chain(&items[..start]).copied()
}

/// Settings of a namespace that opens or accepts many short TCP
/// connections in a row, as `sysctl` writes them: ports of closed
/// connections may be reused at once, and no TIME_WAIT socket is kept.
/// With TIME_WAIT kept, a client making 15,000 connections/s filled its
/// 28,232 ephemeral ports with ~27,700 TIME_WAIT sockets within seconds
/// (2026-12-06), and every later `connect()` searched them for a port:
/// its latency then grew over a run with the number of connections the
/// variant had made before (the fastest paid most), not with the
/// datapath.
pub const CONNECTION_SYSCTLS: [&str; 2] =
    ["net.ipv4.tcp_tw_reuse=1", "net.ipv4.tcp_max_tw_buckets=0"];

/// Applies [`CONNECTION_SYSCTLS`] in `ns` and checks each reads back.
pub fn connection_sysctls(ns: &Netns) {
    for setting in CONNECTION_SYSCTLS {
        let (key, value) = setting.split_once('=').expect("key=value");
        ns.run("sysctl", &["-qw", setting]);
        let now = ns.run("sysctl", &["-n", key]);
        assert_eq!(now.trim(), value, "{key} in {}", ns.name());
    }
}

/// The bridge-netfilter switches: whether bridged frames run the
/// iptables, ip6tables and arptables hooks. Per network namespace once
/// `br_netfilter` is loaded (each new namespace starts at 1).
pub const BRIDGE_NF: [&str; 3] = [
    "net.bridge.bridge-nf-call-iptables",
    "net.bridge.bridge-nf-call-ip6tables",
    "net.bridge.bridge-nf-call-arptables",
];

/// sysctl → its value in each namespace read.
pub type Settings = BTreeMap<String, Vec<String>>;

/// What a setting reads where its sysctl does not exist.
const BRIDGE_NF_ABSENT: &str = "absent (br_netfilter not loaded)";

/// Sets every [`BRIDGE_NF`] switch to 0 (bridged frames skip netfilter,
/// as a CNI user would configure a node) in each of `spaces` — every
/// namespace of every variant, so a bridge-based peer and rivet run with
/// the same setting — and returns each sysctl's value read back from each
/// of them (for [`Report::set_kernel_settings`]). A sysctl that does not exist is
/// recorded as absent; a write that fails where it exists panics.
pub fn bridge_nf_off<'a>(spaces: impl IntoIterator<Item = &'a Netns>) -> Settings {
    bridge_nf(spaces, true)
}

/// The [`BRIDGE_NF`] values now in `spaces` (as [`bridge_nf_off`]
/// returns them, nothing written).
pub fn bridge_nf_read<'a>(spaces: impl IntoIterator<Item = &'a Netns>) -> Settings {
    bridge_nf(spaces, false)
}

fn bridge_nf<'a>(spaces: impl IntoIterator<Item = &'a Netns>, write: bool) -> Settings {
    let mut seen: Vec<Vec<String>> = vec![Vec::new(); BRIDGE_NF.len()];
    for ns in spaces {
        let values = ns.exec(|| {
            BRIDGE_NF
                .iter()
                .map(|key| {
                    let path = Path::new("/proc/sys").join(key.replace('.', "/"));
                    if !path.exists() {
                        return BRIDGE_NF_ABSENT.to_owned();
                    }
                    if write && let Err(e) = std::fs::write(&path, "0") {
                        panic!("setting {key}=0: {e}");
                    }
                    std::fs::read_to_string(&path)
                        .unwrap_or_else(|e| panic!("reading {key} back: {e}"))
                        .trim()
                        .to_owned()
                })
                .collect::<Vec<_>>()
        });
        if write {
            for (key, v) in BRIDGE_NF.iter().zip(&values) {
                assert!(
                    v == "0" || v == BRIDGE_NF_ABSENT,
                    "{key} reads {v} in {} after writing 0",
                    ns.name()
                );
            }
        }
        for (s, v) in seen.iter_mut().zip(values) {
            s.push(v);
        }
    }
    BRIDGE_NF
        .iter()
        .zip(seen)
        .map(|(key, values)| ((*key).to_owned(), values))
        .collect()
}

/// One setting's values across namespaces: `0 (all 9 namespaces)`, or
/// each value with its count when they differ.
pub fn settings_summary(values: &[String]) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for v in values {
        *counts.entry(v.as_str()).or_default() += 1;
    }
    match counts.len() {
        0 => "no namespace".to_owned(),
        1 => {
            let (v, n) = counts.into_iter().next().unwrap_or(("", 0));
            format!("{v} (all {n} namespaces)")
        }
        _ => counts
            .into_iter()
            .map(|(v, n)| format!("{v} in {n}"))
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// One iperf3 client run (one stream, client on CPU 0, JSON) with the CPU
/// time iperf3 itself reports.
#[derive(Debug, Clone, Copy)]
pub struct CpuSample {
    /// Receiver-side throughput, bits/s.
    pub bits_per_second: f64,
    /// The test's length as the receiver measured it, seconds.
    pub seconds: f64,
    /// Retransmits reported by the sender.
    pub retransmits: u64,
    /// CPU seconds of the iperf3 client and server over the test: their
    /// `getrusage` user + system time, whose sum the kernel keeps exactly
    /// (the scheduler's ns run time, not ticks) and which — this kernel has
    /// no IRQ time accounting — includes the interrupts and softirqs that
    /// ran while they were on the CPU: the datapath, mostly.
    pub cpu_s: Option<(f64, f64)>,
}

impl CpuSample {
    /// Gigabytes the receiver got.
    pub fn gbytes(&self) -> f64 {
        self.bits_per_second * self.seconds / 8e9
    }
}

/// `iperf3 -c dst -p port -t secs -A 0 -J` from `ns` (with `-b bitrate`
/// when paced), retried while the server starts.
pub fn iperf3_cpu(
    ns: &Netns,
    dst: std::net::Ipv4Addr,
    port: u16,
    secs: u32,
    bitrate: Option<&str>,
) -> CpuSample {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let (dst_s, port_s, secs_s) = (dst.to_string(), port.to_string(), secs.to_string());
    let mut args = vec!["-c", &dst_s, "-p", &port_s, "-t", &secs_s, "-J", "-A", "0"];
    if let Some(b) = bitrate {
        args.extend(["-b", b]);
    }
    loop {
        let out = ns.output("iperf3", &args);
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let end = &json["end"];
        if let Some(bps) = end["sum_received"]["bits_per_second"].as_f64() {
            let seconds = end["sum_received"]["seconds"]
                .as_f64()
                .unwrap_or(f64::from(secs));
            let cpu = &end["cpu_utilization_percent"];
            let cpu_s = cpu["host_total"]
                .as_f64()
                .zip(cpu["remote_total"].as_f64())
                .map(|(h, r)| (h / 100.0 * seconds, r / 100.0 * seconds));
            return CpuSample {
                bits_per_second: bps,
                seconds,
                retransmits: end["sum_sent"]["retransmits"].as_u64().unwrap_or(0),
                cpu_s,
            };
        }
        assert!(
            std::time::Instant::now() < deadline,
            "iperf3 to {dst}:{port} from {} failed: {}{}",
            ns.name(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Run time of the `ksoftirqd/N` threads so far, in seconds: the softirq
/// work the kernel deferred out of the tasks that raised it (exact, from
/// the scheduler's ns run time in `/proc/<pid>/schedstat`).
pub fn ksoftirqd_secs() -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    let mut ns = 0u64;
    for e in dir.flatten() {
        let p = e.path();
        let is_ksoftirqd =
            std::fs::read_to_string(p.join("comm")).is_ok_and(|c| c.starts_with("ksoftirqd/"));
        if is_ksoftirqd {
            ns += std::fs::read_to_string(p.join("schedstat"))
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse().ok())
                .unwrap_or(0);
        }
    }
    ns as f64 / 1e9
}

/// Busy time of the whole machine so far, in seconds: every CPU's time
/// minus its idle (and iowait) time. A CPU's idle time stops at each
/// interrupt's entry and starts again at its exit (NO_HZ's tick-sched
/// accounting), so interrupts and the softirqs run on their way out of
/// idle (a shaper's timer dequeueing, a tasklet's work) count as busy —
/// work the tasks' run times miss.
///
/// The figures: `/proc/timer_list` has each CPU's idle time in ns up to
/// its last transition (`.idle_sleeptime` + `.iowait_sleeptime`) and the
/// time of that transition (`.idle_entrytime`), but not whether the CPU
/// has been idle or busy since; `/proc/stat` has the whole idle time,
/// ongoing period included, in 10 ms units. Of the two readings (idle
/// since the transition, or busy) the one within that 10 ms step is
/// taken, the nearer one when both or neither are: exact to the ns
/// except for a CPU whose last transition is under 10 ms old, and then
/// off by less than that age. `None` when a figure is missing.
pub fn machine_busy_secs() -> Option<f64> {
    let timers = std::fs::read_to_string("/proc/timer_list").ok()?;
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let last_ns =
        |line: &str| -> Option<u64> { line.split_whitespace().rev().nth(1)?.parse().ok() };
    let now = last_ns(timers.lines().find(|l| l.starts_with("now at "))?)?;
    // USER_HZ: /proc/stat counts in 1/100 s on Linux.
    const STAT_TICK_NS: u64 = 10_000_000;
    let mut busy_ns = 0u128;
    let mut cpus = 0;
    for section in timers.split("\ncpu: ").skip(1) {
        let cpu = section.split_whitespace().next()?;
        let field = |name: &str| {
            section
                .lines()
                .find(|l| {
                    l.trim_start()
                        .strip_prefix(name)
                        .is_some_and(|rest| rest.trim_start().starts_with(':'))
                })
                .and_then(last_ns)
        };
        let slept = field(".idle_sleeptime")? + field(".iowait_sleeptime")?;
        let since = now.saturating_sub(field(".idle_entrytime")?);
        let prefix = format!("cpu{cpu} ");
        let line = stat.lines().find(|l| l.starts_with(&prefix))?;
        // user nice system idle iowait …
        let mut ticks = line.split_whitespace().skip(4);
        let idle_ticks: u64 = ticks.next()?.parse().ok()?;
        let iowait_ticks: u64 = ticks.next()?.parse().ok()?;
        let floor = (idle_ticks + iowait_ticks) * STAT_TICK_NS;
        let within = |v: u64| (floor..floor + STAT_TICK_NS).contains(&v);
        let (was_busy, was_idle) = (slept, slept + since);
        let idle = match (within(was_busy), within(was_idle)) {
            (true, false) => was_busy,
            (false, true) => was_idle,
            _ => {
                let mid = floor + STAT_TICK_NS / 2;
                if was_busy.abs_diff(mid) <= was_idle.abs_diff(mid) {
                    was_busy
                } else {
                    was_idle
                }
            }
        };
        busy_ns += u128::from(now.saturating_sub(idle));
        cpus += 1;
    }
    (cpus > 0).then(|| busy_ns as f64 / 1e9)
}

/// Every namespace of a world: the underlay, the nodes, the pods and the
/// outside host.
pub fn world_spaces(w: &World) -> impl Iterator<Item = &Netns> {
    std::iter::once(&w.underlay)
        .chain(w.nodes.iter().map(|n| &n.ns))
        .chain(w.pods.iter().map(|p| &p.ns))
        .chain(w.outside.iter())
}

impl Report {
    /// Records the kernel settings read back at setup (`at_setup`) and at
    /// the end of the measurements (`at_end`, which may cover namespaces
    /// added meanwhile); a setting whose values changed in between (e.g.
    /// br_netfilter loaded meanwhile) shows both.
    pub fn set_kernel_settings(&mut self, at_setup: Settings, at_end: &Settings) {
        let distinct = |v: &[String]| v.iter().cloned().collect::<std::collections::BTreeSet<_>>();
        for (key, setup) in at_setup {
            let value = match at_end.get(&key) {
                Some(end) if distinct(end) != distinct(&setup) => format!(
                    "{} at setup; {} at the end",
                    settings_summary(&setup),
                    settings_summary(end)
                ),
                Some(end) => settings_summary(end),
                None => settings_summary(&setup),
            };
            self.kernel_settings.insert(key, value);
        }
    }
}

/// A metric's better direction from its name's unit (see
/// [`Report::better_of`]).
fn better_from_unit(metric: &str) -> Option<&'static str> {
    // Descriptive rates: how many skbs a program saw, events delivered.
    if metric.ends_with("_runs_per_s") || metric.starts_with("flow_events") {
        return None;
    }
    let unit = metric.split(" (").next().unwrap_or(metric);
    let unit = unit.rsplit_once("_n").map_or(unit, |(head, n)| {
        if n.chars().all(|c| c.is_ascii_digit()) {
            head
        } else {
            unit
        }
    });
    // `x_gbps` or a bare `gbps`.
    let is = |u: &str| unit.ends_with(&format!("_{u}")) || unit == u;
    if ["gbps", "mpps", "per_s", "share"].into_iter().any(is) {
        Some("higher")
    } else if ["ns", "us", "ms", "ns_per_run", "s_per_gb", "retransmits"]
        .into_iter()
        .any(is)
    {
        Some("lower")
    } else {
        None
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

/// Wall-clock `HH:MM:SS` (UTC) for log lines.
pub fn clock() -> String {
    let t = timestamp();
    let hms = t.get(9..15).unwrap_or("000000");
    format!("{}:{}:{}", &hms[0..2], &hms[2..4], &hms[4..6])
}

/// Markdown table of each benchmark's run time and the sum.
pub fn run_time_table(reports: &[Report]) -> String {
    let mut s = String::from("| benchmark | run time (s) |\n|---|---:|\n");
    let mut total = 0.0;
    for r in reports {
        let t = r.elapsed_s.unwrap_or(f64::NAN);
        if t.is_finite() {
            total += t;
        }
        let _ = writeln!(s, "| {} | {t:.0} |", r.name);
    }
    let _ = writeln!(s, "| total (benchmarks only, no build) | {total:.0} |\n");
    s
}

/// Markdown "kernel settings" section: each benchmark's settings as read
/// back from its namespaces.
pub fn kernel_settings_table(reports: &[Report]) -> String {
    let mut s = String::from(
        "## kernel settings\n\nSet identically in every namespace of every variant (nodes, underlay, pods) and read back from them; the machine's own namespace is left alone.\n\n| benchmark | sysctl | value |\n|---|---|---|\n",
    );
    for r in reports {
        if r.kernel_settings.is_empty() {
            let _ = writeln!(
                s,
                "| {} | – | not applicable: no packet path measured |",
                r.name
            );
        }
        for (key, value) in &r.kernel_settings {
            let _ = writeln!(s, "| {} | {key} | {value} |", r.name);
        }
    }
    s.push('\n');
    s
}

/// Writes `report.json` and `report.md` into `dir`.
pub fn write(dir: &Path, machine: &Machine, reports: &[Report]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let filled: Vec<Report> = reports.iter().map(Report::with_better_filled).collect();
    let run_times: BTreeMap<&str, Option<f64>> = reports
        .iter()
        .map(|r| (r.name.as_str(), r.elapsed_s))
        .collect();
    let json = serde_json::json!({
        "machine": machine,
        "run_time_s": run_times,
        "rotation": ROTATION,
        "reports": filled,
    });
    std::fs::write(dir.join("report.json"), serde_json::to_vec_pretty(&json)?)?;
    let mut md = format!(
        "# rivet benchmarks\n\nkernel {}, {} × {}, rivet {}, {}\n\n",
        machine.kernel, machine.cpus, machine.cpu, machine.rivet, machine.iperf3
    );
    md.push_str(&run_time_table(reports));
    md.push_str(&kernel_settings_table(reports));
    let _ = writeln!(md, "## order\n\n{ROTATION}.\n");
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
    fn machine_busy_time_counts_a_busy_cpu() {
        // 200 ms of spinning on this CPU: at least that much busy time,
        // and no more than every CPU busy for the whole span (each reading
        // may be off by up to 10 ms per CPU).
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let start = machine_busy_secs().expect("/proc/timer_list and /proc/stat readable");
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_millis(200) {
            std::hint::spin_loop();
        }
        let wall = t.elapsed().as_secs_f64();
        let busy = machine_busy_secs().expect("second reading") - start;
        assert!(
            (0.15..=cpus * wall + 0.05).contains(&busy),
            "{busy:.3} s busy over {wall:.3} s of spinning on {cpus} CPUs"
        );
    }

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
        assert!(md.contains("| gbps (higher is better) |"), "{md}");
        // A metric the baseline variant lacks: no ratio, shown as such.
        r.variants.push("live".into());
        r.add("live_gbps", "live", 1.0);
        let md = r.markdown();
        assert!(
            md.contains("| live | 1.000 | 1.000 | 1.000 | 1 | – | – |"),
            "{md}"
        );
        assert!(!md.contains("NaN"), "{md}");
    }

    #[test]
    fn better_from_units() {
        let r = Report::default();
        assert_eq!(r.better_of("live_vxlan_gbps"), Some("higher"));
        assert_eq!(
            r.better_of("live_samenode_from_pod_ns_per_run"),
            Some("lower")
        );
        assert_eq!(r.better_of("live_samenode_from_pod_runs_per_s"), None);
        assert_eq!(r.better_of("conns_per_s_n10000"), Some("higher"));
        assert_eq!(r.better_of("connect_p99_us_n100"), Some("lower"));
        assert_eq!(r.better_of("throughput_gbps (nic)"), Some("higher"));
        assert_eq!(r.better_of("rtt_p50_ms (veth)"), Some("lower"));
        assert_eq!(r.better_of("cpu_s_per_gb"), Some("lower"));
        assert_eq!(r.better_of("flow_events"), None);
        let mut r = Report::default();
        r.better.insert("x_gbps".into(), "lower".into());
        assert_eq!(r.better_of("x_gbps"), Some("lower"), "recorded wins");
        r.add("live_x_runs_per_s", "live", 1.0);
        assert!(r.markdown().contains("| live_x_runs_per_s (informative) |"));
    }

    #[test]
    fn rotation() {
        let v = ["a", "b", "c"];
        let order = |r| rotated(&v, r).collect::<Vec<_>>().concat();
        assert_eq!(
            [order(0), order(1), order(2), order(3)],
            ["abc", "bca", "cab", "abc"]
        );
        assert_eq!(rotated::<u8>(&[], 5).count(), 0);
    }

    #[test]
    fn settings_summaries() {
        let s =
            |v: &[&str]| settings_summary(&v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>());
        assert_eq!(s(&["0", "0", "0"]), "0 (all 3 namespaces)");
        assert_eq!(s(&["0", "1", "0"]), "0 in 2, 1 in 1");
        assert_eq!(s(&[]), "no namespace");
        let mut r = Report::default();
        let at = |v: &[&str]| {
            Settings::from([("k".to_owned(), v.iter().map(|x| (*x).to_owned()).collect())])
        };
        // More namespaces at the end (added meanwhile), the same value.
        r.set_kernel_settings(at(&["0", "0"]), &at(&["0", "0", "0"]));
        assert_eq!(r.kernel_settings["k"], "0 (all 3 namespaces)");
        r.set_kernel_settings(at(&["0", "0"]), &at(&["1", "1"]));
        assert_eq!(
            r.kernel_settings["k"],
            "0 (all 2 namespaces) at setup; 1 (all 2 namespaces) at the end"
        );
        let table = kernel_settings_table(&[r, Report::default()]);
        assert!(
            table.contains("| k | 0 (all 2 namespaces) at setup"),
            "{table}"
        );
        assert!(table.contains("not applicable"), "{table}");
    }

    #[test]
    fn clock_shape() {
        let c = clock();
        assert_eq!(c.len(), 8, "{c}");
        assert_eq!(&c[2..3], ":");
    }
}
