//! NetworkPolicy semantics (Kubernetes' `networking.k8s.io/v1`), pure: the
//! stored objects and this node's pods in, each local pod's port classes
//! and allowed peer prefixes per direction out.
//!
//! - A pod is *selected* by a policy of its namespace whose `podSelector`
//!   matches its labels (the empty selector: every pod of the namespace); a
//!   pod with no `Pod` object is selected by nothing.
//! - It is isolated in a direction when a selecting policy's effective
//!   `policyTypes` hold it: as written, or, when empty, `Ingress` plus
//!   `Egress` if the policy has egress rules (the API server's default).
//! - Allowed = the union of every rule of every selecting policy of that
//!   direction. A rule without peers allows every address; without ports,
//!   every port of every protocol (ICMP too).
//! - Peers: `podSelector` (pods of the policy's namespace),
//!   `namespaceSelector` (every pod of the selected namespaces; a
//!   namespace's labels always hold `kubernetes.io/metadata.name`), both
//!   (pods matching the first in namespaces matching the second), or
//!   `ipBlock` (the CIDR without its `except`s). Selectors match pods only.
//!   **ipBlock matches any address, pods' and nodes' included**: it is a
//!   statement about addresses, and the addresses are what the datapath
//!   sees (Calico's reading; the upstream conformance tests write pod IPs
//!   into ipBlocks). A pod's addresses: its endpoint's when it runs on this
//!   node, else its `status.podIPs`. `hostNetwork` pods are no pod peers.
//! - Ports: `protocol` (TCP when absent; SCTP too), a number, a range to
//!   `endPort`, or a name resolved against the *destination* pod's
//!   container ports (for ingress the policed pod's own; for egress each
//!   peer pod's, so one rule can mean a different number per peer; a name
//!   never matches an address that is no pod). No number given: every port
//!   of the protocol.

use std::{
    borrow::Cow,
    collections::{BTreeMap, BTreeSet, HashMap},
    net::Ipv4Addr,
    sync::Arc,
};

use ipnet::Ipv4Net;
use k8s_openapi::{
    api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort},
    apimachinery::pkg::util::intstr::IntOrString,
};

use super::{
    ranges::{AddrSet, aligned_blocks},
    selector::{Labels, matches},
};

/// The label every namespace carries: its name.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

const TCP: u8 = 6;
const UDP: u8 = 17;
const SCTP: u8 = 132;
/// Protocols with ports, in the order classes are numbered.
const PORT_PROTOCOLS: [u8; 3] = [TCP, UDP, SCTP];
/// The protocol key of everything without ports.
pub const OTHER: u8 = rivet_common::POLICY_PROTO_OTHER;
/// Classes per pod and direction (the datapath's class field has 16 bits;
/// the top one tells two generations apart).
pub const MAX_CLASSES: usize = 0x7fff;

/// A container port by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedPort {
    /// `ports[].name`.
    pub name: String,
    /// `ports[].containerPort`.
    pub port: u16,
    /// IP protocol.
    pub proto: u8,
}

/// A pod as policy sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodView {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Labels.
    pub labels: Labels,
    /// IPv4 addresses.
    pub addrs: Vec<Ipv4Addr>,
    /// Named container ports.
    pub ports: Vec<NamedPort>,
}

/// A NetworkPolicy with the agent's number for it.
#[derive(Clone, Debug)]
pub struct PolicyView<'a> {
    /// The agent's number (stable while the policy exists).
    pub id: u32,
    /// The object.
    pub policy: &'a NetworkPolicy,
}

impl PolicyView<'_> {
    fn namespace(&self) -> &str {
        self.policy
            .metadata
            .namespace
            .as_deref()
            .unwrap_or("default")
    }

    /// Whether the policy selects `pod`.
    pub fn selects(&self, pod: &PodView) -> bool {
        if pod.namespace != self.namespace() {
            return false;
        }
        let spec = self.policy.spec.as_ref();
        spec.and_then(|s| s.pod_selector.as_ref())
            .is_none_or(|sel| matches(sel, &pod.labels))
    }

    /// Effective `policyTypes`: (ingress, egress).
    pub fn types(&self) -> (bool, bool) {
        let Some(spec) = self.policy.spec.as_ref() else {
            return (true, false);
        };
        match spec.policy_types.as_deref() {
            Some(types) if !types.is_empty() => (
                types.iter().any(|t| t == "Ingress"),
                types.iter().any(|t| t == "Egress"),
            ),
            _ => (true, spec.egress.as_ref().is_some_and(|e| !e.is_empty())),
        }
    }
}

/// What selectors choose from: the namespaces and the pods, indexed by
/// label and namespace. The agent keeps one between syncs and rebuilds it
/// only when a Pod or Namespace object, or a local pod, changed.
#[derive(Clone, Debug, Default)]
pub struct Peers {
    /// Namespace labels by name (with [`NAMESPACE_NAME_LABEL`]).
    pub namespaces: HashMap<String, Labels>,
    /// Every pod with an object.
    pub pods: Vec<Arc<PodView>>,
    /// Pods by label and by namespace (empty: every selector scans every
    /// pod).
    index: PodIndex,
}

/// Where to look for the pods a selector may match.
#[derive(Clone, Debug, Default)]
struct PodIndex {
    /// key → value → indices in [`Peers::pods`].
    by_label: HashMap<String, HashMap<String, Vec<usize>>>,
    /// namespace → indices in [`Peers::pods`].
    by_namespace: HashMap<String, Vec<usize>>,
    built: bool,
}

/// The cluster as policy sees it for one compile: the peers and every
/// policy, in key order.
#[derive(Clone, Debug)]
pub struct View<'a> {
    /// Namespaces and pods.
    pub peers: &'a Peers,
    /// Every policy.
    pub policies: Vec<PolicyView<'a>>,
}

impl Peers {
    /// The peers, indexed by label and namespace: a selector with
    /// `matchLabels` then looks only at the pods holding its rarest pair
    /// (10,000 selector peers over thousands of pods stay fast).
    pub fn new(namespaces: HashMap<String, Labels>, pods: Vec<Arc<PodView>>) -> Self {
        let mut index = PodIndex {
            built: true,
            ..PodIndex::default()
        };
        for (i, pod) in pods.iter().enumerate() {
            for (k, v) in &pod.labels {
                index
                    .by_label
                    .entry(k.clone())
                    .or_default()
                    .entry(v.clone())
                    .or_default()
                    .push(i);
            }
            index
                .by_namespace
                .entry(pod.namespace.clone())
                .or_default()
                .push(i);
        }
        Self {
            namespaces,
            pods,
            index,
        }
    }

    /// The peers without the index: every selector scans every pod (the
    /// reference the index is tested against).
    pub fn unindexed(namespaces: HashMap<String, Labels>, pods: Vec<Arc<PodView>>) -> Self {
        Self {
            namespaces,
            pods,
            index: PodIndex::default(),
        }
    }

    /// Indices of the pods a peer with these selectors may match (a
    /// superset; every one is still checked).
    fn candidates(
        &self,
        policy_ns: &str,
        pods: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
        namespaces: bool,
    ) -> Cow<'_, [usize]> {
        let all = || Cow::Owned((0..self.pods.len()).collect());
        if !self.index.built {
            return all();
        }
        let rarest = pods
            .and_then(|sel| sel.match_labels.as_ref())
            .and_then(|labels| {
                labels
                    .iter()
                    .map(|(k, v)| {
                        self.index
                            .by_label
                            .get(k)
                            .and_then(|values| values.get(v))
                            .map_or(&[][..], Vec::as_slice)
                    })
                    .min_by_key(|l| l.len())
            });
        match (rarest, namespaces) {
            (Some(list), _) => Cow::Borrowed(list),
            (None, false) => Cow::Borrowed(
                self.index
                    .by_namespace
                    .get(policy_ns)
                    .map_or(&[][..], Vec::as_slice),
            ),
            (None, true) => all(),
        }
    }

    /// The labels of namespace `ns` (only its name label when it has no
    /// object).
    fn namespace_labels(&self, ns: &str) -> Cow<'_, Labels> {
        self.namespaces.get(ns).map_or_else(
            || {
                Cow::Owned(Labels::from([(
                    NAMESPACE_NAME_LABEL.to_owned(),
                    ns.to_owned(),
                )]))
            },
            Cow::Borrowed,
        )
    }
}

/// One direction of a pod's compiled policy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DirPlan {
    /// (protocol, first port, significant bits, class).
    pub ports: Vec<(u8, u16, u8, u16)>,
    /// (class, prefix, length, policy id).
    pub peers: Vec<(u16, Ipv4Addr, u8, u32)>,
}

/// A local pod's compiled policy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodPlan {
    /// Ingress (None: not isolated).
    pub ingress: Option<DirPlan>,
    /// Egress (None: not isolated).
    pub egress: Option<DirPlan>,
    /// The policies selecting the pod.
    pub selected_by: Vec<u32>,
}

/// A policy cannot be compiled for a pod.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CompileError {
    /// More distinct port classes than the datapath numbers.
    #[error("{pod}: {classes} distinct port classes in one direction (at most {MAX_CLASSES})")]
    TooManyClasses {
        /// namespace/name.
        pod: String,
        /// Classes needed.
        classes: usize,
    },
}

/// Ports of one rule part.
#[derive(Clone, Debug)]
enum Ports {
    All,
    /// (protocol, first, last) inclusive.
    Ranges(Vec<(u8, u16, u16)>),
}

/// Peers and ports allowed together (a rule, or the piece of a rule that
/// one named port resolves to one number for).
#[derive(Clone, Debug)]
struct Part {
    peers: AddrSet,
    ports: Ports,
}

fn protocol(p: Option<&str>) -> Option<u8> {
    match p.unwrap_or("TCP") {
        "TCP" => Some(TCP),
        "UDP" => Some(UDP),
        "SCTP" => Some(SCTP),
        _ => None,
    }
}

fn port_u16(n: i32) -> Option<u16> {
    u16::try_from(n).ok().filter(|&p| p != 0)
}

/// The addresses one peer entry names.
fn peer_addrs(peers: &Peers, policy_ns: &str, peer: &NetworkPolicyPeer, label: u32) -> AddrSet {
    if let Some(block) = &peer.ip_block {
        let Ok(cidr) = block.cidr.parse::<Ipv4Net>() else {
            return AddrSet::default();
        };
        let excepts: Vec<AddrSet> = block
            .except
            .iter()
            .flatten()
            .filter_map(|e| e.parse::<Ipv4Net>().ok())
            .map(|n| AddrSet::net(n, 0))
            .collect();
        return AddrSet::net(cidr.trunc(), label).minus(&AddrSet::union(&excepts));
    }
    if peer.pod_selector.is_none() && peer.namespace_selector.is_none() {
        return AddrSet::default();
    }
    // Each namespace's verdict once.
    let mut namespace_ok: HashMap<&str, bool> = HashMap::new();
    let sets: Vec<AddrSet> = peers
        .candidates(
            policy_ns,
            peer.pod_selector.as_ref(),
            peer.namespace_selector.is_some(),
        )
        .iter()
        .map(|&i| &*peers.pods[i])
        .filter(|pod| match &peer.namespace_selector {
            None => pod.namespace == policy_ns,
            Some(sel) => *namespace_ok
                .entry(pod.namespace.as_str())
                .or_insert_with(|| matches(sel, &peers.namespace_labels(&pod.namespace))),
        })
        .filter(|pod| {
            peer.pod_selector
                .as_ref()
                .is_none_or(|sel| matches(sel, &pod.labels))
        })
        .flat_map(|pod| pod.addrs.iter().map(|&a| AddrSet::addr(a, label)))
        .collect();
    AddrSet::union(&sets)
}

/// The parts of one rule (peers, ports) of policy `label` for `pod` in
/// direction `ingress`.
fn rule_parts(
    peers_of: &Peers,
    pod: &PodView,
    policy_ns: &str,
    label: u32,
    peers: Option<&[NetworkPolicyPeer]>,
    ports: Option<&[NetworkPolicyPort]>,
    ingress: bool,
) -> Vec<Part> {
    let peers = match peers {
        None | Some([]) => AddrSet::all(label),
        Some(list) => {
            let sets: Vec<AddrSet> = list
                .iter()
                .map(|p| peer_addrs(peers_of, policy_ns, p, label))
                .collect();
            AddrSet::union(&sets)
        }
    };
    if peers.is_empty() {
        return Vec::new();
    }
    let Some(ports) = ports.filter(|p| !p.is_empty()) else {
        return vec![Part {
            peers,
            ports: Ports::All,
        }];
    };
    let mut numbered = Vec::new();
    // (protocol, port) → the peers a named port resolves to it for.
    let mut named: BTreeMap<(u8, u16), Vec<AddrSet>> = BTreeMap::new();
    for p in ports {
        let Some(proto) = protocol(p.protocol.as_deref()) else {
            continue;
        };
        match &p.port {
            None => numbered.push((proto, 0, u16::MAX)),
            Some(IntOrString::Int(n)) => {
                let Some(first) = port_u16(*n) else { continue };
                let last = p.end_port.and_then(port_u16).unwrap_or(first).max(first);
                numbered.push((proto, first, last));
            }
            Some(IntOrString::String(name)) => {
                let resolve = |target: &PodView| {
                    target
                        .ports
                        .iter()
                        .find(|np| np.name == *name && np.proto == proto)
                        .map(|np| np.port)
                };
                if ingress {
                    if let Some(port) = resolve(pod) {
                        numbered.push((proto, port, port));
                    }
                } else {
                    for target in peers_of.pods.iter().map(|p| &**p) {
                        let Some(port) = resolve(target) else {
                            continue;
                        };
                        let mine: Vec<AddrSet> = target
                            .addrs
                            .iter()
                            .filter(|a| peers.contains(**a))
                            .map(|&a| AddrSet::addr(a, label))
                            .collect();
                        if !mine.is_empty() {
                            named
                                .entry((proto, port))
                                .or_default()
                                .push(AddrSet::union(&mine));
                        }
                    }
                }
            }
        }
    }
    let mut parts = Vec::new();
    if !numbered.is_empty() {
        parts.push(Part {
            peers,
            ports: Ports::Ranges(numbered),
        });
    }
    for ((proto, port), sets) in named {
        parts.push(Part {
            peers: AddrSet::union(&sets),
            ports: Ports::Ranges(vec![(proto, port, port)]),
        });
    }
    parts
}

/// Cuts the port space into classes (parts matching the same way share
/// one) and lists each class's peers.
fn classes(parts: &[&Part], who: &str) -> Result<DirPlan, CompileError> {
    let mut ids: HashMap<Vec<usize>, u16> = HashMap::new();
    let mut plan = DirPlan::default();
    let mut class_of = |set: Vec<usize>, plan: &mut DirPlan| -> Result<u16, CompileError> {
        if let Some(&c) = ids.get(&set) {
            return Ok(c);
        }
        let next = ids.len() + 1;
        if next > MAX_CLASSES {
            return Err(CompileError::TooManyClasses {
                pod: who.to_owned(),
                classes: next,
            });
        }
        let c = next as u16;
        let peers = AddrSet::union(set.iter().map(|&i| &parts[i].peers));
        for (addr, bits, label) in peers.prefixes() {
            plan.peers.push((c, addr, bits, label));
        }
        ids.insert(set, c);
        Ok(c)
    };
    let everywhere: Vec<usize> = (0..parts.len())
        .filter(|&i| matches!(parts[i].ports, Ports::All))
        .collect();
    // The class of the parts with every port, once (a protocol no part
    // names ports of has that class alone: 10,000 such parts are one union,
    // not one per protocol).
    let mut everywhere_class: Option<u16> = None;
    for proto in PORT_PROTOCOLS {
        let mut bounds: BTreeSet<u32> = BTreeSet::from([0, 1 << 16]);
        let mut ranges: Vec<(u32, u32, usize)> = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            if let Ports::Ranges(rs) = &part.ports {
                for &(p, first, last) in rs {
                    if p == proto {
                        bounds.insert(u32::from(first));
                        bounds.insert(u32::from(last) + 1);
                        ranges.push((u32::from(first), u32::from(last) + 1, i));
                    }
                }
            }
        }
        if ranges.is_empty() && everywhere.is_empty() {
            continue;
        }
        if ranges.is_empty() {
            let class = match everywhere_class {
                Some(c) => c,
                None => class_of(everywhere.clone(), &mut plan)?,
            };
            everywhere_class = Some(class);
            plan.ports.push((proto, 0, 0, class));
            continue;
        }
        let bounds: Vec<u32> = bounds.into_iter().collect();
        for w in bounds.windows(2) {
            let (start, end) = (w[0], w[1]);
            let mut set: Vec<usize> = everywhere.clone();
            set.extend(
                ranges
                    .iter()
                    .filter(|&&(s, e, _)| s <= start && start < e)
                    .map(|&(_, _, i)| i),
            );
            if set.is_empty() {
                continue;
            }
            if !set.windows(2).all(|w| w[0] < w[1]) {
                set.sort_unstable();
                set.dedup();
            }
            let class = class_of(set, &mut plan)?;
            for (first, bits) in aligned_blocks(u64::from(start), u64::from(end), 16) {
                plan.ports.push((proto, first as u16, bits, class));
            }
        }
    }
    if !everywhere.is_empty() {
        let class = match everywhere_class {
            Some(c) => c,
            None => class_of(everywhere, &mut plan)?,
        };
        plan.ports.push((OTHER, 0, 0, class));
    }
    Ok(plan)
}

/// What one policy contributes to one pod: whether it selects the pod,
/// and its rules' parts per direction it isolates. A pure function of the
/// policy, the pod and the peers ([`compile_policy`]), so the agent keeps
/// it while those are the same objects and compiles only what changed.
#[derive(Clone, Debug, Default)]
pub struct Compiled {
    /// The policy's number.
    id: u32,
    /// Whether the policy selects the pod.
    selects: bool,
    /// Ingress parts (None: the policy isolates no ingress).
    ingress: Option<Vec<Part>>,
    /// Egress parts (None: the policy isolates no egress).
    egress: Option<Vec<Part>>,
}

impl Compiled {
    /// The number of the policy it was compiled from.
    pub fn id(&self) -> u32 {
        self.id
    }
}

/// What policy `pv` contributes to the local pod `pod`.
pub fn compile_policy(peers: &Peers, pod: &PodView, pv: &PolicyView<'_>) -> Compiled {
    let mut out = Compiled {
        id: pv.id,
        ..Compiled::default()
    };
    if !pv.selects(pod) {
        return out;
    }
    out.selects = true;
    let (ing, eg) = pv.types();
    let Some(spec) = pv.policy.spec.as_ref() else {
        return out;
    };
    let ns = pv.namespace();
    if ing {
        let parts = out.ingress.get_or_insert_with(Vec::new);
        for rule in spec.ingress.iter().flatten() {
            parts.extend(rule_parts(
                peers,
                pod,
                ns,
                pv.id,
                rule.from.as_deref(),
                rule.ports.as_deref(),
                true,
            ));
        }
    }
    if eg {
        let parts = out.egress.get_or_insert_with(Vec::new);
        for rule in spec.egress.iter().flatten() {
            parts.extend(rule_parts(
                peers,
                pod,
                ns,
                pv.id,
                rule.to.as_deref(),
                rule.ports.as_deref(),
                false,
            ));
        }
    }
    out
}

/// The plan of pod `who` (namespace/name) from what every policy
/// contributes to it, in the policies' order.
pub fn assemble<'a>(
    compiled: impl IntoIterator<Item = &'a Compiled>,
    who: &str,
) -> Result<PodPlan, CompileError> {
    let mut plan = PodPlan::default();
    let mut ingress: Option<Vec<&Part>> = None;
    let mut egress: Option<Vec<&Part>> = None;
    for c in compiled {
        if !c.selects {
            continue;
        }
        plan.selected_by.push(c.id);
        if let Some(parts) = &c.ingress {
            ingress.get_or_insert_with(Vec::new).extend(parts);
        }
        if let Some(parts) = &c.egress {
            egress.get_or_insert_with(Vec::new).extend(parts);
        }
    }
    plan.ingress = ingress.map(|p| classes(&p, who)).transpose()?;
    plan.egress = egress.map(|p| classes(&p, who)).transpose()?;
    Ok(plan)
}

/// The compiled policy of the local pod `pod`, from scratch.
pub fn compile_pod(view: &View<'_>, pod: &PodView) -> Result<PodPlan, CompileError> {
    let compiled: Vec<Compiled> = view
        .policies
        .iter()
        .map(|pv| compile_policy(view.peers, pod, pv))
        .collect();
    assemble(&compiled, &format!("{}/{}", pod.namespace, pod.name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, app: &str, ip: [u8; 4], ports: &[(&str, u16, u8)]) -> PodView {
        PodView {
            namespace: ns.into(),
            name: name.into(),
            labels: Labels::from([("app".to_owned(), app.to_owned())]),
            addrs: vec![Ipv4Addr::from(ip)],
            ports: ports
                .iter()
                .map(|&(n, port, proto)| NamedPort {
                    name: n.into(),
                    port,
                    proto,
                })
                .collect(),
        }
    }

    fn policy(yaml: &str) -> NetworkPolicy {
        serde_yaml::from_str(yaml).expect("policy yaml")
    }

    /// The (class → ports) and (class → peers) of a direction, for asserts.
    fn allowed(d: &DirPlan, proto: u8, port: u16) -> Vec<(Ipv4Addr, u8)> {
        let class = d.ports.iter().find(|&&(p, first, bits, _)| {
            let size = 1u32 << (16 - u32::from(bits));
            p == proto
                && u32::from(first) <= u32::from(port)
                && u32::from(port) < u32::from(first) + size
        });
        let Some(&(_, _, _, class)) = class else {
            return Vec::new();
        };
        d.peers
            .iter()
            .filter(|p| p.0 == class)
            .map(|p| (p.1, p.2))
            .collect()
    }

    #[test]
    fn a_named_egress_port_means_each_peer_pods_own_number() {
        let np = policy(
            "metadata: {name: p, namespace: x}\nspec:\n  podSelector: {matchLabels: {app: client}}\n  policyTypes: [Egress]\n  egress:\n  - ports: [{port: http}]\n",
        );
        let pods: Vec<Arc<PodView>> = [
            pod("x", "c", "client", [10, 0, 0, 1], &[]),
            pod("x", "s1", "web", [10, 0, 0, 2], &[("http", 8080, TCP)]),
            pod("y", "s2", "web", [10, 0, 0, 3], &[("http", 9090, TCP)]),
            pod("y", "s3", "web", [10, 0, 0, 4], &[("http", 9090, UDP)]),
        ]
        .into_iter()
        .map(Arc::new)
        .collect();
        let scan = Peers::unindexed(HashMap::new(), pods.clone());
        let view = View {
            peers: &scan,
            policies: vec![PolicyView { id: 1, policy: &np }],
        };
        let plan = compile_pod(&view, &pods[0]).expect("compiles");
        let indexed = Peers::new(HashMap::new(), pods.clone());
        let view = View {
            peers: &indexed,
            ..view
        };
        assert_eq!(
            compile_pod(&view, &pods[0]).expect("compiles"),
            plan,
            "the label index changes nothing"
        );
        assert!(plan.ingress.is_none(), "egress only");
        let eg = plan.egress.expect("egress isolated");
        assert_eq!(
            allowed(&eg, TCP, 8080),
            vec![(Ipv4Addr::new(10, 0, 0, 2), 32)]
        );
        assert_eq!(
            allowed(&eg, TCP, 9090),
            vec![(Ipv4Addr::new(10, 0, 0, 3), 32)]
        );
        assert!(allowed(&eg, UDP, 9090).is_empty(), "the name is TCP's");
        assert!(allowed(&eg, TCP, 80).is_empty());
        assert!(
            !eg.ports.iter().any(|p| p.0 == OTHER),
            "a rule with ports allows no ICMP"
        );
    }

    #[test]
    fn ranges_and_blocks_cut_into_classes() {
        let np = policy(
            "metadata: {name: p, namespace: x}\nspec:\n  podSelector: {}\n  ingress:\n  - from: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16]}}]\n    ports: [{port: 80, endPort: 90}]\n  - from: [{ipBlock: {cidr: 10.1.2.0/24}}]\n    ports: [{port: 85, protocol: TCP}]\n  - {}\n",
        );
        let peers = Peers::new(
            HashMap::new(),
            vec![Arc::new(pod("x", "s", "db", [10, 0, 0, 9], &[]))],
        );
        let view = View {
            peers: &peers,
            policies: vec![PolicyView { id: 7, policy: &np }],
        };
        let ing = compile_pod(&view, &peers.pods[0])
            .expect("compiles")
            .ingress
            .expect("isolated");
        // The empty rule allows everything everywhere, ICMP included.
        for (proto, port) in [(TCP, 22), (TCP, 85), (UDP, 53), (OTHER, 0)] {
            assert_eq!(
                allowed(&ing, proto, port),
                vec![(Ipv4Addr::UNSPECIFIED, 0)],
                "{proto}/{port}"
            );
        }
        let closed = policy(
            "metadata: {name: p, namespace: x}\nspec:\n  podSelector: {}\n  ingress:\n  - from: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16]}}]\n    ports: [{port: 80, endPort: 90}]\n  - from: [{ipBlock: {cidr: 10.1.2.0/24}}]\n    ports: [{port: 85, protocol: TCP}]\n",
        );
        let without_open = View {
            policies: vec![PolicyView {
                id: 7,
                policy: &closed,
            }],
            ..view.clone()
        };
        let ing = compile_pod(&without_open, &peers.pods[0])
            .expect("compiles")
            .ingress
            .expect("isolated");
        let covers = |peers: &[(Ipv4Addr, u8)], a: [u8; 4]| {
            let a = u32::from(Ipv4Addr::from(a));
            peers.iter().any(|&(net, bits)| {
                let mask = if bits == 0 {
                    0
                } else {
                    u32::MAX << (32 - bits)
                };
                a & mask == u32::from(net)
            })
        };
        let p80 = allowed(&ing, TCP, 80);
        assert!(covers(&p80, [10, 2, 3, 4]) && !covers(&p80, [10, 1, 2, 3]));
        let p85 = allowed(&ing, TCP, 85);
        assert!(covers(&p85, [10, 2, 3, 4]) && covers(&p85, [10, 1, 2, 3]));
        assert!(!covers(&p85, [10, 1, 3, 3]), "the except stays cut out");
        assert!(allowed(&ing, TCP, 91).is_empty());
        assert!(allowed(&ing, OTHER, 0).is_empty());
    }
}
