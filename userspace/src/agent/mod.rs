//! The node agent: owns the datapath of one node, serves the API socket and
//! keeps kernel state reconciled with its records.

use std::{
    collections::{HashMap, HashSet},
    net::Ipv4Addr,
    os::unix::fs::PermissionsExt as _,
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use rivet_api::{
    AgentStatus, ApiError, Attachment, CounterValue, ErrorKind, MAX_MESSAGE, Request, Response,
};
use rivet_common::{NodeConfig, config_flags, ipv4_key, map_names, program_names};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{UnixListener, UnixStream},
    sync::Mutex,
};

use crate::{
    cluster::{Cluster, ClusterError, RemoteNode, node},
    config::{AgentConfig, Mode},
    datapath::{
        AttachMode, Datapath, DatapathError,
        pins::{self, Hook, PinError, PinLayout, PinLock},
    },
    endpoint::{self, EndpointError, EndpointSettings, Endpoints, Reattach},
    netlink::{ConnectError, Netlink, NetlinkError},
    store::{self, StoreError},
};

/// How often the agent re-checks kernel state against its records.
pub const RECONCILE_INTERVAL: Duration = Duration::from_secs(5);
/// Longest a client may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// Cluster mode needs the node's address.
    #[error("cluster mode (etcd) needs an uplink with an IPv4 address")]
    NoNodeIp,
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
    store_state: std::sync::Mutex<String>,
    nat_stats: std::sync::Mutex<crate::nat::NatStats>,
    requests: crate::server::metrics::RequestMetrics,
    last_error: std::sync::Mutex<Option<(Instant, String)>>,
    events: Arc<crate::events::Events>,
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
            .unwrap_or_else(|| uplink_mtu.saturating_sub(cfg.mode.overhead()));
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
            if matches!(cfg.mode, Mode::Vxlan | Mode::Hybrid)
                && let Err(e) = node::vxlan_gro_device(&nl, cfg.vxlan_port).await
            {
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
        let cfg_etcd = cfg.etcd.is_some();
        let cfg_pin_dir = cfg.pin_dir.clone();
        let mut cluster = Cluster::new(cfg.mode, uplink_net, pod_cidr, node_ip, cfg.vni);
        cluster.restore(&mut dp)?;

        dp.write_nat_config(crate::nat::datapath_config(&cfg.nat))?;
        dp.write_nat_limits(crate::nat::datapath_limits(&cfg.nat))?;
        dp.write_tunables(&cfg.frag_budget.tunables())?;
        dp.set_no_masquerade(&cfg.nat.no_masquerade)?;

        store::create_private_dir(&cfg.state_dir)?;
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
        Ok(Self {
            cfg,
            nl,
            state: Mutex::new(NodeState {
                dp,
                endpoints,
                local,
                cluster,
            }),
            started: Instant::now(),
            mtu,
            pod_cidr,
            node_ip,
            store_state: std::sync::Mutex::new(
                if cfg_etcd {
                    "etcd: connecting"
                } else {
                    "single-node"
                }
                .to_owned(),
            ),
            nat_stats: std::sync::Mutex::new(crate::nat::NatStats::default()),
            requests: crate::server::metrics::RequestMetrics::default(),
            last_error: std::sync::Mutex::new(None),
            events: Arc::new(crate::events::Events::new(
                crate::datapath::pins::PinLayout::new(cfg_pin_dir.clone()).map(map_names::EVENTS),
                crate::datapath::pins::PinLayout::new(cfg_pin_dir).map(map_names::EVENT_CONFIG),
            )),
            _lock: lock,
        })
    }

    /// Answers one request.
    pub async fn handle(self: &Arc<Self>, request: Request) -> Response {
        let started = Instant::now();
        let verb = verb_of(&request);
        let response = match self.dispatch(request).await {
            Ok(r) => r,
            Err(e) => Response::Error(e),
        };
        self.requests.observe(verb, started.elapsed());
        response
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
    pub fn request_metrics(&self) -> &crate::server::metrics::RequestMetrics {
        &self.requests
    }

    /// Ready, or why not (what `/readyz` answers).
    pub async fn readiness(self: &Arc<Self>) -> Result<(), String> {
        // Not through `handle`: probes are not CNI STATUS requests.
        match self.dispatch(Request::Status {}).await {
            Ok(Response::Status(s)) if s.ready => Ok(()),
            Ok(Response::Status(s)) => Err(s.not_ready.unwrap_or_else(|| "not ready".into())),
            Ok(other) => Err(format!("status: {other:?}")),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Everything one metrics scrape reports.
    pub async fn metrics_snapshot(
        self: &Arc<Self>,
    ) -> Result<crate::server::metrics::Snapshot, String> {
        let status = match self.dispatch(Request::Status {}).await {
            Ok(Response::Status(s)) => s,
            Ok(other) => return Err(format!("status: {other:?}")),
            Err(e) => return Err(e.to_string()),
        };
        let counters = match self.dispatch(Request::Stats {}).await {
            Ok(Response::Stats { counters }) => counters,
            Ok(other) => return Err(format!("stats: {other:?}")),
            Err(e) => return Err(e.to_string()),
        };
        Ok(crate::server::metrics::Snapshot {
            ready: status.ready,
            counters,
            status,
        })
    }

    /// Ready when the uplink (if any) runs its program and, in cluster
    /// mode, the store is in sync.
    fn ready_with(&self, attachments: &[Attachment]) -> (bool, Option<String>) {
        if let (Some(uplink), Some(_)) = (&self.cfg.uplink, self.node_ip)
            && !attachments
                .iter()
                .any(|a| &a.interface == uplink && a.program == program_names::FROM_UPLINK)
        {
            return (
                false,
                Some(format!("no rivet program on the uplink {uplink}")),
            );
        }
        if self.cfg.etcd.is_some() && !self.store_state().starts_with("etcd: synced") {
            return (false, Some(self.store_state()));
        }
        (true, None)
    }

    async fn dispatch(self: &Arc<Self>, request: Request) -> Result<Response, ApiError> {
        let internal = |e: DatapathError| ApiError::new(ErrorKind::Internal, e.to_string());
        let mut state = self.state.lock().await;
        let NodeState {
            dp,
            endpoints,
            local,
            cluster,
        } = &mut *state;
        match request {
            Request::NodeSet(entry) => {
                let node = RemoteNode::from_entry(&entry, self.cfg.vni)
                    .map_err(|e| ApiError::new(ErrorKind::BadRequest, e.to_string()))?;
                let subnet = node.subnet;
                let changed = cluster
                    .upsert(dp, node)
                    .map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))?;
                tracing::debug!(subnet = %entry.subnet, node_ip = %entry.node_ip, changed, "node set");
                // The node as it now stands (not the whole table: an answer
                // must not grow with the cluster).
                Ok(Response::Nodes {
                    nodes: cluster.entry(subnet).into_iter().collect(),
                })
            }
            Request::NodeDel { subnet } => {
                let net: ipnet::Ipv4Net = subnet.parse().map_err(|_| {
                    ApiError::new(
                        ErrorKind::BadRequest,
                        format!("subnet {subnet:?} is not an IPv4 CIDR"),
                    )
                })?;
                let existed = cluster
                    .remove(dp, net)
                    .map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))?;
                Ok(Response::Deleted { existed })
            }
            Request::NodeList {} => Ok(Response::Nodes {
                nodes: cluster.list(),
            }),
            Request::EndpointAdd(spec) => {
                let ep = endpoints.add(spec, &self.nl, dp, local).await?;
                drop(state);
                tracing::info!(container = %ep.container_id, ip = %ep.ip, host = %ep.host_ifname, "endpoint added");
                Ok(Response::Endpoint(ep))
            }
            Request::EndpointDel(r) => {
                let (existed, drain) = endpoints.del_deferred(&r, &self.nl, dp).await?;
                tracing::info!(container = %r.container_id, ifname = %r.ifname, existed, "endpoint deleted");
                if let Some(d) = drain {
                    // The lease is released and the datapath forgets the pod
                    // now; the device unregistration (tens of ms of RCU) runs
                    // after the answer, with the address held until it ends.
                    let agent = Arc::clone(self);
                    tokio::spawn(async move {
                        if let Err(e) = endpoint::delete_veth(&agent.nl, &d).await {
                            tracing::warn!(host = %d.host, error = %e, "deleting a veth after DEL");
                        }
                        agent.state.lock().await.endpoints.drained(&d);
                    });
                }
                Ok(Response::Deleted { existed })
            }
            Request::EndpointCheck(c) => {
                endpoints.check(&c, &self.nl, dp).await?;
                Ok(Response::Checked {})
            }
            Request::Gc(gc) => {
                let removed = endpoints.gc(&gc.network, &gc.valid, &self.nl, dp).await?;
                tracing::info!(network = %gc.network, removed = removed.len(), kept = gc.valid.len(), "gc");
                Ok(Response::Collected { removed })
            }
            Request::EndpointList {} => Ok(Response::Endpoints {
                endpoints: endpoints.list(),
            }),
            Request::Stats {} => Ok(Response::Stats {
                counters: dp
                    .counters()
                    .map_err(internal)?
                    .into_iter()
                    .map(|(c, v)| CounterValue {
                        name: c.name().to_owned(),
                        drop: c.is_drop(),
                        packets: v.packets,
                        bytes: v.bytes,
                    })
                    .collect(),
            }),
            Request::NatList { ip, port, limit } => {
                let all = dp.nat_entries().map_err(internal)?;
                let now = crate::nat::monotonic_ns();
                let key = |a: Option<Ipv4Addr>| a.map(|a| rivet_common::ipv4_key(a.octets()));
                let (ip, wire_port) = (key(ip), port.map(u16::to_be));
                let mut entries: Vec<rivet_api::NatFlow> = all
                    .iter()
                    .filter(|(k, e)| {
                        ip.is_none_or(|a| k.src == a || k.dst == a || e.addr == a)
                            && wire_port.is_none_or(|p| k.sport == p || k.dport == p || e.port == p)
                    })
                    .take(limit.unwrap_or(1000))
                    .map(|(k, e)| nat_flow(k, e, now))
                    .collect();
                entries.sort_by(|a, b| (&a.src, &a.dst, &a.dir).cmp(&(&b.src, &b.dst, &b.dir)));
                Ok(Response::Nat {
                    entries,
                    total: all.len(),
                })
            }
            Request::Monitor { .. } => Err(ApiError::new(
                ErrorKind::BadRequest,
                "monitor streams events: it is served per connection",
            )),
            Request::PortmapList {} => {
                let owners: HashMap<Ipv4Addr, String> = endpoints
                    .list()
                    .into_iter()
                    .map(|ep| (ep.ip, ep.container_id))
                    .collect();
                let mut mappings: Vec<rivet_api::PortmapEntry> = dp
                    .list_hostports()
                    .map_err(internal)?
                    .into_iter()
                    .map(|(k, t)| {
                        let pod_ip = Ipv4Addr::from(rivet_common::ipv4_from_key(t.pod_ip));
                        rivet_api::PortmapEntry {
                            host_ip: (k.addr != 0)
                                .then(|| Ipv4Addr::from(rivet_common::ipv4_from_key(k.addr))),
                            host_port: u16::from_be(k.port),
                            protocol: if k.proto == 6 { "tcp" } else { "udp" }.into(),
                            pod_ip,
                            container_port: u16::from_be(t.port),
                            container_id: owners.get(&pod_ip).cloned(),
                        }
                    })
                    .collect();
                mappings.sort_by_key(|m| (m.host_port, m.protocol.clone(), m.host_ip));
                Ok(Response::Portmaps { mappings })
            }
            Request::Status {} => {
                let mut attachments: Vec<Attachment> = dp
                    .links()
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
                if self.cfg.pod_attach == AttachMode::Tc {
                    let ours = dp.program_id(program_names::FROM_POD).map_err(internal)?;
                    for ep in endpoints.list() {
                        let ids = endpoints.attached_ids(&ep, &self.nl, dp).await?;
                        for id in ids {
                            attachments.push(Attachment {
                                interface: ep.host_ifname.clone(),
                                program: if id == ours {
                                    "from_pod".into()
                                } else {
                                    "(not rivet's current program)".into()
                                },
                                program_id: id,
                                link_id: 0,
                                pin: format!("tc ingress prio {}", crate::datapath::TC_PRIORITY),
                            });
                        }
                    }
                    attachments.sort_by(|a, b| a.interface.cmp(&b.interface));
                }
                let (ready, not_ready) = self.ready_with(&attachments);
                let nat = self.nat_status();
                let hostports = dp.list_hostports().map_err(internal)?.len() as u64;
                let refused: HashMap<&str, u64> =
                    crate::datapath::map_full_counts().into_iter().collect();
                let mut maps = Vec::new();
                for (name, key) in crate::datapath::SIZED_MAPS {
                    let entries = match name {
                        map_names::ENDPOINTS => endpoints.len() as u64,
                        map_names::HOSTPORTS => hostports,
                        map_names::NAT => nat.entries,
                        _ => cluster.len() as u64,
                    };
                    let (capacity, memory_bytes) = dp.map_size(name).map_err(internal)?;
                    maps.push(rivet_api::MapUsage {
                        name: name.to_owned(),
                        entries,
                        capacity: u64::from(capacity),
                        memory_bytes,
                        full_refusals: refused.get(name).copied().unwrap_or(0),
                        config_key: key.to_owned(),
                    });
                }
                let warnings = map_warnings(&maps);
                Ok(Response::Status(AgentStatus {
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    node_name: self.cfg.node_name.clone(),
                    uptime_secs: self.started.elapsed().as_secs(),
                    pod_cidr: self.pod_cidr.to_string(),
                    gateway: self.cfg.gateway,
                    mtu: self.mtu,
                    pin_dir: self.cfg.pin_dir.display().to_string(),
                    endpoints: endpoints.len(),
                    attachments,
                    pool: endpoints.pool(),
                    mode: self.cfg.mode.as_str().to_owned(),
                    cluster_cidr: self.cfg.cluster_cidr.to_string(),
                    node_ip: self.node_ip,
                    nodes: cluster.len(),
                    store: self.store_state(),
                    store_synced: self.cfg.etcd.is_none()
                        || self.store_state().starts_with("etcd: synced"),
                    nat,
                    ready,
                    not_ready,
                    last_error: self.last_error(),
                    maps,
                    warnings,
                    ebpf: rivet_api::EbpfObject {
                        source: dp.object().source.clone(),
                        stamp: dp.object().stamp.clone(),
                        hash: dp.object().hash.clone(),
                        bytes: dp.object().size as u64,
                    },
                }))
            }
        }
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
            let (result, collector_back) = match tokio::task::spawn_blocking(move || {
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
    pub fn store_state(&self) -> String {
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

/// Name of a socket directory that is the agent's own (see [`bind`]).
const OWN_SOCKET_DIR: &str = "rivet";

/// Binds the API socket: stale socket replaced (the pin lock proves no
/// other agent owns it), socket 0600 — root only. With `group` (config
/// `socket_group`) the socket is 0660 and owned by that group: its members
/// may connect. The parent directory is restricted only when it is the
/// agent's own — one it creates, or one named `rivet` (the default
/// `/run/rivet`, kept across restarts): 0700, or 0710 owned by the group,
/// so nobody else can even reach the path. Any other directory that already
/// exists (`/run`, `/tmp`, a shared runtime directory) is never changed;
/// the socket's own mode guards it there.
pub fn bind(path: &Path, group: Option<&str>) -> Result<UnixListener, AgentError> {
    let sock_err = |source| AgentError::Socket {
        path: path.display().to_string(),
        source,
    };
    let gid = match group {
        None => None,
        Some(name) => Some(
            nix::unistd::Group::from_name(name)
                .map_err(|e| sock_err(std::io::Error::from(e)))?
                .ok_or_else(|| {
                    sock_err(std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("socket_group {name:?}: no such group"),
                    ))
                })?
                .gid,
        ),
    };
    let own_dir = match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) if !dir.exists() || dir.file_name() == Some(OWN_SOCKET_DIR.as_ref()) => {
            store::create_private_dir(dir)?;
            Some(dir)
        }
        Some(dir) => {
            tracing::debug!(dir = %dir.display(), "socket directory exists; its mode is left alone");
            None
        }
        None => None,
    };
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(sock_err(e)),
    }
    let listener = UnixListener::bind(path).map_err(sock_err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(sock_err)?;
    if let Some(gid) = gid {
        let chgrp = |p: &Path, mode: u32| {
            nix::unistd::chown(p, None, Some(gid)).map_err(|e| sock_err(e.into()))?;
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).map_err(sock_err)
        };
        chgrp(path, 0o660)?;
        if let Some(dir) = own_dir {
            chgrp(dir, 0o710)?;
        }
    }
    Ok(listener)
}

/// Serves connections until `shutdown` resolves.
pub async fn serve(
    agent: Arc<Agent>,
    listener: UnixListener,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let agent = Arc::clone(&agent);
                    tokio::spawn(async move {
                        if let Err(e) = handle_connection(&agent, stream).await {
                            tracing::debug!(error = %e, "API connection");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accepting an API connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

/// Decodes one API request (the bytes a client sent: a complete document,
/// or all of them up to its shutdown, at most `MAX_MESSAGE`); a malformed
/// one becomes the `bad_request` error that is answered.
pub fn decode_request(body: &[u8]) -> Result<Request, ApiError> {
    serde_json::from_slice::<Request>(body)
        .map_err(|e| ApiError::new(ErrorKind::BadRequest, format!("invalid request: {e}")))
}

/// Reads one request into `body`: until it is a complete JSON document
/// (the request is served without waiting for the client's shutdown, EOF,
/// behind it), EOF, or `MAX_MESSAGE` bytes.
async fn read_request(stream: &mut UnixStream, body: &mut Vec<u8>) -> std::io::Result<()> {
    let mut limited = stream.take(MAX_MESSAGE);
    loop {
        if limited.read_buf(body).await? == 0 {
            return Ok(());
        }
        // A request is an object: only a buffer ending in `}` can hold all
        // of it (which bounds the parse attempts of a large one).
        if body.trim_ascii_end().last() == Some(&b'}')
            && serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok()
        {
            return Ok(());
        }
    }
}

async fn handle_connection(agent: &Arc<Agent>, mut stream: UnixStream) -> std::io::Result<()> {
    let started = std::time::Instant::now();
    let mut body = Vec::with_capacity(4096);
    let read = tokio::time::timeout(REQUEST_TIMEOUT, read_request(&mut stream, &mut body)).await;
    let read_ms = started.elapsed().as_secs_f64() * 1e3;
    let response = match read {
        Err(_) => Response::Error(ApiError::new(
            ErrorKind::BadRequest,
            "timed out reading the request",
        )),
        Ok(Err(e)) => return Err(e),
        Ok(Ok(_)) => match decode_request(&body) {
            Ok(Request::Monitor { flows, sample }) => {
                return stream_events(agent, stream, flows.then(|| sample.unwrap_or(1))).await;
            }
            Ok(request) => agent.handle(request).await,
            Err(e) => Response::Error(e),
        },
    };
    let handled_ms = started.elapsed().as_secs_f64() * 1e3;
    let bytes = serde_json::to_vec(&response).map_err(std::io::Error::other)?;
    stream.write_all(&bytes).await?;
    stream.shutdown().await?;
    tracing::debug!(
        ms = started.elapsed().as_secs_f64() * 1e3,
        read_ms,
        handled_ms,
        "API request answered"
    );
    Ok(())
}

/// Streams events to a `monitor` client, one JSON object per line, with a
/// keep-alive line every second (how a client that went away is noticed).
async fn stream_events(
    agent: &Arc<Agent>,
    mut stream: UnixStream,
    flows: Option<u32>,
) -> std::io::Result<()> {
    use tokio::sync::broadcast::error::RecvError;
    let mut sub = agent.events().subscribe(flows);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut lost = 0u64;
    loop {
        let event = tokio::select! {
            ev = sub.rx.recv() => match ev {
                Ok(mut ev) => {
                    ev.lost = std::mem::take(&mut lost);
                    ev
                }
                Err(RecvError::Lagged(n)) => {
                    lost += n;
                    continue;
                }
                Err(RecvError::Closed) => return Ok(()),
            },
            _ = tick.tick() => rivet_api::MonitorEvent {
                kind: "tick".into(),
                reason: String::new(),
                ifindex: 0,
                ifname: None,
                proto: String::new(),
                src: String::new(),
                dst: String::new(),
                icmp: None,
                len: 0,
                time: 0.0,
                lost: 0,
            },
        };
        // One write for this event and every one already waiting.
        let mut lines = serde_json::to_vec(&event).map_err(std::io::Error::other)?;
        lines.push(b'\n');
        while lines.len() < 64 * 1024 {
            let Ok(mut ev) = sub.rx.try_recv() else {
                break;
            };
            ev.lost = std::mem::take(&mut lost);
            serde_json::to_writer(&mut lines, &ev).map_err(std::io::Error::other)?;
            lines.push(b'\n');
        }
        stream.write_all(&lines).await?;
    }
}

/// A NAT entry as the API shows it.
fn nat_flow(k: &rivet_common::NatKey, e: &rivet_common::NatEntry, now: u64) -> rivet_api::NatFlow {
    use rivet_common::{ipv4_from_key, nat_dir, nat_flags};
    let addr = |a: u32, p: u16| format!("{}:{}", Ipv4Addr::from(ipv4_from_key(a)), u16::from_be(p));
    let flags = [
        (nat_flags::SYN, "syn"),
        (nat_flags::FIN, "fin"),
        (nat_flags::FIN_POD, "fin_pod"),
        (nat_flags::RST, "rst"),
        (nat_flags::SEEN, "seen"),
    ]
    .iter()
    .filter(|(bit, _)| e.flags & bit != 0)
    .map(|(_, name)| (*name).to_owned())
    .collect();
    rivet_api::NatFlow {
        proto: match k.proto {
            6 => "tcp".into(),
            17 => "udp".into(),
            1 => "icmp".into(),
            p => p.to_string(),
        },
        dir: match k.dir {
            nat_dir::EGRESS => "egress",
            nat_dir::REPLY => "reply",
            _ => "dnat",
        }
        .into(),
        src: addr(k.src, k.sport),
        dst: addr(k.dst, k.dport),
        translated: addr(e.addr, e.port),
        flags,
        idle_secs: now.saturating_sub(e.last_seen) / 1_000_000_000,
    }
}

/// The label of a request in the latency metrics: the CNI verb it serves,
/// else its own name.
const fn verb_of(request: &Request) -> &'static str {
    match request {
        Request::EndpointAdd(_) => "ADD",
        Request::EndpointDel(_) => "DEL",
        Request::EndpointCheck(_) => "CHECK",
        Request::Gc(_) => "GC",
        Request::Status {} => "STATUS",
        Request::EndpointList {} => "endpoint_list",
        Request::NodeSet(_) => "node_set",
        Request::NodeDel { .. } => "node_del",
        Request::NodeList {} => "node_list",
        Request::Stats {} => "stats",
        Request::NatList { .. } => "nat_list",
        Request::PortmapList {} => "portmap_list",
        Request::Monitor { .. } => "monitor",
    }
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

impl crate::cluster::etcd::ClusterSink for Agent {
    async fn replace(&self, nodes: Vec<RemoteNode>) {
        let mut state = self.state.lock().await;
        let NodeState { dp, cluster, .. } = &mut *state;
        if let Err(e) = cluster.replace_all(dp, nodes) {
            tracing::warn!(error = %e, "applying the cluster's nodes");
        }
    }

    async fn upsert(&self, node: RemoteNode) {
        let mut state = self.state.lock().await;
        let NodeState { dp, cluster, .. } = &mut *state;
        let (subnet, ip) = (node.subnet, node.node_ip);
        match cluster.upsert(dp, node) {
            Ok(true) => tracing::info!(%subnet, node_ip = %ip, "node joined"),
            Ok(false) => {}
            Err(e) => tracing::warn!(%subnet, error = %e, "adding a node"),
        }
    }

    async fn remove(&self, subnet: ipnet::Ipv4Net) {
        let mut state = self.state.lock().await;
        let NodeState { dp, cluster, .. } = &mut *state;
        match cluster.remove(dp, subnet) {
            Ok(true) => tracing::info!(%subnet, "node left"),
            Ok(false) => {}
            Err(e) => tracing::warn!(%subnet, error = %e, "removing a node"),
        }
    }

    async fn state(&self, text: String) {
        if let Ok(mut s) = self.store_state.lock() {
            *s = text;
        }
    }
}
