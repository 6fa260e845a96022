//! `bgp` mode: how fast what BGP announces reaches the datapath, in a
//! node-to-node mesh and through route reflectors, at 10 and 50 nodes; how
//! fast a stopped node is withdrawn; what routing on BGP costs in
//! throughput against the fabric's own host-to-host path and against
//! rivet's VXLAN over the same fabric; and memory at 50 peers.
//!
//! Convergence worlds (one per topology and size, both sizes' two
//! topologies built side by side and measured interleaved): three real
//! rivet nodes (agents in `bgp` mode, hold time 3 s) and N − 3 emulated
//! nodes — BIRD alone in a node namespace on the same underlay, announcing
//! its pod CIDR like a rivet node does, with the same timers. `mesh`: every
//! speaker peers with every other (N − 1 sessions each); `reflectors`:
//! the first two rivet nodes reflect (cluster ID 1.0.0.1), every other
//! node peers with those two only. The rivet nodes learn the cluster's
//! nodes through their API (as from a cluster store).
//!
//! - `announce_to_datapath_ms`: an emulated node starts announcing a new
//!   /24 (its BIRD reconfigured through the control socket) → the prefix
//!   is in all three rivet nodes' ROUTES (read through their API, polled
//!   every millisecond); the slowest of the three. `withdraw_to_datapath_ms`:
//!   the same prefix withdrawn → gone from all three.
//! - `node_stop_withdrawal_ms`: once per world, an emulated node's uplink
//!   goes down (no FIN, no notification) → its pod CIDR gone from all
//!   three (the hold time, 3 s, is most of it).
//! - `agent_rss_mib`, `speaker_rss_mib` (50 nodes): VmRSS of the first rivet
//!   node's agent and of its BIRD after convergence.
//!
//! Throughput world: two racks behind top-of-rack routers (BIRD, eBGP, no
//! L2 between racks), two nodes per rack: one pair in `bgp` mode (eBGP to
//! its router), one pair in `vxlan` mode (static peers), one pod each.
//! `underlay`: iperf3 from one rack's `bgp` node to the other's (the
//! fabric's own host-to-host path, the baseline); `bgp`: pod to pod across
//! racks, routed natively on what BGP learned; `vxlan`: pod to pod across
//! racks through rivet's VXLAN. Client on CPU 0, server on CPU 1.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use rivet::cluster::bgp::bird::Control;
use rivet_api::{NodeEntry, Request, Response};
use rivet_tests::{
    World,
    bgp::{BIRD, Fabric, wait_for},
    traffic::{ChildGuard, iperf3_client, iperf3_server},
};

use crate::{Options, Report, percentile, progress, rotated, rss_mib};

/// The convergence topologies.
const TOPOLOGIES: [&str; 2] = ["mesh", "reflectors"];
/// The throughput variants.
const PATHS: [&str; 3] = ["underlay", "bgp", "vxlan"];
/// Hold time of every session in the convergence worlds.
const HOLD: u16 = 3;
/// Real rivet nodes per convergence world.
const REAL: usize = 3;
/// The route reflectors' cluster ID.
const CLUSTER_ID: &str = "1.0.0.1";

/// The kernel's ARP table is one for every network namespace: a world of
/// 50 nodes in a mesh needs 50 × 49 neighbours on one kernel (separate
/// machines would each hold 49), beyond the default `gc_thresh3` of 1,024
/// ("neighbor table overflow": sessions stuck in Connect). Raised for the
/// run, put back when it ends (also on a panic), reported with the other
/// kernel settings.
struct NeighbourTable {
    old: Vec<(&'static str, String)>,
}

/// The thresholds and the values of the run.
const NEIGHBOUR_THRESHOLDS: [(&str, &str); 2] = [
    ("/proc/sys/net/ipv4/neigh/default/gc_thresh2", "8192"),
    ("/proc/sys/net/ipv4/neigh/default/gc_thresh3", "16384"),
];

impl NeighbourTable {
    fn raise() -> Self {
        let mut old = Vec::new();
        for (path, value) in NEIGHBOUR_THRESHOLDS {
            let was = std::fs::read_to_string(path)
                .unwrap_or_else(|e| panic!("reading {path}: {e}"))
                .trim()
                .to_owned();
            std::fs::write(path, value).unwrap_or_else(|e| panic!("writing {path}: {e}"));
            old.push((path, was));
        }
        Self { old }
    }

    /// `gc_thresh2 = a → b` for the report.
    fn describe(&self) -> String {
        self.old
            .iter()
            .zip(NEIGHBOUR_THRESHOLDS)
            .map(|((path, was), (_, now))| {
                format!("{} {was} → {now}", path.rsplit('/').next().unwrap_or(path))
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl Drop for NeighbourTable {
    fn drop(&mut self) {
        for (path, was) in &self.old {
            let _ = std::fs::write(path, was);
        }
    }
}

/// One convergence world.
struct Cluster {
    w: World,
    /// BIRD of each emulated node, by node index.
    speakers: Vec<(usize, ChildGuard, std::path::PathBuf, std::path::PathBuf)>,
}

fn routes(w: &World, n: usize) -> Vec<NodeEntry> {
    match w.nodes[n].agent().client().call(&Request::NodeList {}) {
        Ok(Response::Nodes { nodes }) => nodes,
        other => panic!("node list of {}: {other:?}", w.nodes[n].name),
    }
}

/// An emulated node's BIRD configuration: its pod CIDR (and `extra`)
/// announced to `peers`, nothing imported.
fn emulated_config(me: Ipv4Addr, announce: &[String], peers: &[Ipv4Addr]) -> String {
    let mut s = format!("router id {me};\nprotocol device {{}}\nprotocol static own {{\n  ipv4;\n");
    for net in announce {
        s.push_str(&format!("  route {net} blackhole;\n"));
    }
    s.push_str("}\n");
    for (i, p) in peers.iter().enumerate() {
        s.push_str(&format!(
            "protocol bgp p{i} {{\n  local {me} as 64512;\n  neighbor {p} as 64512;\n  hold time {HOLD};\n  keepalive time 1;\n  connect delay time 1;\n  connect retry time 2;\n  ipv4 {{ import none; export where proto = \"own\"; }};\n}}\n"
        ));
    }
    s
}

impl Cluster {
    fn build(nodes: usize, topology: &str) -> Self {
        let mut w = World::new();
        let all: Vec<usize> = (0..nodes).map(|_| w.add_node()).collect();
        let ips: Vec<Ipv4Addr> = all.iter().map(|&n| w.nodes[n].ip).collect();
        let reflectors = format!("{},{}", ips[0], ips[1]);
        for &n in &all[..REAL] {
            let mut args: Vec<String> = ["--mode", "bgp", "--bgp-hold-time", &HOLD.to_string()]
                .map(String::from)
                .to_vec();
            if topology == "reflectors" {
                args.extend(["--bgp-reflectors".into(), reflectors.clone()]);
                if n < 2 {
                    args.extend(["--bgp-reflector-cluster-id".into(), CLUSTER_ID.into()]);
                }
            }
            w.nodes[n].agent_args.extra_args = args;
            w.start_agent(n);
        }
        // The rivet nodes learn every node, as from a cluster store.
        for &a in &all[..REAL] {
            for &b in &all {
                if a == b {
                    continue;
                }
                let r = w.nodes[a]
                    .agent()
                    .client()
                    .call(&Request::NodeSet(NodeEntry {
                        subnet: w.nodes[b].pod_cidr.clone(),
                        node_ip: w.nodes[b].ip,
                        vtep_mac: None,
                        vni: None,
                        route: None,
                    }));
                assert!(matches!(r, Ok(Response::Nodes { .. })), "node set: {r:?}");
            }
        }
        let mut speakers = Vec::new();
        for &n in &all[REAL..] {
            let me = w.nodes[n].ip;
            let peers: Vec<Ipv4Addr> = if topology == "mesh" {
                ips.iter().copied().filter(|ip| *ip != me).collect()
            } else {
                ips[..2].to_vec()
            };
            let conf = w.dir.join(format!("emulated-{n}.conf"));
            let ctl = w.dir.join(format!("emulated-{n}.ctl"));
            std::fs::write(
                &conf,
                emulated_config(me, &[w.nodes[n].pod_cidr.clone()], &peers),
            )
            .unwrap_or_else(|e| panic!("writing {}: {e}", conf.display()));
            let child = w.nodes[n]
                .ns
                .command(BIRD)
                .args(["-f", "-c"])
                .arg(&conf)
                .arg("-s")
                .arg(&ctl)
                .stdin(std::process::Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("starting {BIRD}: {e}"));
            speakers.push((n, ChildGuard(child), conf, ctl));
        }
        let c = Self { w, speakers };
        let took = c.wait_all(Duration::from_secs(120));
        progress(&format!(
            "bgp: {nodes} nodes ({topology}) converged {took:.1?} after the last agent started"
        ));
        c
    }

    /// Waits until every rivet node routes every other node's pod CIDR;
    /// on a timeout, what the lagging nodes' speakers say is printed.
    fn wait_all(&self, timeout: Duration) -> Duration {
        let n = self.w.nodes.len();
        let start = Instant::now();
        loop {
            let counts: Vec<usize> = (0..REAL).map(|r| routes(&self.w, r).len()).collect();
            if counts.iter().all(|c| *c == n - 1) {
                return start.elapsed();
            }
            if start.elapsed() > timeout {
                for (r, c) in counts.iter().enumerate() {
                    if *c != n - 1 {
                        let status = self.w.nodes[r].agent().client().call(&Request::Bgp {});
                        eprintln!("rivet node {r}: {c} routes; {status:?}");
                    }
                }
                panic!("every route in every rivet node: not after {timeout:?}: {counts:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Milliseconds until `present(subnet)` holds in all three rivet nodes.
    fn until_all(&self, subnet: &str, present: bool) -> f64 {
        let start = Instant::now();
        let mut pending: Vec<usize> = (0..REAL).collect();
        while !pending.is_empty() {
            pending.retain(|&r| routes(&self.w, r).iter().any(|e| e.subnet == subnet) != present);
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{subnet} {} in rivet nodes {pending:?} after 30 s",
                if present {
                    "not learned"
                } else {
                    "not withdrawn"
                }
            );
            if !pending.is_empty() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        start.elapsed().as_secs_f64() * 1e3
    }

    /// One announce + withdraw of a new /24 by emulated node `e`: (ms to
    /// every datapath, ms until gone from every datapath).
    fn announce_and_withdraw(&self, e: usize, round: usize) -> (f64, f64) {
        let (n, _, conf, ctl) = &self.speakers[e % self.speakers.len()];
        let node = &self.w.nodes[*n];
        let me = node.ip;
        let peers = peers_of(conf);
        let extra = format!("10.{}.{}.0/24", self.w.k, 100 + round % 150);
        let reconfigure = |announce: &[String]| {
            std::fs::write(conf, emulated_config(me, announce, &peers))
                .unwrap_or_else(|e| panic!("writing {}: {e}", conf.display()));
            let reply = Control::connect(ctl)
                .and_then(|mut c| c.command("configure"))
                .unwrap_or_else(|e| panic!("reconfiguring an emulated node: {e}"));
            assert!(reply.contains("Reconfigured"), "{reply}");
        };
        reconfigure(&[node.pod_cidr.clone(), extra.clone()]);
        let up = self.until_all(&extra, true);
        reconfigure(std::slice::from_ref(&node.pod_cidr));
        let down = self.until_all(&extra, false);
        (up, down)
    }

    /// An emulated node's uplink goes down: ms until its pod CIDR is gone
    /// from every rivet node.
    fn stop_one(&self) -> f64 {
        let (n, ..) = &self.speakers[self.speakers.len() - 1];
        let node = &self.w.nodes[*n];
        node.ns.ip(&["link", "set", "eth0", "down"]);
        self.until_all(&node.pod_cidr, false)
    }

    /// VmRSS (MiB) of the first rivet node's agent and of its BIRD.
    fn memory(&self) -> (f64, f64) {
        let node = &self.w.nodes[0];
        let agent = node.agent().pid().map_or(f64::NAN, rss_mib);
        let bird = std::fs::read_to_string(node.agent_args.state_dir.join("bgp/bird.pid"))
            .ok()
            .and_then(|p| p.trim().parse().ok())
            .map_or(f64::NAN, rss_mib);
        (agent, bird)
    }
}

/// The neighbours an emulated node's configuration names.
fn peers_of(conf: &std::path::Path) -> Vec<Ipv4Addr> {
    std::fs::read_to_string(conf)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            l.trim()
                .strip_prefix("neighbor ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// The throughput world: racks, two `bgp` nodes and two `vxlan` nodes, a
/// pod on each.
struct Racks {
    w: World,
    fabric: Fabric,
    /// (client namespace's node or pod, server's, server address) per path.
    bgp_nodes: (usize, usize),
    bgp_pods: (usize, usize),
    vxlan_pods: (usize, usize),
}

impl Racks {
    fn build() -> Self {
        let mut w = World::new();
        let mut fabric = Fabric::new(&w);
        let (t1, t2) = (fabric.add_rack(65101), fabric.add_rack(65102));
        fabric.link(t1, t2);
        let a = fabric.add_node(&mut w, t1);
        let b = fabric.add_node(&mut w, t2);
        let c = fabric.add_node(&mut w, t1);
        let d = fabric.add_node(&mut w, t2);
        fabric.tors[t1].peer_with(w.nodes[a].ip, 65001);
        fabric.tors[t2].peer_with(w.nodes[b].ip, 65002);
        fabric.start();
        for (n, t, asn) in [(a, t1, 65001), (b, t2, 65002)] {
            w.nodes[n].agent_args.extra_args = fabric.tors[t].node_flags(asn, &[]);
            w.start_agent(n);
        }
        for n in [c, d] {
            w.nodes[n].agent_args.extra_args = vec!["--mode".into(), "vxlan".into()];
            w.start_agent(n);
        }
        for (n, other) in [(c, d), (d, c)] {
            let entry = NodeEntry {
                subnet: w.nodes[other].pod_cidr.clone(),
                node_ip: w.nodes[other].ip,
                vtep_mac: None,
                vni: None,
                route: None,
            };
            let r = w.nodes[n].agent().client().call(&Request::NodeSet(entry));
            assert!(matches!(r, Ok(Response::Nodes { .. })), "node set: {r:?}");
        }
        for n in [a, b] {
            wait_for("the other rack's route", Duration::from_secs(60), || {
                let r = routes(&w, n);
                (r.len() == 1, r)
            });
        }
        let pods = [a, b, c, d].map(|n| w.add_pod(n));
        Self {
            w,
            fabric,
            bgp_nodes: (a, b),
            bgp_pods: (pods[0], pods[1]),
            vxlan_pods: (pods[2], pods[3]),
        }
    }

    /// One iperf3 sample of `path`, Gbit/s.
    fn sample(&self, path: &str, secs: u32) -> f64 {
        let w = &self.w;
        let (client, server, ip) = match path {
            "underlay" => (
                &w.nodes[self.bgp_nodes.0].ns,
                &w.nodes[self.bgp_nodes.1].ns,
                w.nodes[self.bgp_nodes.1].ip,
            ),
            "bgp" => (
                &w.pods[self.bgp_pods.0].ns,
                &w.pods[self.bgp_pods.1].ns,
                w.pods[self.bgp_pods.1].ip,
            ),
            _ => (
                &w.pods[self.vxlan_pods.0].ns,
                &w.pods[self.vxlan_pods.1].ns,
                w.pods[self.vxlan_pods.1].ip,
            ),
        };
        let srv = iperf3_server(server, 5201, Some(1));
        let res = iperf3_client(client, ip, 5201, secs, 1, Some(0));
        drop(srv);
        res.bits_per_second / 1e9
    }
}

/// The whole benchmark (`sizes`: numbers of nodes of the convergence
/// worlds).
pub fn run(opts: &Options, sizes: &[usize]) -> Report {
    let mut report = Report {
        name: "bgp".into(),
        variants: TOPOLOGIES
            .iter()
            .chain(PATHS.iter())
            .map(|s| (*s).to_owned())
            .collect(),
        baseline: "mesh".into(),
        ..Report::default()
    };
    let samples = opts.pick(20, 4);
    let neighbours = NeighbourTable::raise();
    report.notes.push(format!(
        "kernel (global, every namespace): ARP table {} for the run, restored after",
        neighbours.describe()
    ));
    for &n in sizes {
        let clusters: Vec<(&str, Cluster)> = TOPOLOGIES
            .iter()
            .map(|t| (*t, Cluster::build(n, t)))
            .collect();
        let mut up_all: Vec<Vec<f64>> = vec![Vec::new(); TOPOLOGIES.len()];
        for round in 0..samples {
            for (i, (topology, c)) in
                rotated(&clusters.iter().enumerate().collect::<Vec<_>>(), round)
                    .map(|(i, x)| (i, (x.0, &x.1)))
            {
                progress(&format!(
                    "bgp: {n} nodes, {topology}, sample {}/{samples}",
                    round + 1
                ));
                let (up, down) = c.announce_and_withdraw(round, round);
                report.add(&format!("announce_to_datapath_ms_n{n}"), topology, up);
                report.add(&format!("withdraw_to_datapath_ms_n{n}"), topology, down);
                up_all[i].push(up);
            }
        }
        for (i, (topology, c)) in clusters.iter().enumerate() {
            report.notes.push(format!(
                "{n} nodes, {topology}: announce → every datapath p50 {:.1} ms, p99 {:.1} ms ({} samples)",
                percentile(&up_all[i], 50.0),
                percentile(&up_all[i], 99.0),
                up_all[i].len()
            ));
            if n >= 50 {
                let (agent, speaker) = c.memory();
                report.add(&format!("agent_rss_mib_n{n}"), topology, agent);
                report.add(&format!("speaker_rss_mib_n{n}"), topology, speaker);
            }
            let stop = c.stop_one();
            report.add(&format!("node_stop_withdrawal_ms_n{n}"), topology, stop);
        }
    }
    progress("bgp: throughput across racks");
    let racks = Racks::build();
    let spaces = || crate::world_spaces(&racks.w).chain(racks.fabric.tors.iter().map(|t| &t.ns));
    let kernel_at_setup = crate::bridge_nf_off(spaces());
    for round in 0..opts.rounds as usize {
        for path in rotated(&PATHS, round) {
            progress(&format!("bgp: {path}, round {}/{}", round + 1, opts.rounds));
            report.add("throughput_gbps", path, racks.sample(path, opts.secs));
        }
    }
    report.set_kernel_settings(kernel_at_setup, &crate::bridge_nf_read(spaces()));
    let bgp = report
        .metrics
        .get("throughput_gbps")
        .and_then(|m| Some((m.get("bgp")?.median(), m.get("underlay")?.median())));
    if let Some((bgp, underlay)) = bgp {
        report.notes.push(format!(
            "goal: pod → pod across racks ≥ 0.97 × the underlay host → host: {:.3} — {}",
            bgp / underlay,
            if bgp / underlay >= 0.97 {
                "met"
            } else {
                "NOT met"
            }
        ));
    }
    report.notes.push(format!(
        "{} racks' routers: BIRD {}, eBGP, hold time 3 s; convergence worlds: hold time {HOLD} s, 3 rivet nodes + emulated nodes (BIRD only); rivet nodes polled through their API every 1 ms",
        racks.fabric.tors.len(),
        bird_version()
    ));
    drop(racks);
    drop(neighbours);
    report
}

fn bird_version() -> String {
    std::process::Command::new(BIRD)
        .arg("--version")
        .output()
        .map(|o| {
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            text.trim().trim_start_matches("BIRD version ").to_owned()
        })
        .unwrap_or_else(|e| format!("(not run: {e})"))
}
