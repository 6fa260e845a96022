//! The other nodes of the cluster as the datapath sees them: for each remote
//! pod subnet a route (ROUTES: subnet → node IP and how to reach it) and for
//! each node a peer entry (PEERS: node IP → VTEP MAC, VNI). Fed by the API
//! (`node_set`/`node_del`: static clusters, tests) or by a source of the
//! cluster's nodes that reports to a [`ClusterSink`]: [`etcd`] (flannel's
//! schema) today.
//!
//! The mode is decided here, per peer, and written into its ROUTES entry, so
//! the datapath never decides: in `hybrid` (flannel's DirectRouting) a peer on
//! the same L2 (its node IP inside the uplink's own subnet) is routed natively,
//! any other gets VXLAN. VNI (default 1) and port (default 8472, flannel's) are
//! agent settings (`vni`, `vxlan_port`); the VTEP MAC is derived from the node
//! IP (`0e:72:<ip>`), so a peer's MAC is known from its address alone.

pub mod bgp;
pub mod etcd;
pub mod flannel;
pub mod kubernetes;
pub mod node;

use std::{collections::BTreeMap, net::Ipv4Addr};

use ipnet::Ipv4Net;
use rivet_api::NodeEntry;
use rivet_common::{PeerInfo, RouteInfo, route_mode};

use crate::{
    config::{CrossSubnet, Mode},
    datapath::{Datapath, DatapathError},
    netlink::{format_mac, parse_mac},
};

/// What a source of the cluster's nodes (the etcd watcher) reports to the
/// agent.
pub trait ClusterSink: Send + Sync + 'static {
    /// Replaces the set of remote nodes.
    fn replace(&self, nodes: Vec<RemoteNode>) -> impl std::future::Future<Output = ()> + Send;
    /// Adds or updates one node.
    fn upsert(&self, node: RemoteNode) -> impl std::future::Future<Output = ()> + Send;
    /// Removes one node.
    fn remove(&self, subnet: Ipv4Net) -> impl std::future::Future<Output = ()> + Send;
    /// Store state for status and readiness.
    fn state(&self, report: StoreReport) -> impl std::future::Future<Output = ()> + Send;
}

/// What a source says of its store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreReport {
    /// In sync: the nodes are as the store lists, `peers` of them.
    Synced {
        /// Other nodes the store lists.
        peers: usize,
    },
    /// The store is unreachable (being reconnected), and why.
    Lost {
        /// The store's or the connection's error.
        reason: String,
    },
}

/// A remote node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteNode {
    /// Its pod subnet.
    pub subnet: Ipv4Net,
    /// Its uplink address.
    pub node_ip: Ipv4Addr,
    /// Its VTEP MAC.
    pub vtep_mac: [u8; 6],
    /// Its VNI.
    pub vni: u32,
}

/// Problems with a node entry.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The entry is invalid.
    #[error("{0}")]
    Invalid(String),
    /// The maps could not be written.
    #[error(transparent)]
    Datapath(#[from] DatapathError),
}

impl RemoteNode {
    /// Validates an API entry.
    pub fn from_entry(e: &NodeEntry, default_vni: u32) -> Result<Self, ClusterError> {
        let subnet: Ipv4Net = e.subnet.parse().map_err(|_| {
            ClusterError::Invalid(format!("subnet {:?} is not an IPv4 CIDR", e.subnet))
        })?;
        if subnet.network() != subnet.addr() {
            return Err(ClusterError::Invalid(format!(
                "subnet {subnet} has host bits set"
            )));
        }
        let vtep_mac = match &e.vtep_mac {
            Some(m) => parse_mac(m)
                .ok_or_else(|| ClusterError::Invalid(format!("vtep_mac {m:?} is not a MAC")))?,
            None => crate::cluster::node::vtep_mac_for(e.node_ip),
        };
        Ok(Self {
            subnet,
            node_ip: e.node_ip,
            vtep_mac,
            vni: e.vni.unwrap_or(default_vni),
        })
    }

    /// As an API entry.
    pub fn entry(&self, mode: u32) -> NodeEntry {
        NodeEntry {
            subnet: self.subnet.to_string(),
            node_ip: self.node_ip,
            vtep_mac: Some(format_mac(&self.vtep_mac)),
            vni: Some(self.vni),
            route: Some(
                match mode {
                    route_mode::VXLAN => "vxlan",
                    route_mode::IPIP => "ipip",
                    _ => "native",
                }
                .to_owned(),
            ),
        }
    }
}

/// The remote nodes, mirrored into the ROUTES and PEERS maps.
#[derive(Debug)]
pub struct Cluster {
    mode: Mode,
    /// `bgp` mode: how next hops outside the uplink's subnet are reached.
    cross_subnet: CrossSubnet,
    /// The uplink's subnet (hybrid and bgp modes: peers inside it are
    /// reached natively).
    uplink_net: Option<Ipv4Net>,
    own_subnet: Ipv4Net,
    own_ip: Option<Ipv4Addr>,
    vni: u32,
    nodes: BTreeMap<Ipv4Net, RemoteNode>,
    /// Subnets per node address: a peer entry goes when its count does
    /// (constant time, not a scan of every node).
    per_ip: BTreeMap<Ipv4Addr, usize>,
}

impl Cluster {
    /// An empty view; [`Cluster::restore`] reads what the pinned maps hold.
    pub fn new(
        mode: Mode,
        uplink_net: Option<Ipv4Net>,
        own_subnet: Ipv4Net,
        own_ip: Option<Ipv4Addr>,
        vni: u32,
    ) -> Self {
        Self {
            mode,
            cross_subnet: CrossSubnet::None,
            uplink_net,
            own_subnet,
            own_ip,
            vni,
            nodes: BTreeMap::new(),
            per_ip: BTreeMap::new(),
        }
    }

    /// In `bgp` mode: how next hops outside the uplink's subnet are
    /// reached.
    pub fn with_cross_subnet(mut self, cross_subnet: CrossSubnet) -> Self {
        self.cross_subnet = cross_subnet;
        self
    }

    /// How traffic to `node_ip` travels.
    pub fn route_mode(&self, node_ip: Ipv4Addr) -> u32 {
        match self.mode {
            Mode::Vxlan => route_mode::VXLAN,
            Mode::Ipip => route_mode::IPIP,
            Mode::Native => route_mode::NATIVE,
            Mode::Hybrid | Mode::Bgp if self.uplink_net.is_some_and(|n| n.contains(&node_ip)) => {
                route_mode::NATIVE
            }
            Mode::Hybrid => route_mode::VXLAN,
            Mode::Bgp => match self.cross_subnet {
                CrossSubnet::None => route_mode::NATIVE,
                CrossSubnet::Vxlan => route_mode::VXLAN,
                CrossSubnet::Ipip => route_mode::IPIP,
            },
        }
    }

    /// Rebuilds the view from the pinned maps (a restarted agent). Peers
    /// whose route mode is not this agent's (written by an agent that did
    /// not record it, or under another mode) are rewritten.
    pub fn restore(&mut self, dp: &mut Datapath) -> Result<(), ClusterError> {
        let peers: BTreeMap<Ipv4Addr, PeerInfo> = dp.list_peers()?.into_iter().collect();
        for (ip, peer) in &peers {
            let mode = self.route_mode(*ip);
            if peer.route_mode != mode {
                dp.put_peer(
                    *ip,
                    PeerInfo {
                        route_mode: mode,
                        ..*peer
                    },
                )?;
            }
        }
        for (subnet, route) in dp.list_routes()? {
            let node_ip = Ipv4Addr::from(rivet_common::ipv4_from_key(route.node_ip));
            let peer = peers.get(&node_ip);
            self.put(RemoteNode {
                subnet,
                node_ip,
                vtep_mac: peer.map_or_else(
                    || crate::cluster::node::vtep_mac_for(node_ip),
                    |p| p.vtep_mac,
                ),
                vni: peer.map_or(self.vni, |p| p.vni),
            });
        }
        Ok(())
    }

    fn put(&mut self, node: RemoteNode) {
        *self.per_ip.entry(node.node_ip).or_default() += 1;
        if let Some(old) = self.nodes.insert(node.subnet, node) {
            self.forget_ip(old.node_ip);
        }
    }

    /// One subnet fewer for `ip`; true when it was the last.
    fn forget_ip(&mut self, ip: Ipv4Addr) -> bool {
        match self.per_ip.get_mut(&ip) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            _ => {
                self.per_ip.remove(&ip);
                true
            }
        }
    }

    /// Every remote node, by subnet.
    pub fn list(&self) -> Vec<NodeEntry> {
        self.nodes
            .values()
            .map(|n| n.entry(self.route_mode(n.node_ip)))
            .collect()
    }

    /// The remote node owning `subnet`, as the API shows it.
    pub fn entry(&self, subnet: Ipv4Net) -> Option<NodeEntry> {
        self.nodes
            .get(&subnet)
            .map(|n| n.entry(self.route_mode(n.node_ip)))
    }

    /// Number of remote nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True when alone.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Adds or updates a node (ignores this node itself).
    pub fn upsert(&mut self, dp: &mut Datapath, node: RemoteNode) -> Result<bool, ClusterError> {
        if node.subnet == self.own_subnet || Some(node.node_ip) == self.own_ip {
            return Ok(false);
        }
        if self.nodes.get(&node.subnet) == Some(&node) {
            return Ok(false);
        }
        // A subnet that moved to another node: forget the old owner first.
        if let Some(old) = self.nodes.get(&node.subnet).cloned() {
            self.remove(dp, old.subnet)?;
        }
        dp.put_peer(
            node.node_ip,
            PeerInfo {
                vtep_mac: node.vtep_mac,
                _pad: [0; 2],
                vni: node.vni,
                route_mode: self.route_mode(node.node_ip),
            },
        )?;
        if let Err(e) = dp.put_route(
            node.subnet,
            RouteInfo {
                node_ip: rivet_common::ipv4_key(node.node_ip.octets()),
                mode: self.route_mode(node.node_ip),
            },
        ) {
            // No half-added node: a peer without a route (ROUTES full).
            if !self.per_ip.contains_key(&node.node_ip) {
                let _ = dp.remove_peer(node.node_ip);
            }
            return Err(e.into());
        }
        self.put(node);
        Ok(true)
    }

    /// Removes the node owning `subnet`; its peer entry goes when no other
    /// subnet points at it.
    pub fn remove(&mut self, dp: &mut Datapath, subnet: Ipv4Net) -> Result<bool, ClusterError> {
        let Some(node) = self.nodes.remove(&subnet) else {
            return Ok(false);
        };
        dp.remove_route(subnet)?;
        if self.forget_ip(node.node_ip) {
            dp.remove_peer(node.node_ip)?;
        }
        Ok(true)
    }

    /// Makes the set of nodes exactly `nodes` (a full resync); returns
    /// how many entries it changed.
    pub fn replace_all(
        &mut self,
        dp: &mut Datapath,
        nodes: Vec<RemoteNode>,
    ) -> Result<usize, ClusterError> {
        let mut changed = 0;
        let keep: Vec<Ipv4Net> = nodes.iter().map(|n| n.subnet).collect();
        let stale: Vec<Ipv4Net> = self
            .nodes
            .keys()
            .filter(|s| !keep.contains(s))
            .copied()
            .collect();
        for s in stale {
            changed += usize::from(self.remove(dp, s)?);
        }
        for n in nodes {
            changed += usize::from(self.upsert(dp, n)?);
        }
        Ok(changed)
    }
}
