//! `Service` + `EndpointSlice` objects → the frontends and backend groups
//! this node serves. Pure: no maps, no I/O (`sync.rs` writes the result).
//!
//! Kubernetes' rules, as kube-proxy applies them:
//! - frontends per Service port: every IPv4 `clusterIPs` entry (or
//!   `clusterIP`; `None` = headless: none), the `nodePort` (types NodePort
//!   and LoadBalancer), each IPv4 `externalIPs` entry and
//!   `status.loadBalancer.ingress[].ip`; `ExternalName` Services have none;
//! - backends from the EndpointSlices labelled
//!   `kubernetes.io/service-name` in the Service's namespace, `addressType:
//!   IPv4`; the port is the slice port named like the Service port (a
//!   named `targetPort` is resolved that way), else a numeric `targetPort`,
//!   else `port`;
//! - ready endpoints (`ready` absent counts as ready); when none is ready,
//!   those `serving` and `terminating`;
//! - `externalTrafficPolicy: Local`: clients from outside (scope
//!   `EXTERNAL`) get this node's backends only; clients inside the cluster
//!   get every backend. `internalTrafficPolicy: Local`: the ClusterIP gives
//!   this node's backends only. An endpoint is this node's when its
//!   `nodeName` is this node's name, or — no `nodeName` — its address is a
//!   pod of this node;
//! - `sessionAffinity: ClientIP` with `timeoutSeconds` (default 10800).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
};

use k8s_openapi::{
    api::{core::v1::Service, discovery::v1::EndpointSlice},
    apimachinery::pkg::util::intstr::IntOrString,
};

/// The label tying an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Default ClientIP affinity timeout (Kubernetes'), seconds.
pub const DEFAULT_AFFINITY_TIMEOUT: u32 = 10_800;

/// A transport protocol a Service port may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proto {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Proto {
    /// From a Kubernetes `protocol` field (absent: TCP).
    pub fn parse(text: Option<&str>) -> Option<Self> {
        match text.unwrap_or("TCP") {
            "TCP" => Some(Self::Tcp),
            "UDP" => Some(Self::Udp),
            "SCTP" => Some(Self::Sctp),
            _ => None,
        }
    }

    /// The IP protocol number.
    pub const fn number(self) -> u8 {
        match self {
            Self::Tcp => 6,
            Self::Udp => 17,
            Self::Sctp => 132,
        }
    }

    /// Kubernetes' spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
            Self::Sctp => "SCTP",
        }
    }
}

/// Who reaches a frontend (`rivet_common::svc_scope`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// Pods' and the node's sockets.
    Internal,
    /// Packets arriving at the uplink.
    External,
}

/// What kind of address a frontend is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FrontendKind {
    /// A `clusterIPs` entry.
    ClusterIp,
    /// The `nodePort`, on every node address.
    NodePort,
    /// An `externalIPs` entry.
    ExternalIp,
    /// A `status.loadBalancer.ingress` IP.
    LoadBalancer,
}

impl FrontendKind {
    /// Lower-case name for listings.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::ClusterIp => "ClusterIP",
            Self::NodePort => "NodePort",
            Self::ExternalIp => "ExternalIP",
            Self::LoadBalancer => "LoadBalancer",
        }
    }
}

/// A frontend: what a client names. `addr` 0.0.0.0 is a NodePort.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FrontendKey {
    /// The address (0.0.0.0: the node's addresses, a NodePort).
    pub addr: Ipv4Addr,
    /// The port.
    pub port: u16,
    /// The protocol.
    pub proto: Proto,
    /// Who asks.
    pub scope: Scope,
}

/// One port of one Service: what a frontend belongs to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortRef {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub name: String,
    /// The port's name (empty for an unnamed single port).
    pub port_name: String,
    /// The port's protocol.
    pub proto: Proto,
}

/// One backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Backend {
    /// Its address.
    pub addr: Ipv4Addr,
    /// Its port.
    pub port: u16,
}

/// Which backends of a Service port a frontend gets.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupKey {
    /// The Service port.
    pub port: PortRef,
    /// Only this node's backends.
    pub local_only: bool,
}

/// A frontend as planned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frontend {
    /// Its kind.
    pub kind: FrontendKind,
    /// Its backends.
    pub group: GroupKey,
    /// ClientIP affinity timeout (seconds), if on.
    pub affinity: Option<u32>,
    /// Only this node's backends and there are none here while the Service
    /// has some elsewhere: traffic is dropped (kube-proxy's rule for
    /// `Local` policies), not rejected — a load balancer's health check
    /// steers clients to other nodes.
    pub drop_when_empty: bool,
}

/// A `healthCheckNodePort` to serve (Services with
/// `externalTrafficPolicy: Local`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct HealthCheck {
    /// The port (on every node address).
    pub port: u16,
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub name: String,
    /// Ready endpoints on this node.
    pub local_endpoints: usize,
}

/// What this node serves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Every frontend.
    pub frontends: BTreeMap<FrontendKey, Frontend>,
    /// Every backend group the frontends name (sorted backends).
    pub groups: BTreeMap<GroupKey, Vec<Backend>>,
    /// Addresses holding external frontends (marked for the uplink).
    pub external_addrs: BTreeSet<Ipv4Addr>,
    /// This node's backends reachable at the uplink (their replies are
    /// translated back: endpoint flag `SERVICE`).
    pub uplink_backends: BTreeSet<Ipv4Addr>,
    /// Health-check ports to serve.
    pub health: Vec<HealthCheck>,
}

/// What the plan needs to know about this node.
pub struct NodeView<'a> {
    /// The node's name (`nodeName` of its endpoints).
    pub name: &'a str,
    /// Whether an address is a pod of this node.
    pub is_local_pod: &'a dyn Fn(Ipv4Addr) -> bool,
}

/// A slice endpoint with what the plan needs.
struct SliceEndpoint {
    addr: Ipv4Addr,
    ready: bool,
    serving_terminating: bool,
    local: bool,
}

fn ipv4(text: &str) -> Option<Ipv4Addr> {
    text.parse().ok()
}

/// Computes what this node serves from the stored objects.
pub fn plan<'a>(
    services: impl IntoIterator<Item = &'a Service>,
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    node: &NodeView<'_>,
) -> Plan {
    let mut by_service: BTreeMap<(String, String), Vec<&EndpointSlice>> = BTreeMap::new();
    for slice in slices {
        let labels = slice.metadata.labels.as_ref();
        let Some(service) = labels.and_then(|l| l.get(SERVICE_NAME_LABEL)) else {
            continue;
        };
        if slice.address_type != "IPv4" {
            continue;
        }
        let ns = slice.metadata.namespace.clone().unwrap_or_default();
        by_service
            .entry((ns, service.clone()))
            .or_default()
            .push(slice);
    }
    let mut out = Plan::default();
    for svc in services {
        let ns = svc.metadata.namespace.clone().unwrap_or_default();
        let Some(name) = svc.metadata.name.clone() else {
            continue;
        };
        let slices = by_service
            .get(&(ns.clone(), name.clone()))
            .map_or(&[][..], Vec::as_slice);
        plan_service(svc, &ns, &name, slices, node, &mut out);
    }
    out
}

/// The plan of one Service with its slices (those of another address
/// type are skipped).
pub fn plan_one(svc: &Service, slices: &[&EndpointSlice], node: &NodeView<'_>) -> Plan {
    let mut out = Plan::default();
    let ns = svc.metadata.namespace.as_deref().unwrap_or_default();
    let Some(name) = svc.metadata.name.as_deref() else {
        return out;
    };
    let slices: Vec<&EndpointSlice> = slices
        .iter()
        .copied()
        .filter(|s| s.address_type == "IPv4")
        .collect();
    plan_service(svc, ns, name, &slices, node, &mut out);
    out
}

fn plan_service(
    svc: &Service,
    ns: &str,
    name: &str,
    slices: &[&EndpointSlice],
    node: &NodeView<'_>,
    out: &mut Plan,
) {
    let Some(spec) = &svc.spec else { return };
    let kind = spec.type_.as_deref().unwrap_or("ClusterIP");
    if kind == "ExternalName" {
        return;
    }
    let node_ports = kind == "NodePort" || kind == "LoadBalancer";
    let ext_local = spec.external_traffic_policy.as_deref() == Some("Local");
    let int_local = spec.internal_traffic_policy.as_deref() == Some("Local");
    let affinity = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        spec.session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .and_then(|t| u32::try_from(t).ok())
            .unwrap_or(DEFAULT_AFFINITY_TIMEOUT)
    });
    let mut cluster_ips: Vec<Ipv4Addr> = spec
        .cluster_ips
        .iter()
        .flatten()
        .chain(spec.cluster_ip.iter())
        .filter_map(|ip| ipv4(ip))
        .collect();
    cluster_ips.sort();
    cluster_ips.dedup();
    let external_ips: Vec<Ipv4Addr> = spec
        .external_ips
        .iter()
        .flatten()
        .filter_map(|ip| ipv4(ip))
        .collect();
    let lb_ips: Vec<Ipv4Addr> = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.as_deref().and_then(ipv4))
        .collect();
    let endpoints = slice_endpoints(slices, node);
    let mut local_ready = 0;
    for port in spec.ports.iter().flatten() {
        // SCTP is kept in the objects but not translated (the socket hooks
        // and the uplink serve TCP and UDP).
        let Some(proto) = Proto::parse(port.protocol.as_deref()).filter(|p| *p != Proto::Sctp)
        else {
            continue;
        };
        let Ok(service_port) = u16::try_from(port.port) else {
            continue;
        };
        let port_name = port.name.clone().unwrap_or_default();
        let backends = port_backends(slices, &endpoints, &port_name, port, proto);
        local_ready = local_ready.max(backends.iter().filter(|(_, l)| *l).count());
        let port_ref = PortRef {
            namespace: ns.to_owned(),
            name: name.to_owned(),
            port_name,
            proto,
        };
        let all = GroupKey {
            port: port_ref.clone(),
            local_only: false,
        };
        let local = GroupKey {
            port: port_ref,
            local_only: true,
        };
        let mut add = |addr: Ipv4Addr, port: u16, scope: Scope, kind, group: &GroupKey| {
            let key = FrontendKey {
                addr,
                port,
                proto,
                scope,
            };
            let group_backends: Vec<Backend> = backends
                .iter()
                .filter(|(_, l)| !group.local_only || *l)
                .map(|(b, _)| *b)
                .collect();
            let drop_when_empty = group.local_only && !backends.is_empty();
            out.groups.insert(group.clone(), group_backends);
            out.frontends.insert(
                key,
                Frontend {
                    kind,
                    group: group.clone(),
                    affinity,
                    drop_when_empty,
                },
            );
            if scope == Scope::External {
                if addr != Ipv4Addr::UNSPECIFIED {
                    out.external_addrs.insert(addr);
                }
                out.uplink_backends
                    .extend(backends.iter().filter(|(_, l)| *l).map(|(b, _)| b.addr));
            }
        };
        let cluster_group = if int_local { &local } else { &all };
        for ip in &cluster_ips {
            add(
                *ip,
                service_port,
                Scope::Internal,
                FrontendKind::ClusterIp,
                cluster_group,
            );
        }
        let ext_group = if ext_local { &local } else { &all };
        if node_ports
            && let Some(np) = port.node_port.and_then(|p| u16::try_from(p).ok())
            && np != 0
        {
            let any = Ipv4Addr::UNSPECIFIED;
            add(any, np, Scope::Internal, FrontendKind::NodePort, &all);
            add(any, np, Scope::External, FrontendKind::NodePort, ext_group);
        }
        for (ips, kind) in [
            (&external_ips, FrontendKind::ExternalIp),
            (&lb_ips, FrontendKind::LoadBalancer),
        ] {
            for ip in ips {
                add(*ip, service_port, Scope::Internal, kind, &all);
                add(*ip, service_port, Scope::External, kind, ext_group);
            }
        }
    }
    if ext_local
        && node_ports
        && let Some(hc) = spec
            .health_check_node_port
            .and_then(|p| u16::try_from(p).ok())
        && hc != 0
    {
        out.health.push(HealthCheck {
            port: hc,
            namespace: ns.to_owned(),
            name: name.to_owned(),
            local_endpoints: local_ready,
        });
    }
}

/// Every IPv4 endpoint address of the slices with its conditions.
fn slice_endpoints(slices: &[&EndpointSlice], node: &NodeView<'_>) -> Vec<Vec<SliceEndpoint>> {
    slices
        .iter()
        .map(|slice| {
            slice
                .endpoints
                .iter()
                .flat_map(|ep| {
                    let c = ep.conditions.as_ref();
                    let ready = c.and_then(|c| c.ready).unwrap_or(true);
                    let serving = c.and_then(|c| c.serving).unwrap_or(ready);
                    let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
                    let node_name = ep.node_name.as_deref();
                    ep.addresses.iter().filter_map(move |a| {
                        let addr = ipv4(a)?;
                        let local = match node_name {
                            Some(n) => n == node.name,
                            None => (node.is_local_pod)(addr),
                        };
                        Some(SliceEndpoint {
                            addr,
                            ready,
                            serving_terminating: serving && terminating,
                            local,
                        })
                    })
                })
                .collect()
        })
        .collect()
}

/// The backends of one Service port (sorted, with "is local"): ready ones,
/// or the serving-and-terminating ones when none is ready.
fn port_backends(
    slices: &[&EndpointSlice],
    endpoints: &[Vec<SliceEndpoint>],
    port_name: &str,
    port: &k8s_openapi::api::core::v1::ServicePort,
    proto: Proto,
) -> Vec<(Backend, bool)> {
    let mut ready = BTreeSet::new();
    let mut fallback = BTreeSet::new();
    for (slice, eps) in slices.iter().zip(endpoints) {
        let Some(target) = slice_port(slice, port_name, port, proto) else {
            continue;
        };
        for ep in eps {
            let backend = Backend {
                addr: ep.addr,
                port: target,
            };
            if ep.ready {
                ready.insert((backend, ep.local));
            } else if ep.serving_terminating {
                fallback.insert((backend, ep.local));
            }
        }
    }
    let chosen = if ready.is_empty() { fallback } else { ready };
    chosen.into_iter().collect()
}

/// The backend port a slice gives a Service port: the slice port of the
/// same name and protocol; a slice without ports: a numeric `targetPort`
/// (else `port`).
fn slice_port(
    slice: &EndpointSlice,
    port_name: &str,
    port: &k8s_openapi::api::core::v1::ServicePort,
    proto: Proto,
) -> Option<u16> {
    match slice.ports.as_deref() {
        Some(ports) if !ports.is_empty() => ports
            .iter()
            .find(|p| {
                p.name.as_deref().unwrap_or("") == port_name
                    && Proto::parse(p.protocol.as_deref()) == Some(proto)
            })
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p != 0),
        _ => match &port.target_port {
            Some(IntOrString::Int(n)) => u16::try_from(*n).ok().filter(|p| *p != 0),
            Some(IntOrString::String(_)) => None,
            None => u16::try_from(port.port).ok(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(json: serde_json::Value) -> Service {
        serde_json::from_value(json).expect("service")
    }

    fn slice(json: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(json).expect("slice")
    }

    fn web(spec: serde_json::Value) -> Service {
        let mut s = serde_json::json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {
                "clusterIP": "10.96.0.10",
                "ports": [{"name": "http", "port": 80, "targetPort": "http"}]
            }
        });
        if let (Some(base), Some(extra)) = (s["spec"].as_object_mut(), spec.as_object()) {
            for (k, v) in extra {
                base.insert(k.clone(), v.clone());
            }
        }
        service(s)
    }

    fn web_slice(endpoints: serde_json::Value) -> EndpointSlice {
        slice(serde_json::json!({
            "metadata": {"name": "web-1", "namespace": "default",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": endpoints
        }))
    }

    fn node() -> NodeView<'static> {
        NodeView {
            name: "n1",
            is_local_pod: &|_| false,
        }
    }

    fn key(addr: [u8; 4], port: u16, scope: Scope) -> FrontendKey {
        FrontendKey {
            addr: Ipv4Addr::from(addr),
            port,
            proto: Proto::Tcp,
            scope,
        }
    }

    fn backends(plan: &Plan, k: &FrontendKey) -> Vec<(Ipv4Addr, u16)> {
        let fe = plan.frontends.get(k).expect("frontend");
        plan.groups[&fe.group]
            .iter()
            .map(|b| (b.addr, b.port))
            .collect()
    }

    #[test]
    fn named_target_port_resolves_from_the_slice_and_only_ready_endpoints_serve() {
        let svc = web(serde_json::json!({}));
        let sl = web_slice(serde_json::json!([
            {"addresses": ["10.1.0.2"], "conditions": {"ready": true}},
            {"addresses": ["10.1.0.3"]},
            {"addresses": ["10.1.0.4"], "conditions": {"ready": false, "serving": true, "terminating": true}},
            {"addresses": ["10.1.0.5"], "conditions": {"ready": false}}
        ]));
        let plan = plan([&svc], [&sl], &node());
        let got = backends(&plan, &key([10, 96, 0, 10], 80, Scope::Internal));
        assert_eq!(
            got,
            vec![
                (Ipv4Addr::new(10, 1, 0, 2), 8080),
                (Ipv4Addr::new(10, 1, 0, 3), 8080)
            ]
        );
        assert_eq!(
            plan.frontends.len(),
            1,
            "a ClusterIP Service has one frontend"
        );
    }

    #[test]
    fn terminating_serving_endpoints_only_when_none_is_ready() {
        let svc = web(serde_json::json!({}));
        let sl = web_slice(serde_json::json!([
            {"addresses": ["10.1.0.4"], "conditions": {"ready": false, "serving": true, "terminating": true}},
            {"addresses": ["10.1.0.5"], "conditions": {"ready": false, "serving": false, "terminating": true}}
        ]));
        let plan = plan([&svc], [&sl], &node());
        let got = backends(&plan, &key([10, 96, 0, 10], 80, Scope::Internal));
        assert_eq!(got, vec![(Ipv4Addr::new(10, 1, 0, 4), 8080)]);
    }

    #[test]
    fn node_port_external_ips_and_local_policy() {
        let mut svc = web(serde_json::json!({
            "type": "LoadBalancer",
            "externalTrafficPolicy": "Local",
            "healthCheckNodePort": 32000,
            "externalIPs": ["203.0.113.10"],
            "ports": [{"name": "http", "port": 80, "targetPort": "http", "nodePort": 30080}]
        }));
        svc.status = serde_json::from_value(serde_json::json!({
            "loadBalancer": {"ingress": [{"ip": "198.51.100.7"}]}
        }))
        .ok();
        let sl = web_slice(serde_json::json!([
            {"addresses": ["10.1.0.2"], "nodeName": "n1"},
            {"addresses": ["10.2.0.2"], "nodeName": "n2"}
        ]));
        let plan = plan([&svc], [&sl], &node());
        let both = vec![
            (Ipv4Addr::new(10, 1, 0, 2), 8080),
            (Ipv4Addr::new(10, 2, 0, 2), 8080),
        ];
        let mine = vec![(Ipv4Addr::new(10, 1, 0, 2), 8080)];
        assert_eq!(
            backends(&plan, &key([10, 96, 0, 10], 80, Scope::Internal)),
            both
        );
        assert_eq!(
            backends(&plan, &key([0, 0, 0, 0], 30080, Scope::Internal)),
            both
        );
        assert_eq!(
            backends(&plan, &key([0, 0, 0, 0], 30080, Scope::External)),
            mine
        );
        assert_eq!(
            backends(&plan, &key([203, 0, 113, 10], 80, Scope::External)),
            mine
        );
        assert_eq!(
            backends(&plan, &key([198, 51, 100, 7], 80, Scope::External)),
            mine
        );
        assert_eq!(
            backends(&plan, &key([198, 51, 100, 7], 80, Scope::Internal)),
            both
        );
        assert_eq!(
            plan.external_addrs,
            [
                Ipv4Addr::new(198, 51, 100, 7),
                Ipv4Addr::new(203, 0, 113, 10)
            ]
            .into_iter()
            .collect()
        );
        assert_eq!(
            plan.uplink_backends,
            [Ipv4Addr::new(10, 1, 0, 2)].into_iter().collect()
        );
        assert_eq!(
            plan.health,
            vec![HealthCheck {
                port: 32000,
                namespace: "default".into(),
                name: "web".into(),
                local_endpoints: 1
            }]
        );
        let ext = &plan.frontends[&key([0, 0, 0, 0], 30080, Scope::External)];
        assert!(ext.drop_when_empty, "Local with backends elsewhere drops");
    }

    #[test]
    fn headless_external_name_and_foreign_slices_serve_nothing() {
        let headless = service(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"clusterIP": "None", "ports": [{"port": 80}]}
        }));
        let external = service(serde_json::json!({
            "metadata": {"name": "ext", "namespace": "default"},
            "spec": {"type": "ExternalName", "externalName": "example.com"}
        }));
        let sl = web_slice(serde_json::json!([{"addresses": ["10.1.0.2"]}]));
        let plan = plan([&headless, &external], [&sl], &node());
        assert!(plan.frontends.is_empty(), "{:?}", plan.frontends);
        // A slice of another namespace is not the Service's.
        let svc = web(serde_json::json!({}));
        let mut other = sl.clone();
        other.metadata.namespace = Some("other".into());
        let plan = plan_of(&svc, &other);
        assert!(backends(&plan, &key([10, 96, 0, 10], 80, Scope::Internal)).is_empty());
    }

    fn plan_of(svc: &Service, sl: &EndpointSlice) -> Plan {
        plan([svc], [sl], &node())
    }

    #[test]
    fn affinity_and_internal_local_policy() {
        let svc = web(serde_json::json!({
            "sessionAffinity": "ClientIP",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 30}},
            "internalTrafficPolicy": "Local"
        }));
        let sl = web_slice(serde_json::json!([
            {"addresses": ["10.1.0.2"], "nodeName": "n2"}
        ]));
        let plan = plan_of(&svc, &sl);
        let k = key([10, 96, 0, 10], 80, Scope::Internal);
        assert_eq!(plan.frontends[&k].affinity, Some(30));
        assert!(backends(&plan, &k).is_empty(), "no local backend");
        assert!(plan.frontends[&k].drop_when_empty);
        let plain = web(serde_json::json!({"sessionAffinity": "ClientIP"}));
        let plan = plan_of(&plain, &sl);
        assert_eq!(plan.frontends[&k].affinity, Some(DEFAULT_AFFINITY_TIMEOUT));
    }
}
