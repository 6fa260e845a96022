//! What the agent reports about itself: its status (`rivetctl status`,
//! CNI STATUS, readiness, metrics) and the latency of the requests it
//! answered.
//!
//! Status is published, not computed per request: the agent keeps an
//! [`Arc`] of the last [`Published`] status, which readers copy (a pointer,
//! under a lock held for just that). [`Agent::publish_status`] refreshes
//! it — the records right after every change (a short lock of the node
//! state), everything 100 ms after a change and every second: what needs the node state is copied under a
//! short lock, the netlink and map reads (attachments, hostPort count,
//! map sizes) run after it is released. What changes without a request
//! (uptime, store state, readiness, last error, NAT figures, counters) is
//! read when the status is.

use std::{
    collections::HashMap,
    fmt,
    sync::Arc,
    time::{Duration, Instant},
};

use prometheus_client::metrics::{
    family::Family,
    histogram::{Histogram, exponential_buckets},
};
use rivet_api::{AgentStatus, ApiError, Attachment, CounterValue, ErrorKind, PoolStatus};
use rivet_common::{map_names, program_names};

use super::{Agent, NodeState};
use crate::cluster::StoreReport;
use crate::datapath::{self, AttachMode, DatapathError, pins::PinLayout};

/// How often the whole status is gathered again.
pub const STATUS_INTERVAL: Duration = Duration::from_secs(1);
/// How soon after a change the whole status (attachments of new pods) is
/// gathered again: changes within it share one gathering.
pub const CHANGE_GATHER: Duration = Duration::from_millis(100);

/// The cluster store as the agent last heard of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreState {
    /// No cluster store: a single node.
    Standalone,
    /// Connecting to the store, not yet in sync.
    Connecting,
    /// In sync; `peers` other nodes.
    Synced {
        /// Other nodes the store lists.
        peers: usize,
    },
    /// The store was lost at `since` and is being reconnected.
    Lost {
        /// When it was lost (the first report of the outage).
        since: Instant,
        /// The store's reason.
        reason: String,
    },
}

impl StoreState {
    /// The cluster's nodes are as the store says.
    pub fn is_synced(&self) -> bool {
        matches!(self, Self::Synced { .. })
    }

    /// The state after the store's source reported `report` (an outage
    /// keeps the time it began).
    pub fn after(&self, report: StoreReport) -> Self {
        match report {
            StoreReport::Synced { peers } => Self::Synced { peers },
            StoreReport::Lost { reason } => Self::Lost {
                since: match self {
                    Self::Lost { since, .. } => *since,
                    _ => Instant::now(),
                },
                reason,
            },
        }
    }
}

impl fmt::Display for StoreState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Standalone => f.write_str("single-node"),
            Self::Connecting => f.write_str("connecting"),
            Self::Synced { peers } => write!(f, "synced ({peers} peers)"),
            Self::Lost { since, reason } => write!(
                f,
                "reconnecting ({reason}) for {}s",
                since.elapsed().as_secs()
            ),
        }
    }
}

/// The status as last gathered.
#[derive(Debug, Clone)]
pub struct Published {
    /// The status; the fields that change without a request are filled in
    /// by [`Agent::status`].
    pub status: AgentStatus,
    /// Why the datapath is not ready (no program on the uplink), if so.
    pub not_attached: Option<String>,
    /// When it was gathered.
    pub at: Instant,
    /// The changes (endpoint ADD/DEL, GC, node updates) it includes: a
    /// status request made after a change gets a gathering that includes
    /// it ([`Agent::current_status`]).
    pub through: u64,
}

/// What the node state says, copied under a short lock.
struct Records {
    endpoints: usize,
    pool: PoolStatus,
    nodes: usize,
    /// Entries in SVC_FRONTENDS and SVC_BACKENDS.
    services: (usize, usize),
    /// Pod network namespaces marked for the socket hooks (SOCK_NETNS).
    pod_netns: usize,
}

impl Records {
    fn of(state: &NodeState) -> Self {
        Self {
            endpoints: state.endpoints.len(),
            pool: state.endpoints.pool(),
            nodes: state.cluster.len(),
            services: state.services.fill(),
            pod_netns: state
                .endpoints
                .list()
                .iter()
                .filter_map(|e| e.netns_cookie)
                .collect::<std::collections::HashSet<_>>()
                .len(),
        }
    }

    /// Writes them into `status` (with the map fill levels they make).
    fn apply(&self, status: &mut AgentStatus) {
        status.endpoints = self.endpoints;
        status.pool = self.pool;
        status.nodes = self.nodes;
        for m in &mut status.maps {
            match m.name.as_str() {
                map_names::ENDPOINTS => m.entries = self.endpoints as u64,
                map_names::HOSTPORTS | map_names::NAT => {}
                map_names::SVC_FRONTENDS => m.entries = self.services.0 as u64,
                map_names::SVC_BACKENDS => m.entries = self.services.1 as u64,
                map_names::SOCK_NETNS => m.entries = self.pod_netns as u64,
                map_names::ROUTES | map_names::PEERS => m.entries = self.nodes as u64,
                _ => {}
            }
        }
        status.warnings = map_warnings(&status.maps);
    }
}

impl Agent {
    /// The last published status (a pointer copy).
    pub fn published(&self) -> Arc<Published> {
        match self.published.read() {
            Ok(p) => Arc::clone(&p),
            Err(e) => Arc::clone(&e.into_inner()),
        }
    }

    /// Replaces the published status, unless it already includes later
    /// changes (two gatherings may finish out of order).
    fn publish(&self, p: Published) {
        let p = Arc::new(p);
        let mut slot = match self.published.write() {
            Ok(slot) => slot,
            Err(e) => e.into_inner(),
        };
        if p.through >= slot.through {
            *slot = p;
        }
    }

    /// The status as [`Agent::status`], including every change the agent
    /// has answered: when one happened since the last gathering, the
    /// status is gathered now (outside the node-state lock but for the
    /// copy it takes), so `rivetctl status` right after an ADD shows the
    /// new pod's attachment. `/metrics` and `/readyz` read the published
    /// status as it is.
    pub async fn current_status(&self) -> AgentStatus {
        let noted = self.changes.load(std::sync::atomic::Ordering::SeqCst);
        if self.published().through < noted
            && let Err(e) = self.refresh_status().await
        {
            tracing::warn!(error = %e, "gathering the status");
            self.note_error(format!("status: {e}"));
        }
        self.status()
    }

    /// The agent's status: the published one, with what changes without a
    /// request read now. Takes no lock of the node state.
    pub fn status(&self) -> AgentStatus {
        let p = self.published();
        let mut s = p.status.clone();
        let store = self.store_state();
        s.uptime_secs = self.started.elapsed().as_secs();
        s.store = self.cfg.store_text(&store);
        s.store_synced = !self.cfg.has_store() || store.is_synced();
        (s.ready, s.not_ready) = match self.not_ready(&p, &store) {
            Some(why) => (false, Some(why)),
            None => (true, None),
        };
        s.last_error = self.last_error();
        s.nat = self.nat_status();
        for m in &mut s.maps {
            if m.name == map_names::NAT {
                m.entries = s.nat.entries;
            }
        }
        s.warnings = map_warnings(&s.maps);
        s.warnings.extend(self.health_check_warnings());
        s.age_ms = u64::try_from(p.at.elapsed().as_millis()).unwrap_or(u64::MAX);
        s
    }

    /// Ready (`Ok`), or why not: the uplink (if any) runs its program and,
    /// in cluster mode, the store is in sync. Takes no lock of the node
    /// state.
    pub fn readiness(&self) -> Result<(), String> {
        match self.not_ready(&self.published(), &self.store_state()) {
            None => Ok(()),
            Some(why) => Err(why),
        }
    }

    fn not_ready(&self, p: &Published, store: &StoreState) -> Option<String> {
        if let Some(why) = &p.not_attached {
            return Some(why.clone());
        }
        if self.cfg.has_store() && !store.is_synced() {
            return Some(self.cfg.store_text(store));
        }
        if let Some(why) = self.kube_not_synced() {
            return Some(why);
        }
        None
    }

    /// The datapath counters, read from the pinned map (no lock of the
    /// node state).
    /// New flows NetworkPolicy allowed since the maps were created:
    /// (ingress, egress).
    pub fn policy_allowed(&self) -> Result<(u64, u64), ApiError> {
        let pin = PinLayout::new(&self.cfg.pin_dir).map(map_names::POLICY_STATS);
        let err = |e: aya::maps::MapError| {
            ApiError::new(
                ErrorKind::Internal,
                format!("map {}: {e}", map_names::POLICY_STATS),
            )
        };
        let data = aya::maps::MapData::from_pin(&pin).map_err(err)?;
        let stats: aya::maps::PerCpuArray<_, u64> =
            aya::maps::PerCpuArray::try_from(aya::maps::Map::PerCpuArray(data)).map_err(err)?;
        let sum = |slot: u32| -> Result<u64, ApiError> {
            Ok(stats.get(&slot, 0).map_err(err)?.iter().sum())
        };
        Ok((
            sum(rivet_common::policy_stat::ALLOWED_INGRESS)?,
            sum(rivet_common::policy_stat::ALLOWED_EGRESS)?,
        ))
    }

    /// The shaping figures of every limited pod (the node state is held
    /// only to list them; the qdiscs are read after).
    pub async fn bandwidth_figures(&self) -> Vec<rivet_api::BandwidthFigures> {
        let limited = {
            let state = self.lock().await;
            state.endpoints.limited(&state.dp)
        };
        if limited.is_empty() {
            return Vec::new();
        }
        tokio::task::spawn_blocking(move || crate::endpoint::bandwidth::figures(&limited))
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "gathering the shaping figures");
                Vec::new()
            })
    }

    pub fn counters(&self) -> Result<Vec<CounterValue>, ApiError> {
        let pin = PinLayout::new(&self.cfg.pin_dir).map(map_names::STATS);
        let err = |e: aya::maps::MapError| {
            ApiError::new(
                ErrorKind::Internal,
                format!("map {}: {e}", map_names::STATS),
            )
        };
        let data = aya::maps::MapData::from_pin(&pin).map_err(err)?;
        let stats: aya::maps::PerCpuArray<_, rivet_common::StatsEntry> =
            aya::maps::PerCpuArray::try_from(aya::maps::Map::PerCpuArray(data)).map_err(err)?;
        rivet_common::Counter::ALL
            .iter()
            .map(|c| {
                let per_cpu = stats.get(&c.index(), 0).map_err(err)?;
                Ok(CounterValue {
                    name: c.name().to_owned(),
                    drop: c.is_drop(),
                    packets: per_cpu.iter().map(|v| v.packets).sum(),
                    bytes: per_cpu.iter().map(|v| v.bytes).sum(),
                })
            })
            .collect()
    }

    /// Says that the records changed: the refresher publishes them.
    pub fn note_change(&self) {
        self.changes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.changed.notify_one();
    }

    /// Keeps the published status current until the agent stops: the
    /// records right after each change, everything [`CHANGE_GATHER`] after
    /// it (changes meanwhile wait for the same gathering) and every
    /// [`STATUS_INTERVAL`].
    pub async fn publish_status(self: Arc<Self>) {
        let mut tick = tokio::time::interval(STATUS_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut gather_at: Option<tokio::time::Instant> = None;
        loop {
            let gather_due = async {
                match gather_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tick.tick() => {}
                () = gather_due => {}
                () = self.changed.notified() => {
                    self.refresh_records().await;
                    gather_at.get_or_insert_with(|| tokio::time::Instant::now() + CHANGE_GATHER);
                    continue;
                }
            }
            gather_at = None;
            if let Err(e) = self.refresh_status().await {
                tracing::warn!(error = %e, "gathering the status");
                self.note_error(format!("status: {e}"));
            }
            tick.reset();
        }
    }

    /// Publishes the records (endpoints, pool, nodes) into the last status.
    pub async fn refresh_records(&self) {
        let records = Records::of(&*self.state.lock().await);
        let p = self.published();
        let mut next = (*p).clone();
        records.apply(&mut next.status);
        self.publish(next);
    }

    /// Gathers the whole status and publishes it. The node state is locked
    /// only to copy what it holds; netlink and map reads run after.
    pub async fn refresh_status(&self) -> Result<(), ApiError> {
        // Every change noted before the copy below is in what it copies.
        let through = self.changes.load(std::sync::atomic::Ordering::SeqCst);
        let layout = PinLayout::new(&self.cfg.pin_dir);
        let tc = self.cfg.pod_attach == AttachMode::Tc;
        let (records, probe, from_pod, sizes, object) = {
            let state = self.state.lock().await;
            let records = Records::of(&state);
            let probe: Vec<(String, u32)> = if tc {
                state
                    .endpoints
                    .list()
                    .into_iter()
                    .map(|ep| (ep.host_ifname, ep.host_ifindex))
                    .collect()
            } else {
                Vec::new()
            };
            let from_pod = if tc {
                Some(
                    state
                        .dp
                        .program_id(program_names::FROM_POD)
                        .map_err(internal)?,
                )
            } else {
                None
            };
            let sizes = datapath::SIZED_MAPS
                .iter()
                .map(|(name, _)| state.dp.map_size(name))
                .collect::<Result<Vec<_>, _>>()
                .map_err(internal)?;
            let o = state.dp.object();
            let object = rivet_api::EbpfObject {
                source: o.source.clone(),
                stamp: o.stamp.clone(),
                hash: o.hash.clone(),
                bytes: o.size as u64,
            };
            (records, probe, from_pod, sizes, object)
        };
        let mut attachments: Vec<Attachment> = datapath::links(&layout)
            .map_err(internal)?
            .into_iter()
            .map(|l| Attachment {
                interface: l.interface,
                program: l.program,
                program_id: l.program_id,
                link_id: l.link_id,
                pin: l.pin.display().to_string(),
            })
            .collect();
        if let Some(ours) = from_pod {
            for (interface, index) in probe {
                // A veth gone meanwhile (ENODEV) is no attachment.
                let Ok(ids) = self.nl.tc_bpf_prog_ids(index, true).await else {
                    continue;
                };
                for id in ids {
                    attachments.push(Attachment {
                        interface: interface.clone(),
                        program: if id == ours {
                            "from_pod".into()
                        } else {
                            "(not rivet's current program)".into()
                        },
                        program_id: id,
                        link_id: 0,
                        pin: format!("tc ingress prio {}", datapath::TC_PRIORITY),
                    });
                }
            }
            attachments.sort_by(|a, b| a.interface.cmp(&b.interface));
        }
        let not_attached = self.uplink_missing(&attachments);
        let hostports = crate::nat::hostport_count(&layout.map(map_names::HOSTPORTS))
            .map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))?;
        let nat = self.nat_status();
        let refused: HashMap<&str, u64> = datapath::map_full_counts().into_iter().collect();
        let maps = datapath::SIZED_MAPS
            .iter()
            .zip(sizes)
            .map(
                |((name, key), (capacity, memory_bytes))| rivet_api::MapUsage {
                    name: (*name).to_owned(),
                    entries: match *name {
                        map_names::HOSTPORTS => hostports,
                        map_names::NAT => nat.entries,
                        _ => 0,
                    },
                    capacity: u64::from(capacity),
                    memory_bytes,
                    full_refusals: refused.get(name).copied().unwrap_or(0),
                    config_key: (*key).to_owned(),
                },
            )
            .collect();
        let mut status = base_status(&self.cfg, self.pod_cidr, self.mtu, self.node_ip);
        status.attachments = attachments;
        status.nat = nat;
        status.maps = maps;
        status.ebpf = object;
        records.apply(&mut status);
        self.publish(Published {
            status,
            not_attached,
            at: Instant::now(),
            through,
        });
        Ok(())
    }

    /// Why the uplink is not ready: it has no rivet program.
    fn uplink_missing(&self, attachments: &[Attachment]) -> Option<String> {
        let (Some(uplink), Some(_)) = (&self.cfg.uplink, self.node_ip) else {
            return None;
        };
        (!attachments
            .iter()
            .any(|a| &a.interface == uplink && a.program == program_names::FROM_UPLINK))
        .then(|| format!("no rivet program on the uplink {uplink}"))
    }
}

/// A status with what the configuration says and nothing gathered.
pub fn base_status(
    cfg: &crate::config::AgentConfig,
    pod_cidr: ipnet::Ipv4Net,
    mtu: u32,
    node_ip: Option<std::net::Ipv4Addr>,
) -> AgentStatus {
    AgentStatus {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        node_name: cfg.node_name.clone(),
        uptime_secs: 0,
        pod_cidr: pod_cidr.to_string(),
        gateway: cfg.gateway,
        mtu,
        pin_dir: cfg.pin_dir.display().to_string(),
        endpoints: 0,
        attachments: Vec::new(),
        pool: PoolStatus { size: 0, used: 0 },
        mode: cfg.mode.as_str().to_owned(),
        cluster_cidr: cfg.cluster_cidr.to_string(),
        node_ip,
        nodes: 0,
        store: String::new(),
        store_synced: false,
        nat: rivet_api::NatStatus::default(),
        ready: false,
        not_ready: None,
        last_error: None,
        maps: Vec::new(),
        warnings: Vec::new(),
        ebpf: rivet_api::EbpfObject::default(),
        age_ms: 0,
    }
}

fn internal(e: DatapathError) -> ApiError {
    ApiError::new(ErrorKind::Internal, e.to_string())
}

/// What an operator should act on: a map at ≥ 90 % of its capacity, or
/// one that refused entries (a pod ADD failed, a node's routes are missing).
pub fn map_warnings(maps: &[rivet_api::MapUsage]) -> Vec<String> {
    let mut out = Vec::new();
    for m in maps {
        if m.full_refusals > 0 {
            out.push(format!(
                "map {} is full: {} entries refused since the agent started; raise `{}` (now {})",
                m.name, m.full_refusals, m.config_key, m.capacity
            ));
        } else if m.capacity > 0 && m.entries * 10 >= m.capacity * 9 {
            out.push(format!(
                "map {} is {}% full ({} of {}); raise `{}`",
                m.name,
                m.entries * 100 / m.capacity,
                m.entries,
                m.capacity,
                m.config_key
            ));
        }
    }
    out
}

/// Labels of the request-latency histograms.
pub type VerbLabels = Vec<(String, String)>;
/// Histogram family constructor.
type NewHistogram = fn() -> Histogram;

/// Latency of the agent's API requests, by the CNI verb they serve.
#[derive(Clone, Debug)]
pub struct RequestMetrics {
    by_verb: Family<VerbLabels, Histogram, NewHistogram>,
}

impl Default for RequestMetrics {
    fn default() -> Self {
        Self {
            // 0.25 ms … 4 s.
            by_verb: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.000_25, 2.0, 15))
            }),
        }
    }
}

impl RequestMetrics {
    /// Records one request of kind `verb` that took `took`.
    pub fn observe(&self, verb: &str, took: Duration) {
        self.by_verb
            .get_or_create(&vec![("verb".to_owned(), verb.to_owned())])
            .observe(took.as_secs_f64());
    }

    /// The histograms, one per verb (what the metrics endpoint registers).
    pub fn histograms(&self) -> Family<VerbLabels, Histogram, NewHistogram> {
        self.by_verb.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::{StoreReport, StoreState};

    #[test]
    fn store_reports_become_states() {
        let s = StoreState::Connecting.after(StoreReport::Synced { peers: 3 });
        assert_eq!(s, StoreState::Synced { peers: 3 });
        assert!(s.is_synced());
        assert_eq!(s.to_string(), "synced (3 peers)");
        let lost = s.after(StoreReport::Lost {
            reason: "connection refused".into(),
        });
        let StoreState::Lost { since, reason } = &lost else {
            panic!("{lost:?}");
        };
        assert_eq!(reason, "connection refused");
        assert!(!lost.is_synced());
        // A second report of the same outage keeps its start.
        let again = lost.after(StoreReport::Lost {
            reason: "timed out".into(),
        });
        assert!(matches!(&again, StoreState::Lost { since: s2, .. } if s2 == since));
        assert!(
            again
                .to_string()
                .starts_with("reconnecting (timed out) for ")
        );
        assert_eq!(StoreState::Standalone.to_string(), "single-node");
    }
}
