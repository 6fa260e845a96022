//! NAT cost. hostPorts against the number of mappings: rivet's BPF DNAT (one
//! hash lookup) vs iptables DNAT rules as the reference `portmap` plugin
//! writes them (one rule per mapping, evaluated in order) vs an nftables
//! map (one rule, one lookup), measured side by side from the same outside
//! host: connect + 1-byte exchange + close, per
//! connection latency and connections per second, and the time to program
//! the N mappings. Masquerade: connections per second from a pod to an
//! outside server, rivet's BPF SNAT vs iptables MASQUERADE.
//!
//! Both nodes sit on the same underlay; each has one pod serving on port 80
//! behind hostPort 8080, and N − 1 other mappings (other ports) in front of
//! it — for iptables the measured mapping is the last rule, as the newest
//! container's is.

use std::{
    io::Write as _,
    net::{Ipv4Addr, SocketAddr},
    time::{Duration, Instant},
};

use crate::{
    Options, Report,
    conn::{connection_loop, one_byte_server},
    percentile, progress,
};
use rivet_tests::{Netns, World};

const HOST_PORT: u16 = 8080;
/// Ports of the other mappings: FILLER_BASE, FILLER_BASE + 1, ...
const FILLER_BASE: u16 = 20_000;

/// A kernel-NAT node (iptables or nftables): a plain namespace routing to
/// its pod; the mappings are rules or map elements.
struct KernelNode {
    node: usize,
    pod: Netns,
    pod_ip: Ipv4Addr,
}

fn kernel_node(w: &mut World, tag: &str) -> KernelNode {
    let node = w.add_node();
    let ns = &w.nodes[node].ns;
    let pod = Netns::new(format!("{}-{tag}-pod", w.prefix));
    ns.ip(&[
        "link",
        "add",
        "vpod",
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        pod.name(),
    ]);
    ns.ip(&["addr", "add", "10.250.0.1/24", "dev", "vpod"]);
    ns.ip(&["link", "set", "vpod", "up"]);
    pod.ip(&["addr", "add", "10.250.0.2/24", "dev", "eth0"]);
    pod.ip(&["link", "set", "eth0", "up"]);
    pod.ip(&["link", "set", "lo", "up"]);
    pod.ip(&["route", "add", "default", "via", "10.250.0.1"]);
    ns.run("sysctl", &["-qw", "net.ipv4.ip_forward=1"]);
    KernelNode {
        node,
        pod,
        pod_ip: Ipv4Addr::new(10, 250, 0, 2),
    }
}

/// Programs N mappings on the iptables node (the measured one last) with
/// one `iptables-restore`; returns the wall time in ms.
fn program_iptables(ns: &Netns, node_ip: Ipv4Addr, pod_ip: Ipv4Addr, n: usize) -> f64 {
    let mut rules = String::from(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:CNI-HOSTPORT-DNAT - [0:0]\n",
    );
    rules.push_str("-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT\n");
    // The pod's traffic leaving the node is masqueraded, as the reference
    // plugins' ipMasq does it.
    rules.push_str("-A POSTROUTING -s 10.250.0.0/24 ! -d 10.250.0.0/24 -j MASQUERADE\n");
    for i in 0..n.saturating_sub(1) {
        rules.push_str(&format!(
            "-A CNI-HOSTPORT-DNAT -d {node_ip}/32 -p tcp -m tcp --dport {} -j DNAT --to-destination 10.250.1.{}:80\n",
            FILLER_BASE + i as u16,
            1 + i % 250
        ));
    }
    rules.push_str(&format!(
        "-A CNI-HOSTPORT-DNAT -d {node_ip}/32 -p tcp -m tcp --dport {HOST_PORT} -j DNAT --to-destination {pod_ip}:80\nCOMMIT\n"
    ));
    timed_restore(ns, "iptables-nft-restore", &[], &rules)
}

/// Programs N mappings on the nftables node as elements of one verdict
/// map (`ip daddr . tcp dport : pod . port`), looked up by one DNAT rule —
/// the best a hand-written nftables ruleset does; one `nft -f`; ms.
fn program_nft(ns: &Netns, node_ip: Ipv4Addr, pod_ip: Ipv4Addr, n: usize) -> f64 {
    let mut elements: Vec<String> = (0..n.saturating_sub(1))
        .map(|i| {
            format!(
                "{node_ip} . {} : 10.250.1.{} . 80",
                FILLER_BASE + i as u16,
                1 + i % 250
            )
        })
        .collect();
    elements.push(format!("{node_ip} . {HOST_PORT} : {pod_ip} . 80"));
    let ruleset = format!(
        "flush ruleset\ntable ip hostports {{\n\
         map ports {{ type ipv4_addr . inet_service : ipv4_addr . inet_service; elements = {{ {} }} }}\n\
         chain prerouting {{ type nat hook prerouting priority dstnat; policy accept; dnat ip to ip daddr . tcp dport map @ports; }}\n\
         }}\n",
        elements.join(", ")
    );
    timed_restore(ns, "nft", &["-f", "-"], &ruleset)
}

/// Runs `tool args` in `ns` with `input` on stdin; the wall time in ms.
fn timed_restore(ns: &Netns, tool: &str, args: &[&str], input: &str) -> f64 {
    let t = Instant::now();
    let mut child = ns
        .command(tool)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{tool}: {e}"));
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("input");
    assert!(child.wait().expect("wait").success(), "{tool} failed");
    t.elapsed().as_secs_f64() * 1e3
}

/// Programs N − 1 other mappings through the agent: one pod whose ADD
/// carries them all (the previous filler pod is deleted first). Returns
/// the filler pod and the ADD's wall time in ms.
fn program_rivet(
    w: &mut World,
    node: usize,
    previous: Option<usize>,
    n: usize,
) -> (Option<usize>, f64) {
    if let Some(p) = previous {
        assert!(w.del_pod(p), "filler pod DEL");
    }
    if n < 2 {
        return (None, 0.0);
    }
    let mappings = (0..n - 1)
        .map(|i| rivet_api::PortMapping {
            host_port: FILLER_BASE + i as u16,
            container_port: 80,
            protocol: rivet_api::Protocol::Tcp,
            host_ip: None,
        })
        .collect();
    let t = Instant::now();
    let p = w.add_pod_with_ports(node, mappings);
    (Some(p), t.elapsed().as_secs_f64() * 1e3)
}

/// Runs the benchmark.
pub fn run(opts: &Options, sizes: &[usize]) -> Report {
    let mut w = World::new();
    let rivet_node = w.add_node();
    // The hostPort map holds 16,384 mappings by default: a sweep past that
    // (30k in the full suite) sizes it like an operator would.
    let largest = sizes.iter().copied().max().unwrap_or(0);
    if largest > rivet_common::HOSTPORTS_MAX as usize {
        w.nodes[rivet_node].agent_args.extra_args = vec![
            "--max-hostports".into(),
            largest.next_power_of_two().to_string(),
        ];
    }
    w.start_agent(rivet_node);
    let pod = w.add_pod_with_ports(
        rivet_node,
        vec![rivet_api::PortMapping {
            host_port: HOST_PORT,
            container_port: 80,
            protocol: rivet_api::Protocol::Tcp,
            host_ip: None,
        }],
    );
    let ipt = kernel_node(&mut w, "ipt");
    let nft = kernel_node(&mut w, "nft");
    w.add_outside();
    w.outside
        .as_ref()
        .expect("outside")
        .run("sysctl", &["-qw", "net.ipv4.tcp_tw_reuse=1"]);
    // The same bridge-netfilter setting in every namespace of every
    // variant (nodes, pods, the outside host, the underlay), read back.
    let kernel_at_setup = crate::bridge_nf_off(crate::world_spaces(&w).chain([&ipt.pod, &nft.pod]));
    one_byte_server(&w.pods[pod].ns, 80);
    one_byte_server(&ipt.pod, 80);
    one_byte_server(&nft.pod, 80);
    let targets = [
        (
            "rivet",
            SocketAddr::from((w.nodes[rivet_node].ip, HOST_PORT)),
        ),
        (
            "iptables",
            SocketAddr::from((w.nodes[ipt.node].ip, HOST_PORT)),
        ),
        (
            "nftables",
            SocketAddr::from((w.nodes[nft.node].ip, HOST_PORT)),
        ),
    ];

    let mut report = Report {
        name: "hostPort vs number of mappings".into(),
        variants: targets.iter().map(|(n, _)| (*n).to_owned()).collect(),
        baseline: "iptables".into(),
        ..Default::default()
    };
    // Connection samples: 0.4 × --secs (2 s by default; thousands of
    // connections each, so the spread is the machine's drift between
    // rounds, not the sample), 0.3 s in a smoke run.
    let sample = opts.pick(
        Duration::from_secs_f64(f64::from(opts.secs) * 0.4),
        Duration::from_millis(300),
    );
    let warm = Duration::from_millis(200);
    let secs = sample.as_secs_f64();
    report.notes.push(format!(
        "connect + 1-byte exchange + close from an outside host, {secs} s per sample, {} rounds per size after a {} s warm-up of each variant, interleaved; iptables: DNAT rules in portmap's layout (nft backend), the measured mapping last; nftables: one DNAT rule looking up a map of (address . port) elements",
        opts.rounds,
        warm.as_secs_f64()
    ));
    report.notes.push(
        "program_ms: rivet = one CNI-path ADD (through the agent API) of a pod carrying the N − 1 other mappings; iptables = one iptables-nft-restore of the N rules; nftables = one `nft -f` of the map with N elements".into(),
    );
    let started = Instant::now();
    let mut filler = None;
    for &n in sizes {
        let (p50, p99, rate, prog) = (
            format!("connect_p50_us_n{n}"),
            format!("connect_p99_us_n{n}"),
            format!("conns_per_s_n{n}"),
            format!("program_ms_n{n}"),
        );
        for m in [&p50, &p99, &prog] {
            report.better.insert(m.clone(), "lower".into());
        }
        report.better.insert(rate.clone(), "higher".into());
        let ipt_ms = program_iptables(&w.nodes[ipt.node].ns, w.nodes[ipt.node].ip, ipt.pod_ip, n);
        report.add(&prog, "iptables", ipt_ms);
        let nft_ms = program_nft(&w.nodes[nft.node].ns, w.nodes[nft.node].ip, nft.pod_ip, n);
        report.add(&prog, "nftables", nft_ms);
        let (f, rivet_ms) = program_rivet(&mut w, rivet_node, filler.take(), n);
        filler = f;
        if let Some(p) = filler {
            // The filler pod's namespace, like every other.
            crate::bridge_nf_off([&w.pods[p].ns]);
        }
        report.add(&prog, "rivet", rivet_ms);
        let outside = w.outside.as_ref().expect("outside");
        progress(&format!(
            "nat: N={n} warm-up [{:.0}s]",
            started.elapsed().as_secs_f64()
        ));
        for (name, dst) in targets {
            let lat = connection_loop(outside, dst, warm);
            assert!(!lat.is_empty(), "{name}: no connection succeeded at N={n}");
        }
        for round in 0..opts.rounds {
            for (name, dst) in crate::rotated(&targets, round as usize) {
                progress(&format!(
                    "nat: N={n} round {}/{} {name} [{:.0}s]",
                    round + 1,
                    opts.rounds,
                    started.elapsed().as_secs_f64()
                ));
                let lat = connection_loop(outside, dst, sample);
                assert!(!lat.is_empty(), "{name}: no connection succeeded at N={n}");
                report.add(&p50, name, percentile(&lat, 50.0));
                report.add(&p99, name, percentile(&lat, 99.0));
                report.add(&rate, name, lat.len() as f64 / secs);
            }
        }
    }
    // Masquerade: the pods open connections to a server on the outside
    // host, through rivet's BPF SNAT and through iptables MASQUERADE.
    let outside = w.outside.as_ref().expect("outside");
    one_byte_server(outside, 9000);
    let outside_ip = Ipv4Addr::new(192, 168, w.k, 254);
    let dst = SocketAddr::from((outside_ip, 9000));
    for ns in [&w.pods[pod].ns, &ipt.pod] {
        ns.run("sysctl", &["-qw", "net.ipv4.tcp_tw_reuse=1"]);
    }
    let clients = [("rivet", &w.pods[pod].ns), ("iptables", &ipt.pod)];
    for m in ["snat_p50_us", "snat_p99_us"] {
        report.better.insert(m.into(), "lower".into());
    }
    report
        .better
        .insert("snat_conns_per_s".into(), "higher".into());
    for (name, ns) in clients {
        let lat = connection_loop(ns, dst, warm);
        assert!(
            !lat.is_empty(),
            "{name}: no masqueraded connection succeeded"
        );
    }
    for round in 0..opts.rounds {
        for (name, ns) in crate::rotated(&clients, round as usize) {
            progress(&format!(
                "nat: masquerade round {}/{} {name} [{:.0}s]",
                round + 1,
                opts.rounds,
                started.elapsed().as_secs_f64()
            ));
            let lat = connection_loop(ns, dst, sample);
            assert!(
                !lat.is_empty(),
                "{name}: no masqueraded connection succeeded"
            );
            report.add("snat_p50_us", name, percentile(&lat, 50.0));
            report.add("snat_p99_us", name, percentile(&lat, 99.0));
            report.add("snat_conns_per_s", name, lat.len() as f64 / secs);
        }
    }
    report.notes.push(
        "snat_*: a pod opens connections (connect + 1 byte + close) to the outside host through rivet's BPF masquerade vs iptables MASQUERADE (nf_conntrack)".into(),
    );
    progress(&format!(
        "nat: done in {:.0}s\n",
        started.elapsed().as_secs_f64()
    ));
    let kernel_at_end = crate::bridge_nf_read(crate::world_spaces(&w).chain([&ipt.pod, &nft.pod]));
    report.set_kernel_settings(kernel_at_setup, &kernel_at_end);
    report.notes.push(format!(
        "order: {} (per size and for the masquerade; the warm-ups run in the listed order)",
        crate::ROTATION
    ));
    report
}
