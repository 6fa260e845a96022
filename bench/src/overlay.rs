//! Cross-node pod → pod: the underlay itself (node → node), flannel's
//! kernel vxlan device, and rivet in every mode, interleaved, for two
//! underlay behaviours:
//!
//! - `veth`: the veth default — TSO and checksum offload carried, so GSO
//!   trains cross the underlay whole;
//! - `nic`: NIC-like — software GSO and checksums on the senders' uplinks
//!   and the underlay bridge ports, NAPI GRO on the receiving uplinks, so
//!   frames on the wire are MTU-sized and receive aggregation decides speed.
//!
//! `rivet-vxlan-nogro` is rivet vxlan with its idle `rivet_vxlan` device
//! deleted: the measurement behind keeping that device (receive GRO).
//!
//! For investigations (not used by the suite): `RIVET_OVERLAY_VARIANTS`
//! (comma-separated) measures only those variants (`underlay` and
//! `kernel-vxlan` are always kept: they are the baselines), and
//! `RIVET_OVERLAY_PERF=<dir>` records a system-wide `perf record -g`
//! profile of every measured sample into
//! `<dir>/<behaviour>-<variant>-<round>.data`.

use std::{net::Ipv4Addr, time::Instant};

use ipnet::Ipv4Net;

use crate::{Options, Report, iperf3_cpu, percentile, progress};
use rivet_tests::{
    Netns, World, flannel,
    traffic::{iperf3_server, ping_times},
};

/// The variants, in display order.
const VARIANTS: [&str; 7] = [
    "underlay",
    "kernel-vxlan",
    "rivet-vxlan",
    "rivet-vxlan-nogro",
    "rivet-ipip",
    "rivet-native",
    "rivet-hybrid",
];

/// Builds the kernel-vxlan world: two flannel-style nodes, a bridge pod on
/// each. Returns the world and the pods (client, server).
fn flannel_world() -> (World, flannel::FlannelPod, flannel::FlannelPod) {
    let mut w = World::new();
    let a = w.add_node();
    let b = w.add_node();
    let k = w.k;
    let sub = |i: u8| -> Ipv4Net { format!("10.{k}.{i}.0/24").parse().expect("subnet") };
    let fa = flannel::setup_node(&w, a, sub(1));
    let fb = flannel::setup_node(&w, b, sub(2));
    flannel::add_peer(&w, &fa, fb.subnet, &fb.vtep_mac, w.nodes[b].ip);
    flannel::add_peer(&w, &fb, fa.subnet, &fa.vtep_mac, w.nodes[a].ip);
    let pa = flannel::add_pod(&w, &fa, "fa");
    let pb = flannel::add_pod(&w, &fb, "fb");
    (w, pa, pb)
}

/// A two-node rivet cluster in `mode` with one pod per node.
fn rivet_world(mode: &str) -> (World, usize, usize) {
    let mut w = World::new();
    let nodes = w.add_static_cluster(2, mode);
    let a = w.add_pod(nodes[0]);
    let b = w.add_pod(nodes[1]);
    (w, a, b)
}

/// Runs the benchmark.
pub fn run(opts: &Options) -> Report {
    let (rounds, secs) = (opts.rounds, opts.secs);
    let only: Option<Vec<String>> = std::env::var("RIVET_OVERLAY_VARIANTS")
        .ok()
        .map(|v| v.split(',').map(|s| s.trim().to_owned()).collect());
    let wanted = |v: &str| {
        matches!(v, "underlay" | "kernel-vxlan")
            || only.as_ref().is_none_or(|o| o.iter().any(|x| x == v))
    };
    let perf_dir = std::env::var_os("RIVET_OVERLAY_PERF").map(std::path::PathBuf::from);
    let setup = Instant::now();
    progress("overlay: building the worlds (two at a time)");
    // Independent worlds (own namespaces, prefixes and address plans),
    // built two at a time: most of a world's setup is its agents loading
    // and verifying the datapath, one CPU each (more at once and an agent
    // may miss its 10 s readiness deadline on a busy 2-CPU machine).
    let (fw, fpa, fpb) = flannel_world();
    let mut rivet: Vec<(&str, World, usize, usize)> = Vec::new();
    let all = [
        ("rivet-vxlan", "vxlan"),
        ("rivet-vxlan-nogro", "vxlan"),
        ("rivet-ipip", "ipip"),
        ("rivet-native", "native"),
        ("rivet-hybrid", "hybrid"),
    ];
    let all: Vec<_> = all.into_iter().filter(|p| wanted(p.0)).collect();
    for pair in all.chunks(2) {
        progress(&format!(
            "overlay: building {} [{:.0}s]",
            pair.iter().map(|p| p.0).collect::<Vec<_>>().join(" + "),
            setup.elapsed().as_secs_f64()
        ));
        std::thread::scope(|s| {
            let builders: Vec<_> = pair
                .iter()
                .map(|&(variant, mode)| {
                    s.spawn(move || {
                        let (w, a, b) = rivet_world(mode);
                        if variant == "rivet-vxlan-nogro" {
                            for n in &w.nodes {
                                n.ns.ip(&["link", "del", rivet::node::VXLAN_DEV]);
                            }
                        }
                        (variant, w, a, b)
                    })
                })
                .collect();
            for b in builders {
                rivet.push(b.join().unwrap_or_else(|e| std::panic::resume_unwind(e)));
            }
        });
    }
    eprintln!(
        "overlay: worlds built in {:.0}s",
        setup.elapsed().as_secs_f64()
    );
    // The same bridge-netfilter setting in every namespace of every
    // variant (the flannel nodes' cni0 and every underlay br0 included).
    let spaces_all = || {
        crate::world_spaces(&fw)
            .chain([&fpa.ns, &fpb.ns])
            .chain(rivet.iter().flat_map(|r| crate::world_spaces(&r.1)))
    };
    let kernel_at_setup = crate::bridge_nf_off(spaces_all());
    let endpoints = |variant: &str| -> (&Netns, &Netns, Ipv4Addr) {
        match variant {
            "underlay" => (&fw.nodes[0].ns, &fw.nodes[1].ns, fw.nodes[1].ip),
            "kernel-vxlan" => (&fpa.ns, &fpb.ns, fpb.ip),
            _ => {
                let (_, w, a, b) = rivet.iter().find(|r| r.0 == variant).expect("variant");
                (&w.pods[*a].ns, &w.pods[*b].ns, w.pods[*b].ip)
            }
        }
    };

    let mut report = Report {
        name: "overlay: cross-node pod → pod".into(),
        variants: VARIANTS
            .iter()
            .filter(|v| wanted(v))
            .map(|v| (*v).to_owned())
            .collect(),
        baseline: "kernel-vxlan".into(),
        ..Default::default()
    };
    for b in ["veth", "nic"] {
        report
            .better
            .insert(format!("throughput_gbps ({b})"), "higher".into());
        report
            .better
            .insert(format!("rtt_p50_ms ({b})"), "lower".into());
        for side in ["client", "server"] {
            report
                .better
                .insert(format!("{side}_cpu_s_per_gb ({b})"), "lower".into());
        }
    }
    report.notes.push(format!(
        "iperf3 single stream, {secs} s per sample, client on CPU 0 and server on CPU 1; {rounds} interleaved rounds after a warm-up round, per underlay behaviour (--quick: nic only)"
    ));
    let pings = opts.pick(50, 20);
    report.notes.push("client_cpu_s_per_gb / server_cpu_s_per_gb: CPU seconds of the iperf3 client (CPU 0) and server (CPU 1) per GB received, from iperf3's own rusage (user + system: the scheduler's exact run time, µs resolution) — this kernel has no IRQ time accounting, so that includes the softirq work done in their context, i.e. nearly the whole datapath, most of it on the client's CPU; the cost per byte, steadier than throughput on a shared machine".into());
    report.notes.push(format!(
        "rtt: median of ping -c {pings} -i 0.005 reply times; --quick: the warm-up round is 10 pings, no iperf3"
    ));
    report.notes.push("veth: the veth default (TSO/checksum offload carried end to end); nic: tso/tx-checksum off on the node uplinks and underlay bridge ports, GRO on (NAPI) at the receiving uplinks".into());
    report.notes.push("underlay: node → node over eth0 (no encapsulation); kernel-vxlan: flannel.1 (VNI 1, port 8472, nolearning, onlink route + permanent neighbour + FDB per peer) with pods behind the reference bridge plugin, as flannel's vxlan backend sets a node up".into());
    report.notes.push("rivet-*: rivetd --mode vxlan|ipip|native|hybrid, static cluster of two nodes on one L2 (hybrid therefore routes natively); rivet-vxlan-nogro: rivet vxlan with the idle rivet_vxlan GRO device deleted".into());

    // A smoke run measures the NIC-like underlay only (set up on top of
    // the veth default, so both setups run).
    let behaviours: &[&str] = opts.pick(&["veth", "nic"], &["nic"]);
    let variants: Vec<&str> = VARIANTS.into_iter().filter(|v| wanted(v)).collect();
    let total = (rounds + 1) as usize * variants.len() * behaviours.len();
    let started = Instant::now();
    let mut done = 0;
    for &behaviour in behaviours {
        if behaviour == "nic" {
            flannel::nic_like(&fw);
            for (_, w, _, _) in &rivet {
                flannel::nic_like(w);
            }
        }
        for round in 0..=rounds {
            for variant in crate::rotated(&variants, round as usize) {
                done += 1;
                progress(&format!(
                    "overlay ({behaviour}): round {round}/{rounds} {variant:<18} [{done}/{total}, {:.0}s]",
                    started.elapsed().as_secs_f64()
                ));
                let (client, server, ip) = endpoints(variant);
                if round == 0 && opts.quick {
                    // A smoke run's warm-up: pings only (iperf3's
                    // shortest test is 1 s).
                    ping_times(client, ip, 10, 0.005);
                    continue;
                }
                let t = if round == 0 { 1 } else { secs };
                let srv = iperf3_server(server, 5201, Some(1));
                let perf = (round > 0)
                    .then_some(perf_dir.as_ref())
                    .flatten()
                    .map(|dir| perf_record(dir, &format!("{behaviour}-{variant}-{round}"), t));
                let res = iperf3_cpu(client, ip, 5201, t, None);
                if let Some(mut p) = perf {
                    let _ = p.wait();
                }
                drop(srv);
                let rtt = ping_times(client, ip, pings, 0.005);
                if round > 0 {
                    report.add(
                        &format!("throughput_gbps ({behaviour})"),
                        variant,
                        res.bits_per_second / 1e9,
                    );
                    if let Some((client_s, server_s)) = res.cpu_s {
                        let gb = res.gbytes();
                        report.add(
                            &format!("client_cpu_s_per_gb ({behaviour})"),
                            variant,
                            client_s / gb,
                        );
                        report.add(
                            &format!("server_cpu_s_per_gb ({behaviour})"),
                            variant,
                            server_s / gb,
                        );
                    }
                    if !rtt.is_empty() {
                        report.add(
                            &format!("rtt_p50_ms ({behaviour})"),
                            variant,
                            percentile(&rtt, 50.0),
                        );
                    }
                }
            }
        }
    }
    progress("");
    eprintln!("overlay: done in {:.0}s", started.elapsed().as_secs_f64());
    let kernel_at_end = crate::bridge_nf_read(spaces_all());
    report.set_kernel_settings(kernel_at_setup, &kernel_at_end);
    report.notes.push(format!("order: {}", crate::ROTATION));
    let teardown = Instant::now();
    drop((fpa, fpb));
    // Torn down side by side too (agents stopped, pins and namespaces
    // removed by each world's guards).
    std::thread::scope(|s| {
        s.spawn(move || drop(fw));
        for r in rivet.drain(..) {
            s.spawn(move || drop(r));
        }
    });
    eprintln!(
        "overlay: worlds removed in {:.0}s",
        teardown.elapsed().as_secs_f64()
    );
    report
}

/// `perf record -a -g` for most of one sample (started with the client,
/// stopping a little before it so the profile holds only the transfer).
fn perf_record(dir: &std::path::Path, name: &str, secs: u32) -> std::process::Child {
    let _ = std::fs::create_dir_all(dir);
    let out = dir.join(format!("{name}.data"));
    std::process::Command::new("perf")
        .args(["record", "-q", "-a", "-g", "-o"])
        .arg(&out)
        .args(["--", "sleep", &secs.saturating_sub(1).max(1).to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("perf record: {e}"))
}
