//! Malformed packets: one table, every row run through every entry program
//! with BPF_PROG_TEST_RUN.
//!
//! Each row is a frame and, per program (`from_pod` on pod A's host veth,
//! `from_uplink` on the uplink, `from_host` on `rivet_host`), the expected
//! outcome: a TC verdict and the one counter that moves (by exactly one),
//! or the kernel's refusal to run the program at all. On a drop the output
//! must equal the input; a pass (`TC_ACT_OK`) must leave the packet
//! untouched too (what is not rivet's reaches the stack as it came).
//!
//! The frame of a row is the same bytes after the Ethernet header for every
//! program; the Ethernet header is the one the program's device receives
//! (pod A → its host veth; the peer node → our uplink's MAC, so the kernel
//! classifies it `PACKET_HOST`; the node's stack → `rivet_host`).
//!
//! The node is set up as an agent would: VXLAN route to the peer node
//! (10.9.2.0/24), masquerade on, a hostPort (TCP 8080 → pod B:80), and an
//! outside network (198.51.100.0/24) routed through the peer.
//!
//! Kernel limits of BPF_PROG_TEST_RUN on 6.18: frames under 14 bytes and
//! IPv4 frames under 34 bytes (a cut IPv4 header) are refused with EINVAL
//! before any program runs. Those rows expect exactly that refusal; the
//! programs' own handling of short IPv4 frames is exercised for real, over
//! a veth, in `short_and_vlan_frames_over_a_real_veth`, and truncation
//! beyond the kernel's limit in the table with ARP/unknown ethertypes and
//! with total-length and IHL lies.

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    time::{Duration, Instant},
};

use aya::{
    maps::{Array, MapData},
    programs::{SchedClassifier, TcAttachType},
};
use rivet_common::{Counter, NodeConfig, program_names, route_mode};
use rivet_tests::{
    packet::{
        ETH_P_ARP, ETH_P_IP, ETH_P_IPV6, IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_UDP, Ipv4, Tcp, arp,
        be16, checksum, edit_ipv4, eth, frame, icmp, icmp_query, ipv4, ipv4_checksum_ok, ipv6,
        quote, set_frag, set_total_len, truncate_ipv4,
    },
    progtest::*,
    raw::RawSocket,
};

const REMOTE_POD: Ipv4Addr = Ipv4Addr::new(10, 9, 2, 5);
/// Outside the cluster, routed through the peer: masqueraded.
const OUTSIDE: Ipv4Addr = ELSEWHERE;
/// Outside the cluster, no route.
const UNROUTABLE: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 9);
const UNKNOWN_NODE: Ipv4Addr = Ipv4Addr::new(192, 168, 9, 99);
const HOST_PORT: u16 = 8080;
const NAT_MIN: u16 = 61_000;
const NAT_MAX: u16 = 61_999;
/// MACs of `rivet_host` and its peer (from_host ignores them).
const HOST_SRC: [u8; 6] = [0x0e, 0x72, 0, 0, 0, 1];
const HOST_DST: [u8; 6] = [0x0e, 0x72, 0, 0, 0, 2];
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
const ETH_P_LLDP: u16 = 0x88cc;
/// An IPv6 address of all-ones bytes (0101:…:0101).
const ONES: Ipv6Addr = Ipv6Addr::new(0x101, 0x101, 0x101, 0x101, 0x101, 0x101, 0x101, 0x101);

/// What a program must do with a row's frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Want {
    /// BPF_PROG_TEST_RUN refuses the frame (EINVAL) before the program
    /// runs; nothing is counted.
    Refused,
    /// This TC verdict, and exactly this counter moves by one.
    Is(u32, Counter),
}

const REFUSED: Want = Want::Refused;

const fn drop(c: Counter) -> Want {
    Want::Is(TC_ACT_SHOT, c)
}

const fn pass(c: Counter) -> Want {
    Want::Is(TC_ACT_OK, c)
}

const fn redirect(c: Counter) -> Want {
    Want::Is(TC_ACT_REDIRECT, c)
}

/// A row's frame.
enum Frame {
    /// These bytes, as they are, for every program.
    Raw(Vec<u8>),
    /// An ethertype and the bytes after the Ethernet header; each program
    /// gets the Ethernet header its device would receive.
    Eth(u16, Vec<u8>),
}

/// Extra check of `from_pod`'s output (input, output).
type OutCheck = fn(&[u8], &[u8]);

struct Row {
    name: &'static str,
    frame: Frame,
    pod: Want,
    uplink: Want,
    host: Want,
    pod_out: Option<OutCheck>,
}

fn row(name: &'static str, frame: Frame, [pod, uplink, host]: [Want; 3]) -> Row {
    Row {
        name,
        frame,
        pod,
        uplink,
        host,
        pod_out: None,
    }
}

fn ip4(body: Vec<u8>) -> Frame {
    Frame::Eth(ETH_P_IP, body)
}

/// `l3` followed by zeros up to a 60-byte frame (Ethernet padding).
fn padded(mut l3: Vec<u8>) -> Vec<u8> {
    l3.resize(46, 0);
    l3
}

fn arp_body(op: u16, spa: Ipv4Addr, tpa: Ipv4Addr, a: PodSide) -> Vec<u8> {
    arp(op, a.mac, spa, [0; 6], tpa)
}

/// The L3 part of a VXLAN packet from `src` carrying `inner`, lengths
/// consistent with what is carried.
fn vxlan(h: &Harness, src: Ipv4Addr, inner: &[u8]) -> Vec<u8> {
    h.vxlan_frame(src, VNI, VXLAN_PORT, inner)[14..].to_vec()
}

fn ipip(h: &Harness, inner: &[u8]) -> Vec<u8> {
    h.ipip_frame(PEER_IP, inner)[14..].to_vec()
}

/// Masqueraded with the IPv4 options kept: source port rewritten at the
/// real transport offset (after the 8 option bytes), destination port
/// untouched.
fn options_kept_through_nat(input: &[u8], out: &[u8]) {
    assert_eq!(out[14], 0x47, "IHL 7 kept");
    assert_eq!(&out[34..42], &input[34..42], "options unchanged");
    assert_eq!(&out[26..30], &NODE_IP.octets(), "source = node IP");
    let port = be16(&out[42..44]);
    assert!((NAT_MIN..=NAT_MAX).contains(&port), "NAT port {port}");
    assert_eq!(&out[44..46], &input[44..46], "destination port");
}

/// A pod's ICMP port unreachable to `dst` quoting `about` as given.
fn unreachable(src: Ipv4Addr, dst: Ipv4Addr, about: &[u8]) -> Vec<u8> {
    ipv4(src, dst, IPPROTO_ICMP, icmp(3, 3, [0; 4], about))
}

/// A TCP header (no options), checksum left zero (rivet only ever updates
/// it incrementally).
fn tcp_hdr(sport: u16, dport: u16, flags: u8) -> Vec<u8> {
    Tcp::new(sport, dport, flags).bytes()
}

/// What reached pod A as the server's SYN-ACK on the masqueraded flow of
/// the "TCP SYN to the outside" row (443 → 40001), as an ICMP error quotes
/// it: the IPv4 header and 8 bytes.
fn synack_to_a(a: PodSide) -> Vec<u8> {
    quote(&ipv4(
        OUTSIDE,
        a.ip,
        IPPROTO_TCP,
        tcp_hdr(443, 40_001, 0x12),
    ))
    .to_vec()
}

/// An error about a masqueraded flow leaves as the node: outer source,
/// quoted destination address and port (the flow's NAT port) translated,
/// the quoted header's and the ICMP checksum right.
fn error_leaves_as_the_node(input: &[u8], out: &[u8]) {
    assert_eq!(&out[26..30], &NODE_IP.octets(), "outer source = node IP");
    assert_eq!(&out[30..34], &OUTSIDE.octets(), "outer destination");
    assert_eq!(&out[34..36], &input[34..36], "type and code");
    assert_eq!(&out[42 + 12..42 + 16], &OUTSIDE.octets(), "quoted source");
    assert_eq!(
        &out[42 + 16..42 + 20],
        &NODE_IP.octets(),
        "quoted destination"
    );
    assert_eq!(be16(&out[62..64]), 443, "quoted source port");
    let port = be16(&out[64..66]);
    assert!(
        (NAT_MIN..=NAT_MAX).contains(&port),
        "quoted NAT port {port}"
    );
    assert!(ipv4_checksum_ok(out, 42), "quoted header checksum");
    assert_eq!(checksum(&out[34..]), 0, "ICMP checksum");
}

#[expect(
    clippy::too_many_lines,
    reason = "the table: one entry per malformed-packet case"
)]
fn table(h: &Harness) -> Vec<Row> {
    use Counter::*;
    let (a, b) = (h.a, h.b);
    let udp = |src, dst| Ipv4::new(src, dst).bytes();
    let good = udp(a.ip, REMOTE_POD);
    let inner = udp(REMOTE_POD, b.ip);
    let echo = |kind| icmp_query(kind, 7, 1, b"ping");
    let arp_req = arp_body(1, a.ip, GATEWAY, a);
    let to_remote_pod = [
        redirect(FwdEncapVxlan),
        pass(UplinkPass),
        redirect(FwdEncapVxlan),
    ];
    let bad_header = [
        drop(DropBadIpHeader),
        pass(UplinkPass),
        drop(DropBadIpHeader),
    ];
    let pod_drop = |c| [drop(c), pass(UplinkPass), pass(HostPass)];
    let pod_pass = |c| [pass(c), pass(UplinkPass), pass(HostPass)];
    // A frame from a node: the pod program sees a spoofed source.
    let tunnel = |c| [drop(DropSpoofedIp), c, pass(HostPass)];
    let vxlan_malformed = tunnel(drop(DropTunnelMalformed));
    vec![
        // --- frame sizes -------------------------------------------------
        row("0-byte frame", Frame::Raw(vec![]), [REFUSED; 3]),
        row(
            "13-byte frame",
            Frame::Raw(eth(a.host_mac, a.mac, ETH_P_IP)[..13].to_vec()),
            [REFUSED; 3],
        ),
        row("14-byte IPv4 frame (no header)", ip4(vec![]), [REFUSED; 3]),
        row("20-byte IPv4 frame", ip4(good[..6].to_vec()), [REFUSED; 3]),
        row(
            "33-byte IPv4 frame (header 1 byte short)",
            ip4(good[..19].to_vec()),
            [REFUSED; 3],
        ),
        row(
            "14-byte ARP frame (no body)",
            Frame::Eth(ETH_P_ARP, vec![]),
            pod_drop(DropTruncated),
        ),
        row(
            "20-byte ARP frame",
            Frame::Eth(ETH_P_ARP, arp_req[..6].to_vec()),
            pod_drop(DropTruncated),
        ),
        row(
            "41-byte ARP frame (1 byte short)",
            Frame::Eth(ETH_P_ARP, arp_req[..27].to_vec()),
            pod_drop(DropTruncated),
        ),
        row(
            "34-byte IPv4 frame: UDP header missing",
            ip4(edit_ipv4(good[..20].to_vec(), |l3| set_total_len(l3, 20))),
            [drop(DropTruncated), pass(UplinkPass), drop(DropTruncated)],
        ),
        // --- other ethertypes --------------------------------------------
        row(
            "14-byte frame, unknown ethertype (LLDP)",
            Frame::Eth(ETH_P_LLDP, vec![]),
            pod_drop(DropUnsupportedL3),
        ),
        row(
            "unknown ethertype 0x88b5 with a payload",
            Frame::Eth(0x88b5, good.clone()),
            pod_drop(DropUnsupportedL3),
        ),
        row(
            "802.3 length field (LLC frame)",
            Frame::Eth(0x002e, vec![0x42; 46]),
            pod_drop(DropUnsupportedL3),
        ),
        row(
            "IPv6",
            Frame::Eth(ETH_P_IPV6, ipv6(ONES, ONES, IPPROTO_UDP, 64, &[1; 8])),
            pod_drop(DropUnsupportedL3),
        ),
        row(
            "802.1Q VLAN-tagged IPv4",
            Frame::Eth(ETH_P_8021Q, [&[0x00, 0x64, 0x08, 0x00][..], &good].concat()),
            pod_drop(DropUnsupportedL3),
        ),
        row(
            "802.1ad QinQ-tagged IPv4",
            Frame::Eth(
                ETH_P_8021AD,
                [&[0x00, 0x64, 0x81, 0x00, 0x00, 0x65, 0x08, 0x00][..], &good].concat(),
            ),
            pod_drop(DropUnsupportedL3),
        ),
        // --- ARP variants --------------------------------------------------
        row(
            "ARP request for the gateway",
            Frame::Eth(ETH_P_ARP, arp_req.clone()),
            [redirect(ArpReply), pass(UplinkPass), pass(HostPass)],
        ),
        row(
            "ARP request for the gateway, padded to 60 bytes",
            Frame::Eth(ETH_P_ARP, padded(arp_req.clone())),
            [redirect(ArpReply), pass(UplinkPass), pass(HostPass)],
        ),
        row(
            "ARP reply to the node",
            Frame::Eth(ETH_P_ARP, arp(2, a.mac, a.ip, a.host_mac, NODE_IP)),
            pod_pass(ArpPass),
        ),
        row(
            "ARP op 3 (RARP request)",
            Frame::Eth(ETH_P_ARP, arp_body(3, a.ip, GATEWAY, a)),
            pod_drop(DropArpUnsupported),
        ),
        row(
            "ARP hardware type 6 (IEEE 802)",
            Frame::Eth(ETH_P_ARP, {
                let mut v = arp_req.clone();
                v[1] = 6;
                v
            }),
            pod_drop(DropArpUnsupported),
        ),
        row(
            "ARP protocol type IPv6",
            Frame::Eth(ETH_P_ARP, {
                let mut v = arp_req.clone();
                v[2..4].copy_from_slice(&ETH_P_IPV6.to_be_bytes());
                v
            }),
            pod_drop(DropArpUnsupported),
        ),
        row(
            "ARP address lengths 8/16",
            Frame::Eth(ETH_P_ARP, {
                let mut v = arp_req.clone();
                v[4] = 8;
                v[5] = 16;
                v
            }),
            pod_drop(DropArpUnsupported),
        ),
        row(
            "ARP request for another pod",
            Frame::Eth(ETH_P_ARP, arp_body(1, a.ip, b.ip, a)),
            pod_drop(DropArpUnsupported),
        ),
        row(
            "gratuitous ARP",
            Frame::Eth(ETH_P_ARP, arp_body(1, a.ip, a.ip, a)),
            pod_drop(DropArpSpoofed),
        ),
        row(
            "ARP with another pod's sender address",
            Frame::Eth(ETH_P_ARP, arp_body(1, b.ip, GATEWAY, a)),
            pod_drop(DropArpSpoofed),
        ),
        // --- IPv4 header ---------------------------------------------------
        row(
            "valid UDP to a remote pod (baseline)",
            ip4(good.clone()),
            to_remote_pod,
        ),
        row(
            "version 6 in an IPv4 frame",
            ip4(edit_ipv4(good.clone(), |l3| l3[0] = 0x65)),
            bad_header,
        ),
        row(
            "IHL 0",
            ip4(edit_ipv4(good.clone(), |l3| l3[0] = 0x40)),
            bad_header,
        ),
        row(
            "IHL 4",
            ip4(edit_ipv4(good.clone(), |l3| l3[0] = 0x44)),
            bad_header,
        ),
        row(
            "IHL 15: header beyond the packet",
            ip4(edit_ipv4(good.clone(), |l3| l3[0] = 0x4f)),
            bad_header,
        ),
        row(
            "IHL 6 in a 20-byte datagram",
            ip4(edit_ipv4(good[..20].to_vec(), |l3| {
                l3[0] = 0x46;
                set_total_len(l3, 20);
            })),
            bad_header,
        ),
        row(
            "total length beyond the frame",
            ip4(edit_ipv4(good.clone(), |l3| set_total_len(l3, 1500))),
            bad_header,
        ),
        row(
            "total length 1 byte beyond the frame",
            ip4(edit_ipv4(good.clone(), |l3| {
                set_total_len(l3, good.len() + 1)
            })),
            bad_header,
        ),
        row(
            "total length smaller than the header",
            ip4(edit_ipv4(good.clone(), |l3| set_total_len(l3, 12))),
            bad_header,
        ),
        row(
            "total length 0",
            ip4(edit_ipv4(good.clone(), |l3| set_total_len(l3, 0))),
            bad_header,
        ),
        row(
            "total length shorter than the frame (trailing bytes)",
            ip4([&good[..], &[0xee; 40][..]].concat()),
            to_remote_pod,
        ),
        row(
            "Ethernet padding after a short datagram",
            ip4(padded(good.clone())),
            to_remote_pod,
        ),
        row(
            "IPv4 options (NOP NOP NOP EOL)",
            ip4(Ipv4 {
                options: vec![1, 1, 1, 0],
                ..Ipv4::new(a.ip, REMOTE_POD)
            }
            .bytes()),
            to_remote_pod,
        ),
        row(
            "40 bytes of IPv4 options (IHL 15) to a local pod",
            ip4(Ipv4 {
                options: [vec![1; 39], vec![0]].concat(),
                ..Ipv4::new(a.ip, b.ip)
            }
            .bytes()),
            [redirect(FwdLocal), pass(UplinkPass), pass(HostPass)],
        ),
        Row {
            pod_out: Some(options_kept_through_nat),
            ..row(
                "IPv4 options (record route) to the outside (NAT)",
                ip4(Ipv4 {
                    options: vec![7, 7, 4, 0, 0, 0, 0, 0],
                    ..Ipv4::new(a.ip, OUTSIDE)
                }
                .bytes()),
                [redirect(FwdSnat), pass(UplinkPass), pass(HostPass)],
            )
        },
        row(
            "UDP to the outside without a route (NAT)",
            ip4(udp(a.ip, UNROUTABLE)),
            pod_drop(DropNoRoute),
        ),
        // --- transport headers ---------------------------------------------
        row(
            "TCP header cut (10 of 20 bytes) to a local pod",
            ip4(ipv4(
                a.ip,
                b.ip,
                IPPROTO_TCP,
                tcp_hdr(40_000, 80, 0x02)[..10].to_vec(),
            )),
            pod_drop(DropTruncated),
        ),
        row(
            "TCP options cut (data offset 15, 20 bytes carried) to a remote pod",
            ip4(ipv4(a.ip, REMOTE_POD, IPPROTO_TCP, {
                let mut t = tcp_hdr(40_000, 80, 0x02);
                t[12] = 15 << 4;
                t
            })),
            [drop(DropTruncated), pass(UplinkPass), drop(DropTruncated)],
        ),
        row(
            "TCP SYN to the outside (NAT, baseline)",
            ip4(ipv4(a.ip, OUTSIDE, IPPROTO_TCP, tcp_hdr(40_001, 443, 0x02))),
            [redirect(FwdSnat), pass(UplinkPass), pass(HostPass)],
        ),
        row(
            "UDP header cut (4 of 8 bytes) to the outside (NAT)",
            ip4(ipv4(a.ip, OUTSIDE, IPPROTO_UDP, vec![0, 53, 0, 53])),
            pod_drop(DropTruncated),
        ),
        row(
            "UDP header cut, Ethernet padding where the header would be (NAT)",
            ip4(padded(ipv4(a.ip, OUTSIDE, IPPROTO_UDP, vec![0, 54, 0, 53]))),
            pod_drop(DropTruncated),
        ),
        row(
            "ICMP echo request cut (4 of 8 bytes) to the outside (NAT)",
            ip4(ipv4(a.ip, OUTSIDE, IPPROTO_ICMP, echo(8)[..4].to_vec())),
            pod_drop(DropTruncated),
        ),
        row(
            "ICMP echo request to the outside (NAT, baseline)",
            ip4(ipv4(a.ip, OUTSIDE, IPPROTO_ICMP, echo(8))),
            [redirect(FwdSnat), pass(UplinkPass), pass(HostPass)],
        ),
        Row {
            pod_out: Some(error_leaves_as_the_node),
            ..row(
                "ICMP port unreachable about a masqueraded flow's answer (NAT, baseline)",
                ip4(unreachable(a.ip, OUTSIDE, &synack_to_a(a))),
                [redirect(FwdSnat), pass(UplinkPass), pass(HostPass)],
            )
        },
        row(
            "ICMP port unreachable about an unknown flow to the outside (NAT)",
            ip4(unreachable(
                a.ip,
                OUTSIDE,
                quote(&ipv4(
                    OUTSIDE,
                    a.ip,
                    IPPROTO_TCP,
                    tcp_hdr(443, 40_999, 0x12),
                )),
            )),
            pod_drop(DropNatIcmpUnknown),
        ),
        row(
            "ICMP port unreachable, quoted header cut to 12 bytes (NAT)",
            ip4(unreachable(a.ip, OUTSIDE, &synack_to_a(a)[..12])),
            pod_drop(DropNatIcmpUnknown),
        ),
        row(
            "ICMP port unreachable, quoted ports missing (NAT)",
            ip4(unreachable(a.ip, OUTSIDE, &synack_to_a(a)[..20])),
            pod_drop(DropNatIcmpUnknown),
        ),
        row(
            "ICMP port unreachable, quoted IHL 4 (NAT)",
            ip4(unreachable(a.ip, OUTSIDE, &{
                let mut q = synack_to_a(a);
                q[0] = 0x44;
                q
            })),
            pod_drop(DropNatIcmpUnknown),
        ),
        row(
            "ICMP echo reply to the outside (NAT)",
            ip4(ipv4(a.ip, OUTSIDE, IPPROTO_ICMP, echo(0))),
            pod_drop(DropNatIcmpUnknown),
        ),
        row(
            "TCP SYN to a hostPort (baseline)",
            ip4(ipv4(
                a.ip,
                NODE_IP,
                IPPROTO_TCP,
                tcp_hdr(40_002, HOST_PORT, 0x02),
            )),
            [redirect(FwdDnat), redirect(FwdDnat), pass(HostPass)],
        ),
        row(
            "TCP to a hostPort, header cut to the ports, padding after",
            ip4(padded(ipv4(
                a.ip,
                NODE_IP,
                IPPROTO_TCP,
                tcp_hdr(40_003, HOST_PORT, 0x02)[..4].to_vec(),
            ))),
            pod_drop(DropTruncated),
        ),
        row(
            "UDP to the node's NAT range, header cut to the ports, padding after",
            ip4(padded(ipv4(
                a.ip,
                NODE_IP,
                IPPROTO_UDP,
                [&53u16.to_be_bytes()[..], &NAT_MIN.to_be_bytes()].concat(),
            ))),
            pod_drop(DropTruncated),
        ),
        // --- routed natively from a remote pod subnet ------------------------
        row(
            "remote pod to a local pod, native (baseline)",
            ip4(udp(REMOTE_POD, b.ip)),
            [drop(DropSpoofedIp), redirect(FwdFromPeer), pass(HostPass)],
        ),
        row(
            "remote pod to a local pod, native, IHL 4",
            ip4(edit_ipv4(udp(REMOTE_POD, b.ip), |l3| l3[0] = 0x44)),
            [drop(DropBadIpHeader), drop(DropBadIpHeader), pass(HostPass)],
        ),
        row(
            "remote pod to a local pod, native, total length beyond the frame",
            ip4(edit_ipv4(udp(REMOTE_POD, b.ip), |l3| {
                set_total_len(l3, 200)
            })),
            [drop(DropBadIpHeader), drop(DropBadIpHeader), pass(HostPass)],
        ),
        row(
            "remote pod to a local pod, native, UDP header cut",
            ip4(ipv4(REMOTE_POD, b.ip, IPPROTO_UDP, vec![0, 53, 0, 53])),
            [drop(DropTruncated), drop(DropTruncated), pass(HostPass)],
        ),
        row(
            "remote pod to the node, native (baseline)",
            ip4(udp(REMOTE_POD, NODE_IP)),
            [drop(DropSpoofedIp), redirect(DeliverHost), pass(HostPass)],
        ),
        row(
            "remote pod to the node, native, total length 0",
            ip4(edit_ipv4(udp(REMOTE_POD, NODE_IP), |l3| {
                set_total_len(l3, 0)
            })),
            [drop(DropBadIpHeader), drop(DropBadIpHeader), pass(HostPass)],
        ),
        // --- fragments -------------------------------------------------------
        row(
            "first fragment to the outside (NAT)",
            ip4(edit_ipv4(udp(a.ip, OUTSIDE), |l3| set_frag(l3, true, 0))),
            pod_drop(DropNatUnsupported),
        ),
        row(
            "middle fragment to the outside (NAT)",
            ip4(edit_ipv4(udp(a.ip, OUTSIDE), |l3| set_frag(l3, true, 1480))),
            pod_drop(DropNatUnsupported),
        ),
        row(
            "last fragment to the outside (NAT)",
            ip4(edit_ipv4(udp(a.ip, OUTSIDE), |l3| {
                set_frag(l3, false, 1480)
            })),
            pod_drop(DropNatUnsupported),
        ),
        row(
            "first fragment to a local pod",
            ip4(edit_ipv4(udp(a.ip, b.ip), |l3| set_frag(l3, true, 0))),
            [redirect(FwdLocal), pass(UplinkPass), pass(HostPass)],
        ),
        row(
            "middle TCP fragment (8 bytes, no TCP header) to a remote pod",
            ip4(edit_ipv4(
                ipv4(a.ip, REMOTE_POD, IPPROTO_TCP, vec![0x55; 8]),
                |l3| {
                    set_frag(l3, true, 1480);
                },
            )),
            to_remote_pod,
        ),
        row(
            "last fragment to a local pod",
            ip4(edit_ipv4(udp(a.ip, b.ip), |l3| set_frag(l3, false, 8))),
            [redirect(FwdLocal), pass(UplinkPass), pass(HostPass)],
        ),
        row(
            "first fragment with a cut TCP header (tiny fragment)",
            ip4(edit_ipv4(
                ipv4(
                    a.ip,
                    b.ip,
                    IPPROTO_TCP,
                    tcp_hdr(40_004, 80, 0x02)[..8].to_vec(),
                ),
                |l3| set_frag(l3, true, 0),
            )),
            pod_drop(DropTruncated),
        ),
        row(
            "last UDP fragment to the node, payload bytes like the VXLAN port",
            ip4(edit_ipv4(
                ipv4(
                    a.ip,
                    NODE_IP,
                    IPPROTO_UDP,
                    [&[0x12, 0x34][..], &VXLAN_PORT.to_be_bytes(), &[0; 12]].concat(),
                ),
                |l3| set_frag(l3, false, 8),
            )),
            pod_pass(PassHost),
        ),
        row(
            "last fragment from the peer to the node, payload like the VXLAN port",
            ip4(edit_ipv4(
                ipv4(
                    PEER_IP,
                    NODE_IP,
                    IPPROTO_UDP,
                    [&[0x12, 0x34][..], &VXLAN_PORT.to_be_bytes(), &[0; 12]].concat(),
                ),
                |l3| set_frag(l3, false, 8),
            )),
            tunnel(pass(UplinkPass)),
        ),
        row(
            "VXLAN first fragment from the peer",
            ip4(edit_ipv4(vxlan(h, PEER_IP, &inner), |l3| {
                set_frag(l3, true, 0)
            })),
            vxlan_malformed,
        ),
        row(
            "IPIP middle fragment from the peer",
            ip4(edit_ipv4(ipip(h, &inner), |l3| set_frag(l3, true, 1480))),
            vxlan_malformed,
        ),
        // --- other IP protocols ------------------------------------------
        row(
            "GRE to the node",
            ip4(ipv4(a.ip, NODE_IP, 47, vec![0, 0, 0x08, 0, 0x45, 0, 0, 20])),
            pod_pass(PassHost),
        ),
        row(
            "ESP to the node",
            ip4(ipv4(
                a.ip,
                NODE_IP,
                50,
                vec![0, 0, 1, 0, 0, 0, 0, 1, 0xaa, 0xbb],
            )),
            pod_pass(PassHost),
        ),
        row(
            "GRE to the outside (NAT)",
            ip4(ipv4(a.ip, OUTSIDE, 47, vec![0, 0, 0x08, 0, 0x45, 0, 0, 20])),
            pod_drop(DropNatUnsupported),
        ),
        row(
            "ESP to a remote pod",
            ip4(ipv4(a.ip, REMOTE_POD, 50, vec![0, 0, 1, 0, 0, 0, 0, 1])),
            to_remote_pod,
        ),
        row(
            "GRE from the peer to the node (the node's own tunnel)",
            ip4(ipv4(
                PEER_IP,
                NODE_IP,
                47,
                vec![0, 0, 0x08, 0, 0x45, 0, 0, 20],
            )),
            tunnel(pass(UplinkPass)),
        ),
        row(
            "ESP from the peer to the node (the node's own IPsec)",
            ip4(ipv4(PEER_IP, NODE_IP, 50, vec![0, 0, 1, 0, 0, 0, 0, 1])),
            tunnel(pass(UplinkPass)),
        ),
        // --- tunnels ---------------------------------------------------------
        row(
            "VXLAN from the peer (baseline)",
            ip4(vxlan(h, PEER_IP, &inner)),
            tunnel(redirect(DecapVxlan)),
        ),
        row(
            "VXLAN, inner total length beyond the packet",
            ip4(vxlan(
                h,
                PEER_IP,
                &edit_ipv4(inner.clone(), |l3| set_total_len(l3, inner.len() + 6)),
            )),
            vxlan_malformed,
        ),
        row(
            "VXLAN, inner IPv4 header cut (10 bytes)",
            ip4(vxlan(h, PEER_IP, &inner[..10])),
            vxlan_malformed,
        ),
        row(
            "VXLAN, inner IHL 4",
            ip4(vxlan(
                h,
                PEER_IP,
                &edit_ipv4(inner.clone(), |l3| l3[0] = 0x44),
            )),
            vxlan_malformed,
        ),
        row(
            "VXLAN, inner Ethernet only (no inner packet)",
            ip4(vxlan(h, PEER_IP, &[])),
            vxlan_malformed,
        ),
        row(
            "VXLAN, inner Ethernet cut",
            ip4(truncate_ipv4(vxlan(h, PEER_IP, &inner), 20 + 8 + 8 + 6)),
            vxlan_malformed,
        ),
        row(
            "VXLAN header cut (4 of 8 bytes)",
            ip4(truncate_ipv4(vxlan(h, PEER_IP, &inner), 20 + 8 + 4)),
            vxlan_malformed,
        ),
        row(
            "UDP header cut (4 bytes) to the VXLAN port",
            ip4(truncate_ipv4(vxlan(h, PEER_IP, &inner), 20 + 4)),
            [
                drop(DropTruncated),
                drop(DropTunnelMalformed),
                pass(HostPass),
            ],
        ),
        row(
            "VXLAN, inner ARP",
            ip4(edit_ipv4(
                vxlan(h, PEER_IP, &arp_body(1, REMOTE_POD, b.ip, a)),
                |l3| l3[48..50].copy_from_slice(&ETH_P_ARP.to_be_bytes()),
            )),
            vxlan_malformed,
        ),
        row(
            "VXLAN, outer total length beyond the frame",
            ip4(edit_ipv4(vxlan(h, PEER_IP, &inner), |l3| {
                let n = l3.len();
                set_total_len(l3, n + 20);
            })),
            [
                drop(DropBadIpHeader),
                drop(DropTunnelMalformed),
                pass(HostPass),
            ],
        ),
        row(
            "VXLAN, outer datagram ends inside the inner packet",
            ip4(edit_ipv4(vxlan(h, PEER_IP, &inner), |l3| {
                let n = l3.len() - 6;
                set_total_len(l3, n);
                l3[24..26].copy_from_slice(&((n - 20) as u16).to_be_bytes());
            })),
            vxlan_malformed,
        ),
        row(
            "VXLAN, UDP length beyond the datagram",
            ip4(edit_ipv4(vxlan(h, PEER_IP, &inner), |l3| {
                let n = l3.len() - 20 + 6;
                l3[24..26].copy_from_slice(&(n as u16).to_be_bytes());
            })),
            vxlan_malformed,
        ),
        row(
            "VXLAN, UDP length shorter than VXLAN + inner headers",
            ip4(edit_ipv4(vxlan(h, PEER_IP, &inner), |l3| {
                l3[24..26].copy_from_slice(&16u16.to_be_bytes());
            })),
            vxlan_malformed,
        ),
        row(
            "VXLAN with outer IPv4 options",
            ip4(Ipv4 {
                options: vec![1, 1, 1, 0],
                payload: vxlan(h, PEER_IP, &inner)[20..].to_vec(),
                ..Ipv4::new(PEER_IP, NODE_IP)
            }
            .bytes()),
            vxlan_malformed,
        ),
        row(
            "VXLAN from an unknown node, inner cut",
            ip4(vxlan(h, UNKNOWN_NODE, &inner[..10])),
            [
                drop(DropSpoofedIp),
                drop(DropTunnelUnknownPeer),
                pass(HostPass),
            ],
        ),
        row(
            "IPIP from the peer (baseline)",
            ip4(ipip(h, &inner)),
            tunnel(redirect(DecapIpip)),
        ),
        row(
            "IPIP, inner total length beyond the packet",
            ip4(ipip(
                h,
                &edit_ipv4(inner.clone(), |l3| set_total_len(l3, inner.len() + 6)),
            )),
            vxlan_malformed,
        ),
        row(
            "IPIP, inner header cut (10 bytes)",
            ip4(ipip(h, &inner[..10])),
            vxlan_malformed,
        ),
        row(
            "IPIP without an inner packet",
            ip4(ipip(h, &[])),
            vxlan_malformed,
        ),
        row(
            "IPIP, outer total length beyond the frame",
            ip4(edit_ipv4(ipip(h, &inner), |l3| {
                let n = l3.len();
                set_total_len(l3, n + 4);
            })),
            [
                drop(DropBadIpHeader),
                drop(DropTunnelMalformed),
                pass(HostPass),
            ],
        ),
        row(
            "IPIP, outer datagram ends inside the inner packet",
            ip4(edit_ipv4(ipip(h, &inner), |l3| {
                let n = l3.len() - 6;
                set_total_len(l3, n);
            })),
            vxlan_malformed,
        ),
        row(
            "VXLAN, inner UDP header cut (4 bytes)",
            ip4(vxlan(
                h,
                PEER_IP,
                &ipv4(REMOTE_POD, b.ip, IPPROTO_UDP, vec![0, 53, 0, 53]),
            )),
            vxlan_malformed,
        ),
        row(
            "IPIP, inner TCP header cut (10 bytes)",
            ip4(ipip(
                h,
                &ipv4(
                    REMOTE_POD,
                    b.ip,
                    IPPROTO_TCP,
                    tcp_hdr(40_005, 80, 0x02)[..10].to_vec(),
                ),
            )),
            vxlan_malformed,
        ),
        row(
            "IPIP, outer IHL 4",
            ip4(edit_ipv4(ipip(h, &inner), |l3| l3[0] = 0x44)),
            [
                drop(DropBadIpHeader),
                drop(DropTunnelMalformed),
                pass(HostPass),
            ],
        ),
    ]
}

/// One program as the table runs it.
struct Prog {
    name: &'static str,
    ifindex: u32,
    /// Ethernet destination and source its device receives.
    dst: [u8; 6],
    src: [u8; 6],
}

fn programs(h: &Harness) -> [Prog; 3] {
    [
        Prog {
            name: program_names::FROM_POD,
            ifindex: h.a.host_ifindex,
            dst: h.a.host_mac,
            src: h.a.mac,
        },
        Prog {
            name: program_names::FROM_UPLINK,
            ifindex: h.uplink.0,
            dst: h.uplink.1,
            src: PEER_MAC,
        },
        Prog {
            // Only the frame matters to from_host; a real device is needed
            // for the test run.
            name: program_names::FROM_HOST,
            ifindex: h.uplink.0,
            dst: HOST_DST,
            src: HOST_SRC,
        },
    ]
}

/// The node as the agent sets it up, plus the outside route.
fn setup(h: &mut Harness) {
    h.route_to_peer(route_mode::VXLAN);
    h.enable_nat(NAT_MIN, NAT_MAX);
    h.put_hostport(HOST_PORT, h.b, 80);
    // rivet_host: any real device will do for a test run's redirect.
    let mut cfg: Array<&mut MapData, NodeConfig> =
        Array::try_from(h.ebpf.map_mut("CONFIG").expect("map")).expect("array");
    let mut c = cfg.get(&0, 0).expect("config");
    c.host_ifindex = if_index("up1");
    c.host_mac = HOST_SRC;
    cfg.set(0, c, 0).expect("config");
    sh(&[
        "ip",
        "route",
        "add",
        "198.51.100.0/24",
        "via",
        "192.168.9.20",
        "dev",
        "up0",
    ]);
}

/// Runs one row on one program; a description of the first mismatch.
fn check(h: &Harness, r: &Row, p: &Prog, want: Want) -> Result<(), String> {
    let data = match &r.frame {
        Frame::Raw(bytes) => bytes.clone(),
        Frame::Eth(proto, body) => frame(&[&eth(p.dst, p.src, *proto), body]),
    };
    let before = h.counters();
    let res = h.run(p.name, &data, p.ifindex);
    let after = h.counters();
    let moved: Vec<(&str, u64)> = after
        .iter()
        .filter(|(k, v)| **v != before[*k])
        .map(|(k, v)| (*k, v - before[k]))
        .collect();
    match (want, res) {
        (Want::Refused, Err(e)) => {
            if !e.contains("Invalid argument") && !e.contains("os error 22") {
                return Err(format!("refused, but not with EINVAL: {e}"));
            }
            if !moved.is_empty() {
                return Err(format!("refused, yet counters moved: {moved:?}"));
            }
            Ok(())
        }
        (Want::Refused, Ok((verdict, _))) => Err(format!(
            "expected the kernel to refuse the frame; it ran: verdict {verdict}, counters {moved:?}"
        )),
        (Want::Is(..), Err(e)) => Err(format!("test_run failed: {e}")),
        (Want::Is(verdict, counter), Ok((got, out))) => {
            if got != verdict || moved != [(counter.name(), 1)] {
                return Err(format!(
                    "got verdict {got} with counters {moved:?}, expected verdict {verdict} with {}",
                    counter.name()
                ));
            }
            if verdict != TC_ACT_REDIRECT && out != data {
                return Err(
                    "the packet was modified (drop or pass must leave it as it was)".into(),
                );
            }
            if verdict == TC_ACT_REDIRECT
                && be16(&out[12..14]) == ETH_P_IP
                && !ipv4_checksum_ok(&out, 14)
            {
                return Err("forwarded with a bad IPv4 header checksum".into());
            }
            if p.name == program_names::FROM_POD
                && let Some(f) = r.pod_out
            {
                f(&data, &out);
            }
            Ok(())
        }
    }
}

#[test]
fn every_malformed_frame_on_every_program() {
    with_harness(|h| {
        setup(h);
        let rows = table(h);
        let progs = programs(h);
        let mut failures = Vec::new();
        for r in &rows {
            for (p, want) in progs.iter().zip([r.pod, r.uplink, r.host]) {
                if let Err(e) = check(h, r, p, want) {
                    failures.push(format!("{} / {}: {e}", r.name, p.name));
                }
            }
        }
        assert!(
            failures.is_empty(),
            "{} of {} cases failed:\n{}",
            failures.len(),
            rows.len() * 3,
            failures.join("\n")
        );
        eprintln!("{}", markdown(&rows));
    });
}

/// The table as Markdown (printed with `--nocapture`; RELIABILITY.md).
fn markdown(rows: &[Row]) -> String {
    let cell = |w: Want| match w {
        Want::Refused => "refused by test_run (EINVAL)".to_owned(),
        Want::Is(v, c) => {
            let v = match v {
                TC_ACT_OK => "pass",
                TC_ACT_SHOT => "DROP",
                TC_ACT_REDIRECT => "redirect",
                _ => "?",
            };
            format!("{v} `{}`", c.name())
        }
    };
    let mut s = String::from("| frame | from_pod | from_uplink | from_host |\n|---|---|---|---|\n");
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            r.name,
            cell(r.pod),
            cell(r.uplink),
            cell(r.host)
        ));
    }
    s
}

// --- the same edge cases over a real veth ------------------------------------

/// Sends `data` on `sock` and waits for exactly `counter` to move by one.
fn expect_counted(h: &Harness, sock: &RawSocket, data: &[u8], counter: Counter, what: &str) {
    let before = h.counters();
    sock.send(data)
        .unwrap_or_else(|e| panic!("{what}: sending: {e}"));
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let after = h.counters();
        let moved: Vec<(&str, u64)> = after
            .iter()
            .filter(|(k, v)| **v != before[*k])
            .map(|(k, v)| (*k, v - before[k]))
            .collect();
        if !moved.is_empty() {
            // A moment for a second, wrong count to show.
            std::thread::sleep(Duration::from_millis(50));
            let after = h.counters();
            let moved: Vec<(&str, u64)> = after
                .iter()
                .filter(|(k, v)| **v != before[*k])
                .map(|(k, v)| (*k, v - before[k]))
                .collect();
            assert_eq!(moved, [(counter.name(), 1)], "{what}");
            return;
        }
        assert!(Instant::now() < deadline, "{what}: nothing counted");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn attach(h: &mut Harness, prog: &str, ifname: &str) {
    let p: &mut SchedClassifier = h
        .ebpf
        .program_mut(prog)
        .expect("program")
        .try_into()
        .expect("classifier");
    p.attach(ifname, TcAttachType::Ingress)
        .unwrap_or_else(|e| panic!("attach {prog} to {ifname}: {e}"));
}

/// What BPF_PROG_TEST_RUN cannot show: IPv4 frames shorter than an IPv4
/// header (the kernel refuses them in a test run), and VLAN tags, which
/// the receive path strips into `skb->vlan_tci` before TC ingress — the
/// program sees an untagged frame and must look at `vlan_present`. Sent
/// with an `AF_PACKET` socket into veths of the harness' namespace, with
/// `from_pod` attached to pod A's host veth and `from_uplink` to the
/// uplink (TCX links, gone with the loaded object and the namespace).
#[test]
fn short_and_vlan_frames_over_a_real_veth() {
    with_harness(|h| {
        h.route_to_peer(route_mode::VXLAN);
        // No IPv6 chatter (router solicitations, MLD) from the test's own
        // interfaces: pods run with IPv6 disabled too.
        sh(&["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"]);
        std::thread::sleep(Duration::from_millis(100));
        attach(h, program_names::FROM_POD, "hA");
        attach(h, program_names::FROM_UPLINK, "up0");
        let (a, b) = (h.a, h.b);
        // (sockets of the harness' own namespace: the calling thread's)
        let pod = RawSocket::open_here("pA").expect("AF_PACKET socket on pA");
        let good = h.ip_frame(a, &Ipv4::new(a.ip, b.ip));
        expect_counted(h, &pod, &good, Counter::FwdLocal, "untagged pod frame");
        for len in [14, 20, 33] {
            expect_counted(
                h,
                &pod,
                &good[..len],
                Counter::DropTruncated,
                &format!("{len}-byte IPv4 frame from a pod"),
            );
        }
        let tag =
            |f: &[u8], tpid: u16| [&f[..12], &tpid.to_be_bytes(), &[0x00, 0x64], &f[12..]].concat();
        expect_counted(
            h,
            &pod,
            &tag(&good, 0x8100),
            Counter::DropUnsupportedL3,
            "802.1Q-tagged IPv4 from a pod (tag stripped before TC)",
        );
        expect_counted(
            h,
            &pod,
            &tag(&tag(&good, 0x8100), 0x88a8),
            Counter::DropUnsupportedL3,
            "802.1ad+802.1Q-tagged IPv4 from a pod",
        );

        let uplink = RawSocket::open_here("up1").expect("AF_PACKET socket on up1");
        let inner = Ipv4::new(Ipv4Addr::new(10, 9, 2, 5), b.ip).bytes();
        let vx = h.vxlan_frame(PEER_IP, VNI, VXLAN_PORT, &inner);
        expect_counted(h, &uplink, &vx, Counter::DecapVxlan, "untagged VXLAN");
        expect_counted(
            h,
            &uplink,
            &tag(&vx, 0x8100),
            Counter::UplinkPass,
            "VLAN-tagged VXLAN on the uplink belongs to a VLAN device: passed",
        );
    });
}
