//! The node's Services: the stored `Service` and `EndpointSlice` objects
//! planned for this node and written into the Service maps
//! ([`crate::services`]). Runs with the node state locked: before a change
//! of the objects is committed (a change the maps cannot hold is refused
//! whole, nothing written), after the node's pods change (an endpoint
//! without `nodeName` is local when it is one of them) and at start-up.

use std::{
    collections::{BTreeSet, HashSet},
    net::Ipv4Addr,
    path::PathBuf,
};

use rivet_api::{ApiError, ErrorKind};
use rivet_common::ipv4_key;

use crate::{
    datapath::Datapath,
    endpoint::Endpoints,
    events::ServiceNames,
    netlink::{netns, sock_diag},
    objects::ObjectSet,
    services::{Backend, Changes, NodeView, Plan, ServiceError, ServiceRefs, Services},
};

/// IP protocol number of UDP.
const IPPROTO_UDP: u8 = 17;

use super::{Agent, NodeState};

/// Makes the Service maps hold `objects`' Services on node `node_name`
/// with these pods (see [`Services::update`]).
pub(super) fn update(
    services: &mut Services,
    dp: &mut Datapath,
    node_name: &str,
    endpoints: &Endpoints,
    (objects, touched): (&ObjectSet, Option<&ServiceRefs>),
    pods_changed: bool,
) -> Result<Changes, ServiceError> {
    let pods: HashSet<Ipv4Addr> = endpoints.list().iter().map(|e| e.ip).collect();
    let by_address = |ip: Ipv4Addr| pods.contains(&ip);
    let node = NodeView {
        name: node_name,
        is_local_pod: &by_address,
    };
    let changes = services.update(dp, objects, touched, &node, pods_changed)?;
    tracing::debug!(?changes, "services synced");
    Ok(changes)
}

/// The names events are labelled with: every frontend and backend of
/// `plan` → `namespace/name:port`.
pub(super) fn names_of(plan: &Plan) -> ServiceNames {
    let mut names = ServiceNames::default();
    for (gk, backends) in &plan.groups {
        let p = &gk.port;
        let name = if p.port_name.is_empty() {
            format!("{}/{}", p.namespace, p.name)
        } else {
            format!("{}/{}:{}", p.namespace, p.name, p.port_name)
        };
        for b in backends {
            names
                .backends
                .entry((b.addr, b.port, p.proto.number()))
                .or_insert_with(|| name.clone());
        }
    }
    for (fk, fe) in &plan.frontends {
        let p = &fe.group.port;
        let name = if p.port_name.is_empty() {
            format!("{}/{}", p.namespace, p.name)
        } else {
            format!("{}/{}:{}", p.namespace, p.name, p.port_name)
        };
        names
            .frontends
            .insert((fk.addr, fk.port, fk.proto.number()), name);
    }
    names
}

/// UDP backends that left their Services: the uplink flows held by them
/// are forgotten (the client's next datagram chooses again) and the
/// connected UDP sockets of the node and its pods that the socket hooks
/// sent to them are aborted (their next call fails with `ECONNABORTED`, as
/// Cilium destroys them): nothing stays stuck on a gone backend. Failures
/// are logged; the change of the Services stands.
fn move_udp_off(state: &mut NodeState, removed: &BTreeSet<Backend>) {
    let wire: HashSet<(u32, u16)> = removed
        .iter()
        .map(|b| (ipv4_key(b.addr.octets()), b.port.to_be()))
        .collect();
    match state.dp.forget_service_flows(IPPROTO_UDP, &wire) {
        Ok(n) if n > 0 => {
            tracing::info!(flows = n, "UDP Service flows to removed backends forgotten")
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "forgetting UDP Service flows to removed backends"),
    }
    let targets: HashSet<(Ipv4Addr, u16)> = removed.iter().map(|b| (b.addr, b.port)).collect();
    let mut places: Vec<Option<PathBuf>> = vec![None];
    places.extend(
        state
            .endpoints
            .list()
            .into_iter()
            .map(|e| Some(PathBuf::from(e.netns))),
    );
    let mut aborted = 0usize;
    for place in places {
        let found = match &place {
            None => sock_diag::connected_to(&targets).map_err(|e| e.to_string()),
            Some(path) => netns::run_in(path, || sock_diag::connected_to(&targets))
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string())),
        };
        let sockets = match found {
            Ok(sockets) => sockets,
            Err(e) => {
                tracing::debug!(netns = ?place, error = %e, "listing UDP sockets");
                continue;
            }
        };
        for sock in sockets {
            let (addr, port) = (ipv4_key(sock.dst.0.octets()), sock.dst.1.to_be());
            if !state.dp.socket_translated(sock.cookie, addr, port) {
                continue;
            }
            let done = match &place {
                None => sock_diag::destroy(&sock),
                Some(path) => netns::run_in(path, || sock_diag::destroy(&sock))
                    .map_err(std::io::Error::other)
                    .and_then(|r| r),
            };
            match done {
                Ok(()) => aborted += 1,
                Err(e) => tracing::warn!(netns = ?place, error = %e, "aborting a UDP socket"),
            }
        }
    }
    if aborted > 0 {
        tracing::info!(
            sockets = aborted,
            "connected UDP sockets to removed backends aborted"
        );
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        let kind = match e {
            ServiceError::Full { .. } => ErrorKind::Exhausted,
            ServiceError::Datapath(_) => ErrorKind::Internal,
        };
        ApiError::new(kind, e.to_string())
    }
}

impl Agent {
    /// Makes the Service maps hold `objects`' Services.
    pub(super) fn sync_services(
        &self,
        state: &mut NodeState,
        objects: &ObjectSet,
        touched: Option<&ServiceRefs>,
    ) -> Result<Changes, ServiceError> {
        self.update_services(state, Some(objects), touched, false)
    }

    /// [`update`] with the staged objects, or the stored ones.
    fn update_services(
        &self,
        state: &mut NodeState,
        staged: Option<&ObjectSet>,
        touched: Option<&ServiceRefs>,
        pods_changed: bool,
    ) -> Result<Changes, ServiceError> {
        let NodeState {
            dp,
            services,
            endpoints,
            objects: store,
            ..
        } = state;
        let objects = staged.unwrap_or_else(|| store.objects());
        let changes = update(
            services,
            dp,
            &self.cfg.node_name,
            endpoints,
            (objects, touched),
            pods_changed,
        )?;
        if !changes.removed_udp.is_empty() {
            move_udp_off(state, &changes.removed_udp);
        }
        if changes != Changes::default() {
            if self.events.watched() {
                self.events
                    .set_service_names(names_of(state.services.current()));
            } else {
                self.events.names_stale();
            }
        }
        Ok(changes)
    }

    /// Brings the Service names events are labelled with up to date, if
    /// the Services changed since they were made.
    pub async fn refresh_service_names(&self) {
        if self.events.names_are_stale() {
            let names = names_of(self.lock().await.services.current());
            self.events.set_service_names(names);
        }
    }

    /// After the node's pods changed: the Services again when an endpoint
    /// without `nodeName` exists (its locality is its address being one of
    /// the node's pods). Endpoints with `nodeName` need nothing: a new pod
    /// at a backend's address gets its endpoint flag from the datapath's
    /// set. A failure is logged: the pod's own change stands.
    pub fn pods_changed(&self, state: &mut NodeState) {
        if !state.services.placed_by_address() {
            return;
        }
        if let Err(e) = self.update_services(state, None, None, true) {
            tracing::warn!(error = %e, "services not synced after a pod change");
        }
    }
}

/// The `healthCheckNodePort`s of the Services this node serves
/// (`Plan::health`), for the server's health-check listeners: published
/// after every sync, and the ports their listeners could not bind.
#[derive(Debug)]
pub(super) struct HealthPorts {
    wanted: tokio::sync::watch::Sender<Vec<crate::services::HealthCheck>>,
    unbound: std::sync::Mutex<std::collections::BTreeMap<u16, String>>,
}

impl HealthPorts {
    /// Starts with the health checks of the plan synced at start.
    pub(super) fn new(health: Vec<crate::services::HealthCheck>) -> Self {
        Self {
            wanted: tokio::sync::watch::Sender::new(health),
            unbound: std::sync::Mutex::default(),
        }
    }
}

impl Agent {
    /// The health checks to serve, as the last sync planned them; the
    /// receiver sees each change.
    pub fn health_checks(&self) -> tokio::sync::watch::Receiver<Vec<crate::services::HealthCheck>> {
        self.health.wanted.subscribe()
    }

    /// Publishes the health checks of the plan last synced (after a change
    /// of the objects or of the node's pods); receivers wake only when
    /// they differ.
    pub fn publish_health_checks(&self, state: &NodeState) {
        let health = &state.services.current().health;
        self.health.wanted.send_if_modified(|held| {
            let changed = held != health;
            if changed {
                held.clone_from(health);
            }
            changed
        });
    }

    /// Records whether the listener of health-check `port` is bound
    /// (`Err`: why not; shown in the status' warnings until it is, or
    /// until the port is no longer wanted: `Ok`).
    pub fn health_check_bound(&self, port: u16, bound: Result<(), String>) {
        let mut unbound = match self.health.unbound.lock() {
            Ok(u) => u,
            Err(e) => e.into_inner(),
        };
        match bound {
            Ok(()) => unbound.remove(&port),
            Err(why) => unbound.insert(port, why),
        };
    }

    /// One warning per health-check port that could not be bound.
    pub(super) fn health_check_warnings(&self) -> Vec<String> {
        let unbound = match self.health.unbound.lock() {
            Ok(u) => u,
            Err(e) => e.into_inner(),
        };
        unbound
            .iter()
            .map(|(port, why)| format!("healthCheckNodePort {port} is not served: {why}"))
            .collect()
    }
}
