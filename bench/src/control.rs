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
//!
//! (d) The Kubernetes API as the source: 1,000 Node objects (simulated
//! peers), 10,000 Services and 10,000 EndpointSlices of 10 endpoints in the
//! test API server before one agent starts; its initial sync to ready
//! (with the maps checked), the convergence of one new Node, one new
//! Service and one endpoint added to a slice into the pinned maps, and the
//! agent's memory and CPU after the sync, idle and under endpoint churn.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{BufRead as _, Write as _},
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use aya::maps::{HashMap as AyaHashMap, LpmTrie, Map, MapData, MapError, lpm_trie::Key};
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
use rivet_common::{
    EndpointInfo, EndpointKey, PeerInfo, RouteInfo, SvcBackend, SvcBackendKey, SvcInfo, SvcKey,
    endpoint_flags, ipv4_from_key, ipv4_key, map_names, svc_scope,
};
use serde_json::{Value, json};

use crate::{Options, Report, percentile, progress, rss_mib};
use rivet_tests::{Netns, World, apiserver::node_object, traffic::ChildGuard, unique_prefix};

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

/// (a) Bulk map updates: the agent's code on a private datapath and the
/// kernel peers, interleaved per round.
fn bulk_part(report: &mut Report, opts: &Options, prefix: &str, started: Instant) {
    progress("control: loading a private datapath");
    let mut private = PrivateDatapath::load(prefix);
    let capacity = routes_capacity(private.layout.root());
    let r = routes_in_table(capacity);
    let ipr = ip_route_ns(prefix);
    let nft = nft_ns(prefix);
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
    report.notes.push(format!(
        "{r} routes (the ROUTES map holds {capacity}: 10k routes do not fit; one route and one PEERS entry per remote node), {ENTRIES} endpoints, {ENTRIES} hostPorts; {} rounds, medians over rounds; the kernel peers run in the same rounds",
        opts.rounds
    ));
    report.notes.push(
        "agent code: the functions the agent calls, on a private datapath (own pins), one BPF_MAP_UPDATE_ELEM/DELETE_ELEM per entry on an open map fd: routes = cluster::Cluster::upsert/remove (the etcd watch's path; each writes ROUTES and PEERS), endpoints = Datapath::put_endpoint/remove_endpoint (each writes ENDPOINTS and its ENDPOINT_SLOTS cache slot: two map writes per endpoint; a pod's entry at ADD; through the API an endpoint is a whole pod ADD, veth included: see `bench cni`), hostPorts = endpoint::hostport_entries + Datapath::put_hostport/remove_hostport".into(),
    );
    report.notes.push(
        "ip route: one `ip -batch` of route add (then del) lines, each via a neighbour on a veth, in a namespace of its own; nft map: one `nft -f` adding (then deleting) every element of an (address . port) : (address . port) map behind one DNAT rule — process start included for both".into(),
    );
    report.notes.push(format!(
        "order of the bulk map rounds (agent code routes, ip route, agent code endpoints, agent code hostPorts, nft map): {}",
        crate::ROTATION
    ));
}

/// Routes, one change and hostPorts through a running agent's API.
fn api_part(report: &mut Report, opts: &Options, started: Instant) {
    let mut w = World::new();
    let n = w.add_node_with_agent();
    let client = w.nodes[n].agent().client();
    let trie = pinned_routes(&w.nodes[n].pin_dir());
    let r = routes_in_table(routes_capacity(&w.nodes[n].pin_dir()));
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

// ------------------------------------------------- (d) the Kubernetes API

/// The parts of the benchmark (`--only`; every part by default).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Part {
    /// (a) bulk map updates: the agent's code vs `ip route` and nft.
    Bulk,
    /// (a) through the agent's API and (b) one change with the table full.
    Api,
    /// (c) etcd convergence when a node joins and leaves.
    Etcd,
    /// (d) the Kubernetes API source: 1,000 nodes, 10,000 Services.
    Kube,
}

/// Simulated peers (Node objects) in the API server before the agent starts.
const KUBE_NODES: usize = 1000;
/// Services, one EndpointSlice each.
const KUBE_SERVICES: usize = 10_000;
/// Endpoints per slice.
const KUBE_PER_SLICE: usize = 10;
/// Namespace of the Services and slices.
const KUBE_NS: &str = "bench";
/// flannel's annotation prefix.
const FLANNEL: &str = "flannel.alpha.coreos.com/";
/// Poll period of the pinned maps while a change converges.
const KUBE_POLL: Duration = Duration::from_micros(250);
/// Poll period of the agent's status until it is ready (each poll is a
/// request the agent answers: not faster, or it would slow the sync).
const KUBE_READY_POLL: Duration = Duration::from_millis(10);
/// How long one change may take before the run fails.
const KUBE_CHANGE_LIMIT: Duration = Duration::from_secs(30);
/// Pause before each single change, so that it meets an agent done with
/// the previous one (its store write included).
const KUBE_GAP: Duration = Duration::from_millis(20);
/// The first slice the churn changes (after the sampled ones).
const CHURN_FIRST: usize = 5_000;
/// Endpoint changes per second during the churn.
const CHURN_RATE: usize = 100;
/// The Service frontends' port (TCP) and the backends' port.
const KUBE_PORT: u16 = 80;
const KUBE_TARGET: u16 = 8080;

const KUBE_NODE: &str = "kube: new Node";
const KUBE_SERVICE: &str = "kube: new Service";
const KUBE_ENDPOINT: &str = "kube: endpoint added";
const KUBE: &str = "kube: agent";

/// The Kubernetes part's objects on world `k`'s address plan: cluster CIDR
/// 10.k.0.0/16 (the measured node holds 10.k.1.0/24); simulated peers'
/// pod CIDRs are /27s from 10.k.16.0, their public IPs 192.168.k.100–249
/// (unused underlay addresses, several peers to each: nothing is ever sent
/// to them); ClusterIPs from 10.96.0.16.
struct KubeObjects {
    k: u8,
    prefix: String,
}

impl KubeObjects {
    /// Simulated nodes whose /27 fits in the cluster CIDR.
    const MAX_NODES: usize = 240 * 8;

    fn node_name(&self, i: usize) -> String {
        format!("{}-sim{i}", self.prefix)
    }

    fn node_subnet(&self, i: usize) -> Ipv4Net {
        let base = u32::from(Ipv4Addr::new(10, self.k, 16, 0)) + ((i as u32) << 5);
        Ipv4Net::new(Ipv4Addr::from(base), 27).unwrap_or_default()
    }

    fn public_ip(&self, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(192, 168, self.k, 100 + (i % 150) as u8)
    }

    /// Node `i` as a flannel node registers it (pod CIDR, annotations).
    fn node(&self, i: usize) -> Value {
        let ip = self.public_ip(i);
        let mac = rivet::node::vtep_mac_for(ip)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":");
        let mut n = node_object(&self.node_name(i), Some(&self.node_subnet(i).to_string()));
        n["metadata"]["annotations"] = json!({
            format!("{FLANNEL}backend-type"): "vxlan",
            format!("{FLANNEL}backend-data"): format!(r#"{{"VNI":1,"VtepMAC":"{mac}"}}"#),
            format!("{FLANNEL}public-ip"): ip.to_string(),
            format!("{FLANNEL}kube-subnet-manager"): "true",
        });
        n
    }

    fn cluster_ip(i: usize) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 16)) + i as u32)
    }

    fn service(i: usize) -> Value {
        let ip = Self::cluster_ip(i).to_string();
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": format!("svc{i}"), "namespace": KUBE_NS},
            "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
                     "ports": [{"name": "http", "port": KUBE_PORT, "targetPort": KUBE_TARGET, "protocol": "TCP"}]},
        })
    }

    /// Endpoint `e` of slice `i`: on simulated node (10 i + e) mod 1,000, at
    /// an address in that node's pod CIDR.
    fn backend(&self, i: usize, e: usize) -> (Ipv4Addr, String) {
        let j = i * KUBE_PER_SLICE + e;
        let node = j % KUBE_NODES;
        let host = 1 + (j / KUBE_NODES) % 30;
        (
            Ipv4Addr::from(u32::from(self.node_subnet(node).network()) + host as u32),
            self.node_name(node),
        )
    }

    /// Service `i`'s slice with `endpoints` endpoints; the first one not
    /// ready when `first_unready`.
    fn slice(&self, i: usize, endpoints: usize, first_unready: bool) -> Value {
        let eps: Vec<Value> = (0..endpoints)
            .map(|e| {
                let (addr, node) = self.backend(i, e);
                json!({"addresses": [addr.to_string()],
                       "conditions": {"ready": !(first_unready && e == 0)},
                       "nodeName": node})
            })
            .collect();
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("svc{i}-1"), "namespace": KUBE_NS,
                         "labels": {"kubernetes.io/service-name": format!("svc{i}")}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": KUBE_TARGET, "protocol": "TCP"}],
            "endpoints": eps,
        })
    }
}

/// Entries of a pinned hash map (by walking its keys).
fn pinned_entries<K: aya::Pod, V: aya::Pod>(pin_dir: &Path, name: &str) -> usize {
    let path = PinLayout::new(pin_dir).map(name);
    let data = MapData::from_pin(&path)
        .unwrap_or_else(|e| panic!("opening the pinned {}: {e}", path.display()));
    let map: AyaHashMap<MapData, K, V> = AyaHashMap::try_from(Map::HashMap(data))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    map.keys().filter(Result::is_ok).count()
}

/// The ClusterIP frontend of Service `i` (TCP, pods' scope).
fn frontend_key(i: usize) -> SvcKey {
    SvcKey {
        addr: ipv4_key(KubeObjects::cluster_ip(i).octets()),
        port: KUBE_PORT.to_be(),
        proto: 6,
        scope: svc_scope::INTERNAL,
    }
}

/// Backends of Service `i`'s frontend (None: no frontend).
fn backend_count(map: &AyaHashMap<MapData, SvcKey, SvcInfo>, i: usize) -> Option<u32> {
    match map.get(&frontend_key(i), 0) {
        Ok(info) => Some(info.count),
        Err(MapError::KeyNotFound) => None,
        Err(e) => panic!("looking Service {i} up in SVC_FRONTENDS: {e}"),
    }
}

/// Polls until `done` holds (every [`KUBE_POLL`]); the instant it did, or
/// None after `limit`.
fn poll_until(limit: Duration, done: impl FnMut() -> bool) -> Option<Instant> {
    poll_every(KUBE_POLL, limit, done)
}

/// Polls until `done` holds, every `period`; the instant it did, or None
/// after `limit`.
fn poll_every(
    period: Duration,
    limit: Duration,
    mut done: impl FnMut() -> bool,
) -> Option<Instant> {
    let deadline = Instant::now() + limit;
    loop {
        if done() {
            return Some(Instant::now());
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(period);
    }
}

/// A `kB` field of `/proc/<pid>/<file>` in MiB (NaN when absent).
fn proc_mib(pid: u32, file: &str, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/{file}"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

/// The agent's CPU time so far (utime + stime of `/proc/<pid>/stat`, every
/// thread), in seconds.
fn cpu_secs(pid: u32) -> f64 {
    // SAFETY: sysconf only reads a system constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as f64 } else { 100.0 };
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            // After the command name (which may hold spaces): state is
            // field 3, utime 14, stime 15.
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let utime: u64 = f.get(11)?.parse().ok()?;
            let stime: u64 = f.get(12)?.parse().ok()?;
            Some((utime + stime) as f64 / hz)
        })
        .unwrap_or(f64::NAN)
}

/// The agent's status over its socket (None while it has no socket).
fn agent_status(client: &rivet_api::Client) -> Option<rivet_api::AgentStatus> {
    match client.call(&Request::Status {}) {
        Ok(Response::Status(s)) => Some(s),
        _ => None,
    }
}

/// The last `n` lines of the agent's log.
fn log_tail(log: &str, n: usize) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The agent's log lines that say `what` (the message), trimmed.
fn log_lines<'a>(log: &'a str, what: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    log.lines().filter(move |l| l.contains(what)).map(str::trim)
}

/// (d) The Kubernetes API as the source.
fn kube_part(report: &mut Report, opts: &Options, started: Instant) {
    let samples = opts.pick(100, 50);
    let idle = Duration::from_secs(opts.pick(10, 5));
    let churn_secs = opts.pick(10, 5);
    let step = |what: &str| {
        progress(&format!(
            "control: kube {what} [{:.0}s]",
            started.elapsed().as_secs_f64()
        ));
    };
    let mut w = World::new();
    let api = w.start_apiserver();
    let objs = KubeObjects {
        k: w.k,
        prefix: w.prefix.clone(),
    };
    assert!(
        KUBE_NODES + samples <= KubeObjects::MAX_NODES,
        "the simulated nodes' /27s fit in the cluster CIDR"
    );
    let n = w.add_node();
    let (name, cidr) = (w.nodes[n].name.clone(), w.nodes[n].pod_cidr.clone());
    w.use_apiserver(&api, n, "vxlan");
    // For investigations: `RIVET_BENCH_KUBE_ENV=K=V,K=V` is the agent's
    // extra environment (e.g. allocator settings).
    let agent_env = std::env::var("RIVET_BENCH_KUBE_ENV").unwrap_or_default();
    for kv in agent_env.split(',') {
        if let Some((k, v)) = kv.split_once('=') {
            w.nodes[n].agent_args.env.push((k.to_owned(), v.to_owned()));
        }
    }

    // The cluster, loaded before the agent starts.
    step("loading 1,000 Nodes, 10,000 Services and EndpointSlices into the API server");
    let load = Instant::now();
    let mut all = Vec::with_capacity(2 + KUBE_NODES + 2 * KUBE_SERVICES);
    all.push(node_object(&name, Some(&cidr)));
    all.push(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUBE_NS}}));
    all.extend((0..KUBE_NODES).map(|i| objs.node(i)));
    for i in 0..KUBE_SERVICES {
        all.push(KubeObjects::service(i));
        all.push(objs.slice(i, KUBE_PER_SLICE, false));
    }
    let objects = all.len();
    api.apply_all(all);
    let load_s = load.elapsed().as_secs_f64();

    // (1) From the process start to ready.
    step("initial sync");
    let t0 = Instant::now();
    w.start_agent(n);
    let client = w.nodes[n].agent().client();
    let mut last = None;
    let ready_at = poll_every(KUBE_READY_POLL, Duration::from_secs(300), || {
        last = agent_status(&client);
        last.as_ref().is_some_and(|s| s.ready)
    });
    let Some(ready_at) = ready_at else {
        panic!(
            "kube: the agent is not ready after 300 s: {:?}\nlog:\n{}",
            last.and_then(|s| s.not_ready),
            log_tail(&w.nodes[n].agent().log(), 40)
        )
    };
    let sync_ms = ready_at.duration_since(t0).as_secs_f64() * 1e3;
    let pid = w.nodes[n].agent().pid().expect("the agent's pid");
    let rss_sync = rss_mib(pid);
    let anon_sync = proc_mib(pid, "smaps_rollup", "Anonymous");
    let cpu_sync = cpu_secs(pid);

    // The maps at ready: every peer routed, every Service's frontend with
    // its 10 backends.
    let pin_dir = w.nodes[n].pin_dir();
    let routes = pinned_routes(&pin_dir);
    let frontends = crate::pinned_frontends(&pin_dir);
    let complete = || {
        route_set(&routes).len() == KUBE_NODES
            && (0..KUBE_SERVICES)
                .all(|i| backend_count(&frontends, i) == Some(KUBE_PER_SLICE as u32))
    };
    let complete_at_ready = complete();
    if !complete_at_ready {
        let late = poll_until(Duration::from_secs(60), complete);
        let routed = route_set(&routes).len();
        let served = (0..KUBE_SERVICES)
            .filter(|&i| backend_count(&frontends, i) == Some(KUBE_PER_SLICE as u32))
            .count();
        match late {
            Some(at) => report.notes.push(format!(
                "kube: NOT every entry was in the maps when the agent said ready: {:.0} ms later",
                at.duration_since(ready_at).as_secs_f64() * 1e3
            )),
            None => panic!(
                "kube: after the initial sync ROUTES holds {routed} of {KUBE_NODES} peers and {served} of {KUBE_SERVICES} Services have their {KUBE_PER_SLICE} backends\nlog:\n{}",
                log_tail(&w.nodes[n].agent().log(), 40)
            ),
        }
    }
    let fills: Vec<(&str, usize)> = [
        map_names::ROUTES,
        map_names::PEERS,
        map_names::SVC_FRONTENDS,
        map_names::SVC_BACKENDS,
    ]
    .into_iter()
    .map(|m| {
        let count = match m {
            map_names::ROUTES => route_set(&routes).len(),
            map_names::PEERS => pinned_entries::<EndpointKey, PeerInfo>(&pin_dir, m),
            map_names::SVC_FRONTENDS => pinned_entries::<SvcKey, SvcInfo>(&pin_dir, m),
            _ => pinned_entries::<SvcBackendKey, SvcBackend>(&pin_dir, m),
        };
        (m, count)
    })
    .collect();
    let status_fills = agent_status(&client)
        .map(|s| {
            s.maps
                .iter()
                .filter(|m| fills.iter().any(|(f, _)| *f == m.name))
                .map(|m| format!("{} {}/{}", m.name, m.entries, m.capacity))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    let sync_log: Vec<String> = {
        let log = w.nodes[n].agent().log();
        log_lines(&log, "listed from the Kubernetes API")
            .chain(log_lines(&log, "synced"))
            .map(str::to_owned)
            .collect()
    };

    // (3a) Idle.
    step(&format!("idle {} s", idle.as_secs()));
    std::thread::sleep(Duration::from_secs(2));
    let (c0, i0) = (cpu_secs(pid), Instant::now());
    std::thread::sleep(idle);
    let idle_cpu = (cpu_secs(pid) - c0) / i0.elapsed().as_secs_f64() * 100.0;
    let rss_idle = rss_mib(pid);

    // (2) One change at a time, the three kinds interleaved and rotated.
    let kinds = [KUBE_NODE, KUBE_SERVICE, KUBE_ENDPOINT];
    let mut took: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut calls: Vec<f64> = Vec::new();
    // One warm-up of each (not recorded), then the samples.
    for j in 0..=samples {
        if j % 10 == 0 {
            step(&format!("one change {j}/{samples}"));
        }
        for kind in crate::rotated(&kinds, j) {
            std::thread::sleep(KUBE_GAP);
            let call = Instant::now();
            // Sample j uses node 1,000 + j, Service 10,000 + j, slice j.
            let (applied, seen) = match kind {
                KUBE_NODE => {
                    let net = objs.node_subnet(KUBE_NODES + j);
                    assert!(!has_route(&routes, net), "{net} before its Node");
                    api.apply(objs.node(KUBE_NODES + j));
                    let applied = Instant::now();
                    (
                        applied,
                        poll_until(KUBE_CHANGE_LIMIT, || has_route(&routes, net)),
                    )
                }
                KUBE_SERVICE => {
                    let i = KUBE_SERVICES + j;
                    assert!(
                        backend_count(&frontends, i).is_none(),
                        "Service {i} before it"
                    );
                    api.apply(KubeObjects::service(i));
                    let applied = Instant::now();
                    api.apply(objs.slice(i, KUBE_PER_SLICE, false));
                    (
                        applied,
                        poll_until(KUBE_CHANGE_LIMIT, || {
                            backend_count(&frontends, i) == Some(KUBE_PER_SLICE as u32)
                        }),
                    )
                }
                _ => {
                    api.apply(objs.slice(j, KUBE_PER_SLICE + 1, false));
                    let applied = Instant::now();
                    (
                        applied,
                        poll_until(KUBE_CHANGE_LIMIT, || {
                            backend_count(&frontends, j) == Some(KUBE_PER_SLICE as u32 + 1)
                        }),
                    )
                }
            };
            let Some(seen) = seen else {
                panic!(
                    "kube: {kind} (sample {j}) not in the maps after {KUBE_CHANGE_LIMIT:?}\nlog:\n{}",
                    log_tail(&w.nodes[n].agent().log(), 40)
                )
            };
            if j > 0 {
                let ms = seen.saturating_duration_since(applied).as_secs_f64() * 1e3;
                took.entry(kind).or_default().push(ms);
                calls.push(applied.duration_since(call).as_secs_f64() * 1e3);
            }
        }
    }

    // (3b) Churn: CHURN_RATE endpoint changes per second (one endpoint of
    // a different slice made not ready each time), paced.
    let changes = CHURN_RATE * churn_secs as usize;
    step(&format!(
        "churn: {changes} endpoint changes over {churn_secs} s"
    ));
    let (c0, t_churn) = (cpu_secs(pid), Instant::now());
    let period = Duration::from_secs(1) / CHURN_RATE as u32;
    let mut rss_churn: Vec<f64> = Vec::new();
    let mut behind = Duration::ZERO;
    for c in 0..changes {
        let due = t_churn + period * c as u32;
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        } else {
            behind = behind.max(now - due);
        }
        api.apply(objs.slice(CHURN_FIRST + c, KUBE_PER_SLICE, true));
        if c % CHURN_RATE == CHURN_RATE - 1 {
            rss_churn.push(rss_mib(pid));
        }
    }
    let window = t_churn + Duration::from_secs(churn_secs);
    if let Some(left) = window.checked_duration_since(Instant::now()) {
        std::thread::sleep(left);
    }
    let churn_cpu = (cpu_secs(pid) - c0) / t_churn.elapsed().as_secs_f64() * 100.0;
    let last_change = t_churn + period * (changes as u32 - 1);
    let unready = KUBE_PER_SLICE as u32 - 1;
    let settled = poll_until(KUBE_CHANGE_LIMIT, || {
        (0..changes).all(|c| backend_count(&frontends, CHURN_FIRST + c) == Some(unready))
    });
    let Some(settled) = settled else {
        let done = (0..changes)
            .filter(|&c| backend_count(&frontends, CHURN_FIRST + c) == Some(unready))
            .count();
        panic!(
            "kube: {done} of {changes} churned slices in the maps {KUBE_CHANGE_LIMIT:?} after the churn\nlog:\n{}",
            log_tail(&w.nodes[n].agent().log(), 40)
        )
    };
    let settled_ms = settled.saturating_duration_since(last_change).as_secs_f64() * 1e3;
    let rss_churn_max = rss_churn.iter().copied().fold(f64::NAN, f64::max);
    let rss_end = rss_mib(pid);

    // (1b) A restart: the store already holds every object, so the lists
    // change nothing and nothing is written.
    step("restart with the objects stored");
    let restart_from = w.nodes[n].agent().log().len();
    w.nodes[n].agent_mut().stop();
    let t0 = Instant::now();
    w.nodes[n].agent_mut().restart();
    let Some(ready_again) = poll_every(KUBE_READY_POLL, Duration::from_secs(300), || {
        agent_status(&client).is_some_and(|s| s.ready)
    }) else {
        panic!(
            "kube: the restarted agent is not ready after 300 s\nlog:\n{}",
            log_tail(&w.nodes[n].agent().log(), 40)
        )
    };
    let restart_ms = ready_again.duration_since(t0).as_secs_f64() * 1e3;
    let pid = w.nodes[n].agent().pid().expect("the agent's pid");
    let rss_restart = rss_mib(pid);
    std::thread::sleep(Duration::from_secs(2));
    let rss_restart_settled = rss_mib(pid);
    let restart_log: Vec<String> = {
        let log = w.nodes[n].agent().log();
        let log = log.get(restart_from..).unwrap_or_default().to_owned();
        log_lines(&log, "listed from the Kubernetes API")
            .chain(log_lines(&log, "read back"))
            .map(str::to_owned)
            .collect()
    };

    if let Some(dir) = std::env::var_os("RIVET_BENCH_KUBE_LOG") {
        let to = PathBuf::from(dir).join("kube-agent.log");
        if let Err(e) = std::fs::copy(&w.nodes[n].agent_args.log, &to) {
            eprintln!("control: copying the agent log to {}: {e}", to.display());
        }
    }

    // The figures.
    let ms_metrics = [
        "kube_initial_sync_ms",
        "kube_restart_sync_ms",
        "kube_converge_ms",
        "kube_converge_p50_ms",
        "kube_converge_p99_ms",
        "kube_churn_settled_ms",
    ];
    for m in ms_metrics {
        report.better.insert(m.into(), "lower".into());
    }
    for m in [
        "kube_rss_mib_after_sync",
        "kube_rss_mib_after_restart",
        "kube_rss_mib_idle",
        "kube_rss_mib_churn_max",
        "kube_idle_cpu_percent",
        "kube_churn_cpu_percent",
    ] {
        report.better.insert(m.into(), "lower".into());
    }
    report.add("kube_initial_sync_ms", KUBE, sync_ms);
    report.add("kube_rss_mib_after_sync", KUBE, rss_sync);
    report.add("kube_restart_sync_ms", KUBE, restart_ms);
    report.add("kube_rss_mib_after_restart", KUBE, rss_restart_settled);
    report.add("kube_rss_mib_idle", KUBE, rss_idle);
    report.add("kube_idle_cpu_percent", KUBE, idle_cpu);
    report.add("kube_churn_cpu_percent", KUBE, churn_cpu);
    report.add("kube_rss_mib_churn_max", KUBE, rss_churn_max);
    report.add("kube_churn_settled_ms", KUBE, settled_ms);
    for (m, count) in &fills {
        report.add(
            &format!("kube_{}_entries", m.to_lowercase()),
            KUBE,
            *count as f64,
        );
    }
    let mut p99 = BTreeMap::new();
    for kind in kinds {
        let v = took.get(kind).map_or(&[][..], Vec::as_slice);
        for ms in v {
            report.add("kube_converge_ms", kind, *ms);
        }
        report.add("kube_converge_p50_ms", kind, percentile(v, 50.0));
        report.add("kube_converge_p99_ms", kind, percentile(v, 99.0));
        p99.insert(kind, (percentile(v, 50.0), percentile(v, 99.0), v.len()));
    }

    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    report.notes.push(format!(
        "kube: the test API server (the Kubernetes wire protocol: chunked lists, watches with bookmarks) in the underlay namespace, holding before the agent starts {objects} objects ({:.1} s to load): the measured node's Node (Ready, podCIDR {cidr}), {KUBE_NODES} simulated peers (Node objects with a /27 podCIDR from 10.{k}.16.0 in the cluster CIDR 10.{k}.0.0/16 and flannel's vxlan annotations; public-ip 192.168.{k}.100–249, unused underlay addresses shared by several peers, to which nothing is ever sent), the Namespace `{KUBE_NS}`, {KUBE_SERVICES} ClusterIP Services (TCP {KUBE_PORT} → {KUBE_TARGET}) and one EndpointSlice each of {KUBE_PER_SLICE} ready endpoints ({} endpoints; addresses in the simulated nodes' pod CIDRs, nodeName a simulated node); one real node whose rivetd (vxlan) takes everything from the API (`source = \"kubernetes\"`, a kubeconfig, log `info,rivet=debug`)",
        load_s,
        KUBE_SERVICES * KUBE_PER_SLICE,
        k = objs.k,
    ));
    report.notes.push(format!(
        "kube_initial_sync_ms: from spawning rivetd to its status saying ready (polled every {} ms over its socket: every kind listed, the Nodes synced, the uplink attached); then the pinned maps are checked: ROUTES holds the {KUBE_NODES} peers and every Service's ClusterIP frontend has its {KUBE_PER_SLICE} backends ({}); map entries after the sync (pinned maps): {}; the agent's status: {status_fills}",
        KUBE_READY_POLL.as_millis(),
        if complete_at_ready {
            "they did at ready"
        } else {
            "they did NOT all at ready"
        },
        fills
            .iter()
            .map(|(m, c)| format!("{m} {c}"))
            .collect::<Vec<_>>()
            .join(", "),
    ));
    report.notes.push(format!(
        "kube: the agent's log of its initial sync (the \"objects checked (Services synced) and written\" lines split each list's commit into checking + writing the Service maps, `checked_ms`, and writing the object store's files, `written_ms`): {}",
        sync_log.join(" | ")
    ));
    report.notes.push(format!(
        "kube_restart_sync_ms: after the churn, rivetd stopped (SIGTERM) and started again with its object store holding every object: from the spawn to ready {restart_ms:.0} ms, VmRSS at ready {rss_restart:.1} MiB and 2 s later {rss_restart_settled:.1} MiB; its log: {}",
        restart_log.join(" | ")
    ));
    report.notes.push(format!(
        "kube_converge_ms: {samples} samples of each change after one warm-up of each, interleaved (the kinds rotate per sample), each timed from the test API server's apply returning (the object in its store, its watch event sent to the open watches) to the entry seen in the agent's pinned maps, polled every {:.2} ms, each change {} ms after the previous one converged: a new Node (flannel annotations, a new /27) → its route in ROUTES; a new Service then its EndpointSlice (applied right after) → its ClusterIP frontend in SVC_FRONTENDS with its {KUBE_PER_SLICE} backends; an endpoint added to an existing slice → the frontend's backend count at {}. Per kind p50 / p99 / n: {}",
        KUBE_POLL.as_secs_f64() * 1e3,
        KUBE_GAP.as_millis(),
        KUBE_PER_SLICE + 1,
        p99.iter()
            .map(|(k, (p50, p99, n))| format!("{k} {p50:.1} / {p99:.1} ms / {n}"))
            .collect::<Vec<_>>()
            .join("; ")
    ));
    report.notes.push(format!(
        "kube: the apply call itself (the test API server's store write and watch notification, in the benchmark's process) took p50 {:.3} / p99 {:.3} ms; a change seen before the call returned counts ~0 ms",
        percentile(&calls, 50.0),
        percentile(&calls, 99.0)
    ));
    report.notes.push(format!(
        "kube CPU and memory: rivetd's VmRSS (/proc/<pid>/status) at ready {rss_sync:.1} MiB (anonymous {anon_sync:.1} MiB, /proc/<pid>/smaps_rollup), after the idle period {rss_idle:.1} MiB, during the churn at most {rss_churn_max:.1} MiB, at its end {rss_end:.1} MiB; CPU = utime + stime of /proc/<pid>/stat (every thread; {:.1} s through the initial sync) over the wall time, in % of one core: idle {idle_cpu:.2} % over {} s (2 s after ready, nothing applied), churn {churn_cpu:.1} % over {churn_secs} s of {CHURN_RATE} endpoint changes per second ({changes} slices, one endpoint each made not ready, paced from the benchmark; at most {:.1} ms behind schedule); every churned slice was in the maps {settled_ms:.0} ms after the last change",
        cpu_sync,
        idle.as_secs(),
        behind.as_secs_f64() * 1e3,
    ));
    let p99_of = |k: &str| p99.get(k).map_or(f64::NAN, |v| v.1);
    let mut goals = vec![format!(
        "goal: kube initial sync < 10 s: {:.2} s — {}",
        sync_ms / 1e3,
        verdict(sync_ms < 10_000.0)
    )];
    for kind in kinds {
        let v = p99_of(kind);
        goals.push(format!(
            "goal: kube convergence p99 < 1 s, {kind}: {v:.1} ms — {}",
            verdict(v < 1000.0)
        ));
    }
    goals.push(format!(
        "goal: kube agent RSS < 200 MiB after the initial sync: {rss_sync:.1} MiB — {}",
        verdict(rss_sync < 200.0)
    ));
    goals.push(format!(
        "goal: kube idle CPU < 1 % of a core: {idle_cpu:.2} % — {}",
        verdict(idle_cpu < 1.0)
    ));
    for g in &goals {
        eprintln!("\n{g}");
    }
    report.notes.extend(goals);
    drop(api);
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Routes measured with a ROUTES map of `capacity`: [`ENTRIES`], or what
/// fits with room for the single changes.
fn routes_in_table(capacity: usize) -> usize {
    ENTRIES.min(capacity.saturating_sub(64))
}

/// Runs the benchmark; `sizes` are the cluster sizes of the etcd part,
/// `parts` the parts to run (empty: every one).
pub fn run(opts: &Options, sizes: &[usize], parts: &[Part]) -> Report {
    let runs = |p: Part| parts.is_empty() || parts.contains(&p);
    let started = Instant::now();
    let load_before = loadavg();
    let prefix = unique_prefix();
    let mut report = Report {
        name: "control plane".into(),
        variants: [
            CODE,
            API,
            IP_ROUTE,
            NFT,
            ETCD,
            KUBE,
            KUBE_NODE,
            KUBE_SERVICE,
            KUBE_ENDPOINT,
        ]
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
    if runs(Part::Bulk) {
        bulk_part(&mut report, opts, &prefix, started);
    }
    // (a) through the API and (b) one change.
    if runs(Part::Api) {
        api_part(&mut report, opts, started);
    }
    // (c) etcd convergence.
    if runs(Part::Etcd) {
        etcd_part(&mut report, opts, sizes, started);
    }
    // (d) the Kubernetes API source.
    if runs(Part::Kube) {
        kube_part(&mut report, opts, started);
    }
    progress("");

    if runs(Part::Bulk) || runs(Part::Api) {
        report.notes.push(
            "agent API: over the agent's unix socket, one connection per request: routes = one node_set / node_del per route (`rivetctl node set`); hostPorts = one endpoint_add of a pod carrying all of them (veth, record and validation included; pod_add_ms_0_hostports is the same ADD without any) and its endpoint_del".into(),
        );
        report.notes.push(
            "change_*: with the route table full as above, one node_set of a new subnet or node_del of it (alternating), timed from the request to the entry visible in (gone from) the agent's pinned ROUTES map (polled from the benchmark every 20 µs + timer slack, ~0.07 ms resolution) and to the answer; p50/p99 over the changes of one round".into(),
        );
    }
    if runs(Part::Etcd) {
        report.notes.push(
            "etcd: real etcd in the underlay namespace, N − 1 agents registered and synced (lease TTL 10 s), then a new node's agent starts; join_converged = from its subnet key's PUT (seen by an `etcdctl watch` beside the agents' watches) until every other node's pinned ROUTES holds the subnet (maps polled every 100 µs); join_total = from starting the agent; leave_converged = from the DELETE of its key (`rivetd unload`) until every map dropped it. The `etcdctl watch` is itself one more watcher: values near 0.1 ms mean the agents had applied the event by the time etcdctl printed it".into(),
        );
    }
    if runs(Part::Bulk) || runs(Part::Api) || runs(Part::Etcd) {
        report.notes.push(
            "goals: ≥ 300k map updates/s; one change p99 < 1 ms; convergence < 1 s at 10 nodes"
                .into(),
        );
    }
    if !parts.is_empty() {
        report.notes.push(format!(
            "parts run (--only): {}",
            parts
                .iter()
                .map(|p| format!("{p:?}").to_lowercase())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    report.notes.push(format!(
        "load average before {load_before}, after {} (2 CPUs; other builds may share the machine)",
        loadavg()
    ));
    report
}
