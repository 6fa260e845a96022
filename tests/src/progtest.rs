//! Per-packet test harness (BPF_PROG_TEST_RUN), in the style of Cilium's
//! bpf/tests: a private copy of the object loaded in a fresh namespace that
//! holds two veth pairs standing for two pods' host-side veths and an uplink
//! (`up0`, 192.168.9.10/24, with a permanent neighbour for the peer node
//! 192.168.9.20), maps filled by hand, the real entry programs run on
//! crafted packets; verdict, output bytes and counters checked.
#![allow(missing_docs, reason = "test harness")]

use std::{collections::BTreeMap, net::Ipv4Addr};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, LpmTrie, MapData, PerCpuArray, lpm_trie::Key},
    programs::{SchedClassifier, TestRun as _, TestRunOptions},
};
use rivet_common::{
    Counter, EndpointInfo, EndpointKey, EndpointSlot, NodeConfig, PeerInfo, RouteInfo, StatsEntry,
    config_flags, endpoint_flags, endpoint_slot, ipv4_key,
};

use crate::{
    Netns,
    packet::{ETH_P_IP, IPPROTO_IPIP, IPPROTO_UDP, Ipv4, eth, frame, ipv4, udp, vxlan},
    unique_prefix,
};

/// The peer node of the uplink tests.
pub const PEER_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 9, 20);
/// Its MAC (permanent neighbour on up0).
pub const PEER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x20, 0x20];
/// The remote pod subnet routed to the peer.
pub const REMOTE_SUBNET: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 9, 2, 0), 24);
/// Our VTEP MAC.
pub const OUR_VTEP: [u8; 6] = [0x0e, 0x72, 192, 168, 9, 10];
/// The peer's VTEP MAC.
pub const PEER_VTEP: [u8; 6] = [0x0e, 0x72, 192, 168, 9, 20];
/// VNI and port of the tests.
pub const VNI: u32 = 1;
pub const VXLAN_PORT: u16 = 8472;

pub const TC_ACT_OK: u32 = 0;
pub const TC_ACT_SHOT: u32 = 2;
pub const TC_ACT_REDIRECT: u32 = 7;
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 9, 10);
pub const ELSEWHERE: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 7);
pub const BCAST: [u8; 6] = crate::packet::BROADCAST;

/// `p`'s `ENDPOINTS` value.
pub fn endpoint_info(p: PodSide, flags: u32) -> EndpointInfo {
    EndpointInfo {
        ifindex: p.host_ifindex,
        flags,
        mac: p.mac,
        host_mac: p.host_mac,
    }
}

/// A pod as the datapath knows it.
#[derive(Clone, Copy, Debug)]
pub struct PodSide {
    /// Address.
    pub ip: Ipv4Addr,
    /// Pod MAC.
    pub mac: [u8; 6],
    /// Host veth ifindex.
    pub host_ifindex: u32,
    /// Host veth MAC.
    pub host_mac: [u8; 6],
}

pub struct Harness {
    /// The loaded object (private maps).
    pub ebpf: Ebpf,
    /// Pod A.
    pub a: PodSide,
    /// Pod B.
    pub b: PodSide,
    /// The uplink: ifindex and MAC.
    pub uplink: (u32, [u8; 6]),
}

pub fn sh(args: &[&str]) {
    let out = std::process::Command::new(args[0])
        .args(&args[1..])
        .output()
        .expect("spawn");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn if_index(name: &str) -> u32 {
    nix::net::if_::if_nametoindex(name).unwrap_or_else(|e| panic!("ifindex of {name}: {e}"))
}

/// Runs `f` with a loaded datapath inside a fresh namespace.
pub fn with_harness(f: impl FnOnce(&mut Harness) + Send) {
    with_harness_nat_max(rivet_common::NAT_MAX, f);
}

/// [`with_harness`] with a NAT table of `nat_max` entries.
pub fn with_harness_nat_max(nat_max: u32, f: impl FnOnce(&mut Harness) + Send) {
    let ns = Netns::new(format!("{}-dp", unique_prefix()));
    ns.exec(|| {
        for (h, p) in [("hA", "pA"), ("hB", "pB"), ("up0", "up1")] {
            sh(&["ip", "link", "add", h, "type", "veth", "peer", "name", p]);
            sh(&["ip", "link", "set", h, "up"]);
            sh(&["ip", "link", "set", p, "up"]);
        }
        sh(&["ip", "addr", "add", "192.168.9.10/24", "dev", "up0"]);
        // bpf_fib_lookup refuses devices without forwarding, even for
        // BPF_FIB_LOOKUP_OUTPUT (the agent turns it on for its node too).
        sh(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        sh(&[
            "ip",
            "neigh",
            "replace",
            "192.168.9.20",
            "lladdr",
            "02:00:00:00:20:20",
            "dev",
            "up0",
            "nud",
            "permanent",
        ]);
        let mut ebpf = EbpfLoader::new()
            .map_max_entries(rivet_common::map_names::NAT, nat_max)
            .load(rivet::datapath::OBJECT)
            .expect("loading the object");
        for name in rivet::datapath::PROGRAMS {
            let prog: &mut SchedClassifier = ebpf
                .program_mut(name)
                .expect("program")
                .try_into()
                .expect("classifier");
            rivet::datapath::load_verified(|| prog.load()).expect("verifier accepts the program");
        }
        let a = PodSide {
            ip: Ipv4Addr::new(10, 9, 1, 2),
            mac: [0x02, 0, 0, 0, 0xa, 1],
            host_ifindex: if_index("hA"),
            host_mac: [0x02, 0, 0, 0, 0xa, 0xfe],
        };
        let b = PodSide {
            ip: Ipv4Addr::new(10, 9, 1, 3),
            mac: [0x02, 0, 0, 0, 0xb, 1],
            host_ifindex: if_index("hB"),
            host_mac: [0x02, 0, 0, 0, 0xb, 0xfe],
        };
        let up_mac = link_mac("up0");
        let mut h = Harness {
            ebpf,
            a,
            b,
            uplink: (if_index("up0"), up_mac),
        };
        h.put_endpoint(a);
        h.put_endpoint(b);
        h.configure();
        {
            let mut local: HashMap<&mut MapData, EndpointKey, u32> =
                HashMap::try_from(h.ebpf.map_mut("LOCAL_ADDRS").expect("map")).expect("hash");
            local
                .insert(
                    EndpointKey {
                        addr: ipv4_key(NODE_IP.octets()),
                    },
                    1,
                    0,
                )
                .expect("insert");
        }
        f(&mut h);
    });
}

impl Harness {
    /// `p` as the agent writes a pod: its `ENDPOINTS` entry and its slot in
    /// the endpoint cache.
    pub fn put_endpoint(&mut self, p: PodSide) {
        self.write_endpoint(p, endpoint_flags::READY);
    }

    /// `p` in `ENDPOINTS` only: its cache slot left as it is (another
    /// address in it, or empty), as for a colliding address.
    pub fn put_endpoint_hash_only(&mut self, p: PodSide) {
        let mut eps: HashMap<&mut MapData, EndpointKey, EndpointInfo> =
            HashMap::try_from(self.ebpf.map_mut("ENDPOINTS").expect("map")).expect("hash");
        eps.insert(
            EndpointKey {
                addr: ipv4_key(p.ip.octets()),
            },
            endpoint_info(p, endpoint_flags::READY),
            0,
        )
        .expect("insert endpoint");
    }

    /// Writes the endpoint cache slot of `addr` as holding `addr` → `info`
    /// (or any other content: tests of the cache itself).
    pub fn put_endpoint_slot(&mut self, addr: Ipv4Addr, slot: EndpointSlot) {
        let mut slots: Array<&mut MapData, EndpointSlot> =
            Array::try_from(self.ebpf.map_mut("ENDPOINT_SLOTS").expect("map")).expect("array");
        slots
            .set(endpoint_slot(ipv4_key(addr.octets())), slot, 0)
            .expect("endpoint slot");
    }

    /// `p` as the agent writes a pod whose entry carries `flags`
    /// ([`endpoint_flags`]: e.g. `READY | SERVICE` for a Service backend).
    pub fn put_endpoint_flags(&mut self, p: PodSide, flags: u32) {
        self.write_endpoint(p, flags);
    }

    fn write_endpoint(&mut self, p: PodSide, flags: u32) {
        let info = endpoint_info(p, flags);
        let mut eps: HashMap<&mut MapData, EndpointKey, EndpointInfo> =
            HashMap::try_from(self.ebpf.map_mut("ENDPOINTS").expect("map")).expect("hash");
        eps.insert(
            EndpointKey {
                addr: ipv4_key(p.ip.octets()),
            },
            info,
            0,
        )
        .expect("insert endpoint");
        self.put_endpoint_slot(
            p.ip,
            EndpointSlot {
                addr: ipv4_key(p.ip.octets()),
                info,
            },
        );
    }

    /// Writes the node configuration.
    pub fn configure(&mut self) {
        let mut cfg: Array<&mut MapData, NodeConfig> =
            Array::try_from(self.ebpf.map_mut("CONFIG").expect("map")).expect("array");
        cfg.set(
            0,
            NodeConfig {
                gateway: ipv4_key(GATEWAY.octets()),
                node_ip: ipv4_key(NODE_IP.octets()),
                pod_cidr: ipv4_key([10, 9, 1, 0]),
                pod_prefix_len: 24,
                flags: config_flags::CONFIGURED,
                uplink_ifindex: self.uplink.0,
                vni: VNI,
                vxlan_port: u32::from(VXLAN_PORT),
                uplink_mtu: 1500,
                vtep_mac: OUR_VTEP,
                ..NodeConfig::default()
            },
            0,
        )
        .expect("config");
    }

    pub fn counters(&self) -> BTreeMap<&'static str, u64> {
        let stats: PerCpuArray<&MapData, StatsEntry> =
            PerCpuArray::try_from(self.ebpf.map("STATS").expect("map")).expect("percpu");
        Counter::ALL
            .iter()
            .map(|c| {
                let v = stats.get(&c.index(), 0).expect("stats");
                (c.name(), v.iter().map(|e| e.packets).sum())
            })
            .collect()
    }

    /// Runs `prog` on `data` as if received on `ifindex`: (verdict, output).
    pub fn run(&self, prog: &str, data: &[u8], ifindex: u32) -> Result<(u32, Vec<u8>), String> {
        let prog: &SchedClassifier = self
            .ebpf
            .program(prog)
            .expect("program")
            .try_into()
            .expect("classifier");
        let ctx = skb_ctx(ifindex);
        let mut out = vec![0u8; data.len() + 512];
        let mut opts = TestRunOptions::new();
        opts.data_in = Some(data);
        opts.data_out = Some(&mut out);
        opts.ctx_in = Some(&ctx);
        let res = prog
            .test_run(opts)
            .map_err(|e| format!("{e}: {:?}", std::error::Error::source(&e)))?;
        out.truncate(res.data_size_out as usize);
        Ok((res.return_value, out))
    }

    /// Runs and checks the verdict and that exactly `counter` moved, by one.
    pub fn expect(
        &self,
        prog: &str,
        data: &[u8],
        ifindex: u32,
        verdict: u32,
        counter: Counter,
    ) -> Vec<u8> {
        let before = self.counters();
        let (got, out) = self.run(prog, data, ifindex).unwrap_or_else(|e| {
            panic!(
                "test_run {prog} on {} bytes {:02x?}: {e}",
                data.len(),
                &data[..data.len().min(40)]
            )
        });
        let after = self.counters();
        assert_eq!(
            got, verdict,
            "verdict of {prog} (counters after: {after:?})"
        );
        for (name, value) in &after {
            let delta = value - before[name];
            let want = u64::from(*name == counter.name());
            assert_eq!(
                delta, want,
                "counter {name} moved by {delta}, expected {want}"
            );
        }
        if verdict == TC_ACT_SHOT {
            assert_eq!(out, data, "a dropped packet must be left unchanged");
        }
        out
    }

    /// `ip` as pod `from` sends it to its host veth.
    pub fn ip_frame(&self, from: PodSide, ip: &Ipv4) -> Vec<u8> {
        self.pod_frame(from, &ip.bytes())
    }

    /// The IPv4 packet `l3` as pod `from` sends it to its host veth.
    pub fn pod_frame(&self, from: PodSide, l3: &[u8]) -> Vec<u8> {
        frame(&[&eth(from.host_mac, from.mac, ETH_P_IP), l3])
    }

    /// The IPv4 packet `l3` as the peer node sends it to the uplink.
    pub fn peer_frame(&self, l3: &[u8]) -> Vec<u8> {
        frame(&[&eth(self.uplink.1, PEER_MAC, ETH_P_IP), l3])
    }
}

/// The `struct __sk_buff` a test run starts with: ifindex (the u32 at
/// offset 40) set, everything the kernel does not accept from userspace
/// zero.
pub fn skb_ctx(ifindex: u32) -> [u8; 44] {
    let mut ctx = [0u8; 44];
    ctx[40..44].copy_from_slice(&ifindex.to_ne_bytes());
    ctx
}

/// MAC of a link in the current namespace.
pub fn link_mac(name: &str) -> [u8; 6] {
    let text =
        std::fs::read_to_string(format!("/sys/class/net/{name}/address")).unwrap_or_default();
    let out = std::process::Command::new("ip")
        .args(["-o", "link", "show", name])
        .output()
        .expect("ip");
    let line = String::from_utf8_lossy(&out.stdout).into_owned();
    let mac = line
        .split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .map(str::to_owned)
        .unwrap_or(text);
    rivet::netlink::parse_mac(mac.trim()).unwrap_or_else(|| panic!("MAC of {name}: {mac:?}"))
}

impl Harness {
    /// Routes `REMOTE_SUBNET` to the peer node in `mode`, and knows the peer.
    pub fn route_to_peer(&mut self, mode: u32) {
        let mut routes: LpmTrie<&mut MapData, u32, RouteInfo> =
            LpmTrie::try_from(self.ebpf.map_mut("ROUTES").expect("map")).expect("lpm");
        routes
            .insert(
                &Key::new(
                    u32::from(REMOTE_SUBNET.1),
                    ipv4_key(REMOTE_SUBNET.0.octets()),
                ),
                RouteInfo {
                    node_ip: ipv4_key(PEER_IP.octets()),
                    mode,
                },
                0,
            )
            .expect("route");
        let mut peers: HashMap<&mut MapData, EndpointKey, PeerInfo> =
            HashMap::try_from(self.ebpf.map_mut("PEERS").expect("map")).expect("hash");
        peers
            .insert(
                EndpointKey {
                    addr: ipv4_key(PEER_IP.octets()),
                },
                PeerInfo {
                    vtep_mac: PEER_VTEP,
                    _pad: [0; 2],
                    vni: VNI,
                    route_mode: mode,
                },
                0,
            )
            .expect("peer");
    }
}

impl Harness {
    /// A VXLAN frame from `src` (a node) to this node's uplink address
    /// carrying `inner` (an IPv4 packet) with VNI `vni` on UDP port `port`.
    pub fn vxlan_frame(&self, src: Ipv4Addr, vni: u32, port: u16, inner: &[u8]) -> Vec<u8> {
        let inner = frame(&[&eth(OUR_VTEP, PEER_VTEP, ETH_P_IP), inner]);
        let outer = udp(49999, port, &vxlan(vni, &inner));
        self.peer_frame(&ipv4(src, NODE_IP, IPPROTO_UDP, outer))
    }

    /// An IPIP frame from `src` to this node carrying `inner`.
    pub fn ipip_frame(&self, src: Ipv4Addr, inner: &[u8]) -> Vec<u8> {
        self.peer_frame(&ipv4(src, NODE_IP, IPPROTO_IPIP, inner.to_vec()))
    }

    /// Mean in-kernel duration (ns) of `runs` single runs of `prog` on
    /// `data` (each run on a fresh copy: the programs rewrite packets, so
    /// the kernel's own `repeat` would measure a changing packet).
    pub fn time(&self, prog: &str, data: &[u8], ifindex: u32, runs: u32) -> f64 {
        let prog: &SchedClassifier = self
            .ebpf
            .program(prog)
            .expect("program")
            .try_into()
            .expect("classifier");
        let ctx = skb_ctx(ifindex);
        let mut out = vec![0u8; data.len() + 512];
        let mut total = std::time::Duration::ZERO;
        for _ in 0..runs {
            let mut opts = TestRunOptions::new();
            opts.data_in = Some(data);
            opts.data_out = Some(&mut out);
            opts.ctx_in = Some(&ctx);
            total += prog.test_run(opts).expect("test_run").duration;
        }
        total.as_nanos() as f64 / f64::from(runs.max(1))
    }
}

impl Harness {
    /// Turns masquerade on with the given port range; the pod CIDR
    /// (10.9.0.0/16) stays un-masqueraded, as the agent sets it.
    pub fn enable_nat(&mut self, port_min: u16, port_max: u16) {
        let mut cfg: Array<&mut MapData, rivet_common::NatConfig> =
            Array::try_from(self.ebpf.map_mut("NAT_CONFIG").expect("map")).expect("array");
        cfg.set(
            0,
            rivet_common::NatConfig {
                flags: rivet_common::nat_config_flags::MASQUERADE,
                port_min,
                port_max,
                ts_base: 0x1234_5678,
            },
            0,
        )
        .expect("nat config");
        let mut no: LpmTrie<&mut MapData, u32, u32> =
            LpmTrie::try_from(self.ebpf.map_mut("NO_MASQ").expect("map")).expect("lpm");
        no.insert(&Key::new(16, ipv4_key([10, 9, 0, 0])), 1, 0)
            .expect("no-masq");
    }
}

impl Harness {
    /// A TCP hostPort `host_port` (every node address) to `pod`'s
    /// `container_port`, and the endpoint marked as having hostPorts — what
    /// the agent writes for a pod's portMappings.
    pub fn put_hostport(&mut self, host_port: u16, pod: PodSide, container_port: u16) {
        self.write_endpoint(pod, endpoint_flags::READY | endpoint_flags::HOSTPORTS);
        let mut hp: HashMap<&mut MapData, rivet_common::HostPortKey, rivet_common::HostPortTarget> =
            HashMap::try_from(self.ebpf.map_mut("HOSTPORTS").expect("map")).expect("hash");
        hp.insert(
            rivet_common::HostPortKey {
                addr: 0,
                port: host_port.to_be(),
                proto: 6,
                _pad: 0,
            },
            rivet_common::HostPortTarget {
                pod_ip: ipv4_key(pod.ip.octets()),
                port: container_port.to_be(),
                _pad: [0; 2],
            },
            0,
        )
        .expect("hostport");
    }
}
