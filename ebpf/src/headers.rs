//! Header layouts. Every multi-byte field is a byte array in wire order, so
//! the structs have alignment 1 and can sit at any offset of a packet.

/// Ethernet header.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EthHdr {
    pub dst: [u8; 6],
    pub src: [u8; 6],
    /// Ethertype, big-endian.
    pub proto: [u8; 2],
}

pub const ETH_HLEN: usize = 14;
pub const ETH_P_IP: [u8; 2] = 0x0800u16.to_be_bytes();
pub const ETH_P_ARP: [u8; 2] = 0x0806u16.to_be_bytes();

/// ARP for IPv4 over Ethernet (RFC 826), the only kind rivet answers.
#[repr(C)]
pub struct ArpHdr {
    pub htype: [u8; 2],
    pub ptype: [u8; 2],
    pub hlen: u8,
    pub plen: u8,
    pub oper: [u8; 2],
    pub sha: [u8; 6],
    pub spa: [u8; 4],
    pub tha: [u8; 6],
    pub tpa: [u8; 4],
}

pub const ARP_HTYPE_ETHER: [u8; 2] = 1u16.to_be_bytes();
pub const ARP_OP_REQUEST: [u8; 2] = 1u16.to_be_bytes();
pub const ARP_OP_REPLY: [u8; 2] = 2u16.to_be_bytes();

/// IPv4 header without options.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Ipv4Hdr {
    /// Version (high nibble) and IHL in 32-bit words (low nibble).
    pub version_ihl: u8,
    pub tos: u8,
    pub tot_len: [u8; 2],
    pub id: [u8; 2],
    pub frag_off: [u8; 2],
    pub ttl: u8,
    pub protocol: u8,
    pub check: [u8; 2],
    pub src: [u8; 4],
    pub dst: [u8; 4],
}

pub const IPV4_HLEN: usize = 20;
pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_IPIP: u8 = 4;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
/// "Don't fragment" in the frag_off field (big-endian high byte 0x40).
pub const IP_DF: u8 = 0x40;

/// UDP header.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UdpHdr {
    pub source: [u8; 2],
    pub dest: [u8; 2],
    pub len: [u8; 2],
    pub check: [u8; 2],
}

/// VXLAN header (RFC 7348): flags (0x08 = VNI valid), reserved, VNI (24 bits), reserved.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct VxlanHdr {
    pub flags: u8,
    pub reserved1: [u8; 3],
    pub vni: [u8; 3],
    pub reserved2: u8,
}

pub const VXLAN_FLAG_VNI: u8 = 0x08;

/// Everything VXLAN puts between the outer Ethernet header and the inner IP
/// header: outer IPv4, UDP, VXLAN, inner Ethernet (50 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct VxlanEncap {
    pub ip: Ipv4Hdr,
    pub udp: UdpHdr,
    pub vxlan: VxlanHdr,
    pub eth: EthHdr,
}

/// ICMP header (type, code, checksum, rest of header).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IcmpHdr {
    pub kind: u8,
    pub code: u8,
    pub check: [u8; 2],
    pub rest: [u8; 4],
}

const _: () = assert!(core::mem::size_of::<EthHdr>() == ETH_HLEN);
const _: () = assert!(core::mem::size_of::<ArpHdr>() == 28);
const _: () = assert!(core::mem::size_of::<Ipv4Hdr>() == IPV4_HLEN);
const _: () = assert!(core::mem::size_of::<UdpHdr>() == 8);
const _: () = assert!(core::mem::size_of::<VxlanHdr>() == 8);
const _: () = assert!(core::mem::size_of::<VxlanEncap>() == rivet_common::VXLAN_OVERHEAD as usize);
const _: () = assert!(core::mem::size_of::<IcmpHdr>() == 8);
