//! The node section: its name, pod CIDR, gateway, uplink, MTU and
//! namespace; where its state lives, the API socket and metrics.

use std::{net::Ipv4Addr, path::PathBuf};

use ipnet::Ipv4Net;

use super::{ConfigError, FileConfig, absolute, invalid, validate_ifname};

/// Default gateway address the pods route through. It exists nowhere: the
/// datapath answers ARP for it.
pub const DEFAULT_GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
/// Default bpffs mount point.
pub const DEFAULT_BPFFS: &str = "/sys/fs/bpf";
/// Default node pod CIDR in single-node mode.
pub const DEFAULT_POD_CIDR: &str = "10.244.0.0/24";
/// Where the agent serves metrics unless told otherwise.
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9402";

/// The node's own settings, validated.
pub(super) struct Node {
    pub(super) node_name: String,
    pub(super) pod_cidr: Ipv4Net,
    /// `pod_cidr` as written, for errors found later.
    pub(super) pod_cidr_text: String,
    pub(super) gateway: Ipv4Addr,
    pub(super) uplink: Option<String>,
    pub(super) mtu: Option<u32>,
    pub(super) netns: Option<PathBuf>,
}

pub(super) fn node(file: &FileConfig) -> Result<Node, ConfigError> {
    let node_name = match &file.node_name {
        Some(n) => n.clone(),
        None => nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "node".to_owned()),
    };
    if node_name.is_empty()
        || node_name.len() > 63
        || !node_name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        || node_name.starts_with('.')
    {
        return Err(invalid(
            "node_name",
            &node_name,
            "use 1-63 characters from [A-Za-z0-9._-], not starting with '.'",
        ));
    }

    let cidr_text = file
        .pod_cidr
        .clone()
        .unwrap_or_else(|| DEFAULT_POD_CIDR.to_owned());
    let pod_cidr: Ipv4Net = cidr_text.parse().map_err(|_| {
        invalid(
            "pod_cidr",
            &cidr_text,
            "not an IPv4 CIDR like 10.244.1.0/24",
        )
    })?;
    if pod_cidr.network() != pod_cidr.addr() {
        return Err(invalid(
            "pod_cidr",
            &cidr_text,
            format!("host bits set; did you mean {}?", pod_cidr.trunc()),
        ));
    }
    if pod_cidr.prefix_len() > 30 || pod_cidr.prefix_len() < 8 {
        return Err(invalid(
            "pod_cidr",
            &cidr_text,
            "prefix length must be 8..=30",
        ));
    }

    let gateway = file.gateway.unwrap_or(DEFAULT_GATEWAY);
    if pod_cidr.contains(&gateway) {
        return Err(invalid(
            "gateway",
            gateway,
            format!("must be outside the pod CIDR {pod_cidr}"),
        ));
    }
    if gateway.is_unspecified() || gateway.is_broadcast() || gateway.is_multicast() {
        return Err(invalid("gateway", gateway, "must be a unicast address"));
    }

    if let Some(uplink) = &file.uplink {
        validate_ifname(uplink).map_err(|r| invalid("uplink", uplink, r))?;
    }
    if let Some(mtu) = file.mtu
        && !(576..=65_535).contains(&mtu)
    {
        return Err(invalid("mtu", mtu, "must be 576..=65535"));
    }

    let netns = match &file.netns {
        None => None,
        Some(n) if n.is_empty() => return Err(invalid("netns", n, "empty")),
        Some(n) if n.contains('/') => Some(absolute("netns", PathBuf::from(n))?),
        Some(n) => Some(PathBuf::from("/run/netns").join(n)),
    };
    Ok(Node {
        node_name,
        pod_cidr,
        pod_cidr_text: cidr_text,
        gateway,
        uplink: file.uplink.clone(),
        mtu: file.mtu,
        netns,
    })
}

/// Where the node's state lives, its API socket and metrics, validated.
pub(super) struct Places {
    pub(super) bpffs: PathBuf,
    pub(super) pin_dir: PathBuf,
    pub(super) state_dir: PathBuf,
    pub(super) socket: PathBuf,
    pub(super) socket_group: Option<String>,
    pub(super) metrics_addr: Option<std::net::SocketAddr>,
}

pub(super) fn places(file: &FileConfig, node_name: &str) -> Result<Places, ConfigError> {
    let bpffs = absolute(
        "bpffs",
        file.bpffs
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_BPFFS)),
    )?;
    let pin_dir = match &file.pin_dir {
        Some(p) => absolute("pin_dir", p.clone())?,
        None => bpffs.join("rivet").join(node_name),
    };
    if !pin_dir.starts_with(&bpffs) || pin_dir == bpffs {
        return Err(invalid(
            "pin_dir",
            pin_dir.display(),
            format!("must be a directory below the bpffs {}", bpffs.display()),
        ));
    }
    let state_dir = match &file.state_dir {
        Some(p) => absolute("state_dir", p.clone())?,
        None => PathBuf::from("/var/lib/rivet").join(node_name),
    };
    let socket = absolute(
        "socket",
        file.socket
            .clone()
            .unwrap_or_else(|| PathBuf::from(rivet_api::DEFAULT_SOCKET)),
    )?;
    // sun_path is 108 bytes including the terminating NUL.
    if socket.as_os_str().len() > 107 {
        return Err(invalid(
            "socket",
            socket.display(),
            "unix socket paths are at most 107 bytes",
        ));
    }
    let socket_group = match &file.socket_group {
        Some(g) if g.is_empty() || g.len() > 32 || g.contains(['/', ':', '\n']) => {
            return Err(invalid("socket_group", g, "not a group name"));
        }
        other => other.clone(),
    };
    let metrics_addr = match file.metrics_addr.as_deref().unwrap_or(DEFAULT_METRICS_ADDR) {
        "off" => None,
        text => Some(
            text.parse()
                .map_err(|_| invalid("metrics_addr", text, "must be address:port or \"off\""))?,
        ),
    };
    Ok(Places {
        bpffs,
        pin_dir,
        state_dir,
        socket,
        socket_group,
        metrics_addr,
    })
}
