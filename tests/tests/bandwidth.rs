//! Pod bandwidth limits through the real datapath: iperf3 TCP and UDP
//! between pods on one node and across two (VXLAN), limits set at ADD
//! through the agent and through the CNI plugin as a runtime drives it,
//! changed and removed on a running pod. Goodput is measured at the
//! receiving end, second by second.
//!
//! The traffic tests take one lock: run side by side on two cores they
//! would measure each other. A cell below 0.90× the rate is measured once
//! more before it fails (a busy machine can only slow a flow down); a cell
//! above 1.02×, or a first second above 1.5×, fails at once.

use std::{
    process::Stdio,
    sync::Mutex,
    time::{Duration, Instant},
};

use rivet_api::{Bandwidth, EndpointBandwidth, EndpointRef, Request, Response};
use rivet_tests::{
    World,
    cni::{Plugin, rivet_conf, with},
    kube::rivetctl,
    metrics,
    netns::Netns,
    traffic::{ChildGuard, Load, Received, iperf3_received, ping_times},
};
use serde_json::json;

static TRAFFIC: Mutex<()> = Mutex::new(());

/// iperf3 from pod `from` to pod `to` with `load`, measured at the
/// receiving end.
fn measure(w: &World, from: usize, to: usize, port: u16, load: Load) -> Received {
    iperf3_received(&w.pods[from].ns, &w.pods[to].ns, w.pods[to].ip, port, load)
}

const MBIT: u64 = 1_000_000;

/// Both directions limited to `rate` with a burst of 100 ms of it.
fn both(rate: u64) -> Bandwidth {
    Bandwidth::limits(Some((rate, rate / 10)), Some((rate, rate / 10)))
}

fn egress_only(rate: u64) -> Bandwidth {
    Bandwidth::limits(None, Some((rate, rate / 10)))
}

/// One accuracy cell: `limited` sends (`egress`) or receives to/from
/// `peer`; goodput over seconds 1–10 within 0.90–1.02× `rate`, the first
/// second at most 1.5×.
fn cell(w: &World, limited: usize, peer: usize, rate: u64, streams: u32, egress: bool, port: u16) {
    let what = format!(
        "{} Mbit/s, {streams} stream(s), {}",
        rate / MBIT,
        if egress { "egress" } else { "ingress" }
    );
    let run = |port: u16| {
        measure(
            w,
            limited,
            peer,
            port,
            Load::tcp(11, streams).reversed(!egress),
        )
    };
    let mut r = run(port);
    for attempt in 0..2 {
        let (first, rest) = (r.per_second[0] / rate as f64, r.mean_from(1) / rate as f64);
        eprintln!("{what}: first second {first:.3}×, seconds 1–10 {rest:.3}× ({r:?})");
        assert!(first <= 1.5, "{what}: first second at {first:.3}× the rate");
        assert!(rest <= 1.02, "{what}: {rest:.3}× the rate");
        if rest >= 0.90 {
            return;
        }
        assert!(attempt == 0, "{what}: {rest:.3}× the rate, twice");
        r = run(port + 1000);
    }
}

/// The accuracy matrix: 10, 100 and 1,000 Mbit/s, 1 and 4 TCP streams,
/// each direction, same node and across nodes.
#[test]
fn tcp_goodput_follows_the_limit() {
    let _serial = TRAFFIC.lock().unwrap_or_else(|e| e.into_inner());
    let mut w = World::new();
    let nodes = w.add_static_cluster(2, "vxlan");
    let near = w.add_pod(nodes[0]);
    let far = w.add_pod(nodes[1]);
    let mut port = 5600;
    for rate in [10 * MBIT, 100 * MBIT, 1_000 * MBIT] {
        let limited = w.add_pod_with_bandwidth(nodes[0], both(rate));
        assert_eq!(w.pods[limited].endpoint.bandwidth, Some(both(rate)));
        for peer in [near, far] {
            for streams in [1, 4] {
                for egress in [true, false] {
                    port += 1;
                    cell(&w, limited, peer, rate, streams, egress, port);
                }
            }
        }
    }
    let c = w.nodes[nodes[0]].counters();
    assert_eq!(
        c.packets(rivet_tests::world::Counter::DropBandwidth),
        0,
        "shaped traffic never meets the datapath's check behind the qdisc"
    );
}

/// UDP offered at twice the rate arrives at the rate, in both directions;
/// a pod without limits next to it is not slowed.
#[test]
fn udp_beyond_the_rate_is_cut_to_it() {
    let _serial = TRAFFIC.lock().unwrap_or_else(|e| e.into_inner());
    let mut w = World::new();
    let n = w.add_node_with_agent();
    let rate = 100 * MBIT;
    let limited = w.add_pod_with_bandwidth(n, both(rate));
    let peer = w.add_pod(n);
    let free = w.add_pod(n);
    for (reverse, port) in [(false, 5801), (true, 5802)] {
        let r = measure(
            &w,
            limited,
            peer,
            port,
            Load::udp(6, 2 * rate).reversed(reverse),
        );
        let rest = r.mean_from(1) / rate as f64;
        eprintln!("UDP at 2×, reverse {reverse}: {rest:.3}× ({r:?})");
        assert!(rest <= 1.02, "UDP arrived at {rest:.3}× the rate");
        assert!(
            rest >= 0.5,
            "UDP arrived at {rest:.3}× the rate: the limit is not a rate"
        );
    }
    // Held back at the ingress shaper (the peer sent at 2×): on one node
    // the sender's socket feels the queue (the kernel keeps the socket of
    // a packet across the veth), so it waits rather than loses. Counted
    // per pod in `rivetctl stats` and in Prometheus.
    let stats = rivetctl(w.nodes[n].agent().socket(), &["stats"], "");
    assert!(stats.ok, "{}", stats.stderr);
    let line = stats
        .stdout
        .lines()
        .find(|l| l.starts_with(&w.pods[limited].name) && l.contains(" ingress "))
        .unwrap_or_else(|| panic!("no ingress figures for the pod:\n{}", stats.stdout));
    let delayed: u64 = line
        .split_whitespace()
        .nth(5)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("DELAYED column of {line:?}"));
    assert!(delayed > 100, "ingress delays at 2× the rate: {line}");
    let (code, body) = metrics::http_get(&w.nodes[n].ns, "/metrics");
    assert_eq!(code, 200);
    let series = format!(
        "rivet_bandwidth_delayed_packets_total{{pod=\"{}\",direction=\"ingress\"}} ",
        w.pods[limited].name
    );
    let value: u64 = body
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{series} missing from the metrics:\n{body}"));
    assert!(value >= delayed, "{series}{value} < rivetctl's {delayed}");
    let limit = format!(
        "rivet_bandwidth_limit_bits{{pod=\"{}\",direction=\"egress\"}} {rate}",
        w.pods[limited].name
    );
    assert!(body.lines().any(|l| l == limit), "{limit} missing:\n{body}");

    // The pod without limits is not held to it.
    let r = measure(&w, free, peer, 5803, Load::tcp(3, 1));
    assert!(
        r.mean_from(1) > 3.0 * rate as f64,
        "an unlimited pod reached only {:.0} bit/s",
        r.mean_from(1)
    );
}

fn set(w: &World, n: usize, pod: usize, bw: Option<Bandwidth>) -> Option<Bandwidth> {
    let req = Request::EndpointBandwidth(EndpointBandwidth {
        endpoint: EndpointRef::new(&w.pods[pod].name, "eth0"),
        bandwidth: bw,
    });
    match w.nodes[n].agent().client().call(&req) {
        Ok(Response::Endpoint(ep)) => ep.bandwidth,
        other => panic!("changing the limits: {other:?}"),
    }
}

/// A limit changed under a running flow holds within a second; removed
/// (with `rivetctl`), the flow is free again within a second; the endpoint
/// list shows the limits.
#[test]
fn limits_change_on_a_running_pod() {
    let _serial = TRAFFIC.lock().unwrap_or_else(|e| e.into_inner());
    let mut w = World::new();
    let n = w.add_node_with_agent();
    let limited = w.add_pod_with_bandwidth(n, egress_only(200 * MBIT));
    let peer = w.add_pod(n);
    let socket = w.nodes[n].agent().socket().to_owned();
    let listed = rivetctl(&socket, &["endpoints"], "");
    assert!(listed.ok, "{}", listed.stderr);
    assert!(listed.stdout.contains("out 200M/20M"), "{}", listed.stdout);

    // A 7 s flow; 2.5 s in, the limit changes (`change`). Every whole
    // second of it that starts 1 s or more after the change is checked.
    let flow_with_change = |port: u16, change: &dyn Fn()| -> (Received, usize) {
        std::thread::scope(|s| {
            let flow = s.spawn(|| measure(&w, limited, peer, port, Load::tcp(7, 1)));
            let start = Instant::now();
            std::thread::sleep(Duration::from_millis(2500));
            change();
            // The receiver's seconds start after the spawn: second `i`
            // begins at least `i` s after it.
            let from = start.elapsed().as_secs_f64().ceil() as usize + 1;
            (flow.join().expect("iperf3 thread"), from)
        })
    };

    let (r, from) = flow_with_change(5901, &|| {
        let now = set(&w, n, limited, Some(egress_only(20 * MBIT)));
        assert_eq!(now, Some(egress_only(20 * MBIT)));
    });
    eprintln!("200 → 20 Mbit/s, checked from second {from}: {r:?}");
    assert!(r.per_second[1] > 0.8 * 200.0 * MBIT as f64, "before: {r:?}");
    assert!(r.per_second.len() > from + 1, "{r:?}");
    for (i, bps) in r.per_second.iter().enumerate().skip(from) {
        assert!(
            (0.5 * 20.0 * MBIT as f64..=1.02 * 20.0 * MBIT as f64).contains(bps),
            "second {i}: {bps:.0} bit/s, the limit 20 Mbit/s: {r:?}"
        );
    }

    let (r, from) = flow_with_change(5902, &|| {
        let cleared = rivetctl(
            &socket,
            &[
                "endpoint",
                "bandwidth",
                "--container-id",
                &w.pods[limited].name,
            ],
            "",
        );
        assert!(cleared.ok, "{}", cleared.stderr);
    });
    eprintln!("20 Mbit/s → none, checked from second {from}: {r:?}");
    assert!(
        r.per_second[1] <= 1.02 * 20.0 * MBIT as f64,
        "before: {r:?}"
    );
    for (i, bps) in r.per_second.iter().enumerate().skip(from) {
        assert!(
            *bps > 10.0 * 20.0 * MBIT as f64,
            "second {i} after the limit was removed: {bps:.0} bit/s: {r:?}"
        );
    }
    let listed = rivetctl(&socket, &["endpoints"], "");
    assert!(!listed.stdout.contains("out 20M"), "{}", listed.stdout);
}

#[test]
fn cni_runtime_config_bandwidth() {
    let _serial = TRAFFIC.lock().unwrap_or_else(|e| e.into_inner());
    let mut w = World::new();
    let n = w.add_node_with_agent();
    let peer = w.add_pod(n);
    let plugin = Plugin::rivet(&w.nodes[n].ns.path());
    let conf = rivet_conf("1.0.0", w.nodes[n].agent().socket());
    let pod_ns = Netns::new(format!("{}-cnibw", w.prefix));
    let bad = with(
        conf.clone(),
        "runtimeConfig",
        json!({"bandwidth": {"egressRate": 10_000_000}}),
    );
    let msg = plugin
        .add("bwbad", &pod_ns.path(), &bad)
        .expect_code(7, "rate without burst");
    assert!(msg.contains("egressBurst"), "{msg}");
    let listed = rivetctl(w.nodes[n].agent().socket(), &["endpoints"], "");
    assert!(!listed.stdout.contains("bwbad"), "{}", listed.stdout);

    let good = with(
        conf,
        "runtimeConfig",
        json!({"bandwidth": {"egressRate": 20_000_000, "egressBurst": 2_000_000}}),
    );
    plugin
        .add("bwgood", &pod_ns.path(), &good)
        .expect_ok("ADD with bandwidth");
    let r = iperf3_received(
        &pod_ns,
        &w.pods[peer].ns,
        w.pods[peer].ip,
        5951,
        Load {
            secs: 4,
            streams: 1,
            udp_bitrate: None,
            reverse: false,
        },
    );
    let rest = r.mean_from(1) / (20 * MBIT) as f64;
    assert!((0.85..=1.02).contains(&rest), "{rest:.3}× the rate: {r:?}");
    plugin
        .del("bwgood", Some(&pod_ns.path()), &good)
        .expect_ok("DEL");
}

/// A pod flooding far beyond its limit (UDP at 1 Gbit/s against 20 Mbit/s,
/// egress and ingress) does not raise the latency of another pod's pings on
/// the same node; its own pings wait at most about its egress queue.
#[test]
fn a_flood_beyond_the_limit_leaves_other_pods_alone() {
    let _serial = TRAFFIC.lock().unwrap_or_else(|e| e.into_inner());
    let mut w = World::new();
    let n = w.add_node_with_agent();
    let rate = 20 * MBIT;
    let flooder = w.add_pod_with_bandwidth(n, both(rate));
    let sink = w.add_pod(n);
    let other = w.add_pod(n);
    let p50 = |mut v: Vec<f64>| -> f64 {
        assert!(v.len() >= 150, "ping answered {} of 200", v.len());
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let p99 = |mut v: Vec<f64>| -> f64 {
        v.sort_by(f64::total_cmp);
        v[(v.len() * 99 / 100).min(v.len() - 1)]
    };
    let idle = p50(ping_times(&w.pods[other].ns, w.pods[sink].ip, 200, 0.01));
    let (other_p99, own_p50) = std::thread::scope(|s| {
        let flood = s.spawn(|| measure(&w, flooder, sink, 6001, Load::udp(6, 1_000 * MBIT)));
        std::thread::sleep(std::time::Duration::from_millis(1500));
        let other = ping_times(&w.pods[other].ns, w.pods[sink].ip, 200, 0.01);
        let own = ping_times(&w.pods[flooder].ns, w.pods[sink].ip, 100, 0.02);
        let r = flood.join().expect("flood");
        assert!(
            r.mean_from(1) <= 1.02 * rate as f64,
            "the flood arrived at {:.0} bit/s",
            r.mean_from(1)
        );
        (p99(other), own)
    });
    eprintln!(
        "idle p50 {idle:.3} ms; other pod under the flood p99 {other_p99:.3} ms; flooder's own pings {own_p50:?}"
    );
    assert!(
        other_p99 < idle + 2.0,
        "another pod's ping p99 {other_p99:.3} ms under the flood (idle p50 {idle:.3} ms)"
    );
    let mut own = own_p50;
    own.sort_by(f64::total_cmp);
    assert!(!own.is_empty(), "the flooder's pings all lost");
    let own_median = own[own.len() / 2];
    // Its own pings wait behind its full egress queue, no longer.
    // (The queue's time at the rate does not depend on the MTU.)
    let (shapers, _) = rivet::endpoint::bandwidth::plan(Some(&both(rate)), 1_500);
    let queue = shapers[rivet_common::bandwidth_dir::EGRESS].expect("egress shaper");
    let queue_ms = f64::from(queue.limit) * 1e3 / queue.rate as f64;
    assert!(
        own_median < idle + queue_ms + 5.0,
        "the flooder's own ping p50 {own_median:.3} ms: more than its {queue_ms:.1} ms queue"
    );
}

/// The BBR bandwidth estimate (bits/s, `ss -ti`'s `bbr:(bw:…bps`) of the
/// connection in `ss` output that has delivered the most; `None` when
/// that connection shows none.
fn busiest_bbr_bw(ss: &str) -> Option<f64> {
    let field = |line: &str, key: &str| -> Option<f64> {
        let rest = &line[line.find(key)? + key.len()..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    ss.lines()
        .filter_map(|l| Some((field(l, "bytes_acked:")?, l)))
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .and_then(|(_, l)| field(l, "bbr:(bw:"))
}

/// A BBR sender behind an egress limit estimates the limit, not more:
/// the bulk class sends a packet once its bucket holds the whole of it,
/// so no packet is seen delivered faster than the rate (a bulk class
/// charging packets after sending them let BBR estimate 114–133 Mbit/s
/// at 100 Mbit/s and pace above it, throttled by its own small queue).
#[test]
fn a_bbr_sender_estimates_the_rate() {
    let _serial = TRAFFIC.lock().unwrap_or_else(|e| e.into_inner());
    let mut w = World::new();
    let n = w.add_node_with_agent();
    let rate = 100 * MBIT;
    let limited = w.add_pod_with_bandwidth(n, egress_only(rate));
    let peer = w.add_pod(n);
    let (ns, dst) = (&w.pods[limited].ns, w.pods[peer].ip.to_string());
    let port = "6081";
    let _server = ChildGuard(
        w.pods[peer]
            .ns
            .command("iperf3")
            .args(["-s", "-1", "-p", port])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting iperf3 -s"),
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while !w.pods[peer]
        .ns
        .run("ss", &["-tln"])
        .contains(&format!(":{port} "))
    {
        assert!(Instant::now() < deadline, "iperf3 -s not listening");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut client = ChildGuard(
        ns.command("iperf3")
            .args(["-c", &dst, "-p", port, "-t", "8", "-C", "bbr"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting iperf3 -c"),
    );
    std::thread::sleep(Duration::from_secs(2));
    let mut estimates = Vec::new();
    for _ in 0..10 {
        let ss = ns.run("ss", &["-tin", "dst", &dst]);
        estimates.push(busiest_bbr_bw(&ss).unwrap_or_else(|| panic!("no BBR estimate in:\n{ss}")));
        std::thread::sleep(Duration::from_millis(400));
    }
    let status = client.0.wait().expect("waiting for iperf3 -c");
    assert!(status.success(), "iperf3 -c -C bbr failed: {status}");
    estimates.sort_by(f64::total_cmp);
    let median = estimates[estimates.len() / 2];
    eprintln!("BBR estimates at {rate} bit/s: {estimates:?}");
    assert!(
        median <= 1.02 * rate as f64,
        "BBR's median estimate {median:.0} bit/s above the {rate} bit/s limit: {estimates:?}"
    );
    assert!(
        median >= 0.80 * rate as f64,
        "BBR's median estimate {median:.0} bit/s far below the {rate} bit/s limit: {estimates:?}"
    );
}

/// What the shaper class `class` of `dev` has sent (bytes, packets), from
/// `tc -s class show` in `ns`; fails when the class is not there.
fn class_sent(ns: &Netns, dev: &str, class: &str) -> (u64, u64) {
    let text = ns.run("tc", &["-s", "class", "show", "dev", dev]);
    let head = format!("class htb {class} ");
    let mut lines = text.lines().skip_while(|l| !l.starts_with(&head));
    assert!(lines.next().is_some(), "no class {class} on {dev}:\n{text}");
    let sent = lines
        .next()
        .and_then(|l| l.trim().strip_prefix("Sent "))
        .unwrap_or_else(|| panic!("no Sent line for {class} on {dev}:\n{text}"));
    let mut words = sent.split_whitespace();
    let bytes = words.next().and_then(|v| v.parse().ok());
    let packets = words.nth(1).and_then(|v| v.parse().ok());
    match (bytes, packets) {
        (Some(b), Some(p)) => (b, p),
        _ => panic!("Sent line of {class} on {dev} unread: {sent}"),
    }
}

/// Each limited direction queues small packets (pings, TCP acks) apart
/// from bulk and serves them first: pings from and to a limited pod pass
/// through its small-packet class, a TCP flow through its bulk class, in
/// the pod's own qdisc (egress) and the host veth's (ingress).
#[test]
fn small_packets_queue_apart_from_bulk() {
    let _serial = TRAFFIC.lock().unwrap_or_else(|e| e.into_inner());
    let mut w = World::new();
    let n = w.add_node_with_agent();
    let limited = w.add_pod_with_bandwidth(n, both(50 * MBIT));
    let peer = w.add_pod(n);
    let host = w.pods[limited].endpoint.host_ifname.clone();
    let sides = [
        ("egress", &w.pods[limited].ns, "eth0"),
        ("ingress", &w.nodes[n].ns, host.as_str()),
    ];
    let read = |class: &str| sides.map(|(_, ns, dev)| class_sent(ns, dev, class));
    let (small0, bulk0) = (read("1:2"), read("1:3"));
    let pings = ping_times(&w.pods[limited].ns, w.pods[peer].ip, 50, 0.01);
    assert_eq!(pings.len(), 50, "pings answered: {pings:?}");
    for reverse in [false, true] {
        let r = measure(&w, limited, peer, 6051, Load::tcp(2, 1).reversed(reverse));
        assert!(r.mean_from(1) > 0.0, "no goodput: {r:?}");
    }
    let (small1, bulk1) = (read("1:2"), read("1:3"));
    for (i, (direction, _, dev)) in sides.iter().enumerate() {
        let small = (small1[i].0 - small0[i].0, small1[i].1 - small0[i].1);
        let bulk = (bulk1[i].0 - bulk0[i].0, bulk1[i].1 - bulk0[i].1);
        eprintln!("{direction} ({dev}): small {small:?}, bulk {bulk:?} (bytes, packets)");
        assert!(
            small.1 >= 50,
            "{direction}: {} small packets for 50 pings",
            small.1
        );
        assert!(
            bulk.0 >= 2_000_000,
            "{direction}: the bulk class sent {} bytes of a 2 s flow at 50 Mbit/s",
            bulk.0
        );
        // Frames of IPv4 packets under 256 bytes: under 270 on average.
        assert!(
            small.0 < 270 * small.1,
            "{direction}: the small class took larger packets: {small:?}"
        );
    }
}

/// Limits survive an agent restart (SIGTERM and SIGKILL): the qdiscs stay
/// with the veths, the map entry is pinned, the record keeps them.
#[test]
fn limits_survive_agent_restarts() {
    let _serial = TRAFFIC.lock().unwrap_or_else(|e| e.into_inner());
    let mut w = World::new();
    let n = w.add_node_with_agent();
    let rate = 30 * MBIT;
    let limited = w.add_pod_with_bandwidth(n, both(rate));
    let peer = w.add_pod(n);
    for signal in [
        nix::sys::signal::Signal::SIGTERM,
        nix::sys::signal::Signal::SIGKILL,
    ] {
        let agent = w.nodes[n].agent_mut();
        agent.stop_with(signal);
        agent.restart();
        for (reverse, port) in [(false, 6101), (true, 6102)] {
            let r = measure(&w, limited, peer, port, Load::tcp(3, 1).reversed(reverse));
            let rest = r.mean_from(1) / rate as f64;
            assert!(
                (0.8..=1.02).contains(&rest),
                "after {signal:?}, reverse {reverse}: {rest:.3}× the rate: {r:?}"
            );
        }
    }
    let listed = rivetctl(w.nodes[n].agent().socket(), &["endpoints"], "");
    assert!(
        listed.stdout.contains("in 30M/3M out 30M/3M"),
        "{}",
        listed.stdout
    );
    // DEL of a limited and of an unlimited pod: nothing of either is left.
    assert!(w.del_pod(limited) && w.del_pod(peer), "both existed");
    w.nodes[n].assert_no_pod_state("after both pods are deleted");
}
