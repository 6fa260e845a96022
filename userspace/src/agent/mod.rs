//! The node agent: owns the datapath of one node and keeps kernel state
//! reconciled with its records; what it reports about itself is in [`status`].
//! The server module serves it.
//!
//! Start-up (`rivetd`):
//! 1. Config resolved and validated; `--netns` entered on the main thread
//!    before any other thread exists (tokio workers inherit it).
//! 2. Preflight: bpffs present, uplink exists — nothing is created before these
//!    pass.
//! 3. Pin directory created and locked (`datapath::pins`).
//! 4. The object (embedded, or `--ebpf-object`) checked against this build's
//!    map layouts, then loaded with every map pinned by path (existing pins
//!    reused, so entries survive); programs loaded and re-pinned
//!    (`datapath::object`).
//! 5. Config map and local addresses written; `rivet_host`/`rivet_net`
//!    (cluster-CIDR route), forwarding, `from_host`, `rivet_vxlan` (vxlan and
//!    hybrid modes) made idempotently (`cluster::node`); the uplink program
//!    attached. The remote nodes are read back from the pinned ROUTES/PEERS (so
//!    a restart forwards on), then, in cluster mode, the etcd registration and
//!    watch start. The endpoint cache is rebuilt from `ENDPOINTS`.
//! 6. Endpoint records are loaded and reconciled (`endpoint::reconcile`):
//!    pending records (an ADD interrupted by a crash) and records whose veth is
//!    gone are released; missing map entries are restored; every endpoint's
//!    attachment gets the new program atomically; map entries, link pins and
//!    `rv…` veths without a record are removed.
//! 7. The API socket is bound (parent dir 0700, socket 0600; with
//!    `socket_group` the socket is 0660 and its directory 0710, both owned by
//!    that group).
//!
//! Restart: links, filters and maps live in the kernel independently of the
//! process, so the datapath forwards while no agent runs (`rivetd load` exits
//! right after attaching). The restart test keeps a 400-packet ping flood, a
//! TCP stream and a 10 ms attachment poller running across a SIGTERM restart
//! and a SIGKILL restart, in both attach modes: 0 lost, same attachments, new
//! program IDs, never a veth without its program.

mod background;
mod bgp;
pub mod heap;
mod kube;
mod objects;
mod policy;
mod services;
pub mod status;

use std::{
    collections::{HashMap, HashSet},
    net::Ipv4Addr,
    sync::Arc,
    time::{Duration, Instant},
};

use rivet_common::{NodeConfig, config_flags, ipv4_key, map_names, program_names};
use tokio::sync::{Mutex, MutexGuard};

pub use self::kube::POD_WAIT as KUBE_POD_WAIT;
pub use self::status::{Published, RequestMetrics, STATUS_INTERVAL, StoreState, map_warnings};

use crate::{
    cluster::{Cluster, ClusterError, RemoteNode, StoreReport, node},
    config::{AgentConfig, Mode},
    datapath::{
        Datapath, DatapathError,
        pins::{self, Hook, PinError, PinLayout, PinLock},
    },
    endpoint::{self, EndpointError, EndpointSettings, Endpoints, Reattach},
    netlink::{ConnectError, Netlink, NetlinkError},
    objects::ObjectStore,
    store::{self, StoreError},
};

/// The object store's directory in the state directory.
pub const OBJECTS_DIR: &str = "objects";

/// How often the agent re-checks kernel state against its records.
pub const RECONCILE_INTERVAL: Duration = Duration::from_secs(5);

/// Agent start-up and run-time errors.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// bpffs or pin directory problem.
    #[error(transparent)]
    Pins(#[from] PinError),
    /// Datapath problem.
    #[error(transparent)]
    Datapath(#[from] DatapathError),
    /// Netlink problem.
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    /// Netlink socket problem.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// Masquerade problem.
    #[error(transparent)]
    Nat(#[from] crate::nat::NatError),
    /// Service maps problem.
    #[error(transparent)]
    Services(#[from] crate::services::ServiceError),
    /// Endpoint reconciliation problem.
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    /// State directory problem.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The configured uplink does not exist.
    #[error("uplink interface {0} does not exist in the node's network namespace")]
    NoUplink(String),
    /// Node plumbing failed.
    #[error(transparent)]
    Node(#[from] node::NodeError),
    /// Remote node routes could not be written.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// The cluster store failed.
    #[error(transparent)]
    Etcd(#[from] crate::cluster::etcd::EtcdError),
    /// The Kubernetes API cannot be used.
    #[error(transparent)]
    Kube(#[from] crate::cluster::kubernetes::KubeError),
    /// Cluster mode needs the node's address.
    #[error("cluster mode (etcd or kubernetes) needs an uplink with an IPv4 address")]
    NoNodeIp,
    /// `bgp` mode needs the uplink and its address (router ID, sessions).
    #[error("bgp mode needs an uplink with an IPv4 address")]
    BgpNoUplink,
    /// The BGP speaker could not be started or configured.
    #[error("BGP speaker: {0}")]
    Bgp(#[from] crate::cluster::bgp::bird::BirdError),
    /// The socket could not be served.
    #[error("API socket {path}: {source}")]
    Socket {
        /// Path.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The metrics address could not be bound (`metrics_addr`).
    #[error("metrics_addr {addr}: {source}")]
    Metrics {
        /// Address.
        addr: std::net::SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
}

/// Everything mutable, behind one lock: endpoint changes are serialized.
pub struct NodeState {
    /// The loaded datapath.
    pub dp: Datapath,
    /// Endpoint records.
    pub endpoints: Endpoints,
    /// The node's own IPv4 addresses.
    pub local: HashSet<Ipv4Addr>,
    /// The other nodes.
    pub cluster: Cluster,
    /// The Kubernetes objects (`objects/` in the state directory).
    pub objects: ObjectStore,
    /// The Services this node serves (the Service maps).
    pub services: crate::services::Services,
    /// The NetworkPolicies of this node's pods (the policy maps).
    pub policies: crate::policy::Policies,
    /// `bgp` mode: the speaker, its peers and what it learned.
    pub bgp: Option<crate::cluster::bgp::Bgp>,
}

/// A running agent.
pub struct Agent {
    cfg: AgentConfig,
    nl: Netlink,
    state: Mutex<NodeState>,
    started: Instant,
    mtu: u32,
    pod_cidr: ipnet::Ipv4Net,
    node_ip: Option<Ipv4Addr>,
    store_state: std::sync::Mutex<StoreState>,
    /// The last gathered status (see [`status`]).
    published: std::sync::RwLock<Arc<Published>>,
    /// Records changed since the status was published.
    changed: tokio::sync::Notify,
    /// Changes noted so far (see [`Published::through`]).
    changes: std::sync::atomic::AtomicU64,
    nat_stats: std::sync::Mutex<crate::nat::NatStats>,
    requests: RequestMetrics,
    last_error: std::sync::Mutex<Option<(Instant, String)>>,
    events: Arc<crate::events::Events>,
    /// The healthCheckNodePorts to serve (`services.rs`).
    health: services::HealthPorts,
    /// The Kubernetes source's object watches (`kube.rs`).
    kube_objects: std::sync::Mutex<kube::KubeObjects>,
    /// Bumped after each commit of watched objects (an ADD waiting for
    /// its Pod object looks again).
    objects_changed: tokio::sync::watch::Sender<u64>,
    _lock: PinLock,
}

/// Checks what the configuration names before anything is created, so a
/// bad value leaves nothing half-made (no pins, no state).
pub async fn preflight(cfg: &AgentConfig) -> Result<(), AgentError> {
    pins::ensure_bpffs(&cfg.bpffs)?;
    crate::nat::check_port_range(&cfg.nat)?;
    if let Some(uplink) = &cfg.uplink {
        let nl = Netlink::connect()?;
        if nl.link_by_name(uplink).await?.is_none() {
            return Err(AgentError::NoUplink(uplink.clone()));
        }
    }
    Ok(())
}

/// The synchronous part of start-up, done before any thread exists:
/// bpffs, pin directory, lock, and loading the object with its pinned maps.
pub fn prepare(cfg: &AgentConfig) -> Result<(PinLock, Datapath), AgentError> {
    pins::ensure_bpffs(&cfg.bpffs)?;
    let layout = PinLayout::new(&cfg.pin_dir);
    layout.create()?;
    let lock = layout.lock()?;
    let dp = Datapath::load_from(&layout, &cfg.limits, &cfg.ebpf_object)?;
    Ok((lock, dp))
}

impl Agent {
    /// Configures the datapath (config map, local addresses, uplink program)
    /// and reconciles endpoints, swapping every attached program for the
    /// freshly loaded one.
    pub async fn start(
        cfg: AgentConfig,
        lock: PinLock,
        mut dp: Datapath,
        pod_cidr: ipnet::Ipv4Net,
    ) -> Result<Self, AgentError> {
        let nl = Netlink::connect()?;
        let addrs = nl.ipv4_addresses().await?;
        let uplink = match &cfg.uplink {
            Some(name) => Some(
                nl.link_by_name(name)
                    .await?
                    .ok_or_else(|| AgentError::NoUplink(name.clone()))?,
            ),
            None => None,
        };
        // Pods' MTU leaves room for the tunnel on the uplink.
        let uplink_mtu = uplink.as_ref().map_or(1500, |l| l.mtu);
        let mtu = cfg
            .mtu
            .unwrap_or_else(|| uplink_mtu.saturating_sub(cfg.overhead()));
        let uplink_addr = match &uplink {
            Some(l) => nl.addresses_of(l.index).await?.into_iter().next(),
            None => None,
        };
        let node_ip = uplink_addr.map(|(ip, _)| ip);
        let uplink_net =
            uplink_addr.and_then(|(ip, len)| ipnet::Ipv4Net::new(ip, len).ok().map(|n| n.trunc()));
        node::enable_forwarding()?;

        let local: HashSet<Ipv4Addr> = addrs.iter().map(|(_, ip)| *ip).collect();
        dp.set_local_addrs(&local.iter().copied().collect::<Vec<_>>())?;
        let mut config = NodeConfig {
            gateway: ipv4_key(cfg.gateway.octets()),
            node_ip: node_ip.map_or(0, |ip| ipv4_key(ip.octets())),
            pod_cidr: ipv4_key(pod_cidr.network().octets()),
            pod_prefix_len: u32::from(pod_cidr.prefix_len()),
            flags: config_flags::CONFIGURED,
            uplink_ifindex: uplink.as_ref().map_or(0, |l| l.index),
            host_ifindex: 0,
            vni: cfg.vni,
            vxlan_port: u32::from(cfg.vxlan_port),
            uplink_mtu,
            vtep_mac: node_ip.map_or([0; 6], node::vtep_mac_for),
            host_mac: [0; 6],
        };
        if let (Some(uplink), Some(node_ip)) = (&uplink, node_ip) {
            // The node's own way to remote pods, then the uplink program.
            let host = node::host_device(&nl, cfg.cluster_cidr, node_ip, mtu).await?;
            config.host_ifindex = host.index;
            config.host_mac = host.mac;
            dp.write_config(config)?;
            dp.attach(program_names::FROM_HOST, node::HOST_DEV, Hook::Egress)?;
            let vxlan = matches!(cfg.mode, Mode::Vxlan | Mode::Hybrid)
                || cfg
                    .bgp
                    .as_ref()
                    .is_some_and(|b| b.cross_subnet == crate::config::CrossSubnet::Vxlan);
            if vxlan && let Err(e) = node::vxlan_gro_device(&nl, cfg.vxlan_port).await {
                tracing::warn!(error = %e, "no idle vxlan device: VXLAN receive GRO depends on the NIC");
            }
            let link = dp.attach(program_names::FROM_UPLINK, &uplink.name, Hook::Ingress)?;
            tracing::info!(interface = %uplink.name, %node_ip, link_id = link.link_id, program_id = link.program_id, "uplink attached");
        } else {
            dp.write_config(config)?;
            if let Some(uplink) = &uplink {
                tracing::warn!(interface = %uplink.name, "uplink has no IPv4 address: no cross-node traffic");
            }
        }
        // The node's own sockets to hostPorts (127.0.0.1, node addresses).
        let hooks = crate::datapath::sockhooks::cgroup2_root().and_then(|cgroup| {
            let cookie = crate::datapath::sockhooks::netns_cookie()?;
            dp.attach_socket_hooks(&cgroup, cookie)
                .map(|ids| (cgroup, ids))
        });
        match hooks {
            Ok((cgroup, ids)) => {
                tracing::info!(cgroup = %cgroup.display(), links = ?ids, "socket hooks attached");
            }
            Err(e) => {
                tracing::warn!(error = ?e, "socket hooks not attached: the node's own sockets cannot reach hostPorts");
            }
        }
        let cfg_store = cfg.has_store();
        let cfg_pin_dir = cfg.pin_dir.clone();
        let mut cluster = Cluster::new(cfg.mode, uplink_net, pod_cidr, node_ip, cfg.vni)
            .with_cross_subnet(
                cfg.bgp
                    .as_ref()
                    .map_or_else(Default::default, |b| b.cross_subnet),
            );
        cluster.restore(&mut dp)?;
        let bgp = match (&cfg.bgp, &uplink, node_ip) {
            (None, ..) => None,
            (Some(settings), Some(uplink), Some(node_ip)) => {
                let mut bgp = crate::cluster::bgp::Bgp::new(
                    settings.clone(),
                    &crate::cluster::bgp::NodeFacts {
                        node_ip,
                        uplink: &uplink.name,
                        pod_cidr,
                        cluster_cidr: cfg.cluster_cidr,
                        state_dir: &cfg.state_dir,
                        vni: cfg.vni,
                    },
                );
                // Routes in the pinned maps: a speaker that died with the
                // agent comes back in graceful restart recovery.
                bgp.ensure_running(!cluster.is_empty() && settings.graceful_restart > 0)?;
                tracing::info!(
                    asn = settings.asn,
                    sessions = bgp.sessions().len(),
                    "BGP speaker running"
                );
                Some(bgp)
            }
            (Some(_), ..) => return Err(AgentError::BgpNoUplink),
        };

        dp.write_nat_config(crate::nat::datapath_config(&cfg.nat))?;
        dp.write_nat_limits(crate::nat::datapath_limits(&cfg.nat))?;
        dp.write_tunables(&cfg.frag_budget.tunables())?;
        dp.set_no_masquerade(&cfg.nat.no_masquerade)?;

        store::create_private_dir(&cfg.state_dir)?;
        let objects = ObjectStore::open(cfg.state_dir.join(OBJECTS_DIR))?;
        tracing::info!(
            objects = objects.objects().len(),
            skipped = objects.skipped().len(),
            "Kubernetes objects read back"
        );
        let mut endpoints = Endpoints::open(
            EndpointSettings {
                pod_cidr,
                gateway: cfg.gateway,
                mtu,
                attach: cfg.pod_attach,
                fail_at: cfg.fail_add_at.clone(),
                reserved_ports: endpoint::ReservedPorts {
                    nat: cfg
                        .nat
                        .masquerade
                        .then_some((cfg.nat.port_min, cfg.nat.port_max)),
                    vxlan_udp: cfg.vxlan_port,
                },
            },
            &cfg.state_dir,
        )?;
        endpoints
            .reconcile(&nl, &mut dp, Reattach::All, &keep_links(&cfg), &local, None)
            .await?;
        // The Service maps as a previous agent left them (kept across
        // restarts: established connections never notice).
        let mut services = crate::services::Services::load(
            &mut dp,
            crate::services::Capacity {
                frontends: cfg.limits.services,
                backends: cfg.limits.service_backends,
            },
        )?;
        // What reading the store back allocated on the way is handed back.
        let _trim = heap::TrimHeap;
        match services::update(
            &mut services,
            &mut dp,
            &cfg.node_name,
            &endpoints,
            (objects.objects(), None),
            false,
        ) {
            Ok(changes) => tracing::info!(?changes, "services synced from the stored objects"),
            Err(e) => tracing::error!(error = %e, "the stored Services are not in the datapath"),
        }
        let health = services::HealthPorts::new(services.current().health.clone());
        // NetworkPolicy: the pinned endpoints kept their isolation bits,
        // so enforcement never paused; now the maps as the objects say,
        // and what a previous agent left that nothing wants goes.
        let mut policies = crate::policy::Policies::default();
        let synced = policies.adopt(&mut dp).and_then(|adopted| {
            policies
                .sync(&mut dp, objects.objects(), &policy::local_pods(&endpoints))
                .map(|changes| (adopted, changes))
        });
        match synced {
            Ok((adopted, changes)) => {
                tracing::info!(
                    adopted,
                    ?changes,
                    "network policy synced from the stored objects"
                );
            }
            Err(e) => {
                tracing::error!(error = %e, "the stored NetworkPolicies are not in the datapath")
            }
        }
        // The endpoint cache after the entries it copies.
        let slots = dp.sync_endpoint_slots()?;
        if slots > 0 {
            tracing::info!(slots, "endpoint cache slots rewritten from ENDPOINTS");
        }
        tracing::info!(
            node = %cfg.node_name,
            mode = cfg.mode.as_str(),
            %pod_cidr,
            mtu,
            endpoints = endpoints.len(),
            nodes = cluster.len(),
            pin_dir = %cfg.pin_dir.display(),
            "datapath ready"
        );
        let unpublished = Published {
            status: status::base_status(&cfg, pod_cidr, mtu, node_ip),
            not_attached: Some("the status is not gathered yet".into()),
            at: Instant::now(),
            through: 0,
        };
        let agent = Self {
            published: std::sync::RwLock::new(Arc::new(unpublished)),
            changed: tokio::sync::Notify::new(),
            changes: std::sync::atomic::AtomicU64::new(0),
            cfg,
            nl,
            state: Mutex::new(NodeState {
                dp,
                endpoints,
                local,
                cluster,
                objects,
                services,
                policies,
                bgp,
            }),
            started: Instant::now(),
            mtu,
            pod_cidr,
            node_ip,
            store_state: std::sync::Mutex::new(if cfg_store {
                StoreState::Connecting
            } else {
                StoreState::Standalone
            }),
            nat_stats: std::sync::Mutex::new(crate::nat::NatStats::default()),
            requests: RequestMetrics::default(),
            last_error: std::sync::Mutex::new(None),
            events: Arc::new(crate::events::Events::new(
                crate::datapath::pins::PinLayout::new(cfg_pin_dir.clone()).map(map_names::EVENTS),
                crate::datapath::pins::PinLayout::new(cfg_pin_dir.clone())
                    .map(map_names::EVENT_CONFIG),
                crate::datapath::pins::PinLayout::new(cfg_pin_dir).map(map_names::TUNABLES),
            )),
            health,
            kube_objects: std::sync::Mutex::default(),
            objects_changed: tokio::sync::watch::Sender::new(0),
            _lock: lock,
        };
        {
            let state = agent.lock().await;
            agent.events.set_policy_names(crate::events::PolicyNames {
                policies: state.policies.policy_names(),
                pods: state.policies.pod_names(),
            });
        }
        if let Err(e) = agent.refresh_status().await {
            tracing::warn!(error = %e, "gathering the status");
        }
        Ok(agent)
    }

    /// The event hub (`monitor`).
    pub fn events(&self) -> &Arc<crate::events::Events> {
        &self.events
    }

    /// Remembers the latest background failure for `status`.
    pub fn note_error(&self, what: String) {
        if let Ok(mut last) = self.last_error.lock() {
            *last = Some((Instant::now(), what));
        }
    }

    fn last_error(&self) -> Option<String> {
        let last = self.last_error.lock().ok()?;
        last.as_ref()
            .map(|(at, what)| format!("{what} ({}s ago)", at.elapsed().as_secs()))
    }

    /// The resolved configuration.
    pub fn config(&self) -> &AgentConfig {
        &self.cfg
    }

    /// Latency of the API requests served so far.
    pub fn request_metrics(&self) -> &RequestMetrics {
        &self.requests
    }

    /// The agent's netlink handle (the node's namespace).
    pub fn netlink(&self) -> &Netlink {
        &self.nl
    }

    /// Everything mutable, locked: endpoint changes are serialized.
    pub async fn lock(&self) -> MutexGuard<'_, NodeState> {
        self.state.lock().await
    }

    /// One reconciliation pass: local addresses, then endpoints.
    pub async fn reconcile(&self) -> Result<(), AgentError> {
        // Probes that need no consistency with the records run without the
        // lock, so that ADD and DEL never wait for them.
        let (targets, generation) = {
            let state = self.state.lock().await;
            (
                state.endpoints.tc_probe_targets(),
                state.endpoints.generation(),
            )
        };
        let mut probed = HashMap::new();
        for index in targets {
            // A veth gone meanwhile (ENODEV) is the record check's business.
            if let Ok(ids) = self.nl.tc_bpf_prog_ids(index, true).await {
                probed.insert(index, !ids.is_empty());
            }
        }
        let links = self.nl.links().await?;
        let addrs = self.nl.ipv4_addresses().await?;
        let mut state = self.state.lock().await;
        let started = std::time::Instant::now();
        let NodeState {
            dp,
            endpoints,
            local,
            ..
        } = &mut *state;
        *local = addrs.iter().map(|(_, ip)| *ip).collect();
        dp.set_local_addrs(&local.iter().copied().collect::<Vec<_>>())?;
        endpoints
            .reconcile(
                &self.nl,
                dp,
                Reattach::Missing(&probed),
                &keep_links(&self.cfg),
                local,
                Some((generation, links)),
            )
            .await?;
        tracing::debug!(
            ms = started.elapsed().as_secs_f64() * 1e3,
            "reconciled (state lock held)"
        );
        Ok(())
    }

    /// Masquerade settings and the NAT table's last collection.
    pub fn nat_status(&self) -> rivet_api::NatStatus {
        let stats = self
            .nat_stats
            .lock()
            .map(|s| *s)
            .unwrap_or_else(|e| *e.into_inner());
        rivet_api::NatStatus {
            masquerade: self.cfg.nat.masquerade,
            port_min: self.cfg.nat.port_min,
            port_max: self.cfg.nat.port_max,
            // Before the first collection: the configured size.
            max_entries: if stats.max_entries == 0 {
                u64::from(self.cfg.nat.max_entries)
            } else {
                stats.max_entries
            },
            ..stats
        }
    }

    /// Runs the NAT table's garbage collector until the agent stops.
    pub async fn collect_nat(self: Arc<Self>) {
        let timeouts = crate::nat::Timeouts {
            tcp: self.cfg.nat.tcp_timeout,
            udp: self.cfg.nat.udp_timeout,
            closing: self.cfg.nat.tcp_closing_timeout,
        };
        let pin = crate::datapath::pins::PinLayout::new(self.cfg.pin_dir.clone())
            .map(rivet_common::map_names::NAT);
        let mut collector = match crate::nat::Collector::open(&pin, timeouts) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "NAT collector not started");
                return;
            }
        };
        let mut tick = tokio::time::interval(Duration::from_secs(self.cfg.nat.gc_interval));
        tick.tick().await;
        loop {
            tick.tick().await;
            let (result, collector_back) = match background::run_idle(move || {
                let r = collector.collect(crate::nat::monotonic_ns());
                (r, collector)
            })
            .await
            {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::error!(error = %e, "NAT collector stopped");
                    return;
                }
            };
            collector = collector_back;
            match result {
                Ok(stats) => {
                    if let Ok(mut s) = self.nat_stats.lock() {
                        *s = stats;
                    }
                    if stats.max_entries > 0 && stats.entries * 10 > stats.max_entries * 9 {
                        tracing::warn!(
                            entries = stats.entries,
                            max = stats.max_entries,
                            "NAT table over 90% full"
                        );
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "NAT collection");
                    self.note_error(format!("NAT collection: {e}"));
                }
            }
        }
    }

    /// Cluster store state, for status.
    pub fn store_state(&self) -> StoreState {
        self.store_state
            .lock()
            .map(|s| s.clone())
            .unwrap_or_else(|e| e.into_inner().clone())
    }

    /// Waits for in-flight changes to finish (used at shutdown).
    pub async fn quiesce(&self) {
        drop(self.state.lock().await);
    }
}

fn keep_links(cfg: &AgentConfig) -> Vec<String> {
    cfg.uplink
        .iter()
        .cloned()
        .chain(std::iter::once(node::HOST_DEV.to_owned()))
        .collect()
}

/// The first IPv4 address of the configured uplink (the node's address).
pub async fn uplink_ipv4(cfg: &AgentConfig) -> Result<Option<Ipv4Addr>, AgentError> {
    let Some(name) = &cfg.uplink else {
        return Ok(None);
    };
    let nl = Netlink::connect()?;
    let link = nl
        .link_by_name(name)
        .await?
        .ok_or_else(|| AgentError::NoUplink(name.clone()))?;
    Ok(nl
        .addresses_of(link.index)
        .await?
        .first()
        .map(|(ip, _)| *ip))
}

impl crate::cluster::ClusterSink for Agent {
    async fn replace(&self, nodes: Vec<RemoteNode>) {
        let mut state = self.state.lock().await;
        if let Some(b) = &mut state.bgp {
            bgp::members_replaced(b, nodes);
            return;
        }
        let NodeState { dp, cluster, .. } = &mut *state;
        if let Err(e) = cluster.replace_all(dp, nodes) {
            tracing::warn!(error = %e, "applying the cluster's nodes");
        }
        self.note_change();
    }

    async fn upsert(&self, node: RemoteNode) {
        let mut state = self.state.lock().await;
        if let Some(b) = &mut state.bgp {
            bgp::member_put(b, node);
            return;
        }
        let NodeState { dp, cluster, .. } = &mut *state;
        let (subnet, ip) = (node.subnet, node.node_ip);
        match cluster.upsert(dp, node) {
            Ok(true) => tracing::info!(%subnet, node_ip = %ip, "node joined"),
            Ok(false) => {}
            Err(e) => tracing::warn!(%subnet, error = %e, "adding a node"),
        }
        self.note_change();
    }

    async fn remove(&self, subnet: ipnet::Ipv4Net) {
        let mut state = self.state.lock().await;
        if let Some(b) = &mut state.bgp {
            bgp::member_removed(b, subnet);
            return;
        }
        let NodeState { dp, cluster, .. } = &mut *state;
        match cluster.remove(dp, subnet) {
            Ok(true) => tracing::info!(%subnet, "node left"),
            Ok(false) => {}
            Err(e) => tracing::warn!(%subnet, error = %e, "removing a node"),
        }
        self.note_change();
    }

    async fn state(&self, report: StoreReport) {
        if let Ok(mut s) = self.store_state.lock() {
            *s = s.after(report);
        }
    }
}
