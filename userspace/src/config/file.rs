//! The agent's knobs, defined once: each field of [`FileConfig`] is a key
//! of the TOML file and a flag of `rivetd` (`pod_cidr` = `--pod-cidr`).
//! Both are optional field by field; flags win over the file.

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use serde::Deserialize;

use super::{AttachMode, ConfigError, Mode};

/// Every knob of the agent, as written in the TOML file and on the command
/// line. Every one is optional; [`AgentConfig::resolve`] applies the
/// defaults and validates ([`AgentConfig`] documents them).
///
/// [`AgentConfig`]: super::AgentConfig
/// [`AgentConfig::resolve`]: super::AgentConfig::resolve
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize, clap::Args)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
// The text above documents the type, not a command.
#[command(about = None, long_about = None)]
pub struct FileConfig {
    // --- the node
    /// Node name: names the pin and state directories (default: the host
    /// name).
    #[arg(long, help_heading = "Node")]
    pub node_name: Option<String>,
    /// Pod CIDR of this node (default 10.244.0.0/24; with etcd the lease
    /// decides).
    #[arg(long, help_heading = "Node")]
    pub pod_cidr: Option<String>,
    /// Pods' gateway address, answered for in BPF (default 169.254.1.1).
    #[arg(long, help_heading = "Node")]
    pub gateway: Option<Ipv4Addr>,
    /// Uplink interface (the node's own NIC in its namespace).
    #[arg(long, help_heading = "Node")]
    pub uplink: Option<String>,
    /// Pod interface MTU (default: the uplink's minus the tunnel overhead,
    /// else 1500).
    #[arg(long, help_heading = "Node")]
    pub mtu: Option<u32>,
    /// Network namespace to run in (a name under /run/netns, or a path).
    #[arg(long, help_heading = "Node")]
    pub netns: Option<String>,

    // --- where state lives, the API and metrics
    /// bpffs mount point (default /sys/fs/bpf).
    #[arg(long, help_heading = "State and API")]
    pub bpffs: Option<PathBuf>,
    /// Pin directory (default <bpffs>/rivet/<node_name>).
    #[arg(long, help_heading = "State and API")]
    pub pin_dir: Option<PathBuf>,
    /// State directory (default /var/lib/rivet/<node_name>).
    #[arg(long, help_heading = "State and API")]
    pub state_dir: Option<PathBuf>,
    /// API socket (default /run/rivet/rivetd.sock).
    #[arg(long, help_heading = "State and API")]
    pub socket: Option<PathBuf>,
    /// Group allowed to use the API socket (mode 0660); default none (0600,
    /// root only).
    #[arg(long, help_heading = "State and API")]
    pub socket_group: Option<String>,
    /// Prometheus metrics and health endpoints, address:port in the node's
    /// namespace (default 127.0.0.1:9402; "off" disables).
    #[arg(long, help_heading = "State and API")]
    pub metrics_addr: Option<String>,

    // --- the datapath
    /// How programs attach to pod veths: tc (netlink cls_bpf, default) or
    /// tcx.
    #[arg(long, help_heading = "Datapath")]
    pub pod_attach: Option<AttachMode>,
    /// Load the programs from this eBPF object file instead of the one
    /// built into rivetd: a rebuilt datapath (a hotfix) rolled out without
    /// a new rivetd. The running programs are swapped atomically; the
    /// object must define the maps exactly as this rivetd does, else rivetd
    /// refuses to start.
    #[arg(long, help_heading = "Datapath")]
    pub ebpf_object: Option<PathBuf>,

    // --- cross-node
    /// Cross-node mode: vxlan (default), ipip, native, hybrid, bgp.
    #[arg(long, help_heading = "Cross-node")]
    pub mode: Option<Mode>,
    /// Cluster CIDR: all nodes' pod CIDRs (default 10.244.0.0/16).
    #[arg(long, help_heading = "Cross-node")]
    pub cluster_cidr: Option<String>,
    /// VXLAN network identifier (default 1).
    #[arg(long, help_heading = "Cross-node")]
    pub vni: Option<u32>,
    /// VXLAN UDP port (default 8472).
    #[arg(long, help_heading = "Cross-node")]
    pub vxlan_port: Option<u16>,
    /// Where the cluster's nodes and objects come from: `standalone`,
    /// `etcd` (flannel's etcd schema) or `kubernetes` (the API server:
    /// Node objects, Services, EndpointSlices, Pods, Namespaces,
    /// NetworkPolicies). Default: `etcd` with `etcd_endpoints`, else
    /// `kubernetes` inside a pod (`KUBERNETES_SERVICE_HOST` set), else
    /// `standalone`.
    #[arg(long, help_heading = "Cross-node")]
    pub source: Option<String>,
    /// kubeconfig file for the `kubernetes` source when rivetd does not
    /// run in a pod (default: the pod's service account).
    #[arg(long, help_heading = "Cross-node")]
    pub kubeconfig: Option<PathBuf>,
    /// etcd endpoints, comma-separated on the command line (cluster mode);
    /// none = a single node.
    #[arg(long, value_delimiter = ',', help_heading = "Cross-node")]
    pub etcd_endpoints: Option<Vec<String>>,
    /// etcd key prefix (default /rivet.io/network).
    #[arg(long, help_heading = "Cross-node")]
    pub etcd_prefix: Option<String>,
    /// Lifetime of the node's registration in etcd, seconds (kept alive;
    /// default 10).
    #[arg(long, help_heading = "Cross-node")]
    pub etcd_lease_ttl: Option<u64>,

    // --- NAT
    /// Masquerade pod traffic leaving the cluster (default true).
    #[arg(long, help_heading = "NAT")]
    pub masquerade: Option<bool>,
    /// Source ports of masqueraded flows, "first-last" (default
    /// 61000-65535).
    #[arg(long, help_heading = "NAT")]
    pub nat_port_range: Option<String>,
    /// More destinations (CIDRs) that keep the pod's address,
    /// comma-separated on the command line.
    #[arg(long, value_delimiter = ',', help_heading = "NAT")]
    pub no_masquerade: Option<Vec<String>>,
    /// Idle timeout of established TCP flows through NAT, seconds (default
    /// 3600).
    #[arg(long, help_heading = "NAT")]
    pub nat_tcp_timeout: Option<u64>,
    /// Idle timeout of UDP flows through NAT, seconds (default 60).
    #[arg(long, help_heading = "NAT")]
    pub nat_udp_timeout: Option<u64>,
    /// How long an ended TCP flow stays in the NAT table, seconds (default
    /// 10).
    #[arg(long, help_heading = "NAT")]
    pub nat_tcp_closing_timeout: Option<u64>,
    /// Seconds between NAT table garbage collections (default 10).
    #[arg(long, help_heading = "NAT")]
    pub nat_gc_interval: Option<u64>,
    /// Capacity of the NAT table, entries (default 131072; LRU with a list
    /// per CPU: each CPU recycles only the entries it created).
    #[arg(long, help_heading = "NAT")]
    pub nat_max_entries: Option<u32>,
    /// Masqueraded flows one pod may hold at a time, 0 = no limit (default
    /// nat_max_entries / 4 / possible CPUs, at most nat_max_entries / 8).
    #[arg(long, help_heading = "NAT")]
    pub nat_max_per_pod: Option<u32>,

    // --- fragments to the node's stack
    /// Fragments to the node's stack: each pod's budget refill, bytes per
    /// second, 0 = no budget (default 32768).
    #[arg(long, help_heading = "Fragments")]
    pub frag_budget_rate: Option<u64>,
    /// Fragments to the node's stack: each pod's burst, bytes (default
    /// 262144).
    #[arg(long, help_heading = "Fragments")]
    pub frag_budget_burst: Option<u64>,

    // --- map capacities
    /// Capacity of the endpoints map, pods on this node (default 16384).
    #[arg(long, help_heading = "Map capacities")]
    pub max_endpoints: Option<u32>,
    /// Capacity of the routes and peers maps, remote nodes (default 4096).
    #[arg(long, help_heading = "Map capacities")]
    pub max_routes: Option<u32>,
    /// Capacity of the hostPort map, mappings on this node (default 16384).
    #[arg(long, help_heading = "Map capacities")]
    pub max_hostports: Option<u32>,
    /// Capacity of the Service frontend map: Service ports × their
    /// frontends (ClusterIP, NodePort, external and load-balancer IPs) and
    /// scopes; also the number of Service port ids (default 65536).
    #[arg(long, help_heading = "Map capacities")]
    pub max_services: Option<u32>,
    /// Capacity of the Service backend map: backends summed over every
    /// frontend group, with room for a group being replaced (default 262144).
    #[arg(long, help_heading = "Map capacities")]
    pub max_service_backends: Option<u32>,
    /// Capacity of the NetworkPolicy maps: allowed peer prefixes summed
    /// over every policed pod, direction and port class, and port-class
    /// prefixes (two maps of this size; default 262144).
    #[arg(long, help_heading = "Map capacities")]
    pub max_policy_entries: Option<u32>,
    /// Capacity of the flow table that lets replies through policy (LRU
    /// with a list per CPU: a CPU's full share forgets its least recently
    /// used flows; default 262144).
    #[arg(long, help_heading = "Map capacities")]
    pub max_policy_flows: Option<u32>,

    // --- BGP (mode = "bgp")
    /// This node's AS number (default 64512; every node of a mesh or of
    /// a reflector cluster shares it: iBGP).
    #[arg(long, help_heading = "BGP")]
    pub bgp_as: Option<u32>,
    /// Peer with every other node of the cluster (node-to-node mesh;
    /// default true, false when `bgp_reflectors` is set).
    #[arg(long, help_heading = "BGP")]
    pub bgp_mesh: Option<bool>,
    /// Route reflectors this node peers with instead of the mesh
    /// (addresses, comma-separated on the command line).
    #[arg(long, value_delimiter = ',', help_heading = "BGP")]
    pub bgp_reflectors: Option<Vec<Ipv4Addr>>,
    /// Makes this node a route reflector with this cluster ID (Calico's
    /// `routeReflectorClusterID`): every other node of the cluster is its
    /// client, other reflectors are its non-client peers.
    #[arg(long, help_heading = "BGP")]
    pub bgp_reflector_cluster_id: Option<Ipv4Addr>,
    /// External peers (top-of-rack routers), `ADDRESS:AS` or
    /// `ADDRESS:AS:PASSWORD`; eBGP when AS differs from `bgp_as`, else
    /// iBGP (comma-separated on the command line).
    #[arg(long, value_delimiter = ',', help_heading = "BGP")]
    pub bgp_peers: Option<Vec<String>>,
    /// TCP MD5 password of the sessions with other nodes (mesh and
    /// reflectors); default none.
    #[arg(long, help_heading = "BGP")]
    pub bgp_password: Option<String>,
    /// Hold time of every session, seconds (default 30; keepalives every
    /// third of it): a stopped node's routes are withdrawn after it.
    #[arg(long, help_heading = "BGP")]
    pub bgp_hold_time: Option<u16>,
    /// Graceful restart time, seconds (default 120; 0 = off): how long
    /// peers keep this node's routes while its speaker restarts.
    #[arg(long, help_heading = "BGP")]
    pub bgp_graceful_restart: Option<u16>,
    /// Tunnel to a next hop outside the uplink's subnet: none (default:
    /// routed natively through the uplink's gateway), vxlan or ipip
    /// (Calico's CrossSubnet).
    #[arg(long, help_heading = "BGP")]
    pub bgp_cross_subnet: Option<String>,
    /// More prefixes to announce besides the pod CIDR (a Service CIDR,
    /// external IPs), comma-separated on the command line.
    #[arg(long, value_delimiter = ',', help_heading = "BGP")]
    pub bgp_advertise: Option<Vec<String>>,
    /// Damp flapping routes (default true): a prefix withdrawn and
    /// announced again too often is held out of the datapath until it
    /// calms down.
    #[arg(long, help_heading = "BGP")]
    pub bgp_damping: Option<bool>,
    /// The BGP speaker, BIRD 2 (default /usr/sbin/bird).
    #[arg(long, help_heading = "BGP")]
    pub bgp_speaker: Option<PathBuf>,
    /// Kernel routing table the speaker writes learned routes into for
    /// the agent (default 4242; never used for forwarding).
    #[arg(long, help_heading = "BGP")]
    pub bgp_table: Option<u32>,
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

    /// The flags given in `matches` over the values of `self`: each flag
    /// given replaces its key, the others stay. `matches` comes from a
    /// command that has the knobs as flags (`FileConfig::augment_args`, as
    /// rivetd builds its command line).
    pub fn with_flags(mut self, matches: &clap::ArgMatches) -> Result<Self, ConfigError> {
        clap::FromArgMatches::update_from_arg_matches(&mut self, matches)
            .map_err(|e| ConfigError::Flags(e.to_string().trim().to_owned()))?;
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use clap::Args as _;

    use super::*;

    /// The keys, in definition order (each is also the flag `--<key with
    /// '-' for '_'>`), from clap's view of the knobs.
    fn keys() -> Vec<String> {
        FileConfig::augment_args(clap::Command::new("keys"))
            .get_arguments()
            .map(|a| a.get_id().as_str().to_owned())
            .collect()
    }

    fn flags(args: &[&str]) -> clap::ArgMatches {
        FileConfig::augment_args(clap::Command::new("rivetd"))
            .try_get_matches_from(std::iter::once("rivetd").chain(args.iter().copied()))
            .expect("valid flags")
    }

    #[test]
    fn flags_override_the_file_key_by_key() {
        let file = FileConfig::from_toml("node_name = \"a\"\nmtu = 1400\nvni = 7").expect("valid");
        let merged = file
            .with_flags(&flags(&[
                "--node-name",
                "b",
                "--etcd-endpoints",
                "http://x:1,http://y:2",
                "--vni",
                "9",
            ]))
            .expect("merged");
        assert_eq!(merged.node_name.as_deref(), Some("b"));
        assert_eq!(merged.mtu, Some(1400), "the file's value stays");
        assert_eq!(merged.vni, Some(9));
        assert_eq!(
            merged.etcd_endpoints,
            Some(vec!["http://x:1".to_owned(), "http://y:2".to_owned()])
        );
        let none = FileConfig::from_toml("mtu = 1400")
            .expect("valid")
            .with_flags(&flags(&[]))
            .expect("merged");
        assert_eq!(none, FileConfig::from_toml("mtu = 1400").expect("valid"));
    }

    #[test]
    fn bad_flags_name_the_flag() {
        for args in [
            ["--vni", "x"],
            ["--mode", "gre"],
            ["--pod-attach", "bpf"],
            ["--gateway", "10.0.0"],
            ["--masquerade", "yes"],
            ["--pod-cdir", "10.0.0.0/24"],
        ] {
            let err = FileConfig::augment_args(clap::Command::new("rivetd"))
                .try_get_matches_from(std::iter::once("rivetd").chain(args))
                .expect_err(args[0])
                .to_string();
            assert!(err.contains(args[0]), "{args:?}: {err}");
        }
    }

    #[test]
    fn every_key_is_its_flag() {
        let cmd = FileConfig::augment_args(clap::Command::new("rivetd"));
        for arg in cmd.get_arguments() {
            let key = arg.get_id().as_str();
            assert_eq!(
                arg.get_long().map(|l| l.replace('-', "_")).as_deref(),
                Some(key),
                "--{key}"
            );
            assert!(!arg.is_hide_set(), "{key} is hidden");
            assert!(arg.get_help().is_some(), "{key} has no help");
        }
    }

    /// serde's list of the keys, from the unknown-key error.
    fn serde_keys() -> BTreeSet<String> {
        let err = FileConfig::from_toml("no_such_key_at_all = 1").expect_err("unknown key");
        let list = err
            .split_once("expected one of")
            .unwrap_or_else(|| panic!("no key list in {err:?}"))
            .1;
        list.split('`')
            .skip(1)
            .step_by(2)
            .filter(|k| !k.contains(' '))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn the_file_and_the_flags_have_the_same_keys() {
        let flags: BTreeSet<String> = keys().into_iter().collect();
        assert_eq!(flags.len(), keys().len(), "no key twice");
        assert_eq!(serde_keys(), flags);
    }

    /// The README's sentence "Every flag has a TOML key of the same name
    /// (`a`, `b`, ...; ...)" names every key, once, and nothing else.
    #[test]
    fn the_readme_lists_every_key() {
        const README: &str = include_str!("../../../README.md");
        const START: &str = "Every flag has a TOML key of the same name (";
        let at = README.find(START).expect("the README's key list") + START.len();
        let list = &README[at..];
        let list = &list[..list.find([';', ')']).expect("the list's end")];
        let named: Vec<&str> = list
            .split(',')
            .map(|k| k.trim().trim_matches('`'))
            .collect();
        let set: BTreeSet<&str> = named.iter().copied().collect();
        assert_eq!(
            set.len(),
            named.len(),
            "a key twice in README.md: {named:?}"
        );
        let keys = keys();
        let keys: BTreeSet<&str> = keys.iter().map(String::as_str).collect();
        assert_eq!(
            set, keys,
            "README.md \"Running the agent\" must name exactly the keys of FileConfig"
        );
    }

    /// deploy/rivet.toml: as shipped (all commented) a valid configuration;
    /// uncommented, every key once with a value the agent accepts.
    #[test]
    fn the_example_config_shows_every_key_with_a_valid_value() {
        const EXAMPLE: &str = include_str!("../../../deploy/rivet.toml");
        FileConfig::from_toml(EXAMPLE).expect("the example as shipped");
        let mut shown = Vec::new();
        let uncommented: String = EXAMPLE
            .lines()
            .filter_map(|l| {
                let line = l.strip_prefix("# ")?;
                let (key, _) = line.split_once(" = ")?;
                key.chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_')
                    .then(|| {
                        shown.push(key.to_owned());
                        format!("{line}\n")
                    })
            })
            .collect();
        let file = FileConfig::from_toml(&uncommented)
            .unwrap_or_else(|e| panic!("the example's values: {e}\n{uncommented}"));
        let mut keys = keys();
        keys.sort();
        shown.sort();
        assert_eq!(shown, keys, "every key, once, in deploy/rivet.toml");
        // The BGP keys, checked in bgp mode (the example's mode is vxlan):
        // consistent, and each the default but for examples of a choice.
        let resolve = super::super::AgentConfig::resolve;
        let bgp_of = |f: FileConfig| {
            resolve(FileConfig {
                node_name: Some("node1".into()),
                mode: Some(Mode::Bgp),
                source: None,
                kubeconfig: None,
                ..f
            })
            .expect("the example's BGP values resolve")
            .bgp
            .expect("bgp settings in bgp mode")
        };
        let shown_bgp = bgp_of(file.clone());
        assert_eq!(
            super::super::BgpSettings {
                reflectors: Vec::new(),
                cluster_id: None,
                peers: Vec::new(),
                password: None,
                advertise: Vec::new(),
                mesh: true,
                ..shown_bgp
            },
            bgp_of(FileConfig::default()),
            "deploy/rivet.toml shows a BGP value other than the default"
        );
        let file = FileConfig {
            bgp_as: None,
            bgp_mesh: None,
            bgp_reflectors: None,
            bgp_reflector_cluster_id: None,
            bgp_peers: None,
            bgp_password: None,
            bgp_hold_time: None,
            bgp_graceful_restart: None,
            bgp_cross_subnet: None,
            bgp_advertise: None,
            bgp_damping: None,
            bgp_speaker: None,
            bgp_table: None,
            ..file
        };
        // Its values are consistent too (with a node name for the host's),
        // each source's keys with its own.
        resolve(FileConfig {
            node_name: Some("node1".into()),
            source: None,
            kubeconfig: None,
            ..file.clone()
        })
        .expect("the example's values resolve (etcd)");
        resolve(FileConfig {
            node_name: Some("node1".into()),
            etcd_endpoints: None,
            etcd_prefix: None,
            etcd_lease_ttl: None,
            ..file.clone()
        })
        .expect("the example's values resolve (kubernetes)");
        // And, but for the ones that are examples of a choice, each is the
        // default ("every option, with its default").
        let examples = FileConfig {
            node_name: Some("node1".into()),
            etcd_endpoints: file.etcd_endpoints.clone(),
            ..FileConfig::default()
        };
        assert_eq!(
            resolve(FileConfig {
                uplink: None,
                mtu: None,
                netns: None,
                pin_dir: None,
                state_dir: None,
                socket_group: None,
                ebpf_object: None,
                no_masquerade: None,
                ..examples.clone()
            })
            .expect("defaults"),
            resolve(FileConfig {
                uplink: None,
                mtu: None,
                netns: None,
                pin_dir: None,
                state_dir: None,
                socket_group: None,
                ebpf_object: None,
                no_masquerade: None,
                node_name: examples.node_name,
                source: None,
                kubeconfig: None,
                ..file
            })
            .expect("the example's values"),
            "deploy/rivet.toml shows a value other than the default"
        );
    }
}
