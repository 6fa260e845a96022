//! Per-packet tests of the Service datapath with BPF_PROG_TEST_RUN: the
//! frontends, backend groups and affinity written into the maps by hand as
//! the agent writes them, real frames run through `from_uplink` (a client
//! outside reaching a NodePort or an external IP) and `from_pod` (the
//! backend answering).
//!
//! Checked each time: the verdict and the one counter that moves, the
//! rewritten frame byte for byte against a reference built here (fields
//! changed, then both checksums recomputed from scratch — never by the
//! datapath's incremental arithmetic), the `NAT` entries of the flow (the
//! client's tuple → the backend chosen, the reply tuple → the frontend),
//! the per-Service counters and the affinity records.
//!
//! The client is the uplink's permanent neighbour (192.168.9.20); the
//! backends are the harness's pods A (10.9.1.2) and B (10.9.1.3), their
//! endpoint entries carrying `SERVICE` as the agent marks Service backends.

use std::{collections::BTreeSet, net::Ipv4Addr};

use aya::maps::{Array, HashMap, MapData, PerCpuArray};
use rivet_common::{
    AFFINITY_BY_ADDR, Counter, NatEntry, NatKey, SvcAffinity, SvcAffinityKey, SvcBackend,
    SvcBackendKey, SvcCounters, SvcInfo, SvcKey, endpoint_flags, ipv4_key, nat_dir, nat_flags,
    nat_stat, program_names, svc_flags, svc_scope,
};
use rivet_tests::{
    packet::{
        ETH_P_IP, IP_DF, IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_UDP, Ipv4, Tcp, be16, checksum, eth,
        frame, icmp, ipv4, ipv4_checksum_ok, l4_checksum, l4_checksum_ok, quote, udp,
        udp_checksummed,
    },
    progtest::*,
};

/// The client outside the cluster (the uplink's permanent neighbour).
const CLIENT: Ipv4Addr = PEER_IP;
/// The NodePort of the tests.
const NODE_PORT: u16 = 30_080;
/// The backends' port.
const TARGET_PORT: u16 = 8080;
/// An external IP of a Service (not an address of the node).
const EXTERNAL_IP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 50);
/// A backend address that is no endpoint of this node, in no routed subnet.
const NOT_LOCAL: Ipv4Addr = Ipv4Addr::new(10, 77, 3, 4);
const TCP_SYN: u8 = 0x02;
const TCP_ACK: u8 = 0x10;
const TCP_SYN_ACK: u8 = 0x12;

// --- maps, as the agent writes them -------------------------------------------

/// The NodePort frontend `port`/`proto` (address 0: every node address)
/// seen from outside.
fn nodeport_key(port: u16, proto: u8) -> SvcKey {
    frontend_key(Ipv4Addr::UNSPECIFIED, port, proto)
}

/// The frontend `addr:port`/`proto` in scope `EXTERNAL`.
fn frontend_key(addr: Ipv4Addr, port: u16, proto: u8) -> SvcKey {
    SvcKey {
        addr: ipv4_key(addr.octets()),
        port: port.to_be(),
        proto,
        scope: svc_scope::EXTERNAL,
    }
}

/// The marker entry of an address holding external frontends.
fn marker_key(addr: Ipv4Addr) -> SvcKey {
    SvcKey {
        addr: ipv4_key(addr.octets()),
        port: 0,
        proto: 0,
        scope: svc_scope::EXTERNAL,
    }
}

fn info(id: u32, group: u32, count: u32, flags: u32) -> SvcInfo {
    SvcInfo {
        id,
        group,
        count,
        flags,
        ..SvcInfo::default()
    }
}

fn put_frontend(h: &mut Harness, key: SvcKey, info: SvcInfo) {
    let mut map: HashMap<&mut MapData, SvcKey, SvcInfo> =
        HashMap::try_from(h.ebpf.map_mut("SVC_FRONTENDS").expect("map")).expect("hash");
    map.insert(key, info, 0).expect("frontend");
}

fn remove_frontend(h: &mut Harness, key: SvcKey) {
    let mut map: HashMap<&mut MapData, SvcKey, SvcInfo> =
        HashMap::try_from(h.ebpf.map_mut("SVC_FRONTENDS").expect("map")).expect("hash");
    map.remove(&key).expect("frontend removed");
}

fn backend(addr: Ipv4Addr, port: u16) -> SvcBackend {
    SvcBackend {
        addr: ipv4_key(addr.octets()),
        port: port.to_be(),
        _pad: 0,
    }
}

/// Backend group `group`: slot `i` holds `backends[i]`.
fn put_group(h: &mut Harness, group: u32, backends: &[(Ipv4Addr, u16)]) {
    let mut map: HashMap<&mut MapData, SvcBackendKey, SvcBackend> =
        HashMap::try_from(h.ebpf.map_mut("SVC_BACKENDS").expect("map")).expect("hash");
    for (slot, &(addr, port)) in backends.iter().enumerate() {
        let key = SvcBackendKey {
            group,
            slot: slot as u32,
        };
        map.insert(key, backend(addr, port), 0).expect("backend");
    }
}

fn remove_group(h: &mut Harness, group: u32, count: u32) {
    let mut map: HashMap<&mut MapData, SvcBackendKey, SvcBackend> =
        HashMap::try_from(h.ebpf.map_mut("SVC_BACKENDS").expect("map")).expect("hash");
    for slot in 0..count {
        map.remove(&SvcBackendKey { group, slot })
            .expect("backend removed");
    }
}

/// Pods A and B as Service backends (their entries flagged `SERVICE`).
fn mark_backends(h: &mut Harness) {
    for p in [h.a, h.b] {
        h.put_endpoint_flags(p, endpoint_flags::READY | endpoint_flags::SERVICE);
    }
}

fn svc_stats(h: &Harness, id: u32) -> SvcCounters {
    let map: Array<&MapData, SvcCounters> =
        Array::try_from(h.ebpf.map("SVC_STATS").expect("map")).expect("array");
    map.get(&id, 0).expect("svc stats")
}

fn nat_created(h: &Harness) -> u64 {
    let map: PerCpuArray<&MapData, u64> =
        PerCpuArray::try_from(h.ebpf.map("NAT_STATS").expect("map")).expect("percpu");
    map.get(&nat_stat::CREATED, 0)
        .expect("nat stats")
        .iter()
        .sum()
}

fn nat_entries(h: &Harness) -> Vec<(NatKey, NatEntry)> {
    let map: HashMap<&MapData, NatKey, NatEntry> =
        HashMap::try_from(h.ebpf.map("NAT").expect("map")).expect("hash");
    let mut all: Vec<_> = map.iter().filter_map(Result::ok).collect();
    all.sort_by_key(|(k, _)| (k.dir, k.src, k.dst, k.sport, k.dport, k.proto));
    all
}

fn nat_get(h: &Harness, key: &NatKey) -> Option<NatEntry> {
    let map: HashMap<&MapData, NatKey, NatEntry> =
        HashMap::try_from(h.ebpf.map("NAT").expect("map")).expect("hash");
    map.get(key, 0).ok()
}

/// The client's tuple of a flow to `frontend`: the key of its backend.
fn svc_flow_key(client: (Ipv4Addr, u16), frontend: (Ipv4Addr, u16), proto: u8) -> NatKey {
    NatKey::new(
        ipv4_key(client.0.octets()),
        ipv4_key(frontend.0.octets()),
        (client.1.to_be(), frontend.1.to_be()),
        proto,
        nat_dir::SVC,
    )
}

/// The backend's tuple of a flow from `client`: the key of its frontend.
fn dnat_key(backend: (Ipv4Addr, u16), client: (Ipv4Addr, u16), proto: u8) -> NatKey {
    NatKey::new(
        ipv4_key(backend.0.octets()),
        ipv4_key(client.0.octets()),
        (backend.1.to_be(), client.1.to_be()),
        proto,
        nat_dir::DNAT,
    )
}

/// The affinity key of a client address for Service port `id`.
fn affinity_key(client: Ipv4Addr, id: u32) -> SvcAffinityKey {
    SvcAffinityKey {
        client: AFFINITY_BY_ADDR | u64::from(ipv4_key(client.octets())),
        id,
        _pad: 0,
    }
}

fn affinity(h: &Harness, key: SvcAffinityKey) -> Option<SvcAffinity> {
    let map: HashMap<&MapData, SvcAffinityKey, SvcAffinity> =
        HashMap::try_from(h.ebpf.map("SVC_AFFINITY").expect("map")).expect("hash");
    map.get(&key, 0).ok()
}

fn put_affinity(h: &mut Harness, key: SvcAffinityKey, value: SvcAffinity) {
    let mut map: HashMap<&mut MapData, SvcAffinityKey, SvcAffinity> =
        HashMap::try_from(h.ebpf.map_mut("SVC_AFFINITY").expect("map")).expect("hash");
    map.insert(key, value, 0).expect("affinity");
}

// --- frames ---------------------------------------------------------------------

/// An IPv4 packet with a TCP segment (sequence number 1000, acknowledging
/// 77 when ACK is set, window 65535), checksums right.
fn tcp(src: (Ipv4Addr, u16), dst: (Ipv4Addr, u16), flags: u8, payload: &[u8]) -> Vec<u8> {
    let seg = Tcp {
        seq: 1000,
        ack: if flags & TCP_ACK != 0 { 77 } else { 0 },
        window: 0xffff,
        payload: payload.to_vec(),
        ..Tcp::new(src.1, dst.1, flags)
    };
    ipv4(src.0, dst.0, IPPROTO_TCP, seg.checksummed(src.0, dst.0))
}

/// A TCP segment from the client as it arrives at the uplink.
fn client_tcp(h: &Harness, sport: u16, to: (Ipv4Addr, u16), flags: u8, payload: &[u8]) -> Vec<u8> {
    h.peer_frame(&tcp((CLIENT, sport), to, flags, payload))
}

fn addr_at(f: &[u8], off: usize) -> Ipv4Addr {
    Ipv4Addr::new(f[off], f[off + 1], f[off + 2], f[off + 3])
}

/// The reference for a translated frame: `input`'s IPv4 packet (20-byte
/// header) with `src` and/or `dst` (address, port) replaced, TTL − 1,
/// behind the Ethernet header `eth_hdr`; the IPv4 checksum and the TCP/UDP
/// checksum recomputed over the whole packet (a UDP checksum of 0, "none",
/// stays 0).
fn translated(
    input: &[u8],
    eth_hdr: Vec<u8>,
    src: Option<(Ipv4Addr, u16)>,
    dst: Option<(Ipv4Addr, u16)>,
) -> Vec<u8> {
    let mut l3 = input[14..].to_vec();
    assert_eq!(l3[0], 0x45, "references are built for 20-byte headers");
    l3[8] -= 1;
    if let Some((a, p)) = src {
        l3[12..16].copy_from_slice(&a.octets());
        l3[20..22].copy_from_slice(&p.to_be_bytes());
    }
    if let Some((a, p)) = dst {
        l3[16..20].copy_from_slice(&a.octets());
        l3[22..24].copy_from_slice(&p.to_be_bytes());
    }
    l3[10..12].copy_from_slice(&[0, 0]);
    let c = checksum(&l3[..20]);
    l3[10..12].copy_from_slice(&c.to_be_bytes());
    let (s, d, proto) = (addr_at(&l3, 12), addr_at(&l3, 16), l3[9]);
    let csum = match proto {
        IPPROTO_TCP => 20 + 16,
        IPPROTO_UDP => 20 + 6,
        other => panic!("no reference for protocol {other}"),
    };
    let none = proto == IPPROTO_UDP && l3[csum..csum + 2] == [0, 0];
    if !none {
        l3[csum..csum + 2].copy_from_slice(&[0, 0]);
        let mut c = l4_checksum(s, d, proto, &l3[20..]);
        if proto == IPPROTO_UDP && c == 0 {
            c = 0xffff;
        }
        l3[csum..csum + 2].copy_from_slice(&c.to_be_bytes());
    }
    frame(&[&eth_hdr, &l3])
}

/// Checks a frame delivered to backend `pod` at `port`: every byte as the
/// reference has it (client kept as source, destination the backend, TTL −
/// 1, the pod's MACs), both checksums verified by recomputation.
fn assert_to_backend(out: &[u8], input: &[u8], pod: PodSide, port: u16) {
    assert_eq!(&out[0..6], &pod.mac, "to the backend pod's MAC");
    assert_eq!(&out[6..12], &pod.host_mac, "from its host veth");
    assert_eq!(addr_at(out, 26), addr_at(input, 26), "source kept");
    assert_eq!(be16(&out[34..36]), be16(&input[34..36]), "source port kept");
    assert_eq!(addr_at(out, 30), pod.ip, "destination = backend");
    assert_eq!(be16(&out[36..38]), port, "destination port = backend's");
    assert_eq!(out[22], input[22] - 1, "TTL − 1");
    assert!(ipv4_checksum_ok(out, 14), "IPv4 checksum");
    assert!(l4_checksum_ok(out, 14), "transport checksum");
    let want = translated(
        input,
        eth(pod.mac, pod.host_mac, ETH_P_IP),
        None,
        Some((pod.ip, port)),
    );
    assert_eq!(out, want.as_slice(), "the frame as translated");
}

/// Checks a backend's answer leaving toward the client as `from`.
fn assert_to_client(h: &Harness, out: &[u8], input: &[u8], from: (Ipv4Addr, u16)) {
    assert_eq!(&out[0..6], &PEER_MAC, "to the client's MAC");
    assert_eq!(&out[6..12], &h.uplink.1, "from the uplink");
    assert_eq!(addr_at(out, 26), from.0, "source = frontend address");
    assert_eq!(be16(&out[34..36]), from.1, "source port = frontend port");
    assert_eq!(addr_at(out, 30), addr_at(input, 30), "destination kept");
    assert_eq!(be16(&out[36..38]), be16(&input[36..38]), "client port kept");
    assert_eq!(out[22], input[22] - 1, "TTL − 1");
    assert!(ipv4_checksum_ok(out, 14), "IPv4 checksum");
    assert!(l4_checksum_ok(out, 14), "transport checksum");
    let want = translated(input, eth(PEER_MAC, h.uplink.1, ETH_P_IP), Some(from), None);
    assert_eq!(out, want.as_slice(), "the answer as translated");
}

fn pod_of(h: &Harness, addr: Ipv4Addr) -> PodSide {
    [h.a, h.b]
        .into_iter()
        .find(|p| p.ip == addr)
        .unwrap_or_else(|| panic!("{addr} is no pod of the harness"))
}

/// Runs a client's TCP segment to the frontend through `from_uplink`,
/// expects it forwarded to a backend (`fwd_svc`), checks the frame against
/// the backend the flow's `NAT` entry names and returns that backend.
fn forward(
    h: &Harness,
    sport: u16,
    frontend: (Ipv4Addr, u16),
    flags: u8,
    payload: &[u8],
) -> (Ipv4Addr, u16) {
    let input = client_tcp(h, sport, frontend, flags, payload);
    let out = h.expect(
        program_names::FROM_UPLINK,
        &input,
        h.uplink.0,
        TC_ACT_REDIRECT,
        Counter::FwdSvc,
    );
    let held = nat_get(h, &svc_flow_key((CLIENT, sport), frontend, IPPROTO_TCP))
        .expect("the flow's backend is recorded");
    let chosen = (
        Ipv4Addr::from(rivet_common::ipv4_from_key(held.addr)),
        u16::from_be(held.port),
    );
    assert_to_backend(&out, &input, pod_of(h, chosen.0), chosen.1);
    chosen
}

// --- the tests -------------------------------------------------------------------

#[test]
fn nodeport_syn_goes_to_the_local_backend_and_the_flow_is_recorded() {
    with_harness(|h| {
        mark_backends(h);
        let b = h.b;
        put_group(h, 1, &[(b.ip, TARGET_PORT)]);
        put_frontend(
            h,
            nodeport_key(NODE_PORT, IPPROTO_TCP),
            info(7, 1, 1, svc_flags::NODEPORT),
        );
        let syn = client_tcp(h, 40_000, (NODE_IP, NODE_PORT), TCP_SYN, b"");
        let t0 = rivet::nat::monotonic_ns();
        let out = h.expect(
            program_names::FROM_UPLINK,
            &syn,
            h.uplink.0,
            TC_ACT_REDIRECT,
            Counter::FwdSvc,
        );
        assert_to_backend(&out, &syn, b, TARGET_PORT);
        assert_eq!(out[47], TCP_SYN, "flags untouched");
        assert_eq!(&out[38..42], &1000u32.to_be_bytes(), "sequence untouched");

        let entries = nat_entries(h);
        assert_eq!(
            entries.len(),
            2,
            "the backend choice and the reply tuple: {entries:?}"
        );
        let svc = svc_flow_key((CLIENT, 40_000), (NODE_IP, NODE_PORT), IPPROTO_TCP);
        let e = nat_get(h, &svc).expect("the client's tuple → its backend");
        assert_eq!(
            (e.addr, e.port, e.flags, e.ts_delta),
            (
                ipv4_key(b.ip.octets()),
                TARGET_PORT.to_be(),
                nat_flags::SYN,
                0
            ),
            "→ the backend"
        );
        assert!(e.last_seen >= t0, "stamped now");
        let reply = dnat_key((b.ip, TARGET_PORT), (CLIENT, 40_000), IPPROTO_TCP);
        let e = nat_get(h, &reply).expect("the reply tuple → the frontend");
        assert_eq!(
            (e.addr, e.port, e.flags, e.ts_delta),
            (
                ipv4_key(NODE_IP.octets()),
                NODE_PORT.to_be(),
                nat_flags::SYN,
                0
            ),
            "→ the frontend"
        );
        assert!(e.last_seen >= t0, "stamped now");
        assert_eq!(nat_created(h), 2, "two entries created");
        assert_eq!(
            svc_stats(h, 7),
            SvcCounters {
                flows: 1,
                ..SvcCounters::default()
            }
        );
    });
}

#[test]
fn a_flow_keeps_its_backend_and_new_flows_follow_a_new_group() {
    with_harness(|h| {
        mark_backends(h);
        let (a, b) = (h.a, h.b);
        put_group(h, 1, &[(a.ip, TARGET_PORT), (b.ip, TARGET_PORT)]);
        let np = nodeport_key(NODE_PORT, IPPROTO_TCP);
        put_frontend(h, np, info(3, 1, 2, svc_flags::NODEPORT));
        let frontend = (NODE_IP, NODE_PORT);

        let first = forward(h, 41_000, frontend, TCP_SYN, b"");
        assert!(
            [(a.ip, TARGET_PORT), (b.ip, TARGET_PORT)].contains(&first),
            "a backend of the group: {first:?}"
        );
        for i in 0..50u32 {
            let payload = format!("segment {i}");
            let got = forward(h, 41_000, frontend, TCP_ACK, payload.as_bytes());
            assert_eq!(got, first, "packet {i} of the flow");
        }
        assert_eq!(nat_entries(h).len(), 2, "still the one flow's two entries");
        assert_eq!(svc_stats(h, 3).flows, 1, "one flow");

        // The Service's backends change: a new group, the frontend flipped
        // to it in one update, the old group removed (as the agent does).
        put_group(h, 2, &[(a.ip, 9090), (b.ip, 9090)]);
        put_frontend(h, np, info(3, 2, 2, svc_flags::NODEPORT));
        remove_group(h, 1, 2);
        for i in 0..50u32 {
            let payload = format!("later segment {i}");
            let got = forward(h, 41_000, frontend, TCP_ACK, payload.as_bytes());
            assert_eq!(got, first, "packet {i} of the flow after the change");
        }
        let mut chosen = BTreeSet::new();
        for sport in 41_001..41_033 {
            let got = forward(h, sport, frontend, TCP_SYN, b"");
            assert_eq!(got.1, 9090, "a new flow ({sport}) follows the new group");
            chosen.insert(got.0);
        }
        assert_eq!(
            chosen,
            BTreeSet::from([a.ip, b.ip]),
            "32 new flows spread over both backends"
        );
        assert_eq!(svc_stats(h, 3).flows, 33);
        assert_eq!(nat_entries(h).len(), 2 * 33);
    });
}

#[test]
fn the_backends_answer_leaves_from_the_nodeport() {
    with_harness(|h| {
        mark_backends(h);
        let b = h.b;
        put_group(h, 1, &[(b.ip, TARGET_PORT)]);
        put_frontend(
            h,
            nodeport_key(NODE_PORT, IPPROTO_TCP),
            info(7, 1, 1, svc_flags::NODEPORT),
        );
        let got = forward(h, 40_000, (NODE_IP, NODE_PORT), TCP_SYN, b"");
        assert_eq!(got, (b.ip, TARGET_PORT));

        let syn_ack = h.pod_frame(
            b,
            &tcp((b.ip, TARGET_PORT), (CLIENT, 40_000), TCP_SYN_ACK, b""),
        );
        let out = h.expect(
            program_names::FROM_POD,
            &syn_ack,
            b.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::RevDnat,
        );
        assert_to_client(h, &out, &syn_ack, (NODE_IP, NODE_PORT));
        assert_eq!(out[47], TCP_SYN_ACK, "flags untouched");
        let reply = nat_get(
            h,
            &dnat_key((b.ip, TARGET_PORT), (CLIENT, 40_000), IPPROTO_TCP),
        )
        .expect("reply entry");
        assert_eq!(
            reply.flags,
            nat_flags::SYN | nat_flags::SEEN,
            "the flow was answered"
        );

        // The client's ACK and the backend's data: the same translation.
        let got = forward(h, 40_000, (NODE_IP, NODE_PORT), TCP_ACK, b"GET /");
        assert_eq!(got, (b.ip, TARGET_PORT));
        let data = h.pod_frame(
            b,
            &tcp((b.ip, TARGET_PORT), (CLIENT, 40_000), TCP_ACK, b"200 OK"),
        );
        let out = h.expect(
            program_names::FROM_POD,
            &data,
            b.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::RevDnat,
        );
        assert_to_client(h, &out, &data, (NODE_IP, NODE_PORT));
        assert_eq!(&out[54..], b"200 OK");
        assert_eq!(nat_entries(h).len(), 2);
    });
}

#[test]
fn no_backend_is_answered_with_port_unreachable() {
    with_harness(|h| {
        put_frontend(
            h,
            nodeport_key(NODE_PORT, IPPROTO_TCP),
            info(9, 1, 0, svc_flags::NODEPORT),
        );
        let l3 = tcp((CLIENT, 42_000), (NODE_IP, NODE_PORT), TCP_SYN, b"");
        let syn = h.peer_frame(&l3);
        let out = h.expect(
            program_names::FROM_UPLINK,
            &syn,
            h.uplink.0,
            TC_ACT_REDIRECT,
            Counter::DropSvcNoBackend,
        );
        assert_eq!(out.len(), 14 + 20 + 8 + 28, "IPv4 + ICMP + quote");
        assert_eq!(&out[0..6], &PEER_MAC, "back to the client's MAC");
        assert_eq!(&out[6..12], &h.uplink.1, "from the uplink's");
        assert_eq!(be16(&out[12..14]), ETH_P_IP);
        assert_eq!(out[14], 0x45);
        assert_eq!(be16(&out[16..18]), 56, "total length");
        assert_eq!(out[23], IPPROTO_ICMP);
        assert_eq!(addr_at(&out, 26), NODE_IP, "from the frontend address");
        assert_eq!(addr_at(&out, 30), CLIENT, "to the client");
        assert!(ipv4_checksum_ok(&out, 14), "IPv4 checksum");
        assert_eq!((out[34], out[35]), (3, 3), "port unreachable");
        assert_eq!(checksum(&out[34..]), 0, "ICMP checksum");
        assert_eq!(&out[42..], quote(&l3), "the SYN's header and 8 bytes");
        let want = frame(&[
            &eth(PEER_MAC, h.uplink.1, ETH_P_IP),
            &Ipv4 {
                tos: 0xc0,
                id: 0,
                frag: IP_DF,
                ttl: 64,
                protocol: IPPROTO_ICMP,
                payload: icmp(3, 3, [0; 4], quote(&l3)),
                ..Ipv4::new(NODE_IP, CLIENT)
            }
            .bytes(),
        ]);
        assert_eq!(out, want, "the answer, byte for byte");
        assert!(nat_entries(h).is_empty(), "no flow");
        assert_eq!(
            svc_stats(h, 9),
            SvcCounters {
                rejected: 1,
                ..SvcCounters::default()
            }
        );
    });
}

#[test]
fn local_policy_without_a_local_backend_drops_silently() {
    with_harness(|h| {
        put_frontend(
            h,
            nodeport_key(NODE_PORT, IPPROTO_TCP),
            info(9, 1, 0, svc_flags::NODEPORT | svc_flags::LOCAL_ONLY),
        );
        let syn = client_tcp(h, 42_000, (NODE_IP, NODE_PORT), TCP_SYN, b"");
        // Dropped unchanged (checked by `expect`): no ICMP answer.
        h.expect(
            program_names::FROM_UPLINK,
            &syn,
            h.uplink.0,
            TC_ACT_SHOT,
            Counter::DropSvcNoBackend,
        );
        assert!(nat_entries(h).is_empty(), "no flow");
        assert_eq!(
            svc_stats(h, 9),
            SvcCounters {
                rejected: 1,
                ..SvcCounters::default()
            }
        );
    });
}

#[test]
fn a_backend_that_is_no_local_endpoint_is_unreachable() {
    with_harness(|h| {
        put_group(h, 1, &[(NOT_LOCAL, TARGET_PORT)]);
        put_frontend(
            h,
            nodeport_key(NODE_PORT, IPPROTO_TCP),
            info(5, 1, 1, svc_flags::NODEPORT),
        );
        let syn = client_tcp(h, 43_000, (NODE_IP, NODE_PORT), TCP_SYN, b"");
        h.expect(
            program_names::FROM_UPLINK,
            &syn,
            h.uplink.0,
            TC_ACT_SHOT,
            Counter::DropSvcBackendUnreachable,
        );
        assert!(
            !nat_entries(h).iter().any(|(k, _)| k.dir == nat_dir::DNAT),
            "no reply tuple for a packet that went nowhere"
        );
        assert_eq!(svc_stats(h, 5).rejected, 0, "not a rejection");
    });
}

/// A packet dropped because its backend cannot be reached leaves no flow
/// behind: it is not counted as a translated flow, and the client's
/// retransmitted SYN (same tuple) gets a fresh choice — here, after the
/// agent has replaced the group with a reachable backend, that backend.
#[test]
fn an_unreachable_backend_leaves_no_flow_behind() {
    with_harness(|h| {
        mark_backends(h);
        let b = h.b;
        put_group(h, 1, &[(NOT_LOCAL, TARGET_PORT)]);
        let np = nodeport_key(NODE_PORT, IPPROTO_TCP);
        put_frontend(h, np, info(5, 1, 1, svc_flags::NODEPORT));
        let syn = client_tcp(h, 43_000, (NODE_IP, NODE_PORT), TCP_SYN, b"");
        h.expect(
            program_names::FROM_UPLINK,
            &syn,
            h.uplink.0,
            TC_ACT_SHOT,
            Counter::DropSvcBackendUnreachable,
        );
        put_group(h, 2, &[(b.ip, TARGET_PORT)]);
        put_frontend(h, np, info(5, 2, 1, svc_flags::NODEPORT));
        remove_group(h, 1, 1);
        let (verdict, out) = h
            .run(program_names::FROM_UPLINK, &syn, h.uplink.0)
            .expect("test run");
        assert_eq!(
            (verdict, addr_at(&out, 30)),
            (TC_ACT_REDIRECT, b.ip),
            "the retransmitted SYN reaches the group's backend (NAT: {:?})",
            nat_entries(h)
        );
        assert_to_backend(&out, &syn, b, TARGET_PORT);
        assert_eq!(
            svc_stats(h, 5).flows,
            1,
            "only the translated SYN counts as a flow"
        );
    });
}

#[test]
fn affinity_keeps_a_client_on_its_backend_until_the_timeout() {
    with_harness(|h| {
        mark_backends(h);
        let (a, b) = (h.a, h.b);
        let group = [(a.ip, TARGET_PORT), (b.ip, TARGET_PORT), (a.ip, 8081)];
        put_group(h, 1, &group);
        put_frontend(
            h,
            nodeport_key(NODE_PORT, IPPROTO_TCP),
            SvcInfo {
                affinity_timeout: 30,
                ..info(11, 1, 3, svc_flags::NODEPORT | svc_flags::AFFINITY)
            },
        );
        let frontend = (NODE_IP, NODE_PORT);
        let key = affinity_key(CLIENT, 11);
        let slot_of = |chosen: (Ipv4Addr, u16)| {
            group
                .iter()
                .position(|&g| g == chosen)
                .unwrap_or_else(|| panic!("{chosen:?} is no backend of the group"))
                as u32
        };

        let t0 = rivet::nat::monotonic_ns();
        let first = forward(h, 45_000, frontend, TCP_SYN, b"");
        let rec = affinity(h, key).expect("the choice is recorded");
        assert_eq!(rec.backend, backend(first.0, first.1));
        assert_eq!(rec.slot, slot_of(first));
        assert!(rec.last_used >= t0, "stamped now");
        assert_eq!(svc_stats(h, 11).affinity_hits, 0);

        // Other connections of the same client: the same backend, each a hit.
        let mut last_used = rec.last_used;
        for (n, sport) in (45_001..45_011).enumerate() {
            let got = forward(h, sport, frontend, TCP_SYN, b"");
            assert_eq!(got, first, "client port {sport}");
            let stats = svc_stats(h, 11);
            assert_eq!(stats.affinity_hits, n as u64 + 1);
            assert_eq!(stats.flows, n as u64 + 2);
            let rec = affinity(h, key).expect("record");
            assert_eq!(
                (rec.backend, rec.slot),
                (backend(first.0, first.1), slot_of(first))
            );
            assert!(rec.last_used >= last_used, "use refreshes the record");
            last_used = rec.last_used;
        }

        // Unused for longer than the timeout: a fresh (random) choice, the
        // record rewritten with it; the next connection sticks to it.
        let mut fresh = BTreeSet::new();
        let mut sport = 46_000;
        for round in 0..40 {
            let mut rec = affinity(h, key).expect("record");
            rec.last_used = rivet::nat::monotonic_ns() - 31_000_000_000;
            put_affinity(h, key, rec);
            let hits = svc_stats(h, 11).affinity_hits;
            let t = rivet::nat::monotonic_ns();
            let got = forward(h, sport, frontend, TCP_SYN, b"");
            assert_eq!(
                svc_stats(h, 11).affinity_hits,
                hits,
                "round {round}: no hit"
            );
            let new = affinity(h, key).expect("record");
            assert_eq!(
                (new.backend, new.slot),
                (backend(got.0, got.1), slot_of(got)),
                "round {round}: the record holds the fresh choice"
            );
            assert!(new.last_used >= t, "round {round}: the record is refreshed");
            let again = forward(h, sport + 1, frontend, TCP_SYN, b"");
            assert_eq!(again, got, "round {round}: the new choice sticks");
            assert_eq!(svc_stats(h, 11).affinity_hits, hits + 1);
            fresh.insert(got);
            sport += 2;
        }
        assert!(
            fresh.len() >= 2,
            "40 expired affinities all chose {fresh:?}: no fresh choice"
        );
    });
}

#[test]
fn an_external_ip_is_translated_only_with_its_marker() {
    with_harness(|h| {
        mark_backends(h);
        let b = h.b;
        put_group(h, 1, &[(b.ip, TARGET_PORT)]);
        put_frontend(
            h,
            frontend_key(EXTERNAL_IP, 80, IPPROTO_TCP),
            info(4, 1, 1, svc_flags::EXTERNAL),
        );
        // The frontend alone: the address is not looked at.
        let syn = client_tcp(h, 44_000, (EXTERNAL_IP, 80), TCP_SYN, b"");
        let out = h.expect(
            program_names::FROM_UPLINK,
            &syn,
            h.uplink.0,
            TC_ACT_OK,
            Counter::UplinkPass,
        );
        assert_eq!(out, syn, "passed untouched");
        assert!(nat_entries(h).is_empty());

        put_frontend(h, marker_key(EXTERNAL_IP), SvcInfo::default());
        let got = forward(h, 44_000, (EXTERNAL_IP, 80), TCP_SYN, b"");
        assert_eq!(got, (b.ip, TARGET_PORT));
        let answer = h.pod_frame(
            b,
            &tcp((b.ip, TARGET_PORT), (CLIENT, 44_000), TCP_SYN_ACK, b""),
        );
        let out = h.expect(
            program_names::FROM_POD,
            &answer,
            b.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::RevDnat,
        );
        assert_to_client(h, &out, &answer, (EXTERNAL_IP, 80));
        assert_eq!(svc_stats(h, 4).flows, 1);

        // The marker without the frontend's port: not a frontend.
        let other = client_tcp(h, 44_001, (EXTERNAL_IP, 81), TCP_SYN, b"");
        let out = h.expect(
            program_names::FROM_UPLINK,
            &other,
            h.uplink.0,
            TC_ACT_OK,
            Counter::UplinkPass,
        );
        assert_eq!(out, other);

        // The marker removed again: the address is no longer looked at.
        remove_frontend(h, marker_key(EXTERNAL_IP));
        let syn = client_tcp(h, 44_002, (EXTERNAL_IP, 80), TCP_SYN, b"");
        let out = h.expect(
            program_names::FROM_UPLINK,
            &syn,
            h.uplink.0,
            TC_ACT_OK,
            Counter::UplinkPass,
        );
        assert_eq!(out, syn);
        assert_eq!(nat_entries(h).len(), 2, "only the translated flow's");
    });
}

#[test]
fn a_frontend_matches_its_protocol_only() {
    with_harness(|h| {
        mark_backends(h);
        let b = h.b;
        put_group(h, 1, &[(b.ip, TARGET_PORT)]);
        put_frontend(
            h,
            nodeport_key(NODE_PORT, IPPROTO_TCP),
            info(2, 1, 1, svc_flags::NODEPORT),
        );
        put_frontend(
            h,
            frontend_key(EXTERNAL_IP, 80, IPPROTO_TCP),
            info(2, 1, 1, svc_flags::EXTERNAL),
        );
        put_frontend(h, marker_key(EXTERNAL_IP), SvcInfo::default());
        for to in [(NODE_IP, NODE_PORT), (EXTERNAL_IP, 80)] {
            let dgram = h.peer_frame(&ipv4(
                CLIENT,
                to.0,
                IPPROTO_UDP,
                udp_checksummed(CLIENT, to.0, 50_000, to.1, b"query"),
            ));
            let out = h.expect(
                program_names::FROM_UPLINK,
                &dgram,
                h.uplink.0,
                TC_ACT_OK,
                Counter::UplinkPass,
            );
            assert_eq!(
                out, dgram,
                "UDP to the TCP frontend {to:?} passes untouched"
            );
        }
        assert!(nat_entries(h).is_empty());
        assert_eq!(svc_stats(h, 2), SvcCounters::default());
        // TCP to the same frontends is translated.
        for to in [(NODE_IP, NODE_PORT), (EXTERNAL_IP, 80)] {
            assert_eq!(forward(h, 50_000, to, TCP_SYN, b""), (b.ip, TARGET_PORT));
        }
    });
}

/// Runs one UDP exchange on the NodePort `DNS_PORT` (backend pod A:5353):
/// the client's `query` segment in, the backend's `answer` segment back;
/// checks verdicts, counters, payloads and the flow's entries, returns the
/// two frames as they came out, with the frames that went in.
fn udp_exchange(
    h: &Harness,
    sport: u16,
    query: Vec<u8>,
    answer: Vec<u8>,
) -> [(Vec<u8>, Vec<u8>); 2] {
    let a = h.a;
    let query = h.peer_frame(&ipv4(CLIENT, NODE_IP, IPPROTO_UDP, query));
    let fwd = h.expect(
        program_names::FROM_UPLINK,
        &query,
        h.uplink.0,
        TC_ACT_REDIRECT,
        Counter::FwdSvc,
    );
    assert_eq!(&fwd[42..], b"question");
    assert_eq!(
        nat_get(
            h,
            &svc_flow_key((CLIENT, sport), (NODE_IP, DNS_PORT), IPPROTO_UDP)
        )
        .map(|e| (e.addr, e.port)),
        Some((ipv4_key(a.ip.octets()), 5353u16.to_be())),
        "the flow's backend"
    );
    assert_eq!(
        nat_get(h, &dnat_key((a.ip, 5353), (CLIENT, sport), IPPROTO_UDP)).map(|e| (e.addr, e.port)),
        Some((ipv4_key(NODE_IP.octets()), DNS_PORT.to_be())),
        "the reply tuple"
    );
    let answer = h.pod_frame(a, &ipv4(a.ip, CLIENT, IPPROTO_UDP, answer));
    let back = h.expect(
        program_names::FROM_POD,
        &answer,
        a.host_ifindex,
        TC_ACT_REDIRECT,
        Counter::RevDnat,
    );
    assert_eq!(&back[42..], b"answer");
    [(query, fwd), (answer, back)]
}

const DNS_PORT: u16 = 30_053;

#[test]
fn a_udp_nodeport_is_translated_and_its_answer_restored() {
    with_harness(|h| {
        mark_backends(h);
        let a = h.a;
        put_group(h, 1, &[(a.ip, 5353)]);
        put_frontend(
            h,
            nodeport_key(DNS_PORT, IPPROTO_UDP),
            info(6, 1, 1, svc_flags::NODEPORT),
        );
        // With UDP checksums: both verify after the translation.
        let [(query, fwd), (answer, back)] = udp_exchange(
            h,
            50_000,
            udp_checksummed(CLIENT, NODE_IP, 50_000, DNS_PORT, b"question"),
            udp_checksummed(a.ip, CLIENT, 5353, 50_000, b"answer"),
        );
        assert_to_backend(&fwd, &query, a, 5353);
        assert_to_client(h, &back, &answer, (NODE_IP, DNS_PORT));

        // Without (0: none): stays none both ways.
        let [(query, fwd), (answer, back)] = udp_exchange(
            h,
            50_001,
            udp(50_001, DNS_PORT, b"question"),
            udp(5353, 50_001, b"answer"),
        );
        assert_eq!(be16(&fwd[40..42]), 0, "no UDP checksum stays none");
        let want = translated(
            &query,
            eth(a.mac, a.host_mac, ETH_P_IP),
            None,
            Some((a.ip, 5353)),
        );
        assert_eq!(fwd, want);
        assert!(ipv4_checksum_ok(&fwd, 14));
        assert_eq!(be16(&back[40..42]), 0, "no UDP checksum stays none");
        let want = translated(
            &answer,
            eth(PEER_MAC, h.uplink.1, ETH_P_IP),
            Some((NODE_IP, DNS_PORT)),
            None,
        );
        assert_eq!(back, want);
        assert!(ipv4_checksum_ok(&back, 14));

        assert_eq!(svc_stats(h, 6).flows, 2);
        assert_eq!(nat_entries(h).len(), 4);
    });
}

/// A router between the node and the client says the backend's answer is
/// too big (fragmentation needed, next-hop MTU 1400), sending the error to
/// the address the answer came from — the frontend — and quoting the
/// answer as it travelled (frontend → client). As for a hostPort
/// connection, the error must reach the backend translated: outer
/// destination and quoted source address and port the backend's, every
/// checksum right — or the backend never learns the path MTU and its big
/// segments vanish (a path MTU black hole).
#[test]
fn an_icmp_error_about_a_service_answer_reaches_the_backend() {
    with_harness(|h| {
        mark_backends(h);
        let b = h.b;
        put_group(h, 1, &[(b.ip, TARGET_PORT)]);
        put_frontend(
            h,
            nodeport_key(NODE_PORT, IPPROTO_TCP),
            info(7, 1, 1, svc_flags::NODEPORT),
        );
        assert_eq!(
            forward(h, 40_000, (NODE_IP, NODE_PORT), TCP_SYN, b""),
            (b.ip, TARGET_PORT)
        );
        let big = vec![0x5a; 1400];
        let answer = h.pod_frame(
            b,
            &tcp((b.ip, TARGET_PORT), (CLIENT, 40_000), TCP_ACK, &big),
        );
        let left = h.expect(
            program_names::FROM_POD,
            &answer,
            b.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::RevDnat,
        );
        assert_to_client(h, &left, &answer, (NODE_IP, NODE_PORT));

        let router = Ipv4Addr::new(192, 168, 9, 1);
        let mtu = 1400u16.to_be_bytes();
        let error = Ipv4 {
            protocol: IPPROTO_ICMP,
            payload: icmp(3, 4, [0, 0, mtu[0], mtu[1]], quote(&left[14..])),
            ..Ipv4::new(router, NODE_IP)
        }
        .bytes();
        let frame_in = h.peer_frame(&error);
        let before = h.counters();
        let (verdict, out) = h
            .run(program_names::FROM_UPLINK, &frame_in, h.uplink.0)
            .expect("test run");
        let after = h.counters();
        let moved: Vec<(&str, u64)> = after
            .iter()
            .map(|(name, v)| (*name, v - before[name]))
            .filter(|&(_, d)| d != 0)
            .collect();
        assert_eq!(
            (verdict, moved.len()),
            (TC_ACT_REDIRECT, 1),
            "delivered to the backend, one counter (moved: {moved:?})"
        );
        assert!(
            ["fwd_svc", "fwd_dnat"].contains(&moved[0].0) && moved[0].1 == 1,
            "counted as translated and delivered: {moved:?}"
        );
        // The error the backend would get without the translation: about
        // its own answer (backend → client), from the router.
        let mut quoted = quote(&left[14..]).to_vec();
        quoted[12..16].copy_from_slice(&b.ip.octets());
        quoted[20..22].copy_from_slice(&TARGET_PORT.to_be_bytes());
        quoted[10..12].copy_from_slice(&[0, 0]);
        let c = checksum(&quoted[..20]);
        quoted[10..12].copy_from_slice(&c.to_be_bytes());
        let want = frame(&[
            &eth(b.mac, b.host_mac, ETH_P_IP),
            &Ipv4 {
                ttl: 63,
                protocol: IPPROTO_ICMP,
                payload: icmp(3, 4, [0, 0, mtu[0], mtu[1]], &quoted),
                ..Ipv4::new(router, b.ip)
            }
            .bytes(),
        ]);
        assert_eq!(addr_at(&out, 30), b.ip, "outer destination = backend");
        assert_eq!(addr_at(&out, 42 + 12), b.ip, "quoted source = backend");
        assert_eq!(be16(&out[62..64]), TARGET_PORT, "quoted source port");
        assert!(ipv4_checksum_ok(&out, 14), "IPv4 checksum");
        assert!(ipv4_checksum_ok(&out, 42), "quoted header checksum");
        assert_eq!(checksum(&out[34..]), 0, "ICMP checksum");
        assert_eq!(out, want, "byte for byte");
    });
}

/// A flow's backend is chosen again only when a SYN reuses the tuple of a
/// flow that ended: a retransmitted SYN of a live flow keeps its backend
/// even after the group changed; after the client's FIN (or RST) a new
/// SYN on the same tuple follows the current group.
#[test]
fn a_reused_client_tuple_is_chosen_anew_only_after_the_flow_ended() {
    with_harness(|h| {
        mark_backends(h);
        let (a, b) = (h.a, h.b);
        let np = nodeport_key(NODE_PORT, IPPROTO_TCP);
        let frontend = (NODE_IP, NODE_PORT);
        put_group(h, 1, &[(a.ip, TARGET_PORT)]);
        put_frontend(h, np, info(8, 1, 1, svc_flags::NODEPORT));
        for (n, end) in [(0u16, 0x11u8), (1, 0x04)] {
            let sport = 47_000 + n;
            put_group(h, 1, &[(a.ip, TARGET_PORT)]);
            put_frontend(h, np, info(8, 1, 1, svc_flags::NODEPORT));
            assert_eq!(
                forward(h, sport, frontend, TCP_SYN, b""),
                (a.ip, TARGET_PORT)
            );
            assert_eq!(
                forward(h, sport, frontend, TCP_ACK, b"x"),
                (a.ip, TARGET_PORT)
            );
            // The group changes to B.
            put_group(h, 2, &[(b.ip, TARGET_PORT)]);
            put_frontend(h, np, info(8, 2, 1, svc_flags::NODEPORT));
            assert_eq!(
                forward(h, sport, frontend, TCP_SYN, b""),
                (a.ip, TARGET_PORT),
                "a SYN of the live flow {sport} (retransmitted) keeps its backend"
            );
            // The client ends the flow (FIN+ACK, or RST), then reuses the
            // tuple for a new connection.
            assert_eq!(forward(h, sport, frontend, end, b""), (a.ip, TARGET_PORT));
            assert_eq!(
                forward(h, sport, frontend, TCP_SYN, b""),
                (b.ip, TARGET_PORT),
                "the new connection on {sport} follows the group"
            );
            assert!(
                nat_get(
                    h,
                    &dnat_key((b.ip, TARGET_PORT), (CLIENT, sport), IPPROTO_TCP)
                )
                .is_some_and(|e| e.flags == nat_flags::SYN),
                "the new connection's reply tuple"
            );
        }
        assert_eq!(svc_stats(h, 8).flows, 4, "two connections per tuple");
    });
}

/// A NodePort is served on every address of the node (`LOCAL_ADDRS`), its
/// answers leaving from the address the client used; an address that is
/// not the node's is never looked at, nor is a frontend that exists only
/// for the cluster's own clients (scope `INTERNAL`).
#[test]
fn a_nodeport_is_served_on_every_node_address_and_only_there() {
    with_harness(|h| {
        mark_backends(h);
        let b = h.b;
        let second = Ipv4Addr::new(192, 168, 9, 11);
        {
            let mut local: HashMap<&mut MapData, rivet_common::EndpointKey, u32> =
                HashMap::try_from(h.ebpf.map_mut("LOCAL_ADDRS").expect("map")).expect("hash");
            local
                .insert(
                    rivet_common::EndpointKey {
                        addr: ipv4_key(second.octets()),
                    },
                    1,
                    0,
                )
                .expect("insert");
        }
        put_group(h, 1, &[(b.ip, TARGET_PORT)]);
        put_frontend(
            h,
            nodeport_key(NODE_PORT, IPPROTO_TCP),
            info(7, 1, 1, svc_flags::NODEPORT),
        );
        assert_eq!(
            forward(h, 48_000, (second, NODE_PORT), TCP_SYN, b""),
            (b.ip, TARGET_PORT)
        );
        let syn_ack = h.pod_frame(
            b,
            &tcp((b.ip, TARGET_PORT), (CLIENT, 48_000), TCP_SYN_ACK, b""),
        );
        let out = h.expect(
            program_names::FROM_POD,
            &syn_ack,
            b.host_ifindex,
            TC_ACT_REDIRECT,
            Counter::RevDnat,
        );
        assert_to_client(h, &out, &syn_ack, (second, NODE_PORT));

        // Not an address of the node.
        let stranger = Ipv4Addr::new(192, 168, 9, 99);
        let syn = client_tcp(h, 48_001, (stranger, NODE_PORT), TCP_SYN, b"");
        let out = h.expect(
            program_names::FROM_UPLINK,
            &syn,
            h.uplink.0,
            TC_ACT_OK,
            Counter::UplinkPass,
        );
        assert_eq!(out, syn);

        // A frontend of scope INTERNAL only (another port), at the node's
        // address and at an address marked for external frontends.
        let internal = SvcKey {
            scope: svc_scope::INTERNAL,
            ..nodeport_key(NODE_PORT + 1, IPPROTO_TCP)
        };
        put_frontend(h, internal, info(7, 1, 1, svc_flags::NODEPORT));
        let cluster_ip = SvcKey {
            scope: svc_scope::INTERNAL,
            ..frontend_key(EXTERNAL_IP, 80, IPPROTO_TCP)
        };
        put_frontend(h, cluster_ip, info(7, 1, 1, 0));
        put_frontend(h, marker_key(EXTERNAL_IP), SvcInfo::default());
        for to in [(NODE_IP, NODE_PORT + 1), (EXTERNAL_IP, 80)] {
            let syn = client_tcp(h, 48_002, to, TCP_SYN, b"");
            let out = h.expect(
                program_names::FROM_UPLINK,
                &syn,
                h.uplink.0,
                TC_ACT_OK,
                Counter::UplinkPass,
            );
            assert_eq!(out, syn, "{to:?}: passed untouched");
        }
        assert_eq!(nat_entries(h).len(), 2, "only the translated flow's");
        assert_eq!(svc_stats(h, 7).flows, 1);
    });
}

/// An affinity holds across a change of the Service's backends while the
/// new group has the client's backend in the same slot (the agent keeps a
/// backend's slot while it stays); a group with another backend in that
/// slot ends it: a fresh choice, recorded.
#[test]
fn affinity_follows_its_backends_slot_across_group_changes() {
    with_harness(|h| {
        mark_backends(h);
        let (a, b) = (h.a, h.b);
        let np = nodeport_key(NODE_PORT, IPPROTO_TCP);
        let flags = svc_flags::NODEPORT | svc_flags::AFFINITY;
        let with_timeout = |group| SvcInfo {
            affinity_timeout: 10_800,
            ..info(12, group, 3, flags)
        };
        let group = [(a.ip, TARGET_PORT), (b.ip, TARGET_PORT), (a.ip, 8081)];
        put_group(h, 1, &group);
        put_frontend(h, np, with_timeout(1));
        let frontend = (NODE_IP, NODE_PORT);
        let key = affinity_key(CLIENT, 12);
        let first = forward(h, 49_000, frontend, TCP_SYN, b"");
        let slot = affinity(h, key).expect("record").slot as usize;
        assert_eq!(group[slot], first);

        // The same backends, written as a new group (slots kept): a hit.
        put_group(h, 2, &group);
        put_frontend(h, np, with_timeout(2));
        assert_eq!(forward(h, 49_001, frontend, TCP_SYN, b""), first);
        assert_eq!(svc_stats(h, 12).affinity_hits, 1);

        // The client's backend gone from its slot (every slot rotated): no
        // hit; the record names the new choice.
        let rotated = [group[1], group[2], group[0]];
        put_group(h, 3, &rotated);
        put_frontend(h, np, with_timeout(3));
        let got = forward(h, 49_002, frontend, TCP_SYN, b"");
        assert_eq!(svc_stats(h, 12).affinity_hits, 1, "no hit");
        let rec = affinity(h, key).expect("record");
        assert_eq!(
            (rec.backend, rotated[rec.slot as usize]),
            (backend(got.0, got.1), got),
            "the record holds the fresh choice and its slot"
        );
        assert_eq!(forward(h, 49_003, frontend, TCP_SYN, b""), got);
        assert_eq!(svc_stats(h, 12).affinity_hits, 2);
    });
}
