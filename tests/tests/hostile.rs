//! A hostile pod (`CAP_NET_RAW` inside its namespace) sends real frames
//! with an `AF_PACKET` socket on its `eth0`: other pods' addresses, the
//! node's, 0.0.0.0 and broadcast as source, a spoofed source MAC,
//! gratuitous and poisoning ARP, IPv6 router advertisements and redirects,
//! VXLAN and IPIP aimed at nodes, floods of SYNs and fragments.
//!
//! Each case checks, against a real agent and real pods: the named drop
//! counter moved by exactly the number of frames sent and no other counter
//! moved; the victims received nothing (interface counters and a listening
//! socket); the node's and the victims' neighbour and route tables are
//! unchanged. Every test ends with other pods' new TCP connections
//! succeeding. A positive control per test proves the sender and the
//! victim checks work (a legitimate frame is received).
//!
//! `HOSTILE_REPORT=1` prints one Markdown table row per case.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket},
    time::{Duration, Instant},
};

use rivet_tests::{
    Netns, World,
    packet::{self, ETH_P_ARP, arp, eth, frame},
    raw::RawSocket,
    traffic::{connect, listen, tcp_transfer},
    world::{AsCounter, Counter, Counters},
};

/// UDP port every victim listens on.
const VICTIM_PORT: u16 = 9999;
/// Frames per case.
const N: usize = 25;
/// The pods' gateway.
const GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
/// Counters that traffic other than the hostile pod's may move: the
/// underlay's own noise (`uplink_pass`, `host_pass`) and the pods' ARP for
/// their gateway. Every other counter must stay put unless it is the one
/// a case expects.
const BACKGROUND: &[Counter] = &[
    Counter::UplinkPass,
    Counter::HostPass,
    Counter::ArpReply,
    Counter::ArpPass,
];

/// Neighbour and route tables of a namespace (IPv4 and IPv6), reduced to
/// what an attack could change: neighbour address, device and MAC (not
/// its NUD state, which ages by itself); every route of every table.
#[derive(Debug, PartialEq, Eq)]
struct Tables {
    neigh: BTreeSet<String>,
    routes: BTreeSet<String>,
}

fn ip_json(ns: &Netns, args: &[&str]) -> Vec<serde_json::Value> {
    let mut full = vec!["-j"];
    full.extend_from_slice(args);
    let text = ns.ip(&full);
    if text.trim().is_empty() {
        return Vec::new();
    }
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("ip {full:?}: {e}: {text}"))
}

fn tables(ns: &Netns) -> Tables {
    let mut neigh = BTreeSet::new();
    for family in ["-4", "-6"] {
        for e in ip_json(ns, &[family, "neigh", "show"]) {
            neigh.insert(format!(
                "{} dev {} lladdr {}",
                e["dst"].as_str().unwrap_or("?"),
                e["dev"].as_str().unwrap_or("?"),
                e["lladdr"].as_str().unwrap_or("-")
            ));
        }
    }
    let mut routes = BTreeSet::new();
    for family in ["-4", "-6"] {
        for r in ip_json(ns, &[family, "route", "show", "table", "all"]) {
            routes.insert(r.to_string());
        }
    }
    Tables { neigh, routes }
}

/// Waits (bounded) until no IPv6 address of `ns` is still in duplicate
/// address detection: a link-local address finishing DAD adds a local route
/// by itself, which must not be mistaken for an attack's effect.
fn wait_settled(ns: &Netns) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ns
        .ip(&["-6", "addr", "show", "tentative"])
        .trim()
        .is_empty()
    {
        assert!(
            Instant::now() < deadline,
            "IPv6 DAD still running in {} after 10 s",
            ns.name()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Packets received on `ifname` in `ns` (kernel interface counters).
fn rx_packets(ns: &Netns, ifname: &str) -> u64 {
    ip_json(ns, &["-s", "link", "show", ifname])
        .first()
        .and_then(|l| l["stats64"]["rx"]["packets"].as_u64())
        .unwrap_or_else(|| panic!("rx counters of {ifname} in {}", ns.name()))
}

/// Packets sent on `ifname` in `ns`.
fn tx_packets(ns: &Netns, ifname: &str) -> u64 {
    ip_json(ns, &["-s", "link", "show", ifname])
        .first()
        .and_then(|l| l["stats64"]["tx"]["packets"].as_u64())
        .unwrap_or_else(|| panic!("tx counters of {ifname} in {}", ns.name()))
}

/// A pod that must receive nothing: a UDP socket on [`VICTIM_PORT`] and its
/// `eth0` counters.
struct Victim<'a> {
    name: String,
    ns: &'a Netns,
    sock: UdpSocket,
}

impl<'a> Victim<'a> {
    fn new(w: &'a World, p: usize) -> Self {
        let ns = &w.pods[p].ns;
        let sock = ns
            .exec(|| UdpSocket::bind(("0.0.0.0", VICTIM_PORT)))
            .unwrap_or_else(|e| panic!("victim socket in {}: {e}", ns.name()));
        sock.set_nonblocking(true).expect("non-blocking");
        Self {
            name: w.pods[p].name.clone(),
            ns,
            sock,
        }
    }

    /// Datagrams waiting on the socket (consumed).
    fn drain(&self) -> usize {
        let mut buf = [0u8; 2048];
        let mut n = 0;
        while self.sock.recv_from(&mut buf).is_ok() {
            n += 1;
        }
        n
    }
}

/// One row of the report.
struct Row {
    case: String,
    frames: u64,
    counter: Counter,
    delta: u64,
    tables_unchanged: bool,
}

/// Everything a case looks at.
struct Scene<'a> {
    w: &'a World,
    /// The node the hostile pod lives on.
    home: usize,
    sock: RawSocket,
    victims: Vec<Victim<'a>>,
    /// The hostile pod's MAC and its gateway's (host veth) MAC.
    own_mac: [u8; 6],
    gw_mac: [u8; 6],
    own_ip: Ipv4Addr,
    rows: Vec<Row>,
}

fn mac_of(text: &str) -> [u8; 6] {
    rivet::netlink::parse_mac(text.trim()).unwrap_or_else(|| panic!("bad MAC {text}"))
}

impl<'a> Scene<'a> {
    fn new(w: &'a World, hostile: usize, victims: &[usize]) -> Self {
        let pod = &w.pods[hostile];
        let sock = RawSocket::open(&pod.ns, "eth0").expect("AF_PACKET socket in the pod");
        for node in &w.nodes {
            wait_settled(&node.ns);
        }
        for &v in victims {
            wait_settled(&w.pods[v].ns);
        }
        Self {
            w,
            home: pod.node,
            sock,
            victims: victims.iter().map(|&v| Victim::new(w, v)).collect(),
            own_mac: mac_of(&pod.endpoint.mac),
            gw_mac: mac_of(&pod.endpoint.host_mac),
            own_ip: pod.ip,
            rows: Vec::new(),
        }
    }

    fn counters(&self) -> Vec<Counters> {
        self.w.nodes.iter().map(|n| n.counters()).collect()
    }

    fn all_tables(&self) -> Vec<(String, Tables)> {
        let mut v: Vec<(String, Tables)> = self
            .w
            .nodes
            .iter()
            .map(|n| (n.name.clone(), tables(&n.ns)))
            .collect();
        v.extend(self.victims.iter().map(|x| (x.name.clone(), tables(x.ns))));
        v
    }

    /// Sends `frames` and checks the case: `counter` on the home node moved
    /// by exactly the number sent, no other counter of any node moved (but
    /// [`BACKGROUND`]), no victim received anything, no table changed.
    fn attack(&mut self, case: &str, counter: impl AsCounter, frames: &[Vec<u8>]) {
        let counter = counter.as_counter();
        // Nothing left over from a previous case.
        for v in &self.victims {
            v.drain();
        }
        let before = self.counters();
        let tables_before = self.all_tables();
        let rx_before: Vec<u64> = self
            .victims
            .iter()
            .map(|v| rx_packets(v.ns, "eth0"))
            .collect();
        let hostile_ns = &self
            .w
            .pods
            .iter()
            .find(|p| p.ip == self.own_ip)
            .expect("hostile")
            .ns;
        let tx_before = tx_packets(hostile_ns, "eth0");

        let sent = self
            .sock
            .send_all(frames.iter().map(Vec::as_slice))
            .unwrap_or_else(|e| panic!("{case}: sending: {e}"));
        assert_eq!(sent, frames.len() as u64);
        assert_eq!(
            tx_packets(hostile_ns, "eth0") - tx_before,
            sent,
            "{case}: the pod's eth0 did not send every frame"
        );

        // The verdicts are counted as the host veth's backlog is processed:
        // wait (bounded) for the expected counter, then a little more for
        // anything that would wrongly have gone elsewhere.
        let home = self.home;
        let deadline = Instant::now() + Duration::from_secs(5);
        let after = loop {
            let now = self.counters();
            let moved = moved(&before[home], &now[home], counter);
            if moved >= sent || Instant::now() >= deadline {
                break now;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let delta = moved(&before[home], &after[home], counter);
        assert_eq!(
            delta,
            sent,
            "{case}: {} moved by {delta} for {sent} frames; home node: {:?}",
            counter.name(),
            after[home].changes(&before[home])
        );
        for (i, (b, a)) in before.iter().zip(&after).enumerate() {
            let other: BTreeMap<&str, i128> = a
                .changes(b)
                .into_iter()
                .filter(|(k, _)| !BACKGROUND.iter().any(|c| c.name() == *k))
                .filter(|(k, _)| !(i == home && *k == counter.name()))
                .collect();
            assert!(
                other.is_empty(),
                "{case}: other counters moved on {}: {other:?}",
                self.w.nodes[i].name
            );
        }
        for (v, rx0) in self.victims.iter().zip(rx_before) {
            assert_eq!(
                rx_packets(v.ns, "eth0"),
                rx0,
                "{case}: victim {} received packets",
                v.name
            );
            assert_eq!(v.drain(), 0, "{case}: victim {} got datagrams", v.name);
        }
        let tables_after = self.all_tables();
        let unchanged = tables_before == tables_after;
        for ((name, b), (_, a)) in tables_before.iter().zip(&tables_after) {
            assert_eq!(b, a, "{case}: tables of {name} changed");
        }
        self.rows.push(Row {
            case: case.to_owned(),
            frames: sent,
            counter,
            delta,
            tables_unchanged: unchanged,
        });
    }

    /// The positive control: a legitimate datagram (own address and MAC)
    /// to victim `v` arrives — so the sender works and the victim checks
    /// can fail.
    fn control(&self, v: usize, victim_ip: Ipv4Addr) {
        let f = packet::ipv4_frame(
            (self.gw_mac, self.own_mac),
            (self.own_ip, victim_ip),
            packet::IPPROTO_UDP,
            packet::udp_checksummed(self.own_ip, victim_ip, 40000, VICTIM_PORT, b"legit"),
        );
        self.sock.send(&f).expect("sending the control frame");
        let victim = &self.victims[v];
        let deadline = Instant::now() + Duration::from_secs(5);
        while victim.drain() == 0 {
            assert!(
                Instant::now() < deadline,
                "control: {} never received the legitimate datagram from {}",
                victim.name,
                self.own_ip
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn report(&self) {
        if std::env::var_os("HOSTILE_REPORT").is_none() {
            return;
        }
        for r in &self.rows {
            eprintln!(
                "| {} | {} | `{}` | {} | {} |",
                r.case,
                r.frames,
                r.counter.name(),
                r.delta,
                if r.tables_unchanged {
                    "unchanged"
                } else {
                    "CHANGED"
                }
            );
        }
    }
}

/// Packets `counter` counted between two readings.
fn moved(before: &Counters, after: &Counters, counter: impl AsCounter) -> u64 {
    after.since(before, counter.as_counter())
}

/// `count` copies of a frame.
fn times(count: usize, f: &[u8]) -> Vec<Vec<u8>> {
    vec![f.to_vec(); count]
}

/// New TCP connections (with data) between every ordered pair of `pods`.
fn assert_pods_connect(w: &World, pods: &[usize], port: &mut u16) {
    for &a in pods {
        for &b in pods {
            if a == b {
                continue;
            }
            *port += 1;
            let moved = tcp_transfer(&w.pods[a].ns, &w.pods[b].ns, w.pods[b].ip, *port, 64 << 10);
            assert_eq!(moved, 64 << 10);
        }
    }
}

/// A UDP datagram from `src` to a victim, framed with `src_mac`.
fn udp_to(scene: &Scene, src_mac: [u8; 6], src: Ipv4Addr, dst: Ipv4Addr) -> Vec<u8> {
    packet::ipv4_frame(
        (scene.gw_mac, src_mac),
        (src, dst),
        packet::IPPROTO_UDP,
        packet::udp_checksummed(src, dst, 40001, VICTIM_PORT, b"spoofed"),
    )
}

/// Spoofed IPv4 sources and a spoofed source MAC: each dropped by
/// anti-spoof under its reason before anything looks at the destination.
#[test]
fn spoofed_sources_are_dropped() {
    let mut w = World::new();
    let n = w.add_node_with_agent();
    let hostile = w.add_pod(n);
    let v1 = w.add_pod(n);
    let v2 = w.add_pod(n);
    let (ip1, ip2, node_ip) = (w.pods[v1].ip, w.pods[v2].ip, w.nodes[n].ip);
    let v1_mac = mac_of(&w.pods[v1].endpoint.mac);
    let mut s = Scene::new(&w, hostile, &[v1, v2]);
    s.control(0, ip1);
    s.control(1, ip2);
    let (own_mac, own_ip) = (s.own_mac, s.own_ip);

    let f = udp_to(&s, own_mac, ip1, ip2);
    s.attack(
        "source = another pod's IP",
        Counter::DropSpoofedIp,
        &times(N, &f),
    );
    let f = udp_to(&s, own_mac, node_ip, ip1);
    s.attack(
        "source = the node's IP",
        Counter::DropSpoofedIp,
        &times(N, &f),
    );
    let f = udp_to(&s, own_mac, GATEWAY, ip1);
    s.attack(
        "source = the gateway 169.254.1.1",
        Counter::DropSpoofedIp,
        &times(N, &f),
    );
    let f = udp_to(&s, own_mac, Ipv4Addr::UNSPECIFIED, ip1);
    s.attack("source = 0.0.0.0", Counter::DropSpoofedIp, &times(N, &f));
    let f = udp_to(&s, own_mac, Ipv4Addr::BROADCAST, ip1);
    s.attack(
        "source = 255.255.255.255",
        Counter::DropSpoofedIp,
        &times(N, &f),
    );
    let f = udp_to(&s, own_mac, Ipv4Addr::BROADCAST, Ipv4Addr::BROADCAST);
    s.attack(
        "source and destination = 255.255.255.255",
        Counter::DropSpoofedIp,
        &times(N, &f),
    );
    let f = udp_to(&s, v1_mac, own_ip, ip2);
    s.attack(
        "own IP, another pod's MAC",
        Counter::DropSpoofedMac,
        &times(N, &f),
    );
    let f = udp_to(&s, [0x02, 0xba, 0xd0, 0, 0, 1], own_ip, ip2);
    s.attack(
        "own IP, made-up MAC",
        Counter::DropSpoofedMac,
        &times(N, &f),
    );
    let f = udp_to(&s, v1_mac, ip1, ip2);
    s.attack(
        "another pod's IP and MAC",
        Counter::DropSpoofedIp,
        &times(N, &f),
    );
    s.report();

    // The hostile pod's own, honest traffic still works, and so do the others'.
    let mut port = 7000;
    assert_pods_connect(&w, &[hostile, v1, v2], &mut port);
}

/// ARP: gratuitous ARP for the gateway and for another pod, replies that
/// would poison a neighbour table, a sender MAC that is not the pod's.
#[test]
fn arp_attacks_are_dropped() {
    let mut w = World::new();
    let n = w.add_node_with_agent();
    let hostile = w.add_pod(n);
    let v1 = w.add_pod(n);
    let v2 = w.add_pod(n);
    let (ip1, node_ip) = (w.pods[v1].ip, w.nodes[n].ip);
    let v1_mac = mac_of(&w.pods[v1].endpoint.mac);
    let mut s = Scene::new(&w, hostile, &[v1, v2]);
    s.control(0, ip1);
    let (own, gw_mac, own_ip) = (s.own_mac, s.gw_mac, s.own_ip);
    let bcast = packet::BROADCAST;
    let arp_frame =
        |dst: [u8; 6], src: [u8; 6], body: Vec<u8>| frame(&[&eth(dst, src, ETH_P_ARP), &body]);
    let z = [0u8; 6];

    // The honest cases first: a request for the gateway is answered, an
    // ARP reply with the pod's own binding passes (and changes nothing:
    // the node's entry for the pod is permanent).
    let f = arp_frame(bcast, own, arp(1, own, own_ip, z, GATEWAY));
    s.attack(
        "control: request for the gateway",
        Counter::ArpReply,
        &times(1, &f),
    );
    let f = arp_frame(gw_mac, own, arp(2, own, own_ip, gw_mac, GATEWAY));
    s.attack(
        "control: reply with its own binding",
        Counter::ArpPass,
        &times(1, &f),
    );

    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "gratuitous ARP request claiming the gateway",
            arp_frame(bcast, own, arp(1, own, GATEWAY, z, GATEWAY)),
        ),
        (
            "gratuitous ARP reply claiming the gateway",
            arp_frame(bcast, own, arp(2, own, GATEWAY, bcast, GATEWAY)),
        ),
        (
            "gratuitous ARP request claiming another pod",
            arp_frame(bcast, own, arp(1, own, ip1, z, ip1)),
        ),
        (
            "gratuitous ARP reply claiming another pod",
            arp_frame(bcast, own, arp(2, own, ip1, bcast, ip1)),
        ),
        (
            "gratuitous ARP for its own address",
            arp_frame(bcast, own, arp(1, own, own_ip, z, own_ip)),
        ),
        (
            "reply poisoning: another pod is at my MAC (to the node)",
            arp_frame(gw_mac, own, arp(2, own, ip1, gw_mac, node_ip)),
        ),
        (
            "reply poisoning: the node is at my MAC",
            arp_frame(gw_mac, own, arp(2, own, node_ip, gw_mac, GATEWAY)),
        ),
        (
            "reply poisoning: the gateway is at my MAC (to another pod)",
            arp_frame(v1_mac, own, arp(2, own, GATEWAY, v1_mac, ip1)),
        ),
        (
            "reply binding my address to another pod's MAC",
            arp_frame(gw_mac, own, arp(2, v1_mac, own_ip, gw_mac, GATEWAY)),
        ),
        (
            "reply with another pod's MAC as Ethernet source",
            arp_frame(gw_mac, v1_mac, arp(2, own, own_ip, gw_mac, GATEWAY)),
        ),
        (
            "request from 0.0.0.0 (ARP probe)",
            arp_frame(bcast, own, arp(1, own, Ipv4Addr::UNSPECIFIED, z, ip1)),
        ),
    ];
    for (case, f) in &cases {
        s.attack(case, Counter::DropArpSpoofed, &times(N, f));
    }
    // A request for anything but the gateway is not answered (and not
    // passed: the host veth has no address to answer for).
    let f = arp_frame(bcast, own, arp(1, own, own_ip, z, ip1));
    s.attack(
        "request for another pod's address",
        Counter::DropArpUnsupported,
        &times(N, &f),
    );
    s.report();

    let mut port = 7000;
    assert_pods_connect(&w, &[hostile, v1, v2], &mut port);
}

/// IPv6 router advertisements and redirects (rivet is IPv4-only; IPv6 is off
/// on both veth ends): dropped before anything parses them.
#[test]
fn ipv6_router_advertisements_and_redirects_are_dropped() {
    let mut w = World::new();
    let n = w.add_node_with_agent();
    let hostile = w.add_pod(n);
    let v1 = w.add_pod(n);
    let v2 = w.add_pod(n);
    let v1_mac = mac_of(&w.pods[v1].endpoint.mac);
    let mut s = Scene::new(&w, hostile, &[v1, v2]);
    let (own, gw_mac) = (s.own_mac, s.gw_mac);
    let ll = packet::link_local(own);
    let all_nodes: Ipv6Addr = "ff02::1".parse().expect("address");
    let ra = packet::icmpv6_frame(
        (packet::ALL_NODES_MAC, own),
        (ll, all_nodes),
        packet::router_advertisement(own),
    );
    s.attack(
        "IPv6 router advertisement to ff02::1",
        Counter::DropUnsupportedL3,
        &times(N, &ra),
    );
    let ra = packet::icmpv6_frame(
        (packet::ALL_NODES_MAC, gw_mac),
        (packet::link_local(gw_mac), all_nodes),
        packet::router_advertisement(gw_mac),
    );
    s.attack(
        "IPv6 RA as the gateway (its MAC and link-local)",
        Counter::DropUnsupportedL3,
        &times(N, &ra),
    );
    let redirect = packet::icmpv6_frame(
        (gw_mac, own),
        (ll, packet::link_local(gw_mac)),
        packet::redirect(ll, "2001:db8::1".parse().expect("address"), own),
    );
    s.attack(
        "ICMPv6 redirect to the node",
        Counter::DropUnsupportedL3,
        &times(N, &redirect),
    );
    let redirect = packet::icmpv6_frame(
        (v1_mac, own),
        (ll, packet::link_local(v1_mac)),
        packet::redirect(ll, "2001:db8::1".parse().expect("address"), own),
    );
    s.attack(
        "ICMPv6 redirect to another pod",
        Counter::DropUnsupportedL3,
        &times(N, &redirect),
    );
    s.report();

    let mut port = 7000;
    assert_pods_connect(&w, &[hostile, v1, v2], &mut port);
}

/// VXLAN (UDP 8472) and IPIP from a pod to its own node and to a peer node,
/// each carrying a packet for a pod that decapsulation would deliver: all
/// dropped at the pod's veth; the peer node's program never sees them.
#[test]
fn tunnels_aimed_at_nodes_are_dropped() {
    let mut w = World::new();
    let nodes = w.add_static_cluster(2, "vxlan");
    let hostile = w.add_pod(nodes[0]);
    let v1 = w.add_pod(nodes[0]);
    let v2 = w.add_pod(nodes[1]);
    let (ip1, ip2) = (w.pods[v1].ip, w.pods[v2].ip);
    let (node1, node2) = (w.nodes[nodes[0]].ip, w.nodes[nodes[1]].ip);
    let mut s = Scene::new(&w, hostile, &[v1, v2]);
    s.control(0, ip1);
    s.control(1, ip2);
    let (own, gw_mac, own_ip) = (s.own_mac, s.gw_mac, s.own_ip);
    // The inner packets claim to come from a pod on the other node.
    let fake = |node: Ipv4Addr| -> Ipv4Addr {
        if node == node1 {
            Ipv4Addr::new(10, w.k, 2, 200)
        } else {
            Ipv4Addr::new(10, w.k, 1, 200)
        }
    };
    let vtep = |ip: Ipv4Addr| -> [u8; 6] {
        let o = ip.octets();
        [0x0e, 0x72, o[0], o[1], o[2], o[3]]
    };
    for (target, victim_ip, what) in [(node1, ip1, "its own node"), (node2, ip2, "a peer node")] {
        let inner_ip = packet::ipv4_frame(
            (mac_of(&w.pods[v1].endpoint.mac), vtep(target)),
            (fake(target), victim_ip),
            packet::IPPROTO_UDP,
            packet::udp_checksummed(fake(target), victim_ip, 40002, VICTIM_PORT, b"injected"),
        );
        let vxlan = packet::ipv4_frame(
            (gw_mac, own),
            (own_ip, target),
            packet::IPPROTO_UDP,
            packet::udp_checksummed(own_ip, target, 40003, 8472, &packet::vxlan(1, &inner_ip)),
        );
        s.attack(
            &format!("VXLAN (UDP 8472, VNI 1) to {what}"),
            Counter::DropTunnelFromPod,
            &times(N, &vxlan),
        );
        let ipip = packet::ipv4_frame(
            (gw_mac, own),
            (own_ip, target),
            packet::IPPROTO_IPIP,
            inner_ip[14..].to_vec(),
        );
        s.attack(
            &format!("IPIP (protocol 4) to {what}"),
            Counter::DropTunnelFromPod,
            &times(N, &ipip),
        );
    }
    s.report();

    let mut port = 7000;
    assert_pods_connect(&w, &[hostile, v1, v2], &mut port);
    // The other direction of the tunnel still works for real traffic.
    let listener = listen(&w.pods[v1].ns, 7100);
    let accept = std::thread::spawn(move || listener.accept().map(|(_, peer)| peer));
    connect(
        &w.pods[v2].ns,
        SocketAddr::from((ip1, 7100)),
        Duration::from_secs(5),
    )
    .expect("cross-node connection after the attack");
    let peer = accept.join().expect("accept thread").expect("accept");
    assert_eq!(peer.ip(), std::net::IpAddr::V4(ip2));
}

/// Replies to 3 pings of 3000 bytes (fragmented at the pod's MTU).
fn fragmented_ping(ns: &Netns, dst: Ipv4Addr) -> u32 {
    let text = ns.output(
        "ping",
        &[
            "-n",
            "-c",
            "3",
            "-i",
            "0.2",
            "-W",
            "1",
            "-s",
            "3000",
            &dst.to_string(),
        ],
    );
    rivet_tests::traffic::parse_ping(&String::from_utf8_lossy(&text.stdout)).received
}

/// Frames per flood.
const FLOOD: u16 = 20_000;

/// A TCP server in `ns` on `port` that answers every connection with "ok"
/// and closes it, until dropped.
struct OkServer {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl OkServer {
    fn start(ns: &Netns, port: u16) -> Self {
        use std::io::Write as _;
        let listener = listen(ns, port);
        listener.set_nonblocking(true).expect("non-blocking");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut served = 0;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut c, _)) => {
                        let _ = c.set_nonblocking(false);
                        let _ = c.write_all(b"ok");
                        served += 1;
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
            served
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for OkServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A new TCP connection from `client` to an [`OkServer`] at `dst`: the
/// handshake (10 s bound, SYN retransmits allowed) and the answer.
fn fresh_connection(client: &Netns, dst: SocketAddr) -> Result<Duration, String> {
    use std::io::Read as _;
    let start = Instant::now();
    let mut s = connect(client, dst, Duration::from_secs(10))
        .map_err(|e| format!("connect {dst} from {}: {e}", client.name()))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)
        .map_err(|e| format!("reading from {dst}: {e}"))?;
    if answer != b"ok" {
        return Err(format!("{dst} answered {answer:?}"));
    }
    Ok(start.elapsed())
}

/// A counter from `/proc/net/<file>` (`netstat` or `snmp`) of `ns`, e.g.
/// ("TcpExt", "SyncookiesSent"). A counter the kernel does not list, or
/// one that does not parse, panics (it never reads as 0).
fn proc_net(ns: &Netns, file: &str, group: &str, name: &str) -> u64 {
    let text = ns.run("cat", &[&format!("/proc/net/{file}")]);
    let prefix = format!("{group}:");
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with(&prefix)).collect();
    for pair in lines.chunks(2) {
        if let [names, values] = pair {
            let idx = names.split_whitespace().position(|n| n == name);
            if let Some(v) = idx.and_then(|i| values.split_whitespace().nth(i)) {
                return v
                    .parse()
                    .unwrap_or_else(|e| panic!("{group} {name} in /proc/net/{file}: {v:?}: {e}"));
            }
        }
    }
    panic!("no {group} {name} in /proc/net/{file} of {}", ns.name())
}

fn nat_status(w: &World, n: usize) -> rivet_api::NatStatus {
    match w.nodes[n]
        .agent()
        .client()
        .call(&rivet_api::Request::Status {})
    {
        Ok(rivet_api::Response::Status(s)) => s.nat,
        other => panic!("status: {other:?}"),
    }
}

/// The NAT status after a collection that started after this call.
fn nat_status_fresh(w: &World, n: usize) -> rivet_api::NatStatus {
    let first = nat_status(w, n).collections;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = nat_status(w, n);
        if st.collections > first + 1 {
            return st;
        }
        assert!(Instant::now() < deadline, "no NAT collection: {st:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits (bounded) until `name` on node `n` moved by at least `want` since
/// `before`; returns the counters then.
fn wait_counter(
    w: &World,
    n: usize,
    before: &Counters,
    counter: impl AsCounter,
    want: u64,
) -> Counters {
    let counter = counter.as_counter();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = w.nodes[n].counters();
        if moved(before, &now, counter) >= want || Instant::now() >= deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SYN floods (to another pod; to the outside through SNAT, answered and
/// unanswered) and fragment floods (to the outside, the node, another pod)
/// from one pod: the other pods' new connections succeed during and after
/// each — also to the very destination whose NAT ports the unanswered
/// flood took (another pod's new flow takes over a port whose flow was
/// never answered and is idle 5 s) — and the node's neighbour and route
/// tables do not change. The NAT table fill is reported.
#[test]
fn syn_and_fragment_floods_leave_other_pods_working() {
    let mut w = World::new();
    let n = w.add_node();
    w.nodes[n].agent_args.extra_args = vec!["--nat-gc-interval".into(), "1".into()];
    w.start_agent(n);
    let hostile = w.add_pod(n);
    let v1 = w.add_pod(n);
    let v2 = w.add_pod(n);
    w.add_outside();
    let outside_ip = Ipv4Addr::new(192, 168, w.k, 254);
    let (ip1, node_ip) = (w.pods[v1].ip, w.nodes[n].ip);
    let outside = w.outside.as_ref().expect("outside");
    let s = Scene::new(&w, hostile, &[v1, v2]);
    let (own, gw_mac, own_ip) = (s.own_mac, s.gw_mac, s.own_ip);
    let report = std::env::var_os("HOSTILE_REPORT").is_some();

    // Port 7700 of the outside host drops the hostile pod's bare SYNs (no
    // options, 40 bytes: a kernel's SYN carries options) silently — a
    // blackhole for the flood: its NAT flows are never answered, so they
    // hold their ports; the other pods' connections there are answered.
    outside.run("nft", &["add", "table", "inet", "hostile"]);
    outside.run(
        "nft",
        &[
            "add",
            "chain",
            "inet",
            "hostile",
            "in",
            "{ type filter hook input priority 0; }",
        ],
    );
    outside.run(
        "nft",
        &[
            "add", "rule", "inet", "hostile", "in", "tcp", "dport", "7700", "tcp", "flags", "==",
            "syn", "ip", "length", "40", "counter", "drop",
        ],
    );
    let servers = [
        OkServer::start(&w.pods[v1].ns, 7500),
        OkServer::start(&w.pods[v2].ns, 7501),
        OkServer::start(outside, 7600),
        OkServer::start(outside, 7601),
        OkServer::start(outside, 7700),
    ];
    let victims_ok = |what: &str| {
        let mut times = Vec::new();
        for (client, dst) in [
            (v2, SocketAddr::from((ip1, 7500))),
            (v1, SocketAddr::from((w.pods[v2].ip, 7501))),
            (v1, SocketAddr::from((outside_ip, 7600))),
            (v2, SocketAddr::from((outside_ip, 7601))),
        ] {
            match fresh_connection(&w.pods[client].ns, dst) {
                Ok(t) => times.push(format!("{dst} {:.0} ms", t.as_secs_f64() * 1e3)),
                Err(e) => panic!("{what}: a victim's new connection failed: {e}"),
            }
        }
        if report {
            eprintln!("{what}: victims' new connections: {}", times.join(", "));
        }
    };
    // Warm-up: the node learns the outside host's MAC through legitimate
    // traffic; from here on its tables must not change.
    victims_ok("before the floods");
    // The baseline for the reassembly finding below: an honest fragmented
    // ping to the node works.
    assert_eq!(
        fragmented_ping(&w.pods[v2].ns, node_ip),
        3,
        "fragmented ping to the node before the floods"
    );
    let node_tables = tables(&w.nodes[n].ns);
    let victim_tables: Vec<Tables> = [v1, v2].iter().map(|&v| tables(&w.pods[v].ns)).collect();

    let syns = |dst: Ipv4Addr, dport: u16| -> Vec<Vec<u8>> {
        (0..FLOOD)
            .map(|i| {
                let sport = 1024 + i;
                packet::ipv4_frame(
                    (gw_mac, own),
                    (own_ip, dst),
                    packet::IPPROTO_TCP,
                    packet::tcp_syn(own_ip, dst, sport, dport, u32::from(i) * 7919),
                )
            })
            .collect()
    };
    let frags = |dst: Ipv4Addr| -> Vec<Vec<u8>> {
        (0..FLOOD)
            .map(|i| {
                packet::ipv4_fragment(
                    (gw_mac, own),
                    (own_ip, dst),
                    (i, 0, true),
                    packet::IPPROTO_UDP,
                    &[0x5a; 512],
                )
            })
            .collect()
    };
    let mut rows = Vec::new();
    // One flood, with the victims connecting while it runs and after it.
    let flood = |what: &str, frames: Vec<Vec<u8>>, counters: &[Counter]| {
        let before = w.nodes[n].counters();
        std::thread::scope(|scope| {
            let sender = scope.spawn(|| s.sock.send_all(frames.iter().map(Vec::as_slice)));
            victims_ok(&format!("during {what}"));
            let sent = sender.join().expect("flood thread").expect("flood sent");
            assert_eq!(sent, u64::from(FLOOD));
        });
        let after = wait_counter(&w, n, &before, counters[0], 1);
        victims_ok(&format!("after {what}"));
        let deltas: Vec<String> = counters
            .iter()
            .map(|&c| format!("{} +{}", c.name(), moved(&before, &after, c)))
            .collect();
        let nat = nat_status_fresh(&w, n);
        let row = format!(
            "| {what} | {FLOOD} | {} | NAT entries {} / {}, evicted {} |",
            deltas.join(", "),
            nat.entries,
            nat.max_entries,
            nat.evicted
        );
        assert_eq!(tables(&w.nodes[n].ns), node_tables, "{what}: node tables");
        for (i, &v) in [v1, v2].iter().enumerate() {
            assert_eq!(
                tables(&w.pods[v].ns),
                victim_tables[i],
                "{what}: tables of a victim"
            );
        }
        (before, after, nat, row)
    };

    // 1. SYNs to another pod: delivered (that is the pod's business: its
    // kernel answers with SYN cookies), nothing on the node fills up.
    let cookies0 = proc_net(&w.pods[v1].ns, "netstat", "TcpExt", "SyncookiesSent");
    let (b, a, _, row) = flood(
        "SYN flood to another pod",
        syns(ip1, 7500),
        &[Counter::FwdLocal, Counter::DropNatNoPort],
    );
    rows.push(row);
    assert!(moved(&b, &a, Counter::FwdLocal) >= u64::from(FLOOD));
    let cookies = proc_net(&w.pods[v1].ns, "netstat", "TcpExt", "SyncookiesSent") - cookies0;
    if report {
        eprintln!("SYN flood to a pod: the victim sent {cookies} SYN cookies");
    }

    // 2. SYNs to an outside server through SNAT: the server answers, the
    // hostile pod's kernel resets each flow, so the ports come back.
    let (b, a, _, row) = flood(
        "SYN flood to outside:7600 via SNAT (answered)",
        syns(outside_ip, 7600),
        &[Counter::FwdSnat, Counter::DropNatNoPort, Counter::RevSnat],
    );
    rows.push(row);
    let snat = moved(&b, &a, Counter::FwdSnat) + moved(&b, &a, Counter::DropNatNoPort);
    assert!(snat >= u64::from(FLOOD), "every SYN counted: {snat}");

    // 3. SYNs to a blackhole: the ports toward (outside, 7700) are taken,
    // the rest of the flood is dropped with a reason — and another pod
    // connecting to that very destination while the flood runs succeeds
    // (its SYN retransmission takes over a stale unanswered port).
    let start = w.nodes[n].counters();
    let ((b, a, nat, row), during) = std::thread::scope(|scope| {
        let during = scope.spawn(|| {
            // Once the flood has taken the range (its SYNs are refused).
            wait_counter(&w, n, &start, Counter::DropNatNoPort, 1);
            fresh_connection(&w.pods[v2].ns, SocketAddr::from((outside_ip, 7700)))
        });
        let r = flood(
            "SYN flood to outside:7700 via SNAT (blackholed)",
            syns(outside_ip, 7700),
            &[Counter::FwdSnat, Counter::DropNatNoPort],
        );
        (r, during.join().expect("victim thread"))
    });
    rows.push(row);
    let during =
        during.unwrap_or_else(|e| panic!("during the blackholed flood, to outside:7700: {e}"));
    let (out, refused) = (
        moved(&b, &a, Counter::FwdSnat),
        moved(&b, &a, Counter::DropNatNoPort),
    );
    assert!(
        out + refused >= u64::from(FLOOD),
        "each SYN either left or was dropped: {out} + {refused}"
    );
    // The hostile pod's flows toward (outside, 7700), from the NAT table.
    let held = match w.nodes[n]
        .agent()
        .client()
        .call(&rivet_api::Request::NatList {
            ip: Some(own_ip),
            port: None,
            limit: Some(1 << 20),
        }) {
        Ok(rivet_api::Response::Nat { entries, .. }) => entries
            .iter()
            .filter(|e| e.dir == "egress" && e.dst == format!("{outside_ip}:7700"))
            .count() as u64,
        other => panic!("nat list: {other:?}"),
    };
    let range = u64::from(nat.port_max - nat.port_min) + 1;
    assert!(held <= range, "{held} flows in a range of {range} ports");
    // Right after the flood every port toward (outside, 7700) is the
    // hostile pod's, unanswered: a new connection of another pod to the
    // very same destination still succeeds (before: refused for the 60 s
    // unanswered-TCP timeout, drop_nat_no_port).
    let before = w.nodes[n].counters();
    let other = fresh_connection(&w.pods[v1].ns, SocketAddr::from((outside_ip, 7700)))
        .unwrap_or_else(|e| panic!("after the blackholed flood, to outside:7700: {e}"));
    let after = w.nodes[n].counters();
    rows.push(format!(
        "| during / after: victims connect to outside:7700 | - | connected in {:.1} s / {:.1} s ; drop_nat_no_port +{} (the victim's first SYNs) | ports of (outside, 7700) held by the hostile pod: {held} of {range} |",
        during.as_secs_f64(),
        other.as_secs_f64(),
        moved(&before, &after, Counter::DropNatNoPort)
    ));

    // 4. Fragments: never masqueraded (dropped with a reason), to the node
    // only within the pod's fragment budget, to a pod they are the pod's.
    let reasm0 = proc_net(&w.nodes[n].ns, "snmp", "Ip", "ReasmFails");
    let (b, a, _, row) = flood(
        "fragment flood to the outside",
        frags(outside_ip),
        &[Counter::DropNatUnsupported],
    );
    rows.push(row);
    assert_eq!(moved(&b, &a, Counter::DropNatUnsupported), u64::from(FLOOD));
    // To the node: past the hostile pod's budget (256 KiB, then 32 KiB/s;
    // 1,570 bytes per 546-byte frame) the flood is dropped, so the node's
    // reassembly memory (4 MiB, shared by every pod) keeps room for the
    // others: a victim's fragmented ping to the node is answered while the
    // flood runs (sent again and again until the ping is done) and after.
    // Before the budget: +17,166 ReasmFails, and the victim's ping failed
    // for the 30 s the queued fragments lived.
    let node_frags = frags(node_ip);
    let before = w.nodes[n].counters();
    let reasm_node0 = proc_net(&w.nodes[n].ns, "snmp", "Ip", "ReasmFails");
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (sent, during) = std::thread::scope(|scope| {
        let sender = scope.spawn(|| {
            let mut sent = 0;
            while sent == 0 || !stop.load(std::sync::atomic::Ordering::Relaxed) {
                sent += s.sock.send_all(node_frags.iter().map(Vec::as_slice))?;
            }
            Ok::<u64, std::io::Error>(sent)
        });
        wait_counter(&w, n, &before, Counter::DropFragBudget, 1);
        let during = fragmented_ping(&w.pods[v2].ns, node_ip);
        victims_ok("during fragment flood to the node");
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let sent = sender.join().expect("flood thread").expect("flood sent");
        (sent, during)
    });
    let after = wait_counter(&w, n, &before, Counter::DropFragBudget, sent - 1_000);
    let after_ping = fragmented_ping(&w.pods[v2].ns, node_ip);
    victims_ok("after fragment flood to the node");
    let (dropped, passed) = (
        moved(&before, &after, Counter::DropFragBudget),
        moved(&before, &after, Counter::PassHost),
    );
    let reasm_node = proc_net(&w.nodes[n].ns, "snmp", "Ip", "ReasmFails") - reasm_node0;
    rows.push(format!(
        "| fragment flood to the node | {sent} | drop_frag_budget +{dropped}, pass_host +{passed} (the victim's pings included) | node ReasmFails +{reasm_node}; victim's fragmented ping (3000 B) to the node: {during} of 3 answered during, {after_ping} of 3 after |"
    ));
    assert_eq!(
        tables(&w.nodes[n].ns),
        node_tables,
        "fragments to the node: node tables"
    );
    assert!(
        dropped + 1_000 >= sent && passed < 1_000,
        "the budget let through {passed} of {sent} fragments (dropped {dropped})"
    );
    assert!(
        reasm_node <= passed,
        "ReasmFails +{reasm_node}: only fragments that passed can fail"
    );
    assert_eq!(
        during, 3,
        "victim's fragmented ping to the node during the flood"
    );
    assert_eq!(
        after_ping, 3,
        "victim's fragmented ping to the node after the flood"
    );
    let (b, a, _, row) = flood(
        "fragment flood to another pod",
        frags(ip1),
        &[Counter::FwdLocal],
    );
    rows.push(row);
    assert!(moved(&b, &a, Counter::FwdLocal) >= u64::from(FLOOD));
    let reasm = proc_net(&w.nodes[n].ns, "snmp", "Ip", "ReasmFails") - reasm0;
    // The node's reassembly memory after every fragment flood: an honest
    // pod's fragmented datagrams to the node still reassemble.
    let big = fragmented_ping(&w.pods[v2].ns, node_ip);
    rows.push(format!(
        "| afterwards: victim's fragmented ping (3000 B) to the node | - | {big} of 3 answered | node ReasmFails +{reasm} |"
    ));
    assert_eq!(
        big, 3,
        "fragmented ping to the node after the fragment floods"
    );
    drop(servers);
    if report {
        eprintln!("node ReasmFails after the fragment floods: +{reasm}");
        for r in &rows {
            eprintln!("{r}");
        }
    }
    let mut port = 7800;
    assert_pods_connect(&w, &[hostile, v1, v2], &mut port);
}

/// A flood of new flows from one pod into a small NAT table (4096 entries
/// = 2048 flows, set at load): the pod's quota (default `nat_max_per_pod`
/// = a quarter of the table's flows, 512) stops it — the rest of the flood
/// is dropped as `drop_nat_quota` — so nothing is evicted and another
/// pod's idle, established connection keeps its entries and works; new
/// connections of the other pods succeed.
#[test]
fn nat_flood_into_a_small_table_is_stopped_by_the_pod_quota() {
    use std::io::{Read as _, Write as _};
    let mut w = World::new();
    let n = w.add_node();
    w.nodes[n].agent_args.extra_args = ["--nat-gc-interval", "1", "--nat-max-entries", "4096"]
        .iter()
        .map(|a| (*a).to_owned())
        .collect();
    w.start_agent(n);
    let hostile = w.add_pod(n);
    let v1 = w.add_pod(n);
    let v2 = w.add_pod(n);
    w.add_outside();
    let outside_ip = Ipv4Addr::new(192, 168, w.k, 254);
    let outside = w.outside.as_ref().expect("outside");
    let s = Scene::new(&w, hostile, &[v1, v2]);
    let (own, gw_mac, own_ip) = (s.own_mac, s.gw_mac, s.own_ip);

    // The victim's long-lived connection: an echo server outside.
    let listener = listen(outside, 7900);
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut c, _) = listener.accept()?;
        c.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut buf = [0u8; 64];
        loop {
            let k = c.read(&mut buf)?;
            if k == 0 {
                return Ok(());
            }
            c.write_all(&buf[..k])?;
        }
    });
    let mut conn = connect(
        &w.pods[v1].ns,
        SocketAddr::from((outside_ip, 7900)),
        Duration::from_secs(5),
    )
    .expect("victim's connection");
    conn.set_read_timeout(Some(Duration::from_secs(3)))
        .expect("timeout");
    let mut buf = [0u8; 5];
    conn.write_all(b"hello").expect("write");
    conn.read_exact(&mut buf).expect("echo before the flood");

    // 4000 flows (distinct destination ports: no port shortage, only
    // table pressure) to closed ports of the outside host.
    let frames: Vec<Vec<u8>> = (0..4000u16)
        .map(|i| {
            packet::ipv4_frame(
                (gw_mac, own),
                (own_ip, outside_ip),
                packet::IPPROTO_TCP,
                packet::tcp_syn(own_ip, outside_ip, 30000 + i, 20000 + i, u32::from(i)),
            )
        })
        .collect();
    let before = w.nodes[n].counters();
    let sent = s
        .sock
        .send_all(frames.iter().map(Vec::as_slice))
        .expect("flood");
    let cpus = rivet::config::possible_cpus().expect("possible CPUs");
    let quota = u64::from(rivet::config::default_nat_max_per_pod(4096, cpus));
    let after = wait_counter(&w, n, &before, Counter::DropNatQuota, sent - quota);
    let nat = nat_status_fresh(&w, n);
    let (out, refused) = (
        moved(&before, &after, Counter::FwdSnat),
        moved(&before, &after, Counter::DropNatQuota),
    );
    assert_eq!(out + refused, sent, "each SYN left or was dropped");
    assert!(
        out <= quota,
        "{out} flows of one pod past its quota of {quota}"
    );
    assert!(nat.entries <= nat.max_entries, "{nat:?}");
    assert_eq!(
        nat.evicted, 0,
        "a flood within the quota evicts nothing: {nat:?}"
    );

    // Does the victim's idle flow still have its entries, and does its
    // connection still work?
    let victim_entries = match w.nodes[n]
        .agent()
        .client()
        .call(&rivet_api::Request::NatList {
            ip: Some(w.pods[v1].ip),
            port: None,
            limit: None,
        }) {
        Ok(rivet_api::Response::Nat { entries, .. }) => entries.len(),
        other => panic!("nat list: {other:?}"),
    };
    let survived = conn
        .write_all(b"again")
        .and_then(|()| conn.read_exact(&mut buf))
        .is_ok();
    drop(conn);
    let _ = echo.join();
    if std::env::var_os("HOSTILE_REPORT").is_some() {
        eprintln!(
            "| NAT flood into a 4096-entry table | {sent} | fwd_snat +{out}, drop_nat_quota +{refused} | entries {} / {}, evicted {}; victim's established flow: {} entries left, connection {} |",
            nat.entries,
            nat.max_entries,
            nat.evicted,
            victim_entries,
            if survived { "still works" } else { "BROKEN" }
        );
    }
    assert_eq!(victim_entries, 2, "the victim's flow keeps its two entries");
    assert!(survived, "the victim's established connection still works");
    // New connections of the other pods still succeed.
    let server = OkServer::start(outside, 7901);
    for v in [v1, v2] {
        fresh_connection(&w.pods[v].ns, SocketAddr::from((outside_ip, 7901)))
            .unwrap_or_else(|e| panic!("after the NAT flood: {e}"));
    }
    drop(server);
    let mut port = 7950;
    assert_pods_connect(&w, &[v1, v2], &mut port);
}

/// Honest fragmented traffic to the node within the default budget
/// (256 KiB at once, 32 KiB/s after): 30 pings of 3000 bytes (3 fragments
/// each) in 1.5 s and 10 UDP datagrams of 8 KB in one second to a socket
/// on the node all arrive; nothing is dropped as `drop_frag_budget`.
#[test]
fn fragmented_datagrams_to_the_node_within_the_budget_all_arrive() {
    let mut w = World::new();
    let n = w.add_node();
    w.start_agent(n);
    let p = w.add_pod(n);
    let node_ip = w.nodes[n].ip;
    let before = w.nodes[n].counters();
    let text = w.pods[p].ns.output(
        "ping",
        &[
            "-n",
            "-c",
            "30",
            "-i",
            "0.05",
            "-W",
            "2",
            "-s",
            "3000",
            &node_ip.to_string(),
        ],
    );
    let pings = rivet_tests::traffic::parse_ping(&String::from_utf8_lossy(&text.stdout));
    assert_eq!(pings.received, 30, "fragmented pings to the node answered");

    let server = w.nodes[n]
        .ns
        .exec(|| UdpSocket::bind((node_ip, 9_900)))
        .expect("UDP socket on the node");
    server
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    w.pods[p].ns.exec(|| {
        let client = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).expect("UDP socket in the pod");
        for i in 0..10u8 {
            client
                .send_to(&[i; 8192], (node_ip, 9_900))
                .expect("send 8 KB");
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let mut got = Vec::new();
    let mut buf = [0u8; 9000];
    while got.len() < 10 {
        match server.recv_from(&mut buf) {
            Ok((len, _)) => got.push((len, buf[0])),
            Err(e) => panic!("{} of 10 datagrams of 8 KB arrived: {e}", got.len()),
        }
    }
    assert!(got.iter().all(|&(len, _)| len == 8192), "{got:?}");
    let after = w.nodes[n].counters();
    assert_eq!(moved(&before, &after, Counter::DropFragBudget), 0);
    let fragments = moved(&before, &after, Counter::PassHost);
    assert!(fragments >= 30 * 3 + 10 * 6, "pass_host +{fragments}");

    // The budget's maps are pinned with the others (a restart keeps them):
    // the agent's settings, and the pod's bucket.
    let maps = w.nodes[n].pin_dir().join("maps");
    let pinned = |name: &str| {
        aya::maps::MapData::from_pin(maps.join(name))
            .unwrap_or_else(|e| panic!("{name} pinned: {e}"))
    };
    let tunables: aya::maps::Array<_, u64> =
        aya::maps::Array::try_from(aya::maps::Map::Array(pinned("TUNABLES"))).expect("array");
    let setting = |i| tunables.get(&i, 0).expect("tunable");
    assert_eq!(
        (
            setting(rivet_common::tunable::FRAG_RATE),
            setting(rivet_common::tunable::FRAG_BURST)
        ),
        (32 * 1024, 256 * 1024),
        "the default budget"
    );
    let buckets: aya::maps::HashMap<_, rivet_common::EndpointKey, u64> =
        aya::maps::HashMap::try_from(aya::maps::Map::LruHashMap(pinned("FRAG_BUDGET")))
            .expect("LRU hash");
    let key = rivet_common::EndpointKey {
        addr: rivet_common::ipv4_key(w.pods[p].ip.octets()),
    };
    assert!(buckets.get(&key, 0).is_ok(), "the pod's fragment bucket");
}
