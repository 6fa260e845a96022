//! Control plane: how fast the agent gets state into the kernel maps.
//!
//! (a) Map updates per second for routes, endpoints and hostPorts, two ways:
//! through the agent's API where one entry is one request (`node_set` /
//! `node_del` for routes; one `endpoint_add` carrying every hostPort for
//! hostPorts), and through the library functions the agent itself calls
//! (`cluster::Cluster::upsert`/`remove` — the etcd watch's path — for
//! routes, `Datapath::put_endpoint` for endpoints, `endpoint::hostport_entries`
//! then `Datapath::put_hostport` for hostPorts) on a private datapath pinned
//! under its own directory. An endpoint through the API is a pod ADD, whose
//! cost is the veth (see `bench cni`), so endpoints are measured through the
//! library only. Peers, same entry counts, same run: `ip -batch` route adds
//! (the kernel FIB) and an nftables map of `(address . port)` elements.
//!
//! (b) One change with the route table nearly full: a `node_set` (new
//! subnet) or `node_del` through the API, timed from the request to the
//! entry being visible in (or gone from) the agent's pinned ROUTES map, and
//! to the answer.
//!
//! (c) etcd convergence: N − 1 agents registered and synced, a new node's
//! agent starts; from its registration (the PUT of its subnet key, seen by
//! an `etcdctl watch`) until every other node's pinned ROUTES map holds the
//! subnet; then it leaves (`rivetd unload` deletes its key) until every map
//! has dropped it.

use std::{
    collections::BTreeSet,
    io::{BufRead as _, Write as _},
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use aya::maps::{LpmTrie, Map, MapData, MapError, lpm_trie::Key};
use ipnet::Ipv4Net;
use rivet::{
    cluster::{Cluster, RemoteNode},
    config::Mode,
    datapath::Datapath,
    pins::PinLayout,
};
use rivet_api::{
    Endpoint, EndpointRef, EndpointSpec, EndpointState, NodeEntry, PortMapping, Protocol, Request,
    Response,
};
use rivet_common::{EndpointInfo, RouteInfo, endpoint_flags, ipv4_from_key, ipv4_key, map_names};

use crate::{Options, Report, percentile, progress};
use rivet_tests::{Netns, World, traffic::ChildGuard, unique_prefix};

/// Entries per bulk measurement (routes: capped by the ROUTES map's size).
const ENTRIES: usize = 10_000;
/// First hostPort of the bulk mappings.
const PORT_BASE: u16 = 20_000;
/// Subnets keys under which agents register (the default etcd prefix).
const SUBNETS_PREFIX: &str = "/rivet.io/network/subnets/";

const API: &str = "agent API";
const CODE: &str = "agent code";
const IP_ROUTE: &str = "ip route";
const NFT: &str = "nft map";
const ETCD: &str = "etcd";

/// Remote pod subnet `i`: 100.64.0.0/10 cut into /24s (16384 of them).
fn subnet(i: usize) -> Ipv4Net {
    let base = u32::from(Ipv4Addr::new(100, 64, 0, 0)) + ((i as u32) << 8);
    Ipv4Net::new(Ipv4Addr::from(base), 24).unwrap_or_default()
}

/// Address of the remote node owning subnet `i` (one node per subnet).
fn node_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(172, 16, 0, 1)) + i as u32)
}

fn route_key(net: Ipv4Net) -> Key<u32> {
    Key::new(
        u32::from(net.prefix_len()),
        ipv4_key(net.network().octets()),
    )
}

fn node_entry(i: usize) -> NodeEntry {
    NodeEntry {
        subnet: subnet(i).to_string(),
        node_ip: node_ip(i),
        vtep_mac: None,
        vni: None,
        route: None,
    }
}

fn rate(n: usize, took: Duration) -> f64 {
    n as f64 / took.as_secs_f64()
}

/// A node's pinned ROUTES map, opened beside its agent.
fn pinned_routes(pin_dir: &Path) -> LpmTrie<MapData, u32, RouteInfo> {
    let path = PinLayout::new(pin_dir).map(map_names::ROUTES);
    let data = MapData::from_pin(&path)
        .unwrap_or_else(|e| panic!("opening the pinned {}: {e}", path.display()));
    LpmTrie::try_from(Map::LpmTrie(data))
        .unwrap_or_else(|e| panic!("{} is not the ROUTES trie: {e}", path.display()))
}

/// Capacity of a node's pinned ROUTES map.
fn routes_capacity(pin_dir: &Path) -> usize {
    let path = PinLayout::new(pin_dir).map(map_names::ROUTES);
    MapData::from_pin(&path)
        .and_then(|d| d.info())
        .map(|i| i.max_entries() as usize)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Whether `net` is in the trie (exact prefix: nothing shorter is routed).
fn has_route(trie: &LpmTrie<MapData, u32, RouteInfo>, net: Ipv4Net) -> bool {
    match trie.get(&route_key(net), 0) {
        Ok(_) => true,
        Err(MapError::KeyNotFound) => false,
        Err(e) => panic!("looking {net} up in ROUTES: {e}"),
    }
}

fn route_set(trie: &LpmTrie<MapData, u32, RouteInfo>) -> BTreeSet<Ipv4Net> {
    trie.keys()
        .filter_map(Result::ok)
        .filter_map(|k| {
            Ipv4Net::new(
                Ipv4Addr::from(ipv4_from_key(k.data())),
                k.prefix_len() as u8,
            )
            .ok()
        })
        .collect()
}

/// The agent's own datapath code on a private copy of the object, pinned
/// under its own directory; everything removed on drop.
struct PrivateDatapath {
    dp: Option<Datapath>,
    layout: PinLayout,
}

impl PrivateDatapath {
    fn load(prefix: &str) -> Self {
        let layout =
            PinLayout::new(PathBuf::from("/sys/fs/bpf/rivet").join(format!("{prefix}-ctl")));
        let dp = Datapath::load(&layout).unwrap_or_else(|e| {
            let _ = rivet::datapath::unload(&layout);
            panic!("loading a private datapath: {e}")
        });
        Self {
            dp: Some(dp),
            layout,
        }
    }

    fn dp(&mut self) -> &mut Datapath {
        self.dp.as_mut().expect("datapath loaded")
    }
}

impl Drop for PrivateDatapath {
    fn drop(&mut self) {
        self.dp = None;
        if let Err(e) = rivet::datapath::unload(&self.layout) {
            eprintln!("warning: removing {}: {e}", self.layout.root().display());
        }
    }
}

/// Routes through `Cluster::upsert` then `Cluster::remove` (what the etcd
/// watch calls for each event); (inserts/s, deletes/s).
fn code_routes(p: &mut PrivateDatapath, r: usize) -> (f64, f64) {
    let own: Ipv4Net = "10.255.255.0/24".parse().unwrap_or_default();
    let mut cluster = Cluster::new(
        Mode::Vxlan,
        None,
        own,
        Some(Ipv4Addr::new(172, 31, 255, 254)),
        1,
    );
    let nodes: Vec<RemoteNode> = (0..r)
        .map(|i| RemoteNode {
            subnet: subnet(i),
            node_ip: node_ip(i),
            vtep_mac: rivet::node::vtep_mac_for(node_ip(i)),
            vni: 1,
        })
        .collect();
    let dp = p.dp();
    let t = Instant::now();
    for n in nodes {
        let changed = cluster
            .upsert(dp, n)
            .unwrap_or_else(|e| panic!("Cluster::upsert: {e}"));
        assert!(changed, "a new node must change the maps");
    }
    let ins = rate(r, t.elapsed());
    let routes = dp.list_routes().expect("listing routes");
    assert_eq!(routes.len(), r, "ROUTES holds every node");
    assert_eq!(dp.list_peers().expect("peers").len(), r, "PEERS too");
    let t = Instant::now();
    for i in 0..r {
        assert!(
            cluster.remove(dp, subnet(i)).expect("Cluster::remove"),
            "node {i} was there"
        );
    }
    let del = rate(r, t.elapsed());
    assert!(dp.list_routes().expect("listing routes").is_empty());
    assert!(dp.list_peers().expect("peers").is_empty());
    (ins, del)
}

/// Endpoints through `Datapath::put_endpoint` / `remove_endpoint`.
fn code_endpoints(p: &mut PrivateDatapath, n: usize) -> (f64, f64) {
    let dp = p.dp();
    let ip = |i: usize| Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 200, 0, 2)) + i as u32);
    let t = Instant::now();
    for i in 0..n {
        let a = ip(i).octets();
        dp.put_endpoint(
            ip(i),
            EndpointInfo {
                ifindex: 1000 + i as u32,
                flags: endpoint_flags::READY,
                mac: [0x02, 0x72, a[0], a[1], a[2], a[3]],
                host_mac: [0x02, 0x00, a[0], a[1], a[2], a[3]],
            },
        )
        .unwrap_or_else(|e| panic!("put_endpoint: {e}"));
    }
    let ins = rate(n, t.elapsed());
    assert_eq!(dp.list_endpoints().expect("endpoints").len(), n);
    let t = Instant::now();
    for i in 0..n {
        assert!(dp.remove_endpoint(ip(i)).expect("remove_endpoint"));
    }
    let del = rate(n, t.elapsed());
    assert!(dp.list_endpoints().expect("endpoints").is_empty());
    (ins, del)
}

fn mappings(n: usize) -> Vec<PortMapping> {
    (0..n)
        .map(|i| PortMapping {
            host_port: PORT_BASE + i as u16,
            container_port: 80,
            protocol: Protocol::Tcp,
            host_ip: None,
        })
        .collect()
}

/// hostPorts as the agent writes them at ADD: `hostport_entries` of the
/// endpoint, one `put_hostport` each; removed with `remove_hostport`.
fn code_hostports(p: &mut PrivateDatapath, n: usize) -> (f64, f64) {
    let ep = Endpoint {
        container_id: "bench".into(),
        ifname: "eth0".into(),
        network: None,
        netns: String::new(),
        ip: Ipv4Addr::new(10, 200, 0, 2),
        mac: String::new(),
        host_ifname: String::new(),
        host_ifindex: 0,
        host_mac: String::new(),
        mtu: 1500,
        gateway: Ipv4Addr::new(169, 254, 1, 1),
        state: EndpointState::Ready,
        pod: None,
        port_mappings: mappings(n),
        bandwidth: None,
        routes: Vec::new(),
        created: 0,
        netns_cookie: None,
    };
    let dp = p.dp();
    let t = Instant::now();
    let entries = rivet::endpoint::hostport_entries(&ep);
    for (key, target) in &entries {
        dp.put_hostport(*key, *target)
            .unwrap_or_else(|e| panic!("put_hostport: {e}"));
    }
    let ins = rate(n, t.elapsed());
    assert_eq!(dp.list_hostports().expect("hostports").len(), n);
    let t = Instant::now();
    for (key, _) in &entries {
        assert!(dp.remove_hostport(*key).expect("remove_hostport"));
    }
    let del = rate(n, t.elapsed());
    assert!(dp.list_hostports().expect("hostports").is_empty());
    (ins, del)
}

/// Runs `cmd` with `input` on stdin; the wall time. Panics if it fails.
fn timed_stdin(mut cmd: Command, what: &str, input: &str) -> Duration {
    let t = Instant::now();
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .unwrap_or_else(|e| panic!("{what}: writing its input: {e}"));
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let took = t.elapsed();
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

/// The kernel FIB peer: a namespace with one veth whose neighbour is the
/// next hop of every route.
fn ip_route_ns(prefix: &str) -> Netns {
    let ns = Netns::new(format!("{prefix}-ipr"));
    ns.ip(&["link", "add", "v0", "type", "veth", "peer", "name", "v1"]);
    ns.ip(&["addr", "add", "192.0.2.1/24", "dev", "v0"]);
    ns.ip(&["link", "set", "v0", "up"]);
    ns.ip(&["link", "set", "v1", "up"]);
    ns
}

/// `ip -batch` adds then deletes of `r` routes; (adds/s, deletes/s).
fn ip_routes(ns: &Netns, r: usize) -> (f64, f64) {
    let batch = |verb: &str| -> String {
        (0..r)
            .map(|i| format!("route {verb} {} via 192.0.2.2 dev v0\n", subnet(i)))
            .collect()
    };
    let ip = || {
        let mut c = Command::new("ip");
        c.args(["-n", ns.name(), "-batch", "-"]);
        c
    };
    let add = timed_stdin(ip(), "ip -batch (route add)", &batch("add"));
    let present = ns
        .ip(&["-4", "route", "show", "via", "192.0.2.2"])
        .lines()
        .count();
    assert_eq!(present, r, "ip route: every route in the FIB");
    let del = timed_stdin(ip(), "ip -batch (route del)", &batch("del"));
    let left = ns
        .ip(&["-4", "route", "show", "via", "192.0.2.2"])
        .lines()
        .count();
    assert_eq!(left, 0, "ip route: every route removed");
    (rate(r, add), rate(r, del))
}

/// The nftables peer for hostPorts: one DNAT rule over a map of
/// `(node address . port) : (pod . port)` elements (the `bench nat` layout).
fn nft_ns(prefix: &str) -> Netns {
    let ns = Netns::new(format!("{prefix}-nft"));
    let ruleset = "table ip hostports {\n\
         map ports { type ipv4_addr . inet_service : ipv4_addr . inet_service; }\n\
         chain prerouting { type nat hook prerouting priority dstnat; policy accept; dnat ip to ip daddr . tcp dport map @ports; }\n\
         }\n";
    let mut c = ns.command("nft");
    c.args(["-f", "-"]);
    timed_stdin(c, "nft -f (table)", ruleset);
    ns
}

/// Adds then deletes `n` elements with one `nft -f` each; (adds/s, deletes/s).
fn nft_elements(ns: &Netns, n: usize) -> (f64, f64) {
    let keys: Vec<String> = (0..n)
        .map(|i| format!("192.0.2.1 . {}", PORT_BASE + i as u16))
        .collect();
    let add = format!(
        "add element ip hostports ports {{ {} }}\n",
        keys.iter()
            .enumerate()
            .map(|(i, k)| format!("{k} : 10.250.{}.{} . 80", i / 250, 1 + i % 250))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let del = format!(
        "delete element ip hostports ports {{ {} }}\n",
        keys.join(", ")
    );
    let nft = || {
        let mut c = ns.command("nft");
        c.args(["-f", "-"]);
        c
    };
    let t_add = timed_stdin(nft(), "nft -f (add element)", &add);
    let listed = ns.run("nft", &["list", "map", "ip", "hostports", "ports"]);
    assert_eq!(
        listed.matches(" . 80").count(),
        n,
        "nft: every element in the map"
    );
    let t_del = timed_stdin(nft(), "nft -f (delete element)", &del);
    (rate(n, t_add), rate(n, t_del))
}

fn call(client: &rivet_api::Client, req: &Request, what: &str) -> Response {
    client.call(req).unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// One change through the API with `r` routes installed: the request, and
/// a poll of the pinned map until the change is there. Returns (visible,
/// answered) in µs.
fn one_change(
    client: &rivet_api::Client,
    trie: &LpmTrie<MapData, u32, RouteInfo>,
    net_index: usize,
    add: bool,
) -> (f64, f64) {
    let net = subnet(net_index);
    assert_eq!(has_route(trie, net), !add, "{net} before the change");
    let req = if add {
        Request::NodeSet(node_entry(net_index))
    } else {
        Request::NodeDel {
            subnet: net.to_string(),
        }
    };
    std::thread::scope(|s| {
        let worker = s.spawn(|| {
            let t0 = Instant::now();
            let r = client.call(&req);
            (t0, Instant::now(), r)
        });
        let mut answered_at = None;
        let seen = loop {
            if has_route(trie, net) == add {
                break Instant::now();
            }
            if worker.is_finished() {
                let at = *answered_at.get_or_insert_with(Instant::now);
                assert!(
                    at.elapsed() < Duration::from_secs(2),
                    "{net}: change not visible 2 s after the answer"
                );
            }
            // A short sleep, not a spin: with 2 CPUs a spinning poller
            // would take the agent's CPU.
            std::thread::sleep(Duration::from_micros(20));
        };
        let (t0, t1, r) = worker.join().expect("request thread");
        match r {
            Ok(Response::Nodes { .. } | Response::Deleted { existed: true }) => {}
            other => panic!("change of {net}: {other:?}"),
        }
        (
            seen.duration_since(t0).as_secs_f64() * 1e6,
            t1.duration_since(t0).as_secs_f64() * 1e6,
        )
    })
}

/// Routes, one change and hostPorts through a running agent's API.
fn api_part(report: &mut Report, opts: &Options, r: usize, started: Instant) {
    let mut w = World::new();
    let n = w.add_node_with_agent();
    let client = w.nodes[n].agent().client();
    let trie = pinned_routes(&w.nodes[n].pin_dir());
    let changes = if opts.rounds <= 2 { 100 } else { 400 };
    let pod_cidr: Ipv4Net = w.nodes[n].pod_cidr.parse().expect("pod CIDR");
    let pods: Vec<(Netns, Ipv4Addr)> = (0..2)
        .map(|i| {
            (
                Netns::new(format!("{}-cp{i}", w.prefix)),
                Ipv4Addr::from(u32::from(pod_cidr.network()) + 2 + i as u32),
            )
        })
        .collect();
    let add_pod = |i: usize, maps: usize| -> Duration {
        let (ns, ip) = &pods[i];
        let mut spec =
            EndpointSpec::new(format!("ctl{i}"), ns.path().display().to_string()).with_ip(*ip);
        spec.port_mappings = mappings(maps);
        let req = Request::EndpointAdd(spec);
        let t = Instant::now();
        let resp = call(&client, &req, "endpoint_add");
        let took = t.elapsed();
        assert!(matches!(resp, Response::Endpoint(_)), "ADD: {resp:?}");
        took
    };
    let del_pod = |i: usize| -> Duration {
        let req = Request::EndpointDel(EndpointRef::new(format!("ctl{i}"), "eth0"));
        let t = Instant::now();
        let resp = call(&client, &req, "endpoint_del");
        let took = t.elapsed();
        assert!(
            matches!(resp, Response::Deleted { existed: true }),
            "DEL: {resp:?}"
        );
        took
    };

    // Warm-up: a few requests of each kind, not recorded.
    for i in 0..50 {
        call(&client, &Request::NodeSet(node_entry(i)), "node_set");
    }
    for i in 0..50 {
        call(
            &client,
            &Request::NodeDel {
                subnet: subnet(i).to_string(),
            },
            "node_del",
        );
    }
    add_pod(0, 0);
    del_pod(0);

    for round in 0..opts.rounds {
        let tag = format!("round {}/{}", round + 1, opts.rounds);
        // Routes, one request each.
        let t = Instant::now();
        for i in 0..r {
            if i % 500 == 0 {
                progress(&format!(
                    "control: {tag} node_set {i}/{r} [{:.0}s]",
                    started.elapsed().as_secs_f64()
                ));
            }
            let resp = call(&client, &Request::NodeSet(node_entry(i)), "node_set");
            assert!(matches!(resp, Response::Nodes { .. }), "{resp:?}");
        }
        report.add("route_updates_per_s", API, rate(r, t.elapsed()));
        assert_eq!(
            route_set(&trie).len(),
            r,
            "the agent's ROUTES holds every node"
        );

        // One change at a time with the table full: add a new subnet, then
        // remove it again.
        progress(&format!(
            "control: {tag} {changes} single changes at {r} routes [{:.0}s]",
            started.elapsed().as_secs_f64()
        ));
        let mut visible = Vec::with_capacity(changes);
        let mut answered = Vec::with_capacity(changes);
        for j in 0..changes {
            let (v, a) = one_change(&client, &trie, r + (j / 2) % 16, j % 2 == 0);
            visible.push(v);
            answered.push(a);
        }
        report.add("change_visible_p50_us", API, percentile(&visible, 50.0));
        report.add("change_visible_p99_us", API, percentile(&visible, 99.0));
        report.add("change_answered_p50_us", API, percentile(&answered, 50.0));
        report.add("change_answered_p99_us", API, percentile(&answered, 99.0));

        let t = Instant::now();
        for i in 0..r {
            if i % 500 == 0 {
                progress(&format!(
                    "control: {tag} node_del {i}/{r} [{:.0}s]",
                    started.elapsed().as_secs_f64()
                ));
            }
            let resp = call(
                &client,
                &Request::NodeDel {
                    subnet: subnet(i).to_string(),
                },
                "node_del",
            );
            assert!(
                matches!(resp, Response::Deleted { existed: true }),
                "{resp:?}"
            );
        }
        report.add("route_deletes_per_s", API, rate(r, t.elapsed()));
        assert!(route_set(&trie).is_empty(), "every route removed");

        // hostPorts: one ADD carrying them all (and one without any, for
        // the share of the veth).
        progress(&format!(
            "control: {tag} ADD with {ENTRIES} hostPorts [{:.0}s]",
            started.elapsed().as_secs_f64()
        ));
        let bare = add_pod(0, 0);
        del_pod(0);
        let full = add_pod(1, ENTRIES);
        let del = del_pod(1);
        report.add("pod_add_ms_0_hostports", API, bare.as_secs_f64() * 1e3);
        report.add(
            &format!("pod_add_ms_{ENTRIES}_hostports"),
            API,
            full.as_secs_f64() * 1e3,
        );
        report.add("portmap_updates_per_s", API, rate(ENTRIES, full));
        report.add("portmap_deletes_per_s", API, rate(ENTRIES, del));
    }
}

/// One event of `etcdctl watch`: when it was read, PUT or DELETE, subnet.
struct WatchEvent {
    at: Instant,
    put: bool,
    subnet: Ipv4Net,
}

/// `etcdctl watch --prefix <subnets>` in the underlay namespace; its events
/// time-stamped as they are printed.
struct Watch {
    _child: ChildGuard,
    /// Locked only by whoever waits (the Receiver is not Sync).
    rx: std::sync::Mutex<mpsc::Receiver<WatchEvent>>,
}

impl Watch {
    fn start(w: &World) -> Self {
        let url = format!("http://192.168.{}.1:2379", w.k);
        let mut child = w
            .underlay
            .command("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &url, "watch", "--prefix", SUBNETS_PREFIX])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcdctl watch (apt etcd-client)");
        let stdout = child.stdout.take().expect("etcdctl stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut kind: Option<(Instant, bool)> = None;
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let at = Instant::now();
                match (line.as_str(), kind.take()) {
                    ("PUT", _) => kind = Some((at, true)),
                    ("DELETE", _) => kind = Some((at, false)),
                    (key, Some((at, put))) => {
                        if let Some(subnet) = rivet::etcd::parse_subnet_key(key)
                            && tx.send(WatchEvent { at, put, subnet }).is_err()
                        {
                            break;
                        }
                    }
                    _ => {}
                }
            }
        });
        Self {
            _child: ChildGuard(child),
            rx: std::sync::Mutex::new(rx),
        }
    }

    fn rx(&self) -> std::sync::MutexGuard<'_, mpsc::Receiver<WatchEvent>> {
        self.rx
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn drain(&self) {
        let rx = self.rx();
        while rx.try_recv().is_ok() {}
    }

    /// The first event matching `want` within 30 s.
    fn wait(&self, what: &str, want: impl Fn(&WatchEvent) -> bool) -> WatchEvent {
        let deadline = Instant::now() + Duration::from_secs(30);
        let rx = self.rx();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(ev) if want(&ev) => return ev,
                Ok(_) => {}
                Err(e) => panic!("etcd watch: no {what} event ({e})"),
            }
        }
    }
}

/// Polls every map until `done(map)` holds for all; the instant the last
/// one did. Sweeps every 100 µs.
fn until_all(
    maps: &[LpmTrie<MapData, u32, RouteInfo>],
    what: &str,
    done: impl Fn(&LpmTrie<MapData, u32, RouteInfo>) -> bool,
) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut pending: Vec<usize> = (0..maps.len()).collect();
    loop {
        pending.retain(|&i| !done(&maps[i]));
        if pending.is_empty() {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {} of {} nodes not converged after 30 s",
            pending.len(),
            maps.len()
        );
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// The etcd convergence part: sizes = cluster sizes after the join.
fn etcd_part(report: &mut Report, opts: &Options, sizes: &[usize], started: Instant) {
    let mut w = World::new();
    w.start_etcd();
    let url = format!("http://192.168.{}.1:2379", w.k);
    let watch = Watch::start(&w);
    let joiner = w.add_node();
    w.nodes[joiner].agent_args.extra_args = vec![
        "--mode".into(),
        "vxlan".into(),
        "--etcd-endpoints".into(),
        url,
        "--etcd-lease-ttl".into(),
        "10".into(),
    ];
    let mut base: Vec<usize> = Vec::new();
    for &size in sizes {
        let (join_m, total_m, leave_m) = (
            format!("join_converged_ms_n{size}"),
            format!("join_total_ms_n{size}"),
            format!("leave_converged_ms_n{size}"),
        );
        for m in [&join_m, &total_m, &leave_m] {
            report.better.insert(m.clone(), "lower".into());
        }
        while base.len() < size - 1 {
            progress(&format!(
                "control: etcd, starting node {}/{} [{:.0}s]",
                base.len() + 1,
                size - 1,
                started.elapsed().as_secs_f64()
            ));
            base.push(w.add_etcd_node("vxlan", 10));
        }
        let maps: Vec<LpmTrie<MapData, u32, RouteInfo>> = base
            .iter()
            .map(|&b| pinned_routes(&w.nodes[b].pin_dir()))
            .collect();
        let subnets: BTreeSet<Ipv4Net> = base
            .iter()
            .map(|&b| w.nodes[b].pod_cidr.parse().expect("pod CIDR"))
            .collect();
        // Synced: each base node routes to every other one.
        until_all(&maps, "base nodes synced", |m| {
            route_set(m).len() == base.len() - 1
        });
        // One warm-up join/leave, then the measured rounds.
        for round in 0..=opts.rounds {
            let tag = if round == 0 {
                "warm-up".to_owned()
            } else {
                format!("round {round}/{}", opts.rounds)
            };
            progress(&format!(
                "control: etcd N={size} {tag} join [{:.0}s]",
                started.elapsed().as_secs_f64()
            ));
            watch.drain();
            let spawned = Instant::now();
            let (registered, converged, net) = std::thread::scope(|s| {
                let waiter = s.spawn(|| {
                    let ev = watch.wait("PUT of the new node", |e| {
                        e.put && !subnets.contains(&e.subnet)
                    });
                    let done = until_all(&maps, "join", |m| has_route(m, ev.subnet));
                    (ev.at, done, ev.subnet)
                });
                w.start_agent(joiner);
                waiter.join().expect("join waiter")
            });
            w.refresh_pod_cidr(joiner);
            assert_eq!(
                w.nodes[joiner].pod_cidr,
                net.to_string(),
                "the watched PUT is the new node's"
            );
            progress(&format!(
                "control: etcd N={size} {tag} leave [{:.0}s]",
                started.elapsed().as_secs_f64()
            ));
            watch.drain();
            let (deleted, gone) = std::thread::scope(|s| {
                let waiter = s.spawn(|| {
                    let ev =
                        watch.wait("DELETE of the leaving node", |e| !e.put && e.subnet == net);
                    let done = until_all(&maps, "leave", |m| !has_route(m, net));
                    (ev.at, done)
                });
                w.nodes[joiner].agent_mut().unload();
                waiter.join().expect("leave waiter")
            });
            if round == 0 {
                continue;
            }
            let ms = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64() * 1e3;
            report.add(&join_m, ETCD, ms(registered, converged));
            report.add(&total_m, ETCD, ms(spawned, converged));
            report.add(&leave_m, ETCD, ms(deleted, gone));
        }
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Runs the benchmark; `sizes` are the cluster sizes of the etcd part.
pub fn run(opts: &Options, sizes: &[usize]) -> Report {
    let started = Instant::now();
    let load_before = loadavg();
    let prefix = unique_prefix();
    let mut report = Report {
        name: "control plane".into(),
        variants: [CODE, API, IP_ROUTE, NFT, ETCD]
            .iter()
            .map(|s| (*s).to_owned())
            .collect(),
        baseline: CODE.into(),
        ..Default::default()
    };
    for m in [
        "route_updates_per_s",
        "route_deletes_per_s",
        "endpoint_updates_per_s",
        "endpoint_deletes_per_s",
        "portmap_updates_per_s",
        "portmap_deletes_per_s",
    ] {
        report.better.insert(m.into(), "higher".into());
    }
    for m in [
        "change_visible_p50_us".to_owned(),
        "change_visible_p99_us".to_owned(),
        "change_answered_p50_us".to_owned(),
        "change_answered_p99_us".to_owned(),
        "pod_add_ms_0_hostports".to_owned(),
        format!("pod_add_ms_{ENTRIES}_hostports"),
    ] {
        report.better.insert(m, "lower".into());
    }

    // (a) the agent's code and the kernel peers, interleaved per round.
    progress("control: loading a private datapath");
    let mut private = PrivateDatapath::load(&prefix);
    let capacity = routes_capacity(private.layout.root());
    let r = ENTRIES.min(capacity.saturating_sub(64));
    let ipr = ip_route_ns(&prefix);
    let nft = nft_ns(&prefix);
    // Warm-up.
    code_routes(&mut private, r.min(500));
    code_endpoints(&mut private, 500);
    code_hostports(&mut private, 500);
    ip_routes(&ipr, r.min(500));
    nft_elements(&nft, 500);
    for round in 0..opts.rounds {
        progress(&format!(
            "control: bulk maps round {}/{} [{:.0}s]",
            round + 1,
            opts.rounds,
            started.elapsed().as_secs_f64()
        ));
        // The steps rotate like every benchmark's variants.
        let steps = ["routes", IP_ROUTE, "endpoints", "hostports", NFT];
        for step in crate::rotated(&steps, round as usize) {
            let (metric, variant, (ins, del)) = match step {
                "routes" => ("route", CODE, code_routes(&mut private, r)),
                IP_ROUTE => ("route", IP_ROUTE, ip_routes(&ipr, r)),
                "endpoints" => ("endpoint", CODE, code_endpoints(&mut private, ENTRIES)),
                "hostports" => ("portmap", CODE, code_hostports(&mut private, ENTRIES)),
                _ => ("portmap", NFT, nft_elements(&nft, ENTRIES)),
            };
            report.add(&format!("{metric}_updates_per_s"), variant, ins);
            report.add(&format!("{metric}_deletes_per_s"), variant, del);
        }
    }
    drop((private, ipr, nft));

    // (a) through the API and (b) one change.
    api_part(&mut report, opts, r, started);
    // (c) etcd convergence.
    etcd_part(&mut report, opts, sizes, started);
    progress("");

    report.notes.push(format!(
        "{r} routes (the ROUTES map holds {capacity}: 10k routes do not fit; one route and one PEERS entry per remote node), {ENTRIES} endpoints, {ENTRIES} hostPorts; {} rounds, medians over rounds; the kernel peers run in the same rounds",
        opts.rounds
    ));
    report.notes.push(
        "agent code: the functions the agent calls, on a private datapath (own pins), one BPF_MAP_UPDATE_ELEM/DELETE_ELEM per entry on an open map fd: routes = cluster::Cluster::upsert/remove (the etcd watch's path; each writes ROUTES and PEERS), endpoints = Datapath::put_endpoint/remove_endpoint (each writes ENDPOINTS and its ENDPOINT_SLOTS cache slot: two map writes per endpoint; a pod's entry at ADD; through the API an endpoint is a whole pod ADD, veth included: see `bench cni`), hostPorts = endpoint::hostport_entries + Datapath::put_hostport/remove_hostport".into(),
    );
    report.notes.push(
        "agent API: over the agent's unix socket, one connection per request: routes = one node_set / node_del per route (`rivetctl node set`); hostPorts = one endpoint_add of a pod carrying all of them (veth, record and validation included; pod_add_ms_0_hostports is the same ADD without any) and its endpoint_del".into(),
    );
    report.notes.push(
        "ip route: one `ip -batch` of route add (then del) lines, each via a neighbour on a veth, in a namespace of its own; nft map: one `nft -f` adding (then deleting) every element of an (address . port) : (address . port) map behind one DNAT rule — process start included for both".into(),
    );
    report.notes.push(
        "change_*: with the route table full as above, one node_set of a new subnet or node_del of it (alternating), timed from the request to the entry visible in (gone from) the agent's pinned ROUTES map (polled from the benchmark every 20 µs + timer slack, ~0.07 ms resolution) and to the answer; p50/p99 over the changes of one round".into(),
    );
    report.notes.push(
        "etcd: real etcd in the underlay namespace, N − 1 agents registered and synced (lease TTL 10 s), then a new node's agent starts; join_converged = from its subnet key's PUT (seen by an `etcdctl watch` beside the agents' watches) until every other node's pinned ROUTES holds the subnet (maps polled every 100 µs); join_total = from starting the agent; leave_converged = from the DELETE of its key (`rivetd unload`) until every map dropped it. The `etcdctl watch` is itself one more watcher: values near 0.1 ms mean the agents had applied the event by the time etcdctl printed it".into(),
    );
    report.notes.push(
        "goals: ≥ 300k map updates/s; one change p99 < 1 ms; convergence < 1 s at 10 nodes".into(),
    );
    report.notes.push(format!(
        "order of the bulk map rounds (agent code routes, ip route, agent code endpoints, agent code hostPorts, nft map): {}",
        crate::ROTATION
    ));
    report.notes.push(format!(
        "load average before {load_before}, after {} (2 CPUs; other builds may share the machine)",
        loadavg()
    ));
    report
}
