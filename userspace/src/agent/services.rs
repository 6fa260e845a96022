//! The node's Services: the stored `Service` and `EndpointSlice` objects
//! planned for this node and written into the Service maps
//! ([`crate::services`]). Runs with the node state locked: before a change
//! of the objects is committed (a change the maps cannot hold is refused
//! whole, nothing written), after the node's pods change (an endpoint
//! without `nodeName` is local when it is one of them) and at start-up.

use std::{collections::HashSet, net::Ipv4Addr};

use rivet_api::{ApiError, ErrorKind};

use crate::{
    datapath::Datapath,
    endpoint::Endpoints,
    objects::ObjectSet,
    services::{Changes, NodeView, Plan, ServiceError, Services},
};

use super::{Agent, NodeState};

/// The plan of `objects`' Services on node `node_name` with these pods.
pub(super) fn plan_for(node_name: &str, endpoints: &Endpoints, objects: &ObjectSet) -> Plan {
    let pods: HashSet<Ipv4Addr> = endpoints.list().iter().map(|e| e.ip).collect();
    let is_local_pod = |ip: Ipv4Addr| pods.contains(&ip);
    let node = NodeView {
        name: node_name,
        is_local_pod: &is_local_pod,
    };
    Services::plan(objects.services(), objects.endpoint_slices(), &node)
}

/// Checks `plan` against the maps' capacity and writes it; nothing is
/// written when it does not fit.
pub(super) fn sync(
    services: &mut Services,
    dp: &mut Datapath,
    plan: Plan,
) -> Result<Changes, ServiceError> {
    services.check(&plan)?;
    let changes = services.sync(dp, plan)?;
    tracing::debug!(?changes, "services synced");
    Ok(changes)
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
    ) -> Result<Changes, ServiceError> {
        let plan = plan_for(&self.cfg.node_name, &state.endpoints, objects);
        let NodeState { dp, services, .. } = state;
        sync(services, dp, plan)
    }

    /// After the node's pods changed: the Services again when an endpoint
    /// without `nodeName` exists (its locality is its address being one of
    /// the node's pods). Endpoints with `nodeName` need nothing: a new pod
    /// at a backend's address gets its endpoint flag from the datapath's
    /// set. A failure is logged: the pod's own change stands.
    pub fn pods_changed(&self, state: &mut NodeState) {
        let objects = state.objects.objects().clone();
        let by_address = objects
            .endpoint_slices()
            .any(|s| s.endpoints.iter().any(|e| e.node_name.is_none()));
        if !by_address {
            return;
        }
        if let Err(e) = self.sync_services(state, &objects) {
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
