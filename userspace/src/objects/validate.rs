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
//! - Namespace, Pod, NetworkPolicy: their names (deeper checks later).
//!
//! Every error names the field path from the object's root; [`validate`]
//! reports all of an object's errors at once.

use std::{
    collections::HashSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use k8s_openapi::{
    api::{core::v1::Service, discovery::v1::EndpointSlice},
    apimachinery::pkg::util::intstr::IntOrString,
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
        Object::EndpointSlice(slice) => endpoint_slice(slice, &mut p),
        Object::Namespace(_) | Object::Pod(_) | Object::NetworkPolicy(_) => {}
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
            if let Err(m) = label_value(name).and_then(|()| dns1035_label(name)) {
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
