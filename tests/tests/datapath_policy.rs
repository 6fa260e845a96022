//! Per-packet tests of NetworkPolicy enforcement with BPF_PROG_TEST_RUN:
//! the isolation bits of the endpoints, `POLICY_PORTS` and `POLICY_PEERS`
//! written by hand as the agent writes them (LPM keys of fixed bits plus
//! the port or peer prefix, ports as big-endian bytes), real frames run
//! through `from_pod` (same-node traffic, egress, a hostPort reached from a
//! pod) and `from_uplink` (a remote pod's packet decapsulated, a packet
//! the node's stack routes to a pod).
//!
//! Checked each time: the verdict and the one counter that moves, and the
//! `POLICY_FLOWS` entries the verdicts leave (a flow as its first packet
//! had it), which let later packets and replies through.
//!
//! The pods are the harness's A (10.9.1.2) and B (10.9.1.3); the remote
//! pod is in the peer node's subnet (10.9.2.0/24).

use std::{collections::HashSet, net::Ipv4Addr};

use aya::maps::{HashMap, LpmTrie, MapData, RingBuf, lpm_trie::Key};
use rivet_common::{
    Counter, Event, FlowKey, FlowState, POLICY_PEER_KEY_FIXED_BITS, POLICY_PORT_KEY_FIXED_BITS,
    POLICY_PROTO_OTHER, PolicyPeerKey, PolicyPortKey, endpoint_flags, event_kind, ipv4_key,
    map_names, policy_dir, program_names, route_mode,
};
use rivet_tests::{
    packet::{IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_UDP, Tcp, icmp, icmp_query, ipv4, quote, udp},
    progtest::*,
};

const FROM_POD: &str = program_names::FROM_POD;
const FROM_UPLINK: &str = program_names::FROM_UPLINK;
const INGRESS: u8 = policy_dir::INGRESS;
const EGRESS: u8 = policy_dir::EGRESS;
/// A pod on the peer node (in `REMOTE_SUBNET`).
const REMOTE_POD: Ipv4Addr = Ipv4Addr::new(10, 9, 2, 5);
const TCP_SYN: u8 = 0x02;
const TCP_ACK: u8 = 0x10;
const TCP_SYN_ACK: u8 = 0x12;
const ICMP_ECHO: u8 = 8;
const ICMP_DEST_UNREACH: u8 = 3;
const ICMP_PORT_UNREACH: u8 = 3;

// --- maps, as the agent writes them -------------------------------------------

/// `pod`'s endpoint with `READY` and `flags` (the isolation bits
/// `POLICY_INGRESS`, `POLICY_EGRESS`, and any other endpoint bits it has).
fn isolate(h: &mut Harness, pod: PodSide, flags: u32) {
    h.put_endpoint_flags(pod, endpoint_flags::READY | flags);
}

/// `POLICY_PORTS` {pod, dir, proto, `port`/`bits`} → `class`.
fn put_port(h: &mut Harness, pod: Ipv4Addr, dir: u8, proto: u8, prefix: (u16, u8), class: u16) {
    let (port, bits) = prefix;
    let mut trie: LpmTrie<&mut MapData, PolicyPortKey, u32> =
        LpmTrie::try_from(h.ebpf.map_mut(map_names::POLICY_PORTS).expect("map")).expect("lpm");
    trie.insert(
        &Key::new(
            POLICY_PORT_KEY_FIXED_BITS + u32::from(bits),
            PolicyPortKey {
                pod: ipv4_key(pod.octets()),
                dir,
                proto,
                port: port.to_be_bytes(),
            },
        ),
        u32::from(class),
        0,
    )
    .expect("policy port");
}

/// `POLICY_PEERS` {pod, dir, class, `addr`/`bits`} → `policy`.
fn put_peer(
    h: &mut Harness,
    pod: Ipv4Addr,
    dir: u8,
    class: u16,
    prefix: (Ipv4Addr, u8),
    policy: u32,
) {
    let (addr, bits) = prefix;
    let mut trie: LpmTrie<&mut MapData, PolicyPeerKey, u32> =
        LpmTrie::try_from(h.ebpf.map_mut(map_names::POLICY_PEERS).expect("map")).expect("lpm");
    trie.insert(
        &Key::new(
            POLICY_PEER_KEY_FIXED_BITS + u32::from(bits),
            PolicyPeerKey {
                pod: ipv4_key(pod.octets()),
                dir,
                _pad: 0,
                class: class.to_be_bytes(),
                peer: ipv4_key(addr.octets()),
            },
        ),
        policy,
        0,
    )
    .expect("policy peer");
}

/// A `POLICY_FLOWS` key (ports given in host order).
fn flow(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, proto: u8) -> FlowKey {
    FlowKey {
        src: ipv4_key(src.octets()),
        dst: ipv4_key(dst.octets()),
        sport: sport.to_be(),
        dport: dport.to_be(),
        proto,
        _pad: [0; 3],
    }
}

/// Every flow in `POLICY_FLOWS`.
fn flows(h: &Harness) -> HashSet<FlowKey> {
    let map: HashMap<&MapData, FlowKey, FlowState> =
        HashMap::try_from(h.ebpf.map(map_names::POLICY_FLOWS).expect("map")).expect("hash");
    map.keys().map(|k| k.expect("flow key")).collect()
}

fn set<const N: usize>(keys: [FlowKey; N]) -> HashSet<FlowKey> {
    keys.into_iter().collect()
}

/// Every record waiting in `EVENTS`, taken out of it.
fn drain_events(h: &mut Harness) -> Vec<Event> {
    let mut ring =
        RingBuf::try_from(h.ebpf.map_mut(map_names::EVENTS).expect("map")).expect("ring");
    let mut out = Vec::new();
    while let Some(item) = ring.next() {
        out.push(rivet::events::parse_record(&item).expect("an event record"));
    }
    out
}

// --- packets -----------------------------------------------------------------

/// An IPv4 TCP segment without options or data.
fn tcp(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, flags: u8) -> Vec<u8> {
    ipv4(
        src,
        dst,
        IPPROTO_TCP,
        Tcp::new(sport, dport, flags).checksummed(src, dst),
    )
}

/// An IPv4 UDP datagram with 4 bytes of data.
fn datagram(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16) -> Vec<u8> {
    ipv4(src, dst, IPPROTO_UDP, udp(sport, dport, b"rivt"))
}

/// An IPv4 ICMP echo request.
fn echo(src: Ipv4Addr, dst: Ipv4Addr, id: u16) -> Vec<u8> {
    ipv4(
        src,
        dst,
        IPPROTO_ICMP,
        icmp_query(ICMP_ECHO, id, 1, b"ping"),
    )
}

/// Runs and checks the verdict and that exactly `counter` moved, by one —
/// for the uplink, whose policy verdict comes after decapsulation and the
/// hop's rewrite, so a packet it drops is no longer the frame that came in.
fn expect_verdict(
    h: &Harness,
    prog: &str,
    data: &[u8],
    ifindex: u32,
    verdict: u32,
    counter: Counter,
) -> Vec<u8> {
    let before = h.counters();
    let (got, out) = h.run(prog, data, ifindex).expect("test_run");
    let after = h.counters();
    assert_eq!(
        got, verdict,
        "verdict of {prog} (counters after: {after:?})"
    );
    for (name, value) in &after {
        let delta = value - before[name];
        let want = u64::from(*name == counter.name());
        assert_eq!(
            delta, want,
            "counter {name} moved by {delta}, expected {want}"
        );
    }
    out
}

// --- tests -------------------------------------------------------------------

/// A pod isolated for ingress without rules gets nothing; a port class and
/// a peer on it let exactly that peer in on that port, and the flow is
/// remembered as its first packet had it.
#[test]
fn isolated_ingress_drops_until_a_rule_allows_peer_and_port() {
    with_harness(|h| {
        let (a, b) = (h.a, h.b);
        isolate(h, b, endpoint_flags::POLICY_INGRESS);
        let syn = h.pod_frame(a, &tcp(a.ip, b.ip, 40_000, 8080, TCP_SYN));
        h.expect(
            FROM_POD,
            &syn,
            a.host_ifindex,
            TC_ACT_SHOT,
            Counter::DropPolicyIngress,
        );
        assert!(flows(h).is_empty(), "a denied packet leaves no flow");

        // The port class alone names no peer.
        put_port(h, b.ip, INGRESS, IPPROTO_TCP, (8080, 16), 1);
        h.expect(
            FROM_POD,
            &syn,
            a.host_ifindex,
            TC_ACT_SHOT,
            Counter::DropPolicyIngress,
        );
        assert!(flows(h).is_empty());

        put_peer(h, b.ip, INGRESS, 1, (a.ip, 32), 7);
        let out = h.expect(
            FROM_POD,
            &syn,
            a.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::FwdLocal,
        );
        assert_eq!(&out[0..6], &b.mac);
        assert_eq!(&out[6..12], &b.host_mac);
        assert_eq!(flows(h), set([flow(a.ip, b.ip, 40_000, 8080, IPPROTO_TCP)]));

        // Another port of the same peer has no class.
        let other = h.pod_frame(a, &tcp(a.ip, b.ip, 40_001, 8081, TCP_SYN));
        h.expect(
            FROM_POD,
            &other,
            a.host_ifindex,
            TC_ACT_SHOT,
            Counter::DropPolicyIngress,
        );
        assert_eq!(flows(h).len(), 1);
    });
}

/// A reply passes the isolated ingress of the pod that started the flow;
/// a new flow the other way does not.
#[test]
fn replies_of_an_allowed_flow_pass_the_initiators_isolated_ingress() {
    with_harness(|h| {
        let (a, b) = (h.a, h.b);
        isolate(h, b, endpoint_flags::POLICY_INGRESS);
        put_port(h, b.ip, INGRESS, IPPROTO_TCP, (8080, 16), 1);
        put_peer(h, b.ip, INGRESS, 1, (a.ip, 32), 7);
        let syn = h.pod_frame(a, &tcp(a.ip, b.ip, 40_000, 8080, TCP_SYN));
        h.expect(
            FROM_POD,
            &syn,
            a.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::FwdLocal,
        );
        let started = set([flow(a.ip, b.ip, 40_000, 8080, IPPROTO_TCP)]);
        assert_eq!(flows(h), started);

        isolate(h, a, endpoint_flags::POLICY_INGRESS);
        let syn_ack = h.pod_frame(b, &tcp(b.ip, a.ip, 8080, 40_000, TCP_SYN_ACK));
        let out = h.expect(
            FROM_POD,
            &syn_ack,
            b.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::FwdLocal,
        );
        assert_eq!(&out[0..6], &a.mac);
        // The flow's next packet from A goes on through B's ingress.
        let ack = h.pod_frame(a, &tcp(a.ip, b.ip, 40_000, 8080, TCP_ACK));
        h.expect(
            FROM_POD,
            &ack,
            a.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::FwdLocal,
        );
        assert_eq!(flows(h), started, "a reply is no flow of its own");

        // B starting a flow of its own toward A: A has no rule.
        let fresh = h.pod_frame(b, &tcp(b.ip, a.ip, 8080, 22, TCP_SYN));
        h.expect(
            FROM_POD,
            &fresh,
            b.host_ifindex,
            TC_ACT_SHOT,
            Counter::DropPolicyIngress,
        );
        assert_eq!(flows(h), started);
    });
}

/// A pod isolated for egress reaches nothing without rules — outside the
/// cluster, nor a pod of its node — except its own node; a rule on the
/// destination and port lets that one through.
#[test]
fn isolated_egress_drops_but_the_pods_node_passes() {
    with_harness(|h| {
        let (a, b) = (h.a, h.b);
        isolate(h, a, endpoint_flags::POLICY_EGRESS);
        let out_of_cluster = h.pod_frame(a, &datagram(a.ip, ELSEWHERE, 5353, 53));
        h.expect(
            FROM_POD,
            &out_of_cluster,
            a.host_ifindex,
            TC_ACT_SHOT,
            Counter::DropPolicyEgress,
        );
        let to_b = h.pod_frame(a, &datagram(a.ip, b.ip, 5353, 53));
        h.expect(
            FROM_POD,
            &to_b,
            a.host_ifindex,
            TC_ACT_SHOT,
            Counter::DropPolicyEgress,
        );
        assert!(flows(h).is_empty());

        let to_node = h.pod_frame(a, &datagram(a.ip, NODE_IP, 5353, 53));
        let out = h.expect(
            FROM_POD,
            &to_node,
            a.host_ifindex,
            TC_ACT_OK,
            Counter::PassHost,
        );
        assert_eq!(out, to_node);
        assert_eq!(flows(h), set([flow(a.ip, NODE_IP, 5353, 53, IPPROTO_UDP)]));

        // Egress rules are keyed by the destination.
        put_port(h, a.ip, EGRESS, IPPROTO_UDP, (53, 16), 0x8002);
        put_peer(h, a.ip, EGRESS, 0x8002, (ELSEWHERE, 32), 3);
        h.expect(
            FROM_POD,
            &out_of_cluster,
            a.host_ifindex,
            TC_ACT_OK,
            Counter::PassOther,
        );
        h.expect(
            FROM_POD,
            &to_b,
            a.host_ifindex,
            TC_ACT_SHOT,
            Counter::DropPolicyEgress,
        );
        assert_eq!(
            flows(h),
            set([
                flow(a.ip, NODE_IP, 5353, 53, IPPROTO_UDP),
                flow(a.ip, ELSEWHERE, 5353, 53, IPPROTO_UDP),
            ])
        );
    });
}

/// A port range stored as its aligned prefix (8000–8003 as 8000/14) covers
/// exactly its ports and its protocol; protocols without ports look up
/// protocol OTHER, port 0, whose entry covers every port (prefix 0).
#[test]
fn port_ranges_as_prefixes_and_protocols_without_ports() {
    with_harness(|h| {
        let (a, b) = (h.a, h.b);
        isolate(h, b, endpoint_flags::POLICY_INGRESS);
        put_port(h, b.ip, INGRESS, IPPROTO_TCP, (8000, 14), 1);
        put_peer(h, b.ip, INGRESS, 1, (a.ip, 32), 7);
        for (sport, dport, verdict, counter) in [
            (41_000, 8000, TC_ACT_REDIRECT, Counter::FwdLocal),
            (41_001, 8001, TC_ACT_REDIRECT, Counter::FwdLocal),
            (41_003, 8003, TC_ACT_REDIRECT, Counter::FwdLocal),
            (41_004, 8004, TC_ACT_SHOT, Counter::DropPolicyIngress),
            (41_005, 7999, TC_ACT_SHOT, Counter::DropPolicyIngress),
        ] {
            let syn = h.pod_frame(a, &tcp(a.ip, b.ip, sport, dport, TCP_SYN));
            h.expect(FROM_POD, &syn, a.host_ifindex, verdict, counter);
        }
        // UDP to a port of the TCP range.
        let udp_8001 = h.pod_frame(a, &datagram(a.ip, b.ip, 41_006, 8001));
        h.expect(
            FROM_POD,
            &udp_8001,
            a.host_ifindex,
            TC_ACT_SHOT,
            Counter::DropPolicyIngress,
        );
        let ping = h.pod_frame(a, &echo(a.ip, b.ip, 0x4242));
        h.expect(
            FROM_POD,
            &ping,
            a.host_ifindex,
            TC_ACT_SHOT,
            Counter::DropPolicyIngress,
        );
        assert_eq!(
            flows(h),
            set([
                flow(a.ip, b.ip, 41_000, 8000, IPPROTO_TCP),
                flow(a.ip, b.ip, 41_001, 8001, IPPROTO_TCP),
                flow(a.ip, b.ip, 41_003, 8003, IPPROTO_TCP),
            ])
        );

        put_port(h, b.ip, INGRESS, POLICY_PROTO_OTHER, (0, 0), 0x8001);
        put_peer(h, b.ip, INGRESS, 0x8001, (a.ip, 32), 9);
        h.expect(
            FROM_POD,
            &ping,
            a.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::FwdLocal,
        );
        assert!(
            flows(h).contains(&flow(a.ip, b.ip, 0x4242, 0x4242, IPPROTO_ICMP)),
            "an echo's flow is keyed by its identifier both ways"
        );
        // The OTHER entry opens no TCP or UDP port.
        let syn_8004 = h.pod_frame(a, &tcp(a.ip, b.ip, 41_007, 8004, TCP_SYN));
        h.expect(
            FROM_POD,
            &syn_8004,
            a.host_ifindex,
            TC_ACT_SHOT,
            Counter::DropPolicyIngress,
        );
        h.expect(
            FROM_POD,
            &udp_8001,
            a.host_ifindex,
            TC_ACT_SHOT,
            Counter::DropPolicyIngress,
        );
        assert_eq!(flows(h).len(), 4);
    });
}

/// A peer prefix (an `ipBlock` /24) allows the sources in it, to its
/// edges, and none outside: remote pods decapsulated from VXLAN, and the
/// same-node pod outside the block.
#[test]
fn cidr_peer_allows_inside_and_denies_outside() {
    with_harness(|h| {
        h.route_to_peer(route_mode::VXLAN);
        let (a, b) = (h.a, h.b);
        let up = h.uplink.0;
        isolate(h, b, endpoint_flags::POLICY_INGRESS);
        put_port(h, b.ip, INGRESS, IPPROTO_TCP, (8080, 16), 1);
        put_peer(h, b.ip, INGRESS, 1, (Ipv4Addr::new(10, 9, 2, 0), 24), 4);
        for (src, verdict, counter) in [
            (REMOTE_POD, TC_ACT_REDIRECT, Counter::DecapVxlan),
            (
                Ipv4Addr::new(10, 9, 2, 0),
                TC_ACT_REDIRECT,
                Counter::DecapVxlan,
            ),
            (
                Ipv4Addr::new(10, 9, 2, 255),
                TC_ACT_REDIRECT,
                Counter::DecapVxlan,
            ),
            (
                Ipv4Addr::new(10, 9, 3, 0),
                TC_ACT_SHOT,
                Counter::DropPolicyIngress,
            ),
            (
                Ipv4Addr::new(10, 9, 1, 255),
                TC_ACT_SHOT,
                Counter::DropPolicyIngress,
            ),
        ] {
            let pkt = h.vxlan_frame(
                PEER_IP,
                VNI,
                VXLAN_PORT,
                &tcp(src, b.ip, 40_000, 8080, TCP_SYN),
            );
            expect_verdict(h, FROM_UPLINK, &pkt, up, verdict, counter);
        }
        let syn = h.pod_frame(a, &tcp(a.ip, b.ip, 40_000, 8080, TCP_SYN));
        h.expect(
            FROM_POD,
            &syn,
            a.host_ifindex,
            TC_ACT_SHOT,
            Counter::DropPolicyIngress,
        );
        assert_eq!(
            flows(h),
            set([
                flow(REMOTE_POD, b.ip, 40_000, 8080, IPPROTO_TCP),
                flow(Ipv4Addr::new(10, 9, 2, 0), b.ip, 40_000, 8080, IPPROTO_TCP),
                flow(
                    Ipv4Addr::new(10, 9, 2, 255),
                    b.ip,
                    40_000,
                    8080,
                    IPPROTO_TCP
                ),
            ])
        );
    });
}

/// Neither end isolated: no verdict, but the flows are remembered (a UDP
/// datagram, a TCP SYN, an ICMP echo), not a TCP segment without SYN, and
/// not an answer of a remembered flow.
#[test]
fn flows_between_unisolated_pods_are_tracked_from_their_first_packet() {
    with_harness(|h| {
        let (a, b) = (h.a, h.b);
        let dgram = h.pod_frame(a, &datagram(a.ip, b.ip, 5353, 53));
        h.expect(
            FROM_POD,
            &dgram,
            a.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::FwdLocal,
        );
        let udp_flow = flow(a.ip, b.ip, 5353, 53, IPPROTO_UDP);
        assert_eq!(flows(h), set([udp_flow]));

        let ack = h.pod_frame(a, &tcp(a.ip, b.ip, 40_000, 80, TCP_ACK));
        h.expect(
            FROM_POD,
            &ack,
            a.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::FwdLocal,
        );
        assert_eq!(flows(h), set([udp_flow]), "no SYN, no flow");

        let syn = h.pod_frame(a, &tcp(a.ip, b.ip, 40_001, 80, TCP_SYN));
        h.expect(
            FROM_POD,
            &syn,
            a.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::FwdLocal,
        );
        let tcp_flow = flow(a.ip, b.ip, 40_001, 80, IPPROTO_TCP);
        assert_eq!(flows(h), set([udp_flow, tcp_flow]));

        let ping = h.pod_frame(a, &echo(a.ip, b.ip, 0x0101));
        h.expect(
            FROM_POD,
            &ping,
            a.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::FwdLocal,
        );
        let echo_flow = flow(a.ip, b.ip, 0x0101, 0x0101, IPPROTO_ICMP);
        assert_eq!(flows(h), set([udp_flow, tcp_flow, echo_flow]));

        // B's answer to the datagram belongs to the flow A started.
        let answer = h.pod_frame(b, &datagram(b.ip, a.ip, 53, 5353));
        h.expect(
            FROM_POD,
            &answer,
            b.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::FwdLocal,
        );
        assert_eq!(
            flows(h),
            set([udp_flow, tcp_flow, echo_flow]),
            "an answer is no flow of its own"
        );
    });
}

/// An ICMP error about a known flow passes the isolated ingress of the
/// pod that started it; one about a flow nobody started does not.
#[test]
fn icmp_errors_about_known_flows_pass_isolated_ingress() {
    with_harness(|h| {
        let (a, b) = (h.a, h.b);
        isolate(h, a, endpoint_flags::POLICY_INGRESS);
        let sent = datagram(a.ip, b.ip, 5000, 8080);
        h.expect(
            FROM_POD,
            &h.pod_frame(a, &sent),
            a.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::FwdLocal,
        );
        assert_eq!(flows(h), set([flow(a.ip, b.ip, 5000, 8080, IPPROTO_UDP)]));

        let unreach = |about: &[u8]| {
            ipv4(
                b.ip,
                a.ip,
                IPPROTO_ICMP,
                icmp(ICMP_DEST_UNREACH, ICMP_PORT_UNREACH, [0; 4], quote(about)),
            )
        };
        let related = h.pod_frame(b, &unreach(&sent));
        let out = h.expect(
            FROM_POD,
            &related,
            b.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::FwdLocal,
        );
        assert_eq!(&out[0..6], &a.mac);

        let never_sent = datagram(a.ip, b.ip, 5001, 8080);
        let unrelated = h.pod_frame(b, &unreach(&never_sent));
        h.expect(
            FROM_POD,
            &unrelated,
            b.host_ifindex,
            TC_ACT_SHOT,
            Counter::DropPolicyIngress,
        );
        assert_eq!(
            flows(h),
            set([flow(a.ip, b.ip, 5000, 8080, IPPROTO_UDP)]),
            "an ICMP error starts no flow"
        );
    });
}

/// At the uplink the pod's ingress is asked for the decapsulated packet:
/// a remote pod without a rule is dropped (not delivered), with one it is
/// delivered; a packet the node's stack routes to the pod likewise.
#[test]
fn uplink_deliveries_into_an_isolated_pod() {
    with_harness(|h| {
        h.route_to_peer(route_mode::VXLAN);
        let b = h.b;
        let up = h.uplink.0;
        isolate(h, b, endpoint_flags::POLICY_INGRESS);
        let inner = datagram(REMOTE_POD, b.ip, 5353, 53);
        let pkt = h.vxlan_frame(PEER_IP, VNI, VXLAN_PORT, &inner);
        expect_verdict(
            h,
            FROM_UPLINK,
            &pkt,
            up,
            TC_ACT_SHOT,
            Counter::DropPolicyIngress,
        );
        assert!(flows(h).is_empty());

        put_port(h, b.ip, INGRESS, IPPROTO_UDP, (53, 16), 2);
        put_peer(h, b.ip, INGRESS, 2, (REMOTE_POD, 32), 11);
        let out = expect_verdict(
            h,
            FROM_UPLINK,
            &pkt,
            up,
            TC_ACT_REDIRECT,
            Counter::DecapVxlan,
        );
        assert_eq!(out.len(), pkt.len() - 50, "decapsulated");
        assert_eq!(&out[0..6], &b.mac);
        assert_eq!(&out[6..12], &b.host_mac);
        assert_eq!(
            flows(h),
            set([flow(REMOTE_POD, b.ip, 5353, 53, IPPROTO_UDP)])
        );

        // A packet from outside the cluster for the pod, which the node's
        // stack would route: judged by the pod's ingress, then passed.
        let routed = h.peer_frame(&datagram(ELSEWHERE, b.ip, 5353, 53));
        expect_verdict(
            h,
            FROM_UPLINK,
            &routed,
            up,
            TC_ACT_SHOT,
            Counter::DropPolicyIngress,
        );
        put_peer(h, b.ip, INGRESS, 2, (ELSEWHERE, 32), 12);
        let out = expect_verdict(h, FROM_UPLINK, &routed, up, TC_ACT_OK, Counter::UplinkPass);
        assert_eq!(out, routed, "passed untouched");
        assert_eq!(
            flows(h),
            set([
                flow(REMOTE_POD, b.ip, 5353, 53, IPPROTO_UDP),
                flow(ELSEWHERE, b.ip, 5353, 53, IPPROTO_UDP),
            ])
        );
    });
}

/// A pod reaching a hostPort on its node is judged as reaching the
/// hostPort's pod on the container port.
#[test]
fn hostport_from_a_pod_is_judged_by_the_target_pods_ingress() {
    with_harness(|h| {
        let (a, b) = (h.a, h.b);
        h.put_hostport(30_080, b, 8080);
        isolate(
            h,
            b,
            endpoint_flags::HOSTPORTS | endpoint_flags::POLICY_INGRESS,
        );
        let syn = h.pod_frame(a, &tcp(a.ip, NODE_IP, 40_000, 30_080, TCP_SYN));
        h.expect(
            FROM_POD,
            &syn,
            a.host_ifindex,
            TC_ACT_SHOT,
            Counter::DropPolicyIngress,
        );
        // A rule on the hostPort's number is no rule on the pod's port.
        put_port(h, b.ip, INGRESS, IPPROTO_TCP, (30_080, 16), 1);
        put_peer(h, b.ip, INGRESS, 1, (a.ip, 32), 7);
        h.expect(
            FROM_POD,
            &syn,
            a.host_ifindex,
            TC_ACT_SHOT,
            Counter::DropPolicyIngress,
        );
        assert!(flows(h).is_empty());

        put_port(h, b.ip, INGRESS, IPPROTO_TCP, (8080, 16), 2);
        put_peer(h, b.ip, INGRESS, 2, (a.ip, 32), 8);
        let out = h.expect(
            FROM_POD,
            &syn,
            a.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::FwdDnat,
        );
        assert_eq!(&out[30..34], &b.ip.octets(), "translated to the pod");
        assert_eq!(&out[36..38], &8080u16.to_be_bytes());
        assert_eq!(flows(h), set([flow(a.ip, b.ip, 40_000, 8080, IPPROTO_TCP)]));
    });
}

/// A new flow a policy allows is reported once, per isolated end, with the
/// direction and the number of the policy that allowed it; its later
/// packets are not; a denied packet is reported as a drop.
#[test]
fn allowed_new_flows_emit_policy_events() {
    with_harness(|h| {
        let (a, b) = (h.a, h.b);
        isolate(h, a, endpoint_flags::POLICY_EGRESS);
        isolate(h, b, endpoint_flags::POLICY_INGRESS);
        put_port(h, a.ip, EGRESS, IPPROTO_TCP, (8080, 16), 3);
        put_peer(h, a.ip, EGRESS, 3, (b.ip, 32), 5);
        put_port(h, b.ip, INGRESS, IPPROTO_TCP, (8080, 16), 1);
        put_peer(h, b.ip, INGRESS, 1, (a.ip, 32), 7);
        assert_eq!(drain_events(h), Vec::new());

        // Off (nobody listens): an allowed flow writes no event.
        let quiet = h.pod_frame(a, &tcp(a.ip, b.ip, 39_999, 8080, TCP_SYN));
        h.expect(
            FROM_POD,
            &quiet,
            a.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::FwdLocal,
        );
        assert_eq!(drain_events(h), Vec::new(), "no event while nobody listens");
        // On, as the agent turns it on for a monitor client.
        let mut tunables: aya::maps::Array<&mut MapData, u64> =
            aya::maps::Array::try_from(h.ebpf.map_mut(map_names::TUNABLES).expect("map"))
                .expect("array");
        tunables
            .set(rivet_common::tunable::POLICY_EVENTS, 1, 0)
            .expect("policy events on");

        let syn = h.pod_frame(a, &tcp(a.ip, b.ip, 40_000, 8080, TCP_SYN));
        h.expect(
            FROM_POD,
            &syn,
            a.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::FwdLocal,
        );
        let allowed = |dir: u8, policy: u32| Event {
            kind: event_kind::POLICY,
            proto: IPPROTO_TCP,
            counter: u16::from(dir),
            ifindex: a.host_ifindex,
            src: ipv4_key(a.ip.octets()),
            dst: ipv4_key(b.ip.octets()),
            sport: 40_000u16.to_be(),
            dport: 8080u16.to_be(),
            len: policy,
        };
        assert_eq!(
            drain_events(h),
            vec![allowed(EGRESS, 5), allowed(INGRESS, 7)]
        );

        let ack = h.pod_frame(a, &tcp(a.ip, b.ip, 40_000, 8080, TCP_ACK));
        h.expect(
            FROM_POD,
            &ack,
            a.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::FwdLocal,
        );
        assert_eq!(drain_events(h), Vec::new(), "once per flow");

        let denied = h.pod_frame(a, &tcp(a.ip, b.ip, 40_001, 8081, TCP_SYN));
        h.expect(
            FROM_POD,
            &denied,
            a.host_ifindex,
            TC_ACT_SHOT,
            Counter::DropPolicyEgress,
        );
        assert_eq!(
            drain_events(h),
            vec![Event {
                kind: event_kind::DROP,
                counter: Counter::DropPolicyEgress.index() as u16,
                sport: 40_001u16.to_be(),
                dport: 8081u16.to_be(),
                len: denied.len() as u32,
                ..allowed(EGRESS, 0)
            }]
        );
    });
}

/// A spoofed packet (another pod's address, or its own address from the
/// wrong veth) is judged by no policy and remembered as no flow: it cannot
/// open a way back into a pod whose ingress is isolated. `from_pod` drops
/// it as spoofed.
#[test]
fn spoofed_packets_leave_no_flow() {
    with_harness(|h| {
        let (a, b) = (h.a, h.b);
        isolate(h, b, endpoint_flags::POLICY_INGRESS);
        // From A's veth, claiming B's address, to an outside address:
        // were it remembered, that address's answers would pass B's
        // isolated ingress as replies.
        let spoofed = h.pod_frame(a, &datagram(b.ip, ELSEWHERE, 5353, 53));
        h.expect(
            FROM_POD,
            &spoofed,
            a.host_ifindex,
            TC_ACT_SHOT,
            Counter::DropSpoofedIp,
        );
        assert_eq!(flows(h), set([]), "no flow from a spoofed packet");
        let reply = h.peer_frame(&datagram(ELSEWHERE, b.ip, 53, 5353));
        expect_verdict(
            h,
            FROM_UPLINK,
            &reply,
            h.uplink.0,
            TC_ACT_SHOT,
            Counter::DropPolicyIngress,
        );
    });
}

/// Now on the clock the datapath reads (`bpf_ktime_get_ns`: monotonic).
fn monotonic_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("clock");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

fn put_flow(h: &mut Harness, key: FlowKey, seen: u64) {
    let mut map: HashMap<&mut MapData, FlowKey, FlowState> =
        HashMap::try_from(h.ebpf.map_mut(map_names::POLICY_FLOWS).expect("map")).expect("hash");
    map.insert(key, FlowState { seen }, 0).expect("flow");
}

/// A remembered flow lets replies through only while it is used: a UDP
/// flow idle past 120 s is forgotten and its packets are judged by the
/// rules again; one idle for a minute, and a TCP flow idle for two hours
/// (TCP's limit is a day), still pass.
#[test]
fn idle_flows_are_forgotten() {
    with_harness(|h| {
        let b = h.b;
        let up = h.uplink.0;
        isolate(h, b, endpoint_flags::POLICY_INGRESS);
        let now = monotonic_ns();
        let second = 1_000_000_000u64;
        let udp_out = flow(b.ip, ELSEWHERE, 5353, 53, IPPROTO_UDP);
        let udp_back = h.peer_frame(&datagram(ELSEWHERE, b.ip, 53, 5353));
        let ago = |secs: u64| {
            now.checked_sub(secs * second)
                .expect("the machine has been up longer than the idle time tested")
        };
        put_flow(h, udp_out, ago(121));
        expect_verdict(
            h,
            FROM_UPLINK,
            &udp_back,
            up,
            TC_ACT_SHOT,
            Counter::DropPolicyIngress,
        );
        put_flow(h, udp_out, ago(60));
        expect_verdict(
            h,
            FROM_UPLINK,
            &udp_back,
            up,
            TC_ACT_OK,
            Counter::UplinkPass,
        );

        let tcp_out = flow(b.ip, ELSEWHERE, 40_000, 443, IPPROTO_TCP);
        let tcp_back = h.peer_frame(&tcp(ELSEWHERE, b.ip, 443, 40_000, TCP_ACK));
        put_flow(h, tcp_out, now.saturating_sub(2 * 3600 * second));
        expect_verdict(
            h,
            FROM_UPLINK,
            &tcp_back,
            up,
            TC_ACT_OK,
            Counter::UplinkPass,
        );
    });
}

/// A datagram on the tuple of a forgotten flow (idle past its timeout)
/// makes it a flow again: its entry is refreshed where it is, so the
/// answer passes the sender's isolated ingress.
#[test]
fn a_new_packet_on_a_forgotten_tuple_refreshes_its_flow() {
    with_harness(|h| {
        let (a, b) = (h.a, h.b);
        let udp_flow = flow(a.ip, b.ip, 5353, 53, IPPROTO_UDP);
        let stale = monotonic_ns()
            .checked_sub(121 * 1_000_000_000)
            .expect("the machine has been up longer than the idle time tested");
        put_flow(h, udp_flow, stale);
        isolate(h, a, endpoint_flags::POLICY_INGRESS);
        let answer = h.pod_frame(b, &datagram(b.ip, a.ip, 53, 5353));
        h.expect(
            FROM_POD,
            &answer,
            b.host_ifindex,
            TC_ACT_SHOT,
            Counter::DropPolicyIngress,
        );

        let before = monotonic_ns();
        let query = h.pod_frame(a, &datagram(a.ip, b.ip, 5353, 53));
        h.expect(
            FROM_POD,
            &query,
            a.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::FwdLocal,
        );
        assert_eq!(flows(h), set([udp_flow]), "one entry for the tuple");
        let map: HashMap<&MapData, FlowKey, FlowState> =
            HashMap::try_from(h.ebpf.map(map_names::POLICY_FLOWS).expect("map")).expect("hash");
        let seen = map.get(&udp_flow, 0).expect("the flow's entry").seen;
        assert!(
            seen >= before,
            "seen {seen} not refreshed (sent at {before})"
        );

        h.expect(
            FROM_POD,
            &answer,
            b.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::FwdLocal,
        );
    });
}
