//! Agent configuration: a TOML file, then command-line flags on top, then
//! validation. Every error names the offending key and value.

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use ipnet::Ipv4Net;
use serde::Deserialize;

/// Default gateway address the pods route through. It exists nowhere: the
/// datapath answers ARP for it.
pub const DEFAULT_GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
/// Default bpffs mount point.
pub const DEFAULT_BPFFS: &str = "/sys/fs/bpf";
/// Default node pod CIDR in single-node mode.
pub const DEFAULT_POD_CIDR: &str = "10.244.0.0/24";
/// Default cluster CIDR (all nodes' pod CIDRs).
pub const DEFAULT_CLUSTER_CIDR: &str = "10.244.0.0/16";
/// Default VXLAN network identifier (flannel's).
pub const DEFAULT_VNI: u32 = 1;
/// Default VXLAN UDP port (flannel's, Linux's historical default).
pub const DEFAULT_VXLAN_PORT: u16 = 8472;
/// Default etcd key prefix (flannel's is /coreos.com/network).
pub const DEFAULT_ETCD_PREFIX: &str = "/rivet.io/network";
/// Default source ports of masqueraded flows: above Linux's default
/// `ip_local_port_range` (32768–60999), so the node's own connections
/// never collide with them.
pub const DEFAULT_NAT_PORT_RANGE: (u16, u16) = (61_000, 65_535);
/// Destinations that are never masqueraded besides the cluster CIDR:
/// link-local, multicast, limited broadcast.
pub const ALWAYS_NO_MASQUERADE: [&str; 3] = ["169.254.0.0/16", "224.0.0.0/4", "255.255.255.255/32"];

/// Capacities of the maps the agent fills (entries), from `max_endpoints`,
/// `max_routes`, `max_hostports` and `nat_max_entries`. Every map is
/// preallocated by the kernel at this size when first created; a pinned map
/// keeps its size until `rivetd unload`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapLimits {
    /// Pods on this node (ENDPOINTS).
    pub endpoints: u32,
    /// Remote nodes (ROUTES and PEERS).
    pub routes: u32,
    /// hostPort mappings (HOSTPORTS).
    pub hostports: u32,
    /// NAT/conntrack entries (NAT; a masqueraded flow takes two).
    pub nat: u32,
}

impl Default for MapLimits {
    fn default() -> Self {
        Self {
            endpoints: rivet_common::ENDPOINTS_MAX,
            routes: rivet_common::ROUTES_MAX,
            hostports: rivet_common::HOSTPORTS_MAX,
            nat: rivet_common::NAT_MAX,
        }
    }
}

/// Masquerade (SNAT) settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatSettings {
    /// Masquerade pod traffic leaving the cluster (default on).
    pub masquerade: bool,
    /// First NAT source port.
    pub port_min: u16,
    /// Last NAT source port (inclusive).
    pub port_max: u16,
    /// Destinations kept un-masqueraded: the cluster CIDR, the
    /// [`ALWAYS_NO_MASQUERADE`] ones and the configured list.
    pub no_masquerade: Vec<Ipv4Net>,
    /// Idle timeout of an established TCP flow, seconds.
    pub tcp_timeout: u64,
    /// Idle timeout of a UDP flow, seconds.
    pub udp_timeout: u64,
    /// How long a TCP flow stays after it ended (a FIN each way, or a
    /// reset), seconds.
    pub tcp_closing_timeout: u64,
    /// Seconds between two garbage collections of the NAT table.
    pub gc_interval: u64,
    /// Capacity of the NAT table (entries; a masqueraded flow takes two, a
    /// hostPort connection one).
    pub max_entries: u32,
    /// Masqueraded flows one pod may hold at a time (0: no limit); default
    /// [`default_nat_max_per_pod`] of `max_entries`.
    pub max_per_pod: u32,
}

/// The default per-pod NAT quota for a table of `max_entries` entries: a
/// quarter of its flows (a flow takes two entries), so one pod can never
/// push the others' flows out of the LRU table — it takes four pods at
/// their quota to fill it.
pub const fn default_nat_max_per_pod(max_entries: u32) -> u32 {
    let q = max_entries / 8;
    if q == 0 { 1 } else { q }
}

/// Budget of IPv4 fragments each pod may send to the node's stack (the
/// node's reassembly memory, `ipfrag_high_thresh` = 4 MiB, is shared by
/// every pod; a fragment waits there up to `ipfrag_time` = 30 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FragBudget {
    /// Refill rate, bytes per second (0: no budget). A fragment costs its
    /// frame length plus [`rivet_common::FRAG_COST_OVERHEAD`].
    pub rate: u64,
    /// Bucket depth, bytes (what a pod may send at once).
    pub burst: u64,
}

/// Default fragment budget refill: 32 KiB/s.
pub const DEFAULT_FRAG_BUDGET_RATE: u64 = 32 * 1024;
/// Default fragment budget depth: 256 KiB. With the rate, one pod holds at
/// most 256 KiB + 30 s × 32 KiB/s = 1,216 KiB of the node's 4 MiB
/// reassembly memory (29 %), however it floods.
pub const DEFAULT_FRAG_BUDGET_BURST: u64 = 256 * 1024;
/// Smallest burst: a fragment costing more than the burst never passes,
/// and the largest (a 65,535-byte datagram in one frame) costs 66,573.
pub const MIN_FRAG_BUDGET_BURST: u64 = 68 * 1024;
const _: () = assert!(65_535 + 14 + rivet_common::FRAG_COST_OVERHEAD <= MIN_FRAG_BUDGET_BURST);

impl Default for FragBudget {
    fn default() -> Self {
        Self {
            rate: DEFAULT_FRAG_BUDGET_RATE,
            burst: DEFAULT_FRAG_BUDGET_BURST,
        }
    }
}

impl FragBudget {
    /// The `TUNABLES` entries the datapath reads.
    pub fn tunables(&self) -> [(u32, u64); 2] {
        [
            (rivet_common::tunable::FRAG_RATE, self.rate),
            (rivet_common::tunable::FRAG_BURST, self.burst),
        ]
    }
}

fn frag_budget(file: &FileConfig) -> Result<FragBudget, ConfigError> {
    let rate = match file.frag_budget_rate.unwrap_or(DEFAULT_FRAG_BUDGET_RATE) {
        r @ (0 | 1024..=1_073_741_824) => r,
        r => {
            return Err(invalid(
                "frag_budget_rate",
                r,
                "must be 0 (no budget) or 1024..=1073741824 bytes per second",
            ));
        }
    };
    let burst = match file.frag_budget_burst.unwrap_or(DEFAULT_FRAG_BUDGET_BURST) {
        b @ MIN_FRAG_BUDGET_BURST..=1_073_741_824 => b,
        b => {
            return Err(invalid(
                "frag_budget_burst",
                b,
                format!(
                    "must be {MIN_FRAG_BUDGET_BURST}..=1073741824 bytes (the largest fragment must fit)"
                ),
            ));
        }
    };
    Ok(FragBudget { rate, burst })
}

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
}

impl Mode {
    /// Bytes the worst-case path adds to a pod packet (pod MTU = uplink − this).
    pub const fn overhead(self) -> u32 {
        match self {
            Mode::Vxlan | Mode::Hybrid => rivet_common::VXLAN_OVERHEAD,
            Mode::Ipip => rivet_common::IPIP_OVERHEAD,
            Mode::Native => 0,
        }
    }

    /// Name as in the configuration.
    pub const fn as_str(self) -> &'static str {
        match self {
            Mode::Vxlan => "vxlan",
            Mode::Ipip => "ipip",
            Mode::Native => "native",
            Mode::Hybrid => "hybrid",
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
            other => Err(format!(
                "{other:?} is not a mode (vxlan, ipip, native, hybrid)"
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

/// The TOML file. Every key is optional; see [`AgentConfig`] for defaults.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct FileConfig {
    /// Node name; names the pin directory.
    pub node_name: Option<String>,
    /// Pod CIDR of this node.
    pub pod_cidr: Option<String>,
    /// Pods' gateway address.
    pub gateway: Option<Ipv4Addr>,
    /// Uplink interface (the node's own NIC in its namespace).
    pub uplink: Option<String>,
    /// Pod interface MTU (default: the uplink's MTU, else 1500).
    pub mtu: Option<u32>,
    /// Network namespace to run in (a name under /run/netns or a path).
    pub netns: Option<String>,
    /// bpffs mount point.
    pub bpffs: Option<PathBuf>,
    /// Pin directory (default `<bpffs>/rivet/<node_name>`).
    pub pin_dir: Option<PathBuf>,
    /// State directory (default `/var/lib/rivet/<node_name>`).
    pub state_dir: Option<PathBuf>,
    /// API socket (default /run/rivet/rivetd.sock).
    pub socket: Option<PathBuf>,
    /// Prometheus metrics and health endpoints, `address:port` in the
    /// node's namespace (default 127.0.0.1:9402; "off" disables).
    pub metrics_addr: Option<String>,
    /// How programs attach to pod veths: `tc` (default) or `tcx`.
    pub pod_attach: Option<AttachMode>,
    /// Cross-node mode.
    pub mode: Option<Mode>,
    /// Cluster CIDR.
    pub cluster_cidr: Option<String>,
    /// VXLAN network identifier.
    pub vni: Option<u32>,
    /// VXLAN UDP port.
    pub vxlan_port: Option<u16>,
    /// etcd endpoints (cluster mode); empty = single node.
    pub etcd_endpoints: Option<Vec<String>>,
    /// etcd key prefix.
    pub etcd_prefix: Option<String>,
    /// Lifetime of the node's registration in etcd, seconds (kept alive).
    pub etcd_lease_ttl: Option<u64>,
    /// Masquerade pod traffic leaving the cluster (default true).
    pub masquerade: Option<bool>,
    /// Source ports for masqueraded flows, `"first-last"`.
    pub nat_port_range: Option<String>,
    /// More destinations (CIDRs) that keep the pod's address.
    pub no_masquerade: Option<Vec<String>>,
    /// Idle timeout of established TCP flows through NAT, seconds.
    pub nat_tcp_timeout: Option<u64>,
    /// Idle timeout of UDP flows through NAT, seconds.
    pub nat_udp_timeout: Option<u64>,
    /// How long an ended TCP flow stays in the NAT table, seconds.
    pub nat_tcp_closing_timeout: Option<u64>,
    /// Seconds between NAT table garbage collections.
    pub nat_gc_interval: Option<u64>,
    /// Capacity of the NAT table, entries.
    pub nat_max_entries: Option<u32>,
    /// Masqueraded flows one pod may hold at a time (0: no limit).
    pub nat_max_per_pod: Option<u32>,
    /// Fragments to the node's stack: each pod's budget refill, bytes per
    /// second (0: no budget).
    pub frag_budget_rate: Option<u64>,
    /// Fragments to the node's stack: each pod's burst, bytes.
    pub frag_budget_burst: Option<u64>,
    /// Capacity of the endpoints map (pods on this node).
    pub max_endpoints: Option<u32>,
    /// Capacity of the routes and peers maps (remote nodes).
    pub max_routes: Option<u32>,
    /// Capacity of the hostPort map (mappings on this node).
    pub max_hostports: Option<u32>,
    /// Group allowed to use the API socket (mode 0660); default none (0600,
    /// root only).
    pub socket_group: Option<String>,
    /// Load the programs from this eBPF object file instead of the one
    /// built into rivetd: a rebuilt datapath (a hotfix) rolled out without
    /// a new rivetd. It must define the maps exactly as rivetd does.
    pub ebpf_object: Option<PathBuf>,
}

impl FileConfig {
    /// Reads and parses a TOML file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml(&text).map_err(|message| ConfigError::Parse {
            path: path.to_owned(),
            message,
        })
    }

    /// Parses TOML text. The error is one line: where, what, and the
    /// offending line's text (which names the key).
    pub fn from_toml(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| {
            let Some(span) = e.span() else {
                return e.message().to_owned();
            };
            let line_no = text[..span.start.min(text.len())].matches('\n').count() + 1;
            let line = text.lines().nth(line_no - 1).unwrap_or_default().trim();
            format!("line {line_no}: {} (in `{line}`)", e.message())
        })
    }

    /// Values set in `other` win.
    pub fn merge(self, other: FileConfig) -> FileConfig {
        FileConfig {
            node_name: other.node_name.or(self.node_name),
            pod_cidr: other.pod_cidr.or(self.pod_cidr),
            gateway: other.gateway.or(self.gateway),
            uplink: other.uplink.or(self.uplink),
            mtu: other.mtu.or(self.mtu),
            netns: other.netns.or(self.netns),
            bpffs: other.bpffs.or(self.bpffs),
            pin_dir: other.pin_dir.or(self.pin_dir),
            state_dir: other.state_dir.or(self.state_dir),
            socket: other.socket.or(self.socket),
            metrics_addr: other.metrics_addr.or(self.metrics_addr),
            pod_attach: other.pod_attach.or(self.pod_attach),
            mode: other.mode.or(self.mode),
            cluster_cidr: other.cluster_cidr.or(self.cluster_cidr),
            vni: other.vni.or(self.vni),
            vxlan_port: other.vxlan_port.or(self.vxlan_port),
            etcd_endpoints: other.etcd_endpoints.or(self.etcd_endpoints),
            etcd_prefix: other.etcd_prefix.or(self.etcd_prefix),
            etcd_lease_ttl: other.etcd_lease_ttl.or(self.etcd_lease_ttl),
            masquerade: other.masquerade.or(self.masquerade),
            nat_port_range: other.nat_port_range.or(self.nat_port_range),
            no_masquerade: other.no_masquerade.or(self.no_masquerade),
            nat_tcp_timeout: other.nat_tcp_timeout.or(self.nat_tcp_timeout),
            nat_udp_timeout: other.nat_udp_timeout.or(self.nat_udp_timeout),
            nat_tcp_closing_timeout: other
                .nat_tcp_closing_timeout
                .or(self.nat_tcp_closing_timeout),
            nat_gc_interval: other.nat_gc_interval.or(self.nat_gc_interval),
            nat_max_entries: other.nat_max_entries.or(self.nat_max_entries),
            nat_max_per_pod: other.nat_max_per_pod.or(self.nat_max_per_pod),
            frag_budget_rate: other.frag_budget_rate.or(self.frag_budget_rate),
            frag_budget_burst: other.frag_budget_burst.or(self.frag_budget_burst),
            max_endpoints: other.max_endpoints.or(self.max_endpoints),
            max_routes: other.max_routes.or(self.max_routes),
            max_hostports: other.max_hostports.or(self.max_hostports),
            socket_group: other.socket_group.or(self.socket_group),
            ebpf_object: other.ebpf_object.or(self.ebpf_object),
        }
    }
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
    /// etcd settings; `None` = single node (routes only through the API).
    pub etcd: Option<EtcdSettings>,
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
    /// Test hook: make endpoint ADD fail at this step (from the environment
    /// variable `RIVET_FAIL_ADD_AT`; never set in production).
    pub fail_add_at: Option<String>,
}

fn nat_settings(file: &FileConfig, cluster_cidr: Ipv4Net) -> Result<NatSettings, ConfigError> {
    let (port_min, port_max) = match &file.nat_port_range {
        None => DEFAULT_NAT_PORT_RANGE,
        Some(text) => {
            let bad = || {
                invalid(
                    "nat_port_range",
                    text,
                    "use \"first-last\" with 1024 ≤ first ≤ last ≤ 65535",
                )
            };
            let (a, b) = text.split_once('-').ok_or_else(bad)?;
            let (a, b): (u16, u16) = (
                a.trim().parse().map_err(|_| bad())?,
                b.trim().parse().map_err(|_| bad())?,
            );
            if a < 1024 || a > b {
                return Err(bad());
            }
            (a, b)
        }
    };
    let mut no_masquerade = vec![cluster_cidr];
    for text in ALWAYS_NO_MASQUERADE
        .iter()
        .map(|s| (*s).to_owned())
        .chain(file.no_masquerade.clone().unwrap_or_default())
    {
        let net: Ipv4Net = text
            .parse()
            .map_err(|_| invalid("no_masquerade", &text, "not an IPv4 CIDR"))?;
        no_masquerade.push(net.trunc());
    }
    let seconds = |key: &'static str, v: Option<u64>, default: u64| match v.unwrap_or(default) {
        s @ 1..=604_800 => Ok(s),
        s => Err(invalid(key, s, "must be 1..=604800 seconds")),
    };
    let max_entries = match file.nat_max_entries.unwrap_or(rivet_common::NAT_MAX) {
        n @ 16..=16_777_216 => n,
        n => return Err(invalid("nat_max_entries", n, "must be 16..=16777216")),
    };
    let max_per_pod = match file.nat_max_per_pod {
        None => default_nat_max_per_pod(max_entries),
        Some(n) if n <= max_entries / 2 => n,
        Some(n) => {
            return Err(invalid(
                "nat_max_per_pod",
                n,
                format!(
                    "must be 0 (no limit) ..= nat_max_entries / 2 = {} flows",
                    max_entries / 2
                ),
            ));
        }
    };
    Ok(NatSettings {
        masquerade: file.masquerade.unwrap_or(true),
        port_min,
        port_max,
        no_masquerade,
        tcp_timeout: seconds("nat_tcp_timeout", file.nat_tcp_timeout, 3600)?,
        udp_timeout: seconds("nat_udp_timeout", file.nat_udp_timeout, 60)?,
        tcp_closing_timeout: seconds("nat_tcp_closing_timeout", file.nat_tcp_closing_timeout, 10)?,
        gc_interval: seconds("nat_gc_interval", file.nat_gc_interval, 10)?,
        max_entries,
        max_per_pod,
    })
}

/// How programs are attached to pod veths.
///
/// - `Tcx`: a TCX link per veth, pinned under `links/`. Each first attach
///   costs the kernel an RCU grace period while holding RTNL
///   (`tcx_entry_sync()` → `synchronize_rcu()`), measured at 10–20 ms here,
///   which serializes concurrent pod creation.
/// - `Tc`: a `clsact` qdisc and a direct-action `cls_bpf` filter at fixed
///   priority/handle, attached over netlink in well under a millisecond. The
///   filter belongs to the device, not to a process: it survives agent
///   restarts without a pin and is replaced atomically (`tc filter replace`).
///
/// The uplink always uses TCX (attached once per node).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttachMode {
    /// Netlink `cls_bpf` on `clsact` (default: fast pod creation).
    #[default]
    Tc,
    /// TCX links pinned in bpffs.
    Tcx,
}

impl std::str::FromStr for AttachMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "tc" => Ok(Self::Tc),
            "tcx" => Ok(Self::Tcx),
            other => Err(format!("{other:?} is not an attach mode (tc or tcx)")),
        }
    }
}

/// Where the programs come from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ObjectSource {
    /// The object built into this binary ([`OBJECT`](crate::datapath::OBJECT)).
    #[default]
    Embedded,
    /// A file (`rivetd --ebpf-object`): a rebuilt datapath without a new
    /// rivetd. It must define the maps exactly as this build does.
    File(PathBuf),
}

/// ADD steps where a test can inject a failure (`RIVET_FAIL_ADD_AT=<step>`).
pub const FAULT_STEPS: [&str; 6] = [
    "after_reserve",
    "after_veth",
    "after_pod_side",
    "after_host_side",
    "after_map",
    "after_attach",
];

/// Where the agent serves metrics unless told otherwise.
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9402";

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
    /// Applies defaults and validates.
    pub fn resolve(file: FileConfig) -> Result<Self, ConfigError> {
        let nat_keys = file.clone();
        let node_name = match file.node_name {
            Some(n) => n,
            None => nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_else(|| "node".to_owned()),
        };
        if node_name.is_empty()
            || node_name.len() > 63
            || !node_name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
            || node_name.starts_with('.')
        {
            return Err(invalid(
                "node_name",
                &node_name,
                "use 1-63 characters from [A-Za-z0-9._-], not starting with '.'",
            ));
        }

        let cidr_text = file.pod_cidr.unwrap_or_else(|| DEFAULT_POD_CIDR.to_owned());
        let pod_cidr: Ipv4Net = cidr_text.parse().map_err(|_| {
            invalid(
                "pod_cidr",
                &cidr_text,
                "not an IPv4 CIDR like 10.244.1.0/24",
            )
        })?;
        if pod_cidr.network() != pod_cidr.addr() {
            return Err(invalid(
                "pod_cidr",
                &cidr_text,
                format!("host bits set; did you mean {}?", pod_cidr.trunc()),
            ));
        }
        if pod_cidr.prefix_len() > 30 || pod_cidr.prefix_len() < 8 {
            return Err(invalid(
                "pod_cidr",
                &cidr_text,
                "prefix length must be 8..=30",
            ));
        }

        let gateway = file.gateway.unwrap_or(DEFAULT_GATEWAY);
        if pod_cidr.contains(&gateway) {
            return Err(invalid(
                "gateway",
                gateway,
                format!("must be outside the pod CIDR {pod_cidr}"),
            ));
        }
        if gateway.is_unspecified() || gateway.is_broadcast() || gateway.is_multicast() {
            return Err(invalid("gateway", gateway, "must be a unicast address"));
        }

        if let Some(uplink) = &file.uplink {
            validate_ifname(uplink).map_err(|r| invalid("uplink", uplink, r))?;
        }
        if let Some(mtu) = file.mtu
            && !(576..=65_535).contains(&mtu)
        {
            return Err(invalid("mtu", mtu, "must be 576..=65535"));
        }

        let netns = match file.netns {
            None => None,
            Some(n) if n.is_empty() => return Err(invalid("netns", n, "empty")),
            Some(n) if n.contains('/') => Some(absolute("netns", PathBuf::from(n))?),
            Some(n) => Some(PathBuf::from("/run/netns").join(n)),
        };

        let bpffs = absolute(
            "bpffs",
            file.bpffs.unwrap_or_else(|| PathBuf::from(DEFAULT_BPFFS)),
        )?;
        let pin_dir = match file.pin_dir {
            Some(p) => absolute("pin_dir", p)?,
            None => bpffs.join("rivet").join(&node_name),
        };
        if !pin_dir.starts_with(&bpffs) || pin_dir == bpffs {
            return Err(invalid(
                "pin_dir",
                pin_dir.display(),
                format!("must be a directory below the bpffs {}", bpffs.display()),
            ));
        }
        let state_dir = match file.state_dir {
            Some(p) => absolute("state_dir", p)?,
            None => PathBuf::from("/var/lib/rivet").join(&node_name),
        };
        let socket = absolute(
            "socket",
            file.socket
                .unwrap_or_else(|| PathBuf::from(rivet_api::DEFAULT_SOCKET)),
        )?;
        // sun_path is 108 bytes including the terminating NUL.
        if socket.as_os_str().len() > 107 {
            return Err(invalid(
                "socket",
                socket.display(),
                "unix socket paths are at most 107 bytes",
            ));
        }

        let metrics_addr =
            match file.metrics_addr.as_deref().unwrap_or(DEFAULT_METRICS_ADDR) {
                "off" => None,
                text => Some(text.parse().map_err(|_| {
                    invalid("metrics_addr", text, "must be address:port or \"off\"")
                })?),
            };

        let cluster_text = file
            .cluster_cidr
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
        let nat = nat_settings(&nat_keys, cluster_cidr)?;
        let frag_budget = frag_budget(&nat_keys)?;
        let etcd = match file.etcd_endpoints {
            Some(eps) if !eps.is_empty() => {
                for ep in &eps {
                    if !(ep.starts_with("http://") || ep.starts_with("https://")) {
                        return Err(invalid("etcd_endpoints", ep, "use http://host:port"));
                    }
                }
                let prefix = file
                    .etcd_prefix
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
                Some(EtcdSettings {
                    endpoints: eps,
                    prefix,
                    lease_ttl,
                })
            }
            _ => None,
        };
        if etcd.is_none() && !cluster_cidr.contains(&pod_cidr) {
            return Err(invalid(
                "pod_cidr",
                &cidr_text,
                format!("must be inside the cluster CIDR {cluster_cidr}"),
            ));
        }
        if cluster_cidr.contains(&gateway) {
            return Err(invalid(
                "gateway",
                gateway,
                format!("must be outside the cluster CIDR {cluster_cidr}"),
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

        let fail_add_at = std::env::var("RIVET_FAIL_ADD_AT")
            .ok()
            .filter(|s| !s.is_empty());
        if let Some(step) = &fail_add_at
            && !FAULT_STEPS.contains(&step.as_str())
        {
            return Err(invalid(
                "RIVET_FAIL_ADD_AT",
                step,
                format!("one of {:?}", FAULT_STEPS),
            ));
        }
        let size = |key: &'static str, v: Option<u32>, default: u32, max: u32| match v {
            None => Ok(default),
            Some(n) if (16..=max).contains(&n) => Ok(n),
            Some(n) => Err(invalid(key, n, format!("must be 16..={max}"))),
        };
        let defaults = MapLimits::default();
        let limits = MapLimits {
            endpoints: size(
                "max_endpoints",
                file.max_endpoints,
                defaults.endpoints,
                1 << 20,
            )?,
            routes: size("max_routes", file.max_routes, defaults.routes, 1 << 20)?,
            hostports: size(
                "max_hostports",
                file.max_hostports,
                defaults.hostports,
                1 << 20,
            )?,
            nat: nat.max_entries,
        };
        let socket_group = match file.socket_group {
            Some(g) if g.is_empty() || g.len() > 32 || g.contains(['/', ':', '\n']) => {
                return Err(invalid("socket_group", g, "not a group name"));
            }
            other => other,
        };
        Ok(Self {
            node_name,
            pod_cidr,
            gateway,
            uplink: file.uplink,
            mtu: file.mtu,
            netns,
            bpffs,
            pin_dir,
            state_dir,
            socket,
            metrics_addr,
            pod_attach: file.pod_attach.unwrap_or_default(),
            mode: file.mode.unwrap_or_default(),
            cluster_cidr,
            vni,
            vxlan_port,
            etcd,
            nat,
            limits,
            frag_budget,
            socket_group,
            ebpf_object: file
                .ebpf_object
                .map_or(ObjectSource::Embedded, ObjectSource::File),
            fail_add_at,
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
        assert_eq!(c.nat.max_per_pod, rivet_common::NAT_MAX / 8);
        let c = resolve("node_name = \"n1\"\nnat_max_entries = 4096").expect("valid");
        assert_eq!(c.nat.max_per_pod, 512, "a quarter of the table's flows");
        let c = resolve("node_name = \"n1\"\nnat_max_per_pod = 0").expect("valid");
        assert_eq!(c.nat.max_per_pod, 0, "no limit");
        assert_eq!(c.frag_budget, FragBudget::default());
        let c = resolve("node_name = \"n1\"\nfrag_budget_rate = 0").expect("valid");
        assert_eq!(c.frag_budget.rate, 0, "no budget");
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
        ] {
            let err = resolve(toml).expect_err(toml).to_string();
            assert!(err.contains(key), "{toml}: {err}");
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
    fn flags_override_file() {
        let file = FileConfig::from_toml("node_name = \"a\"\nmtu = 1400").expect("valid");
        let flags = FileConfig {
            node_name: Some("b".into()),
            ..Default::default()
        };
        let merged = file.merge(flags);
        assert_eq!(merged.node_name.as_deref(), Some("b"));
        assert_eq!(merged.mtu, Some(1400));
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
