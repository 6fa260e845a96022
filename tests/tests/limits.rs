//! Resource limits: maps are sized from the agent's configuration, and a
//! full map is a counted, visible failure — a CNI error naming the map and
//! the key to raise, a `rivetctl status` warning, a metric — never a crash,
//! a half-made pod or a half-added node.

use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr},
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use rivet_api::{AgentStatus, NodeEntry, Request, Response};
use rivet_tests::{
    Netns, World, bin,
    cni::{Plugin, rivet_conf},
    metrics::{http_get, sample},
    traffic::{assert_ping, connect, listen},
};

fn status(w: &World, n: usize) -> AgentStatus {
    match w.nodes[n].agent().client().call(&Request::Status {}) {
        Ok(Response::Status(s)) => s,
        other => panic!("status: {other:?}"),
    }
}

fn rivetctl_status(socket: &Path) -> String {
    let out = Command::new(bin("rivetctl"))
        .arg("--socket")
        .arg(socket)
        .arg("status")
        .stdin(Stdio::null())
        .output()
        .expect("rivetctl");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Host-side pod veths in the node namespace.
fn pod_veths(ns: &Netns) -> usize {
    ns.ip(&["-o", "link", "show"])
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|n| n.starts_with("rv"))
        })
        .count()
}

#[test]
fn a_full_endpoints_map_refuses_the_pod_cleanly_and_says_so() {
    let mut w = World::new();
    let n = w.add_node();
    w.nodes[n].agent_args.extra_args = vec!["--max-endpoints".into(), "16".into()];
    w.start_agent(n);
    let node_ns = w.nodes[n].ns.path();
    let plugin = Plugin::rivet(&node_ns);
    let socket = w.nodes[n].agent().socket().to_owned();
    let conf = rivet_conf("1.1.0", &socket);

    let s = status(&w, n);
    let ep = s
        .maps
        .iter()
        .find(|m| m.name == "ENDPOINTS")
        .expect("ENDPOINTS in status.maps");
    assert_eq!(ep.capacity, 16, "sized from max_endpoints: {ep:?}");
    assert!(ep.memory_bytes > 0, "kernel memory reported: {ep:?}");

    let pods: Vec<Netns> = (0..17)
        .map(|i| Netns::new(format!("{}-p{i}", w.prefix)))
        .collect();
    for (i, ns) in pods.iter().take(16).enumerate() {
        plugin
            .add(&format!("c{i}"), &ns.path(), &conf)
            .expect_ok("ADD below the limit");
    }
    let s = status(&w, n);
    assert!(
        s.warnings
            .iter()
            .any(|w| w.contains("ENDPOINTS is 100% full")),
        "a nearly full map is a warning: {:?}",
        s.warnings
    );

    // The 17th: a CNI error naming the map and the key, code 100
    // (resources exhausted), and nothing left of it anywhere.
    let msg = plugin
        .add("c16", &pods[16].path(), &conf)
        .expect_code(100, "ADD into a full endpoints map");
    assert!(
        msg.contains("ENDPOINTS is full") && msg.contains("max_endpoints"),
        "{msg}"
    );
    assert_eq!(
        pod_veths(&w.nodes[n].ns),
        16,
        "no veth left by the refused pod"
    );
    let links = pods[16].ip(&["-o", "link", "show"]);
    assert_eq!(
        links.lines().count(),
        1,
        "only lo in the refused pod: {links}"
    );
    let s = status(&w, n);
    assert_eq!(s.endpoints, 16);
    assert_eq!(
        s.pool.used, 16,
        "the refused pod's address went back to the pool"
    );
    let ep = s.maps.iter().find(|m| m.name == "ENDPOINTS").expect("map");
    assert_eq!(ep.full_refusals, 1, "{ep:?}");
    assert!(
        s.warnings
            .iter()
            .any(|w| w.contains("map ENDPOINTS is full: 1 entries refused")),
        "{:?}",
        s.warnings
    );
    let text = rivetctl_status(&socket);
    assert!(
        text.contains("WARNING: map ENDPOINTS is full") && text.contains("max_endpoints"),
        "{text}"
    );
    let (_, metrics) = http_get(&w.nodes[n].ns, "/metrics");
    assert_eq!(
        sample(
            &metrics,
            r#"rivet_map_full_refusals_total{map="ENDPOINTS"}"#
        ),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, r#"rivet_map_capacity{map="ENDPOINTS"}"#),
        Some(16.0)
    );

    // Room again after a DEL: the same pod now attaches and works.
    plugin
        .del("c3", Some(&pods[3].path()), &conf)
        .expect_ok("DEL");
    let out = plugin
        .add("c16", &pods[16].path(), &conf)
        .expect_ok("ADD after a DEL freed an entry");
    let ip = rivet_tests::cni::result_ip(&out.json).expect("address");
    // Reachable from a sibling: the new entry is live.
    assert_ping(&pods[0], ip, 2);
    for (i, ns) in pods.iter().enumerate() {
        plugin
            .del(&format!("c{i}"), Some(&ns.path()), &conf)
            .expect_ok("DEL at the end");
    }
}

#[test]
fn a_full_routes_map_refuses_the_node_without_half_adding_it() {
    let mut w = World::new();
    let n = w.add_node();
    w.nodes[n].agent_args.extra_args = vec!["--max-routes".into(), "16".into()];
    w.start_agent(n);
    let client = w.nodes[n].agent().client();
    let node = |i: u8| NodeEntry {
        subnet: format!("10.250.{i}.0/24"),
        node_ip: Ipv4Addr::new(192, 168, 250, i),
        vtep_mac: None,
        vni: None,
        route: None,
    };
    for i in 1..=16 {
        let r = client.call(&Request::NodeSet(node(i)));
        assert!(matches!(r, Ok(Response::Nodes { .. })), "node {i}: {r:?}");
    }
    let r = client.call(&Request::NodeSet(node(17)));
    let err = match r {
        Err(e) => e.to_string(),
        Ok(other) => panic!("a 17th node in a map of 16 was accepted: {other:?}"),
    };
    assert!(
        err.contains("is full") && err.contains("max_routes"),
        "{err}"
    );
    let s = status(&w, n);
    assert_eq!(s.nodes, 16, "the refused node is not half-known");
    // ROUTES and PEERS are both sized by max_routes; whichever refused
    // first is counted and named.
    let sized: Vec<_> = s
        .maps
        .iter()
        .filter(|m| m.name == "ROUTES" || m.name == "PEERS")
        .collect();
    assert!(sized.iter().all(|m| m.capacity == 16), "{sized:?}");
    assert_eq!(
        sized.iter().map(|m| m.full_refusals).sum::<u64>(),
        1,
        "{sized:?}"
    );
    assert!(
        s.warnings
            .iter()
            .any(|w| w.contains("is full") && w.contains("max_routes")),
        "{:?}",
        s.warnings
    );
    // PEERS holds no entry for the refused node (read back through the
    // node listing the agent builds from the maps).
    match client.call(&Request::NodeList {}) {
        Ok(Response::Nodes { nodes }) => {
            assert_eq!(nodes.len(), 16);
            assert!(
                !nodes
                    .iter()
                    .any(|e| e.node_ip == Ipv4Addr::new(192, 168, 250, 17)),
                "{nodes:?}"
            );
        }
        other => panic!("node list: {other:?}"),
    }
    // After a node leaves, the refused one fits.
    let r = client.call(&Request::NodeDel {
        subnet: node(1).subnet,
    });
    assert!(r.is_ok(), "{r:?}");
    let r = client.call(&Request::NodeSet(node(17)));
    assert!(matches!(r, Ok(Response::Nodes { .. })), "{r:?}");
}

/// hostPorts `(hostPort, containerPort, protocol)` as a CNI runtimeConfig.
fn with_ports(conf: &serde_json::Value, ports: &[(u16, u16, &str)]) -> serde_json::Value {
    let mut conf = conf.clone();
    conf["runtimeConfig"] = serde_json::json!({
        "portMappings": ports
            .iter()
            .map(|(h, c, p)| serde_json::json!({"hostPort": h, "containerPort": c, "protocol": p}))
            .collect::<Vec<_>>()
    });
    conf
}

/// `(hostPort, protocol)` of every entry in the node's HOSTPORTS map.
fn hostport_entries(w: &World, n: usize) -> Vec<(u16, String)> {
    match w.nodes[n].agent().client().call(&Request::PortmapList {}) {
        Ok(Response::Portmaps { mappings }) => {
            let mut v: Vec<(u16, String)> = mappings
                .into_iter()
                .map(|m| (m.host_port, m.protocol))
                .collect();
            v.sort();
            v
        }
        other => panic!("portmap list: {other:?}"),
    }
}

/// A full HOSTPORTS map refuses the pod whose hostPort does not fit —
/// CNI code 100 naming the map and `max_hostports`, counted in the status,
/// its warnings, `rivetctl status` and `rivet_map_full_refusals_total` —
/// and leaves nothing of it: no veth, no record, no address lease, no
/// endpoint, none of its hostPorts (also when some of them had fitted).
/// Removing a pod frees room: the refused pod then attaches and its
/// hostPort carries traffic.
#[test]
fn a_full_hostports_map_refuses_the_pod_cleanly_and_says_so() {
    let mut w = World::new();
    let n = w.add_node();
    // The smallest map the agent accepts.
    w.nodes[n].agent_args.extra_args = vec!["--max-hostports".into(), "16".into()];
    w.start_agent(n);
    w.add_outside();
    let node_ns = w.nodes[n].ns.path();
    let plugin = Plugin::rivet(&node_ns);
    let socket = w.nodes[n].agent().socket().to_owned();
    let conf = rivet_conf("1.1.0", &socket);
    let hostports = |w: &World| {
        status(w, n)
            .maps
            .into_iter()
            .find(|m| m.name == "HOSTPORTS")
            .expect("HOSTPORTS in status.maps")
    };
    let hp = hostports(&w);
    assert_eq!(
        (hp.capacity, hp.entries),
        (16, 0),
        "sized from max_hostports: {hp:?}"
    );
    assert!(hp.memory_bytes > 0, "kernel memory reported: {hp:?}");

    let pods: Vec<Netns> = (0..4)
        .map(|i| Netns::new(format!("{}-hp{i}", w.prefix)))
        .collect();
    // a and b: eight hostPorts each (b's first one UDP), filling the map;
    // c: one; d: nine.
    let tcp = |from: u16, count: u16| -> Vec<(u16, u16, &str)> {
        (0..count).map(|i| (from + i, 80 + i, "tcp")).collect()
    };
    let a_ports = tcp(8080, 8);
    let mut b_ports = vec![(5353, 53, "udp")];
    b_ports.extend(tcp(8100, 7));
    let a = with_ports(&conf, &a_ports);
    let b = with_ports(&conf, &b_ports);
    let c = with_ports(&conf, &[(9000, 80, "tcp")]);
    let d = with_ports(&conf, &tcp(9001, 9));
    let listed = |ports: &[&[(u16, u16, &str)]]| {
        let mut v: Vec<(u16, String)> = ports
            .iter()
            .flat_map(|p| p.iter().map(|(h, _, proto)| (*h, (*proto).to_owned())))
            .collect();
        v.sort();
        v
    };
    plugin
        .add("a", &pods[0].path(), &a)
        .expect_ok("ADD a, eight hostPorts");
    plugin
        .add("b", &pods[1].path(), &b)
        .expect_ok("ADD b, eight hostPorts");
    let full = listed(&[&a_ports, &b_ports]);
    assert_eq!(full.len(), 16);
    assert_eq!(hostport_entries(&w, n), full);
    let s = status(&w, n);
    assert!(
        s.warnings
            .iter()
            .any(|w| w.contains("HOSTPORTS is 100% full") && w.contains("max_hostports")),
        "a full map is a warning: {:?}",
        s.warnings
    );

    // Nothing of a refused pod is left: the node holds exactly the pods
    // attached before it, the refused pod's namespace only its loopback.
    let only = |w: &World, what: &str, pods_left: usize, refused: &Netns| {
        let node = &w.nodes[n];
        assert_eq!(pod_veths(&node.ns), pods_left, "{what}: veths");
        assert_eq!(node.records().len(), pods_left, "{what}: records");
        assert_eq!(node.map_entries().len(), pods_left, "{what}: endpoints map");
        let s = status(w, n);
        assert_eq!(s.endpoints, pods_left, "{what}: endpoints");
        assert_eq!(s.pool.used, pods_left as u64, "{what}: address leases");
        let links = refused.ip(&["-o", "link", "show"]);
        assert_eq!(
            links.lines().count(),
            1,
            "{what}: only lo in the refused pod: {links}"
        );
    };

    // c's one hostPort does not fit.
    let msg = plugin
        .add("c", &pods[2].path(), &c)
        .expect_code(100, "ADD with a hostPort into a full HOSTPORTS map");
    assert!(
        msg.contains("HOSTPORTS is full") && msg.contains("max_hostports"),
        "{msg}"
    );
    only(&w, "after c was refused", 2, &pods[2]);
    assert_eq!(hostport_entries(&w, n), full, "after c was refused");
    let hp = hostports(&w);
    assert_eq!((hp.entries, hp.full_refusals), (16, 1), "{hp:?}");
    let s = status(&w, n);
    assert!(
        s.warnings
            .iter()
            .any(|w| w.contains("map HOSTPORTS is full: 1 entries refused")
                && w.contains("max_hostports")),
        "{:?}",
        s.warnings
    );
    let text = rivetctl_status(&socket);
    assert!(
        text.contains("WARNING: map HOSTPORTS is full") && text.contains("max_hostports"),
        "{text}"
    );
    let (_, metrics) = http_get(&w.nodes[n].ns, "/metrics");
    assert_eq!(
        sample(
            &metrics,
            r#"rivet_map_full_refusals_total{map="HOSTPORTS"}"#
        ),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, r#"rivet_map_capacity{map="HOSTPORTS"}"#),
        Some(16.0)
    );

    // Room for eight: d's first eight hostPorts fit, its ninth does not,
    // and the eight that had been written go with the rest of d.
    plugin
        .del("b", Some(&pods[1].path()), &b)
        .expect_ok("DEL b");
    let half = listed(&[&a_ports]);
    assert_eq!(hostport_entries(&w, n), half, "b's hostPorts gone");
    let msg = plugin
        .add("d", &pods[3].path(), &d)
        .expect_code(100, "ADD with nine hostPorts into eight free entries");
    assert!(
        msg.contains("HOSTPORTS is full") && msg.contains("max_hostports"),
        "{msg}"
    );
    only(&w, "after d was refused", 1, &pods[3]);
    assert_eq!(
        hostport_entries(&w, n),
        half,
        "none of d's hostPorts stayed"
    );
    assert_eq!(hostports(&w).full_refusals, 2);

    // The refused pod c now fits, and its hostPort works from outside.
    plugin
        .add("c", &pods[2].path(), &c)
        .expect_ok("ADD c after b freed room");
    assert_eq!(hostports(&w).entries, 9);
    let server = listen(&pods[2], 80);
    let answer = std::thread::spawn(move || {
        let (mut s, peer) = server.accept().expect("accept");
        s.write_all(peer.ip().to_string().as_bytes())
            .expect("answer");
    });
    let out = w.outside.as_ref().expect("outside");
    let mut s = connect(
        out,
        SocketAddr::from((w.nodes[n].ip, 9000)),
        Duration::from_secs(5),
    )
    .expect("outside → c's hostPort 9000");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut seen = String::new();
    s.read_to_string(&mut seen).expect("answer from c");
    answer.join().expect("server");
    assert_eq!(seen, Ipv4Addr::new(192, 168, w.k, 254).to_string());

    for (id, ns, conf) in [
        ("a", &pods[0], &a),
        ("c", &pods[2], &c),
        ("d", &pods[3], &d),
    ] {
        plugin
            .del(id, Some(&ns.path()), conf)
            .expect_ok("DEL at the end");
    }
    assert_eq!(hostport_entries(&w, n), Vec::new(), "no hostPort left");
    w.nodes[n].assert_no_pod_state("after the last DEL");
}
