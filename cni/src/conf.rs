//! The network configuration on stdin, its capabilities (`runtimeConfig`)
//! and `args`, decoded and validated. Every value that reaches the agent has
//! been checked here or is checked again there.

use std::{net::Ipv4Addr, path::PathBuf};

use ipnet::Ipv4Net;

use rivet_api::{Bandwidth, CNI_ID_PATTERN, EndpointRef, IpRange, PodMeta, PortMapping, Protocol};
use serde::Deserialize;

use crate::skel::{CniError, code, valid_id};

/// Default agent socket.
pub const DEFAULT_SOCKET: &str = rivet_api::DEFAULT_SOCKET;

/// The network configuration (the plugin's entry of a conflist, with the
/// runtime's additions).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetConf {
    /// Spec version of the config and of the result to print.
    pub cni_version: String,
    /// Network name.
    pub name: String,
    /// Plugin binary name.
    #[serde(rename = "type")]
    pub kind: String,
    /// Agent socket (rivet's own key).
    #[serde(default)]
    pub socket: Option<PathBuf>,
    /// IPAM: `{"type": "rivet"}` (the agent, default) or a delegated plugin.
    #[serde(default)]
    pub ipam: Option<IpamConf>,
    /// DNS settings echoed into the result.
    #[serde(default)]
    pub dns: Option<serde_json::Value>,
    /// Capability arguments from the runtime (keys matched like Go's
    /// decoder does, see [`RuntimeConfig`]).
    #[serde(default, deserialize_with = "runtime_config_folded")]
    pub runtime_config: RuntimeConfig,
    /// Conventional `args` (`{"cni": {"ips": [...]}}`).
    #[serde(default)]
    pub args: Option<ArgsConf>,
    /// The previous plugin's result in a chain; the ADD result for DEL/CHECK.
    #[serde(default)]
    pub prev_result: Option<serde_json::Value>,
    /// GC: attachments to keep.
    #[serde(default, rename = "cni.dev/valid-attachments")]
    pub valid_attachments: Option<Vec<Attachment>>,
    /// GC: the key the spec first documented.
    #[serde(default, rename = "cni.dev/attachments")]
    pub attachments: Option<Vec<Attachment>>,
}

/// The `ipam` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpamConf {
    /// `rivet` for the agent's IPAM, anything else is a plugin in CNI_PATH.
    #[serde(rename = "type")]
    pub kind: String,
    /// host-local style range sets (only IPv4 ranges are used).
    #[serde(default)]
    pub ranges: Vec<Vec<IpRange>>,
    /// host-local's single-range shorthand.
    #[serde(default)]
    pub subnet: Option<String>,
    /// With `subnet`.
    #[serde(default)]
    pub range_start: Option<Ipv4Addr>,
    /// With `subnet`.
    #[serde(default)]
    pub range_end: Option<Ipv4Addr>,
    /// With `subnet`.
    #[serde(default)]
    pub gateway: Option<Ipv4Addr>,
    /// Extra routes for the pod (always via the pod's gateway).
    #[serde(default)]
    pub routes: Vec<RouteConf>,
}

/// A route entry of the ipam section.
#[derive(Debug, Clone, Deserialize)]
pub struct RouteConf {
    /// Destination CIDR.
    pub dst: String,
}

/// `{containerID, ifname}` of a GC list.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    /// Container ID.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// Interface name.
    pub ifname: String,
}

/// `runtimeConfig` capabilities rivet consumes.
///
/// Runtimes built on Go's CNI library (containerd's CRI plugin among them)
/// serialize capability arguments with Go field names
/// (`{"HostPort":18080,"ContainerPort":8080,"Protocol":"tcp","HostIP":""}`),
/// and the reference plugins accept them because Go's JSON decoder matches
/// object keys to fields case-insensitively. This section is decoded the
/// same way: keys are folded to lower case first ([`Folded`]; of two
/// keys that fold alike the later wins, as in Go; `null` is absence), so
/// the field names below are the folded ones.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RuntimeConfig {
    /// `portMappings`.
    #[serde(default, rename = "portmappings")]
    pub port_mappings: Vec<PortMappingConf>,
    /// `bandwidth`.
    #[serde(default)]
    pub bandwidth: Option<BandwidthConf>,
    /// `ips` (requested addresses, CIDR or plain).
    #[serde(default)]
    pub ips: Vec<String>,
}

/// A port mapping as runtimes send it (keys folded, see [`RuntimeConfig`]).
#[derive(Debug, Clone, Deserialize)]
pub struct PortMappingConf {
    /// Node port.
    #[serde(rename = "hostport")]
    pub host_port: i64,
    /// Pod port.
    #[serde(rename = "containerport")]
    pub container_port: i64,
    /// `tcp` (default), `udp` or `sctp`, any case.
    #[serde(default)]
    pub protocol: Option<String>,
    /// Node address, empty for all.
    #[serde(default, rename = "hostip")]
    pub host_ip: Option<String>,
}

/// Bandwidth as runtimes send it (bits per second, bits; keys folded, see
/// [`RuntimeConfig`]).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct BandwidthConf {
    /// Ingress rate.
    #[serde(default, rename = "ingressrate")]
    pub ingress_rate: Option<u64>,
    /// Ingress burst.
    #[serde(default, rename = "ingressburst")]
    pub ingress_burst: Option<u64>,
    /// Egress rate.
    #[serde(default, rename = "egressrate")]
    pub egress_rate: Option<u64>,
    /// Egress burst.
    #[serde(default, rename = "egressburst")]
    pub egress_burst: Option<u64>,
}

/// A JSON value read with every object key lower-cased, in document order:
/// of keys that fold alike the later one wins and a `null` member leaves
/// the earlier value alone — what Go's decoder does with a struct's fields.
pub struct Folded(pub serde_json::Value);

impl<'de> Deserialize<'de> for Folded {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FoldVisitor).map(Folded)
    }
}

struct FoldVisitor;

impl<'de> serde::de::Visitor<'de> for FoldVisitor {
    type Value = serde_json::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Folded(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(items.into())
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members = serde_json::Map::new();
        while let Some((key, Folded(v))) = map.next_entry::<String, Folded>()? {
            if !v.is_null() {
                members.insert(key.to_lowercase(), v);
            }
        }
        Ok(members.into())
    }
}

fn runtime_config_folded<'de, D>(d: D) -> Result<RuntimeConfig, D::Error>
where
    D: serde::Deserializer<'de>,
{
    use serde::de::Error as _;
    let Folded(raw) = Folded::deserialize(d)?;
    if raw.is_null() {
        return Ok(RuntimeConfig::default());
    }
    serde_json::from_value(raw).map_err(|e| D::Error::custom(format!("runtimeConfig: {e}")))
}

/// Conventional `args`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ArgsConf {
    /// `args.cni`.
    #[serde(default)]
    pub cni: Option<CniArgsConf>,
}

/// `args.cni`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CniArgsConf {
    /// Requested addresses.
    #[serde(default)]
    pub ips: Vec<String>,
}

fn invalid(msg: impl Into<String>) -> CniError {
    CniError::new(code::INVALID_CONFIG, msg, "")
}

impl NetConf {
    /// Decodes stdin (code 6 when it is not the expected JSON) and checks
    /// `name` and `type` (code 7).
    pub fn parse(bytes: &[u8]) -> Result<Self, CniError> {
        let conf: NetConf = serde_json::from_slice(bytes).map_err(|e| {
            CniError::new(
                code::DECODE,
                "failed to decode the network configuration",
                e.to_string(),
            )
        })?;
        if !valid_id(&conf.name) {
            return Err(invalid(format!(
                "invalid network name {:?}: must match {CNI_ID_PATTERN}",
                conf.name
            )));
        }
        if conf.kind.is_empty() || conf.kind.contains('/') {
            return Err(invalid(format!("invalid plugin type {:?}", conf.kind)));
        }
        if let Some(ipam) = &conf.ipam
            && (ipam.kind.is_empty() || ipam.kind.contains('/'))
        {
            return Err(invalid(format!("invalid ipam type {:?}", ipam.kind)));
        }
        Ok(conf)
    }

    /// Only the version, for error reporting when the rest does not decode.
    pub fn version_of(bytes: &[u8]) -> Option<String> {
        #[derive(Deserialize)]
        struct V {
            #[serde(rename = "cniVersion")]
            cni_version: String,
        }
        serde_json::from_slice::<V>(bytes)
            .ok()
            .map(|v| v.cni_version)
    }

    /// The agent socket.
    pub fn socket(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET))
    }

    /// The delegated IPAM plugin, if the ipam type is not rivet's own.
    pub fn delegated_ipam(&self) -> Option<&str> {
        self.ipam
            .as_ref()
            .map(|i| i.kind.as_str())
            .filter(|k| *k != "rivet")
    }

    /// The agent's allocation ranges (IPv4 only; empty = whole pod CIDR).
    pub fn ranges(&self) -> Vec<IpRange> {
        let Some(ipam) = &self.ipam else {
            return Vec::new();
        };
        let mut out: Vec<IpRange> = ipam
            .ranges
            .iter()
            .flatten()
            .filter(|r| !r.subnet.contains(':'))
            .cloned()
            .collect();
        if let Some(subnet) = &ipam.subnet
            && !subnet.contains(':')
        {
            out.push(IpRange {
                subnet: subnet.clone(),
                range_start: ipam.range_start,
                range_end: ipam.range_end,
                gateway: ipam.gateway,
            });
        }
        out
    }

    /// Extra routes from the ipam section (validated CIDRs).
    pub fn routes(&self) -> Result<Vec<String>, CniError> {
        let Some(ipam) = &self.ipam else {
            return Ok(Vec::new());
        };
        ipam.routes
            .iter()
            .map(|r| route_destination(&r.dst).map(|net| net.to_string()))
            .collect()
    }

    /// Validated port mappings (IPv6 host addresses do not apply to an
    /// IPv4 datapath and are skipped).
    pub fn port_mappings(&self) -> Result<Vec<PortMapping>, CniError> {
        let mut out = Vec::new();
        for p in &self.runtime_config.port_mappings {
            let port = |v: i64, what: &str| {
                u16::try_from(v)
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| invalid(format!("portMappings: {what} {v} is not 1..=65535")))
            };
            let protocol = match p
                .protocol
                .as_deref()
                .unwrap_or("tcp")
                .to_ascii_lowercase()
                .as_str()
            {
                "tcp" => Protocol::Tcp,
                "udp" => Protocol::Udp,
                "sctp" => Protocol::Sctp,
                other => return Err(invalid(format!("portMappings: unknown protocol {other:?}"))),
            };
            let host_ip = match p.host_ip.as_deref() {
                None | Some("") => None,
                Some(text) if text.contains(':') => continue,
                Some(text) => Some(
                    text.parse::<Ipv4Addr>()
                        .map_err(|_| invalid(format!("portMappings: invalid hostIP {text:?}")))?,
                ),
            };
            out.push(PortMapping {
                host_port: port(p.host_port, "hostPort")?,
                container_port: port(p.container_port, "containerPort")?,
                protocol,
                host_ip,
            });
        }
        Ok(out)
    }

    /// Validated bandwidth (code 7 when the reference `bandwidth` plugin
    /// would refuse it).
    pub fn bandwidth(&self) -> Result<Option<Bandwidth>, CniError> {
        let Some(b) = self.runtime_config.bandwidth.as_ref() else {
            return Ok(None);
        };
        let bw = Bandwidth {
            ingress_rate: b.ingress_rate,
            ingress_burst: b.ingress_burst,
            egress_rate: b.egress_rate,
            egress_burst: b.egress_burst,
        };
        bw.validate()
            .map_err(|e| invalid(format!("runtimeConfig.bandwidth: {e}")))?;
        Ok(Some(bw))
    }

    /// A requested address from `runtimeConfig.ips` or `args.cni.ips`.
    pub fn requested_ip(&self) -> Result<Option<Ipv4Addr>, CniError> {
        let from_args = self
            .args
            .as_ref()
            .and_then(|a| a.cni.as_ref())
            .map(|c| c.ips.clone())
            .unwrap_or_default();
        for text in self.runtime_config.ips.iter().chain(&from_args) {
            let addr = text.split('/').next().unwrap_or_default();
            if addr.contains(':') {
                continue;
            }
            return addr
                .parse()
                .map(Some)
                .map_err(|_| invalid(format!("invalid requested IP {text:?}")));
        }
        Ok(None)
    }

    /// The GC keep-list (either key; both may be present).
    pub fn gc_keep(&self) -> Vec<EndpointRef> {
        self.valid_attachments
            .iter()
            .chain(&self.attachments)
            .flatten()
            .map(|a| EndpointRef::new(&a.container_id, &a.ifname))
            .collect()
    }
}

/// A route destination: `a.b.c.d/len` with no host bits set.
fn route_destination(text: &str) -> Result<Ipv4Net, CniError> {
    match text.parse::<Ipv4Net>() {
        Ok(net) if net.addr() == net.network() => Ok(net),
        _ => Err(invalid(format!("invalid route destination {text:?}"))),
    }
}

/// `CNI_ARGS`: `K=V;K2=V2`. Unknown keys are an error unless
/// `IgnoreUnknown` is true (like the reference plugins).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    /// Pod identity.
    pub pod: Option<PodMeta>,
    /// `IP=`.
    pub ip: Option<Ipv4Addr>,
}

/// Parses `CNI_ARGS`.
pub fn parse_cni_args(text: &str) -> Result<CniArgs, CniError> {
    let mut ignore_unknown = false;
    let mut pairs = Vec::new();
    for part in text.split(';').filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').ok_or_else(|| {
            CniError::new(
                code::INVALID_ENV,
                format!("CNI_ARGS: invalid pair {part:?}"),
                "",
            )
        })?;
        if k == "IgnoreUnknown" {
            ignore_unknown = matches!(v.to_ascii_lowercase().as_str(), "1" | "true");
        }
        pairs.push((k, v));
    }
    let mut out = CniArgs::default();
    let (mut ns, mut name) = (None, None);
    let mut unknown = Vec::new();
    for (k, v) in pairs {
        match k {
            "IgnoreUnknown" | "K8S_POD_INFRA_CONTAINER_ID" | "K8S_POD_UID" => {}
            "K8S_POD_NAMESPACE" => ns = Some(v.to_owned()),
            "K8S_POD_NAME" => name = Some(v.to_owned()),
            "IP" => {
                out.ip = Some(v.parse().map_err(|_| {
                    CniError::new(code::INVALID_ENV, format!("CNI_ARGS: invalid IP {v:?}"), "")
                })?);
            }
            other => unknown.push(other.to_owned()),
        }
    }
    if !unknown.is_empty() && !ignore_unknown {
        return Err(CniError::new(
            code::INVALID_ENV,
            format!("CNI_ARGS: unknown args {unknown:?}"),
            "set IgnoreUnknown=1 to ignore them",
        ));
    }
    if let (Some(namespace), Some(name)) = (ns, name) {
        out.pod = Some(PodMeta { namespace, name });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(extra: &str) -> Result<NetConf, CniError> {
        NetConf::parse(
            format!(r#"{{"cniVersion":"1.0.0","name":"rivet","type":"rivet-cni"{extra}}}"#)
                .as_bytes(),
        )
    }

    #[test]
    fn minimal_config() {
        let c = conf("").expect("valid");
        assert_eq!(c.socket(), PathBuf::from(DEFAULT_SOCKET));
        assert!(c.delegated_ipam().is_none());
        assert!(c.ranges().is_empty());
    }

    #[test]
    fn decode_errors_are_code_6_and_names_code_7() {
        assert_eq!(NetConf::parse(b"{not json").expect_err("syntax").code, 6);
        assert_eq!(NetConf::parse(b"").expect_err("empty").code, 6);
        assert_eq!(
            NetConf::parse(br#"{"cniVersion":1,"name":"a","type":"b"}"#)
                .expect_err("type")
                .code,
            6
        );
        for name in ["", "../x", "a/b", "-a"] {
            let e = NetConf::parse(
                format!(r#"{{"cniVersion":"1.0.0","name":"{name}","type":"x"}}"#).as_bytes(),
            )
            .expect_err(name);
            assert_eq!(e.code, 7, "{name}");
        }
        let e = NetConf::parse(br#"{"cniVersion":"1.0.0","name":"a","type":"../../bin/sh"}"#)
            .expect_err("type");
        assert_eq!(e.code, 7);
    }

    #[test]
    fn ranges_and_delegation() {
        let c = conf(r#","ipam":{"type":"rivet","ranges":[[{"subnet":"10.1.0.0/25"},{"subnet":"fd00::/64"}],[{"subnet":"10.1.0.128/25","rangeStart":"10.1.0.130"}]]}"#)
            .expect("valid");
        assert_eq!(c.ranges().len(), 2);
        let c = conf(r#","ipam":{"type":"host-local","subnet":"10.1.0.0/24"}"#).expect("valid");
        assert_eq!(c.delegated_ipam(), Some("host-local"));
    }

    #[test]
    fn port_mappings_validated() {
        let c = conf(r#","runtimeConfig":{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"TCP"},{"hostPort":53,"containerPort":53,"protocol":"udp","hostIP":"10.0.0.1"},{"hostPort":80,"containerPort":80,"hostIP":"::1"}]}"#)
            .expect("valid");
        let pms = c.port_mappings().expect("valid mappings");
        assert_eq!(pms.len(), 2, "the IPv6 mapping is skipped");
        assert_eq!(pms[0].protocol, Protocol::Tcp);
        assert_eq!(pms[1].host_ip, Some("10.0.0.1".parse().expect("ip")));
        for bad in [
            r#"{"hostPort":0,"containerPort":80}"#,
            r#"{"hostPort":70000,"containerPort":80}"#,
            r#"{"hostPort":80,"containerPort":-1}"#,
            r#"{"hostPort":80,"containerPort":80,"protocol":"icmp"}"#,
            r#"{"hostPort":80,"containerPort":80,"hostIP":"banana"}"#,
        ] {
            let c =
                conf(&format!(r#","runtimeConfig":{{"portMappings":[{bad}]}}"#)).expect("decodes");
            assert_eq!(c.port_mappings().expect_err(bad).code, 7, "{bad}");
        }
    }

    #[test]
    fn go_field_names_accepted_like_the_reference_plugins() {
        // containerd 1.6's CRI plugin, byte for byte.
        let c = conf(r#","runtimeConfig":{"portMappings":[{"HostPort":18080,"ContainerPort":8080,"Protocol":"tcp","HostIP":""}],"bandwidth":{"IngressRate":1000000,"IngressBurst":2000000,"EgressRate":3000000,"EgressBurst":4000000}}"#)
            .expect("Go field names decode");
        let pms = c.port_mappings().expect("valid mappings");
        assert_eq!(
            pms,
            vec![PortMapping {
                host_port: 18080,
                container_port: 8080,
                protocol: Protocol::Tcp,
                host_ip: None,
            }],
            "HostIP \"\" is every node address"
        );
        assert_eq!(
            c.bandwidth().expect("valid bandwidth"),
            Some(Bandwidth {
                ingress_rate: Some(1_000_000),
                ingress_burst: Some(2_000_000),
                egress_rate: Some(3_000_000),
                egress_burst: Some(4_000_000),
            })
        );
        // Any case; of two spellings the later wins; null leaves it alone.
        let c = conf(r#","RUNTIMECONFIG":null,"runtimeConfig":{"PORTMAPPINGS":[{"hostport":1,"HOSTPORT":2,"containerPORT":3,"hostIp":null,"protocol":"UDP"}]}"#)
            .expect("decodes");
        let pms = c.port_mappings().expect("valid");
        assert_eq!((pms[0].host_port, pms[0].container_port), (2, 3));
        assert_eq!(pms[0].protocol, Protocol::Udp);
        assert_eq!(pms[0].host_ip, None);
        // A missing port is still an error, named.
        let e = conf(r#","runtimeConfig":{"portMappings":[{"ContainerPort":80}]}"#)
            .expect_err("no host port");
        assert_eq!(e.code, 6);
        assert!(e.details.contains("hostport"), "{}", e.details);
    }

    #[test]
    fn cni_args() {
        let a =
            parse_cni_args("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;FOO=bar")
                .expect("valid");
        assert_eq!(
            a.pod,
            Some(PodMeta {
                namespace: "default".into(),
                name: "web-0".into()
            })
        );
        assert_eq!(parse_cni_args("FOO=bar").expect_err("unknown").code, 4);
        assert_eq!(
            parse_cni_args("IP=10.1.0.9").expect("ip").ip,
            Some("10.1.0.9".parse().expect("ip"))
        );
        assert!(parse_cni_args("garbage").is_err());
        assert_eq!(parse_cni_args("").expect("empty"), CniArgs::default());
    }

    #[test]
    fn gc_lists_from_both_keys() {
        let c = conf(r#","cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"}],"cni.dev/attachments":[{"containerID":"b","ifname":"eth0"}]"#)
            .expect("valid");
        assert_eq!(c.gc_keep().len(), 2);
    }

    #[test]
    fn cidrs() {
        assert_eq!(
            route_destination("10.0.0.0/8").expect("ok").to_string(),
            "10.0.0.0/8"
        );
        assert_eq!(
            route_destination("0.0.0.0/0").expect("ok").to_string(),
            "0.0.0.0/0"
        );
        for bad in [
            "10.0.0.1/8",
            "10.0.0.0/33",
            "nope",
            "10.0.0.0",
            "10.0.0.0/",
            "::/0",
        ] {
            let e = route_destination(bad).expect_err(bad);
            assert_eq!(e.code, code::INVALID_CONFIG, "{bad:?}");
            assert_eq!(e.msg, format!("invalid route destination {bad:?}"));
        }
    }
}
