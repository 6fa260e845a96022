//! A pod reaching another node: that node's own address (ping, TCP) and its
//! hostPorts (TCP, UDP), in every cross-node mode.
//!
//! In the tunnel modes a pod's packets to another node's address travel
//! encapsulated to that node, like its packets to that node's pods: no pod
//! address appears on the underlay (a capture of both nodes' wires proves
//! it), and the node answers through the overlay too. In native mode they
//! are routed, as all pod traffic there. The node and the hostPort pod see
//! the client pod's own address; the hostPort pod's answers leave as the
//! node address and hostPort, back through the overlay.

use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    time::Duration,
};

use rivet_api::{PortMapping, Protocol};
use rivet_common::Counter;
use rivet_tests::{
    Netns, World,
    capture::{Capture, Frame},
    traffic::{assert_ping, connect, listen},
};

const HOST_TCP: u16 = 8080;
const HOST_UDP: u16 = 8053;
const POD_TCP: u16 = 80;
const POD_UDP: u16 = 53;
const NODE_TCP: u16 = 7300;

/// A TCP server in `ns` on `port` answering each connection with the
/// address it saw the client as (4 bytes); runs until the test ends.
fn tell_peer_tcp(ns: &Netns, port: u16) {
    let l = listen(ns, port);
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            if let Ok(SocketAddr::V4(peer)) = c.peer_addr() {
                let _ = c.write_all(&peer.ip().octets());
            }
        }
    });
}

/// A UDP server in `ns` on `port` answering each datagram with the
/// address it saw the sender as.
fn tell_peer_udp(ns: &Netns, port: u16) {
    let s = ns
        .exec(move || UdpSocket::bind(("0.0.0.0", port)))
        .unwrap_or_else(|e| panic!("binding udp :{port} in {}: {e}", ns.name()));
    std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        while let Ok((_, SocketAddr::V4(peer))) = s.recv_from(&mut buf) {
            let _ = s.send_to(&peer.ip().octets(), peer);
        }
    });
}

/// Who the TCP server at `dst` saw `ns` as.
fn seen_as_tcp(ns: &Netns, dst: SocketAddr) -> Ipv4Addr {
    let mut c = connect(ns, dst, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("TCP {dst} from {}: {e}", ns.name()));
    c.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut b = [0u8; 4];
    c.read_exact(&mut b)
        .unwrap_or_else(|e| panic!("reading from {dst}: {e}"));
    Ipv4Addr::from(b)
}

/// Who the UDP server at `dst` saw `ns` as; the answer must come from
/// `dst` itself (a connected socket accepts nothing else).
fn seen_as_udp(ns: &Netns, dst: SocketAddr) -> Ipv4Addr {
    let s = ns
        .exec(|| UdpSocket::bind(("0.0.0.0", 0)))
        .expect("udp socket");
    s.connect(dst).expect("connect udp");
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .expect("timeout");
    let mut b = [0u8; 4];
    for _ in 0..10 {
        s.send(b"who").expect("send");
        if let Ok(4) = s.recv(&mut b) {
            return Ipv4Addr::from(b);
        }
    }
    panic!("no UDP answer from {dst} to {}", ns.name());
}

/// Captures on the underlay's ends of both nodes' uplinks.
fn capture_underlay(w: &World, ports: &[&str]) -> Vec<Capture> {
    ports
        .iter()
        .map(|port| {
            let link = w.underlay.ip(&["-o", "link", "show", port]);
            let ifindex: u32 = link
                .split(':')
                .next()
                .and_then(|i| i.trim().parse().ok())
                .unwrap_or_else(|| panic!("no ifindex in {link:?}"));
            Capture::start(&w.underlay, ifindex)
                .unwrap_or_else(|e| panic!("capturing underlay port {port}: {e}"))
        })
        .collect()
}

fn pod_reaches_another_node(mode: &str) {
    let mut w = World::new();
    let nodes = w.add_static_cluster(2, mode);
    let (n1, n2) = (nodes[0], nodes[1]);
    let mapping = |host_port, container_port, protocol| PortMapping {
        host_port,
        container_port,
        protocol,
        host_ip: None,
    };
    let server = w.add_pod_with_ports(
        n1,
        vec![
            mapping(HOST_TCP, POD_TCP, Protocol::Tcp),
            mapping(HOST_UDP, POD_UDP, Protocol::Udp),
        ],
    );
    let client = w.add_pod(n2);
    let node1 = w.nodes[n1].ip;
    let client_ip = w.pods[client].ip;
    let cluster: ipnet::Ipv4Net = format!("10.{}.0.0/16", w.k).parse().expect("cluster CIDR");
    tell_peer_tcp(&w.nodes[n1].ns, NODE_TCP);
    tell_peer_tcp(&w.pods[server].ns, POD_TCP);
    tell_peer_udp(&w.pods[server].ns, POD_UDP);
    let captures = capture_underlay(&w, &["n1", "n2"]);
    let before: Vec<_> = [n1, n2].iter().map(|&n| w.nodes[n].counters()).collect();

    let cl = &w.pods[client].ns;
    // The other node's own address: ping, and TCP to a socket of the node.
    assert_ping(cl, node1, 3);
    assert_eq!(
        seen_as_tcp(cl, SocketAddr::from((node1, NODE_TCP))),
        client_ip,
        "{mode}: the node sees the pod's own address"
    );
    // Its hostPorts, TCP and UDP: the hostPort pod sees the client pod.
    for _ in 0..3 {
        assert_eq!(
            seen_as_tcp(cl, SocketAddr::from((node1, HOST_TCP))),
            client_ip,
            "{mode}: TCP hostPort"
        );
    }
    assert_eq!(
        seen_as_udp(cl, SocketAddr::from((node1, HOST_UDP))),
        client_ip,
        "{mode}: UDP hostPort"
    );
    // The node's own traffic to the hostPort still works beside it.
    assert_eq!(
        seen_as_tcp(&w.nodes[n2].ns, SocketAddr::from((node1, HOST_TCP))),
        w.nodes[n2].ip,
        "{mode}: the other node's own connection"
    );

    let after: Vec<_> = [n1, n2].iter().map(|&n| w.nodes[n].counters()).collect();
    let d = |i: usize, c: Counter| after[i].since(&before[i], c);
    for (i, c) in after.iter().enumerate() {
        for (counter, v) in c.iter() {
            if counter.is_drop() {
                assert_eq!(
                    v,
                    before[i].packets(counter),
                    "{mode}: node {i} dropped: {}",
                    counter.name()
                );
            }
        }
    }
    assert!(
        d(0, Counter::FwdDnat) >= 4,
        "{mode}: hostPort DNAT on node 1"
    );
    let sent = match mode {
        "vxlan" => Counter::FwdEncapVxlan,
        "ipip" => Counter::FwdEncapIpip,
        _ => Counter::FwdNative,
    };
    // The hostPort pod's answers to the remote pod leave through the
    // overlay and count under that path; its answers to the other node's
    // own connection leave on the underlay as rev_dnat.
    assert!(
        d(0, sent) >= 4,
        "{mode}: hostPort answers to the remote pod through the overlay: {sent:?}"
    );
    assert!(
        d(0, Counter::RevDnat) >= 1,
        "{mode}: hostPort answers to the other node"
    );
    assert!(
        d(1, sent) >= 10,
        "{mode}: node 2 sent the pod's packets: {sent:?}"
    );
    assert!(
        d(0, Counter::DeliverHost) >= 3,
        "{mode}: node 1 delivered the pod's packets to its stack"
    );

    // What the underlay carried.
    let (mut pod_sourced, mut tunnelled) = (0, 0);
    for c in captures {
        let got = c.stop().expect("underlay capture");
        assert_eq!(got.kernel_drops, 0, "{mode}: the capture lost frames");
        for info in got.frames.iter().filter_map(Frame::ipv4) {
            pod_sourced += usize::from(cluster.contains(&info.src));
            tunnelled += usize::from(info.proto == 4 || (info.proto == 17 && info.ports.1 == 8472));
        }
    }
    eprintln!("{mode}: underlay frames with a pod source {pod_sourced}, tunnel frames {tunnelled}");
    if mode == "native" || mode == "hybrid" {
        assert!(
            pod_sourced > 0,
            "{mode}: routed natively, the capture saw it"
        );
    } else {
        assert!(tunnelled > 10, "{mode}: the capture saw the tunnel");
        assert_eq!(
            pod_sourced, 0,
            "{mode}: a pod address crossed the underlay raw"
        );
    }
}

#[test]
fn vxlan_pod_reaches_another_nodes_address_and_hostports() {
    pod_reaches_another_node("vxlan");
}

#[test]
fn ipip_pod_reaches_another_nodes_address_and_hostports() {
    pod_reaches_another_node("ipip");
}

#[test]
fn native_pod_reaches_another_nodes_address_and_hostports() {
    pod_reaches_another_node("native");
}

#[test]
fn hybrid_pod_reaches_another_nodes_address_and_hostports() {
    pod_reaches_another_node("hybrid");
}
