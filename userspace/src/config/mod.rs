//! Agent configuration: the knobs ([`FileConfig`], one definition for the
//! TOML file and the flags), then validation by section into the typed
//! [`AgentConfig`]. Every error names the offending key and value.
//!
//! | file | section |
//! |---|---|
//! | `file.rs` | every knob: TOML key and flag |
//! | `node.rs` | the node; where state lives, API socket, metrics |
//! | `datapath.rs` | how programs attach, which object |
//! | `cluster.rs` | cross-node mode, cluster CIDR, VXLAN, etcd |
//! | `bgp.rs` | `bgp` mode: AS, mesh, reflectors, external peers, timers |
//! | `nat.rs` | masquerade |
//! | `limits.rs` | map capacities, fragment budget |

mod bgp;
mod cluster;
mod datapath;
mod file;
mod limits;
mod nat;
mod node;

use std::{net::Ipv4Addr, path::PathBuf};

use ipnet::Ipv4Net;

pub use self::{
    bgp::{
        BgpPeer, BgpSettings, CrossSubnet, DEFAULT_BGP_AS, DEFAULT_BGP_GRACEFUL_RESTART,
        DEFAULT_BGP_HOLD_TIME, DEFAULT_BGP_SPEAKER, DEFAULT_BGP_TABLE,
    },
    cluster::{
        DEFAULT_CLUSTER_CIDR, DEFAULT_ETCD_PREFIX, DEFAULT_VNI, DEFAULT_VXLAN_PORT, EtcdSettings,
        IN_CLUSTER_ENV, KubeSettings, Mode,
    },
    datapath::{AttachMode, ObjectSource},
    file::FileConfig,
    limits::{
        DEFAULT_FRAG_BUDGET_BURST, DEFAULT_FRAG_BUDGET_RATE, FragBudget, MIN_FRAG_BUDGET_BURST,
        MapLimits,
    },
    nat::{
        ALWAYS_NO_MASQUERADE, DEFAULT_NAT_PORT_RANGE, NatSettings, default_nat_max_per_pod,
        possible_cpus,
    },
    node::{DEFAULT_BPFFS, DEFAULT_GATEWAY, DEFAULT_METRICS_ADDR, DEFAULT_POD_CIDR},
};

/// Configuration problems. Each names the key and the value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// File path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema.
    #[error("invalid config file {path}: {message}")]
    Parse {
        /// File path.
        path: PathBuf,
        /// The parser's message (names the key).
        message: String,
    },
    /// The flags could not be taken over the file's values.
    #[error("invalid flags: {0}")]
    Flags(String),
    /// A value is out of range or inconsistent.
    #[error("invalid {key} {value:?}: {reason}")]
    Invalid {
        /// Key name, as in the file.
        key: &'static str,
        /// The rejected value.
        value: String,
        /// Why.
        reason: String,
    },
}

/// Validated agent configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentConfig {
    /// Node name.
    pub node_name: String,
    /// Pod CIDR of this node.
    pub pod_cidr: Ipv4Net,
    /// Pods' gateway address.
    pub gateway: Ipv4Addr,
    /// Uplink interface, if any.
    pub uplink: Option<String>,
    /// Pod MTU if set explicitly.
    pub mtu: Option<u32>,
    /// Network namespace path to enter at start.
    pub netns: Option<PathBuf>,
    /// bpffs mount point.
    pub bpffs: PathBuf,
    /// Pin directory.
    pub pin_dir: PathBuf,
    /// State directory.
    pub state_dir: PathBuf,
    /// API socket path.
    pub socket: PathBuf,
    /// Metrics and health endpoints (None: off).
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Attach mode for pod veths.
    pub pod_attach: AttachMode,
    /// Cross-node mode.
    pub mode: Mode,
    /// Cluster CIDR (every node's pod CIDR is inside it).
    pub cluster_cidr: Ipv4Net,
    /// VXLAN network identifier.
    pub vni: u32,
    /// VXLAN UDP port.
    pub vxlan_port: u16,
    /// BGP settings; `Some` exactly in `bgp` mode.
    pub bgp: Option<BgpSettings>,
    /// etcd settings; `None` = no etcd.
    pub etcd: Option<EtcdSettings>,
    /// The Kubernetes API source; `None` = not this source. With neither
    /// it nor etcd the node is standalone (routes only through the API).
    pub kubernetes: Option<KubeSettings>,
    /// Masquerade settings.
    pub nat: NatSettings,
    /// Map capacities.
    pub limits: MapLimits,
    /// Per-pod budget of fragments to the node's stack.
    pub frag_budget: FragBudget,
    /// Group owning the API socket (mode 0660), if any.
    pub socket_group: Option<String>,
    /// Where the programs come from (`ebpf_object`; default the embedded
    /// object).
    pub ebpf_object: ObjectSource,
    /// Test only: make endpoint ADD fail at this step, one of
    /// [`FAULT_STEPS`]. No knob sets it ([`AgentConfig::resolve`] leaves it
    /// `None`); rivetd sets it from its hidden `--test-fault-add-at` flag,
    /// which it accepts only with [`TEST_FAULTS_ENV`]`=1` in its
    /// environment.
    pub fail_add_at: Option<String>,
}

/// Test only: the ADD steps where a failure can be injected (rivetd
/// `--test-fault-add-at <step>`), in the order ADD passes them.
pub const FAULT_STEPS: [&str; 5] = [
    "after_reserve",
    "after_veth",
    "after_map",
    "after_both_sides",
    "after_attach",
];

/// Test only: the environment variable that must be `1` for rivetd to
/// accept `--test-fault-add-at`.
pub const TEST_FAULTS_ENV: &str = "RIVET_TEST_FAULTS";

fn invalid(key: &'static str, value: impl ToString, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// Interface names: 1..=15 bytes, no '/', ':' or whitespace, not "." or "..".
pub fn validate_ifname(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 15 {
        return Err("interface names are 1 to 15 bytes".into());
    }
    if name == "." || name == ".." {
        return Err("interface name cannot be '.' or '..'".into());
    }
    if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        return Err("interface names cannot contain '/', ':' or whitespace".into());
    }
    Ok(())
}

fn absolute(key: &'static str, path: PathBuf) -> Result<PathBuf, ConfigError> {
    if path.is_absolute() {
        Ok(path)
    } else {
        Err(invalid(key, path.display(), "must be an absolute path"))
    }
}

impl AgentConfig {
    /// Bytes the worst-case path to another node adds to a pod packet
    /// (pod MTU = uplink − this).
    pub fn overhead(&self) -> u32 {
        match &self.bgp {
            Some(bgp) => bgp.cross_subnet.overhead(),
            None => self.mode.overhead(),
        }
    }

    /// Whether a cluster store (etcd or the Kubernetes API) feeds the
    /// node: readiness then waits for it to be in sync.
    pub fn has_store(&self) -> bool {
        self.etcd.is_some() || self.kubernetes.is_some()
    }

    /// The source's name: `etcd`, `kubernetes` or `standalone`.
    pub fn source_name(&self) -> &'static str {
        match (&self.etcd, &self.kubernetes) {
            (Some(_), _) => "etcd",
            (None, Some(_)) => "kubernetes",
            (None, None) => "standalone",
        }
    }

    /// A store state as the status shows it: `etcd: synced (2 peers)`.
    pub fn store_text(&self, state: &impl std::fmt::Display) -> String {
        if self.has_store() {
            format!("{}: {state}", self.source_name())
        } else {
            state.to_string()
        }
    }

    /// Applies defaults and validates, section by section, then what
    /// binds the sections together.
    pub fn resolve(file: FileConfig) -> Result<Self, ConfigError> {
        let node = node::node(&file)?;
        let places = node::places(&file, &node.node_name)?;
        let cluster = cluster::cluster(&file)?;
        let bgp = bgp::bgp(&file, cluster.mode)?;
        let nat = nat::nat_settings(&file, cluster.cluster_cidr)?;
        let frag_budget = limits::frag_budget(&file)?;
        let limits = limits::map_limits(&file, nat.max_entries)?;

        // With etcd the lease decides the node's pod CIDR, with the
        // Kubernetes source its Node object.
        if cluster.etcd.is_none()
            && cluster.kubernetes.is_none()
            && !cluster.cluster_cidr.contains(&node.pod_cidr)
        {
            return Err(invalid(
                "pod_cidr",
                &node.pod_cidr_text,
                format!("must be inside the cluster CIDR {}", cluster.cluster_cidr),
            ));
        }
        if cluster.cluster_cidr.contains(&node.gateway) {
            return Err(invalid(
                "gateway",
                node.gateway,
                format!("must be outside the cluster CIDR {}", cluster.cluster_cidr),
            ));
        }
        Ok(Self {
            node_name: node.node_name,
            pod_cidr: node.pod_cidr,
            gateway: node.gateway,
            uplink: node.uplink,
            mtu: node.mtu,
            netns: node.netns,
            bpffs: places.bpffs,
            pin_dir: places.pin_dir,
            state_dir: places.state_dir,
            socket: places.socket,
            metrics_addr: places.metrics_addr,
            pod_attach: file.pod_attach.unwrap_or_default(),
            mode: cluster.mode,
            cluster_cidr: cluster.cluster_cidr,
            vni: cluster.vni,
            vxlan_port: cluster.vxlan_port,
            bgp,
            etcd: cluster.etcd,
            kubernetes: cluster.kubernetes,
            nat,
            limits,
            frag_budget,
            socket_group: places.socket_group,
            ebpf_object: file
                .ebpf_object
                .map_or(ObjectSource::Embedded, ObjectSource::File),
            fail_add_at: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(toml: &str) -> Result<AgentConfig, ConfigError> {
        AgentConfig::resolve(
            FileConfig::from_toml(toml).map_err(|message| ConfigError::Parse {
                path: "test".into(),
                message,
            })?,
        )
    }

    #[test]
    fn the_ebpf_object_defaults_to_the_embedded_one() {
        assert_eq!(
            resolve("").expect("empty").ebpf_object,
            ObjectSource::Embedded
        );
        let cfg = resolve("ebpf_object = \"/usr/lib/rivet/hotfix.o\"").expect("a path");
        assert_eq!(
            cfg.ebpf_object,
            ObjectSource::File("/usr/lib/rivet/hotfix.o".into())
        );
    }

    #[test]
    fn defaults() {
        let c = resolve("node_name = \"n1\"").expect("valid");
        assert_eq!(c.pod_cidr.to_string(), DEFAULT_POD_CIDR);
        assert_eq!(c.gateway, DEFAULT_GATEWAY);
        assert_eq!(c.pin_dir, PathBuf::from("/sys/fs/bpf/rivet/n1"));
        assert_eq!(c.state_dir, PathBuf::from("/var/lib/rivet/n1"));
        assert_eq!(c.socket, PathBuf::from("/run/rivet/rivetd.sock"));
        assert_eq!(c.netns, None);
        assert!(c.nat.masquerade);
        assert_eq!((c.nat.port_min, c.nat.port_max), DEFAULT_NAT_PORT_RANGE);
        assert_eq!(c.nat.no_masquerade[0], c.cluster_cidr);
        assert_eq!(c.nat.no_masquerade.len(), 1 + ALWAYS_NO_MASQUERADE.len());
        let cpus = possible_cpus().expect("possible CPUs");
        assert_eq!(
            c.nat.max_per_pod,
            default_nat_max_per_pod(rivet_common::NAT_MAX, cpus)
        );
        let c = resolve("node_name = \"n1\"\nnat_max_entries = 4096").expect("valid");
        assert_eq!(c.nat.max_per_pod, default_nat_max_per_pod(4096, cpus));
        let c = resolve("node_name = \"n1\"\nnat_max_per_pod = 0").expect("valid");
        assert_eq!(c.nat.max_per_pod, 0, "no limit");
        assert_eq!(c.frag_budget, FragBudget::default());
        let c = resolve("node_name = \"n1\"\nfrag_budget_rate = 0").expect("valid");
        assert_eq!(c.frag_budget.rate, 0, "no budget");
    }

    #[test]
    fn the_nat_quota_fits_half_of_one_cpus_share() {
        // A quarter of the table's flows on up to two CPUs.
        assert_eq!(default_nat_max_per_pod(4096, 1), 512);
        assert_eq!(default_nat_max_per_pod(4096, 2), 512);
        assert_eq!(default_nat_max_per_pod(131_072, 2), 16_384);
        // Then half of one CPU's share (max / cpus entries, two per flow).
        assert_eq!(default_nat_max_per_pod(4096, 64), 16);
        assert_eq!(default_nat_max_per_pod(131_072, 64), 512);
        assert_eq!(default_nat_max_per_pod(16, 64), 1, "never 0 (no limit)");
    }

    #[test]
    fn frag_budget_bounds() {
        // One pod's worst case over ipfrag_time (30 s), as documented: under
        // a third of the 4 MiB reassembly memory.
        let b = FragBudget::default();
        assert_eq!(b.burst + 30 * b.rate, 1216 * 1024);
        assert!(3 * (b.burst + 30 * b.rate) < 4 << 20);
        for (toml, key) in [
            ("frag_budget_rate = 100", "frag_budget_rate"),
            ("frag_budget_rate = 2000000000", "frag_budget_rate"),
            ("frag_budget_burst = 4096", "frag_budget_burst"),
            ("frag_budget_burst = 0", "frag_budget_burst"),
        ] {
            let err = resolve(toml).expect_err(toml).to_string();
            assert!(err.contains(key), "{toml}: {err}");
        }
    }

    #[test]
    fn netns_name_or_path() {
        let c = resolve("node_name = \"n1\"\nnetns = \"blue\"").expect("valid");
        assert_eq!(c.netns, Some(PathBuf::from("/run/netns/blue")));
        let c = resolve("node_name = \"n1\"\nnetns = \"/proc/1/ns/net\"").expect("valid");
        assert_eq!(c.netns, Some(PathBuf::from("/proc/1/ns/net")));
    }

    #[test]
    fn bad_values_name_the_key() {
        for (toml, key) in [
            ("pod_cidr = \"10.244.1.1/24\"", "pod_cidr"),
            ("pod_cidr = \"banana\"", "pod_cidr"),
            ("nat_port_range = \"100-200\"", "nat_port_range"),
            ("nat_port_range = \"62000-61000\"", "nat_port_range"),
            ("nat_port_range = \"61000\"", "nat_port_range"),
            ("no_masquerade = [\"10.1.0.0/33\"]", "no_masquerade"),
            ("nat_udp_timeout = 0", "nat_udp_timeout"),
            ("nat_max_entries = 3", "nat_max_entries"),
            (
                "nat_max_entries = 4096\nnat_max_per_pod = 2049",
                "nat_max_per_pod",
            ),
            ("max_endpoints = 8", "max_endpoints"),
            ("max_routes = 2000000", "max_routes"),
            ("max_hostports = 0", "max_hostports"),
            ("socket_group = \"a:b\"", "socket_group"),
            ("pod_cidr = \"10.0.0.0/31\"", "pod_cidr"),
            ("gateway = \"10.244.0.1\"", "gateway"),
            ("mtu = 100", "mtu"),
            ("uplink = \"a/b\"", "uplink"),
            ("uplink = \"waytoolonginterfacename\"", "uplink"),
            ("node_name = \"bad name\"", "node_name"),
            ("pin_dir = \"/tmp/x\"", "pin_dir"),
            ("socket = \"relative.sock\"", "socket"),
            ("pod_cidr = \"10.9.0.0/24\"", "pod_cidr"),
            ("cluster_cidr = \"10.0.0.1/8\"", "cluster_cidr"),
            ("vni = 0", "vni"),
            ("vni = 16777216", "vni"),
            ("mode = \"gre\"", "mode"),
            ("etcd_endpoints = [\"127.0.0.1:2379\"]", "etcd_endpoints"),
            (
                "etcd_endpoints = [\"http://x\"]\netcd_prefix = \"nope\"",
                "etcd_prefix",
            ),
            (
                "etcd_endpoints = [\"http://x\"]\netcd_lease_ttl = 1",
                "etcd_lease_ttl",
            ),
            ("vxlan_port = 0", "vxlan_port"),
            ("metrics_addr = \"localhost\"", "metrics_addr"),
            ("netns = \"\"", "netns"),
            ("netns = \"run/netns/x\"", "netns"),
            ("bpffs = \"sys/fs/bpf\"", "bpffs"),
            ("state_dir = \"var/lib/rivet\"", "state_dir"),
            ("gateway = \"10.244.9.1\"", "gateway"),
            ("gateway = \"255.255.255.255\"", "gateway"),
            ("nat_tcp_closing_timeout = 0", "nat_tcp_closing_timeout"),
            ("nat_gc_interval = 604801", "nat_gc_interval"),
            ("nat_tcp_timeout = 0", "nat_tcp_timeout"),
            ("socket_group = \"\"", "socket_group"),
            // Wrong types and names are parse errors that name the key too.
            ("pod_attach = \"bpf\"", "pod_attach"),
            ("masquerade = \"yes\"", "masquerade"),
            ("vni = -1", "vni"),
            ("no_masquerade = \"10.0.0.0/8\"", "no_masquerade"),
            ("max_endpoint = 64", "max_endpoint"),
        ] {
            let err = resolve(toml).expect_err(toml).to_string();
            assert!(err.contains(key), "{toml}: {err}");
            assert!(!err.contains('\n'), "{toml}: one line: {err}");
        }
    }

    #[test]
    fn unknown_keys_and_types_are_parse_errors() {
        let err = resolve("pod_cdir = \"10.0.0.0/24\"").expect_err("typo");
        assert!(err.to_string().contains("pod_cdir"), "{err}");
        let err = resolve("mtu = \"big\"").expect_err("type");
        assert!(matches!(err, ConfigError::Parse { .. }), "{err}");
    }

    #[test]
    fn ifnames() {
        assert!(validate_ifname("eth0").is_ok());
        assert!(validate_ifname("123456789012345").is_ok());
        for bad in ["", ".", "..", "1234567890123456", "a b", "a:b", "a/b"] {
            assert!(validate_ifname(bad).is_err(), "{bad:?}");
        }
    }
}
