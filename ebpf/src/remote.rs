//! Traffic for a pod on another node (or for another node's own address), from
//! `from_pod` or `from_host`: the routes map lookup is already done by the
//! caller; here the MTU check, the router hop (TTL), encapsulation (or not, for
//! native routing) and the redirect toward the peer node. Reads `ROUTES`
//! (looked up), `PEERS`, `CONFIG`.
//!
//! 1. MTU: the packet's L3 length (for a GSO packet: IP + TCP/UDP header +
//!    `gso_size`, i.e. each segment it will be cut into) plus the tunnel
//!    overhead (VXLAN 50, IPIP 20, native 0) must fit `uplink_mtu`. Too big:
//!    from a pod, non-GSO with DF → ICMP fragmentation-needed built in BPF
//!    ([`crate::icmp`], `icmp_frag_needed`, next-hop MTU = uplink MTU −
//!    overhead) and sent back into the pod; GSO or non-DF → pass to the stack,
//!    which routes it over `rivet_host` (MTU = pod MTU) and fragments or
//!    answers itself; from the node → `drop_too_big` (the node's own stack
//!    already obeys rivet_host's MTU, so this never happens in practice).
//! 2. `bpf_fib_lookup(OUTPUT, ifindex = uplink)` from the node IP to the peer's
//!    node IP → next hop and MACs; no route → `drop_no_route`.
//! 3. From a pod: TTL ≤ 1 → pass to the stack (`pass_ttl_exceeded`, it sends
//!    time-exceeded); else TTL − 1 (each node is a router hop, so traceroute
//!    shows both nodes).
//! 4. Encapsulation ([`crate::encap`]): VXLAN, IPIP, or nothing for native
//!    (only the MACs change). A peer without a `PEERS` entry → `drop_no_route`;
//!    failure of the helper → `drop_encap_failed`.
//! 5. Transmit ([`crate::fib`]), counted `fwd_encap_vxlan`, `fwd_encap_ipip` or
//!    `fwd_native`. Outer packets are built after netfilter would have seen
//!    them: they never touch iptables/conntrack.
//!
//! `bpf_fib_lookup` needs `net.ipv4.ip_forward=1` even with the OUTPUT flag, so
//! the agent turns forwarding on (the stack also forwards the TTL-expired and
//! too-big cases).

use aya_ebpf::programs::TcContext;
use rivet_common::{
    Counter, EndpointInfo, IPIP_OVERHEAD, NodeConfig, RouteInfo, VXLAN_OVERHEAD, route_mode,
};

use crate::{
    encap, fib,
    headers::{ETH_HLEN, IP_DF, Ipv4Hdr},
    icmp, ipv4, maps,
    packet::ptr_at,
    verdict,
};

/// Who is sending: a pod (its endpoint and veth), or the node itself.
pub enum Sender<'a> {
    /// A pod: answer it with ICMP when its packet is too big; TTL is
    /// decremented (the node is a router hop).
    Pod { ifindex: u32, ep: &'a EndpointInfo },
    /// The node's own stack (through `rivet_host`): no hop.
    Host,
}

/// Sends the IPv4 packet at offset 14 to the node owning its destination.
#[inline(always)]
pub fn forward(ctx: &TcContext, cfg: &NodeConfig, route: &RouteInfo, sender: Sender<'_>) -> i32 {
    let (overhead, counter) = match route.mode {
        route_mode::VXLAN => (VXLAN_OVERHEAD, Counter::FwdEncapVxlan),
        route_mode::IPIP => (IPIP_OVERHEAD, Counter::FwdEncapIpip),
        _ => (0, Counter::FwdNative),
    };
    let Some(ip) = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN) else {
        return verdict::drop(ctx, Counter::DropTruncated);
    };
    // SAFETY: bounds-checked above; alignment 1; nothing moved the data yet.
    let ip = unsafe { &mut *ip };

    // Too big for the uplink once encapsulated? A GSO packet is judged by
    // the segments it will be cut into.
    // SAFETY: reading fields of the program's __sk_buff.
    let gso_size = unsafe { (*ctx.skb.skb).gso_size };
    let l3_len = if gso_size != 0 {
        segment_l3_len(ctx, ip, gso_size)
    } else {
        ctx.len().saturating_sub(ETH_HLEN as u32)
    };
    if cfg.uplink_mtu != 0 && l3_len + overhead > cfg.uplink_mtu {
        let mtu = (cfg.uplink_mtu - overhead) as u16;
        return match sender {
            Sender::Pod { ifindex, ep } if gso_size == 0 && ip.frag_off[0] & IP_DF != 0 => {
                icmp::frag_needed(ctx, ifindex, ep, cfg.gateway, mtu)
            }
            // GSO trains and packets without DF go to the stack: it routes
            // them through rivet_host, whose MTU leaves room for the tunnel,
            // and fragments them or answers fragmentation-needed itself.
            Sender::Pod { .. } => verdict::pass(ctx, Counter::PassOther),
            Sender::Host => verdict::drop(ctx, Counter::DropTooBig),
        };
    }

    let Some(hop) = fib::lookup(ctx, cfg.node_ip, route.node_ip, cfg.uplink_ifindex) else {
        return verdict::drop(ctx, Counter::DropNoRoute);
    };

    if let Sender::Pod { .. } = sender {
        if ip.ttl <= 1 {
            return verdict::pass(ctx, Counter::PassTtl);
        }
        ipv4::decrease_ttl(ip);
    }

    let encapped = match route.mode {
        route_mode::VXLAN => match maps::peer(route.node_ip) {
            Some(peer) => encap::vxlan(ctx, cfg, route, &peer),
            None => Err(Counter::DropNoRoute),
        },
        route_mode::IPIP => encap::ipip(ctx, cfg, route),
        _ => Ok(()),
    };
    match encapped {
        Ok(()) => verdict::transmit(ctx, &hop, counter),
        Err(reason) => verdict::drop(ctx, reason),
    }
}

/// IPv4 length of each segment a GSO packet will be cut into: its IP header,
/// its L4 header (TCP with options, UDP) and `gso_size` bytes of payload.
#[inline(always)]
fn segment_l3_len(ctx: &TcContext, ip: &Ipv4Hdr, gso_size: u32) -> u32 {
    let ihl = u32::from(ip.version_ihl & 0x0f) * 4;
    let l4 = match ip.protocol {
        crate::headers::IPPROTO_TCP => ctx
            .load::<u8>(ETH_HLEN + ihl as usize + 12)
            .map_or(20, |doff| u32::from(doff >> 4) * 4),
        crate::headers::IPPROTO_UDP => 8,
        _ => 0,
    };
    ihl + l4 + gso_size
}
