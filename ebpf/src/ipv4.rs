//! IPv4 header checks and router behaviour.

use crate::headers::{IPV4_HLEN, Ipv4Hdr};

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
