//! The truth-table scenario: namespaces `x`, `y`, `z` (label `ns: <name>`)
//! holding pods `a`, `b`, `c` (label `pod: <name>`), each serving
//! [`PORTS`], and named cases of policy steps to run on top of it.
//!
//! Every case starts from the baseline (the objects of
//! [`baseline_objects`], no policy) and applies its steps in order; after
//! each step every pod pair is probed on every port. A case may re-apply a
//! Pod or Namespace with other labels, so the baseline must be re-applied
//! before the next case. Address blocks are built from the pods' real
//! addresses, so the cases take them as an argument.
//!
//! Every string value in the documents is quoted: YAML 1.1 readers take a
//! bare `y` for a boolean.

use std::{collections::BTreeMap, net::Ipv4Addr};

use ipnet::Ipv4Net;

use super::reference::{self, ModelError, Proto};

/// The namespaces of the scenario.
pub const NAMESPACES: [&str; 3] = ["x", "y", "z"];

/// The pods of each namespace.
pub const POD_NAMES: [&str; 3] = ["a", "b", "c"];

/// The container ports every pod declares and serves: (name, number,
/// protocol).
pub const PORTS: [(&str, u16, Proto); 4] = [
    ("serve-80-tcp", 80, Proto::Tcp),
    ("serve-81-tcp", 81, Proto::Tcp),
    ("serve-80-udp", 80, Proto::Udp),
    ("serve-81-udp", 81, Proto::Udp),
];

/// Pod addresses by (namespace, pod name).
pub type PodIps = BTreeMap<(String, String), Ipv4Addr>;

/// One step of a case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Apply these documents (`rivetctl apply -f -`).
    Apply(String),
    /// Delete the objects these documents name (`rivetctl delete -f -`).
    Delete(String),
}

impl Step {
    /// The document of the step.
    pub fn text(&self) -> &str {
        match self {
            Self::Apply(t) | Self::Delete(t) => t,
        }
    }

    /// `apply` or `delete`: the `rivetctl` verb of the step.
    pub fn verb(&self) -> &'static str {
        match self {
            Self::Apply(_) => "apply",
            Self::Delete(_) => "delete",
        }
    }

    /// Applies the step to the reference model.
    pub fn apply_to(&self, cluster: &mut reference::Cluster) -> Result<(), ModelError> {
        match self {
            Self::Apply(t) => cluster.apply(t),
            Self::Delete(t) => cluster.delete(t),
        }
    }
}

/// A named sequence of steps run from the baseline.
#[derive(Clone, Debug)]
pub struct Case {
    /// A name saying what the case exercises (unique).
    pub name: &'static str,
    /// The steps, in order.
    pub steps: Vec<Step>,
}

impl Case {
    /// Every NetworkPolicy an apply step of the case names, as
    /// (namespace, name), each once.
    pub fn policies(&self) -> Result<Vec<(String, String)>, ModelError> {
        let mut out = Vec::new();
        for step in &self.steps {
            let Step::Apply(text) = step else { continue };
            for object in reference::documents(text)? {
                if object.get("kind").and_then(|k| k.as_str()) != Some("NetworkPolicy") {
                    continue;
                }
                let meta = object.get("metadata");
                let field = |key: &str| meta.and_then(|m| m.get(key)).and_then(|v| v.as_str());
                let name = field("name")
                    .ok_or_else(|| ModelError(format!("{}: a policy without name", self.name)))?;
                let key = (
                    field("namespace").unwrap_or("default").to_owned(),
                    name.to_owned(),
                );
                if !out.contains(&key) {
                    out.push(key);
                }
            }
        }
        Ok(out)
    }
}

/// A YAML string scalar (double-quoted).
fn q(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

/// A YAML block of `key: "value"` lines, each indented by `indent`.
fn label_lines(labels: &[(&str, &str)], indent: usize) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{:indent$}{}: {}\n", "", q(k), q(v)))
        .collect()
}

/// A Namespace object with `labels`.
pub fn namespace_object(name: &str, labels: &[(&str, &str)]) -> String {
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {}\n  labels:\n{}",
        q(name),
        label_lines(labels, 4)
    )
}

/// A Pod object `namespace/name` with `labels`, one container declaring
/// [`PORTS`], and `ip` as its address (`status.podIP` and `podIPs`).
pub fn pod_object(namespace: &str, name: &str, labels: &[(&str, &str)], ip: Ipv4Addr) -> String {
    let ports: String = PORTS
        .iter()
        .map(|(port_name, number, proto)| {
            format!(
                "    - name: {}\n      containerPort: {number}\n      protocol: {}\n",
                q(port_name),
                proto.k8s_name()
            )
        })
        .collect();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {}\n  namespace: {}\n  labels:\n{}spec:\n  containers:\n  - name: cont-80-81\n    image: registry.k8s.io/e2e-test-images/agnhost:2.53\n    ports:\n{ports}status:\n  phase: Running\n  podIP: {}\n  podIPs:\n  - ip: {}\n",
        q(name),
        q(namespace),
        label_lines(labels, 4),
        q(&ip.to_string()),
        q(&ip.to_string()),
    )
}

/// The address of pod `namespace/name`.
///
/// # Panics
/// If `ips` lacks it: the scenario needs all nine pods.
pub fn pod_ip(ips: &PodIps, namespace: &str, name: &str) -> Ipv4Addr {
    match ips.get(&(namespace.to_owned(), name.to_owned())) {
        Some(ip) => *ip,
        None => panic!("no address for pod {namespace}/{name}: the scenario needs all nine pods"),
    }
}

/// The three Namespaces and nine Pods with their baseline labels, as `---`
/// separated documents.
///
/// # Panics
/// If `ips` lacks one of the nine pods.
pub fn baseline_objects(ips: &PodIps) -> String {
    let mut docs = Vec::new();
    for ns in NAMESPACES {
        docs.push(namespace_object(ns, &[("ns", ns)]));
    }
    for ns in NAMESPACES {
        for pod in POD_NAMES {
            docs.push(pod_object(ns, pod, &[("pod", pod)], pod_ip(ips, ns, pod)));
        }
    }
    docs.join("---\n")
}

/// A NetworkPolicy `namespace/name` whose `spec` is `spec`: YAML written
/// from column 0 (a leading newline is dropped), indented under `spec:`.
pub fn policy(namespace: &str, name: &str, spec: &str) -> String {
    let body: String = spec
        .trim_start_matches('\n')
        .lines()
        .map(|l| {
            if l.trim().is_empty() {
                "\n".to_owned()
            } else {
                format!("  {l}\n")
            }
        })
        .collect();
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: {}\n  namespace: {}\nspec:\n{body}",
        q(name),
        q(namespace)
    )
}

/// A document naming NetworkPolicy `namespace/name` (for a delete).
pub fn policy_ref(namespace: &str, name: &str) -> String {
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: {}\n  namespace: {}\n",
        q(name),
        q(namespace)
    )
}

/// A document naming every policy of `policies` ((namespace, name)); empty
/// for none.
pub fn policy_refs(policies: &[(String, String)]) -> String {
    policies
        .iter()
        .map(|(ns, name)| policy_ref(ns, name))
        .collect::<Vec<_>>()
        .join("---\n")
}

/// `ip/prefix` with the host bits cleared, as text.
fn block(ip: Ipv4Addr, prefix: u8) -> String {
    match Ipv4Net::new(ip, prefix) {
        Ok(net) => net.trunc().to_string(),
        Err(_) => panic!("prefix /{prefix} is longer than 32"),
    }
}

/// A case of one apply step.
fn one(name: &'static str, doc: String) -> Case {
    Case {
        name,
        steps: vec![Step::Apply(doc)],
    }
}

/// Default deny of `types` (`Ingress`, `Egress` or both) for every pod of
/// `ns`.
fn deny(ns: &str, name: &str, types: &str) -> String {
    policy(
        ns,
        name,
        &format!("podSelector: {{}}\npolicyTypes: [{types}]\n"),
    )
}

/// Every case, in a fixed order. Names are unique.
///
/// # Panics
/// If `ips` lacks one of the nine pods.
pub fn cases(ips: &PodIps) -> Vec<Case> {
    let ip = |ns: &str, pod: &str| pod_ip(ips, ns, pod);
    vec![
        // Default deny.
        one(
            "deny-ingress-namespace-x",
            deny("x", "deny-ingress", "Ingress"),
        ),
        one(
            "deny-egress-namespace-x",
            deny("x", "deny-egress", "Egress"),
        ),
        one(
            "deny-both-namespace-y",
            deny("y", "deny-all", "Ingress, Egress"),
        ),
        one(
            "deny-ingress-one-pod",
            policy(
                "x",
                "deny-a",
                r#"
podSelector: {matchLabels: {"pod": "a"}}
policyTypes: ["Ingress"]
"#,
            ),
        ),
        one(
            "deny-egress-one-pod",
            policy(
                "z",
                "deny-b-out",
                r#"
podSelector: {matchLabels: {"pod": "b"}}
policyTypes: ["Egress"]
"#,
            ),
        ),
        // Allow everything beside a deny.
        Case {
            name: "allow-all-ingress-over-deny",
            steps: vec![
                Step::Apply(deny("x", "deny-ingress", "Ingress")),
                Step::Apply(policy(
                    "x",
                    "allow-all-ingress",
                    r#"
podSelector: {}
ingress:
- {}
policyTypes: ["Ingress"]
"#,
                )),
            ],
        },
        Case {
            name: "allow-all-egress-over-deny",
            steps: vec![
                Step::Apply(deny("y", "deny-egress", "Egress")),
                Step::Apply(policy(
                    "y",
                    "allow-all-egress",
                    r#"
podSelector: {}
egress:
- {}
policyTypes: ["Egress"]
"#,
                )),
            ],
        },
        // Peers by selector.
        one(
            "ingress-pod-selector-same-namespace",
            policy(
                "x",
                "a-from-b",
                r#"
podSelector: {matchLabels: {"pod": "a"}}
ingress:
- from:
  - podSelector: {matchLabels: {"pod": "b"}}
"#,
            ),
        ),
        one(
            "ingress-namespace-selector",
            policy(
                "x",
                "a-from-y",
                r#"
podSelector: {matchLabels: {"pod": "a"}}
ingress:
- from:
  - namespaceSelector: {matchLabels: {"ns": "y"}}
"#,
            ),
        ),
        one(
            "ingress-namespace-and-pod-in-one-peer",
            policy(
                "x",
                "a-from-y-b",
                r#"
podSelector: {matchLabels: {"pod": "a"}}
ingress:
- from:
  - namespaceSelector: {matchLabels: {"ns": "y"}}
    podSelector: {matchLabels: {"pod": "b"}}
"#,
            ),
        ),
        one(
            "ingress-namespace-or-pod-two-peers",
            policy(
                "x",
                "a-from-y-or-b",
                r#"
podSelector: {matchLabels: {"pod": "a"}}
ingress:
- from:
  - namespaceSelector: {matchLabels: {"ns": "y"}}
  - podSelector: {matchLabels: {"pod": "b"}}
"#,
            ),
        ),
        one(
            "ingress-every-namespace-one-pod-name",
            policy(
                "x",
                "from-any-c",
                r#"
podSelector: {}
ingress:
- from:
  - namespaceSelector: {}
    podSelector: {matchLabels: {"pod": "c"}}
"#,
            ),
        ),
        one(
            "ingress-empty-pod-selector-peer",
            policy(
                "y",
                "from-own-namespace",
                r#"
podSelector: {}
ingress:
- from:
  - podSelector: {}
"#,
            ),
        ),
        one(
            "ingress-namespace-name-label",
            policy(
                "z",
                "from-x-by-name",
                r#"
podSelector: {}
ingress:
- from:
  - namespaceSelector: {matchLabels: {"kubernetes.io/metadata.name": "x"}}
"#,
            ),
        ),
        // Set-based selectors.
        one(
            "match-expressions-in",
            policy(
                "x",
                "from-y-z",
                r#"
podSelector: {}
ingress:
- from:
  - namespaceSelector:
      matchExpressions:
      - {key: "ns", operator: "In", values: ["y", "z"]}
"#,
            ),
        ),
        one(
            "match-expressions-not-in",
            policy(
                "x",
                "c-from-not-b",
                r#"
podSelector:
  matchExpressions:
  - {key: "pod", operator: "NotIn", values: ["a", "b"]}
ingress:
- from:
  - namespaceSelector: {}
    podSelector:
      matchExpressions:
      - {key: "pod", operator: "NotIn", values: ["b"]}
"#,
            ),
        ),
        one(
            "match-expressions-exists",
            policy(
                "x",
                "exists",
                r#"
podSelector:
  matchExpressions:
  - {key: "pod", operator: "Exists"}
ingress:
- from:
  - podSelector:
      matchExpressions:
      - {key: "role", operator: "Exists"}
  - namespaceSelector:
      matchExpressions:
      - {key: "ns", operator: "Exists"}
    podSelector: {matchLabels: {"pod": "a"}}
"#,
            ),
        ),
        Case {
            name: "match-expressions-does-not-exist-then-namespace-label-added",
            steps: vec![
                Step::Apply(policy(
                    "z",
                    "no-team",
                    r#"
podSelector: {}
ingress:
- from:
  - namespaceSelector:
      matchExpressions:
      - {key: "team", operator: "DoesNotExist"}
"#,
                )),
                Step::Apply(namespace_object("y", &[("ns", "y"), ("team", "blue")])),
            ],
        },
        // Address blocks.
        one(
            "ip-block-one-pod",
            policy(
                "y",
                "from-x-b-address",
                &format!(
                    r#"
podSelector: {{}}
ingress:
- from:
  - ipBlock: {{cidr: "{}"}}
"#,
                    block(ip("x", "b"), 32)
                ),
            ),
        ),
        one(
            "ip-block-range-except-one-pod",
            policy(
                "z",
                "from-range-but-y-a",
                &format!(
                    r#"
podSelector: {{}}
ingress:
- from:
  - ipBlock:
      cidr: "{}"
      except: ["{}"]
"#,
                    // A /16 holds every node's pod subnet; the except
                    // must lie inside the block (the API server's rule).
                    block(ip("x", "a"), 16),
                    block(ip("y", "a"), 32)
                ),
            ),
        ),
        one(
            "ip-block-except-slash-30",
            policy(
                "x",
                "from-range-but-30",
                &format!(
                    r#"
podSelector: {{}}
ingress:
- from:
  - ipBlock:
      cidr: "{}"
      except: ["{}"]
"#,
                    block(ip("y", "b"), 24),
                    block(ip("y", "b"), 30)
                ),
            ),
        ),
        one(
            "ip-block-egress-one-pod",
            policy(
                "x",
                "a-to-z-c-address",
                &format!(
                    r#"
podSelector: {{matchLabels: {{"pod": "a"}}}}
policyTypes: ["Egress"]
egress:
- to:
  - ipBlock: {{cidr: "{}"}}
"#,
                    block(ip("z", "c"), 32)
                ),
            ),
        ),
        one(
            "ip-block-egress-with-excepts",
            policy(
                "y",
                "to-range-but-two",
                &format!(
                    r#"
podSelector: {{}}
policyTypes: ["Egress"]
egress:
- to:
  - ipBlock:
      cidr: "{}"
      except: ["{}", "{}"]
"#,
                    block(ip("z", "a"), 24),
                    block(ip("z", "a"), 32),
                    block(ip("x", "c"), 32)
                ),
            ),
        ),
        one(
            "ip-block-beside-pod-selector",
            policy(
                "x",
                "from-address-or-c",
                &format!(
                    r#"
podSelector: {{}}
ingress:
- from:
  - ipBlock: {{cidr: "{}"}}
  - podSelector: {{matchLabels: {{"pod": "c"}}}}
"#,
                    block(ip("y", "a"), 32)
                ),
            ),
        ),
        // Ports.
        one(
            "port-number-tcp-80",
            policy(
                "x",
                "tcp-80",
                r#"
podSelector: {}
ingress:
- ports:
  - {port: 80, protocol: "TCP"}
"#,
            ),
        ),
        one(
            "port-protocol-defaults-to-tcp",
            policy(
                "y",
                "port-81",
                r#"
podSelector: {}
ingress:
- ports:
  - port: 81
"#,
            ),
        ),
        one(
            "port-named-ingress",
            policy(
                "x",
                "named-81-udp",
                r#"
podSelector: {}
ingress:
- from:
  - namespaceSelector: {}
  ports:
  - {port: "serve-81-udp", protocol: "UDP"}
"#,
            ),
        ),
        one(
            "port-named-with-the-other-protocol-matches-nothing",
            policy(
                "z",
                "named-wrong-protocol",
                r#"
podSelector: {}
ingress:
- ports:
  - {port: "serve-80-tcp", protocol: "UDP"}
"#,
            ),
        ),
        one(
            "port-named-egress",
            policy(
                "x",
                "a-out-named",
                r#"
podSelector: {matchLabels: {"pod": "a"}}
policyTypes: ["Egress"]
egress:
- ports:
  - {port: "serve-80-udp", protocol: "UDP"}
  - port: "serve-81-tcp"
"#,
            ),
        ),
        one(
            "port-range-tcp-80-81",
            policy(
                "y",
                "tcp-80-81",
                r#"
podSelector: {}
ingress:
- ports:
  - {protocol: "TCP", port: 80, endPort: 81}
"#,
            ),
        ),
        one(
            "port-range-udp-81-up",
            policy(
                "z",
                "udp-81-1000",
                r#"
podSelector: {}
ingress:
- from:
  - namespaceSelector: {}
  ports:
  - {protocol: "UDP", port: 81, endPort: 1000}
"#,
            ),
        ),
        one(
            "port-protocol-udp-only",
            policy(
                "x",
                "udp-only",
                r#"
podSelector: {}
ingress:
- ports:
  - protocol: "UDP"
"#,
            ),
        ),
        one(
            "port-protocol-tcp-only-egress",
            policy(
                "z",
                "tcp-only-out",
                r#"
podSelector: {}
policyTypes: ["Egress"]
egress:
- ports:
  - protocol: "TCP"
"#,
            ),
        ),
        // policyTypes.
        one(
            "policy-types-defaulted-with-egress-rules",
            policy(
                "y",
                "a-to-z",
                r#"
podSelector: {matchLabels: {"pod": "a"}}
egress:
- to:
  - namespaceSelector: {matchLabels: {"ns": "z"}}
"#,
            ),
        ),
        one(
            "policy-types-explicit-egress-ignores-ingress-rules",
            policy(
                "x",
                "egress-only",
                r#"
podSelector: {}
policyTypes: ["Egress"]
ingress:
- from:
  - podSelector: {matchLabels: {"pod": "nobody"}}
egress:
- to:
  - namespaceSelector: {matchLabels: {"ns": "y"}}
"#,
            ),
        ),
        one(
            "policy-types-explicit-ingress-ignores-egress-rules",
            policy(
                "z",
                "ingress-only",
                r#"
podSelector: {}
policyTypes: ["Ingress"]
ingress:
- from:
  - namespaceSelector: {matchLabels: {"ns": "z"}}
egress:
- to:
  - podSelector: {matchLabels: {"pod": "nobody"}}
"#,
            ),
        ),
        // Several policies.
        Case {
            name: "union-of-two-policies",
            steps: vec![Step::Apply(
                [
                    policy(
                        "x",
                        "a-from-b-tcp-80",
                        r#"
podSelector: {matchLabels: {"pod": "a"}}
ingress:
- from:
  - podSelector: {matchLabels: {"pod": "b"}}
  ports:
  - port: 80
"#,
                    ),
                    policy(
                        "x",
                        "a-from-y-udp-81",
                        r#"
podSelector: {matchLabels: {"pod": "a"}}
ingress:
- from:
  - namespaceSelector: {matchLabels: {"ns": "y"}}
  ports:
  - {port: 81, protocol: "UDP"}
"#,
                    ),
                ]
                .join("---\n"),
            )],
        },
        Case {
            name: "policies-in-two-namespaces-both-directions",
            steps: vec![Step::Apply(
                [
                    deny("x", "deny-ingress", "Ingress"),
                    deny("z", "deny-egress", "Egress"),
                    policy(
                        "z",
                        "to-x",
                        r#"
podSelector: {}
egress:
- to:
  - namespaceSelector: {matchLabels: {"ns": "x"}}
policyTypes: ["Egress"]
"#,
                    ),
                    policy(
                        "x",
                        "from-z-tcp-80",
                        r#"
podSelector: {}
ingress:
- from:
  - namespaceSelector: {matchLabels: {"ns": "z"}}
  ports:
  - port: 80
"#,
                    ),
                ]
                .join("---\n"),
            )],
        },
        Case {
            name: "deny-ingress-everywhere-allow-within-namespace",
            steps: vec![Step::Apply(
                NAMESPACES
                    .iter()
                    .map(|ns| {
                        policy(
                            ns,
                            "same-namespace",
                            r#"
podSelector: {}
ingress:
- from:
  - podSelector: {}
"#,
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("---\n"),
            )],
        },
        one(
            "egress-to-namespace-on-tcp-80",
            policy(
                "x",
                "to-y-tcp-80",
                r#"
podSelector: {}
policyTypes: ["Egress"]
egress:
- to:
  - namespaceSelector: {matchLabels: {"ns": "y"}}
  ports:
  - {port: 80, protocol: "TCP"}
"#,
            ),
        ),
        one(
            "egress-within-namespace-only",
            policy(
                "z",
                "own-namespace-out",
                r#"
podSelector: {}
policyTypes: ["Egress"]
egress:
- to:
  - podSelector: {}
"#,
            ),
        ),
        one(
            "egress-named-port-in-another-namespace",
            policy(
                "x",
                "to-y-named",
                r#"
podSelector: {}
policyTypes: ["Egress"]
egress:
- to:
  - namespaceSelector: {matchLabels: {"ns": "y"}}
  ports:
  - port: "serve-81-tcp"
"#,
            ),
        ),
        one(
            "ingress-and-egress-in-one-policy",
            policy(
                "x",
                "a-both",
                r#"
podSelector: {matchLabels: {"pod": "a"}}
policyTypes: ["Ingress", "Egress"]
ingress:
- from:
  - namespaceSelector: {matchLabels: {"ns": "y"}}
egress:
- to:
  - namespaceSelector: {matchLabels: {"ns": "z"}}
"#,
            ),
        ),
        // Updates and deletes.
        Case {
            name: "update-changes-the-peers",
            steps: vec![
                Step::Apply(policy(
                    "x",
                    "a-from",
                    r#"
podSelector: {matchLabels: {"pod": "a"}}
ingress:
- from:
  - namespaceSelector: {matchLabels: {"ns": "y"}}
"#,
                )),
                Step::Apply(policy(
                    "x",
                    "a-from",
                    r#"
podSelector: {matchLabels: {"pod": "a"}}
ingress:
- from:
  - namespaceSelector: {matchLabels: {"ns": "z"}}
"#,
                )),
            ],
        },
        Case {
            name: "update-changes-the-selected-pods",
            steps: vec![
                Step::Apply(policy(
                    "y",
                    "deny-one",
                    r#"
podSelector: {matchLabels: {"pod": "a"}}
policyTypes: ["Ingress"]
"#,
                )),
                Step::Apply(policy(
                    "y",
                    "deny-one",
                    r#"
podSelector: {matchLabels: {"pod": "b"}}
policyTypes: ["Ingress"]
"#,
                )),
            ],
        },
        Case {
            name: "update-adds-a-policy-type",
            steps: vec![
                Step::Apply(deny("z", "deny", "Ingress")),
                Step::Apply(deny("z", "deny", "Ingress, Egress")),
                Step::Apply(deny("z", "deny", "Egress")),
            ],
        },
        Case {
            name: "delete-one-of-two",
            steps: vec![
                Step::Apply(
                    [
                        deny("x", "deny-ingress", "Ingress"),
                        policy(
                            "x",
                            "from-y",
                            r#"
podSelector: {}
ingress:
- from:
  - namespaceSelector: {matchLabels: {"ns": "y"}}
"#,
                        ),
                    ]
                    .join("---\n"),
                ),
                Step::Delete(policy_ref("x", "from-y")),
            ],
        },
        Case {
            name: "delete-back-to-open",
            steps: vec![
                Step::Apply(deny("y", "deny-all", "Ingress, Egress")),
                Step::Delete(policy_ref("y", "deny-all")),
            ],
        },
        // Label changes.
        Case {
            name: "pod-label-change-joins-a-peer",
            steps: vec![
                Step::Apply(policy(
                    "x",
                    "a-from-b",
                    r#"
podSelector: {matchLabels: {"pod": "a"}}
ingress:
- from:
  - podSelector: {matchLabels: {"pod": "b"}}
"#,
                )),
                Step::Apply(pod_object("x", "c", &[("pod", "b")], ip("x", "c"))),
            ],
        },
        Case {
            name: "pod-label-change-leaves-and-rejoins-the-selection",
            steps: vec![
                Step::Apply(policy(
                    "x",
                    "deny-a",
                    r#"
podSelector: {matchLabels: {"pod": "a"}}
policyTypes: ["Ingress", "Egress"]
"#,
                )),
                Step::Apply(pod_object("x", "a", &[("pod", "a2")], ip("x", "a"))),
                Step::Apply(pod_object("x", "a", &[("pod", "a")], ip("x", "a"))),
            ],
        },
        Case {
            name: "namespace-label-change-joins-a-selector",
            steps: vec![
                Step::Apply(policy(
                    "x",
                    "from-y",
                    r#"
podSelector: {}
ingress:
- from:
  - namespaceSelector: {matchLabels: {"ns": "y"}}
"#,
                )),
                Step::Apply(namespace_object("z", &[("ns", "y")])),
            ],
        },
    ]
}

/// The cases run across two nodes: one or more of each kind of rule.
pub const CROSS_NODE_CASES: [&str; 14] = [
    "deny-ingress-namespace-x",
    "deny-egress-namespace-x",
    "deny-both-namespace-y",
    "ingress-namespace-and-pod-in-one-peer",
    "ingress-namespace-or-pod-two-peers",
    "match-expressions-not-in",
    "ip-block-one-pod",
    "ip-block-range-except-one-pod",
    "port-named-ingress",
    "port-range-tcp-80-81",
    "policy-types-defaulted-with-egress-rules",
    "union-of-two-policies",
    "delete-one-of-two",
    "pod-label-change-joins-a-peer",
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netpol::reference::{Cluster, Peer};

    /// x/a = 10.9.1.2, x/b = .3, ... z/c = .10 (as on one node).
    fn ips() -> PodIps {
        let mut ips = PodIps::new();
        let mut host = 2;
        for ns in NAMESPACES {
            for pod in POD_NAMES {
                ips.insert((ns.into(), pod.into()), Ipv4Addr::new(10, 9, 1, host));
                host += 1;
            }
        }
        ips
    }

    /// Denied cells (src, dst, proto, port) among distinct pods.
    fn denied(c: &Cluster) -> usize {
        let pods: Vec<Peer> = NAMESPACES
            .iter()
            .flat_map(|n| POD_NAMES.iter().map(move |p| Peer::pod(n, p)))
            .collect();
        let mut n = 0;
        for s in &pods {
            for d in &pods {
                if s == d {
                    continue;
                }
                for (_, port, proto) in PORTS {
                    if !c.allowed(s, d, proto, port) {
                        n += 1;
                    }
                }
            }
        }
        n
    }

    #[test]
    fn the_baseline_is_nine_pods_with_their_ports_and_no_policy() {
        let c = Cluster::from_yaml(&baseline_objects(&ips())).expect("baseline");
        assert_eq!(c.namespaces.len(), 3);
        assert_eq!(c.pods.len(), 9);
        assert!(c.policies.is_empty());
        let zc = c.pod("z", "c").expect("z/c");
        assert_eq!(zc.ip, Ipv4Addr::new(10, 9, 1, 10));
        assert_eq!(zc.labels.get("pod").map(String::as_str), Some("c"));
        assert_eq!(
            zc.ports,
            PORTS
                .iter()
                .map(|(n, p, pr)| ((*n).to_owned(), *p, *pr))
                .collect::<Vec<_>>()
        );
        assert_eq!(
            c.namespace_labels("y").get("ns").map(String::as_str),
            Some("y")
        );
        assert_eq!(denied(&c), 0);
    }

    #[test]
    fn cases_are_many_unique_and_each_denies_something() {
        let all = cases(&ips());
        assert!(all.len() >= 40, "{} cases", all.len());
        let mut names: Vec<&str> = all.iter().map(|c| c.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all.len(), "case names are unique");
        for case in &all {
            assert!(!case.steps.is_empty(), "{}", case.name);
            let mut c = Cluster::from_yaml(&baseline_objects(&ips())).expect("baseline");
            let mut most = 0;
            for (i, step) in case.steps.iter().enumerate() {
                step.apply_to(&mut c)
                    .unwrap_or_else(|e| panic!("{} step {i}: {e}\n{}", case.name, step.text()));
                most = most.max(denied(&c));
            }
            assert!(most > 0, "{} never denies anything", case.name);
        }
    }

    #[test]
    fn the_cross_node_cases_exist() {
        let all = cases(&ips());
        for name in CROSS_NODE_CASES {
            assert!(all.iter().any(|c| c.name == name), "{name}");
        }
    }

    #[test]
    fn a_case_names_its_policies_for_the_reset() {
        let all = cases(&ips());
        let find = |name: &str| {
            all.iter()
                .find(|c| c.name == name)
                .unwrap_or_else(|| panic!("{name}"))
        };
        assert_eq!(
            find("delete-one-of-two").policies().expect("policies"),
            [
                ("x".to_owned(), "deny-ingress".to_owned()),
                ("x".to_owned(), "from-y".to_owned())
            ]
        );
        assert_eq!(
            find("update-adds-a-policy-type")
                .policies()
                .expect("policies"),
            [("z".to_owned(), "deny".to_owned())]
        );
        let mut c = Cluster::from_yaml(&baseline_objects(&ips())).expect("baseline");
        let case = find("policies-in-two-namespaces-both-directions");
        for step in &case.steps {
            step.apply_to(&mut c).expect("step");
        }
        assert_eq!(c.policies.len(), 4);
        let refs = policy_refs(&case.policies().expect("policies"));
        c.delete(&refs).expect("delete");
        assert!(c.policies.is_empty());
        assert_eq!(policy_refs(&[]), "");
    }

    #[test]
    fn selected_truths_of_the_scenario() {
        let ips = ips();
        let all = cases(&ips);
        let run = |name: &str| {
            let case = all
                .iter()
                .find(|c| c.name == name)
                .unwrap_or_else(|| panic!("{name}"));
            let mut c = Cluster::from_yaml(&baseline_objects(&ips)).expect("baseline");
            let mut after = Vec::new();
            for step in &case.steps {
                step.apply_to(&mut c).expect("step");
                after.push(c.clone());
            }
            after
        };
        let p = |s: &str| {
            let (n, name) = s.split_once('/').expect("ns/name");
            Peer::pod(n, name)
        };
        // The /30 except of y/b (10.9.1.6) holds 10.9.1.4-7: x/c, y/a, y/b, y/c.
        let c = &run("ip-block-except-slash-30")[0];
        assert!(!c.allowed(&p("x/c"), &p("x/a"), Proto::Tcp, 80));
        assert!(!c.allowed(&p("y/c"), &p("x/a"), Proto::Tcp, 80));
        assert!(c.allowed(&p("z/a"), &p("x/a"), Proto::Tcp, 80));
        assert!(c.allowed(&p("x/b"), &p("x/a"), Proto::Udp, 81));
        // The label change brings x/c in.
        let steps = run("pod-label-change-joins-a-peer");
        assert!(!steps[0].allowed(&p("x/c"), &p("x/a"), Proto::Tcp, 80));
        assert!(steps[1].allowed(&p("x/c"), &p("x/a"), Proto::Tcp, 80));
        // Named egress: UDP 80 and TCP 81 only.
        let c = &run("port-named-egress")[0];
        assert!(c.allowed(&p("x/a"), &p("z/b"), Proto::Udp, 80));
        assert!(c.allowed(&p("x/a"), &p("z/b"), Proto::Tcp, 81));
        assert!(!c.allowed(&p("x/a"), &p("z/b"), Proto::Tcp, 80));
        assert!(!c.allowed(&p("x/a"), &p("z/b"), Proto::Udp, 81));
    }
}
