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

use std::{
    borrow::Cow,
    collections::{BTreeMap, HashMap, HashSet},
    net::Ipv4Addr,
    sync::Arc,
};

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};

use crate::{
    datapath::{Datapath, DatapathError},
    objects::{Kind, Object, ObjectKey, ObjectSet},
};

/// Services by (namespace, name).
pub type ServiceRefs = std::collections::BTreeSet<(String, String)>;

pub use plan::{
    Backend, Frontend, FrontendKey, FrontendKind, GroupKey, HealthCheck, NodeView, Plan,
};
pub use sync::{Capacity, Changes, Delta, Synced};

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
///
/// The plan is kept per Service ([`Part`]) and merged: an update re-plans
/// only the Services whose objects changed (an unchanged object keeps its
/// `Arc` in the store, so a pointer comparison tells), checks the
/// capacity from running counts, and writes only the entries the changed
/// Services touch. One Service applied among 10,000 costs what one Service
/// costs (a full plan of 10,000 took 45 ms, release build, 2026-12-01).
#[derive(Debug)]
pub struct Services {
    synced: Synced,
    plan: Plan,
    parts: HashMap<(String, String), Part>,
    /// Services naming each external address / each backend reachable at
    /// the uplink (the merged sets hold those named at least once).
    ext_refs: BTreeMap<Ipv4Addr, usize>,
    uplink_refs: BTreeMap<Ipv4Addr, usize>,
    /// Sum of the merged plan's group sizes.
    backends_total: usize,
    /// Groups per Service port.
    ports: BTreeMap<plan::PortRef, usize>,
    /// No update yet: the first one reconciles everything the maps hold.
    first: bool,
}

/// One Service's share of the plan and the objects it was made from.
#[derive(Debug)]
struct Part {
    inputs: Vec<Arc<Object>>,
    /// An endpoint without `nodeName`: its locality follows the node's pods.
    by_address: bool,
    plan: PartPlan,
}

/// A [`Plan`] of one Service as lists fitted to their length: it is only
/// walked (merged into and taken out of the node's plan). As a `Plan` each
/// of its maps held a whole B-tree node for its one or two entries: 25 MB
/// of the agent's heap with 10,000 Services (heaptrack, 2026-12-03).
#[derive(Debug, Default)]
struct PartPlan {
    frontends: Box<[(FrontendKey, Frontend)]>,
    groups: Box<[(GroupKey, Vec<Backend>)]>,
    external_addrs: Box<[Ipv4Addr]>,
    uplink_backends: Box<[Ipv4Addr]>,
    health: Box<[HealthCheck]>,
}

impl From<Plan> for PartPlan {
    fn from(plan: Plan) -> Self {
        Self {
            frontends: plan.frontends.into_iter().collect(),
            groups: plan
                .groups
                .into_iter()
                .map(|(k, mut b)| {
                    b.shrink_to_fit();
                    (k, b)
                })
                .collect(),
            external_addrs: plan.external_addrs.into_iter().collect(),
            uplink_backends: plan.uplink_backends.into_iter().collect(),
            health: plan.health.into_boxed_slice(),
        }
    }
}

impl Services {
    /// Reads back what the maps hold (kept across agent restarts).
    pub fn load(dp: &mut Datapath, capacity: Capacity) -> Result<Self, ServiceError> {
        Ok(Self {
            synced: Synced::load(dp, capacity)?,
            plan: Plan::default(),
            parts: HashMap::new(),
            ext_refs: BTreeMap::new(),
            uplink_refs: BTreeMap::new(),
            backends_total: 0,
            ports: BTreeMap::new(),
            first: true,
        })
    }

    /// The plan for these objects on this node (all of it, from scratch).
    pub fn plan<'a>(
        services: impl IntoIterator<Item = &'a Service>,
        slices: impl IntoIterator<Item = &'a EndpointSlice>,
        node: &NodeView<'_>,
    ) -> Plan {
        plan::plan(services, slices, node)
    }

    /// Makes the maps hold the Services of `objects`: the changed ones
    /// re-planned (and, with `pods_changed`, those whose endpoints are
    /// placed by address), the capacity checked — a refusal changes
    /// nothing and is counted as the map's (`rivet_map_full_refusals_total`)
    /// —, then their entries written; the endpoint flags of the backends
    /// reachable at the uplink follow.
    pub fn update(
        &mut self,
        dp: &mut Datapath,
        objects: &ObjectSet,
        touched: Option<&ServiceRefs>,
        node: &NodeView<'_>,
        pods_changed: bool,
    ) -> Result<Changes, ServiceError> {
        // 1. Which Services changed: among those `touched` names (a
        //    change of the objects knows them), else among all.
        let mut changed: Vec<((String, String), Option<Part>)> = Vec::new();
        let mut seen: HashSet<(String, String)> = HashSet::new();
        let candidates: Box<dyn Iterator<Item = &Arc<Object>>> = match touched {
            Some(refs) if !self.first => Box::new(refs.iter().filter_map(|(ns, name)| {
                objects.get(&ObjectKey::new(Kind::Service, ns.as_str(), name.as_str()))
            })),
            _ => Box::new(objects.of_kind(Kind::Service)),
        };
        for obj in candidates {
            let Some(svc) = obj.as_service() else {
                continue;
            };
            let ns = svc.metadata.namespace.clone().unwrap_or_default();
            let Some(name) = svc.metadata.name.clone() else {
                continue;
            };
            let inputs: Vec<Arc<Object>> = std::iter::once(Arc::clone(obj))
                .chain(objects.slice_objects_of_service(&ns, &name).map(Arc::clone))
                .collect();
            let key = (ns, name);
            let same = self.parts.get(&key).is_some_and(|p| {
                !(pods_changed && p.by_address)
                    && p.inputs.len() == inputs.len()
                    && p.inputs.iter().zip(&inputs).all(|(a, b)| Arc::ptr_eq(a, b))
            });
            seen.insert(key.clone());
            if same {
                continue;
            }
            let opened: Vec<Cow<'_, EndpointSlice>> = inputs[1..]
                .iter()
                .filter_map(|o| o.as_endpoint_slice())
                .collect();
            let slices: Vec<&EndpointSlice> = opened.iter().map(|s| &**s).collect();
            let by_address = slices
                .iter()
                .any(|s| s.endpoints.iter().any(|e| e.node_name.is_none()));
            let part = Part {
                plan: plan::plan_one(svc, &slices, node).into(),
                inputs,
                by_address,
            };
            changed.push((key, Some(part)));
        }
        match touched {
            Some(refs) if !self.first => {
                for key in refs {
                    if !seen.contains(key) && self.parts.contains_key(key) {
                        changed.push((key.clone(), None));
                    }
                }
            }
            _ => {
                for key in self.parts.keys() {
                    if !seen.contains(key) {
                        changed.push((key.clone(), None));
                    }
                }
            }
        }
        if changed.is_empty() && !self.first {
            return Ok(Changes::default());
        }
        // 2. The merged plan with the new parts, and what they touch.
        let mut delta = Delta::default();
        let mut old_parts = Vec::with_capacity(changed.len());
        for (key, new) in changed {
            let old = self.parts.remove(&key);
            if let Some(old) = &old {
                self.unmerge(&old.plan, &key, &mut delta);
            }
            if let Some(part) = new {
                self.merge(&part.plan, &mut delta);
                self.parts.insert(key.clone(), part);
            }
            old_parts.push((key, old));
        }
        self.plan.health.sort();
        // 3. Capacity, before anything is written.
        let largest = delta
            .groups
            .iter()
            .filter_map(|g| self.plan.groups.get(g))
            .map(Vec::len)
            .max()
            .unwrap_or(0);
        let checked = self.synced.check_counts(
            self.plan.frontends.len() + self.plan.external_addrs.len(),
            self.backends_total,
            largest,
            self.ports.len(),
        );
        if let Err(e) = checked {
            if let ServiceError::Full { map, .. } = &e {
                crate::datapath::note_map_full(map);
            }
            // Back to the parts as they were.
            for (key, old) in old_parts {
                let mut scratch = Delta::default();
                if let Some(part) = self.parts.remove(&key) {
                    self.unmerge(&part.plan, &key, &mut scratch);
                }
                if let Some(old) = old {
                    self.merge(&old.plan, &mut scratch);
                    self.parts.insert(key, old);
                }
            }
            self.plan.health.sort();
            return Err(e);
        }
        // 4. The maps.
        let changes = if self.first {
            self.first = false;
            self.synced.apply(dp, &self.plan)?
        } else {
            self.synced.apply_delta(dp, &self.plan, &delta)?
        };
        dp.set_service_backends(self.plan.uplink_backends.clone())?;
        Ok(changes)
    }

    /// Adds a Service's part to the merged plan.
    fn merge(&mut self, part: &PartPlan, delta: &mut Delta) {
        for (fk, fe) in &part.frontends {
            self.plan.frontends.insert(*fk, fe.clone());
            delta.frontends.insert(*fk);
        }
        for (gk, backends) in &part.groups {
            self.backends_total += backends.len();
            if let Some(old) = self.plan.groups.insert(gk.clone(), backends.clone()) {
                self.backends_total -= old.len();
            } else {
                *self.ports.entry(gk.port.clone()).or_default() += 1;
            }
            delta.groups.insert(gk.clone());
        }
        for a in &part.external_addrs {
            *self.ext_refs.entry(*a).or_default() += 1;
            self.plan.external_addrs.insert(*a);
            delta.markers.insert(*a);
        }
        for a in &part.uplink_backends {
            *self.uplink_refs.entry(*a).or_default() += 1;
            self.plan.uplink_backends.insert(*a);
        }
        self.plan.health.extend(part.health.iter().cloned());
    }

    /// Takes a Service's part (`key`) out of the merged plan.
    fn unmerge(&mut self, part: &PartPlan, key: &(String, String), delta: &mut Delta) {
        let owned = |fe: &Frontend| fe.group.port.namespace == key.0 && fe.group.port.name == key.1;
        for (fk, _) in &part.frontends {
            if self.plan.frontends.get(fk).is_some_and(owned) {
                self.plan.frontends.remove(fk);
            }
            delta.frontends.insert(*fk);
        }
        for (gk, _) in &part.groups {
            delta.groups.insert(gk.clone());
            if let Some(old) = self.plan.groups.remove(gk) {
                self.backends_total -= old.len();
                if let Some(n) = self.ports.get_mut(&gk.port) {
                    *n -= 1;
                    if *n == 0 {
                        self.ports.remove(&gk.port);
                    }
                }
            }
        }
        for a in &part.external_addrs {
            delta.markers.insert(*a);
            if let Some(n) = self.ext_refs.get_mut(a) {
                *n -= 1;
                if *n == 0 {
                    self.ext_refs.remove(a);
                    self.plan.external_addrs.remove(a);
                }
            }
        }
        for a in &part.uplink_backends {
            if let Some(n) = self.uplink_refs.get_mut(a) {
                *n -= 1;
                if *n == 0 {
                    self.uplink_refs.remove(a);
                    self.plan.uplink_backends.remove(a);
                }
            }
        }
        self.plan
            .health
            .retain(|h| !(h.namespace == key.0 && h.name == key.1));
    }

    /// Whether a Service has an endpoint without `nodeName` (its locality
    /// follows the node's pods).
    pub fn placed_by_address(&self) -> bool {
        self.parts.values().any(|p| p.by_address)
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
