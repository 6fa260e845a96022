//! Adding and removing tunnel headers with `bpf_skb_adjust_room`, the flag
//! combinations measured to keep GSO working on this kernel: FIXED_GSO on both
//! sides, ENCAP_* describing the new headers on encap, DECAP_L3_IPV4 on decap.
//!
//! - VXLAN (`BPF_ADJ_ROOM_MAC` with `FIXED_GSO | ENCAP_L3_IPV4 | ENCAP_L4_UDP |
//!   ENCAP_L2_ETH | ENCAP_L2(14)`, so GSO/TSO cuts the inner TCP stream and the
//!   kernel replicates the outer headers per segment): outer IPv4 (DF set, TTL
//!   64, TOS copied from the inner header, full checksum); UDP source port from
//!   the inner flow hash scaled into 32768–61000 — `skb->hash` when set (a
//!   socket's txhash), else a Jenkins hash of the inner addresses, protocol and
//!   ports computed in the program (fragments: no ports), not the flow
//!   dissector (`bpf_get_hash_recalc`, 110–190 ns alone: BENCHMARKS.md);
//!   destination port `vxlan_port`, checksum 0 (RFC 7348 over IPv4); VXLAN
//!   flags I + VNI (the peer's, else the node's); inner Ethernet (dst = the
//!   peer's VTEP MAC from `PEERS`, src = ours).
//! - IPIP: `FIXED_GSO | ENCAP_L3_IPV4`, outer IPv4 protocol 4. No kernel `ipip`
//!   module is needed on either side: decap is ours too.
//! - Decap: `adjust_room(−overhead, FIXED_GSO | DECAP_L3_IPV4)` strips the
//!   outer IPv4 (+ UDP + VXLAN + inner Ethernet); the outer Ethernet header
//!   stays and is rewritten. With FIXED_GSO a GRO-merged packet keeps its
//!   segment size.

use aya_ebpf::{
    bindings::{
        BPF_F_ADJ_ROOM_DECAP_L3_IPV4, BPF_F_ADJ_ROOM_ENCAP_L2_ETH, BPF_F_ADJ_ROOM_ENCAP_L3_IPV4,
        BPF_F_ADJ_ROOM_ENCAP_L4_UDP, BPF_F_ADJ_ROOM_FIXED_GSO, bpf_adj_room_mode::BPF_ADJ_ROOM_MAC,
    },
    programs::TcContext,
};
use rivet_common::{Counter, IPIP_OVERHEAD, NodeConfig, PeerInfo, RouteInfo, VXLAN_OVERHEAD};

use crate::{
    headers::{
        ETH_HLEN, ETH_P_IP, EthHdr, IPPROTO_IPIP, IPPROTO_TCP, IPPROTO_UDP, Ipv4Hdr, UdpHdr,
        VXLAN_FLAG_VNI, VxlanEncap, VxlanHdr,
    },
    ipv4::{IP_MF, IP_OFFSET, outer_header},
    packet::ptr_at,
};

/// `BPF_F_ADJ_ROOM_ENCAP_L2(len)`: the inner L2 header length, in the top byte.
const fn encap_l2(len: u64) -> u64 {
    (len & 0xff) << 56
}

const VXLAN_ENCAP_FLAGS: u64 = (BPF_F_ADJ_ROOM_FIXED_GSO
    | BPF_F_ADJ_ROOM_ENCAP_L3_IPV4
    | BPF_F_ADJ_ROOM_ENCAP_L4_UDP
    | BPF_F_ADJ_ROOM_ENCAP_L2_ETH) as u64
    | encap_l2(ETH_HLEN as u64);
const IPIP_ENCAP_FLAGS: u64 = (BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_ENCAP_L3_IPV4) as u64;
const DECAP_FLAGS: u64 = (BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_DECAP_L3_IPV4) as u64;

/// SCTP (ports in the first four bytes, like TCP and UDP).
const IPPROTO_SCTP: u8 = 132;

/// Ephemeral UDP source port range Linux's vxlan device uses by default.
const SPORT_MIN: u32 = 32768;
const SPORT_MAX: u32 = 61000;

/// The TOS of the inner IPv4 header (copied to the outer one).
#[inline(always)]
fn inner_tos(ctx: &TcContext) -> Result<u8, Counter> {
    let ip = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN).ok_or(Counter::DropTruncated)?;
    // SAFETY: bounds-checked; alignment 1.
    Ok(unsafe { (*ip).tos })
}

/// Flow hash of the inner packet: it picks the UDP source port, which
/// spreads flows over the underlay's ECMP paths and the receiver's RSS
/// queues. The skb's own hash when it has one (a connected socket's
/// txhash, a NIC's RSS hash: what `skb_get_hash`, and so Linux's vxlan
/// device, would return without dissecting anything); otherwise a Jenkins
/// hash of addresses, protocol and — for TCP, UDP and SCTP that are not
/// fragments — ports, computed here from the header already checked,
/// instead of `bpf_get_hash_recalc`'s flow dissector (110–160 ns alone:
/// `helper_get_hash_recalc_ns` of the program-cost benchmark).
/// Like the dissector, any fragment hashes without ports, so all fragments
/// of a datagram take one path.
#[inline(always)]
fn flow_hash(ctx: &TcContext) -> u32 {
    // SAFETY: reading a field of the program's __sk_buff.
    let hash = unsafe { (*ctx.skb.skb).hash };
    if hash != 0 {
        return hash;
    }
    let Some(ip) = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN) else {
        return 0;
    };
    // SAFETY: bounds-checked; alignment 1.
    let ip = unsafe { &*ip };
    let frag = u16::from_be_bytes(ip.frag_off) & (IP_MF | IP_OFFSET) != 0;
    let ports = match ip.protocol {
        IPPROTO_TCP | IPPROTO_UDP | IPPROTO_SCTP if !frag => {
            let l4 = ETH_HLEN + usize::from(ip.version_ihl & 0x0f) * 4;
            ctx.load::<u32>(l4).unwrap_or(0)
        }
        _ => 0,
    };
    jhash_3words(
        u32::from_ne_bytes(ip.src),
        u32::from_ne_bytes(ip.dst),
        ports ^ u32::from(ip.protocol),
    )
}

/// Linux's `jhash_3words` (lookup3's final mix) with seed 0.
#[inline(always)]
fn jhash_3words(a: u32, b: u32, c: u32) -> u32 {
    const INIT: u32 = 0xdead_beef_u32.wrapping_add(3 << 2);
    let (mut a, mut b, mut c) = (
        a.wrapping_add(INIT),
        b.wrapping_add(INIT),
        c.wrapping_add(INIT),
    );
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(14));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(11));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(25));
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(16));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(4));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(14));
    c ^= b;
    c.wrapping_sub(b.rotate_left(24))
}

/// Wraps the IPv4 packet in outer IPv4 + UDP + VXLAN + inner Ethernet.
/// The outer Ethernet header is filled in when the packet is transmitted.
#[inline(always)]
pub fn vxlan(
    ctx: &TcContext,
    cfg: &NodeConfig,
    route: &RouteInfo,
    peer: &PeerInfo,
) -> Result<(), Counter> {
    let tos = inner_tos(ctx)?;
    let hash = flow_hash(ctx);
    ctx.adjust_room(VXLAN_OVERHEAD as i32, BPF_ADJ_ROOM_MAC, VXLAN_ENCAP_FLAGS)
        .map_err(|_| Counter::DropEncapFailed)?;
    let outer_len = (ctx.len() as usize - ETH_HLEN) as u16;
    let sport = SPORT_MIN + ((u64::from(hash) * u64::from(SPORT_MAX - SPORT_MIN)) >> 32) as u32;
    let vni = if peer.vni != 0 { peer.vni } else { cfg.vni };
    let hdr = VxlanEncap {
        ip: outer_header(cfg.node_ip, route.node_ip, IPPROTO_UDP, tos, outer_len),
        udp: UdpHdr {
            source: (sport as u16).to_be_bytes(),
            dest: (cfg.vxlan_port as u16).to_be_bytes(),
            len: (outer_len - 20).to_be_bytes(),
            // RFC 7348: zero UDP checksum over IPv4 is allowed.
            check: [0, 0],
        },
        vxlan: VxlanHdr {
            flags: VXLAN_FLAG_VNI,
            reserved1: [0; 3],
            vni: [(vni >> 16) as u8, (vni >> 8) as u8, vni as u8],
            reserved2: 0,
        },
        eth: EthHdr {
            dst: peer.vtep_mac,
            src: cfg.vtep_mac,
            proto: ETH_P_IP,
        },
    };
    let p = ptr_at::<VxlanEncap>(ctx, ETH_HLEN).ok_or(Counter::DropEncapFailed)?;
    // SAFETY: bounds-checked just above (pointers re-derived after
    // adjust_room); alignment 1.
    unsafe { *p = hdr };
    Ok(())
}

/// Wraps the IPv4 packet in an outer IPv4 header (protocol 4).
#[inline(always)]
pub fn ipip(ctx: &TcContext, cfg: &NodeConfig, route: &RouteInfo) -> Result<(), Counter> {
    let tos = inner_tos(ctx)?;
    ctx.adjust_room(IPIP_OVERHEAD as i32, BPF_ADJ_ROOM_MAC, IPIP_ENCAP_FLAGS)
        .map_err(|_| Counter::DropEncapFailed)?;
    let outer_len = (ctx.len() as usize - ETH_HLEN) as u16;
    let hdr = outer_header(cfg.node_ip, route.node_ip, IPPROTO_IPIP, tos, outer_len);
    let p = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN).ok_or(Counter::DropEncapFailed)?;
    // SAFETY: bounds-checked after adjust_room; alignment 1.
    unsafe { *p = hdr };
    Ok(())
}

/// Removes `len` bytes after the outer Ethernet header (the outer IPv4
/// header and whatever tunnel headers follow it).
#[inline(always)]
pub fn strip(ctx: &TcContext, len: u32) -> Result<(), Counter> {
    ctx.adjust_room(-(len as i32), BPF_ADJ_ROOM_MAC, DECAP_FLAGS)
        .map_err(|_| Counter::DropEncapFailed)
}
