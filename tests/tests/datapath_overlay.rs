//! Per-packet tests of encapsulation (from_pod, from_host) and
//! decapsulation (from_uplink) with BPF_PROG_TEST_RUN: byte-exact outer
//! headers around an unchanged inner packet; the decap matrix; tunnel
//! injection from a pod.

use std::net::Ipv4Addr;

use rivet_common::{Counter, program_names, route_mode};
use rivet_tests::{
    packet::{
        ETH_P_IP, IPPROTO_IPIP, IPPROTO_UDP, Ipv4, be16, checksum, eth, frame, ipv4,
        ipv4_checksum_ok, truncate_ipv4, udp, vxlan,
    },
    progtest::*,
};

const REMOTE_POD: Ipv4Addr = Ipv4Addr::new(10, 9, 2, 5);

/// The inner packet as it must appear inside the tunnel: TTL − 1, checksum
/// updated, nothing else changed.
fn hop(ip: &Ipv4) -> Vec<u8> {
    Ipv4 {
        ttl: ip.ttl - 1,
        ..ip.clone()
    }
    .bytes()
}

/// Checks an outer IPv4 header at `off`.
fn check_outer(out: &[u8], off: usize, protocol: u8, tot_len: usize, tos: u8) {
    let ip = &out[off..off + 20];
    assert_eq!(ip[0], 0x45, "version/IHL");
    assert_eq!(ip[1], tos, "TOS copied from the inner header");
    assert_eq!(usize::from(be16(&ip[2..4])), tot_len, "outer total length");
    assert_eq!(ip[6] & 0x40, 0x40, "DF");
    assert_eq!(ip[8], 64, "outer TTL");
    assert_eq!(ip[9], protocol);
    assert_eq!(&ip[12..16], &[192, 168, 9, 10], "outer source = node IP");
    assert_eq!(
        &ip[16..20],
        &PEER_IP.octets(),
        "outer destination = peer node"
    );
    assert_eq!(checksum(ip), 0, "outer header checksum");
}

#[test]
fn vxlan_encap_is_byte_exact() {
    with_harness(|h| {
        h.route_to_peer(route_mode::VXLAN);
        let a = h.a;
        let inner = Ipv4 {
            payload: vec![0xab; 200],
            ..Ipv4::new(a.ip, REMOTE_POD)
        };
        let pkt = h.ip_frame(a, &inner);
        let out = h.expect(
            program_names::FROM_POD,
            &pkt,
            a.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::FwdEncapVxlan,
        );
        assert_eq!(out.len(), pkt.len() + 50);
        // Outer Ethernet toward the peer's MAC (permanent neighbour), from the uplink.
        assert_eq!(&out[0..6], &PEER_MAC);
        assert_eq!(&out[6..12], &h.uplink.1);
        assert_eq!(be16(&out[12..14]), ETH_P_IP);
        check_outer(&out, 14, 17, out.len() - 14, 0);
        // UDP: source port from the flow hash in the ephemeral range, VXLAN
        // port, length, zero checksum.
        let udp = &out[34..42];
        let sport = be16(&udp[0..2]);
        assert!((32768..61000).contains(&sport), "source port {sport}");
        assert_eq!(be16(&udp[2..4]), VXLAN_PORT);
        assert_eq!(usize::from(be16(&udp[4..6])), out.len() - 34);
        assert_eq!(be16(&udp[6..8]), 0, "UDP checksum 0 over IPv4");
        // VXLAN: I flag, VNI 1.
        assert_eq!(&out[42..50], &[0x08, 0, 0, 0, 0, 0, 1, 0]);
        // Inner Ethernet: peer VTEP ← our VTEP.
        assert_eq!(&out[50..56], &PEER_VTEP);
        assert_eq!(&out[56..62], &OUR_VTEP);
        assert_eq!(be16(&out[62..64]), ETH_P_IP);
        // The inner packet, unchanged but for the router hop.
        assert_eq!(&out[64..], &hop(&inner)[..]);
        assert!(ipv4_checksum_ok(&out, 64));

        // Another flow, another source port (flow hash), same everything else.
        let other = h.ip_frame(
            a,
            &Ipv4 {
                protocol: 6,
                ..inner.clone()
            },
        );
        let out2 = h
            .run(program_names::FROM_POD, &other, a.host_ifindex)
            .expect("run")
            .1;
        assert_eq!(&out2[36..38], &VXLAN_PORT.to_be_bytes());
    });
}

#[test]
fn ipip_encap_is_byte_exact() {
    with_harness(|h| {
        h.route_to_peer(route_mode::IPIP);
        let a = h.a;
        let mut inner = Ipv4::new(a.ip, REMOTE_POD);
        inner.payload = vec![7; 64];
        let pkt = h.ip_frame(a, &inner);
        let with_tos = h.ip_frame(
            a,
            &Ipv4 {
                tos: 0x28, // DSCP AF11
                ..inner.clone()
            },
        );
        let out = h.expect(
            program_names::FROM_POD,
            &with_tos,
            a.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::FwdEncapIpip,
        );
        assert_eq!(out.len(), pkt.len() + 20);
        assert_eq!(&out[0..6], &PEER_MAC);
        check_outer(&out, 14, 4, out.len() - 14, 0x28);
        assert_eq!(out[34 + 8], inner.ttl - 1, "inner TTL decremented");
        assert!(ipv4_checksum_ok(&out, 34));
        assert_eq!(
            &out[34 + 12..34 + 20],
            &with_tos[14 + 12..14 + 20],
            "inner addresses unchanged"
        );
        assert_eq!(&out[54..], &with_tos[34..], "inner payload unchanged");
    });
}

#[test]
fn native_route_rewrites_macs_only() {
    with_harness(|h| {
        h.route_to_peer(route_mode::NATIVE);
        let a = h.a;
        let inner = Ipv4::new(a.ip, REMOTE_POD);
        let pkt = h.ip_frame(a, &inner);
        let out = h.expect(
            program_names::FROM_POD,
            &pkt,
            a.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::FwdNative,
        );
        assert_eq!(out.len(), pkt.len());
        assert_eq!(&out[0..6], &PEER_MAC, "next hop = the peer node");
        assert_eq!(&out[6..12], &h.uplink.1);
        assert_eq!(&out[14..], &hop(&inner)[..]);
    });
}

#[test]
fn host_traffic_is_encapsulated_without_a_hop() {
    with_harness(|h| {
        h.route_to_peer(route_mode::VXLAN);
        let inner = Ipv4::new(Ipv4Addr::new(192, 168, 9, 10), REMOTE_POD);
        let pkt = frame(&[&eth([0; 6], [0; 6], ETH_P_IP), &inner.bytes()]);
        let out = h.expect(
            program_names::FROM_HOST,
            &pkt,
            h.uplink.0,
            TC_ACT_REDIRECT,
            Counter::FwdEncapVxlan,
        );
        assert_eq!(
            &out[64..],
            &inner.bytes()[..],
            "TTL untouched for the node's own packets"
        );
        // Not a remote pod: passed.
        let local = frame(&[
            &eth([0; 6], [0; 6], ETH_P_IP),
            &Ipv4::new(Ipv4Addr::new(192, 168, 9, 10), h.a.ip).bytes(),
        ]);
        h.expect(
            program_names::FROM_HOST,
            &local,
            h.uplink.0,
            TC_ACT_OK,
            Counter::HostPass,
        );
    });
}

/// Builds what a peer sends: VXLAN around `inner`, addressed to our uplink.
#[test]
fn decap_matrix() {
    with_harness(|h| {
        h.route_to_peer(route_mode::VXLAN);
        let b = h.b;
        let inner = Ipv4::new(REMOTE_POD, b.ip);
        let up = h.uplink.0;

        // Known node, right VNI: delivered to pod B with redirect_peer.
        let ok = h.vxlan_frame(PEER_IP, VNI, VXLAN_PORT, &inner.bytes());
        let out = h.expect(
            program_names::FROM_UPLINK,
            &ok,
            up,
            TC_ACT_REDIRECT,
            Counter::DecapVxlan,
        );
        assert_eq!(out.len(), ok.len() - 50);
        assert_eq!(&out[0..6], &b.mac);
        assert_eq!(&out[6..12], &b.host_mac);
        assert_eq!(&out[14..], &hop(&inner)[..]);

        // Unknown source node.
        let stranger = h.vxlan_frame(
            Ipv4Addr::new(192, 168, 9, 99),
            VNI,
            VXLAN_PORT,
            &inner.bytes(),
        );
        h.expect(
            program_names::FROM_UPLINK,
            &stranger,
            up,
            TC_ACT_SHOT,
            Counter::DropTunnelUnknownPeer,
        );
        // Wrong VNI.
        let vni7 = h.vxlan_frame(PEER_IP, 7, VXLAN_PORT, &inner.bytes());
        h.expect(
            program_names::FROM_UPLINK,
            &vni7,
            up,
            TC_ACT_SHOT,
            Counter::DropTunnelBadVni,
        );
        // VNI flag missing.
        let mut noflag = ok.clone();
        noflag[42] = 0;
        h.expect(
            program_names::FROM_UPLINK,
            &noflag,
            up,
            TC_ACT_SHOT,
            Counter::DropTunnelBadVni,
        );
        // Short: UDP header and VXLAN but no inner frame.
        let short = h.vxlan_frame(PEER_IP, VNI, VXLAN_PORT, &[]);
        let cut = &short[..short.len() - 14];
        h.expect(
            program_names::FROM_UPLINK,
            cut,
            up,
            TC_ACT_SHOT,
            Counter::DropTunnelMalformed,
        );
        // Truncated inner packet: its total length claims more than carried.
        // (outer lengths made consistent so only the inner one is wrong)
        let trunc = h.peer_frame(&truncate_ipv4(ok[14..].to_vec(), ok.len() - 14 - 6));
        h.expect(
            program_names::FROM_UPLINK,
            &trunc,
            up,
            TC_ACT_SHOT,
            Counter::DropTunnelMalformed,
        );
        // Inner destination that is neither a local pod nor the node.
        let nowhere = h.vxlan_frame(
            PEER_IP,
            VNI,
            VXLAN_PORT,
            &Ipv4::new(REMOTE_POD, Ipv4Addr::new(10, 9, 1, 99)).bytes(),
        );
        h.expect(
            program_names::FROM_UPLINK,
            &nowhere,
            up,
            TC_ACT_SHOT,
            Counter::DropTunnelNoEndpoint,
        );
        // Not ours: UDP to another port, TCP to the node, another node's IP.
        let other_port = h.vxlan_frame(PEER_IP, VNI, 4789, &inner.bytes());
        let out = h.expect(
            program_names::FROM_UPLINK,
            &other_port,
            up,
            TC_ACT_OK,
            Counter::UplinkPass,
        );
        assert_eq!(out, other_port, "passed untouched");
        let tcp = h.peer_frame(
            &Ipv4 {
                protocol: 6,
                ..Ipv4::new(PEER_IP, NODE_IP)
            }
            .bytes(),
        );
        h.expect(
            program_names::FROM_UPLINK,
            &tcp,
            up,
            TC_ACT_OK,
            Counter::UplinkPass,
        );

        // IPIP from a known node, and from a stranger.
        let ipip = h.ipip_frame(PEER_IP, &inner.bytes());
        let out = h.expect(
            program_names::FROM_UPLINK,
            &ipip,
            up,
            TC_ACT_REDIRECT,
            Counter::DecapIpip,
        );
        assert_eq!(&out[14..], &hop(&inner)[..]);
        let ipip_stranger = h.ipip_frame(Ipv4Addr::new(203, 0, 113, 9), &inner.bytes());
        h.expect(
            program_names::FROM_UPLINK,
            &ipip_stranger,
            up,
            TC_ACT_SHOT,
            Counter::DropTunnelUnknownPeer,
        );

        // Native: a remote pod's packet straight to a local pod.
        h.route_to_peer(route_mode::NATIVE);
        let native = h.peer_frame(&inner.bytes());
        let out = h.expect(
            program_names::FROM_UPLINK,
            &native,
            up,
            TC_ACT_REDIRECT,
            Counter::FwdFromPeer,
        );
        assert_eq!(&out[0..6], &b.mac);
    });
}

/// A pod cannot smuggle VXLAN or IPIP to a node (it would be decapsulated
/// as if a node had sent it, into another pod).
#[test]
fn pods_cannot_send_tunnel_packets_to_nodes() {
    with_harness(|h| {
        h.route_to_peer(route_mode::VXLAN);
        let a = h.a;
        let victim = Ipv4::new(REMOTE_POD, h.b.ip);
        for node in [Ipv4Addr::new(192, 168, 9, 10), PEER_IP] {
            let inner = frame(&[&eth(OUR_VTEP, PEER_VTEP, ETH_P_IP), &victim.bytes()]);
            let vx = udp(40000, VXLAN_PORT, &vxlan(VNI, &inner));
            let smuggled = h.pod_frame(a, &ipv4(a.ip, node, IPPROTO_UDP, vx));
            h.expect(
                program_names::FROM_POD,
                &smuggled,
                a.host_ifindex,
                TC_ACT_SHOT,
                Counter::DropTunnelFromPod,
            );
            let ipip = h.pod_frame(a, &ipv4(a.ip, node, IPPROTO_IPIP, victim.bytes()));
            h.expect(
                program_names::FROM_POD,
                &ipip,
                a.host_ifindex,
                TC_ACT_SHOT,
                Counter::DropTunnelFromPod,
            );
        }
    });
}

#[test]
fn too_big_with_df_gets_fragmentation_needed() {
    with_harness(|h| {
        h.route_to_peer(route_mode::VXLAN);
        let a = h.a;
        let big = Ipv4 {
            payload: vec![1; 1468 - 20],
            ..Ipv4::new(a.ip, REMOTE_POD)
        };
        let pkt = h.ip_frame(a, &big);
        assert_eq!(pkt.len() - 14, 1468, "fits 1500 but not 1500 − 50");
        let out = h.expect(
            program_names::FROM_POD,
            &pkt,
            a.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::IcmpFragNeeded,
        );
        assert_eq!(out.len(), 14 + 20 + 8 + 28);
        assert_eq!(&out[0..6], &a.mac, "back to the pod");
        assert_eq!(&out[6..12], &a.host_mac);
        assert_eq!(out[14 + 9], 1, "ICMP");
        assert_eq!(
            &out[14 + 12..14 + 16],
            &[169, 254, 1, 1],
            "from the gateway"
        );
        assert_eq!(&out[14 + 16..14 + 20], &a.ip.octets());
        assert!(ipv4_checksum_ok(&out, 14));
        assert_eq!(
            (out[34], out[35]),
            (3, 4),
            "destination unreachable / fragmentation needed"
        );
        assert_eq!(be16(&out[40..42]), 1450, "next-hop MTU");
        assert_eq!(checksum(&out[34..]), 0, "ICMP checksum");
        assert_eq!(&out[42..62], &pkt[14..34], "quotes the offending header");
        // Without DF the stack fragments it: passed.
        let nodf = h.ip_frame(a, &Ipv4 { frag: 0, ..big });
        h.expect(
            program_names::FROM_POD,
            &nodf,
            a.host_ifindex,
            TC_ACT_OK,
            Counter::PassOther,
        );
    });
}
