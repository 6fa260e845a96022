//! `bgp` mode: the node announces its pod CIDR over BGP and the datapath
//! routes natively on what BGP learned (Calico's model).
//!
//! The speaker is BIRD 2 ([`bird`]), not one of our own: the agent renders
//! its configuration, starts it (or finds it running: it outlives agent
//! restarts), reconfigures it when peers change and reads its sessions over
//! the control socket. Why BIRD: Calico runs it for exactly this job; it is
//! a Debian package; its kernel protocol writes learned routes into a
//! table of the agent's with the BGP next hop intact, so the agent hears of
//! every change through netlink within milliseconds (`netlink::table`)
//! instead of polling; it has graceful restart on both sides (keeping
//! routes at peers, and deferring its own kernel sync after a restart) and
//! reconfigures without dropping unchanged sessions. GoBGP would need its
//! gRPC API compiled in; no maintained Rust speaker has graceful restart
//! and route reflection.
//!
//! Who this node peers with ([`Bgp::sessions`]):
//! - the mesh (`bgp_mesh`): every other node the cluster store lists
//!   (etcd, the Kubernetes API, or `rivetctl node set`), iBGP;
//! - reflectors (`bgp_reflectors`): those addresses only;
//! - a reflector (`bgp_reflector_cluster_id`): every other node as its
//!   client, the other reflectors as plain iBGP peers;
//! - external peers (`bgp_peers`): top-of-rack routers, eBGP or iBGP.
//!
//! A learned route (prefix → BGP next hop) becomes a `ROUTES` entry: native
//! when the next hop is on the uplink's subnet, else the cross-subnet
//! tunnel (`bgp_cross_subnet`) or native through the uplink's gateway.
//! Withdrawals are followed at once unless the prefix flaps ([`damping`]).

pub mod bird;
pub mod damping;

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
    path::Path,
    time::Instant,
};

use ipnet::Ipv4Net;

use self::{
    bird::{Bird, BirdError, BirdPaths, Role, Session, SessionState, SpeakerConfig},
    damping::Damping,
};
use crate::{cluster::RemoteNode, config::BgpSettings};

/// The speaker's files: `<state_dir>/bgp/`.
pub fn paths(state_dir: &Path) -> BirdPaths {
    BirdPaths::in_dir(&state_dir.join("bgp"))
}

/// The cluster's nodes as last known, kept beside the speaker's files: a
/// restarted agent renders the same configuration before its source has
/// synced, so the running speaker keeps every session.
const MEMBERS_FILE: &str = "members.json";

/// This node's BGP state: its peers and what it learned.
pub struct Bgp {
    settings: BgpSettings,
    bird: Bird,
    base: SpeakerConfig,
    default_vni: u32,
    /// The cluster's nodes (mesh peers; VTEPs of tunnelled next hops).
    members: BTreeMap<Ipv4Net, RemoteNode>,
    /// The speaker's table: prefix → next hop.
    learned: BTreeMap<Ipv4Net, Ipv4Addr>,
    damping: Damping,
    /// Sessions by name as last seen, for change events.
    seen: BTreeMap<String, String>,
    /// Session state changes seen, by session name.
    pub changes: BTreeMap<String, u64>,
    /// Times the speaker was found dead and started again.
    pub restarts: u64,
    /// `ROUTES` entries written or removed because of BGP.
    pub route_changes: u64,
    members_file: std::path::PathBuf,
}

/// What the node knows of itself that the speaker needs.
pub struct NodeFacts<'a> {
    /// The node's address (router ID, session source).
    pub node_ip: Ipv4Addr,
    /// The uplink's name.
    pub uplink: &'a str,
    /// The node's pod CIDR.
    pub pod_cidr: Ipv4Net,
    /// The cluster CIDR.
    pub cluster_cidr: Ipv4Net,
    /// The agent's state directory.
    pub state_dir: &'a Path,
    /// The default VNI of tunnelled next hops.
    pub vni: u32,
}

impl Bgp {
    /// The state of a node with `settings`, with the cluster's nodes a
    /// previous agent knew; nothing started yet.
    pub fn new(settings: BgpSettings, facts: &NodeFacts<'_>) -> Self {
        let mut announce = vec![facts.pod_cidr];
        announce.extend(settings.advertise.iter().copied());
        let base = SpeakerConfig {
            router_id: facts.node_ip,
            asn: settings.asn,
            uplink: facts.uplink.to_owned(),
            announce,
            cluster_cidr: facts.cluster_cidr,
            pod_cidr: facts.pod_cidr,
            table: settings.table,
            hold_time: settings.hold_time,
            graceful_restart: settings.graceful_restart,
            cluster_id: settings.cluster_id,
            sessions: Vec::new(),
        };
        let members_file = facts.state_dir.join("bgp").join(MEMBERS_FILE);
        let members = std::fs::read(&members_file)
            .ok()
            .and_then(|b| serde_json::from_slice::<Vec<rivet_api::NodeEntry>>(&b).ok())
            .unwrap_or_default()
            .iter()
            .filter_map(|e| RemoteNode::from_entry(e, facts.vni).ok())
            .map(|n| (n.subnet, n))
            .collect();
        Self {
            bird: Bird::new(settings.speaker.clone(), paths(facts.state_dir)),
            settings,
            base,
            default_vni: facts.vni,
            members,
            members_file,
            learned: BTreeMap::new(),
            damping: Damping::default(),
            seen: BTreeMap::new(),
            changes: BTreeMap::new(),
            restarts: 0,
            route_changes: 0,
        }
    }

    /// The settings.
    pub fn settings(&self) -> &BgpSettings {
        &self.settings
    }

    /// The speaker.
    pub fn bird(&self) -> &Bird {
        &self.bird
    }

    /// The sessions this node should have, in a stable order.
    pub fn sessions(&self) -> Vec<Session> {
        let me = self.base.router_id;
        let s = &self.settings;
        let mut out: BTreeSet<Session> = BTreeSet::new();
        let reflectors: BTreeSet<Ipv4Addr> = s.reflectors.iter().copied().collect();
        let node = |address, role| Session {
            address,
            asn: s.asn,
            password: s.password.clone(),
            role,
        };
        for r in reflectors.iter().filter(|r| **r != me) {
            let role = if s.cluster_id.is_some() {
                Role::Node
            } else {
                Role::Reflector
            };
            out.insert(node(*r, role));
        }
        let members: BTreeSet<Ipv4Addr> = self
            .members
            .values()
            .map(|m| m.node_ip)
            .filter(|ip| *ip != me && !reflectors.contains(ip))
            .collect();
        if s.cluster_id.is_some() {
            out.extend(members.iter().map(|ip| node(*ip, Role::Client)));
        } else if s.mesh {
            out.extend(members.iter().map(|ip| node(*ip, Role::Node)));
        }
        let taken: BTreeSet<Ipv4Addr> = out.iter().map(|s| s.address).collect();
        out.extend(
            s.peers
                .iter()
                .filter(|p| !taken.contains(&p.address) && p.address != me)
                .map(|p| Session {
                    address: p.address,
                    asn: p.asn,
                    password: p.password.clone(),
                    role: Role::External,
                }),
        );
        out.into_iter().collect()
    }

    /// The speaker's configuration text now.
    pub fn render(&self) -> String {
        bird::render(&SpeakerConfig {
            sessions: self.sessions(),
            ..self.base.clone()
        })
    }

    /// Writes the configuration and starts the speaker, or makes the
    /// running one (left by a previous agent) read it. `recover`: start in
    /// graceful restart recovery (the agent's table still holds routes).
    pub fn ensure_running(&mut self, recover: bool) -> Result<(), BirdError> {
        if let Some(dir) = self.bird.paths().config.parent() {
            std::fs::create_dir_all(dir).map_err(|source| BirdError::Write {
                path: dir.to_owned(),
                source,
            })?;
        }
        let changed = self.bird.write_config(&self.render())?;
        if self.bird.alive() {
            if changed {
                self.bird.reconfigure()?;
            }
            return Ok(());
        }
        self.bird.start(recover)
    }

    /// After a change of the members: the new configuration, read by the
    /// speaker when it differs.
    pub fn reconfigure(&mut self) -> Result<(), BirdError> {
        if self.bird.write_config(&self.render())? && self.bird.alive() {
            self.bird.reconfigure()?;
        }
        Ok(())
    }

    /// A node of the cluster added or changed; true when the peers changed.
    pub fn put_member(&mut self, node: RemoteNode) -> bool {
        let changed = self.members.insert(node.subnet, node.clone()) != Some(node);
        self.save_members(changed)
    }

    /// A node of the cluster gone; true when it was known.
    pub fn remove_member(&mut self, subnet: Ipv4Net) -> bool {
        let changed = self.members.remove(&subnet).is_some();
        self.save_members(changed)
    }

    /// The cluster's nodes are exactly `nodes`; true when anything changed.
    pub fn replace_members(&mut self, nodes: Vec<RemoteNode>) -> bool {
        let new: BTreeMap<Ipv4Net, RemoteNode> = nodes.into_iter().map(|n| (n.subnet, n)).collect();
        let changed = new != self.members;
        self.members = new;
        self.save_members(changed)
    }

    /// Writes the members when `changed` (atomically; a failure is logged:
    /// the speaker is configured either way). Returns `changed`.
    fn save_members(&self, changed: bool) -> bool {
        if changed {
            let entries: Vec<rivet_api::NodeEntry> = self
                .members
                .values()
                .map(|m| m.entry(rivet_common::route_mode::NATIVE))
                .collect();
            let tmp = self.members_file.with_extension("json.tmp");
            let written = serde_json::to_vec(&entries)
                .map_err(std::io::Error::other)
                .and_then(|b| std::fs::write(&tmp, b))
                .and_then(|()| std::fs::rename(&tmp, &self.members_file));
            if let Err(e) = written {
                tracing::warn!(file = %self.members_file.display(), error = %e, "keeping the cluster's nodes for a restart");
            }
        }
        changed
    }

    /// The cluster's nodes as the store lists them.
    pub fn members(&self) -> impl Iterator<Item = &RemoteNode> {
        self.members.values()
    }

    /// The speaker's table is exactly `routes` (its first dump).
    pub fn learned_all(&mut self, routes: impl IntoIterator<Item = (Ipv4Net, Ipv4Addr)>) {
        let now = Instant::now();
        let new: BTreeMap<Ipv4Net, Ipv4Addr> = routes.into_iter().collect();
        if self.settings.damping {
            for gone in self.learned.keys().filter(|k| !new.contains_key(k)) {
                self.damping.withdrawn(*gone, now);
            }
        }
        self.learned = new;
    }

    /// A route learned or changed.
    pub fn learned_put(&mut self, net: Ipv4Net, next_hop: Ipv4Addr) {
        self.learned.insert(net, next_hop);
    }

    /// A route withdrawn.
    pub fn learned_removed(&mut self, net: Ipv4Net) {
        if self.learned.remove(&net).is_some() && self.settings.damping {
            self.damping.withdrawn(net, Instant::now());
        }
    }

    /// Routes learned (whether or not suppressed).
    pub fn learned(&self) -> usize {
        self.learned.len()
    }

    /// Prefixes held out of the datapath by damping now.
    pub fn suppressed(&self) -> usize {
        self.damping.suppressed(Instant::now())
    }

    /// Suppressions so far.
    pub fn suppressions(&self) -> u64 {
        self.damping.suppressions
    }

    /// When a suppressed prefix becomes usable again.
    pub fn next_reuse(&self) -> Option<Instant> {
        self.damping.next_reuse(Instant::now())
    }

    /// What the datapath's ROUTES should hold now: every learned,
    /// unsuppressed prefix toward its next hop (a member's VTEP when the
    /// next hop is a node of the cluster, else the derived one).
    pub fn routes(&mut self) -> Vec<RemoteNode> {
        let now = Instant::now();
        let by_ip: BTreeMap<Ipv4Addr, &RemoteNode> =
            self.members.values().map(|m| (m.node_ip, m)).collect();
        let mut out = Vec::with_capacity(self.learned.len());
        for (net, hop) in &self.learned {
            if self.settings.damping && !self.damping.usable(*net, now) {
                continue;
            }
            let member = by_ip.get(hop);
            out.push(RemoteNode {
                subnet: *net,
                node_ip: *hop,
                vtep_mac: member
                    .map_or_else(|| crate::cluster::node::vtep_mac_for(*hop), |m| m.vtep_mac),
                vni: member.map_or(self.default_vni, |m| m.vni),
            });
        }
        out
    }

    /// Polls the speaker's sessions: restarts a dead speaker (in recovery:
    /// peers and the kernel table keep the routes) and logs every session
    /// whose state changed. Returns the sessions now.
    pub fn poll(&mut self) -> Result<Vec<SessionState>, BirdError> {
        if !self.bird.alive() {
            tracing::warn!(
                "BGP speaker not answering: starting it again in graceful restart recovery"
            );
            self.restarts += 1;
            self.bird.write_config(&self.render())?;
            self.bird.start(self.settings.graceful_restart > 0)?;
        }
        let sessions = self.bird.sessions()?;
        for s in &sessions {
            let state = format!("{} {}", s.state, s.bgp_state);
            let old = self.seen.insert(s.name.clone(), state.clone());
            if old.as_deref() != Some(state.as_str()) {
                *self.changes.entry(s.name.clone()).or_default() += 1;
                tracing::info!(
                    session = %s.name,
                    neighbor = ?s.neighbor,
                    from = old.as_deref().unwrap_or("-"),
                    to = %state,
                    "BGP session changed"
                );
            }
        }
        self.seen
            .retain(|name, _| sessions.iter().any(|s| &s.name == name));
        Ok(sessions)
    }
}
