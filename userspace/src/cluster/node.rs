//! Node-level plumbing the datapath relies on, made idempotently at every
//! start:
//!
//! - `rivet_host` / `rivet_net`: a veth pair (this kernel has no dummy device)
//!   whose `rivet_host` end carries the cluster-CIDR route (`src` = node IP,
//!   MTU = pod MTU). `from_host` on its TC egress encapsulates the node's own
//!   traffic to remote pods; decapsulated traffic for the node is delivered to
//!   its ingress. ARP is off on it: the program writes L2.
//! - `rivet_vxlan`: an idle collect-metadata vxlan device (`external`) bound to
//!   the VXLAN port, in vxlan and hybrid modes. It never receives a packet
//!   (`from_uplink` decapsulates or drops everything sent to the port); its UDP
//!   tunnel socket makes the kernel's GRO merge VXLAN trains before TC ingress,
//!   as it does for the kernel's own vxlan device.
//! - IPv4 forwarding on (`bpf_fib_lookup` needs it; pods' TTL-expired and
//!   fragmented packets go through the stack).
//!
//! Receive GRO for VXLAN, the measured decision: GRO runs before TC and merges
//! VXLAN only when a UDP tunnel socket with a GRO handler is bound to the
//! destination port. With a pure-BPF decap, on a NIC-like underlay, each
//! 1500-byte segment would be decapsulated and delivered alone. With
//! `rivet_vxlan`'s socket GRO merges trains and `from_uplink` decapsulates the
//! merged super-packet (with FIXED_GSO the segment size is preserved) before
//! the socket ever sees it. XDP decap before GRO was the alternative; it would
//! need its own MAC/FIB handling, and the device costs nothing per packet.
//! Profiled again (BENCHMARKS.md, overlay): the VXLAN-specific GRO layers are ≈
//! 4 % of the NIC-like CPU per GB, the most XDP could save, while an `XDP_PASS`
//! program alone on the veth uplinks costs 39 % more CPU per GB there (4× on
//! the veth default: veth converts every skb for XDP) — not built. The
//! benchmark variant `rivet-vxlan-nogro` (the device deleted) measures the
//! difference. IPIP needs nothing: GRO handles IPIP natively.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use crate::netlink::{LinkInfo, Netlink, NetlinkError};

/// The device carrying the cluster-CIDR route.
pub const HOST_DEV: &str = "rivet_host";
/// Its veth peer.
pub const HOST_PEER: &str = "rivet_net";
/// The idle vxlan device kept for receive GRO.
pub const VXLAN_DEV: &str = "rivet_vxlan";

/// Problems setting up the node.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// Netlink failed.
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    /// A sysctl could not be written.
    #[error("writing {key}: {source}")]
    Sysctl {
        /// The sysctl.
        key: String,
        /// Cause.
        source: std::io::Error,
    },
    /// A device exists with our name but is not what we make.
    #[error("{0}")]
    Conflict(String),
}

fn sysctl(path: &str, value: &str) -> Result<(), NodeError> {
    std::fs::write(path, value).map_err(|source| NodeError::Sysctl {
        key: path.to_owned(),
        source,
    })
}

/// Creates (or adopts) `rivet_host`/`rivet_net` and routes the cluster CIDR
/// through `rivet_host`. Returns `rivet_host`.
pub async fn host_device(
    nl: &Netlink,
    cluster: Ipv4Net,
    node_ip: Ipv4Addr,
    mtu: u32,
) -> Result<LinkInfo, NodeError> {
    let host = match nl.link_by_name(HOST_DEV).await? {
        Some(l) if l.kind.as_deref() == Some("veth") => l,
        Some(l) => {
            return Err(NodeError::Conflict(format!(
                "{HOST_DEV} exists but is a {:?} device, not rivet's veth",
                l.kind
            )));
        }
        None => {
            nl.create_veth_pair(HOST_DEV, HOST_PEER, mtu).await?;
            nl.link_by_name(HOST_DEV)
                .await?
                .ok_or_else(|| NodeError::Conflict(format!("{HOST_DEV} vanished after creation")))?
        }
    };
    let peer = nl.link_by_name(HOST_PEER).await?.ok_or_else(|| {
        NodeError::Conflict(format!("{HOST_PEER} (peer of {HOST_DEV}) is missing"))
    })?;
    for name in [HOST_DEV, HOST_PEER] {
        for (key, value) in [
            ("accept_ra", "0"),
            ("accept_dad", "0"),
            ("disable_ipv6", "1"),
        ] {
            // Best effort: absent without IPv6.
            let _ = crate::netlink::netns::write_if_sysctl("ipv6", name, key, value);
        }
    }
    nl.configure_link(host.index, HOST_DEV, mtu, false).await?;
    nl.configure_link(peer.index, HOST_PEER, mtu, false).await?;
    nl.replace_link_route_src(
        cluster.network(),
        cluster.prefix_len(),
        host.index,
        HOST_DEV,
        node_ip,
        None,
    )
    .await?;
    Ok(host)
}

/// Creates (or keeps) the idle vxlan device bound to `port`, up.
pub async fn vxlan_gro_device(nl: &Netlink, port: u16) -> Result<(), NodeError> {
    let dev = match nl.link_by_name(VXLAN_DEV).await? {
        Some(d) => d,
        None => {
            nl.create_vxlan_external(VXLAN_DEV, port).await?;
            nl.link_by_name(VXLAN_DEV).await?.ok_or_else(|| {
                NodeError::Conflict(format!("{VXLAN_DEV} vanished after creation"))
            })?
        }
    };
    let _ = crate::netlink::netns::write_if_sysctl("ipv6", VXLAN_DEV, "disable_ipv6", "1");
    nl.set_up(dev.index, VXLAN_DEV).await?;
    Ok(())
}

/// Turns IPv4 forwarding on in this namespace.
pub fn enable_forwarding() -> Result<(), NodeError> {
    sysctl("/proc/sys/net/ipv4/ip_forward", "1")
}

/// Removes rivet's node devices (unload).
pub async fn remove_devices(nl: &Netlink) -> Result<Vec<String>, NodeError> {
    let mut removed = Vec::new();
    for name in [HOST_DEV, VXLAN_DEV] {
        if let Some(l) = nl.link_by_name(name).await? {
            match nl.delete_link(l.index, name).await {
                Ok(()) => removed.push(name.to_owned()),
                Err(e) if e.errno() == Some(libc::ENODEV) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(removed)
}

/// The VTEP MAC of a node: locally administered `0e:72` + its IPv4 address.
pub fn vtep_mac_for(node_ip: Ipv4Addr) -> [u8; 6] {
    let [a, b, c, d] = node_ip.octets();
    [0x0e, 0x72, a, b, c, d]
}
