//! What an operator sees: Prometheus metrics that move with traffic, the
//! health and readiness endpoints (not ready while the cluster store is
//! away; CNI STATUS then fails with code 50), and rivetctl's listings — all
//! against a real agent.

use std::{
    io::Read as _,
    net::TcpStream,
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use rivet_tests::{
    World, bin,
    cni::{Plugin, rivet_conf},
    metrics::{METRICS_PORT, http_get, sample},
    traffic::assert_ping,
};

fn rivetctl(socket: &std::path::Path, args: &[&str]) -> Output {
    Command::new(bin("rivetctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("rivetctl")
}

#[test]
fn metrics_move_with_traffic_and_health_answers() {
    let mut w = World::new();
    let n = w.add_node_with_agent();
    let a = w.add_pod(n);
    let b = w.add_pod(n);
    let ns = &w.nodes[n].ns;

    let (code, text) = http_get(ns, "/metrics");
    assert_eq!(code, 200, "{text}");
    assert_eq!(sample(&text, "rivet_endpoints"), Some(2.0), "{text}");
    assert_eq!(sample(&text, "rivet_ready"), Some(1.0));
    // From the agent's published status, gathered at most a second ago
    // (and after every change).
    assert!(
        sample(&text, "rivet_status_age_milliseconds").is_some_and(|ms| ms < 5000.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, r#"rivet_map_entries{map="ENDPOINTS"}"#),
        Some(2.0)
    );
    assert!(
        sample(&text, r#"rivet_map_capacity{map="NAT"}"#).is_some_and(|c| c > 0.0),
        "{text}"
    );
    assert!(sample(&text, "rivet_ipam_pool_used").is_some_and(|u| u >= 2.0));
    assert!(
        sample(
            &text,
            r#"rivet_api_request_duration_seconds_count{verb="ADD"}"#
        )
        .is_some_and(|c| c >= 2.0),
        "ADD latency histogram: {text}"
    );
    assert!(
        sample(&text, r#"rivet_drop_packets_total{reason="spoofed_ip"}"#).is_some(),
        "per-reason drop counters: {text}"
    );
    let local = |t: &str| sample(t, r#"rivet_forward_packets_total{path="local"}"#).unwrap_or(0.0);
    let before = local(&text);
    assert_ping(&w.pods[a].ns, w.pods[b].ip, 5);
    let (_, text) = http_get(ns, "/metrics");
    assert!(
        local(&text) >= before + 10.0,
        "local forwards {before} -> {}",
        local(&text)
    );

    assert_eq!(http_get(ns, "/healthz"), (200, "ok\n".into()));
    assert_eq!(http_get(ns, "/readyz"), (200, "ready\n".into()));
    assert_eq!(http_get(ns, "/nothing-here").0, 404);

    let socket = w.nodes[n].agent().socket().to_owned();
    let ok = |args: &[&str]| {
        let out = rivetctl(&socket, args);
        assert!(
            out.status.success(),
            "rivetctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let status = ok(&["status"]);
    assert!(
        status.contains("ready: yes") && status.contains("status gathered"),
        "{status}"
    );
    assert!(ok(&["version"]).contains("rivetd "));
    assert!(ok(&["routes"]).contains("SUBNET"));
    assert!(ok(&["portmaps"]).contains("HOST-IP"));
    assert!(ok(&["nat", "--port", "80"]).contains("in the table"));
    // Paged listings (the agent reads the maps only as far as the page).
    assert!(ok(&["nat", "--limit", "1", "--offset", "3"]).contains("in the table"));
    assert!(ok(&["portmaps", "--limit", "1"]).contains("HOST-IP"));
    let watch = ok(&["stats", "--watch", "1", "--count", "1", "--all"]);
    assert!(
        watch.contains("PACKETS/S") && watch.contains("fwd_local"),
        "{watch}"
    );
    // Every listing parses as JSON with what it promises.
    for (args, key) in [
        (&["status"][..], "node_name"),
        (&["endpoints"], "endpoints"),
        (&["routes"], "nodes"),
        (&["nat"], "entries"),
        (&["portmaps"], "mappings"),
        (&["stats"], "counters"),
    ] {
        let text = ok(&[&["-o", "json"][..], args].concat());
        let json: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{args:?}: {e}: {text}"));
        assert!(json.get(key).is_some(), "{args:?} has {key}: {json}");
    }

    // The agent stopped: nothing answers, status says so and fails.
    w.nodes[n].agent_mut().stop();
    let refused = w.nodes[n]
        .ns
        .exec(|| TcpStream::connect(("127.0.0.1", METRICS_PORT)).is_err());
    assert!(refused, "no health endpoint without the agent");
    let out = rivetctl(&socket, &["status"]);
    assert!(
        !out.status.success(),
        "status must fail with the agent down"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&socket.display().to_string()),
        "the error names the socket"
    );
}

#[test]
fn not_ready_while_the_cluster_store_is_away() {
    let mut w = World::new();
    w.start_etcd();
    let n = w.add_etcd_node("vxlan", 3);
    let socket = w.nodes[n].agent().socket().to_owned();
    let wait = |w: &World, want: u16, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            let (code, body) = http_get(&w.nodes[n].ns, "/readyz");
            if code == want {
                return body;
            }
            assert!(Instant::now() < deadline, "{what}: /readyz {code} {body}");
            std::thread::sleep(Duration::from_millis(250));
        }
    };
    wait(&w, 200, "ready once registered");
    assert!(rivetctl(&socket, &["status"]).status.success());
    let plugin = Plugin::rivet(&w.nodes[n].ns.path());
    let conf = rivet_conf("1.1.0", &socket);
    plugin
        .simple("STATUS", &conf)
        .expect_ok("CNI STATUS while ready");

    drop(w.etcd.take());
    let why = wait(&w, 503, "not ready without etcd");
    assert!(why.contains("etcd"), "{why}");
    // The agent answers but is not ready: CNI STATUS says so (code 50),
    // with the agent's reason.
    let msg = plugin
        .simple("STATUS", &conf)
        .expect_code(50, "CNI STATUS while not ready");
    assert!(
        msg.contains("not ready") && msg.contains("etcd"),
        "STATUS names the reason: {msg}"
    );
    let out = rivetctl(&socket, &["status"]);
    assert!(!out.status.success(), "status must fail when not ready");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not ready"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_, text) = http_get(&w.nodes[n].ns, "/metrics");
    assert_eq!(sample(&text, "rivet_ready"), Some(0.0));
    assert_eq!(sample(&text, "rivet_cluster_synced"), Some(0.0));

    w.start_etcd();
    wait(&w, 200, "ready again once etcd is back");
    plugin
        .simple("STATUS", &conf)
        .expect_ok("CNI STATUS ready again");
}

/// Runs `rivetctl -o json monitor ARGS` in the background; its events
/// once it exits (within 15 s, else it is killed and the test fails).
struct Monitor(std::process::Child);

impl Monitor {
    fn start(socket: &std::path::Path, args: &[&str]) -> Self {
        let child = Command::new(bin("rivetctl"))
            .arg("--socket")
            .arg(socket)
            .args(["-o", "json", "monitor"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("rivetctl monitor");
        // Subscribed once the agent has read the request.
        std::thread::sleep(Duration::from_millis(500));
        Self(child)
    }

    fn events(mut self) -> Vec<serde_json::Value> {
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.0.try_wait().expect("wait").is_none() {
            if Instant::now() > deadline {
                let _ = self.0.kill();
                let _ = self.0.wait();
                let (mut out, mut err) = (String::new(), String::new());
                if let Some(mut s) = self.0.stdout.take() {
                    let _ = s.read_to_string(&mut out);
                }
                if let Some(mut s) = self.0.stderr.take() {
                    let _ = s.read_to_string(&mut err);
                }
                panic!("rivetctl monitor saw too few events: stdout {out:?} stderr {err:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut out = String::new();
        if let Some(mut s) = self.0.stdout.take() {
            let _ = s.read_to_string(&mut out);
        }
        out.lines()
            .map(|l| serde_json::from_str(l).expect("event json"))
            .collect()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The pinned flow-event switch of node `n`.
fn flow_sample(w: &World, n: usize) -> u32 {
    let data = aya::maps::MapData::from_pin(w.nodes[n].pin_dir().join("maps/EVENT_CONFIG"))
        .expect("EVENT_CONFIG pin");
    let array: aya::maps::Array<_, rivet_common::EventConfig> =
        aya::maps::Array::try_from(aya::maps::Map::Array(data)).expect("array");
    array.get(&0, 0).expect("entry").flow_sample
}

#[test]
fn monitor_shows_drops_and_flows_with_names() {
    let mut w = World::new();
    let n = w.add_node_with_agent();
    let a = w.add_pod(n);
    let b = w.add_pod(n);
    let socket = w.nodes[n].agent().socket().to_owned();
    let b_ip = w.pods[b].ip;
    let [x, y, z, _] = b_ip.octets();
    let spoofed = std::net::Ipv4Addr::new(x, y, z, 200);

    // The pod knows its gateway's MAC (else its ARP, from the spoofed
    // address, is what gets dropped).
    assert_ping(&w.pods[a].ns, b_ip, 1);
    // A spoofed source: dropped, and the event says why, where and what.
    let mon = Monitor::start(&socket, &["--count", "1", "--reason", "spoofed_ip"]);
    let pod = &w.pods[a].ns;
    pod.ip(&["addr", "add", &format!("{spoofed}/32"), "dev", "eth0"]);
    let sent = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    let _ = pod.output(
        "ping",
        &[
            "-c",
            "3",
            "-i",
            "0.2",
            "-W",
            "1",
            "-I",
            &spoofed.to_string(),
            &b_ip.to_string(),
        ],
    );
    let events = mon.events();
    let e = &events[0];
    assert_eq!(e["kind"], "drop", "{e}");
    assert_eq!(e["reason"], "spoofed_ip", "{e}");
    assert_eq!(e["proto"], "icmp", "{e}");
    assert_eq!(e["src"], spoofed.to_string(), "{e}");
    assert_eq!(e["dst"], b_ip.to_string(), "{e}");
    assert_eq!(e["icmp"], "8/0", "{e}");
    let seen = e["time"].as_f64().expect("time") - sent;
    assert!(
        seen < 1.0,
        "reported {seen:.3} s after the first spoofed packet"
    );
    assert!(
        e["ifname"].as_str().is_some_and(|i| i.starts_with("rv")),
        "the pod's host veth: {e}"
    );
    assert_eq!(
        flow_sample(&w, n),
        0,
        "flow events stay off for drop-only clients"
    );

    // Flows while watched, off again after.
    let mon = Monitor::start(
        &socket,
        &["--flows", "--count", "4", "--reason", "fwd_local"],
    );
    assert_eq!(
        flow_sample(&w, n),
        1,
        "flow events on while a client wants them"
    );
    assert_ping(&w.pods[a].ns, b_ip, 3);
    let events = mon.events();
    assert!(
        events
            .iter()
            .all(|e| e["kind"] == "flow" && e["reason"] == "fwd_local"),
        "{events:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while flow_sample(&w, n) != 0 {
        assert!(
            Instant::now() < deadline,
            "flow events still on after the client left"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
