//! Watching rivet's Services: `rivetctl services` (table and JSON), the
//! per-Service-port Prometheus counters and the Service maps' fill, and
//! the `healthCheckNodePort`s the agent answers like kube-proxy — against
//! real agents of a two-node VXLAN cluster, objects applied with the real
//! `rivetctl`, traffic from real sockets in pod, node and outside
//! namespaces.
//!
//! Counters are checked to the exact number of connections made: a new
//! Service port starts from zero on each node.

use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, TcpStream},
    time::{Duration, Instant},
};

use rivet_api::{ServiceFrontendKind, ServiceList, ServicePortStatus, ServiceScope};
use rivet_tests::{
    Netns, World,
    kube::{self, tell_self_tcp},
    metrics::{http_get, sample},
    traffic::listen,
};

const POD_TCP: u16 = 8080;
const WEB_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const EMPTY_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 11);
const STICKY_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 12);
const LB_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 20);
const WEB_NODE_PORT: u16 = 30080;
const LB_NODE_PORT: u16 = 30090;
const HEALTH_PORT: u16 = 32100;

/// Runs `rivetctl --socket <node n's> ARGS` with `stdin`; returns
/// (success, stdout, stderr).
fn rivetctl(w: &World, n: usize, args: &[&str], stdin: &str) -> (bool, String, String) {
    let out = kube::rivetctl(w.nodes[n].agent().socket(), args, stdin);
    (out.ok, out.stdout, out.stderr)
}

/// Runs rivetctl and panics with its words unless it succeeds; its stdout.
fn rivetctl_ok(w: &World, n: usize, args: &[&str], stdin: &str) -> String {
    let (ok, out, err) = rivetctl(w, n, args, stdin);
    assert!(ok, "rivetctl {args:?} on node {n} failed: {out}{err}");
    out
}

/// Applies `doc` on both nodes.
fn apply_both(w: &World, doc: &str) {
    for n in 0..2 {
        rivetctl_ok(w, n, &["apply", "-f", "-"], doc);
    }
}

/// `rivetctl -o json services` on node `n`, parsed.
fn services_json(w: &World, n: usize) -> ServiceList {
    let out = rivetctl_ok(w, n, &["-o", "json", "services"], "");
    let v: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("services JSON: {e}: {out}"));
    assert_eq!(v["result"], "services", "{out}");
    serde_json::from_value(v).unwrap_or_else(|e| panic!("a ServiceList: {e}: {out}"))
}

/// The Service port `name` of `list` (its only one).
fn port_of<'a>(list: &'a ServiceList, name: &str) -> &'a ServicePortStatus {
    let found: Vec<&ServicePortStatus> = list
        .services
        .iter()
        .filter(|p| p.namespace == "default" && p.name == name)
        .collect();
    assert_eq!(found.len(), 1, "one port of {name}: {list:#?}");
    found[0]
}

/// The rows of a table rivetctl printed, by its header's column starts:
/// each row a map from column name to its (trimmed) cell.
fn table_rows(text: &str) -> Vec<std::collections::BTreeMap<String, String>> {
    let mut lines = text.lines();
    let header = lines.next().expect("a header line");
    let mut starts: Vec<(usize, &str)> = Vec::new();
    let mut at = 0;
    for word in header.split_whitespace() {
        let i = header[at..].find(word).expect("word in header") + at;
        starts.push((i, word));
        at = i + word.len();
    }
    lines
        .take_while(|l| l.starts_with(|c: char| !c.is_ascii_digit()) && !l.is_empty())
        .filter(|l| !l.starts_with("SVC_"))
        .map(|line| {
            starts
                .iter()
                .enumerate()
                .map(|(k, (start, name))| {
                    let end = starts.get(k + 1).map_or(line.len(), |(s, _)| *s);
                    let cell = line.get(*start..end.min(line.len())).unwrap_or("");
                    ((*name).to_owned(), cell.trim().to_owned())
                })
                .collect()
        })
        .collect()
}

/// Connects from `ns` to `dst` and reads the backend's address.
fn reach_tcp(ns: &Netns, dst: SocketAddr) -> std::io::Result<Ipv4Addr> {
    kube::reach_tcp(ns, dst).map(|(backend, _)| backend)
}

/// A Service with one TCP port `http` (targetPort by name).
fn service(name: &str, ip: Ipv4Addr, extra_spec: &str, port_extra: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Service
metadata:
  name: {name}
  namespace: default
spec:
  clusterIP: {ip}
{extra_spec}  ports:
  - name: http
    port: 80
    targetPort: http
    protocol: TCP
{port_extra}"#
    )
}

/// The EndpointSlice of Service `name` with these ready (address, node)
/// endpoints.
fn slice(name: &str, endpoints: &[(Ipv4Addr, &str)]) -> String {
    let mut eps = String::from("endpoints:\n");
    for (ip, node) in endpoints {
        eps += &format!(
            "- addresses: [\"{ip}\"]\n  conditions: {{ready: true}}\n  nodeName: {node}\n"
        );
    }
    if endpoints.is_empty() {
        eps = "endpoints: []\n".into();
    }
    format!(
        r#"apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}-1
  namespace: default
  labels:
    kubernetes.io/service-name: {name}
addressType: IPv4
ports:
- name: http
  port: {POD_TCP}
  protocol: TCP
{eps}"#
    )
}

/// Two VXLAN nodes, a backend on each (answering with its address on
/// `POD_TCP`) and a client pod on node 1.
struct Setup {
    w: World,
    /// Backend pods: on node 1, on node 2.
    backends: [usize; 2],
    client: usize,
}

fn setup() -> Setup {
    let mut w = World::new();
    let nodes = w.add_static_cluster(2, "vxlan");
    let backends = [w.add_pod(nodes[0]), w.add_pod(nodes[1])];
    let client = w.add_pod(nodes[0]);
    for b in backends {
        let ip = w.pods[b].ip;
        tell_self_tcp(&w.pods[b].ns, ip, POD_TCP);
    }
    Setup {
        w,
        backends,
        client,
    }
}

impl Setup {
    fn ip(&self, backend: usize) -> Ipv4Addr {
        self.w.pods[self.backends[backend]].ip
    }

    fn node_name(&self, n: usize) -> &str {
        &self.w.nodes[n].name
    }
}

#[test]
fn services_listing_and_metrics_count_real_traffic() {
    let mut s = setup();
    let (b0, b1) = (s.ip(0), s.ip(1));
    let (n0, n1) = (s.node_name(0).to_owned(), s.node_name(1).to_owned());
    // web: a backend on each node, a NodePort with Local external policy.
    let web = service(
        "web",
        WEB_IP,
        "  type: NodePort\n  externalTrafficPolicy: Local\n",
        &format!("    nodePort: {WEB_NODE_PORT}\n"),
    );
    let empty = service("empty", EMPTY_IP, "", "");
    let sticky = service(
        "sticky",
        STICKY_IP,
        "  sessionAffinity: ClientIP\n  sessionAffinityConfig:\n    clientIP:\n      timeoutSeconds: 60\n",
        "",
    );
    let doc = [
        web,
        slice("web", &[(b0, &n0), (b1, &n1)]),
        empty,
        slice("empty", &[]),
        sticky,
        slice("sticky", &[(b1, &n1)]),
    ]
    .join("---\n");
    apply_both(&s.w, &doc);

    // Before any traffic: the listing as planned, every counter zero.
    let list = services_json(&s.w, 0);
    assert_eq!(list.services.len(), 3, "{list:#?}");
    let p = port_of(&list, "web");
    assert_eq!(
        (p.port_name.as_str(), p.protocol.to_string(), p.port),
        ("http", "tcp".to_owned(), Some(80))
    );
    assert!(p.id.is_some(), "a counter slot: {p:?}");
    assert!(p.external_local && !p.internal_local, "{p:?}");
    assert_eq!(p.affinity_timeout, None);
    let fe: Vec<(ServiceFrontendKind, Ipv4Addr, u16, ServiceScope, u32)> = p
        .frontends
        .iter()
        .map(|f| (f.kind, f.address, f.port, f.scope, f.backends))
        .collect();
    assert_eq!(
        fe,
        vec![
            (
                ServiceFrontendKind::ClusterIp,
                WEB_IP,
                80,
                ServiceScope::Internal,
                2
            ),
            (
                ServiceFrontendKind::NodePort,
                Ipv4Addr::UNSPECIFIED,
                WEB_NODE_PORT,
                ServiceScope::Internal,
                2
            ),
            (
                ServiceFrontendKind::NodePort,
                Ipv4Addr::UNSPECIFIED,
                WEB_NODE_PORT,
                ServiceScope::External,
                1
            ),
        ],
        "web's frontends on node 1 (outside clients get its own backend only)"
    );
    let be: Vec<(Ipv4Addr, u16, bool)> = p
        .backends
        .iter()
        .map(|b| (b.address, b.port, b.local))
        .collect();
    let mut want = vec![(b0, POD_TCP, true), (b1, POD_TCP, false)];
    want.sort();
    assert_eq!(be, want, "web's backends on node 1");
    assert_eq!(p.counters, rivet_api::ServiceCounters::default());
    let sticky_port = port_of(&list, "sticky");
    assert_eq!(sticky_port.affinity_timeout, Some(60));
    assert_eq!(port_of(&list, "empty").backends, vec![]);
    // Frontends: web 3 + empty 1 + sticky 1; backends: web's two groups
    // (2 + 1) + sticky 1.
    assert_eq!((list.frontend_entries, list.backend_entries), (5, 4));
    assert!(list.frontend_capacity >= 5 && list.backend_capacity >= 4);
    // Node 2 sees web's local backend the other way round.
    let other = services_json(&s.w, 1);
    let be2: Vec<(Ipv4Addr, bool)> = port_of(&other, "web")
        .backends
        .iter()
        .map(|b| (b.address, b.local))
        .collect();
    let mut want2 = vec![(b0, false), (b1, true)];
    want2.sort();
    assert_eq!(be2, want2);

    // Traffic: 10 connections from a pod on node 1 to web's ClusterIP, 3
    // from outside to node 1's NodePort, 4 refused by the Service without
    // backends, 5 to the sticky Service (the first chooses, 4 hit).
    s.w.add_outside();
    let client = &s.w.pods[s.client].ns;
    for i in 0..10 {
        let b = reach_tcp(client, SocketAddr::from((WEB_IP, 80)))
            .unwrap_or_else(|e| panic!("connection {i} to web: {e}"));
        assert!(b == b0 || b == b1, "web answered by {b}");
    }
    let node1 = s.w.nodes[0].ip;
    let outside = s.w.outside.as_ref().expect("outside");
    for i in 0..3 {
        let b = reach_tcp(outside, SocketAddr::from((node1, WEB_NODE_PORT)))
            .unwrap_or_else(|e| panic!("NodePort connection {i} from outside: {e}"));
        assert_eq!(b, b0, "Local policy: node 1's own backend");
    }
    for i in 0..4 {
        let r = reach_tcp(client, SocketAddr::from((EMPTY_IP, 80)));
        assert!(
            r.is_err(),
            "attempt {i} to a Service without backends: {r:?}"
        );
    }
    for i in 0..5 {
        let b = reach_tcp(client, SocketAddr::from((STICKY_IP, 80)))
            .unwrap_or_else(|e| panic!("connection {i} to sticky: {e}"));
        assert_eq!(b, b1);
    }

    let list = services_json(&s.w, 0);
    let counters = |name: &str| {
        let c = port_of(&list, name).counters;
        (c.sockets, c.flows, c.rejected, c.affinity_hits)
    };
    assert_eq!(counters("web"), (10, 3, 0, 0), "web: {list:#?}");
    assert_eq!(counters("empty"), (0, 0, 4, 0), "empty: {list:#?}");
    assert_eq!(counters("sticky"), (5, 0, 0, 4), "sticky: {list:#?}");
    assert_eq!(
        list.totals,
        rivet_api::ServiceCounters {
            sockets: 15,
            flows: 3,
            rejected: 4,
            affinity_hits: 4
        }
    );
    // The other node's counters are its own: nothing went through it.
    let other = services_json(&s.w, 1);
    assert_eq!(other.totals, rivet_api::ServiceCounters::default());

    // The table: one line per Service port, kubectl-like columns.
    let table = rivetctl_ok(&s.w, 0, &["services"], "");
    assert!(
        table.starts_with("NAMESPACE"),
        "a header line first: {table}"
    );
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "NAMESPACE",
            "NAME",
            "PORT",
            "FRONTENDS",
            "BACKENDS",
            "SOCKETS",
            "FLOWS",
            "REJECTED"
        ]
    );
    let rows = table_rows(&table);
    assert_eq!(rows.len(), 3, "{table}");
    let row = |name: &str| {
        rows.iter()
            .find(|r| r["NAME"] == name)
            .unwrap_or_else(|| panic!("no row {name}: {table}"))
    };
    let web_row = row("web");
    assert_eq!(web_row["NAMESPACE"], "default");
    assert_eq!(web_row["PORT"], "http:80/TCP");
    assert_eq!(
        web_row["FRONTENDS"],
        format!("{WEB_IP}:80,*:{WEB_NODE_PORT}"),
        "{table}"
    );
    let mut backends = [format!("{b0}:{POD_TCP}"), format!("{b1}:{POD_TCP}")];
    backends.sort_by_key(|b| b.parse::<SocketAddr>().ok());
    assert_eq!(web_row["BACKENDS"], backends.join(","), "{table}");
    assert_eq!(
        (
            &web_row["SOCKETS"][..],
            &web_row["FLOWS"][..],
            &web_row["REJECTED"][..]
        ),
        ("10", "3", "0"),
        "{table}"
    );
    assert_eq!(row("empty")["BACKENDS"], "<none>");
    assert_eq!(row("empty")["REJECTED"], "4");
    assert_eq!(row("sticky")["SOCKETS"], "5");
    assert!(
        table.contains("3 Service port(s)  sockets 15  flows 3  rejected 4  affinity hits 4"),
        "{table}"
    );
    assert!(
        table.contains(&format!(
            "SVC_FRONTENDS 5 of {} entries  SVC_BACKENDS 4 of {} entries",
            list.frontend_capacity, list.backend_capacity
        )),
        "{table}"
    );

    // Prometheus: the same counters per Service port, and the maps' fill.
    let (code, text) = http_get(&s.w.nodes[0].ns, "/metrics");
    assert_eq!(code, 200, "{text}");
    let series = |metric: &str, name: &str| {
        sample(
            &text,
            &format!(r#"{metric}{{namespace="default",service="{name}",port="http"}}"#),
        )
    };
    assert_eq!(
        series("rivet_service_sockets_total", "web"),
        Some(10.0),
        "{text}"
    );
    assert_eq!(series("rivet_service_flows_total", "web"), Some(3.0));
    assert_eq!(series("rivet_service_rejected_total", "web"), Some(0.0));
    assert_eq!(series("rivet_service_rejected_total", "empty"), Some(4.0));
    assert_eq!(series("rivet_service_sockets_total", "sticky"), Some(5.0));
    assert_eq!(
        series("rivet_service_affinity_hits_total", "sticky"),
        Some(4.0)
    );
    assert_eq!(
        sample(&text, "rivet_service_frontends"),
        Some(5.0),
        "{text}"
    );
    assert_eq!(sample(&text, "rivet_service_backends"), Some(4.0));
    assert_eq!(
        sample(&text, "rivet_service_frontends_capacity"),
        Some(list.frontend_capacity as f64)
    );
    assert_eq!(
        sample(&text, "rivet_service_backends_capacity"),
        Some(list.backend_capacity as f64)
    );
    // Each metric family is described once.
    for family in [
        "rivet_service_sockets",
        "rivet_service_flows",
        "rivet_service_rejected",
        "rivet_service_affinity_hits",
        "rivet_service_frontends",
        "rivet_service_backends",
    ] {
        let described = text
            .lines()
            .filter(|l| {
                *l == format!("# TYPE {family} counter") || *l == format!("# TYPE {family} gauge")
            })
            .count();
        assert_eq!(described, 1, "# TYPE of {family}: {text}");
    }
    // The map fill in the status, through the generic map listing.
    let status = rivetctl_ok(&s.w, 0, &["-o", "json", "status"], "");
    let status: serde_json::Value = serde_json::from_str(&status).expect("status JSON");
    let entries = |map: &str| {
        status["maps"]
            .as_array()
            .and_then(|maps| maps.iter().find(|m| m["name"] == map))
            .and_then(|m| m["entries"].as_u64())
    };
    assert_eq!(entries("SVC_FRONTENDS"), Some(5), "{status:#}");
    assert_eq!(entries("SVC_BACKENDS"), Some(4), "{status:#}");

    // A Service deleted leaves the listing.
    rivetctl_ok(
        &s.w,
        0,
        &["delete", "-f", "-"],
        &service("empty", EMPTY_IP, "", ""),
    );
    let list = services_json(&s.w, 0);
    assert_eq!(list.services.len(), 2, "{list:#?}");
    assert!(list.services.iter().all(|p| p.name != "empty"));
    assert_eq!(list.frontend_entries, 4);
}

/// An HTTP answer: status, headers (lower-case names) and body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Reads one HTTP/1.1 answer (with Content-Length) from `s`.
fn read_answer(s: &mut TcpStream) -> std::io::Result<Answer> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("headers cut: {}", String::from_utf8_lossy(&buf)),
            ));
        }
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status line: {head}")))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no content-length: {head}")))?;
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)?;
    Ok(Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// `GET path` on `dst` from inside `ns`, on a connection of its own.
fn get(ns: &Netns, dst: SocketAddr, path: &str) -> std::io::Result<Answer> {
    let mut s = ns.exec(|| TcpStream::connect_timeout(&dst, Duration::from_secs(3)))?;
    s.set_read_timeout(Some(Duration::from_secs(3)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {dst}\r\nConnection: close\r\n\r\n"
    )?;
    read_answer(&mut s)
}

/// Checks a health-check answer: status, kube-proxy's headers and body.
fn assert_health(a: &Answer, status: u16, local: usize, what: &str) {
    assert_eq!(a.status, status, "{what}: {}", a.body);
    assert_eq!(a.header("content-type"), Some("application/json"), "{what}");
    assert_eq!(
        a.header("x-content-type-options"),
        Some("nosniff"),
        "{what}"
    );
    assert_eq!(
        a.header("x-load-balancing-endpoint-weight"),
        Some(local.to_string().as_str()),
        "{what}"
    );
    assert_eq!(
        a.body,
        format!(
            r#"{{"service":{{"namespace":"default","name":"lb"}},"localEndpoints":{local},"serviceProxyHealthy":true}}"#
        ),
        "{what}"
    );
}

/// Polls `check` every 50 ms for up to 5 s until it returns true; false
/// if it never did.
fn eventually(mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if check() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn health_check_node_ports_follow_local_endpoints() {
    let mut s = setup();
    let b0 = s.ip(0);
    let n0 = s.node_name(0).to_owned();
    let lb = service(
        "lb",
        LB_IP,
        &format!(
            "  type: LoadBalancer\n  externalTrafficPolicy: Local\n  healthCheckNodePort: {HEALTH_PORT}\n"
        ),
        &format!("    nodePort: {LB_NODE_PORT}\n"),
    );
    // The endpoint is on node 1; node 2 has none of its own.
    apply_both(&s.w, &format!("{lb}---\n{}", slice("lb", &[(b0, &n0)])));
    s.w.add_outside();
    let outside = s.w.outside.as_ref().expect("outside");
    let (node1, node2) = (s.w.nodes[0].ip, s.w.nodes[1].ip);
    let hc1 = SocketAddr::from((node1, HEALTH_PORT));
    let hc2 = SocketAddr::from((node2, HEALTH_PORT));

    // A load balancer's probe from outside: node 1 healthy, node 2 not.
    let a = get(outside, hc1, "/").expect("GET node 1's health check");
    assert_health(&a, 200, 1, "node 1 with a local endpoint");
    let a = get(outside, hc2, "/healthz").expect("GET node 2's health check");
    assert_health(&a, 503, 0, "node 2 without a local endpoint");
    // Every address of the node: loopback too, any path.
    let a = get(
        &s.w.nodes[0].ns,
        SocketAddr::from((Ipv4Addr::LOCALHOST, HEALTH_PORT)),
        "/any/path",
    )
    .expect("GET on node 1's loopback");
    assert_health(&a, 200, 1, "node 1 on 127.0.0.1");
    // The NodePort itself serves node 1's endpoint.
    let b = reach_tcp(outside, SocketAddr::from((node1, LB_NODE_PORT))).expect("the NodePort");
    assert_eq!(b, b0);

    // A probe connection kept open across the change: the listener is not
    // restarted, the same connection answers the new count.
    let mut kept = outside
        .exec(|| TcpStream::connect_timeout(&hc1, Duration::from_secs(3)))
        .expect("a kept-alive connection");
    kept.set_read_timeout(Some(Duration::from_secs(3)))
        .expect("timeout");
    write!(kept, "GET / HTTP/1.1\r\nHost: lb\r\n\r\n").expect("request");
    assert_health(
        &read_answer(&mut kept).expect("first answer"),
        200,
        1,
        "kept connection, before",
    );

    // The endpoint leaves (the slice re-applied without it): 503.
    apply_both(&s.w, &slice("lb", &[]));
    let mut last = String::new();
    let turned = eventually(|| match get(outside, hc1, "/") {
        Ok(a) => {
            last = format!("{} {}", a.status, a.body);
            a.status == 503
        }
        Err(e) => {
            last = e.to_string();
            false
        }
    });
    assert!(turned, "node 1 still answers {last} without its endpoint");
    let a = get(outside, hc1, "/").expect("GET node 1 after the endpoint left");
    assert_health(&a, 503, 0, "node 1 without its endpoint");
    write!(kept, "GET / HTTP/1.1\r\nHost: lb\r\n\r\n").expect("second request");
    assert_health(
        &read_answer(&mut kept).expect("second answer on the kept connection"),
        503,
        0,
        "kept connection, after",
    );
    // And back.
    apply_both(&s.w, &slice("lb", &[(b0, &n0)]));
    assert!(
        eventually(|| get(outside, hc1, "/").is_ok_and(|a| a.status == 200)),
        "node 1 healthy again"
    );

    // The Service deleted: its health-check port closes on both nodes.
    for n in 0..2 {
        rivetctl_ok(&s.w, n, &["delete", "-f", "-"], &lb);
    }
    for (node, hc) in [(1, hc1), (2, hc2)] {
        let mut last = String::new();
        let closed = eventually(|| match get(outside, hc, "/") {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => true,
            other => {
                last = match other {
                    Ok(a) => format!("{} {}", a.status, a.body),
                    Err(e) => e.to_string(),
                };
                false
            }
        });
        assert!(
            closed,
            "node {node}'s health-check port after the Service left: {last}"
        );
    }
}

#[test]
fn a_health_check_port_taken_is_a_status_warning_until_it_is_served() {
    let s = setup();
    let b0 = s.ip(0);
    let n0 = s.node_name(0).to_owned();
    // Another program holds the port on node 2.
    let squatter = listen(&s.w.nodes[1].ns, HEALTH_PORT);
    let lb = service(
        "lb",
        LB_IP,
        &format!(
            "  type: LoadBalancer\n  externalTrafficPolicy: Local\n  healthCheckNodePort: {HEALTH_PORT}\n"
        ),
        &format!("    nodePort: {LB_NODE_PORT}\n"),
    );
    apply_both(&s.w, &format!("{lb}---\n{}", slice("lb", &[(b0, &n0)])));
    let warning = format!("healthCheckNodePort {HEALTH_PORT} is not served");
    let status = |n: usize| rivetctl_ok(&s.w, n, &["status"], "");
    let mut last = String::new();
    assert!(
        eventually(|| {
            last = status(1);
            last.contains(&warning)
        }),
        "node 2's status names the port it could not bind: {last}"
    );
    assert!(
        last.lines().any(|l| l.starts_with("WARNING: ")
            && l.contains(&warning)
            && l.contains("default/lb")),
        "{last}"
    );
    assert!(!status(0).contains(&warning), "node 1 binds it");
    // The port freed: the agent binds it at its next try and the warning
    // goes.
    drop(squatter);
    let hc2 = SocketAddr::from((Ipv4Addr::LOCALHOST, HEALTH_PORT));
    let served = {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            match get(&s.w.nodes[1].ns, hc2, "/") {
                Ok(a) => break Some(a),
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(_) => break None,
            }
        }
    };
    let a = served.expect("node 2 serves the health check once the port is free");
    assert_health(&a, 503, 0, "node 2 after the port was freed");
    assert!(!status(1).contains(&warning), "the warning is gone");
}
