//! Every frame the tests send or feed to a program is built here: Ethernet
//! and ARP, IPv4 (options, fragments), TCP, UDP and ICMP with correct
//! checksums, ICMP errors quoting a packet, IPv6 and ICMPv6 (router
//! advertisements, redirects), VXLAN and IPIP encapsulation; plus the
//! checks tests make on what comes out (checksums that verify).
//!
//! Builders return plain bytes and compose by nesting, each layer's output
//! the next one's payload:
//!
//! ```
//! # use std::net::Ipv4Addr;
//! use rivet_tests::packet::{IPPROTO_UDP, ipv4_frame, udp_checksummed};
//! let (a, b) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
//! let f = ipv4_frame(([2; 6], [4; 6]), (a, b), IPPROTO_UDP, udp_checksummed(a, b, 1, 2, b"hi"));
//! assert_eq!(f.len(), 14 + 20 + 8 + 2);
//! ```
//!
//! A deliberately malformed frame (a cut header, an IHL or length that
//! lies, a wrong checksum) is built right and then changed: by indexing,
//! or with [`edit_ipv4`] and [`truncate_ipv4`], which recompute the header
//! checksum so that the lie is the frame's only defect.
//!
//! Why our own builders and not the `etherparse` crate (0.21, pure Rust,
//! builds with this toolchain): its `PacketBuilder` writes only well-formed
//! packets, through `Result`s, with identification 0 and every checksum
//! filled in. The tests need the bytes they choose: the fixed
//! identification and DF bit that byte-exact comparisons expect, TCP and
//! UDP checksums left zero where the programs only update them
//! incrementally, quoted headers cut anywhere, lengths and IHLs that lie;
//! and it knows neither VXLAN nor the ND options sent here. Each builder
//! below is a few lines of plain bytes, so the crate would make the tests
//! longer, not shorter.

use std::net::{Ipv4Addr, Ipv6Addr};

/// IPv4 ethertype.
pub const ETH_P_IP: u16 = 0x0800;
/// ARP ethertype.
pub const ETH_P_ARP: u16 = 0x0806;
/// IPv6 ethertype.
pub const ETH_P_IPV6: u16 = 0x86dd;

/// Broadcast MAC.
pub const BROADCAST: [u8; 6] = [0xff; 6];
/// The IPv6 all-nodes multicast MAC (33:33:00:00:00:01).
pub const ALL_NODES_MAC: [u8; 6] = [0x33, 0x33, 0, 0, 0, 1];

/// IP protocol numbers.
pub const IPPROTO_ICMP: u8 = 1;
/// IP in IP.
pub const IPPROTO_IPIP: u8 = 4;
/// TCP.
pub const IPPROTO_TCP: u8 = 6;
/// UDP.
pub const IPPROTO_UDP: u8 = 17;
/// ICMPv6.
pub const IPPROTO_ICMPV6: u8 = 58;

/// IPv4 flags: don't fragment.
pub const IP_DF: u16 = 0x4000;
/// IPv4 flags: more fragments.
pub const IP_MF: u16 = 0x2000;

// --- checksums and reading ---------------------------------------------------

/// Internet checksum (RFC 1071) of `data`.
pub fn checksum(data: &[u8]) -> u16 {
    let mut sum = 0u32;
    for chunk in data.chunks(2) {
        let word = if chunk.len() == 2 {
            u16::from_be_bytes([chunk[0], chunk[1]])
        } else {
            u16::from_be_bytes([chunk[0], 0])
        };
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Checksum of a TCP/UDP `segment` (its checksum field as it is) over the
/// IPv4 pseudo-header: 0 when the segment's checksum verifies.
pub fn l4_checksum(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, segment: &[u8]) -> u16 {
    let mut data = Vec::with_capacity(12 + segment.len());
    data.extend_from_slice(&src.octets());
    data.extend_from_slice(&dst.octets());
    data.extend_from_slice(&[0, proto]);
    data.extend_from_slice(&(segment.len() as u16).to_be_bytes());
    data.extend_from_slice(segment);
    checksum(&data)
}

/// True if the IPv4 header at `off` has a valid checksum.
pub fn ipv4_checksum_ok(frame: &[u8], off: usize) -> bool {
    let ihl = usize::from(frame[off] & 0x0f) * 4;
    checksum(&frame[off..off + ihl]) == 0
}

/// True if the TCP/UDP checksum of the IPv4 packet at `off` verifies (the
/// segment ends where the packet's total length says).
pub fn l4_checksum_ok(frame: &[u8], off: usize) -> bool {
    let ip = &frame[off..];
    let hlen = usize::from(ip[0] & 0x0f) * 4;
    let tot = usize::from(be16(&ip[2..4]));
    let addr = |b: &[u8]| Ipv4Addr::new(b[0], b[1], b[2], b[3]);
    l4_checksum(addr(&ip[12..16]), addr(&ip[16..20]), ip[9], &ip[hlen..tot]) == 0
}

/// The big-endian `u16` at the start of `b`.
pub fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

// --- Ethernet and ARP --------------------------------------------------------

/// An Ethernet header.
pub fn eth(dst: [u8; 6], src: [u8; 6], proto: u16) -> Vec<u8> {
    let mut v = Vec::with_capacity(14);
    v.extend_from_slice(&dst);
    v.extend_from_slice(&src);
    v.extend_from_slice(&proto.to_be_bytes());
    v
}

/// Concatenates parts.
pub fn frame(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// An Ethernet/IPv4 ARP packet (28 bytes after the Ethernet header).
pub fn arp(op: u16, sha: [u8; 6], spa: Ipv4Addr, tha: [u8; 6], tpa: Ipv4Addr) -> Vec<u8> {
    let mut v = Vec::with_capacity(28);
    v.extend_from_slice(&1u16.to_be_bytes());
    v.extend_from_slice(&ETH_P_IP.to_be_bytes());
    v.push(6);
    v.push(4);
    v.extend_from_slice(&op.to_be_bytes());
    v.extend_from_slice(&sha);
    v.extend_from_slice(&spa.octets());
    v.extend_from_slice(&tha);
    v.extend_from_slice(&tpa.octets());
    v
}

// --- IPv4 --------------------------------------------------------------------

/// Fields of an IPv4 packet to build.
#[derive(Debug, Clone)]
pub struct Ipv4 {
    /// Source.
    pub src: Ipv4Addr,
    /// Destination.
    pub dst: Ipv4Addr,
    /// Type of service (DSCP and ECN).
    pub tos: u8,
    /// Identification.
    pub id: u16,
    /// Flags and fragment offset ([`IP_DF`], [`IP_MF`], [`frag_field`]).
    pub frag: u16,
    /// TTL.
    pub ttl: u8,
    /// L4 protocol.
    pub protocol: u8,
    /// Options (multiple of 4 bytes).
    pub options: Vec<u8>,
    /// Payload after the header.
    pub payload: Vec<u8>,
}

impl Ipv4 {
    /// A UDP datagram 53 → 53 (no UDP checksum) with 4 bytes of data;
    /// identification 0x1234, DF, TTL 64.
    pub fn new(src: Ipv4Addr, dst: Ipv4Addr) -> Self {
        Self {
            src,
            dst,
            tos: 0,
            id: 0x1234,
            frag: IP_DF,
            ttl: 64,
            protocol: IPPROTO_UDP,
            options: Vec::new(),
            payload: udp(53, 53, b"rivt"),
        }
    }

    /// Header + payload with a correct checksum.
    pub fn bytes(&self) -> Vec<u8> {
        let ihl = 5 + self.options.len() / 4;
        let total = ihl * 4 + self.payload.len();
        let mut h = vec![0u8; 20];
        h[0] = 0x40 | ihl as u8;
        h[1] = self.tos;
        h[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        h[4..6].copy_from_slice(&self.id.to_be_bytes());
        h[6..8].copy_from_slice(&self.frag.to_be_bytes());
        h[8] = self.ttl;
        h[9] = self.protocol;
        h[12..16].copy_from_slice(&self.src.octets());
        h[16..20].copy_from_slice(&self.dst.octets());
        h.extend_from_slice(&self.options);
        let c = checksum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        h.extend_from_slice(&self.payload);
        h
    }
}

/// An IPv4 packet of `protocol` carrying `payload`, the other fields as
/// [`Ipv4::new`] has them.
pub fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, payload: Vec<u8>) -> Vec<u8> {
    Ipv4 {
        protocol,
        payload,
        ..Ipv4::new(src, dst)
    }
    .bytes()
}

/// An Ethernet/IPv4 frame carrying `payload` as protocol `proto`.
pub fn ipv4_frame(
    (dst_mac, src_mac): ([u8; 6], [u8; 6]),
    (src, dst): (Ipv4Addr, Ipv4Addr),
    proto: u8,
    payload: Vec<u8>,
) -> Vec<u8> {
    frame(&[
        &eth(dst_mac, src_mac, ETH_P_IP),
        &ipv4(src, dst, proto, payload),
    ])
}

/// The flags-and-offset field of a fragment at byte `offset` (a multiple
/// of 8), more fragments following if `more`; DF clear.
pub fn frag_field(more: bool, offset: u16) -> u16 {
    (offset / 8) | if more { IP_MF } else { 0 }
}

/// An Ethernet/IPv4 fragment: `payload` at byte `offset` (a multiple of 8)
/// of datagram `id`, more fragments following if `more`.
pub fn ipv4_fragment(
    (dst_mac, src_mac): ([u8; 6], [u8; 6]),
    (src, dst): (Ipv4Addr, Ipv4Addr),
    (id, offset, more): (u16, u16, bool),
    proto: u8,
    payload: &[u8],
) -> Vec<u8> {
    let ip = Ipv4 {
        id,
        frag: frag_field(more, offset),
        protocol: proto,
        payload: payload.to_vec(),
        ..Ipv4::new(src, dst)
    };
    frame(&[&eth(dst_mac, src_mac, ETH_P_IP), &ip.bytes()])
}

/// Recomputes the checksum of the IPv4 header at the start of `l3`, over
/// the header its IHL claims (at least 20 bytes) as far as the bytes go.
pub fn fix_ipv4_checksum(l3: &mut [u8]) {
    let n = (usize::from(l3[0] & 0x0f) * 4).max(20).min(l3.len());
    l3[10..12].copy_from_slice(&[0, 0]);
    let c = checksum(&l3[..n]);
    l3[10..12].copy_from_slice(&c.to_be_bytes());
}

/// The IPv4 packet `l3` changed by `f`, its header checksum recomputed:
/// what `f` did is the packet's only defect.
pub fn edit_ipv4(mut l3: Vec<u8>, f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    f(&mut l3);
    fix_ipv4_checksum(&mut l3);
    l3
}

/// Sets the IPv4 total length of `l3` (the checksum is left as it was).
pub fn set_total_len(l3: &mut [u8], len: usize) {
    l3[2..4].copy_from_slice(&(len as u16).to_be_bytes());
}

/// Sets the IPv4 flags and fragment offset of `l3` to a fragment's
/// ([`frag_field`]; the checksum is left as it was).
pub fn set_frag(l3: &mut [u8], more: bool, offset: u16) {
    l3[6..8].copy_from_slice(&frag_field(more, offset).to_be_bytes());
}

/// The IPv4 packet `l3` (20-byte header) cut to `len` bytes, its total
/// length and, for UDP, the UDP length made to match, header checksum
/// recomputed.
pub fn truncate_ipv4(mut l3: Vec<u8>, len: usize) -> Vec<u8> {
    l3.truncate(len);
    set_total_len(&mut l3, len);
    if len >= 26 && l3[9] == IPPROTO_UDP {
        l3[24..26].copy_from_slice(&((len - 20) as u16).to_be_bytes());
    }
    fix_ipv4_checksum(&mut l3);
    l3
}

// --- TCP, UDP, ICMP ----------------------------------------------------------

/// Fields of a TCP segment to build.
#[derive(Debug, Clone)]
pub struct Tcp {
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// Sequence number.
    pub seq: u32,
    /// Acknowledgment number.
    pub ack: u32,
    /// Flags: 0x01 FIN, 0x02 SYN, 0x04 RST, 0x10 ACK.
    pub flags: u8,
    /// Window.
    pub window: u16,
    /// Options (a multiple of 4 bytes; the data offset covers them).
    pub options: Vec<u8>,
    /// Data.
    pub payload: Vec<u8>,
}

impl Tcp {
    /// A segment without options or data: sequence number 1, window 64240.
    pub fn new(sport: u16, dport: u16, flags: u8) -> Self {
        Self {
            sport,
            dport,
            seq: 1,
            ack: 0,
            flags,
            window: 64_240,
            options: Vec::new(),
            payload: Vec::new(),
        }
    }

    /// The segment with its checksum left zero (the programs only ever
    /// update it incrementally).
    pub fn bytes(&self) -> Vec<u8> {
        let doff = (20 + self.options.len()) / 4;
        let mut t = Vec::with_capacity(doff * 4 + self.payload.len());
        t.extend_from_slice(&self.sport.to_be_bytes());
        t.extend_from_slice(&self.dport.to_be_bytes());
        t.extend_from_slice(&self.seq.to_be_bytes());
        t.extend_from_slice(&self.ack.to_be_bytes());
        t.extend_from_slice(&[(doff as u8) << 4, self.flags]);
        t.extend_from_slice(&self.window.to_be_bytes());
        t.extend_from_slice(&[0; 4]);
        t.extend_from_slice(&self.options);
        t.extend_from_slice(&self.payload);
        t
    }

    /// The segment with its checksum over the pseudo-header of `src` →
    /// `dst`.
    pub fn checksummed(&self, src: Ipv4Addr, dst: Ipv4Addr) -> Vec<u8> {
        let mut t = self.bytes();
        let c = l4_checksum(src, dst, IPPROTO_TCP, &t);
        t[16..18].copy_from_slice(&c.to_be_bytes());
        t
    }
}

/// A TCP SYN (no options, window 64240, sequence number `seq`) with a
/// valid checksum.
pub fn tcp_syn(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, seq: u32) -> Vec<u8> {
    Tcp {
        seq,
        ..Tcp::new(sport, dport, 0x02)
    }
    .checksummed(src, dst)
}

/// A UDP datagram without a checksum (0: none, as IPv4 allows).
pub fn udp(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let len = 8 + payload.len();
    let mut u = Vec::with_capacity(len);
    u.extend_from_slice(&sport.to_be_bytes());
    u.extend_from_slice(&dport.to_be_bytes());
    u.extend_from_slice(&(len as u16).to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(payload);
    u
}

/// A UDP datagram with its checksum over the pseudo-header of `src` →
/// `dst` (a computed 0 is sent as 0xffff).
pub fn udp_checksummed(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    sport: u16,
    dport: u16,
    payload: &[u8],
) -> Vec<u8> {
    let mut u = udp(sport, dport, payload);
    let c = l4_checksum(src, dst, IPPROTO_UDP, &u);
    u[6..8].copy_from_slice(&(if c == 0 { 0xffff } else { c }).to_be_bytes());
    u
}

/// An ICMP message: type, code, the four bytes after the checksum
/// (identifier and sequence number, next-hop MTU, or unused) and `body`,
/// with its checksum.
pub fn icmp(kind: u8, code: u8, rest: [u8; 4], body: &[u8]) -> Vec<u8> {
    let mut m = vec![kind, code, 0, 0];
    m.extend_from_slice(&rest);
    m.extend_from_slice(body);
    let c = checksum(&m);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    m
}

/// An ICMP query or answer (echo request 8, echo reply 0, timestamp
/// request 13) with identifier `id` and sequence number `seq`.
pub fn icmp_query(kind: u8, id: u16, seq: u16, data: &[u8]) -> Vec<u8> {
    let [i0, i1] = id.to_be_bytes();
    let [s0, s1] = seq.to_be_bytes();
    icmp(kind, 0, [i0, i1, s0, s1], data)
}

/// What an ICMP error quotes of the IPv4 packet `packet`: its header (as
/// long as its IHL says) and the first 8 bytes after it.
pub fn quote(packet: &[u8]) -> &[u8] {
    &packet[..usize::from(packet[0] & 0x0f) * 4 + 8]
}

// --- IPv6, ICMPv6 -------------------------------------------------------------

/// An IPv6 packet (next header `next`, hop limit `hops`) carrying
/// `payload`.
pub fn ipv6(src: Ipv6Addr, dst: Ipv6Addr, next: u8, hops: u8, payload: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(40 + payload.len());
    p.extend_from_slice(&[0x60, 0, 0, 0]);
    p.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    p.push(next);
    p.push(hops);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(payload);
    p
}

/// The ICMPv6 message `msg` (checksum field zero) with its checksum over
/// the IPv6 pseudo-header of `src` → `dst`.
pub fn icmpv6(src: Ipv6Addr, dst: Ipv6Addr, mut msg: Vec<u8>) -> Vec<u8> {
    let mut pseudo = Vec::with_capacity(40 + msg.len());
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    pseudo.extend_from_slice(&[0, 0, 0, IPPROTO_ICMPV6]);
    pseudo.extend_from_slice(&msg);
    let c = checksum(&pseudo);
    msg[2..4].copy_from_slice(&c.to_be_bytes());
    msg
}

/// An Ethernet/IPv6 frame with the ICMPv6 message `icmp` (checksum field
/// zero; it is filled in), hop limit 255 as ND requires.
pub fn icmpv6_frame(
    (dst_mac, src_mac): ([u8; 6], [u8; 6]),
    (src, dst): (Ipv6Addr, Ipv6Addr),
    icmp: Vec<u8>,
) -> Vec<u8> {
    let msg = icmpv6(src, dst, icmp);
    frame(&[
        &eth(dst_mac, src_mac, ETH_P_IPV6),
        &ipv6(src, dst, IPPROTO_ICMPV6, 255, &msg),
    ])
}

/// An ICMPv6 router advertisement (RFC 4861 4.2) announcing itself as a
/// default router for 30 minutes, with a source link-layer address option
/// and an on-link, autonomous prefix `2001:db8:bad::/64`.
pub fn router_advertisement(src_mac: [u8; 6]) -> Vec<u8> {
    let mut m = vec![134, 0, 0, 0, 64, 0, 0x07, 0x08, 0, 0, 0, 0, 0, 0, 0, 0];
    // Source link-layer address.
    m.extend_from_slice(&[1, 1]);
    m.extend_from_slice(&src_mac);
    // Prefix information: /64, L + A, valid/preferred lifetimes.
    m.extend_from_slice(&[3, 4, 64, 0xc0]);
    m.extend_from_slice(&86400u32.to_be_bytes());
    m.extend_from_slice(&14400u32.to_be_bytes());
    m.extend_from_slice(&[0; 4]);
    m.extend_from_slice(&Ipv6Addr::new(0x2001, 0xdb8, 0xbad, 0, 0, 0, 0, 0).octets());
    m
}

/// An ICMPv6 redirect (RFC 4861 4.5): "to reach `dest`, use `target`",
/// with a target link-layer address option.
pub fn redirect(target: Ipv6Addr, dest: Ipv6Addr, target_mac: [u8; 6]) -> Vec<u8> {
    let mut m = vec![137, 0, 0, 0, 0, 0, 0, 0];
    m.extend_from_slice(&target.octets());
    m.extend_from_slice(&dest.octets());
    m.extend_from_slice(&[2, 1]);
    m.extend_from_slice(&target_mac);
    m
}

/// A link-local IPv6 address derived from a MAC (EUI-64).
pub fn link_local(mac: [u8; 6]) -> Ipv6Addr {
    Ipv6Addr::from([
        0xfe,
        0x80,
        0,
        0,
        0,
        0,
        0,
        0,
        mac[0] ^ 0x02,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ])
}

// --- tunnels -------------------------------------------------------------------

/// A VXLAN header (flag I, `vni`) followed by the Ethernet frame `inner`:
/// the payload of a UDP datagram to the VXLAN port. (IPIP needs no
/// builder: [`ipv4`] with [`IPPROTO_IPIP`] around the inner packet.)
pub fn vxlan(vni: u32, inner: &[u8]) -> Vec<u8> {
    let mut v = vec![0x08, 0, 0, 0];
    v.extend_from_slice(&(vni << 8).to_be_bytes());
    v.extend_from_slice(inner);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    #[test]
    fn checksum_of_known_header() {
        // A header whose checksum field is filled verifies to zero.
        let p = Ipv4::new(A, B).bytes();
        assert_eq!(checksum(&p[..20]), 0);
        let f = frame(&[&eth([0; 6], [0; 6], ETH_P_IP), &p]);
        assert!(ipv4_checksum_ok(&f, 14));
    }

    #[test]
    fn segments_verify() {
        let syn = tcp_syn(A, B, 1234, 80, 7);
        assert_eq!(l4_checksum(A, B, IPPROTO_TCP, &syn), 0);
        let u = udp_checksummed(A, B, 1, 2, b"abc");
        assert_eq!(l4_checksum(A, B, IPPROTO_UDP, &u), 0);
        let seg = Tcp {
            options: vec![1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0],
            payload: b"x".to_vec(),
            ..Tcp::new(1, 2, 0x10)
        };
        let f = ipv4_frame(([0; 6], [0; 6]), (A, B), IPPROTO_TCP, seg.checksummed(A, B));
        assert!(l4_checksum_ok(&f, 14));
        assert_eq!(f[14 + 20 + 12], 8 << 4, "data offset covers the options");
        let f = ipv4_fragment(
            ([0; 6], [0; 6]),
            (A, B),
            (9, 16, true),
            IPPROTO_UDP,
            &[0; 8],
        );
        assert!(ipv4_checksum_ok(&f, 14));
        assert_eq!(be16(&f[20..22]), 0x2002);
    }

    #[test]
    fn icmp_errors_quote_header_and_8_bytes() {
        let about = Ipv4 {
            options: vec![1, 1, 1, 0],
            ..Ipv4::new(A, B)
        }
        .bytes();
        let m = icmp(3, 3, [0; 4], quote(&about));
        assert_eq!(m.len(), 8 + 24 + 8);
        assert_eq!(checksum(&m), 0);
        let echo = icmp_query(8, 0x1234, 1, b"ping");
        assert_eq!(&echo[4..8], &[0x12, 0x34, 0, 1]);
        assert_eq!(checksum(&echo), 0);
    }

    #[test]
    fn edits_keep_the_header_checksum_right() {
        let p = edit_ipv4(Ipv4::new(A, B).bytes(), |l3| set_total_len(l3, 1500));
        assert!(ipv4_checksum_ok(&p, 0));
        let cut = truncate_ipv4(ipv4(A, B, IPPROTO_UDP, udp(1, 2, &[0; 20])), 30);
        assert_eq!((be16(&cut[2..4]), be16(&cut[24..26])), (30, 10));
        assert!(ipv4_checksum_ok(&cut, 0));
    }

    #[test]
    fn icmpv6_checksum_verifies() {
        let mac = [2, 0, 0, 0, 0, 1];
        let src = link_local(mac);
        let dst: Ipv6Addr = "ff02::1".parse().expect("address");
        let f = icmpv6_frame((ALL_NODES_MAC, mac), (src, dst), router_advertisement(mac));
        let icmp = &f[54..];
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&src.octets());
        pseudo.extend_from_slice(&dst.octets());
        pseudo.extend_from_slice(&(icmp.len() as u32).to_be_bytes());
        pseudo.extend_from_slice(&[0, 0, 0, 58]);
        pseudo.extend_from_slice(icmp);
        assert_eq!(checksum(&pseudo), 0);
        assert_eq!(be16(&f[12..14]), ETH_P_IPV6);
    }
}
