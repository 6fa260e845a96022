//! Pod bandwidth limits (the CNI `bandwidth` capability): rivet against the
//! reference `ptp` + `bandwidth` chain, interleaved in one run.
//!
//! One world, two nodes on one underlay, each with one limited pod per
//! rate (ingress and egress both at the rate, burst 100 ms of it: rate / 10
//! bits) and one peer pod without limits:
//!
//! - `rivet`: a `rivetd` node; every pod attached by the real `rivet-cni`
//!   binary, its configuration carrying `capabilities: {bandwidth: true}`
//!   and `runtimeConfig.bandwidth` = {ingressRate, ingressBurst,
//!   egressRate, egressBurst} (bits/s and bits, the CNI convention).
//! - `reference`: a plain node; the reference plugins from /usr/lib/cni
//!   driven as a runtime drives a chain: ADD `ptp` (host-local IPAM, the
//!   pod MTU rivet's pods have, so that both carry a GB in as many
//!   packets), then
//!   ADD `bandwidth` with the `ptp` result as `prevResult` and the same
//!   `runtimeConfig.bandwidth` (a TBF qdisc on the host veth for ingress; an
//!   ifb device fed by a mirred redirect from the host veth's ingress, with
//!   its own TBF, for egress); DEL in reverse order with the chain's result
//!   as `prevResult`. The baseline of the ratios.
//!
//! A cell is a rate × TCP streams × direction: egress, the limited pod
//! sends to the peer; ingress, the peer sends to the limited pod. Per
//! measured round and cell, each variant in turn (the order rotates per
//! round, as everywhere):
//!
//! - iperf3 for `secs` seconds with 1 or 4 streams, client (the sender) on
//!   CPU 0, server (the receiver) on CPU 1. Goodput is measured at the
//!   receiver: the server runs with `-J` and the client fetches its
//!   output (`--get-server-output`), whose per-second intervals count what
//!   arrived (the client's own count what it wrote into its socket buffer,
//!   which in the first second is far more than left the pod).
//!   `accuracy` = receiver goodput over seconds 1..N ÷ rate;
//!   `first_second_accuracy` = the first second's goodput ÷ rate (the
//!   burst shows there). `cpu_s_per_gb`: the same-node measure — the iperf3
//!   client's and server's run time (getrusage) plus the ksoftirqd threads'
//!   run time over the sample, per GB the receiver got;
//!   `machine_cpu_s_per_gb`: the whole machine's busy time over the sample
//!   per GB (softirqs taken from idle, which the tasks' times miss,
//!   included; `crate::machine_busy_secs`).
//! - per rate × direction, latency through the limited path: `ping -i
//!   0.01` from the sender to the receiver, idle, then while one TCP flow
//!   (iperf3, one stream) saturates the same direction, from 1.5 s after
//!   its start. `ping_added_p50_ms` / `ping_added_p99_ms` = the loaded p50
//!   / p99 minus the idle p50 of the same round.
//!
//! Every namespace is the benchmark's own (unique names); the
//! attachments are deleted through their plugins and the namespaces
//! removed at the end, and on a failure by the guards' `Drop`.

use std::{
    io::Read as _,
    net::Ipv4Addr,
    path::PathBuf,
    process::Stdio,
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use crate::{
    CellChart, CellPanel, Options, Report, Series, ksoftirqd_secs, machine_busy_secs, percentile,
    progress,
};
use rivet_tests::{
    Netns, World,
    cni::{Plugin, result_ip, rivet_conf},
    traffic::ChildGuard,
};

/// The variants, in the listed order of the rotation.
const VARIANTS: [&str; 2] = ["rivet", "reference"];
/// The reference node's pod subnet (host-local). Worlds use 10.k.0.0/16
/// with k ≤ 219: no overlap.
const REF_SUBNET: &str = "10.250.0.0/24";
/// The CNI network name of the reference chain.
const REF_NETWORK: &str = "bench-bw";
/// The accuracy band of the goals.
const BAND: (f64, f64) = (0.90, 1.02);
/// Above this accuracy a limit is taken as not enforced: latency and CPU
/// per GB are then not compared with the reference's (an unlimited path
/// has no queue to wait in and moves its bytes at full speed), and those
/// goals count as not met in that cell.
const ENFORCED: f64 = 1.10;
/// Burst as a share of the rate per second: 100 ms of it.
const BURST_SHARE: u64 = 10;
/// iperf3 ports: the throughput samples and the latency load.
const PORT: u16 = 5201;
/// The whole machine's busy CPU-seconds per GB of a throughput sample.
const MACHINE_CPU: &str = "machine_cpu_s_per_gb";
const LOAD_PORT: u16 = 5202;
/// ping's interval (s).
const PING_INTERVAL: f64 = 0.01;
/// How long the loading flow runs before pings start.
const SETTLE: Duration = Duration::from_millis(1500);
/// Fewest replies a loaded ping sample needs to count.
const MIN_REPLIES: usize = 20;

/// Sizes of one run of this benchmark.
#[derive(Debug, Clone)]
pub struct Sizes {
    /// Measured rounds (after a warm-up round).
    pub rounds: u32,
    /// iperf3 seconds per sample (≥ 2: the first second is reported
    /// apart).
    pub secs: u32,
    /// Rates in Mbit/s.
    pub rates_mbit: Vec<u64>,
    /// TCP streams per sample.
    pub streams: Vec<u32>,
    /// Pings per latency sample (idle and loaded each).
    pub pings: u32,
}

impl Sizes {
    /// The full run: 10, 100, 1000 Mbit/s × 1 and 4 streams, 300 pings;
    /// `rounds` and `secs` as given.
    pub fn full(rounds: u32, secs: u32) -> Self {
        Self {
            rounds,
            secs,
            rates_mbit: vec![10, 100, 1000],
            streams: vec![1, 4],
            pings: 300,
        }
    }

    /// A smoke run: 10 and 100 Mbit/s, 100 pings.
    pub fn quick(rounds: u32, secs: u32) -> Self {
        Self {
            rates_mbit: vec![10, 100],
            pings: 100,
            ..Self::full(rounds, secs)
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    /// The limited pod sends.
    Egress,
    /// The limited pod receives.
    Ingress,
}

impl Dir {
    const ALL: [Self; 2] = [Self::Egress, Self::Ingress];

    const fn name(self) -> &'static str {
        match self {
            Self::Egress => "egress",
            Self::Ingress => "ingress",
        }
    }
}

/// A pod's namespace and address.
struct PodNs {
    ns: Netns,
    ip: Ipv4Addr,
}

/// One variant's pods: one limited pod per rate, one peer.
struct Side {
    name: &'static str,
    /// (rate in bits/s, pod).
    limited: Vec<(u64, PodNs)>,
    peer: PodNs,
}

impl Side {
    /// (sender, receiver, receiver's address) of a cell.
    fn ends(&self, rate: u64, dir: Dir) -> (&Netns, &Netns, Ipv4Addr) {
        let limited = self
            .limited
            .iter()
            .find(|(r, _)| *r == rate)
            .map(|(_, p)| p)
            .unwrap_or_else(|| panic!("{}: no pod limited at {rate} bit/s", self.name));
        match dir {
            Dir::Egress => (&limited.ns, &self.peer.ns, self.peer.ip),
            Dir::Ingress => (&self.peer.ns, &limited.ns, limited.ip),
        }
    }

    fn spaces(&self) -> impl Iterator<Item = &Netns> {
        self.limited
            .iter()
            .map(|(_, p)| &p.ns)
            .chain(std::iter::once(&self.peer.ns))
    }
}

/// One CNI attachment (one plugin of a chain) to delete.
struct Attachment {
    what: String,
    plugin: Plugin,
    id: String,
    pod: PathBuf,
    conf: Value,
}

/// The attachments made, deleted last first: by [`Attachments::del_all`]
/// at the end (each DEL must succeed), or on a failure when dropped.
#[derive(Default)]
struct Attachments(Vec<Attachment>);

impl Attachments {
    /// DELs every attachment, last first; the failures.
    fn del_all(&mut self) -> Vec<String> {
        let mut failed = Vec::new();
        while let Some(a) = self.0.pop() {
            let out = a.plugin.del(&a.id, Some(&a.pod), &a.conf);
            if !out.ok {
                failed.push(format!("DEL {}: {}{}", a.what, out.stdout, out.stderr));
            }
        }
        failed
    }
}

impl Drop for Attachments {
    fn drop(&mut self) {
        for f in self.del_all() {
            eprintln!("warning: {f}");
        }
    }
}

/// `runtimeConfig.bandwidth` for a pod limited at `rate` bit/s both ways.
fn bandwidth_conf(rate: u64) -> Value {
    json!({
        "ingressRate": rate,
        "ingressBurst": rate / BURST_SHARE,
        "egressRate": rate,
        "egressBurst": rate / BURST_SHARE,
    })
}

/// A pod attached by rivet-cni on node `n` (limited at `rate` if given).
fn rivet_pod(
    world: &World,
    n: usize,
    tag: &str,
    rate: Option<u64>,
    att: &mut Attachments,
) -> PodNs {
    let node = &world.nodes[n];
    let ns = Netns::new(format!("{}-{tag}", world.prefix));
    let mut conf = rivet_conf("1.1.0", node.agent().socket());
    conf["capabilities"] = json!({"bandwidth": true});
    if let Some(rate) = rate {
        conf["runtimeConfig"] = json!({"bandwidth": bandwidth_conf(rate)});
    }
    let id = format!("{}{tag}", world.prefix);
    let plugin = Plugin::rivet(&node.ns.path());
    let out = plugin.add(&id, &ns.path(), &conf);
    let mut del_conf = conf.clone();
    del_conf["prevResult"] = out.json.clone();
    att.0.push(Attachment {
        what: format!("rivet-cni {tag}"),
        plugin,
        id,
        pod: ns.path(),
        conf: if out.ok { del_conf } else { conf },
    });
    let out = out.expect_ok(&format!("rivet-cni ADD {tag}"));
    let ip = result_ip(&out.json)
        .unwrap_or_else(|| panic!("rivet-cni ADD {tag}: no address in {}", out.stdout));
    PodNs { ns, ip }
}

/// A pod attached by the reference chain on node `n`: `ptp` (host-local,
/// pod MTU `mtu`), then `bandwidth` when limited.
fn reference_pod(
    world: &World,
    n: usize,
    tag: &str,
    rate: Option<u64>,
    mtu: u32,
    att: &mut Attachments,
) -> PodNs {
    let node = world.nodes[n].ns.path();
    let ns = Netns::new(format!("{}-{tag}", world.prefix));
    let id = format!("{}{tag}", world.prefix);
    let ptp_conf = json!({
        "cniVersion": "1.0.0",
        "name": REF_NETWORK,
        "type": "ptp",
        "ipMasq": false,
        "mtu": mtu,
        "ipam": {
            "type": "host-local",
            "subnet": REF_SUBNET,
            "dataDir": world.dir().join("bw-ipam"),
        },
    });
    let ptp = Plugin::reference("ptp", &node);
    let out = ptp.add(&id, &ns.path(), &ptp_conf);
    let mut del_conf = ptp_conf.clone();
    if out.ok {
        // The chain's result (bandwidth passes it through unchanged), as a
        // runtime hands it to every plugin's DEL.
        del_conf["prevResult"] = out.json.clone();
    }
    att.0.push(Attachment {
        what: format!("ptp {tag}"),
        plugin: ptp,
        id: id.clone(),
        pod: ns.path(),
        conf: del_conf,
    });
    let out = out.expect_ok(&format!("ptp ADD {tag}"));
    let ip = result_ip(&out.json)
        .unwrap_or_else(|| panic!("ptp ADD {tag}: no address in {}", out.stdout));
    if let Some(rate) = rate {
        let bw_conf = json!({
            "cniVersion": "1.0.0",
            "name": REF_NETWORK,
            "type": "bandwidth",
            "capabilities": {"bandwidth": true},
            "runtimeConfig": {"bandwidth": bandwidth_conf(rate)},
            "prevResult": out.json,
        });
        let bw = Plugin::reference("bandwidth", &node);
        let res = bw.add(&id, &ns.path(), &bw_conf);
        att.0.push(Attachment {
            what: format!("bandwidth {tag}"),
            plugin: bw,
            id,
            pod: ns.path(),
            conf: bw_conf,
        });
        res.expect_ok(&format!("bandwidth ADD {tag}"));
    }
    PodNs { ns, ip }
}

/// The MTU of `eth0` in `ns`.
fn pod_mtu(ns: &Netns) -> u32 {
    let text = ns.run("ip", &["-o", "link", "show", "eth0"]);
    text.split_whitespace()
        .skip_while(|w| *w != "mtu")
        .nth(1)
        .and_then(|m| m.parse().ok())
        .filter(|m| *m > 52)
        .unwrap_or_else(|| panic!("no mtu in {}'s eth0: {text}", ns.name()))
}

/// Waits until a TCP socket listens on `port` in `ns` (iperf3's server
/// takes a moment to start; a probe connection would count as its test).
fn wait_listening(ns: &Netns, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let port_s = format!(":{port}");
    loop {
        let out = ns.output("ss", &["-Hltn", "sport", "=", &port_s]);
        if out.status.success() && !String::from_utf8_lossy(&out.stdout).trim().is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "nothing listens on :{port} in {} after 5 s",
            ns.name()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An iperf3 server for one test in `ns`, pinned to CPU 1, with its JSON
/// output (which the client fetches with `--get-server-output`).
fn iperf3_server_json(ns: &Netns, port: u16) -> ChildGuard {
    let child = ns
        .command("iperf3")
        .args(["-s", "-1", "-J", "-A", "1", "-p", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("starting iperf3 -s in {}: {e}", ns.name()));
    let guard = ChildGuard(child);
    wait_listening(ns, port);
    guard
}

/// What the receiver got, per its own per-second intervals.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Received {
    /// Goodput of the first interval, bit/s.
    first_bps: f64,
    /// Goodput over the whole intervals after the first, bit/s.
    rest_bps: f64,
    /// Seconds those intervals cover.
    rest_secs: f64,
}

/// The receiver's intervals from a client's JSON (`server_output_json`):
/// the first one, and the whole ones after it up to `secs` (a short tail
/// interval that starts at `secs`, the queue draining after the sender
/// stopped, is left out).
fn receiver_intervals(json: &Value, secs: u32) -> Result<Received, String> {
    let intervals = json["server_output_json"]["intervals"]
        .as_array()
        .ok_or("no server_output_json.intervals (server not run with -J?)")?;
    let parsed: Vec<(f64, f64, f64)> = intervals
        .iter()
        .map(|i| {
            let sum = &i["sum"];
            match (
                sum["start"].as_f64(),
                sum["seconds"].as_f64(),
                sum["bytes"].as_f64(),
            ) {
                (Some(s), Some(d), Some(b)) => Ok((s, d, b)),
                _ => Err(format!("interval without start/seconds/bytes: {sum}")),
            }
        })
        .collect::<Result<_, _>>()?;
    let Some(&(_, d0, b0)) = parsed.first() else {
        return Err("the receiver reported no interval".into());
    };
    if d0 <= 0.0 {
        return Err(format!("first interval of {d0} s"));
    }
    let rest: Vec<_> = parsed[1..]
        .iter()
        .filter(|(s, _, _)| s + 0.5 < f64::from(secs))
        .collect();
    let rest_secs: f64 = rest.iter().map(|(_, d, _)| d).sum();
    if rest.is_empty() || rest_secs <= 0.0 {
        return Err(format!(
            "no receiver interval after the first second ({} intervals for {secs} s)",
            parsed.len()
        ));
    }
    let rest_bytes: f64 = rest.iter().map(|(_, _, b)| b).sum();
    Ok(Received {
        first_bps: b0 * 8.0 / d0,
        rest_bps: rest_bytes * 8.0 / rest_secs,
        rest_secs,
    })
}

/// One throughput sample.
struct Sample {
    received: Received,
    /// Bytes the receiver got over the whole test.
    bytes: f64,
    /// CPU seconds: iperf3 client + server (getrusage) + ksoftirqd.
    cpu_s: Option<f64>,
    /// The whole machine's busy seconds over the client's run.
    machine_s: Option<f64>,
    retransmits: u64,
}

/// `iperf3 -c dst -t secs -P streams` from `sender` (CPU 0) to a server in
/// `receiver` (CPU 1), with the receiver's intervals.
fn throughput(sender: &Netns, receiver: &Netns, dst: Ipv4Addr, secs: u32, streams: u32) -> Sample {
    let _server = iperf3_server_json(receiver, PORT);
    let (dst_s, port_s, secs_s, streams_s) = (
        dst.to_string(),
        PORT.to_string(),
        secs.to_string(),
        streams.to_string(),
    );
    let soft = ksoftirqd_secs();
    let machine = machine_busy_secs();
    let out = sender.output(
        "iperf3",
        &[
            "-c",
            &dst_s,
            "-p",
            &port_s,
            "-t",
            &secs_s,
            "-P",
            &streams_s,
            "-J",
            "--get-server-output",
            "-A",
            "0",
        ],
    );
    let machine_s = machine_busy_secs()
        .zip(machine)
        .map(|(end, start)| end - start);
    let soft = ksoftirqd_secs() - soft;
    let fail = |why: &str| -> ! {
        panic!(
            "iperf3 {} → {dst} ({streams} streams, {secs} s): {why}\n{}{}",
            sender.name(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| fail(&e.to_string()));
    if let Some(e) = json["error"].as_str() {
        fail(e);
    }
    let received = receiver_intervals(&json, secs).unwrap_or_else(|e| fail(&e));
    let end = &json["end"];
    let bytes = end["sum_received"]["bytes"]
        .as_f64()
        .unwrap_or_else(|| fail("no end.sum_received.bytes"));
    let seconds = end["sum_received"]["seconds"]
        .as_f64()
        .unwrap_or(f64::from(secs));
    let cpu = &end["cpu_utilization_percent"];
    let cpu_s = cpu["host_total"]
        .as_f64()
        .zip(cpu["remote_total"].as_f64())
        .map(|(h, r)| (h + r) / 100.0 * seconds + soft);
    Sample {
        received,
        bytes,
        cpu_s,
        machine_s,
        retransmits: end["sum_sent"]["retransmits"].as_u64().unwrap_or(0),
    }
}

/// What one ping run saw.
#[derive(Debug, Clone, PartialEq)]
struct Pings {
    sent: u32,
    received: u32,
    /// Every (non-duplicate) reply's RTT, ms.
    rtts: Vec<f64>,
}

impl Pings {
    fn loss_pct(&self) -> f64 {
        if self.sent == 0 {
            return f64::NAN;
        }
        100.0 * f64::from(self.sent.saturating_sub(self.received)) / f64::from(self.sent)
    }
}

/// Parses `ping -n` output: each reply line's `time=… ms` and the summary;
/// an error for a reply line without a readable time, no summary, or a
/// summary whose count of replies differs from the reply lines.
fn parse_pings(text: &str) -> Result<Pings, String> {
    let mut rtts = Vec::new();
    let mut summary = None;
    for line in text.lines() {
        if line.contains(" bytes from ") {
            if line.contains("(DUP!)") {
                continue;
            }
            let time = line
                .split("time=")
                .nth(1)
                .and_then(|t| t.split_whitespace().next())
                .and_then(|t| t.parse::<f64>().ok())
                .filter(|t| t.is_finite() && *t >= 0.0)
                .ok_or_else(|| format!("reply line without a time: {line:?}"))?;
            rtts.push(time);
        } else if line.contains(" packets transmitted, ") {
            let nums: Vec<u32> = line
                .split(',')
                .take(2)
                .map(|part| part.split_whitespace().next().and_then(|n| n.parse().ok()))
                .collect::<Option<_>>()
                .ok_or_else(|| format!("summary line: {line:?}"))?;
            summary = Some((nums[0], nums[1]));
        }
    }
    let (sent, received) = summary.ok_or("no summary line")?;
    if received as usize != rtts.len() {
        return Err(format!(
            "summary says {received} replies, {} reply lines",
            rtts.len()
        ));
    }
    Ok(Pings {
        sent,
        received,
        rtts,
    })
}

/// `ping -n -c count -i 0.01 -W 2 dst` from `ns`.
fn ping(ns: &Netns, dst: Ipv4Addr, count: u32) -> Pings {
    let (count_s, interval, dst_s) = (
        count.to_string(),
        PING_INTERVAL.to_string(),
        dst.to_string(),
    );
    let out = ns.output(
        "ping",
        &["-n", "-c", &count_s, "-i", &interval, "-W", "2", &dst_s],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    // 0: every reply; 1: some missing; anything else is an error.
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "ping {dst} from {}: {}{text}{}",
        ns.name(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    parse_pings(&text).unwrap_or_else(|e| panic!("ping {dst} from {}: {e}\n{text}", ns.name()))
}

/// A latency sample: pings idle, then under one saturating TCP flow in
/// the same direction.
struct Latency {
    idle: Pings,
    loaded: Pings,
    /// The loading flow's goodput at the receiver, bit/s.
    load_bps: f64,
}

fn latency(sender: &Netns, receiver: &Netns, dst: Ipv4Addr, pings: u32) -> Latency {
    let idle = ping(sender, dst, pings);
    let _server = iperf3_server_json(receiver, LOAD_PORT);
    // Long enough for the settling time, the pings and a margin.
    let load_secs = (SETTLE.as_secs_f64() + f64::from(pings) * PING_INTERVAL + 1.5).ceil();
    let mut child = sender
        .command("iperf3")
        .args(["-c", &dst.to_string(), "-p", &LOAD_PORT.to_string()])
        .args(["-t", &format!("{load_secs}"), "-J", "-A", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("starting iperf3 -c in {}: {e}", sender.name()));
    // Read on a thread, so a full pipe never stalls the client.
    let mut pipe = child.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    });
    // Killed if anything below fails.
    let mut client = ChildGuard(child);
    std::thread::sleep(SETTLE);
    if let Ok(Some(status)) = client.0.try_wait() {
        panic!(
            "the loading flow {} → {dst} ended before the pings: {status}",
            sender.name()
        );
    }
    let loaded = ping(sender, dst, pings);
    let status = client.0.wait().expect("iperf3 client");
    let text = reader.join().unwrap_or_default();
    let json: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let load_bps = json["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .filter(|_| status.success())
        .unwrap_or_else(|| {
            panic!(
                "the loading flow {} → {dst} failed ({status}): {text}",
                sender.name()
            )
        });
    Latency {
        idle,
        loaded,
        load_bps,
    }
}

/// `10M`, `1000M`.
fn rate_label(rate: u64) -> String {
    format!("{}M", rate / 1_000_000)
}

/// A throughput cell's label: `egress 10M x1`.
fn cell(dir: Dir, rate: u64, streams: u32) -> String {
    format!("{} {} x{streams}", dir.name(), rate_label(rate))
}

/// A latency cell's label: `egress 10M`.
fn lat_cell(dir: Dir, rate: u64) -> String {
    format!("{} {}", dir.name(), rate_label(rate))
}

/// Runs the benchmark.
pub fn run(opts: &Options, sizes: &Sizes) -> Report {
    let Sizes {
        rounds,
        secs,
        ref rates_mbit,
        ref streams,
        pings,
    } = *sizes;
    assert!(
        secs >= 2,
        "bandwidth needs samples of at least 2 s (--secs): the first second is reported apart"
    );
    let rates: Vec<u64> = rates_mbit.iter().map(|m| m * 1_000_000).collect();
    let started = Instant::now();
    let step = |what: &str| {
        progress(&format!(
            "bandwidth: {what} [{:.0}s]",
            started.elapsed().as_secs_f64()
        ));
    };

    // Declared in this order so that they drop in the reverse one: the
    // attachments (DEL) first, then the pods' namespaces, then the world
    // (agent stopped, node namespaces removed, scratch directory).
    step("setting up");
    let mut world = World::new();
    let rivet_node = world.add_node_with_agent();
    let ref_node = world.add_node();
    world.nodes[ref_node]
        .ns
        .run("sysctl", &["-qw", "net.ipv4.ip_forward=1"]);
    let mut sides: Vec<Side> = Vec::new();
    let mut att = Attachments::default();
    // The reference's pods take the MTU rivet gives its pods (the uplink's
    // less the tunnel overhead): CPU per GB is mostly per packet, and at
    // equal MTUs both variants carry a GB in the same number of packets.
    let mut mtu = None;
    for (name, node) in [("rivet", rivet_node), ("reference", ref_node)] {
        let short = if name == "rivet" { "rv" } else { "rf" };
        let add = |tag: &str, rate: Option<u64>, att: &mut Attachments| {
            if name == "rivet" {
                rivet_pod(&world, node, tag, rate, att)
            } else {
                let mtu = mtu.expect("rivet's pods are attached first");
                reference_pod(&world, node, tag, rate, mtu, att)
            }
        };
        let peer = add(&format!("{short}peer"), None, &mut att);
        let limited = rates
            .iter()
            .map(|&r| {
                (
                    r,
                    add(&format!("{short}{}", rate_label(r)), Some(r), &mut att),
                )
            })
            .collect();
        if name == "rivet" {
            mtu = Some(pod_mtu(&peer.ns));
        }
        sides.push(Side {
            name,
            limited,
            peer,
        });
    }
    let spaces = || crate::world_spaces(&world).chain(sides.iter().flat_map(Side::spaces));
    let kernel_at_setup = crate::bridge_nf_off(spaces());

    let mut report = Report {
        name: "bandwidth: pod rate limits".into(),
        variants: VARIANTS.iter().map(|v| (*v).to_owned()).collect(),
        baseline: "reference".into(),
        ..Default::default()
    };
    notes(&mut report, sizes);
    // What a limiter leaves for TCP payload: counting whole frames (the
    // reference's tbf) or IP packets (rivet).
    for side in &sides {
        let (_, pod) = &side.limited[0];
        let mtu = pod_mtu(&pod.ns);
        report.notes.push(format!(
            "{}: pod MTU {mtu}; TCP payload per full-sized packet (20 B IP + 32 B TCP with timestamps) = {:.3} of the IP packet, {:.3} of the frame (14 B Ethernet more): the most of its rate a limiter counting IP bytes, or whole frames, delivers as goodput",
            side.name,
            f64::from(mtu - 52) / f64::from(mtu),
            f64::from(mtu - 52) / f64::from(mtu + 14)
        ));
    }
    report.notes.push(format!("order: {}", crate::ROTATION));

    // Warm-up (round 0, not recorded): neighbours resolved both ways, and
    // in a full run a 1 s flow each way through every limited pod.
    let order: Vec<usize> = (0..sides.len()).collect();
    for (i, side) in crate::rotated(&order, 0).map(|i| &sides[i]).enumerate() {
        step(&format!(
            "warm-up {} ({}/{})",
            side.name,
            i + 1,
            sides.len()
        ));
        for &rate in &rates {
            for dir in Dir::ALL {
                let (sender, receiver, dst) = side.ends(rate, dir);
                let p = ping(sender, dst, 3);
                assert!(
                    p.received > 0,
                    "{}: no reply from {dst} to {} in the warm-up",
                    side.name,
                    sender.name()
                );
                if !opts.quick {
                    throughput(sender, receiver, dst, 2, 1);
                }
            }
        }
    }

    let per_round = Dir::ALL.len() * rates.len() * (streams.len() + 1) * sides.len();
    let total = per_round * rounds as usize;
    let mut done = 0;
    let mut thin: Vec<String> = Vec::new();
    for round in 1..=rounds {
        for dir in Dir::ALL {
            for &rate in &rates {
                for &n in streams {
                    let c = cell(dir, rate, n);
                    for side in crate::rotated(&order, round as usize).map(|i| &sides[i]) {
                        done += 1;
                        step(&format!(
                            "round {round}/{rounds} {c} {} [{done}/{total}]",
                            side.name
                        ));
                        let (sender, receiver, dst) = side.ends(rate, dir);
                        let s = throughput(sender, receiver, dst, secs, n);
                        let v = side.name;
                        let r = rate as f64;
                        report.add(&format!("accuracy ({c})"), v, s.received.rest_bps / r);
                        report.add(
                            &format!("first_second_accuracy ({c})"),
                            v,
                            s.received.first_bps / r,
                        );
                        report.add(&format!("tcp_retransmits ({c})"), v, s.retransmits as f64);
                        if let Some(cpu) = s.cpu_s
                            && s.bytes > 0.0
                        {
                            report.add(&format!("cpu_s_per_gb ({c})"), v, cpu / (s.bytes / 1e9));
                        }
                        if let Some(busy) = s.machine_s
                            && s.bytes > 0.0
                        {
                            report.add(&format!("{MACHINE_CPU} ({c})"), v, busy / (s.bytes / 1e9));
                        }
                        if s.received.rest_secs + 1.5 < f64::from(secs) - 1.0 {
                            thin.push(format!(
                                "{v} {c} round {round}: receiver intervals cover {:.1} s after the first",
                                s.received.rest_secs
                            ));
                        }
                    }
                }
                let c = lat_cell(dir, rate);
                for side in crate::rotated(&order, round as usize).map(|i| &sides[i]) {
                    done += 1;
                    step(&format!(
                        "round {round}/{rounds} {c} ping {} [{done}/{total}]",
                        side.name
                    ));
                    let (sender, receiver, dst) = side.ends(rate, dir);
                    let l = latency(sender, receiver, dst, pings);
                    let v = side.name;
                    let idle = percentile(&l.idle.rtts, 50.0);
                    report.add(&format!("ping_idle_p50_ms ({c})"), v, idle);
                    report.add(
                        &format!("ping_loaded_loss_pct ({c})"),
                        v,
                        l.loaded.loss_pct(),
                    );
                    report.add(&format!("load_accuracy ({c})"), v, l.load_bps / rate as f64);
                    if l.loaded.rtts.len() < MIN_REPLIES || l.idle.rtts.is_empty() {
                        thin.push(format!(
                            "{v} {c} round {round}: {} of {} pings answered idle, {} of {} under load: latency not recorded",
                            l.idle.received, l.idle.sent, l.loaded.received, l.loaded.sent
                        ));
                        continue;
                    }
                    let (p50, p99) = (
                        percentile(&l.loaded.rtts, 50.0),
                        percentile(&l.loaded.rtts, 99.0),
                    );
                    report.add(&format!("ping_loaded_p50_ms ({c})"), v, p50);
                    report.add(&format!("ping_loaded_p99_ms ({c})"), v, p99);
                    report.add(&format!("ping_added_p50_ms ({c})"), v, p50 - idle);
                    report.add(&format!("ping_added_p99_ms ({c})"), v, p99 - idle);
                }
            }
        }
    }
    progress("");
    eprintln!(
        "bandwidth: measured in {:.0}s",
        started.elapsed().as_secs_f64()
    );
    if !thin.is_empty() {
        report
            .notes
            .push(format!("samples short of data: {}", thin.join("; ")));
    }
    let kernel_at_end = crate::bridge_nf_read(spaces());
    report.set_kernel_settings(kernel_at_setup, &kernel_at_end);
    for m in report.metrics.keys().cloned().collect::<Vec<_>>() {
        if m.starts_with("ping_") || m.starts_with("tcp_retransmits") {
            report.better.insert(m, "lower".into());
        }
    }
    let cells: Vec<(Dir, u64, u32)> = Dir::ALL
        .iter()
        .flat_map(|&d| {
            rates
                .iter()
                .flat_map(move |&r| streams.iter().map(move |&n| (d, r, n)))
        })
        .collect();
    let lat_cells: Vec<(Dir, u64)> = Dir::ALL
        .iter()
        .flat_map(|&d| rates.iter().map(move |&r| (d, r)))
        .collect();
    charts(&mut report, &cells, &lat_cells);
    let summary = goals(&mut report, &cells, &lat_cells);
    eprint!("{summary}");

    step("tearing down");
    let failed = att.del_all();
    progress("");
    assert!(failed.is_empty(), "bandwidth: {}", failed.join("\n"));
    drop(sides);
    drop(world);
    report
}

/// The method's notes.
fn notes(report: &mut Report, sizes: &Sizes) {
    let Sizes {
        rounds,
        secs,
        ref rates_mbit,
        ref streams,
        pings,
    } = *sizes;
    report.notes.extend([
        format!("cells: rate {rates_mbit:?} Mbit/s × TCP streams {streams:?} × direction (egress: the limited pod sends to a peer pod of the same node without limits; ingress: the peer sends to it); measured rounds: {rounds}, after a warm-up round; the variants interleaved cell by cell, their order rotated per round"),
        format!("limits: runtimeConfig.bandwidth with ingressRate = egressRate = the rate (bit/s) and ingressBurst = egressBurst = rate / {BURST_SHARE} bits (100 ms of the rate), the same for both variants; one limited pod per rate per variant"),
        "rivet: rivetd + rivet-cni (release build), the pods attached by the plugin binary with capabilities {bandwidth: true} and runtimeConfig.bandwidth".into(),
        format!("reference: containernetworking-plugins from /usr/lib/cni, ptp (host-local {REF_SUBNET}, ipMasq false, mtu = rivet's pod MTU: both variants carry a GB in the same number of packets; the reference ran at 1,500 up to 2026-12-06) then bandwidth with prevResult and the same runtimeConfig.bandwidth (TBF on the host veth for ingress; ifb + TBF for egress, latency 25 ms as the plugin sets it), DEL in reverse order; the peer pod: ptp alone"),
        format!("accuracy: goodput at the receiver over seconds 1..{secs} ÷ rate (iperf3 -t {secs}, client = sender on CPU 0, server = receiver on CPU 1 with -J, its intervals fetched by the client with --get-server-output; a tail interval starting at {secs} s is left out); first_second_accuracy: the receiver's first interval ÷ rate; load_accuracy: the same for the loading flow of the latency samples (whole test)"),
        "cpu_s_per_gb: CPU-seconds per GB the receiver got during each throughput sample, as same-node measures it: the iperf3 client's and server's own run time (getrusage) + the ksoftirqd threads' run time (/proc/<pid>/schedstat). Shaping work done in a timer's softirq while a CPU idles (a TBF's watchdog dequeueing) is not in it, so a limiter that sleeps between packets is undercounted; the figure is what the flows' own tasks and ksoftirqd spent. At 10 Mbit/s a sample carries about 12 MB per 10 s, so 0.01 CPU-s of other work (ksoftirqd serves the whole machine) adds about 0.8 CPU-s/GB: the low rates' figures are the noisiest".into(),
        format!("{MACHINE_CPU}: the whole machine's busy CPU-seconds (every CPU's time minus its idle time, from the kernel's tick-sched idle accounting, which stops at each interrupt's entry: interrupts and softirqs taken from idle — a shaper's timer dequeueing, an ifb tasklet — count as busy) over the iperf3 client's run, per GB the receiver got: all the work, whoever does it, but also whatever else runs meanwhile (the same agents, the same idle namespaces for both variants; the benchmark's own process waits). Each reading is exact to the ns but for a CPU whose last idle transition is under 10 ms old (crate::machine_busy_secs)"),
        format!("ping: ping -n -i {PING_INTERVAL} -c {pings} -W 2 from the sender to the receiver, idle, then from {:.1} s after one iperf3 TCP stream started in the same direction (-t long enough to outlast the pings); ping_added_p50_ms / ping_added_p99_ms = the loaded p50 / p99 minus the idle p50 of the same round and variant; ping_loaded_loss_pct: echo requests without an answer under load; a loaded sample with fewer than {MIN_REPLIES} answers is not recorded (listed below)", SETTLE.as_secs_f64()),
    ]);
}

/// The cell chart: accuracy per cell with the goal band, the added ping
/// latency (p99, p50) and CPU per GB.
fn charts(report: &mut Report, cells: &[(Dir, u64, u32)], lat_cells: &[(Dir, u64)]) {
    let tput = |metric: &str| -> Vec<(String, String)> {
        cells
            .iter()
            .map(|&(d, r, n)| {
                let c = cell(d, r, n);
                (c.clone(), format!("{metric} ({c})"))
            })
            .collect()
    };
    let lat = |metric: &str| -> Vec<(String, String)> {
        lat_cells
            .iter()
            .map(|&(d, r)| {
                let c = lat_cell(d, r);
                (c.clone(), format!("{metric} ({c})"))
            })
            .collect()
    };
    report.cell_charts.push(CellChart {
        file: "cells".into(),
        title: "accuracy, added latency and CPU per cell".into(),
        panels: vec![
            CellPanel {
                y_desc: "accuracy (goodput ÷ rate, s 1..N)".into(),
                cells: tput("accuracy"),
                band: Some(BAND),
            },
            CellPanel {
                y_desc: "added ping p99 under load (ms)".into(),
                cells: lat("ping_added_p99_ms"),
                band: None,
            },
            CellPanel {
                y_desc: "added ping p50 under load (ms)".into(),
                cells: lat("ping_added_p50_ms"),
                band: None,
            },
            CellPanel {
                y_desc: "CPU-s per GB (flows' tasks + ksoftirqd)".into(),
                cells: tput("cpu_s_per_gb"),
                band: None,
            },
            CellPanel {
                y_desc: "CPU-s per GB (whole machine busy)".into(),
                cells: tput(MACHINE_CPU),
                band: None,
            },
        ],
    });
}

/// The goals, stated as met or not with their figures (not asserted),
/// into the notes; returns a summary table for the terminal.
fn goals(report: &mut Report, cells: &[(Dir, u64, u32)], lat_cells: &[(Dir, u64)]) -> String {
    let med = |metric: &str, v: &str| {
        report
            .metrics
            .get(metric)
            .and_then(|m| m.get(v))
            .map_or(f64::NAN, Series::median)
    };
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    let in_band = |a: f64| (BAND.0..=BAND.1).contains(&a);
    let mut lines = Vec::new();
    let mut table = String::from(
        "\nbandwidth: medians per cell (rivet / reference)\n\
         cell                 | accuracy        | first second    | CPU-s/GB tasks  | CPU-s/GB machine\n",
    );
    let (mut out_of_band, mut errs) = (Vec::new(), [Vec::new(), Vec::new()]);
    let (mut cpu_ratios, mut cpu_worse) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    for &(d, r, n) in cells {
        let c = cell(d, r, n);
        let acc = |v| med(&format!("accuracy ({c})"), v);
        let first = |v| med(&format!("first_second_accuracy ({c})"), v);
        let cpu = |v| med(&format!("cpu_s_per_gb ({c})"), v);
        let machine = |v| med(&format!("{MACHINE_CPU} ({c})"), v);
        let (a_r, a_f) = (acc("rivet"), acc("reference"));
        table.push_str(&format!(
            "{c:<20} | {a_r:>6.3} / {a_f:<6.3} | {:>6.3} / {:<6.3} | {:>6.3} / {:<6.3} | {:>6.3} / {:<6.3}\n",
            first("rivet"),
            first("reference"),
            cpu("rivet"),
            cpu("reference"),
            machine("rivet"),
            machine("reference")
        ));
        if in_band(a_f) && !in_band(a_r) {
            out_of_band.push(format!("{c}: {a_r:.3} (reference {a_f:.3})"));
        }
        if a_r.is_finite() && a_f.is_finite() {
            errs[0].push((a_r - 1.0).abs());
            errs[1].push((a_f - 1.0).abs());
        }
        let enforced = !(a_r.is_nan() || a_r > ENFORCED);
        let by_measure = [
            (cpu("rivet"), cpu("reference")),
            (machine("rivet"), machine("reference")),
        ];
        for (k, (c_r, c_f)) in by_measure.into_iter().enumerate() {
            if !enforced {
                cpu_worse[k].push(format!("{c}: not comparable, limit not enforced"));
            } else if c_r.is_finite() && c_f > 0.0 {
                cpu_ratios[k].push(c_r / c_f);
                if c_r > c_f {
                    cpu_worse[k].push(format!("{c}: {c_r:.3} vs {c_f:.3}"));
                }
            }
        }
    }
    let reference_in = cells
        .iter()
        .filter(|&&(d, r, n)| in_band(med(&format!("accuracy ({})", cell(d, r, n)), "reference")))
        .count();
    lines.push(format!(
        "goal: rivet's accuracy within {:.2}–{:.2} in every cell where the reference's is ({reference_in} of {} cells): {} — {}",
        BAND.0,
        BAND.1,
        cells.len(),
        if out_of_band.is_empty() {
            "all within".to_owned()
        } else {
            format!("outside in {}", out_of_band.join(", "))
        },
        verdict(out_of_band.is_empty() && reference_in > 0)
    ));
    let (e_r, e_f) = (percentile(&errs[0], 50.0), percentile(&errs[1], 50.0));
    lines.push(format!(
        "goal: median over cells of |accuracy − 1| below the reference's: rivet {e_r:.4}, reference {e_f:.4} — {}",
        verdict(e_r < e_f)
    ));
    table.push_str("cell                 | added ping p50 ms | added ping p99 ms | p99 ratio\n");
    let (mut lat_ratios, mut lat_worse) = (Vec::new(), Vec::new());
    for &(d, r) in lat_cells {
        let c = lat_cell(d, r);
        let p = |q: &str, v| med(&format!("ping_added_{q}_ms ({c})"), v);
        let (r99, f99) = (p("p99", "rivet"), p("p99", "reference"));
        let load = med(&format!("load_accuracy ({c})"), "rivet");
        let ratio = r99 / f99;
        table.push_str(&format!(
            "{c:<20} | {:>7.2} / {:<7.2} | {r99:>7.2} / {f99:<7.2} | {ratio:.3}\n",
            p("p50", "rivet"),
            p("p50", "reference"),
        ));
        if load.is_nan() || load > ENFORCED {
            lat_worse.push(format!(
                "{c}: not comparable, limit not enforced (load at {load:.1} × the rate)"
            ));
        } else if r99.is_finite() && f99.is_finite() {
            lat_ratios.push(ratio);
            if r99 > 0.2 * f99 {
                lat_worse.push(format!("{c}: {r99:.2} vs {f99:.2} ms"));
            }
        } else {
            lat_worse.push(format!("{c}: not measured"));
        }
    }
    lines.push(format!(
        "goal: added ping p99 under load ≤ 0.2 × the reference's in every rate × direction (where rivet held the loading flow to ≤ {ENFORCED:.2} × the rate): worst ratio {:.3} — {}{}",
        lat_ratios.iter().copied().fold(f64::NAN, f64::max),
        verdict(lat_worse.is_empty() && !lat_ratios.is_empty()),
        if lat_worse.is_empty() {
            String::new()
        } else {
            format!(" (above in {})", lat_worse.join(", "))
        }
    ));
    for (k, measure) in [
        "the flows' tasks + ksoftirqd",
        "the whole machine's busy time",
    ]
    .into_iter()
    .enumerate()
    {
        lines.push(format!(
            "goal: CPU per GB ({measure}) ≤ the reference's in every cell (where rivet's accuracy ≤ {ENFORCED:.2}): median over those cells of rivet ÷ reference {:.3} — {}{}",
            percentile(&cpu_ratios[k], 50.0),
            verdict(cpu_worse[k].is_empty() && !cpu_ratios[k].is_empty()),
            if cpu_worse[k].is_empty() {
                String::new()
            } else {
                format!(" (above in {})", cpu_worse[k].join(", "))
            }
        ));
    }
    for l in &lines {
        table.push_str(l);
        table.push('\n');
    }
    report.notes.extend(lines);
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_output() {
        let text = "PING 10.1.1.2 (10.1.1.2) 56(84) bytes of data.\n\
            64 bytes from 10.1.1.2: icmp_seq=1 ttl=63 time=0.051 ms\n\
            64 bytes from 10.1.1.2: icmp_seq=3 ttl=63 time=12.5 ms\n\
            64 bytes from 10.1.1.2: icmp_seq=3 ttl=63 time=12.6 ms (DUP!)\n\
            \n--- 10.1.1.2 ping statistics ---\n\
            3 packets transmitted, 2 received, +1 duplicates, 33.3333% packet loss, time 22ms\n\
            rtt min/avg/max/mdev = 0.051/6.2/12.5/6.2 ms, pipe 2\n";
        let p = parse_pings(text).expect("parses");
        assert_eq!((p.sent, p.received), (3, 2));
        assert_eq!(p.rtts, vec![0.051, 12.5]);
        assert!((p.loss_pct() - 100.0 / 3.0).abs() < 1e-9);
        let none = "--- x ping statistics ---\n5 packets transmitted, 0 received, 100% packet loss, time 40ms\n";
        assert_eq!(parse_pings(none).expect("parses").rtts, Vec::<f64>::new());
        assert!(parse_pings("64 bytes from 10.1.1.2: icmp_seq=1 ttl=63 time=? ms\n").is_err());
        assert!(parse_pings("64 bytes from 10.1.1.2: icmp_seq=1 ttl=63 time=1 ms\n").is_err());
        let mismatch = "64 bytes from a: icmp_seq=1 time=1 ms\n2 packets transmitted, 2 received, 0% packet loss\n";
        assert!(parse_pings(mismatch).is_err());
    }

    #[test]
    fn receiver_intervals_skip_the_first_second_and_the_tail() {
        let iv = |start: f64, seconds: f64, bytes: f64| json!({"sum": {"start": start, "seconds": seconds, "bytes": bytes}});
        let json = json!({"server_output_json": {"intervals": [
            iv(0.0, 1.0, 2_500_000.0),
            iv(1.0, 1.0, 1_250_000.0),
            iv(2.0, 1.0, 1_250_000.0),
            iv(3.0, 0.1, 1_000_000.0),
        ]}});
        let r = receiver_intervals(&json, 3).expect("parses");
        assert_eq!(r.first_bps, 20e6);
        assert_eq!(r.rest_bps, 10e6);
        assert_eq!(r.rest_secs, 2.0);
        assert!(receiver_intervals(&json!({"end": {}}), 3).is_err());
        let only_first = json!({"server_output_json": {"intervals": [iv(0.0, 1.0, 1.0)]}});
        assert!(receiver_intervals(&only_first, 3).is_err());
    }

    #[test]
    fn labels_and_limits() {
        assert_eq!(cell(Dir::Ingress, 100_000_000, 4), "ingress 100M x4");
        assert_eq!(lat_cell(Dir::Egress, 10_000_000), "egress 10M");
        let b = bandwidth_conf(10_000_000);
        assert_eq!(b["egressBurst"], 1_000_000);
        assert_eq!(b["ingressRate"], 10_000_000);
        let q = Sizes::quick(1, 3);
        assert_eq!((q.rates_mbit.as_slice(), q.secs), (&[10, 100][..], 3));
    }
}
