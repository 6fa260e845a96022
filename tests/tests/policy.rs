//! NetworkPolicy through rivet's datapath: Namespace, Pod and
//! NetworkPolicy objects applied with the real `rivetctl`, pods attached
//! with their Kubernetes identity, real sockets. Every check has a failure
//! path (exit statuses, timeouts, exact counters).

use std::{
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    time::Duration,
};

use rivet_common::Counter;
use rivet_tests::{
    Netns, World,
    kube::{self, reach_tcp, tell_self_tcp},
    traffic::ping,
};

const PORT: u16 = 8080;

fn apply(w: &World, n: usize, doc: &str) {
    let out = kube::rivetctl(w.nodes[n].agent().socket(), &["apply", "-f", "-"], doc);
    assert!(
        out.ok,
        "rivetctl apply failed: {}{}",
        out.stdout, out.stderr
    );
}

fn delete(w: &World, n: usize, doc: &str) {
    let out = kube::rivetctl(w.nodes[n].agent().socket(), &["delete", "-f", "-"], doc);
    assert!(
        out.ok,
        "rivetctl delete failed: {}{}",
        out.stdout, out.stderr
    );
}

/// A Pod object with `labels` (YAML flow map) and `ip` in its status.
fn pod(ns: &str, name: &str, labels: &str, ip: Ipv4Addr) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {ns}, labels: {labels}}}
spec:
  containers:
  - name: c
    image: busybox
    ports: [{{name: http, containerPort: {PORT}}}]
status: {{podIP: "{ip}", podIPs: [{{ip: "{ip}"}}]}}
"#
    )
}

fn namespace(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {name}, labels: {{team: {name}}}}}\n"
    )
}

/// Whether a TCP connection from `ns` to `dst` is answered.
fn tcp_ok(ns: &Netns, dst: Ipv4Addr) -> bool {
    reach_tcp(ns, SocketAddr::from((dst, PORT))).is_ok()
}

/// A UDP echo server.
fn udp_echo(ns: &Netns, port: u16) {
    let s = ns
        .exec(move || UdpSocket::bind(("0.0.0.0", port)))
        .expect("udp bind");
    std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        while let Ok((n, peer)) = s.recv_from(&mut buf) {
            let _ = s.send_to(&buf[..n], peer);
        }
    });
}

fn udp_ok(ns: &Netns, dst: Ipv4Addr, port: u16) -> bool {
    let s = ns
        .exec(|| UdpSocket::bind(("0.0.0.0", 0)))
        .expect("udp socket");
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    let mut b = [0u8; 8];
    for _ in 0..3 {
        s.send_to(b"hi", (dst, port)).expect("send");
        if s.recv_from(&mut b).is_ok() {
            return true;
        }
    }
    false
}

/// Two namespaces (a: pods a1, a2; b: pod b1) on one node, servers on
/// every pod.
struct Setup {
    w: World,
    a1: usize,
    a2: usize,
    b1: usize,
}

fn setup() -> Setup {
    let mut w = World::new();
    let n = w.add_node_with_agent();
    let a1 = w.add_k8s_pod(n, "a", "a1");
    let a2 = w.add_k8s_pod(n, "a", "a2");
    let b1 = w.add_k8s_pod(n, "b", "b1");
    let mut doc = namespace("a") + "---\n" + &namespace("b");
    for (i, ns, name, app) in [
        (a1, "a", "a1", "web"),
        (a2, "a", "a2", "db"),
        (b1, "b", "b1", "web"),
    ] {
        let ip = w.pods[i].ip;
        doc += "---\n";
        doc += &pod(ns, name, &format!("{{app: {app}}}"), ip);
        tell_self_tcp(&w.pods[i].ns, ip, PORT);
        udp_echo(&w.pods[i].ns, PORT);
    }
    apply(&w, n, &doc);
    Setup { w, a1, a2, b1 }
}

const DENY_INGRESS_A2: &str = r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: a}
spec:
  podSelector: {matchLabels: {app: db}}
"#;

#[test]
fn default_deny_then_allow_by_selector_same_node() {
    let s = setup();
    let w = &s.w;
    let (a1, a2, b1) = (&w.pods[s.a1], &w.pods[s.a2], &w.pods[s.b1]);
    assert!(tcp_ok(&a1.ns, a2.ip), "no policy: a1 → a2 must connect");
    assert!(udp_ok(&b1.ns, a2.ip, PORT), "no policy: b1 → a2 udp");

    let before = w.nodes[0].counters();
    apply(w, 0, DENY_INGRESS_A2);
    assert!(!tcp_ok(&a1.ns, a2.ip), "deny: a1 → a2 must not connect");
    assert!(
        !udp_ok(&b1.ns, a2.ip, PORT),
        "deny: b1 → a2 udp must get no answer"
    );
    assert!(
        ping(&a1.ns, a2.ip, 1, 0.2).received == 0,
        "deny: ping a1 → a2"
    );
    let after = w.nodes[0].counters();
    assert!(
        after.since(&before, Counter::DropPolicyIngress) >= 3,
        "drop_policy_ingress counted: {:?}",
        after.changes(&before)
    );
    assert_eq!(after.since(&before, Counter::DropPolicyEgress), 0);
    // a2 itself is not egress-isolated: its own connections work, and
    // their replies come back through its isolated ingress.
    assert!(
        tcp_ok(&a2.ns, a1.ip),
        "a2 → a1 (replies to an isolated pod)"
    );
    assert!(udp_ok(&a2.ns, b1.ip, PORT), "a2 → b1 udp replies");

    apply(
        w,
        0,
        r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-web-in-b, namespace: a}
spec:
  podSelector: {matchLabels: {app: db}}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {team: b}}
      podSelector: {matchLabels: {app: web}}
    ports: [{port: http}]
"#,
    );
    assert!(tcp_ok(&b1.ns, a2.ip), "b/web → a2 on the named port");
    assert!(!tcp_ok(&a1.ns, a2.ip), "a/web is not in namespace b");
    assert!(
        !udp_ok(&b1.ns, a2.ip, PORT),
        "TCP only (the protocol default)"
    );

    delete(w, 0, DENY_INGRESS_A2);
    assert!(!tcp_ok(&a1.ns, a2.ip), "the other policy still isolates a2");
    delete(
        w,
        0,
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: from-web-in-b, namespace: a}\n",
    );
    assert!(tcp_ok(&a1.ns, a2.ip), "no policy left: a1 → a2");
}

#[test]
fn egress_deny_keeps_replies_and_established_flows() {
    let s = setup();
    let w = &s.w;
    let (a1, b1) = (&w.pods[s.a1], &w.pods[s.b1]);
    // A connection from b1 to a1 opened before any policy.
    let mut open = rivet_tests::traffic::connect(
        &b1.ns,
        SocketAddr::from((a1.ip, PORT)),
        Duration::from_secs(2),
    )
    .expect("b1 → a1 before the policy");
    apply(
        w,
        0,
        r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: a}
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]
"#,
    );
    assert!(!tcp_ok(&a1.ns, b1.ip), "a1's egress is denied");
    assert!(!tcp_ok(&b1.ns, a1.ip), "a1's ingress is denied");
    // The established connection goes on both ways (replies of a flow
    // allowed before the policy).
    use std::io::{Read as _, Write as _};
    open.set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    let mut hello = [0u8; 4];
    open.read_exact(&mut hello).expect("a1's greeting");
    open.write_all(b"ping")
        .expect("write on the established flow");
    let mut echo = [0u8; 4];
    open.read_exact(&mut echo)
        .expect("echo on the established flow after the policy");
    assert_eq!(&echo, b"ping");
    let c = w.nodes[0].counters();
    assert!(
        c.packets(Counter::DropPolicyEgress) >= 1,
        "drop_policy_egress counted"
    );
}
