//! Multi-node clusters whose state lives in a real etcd (Debian etcd-server,
//! started in the underlay namespace): subnet leases, registration, watch,
//! node loss and return, flannel's schema.

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use rivet_api::{Request, Response};
use rivet_tests::{World, traffic::assert_ping, world::Counter};

fn nodes_seen(w: &World, n: usize) -> BTreeSet<String> {
    match w.nodes[n].agent().client().call(&Request::NodeList {}) {
        Ok(Response::Nodes { nodes }) => nodes.into_iter().map(|e| e.subnet).collect(),
        other => panic!("nodes of {}: {other:?}", w.nodes[n].name),
    }
}

/// Waits until `cond` holds (polling every 50 ms); returns how long it took.
fn eventually(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    start.elapsed()
}

#[test]
fn three_nodes_share_state_through_etcd() {
    let mut w = World::new();
    w.start_etcd();
    let nodes: Vec<usize> = (0..3).map(|_| w.add_etcd_node("vxlan", 3)).collect();
    let subnets: BTreeSet<String> = nodes.iter().map(|&n| w.nodes[n].pod_cidr.clone()).collect();
    assert_eq!(subnets.len(), 3, "distinct subnets: {subnets:?}");

    // Everyone learns everyone else.
    for &n in &nodes {
        let others: BTreeSet<String> = subnets
            .iter()
            .filter(|s| **s != w.nodes[n].pod_cidr)
            .cloned()
            .collect();
        let took = eventually("peers learned", Duration::from_secs(3), || {
            nodes_seen(&w, n) == others
        });
        eprintln!("node {n} saw its peers after {took:?}");
    }
    let pods: Vec<usize> = nodes.iter().map(|&n| w.add_pod(n)).collect();
    for &a in &pods {
        for &b in &pods {
            if a != b {
                assert_ping(&w.pods[a].ns, w.pods[b].ip, 2);
            }
        }
    }

    // The stored state uses flannel's schema.
    let out = w.etcdctl(&["get", "--prefix", "/rivet.io/network/"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("/rivet.io/network/config"), "{text}");
    assert!(
        text.contains(r#""Network":"#) && text.contains(r#""SubnetLen":24"#),
        "{text}"
    );
    let key = format!(
        "/rivet.io/network/subnets/{}",
        w.nodes[nodes[0]].pod_cidr.replace('/', "-")
    );
    assert!(text.contains(&key), "{key} in {text}");
    assert!(
        text.contains(&format!(r#""PublicIP":"{}""#, w.nodes[nodes[0]].ip)),
        "{text}"
    );
    assert!(
        text.contains(r#""VtepMAC":"#) && text.contains(r#""BackendType":"vxlan""#),
        "{text}"
    );

    // Node 3 dies: its lease expires and the others forget it.
    let gone = w.nodes[nodes[2]].pod_cidr.clone();
    w.nodes[nodes[2]]
        .agent_mut()
        .stop_with(nix::sys::signal::Signal::SIGKILL);
    for &n in &nodes[..2] {
        let took = eventually("dead node removed", Duration::from_secs(6), || {
            !nodes_seen(&w, n).contains(&gone)
        });
        eprintln!("node {n} removed the dead node after {took:?} (lease TTL 3 s)");
    }
    // It comes back with the same subnet, and is re-learned.
    w.nodes[nodes[2]].agent_mut().restart();
    w.refresh_pod_cidr(nodes[2]);
    assert_eq!(
        w.nodes[nodes[2]].pod_cidr, gone,
        "same subnet after a restart"
    );
    for &n in &nodes[..2] {
        let took = eventually("returning node learned", Duration::from_secs(2), || {
            nodes_seen(&w, n).contains(&gone)
        });
        eprintln!("node {n} re-learned the node after {took:?}");
    }
    assert_ping(&w.pods[pods[0]].ns, w.pods[pods[2]].ip, 2);
    assert_ping(&w.pods[pods[2]].ns, w.pods[pods[1]].ip, 2);
}

/// Nodes registering at the same time never get the same subnet (the
/// lease is a create-if-absent transaction).
#[test]
fn concurrent_registrations_get_distinct_subnets() {
    let mut w = World::new();
    w.start_etcd();
    let url = format!("http://192.168.{}.1:2379", w.k);
    let nodes: Vec<usize> = (0..5).map(|_| w.add_node()).collect();
    let mut handles = Vec::new();
    for &n in &nodes {
        let mut args = w.nodes[n].agent_args.clone();
        args.extra_args = vec![
            "--etcd-endpoints".into(),
            url.clone(),
            "--etcd-lease-ttl".into(),
            "5".into(),
        ];
        handles.push(std::thread::spawn(move || {
            rivet_tests::AgentProc::start(args)
        }));
    }
    for (&n, h) in nodes.iter().zip(handles) {
        w.nodes[n].agent = Some(h.join().expect("agent start"));
        w.refresh_pod_cidr(n);
    }
    let subnets: BTreeSet<String> = nodes.iter().map(|&n| w.nodes[n].pod_cidr.clone()).collect();
    assert_eq!(subnets.len(), nodes.len(), "{subnets:?}");
}

/// `rivetd unload` is a clean leave: the node's lease is deleted at once.
#[test]
fn unload_leaves_the_cluster() {
    let mut w = World::new();
    w.start_etcd();
    let a = w.add_etcd_node("ipip", 30);
    let b = w.add_etcd_node("ipip", 30);
    let b_subnet = w.nodes[b].pod_cidr.clone();
    eventually("b learned", Duration::from_secs(3), || {
        nodes_seen(&w, a).contains(&b_subnet)
    });
    w.nodes[b].agent_mut().unload();
    let took = eventually("b removed", Duration::from_secs(3), || {
        !nodes_seen(&w, a).contains(&b_subnet)
    });
    assert!(
        took < Duration::from_secs(3),
        "removed by the delete, not by the 30 s lease"
    );
}

/// Wire compatibility with an implementation we did not write: a node set up
/// the way flanneld sets one up (a kernel `vxlan` device, VNI 1, port 8472,
/// learning off, the per-peer onlink route, permanent neighbour and FDB
/// entries, its lease in etcd in flannel's format) exchanges pod traffic
/// with a rivet node in both directions.
#[test]
fn interoperates_with_a_flannel_style_kernel_vxlan_node() {
    let mut w = World::new();
    w.start_etcd();
    let r = w.add_etcd_node("vxlan", 30);
    let rpod = w.add_pod(r);
    let f = w.add_node(); // no agent: the flannel-style node
    let k = w.k;
    let rivet_subnet: ipnet::Ipv4Net = w.nodes[r].pod_cidr.parse().expect("subnet");
    let fsubnet: ipnet::Ipv4Net = (1..=254u8)
        .map(|i| format!("10.{k}.{i}.0/24").parse().expect("net"))
        .find(|n: &ipnet::Ipv4Net| *n != rivet_subnet)
        .expect("a free subnet");
    let fnode = rivet_tests::flannel::setup_node(&w, f, fsubnet);
    let fip = w.nodes[f].ip;

    // Its lease, in flannel's format, where rivet's agents watch.
    let key = format!(
        "/rivet.io/network/subnets/{}-{}",
        fsubnet.network(),
        fsubnet.prefix_len()
    );
    let value = format!(
        r#"{{"PublicIP":"{fip}","PublicIPv6":null,"BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"{}"}}}}"#,
        fnode.vtep_mac
    );
    let put = w.etcdctl(&["put", &key, &value]);
    assert!(
        put.status.success(),
        "etcdctl put: {}",
        String::from_utf8_lossy(&put.stderr)
    );

    // What flanneld writes for the rivet node (learned from its lease).
    let rmac = rivet::netlink::format_mac(&rivet::node::vtep_mac_for(w.nodes[r].ip));
    rivet_tests::flannel::add_peer(&w, &fnode, rivet_subnet, &rmac, w.nodes[r].ip);

    // A pod on the flannel node behind the reference bridge plugin (cni0),
    // as flannel's CNI plugin delegates.
    let fpod = rivet_tests::flannel::add_pod(&w, &fnode, "fpod");
    let fpod_ip = fpod.ip;

    // The rivet node learns the flannel node from etcd.
    let fsub = fsubnet.to_string();
    eventually("flannel node learned", Duration::from_secs(3), || {
        nodes_seen(&w, r).contains(&fsub)
    });

    assert_ping(&w.pods[rpod].ns, fpod_ip, 3);
    assert_ping(&fpod.ns, w.pods[rpod].ip, 3);
    let moved = rivet_tests::traffic::tcp_transfer(
        &fpod.ns,
        &w.pods[rpod].ns,
        w.pods[rpod].ip,
        7300,
        2 << 20,
    );
    assert_eq!(moved, 2 << 20);
    let moved =
        rivet_tests::traffic::tcp_transfer(&w.pods[rpod].ns, &fpod.ns, fpod_ip, 7301, 2 << 20);
    assert_eq!(moved, 2 << 20);
    let c = w.nodes[r].counters();
    assert!(
        c[Counter::FwdEncapVxlan] >= 3 && c[Counter::DecapVxlan] >= 3,
        "{c:?}"
    );
}
