//! ICMP errors built by the datapath from the packet they answer.
//!
//! Fragmentation-needed: a pod sends a DF packet that would not fit the
//! uplink once encapsulated. The pod gets "destination unreachable /
//! fragmentation needed" from its gateway with the MTU it can use, so path
//! MTU discovery works (no black hole).
//!
//! Port unreachable: a client at the uplink reaches a Service frontend with
//! no backend; it gets "destination unreachable / port unreachable" from
//! the frontend address at once (what kube-proxy's REJECT rule sends), a
//! TCP client a refused connection instead of a 20 s timeout.

use aya_ebpf::{
    bindings::bpf_adj_room_mode::BPF_ADJ_ROOM_MAC,
    helpers::{bpf_redirect, bpf_skb_change_tail},
    programs::TcContext,
};
use rivet_common::{Counter, EndpointInfo};

use crate::{
    headers::{ETH_HLEN, EthHdr, IPPROTO_ICMP, IPV4_HLEN, IcmpHdr, Ipv4Hdr},
    ipv4::outer_header,
    packet::ptr_at,
    verdict,
};

/// Bytes of the offending packet quoted: its IPv4 header (no options) and
/// the first 8 bytes of its payload (RFC 792).
const QUOTE: usize = IPV4_HLEN + 8;
const ICMP_LEN: usize = 8 + QUOTE;

/// What is written after the Ethernet header of the answer.
#[repr(C)]
#[derive(Clone, Copy)]
struct Answer {
    ip: Ipv4Hdr,
    icmp: IcmpHdr,
}

/// One's-complement checksum of the ICMP header and quote (36 bytes at
/// offset 34 of the answer).
#[inline(always)]
fn icmp_checksum(bytes: &[u8; ICMP_LEN]) -> [u8; 2] {
    let mut sum: u32 = 0;
    let mut i = 0;
    while i < ICMP_LEN {
        sum += u32::from(u16::from_be_bytes([bytes[i], bytes[i + 1]]));
        i += 2;
    }
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    (!(sum as u16)).to_be_bytes()
}

/// Turns the packet into the ICMP answer and sends it back to the pod
/// behind `ifindex`. `mtu` is the largest IPv4 packet that fits.
#[inline(always)]
pub fn frag_needed(
    ctx: &TcContext,
    ifindex: u32,
    ep: &EndpointInfo,
    gateway: u32,
    mtu: u16,
) -> i32 {
    let rest = [0, 0, (mtu >> 8) as u8, mtu as u8];
    match build(ctx, gateway, 4, rest, Counter::DropTooBig) {
        Ok(()) => match set_macs(ctx, ep.mac, ep.host_mac, Counter::DropTooBig) {
            Ok(()) => verdict::redirect(ctx, ifindex, Counter::IcmpFragNeeded),
            Err(reason) => verdict::drop(ctx, reason),
        },
        Err(reason) => verdict::drop(ctx, reason),
    }
}

/// Turns a packet that arrived at the uplink for the frontend `frontend`
/// into "port unreachable" from that address and sends it back out of the
/// uplink (`ifindex`) toward the client. The original packet is counted as
/// `drop_svc_no_backend` (it goes nowhere); the answer is not counted again.
#[inline(always)]
pub fn port_unreachable(ctx: &TcContext, ifindex: u32, frontend: u32) -> i32 {
    let Some(eth) = ptr_at::<EthHdr>(ctx, 0) else {
        return verdict::drop(ctx, Counter::DropSvcNoBackend);
    };
    // SAFETY: bounds-checked; alignment 1.
    let (dst_mac, src_mac) = unsafe { ((*eth).dst, (*eth).src) };
    let rejected = verdict::drop(ctx, Counter::DropSvcNoBackend);
    let built = build(ctx, frontend, 3, [0; 4], Counter::DropSvcNoBackend)
        .and_then(|()| set_macs(ctx, src_mac, dst_mac, Counter::DropSvcNoBackend));
    match built {
        // SAFETY: plain helper call; it only records the target and returns a verdict.
        Ok(()) => unsafe { bpf_redirect(ifindex, 0) as i32 },
        Err(_) => rejected,
    }
}

/// Sets the answer's Ethernet addresses.
#[inline(always)]
fn set_macs(ctx: &TcContext, dst: [u8; 6], src: [u8; 6], fail: Counter) -> Result<(), Counter> {
    let eth = ptr_at::<EthHdr>(ctx, 0).ok_or(fail)?;
    // SAFETY: bounds-checked after the last size change; alignment 1.
    unsafe {
        (*eth).dst = dst;
        (*eth).src = src;
    }
    Ok(())
}

/// Turns the packet into "destination unreachable" (`code`: 3 port, 4
/// fragmentation needed; `rest`: the header's last four bytes) from `from`
/// to its sender, quoting it.
#[inline(always)]
fn build(
    ctx: &TcContext,
    from: u32,
    code: u8,
    rest: [u8; 4],
    fail: Counter,
) -> Result<(), Counter> {
    let ip = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN).ok_or(fail)?;
    // SAFETY: bounds-checked; alignment 1.
    let (ihl, sender) = unsafe { ((*ip).version_ihl & 0x0f, (*ip).src) };
    if ihl != 5 || (ctx.len() as usize) < ETH_HLEN + QUOTE {
        return Err(fail);
    }
    // Room for the new IPv4 + ICMP headers in front of the quoted packet,
    // then cut the quote to 28 bytes.
    ctx.adjust_room((IPV4_HLEN + 8) as i32, BPF_ADJ_ROOM_MAC, 0)
        .map_err(|_| fail)?;
    // SAFETY: plain helper call on the program's skb.
    let rc =
        unsafe { bpf_skb_change_tail(ctx.skb.skb, (ETH_HLEN + IPV4_HLEN + ICMP_LEN) as u32, 0) };
    if rc != 0 {
        return Err(fail);
    }
    let answer = Answer {
        ip: outer_header(
            from,
            u32::from_ne_bytes(sender),
            IPPROTO_ICMP,
            0xc0,
            (IPV4_HLEN + ICMP_LEN) as u16,
        ),
        icmp: IcmpHdr {
            kind: 3,
            code,
            check: [0, 0],
            rest,
        },
    };
    let head = ptr_at::<Answer>(ctx, ETH_HLEN).ok_or(fail)?;
    let body = ptr_at::<[u8; ICMP_LEN]>(ctx, ETH_HLEN + IPV4_HLEN).ok_or(fail)?;
    // SAFETY: both were bounds-checked after the last size change;
    // alignment 1.
    unsafe {
        *head = answer;
        let check = icmp_checksum(&*body);
        (*head).icmp.check = check;
    }
    Ok(())
}
