//! Raw Ethernet frames sent from inside a namespace (what a pod with
//! `CAP_NET_RAW` can do): an `AF_PACKET` socket created on a thread that
//! entered the namespace, bound to one of its interfaces, plus builders for
//! the frames a hostile pod sends (TCP SYNs, fragments, tunnels, IPv6
//! router advertisements and redirects).
//!
//! A socket belongs to the namespace it was created in for its whole life,
//! so the [`RawSocket`] can be used from any thread afterwards; it never
//! sees an interface of another namespace.

use std::{
    io,
    net::{Ipv4Addr, Ipv6Addr},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

use crate::{
    netns::Netns,
    packet::{ETH_P_IP, ETH_P_IPV6, Ipv4, checksum, eth, frame},
};

/// An `AF_PACKET`/`SOCK_RAW` socket bound to one interface of a namespace.
/// It only sends (protocol 0: the kernel delivers nothing to it).
#[derive(Debug)]
pub struct RawSocket {
    fd: OwnedFd,
    ifindex: i32,
    ifname: String,
}

impl RawSocket {
    /// Opens the socket inside `ns` on `ifname`.
    pub fn open(ns: &Netns, ifname: &str) -> io::Result<Self> {
        let name = ifname.to_owned();
        ns.exec(move || Self::open_here(&name))
    }

    /// Opens the socket in the calling thread's namespace.
    fn open_here(ifname: &str) -> io::Result<Self> {
        let cname = std::ffi::CString::new(ifname)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in interface name"))?;
        // SAFETY: `cname` is a valid NUL-terminated string for the call.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if ifindex == 0 {
            return Err(io::Error::last_os_error());
        }
        let ifindex = i32::try_from(ifindex)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "ifindex out of range"))?;
        // SAFETY: plain syscall; the result is checked before use.
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(Self {
            fd,
            ifindex,
            ifname: ifname.to_owned(),
        })
    }

    /// The interface it sends on.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// Sends one complete Ethernet frame (header included) as it is.
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        if frame.len() < 14 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "frame shorter than an Ethernet header",
            ));
        }
        // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_ifindex = self.ifindex;
        sll.sll_halen = 6;
        sll.sll_addr[..6].copy_from_slice(&frame[..6]);
        // SAFETY: the buffer and the address are valid for the given lengths
        // for the duration of the call; the descriptor is ours.
        let sent = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                std::ptr::addr_of!(sll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        if usize::try_from(sent).ok() != Some(frame.len()) {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("sent {sent} of {} bytes", frame.len()),
            ));
        }
        Ok(())
    }

    /// Sends every frame; returns how many were sent. A transient
    /// `ENOBUFS` (the device queue is full) is retried after a short pause.
    pub fn send_all<'a>(&self, frames: impl IntoIterator<Item = &'a [u8]>) -> io::Result<u64> {
        let mut count = 0;
        for f in frames {
            let mut tries = 0;
            loop {
                match self.send(f) {
                    Ok(()) => break,
                    Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) && tries < 1000 => {
                        tries += 1;
                        std::thread::sleep(std::time::Duration::from_micros(200));
                    }
                    Err(e) => return Err(e),
                }
            }
            count += 1;
        }
        Ok(count)
    }
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.trim().split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// Broadcast MAC.
pub const BROADCAST: [u8; 6] = [0xff; 6];

/// IPv4 protocol numbers.
pub const IPPROTO_TCP: u8 = 6;
/// UDP.
pub const IPPROTO_UDP: u8 = 17;
/// IP in IP.
pub const IPPROTO_IPIP: u8 = 4;

/// Checksum of a TCP/UDP segment over the IPv4 pseudo-header.
fn l4_checksum(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, segment: &[u8]) -> u16 {
    let mut data = Vec::with_capacity(12 + segment.len());
    data.extend_from_slice(&src.octets());
    data.extend_from_slice(&dst.octets());
    data.push(0);
    data.push(proto);
    data.extend_from_slice(&(segment.len() as u16).to_be_bytes());
    data.extend_from_slice(segment);
    checksum(&data)
}

/// A TCP SYN segment (20-byte header, no options) with a valid checksum.
pub fn tcp_syn(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, seq: u32) -> Vec<u8> {
    let mut t = vec![0u8; 20];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&dport.to_be_bytes());
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    t[12] = 5 << 4;
    t[13] = 0x02; // SYN
    t[14..16].copy_from_slice(&64240u16.to_be_bytes());
    let c = l4_checksum(src, dst, IPPROTO_TCP, &t);
    t[16..18].copy_from_slice(&c.to_be_bytes());
    t
}

/// A UDP datagram with a valid checksum.
pub fn udp(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let len = 8 + payload.len();
    let mut u = Vec::with_capacity(len);
    u.extend_from_slice(&sport.to_be_bytes());
    u.extend_from_slice(&dport.to_be_bytes());
    u.extend_from_slice(&(len as u16).to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(payload);
    let c = l4_checksum(src, dst, IPPROTO_UDP, &u);
    u[6..8].copy_from_slice(&(if c == 0 { 0xffff } else { c }).to_be_bytes());
    u
}

/// An Ethernet/IPv4 frame carrying `payload` as protocol `proto`.
pub fn ipv4_frame(
    (dst_mac, src_mac): ([u8; 6], [u8; 6]),
    (src, dst): (Ipv4Addr, Ipv4Addr),
    proto: u8,
    payload: Vec<u8>,
) -> Vec<u8> {
    let ip = Ipv4 {
        src,
        dst,
        ttl: 64,
        protocol: proto,
        options: Vec::new(),
        payload,
    };
    frame(&[&eth(dst_mac, src_mac, ETH_P_IP), &ip.bytes()])
}

/// An IPv4 fragment: `payload` at byte offset `offset` (a multiple of 8) of
/// datagram `id`, more fragments following if `more`.
pub fn ipv4_fragment(
    (dst_mac, src_mac): ([u8; 6], [u8; 6]),
    (src, dst): (Ipv4Addr, Ipv4Addr),
    (id, offset, more): (u16, u16, bool),
    proto: u8,
    payload: &[u8],
) -> Vec<u8> {
    let mut f = ipv4_frame((dst_mac, src_mac), (src, dst), proto, payload.to_vec());
    let ip = &mut f[14..34];
    ip[4..6].copy_from_slice(&id.to_be_bytes());
    let frag = (offset / 8) | if more { 0x2000 } else { 0 };
    ip[6..8].copy_from_slice(&frag.to_be_bytes());
    ip[10..12].copy_from_slice(&[0, 0]);
    let c = checksum(ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f
}

/// An IPv6 packet with an ICMPv6 message (`icmp` with its checksum field
/// zero; the checksum is filled in), hop limit 255 as ND requires.
pub fn icmpv6_frame(
    (dst_mac, src_mac): ([u8; 6], [u8; 6]),
    (src, dst): (Ipv6Addr, Ipv6Addr),
    mut icmp: Vec<u8>,
) -> Vec<u8> {
    let len = icmp.len() as u32;
    let mut pseudo = Vec::with_capacity(40 + icmp.len());
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&len.to_be_bytes());
    pseudo.extend_from_slice(&[0, 0, 0, 58]);
    pseudo.extend_from_slice(&icmp);
    let c = checksum(&pseudo);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    let mut ip6 = Vec::with_capacity(40 + icmp.len());
    ip6.extend_from_slice(&[0x60, 0, 0, 0]);
    ip6.extend_from_slice(&(len as u16).to_be_bytes());
    ip6.push(58); // ICMPv6
    ip6.push(255);
    ip6.extend_from_slice(&src.octets());
    ip6.extend_from_slice(&dst.octets());
    ip6.extend_from_slice(&icmp);
    frame(&[&eth(dst_mac, src_mac, ETH_P_IPV6), &ip6])
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
    m.extend_from_slice(
        &"2001:db8:bad::"
            .parse::<Ipv6Addr>()
            .map_or([0; 16], |a| a.octets()),
    );
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

/// The all-nodes multicast MAC (33:33:00:00:00:01).
pub const ALL_NODES_MAC: [u8; 6] = [0x33, 0x33, 0, 0, 0, 1];

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

/// A VXLAN packet (UDP to `port`, flags I, `vni`) carrying the inner
/// Ethernet frame `inner`.
pub fn vxlan_payload(
    (src, dst): (Ipv4Addr, Ipv4Addr),
    (sport, port): (u16, u16),
    vni: u32,
    inner: &[u8],
) -> Vec<u8> {
    let mut v = vec![0x08, 0, 0, 0];
    v.extend_from_slice(&(vni << 8).to_be_bytes());
    v.extend_from_slice(inner);
    udp(src, dst, sport, port, &v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_parse() {
        assert_eq!(parse_mac("02:72:0a:01:02:03"), Some([2, 0x72, 10, 1, 2, 3]));
        assert_eq!(parse_mac("02:72:0a:01:02"), None);
        assert_eq!(parse_mac("02:72:0a:01:02:03:04"), None);
        assert_eq!(parse_mac("zz:72:0a:01:02:03"), None);
    }

    #[test]
    fn segments_verify() {
        let (a, b) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        let syn = tcp_syn(a, b, 1234, 80, 7);
        assert_eq!(l4_checksum(a, b, IPPROTO_TCP, &syn), 0);
        let u = udp(a, b, 1, 2, b"abc");
        assert_eq!(l4_checksum(a, b, IPPROTO_UDP, &u), 0);
        let f = ipv4_fragment(
            ([0; 6], [0; 6]),
            (a, b),
            (9, 16, true),
            IPPROTO_UDP,
            &[0; 8],
        );
        assert!(crate::packet::ipv4_checksum_ok(&f, 14));
        assert_eq!(u16::from_be_bytes([f[20], f[21]]), 0x2002);
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
        assert_eq!(u16::from_be_bytes([f[12], f[13]]), ETH_P_IPV6);
    }
}
