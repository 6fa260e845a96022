//! IPv4 header checks and router behaviour.

use aya_ebpf::programs::TcContext;

use crate::headers::{IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_UDP, IPV4_HLEN, Ipv4Hdr};

/// The fragment offset bits of `frag_off` (host order).
pub const IP_OFFSET: u16 = 0x1fff;
/// The more-fragments bit of `frag_off` (host order).
pub const IP_MF: u16 = 0x2000;

/// Why an IPv4 header is not acceptable.
pub enum HeaderError {
    /// Version is not 4, IHL < 5, or the lengths do not fit the frame.
    Invalid,
}

/// Validates the header at `l3_off` of a frame of `frame_len` bytes and
/// returns the header length in bytes (options are allowed).
#[inline(always)]
pub fn validate(ip: &Ipv4Hdr, l3_off: usize, frame_len: u32) -> Result<usize, HeaderError> {
    if ip.version_ihl >> 4 != 4 {
        return Err(HeaderError::Invalid);
    }
    let hlen = usize::from(ip.version_ihl & 0x0f) * 4;
    if hlen < IPV4_HLEN {
        return Err(HeaderError::Invalid);
    }
    let tot_len = usize::from(u16::from_be_bytes(ip.tot_len));
    // The datagram must hold its own header and fit in the frame (a frame may
    // be longer than the datagram: Ethernet padding).
    if tot_len < hlen || l3_off + tot_len > frame_len as usize {
        return Err(HeaderError::Invalid);
    }
    Ok(hlen)
}

/// Whether the transport header of a validated datagram lies within the
/// datagram (its total length, not the frame: Ethernet padding is no
/// header): TCP with its options, UDP, ICMP — 8 bytes each for the last
/// two. Fragments after the first carry no transport header; other
/// protocols are not looked at. `l4_off` is the header's offset in the
/// frame, `hlen` the IPv4 header length.
#[inline(always)]
pub fn transport_fits(ctx: &TcContext, ip: &Ipv4Hdr, l4_off: usize, hlen: usize) -> bool {
    if u16::from_be_bytes(ip.frag_off) & IP_OFFSET != 0 {
        return true;
    }
    let l4_len = usize::from(u16::from_be_bytes(ip.tot_len)).saturating_sub(hlen);
    match ip.protocol {
        IPPROTO_TCP => {
            l4_len >= 20
                && ctx
                    .load::<u8>(l4_off + 12)
                    .is_ok_and(|doff| usize::from(doff >> 4) * 4 <= l4_len)
        }
        IPPROTO_UDP | IPPROTO_ICMP => l4_len >= 8,
        _ => true,
    }
}

/// Decrements the TTL like a router, updating the header checksum
/// incrementally (RFC 1624; the same arithmetic as Linux `ip_decrease_ttl`).
/// The caller makes sure `ttl > 1`.
#[inline(always)]
pub fn decrease_ttl(ip: &mut Ipv4Hdr) {
    // TTL is the high byte of its 16-bit word: the word drops by 0x0100, so
    // the one's-complement checksum grows by 0x0100 with end-around carry.
    let mut check = u32::from(u16::from_be_bytes(ip.check)) + 0x0100;
    check += u32::from(check >= 0xffff);
    ip.check = (check as u16).to_be_bytes();
    ip.ttl -= 1;
}

/// The header checksum of a 20-byte IPv4 header (its `check` field is
/// ignored): one's-complement sum of the ten 16-bit words, folded.
#[inline(always)]
pub fn header_checksum(ip: &Ipv4Hdr) -> [u8; 2] {
    let w = |b: [u8; 2]| u32::from(u16::from_be_bytes(b));
    let mut sum = (u32::from(ip.version_ihl) << 8 | u32::from(ip.tos))
        + w(ip.tot_len)
        + w(ip.id)
        + w(ip.frag_off)
        + (u32::from(ip.ttl) << 8 | u32::from(ip.protocol))
        + w([ip.src[0], ip.src[1]])
        + w([ip.src[2], ip.src[3]])
        + w([ip.dst[0], ip.dst[1]])
        + w([ip.dst[2], ip.dst[3]]);
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    (!(sum as u16)).to_be_bytes()
}

/// A fresh outer IPv4 header (no options, DF, TTL 64) with its checksum.
#[inline(always)]
pub fn outer_header(src: u32, dst: u32, protocol: u8, tos: u8, tot_len: u16) -> Ipv4Hdr {
    let mut ip = Ipv4Hdr {
        version_ihl: 0x45,
        tos,
        tot_len: tot_len.to_be_bytes(),
        id: [0, 0],
        frag_off: [crate::headers::IP_DF, 0],
        ttl: 64,
        protocol,
        check: [0, 0],
        src: src.to_ne_bytes(),
        dst: dst.to_ne_bytes(),
    };
    ip.check = header_checksum(&ip);
    ip
}
