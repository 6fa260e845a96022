//! hostPorts: a pod's port mappings checked against each other, the
//! node's reserved ports and the other pods; their map entries.

use std::{
    collections::{HashMap, HashSet},
    net::Ipv4Addr,
};

use rivet_api::{Endpoint, PortMapping, Protocol};
use rivet_common::{HostPortKey, HostPortTarget, ipv4_key};

use super::{EndpointError, ReservedPorts};
use crate::datapath::Datapath;

/// The hostPort map entries of an endpoint (TCP and UDP mappings).
pub fn hostport_entries(ep: &Endpoint) -> Vec<(HostPortKey, HostPortTarget)> {
    ep.port_mappings
        .iter()
        .filter_map(|pm| {
            let proto = match pm.protocol {
                Protocol::Tcp => 6,
                Protocol::Udp => 17,
                Protocol::Sctp | Protocol::Icmp | Protocol::Other(_) => return None,
            };
            let addr = pm
                .host_ip
                .filter(|ip| !ip.is_unspecified())
                .map_or(0, |ip| ipv4_key(ip.octets()));
            Some((
                HostPortKey {
                    addr,
                    port: pm.host_port.to_be(),
                    proto,
                    _pad: 0,
                },
                HostPortTarget {
                    pod_ip: ipv4_key(ep.ip.octets()),
                    port: pm.container_port.to_be(),
                    _pad: [0; 2],
                },
            ))
        })
        .collect()
}

/// Removes an endpoint's hostPorts (those still pointing at it).
pub(super) fn remove_hostports(dp: &mut Datapath, ep: &Endpoint) -> Result<(), EndpointError> {
    let present: HashMap<HostPortKey, HostPortTarget> = dp.list_hostports()?.into_iter().collect();
    for (key, target) in hostport_entries(ep) {
        if present.get(&key) == Some(&target) {
            dp.remove_hostport(key)?;
        }
    }
    Ok(())
}

/// Validates port mappings: ports non-zero; a hostIP, if given, is one of
/// the node's addresses.
pub(super) fn validate_port_mappings(
    pms: &[PortMapping],
    local: &HashSet<Ipv4Addr>,
    reserved: ReservedPorts,
) -> Result<(), EndpointError> {
    for pm in pms {
        if pm.protocol == Protocol::Sctp {
            return Err(EndpointError::BadRequest(format!(
                "port mapping {}:{}/sctp: rivet's datapath translates TCP and UDP hostPorts only",
                pm.host_port, pm.container_port
            )));
        }
        if let Some((lo, hi)) = reserved.nat
            && (lo..=hi).contains(&pm.host_port)
        {
            return Err(EndpointError::BadRequest(format!(
                "hostPort {} is inside the NAT source port range {lo}-{hi}",
                pm.host_port
            )));
        }
        if pm.protocol == Protocol::Udp && pm.host_port == reserved.vxlan_udp {
            return Err(EndpointError::BadRequest(format!(
                "hostPort {}/udp is the VXLAN port",
                pm.host_port
            )));
        }
        if pm.host_port == 0 || pm.container_port == 0 {
            return Err(EndpointError::BadRequest(format!(
                "port mapping {}:{}/{:?}: ports must be 1..=65535",
                pm.host_port, pm.container_port, pm.protocol
            )));
        }
        if let Some(ip) = pm.host_ip
            && !ip.is_unspecified()
            && !local.contains(&ip)
        {
            return Err(EndpointError::BadRequest(format!(
                "port mapping hostIP {ip} is not an address of this node"
            )));
        }
    }
    Ok(())
}

/// True if two mappings would capture the same traffic.
/// A hostPort claimed by a mapping: of another container (its ID), or of
/// the request itself (`None`).
pub(super) type Claim<'a> = (&'a PortMapping, Option<&'a str>);

pub(super) fn mappings_clash(a: &PortMapping, b: &PortMapping) -> bool {
    let any = |ip: Option<Ipv4Addr>| ip.is_none_or(|i| i.is_unspecified());
    a.protocol == b.protocol
        && a.host_port == b.host_port
        && (any(a.host_ip) || any(b.host_ip) || a.host_ip == b.host_ip)
}

#[cfg(test)]
mod tests {
    use rivet_api::Protocol;

    use super::*;

    fn pm(port: u16, proto: Protocol, ip: Option<&str>) -> PortMapping {
        PortMapping {
            host_port: port,
            container_port: 80,
            protocol: proto,
            host_ip: ip.map(|s| s.parse().expect("ip")),
        }
    }

    #[test]
    fn port_mapping_clashes() {
        use Protocol::{Tcp, Udp};
        assert!(mappings_clash(&pm(80, Tcp, None), &pm(80, Tcp, None)));
        assert!(mappings_clash(
            &pm(80, Tcp, None),
            &pm(80, Tcp, Some("10.0.0.1"))
        ));
        assert!(mappings_clash(
            &pm(80, Tcp, Some("0.0.0.0")),
            &pm(80, Tcp, Some("10.0.0.1"))
        ));
        assert!(!mappings_clash(&pm(80, Tcp, None), &pm(80, Udp, None)));
        assert!(!mappings_clash(&pm(80, Tcp, None), &pm(81, Tcp, None)));
        assert!(!mappings_clash(
            &pm(80, Tcp, Some("10.0.0.1")),
            &pm(80, Tcp, Some("10.0.0.2"))
        ));
    }

    #[test]
    fn port_mapping_validation() {
        let local: HashSet<Ipv4Addr> = ["10.0.0.1".parse().expect("ip")].into();
        let reserved = ReservedPorts {
            nat: Some((61_000, 65_535)),
            vxlan_udp: 8472,
        };
        let check = |pm: PortMapping| validate_port_mappings(&[pm], &local, reserved);
        assert!(check(pm(80, Protocol::Tcp, Some("10.0.0.1"))).is_ok());
        assert!(check(pm(80, Protocol::Tcp, Some("0.0.0.0"))).is_ok());
        assert!(check(pm(80, Protocol::Tcp, Some("10.0.0.9"))).is_err());
        assert!(check(pm(0, Protocol::Tcp, None)).is_err());
        assert!(check(pm(80, Protocol::Sctp, None)).is_err(), "sctp");
        assert!(check(pm(62_000, Protocol::Tcp, None)).is_err(), "NAT range");
        assert!(check(pm(8472, Protocol::Udp, None)).is_err(), "VXLAN port");
        assert!(check(pm(8472, Protocol::Tcp, None)).is_ok());
    }
}
