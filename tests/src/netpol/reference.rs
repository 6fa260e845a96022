//! A reference evaluator of Kubernetes `networking.k8s.io/v1` NetworkPolicy,
//! written from the semantics of the API alone, to say what the datapath
//! must allow.
//!
//! - A pod is isolated for a direction when a policy of its namespace
//!   selects it (`podSelector`, empty = every pod of the namespace) and that
//!   policy's effective `policyTypes` hold the direction. Absent or empty
//!   `policyTypes` mean `Ingress`, plus `Egress` when the policy has a
//!   non-empty `egress` list.
//! - A pod that is not isolated for a direction allows it. An isolated pod
//!   allows what some rule (of that direction) of some selecting policy
//!   allows: the union of the rules.
//! - A rule without peers matches every peer, pods and plain addresses; a
//!   rule without ports matches every port and protocol.
//! - Peers: `podSelector` alone picks pods of the policy's namespace,
//!   `namespaceSelector` alone every pod of the picked namespaces, both
//!   together the picked pods of the picked namespaces; selectors pick pods
//!   only. `ipBlock` matches an address inside `cidr` and inside no
//!   `except`, pod addresses included.
//! - Ports: `protocol` defaults to TCP; no `port` is every port of the
//!   protocol; `endPort` widens a numeric port to the inclusive range; a
//!   named port is looked up in the destination pod's container ports (name
//!   and protocol both), so it never matches a destination that is no pod.
//! - A namespace's labels always include `kubernetes.io/metadata.name`
//!   set to its name, whatever its object says.
//!
//! Specifications the API server refuses (a peer with no selector and no
//! `ipBlock`, `ipBlock` beside a selector, an unknown protocol or operator, a
//! CIDR that is not IPv4) match nothing here.

use std::{collections::BTreeMap, fmt, net::Ipv4Addr};

use ipnet::Ipv4Net;
use k8s_openapi::{
    api::{
        core::v1::{Namespace as NamespaceObject, Pod},
        networking::v1::{IPBlock, NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort},
    },
    apimachinery::pkg::{apis::meta::v1::LabelSelector, util::intstr::IntOrString},
};
use serde::Deserialize as _;
use serde_json::Value;

/// Labels of an object.
pub type Labels = BTreeMap<String, String>;

/// The label the API server gives every namespace, valued with its name.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// A transport protocol a policy port can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proto {
    /// TCP (the default of a policy port).
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Proto {
    /// The protocol a Kubernetes object names (`TCP`, `UDP`, `SCTP`).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "TCP" => Some(Self::Tcp),
            "UDP" => Some(Self::Udp),
            "SCTP" => Some(Self::Sctp),
            _ => None,
        }
    }

    /// The name Kubernetes objects use: `TCP`, `UDP`, `SCTP`.
    pub const fn k8s_name(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
            Self::Sctp => "SCTP",
        }
    }
}

impl fmt::Display for Proto {
    /// `tcp`, `udp`, `sctp`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
            Self::Sctp => "sctp",
        })
    }
}

/// A traffic direction, seen from the pod a policy selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Traffic the pod receives.
    Ingress,
    /// Traffic the pod sends.
    Egress,
}

/// A namespace: its name and the labels of its object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Namespace {
    /// Name.
    pub name: String,
    /// Labels as the object gives them (see [`Cluster::namespace_labels`]
    /// for the effective ones).
    pub labels: Labels,
}

/// A pod as policies see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodInfo {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its labels.
    pub labels: Labels,
    /// Its address.
    pub ip: Ipv4Addr,
    /// Its containers' ports: (name, number, protocol); the name is empty
    /// for an unnamed port.
    pub ports: Vec<(String, u16, Proto)>,
}

/// One end of a connection.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Peer {
    /// A pod of the cluster, by namespace and name. One the cluster does not
    /// hold has no address and no labels: no policy selects it and only
    /// rules without peers match it.
    Pod {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// An address that is no pod.
    Ip(Ipv4Addr),
}

impl Peer {
    /// The pod `namespace/name`.
    pub fn pod(namespace: &str, name: &str) -> Self {
        Self::Pod {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }
}

impl fmt::Display for Peer {
    /// `namespace/name` or the address.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pod { namespace, name } => write!(f, "{namespace}/{name}"),
            Self::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// A document the model cannot take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelError(pub String);

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ModelError {}

/// Namespaces, pods and policies: everything a verdict depends on.
#[derive(Clone, Debug, Default)]
pub struct Cluster {
    /// Namespaces with objects.
    pub namespaces: Vec<Namespace>,
    /// Pods.
    pub pods: Vec<PodInfo>,
    /// Policies (a missing `metadata.namespace` is `default`).
    pub policies: Vec<NetworkPolicy>,
}

/// The objects of `text`: YAML or JSON, one object, several `---`
/// documents, `v1` Lists (flattened); empty documents are skipped.
pub fn documents(text: &str) -> Result<Vec<Value>, ModelError> {
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let yaml = serde_yaml::Value::deserialize(doc)
            .map_err(|e| ModelError(format!("not YAML: {e}")))?;
        if yaml.is_null() {
            continue;
        }
        let json =
            serde_json::to_value(&yaml).map_err(|e| ModelError(format!("not an object: {e}")))?;
        flatten(json, &mut out)?;
    }
    Ok(out)
}

/// Pushes `value`, or the items of a List, to `out`.
fn flatten(value: Value, out: &mut Vec<Value>) -> Result<(), ModelError> {
    if value.get("kind").and_then(Value::as_str) == Some("List") {
        let items = value
            .get("items")
            .and_then(Value::as_array)
            .ok_or_else(|| ModelError("a List without items".into()))?;
        for item in items {
            flatten(item.clone(), out)?;
        }
    } else {
        out.push(value);
    }
    Ok(())
}

/// The `kind` of an object.
fn kind_of(object: &Value) -> Result<&str, ModelError> {
    object
        .get("kind")
        .and_then(Value::as_str)
        .ok_or_else(|| ModelError(format!("an object without kind: {object}")))
}

/// `metadata.name` and `metadata.namespace` (default `default`).
fn name_of(object: &Value) -> Result<(String, String), ModelError> {
    let meta = object.get("metadata");
    let name = meta
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .ok_or_else(|| ModelError(format!("an object without metadata.name: {object}")))?;
    let namespace = meta
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    Ok((namespace.to_owned(), name.to_owned()))
}

/// A typed object from its JSON form.
fn typed<T: serde::de::DeserializeOwned>(object: Value, what: &str) -> Result<T, ModelError> {
    serde_json::from_value(object).map_err(|e| ModelError(format!("{what}: {e}")))
}

/// The namespace of a policy (`default` when it names none).
fn policy_namespace(policy: &NetworkPolicy) -> &str {
    policy.metadata.namespace.as_deref().unwrap_or("default")
}

/// The name of a policy.
fn policy_name(policy: &NetworkPolicy) -> &str {
    policy.metadata.name.as_deref().unwrap_or("")
}

/// The model of a Pod object: its labels, its IPv4 address
/// (`status.podIP`, else the first IPv4 of `status.podIPs`) and its
/// containers' ports.
fn pod_info(pod: &Pod) -> Result<PodInfo, ModelError> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let namespace = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let status = pod.status.as_ref();
    let from_ip = status
        .and_then(|s| s.pod_ip.as_deref())
        .and_then(|ip| ip.parse().ok());
    let from_ips = status
        .and_then(|s| s.pod_ips.as_ref())
        .and_then(|ips| ips.iter().find_map(|ip| ip.ip.parse().ok()));
    let ip = from_ip
        .or(from_ips)
        .ok_or_else(|| ModelError(format!("pod {namespace}/{name} has no IPv4 podIP")))?;
    let mut ports = Vec::new();
    for container in pod.spec.iter().flat_map(|s| &s.containers) {
        for port in container.ports.iter().flatten() {
            let number = u16::try_from(port.container_port).map_err(|_| {
                ModelError(format!(
                    "pod {namespace}/{name}: containerPort {} out of range",
                    port.container_port
                ))
            })?;
            let proto_name = port.protocol.as_deref().unwrap_or("TCP");
            let proto = Proto::parse(proto_name).ok_or_else(|| {
                ModelError(format!(
                    "pod {namespace}/{name}: unknown protocol {proto_name}"
                ))
            })?;
            ports.push((port.name.clone().unwrap_or_default(), number, proto));
        }
    }
    Ok(PodInfo {
        labels: pod.metadata.labels.clone().unwrap_or_default(),
        namespace,
        name,
        ip,
        ports,
    })
}

impl Cluster {
    /// An empty cluster.
    pub fn new() -> Self {
        Self::default()
    }

    /// A cluster holding the objects of `text` (see [`Cluster::apply`]).
    pub fn from_yaml(text: &str) -> Result<Self, ModelError> {
        let mut cluster = Self::new();
        cluster.apply(text)?;
        Ok(cluster)
    }

    /// Stores every Namespace, Pod and NetworkPolicy of `text`, each
    /// replacing the object of the same kind, namespace and name. Any other
    /// kind is an error; nothing is stored then.
    pub fn apply(&mut self, text: &str) -> Result<(), ModelError> {
        let mut next = self.clone();
        for object in documents(text)? {
            match kind_of(&object)? {
                "Namespace" => {
                    let ns: NamespaceObject = typed(object, "Namespace")?;
                    let name = ns
                        .metadata
                        .name
                        .ok_or_else(|| ModelError("a Namespace without name".into()))?;
                    next.namespaces.retain(|n| n.name != name);
                    next.namespaces.push(Namespace {
                        name,
                        labels: ns.metadata.labels.unwrap_or_default(),
                    });
                }
                "Pod" => {
                    let pod = pod_info(&typed(object, "Pod")?)?;
                    next.pods
                        .retain(|p| (&p.namespace, &p.name) != (&pod.namespace, &pod.name));
                    next.pods.push(pod);
                }
                "NetworkPolicy" => {
                    let mut policy: NetworkPolicy = typed(object, "NetworkPolicy")?;
                    let namespace = policy_namespace(&policy).to_owned();
                    policy.metadata.namespace = Some(namespace.clone());
                    let name = policy_name(&policy).to_owned();
                    next.policies
                        .retain(|p| (policy_namespace(p), policy_name(p)) != (&*namespace, &*name));
                    next.policies.push(policy);
                }
                other => return Err(ModelError(format!("the model holds no {other}"))),
            }
        }
        *self = next;
        Ok(())
    }

    /// Removes the Namespaces, Pods and NetworkPolicies `text` names (by
    /// kind, namespace and name); names of objects the model does not hold
    /// are no error. Removing a Namespace removes only that object.
    pub fn delete(&mut self, text: &str) -> Result<(), ModelError> {
        let mut next = self.clone();
        for object in documents(text)? {
            let kind = kind_of(&object)?.to_owned();
            let (namespace, name) = name_of(&object)?;
            match kind.as_str() {
                "Namespace" => next.namespaces.retain(|n| n.name != name),
                "Pod" => next
                    .pods
                    .retain(|p| (&p.namespace, &p.name) != (&namespace, &name)),
                "NetworkPolicy" => next
                    .policies
                    .retain(|p| (policy_namespace(p), policy_name(p)) != (&*namespace, &*name)),
                other => return Err(ModelError(format!("the model holds no {other}"))),
            }
        }
        *self = next;
        Ok(())
    }

    /// The pod `namespace/name`.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&PodInfo> {
        self.pods
            .iter()
            .find(|p| p.namespace == namespace && p.name == name)
    }

    /// The effective labels of namespace `name`: its object's labels (none
    /// without an object) with [`NAMESPACE_NAME_LABEL`] set to `name`.
    pub fn namespace_labels(&self, name: &str) -> Labels {
        let mut labels = self
            .namespaces
            .iter()
            .find(|n| n.name == name)
            .map(|n| n.labels.clone())
            .unwrap_or_default();
        labels.insert(NAMESPACE_NAME_LABEL.to_owned(), name.to_owned());
        labels
    }

    /// The pod a peer names, if the cluster holds it.
    fn pod_of(&self, peer: &Peer) -> Option<&PodInfo> {
        match peer {
            Peer::Pod { namespace, name } => self.pod(namespace, name),
            Peer::Ip(_) => None,
        }
    }

    /// The address of a peer (none for a pod the cluster does not hold).
    fn ip_of(&self, peer: &Peer) -> Option<Ipv4Addr> {
        match peer {
            Peer::Pod { .. } => self.pod_of(peer).map(|p| p.ip),
            Peer::Ip(ip) => Some(*ip),
        }
    }

    /// The policies that select `pod` and isolate it for `direction`.
    pub fn isolating(&self, pod: &PodInfo, direction: Direction) -> Vec<&NetworkPolicy> {
        self.policies
            .iter()
            .filter(|p| policy_namespace(p) == pod.namespace)
            .filter(|p| {
                let spec = p.spec.as_ref();
                let everything = LabelSelector::default();
                let selector = spec
                    .and_then(|s| s.pod_selector.as_ref())
                    .unwrap_or(&everything);
                selector_matches(selector, &pod.labels)
            })
            .filter(|p| has_type(p, direction))
            .collect()
    }

    /// Whether `pod` is isolated for `direction`.
    pub fn is_isolated(&self, pod: &PodInfo, direction: Direction) -> bool {
        !self.isolating(pod, direction).is_empty()
    }

    /// Whether `dst` (if it is a pod) lets in `proto`/`port` from `src`.
    pub fn ingress_allowed(&self, src: &Peer, dst: &Peer, proto: Proto, port: u16) -> bool {
        let Some(pod) = self.pod_of(dst) else {
            return true;
        };
        let policies = self.isolating(pod, Direction::Ingress);
        if policies.is_empty() {
            return true;
        }
        policies.iter().any(|policy| {
            let rules = policy.spec.as_ref().and_then(|s| s.ingress.as_ref());
            rules.into_iter().flatten().any(|rule| {
                self.peers_match(rule.from.as_deref(), policy_namespace(policy), src)
                    && ports_match(rule.ports.as_deref(), Some(pod), proto, port)
            })
        })
    }

    /// Whether `src` (if it is a pod) may send `proto`/`port` to `dst`.
    pub fn egress_allowed(&self, src: &Peer, dst: &Peer, proto: Proto, port: u16) -> bool {
        let Some(pod) = self.pod_of(src) else {
            return true;
        };
        let policies = self.isolating(pod, Direction::Egress);
        if policies.is_empty() {
            return true;
        }
        let dst_pod = self.pod_of(dst);
        policies.iter().any(|policy| {
            let rules = policy.spec.as_ref().and_then(|s| s.egress.as_ref());
            rules.into_iter().flatten().any(|rule| {
                self.peers_match(rule.to.as_deref(), policy_namespace(policy), dst)
                    && ports_match(rule.ports.as_deref(), dst_pod, proto, port)
            })
        })
    }

    /// Whether a connection from `src` to `dst` on `proto`/`port` is
    /// allowed: egress at `src` and ingress at `dst`.
    pub fn allowed(&self, src: &Peer, dst: &Peer, proto: Proto, port: u16) -> bool {
        self.egress_allowed(src, dst, proto, port) && self.ingress_allowed(src, dst, proto, port)
    }

    /// Whether a rule's peers (`from` or `to`) match `target`; no or no
    /// peers match everything.
    fn peers_match(
        &self,
        peers: Option<&[NetworkPolicyPeer]>,
        policy_ns: &str,
        target: &Peer,
    ) -> bool {
        match peers {
            None | Some([]) => true,
            Some(peers) => peers
                .iter()
                .any(|peer| self.peer_matches(peer, policy_ns, target)),
        }
    }

    /// Whether one peer of a rule of a policy in `policy_ns` matches
    /// `target`.
    fn peer_matches(&self, peer: &NetworkPolicyPeer, policy_ns: &str, target: &Peer) -> bool {
        let selectors = peer.pod_selector.is_some() || peer.namespace_selector.is_some();
        match (&peer.ip_block, selectors) {
            (Some(block), false) => self
                .ip_of(target)
                .is_some_and(|ip| ip_block_matches(block, ip)),
            (None, true) => {
                let Some(pod) = self.pod_of(target) else {
                    return false;
                };
                let namespace_ok = match &peer.namespace_selector {
                    None => pod.namespace == policy_ns,
                    Some(sel) => selector_matches(sel, &self.namespace_labels(&pod.namespace)),
                };
                let pod_ok = peer
                    .pod_selector
                    .as_ref()
                    .is_none_or(|sel| selector_matches(sel, &pod.labels));
                namespace_ok && pod_ok
            }
            _ => false,
        }
    }
}

/// Whether `policy`'s effective `policyTypes` hold `direction`.
fn has_type(policy: &NetworkPolicy, direction: Direction) -> bool {
    let spec = policy.spec.as_ref();
    match spec.and_then(|s| s.policy_types.as_deref()) {
        Some(types) if !types.is_empty() => {
            let wanted = match direction {
                Direction::Ingress => "Ingress",
                Direction::Egress => "Egress",
            };
            types.iter().any(|t| t == wanted)
        }
        _ => match direction {
            Direction::Ingress => true,
            Direction::Egress => spec
                .and_then(|s| s.egress.as_ref())
                .is_some_and(|e| !e.is_empty()),
        },
    }
}

/// Whether `selector` matches `labels`: every `matchLabels` pair and every
/// `matchExpressions` requirement (an empty selector matches everything).
pub fn selector_matches(selector: &LabelSelector, labels: &Labels) -> bool {
    let pairs_ok = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let expressions_ok = selector.match_expressions.iter().flatten().all(|req| {
        let value = labels.get(&req.key);
        let values = req.values.as_deref().unwrap_or_default();
        match req.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    pairs_ok && expressions_ok
}

/// Whether `ip` is inside the block's `cidr` and inside none of its
/// `except` ranges; a block that does not parse as IPv4 matches nothing.
pub fn ip_block_matches(block: &IPBlock, ip: Ipv4Addr) -> bool {
    let Ok(cidr) = block.cidr.parse::<Ipv4Net>() else {
        return false;
    };
    let mut excepts = Vec::new();
    for except in block.except.iter().flatten() {
        match except.parse::<Ipv4Net>() {
            Ok(net) => excepts.push(net),
            Err(_) => return false,
        }
    }
    cidr.contains(&ip) && !excepts.iter().any(|net| net.contains(&ip))
}

/// Whether a rule's ports match `proto`/`port` towards `dst_pod` (the
/// destination, if it is a pod); no or no ports match everything.
fn ports_match(
    ports: Option<&[NetworkPolicyPort]>,
    dst_pod: Option<&PodInfo>,
    proto: Proto,
    port: u16,
) -> bool {
    match ports {
        None | Some([]) => true,
        Some(ports) => ports.iter().any(|p| port_matches(p, dst_pod, proto, port)),
    }
}

/// Whether one policy port matches `proto`/`port` towards `dst_pod`.
fn port_matches(p: &NetworkPolicyPort, dst_pod: Option<&PodInfo>, proto: Proto, port: u16) -> bool {
    if Proto::parse(p.protocol.as_deref().unwrap_or("TCP")) != Some(proto) {
        return false;
    }
    match &p.port {
        None => true,
        Some(IntOrString::Int(first)) => {
            let last = p.end_port.unwrap_or(*first);
            (*first..=last).contains(&i32::from(port))
        }
        Some(IntOrString::String(name)) => {
            !name.is_empty()
                && dst_pod.is_some_and(|pod| {
                    pod.ports
                        .iter()
                        .any(|(n, number, pr)| n == name && *number == port && *pr == proto)
                })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: Proto = Proto::Tcp;
    const UDP: Proto = Proto::Udp;

    /// A Namespace object with labels given as `k: v` pairs.
    fn ns(name: &str, labels: &[(&str, &str)]) -> String {
        let labels: String = labels
            .iter()
            .map(|(k, v)| format!("    {k}: {v}\n"))
            .collect();
        format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n  labels:\n{labels}  annotations: {{}}\n---\n"
        )
    }

    /// A Pod object with labels and container ports `(name, port, proto)`.
    fn pod(
        namespace: &str,
        name: &str,
        labels: &[(&str, &str)],
        ip: &str,
        ports: &[(&str, u16, &str)],
    ) -> String {
        let labels: String = labels
            .iter()
            .map(|(k, v)| format!("    {k}: {v}\n"))
            .collect();
        let ports: String = ports
            .iter()
            .map(|(n, p, pr)| {
                format!("    - name: {n}\n      containerPort: {p}\n      protocol: {pr}\n")
            })
            .collect();
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {namespace}\n  labels:\n{labels}  annotations: {{}}\nspec:\n  containers:\n  - name: main\n    image: agnhost\n    ports:\n{ports}    - {{containerPort: 9, protocol: TCP}}\nstatus:\n  podIP: {ip}\n---\n"
        )
    }

    /// The cluster of the `test-network-policy` example: namespace
    /// `default` with db (role=db), frontend (role=frontend) and other
    /// (role=other); `myproject` (project=myproject) with p; `elsewhere`
    /// with q.
    fn example_cluster() -> Cluster {
        let text = [
            ns("default", &[]),
            ns("myproject", &[("project", "myproject")]),
            ns("elsewhere", &[]),
            pod("default", "db", &[("role", "db")], "10.1.0.10", &[]),
            pod(
                "default",
                "frontend",
                &[("role", "frontend")],
                "10.1.0.11",
                &[],
            ),
            pod("default", "other", &[("role", "other")], "10.1.0.12", &[]),
            pod("myproject", "p", &[("role", "x")], "10.1.1.10", &[]),
            pod("elsewhere", "q", &[("role", "frontend")], "10.1.2.10", &[]),
        ]
        .concat();
        Cluster::from_yaml(&text).expect("example cluster")
    }

    /// Namespaces x, y, z (label ns=<name>), pods a, b, c in each (label
    /// pod=<name>) with ports serve-80-tcp, serve-81-tcp, serve-80-udp,
    /// serve-81-udp; x/a is 10.0.0.1, x/b 10.0.0.2, ... z/c 10.0.0.9.
    fn xyz() -> Cluster {
        let mut text = String::new();
        let mut host = 1;
        for n in ["x", "y", "z"] {
            text += &ns(n, &[("ns", n)]);
            for p in ["a", "b", "c"] {
                text += &pod(
                    n,
                    p,
                    &[("pod", p)],
                    &format!("10.0.0.{host}"),
                    &[
                        ("serve-80-tcp", 80, "TCP"),
                        ("serve-81-tcp", 81, "TCP"),
                        ("serve-80-udp", 80, "UDP"),
                        ("serve-81-udp", 81, "UDP"),
                    ],
                );
                host += 1;
            }
        }
        Cluster::from_yaml(&text).expect("xyz cluster")
    }

    /// A NetworkPolicy `name` in `namespace` with `spec` (YAML, indented
    /// by two spaces).
    fn policy(namespace: &str, name: &str, spec: &str) -> String {
        format!(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: {name}\n  namespace: {namespace}\nspec:\n{spec}"
        )
    }

    fn with(mut c: Cluster, docs: &[String]) -> Cluster {
        for d in docs {
            c.apply(d).expect("policy applies");
        }
        c
    }

    fn p(s: &str) -> Peer {
        let (n, name) = s.split_once('/').expect("ns/name");
        Peer::pod(n, name)
    }

    fn ip(s: &str) -> Peer {
        Peer::Ip(s.parse().expect("address"))
    }

    /// Every ordered pair of distinct xyz pods allowed on `proto`/`port`.
    fn allowed_pairs(c: &Cluster, proto: Proto, port: u16) -> Vec<String> {
        let mut out = Vec::new();
        for s in &c.pods {
            for d in &c.pods {
                if s == d {
                    continue;
                }
                let (sp, dp) = (
                    Peer::pod(&s.namespace, &s.name),
                    Peer::pod(&d.namespace, &d.name),
                );
                if c.allowed(&sp, &dp, proto, port) {
                    out.push(format!("{sp}->{dp}"));
                }
            }
        }
        out
    }

    const TEST_NETWORK_POLICY: &str = r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: test-network-policy
  namespace: default
spec:
  podSelector:
    matchLabels:
      role: db
  policyTypes:
  - Ingress
  - Egress
  ingress:
  - from:
    - ipBlock:
        cidr: 172.17.0.0/16
        except:
        - 172.17.1.0/24
    - namespaceSelector:
        matchLabels:
          project: myproject
    - podSelector:
        matchLabels:
          role: frontend
    ports:
    - protocol: TCP
      port: 6379
  egress:
  - to:
    - ipBlock:
        cidr: 10.0.0.0/24
    ports:
    - protocol: TCP
      port: 5978
"#;

    #[test]
    fn test_network_policy_ingress_peers_and_port() {
        let c = with(example_cluster(), &[TEST_NETWORK_POLICY.into()]);
        let db = p("default/db");
        assert!(c.ingress_allowed(&p("default/frontend"), &db, TCP, 6379));
        assert!(c.ingress_allowed(&p("myproject/p"), &db, TCP, 6379));
        assert!(!c.ingress_allowed(&p("default/other"), &db, TCP, 6379));
        // role=frontend in another namespace: podSelector alone is the
        // policy's namespace only.
        assert!(!c.ingress_allowed(&p("elsewhere/q"), &db, TCP, 6379));
        assert!(!c.ingress_allowed(&p("default/frontend"), &db, TCP, 6380));
        assert!(!c.ingress_allowed(&p("default/frontend"), &db, UDP, 6379));
    }

    #[test]
    fn test_network_policy_ip_block_with_except() {
        let c = with(example_cluster(), &[TEST_NETWORK_POLICY.into()]);
        let db = p("default/db");
        assert!(c.ingress_allowed(&ip("172.17.0.5"), &db, TCP, 6379));
        assert!(c.ingress_allowed(&ip("172.17.255.255"), &db, TCP, 6379));
        assert!(!c.ingress_allowed(&ip("172.17.1.5"), &db, TCP, 6379));
        assert!(!c.ingress_allowed(&ip("172.18.0.1"), &db, TCP, 6379));
        assert!(!c.ingress_allowed(&ip("172.17.0.5"), &db, TCP, 22));
    }

    #[test]
    fn test_network_policy_egress_to_cidr_and_port() {
        let c = with(example_cluster(), &[TEST_NETWORK_POLICY.into()]);
        let db = p("default/db");
        assert!(c.egress_allowed(&db, &ip("10.0.0.7"), TCP, 5978));
        assert!(!c.egress_allowed(&db, &ip("10.0.1.7"), TCP, 5978));
        assert!(!c.egress_allowed(&db, &ip("10.0.0.7"), TCP, 5979));
        assert!(!c.egress_allowed(&db, &ip("10.0.0.7"), UDP, 5978));
        // Egress-isolated: even pods allowed in are not reachable from db.
        assert!(!c.allowed(&db, &p("default/frontend"), TCP, 6379));
        // frontend is not selected: its egress is open, db's ingress decides.
        assert!(c.allowed(&p("default/frontend"), &db, TCP, 6379));
        assert!(c.allowed(&p("default/frontend"), &p("default/other"), UDP, 1));
    }

    #[test]
    fn default_deny_ingress() {
        let c = with(
            xyz(),
            &[policy(
                "x",
                "default-deny-ingress",
                "  podSelector: {}\n  policyTypes:\n  - Ingress\n",
            )],
        );
        for dst in ["x/a", "x/b", "x/c"] {
            assert!(!c.allowed(&p("y/a"), &p(dst), TCP, 80));
            assert!(!c.allowed(&p("z/a"), &p(dst), UDP, 81));
            assert!(!c.ingress_allowed(&ip("192.0.2.1"), &p(dst), TCP, 80));
        }
        assert!(
            c.allowed(&p("x/a"), &p("y/a"), TCP, 80),
            "egress stays open"
        );
        assert!(c.allowed(&p("y/a"), &p("z/a"), TCP, 80), "other namespaces");
        assert!(c.is_isolated(c.pod("x", "a").expect("x/a"), Direction::Ingress));
        assert!(!c.is_isolated(c.pod("x", "a").expect("x/a"), Direction::Egress));
    }

    #[test]
    fn allow_all_ingress_beside_deny() {
        let c = with(
            xyz(),
            &[
                policy(
                    "x",
                    "default-deny-ingress",
                    "  podSelector: {}\n  policyTypes:\n  - Ingress\n",
                ),
                policy(
                    "x",
                    "allow-all-ingress",
                    "  podSelector: {}\n  ingress:\n  - {}\n  policyTypes:\n  - Ingress\n",
                ),
            ],
        );
        assert!(c.allowed(&p("y/a"), &p("x/b"), UDP, 81));
        assert!(c.ingress_allowed(&ip("198.51.100.1"), &p("x/c"), TCP, 9));
        assert_eq!(allowed_pairs(&c, TCP, 80).len(), 72);
    }

    #[test]
    fn default_deny_egress_and_allow_all_egress() {
        let deny = policy(
            "x",
            "default-deny-egress",
            "  podSelector: {}\n  policyTypes:\n  - Egress\n",
        );
        let c = with(xyz(), std::slice::from_ref(&deny));
        assert!(!c.allowed(&p("x/a"), &p("y/a"), TCP, 80));
        assert!(!c.egress_allowed(&p("x/a"), &ip("8.8.8.8"), UDP, 53));
        assert!(
            c.allowed(&p("y/a"), &p("x/a"), TCP, 80),
            "ingress stays open"
        );
        let allow = policy(
            "x",
            "allow-all-egress",
            "  podSelector: {}\n  egress:\n  - {}\n  policyTypes:\n  - Egress\n",
        );
        let c = with(c, &[allow]);
        assert!(c.allowed(&p("x/a"), &p("y/a"), TCP, 80));
        assert!(c.egress_allowed(&p("x/a"), &ip("8.8.8.8"), UDP, 53));
    }

    #[test]
    fn default_deny_all_both_directions() {
        let c = with(
            xyz(),
            &[policy(
                "y",
                "default-deny-all",
                "  podSelector: {}\n  policyTypes:\n  - Ingress\n  - Egress\n",
            )],
        );
        assert!(!c.allowed(&p("y/a"), &p("y/b"), TCP, 80));
        assert!(!c.allowed(&p("x/a"), &p("y/b"), TCP, 80));
        assert!(!c.allowed(&p("y/a"), &p("x/b"), UDP, 80));
        assert!(c.allowed(&p("x/a"), &p("z/b"), UDP, 80));
        // 72 pairs, minus the 3*8 out of y, minus the 6*3 from x and z into y.
        assert_eq!(allowed_pairs(&c, TCP, 81).len(), 72 - 24 - 18);
    }

    #[test]
    fn namespace_and_pod_selector_in_one_peer_is_and() {
        let c = with(
            xyz(),
            &[policy(
                "x",
                "and",
                "  podSelector:\n    matchLabels:\n      pod: a\n  ingress:\n  - from:\n    - namespaceSelector:\n        matchLabels:\n          ns: y\n      podSelector:\n        matchLabels:\n          pod: b\n",
            )],
        );
        let dst = p("x/a");
        assert!(c.allowed(&p("y/b"), &dst, TCP, 80));
        assert!(!c.allowed(&p("y/a"), &dst, TCP, 80));
        assert!(!c.allowed(&p("x/b"), &dst, TCP, 80));
        assert!(!c.allowed(&p("z/b"), &dst, TCP, 80));
        assert!(c.allowed(&p("z/b"), &p("x/b"), TCP, 80), "x/b not selected");
    }

    #[test]
    fn namespace_and_pod_selector_as_two_peers_is_or() {
        let c = with(
            xyz(),
            &[policy(
                "x",
                "or",
                "  podSelector:\n    matchLabels:\n      pod: a\n  ingress:\n  - from:\n    - namespaceSelector:\n        matchLabels:\n          ns: y\n    - podSelector:\n        matchLabels:\n          pod: b\n",
            )],
        );
        let dst = p("x/a");
        for src in ["y/a", "y/b", "y/c", "x/b"] {
            assert!(c.allowed(&p(src), &dst, UDP, 81), "{src}");
        }
        for src in ["x/c", "z/a", "z/b"] {
            assert!(!c.allowed(&p(src), &dst, UDP, 81), "{src}");
        }
    }

    #[test]
    fn end_port_range_is_inclusive() {
        let c = with(
            example_cluster(),
            &[policy(
                "default",
                "multi-port-egress",
                "  podSelector:\n    matchLabels:\n      role: db\n  policyTypes:\n  - Egress\n  egress:\n  - to:\n    - ipBlock:\n        cidr: 10.0.0.0/24\n    ports:\n    - protocol: TCP\n      port: 32000\n      endPort: 32768\n",
            )],
        );
        let db = p("default/db");
        let dst = ip("10.0.0.9");
        for port in [32000, 32001, 32500, 32768] {
            assert!(c.egress_allowed(&db, &dst, TCP, port), "{port}");
        }
        for port in [31999, 32769, 80] {
            assert!(!c.egress_allowed(&db, &dst, TCP, port), "{port}");
        }
        assert!(!c.egress_allowed(&db, &dst, UDP, 32000));
    }

    #[test]
    fn allow_from_a_namespace_by_its_name_label() {
        let c = with(
            xyz(),
            &[policy(
                "x",
                "from-z",
                "  podSelector: {}\n  ingress:\n  - from:\n    - namespaceSelector:\n        matchLabels:\n          kubernetes.io/metadata.name: z\n",
            )],
        );
        assert!(c.allowed(&p("z/c"), &p("x/a"), TCP, 80));
        assert!(!c.allowed(&p("y/c"), &p("x/a"), TCP, 80));
        assert!(!c.allowed(&p("x/c"), &p("x/a"), TCP, 80));
    }

    #[test]
    fn the_namespace_name_label_cannot_be_overridden() {
        let mut c = xyz();
        c.apply(&ns("y", &[("kubernetes.io/metadata.name", "z")]))
            .expect("namespace");
        assert_eq!(
            c.namespace_labels("y").get(NAMESPACE_NAME_LABEL),
            Some(&"y".to_owned())
        );
        assert_eq!(c.namespace_labels("y").get("ns"), None, "object replaced");
        assert_eq!(
            c.namespace_labels("nowhere"),
            Labels::from([(NAMESPACE_NAME_LABEL.to_owned(), "nowhere".to_owned())])
        );
    }

    #[test]
    fn allow_a_named_port() {
        let c = with(
            xyz(),
            &[policy(
                "x",
                "named",
                "  podSelector: {}\n  ingress:\n  - ports:\n    - port: serve-81-tcp\n",
            )],
        );
        assert!(c.allowed(&p("y/a"), &p("x/a"), TCP, 81));
        assert!(!c.allowed(&p("y/a"), &p("x/a"), TCP, 80));
        assert!(!c.allowed(&p("y/a"), &p("x/a"), UDP, 81));
        // The named port with the other protocol names nothing.
        let c = with(
            xyz(),
            &[policy(
                "x",
                "named",
                "  podSelector: {}\n  ingress:\n  - ports:\n    - port: serve-81-tcp\n      protocol: UDP\n",
            )],
        );
        assert!(!c.allowed(&p("y/a"), &p("x/a"), UDP, 81));
        assert!(!c.allowed(&p("y/a"), &p("x/a"), TCP, 81));
    }

    #[test]
    fn ip_block_matches_pod_addresses_with_except() {
        // 10.0.0.0/28 holds every xyz pod; the /30 except holds x/a..x/c
        // (10.0.0.1-3) and 10.0.0.0.
        let c = with(
            xyz(),
            &[policy(
                "z",
                "cidr",
                "  podSelector:\n    matchLabels:\n      pod: c\n  ingress:\n  - from:\n    - ipBlock:\n        cidr: 10.0.0.0/28\n        except:\n        - 10.0.0.0/30\n        - 10.0.0.5/32\n",
            )],
        );
        let dst = p("z/c");
        for src in ["x/a", "x/b", "x/c", "y/b"] {
            assert!(!c.allowed(&p(src), &dst, TCP, 80), "{src}");
        }
        for src in ["y/a", "y/c", "z/a", "z/b"] {
            assert!(c.allowed(&p(src), &dst, TCP, 80), "{src}");
        }
        assert!(c.ingress_allowed(&ip("10.0.0.15"), &dst, TCP, 80));
        assert!(!c.ingress_allowed(&ip("10.0.0.16"), &dst, TCP, 80));
    }

    #[test]
    fn multiple_policies_are_a_union() {
        let c = with(
            xyz(),
            &[
                policy(
                    "x",
                    "from-b",
                    "  podSelector:\n    matchLabels:\n      pod: a\n  ingress:\n  - from:\n    - podSelector:\n        matchLabels:\n          pod: b\n    ports:\n    - port: 80\n",
                ),
                policy(
                    "x",
                    "from-y",
                    "  podSelector:\n    matchLabels:\n      pod: a\n  ingress:\n  - from:\n    - namespaceSelector:\n        matchLabels:\n          ns: y\n      podSelector: {}\n    ports:\n    - port: 81\n      protocol: UDP\n",
                ),
            ],
        );
        let dst = p("x/a");
        assert!(c.allowed(&p("x/b"), &dst, TCP, 80));
        assert!(!c.allowed(&p("x/b"), &dst, UDP, 81));
        assert!(c.allowed(&p("y/c"), &dst, UDP, 81));
        assert!(!c.allowed(&p("y/c"), &dst, TCP, 80));
        assert!(!c.allowed(&p("x/c"), &dst, TCP, 80));
    }

    #[test]
    fn egress_to_a_named_port_on_another_pod() {
        let mut c = with(
            xyz(),
            &[policy(
                "x",
                "egress-named",
                "  podSelector:\n    matchLabels:\n      pod: a\n  policyTypes:\n  - Egress\n  egress:\n  - to:\n    - namespaceSelector: {}\n    ports:\n    - port: serve-80-udp\n      protocol: UDP\n    - port: serve-81-udp\n      protocol: UDP\n",
            )],
        );
        let src = p("x/a");
        assert!(c.allowed(&src, &p("y/b"), UDP, 80));
        assert!(c.allowed(&src, &p("z/c"), UDP, 81));
        assert!(!c.allowed(&src, &p("z/c"), TCP, 81));
        // An address that is no pod has no named ports.
        assert!(!c.egress_allowed(&src, &ip("10.0.0.200"), UDP, 80));
        // A destination without the name is not reached on that port.
        c.apply(&pod(
            "y",
            "b",
            &[("pod", "b")],
            "10.0.0.5",
            &[("other", 80, "UDP")],
        ))
        .expect("pod");
        assert!(!c.allowed(&src, &p("y/b"), UDP, 80));
        assert!(c.allowed(&src, &p("y/c"), UDP, 80));
    }

    #[test]
    fn policy_types_default_from_the_egress_rules() {
        // Egress rules and no policyTypes: both directions isolated.
        let c = with(
            xyz(),
            &[policy(
                "x",
                "egress-rules",
                "  podSelector:\n    matchLabels:\n      pod: a\n  egress:\n  - to:\n    - podSelector:\n        matchLabels:\n          pod: b\n",
            )],
        );
        let a = c.pod("x", "a").expect("x/a");
        assert!(c.is_isolated(a, Direction::Ingress));
        assert!(c.is_isolated(a, Direction::Egress));
        assert!(c.allowed(&p("x/a"), &p("x/b"), TCP, 80));
        assert!(!c.allowed(&p("x/a"), &p("x/c"), TCP, 80));
        assert!(
            !c.allowed(&p("x/b"), &p("x/a"), TCP, 80),
            "ingress isolated"
        );
        // Only ingress rules: egress stays open; an empty policyTypes list
        // defaults the same way.
        let c = with(
            xyz(),
            &[policy(
                "x",
                "ingress-rules",
                "  podSelector: {}\n  policyTypes: []\n  ingress:\n  - from:\n    - podSelector: {}\n  egress: []\n",
            )],
        );
        let a = c.pod("x", "a").expect("x/a");
        assert!(c.is_isolated(a, Direction::Ingress));
        assert!(!c.is_isolated(a, Direction::Egress));
        assert!(c.allowed(&p("x/a"), &p("y/a"), TCP, 80));
        assert!(!c.allowed(&p("y/a"), &p("x/a"), TCP, 80));
    }

    #[test]
    fn explicit_policy_types_ignore_rules_of_the_other_direction() {
        let c = with(
            xyz(),
            &[policy(
                "x",
                "egress-only",
                "  podSelector: {}\n  policyTypes:\n  - Egress\n  ingress: []\n  egress:\n  - to:\n    - namespaceSelector:\n        matchLabels:\n          ns: y\n",
            )],
        );
        assert!(c.allowed(&p("z/a"), &p("x/a"), TCP, 80), "ingress open");
        assert!(c.allowed(&p("x/a"), &p("y/a"), TCP, 80));
        assert!(!c.allowed(&p("x/a"), &p("z/a"), TCP, 80));
        let c = with(
            xyz(),
            &[policy(
                "x",
                "ingress-only",
                "  podSelector: {}\n  policyTypes:\n  - Ingress\n  ingress:\n  - {}\n  egress:\n  - to:\n    - ipBlock:\n        cidr: 192.0.2.0/24\n",
            )],
        );
        assert!(c.allowed(&p("x/a"), &p("z/a"), TCP, 80), "egress open");
    }

    #[test]
    fn match_expressions_not_in_and_does_not_exist() {
        let mut c = with(
            xyz(),
            &[policy(
                "x",
                "exprs",
                "  podSelector: {}\n  ingress:\n  - from:\n    - namespaceSelector:\n        matchExpressions:\n        - {key: team, operator: DoesNotExist}\n      podSelector:\n        matchExpressions:\n        - {key: pod, operator: NotIn, values: [b]}\n        - {key: tier, operator: NotIn, values: [web]}\n",
            )],
        );
        assert!(c.allowed(&p("y/a"), &p("x/b"), TCP, 80));
        assert!(c.allowed(&p("z/c"), &p("x/b"), TCP, 80));
        assert!(!c.allowed(&p("y/b"), &p("x/a"), TCP, 80));
        c.apply(&ns("z", &[("ns", "z"), ("team", "blue")]))
            .expect("namespace");
        assert!(!c.allowed(&p("z/c"), &p("x/b"), TCP, 80));
        c.apply(&pod(
            "y",
            "a",
            &[("pod", "a"), ("tier", "web")],
            "10.0.0.4",
            &[],
        ))
        .expect("pod");
        assert!(!c.allowed(&p("y/a"), &p("x/b"), TCP, 80));
        assert!(c.allowed(&p("y/c"), &p("x/b"), TCP, 80));
    }

    #[test]
    fn match_expressions_in_and_exists_with_match_labels() {
        let c = with(
            xyz(),
            &[policy(
                "x",
                "exprs",
                "  podSelector:\n    matchExpressions:\n    - {key: pod, operator: Exists}\n  ingress:\n  - from:\n    - namespaceSelector:\n        matchExpressions:\n        - {key: ns, operator: In, values: [y, z]}\n      podSelector:\n        matchLabels:\n          pod: c\n        matchExpressions:\n        - {key: pod, operator: Exists}\n",
            )],
        );
        assert!(c.allowed(&p("y/c"), &p("x/a"), TCP, 80));
        assert!(c.allowed(&p("z/c"), &p("x/b"), TCP, 80));
        assert!(!c.allowed(&p("z/b"), &p("x/b"), TCP, 80));
        assert!(!c.allowed(&p("x/c"), &p("x/b"), TCP, 80));
        let sel = LabelSelector {
            match_expressions: Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                    key: "k".into(),
                    operator: "Bogus".into(),
                    values: None,
                },
            ]),
            ..LabelSelector::default()
        };
        assert!(!selector_matches(&sel, &Labels::new()));
        assert!(selector_matches(&LabelSelector::default(), &Labels::new()));
    }

    #[test]
    fn a_policy_selects_only_pods_of_its_namespace() {
        let c = with(
            xyz(),
            &[policy(
                "z",
                "deny",
                "  podSelector:\n    matchLabels:\n      pod: a\n  policyTypes: [Ingress]\n",
            )],
        );
        assert!(!c.allowed(&p("x/a"), &p("z/a"), TCP, 80));
        assert!(c.allowed(&p("z/a"), &p("x/a"), TCP, 80));
        assert!(c.allowed(&p("z/b"), &p("y/a"), TCP, 80));
    }

    #[test]
    fn selectors_never_match_plain_addresses() {
        let c = with(
            xyz(),
            &[policy(
                "x",
                "all-pods",
                "  podSelector: {}\n  ingress:\n  - from:\n    - namespaceSelector: {}\n  egress:\n  - to:\n    - namespaceSelector: {}\n      podSelector: {}\n",
            )],
        );
        assert!(c.allowed(&p("z/a"), &p("x/a"), TCP, 1234));
        assert!(!c.ingress_allowed(&ip("10.0.0.1"), &p("x/b"), TCP, 80));
        assert!(!c.egress_allowed(&p("x/b"), &ip("10.0.0.200"), TCP, 80));
        // A pod the cluster does not hold is no selector's pod either.
        assert!(!c.ingress_allowed(&p("w/ghost"), &p("x/b"), TCP, 80));
        // But no policy selects it, so its own ingress is open.
        assert!(c.ingress_allowed(&p("x/b"), &p("w/ghost"), TCP, 80));
    }

    #[test]
    fn protocol_defaults_to_tcp_and_no_port_is_every_port() {
        let c = with(
            xyz(),
            &[policy(
                "x",
                "ports",
                "  podSelector: {}\n  ingress:\n  - ports:\n    - port: 81\n    - protocol: UDP\n    - protocol: SCTP\n      port: 80\n",
            )],
        );
        let (s, d) = (p("y/a"), p("x/a"));
        assert!(c.allowed(&s, &d, TCP, 81));
        assert!(!c.allowed(&s, &d, TCP, 80));
        assert!(c.allowed(&s, &d, UDP, 80));
        assert!(c.allowed(&s, &d, UDP, 65535));
        assert!(c.allowed(&s, &d, Proto::Sctp, 80));
        assert!(!c.allowed(&s, &d, Proto::Sctp, 81));
    }

    #[test]
    fn a_rule_with_empty_lists_matches_everything() {
        let c = with(
            xyz(),
            &[policy(
                "x",
                "empty-lists",
                "  podSelector: {}\n  policyTypes: [Ingress, Egress]\n  ingress:\n  - from: []\n    ports: []\n  egress:\n  - to: []\n",
            )],
        );
        assert_eq!(allowed_pairs(&c, UDP, 80).len(), 72);
        assert!(c.egress_allowed(&p("x/a"), &ip("203.0.113.1"), TCP, 443));
        assert!(c.ingress_allowed(&ip("203.0.113.1"), &p("x/a"), TCP, 443));
    }

    #[test]
    fn invalid_peers_and_blocks_match_nothing() {
        let block = |cidr: &str, except: &[&str]| IPBlock {
            cidr: cidr.into(),
            except: Some(except.iter().map(|e| (*e).to_owned()).collect()),
        };
        let a: Ipv4Addr = "10.0.0.1".parse().expect("address");
        assert!(ip_block_matches(&block("10.0.0.0/8", &[]), a));
        assert!(ip_block_matches(&block("10.0.0.1/32", &[]), a));
        assert!(!ip_block_matches(&block("10.0.0.0/8", &["10.0.0.0/31"]), a));
        assert!(!ip_block_matches(&block("fd00::/8", &[]), a));
        assert!(!ip_block_matches(&block("10.0.0.0/8", &["nonsense"]), a));
        assert!(!ip_block_matches(&block("0.0.0.0/0", &["::/0"]), a));
        assert!(ip_block_matches(&block("0.0.0.0/0", &[]), a));
        let c = with(
            xyz(),
            &[policy(
                "x",
                "bad-peers",
                "  podSelector: {}\n  ingress:\n  - from:\n    - {}\n    - ipBlock: {cidr: 10.0.0.0/8}\n      podSelector: {}\n",
            )],
        );
        assert!(!c.allowed(&p("y/a"), &p("x/a"), TCP, 80));
    }

    #[test]
    fn updates_and_deletes_replace_by_name() {
        let deny = policy("x", "p", "  podSelector: {}\n  policyTypes: [Ingress]\n");
        let mut c = with(xyz(), std::slice::from_ref(&deny));
        assert!(!c.allowed(&p("y/a"), &p("x/a"), TCP, 80));
        c.apply(&policy(
            "x",
            "p",
            "  podSelector:\n    matchLabels: {pod: b}\n  policyTypes: [Ingress]\n",
        ))
        .expect("update");
        assert_eq!(c.policies.len(), 1);
        assert!(c.allowed(&p("y/a"), &p("x/a"), TCP, 80));
        assert!(!c.allowed(&p("y/a"), &p("x/b"), TCP, 80));
        c.delete(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: p\n  namespace: x\n",
        )
        .expect("delete");
        assert!(c.policies.is_empty());
        assert!(c.allowed(&p("y/a"), &p("x/b"), TCP, 80));
    }

    #[test]
    fn documents_lists_and_errors() {
        let list = r#"{"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "w"}},
            {"apiVersion": "v1", "kind": "List", "items": [
                {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "q", "namespace": "w"},
                 "status": {"podIPs": [{"ip": "fd00::1"}, {"ip": "10.9.0.1"}]}}]}]}"#;
        let c = Cluster::from_yaml(&format!("---\n{list}\n---\n")).expect("list");
        assert_eq!(c.namespaces.len(), 1);
        assert_eq!(
            c.pod("w", "q").map(|p| p.ip),
            Some(Ipv4Addr::new(10, 9, 0, 1))
        );
        let mut c = xyz();
        let before = c.pods.clone();
        let bad = format!(
            "{}apiVersion: v1\nkind: Service\nmetadata: {{name: s}}\n",
            pod("x", "a", &[("pod", "changed")], "10.0.0.1", &[])
        );
        assert!(c.apply(&bad).is_err());
        assert_eq!(c.pods, before, "a refused document changes nothing");
        assert!(
            c.apply("apiVersion: v1\nkind: Pod\nmetadata: {name: n}\n")
                .is_err()
        );
        assert!(c.apply("kind: [").is_err());
    }
}
