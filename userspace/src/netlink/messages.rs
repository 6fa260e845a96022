//! Building and reading rtnetlink messages: the pure functions of
//! `rivet-netlink` (shared with the CNI plugin), which the async
//! [`Netlink`](super::Netlink) hands to `rtnetlink` and [`batch`](super::batch)
//! writes many at once.

use std::os::fd::AsRawFd as _;

pub use rivet_netlink::messages::{
    BpfFilter, LOOPBACK_IFINDEX, address, bpf_filter, clsact, format_mac, link_info, link_named,
    link_route, link_route_src, link_up, parse_mac, permanent_neighbour, route_info, route_via,
};
use rtnetlink::packet_route::link::LinkMessage;

/// The request creating veth `host` with its peer `peer` inside the
/// namespace `peer_netns`, both with `mtu`, the peer with MAC `peer_mac`.
pub(crate) fn veth_message(
    host: &str,
    peer: &str,
    peer_netns: &std::fs::File,
    mtu: u32,
    peer_mac: [u8; 6],
) -> LinkMessage {
    rivet_netlink::messages::veth(host, peer, peer_netns.as_raw_fd(), mtu, peer_mac)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use rtnetlink::{
        AddressMessageBuilder, LinkMessageBuilder, LinkUnspec, LinkVeth, RouteMessageBuilder,
        packet_route::{
            link::{InfoData, InfoVeth},
            route::{RouteAttribute, RouteMetric, RouteScope},
        },
    };

    use super::*;

    /// The messages are the ones `rtnetlink`'s builders make (which the
    /// agent used before they were shared with the plugin).
    #[test]
    fn messages_match_the_rtnetlink_builders() {
        let dst = Ipv4Addr::new(10, 244, 1, 0);
        let gw = Ipv4Addr::new(169, 254, 1, 1);
        let src = Ipv4Addr::new(192, 168, 0, 2);
        for prefix in [0, 24, 32] {
            assert_eq!(
                link_route(dst, prefix, 7),
                RouteMessageBuilder::<Ipv4Addr>::new()
                    .destination_prefix(dst, prefix)
                    .output_interface(7)
                    .scope(RouteScope::Link)
                    .build()
            );
            let via = RouteMessageBuilder::<Ipv4Addr>::new();
            let via = if prefix == 0 {
                via
            } else {
                via.destination_prefix(dst, prefix)
            };
            assert_eq!(
                route_via(dst, prefix, gw, 3),
                via.gateway(gw).output_interface(3).build()
            );
        }
        for mtu in [None, Some(1400)] {
            let mut builder = RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(dst, 16)
                .output_interface(9)
                .pref_source(src)
                .scope(RouteScope::Link);
            if let Some(mtu) = mtu {
                builder
                    .get_mut()
                    .attributes
                    .push(RouteAttribute::Metrics(vec![RouteMetric::Mtu(mtu)]));
            }
            assert_eq!(link_route_src(dst, 16, 9, src, mtu), builder.build());
        }
        for (addr, prefix) in [
            (src, 24),
            (src, 31),
            (src, 32),
            (Ipv4Addr::new(224, 0, 0, 1), 4),
        ] {
            assert_eq!(
                address(4, addr, prefix),
                AddressMessageBuilder::<Ipv4Addr>::new()
                    .index(4)
                    .address(addr, prefix)
                    .build()
            );
        }
        assert_eq!(link_up(5), LinkUnspec::new_with_index(5).up().build());

        let netns = std::fs::File::open("/proc/self/ns/net").expect("own namespace");
        let mac = [2, 0, 0, 0, 0, 9];
        let peer = LinkMessageBuilder::<LinkUnspec>::new()
            .name("eth0".to_owned())
            .setns_by_fd(netns.as_raw_fd())
            .mtu(1450)
            .address(mac.to_vec())
            .build();
        assert_eq!(
            veth_message("rv1", "eth0", &netns, 1450, mac),
            LinkVeth::new("rv1", "eth0")
                .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
                .mtu(1450)
                .build()
        );
    }
}
