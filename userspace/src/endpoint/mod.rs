//! Pod attachments ("endpoints") and their leases: plumbing a pod into the
//! node and removing it again, with rollback of every step on failure.
//!
//! The endpoint record *is* the lease. ADD, in order (each step undone if a
//! later one fails):
//! 1. validate; open the pod netns; choose the address (IPAM or requested);
//! 2. write the record as `pending` (crash-safe) — from here on a crash
//!    leaves an owner record that start-up reconciliation rolls back;
//! 3. veth `rv<hash>` in the node with its peer created *inside* the pod netns;
//! 4. pod side (on a thread inside the pod netns): lo up, IPv6 off, `ip/32`,
//!    `gateway/32 dev eth0 scope link`, `default via gateway`;
//! 5. host side: IPv6/RA off, up, `ip/32 dev rv… scope link`, permanent
//!    neighbour `ip → pod MAC`;
//! 6. endpoint in the BPF map; 7. `from_pod` attached (pinned TCX link);
//! 8. record rewritten as `ready`.
//!
//! DEL removes map entry, link pin, veth (its routes and neighbour go with
//! it) and the record, and succeeds when any of them is already gone.

pub mod ipam;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use ipnet::Ipv4Net;
use rivet_api::{
    ApiError, Endpoint, EndpointCheck, EndpointRef, EndpointSpec, EndpointState, ErrorKind,
    PoolStatus, PortMapping, Protocol,
};
use rivet_common::{
    EndpointInfo, HostPortKey, HostPortTarget, endpoint_flags, ipv4_key, program_names,
};

use self::ipam::{Ipam, IpamError, RangeSet};
use crate::{
    config::validate_ifname,
    datapath::{AttachMode, Datapath, DatapathError, pins::Hook},
    netlink::{
        LinkInfo, Netlink, NetlinkError,
        batch::{Batch, LOOPBACK_IFINDEX, SyncNetlink},
        format_mac,
        netns::{self, NetnsError},
        parse_mac,
    },
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
    /// A fault injected for tests (`RIVET_FAIL_ADD_AT`).
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
            IpamError::InvalidAddress(m) if m.contains("already in use") => {
                EndpointError::Conflict(m)
            }
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

// Validated by the configuration (`fail_add_at`), injected here.
pub use crate::config::FAULT_STEPS;

pub use rivet_api::host_ifname;

/// Container IDs as libcni validates them: `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`.
pub fn validate_container_id(id: &str) -> Result<(), String> {
    let mut chars = id.chars();
    match chars.next() {
        None => return Err("container ID is empty".into()),
        Some(c) if !c.is_ascii_alphanumeric() => {
            return Err(format!(
                "container ID {id:?} must start with a letter or digit"
            ));
        }
        Some(_) => {}
    }
    if !chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-') {
        return Err(format!(
            "container ID {id:?} may only contain letters, digits, '_', '.' and '-'"
        ));
    }
    Ok(())
}

/// A CNI network name as the spec allows it (`^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`).
pub fn validate_network_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)) {
        return Err(format!(
            "network name {name:?} must match ^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$"
        ));
    }
    Ok(())
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

/// The hostPort map entries of an endpoint (TCP and UDP mappings).
pub fn hostport_entries(ep: &Endpoint) -> Vec<(HostPortKey, HostPortTarget)> {
    ep.port_mappings
        .iter()
        .filter_map(|pm| {
            let proto = match pm.protocol {
                Protocol::Tcp => 6,
                Protocol::Udp => 17,
                Protocol::Sctp => return None,
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
fn remove_hostports(dp: &mut Datapath, ep: &Endpoint) -> Result<(), EndpointError> {
    let present: HashMap<HostPortKey, HostPortTarget> = dp.list_hostports()?.into_iter().collect();
    for (key, target) in hostport_entries(ep) {
        if present.get(&key) == Some(&target) {
            dp.remove_hostport(key)?;
        }
    }
    Ok(())
}

/// Flags of an endpoint's map entry.
fn entry_flags(ep: &Endpoint) -> u32 {
    if hostport_entries(ep).is_empty() {
        endpoint_flags::READY
    } else {
        endpoint_flags::READY | endpoint_flags::HOSTPORTS
    }
}

/// Steps to undo if ADD fails part-way.
#[derive(Default)]
struct Rollback {
    record: Option<String>,
    veth: Option<(u32, String)>,
    map_ip: Option<Ipv4Addr>,
    link: Option<String>,
    hostports: Vec<HostPortKey>,
}

impl Rollback {
    async fn run(self, nl: &Netlink, dp: &mut Datapath, store: &RecordDir) {
        for key in self.hostports {
            if let Err(e) = dp.remove_hostport(key) {
                tracing::warn!(error = %e, "rollback: removing a hostPort");
            }
        }
        if let Some(ifname) = self.link
            && let Err(e) = dp.detach(&ifname, Hook::Ingress)
        {
            tracing::warn!(error = %e, "rollback: detaching");
        }
        if let Some(ip) = self.map_ip
            && let Err(e) = dp.remove_endpoint(ip)
        {
            tracing::warn!(error = %e, "rollback: removing map entry");
        }
        if let Some((index, name)) = self.veth
            && let Err(e) = nl.delete_link(index, &name).await
        {
            tracing::warn!(error = %e, "rollback: deleting veth");
        }
        if let Some(key) = self.record
            && let Err(e) = store.remove(&key)
        {
            tracing::warn!(error = %e, "rollback: removing the pending record");
        }
    }
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

/// Runs `f` with a netlink socket inside the namespace at `path`, on a
/// dedicated thread with its own single-threaded runtime.
async fn in_netns<T, F, Fut>(path: PathBuf, f: F) -> Result<T, EndpointError>
where
    T: Send + 'static,
    F: FnOnce(Netlink) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<T, EndpointError>>,
{
    tokio::task::spawn_blocking(move || {
        netns::run_in(&path, || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| EndpointError::Other(format!("runtime in {}: {e}", path.display())))?;
            rt.block_on(async {
                let nl = Netlink::connect()
                    .map_err(|e| EndpointError::Other(format!("in {}: {e}", path.display())))?;
                f(nl).await
            })
        })
    })
    .await
    .map_err(|e| EndpointError::Other(format!("netns worker: {e}")))??
}

/// The pod end's half of ADD, on a fresh thread inside the pod's namespace
/// started before the veth exists: its thread start, namespace switch and
/// netlink socket overlap the veth creation. It then waits for the veth
/// ([`PodSide::configure`]), writes the pod end's IPv6 sysctls, reports
/// them done, waits for the host end's sysctls ([`PodSide::proceed`]) and
/// sends one netlink batch (lo up, address, link up, gateway route, default
/// route, extra routes). The sysctls of both ends are written before either
/// batch: `disable_ipv6` takes RTNL by trylock and restarts the write until
/// it gets it, and a write spinning beside the other end's batch made the
/// tail (both 10-20 ms on a loaded machine). Dropping it (a failed ADD)
/// ends the thread at its next wait.
struct PodSide {
    configure: std::sync::mpsc::Sender<Option<u32>>,
    proceed: std::sync::mpsc::Sender<()>,
    sysctls_done: tokio::sync::oneshot::Receiver<()>,
    done: tokio::sync::oneshot::Receiver<Result<Option<[u8; 6]>, EndpointError>>,
}

/// What the pod side needs to know about the pod.
struct PodPlan {
    ifname: String,
    ip: Ipv4Addr,
    gateway: Ipv4Addr,
    routes: Vec<Ipv4Net>,
}

/// One pod side's work, run by a [`SpareThread`] or a fresh thread.
type PodJob = Box<dyn FnOnce() + Send>;

/// A thread started ahead of need, in the agent's namespace, that runs one
/// [`PodJob`] and exits (its namespace switch never leaks). Taking it
/// instead of spawning keeps thread creation, and on a loaded machine the
/// scheduling delay of a new thread, off the ADD path.
struct SpareThread {
    job: std::sync::mpsc::Sender<PodJob>,
}

impl SpareThread {
    fn spawn() -> std::io::Result<Self> {
        let (job, rx) = std::sync::mpsc::channel::<PodJob>();
        std::thread::Builder::new()
            .name("rivet-pod-side".into())
            .spawn(move || {
                if let Ok(job) = rx.recv() {
                    job();
                }
            })?;
        Ok(Self { job })
    }
}

/// The next ADD's [`SpareThread`], refilled on the blocking pool (never a
/// thread in a pod's namespace) after each ADD.
#[derive(Clone, Default)]
struct SpareSlot(std::sync::Arc<std::sync::Mutex<Option<SpareThread>>>);

impl SpareSlot {
    fn take(&self) -> Option<SpareThread> {
        self.0.lock().ok().and_then(|mut s| s.take())
    }

    fn refill(&self) {
        let slot = self.clone();
        if self.0.lock().is_ok_and(|s| s.is_some()) {
            return;
        }
        tokio::task::spawn_blocking(move || match SpareThread::spawn() {
            // A spare that finds the slot full is dropped: it sees its
            // channel closed and exits.
            Ok(t) => {
                if let Ok(mut s) = slot.0.lock()
                    && s.is_none()
                {
                    *s = Some(t);
                }
            }
            Err(e) => tracing::debug!(error = %e, "starting a spare pod side thread"),
        });
    }
}

impl PodSide {
    /// Starts the pod side inside the namespace `netns`: on `spare` if it
    /// is still there, else on a new thread.
    fn start(
        netns: std::fs::File,
        plan: PodPlan,
        spare: Option<SpareThread>,
    ) -> Result<Self, EndpointError> {
        let (configure, configure_rx) = std::sync::mpsc::channel();
        let (proceed, proceed_rx) = std::sync::mpsc::channel();
        let (sysctls_tx, sysctls_done) = tokio::sync::oneshot::channel();
        let (done_tx, done) = tokio::sync::oneshot::channel();
        let spawned = std::time::Instant::now();
        let job: PodJob = Box::new(move || {
            // The thread exits afterwards: its namespace never leaks.
            let result = nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| EndpointError::Other(format!("setns into the pod netns: {e}")))
                .and_then(|()| {
                    configure_pod_side(&plan, spawned, &configure_rx, sysctls_tx, &proceed_rx)
                });
            let _ = done_tx.send(result);
        });
        let job = match spare {
            Some(t) => t.job.send(job).err().map(|e| e.0),
            None => Some(job),
        };
        if let Some(job) = job {
            std::thread::Builder::new()
                .name("rivet-pod-side".into())
                .spawn(job)
                .map_err(|e| EndpointError::Other(format!("starting the pod netns thread: {e}")))?;
        }
        Ok(Self {
            configure,
            proceed,
            sysctls_done,
            done,
        })
    }
}

/// The body of the [`PodSide`] thread. `index` (sent once the veth exists)
/// is the pod end's ifindex when the host end told it (`IFLA_LINK`);
/// otherwise the pod end is looked up and its MAC returned for the caller
/// to check.
fn configure_pod_side(
    plan: &PodPlan,
    spawned: std::time::Instant,
    configure: &std::sync::mpsc::Receiver<Option<u32>>,
    sysctls_done: tokio::sync::oneshot::Sender<()>,
    proceed: &std::sync::mpsc::Receiver<()>,
) -> Result<Option<[u8; 6]>, EndpointError> {
    let abandoned = || EndpointError::Other("ADD abandoned before the pod side ran".into());
    let PodPlan {
        ifname,
        ip,
        gateway,
        routes,
    } = plan;
    let (ip, gateway) = (*ip, *gateway);
    let mut timeline = Timeline {
        last: spawned,
        steps: Vec::new(),
    };
    timeline.mark("thread_start");
    let mut nl = SyncNetlink::open()
        .map_err(|e| EndpointError::Other(format!("netlink socket in the pod netns: {e}")))?;
    timeline.mark("socket");
    let index = configure.recv().map_err(|_| abandoned())?;
    timeline.mark("wait_veth");
    let (index, mac) = match index {
        Some(index) => (index, None),
        None => {
            let link = nl.link_by_name(ifname)?.ok_or_else(|| {
                EndpointError::Other(format!("{ifname} vanished from the pod netns"))
            })?;
            timeline.mark("lookup");
            (link.index, Some(link.mac))
        }
    };
    disable_ipv6(ifname);
    timeline.mark("sysctls");
    let _ = sysctls_done.send(());
    proceed.recv().map_err(|_| abandoned())?;
    timeline.mark("wait_host");
    let mut batch = Batch::new();
    batch
        .set_up(LOOPBACK_IFINDEX, "lo")
        .add_address(index, ifname, ip, 32)
        .set_up(index, ifname)
        .add_link_route(gateway, 32, index, ifname)
        .add_route_via(Ipv4Addr::UNSPECIFIED, 0, gateway, index, ifname);
    for r in routes {
        batch.add_route_via(r.network(), r.prefix_len(), gateway, index, ifname);
    }
    nl.run(batch)?;
    timeline.mark("batch");
    tracing::debug!(timing = %timeline, "pod side steps");
    Ok(mac)
}

/// Verifies the pod end for CHECK; the error names what is missing.
async fn check_pod_side(
    nl: Netlink,
    ifname: String,
    ip: Ipv4Addr,
    gateway: Ipv4Addr,
    extra: Vec<Ipv4Net>,
) -> Result<(), EndpointError> {
    let link = nl.link_by_name(&ifname).await?.ok_or_else(|| {
        EndpointError::Missing(format!("interface {ifname} is missing in the pod netns"))
    })?;
    if !nl.addresses_of(link.index).await?.contains(&(ip, 32)) {
        return Err(EndpointError::Missing(format!(
            "address {ip}/32 is missing on {ifname}"
        )));
    }
    let routes = nl.ipv4_routes().await?;
    if !routes
        .iter()
        .any(|r| r.dst == gateway && r.prefix == 32 && r.oif == Some(link.index) && r.scope_link)
    {
        return Err(EndpointError::Missing(format!(
            "route {gateway}/32 dev {ifname} scope link is missing in the pod netns"
        )));
    }
    if !routes
        .iter()
        .any(|r| r.prefix == 0 && r.gateway == Some(gateway) && r.oif == Some(link.index))
    {
        return Err(EndpointError::Missing(format!(
            "default route via {gateway} dev {ifname} is missing in the pod netns"
        )));
    }
    for want in extra {
        if !routes.iter().any(|r| {
            r.dst == want.network() && r.prefix == want.prefix_len() && r.gateway == Some(gateway)
        }) {
            return Err(EndpointError::Missing(format!(
                "route {want} via {gateway} is missing in the pod netns"
            )));
        }
    }
    Ok(())
}

/// Parses the extra pod routes of a request or record (default routes are
/// implied and skipped).
fn parse_routes(routes: &[String]) -> Result<Vec<Ipv4Net>, EndpointError> {
    routes
        .iter()
        .map(|r| {
            let net: Ipv4Net = r.parse().map_err(|_| {
                EndpointError::BadRequest(format!("route {r:?} is not an IPv4 CIDR"))
            })?;
            if net.network() != net.addr() {
                return Err(EndpointError::BadRequest(format!(
                    "route {r:?} has host bits set"
                )));
            }
            Ok(net)
        })
        .filter(|r| !matches!(r, Ok(n) if n.prefix_len() == 0))
        .collect()
}

/// The MAC a pod gets: locally administered unicast `02:72` followed by its
/// IPv4 address — unique wherever the address is, stable across a restart of
/// the pod with the same address (no stale neighbour entries anywhere).
pub fn pod_mac_for(ip: Ipv4Addr) -> [u8; 6] {
    let [a, b, c, d] = ip.octets();
    [0x02, 0x72, a, b, c, d]
}

/// Deletes a pod's host veth (its peer, routes and neighbour go with it);
/// already gone is fine.
pub async fn delete_veth(nl: &Netlink, d: &Drain) -> Result<(), EndpointError> {
    match nl.delete_link(d.index, &d.host).await {
        Ok(()) => Ok(()),
        Err(e) if e.errno() == Some(libc::ENODEV) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// rivet is IPv4-only: no link-local addresses, no DAD, no router
/// advertisements on either end of a pod veth. Best effort: a kernel without
/// IPv6 has none of these files.
fn disable_ipv6(ifname: &str) {
    let values = [
        ("accept_ra", "0"),
        ("accept_dad", "0"),
        ("disable_ipv6", "1"),
    ];
    if let Err((key, e)) = netns::write_if_sysctls("ipv6", ifname, &values) {
        tracing::debug!(ifname, key, error = %e, "ipv6 sysctl");
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Validates port mappings: ports non-zero; a hostIP, if given, is one of
/// the node's addresses.
fn validate_port_mappings(
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
type Claim<'a> = (&'a PortMapping, Option<&'a str>);

fn mappings_clash(a: &PortMapping, b: &PortMapping) -> bool {
    let any = |ip: Option<Ipv4Addr>| ip.is_none_or(|i| i.is_unspecified());
    a.protocol == b.protocol
        && a.host_port == b.host_port
        && (any(a.host_ip) || any(b.host_ip) || a.host_ip == b.host_ip)
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

    fn validate(
        &self,
        spec: &EndpointSpec,
        local: &HashSet<Ipv4Addr>,
    ) -> Result<(), EndpointError> {
        validate_container_id(&spec.container_id).map_err(EndpointError::BadRequest)?;
        if let Some(network) = &spec.network {
            validate_network_name(network).map_err(EndpointError::BadRequest)?;
        }
        validate_ifname(&spec.ifname)
            .map_err(|r| EndpointError::BadRequest(format!("ifname {:?}: {r}", spec.ifname)))?;
        if spec.netns.is_empty() {
            return Err(EndpointError::BadRequest("netns is empty".into()));
        }
        if self
            .by_ref
            .contains_key(&(spec.container_id.clone(), spec.ifname.clone()))
        {
            return Err(EndpointError::Conflict(format!(
                "an attachment for container {} interface {} already exists",
                spec.container_id, spec.ifname
            )));
        }
        validate_port_mappings(&spec.port_mappings, local, self.settings.reserved_ports)?;
        parse_routes(&spec.routes)?;
        if spec.port_mappings.is_empty() {
            return Ok(());
        }
        // Indexed by (protocol, hostPort): linear in the mappings, however
        // many a pod or the node carries.
        let mut taken: HashMap<(Protocol, u16), Vec<Claim<'_>>> = HashMap::new();
        for other in self.by_ref.values() {
            for b in &other.port_mappings {
                taken
                    .entry((b.protocol, b.host_port))
                    .or_default()
                    .push((b, Some(other.container_id.as_str())));
            }
        }
        for a in &spec.port_mappings {
            let slot = taken.entry((a.protocol, a.host_port)).or_default();
            if let Some((_, owner)) = slot.iter().find(|(b, _)| mappings_clash(a, b)) {
                return Err(match owner {
                    Some(container) => EndpointError::Conflict(format!(
                        "hostPort {}/{:?} is already mapped to container {container}",
                        a.host_port, a.protocol
                    )),
                    None => EndpointError::BadRequest(format!(
                        "hostPort {}/{:?} is mapped twice in the request",
                        a.host_port, a.protocol
                    )),
                });
            }
            slot.push((a, None));
        }
        Ok(())
    }

    /// Deletes the draining veths matching `pick` right away.
    async fn drain_now(
        &mut self,
        pick: impl Fn(&Drain) -> bool,
        nl: &Netlink,
    ) -> Result<(), EndpointError> {
        let now: Vec<Drain> = self
            .draining
            .values()
            .filter(|d| pick(d))
            .cloned()
            .collect();
        for d in now {
            delete_veth(nl, &d).await?;
            self.drained(&d);
        }
        Ok(())
    }

    /// The requested address (checked) or the next free one.
    fn choose_ip(
        &mut self,
        spec: &EndpointSpec,
        set: &RangeSet,
        dp: &Datapath,
    ) -> Result<Ipv4Addr, IpamError> {
        if let Some(ip) = spec.ip {
            self.ipam
                .check_requested(ip, set, |ip| self.owner_of(ip, dp))?;
            return Ok(ip);
        }
        let by_ref = &self.by_ref;
        let foreign = &self.foreign;
        let draining = &self.draining;
        self.ipam.allocate(set, |ip| {
            if by_ref.values().any(|e| e.ip == ip)
                || foreign.contains(&ip)
                || draining.contains_key(&ip)
            {
                return Some("taken".into());
            }
            matches!(dp.endpoint(ip), Ok(Some(_))).then(|| "map".into())
        })
    }

    /// Creates the attachment. On failure nothing of it remains.
    pub async fn add(
        &mut self,
        spec: EndpointSpec,
        nl: &Netlink,
        dp: &mut Datapath,
        local: &HashSet<Ipv4Addr>,
    ) -> Result<Endpoint, EndpointError> {
        let mut timeline = Timeline::start();
        self.generation += 1;
        self.validate(&spec, local)?;
        let netns_path = PathBuf::from(&spec.netns);
        let netns_file = netns::open(&netns_path)?;
        let set = RangeSet::for_request(&spec.ranges, self.settings.pod_cidr)?;
        // An address held only by a veth still being deleted is reclaimed
        // now rather than refused (requested address, or a full pool).
        if let Some(ip) = spec.ip {
            self.drain_now(|d| d.ip == ip, nl).await?;
        }
        let ip = match self.choose_ip(&spec, &set, dp) {
            Err(IpamError::Exhausted(_)) if !self.draining.is_empty() => {
                self.drain_now(|_| true, nl).await?;
                self.choose_ip(&spec, &set, dp)?
            }
            other => other?,
        };
        let host = host_ifname(&spec.container_id, &spec.ifname);
        let record = Endpoint {
            container_id: spec.container_id.clone(),
            ifname: spec.ifname.clone(),
            network: spec.network.clone(),
            netns: spec.netns.clone(),
            ip,
            mac: String::new(),
            host_ifname: host.clone(),
            host_ifindex: 0,
            host_mac: String::new(),
            mtu: self.settings.mtu,
            gateway: self.settings.gateway,
            state: EndpointState::Pending,
            pod: spec.pod.clone(),
            port_mappings: spec.port_mappings.clone(),
            bandwidth: spec.bandwidth.clone(),
            routes: spec.routes.clone(),
            created: now_secs(),
        };

        let mut rollback = Rollback::default();
        timeline.mark("prepare");
        let result = self
            .plumb(record, netns_file, nl, dp, &mut rollback, timeline)
            .await;
        self.spare.refill();
        match result {
            Ok(ep) => Ok(ep),
            Err(e) => {
                self.by_ref
                    .remove(&(spec.container_id.clone(), spec.ifname.clone()));
                rollback.run(nl, dp, &self.store).await;
                Err(e)
            }
        }
    }

    /// Creates the veth, its pod end directly in the pod's namespace. A
    /// host veth with our derived name but no ready record is a leftover of
    /// a crash between veth creation and persisting: it is ours, deleted and
    /// the creation retried. Otherwise `EEXIST` means the pod already has
    /// an interface of that name, which is left alone. Returns the host end
    /// (as the kernel echoed the creation).
    async fn create_veth(
        &mut self,
        ep: &Endpoint,
        netns_file: &std::fs::File,
        pod_mac: [u8; 6],
        nl: &Netlink,
    ) -> Result<Option<LinkInfo>, EndpointError> {
        let host = &ep.host_ifname;
        for attempt in 0..2 {
            match self
                .sync_nl
                .create_veth(host, &ep.ifname, netns_file, ep.mtu, pod_mac)
            {
                Ok(Some(link)) => return Ok(Some(link)),
                // No echo (kernel before 6.3): looked up instead.
                Ok(None) => return Ok(self.sync_nl.link_by_name(host)?),
                Err(e) if !e.is_exists() => return Err(e.into()),
                Err(_) => {}
            }
            match self.sync_nl.link_by_name(host)? {
                Some(stale) if attempt == 0 => {
                    tracing::warn!(host, "removing leftover veth without a record");
                    match nl.delete_link(stale.index, host).await {
                        Ok(()) => {}
                        Err(e) if e.errno() == Some(libc::ENODEV) => {}
                        Err(e) => return Err(e.into()),
                    }
                    self.draining.retain(|_, d| d.host != *host);
                }
                _ => break,
            }
        }
        Err(EndpointError::Conflict(format!(
            "interface {} already exists in netns {}",
            ep.ifname, ep.netns
        )))
    }

    async fn plumb(
        &mut self,
        mut ep: Endpoint,
        netns_file: std::fs::File,
        nl: &Netlink,
        dp: &mut Datapath,
        rollback: &mut Rollback,
        mut timeline: Timeline,
    ) -> Result<Endpoint, EndpointError> {
        let host = ep.host_ifname.clone();
        // The lease: recorded (on the blocking pool, while the veth is being
        // created) before the ADD can succeed. A crash of the agent keeps it
        // (page cache); a crash of the machine takes the veth and the pod
        // with it, so it is never fsync'ed. A crash before it is written
        // leaves at most a veth no record owns, which reconciliation deletes.
        rollback.record = Some(host.clone());
        self.by_ref
            .insert((ep.container_id.clone(), ep.ifname.clone()), ep.clone());
        let pending = {
            let (store, key, record) = (self.store.clone(), host.clone(), ep.clone());
            tokio::task::spawn_blocking(move || store.save_volatile(&key, &record))
        };
        // The pod side's thread starts now, beside the veth creation.
        let mut pod_side = PodSide::start(
            netns_file
                .try_clone()
                .map_err(|e| EndpointError::Other(format!("duplicating the netns fd: {e}")))?,
            PodPlan {
                ifname: ep.ifname.clone(),
                ip: ep.ip,
                gateway: ep.gateway,
                routes: parse_routes(&ep.routes)?,
            },
            self.spare.take(),
        )?;
        let pod_mac = pod_mac_for(ep.ip);
        let created = self.create_veth(&ep, &netns_file, pod_mac, nl).await;
        timeline.mark("veth");
        if let Ok(Some(link)) = &created {
            rollback.veth = Some((link.index, host.clone()));
        }
        pending
            .await
            .map_err(|e| EndpointError::Other(format!("record writer: {e}")))??;
        self.step("after_reserve", &mut timeline)?;
        let host_link: LinkInfo = created?
            .ok_or_else(|| EndpointError::Other(format!("veth {host} vanished after creation")))?;
        self.step("after_veth", &mut timeline)?;

        // The pod end's sysctls start now, beside the map entry.
        let _ = pod_side.configure.send(host_link.link);

        // The map entry before the program: `from_pod` must find it.
        dp.put_endpoint(
            ep.ip,
            EndpointInfo {
                ifindex: host_link.index,
                flags: entry_flags(&ep),
                mac: pod_mac,
                host_mac: host_link.mac,
            },
        )?;
        rollback.map_ip = Some(ep.ip);
        self.step("after_map", &mut timeline)?;

        // Both ends' IPv6 sysctls, then both ends' netlink batches
        // concurrently (see [`PodSide`] for why no sysctl write overlaps a
        // batch). In tc mode the program is attached in the host side's.
        disable_ipv6(&host);
        timeline.mark("host_sysctls");
        let _ = (&mut pod_side.sysctls_done).await;
        timeline.mark("pod_sysctls");
        let _ = pod_side.proceed.send(());
        let mut batch = Batch::new();
        batch
            .set_up(host_link.index, &host)
            .add_link_route(ep.ip, 32, host_link.index, &host)
            .add_permanent_neighbour(host_link.index, &host, ep.ip, pod_mac);
        let tc_mode = self.settings.attach == AttachMode::Tc;
        if tc_mode {
            let filter = dp.tc_filter(program_names::FROM_POD, Hook::Ingress)?;
            batch.add_clsact(host_link.index, &host).replace_bpf_filter(
                host_link.index,
                &host,
                &filter,
            );
            rollback.link = Some(host.clone());
        }
        let host_side = self.sync_nl.run(batch);
        timeline.mark("host_batch");
        let seen_mac = pod_side
            .done
            .await
            .map_err(|e| EndpointError::Other(format!("pod netns thread: {e}")))??;
        host_side?;
        if let Some(seen_mac) = seen_mac
            && seen_mac != pod_mac
        {
            return Err(EndpointError::Other(format!(
                "{} in the pod has MAC {} instead of {}",
                ep.ifname,
                format_mac(&seen_mac),
                format_mac(&pod_mac)
            )));
        }
        self.step("after_pod_side", &mut timeline)?;
        self.step("after_host_side", &mut timeline)?;

        if !tc_mode {
            dp.attach_with(
                self.settings.attach,
                program_names::FROM_POD,
                &host,
                Hook::Ingress,
            )?;
            rollback.link = Some(host.clone());
        }
        self.step("after_attach", &mut timeline)?;
        for (key, target) in hostport_entries(&ep) {
            dp.put_hostport(key, target)?;
            rollback.hostports.push(key);
        }

        ep.mac = format_mac(&pod_mac);
        ep.host_ifindex = host_link.index;
        ep.host_mac = format_mac(&host_link.mac);
        ep.state = EndpointState::Ready;
        // Like the pending record, not fsync'ed: it must survive a crash of
        // the agent (page cache), and a crash of the machine ends the veth
        // and the pod it describes (start-up reconciliation then releases
        // it, and a record garbled by the crash is ignored).
        self.store.rewrite_volatile(&host, &ep)?;
        timeline.mark("ready_record");
        tracing::debug!(host = %host, timing = %timeline, "endpoint add steps");
        self.by_ref
            .insert((ep.container_id.clone(), ep.ifname.clone()), ep.clone());
        Ok(ep)
    }

    /// Removes the attachment and its lease, waiting for the veth to go.
    /// Returns whether anything existed.
    pub async fn del(
        &mut self,
        r: &EndpointRef,
        nl: &Netlink,
        dp: &mut Datapath,
    ) -> Result<bool, EndpointError> {
        let (existed, drain) = self.del_deferred(r, nl, dp).await?;
        if let Some(d) = drain {
            delete_veth(nl, &d).await?;
            self.drained(&d);
        }
        Ok(existed)
    }

    /// Removes the attachment's map entry, program, record and lease, and
    /// returns the veth still to delete: the caller deletes it (in the
    /// background) and then calls [`Endpoints::drained`]. Until then the
    /// address stays taken. Returns whether anything existed.
    pub async fn del_deferred(
        &mut self,
        r: &EndpointRef,
        nl: &Netlink,
        dp: &mut Datapath,
    ) -> Result<(bool, Option<Drain>), EndpointError> {
        self.generation += 1;
        let host = host_ifname(&r.container_id, &r.ifname);
        let record = self
            .by_ref
            .get(&(r.container_id.clone(), r.ifname.clone()))
            .cloned();
        if record
            .as_ref()
            .is_some_and(|ep| !ep.belongs_to(r.network.as_deref()))
        {
            // Another network's attachment (its veth has the same derived
            // name): not this DEL's to touch.
            return Ok((false, None));
        }
        let mut existed = record.is_some();
        // A veth already being deleted after an earlier DEL is not "there".
        let link = match nl.link_by_name(&host).await? {
            Some(l) if record.is_none() && self.draining.values().any(|d| d.index == l.index) => {
                None
            }
            other => other,
        };
        if let Some(ep) = &record {
            // Only remove the map entry if it points at this attachment's veth
            // (or at nothing we know: a pending record never wrote one).
            let ours = |info: &EndpointInfo| {
                info.ifindex == ep.host_ifindex
                    || link.as_ref().is_some_and(|l| l.index == info.ifindex)
            };
            if dp.endpoint(ep.ip)?.is_some_and(|info| ours(&info)) {
                dp.remove_endpoint(ep.ip)?;
            }
            remove_hostports(dp, ep)?;
        }
        existed |= dp.detach(&host, Hook::Ingress)?;
        let drain = match (&link, &record) {
            (Some(l), Some(ep)) => Some(Drain {
                ip: ep.ip,
                host: host.clone(),
                index: l.index,
            }),
            // A veth without a record (a crash leftover): delete it now.
            (Some(l), None) => {
                delete_veth(
                    nl,
                    &Drain {
                        ip: Ipv4Addr::UNSPECIFIED,
                        host: host.clone(),
                        index: l.index,
                    },
                )
                .await?;
                None
            }
            (None, _) => None,
        };
        existed |= link.is_some();
        if let Some(d) = &drain {
            self.draining.insert(d.ip, d.clone());
        }
        self.store.remove(&host)?;
        self.by_ref
            .remove(&(r.container_id.clone(), r.ifname.clone()));
        Ok((existed, drain))
    }

    /// The veth of `d` is gone: its address may be handed out again.
    pub fn drained(&mut self, d: &Drain) {
        self.generation += 1;
        if self.draining.get(&d.ip) == Some(d) {
            self.draining.remove(&d.ip);
        }
    }

    /// Verifies every resource of an attachment (CNI CHECK). The error names
    /// the first one missing.
    pub async fn check(
        &self,
        c: &EndpointCheck,
        nl: &Netlink,
        dp: &Datapath,
    ) -> Result<(), EndpointError> {
        let missing = |m: String| Err(EndpointError::Missing(m));
        let Some(ep) = self
            .by_ref
            .get(&(c.container_id.clone(), c.ifname.clone()))
            .filter(|ep| ep.belongs_to(c.network.as_deref()))
        else {
            return missing(format!(
                "no lease for container {} interface {}{}",
                c.container_id,
                c.ifname,
                c.network
                    .as_deref()
                    .map(|n| format!(" in network {n}"))
                    .unwrap_or_default()
            ));
        };
        if ep.state != EndpointState::Ready {
            return missing(format!(
                "the attachment of container {} is incomplete (pending)",
                c.container_id
            ));
        }
        if let Some(ip) = c.ip
            && ip != ep.ip
        {
            return missing(format!(
                "address mismatch: the previous result has {ip}, the lease has {}",
                ep.ip
            ));
        }
        let host = &ep.host_ifname;
        match nl.link_by_name(host).await? {
            Some(l) if l.index == ep.host_ifindex => {}
            _ => return missing(format!("host veth {host} is missing")),
        }
        let routes = nl.ipv4_routes().await?;
        if !routes
            .iter()
            .any(|r| r.dst == ep.ip && r.prefix == 32 && r.oif == Some(ep.host_ifindex))
        {
            return missing(format!("host route {}/32 dev {host} is missing", ep.ip));
        }
        let want = self.map_entry(ep)?;
        if dp.endpoint(ep.ip)? != Some(want) {
            return missing(format!(
                "endpoint map entry for {} is missing or stale",
                ep.ip
            ));
        }
        if self.settings.attach == AttachMode::Tcx {
            let pin = dp.layout().link(host, Hook::Ingress);
            if !pin.exists() {
                return missing(format!("link pin {} is missing", pin.display()));
            }
        }
        let prog = dp.program_id(program_names::FROM_POD)?;
        if !self.attached_ids(ep, nl, dp).await?.contains(&prog) {
            return missing(format!(
                "program from_pod is not attached to {host} (ingress)"
            ));
        }
        let path = PathBuf::from(&ep.netns);
        if !path.exists() {
            return missing(format!("pod netns {} is missing", ep.netns));
        }
        let (ifname, ip, gateway) = (ep.ifname.clone(), ep.ip, ep.gateway);
        let extra = parse_routes(&ep.routes)?;
        in_netns(path, move |nl| {
            check_pod_side(nl, ifname, ip, gateway, extra)
        })
        .await
    }

    /// Programs attached to the endpoint's host veth ingress, by the
    /// configured mechanism.
    pub async fn attached_ids(
        &self,
        ep: &Endpoint,
        nl: &Netlink,
        dp: &Datapath,
    ) -> Result<Vec<u32>, EndpointError> {
        Ok(match self.settings.attach {
            AttachMode::Tcx => dp.attached_ids(&ep.host_ifname, Hook::Ingress)?,
            AttachMode::Tc => nl.tc_bpf_prog_ids(ep.host_ifindex, true).await?,
        })
    }

    fn map_entry(&self, ep: &Endpoint) -> Result<EndpointInfo, EndpointError> {
        let (Some(mac), Some(host_mac)) = (parse_mac(&ep.mac), parse_mac(&ep.host_mac)) else {
            return Err(EndpointError::Other(format!(
                "record of {} has invalid MACs",
                ep.host_ifname
            )));
        };
        Ok(EndpointInfo {
            ifindex: ep.host_ifindex,
            flags: entry_flags(ep),
            mac,
            host_mac,
        })
    }

    /// CNI GC of one network: removes every attachment recorded with
    /// `network` that is not in `valid`, and every `rv…` veth that no
    /// record owns. Attachments of other networks and those recorded
    /// without a network (agent API, older records) are left alone.
    /// Returns what was removed.
    pub async fn gc(
        &mut self,
        network: &str,
        valid: &[EndpointRef],
        nl: &Netlink,
        dp: &mut Datapath,
    ) -> Result<Vec<EndpointRef>, EndpointError> {
        validate_network_name(network).map_err(EndpointError::BadRequest)?;
        self.generation += 1;
        let keep: HashSet<(String, String)> = valid
            .iter()
            .map(|r| (r.container_id.clone(), r.ifname.clone()))
            .collect();
        let doomed: Vec<EndpointRef> = self
            .by_ref
            .values()
            .filter(|e| e.network.as_deref() == Some(network))
            .filter(|e| !keep.contains(&(e.container_id.clone(), e.ifname.clone())))
            .map(Endpoint::reference)
            .collect();
        let mut first_error = None;
        for r in &doomed {
            if let Err(e) = self.del(r, nl, dp).await {
                tracing::warn!(container = %r.container_id, error = %e, "gc");
                first_error.get_or_insert(e);
            }
        }
        let owned: HashSet<String> = self
            .by_ref
            .values()
            .map(|e| e.host_ifname.clone())
            .collect();
        for link in nl.links().await? {
            if is_rivet_veth(&link.name) && !owned.contains(&link.name) {
                tracing::info!(veth = %link.name, "gc: removing a veth no record owns");
                if let Err(e) = nl.delete_link(link.index, &link.name).await
                    && e.errno() != Some(libc::ENODEV)
                {
                    first_error.get_or_insert(e.into());
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(doomed),
        }
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

    /// The host veths (ifindex) whose tc attachment a periodic
    /// reconciliation should probe; empty in TCX mode (pins tell).
    pub fn tc_probe_targets(&self) -> Vec<u32> {
        if self.settings.attach != AttachMode::Tc {
            return Vec::new();
        }
        self.by_ref
            .values()
            .filter(|e| e.state == EndpointState::Ready)
            .map(|e| e.host_ifindex)
            .collect()
    }

    pub async fn reconcile(
        &mut self,
        nl: &Netlink,
        dp: &mut Datapath,
        reattach: Reattach<'_>,
        keep_links: &[String],
        local: &HashSet<Ipv4Addr>,
        prefetched: Option<(u64, Vec<LinkInfo>)>,
    ) -> Result<(), EndpointError> {
        let mut timeline = Timeline::start();
        // A dump taken without the state lock is used only if nothing
        // changed since (then it is exactly what a dump now would say).
        let links = match prefetched {
            Some((generation, links)) if generation == self.generation => links,
            _ => nl.links().await?,
        };
        let links: BTreeMap<String, LinkInfo> =
            links.into_iter().map(|l| (l.name.clone(), l)).collect();
        timeline.mark("links");
        if !self.unreadable.is_empty() {
            self.rebuild_unreadable(&links, dp)?;
        }

        let records: Vec<Endpoint> = self.by_ref.values().cloned().collect();
        for ep in records {
            let live = links
                .get(&ep.host_ifname)
                .is_some_and(|l| l.index == ep.host_ifindex);
            if ep.state == EndpointState::Pending || !live {
                tracing::info!(
                    container = %ep.container_id,
                    ip = %ep.ip,
                    state = ?ep.state,
                    "releasing an interrupted or vanished attachment"
                );
                self.del(&ep.reference(), nl, dp).await?;
                continue;
            }
            let want = self.map_entry(&ep)?;
            if dp.endpoint(ep.ip)? != Some(want) {
                tracing::info!(ip = %ep.ip, "restoring endpoint map entry");
                dp.put_endpoint(ep.ip, want)?;
            }
            let attach = match reattach {
                Reattach::All => true,
                Reattach::Missing(_) if self.settings.attach == AttachMode::Tcx => {
                    !dp.layout().link(&ep.host_ifname, Hook::Ingress).exists()
                }
                // Not probed (added since): ADD attached it.
                Reattach::Missing(probed) => probed.get(&ep.host_ifindex) == Some(&false),
            };
            if attach {
                dp.attach_with(
                    self.settings.attach,
                    program_names::FROM_POD,
                    &ep.host_ifname,
                    Hook::Ingress,
                )?;
            }
        }

        timeline.mark("records");
        let wanted: HashMap<HostPortKey, HostPortTarget> = self
            .by_ref
            .values()
            .filter(|e| e.state == EndpointState::Ready)
            .flat_map(hostport_entries)
            .collect();
        let present: HashMap<HostPortKey, HostPortTarget> =
            dp.list_hostports()?.into_iter().collect();
        for (key, target) in &present {
            if wanted.get(key) != Some(target) {
                dp.remove_hostport(*key)?;
            }
        }
        for (key, target) in &wanted {
            if present.get(key) != Some(target) {
                tracing::info!(port = u16::from_be(key.port), "restoring a hostPort");
                dp.put_hostport(*key, *target)?;
            }
        }
        let known: HashSet<Ipv4Addr> = self.by_ref.values().map(|e| e.ip).collect();
        for (ip, _) in dp.list_endpoints()? {
            if !known.contains(&ip) {
                tracing::info!(%ip, "removing map entry without an endpoint record");
                dp.remove_endpoint(ip)?;
            }
        }
        let hosts: HashSet<&str> = self
            .by_ref
            .values()
            .map(|e| e.host_ifname.as_str())
            .collect();
        for link in dp.links()? {
            if !hosts.contains(link.interface.as_str()) && !keep_links.contains(&link.interface) {
                tracing::info!(interface = %link.interface, "removing link pin without an endpoint");
                dp.detach(&link.interface, link.hook)?;
            }
        }

        // Pod veths no record owns (a crash between DEL and the background
        // deletion, or before a pending record was written) are ours by
        // name: remove them.
        let owned: HashSet<&str> = self
            .by_ref
            .values()
            .map(|e| e.host_ifname.as_str())
            .chain(self.draining.values().map(|d| d.host.as_str()))
            .collect();
        timeline.mark("map_and_pins");
        let orphans: Vec<Drain> = links
            .values()
            .filter(|l| is_rivet_veth(&l.name) && !owned.contains(l.name.as_str()))
            .map(|l| Drain {
                ip: Ipv4Addr::UNSPECIFIED,
                host: l.name.clone(),
                index: l.index,
            })
            .collect();
        for d in orphans {
            tracing::info!(veth = %d.host, "removing a pod veth no record owns");
            delete_veth(nl, &d).await?;
        }

        // Addresses in use on the node that are not our pods: node addresses
        // and /32 routes through devices other than our veths.
        let ours: HashSet<u32> = self.by_ref.values().map(|e| e.host_ifindex).collect();
        let mut foreign: HashSet<Ipv4Addr> = local.clone();
        for r in nl.ipv4_routes().await? {
            if r.prefix == 32 && r.oif.is_some_and(|o| !ours.contains(&o)) {
                foreign.insert(r.dst);
            }
        }
        self.foreign = foreign;
        timeline.mark("orphans_and_routes");
        tracing::debug!(timing = %timeline, "endpoint reconciliation steps");
        Ok(())
    }
}

impl Endpoints {
    /// Rebuilds records that did not parse (a torn or corrupted file) from
    /// what the kernel holds: the live host veth named by the file (index,
    /// MTU), the endpoints map entry on that veth (address, both MACs) and
    /// the hostPorts pointing at that address. The container ID, ifname
    /// and netns are recovered from the damaged text and accepted only if
    /// they name exactly this veth (`host_ifname(container, ifname)` is the
    /// file's name). What cannot be rebuilt is left to the usual cleanup.
    fn rebuild_unreadable(
        &mut self,
        links: &BTreeMap<String, LinkInfo>,
        dp: &mut Datapath,
    ) -> Result<(), EndpointError> {
        let entries = dp.list_endpoints()?;
        let hostports = dp.list_hostports()?;
        for (key, path) in std::mem::take(&mut self.unreadable) {
            let text =
                String::from_utf8_lossy(&std::fs::read(&path).unwrap_or_default()).into_owned();
            let field = |name: &str| json_string_field(&text, name);
            let (Some(container_id), Some(ifname)) = (field("container_id"), field("ifname"))
            else {
                tracing::warn!(record = %key, "unreadable record names no container: its pod is cleaned up");
                continue;
            };
            if rivet_api::host_ifname(&container_id, &ifname) != key {
                tracing::warn!(record = %key, %container_id, "unreadable record does not match its name: its pod is cleaned up");
                continue;
            }
            let Some(link) = links.get(&key) else {
                tracing::warn!(record = %key, "unreadable record of a veth that is gone");
                continue;
            };
            let Some((ip, info)) = entries.iter().find(|(_, i)| i.ifindex == link.index) else {
                tracing::warn!(record = %key, "unreadable record of a veth without a map entry");
                continue;
            };
            let pod_ip = ipv4_key(ip.octets());
            let port_mappings = hostports
                .iter()
                .filter(|(_, t)| t.pod_ip == pod_ip)
                .map(|(k, t)| PortMapping {
                    host_port: u16::from_be(k.port),
                    container_port: u16::from_be(t.port),
                    protocol: if k.proto == 17 {
                        Protocol::Udp
                    } else {
                        Protocol::Tcp
                    },
                    host_ip: (k.addr != 0)
                        .then(|| Ipv4Addr::from(rivet_common::ipv4_from_key(k.addr))),
                })
                .collect();
            let ep = Endpoint {
                container_id,
                ifname,
                network: None,
                netns: field("netns").unwrap_or_default(),
                ip: *ip,
                mac: format_mac(&info.mac),
                host_ifname: key.clone(),
                host_ifindex: link.index,
                host_mac: format_mac(&info.host_mac),
                mtu: link.mtu,
                gateway: self.settings.gateway,
                state: EndpointState::Ready,
                pod: None,
                port_mappings,
                bandwidth: None,
                routes: Vec::new(),
                created: now_secs(),
            };
            self.store.save(&key, &ep)?;
            tracing::warn!(record = %key, container = %ep.container_id, ip = %ep.ip, "endpoint record rebuilt from the datapath");
            self.by_ref
                .insert((ep.container_id.clone(), ep.ifname.clone()), ep);
            self.generation += 1;
        }
        Ok(())
    }
}

/// The value of the JSON string field `"name": "…"` in possibly damaged
/// JSON text (the first occurrence; simple escapes only).
fn json_string_field(text: &str, name: &str) -> Option<String> {
    let at = text.find(&format!("\"{name}\""))? + name.len() + 2;
    let rest = text[at..].trim_start().strip_prefix(':')?.trim_start();
    let body = rest.strip_prefix('"')?;
    let mut out = String::new();
    let mut chars = body.chars();
    loop {
        match chars.next()? {
            '"' => return Some(out),
            '\\' => out.push(chars.next()?),
            c => out.push(c),
        }
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
    use rivet_api::Protocol;

    #[test]
    fn string_fields_are_recovered_from_damaged_json() {
        let torn = r#"{
  "container_id": "abc\"d",
  "ifname": "eth0",
  "netns": "/run/netns/x",
  "ip": "10.0"#;
        assert_eq!(
            json_string_field(torn, "container_id").as_deref(),
            Some("abc\"d")
        );
        assert_eq!(json_string_field(torn, "ifname").as_deref(), Some("eth0"));
        assert_eq!(
            json_string_field(torn, "netns").as_deref(),
            Some("/run/netns/x")
        );
        assert_eq!(json_string_field(torn, "mac"), None);
        assert_eq!(
            json_string_field(r#"{"ifname": "et"#, "ifname"),
            None,
            "cut inside the value"
        );
        assert_eq!(json_string_field("garbage", "ifname"), None);
    }

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
