//! Kubernetes NetworkPolicy in the datapath: the stored `Namespace`, `Pod`
//! and `NetworkPolicy` objects and this node's pods become, for each local
//! pod a policy selects, its isolation bits and its entries of
//! `POLICY_PORTS` / `POLICY_PEERS` (layout: `rivet_common`'s `policy`).
//!
//! - `compile.rs`: the semantics (pure; the rules are in its docs);
//! - `selector.rs`: label selectors; `ranges.rs`: address sets → prefixes;
//! - this file: per pod, what is in the maps, and the order of writes.
//!
//! **Why per-pod tries keyed by address, not identities.** Cilium numbers
//! label sets (identities) and maps every address to one; an `ipBlock`
//! overlapping pods then needs CIDR identities and a shared allocator
//! between nodes. Here the agent expands selectors into the peers' /32s
//! and `ipBlock`s into prefixes, per policed pod: the datapath answers
//! with two LPM lookups, flat in the number of rules (a trie lookup walks
//! at most 96 bits), and a node needs nothing from other nodes but the
//! pods' addresses, which the objects carry.
//!
//! **No window on a change.** A pod's new entries use the other half of
//! the class numbers (the top bit alternates): its new peers are written
//! first (no port entry names them yet), then its port entries (each
//! lookup sees the old class or the new one, each complete), then the
//! isolation bits, then the old entries go. A pod that becomes isolated
//! gets its entries before the bit; one that stops being isolated loses
//! the bit first.
//!
//! **Incremental.** A sync compiles only what changed. The peers (each
//! pod's view, the label index) are rebuilt only when a Pod or Namespace
//! object or a local pod changed, each unchanged pod's view reused; what a
//! policy contributes to a local pod is kept while the policy's object (the
//! same `Arc` in the persistent object set), the pod's view and the peers
//! are the same. Only the assembly of a pod's classes runs over all of its
//! rules, and the entries written and removed are a merge of the sorted old
//! and new ones. One rule changed at 10,000 rules selecting a pod: the
//! agent's check (plan + map writes) 3 ms instead of 28–40 ms (2,839 µs
//! planned, 122 µs applied; `bench policy`, 2026-12-02 00:16, other builds
//! running). The unit tests compare the incremental plans with a compile
//! from scratch over random changes.
//!
//! **Established flows a new policy denies** go on: a flow allowed once
//! is in `POLICY_FLOWS` and its packets pass until the flow table forgets
//! it (as with Calico's and Cilium's connection tracking; Kubernetes leaves
//! it open). New flows are judged by the new rules at once.

pub mod compile;
pub mod ranges;
pub mod selector;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::Ipv4Addr,
    sync::Arc,
    time::Instant,
};

use k8s_openapi::api::core::v1::Pod;
use rivet_common::{endpoint_flags, policy_dir};

pub use compile::{CompileError, Compiled, DirPlan, Peers, PodPlan, PodView, PolicyView, View};

use crate::{
    datapath::{Datapath, DatapathError, PeerEntry, PortEntry},
    objects::{Kind, Object, ObjectSet},
};

/// Policy errors.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// A pod's policy cannot be compiled.
    #[error(transparent)]
    Compile(#[from] CompileError),
    /// A map operation failed (a full map included).
    #[error(transparent)]
    Datapath(#[from] DatapathError),
}

/// A pod of this node, as its endpoint names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalPod {
    /// Its address.
    pub addr: Ipv4Addr,
    /// `K8S_POD_NAMESPACE`.
    pub namespace: String,
    /// `K8S_POD_NAME`.
    pub name: String,
}

/// What is in the maps for one local pod.
#[derive(Clone, Debug, Default)]
struct Applied {
    /// The plan the entries were made from (`None`: entries a previous
    /// agent left, plan unknown).
    plan: Option<PodPlan>,
    /// The class half in use (0 or 0x8000).
    half: u16,
    ports: Vec<PortEntry>,
    peers: Vec<PeerEntry>,
}

/// Summary of a sync.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyChanges {
    /// Pods whose entries or isolation changed.
    pub pods: usize,
    /// Entries written.
    pub written: usize,
    /// Entries removed.
    pub removed: usize,
}

/// A local pod's policy, as `rivetctl policy` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodReport {
    /// The pod.
    pub pod: LocalPod,
    /// namespace/name of every policy selecting it.
    pub policies: Vec<String>,
    /// The compiled plan.
    pub plan: PodPlan,
}

/// The policies of this node's pods.
#[derive(Debug, Default)]
pub struct Policies {
    /// Numbers of the policies (by namespace/name), stable while they exist.
    ids: BTreeMap<(String, String), u32>,
    next_id: u32,
    applied: HashMap<Ipv4Addr, Applied>,
    pods: HashMap<Ipv4Addr, LocalPod>,
    /// What the last plans were compiled from, reused while the objects
    /// are the same.
    cache: Cache,
}

/// What the last sync compiled, kept with the objects it came from (their
/// `Arc`s held, so an unchanged object is the same pointer in the next
/// set and a dropped one's address is never mistaken for it).
#[derive(Debug, Default)]
struct Cache {
    /// The Pod and Namespace objects [`Cache::peers`] was made from, in
    /// key order.
    pod_objects: Vec<Arc<Object>>,
    namespace_objects: Vec<Arc<Object>>,
    /// The local pods it was made with (their endpoints' addresses stand
    /// for their objects').
    local: Vec<LocalPod>,
    peers: Arc<Peers>,
    /// Each pod's view by namespace/name, with what it was made from.
    pod_views: HashMap<(String, String), PodEntry>,
    /// Bumped whenever `peers` is rebuilt.
    generation: u64,
    /// Per local pod: what each policy contributes to it.
    compiled: HashMap<Ipv4Addr, PodCompiled>,
}

/// A pod's view and what it was made from.
#[derive(Debug)]
struct PodEntry {
    object: Arc<Object>,
    /// The local endpoint's address it was given, if any.
    local: Option<Ipv4Addr>,
    view: Arc<PodView>,
}

/// What the policies contribute to one local pod, and the inputs that held
/// then: valid while the peers' generation and the pod's view are the
/// same, per policy while its object is.
#[derive(Debug, Default)]
struct PodCompiled {
    generation: u64,
    pod: Option<Arc<PodView>>,
    policies: HashMap<u32, (Arc<Object>, Compiled)>,
}

/// What a plan computation did (logged at debug level).
#[derive(Clone, Copy, Debug, Default)]
struct PlanStats {
    /// Whether the peers (pods, namespaces) were rebuilt.
    peers_rebuilt: bool,
    /// Policy × pod contributions compiled, and reused.
    compiled: usize,
    reused: usize,
}

/// Whether `objects` are exactly `held`, pointer for pointer.
fn same_objects<'a>(objects: impl Iterator<Item = &'a Arc<Object>>, held: &[Arc<Object>]) -> bool {
    let mut n = 0;
    for o in objects {
        match held.get(n) {
            Some(h) if Arc::ptr_eq(h, o) => n += 1,
            _ => return false,
        }
    }
    n == held.len()
}

/// What to write and what to remove to go from `old` to `new` (both
/// sorted by entry): the entries of `new` not in `old`, and those of `old`
/// not in `new`.
fn diff_sorted<T: Ord + Copy, V: Copy>(old: &[T], new: &[(T, V)]) -> (Vec<(T, V)>, Vec<T>) {
    let (mut added, mut stale) = (Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    while i < old.len() || j < new.len() {
        match (old.get(i), new.get(j)) {
            (Some(o), Some(n)) if *o == n.0 => {
                i += 1;
                j += 1;
            }
            (Some(o), Some(n)) if *o < n.0 => {
                stale.push(*o);
                i += 1;
            }
            (Some(o), None) => {
                stale.push(*o);
                i += 1;
            }
            (_, Some(n)) => {
                added.push(*n);
                j += 1;
            }
            (None, None) => break,
        }
    }
    (added, stale)
}

/// A Pod object as policy sees it (`None`: a `hostNetwork` pod, no peer).
fn pod_view(pod: &Pod, local: Option<Ipv4Addr>) -> Option<PodView> {
    if pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
    {
        return None;
    }
    let ports = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            Some(compile::NamedPort {
                name: p.name.clone()?,
                port: u16::try_from(p.container_port).ok()?,
                proto: protocol_number(p.protocol.as_deref())?,
            })
        })
        .collect();
    Some(PodView {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        labels: pod.metadata.labels.clone().unwrap_or_default(),
        addrs: match local {
            Some(a) => vec![a],
            None => status_addrs(pod),
        },
        ports,
    })
}

/// The IPv4 addresses of a Pod object's status.
fn status_addrs(pod: &Pod) -> Vec<Ipv4Addr> {
    let Some(status) = pod.status.as_ref() else {
        return Vec::new();
    };
    let mut out: Vec<Ipv4Addr> = status
        .pod_ips
        .iter()
        .flatten()
        .filter_map(|ip| ip.ip.parse().ok())
        .collect();
    if let Some(ip) = status.pod_ip.as_deref().and_then(|s| s.parse().ok())
        && !out.contains(&ip)
    {
        out.push(ip);
    }
    out
}

fn protocol_number(p: Option<&str>) -> Option<u8> {
    match p.unwrap_or("TCP") {
        "TCP" => Some(6),
        "UDP" => Some(17),
        "SCTP" => Some(132),
        _ => None,
    }
}

impl Policies {
    /// The number of policy `ns`/`name`, given one if new.
    fn id_of(&mut self, ns: &str, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(&(ns.to_owned(), name.to_owned())) {
            return id;
        }
        self.next_id += 1;
        self.ids
            .insert((ns.to_owned(), name.to_owned()), self.next_id);
        self.next_id
    }

    /// `namespace/name` of every policy, by number.
    pub fn policy_names(&self) -> HashMap<u32, String> {
        self.ids
            .iter()
            .map(|((ns, n), id)| (*id, format!("{ns}/{n}")))
            .collect()
    }

    /// `namespace/name` of every local pod with an identity, by address.
    pub fn pod_names(&self) -> HashMap<Ipv4Addr, String> {
        self.pods
            .iter()
            .map(|(a, p)| (*a, format!("{}/{}", p.namespace, p.name)))
            .collect()
    }

    /// namespace/name of policy number `id`.
    pub fn name_of(&self, id: u32) -> Option<String> {
        self.ids
            .iter()
            .find(|(_, v)| **v == id)
            .map(|((ns, n), _)| format!("{ns}/{n}"))
    }

    /// Brings the cached peers up to `objects` and `local`: rebuilt (each
    /// pod's view reused while its object and address are the same) only
    /// when a Pod or Namespace object or a local pod changed. Returns
    /// whether it was rebuilt.
    fn refresh_peers(&mut self, objects: &ObjectSet, local: &[LocalPod]) -> bool {
        let cache = &mut self.cache;
        if cache.local == local
            && same_objects(objects.of_kind(Kind::Pod), &cache.pod_objects)
            && same_objects(objects.of_kind(Kind::Namespace), &cache.namespace_objects)
        {
            return false;
        }
        let local_addr: HashMap<(&str, &str), Ipv4Addr> = local
            .iter()
            .map(|p| ((p.namespace.as_str(), p.name.as_str()), p.addr))
            .collect();
        let mut namespaces = HashMap::new();
        for ns in objects.namespaces() {
            let name = ns.metadata.name.clone().unwrap_or_default();
            let mut labels = ns.metadata.labels.clone().unwrap_or_default();
            labels.insert(compile::NAMESPACE_NAME_LABEL.to_owned(), name.clone());
            namespaces.insert(name, labels);
        }
        let mut old = std::mem::take(&mut cache.pod_views);
        let mut pods = Vec::new();
        for object in objects.of_kind(Kind::Pod) {
            let Some(pod) = object.as_pod() else { continue };
            let key = (
                pod.metadata.namespace.clone().unwrap_or_default(),
                pod.metadata.name.clone().unwrap_or_default(),
            );
            let addr = local_addr.get(&(key.0.as_str(), key.1.as_str())).copied();
            let entry = match old.remove(&key) {
                Some(e) if Arc::ptr_eq(&e.object, object) && e.local == addr => e,
                _ => {
                    let Some(view) = pod_view(pod, addr) else {
                        continue;
                    };
                    PodEntry {
                        object: object.clone(),
                        local: addr,
                        view: Arc::new(view),
                    }
                }
            };
            pods.push(entry.view.clone());
            cache.pod_views.insert(key, entry);
        }
        cache.peers = Arc::new(Peers::new(namespaces, pods));
        cache.pod_objects = objects.of_kind(Kind::Pod).cloned().collect();
        cache.namespace_objects = objects.of_kind(Kind::Namespace).cloned().collect();
        cache.local = local.to_vec();
        cache.generation += 1;
        true
    }

    /// The plan of every local pod: each policy's contribution to a pod
    /// compiled only when the policy, the pod or the peers changed since
    /// the last call, else reused (what [`compile::compile_pod`] gives from
    /// scratch: the unit tests compare the two).
    fn plans(
        &mut self,
        objects: &ObjectSet,
        local: &[LocalPod],
    ) -> Result<(Vec<(LocalPod, PodPlan)>, PlanStats), PolicyError> {
        let mut stats = PlanStats {
            peers_rebuilt: self.refresh_peers(objects, local),
            ..PlanStats::default()
        };
        let mut policies: Vec<(u32, &Arc<Object>)> = Vec::new();
        let mut live = HashSet::new();
        for object in objects.of_kind(Kind::NetworkPolicy) {
            let meta = object.metadata();
            let id = self.id_of(
                meta.namespace.as_deref().unwrap_or_default(),
                meta.name.as_deref().unwrap_or_default(),
            );
            live.insert(id);
            policies.push((id, object));
        }
        self.ids.retain(|_, id| live.contains(id));
        let cache = &mut self.cache;
        let peers = cache.peers.clone();
        let mut out = Vec::with_capacity(local.len());
        let mut compiled_for = HashMap::with_capacity(local.len());
        for pod in local {
            let key = (pod.namespace.clone(), pod.name.clone());
            let Some(view) = cache.pod_views.get(&key).map(|e| e.view.clone()) else {
                out.push((pod.clone(), PodPlan::default()));
                continue;
            };
            let mut held = cache.compiled.remove(&pod.addr).unwrap_or_default();
            if held.generation != cache.generation
                || !held.pod.as_ref().is_some_and(|p| Arc::ptr_eq(p, &view))
            {
                held.policies.clear();
            }
            let mut next = PodCompiled {
                generation: cache.generation,
                pod: Some(view.clone()),
                policies: HashMap::with_capacity(policies.len()),
            };
            for &(id, object) in &policies {
                let entry = match held.policies.remove(&id) {
                    Some((o, c)) if Arc::ptr_eq(&o, object) && c.id() == id => {
                        stats.reused += 1;
                        (o, c)
                    }
                    _ => {
                        stats.compiled += 1;
                        let c = match object.as_network_policy() {
                            Some(policy) => {
                                compile::compile_policy(&peers, &view, &PolicyView { id, policy })
                            }
                            None => Compiled::default(),
                        };
                        (object.clone(), c)
                    }
                };
                next.policies.insert(id, entry);
            }
            let plan = compile::assemble(
                policies
                    .iter()
                    .filter_map(|(id, _)| next.policies.get(id).map(|(_, c)| c)),
                &format!("{}/{}", pod.namespace, pod.name),
            );
            compiled_for.insert(pod.addr, next);
            out.push((pod.clone(), plan?));
        }
        cache.compiled = compiled_for;
        Ok((out, stats))
    }

    /// The plan of every local pod computed from scratch, nothing cached
    /// (the reference the incremental [`Policies::plans`] is tested
    /// against).
    #[cfg(test)]
    fn plans_from_scratch(
        objects: &ObjectSet,
        local: &[LocalPod],
        ids: &BTreeMap<(String, String), u32>,
    ) -> Result<Vec<(LocalPod, PodPlan)>, PolicyError> {
        let local_addr: HashMap<(&str, &str), Ipv4Addr> = local
            .iter()
            .map(|p| ((p.namespace.as_str(), p.name.as_str()), p.addr))
            .collect();
        let mut namespaces = HashMap::new();
        for ns in objects.namespaces() {
            let name = ns.metadata.name.clone().unwrap_or_default();
            let mut labels = ns.metadata.labels.clone().unwrap_or_default();
            labels.insert(compile::NAMESPACE_NAME_LABEL.to_owned(), name.clone());
            namespaces.insert(name, labels);
        }
        let pods: Vec<Arc<PodView>> = objects
            .pods()
            .filter_map(|pod| {
                let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
                let name = pod.metadata.name.as_deref().unwrap_or_default();
                pod_view(pod, local_addr.get(&(ns, name)).copied())
            })
            .map(Arc::new)
            .collect();
        let peers = Peers::unindexed(namespaces, pods);
        let view = View {
            peers: &peers,
            policies: objects
                .network_policies()
                .map(|policy| {
                    let ns = policy.metadata.namespace.clone().unwrap_or_default();
                    let name = policy.metadata.name.clone().unwrap_or_default();
                    PolicyView {
                        id: ids.get(&(ns, name)).copied().unwrap_or_default(),
                        policy,
                    }
                })
                .collect(),
        };
        let mut out = Vec::new();
        for pod in local {
            let found = peers
                .pods
                .iter()
                .find(|p| p.namespace == pod.namespace && p.name == pod.name);
            let plan = match found {
                Some(v) => compile::compile_pod(&view, v)?,
                None => PodPlan::default(),
            };
            out.push((pod.clone(), plan));
        }
        Ok(out)
    }

    /// Makes the maps hold the policies of `objects` for the pods `local`
    /// (every pod of this node with a Kubernetes identity); pods no longer
    /// there lose their entries.
    pub fn sync(
        &mut self,
        dp: &mut Datapath,
        objects: &ObjectSet,
        local: &[LocalPod],
    ) -> Result<PolicyChanges, PolicyError> {
        let started = Instant::now();
        let (plans, stats) = self.plans(objects, local)?;
        let planned_us = started.elapsed().as_micros();
        let mut changes = PolicyChanges::default();
        let wanted: HashSet<Ipv4Addr> = plans.iter().map(|(p, _)| p.addr).collect();
        for (pod, plan) in plans {
            let addr = pod.addr;
            self.pods.insert(addr, pod);
            let same = self
                .applied
                .get(&addr)
                .is_some_and(|a| a.plan.as_ref() == Some(&plan));
            if same {
                continue;
            }
            changes.pods += 1;
            self.apply(dp, addr, plan, &mut changes)?;
        }
        let gone: Vec<Ipv4Addr> = self
            .applied
            .keys()
            .filter(|a| !wanted.contains(a))
            .copied()
            .collect();
        for addr in gone {
            changes.pods += 1;
            self.apply(dp, addr, PodPlan::default(), &mut changes)?;
            self.applied.remove(&addr);
            self.pods.remove(&addr);
        }
        tracing::debug!(
            peers_rebuilt = stats.peers_rebuilt,
            compiled = stats.compiled,
            reused = stats.reused,
            planned_us,
            applied_us = started.elapsed().as_micros() - planned_us,
            "network policy planned and applied"
        );
        Ok(changes)
    }

    /// Replaces what the maps hold for `addr` with `plan`, in the order
    /// that shows no program a half-made state (module docs).
    fn apply(
        &mut self,
        dp: &mut Datapath,
        addr: Ipv4Addr,
        plan: PodPlan,
        changes: &mut PolicyChanges,
    ) -> Result<(), PolicyError> {
        let old = self.applied.remove(&addr).unwrap_or_default();
        // Same port classes (only peers changed): the peers are changed in
        // place, additions first (a peer being removed is allowed a moment
        // longer, one being added is never missing); else the new entries
        // go to the other half of the class numbers.
        let same_classes = old.plan.as_ref().is_some_and(|p| {
            let ports = |d: &Option<DirPlan>| d.as_ref().map(|d| d.ports.clone());
            ports(&p.ingress) == ports(&plan.ingress) && ports(&p.egress) == ports(&plan.egress)
        });
        if same_classes {
            return self.apply_peers(dp, addr, plan, old, changes);
        }
        let half = old.half ^ 0x8000;
        let mut ports: Vec<(PortEntry, u16)> = Vec::new();
        let mut peers: Vec<(PeerEntry, u32)> = Vec::new();
        let mut bits = 0;
        for (dir, dir_plan, bit) in [
            (
                policy_dir::INGRESS,
                &plan.ingress,
                endpoint_flags::POLICY_INGRESS,
            ),
            (
                policy_dir::EGRESS,
                &plan.egress,
                endpoint_flags::POLICY_EGRESS,
            ),
        ] {
            let Some(d) = dir_plan else { continue };
            bits |= bit;
            ports.extend(d.ports.iter().map(|&(proto, port, pbits, class)| {
                (
                    PortEntry {
                        pod: addr,
                        dir,
                        proto,
                        port,
                        bits: pbits,
                    },
                    class | half,
                )
            }));
            peers.extend(d.peers.iter().map(|&(class, a, abits, policy)| {
                (
                    PeerEntry {
                        pod: addr,
                        dir,
                        class: class | half,
                        addr: a,
                        bits: abits,
                    },
                    policy,
                )
            }));
        }
        // Sorted: the next change diffs against them by merging.
        peers.sort_unstable_by_key(|&(e, _)| e);
        dp.put_policy_peers(&peers)?;
        dp.put_policy_ports(&ports)?;
        dp.set_policy_isolation(addr, bits)?;
        let kept: HashSet<&PortEntry> = ports.iter().map(|(e, _)| e).collect();
        let stale_ports: Vec<PortEntry> = old
            .ports
            .iter()
            .filter(|e| !kept.contains(e))
            .copied()
            .collect();
        dp.remove_policy_ports(&stale_ports)?;
        dp.remove_policy_peers(&old.peers)?;
        changes.written += ports.len() + peers.len();
        changes.removed += stale_ports.len() + old.peers.len();
        self.applied.insert(
            addr,
            Applied {
                plan: Some(plan),
                half,
                ports: ports.into_iter().map(|(e, _)| e).collect(),
                peers: peers.into_iter().map(|(e, _)| e).collect(),
            },
        );
        Ok(())
    }

    /// [`Policies::apply`] when only the peers changed: the new ones
    /// written, then the ones no longer wanted removed, in the same half.
    fn apply_peers(
        &mut self,
        dp: &mut Datapath,
        addr: Ipv4Addr,
        plan: PodPlan,
        old: Applied,
        changes: &mut PolicyChanges,
    ) -> Result<(), PolicyError> {
        let mut peers: Vec<(PeerEntry, u32)> = Vec::new();
        for (dir, dir_plan) in [
            (policy_dir::INGRESS, &plan.ingress),
            (policy_dir::EGRESS, &plan.egress),
        ] {
            let Some(d) = dir_plan else { continue };
            peers.extend(d.peers.iter().map(|&(class, a, abits, policy)| {
                (
                    PeerEntry {
                        pod: addr,
                        dir,
                        class: class | old.half,
                        addr: a,
                        bits: abits,
                    },
                    policy,
                )
            }));
        }
        peers.sort_unstable_by_key(|&(e, _)| e);
        let (added, stale) = diff_sorted(&old.peers, &peers);
        dp.put_policy_peers(&added)?;
        dp.remove_policy_peers(&stale)?;
        changes.written += added.len();
        changes.removed += stale.len();
        self.applied.insert(
            addr,
            Applied {
                plan: Some(plan),
                half: old.half,
                ports: old.ports,
                peers: peers.into_iter().map(|(e, _)| e).collect(),
            },
        );
        Ok(())
    }

    /// The policy of every local pod that has a Kubernetes identity.
    pub fn report(&self) -> Vec<PodReport> {
        let mut out: Vec<PodReport> = self
            .pods
            .values()
            .map(|pod| {
                let plan = self
                    .applied
                    .get(&pod.addr)
                    .and_then(|a| a.plan.clone())
                    .unwrap_or_default();
                PodReport {
                    pod: pod.clone(),
                    policies: plan
                        .selected_by
                        .iter()
                        .filter_map(|&id| self.name_of(id))
                        .collect(),
                    plan,
                }
            })
            .collect();
        out.sort_by(|a, b| (&a.pod.namespace, &a.pod.name).cmp(&(&b.pod.namespace, &b.pod.name)));
        out
    }

    /// The policy of this node's pods as `rivetctl policy` shows it (only
    /// `pod`, `namespace/name`, when given).
    pub fn list(&self, pod: Option<(&str, &str)>) -> rivet_api::PolicyList {
        let pods = self
            .report()
            .into_iter()
            .filter(|r| pod.is_none_or(|(ns, n)| r.pod.namespace == ns && r.pod.name == n))
            .map(|r| rivet_api::PodPolicy {
                namespace: r.pod.namespace.clone(),
                name: r.pod.name.clone(),
                ip: r.pod.addr,
                policies: r.policies.clone(),
                ingress: r.plan.ingress.as_ref().map(|d| self.rules_of(d)),
                egress: r.plan.egress.as_ref().map(|d| self.rules_of(d)),
            })
            .collect();
        rivet_api::PolicyList { pods }
    }

    /// A direction's classes as rules: port ranges and peer prefixes.
    fn rules_of(&self, d: &DirPlan) -> Vec<rivet_api::PolicyRule> {
        let mut classes: BTreeMap<u16, rivet_api::PolicyRule> = BTreeMap::new();
        let mut ranges: BTreeMap<u16, Vec<(u8, u32, u32)>> = BTreeMap::new();
        for &(proto, port, bits, class) in &d.ports {
            let first = u32::from(port);
            let last = first + (1u32 << (16 - u32::from(bits))) - 1;
            ranges.entry(class).or_default().push((proto, first, last));
        }
        for (class, mut rs) in ranges {
            rs.sort_unstable();
            let mut merged: Vec<(u8, u32, u32)> = Vec::new();
            for (proto, first, last) in rs {
                match merged.last_mut() {
                    Some(m) if m.0 == proto && m.2 + 1 == first => m.2 = last,
                    _ => merged.push((proto, first, last)),
                }
            }
            let ports = merged
                .into_iter()
                .map(|(proto, first, last)| {
                    let name = match proto {
                        compile::OTHER => return "other".to_owned(),
                        p => rivet_api::Protocol::from_number(p).to_string(),
                    };
                    match (first, last) {
                        (0, 65535) => name,
                        (a, b) if a == b => format!("{name}/{a}"),
                        (a, b) => format!("{name}/{a}-{b}"),
                    }
                })
                .collect();
            classes.insert(
                class,
                rivet_api::PolicyRule {
                    ports,
                    peers: Vec::new(),
                    from_policies: Vec::new(),
                },
            );
        }
        for &(class, addr, bits, policy) in &d.peers {
            if let Some(rule) = classes.get_mut(&class) {
                rule.peers.push(format!("{addr}/{bits}"));
                if let Some(name) = self.name_of(policy)
                    && !rule.from_policies.contains(&name)
                {
                    rule.from_policies.push(name);
                }
            }
        }
        classes
            .into_values()
            .filter(|r| !r.peers.is_empty())
            .collect()
    }

    /// Takes over the entries a previous agent left (read once at start,
    /// before the first sync): each pod's entries are replaced by that sync
    /// as after any change (new half first), and those of pods no longer
    /// here are removed. Enforcement never pauses: the pinned maps and the
    /// endpoints' isolation bits stay as they were until then.
    pub fn adopt(&mut self, dp: &mut Datapath) -> Result<usize, PolicyError> {
        let (ports, peers) = dp.policy_entries()?;
        let found = ports.len() + peers.len();
        for e in ports {
            let a = self.applied.entry(e.pod).or_default();
            a.ports.push(e);
        }
        for e in peers {
            let a = self.applied.entry(e.pod).or_default();
            a.half = e.class & 0x8000;
            a.peers.push(e);
        }
        for a in self.applied.values_mut() {
            a.peers.sort_unstable();
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::objects::{ObjectKey, parse_object};

    /// A small deterministic generator (xorshift64*).
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
            from[self.below(from.len())]
        }

        fn chance(&mut self, percent: usize) -> bool {
            self.below(100) < percent
        }
    }

    const NAMESPACES: [&str; 3] = ["a", "b", "c"];
    const APPS: [&str; 3] = ["web", "db", "api"];
    const TEAMS: [&str; 2] = ["x", "y"];

    fn object(v: Value) -> Arc<Object> {
        Arc::new(parse_object(v).expect("a valid test object"))
    }

    fn namespace(rng: &mut Rng, name: &str) -> Arc<Object> {
        object(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {"team": rng.pick(&TEAMS)}},
        }))
    }

    fn pod(rng: &mut Rng, ns: &str, i: usize) -> Arc<Object> {
        let ip = format!("10.0.{}.{}", rng.below(3), 1 + rng.below(40));
        let port = if rng.chance(50) { 8080 } else { 9090 };
        let proto = rng.pick(&["TCP", "UDP"]);
        object(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("p{i}"), "namespace": ns,
                         "labels": {"app": rng.pick(&APPS)}},
            "spec": {
                "hostNetwork": rng.chance(5),
                "containers": [{"name": "c", "image": "i",
                                "ports": [{"name": "http", "containerPort": port,
                                           "protocol": proto}]}],
            },
            "status": {"podIP": ip},
        }))
    }

    fn peer(rng: &mut Rng) -> Value {
        match rng.below(5) {
            0 => {
                let net = rng.below(4);
                json!({"ipBlock": {"cidr": format!("10.0.{net}.0/24"),
                                   "except": [format!("10.0.{net}.{}/30", 4 * rng.below(10))]}})
            }
            1 => json!({"podSelector": {"matchLabels": {"app": rng.pick(&APPS)}}}),
            2 => json!({"namespaceSelector": {"matchLabels": {"team": rng.pick(&TEAMS)}}}),
            3 => json!({"podSelector": {"matchExpressions": [
                {"key": "app", "operator": "NotIn", "values": [rng.pick(&APPS)]}]},
                "namespaceSelector": {}}),
            _ => json!({"podSelector": {}}),
        }
    }

    fn ports(rng: &mut Rng) -> Option<Value> {
        match rng.below(5) {
            0 => None,
            1 => Some(json!([{"port": 80}])),
            2 => Some(json!([{"port": "http"}])),
            3 => Some(json!([{"protocol": "UDP", "port": 53, "endPort": 60}, {"port": 8080}])),
            _ => Some(json!([{"protocol": "UDP", "port": "http"}])),
        }
    }

    fn rules(rng: &mut Rng, peers_key: &str) -> Value {
        let rules: Vec<Value> = (0..rng.below(4))
            .map(|_| {
                let mut rule = serde_json::Map::new();
                if rng.chance(80) {
                    let peers: Vec<Value> = (0..rng.below(3)).map(|_| peer(rng)).collect();
                    rule.insert(peers_key.to_owned(), Value::Array(peers));
                }
                if let Some(p) = ports(rng) {
                    rule.insert("ports".to_owned(), p);
                }
                Value::Object(rule)
            })
            .collect();
        Value::Array(rules)
    }

    fn network_policy(rng: &mut Rng, ns: &str, i: usize) -> Arc<Object> {
        let mut spec = serde_json::Map::new();
        spec.insert(
            "podSelector".into(),
            if rng.chance(30) {
                json!({})
            } else {
                json!({"matchLabels": {"app": rng.pick(&APPS)}})
            },
        );
        match rng.below(4) {
            0 => {}
            1 => {
                spec.insert("policyTypes".into(), json!(["Ingress"]));
            }
            2 => {
                spec.insert("policyTypes".into(), json!(["Egress"]));
            }
            _ => {
                spec.insert("policyTypes".into(), json!(["Ingress", "Egress"]));
            }
        }
        if rng.chance(80) {
            spec.insert("ingress".into(), rules(rng, "from"));
        }
        if rng.chance(60) {
            spec.insert("egress".into(), rules(rng, "to"));
        }
        object(json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": format!("np{i}"), "namespace": ns},
            "spec": Value::Object(spec),
        }))
    }

    /// The local pods: some Pod objects' pods, at an address of their own
    /// or their object's, and one with no object.
    fn locals(rng: &mut Rng, objects: &ObjectSet) -> Vec<LocalPod> {
        let mut out: Vec<LocalPod> = objects
            .pods()
            .filter(|_| rng.chance(40))
            .enumerate()
            .map(|(i, p)| LocalPod {
                addr: Ipv4Addr::new(10, 9, 0, 1 + i as u8),
                namespace: p.metadata.namespace.clone().unwrap_or_default(),
                name: p.metadata.name.clone().unwrap_or_default(),
            })
            .collect();
        out.push(LocalPod {
            addr: Ipv4Addr::new(10, 9, 1, 1),
            namespace: "a".into(),
            name: "no-object".into(),
        });
        out
    }

    /// One random change: a Namespace, Pod or NetworkPolicy created,
    /// replaced or removed (several at once sometimes).
    fn change(rng: &mut Rng, objects: &mut ObjectSet) {
        for _ in 0..1 + rng.below(2) {
            let ns = rng.pick(&NAMESPACES);
            match rng.below(10) {
                0 => {
                    objects.insert(namespace(rng, ns));
                }
                1 => {
                    objects.remove(&ObjectKey::new(Kind::Namespace, "", ns));
                }
                2..=4 => {
                    let i = rng.below(12);
                    if rng.chance(25) {
                        objects.remove(&ObjectKey::new(Kind::Pod, ns, format!("p{i}")));
                    } else {
                        objects.insert(pod(rng, ns, i));
                    }
                }
                _ => {
                    let i = rng.below(8);
                    if rng.chance(20) {
                        objects.remove(&ObjectKey::new(Kind::NetworkPolicy, ns, format!("np{i}")));
                    } else {
                        objects.insert(network_policy(rng, ns, i));
                    }
                }
            }
        }
    }

    #[test]
    fn incremental_plans_equal_a_compile_from_scratch() {
        for seed in 1..=12u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let mut objects = ObjectSet::new();
            for ns in NAMESPACES {
                objects.insert(namespace(&mut rng, ns));
                for i in 0..8 {
                    objects.insert(pod(&mut rng, ns, i));
                }
                for i in 0..4 {
                    objects.insert(network_policy(&mut rng, ns, i));
                }
            }
            let mut policies = Policies::default();
            let mut local = locals(&mut rng, &objects);
            let (mut compiled, mut reused, mut peers) = (0, 0, 0);
            for step in 0..60 {
                if rng.chance(10) {
                    local = locals(&mut rng, &objects);
                } else {
                    change(&mut rng, &mut objects);
                }
                let (incremental, stats) = policies.plans(&objects, &local).expect("compiles");
                compiled += stats.compiled;
                reused += stats.reused;
                let scratch = Policies::plans_from_scratch(&objects, &local, &policies.ids)
                    .expect("compiles");
                assert_eq!(incremental, scratch, "seed {seed}, step {step}");
                peers += incremental
                    .iter()
                    .flat_map(|(_, p)| p.ingress.iter().chain(&p.egress))
                    .map(|d| d.peers.len())
                    .sum::<usize>();
            }
            assert!(
                reused > 0 && compiled > 0 && peers > 0,
                "seed {seed}: both paths taken ({compiled} compiled, {reused} reused), {peers} peer entries"
            );
        }
    }

    #[test]
    fn a_policy_change_compiles_that_policy_alone() {
        let mut rng = Rng(7);
        let mut objects = ObjectSet::new();
        objects.insert(namespace(&mut rng, "a"));
        for i in 0..10 {
            objects.insert(pod(&mut rng, "a", i));
        }
        for i in 0..5 {
            objects.insert(network_policy(&mut rng, "a", i));
        }
        let local: Vec<LocalPod> = (0..3)
            .map(|i| LocalPod {
                addr: Ipv4Addr::new(10, 9, 0, 1 + i),
                namespace: "a".into(),
                name: format!("p{i}"),
            })
            .collect();
        let mut policies = Policies::default();
        let (_, first) = policies.plans(&objects, &local).expect("compiles");
        assert!(first.peers_rebuilt);
        assert_eq!((first.compiled, first.reused), (15, 0));
        let (_, same) = policies.plans(&objects.clone(), &local).expect("compiles");
        assert!(!same.peers_rebuilt, "the same objects: nothing rebuilt");
        assert_eq!((same.compiled, same.reused), (0, 15));
        objects.insert(network_policy(&mut rng, "a", 2));
        let (plans, one) = policies.plans(&objects, &local).expect("compiles");
        assert!(!one.peers_rebuilt);
        assert_eq!((one.compiled, one.reused), (3, 12), "one policy × 3 pods");
        let scratch =
            Policies::plans_from_scratch(&objects, &local, &policies.ids).expect("compiles");
        assert_eq!(plans, scratch);
        // A pod changed: the peers are rebuilt and every contribution
        // compiled again.
        objects.insert(pod(&mut rng, "a", 7));
        let (_, pods) = policies.plans(&objects, &local).expect("compiles");
        assert!(pods.peers_rebuilt);
        assert_eq!(pods.reused, 0);
    }

    #[test]
    fn sorted_diffs_equal_set_differences() {
        let mut rng = Rng(99);
        for _ in 0..200 {
            let mut old: Vec<u16> = (0..rng.below(30)).map(|_| rng.below(50) as u16).collect();
            old.sort_unstable();
            old.dedup();
            let mut new: Vec<(u16, u32)> = (0..rng.below(30))
                .map(|_| (rng.below(50) as u16, rng.next() as u32))
                .collect();
            new.sort_unstable_by_key(|&(e, _)| e);
            new.dedup_by_key(|&mut (e, _)| e);
            let (added, stale) = diff_sorted(&old, &new);
            let had: HashSet<u16> = old.iter().copied().collect();
            let wanted: HashSet<u16> = new.iter().map(|&(e, _)| e).collect();
            let expect_added: Vec<(u16, u32)> = new
                .iter()
                .filter(|(e, _)| !had.contains(e))
                .copied()
                .collect();
            let expect_stale: Vec<u16> = old
                .iter()
                .filter(|e| !wanted.contains(e))
                .copied()
                .collect();
            assert_eq!(added, expect_added);
            assert_eq!(stale, expect_stale);
        }
    }
}
