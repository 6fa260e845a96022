//! Pods on different nodes, through the BPF encapsulation (VXLAN, IPIP) or
//! native routing, in a static cluster (routes given through the API).

use rivet_tests::{
    World,
    traffic::{assert_ping, tcp_transfer},
};

fn cross_node(mode: &str) {
    let mut w = World::new();
    let nodes = w.add_static_cluster(2, mode);
    let a = w.add_pod(nodes[0]);
    let b = w.add_pod(nodes[1]);
    let before: Vec<_> = nodes.iter().map(|&n| w.nodes[n].counters()).collect();

    assert_ping(&w.pods[a].ns, w.pods[b].ip, 3);
    assert_ping(&w.pods[b].ns, w.pods[a].ip, 3);
    let moved = tcp_transfer(&w.pods[a].ns, &w.pods[b].ns, w.pods[b].ip, 7100, 4 << 20);
    assert_eq!(moved, 4 << 20);
    // The node itself reaches the remote pod (rivet_host + from_host).
    assert_ping(&w.nodes[nodes[0]].ns, w.pods[b].ip, 2);
    tcp_transfer(&w.nodes[nodes[0]].ns, &w.pods[b].ns, w.pods[b].ip, 7101, 1 << 20);

    let after: Vec<_> = nodes.iter().map(|&n| w.nodes[n].counters()).collect();
    let d = |i: usize, name: &str| after[i][name] - before[i][name];
    let (sent, got) = match mode {
        "vxlan" => ("fwd_encap_vxlan", "decap_vxlan"),
        "ipip" => ("fwd_encap_ipip", "decap_ipip"),
        _ => ("fwd_native", "fwd_from_peer"),
    };
    assert!(d(0, sent) >= 3 && d(1, sent) >= 3, "{sent}: {:?} / {:?}", after[0], after[1]);
    assert!(d(0, got) >= 3 && d(1, got) >= 3, "{got}: {:?} / {:?}", after[0], after[1]);
    for (i, c) in after.iter().enumerate() {
        for (name, v) in c {
            if name.starts_with("drop_") {
                assert_eq!(*v, before[i][name], "node {i} dropped: {name} in {c:?}");
            }
        }
    }
}

#[test]
fn vxlan_between_nodes() {
    cross_node("vxlan");
}

#[test]
fn ipip_between_nodes() {
    cross_node("ipip");
}

#[test]
fn native_between_nodes() {
    cross_node("native");
}

#[test]
fn hybrid_between_nodes_on_one_subnet_is_native() {
    cross_node("hybrid");
}
