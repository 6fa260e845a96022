//! The contract between rivet's eBPF programs and its userspace: every map key
//! and value, the counter indices, and the constants both sides must agree on.
//!
//! Rules for every type here (they are copied byte for byte between kernel and
//! userspace):
//! - `#[repr(C)]`, `Copy`, no implicit padding (explicit `_pad` fields instead),
//! - IPv4 addresses are `u32` holding the four octets in wire order, exactly as
//!   they sit in a packet (use [`ipv4_key`] / [`ipv4_from_key`] in userspace),
//! - `aya::Pod` is implemented only with the `user` feature.
#![no_std]

mod policy;
mod service;
pub use policy::*;
pub use service::*;

/// Names of the maps, as the loader finds them in the object and pins them.
pub mod map_names {
    /// Local endpoints: [`crate::EndpointKey`] → [`crate::EndpointInfo`].
    pub const ENDPOINTS: &str = "ENDPOINTS";
    /// Per-CPU counters indexed by [`crate::Counter`].
    pub const STATS: &str = "STATS";
    /// Node configuration, one [`crate::NodeConfig`] at index 0.
    pub const CONFIG: &str = "CONFIG";
    /// Addresses owned by the node itself: [`crate::EndpointKey`] → `u32` flags.
    pub const LOCAL_ADDRS: &str = "LOCAL_ADDRS";
    /// Remote pod subnets (LPM): `Key<u32>` → [`crate::RouteInfo`].
    pub const ROUTES: &str = "ROUTES";
    /// Other nodes (tunnel endpoints): [`crate::EndpointKey`] (node IP) → [`crate::PeerInfo`].
    pub const PEERS: &str = "PEERS";

    /// Connection tracking of masqueraded flows (LRU): [`crate::NatKey`] → [`crate::NatEntry`],
    /// one entry per direction.
    pub const NAT: &str = "NAT";
    /// Masquerade settings, one [`crate::NatConfig`] at index 0.
    pub const NAT_CONFIG: &str = "NAT_CONFIG";
    /// Destinations never masqueraded (LPM): `Key<u32>` → `u32` (unused).
    pub const NO_MASQ: &str = "NO_MASQ";
    /// hostPorts: [`crate::HostPortKey`] → [`crate::HostPortTarget`].
    pub const HOSTPORTS: &str = "HOSTPORTS";
    /// NAT table bookkeeping (per-CPU `u64` by [`crate::nat_stat`] index).
    pub const NAT_STATS: &str = "NAT_STATS";
    /// The socket hooks' settings, one [`crate::SockConfig`] at index 0.
    pub const SOCK_CONFIG: &str = "SOCK_CONFIG";
    /// Sockets of the node that reached a hostPort (LRU):
    /// [`crate::SockRevKey`] → [`crate::SockRevTarget`], the address the
    /// application used.
    pub const SOCK_REVNAT: &str = "SOCK_REVNAT";
    /// Drop and flow events (ring buffer of [`crate::Event`]).
    pub const EVENTS: &str = "EVENTS";
    /// Event settings, one [`crate::EventConfig`] at index 0.
    pub const EVENT_CONFIG: &str = "EVENT_CONFIG";
    /// Masqueraded flows per pod (LRU): [`crate::NatPodKey`] → `u64`, the
    /// datapath's running count and the collector's correction.
    pub const NAT_PODS: &str = "NAT_PODS";
    /// NAT limits, one [`crate::NatLimits`] at index 0.
    pub const NAT_LIMITS: &str = "NAT_LIMITS";
    /// Numeric settings, `u64` by [`crate::tunable`] index: a map whose
    /// layout never changes when a knob is added.
    pub const TUNABLES: &str = "TUNABLES";
    /// Per-pod budget of IPv4 fragments addressed to the node (LRU):
    /// [`crate::EndpointKey`] (the sending pod) → `u64`, the bucket's
    /// theoretical arrival time (see [`crate::tunable::FRAG_RATE`]).
    pub const FRAG_BUDGET: &str = "FRAG_BUDGET";
    /// Direct-mapped cache of [`ENDPOINTS`] (array):
    /// [`crate::endpoint_slot`] index → [`crate::EndpointSlot`]. The hash
    /// map stays the truth; a slot is only trusted when it names the address
    /// looked up.
    pub const ENDPOINT_SLOTS: &str = "ENDPOINT_SLOTS";
    /// Service frontends: [`crate::SvcKey`] → [`crate::SvcInfo`].
    pub const SVC_FRONTENDS: &str = "SVC_FRONTENDS";
    /// Service backend groups: [`crate::SvcBackendKey`] → [`crate::SvcBackend`].
    pub const SVC_BACKENDS: &str = "SVC_BACKENDS";
    /// ClientIP affinity (LRU): [`crate::SvcAffinityKey`] → [`crate::SvcAffinity`].
    pub const SVC_AFFINITY: &str = "SVC_AFFINITY";
    /// Per-Service-port counters (array by [`crate::SvcInfo::id`]):
    /// [`crate::SvcCounters`].
    pub const SVC_STATS: &str = "SVC_STATS";
    /// Network namespaces of this node's pods, by `SO_NETNS_COOKIE`: `u64`
    /// → [`crate::netns_role`]; the socket hooks translate Services for them.
    pub const SOCK_NETNS: &str = "SOCK_NETNS";
    /// NetworkPolicy port classes (LPM): `Key<`[`crate::PolicyPortKey`]`>`
    /// → `u32` class.
    pub const POLICY_PORTS: &str = "POLICY_PORTS";
    /// NetworkPolicy allowed peers (LPM): `Key<`[`crate::PolicyPeerKey`]`>`
    /// → `u32`, the agent's number of the policy that allows.
    pub const POLICY_PEERS: &str = "POLICY_PEERS";
    /// Flows pods of this node started or accepted (LRU):
    /// [`crate::FlowKey`] → [`crate::FlowState`].
    pub const POLICY_FLOWS: &str = "POLICY_FLOWS";
    /// New flows NetworkPolicy allowed, per direction (per-CPU `u64` by
    /// [`crate::policy_stat`] slot).
    pub const POLICY_STATS: &str = "POLICY_STATS";
    /// The policy verdict's per-CPU working memory (datapath only).
    pub const POLICY_SCRATCH: &str = "POLICY_SCRATCH";
    /// Pod bandwidth limits: `u32` ifindex of the pod's host-side veth →
    /// [`crate::PodBandwidth`], a token bucket per direction the datapath
    /// charges and the agent sets.
    pub const BANDWIDTH: &str = "BANDWIDTH";

    /// Every map the agent pins: the names of [`crate::MAPS`], in its order.
    pub const ALL: [&str; crate::MAPS.len()] = {
        let mut all = [""; crate::MAPS.len()];
        let mut i = 0;
        while i < all.len() {
            all[i] = crate::MAPS[i].name;
            i += 1;
        }
        all
    };
}

/// A map's type, as the kernel numbers it (`enum bpf_map_type`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapKind {
    /// `BPF_MAP_TYPE_HASH`.
    Hash = 1,
    /// `BPF_MAP_TYPE_ARRAY`.
    Array = 2,
    /// `BPF_MAP_TYPE_PERCPU_ARRAY`.
    PerCpuArray = 6,
    /// `BPF_MAP_TYPE_LRU_HASH`.
    LruHash = 9,
    /// `BPF_MAP_TYPE_LPM_TRIE`.
    LpmTrie = 11,
    /// `BPF_MAP_TYPE_RINGBUF` (no key or value; its size is in bytes).
    RingBuf = 27,
}

impl MapKind {
    /// The kind numbered `raw` by the kernel, if it is one of these.
    pub const fn from_raw(raw: u32) -> Option<MapKind> {
        match raw {
            1 => Some(MapKind::Hash),
            2 => Some(MapKind::Array),
            6 => Some(MapKind::PerCpuArray),
            9 => Some(MapKind::LruHash),
            11 => Some(MapKind::LpmTrie),
            27 => Some(MapKind::RingBuf),
            _ => None,
        }
    }
}

/// How a map's capacity is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapSizing {
    /// As the object declares it ([`MapSpec::max_entries`]).
    Fixed,
    /// Set at load from the agent's configuration key (the object's
    /// [`MapSpec::max_entries`] is its default). The agent fills the map: an
    /// entry a full map refuses is counted and reported.
    Configured(&'static str),
    /// Set at load from the configuration key of the maps it serves; only
    /// the datapath fills it (LRU), so nothing is ever refused.
    Follows(&'static str),
}

/// One map of the datapath: its name, type, layout and capacity. The loader
/// pins every map listed here and checks each layout (object and pins)
/// against it; a test checks that the object defines exactly these.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSpec {
    /// Its name in the object and pin directory ([`map_names`]).
    pub name: &'static str,
    /// Its type.
    pub kind: MapKind,
    /// Key size in bytes (0 for a ring buffer).
    pub key_size: usize,
    /// Value size in bytes (0 for a ring buffer).
    pub value_size: usize,
    /// Capacity the object declares (bytes for a ring buffer).
    pub max_entries: u32,
    /// Whether the agent resizes it at load.
    pub sizing: MapSizing,
}

impl MapSpec {
    const fn new<K, V>(name: &'static str, kind: MapKind, max_entries: u32) -> Self {
        Self {
            name,
            kind,
            key_size: core::mem::size_of::<K>(),
            value_size: core::mem::size_of::<V>(),
            max_entries,
            sizing: MapSizing::Fixed,
        }
    }

    const fn sized(self, sizing: MapSizing) -> Self {
        Self { sizing, ..self }
    }
}

/// Key of the LPM tries (`aya`'s `lpm_trie::Key<u32>`): prefix length, then
/// the address in wire order.
type LpmKey = [u32; 2];
/// Key of `POLICY_PORTS`: prefix length, then [`PolicyPortKey`].
type PolicyPortLpmKey = [u32; 3];
/// Key of `POLICY_PEERS`: prefix length, then [`PolicyPeerKey`].
type PolicyPeerLpmKey = [u32; 4];
const _: () =
    assert!(core::mem::size_of::<PolicyPortLpmKey>() == 4 + core::mem::size_of::<PolicyPortKey>());
const _: () =
    assert!(core::mem::size_of::<PolicyPeerLpmKey>() == 4 + core::mem::size_of::<PolicyPeerKey>());

/// Every map of the datapath, stated once: names, types, layouts and
/// capacities ([`map_names::ALL`] and the agent's layout checks, pins and
/// sized maps come from here).
pub const MAPS: [MapSpec; 31] = {
    use MapKind::*;
    use map_names as n;
    [
        MapSpec::new::<EndpointKey, EndpointInfo>(n::ENDPOINTS, Hash, ENDPOINTS_MAX)
            .sized(MapSizing::Configured("max_endpoints")),
        MapSpec::new::<u32, StatsEntry>(n::STATS, PerCpuArray, COUNTERS_MAX),
        MapSpec::new::<u32, NodeConfig>(n::CONFIG, Array, 1),
        MapSpec::new::<EndpointKey, u32>(n::LOCAL_ADDRS, Hash, LOCAL_ADDRS_MAX),
        MapSpec::new::<LpmKey, RouteInfo>(n::ROUTES, LpmTrie, ROUTES_MAX)
            .sized(MapSizing::Configured("max_routes")),
        MapSpec::new::<EndpointKey, PeerInfo>(n::PEERS, Hash, PEERS_MAX)
            .sized(MapSizing::Configured("max_routes")),
        MapSpec::new::<HostPortKey, HostPortTarget>(n::HOSTPORTS, Hash, HOSTPORTS_MAX)
            .sized(MapSizing::Configured("max_hostports")),
        MapSpec::new::<NatKey, NatEntry>(n::NAT, LruHash, NAT_MAX)
            .sized(MapSizing::Configured("nat_max_entries")),
        MapSpec::new::<u32, NatConfig>(n::NAT_CONFIG, Array, 1),
        MapSpec::new::<LpmKey, u32>(n::NO_MASQ, LpmTrie, NO_MASQ_MAX),
        MapSpec::new::<u32, u64>(n::NAT_STATS, PerCpuArray, nat_stat::SLOTS),
        MapSpec::new::<u32, SockConfig>(n::SOCK_CONFIG, Array, 1),
        MapSpec::new::<SockRevKey, SockRevTarget>(n::SOCK_REVNAT, LruHash, SOCK_REVNAT_MAX),
        MapSpec::new::<(), ()>(n::EVENTS, RingBuf, EVENTS_BYTES),
        MapSpec::new::<u32, EventConfig>(n::EVENT_CONFIG, Array, 1),
        MapSpec::new::<NatPodKey, u64>(n::NAT_PODS, LruHash, NAT_PODS_MAX),
        MapSpec::new::<u32, NatLimits>(n::NAT_LIMITS, Array, 1),
        MapSpec::new::<u32, u64>(n::TUNABLES, Array, TUNABLES_MAX),
        // One bucket per pod that sends fragments.
        MapSpec::new::<EndpointKey, u64>(n::FRAG_BUDGET, LruHash, ENDPOINTS_MAX)
            .sized(MapSizing::Follows("max_endpoints")),
        MapSpec::new::<u32, EndpointSlot>(n::ENDPOINT_SLOTS, Array, ENDPOINT_SLOTS_MAX),
        MapSpec::new::<SvcKey, SvcInfo>(n::SVC_FRONTENDS, Hash, SVC_FRONTENDS_MAX)
            .sized(MapSizing::Configured("max_services")),
        MapSpec::new::<SvcBackendKey, SvcBackend>(n::SVC_BACKENDS, Hash, SVC_BACKENDS_MAX)
            .sized(MapSizing::Configured("max_service_backends")),
        MapSpec::new::<SvcAffinityKey, SvcAffinity>(n::SVC_AFFINITY, LruHash, SVC_AFFINITY_MAX),
        // One slot per frontend id; the agent hands ids below `max_services`.
        MapSpec::new::<u32, SvcCounters>(n::SVC_STATS, Array, SVC_IDS_MAX)
            .sized(MapSizing::Follows("max_services")),
        MapSpec::new::<u64, u32>(n::SOCK_NETNS, Hash, ENDPOINTS_MAX)
            .sized(MapSizing::Configured("max_endpoints")),
        MapSpec::new::<PolicyPortLpmKey, u32>(n::POLICY_PORTS, LpmTrie, POLICY_PORTS_MAX)
            .sized(MapSizing::Follows("max_policy_entries")),
        MapSpec::new::<PolicyPeerLpmKey, u32>(n::POLICY_PEERS, LpmTrie, POLICY_PEERS_MAX)
            .sized(MapSizing::Configured("max_policy_entries")),
        MapSpec::new::<FlowKey, FlowState>(n::POLICY_FLOWS, LruHash, POLICY_FLOWS_MAX)
            .sized(MapSizing::Configured("max_policy_flows")),
        MapSpec::new::<u32, [u64; POLICY_SCRATCH_BYTES / 8]>(n::POLICY_SCRATCH, PerCpuArray, 1),
        MapSpec::new::<u32, u64>(n::POLICY_STATS, PerCpuArray, policy_stat::SLOTS),
        // An entry per pod with a limit.
        MapSpec::new::<u32, PodBandwidth>(n::BANDWIDTH, Hash, ENDPOINTS_MAX)
            .sized(MapSizing::Follows("max_endpoints")),
    ]
};

/// The declaration of map `name`, if it is one of [`MAPS`].
pub fn map_spec(name: &str) -> Option<&'static MapSpec> {
    MAPS.iter().find(|m| m.name == name)
}

/// Names of the programs in the object.
pub mod program_names {
    /// TC ingress on each pod's host-side veth: traffic leaving a pod.
    pub const FROM_POD: &str = "from_pod";
    /// TC ingress on the node's uplink: traffic arriving at the node.
    pub const FROM_UPLINK: &str = "from_uplink";
    /// TC egress on the node's host device (`rivet_host`): the node's own
    /// traffic to pods on other nodes.
    pub const FROM_HOST: &str = "from_host";
    /// cgroup connect4: the node's own TCP/UDP sockets connecting to a
    /// hostPort go straight to the pod.
    pub const SOCK_CONNECT4: &str = "sock_connect4";
    /// cgroup sendmsg4: the same for unconnected UDP datagrams.
    pub const SOCK_SENDMSG4: &str = "sock_sendmsg4";
    /// cgroup recvmsg4: answers to those datagrams show the address the
    /// application sent to.
    pub const SOCK_RECVMSG4: &str = "sock_recvmsg4";
    /// cgroup getpeername4: a connected socket's peer shows as the address
    /// the application connected to.
    pub const SOCK_GETPEERNAME4: &str = "sock_getpeername4";
    /// cgroup sock_release: a closing socket's records of translated
    /// destinations go with it.
    pub const SOCK_RELEASE: &str = "sock_release";
    /// The socket hooks, in attach order.
    pub const SOCKET_HOOKS: [&str; 5] = [
        SOCK_CONNECT4,
        SOCK_SENDMSG4,
        SOCK_RECVMSG4,
        SOCK_GETPEERNAME4,
        SOCK_RELEASE,
    ];
}

/// Capacity of the endpoints map (pods per node).
pub const ENDPOINTS_MAX: u32 = 16_384;
/// Slots of the endpoint cache (a power of two): a node's pod subnet up to
/// /18 maps one address per slot, without collisions.
pub const ENDPOINT_SLOTS_MAX: u32 = 16_384;
const _: () = assert!(ENDPOINT_SLOTS_MAX.is_power_of_two());

/// The [`map_names::ENDPOINT_SLOTS`] index of the wire-order address `addr`:
/// its low host-order bits, so consecutive pod addresses take consecutive
/// slots.
#[inline(always)]
pub fn endpoint_slot(addr: u32) -> u32 {
    u32::from_be(addr) & (ENDPOINT_SLOTS_MAX - 1)
}

/// Capacity of the node-local address map.
pub const LOCAL_ADDRS_MAX: u32 = 256;
/// Capacity of the routes map (remote pod subnets).
pub const ROUTES_MAX: u32 = 4096;
/// Capacity of the peers map (other nodes).
pub const PEERS_MAX: u32 = 4096;

/// Default capacity of the NAT map (entries; a flow takes two). The agent
/// may set another size at load (`nat_max_entries`).
pub const NAT_MAX: u32 = 131_072;
/// Capacity of the no-masquerade map.
pub const NO_MASQ_MAX: u32 = 256;
/// Capacity of the hostPort map.
pub const HOSTPORTS_MAX: u32 = 16_384;
/// Size of the event ring buffer (bytes, a power of two).
pub const EVENTS_BYTES: u32 = 1 << 20;

/// A datapath event: a drop (always) or a flow (when turned on).
/// Addresses and ports in wire order.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Event {
    /// [`event_kind`].
    pub kind: u8,
    /// IP protocol (0: not IPv4).
    pub proto: u8,
    /// The [`Counter`] index: drop reason or verdict.
    pub counter: u16,
    /// Interface the packet arrived on.
    pub ifindex: u32,
    /// IPv4 source.
    pub src: u32,
    /// IPv4 destination.
    pub dst: u32,
    /// TCP/UDP source port; ICMP type.
    pub sport: u16,
    /// TCP/UDP destination port; ICMP code.
    pub dport: u16,
    /// Packet length at the hook.
    pub len: u32,
}

/// Kinds of [`Event`].
pub mod event_kind {
    /// The packet was dropped.
    pub const DROP: u8 = 1;
    /// The packet was forwarded or passed (flow events).
    pub const FLOW: u8 = 2;
    /// NetworkPolicy allowed a new flow: `counter` is the direction
    /// (`policy_dir`), `len` the agent's number of the policy that allowed.
    pub const POLICY: u8 = 3;
}

/// Event settings; one entry at index 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct EventConfig {
    /// Flow events: 0 off, 1 every packet, N one packet in N.
    pub flow_sample: u32,
}

/// Capacity of the socket reverse-translation map.
pub const SOCK_REVNAT_MAX: u32 = 65_536;
/// Ports tried, one after the other from a random start, before a new
/// flow is dropped for want of a source port.
pub const NAT_PROBES: u32 = 32;
/// Capacity of the per-pod NAT flow counts (two slots per pod).
pub const NAT_PODS_MAX: u32 = 2 * ENDPOINTS_MAX;
/// A flow that was never answered (no packet came back) and has been idle
/// this long (ns) gives its NAT port to another pod's new flow toward the
/// same destination when every probed port is taken.
pub const NAT_UNANSWERED_REUSE_NS: u64 = 5_000_000_000;

/// Slots of the `TUNABLES` map (fixed, so adding a knob never changes
/// the map's layout or size).
pub const TUNABLES_MAX: u32 = 64;

/// Indexes of the `TUNABLES` map: numeric settings the agent writes and
/// the datapath reads. An index keeps its meaning once released; 0 in a
/// slot means "off" or "the default" as each knob says.
pub mod tunable {
    /// Fragments a pod sends to the node: budget refill rate, bytes per
    /// second (0: no budget). Each fragment costs its length plus
    /// [`crate::FRAG_COST_OVERHEAD`]; a fragment the pod's bucket cannot
    /// pay for is dropped (`drop_frag_budget`), so one pod holds at most
    /// `FRAG_BURST + FRAG_RATE × ipfrag_time` of the node's reassembly
    /// memory.
    pub const FRAG_RATE: u32 = 0;
    /// Fragments a pod sends to the node: bucket depth, bytes.
    pub const FRAG_BURST: u32 = 1;
    /// Nonzero: NetworkPolicy's allow verdicts are written to `EVENTS`
    /// (the agent sets it while a `monitor` client listens; a verdict per
    /// new flow would otherwise wake the agent for nothing).
    pub const POLICY_EVENTS: u32 = 2;
}

/// What a fragment costs in the per-pod budget beyond its length (bytes):
/// the kernel accounts a queued fragment by its buffer's true size
/// (`sk_buff`, shared info, slab rounding) plus its share of the
/// reassembly queue, about 1 KiB more than the frame even for a tiny one.
pub const FRAG_COST_OVERHEAD: u64 = 1024;

/// Bytes VXLAN encapsulation adds: outer IPv4 + UDP + VXLAN + inner Ethernet.
pub const VXLAN_OVERHEAD: u32 = 50;
/// Bytes IPIP encapsulation adds: outer IPv4.
pub const IPIP_OVERHEAD: u32 = 20;

/// Value of the routes map: how to reach a remote pod subnet.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteInfo {
    /// The node owning the subnet, wire order.
    pub node_ip: u32,
    /// One of [`route_mode`].
    pub mode: u32,
}

/// How a route's traffic leaves the node.
pub mod route_mode {
    /// VXLAN (RFC 7348) encapsulation done in BPF.
    pub const VXLAN: u32 = 1;
    /// IP-in-IP (protocol 4) encapsulation done in BPF.
    pub const IPIP: u32 = 2;
    /// No encapsulation: the peer node is the next hop on a shared L2.
    pub const NATIVE: u32 = 3;
}

/// Value of the peers map: a remote node's tunnel endpoint.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    /// MAC of the peer's VTEP (inner Ethernet destination of VXLAN frames).
    pub vtep_mac: [u8; 6],
    /// Reserved, zero.
    pub _pad: [u8; 2],
    /// VNI the peer uses.
    pub vni: u32,
    /// How traffic to the node's own address travels: the [`route_mode`]
    /// of the routes to its pods (a pod reaching another node's address,
    /// its hostPorts or answering its connections goes the way the node's
    /// pods are reached). 0 in entries written before the field existed:
    /// the agent rewrites them at start.
    pub route_mode: u32,
}

/// Key of the endpoints and local-address maps: an IPv4 address in wire order.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EndpointKey {
    /// The address octets as they appear in the packet.
    pub addr: u32,
}

/// A pod attached to this node.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointInfo {
    /// ifindex of the host-side veth in the node's namespace.
    pub ifindex: u32,
    /// [`endpoint_flags`] bits.
    pub flags: u32,
    /// MAC of the pod's own interface (`eth0` inside the pod).
    pub mac: [u8; 6],
    /// MAC of the host-side veth: the pod's gateway MAC.
    pub host_mac: [u8; 6],
}

/// One slot of the endpoint cache: the address it holds (0: empty) and a
/// copy of its [`EndpointInfo`]. Written by the agent after the
/// `ENDPOINTS` entry and cleared before it is removed.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointSlot {
    /// The address held, wire order; 0 when the slot is empty.
    pub addr: u32,
    /// Its endpoint, as in `ENDPOINTS`.
    pub info: EndpointInfo,
}

/// Bits of [`EndpointInfo::flags`].
pub mod endpoint_flags {
    /// The endpoint is fully plumbed and may receive traffic.
    pub const READY: u32 = 1;
    /// The endpoint has hostPorts: its packets may be replies to translate.
    pub const HOSTPORTS: u32 = 2;
    /// The endpoint is a backend of a Service reachable at the uplink
    /// (NodePort, external IPs): its packets may be replies to translate.
    pub const SERVICE: u32 = 4;
    /// NetworkPolicy isolates the pod's ingress: traffic to it passes only
    /// when `POLICY_PEERS` allows it, or as part of a known flow.
    pub const POLICY_INGRESS: u32 = 8;
    /// NetworkPolicy isolates the pod's egress.
    pub const POLICY_EGRESS: u32 = 16;
    /// The pod's egress is limited: `BANDWIDTH` holds its bucket
    /// ([`crate::bandwidth_dir::EGRESS`]).
    pub const BANDWIDTH_EGRESS: u32 = 32;
    /// The pod's ingress is limited: `BANDWIDTH` holds its bucket
    /// ([`crate::bandwidth_dir::INGRESS`]).
    pub const BANDWIDTH_INGRESS: u32 = 64;
}

/// Value of the bandwidth map: a pod's buckets, by [`bandwidth_dir`]. A
/// direction without a limit has a zero bucket (and no endpoint flag).
/// The ingress bucket holds the settings only (its qdisc on the host veth
/// shapes; the datapath steers through it); the egress bucket is charged.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PodBandwidth {
    /// Indexed by [`bandwidth_dir`].
    pub buckets: [Bucket; 2],
}

/// Directions of a pod's bandwidth limit (indexes of
/// [`PodBandwidth::buckets`]).
pub mod bandwidth_dir {
    /// Traffic the pod sends: shaped by the pod's `eth0` qdisc, checked
    /// at `from_pod` before any redirect or encapsulation.
    pub const EGRESS: usize = 0;
    /// Traffic to the pod: delivered through the host veth's qdisc.
    pub const INGRESS: usize = 1;
}

/// A token bucket as a GCRA (virtual scheduling), the datapath's check of
/// a pod's egress behind the qdisc that shapes it: a packet of `n` wire
/// bytes costs `n × 10⁹ / rate` ns of [`Bucket::tat`]; it passes while the
/// bucket's debt `tat − now` stays within [`Bucket::depth_ns`], else it is
/// dropped (`drop_bandwidth`). A packet finding no debt always passes (a
/// GSO packet may be larger than the depth; it leaves a debt it pays off
/// at the rate). Written whole by the agent (a new limit starts with a
/// full bucket); the datapath adds to `tat` and the drop counters with
/// atomic adds.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Bucket {
    /// Rate, bytes per second (≥ 1).
    pub rate: u64,
    /// Depth (the burst), as nanoseconds of the rate.
    pub depth_ns: u64,
    /// Theoretical arrival time (`bpf_ktime_get_ns` clock) of the next
    /// packet: the bucket is full when it is at or before now.
    pub tat: u64,
    /// Packets dropped over the limit.
    pub dropped_packets: u64,
    /// Wire bytes dropped over the limit.
    pub dropped_bytes: u64,
    /// Wire bytes passed.
    pub passed_bytes: u64,
}

/// Node-wide settings read by every program; one entry at index 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct NodeConfig {
    /// Gateway address the pods route through (169.254.1.1 by default), wire order.
    pub gateway: u32,
    /// The node's primary address (on its uplink), wire order; 0 if unknown.
    pub node_ip: u32,
    /// Pod CIDR of this node, network address in wire order.
    pub pod_cidr: u32,
    /// Prefix length of [`NodeConfig::pod_cidr`].
    pub pod_prefix_len: u32,
    /// [`config_flags`] bits.
    pub flags: u32,
    /// ifindex of the uplink (0: none).
    pub uplink_ifindex: u32,
    /// ifindex of the host device `rivet_host` (0: none).
    pub host_ifindex: u32,
    /// VXLAN network identifier.
    pub vni: u32,
    /// VXLAN UDP port, host order.
    pub vxlan_port: u32,
    /// MTU of the uplink.
    pub uplink_mtu: u32,
    /// MAC used as this node's VTEP (inner Ethernet source of VXLAN frames).
    pub vtep_mac: [u8; 6],
    /// MAC of `rivet_host` (destination MAC of traffic delivered to the node).
    pub host_mac: [u8; 6],
}

/// Bits of [`NodeConfig::flags`].
pub mod config_flags {
    /// The agent has written this configuration (a zeroed entry means "not configured").
    pub const CONFIGURED: u32 = 1;
}

/// Key of the NAT map: a flow as the packet shows it. Addresses and ports
/// in wire order. ICMP echo uses the identifier as the port of the side
/// that chose it (`sport` going out, `dport` coming back) and 0 for the
/// other.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NatKey {
    /// Source address.
    pub src: u32,
    /// Destination address.
    pub dst: u32,
    /// Source port (wire order).
    pub sport: u16,
    /// Destination port (wire order).
    pub dport: u16,
    /// IP protocol (6, 17, 1).
    pub proto: u8,
    /// [`nat_dir`]: which way this entry translates.
    pub dir: u8,
    /// Reserved, zero.
    pub _pad: [u8; 2],
}

/// Settings of the socket hooks; one entry at index 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SockConfig {
    /// Cookie of the node's network namespace (`SO_NETNS_COOKIE`): the
    /// hooks are attached to a cgroup shared with other namespaces and
    /// touch only sockets of this one. 0: off.
    pub netns_cookie: u64,
}

/// Key of the socket reverse-translation map: a socket (its cookie) and the
/// pod address it was sent to instead (wire order). Address and port 0: an
/// unconnected socket's last such destination (the value holds it), what
/// `sock_release` removes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SockRevKey {
    /// `bpf_get_socket_cookie`.
    pub cookie: u64,
    /// The pod's address.
    pub addr: u32,
    /// The container port.
    pub port: u16,
    /// Reserved, zero.
    pub _pad: u16,
}

/// Value of the socket reverse-translation map: what the application asked
/// for (wire order).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SockRevTarget {
    /// Node address or loopback address.
    pub addr: u32,
    /// The hostPort.
    pub port: u16,
    /// Reserved, zero.
    pub _pad: u16,
}

/// Key of the hostPort map: a node address (0: every node address), a
/// port and a protocol, as a packet addressed to the node shows them.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HostPortKey {
    /// Node address (wire order), or 0 for any of the node's addresses.
    pub addr: u32,
    /// Port on the node (wire order).
    pub port: u16,
    /// IP protocol (6 or 17).
    pub proto: u8,
    /// Reserved, zero.
    pub _pad: u8,
}

/// Where a hostPort leads.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostPortTarget {
    /// The pod's address (wire order).
    pub pod_ip: u32,
    /// The container port (wire order).
    pub port: u16,
    /// Reserved, zero.
    pub _pad: [u8; 2],
}

impl NatKey {
    /// A key; `dir` is one of [`nat_dir`].
    pub const fn new(src: u32, dst: u32, (sport, dport): (u16, u16), proto: u8, dir: u8) -> Self {
        Self {
            src,
            dst,
            sport,
            dport,
            proto,
            dir,
            _pad: [0; 2],
        }
    }
}

/// Key of the per-pod NAT flow counts (`NAT_PODS`): a pod address (wire
/// order) and a [`nat_pod_slot`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NatPodKey {
    /// The pod's address (wire order).
    pub addr: u32,
    /// [`nat_pod_slot`].
    pub slot: u32,
}

/// Slots of a pod in `NAT_PODS`. The pod's live masqueraded flows are
/// `FLOWS + ADJUST` (wrapping, read as signed): the datapath adds one per
/// flow it creates and subtracts one per flow of the pod another flow takes
/// over (atomic adds, never a whole-value write); the collector, which sees
/// the table as it is (flows expired, or evicted by the LRU), writes
/// `ADJUST` so that the sum equals its recount — each side writes its own
/// slot only, so no update is lost.
pub mod nat_pod_slot {
    /// The datapath's running count (wrapping `u64`).
    pub const FLOWS: u32 = 0;
    /// The collector's correction (wrapping `u64`).
    pub const ADJUST: u32 = 1;
}

/// Slots of the `NAT_STATS` map.
pub mod nat_stat {
    /// Entries the datapath created in `NAT` (ever). With the collector's
    /// removals and the live count this gives the LRU evictions.
    pub const CREATED: u32 = 0;
    /// Unanswered flows of one pod whose NAT port went to another pod's
    /// new flow toward the same destination (ever).
    pub const UNANSWERED_TAKEN: u32 = 1;
    /// Slots in the map.
    pub const SLOTS: u32 = 4;
}

/// Directions of [`NatKey::dir`].
pub mod nat_dir {
    /// The pod's own tuple: rewrite the source to (node IP, NAT port).
    pub const EGRESS: u8 = 0;
    /// The reply's tuple (remote → node IP, NAT port): rewrite the
    /// destination back to the pod.
    pub const REPLY: u8 = 1;
    /// A hostPort connection's reply as the pod sends it (pod → client):
    /// rewrite the source back to the node address and hostPort.
    pub const DNAT: u8 = 2;
    /// A Service flow at the uplink as the client sends it (client →
    /// frontend): the backend chosen for it, so every packet of the flow
    /// goes to the same one whichever CPU takes it.
    pub const SVC: u8 = 3;
}

/// Value of the NAT map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct NatEntry {
    /// The address to write: the node IP (egress) or the pod IP (reply).
    pub addr: u32,
    /// The port to write (wire order): the NAT port or the pod's port.
    pub port: u16,
    /// [`nat_flags`] seen in this direction.
    pub flags: u16,
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) of the last packet, refreshed
    /// at most once a second (at once when a TCP flag is new).
    pub last_seen: u64,
    /// TCP timestamps of a masqueraded flow (both entries): added to the
    /// pod's TSval going out, taken from the TSecr coming back, so the
    /// remote sees the node's one clock (see [`NatConfig::ts_base`]).
    pub ts_delta: u32,
    /// Zero.
    pub _pad: u32,
}

/// Bits of [`NatEntry::flags`].
pub mod nat_flags {
    /// A TCP SYN went this way.
    pub const SYN: u16 = 1;
    /// A TCP FIN went this way.
    pub const FIN: u16 = 2;
    /// A TCP RST went this way.
    pub const RST: u16 = 4;
    /// A packet went this way after the flow was created (on the reply
    /// entry: the flow was answered).
    pub const SEEN: u16 = 8;
    /// A TCP FIN from the pod (hostPort entries, which serve both
    /// directions: `FIN` is the client's).
    pub const FIN_POD: u16 = 16;
}

/// Masquerade settings; one entry at index 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct NatConfig {
    /// [`nat_config_flags`] bits.
    pub flags: u32,
    /// First source port for masqueraded flows (host order).
    pub port_min: u16,
    /// Last source port (host order), inclusive.
    pub port_max: u16,
    /// The node's TCP timestamp clock for masqueraded flows: milliseconds
    /// of CLOCK_MONOTONIC plus this random base (kept across restarts). A
    /// remote server then sees timestamps that only grow on every NAT
    /// tuple, whichever pod used it before, so its TIME_WAIT socket
    /// accepts the next connection's SYN (PAWS) — Linux gives every
    /// connection its own random offset.
    pub ts_base: u32,
}

/// NAT limits; one entry at index 0. A map of its own rather than more
/// fields in [`NatConfig`], whose layout pinned maps of earlier releases
/// hold: an upgrade adds this map and keeps every flow and the timestamp
/// base.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct NatLimits {
    /// Masqueraded flows one pod may hold at a time (0: no limit); a new
    /// flow past it is dropped (`drop_nat_quota`), so one pod cannot flush
    /// the others' flows out of the LRU table.
    pub max_per_pod: u32,
}

/// Bits of [`NatConfig::flags`].
pub mod nat_config_flags {
    /// Masquerade pod traffic leaving the cluster.
    pub const MASQUERADE: u32 = 1;
}

/// One counter: packets and bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct StatsEntry {
    /// Packets counted.
    pub packets: u64,
    /// Bytes counted (skb length at the hook).
    pub bytes: u64,
}

/// Number of slots in the stats map; [`Counter`] values are below this.
pub const COUNTERS_MAX: u32 = 64;

/// What a [`Counter`] says happened to a packet; each counter belongs to
/// exactly one family ([`Counter::family`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CounterFamily {
    /// The datapath sent or delivered the packet itself: redirected to a
    /// pod or `rivet_host`, encapsulated, decapsulated, translated.
    Forward,
    /// Handed to the kernel stack, or answered in BPF.
    Pass,
    /// Dropped (the values from [`Counter::FIRST_DROP`] on).
    Drop,
}

impl CounterFamily {
    /// Every family.
    pub const ALL: [CounterFamily; 3] = [
        CounterFamily::Forward,
        CounterFamily::Pass,
        CounterFamily::Drop,
    ];
}

/// Everything a program decides is counted under exactly one of these.
///
/// Values below [`Counter::FIRST_DROP`] are verdicts that let the packet live;
/// values from it on are drop reasons. Values never change meaning once
/// released (the stats map survives agent upgrades).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Counter {
    /// Delivered to a pod on this node with `bpf_redirect_peer`.
    FwdLocal = 0,
    /// Addressed to the node itself: passed to the host stack.
    PassHost = 1,
    /// Not handled by rivet (yet): passed to the host stack.
    PassOther = 2,
    /// ARP request for the gateway answered in BPF.
    ArpReply = 3,
    /// Valid ARP reply from a pod, passed to the host stack.
    ArpPass = 4,
    /// TTL would reach 0: passed to the stack, which sends ICMP time-exceeded.
    PassTtl = 5,
    /// Seen on the uplink and passed to the stack.
    UplinkPass = 6,
    /// Sent to a remote node in VXLAN.
    FwdEncapVxlan = 7,
    /// Sent to a remote node in IPIP.
    FwdEncapIpip = 8,
    /// Sent to a remote node natively (next hop = the node).
    FwdNative = 9,
    /// VXLAN from a peer, decapsulated and delivered to a pod.
    DecapVxlan = 10,
    /// IPIP from a peer, decapsulated and delivered to a pod.
    DecapIpip = 11,
    /// A peer's pod traffic (native) delivered to a local pod.
    FwdFromPeer = 12,
    /// Remote pod traffic for the node itself, delivered to `rivet_host`.
    DeliverHost = 13,
    /// A too-big packet answered with ICMP fragmentation-needed.
    IcmpFragNeeded = 14,
    /// The node's own packet for a remote pod, passed (no route).
    HostPass = 15,
    /// Pod traffic leaving the cluster, masqueraded to the node IP and sent.
    FwdSnat = 16,
    /// A reply to a masqueraded flow, translated back and delivered to the pod.
    RevSnat = 17,
    /// Addressed to the node in the NAT port range without NAT state
    /// (expired or evicted flow, or the node's own socket): passed.
    PassNatNoState = 18,
    /// Addressed to a hostPort: destination rewritten to the pod, delivered.
    FwdDnat = 19,
    /// A pod's reply on a hostPort connection: source restored, sent.
    RevDnat = 20,
    /// Addressed to a Service frontend at the uplink (NodePort, external
    /// IP): destination rewritten to a local backend, delivered.
    FwdSvc = 21,

    /// Frame shorter than its Ethernet/ARP/IPv4 headers, or a datagram
    /// (first fragment or whole) shorter than its TCP/UDP/ICMP header.
    DropTruncated = 32,
    /// IPv4 header invalid: version, IHL < 5, or total length beyond the frame.
    DropBadIpHeader = 33,
    /// Source IPv4 address is not the sending endpoint's.
    DropSpoofedIp = 34,
    /// Source MAC is not the sending endpoint's.
    DropSpoofedMac = 35,
    /// ARP whose sender is not the endpoint, or gratuitous ARP.
    DropArpSpoofed = 36,
    /// ARP that rivet does not answer (other target, other operation, not Ethernet/IPv4).
    DropArpUnsupported = 37,
    /// Ethertype other than IPv4 and ARP from a pod.
    DropUnsupportedL3 = 38,
    /// The agent has not configured the node yet.
    DropNotConfigured = 39,
    /// Tunnel packet from an address that is not a known node.
    DropTunnelUnknownPeer = 40,
    /// VXLAN with a wrong VNI or flags.
    DropTunnelBadVni = 41,
    /// Tunnel packet too short, truncated inner packet (or inner transport
    /// header), outer/UDP lengths that do not hold it, fragmented or with options.
    DropTunnelMalformed = 42,
    /// Decapsulated packet for an address that is neither a local pod nor the node.
    DropTunnelNoEndpoint = 43,
    /// A pod sent VXLAN/IPIP to a node address (tunnel injection).
    DropTunnelFromPod = 44,
    /// No route to the peer node in the FIB.
    DropNoRoute = 45,
    /// The kernel refused to add or remove tunnel headers.
    DropEncapFailed = 46,
    /// Too big for the uplink and the ICMP answer could not be built.
    DropTooBig = 47,
    /// Masquerade needed but every probed source port was taken.
    DropNatNoPort = 48,
    /// Masquerade needed but the packet cannot be translated (protocol
    /// other than TCP/UDP/ICMP echo, or a fragment): never sent with the
    /// pod's address.
    DropNatUnsupported = 49,
    /// The NAT map refused a new entry.
    DropNatInsertFailed = 50,
    /// Rewriting the packet for NAT failed.
    DropNatRewrite = 51,
    /// Masquerade needed but the pod already holds its quota of NAT flows
    /// (`nat_max_per_pod`).
    DropNatQuota = 52,
    /// An IPv4 fragment to the node beyond the sending pod's fragment
    /// budget (`frag_budget_rate`, `frag_budget_burst`): it would hold the
    /// node's shared reassembly memory.
    DropFragBudget = 53,
    /// Masquerade needed for an ICMP message from a pod that is neither
    /// an echo request nor an error about a flow the NAT knows (an echo
    /// reply, an error about an unknown flow, another type): it starts no
    /// flow and answers none, so it is never sent with the pod's address.
    DropNatIcmpUnknown = 54,
    /// Addressed to a Service frontend with no backend: answered with ICMP
    /// port unreachable, as kube-proxy's REJECT — or, with a `Local`
    /// policy and backends only on other nodes, dropped without an answer
    /// (kube-proxy's rule: a load balancer's health check steers clients).
    DropSvcNoBackend = 55,
    /// Addressed to a Service frontend whose chosen backend cannot be
    /// reached from here (not a ready local endpoint).
    DropSvcBackendUnreachable = 56,
    /// To a pod whose ingress NetworkPolicy isolates, from a peer, port
    /// and protocol no rule allows, and not part of a known flow.
    DropPolicyIngress = 57,
    /// From a pod whose egress NetworkPolicy isolates, to a peer, port and
    /// protocol no rule allows, and not part of a known flow.
    DropPolicyEgress = 58,
    /// Sent by a pod beyond its egress bandwidth limit, around the qdisc
    /// that shapes it (the pod's bucket in `BANDWIDTH` counts them too).
    DropBandwidth = 59,
}

impl Counter {
    /// First drop reason.
    pub const FIRST_DROP: u32 = 32;

    /// Every counter, in index order.
    pub const ALL: [Counter; 50] = [
        Counter::FwdLocal,
        Counter::PassHost,
        Counter::PassOther,
        Counter::ArpReply,
        Counter::ArpPass,
        Counter::PassTtl,
        Counter::UplinkPass,
        Counter::FwdEncapVxlan,
        Counter::FwdEncapIpip,
        Counter::FwdNative,
        Counter::DecapVxlan,
        Counter::DecapIpip,
        Counter::FwdFromPeer,
        Counter::DeliverHost,
        Counter::IcmpFragNeeded,
        Counter::HostPass,
        Counter::FwdSnat,
        Counter::RevSnat,
        Counter::PassNatNoState,
        Counter::FwdDnat,
        Counter::RevDnat,
        Counter::FwdSvc,
        Counter::DropTruncated,
        Counter::DropBadIpHeader,
        Counter::DropSpoofedIp,
        Counter::DropSpoofedMac,
        Counter::DropArpSpoofed,
        Counter::DropArpUnsupported,
        Counter::DropUnsupportedL3,
        Counter::DropNotConfigured,
        Counter::DropTunnelUnknownPeer,
        Counter::DropTunnelBadVni,
        Counter::DropTunnelMalformed,
        Counter::DropTunnelNoEndpoint,
        Counter::DropTunnelFromPod,
        Counter::DropNoRoute,
        Counter::DropEncapFailed,
        Counter::DropTooBig,
        Counter::DropNatNoPort,
        Counter::DropNatUnsupported,
        Counter::DropNatInsertFailed,
        Counter::DropNatRewrite,
        Counter::DropNatQuota,
        Counter::DropFragBudget,
        Counter::DropNatIcmpUnknown,
        Counter::DropSvcNoBackend,
        Counter::DropSvcBackendUnreachable,
        Counter::DropPolicyIngress,
        Counter::DropPolicyEgress,
        Counter::DropBandwidth,
    ];

    /// Index in the stats map.
    pub const fn index(self) -> u32 {
        self as u32
    }

    /// True when the packet was dropped.
    pub const fn is_drop(self) -> bool {
        self.index() >= Self::FIRST_DROP
    }

    /// The counter's stable snake_case name (used by `rivetctl`, metrics
    /// and logs) and its family, stated together.
    const fn describe(self) -> (&'static str, CounterFamily) {
        use CounterFamily::{Drop, Forward, Pass};
        match self {
            Counter::FwdLocal => ("fwd_local", Forward),
            Counter::PassHost => ("pass_host", Pass),
            Counter::PassOther => ("pass_other", Pass),
            Counter::ArpReply => ("arp_reply", Pass),
            Counter::ArpPass => ("arp_pass", Pass),
            Counter::PassTtl => ("pass_ttl_exceeded", Pass),
            Counter::UplinkPass => ("uplink_pass", Pass),
            Counter::FwdEncapVxlan => ("fwd_encap_vxlan", Forward),
            Counter::FwdEncapIpip => ("fwd_encap_ipip", Forward),
            Counter::FwdNative => ("fwd_native", Forward),
            Counter::DecapVxlan => ("decap_vxlan", Forward),
            Counter::DecapIpip => ("decap_ipip", Forward),
            Counter::FwdFromPeer => ("fwd_from_peer", Forward),
            Counter::DeliverHost => ("deliver_host", Forward),
            Counter::IcmpFragNeeded => ("icmp_frag_needed", Pass),
            Counter::HostPass => ("host_pass", Pass),
            Counter::FwdSnat => ("fwd_snat", Forward),
            Counter::RevSnat => ("rev_snat", Forward),
            Counter::PassNatNoState => ("pass_nat_no_state", Pass),
            Counter::FwdDnat => ("fwd_dnat", Forward),
            Counter::RevDnat => ("rev_dnat", Forward),
            Counter::FwdSvc => ("fwd_svc", Forward),
            Counter::DropTruncated => ("drop_truncated", Drop),
            Counter::DropBadIpHeader => ("drop_bad_ip_header", Drop),
            Counter::DropSpoofedIp => ("drop_spoofed_ip", Drop),
            Counter::DropSpoofedMac => ("drop_spoofed_mac", Drop),
            Counter::DropArpSpoofed => ("drop_arp_spoofed", Drop),
            Counter::DropArpUnsupported => ("drop_arp_unsupported", Drop),
            Counter::DropUnsupportedL3 => ("drop_unsupported_l3", Drop),
            Counter::DropNotConfigured => ("drop_not_configured", Drop),
            Counter::DropTunnelUnknownPeer => ("drop_tunnel_unknown_peer", Drop),
            Counter::DropTunnelBadVni => ("drop_tunnel_bad_vni", Drop),
            Counter::DropTunnelMalformed => ("drop_tunnel_malformed", Drop),
            Counter::DropTunnelNoEndpoint => ("drop_tunnel_no_endpoint", Drop),
            Counter::DropTunnelFromPod => ("drop_tunnel_from_pod", Drop),
            Counter::DropNoRoute => ("drop_no_route", Drop),
            Counter::DropEncapFailed => ("drop_encap_failed", Drop),
            Counter::DropTooBig => ("drop_too_big", Drop),
            Counter::DropNatNoPort => ("drop_nat_no_port", Drop),
            Counter::DropNatUnsupported => ("drop_nat_unsupported", Drop),
            Counter::DropNatInsertFailed => ("drop_nat_insert_failed", Drop),
            Counter::DropNatRewrite => ("drop_nat_rewrite", Drop),
            Counter::DropNatQuota => ("drop_nat_quota", Drop),
            Counter::DropFragBudget => ("drop_frag_budget", Drop),
            Counter::DropNatIcmpUnknown => ("drop_nat_icmp_unknown", Drop),
            Counter::DropSvcNoBackend => ("drop_svc_no_backend", Drop),
            Counter::DropSvcBackendUnreachable => ("drop_svc_backend_unreachable", Drop),
            Counter::DropPolicyIngress => ("drop_policy_ingress", Drop),
            Counter::DropPolicyEgress => ("drop_policy_egress", Drop),
            Counter::DropBandwidth => ("drop_bandwidth", Drop),
        }
    }

    /// Stable snake_case name, used by `rivetctl`, metrics and logs.
    pub const fn name(self) -> &'static str {
        self.describe().0
    }

    /// What happened to the packet: the family the counter belongs to
    /// (its metric).
    pub const fn family(self) -> CounterFamily {
        self.describe().1
    }

    /// The counter called `name`, if any.
    pub fn from_name(name: &str) -> Option<Counter> {
        Counter::ALL.iter().copied().find(|c| c.name() == name)
    }

    /// The counter at `index`, if any.
    pub fn from_index(index: u32) -> Option<Counter> {
        Counter::ALL.iter().copied().find(|c| c.index() == index)
    }
}

/// Wire-order key of an address given as octets (userspace side of the contract).
pub const fn ipv4_key(octets: [u8; 4]) -> u32 {
    u32::from_ne_bytes(octets)
}

/// Octets of a wire-order key.
pub const fn ipv4_from_key(key: u32) -> [u8; 4] {
    key.to_ne_bytes()
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of these are #[repr(C)], Copy, made only of integers and
    // byte arrays, and have no implicit padding (checked by the size asserts below).
    unsafe impl aya::Pod for super::EndpointKey {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::EndpointInfo {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::EndpointSlot {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::NodeConfig {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::StatsEntry {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::RouteInfo {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::PeerInfo {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::NatKey {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::NatEntry {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::NatConfig {}
    // SAFETY: repr(C), one u32, no padding.
    unsafe impl aya::Pod for super::NatLimits {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::HostPortKey {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::HostPortTarget {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::SockConfig {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::SockRevKey {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::SockRevTarget {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::Event {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::EventConfig {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::NatPodKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SvcKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SvcInfo {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SvcBackendKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SvcBackend {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SvcAffinityKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SvcAffinity {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SvcCounters {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::PolicyPortKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::PolicyPeerKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::FlowKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::FlowState {}
    // SAFETY: repr(C), only integers, no padding (six u64 per bucket).
    unsafe impl aya::Pod for super::PodBandwidth {}
}

// No implicit padding: the sizes are the sums of the fields.
const _: () = assert!(core::mem::size_of::<EndpointKey>() == 4);
const _: () = assert!(core::mem::size_of::<EndpointInfo>() == 4 + 4 + 6 + 6);
const _: () = assert!(core::mem::size_of::<EndpointSlot>() == 4 + 20);
const _: () = assert!(core::mem::size_of::<NodeConfig>() == 10 * 4 + 12);
const _: () = assert!(core::mem::size_of::<RouteInfo>() == 8);
const _: () = assert!(core::mem::size_of::<PeerInfo>() == 16);
const _: () = assert!(core::mem::size_of::<StatsEntry>() == 16);
const _: () = assert!(core::mem::size_of::<NatKey>() == 16);
const _: () = assert!(core::mem::size_of::<NatEntry>() == 24);
const _: () = assert!(core::mem::size_of::<NatConfig>() == 12);
const _: () = assert!(core::mem::size_of::<NatLimits>() == 4);
const _: () = assert!(core::mem::size_of::<NatPodKey>() == 8);
const _: () = assert!(core::mem::size_of::<HostPortKey>() == 8);
const _: () = assert!(core::mem::size_of::<HostPortTarget>() == 8);
const _: () = assert!(core::mem::size_of::<SockConfig>() == 8);
const _: () = assert!(core::mem::size_of::<SockRevKey>() == 16);
const _: () = assert!(core::mem::size_of::<SockRevTarget>() == 8);
const _: () = assert!(core::mem::size_of::<Event>() == 24);
const _: () = assert!(core::mem::size_of::<EventConfig>() == 4);
const _: () = assert!(core::mem::size_of::<SvcKey>() == 8);
const _: () = assert!(core::mem::size_of::<SvcInfo>() == 24);
const _: () = assert!(core::mem::size_of::<SvcBackendKey>() == 8);
const _: () = assert!(core::mem::size_of::<SvcBackend>() == 8);
const _: () = assert!(core::mem::size_of::<SvcAffinityKey>() == 16);
const _: () = assert!(core::mem::size_of::<SvcAffinity>() == 24);
const _: () = assert!(core::mem::size_of::<SvcCounters>() == 32);
const _: () = assert!(core::mem::size_of::<PolicyPortKey>() == 8);
const _: () = assert!(core::mem::size_of::<PolicyPeerKey>() == 12);
const _: () = assert!(core::mem::size_of::<FlowKey>() == 16);
const _: () = assert!(core::mem::size_of::<FlowState>() == 8);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_unique_and_in_range() {
        for (i, a) in Counter::ALL.iter().enumerate() {
            assert!(a.index() < COUNTERS_MAX);
            assert_eq!(Counter::from_index(a.index()), Some(*a));
            for b in &Counter::ALL[i + 1..] {
                assert_ne!(a.index(), b.index());
                assert_ne!(a.name(), b.name());
            }
        }
    }

    #[test]
    fn every_counter_has_one_family_and_drops_are_the_drop_family() {
        for family in CounterFamily::ALL {
            assert!(
                Counter::ALL.iter().any(|c| c.family() == family),
                "{family:?} has no counter"
            );
        }
        for c in Counter::ALL {
            let families: usize = CounterFamily::ALL
                .iter()
                .filter(|f| **f == c.family())
                .count();
            assert_eq!(families, 1, "{c:?}");
            assert_eq!(c.family() == CounterFamily::Drop, c.is_drop(), "{c:?}");
            assert_eq!(c.name().starts_with("drop_"), c.is_drop(), "{c:?}");
            if c.name().starts_with("fwd_") {
                assert_eq!(c.family(), CounterFamily::Forward, "{c:?}");
            }
            assert_eq!(Counter::from_name(c.name()), Some(c));
        }
        assert_eq!(Counter::from_name("no_such_counter"), None);
    }

    #[test]
    fn maps_are_declared_once() {
        for (i, a) in MAPS.iter().enumerate() {
            assert_eq!(map_names::ALL[i], a.name);
            assert_eq!(map_spec(a.name), Some(a));
            assert!(a.max_entries > 0, "{}", a.name);
            assert_eq!(
                a.kind == MapKind::RingBuf,
                a.key_size == 0 && a.value_size == 0,
                "{}",
                a.name
            );
            assert_eq!(MapKind::from_raw(a.kind as u32), Some(a.kind));
            for b in &MAPS[i + 1..] {
                assert_ne!(a.name, b.name);
            }
        }
        assert_eq!(map_spec("NO_SUCH_MAP"), None);
    }

    #[test]
    fn drops_are_drops() {
        assert!(!Counter::FwdLocal.is_drop());
        assert!(Counter::DropSpoofedIp.is_drop());
    }

    #[test]
    fn endpoint_slots_follow_the_low_host_bits() {
        assert_eq!(endpoint_slot(ipv4_key([10, 244, 1, 2])), 0x0102);
        assert_eq!(endpoint_slot(ipv4_key([10, 244, 1, 3])), 0x0103);
        // A /18 maps without collisions; the next /18 wraps around.
        assert_eq!(endpoint_slot(ipv4_key([10, 244, 63, 255])), 0x3fff);
        assert_eq!(endpoint_slot(ipv4_key([10, 244, 64, 0])), 0);
    }

    #[test]
    fn ipv4_keys_are_wire_order() {
        let k = ipv4_key([10, 244, 1, 2]);
        assert_eq!(k.to_ne_bytes(), [10, 244, 1, 2]);
        assert_eq!(ipv4_from_key(k), [10, 244, 1, 2]);
    }
}
