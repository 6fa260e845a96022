//! Pods on different nodes, through the BPF encapsulation (VXLAN, IPIP) or
//! native routing, in a static cluster (routes given through the API).

use rivet_tests::{
    World,
    traffic::{assert_ping, iperf3_client, iperf3_server, tcp_transfer},
    world::{Counter, Counters},
};

/// A static two-node cluster in `mode` with one pod on each node.
fn two_node_pods(mode: &str) -> (World, Vec<usize>, usize, usize) {
    let mut w = World::new();
    let nodes = w.add_static_cluster(2, mode);
    let a = w.add_pod(nodes[0]);
    let b = w.add_pod(nodes[1]);
    (w, nodes, a, b)
}

/// Average size of the packets a counter saw between two readings.
fn avg_size(before: &Counters, after: &Counters, c: Counter) -> u64 {
    let packets = after.since(before, c);
    assert!(packets > 0, "{} did not move: {after:?}", c.name());
    (after.bytes(c) - before.bytes(c)) / packets
}

fn cross_node(mode: &str) {
    let (w, nodes, a, b) = two_node_pods(mode);
    let before: Vec<_> = nodes.iter().map(|&n| w.nodes[n].counters()).collect();

    assert_ping(&w.pods[a].ns, w.pods[b].ip, 3);
    assert_ping(&w.pods[b].ns, w.pods[a].ip, 3);
    let moved = tcp_transfer(&w.pods[a].ns, &w.pods[b].ns, w.pods[b].ip, 7100, 4 << 20);
    assert_eq!(moved, 4 << 20);
    // The node itself reaches the remote pod (rivet_host + from_host).
    assert_ping(&w.nodes[nodes[0]].ns, w.pods[b].ip, 2);
    tcp_transfer(
        &w.nodes[nodes[0]].ns,
        &w.pods[b].ns,
        w.pods[b].ip,
        7101,
        1 << 20,
    );

    // iperf3 between the pods; GSO survives the encapsulation: the packets
    // the sender's program encapsulates and the receiver's decapsulates are
    // whole TCP trains, far above the 1500-byte MTU (the veth underlay
    // carries GSO, like a NIC with tunnel TSO).
    let sent_counter = match mode {
        "vxlan" => Counter::FwdEncapVxlan,
        "ipip" => Counter::FwdEncapIpip,
        _ => Counter::FwdNative,
    };
    let sent_name = sent_counter.name();
    let tx0 = w.nodes[nodes[0]].counters();
    let srv = iperf3_server(&w.pods[b].ns, 5201, None);
    let res = iperf3_client(&w.pods[a].ns, w.pods[b].ip, 5201, 2, 1, None);
    drop(srv);
    assert!(res.bits_per_second > 1e8, "iperf3 {mode}: {res:?}");
    let tx1 = w.nodes[nodes[0]].counters();
    let avg = avg_size(&tx0, &tx1, sent_counter);
    eprintln!(
        "{mode}: {:.2} Gbit/s, {sent_name} average packet {avg} bytes",
        res.bits_per_second / 1e9
    );
    assert!(
        avg > 8000,
        "{sent_name}: average packet {avg} bytes: GSO lost"
    );

    let after: Vec<_> = nodes.iter().map(|&n| w.nodes[n].counters()).collect();
    let d = |i: usize, c: Counter| after[i].since(&before[i], c);
    let (sent, got) = match mode {
        "vxlan" => (Counter::FwdEncapVxlan, Counter::DecapVxlan),
        "ipip" => (Counter::FwdEncapIpip, Counter::DecapIpip),
        _ => (Counter::FwdNative, Counter::FwdFromPeer),
    };
    assert!(
        d(0, sent) >= 3 && d(1, sent) >= 3,
        "{}: {:?} / {:?}",
        sent.name(),
        after[0],
        after[1]
    );
    assert!(
        d(0, got) >= 3 && d(1, got) >= 3,
        "{}: {:?} / {:?}",
        got.name(),
        after[0],
        after[1]
    );
    for (i, c) in after.iter().enumerate() {
        for (counter, v) in c.iter() {
            if counter.is_drop() {
                assert_eq!(
                    v,
                    before[i][counter],
                    "node {i} dropped: {} in {c:?}",
                    counter.name()
                );
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

/// Every node is a router hop: TTL 1 expires at the first node, TTL 2 at
/// the second, TTL 3 reaches the pod; traceroute shows both nodes.
#[test]
fn ttl_is_decremented_per_node_and_expires_with_icmp() {
    let (w, nodes, a, b) = two_node_pods("vxlan");
    let dst = w.pods[b].ip.to_string();
    let ping_ttl = |ttl: &str| {
        let out = w.pods[a]
            .ns
            .output("ping", &["-n", "-c", "1", "-W", "2", "-t", ttl, &dst]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let n1 = w.nodes[nodes[0]].ip.to_string();
    let n2 = w.nodes[nodes[1]].ip.to_string();
    let one = ping_ttl("1");
    assert!(
        one.contains("Time to live exceeded") && one.contains(&format!("From {n1}")),
        "TTL 1: {one}"
    );
    let two = ping_ttl("2");
    assert!(
        two.contains("Time to live exceeded") && two.contains(&format!("From {n2}")),
        "TTL 2: {two}"
    );
    let three = ping_ttl("3");
    assert!(three.contains("1 received"), "TTL 3: {three}");
    // The reply arrives with TTL 64 − 2 (two nodes on the way back).
    assert!(three.contains("ttl=62"), "TTL 3: {three}");

    let trace = w.pods[a].ns.output(
        "busybox",
        &["traceroute", "-n", "-q", "1", "-w", "2", "-m", "5", &dst],
    );
    let text = String::from_utf8_lossy(&trace.stdout);
    let hops: Vec<&str> = text
        .lines()
        .skip_while(|l| l.starts_with("traceroute"))
        .collect();
    assert!(hops.len() >= 3, "traceroute: {text}");
    assert!(
        hops[0].contains(&n1) && hops[1].contains(&n2) && hops[2].contains(&dst),
        "traceroute: {text}"
    );
}

/// Path MTU: the pod MTU leaves room for the tunnel; a DF packet at the pod
/// MTU crosses, one that is too big is answered with fragmentation-needed
/// carrying the usable MTU (tested by raising the pod's MTU above it), and
/// TCP over such a misconfigured pod still completes (no black hole).
#[test]
fn path_mtu_works_through_the_tunnel() {
    let (w, nodes, a, b) = two_node_pods("vxlan");
    assert_eq!(w.pods[a].endpoint.mtu, 1450, "pod MTU = 1500 − 50");
    let dst = w.pods[b].ip.to_string();
    let ping = |size: &str| {
        let out = w.pods[a].ns.output(
            "ping",
            &[
                "-n", "-M", "do", "-c", "2", "-i", "0.2", "-W", "2", "-s", size, &dst,
            ],
        );
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let fits = ping("1422");
    assert!(fits.contains("2 received"), "1450-byte DF packets: {fits}");
    let local = ping("1423");
    assert!(
        local.contains("mtu=1450") || local.contains("mtu = 1450"),
        "pod MTU enforced locally: {local}"
    );

    // Pretend the pod's veth was given the uplink's MTU (both ends: the
    // kernel drops frames above the receiving end's MTU before TC).
    w.pods[a].ns.ip(&["link", "set", "eth0", "mtu", "1500"]);
    let host = w.pods[a].endpoint.host_ifname.clone();
    w.nodes[nodes[0]]
        .ns
        .ip(&["link", "set", &host, "mtu", "1500"]);
    let before = w.nodes[nodes[0]].counters();
    let big = ping("1472");
    let after = w.nodes[nodes[0]].counters();
    assert!(
        big.contains("mtu = 1450") || big.contains("mtu=1450"),
        "fragmentation-needed from the datapath: {big} {after:?}"
    );
    assert!(
        after[Counter::IcmpFragNeeded] > before[Counter::IcmpFragNeeded],
        "answered in BPF: {after:?}"
    );
    // TCP learns the path MTU and completes.
    w.pods[a].ns.ip(&["route", "flush", "cache"]);
    let moved = tcp_transfer(&w.pods[a].ns, &w.pods[b].ns, w.pods[b].ip, 7200, 2 << 20);
    assert_eq!(moved, 2 << 20);
}

/// Receive GRO on a NIC-like underlay (software GSO on the sender, NAPI GRO
/// on the receiving uplink): with the idle `rivet_vxlan` device bound to
/// the port, GRO merges the VXLAN segments before `from_uplink`, which
/// decapsulates merged trains; without it every 1500-byte segment is
/// decapsulated alone. IPIP needs no device.
#[test]
fn vxlan_receive_gro_merges_trains_on_a_nic_like_underlay() {
    let (w, nodes, a, b) = two_node_pods("vxlan");
    rivet_tests::flannel::nic_like(&w);
    let receiver = &w.nodes[nodes[1]];
    let transfer = |port: u16| {
        let before = receiver.counters();
        let srv = iperf3_server(&w.pods[b].ns, port, None);
        let res = iperf3_client(&w.pods[a].ns, w.pods[b].ip, port, 2, 1, None);
        drop(srv);
        assert!(res.bits_per_second > 1e8, "iperf3: {res:?}");
        avg_size(&before, &receiver.counters(), Counter::DecapVxlan)
    };
    let merged = transfer(5201);
    assert!(
        merged > 3000,
        "with rivet_vxlan: decapsulated packets average {merged} bytes (GRO did not merge)"
    );
    receiver.ns.ip(&["link", "del", rivet::node::VXLAN_DEV]);
    let alone = transfer(5202);
    eprintln!("decap_vxlan average packet: {merged} bytes with rivet_vxlan, {alone} without");
    assert!(
        alone <= 1500,
        "without rivet_vxlan: decapsulated packets average {alone} bytes (expected single segments)"
    );
}
