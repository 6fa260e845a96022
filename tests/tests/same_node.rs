//! One node, real pods, real packets through the BPF datapath.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use aya::programs::{SchedClassifier, TcAttachType};
use rivet_api::{ClientError, EndpointSpec, ErrorKind, Request, Response};
use rivet_tests::{
    World,
    traffic::{assert_ping, connect, listen, ping, tcp_transfer},
    world::Counter,
};

/// Ping and TCP between every pair of three pods, pod → host and host → pod;
/// the redirect counter proves the BPF path carried it; the node has no
/// bridge and no iptables/nftables rule.
#[test]
fn three_pods_talk_through_bpf() {
    let mut w = World::new();
    let n = w.add_node_with_agent();
    let pods: Vec<usize> = (0..3).map(|_| w.add_pod(n)).collect();
    let before = w.nodes[n].counters();

    let mut pings = 0u64;
    let mut port = 5000;
    for &i in &pods {
        for &j in &pods {
            if i == j {
                continue;
            }
            assert_ping(&w.pods[i].ns, w.pods[j].ip, 3);
            pings += 3;
            port += 1;
            let moved = tcp_transfer(&w.pods[i].ns, &w.pods[j].ns, w.pods[j].ip, port, 1 << 20);
            assert_eq!(moved, 1 << 20);
        }
    }
    // Pod → host (the node's uplink address) and host → pod.
    for &i in &pods {
        assert_ping(&w.pods[i].ns, w.nodes[n].ip, 2);
        assert_ping(&w.nodes[n].ns, w.pods[i].ip, 2);
        port += 1;
        tcp_transfer(
            &w.pods[i].ns,
            &w.nodes[n].ns,
            w.nodes[n].ip,
            port,
            256 << 10,
        );
        port += 1;
        tcp_transfer(&w.nodes[n].ns, &w.pods[i].ns, w.pods[i].ip, port, 256 << 10);
    }

    let after = w.nodes[n].counters();
    let delta = |c: Counter| after.since(&before, c);
    // Every echo request and every reply between pods went through
    // bpf_redirect_peer (TCP adds many more).
    assert!(
        delta(Counter::FwdLocal) >= 2 * pings,
        "fwd_local moved by {} for {pings} pings",
        delta(Counter::FwdLocal)
    );
    assert!(
        delta(Counter::PassHost) >= 6,
        "pass_host moved by {}",
        delta(Counter::PassHost)
    );
    for (c, value) in after.iter() {
        if c.is_drop() {
            assert_eq!(value, 0, "unexpected drops: {after:?}");
        }
    }

    // No bridge, no iptables or nftables rule on the node.
    let node = &w.nodes[n].ns;
    let bridges = node.run("ip", &["-d", "link", "show", "type", "bridge"]);
    assert!(bridges.trim().is_empty(), "bridge on the node: {bridges}");
    for table in ["filter", "nat", "mangle", "raw"] {
        // `run` fails the test if iptables fails; the table's built-in
        // chains always list their policies, so an answer without any is
        // no answer.
        let text = node.run("iptables", &["-t", table, "-S"]);
        assert!(
            text.lines().any(|l| l.starts_with("-P ")),
            "iptables -t {table} -S listed no chain policy: {text:?}"
        );
        assert!(
            text.lines().all(|l| l.starts_with("-P ")),
            "iptables rules in {table}: {text}"
        );
    }
    let nft = node.run("nft", &["list", "ruleset"]);
    assert!(nft.trim().is_empty(), "nftables ruleset on the node: {nft}");
}

/// The agent restarts (SIGTERM, then SIGKILL) while a ping flood and a TCP
/// stream run: no packet is lost, the stream never stalls, the programs are
/// replaced in the same links, and a poller never sees a veth without its
/// program.
#[test]
fn agent_restart_keeps_traffic_flowing_tc() {
    restart_keeps_traffic_flowing("tc");
}

/// The same with TCX links for the pods.
#[test]
fn agent_restart_keeps_traffic_flowing_tcx() {
    restart_keeps_traffic_flowing("tcx");
}

fn restart_keeps_traffic_flowing(mode: &str) {
    let mut w = World::new();
    let n = w.add_node();
    w.nodes[n].agent_args.extra_args = vec!["--pod-attach".into(), mode.into()];
    w.start_agent(n);
    let a = w.add_pod(n);
    let b = w.add_pod(n);
    let links_before = status_links(&w, n);

    // Poll the attachment of both host veths every 10 ms from inside the node.
    let stop = Arc::new(AtomicBool::new(false));
    let polls = Arc::new(AtomicU64::new(0));
    let hosts = [
        (
            w.pods[a].endpoint.host_ifname.clone(),
            w.pods[a].endpoint.host_ifindex,
        ),
        (
            w.pods[b].endpoint.host_ifname.clone(),
            w.pods[b].endpoint.host_ifindex,
        ),
    ];
    let poller = {
        let (stop, polls) = (Arc::clone(&stop), Arc::clone(&polls));
        let path = w.nodes[n].ns.path();
        std::thread::spawn(move || {
            rivet::netns::run_in(&path, || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async {
                    let nl = rivet::netlink::Netlink::connect().expect("netlink");
                    let mut missing = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        for (name, index) in &hosts {
                            let tcx = SchedClassifier::query_tcx(name, TcAttachType::Ingress)
                                .map(|(_, p)| p.len())
                                .unwrap_or(0);
                            let tc = nl
                                .tc_bpf_prog_ids(*index, true)
                                .await
                                .map(|v| v.len())
                                .unwrap_or(0);
                            if tcx + tc == 0 {
                                missing.push(name.clone());
                            }
                        }
                        polls.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    missing
                })
            })
            .expect("poller netns")
        })
    };

    // A TCP stream that reports its longest pause.
    let listener = listen(&w.pods[b].ns, 7000);
    let server = std::thread::spawn(move || {
        use std::io::Read as _;
        let (mut s, _) = listener.accept().expect("accept");
        let mut buf = vec![0u8; 65536];
        let mut total = 0u64;
        let mut last = Instant::now();
        let mut longest = Duration::ZERO;
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(k) => {
                    total += k as u64;
                    longest = longest.max(last.elapsed());
                    last = Instant::now();
                }
                Err(e) => panic!("stream broken: {e}"),
            }
        }
        (total, longest)
    });
    let mut stream = connect(
        &w.pods[a].ns,
        SocketAddr::from((w.pods[b].ip, 7000)),
        Duration::from_secs(5),
    )
    .expect("connect");
    let writer = std::thread::spawn(move || {
        use std::io::Write as _;
        let chunk = vec![7u8; 16 * 1024];
        let start = Instant::now();
        let mut sent = 0u64;
        while start.elapsed() < Duration::from_secs(4) {
            stream.write_all(&chunk).expect("write: stream reset");
            sent += chunk.len() as u64;
            std::thread::sleep(Duration::from_millis(2));
        }
        sent
    });

    // Ping flood across both restarts: 400 × 10 ms.
    let pinger = {
        let path = w.pods[a].ns.path();
        let dst = w.pods[b].ip;
        std::thread::spawn(move || {
            let out = std::process::Command::new("nsenter")
                .arg(format!("--net={}", path.display()))
                .args([
                    "--", "ping", "-n", "-q", "-c", "400", "-i", "0.01", "-W", "1",
                ])
                .arg(dst.to_string())
                .output()
                .expect("ping");
            rivet_tests::traffic::parse_ping(&String::from_utf8_lossy(&out.stdout))
        })
    };

    std::thread::sleep(Duration::from_millis(800));
    let agent = w.nodes[n].agent_mut();
    let st = agent.stop().expect("agent was running");
    assert!(st.success(), "SIGTERM exit status {st}");
    std::thread::sleep(Duration::from_millis(300));
    agent.restart();
    std::thread::sleep(Duration::from_millis(500));
    agent.stop_with(nix::sys::signal::Signal::SIGKILL);
    std::thread::sleep(Duration::from_millis(300));
    agent.restart();

    let sent = writer.join().expect("writer");
    let (received, longest) = server.join().expect("server");
    let pinged = pinger.join().expect("pinger");
    stop.store(true, Ordering::Relaxed);
    let missing = poller.join().expect("poller");

    assert_eq!(received, sent, "TCP bytes lost");
    assert_eq!(
        (pinged.sent, pinged.received),
        (400, 400),
        "ping loss: {pinged:?}"
    );
    assert!(polls.load(Ordering::Relaxed) > 50, "poller did not run");
    assert!(missing.is_empty(), "program missing at times: {missing:?}");
    // Pauses in a paced stream come from the writer's own sleeps and
    // scheduling, not from a gap in forwarding (ping proves no loss).
    eprintln!("longest pause in the TCP stream: {longest:?}");

    let links_after = status_links(&w, n);
    for (iface, (link, prog)) in &links_before {
        let (link2, prog2) = links_after[iface];
        assert_eq!(*link, link2, "link of {iface} was recreated");
        assert_ne!(*prog, prog2, "program of {iface} was not replaced");
    }
    // Traffic still flows with the new programs and the restored agent.
    assert_ping(&w.pods[a].ns, w.pods[b].ip, 3);
    let c = w.add_pod(n);
    assert_ping(&w.pods[c].ns, w.pods[a].ip, 3);
}

fn status_links(w: &World, n: usize) -> std::collections::BTreeMap<String, (u32, u32)> {
    match w.nodes[n].agent().client().call(&Request::Status {}) {
        Ok(Response::Status(s)) => s
            .attachments
            .into_iter()
            .map(|a| (a.interface, (a.link_id, a.program_id)))
            .collect(),
        other => panic!("status: {other:?}"),
    }
}

fn api_error(r: Result<Response, ClientError>) -> rivet_api::ApiError {
    match r {
        Err(ClientError::Api(e)) => e,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// Requests that conflict with existing state or name missing things fail
/// with a clear error and leave the node as it was.
#[test]
fn endpoint_conflicts_and_bad_requests() {
    let mut w = World::new();
    let n = w.add_node_with_agent();
    let a = w.add_pod(n);
    let client = w.nodes[n].agent().client();
    let spare = rivet_tests::Netns::new(format!("{}-spare", w.prefix));

    // IP in use.
    let e = api_error(client.call(&Request::EndpointAdd(EndpointSpec {
        ifname: "eth0".into(),
        ..EndpointSpec::new("other", spare.path().display().to_string()).with_ip(w.pods[a].ip)
    })));
    assert_eq!(e.kind, ErrorKind::Conflict);
    assert!(e.message.contains("already in use"), "{e}");
    // Same (container, ifname) twice.
    let e = api_error(
        client.call(&Request::EndpointAdd(EndpointSpec {
            ifname: "eth0".into(),
            ..EndpointSpec::new(w.pods[a].name.clone(), spare.path().display().to_string())
                .with_ip("10.0.0.0".parse().expect("ip"))
        })),
    );
    assert!(
        e.message.contains("already exists") || e.message.contains("pod CIDR"),
        "{e}"
    );
    // Outside the pod CIDR.
    let e = api_error(
        client.call(&Request::EndpointAdd(EndpointSpec {
            ifname: "eth0".into(),
            ..EndpointSpec::new("x1", spare.path().display().to_string())
                .with_ip("192.0.2.5".parse().expect("ip"))
        })),
    );
    assert_eq!(e.kind, ErrorKind::BadRequest);
    assert!(e.message.contains("pod CIDR"), "{e}");
    // A namespace that does not exist.
    let free_ip = |h: u8| format!("10.{}.1.{h}", w.k).parse().expect("ip");
    let e = api_error(client.call(&Request::EndpointAdd(EndpointSpec {
        ifname: "eth0".into(),
        ..EndpointSpec::new("x2", "/run/netns/does-not-exist-rivet").with_ip(free_ip(200))
    })));
    assert_eq!(e.kind, ErrorKind::NotFound);
    assert!(e.message.contains("does-not-exist-rivet"), "{e}");
    // An interface name that already exists in the pod: left untouched.
    spare.ip(&[
        "link", "add", "eth0", "type", "veth", "peer", "name", "other0",
    ]);
    let before = spare.run("ip", &["-o", "link", "show", "eth0"]);
    let e = api_error(client.call(&Request::EndpointAdd(EndpointSpec {
        ifname: "eth0".into(),
        ..EndpointSpec::new("x3", spare.path().display().to_string()).with_ip(free_ip(201))
    })));
    assert_eq!(e.kind, ErrorKind::Conflict);
    assert!(e.message.contains("eth0 already exists"), "{e}");
    assert_eq!(spare.run("ip", &["-o", "link", "show", "eth0"]), before);
    // Bad names.
    for (id, ifname) in [
        ("bad id", "eth0"),
        ("ok", "eth0/x"),
        ("ok", "waytoolongname123"),
    ] {
        let e = api_error(client.call(&Request::EndpointAdd(EndpointSpec {
            ifname: ifname.into(),
            ..EndpointSpec::new(id, spare.path().display().to_string()).with_ip(free_ip(202))
        })));
        assert_eq!(e.kind, ErrorKind::BadRequest, "{id:?}/{ifname:?}: {e}");
    }

    // Nothing half-made: only pod a's veth and link exist on the node.
    let node = &w.nodes[n].ns;
    let veths = node.run("ip", &["-o", "link", "show", "type", "veth"]);
    let rv: Vec<&str> = veths.lines().filter(|l| l.contains(": rv")).collect();
    assert_eq!(rv.len(), 1, "{veths}");
    match client.call(&Request::EndpointList {}) {
        Ok(Response::Endpoints { endpoints }) => assert_eq!(endpoints.len(), 1),
        other => panic!("{other:?}"),
    }
    let attached = status_links(&w, n);
    let pods = attached.keys().filter(|k| k.starts_with("rv")).count();
    assert_eq!(pods, 1, "one pod attachment: {attached:?}");
    assert!(
        attached.contains_key("eth0") && attached.contains_key("rivet_host"),
        "{attached:?}"
    );
    // The first pod is intact.
    assert_ping(&w.pods[a].ns, w.nodes[n].ip, 2);

    // DEL is idempotent: twice, and for something never added.
    assert!(w.del_pod(a));
    assert!(!w.del_pod(a));
    assert!(matches!(
        client.call(&Request::EndpointDel(rivet_api::EndpointRef::new(
            "never-added",
            "eth0"
        ))),
        Ok(Response::Deleted { existed: false })
    ));
    w.nodes[n].assert_no_pod_state("after DEL");
    let r = ping(&w.pods[a].ns, w.nodes[n].ip, 1, 0.1);
    assert_eq!(r.received, 0);
}

/// A pod whose namespace disappears (the runtime deleted it without DEL) is
/// cleaned up by the agent's reconciliation.
#[test]
fn vanished_pod_is_reconciled() {
    let mut w = World::new();
    let n = w.add_node_with_agent();
    let a = w.add_pod(n);
    let b = w.add_pod(n);
    let gone = w.pods.remove(a);
    let gone_ip = gone.ip;
    drop(gone); // deletes the pod's namespace, and with it the veth pair
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let eps = match w.nodes[n].agent().client().call(&Request::EndpointList {}) {
            Ok(Response::Endpoints { endpoints }) => endpoints,
            other => panic!("{other:?}"),
        };
        if eps.iter().all(|e| e.ip != gone_ip) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "endpoint {gone_ip} still listed: {eps:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let attached = status_links(&w, n);
    let pods = attached.keys().filter(|k| k.starts_with("rv")).count();
    assert_eq!(pods, 1, "pod b only: {attached:?}");
    let b = w.pods.iter().position(|p| p.ip != gone_ip).unwrap_or(b);
    assert_ping(&w.pods[b].ns, w.nodes[n].ip, 2);
}

/// A program removed from a pod veth behind the agent's back (tc mode, the
/// default) is put back by the periodic reconciliation, whose probe runs
/// without the state lock.
#[test]
fn removed_attachment_is_restored() {
    let mut w = World::new();
    let n = w.add_node_with_agent();
    let a = w.add_pod(n);
    let b = w.add_pod(n);
    let host = w.pods[a].endpoint.host_ifname.clone();
    let filters = |w: &World| {
        w.nodes[n]
            .ns
            .run("tc", &["filter", "show", "dev", &host, "ingress"])
            .contains("from_pod")
    };
    assert!(filters(&w), "attached after ADD");
    w.nodes[n]
        .ns
        .run("tc", &["filter", "del", "dev", &host, "ingress"]);
    assert!(!filters(&w), "removed");
    let deadline = Instant::now() + Duration::from_secs(15);
    while !filters(&w) {
        assert!(Instant::now() < deadline, "not restored within 15 s");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_ping(&w.pods[a].ns, w.pods[b].ip, 2);
}
