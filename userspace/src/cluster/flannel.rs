//! flannel's record of a node, shared by the etcd source (a subnet lease's
//! value) and the Kubernetes source (the same fields as Node annotations:
//! `flannel.alpha.coreos.com/backend-type`, `backend-data`, `public-ip`):
//! a flannel node and a rivet node read each other's records either way.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use crate::{cluster::RemoteNode, config::Mode, netlink::parse_mac};

/// The backend section of the network config.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Backend {
    /// `vxlan`, `ipip`, `host-gw` (and rivet's `bgp`).
    #[serde(rename = "Type", default)]
    pub kind: String,
    /// VXLAN VNI.
    #[serde(rename = "VNI", default, skip_serializing_if = "Option::is_none")]
    pub vni: Option<u32>,
    /// VXLAN port.
    #[serde(rename = "Port", default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Route natively to nodes on the same subnet.
    #[serde(rename = "DirectRouting", default)]
    pub direct_routing: bool,
}

impl Backend {
    /// rivet's mode for this backend.
    pub fn mode(&self) -> Mode {
        match self.kind.as_str() {
            "ipip" => Mode::Ipip,
            "host-gw" => Mode::Native,
            "bgp" => Mode::Bgp,
            _ if self.direct_routing => Mode::Hybrid,
            _ => Mode::Vxlan,
        }
    }

    /// The backend section for a mode.
    pub fn for_mode(mode: Mode, vni: u32, port: u16) -> Self {
        let (kind, direct) = match mode {
            Mode::Vxlan => ("vxlan", false),
            Mode::Hybrid => ("vxlan", true),
            Mode::Ipip => ("ipip", false),
            Mode::Native => ("host-gw", false),
            // Not a flannel backend: flannel nodes cannot join a BGP
            // cluster, rivet nodes read it back.
            Mode::Bgp => ("bgp", false),
        };
        Self {
            kind: kind.to_owned(),
            vni: Some(vni),
            port: Some(port),
            direct_routing: direct,
        }
    }
}

/// `<prefix>/subnets/<net>-<len>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubnetLease {
    /// The node's address.
    #[serde(rename = "PublicIP")]
    pub public_ip: Ipv4Addr,
    /// Backend type of the node.
    #[serde(rename = "BackendType", default)]
    pub backend_type: String,
    /// Backend data (VXLAN: VNI and VTEP MAC).
    #[serde(rename = "BackendData", default)]
    pub backend_data: Option<BackendData>,
}

/// VXLAN backend data.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct BackendData {
    /// VNI.
    #[serde(rename = "VNI", default, skip_serializing_if = "Option::is_none")]
    pub vni: Option<u32>,
    /// VTEP MAC.
    #[serde(rename = "VtepMAC", default, skip_serializing_if = "Option::is_none")]
    pub vtep_mac: Option<String>,
}

/// A remote node from its lease.
pub fn remote_node(subnet: Ipv4Net, lease: &SubnetLease, default_vni: u32) -> RemoteNode {
    let data = lease.backend_data.clone().unwrap_or_default();
    RemoteNode {
        subnet,
        node_ip: lease.public_ip,
        vtep_mac: data
            .vtep_mac
            .as_deref()
            .and_then(parse_mac)
            .unwrap_or_else(|| crate::cluster::node::vtep_mac_for(lease.public_ip)),
        vni: data.vni.unwrap_or(default_vni),
    }
}
