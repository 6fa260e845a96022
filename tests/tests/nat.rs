//! Masquerade (SNAT) with real packets: pods reach an "outside" host (on
//! the underlay, outside the cluster CIDR) as the node, over TCP, UDP and
//! ICMP echo, with BPF doing the translation on rivet's own NAT map — no
//! iptables/nftables rule and no netfilter conntrack entry anywhere.

use std::{
    collections::HashSet,
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    time::Duration,
};

use rivet_api::{Request, Response};
use rivet_tests::{
    Netns, World,
    capture::{Capture, Frame, Ipv4Info},
    traffic::{connect, listen, ping},
    world::Counter,
};

/// Asserts netfilter connection tracking holds no entry in `ns`: either
/// the `nf_conntrack` module is not loaded at all (then no namespace can
/// track anything: `/sys/module/nf_conntrack` and the namespace's
/// `nf_conntrack_count` and `/proc/net/nf_conntrack` are all absent), or
/// the namespace's `nf_conntrack_count` reads 0. Anything that cannot be
/// read is a failure, never "no entries".
fn assert_no_conntrack_entries(ns: &Netns, what: &str) {
    use std::io::ErrorKind::NotFound;
    let name = ns.name().to_owned();
    // A thread inside the namespace: /proc/sys/net and
    // /proc/thread-self/net show the namespace of the reading thread.
    let (count, table) = ns.exec(|| {
        (
            std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_count"),
            std::fs::symlink_metadata("/proc/thread-self/net/nf_conntrack"),
        )
    });
    match count {
        Ok(text) => {
            let n: u64 = text.trim().parse().unwrap_or_else(|e| {
                panic!("{what}: nf_conntrack_count in {name} is {text:?}: {e}")
            });
            assert_eq!(n, 0, "{what}: {n} conntrack entries in {name}");
        }
        Err(e) if e.kind() == NotFound => {
            let module = std::path::Path::new("/sys/module/nf_conntrack")
                .try_exists()
                .unwrap_or_else(|e| panic!("{what}: /sys/module/nf_conntrack: {e}"));
            assert!(
                !module,
                "{what}: nf_conntrack is loaded but {name} has no nf_conntrack_count"
            );
            match table {
                Err(e) if e.kind() == NotFound => {}
                other => panic!(
                    "{what}: nf_conntrack not loaded, yet /proc/net/nf_conntrack of {name}: {other:?}"
                ),
            }
        }
        Err(e) => panic!("{what}: reading nf_conntrack_count in {name}: {e}"),
    }
}

/// No NAT rule of any firewall in `ns`. Every tool must run and answer
/// (a tool that fails or prints nothing proves nothing).
fn assert_no_nat_rules(ns: &Netns) {
    let rules = ns.run("nft", &["list", "ruleset"]);
    assert!(
        !rules.contains("nat"),
        "nftables NAT rules in {}: {rules}",
        ns.name()
    );
    for tool in ["iptables-legacy-save", "iptables-nft-save"] {
        let text = ns.run(tool, &["-t", "nat"]);
        assert!(
            text.lines().any(|l| l == "*nat") && text.lines().any(|l| l == "COMMIT"),
            "{tool} -t nat in {} did not dump the nat table: {text:?}",
            ns.name()
        );
        assert!(
            !text.lines().any(|l| l.starts_with("-A")),
            "{tool} NAT rules in {}: {text}",
            ns.name()
        );
    }
}

fn nat_status(w: &World, n: usize) -> rivet_api::NatStatus {
    match w.nodes[n].agent().client().call(&Request::Status {}) {
        Ok(Response::Status(s)) => s.nat,
        other => panic!("status: {other:?}"),
    }
}

struct Setup {
    w: World,
    n: usize,
    pods: Vec<usize>,
    outside_ip: Ipv4Addr,
    /// The node's wire, watched for the whole test (checked on drop).
    watch: Option<UplinkWatch>,
}

fn setup(pods: usize) -> Setup {
    setup_with(pods, &[])
}

fn setup_with(pods: usize, args: &[&str]) -> Setup {
    let mut w = World::new();
    let n = w.add_node();
    w.nodes[n].agent_args.extra_args = ["--nat-gc-interval", "1"]
        .iter()
        .chain(args)
        .map(|a| (*a).to_owned())
        .collect();
    w.start_agent(n);
    let pods = (0..pods).map(|_| w.add_pod(n)).collect();
    w.add_outside();
    let outside_ip = Ipv4Addr::new(192, 168, w.k, 254);
    let watch = Some(UplinkWatch::start(&w, n, outside_ip));
    Setup {
        w,
        n,
        pods,
        outside_ip,
        watch,
    }
}

impl Setup {
    /// Stops watching the node's wire and asserts nothing left it with a
    /// pod's address; what was seen.
    fn finish_watch(&mut self) -> Watched {
        let watched = self
            .watch
            .take()
            .expect("the wire is watched from setup on")
            .finish(&self.w);
        watched.assert_no_pod_address_left();
        watched
    }
}

impl Drop for Setup {
    /// Every NAT test built on [`setup`] ends with the check of its wire.
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        if self.watch.is_some() {
            self.finish_watch();
        }
    }
}

/// Port of the marker datagrams a node sends to the outside host (discard;
/// nobody listens).
const MARKER_PORT: u16 = 9;

/// What node `n` puts on the wire during a test, captured on the
/// underlay's side of its uplink (what arrives there is what left the
/// node, whichever path inside the node sent it) from before the test's
/// first packet to after its last. A marker datagram the node sends to
/// the outside host must be seen at the start (the capture runs) and at
/// the end (everything before it was read), and the kernel must have
/// dropped no frame of the capture: a capture that did not run, or lost
/// frames, fails instead of passing.
struct UplinkWatch {
    capture: Capture,
    node_ns: String,
    node_ip: Ipv4Addr,
    outside_ip: Ipv4Addr,
}

/// Sends a marker datagram from node `ns` to `outside:9`.
fn send_marker(ns: &Netns, outside: Ipv4Addr, marker: &str) {
    let payload = marker.as_bytes().to_vec();
    ns.exec(move || {
        let sock = UdpSocket::bind(("0.0.0.0", 0))?;
        sock.send_to(&payload, (outside, MARKER_PORT))
    })
    .unwrap_or_else(|e| panic!("marker {marker:?} from {}: {e}", ns.name()));
}

impl UplinkWatch {
    fn start(w: &World, n: usize, outside_ip: Ipv4Addr) -> Self {
        let node = &w.nodes[n];
        // The underlay's end of the node's eth0: "<i>: eth0@if<peer>: …".
        let link = node.ns.ip(&["-o", "link", "show", "eth0"]);
        let peer: u32 = link
            .split_once("eth0@if")
            .and_then(|(_, rest)| rest.split(':').next())
            .and_then(|i| i.parse().ok())
            .unwrap_or_else(|| panic!("no veth peer of eth0 in {link:?}"));
        let capture = Capture::start(&w.underlay, peer)
            .unwrap_or_else(|e| panic!("capturing {}'s uplink: {e}", node.name));
        let watch = Self {
            capture,
            node_ns: node.ns.name().to_owned(),
            node_ip: node.ip,
            outside_ip,
        };
        watch.marker(&node.ns, "start");
        watch
    }

    /// Sends the `what` marker and waits until the capture has it.
    fn marker(&self, ns: &Netns, what: &str) {
        let marker = format!("rivet-uplink-watch {} {what}", self.node_ns);
        send_marker(ns, self.outside_ip, &marker);
        assert!(
            self.capture
                .wait_for(Duration::from_secs(5), |f| !f.outgoing
                    && f.contains(marker.as_bytes())),
            "the uplink capture of {} did not see its {what} marker: it does not run",
            self.node_ns
        );
    }

    fn finish(self, w: &World) -> Watched {
        let node = w
            .nodes
            .iter()
            .find(|nd| nd.ns.name() == self.node_ns)
            .expect("the watched node");
        self.marker(&node.ns, "end");
        // Frames from other CPUs may still be on their way in.
        std::thread::sleep(Duration::from_millis(100));
        let captured = self
            .capture
            .stop()
            .unwrap_or_else(|e| panic!("the uplink capture of {} failed: {e}", self.node_ns));
        assert_eq!(
            captured.kernel_drops, 0,
            "the uplink capture of {} lost frames: {} of {}",
            self.node_ns, captured.kernel_drops, captured.kernel_packets
        );
        let cluster: ipnet::Ipv4Net = node.agent_args.cluster_cidr.parse().expect("cluster CIDR");
        let nodes: Vec<Ipv4Addr> = w.nodes.iter().map(|nd| nd.ip).collect();
        // What the node sent (the underlay port received).
        let sent: Vec<Ipv4Info> = captured
            .frames
            .iter()
            .filter(|f| !f.outgoing)
            .filter_map(Frame::ipv4)
            .collect();
        let leaks = sent
            .iter()
            .filter(|i| {
                let outside = !cluster.contains(&i.dst) && !nodes.contains(&i.dst);
                let quoted = i
                    .quoted
                    .is_some_and(|(s, d)| cluster.contains(&s) || cluster.contains(&d));
                outside && (cluster.contains(&i.src) || quoted)
            })
            .copied()
            .collect();
        Watched {
            node: self.node_ns,
            node_ip: self.node_ip,
            frames: captured.frames.len(),
            sent,
            leaks,
        }
    }
}

/// What a node sent on its wire during a test.
struct Watched {
    node: String,
    node_ip: Ipv4Addr,
    /// Frames captured (both directions).
    frames: usize,
    /// The IPv4 packets the node sent.
    sent: Vec<Ipv4Info>,
    /// Those with a pod's address (source, or inside a quoted header)
    /// toward a destination outside the cluster (not a pod, not a node).
    leaks: Vec<Ipv4Info>,
}

impl Watched {
    fn assert_no_pod_address_left(&self) {
        assert!(
            self.leaks.is_empty(),
            "{} of {} packets {} sent ({} frames captured) left with a pod's address toward the outside:\n{}",
            self.leaks.len(),
            self.sent.len(),
            self.node,
            self.frames,
            self.leaks
                .iter()
                .take(20)
                .map(|i| format!("  {i:?}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    /// Packets the node sent as itself to `dst` matching `pred`.
    fn sent_as_node(&self, dst: Ipv4Addr, pred: impl Fn(&Ipv4Info) -> bool) -> usize {
        self.sent
            .iter()
            .filter(|i| i.src == self.node_ip && i.dst == dst && pred(i))
            .count()
    }
}

fn outside(s: &Setup) -> &Netns {
    s.w.outside.as_ref().expect("outside host")
}

/// TCP, UDP and ping from a pod to the outside host: the host sees the
/// node's address; replies come back to the pod; counters move; nothing of
/// netfilter is involved.
#[test]
fn pod_traffic_leaving_the_cluster_is_masqueraded() {
    let s = setup(1);
    let (node, pod) = (&s.w.nodes[s.n], &s.w.pods[s.pods[0]]);
    assert_no_conntrack_entries(&node.ns, "before the flows");
    let before = node.counters();

    // TCP: the server answers with the address it saw.
    let listener = listen(outside(&s), 7000);
    let server = std::thread::spawn(move || {
        let (mut c, peer) = listener.accept().expect("accept");
        c.write_all(peer.to_string().as_bytes()).expect("answer");
        peer
    });
    let mut stream = connect(
        &pod.ns,
        SocketAddr::from((s.outside_ip, 7000)),
        Duration::from_secs(5),
    )
    .expect("pod connects to the outside");
    let mut seen = String::new();
    stream.read_to_string(&mut seen).expect("answer");
    let peer = server.join().expect("server");
    assert_eq!(
        peer.ip(),
        std::net::IpAddr::V4(node.ip),
        "TCP seen as {peer}"
    );
    assert_eq!(seen, peer.to_string());
    assert!((61_000..=65_535).contains(&peer.port()), "NAT port {peer}");

    // UDP: an echo that answers to the source it saw.
    let out_sock = outside(&s)
        .exec(|| UdpSocket::bind(("0.0.0.0", 7001)))
        .expect("bind udp");
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        out_sock
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let (n, from) = out_sock.recv_from(&mut buf).expect("udp in");
        out_sock.send_to(&buf[..n], from).expect("udp out");
        from
    });
    let pod_sock = pod
        .ns
        .exec(|| UdpSocket::bind(("0.0.0.0", 0)))
        .expect("bind pod udp");
    pod_sock
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    pod_sock
        .send_to(b"hello", (s.outside_ip, 7001))
        .expect("send");
    let mut buf = [0u8; 64];
    let (n, _) = pod_sock.recv_from(&mut buf).expect("udp answer");
    assert_eq!(&buf[..n], b"hello");
    let from = echo.join().expect("echo");
    assert_eq!(
        from.ip(),
        std::net::IpAddr::V4(node.ip),
        "UDP seen as {from}"
    );

    // An ICMP error about a masqueraded flow reaches the pod: a UDP
    // datagram to a closed port is refused.
    let probe = pod
        .ns
        .exec(|| UdpSocket::bind(("0.0.0.0", 0)))
        .expect("bind");
    probe.connect((s.outside_ip, 7999)).expect("connect udp");
    probe
        .set_read_timeout(Some(Duration::from_secs(3)))
        .expect("timeout");
    probe.send(b"anyone?").expect("send");
    let err = probe.recv(&mut buf).expect_err("nobody listens on 7999");
    assert_eq!(
        err.kind(),
        std::io::ErrorKind::ConnectionRefused,
        "port unreachable translated back to the pod: {err}"
    );

    // ICMP echo.
    let r = ping(&pod.ns, s.outside_ip, 3, 0.2);
    assert_eq!(r.received, 3, "ping through NAT");

    let after = node.counters();
    let moved = |c: Counter| after.since(&before, c);
    let (snat, rev) = (moved(Counter::FwdSnat), moved(Counter::RevSnat));
    assert!(snat >= 6, "fwd_snat {snat}");
    assert!(rev >= 6, "rev_snat {rev}");
    assert_eq!(
        moved(Counter::DropNatNoPort) + moved(Counter::DropNatUnsupported),
        0
    );
    assert_no_conntrack_entries(&node.ns, "after the masqueraded flows");
    assert_no_nat_rules(&node.ns);
    assert_no_nat_rules(&s.w.underlay);
}

/// 500 concurrent connections from two pods: every one succeeds, all seen
/// from the node's address on distinct NAT ports; the table holds two
/// entries per flow and the status shows it.
#[test]
fn many_concurrent_connections_get_distinct_ports() {
    const PER_POD: usize = 250;
    let s = setup(2);
    let listener = listen(outside(&s), 7100);
    let server = std::thread::spawn(move || {
        let mut peers = Vec::new();
        let mut conns = Vec::new();
        for _ in 0..2 * PER_POD {
            let (c, peer) = listener.accept().expect("accept");
            peers.push(peer);
            conns.push(c);
        }
        (peers, conns)
    });
    let mut clients = Vec::new();
    for &p in &s.pods {
        for _ in 0..PER_POD {
            clients.push(
                connect(
                    &s.w.pods[p].ns,
                    SocketAddr::from((s.outside_ip, 7100)),
                    Duration::from_secs(10),
                )
                .expect("connect through NAT"),
            );
        }
    }
    let (peers, _conns) = server.join().expect("server");
    let node_ip = std::net::IpAddr::V4(s.w.nodes[s.n].ip);
    assert!(peers.iter().all(|p| p.ip() == node_ip), "all from the node");
    let ports: HashSet<u16> = peers.iter().map(SocketAddr::port).collect();
    assert_eq!(ports.len(), 2 * PER_POD, "distinct NAT ports");
    assert!(ports.iter().all(|p| (61_000..=65_535).contains(p)));

    // The collector runs every second here: wait for a pass after the
    // connections were made.
    let first = nat_status(&s.w, s.n).collections;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        let st = nat_status(&s.w, s.n);
        if st.collections > first {
            break st;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no NAT collection: {st:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(status.masquerade);
    assert!(
        status.entries >= (4 * PER_POD) as u64,
        "two entries per live flow: {status:?}"
    );
    assert_eq!(status.max_entries, u64::from(rivet_common::NAT_MAX));
    drop(clients);
}

/// Idle flows are expired by the collector (UDP timeout 1 s here): both
/// entries go, the status counts them, and the pod's next flow works.
#[test]
fn idle_flows_expire_and_new_ones_work() {
    let s = setup_with(1, &["--nat-udp-timeout", "1"]);
    let pod = &s.w.pods[s.pods[0]];
    let udp_roundtrip = |port: u16| {
        let out_sock = outside(&s)
            .exec(move || UdpSocket::bind(("0.0.0.0", port)))
            .expect("bind udp");
        let echo = std::thread::spawn(move || {
            let mut buf = [0u8; 16];
            out_sock
                .set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            let (n, from) = out_sock.recv_from(&mut buf).expect("udp in");
            out_sock.send_to(&buf[..n], from).expect("udp out");
        });
        let sock = pod
            .ns
            .exec(|| UdpSocket::bind(("0.0.0.0", 0)))
            .expect("bind pod udp");
        sock.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        sock.send_to(b"x", (s.outside_ip, port)).expect("send");
        let mut buf = [0u8; 16];
        sock.recv_from(&mut buf).expect("answer through NAT");
        echo.join().expect("echo");
    };
    udp_roundtrip(7200);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let st = loop {
        let st = nat_status(&s.w, s.n);
        if st.expired >= 2 && st.entries == 0 {
            break st;
        }
        assert!(std::time::Instant::now() < deadline, "not expired: {st:?}");
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(st.orphaned, 0, "{st:?}");
    udp_roundtrip(7201);
}

fn mapping(host: u16, container: u16, protocol: rivet_api::Protocol) -> rivet_api::PortMapping {
    rivet_api::PortMapping {
        host_port: host,
        container_port: container,
        protocol,
        host_ip: None,
    }
}

/// A TCP server in `ns` on `port` that answers every connection with the
/// peer address it saw; runs until the returned listener is dropped.
fn peer_echo_server(ns: &Netns, port: u16) -> std::thread::JoinHandle<()> {
    let listener = listen(ns, port);
    std::thread::spawn(move || {
        for c in listener.incoming() {
            let Ok(mut c) = c else { return };
            let peer = c.peer_addr().map(|p| p.to_string()).unwrap_or_default();
            let _ = c.write_all(peer.as_bytes());
        }
    })
}

/// A DNS-like UDP server in `ns` on `port`: answers each datagram with its
/// payload followed by the sender's address.
fn udp_peer_echo(ns: &Netns, port: u16) {
    let udp = ns
        .exec(move || UdpSocket::bind(("0.0.0.0", port)))
        .expect("bind udp");
    std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        while let Ok((n, from)) = udp.recv_from(&mut buf) {
            let mut answer = buf[..n].to_vec();
            answer.extend_from_slice(from.to_string().as_bytes());
            let _ = udp.send_to(&answer, from);
        }
    });
}

/// What a TCP client in `ns` gets from `dst`: the peer address the server
/// saw, or the connect error.
fn ask(ns: &Netns, dst: SocketAddr) -> Result<String, String> {
    let mut s = connect(ns, dst, Duration::from_secs(3)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(3)))
        .map_err(|e| e.to_string())?;
    let mut seen = String::new();
    s.read_to_string(&mut seen).map_err(|e| e.to_string())?;
    Ok(seen)
}

/// hostPorts: from outside, from another node and from a sibling pod the
/// pod is reached through the node's address, and sees the real client
/// address; from itself (hairpin) it sees its gateway; UDP too; another node's address on the same port is not
/// intercepted; after DEL the port is gone.
#[test]
fn hostports_reach_the_pod_from_everywhere() {
    use rivet_api::Protocol::{Tcp, Udp};
    let mut w = World::new();
    let nodes = w.add_static_cluster(2, "vxlan");
    let (n1, n2) = (nodes[0], nodes[1]);
    let target = w.add_pod_with_ports(n1, vec![mapping(8080, 80, Tcp), mapping(5353, 53, Udp)]);
    let sibling = w.add_pod(n1);
    w.add_outside();
    let outside_ip = Ipv4Addr::new(192, 168, w.k, 254);
    let (n1_ip, n2_ip) = (w.nodes[n1].ip, w.nodes[n2].ip);
    let _server = peer_echo_server(&w.pods[target].ns, 80);
    udp_peer_echo(&w.pods[target].ns, 53);
    let hostport = SocketAddr::from((n1_ip, 8080));
    let out = w.outside.as_ref().expect("outside");

    let seen = ask(out, hostport).expect("outside → hostPort");
    assert!(
        seen.starts_with(&format!("{outside_ip}:")),
        "outside seen as {seen}"
    );
    let seen = ask(&w.nodes[n2].ns, hostport).expect("node 2 → hostPort");
    assert!(
        seen.starts_with(&format!("{n2_ip}:")),
        "node 2 seen as {seen}"
    );
    let sib_ip = w.pods[sibling].ip;
    let seen = ask(&w.pods[sibling].ns, hostport).expect("sibling → hostPort");
    assert!(
        seen.starts_with(&format!("{sib_ip}:")),
        "sibling seen as {seen}"
    );

    // Hairpin: the pod reaches its own hostPort and sees its gateway as the
    // client (it cannot receive a packet from its own address).
    let seen = ask(&w.pods[target].ns, hostport).expect("pod → its own hostPort");
    assert!(seen.starts_with("169.254.1.1:"), "hairpin seen as {seen}");

    let sock = out.exec(|| UdpSocket::bind(("0.0.0.0", 0))).expect("udp");
    sock.set_read_timeout(Some(Duration::from_secs(3)))
        .expect("timeout");
    sock.send_to(b"q:", (n1_ip, 5353)).expect("send");
    let mut buf = [0u8; 128];
    let (n, from) = sock.recv_from(&mut buf).expect("UDP hostPort answer");
    assert_eq!(
        from,
        SocketAddr::from((n1_ip, 5353)),
        "answer from the hostPort"
    );
    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(text.starts_with(&format!("q:{outside_ip}:")), "{text}");

    // Node 2 has no such mapping: its own stack answers (refused).
    assert!(ask(out, SocketAddr::from((n2_ip, 8080))).is_err());
    let counters = w.nodes[n1].counters();
    assert!(counters[Counter::FwdDnat] >= 3, "{counters:?}");
    assert!(counters[Counter::RevDnat] >= 3, "{counters:?}");

    assert!(w.del_pod(target));
    assert!(ask(out, hostport).is_err(), "hostPort gone after DEL");
    assert_no_nat_rules(&w.nodes[n1].ns);
}

/// ICMP errors about hostPort flows reach the other end translated: a pod
/// refusing a datagram that came through a hostPort (port unreachable)
/// makes the client's socket fail with ECONNREFUSED, and a client gone
/// before the pod's answer makes the pod's socket fail the same way. The
/// node itself listens on the hostPort, so its own stack would take the
/// datagram silently: the refusal can only come from the pod, through the
/// DNAT and back through the reverse translation (the client's socket
/// matches the error by its quoted header, which must name node:5354).
#[test]
fn icmp_errors_about_hostport_flows_reach_both_ends() {
    use rivet_api::Protocol::Udp;
    let mut s = setup(0);
    let target =
        s.w.add_pod_with_ports(s.n, vec![mapping(5353, 53, Udp), mapping(5354, 54, Udp)]);
    let node_ip = s.w.nodes[s.n].ip;
    let refused = |r: &std::io::Result<usize>| matches!(r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused);
    // Nothing listens on 54 in the pod; the node listens on 5354 itself.
    let node_sock = s.w.nodes[s.n]
        .ns
        .exec(|| UdpSocket::bind(("0.0.0.0", 5354)))
        .expect("bind 5354 on the node");
    let dnat_before = s.w.nodes[s.n].counters()[Counter::FwdDnat];
    let client = outside(&s)
        .exec(|| UdpSocket::bind(("0.0.0.0", 0)))
        .expect("udp");
    client
        .set_read_timeout(Some(Duration::from_secs(3)))
        .expect("timeout");
    client.connect((node_ip, 5354)).expect("connect");
    client.send(b"anyone?").expect("send");
    let mut buf = [0u8; 64];
    let got = client.recv(&mut buf);
    assert!(
        refused(&got),
        "client: {got:?} (a timeout: the datagram reached the node's own socket, or the error was not translated back)"
    );
    node_sock.set_nonblocking(true).expect("nonblocking");
    let local = node_sock.recv_from(&mut buf);
    assert!(
        matches!(&local, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the node's own socket on 5354 got the datagram: {local:?}"
    );
    let dnat = s.w.nodes[s.n].counters()[Counter::FwdDnat] - dnat_before;
    assert!(
        dnat >= 1,
        "the datagram went through the hostPort DNAT: fwd_dnat +{dnat}"
    );

    // The pod answers a client that has gone.
    let server = s.w.pods[target]
        .ns
        .exec(|| UdpSocket::bind(("0.0.0.0", 53)))
        .expect("bind 53");
    server
        .set_read_timeout(Some(Duration::from_secs(3)))
        .expect("timeout");
    let client = outside(&s)
        .exec(|| UdpSocket::bind(("0.0.0.0", 0)))
        .expect("udp");
    client.send_to(b"hi", (node_ip, 5353)).expect("send");
    let (_, from) = server.recv_from(&mut buf).expect("datagram via hostPort");
    assert_eq!(from.ip(), std::net::IpAddr::V4(s.outside_ip));
    server.connect(from).expect("connect back");
    drop(client);
    // The outside host's kernel rate-limits its ICMP errors: a few tries.
    let mut got = Ok(0);
    for _ in 0..3 {
        server.send(b"late").expect("send");
        got = server.recv(&mut buf);
        if refused(&got) {
            break;
        }
    }
    assert!(refused(&got), "pod: {got:?}");
    assert_no_nat_rules(&s.w.nodes[s.n].ns);
}

/// The node's own sockets reach a hostPort on 127.0.0.1 and on the node
/// address (cgroup socket hooks: no `route_localnet`, no NAT on the wire),
/// TCP and UDP, connected or not; the application sees the address it
/// used as the peer; the pod sees the node's address; other namespaces
/// are untouched; after DEL the port is gone.
#[test]
fn the_nodes_own_sockets_reach_hostports() {
    use rivet_api::Protocol::{Tcp, Udp};
    let mut s = setup(0);
    let target =
        s.w.add_pod_with_ports(s.n, vec![mapping(8080, 80, Tcp), mapping(5353, 53, Udp)]);
    let _server = peer_echo_server(&s.w.pods[target].ns, 80);
    udp_peer_echo(&s.w.pods[target].ns, 53);
    let node_ip = s.w.nodes[s.n].ip;
    let node = &s.w.nodes[s.n].ns;
    for addr in [Ipv4Addr::LOCALHOST, node_ip] {
        let dst = SocketAddr::from((addr, 8080));
        let seen = ask(node, dst).unwrap_or_else(|e| {
            panic!(
                "node → {dst}: {e}; agent log:\n{}",
                s.w.nodes[s.n].agent().log()
            )
        });
        assert!(
            seen.starts_with(&format!("{node_ip}:")),
            "{dst}: the pod saw {seen}"
        );
        let stream = connect(node, dst, Duration::from_secs(3)).expect("connect");
        assert_eq!(stream.peer_addr().expect("peer"), dst, "getpeername");

        let dst = SocketAddr::from((addr, 5353));
        let sock = node.exec(|| UdpSocket::bind(("0.0.0.0", 0))).expect("udp");
        sock.set_read_timeout(Some(Duration::from_secs(3)))
            .expect("timeout");
        sock.send_to(b"q:", dst).expect("send");
        let mut buf = [0u8; 128];
        let (n, from) = sock.recv_from(&mut buf).expect("UDP hostPort answer");
        assert_eq!(from, dst, "the answer shows the address asked");
        let text = String::from_utf8_lossy(&buf[..n]).into_owned();
        assert!(text.starts_with(&format!("q:{node_ip}:")), "{text}");
        // Connected UDP: the kernel filters answers by the (pod) peer.
        sock.connect(dst).expect("udp connect");
        sock.send(b"c:").expect("send connected");
        let n = sock.recv(&mut buf).expect("connected UDP answer");
        assert!(buf[..n].starts_with(b"c:"));
    }
    // Another namespace's loopback is its own.
    assert!(ask(outside(&s), SocketAddr::from((Ipv4Addr::LOCALHOST, 8080))).is_err());
    // The hooks stay attached while the agent is down and are replaced,
    // not duplicated, when it comes back.
    let localhost = SocketAddr::from((Ipv4Addr::LOCALHOST, 8080));
    for signal in [
        nix::sys::signal::Signal::SIGTERM,
        nix::sys::signal::Signal::SIGKILL,
    ] {
        let before = hook_program_ids(&s.w, s.n);
        let attached = cgroup_attached();
        let hooks = rivet_common::program_names::SOCKET_HOOKS.len();
        assert!(
            before.len() == hooks && before.iter().all(|id| attached.contains(id)),
            "{hooks} hooks attached: {before:?} in {attached:?}"
        );
        s.w.nodes[s.n].agent_mut().stop_with(signal);
        ask(&s.w.nodes[s.n].ns, localhost).expect("hostPort from the node, agent down");
        s.w.nodes[s.n].agent_mut().restart();
        ask(&s.w.nodes[s.n].ns, localhost).expect("hostPort from the node, agent back");
        let after = hook_program_ids(&s.w, s.n);
        let attached = cgroup_attached();
        assert!(
            after.len() == hooks && after.iter().all(|id| attached.contains(id)),
            "new hooks attached: {after:?} in {attached:?}"
        );
        assert!(
            before.iter().all(|id| !attached.contains(id)),
            "old hooks still attached: {before:?} in {attached:?}"
        );
    }
    assert!(s.w.del_pod(target));
    assert!(
        ask(
            &s.w.nodes[s.n].ns,
            SocketAddr::from((Ipv4Addr::LOCALHOST, 8080))
        )
        .is_err(),
        "hostPort gone after DEL"
    );
    assert_no_nat_rules(&s.w.nodes[s.n].ns);
}

/// IDs of the programs attached to the cgroup2 root (every node's).
fn cgroup_attached() -> Vec<u32> {
    let cgroup = rivet::sockhooks::cgroup2_root().expect("cgroup2");
    let out = std::process::Command::new("bpftool")
        .args(["-j", "cgroup", "show"])
        .arg(&cgroup)
        .output()
        .expect("bpftool");
    let attached: Vec<serde_json::Value> =
        serde_json::from_slice(&out.stdout).expect("bpftool json");
    attached
        .iter()
        .filter_map(|a| a["id"].as_u64().map(|id| id as u32))
        .collect()
}

/// IDs of node `n`'s current socket hook programs (pinned).
fn hook_program_ids(w: &World, n: usize) -> Vec<u32> {
    rivet_common::program_names::SOCKET_HOOKS
        .iter()
        .filter_map(|name| {
            aya::programs::ProgramInfo::from_pin(w.nodes[n].pin_dir().join("progs").join(name))
                .ok()
                .map(|p| p.id())
        })
        .collect()
}

/// An echo server in `ns` on `port` (every connection on its own thread).
fn echo_server(ns: &Netns, port: u16) {
    let listener = listen(ns, port);
    std::thread::spawn(move || {
        for c in listener.incoming() {
            let Ok(mut c) = c else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 256];
                while let Ok(n) = c.read(&mut buf) {
                    if n == 0 || c.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
}

fn exchange(s: &mut std::net::TcpStream, what: &str) {
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s.write_all(what.as_bytes()).expect("write");
    let mut buf = vec![0u8; what.len()];
    s.read_exact(&mut buf)
        .unwrap_or_else(|e| panic!("{what}: no echo: {e}"));
    assert_eq!(buf, what.as_bytes());
}

/// Long-lived connections through masquerade and through a hostPort keep
/// working across an agent restart (SIGTERM) and a crash (SIGKILL): the
/// NAT table and the hostPort map are pinned, the programs swapped in place.
#[test]
fn nat_flows_survive_agent_restarts() {
    let mut s = setup(0);
    let target =
        s.w.add_pod_with_ports(s.n, vec![mapping(8080, 80, rivet_api::Protocol::Tcp)]);
    echo_server(outside(&s), 7300);
    echo_server(&s.w.pods[target].ns, 80);
    let mut snat = connect(
        &s.w.pods[target].ns,
        SocketAddr::from((s.outside_ip, 7300)),
        Duration::from_secs(5),
    )
    .expect("pod → outside");
    let mut dnat = connect(
        outside(&s),
        SocketAddr::from((s.w.nodes[s.n].ip, 8080)),
        Duration::from_secs(5),
    )
    .expect("outside → hostPort");
    exchange(&mut snat, "before/snat");
    exchange(&mut dnat, "before/dnat");
    for signal in [
        nix::sys::signal::Signal::SIGTERM,
        nix::sys::signal::Signal::SIGKILL,
    ] {
        s.w.nodes[s.n].agent_mut().stop_with(signal);
        exchange(&mut snat, &format!("down {signal}/snat"));
        exchange(&mut dnat, &format!("down {signal}/dnat"));
        s.w.nodes[s.n].agent_mut().restart();
        exchange(&mut snat, &format!("after {signal}/snat"));
        exchange(&mut dnat, &format!("after {signal}/dnat"));
    }
}

/// Ended TCP connections (a FIN each way) leave the table after the
/// closing timeout, through masquerade and through a hostPort alike, while
/// open ones stay and keep working; a connection reusing an ended one's
/// tuple is not collected with it.
#[test]
fn ended_connections_leave_the_table_open_ones_stay() {
    let mut s = setup_with(0, &["--nat-tcp-closing-timeout", "1"]);
    let target =
        s.w.add_pod_with_ports(s.n, vec![mapping(8080, 80, rivet_api::Protocol::Tcp)]);
    echo_server(outside(&s), 7400);
    echo_server(&s.w.pods[target].ns, 80);
    let to_outside = SocketAddr::from((s.outside_ip, 7400));
    let to_hostport = SocketAddr::from((s.w.nodes[s.n].ip, 8080));
    let pod_ns = &s.w.pods[target].ns;
    let mut snat = connect(pod_ns, to_outside, Duration::from_secs(5)).expect("pod → outside");
    let mut dnat = connect(outside(&s), to_hostport, Duration::from_secs(5)).expect("hostPort");
    for i in 0..20 {
        let mut c = connect(pod_ns, to_outside, Duration::from_secs(5)).expect("short snat");
        exchange(&mut c, &format!("short snat {i}"));
        let mut c = connect(outside(&s), to_hostport, Duration::from_secs(5)).expect("short dnat");
        exchange(&mut c, &format!("short dnat {i}"));
    }
    // Established flows have an hour; only the ended ones may go.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let st = nat_status(&s.w, s.n);
        if st.entries == 3 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "ended connections still in the table: {st:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    exchange(&mut snat, "still open/snat");
    exchange(&mut dnat, "still open/dnat");
}

/// A NAT table too small for the load (64 entries, 60 flows): the LRU
/// recycles the least recently used flows, the collector finds and counts
/// the broken pairs, the table never exceeds its size, and new flows still
/// work — a full table is visible, not silent, and not fatal. (One pod
/// fills it: the per-pod quota, which would stop it at 8 flows, is off.)
#[test]
fn full_nat_table_is_counted_and_new_flows_still_work() {
    let s = setup_with(1, &["--nat-max-entries", "64", "--nat-max-per-pod", "0"]);
    let pod = &s.w.pods[s.pods[0]];
    echo_server(outside(&s), 7400);
    let dst = SocketAddr::from((s.outside_ip, 7400));
    let mut held = Vec::new();
    for i in 0..60 {
        let mut c = connect(&pod.ns, dst, Duration::from_secs(5)).expect("connect");
        exchange(&mut c, &format!("flow {i}"));
        held.push(c);
    }
    // Broken pairs are counted once older than the collector's 2 s grace.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let st = loop {
        let st = nat_status(&s.w, s.n);
        assert!(st.entries <= 64, "{st:?}");
        if st.evicted > 0 {
            break st;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "evictions not counted: {st:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(st.max_entries, 64, "{st:?}");
    let mut fresh = connect(&pod.ns, dst, Duration::from_secs(5)).expect("a new flow");
    exchange(&mut fresh, "after the table filled up");
    let log = s.w.nodes[s.n].agent().log();
    assert!(
        log.contains("NAT table over 90% full") || st.entries * 10 <= 64 * 9,
        "{st:?}"
    );
    drop(held);
}

/// Sends the ICMP message `msg` (checksum filled in here) from a raw
/// socket in `ns` to `dst`, as a pod with `CAP_NET_RAW` can.
fn send_icmp(ns: &Netns, dst: Ipv4Addr, mut msg: Vec<u8>) {
    msg[2..4].copy_from_slice(&[0, 0]);
    let c = rivet_tests::packet::checksum(&msg);
    msg[2..4].copy_from_slice(&c.to_be_bytes());
    ns.exec(move || {
        // SAFETY: plain syscall; the result is checked before use.
        let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_ICMP) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor owned by nobody else.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
        // SAFETY: sockaddr_in is plain old data; all-zero is a valid value.
        let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        sin.sin_family = libc::AF_INET as libc::sa_family_t;
        sin.sin_addr.s_addr = u32::from_ne_bytes(dst.octets());
        // SAFETY: `msg` and `sin` are valid for the call and sized as said.
        let n = unsafe {
            libc::sendto(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                msg.as_ptr().cast(),
                msg.len(),
                0,
                std::ptr::from_ref(&sin).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    })
    .unwrap_or_else(|e| panic!("raw ICMP from {}: {e}", ns.name()));
}

/// Nothing leaves the node with a pod's address toward the outside in
/// masquerade mode, ICMP included. The node's wire is captured for the
/// whole test (as for every test here) while the pod
/// - talks TCP, UDP and ping through the masquerade (the node-address
///   traffic the capture must see);
/// - refuses an answer to one of its flows (its socket closed: port
///   unreachable about outside → pod, which arrived through the reverse
///   translation): the error leaves as the node about outside → node,
///   NAT port, and the outside's socket gets ECONNREFUSED;
/// - is reached other than through the masquerade (the outside routes the
///   pod CIDR to the node, whose stack forwards): its echo replies and its
///   port unreachable about a flow the NAT does not know are dropped;
/// - sends ICMP from a raw socket: an unsolicited echo reply, a port
///   unreachable about an unknown flow, a timestamp request — dropped.
///
/// Each drop is counted as `drop_nat_icmp_unknown`, and not one packet the
/// node sent carries a pod address (as source, or in a quoted header)
/// toward the outside.
#[test]
fn nothing_leaves_the_node_with_a_pod_address() {
    let mut s = setup(1);
    let (node_ip, outside_ip) = (s.w.nodes[s.n].ip, s.outside_ip);
    let pod = &s.w.pods[s.pods[0]];
    let pod_ip = pod.ip;
    let out = outside(&s);
    let unknown = |w: &World| w.nodes[s.n].counters()[Counter::DropNatIcmpUnknown];
    let unknown_before = unknown(&s.w);

    // Through the masquerade: TCP, UDP, ping.
    echo_server(out, 7600);
    let mut tcp = connect(
        &pod.ns,
        SocketAddr::from((outside_ip, 7600)),
        Duration::from_secs(5),
    )
    .expect("pod → outside, TCP");
    exchange(&mut tcp, "through the masquerade");
    let out_udp = out
        .exec(|| UdpSocket::bind(("0.0.0.0", 7601)))
        .expect("bind outside udp");
    out_udp
        .set_read_timeout(Some(Duration::from_secs(3)))
        .expect("timeout");
    let pod_udp = pod
        .ns
        .exec(|| UdpSocket::bind(("0.0.0.0", 0)))
        .expect("bind pod udp");
    pod_udp.send_to(b"ask", (outside_ip, 7601)).expect("send");
    let mut buf = [0u8; 64];
    let (_, nat_addr) = out_udp.recv_from(&mut buf).expect("datagram via NAT");
    assert_eq!(nat_addr.ip(), std::net::IpAddr::V4(node_ip));
    let pinged = ping(&pod.ns, outside_ip, 2, 0.2).received;

    // The pod's socket is gone when the answer arrives: the pod's port
    // unreachable must reach the outside as the node's.
    drop(pod_udp);
    out_udp
        .connect(nat_addr)
        .expect("connect to the NAT address");
    out_udp.send(b"answer").expect("answer");
    let refused = out_udp.recv(&mut buf);

    // The pod reached other than through the masquerade.
    out.ip(&[
        "route",
        "add",
        &s.w.nodes[s.n].pod_cidr,
        "via",
        &node_ip.to_string(),
    ]);
    let direct_ping = ping(out, pod_ip, 3, 0.2).received;
    let direct_udp = out
        .exec(|| UdpSocket::bind(("0.0.0.0", 0)))
        .expect("bind outside udp");
    direct_udp
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    direct_udp.connect((pod_ip, 7999)).expect("connect");
    direct_udp.send(b"anyone?").expect("send");
    let direct_refused = direct_udp.recv(&mut buf);

    // Raw ICMP from the pod.
    send_icmp(
        &pod.ns,
        outside_ip,
        vec![0, 0, 0, 0, 0x4a, 0x11, 0, 1, b'x'],
    );
    let quoted = rivet_tests::packet::Ipv4 {
        payload: vec![0x1b, 0x58, 0x1e, 0x61, 0, 8, 0, 0],
        ..rivet_tests::packet::Ipv4::new(outside_ip, pod_ip)
    }
    .bytes();
    send_icmp(
        &pod.ns,
        outside_ip,
        [&[3, 3, 0, 0, 0, 0, 0, 0][..], &quoted].concat(),
    );
    send_icmp(
        &pod.ns,
        outside_ip,
        [&[13, 0, 0, 0, 0, 7, 0, 1][..], &[0; 12]].concat(),
    );

    // Give the last ones time to cross before the wire's end marker.
    std::thread::sleep(Duration::from_millis(200));
    let dropped = unknown(&s.w) - unknown_before;
    let watched = s.finish_watch();

    // The capture saw the masqueraded traffic: the node's own address.
    let tcp_seen = watched.sent_as_node(outside_ip, |i| i.proto == 6);
    let udp_seen = watched.sent_as_node(outside_ip, |i| i.proto == 17 && i.ports.1 == 7601);
    let echo_seen = watched.sent_as_node(outside_ip, |i| i.icmp == Some((8, 0)));
    let error_seen = watched.sent_as_node(outside_ip, |i| {
        i.icmp == Some((3, 3)) && i.quoted == Some((outside_ip, node_ip))
    });
    assert!(
        tcp_seen > 0 && udp_seen > 0 && echo_seen > 0,
        "masqueraded traffic on the wire: TCP {tcp_seen}, UDP {udp_seen}, echo {echo_seen}"
    );
    assert_eq!(pinged, 2, "ping through NAT");
    assert!(
        matches!(&refused, Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused),
        "the pod's port unreachable reaches the outside as the node's: {refused:?}"
    );
    assert!(error_seen >= 1, "the translated error on the wire");
    assert_eq!(
        direct_ping, 0,
        "echo replies toward the outside are dropped"
    );
    assert!(
        direct_refused.is_err_and(|e| e.kind() != std::io::ErrorKind::ConnectionRefused),
        "a port unreachable about an unknown flow is dropped"
    );
    assert_eq!(
        dropped,
        3 + 1 + 3,
        "drop_nat_icmp_unknown: 3 echo replies, 1 port unreachable, 3 raw messages"
    );
}
