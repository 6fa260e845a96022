//! Per-packet tests of the bandwidth datapath with BPF_PROG_TEST_RUN: the
//! egress check behind a pod's qdisc (`from_pod`, the GCRA in `BANDWIDTH`)
//! and the delivery to a pod with an ingress limit. The `BANDWIDTH` entry
//! and the endpoint flags are written by hand as the agent writes them.
//!
//! The buckets are slow on purpose (1,000 bytes/s): a test run takes
//! microseconds, so the bucket refills nothing between packets.

use aya::maps::{HashMap, MapData};
use rivet_common::{
    Bucket, Counter, PodBandwidth, bandwidth_dir, endpoint_flags, map_names, program_names,
};
use rivet_tests::{
    packet::{IPPROTO_UDP, ipv4, udp},
    progtest::*,
};

const FROM_POD: &str = program_names::FROM_POD;
/// Bytes per second of the test buckets.
const RATE: u64 = 1_000;

fn put_limits(h: &mut Harness, pod: PodSide, egress_depth_bytes: u64, ingress: bool) {
    let mut pod_bw = PodBandwidth::default();
    pod_bw.buckets[bandwidth_dir::EGRESS] = Bucket {
        rate: RATE,
        depth_ns: egress_depth_bytes * 1_000_000_000 / RATE,
        ..Bucket::default()
    };
    if ingress {
        pod_bw.buckets[bandwidth_dir::INGRESS] = Bucket {
            rate: RATE,
            depth_ns: 1_000_000_000,
            ..Bucket::default()
        };
    }
    let mut map: HashMap<&mut MapData, u32, PodBandwidth> =
        HashMap::try_from(h.ebpf.map_mut(map_names::BANDWIDTH).expect("map")).expect("hash");
    map.insert(pod.host_ifindex, pod_bw, 0)
        .expect("bandwidth entry");
}

fn bucket(h: &Harness, pod: PodSide, dir: usize) -> Bucket {
    let map: HashMap<&MapData, u32, PodBandwidth> =
        HashMap::try_from(h.ebpf.map(map_names::BANDWIDTH).expect("map")).expect("hash");
    map.get(&pod.host_ifindex, 0).expect("entry").buckets[dir]
}

/// A 1,000-byte datagram from `from` to `to` as `from` sends it.
fn datagram(h: &Harness, from: PodSide, to: PodSide) -> Vec<u8> {
    let l4 = udp(40_000, 9_000, &[0u8; 958]);
    h.pod_frame(from, &ipv4(from.ip, to.ip, IPPROTO_UDP, l4))
}

#[test]
fn egress_beyond_the_bucket_is_dropped_and_counted() {
    with_harness(|h| {
        let (a, b) = (h.a, h.b);
        // Depth: two frames' worth (a frame is 1,000 bytes: 14 + 20 + 8 + 958).
        put_limits(h, a, 2_000, false);
        h.put_endpoint_flags(a, endpoint_flags::READY | endpoint_flags::BANDWIDTH_EGRESS);
        let frame = datagram(h, a, b);
        assert_eq!(frame.len(), 1_000);
        // The first finds no debt, the second fits the depth; the third
        // would take the debt beyond it.
        for _ in 0..2 {
            h.expect(
                FROM_POD,
                &frame,
                a.host_ifindex,
                TC_ACT_REDIRECT,
                Counter::FwdLocal,
            );
        }
        h.expect(
            FROM_POD,
            &frame,
            a.host_ifindex,
            TC_ACT_SHOT,
            Counter::DropBandwidth,
        );
        let got = bucket(h, a, bandwidth_dir::EGRESS);
        assert_eq!(got.passed_bytes, 2_000, "{got:?}");
        assert_eq!(
            (got.dropped_packets, got.dropped_bytes),
            (1, 1_000),
            "{got:?}"
        );
        // The debt is two frames' cost (1 s each at 1,000 bytes/s) ahead.
        assert!(got.tat > 0, "{got:?}");
        // The other pod is not held to it.
        h.expect(
            FROM_POD,
            &datagram(h, b, a),
            b.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::FwdLocal,
        );
    });
}

#[test]
fn without_its_flag_a_pod_is_not_charged() {
    with_harness(|h| {
        let (a, b) = (h.a, h.b);
        put_limits(h, a, 1_000, false);
        h.put_endpoint_flags(a, endpoint_flags::READY);
        let frame = datagram(h, a, b);
        for _ in 0..5 {
            h.expect(
                FROM_POD,
                &frame,
                a.host_ifindex,
                TC_ACT_REDIRECT,
                Counter::FwdLocal,
            );
        }
        assert_eq!(bucket(h, a, bandwidth_dir::EGRESS).passed_bytes, 0);
    });
}

#[test]
fn a_pod_with_an_ingress_limit_is_delivered_not_policed() {
    with_harness(|h| {
        let (a, b) = (h.a, h.b);
        // B has an ingress limit: its qdisc shapes; the datapath delivers
        // every packet (through the host veth's egress) and charges none.
        put_limits(h, b, 0, true);
        h.put_endpoint_flags(b, endpoint_flags::READY | endpoint_flags::BANDWIDTH_INGRESS);
        let frame = datagram(h, a, b);
        for _ in 0..5 {
            h.expect(
                FROM_POD,
                &frame,
                a.host_ifindex,
                TC_ACT_REDIRECT,
                Counter::FwdLocal,
            );
        }
        let got = bucket(h, b, bandwidth_dir::INGRESS);
        assert_eq!((got.passed_bytes, got.dropped_packets), (0, 0), "{got:?}");
    });
}
