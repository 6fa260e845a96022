//! Kubernetes Services without kube-proxy: the stored `Service` and
//! `EndpointSlice` objects become the datapath's Service maps.
//!
//! - `plan.rs`: the objects → frontends, backend groups, health-check ports
//!   (Kubernetes' rules; pure);
//! - `sync.rs`: the plan → `SVC_FRONTENDS` / `SVC_BACKENDS` / `SVC_STATS`,
//!   changing only what differs, in an order that never shows a program a
//!   half-made Service; capacity checked before anything is written.
//!
//! The datapath (`ebpf/src/service.rs`, `sock.rs`, `nat.rs`) translates at
//! the socket for pods and the node, and per flow at the uplink for
//! NodePorts and external addresses. The agent runs [`Services::sync`]
//! after every change of the objects (before the change is committed, so
//! a change the maps cannot hold is refused whole) and of the node's
//! endpoints (local backends).

pub mod plan;
pub mod sync;

use std::{collections::BTreeSet, net::Ipv4Addr};

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};

use crate::datapath::{Datapath, DatapathError};

pub use plan::{Backend, FrontendKey, FrontendKind, GroupKey, HealthCheck, NodeView, Plan};
pub use sync::{Capacity, Changes, Synced};

/// Service errors.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// A map cannot hold what the objects ask for; nothing was written.
    #[error(
        "{map} would need {needed} entries but holds {capacity}: raise `{key}` (and run `rivetd unload` to resize pinned maps)"
    )]
    Full {
        /// The map.
        map: &'static str,
        /// The configuration key that sizes it.
        key: &'static str,
        /// Entries needed.
        needed: usize,
        /// Its capacity.
        capacity: u32,
    },
    /// A map operation failed.
    #[error(transparent)]
    Datapath(#[from] DatapathError),
}

/// The node's Services: what was planned and what the maps hold.
#[derive(Debug)]
pub struct Services {
    synced: Synced,
    plan: Plan,
}

impl Services {
    /// Reads back what the maps hold (kept across agent restarts).
    pub fn load(dp: &mut Datapath, capacity: Capacity) -> Result<Self, ServiceError> {
        Ok(Self {
            synced: Synced::load(dp, capacity)?,
            plan: Plan::default(),
        })
    }

    /// The plan for these objects on this node.
    pub fn plan<'a>(
        services: impl IntoIterator<Item = &'a Service>,
        slices: impl IntoIterator<Item = &'a EndpointSlice>,
        node: &NodeView<'_>,
    ) -> Plan {
        plan::plan(services, slices, node)
    }

    /// Whether the maps can hold `plan` (nothing written). A refusal is
    /// counted as the map's (`rivet_map_full_refusals_total`, status).
    pub fn check(&self, plan: &Plan) -> Result<(), ServiceError> {
        let checked = self.synced.check(plan);
        if let Err(ServiceError::Full { map, .. }) = &checked {
            crate::datapath::note_map_full(map);
        }
        checked
    }

    /// Makes the maps hold `plan`, and the endpoint flags of the backends
    /// reachable at the uplink.
    pub fn sync(&mut self, dp: &mut Datapath, plan: Plan) -> Result<Changes, ServiceError> {
        let changes = self.synced.apply(dp, &plan)?;
        let uplink: BTreeSet<Ipv4Addr> = plan.uplink_backends.clone();
        dp.set_service_backends(uplink)?;
        self.plan = plan;
        Ok(changes)
    }

    /// The plan last synced.
    pub fn current(&self) -> &Plan {
        &self.plan
    }

    /// The backends a group holds, in slot order.
    pub fn group(&self, gk: &GroupKey) -> Option<&[Backend]> {
        self.synced.group(gk)
    }

    /// The id (counter slot) of a Service port.
    pub fn id(&self, port: &plan::PortRef) -> Option<u32> {
        self.synced.id(port)
    }

    /// (frontend entries, backend entries) in the maps.
    pub fn fill(&self) -> (usize, usize) {
        (
            self.synced.frontend_entries(),
            self.synced.backend_entries(),
        )
    }
}
