//! Same-node pod-to-pod: rivet vs the reference bridge and ptp plugins vs a
//! direct veth pair (the physical limit), interleaved.

use std::{
    net::{Ipv4Addr, SocketAddr},
    time::Instant,
};

use crate::{
    CpuSample, Options, Report,
    conn::{connection_loop, echo_server, one_byte_server, ping_pong},
    iperf3_cpu, ksoftirqd_secs, percentile, progress,
};
use rivet_tests::{
    Netns, World,
    cni::{Plugin, result_ip},
    traffic::{iperf3_server, ping},
    unique_prefix,
};

/// A client/server pair of namespaces with the server's address.
struct Pair {
    name: &'static str,
    client: &'static str,
    server_ns_index: usize,
    client_ns_index: usize,
    server_ip: Ipv4Addr,
}

/// A pod attached by a reference plugin, to DEL at the end.
struct CniPod {
    plugin: &'static str,
    id: String,
    node: String,
    pod: String,
    conf: serde_json::Value,
}

/// The variants, measured interleaved in this order.
const VARIANTS: [&str; 7] = [
    "rivet",
    "rivet+flows",
    "rivet+flows/100",
    "rivet+flows-noclient",
    "bridge",
    "ptp",
    "veth",
];

/// Variants whose CPU per GB is also measured at a fixed offered load.
const PACED_VARIANTS: [&str; 4] = ["rivet", "bridge", "ptp", "veth"];
/// That load (iperf3 `-b`): below every variant's single-stream rate here
/// (10–20 Gbit/s), so each carries the same bytes per second.
const PACED_RATE: &str = "4G";
/// Its rate in Gbit/s.
const PACED_GBPS: f64 = 4.0;
/// Its length in seconds (full and quick runs alike): long enough that
/// the connection's start and end are a small part of it.
const PACED_SECS: u32 = 5;
/// The share of the rate a sample must reach to count.
const PACED_REACHED: f64 = 0.95;
/// Its metric.
const PACED_METRIC: &str = "cpu_s_per_gb_at_4gbps";
/// The rate it reached.
const PACED_RX_METRIC: &str = "paced_rx_gbit (at -b 4G)";
/// A/B (development): with `RIVET_BENCH_SAME_NODE_B_BIN_DIR=<dir>`, a
/// second rivet node whose agent is that directory's rivetd, with its own
/// two pods, measured as this variant right after `rivet` in the order
/// (interleaved and rotated with the others, paced too).
const B_BIN_DIR_ENV: &str = "RIVET_BENCH_SAME_NODE_B_BIN_DIR";
/// That variant's name.
const B_VARIANT: &str = "rivet-b";

/// Sets node `n`'s flow-event switch directly (no monitor client: the
/// datapath's share of the cost alone).
fn set_flow_sample(world: &World, n: usize, flow_sample: u32) {
    let path = world.nodes[n].pin_dir().join("maps/EVENT_CONFIG");
    let data = aya::maps::MapData::from_pin(&path).expect("EVENT_CONFIG pin");
    let mut array: aya::maps::Array<_, rivet_common::EventConfig> =
        aya::maps::Array::try_from(aya::maps::Map::Array(data)).expect("array");
    array
        .set(0, rivet_common::EventConfig { flow_sample }, 0)
        .expect("flow switch");
}

/// Starts node `n`'s agent from `dir`'s rivetd (`RIVET_BIN_DIR` set for
/// the start only, then restored).
fn start_agent_from(world: &mut World, n: usize, dir: &std::ffi::OsStr) {
    let saved = std::env::var_os("RIVET_BIN_DIR");
    // SAFETY: no other thread of this process reads the environment while
    // the agent starts (the servers and watchers start later).
    unsafe { std::env::set_var("RIVET_BIN_DIR", dir) };
    world.start_agent(n);
    // SAFETY: as above.
    unsafe {
        match &saved {
            Some(v) => std::env::set_var("RIVET_BIN_DIR", v),
            None => std::env::remove_var("RIVET_BIN_DIR"),
        }
    }
}

/// A `monitor --flows` client reading events in the background.
struct FlowWatcher {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl FlowWatcher {
    fn start(client: rivet_api::Client, sample: u32) -> Self {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let Ok(events) = client.monitor(true, Some(sample)) else {
                return 0;
            };
            let mut n = 0;
            for e in events {
                match e {
                    Err(_) => break,
                    _ if flag.load(Ordering::Relaxed) => break,
                    Ok(e) if e.kind != "tick" => n += 1,
                    Ok(_) => {}
                }
            }
            n
        });
        // Subscribed (flow events on) once the agent has read the request.
        std::thread::sleep(std::time::Duration::from_millis(300));
        Self { stop, thread }
    }

    /// Stops reading; the events seen.
    fn stop(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap_or(0)
    }
}

/// Runs the benchmark.
pub fn run(opts: &Options) -> Report {
    let (rounds, secs) = (opts.rounds, opts.secs);
    let prefix = unique_prefix();
    let dir = std::env::temp_dir().join(format!("rivet-bench-{prefix}"));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let mut spaces: Vec<Netns> = Vec::new();
    let mut pairs: Vec<Pair> = Vec::new();
    let mut cni_pods: Vec<CniPod> = Vec::new();

    // Direct veth pair: the physical limit.
    spaces.push(Netns::new(format!("{prefix}-va")));
    spaces.push(Netns::new(format!("{prefix}-vb")));
    spaces[0].ip(&[
        "link",
        "add",
        "eth0",
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        spaces[1].name(),
    ]);
    spaces[0].ip(&["addr", "add", "10.254.0.1/24", "dev", "eth0"]);
    spaces[1].ip(&["addr", "add", "10.254.0.2/24", "dev", "eth0"]);
    spaces[0].ip(&["link", "set", "eth0", "up"]);
    spaces[1].ip(&["link", "set", "eth0", "up"]);
    pairs.push(Pair {
        name: "veth",
        client: "direct veth pair",
        client_ns_index: 0,
        server_ns_index: 1,
        server_ip: "10.254.0.2".parse().expect("ip"),
    });

    // Reference plugins: bridge and ptp, each on its own node with host-local.
    for (plugin, subnet) in [("bridge", "10.253.0.0/24"), ("ptp", "10.252.0.0/24")] {
        let node = Netns::new(format!("{prefix}-{plugin}"));
        node.run("sysctl", &["-qw", "net.ipv4.ip_forward=1"]);
        let conf = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": format!("bench{plugin}"),
            "type": plugin,
            "bridge": "cni0",
            "isGateway": true,
            "ipMasq": false,
            "ipam": {"type": "host-local", "subnet": subnet, "dataDir": dir.join(format!("{plugin}-ipam"))},
        });
        let base = spaces.len();
        let mut ips = Vec::new();
        for side in ["a", "b"] {
            let pod = Netns::new(format!("{prefix}-{plugin}{side}"));
            let id = format!("{prefix}{plugin}{side}");
            let res = Plugin::reference(plugin, &node.path())
                .add(&id, &pod.path(), &conf)
                .expect_ok(plugin);
            ips.push(result_ip(&res.json).expect("address in the result"));
            cni_pods.push(CniPod {
                plugin,
                id,
                node: node.name().to_owned(),
                pod: pod.name().to_owned(),
                conf: conf.clone(),
            });
            spaces.push(pod);
        }
        spaces.push(node);
        pairs.push(Pair {
            name: plugin,
            client: if plugin == "bridge" {
                "reference bridge + host-local"
            } else {
                "reference ptp + host-local"
            },
            client_ns_index: base,
            server_ns_index: base + 1,
            server_ip: ips[1],
        });
    }

    // rivet.
    let mut world = World::new();
    let n = world.add_node_with_agent();
    let a = world.add_pod(n);
    let b = world.add_pod(n);
    let rivet_server_ip = world.pods[b].ip;
    // The A/B variant's node and pods (client, server).
    let b_dir = std::env::var_os(B_BIN_DIR_ENV);
    let node_b = b_dir.as_deref().map(|dir| {
        let nb = world.add_node();
        start_agent_from(&mut world, nb, dir);
        let c = world.add_pod(nb);
        let d = world.add_pod(nb);
        (c, d)
    });
    let with_b = |list: &[&'static str]| -> Vec<&'static str> {
        let mut v = list.to_vec();
        if node_b.is_some() {
            let at = v.iter().position(|x| *x == "rivet").map_or(0, |i| i + 1);
            v.insert(at, B_VARIANT);
        }
        v
    };
    let variants = with_b(&VARIANTS);
    let paced_variants = with_b(&PACED_VARIANTS);

    // Request/response and connection-rate probes: 0.5 s each (~15k round
    // trips, ~4k connections; a quick run: 0.2 s); the warm-up round's: 0.1 s (enough to resolve neighbours
    // and open flows). A quick run's warm-up skips iperf3 (its shortest
    // test is 1 s).
    let probe = std::time::Duration::from_millis(opts.pick(500, 200));
    let warm_probe = std::time::Duration::from_millis(100);
    let pings = opts.pick(100, 30);
    let mut report = Report {
        name: "same-node pod → pod".into(),
        variants: variants.iter().map(|v| (*v).to_owned()).collect(),
        baseline: "bridge".into(),
        ..Default::default()
    };
    report
        .better
        .insert("throughput_gbps".into(), "higher".into());
    report.better.insert("rtt_avg_ms".into(), "lower".into());
    for m in ["rr_p50_us", "rr_p99_us"] {
        report.better.insert(m.into(), "lower".into());
    }
    report.better.insert("conns_per_s".into(), "higher".into());
    report.better.insert("cpu_s_per_gb".into(), "lower".into());
    report.better.insert(PACED_METRIC.into(), "lower".into());
    report.notes.push(format!("{PACED_METRIC}: CPU-seconds per GB while iperf3 sends one stream paced at {PACED_RATE}bit/s (-b {PACED_RATE}) for {PACED_SECS} s (--quick too), right after each full-rate sample of {paced_variants:?}: a fixed offered load, so the figure is what the path costs rather than how fast it goes. CPU = the iperf3 client's and server's own run time (getrusage: the scheduler's exact ns run time; without IRQ time accounting it includes the softirqs run while they were on the CPU, i.e. nearly the whole datapath) + the ksoftirqd threads' run time over the sample (/proc/<pid>/schedstat, ns); resolution: 1 µs of CPU time (under 0.00001 CPU-s/GB over a sample); the spread between samples is far larger. Work done outside those tasks (softirqs taken while a CPU idles or another task runs, timers) is not in it: in a check on an idle machine (a veth pair and a plain bridge, 7 samples of 1 and 5 s) this measure came to 79–93 % of the whole machine's busy time over the same samples (every CPU's wall time − its idle time, which with NO_HZ /proc/stat takes from idle entry/exit timestamps, net of the idle rate just before); that machine-wide figure is not recorded, since on a shared machine other load fills whatever CPU the transfer leaves and it means nothing. A sample counts only if the receiver got ≥ {:.0} % of {PACED_GBPS} Gbit/s ({PACED_RX_METRIC} lists the rates reached); samples that fell short are listed below. Not from /proc/stat's busy jiffies: those are 250 Hz tick samples, and iperf3's 1 ms pacing timer aliases with the tick (in that check the same veth pair read 0.08 to 2.6 CPU-s/GB from one paced sample to the next)", PACED_REACHED * 100.0));
    report.notes.push("cpu_s_per_gb: the same process CPU measure (iperf3 client + server + ksoftirqd) during each full-rate sample, per GB the receiver got; at full rate both CPUs are saturated in every variant, so it mostly mirrors 1/throughput".into());
    report.notes.push("rr_*: 1-byte request/response round trips on one TCP connection for 0.5 s (0.2 s in --quick; TCP_NODELAY); conns_per_s: connect + 1-byte exchange + close, one at a time, for 0.5 s (0.2 s in --quick); rivet+flows-noclient: flow events on for every packet with nobody reading them (the datapath's share)".into());
    report
        .better
        .insert("tcp_retransmits".into(), "lower".into());
    report.notes.push(format!(
        "iperf3 single stream, {secs} s per sample, client on CPU 0 and server on CPU 1; {rounds} interleaved rounds after a warm-up round (iperf3 1 s, 10 pings, 0.1 s probes; --quick: no iperf3 in it)"
    ));
    report
        .notes
        .push(format!("rtt: ping -c {pings} -i 0.005 average"));
    for p in &pairs {
        report.notes.push(format!("{}: {}", p.name, p.client));
    }
    report
        .notes
        .push("rivet: rivetd + from_pod (netlink cls_bpf, the default pod attach) with bpf_redirect_peer, release build".into());
    if let Some(dir) = &b_dir {
        report.notes.push(format!(
            "{B_VARIANT}: rivet on a second node whose agent is {}/rivetd ({B_BIN_DIR_ENV}), its own two pods, measured exactly like rivet",
            std::path::Path::new(dir).display()
        ));
    }

    report.notes.push(
        "rivet+flows: rivet with flow events on for every packet (rivetctl monitor --flows: a client reads each event as JSON); rivet+flows/100: one packet in 100".into(),
    );
    // Every client may reuse its TIME_WAIT ports (the rivet pods serve four
    // variants per round: without it their ephemeral ports run out).
    let b_pods = node_b.map(|(c, d)| (&world.pods[c].ns, &world.pods[d].ns));
    for ns in std::iter::once(&world.pods[a].ns)
        .chain(b_pods.map(|(c, _)| c))
        .chain(pairs.iter().map(|p| &spaces[p.client_ns_index]))
    {
        ns.run("sysctl", &["-qw", "net.ipv4.tcp_tw_reuse=1"]);
    }
    // The request/response and connection-rate servers of every variant.
    for ns in std::iter::once(&world.pods[b].ns)
        .chain(b_pods.map(|(_, d)| d))
        .chain(pairs.iter().map(|p| &spaces[p.server_ns_index]))
    {
        echo_server(ns, 9100);
        one_byte_server(ns, 9101);
    }
    // The same bridge-netfilter setting in every namespace of every
    // variant (the reference bridge's node included), read back.
    let spaces_all = || spaces.iter().chain(crate::world_spaces(&world));
    let kernel_at_setup = crate::bridge_nf_off(spaces_all());
    report.notes.push(format!("order: {}", crate::ROTATION));
    let mut short_of_rate: Vec<String> = Vec::new();
    let total = (rounds + 1) * variants.len() as u32;
    let started = Instant::now();
    let mut done = 0;
    for round in 0..=rounds {
        for variant in crate::rotated(&variants, round as usize) {
            done += 1;
            progress(&format!(
                "same-node: round {round}/{rounds} {variant:<6} [{done}/{total}, {:.0}s]",
                started.elapsed().as_secs_f64()
            ));
            if variant == "rivet+flows-noclient" {
                set_flow_sample(&world, n, 1);
            }
            let watcher = match variant {
                "rivet+flows" => Some(FlowWatcher::start(world.nodes[n].agent().client(), 1)),
                "rivet+flows/100" => Some(FlowWatcher::start(world.nodes[n].agent().client(), 100)),
                _ => None,
            };
            let (client, server, ip) = if let Some((c, d)) = node_b
                && variant == B_VARIANT
            {
                (&world.pods[c].ns, &world.pods[d].ns, world.pods[d].ip)
            } else if variant.starts_with("rivet") {
                (&world.pods[a].ns, &world.pods[b].ns, rivet_server_ip)
            } else {
                let p = pairs.iter().find(|p| p.name == variant).expect("pair");
                (
                    &spaces[p.client_ns_index],
                    &spaces[p.server_ns_index],
                    p.server_ip,
                )
            };
            let warm_up = round == 0;
            let t = if warm_up { 1 } else { secs };
            let (res, soft_s) = if warm_up && opts.quick {
                let none = CpuSample {
                    bits_per_second: 0.0,
                    seconds: 0.0,
                    retransmits: 0,
                    cpu_s: None,
                };
                (none, 0.0)
            } else {
                let srv = iperf3_server(server, 5201, Some(1));
                let soft = ksoftirqd_secs();
                let res = iperf3_cpu(client, ip, 5201, t, None);
                let soft = ksoftirqd_secs() - soft;
                drop(srv);
                (res, soft)
            };
            // The same CPU measure at a fixed offered load every variant
            // carries (at full rate both CPUs are busy whatever the path,
            // so CPU per GB there mostly mirrors throughput).
            if !warm_up && paced_variants.contains(&variant) {
                let srv = iperf3_server(server, 5201, Some(1));
                let soft = ksoftirqd_secs();
                let paced = iperf3_cpu(client, ip, 5201, PACED_SECS, Some(PACED_RATE));
                let soft = ksoftirqd_secs() - soft;
                drop(srv);
                let gbps = paced.bits_per_second / 1e9;
                report.add(PACED_RX_METRIC, variant, gbps);
                let gb = paced.gbytes();
                if gbps < PACED_GBPS * PACED_REACHED || gb <= 0.0 {
                    short_of_rate.push(format!("{variant} round {round}: {gbps:.2} Gbit/s"));
                } else if let Some((c, s)) = paced.cpu_s {
                    report.add(PACED_METRIC, variant, (c + s + soft) / gb);
                }
            }
            let (count, probe) = if warm_up {
                (10, warm_probe)
            } else {
                (pings, probe)
            };
            let rtt = ping(client, ip, count, 0.005);
            let rr = ping_pong(client, SocketAddr::from((ip, 9100)), probe);
            let conns = connection_loop(client, SocketAddr::from((ip, 9101)), probe);
            let events = watcher.map(FlowWatcher::stop);
            if variant == "rivet+flows-noclient" {
                set_flow_sample(&world, n, 0);
            }
            if round > 0 {
                if let Some(events) = events {
                    report.add("flow_events", variant, events as f64);
                }
                report.add("throughput_gbps", variant, res.bits_per_second / 1e9);
                report.add("tcp_retransmits", variant, res.retransmits as f64);
                if let Some((c, s)) = res.cpu_s
                    && res.gbytes() > 0.0
                {
                    report.add("cpu_s_per_gb", variant, (c + s + soft_s) / res.gbytes());
                }
                if let Some(avg) = rtt.avg_ms {
                    report.add("rtt_avg_ms", variant, avg);
                }
                report.add("rr_p50_us", variant, percentile(&rr, 50.0));
                report.add("rr_p99_us", variant, percentile(&rr, 99.0));
                report.add(
                    "conns_per_s",
                    variant,
                    conns.len() as f64 / probe.as_secs_f64(),
                );
            }
        }
    }
    progress("");
    eprintln!("same-node: done in {:.0}s", started.elapsed().as_secs_f64());
    report.notes.push(if short_of_rate.is_empty() {
        format!(
            "paced load: every sample reached ≥ {:.0} % of {PACED_GBPS} Gbit/s",
            PACED_REACHED * 100.0
        )
    } else {
        format!(
            "paced load not reached (no {PACED_METRIC} sample): {}",
            short_of_rate.join("; ")
        )
    });
    let kernel_at_end = crate::bridge_nf_read(spaces_all());
    report.set_kernel_settings(kernel_at_setup, &kernel_at_end);

    for p in cni_pods {
        let node = spaces.iter().find(|s| s.name() == p.node).expect("node ns");
        let pod = spaces.iter().find(|s| s.name() == p.pod).expect("pod ns");
        Plugin::reference(p.plugin, &node.path())
            .del(&p.id, Some(&pod.path()), &p.conf)
            .expect_ok("DEL");
    }
    drop(spaces);
    drop(world);
    let _ = std::fs::remove_dir_all(&dir);
    report
}
