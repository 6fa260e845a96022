//! `bgp` mode: nodes announce their pod CIDRs with BIRD and the datapath
//! routes on what BGP learned — a full mesh, route reflectors, two racks
//! behind top-of-rack routers (eBGP, no L2 between racks), cross-subnet
//! tunnels, a stopped node, a speaker restart, a flapping peer.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use rivet_api::{BgpStatus, NodeEntry, Request, Response};
use rivet_tests::{
    World,
    bgp::{Fabric, wait_for},
    capture::Capture,
    continuity::ifindex,
    metrics::{http_get, sample},
    traffic::{assert_ping, ping, tcp_transfer},
    world::Counter,
};

/// Hold time of the tests' sessions (a stopped node goes after it).
const HOLD: u16 = 3;

fn routes(w: &World, n: usize) -> Vec<NodeEntry> {
    match w.nodes[n].agent().client().call(&Request::NodeList {}) {
        Ok(Response::Nodes { nodes }) => nodes,
        other => panic!("node list of {}: {other:?}", w.nodes[n].name),
    }
}

fn bgp(w: &World, n: usize) -> BgpStatus {
    match w.nodes[n].agent().client().call(&Request::Bgp {}) {
        Ok(Response::Bgp(s)) => s,
        other => panic!("bgp status of {}: {other:?}", w.nodes[n].name),
    }
}

/// Starts node `n` in `bgp` mode with `extra` flags.
fn start_bgp(w: &mut World, n: usize, extra: &[String]) {
    let mut args: Vec<String> = ["--mode", "bgp", "--bgp-hold-time", &HOLD.to_string()]
        .map(String::from)
        .to_vec();
    args.extend_from_slice(extra);
    w.nodes[n].agent_args.extra_args = args;
    w.start_agent(n);
}

/// `count` nodes on one underlay in a full mesh (told of each other
/// through the API, as by a store), each routing the others' pod CIDRs.
fn meshed(w: &mut World, count: usize) -> Vec<usize> {
    let nodes: Vec<usize> = (0..count).map(|_| w.add_node()).collect();
    for &n in &nodes {
        start_bgp(w, n, &[]);
    }
    w.mesh();
    for &n in &nodes {
        wait_for("every other node's route", Duration::from_secs(30), || {
            let r = routes(w, n);
            (r.len() == count - 1, r)
        });
    }
    nodes
}

/// Waits until node `n`'s datapath routes every other node's pod CIDR
/// (`expect`: subnet → route mode) toward the next hop `hop(subnet)`.
fn wait_routes(w: &World, n: usize, expect: &[(String, Ipv4Addr, &str)]) -> Duration {
    wait_for(
        &format!("routes of {}", w.nodes[n].name),
        Duration::from_secs(30),
        || {
            let got = routes(w, n);
            let ok = got.len() == expect.len()
                && expect.iter().all(|(subnet, hop, mode)| {
                    got.iter().any(|r| {
                        &r.subnet == subnet && r.node_ip == *hop && r.route.as_deref() == Some(mode)
                    })
                });
            (ok, got)
        },
    )
}

/// Every pod pings every other; 1 MiB over TCP between the first two.
fn all_pods_talk(w: &World, pods: &[usize]) {
    for &a in pods {
        for &b in pods {
            if a != b {
                assert_ping(&w.pods[a].ns, w.pods[b].ip, 2);
            }
        }
    }
    let (a, b) = (pods[0], pods[pods.len() - 1]);
    let moved = tcp_transfer(&w.pods[a].ns, &w.pods[b].ns, w.pods[b].ip, 7300, 1 << 20);
    assert_eq!(moved, 1 << 20);
}

#[test]
fn three_nodes_in_a_full_mesh_route_natively_on_what_bgp_learned() {
    let mut w = World::new();
    let nodes: Vec<usize> = (0..3).map(|_| w.add_node()).collect();
    // Sessions signed with TCP MD5.
    for &n in &nodes {
        start_bgp(&mut w, n, &["--bgp-password".into(), "rivet-mesh".into()]);
    }
    // The cluster's nodes (here given through the API, as a store would):
    // peers, not routes.
    w.mesh();
    for &n in &nodes {
        let expect: Vec<_> = nodes
            .iter()
            .filter(|&&m| m != n)
            .map(|&m| (w.nodes[m].pod_cidr.clone(), w.nodes[m].ip, "native"))
            .collect();
        let took = wait_routes(&w, n, &expect);
        eprintln!("{}: every route learned after {took:?}", w.nodes[n].name);
        let status = bgp(&w, n);
        assert!(status.speaker_up, "{status:?}");
        assert_eq!(status.sessions.len(), 2, "{status:?}");
        for s in &status.sessions {
            assert_eq!(s.state, "Established", "{status:?}");
            assert_eq!(s.role, "node");
            assert_eq!((s.received, s.advertised), (1, 1), "{status:?}");
        }
        assert_eq!(status.learned, 2);
    }
    let pods: Vec<usize> = nodes.iter().map(|&n| w.add_pod(n)).collect();
    let before = w.nodes[nodes[0]].counters();
    all_pods_talk(&w, &pods);
    // The node itself reaches a remote pod.
    assert_ping(&w.nodes[nodes[0]].ns, w.pods[pods[1]].ip, 2);
    let after = w.nodes[nodes[0]].counters();
    assert!(after.since(&before, Counter::FwdNative) >= 4, "{after:?}");
    assert_eq!(after.since(&before, Counter::FwdEncapVxlan), 0);
    assert_eq!(after.since(&before, Counter::FwdEncapIpip), 0);
    // rivetctl shows the sessions.
    let ctl = rivet_tests::kube::rivetctl(w.nodes[nodes[0]].agent().socket(), &["bgp"], "");
    assert!(ctl.ok, "rivetctl bgp: {}", ctl.stderr);
    let out = ctl.stdout;
    assert!(
        out.contains("Established") && out.contains("learned 2 route(s)"),
        "{out}"
    );
    // Prometheus: per peer.
    let (code, text) = http_get(&w.nodes[nodes[0]].ns, "/metrics");
    assert_eq!(code, 200);
    for m in &nodes[1..] {
        let peer = w.nodes[*m].ip;
        let labels = format!("{{peer=\"{peer}\",role=\"node\"}}");
        for (series, want) in [
            ("rivet_bgp_session_established", 1.0),
            ("rivet_bgp_prefixes_received", 1.0),
            ("rivet_bgp_prefixes_advertised", 1.0),
        ] {
            assert_eq!(
                sample(&text, &format!("{series}{labels}")),
                Some(want),
                "{series}: {text}"
            );
        }
    }
    assert_eq!(
        sample(&text, "rivet_bgp_routes_learned"),
        Some(2.0),
        "{text}"
    );
    assert_eq!(sample(&text, "rivet_bgp_speaker_up"), Some(1.0), "{text}");
    // The speaker's configuration signs every session.
    let conf =
        std::fs::read_to_string(w.nodes[nodes[0]].agent_args.state_dir.join("bgp/bird.conf"))
            .expect("bird.conf");
    assert_eq!(
        conf.matches("password \"rivet-mesh\";").count(),
        2,
        "{conf}"
    );
}

#[test]
fn two_racks_behind_routers_route_natively_with_no_encapsulation() {
    let mut w = World::new();
    let mut fabric = Fabric::new(&w);
    let (t1, t2) = (fabric.add_rack(65101), fabric.add_rack(65102));
    fabric.link(t1, t2);
    let nodes: Vec<usize> = [t1, t1, t2, t2]
        .iter()
        .map(|&t| fabric.add_node(&mut w, t))
        .collect();
    for (i, &n) in nodes.iter().enumerate() {
        let t = if i < 2 { t1 } else { t2 };
        let asn = 65001 + i as u32;
        fabric.tors[t].peer_with(w.nodes[n].ip, asn);
    }
    fabric.start();
    for (i, &n) in nodes.iter().enumerate() {
        let tor = &fabric.tors[if i < 2 { t1 } else { t2 }];
        w.nodes[n].agent_args.extra_args =
            tor.node_flags(65001 + i as u32, &["--bgp-hold-time", &HOLD.to_string()]);
        w.start_agent(n);
    }
    // Every node learns the three others; same-rack routes may point at
    // the peer itself (BIRD keeps a next hop on the shared subnet), the
    // others at the node's router.
    for (i, &n) in nodes.iter().enumerate() {
        let gw = fabric.tors[if i < 2 { t1 } else { t2 }].gateway;
        wait_for(
            &format!("routes of {}", w.nodes[n].name),
            Duration::from_secs(40),
            || {
                let got = routes(&w, n);
                let ok = got.len() == 3
                    && got.iter().all(|r| r.route.as_deref() == Some("native"))
                    && nodes
                        .iter()
                        .enumerate()
                        .filter(|(j, _)| j / 2 != i / 2)
                        .all(|(_, &m)| {
                            got.iter()
                                .any(|r| r.subnet == w.nodes[m].pod_cidr && r.node_ip == gw)
                        });
                (ok, got)
            },
        );
    }
    // The routers know the pods only from BGP.
    let far = &w.nodes[nodes[2]].pod_cidr;
    let route = fabric.tors[t1].route(far);
    assert!(route.contains("proto bird"), "router 1 to {far}: {route}");

    let pods: Vec<usize> = nodes.iter().map(|&n| w.add_pod(n)).collect();
    // On the wire between the racks: plain IP between pod addresses.
    let link = ifindex(&fabric.tors[t1].ns, "to2");
    let capture = Capture::start(&fabric.tors[t1].ns, link).expect("capture between racks");
    all_pods_talk(&w, &pods);
    let frames = capture.stop().expect("capture").frames;
    let (a, d) = (w.pods[pods[0]].ip, w.pods[pods[3]].ip);
    let plain = frames
        .iter()
        .filter_map(|f| f.ipv4())
        .filter(|i| (i.src, i.dst) == (a, d) || (i.src, i.dst) == (d, a))
        .count();
    let tunnelled = frames
        .iter()
        .filter_map(|f| f.ipv4())
        .filter(|i| i.proto == 4 || (i.proto == 17 && i.ports.1 == 8472))
        .count();
    assert!(
        plain >= 4,
        "pod frames between racks: {plain} of {}",
        frames.len()
    );
    assert_eq!(tunnelled, 0, "tunnel frames between racks");
}

#[test]
fn route_reflectors_serve_five_nodes() {
    let mut w = World::new();
    let nodes: Vec<usize> = (0..5).map(|_| w.add_node()).collect();
    let reflectors = format!("{},{}", w.nodes[0].ip, w.nodes[1].ip);
    for (i, &n) in nodes.iter().enumerate() {
        let mut extra = vec!["--bgp-reflectors".to_owned(), reflectors.clone()];
        if i < 2 {
            extra.extend([
                "--bgp-reflector-cluster-id".to_owned(),
                "1.0.0.1".to_owned(),
            ]);
        }
        start_bgp(&mut w, n, &extra);
    }
    w.mesh();
    for (i, &n) in nodes.iter().enumerate() {
        let expect: Vec<_> = nodes
            .iter()
            .filter(|&&m| m != n)
            .map(|&m| (w.nodes[m].pod_cidr.clone(), w.nodes[m].ip, "native"))
            .collect();
        wait_routes(&w, n, &expect);
        let status = bgp(&w, n);
        let roles: Vec<&str> = status.sessions.iter().map(|s| s.role.as_str()).collect();
        if i < 2 {
            // The other reflector, and the three clients.
            assert_eq!(status.sessions.len(), 4, "{status:?}");
            assert_eq!(roles.iter().filter(|r| **r == "client").count(), 3);
            assert_eq!(status.cluster_id, Some(Ipv4Addr::new(1, 0, 0, 1)));
        } else {
            assert_eq!(roles, ["reflector", "reflector"], "{status:?}");
        }
    }
    let pods: Vec<usize> = [2, 4, 0].iter().map(|&n| w.add_pod(nodes[n])).collect();
    all_pods_talk(&w, &pods);
}

#[test]
fn a_stopped_node_is_withdrawn_within_the_hold_time() {
    let mut w = World::new();
    let nodes = meshed(&mut w, 3);
    // Node 3 drops off the network: no FIN, no notification — only the
    // hold timer tells.
    let gone = w.nodes[nodes[2]].pod_cidr.clone();
    w.nodes[nodes[2]].ns.ip(&["link", "set", "eth0", "down"]);
    let stopped = Instant::now();
    for &n in &nodes[..2] {
        wait_for(
            "the stopped node's route withdrawn",
            Duration::from_secs(10),
            || {
                let r = routes(&w, n);
                (!r.iter().any(|e| e.subnet == gone), r)
            },
        );
    }
    let took = stopped.elapsed();
    eprintln!("withdrawn from both nodes {took:?} after the stop (hold time {HOLD} s)");
    // The hold timer, not a faster path (there is none without a FIN) nor
    // a slower one: gone within the hold time and a little slack.
    assert!(
        took <= Duration::from_secs(u64::from(HOLD) + 2),
        "withdrawal took {took:?}"
    );
    // The others still route to each other.
    let (a, b) = (w.add_pod(nodes[0]), w.add_pod(nodes[1]));
    assert_ping(&w.pods[a].ns, w.pods[b].ip, 2);
}

#[test]
fn a_speaker_restart_with_graceful_restart_loses_no_packet() {
    let mut w = World::new();
    let nodes = meshed(&mut w, 2);
    let (a, b) = (w.add_pod(nodes[0]), w.add_pod(nodes[1]));
    assert_ping(&w.pods[a].ns, w.pods[b].ip, 2);
    // 800 pings over 8 s; node 1's speaker is killed one second in.
    let pid_file = w.nodes[nodes[0]].agent_args.state_dir.join("bgp/bird.pid");
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(1));
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap_or_else(|e| panic!("{}: {e}", pid_file.display()))
            .trim()
            .parse()
            .expect("a PID");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("killing the speaker");
    });
    let result = ping(&w.pods[a].ns, w.pods[b].ip, 800, 0.01);
    killer.join().expect("the speaker killed");
    assert_eq!(
        result.received, 800,
        "pings lost across the restart: {result:?}"
    );
    // The agent started it again and the session came back.
    wait_for("session re-established", Duration::from_secs(20), || {
        let s = bgp(&w, nodes[0]);
        let ok = s.speaker_up
            && s.speaker_restarts == 1
            && s.sessions.iter().all(|x| x.state == "Established");
        (ok, s)
    });
    assert_eq!(routes(&w, nodes[1]).len(), 1);
    assert_ping(&w.pods[a].ns, w.pods[b].ip, 2);
}

#[test]
fn cross_subnet_tunnels_only_between_racks() {
    let mut w = World::new();
    let mut fabric = Fabric::new(&w);
    let (t1, t2) = (fabric.add_rack(65101), fabric.add_rack(65102));
    fabric.link(t1, t2);
    fabric.start();
    let nodes: Vec<usize> = [t1, t1, t2]
        .iter()
        .map(|&t| fabric.add_node(&mut w, t))
        .collect();
    for &n in &nodes {
        start_bgp(&mut w, n, &["--bgp-cross-subnet".into(), "vxlan".into()]);
    }
    w.mesh();
    // Same rack: native to the node; the other rack: VXLAN to the node.
    let cidr = |m: usize| w.nodes[nodes[m]].pod_cidr.clone();
    let ip = |m: usize| w.nodes[nodes[m]].ip;
    wait_routes(
        &w,
        nodes[0],
        &[(cidr(1), ip(1), "native"), (cidr(2), ip(2), "vxlan")],
    );
    wait_routes(
        &w,
        nodes[2],
        &[(cidr(0), ip(0), "vxlan"), (cidr(1), ip(1), "vxlan")],
    );
    let pods: Vec<usize> = nodes.iter().map(|&n| w.add_pod(n)).collect();
    let before = w.nodes[nodes[0]].counters();
    assert_ping(&w.pods[pods[0]].ns, w.pods[pods[1]].ip, 3);
    let mid = w.nodes[nodes[0]].counters();
    assert_ping(&w.pods[pods[0]].ns, w.pods[pods[2]].ip, 3);
    let after = w.nodes[nodes[0]].counters();
    assert!(mid.since(&before, Counter::FwdNative) >= 3, "{mid:?}");
    assert_eq!(mid.since(&before, Counter::FwdEncapVxlan), 0);
    assert!(after.since(&mid, Counter::FwdEncapVxlan) >= 3, "{after:?}");
    all_pods_talk(&w, &pods);
}

#[test]
fn a_flapping_peer_does_not_make_the_datapath_thrash() {
    let mut w = World::new();
    let nodes = meshed(&mut w, 2);
    // Node 2's session to node 1 goes down and up six times, as fast as
    // the session comes back: twelve BGP updates reach node 1's speaker
    // (its table is followed, not sampled).
    let ctl = w.nodes[nodes[1]].agent_args.state_dir.join("bgp/bird.ctl");
    let session = format!(
        "node_{}",
        w.nodes[nodes[0]].ip.to_string().replace('.', "_")
    );
    let birdc = |cmd: &str| {
        let out = std::process::Command::new(rivet_tests::bgp::BIRDC)
            .arg("-s")
            .arg(&ctl)
            .args([cmd, &session])
            .output()
            .expect("birdc");
        assert!(out.status.success(), "birdc {cmd}: {out:?}");
    };
    let learned = |want: usize| {
        wait_for(
            "node 1's speaker to follow",
            Duration::from_secs(20),
            || {
                let s = bgp(&w, nodes[0]);
                (s.learned == want, s)
            },
        );
    };
    let start = bgp(&w, nodes[0]).route_changes;
    let mut after_cycle = Vec::new();
    for _ in 0..6 {
        birdc("disable");
        learned(0);
        birdc("enable");
        learned(1);
        after_cycle.push(bgp(&w, nodes[0]).route_changes - start);
    }
    let status = bgp(&w, nodes[0]);
    eprintln!("datapath route changes after each flap: {after_cycle:?}; {status:?}");
    assert_eq!(status.suppressions, 1, "{status:?}");
    assert_eq!(status.suppressed, 1, "{status:?}");
    // Followed while the penalty was low, then held out: the route is
    // not in the datapath and the last flaps changed nothing.
    assert!(routes(&w, nodes[0]).is_empty());
    assert!(after_cycle[5] <= 7, "{after_cycle:?}");
    assert_eq!(after_cycle[5], after_cycle[3], "{after_cycle:?}");
}

#[test]
fn mesh_peers_come_from_etcd_and_agent_restarts_move_no_session() {
    let mut w = World::new();
    w.start_etcd();
    let nodes: Vec<usize> = (0..3).map(|_| w.add_etcd_node("bgp", 10)).collect();
    for &n in &nodes {
        let expect: Vec<_> = nodes
            .iter()
            .filter(|&&m| m != n)
            .map(|&m| (w.nodes[m].pod_cidr.clone(), w.nodes[m].ip, "native"))
            .collect();
        wait_routes(&w, n, &expect);
    }
    let (a, b) = (w.add_pod(nodes[0]), w.add_pod(nodes[1]));
    assert_ping(&w.pods[a].ns, w.pods[b].ip, 2);
    let pid_file = w.nodes[nodes[0]].agent_args.state_dir.join("bgp/bird.pid");
    let speaker = std::fs::read_to_string(&pid_file).expect("the speaker's PID");
    let before = bgp(&w, nodes[0]);
    assert!(
        before.sessions.iter().all(|s| s.state == "Established"),
        "{before:?}"
    );
    // 600 pings at 10 ms while node 1's agent is killed, started, stopped
    // and started again.
    let ns = w.pods[b].ns.name().to_owned();
    let dst = w.pods[a].ip;
    let pinger = std::thread::spawn(move || {
        let out = std::process::Command::new("nsenter")
            .arg(format!("--net=/run/netns/{ns}"))
            .args([
                "--",
                "ping",
                "-q",
                "-c",
                "600",
                "-i",
                "0.01",
                &dst.to_string(),
            ])
            .output()
            .expect("ping");
        String::from_utf8_lossy(&out.stdout).into_owned()
    });
    std::thread::sleep(Duration::from_millis(500));
    let agent = w.nodes[nodes[0]].agent_mut();
    agent.stop_with(nix::sys::signal::Signal::SIGKILL);
    agent.restart();
    agent.stop();
    agent.restart();
    let summary = pinger.join().expect("pinger");
    assert!(
        summary.contains("600 packets transmitted, 600 received"),
        "pings across the agent restarts: {summary}"
    );
    let after = bgp(&w, nodes[0]);
    assert_eq!(
        std::fs::read_to_string(&pid_file).expect("the speaker's PID"),
        speaker,
        "the speaker was restarted"
    );
    assert_eq!(after.speaker_restarts, 0);
    for s in &after.sessions {
        let was = before
            .sessions
            .iter()
            .find(|x| x.name == s.name)
            .unwrap_or_else(|| panic!("session {} is new: {after:?}", s.name));
        assert_eq!(s.state, "Established", "{after:?}");
        assert!(
            s.uptime_secs >= was.uptime_secs,
            "session {} was reset: {was:?} → {s:?}",
            s.name
        );
    }
    assert_eq!(routes(&w, nodes[0]).len(), 2);
}
