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
};

use k8s_openapi::api::core::v1::Pod;
use rivet_common::{endpoint_flags, policy_dir};

pub use compile::{CompileError, DirPlan, PodPlan, PodView, PolicyView, View};

use crate::{
    datapath::{Datapath, DatapathError, PeerEntry, PortEntry},
    objects::ObjectSet,
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

    /// Builds the policy view of `objects` with this node's pods.
    fn view<'a>(&mut self, objects: &'a ObjectSet, local: &[LocalPod]) -> View<'a> {
        let local_addr: HashMap<(&str, &str), Ipv4Addr> = local
            .iter()
            .map(|p| ((p.namespace.as_str(), p.name.as_str()), p.addr))
            .collect();
        let mut view = View::default();
        for ns in objects.namespaces() {
            let name = ns.metadata.name.clone().unwrap_or_default();
            let mut labels = ns.metadata.labels.clone().unwrap_or_default();
            labels.insert(compile::NAMESPACE_NAME_LABEL.to_owned(), name.clone());
            view.namespaces.insert(name, labels);
        }
        for pod in objects.pods() {
            if pod
                .spec
                .as_ref()
                .and_then(|s| s.host_network)
                .unwrap_or(false)
            {
                continue;
            }
            let namespace = pod.metadata.namespace.clone().unwrap_or_default();
            let name = pod.metadata.name.clone().unwrap_or_default();
            let addrs = match local_addr.get(&(namespace.as_str(), name.as_str())) {
                Some(&a) => vec![a],
                None => status_addrs(pod),
            };
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
            view.pods.push(PodView {
                namespace,
                name,
                labels: pod.metadata.labels.clone().unwrap_or_default(),
                addrs,
                ports,
            });
        }
        let mut live = HashSet::new();
        for policy in objects.network_policies() {
            let ns = policy.metadata.namespace.clone().unwrap_or_default();
            let name = policy.metadata.name.clone().unwrap_or_default();
            let id = self.id_of(&ns, &name);
            live.insert(id);
            view.policies.push(PolicyView { id, policy });
        }
        self.ids.retain(|_, id| live.contains(id));
        view.index();
        view
    }

    /// The plan of every local pod.
    fn plans(
        &mut self,
        objects: &ObjectSet,
        local: &[LocalPod],
    ) -> Result<Vec<(LocalPod, PodPlan)>, PolicyError> {
        let view = self.view(objects, local);
        let mut out = Vec::with_capacity(local.len());
        for pod in local {
            let found = view
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
        let plans = self.plans(objects, local)?;
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
        let had: HashSet<&PeerEntry> = old.peers.iter().collect();
        let added: Vec<(PeerEntry, u32)> = peers
            .iter()
            .filter(|(e, _)| !had.contains(e))
            .copied()
            .collect();
        let wanted: HashSet<&PeerEntry> = peers.iter().map(|(e, _)| e).collect();
        let stale: Vec<PeerEntry> = old
            .peers
            .iter()
            .filter(|e| !wanted.contains(e))
            .copied()
            .collect();
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
        Ok(found)
    }
}
