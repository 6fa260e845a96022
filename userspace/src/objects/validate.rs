//! Semantic checks of an object, after its type was read, with the
//! defaults the API server applies (so that what is stored reads the same
//! whoever wrote it):
//!
//! - every kind: `metadata.name` required, a DNS-1035 label for a Service,
//!   a DNS-1123 label for a Namespace, a DNS-1123 subdomain otherwise;
//!   `metadata.namespace` a DNS-1123 label, `default` when absent (cleared
//!   for a Namespace);
//! - Service: `spec.type` (default ClusterIP), cluster IPs (`None`, empty
//!   or an IP; IPv6 kept), ports (protocol, default TCP; port; nodePort
//!   only for NodePort/LoadBalancer; targetPort, default the port; names
//!   unique and required with several ports; port/protocol pairs unique),
//!   externalIPs, traffic policies (defaults Cluster), session affinity
//!   (default None; ClientIP timeout 1–86400 s, default 10800),
//!   healthCheckNodePort, `status.loadBalancer.ingress[].ip`;
//! - EndpointSlice: `addressType`, the `kubernetes.io/service-name` label,
//!   addresses of that type (1–100 per endpoint, 1000 endpoints), ports
//!   (port, protocol default TCP, names);
//! - NetworkPolicy: `podSelector` and every peer selector (operators
//!   `In`/`NotIn` with values, `Exists`/`DoesNotExist` without; label
//!   values), `policyTypes` (`Ingress`/`Egress`, defaulted as the API
//!   server does: `Ingress`, plus `Egress` when there are egress rules),
//!   peers (an `ipBlock` alone, or selectors; a valid CIDR, each `except`
//!   a strictly smaller CIDR within it), ports (protocol, default TCP; a
//!   number 1–65535 or an IANA name; `endPort` only after a number, not
//!   below it);
//! - Namespace, Pod: their names.
//!
//! Every error names the field path from the object's root; [`validate`]
//! reports all of an object's errors at once.

use std::{
    collections::HashSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use k8s_openapi::{
    api::{
        core::v1::Service,
        discovery::v1::EndpointSlice,
        networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort},
    },
    apimachinery::pkg::{apis::meta::v1::LabelSelector, util::intstr::IntOrString},
};

use super::{FieldError, Kind, Object, SERVICE_NAME_LABEL};

/// The namespace of a namespaced object that names none.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Endpoints an EndpointSlice may hold.
const MAX_SLICE_ENDPOINTS: usize = 1000;
/// Addresses one endpoint may have.
const MAX_ENDPOINT_ADDRESSES: usize = 100;
/// Ports an EndpointSlice may list.
const MAX_SLICE_PORTS: usize = 100;
/// Session affinity timeout: the API server's default and largest value.
const DEFAULT_AFFINITY_TIMEOUT: i32 = 10_800;
const MAX_AFFINITY_TIMEOUT: i32 = 86_400;

/// Checks `object` and fills in the defaults; every error names the object
/// (`Service default/web`) and the field path.
pub fn validate(object: &mut Object) -> Result<(), Vec<FieldError>> {
    let mut p = Problems::default();
    let kind = object.kind();
    let meta = object.metadata_mut();
    if let Err(e) = check_name(kind, meta.name.as_deref()) {
        p.0.push(e);
    }
    if kind.namespaced() {
        match meta.namespace.as_deref() {
            None | Some("") => meta.namespace = Some(DEFAULT_NAMESPACE.to_owned()),
            Some(ns) => {
                if let Err(e) = check_namespace(ns) {
                    p.0.push(e);
                }
            }
        }
    } else {
        meta.namespace = None;
    }
    match object {
        Object::Service(svc) => service(svc, &mut p),
        Object::EndpointSlice(slice) => endpoint_slice(slice.open_mut(), &mut p),
        Object::NetworkPolicy(np) => network_policy(np, &mut p),
        Object::Namespace(_) | Object::Pod(_) => {}
    }
    if p.0.is_empty() {
        return Ok(());
    }
    let label = if object.metadata().name.as_deref().is_none_or(str::is_empty) {
        kind.name().to_owned()
    } else {
        object.key().to_string()
    };
    Err(p.0.into_iter().map(|e| e.of(label.clone())).collect())
}

/// Checks an object's name as Kubernetes does for its kind; returns it.
pub fn check_name(kind: Kind, name: Option<&str>) -> Result<String, FieldError> {
    let name = match name {
        None | Some("") => return Err(FieldError::new("metadata.name", "required")),
        Some(n) => n,
    };
    let checked = match kind {
        Kind::Service => dns1035_label(name),
        Kind::Namespace => dns1123_label(name),
        Kind::EndpointSlice | Kind::Pod | Kind::NetworkPolicy => dns1123_subdomain(name),
    };
    checked
        .map(|()| name.to_owned())
        .map_err(|m| FieldError::new("metadata.name", invalid(name, &m)))
}

/// Checks a namespace name (a DNS-1123 label).
pub fn check_namespace(namespace: &str) -> Result<(), FieldError> {
    dns1123_label(namespace)
        .map_err(|m| FieldError::new("metadata.namespace", invalid(namespace, &m)))
}

/// The errors of one object, paths from its root.
#[derive(Default)]
struct Problems(Vec<FieldError>);

impl Problems {
    fn add(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError::new(path, message));
    }
}

fn invalid(value: &str, why: &str) -> String {
    format!("invalid value {value:?}: {why}")
}

fn unsupported(value: &str, supported: &[&str]) -> String {
    format!("unsupported value {value:?}: must be {}", one_of(supported))
}

/// `A, B or C`.
fn one_of(values: &[&str]) -> String {
    match values {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

fn port_range(what: &str, value: i32, low: i32) -> Option<String> {
    (!(low..=65535).contains(&value))
        .then(|| format!("{what} {value} is out of range: must be between {low} and 65535"))
}

fn is_label_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'
}

/// A DNS-1123 label: at most 63 lowercase letters, digits and '-',
/// starting and ending with a letter or digit.
fn dns1123_label(s: &str) -> Result<(), String> {
    const WHY: &str = "must be a DNS-1123 label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit";
    let ends_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.chars().all(is_label_char)
        && ends_ok(s.chars().next())
        && ends_ok(s.chars().next_back());
    if ok { Ok(()) } else { Err(WHY.to_owned()) }
}

/// A DNS-1035 label: a DNS-1123 label that starts with a letter (Service
/// names).
fn dns1035_label(s: &str) -> Result<(), String> {
    const WHY: &str = "must be a DNS-1035 label: at most 63 lowercase letters, digits and '-', starting with a letter and ending with a letter or digit";
    match dns1123_label(s) {
        Ok(()) if s.starts_with(|c: char| c.is_ascii_lowercase()) => Ok(()),
        _ => Err(WHY.to_owned()),
    }
}

/// A DNS-1123 subdomain: at most 253 characters, DNS-1123 labels joined
/// by '.'.
fn dns1123_subdomain(s: &str) -> Result<(), String> {
    const WHY: &str = "must be a DNS-1123 subdomain: at most 253 lowercase letters, digits, '-' and '.', starting and ending with a letter or digit";
    let ok = !s.is_empty() && s.len() <= 253 && s.split('.').all(|l| dns1123_label(l).is_ok());
    if ok { Ok(()) } else { Err(WHY.to_owned()) }
}

/// An IANA service name (a named port): at most 15 lowercase letters,
/// digits and '-', at least one letter, no '-' at either end or twice in
/// a row.
fn iana_svc_name(s: &str) -> Result<(), String> {
    const WHY: &str = "must be a port number or an IANA service name: at most 15 lowercase letters, digits and '-', with a letter, no '-' at either end or twice in a row";
    let ok = !s.is_empty()
        && s.len() <= 15
        && s.chars().all(is_label_char)
        && s.chars().any(|c| c.is_ascii_lowercase())
        && !s.starts_with('-')
        && !s.ends_with('-')
        && !s.contains("--");
    if ok { Ok(()) } else { Err(WHY.to_owned()) }
}

/// A label value: at most 63 letters, digits, '-', '_' and '.', starting
/// and ending with a letter or digit (may be empty).
fn label_value(s: &str) -> Result<(), String> {
    const WHY: &str = "must be a label value: at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit";
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    let ok = s.is_empty()
        || (s.len() <= 63
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && alnum(s.chars().next())
            && alnum(s.chars().next_back()));
    if ok { Ok(()) } else { Err(WHY.to_owned()) }
}

/// A cluster IP: `None` (headless), empty (to be allocated) or an IP.
fn cluster_ip(ip: &str) -> Result<(), String> {
    if ip.is_empty() || ip == "None" || ip.parse::<IpAddr>().is_ok() {
        Ok(())
    } else {
        Err(format!(
            "{ip:?} is not an IP address (nor \"None\" for a headless Service)"
        ))
    }
}

fn ip(value: &str) -> Result<(), String> {
    value
        .parse::<IpAddr>()
        .map(|_| ())
        .map_err(|_| format!("{value:?} is not an IP address"))
}

const SERVICE_TYPES: &[&str] = &["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"];
const PROTOCOLS: &[&str] = &["TCP", "UDP", "SCTP"];
const POLICIES: &[&str] = &["Cluster", "Local"];
const AFFINITIES: &[&str] = &["None", "ClientIP"];
const ADDRESS_TYPES: &[&str] = &["IPv4", "IPv6", "FQDN"];

/// `value`, or `default` when absent or empty (the API server's reading).
fn or_default(value: &mut Option<String>, default: &str) -> String {
    if value.as_deref().is_none_or(str::is_empty) {
        *value = Some(default.to_owned());
    }
    value.clone().unwrap_or_default()
}

fn service(svc: &mut Service, p: &mut Problems) {
    let spec = svc.spec.get_or_insert_with(Default::default);
    let ty = or_default(&mut spec.type_, "ClusterIP");
    if !SERVICE_TYPES.contains(&ty.as_str()) {
        p.add("spec.type", unsupported(&ty, SERVICE_TYPES));
    }
    let node_ports = matches!(ty.as_str(), "NodePort" | "LoadBalancer");

    if let Some(cip) = &spec.cluster_ip
        && let Err(m) = cluster_ip(cip)
    {
        p.add("spec.clusterIP", m);
    }
    if let Some(ips) = &spec.cluster_ips {
        if ips.len() > 2 {
            p.add(
                "spec.clusterIPs",
                format!("{} addresses: at most 2, one per IP family", ips.len()),
            );
        }
        for (i, a) in ips.iter().enumerate() {
            if let Err(m) = cluster_ip(a) {
                p.add(format!("spec.clusterIPs[{i}]"), m);
            }
        }
        if let (Some(first), Some(cip)) = (ips.first(), spec.cluster_ip.as_deref())
            && !first.is_empty()
            && !cip.is_empty()
            && first != cip
        {
            p.add(
                "spec.clusterIPs[0]",
                format!("{first:?} must equal spec.clusterIP ({cip:?})"),
            );
        }
    }
    if ty == "ExternalName" {
        match spec.external_name.as_deref() {
            None | Some("") => p.add("spec.externalName", "required when type is ExternalName"),
            Some(name) => {
                if let Err(m) = dns1123_subdomain(name.strip_suffix('.').unwrap_or(name)) {
                    p.add("spec.externalName", invalid(name, &m));
                }
            }
        }
    }

    if let Some(ports) = &mut spec.ports {
        let several = ports.len() > 1;
        let mut names = HashSet::new();
        let mut pairs = HashSet::new();
        for (i, port) in ports.iter_mut().enumerate() {
            let at = |field: &str| format!("spec.ports[{i}].{field}");
            match port.name.as_deref() {
                None | Some("") if several => p.add(
                    at("name"),
                    "required when the Service has more than one port",
                ),
                None | Some("") => {}
                Some(name) => {
                    if let Err(m) = dns1123_label(name) {
                        p.add(at("name"), invalid(name, &m));
                    } else if !names.insert(name.to_owned()) {
                        p.add(at("name"), format!("duplicate port name {name:?}"));
                    }
                }
            }
            let protocol = or_default(&mut port.protocol, "TCP");
            if !PROTOCOLS.contains(&protocol.as_str()) {
                p.add(at("protocol"), unsupported(&protocol, PROTOCOLS));
            }
            if let Some(m) = port_range("port", port.port, 1) {
                p.add(at("port"), m);
            } else if !pairs.insert((port.port, protocol.clone())) {
                p.add(
                    at("port"),
                    format!("duplicate port {}/{protocol}", port.port),
                );
            }
            if let Some(node_port) = port.node_port {
                if let Some(m) = port_range("nodePort", node_port, 0) {
                    p.add(at("nodePort"), m);
                } else if node_port != 0 && !node_ports {
                    p.add(
                        at("nodePort"),
                        format!("may only be set when type is NodePort or LoadBalancer, not {ty}"),
                    );
                }
            }
            match &port.target_port {
                None | Some(IntOrString::Int(0)) => {
                    port.target_port = Some(IntOrString::Int(port.port));
                }
                Some(IntOrString::String(s)) if s.is_empty() => {
                    port.target_port = Some(IntOrString::Int(port.port));
                }
                Some(IntOrString::Int(n)) => {
                    if let Some(m) = port_range("targetPort", *n, 1) {
                        p.add(at("targetPort"), m);
                    }
                }
                Some(IntOrString::String(s)) => {
                    if let Err(m) = iana_svc_name(s) {
                        p.add(at("targetPort"), invalid(s, &m));
                    }
                }
            }
        }
    }

    let external_ips = spec.external_ips.as_deref().unwrap_or_default();
    for (i, a) in external_ips.iter().enumerate() {
        if let Err(m) = ip(a) {
            p.add(format!("spec.externalIPs[{i}]"), m);
        }
    }
    // Kubernetes' "externally accessible": node ports, or external IPs.
    let exposed = node_ports || (ty == "ClusterIP" && !external_ips.is_empty());
    match spec.external_traffic_policy.as_deref() {
        None | Some("") if node_ports => {
            spec.external_traffic_policy = Some("Cluster".to_owned());
        }
        None | Some("") => spec.external_traffic_policy = None,
        Some(policy) if !POLICIES.contains(&policy) => {
            p.add(
                "spec.externalTrafficPolicy",
                unsupported(policy, POLICIES),
            );
        }
        Some(_) if !exposed => p.add(
            "spec.externalTrafficPolicy",
            format!("may only be set when type is NodePort or LoadBalancer (or with externalIPs), not {ty}"),
        ),
        Some(_) => {}
    }
    if ty != "ExternalName" {
        let policy = or_default(&mut spec.internal_traffic_policy, "Cluster");
        if !POLICIES.contains(&policy.as_str()) {
            p.add("spec.internalTrafficPolicy", unsupported(&policy, POLICIES));
        }
    } else if let Some(policy) = spec.internal_traffic_policy.as_deref()
        && !policy.is_empty()
        && !POLICIES.contains(&policy)
    {
        p.add("spec.internalTrafficPolicy", unsupported(policy, POLICIES));
    }

    let affinity = or_default(&mut spec.session_affinity, "None");
    match affinity.as_str() {
        "None" => {
            if spec.session_affinity_config.is_some() {
                p.add(
                    "spec.sessionAffinityConfig",
                    "must not be set when sessionAffinity is None",
                );
            }
        }
        "ClientIP" => {
            let timeout = spec
                .session_affinity_config
                .get_or_insert_with(Default::default)
                .client_ip
                .get_or_insert_with(Default::default)
                .timeout_seconds
                .get_or_insert(DEFAULT_AFFINITY_TIMEOUT);
            if !(1..=MAX_AFFINITY_TIMEOUT).contains(timeout) {
                p.add(
                    "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                    format!(
                        "{timeout} is out of range: must be between 1 and {MAX_AFFINITY_TIMEOUT}"
                    ),
                );
            }
        }
        other => p.add("spec.sessionAffinity", unsupported(other, AFFINITIES)),
    }

    if let Some(port) = spec.health_check_node_port
        && port != 0
    {
        if let Some(m) = port_range("healthCheckNodePort", port, 0) {
            p.add("spec.healthCheckNodePort", m);
        } else if !(ty == "LoadBalancer"
            && spec.external_traffic_policy.as_deref() == Some("Local"))
        {
            p.add(
                "spec.healthCheckNodePort",
                "may only be set when type is LoadBalancer and externalTrafficPolicy is Local",
            );
        }
    }

    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_deref())
        .unwrap_or_default();
    for (i, entry) in ingress.iter().enumerate() {
        if let Some(a) = entry.ip.as_deref().filter(|a| !a.is_empty())
            && let Err(m) = ip(a)
        {
            p.add(format!("status.loadBalancer.ingress[{i}].ip"), m);
        }
    }
}

fn endpoint_slice(slice: &mut EndpointSlice, p: &mut Problems) {
    let address_type = slice.address_type.as_str();
    let type_ok = ADDRESS_TYPES.contains(&address_type);
    if address_type.is_empty() {
        p.add(
            "addressType",
            format!("required: {}", one_of(ADDRESS_TYPES)),
        );
    } else if !type_ok {
        p.add("addressType", unsupported(address_type, ADDRESS_TYPES));
    }

    let service = slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SERVICE_NAME_LABEL));
    match service.map(String::as_str) {
        None | Some("") => p.add(
            "metadata.labels",
            format!("label {SERVICE_NAME_LABEL:?} is required: it names the slice's Service"),
        ),
        Some(name) => {
            // Any label value, as Kubernetes takes it (a slice naming no
            // Service serves nothing).
            if let Err(m) = label_value(name) {
                p.add(
                    "metadata.labels",
                    format!("label {SERVICE_NAME_LABEL:?}: {}", invalid(name, &m)),
                );
            }
        }
    }

    if slice.endpoints.len() > MAX_SLICE_ENDPOINTS {
        p.add(
            "endpoints",
            format!(
                "{} endpoints: at most {MAX_SLICE_ENDPOINTS} per slice",
                slice.endpoints.len()
            ),
        );
    }
    for (i, endpoint) in slice.endpoints.iter().enumerate() {
        let n = endpoint.addresses.len();
        if !(1..=MAX_ENDPOINT_ADDRESSES).contains(&n) {
            p.add(
                format!("endpoints[{i}].addresses"),
                format!("{n} addresses: must be between 1 and {MAX_ENDPOINT_ADDRESSES}"),
            );
        }
        if !type_ok {
            continue;
        }
        for (j, a) in endpoint.addresses.iter().enumerate() {
            let checked = match address_type {
                "IPv4" => a
                    .parse::<Ipv4Addr>()
                    .map(|_| ())
                    .map_err(|_| format!("{a:?} is not an IPv4 address")),
                "IPv6" => a
                    .parse::<Ipv6Addr>()
                    .map(|_| ())
                    .map_err(|_| format!("{a:?} is not an IPv6 address")),
                _ => dns1123_subdomain(a).map_err(|m| invalid(a, &m)),
            };
            if let Err(m) = checked {
                p.add(format!("endpoints[{i}].addresses[{j}]"), m);
            }
        }
    }

    let ports = slice.ports.get_or_insert_with(Vec::new);
    if ports.len() > MAX_SLICE_PORTS {
        p.add(
            "ports",
            format!("{} ports: at most {MAX_SLICE_PORTS}", ports.len()),
        );
    }
    let mut names = HashSet::new();
    for (i, port) in ports.iter_mut().enumerate() {
        let at = |field: &str| format!("ports[{i}].{field}");
        if let Some(name) = port.name.as_deref().filter(|n| !n.is_empty()) {
            if let Err(m) = dns1123_label(name) {
                p.add(at("name"), invalid(name, &m));
            } else if !names.insert(name.to_owned()) {
                p.add(at("name"), format!("duplicate port name {name:?}"));
            }
        }
        let protocol = or_default(&mut port.protocol, "TCP");
        if !PROTOCOLS.contains(&protocol.as_str()) {
            p.add(at("protocol"), unsupported(&protocol, PROTOCOLS));
        }
        if let Some(number) = port.port
            && let Some(m) = port_range("port", number, 1)
        {
            p.add(at("port"), m);
        }
    }
    if slice.ports.as_ref().is_some_and(Vec::is_empty) {
        slice.ports = None;
    }
}

const POLICY_TYPES: &[&str] = &["Ingress", "Egress"];
const SELECTOR_OPERATORS: &[&str] = &["In", "NotIn", "Exists", "DoesNotExist"];

fn label_selector(sel: &LabelSelector, path: &str, p: &mut Problems) {
    for (k, v) in sel.match_labels.iter().flatten() {
        if k.is_empty() {
            p.add(
                format!("{path}.matchLabels"),
                "label keys must not be empty",
            );
        }
        if let Err(e) = label_value(v) {
            p.add(format!("{path}.matchLabels.{k}"), invalid(v, &e));
        }
    }
    for (i, e) in sel.match_expressions.iter().flatten().enumerate() {
        let at = format!("{path}.matchExpressions[{i}]");
        let values = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => p.add(
                format!("{at}.values"),
                format!("required: must be non-empty with operator {}", e.operator),
            ),
            "Exists" | "DoesNotExist" if !values.is_empty() => p.add(
                format!("{at}.values"),
                format!("must be empty with operator {}", e.operator),
            ),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => p.add(
                format!("{at}.operator"),
                unsupported(other, SELECTOR_OPERATORS),
            ),
        }
        if e.key.is_empty() {
            p.add(format!("{at}.key"), "required");
        }
    }
}

fn policy_peer(peer: &NetworkPolicyPeer, path: &str, p: &mut Problems) {
    if let Some(block) = &peer.ip_block {
        if peer.pod_selector.is_some() || peer.namespace_selector.is_some() {
            p.add(
                path,
                "may not specify both ipBlock and another peer (podSelector, namespaceSelector)",
            );
        }
        match block.cidr.parse::<ipnet::IpNet>() {
            Err(_) => p.add(
                format!("{path}.ipBlock.cidr"),
                invalid(&block.cidr, "must be a CIDR (address/prefix length)"),
            ),
            Ok(cidr) => {
                for (i, e) in block.except.iter().flatten().enumerate() {
                    let at = format!("{path}.ipBlock.except[{i}]");
                    match e.parse::<ipnet::IpNet>() {
                        Err(_) => p.add(at, invalid(e, "must be a CIDR")),
                        Ok(ex) if !(cidr.contains(&ex) && ex.prefix_len() > cidr.prefix_len()) => p
                            .add(
                                at,
                                invalid(e, &format!("must be a strict subset of {}", block.cidr)),
                            ),
                        Ok(_) => {}
                    }
                }
            }
        }
        return;
    }
    if peer.pod_selector.is_none() && peer.namespace_selector.is_none() {
        p.add(
            path,
            "must specify a peer (podSelector, namespaceSelector or ipBlock)",
        );
    }
    if let Some(sel) = &peer.pod_selector {
        label_selector(sel, &format!("{path}.podSelector"), p);
    }
    if let Some(sel) = &peer.namespace_selector {
        label_selector(sel, &format!("{path}.namespaceSelector"), p);
    }
}

fn policy_port(port: &mut NetworkPolicyPort, path: &str, p: &mut Problems) {
    let proto = or_default(&mut port.protocol, "TCP");
    if !PROTOCOLS.contains(&proto.as_str()) {
        p.add(format!("{path}.protocol"), unsupported(&proto, PROTOCOLS));
    }
    match (&port.port, port.end_port) {
        (Some(IntOrString::Int(n)), end) => {
            if let Some(e) = port_range("port", *n, 1) {
                p.add(format!("{path}.port"), e);
            }
            if let Some(end) = end {
                if end < *n {
                    p.add(
                        format!("{path}.endPort"),
                        format!("{end} must be greater than or equal to port {n}"),
                    );
                } else if let Some(e) = port_range("endPort", end, 1) {
                    p.add(format!("{path}.endPort"), e);
                }
            }
        }
        (Some(IntOrString::String(name)), end) => {
            if let Err(e) = iana_svc_name(name) {
                p.add(format!("{path}.port"), invalid(name, &e));
            }
            if end.is_some() {
                p.add(
                    format!("{path}.endPort"),
                    "may not be specified with a named port",
                );
            }
        }
        (None, Some(_)) => p.add(
            format!("{path}.endPort"),
            "may not be specified without a numeric port",
        ),
        (None, None) => {}
    }
}

fn network_policy(np: &mut NetworkPolicy, p: &mut Problems) {
    let spec = np.spec.get_or_insert_with(Default::default);
    if let Some(sel) = &spec.pod_selector {
        label_selector(sel, "spec.podSelector", p);
    }
    for (i, rule) in spec.ingress.iter_mut().flatten().enumerate() {
        for (j, peer) in rule.from.iter().flatten().enumerate() {
            policy_peer(peer, &format!("spec.ingress[{i}].from[{j}]"), p);
        }
        for (j, port) in rule.ports.iter_mut().flatten().enumerate() {
            policy_port(port, &format!("spec.ingress[{i}].ports[{j}]"), p);
        }
    }
    for (i, rule) in spec.egress.iter_mut().flatten().enumerate() {
        for (j, peer) in rule.to.iter().flatten().enumerate() {
            policy_peer(peer, &format!("spec.egress[{i}].to[{j}]"), p);
        }
        for (j, port) in rule.ports.iter_mut().flatten().enumerate() {
            policy_port(port, &format!("spec.egress[{i}].ports[{j}]"), p);
        }
    }
    let types = spec.policy_types.get_or_insert_with(Vec::new);
    if types.is_empty() {
        types.push("Ingress".to_owned());
        if spec.egress.as_ref().is_some_and(|e| !e.is_empty()) {
            types.push("Egress".to_owned());
        }
    }
    let mut seen = HashSet::new();
    for (i, t) in types.iter().enumerate() {
        if !POLICY_TYPES.contains(&t.as_str()) {
            p.add(
                format!("spec.policyTypes[{i}]"),
                unsupported(t, POLICY_TYPES),
            );
        } else if !seen.insert(t.clone()) {
            p.add(
                format!("spec.policyTypes[{i}]"),
                format!("duplicate value {t:?}"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::objects::parse_object;

    fn service(spec: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "web"}, "spec": spec})
    }

    fn slice(body: Value) -> Value {
        let mut v = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"name": "web-1", "labels": {SERVICE_NAME_LABEL: "web"}},
               "addressType": "IPv4",
               "endpoints": [{"addresses": ["10.1.0.5"]}]});
        if let (Value::Object(base), Value::Object(more)) = (&mut v, body) {
            base.extend(more);
        }
        v
    }

    fn accepted(value: Value) -> Object {
        parse_object(value.clone()).unwrap_or_else(|e| panic!("{value} refused: {e:?}"))
    }

    /// `value` is refused with an error at `path` (below the object
    /// `object`) whose message contains `needle`.
    #[track_caller]
    fn refused(value: Value, object: &str, path: &str, needle: &str) {
        let errors: Vec<String> = parse_object(value.clone())
            .map(|o| panic!("{value} accepted as {o:?}"))
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect();
        let prefix = format!("{object}: {path}: ");
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with(&prefix) && e[prefix.len()..].contains(needle)),
            "no error {prefix}…{needle}… in {errors:#?}"
        );
    }

    #[track_caller]
    fn service_refused(spec: Value, path: &str, needle: &str) {
        refused(service(spec), "Service default/web", path, needle);
    }

    #[track_caller]
    fn slice_refused(body: Value, path: &str, needle: &str) {
        refused(slice(body), "EndpointSlice default/web-1", path, needle);
    }

    fn spec_of(o: &Object) -> k8s_openapi::api::core::v1::ServiceSpec {
        o.as_service()
            .and_then(|s| s.spec.clone())
            .expect("a Service with a spec")
    }

    #[test]
    fn names_by_kind() {
        let named = |kind: &str, api: &str, meta: Value| {
            let mut v = json!({"apiVersion": api, "kind": kind, "metadata": meta});
            if kind == "EndpointSlice" {
                v["addressType"] = "IPv4".into();
                v["metadata"]["labels"] = json!({SERVICE_NAME_LABEL: "web"});
            }
            v
        };
        let svc = |name: &str| named("Service", "v1", json!({"name": name}));
        refused(
            named("Service", "v1", json!({})),
            "Service",
            "metadata.name",
            "required",
        );
        refused(svc(""), "Service", "metadata.name", "required");
        refused(
            svc("1web"),
            "Service default/1web",
            "metadata.name",
            "DNS-1035 label",
        );
        refused(
            svc("Web"),
            "Service default/Web",
            "metadata.name",
            "DNS-1035 label",
        );
        refused(
            svc("web-"),
            "Service default/web-",
            "metadata.name",
            "DNS-1035 label",
        );
        refused(
            svc(&"a".repeat(64)),
            &format!("Service default/{}", "a".repeat(64)),
            "metadata.name",
            "at most 63",
        );
        accepted(svc(&"a".repeat(63)));
        refused(
            named("Namespace", "v1", json!({"name": "a.b"})),
            "Namespace a.b",
            "metadata.name",
            "DNS-1123 label",
        );
        accepted(named("Namespace", "v1", json!({"name": "1a"})));
        accepted(named(
            "EndpointSlice",
            "discovery.k8s.io/v1",
            json!({"name": "web.1"}),
        ));
        refused(
            named(
                "EndpointSlice",
                "discovery.k8s.io/v1",
                json!({"name": "-web"}),
            ),
            "EndpointSlice default/-web",
            "metadata.name",
            "DNS-1123 subdomain",
        );
        refused(
            named("Pod", "v1", json!({"name": "a_b"})),
            "Pod default/a_b",
            "metadata.name",
            "DNS-1123 subdomain",
        );
        let long = vec!["a".repeat(63); 4].join(".");
        refused(
            named(
                "NetworkPolicy",
                "networking.k8s.io/v1",
                json!({"name": long}),
            ),
            &format!("NetworkPolicy default/{long}"),
            "metadata.name",
            "at most 253",
        );
        refused(
            named("Pod", "v1", json!({"name": "p", "namespace": "Prod"})),
            "Pod Prod/p",
            "metadata.namespace",
            "DNS-1123 label",
        );
        // Defaults: the namespace of namespaced kinds, none for a Namespace.
        let pod = accepted(named("Pod", "v1", json!({"name": "p"})));
        assert_eq!(pod.metadata().namespace.as_deref(), Some("default"));
        let ns = accepted(named(
            "Namespace",
            "v1",
            json!({"name": "n", "namespace": "x"}),
        ));
        assert_eq!(ns.metadata().namespace, None);
    }

    #[test]
    fn service_type_and_addresses() {
        service_refused(
            json!({"type": "Foo"}),
            "spec.type",
            "unsupported value \"Foo\": must be ClusterIP, NodePort, LoadBalancer or ExternalName",
        );
        service_refused(
            json!({"clusterIP": "10.0.0.300"}),
            "spec.clusterIP",
            "not an IP address",
        );
        service_refused(
            json!({"clusterIPs": ["10.0.0.1", "x"]}),
            "spec.clusterIPs[1]",
            "\"x\" is not an IP address",
        );
        service_refused(
            json!({"clusterIP": "10.0.0.1", "clusterIPs": ["10.0.0.2"]}),
            "spec.clusterIPs[0]",
            "must equal spec.clusterIP",
        );
        service_refused(
            json!({"clusterIPs": ["10.0.0.1", "fd00::1", "10.0.0.2"]}),
            "spec.clusterIPs",
            "at most 2",
        );
        service_refused(
            json!({"type": "ExternalName"}),
            "spec.externalName",
            "required when type is ExternalName",
        );
        service_refused(
            json!({"type": "ExternalName", "externalName": "Bad_Host"}),
            "spec.externalName",
            "DNS-1123 subdomain",
        );
        accepted(service(
            json!({"type": "ExternalName", "externalName": "db.example.com."}),
        ));
        service_refused(
            json!({"externalIPs": ["192.0.2.1", "a.b"]}),
            "spec.externalIPs[1]",
            "\"a.b\" is not an IP address",
        );
        service_refused(
            json!({"clusterIP": "bogus"}),
            "spec.clusterIP",
            "nor \"None\"",
        );
        // Headless, to be allocated, IPv4, IPv6 (kept as given).
        for ip in ["None", "", "10.96.0.10", "fd00::10"] {
            let o = accepted(service(json!({"clusterIP": ip, "clusterIPs": [ip]})));
            assert_eq!(spec_of(&o).cluster_ip.as_deref(), Some(ip));
        }
        // Every default the API server applies.
        let o = accepted(service(json!({"ports": [{"port": 80}]})));
        let spec = spec_of(&o);
        assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
        assert_eq!(spec.session_affinity.as_deref(), Some("None"));
        assert_eq!(spec.internal_traffic_policy.as_deref(), Some("Cluster"));
        assert_eq!(spec.external_traffic_policy, None);
        let o = accepted(service(
            json!({"type": "NodePort", "ports": [{"port": 80}]}),
        ));
        assert_eq!(
            spec_of(&o).external_traffic_policy.as_deref(),
            Some("Cluster")
        );
    }

    #[test]
    fn service_ports() {
        service_refused(
            json!({"ports": [{"port": 80, "protocol": "ICMP"}]}),
            "spec.ports[0].protocol",
            "must be TCP, UDP or SCTP",
        );
        service_refused(
            json!({"ports": [{"port": 80, "protocol": "tcp"}]}),
            "spec.ports[0].protocol",
            "unsupported value \"tcp\"",
        );
        service_refused(
            json!({"ports": [{"port": 0}]}),
            "spec.ports[0].port",
            "port 0 is out of range: must be between 1 and 65535",
        );
        service_refused(
            json!({"ports": [{"port": 65536}]}),
            "spec.ports[0].port",
            "out of range",
        );
        service_refused(
            json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 65536}]}),
            "spec.ports[0].nodePort",
            "between 0 and 65535",
        );
        service_refused(
            json!({"ports": [{"port": 80, "nodePort": 30080}]}),
            "spec.ports[0].nodePort",
            "only be set when type is NodePort or LoadBalancer, not ClusterIP",
        );
        accepted(service(
            json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 30080}]}),
        ));
        accepted(service(
            json!({"type": "LoadBalancer", "ports": [{"port": 80, "nodePort": 30080}]}),
        ));
        accepted(service(json!({"ports": [{"port": 80, "nodePort": 0}]})));
        service_refused(
            json!({"ports": [{"port": 80, "targetPort": 65536}]}),
            "spec.ports[0].targetPort",
            "targetPort 65536 is out of range",
        );
        service_refused(
            json!({"ports": [{"port": 80, "targetPort": -1}]}),
            "spec.ports[0].targetPort",
            "out of range",
        );
        for bad in ["http-web-long-name", "8080", "-http", "ht--tp", "HTTP"] {
            service_refused(
                json!({"ports": [{"port": 80, "targetPort": bad}]}),
                "spec.ports[0].targetPort",
                "IANA service name",
            );
        }
        service_refused(
            json!({"ports": [{"port": 80}, {"port": 81, "name": "b"}]}),
            "spec.ports[0].name",
            "required when the Service has more than one port",
        );
        service_refused(
            json!({"ports": [{"port": 80, "name": "a"}, {"port": 81, "name": "a"}]}),
            "spec.ports[1].name",
            "duplicate port name \"a\"",
        );
        service_refused(
            json!({"ports": [{"port": 80, "name": "Web"}]}),
            "spec.ports[0].name",
            "DNS-1123 label",
        );
        service_refused(
            json!({"ports": [{"port": 80, "name": "a"}, {"port": 80, "name": "b"}]}),
            "spec.ports[1].port",
            "duplicate port 80/TCP",
        );
        // The same port over two protocols is two ports (DNS).
        let o = accepted(service(json!({"ports": [
            {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": "dns"},
            {"name": "dns-tcp", "port": 53, "targetPort": 0},
        ]})));
        let ports = spec_of(&o).ports.expect("ports");
        assert_eq!(
            ports[0].target_port,
            Some(IntOrString::String("dns".into()))
        );
        assert_eq!(ports[1].protocol.as_deref(), Some("TCP"));
        assert_eq!(ports[1].target_port, Some(IntOrString::Int(53)));
        // One port needs no name.
        accepted(service(json!({"ports": [{"port": 80}]})));
    }

    #[test]
    fn service_policies_and_affinity() {
        service_refused(
            json!({"type": "NodePort", "externalTrafficPolicy": "Foo"}),
            "spec.externalTrafficPolicy",
            "must be Cluster or Local",
        );
        service_refused(
            json!({"externalTrafficPolicy": "Local"}),
            "spec.externalTrafficPolicy",
            "may only be set when type is NodePort or LoadBalancer",
        );
        accepted(service(
            json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local"}),
        ));
        accepted(service(
            json!({"externalIPs": ["192.0.2.7"], "externalTrafficPolicy": "Local"}),
        ));
        service_refused(
            json!({"internalTrafficPolicy": "Nearby"}),
            "spec.internalTrafficPolicy",
            "must be Cluster or Local",
        );
        accepted(service(json!({"internalTrafficPolicy": "Local"})));
        service_refused(
            json!({"sessionAffinity": "Sticky"}),
            "spec.sessionAffinity",
            "must be None or ClientIP",
        );
        let timeout = "spec.sessionAffinityConfig.clientIP.timeoutSeconds";
        for bad in [0, -5, 86_401] {
            service_refused(
                json!({"sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": bad}}}),
                timeout,
                "must be between 1 and 86400",
            );
        }
        service_refused(
            json!({"sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}}),
            "spec.sessionAffinityConfig",
            "must not be set when sessionAffinity is None",
        );
        let o = accepted(service(json!({"sessionAffinity": "ClientIP"})));
        let t = spec_of(&o)
            .session_affinity_config
            .and_then(|c| c.client_ip)
            .and_then(|c| c.timeout_seconds);
        assert_eq!(t, Some(10_800));
        service_refused(
            json!({"type": "LoadBalancer", "healthCheckNodePort": 30999}),
            "spec.healthCheckNodePort",
            "only be set when type is LoadBalancer and externalTrafficPolicy is Local",
        );
        service_refused(
            json!({"type": "NodePort", "externalTrafficPolicy": "Local", "healthCheckNodePort": 30999}),
            "spec.healthCheckNodePort",
            "only be set when type is LoadBalancer",
        );
        service_refused(
            json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local", "healthCheckNodePort": 70000}),
            "spec.healthCheckNodePort",
            "out of range",
        );
        accepted(service(
            json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local", "healthCheckNodePort": 30999}),
        ));
    }

    #[test]
    fn service_status_addresses() {
        let mut v = service(json!({"type": "LoadBalancer"}));
        v["status"] = json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}, {"hostname": "lb.example.com"}, {"ip": "nope"}]}});
        refused(
            v.clone(),
            "Service default/web",
            "status.loadBalancer.ingress[2].ip",
            "\"nope\" is not an IP address",
        );
        v["status"]["loadBalancer"]["ingress"][2]["ip"] = "2001:db8::1".into();
        accepted(v);
    }

    #[test]
    fn endpoint_slices() {
        slice_refused(
            json!({"addressType": "IPv5"}),
            "addressType",
            "must be IPv4, IPv6 or FQDN",
        );
        slice_refused(
            json!({"addressType": ""}),
            "addressType",
            "required: IPv4, IPv6 or FQDN",
        );
        let mut unlabeled = slice(json!({}));
        unlabeled["metadata"]["labels"] = json!({"app": "web"});
        refused(
            unlabeled,
            "EndpointSlice default/web-1",
            "metadata.labels",
            "\"kubernetes.io/service-name\" is required",
        );
        let mut bad_label = slice(json!({}));
        bad_label["metadata"]["labels"][SERVICE_NAME_LABEL] = "web!".into();
        refused(
            bad_label,
            "EndpointSlice default/web-1",
            "metadata.labels",
            "invalid value \"web!\": must be a label value",
        );
        slice_refused(
            json!({"endpoints": [{"addresses": []}]}),
            "endpoints[0].addresses",
            "0 addresses: must be between 1 and 100",
        );
        let many: Vec<String> = (0..101)
            .map(|i| format!("10.1.{}.{}", i / 200, i % 200 + 1))
            .collect();
        slice_refused(
            json!({"endpoints": [{"addresses": many}]}),
            "endpoints[0].addresses",
            "101 addresses",
        );
        slice_refused(
            json!({"endpoints": [{"addresses": ["10.1.0.1"]}, {"addresses": ["10.1.0.256"]}]}),
            "endpoints[1].addresses[0]",
            "\"10.1.0.256\" is not an IPv4 address",
        );
        slice_refused(
            json!({"addressType": "IPv6", "endpoints": [{"addresses": ["10.1.0.1"]}]}),
            "endpoints[0].addresses[0]",
            "not an IPv6 address",
        );
        slice_refused(
            json!({"addressType": "FQDN", "endpoints": [{"addresses": ["Bad_Host"]}]}),
            "endpoints[0].addresses[0]",
            "DNS-1123 subdomain",
        );
        accepted(slice(
            json!({"addressType": "FQDN", "endpoints": [{"addresses": ["db.example.com"]}]}),
        ));
        accepted(slice(
            json!({"addressType": "IPv6", "endpoints": [{"addresses": ["fd00::5"]}]}),
        ));
        let endpoints: Vec<Value> = (0..1001)
            .map(|_| json!({"addresses": ["10.1.0.1"]}))
            .collect();
        slice_refused(
            json!({"endpoints": endpoints}),
            "endpoints",
            "1001 endpoints: at most 1000",
        );
        slice_refused(
            json!({"ports": [{"port": 0}]}),
            "ports[0].port",
            "port 0 is out of range",
        );
        slice_refused(
            json!({"ports": [{"port": 80, "protocol": "ICMP"}]}),
            "ports[0].protocol",
            "must be TCP, UDP or SCTP",
        );
        slice_refused(
            json!({"ports": [{"name": "a", "port": 80}, {"name": "a", "port": 81}]}),
            "ports[1].name",
            "duplicate port name",
        );
        slice_refused(
            json!({"ports": [{"name": "A", "port": 80}]}),
            "ports[0].name",
            "DNS-1123 label",
        );
        let ports: Vec<Value> = (1..=101)
            .map(|i| json!({"name": format!("p{i}"), "port": i}))
            .collect();
        slice_refused(json!({"ports": ports}), "ports", "101 ports: at most 100");
        // Conditions are optional; a port without a number is allowed
        // (every port of the backends); the protocol defaults to TCP.
        let o = accepted(slice(json!({
            "endpoints": [
                {"addresses": ["10.1.0.5"], "conditions": {"ready": false, "serving": true}},
                {"addresses": ["10.1.0.6"]},
            ],
            "ports": [{"name": "http", "port": 8080}, {"name": "all"}],
        })));
        let slice = o.as_endpoint_slice().expect("slice");
        let ports = slice.ports.as_ref().expect("ports");
        assert_eq!(ports[0].protocol.as_deref(), Some("TCP"));
        assert_eq!(ports[1].port, None);
    }

    #[test]
    fn every_error_of_an_object_is_reported() {
        let errors = parse_object(service(json!({
            "type": "Foo",
            "ports": [{"port": 0}],
            "externalIPs": ["x"],
        })))
        .expect_err("three errors");
        let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            ["spec.type", "spec.ports[0].port", "spec.externalIPs[0]"]
        );
    }

    fn netpol(spec: Value) -> Value {
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
               "metadata": {"name": "p", "namespace": "x"}, "spec": spec})
    }

    #[test]
    fn network_policy_defaults() {
        let o = accepted(netpol(json!({"podSelector": {},
            "egress": [{"ports": [{"port": 53}]}]})));
        let np = o.as_network_policy().expect("policy");
        let spec = np.spec.as_ref().expect("spec");
        assert_eq!(
            spec.policy_types.as_deref(),
            Some(&["Ingress".to_owned(), "Egress".to_owned()][..])
        );
        let port = &spec.egress.as_ref().expect("egress")[0]
            .ports
            .as_ref()
            .expect("ports")[0];
        assert_eq!(port.protocol.as_deref(), Some("TCP"));
        let o = accepted(netpol(json!({"podSelector": {}})));
        let types = o
            .as_network_policy()
            .and_then(|n| n.spec.as_ref()?.policy_types.clone());
        assert_eq!(types, Some(vec!["Ingress".to_owned()]));
    }

    #[test]
    fn network_policy_refusals() {
        let np = "NetworkPolicy x/p";
        refused(
            netpol(json!({"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/33"}}]}]})),
            np,
            "spec.ingress[0].from[0].ipBlock.cidr",
            "CIDR",
        );
        refused(
            netpol(
                json!({"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8",
                "except": ["11.0.0.0/16"]}}]}]}),
            ),
            np,
            "spec.ingress[0].from[0].ipBlock.except[0]",
            "strict subset",
        );
        refused(
            netpol(
                json!({"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8"},
                "podSelector": {}}]}]}),
            ),
            np,
            "spec.ingress[0].from[0]",
            "both ipBlock",
        );
        refused(
            netpol(json!({"egress": [{"ports": [{"port": 90, "endPort": 80}]}]})),
            np,
            "spec.egress[0].ports[0].endPort",
            "greater than or equal",
        );
        refused(
            netpol(json!({"egress": [{"ports": [{"port": "http", "endPort": 80}]}]})),
            np,
            "spec.egress[0].ports[0].endPort",
            "named port",
        );
        refused(
            netpol(json!({"egress": [{"ports": [{"protocol": "ICMP"}]}]})),
            np,
            "spec.egress[0].ports[0].protocol",
            "unsupported",
        );
        refused(
            netpol(json!({"podSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}})),
            np,
            "spec.podSelector.matchExpressions[0].values",
            "non-empty",
        );
        refused(
            netpol(
                json!({"podSelector": {"matchExpressions": [{"key": "a", "operator": "Is", "values": ["b"]}]}}),
            ),
            np,
            "spec.podSelector.matchExpressions[0].operator",
            "unsupported",
        );
        refused(
            netpol(json!({"policyTypes": ["Ingress", "Sideways"]})),
            np,
            "spec.policyTypes[1]",
            "unsupported",
        );
        refused(
            netpol(json!({"ingress": [{"from": [{}]}]})),
            np,
            "spec.ingress[0].from[0]",
            "must specify a peer",
        );
    }
}
