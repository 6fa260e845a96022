//! Resource limits: maps are sized from the agent's configuration, and a
//! full map is a counted, visible failure — a CNI error naming the map and
//! the key to raise, a `rivetctl status` warning, a metric — never a crash,
//! a half-made pod or a half-added node.

use std::{
    net::Ipv4Addr,
    path::Path,
    process::{Command, Stdio},
};

use rivet_api::{AgentStatus, NodeEntry, Request, Response};
use rivet_tests::{
    Netns, World, bin,
    cni::{Plugin, rivet_conf},
    metrics::{http_get, sample},
    traffic::assert_ping,
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
