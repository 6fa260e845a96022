//! Restart without loss. Four paced TCP streams and four sequenced UDP
//! flows run through node 1 — same-node, cross-node (in each mode),
//! masqueraded to the outside, and from the outside through a hostPort —
//! while node 1's agent is stopped with SIGTERM and restarted, killed with
//! SIGKILL and restarted, and stopped for 30 s. Every stream must complete
//! with every byte, no reset, no lost segment (no retransmission timeout,
//! every retransmission a duplicate the receiver reported) and no pause
//! over `continuity::MAX_PAUSE` (500 ms); every datagram must arrive
//! exactly once; a poller reading the kernel's attachments every 10 ms
//! must never see a pod veth, the uplink or `rivet_host` without its
//! program; the endpoints, routes, peers, hostPorts, NAT entries and lease
//! records must be the same before and after; an ADD during the outage
//! fails fast with CNI code 11 and succeeds once the agent is back.

use std::time::{Duration, Instant};

use rivet_api::{PortMapping, Protocol};
use rivet_tests::{
    Netns, World,
    cni::{Plugin, rivet_conf},
    continuity::{Scenario, state},
};

fn restart_without_loss(mode: &str) {
    let mut sc = Scenario::start(mode);
    let n1 = sc.n1;
    let before = sc.state();

    // SIGTERM, back; SIGKILL, back.
    let agent = sc.w.nodes[n1].agent_mut();
    let st = agent.stop().expect("agent was running");
    assert!(st.success(), "SIGTERM exit status {st}");
    agent.restart();
    std::thread::sleep(Duration::from_millis(700));
    agent.stop_with(nix::sys::signal::Signal::SIGKILL);
    agent.restart();
    std::thread::sleep(Duration::from_millis(700));

    // Down for 30 s. An ADD meanwhile fails fast with code 11.
    let socket = sc.w.nodes[n1].agent().socket().to_owned();
    let conf = rivet_conf("1.1.0", &socket);
    let plugin = Plugin::rivet(&sc.w.nodes[n1].ns.path());
    let late = Netns::new(format!("{}-late", sc.w.prefix));
    sc.w.nodes[n1]
        .agent_mut()
        .stop()
        .expect("agent was running");
    let down = Instant::now();
    let t = Instant::now();
    let msg = plugin
        .add("late", &late.path(), &conf)
        .expect_code(11, "ADD while the agent is down");
    let add_took = t.elapsed();
    assert!(msg.contains("not reachable"), "{msg}");
    std::thread::sleep(Duration::from_secs(30).saturating_sub(down.elapsed()));
    sc.w.nodes[n1].agent_mut().restart();
    std::thread::sleep(Duration::from_secs(1));
    let after = sc.state();
    plugin
        .add("late", &late.path(), &conf)
        .expect_ok("ADD after the agent is back");

    eprintln!("{mode}: ADD while down answered in {add_took:?}");
    let (_w, _) = sc.finish(mode, 1000);
    assert_eq!(before, after, "state before and after the restarts");
    plugin
        .del("late", Some(&late.path()), &conf)
        .expect_ok("DEL");
}

#[test]
fn restarts_lose_nothing_vxlan() {
    restart_without_loss("vxlan");
}

#[test]
fn restarts_lose_nothing_ipip() {
    restart_without_loss("ipip");
}

#[test]
fn restarts_lose_nothing_native() {
    restart_without_loss("native");
}

/// A pinned map whose layout differs from this build's (an upgrade that
/// changed a map type): the agent refuses to start, naming the map and the
/// way out, and touches nothing.
#[test]
fn a_changed_map_layout_is_refused_not_reused() {
    let mut w = World::new();
    let n = w.add_node();
    let args = w.nodes[n].agent_args.clone();
    let maps = args.pin_dir().join("maps");
    std::fs::create_dir_all(&maps).expect("pin dir");
    let pin = maps.join("ENDPOINTS");
    let made = std::process::Command::new("bpftool")
        .args(["map", "create"])
        .arg(&pin)
        .args([
            "type",
            "hash",
            "key",
            "4",
            "value",
            "8",
            "entries",
            "16",
            "name",
            "ENDPOINTS",
        ])
        .output()
        .expect("bpftool");
    assert!(
        made.status.success(),
        "bpftool map create: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    let mut child = args
        .command()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("rivetd");
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("rivetd kept running on a foreign map");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("rivetd output");
    let err =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "rivetd started on a foreign map");
    assert!(
        err.contains("ENDPOINTS") && err.contains("incompatible layout") && err.contains("unload"),
        "{err}"
    );
    let still = std::process::Command::new("bpftool")
        .args(["map", "show", "pinned"])
        .arg(&pin)
        .output()
        .expect("bpftool");
    assert!(
        String::from_utf8_lossy(&still.stdout).contains("value 8B"),
        "the pinned map was left as it was: {}",
        String::from_utf8_lossy(&still.stdout)
    );
    // Once the foreign pin is gone the agent starts.
    std::fs::remove_file(&pin).expect("remove foreign pin");
    w.start_agent(n);
    let p = w.add_pod(n);
    assert!(w.pods[p].endpoint.host_ifindex > 0);
}

/// A lease record torn while the agent was down (truncated to half): the
/// agent rebuilds it from the datapath and the live veth — the pod keeps
/// its network, its address and its hostPort — instead of treating the pod
/// as unknown.
#[test]
fn a_torn_lease_record_is_rebuilt_from_the_datapath() {
    let mut w = World::new();
    let n = w.add_node_with_agent();
    let a = w.add_pod(n);
    let b = w.add_pod_with_ports(
        n,
        vec![PortMapping {
            host_port: 8080,
            container_port: 80,
            protocol: Protocol::Tcp,
            host_ip: None,
        }],
    );
    let before = state(&w, n);
    let record = w.nodes[n]
        .agent()
        .args()
        .state_dir
        .join("endpoints")
        .join(format!("{}.json", w.pods[b].endpoint.host_ifname));
    let text = std::fs::read(&record).expect("record");

    w.nodes[n].agent_mut().stop().expect("agent was running");
    std::fs::write(&record, &text[..text.len() / 2]).expect("tear the record");
    assert!(
        serde_json::from_slice::<rivet_api::Endpoint>(&std::fs::read(&record).expect("read"))
            .is_err(),
        "the record is really unreadable"
    );
    w.nodes[n].agent_mut().restart();

    rivet_tests::traffic::assert_ping(&w.pods[a].ns, w.pods[b].ip, 3);
    let rebuilt: rivet_api::Endpoint =
        serde_json::from_slice(&std::fs::read(&record).expect("read")).expect("record parses");
    assert_eq!(rebuilt.container_id, w.pods[b].endpoint.container_id);
    assert_eq!(rebuilt.ip, w.pods[b].ip);
    assert_eq!(rebuilt.port_mappings, w.pods[b].endpoint.port_mappings);
    let after = state(&w, n);
    for part in ["nodes", "hostports", "nat"] {
        assert_eq!(before[part], after[part], "{part}");
    }
    assert_eq!(before["endpoints"].len(), after["endpoints"].len());
    // The rebuilt attachment is a normal one: DEL removes it.
    assert!(w.del_pod(b), "DEL found the rebuilt attachment");
}
