//! The pod side: work run on a thread inside the pod's network namespace
//! (addresses, routes, loopback), with a spare thread started ahead.
//!
//! The pod's `eth0` holds `podIP/32`, with `169.254.1.1 dev eth0 scope link`
//! (the gateway, answered by `from_pod`'s ARP) and `default via 169.254.1.1`;
//! IPv6 is disabled (`disable_ipv6=1`, `accept_ra=0`, `accept_dad=0`), so pods
//! emit no ND/MLD/RS noise.
//!
//! The thread is a spare started after the previous ADD (on the blocking pool,
//! so in the agent's namespace) that runs one pod side and exits — no thread
//! ever returns from a pod namespace; a new thread when no spare is ready.

use std::{net::Ipv4Addr, path::PathBuf};

use ipnet::Ipv4Net;

use super::{EndpointError, Timeline, plumbing::disable_ipv6};
use crate::netlink::{
    Netlink,
    batch::{Batch, SyncNetlink},
    messages::LOOPBACK_IFINDEX,
    netns,
};

/// Runs `f` with a netlink socket inside the namespace at `path`, on a
/// dedicated thread with its own single-threaded runtime.
pub(super) async fn in_netns<T, F, Fut>(path: PathBuf, f: F) -> Result<T, EndpointError>
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
pub(super) struct PodSide {
    pub(super) configure: std::sync::mpsc::Sender<Option<u32>>,
    pub(super) proceed: std::sync::mpsc::Sender<()>,
    pub(super) sysctls_done: tokio::sync::oneshot::Receiver<()>,
    pub(super) done: tokio::sync::oneshot::Receiver<Result<PodDone, EndpointError>>,
}

/// What the pod side found: the pod end's MAC (when it had to look the
/// link up) and the pod namespace's cookie (`SO_NETNS_COOKIE`: the socket
/// hooks translate Services for that namespace's sockets).
pub(super) struct PodDone {
    pub(super) mac: Option<[u8; 6]>,
    pub(super) netns_cookie: u64,
}

/// What the pod side needs to know about the pod.
pub(super) struct PodPlan {
    pub(super) ifname: String,
    pub(super) ip: Ipv4Addr,
    pub(super) gateway: Ipv4Addr,
    pub(super) routes: Vec<Ipv4Net>,
}

/// One pod side's work, run by a [`SpareThread`] or a fresh thread.
pub(super) type PodJob = Box<dyn FnOnce() + Send>;

/// A thread started ahead of need, in the agent's namespace, that runs one
/// [`PodJob`] and exits (its namespace switch never leaks). Taking it
/// instead of spawning keeps thread creation, and on a loaded machine the
/// scheduling delay of a new thread, off the ADD path.
pub(super) struct SpareThread {
    job: std::sync::mpsc::Sender<PodJob>,
}

impl SpareThread {
    pub(super) fn spawn() -> std::io::Result<Self> {
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
pub(super) struct SpareSlot(std::sync::Arc<std::sync::Mutex<Option<SpareThread>>>);

impl SpareSlot {
    pub(super) fn take(&self) -> Option<SpareThread> {
        self.0.lock().ok().and_then(|mut s| s.take())
    }

    pub(super) fn refill(&self) {
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
    pub(super) fn start(
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
pub(super) fn configure_pod_side(
    plan: &PodPlan,
    spawned: std::time::Instant,
    configure: &std::sync::mpsc::Receiver<Option<u32>>,
    sysctls_done: tokio::sync::oneshot::Sender<()>,
    proceed: &std::sync::mpsc::Receiver<()>,
) -> Result<PodDone, EndpointError> {
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
    let netns_cookie = crate::datapath::sockhooks::netns_cookie()
        .map_err(|e| EndpointError::Other(format!("in the pod netns: {e}")))?;
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
    Ok(PodDone { mac, netns_cookie })
}

/// Verifies the pod end for CHECK; the error names what is missing.
pub(super) async fn check_pod_side(
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
pub(super) fn parse_routes(routes: &[String]) -> Result<Vec<Ipv4Net>, EndpointError> {
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
