//! Agents whose source of truth is the Kubernetes API (`source =
//! "kubernetes"`), run against the test API server (`rivet_tests::apiserver`,
//! the suite's only stand-in: no kube-apiserver exists on these machines; it
//! speaks the real wire protocol and kubectl is run against it in
//! `tests/apiserver.rs`). Node subnets from Node objects and flannel's
//! annotations, a flannel-style node known only through its annotations, a
//! Node deleted, watches resumed and relisted without moving a map entry,
//! Services and NetworkPolicies from the API, an ADD waiting for its Pod, a
//! rotated token.

use std::{
    collections::BTreeSet,
    net::{Ipv4Addr, SocketAddr},
    path::PathBuf,
    time::{Duration, Instant},
};

use rivet_api::{AgentStatus, ErrorKind, PodMeta, Request, Response};
use rivet_tests::{
    World,
    apiserver::{Verb, node_object},
    cni::{Plugin, rivet_conf},
    kube::{reach_tcp, rivetctl, tell_self_tcp},
    metrics::http_get,
    traffic::assert_ping,
};
use serde_json::{Value, json};

const ANN: &str = "flannel.alpha.coreos.com/";

fn status(w: &World, n: usize) -> AgentStatus {
    match w.nodes[n].agent().client().call(&Request::Status {}) {
        Ok(Response::Status(s)) => s,
        other => panic!("status of {}: {other:?}", w.nodes[n].name),
    }
}

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

fn annotation(node: &Value, key: &str) -> String {
    node["metadata"]["annotations"][format!("{ANN}{key}")]
        .as_str()
        .unwrap_or_else(|| panic!("annotation {ANN}{key} on {node}"))
        .to_owned()
}

/// Three nodes take their subnets from their Node objects, publish
/// flannel's annotations and NetworkUnavailable=False (the kubelet's Ready
/// condition kept), learn each other from the Nodes, and their pods talk.
#[test]
fn three_nodes_from_node_objects_reach_each_others_pods() {
    let mut w = World::new();
    let api = w.start_apiserver();
    let nodes: Vec<usize> = (0..3).map(|_| w.add_kube_node(&api, "vxlan")).collect();
    for &n in &nodes {
        let (name, ip) = (w.nodes[n].name.clone(), w.nodes[n].ip);
        let s = status(&w, n);
        assert_eq!(s.pod_cidr, w.nodes[n].pod_cidr, "pod CIDR from the Node");
        let obj = api.get("nodes", "", &name).expect("the Node");
        assert_eq!(annotation(&obj, "backend-type"), "vxlan");
        assert_eq!(annotation(&obj, "public-ip"), ip.to_string());
        assert_eq!(annotation(&obj, "kube-subnet-manager"), "true");
        let data: Value =
            serde_json::from_str(&annotation(&obj, "backend-data")).expect("backend-data JSON");
        let mac = rivet::netlink::format_mac(&rivet::node::vtep_mac_for(ip));
        assert_eq!(data, json!({"VNI": 1, "VtepMAC": mac}));
        let conditions = obj["status"]["conditions"].as_array().expect("conditions");
        let of = |t: &str| {
            conditions
                .iter()
                .find(|c| c["type"] == t)
                .unwrap_or_else(|| panic!("condition {t} in {conditions:?}"))
        };
        assert_eq!(of("NetworkUnavailable")["status"], "False");
        assert_eq!(of("NetworkUnavailable")["reason"], "RivetIsUp");
        assert_eq!(
            of("Ready")["status"],
            "True",
            "the kubelet's condition stays"
        );
        let others: BTreeSet<String> = nodes
            .iter()
            .filter(|&&o| o != n)
            .map(|&o| w.nodes[o].pod_cidr.clone())
            .collect();
        eventually("peers from the Nodes", Duration::from_secs(5), || {
            nodes_seen(&w, n) == others
        });
    }
    let pods: Vec<usize> = nodes.iter().map(|&n| w.add_pod(n)).collect();
    for &a in &pods {
        for &b in &pods {
            if a != b {
                assert_ping(&w.pods[a].ns, w.pods[b].ip, 2);
            }
        }
    }
    let moved = rivet_tests::traffic::tcp_transfer(
        &w.pods[pods[0]].ns,
        &w.pods[pods[2]].ns,
        w.pods[pods[2]].ip,
        7400,
        1 << 20,
    );
    assert_eq!(moved, 1 << 20);
}

/// Until its Node has a podCIDR the agent waits and says so: status, /readyz
/// and CNI STATUS (50); once the podCIDR is set it starts with it.
#[test]
fn waits_for_its_pod_cidr_and_says_why() {
    let mut w = World::new();
    let api = w.start_apiserver();
    let n = w.add_node();
    let (name, cidr) = (w.nodes[n].name.clone(), w.nodes[n].pod_cidr.clone());
    api.apply(node_object(&name, None));
    w.use_apiserver(&api, n, "vxlan");
    w.start_agent(n);
    eventually("waiting reason", Duration::from_secs(10), || {
        status(&w, n)
            .not_ready
            .is_some_and(|r| r.contains("spec.podCIDR"))
    });
    let s = status(&w, n);
    assert!(!s.ready, "{s:?}");
    let (code, body) = http_get(&w.nodes[n].ns, "/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("spec.podCIDR"), "{body}");
    let (code, _) = http_get(&w.nodes[n].ns, "/healthz");
    assert_eq!(code, 200);
    let socket = w.nodes[n].agent().socket().to_owned();
    let plugin = Plugin::rivet(&w.nodes[n].ns.path());
    let conf = rivet_conf("1.1.0", &socket);
    let msg = plugin
        .simple("STATUS", &conf)
        .expect_code(50, "CNI STATUS while waiting for the pod CIDR");
    assert!(msg.contains("spec.podCIDR"), "{msg}");
    let out = rivetctl(&socket, &["status"], "");
    assert!(!out.ok, "status must fail while waiting");
    assert!(out.stderr.contains("spec.podCIDR"), "{}", out.stderr);

    // The controller-manager allocates it.
    api.apply(node_object(&name, Some(&cidr)));
    w.wait_agent_ready(n, Duration::from_secs(30));
    assert_eq!(status(&w, n).pod_cidr, cidr);
    plugin
        .simple("STATUS", &conf)
        .expect_ok("CNI STATUS once the pod CIDR is known");
    let p = w.add_pod(n);
    assert!(
        cidr.parse::<ipnet::Ipv4Net>()
            .expect("cidr")
            .contains(&w.pods[p].ip)
    );
}

/// A node set up the way flanneld's vxlan backend sets one up, known to
/// rivet only through its Node's flannel annotations, exchanges pod traffic
/// with a rivet node both ways; and what rivet publishes is what flanneld
/// needs to program its side.
#[test]
fn flannel_node_known_by_its_annotations_exchanges_traffic() {
    let mut w = World::new();
    let api = w.start_apiserver();
    let r = w.add_kube_node(&api, "vxlan");
    let rpod = w.add_pod(r);
    let f = w.add_node(); // no agent: the flannel-style node
    let fsubnet: ipnet::Ipv4Net = w.nodes[f].pod_cidr.parse().expect("subnet");
    let fnode = rivet_tests::flannel::setup_node(&w, f, fsubnet);
    let (fname, fip) = (w.nodes[f].name.clone(), w.nodes[f].ip);
    let mut fobj = node_object(&fname, Some(&fsubnet.to_string()));
    fobj["metadata"]["annotations"] = json!({
        format!("{ANN}backend-type"): "vxlan",
        format!("{ANN}backend-data"): format!(r#"{{"VNI":1,"VtepMAC":"{}"}}"#, fnode.vtep_mac),
        format!("{ANN}public-ip"): fip.to_string(),
        format!("{ANN}kube-subnet-manager"): "true",
    });
    api.apply(fobj);

    // flanneld's side, from the rivet Node's annotations as published.
    let robj = api
        .get("nodes", "", &w.nodes[r].name)
        .expect("rivet's Node");
    let data: Value = serde_json::from_str(&annotation(&robj, "backend-data")).expect("JSON");
    let rmac = data["VtepMAC"].as_str().expect("VtepMAC").to_owned();
    let rip: Ipv4Addr = annotation(&robj, "public-ip").parse().expect("public-ip");
    let rsubnet: ipnet::Ipv4Net = robj["spec"]["podCIDR"]
        .as_str()
        .expect("podCIDR")
        .parse()
        .expect("cidr");
    rivet_tests::flannel::add_peer(&w, &fnode, rsubnet, &rmac, rip);
    let fpod = rivet_tests::flannel::add_pod(&w, &fnode, "fpod");

    let fsub = fsubnet.to_string();
    eventually("flannel node learned", Duration::from_secs(3), || {
        nodes_seen(&w, r).contains(&fsub)
    });
    assert_ping(&w.pods[rpod].ns, fpod.ip, 3);
    assert_ping(&fpod.ns, w.pods[rpod].ip, 3);
    let moved = rivet_tests::traffic::tcp_transfer(
        &fpod.ns,
        &w.pods[rpod].ns,
        w.pods[rpod].ip,
        7410,
        1 << 20,
    );
    assert_eq!(moved, 1 << 20);
}

/// A Node added, changed (its podCIDR) or deleted reaches every other
/// node's maps within 1 s; so does a Node losing flannel's annotations (no
/// network agent there any more: no peer).
#[test]
fn node_changes_reach_the_other_nodes_within_a_second() {
    let mut w = World::new();
    let api = w.start_apiserver();
    let nodes: Vec<usize> = (0..3).map(|_| w.add_kube_node(&api, "vxlan")).collect();
    // A peer with no namespace behind it (nothing is sent to it): added,
    // moved to another podCIDR, stripped of its annotations.
    let (k, peer) = (w.k, "peer-x");
    let peer_object = |cidr: &str, annotated: bool| {
        let mut obj = node_object(peer, Some(cidr));
        if annotated {
            obj["metadata"]["annotations"] = json!({
                format!("{ANN}backend-type"): "vxlan",
                format!("{ANN}public-ip"): format!("192.168.{k}.201"),
            });
        }
        obj
    };
    let (first, moved) = (format!("10.{k}.201.0/24"), format!("10.{k}.202.0/24"));
    let within = |what: &str, cond: &dyn Fn(&BTreeSet<String>) -> bool| {
        for &n in &nodes {
            let took = eventually(what, Duration::from_secs(1), || cond(&nodes_seen(&w, n)));
            eprintln!("{}: {what} after {took:?}", w.nodes[n].name);
        }
    };
    api.apply(peer_object(&first, true));
    within("Node added", &|s| s.contains(&first));
    api.apply(peer_object(&moved, true));
    within("podCIDR changed", &|s| {
        s.contains(&moved) && !s.contains(&first)
    });
    api.apply(peer_object(&moved, false));
    within("annotations removed", &|s| !s.contains(&moved));
    let gone = w.nodes[nodes[2]].pod_cidr.clone();
    for &n in &nodes[..2] {
        eventually("three nodes", Duration::from_secs(5), || {
            nodes_seen(&w, n).contains(&gone)
        });
    }
    api.delete("nodes", "", &w.nodes[nodes[2]].name)
        .expect("the Node existed");
    for &n in &nodes[..2] {
        let took = eventually("the deleted Node gone", Duration::from_secs(1), || {
            !nodes_seen(&w, n).contains(&gone)
        });
        eprintln!("{}: Node removal seen after {took:?}", w.nodes[n].name);
    }
}

fn service_objects(ip: Ipv4Addr, backends: &[(Ipv4Addr, String)]) -> Vec<Value> {
    let endpoints: Vec<Value> = backends
        .iter()
        .map(|(a, node)| json!({"addresses": [a.to_string()], "conditions": {"ready": true}, "nodeName": node}))
        .collect();
    vec![
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"clusterIP": ip.to_string(), "clusterIPs": [ip.to_string()],
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]},
        }),
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "web-1", "namespace": "default",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": endpoints,
        }),
    ]
}

fn pod_object(ns: &str, name: &str, labels: Value, node: &str, ip: Ipv4Addr) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x",
                 "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]}]},
        "status": {"phase": "Running", "podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}]},
    })
}

fn connects(w: &World, from: usize, dst: SocketAddr) -> bool {
    reach_tcp(&w.pods[from].ns, dst).is_ok()
}

/// Services and NetworkPolicies written to the API behave as through
/// `rivetctl apply`; `rivetctl apply` itself is refused on such a node; an
/// agent restart and a relist after 410 Gone move nothing; a dropped watch
/// resumes from its resourceVersion without a list.
#[test]
fn services_and_policies_from_the_api_and_watches_that_never_flap() {
    let mut w = World::new();
    let api = w.start_apiserver();
    let a = w.add_kube_node(&api, "vxlan");
    let b = w.add_kube_node(&api, "vxlan");
    let (na, nb) = (w.nodes[a].name.clone(), w.nodes[b].name.clone());
    api.apply(json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "shop", "labels": {"team": "shop"}}}));
    api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}}));
    // Pod objects first (the kubelet's view): ADDs find them.
    let (ip_web, ip_client) = (w.next_pod_ip(b), w.next_pod_ip(a));
    api.apply(pod_object(
        "shop",
        "web",
        json!({"app": "web"}),
        &nb,
        ip_web,
    ));
    api.apply(pod_object(
        "shop",
        "client",
        json!({"app": "client"}),
        &na,
        ip_client,
    ));
    let web = w.add_k8s_pod(b, "shop", "web");
    let client = w.add_k8s_pod(a, "shop", "client");
    let other = w.add_pod(a); // no Kubernetes identity: selected by nothing
    assert_eq!((w.pods[web].ip, w.pods[client].ip), (ip_web, ip_client));
    tell_self_tcp(&w.pods[web].ns, ip_web, 8080);

    // A Service through the API: its ClusterIP answers from both nodes' pods.
    let vip = Ipv4Addr::new(10, 96, w.k, 10);
    for o in service_objects(vip, &[(ip_web, nb.clone())]) {
        api.apply(o);
    }
    let dst = SocketAddr::from((vip, 80));
    eventually("ClusterIP answers", Duration::from_secs(5), || {
        reach_tcp(&w.pods[client].ns, dst).is_ok_and(|(who, _)| who == ip_web)
    });
    assert!(
        connects(&w, other, dst),
        "a pod without identity reaches it too"
    );

    // rivetctl apply is refused: the API is the source.
    let svc_yaml = "apiVersion: v1\nkind: Service\nmetadata: {name: x, namespace: default}\nspec: {clusterIP: 10.96.0.99, ports: [{port: 1}]}\n";
    let out = rivetctl(w.nodes[a].agent().socket(), &["apply", "-f", "-"], svc_yaml);
    assert!(!out.ok, "rivetctl apply must be refused");
    assert!(out.stderr.contains("Kubernetes API"), "{}", out.stderr);

    // A NetworkPolicy through the API: only app=client reaches web.
    api.apply(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "web-from-client", "namespace": "shop"},
        "spec": {"podSelector": {"matchLabels": {"app": "web"}},
                 "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}],
                              "ports": [{"port": "http"}]}]},
    }));
    let direct = SocketAddr::from((ip_web, 8080));
    eventually("the policy isolates web", Duration::from_secs(5), || {
        !connects(&w, other, direct)
    });
    assert!(
        connects(&w, client, direct),
        "app=client allowed (named port)"
    );
    assert!(connects(&w, client, dst), "through the Service too");
    assert!(
        !connects(&w, other, dst),
        "the Service's backend is isolated too"
    );

    let peers_a = nodes_seen(&w, a);
    let log_len = |w: &World, n: usize| w.nodes[n].agent().log().len();

    // A watch dropped with its history intact resumes where it was, no
    // LIST: from the resourceVersion of the latest bookmark (no Node
    // changed since the Namespace written here, so only a bookmark can
    // have told the Node watches of it).
    api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bump-a"}}));
    let rv_a = api.resource_version();
    std::thread::sleep(Duration::from_millis(2500)); // bookmarks every 1 s
    // Watches from here on get no bookmark, so that the next ones resume
    // from before the compaction below.
    api.set_bookmark_interval(Duration::from_secs(3600));
    let lists = api.count("nodes", Verb::List);
    let watches = api.watch_starts("nodes").len();
    api.drop_watches();
    eventually("node watches resumed", Duration::from_secs(10), || {
        api.watch_starts("nodes").len() >= watches + 2
    });
    assert_eq!(
        api.count("nodes", Verb::List),
        lists,
        "a resume lists nothing"
    );
    let resumed = api.watch_starts("nodes");
    for rv in &resumed[watches..] {
        let rv = rv
            .as_deref()
            .expect("a resumed watch names its resourceVersion");
        let rv: u64 = rv.parse().expect("numeric");
        assert!(
            rv >= rv_a,
            "resumed from {rv}: the bookmark at {rv_a} was not used"
        );
    }

    // 410 Gone: history compacted past where the watches are, watches
    // dropped: each agent lists again, once, and nothing moves.
    let before_b = log_len(&w, b);
    let lists = api.count("nodes", Verb::List);
    api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bump-b"}}));
    api.compact();
    api.drop_watches();
    eventually("relisted after 410", Duration::from_secs(15), || {
        api.count("nodes", Verb::List) >= lists + 2
    });
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        api.count("nodes", Verb::List),
        lists + 2,
        "one relist per agent"
    );
    let after = &w.nodes[b].agent().log()[before_b..];
    assert!(
        !after.contains("node left"),
        "a relist moved a node:\n{after}"
    );
    assert_eq!(nodes_seen(&w, a), peers_a);
    assert!(connects(&w, client, dst) && !connects(&w, other, direct));

    // An agent restart: the same state, nothing written twice.
    let before_a = log_len(&w, a);
    let stopped = w.nodes[a].agent_mut().stop().expect("it ran");
    assert!(stopped.success(), "SIGTERM: {stopped:?}");
    w.nodes[a].agent_mut().restart();
    w.wait_agent_ready(a, Duration::from_secs(30));
    let after = w.nodes[a].agent().log()[before_a..].to_owned();
    assert!(
        !after.contains("node left") && !after.contains("node joined"),
        "{after}"
    );
    for kind in [
        "services",
        "endpointslices",
        "pods",
        "namespaces",
        "networkpolicies",
    ] {
        assert!(
            after
                .lines()
                .any(|l| l.contains("listed from the Kubernetes API")
                    && l.contains(&format!("kind=\"{kind}\""))
                    && l.contains("changes=0")),
            "{kind} relisted with no change after a restart:\n{after}"
        );
    }
    assert_eq!(nodes_seen(&w, a), peers_a);
    assert!(connects(&w, client, dst) && !connects(&w, other, direct));

    // Deleting through the API works like rivetctl delete.
    api.delete("networkpolicies", "shop", "web-from-client")
        .expect("existed");
    eventually("the policy is gone", Duration::from_secs(5), || {
        connects(&w, other, direct)
    });
}

/// An ADD whose Pod object has not arrived waits for it (bounded), then
/// proceeds; without it the ADD fails as "try again later" and leaves
/// nothing behind.
#[test]
fn add_waits_for_its_pod_object() {
    let mut w = World::new();
    let api = w.start_apiserver();
    let n = w.add_kube_node(&api, "vxlan");
    let name = w.nodes[n].name.clone();
    let ip = w.next_pod_ip(n);
    let api_ref = &api;
    let started = Instant::now();
    let p = std::thread::scope(|s| {
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(1500));
            api_ref.apply(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "late"}}),
            );
            api_ref.apply(pod_object("late", "p", json!({"app": "late"}), &name, ip));
        });
        w.add_k8s_pod(n, "late", "p")
    });
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1500),
        "ADD answered before its Pod existed ({took:?})"
    );
    assert_eq!(w.pods[p].ip, ip);

    // No Pod object at all: "try again later", nothing half made.
    let pod_ns = rivet_tests::Netns::new(format!("{}-nopod", w.nodes[n].name));
    let mut spec = rivet_api::EndpointSpec::new("nopod", pod_ns.path().display().to_string());
    spec.pod = Some(PodMeta {
        namespace: "late".into(),
        name: "never".into(),
    });
    let started = Instant::now();
    match w.nodes[n]
        .agent()
        .client()
        .call(&Request::EndpointAdd(spec))
    {
        Err(rivet_api::ClientError::Api(e)) => {
            assert_eq!(e.kind, ErrorKind::Unavailable, "{e:?}");
            assert!(e.message.contains("late/never"), "{e:?}");
        }
        other => panic!("ADD without its Pod object: {other:?}"),
    }
    assert!(started.elapsed() >= rivet::agent::KUBE_POD_WAIT);
    assert!(w.del_pod(p), "the first pod existed");
    w.nodes[n].assert_no_pod_state("an ADD refused for want of its Pod");
}

/// A rotated service-account token: the server stops accepting the old one
/// and the file holds the new one; the agent's watches get 401, make a new
/// client from the file and carry on.
#[test]
fn rotated_token_is_picked_up() {
    let mut w = World::new();
    let api = w.start_apiserver();
    let n = w.add_node();
    let (name, cidr) = (w.nodes[n].name.clone(), w.nodes[n].pod_cidr.clone());
    api.apply(node_object(&name, Some(&cidr)));
    let token_file = w.dir().join("token");
    std::fs::write(&token_file, api.token()).expect("token file");
    let kc = w.dir().join("rotating.kubeconfig");
    api.write_kubeconfig_token_file(&kc, &token_file);
    w.nodes[n].agent_args.extra_args = vec![
        "--source".into(),
        "kubernetes".into(),
        "--kubeconfig".into(),
        kc.display().to_string(),
    ];
    w.start_agent(n);
    w.wait_agent_ready(n, Duration::from_secs(30));

    std::fs::write(&token_file, "rotated-token").expect("new token");
    api.set_tokens(&["rotated-token"]);
    let refused = api.unauthorized();
    api.drop_watches();
    // A new peer shows up only through watches made with the new token.
    // (Its address is on the underlay and unused: nothing is sent to it.)
    let peer = format!("10.{}.200.0/24", w.k);
    let mut obj = node_object("rotated-peer", Some(&peer));
    obj["metadata"]["annotations"] = json!({
        format!("{ANN}backend-type"): "vxlan",
        format!("{ANN}public-ip"): format!("192.168.{}.200", w.k),
    });
    api.apply(obj);
    eventually(
        "peer seen with the rotated token",
        Duration::from_secs(20),
        || nodes_seen(&w, n).contains(&peer),
    );
    assert!(
        api.unauthorized() > refused,
        "the old token was refused at least once"
    );
}

/// The directories a test made for a mount point, removed (if empty) when
/// it ends.
struct MadeDirs(Vec<PathBuf>);

impl Drop for MadeDirs {
    fn drop(&mut self) {
        for d in self.0.iter().rev() {
            if let Err(e) = std::fs::remove_dir(d) {
                eprintln!("warning: removing {}: {e}", d.display());
            }
        }
    }
}

/// In a pod: no kubeconfig and no `source` key, only what the kubelet gives
/// every pod — `KUBERNETES_SERVICE_HOST`/`PORT` and the service account's
/// token, CA and namespace under /var/run/secrets (bind-mounted in a mount
/// namespace of the agent's own; the API server's TLS certificate is
/// signed by that CA). The agent picks the kubernetes source by itself and
/// runs.
#[test]
fn runs_in_a_pod_from_its_service_account() {
    const SA: &str = "/run/secrets/kubernetes.io/serviceaccount";
    let mut w = World::new();
    let api = w.start_apiserver();
    let n = w.add_node();
    let (name, cidr) = (w.nodes[n].name.clone(), w.nodes[n].pod_cidr.clone());
    api.apply(node_object(&name, Some(&cidr)));
    // The mount point (this machine has no /run/secrets; it is made for
    // the test and removed after).
    let mut made = MadeDirs(Vec::new());
    for d in ["/run/secrets", "/run/secrets/kubernetes.io", SA] {
        let d = PathBuf::from(d);
        if !d.exists() {
            std::fs::create_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
            made.0.push(d);
        }
    }
    assert!(
        std::fs::read_dir(SA)
            .expect("the mount point")
            .next()
            .is_none(),
        "{SA} is not empty on this machine: refusing to shadow it"
    );
    let secrets = w.dir().join("serviceaccount");
    std::fs::create_dir(&secrets).expect("secrets dir");
    std::fs::write(secrets.join("token"), api.token()).expect("token");
    std::fs::write(secrets.join("ca.crt"), api.ca_pem()).expect("ca.crt");
    std::fs::write(secrets.join("namespace"), "kube-system").expect("namespace");
    let addr = api.addr();
    let args = &mut w.nodes[n].agent_args;
    args.env = vec![
        ("KUBERNETES_SERVICE_HOST".into(), addr.ip().to_string()),
        ("KUBERNETES_SERVICE_PORT".into(), addr.port().to_string()),
    ];
    args.wrapper = vec![
        "unshare".into(),
        "--mount".into(),
        "--propagation".into(),
        "private".into(),
        "--".into(),
        "sh".into(),
        "-c".into(),
        format!("mount --bind \"$0\" {SA} && exec \"$@\""),
        secrets.display().to_string(),
    ];
    w.start_agent(n);
    w.wait_agent_ready(n, Duration::from_secs(30));
    let s = status(&w, n);
    assert_eq!(s.pod_cidr, cidr);
    assert!(s.store.starts_with("kubernetes: synced"), "{}", s.store);
    let obj = api.get("nodes", "", &name).expect("the Node");
    assert_eq!(annotation(&obj, "public-ip"), w.nodes[n].ip.to_string());
    let tls = api
        .requests()
        .iter()
        .filter(|r| r.tls && r.resource == "nodes")
        .count();
    assert!(
        tls > 0,
        "the agent talked TLS, verified against the service account's CA"
    );
    assert!(
        std::fs::read_dir(SA)
            .expect("the mount point")
            .next()
            .is_none(),
        "the token was mounted for the agent only"
    );
}
