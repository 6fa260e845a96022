//! Traffic leaving a pod, seen at TC ingress of its host-side veth.
//!
//! 1. ARP → [`crate::arp`] (answer for the gateway).
//! 2. Anything but IPv4 → drop (`drop_unsupported_l3`).
//! 3. IPv4: validate the header, then anti-spoof: the source address must be
//!    the endpoint behind this veth and the source MAC its MAC.
//! 4. Destination is a local pod → TTL−1, MACs rewritten, `bpf_redirect_peer`.
//! 5. Tunnel packets (VXLAN port, IPIP) to any node → drop (injection).
//! 6. Destination in a remote pod subnet → [`crate::remote`] (encap or
//!    native route toward the owning node).
//! 7. Destination is the node → pass to the host stack.
//! 8. Anything else → pass (NAT comes later).

use aya_ebpf::{EbpfContext as _, programs::TcContext};
use rivet_common::Counter;

use crate::{
    arp,
    headers::{
        ETH_HLEN, ETH_P_ARP, ETH_P_IP, EthHdr, IPPROTO_IPIP, IPPROTO_UDP, IPV4_HLEN, Ipv4Hdr,
    },
    ipv4, maps,
    packet::{addr, ensure_linear, ptr_at},
    remote::{self, Sender},
    verdict,
};

/// Bytes we want linear: Ethernet + an IPv4 header without options (ARP is shorter).
const LINEAR: u32 = (ETH_HLEN + IPV4_HLEN) as u32;

#[inline(always)]
pub fn handle(ctx: &TcContext) -> i32 {
    // SAFETY: `ctx.as_ptr()` is the program's __sk_buff, valid for its run.
    let ifindex = unsafe { (*(ctx.as_ptr() as *const aya_ebpf::bindings::__sk_buff)).ifindex };
    ensure_linear(ctx, LINEAR);

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
    if ipv4::validate(ip, ETH_HLEN, ctx.len()).is_err() {
        return verdict::drop(ctx, Counter::DropBadIpHeader);
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

    let dst = addr(&ip.dst);
    let Some(cfg) = maps::config() else {
        return verdict::drop(ctx, Counter::DropNotConfigured);
    };
    if let Some(peer) = maps::endpoint(dst) {
        if ip.ttl <= 1 {
            // The stack forwards nothing here but answers with time-exceeded.
            return verdict::pass(ctx, Counter::PassTtl);
        }
        ipv4::decrease_ttl(ip);
        eth.dst = peer.mac;
        eth.src = peer.host_mac;
        return verdict::redirect_peer(ctx, peer.ifindex, Counter::FwdLocal);
    }
    // Tunnel traffic from a pod to any node is never legitimate: it would be
    // decapsulated as if a node had sent it (tunnel injection).
    if (maps::is_local_addr(dst) || dst == cfg.node_ip || maps::peer(dst).is_some())
        && is_tunnel(ctx, ip, cfg.vxlan_port as u16)
    {
        return verdict::drop(ctx, Counter::DropTunnelFromPod);
    }
    if let Some(route) = maps::route(dst) {
        return remote::forward(ctx, &cfg, &route, Sender::Pod { ifindex, ep: src });
    }
    if maps::is_local_addr(dst) {
        return verdict::pass(ctx, Counter::PassHost);
    }
    verdict::pass(ctx, Counter::PassOther)
}

/// IPIP, or UDP to the VXLAN port.
#[inline(always)]
fn is_tunnel(ctx: &TcContext, ip: &Ipv4Hdr, vxlan_port: u16) -> bool {
    if ip.protocol == IPPROTO_IPIP {
        return true;
    }
    if ip.protocol != IPPROTO_UDP {
        return false;
    }
    let hlen = usize::from(ip.version_ihl & 0x0f) * 4;
    if !(IPV4_HLEN..=60).contains(&hlen) {
        return false;
    }
    ctx.load::<[u8; 2]>(ETH_HLEN + hlen + 2)
        .is_ok_and(|port| u16::from_be_bytes(port) == vxlan_port)
}
