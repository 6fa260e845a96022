//! Building and reading rtnetlink messages: pure functions, no socket.
//! [`Netlink`](super::Netlink) sends some of them itself, [`batch`](super::batch)
//! many at once.

use std::{
    net::Ipv4Addr,
    os::fd::{AsRawFd as _, RawFd},
};

use rtnetlink::{
    LinkMessageBuilder, LinkUnspec, LinkVeth, RouteMessageBuilder,
    packet_route::{
        AddressFamily,
        address::AddressMessage,
        link::{InfoData, InfoVeth, LinkAttribute, LinkMessage},
        neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState},
        route::{RouteAddress, RouteAttribute, RouteMessage, RouteScope, RouteType},
        tc::{TcAttribute, TcBpfFlags, TcFilterBpfOption, TcHandle, TcMessage, TcOption},
    },
};

use super::{LinkInfo, RouteInfo};

/// `ip route add <dst>/<len> dev <index> scope link`.
pub fn link_route(dst: Ipv4Addr, prefix: u8, index: u32) -> RouteMessage {
    RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(dst, prefix)
        .output_interface(index)
        .scope(RouteScope::Link)
        .build()
}

/// `ip route add <dst>/<len> via <gw> dev <index>` (`/0`: the default route).
pub fn route_via(dst: Ipv4Addr, prefix: u8, gateway: Ipv4Addr, index: u32) -> RouteMessage {
    let builder = RouteMessageBuilder::<Ipv4Addr>::new();
    let builder = if prefix == 0 {
        builder
    } else {
        builder.destination_prefix(dst, prefix)
    };
    builder.gateway(gateway).output_interface(index).build()
}

/// `ip addr add <addr>/<prefix> dev <index>`.
pub fn address(index: u32, addr: Ipv4Addr, prefix: u8) -> AddressMessage {
    rtnetlink::AddressMessageBuilder::<Ipv4Addr>::new()
        .index(index)
        .address(addr, prefix)
        .build()
}

/// `ip neigh replace <ip> lladdr <mac> dev <index> nud permanent`.
pub fn permanent_neighbour(index: u32, ip: Ipv4Addr, mac: [u8; 6]) -> NeighbourMessage {
    let mut msg = NeighbourMessage::default();
    msg.header.family = AddressFamily::Inet;
    msg.header.ifindex = index;
    msg.header.state = NeighbourState::Permanent;
    msg.header.kind = RouteType::Unspec;
    msg.attributes
        .push(NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)));
    msg.attributes
        .push(NeighbourAttribute::LinkLayerAddress(mac.to_vec()));
    msg
}

/// `ip link set <index> up`.
pub fn link_up(index: u32) -> LinkMessage {
    LinkUnspec::new_with_index(index).up().build()
}

/// The loopback device's ifindex, the same in every network namespace.
pub const LOOPBACK_IFINDEX: u32 = 1;

/// `ETH_P_ALL` in network order, the protocol of a filter that sees all.
const ETH_P_ALL_BE: u32 = 0x0300;

/// `tc qdisc add dev <index> clsact`.
pub fn clsact(index: u32) -> TcMessage {
    let mut msg = TcMessage::with_index(index as i32);
    msg.header.parent = TcHandle::CLSACT;
    msg.header.handle = TcHandle {
        major: 0xffff,
        minor: 0,
    };
    msg.attributes.push(TcAttribute::Kind("clsact".into()));
    msg
}

/// A direct-action `cls_bpf` filter on the clsact hook of `index`.
#[derive(Debug, Clone)]
pub struct BpfFilter<'a> {
    /// Ingress (else egress) hook.
    pub ingress: bool,
    /// Filter priority.
    pub priority: u16,
    /// Filter handle.
    pub handle: u32,
    /// The loaded program.
    pub prog_fd: RawFd,
    /// Its name (shown by `tc filter show`).
    pub prog_name: &'a str,
}

/// `tc filter replace dev <index> ingress|egress prio P handle H bpf da fd F`.
pub fn bpf_filter(index: u32, f: &BpfFilter<'_>) -> TcMessage {
    let mut msg = TcMessage::with_index(index as i32);
    msg.header.parent = TcHandle {
        major: 0xffff,
        minor: if f.ingress {
            TcHandle::MIN_INGRESS
        } else {
            TcHandle::MIN_EGRESS
        },
    };
    msg.header.handle = f.handle.into();
    msg.header.info = u32::from(f.priority) << 16 | ETH_P_ALL_BE;
    msg.attributes.push(TcAttribute::Kind("bpf".into()));
    msg.attributes.push(TcAttribute::Options(vec![
        TcOption::Bpf(TcFilterBpfOption::ProgFd(f.prog_fd as u32)),
        TcOption::Bpf(TcFilterBpfOption::ProgName(f.prog_name.to_owned())),
        TcOption::Bpf(TcFilterBpfOption::Flags(TcBpfFlags::DirectAction)),
    ]));
    msg
}

/// The request creating veth `host` with its peer `peer` inside the
/// namespace `peer_netns`, both with `mtu`, the peer with MAC `peer_mac`.
pub(crate) fn veth_message(
    host: &str,
    peer: &str,
    peer_netns: &std::fs::File,
    mtu: u32,
    peer_mac: [u8; 6],
) -> LinkMessage {
    let peer_msg = LinkMessageBuilder::<LinkUnspec>::new()
        .name(peer.to_owned())
        .setns_by_fd(peer_netns.as_raw_fd())
        .mtu(mtu)
        .address(peer_mac.to_vec())
        .build();
    LinkVeth::new(host, peer)
        .set_info_data(InfoData::Veth(InfoVeth::Peer(peer_msg)))
        .mtu(mtu)
        .build()
}

/// The link a message describes.
pub(crate) fn link_info(msg: &LinkMessage) -> LinkInfo {
    let mut info = LinkInfo {
        index: msg.header.index,
        name: String::new(),
        mac: [0; 6],
        mtu: 0,
        kind: None,
        link: None,
    };
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::IfName(n) => info.name.clone_from(n),
            LinkAttribute::Address(a) if a.len() == 6 => info.mac.copy_from_slice(a),
            LinkAttribute::Mtu(m) => info.mtu = *m,
            LinkAttribute::Link(l) => info.link = Some(*l),
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    if let rtnetlink::packet_route::link::LinkInfo::Kind(k) = i {
                        info.kind = Some(k.to_string());
                    }
                }
            }
            _ => {}
        }
    }
    info
}

/// The route a dump message describes.
pub(crate) fn route_info(msg: &RouteMessage) -> RouteInfo {
    let mut r = RouteInfo {
        dst: Ipv4Addr::UNSPECIFIED,
        prefix: msg.header.destination_prefix_length,
        gateway: None,
        oif: None,
        scope_link: msg.header.scope == RouteScope::Link,
    };
    for attr in &msg.attributes {
        match attr {
            RouteAttribute::Destination(RouteAddress::Inet(ip)) => r.dst = *ip,
            RouteAttribute::Gateway(RouteAddress::Inet(ip)) => r.gateway = Some(*ip),
            RouteAttribute::Oif(i) => r.oif = Some(*i),
            _ => {}
        }
    }
    r
}

/// Formats a MAC as `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_round_trip() {
        let mac = [0x02, 0xab, 0, 1, 0x10, 0xff];
        assert_eq!(format_mac(&mac), "02:ab:00:01:10:ff");
        assert_eq!(parse_mac("02:ab:00:01:10:ff"), Some(mac));
        assert_eq!(parse_mac("02:ab:00:01:10"), None);
        assert_eq!(parse_mac("02:ab:00:01:10:ff:00"), None);
        assert_eq!(parse_mac("zz:ab:00:01:10:ff"), None);
    }
}
