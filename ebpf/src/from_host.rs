//! The node's own traffic to pods on other nodes, at TC egress of `rivet_host`
//! (the device carrying the cluster-CIDR route, source = node IP): encapsulated
//! or routed exactly like a pod's, without the router hop. The IPv4 and
//! transport headers are checked first (`drop_bad_ip_header`,
//! `drop_truncated`); destination in `ROUTES` → [`crate::remote`]; anything
//! else passes (`host_pass`; with ARP off nothing else is sent there).

use aya_ebpf::programs::TcContext;
use rivet_common::Counter;

use crate::{
    headers::{ETH_HLEN, ETH_P_IP, EthHdr, IPV4_HLEN, Ipv4Hdr},
    ipv4, maps,
    packet::{addr, ensure_linear, ptr_at},
    remote::{self, Sender},
    verdict,
};

#[inline(always)]
pub fn handle(ctx: &TcContext) -> i32 {
    ensure_linear(ctx, (ETH_HLEN + IPV4_HLEN) as u32);
    let (Some(eth), Some(ip)) = (ptr_at::<EthHdr>(ctx, 0), ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN)) else {
        return verdict::pass(ctx, Counter::HostPass);
    };
    // SAFETY: bounds-checked above; alignment 1.
    let (proto, dst) = unsafe { ((*eth).proto, addr(&(*ip).dst)) };
    if proto != ETH_P_IP {
        return verdict::pass(ctx, Counter::HostPass);
    }
    let (Some(cfg), Some(route)) = (maps::config(), maps::route(dst)) else {
        return verdict::pass(ctx, Counter::HostPass);
    };
    // The stack builds sane headers, but a packet socket on rivet_host can
    // send anything: never encapsulate a datagram the peer would drop.
    // SAFETY: bounds-checked above; alignment 1; nothing moved the data.
    let ip = unsafe { &*ip };
    let Ok(hlen) = ipv4::validate(ip, ETH_HLEN, ctx.len()) else {
        return verdict::drop(ctx, Counter::DropBadIpHeader);
    };
    if !ipv4::transport_fits(ctx, ip, ETH_HLEN + hlen, hlen) {
        return verdict::drop(ctx, Counter::DropTruncated);
    }
    remote::forward(ctx, &cfg, &route, Sender::Host)
}
