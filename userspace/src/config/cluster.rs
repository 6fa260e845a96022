//! The cross-node section: mode, cluster CIDR, VXLAN, the cluster's source
//! (etcd or the Kubernetes API).

use ipnet::Ipv4Net;
use serde::Deserialize;

use super::{ConfigError, FileConfig, invalid};

/// Default cluster CIDR (all nodes' pod CIDRs).
pub const DEFAULT_CLUSTER_CIDR: &str = "10.244.0.0/16";
/// Default VXLAN network identifier (flannel's).
pub const DEFAULT_VNI: u32 = 1;
/// Default VXLAN UDP port (flannel's, Linux's historical default).
pub const DEFAULT_VXLAN_PORT: u16 = 8472;
/// Default etcd key prefix (flannel's is /coreos.com/network).
pub const DEFAULT_ETCD_PREFIX: &str = "/rivet.io/network";

/// How traffic to pods on other nodes travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// VXLAN encapsulation in BPF (default).
    #[default]
    Vxlan,
    /// IP-in-IP encapsulation in BPF.
    Ipip,
    /// No encapsulation: nodes share an L2 and route to each other's pods
    /// (flannel host-gw).
    Native,
    /// Native toward nodes on the uplink's subnet, VXLAN toward the others
    /// (flannel's DirectRouting).
    Hybrid,
    /// Routes learned by BGP, natively (Calico's BGP mode); a tunnel only
    /// toward next hops outside the uplink's subnet when `bgp_cross_subnet`
    /// says so.
    Bgp,
}

impl Mode {
    /// Bytes the worst-case path adds to a pod packet (pod MTU = uplink −
    /// this); in `bgp` mode the cross-subnet tunnel's
    /// ([`super::AgentConfig::overhead`]).
    pub const fn overhead(self) -> u32 {
        match self {
            Mode::Vxlan | Mode::Hybrid => rivet_common::VXLAN_OVERHEAD,
            Mode::Ipip => rivet_common::IPIP_OVERHEAD,
            Mode::Native | Mode::Bgp => 0,
        }
    }

    /// Name as in the configuration.
    pub const fn as_str(self) -> &'static str {
        match self {
            Mode::Vxlan => "vxlan",
            Mode::Ipip => "ipip",
            Mode::Native => "native",
            Mode::Hybrid => "hybrid",
            Mode::Bgp => "bgp",
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "vxlan" => Ok(Mode::Vxlan),
            "ipip" => Ok(Mode::Ipip),
            "native" => Ok(Mode::Native),
            "hybrid" => Ok(Mode::Hybrid),
            "bgp" => Ok(Mode::Bgp),
            other => Err(format!(
                "{other:?} is not a mode (vxlan, ipip, native, hybrid, bgp)"
            )),
        }
    }
}

/// Cluster state in etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdSettings {
    /// Endpoints (`http://127.0.0.1:2379`).
    pub endpoints: Vec<String>,
    /// Key prefix.
    pub prefix: String,
    /// Registration lease TTL in seconds.
    pub lease_ttl: u64,
}

/// The Kubernetes API as the cluster's source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeSettings {
    /// kubeconfig file; `None` = the pod's service account (in-cluster).
    pub kubeconfig: Option<std::path::PathBuf>,
}

/// The environment variable the kubelet sets in every pod: its presence
/// makes `kubernetes` the default source.
pub const IN_CLUSTER_ENV: &str = "KUBERNETES_SERVICE_HOST";

/// The cross-node settings, validated.
pub(super) struct Cluster {
    pub(super) mode: Mode,
    pub(super) cluster_cidr: Ipv4Net,
    pub(super) vni: u32,
    pub(super) vxlan_port: u16,
    pub(super) etcd: Option<EtcdSettings>,
    pub(super) kubernetes: Option<KubeSettings>,
}

pub(super) fn cluster(file: &FileConfig) -> Result<Cluster, ConfigError> {
    let cluster_text = file
        .cluster_cidr
        .clone()
        .unwrap_or_else(|| DEFAULT_CLUSTER_CIDR.to_owned());
    let cluster_cidr: Ipv4Net = cluster_text.parse().map_err(|_| {
        invalid(
            "cluster_cidr",
            &cluster_text,
            "not an IPv4 CIDR like 10.244.0.0/16",
        )
    })?;
    if cluster_cidr.network() != cluster_cidr.addr() || cluster_cidr.prefix_len() > 28 {
        return Err(invalid(
            "cluster_cidr",
            &cluster_text,
            "must be a network address with prefix length ≤ 28",
        ));
    }
    let vni = file.vni.unwrap_or(DEFAULT_VNI);
    if vni == 0 || vni > 0x00ff_ffff {
        return Err(invalid("vni", vni, "must be 1..=16777215"));
    }
    let vxlan_port = file.vxlan_port.unwrap_or(DEFAULT_VXLAN_PORT);
    if vxlan_port == 0 {
        return Err(invalid("vxlan_port", vxlan_port, "must be 1..=65535"));
    }
    let etcd = etcd(file)?;
    let in_cluster = std::env::var_os(IN_CLUSTER_ENV).is_some_and(|v| !v.is_empty());
    let source = match file.source.as_deref() {
        None if etcd.is_some() => "etcd",
        None if in_cluster || file.kubeconfig.is_some() => "kubernetes",
        None => "standalone",
        Some(s) => s,
    };
    let kubernetes = match source {
        "kubernetes" if etcd.is_some() => {
            return Err(invalid(
                "etcd_endpoints",
                "…",
                "the kubernetes source keeps no etcd: remove etcd_endpoints or set source = \"etcd\"",
            ));
        }
        "kubernetes" => Some(KubeSettings {
            kubeconfig: file.kubeconfig.clone(),
        }),
        "etcd" if etcd.is_none() => {
            return Err(invalid(
                "source",
                source,
                "the etcd source needs etcd_endpoints",
            ));
        }
        "standalone" if etcd.is_some() => {
            return Err(invalid(
                "source",
                source,
                "a standalone node uses no etcd_endpoints",
            ));
        }
        "etcd" | "standalone" => None,
        other => {
            return Err(invalid(
                "source",
                other,
                "one of standalone, etcd, kubernetes",
            ));
        }
    };
    if kubernetes.is_none() && file.kubeconfig.is_some() {
        return Err(invalid(
            "kubeconfig",
            "…",
            format!("only the kubernetes source reads a kubeconfig (source is {source})"),
        ));
    }
    Ok(Cluster {
        mode: file.mode.unwrap_or_default(),
        cluster_cidr,
        vni,
        vxlan_port,
        etcd,
        kubernetes,
    })
}

/// `None` without endpoints: a single node.
fn etcd(file: &FileConfig) -> Result<Option<EtcdSettings>, ConfigError> {
    let Some(endpoints) = file.etcd_endpoints.clone().filter(|e| !e.is_empty()) else {
        return Ok(None);
    };
    for ep in &endpoints {
        if !(ep.starts_with("http://") || ep.starts_with("https://")) {
            return Err(invalid("etcd_endpoints", ep, "use http://host:port"));
        }
    }
    let prefix = file
        .etcd_prefix
        .clone()
        .unwrap_or_else(|| DEFAULT_ETCD_PREFIX.to_owned());
    if !prefix.starts_with('/') || prefix.ends_with('/') {
        return Err(invalid(
            "etcd_prefix",
            &prefix,
            "must start with '/' and not end with one",
        ));
    }
    let lease_ttl = file.etcd_lease_ttl.unwrap_or(10);
    if !(2..=86_400).contains(&lease_ttl) {
        return Err(invalid(
            "etcd_lease_ttl",
            lease_ttl,
            "must be 2..=86400 seconds",
        ));
    }
    Ok(Some(EtcdSettings {
        endpoints,
        prefix,
        lease_ttl,
    }))
}
