//! Helpers for the "nothing is lost" tests (`tests/restart.rs`,
//! `tests/upgrade.rs`): paced TCP streams that measure every byte, every
//! pause and the sender's retransmissions, sequenced UDP flows along the
//! same paths that count every datagram, a poller that reads the kernel's
//! attachments every 10 ms, the node's state as comparable text, and
//! building a second, byte-different eBPF object from the same source.
//!
//! What "nothing is lost" means, asserted by [`Scenario::finish`]: every
//! byte of every TCP stream arrives, with no reset, **no segment lost** —
//! from the senders' `TCP_INFO`: no retransmission timeout
//! (`tcpi_total_rto` 0) and every retransmission reported by the receiver
//! as a duplicate of a segment it already had (`tcpi_total_retrans` =
//! `tcpi_dsack_dups`: a tail-loss probe sent because an ACK came a few
//! milliseconds late on a busy machine, not a loss) — and no pause between
//! two reads at a receiver over [`MAX_PAUSE`]; every datagram of every
//! sequenced UDP flow arrives exactly once (0 lost, 0 duplicated), with no
//! gap between two arrivals over [`MAX_PAUSE`].

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket},
    path::{Path, PathBuf},
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use aya::programs::{SchedClassifier, TcAttachType};
use rivet_api::{PortMapping, Protocol, Request, Response};

use crate::{
    Netns, World,
    traffic::{connect, listen},
};

/// The longest a paced TCP stream or UDP flow may go without data at its
/// receiver (the time between two reads). Both send every 10 ms; the runs
/// measured at most 176 ms (TCP) and 136 ms (UDP): scheduling on a loaded
/// 2-core machine while a debug-build agent restarts and loads its
/// programs. A lost segment is caught by the loss checks, whatever the
/// pause.
pub const MAX_PAUSE: Duration = Duration::from_millis(500);

/// A paced TCP stream: 4 KiB every 10 ms until told to stop.
pub struct Stream {
    name: &'static str,
    writer: JoinHandle<Result<(u64, TcpStream), String>>,
    server: JoinHandle<Result<(u64, Duration), String>>,
}

/// What a stream carried.
pub struct StreamResult {
    /// Its name.
    pub name: &'static str,
    /// Bytes written by the client.
    pub sent: u64,
    /// Bytes read by the server.
    pub received: u64,
    /// The longest time between two reads at the server.
    pub longest_pause: Duration,
    /// Segments the sender sent again (`tcpi_total_retrans`), read once
    /// the receiver has read everything.
    pub retransmits: u32,
    /// Of those, the ones the receiver reported as duplicates (DSACK:
    /// retransmitted although the first copy had arrived).
    pub spurious: u32,
    /// Retransmission timeouts (`tcpi_total_rto`).
    pub timeouts: u16,
}

/// The kernel's `TCP_INFO` of a connected socket.
pub fn tcp_info(s: &TcpStream) -> std::io::Result<libc::tcp_info> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: tcp_info is plain integers; all zeroes is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: a valid socket, and an out-buffer of the length passed (the
    // kernel writes at most that much).
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut info).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(info)
}

/// Starts a paced stream from `client` to `dst` (a listener on `port` in
/// `server`), writing until `stop`.
pub fn stream(
    name: &'static str,
    client: &Netns,
    server: &Netns,
    port: u16,
    dst: SocketAddr,
    stop: &Arc<AtomicBool>,
) -> Stream {
    let listener = listen(server, port);
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
        let mut buf = vec![0u8; 65536];
        let (mut total, mut longest) = (0u64, Duration::ZERO);
        let mut last: Option<Instant> = None;
        loop {
            match s.read(&mut buf) {
                Ok(0) => return Ok((total, longest)),
                Ok(k) => {
                    total += k as u64;
                    if let Some(t) = last {
                        longest = longest.max(t.elapsed());
                    }
                    last = Some(Instant::now());
                }
                Err(e) => return Err(format!("server side after {total} bytes: {e}")),
            }
        }
    });
    let mut conn = connect(client, dst, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{name}: connecting to {dst}: {e}"));
    let stop = Arc::clone(stop);
    let writer = std::thread::spawn(move || {
        let chunk = vec![0x5a; 4096];
        let mut sent = 0u64;
        while !stop.load(Ordering::Relaxed) {
            conn.write_all(&chunk)
                .map_err(|e| format!("client side after {sent} bytes: {e}"))?;
            sent += chunk.len() as u64;
            std::thread::sleep(Duration::from_millis(10));
        }
        conn.shutdown(std::net::Shutdown::Write)
            .map_err(|e| format!("shutdown: {e}"))?;
        // Kept open: its TCP_INFO is read once the server has everything.
        Ok((sent, conn))
    });
    Stream {
        name,
        writer,
        server,
    }
}

impl Stream {
    /// Waits for both ends (after `stop` was set); panics on a reset.
    pub fn finish(self) -> StreamResult {
        let (sent, conn) = self
            .writer
            .join()
            .expect("writer thread")
            .unwrap_or_else(|e| panic!("{}: reset: {e}", self.name));
        let (received, longest_pause) = self
            .server
            .join()
            .expect("server thread")
            .unwrap_or_else(|e| panic!("{}: reset: {e}", self.name));
        // Everything (the FIN too) acknowledged, and a moment for the
        // acknowledgement of a last duplicate (its DSACK) to arrive.
        let info = || {
            tcp_info(&conn).unwrap_or_else(|e| panic!("{}: TCP_INFO of the sender: {e}", self.name))
        };
        let deadline = Instant::now() + Duration::from_secs(2);
        while info().tcpi_unacked > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(50));
        let info = info();
        StreamResult {
            name: self.name,
            sent,
            received,
            longest_pause,
            retransmits: info.tcpi_total_retrans,
            spurious: info.tcpi_dsack_dups,
            timeouts: info.tcpi_total_rto,
        }
    }
}

/// A sequenced UDP flow: a 64-byte datagram numbered 0, 1, 2, … every
/// 10 ms until told to stop; the receiver records every number it gets.
pub struct Datagrams {
    name: &'static str,
    sender: JoinHandle<Result<u64, String>>,
    receiver: JoinHandle<Result<(Vec<u64>, Duration), String>>,
    /// How many were sent, once the sender stopped (`u64::MAX` before).
    expected: Arc<AtomicU64>,
}

/// What a sequenced flow carried.
pub struct DatagramResult {
    /// Its name.
    pub name: &'static str,
    /// Datagrams sent (numbered 0 .. sent).
    pub sent: u64,
    /// Numbers never received.
    pub lost: Vec<u64>,
    /// Numbers received more than once.
    pub duplicated: Vec<u64>,
    /// The longest time between two arrivals.
    pub longest_gap: Duration,
}

/// Starts a sequenced UDP flow from `client` to `dst` (a socket bound to
/// `port` in `server`), sending until `stop`.
pub fn datagrams(
    name: &'static str,
    client: &Netns,
    server: &Netns,
    port: u16,
    dst: SocketAddr,
    stop: &Arc<AtomicBool>,
) -> Datagrams {
    let rx = server
        .exec(move || UdpSocket::bind(("0.0.0.0", port)))
        .unwrap_or_else(|e| panic!("{name}: binding UDP {port}: {e}"));
    rx.set_read_timeout(Some(Duration::from_millis(50)))
        .expect("read timeout");
    let expected = Arc::new(AtomicU64::new(u64::MAX));
    let receiver = {
        let expected = Arc::clone(&expected);
        std::thread::spawn(move || {
            let mut got = Vec::new();
            let mut buf = [0u8; 128];
            let mut longest = Duration::ZERO;
            let mut last: Option<Instant> = None;
            let mut ended: Option<Instant> = None;
            loop {
                match rx.recv(&mut buf) {
                    Ok(n) => {
                        let seq: [u8; 8] = buf[..n.min(8)]
                            .try_into()
                            .map_err(|_| format!("a datagram of {n} bytes"))?;
                        got.push(u64::from_be_bytes(seq));
                        if let Some(t) = last {
                            longest = longest.max(t.elapsed());
                        }
                        last = Some(Instant::now());
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(e) => return Err(format!("receiving after {} datagrams: {e}", got.len())),
                }
                let want = expected.load(Ordering::Relaxed);
                if want != u64::MAX {
                    // Stragglers get a second after the sender stopped.
                    let since = *ended.get_or_insert_with(Instant::now);
                    if got.len() as u64 >= want || since.elapsed() > Duration::from_secs(1) {
                        return Ok((got, longest));
                    }
                }
            }
        })
    };
    let tx = client
        .exec(|| UdpSocket::bind(("0.0.0.0", 0)))
        .unwrap_or_else(|e| panic!("{name}: binding the sender: {e}"));
    let stop = Arc::clone(stop);
    let sender = std::thread::spawn(move || {
        let mut seq = 0u64;
        let mut payload = [0x5au8; 64];
        while !stop.load(Ordering::Relaxed) {
            payload[..8].copy_from_slice(&seq.to_be_bytes());
            tx.send_to(&payload, dst)
                .map_err(|e| format!("sending datagram {seq}: {e}"))?;
            seq += 1;
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(seq)
    });
    Datagrams {
        name,
        sender,
        receiver,
        expected,
    }
}

impl Datagrams {
    /// Waits for both ends (after `stop` was set).
    pub fn finish(self) -> DatagramResult {
        let sent = self
            .sender
            .join()
            .expect("sender thread")
            .unwrap_or_else(|e| panic!("{}: {e}", self.name));
        self.expected.store(sent, Ordering::Relaxed);
        let (got, longest_gap) = self
            .receiver
            .join()
            .expect("receiver thread")
            .unwrap_or_else(|e| panic!("{}: {e}", self.name));
        let mut seen = vec![0u32; usize::try_from(sent).expect("count")];
        let mut duplicated = Vec::new();
        for seq in got {
            match usize::try_from(seq).ok().and_then(|i| seen.get_mut(i)) {
                Some(n) => {
                    *n += 1;
                    if *n == 2 {
                        duplicated.push(seq);
                    }
                }
                None => panic!("{}: datagram {seq} of {sent} sent", self.name),
            }
        }
        let lost = (0..sent).filter(|&i| seen[i as usize] == 0).collect();
        DatagramResult {
            name: self.name,
            sent,
            lost,
            duplicated,
            longest_gap,
        }
    }
}

/// (interface, ifindex, ingress?) checked by the poller.
pub type Hook = (String, u32, bool);

/// Node 1 of a two-node static cluster carrying the four paced streams —
/// same-node (pod a → pod b), cross-node (a → pod c on node 2), masqueraded
/// (a → the outside) and through a hostPort (the outside → node 1:8080 →
/// b:80) — and a sequenced UDP flow along each of the four paths (the
/// hostPort one: node 1:5353 → b:53), with the poller watching both pod
/// veths, the uplink and `rivet_host`.
pub struct Scenario {
    /// The world (dropped by the caller, after [`Scenario::finish`]).
    pub w: World,
    /// Node 1, whose agent the test restarts.
    pub n1: usize,
    /// The hooks the poller watches.
    pub hooks: Vec<Hook>,
    /// Node 1's namespace.
    pub ns_path: PathBuf,
    /// Polls made so far.
    pub polls: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    streams: Vec<Stream>,
    flows: Vec<Datagrams>,
    poll_stop: Arc<AtomicBool>,
    poll: JoinHandle<Vec<String>>,
}

impl Scenario {
    /// Builds the cluster in `mode`, starts the streams and the poller, and
    /// lets them run for a second.
    pub fn start(mode: &str) -> Self {
        let mut w = World::new();
        let nodes = w.add_static_cluster(2, mode);
        let (n1, n2) = (nodes[0], nodes[1]);
        let a = w.add_pod(n1);
        let b = w.add_pod_with_ports(
            n1,
            vec![
                PortMapping {
                    host_port: 8080,
                    container_port: 80,
                    protocol: Protocol::Tcp,
                    host_ip: None,
                },
                PortMapping {
                    host_port: 5353,
                    container_port: 53,
                    protocol: Protocol::Udp,
                    host_ip: None,
                },
            ],
        );
        let c = w.add_pod(n2);
        w.add_outside();
        let out = w.outside.as_ref().expect("outside");
        let out_ip = Ipv4Addr::new(192, 168, w.k, 254);
        let n1_ip = w.nodes[n1].ip;
        let (pa, pb, pc) = (&w.pods[a], &w.pods[b], &w.pods[c]);

        let stop = Arc::new(AtomicBool::new(false));
        let streams = vec![
            stream(
                "same-node",
                &pa.ns,
                &pb.ns,
                7001,
                (pb.ip, 7001).into(),
                &stop,
            ),
            stream(
                "cross-node",
                &pa.ns,
                &pc.ns,
                7002,
                (pc.ip, 7002).into(),
                &stop,
            ),
            stream(
                "masquerade",
                &pa.ns,
                out,
                7003,
                (out_ip, 7003).into(),
                &stop,
            ),
            stream("hostPort", out, &pb.ns, 80, (n1_ip, 8080).into(), &stop),
        ];
        let flows = vec![
            datagrams(
                "same-node UDP",
                &pa.ns,
                &pb.ns,
                7101,
                (pb.ip, 7101).into(),
                &stop,
            ),
            datagrams(
                "cross-node UDP",
                &pa.ns,
                &pc.ns,
                7102,
                (pc.ip, 7102).into(),
                &stop,
            ),
            datagrams(
                "masquerade UDP",
                &pa.ns,
                out,
                7103,
                (out_ip, 7103).into(),
                &stop,
            ),
            datagrams("hostPort UDP", out, &pb.ns, 53, (n1_ip, 5353).into(), &stop),
        ];

        let node_ns = &w.nodes[n1].ns;
        let mut hooks: Vec<Hook> = [pa, pb]
            .iter()
            .map(|p| {
                (
                    p.endpoint.host_ifname.clone(),
                    p.endpoint.host_ifindex,
                    true,
                )
            })
            .collect();
        hooks.push(("eth0".into(), ifindex(node_ns, "eth0"), true));
        hooks.push(("rivet_host".into(), ifindex(node_ns, "rivet_host"), false));
        let ns_path = node_ns.path();
        let poll_stop = Arc::new(AtomicBool::new(false));
        let polls = Arc::new(AtomicU64::new(0));
        let poll = poller(
            ns_path.clone(),
            hooks.clone(),
            Arc::clone(&poll_stop),
            Arc::clone(&polls),
        );
        std::thread::sleep(Duration::from_secs(1));
        Self {
            w,
            n1,
            hooks,
            ns_path,
            polls,
            stop,
            streams,
            flows,
            poll_stop,
            poll,
        }
    }

    /// Node 1's state (see [`state`]), with the masquerade and hostPort
    /// flows present in the NAT table.
    pub fn state(&self) -> BTreeMap<&'static str, BTreeSet<String>> {
        let st = state(&self.w, self.n1);
        assert!(
            st["nat"].len() >= 3,
            "the masquerade and hostPort streams are in the NAT table: {:?}",
            st["nat"]
        );
        st
    }

    /// Stops the streams, the UDP flows and the poller and checks that
    /// nothing was lost (see the module's documentation: every byte, no
    /// reset, no retransmission, no pause over [`MAX_PAUSE`]; every
    /// datagram exactly once), and that the poller (at least `min_polls`
    /// polls) never saw a hook without its program. Returns the world (to
    /// drop after any last checks) and the number of polls.
    pub fn finish(self, label: &str, min_polls: u64) -> (World, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let results: Vec<StreamResult> = self.streams.into_iter().map(Stream::finish).collect();
        let flows: Vec<DatagramResult> = self.flows.into_iter().map(Datagrams::finish).collect();
        self.poll_stop.store(true, Ordering::Relaxed);
        let missing = self.poll.join().expect("poller");
        let polls = self.polls.load(Ordering::Relaxed);
        for r in &results {
            eprintln!(
                "{label} {}: {} bytes sent, {} received, longest pause {:?}, {} retransmissions ({} reported duplicate, {} timeouts)",
                r.name, r.sent, r.received, r.longest_pause, r.retransmits, r.spurious, r.timeouts
            );
        }
        for f in &flows {
            eprintln!(
                "{label} {}: {} datagrams sent, {} lost, {} duplicated, longest gap {:?}",
                f.name,
                f.sent,
                f.lost.len(),
                f.duplicated.len(),
                f.longest_gap
            );
        }
        eprintln!("{label}: {polls} attachment polls");
        for r in &results {
            assert!(
                r.sent > 1_000_000,
                "{}: the stream ran ({})",
                r.name,
                r.sent
            );
            assert_eq!(r.received, r.sent, "{}: bytes lost", r.name);
            assert_eq!(
                (r.retransmits.saturating_sub(r.spurious), r.timeouts),
                (0, 0),
                "{}: segments lost: (retransmitted and not reported duplicate, retransmission timeouts); {} retransmissions in all",
                r.name,
                r.retransmits
            );
            assert!(
                r.longest_pause <= MAX_PAUSE,
                "{}: paused {:?} (bound {MAX_PAUSE:?})",
                r.name,
                r.longest_pause
            );
        }
        for f in &flows {
            assert!(
                f.sent > 200,
                "{}: the flow ran ({} datagrams)",
                f.name,
                f.sent
            );
            assert!(
                f.lost.is_empty(),
                "{}: {} of {} datagrams lost: {:?}",
                f.name,
                f.lost.len(),
                f.sent,
                &f.lost[..f.lost.len().min(50)]
            );
            assert!(
                f.duplicated.is_empty(),
                "{}: datagrams received twice: {:?}",
                f.name,
                &f.duplicated[..f.duplicated.len().min(50)]
            );
            assert!(
                f.longest_gap <= MAX_PAUSE,
                "{}: no datagram for {:?} (bound {MAX_PAUSE:?})",
                f.name,
                f.longest_gap
            );
        }
        assert!(polls > min_polls, "the poller ran ({polls} polls)");
        assert!(missing.is_empty(), "programs missing at times: {missing:?}");
        (self.w, polls)
    }
}

/// Runs `f` with a netlink connection inside the namespace at `ns`.
fn with_netlink<T: Send>(
    ns: &Path,
    f: impl AsyncFnOnce(&rivet::netlink::Netlink) -> T + Send,
) -> T {
    rivet::netns::run_in(ns, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let nl = rivet::netlink::Netlink::connect().expect("netlink");
            f(&nl).await
        })
    })
    .expect("netns")
}

/// The IDs of the programs on `hook` (TCX links and tc filters).
async fn hook_ids(nl: &rivet::netlink::Netlink, (name, index, ingress): &Hook) -> Vec<u32> {
    let dir = if *ingress {
        TcAttachType::Ingress
    } else {
        TcAttachType::Egress
    };
    let mut ids: Vec<u32> = SchedClassifier::query_tcx(name.as_str(), dir)
        .map(|(_, p)| p.iter().map(|p| p.id()).collect())
        .unwrap_or_default();
    ids.extend(
        nl.tc_bpf_prog_ids(*index, *ingress)
            .await
            .unwrap_or_default(),
    );
    ids
}

/// Polls `hooks` in the namespace at `ns` every 10 ms until `stop`;
/// returns every (hook, time) found without a program.
pub fn poller(
    ns: PathBuf,
    hooks: Vec<Hook>,
    stop: Arc<AtomicBool>,
    polls: Arc<AtomicU64>,
) -> JoinHandle<Vec<String>> {
    std::thread::spawn(move || {
        with_netlink(&ns, async move |nl| {
            let started = Instant::now();
            let mut missing = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                for hook in &hooks {
                    if hook_ids(nl, hook).await.is_empty() {
                        missing.push(format!(
                            "{} at {:.3}s",
                            hook.0,
                            started.elapsed().as_secs_f64()
                        ));
                    }
                }
                polls.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            missing
        })
    })
}

/// The program IDs on each of `hooks` now, by interface.
pub fn attached_ids(ns: &Path, hooks: &[Hook]) -> BTreeMap<String, Vec<u32>> {
    let hooks = hooks.to_vec();
    with_netlink(ns, async move |nl| {
        let mut out = BTreeMap::new();
        for hook in &hooks {
            out.insert(hook.0.clone(), hook_ids(nl, hook).await);
        }
        out
    })
}

/// The interface index of `name` in `ns`.
pub fn ifindex(ns: &Netns, name: &str) -> u32 {
    let out = ns.ip(&["-o", "link", "show", "dev", name]);
    out.split(':')
        .next()
        .and_then(|i| i.trim().parse().ok())
        .unwrap_or_else(|| panic!("ifindex of {name}: {out}"))
}

/// What the agent and the kernel hold for node `n`, as comparable text:
/// endpoints, remote nodes (routes + peers), hostPorts, NAT entries
/// (without their idle times) and the lease records on disk.
pub fn state(w: &World, n: usize) -> BTreeMap<&'static str, BTreeSet<String>> {
    let client = w.nodes[n].agent().client();
    let call = |r: Request| client.call(&r).unwrap_or_else(|e| panic!("{r:?}: {e}"));
    let mut out = BTreeMap::new();
    if let Response::Endpoints { endpoints } = call(Request::EndpointList {}) {
        out.insert(
            "endpoints",
            endpoints.iter().map(|e| format!("{e:?}")).collect(),
        );
    }
    if let Response::Nodes { nodes } = call(Request::NodeList {}) {
        out.insert("nodes", nodes.iter().map(|e| format!("{e:?}")).collect());
    }
    if let Response::Portmaps { mappings } = call(Request::PortmapList {}) {
        out.insert(
            "hostports",
            mappings.iter().map(|e| format!("{e:?}")).collect(),
        );
    }
    if let Response::Nat { entries, .. } = call(Request::NatList {
        ip: None,
        port: None,
        limit: Some(100_000),
    }) {
        out.insert(
            "nat",
            entries
                .iter()
                .map(|e| format!("{} {} {} {} {}", e.proto, e.dir, e.src, e.dst, e.translated))
                .collect(),
        );
    }
    let dir = &w.nodes[n].agent().args().state_dir;
    out.insert("records", records(dir));
    assert_eq!(out.len(), 5, "every part of the state was read: {out:?}");
    out
}

/// Every file under `dir` with its content. A directory that does not
/// exist holds nothing; any other error reading it panics (it must not
/// read as "no records", the same before and after).
pub fn records(dir: &Path) -> BTreeSet<String> {
    use std::io::ErrorKind::NotFound;
    let mut out = BTreeSet::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == NotFound => return out,
        Err(e) => panic!("listing {}: {e}", dir.display()),
    };
    for e in entries {
        let e = e.unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()));
        let p = e.path();
        let kind = e
            .file_type()
            .unwrap_or_else(|err| panic!("{}: {err}", p.display()));
        if kind.is_dir() {
            out.extend(records(&p));
        } else {
            let text = match std::fs::read(&p) {
                Ok(text) => text,
                // Removed since it was listed (a temporary file renamed).
                Err(e) if e.kind() == NotFound => continue,
                Err(e) => panic!("reading {}: {e}", p.display()),
            };
            out.insert(format!(
                "{}: {}",
                p.display(),
                String::from_utf8_lossy(&text)
            ));
        }
    }
    out
}

/// The workspace root (tests/..).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// Builds the datapath from the same source as the embedded object but
/// with build stamp `stamp` (so its bytes differ), exactly as
/// `userspace/build.rs` does (aya-build's flags, nightly, build-std), into
/// `target/upgrade-obj`; returns the object's path.
///
/// `$RIVET_UPGRADE_OBJECT` names a ready object instead (built by CI).
pub fn build_object(stamp: &str) -> PathBuf {
    if let Some(p) = std::env::var_os("RIVET_UPGRADE_OBJECT") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "RIVET_UPGRADE_OBJECT={} is not a file",
            p.display()
        );
        return p;
    }
    let root = workspace_root();
    let target_dir = root.join("target").join("upgrade-obj");
    // aya-build's flags (aya-build 0.2: bpf_target_arch, debuginfo, BTF).
    let arch = std::env::consts::ARCH;
    let rustflags =
        format!("--cfg=bpf_target_arch=\"{arch}\"\x1f-Cdebuginfo=2\x1f-Clink-arg=--btf");
    let out = Command::new("rustup")
        .args([
            "run",
            "nightly",
            "cargo",
            "build",
            "--package",
            "rivet-ebpf",
        ])
        .args(["--bins", "--release", "--target", "bpfel-unknown-none"])
        .args(["-Z", "build-std=core", "--features", ""])
        .arg("--target-dir")
        .arg(&target_dir)
        .current_dir(&root)
        .env("CARGO_ENCODED_RUSTFLAGS", rustflags)
        .env("RIVET_EBPF_STAMP", stamp)
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTFLAGS")
        .output()
        .unwrap_or_else(|e| panic!("running cargo for the eBPF object: {e}"));
    assert!(
        out.status.success(),
        "building the eBPF object with RIVET_EBPF_STAMP={stamp}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let built = target_dir
        .join("bpfel-unknown-none")
        .join("release")
        .join("rivet");
    // A copy per stamp: a later build into the same directory does not
    // change an object a running test loads.
    let copy = target_dir.join(format!("rivet-{stamp}.o"));
    std::fs::copy(&built, &copy)
        .unwrap_or_else(|e| panic!("copying {} to {}: {e}", built.display(), copy.display()));
    copy
}
