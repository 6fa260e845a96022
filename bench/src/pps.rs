//! The empty TC program the per-packet benchmarks compare against: two
//! instructions (`r0 = TC_ACT_OK; exit`) loaded with a raw `BPF_PROG_LOAD`,
//! so it is not part of rivet's object (whose every program the agent
//! loads and the regression guard checks). It is handed to aya through a
//! pin that lives only until aya has opened it.

use std::{ffi::CString, os::fd::FromRawFd as _, path::PathBuf};

use aya::programs::{ProgramError, SchedClassifier};

/// Why the empty program could not be made.
#[derive(Debug)]
pub enum EmptyProgError {
    /// `BPF_PROG_LOAD` refused it.
    Load(std::io::Error),
    /// `BPF_OBJ_PIN` to the given path failed.
    Pin {
        /// The pin path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// aya could not open the pin.
    Open {
        /// The pin path.
        path: PathBuf,
        /// The error.
        source: ProgramError,
    },
}

impl std::fmt::Display for EmptyProgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Load(e) => write!(f, "BPF_PROG_LOAD of the empty classifier: {e}"),
            Self::Pin { path, source } => write!(
                f,
                "pinning the empty classifier at {}: {source}",
                path.display()
            ),
            Self::Open { path, source } => write!(
                f,
                "opening the pinned empty classifier {}: {source}",
                path.display()
            ),
        }
    }
}

impl std::error::Error for EmptyProgError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Load(e) | Self::Pin { source: e, .. } => Some(e),
            Self::Open { source, .. } => Some(source),
        }
    }
}

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;

/// The head of `union bpf_attr` for `BPF_PROG_LOAD`; the rest stays zero.
#[repr(C)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    rest: [u8; 64],
}

/// `union bpf_attr` for `BPF_OBJ_PIN`.
#[repr(C)]
struct ObjPinAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
    rest: [u8; 112],
}

/// `bpf(2)` with an attribute struct of type `T`.
fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, fully initialised `#[repr(C)]` prefix of
    // `union bpf_attr` (unused fields zero), valid for
    // `size_of::<T>()` bytes for the whole call; every pointer inside it
    // points at memory the caller keeps alive across the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            std::ptr::from_mut(attr).cast::<libc::c_void>(),
            std::mem::size_of::<T>(),
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Loads `bench_empty` (a TC classifier returning `TC_ACT_OK`) and returns
/// it as an aya program, ready for `test_run` and `attach`.
pub fn load_empty() -> Result<SchedClassifier, EmptyProgError> {
    // mov64 r0, 0 ; exit
    let insns: [u64; 2] = [
        u64::from_le_bytes([0xb7, 0, 0, 0, 0, 0, 0, 0]),
        u64::from_le_bytes([0x95, 0, 0, 0, 0, 0, 0, 0]),
    ];
    load_insns("bench_empty", &insns)
}

/// Loads a TC classifier made of `insns` (raw eBPF instructions) under
/// `name` (at most 15 bytes) the same way as [`load_empty`]: the
/// per-helper probes of the program-cost benchmark.
pub fn load_insns(name: &str, insns: &[u64]) -> Result<SchedClassifier, EmptyProgError> {
    let license = c"GPL";
    let mut pname = [0u8; 16];
    let n = name.len().min(15);
    pname[..n].copy_from_slice(&name.as_bytes()[..n]);
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_SCHED_CLS,
        insn_cnt: u32::try_from(insns.len())
            .map_err(|_| EmptyProgError::Load(std::io::Error::other("too many instructions")))?,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 0,
        log_size: 0,
        log_buf: 0,
        kern_version: 0,
        prog_flags: 0,
        prog_name: pname,
        rest: [0; 64],
    };
    let fd = bpf(BPF_PROG_LOAD, &mut attr).map_err(EmptyProgError::Load)?;
    let fd = i32::try_from(fd).map_err(|_| EmptyProgError::Load(std::io::Error::other("fd")))?;
    // SAFETY: the kernel just returned this descriptor to us; nothing else
    // owns it, so the OwnedFd closes it exactly once.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let path = PathBuf::from(format!(
        "/sys/fs/bpf/rivet-bench-empty-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let cpath =
        CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| EmptyProgError::Pin {
            path: path.clone(),
            source: std::io::Error::other(e),
        })?;
    let mut pin = ObjPinAttr {
        pathname: cpath.as_ptr() as u64,
        bpf_fd: std::os::fd::AsRawFd::as_raw_fd(&fd) as u32,
        file_flags: 0,
        rest: [0; 112],
    };
    bpf(BPF_OBJ_PIN, &mut pin).map_err(|source| EmptyProgError::Pin {
        path: path.clone(),
        source,
    })?;
    // aya holds its own descriptor from here; the pin goes at once.
    let prog = SchedClassifier::from_pin(&path);
    let _ = std::fs::remove_file(&path);
    drop(fd);
    prog.map_err(|source| EmptyProgError::Open { path, source })
}

// ---------------------------------------------------------------------------
// The packet-rate benchmark.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use aya::programs::tc::{NlOptions, TcAttachOptions, TcAttachType};

use crate::{Options, Report, progress};
use rivet_tests::{
    Netns, World,
    packet::{ETH_P_IP, Ipv4, eth, frame},
    unique_prefix,
};

/// UDP destination port of the blast.
const PORT: u16 = 9999;
/// Frames per `sendmmsg`.
const BATCH: usize = 32;

/// The variants, in display order.
const VARIANTS: [&str; 3] = ["rivet", "empty-prog+route", "route"];

/// A 60-byte Ethernet frame (64 on the wire with the FCS): IPv4/UDP from
/// `src` to `dst`, 18 bytes of payload, UDP checksum 0.
fn udp_frame(dst_mac: [u8; 6], src_mac: [u8; 6], src: Ipv4Addr, dst: Ipv4Addr) -> Vec<u8> {
    let mut udp = Vec::new();
    udp.extend_from_slice(&9u16.to_be_bytes());
    udp.extend_from_slice(&PORT.to_be_bytes());
    udp.extend_from_slice(&26u16.to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(&[0x5a; 18]);
    let ip = Ipv4 {
        protocol: 17,
        payload: udp,
        ..Ipv4::new(src, dst)
    };
    frame(&[&eth(dst_mac, src_mac, ETH_P_IP), &ip.bytes()])
}

/// An `AF_PACKET` socket bound to `eth0` of the calling thread's namespace,
/// bypassing the qdisc (the frame goes straight to the veth's xmit).
struct PacketSocket(std::os::fd::OwnedFd);

impl PacketSocket {
    fn open(ifname: &str) -> std::io::Result<Self> {
        use std::os::fd::{AsRawFd as _, FromRawFd as _};
        let proto = (libc::ETH_P_IP as u16).to_be();
        // SAFETY: plain socket(2) call; the result is checked below.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(proto)) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by socket(2) and is owned by
        // nobody else.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let ifindex = nix::net::if_::if_nametoindex(ifname).map_err(std::io::Error::from)?;
        // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: `sll` is a valid sockaddr_ll for the given length and
        // outlives the call.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                std::ptr::from_ref(&sll).cast::<libc::sockaddr>(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let one: libc::c_int = 1;
        // SAFETY: `one` is a c_int that outlives the call.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_QDISC_BYPASS,
                std::ptr::from_ref(&one).cast::<libc::c_void>(),
                std::mem::size_of::<libc::c_int>() as u32,
            )
        };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self(fd))
    }

    /// Sends `frame` over and over until `until`; frames accepted.
    fn blast(&self, frame: &[u8], until: Instant) -> u64 {
        use std::os::fd::AsRawFd as _;
        let mut iov = libc::iovec {
            iov_base: frame.as_ptr().cast_mut().cast::<libc::c_void>(),
            iov_len: frame.len(),
        };
        // SAFETY: mmsghdr is plain old data; all-zero is a valid value.
        let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
        for m in &mut msgs {
            m.msg_hdr.msg_iov = &raw mut iov;
            m.msg_hdr.msg_iovlen = 1;
        }
        let mut sent = 0u64;
        while Instant::now() < until {
            // SAFETY: `msgs` holds BATCH valid headers whose single iovec
            // points at `frame`, which the kernel only reads; all of them
            // outlive the call.
            let r = unsafe {
                libc::sendmmsg(
                    self.0.as_raw_fd(),
                    msgs.as_mut_ptr(),
                    BATCH as u32,
                    libc::MSG_DONTWAIT,
                )
            };
            if r > 0 {
                sent += r as u64;
            }
        }
        sent
    }
}

/// Datagrams that reached UDP in `ns` (delivered, dropped for a full
/// receive buffer or without a socket): from `/proc/net/snmp`.
fn udp_arrived(ns: &Netns) -> u64 {
    let text = ns.run("cat", &["/proc/net/snmp"]);
    let mut lines = text.lines().filter(|l| l.starts_with("Udp:"));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        panic!("no Udp lines in /proc/net/snmp of {}", ns.name());
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .filter(|(n, _)| matches!(*n, "InDatagrams" | "NoPorts" | "InErrors"))
        .map(|(_, v)| v.parse::<u64>().unwrap_or(0))
        .sum()
}

/// A sender namespace, its frame, and the receiver namespace.
struct Lane<'a> {
    name: &'static str,
    client: &'a Netns,
    server: &'a Netns,
    frame: Vec<u8>,
}

/// A plain routed pod pair on node `node`: pods `<p>a`/`<p>b` with
/// `10.251.<i>.2/3`, host veths `h<i>a`/`h<i>b`, /32 routes and permanent
/// neighbours on the node (the ptp layout without a program).
fn routed_pair(node: &Netns, prefix: &str, i: u8) -> (Netns, Netns, Vec<u8>) {
    let a = Netns::new(format!("{prefix}-r{i}a"));
    let b = Netns::new(format!("{prefix}-r{i}b"));
    let mut macs = Vec::new();
    for (pod, side, host) in [(&a, 2u8, format!("h{i}a")), (&b, 3, format!("h{i}b"))] {
        let ip = format!("10.251.{i}.{side}");
        node.ip(&[
            "link",
            "add",
            &host,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            pod.name(),
        ]);
        node.ip(&["link", "set", &host, "up"]);
        node.ip(&["route", "add", &format!("{ip}/32"), "dev", &host]);
        pod.ip(&["addr", "add", &format!("{ip}/32"), "dev", "eth0"]);
        pod.ip(&["link", "set", "eth0", "up"]);
        pod.ip(&[
            "route",
            "add",
            "169.254.1.1",
            "dev",
            "eth0",
            "scope",
            "link",
        ]);
        pod.ip(&["route", "add", "default", "via", "169.254.1.1"]);
        let pod_mac = pod.exec(|| rivet_tests::progtest::link_mac("eth0"));
        let host_mac = node.exec(|| rivet_tests::progtest::link_mac(&host));
        node.ip(&[
            "neigh",
            "replace",
            &ip,
            "lladdr",
            &rivet::netlink::format_mac(&pod_mac),
            "dev",
            &host,
            "nud",
            "permanent",
        ]);
        macs.push((pod_mac, host_mac));
    }
    let frame = udp_frame(
        macs[0].1,
        macs[0].0,
        Ipv4Addr::new(10, 251, i, 2),
        Ipv4Addr::new(10, 251, i, 3),
    );
    (a, b, frame)
}

/// Runs the benchmark.
pub fn run(opts: &Options) -> Report {
    let (rounds, secs) = (opts.rounds, opts.secs);
    let prefix = unique_prefix();
    progress("pps: building the worlds");
    // rivet: a node with its agent, two pods.
    let mut world = World::new();
    let n = world.add_node_with_agent();
    let pa = world.add_pod(n);
    let pb = world.add_pod(n);
    let mac = |s: &str| rivet::netlink::parse_mac(s).expect("MAC from the agent");
    let rivet_frame = udp_frame(
        mac(&world.pods[pa].endpoint.host_mac),
        mac(&world.pods[pa].endpoint.mac),
        world.pods[pa].ip,
        world.pods[pb].ip,
    );
    // The baselines: one node namespace, two routed pairs; the first has the
    // empty program on its host veth's ingress (netlink cls_bpf, as rivet
    // attaches pods), the second nothing.
    let node = Netns::new(format!("{prefix}-ppsnode"));
    node.run("sysctl", &["-qw", "net.ipv4.ip_forward=1"]);
    node.run("sysctl", &["-qw", "net.ipv4.conf.all.rp_filter=0"]);
    let (e_a, e_b, e_frame) = routed_pair(&node, &prefix, 1);
    let (r_a, r_b, r_frame) = routed_pair(&node, &prefix, 2);
    let mut empty = load_empty().expect("the empty program");
    node.exec(|| {
        let _ = aya::programs::tc::qdisc_add_clsact("h1a");
        let id = empty
            .attach_with_options(
                "h1a",
                TcAttachType::Ingress,
                TcAttachOptions::Netlink(NlOptions {
                    priority: 1,
                    ..NlOptions::default()
                }),
            )
            .expect("attaching the empty program");
        // The filter lives on h1a and goes with it (the namespace is
        // deleted at the end, also on a panic). aya's link would detach by
        // ifindex in whatever namespace drops it — the machine's own, from
        // the main thread — so it is not kept: a netlink filter link holds
        // no descriptor, forgetting it leaks nothing in the kernel.
        let link = empty.take_link(id).expect("the filter's link");
        std::mem::forget(link);
    });
    let lanes = [
        Lane {
            name: "rivet",
            client: &world.pods[pa].ns,
            server: &world.pods[pb].ns,
            frame: rivet_frame,
        },
        Lane {
            name: "empty-prog+route",
            client: &e_a,
            server: &e_b,
            frame: e_frame,
        },
        Lane {
            name: "route",
            client: &r_a,
            server: &r_b,
            frame: r_frame,
        },
    ];
    // The same bridge-netfilter setting in every namespace of every
    // variant, read back.
    let spaces_all = || crate::world_spaces(&world).chain([&node, &e_a, &e_b, &r_a, &r_b]);
    let kernel_at_setup = crate::bridge_nf_off(spaces_all());
    // A bound UDP socket at each receiver (never read: datagrams past its
    // buffer count as receive errors, and none answers port-unreachable).
    let sinks: Vec<std::net::UdpSocket> = lanes
        .iter()
        .map(|l| {
            l.server
                .exec(|| std::net::UdpSocket::bind(("0.0.0.0", PORT)).expect("UDP sink"))
        })
        .collect();

    let mut report = Report {
        name: "packet rate: 64-byte UDP pod → pod (real frames)".into(),
        variants: VARIANTS.iter().map(|v| (*v).to_owned()).collect(),
        baseline: "empty-prog+route".into(),
        ..Default::default()
    };
    report.better.insert("rx_mpps".into(), "higher".into());
    report.better.insert("tx_mpps".into(), "higher".into());
    report
        .better
        .insert("delivered_share".into(), "higher".into());
    // Blast length: 0.4 × --secs (2 s by default: ~0.5M frames, so the
    // spread is drift between rounds, not the sample), 0.5 s in a smoke
    // run; warm-up 1 s (0.3 s).
    let sample = opts.pick(
        Duration::from_secs_f64(f64::from(secs) * 0.4),
        Duration::from_millis(500),
    );
    let warm = opts.pick(Duration::from_secs(1), Duration::from_millis(300));
    let lane_refs: Vec<&Lane<'_>> = lanes.iter().collect();
    let started = Instant::now();
    for round in 0..=rounds {
        for l in crate::rotated(&lane_refs, round as usize) {
            progress(&format!(
                "pps: round {round}/{rounds} {:<16} [{:.0}s]",
                l.name,
                started.elapsed().as_secs_f64()
            ));
            let before = udp_arrived(l.server);
            let t = if round == 0 { warm } else { sample };
            let (sent, elapsed) = l.client.exec(|| {
                let cpu = nix::sched::CpuSet::new();
                let mut cpu = cpu;
                let _ = cpu.set(0);
                let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &cpu);
                let sock = PacketSocket::open("eth0").expect("AF_PACKET socket");
                let start = Instant::now();
                let sent = sock.blast(&l.frame, start + t);
                (sent, start.elapsed())
            });
            // Whatever is still queued lands within milliseconds.
            std::thread::sleep(Duration::from_millis(100));
            let got = udp_arrived(l.server) - before;
            if round == 0 {
                assert!(
                    got > 0,
                    "{}: no frame reached the receiver ({sent} sent)",
                    l.name
                );
                continue;
            }
            let s = elapsed.as_secs_f64();
            report.add("rx_mpps", l.name, got as f64 / s / 1e6);
            report.add("tx_mpps", l.name, sent as f64 / s / 1e6);
            report.add("delivered_share", l.name, got as f64 / (sent.max(1)) as f64);
        }
    }
    progress("");
    eprintln!("pps: done in {:.0}s", started.elapsed().as_secs_f64());
    let kernel_at_end = crate::bridge_nf_read(spaces_all());
    report.set_kernel_settings(kernel_at_setup, &kernel_at_end);
    report.notes.push(format!("order: {}", crate::ROTATION));
    report.notes.push(format!(
        "one sender thread on CPU 0 in the client pod blasts one 60-byte frame (64 on the wire: IPv4/UDP, 18 bytes of payload) with sendmmsg({BATCH}) on an AF_PACKET socket bound to eth0 with PACKET_QDISC_BYPASS, for {} s per sample, {rounds} interleaved rounds after a warm-up of {} s; rx_mpps: datagrams that reached UDP in the server pod (InDatagrams + InErrors + NoPorts of its /proc/net/snmp; a bound socket nobody reads, so past its buffer they count as receive errors) per second of sending; tx_mpps: frames the socket accepted",
        sample.as_secs_f64(),
        warm.as_secs_f64()
    ));
    report.notes.push("everything runs on the sender's CPU: veth xmit queues the frame on that CPU's backlog, and its softirq runs the host veth's TC ingress, the forwarding and the receiving pod's stack — the rate is the whole per-packet path of one CPU, not the program alone (BPF_PROG_TEST_RUN figures for the program alone: bench prog-cost, local_redirect_ns vs empty_prog_repeat_ns)".into());
    report.notes.push("rivet: rivetd pods, from_pod (netlink cls_bpf) with bpf_redirect_peer (the host stack skipped); empty-prog+route: the same veth layout without rivet, an empty TC program (r0 = TC_ACT_OK; exit) on the host veth ingress (netlink cls_bpf) and the kernel forwarding along a /32 route with a permanent neighbour; route: the same without any program".into());
    drop(sinks);
    drop(empty);
    drop(lanes);
    drop((e_a, e_b, r_a, r_b, node));
    drop(world);
    report
}
