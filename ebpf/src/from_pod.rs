//! Traffic leaving a pod, seen at TC ingress of its host-side veth. Reads
//! `ENDPOINT_SLOTS`, `ENDPOINTS`, `CONFIG`, `LOCAL_ADDRS`, `ROUTES`, `PEERS`;
//! writes `STATS` (and, on their paths, `FRAG_BUDGET` and the NAT maps).
//!
//! 1. 34 bytes are made linear if the skb is shorter there (`bpf_skb_pull_data`
//!    only when needed). No Ethernet header → `drop_truncated`. A frame whose
//!    VLAN tag the kernel already stripped into metadata (`skb->vlan_present`)
//!    → `drop_unsupported_l3` (forwarded, the tag would leave with it).
//! 2. ARP → [`crate::arp`] (answer for the gateway). It must be Ethernet/IPv4
//!    (else `drop_arp_unsupported`); the sender IP must be an endpoint whose
//!    ifindex is this veth and whose MAC is both the ARP sender MAC and the
//!    Ethernet source (else `drop_arp_spoofed`); gratuitous ARP →
//!    `drop_arp_spoofed`. A reply → pass (`arp_pass`). A request for the
//!    configured gateway → rewritten in place into the reply (sender = host
//!    veth MAC + gateway IP) and `bpf_redirect` back out of the same veth
//!    (`arp_reply`). Anything else → `drop_arp_unsupported`.
//! 3. Anything but IPv4 → drop (`drop_unsupported_l3`).
//! 4. IPv4 header: version 4, IHL ≥ 5, `tot_len` ≥ header and within the frame
//!    (Ethernet padding allowed), else `drop_bad_ip_header`; options are
//!    allowed. On a whole datagram or a first fragment the transport header
//!    must lie within the datagram (its total length, not the frame): TCP with
//!    its options, UDP and ICMP 8 bytes, else `drop_truncated`.
//! 5. Anti-spoof with one lookup: `ENDPOINTS[src]` (through the endpoint cache,
//!    [`crate::maps`]) must exist with `ifindex == skb->ifindex`
//!    (`drop_spoofed_ip`) and `mac == eth.src` (`drop_spoofed_mac`).
//! 6. Destination is a local pod: TTL ≤ 1 → pass to the stack
//!    (`pass_ttl_exceeded`); else TTL − 1 with an incremental checksum update
//!    (RFC 1624, the arithmetic of Linux `ip_decrease_ttl`), MACs rewritten to
//!    (dst = pod MAC, src = its host veth MAC) and `bpf_redirect_peer(ifindex)`
//!    into the target pod's namespace (`fwd_local`). The target's host veth
//!    egress and the host stack are skipped.
//! 7. Tunnel packets (IPIP, or UDP to the VXLAN port) addressed to a node (this
//!    node's addresses or any peer's) → `drop_tunnel_from_pod`: a pod must
//!    never be able to inject packets a node would decapsulate (the UDP port is
//!    read on first fragments only).
//! 8. Destination in a remote pod subnet, or another node's own address
//!    ([`crate::maps::remote_route`]) → [`crate::remote`] (encap or native
//!    route toward that node, the way its pods are reached: no pod address
//!    crosses the underlay raw in the tunnel modes). A hostPort pod's answer to
//!    a pod on another node leaves the same way, translated.
//! 9. Destination is the node (`LOCAL_ADDRS`) → pass to the host stack
//!    (`pass_host`); a fragment only within the pod's fragment budget
//!    ([`crate::frag`]), else `drop_frag_budget`.
//! 10. Destination outside the cluster with masquerade on — neither in
//!     `NO_MASQ` (cluster CIDR, link-local, multicast, broadcast, the
//!     configured list) nor a node (`PEERS`: nodes route pod addresses back
//!     themselves, so a node's own connection to a pod gets its replies
//!     unchanged) → [`crate::nat::egress`] (TTL ≤ 1 → `pass_ttl_exceeded`
//!     first): source rewritten to the node, sent out of the uplink.
//! 11. Anything else → pass (`pass_other`; a fragment through the same budget).
//!
//! Why a pod's traffic to another node's own address (its hostPorts, its
//! services, answers to that node's own connections) travels the way that
//! node's pods are reached — encapsulated in `vxlan`/`ipip` (and to `hybrid`'s
//! tunnelled peers), routed in `native` — as Cilium does, not masqueraded as
//! flannel does: the pod's address stays visible to the receiving node and to a
//! hostPort pod there (it sees the remote pod as the client, and its answer
//! returns through the overlay as the node address and hostPort), and no pod
//! address crosses the underlay raw, which cloud networks drop (source checks).
//! The route mode toward a node's own address is `PeerInfo::route_mode`,
//! written with the peer; `from_uplink` decapsulates a tunnel packet for the
//! node before the hostPort translation, so it applies to remote pods too.
//! Measured 2026-12-01 (`tests/pod_to_node.rs`): before, the packet left the
//! uplink raw with the pod's source (`pass_other`) and the hostPort pod's
//! answer was dropped after reverse DNAT (`drop_no_route`); now ping, TCP to
//! the node, TCP and UDP hostPorts work in all four modes and a capture of the
//! underlay shows no pod source in the tunnel modes.

use aya_ebpf::{EbpfContext as _, programs::TcContext};
use rivet_common::{Counter, endpoint_flags};

use crate::{
    arp, bandwidth, frag,
    headers::{
        ETH_HLEN, ETH_P_ARP, ETH_P_IP, EthHdr, IPPROTO_ICMP, IPPROTO_IPIP, IPPROTO_UDP, IPV4_HLEN,
        Ipv4Hdr,
    },
    ipv4, maps, nat, nat_icmp,
    packet::{addr, copy_mac, ensure_linear, ptr_at},
    remote::{self, Sender},
    verdict,
};

/// Bytes we want linear: Ethernet + an IPv4 header without options (ARP is shorter).
const LINEAR: u32 = (ETH_HLEN + IPV4_HLEN) as u32;

/// A call of its own: its 488-byte frame and the policy verdict's are
/// siblings in the chain of calls the verifier bounds to 512 bytes.
#[inline(never)]
pub fn handle(ctx: TcContext) -> i32 {
    let ctx = &ctx;
    // SAFETY: `ctx.as_ptr()` is the program's __sk_buff, valid for its run.
    let ifindex = unsafe { (*(ctx.as_ptr() as *const aya_ebpf::bindings::__sk_buff)).ifindex };
    ensure_linear(ctx, LINEAR);
    // A VLAN tag reaches TC already stripped into skb->vlan_tci, so the
    // frame looks untagged; forwarded, the tag would leave with it (onto
    // the underlay's VLANs). Pods have no VLANs.
    // SAFETY: as above.
    if unsafe { (*(ctx.as_ptr() as *const aya_ebpf::bindings::__sk_buff)).vlan_present } != 0 {
        return verdict::drop(ctx, Counter::DropUnsupportedL3);
    }

    let Some(eth) = ptr_at::<EthHdr>(ctx, 0) else {
        return verdict::drop(ctx, Counter::DropTruncated);
    };
    // SAFETY: bounds-checked just above; alignment 1.
    let proto = unsafe { (*eth).proto };
    if proto == ETH_P_ARP {
        return arp::from_pod(ctx, ifindex);
    }
    if proto != ETH_P_IP {
        return verdict::drop(ctx, Counter::DropUnsupportedL3);
    }

    let Some(ip) = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN) else {
        return verdict::drop(ctx, Counter::DropTruncated);
    };
    // SAFETY: both headers were bounds-checked against data_end; alignment 1;
    // nothing below moves packet data.
    let (eth, ip) = unsafe { (&mut *eth, &mut *ip) };
    let Ok(hlen) = ipv4::validate(ip, ETH_HLEN, ctx.len()) else {
        return verdict::drop(ctx, Counter::DropBadIpHeader);
    };
    if !ipv4::transport_fits(ctx, ip, ETH_HLEN + hlen, hlen) {
        return verdict::drop(ctx, Counter::DropTruncated);
    }

    // Anti-spoof: one lookup proves both address and MAC.
    let Some(src) = maps::endpoint(addr(&ip.src)) else {
        return verdict::drop(ctx, Counter::DropSpoofedIp);
    };
    if src.ifindex != ifindex {
        return verdict::drop(ctx, Counter::DropSpoofedIp);
    }
    if eth.src != src.mac {
        return verdict::drop(ctx, Counter::DropSpoofedMac);
    }
    // The pod's egress limit: every packet it sends, before anything
    // forwards it.
    if src.flags & endpoint_flags::BANDWIDTH_EGRESS != 0 && bandwidth::egress_over(ctx, ifindex) {
        return verdict::drop(ctx, Counter::DropBandwidth);
    }

    let dst = addr(&ip.dst);
    let Some(cfg) = maps::config() else {
        return verdict::drop(ctx, Counter::DropNotConfigured);
    };
    let hdr = nat::Ip {
        src: addr(&ip.src),
        dst,
        proto: ip.protocol,
        hlen: usize::from(ip.version_ihl & 0x0f) * 4,
        frag: u16::from_be_bytes(ip.frag_off),
    };
    let local_dst = maps::endpoint(dst);
    // A pod with hostPorts may be answering a connection that came in
    // through one: its source goes back to the node address and hostPort.
    // An answer to a pod on another node leaves below, like the pod's own
    // traffic there (one forwarding path for the verifier to walk).
    let mut answered_remote = None;
    if src.flags & (endpoint_flags::HOSTPORTS | endpoint_flags::SERVICE) != 0 {
        let answered = if hdr.proto == IPPROTO_ICMP {
            nat_icmp::hostport_error_out(ctx, &cfg, &hdr, ip.ttl)
        } else {
            nat::hostport_reply(ctx, &cfg, &hdr, ip.ttl)
        };
        match answered {
            Some(nat::Answer::Done(v)) => return v,
            Some(nat::Answer::Remote(route)) => answered_remote = Some(route),
            None => {}
        }
    }
    let route = match answered_remote {
        Some(route) => route,
        None => {
            if let Some(peer) = local_dst {
                if ip.ttl <= 1 {
                    // The stack forwards nothing here but answers with
                    // time-exceeded.
                    return verdict::pass(ctx, Counter::PassTtl);
                }
                ipv4::decrease_ttl(ip);
                copy_mac(&mut eth.dst, &peer.mac);
                copy_mac(&mut eth.src, &peer.host_mac);
                return bandwidth::deliver(ctx, peer.ifindex, peer.flags, Counter::FwdLocal);
            }
            // Tunnel traffic from a pod to any node is never legitimate: it
            // would be decapsulated as if a node had sent it (tunnel
            // injection). The header check first: the lookups run only for
            // tunnel packets.
            if is_tunnel(ctx, ip, cfg.vxlan_port as u16)
                && (maps::is_local_addr(dst) || dst == cfg.node_ip || maps::peer(dst).is_some())
            {
                return verdict::drop(ctx, Counter::DropTunnelFromPod);
            }
            match maps::remote_route(dst) {
                Some(route) => route,
                None => return to_node_or_outside(ctx, &cfg, ip, &hdr, ifindex),
            }
        }
    };
    remote::forward(ctx, &cfg, &route, Sender::Pod { ifindex, ep: src })
}

/// The rest of a pod's traffic: to this node (its addresses and hostPorts)
/// or out of the cluster (masqueraded), else to the stack.
#[inline(always)]
fn to_node_or_outside(
    ctx: &TcContext,
    cfg: &rivet_common::NodeConfig,
    ip: &Ipv4Hdr,
    hdr: &nat::Ip,
    ifindex: u32,
) -> i32 {
    let dst = hdr.dst;
    if dst == cfg.node_ip || maps::is_local_addr(dst) {
        // A hostPort (a sibling's, or the pod's own: hairpin), reached
        // through the node's address.
        if ip.ttl > 1 {
            let client = nat::Client::Pod {
                ifindex,
                gateway: cfg.gateway,
            };
            match nat::hostport_in(ctx, hdr, client) {
                nat::Reply::Deliver(ep) => {
                    if let Some(hdr) = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN) {
                        // SAFETY: bounds-checked; alignment 1; the
                        // checksum helpers ran before this re-derivation.
                        ipv4::decrease_ttl(unsafe { &mut *hdr });
                    }
                    return nat::to_pod(ctx, &ep, Counter::FwdDnat);
                }
                nat::Reply::Done(v) => return v,
                nat::Reply::NotOurs => {}
            }
        }
        // Fragments fill the node's reassembly memory, shared by every
        // pod: each pod pays for its own (`drop_frag_budget` past it).
        return frag::pass(ctx, hdr.src, hdr.frag, Counter::PassHost);
    }
    // Other nodes' addresses were sent to them above (a peer whose route
    // mode an older agent did not record lands here): never masqueraded,
    // their own traffic to a pod gets its reply unchanged.
    if let Some(nat) = maps::nat_config()
        && dst != cfg.node_ip
        && !maps::no_masquerade(dst)
        && maps::peer(dst).is_none()
    {
        if ip.ttl <= 1 {
            return verdict::pass(ctx, Counter::PassTtl);
        }
        return nat::egress(ctx, cfg, &nat, hdr);
    }
    // The stack may reassemble these too (conntrack defragments what it
    // forwards): the same budget.
    frag::pass(ctx, hdr.src, hdr.frag, Counter::PassOther)
}

/// IPIP, or UDP to the VXLAN port.
#[inline(always)]
fn is_tunnel(ctx: &TcContext, ip: &Ipv4Hdr, vxlan_port: u16) -> bool {
    if ip.protocol == IPPROTO_IPIP {
        return true;
    }
    // Only a first fragment has a UDP header (later ones cannot be
    // reassembled without it).
    if ip.protocol != IPPROTO_UDP || u16::from_be_bytes(ip.frag_off) & ipv4::IP_OFFSET != 0 {
        return false;
    }
    let hlen = usize::from(ip.version_ihl & 0x0f) * 4;
    if !(IPV4_HLEN..=60).contains(&hlen) {
        return false;
    }
    ctx.load::<[u8; 2]>(ETH_HLEN + hlen + 2)
        .is_ok_and(|port| u16::from_be_bytes(port) == vxlan_port)
}
