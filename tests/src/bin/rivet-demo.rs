//! `cargo xtask demo`: an emulated cluster (etcd + nodes + pods in network
//! namespaces), same-node and cross-node traffic through the BPF datapath,
//! a Service (ClusterIP + NodePort) with backends on every node, the
//! agents' view of it, a NetworkPolicy default deny with one allow (a
//! denied and an allowed connection, their verdict events), then cleanup
//! (or `--keep`). With `--source kubernetes` the cluster lives in the test
//! API server instead of etcd (`rivet_tests::apiserver`): the nodes' subnets
//! come from their Node objects, and the Service, the Pods and the policy
//! are written to the API, not applied with rivetctl. With `--mode bgp`:
//! two racks behind top-of-rack routers (`rivet_tests::bgp::Fabric`), the
//! nodes' BGP sessions and learned routes, pods across racks, the frames
//! between the racks.

use std::{process::Command, time::Duration};

use clap::Parser;
use rivet_api::{Request, Response};
use rivet_tests::{
    World,
    apiserver::ApiServer,
    bgp::Fabric,
    bin,
    traffic::{iperf3_client, iperf3_server, ping},
};
use serde::Deserialize as _;

#[derive(Parser)]
#[command(
    about = "rivet demo: nodes and pods in network namespaces, cluster state in etcd or the Kubernetes API"
)]
struct Args {
    /// Cross-node mode: vxlan, ipip, native, hybrid, bgp (two racks of
    /// nodes behind top-of-rack routers, routing on what BGP announces).
    #[arg(long, default_value = "vxlan")]
    mode: String,
    /// Where the cluster lives: etcd, or kubernetes (the test API server).
    #[arg(long, default_value = "etcd")]
    source: String,
    /// Nodes.
    #[arg(long, default_value_t = 2)]
    nodes: usize,
    /// Pods per node.
    #[arg(long, default_value_t = 2)]
    pods: usize,
    /// iperf3 duration in seconds.
    #[arg(long, default_value_t = 3)]
    secs: u32,
    /// Leave namespaces, agents, etcd and pins in place for poking around.
    #[arg(long)]
    keep: bool,
}

fn step(text: &str) {
    println!("\n\x1b[1m== {text}\x1b[0m");
}

fn rivetctl(socket: &std::path::Path, args: &[&str]) {
    let out = Command::new(bin("rivetctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .expect("running rivetctl");
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
}

/// Where the objects go: every agent through `rivetctl apply`, or the
/// API server the agents watch.
enum Feed {
    Etcd,
    Api(ApiServer),
}

impl Feed {
    /// Publishes the objects of the YAML `doc`; true on success.
    fn publish(&self, w: &World, nodes: &[usize], doc: &str) -> bool {
        match self {
            Feed::Etcd => nodes.iter().all(|&n| {
                println!("rivetctl apply -f - on {}:", w.nodes[n].name);
                apply(w.nodes[n].agent().socket(), doc)
            }),
            Feed::Api(api) => {
                for part in serde_yaml::Deserializer::from_str(doc) {
                    let value = match serde_json::Value::deserialize(part) {
                        Ok(v) if !v.is_null() => v,
                        Ok(_) => continue,
                        Err(e) => {
                            eprintln!("the demo's YAML: {e}");
                            return false;
                        }
                    };
                    let stored = api.apply(value);
                    println!(
                        "written to the Kubernetes API: {} {}/{} (resourceVersion {})",
                        stored["kind"].as_str().unwrap_or("?"),
                        stored["metadata"]["namespace"].as_str().unwrap_or(""),
                        stored["metadata"]["name"].as_str().unwrap_or("?"),
                        stored["metadata"]["resourceVersion"]
                            .as_str()
                            .unwrap_or("?"),
                    );
                }
                true
            }
        }
    }
}

/// `rivetctl apply -f -` of `doc` on the agent at `socket`; true on success.
fn apply(socket: &std::path::Path, doc: &str) -> bool {
    use std::io::Write as _;
    let child = Command::new(bin("rivetctl"))
        .arg("--socket")
        .arg(socket)
        .args(["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        eprintln!("cannot run rivetctl");
        return false;
    };
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(doc.as_bytes());
    }
    match child.wait_with_output() {
        Ok(out) => {
            print!("{}", String::from_utf8_lossy(&out.stdout));
            eprint!("{}", String::from_utf8_lossy(&out.stderr));
            out.status.success()
        }
        Err(e) => {
            eprintln!("rivetctl: {e}");
            false
        }
    }
}

/// A ClusterIP + NodePort Service with the last pod of every node as a
/// backend: connections from a pod spread over them, an outside host
/// reaches the NodePort, `rivetctl services` shows the counters.
fn services(w: &mut World, feed: &Feed, nodes: &[usize], pods: &[usize]) {
    use std::io::{Read as _, Write as _};
    const PORT: u16 = 8080;
    let backends: Vec<usize> = nodes
        .iter()
        .filter_map(|&n| pods.iter().copied().rev().find(|&p| w.pods[p].node == n))
        .collect();
    step(&format!(
        "a Service: ClusterIP 10.96.0.10:80 and NodePort 30080 with {} backend(s), one per node",
        backends.len()
    ));
    for &b in &backends {
        let me = w.pods[b].ip;
        let l = rivet_tests::traffic::listen(&w.pods[b].ns, PORT);
        std::thread::spawn(move || {
            for mut c in l.incoming().flatten() {
                let _ = c.write_all(&me.octets());
            }
        });
    }
    let mut endpoints = String::new();
    for &b in &backends {
        endpoints += &format!(
            "- addresses: [\"{}\"]\n  nodeName: {}\n",
            w.pods[b].ip, w.nodes[w.pods[b].node].name
        );
    }
    let doc = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: default}}\nspec:\n  type: NodePort\n  clusterIP: 10.96.0.10\n  ports: [{{name: http, port: 80, targetPort: http, nodePort: 30080}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-1\n  namespace: default\n  labels: {{kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{{name: http, port: {PORT}}}]\nendpoints:\n{endpoints}"
    );
    println!("{doc}");
    if !feed.publish(w, nodes, &doc) {
        return;
    }
    // (From the API the agents take it within a watch event.)
    std::thread::sleep(Duration::from_millis(300));
    let reach = |ns: &rivet_tests::Netns, dst: std::net::SocketAddr| {
        ns.exec(|| std::net::TcpStream::connect_timeout(&dst, Duration::from_secs(2)))
            .and_then(|mut c| {
                c.set_read_timeout(Some(Duration::from_secs(2)))?;
                let mut b = [0u8; 4];
                c.read_exact(&mut b)?;
                Ok(std::net::Ipv4Addr::from(b))
            })
    };
    let client = pods[0];
    let mut hits = std::collections::BTreeMap::new();
    let mut failed = 0;
    for _ in 0..30 {
        match reach(&w.pods[client].ns, ([10, 96, 0, 10], 80).into()) {
            Ok(b) => *hits.entry(b).or_insert(0) += 1,
            Err(_) => failed += 1,
        }
    }
    println!(
        "pod {} -> 10.96.0.10:80, 30 connections: {hits:?} ({failed} failed; translated at connect(), no NAT on the wire)",
        w.pods[client].ip
    );
    let node = w.nodes[nodes[0]].ip;
    w.add_outside();
    if let Some(outside) = &w.outside {
        match reach(outside, (node, 30080).into()) {
            Ok(b) => println!("outside host -> {node}:30080 (NodePort) answered by backend {b}"),
            Err(e) => println!("outside host -> {node}:30080 (NodePort): {e}"),
        }
    }
    let socket = w.nodes[nodes[0]].agent().socket().to_owned();
    step("rivetctl services (sockets = translated at connect, flows = at the uplink)");
    rivetctl(&socket, &["services"]);
}

/// A default deny plus one allow in namespace `demo`: `db` (on the first
/// node) accepts TCP 5432 from `web` (on the last node) only; `other`
/// (beside `db`) is refused. The verdicts as `rivetctl monitor` shows them
/// on `db`'s node, then `rivetctl policy demo/db`.
fn policy(w: &mut World, feed: &Feed, nodes: &[usize]) {
    use std::io::Read as _;
    const PORT: u16 = 5432;
    let (first, last) = (nodes[0], nodes[nodes.len() - 1]);
    step("NetworkPolicy: namespace demo, default deny ingress, db accepts web on TCP 5432");
    // The Namespace and each Pod object (with the address its ADD gets, as
    // the kubelet reports it) before the pod: from the API, an ADD waits
    // for its Pod.
    if !feed.publish(
        w,
        nodes,
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: demo}\n",
    ) {
        return;
    }
    let mut added = Vec::new();
    for (n, app) in [(first, "db"), (first, "other"), (last, "web")] {
        let doc = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {app}, namespace: demo, labels: {{app: {app}}}}}\nspec: {{nodeName: {}, containers: [{{name: c, image: x}}]}}\nstatus: {{podIP: \"{}\"}}\n",
            w.nodes[n].name,
            w.next_pod_ip(n)
        );
        if !feed.publish(w, nodes, &doc) {
            return;
        }
        added.push(w.add_k8s_pod(n, "demo", app));
    }
    let (db, other, web) = (added[0], added[1], added[2]);
    let l = rivet_tests::traffic::listen(&w.pods[db].ns, PORT);
    std::thread::spawn(move || for _c in l.incoming().flatten() {});
    let policies = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: default-deny, namespace: demo}\nspec: {podSelector: {}}\n---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: db-from-web, namespace: demo}\nspec:\n  podSelector: {matchLabels: {app: db}}\n  ingress:\n  - from: [{podSelector: {matchLabels: {app: web}}}]\n    ports: [{port: 5432}]\n";
    println!("{policies}");
    if !feed.publish(w, nodes, policies) {
        return;
    }
    std::thread::sleep(Duration::from_millis(300));
    let socket = w.nodes[first].agent().socket().to_owned();
    let monitor = Command::new(bin("rivetctl"))
        .arg("--socket")
        .arg(&socket)
        .args(["monitor", "--count", "2"])
        .stdout(std::process::Stdio::piped())
        .spawn();
    std::thread::sleep(Duration::from_millis(500));
    let dst: std::net::SocketAddr = (w.pods[db].ip, PORT).into();
    for (p, who) in [(web, "web"), (other, "other")] {
        let r = w.pods[p]
            .ns
            .exec(|| std::net::TcpStream::connect_timeout(&dst, Duration::from_secs(1)));
        let verdict = if r.is_ok() {
            "connected"
        } else {
            "refused (timed out)"
        };
        println!("{who} {} -> db {dst}: {verdict}", w.pods[p].ip);
    }
    step(&format!(
        "rivetctl monitor on {} (the verdicts: who, which pod, which policy)",
        w.nodes[first].name
    ));
    if let Ok(mut child) = monitor {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while matches!(child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let mut out = String::new();
        if let Some(mut stdout) = child.stdout.take() {
            let _ = stdout.read_to_string(&mut out);
        }
        let _ = child.wait();
        print!("{out}");
    }
    step("rivetctl policy demo/db");
    rivetctl(&socket, &["policy", "demo/db"]);
}

/// `--mode bgp`: two racks, each behind a top-of-rack router (BIRD in its
/// own namespace, eBGP to its nodes and to the other router, no L2 between
/// racks); every node announces its pod CIDR to its router and routes
/// natively on what it learns.
fn bgp_racks(args: &Args) {
    let per_rack = args.nodes.clamp(4, 10).div_ceil(2);
    step(&format!(
        "building the fabric: 2 racks × {per_rack} node(s), a top-of-rack router each (BIRD, eBGP), no L2 between racks"
    ));
    let mut w = World::new();
    let mut fabric = Fabric::new(&w);
    let tors = [fabric.add_rack(65101), fabric.add_rack(65102)];
    fabric.link(tors[0], tors[1]);
    let mut nodes = Vec::new();
    for (r, &t) in tors.iter().enumerate() {
        for _ in 0..per_rack {
            let n = fabric.add_node(&mut w, t);
            let asn = 65001 + nodes.len() as u32;
            fabric.tors[t].peer_with(w.nodes[n].ip, asn);
            nodes.push((n, r, asn));
        }
    }
    fabric.start();
    for t in &fabric.tors {
        println!(
            "router rack {} AS {}: {} on the rack, namespace {}",
            t.rack,
            t.asn,
            t.gateway,
            t.ns.name()
        );
    }
    for &(n, r, asn) in &nodes {
        let tor = &fabric.tors[tors[r]];
        w.nodes[n].agent_args.extra_args = tor.node_flags(asn, &["--bgp-hold-time", "9"]);
        w.start_agent(n);
        println!(
            "node {:<14} rack {} AS {asn} uplink {:<15} pod subnet {:<16} peer {}",
            w.nodes[n].name,
            r + 1,
            w.nodes[n].ip,
            w.nodes[n].pod_cidr,
            tor.gateway
        );
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let started = std::time::Instant::now();
    while nodes.iter().any(|&(n, ..)| peers(&w, n) + 1 < nodes.len())
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "every node routes to every other pod subnet after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let socket = w.nodes[nodes[0].0].agent().socket().to_owned();
    step(&format!("rivetctl bgp (node {})", w.nodes[nodes[0].0].name));
    rivetctl(&socket, &["bgp"]);
    step(
        "rivetctl nodes: learned routes, next hop = the rack's router or a rack neighbour, native",
    );
    rivetctl(&socket, &["nodes"]);
    step("router rack 1: the pod subnets it knows, all from BGP");
    print!(
        "{}",
        fabric.tors[tors[0]]
            .ns
            .ip(&["route", "show", "proto", "bird"])
    );

    step("creating one pod per node");
    let pods: Vec<usize> = nodes.iter().map(|&(n, ..)| w.add_pod(n)).collect();
    for &p in &pods {
        println!(
            "pod {:<20} on {:<14} ip {}",
            w.pods[p].name, w.nodes[w.pods[p].node].name, w.pods[p].ip
        );
    }
    let link = rivet_tests::continuity::ifindex(&fabric.tors[tors[0]].ns, "to2");
    let capture = rivet_tests::capture::Capture::start(&fabric.tors[tors[0]].ns, link)
        .expect("capturing between the racks");
    step("ping: every pod to every other pod (same rack and across racks)");
    let rack_of = |p: usize| {
        nodes
            .iter()
            .find(|(n, ..)| *n == w.pods[p].node)
            .map(|x| x.1)
    };
    ping_every_pair(&w, &pods, |a, b| {
        if rack_of(a) == rack_of(b) {
            "same rack   "
        } else {
            "across racks"
        }
    });
    let (a, b) = (pods[0], pods[pods.len() - 1]);
    step(&format!("iperf3 {} s across racks", args.secs));
    let server = iperf3_server(&w.pods[b].ns, 5201, Some(1));
    let res = iperf3_client(&w.pods[a].ns, w.pods[b].ip, 5201, args.secs, 1, Some(0));
    drop(server);
    println!(
        "{} -> {}: {:.2} Gbit/s, {} retransmits",
        w.pods[a].ip,
        w.pods[b].ip,
        res.bits_per_second / 1e9,
        res.retransmits
    );
    let frames = capture.stop().expect("capture").frames;
    let ips: Vec<_> = frames.iter().filter_map(|f| f.ipv4()).collect();
    let pod_ips: Vec<_> = pods.iter().map(|&p| w.pods[p].ip).collect();
    let plain = ips
        .iter()
        .filter(|i| pod_ips.contains(&i.src) && pod_ips.contains(&i.dst))
        .count();
    let tunnelled = ips
        .iter()
        .filter(|i| i.proto == 4 || (i.proto == 17 && i.ports.1 == 8472))
        .count();
    step("on the wire between the racks");
    println!(
        "{} frames captured: {plain} plain IP between pod addresses, {tunnelled} VXLAN/IPIP",
        frames.len()
    );
    step(&format!(
        "rivetctl stats (node {}: fwd_native = routed on what BGP learned)",
        w.nodes[nodes[0].0].name
    ));
    rivetctl(&socket, &["stats"]);
    if args.keep {
        step("--keep: leaving everything up");
        println!(
            "namespaces and agents stay (prefix {}); the routers end with this program",
            w.prefix
        );
        w.keep();
    } else {
        step("cleaning up (agents and speakers stopped, routers stopped, namespaces deleted)");
    }
    drop(fabric);
}

/// Pings every pod from every other (2 each), one line per pair with
/// `place(a, b)`, then how many pairs answered every ping.
fn ping_every_pair(w: &World, pods: &[usize], place: impl Fn(usize, usize) -> &'static str) {
    let (mut ok, mut total) = (0, 0);
    for &a in pods {
        for &b in pods {
            if a == b {
                continue;
            }
            let r = ping(&w.pods[a].ns, w.pods[b].ip, 2, 0.05);
            total += 1;
            if r.received == r.sent {
                ok += 1;
            }
            println!(
                "{} {:>13} -> {:<13} {}/{} replies, avg {:.3} ms",
                place(a, b),
                w.pods[a].ip,
                w.pods[b].ip,
                r.received,
                r.sent,
                r.avg_ms.unwrap_or(f64::NAN)
            );
        }
    }
    println!("{ok}/{total} pairs answered every ping");
}

fn peers(w: &World, n: usize) -> usize {
    match w.nodes[n].agent().client().call(&Request::NodeList {}) {
        Ok(Response::Nodes { nodes }) => nodes.len(),
        _ => 0,
    }
}

fn main() {
    let args = Args::parse();
    if !["vxlan", "ipip", "native", "hybrid", "bgp"].contains(&args.mode.as_str()) {
        eprintln!("--mode must be vxlan, ipip, native, hybrid or bgp");
        std::process::exit(2);
    }
    if args.mode == "bgp" {
        if args.source != "etcd" {
            eprintln!("--mode bgp builds its own fabric: no --source");
            std::process::exit(2);
        }
        bgp_racks(&args);
        return;
    }
    if !["etcd", "kubernetes"].contains(&args.source.as_str()) {
        eprintln!("--source must be etcd or kubernetes");
        std::process::exit(2);
    }
    let nodes_n = args.nodes.clamp(1, 10);
    let store = if args.source == "etcd" {
        "etcd"
    } else {
        "the test Kubernetes API server"
    };
    step(&format!(
        "building the world: underlay bridge, {store}, {nodes_n} node(s) in {} mode",
        args.mode
    ));
    let mut w = World::new();
    // (Declared after the world: the API server stops first.)
    let feed = if args.source == "etcd" {
        let etcd = w.start_etcd();
        println!(
            "etcd at {etcd} (in the underlay namespace {})",
            w.underlay.name()
        );
        Feed::Etcd
    } else {
        let api = w.start_apiserver();
        println!(
            "Kubernetes API at {} (in the underlay namespace {}); each agent: source = \"kubernetes\", a kubeconfig",
            api.url(),
            w.underlay.name()
        );
        Feed::Api(api)
    };
    let nodes: Vec<usize> = (0..nodes_n)
        .map(|_| match &feed {
            Feed::Etcd => w.add_etcd_node(&args.mode, 10),
            Feed::Api(api) => w.add_kube_node(api, &args.mode),
        })
        .collect();
    for &n in &nodes {
        let whence = match &feed {
            Feed::Etcd => "leased in etcd",
            Feed::Api(_) => "its Node's spec.podCIDR",
        };
        println!(
            "node {:<14} uplink {:<15} pod subnet {:<16} ({whence})",
            w.nodes[n].name, w.nodes[n].ip, w.nodes[n].pod_cidr
        );
    }
    if let Feed::Api(api) = &feed
        && let Some(node) = api.get("nodes", "", &w.nodes[nodes[0]].name)
    {
        step("the first Node object's annotations and conditions, as rivet published them");
        println!(
            "{}",
            serde_json::to_string_pretty(&node["metadata"]["annotations"]).unwrap_or_default()
        );
        println!(
            "{}",
            serde_json::to_string_pretty(&node["status"]["conditions"]).unwrap_or_default()
        );
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while nodes.iter().any(|&n| peers(&w, n) + 1 < nodes_n) && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }

    step(&format!(
        "creating {} pod(s) per node through the agents",
        args.pods
    ));
    let mut pods = Vec::new();
    for &n in &nodes {
        for _ in 0..args.pods.clamp(1, 8) {
            let p = w.add_pod(n);
            println!(
                "pod {:<20} on {:<14} ip {:<13} host veth {}",
                w.pods[p].name, w.nodes[n].name, w.pods[p].ip, w.pods[p].endpoint.host_ifname
            );
            pods.push(p);
        }
    }

    step("ping: every pod to every other pod (same node and across nodes)");
    ping_every_pair(&w, &pods, |a, b| {
        if w.pods[a].node == w.pods[b].node {
            "same node "
        } else {
            "cross node"
        }
    });
    if nodes.len() > 1 {
        let remote = pods
            .iter()
            .copied()
            .find(|&p| w.pods[p].node != nodes[0])
            .unwrap_or(pods[0]);
        let r = ping(&w.nodes[nodes[0]].ns, w.pods[remote].ip, 2, 0.05);
        println!(
            "node {} -> remote pod {}: {}/{} replies",
            w.nodes[nodes[0]].name, w.pods[remote].ip, r.received, r.sent
        );
    }

    step(&format!(
        "iperf3 {} s: same node, then across nodes",
        args.secs
    ));
    let same = pods
        .iter()
        .copied()
        .find(|&p| p != pods[0] && w.pods[p].node == w.pods[pods[0]].node);
    let cross = pods
        .iter()
        .copied()
        .find(|&p| w.pods[p].node != w.pods[pods[0]].node);
    for (label, target) in [("same node ", same), ("cross node", cross)] {
        let Some(t) = target else { continue };
        let server = iperf3_server(&w.pods[t].ns, 5201, Some(1));
        let res = iperf3_client(
            &w.pods[pods[0]].ns,
            w.pods[t].ip,
            5201,
            args.secs,
            1,
            Some(0),
        );
        drop(server);
        println!(
            "{label} {} -> {}: {:.2} Gbit/s, {} retransmits",
            w.pods[pods[0]].ip,
            w.pods[t].ip,
            res.bits_per_second / 1e9,
            res.retransmits
        );
    }

    services(&mut w, &feed, &nodes, &pods);
    policy(&mut w, &feed, &nodes);

    let socket = w.nodes[nodes[0]].agent().socket().to_owned();
    step(&format!(
        "rivetctl status (node {})",
        w.nodes[nodes[0]].name
    ));
    rivetctl(&socket, &["status"]);
    step("rivetctl nodes (routes to the other nodes' pod subnets)");
    rivetctl(&socket, &["nodes"]);
    step("rivetctl endpoints");
    rivetctl(&socket, &["endpoints"]);
    step(
        "rivetctl stats (fwd_local = same node, fwd_encap_*/decap_* = across nodes, fwd_svc = NodePort)",
    );
    rivetctl(&socket, &["stats"]);

    if args.keep {
        step("--keep: leaving everything up");
        for &n in &nodes {
            println!(
                "node {}: namespace {}, socket {}, agent pid {:?}",
                w.nodes[n].name,
                w.nodes[n].ns.name(),
                w.nodes[n].agent().socket().display(),
                w.nodes[n].agent().pid()
            );
        }
        for &p in &pods {
            println!("pod namespace {} ({})", w.pods[p].ns.name(), w.pods[p].ip);
        }
        println!(
            "try:   ip netns exec {} ping {}",
            w.pods[pods[0]].ns.name(),
            w.pods[*pods.last().unwrap_or(&pods[0])].ip
        );
        println!(
            "       {} --socket {} stats",
            bin("rivetctl").display(),
            socket.display()
        );
        println!(
            "clean up: kill the agents and etcd, `rivetd --netns <node> --node-name <node> --state-dir <dir> unload` per node,"
        );
        println!(
            "          and `ip netns del` the namespaces (prefix {}).",
            w.prefix
        );
        w.keep();
        if matches!(feed, Feed::Api(_)) {
            println!(
                "the test API server ends with this program: the agents keep the state they have and retry the API"
            );
        }
        // etcd keeps running too.
        if let Some(etcd) = w.etcd.take() {
            std::mem::forget(etcd);
        }
    } else {
        step(&format!(
            "cleaning up (agents stopped, pins removed, {} stopped, namespaces deleted)",
            if matches!(feed, Feed::Api(_)) {
                "API server"
            } else {
                "etcd"
            }
        ));
    }
}
