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
