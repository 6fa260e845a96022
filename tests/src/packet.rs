//! Packet builders and checks for per-program tests.

use std::net::Ipv4Addr;

/// Ethertypes.
pub const ETH_P_IP: u16 = 0x0800;
/// ARP ethertype.
pub const ETH_P_ARP: u16 = 0x0806;
/// IPv6 ethertype.
pub const ETH_P_IPV6: u16 = 0x86dd;

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

/// An Ethernet header.
pub fn eth(dst: [u8; 6], src: [u8; 6], proto: u16) -> Vec<u8> {
    let mut v = Vec::with_capacity(14);
    v.extend_from_slice(&dst);
    v.extend_from_slice(&src);
    v.extend_from_slice(&proto.to_be_bytes());
    v
}

/// Fields of an IPv4 packet to build.
#[derive(Debug, Clone)]
pub struct Ipv4 {
    /// Source.
    pub src: Ipv4Addr,
    /// Destination.
    pub dst: Ipv4Addr,
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
    /// A UDP-protocol packet with a small payload.
    pub fn new(src: Ipv4Addr, dst: Ipv4Addr) -> Self {
        Self {
            src,
            dst,
            ttl: 64,
            protocol: 17,
            options: Vec::new(),
            payload: vec![0, 53, 0, 53, 0, 12, 0, 0, b'r', b'i', b'v', b't'],
        }
    }

    /// Header + payload with a correct checksum.
    pub fn bytes(&self) -> Vec<u8> {
        let ihl = 5 + self.options.len() / 4;
        let total = ihl * 4 + self.payload.len();
        let mut h = vec![0u8; 20];
        h[0] = 0x40 | ihl as u8;
        h[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        h[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
        h[6] = 0x40; // DF
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

/// Concatenates parts.
pub fn frame(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// True if the IPv4 header at `off` has a valid checksum.
pub fn ipv4_checksum_ok(frame: &[u8], off: usize) -> bool {
    let ihl = usize::from(frame[off] & 0x0f) * 4;
    checksum(&frame[off..off + ihl]) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_of_known_header() {
        // RFC 1071 style example: a header whose checksum field is filled
        // verifies to zero.
        let p = Ipv4::new(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)).bytes();
        assert_eq!(checksum(&p[..20]), 0);
        let f = frame(&[&eth([0; 6], [0; 6], ETH_P_IP), &p]);
        assert!(ipv4_checksum_ok(&f, 14));
    }
}
