//! Per-packet tests of masquerade with BPF_PROG_TEST_RUN: a new flow gets
//! the node's address and a port from the range (checksums verified by a
//! full recompute), the next packet of the flow the same port, the reply is
//! translated back to the pod, an exhausted range and untranslatable
//! packets are dropped unchanged with their reason, the map holds exactly
//! the flow's two entries, an ended TCP flow's port goes to the same pod's
//! next connection (only), a pod past its NAT quota is refused (and the
//! collector's recount gives evicted flows back), another pod's stale
//! unanswered flow gives up its port (an answered one never does).

use std::net::Ipv4Addr;

use aya::maps::{HashMap, MapData};
use rivet_common::{Counter, NatEntry, NatKey, ipv4_key, nat_dir, program_names};
use rivet_tests::{
    packet::{
        IPPROTO_ICMP, IPPROTO_TCP, Ipv4, Tcp, be16, checksum, edit_ipv4, icmp, icmp_query, ipv4,
        ipv4_checksum_ok, l4_checksum_ok, quote, set_total_len,
    },
    progtest::*,
};

/// The "internet" host: the permanent neighbour on the uplink.
const OUTSIDE: Ipv4Addr = PEER_IP;

/// An IPv4 packet with a TCP segment (no options), checksums right.
fn tcp(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
    tcp_with_options(src, dst, (sport, dport), flags, &[], payload)
}

/// An IPv4 packet with a TCP segment: sequence number 1000, window 65535,
/// `options` (a multiple of 4 bytes), checksums right.
fn tcp_with_options(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    (sport, dport): (u16, u16),
    flags: u8,
    options: &[u8],
    payload: &[u8],
) -> Vec<u8> {
    let seg = Tcp {
        seq: 1000,
        window: 0xffff,
        options: options.to_vec(),
        payload: payload.to_vec(),
        ..Tcp::new(sport, dport, flags)
    };
    ipv4(src, dst, IPPROTO_TCP, seg.checksummed(src, dst))
}

fn nat_entries(h: &Harness) -> Vec<(NatKey, NatEntry)> {
    let map: HashMap<&MapData, NatKey, NatEntry> =
        HashMap::try_from(h.ebpf.map("NAT").expect("map")).expect("hash");
    map.iter().filter_map(Result::ok).collect()
}

fn tcp_frame(h: &Harness, a: PodSide, sport: u16, flags: u8) -> Vec<u8> {
    h.pod_frame(a, &tcp(a.ip, OUTSIDE, sport, 443, flags, b"hello"))
}

#[test]
fn new_flow_existing_flow_and_reply() {
    with_harness(|h| {
        h.enable_nat(61_000, 61_099);
        let a = h.a;
        let syn = tcp_frame(h, a, 40_000, 0x02);
        let out = h.expect(
            program_names::FROM_POD,
            &syn,
            a.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::FwdSnat,
        );
        // Toward the outside host's MAC, from the uplink, as the node.
        assert_eq!(&out[0..6], &PEER_MAC);
        assert_eq!(&out[6..12], &h.uplink.1);
        assert_eq!(&out[26..30], &NODE_IP.octets(), "source = node IP");
        assert_eq!(&out[30..34], &OUTSIDE.octets(), "destination unchanged");
        assert_eq!(out[22], 63, "TTL − 1");
        let port = be16(&out[34..36]);
        assert!((61_000..=61_099).contains(&port), "NAT port {port}");
        assert_eq!(be16(&out[36..38]), 443);
        assert!(ipv4_checksum_ok(&out, 14), "IP checksum");
        assert!(l4_checksum_ok(&out, 14), "TCP checksum");
        assert_eq!(&out[54..], b"hello", "payload untouched");

        let entries = nat_entries(h);
        assert_eq!(entries.len(), 2, "one egress and one reply entry");
        assert!(entries.iter().any(|(k, e)| k.dir == nat_dir::EGRESS
            && k.src == ipv4_key(a.ip.octets())
            && e.port == port.to_be()));

        // The next packet of the flow: same port, no new entries.
        let ack = tcp_frame(h, a, 40_000, 0x10);
        let out2 = h.expect(
            program_names::FROM_POD,
            &ack,
            a.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::FwdSnat,
        );
        assert_eq!(be16(&out2[34..36]), port);
        assert_eq!(nat_entries(h).len(), 2);

        // The reply, at the uplink: back to the pod's address and port.
        let reply = from_outside(h, NODE_IP, 443, port, 0x12, b"world");
        let back = h.expect(
            program_names::FROM_UPLINK,
            &reply,
            h.uplink.0,
            TC_ACT_REDIRECT,
            Counter::RevSnat,
        );
        assert_eq!(&back[0..6], &a.mac, "to the pod's MAC");
        assert_eq!(&back[6..12], &a.host_mac, "from its gateway");
        assert_eq!(&back[30..34], &a.ip.octets(), "destination = pod");
        assert_eq!(&back[26..30], &OUTSIDE.octets());
        assert_eq!(be16(&back[36..38]), 40_000, "pod's port");
        assert!(ipv4_checksum_ok(&back, 14));
        assert!(l4_checksum_ok(&back, 14));
        assert_eq!(&back[54..], b"world");

        // A packet to the NAT range with no state is the node's business
        // (a port of the range other than the one the flow drew).
        let stray_port = if port == 61_050 { 61_051 } else { 61_050 };
        let stray = from_outside(h, NODE_IP, 443, stray_port, 0x10, b"");
        let passed = h.expect(
            program_names::FROM_UPLINK,
            &stray,
            h.uplink.0,
            TC_ACT_OK,
            Counter::PassNatNoState,
        );
        assert_eq!(passed, stray);
        // Outside the range: not NAT's at all.
        let other = from_outside(h, NODE_IP, 443, 22, 0x02, b"");
        h.expect(
            program_names::FROM_UPLINK,
            &other,
            h.uplink.0,
            TC_ACT_OK,
            Counter::UplinkPass,
        );
    });
}

#[test]
fn udp_and_icmp_echo_are_translated() {
    with_harness(|h| {
        h.enable_nat(62_000, 62_000);
        let a = h.a;
        // UDP (Ipv4::new is a UDP datagram with a zero checksum: stays zero).
        let udp = h.ip_frame(a, &Ipv4::new(a.ip, OUTSIDE));
        let out = h.expect(
            program_names::FROM_POD,
            &udp,
            a.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::FwdSnat,
        );
        assert_eq!(&out[26..30], &NODE_IP.octets());
        assert_eq!(be16(&out[34..36]), 62_000);
        assert_eq!(be16(&out[40..42]), 0, "no UDP checksum stays none");
        assert!(ipv4_checksum_ok(&out, 14));

        // An ICMP port unreachable about that datagram, as the outside host
        // sends it: it quotes what it received (node IP, NAT port).
        // (the quoted total length is the whole datagram's)
        let quoted = Ipv4 {
            payload: out[34..42].to_vec(),
            ..Ipv4::new(NODE_IP, OUTSIDE)
        };
        let quoted = edit_ipv4(quoted.bytes(), |q| set_total_len(q, out.len() - 14));
        let unreach = icmp(3, 3, [0; 4], &quoted);
        let error = h.peer_frame(&ipv4(OUTSIDE, NODE_IP, IPPROTO_ICMP, unreach));
        let back = h.expect(
            program_names::FROM_UPLINK,
            &error,
            h.uplink.0,
            TC_ACT_REDIRECT,
            Counter::RevSnat,
        );
        assert_eq!(&back[30..34], &a.ip.octets(), "outer destination = pod");
        assert!(ipv4_checksum_ok(&back, 14));
        assert_eq!(checksum(&back[34..]), 0, "ICMP checksum");
        assert_eq!(
            &back[42 + 12..42 + 16],
            &a.ip.octets(),
            "quoted source = pod"
        );
        assert!(ipv4_checksum_ok(&back, 42), "quoted header checksum");
        assert_eq!(be16(&back[62..64]), 53, "quoted source port = the pod's");

        // ICMP echo request: the identifier is the port.
        let ping = icmp_query(8, 0x1234, 1, b"ping");
        let echo = h.pod_frame(a, &ipv4(a.ip, OUTSIDE, IPPROTO_ICMP, ping));
        let out = h.expect(
            program_names::FROM_POD,
            &echo,
            a.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::FwdSnat,
        );
        assert_eq!(be16(&out[38..40]), 62_000, "identifier translated");
        assert_eq!(checksum(&out[34..]), 0, "ICMP checksum");
        // The echo reply comes back with the translated identifier.
        let pong = icmp_query(0, 0xf230, 1, b"ping");
        let reply = h.peer_frame(&ipv4(OUTSIDE, NODE_IP, IPPROTO_ICMP, pong));
        let back = h.expect(
            program_names::FROM_UPLINK,
            &reply,
            h.uplink.0,
            TC_ACT_REDIRECT,
            Counter::RevSnat,
        );
        assert_eq!(&back[30..34], &a.ip.octets());
        assert_eq!(be16(&back[38..40]), 0x1234, "original identifier");
        assert_eq!(checksum(&back[34..]), 0);
    });
}

#[test]
fn exhausted_range_and_untranslatable_packets_are_dropped() {
    with_harness(|h| {
        h.enable_nat(61_000, 61_001);
        let a = h.a;
        for sport in [40_001, 40_002] {
            h.expect(
                program_names::FROM_POD,
                &tcp_frame(h, a, sport, 0x02),
                a.host_ifindex,
                TC_ACT_REDIRECT,
                Counter::FwdSnat,
            );
        }
        // Two ports, both taken toward this destination: the third flow
        // must not leave with the pod's address.
        h.expect(
            program_names::FROM_POD,
            &tcp_frame(h, a, 40_003, 0x02),
            a.host_ifindex,
            TC_ACT_SHOT,
            Counter::DropNatNoPort,
        );
        // GRE cannot be translated.
        let gre = h.ip_frame(
            a,
            &Ipv4 {
                protocol: 47,
                ..Ipv4::new(a.ip, OUTSIDE)
            },
        );
        h.expect(
            program_names::FROM_POD,
            &gre,
            a.host_ifindex,
            TC_ACT_SHOT,
            Counter::DropNatUnsupported,
        );
        // Nor a fragment (MF set): its later pieces carry no ports.
        let frag = edit_ipv4(tcp(a.ip, OUTSIDE, 40_004, 443, 0x02, b"hello"), |l3| {
            l3[6] |= 0x20;
        });
        let frag = h.pod_frame(a, &frag);
        h.expect(
            program_names::FROM_POD,
            &frag,
            a.host_ifindex,
            TC_ACT_SHOT,
            Counter::DropNatUnsupported,
        );
        // An echo reply (someone reached the pod other than through the
        // masquerade) starts no NAT flow and answers none: it would leave
        // with the pod's address.
        let pong = icmp_query(0, 0x1234, 1, b"");
        let echo_reply = h.pod_frame(a, &ipv4(a.ip, OUTSIDE, IPPROTO_ICMP, pong));
        let out = h.expect(
            program_names::FROM_POD,
            &echo_reply,
            a.host_ifindex,
            TC_ACT_SHOT,
            Counter::DropNatIcmpUnknown,
        );
        assert_eq!(out, echo_reply);
        // Inside the cluster CIDR: no masquerade (passes as before).
        let inside = h.ip_frame(a, &Ipv4::new(a.ip, Ipv4Addr::new(10, 9, 7, 7)));
        h.expect(
            program_names::FROM_POD,
            &inside,
            a.host_ifindex,
            TC_ACT_OK,
            Counter::PassOther,
        );
    });
}

#[test]
fn full_table_recycles_flows_and_the_evictions_show() {
    with_harness_nat_max(8, |h| {
        h.enable_nat(61_000, 61_099);
        let a = h.a;
        // Ten flows, two entries each, into a table of eight: the LRU makes
        // room — a new flow is never refused for a full table.
        for sport in 40_001..=40_010 {
            pod_segment(h, a, sport, 0x02, Counter::FwdSnat);
        }
        let live = nat_entries(h).len();
        assert!(live <= 8, "{live} entries in a table of 8");
        let stats: aya::maps::PerCpuArray<&MapData, u64> =
            aya::maps::PerCpuArray::try_from(h.ebpf.map("NAT_STATS").expect("map"))
                .expect("per-cpu");
        let created: u64 = stats
            .get(&rivet_common::nat_stat::CREATED, 0)
            .expect("slot")
            .iter()
            .sum();
        assert_eq!(created, 20, "two entries per flow, counted");
        assert!(
            created - live as u64 >= 12,
            "evictions = created − live: {created} − {live}"
        );
    });
}

/// A server's segment to the node's NAT port, at the uplink.
fn server_frame(h: &Harness, nat_port: u16, flags: u8) -> Vec<u8> {
    from_outside(h, NODE_IP, 443, nat_port, flags, b"")
}

/// Sends a pod's TCP segment and expects `counter`; returns the NAT port
/// when it was translated.
fn pod_segment(h: &Harness, pod: PodSide, sport: u16, flags: u8, counter: Counter) -> u16 {
    let verdict = if counter == Counter::FwdSnat {
        TC_ACT_REDIRECT
    } else {
        TC_ACT_SHOT
    };
    let out = h.expect(
        program_names::FROM_POD,
        &tcp_frame(h, pod, sport, flags),
        pod.host_ifindex,
        verdict,
        counter,
    );
    be16(&out[34..36])
}

#[test]
fn ended_flow_port_goes_to_the_same_pods_next_flow() {
    with_harness(|h| {
        // One port: every flow toward the server competes for it.
        h.enable_nat(61_000, 61_000);
        let (a, b) = (h.a, h.b);
        let port = pod_segment(h, a, 40_001, 0x02, Counter::FwdSnat);
        assert_eq!(port, 61_000);
        pod_segment(h, a, 40_002, 0x02, Counter::DropNatNoPort);
        // The flow ends: FIN from the server, FIN from the pod.
        h.expect(
            program_names::FROM_UPLINK,
            &server_frame(h, port, 0x11),
            h.uplink.0,
            TC_ACT_REDIRECT,
            Counter::RevSnat,
        );
        pod_segment(h, a, 40_001, 0x11, Counter::FwdSnat);
        // Not at once: the closing handshake's last ACK is still due.
        pod_segment(h, a, 40_002, 0x02, Counter::DropNatNoPort);
        std::thread::sleep(std::time::Duration::from_millis(300));
        // Then the next connection (here another pod's) takes it over.
        assert_eq!(pod_segment(h, b, 40_002, 0x02, Counter::FwdSnat), port);
        let entries = nat_entries(h);
        assert_eq!(entries.len(), 2, "the ended flow's entries are gone");
        let back = entries
            .iter()
            .find(|(k, _)| k.dir == nat_dir::REPLY)
            .expect("reply entry");
        assert_eq!(back.1.port, 40_002u16.to_be(), "replies go to the new flow");
        assert!(
            !entries
                .iter()
                .any(|(k, _)| k.dir == nat_dir::EGRESS && k.sport == 40_001u16.to_be()),
            "the ended flow's egress entry is removed"
        );
        let reply = h.expect(
            program_names::FROM_UPLINK,
            &server_frame(h, port, 0x12),
            h.uplink.0,
            TC_ACT_REDIRECT,
            Counter::RevSnat,
        );
        assert_eq!(be16(&reply[36..38]), 40_002);

        assert_eq!(&reply[30..34], &b.ip.octets());
        // A reset ends a flow too; a new SYN on the same tuple (the pod
        // reusing its port) reopens it, and then the port is busy again.
        pod_segment(h, b, 40_002, 0x04, Counter::FwdSnat);
        assert_eq!(pod_segment(h, b, 40_002, 0x02, Counter::FwdSnat), port);
        std::thread::sleep(std::time::Duration::from_millis(300));
        pod_segment(h, a, 40_003, 0x02, Counter::DropNatNoPort);
    });
}

/// A pod's segment with a timestamp option, translated: (frame out, TSval
/// out). `syn`: Linux's SYN layout (MSS, SACK-permitted + timestamp, window
/// scale), else the NOP NOP timestamp of later segments.
fn pod_segment_ts(h: &Harness, pod: PodSide, sport: u16, syn: bool, tsval: u32) -> (Vec<u8>, u32) {
    let ts = [tsval.to_be_bytes(), 0u32.to_be_bytes()].concat();
    let (options, flags, at) = if syn {
        (
            [&[2, 4, 5, 180, 4, 2, 8, 10][..], &ts, &[1, 3, 3, 7]].concat(),
            0x02,
            28,
        )
    } else {
        ([&[1, 1, 8, 10][..], &ts].concat(), 0x10, 24)
    };
    let ip = tcp_with_options(pod.ip, OUTSIDE, (sport, 443), flags, &options, b"x");
    let out = h.expect(
        program_names::FROM_POD,
        &h.pod_frame(pod, &ip),
        pod.host_ifindex,
        TC_ACT_REDIRECT,
        Counter::FwdSnat,
    );
    assert!(ipv4_checksum_ok(&out, 14));
    assert!(l4_checksum_ok(&out, 14), "TCP checksum after the timestamp");
    let tsval = u32::from_be_bytes(out[34 + at..38 + at].try_into().expect("4 bytes"));
    (out, tsval)
}

#[test]
fn timestamps_leave_on_the_node_clock_and_return_on_the_pods() {
    with_harness(|h| {
        h.enable_nat(61_000, 61_099);
        let (a, b) = (h.a, h.b);
        // Two connections whose own clocks are far apart (Linux gives each
        // a random offset): the server sees one clock, rising.
        let (_, first) = pod_segment_ts(h, a, 40_001, true, 3_000_000_000);
        let (_, again) = pod_segment_ts(h, a, 40_001, false, 3_000_000_007);
        assert_eq!(again.wrapping_sub(first), 7, "the flow's own pace is kept");
        std::thread::sleep(std::time::Duration::from_millis(20));
        let (_, second) = pod_segment_ts(h, b, 40_002, true, 5);
        let step = second.wrapping_sub(first) as i32;
        assert!(
            (20..2_000).contains(&step),
            "second connection's TSval {second} vs first {first}: {step} ms"
        );
        // The server echoes the first flow's TSval: the pod gets its own.
        let port = {
            let (out, _) = pod_segment_ts(h, a, 40_001, false, 3_000_000_009);
            be16(&out[34..36])
        };
        let echo = [
            &[1, 1, 8, 10][..],
            &77u32.to_be_bytes(),
            &again.to_be_bytes(),
        ]
        .concat();
        let reply = h.peer_frame(&tcp_with_options(
            OUTSIDE,
            NODE_IP,
            (443, port),
            0x10,
            &echo,
            b"y",
        ));
        let back = h.expect(
            program_names::FROM_UPLINK,
            &reply,
            h.uplink.0,
            TC_ACT_REDIRECT,
            Counter::RevSnat,
        );
        assert!(l4_checksum_ok(&back, 14), "TCP checksum after TSecr");
        assert_eq!(&back[58..62], &77u32.to_be_bytes(), "server's TSval kept");
        assert_eq!(
            &back[62..66],
            &3_000_000_007u32.to_be_bytes(),
            "TSecr back on the pod's clock"
        );
    });
}

/// A TCP segment from the outside host to `dst:port`, as it arrives on
/// the uplink.
fn from_outside(
    h: &Harness,
    dst: Ipv4Addr,
    sport: u16,
    port: u16,
    flags: u8,
    payload: &[u8],
) -> Vec<u8> {
    h.peer_frame(&tcp(OUTSIDE, dst, sport, port, flags, payload))
}

#[test]
fn hostport_hit_miss_and_reply() {
    with_harness(|h| {
        let a = h.a;
        h.put_hostport(8080, a, 80);
        let inbound = |dst: Ipv4Addr, port: u16| from_outside(h, dst, 50_000, port, 0x02, b"req");
        // Hit: to the pod, client address kept.
        let out = h.expect(
            program_names::FROM_UPLINK,
            &inbound(NODE_IP, 8080),
            h.uplink.0,
            TC_ACT_REDIRECT,
            Counter::FwdDnat,
        );
        assert_eq!(&out[0..6], &a.mac);
        assert_eq!(&out[26..30], &OUTSIDE.octets(), "client address kept");
        assert_eq!(&out[30..34], &a.ip.octets());
        assert_eq!(be16(&out[36..38]), 80);
        assert!(ipv4_checksum_ok(&out, 14));
        assert!(l4_checksum_ok(&out, 14));
        // Miss: another port, or an address that is not the node's.
        h.expect(
            program_names::FROM_UPLINK,
            &inbound(NODE_IP, 8081),
            h.uplink.0,
            TC_ACT_OK,
            Counter::UplinkPass,
        );
        h.expect(
            program_names::FROM_UPLINK,
            &inbound(Ipv4Addr::new(192, 168, 9, 99), 8080),
            h.uplink.0,
            TC_ACT_OK,
            Counter::UplinkPass,
        );
        // The pod's answer leaves as the node's hostPort.
        let answer = h.pod_frame(a, &tcp(a.ip, OUTSIDE, 80, 50_000, 0x12, b"resp"));
        let back = h.expect(
            program_names::FROM_POD,
            &answer,
            a.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::RevDnat,
        );
        assert_eq!(&back[26..30], &NODE_IP.octets());
        assert_eq!(be16(&back[34..36]), 8080);
        assert_eq!(&back[0..6], &PEER_MAC);
        assert!(ipv4_checksum_ok(&back, 14));
        assert!(l4_checksum_ok(&back, 14));

        // The client's path is narrower: fragmentation needed about the
        // answer as it left (node, hostPort) reaches the pod, translated.
        let frag_needed = icmp_error(OUTSIDE, NODE_IP, 4, &back[14..]);
        let error = h.peer_frame(&frag_needed);
        let got = h.expect(
            program_names::FROM_UPLINK,
            &error,
            h.uplink.0,
            TC_ACT_REDIRECT,
            Counter::FwdDnat,
        );
        assert_eq!(&got[0..6], &a.mac);
        assert_eq!(&got[30..34], &a.ip.octets(), "outer destination = pod");
        assert_eq!(&got[42 + 12..42 + 16], &a.ip.octets(), "quoted source");
        assert_eq!(be16(&got[62..64]), 80, "quoted source port");
        assert_eq!(&got[42 + 16..42 + 20], &OUTSIDE.octets());
        assert!(ipv4_checksum_ok(&got, 14));
        assert!(ipv4_checksum_ok(&got, 42), "quoted header checksum");
        assert_eq!(checksum(&got[34..]), 0, "ICMP checksum");

        // The pod refuses a packet that came through the hostPort: its
        // port unreachable leaves as the node, quoting the hostPort.
        let unreach = icmp_error(a.ip, OUTSIDE, 3, &out[14..]);
        let sent = h.expect(
            program_names::FROM_POD,
            &h.pod_frame(a, &unreach),
            a.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::RevDnat,
        );
        assert_eq!(&sent[0..6], &PEER_MAC);
        assert_eq!(&sent[26..30], &NODE_IP.octets(), "outer source = node");
        assert_eq!(&sent[42 + 16..42 + 20], &NODE_IP.octets(), "quoted dest");
        assert_eq!(be16(&sent[64..66]), 8080, "quoted destination port");
        assert!(ipv4_checksum_ok(&sent, 14));
        assert!(ipv4_checksum_ok(&sent, 42), "quoted header checksum");
        assert_eq!(checksum(&sent[34..]), 0, "ICMP checksum");
    });
}

/// An ICMP destination-unreachable (`code`, next-hop MTU 1430) from `src`
/// to `dst` quoting the IPv4 packet `about` (its header and first 8
/// bytes), checksums right.
fn icmp_error(src: Ipv4Addr, dst: Ipv4Addr, code: u8, about: &[u8]) -> Vec<u8> {
    ipv4(
        src,
        dst,
        IPPROTO_ICMP,
        icmp(3, code, [0, 0, 0x05, 0x96], quote(about)),
    )
}

/// An ICMP error of `kind` and `code` from `src` to `dst` quoting the IPv4
/// packet `about` (its header and first 8 bytes), TTL `ttl`, checksums
/// right.
fn icmp_about(
    (src, dst, ttl): (Ipv4Addr, Ipv4Addr, u8),
    (kind, code): (u8, u8),
    about: &[u8],
) -> Vec<u8> {
    Ipv4 {
        protocol: IPPROTO_ICMP,
        ttl,
        payload: icmp(kind, code, [0; 4], quote(about)),
        ..Ipv4::new(src, dst)
    }
    .bytes()
}

/// ICMP a pod sends toward the outside other than an echo request: an
/// error about a packet that reached it through one of its masqueraded
/// flows (port unreachable about a UDP answer, time exceeded about a TCP
/// one) leaves as the node — outer source, quoted destination address and
/// port translated, every checksum right: byte for byte the error the
/// node itself would send about what the remote sent it. Anything else —
/// an error about an unknown flow, about another pod's flow, one sent to
/// someone other than the quoted sender, one quoting an echo request, a
/// timestamp request — is dropped unchanged (`drop_nat_icmp_unknown`) and
/// creates no flow.
#[test]
fn icmp_a_pod_sends_about_its_flows_leaves_as_the_node_the_rest_not_at_all() {
    with_harness(|h| {
        h.enable_nat(62_000, 62_099);
        let (a, b) = (h.a, h.b);

        // A UDP flow out (53 → 53), and the remote's answer to its NAT
        // port as the pod receives it.
        let out = h.expect(
            program_names::FROM_POD,
            &h.ip_frame(a, &Ipv4::new(a.ip, OUTSIDE)),
            a.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::FwdSnat,
        );
        let udp_port = be16(&out[34..36]);
        let mut answer = Ipv4::new(OUTSIDE, NODE_IP);
        answer.payload[2..4].copy_from_slice(&udp_port.to_be_bytes());
        let answer = answer.bytes();
        let delivered = h.expect(
            program_names::FROM_UPLINK,
            &h.peer_frame(&answer),
            h.uplink.0,
            TC_ACT_REDIRECT,
            Counter::RevSnat,
        );
        assert_eq!(&delivered[30..34], &a.ip.octets());
        // A TCP flow out, and the server's SYN-ACK as the pod receives it.
        let out = h.expect(
            program_names::FROM_POD,
            &tcp_frame(h, a, 40_100, 0x02),
            a.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::FwdSnat,
        );
        let tcp_port = be16(&out[34..36]);
        let syn_ack = tcp(OUTSIDE, NODE_IP, 443, tcp_port, 0x12, b"");
        let delivered_tcp = h.expect(
            program_names::FROM_UPLINK,
            &h.peer_frame(&syn_ack),
            h.uplink.0,
            TC_ACT_REDIRECT,
            Counter::RevSnat,
        );
        // Another pod's flow.
        h.expect(
            program_names::FROM_POD,
            &h.ip_frame(b, &Ipv4::new(b.ip, OUTSIDE)),
            b.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::FwdSnat,
        );
        let entries = nat_entries(h);

        for (what, kind, about, remote_sent, port) in [
            (
                "port unreachable about a UDP answer",
                (3, 3),
                &delivered,
                &answer,
                udp_port,
            ),
            (
                "fragmentation needed about a UDP answer",
                (3, 4),
                &delivered,
                &answer,
                udp_port,
            ),
            (
                "time exceeded about a TCP answer",
                (11, 0),
                &delivered_tcp,
                &syn_ack,
                tcp_port,
            ),
        ] {
            let error = icmp_about((a.ip, OUTSIDE, 64), kind, &about[14..]);
            let sent = h.expect(
                program_names::FROM_POD,
                &h.pod_frame(a, &error),
                a.host_ifindex,
                TC_ACT_REDIRECT,
                Counter::FwdSnat,
            );
            assert_eq!(&sent[0..6], &PEER_MAC, "{what}: toward the remote");
            assert_eq!(&sent[6..12], &h.uplink.1, "{what}: from the uplink");
            assert_eq!(&sent[26..30], &NODE_IP.octets(), "{what}: outer source");
            assert_eq!(
                &sent[30..34],
                &OUTSIDE.octets(),
                "{what}: outer destination"
            );
            assert_eq!(sent[22], 63, "{what}: TTL − 1");
            assert_eq!((sent[34], sent[35]), kind, "{what}: type and code");
            assert_eq!(
                &sent[42 + 12..42 + 16],
                &OUTSIDE.octets(),
                "{what}: quoted source"
            );
            assert_eq!(
                &sent[42 + 16..42 + 20],
                &NODE_IP.octets(),
                "{what}: quoted destination = node"
            );
            assert_eq!(
                be16(&sent[62..64]),
                be16(&remote_sent[20..22]),
                "{what}: quoted source port"
            );
            assert_eq!(
                be16(&sent[64..66]),
                port,
                "{what}: quoted destination port = NAT port"
            );
            assert!(ipv4_checksum_ok(&sent, 14), "{what}: IP checksum");
            assert!(
                ipv4_checksum_ok(&sent, 42),
                "{what}: quoted header checksum"
            );
            assert_eq!(checksum(&sent[34..]), 0, "{what}: ICMP checksum");
            // What the node would say about what the remote sent it (the
            // quoted TTL is the one the pod saw: one router hop later).
            let remote_sent = edit_ipv4(remote_sent.to_vec(), |l3| l3[8] = 63);
            let expected = icmp_about((NODE_IP, OUTSIDE, 63), kind, &remote_sent);
            assert_eq!(&sent[14..], &expected[..], "{what}: byte for byte");
        }
        assert_eq!(nat_entries(h).len(), entries.len(), "errors create no flow");

        // An echo request, quoted by an error the pod sends back.
        let ping = ipv4(OUTSIDE, a.ip, IPPROTO_ICMP, icmp_query(8, 0x1234, 1, b""));
        // A timestamp request.
        let stamp = ipv4(a.ip, OUTSIDE, IPPROTO_ICMP, icmp_query(13, 1, 1, &[0; 12]));
        // What b's flow's answer looks like in b (53 → 53).
        let b_answer = Ipv4::new(OUTSIDE, b.ip);
        let unknown = Ipv4 {
            payload: vec![0, 53, 0x27, 0x0f, 0, 12, 0, 0, b'r', b'i', b'v', b't'],
            ..Ipv4::new(OUTSIDE, a.ip)
        };
        for (what, l3) in [
            (
                "port unreachable about an unknown flow",
                icmp_about((a.ip, OUTSIDE, 64), (3, 3), &unknown.bytes()),
            ),
            (
                "port unreachable about another pod's flow",
                icmp_about((a.ip, OUTSIDE, 64), (3, 3), &b_answer.bytes()),
            ),
            (
                "port unreachable about its flow, sent elsewhere",
                icmp_about((a.ip, ELSEWHERE, 64), (3, 3), &delivered[14..]),
            ),
            (
                "port unreachable quoting an echo request",
                icmp_about((a.ip, OUTSIDE, 64), (3, 3), &ping),
            ),
            ("timestamp request", stamp),
        ] {
            let f = h.pod_frame(a, &l3);
            let got = h.expect(
                program_names::FROM_POD,
                &f,
                a.host_ifindex,
                TC_ACT_SHOT,
                Counter::DropNatIcmpUnknown,
            );
            assert_eq!(got, f, "{what}: dropped unchanged");
        }
        assert_eq!(nat_entries(h).len(), entries.len(), "drops create no flow");
    });
}

/// Sets the per-pod NAT quota (flows; 0 = no limit), as the agent writes
/// `nat_max_per_pod`.
fn set_quota(h: &mut Harness, max_per_pod: u32) {
    let mut limits: aya::maps::Array<&mut MapData, rivet_common::NatLimits> =
        aya::maps::Array::try_from(h.ebpf.map_mut("NAT_LIMITS").expect("map")).expect("array");
    limits
        .set(0, rivet_common::NatLimits { max_per_pod }, 0)
        .expect("nat limits");
}

/// A pod's live flows as the datapath's quota sees them (running count +
/// the collector's correction).
fn pod_flows(h: &Harness, pod: PodSide) -> i64 {
    let map: HashMap<&MapData, rivet_common::NatPodKey, u64> =
        HashMap::try_from(h.ebpf.map("NAT_PODS").expect("map")).expect("hash");
    let get = |slot| {
        map.get(
            &rivet_common::NatPodKey {
                addr: ipv4_key(pod.ip.octets()),
                slot,
            },
            0,
        )
        .unwrap_or(0)
    };
    get(rivet_common::nat_pod_slot::FLOWS).wrapping_add(get(rivet_common::nat_pod_slot::ADJUST))
        as i64
}

/// The harness' NAT maps pinned in a private bpffs directory (removed on
/// drop, also when a test fails), so the agent's collector can open them.
struct Pins(std::path::PathBuf);

impl Pins {
    fn new(h: &Harness) -> Self {
        let dir =
            std::path::PathBuf::from(format!("/sys/fs/bpf/{}-natq", rivet_tests::unique_prefix()));
        std::fs::create_dir_all(&dir).expect("pin dir");
        let pins = Self(dir);
        for name in ["NAT", "NAT_STATS", "NAT_PODS"] {
            h.ebpf
                .map(name)
                .expect("map")
                .pin(pins.0.join(name))
                .expect("pin");
        }
        pins
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn per_pod_quota_refuses_new_flows_and_the_collector_gives_them_back() {
    with_harness(|h| {
        h.enable_nat(61_000, 61_099);
        set_quota(h, 3);
        let (a, b) = (h.a, h.b);
        for sport in 40_001..=40_003 {
            pod_segment(h, a, sport, 0x02, Counter::FwdSnat);
        }
        assert_eq!(pod_flows(h, a), 3);
        // The fourth flow of the same pod: refused, the packet unchanged
        // (checked by `expect`), nothing added to the table.
        pod_segment(h, a, 40_004, 0x02, Counter::DropNatQuota);
        assert_eq!(nat_entries(h).len(), 6, "three flows, two entries each");
        // An existing flow of that pod goes on.
        pod_segment(h, a, 40_001, 0x10, Counter::FwdSnat);
        // Another pod is not affected by this pod's quota.
        pod_segment(h, b, 40_001, 0x02, Counter::FwdSnat);
        assert_eq!(pod_flows(h, b), 1);
        // Two of a's flows leave the table the way the LRU evicts: the
        // datapath does not see it, the collector's recount does.
        let mut map: HashMap<&mut MapData, NatKey, NatEntry> =
            HashMap::try_from(h.ebpf.map_mut("NAT").expect("map")).expect("hash");
        for sport in [40_002u16, 40_003] {
            let k = NatKey::new(
                ipv4_key(a.ip.octets()),
                ipv4_key(OUTSIDE.octets()),
                (sport.to_be(), 443u16.to_be()),
                6,
                nat_dir::EGRESS,
            );
            map.remove(&k).expect("evict");
        }
        pod_segment(h, a, 40_004, 0x02, Counter::DropNatQuota);
        let pins = Pins::new(h);
        let timeouts = rivet::nat::Timeouts {
            tcp: 3600,
            udp: 60,
            closing: 10,
        };
        let mut collector =
            rivet::nat::Collector::open(&pins.0.join("NAT"), timeouts).expect("collector");
        // Now (nothing expires): the two orphaned reply entries are young,
        // a has one flow left.
        collector
            .collect(rivet::nat::monotonic_ns())
            .expect("collect");
        assert_eq!(pod_flows(h, a), 1, "recounted");
        assert_eq!(pod_flows(h, b), 1);
        assert_eq!(
            collector
                .pod_counts()
                .get(&ipv4_key(a.ip.octets()))
                .copied(),
            Some(1)
        );
        // a may open two more flows, not three.
        pod_segment(h, a, 40_004, 0x02, Counter::FwdSnat);
        pod_segment(h, a, 40_005, 0x02, Counter::FwdSnat);
        pod_segment(h, a, 40_006, 0x02, Counter::DropNatQuota);
        assert_eq!(pod_flows(h, a), 3);
        // 61 s later every unanswered flow has expired: both pods' counts
        // are gone and a may open flows again.
        collector
            .collect(rivet::nat::monotonic_ns() + 61_000_000_000)
            .expect("collect");
        assert_eq!(nat_entries(h).len(), 0, "everything expired");
        assert_eq!(pod_flows(h, a), 0);
        assert_eq!(pod_flows(h, b), 0);
        pod_segment(h, a, 40_006, 0x02, Counter::FwdSnat);
        assert_eq!(pod_flows(h, a), 1);
        // 0: no limit.
        set_quota(h, 0);
        for sport in 40_010..40_020 {
            pod_segment(h, a, sport, 0x02, Counter::FwdSnat);
        }
        drop(pins);
    });
}

#[test]
fn another_pods_unanswered_flow_gives_up_its_port_but_not_an_answered_one() {
    with_harness(|h| {
        // Two ports toward the server.
        h.enable_nat(61_000, 61_001);
        let (a, b) = (h.a, h.b);
        // a: a connection nobody answers; b: one the server answers.
        let pa = pod_segment(h, a, 40_001, 0x02, Counter::FwdSnat);
        let pb = pod_segment(h, b, 40_001, 0x02, Counter::FwdSnat);
        assert_ne!(pa, pb);
        h.expect(
            program_names::FROM_UPLINK,
            &server_frame(h, pb, 0x12),
            h.uplink.0,
            TC_ACT_REDIRECT,
            Counter::RevSnat,
        );
        // Young: nobody takes anything over yet.
        pod_segment(h, b, 40_002, 0x02, Counter::DropNatNoPort);
        pod_segment(h, a, 40_002, 0x02, Counter::DropNatNoPort);
        std::thread::sleep(std::time::Duration::from_millis(5_200));
        // a cannot recycle its own unanswered flow (a flood could keep the
        // range to itself), nor take b's answered one.
        pod_segment(h, a, 40_002, 0x02, Counter::DropNatNoPort);
        // b's new flow takes a's stale, unanswered port.
        assert_eq!(pod_segment(h, b, 40_002, 0x02, Counter::FwdSnat), pa);
        let entries = nat_entries(h);
        assert_eq!(entries.len(), 4, "b's two flows, nothing of a's");
        assert!(
            !entries
                .iter()
                .any(|(k, _)| k.src == ipv4_key(a.ip.octets())),
            "a's egress entry is gone"
        );
        assert_eq!(pod_flows(h, a), 0, "a's count went down");
        assert_eq!(pod_flows(h, b), 2);
        let stats: aya::maps::PerCpuArray<&MapData, u64> =
            aya::maps::PerCpuArray::try_from(h.ebpf.map("NAT_STATS").expect("map"))
                .expect("per-cpu");
        let taken: u64 = stats
            .get(&rivet_common::nat_stat::UNANSWERED_TAKEN, 0)
            .expect("slot")
            .iter()
            .sum();
        assert_eq!(taken, 1);
        // Replies on that port now reach b's new flow; b's answered flow
        // is intact.
        let reply = h.expect(
            program_names::FROM_UPLINK,
            &server_frame(h, pa, 0x12),
            h.uplink.0,
            TC_ACT_REDIRECT,
            Counter::RevSnat,
        );
        assert_eq!(&reply[30..34], &b.ip.octets());
        assert_eq!(be16(&reply[36..38]), 40_002);
        let reply = h.expect(
            program_names::FROM_UPLINK,
            &server_frame(h, pb, 0x10),
            h.uplink.0,
            TC_ACT_REDIRECT,
            Counter::RevSnat,
        );
        assert_eq!(be16(&reply[36..38]), 40_001);
        // a's retransmitted SYN (its old flow is gone) finds no port: both
        // are b's, answered or young.
        pod_segment(h, a, 40_001, 0x02, Counter::DropNatNoPort);
    });
}

/// A hostPort connection that ended, whose entry the collector has decided
/// to remove, used again by the client (the same four-tuple: a TIME_WAIT
/// port reused) before the removal: the entry stays and the new
/// connection's answers still leave as the hostPort. (The race that hung a
/// benchmark's client: the removed entry left the new connection's answer
/// untranslated, masqueraded instead, and the client reset the pod.) An
/// ended connection nobody reused is removed as before.
#[test]
fn collector_spares_an_entry_used_again_after_its_decision() {
    with_harness(|h| {
        let a = h.a;
        h.put_hostport(8080, a, 80);
        let inbound = |sport: u16, flags: u8| from_outside(h, NODE_IP, sport, 8080, flags, b"");
        let answer =
            |sport: u16, flags: u8| h.pod_frame(a, &tcp(a.ip, OUTSIDE, 80, sport, flags, b""));
        // Two connections, each SYN, SYN-ACK, then FIN both ways.
        for sport in [50_000, 50_001] {
            for (from_client, flags) in [(true, 0x02), (false, 0x12), (true, 0x11), (false, 0x11)] {
                if from_client {
                    h.expect(
                        program_names::FROM_UPLINK,
                        &inbound(sport, flags),
                        h.uplink.0,
                        TC_ACT_REDIRECT,
                        Counter::FwdDnat,
                    );
                } else {
                    h.expect(
                        program_names::FROM_POD,
                        &answer(sport, flags),
                        a.host_ifindex,
                        TC_ACT_REDIRECT,
                        Counter::RevDnat,
                    );
                }
            }
        }
        let dnat_ports = |h: &Harness| -> Vec<u16> {
            let mut p: Vec<u16> = nat_entries(h)
                .into_iter()
                .filter(|(k, _)| k.dir == nat_dir::DNAT)
                .map(|(k, _)| u16::from_be(k.dport))
                .collect();
            p.sort_unstable();
            p
        };
        assert_eq!(dnat_ports(h), vec![50_000, 50_001]);
        let pins = Pins::new(h);
        let timeouts = rivet::nat::Timeouts {
            tcp: 3600,
            udp: 60,
            closing: 10,
        };
        let mut collector =
            rivet::nat::Collector::open(&pins.0.join("NAT"), timeouts).expect("collector");
        // 61 s on, both ended connections are past the closing timeout;
        // between the decision and the removals the client opens a new
        // connection from port 50,000.
        let stats = collector
            .collect_with(rivet::nat::monotonic_ns() + 61_000_000_000, || {
                h.expect(
                    program_names::FROM_UPLINK,
                    &inbound(50_000, 0x02),
                    h.uplink.0,
                    TC_ACT_REDIRECT,
                    Counter::FwdDnat,
                );
            })
            .expect("collect");
        assert_eq!(stats.spared, 1, "{stats:?}");
        assert_eq!(stats.expired, 1, "{stats:?}");
        assert_eq!(dnat_ports(h), vec![50_000], "the reused entry stays");
        // The new connection's answer leaves as the node's hostPort.
        let back = h.expect(
            program_names::FROM_POD,
            &answer(50_000, 0x12),
            a.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::RevDnat,
        );
        assert_eq!(&back[26..30], &NODE_IP.octets());
        assert_eq!(be16(&back[34..36]), 8080);
        drop(pins);
    });
}
