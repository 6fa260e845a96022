//! ICMP errors about translated flows (destination unreachable incl.
//! fragmentation needed, time exceeded, parameter problem). The error quotes
//! the packet as it travelled, so the quoted header and the outer address are
//! translated like the flow itself — otherwise path MTU discovery and
//! "connection refused" break at the NAT, or an error leaves with a pod's
//! address:
//!
//! - to the node about a masqueraded flow (quoted source = node IP, its reply
//!   entry found) → the pod (outer destination, quoted source and port or echo
//!   identifier);
//! - to a node address about a hostPort connection's answer (quoting node
//!   address, hostPort → client; matched through `HOSTPORTS` and the
//!   connection's `NAT` entry) → the pod (the same rewrites);
//! - from a pod about a packet that reached it through a hostPort (quoting
//!   client → pod, container port) → the client (here, on another node through
//!   the overlay, or on the underlay), as the node (outer source, quoted
//!   destination and port; `rev_dnat`).
//! - from a pod about a packet that reached it through the masquerade (a reply
//!   of one of its flows: quoted remote → pod matching the flow's egress entry,
//!   the error addressed to that remote) → the remote, as the node: TTL − 1,
//!   the same rewrites to the flow's NAT port (`fwd_snat`, `snat_error_out`).
//!   Any other ICMP a pod sends toward a masqueraded destination, but an echo
//!   request, is dropped (`drop_nat_icmp_unknown`): it would leave with the
//!   pod's address.
//!
//! Every change inside the ICMP message is balanced in the quoted header's
//! checksum and the ICMP checksum (the quoted transport checksum is left alone:
//! receivers do not check it).

use aya_ebpf::programs::TcContext;
use rivet_common::{Counter, NatKey, NodeConfig, nat_dir};

use crate::{
    headers::{ETH_HLEN, IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_UDP},
    maps::{self, NAT},
    nat::{self, ICMP_ECHO_REQUEST, IP_CSUM, IP_DST, IP_SRC, Ip, Reply},
    verdict,
};

const ICMP_DEST_UNREACH: u8 = 3;
const ICMP_TIME_EXCEEDED: u8 = 11;
const ICMP_PARAMETER_PROBLEM: u8 = 12;

/// The packet an ICMP error quotes.
struct Quoted {
    /// Offset of the ICMP header in the frame.
    icmp: usize,
    /// Offset of the quoted IPv4 header.
    inner: usize,
    proto: u8,
    src: u32,
    dst: u32,
    /// Ports (wire order); an echo request's identifier is `sport`, 0 is
    /// `dport`.
    sport: u16,
    dport: u16,
    /// Offsets of the quoted source and destination port (both the
    /// identifier's for an echo request).
    sport_off: usize,
    dport_off: usize,
}

/// Parses an ICMP error and the header it quotes (TCP, UDP, echo request).
#[inline(always)]
fn quoted(ctx: &TcContext, ip: &Ip) -> Option<Quoted> {
    if ip.proto != IPPROTO_ICMP || ip.frag & 0x3fff != 0 {
        return None;
    }
    let icmp = ETH_HLEN + ip.hlen;
    let kind = ctx.load::<u8>(icmp).ok()?;
    if kind != ICMP_DEST_UNREACH && kind != ICMP_TIME_EXCEEDED && kind != ICMP_PARAMETER_PROBLEM {
        return None;
    }
    let inner = icmp + 8;
    let vihl = ctx.load::<u8>(inner).ok()?;
    let ihl = usize::from(vihl & 0x0f) * 4;
    if vihl >> 4 != 4 || !(20..=60).contains(&ihl) {
        return None;
    }
    let proto = ctx.load::<u8>(inner + 9).ok()?;
    let src = u32::from_ne_bytes(ctx.load::<[u8; 4]>(inner + 12).ok()?);
    let dst = u32::from_ne_bytes(ctx.load::<[u8; 4]>(inner + 16).ok()?);
    let l4 = inner + ihl;
    let (sport, dport, sport_off, dport_off) = match proto {
        IPPROTO_TCP | IPPROTO_UDP => {
            let p = ctx.load::<[u8; 4]>(l4).ok()?;
            (
                u16::from_ne_bytes([p[0], p[1]]),
                u16::from_ne_bytes([p[2], p[3]]),
                l4,
                l4 + 2,
            )
        }
        IPPROTO_ICMP => {
            if ctx.load::<u8>(l4).ok()? != ICMP_ECHO_REQUEST {
                return None;
            }
            let id = u16::from_ne_bytes(ctx.load::<[u8; 2]>(l4 + 4).ok()?);
            (id, 0, l4 + 4, l4 + 4)
        }
        _ => return None,
    };
    Some(Quoted {
        icmp,
        inner,
        proto,
        src,
        dst,
        sport,
        dport,
        sport_off,
        dport_off,
    })
}

/// An error to the node about a masqueraded flow: the quoted packet went
/// out as (node, NAT port) → (remote, port); its flow's reply entry is
/// keyed the other way round.
#[inline(always)]
pub fn snat_error(ctx: &TcContext, cfg: &NodeConfig, ip: &Ip) -> Reply {
    let Some(q) = quoted(ctx, ip) else {
        return Reply::NotOurs;
    };
    if q.src != cfg.node_ip {
        return Reply::NotOurs;
    }
    let key = NatKey::new(
        q.dst,
        cfg.node_ip,
        (q.dport, q.sport),
        q.proto,
        nat_dir::REPLY,
    );
    let Some(entry) = NAT.get_ptr(key) else {
        return Reply::NotOurs;
    };
    // SAFETY: a map value pointer from a successful lookup; address and
    // port of an entry never change.
    let (pod_ip, pod_port) = unsafe { ((*entry).addr, (*entry).port) };
    deliver(ctx, &q, (cfg.node_ip, pod_ip), (q.sport, pod_port))
}

/// An error to a node address (or an external Service address) about a
/// hostPort or Service connection's answer: the quoted packet went out as
/// (node address, hostPort) or (frontend, port) → (client, port); the pod
/// is the hostPort's, or the backend the Service flow holds.
#[inline(always)]
pub fn hostport_error_in(ctx: &TcContext, ip: &Ip) -> Reply {
    let Some(q) = quoted(ctx, ip) else {
        return Reply::NotOurs;
    };
    if q.src != ip.dst || q.proto == IPPROTO_ICMP {
        return Reply::NotOurs;
    }
    let (pod_ip, pod_port) = match maps::hostport(q.src, q.sport, q.proto) {
        Some(target) => (target.pod_ip, target.port),
        None => {
            let flow = NatKey::new(q.dst, q.src, (q.dport, q.sport), q.proto, nat_dir::SVC);
            let Some(entry) = NAT.get_ptr(flow) else {
                return Reply::NotOurs;
            };
            // SAFETY: as in `snat_error`.
            unsafe { ((*entry).addr, (*entry).port) }
        }
    };
    let key = NatKey::new(pod_ip, q.dst, (pod_port, q.dport), q.proto, nat_dir::DNAT);
    if NAT.get_ptr(key).is_none() {
        return Reply::NotOurs;
    }
    deliver(ctx, &q, (q.src, pod_ip), (q.sport, pod_port))
}

/// Rewrites an inbound error for the pod at `pod` and returns it for
/// delivery.
#[inline(always)]
fn deliver(ctx: &TcContext, q: &Quoted, (node, pod): (u32, u32), ports: (u16, u16)) -> Reply {
    let Some(ep) = maps::endpoint(pod) else {
        return Reply::NotOurs;
    };
    let ep = *ep;
    match translate(ctx, q, false, (node, pod), ports) {
        Ok(()) => Reply::Deliver(ep),
        Err(reason) => Reply::Done(verdict::drop(ctx, reason)),
    }
}

/// An error a pod sends about a packet that reached it through a hostPort
/// (the quoted packet: client → pod, container port): it leaves as the
/// node address and hostPort the client used, toward the client wherever
/// it is ([`nat::client_of`]). `None`: not such an error.
#[inline(always)]
pub fn hostport_error_out(
    ctx: &TcContext,
    cfg: &NodeConfig,
    ip: &Ip,
    ttl: u8,
) -> Option<nat::Answer> {
    let q = quoted(ctx, ip)?;
    if q.dst != ip.src || q.proto == IPPROTO_ICMP {
        return None;
    }
    let key = NatKey::new(q.dst, q.src, (q.dport, q.sport), q.proto, nat_dir::DNAT);
    let entry = NAT.get_ptr(key)?;
    // SAFETY: as in `snat_error`.
    let (addr, port) = unsafe { ((*entry).addr, (*entry).port) };
    if ttl <= 1 {
        return Some(nat::Answer::Done(verdict::pass(ctx, Counter::PassTtl)));
    }
    // Where it goes is settled before anything is rewritten: a packet
    // that cannot leave is dropped as it came.
    let to = match nat::client_of(ctx, cfg, addr, ip.dst) {
        Ok(to) => to,
        Err(v) => return Some(nat::Answer::Done(v)),
    };
    if !matches!(to, nat::AnswerTo::Elsewhere(_)) {
        nat::decrease_ttl(ctx);
    }
    if let Err(reason) = translate(ctx, &q, true, (ip.src, addr), (q.dport, port)) {
        return Some(nat::Answer::Done(verdict::drop(ctx, reason)));
    }
    Some(nat::send_to(ctx, to))
}

/// An error a pod sends about a packet that reached it through the
/// masquerade: the quoted packet is a reply of one of the pod's flows as
/// delivered (remote, port → pod, pod port), and the error goes back to
/// that remote. It leaves as the flow does: outer source and quoted
/// destination → the node, quoted port → the flow's NAT port, out of the
/// uplink (`fwd_snat`). `None`: not an error about a flow the NAT knows.
/// The caller checked TTL > 1.
#[inline(always)]
pub fn snat_error_out(ctx: &TcContext, cfg: &NodeConfig, ip: &Ip) -> Option<i32> {
    let q = quoted(ctx, ip)?;
    // About a packet the pod itself received from the error's
    // destination; no echo request reaches a pod through the masquerade.
    if q.dst != ip.src || q.src != ip.dst || q.proto == IPPROTO_ICMP {
        return None;
    }
    let key = NatKey::new(q.dst, q.src, (q.dport, q.sport), q.proto, nat_dir::EGRESS);
    let entry = NAT.get_ptr(key)?;
    // SAFETY: as in `snat_error`.
    let (node_ip, port) = unsafe { ((*entry).addr, (*entry).port) };
    // The route first: an error that cannot leave is dropped as it came.
    let Some(hop) = crate::fib::lookup(ctx, node_ip, ip.dst, cfg.uplink_ifindex) else {
        return Some(verdict::drop(ctx, Counter::DropNoRoute));
    };
    if let Some(hdr) = crate::packet::ptr_at::<crate::headers::Ipv4Hdr>(ctx, ETH_HLEN) {
        // SAFETY: bounds-checked; alignment 1; no helper moved or rewrote
        // packet data since the check.
        crate::ipv4::decrease_ttl(unsafe { &mut *hdr });
    }
    if let Err(reason) = translate(ctx, &q, true, (ip.src, node_ip), (q.dport, port)) {
        return Some(verdict::drop(ctx, reason));
    }
    Some(verdict::transmit(ctx, &hop, Counter::FwdSnat))
}

/// The rewrites: inbound (toward the pod) the quoted source and outer
/// destination, outbound (from the pod) the quoted destination and outer
/// source; `old → new` address and quoted port.
#[inline(always)]
fn translate(
    ctx: &TcContext,
    q: &Quoted,
    outbound: bool,
    (old, new): (u32, u32),
    (old_port, new_port): (u16, u16),
) -> Result<(), Counter> {
    let fail = |_| Counter::DropNatRewrite;
    let icmp_csum = q.icmp + 2;
    let inner_csum = q.inner + 10;
    let (quoted_addr, quoted_port, outer_addr) = if outbound {
        (q.inner + 16, q.dport_off, IP_SRC)
    } else {
        (q.inner + 12, q.sport_off, IP_DST)
    };
    let (from, to) = (u64::from(old), u64::from(new));
    // The quoted address, and the quoted header's checksum with it.
    let before = ctx.load::<u16>(inner_csum).map_err(fail)?;
    ctx.l3_csum_replace(inner_csum, from, to, 4).map_err(fail)?;
    let after = ctx.load::<u16>(inner_csum).map_err(fail)?;
    ctx.store(quoted_addr, &new, 0).map_err(fail)?;
    ctx.l4_csum_replace(icmp_csum, from, to, 4).map_err(fail)?;
    ctx.l4_csum_replace(icmp_csum, u64::from(before), u64::from(after), 2)
        .map_err(fail)?;
    // The quoted port (or echo identifier).
    ctx.store(quoted_port, &new_port, 0).map_err(fail)?;
    ctx.l4_csum_replace(icmp_csum, u64::from(old_port), u64::from(new_port), 2)
        .map_err(fail)?;
    // The outer address.
    ctx.l3_csum_replace(IP_CSUM, from, to, 4).map_err(fail)?;
    ctx.store(outer_addr, &new, 0).map_err(fail)
}
