//! Kubernetes Services against the number of Services: rivet's BPF
//! translation (socket-level for pods, per-flow DNAT at the uplink for
//! NodePorts; the objects applied with `rivetctl apply -f`) vs kube-proxy's
//! iptables mode (its chains loaded with one `iptables-restore`) vs
//! kube-proxy's nftables mode (its `ip kube-proxy` table loaded with
//! `nft -f`), measured side by side, interleaved, in one run.
//!
//! Layout, the same for every variant: one node on the underlay with two
//! backend pods and one client pod; an outside host on the underlay. rivet's
//! node runs `rivetd` (pods through the agent); the kube-proxy nodes are
//! plain nodes whose pods the reference `ptp` plugin attached (host-local,
//! no masquerade), so the backends are reachable by pod IP with no Service
//! translation of rivet's. Services: N − 1 others (ClusterIP, two backends
//! each, never reached), a one-backend Service for the throughput probe,
//! then the measured Service (two backends, TCP 80 → 8080 with NodePort
//! 30080 and UDP 53 → 5353) — last in iptables' chain order, as the
//! newest Service's rules may be.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream, UdpSocket},
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use aya::maps::MapError;
use rivet_common::{SvcKey, ipv4_key, svc_scope};
use serde_json::{Value, json};

use crate::{
    Options, Report,
    conn::{Expect, Pacing, connection_loop, one_byte_server, timed_connections},
    iperf3_cpu, percentile, progress, rss_mib,
};
use rivet_tests::{
    Netns, World, bin,
    cni::{Plugin, result_ip},
    traffic::iperf3_server,
};

/// Namespace of every benchmark Service.
const NAMESPACE: &str = "bench";
/// The measured Service's TCP port and the backends' port behind it.
const SVC_PORT: u16 = 80;
const POD_PORT: u16 = 8080;
/// Its UDP port and the backends' port behind it.
const UDP_SVC_PORT: u16 = 53;
const UDP_POD_PORT: u16 = 5353;
/// The throughput Service's port (= the backend's iperf3 port).
const IPERF_PORT: u16 = 5201;
/// The measured Service's NodePort.
const NODE_PORT: u16 = 30080;
/// The pause before each latency probe's connection. Back to back, each
/// variant loads the machine as hard as it is fast (on 2026-12-06 rivet's
/// 15,000 pod-IP connections/s against kube-proxy's 400–600, whose p99
/// there is ~12 ms), and the
/// fastest one's median pays for its own load; paced, every variant is
/// measured at the same, light, offered load.
const PROBE_PAUSE: Duration = Duration::from_micros(200);
/// Kubernetes' default Service CIDR (kube-proxy's nftables mode drops
/// traffic to addresses of it that no Service holds).
const SERVICE_CIDR: &str = "10.96.0.0/12";
/// The measured Service's ClusterIP.
const MEASURED_IP: Ipv4Addr = Ipv4Addr::new(10, 97, 0, 10);
/// The throughput Service's ClusterIP.
const IPERF_IP: Ipv4Addr = Ipv4Addr::new(10, 97, 0, 11);
/// The N at which one Service's apply-to-answer time is measured.
const UPDATE_N: usize = 10_000;
/// Up to this N the iptables variant is programmed with kube-proxy's own
/// `iptables-restore --noflush` (iptables-nft 1.8.9 takes it in time
/// growing with N²: 0.7 s at 1,000 Services, 68 s at 10,000, so minutes
/// beyond); above, with the same rules in one restore without --noflush.
const NOFLUSH_MAX: usize = 10_000;
/// One-more-Service samples of the iptables variant at N ≥ this (each is a
/// `--noflush` restore of every chain: over a minute at 10,000).
const IPT_SLOW_N: usize = 5_000;
/// How rivet's map-write-to-answer samples probe the new ClusterIP: a new
/// connection attempt every 100 µs, one not answered within 20 ms given up
/// (before the write its SYN leaves untranslated, to no one).
const MAP_PACING: Pacing = Pacing {
    every: Duration::from_micros(100),
    timeout: Duration::from_millis(20),
};
/// How often rivet's pinned `SVC_FRONTENDS` is read while a new Service's
/// frontend is awaited.
const MAP_POLL: Duration = Duration::from_micros(20);
/// kube-proxy's masquerade mark.
const MASQ_MARK: &str = "0x4000";
/// Pod subnets of the two kube-proxy nodes (ptp + host-local).
const IPT_SUBNET: &str = "10.252.0.0/24";
const NFT_SUBNET: &str = "10.251.0.0/24";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    const fn lower(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
        }
    }

    const fn k8s(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
        }
    }
}

/// One port of a Service.
#[derive(Clone, Debug)]
struct Port {
    name: &'static str,
    proto: Proto,
    port: u16,
    target: u16,
    node_port: Option<u16>,
}

/// One Service with its EndpointSlice's backends (every one ready).
#[derive(Clone, Debug)]
struct Svc {
    name: String,
    cluster_ip: Ipv4Addr,
    ports: Vec<Port>,
    backends: Vec<Ipv4Addr>,
    /// `nodeName` of the endpoints.
    node: String,
}

impl Svc {
    /// kube-proxy's service port name: `ns/name:port`.
    fn port_name(&self, p: &Port) -> String {
        format!("{NAMESPACE}/{}:{}", self.name, p.name)
    }
}

const HTTP: Port = Port {
    name: "http",
    proto: Proto::Tcp,
    port: SVC_PORT,
    target: POD_PORT,
    node_port: None,
};

/// Other Service `i`: ClusterIP 10.96.0.0 + 1 + i, `per` backends at
/// addresses no pod holds (never reached), on another node.
fn other(i: usize, per: usize) -> Svc {
    let base = u32::from(Ipv4Addr::new(10, 96, 0, 1));
    let backends = u32::from(Ipv4Addr::new(10, 200, 0, 1));
    Svc {
        name: format!("svc-{i:05}"),
        cluster_ip: Ipv4Addr::from(base + i as u32),
        ports: vec![HTTP],
        backends: (0..per)
            .map(|j| Ipv4Addr::from(backends + (i * per + j) as u32))
            .collect(),
        node: "other-node".into(),
    }
}

/// The N-Service set of a variant: N − 1 others, the throughput Service
/// (backend 0 only), the measured Service (both backends; its TCP port
/// last).
fn service_set(n: usize, backends: &[Ipv4Addr], node: &str) -> Vec<Svc> {
    let mut v: Vec<Svc> = (0..n.saturating_sub(1)).map(|i| other(i, 2)).collect();
    v.push(Svc {
        name: "iperf".into(),
        cluster_ip: IPERF_IP,
        ports: vec![Port {
            name: "iperf",
            proto: Proto::Tcp,
            port: IPERF_PORT,
            target: IPERF_PORT,
            node_port: None,
        }],
        backends: backends[..1].to_vec(),
        node: node.into(),
    });
    v.push(Svc {
        name: "measured".into(),
        cluster_ip: MEASURED_IP,
        ports: vec![
            Port {
                name: "dns",
                proto: Proto::Udp,
                port: UDP_SVC_PORT,
                target: UDP_POD_PORT,
                node_port: None,
            },
            Port {
                node_port: Some(NODE_PORT),
                ..HTTP
            },
        ],
        backends: backends.to_vec(),
        node: node.into(),
    });
    v
}

/// Service `k` of the apply-to-answer probes: 10.97.1.0 + 1 + k, the two
/// backends.
fn probe(k: usize, backends: &[Ipv4Addr], node: &str) -> Svc {
    Svc {
        name: format!("probe-{k:03}"),
        cluster_ip: Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 97, 1, 1)) + k as u32),
        ports: vec![HTTP],
        backends: backends.to_vec(),
        node: node.into(),
    }
}

// ---------------------------------------------------------------- objects

/// The Service and EndpointSlice objects of `svcs`, as Kubernetes JSON.
fn k8s_objects(svcs: &[Svc]) -> Vec<Value> {
    let mut items = Vec::with_capacity(svcs.len() * 2);
    for s in svcs {
        let node_port = s.ports.iter().any(|p| p.node_port.is_some());
        let ports: Vec<Value> = s
            .ports
            .iter()
            .map(|p| {
                let mut v = json!({
                    "name": p.name, "protocol": p.proto.k8s(),
                    "port": p.port, "targetPort": p.target,
                });
                if let Some(np) = p.node_port {
                    v["nodePort"] = json!(np);
                }
                v
            })
            .collect();
        items.push(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": s.name, "namespace": NAMESPACE},
            "spec": {
                "type": if node_port { "NodePort" } else { "ClusterIP" },
                "clusterIP": s.cluster_ip.to_string(),
                "clusterIPs": [s.cluster_ip.to_string()],
                "ports": ports,
            },
        }));
        let slice_ports: Vec<Value> = s
            .ports
            .iter()
            .map(|p| json!({"name": p.name, "protocol": p.proto.k8s(), "port": p.target}))
            .collect();
        let endpoints: Vec<Value> = s
            .backends
            .iter()
            .map(|b| {
                json!({
                    "addresses": [b.to_string()],
                    "conditions": {"ready": true},
                    "nodeName": s.node,
                })
            })
            .collect();
        items.push(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {
                "name": format!("{}-1", s.name), "namespace": NAMESPACE,
                "labels": {"kubernetes.io/service-name": s.name},
            },
            "addressType": "IPv4",
            "ports": slice_ports,
            "endpoints": endpoints,
        }));
    }
    items
}

/// One `v1 List` document of `svcs`' objects.
fn list_document(svcs: &[Svc]) -> String {
    serde_json::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": k8s_objects(svcs)}))
        .expect("JSON document")
}

/// Runs `rivetctl --socket <socket> ARGS` with `stdin`; panics with its
/// words when it fails. Returns its wall time in ms.
fn rivetctl(socket: &Path, args: &[&str], stdin: Option<&str>) -> f64 {
    let t = Instant::now();
    let mut child = Command::new(bin("rivetctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning rivetctl");
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())
            .expect("rivetctl's stdin");
    }
    let out = child.wait_with_output().expect("rivetctl");
    let ms = t.elapsed().as_secs_f64() * 1e3;
    assert!(
        out.status.success(),
        "rivetctl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ms
}

// ------------------------------------------------------ kube-proxy naming

/// A name hash in kube-proxy's style: `len` characters of base32 (RFC
/// 4648) of a 128-bit hash of `text` (two FNV-1a passes; kube-proxy uses
/// SHA-256 — only the shape matters here).
fn name_hash(text: &str, len: usize) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let fnv = |seed: u64| {
        text.bytes().fold(seed, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    };
    let h = (u128::from(fnv(0xcbf2_9ce4_8422_2325)) << 64) | u128::from(fnv(0x6c62_272e_07bb_0142));
    (0..len.min(25))
        .map(|i| char::from(ALPHABET[((h >> (123 - 5 * i)) & 31) as usize]))
        .collect()
}

/// kube-proxy iptables chain names of one Service port: KUBE-SVC-,
/// KUBE-EXT- and one KUBE-SEP- per backend.
struct IptChains {
    svc: String,
    ext: String,
    seps: Vec<String>,
}

fn ipt_chains(s: &Svc, p: &Port) -> IptChains {
    let id = format!("{}{}", s.port_name(p), p.proto.lower());
    let h = name_hash(&id, 16);
    IptChains {
        svc: format!("KUBE-SVC-{h}"),
        ext: format!("KUBE-EXT-{h}"),
        seps: s
            .backends
            .iter()
            .map(|b| {
                format!(
                    "KUBE-SEP-{}",
                    name_hash(&format!("{id}{b}:{}", p.target), 16)
                )
            })
            .collect(),
    }
}

// ---------------------------------------------------- kube-proxy iptables

/// The jumps from the built-in chains into kube-proxy's and its chains,
/// empty: loaded once (a full `iptables-restore` of the node's filter and
/// nat tables, which hold nothing else).
fn iptables_base() -> String {
    let mut s =
        String::from("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n");
    for c in [
        "KUBE-NODEPORTS",
        "KUBE-SERVICES",
        "KUBE-EXTERNAL-SERVICES",
        "KUBE-FORWARD",
        "KUBE-PROXY-FIREWALL",
    ] {
        let _ = writeln!(s, ":{c} - [0:0]");
    }
    s.push_str(
        "-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL\n\
         -A INPUT -m comment --comment \"kubernetes health check service ports\" -j KUBE-NODEPORTS\n\
         -A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES\n\
         -A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL\n\
         -A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n\
         -A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES\n\
         -A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL\n\
         -A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         COMMIT\n\
         *nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n\
         :KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n\
         -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
         COMMIT\n",
    );
    s
}

/// What kube-proxy's iptables proxier writes at a full sync, for
/// `iptables-restore --noflush`: every kube-proxy chain declared (which
/// flushes it) and filled, the Services' rules in `svcs`' order, the
/// NodePort jump last in KUBE-SERVICES; `stale` Services' chains flushed
/// and deleted.
///
/// `full`: the same rules as one restore without `--noflush` (both tables
/// replaced whole, the built-in chains' jumps included) — what
/// [`iptables_base`] and these rules together leave, loaded in one step.
fn iptables_sync(svcs: &[Svc], stale: &[Svc], cluster_cidr: &str, full: bool) -> String {
    let mut chains = String::new();
    let mut rules = String::new();
    let base = full.then(iptables_base);
    let base_part = |table: &str| -> (String, String) {
        // (declarations, rules) of `table` in the base.
        let Some(b) = &base else {
            return (String::new(), String::new());
        };
        let section = b
            .split("COMMIT\n")
            .find(|s| s.starts_with(&format!("*{table}\n")))
            .unwrap_or_default();
        let decl = section
            .lines()
            .filter(|l| l.starts_with(':') && l.contains(" ACCEPT "))
            .map(|l| format!("{l}\n"))
            .collect();
        let jumps = section
            .lines()
            .filter(|l| l.starts_with("-A "))
            .map(|l| format!("{l}\n"))
            .collect();
        (decl, jumps)
    };
    let (filter_decl, filter_jumps) = base_part("filter");
    let (nat_decl, nat_jumps) = base_part("nat");
    chains.push_str("*filter\n");
    chains.push_str(&filter_decl);
    chains.push_str(
        ":KUBE-NODEPORTS - [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-EXTERNAL-SERVICES - [0:0]\n:KUBE-FORWARD - [0:0]\n:KUBE-PROXY-FIREWALL - [0:0]\n",
    );
    chains.push_str(&filter_jumps);
    chains.push_str("-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n");
    let _ = writeln!(
        chains,
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {MASQ_MARK}/{MASQ_MARK} -j ACCEPT"
    );
    chains.push_str(
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\nCOMMIT\n\
         *nat\n",
    );
    chains.push_str(&nat_decl);
    chains.push_str(
        ":KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n",
    );
    rules.push_str(&nat_jumps);
    let _ = writeln!(
        rules,
        "-A KUBE-POSTROUTING -m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN\n\
         -A KUBE-POSTROUTING -j MARK --xor-mark {MASQ_MARK}\n\
         -A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n\
         -A KUBE-MARK-MASQ -j MARK --or-mark {MASQ_MARK}"
    );
    for s in svcs {
        for p in &s.ports {
            let c = ipt_chains(s, p);
            let name = s.port_name(p);
            let proto = p.proto.lower();
            let _ = writeln!(chains, ":{} - [0:0]", c.svc);
            let _ = writeln!(
                rules,
                "-A KUBE-SERVICES -m comment --comment \"{name} cluster IP\" -m {proto} -p {proto} -d {} --dport {} -j {}",
                s.cluster_ip, p.port, c.svc
            );
            let _ = writeln!(
                rules,
                "-A {} -m comment --comment \"{name} cluster IP\" -m {proto} -p {proto} -d {} --dport {} ! -s {cluster_cidr} -j KUBE-MARK-MASQ",
                c.svc, s.cluster_ip, p.port
            );
            if let Some(np) = p.node_port {
                let _ = writeln!(chains, ":{} - [0:0]", c.ext);
                let _ = writeln!(
                    rules,
                    "-A KUBE-NODEPORTS -m comment --comment {name} -m {proto} -p {proto} --dport {np} -j {ext}\n\
                     -A {ext} -m comment --comment \"masquerade traffic for {name} external destinations\" -j KUBE-MARK-MASQ\n\
                     -A {ext} -j {svc}",
                    ext = c.ext,
                    svc = c.svc
                );
            }
            let count = s.backends.len();
            for (i, (b, sep)) in s.backends.iter().zip(&c.seps).enumerate() {
                let _ = writeln!(chains, ":{sep} - [0:0]");
                let remaining = count - i;
                if remaining > 1 {
                    let _ = writeln!(
                        rules,
                        "-A {} -m comment --comment \"{name} -> {b}:{}\" -m statistic --mode random --probability {:.10} -j {sep}",
                        c.svc,
                        p.target,
                        1.0 / remaining as f64
                    );
                } else {
                    let _ = writeln!(
                        rules,
                        "-A {} -m comment --comment \"{name} -> {b}:{}\" -j {sep}",
                        c.svc, p.target
                    );
                }
                let _ = writeln!(
                    rules,
                    "-A {sep} -m comment --comment {name} -s {b} -j KUBE-MARK-MASQ\n\
                     -A {sep} -m comment --comment {name} -m {proto} -p {proto} -j DNAT --to-destination {b}:{}",
                    p.target
                );
            }
        }
    }
    rules.push_str("-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n");
    // Chains of removed Services: flushed (declared) and deleted.
    for s in stale {
        for p in &s.ports {
            let c = ipt_chains(s, p);
            let mut names = vec![c.svc];
            if p.node_port.is_some() {
                names.push(c.ext);
            }
            names.extend(c.seps);
            for n in names {
                let _ = writeln!(chains, ":{n} - [0:0]");
                let _ = writeln!(rules, "-X {n}");
            }
        }
    }
    chains.push_str(&rules);
    chains.push_str("COMMIT\n");
    chains
}

// ---------------------------------------------------- kube-proxy nftables

const NFT_TABLE: &str = "ip kube-proxy";

/// kube-proxy's `ip kube-proxy` table without Services: the maps, the
/// hooks and the helper chains (no load-balancer source ranges).
fn nft_base() -> String {
    let t = NFT_TABLE;
    format!(
        "add table {t} {{ comment \"rules for kube-proxy\" ; }}\n\
         add set {t} cluster-ips {{ type ipv4_addr ; comment \"Active ClusterIPs\" ; }}\n\
         add map {t} no-endpoint-nodeports {{ type inet_proto . inet_service : verdict ; }}\n\
         add map {t} no-endpoint-services {{ type ipv4_addr . inet_proto . inet_service : verdict ; }}\n\
         add map {t} service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\" ; }}\n\
         add map {t} service-nodeports {{ type inet_proto . inet_service : verdict ; comment \"NodePort traffic\" ; }}\n\
         add chain {t} cluster-ips-check\n\
         add chain {t} filter-forward {{ type filter hook forward priority 0 ; }}\n\
         add chain {t} filter-input {{ type filter hook input priority 0 ; }}\n\
         add chain {t} filter-output {{ type filter hook output priority 0 ; }}\n\
         add chain {t} mark-for-masquerade\n\
         add chain {t} masquerading\n\
         add chain {t} nat-output {{ type nat hook output priority -100 ; }}\n\
         add chain {t} nat-postrouting {{ type nat hook postrouting priority 100 ; }}\n\
         add chain {t} nat-prerouting {{ type nat hook prerouting priority -100 ; }}\n\
         add chain {t} nodeport-endpoints-check\n\
         add chain {t} services\n\
         add chain {t} service-endpoints-check\n\
         add rule {t} cluster-ips-check ip daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\"\n\
         add rule {t} cluster-ips-check ip daddr {{ {SERVICE_CIDR} }} drop comment \"Drop traffic to unallocated ClusterIPs\"\n\
         add rule {t} filter-forward ct state new jump service-endpoints-check\n\
         add rule {t} filter-forward ct state new jump cluster-ips-check\n\
         add rule {t} filter-input ct state new jump nodeport-endpoints-check\n\
         add rule {t} filter-input ct state new jump service-endpoints-check\n\
         add rule {t} filter-output ct state new jump service-endpoints-check\n\
         add rule {t} filter-output ct state new jump cluster-ips-check\n\
         add rule {t} mark-for-masquerade mark set mark or {MASQ_MARK}\n\
         add rule {t} masquerading mark and {MASQ_MARK} == 0 return\n\
         add rule {t} masquerading mark set mark xor {MASQ_MARK}\n\
         add rule {t} masquerading masquerade fully-random\n\
         add rule {t} nat-output jump services\n\
         add rule {t} nat-postrouting jump masquerading\n\
         add rule {t} nat-prerouting jump services\n\
         add rule {t} nodeport-endpoints-check fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @no-endpoint-nodeports\n\
         add rule {t} services ip daddr . meta l4proto . th dport vmap @service-ips\n\
         add rule {t} services fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports\n\
         add rule {t} service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services\n"
    )
}

/// One Service's chains, rules and map elements as kube-proxy's
/// nftables proxier adds them (endpoint chains first: the service chain's
/// verdict map names them).
fn nft_service(s: &Svc, cluster_cidr: &str, out: &mut String) {
    let t = NFT_TABLE;
    for p in &s.ports {
        let proto = p.proto.lower();
        let id = format!("{NAMESPACE}/{}/{proto}/{}", s.name, p.name);
        let svc_chain = format!("service-{}-{id}", name_hash(&id, 8));
        let mut eps = Vec::new();
        for b in &s.backends {
            let ep_id = format!("{id}__{b}/{}", p.target);
            let chain = format!("endpoint-{}-{ep_id}", name_hash(&ep_id, 8));
            let _ = writeln!(
                out,
                "add chain {t} {chain}\n\
                 add rule {t} {chain} ip saddr {b} jump mark-for-masquerade\n\
                 add rule {t} {chain} meta l4proto {proto} dnat to {b}:{}",
                p.target
            );
            eps.push(chain);
        }
        let vmap: Vec<String> = eps
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{i} : goto {c}"))
            .collect();
        let _ = writeln!(
            out,
            "add chain {t} {svc_chain}\n\
             add rule {t} {svc_chain} ip daddr {cip} ip saddr != {cluster_cidr} jump mark-for-masquerade\n\
             add rule {t} {svc_chain} numgen random mod {} vmap {{ {} }}\n\
             add element {t} cluster-ips {{ {cip} }}\n\
             add element {t} service-ips {{ {cip} . {proto} . {} : goto {svc_chain} }}",
            eps.len(),
            vmap.join(" , "),
            p.port,
            cip = s.cluster_ip,
        );
        if let Some(np) = p.node_port {
            let ext = format!("external-{}-{id}", name_hash(&id, 8));
            let _ = writeln!(
                out,
                "add chain {t} {ext}\n\
                 add rule {t} {ext} jump mark-for-masquerade\n\
                 add rule {t} {ext} goto {svc_chain}\n\
                 add element {t} service-nodeports {{ {proto} . {np} : goto {ext} }}"
            );
        }
    }
}

/// The whole table for `svcs`, replacing any previous one in the same
/// transaction.
fn nft_full(svcs: &[Svc], cluster_cidr: &str) -> String {
    let mut s = format!("add table {NFT_TABLE}\ndelete table {NFT_TABLE}\n");
    s.push_str(&nft_base());
    for svc in svcs {
        nft_service(svc, cluster_cidr, &mut s);
    }
    s
}

// ------------------------------------------------------------ the nodes

/// Runs `tool args` in `ns` with `input` on stdin; its wall time in ms.
fn feed(ns: &Netns, tool: &str, args: &[&str], input: &str) -> f64 {
    let t = Instant::now();
    let mut child = ns
        .command(tool)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{tool}: {e}"));
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("input");
    let out = child.wait_with_output().expect("wait");
    let ms = t.elapsed().as_secs_f64() * 1e3;
    assert!(
        out.status.success(),
        "{tool} {args:?} in {} failed: {}",
        ns.name(),
        String::from_utf8_lossy(&out.stderr)
    );
    ms
}

/// A plain node whose three pods (two backends, one client) the reference
/// `ptp` plugin attached (host-local IPAM, no masquerade).
struct PtpNode {
    node: usize,
    pods: Vec<Netns>,
    ips: Vec<Ipv4Addr>,
    subnet: &'static str,
}

fn ptp_node(w: &mut World, tag: &str, subnet: &'static str) -> PtpNode {
    let node = w.add_node();
    let ns_path = w.nodes[node].ns.path();
    w.nodes[node]
        .ns
        .run("sysctl", &["-qw", "net.ipv4.ip_forward=1"]);
    let conf = json!({
        "cniVersion": "1.0.0",
        "name": format!("bench-{tag}"),
        "type": "ptp",
        "ipMasq": false,
        "ipam": {
            "type": "host-local", "subnet": subnet,
            "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": w.dir().join(format!("{tag}-ipam")),
        },
    });
    let mut pods = Vec::new();
    let mut ips = Vec::new();
    for i in 0..3 {
        let pod = Netns::new(format!("{}-{tag}{i}", w.prefix));
        let res = Plugin::reference("ptp", &ns_path)
            .add(&format!("{}{tag}{i}", w.prefix), &pod.path(), &conf)
            .expect_ok("ptp");
        ips.push(result_ip(&res.json).expect("ptp result address"));
        pods.push(pod);
    }
    PtpNode {
        node,
        pods,
        ips,
        subnet,
    }
}

/// A variant of the benchmark (`--variants`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Var {
    /// rivetd: socket-level and uplink translation.
    #[value(name = "rivet")]
    Rivet,
    /// kube-proxy's iptables mode.
    #[value(name = "iptables")]
    Ipt,
    /// kube-proxy's nftables mode.
    #[value(name = "nftables")]
    Nft,
}

/// Every variant, in the listed order.
pub const VARIANTS: [Var; 3] = [Var::Rivet, Var::Ipt, Var::Nft];

impl Var {
    const fn name(self) -> &'static str {
        match self {
            Self::Rivet => "rivet",
            Self::Ipt => "iptables",
            Self::Nft => "nftables",
        }
    }
}

struct Ctx {
    w: World,
    rivet_node: usize,
    /// rivet's pods: backend, backend, client.
    rivet_pods: [usize; 3],
    ipt: PtpNode,
    nft: PtpNode,
}

impl Ctx {
    fn node(&self, v: Var) -> usize {
        match v {
            Var::Rivet => self.rivet_node,
            Var::Ipt => self.ipt.node,
            Var::Nft => self.nft.node,
        }
    }

    fn node_ns(&self, v: Var) -> &Netns {
        &self.w.nodes[self.node(v)].ns
    }

    fn node_ip(&self, v: Var) -> Ipv4Addr {
        self.w.nodes[self.node(v)].ip
    }

    fn node_name(&self, v: Var) -> String {
        self.w.nodes[self.node(v)].name.clone()
    }

    /// Pod `i` (0, 1: backends; 2: client).
    fn pod(&self, v: Var, i: usize) -> &Netns {
        match v {
            Var::Rivet => &self.w.pods[self.rivet_pods[i]].ns,
            Var::Ipt => &self.ipt.pods[i],
            Var::Nft => &self.nft.pods[i],
        }
    }

    fn pod_ip(&self, v: Var, i: usize) -> Ipv4Addr {
        match v {
            Var::Rivet => self.w.pods[self.rivet_pods[i]].ip,
            Var::Ipt => self.ipt.ips[i],
            Var::Nft => self.nft.ips[i],
        }
    }

    fn backends(&self, v: Var) -> Vec<Ipv4Addr> {
        vec![self.pod_ip(v, 0), self.pod_ip(v, 1)]
    }

    fn cluster_cidr(&self, v: Var) -> String {
        match v {
            Var::Rivet => self.w.nodes[self.rivet_node]
                .agent_args
                .cluster_cidr
                .clone(),
            Var::Ipt => self.ipt.subnet.to_owned(),
            Var::Nft => self.nft.subnet.to_owned(),
        }
    }

    fn socket(&self) -> &Path {
        self.w.nodes[self.rivet_node].agent().socket()
    }

    fn outside(&self) -> &Netns {
        self.w.outside.as_ref().expect("outside")
    }

    fn spaces(&self) -> impl Iterator<Item = &Netns> {
        crate::world_spaces(&self.w)
            .chain(self.ipt.pods.iter())
            .chain(self.nft.pods.iter())
    }
}

/// What a failed probe's message shows: the node's rules, addresses and
/// routes, the client pod's addresses and routes (the first 200 lines).
fn diagnose(ctx: &Ctx, v: Var) -> String {
    let node = ctx.node_ns(v);
    let client = ctx.pod(v, 2);
    let show = |ns: &Netns, tool: &str, args: &[&str]| {
        let out = ns.output(tool, args);
        format!(
            "--- {tool} {} in {}\n{}{}",
            args.join(" "),
            ns.name(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let text = [
        match v {
            Var::Rivet => String::new(),
            Var::Ipt => show(node, "iptables-save", &[]),
            Var::Nft => show(node, "nft", &["list", "ruleset"]),
        },
        show(node, "ip", &["-4", "addr"]),
        show(node, "ip", &["route"]),
        show(client, "ip", &["-4", "addr"]),
        show(client, "ip", &["route"]),
    ]
    .concat();
    text.lines().take(200).collect::<Vec<_>>().join("\n")
}

/// The last line of the agent's log that says `what`.
fn agent_log_line(ctx: &Ctx, what: &str) -> String {
    ctx.w.nodes[ctx.rivet_node]
        .agent()
        .log()
        .lines()
        .rev()
        .find(|l| l.contains(what))
        .map(|l| strip_ansi(l.trim()))
        .unwrap_or_default()
}

/// `text` without ANSI escape sequences (the agent's log may be coloured).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI: ESC [ parameters final-byte.
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

// ------------------------------------------------------------ probes

/// A UDP server in `ns` on `port` answering each datagram with itself.
fn udp_echo(ns: &Netns, port: u16) {
    let s = ns
        .exec(move || UdpSocket::bind(("0.0.0.0", port)))
        .expect("bind udp");
    std::thread::spawn(move || {
        let mut b = [0u8; 64];
        while let Ok((n, peer)) = s.recv_from(&mut b) {
            let _ = s.send_to(&b[..n], peer);
        }
    });
}

/// One-datagram round trips from `ns` to `dst` for `time`, each from a
/// fresh socket (a new flow, as a resolver's lookups are): the round-trip
/// times in µs and how many got no answer (or one from another address)
/// within 200 ms.
fn udp_round_trips(ns: &Netns, dst: SocketAddr, time: Duration) -> (Vec<f64>, usize) {
    ns.exec(move || {
        let end = Instant::now() + time;
        let (mut out, mut lost) = (Vec::new(), 0);
        let mut b = [0u8; 8];
        while Instant::now() < end {
            let Ok(s) = UdpSocket::bind(("0.0.0.0", 0)) else {
                continue;
            };
            let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
            let t = Instant::now();
            if s.send_to(b"q", dst).is_err() {
                lost += 1;
                continue;
            }
            match s.recv_from(&mut b) {
                Ok((1, from)) if from == dst => out.push(t.elapsed().as_secs_f64() * 1e6),
                _ => lost += 1,
            }
        }
        (out, lost)
    })
}

/// Runs `change` while `ns` tries to reach `dst` (a connect with a 5 ms
/// timeout, then a 1-byte exchange, again and again): ms from the
/// change's start to the first answered connection (None after 600 s).
fn time_to_answer(ns: &Netns, dst: SocketAddr, change: impl FnOnce()) -> Option<f64> {
    std::thread::scope(|scope| {
        let prober = scope.spawn(|| {
            ns.exec(move || {
                // iptables-restore alone takes over a minute at 10,000.
                let deadline = Instant::now() + Duration::from_secs(600);
                while Instant::now() < deadline {
                    let Ok(mut c) = TcpStream::connect_timeout(&dst, Duration::from_millis(5))
                    else {
                        continue;
                    };
                    let _ = c.set_read_timeout(Some(Duration::from_secs(1)));
                    let mut b = [7u8; 1];
                    if c.write_all(&b).and_then(|()| c.read_exact(&mut b)).is_ok() {
                        return Some(Instant::now());
                    }
                }
                None
            })
        });
        // The prober is in its loop before the change starts.
        std::thread::sleep(Duration::from_millis(30));
        let t0 = Instant::now();
        change();
        prober
            .join()
            .ok()
            .flatten()
            .map(|t| t.saturating_duration_since(t0).as_secs_f64() * 1e3)
    })
}

/// When one new Service showed on rivet's node.
struct MapSeen {
    /// The change started (`rivetctl apply -f -`).
    start: Instant,
    /// The last read of `SVC_FRONTENDS` without the Service's frontend
    /// (the last map write of a Service, after its backends: the write
    /// came after this).
    absent: Instant,
    /// The first read with it (the write came before this).
    present: Instant,
    /// The first connection through the ClusterIP answered.
    answered: Instant,
}

impl MapSeen {
    /// ms from the map write to the first answer: from the last read that
    /// did not see the frontend (an upper bound: the write came later).
    fn write_to_answer_ms(&self) -> f64 {
        self.answered
            .saturating_duration_since(self.absent)
            .as_secs_f64()
            * 1e3
    }
}

/// Puts the calling thread in the `SCHED_FIFO` class (priority 1): it
/// then runs as soon as its timer fires, not when the agent, `rivetctl`
/// and the prober leave it a CPU (on two CPUs with all of them busy, a
/// normal thread's 20 µs reads were up to 1.9 ms apart, 2026-12-07).
fn realtime() {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: `param` is a valid sched_param alive for the call; the
    // thread handle is the calling thread's own.
    let r = unsafe {
        libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &raw const param)
    };
    assert_eq!(
        r,
        0,
        "SCHED_FIFO for a probe thread: {}",
        std::io::Error::from_raw_os_error(r)
    );
}

/// Applies `svc` on rivet's node (`rivetctl apply -f -`) while the client
/// pod probes its ClusterIP (a non-blocking connect every
/// [`MAP_PACING`]) and a thread reads the pinned `SVC_FRONTENDS` for its
/// TCP frontend every [`MAP_POLL`] ([`realtime`]: its reads bound the
/// write's instant; the prober stays a normal thread, as a client is, so
/// its late wake-ups count against rivet).
fn map_to_answer(ctx: &Ctx, svc: &Svc) -> MapSeen {
    let frontends = crate::pinned_frontends(&ctx.w.nodes[ctx.rivet_node].pin_dir());
    let key = SvcKey {
        addr: ipv4_key(svc.cluster_ip.octets()),
        port: SVC_PORT.to_be(),
        proto: 6,
        scope: svc_scope::INTERNAL,
    };
    let dst = SocketAddrV4::new(svc.cluster_ip, SVC_PORT);
    let doc = list_document(std::slice::from_ref(svc));
    let ns = ctx.pod(Var::Rivet, 2);
    let limit = Duration::from_secs(10);
    std::thread::scope(|scope| {
        let prober = scope.spawn(move || {
            ns.exec(move || crate::conn::probe(dst, Expect::Open, MAP_PACING, limit).0)
        });
        let watcher = scope.spawn(move || {
            realtime();
            let deadline = Instant::now() + limit;
            let mut absent = Instant::now();
            while absent < deadline {
                let t = Instant::now();
                match frontends.get(&key, 0) {
                    Ok(_) => return Some((absent, Instant::now())),
                    Err(MapError::KeyNotFound) => absent = t,
                    Err(e) => panic!("reading SVC_FRONTENDS for {dst}: {e}"),
                }
                std::thread::sleep(MAP_POLL);
            }
            None
        });
        // Both are in their loops before the change starts.
        std::thread::sleep(Duration::from_millis(30));
        let start = Instant::now();
        rivetctl(ctx.socket(), &["apply", "-f", "-"], Some(&doc));
        let answered = prober
            .join()
            .expect("the prober thread")
            .unwrap_or_else(|| panic!("rivet: the new Service {dst} never answered"));
        let (absent, present) = watcher
            .join()
            .expect("the map reader thread")
            .unwrap_or_else(|| panic!("rivet: the frontend of {dst} never reached SVC_FRONTENDS"));
        MapSeen {
            start,
            absent,
            present,
            answered,
        }
    })
}

// ------------------------------------------------------------ the run

/// Everything applied to one variant so far (to remove or replace it).
#[derive(Default)]
struct Applied {
    rivet: Vec<Svc>,
    ipt: Vec<Svc>,
}

/// Programs the N-Service set on variant `v` as its tool does a full sync:
/// rivet one `rivetctl apply -f` of a List (after a `rivetctl delete -f`
/// of what the previous size left, untimed), iptables one
/// `iptables-restore --noflush` of every kube-proxy chain, nftables one
/// `nft -f` of the whole table. Returns the timed step's ms.
fn program(ctx: &Ctx, v: Var, svcs: &[Svc], applied: &mut Applied, notes: &mut Vec<String>) -> f64 {
    match v {
        Var::Rivet => {
            let dir = ctx.w.dir();
            if !applied.rivet.is_empty() {
                let old = dir.join("services-old.json");
                std::fs::write(&old, list_document(&applied.rivet)).expect("writing the document");
                let ms = rivetctl(
                    ctx.socket(),
                    &["delete", "-f", &old.display().to_string()],
                    None,
                );
                notes.push(format!(
                    "rivet: deleting the {} previous Services (+ slices) took {ms:.0} ms (untimed in apply_ms)",
                    applied.rivet.len()
                ));
            }
            let file = dir.join("services.json");
            let doc = list_document(svcs);
            std::fs::write(&file, &doc).expect("writing the document");
            let ms = rivetctl(
                ctx.socket(),
                &["apply", "-f", &file.display().to_string()],
                None,
            );
            notes.push(format!(
                "rivet: apply of {} Services + {} EndpointSlices ({:.1} MiB of JSON) {ms:.0} ms; agent: {}",
                svcs.len(),
                svcs.len(),
                doc.len() as f64 / f64::from(1 << 20),
                agent_log_line(ctx, "objects applied")
            ));
            applied.rivet = svcs.to_vec();
            ms
        }
        Var::Ipt => {
            let stale: Vec<Svc> = applied
                .ipt
                .iter()
                .filter(|s| !svcs.iter().any(|n| n.name == s.name))
                .cloned()
                .collect();
            let cidr = ctx.cluster_cidr(v);
            // kube-proxy's own form, where it finishes in minutes.
            let ms = (svcs.len() <= NOFLUSH_MAX + 2).then(|| {
                let rules = iptables_sync(svcs, &stale, &cidr, false);
                feed(
                    ctx.node_ns(v),
                    "iptables-restore",
                    &["--noflush", "--counters"],
                    &rules,
                )
            });
            // The same rules replacing both tables in one restore.
            let full = feed(
                ctx.node_ns(v),
                "iptables-restore",
                &[],
                &iptables_sync(svcs, &[], &cidr, true),
            );
            notes.push(format!(
                "iptables: {} Services: kube-proxy's `iptables-restore --noflush --counters` {}; the same rules without --noflush (both tables replaced) {full:.0} ms",
                svcs.len(),
                ms.map_or_else(|| "not run (projected from the smaller sizes: minutes)".to_owned(), |ms| format!("{ms:.0} ms"))
            ));
            applied.ipt = svcs.to_vec();
            ms.unwrap_or(f64::NAN)
        }
        Var::Nft => feed(
            ctx.node_ns(v),
            "nft",
            &["-f", "-"],
            &nft_full(svcs, &ctx.cluster_cidr(v)),
        ),
    }
}

/// Runs the benchmark at these numbers of Services with these variants
/// (in [`VARIANTS`]' order whatever the caller's).
pub fn run(opts: &Options, sizes: &[usize], only: &[Var]) -> Report {
    let variants: Vec<Var> = VARIANTS
        .into_iter()
        .filter(|v| only.is_empty() || only.contains(v))
        .collect();
    let variants = variants.as_slice();
    let started = Instant::now();
    let step = |what: &str| {
        progress(&format!(
            "services: {what} [{:.0}s]",
            started.elapsed().as_secs_f64()
        ));
    };
    step("setting up");
    let mut w = World::new();
    let rivet_node = w.add_node();
    w.start_agent(rivet_node);
    let rivet_pods = [
        w.add_pod(rivet_node),
        w.add_pod(rivet_node),
        w.add_pod(rivet_node),
    ];
    let ipt = ptp_node(&mut w, "ipt", IPT_SUBNET);
    let nft = ptp_node(&mut w, "nft", NFT_SUBNET);
    w.add_outside();
    let mut ctx = Ctx {
        w,
        rivet_node,
        rivet_pods,
        ipt,
        nft,
    };
    // The same settings in every namespace of every variant; clients and
    // backends keep no TIME_WAIT sockets (`CONNECTION_SYSCTLS`).
    let kernel_at_setup = crate::bridge_nf_off(ctx.spaces());
    for &v in variants {
        crate::connection_sysctls(ctx.pod(v, 2));
        for b in 0..2 {
            crate::connection_sysctls(ctx.pod(v, b));
            one_byte_server(ctx.pod(v, b), POD_PORT);
            udp_echo(ctx.pod(v, b), UDP_POD_PORT);
        }
    }
    crate::connection_sysctls(ctx.outside());
    if variants.contains(&Var::Ipt) {
        feed(
            ctx.node_ns(Var::Ipt),
            "iptables-restore",
            &[],
            &iptables_base(),
        );
    }

    let mut report = Report {
        name: "services vs number of Services".into(),
        variants: variants.iter().map(|v| v.name().to_owned()).collect(),
        baseline: "iptables".into(),
        ..Default::default()
    };
    let sample = opts.pick(
        Duration::from_secs_f64(f64::from(opts.secs) * 0.2),
        Duration::from_millis(300),
    );
    let warm = Duration::from_millis(200);
    let secs = sample.as_secs_f64();
    let iperf_secs = opts.secs;
    let update_samples = opts.pick(20, 5);
    let largest = sizes.iter().copied().max().unwrap_or(1);
    // The apply-to-answer time at 10,000 Services (or the largest size
    // below it in a smoke run).
    let update_n = sizes
        .iter()
        .copied()
        .filter(|&n| n <= UPDATE_N)
        .max()
        .unwrap_or(largest);
    let mut notes = Vec::new();
    let mut counts: BTreeMap<(String, Var), usize> = BTreeMap::new();
    let mut lost: BTreeMap<Var, usize> = BTreeMap::new();
    let mut applied = Applied::default();
    let mut probes = 0usize;

    for &n in sizes {
        let m = |base: &str| format!("{base}_n{n}");
        for base in [
            "cluster_connect_p50_us",
            "cluster_connect_p99_us",
            "nodeport_connect_p50_us",
            "nodeport_connect_p99_us",
            "cluster_exchange_p50_us",
            "cluster_exchange_p99_us",
            "podip_connect_p50_us",
            "podip_connect_p99_us",
            "podip_exchange_p50_us",
            "podip_exchange_p99_us",
            "nodeport_exchange_p50_us",
            "nodeport_exchange_p99_us",
            "udp_rr_p50_us",
            "udp_rr_p99_us",
            "apply_ms",
        ] {
            report.better.insert(m(base), "lower".into());
        }
        for base in [
            "cluster_conns_per_s",
            "podip_conns_per_s",
            "nodeport_conns_per_s",
        ] {
            report.better.insert(m(base), "higher".into());
        }
        // Programming, in the listed order (each variant's own node).
        let mut sets = BTreeMap::new();
        for &v in variants {
            step(&format!("N={n} programming {}", v.name()));
            let svcs = service_set(n, &ctx.backends(v), &ctx.node_name(v));
            let ms = program(&ctx, v, &svcs, &mut applied, &mut notes);
            report.add(&m("apply_ms"), v.name(), ms);
            sets.insert(v, svcs);
        }
        if let Some(pid) = ctx.w.nodes[ctx.rivet_node].agent().pid() {
            report.add(&m("agent_rss_mib"), "rivet", rss_mib(pid));
        }
        let cluster = SocketAddr::from((MEASURED_IP, SVC_PORT));
        let udp = SocketAddr::from((MEASURED_IP, UDP_SVC_PORT));
        step(&format!("N={n} warm-up"));
        for &v in variants {
            let node_port = SocketAddr::from((ctx.node_ip(v), NODE_PORT));
            for (what, ns, dst) in [
                ("ClusterIP", ctx.pod(v, 2), cluster),
                ("NodePort", ctx.outside(), node_port),
            ] {
                let lat = connection_loop(ns, dst, warm);
                assert!(
                    !lat.is_empty(),
                    "{}: no {what} connection succeeded at N={n}\n{}",
                    v.name(),
                    diagnose(&ctx, v)
                );
            }
            let (rtt, _) = udp_round_trips(ctx.pod(v, 2), udp, warm);
            assert!(
                !rtt.is_empty(),
                "{}: no UDP answer through the ClusterIP at N={n}",
                v.name()
            );
        }
        for round in 0..opts.rounds {
            for v in crate::rotated(variants, round as usize) {
                let name = v.name();
                step(&format!("N={n} round {}/{} {name}", round + 1, opts.rounds));
                let node_port = SocketAddr::from((ctx.node_ip(v), NODE_PORT));
                // The floor: the same client to backend 0 by its pod IP.
                let pod_ip = SocketAddr::from((ctx.backends(v)[0], POD_PORT));
                for (what, ns, dst) in [
                    ("cluster", ctx.pod(v, 2), cluster),
                    ("podip", ctx.pod(v, 2), pod_ip),
                    ("nodeport", ctx.outside(), node_port),
                ] {
                    // Latency at the same offered load for every variant;
                    // the rate back to back.
                    let conns = timed_connections(ns, dst, sample, Some(PROBE_PAUSE));
                    let rate = timed_connections(ns, dst, sample, None);
                    assert!(
                        !conns.is_empty() && !rate.is_empty(),
                        "{name}: no {what} connection succeeded at N={n}"
                    );
                    for (figure, lat) in [
                        (
                            "connect",
                            conns.iter().map(|c| c.connect_us).collect::<Vec<_>>(),
                        ),
                        ("exchange", conns.iter().map(|c| c.exchange_us).collect()),
                    ] {
                        for q in [50.0, 99.0] {
                            report.add(
                                &m(&format!("{what}_{figure}_p{q}_us")),
                                name,
                                percentile(&lat, q),
                            );
                        }
                    }
                    report.add(
                        &m(&format!("{what}_conns_per_s")),
                        name,
                        rate.len() as f64 / secs,
                    );
                    *counts.entry((m(what), v)).or_default() += conns.len();
                }
                let (rtt, missed) = udp_round_trips(ctx.pod(v, 2), udp, sample);
                assert!(!rtt.is_empty(), "{name}: no UDP answer at N={n}");
                report.add(&m("udp_rr_p50_us"), name, percentile(&rtt, 50.0));
                report.add(&m("udp_rr_p99_us"), name, percentile(&rtt, 99.0));
                *counts.entry((m("udp"), v)).or_default() += rtt.len();
                *lost.entry(v).or_default() += missed;
            }
        }
        if variants.contains(&Var::Rivet) {
            step(&format!("N={n} rivet's programs (BPF statistics)"));
            bpf_costs(&ctx, n, sample, &mut report);
        }

        if n == update_n {
            // One new Service (+ slice) at a time, interleaved: ms from the
            // start of its apply to its first answered connection from the
            // client pod.
            let metric = m("one_service_visible_ms");
            let apply_metric = m("one_service_apply_ms");
            report.better.insert(metric.clone(), "lower".into());
            report.better.insert(apply_metric.clone(), "lower".into());
            for k in 0..update_samples {
                for v in crate::rotated(variants, k) {
                    if v == Var::Ipt && n >= IPT_SLOW_N && k >= 2 {
                        continue;
                    }
                    step(&format!(
                        "N={n} one more Service {}/{update_samples} {}",
                        k + 1,
                        v.name()
                    ));
                    let svc = probe(probes + k, &ctx.backends(v), &ctx.node_name(v));
                    let dst = SocketAddr::from((svc.cluster_ip, SVC_PORT));
                    let mut apply_ms = 0.0;
                    let visible = match v {
                        Var::Rivet => {
                            let doc = list_document(std::slice::from_ref(&svc));
                            let socket = ctx.socket().to_owned();
                            let t = time_to_answer(ctx.pod(v, 2), dst, || {
                                apply_ms = rivetctl(&socket, &["apply", "-f", "-"], Some(&doc));
                            });
                            applied.rivet.push(svc);
                            t
                        }
                        Var::Ipt => {
                            // kube-proxy's iptables mode rewrites every
                            // chain on a change.
                            let mut all = applied.ipt.clone();
                            all.push(svc);
                            let rules = iptables_sync(&all, &[], &ctx.cluster_cidr(v), false);
                            let ns = ctx.node_ns(v);
                            let t = time_to_answer(ctx.pod(v, 2), dst, || {
                                apply_ms = feed(
                                    ns,
                                    "iptables-restore",
                                    &["--noflush", "--counters"],
                                    &rules,
                                );
                            });
                            applied.ipt = all;
                            t
                        }
                        Var::Nft => {
                            // The nftables mode adds what changed.
                            let mut text = String::new();
                            nft_service(&svc, &ctx.cluster_cidr(v), &mut text);
                            let ns = ctx.node_ns(v);
                            time_to_answer(ctx.pod(v, 2), dst, || {
                                apply_ms = feed(ns, "nft", &["-f", "-"], &text);
                            })
                        }
                    };
                    let visible = visible.unwrap_or_else(|| {
                        panic!("{}: the new Service {dst} never answered", v.name())
                    });
                    report.add(&metric, v.name(), visible);
                    report.add(&apply_metric, v.name(), apply_ms);
                }
            }
            probes += update_samples;
            if variants.contains(&Var::Rivet) {
                map_samples(
                    &ctx,
                    n,
                    probes..probes + update_samples,
                    &step,
                    &mut applied,
                    &mut report,
                    &mut notes,
                );
                probes += update_samples;
            }
            notes.push(format!(
                "one_service_visible_ms_n{n}: {update_samples} Services added one at a time on top of the N (interleaved, rotated); from the start of the change (rivet: `rivetctl apply -f -` of the Service + its EndpointSlice, process start included; iptables: a full `iptables-restore --noflush` of every kube-proxy chain, as its iptables mode does on any change; nftables: one `nft -f` adding the Service's chains and map elements, as its nftables mode does) to the first connection answered from the client pod, which meanwhile tries every ≤ 5 ms (connect timeout 5 ms); one_service_apply_ms: the change's command alone; iptables takes 2 samples at N ≥ {IPT_SLOW_N} (each restore lasts over a minute at 10,000). p99 (all samples): {}",
                variants
                    .iter()
                    .map(|v| format!(
                        "{} {:.1} ms",
                        v.name(),
                        report.metrics[&metric]
                            .get(v.name())
                            .map_or(f64::NAN, |s| percentile(&s.samples, 99.0))
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }

        if n == largest {
            // Throughput through the ClusterIP and to the same backend by
            // pod IP, back to back in each round (which first alternates).
            for metric in [
                "throughput_clusterip_gbps",
                "throughput_podip_gbps",
                "clusterip_over_podip_share",
            ] {
                report.better.insert(metric.into(), "higher".into());
            }
            for round in 0..opts.rounds {
                for v in crate::rotated(variants, round as usize) {
                    step(&format!(
                        "N={n} throughput {}/{} {}",
                        round + 1,
                        opts.rounds,
                        v.name()
                    ));
                    let mut pair = [0.0f64; 2];
                    let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
                    for which in order {
                        let dst = if which == 0 {
                            IPERF_IP
                        } else {
                            ctx.pod_ip(v, 0)
                        };
                        let _server = iperf3_server(ctx.pod(v, 0), IPERF_PORT, Some(1));
                        let s = iperf3_cpu(ctx.pod(v, 2), dst, IPERF_PORT, iperf_secs, None);
                        pair[which] = s.bits_per_second / 1e9;
                    }
                    report.add("throughput_clusterip_gbps", v.name(), pair[0]);
                    report.add("throughput_podip_gbps", v.name(), pair[1]);
                    report.add("clusterip_over_podip_share", v.name(), pair[0] / pair[1]);
                }
            }
            notes.push(format!(
                "throughput_*: iperf3 single stream, {iperf_secs} s, client pod → the throughput Service's ClusterIP (one backend: backend 0) and → backend 0 by pod IP, back to back in each round (ClusterIP first in even rounds), measured at N={n}; clusterip_over_podip_share = the round's ClusterIP ÷ pod IP"
            ));
        }
    }

    if variants.contains(&Var::Rivet) {
        // Agent memory with 10,000 Services × 10 backends: after the apply
        // and after a restart that reads them back from the store.
        step("10,000 Services × 10 backends");
        let rss_apply = "agent_rss_mib (10,000 Services x 10 backends, after apply)";
        let rss_restart = "agent_rss_mib (10,000 Services x 10 backends, after restart)";
        let big_apply = "apply_ms (10,000 Services x 10 backends)";
        for metric in [rss_apply, rss_restart, big_apply] {
            report.better.insert(metric.into(), "lower".into());
        }
        let big: Vec<Svc> = (0..10_000).map(|i| other(i, 10)).collect();
        let mut scratch = Vec::new();
        let ms = program(&ctx, Var::Rivet, &big, &mut applied, &mut scratch);
        notes.extend(scratch);
        report.add(big_apply, "rivet", ms);
        let pid = ctx.w.nodes[ctx.rivet_node]
            .agent()
            .pid()
            .expect("agent pid");
        report.add(rss_apply, "rivet", rss_mib(pid));
        {
            let agent = ctx.w.nodes[ctx.rivet_node].agent_mut();
            agent.stop();
            agent.restart();
        }
        std::thread::sleep(Duration::from_secs(1));
        let pid = ctx.w.nodes[ctx.rivet_node]
            .agent()
            .pid()
            .expect("agent pid");
        report.add(rss_restart, "rivet", rss_mib(pid));
    }
    progress(&format!(
        "services: done in {:.0}s\n",
        started.elapsed().as_secs_f64()
    ));

    // Counts and losses.
    for ((what, v), c) in &counts {
        notes.push(format!(
            "{}: {what}: {c} connections or round trips in the measured samples",
            v.name()
        ));
    }
    for (v, l) in &lost {
        if *l > 0 {
            notes.push(format!(
                "{}: {l} UDP round trips without an answer within 200 ms (not in the figures)",
                v.name()
            ));
        }
    }
    report.notes.push(format!(
        "layout: per variant one node with two backend pods and one client pod, an outside host on the underlay; rivet: rivetd's pods; iptables and nftables: the reference ptp plugin + host-local (no masquerade), kube-proxy's rules in the node namespace. Services: N − 1 others (ClusterIP, two backends each at addresses no pod holds), one single-backend Service for throughput, then the measured Service (both backends; TCP 80 → 8080 with NodePort {NODE_PORT}, UDP 53 → 5353), last in iptables' chain order; {} rounds of {secs} s samples per N after a {} s warm-up of each variant, interleaved",
        opts.rounds,
        warm.as_secs_f64()
    ));
    report.notes.push(format!(
        "clients and backends (every variant): {} (no TIME_WAIT sockets: from 2026-12-06; before, the client's ephemeral ports filled with them)",
        crate::CONNECTION_SYSCTLS.join(", ")
    ));
    report.notes.push(format!("cluster_*: fresh connections from the client pod to the measured ClusterIP, one at a time, each {} µs after the previous one closed (the same light offered load for every variant; back to back up to 2026-12-05): connect = the TCP handshake (until connect() returns), exchange = connect + a 1-byte request and its answer (the connect figure up to 2026-12-02); conns_per_s = connect + exchange + close back to back, in a sample of its own; podip_*: the same from the client pod to backend 0 by its pod IP, no Service (the floor every variant's ClusterIP figure stands on); nodeport_*: the same from the outside host to the node's address and NodePort; udp_rr_*: one datagram and its answer through the ClusterIP's UDP port, each from a fresh socket (a new flow)", PROBE_PAUSE.as_micros()));
    report.notes.push("apply_ms: rivet = `rivetctl apply -f` of one List with the N Services and N EndpointSlices (after a `rivetctl delete -f` of the previous size's, untimed); iptables = one `iptables-restore --noflush --counters` of every kube-proxy chain (filter and nat), as kube-proxy's iptables mode writes them at a full sync (KUBE-SERVICES → KUBE-SVC-* with `-m statistic --mode random --probability` → KUBE-SEP-* DNAT, KUBE-MARK-MASQ, KUBE-NODEPORTS behind `-m addrtype --dst-type LOCAL` last, KUBE-POSTROUTING masquerade of marked packets; iptables-nft backend, the system's iptables-restore); nftables = one `nft -f` replacing table ip kube-proxy (service-ips verdict map on `ip daddr . meta l4proto . th dport`, per-Service chains with `numgen random mod 2 vmap`, endpoint chains with `dnat to`, NodePorts through `fib daddr type local` and the service-nodeports map, masquerade by mark)".into());
    report.notes.push("agent_rss_mib: rivetd's VmRSS (/proc/<pid>/status) after the apply at each N; with 10,000 Services × 10 backends each: after their apply, and after a restart that reads them back from the store (1 s after it answers)".into());
    report.notes.extend(notes);
    goals(&mut report, sizes, update_n);
    let kernel_at_end = crate::bridge_nf_read(ctx.spaces());
    report.set_kernel_settings(kernel_at_setup, &kernel_at_end);
    report.notes.push(format!(
        "order: {} (per N for the connection samples and the throughput rounds, per Service for the one-more-Service samples; programming and warm-ups in the listed order)",
        crate::ROTATION
    ));
    report
}

/// rivet's programs per connection at `n` Services: kernel BPF statistics
/// (on only here, after the measured rounds, so the figures above carry
/// none of their clock reads) over `sample` of pod-IP and of ClusterIP
/// connections from the client pod; ns per run of the pod-side TC program
/// and of the connect4 hook, and their runs per connection.
fn bpf_costs(ctx: &Ctx, n: usize, sample: Duration, report: &mut Report) {
    use rivet_common::program_names::{FROM_POD, SOCK_CONNECT4};
    let node = ctx.rivet_node;
    // Held for the measurement; closing it turns the statistics off.
    let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).expect("BPF_ENABLE_STATS");
    let cluster = SocketAddr::from((MEASURED_IP, SVC_PORT));
    let pod_ip = SocketAddr::from((ctx.backends(Var::Rivet)[0], POD_PORT));
    for (what, dst) in [("podip", pod_ip), ("cluster", cluster)] {
        let before = [FROM_POD, SOCK_CONNECT4].map(|p| crate::prog_stats(&ctx.w, node, p));
        let conns = timed_connections(ctx.pod(Var::Rivet, 2), dst, sample, None);
        let after = [FROM_POD, SOCK_CONNECT4].map(|p| crate::prog_stats(&ctx.w, node, p));
        assert!(!conns.is_empty(), "rivet: no {what} connection at N={n}");
        for ((prog, b), a) in [FROM_POD, SOCK_CONNECT4].iter().zip(before).zip(after) {
            crate::record_prog_runs(
                report,
                "rivet",
                prog,
                (b, a),
                &format!("bpf_{prog}_ns_per_run_{what}_n{n}"),
                &format!("bpf_{prog}_runs_per_conn_{what}_n{n}"),
                conns.len() as f64,
            );
        }
    }
    drop(stats);
}

/// rivet alone, after the interleaved one-more-Service samples: one more
/// Service per index of `probes` ([`probe`]), each timed from its frontend's map
/// write to its first answered connection (`one_service_map_to_answer_ms`,
/// see [`map_to_answer`]).
fn map_samples(
    ctx: &Ctx,
    n: usize,
    probes: std::ops::Range<usize>,
    step: &dyn Fn(&str),
    applied: &mut Applied,
    report: &mut Report,
    notes: &mut Vec<String>,
) {
    let metric = format!("one_service_map_to_answer_ms_n{n}");
    report.better.insert(metric.clone(), "lower".into());
    let count = probes.len();
    let mut seen = Vec::with_capacity(count);
    for (i, k) in probes.enumerate() {
        step(&format!(
            "N={n} one more Service, map write to answer {}/{count} rivet",
            i + 1
        ));
        let svc = probe(k, &ctx.backends(Var::Rivet), &ctx.node_name(Var::Rivet));
        let s = map_to_answer(ctx, &svc);
        applied.rivet.push(svc);
        report.add(&metric, "rivet", s.write_to_answer_ms());
        seen.push(s);
    }
    let ms = |f: &dyn Fn(&MapSeen) -> f64| -> (f64, f64) {
        let v: Vec<f64> = seen.iter().map(f).collect();
        (percentile(&v, 50.0), percentile(&v, 99.0))
    };
    let since = |a: Instant, b: Instant| a.saturating_duration_since(b).as_secs_f64() * 1e3;
    let bracket = ms(&|s| since(s.present, s.absent));
    let write = ms(&|s| since(s.present, s.start));
    let total = ms(&|s| since(s.answered, s.start));
    notes.push(format!(
        "one_service_map_to_answer_ms_n{n} (rivet alone, after the interleaved samples): {count} more Services, each applied with `rivetctl apply -f -` while the client pod starts a non-blocking connect to its ClusterIP every {} µs (several in flight; before the write their SYNs leave untranslated) and a thread reads the pinned SVC_FRONTENDS for its frontend every {} µs (the frontend is the last entry of a Service written, after its backends); from the last read that did not see it (the write came after: an upper bound) to the first connection answered. The write lies within a window of {:.3} ms p50, {:.3} ms p99 between that read and the first that saw it; from the apply's start the frontend was seen after {:.1} ms p50 ({:.1} p99) and the first connection answered after {:.1} ms p50 ({:.1} p99)",
        MAP_PACING.every.as_micros(),
        MAP_POLL.as_micros(),
        bracket.0,
        bracket.1,
        write.0,
        write.1,
        total.0,
        total.1,
    ));
}

/// The goals, stated as met or not with the figures (not asserted).
fn goals(report: &mut Report, sizes: &[usize], update_n: usize) {
    let med = |metric: &str, v: &str| {
        report
            .metrics
            .get(metric)
            .and_then(|m| m.get(v))
            .map_or(f64::NAN, crate::Series::median)
    };
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    let mut lines = Vec::new();
    let (first, last) = (
        sizes.iter().copied().min().unwrap_or(1),
        sizes.iter().copied().max().unwrap_or(1),
    );
    let a = med(&format!("cluster_connect_p50_us_n{first}"), "rivet");
    let b = med(&format!("cluster_connect_p50_us_n{last}"), "rivet");
    lines.push(format!(
        "goal: rivet ClusterIP connect p50 at N={last} within 5 % of N={first}: {:.1} vs {:.1} µs ({:+.1} %) — {}",
        b,
        a,
        (b / a - 1.0) * 100.0,
        verdict(b <= a * 1.05)
    ));
    for &n in sizes.iter().filter(|&&n| n >= 1000) {
        // What each variant's ClusterIP connect takes over rivet's
        // pod-IP connect (no Service, no netfilter: the floor). A
        // kube-proxy node's own pod-IP connect walks KUBE-SERVICES too
        // (every new flow does), so it is no floor.
        for q in ["p50", "p99"] {
            let floor = med(&format!("podip_connect_{q}_us_n{n}"), "rivet");
            let over = |v: &str| med(&format!("cluster_connect_{q}_us_n{n}"), v) - floor;
            lines.push(format!(
                "floor: connect {q} at N={n} by pod IP on rivet's node {floor:.1} µs; a ClusterIP connect takes over it: rivet {:+.1}, iptables {:+.1}, nftables {:+.1} µs; rivet ≤ 0.5 × iptables needs iptables to take at least the floor plus twice rivet's share over it",
                over("rivet"),
                over("iptables"),
                over("nftables"),
            ));
        }
        for what in ["cluster", "nodeport"] {
            for q in ["p50", "p99"] {
                let metric = format!("{what}_connect_{q}_us_n{n}");
                let (r, i, f) = (
                    med(&metric, "rivet"),
                    med(&metric, "iptables"),
                    med(&metric, "nftables"),
                );
                lines.push(format!(
                    "goal: {metric}: rivet {r:.1} µs ≤ 0.5 × iptables {i:.1} ({:.2}×) — {}; ≤ 1.0 × nftables {f:.1} ({:.2}×) — {}",
                    r / i,
                    verdict(r <= 0.5 * i),
                    r / f,
                    verdict(r <= f)
                ));
            }
        }
    }
    if let Some(s) = report
        .metrics
        .get("clusterip_over_podip_share")
        .and_then(|m| m.get("rivet"))
    {
        let r = s.median();
        lines.push(format!(
            "goal: rivet ClusterIP throughput ≥ 0.98 × pod IP: {r:.3} (median of the rounds' ratios) — {}",
            verdict(r >= 0.98)
        ));
    }
    for (metric, what, limit_ms, digits) in [
        (
            "one_service_visible_ms",
            "through `rivetctl apply`",
            50.0,
            1,
        ),
        (
            "one_service_map_to_answer_ms",
            "after its map write",
            1.0,
            3,
        ),
    ] {
        if let Some(s) = report
            .metrics
            .get(&format!("{metric}_n{update_n}"))
            .and_then(|m| m.get("rivet"))
        {
            let p99 = percentile(&s.samples, 99.0);
            lines.push(format!(
                "goal: one Service visible {what} at N={update_n} ≤ {limit_ms} ms p99: {p99:.digits$} ms (p50 {:.digits$}) — {}",
                s.median(),
                verdict(p99 <= limit_ms)
            ));
        }
    }
    let rss = med(
        "agent_rss_mib (10,000 Services x 10 backends, after apply)",
        "rivet",
    );
    lines.push(format!(
        "goal: agent RSS at 10,000 Services × 10 backends ≤ 150 MiB: {rss:.1} MiB — {}",
        verdict(rss <= 150.0)
    ));
    report.notes.extend(lines);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two() -> [Ipv4Addr; 2] {
        [Ipv4Addr::new(10, 1, 0, 2), Ipv4Addr::new(10, 1, 0, 3)]
    }

    #[test]
    fn ansi_stripped() {
        assert_eq!(strip_ansi("\x1b[2mms\x1b[0m=5 ok"), "ms=5 ok");
    }

    #[test]
    fn hashes_have_kube_proxy_shape() {
        let h = name_hash("bench/svc-00001:httptcp", 16);
        assert_eq!(h.len(), 16);
        assert!(
            h.chars()
                .all(|c| c.is_ascii_uppercase() || ('2'..='7').contains(&c))
        );
        assert_ne!(h, name_hash("bench/svc-00002:httptcp", 16));
    }

    #[test]
    fn iptables_rules_put_the_measured_service_last() {
        let set = service_set(3, &two(), "n1");
        let rules = iptables_sync(&set, &[], "10.1.0.0/24", false);
        let full = iptables_sync(&set, &[], "10.1.0.0/24", true);
        assert!(full.contains("*nat\n:PREROUTING ACCEPT [0:0]\n"), "{full}");
        assert!(full.contains(
            "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"
        ));
        assert!(full.contains(
            "-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD"
        ));
        assert!(!rules.contains("-A PREROUTING"));
        let services: Vec<&str> = rules
            .lines()
            .filter(|l| l.starts_with("-A KUBE-SERVICES"))
            .collect();
        assert_eq!(services.len(), 2 + 1 + 2 + 1, "{rules}");
        assert!(
            services[4].contains("10.97.0.10 --dport 80 "),
            "{}",
            services[4]
        );
        assert!(services[5].contains("KUBE-NODEPORTS"));
        assert!(rules.contains("--probability 0.5000000000 -j KUBE-SEP-"));
        assert!(rules.contains("-A KUBE-NODEPORTS -m comment --comment bench/measured:http -m tcp -p tcp --dport 30080 -j KUBE-EXT-"));
        // Every chain a rule names is declared.
        for l in rules.lines().filter(|l| l.starts_with("-A ")) {
            let chain = l.split_whitespace().nth(1).expect("test value");
            assert!(
                rules.contains(&format!(":{chain} - [0:0]")),
                "{chain} undeclared"
            );
        }
    }

    #[test]
    fn nft_service_names_its_endpoint_chains_first() {
        let set = service_set(1, &two(), "n1");
        let mut text = String::new();
        nft_service(&set[1], "10.1.0.0/24", &mut text);
        let first_ep = text
            .find("add chain ip kube-proxy endpoint-")
            .expect("test value");
        let svc = text
            .find("add chain ip kube-proxy service-")
            .expect("test value");
        assert!(first_ep < svc);
        assert!(text.contains("numgen random mod 2 vmap { 0 : goto endpoint-"));
        assert!(text.contains("service-nodeports { tcp . 30080 : goto external-"));
        assert!(text.contains("dnat to 10.1.0.3:5353"));
    }

    #[test]
    fn documents_hold_a_service_and_a_slice_each() {
        let set = service_set(2, &two(), "n1");
        let doc: Value = serde_json::from_str(&list_document(&set)).expect("test value");
        let items = doc["items"].as_array().expect("test value");
        assert_eq!(items.len(), 6);
        assert_eq!(items[4]["spec"]["type"], "NodePort");
        assert_eq!(items[4]["spec"]["ports"][1]["nodePort"], 30080);
        assert_eq!(
            items[5]["endpoints"].as_array().expect("test value").len(),
            2
        );
    }
}
