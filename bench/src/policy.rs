//! Kubernetes NetworkPolicy against the number of rules: rivet's per-pod
//! BPF tries (the objects applied with `rivetctl apply -f`) vs the same
//! pods without a policy vs iptables + ipset in kube-router's layout (a
//! per-pod chain jumped to from `FORWARD`, one `-m set --match-set <set>
//! src` rule per NetworkPolicy rule, one ipset per rule), measured side
//! by side, interleaved, in one run.
//!
//! Layout, the same for every variant: one node with a destination pod
//! (`bench/dst`, app=dst: a 1-byte TCP server on 8080, iperf3 on 5201), a
//! client pod (`bench/client`, app=client) and a pod no rule allows
//! (`bench/other`, app=other). rivet's two nodes run `rivetd` (pods
//! through the agent with their Kubernetes identity); the iptables node
//! is a plain node whose pods the reference `ptp` plugin attached
//! (host-local, no masquerade), so pod-to-pod traffic crosses the node's
//! `FORWARD` hook and nothing of rivet's.
//!
//! The N rules select `bench/dst` (policies of up to 100 ingress rules
//! each, one peer per rule, no ports), alternating an `ipBlock` (a /30
//! outside the cluster, none adjacent to another, so no two merge) and a
//! `podSelector` matching one Pod object of another node (a /32 in the
//! cluster, none adjacent); the client's rule (`podSelector: app=client`)
//! comes last — last in iptables' chain order too.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    io::Write as _,
    net::{Ipv4Addr, SocketAddr, TcpStream},
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use ipnet::Ipv4Net;
use serde_json::{Value, json};

use crate::{
    Options, Report,
    conn::{DENY_CONFIRM, Expect, Pacing, connection_loop, one_byte_server, probe},
    iperf3_cpu, percentile, progress, rss_mib,
};
use rivet_api::{Request, Response};
use rivet_tests::{
    Netns, World, bin,
    cni::{Plugin, result_ip},
    traffic::iperf3_server,
};

/// Namespace of every benchmark object.
const NAMESPACE: &str = "bench";
/// The destination's 1-byte server.
const PORT: u16 = 8080;
/// The destination's iperf3 server.
const IPERF_PORT: u16 = 5201;
/// Ingress rules per NetworkPolicy object.
const RULES_PER_POLICY: usize = 100;
/// The N at which one rule's change is measured (the largest size below
/// it in a smoke run).
const CHANGE_N: usize = 10_000;
/// Pod subnet of the iptables node (ptp + host-local).
const IPT_SUBNET: &str = "10.252.0.0/24";
/// First address of the ipBlock rules' /30s (outside the cluster).
const BLOCK_BASE: Ipv4Addr = Ipv4Addr::new(172, 16, 0, 0);
/// Third octet of the selector peers' addresses in the cluster CIDR
/// (10.k.64.0 on: no node of the world owns them).
const PEER_OCTET: u32 = 64;
/// How a change is probed: a new connection attempt every 1 ms; one not
/// connected after 20 ms counts as refused.
const PACING: Pacing = Pacing {
    every: Duration::from_millis(1),
    timeout: Duration::from_millis(20),
};

// ------------------------------------------------------------ the rules

/// One ingress rule of the benchmark policies (one peer each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rule {
    /// `ipBlock` number j: [`block`].
    Block(usize),
    /// `podSelector` matching Pod object `peer-j` (one /32).
    PeerPod(usize),
    /// `podSelector: app=client`, the allowed client, last.
    Client,
}

/// The N rules: N − 1 others alternating ipBlock and podSelector, then the
/// client's.
fn rule_list(n: usize) -> Vec<Rule> {
    (0..n.saturating_sub(1))
        .map(|i| {
            if i % 2 == 0 {
                Rule::Block(i / 2)
            } else {
                Rule::PeerPod(i / 2)
            }
        })
        .chain(std::iter::once(Rule::Client))
        .collect()
}

/// Peer Pod objects the N rules select.
fn peer_count(n: usize) -> usize {
    n.saturating_sub(1) / 2
}

/// ipBlock j: 172.16.0.0 + 8j / 30 (never adjacent to another).
fn block(j: usize) -> Ipv4Net {
    let a = Ipv4Addr::from(u32::from(BLOCK_BASE) + 8 * j as u32);
    Ipv4Net::new(a, 30).expect("a /30")
}

/// Pod object `peer-j`'s address: 10.k.64.0 + 2j (never adjacent to
/// another), in the cluster CIDR of `cluster` (10.k.0.0/16).
fn peer_ip(cluster: Ipv4Net, j: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(cluster.network()) + (PEER_OCTET << 8) + 2 * j as u32)
}

/// The rules in NetworkPolicy objects of [`RULES_PER_POLICY`]: (policy
/// name, its rules).
fn policy_chunks(rules: &[Rule]) -> Vec<(String, &[Rule])> {
    rules
        .chunks(RULES_PER_POLICY)
        .enumerate()
        .map(|(p, c)| (format!("rules-{p:03}"), c))
        .collect()
}

fn rule_json(rule: Rule, client_allowed: bool) -> Value {
    let peer = match rule {
        Rule::Block(j) => json!({"ipBlock": {"cidr": block(j).to_string()}}),
        Rule::PeerPod(j) => {
            json!({"podSelector": {"matchLabels": {"peer": format!("p{j:05}")}}})
        }
        Rule::Client => {
            let app = if client_allowed {
                "client"
            } else {
                "client-denied"
            };
            json!({"podSelector": {"matchLabels": {"app": app}}})
        }
    };
    json!({"from": [peer]})
}

/// One NetworkPolicy selecting the destination with `rules`.
fn policy_json(name: &str, rules: &[Rule], client_allowed: bool) -> Value {
    let ingress: Vec<Value> = rules
        .iter()
        .map(|&r| rule_json(r, client_allowed))
        .collect();
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "podSelector": {"matchLabels": {"app": "dst"}},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    })
}

fn list(items: Vec<Value>) -> String {
    serde_json::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": items}))
        .expect("JSON document")
}

/// Every policy of the N rules as one List.
fn policies_document(rules: &[Rule]) -> String {
    list(
        policy_chunks(rules)
            .into_iter()
            .map(|(name, c)| policy_json(&name, c, true))
            .collect(),
    )
}

/// The last policy (the one holding the client's rule), the client's rule
/// allowing it or not: the one-rule change.
fn last_policy_document(rules: &[Rule], client_allowed: bool) -> String {
    let chunks = policy_chunks(rules);
    let (name, c) = chunks.last().expect("at least one policy");
    list(vec![policy_json(name, c, client_allowed)])
}

fn pod_json(name: &str, labels: Value, ip: Ipv4Addr, node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "image": "busybox",
                            "ports": [{"name": "http", "containerPort": PORT}]}],
        },
        "status": {"podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}]},
    })
}

/// The Namespace, the node's three pods and the peer Pod objects the N
/// rules select (on another node), as one List.
fn objects_document(n: usize, cluster: Ipv4Net, local: &[(&str, Ipv4Addr)], node: &str) -> String {
    let mut items = vec![json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": NAMESPACE},
    })];
    for &(app, ip) in local {
        items.push(pod_json(app, json!({"app": app}), ip, node));
    }
    for j in 0..peer_count(n) {
        items.push(pod_json(
            &format!("peer-{j:05}"),
            json!({"role": "peer", "peer": format!("p{j:05}")}),
            peer_ip(cluster, j),
            "other-node",
        ));
    }
    list(items)
}

// -------------------------------------------------- kube-router's layout

/// A kube-router-shaped name: `prefix` + 16 characters of base32 of a
/// 128-bit hash of `text` (two FNV-1a passes; kube-router uses SHA-256 —
/// only the shape matters).
fn hashed(prefix: &str, text: &str) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let fnv = |seed: u64| {
        text.bytes().fold(seed, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    };
    let h = (u128::from(fnv(0xcbf2_9ce4_8422_2325)) << 64) | u128::from(fnv(0x6c62_272e_07bb_0142));
    let tail: String = (0..16)
        .map(|i| char::from(ALPHABET[((h >> (123 - 5 * i)) & 31) as usize]))
        .collect();
    format!("{prefix}{tail}")
}

/// The source set of rule `i` of policy `policy`.
fn set_name(policy: &str, i: usize) -> String {
    hashed("KUBE-SRC-", &format!("{NAMESPACE}/{policy}/ingress/{i}"))
}

/// The client rule's set.
fn client_set(rules: &[Rule]) -> String {
    let chunks = policy_chunks(rules);
    let (name, c) = chunks.last().expect("at least one policy");
    set_name(name, c.len() - 1)
}

/// `ipset restore` input: one set per rule, kube-router's types (hash:net
/// for an ipBlock, hash:ip for the pods a selector matched), each with its
/// member.
fn ipset_restore(rules: &[Rule], cluster: Ipv4Net, client: Ipv4Addr) -> String {
    let mut s = String::new();
    for (name, chunk) in policy_chunks(rules) {
        for (i, &r) in chunk.iter().enumerate() {
            let set = set_name(&name, i);
            let (kind, member) = match r {
                Rule::Block(j) => ("hash:net", block(j).to_string()),
                Rule::PeerPod(j) => ("hash:ip", peer_ip(cluster, j).to_string()),
                Rule::Client => ("hash:ip", client.to_string()),
            };
            let _ = writeln!(
                s,
                "create {set} {kind} family inet hashsize 1024 maxelem 65536\nadd {set} {member}"
            );
        }
    }
    s
}

/// The filter table as kube-router lays it out for one isolated pod
/// (simplified where it only adds rules): `FORWARD` →
/// `KUBE-ROUTER-FORWARD` → `-d <pod>` → the pod's `KUBE-POD-FW-` chain:
/// established and related flows accepted first, then a jump to each
/// policy's `KUBE-NWPLCY-` chain, then drop; in a policy chain one
/// `-m set --match-set <rule's set> src -j ACCEPT` per rule, in the
/// policy's order. One `iptables-restore` replaces the whole table, as
/// kube-router's full sync does.
fn iptables_table(rules: &[Rule], dst: Ipv4Addr) -> String {
    let pod_chain = hashed("KUBE-POD-FW-", &format!("{NAMESPACE}/dst"));
    let chunks = policy_chunks(rules);
    let mut s = String::from(
        "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-ROUTER-FORWARD - [0:0]\n",
    );
    let _ = writeln!(s, ":{pod_chain} - [0:0]");
    let policy_chains: Vec<String> = chunks
        .iter()
        .map(|(name, _)| hashed("KUBE-NWPLCY-", &format!("{NAMESPACE}/{name}")))
        .collect();
    for c in &policy_chains {
        let _ = writeln!(s, ":{c} - [0:0]");
    }
    s.push_str("-A FORWARD -m comment --comment \"kube-router netpol\" -j KUBE-ROUTER-FORWARD\n");
    let _ = writeln!(
        s,
        "-A KUBE-ROUTER-FORWARD -d {dst}/32 -m comment --comment \"rule to jump traffic destined to POD name:dst namespace: {NAMESPACE} to chain {pod_chain}\" -j {pod_chain}\n\
         -A {pod_chain} -m conntrack --ctstate RELATED,ESTABLISHED -m comment --comment \"rule for stateful firewall for pod\" -j ACCEPT"
    );
    for ((name, _), c) in chunks.iter().zip(&policy_chains) {
        let _ = writeln!(
            s,
            "-A {pod_chain} -m comment --comment \"run through nw policy {name}\" -j {c}"
        );
    }
    let _ = writeln!(
        s,
        "-A {pod_chain} -m comment --comment \"default deny: no policy allows\" -j DROP"
    );
    for ((name, chunk), c) in chunks.iter().zip(&policy_chains) {
        for i in 0..chunk.len() {
            let _ = writeln!(
                s,
                "-A {c} -m comment --comment \"rule to ACCEPT traffic from source pods to dest pods selected by policy name {name} namespace {NAMESPACE}\" -m set --match-set {} src -j ACCEPT",
                set_name(name, i)
            );
        }
    }
    s.push_str("COMMIT\n");
    s
}

/// The filter table with no rule (between sizes).
const IPTABLES_EMPTY: &str =
    "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n";

// ------------------------------------------------------------ commands

/// Runs `tool args` in `ns` with `input` on stdin (spawned from a thread
/// inside the namespace: one exec, as the tool runs on a node); its wall
/// time in ms, process start included.
fn feed(ns: &Netns, tool: &str, args: &[&str], input: &str) -> f64 {
    let (ms, out) = ns.exec(|| {
        let t = Instant::now();
        let mut child = Command::new(tool)
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
        (t.elapsed().as_secs_f64() * 1e3, out)
    });
    assert!(
        out.status.success(),
        "{tool} {args:?} in {} failed: {}",
        ns.name(),
        String::from_utf8_lossy(&out.stderr)
    );
    ms
}

/// Runs `rivetctl --socket <socket> ARGS` with `stdin`; panics with its
/// words when it fails. Returns its wall time in ms.
fn rivetctl(socket: &Path, args: &[&str], stdin: &str) -> f64 {
    let t = Instant::now();
    let mut child = Command::new(bin("rivetctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning rivetctl");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("rivetctl's stdin");
    let out = child.wait_with_output().expect("rivetctl");
    let ms = t.elapsed().as_secs_f64() * 1e3;
    assert!(
        out.status.success(),
        "rivetctl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ms
}

/// `text` without ANSI escape sequences (the agent's log may be coloured).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
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

/// CPU time of every thread of process `pid` so far, in ns (the
/// scheduler's run time, `/proc/<pid>/task/*/schedstat`).
fn process_cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| {
            std::fs::read_to_string(t.path().join("schedstat"))
                .ok()?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

// ------------------------------------------------------------ the nodes

/// A plain node whose three pods (client, dst, other) the reference `ptp`
/// plugin attached (host-local IPAM, no masquerade).
struct PtpNode {
    node: usize,
    pods: Vec<Netns>,
    ips: Vec<Ipv4Addr>,
}

fn ptp_node(w: &mut World, tag: &str, subnet: &str) -> PtpNode {
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
    PtpNode { node, pods, ips }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Var {
    Rivet,
    NoPolicy,
    Ipt,
}

const VARIANTS: [Var; 3] = [Var::Rivet, Var::NoPolicy, Var::Ipt];

impl Var {
    const fn name(self) -> &'static str {
        match self {
            Self::Rivet => "rivet",
            Self::NoPolicy => "rivet-nopolicy",
            Self::Ipt => "iptables+ipset",
        }
    }
}

/// The three pods of every node, in this order.
const CLIENT: usize = 0;
const DST: usize = 1;
const OTHER: usize = 2;
const APPS: [&str; 3] = ["client", "dst", "other"];

struct Ctx {
    w: World,
    /// rivet's nodes: with the policies, without.
    rivet_node: usize,
    nopolicy_node: usize,
    /// Their pods, by [`APPS`].
    rivet_pods: [usize; 3],
    nopolicy_pods: [usize; 3],
    ipt: PtpNode,
    /// rivet's cluster CIDR (the peer Pod objects' addresses).
    cluster: Ipv4Net,
}

impl Ctx {
    fn pod(&self, v: Var, i: usize) -> &Netns {
        match v {
            Var::Rivet => &self.w.pods[self.rivet_pods[i]].ns,
            Var::NoPolicy => &self.w.pods[self.nopolicy_pods[i]].ns,
            Var::Ipt => &self.ipt.pods[i],
        }
    }

    fn pod_ip(&self, v: Var, i: usize) -> Ipv4Addr {
        match v {
            Var::Rivet => self.w.pods[self.rivet_pods[i]].ip,
            Var::NoPolicy => self.w.pods[self.nopolicy_pods[i]].ip,
            Var::Ipt => self.ipt.ips[i],
        }
    }

    fn node_ns(&self, v: Var) -> &Netns {
        let n = match v {
            Var::Rivet => self.rivet_node,
            Var::NoPolicy => self.nopolicy_node,
            Var::Ipt => self.ipt.node,
        };
        &self.w.nodes[n].ns
    }

    /// The agent's pid of a rivet variant.
    fn agent_pid(&self, v: Var) -> Option<u32> {
        let n = match v {
            Var::Rivet => self.rivet_node,
            Var::NoPolicy => self.nopolicy_node,
            Var::Ipt => return None,
        };
        self.w.nodes[n].agent().pid()
    }

    fn socket(&self, v: Var) -> &Path {
        let n = match v {
            Var::NoPolicy => self.nopolicy_node,
            _ => self.rivet_node,
        };
        self.w.nodes[n].agent().socket()
    }

    fn dst(&self, v: Var) -> SocketAddr {
        SocketAddr::from((self.pod_ip(v, DST), PORT))
    }

    fn spaces(&self) -> impl Iterator<Item = &Netns> {
        crate::world_spaces(&self.w).chain(self.ipt.pods.iter())
    }

    /// The last line of the policy agent's log that says `what`.
    fn agent_log_line(&self, what: &str) -> String {
        self.w.nodes[self.rivet_node]
            .agent()
            .log()
            .lines()
            .rev()
            .find(|l| l.contains(what))
            .map(|l| strip_ansi(l.trim()))
            .unwrap_or_default()
    }

    /// The peer prefixes the agent holds for `bench/dst`'s ingress (None:
    /// not isolated).
    fn dst_prefixes(&self) -> Option<usize> {
        let answer = self.w.nodes[self.rivet_node]
            .agent()
            .client()
            .call(&Request::Policy {
                pod: Some(format!("{NAMESPACE}/dst")),
            });
        match answer {
            Ok(Response::Policy(list)) => list
                .pods
                .iter()
                .find(|p| p.name == "dst")
                .and_then(|p| p.ingress.as_ref())
                .map(|rules| rules.iter().map(|r| r.peers.len()).sum()),
            other => panic!("rivetctl policy bench/dst: {other:?}"),
        }
    }
}

/// What a failed probe's message shows: the node's rules and sets (the
/// first 100 lines), addresses and routes.
fn diagnose(ctx: &Ctx, v: Var) -> String {
    let node = ctx.node_ns(v);
    let show = |ns: &Netns, tool: &str, args: &[&str]| {
        let out = ns.output(tool, args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        format!(
            "--- {tool} {} in {}\n{}\n",
            args.join(" "),
            ns.name(),
            text.lines().take(100).collect::<Vec<_>>().join("\n")
        )
    };
    let mut text = match v {
        Var::Ipt => show(node, "iptables-save", &[]) + &show(node, "ipset", &["list", "-t"]),
        _ => String::new(),
    };
    text += &show(node, "ip", &["-4", "addr"]);
    text += &show(node, "ip", &["route"]);
    text += &show(ctx.pod(v, CLIENT), "ip", &["route"]);
    text
}

// ------------------------------------------------------------ probes

/// When a probed change showed.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Seen {
    /// This many ms after the change started.
    After(f64),
    /// This many ms before the change started (a denial: an attempt
    /// started before the change whose SYN was judged after it took
    /// effect, queued behind the rules' work; an answer: the state before
    /// the change was not the one expected).
    Early(f64),
    /// Not within the probe's limit.
    Never,
}

/// Runs `change` while the client pod of `v` probes the destination (see
/// [`probe`]): when the attempts showed `expect` (see [`decided`]),
/// relative to the change's start.
fn time_to(ctx: &Ctx, v: Var, expect: Expect, change: impl FnOnce()) -> Seen {
    let SocketAddr::V4(dst) = ctx.dst(v) else {
        unreachable!("IPv4 pods")
    };
    let ns = ctx.pod(v, CLIENT);
    std::thread::scope(|scope| {
        let prober =
            scope.spawn(|| ns.exec(move || probe(dst, expect, PACING, Duration::from_secs(60)).0));
        // The prober is in its loop (and has seen the state before) when
        // the change starts.
        std::thread::sleep(Duration::from_millis(30));
        let t0 = Instant::now();
        change();
        match prober.join().ok().flatten() {
            None => Seen::Never,
            Some(seen) if seen < t0 => Seen::Early(t0.duration_since(seen).as_secs_f64() * 1e3),
            Some(seen) => Seen::After(seen.duration_since(t0).as_secs_f64() * 1e3),
        }
    })
}

/// Whether one TCP connection from `ns` to `dst` is answered within
/// 300 ms.
fn connects(ns: &Netns, dst: SocketAddr) -> bool {
    ns.exec(move || TcpStream::connect_timeout(&dst, Duration::from_millis(300)).is_ok())
}

// ------------------------------------------------------------ the run

/// Programs the N rules on variant `v`: rivet one `rivetctl apply -f` of
/// the policies (after deleting the previous size's and applying the
/// Pod objects, untimed); iptables one `ipset restore` of every set plus
/// one `iptables-restore` of the filter table (after emptying both,
/// untimed). Returns the timed step's ms (None for rivet-nopolicy, which
/// gets the Pod objects alone).
fn program(
    ctx: &Ctx,
    v: Var,
    n: usize,
    previous: Option<usize>,
    notes: &mut Vec<String>,
) -> Option<f64> {
    let rules = rule_list(n);
    match v {
        Var::Rivet | Var::NoPolicy => {
            let socket = ctx.socket(v);
            let node = match v {
                Var::Rivet => &ctx.w.nodes[ctx.rivet_node],
                _ => &ctx.w.nodes[ctx.nopolicy_node],
            };
            let local: Vec<(&str, Ipv4Addr)> = APPS
                .iter()
                .enumerate()
                .map(|(i, app)| (*app, ctx.pod_ip(v, i)))
                .collect();
            if v == Var::Rivet
                && let Some(p) = previous
            {
                let ms = rivetctl(
                    socket,
                    &["delete", "-f", "-"],
                    &policies_document(&rule_list(p)),
                );
                notes.push(format!(
                    "rivet: deleting the policies of N={p} took {ms:.0} ms (untimed)"
                ));
            }
            let objects = objects_document(n, ctx.cluster, &local, &node.name);
            let ms = rivetctl(socket, &["apply", "-f", "-"], &objects);
            notes.push(format!(
                "{}: N={n}: the Namespace and {} Pod objects ({:.2} MiB) applied in {ms:.0} ms (untimed)",
                v.name(),
                3 + peer_count(n),
                objects.len() as f64 / f64::from(1 << 20),
            ));
            if v == Var::NoPolicy {
                return None;
            }
            let doc = policies_document(&rules);
            let ms = rivetctl(socket, &["apply", "-f", "-"], &doc);
            notes.push(format!(
                "rivet: N={n}: {} NetworkPolicies ({:.2} MiB) applied in {ms:.0} ms; agent: {}; {}; {}",
                n.div_ceil(RULES_PER_POLICY),
                doc.len() as f64 / f64::from(1 << 20),
                ctx.agent_log_line("network policy planned and applied"),
                ctx.agent_log_line("objects checked"),
                ctx.agent_log_line("objects applied")
            ));
            Some(ms)
        }
        Var::Ipt => {
            let ns = ctx.node_ns(v);
            feed(ns, "iptables-restore", &[], IPTABLES_EMPTY);
            ns.run("ipset", &["destroy"]);
            let client = ctx.pod_ip(v, CLIENT);
            let sets = ipset_restore(&rules, ctx.cluster, client);
            let table = iptables_table(&rules, ctx.pod_ip(v, DST));
            let ipset_ms = feed(ns, "ipset", &["restore"], &sets);
            let ipt_ms = feed(ns, "iptables-restore", &[], &table);
            notes.push(format!(
                "iptables+ipset: N={n}: `ipset restore` of {n} sets {ipset_ms:.0} ms + `iptables-restore` of the filter table ({} rules) {ipt_ms:.0} ms",
                table.lines().filter(|l| l.starts_with("-A ")).count()
            ));
            Some(ipset_ms + ipt_ms)
        }
    }
}

/// Runs the benchmark at these numbers of rules.
pub fn run(opts: &Options, sizes: &[usize]) -> Report {
    let started = Instant::now();
    let step = |what: &str| {
        progress(&format!(
            "policy: {what} [{:.0}s]",
            started.elapsed().as_secs_f64()
        ));
    };
    step("setting up");
    let mut w = World::new();
    let rivet_node = w.add_node();
    w.start_agent(rivet_node);
    let nopolicy_node = w.add_node();
    w.start_agent(nopolicy_node);
    let rivet_pods = APPS.map(|app| w.add_k8s_pod(rivet_node, NAMESPACE, app));
    let nopolicy_pods = APPS.map(|app| w.add_k8s_pod(nopolicy_node, NAMESPACE, app));
    let ipt = ptp_node(&mut w, "ipt", IPT_SUBNET);
    let cluster: Ipv4Net = w.nodes[rivet_node]
        .agent_args
        .cluster_cidr
        .parse()
        .expect("cluster CIDR");
    let ctx = Ctx {
        w,
        rivet_node,
        nopolicy_node,
        rivet_pods,
        nopolicy_pods,
        ipt,
        cluster,
    };
    // The same settings in every namespace of every variant; the client
    // may reuse TIME_WAIT ports.
    let kernel_at_setup = crate::bridge_nf_off(ctx.spaces());
    for v in VARIANTS {
        ctx.pod(v, CLIENT)
            .run("sysctl", &["-qw", "net.ipv4.tcp_tw_reuse=1"]);
        one_byte_server(ctx.pod(v, DST), PORT);
    }

    let mut report = Report {
        name: "policy vs number of rules".into(),
        variants: VARIANTS.iter().map(|v| v.name().to_owned()).collect(),
        baseline: Var::NoPolicy.name().into(),
        ..Default::default()
    };
    let sample = opts.pick(
        Duration::from_secs_f64(f64::from(opts.secs) * 0.2),
        Duration::from_millis(300),
    );
    let warm = Duration::from_millis(200);
    let secs = sample.as_secs_f64();
    let change_samples = opts.pick(20, 5);
    let change_n = sizes
        .iter()
        .copied()
        .filter(|&n| n <= CHANGE_N)
        .max()
        .unwrap_or(CHANGE_N);
    let mut notes = Vec::new();
    let mut counts: BTreeMap<(usize, Var), usize> = BTreeMap::new();
    let mut previous = None;

    for &n in sizes {
        let m = |base: &str| format!("{base}_n{n}");
        for base in [
            "connect_p50_us",
            "connect_p99_us",
            "program_ms",
            "agent_rss_mib",
            "agent_cpu_us_per_conn",
        ] {
            report.better.insert(m(base), "lower".into());
        }
        for base in ["conns_per_s", "throughput_gbps"] {
            report.better.insert(m(base), "higher".into());
        }
        // Programming, in the listed order (each variant's own node).
        for v in VARIANTS {
            step(&format!("N={n} programming {}", v.name()));
            if let Some(ms) = program(&ctx, v, n, previous, &mut notes) {
                report.add(&m("program_ms"), v.name(), ms);
            }
        }
        previous = Some(n);
        if let Some(pid) = ctx.w.nodes[ctx.rivet_node].agent().pid() {
            report.add(&m("agent_rss_mib"), "rivet", rss_mib(pid));
        }
        // What the agent holds for the destination: one prefix per rule.
        let prefixes = ctx.dst_prefixes();
        assert_eq!(
            prefixes,
            Some(n),
            "rivet: bench/dst's ingress peers at N={n}"
        );
        // Enforced: the client reaches the destination, the other pod
        // does not (rivet-nopolicy: it does).
        step(&format!("N={n} warm-up"));
        for v in VARIANTS {
            let lat = connection_loop(ctx.pod(v, CLIENT), ctx.dst(v), warm);
            assert!(
                !lat.is_empty(),
                "{}: the client got no connection to the destination at N={n}\n{}",
                v.name(),
                diagnose(&ctx, v)
            );
            let other = connects(ctx.pod(v, OTHER), ctx.dst(v));
            assert_eq!(
                other,
                v == Var::NoPolicy,
                "{}: a pod no rule allows {} the destination at N={n}\n{}",
                v.name(),
                if other { "reaches" } else { "does not reach" },
                diagnose(&ctx, v)
            );
        }
        notes.push(format!(
            "N={n}: checked before the rounds: the agent holds {n} peer prefixes for bench/dst's ingress; from a pod no rule allows, the destination does not answer (rivet, iptables+ipset) or answers (rivet-nopolicy)"
        ));
        for round in 0..opts.rounds {
            for v in crate::rotated(&VARIANTS, round as usize) {
                let name = v.name();
                step(&format!("N={n} round {}/{} {name}", round + 1, opts.rounds));
                let pid = ctx.agent_pid(v);
                let cpu_before = pid.map(process_cpu_ns);
                let lat = connection_loop(ctx.pod(v, CLIENT), ctx.dst(v), sample);
                assert!(!lat.is_empty(), "{name}: no connection succeeded at N={n}");
                if let (Some(pid), Some(before)) = (pid, cpu_before) {
                    let ns = process_cpu_ns(pid).saturating_sub(before);
                    report.add(
                        &m("agent_cpu_us_per_conn"),
                        name,
                        ns as f64 / 1e3 / lat.len() as f64,
                    );
                }
                report.add(&m("connect_p50_us"), name, percentile(&lat, 50.0));
                report.add(&m("connect_p99_us"), name, percentile(&lat, 99.0));
                report.add(&m("conns_per_s"), name, lat.len() as f64 / secs);
                *counts.entry((n, v)).or_default() += lat.len();
                let _server = iperf3_server(ctx.pod(v, DST), IPERF_PORT, Some(1));
                let s = iperf3_cpu(
                    ctx.pod(v, CLIENT),
                    ctx.pod_ip(v, DST),
                    IPERF_PORT,
                    opts.secs,
                    None,
                );
                report.add(&m("throughput_gbps"), name, s.bits_per_second / 1e9);
            }
        }

        if n == change_n {
            one_rule_changes(&ctx, &mut report, &mut notes, n, change_samples, &step);
        }
    }
    progress(&format!(
        "policy: done in {:.0}s\n",
        started.elapsed().as_secs_f64()
    ));

    for ((n, v), c) in &counts {
        notes.push(format!(
            "{}: N={n}: {c} connections in the measured samples",
            v.name()
        ));
    }
    report.notes.push(format!(
        "layout: per variant one node with a destination pod (1-byte TCP server on {PORT}, iperf3 on {IPERF_PORT}), a client pod and a pod no rule allows; rivet and rivet-nopolicy: rivetd's pods attached with their Kubernetes identity (bench/client, bench/dst, bench/other), the same Namespace and Pod objects on both, the NetworkPolicies only on `rivet`; iptables+ipset: the reference ptp plugin + host-local (no masquerade), the filter in the node namespace's FORWARD hook. {} rounds of {secs} s connection samples and {} s iperf3 samples per N after a {} s warm-up of each variant, interleaved",
        opts.rounds,
        opts.secs,
        warm.as_secs_f64()
    ));
    report.notes.push(format!(
        "rules: N ingress rules selecting bench/dst (NetworkPolicies of {RULES_PER_POLICY} rules, one peer each, no ports): N − 1 alternating an ipBlock (172.16.0.0 + 8j / 30, outside the cluster, none adjacent) and a podSelector matching one Pod object of another node (peer-j, address 10.k.{PEER_OCTET}.0 + 2j, none adjacent), then the client's (podSelector app=client), last in the last policy and last in iptables' order"
    ));
    report.notes.push("iptables+ipset: kube-router's layout, one ipset per rule (hash:net for an ipBlock, hash:ip for the pods a selector matched; hashsize 1024): FORWARD → KUBE-ROUTER-FORWARD → `-d <dst>` → KUBE-POD-FW-<hash>: `-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT` first, a jump to each policy's KUBE-NWPLCY-<hash> chain, then DROP; in a policy chain one `-m set --match-set KUBE-SRC-<hash> src -j ACCEPT` per rule. Simplified in the peer's favour: kube-router also matches the destination set in each rule and marks then returns instead of accepting (two rules per NetworkPolicy rule). iptables-nft 1.8.9 (the system's)".into());
    report.notes.push("connect_*: connect + 1-byte exchange + close from the client pod to the destination pod's address, one connection at a time, each a fresh connection (a new flow, judged by the rules); throughput_gbps: iperf3 single stream, client on CPU 0, server on CPU 1, client pod → destination pod; agent_cpu_us_per_conn: the node's rivetd CPU time over a connection sample (every thread's scheduler run time, /proc/<pid>/task/*/schedstat) ÷ the sample's connections".into());
    report.notes.push("program_ms: rivet = `rivetctl apply -f -` of one List with the N rules' NetworkPolicies, process start included (after a `rivetctl delete -f` of the previous size's policies and an apply of the Namespace and Pod objects, both untimed, so each figure is the policies going from none to N); iptables+ipset = one `ipset restore` creating every set with its member + one `iptables-restore` replacing the filter table (kube-router's full sync), after emptying both (untimed)".into());
    report.notes.extend(notes);
    goals(&mut report, sizes, change_n);
    let kernel_at_end = crate::bridge_nf_read(ctx.spaces());
    report.set_kernel_settings(kernel_at_setup, &kernel_at_end);
    report.notes.push(format!(
        "order: {} (per N for the rounds, per sample for the one-rule changes; programming and warm-ups in the listed order)",
        crate::ROTATION
    ));
    report
}

/// One rule changed at N = `n`, `samples` times per variant, interleaved
/// and rotated: the client's rule made to deny it, then to allow it again,
/// each timed from the change's start to the first connection attempt
/// that shows it.
fn one_rule_changes(
    ctx: &Ctx,
    report: &mut Report,
    notes: &mut Vec<String>,
    n: usize,
    samples: usize,
    step: &dyn Fn(&str),
) {
    let rules = rule_list(n);
    let deny_doc = last_policy_document(&rules, false);
    let allow_doc = last_policy_document(&rules, true);
    let set = client_set(&rules);
    let ipt_client = ctx.pod_ip(Var::Ipt, CLIENT).to_string();
    let deny_metric = format!("one_rule_deny_visible_ms_n{n}");
    let allow_metric = format!("one_rule_allow_visible_ms_n{n}");
    let apply_metric = format!("one_rule_apply_ms_n{n}");
    for m in [&deny_metric, &allow_metric, &apply_metric] {
        report.better.insert(m.clone(), "lower".into());
    }
    let changed = [Var::Rivet, Var::Ipt];
    let mut early: BTreeMap<Var, usize> = BTreeMap::new();
    for k in 0..samples {
        for v in crate::rotated(&changed, k) {
            for (expect, metric) in [
                (Expect::Closed, &deny_metric),
                (Expect::Open, &allow_metric),
            ] {
                step(&format!(
                    "N={n} one rule changed {}/{samples} {} ({})",
                    k + 1,
                    v.name(),
                    if expect == Expect::Closed {
                        "deny"
                    } else {
                        "allow"
                    }
                ));
                let mut apply_ms = f64::NAN;
                let visible = match v {
                    Var::Rivet => {
                        let doc = if expect == Expect::Closed {
                            &deny_doc
                        } else {
                            &allow_doc
                        };
                        let socket = ctx.socket(v);
                        time_to(ctx, v, expect, || {
                            apply_ms = rivetctl(socket, &["apply", "-f", "-"], doc);
                        })
                    }
                    _ => {
                        let verb = if expect == Expect::Closed {
                            "del"
                        } else {
                            "add"
                        };
                        let ns = ctx.node_ns(v);
                        time_to(ctx, v, expect, || {
                            apply_ms = feed(ns, "ipset", &[verb, &set, &ipt_client], "");
                        })
                    }
                };
                let ms = match visible {
                    Seen::After(ms) => Some(ms),
                    // Within one probe timeout: the change took effect
                    // while an attempt's SYN waited to be judged.
                    Seen::Early(before)
                        if expect == Expect::Closed
                            && before < PACING.timeout.as_secs_f64() * 1e3 =>
                    {
                        *early.entry(v).or_default() += 1;
                        Some(0.0)
                    }
                    other => {
                        notes.push(format!(
                            "{}: one rule changed, sample {} ({expect:?}): {other:?} — not recorded\n{}",
                            v.name(),
                            k + 1,
                            diagnose(ctx, v)
                        ));
                        None
                    }
                };
                if let Some(ms) = ms {
                    report.add(metric, v.name(), ms);
                }
                report.add(&apply_metric, v.name(), apply_ms);
            }
        }
    }
    notes.push(format!(
        "rivet: the agent's log of the last one-rule change: {}; {}; {}",
        ctx.agent_log_line("network policy planned and applied"),
        ctx.agent_log_line("objects checked"),
        ctx.agent_log_line("objects applied")
    ));
    for (v, count) in &early {
        notes.push(format!(
            "{}: in {count} one-rule denial samples the first refused attempt had started (by less than {} ms) before the change: its SYN was judged after the change took effect, queued behind the rules' work; recorded as 0 ms",
            v.name(),
            PACING.timeout.as_millis()
        ));
    }
    let p99 = |metric: &str| {
        changed
            .iter()
            .map(|v| {
                format!(
                    "{} {:.1} ms",
                    v.name(),
                    report.metrics[metric]
                        .get(v.name())
                        .map_or(f64::NAN, |s| percentile(&s.samples, 99.0))
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    notes.push(format!(
        "one rule changed at N={n}: {samples} times per variant, interleaved and rotated, the client's rule made to deny it (one_rule_deny_visible_ms) then to allow it again (one_rule_allow_visible_ms). rivet: `rivetctl apply -f -` of the last NetworkPolicy ({} rules) with the client rule's podSelector changed (app=client ↔ app=client-denied), process start included; iptables+ipset: one `ipset del`/`ipset add` of the client's address in its rule's set, run in the node namespace (process start included) — the peer's fastest path, a set member changed as Calico's Felix applies a membership change (kube-router re-syncs every set and the whole table on a change: program_ms). Visible: from the change's start to the first connection answered (allow) or to the start of the first refused attempt (deny: a dropped SYN leaves no moment to see, so this is a lower bound where the rules take long to judge a SYN); meanwhile the client pod starts a non-blocking connect every {} ms (several in flight; one not connected within {} ms counts as refused; a denial counts once {} more attempts in a row are refused). one_rule_apply_ms: the change's command alone (both directions). p99: deny {}; allow {}",
        rules.len() - (policy_chunks(&rules).len() - 1) * RULES_PER_POLICY,
        PACING.every.as_millis(),
        PACING.timeout.as_millis(),
        DENY_CONFIRM,
        p99(&deny_metric),
        p99(&allow_metric)
    ));
}

/// The goals, stated as met or not with the figures (not asserted).
fn goals(report: &mut Report, sizes: &[usize], change_n: usize) {
    let series = |metric: &str, v: Var| report.metrics.get(metric).and_then(|m| m.get(v.name()));
    let med = |metric: &str, v: Var| series(metric, v).map_or(f64::NAN, crate::Series::median);
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    let mut lines = Vec::new();
    let (first, last) = (
        sizes.iter().copied().min().unwrap_or(1),
        sizes.iter().copied().max().unwrap_or(1),
    );
    let connect = |n: usize| format!("connect_p50_us_n{n}");
    let (a, b) = (
        med(&connect(first), Var::Rivet),
        med(&connect(last), Var::Rivet),
    );
    lines.push(format!(
        "goal: rivet connect p50 at N={last} within 5 % of N={first}: {b:.1} vs {a:.1} µs ({:+.1} %) — {}",
        (b / a - 1.0) * 100.0,
        verdict(b <= a * 1.05)
    ));
    let tput_n = sizes
        .iter()
        .copied()
        .filter(|&n| n <= 1000)
        .max()
        .unwrap_or(first);
    let tput = format!("throughput_gbps_n{tput_n}");
    if let (Some(r), Some(np)) = (series(&tput, Var::Rivet), series(&tput, Var::NoPolicy)) {
        let paired = crate::paired_ratio(r, np);
        lines.push(format!(
            "goal: rivet throughput with {tput_n} rules ≥ 0.97 × rivet-nopolicy: {:.2} vs {:.2} Gbit/s, {paired:.3} (median of the rounds' ratios), {:.3} (medians) — {}",
            r.median(),
            np.median(),
            r.median() / np.median(),
            verdict(paired >= 0.97)
        ));
    }
    let (r, i) = (
        med(&connect(last), Var::Rivet),
        med(&connect(last), Var::Ipt),
    );
    lines.push(format!(
        "goal: rivet connect p50 ≤ 0.5 × iptables+ipset at N={last}: {r:.1} vs {i:.1} µs ({:.2}×) — {}",
        r / i,
        verdict(r <= 0.5 * i)
    ));
    let program = med(&format!("program_ms_n{last}"), Var::Rivet);
    lines.push(format!(
        "goal: programming {last} rules < 100 ms: rivet {program:.0} ms (iptables+ipset {:.0} ms) — {}",
        med(&format!("program_ms_n{last}"), Var::Ipt),
        verdict(program < 100.0)
    ));
    for what in ["deny", "allow"] {
        let metric = format!("one_rule_{what}_visible_ms_n{change_n}");
        if let Some(s) = series(&metric, Var::Rivet) {
            let p99 = percentile(&s.samples, 99.0);
            lines.push(format!(
                "goal: one rule changed at N={change_n} ({what}) visible p99 < 10 ms: rivet {p99:.1} ms (p50 {:.1}; iptables+ipset p99 {:.1}) — {}",
                s.median(),
                series(&metric, Var::Ipt).map_or(f64::NAN, |s| percentile(&s.samples, 99.0)),
                verdict(p99 < 10.0)
            ));
        }
    }
    report.notes.extend(lines);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> Ipv4Net {
        "10.7.0.0/16".parse().expect("test value")
    }

    #[test]
    fn rules_alternate_and_end_with_the_client() {
        let r = rule_list(10);
        assert_eq!(r.len(), 10);
        assert_eq!(r[0], Rule::Block(0));
        assert_eq!(r[1], Rule::PeerPod(0));
        assert_eq!(r[8], Rule::Block(4));
        assert_eq!(r[9], Rule::Client);
        assert_eq!(peer_count(10), 4);
        assert_eq!(rule_list(1), vec![Rule::Client]);
        // No two addresses adjacent: nothing merges into a shorter prefix.
        assert_eq!(block(1).to_string(), "172.16.0.8/30");
        assert_eq!(peer_ip(cluster(), 1), Ipv4Addr::new(10, 7, 64, 2));
        assert_eq!(
            peer_ip(cluster(), peer_count(10_000) - 1),
            Ipv4Addr::new(10, 7, 103, 12)
        );
    }

    #[test]
    fn policies_hold_a_hundred_rules_each() {
        let rules = rule_list(250);
        let doc: Value = serde_json::from_str(&policies_document(&rules)).expect("test value");
        let items = doc["items"].as_array().expect("test value");
        assert_eq!(items.len(), 3);
        assert_eq!(
            items[2]["spec"]["ingress"]
                .as_array()
                .expect("test value")
                .len(),
            50
        );
        assert_eq!(
            items[2]["spec"]["ingress"][49]["from"][0]["podSelector"]["matchLabels"]["app"],
            "client"
        );
        let deny: Value =
            serde_json::from_str(&last_policy_document(&rules, false)).expect("test value");
        assert_eq!(deny["items"][0]["metadata"]["name"], "rules-002");
        assert_eq!(
            deny["items"][0]["spec"]["ingress"][49]["from"][0]["podSelector"]["matchLabels"]["app"],
            "client-denied"
        );
        let objects: Value = serde_json::from_str(&objects_document(
            250,
            cluster(),
            &[("client", Ipv4Addr::new(10, 7, 1, 2))],
            "n1",
        ))
        .expect("test value");
        assert_eq!(
            objects["items"].as_array().expect("test value").len(),
            2 + 124
        );
    }

    #[test]
    fn iptables_names_every_set_and_matches_the_client_last() {
        let rules = rule_list(150);
        let client = Ipv4Addr::new(10, 252, 0, 2);
        let sets = ipset_restore(&rules, cluster(), client);
        let table = iptables_table(&rules, Ipv4Addr::new(10, 252, 0, 3));
        let creates: Vec<&str> = sets.lines().filter(|l| l.starts_with("create ")).collect();
        assert_eq!(creates.len(), 150);
        assert!(creates[0].contains(" hash:net "), "{}", creates[0]);
        assert!(creates[1].contains(" hash:ip "), "{}", creates[1]);
        assert!(sets.ends_with(&format!("add {} {client}\n", client_set(&rules))));
        let matches: Vec<&str> = table
            .lines()
            .filter(|l| l.contains("--match-set"))
            .collect();
        assert_eq!(matches.len(), 150);
        assert!(matches[149].contains(&client_set(&rules)));
        // Every set a rule names exists, every name fits ipset's 31.
        for l in &matches {
            let set = l
                .split("--match-set ")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .expect("test value");
            assert!(set.len() <= 31, "{set}");
            assert!(sets.contains(&format!("create {set} ")), "{set}");
        }
        let pod_fw: Vec<&str> = table
            .lines()
            .filter(|l| l.starts_with("-A KUBE-POD-FW-"))
            .collect();
        assert!(pod_fw[0].contains("RELATED,ESTABLISHED -m comment"));
        assert_eq!(pod_fw.len(), 1 + 2 + 1);
        assert!(pod_fw[3].ends_with("-j DROP"));
        // Every chain a rule names is declared.
        for l in table.lines().filter(|l| l.starts_with("-A ")) {
            let chain = l.split_whitespace().nth(1).expect("test value");
            assert!(
                ["FORWARD"].contains(&chain) || table.contains(&format!(":{chain} - [0:0]")),
                "{chain} undeclared"
            );
        }
    }

    #[test]
    fn ansi_stripped() {
        assert_eq!(strip_ansi("\x1b[2mms\x1b[0m=5 ok"), "ms=5 ok");
    }
}
