//! NetworkPolicy conformance as a truth table: nine pods (namespaces x, y,
//! z; pods a, b, c) serve TCP and UDP on ports 80 and 81; each case of
//! `rivet_tests::netpol::cases` is applied step by step with the real
//! `rivetctl`, and after every step every pod probes every other pod on
//! every port. Each cell is compared with the reference evaluator
//! (`rivet_tests::netpol::reference`) fed the same documents; a failure
//! lists every wrong cell of every case.
//!
//! Probes: TCP connects with a 700 ms timeout and must read the server's
//! byte; UDP sends a unique token from a source port never used before in
//! the run (so no earlier flow's state can answer for it) and must get it
//! back from the destination address and port within 3 tries of 300 ms.
//! All probes of a step run at once (about a second per step).
//!
//! `RIVET_NETPOL_CASES=name,name` runs only the cases whose names contain
//! one of the given parts.

use std::{
    collections::BTreeMap,
    io::{ErrorKind, Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use rivet_tests::{
    Netns, World, kube,
    netpol::{
        cases::{
            self, CROSS_NODE_CASES, Case, NAMESPACES, POD_NAMES, PORTS, PodIps, Step,
            baseline_objects,
        },
        reference::{Cluster, Peer, Proto},
    },
};
use serde_json::Value;

/// How long a TCP probe waits for the connection and then for the byte.
const TCP_TIMEOUT: Duration = Duration::from_millis(700);
/// How long a UDP probe waits for the echo of one try.
const UDP_WAIT: Duration = Duration::from_millis(300);
/// Datagrams a UDP probe sends before it calls the cell denied.
const UDP_TRIES: usize = 3;
/// The byte every TCP server answers with.
const ANSWER: u8 = b'k';
/// Wrong cells listed per step (the count says how many more there are).
const MAX_CELLS_SHOWN: usize = 40;

/// The two tests share two cores: they run one after the other, so probe
/// timeouts are not eaten by the other test's load.
static SERIAL: Mutex<()> = Mutex::new(());

/// The next UDP probe source port: 20000 and up, never the same twice in
/// a run.
static NEXT_UDP_PORT: AtomicU32 = AtomicU32::new(20_000);

/// The TCP and UDP servers of every pod; dropping it stops their threads.
struct Servers {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Servers {
    fn new() -> Self {
        Self {
            stop: Arc::new(AtomicBool::new(false)),
            threads: Vec::new(),
        }
    }

    /// Starts, in `ns`, a TCP server and a UDP echo server on each of
    /// [`PORTS`]' numbers.
    fn serve(&mut self, ns: &Netns) {
        let mut numbers: Vec<u16> = PORTS.iter().map(|(_, n, _)| *n).collect();
        numbers.sort_unstable();
        numbers.dedup();
        for port in numbers {
            let tcp = ns
                .exec(move || TcpListener::bind(("0.0.0.0", port)))
                .unwrap_or_else(|e| panic!("tcp :{port} in {}: {e}", ns.name()));
            let udp = ns
                .exec(move || UdpSocket::bind(("0.0.0.0", port)))
                .unwrap_or_else(|e| panic!("udp :{port} in {}: {e}", ns.name()));
            tcp.set_nonblocking(true).expect("nonblocking listener");
            udp.set_read_timeout(Some(Duration::from_millis(100)))
                .expect("udp read timeout");
            let stop = Arc::clone(&self.stop);
            self.threads.push(thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match tcp.accept() {
                        Ok((mut c, _)) => {
                            let _ = c.set_nonblocking(false);
                            let _ = c.write_all(&[ANSWER]);
                        }
                        Err(_) => thread::sleep(Duration::from_millis(2)),
                    }
                }
            }));
            let stop = Arc::clone(&self.stop);
            self.threads.push(thread::spawn(move || {
                let mut buf = [0u8; 64];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((n, peer)) = udp.recv_from(&mut buf) {
                        let _ = udp.send_to(&buf[..n], peer);
                    }
                }
            }));
        }
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Connects to `dst` within [`TCP_TIMEOUT`] and reads the server's byte.
fn tcp_probe(dst: SocketAddrV4) -> bool {
    let Ok(mut c) = TcpStream::connect_timeout(&SocketAddr::V4(dst), TCP_TIMEOUT) else {
        return false;
    };
    c.set_read_timeout(Some(TCP_TIMEOUT))
        .expect("tcp read timeout");
    let mut b = [0u8; 1];
    matches!(c.read(&mut b), Ok(1)) && b[0] == ANSWER
}

/// Sends a unique token to `dst` from a fresh, unconnected socket on a
/// never used source port and waits for `dst` to echo it.
fn udp_probe(dst: SocketAddrV4) -> bool {
    let port = NEXT_UDP_PORT.fetch_add(1, Ordering::Relaxed);
    let port = u16::try_from(port)
        .ok()
        .filter(|p| *p < 60_000)
        .expect("UDP probe source ports used up");
    let s = UdpSocket::bind(("0.0.0.0", port))
        .unwrap_or_else(|e| panic!("binding the probe socket :{port}: {e}"));
    let token = format!("probe {port} {dst}");
    let mut buf = [0u8; 64];
    for _ in 0..UDP_TRIES {
        let deadline = Instant::now() + UDP_WAIT;
        if s.send_to(token.as_bytes(), dst).is_err() {
            thread::sleep(UDP_WAIT);
            continue;
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            s.set_read_timeout(Some(left)).expect("udp read timeout");
            match s.recv_from(&mut buf) {
                Ok((n, from)) if from == SocketAddr::V4(dst) && &buf[..n] == token.as_bytes() => {
                    return true;
                }
                Ok(_) => continue,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    break;
                }
                Err(_) => thread::sleep(left),
            }
        }
    }
    false
}

/// One probe: source and destination pod (indices into the pod list),
/// protocol and port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Cell {
    src: usize,
    dst: usize,
    proto: Proto,
    port: u16,
}

/// A pod of the scenario.
struct PodRef {
    namespace: String,
    name: String,
    /// Index in `World::pods`.
    index: usize,
}

impl PodRef {
    fn peer(&self) -> Peer {
        Peer::pod(&self.namespace, &self.name)
    }

    fn label(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The world, its nine pods with their servers, and the agents that get
/// every document.
struct Scenario {
    /// The pods' servers, stopped on drop before the world goes.
    _servers: Servers,
    pods: Vec<PodRef>,
    agents: Vec<usize>,
    ips: PodIps,
    w: World,
}

impl Scenario {
    /// Adds the nine pods to `w` (`node_of(namespace, pod)` picks the
    /// node), starts their servers and applies the baseline on `agents`.
    fn new(mut w: World, agents: Vec<usize>, node_of: impl Fn(&str, &str) -> usize) -> Self {
        let mut pods = Vec::new();
        let mut ips = PodIps::new();
        for ns in NAMESPACES {
            for name in POD_NAMES {
                let index = w.add_k8s_pod(node_of(ns, name), ns, name);
                ips.insert((ns.to_owned(), name.to_owned()), w.pods[index].ip);
                pods.push(PodRef {
                    namespace: ns.to_owned(),
                    name: name.to_owned(),
                    index,
                });
            }
        }
        let mut servers = Servers::new();
        for p in &pods {
            servers.serve(&w.pods[p.index].ns);
        }
        let s = Self {
            _servers: servers,
            pods,
            agents,
            ips,
            w,
        };
        s.ctl(&["apply", "-f", "-"], &baseline_objects(&s.ips), "baseline");
        s
    }

    /// Runs `rivetctl ARGS` with `doc` on every agent; each must succeed.
    fn ctl(&self, args: &[&str], doc: &str, what: &str) {
        for &n in &self.agents {
            let out = kube::rivetctl(self.w.nodes[n].agent().socket(), args, doc);
            assert!(
                out.ok,
                "{what}: rivetctl {args:?} on node {n} failed:\n{}{}\ndocument:\n{doc}",
                out.stdout, out.stderr
            );
        }
    }

    /// The NetworkPolicies each agent holds, as `namespace/name`.
    fn stored_policies(&self) -> Vec<String> {
        let mut out = Vec::new();
        for &n in &self.agents {
            let socket = self.w.nodes[n].agent().socket();
            let got = kube::rivetctl(socket, &["-o", "json", "get", "networkpolicies", "-A"], "");
            assert!(got.ok, "get networkpolicies on node {n}: {}", got.stderr);
            let list: Value = serde_json::from_str(&got.stdout)
                .unwrap_or_else(|e| panic!("get -o json on node {n}: {e}: {}", got.stdout));
            let items = list["items"]
                .as_array()
                .unwrap_or_else(|| panic!("get -o json on node {n}: no items: {}", got.stdout));
            for item in items {
                let meta = &item["metadata"];
                out.push(format!(
                    "node {n}: {}/{}",
                    meta["namespace"].as_str().unwrap_or("?"),
                    meta["name"].as_str().unwrap_or("?")
                ));
            }
        }
        out
    }

    /// Back to the baseline after `previous`: its policies deleted, the
    /// baseline Namespaces and Pods re-applied, no policy left anywhere.
    fn reset(&self, previous: &Case) {
        let policies = previous
            .policies()
            .unwrap_or_else(|e| panic!("{}: {e}", previous.name));
        if !policies.is_empty() {
            self.ctl(
                &["delete", "-f", "-", "--ignore-not-found"],
                &cases::policy_refs(&policies),
                &format!("reset after {}", previous.name),
            );
        }
        self.ctl(
            &["apply", "-f", "-"],
            &baseline_objects(&self.ips),
            &format!("baseline after {}", previous.name),
        );
        let left = self.stored_policies();
        assert!(
            left.is_empty(),
            "policies left after resetting from {}: {left:?}",
            previous.name
        );
    }

    /// Every cell between distinct pods.
    fn cells(&self) -> Vec<Cell> {
        let mut out = Vec::new();
        for src in 0..self.pods.len() {
            for dst in 0..self.pods.len() {
                if src == dst {
                    continue;
                }
                for (_, port, proto) in PORTS {
                    out.push(Cell {
                        src,
                        dst,
                        proto,
                        port,
                    });
                }
            }
        }
        out
    }

    /// Probes every cell, all at once: one thread per source pod inside
    /// its namespace, and there one thread per probe.
    fn probe(&self) -> BTreeMap<Cell, bool> {
        let cells = self.cells();
        let targets: Vec<Ipv4Addr> = self.pods.iter().map(|p| self.w.pods[p.index].ip).collect();
        let namespaces: Vec<&Netns> = self.pods.iter().map(|p| &self.w.pods[p.index].ns).collect();
        let (cells, targets) = (&cells, &targets);
        thread::scope(|s| {
            let per_source: Vec<_> = namespaces
                .iter()
                .enumerate()
                .map(|(src, ns)| {
                    s.spawn(move || {
                        ns.exec(move || {
                            thread::scope(|inner| {
                                let probes: Vec<_> = cells
                                    .iter()
                                    .filter(|c| c.src == src)
                                    .map(|&c| {
                                        inner.spawn(move || {
                                            let dst = SocketAddrV4::new(targets[c.dst], c.port);
                                            let ok = match c.proto {
                                                Proto::Tcp => tcp_probe(dst),
                                                Proto::Udp => udp_probe(dst),
                                                Proto::Sctp => {
                                                    panic!("no SCTP probe")
                                                }
                                            };
                                            (c, ok)
                                        })
                                    })
                                    .collect();
                                probes
                                    .into_iter()
                                    .map(|h| h.join().expect("probe thread"))
                                    .collect::<Vec<_>>()
                            })
                        })
                    })
                })
                .collect();
            per_source
                .into_iter()
                .flat_map(|h| h.join().expect("source thread"))
                .collect()
        })
    }

    /// `x/a -> y/b tcp/80`.
    fn describe(&self, c: Cell) -> String {
        format!(
            "{} -> {} {}/{}",
            self.pods[c.src].label(),
            self.pods[c.dst].label(),
            c.proto,
            c.port
        )
    }

    /// The cells where `got` differs from what `model` allows, described.
    fn wrong_cells(&self, model: &Cluster, got: &BTreeMap<Cell, bool>) -> Vec<String> {
        let verdict = |allowed: bool| if allowed { "allow" } else { "deny" };
        let mut out = Vec::new();
        for c in self.cells() {
            let expected = model.allowed(
                &self.pods[c.src].peer(),
                &self.pods[c.dst].peer(),
                c.proto,
                c.port,
            );
            let actual = *got.get(&c).expect("every cell was probed");
            if expected != actual {
                out.push(format!(
                    "{}: expected {}, got {}",
                    self.describe(c),
                    verdict(expected),
                    verdict(actual)
                ));
            }
        }
        out
    }

    /// With no policy every cell must be open: the servers answer and the
    /// probes work. Checked without the evaluator.
    fn assert_baseline_open(&self) {
        let got = self.probe();
        assert_eq!(got.len(), self.cells().len(), "every cell probed");
        let closed: Vec<String> = got
            .iter()
            .filter(|(_, ok)| !**ok)
            .map(|(c, _)| self.describe(*c))
            .collect();
        assert!(
            closed.is_empty(),
            "with no policy {} of {} cells are closed:\n  {}",
            closed.len(),
            got.len(),
            closed.join("\n  ")
        );
        let model = Cluster::from_yaml(&baseline_objects(&self.ips)).expect("baseline model");
        assert_eq!(self.wrong_cells(&model, &got), Vec::<String>::new());
        // The probes can say "deny": a port nobody serves is closed.
        let (src, dst) = (
            &self.w.pods[self.pods[0].index],
            &self.w.pods[self.pods[8].index],
        );
        let unserved = SocketAddrV4::new(dst.ip, 82);
        let (tcp, udp) = src
            .ns
            .exec(move || (tcp_probe(unserved), udp_probe(unserved)));
        assert!(!tcp && !udp, "{unserved} answered: tcp {tcp}, udp {udp}");
    }

    /// Runs `case` from the baseline; returns the report of its wrong
    /// steps (empty when every cell of every step is right).
    fn run_case(&self, case: &Case) -> String {
        let mut model = Cluster::from_yaml(&baseline_objects(&self.ips)).expect("baseline model");
        let mut report = String::new();
        for (i, step) in case.steps.iter().enumerate() {
            step.apply_to(&mut model).unwrap_or_else(|e| {
                panic!("{} step {}: the model refuses it: {e}", case.name, i + 1)
            });
            let args: &[&str] = match step {
                Step::Apply(_) => &["apply", "-f", "-"],
                Step::Delete(_) => &["delete", "-f", "-"],
            };
            self.ctl(args, step.text(), &format!("{} step {}", case.name, i + 1));
            let got = self.probe();
            let wrong = self.wrong_cells(&model, &got);
            if wrong.is_empty() {
                continue;
            }
            report += &format!(
                "case {}, step {} of {} ({}): {} of {} cells wrong\n",
                case.name,
                i + 1,
                case.steps.len(),
                step.verb(),
                wrong.len(),
                got.len()
            );
            for line in wrong.iter().take(MAX_CELLS_SHOWN) {
                report += &format!("  {line}\n");
            }
            if wrong.len() > MAX_CELLS_SHOWN {
                report += &format!("  ... and {} more\n", wrong.len() - MAX_CELLS_SHOWN);
            }
        }
        report
    }

    /// Runs `cases` in order (each from the baseline) and fails with every
    /// wrong cell of every case.
    fn run_all(&self, cases: &[Case]) {
        assert!(!cases.is_empty(), "no case to run");
        let mut failed = Vec::new();
        let mut report = String::new();
        for (i, case) in cases.iter().enumerate() {
            if i > 0 {
                self.reset(&cases[i - 1]);
            }
            let started = Instant::now();
            let text = self.run_case(case);
            eprintln!(
                "[{}/{}] {}: {} ({:.1} s)",
                i + 1,
                cases.len(),
                case.name,
                if text.is_empty() { "ok" } else { "WRONG" },
                started.elapsed().as_secs_f64()
            );
            if !text.is_empty() {
                failed.push(case.name);
                report += &text;
            }
        }
        assert!(
            failed.is_empty(),
            "{} of {} cases wrong: {}\n\n{report}",
            failed.len(),
            cases.len(),
            failed.join(", ")
        );
    }
}

/// The cases `RIVET_NETPOL_CASES` picks (comma-separated parts of names),
/// else `all`; a filter that picks none fails.
fn chosen(all: Vec<Case>) -> Vec<Case> {
    let Ok(filter) = std::env::var("RIVET_NETPOL_CASES") else {
        return all;
    };
    let parts: Vec<&str> = filter
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    let picked: Vec<Case> = all
        .into_iter()
        .filter(|c| parts.iter().any(|p| c.name.contains(p)))
        .collect();
    assert!(
        !picked.is_empty(),
        "RIVET_NETPOL_CASES={filter} picks no case"
    );
    picked
}

#[test]
fn policy_conformance() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut w = World::new();
    let n = w.add_node_with_agent();
    let s = Scenario::new(w, vec![n], |_, _| n);
    s.assert_baseline_open();
    let all = cases::cases(&s.ips);
    assert!(all.len() >= 40, "{} cases", all.len());
    s.run_all(&chosen(all));
}

#[test]
fn policy_conformance_across_nodes() {
    across_nodes("vxlan");
}

#[test]
fn policy_conformance_across_nodes_native() {
    across_nodes("native");
}

/// The cross-node cases on two nodes in `mode`: x/* and z/a, z/b on the
/// first node, the rest on the second; every document applied on both.
fn across_nodes(mode: &str) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut w = World::new();
    let nodes = w.add_static_cluster(2, mode);
    let (first, second) = (nodes[0], nodes[1]);
    let s = Scenario::new(w, nodes, |ns, pod| match (ns, pod) {
        ("x", _) | ("z", "a" | "b") => first,
        _ => second,
    });
    assert_ne!(
        s.w.pods[s.pods[0].index].node, s.w.pods[s.pods[3].index].node,
        "x and y are on different nodes"
    );
    s.assert_baseline_open();
    let all = cases::cases(&s.ips);
    let subset: Vec<Case> = all
        .into_iter()
        .filter(|c| CROSS_NODE_CASES.contains(&c.name))
        .collect();
    assert_eq!(
        subset.len(),
        CROSS_NODE_CASES.len(),
        "every cross-node case exists"
    );
    s.run_all(&chosen(subset));
}
