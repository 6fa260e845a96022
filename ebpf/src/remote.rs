//! Traffic for a pod on another node: routes map lookup already done by the
//! caller; here the MTU check, the router hop (TTL), encapsulation (or not,
//! for native routing) and the redirect toward the peer node.

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

    // Too big for the uplink once encapsulated? (GSO packets are cut to the
    // sender's MSS, sized from its MTU: only single packets are checked.)
    // SAFETY: reading a field of the program's __sk_buff.
    let gso = unsafe { (*ctx.skb.skb).gso_segs } > 1;
    let l3_len = ctx.len().saturating_sub(ETH_HLEN as u32);
    if !gso && cfg.uplink_mtu != 0 && l3_len + overhead > cfg.uplink_mtu {
        let mtu = (cfg.uplink_mtu - overhead) as u16;
        return match sender {
            Sender::Pod { ifindex, ep } if ip.frag_off[0] & IP_DF != 0 => {
                icmp::frag_needed(ctx, ifindex, ep, cfg.gateway, mtu)
            }
            // Without DF the stack may fragment: it routes the packet
            // through rivet_host, whose MTU leaves room for the tunnel.
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
