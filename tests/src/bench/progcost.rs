//! Per-packet program cost: each program's main paths run with
//! BPF_PROG_TEST_RUN on a crafted packet with the maps filled, timed by the
//! kernel (mean of N single runs, each on a fresh copy of the packet — the
//! programs rewrite packets, so the kernel's own `repeat` would time a
//! packet that changes under it). An ARP frame passing the uplink is the
//! floor: the cost of a single timed run plus the shortest path. The same
//! paths are timed again with the maps at their working sizes (16,000
//! endpoints, 64,000 NAT entries) to show lookups do not grow.

use std::{net::Ipv4Addr, sync::Mutex};

use aya::maps::{HashMap, MapData};
use rivet_common::{
    EndpointInfo, EndpointKey, NatEntry, NatKey, endpoint_flags, ipv4_key, nat_dir, program_names,
    route_mode,
};

use super::{Options, Report, progress};
use crate::{
    packet::{ETH_P_ARP, Ipv4, arp, eth, frame},
    progtest::{GATEWAY, Harness, NODE_IP, PEER_IP, with_harness},
};

const REMOTE_POD: Ipv4Addr = Ipv4Addr::new(10, 9, 2, 7);
const OUTSIDE: Ipv4Addr = Ipv4Addr::new(192, 168, 9, 20);

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

/// The paths: (name, program, frame, ingress ifindex).
fn paths(h: &mut Harness) -> Vec<(&'static str, &'static str, Vec<u8>, u32)> {
    let (a, b) = (h.a, h.b);
    h.route_to_peer(route_mode::VXLAN);
    let uplink = h.uplink.0;
    let from_outside = |h: &Harness, ip: &Ipv4| {
        frame(&[
            &eth(
                h.uplink.1,
                crate::progtest::PEER_MAC,
                crate::packet::ETH_P_IP,
            ),
            &ip.bytes(),
        ])
    };
    vec![
        (
            "floor_uplink_pass",
            program_names::FROM_UPLINK,
            frame(&[
                &eth([0xff; 6], crate::progtest::PEER_MAC, ETH_P_ARP),
                &arp(1, crate::progtest::PEER_MAC, PEER_IP, [0; 6], NODE_IP),
            ]),
            uplink,
        ),
        (
            "drop_spoofed_with_event",
            program_names::FROM_POD,
            h.ip_frame(a, &Ipv4::new(Ipv4Addr::new(10, 9, 1, 99), b.ip)),
            a.host_ifindex,
        ),
        (
            "local_redirect",
            program_names::FROM_POD,
            h.ip_frame(a, &Ipv4::new(a.ip, b.ip)),
            a.host_ifindex,
        ),
        (
            "arp_reply",
            program_names::FROM_POD,
            frame(&[
                &eth([0xff; 6], a.mac, ETH_P_ARP),
                &arp(1, a.mac, a.ip, [0; 6], GATEWAY),
            ]),
            a.host_ifindex,
        ),
        (
            "encap_vxlan",
            program_names::FROM_POD,
            h.ip_frame(a, &Ipv4::new(a.ip, REMOTE_POD)),
            a.host_ifindex,
        ),
        (
            "decap_vxlan",
            program_names::FROM_UPLINK,
            h.vxlan_frame(
                PEER_IP,
                crate::progtest::VNI,
                crate::progtest::VXLAN_PORT,
                &Ipv4::new(REMOTE_POD, b.ip).bytes(),
            ),
            uplink,
        ),
        (
            "decap_ipip",
            program_names::FROM_UPLINK,
            h.ipip_frame(PEER_IP, &Ipv4::new(REMOTE_POD, b.ip).bytes()),
            uplink,
        ),
        (
            "snat_existing_flow",
            program_names::FROM_POD,
            h.ip_frame(a, &tcp(a.ip, OUTSIDE, 40_000, 443)),
            a.host_ifindex,
        ),
        (
            "dnat_hit",
            program_names::FROM_UPLINK,
            from_outside(h, &tcp(OUTSIDE, NODE_IP, 50_000, 8080)),
            uplink,
        ),
        (
            "dnat_miss_pass",
            program_names::FROM_UPLINK,
            from_outside(h, &tcp(OUTSIDE, NODE_IP, 50_000, 8081)),
            uplink,
        ),
    ]
}

/// Masquerade on, a hostPort 8080 → pod A:80.
fn prepare(h: &mut Harness) {
    h.enable_nat(61_000, 65_535);
    let a = h.a;
    h.put_hostport(8080, a, 80);
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

/// Runs the benchmark.
pub fn run(opts: &Options) -> Report {
    let runs: u32 = if opts.secs <= 1 { 5_000 } else { 100_000 };
    let report = Mutex::new(Report {
        name: "per-packet program cost".into(),
        variants: vec!["small maps".into(), "full maps".into()],
        baseline: "small maps".into(),
        ..Default::default()
    });
    let started = std::time::Instant::now();
    with_harness(|h| {
        prepare(h);
        let paths = paths(h);
        // The first SNAT packet creates the flow; the timed ones find it.
        let snat = paths
            .iter()
            .find(|p| p.0 == "snat_existing_flow")
            .expect("snat path");
        let _ = h.run(snat.1, &snat.2, snat.3);
        let mut r = report
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for variant in ["small maps", "full maps"] {
            if variant == "full maps" {
                progress("prog-cost: filling the maps (16,000 endpoints, 64,000 NAT entries)");
                fill(h);
            }
            for round in 0..opts.rounds {
                for (name, prog, data, ifindex) in &paths {
                    progress(&format!(
                        "prog-cost: {variant} round {}/{} {name:<20} [{:.0}s]",
                        round + 1,
                        opts.rounds,
                        started.elapsed().as_secs_f64()
                    ));
                    let ns = h.time(prog, data, *ifindex, runs);
                    let metric = format!("{name}_ns");
                    r.better.insert(metric.clone(), "lower".into());
                    r.add(&metric, variant, ns);
                }
            }
        }
        r.notes.push(format!(
            "mean in-kernel duration of {runs} single BPF_PROG_TEST_RUN runs per sample, {} rounds; floor_uplink_pass is the floor (one timed test_run + the shortest path); drop_spoofed_with_event includes the drop event written to the ring buffer",
            opts.rounds
        ));
        r.notes
            .push("full maps: 16,000 more endpoints, 64,000 NAT entries".into());
    });
    progress(&format!(
        "prog-cost: done in {:.0}s\n",
        started.elapsed().as_secs_f64()
    ));
    report
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
