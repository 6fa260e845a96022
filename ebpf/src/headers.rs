//! Header layouts. Every multi-byte field is a byte array in wire order, so
//! the structs have alignment 1 and can sit at any offset of a packet.

/// Ethernet header.
#[repr(C)]
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

const _: () = assert!(core::mem::size_of::<EthHdr>() == ETH_HLEN);
const _: () = assert!(core::mem::size_of::<ArpHdr>() == 28);
const _: () = assert!(core::mem::size_of::<Ipv4Hdr>() == IPV4_HLEN);
