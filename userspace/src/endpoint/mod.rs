//! Pod attachments ("endpoints") and their leases: plumbing a pod into the node
//! and removing it again, with rollback of every step on failure.
//!
//! The endpoint record *is* the lease: one JSON file per attachment in
//! `<state_dir>/endpoints/<host veth>.json` (0600 in a 0700 dir), holding
//! container ID, ifname, netns, address, MACs, state (`pending`/`ready`), pod
//! identity, port mappings, bandwidth, routes.
//!
//! - The record is written `pending` before anything is plumbed (a new file
//!   renamed into place) — from there on a crash leaves an owner record that
//!   start-up reconciliation rolls back — and rewritten `ready` at the end (in
//!   place: one write of less than a page at offset 0, padded with spaces to
//!   the old length — a rename over the old file costs ~0.3 ms here because
//!   ext4's `auto_da_alloc` starts writeback of the new file).
//! - Neither is fsync'ed, deliberately (an fsync per ADD cost ~1 ms): a record
//!   must survive a crash of the agent, which the page cache guarantees (a
//!   killed process cannot tear a sub-page write), but not a crash of the
//!   machine, which ends the veth, the namespace and the pod the record
//!   describes — start-up reconciliation then releases every record whose veth
//!   is gone. In-place rewrites happen only when the old and the new record
//!   both fit in one page, otherwise the record is replaced by a rename (found
//!   by fuzzing: a rewrite over a record larger than a page left the old tail
//!   behind). See `crate::store`.
//! - An agent killed between the ready record and its answer leaves a ready
//!   lease whose ADD the runtime saw fail (code 11): it is kept (its veth is
//!   live and complete) until the runtime's DEL for that failed ADD, which the
//!   spec requires; the kill-mid-storm test checks exactly that.
//!
//! Here: the records ([`Endpoints`]) and their errors. ADD, DEL, CHECK and GC
//! are in `lifecycle`, the host side of ADD with its rollback in `plumbing`,
//! the pod side in `pod`, hostPorts in `hostports`, reconciliation in
//! `reconcile`, address choice in [`ipam`].

pub mod bandwidth;
mod hostports;
pub mod ipam;
mod lifecycle;
mod plumbing;
mod pod;
mod reconcile;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use ipnet::Ipv4Net;
use rivet_api::{ApiError, Endpoint, ErrorKind, PoolStatus};

pub use self::{
    hostports::hostport_entries,
    plumbing::{delete_veth, pod_mac_for},
};
use self::{
    ipam::{Ipam, IpamError},
    pod::SpareSlot,
};
use crate::{
    datapath::{AttachMode, Datapath, DatapathError},
    netlink::{NetlinkError, batch::SyncNetlink, netns::NetnsError},
    store::{RecordDir, StoreError},
};

/// Why an endpoint operation failed.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// Invalid request values.
    #[error("{0}")]
    BadRequest(String),
    /// Conflicts with existing state.
    #[error("{0}")]
    Conflict(String),
    /// No address left.
    #[error("{0}")]
    Exhausted(String),
    /// CHECK found a resource missing or wrong; the message names it.
    #[error("{0}")]
    Missing(String),
    /// Network namespace problem.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// Netlink failure.
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    /// Map or program failure.
    #[error(transparent)]
    Datapath(#[from] DatapathError),
    /// Persisting the record failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A fault injected for tests (rivetd `--test-fault-add-at`).
    #[error("injected failure at step {0}")]
    Injected(String),
    /// Something else in the plumbing.
    #[error("{0}")]
    Other(String),
}

impl From<IpamError> for EndpointError {
    fn from(e: IpamError) -> Self {
        match e {
            IpamError::Exhausted(_) => EndpointError::Exhausted(e.to_string()),
            IpamError::InUse { .. } => EndpointError::Conflict(e.to_string()),
            other => EndpointError::BadRequest(other.to_string()),
        }
    }
}

impl From<EndpointError> for ApiError {
    fn from(e: EndpointError) -> Self {
        let kind = match &e {
            EndpointError::BadRequest(_) => ErrorKind::BadRequest,
            EndpointError::Conflict(_) => ErrorKind::Conflict,
            EndpointError::Exhausted(_)
            | EndpointError::Datapath(crate::datapath::DatapathError::MapFull { .. }) => {
                ErrorKind::Exhausted
            }
            EndpointError::Missing(_) => ErrorKind::Missing,
            EndpointError::Netns(NetnsError::NotFound { .. }) => ErrorKind::NotFound,
            EndpointError::Netns(_) => ErrorKind::BadRequest,
            _ => ErrorKind::Internal,
        };
        ApiError::new(kind, e.to_string())
    }
}

// Test only: chosen with rivetd's hidden `--test-fault-add-at` (see
// `AgentConfig::fail_add_at`), injected here.
pub use crate::config::FAULT_STEPS;

pub use rivet_api::host_ifname;

/// Container IDs as libcni validates them ([`rivet_api::CNI_ID_PATTERN`],
/// the plugin's rule too).
pub fn validate_container_id(id: &str) -> Result<(), String> {
    rivet_api::check_cni_id("container ID", id)
}

/// A CNI network name as the spec allows it ([`rivet_api::CNI_ID_PATTERN`]).
pub fn validate_network_name(name: &str) -> Result<(), String> {
    rivet_api::check_cni_id("network name", name)
}

/// Node settings the endpoint manager needs.
#[derive(Debug, Clone)]
pub struct EndpointSettings {
    /// Pod CIDR of the node.
    pub pod_cidr: Ipv4Net,
    /// Pods' gateway.
    pub gateway: Ipv4Addr,
    /// Pod MTU.
    pub mtu: u32,
    /// How `from_pod` attaches to pod veths.
    pub attach: AttachMode,
    /// Test hook: fail ADD at this step (one of [`FAULT_STEPS`]).
    pub fail_at: Option<String>,
    /// Ports no hostPort may use: the NAT source range (masquerade on) and
    /// the VXLAN port (UDP).
    pub reserved_ports: ReservedPorts,
}

/// The node's endpoints: records on disk mirrored in memory.
pub struct Endpoints {
    settings: EndpointSettings,
    store: RecordDir,
    by_ref: BTreeMap<(String, String), Endpoint>,
    ipam: Ipam,
    /// Blocking netlink in the agent's namespace, for the batched steps of
    /// ADD (used under the state lock only).
    sync_nl: SyncNetlink,
    /// The next ADD's pod side thread, started ahead.
    spare: SpareSlot,
    /// Bumped by every change to records, veths or drains: a link dump taken
    /// at the same generation is still true (see [`Endpoints::reconcile`]).
    generation: u64,
    /// Addresses seen live on the node that are not pods of ours (node
    /// addresses, host routes through other devices): never handed out.
    foreign: HashSet<Ipv4Addr>,
    /// Deleted attachments whose veth is still being removed in the
    /// background: their address stays taken until the veth (and its /32
    /// route) is gone.
    draining: BTreeMap<Ipv4Addr, Drain>,
    /// Records that did not parse at start, by key (the host veth name):
    /// rebuilt from the kernel maps and the live veth at the first
    /// reconciliation.
    unreadable: BTreeMap<String, PathBuf>,
}

/// A veth to delete after DEL has answered (the kernel's device
/// unregistration waits for RCU: tens of milliseconds nobody needs to wait
/// for).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drain {
    /// The pod address it held.
    pub ip: Ipv4Addr,
    /// Host-side veth name.
    pub host: String,
    /// Its ifindex.
    pub index: u32,
}

/// Ports hostPorts must not take.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReservedPorts {
    /// NAT source ports (inclusive), if masquerading.
    pub nat: Option<(u16, u16)>,
    /// The VXLAN UDP port.
    pub vxlan_udp: u16,
}

/// Durations of the steps of one operation, for the debug log.
struct Timeline {
    last: std::time::Instant,
    steps: Vec<(&'static str, std::time::Duration)>,
}

impl Timeline {
    fn start() -> Self {
        Self {
            last: std::time::Instant::now(),
            steps: Vec::new(),
        }
    }

    fn mark(&mut self, step: &'static str) {
        let now = std::time::Instant::now();
        self.steps.push((step, now - self.last));
        self.last = now;
    }
}

impl std::fmt::Display for Timeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (step, d)) in self.steps.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{step}={:.2}ms", d.as_secs_f64() * 1e3)?;
        }
        Ok(())
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Endpoints {
    /// Loads the records from `state_dir/endpoints`.
    pub fn open(settings: EndpointSettings, state_dir: &Path) -> Result<Self, EndpointError> {
        let store = RecordDir::open(state_dir.join("endpoints"))?;
        let (records, bad) = store.load_all::<Endpoint>()?;
        let mut unreadable = BTreeMap::new();
        for path in bad {
            tracing::warn!(path = %path.display(), "unreadable endpoint record: rebuilt from the datapath and the live veth if they hold it");
            if let Some(key) = path.file_stem().and_then(|k| k.to_str()) {
                unreadable.insert(key.to_owned(), path.clone());
            }
        }
        let by_ref = records
            .into_iter()
            .map(|(_, ep)| ((ep.container_id.clone(), ep.ifname.clone()), ep))
            .collect();
        let ipam = Ipam::open(state_dir, settings.pod_cidr);
        let sync_nl = SyncNetlink::open()
            .map_err(|e| EndpointError::Other(format!("opening a netlink socket: {e}")))?;
        Ok(Self {
            settings,
            store,
            by_ref,
            ipam,
            sync_nl,
            spare: SpareSlot::default(),
            generation: 0,
            foreign: HashSet::new(),
            draining: BTreeMap::new(),
            unreadable,
        })
    }

    /// Node settings.
    pub fn settings(&self) -> &EndpointSettings {
        &self.settings
    }

    /// Every endpoint, sorted by IP.
    pub fn list(&self) -> Vec<Endpoint> {
        let mut v: Vec<Endpoint> = self.by_ref.values().cloned().collect();
        v.sort_by_key(|e| e.ip);
        v
    }

    /// Number of endpoints.
    pub fn len(&self) -> usize {
        self.by_ref.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.by_ref.is_empty()
    }

    /// Usage of the node's pod CIDR.
    pub fn pool(&self) -> PoolStatus {
        let cidr = self.ipam.pod_cidr();
        let used = self
            .by_ref
            .values()
            .filter(|e| cidr.contains(&e.ip))
            .map(|e| e.ip)
            .chain(self.foreign.iter().copied().filter(|ip| cidr.contains(ip)))
            .collect::<HashSet<_>>()
            .len() as u64;
        PoolStatus {
            size: self.ipam.pool_size(),
            used,
        }
    }

    /// Who holds `ip`, if anyone: a record, a map entry, or the node itself.
    fn owner_of(&self, ip: Ipv4Addr, dp: &Datapath) -> Option<String> {
        if let Some(e) = self.by_ref.values().find(|e| e.ip == ip) {
            return Some(format!("container {} ({})", e.container_id, e.ifname));
        }
        if self.foreign.contains(&ip) {
            return Some("the node (an address or host route seen live)".into());
        }
        if let Some(d) = self.draining.get(&ip) {
            return Some(format!("the veth {} being deleted", d.host));
        }
        if matches!(dp.endpoint(ip), Ok(Some(_))) {
            return Some("an entry of the endpoints map".into());
        }
        None
    }

    /// Marks the end of an ADD step: records its duration and injects the
    /// test fault if one is configured for it.
    fn step(&self, step: &'static str, timeline: &mut Timeline) -> Result<(), EndpointError> {
        timeline.mark(step);
        if self.settings.fail_at.as_deref() == Some(step) {
            return Err(EndpointError::Injected(step.to_owned()));
        }
        Ok(())
    }

    /// Brings kernel state in line with the records:
    /// - pending records (an ADD interrupted by a crash; ADDs are serialized
    ///   with reconciliation, so none is in flight) are rolled back;
    /// - endpoints whose veth is gone are removed;
    /// - map entries and link pins without a record are removed;
    /// - every live endpoint has its map entry and program (with `reattach`,
    ///   programs are swapped to the freshly loaded ones);
    /// - addresses seen live on the node are remembered as taken.
    ///
    /// `keep_links` names interfaces whose pins are not endpoints (uplink).
    /// See the `generation` field.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

/// How reconciliation treats the programs on pod veths.
#[derive(Debug, Clone, Copy)]
pub enum Reattach<'a> {
    /// Attach on every pod veth (start-up: the programs were just loaded).
    All,
    /// Attach where missing. In tc mode presence comes from a probe made
    /// *without* the state lock ([`Endpoints::tc_probe_targets`], one
    /// netlink dump per veth: ~0.3 ms each, which under the lock stalled
    /// ADDs for 30 ms at 100 pods); veths not probed are left alone.
    Missing(&'a HashMap<u32, bool>),
}

/// Names rivet gives host-side veths: `rv` + 13 lowercase hex digits.
pub fn is_rivet_veth(name: &str) -> bool {
    name.len() == 15
        && name.starts_with("rv")
        && name[2..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::validate_ifname;

    #[test]
    fn host_ifnames_are_stable_and_fit() {
        let a = host_ifname("abc", "eth0");
        assert_eq!(a.len(), 15);
        assert!(a.starts_with("rv"));
        assert!(is_rivet_veth(&a));
        assert_eq!(a, host_ifname("abc", "eth0"));
        assert_ne!(a, host_ifname("abc", "eth1"));
        assert_ne!(a, host_ifname("ab", "ceth0"));
        assert!(validate_ifname(&a).is_ok());
        assert!(!is_rivet_veth("rvsomething"));
        assert!(!is_rivet_veth("eth0"));
    }

    #[test]
    fn container_ids() {
        assert!(validate_container_id("a1_b.c-d").is_ok());
        assert!(validate_container_id("ABC123").is_ok());
        for bad in ["", "-a", ".a", "a/b", "a b", "a\nb", "ä"] {
            assert!(validate_container_id(bad).is_err(), "{bad:?}");
        }
    }
}
