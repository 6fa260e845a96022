//! Per-packet program cost, two ways.
//!
//! 1. BPF_PROG_TEST_RUN: each program path runs on a crafted packet with
//!    the maps filled, timed by the kernel, net of an empty TC program
//!    (`r0 = TC_ACT_OK; exit`, see [`crate::pps`]) timed the same way. How
//!    a path is timed depends on what it does to its packet:
//!    - it leaves the packet as it was (pass, drop, hostPort miss): the
//!      kernel's own `repeat` (10^6 runs on one skb); afterwards the output
//!      must equal the input and the path's counter must have moved once
//!      per run;
//!    - it only decrements the TTL (local redirect: the MAC rewrite is
//!      idempotent): `repeat` in chunks of 250 runs on a packet whose TTL
//!      starts at 255, so every run stays on the path (TTL ≥ 5, checked in
//!      the output) — 4,000 chunks, 10^6 runs;
//!    - it rewrites or resizes the packet (ARP reply, encap, decap, SNAT,
//!      DNAT): single runs, each on a fresh copy, minus the mean single run
//!      of the empty program measured right after on the same packet (a
//!      single run carries the test_run timer's ~100+ ns).
//!
//!    Test skbs get `NET_SKB_PAD` (64 bytes) of headroom from the kernel,
//!    more than VXLAN's 50, so encap grows into headroom as on a real
//!    packet: a `perf` (cpu-clock) profile of encap single runs shows
//!    `bpf_skb_generic_push` and no `pskb_expand_head`. The same paths are
//!    timed again with the maps at working sizes (16,000 endpoints, 64,000
//!    NAT entries) to show lookups do not grow.
//!
//!    The kernel helpers those paths are made of are timed alone too, each
//!    in a raw program of a few instructions that calls it as rivet does,
//!    with `repeat` (10^6) net of the empty program: `bpf_fib_lookup`,
//!    `bpf_skb_adjust_room` +50/−50 (idempotent, so repeatable),
//!    `bpf_get_hash_recalc` after `bpf_set_hash_invalid` (the flow
//!    dissector) and one ENDPOINTS hash lookup. They bound from below what
//!    a path that needs them can cost.
//! 2. Live: kernel BPF statistics (`BPF_ENABLE_STATS`, held by a file
//!    descriptor: closing it — also on a panic or if the process dies —
//!    turns them off again) while iperf3 runs pod → pod through rivet, on
//!    one node and across two nodes in VXLAN; `run_time_ns / run_cnt` of
//!    each program over the transfer.

use std::{net::Ipv4Addr, sync::Mutex, time::Instant};

use aya::{
    maps::{HashMap, LpmTrie, MapData, RingBuf, lpm_trie::Key},
    programs::{SchedClassifier, TestRun as _, TestRunOptions},
};
use rivet_common::{
    Counter, EndpointInfo, EndpointKey, NatEntry, NatKey, RouteInfo, endpoint_flags, ipv4_key,
    nat_dir, program_names, route_mode,
};

use crate::{Options, Report, progress};
use rivet_tests::{
    World,
    packet::{ETH_P_ARP, ETH_P_IP, Ipv4, arp, checksum, eth, frame},
    progtest::{
        GATEWAY, Harness, NODE_IP, PEER_IP, PEER_MAC, PodSide, TC_ACT_OK, TC_ACT_REDIRECT,
        TC_ACT_SHOT, VNI, VXLAN_PORT, sh, skb_ctx, with_harness,
    },
    traffic::{iperf3_client, iperf3_server},
};

const REMOTE_POD: Ipv4Addr = Ipv4Addr::new(10, 9, 2, 7);
/// A remote pod subnet routed to the peer in IPIP.
const IPIP_POD: Ipv4Addr = Ipv4Addr::new(10, 9, 3, 7);
/// An outside host behind the default route.
const OUTSIDE: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 7);
/// The default gateway on the uplink (a permanent neighbour).
const ROUTER: Ipv4Addr = Ipv4Addr::new(192, 168, 9, 1);
/// New SNAT flows go to addresses counted up from here (172.16.0.0/12).
const NEW_FLOW_BASE: u32 = u32::from_be_bytes([172, 16, 0, 0]);
/// Kernel `repeat` runs per sample of an unchanged-packet path.
const REPEAT_RUNS: u32 = 1_000_000;
/// Runs per chunk of the TTL-budget method (TTL 255 → 5).
const TTL_CHUNK: u32 = 250;
/// Chunk of a path that writes ring-buffer events (the 1 MiB ring holds
/// 32,768 events; drained between chunks).
const EVENT_CHUNK: u32 = 20_000;

/// How a path is timed (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Method {
    /// Kernel `repeat` on one unchanged packet.
    Repeat,
    /// Kernel `repeat` in chunks of [`TTL_CHUNK`] from TTL 255.
    TtlChunks,
    /// Single runs on fresh copies, minus the empty program's single run.
    Single,
    /// Single runs, each opening a new masqueraded flow (new destination).
    SingleNewFlow,
}

impl Method {
    const fn describe(self) -> &'static str {
        match self {
            Self::Repeat => "kernel repeat 10^6 on one unchanged packet (output = input checked)",
            Self::TtlChunks => {
                "kernel repeat in 4,000 chunks of 250 from TTL 255 (TTL − 250 checked), sent by a pod whose MAC is the one the rewrite writes"
            }
            Self::Single => "single runs on fresh copies − the empty program's single run",
            Self::SingleNewFlow => {
                "single runs, a new destination each (a new flow) − the empty program's single run"
            }
        }
    }
}

/// One timed path.
struct PathSpec {
    name: &'static str,
    prog: &'static str,
    frame: Vec<u8>,
    ifindex: u32,
    method: Method,
    verdict: u32,
    counter: Counter,
}

/// A TCP SYN (no options, checksum left 0: the programs update it
/// incrementally and never verify it).
fn tcp(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16) -> Ipv4 {
    let mut seg = Vec::new();
    seg.extend_from_slice(&sport.to_be_bytes());
    seg.extend_from_slice(&dport.to_be_bytes());
    seg.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 5 << 4, 0x02, 0xff, 0xff, 0, 0, 0, 0]);
    Ipv4 {
        protocol: 6,
        payload: seg,
        ..Ipv4::new(src, dst)
    }
}

/// The paths, in display order.
fn paths(h: &Harness) -> Vec<PathSpec> {
    let (a, b) = (h.a, h.b);
    let uplink = h.uplink.0;
    let from_outside = |ip: &Ipv4| frame(&[&eth(h.uplink.1, PEER_MAC, ETH_P_IP), &ip.bytes()]);
    let path = |name, prog, frame, ifindex, method, verdict, counter| PathSpec {
        name,
        prog,
        frame,
        ifindex,
        method,
        verdict,
        counter,
    };
    let ttl255 = Ipv4 {
        ttl: 255,
        ..Ipv4::new(TWIN.ip, b.ip)
    };
    vec![
        path(
            "uplink_pass",
            program_names::FROM_UPLINK,
            frame(&[
                &eth([0xff; 6], PEER_MAC, ETH_P_ARP),
                &arp(1, PEER_MAC, PEER_IP, [0; 6], NODE_IP),
            ]),
            uplink,
            Method::Repeat,
            TC_ACT_OK,
            Counter::UplinkPass,
        ),
        path(
            "pod_to_host_pass",
            program_names::FROM_POD,
            h.ip_frame(a, &Ipv4::new(a.ip, NODE_IP)),
            a.host_ifindex,
            Method::Repeat,
            TC_ACT_OK,
            Counter::PassHost,
        ),
        path(
            "drop_spoofed_with_event",
            program_names::FROM_POD,
            h.ip_frame(a, &Ipv4::new(Ipv4Addr::new(10, 9, 1, 99), b.ip)),
            a.host_ifindex,
            Method::Repeat,
            TC_ACT_SHOT,
            Counter::DropSpoofedIp,
        ),
        path(
            "dnat_miss_pass",
            program_names::FROM_UPLINK,
            from_outside(&tcp(OUTSIDE, NODE_IP, 50_000, 8081)),
            uplink,
            Method::Repeat,
            TC_ACT_OK,
            Counter::UplinkPass,
        ),
        path(
            "local_redirect",
            program_names::FROM_POD,
            h.ip_frame(twin(h), &ttl255),
            a.host_ifindex,
            Method::TtlChunks,
            TC_ACT_REDIRECT,
            Counter::FwdLocal,
        ),
        path(
            "local_redirect_egress_limited",
            program_names::FROM_POD,
            h.ip_frame(
                twin_limited(h),
                &Ipv4 {
                    ttl: 255,
                    ..Ipv4::new(TWIN_LIMITED, b.ip)
                },
            ),
            a.host_ifindex,
            Method::TtlChunks,
            TC_ACT_REDIRECT,
            Counter::FwdLocal,
        ),
        path(
            "arp_reply",
            program_names::FROM_POD,
            frame(&[
                &eth([0xff; 6], a.mac, ETH_P_ARP),
                &arp(1, a.mac, a.ip, [0; 6], GATEWAY),
            ]),
            a.host_ifindex,
            Method::Single,
            TC_ACT_REDIRECT,
            Counter::ArpReply,
        ),
        path(
            "encap_vxlan",
            program_names::FROM_POD,
            h.ip_frame(a, &Ipv4::new(a.ip, REMOTE_POD)),
            a.host_ifindex,
            Method::Single,
            TC_ACT_REDIRECT,
            Counter::FwdEncapVxlan,
        ),
        path(
            "encap_ipip",
            program_names::FROM_POD,
            h.ip_frame(a, &Ipv4::new(a.ip, IPIP_POD)),
            a.host_ifindex,
            Method::Single,
            TC_ACT_REDIRECT,
            Counter::FwdEncapIpip,
        ),
        path(
            "decap_vxlan",
            program_names::FROM_UPLINK,
            h.vxlan_frame(
                PEER_IP,
                VNI,
                VXLAN_PORT,
                &Ipv4::new(REMOTE_POD, b.ip).bytes(),
            ),
            uplink,
            Method::Single,
            TC_ACT_REDIRECT,
            Counter::DecapVxlan,
        ),
        path(
            "decap_ipip",
            program_names::FROM_UPLINK,
            h.ipip_frame(PEER_IP, &Ipv4::new(REMOTE_POD, b.ip).bytes()),
            uplink,
            Method::Single,
            TC_ACT_REDIRECT,
            Counter::DecapIpip,
        ),
        path(
            "snat_new_flow",
            program_names::FROM_POD,
            h.ip_frame(a, &tcp(a.ip, OUTSIDE, 40_001, 443)),
            a.host_ifindex,
            Method::SingleNewFlow,
            TC_ACT_REDIRECT,
            Counter::FwdSnat,
        ),
        path(
            "snat_existing_flow",
            program_names::FROM_POD,
            h.ip_frame(a, &tcp(a.ip, OUTSIDE, 40_000, 443)),
            a.host_ifindex,
            Method::Single,
            TC_ACT_REDIRECT,
            Counter::FwdSnat,
        ),
        path(
            "dnat_hit",
            program_names::FROM_UPLINK,
            from_outside(&tcp(OUTSIDE, NODE_IP, 50_000, 8080)),
            uplink,
            Method::Single,
            TC_ACT_REDIRECT,
            Counter::FwdDnat,
        ),
    ]
}

/// A second pod behind pod A's veth whose MAC is pod B's host veth MAC:
/// the local redirect rewrites the source MAC to exactly that, so the
/// rewritten packet passes the anti-spoof check again and repetition stays
/// on the path (only the values differ from a real pod; the code run, the
/// lookups and the writes are the same).
const TWIN: TwinAddr = TwinAddr {
    ip: Ipv4Addr::new(10, 9, 1, 4),
};

/// See [`TWIN`].
struct TwinAddr {
    ip: Ipv4Addr,
}

/// The twin pod as the datapath knows it.
fn twin(h: &Harness) -> PodSide {
    PodSide {
        ip: TWIN.ip,
        mac: h.b.host_mac,
        host_ifindex: h.a.host_ifindex,
        host_mac: h.a.host_mac,
    }
}

/// A twin (see [`TWIN`]) with an egress bandwidth limit: `from_pod`
/// checks its packets against a bucket (so fast it never drops): the cost
/// a limited pod pays per packet, beside `local_redirect` (unlimited).
const TWIN_LIMITED: Ipv4Addr = Ipv4Addr::new(10, 9, 1, 5);

/// The limited twin as the datapath knows it.
fn twin_limited(h: &Harness) -> PodSide {
    PodSide {
        ip: TWIN_LIMITED,
        ..twin(h)
    }
}

/// Masquerade on, a hostPort 8080 → pod A:80, VXLAN and IPIP routes to the
/// peer, a default route via a router on the uplink, the limited twin's
/// bucket.
fn prepare(h: &mut Harness) {
    h.enable_nat(61_000, 65_535);
    let a = h.a;
    h.put_hostport(8080, a, 80);
    let t = twin(h);
    h.put_endpoint(t);
    let limited = twin_limited(h);
    h.put_endpoint_flags(
        limited,
        endpoint_flags::READY | endpoint_flags::BANDWIDTH_EGRESS,
    );
    let mut pod_bw = rivet_common::PodBandwidth::default();
    pod_bw.buckets[rivet_common::bandwidth_dir::EGRESS] = rivet_common::Bucket {
        rate: 1 << 50,
        depth_ns: 1 << 60,
        ..rivet_common::Bucket::default()
    };
    let mut bw: HashMap<&mut MapData, u32, rivet_common::PodBandwidth> =
        HashMap::try_from(h.ebpf.map_mut("BANDWIDTH").expect("map")).expect("hash");
    bw.insert(a.host_ifindex, pod_bw, 0)
        .expect("bandwidth entry");
    h.route_to_peer(route_mode::VXLAN);
    let mut routes: LpmTrie<&mut MapData, u32, RouteInfo> =
        LpmTrie::try_from(h.ebpf.map_mut("ROUTES").expect("map")).expect("lpm");
    routes
        .insert(
            &Key::new(24, ipv4_key([10, 9, 3, 0])),
            RouteInfo {
                node_ip: ipv4_key(PEER_IP.octets()),
                mode: route_mode::IPIP,
            },
            0,
        )
        .expect("ipip route");
    // The harness runs this closure inside its namespace's thread: `ip`
    // inherits that namespace.
    sh(&[
        "ip",
        "neigh",
        "replace",
        &ROUTER.to_string(),
        "lladdr",
        "02:00:00:00:01:01",
        "dev",
        "up0",
        "nud",
        "permanent",
    ]);
    sh(&[
        "ip",
        "route",
        "replace",
        "default",
        "via",
        &ROUTER.to_string(),
        "dev",
        "up0",
    ]);
}

/// Fills ENDPOINTS to 16,000 and NAT to 64,000 entries (other pods, other
/// flows).
fn fill(h: &mut Harness) {
    {
        let mut eps: HashMap<&mut MapData, EndpointKey, EndpointInfo> =
            HashMap::try_from(h.ebpf.map_mut("ENDPOINTS").expect("map")).expect("hash");
        for i in 0..16_000u32 {
            let addr = ipv4_key([10, 100 + (i >> 16) as u8, (i >> 8) as u8, i as u8]);
            let _ = eps.insert(
                EndpointKey { addr },
                EndpointInfo {
                    ifindex: 9999,
                    flags: endpoint_flags::READY,
                    mac: [2, 0, 0, 0, 0, 1],
                    host_mac: [2, 0, 0, 0, 0, 2],
                },
                0,
            );
        }
    }
    let mut nat: HashMap<&mut MapData, NatKey, NatEntry> =
        HashMap::try_from(h.ebpf.map_mut("NAT").expect("map")).expect("hash");
    for i in 0..32_000u32 {
        let src = ipv4_key([10, 200, (i >> 8) as u8, i as u8]);
        let k = NatKey::new(
            src,
            ipv4_key([1, 1, 1, 1]),
            (1000, 443u16.to_be()),
            6,
            nat_dir::EGRESS,
        );
        let r = NatKey::new(
            ipv4_key([1, 1, 1, 1]),
            ipv4_key(NODE_IP.octets()),
            (443u16.to_be(), i as u16),
            6,
            nat_dir::REPLY,
        );
        let _ = nat.insert(k, NatEntry::default(), 0);
        let _ = nat.insert(r, NatEntry::default(), 0);
    }
}

/// Removes the NAT entries of the new-flow path (destination or source in
/// 172.16.0.0/12), so samples do not pile up in the table.
fn remove_new_flows(h: &mut Harness) {
    let mut nat: HashMap<&mut MapData, NatKey, NatEntry> =
        HashMap::try_from(h.ebpf.map_mut("NAT").expect("map")).expect("hash");
    let ours = |a: u32| u32::from_be(a) & 0xfff0_0000 == NEW_FLOW_BASE;
    let keys: Vec<NatKey> = nat
        .keys()
        .filter_map(Result::ok)
        .filter(|k| ours(k.src) || ours(k.dst))
        .collect();
    for k in keys {
        let _ = nat.remove(&k);
    }
}

/// One `BPF_PROG_TEST_RUN`: (verdict, mean ns per run, output length).
fn test_run(
    prog: &SchedClassifier,
    data: &[u8],
    ctx: &[u8],
    out: &mut [u8],
    repeat: u32,
) -> (u32, f64, usize) {
    let mut opts = TestRunOptions::new();
    opts.data_in = Some(data);
    opts.data_out = Some(out);
    opts.ctx_in = Some(ctx);
    opts.repeat = repeat;
    let res = prog
        .test_run(opts)
        .unwrap_or_else(|e| panic!("test_run: {e}: {:?}", std::error::Error::source(&e)));
    (
        res.return_value,
        res.duration.as_nanos() as f64,
        res.data_size_out as usize,
    )
}

/// Mean raw ns per run of `prog` on `data` in single runs, checking the
/// verdict of every run when `verdict` is given. `vary` may change the
/// packet before each run (the new-flow path).
fn single_runs(
    prog: &SchedClassifier,
    data: &[u8],
    ifindex: u32,
    runs: u32,
    verdict: Option<u32>,
    mut vary: impl FnMut(&mut [u8]),
) -> f64 {
    let ctx = skb_ctx(ifindex);
    let mut input = data.to_vec();
    let mut out = vec![0u8; data.len() + 512];
    let mut total = 0.0;
    for _ in 0..runs {
        vary(&mut input);
        let (v, ns, _) = test_run(prog, &input, &ctx, &mut out, 1);
        if let Some(want) = verdict {
            assert_eq!(v, want, "verdict of a single run");
        }
        total += ns;
    }
    total / f64::from(runs.max(1))
}

/// Mean raw ns per run with the kernel's `repeat`, in chunks of `chunk`;
/// checks the verdict and the output after every chunk (`expect_out`) and
/// drains the event ring (returns the events seen too).
fn repeated(
    prog: &SchedClassifier,
    p: &PathSpec,
    chunk: u32,
    total: u32,
    expect_out: &[u8],
    ring: &mut RingBuf<MapData>,
) -> (f64, u64) {
    let ctx = skb_ctx(p.ifindex);
    let mut out = vec![0u8; p.frame.len() + 512];
    let (mut sum, mut runs, mut events) = (0.0, 0u32, 0u64);
    while runs < total {
        let n = chunk.min(total - runs);
        let (v, ns, len) = test_run(prog, &p.frame, &ctx, &mut out, n);
        assert_eq!(v, p.verdict, "{}: verdict after {n} repeated runs", p.name);
        assert_eq!(
            &out[..len],
            expect_out,
            "{}: output after {n} repeated runs",
            p.name
        );
        sum += ns * f64::from(n);
        runs += n;
        while ring.next().is_some() {
            events += 1;
        }
    }
    (sum / f64::from(runs.max(1)), events)
}

/// The counter of `c` summed over CPUs.
fn counter(h: &Harness, c: Counter) -> u64 {
    h.counters().get(c.name()).copied().unwrap_or(0)
}

/// Times one path: (net ns per run, raw ns per run).
fn time_path(
    h: &mut Harness,
    p: &PathSpec,
    empty: &SchedClassifier,
    single_runs_n: u32,
    ring: &mut RingBuf<MapData>,
    next_flow: &mut u32,
) -> (f64, f64) {
    let before = counter(h, p.counter);
    let ctx_empty = |repeat| {
        let ctx = skb_ctx(p.ifindex);
        let mut out = vec![0u8; p.frame.len() + 512];
        test_run(empty, &p.frame, &ctx, &mut out, repeat).1
    };
    let (raw, runs, floor) = {
        let prog: &SchedClassifier = h
            .ebpf
            .program(p.prog)
            .expect("program")
            .try_into()
            .expect("classifier");
        match p.method {
            Method::Repeat => {
                let chunk = if p.verdict == TC_ACT_SHOT {
                    EVENT_CHUNK
                } else {
                    REPEAT_RUNS
                };
                let (raw, events) = repeated(prog, p, chunk, REPEAT_RUNS, &p.frame, ring);
                if p.verdict == TC_ACT_SHOT {
                    assert_eq!(
                        events,
                        u64::from(REPEAT_RUNS),
                        "{}: one drop event per run",
                        p.name
                    );
                }
                (raw, REPEAT_RUNS, ctx_empty(REPEAT_RUNS))
            }
            Method::TtlChunks => {
                let mut expect = p.frame.clone();
                // TTL at 14 + 8, checksum at 14 + 10: the output after a
                // chunk is the input with TTL − 250 and the checksum to
                // match; the MACs are already the ones the program writes.
                let b = h.b;
                expect[..6].copy_from_slice(&b.mac);
                expect[6..12].copy_from_slice(&b.host_mac);
                expect[22] -= TTL_CHUNK as u8;
                expect[24..26].copy_from_slice(&[0, 0]);
                let sum = checksum(&expect[14..34]);
                expect[24..26].copy_from_slice(&sum.to_be_bytes());
                let total = REPEAT_RUNS / TTL_CHUNK * TTL_CHUNK;
                let (raw, _) = repeated(prog, p, TTL_CHUNK, total, &expect, ring);
                let mut floor = 0.0;
                for _ in 0..total / TTL_CHUNK {
                    floor += ctx_empty(TTL_CHUNK);
                }
                (raw, total, floor / f64::from(total / TTL_CHUNK))
            }
            Method::Single => (
                single_runs(
                    prog,
                    &p.frame,
                    p.ifindex,
                    single_runs_n,
                    Some(p.verdict),
                    |_| {},
                ),
                single_runs_n,
                single_runs(empty, &p.frame, p.ifindex, single_runs_n, None, |_| {}),
            ),
            Method::SingleNewFlow => {
                // At most 20,000 new flows (40,000 entries) per sample: with
                // the 64,000 of the full maps the LRU table (131,072) never
                // evicts; they are removed after the sample.
                let single_runs_n = single_runs_n.min(20_000);
                let raw = single_runs(
                    prog,
                    &p.frame,
                    p.ifindex,
                    single_runs_n,
                    Some(p.verdict),
                    |f| {
                        let dst = NEW_FLOW_BASE | (*next_flow & 0x000f_ffff);
                        *next_flow += 1;
                        f[30..34].copy_from_slice(&dst.to_be_bytes());
                        f[24..26].copy_from_slice(&[0, 0]);
                        let sum = checksum(&f[14..34]);
                        f[24..26].copy_from_slice(&sum.to_be_bytes());
                    },
                );
                (
                    raw,
                    single_runs_n,
                    single_runs(empty, &p.frame, p.ifindex, single_runs_n, None, |_| {}),
                )
            }
        }
    };
    let moved = counter(h, p.counter) - before;
    assert_eq!(
        moved,
        u64::from(runs),
        "{}: counter {} moved {moved} times in {runs} runs (the path changed under repetition)",
        p.name,
        p.counter.name()
    );
    if p.method == Method::SingleNewFlow {
        remove_new_flows(h);
    }
    (raw - floor, raw)
}

/// Runs the benchmark.
pub fn run(opts: &Options) -> Report {
    let single_n: u32 = if opts.secs <= 1 { 5_000 } else { 100_000 };
    let report = Mutex::new(Report {
        name: "per-packet program cost".into(),
        variants: vec!["small maps".into(), "full maps".into(), "live".into()],
        baseline: "small maps".into(),
        ..Default::default()
    });
    let stats_sysctl = std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    let started = Instant::now();
    with_harness(|h| {
        prepare(h);
        let paths = paths(h);
        let empty = crate::pps::load_empty().expect("the empty program");
        let mut ring: RingBuf<MapData> =
            RingBuf::try_from(h.ebpf.take_map("EVENTS").expect("EVENTS map")).expect("ring");
        // The first SNAT packet creates the flow; the timed ones find it.
        let snat = paths
            .iter()
            .find(|p| p.name == "snat_existing_flow")
            .expect("snat path");
        let (v, _) = h.run(snat.prog, &snat.frame, snat.ifindex).expect("snat");
        assert_eq!(v, TC_ACT_REDIRECT, "the first SNAT packet is sent");
        let mut next_flow = 0u32;
        let mut r = report
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for variant in ["small maps", "full maps"] {
            if variant == "full maps" {
                progress("prog-cost: filling the maps (16,000 endpoints, 64,000 NAT entries)");
                fill(h);
            }
            for round in 0..opts.rounds {
                for p in &paths {
                    progress(&format!(
                        "prog-cost: {variant} round {}/{} {:<24} [{:.0}s]",
                        round + 1,
                        opts.rounds,
                        p.name,
                        started.elapsed().as_secs_f64()
                    ));
                    let (net, _raw) = time_path(h, p, &empty, single_n, &mut ring, &mut next_flow);
                    let metric = format!("{}_ns", p.name);
                    r.better.insert(metric.clone(), "lower".into());
                    r.add(&metric, variant, net);
                }
                // The helpers alone.
                let ep_fd = match h.ebpf.map("ENDPOINTS") {
                    Some(aya::maps::Map::HashMap(m)) => {
                        std::os::fd::AsRawFd::as_raw_fd(&std::os::fd::AsFd::as_fd(m.fd()))
                    }
                    _ => panic!("ENDPOINTS is not a hash map"),
                };
                let probes = [
                    probe_hash(),
                    probe_fib(h.uplink.0),
                    probe_adjust_room(),
                    probe_endpoint_lookup(ep_fd, ipv4_key(h.a.ip.octets())),
                ];
                for (i, net) in time_probes(h, &probes, &empty) {
                    r.better.insert(probes[i].metric.into(), "lower".into());
                    r.add(probes[i].metric, variant, net);
                    if round == 0 && variant == "small maps" {
                        r.notes.push(format!(
                            "{}: {}; kernel repeat 10^6 − the empty program's repeat",
                            probes[i].metric, probes[i].what
                        ));
                    }
                }
                // The floors themselves (raw, ns per run).
                let f = &paths[0].frame;
                let ctx = skb_ctx(paths[0].ifindex);
                let mut out = vec![0u8; f.len() + 512];
                let repeat_floor = test_run(&empty, f, &ctx, &mut out, REPEAT_RUNS).1;
                let single_floor = single_runs(&empty, f, paths[0].ifindex, single_n, None, |_| {});
                for (m, v) in [
                    ("empty_prog_repeat_ns", repeat_floor),
                    ("empty_prog_single_run_ns", single_floor),
                ] {
                    r.better.insert(m.into(), "lower".into());
                    r.add(m, variant, v);
                }
            }
        }
        r.notes.push(format!(
            "*_ns (small/full maps): BPF_PROG_TEST_RUN, ns per run net of an empty TC program (r0 = TC_ACT_OK; exit) timed the same way on the same packet; {} rounds; single-run paths: {single_n} runs per sample. empty_prog_*: the floors subtracted (raw). kernel.bpf_stats_enabled was {stats_sysctl:?} during these runs (1 would add the statistics' clock reads to every run)",
            opts.rounds
        ));
        for p in &paths {
            r.notes.push(format!(
                "{}: {} → {} ({}); {}",
                p.name,
                p.prog,
                p.counter.name(),
                match p.verdict {
                    TC_ACT_OK => "TC_ACT_OK",
                    TC_ACT_SHOT => "TC_ACT_SHOT",
                    _ => "TC_ACT_REDIRECT",
                },
                p.method.describe()
            ));
        }
        r.notes.push("every sample checks the path: the verdict, the path's counter moved exactly once per run, and for repeated runs the output packet; drop_spoofed_with_event: one ring-buffer event per run, drained between chunks of 20,000".into());
        r.notes.push("test skbs have the kernel's NET_SKB_PAD (64 bytes) of headroom (net/bpf/test_run.c): VXLAN (50) and IPIP (20) fit; a perf (cpu-clock) profile of encap single runs shows bpf_skb_generic_push and no pskb_expand_head (no reallocation)".into());
        r.notes
            .push("full maps: 16,000 more endpoints, 64,000 NAT entries".into());
    });
    let mut r = report
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    live(opts, &mut r);
    progress(&format!(
        "prog-cost: done in {:.0}s\n",
        started.elapsed().as_secs_f64()
    ));
    r
}

/// Live figures: kernel BPF statistics while iperf3 runs through rivet.
fn live(opts: &Options, r: &mut Report) {
    let secs = opts.secs.max(2);
    progress("prog-cost: live — building a node and a two-node VXLAN cluster");
    let mut same = World::new();
    let n = same.add_node_with_agent();
    let sa = same.add_pod(n);
    let sb = same.add_pod(n);
    let mut cross = World::new();
    let nodes = cross.add_static_cluster(2, "vxlan");
    let ca = cross.add_pod(nodes[0]);
    let cb = cross.add_pod(nodes[1]);
    // The bridge-netfilter setting of every other benchmark (the live
    // figures' namespaces only; BPF_PROG_TEST_RUN crosses no bridge).
    let kernel_at_setup =
        crate::bridge_nf_off(crate::world_spaces(&same).chain(crate::world_spaces(&cross)));
    // Held for the measurement; closing it turns the statistics off.
    let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).expect("BPF_ENABLE_STATS");
    // (metric, world, node, program) read around each transfer.
    type Probe<'a> = (&'static str, &'a World, usize, &'static str);
    let same_probes: [Probe<'_>; 1] = [("samenode_from_pod", &same, n, program_names::FROM_POD)];
    let cross_probes: [Probe<'_>; 4] = [
        (
            "vxlan_sender_from_pod_encap",
            &cross,
            nodes[0],
            program_names::FROM_POD,
        ),
        (
            "vxlan_receiver_from_uplink_decap",
            &cross,
            nodes[1],
            program_names::FROM_UPLINK,
        ),
        (
            "vxlan_receiver_from_pod_acks",
            &cross,
            nodes[1],
            program_names::FROM_POD,
        ),
        (
            "vxlan_sender_from_uplink_acks",
            &cross,
            nodes[0],
            program_names::FROM_UPLINK,
        ),
    ];
    for round in 0..=opts.rounds {
        for (what, probes, client, server, ip) in [
            (
                "same-node",
                &same_probes[..],
                &same.pods[sa].ns,
                &same.pods[sb].ns,
                same.pods[sb].ip,
            ),
            (
                "vxlan",
                &cross_probes[..],
                &cross.pods[ca].ns,
                &cross.pods[cb].ns,
                cross.pods[cb].ip,
            ),
        ] {
            progress(&format!(
                "prog-cost: live {what} round {round}/{}",
                opts.rounds
            ));
            let before: Vec<(u64, u64)> = probes
                .iter()
                .map(|(_, w, node, p)| crate::prog_stats(w, *node, p))
                .collect();
            let t = if round == 0 { 1 } else { secs };
            let srv = iperf3_server(server, 5201, Some(1));
            let res = iperf3_client(client, ip, 5201, t, 1, Some(0));
            drop(srv);
            let after: Vec<(u64, u64)> = probes
                .iter()
                .map(|(_, w, node, p)| crate::prog_stats(w, *node, p))
                .collect();
            if round == 0 {
                continue;
            }
            r.add(
                &format!("live_{}_gbps", what.replace('-', "")),
                "live",
                res.bits_per_second / 1e9,
            );
            for (((name, ..), b), a) in probes.iter().zip(&before).zip(&after) {
                record_live(r, name, *b, *a, t);
            }
        }
    }
    // Small UDP datagrams (no GSO, no GRO): one program run per wire
    // packet, hot caches — the per-packet cost of the forwarding paths as
    // a node runs them, next to the single-run figures above.
    let udp_probes: [Probe<'_>; 2] = [
        ("udp64_samenode_from_pod", &same, n, program_names::FROM_POD),
        (
            "udp64_vxlan_sender_from_pod_encap",
            &cross,
            nodes[0],
            program_names::FROM_POD,
        ),
    ];
    for round in 0..=opts.rounds {
        for (probe, client, server, ip) in [
            (
                &udp_probes[0],
                &same.pods[sa].ns,
                &same.pods[sb].ns,
                same.pods[sb].ip,
            ),
            (
                &udp_probes[1],
                &cross.pods[ca].ns,
                &cross.pods[cb].ns,
                cross.pods[cb].ip,
            ),
        ] {
            progress(&format!(
                "prog-cost: live {} round {round}/{}",
                probe.0, opts.rounds
            ));
            let (name, w, node, p) = *probe;
            let before = crate::prog_stats(w, node, p);
            let t = if round == 0 { 1 } else { secs };
            let srv = iperf3_server(server, 5202, Some(1));
            udp_flood(client, ip, 5202, t);
            drop(srv);
            let after = crate::prog_stats(w, node, p);
            if round == 0 {
                continue;
            }
            record_live(r, name, before, after, t);
        }
    }
    drop(stats);
    r.notes.push(format!(
        "live_udp64_*: the same statistics over iperf3 UDP with 64-byte datagrams at full rate (-u -b 0 -l 64, client CPU 0, {secs} s, {} rounds after a warm-up): no GSO, so ns per run is per wire packet with hot caches (the statistics' two clock reads included); samenode = local redirect, vxlan sender = encapsulation + FIB + redirect",
        opts.rounds
    ));
    r.notes.push(format!(
        "live_*: kernel BPF statistics (BPF_ENABLE_STATS, on only while measuring) over an iperf3 single stream of {secs} s, client CPU 0, server CPU 1, {} rounds after a warm-up: run_time_ns / run_cnt of each program — one run per skb, and a GSO/GRO skb carries up to 64 KB, so ns per run is per skb, not per wire packet; *_runs_per_s gives the skb rate. The statistics add two clock reads per run, inside run_time_ns",
        opts.rounds
    ));
    r.notes.push("live same-node: rivetd, two pods on one node (from_pod sees the data one way and the ACKs the other way, both bpf_redirect_peer); live vxlan: two rivetd nodes (static cluster, vxlan) — sender from_pod encapsulates the data, receiver from_uplink decapsulates it, and the ACKs go the other way".into());
    let kernel_at_end =
        crate::bridge_nf_read(crate::world_spaces(&same).chain(crate::world_spaces(&cross)));
    r.set_kernel_settings(kernel_at_setup, &kernel_at_end);
    drop(cross);
    drop(same);
}

/// Records a program's ns per run and runs per second between two
/// (`run_time_ns`, `run_cnt`) readings `secs` apart.
fn record_live(r: &mut Report, name: &str, before: (u64, u64), after: (u64, u64), secs: u32) {
    crate::record_prog_runs(
        r,
        "live",
        name,
        (before, after),
        &format!("live_{name}_ns_per_run"),
        &format!("live_{name}_runs_per_s"),
        f64::from(secs),
    );
}

/// iperf3 UDP, 64-byte datagrams, unlimited rate, from `client` to
/// `dst:port` for `secs` s; retries while the server is starting.
fn udp_flood(client: &rivet_tests::Netns, dst: Ipv4Addr, port: u16, secs: u32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let (dst, port, secs) = (dst.to_string(), port.to_string(), secs.to_string());
    loop {
        let out = client.output(
            "iperf3",
            &[
                "-c", &dst, "-p", &port, "-u", "-b", "0", "-l", "64", "-t", &secs, "-A", "0", "-J",
            ],
        );
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if json["end"]["sum"]["packets"]
            .as_u64()
            .is_some_and(|p| p > 0)
        {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "iperf3 -u to {dst}:{port} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

// ---------------------------------------------------------------------------
// Helpers alone: what the encap and redirect paths spend in the kernel.

/// One raw eBPF instruction.
const fn insn(op: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    let o = off.to_le_bytes();
    let i = imm.to_le_bytes();
    u64::from_le_bytes([op, dst | (src << 4), o[0], o[1], i[0], i[1], i[2], i[3]])
}
const MOV64_IMM: u8 = 0xb7;
const MOV64_REG: u8 = 0xbf;
const ADD64_IMM: u8 = 0x07;
const ST_DW: u8 = 0x7a;
const ST_W: u8 = 0x62;
const ST_B: u8 = 0x72;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;
const JEQ_IMM: u8 = 0x15;
const LD_IMM64: u8 = 0x18;
/// `BPF_PSEUDO_MAP_FD` in the source register of a 64-bit immediate load.
const PSEUDO_MAP_FD: u8 = 1;
const R0: u8 = 0;
const R1: u8 = 1;
const R2: u8 = 2;
const R3: u8 = 3;
const R4: u8 = 4;
const R6: u8 = 6;
const R10: u8 = 10;
const BPF_FUNC_MAP_LOOKUP_ELEM: i32 = 1;
const BPF_FUNC_GET_HASH_RECALC: i32 = 34;
const BPF_FUNC_SET_HASH_INVALID: i32 = 41;
const BPF_FUNC_SKB_ADJUST_ROOM: i32 = 50;
const BPF_FUNC_FIB_LOOKUP: i32 = 69;

/// `r = imm` for a 64-bit immediate (two instruction slots).
fn ld_imm64(dst: u8, src: u8, imm: u64) -> [u64; 2] {
    [
        insn(LD_IMM64, dst, src, 0, imm as u32 as i32),
        insn(0, 0, 0, 0, (imm >> 32) as u32 as i32),
    ]
}

/// A helper probe: a raw program that calls one helper the way rivet does
/// (same arguments, same flags) and returns 0 when it succeeded.
struct Probe {
    metric: &'static str,
    what: &'static str,
    insns: Vec<u64>,
}

/// `bpf_set_hash_invalid` then `bpf_get_hash_recalc`: the flow dissector
/// on every run (the hash is cleared first, as a test skb's is).
fn probe_hash() -> Probe {
    Probe {
        metric: "helper_get_hash_recalc_ns",
        what: "bpf_set_hash_invalid + bpf_get_hash_recalc (the flow dissector; what encap called before it used skb->hash or its own hash)",
        insns: vec![
            insn(MOV64_REG, R6, R1, 0, 0),
            insn(CALL, 0, 0, 0, BPF_FUNC_SET_HASH_INVALID),
            insn(MOV64_REG, R1, R6, 0, 0),
            insn(CALL, 0, 0, 0, BPF_FUNC_GET_HASH_RECALC),
            insn(MOV64_IMM, R0, 0, 0, 0),
            insn(EXIT, 0, 0, 0, 0),
        ],
    }
}

/// `bpf_fib_lookup` as `fib::lookup` makes it (node → peer, output
/// lookup on the uplink); returns the lookup's code (0: success).
fn probe_fib(uplink: u32) -> Probe {
    let src = ipv4_key(NODE_IP.octets()) as i32;
    let dst = ipv4_key(PEER_IP.octets()) as i32;
    let mut insns = vec![insn(MOV64_REG, R6, R1, 0, 0)];
    for w in 0..8 {
        insns.push(insn(ST_DW, R10, 0, -64 + 8 * w, 0));
    }
    insns.extend([
        insn(ST_B, R10, 0, -64, 2),
        insn(ST_W, R10, 0, -64 + 8, uplink as i32),
        insn(ST_W, R10, 0, -64 + 16, src),
        insn(ST_W, R10, 0, -64 + 32, dst),
        insn(MOV64_REG, R1, R6, 0, 0),
        insn(MOV64_REG, R2, R10, 0, 0),
        insn(ADD64_IMM, R2, 0, 0, -64),
        insn(MOV64_IMM, R3, 0, 0, 64),
        // BPF_FIB_LOOKUP_OUTPUT
        insn(MOV64_IMM, R4, 0, 0, 2),
        insn(CALL, 0, 0, 0, BPF_FUNC_FIB_LOOKUP),
        insn(EXIT, 0, 0, 0, 0),
    ]);
    Probe {
        metric: "helper_fib_lookup_ns",
        what: "bpf_fib_lookup (BPF_FIB_LOOKUP_OUTPUT, node → peer on the uplink, neighbour resolved)",
        insns,
    }
}

/// `bpf_skb_adjust_room` +50 then −50 with the decap flags: the packet
/// ends as it began, so `repeat` applies.
fn probe_adjust_room() -> Probe {
    // FIXED_GSO only: with the ENCAP_* flags the skb stays marked
    // encapsulated after the shrink and the next run's grow fails
    // (-EALREADY). On a packet without GSO those flags only record the
    // inner header offsets.
    let encap: u64 = 1;
    // FIXED_GSO | DECAP_L3_IPV4
    let decap: u64 = 1 | 128;
    let mut insns = vec![
        insn(MOV64_REG, R6, R1, 0, 0),
        insn(MOV64_IMM, R2, 0, 0, 50),
        // BPF_ADJ_ROOM_MAC
        insn(MOV64_IMM, R3, 0, 0, 1),
    ];
    insns.extend(ld_imm64(R4, 0, encap));
    insns.extend([
        insn(CALL, 0, 0, 0, BPF_FUNC_SKB_ADJUST_ROOM),
        insn(JEQ_IMM, R0, 0, 1, 0),
        insn(EXIT, 0, 0, 0, 0),
        insn(MOV64_REG, R1, R6, 0, 0),
        insn(MOV64_IMM, R2, 0, 0, -50),
        insn(MOV64_IMM, R3, 0, 0, 1),
    ]);
    insns.extend(ld_imm64(R4, 0, decap));
    insns.extend([
        insn(CALL, 0, 0, 0, BPF_FUNC_SKB_ADJUST_ROOM),
        insn(EXIT, 0, 0, 0, 0),
    ]);
    Probe {
        metric: "helper_adjust_room_pair_ns",
        what: "bpf_skb_adjust_room +50 (FIXED_GSO) then −50 (FIXED_GSO | DECAP_L3_IPV4): the grow and shrink of one VXLAN encap/decap, in headroom (without the ENCAP_* flags, which on a packet without GSO only record inner header offsets: with them the skb stays marked encapsulated and the next run's grow fails)",
        insns,
    }
}

/// One `bpf_map_lookup_elem` in ENDPOINTS that finds pod A.
fn probe_endpoint_lookup(map_fd: i32, key: u32) -> Probe {
    let mut insns = vec![insn(ST_W, R10, 0, -8, key as i32)];
    insns.extend(ld_imm64(R1, PSEUDO_MAP_FD, map_fd as u32 as u64));
    insns.extend([
        insn(MOV64_REG, R2, R10, 0, 0),
        insn(ADD64_IMM, R2, 0, 0, -8),
        insn(CALL, 0, 0, 0, BPF_FUNC_MAP_LOOKUP_ELEM),
        // found: 0, not found: 2
        insn(JEQ_IMM, R0, 0, 2, 0),
        insn(MOV64_IMM, R0, 0, 0, 0),
        insn(EXIT, 0, 0, 0, 0),
        insn(MOV64_IMM, R0, 0, 0, 2),
        insn(EXIT, 0, 0, 0, 0),
    ]);
    Probe {
        metric: "helper_endpoint_lookup_ns",
        what: "one bpf_map_lookup_elem hit in ENDPOINTS (hash); the local redirect does two, encap two and PEERS one",
        insns,
    }
}

/// Times the probes with `repeat` on the encap path's packet, net of the
/// empty program's `repeat` on the same packet; checks every probe
/// returned 0 and left the packet as it was.
fn time_probes(h: &Harness, probes: &[Probe], empty: &SchedClassifier) -> Vec<(usize, f64)> {
    let a = h.a;
    let frame = h.ip_frame(a, &Ipv4::new(a.ip, REMOTE_POD));
    let ctx = skb_ctx(a.host_ifindex);
    let mut out = vec![0u8; frame.len() + 512];
    let floor = test_run(empty, &frame, &ctx, &mut out, REPEAT_RUNS).1;
    probes
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let prog = crate::pps::load_insns("bench_probe", &p.insns)
                .unwrap_or_else(|e| panic!("{}: {e}", p.metric));
            let (v, ns, len) = test_run(&prog, &frame, &ctx, &mut out, REPEAT_RUNS);
            assert_eq!(v, 0, "{}: the helper failed ({v})", p.metric);
            assert_eq!(&out[..len], &frame[..], "{}: packet changed", p.metric);
            (i, ns - floor)
        })
        .collect()
}
