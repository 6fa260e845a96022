//! Topologies: an underlay bridge, nodes with agents, pods, an outside host.

use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use rivet_api::{Endpoint, EndpointRef, EndpointSpec, Request, Response};
pub use rivet_common::Counter;

use crate::{
    agent::{AgentArgs, AgentProc},
    netns::Netns,
};

/// A pod: a namespace attached to a node through the agent.
#[derive(Debug)]
pub struct Pod {
    /// Pod (and container ID) name.
    pub name: String,
    /// Index of its node in [`World::nodes`].
    pub node: usize,
    /// Address.
    pub ip: Ipv4Addr,
    /// What the agent reported.
    pub endpoint: Endpoint,
    /// Its namespace (deleted on drop).
    pub ns: Netns,
}

/// A node: a namespace with an uplink on the underlay, and its agent.
#[derive(Debug)]
pub struct Node {
    /// Node name (unique per world).
    pub name: String,
    /// Uplink address.
    pub ip: Ipv4Addr,
    /// Pod CIDR, e.g. 10.60.1.0/24.
    pub pod_cidr: String,
    /// Its agent, if started.
    pub agent: Option<AgentProc>,
    /// Agent start arguments.
    pub agent_args: AgentArgs,
    /// Next pod host number.
    next_host: u8,
    /// The node namespace.
    pub ns: Netns,
}

impl Node {
    /// The running agent; panics if none.
    pub fn agent(&self) -> &AgentProc {
        self.agent.as_ref().expect("agent not started")
    }

    /// The running agent; panics if none.
    pub fn agent_mut(&mut self) -> &mut AgentProc {
        self.agent.as_mut().expect("agent not started")
    }

    /// Pin directory of the node.
    pub fn pin_dir(&self) -> PathBuf {
        self.agent_args.pin_dir()
    }

    /// The datapath counters (from the agent), looked up by [`Counter`].
    pub fn counters(&self) -> Counters {
        match self.agent().client().call(&Request::Stats {}) {
            Ok(Response::Stats { counters, .. }) => Counters::from_stats(&self.name, counters),
            other => panic!("stats from {}: {other:?}", self.name),
        }
    }
}

/// One reading of a node's datapath counters, indexed by [`Counter`]
/// (`counters[Counter::FwdLocal]` is its packets). A reading holds exactly
/// the counters this build defines: the agent's stats missing one, naming
/// one twice or naming one this build does not know fail when read, so a
/// renamed or vanished counter can never read as 0.
#[derive(Clone, PartialEq, Eq)]
pub struct Counters {
    /// Packets, in [`Counter::ALL`] order.
    packets: [u64; Counter::ALL.len()],
    /// Bytes, in [`Counter::ALL`] order.
    bytes: [u64; Counter::ALL.len()],
}

impl Counters {
    /// Checks and orders the agent's stats of node `node`.
    pub fn from_stats(node: &str, stats: Vec<rivet_api::CounterValue>) -> Self {
        let mut seen = [false; Counter::ALL.len()];
        let mut out = Self {
            packets: [0; Counter::ALL.len()],
            bytes: [0; Counter::ALL.len()],
        };
        for c in &stats {
            let i = Counter::ALL
                .iter()
                .position(|k| k.name() == c.name)
                .unwrap_or_else(|| {
                    panic!("stats from {node}: unknown counter {:?}: {stats:?}", c.name)
                });
            assert!(
                !seen[i],
                "stats from {node}: counter {:?} twice: {stats:?}",
                c.name
            );
            assert_eq!(
                c.drop,
                Counter::ALL[i].is_drop(),
                "stats from {node}: {:?} flagged drop={}",
                c.name,
                c.drop
            );
            seen[i] = true;
            out.packets[i] = c.packets;
            out.bytes[i] = c.bytes;
        }
        let missing: Vec<&str> = Counter::ALL
            .iter()
            .zip(seen)
            .filter(|(_, s)| !s)
            .map(|(c, _)| c.name())
            .collect();
        assert!(
            missing.is_empty(),
            "stats from {node}: counters missing: {missing:?}"
        );
        out
    }

    /// Position of `c` in [`Counter::ALL`].
    fn slot(c: Counter) -> usize {
        Counter::ALL
            .iter()
            .position(|k| *k == c)
            .unwrap_or_else(|| panic!("{c:?} is not in Counter::ALL"))
    }

    /// The counter named `name` (`fwd_local`, ...); panics on a name no
    /// counter has.
    pub fn named(name: &str) -> Counter {
        Counter::ALL
            .iter()
            .copied()
            .find(|c| c.name() == name)
            .unwrap_or_else(|| panic!("no datapath counter is named {name:?}"))
    }

    /// Packets counted by `c`.
    pub fn packets(&self, c: Counter) -> u64 {
        self.packets[Self::slot(c)]
    }

    /// Bytes counted by `c`.
    pub fn bytes(&self, c: Counter) -> u64 {
        self.bytes[Self::slot(c)]
    }

    /// Packets `c` counted since `before` (panics if it went backwards).
    pub fn since(&self, before: &Self, c: Counter) -> u64 {
        let (a, b) = (self.packets(c), before.packets(c));
        a.checked_sub(b)
            .unwrap_or_else(|| panic!("{} went backwards: {b} → {a}", c.name()))
    }

    /// Every counter with its packets, in [`Counter::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = (Counter, u64)> + '_ {
        Counter::ALL
            .iter()
            .copied()
            .zip(self.packets.iter().copied())
    }

    /// The counters whose packets differ from `before`, with the change.
    pub fn changes(&self, before: &Self) -> BTreeMap<&'static str, i128> {
        self.iter()
            .zip(before.iter())
            .filter(|((_, a), (_, b))| a != b)
            .map(|((c, a), (_, b))| (c.name(), i128::from(a) - i128::from(b)))
            .collect()
    }
}

/// A counter given as the [`Counter`] itself or by its name (`"fwd_local"`);
/// a name no counter has panics, it never reads as 0.
pub trait AsCounter: Copy {
    /// The counter.
    fn as_counter(self) -> Counter;
}

impl AsCounter for Counter {
    fn as_counter(self) -> Counter {
        self
    }
}

impl AsCounter for &str {
    fn as_counter(self) -> Counter {
        Counters::named(self)
    }
}

impl std::ops::Index<Counter> for Counters {
    type Output = u64;

    /// Packets counted by `c`.
    fn index(&self, c: Counter) -> &u64 {
        &self.packets[Self::slot(c)]
    }
}

impl std::fmt::Debug for Counters {
    /// The non-zero counters: name → packets (bytes).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(
                Counter::ALL
                    .iter()
                    .zip(self.packets.iter().zip(&self.bytes))
                    .filter(|(_, (p, _))| **p != 0)
                    .map(|(c, (p, b))| (c.name(), format!("{p} ({b} B)"))),
            )
            .finish()
    }
}

impl Node {
    /// Host-side pod veths (`rv…`) present in the node namespace.
    pub fn veths(&self) -> Vec<String> {
        self.ns
            .run("ip", &["-o", "link", "show"])
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap_or(n).to_owned())
            .filter(|n| rivet::endpoint::is_rivet_veth(n))
            .collect()
    }

    /// Link pins of pod veths (the uplink's and rivet_host's excluded). A
    /// missing links directory is "none"; any other error panics.
    pub fn pod_link_pins(&self) -> Vec<String> {
        rivet::pins::PinLayout::new(self.pin_dir())
            .link_pins()
            .unwrap_or_else(|e| panic!("link pins of {}: {e}", self.name))
            .into_iter()
            .filter(|p| !p.ends_with("-eth0") && !p.ends_with("-rivet_host"))
            .collect()
    }

    /// Endpoint records (leases) on disk, including pending ones. A missing
    /// records directory is "none"; any other error panics.
    pub fn records(&self) -> Vec<String> {
        let dir = self.agent_args.state_dir.join("endpoints");
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
            Err(e) => panic!("listing {}: {e}", dir.display()),
        };
        entries
            .map(|e| {
                e.unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .filter(|n| n.ends_with(".json"))
            .collect()
    }

    /// Addresses in the pinned endpoints map. A map that is not pinned
    /// (the pin does not exist) has none; any other error panics.
    pub fn map_entries(&self) -> Vec<Ipv4Addr> {
        use aya::maps::{HashMap, Map, MapData};
        use rivet_common::{EndpointInfo, EndpointKey};
        let path = rivet::pins::PinLayout::new(self.pin_dir()).map("ENDPOINTS");
        let data = match MapData::from_pin(&path) {
            Ok(data) => data,
            Err(e) => match std::fs::symlink_metadata(&path) {
                Err(gone) if gone.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
                _ => panic!("opening {}: {e}", path.display()),
            },
        };
        let map = HashMap::<MapData, EndpointKey, EndpointInfo>::try_from(Map::HashMap(data))
            .unwrap_or_else(|e| panic!("{} as the endpoints map: {e}", path.display()));
        let mut v: Vec<Ipv4Addr> = map
            .keys()
            .map(|k| {
                let k = k.unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
                Ipv4Addr::from(rivet_common::ipv4_from_key(k.addr))
            })
            .collect();
        v.sort();
        v
    }

    /// Records of the socket hooks in the pinned `SOCK_REVNAT` map: each
    /// `(key, value)` (a socket sent somewhere else than it asked: what it
    /// asked for). Panics if the map cannot be read.
    pub fn sock_revnat_entries(
        &self,
    ) -> Vec<(rivet_common::SockRevKey, rivet_common::SockRevTarget)> {
        use aya::maps::{HashMap, Map, MapData};
        use rivet_common::{SockRevKey, SockRevTarget, map_names::SOCK_REVNAT};
        let path = rivet::pins::PinLayout::new(self.pin_dir()).map(SOCK_REVNAT);
        let data =
            MapData::from_pin(&path).unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
        let map = HashMap::<MapData, SockRevKey, SockRevTarget>::try_from(Map::LruHashMap(data))
            .unwrap_or_else(|e| panic!("{} as the socket records: {e}", path.display()));
        map.iter()
            .map(|e| e.unwrap_or_else(|e| panic!("reading {}: {e}", path.display())))
            .collect()
    }

    /// Host veth ifindexes holding bandwidth limits in the pinned
    /// `BANDWIDTH` map (none when the map is not pinned).
    pub fn bandwidth_entries(&self) -> Vec<u32> {
        use aya::maps::{HashMap, Map, MapData};
        let path = rivet::pins::PinLayout::new(self.pin_dir()).map("BANDWIDTH");
        let data = match MapData::from_pin(&path) {
            Ok(data) => data,
            Err(e) => match std::fs::symlink_metadata(&path) {
                Err(gone) if gone.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
                _ => panic!("opening {}: {e}", path.display()),
            },
        };
        let map = HashMap::<MapData, u32, rivet_common::PodBandwidth>::try_from(Map::HashMap(data))
            .unwrap_or_else(|e| panic!("{} as the bandwidth map: {e}", path.display()));
        map.keys()
            .map(|k| k.unwrap_or_else(|e| panic!("reading {}: {e}", path.display())))
            .collect()
    }

    /// Asserts the node holds no pod state at all: no pod veth, no pod link
    /// pin, no record, no map entry (endpoints, bandwidth limits), no /32
    /// route to a pod.
    pub fn assert_no_pod_state(&self, what: &str) {
        // DEL answers before the kernel has finished unregistering the veth
        // (the agent deletes it in the background): allow it a moment.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
        while !self.veths().is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(self.veths(), Vec::<String>::new(), "{what}: veths left");
        assert_eq!(
            self.pod_link_pins(),
            Vec::<String>::new(),
            "{what}: link pins left"
        );
        assert_eq!(self.records(), Vec::<String>::new(), "{what}: records left");
        assert_eq!(
            self.map_entries(),
            Vec::<Ipv4Addr>::new(),
            "{what}: map entries left"
        );
        assert_eq!(
            self.bandwidth_entries(),
            Vec::<u32>::new(),
            "{what}: bandwidth limits left"
        );
        let routes = self.ns.run("ip", &["-4", "route", "show", "dev", "eth0"]);
        let all = self.ns.run("ip", &["-4", "route", "show"]);
        let pod_routes: Vec<&str> = all.lines().filter(|l| l.contains(" dev rv")).collect();
        assert!(
            pod_routes.is_empty(),
            "{what}: routes left: {pod_routes:?} ({routes})"
        );
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(agent) = &mut self.agent {
            agent.unload();
        }
        // Whatever the agent could not remove (it may have crashed).
        let _ = rivet::datapath::unload(&rivet::pins::PinLayout::new(self.agent_args.pin_dir()));
        // bgp mode: the speaker outlives agents by design.
        rivet::cluster::bgp::bird::Bird::stop(&rivet::cluster::bgp::paths(
            &self.agent_args.state_dir,
        ));
    }
}

/// A whole emulated cluster. Fields drop in order: pods, nodes (agents
/// stopped, pins removed), outside, underlay, then the scratch directory.
#[derive(Debug)]
pub struct World {
    /// Pods, by creation order.
    pub pods: Vec<Pod>,
    /// Nodes.
    pub nodes: Vec<Node>,
    /// The outside host, if made.
    pub outside: Option<Netns>,
    /// etcd, if started (in the underlay namespace).
    pub etcd: Option<crate::traffic::ChildGuard>,
    /// The underlay namespace (bridge br0).
    pub underlay: Netns,
    /// Unique name prefix.
    pub prefix: String,
    /// Address plan number: underlay 192.168.<k>.0/24.
    pub k: u8,
    /// Scratch directory (state dirs, sockets, logs).
    pub dir: PathBuf,
    keep: bool,
}

impl World {
    /// An empty world: just the underlay namespace with its bridge.
    pub fn new() -> Self {
        let prefix = crate::unique_prefix();
        let k = crate::world_number();
        let dir = std::env::temp_dir().join(format!("rivet-{prefix}"));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        let underlay = Netns::new(format!("{prefix}-ul"));
        underlay.ip(&["link", "add", "br0", "type", "bridge"]);
        underlay.ip(&["addr", "add", &format!("192.168.{k}.1/24"), "dev", "br0"]);
        underlay.ip(&["link", "set", "br0", "up"]);
        // The underlay stands for a physical switch: no netfilter on it.
        // (With br_netfilter loaded, bridged frames would otherwise run the
        // iptables hooks in this namespace: ~15 % of a single stream's CPU.)
        for key in ["iptables", "ip6tables", "arptables"] {
            let path = format!("/proc/sys/net/bridge/bridge-nf-call-{key}");
            let _ = underlay.exec(move || std::fs::write(path, "0"));
        }
        Self {
            pods: Vec::new(),
            nodes: Vec::new(),
            outside: None,
            etcd: None,
            underlay,
            prefix,
            k,
            dir,
            keep: false,
        }
    }

    /// Attaches a namespace to the underlay bridge with `eth0` = `ip/24`
    /// and a default route via the underlay (192.168.k.1).
    fn plug(&self, ns: &Netns, port: &str, ip: Ipv4Addr) {
        self.underlay.ip(&[
            "link",
            "add",
            port,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            ns.name(),
        ]);
        self.underlay
            .ip(&["link", "set", port, "master", "br0", "up"]);
        ns.ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"]);
        ns.ip(&["link", "set", "eth0", "up"]);
    }

    /// Adds a node namespace on the underlay (no agent yet). Node `i`
    /// (1-based) gets 192.168.k.(10+i) and pod CIDR 10.k.i.0/24.
    pub fn add_node(&mut self) -> usize {
        let i = self.nodes.len() + 1;
        let cidr = format!("10.{}.{i}.0/24", self.k);
        self.add_node_with_cidr(&cidr)
    }

    /// Adds a node with a given pod CIDR (no agent yet).
    pub fn add_node_with_cidr(&mut self, pod_cidr: &str) -> usize {
        let i = self.nodes.len() + 1;
        let ip = Ipv4Addr::new(192, 168, self.k, 10 + i as u8);
        let ns = Netns::new(format!("{}-n{i}", self.prefix));
        self.plug(&ns, &format!("n{i}"), ip);
        self.push_node(ns, ip, pod_cidr)
    }

    /// Adds a node whose namespace `switch` plugged (its `eth0`, address,
    /// routes): its agent's arguments, no agent yet.
    pub fn push_node(&mut self, ns: Netns, ip: Ipv4Addr, pod_cidr: &str) -> usize {
        let i = self.nodes.len() + 1;
        let name = ns.name().to_owned();
        let pod_cidr = pod_cidr.to_owned();
        let agent_args = AgentArgs {
            node_name: name.clone(),
            netns: ns.path(),
            uplink: Some("eth0".into()),
            pod_cidr: pod_cidr.clone(),
            cluster_cidr: format!("10.{}.0.0/16", self.k),
            state_dir: self.dir.join(format!("n{i}-state")),
            socket: self.dir.join(format!("n{i}.sock")),
            log: self.dir.join(format!("n{i}.log")),
            env: Vec::new(),
            extra_args: Vec::new(),
            wrapper: Vec::new(),
        };
        self.nodes.push(Node {
            name,
            ip,
            pod_cidr,
            agent: None,
            agent_args,
            next_host: 2,
            ns,
        });
        self.nodes.len() - 1
    }

    /// Adds a node and starts its agent.
    pub fn add_node_with_agent(&mut self) -> usize {
        let n = self.add_node();
        self.start_agent(n);
        n
    }

    /// Starts the agent of node `n`.
    pub fn start_agent(&mut self, n: usize) {
        let node = &mut self.nodes[n];
        node.agent = Some(AgentProc::start(node.agent_args.clone()));
    }

    /// Adds `count` nodes running agents in `mode` (`vxlan`, `ipip`,
    /// `native`, `hybrid`), and tells every agent about every other node
    /// through the API (a static cluster, without etcd).
    pub fn add_static_cluster(&mut self, count: usize, mode: &str) -> Vec<usize> {
        let nodes: Vec<usize> = (0..count)
            .map(|_| {
                let n = self.add_node();
                self.nodes[n].agent_args.extra_args = vec!["--mode".into(), mode.into()];
                self.start_agent(n);
                n
            })
            .collect();
        self.mesh();
        nodes
    }

    /// Registers every node with every other node's agent (NodeSet).
    pub fn mesh(&self) {
        for a in &self.nodes {
            for b in &self.nodes {
                if a.name == b.name {
                    continue;
                }
                let r = a
                    .agent()
                    .client()
                    .call(&Request::NodeSet(rivet_api::NodeEntry {
                        subnet: b.pod_cidr.clone(),
                        node_ip: b.ip,
                        vtep_mac: None,
                        vni: None,
                        route: None,
                    }));
                assert!(
                    matches!(r, Ok(Response::Nodes { .. })),
                    "node set on {}: {r:?}",
                    a.name
                );
            }
        }
    }

    /// Starts etcd in the underlay namespace at 192.168.k.1:2379 (data in the
    /// scratch directory) and waits until it answers.
    pub fn start_etcd(&mut self) -> String {
        let url = format!("http://192.168.{}.1:2379", self.k);
        let data = self.dir.join("etcd");
        let child = self
            .underlay
            .command("etcd")
            .arg("--data-dir")
            .arg(&data)
            .args(["--name", "rivet-test"])
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .args(["--listen-peer-urls", "http://127.0.0.1:2380"])
            .args(["--initial-advertise-peer-urls", "http://127.0.0.1:2380"])
            .args(["--initial-cluster", "rivet-test=http://127.0.0.1:2380"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(self.dir.join("etcd.log")).expect("etcd log"))
            .spawn()
            .expect("starting etcd (apt etcd-server)");
        self.etcd = Some(crate::traffic::ChildGuard(child));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        loop {
            let out = self.etcdctl(&["endpoint", "health"]);
            if out.status.success() {
                return url;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "etcd not healthy: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// Runs etcdctl against this world's etcd.
    pub fn etcdctl(&self, args: &[&str]) -> std::process::Output {
        let url = format!("http://192.168.{}.1:2379", self.k);
        self.underlay
            .command("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg("--endpoints")
            .arg(&url)
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("etcdctl (apt etcd-client)")
    }

    /// Adds a node whose agent registers in this world's etcd (`mode` seeds
    /// the cluster config if it has none), with a short lease TTL; its pod
    /// CIDR is the subnet etcd gave it.
    pub fn add_etcd_node(&mut self, mode: &str, lease_ttl: u32) -> usize {
        let n = self.add_node();
        let url = format!("http://192.168.{}.1:2379", self.k);
        self.nodes[n].agent_args.extra_args = vec![
            "--mode".into(),
            mode.into(),
            "--etcd-endpoints".into(),
            url,
            "--etcd-lease-ttl".into(),
            lease_ttl.to_string(),
        ];
        self.start_agent(n);
        self.refresh_pod_cidr(n);
        n
    }

    /// Reads node `n`'s pod CIDR from its agent.
    pub fn refresh_pod_cidr(&mut self, n: usize) {
        match self.nodes[n].agent().client().call(&Request::Status {}) {
            Ok(Response::Status(s)) => self.nodes[n].pod_cidr = s.pod_cidr,
            other => panic!("status of {}: {other:?}", self.nodes[n].name),
        }
    }

    /// The address the next pod added on node `n` gets (what a kubelet
    /// would report in the Pod's `status.podIPs`).
    pub fn next_pod_ip(&self, n: usize) -> Ipv4Addr {
        let node = &self.nodes[n];
        let net: ipnet::Ipv4Net = node.pod_cidr.parse().expect("pod CIDR");
        Ipv4Addr::from(u32::from(net.network()) + u32::from(node.next_host))
    }

    /// Creates a pod namespace on node `n` and attaches it through the agent.
    pub fn add_pod(&mut self, n: usize) -> usize {
        self.add_pod_with_ports(n, Vec::new())
    }

    /// Adds a pod carrying its Kubernetes identity (`K8S_POD_NAMESPACE`,
    /// `K8S_POD_NAME`), through the agent.
    pub fn add_k8s_pod(&mut self, n: usize, namespace: &str, name: &str) -> usize {
        let meta = rivet_api::PodMeta {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        };
        self.add_pod_with(n, Vec::new(), Some(meta))
    }

    /// Adds a pod with hostPorts (`portMappings`), through the agent.
    pub fn add_pod_with_ports(&mut self, n: usize, mappings: Vec<rivet_api::PortMapping>) -> usize {
        self.add_pod_with(n, mappings, None)
    }

    /// Adds a pod with its Kubernetes identity and hostPorts.
    pub fn add_k8s_pod_with_ports(
        &mut self,
        n: usize,
        namespace: &str,
        name: &str,
        mappings: Vec<rivet_api::PortMapping>,
    ) -> usize {
        let meta = rivet_api::PodMeta {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        };
        self.add_pod_with(n, mappings, Some(meta))
    }

    /// Adds a pod with bandwidth limits, through the agent.
    pub fn add_pod_with_bandwidth(&mut self, n: usize, bandwidth: rivet_api::Bandwidth) -> usize {
        self.add_pod_full(n, Vec::new(), None, Some(bandwidth))
    }

    fn add_pod_with(
        &mut self,
        n: usize,
        mappings: Vec<rivet_api::PortMapping>,
        pod: Option<rivet_api::PodMeta>,
    ) -> usize {
        self.add_pod_full(n, mappings, pod, None)
    }

    fn add_pod_full(
        &mut self,
        n: usize,
        mappings: Vec<rivet_api::PortMapping>,
        pod: Option<rivet_api::PodMeta>,
        bandwidth: Option<rivet_api::Bandwidth>,
    ) -> usize {
        let node = &mut self.nodes[n];
        let host = node.next_host;
        node.next_host += 1;
        let name = format!("{}-n{}p{}", self.prefix, n + 1, host);
        let ns = Netns::new(name.clone());
        let net: ipnet::Ipv4Net = node.pod_cidr.parse().expect("pod CIDR");
        let ip = Ipv4Addr::from(u32::from(net.network()) + u32::from(host));
        let mut spec = EndpointSpec::new(&name, ns.path().display().to_string()).with_ip(ip);
        spec.port_mappings = mappings;
        spec.pod = pod;
        spec.bandwidth = bandwidth;
        let endpoint = match node.agent().client().call(&Request::EndpointAdd(spec)) {
            Ok(Response::Endpoint(ep)) => ep,
            other => panic!(
                "adding pod {name}: {other:?}\nagent log:\n{}",
                node.agent().log()
            ),
        };
        self.pods.push(Pod {
            name,
            node: n,
            ip,
            endpoint,
            ns,
        });
        self.pods.len() - 1
    }

    /// Detaches pod `p` through the agent (its namespace stays).
    pub fn del_pod(&self, p: usize) -> bool {
        let pod = &self.pods[p];
        match self.nodes[pod.node]
            .agent()
            .client()
            .call(&Request::EndpointDel(EndpointRef::new(&pod.name, "eth0")))
        {
            Ok(Response::Deleted { existed }) => existed,
            other => panic!("deleting pod {}: {other:?}", pod.name),
        }
    }

    /// Adds the outside host at 192.168.k.254 on the underlay.
    pub fn add_outside(&mut self) -> &Netns {
        let ns = Netns::new(format!("{}-out", self.prefix));
        self.plug(&ns, "out", Ipv4Addr::new(192, 168, self.k, 254));
        self.outside.insert(ns)
    }

    /// Scratch directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Leaves everything (namespaces, agents, pins) in place on drop.
    pub fn keep(&mut self) {
        self.keep = true;
        for p in &mut self.pods {
            p.ns.keep();
        }
        for n in &mut self.nodes {
            n.ns.keep();
            if let Some(a) = &mut n.agent {
                a.detach();
            }
        }
        if let Some(o) = &mut self.outside {
            o.keep();
        }
        self.underlay.keep();
    }
}

impl Default for World {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if self.keep {
            // Forget the guards without running their cleanup.
            for n in std::mem::take(&mut self.nodes) {
                std::mem::forget(n);
            }
            return;
        }
        self.pods.clear();
        self.nodes.clear();
        self.etcd = None;
        self.outside = None;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
