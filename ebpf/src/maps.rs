//! Every map of the datapath. Types and capacities come from `rivet-common`;
//! userspace pins all of them under the node's pin directory. Addresses are
//! `u32` in wire order.
//!
//! The endpoint cache: every endpoint lookup of the programs ([`endpoint`]:
//! anti-spoof, local delivery, decap delivery, DNAT, socket hooks) reads
//! `ENDPOINT_SLOTS[endpoint_slot(addr)]` (the address's low 14 host-order bits)
//! first, an array lookup the verifier inlines into a few instructions, and
//! uses it only if the slot names `addr` (and a nonzero ifindex); otherwise it
//! asks the `ENDPOINTS` hash (a helper call and a jhash, 23–53 ns). A node's
//! pod subnet up to /18 maps one address per slot; addresses from elsewhere
//! (delegated IPAM) that collide keep out of an occupied slot and are served by
//! the hash. The agent keeps the slots behind the hash (write order:
//! `rivet::datapath` maps/endpoints.rs). Measured: local redirect 125 → 64 ns
//! per packet net of the empty program (72 with 16,000 other endpoints and
//! 64,000 NAT entries), BENCHMARKS.md.
//!
//! The two tables written for every new connection, `NAT` and
//! `POLICY_FLOWS`, keep one LRU list per CPU ([`PER_CPU_LRU`]). With the
//! kernel's common list, every 128th insert on a CPU refills that CPU's free
//! nodes under the table's global lock, scanning and moving ~400 cold nodes
//! (tens of µs): measured as the connect p99 of a NodePort growing 63 → 96 µs
//! within a run, and 67–75 µs with per-CPU lists (BENCHMARKS.md, services).
//! The cost: each CPU recycles only the entries it created, so a CPU's share
//! of the table is `max_entries / possible CPUs` (the per-pod NAT quota's
//! default follows it). The socket-hook tables keep the common list: there a
//! per-CPU list made `connect4` slower (1,340–1,550 ns against ~500).

use aya_ebpf::{
    bindings::{BPF_F_NO_COMMON_LRU, BPF_NOEXIST},
    macros::map,
    maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, RingBuf, lpm_trie::Key},
};
use rivet_common::{
    COUNTERS_MAX, ENDPOINT_SLOTS_MAX, ENDPOINTS_MAX, EVENTS_BYTES, EndpointInfo, EndpointKey,
    EndpointSlot, EventConfig, HOSTPORTS_MAX, HostPortKey, HostPortTarget, LOCAL_ADDRS_MAX,
    NAT_MAX, NAT_PODS_MAX, NO_MASQ_MAX, NatConfig, NatEntry, NatKey, NatLimits, NatPodKey,
    NodeConfig, PEERS_MAX, PeerInfo, ROUTES_MAX, RouteInfo, SOCK_REVNAT_MAX, SVC_AFFINITY_MAX,
    SVC_BACKENDS_MAX, SVC_FRONTENDS_MAX, SVC_IDS_MAX, SockConfig, SockRevKey, SockRevTarget,
    StatsEntry, SvcAffinity, SvcAffinityKey, SvcBackend, SvcBackendKey, SvcCounters, SvcInfo,
    SvcKey, nat_config_flags, nat_pod_slot,
};
use rivet_common::{
    FlowKey, FlowState, POLICY_FLOWS_MAX, POLICY_PEERS_MAX, POLICY_PORTS_MAX, POLICY_SCRATCH_BYTES,
    PolicyPeerKey, PolicyPortKey,
};

/// Pods on this node, by IPv4 address.
#[map]
pub static ENDPOINTS: HashMap<EndpointKey, EndpointInfo> =
    HashMap::with_max_entries(ENDPOINTS_MAX, 0);

/// A direct-mapped cache of `ENDPOINTS` indexed by the address's low
/// bits: an array lookup the verifier inlines (a few instructions) where
/// the hash costs a helper call and a jhash. A slot that does not name the
/// address looked up sends the lookup to `ENDPOINTS`, the truth.
#[map]
pub static ENDPOINT_SLOTS: Array<EndpointSlot> = Array::with_max_entries(ENDPOINT_SLOTS_MAX, 0);

/// Addresses that belong to the node itself.
#[map]
pub static LOCAL_ADDRS: HashMap<EndpointKey, u32> = HashMap::with_max_entries(LOCAL_ADDRS_MAX, 0);

/// Remote pod subnets → the node that owns them and how to reach it.
#[map]
pub static ROUTES: LpmTrie<u32, RouteInfo> = LpmTrie::with_max_entries(ROUTES_MAX, 0);

/// Other nodes: tunnel endpoint parameters, by node IP.
#[map]
pub static PEERS: HashMap<EndpointKey, PeerInfo> = HashMap::with_max_entries(PEERS_MAX, 0);

/// Node configuration at index 0.
#[map]
pub static CONFIG: Array<NodeConfig> = Array::with_max_entries(1, 0);

/// Per-CPU packet/byte counters indexed by `rivet_common::Counter`.
#[map]
pub static STATS: PerCpuArray<StatsEntry> = PerCpuArray::with_max_entries(COUNTERS_MAX, 0);

/// LRU tables that keep a list per CPU (module docs).
const PER_CPU_LRU: u32 = BPF_F_NO_COMMON_LRU;

/// Masqueraded flows, both directions (LRU: a full table recycles the
/// least recently used flows; the agent's GC expires idle ones first).
#[map]
pub static NAT: LruHashMap<NatKey, NatEntry> = LruHashMap::with_max_entries(NAT_MAX, PER_CPU_LRU);

/// Masquerade settings at index 0.
#[map]
pub static NAT_CONFIG: Array<NatConfig> = Array::with_max_entries(1, 0);

/// NAT limits at index 0 (the per-pod quota).
#[map]
pub static NAT_LIMITS: Array<NatLimits> = Array::with_max_entries(1, 0);

/// The per-pod flow quota (0: none).
#[inline(always)]
pub fn nat_max_per_pod() -> u32 {
    NAT_LIMITS.get(0).map_or(0, |l| l.max_per_pod)
}

/// Destinations never masqueraded (the cluster CIDR and the configured list).
#[map]
pub static NO_MASQ: LpmTrie<u32, u32> = LpmTrie::with_max_entries(NO_MASQ_MAX, 0);

/// hostPorts of the node's pods.
#[map]
pub static HOSTPORTS: HashMap<HostPortKey, HostPortTarget> =
    HashMap::with_max_entries(HOSTPORTS_MAX, 0);

/// Drop and flow events for the agent (`rivetctl monitor`).
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTES, 0);

/// Event settings at index 0 (flow events off unless the agent says).
#[map]
pub static EVENT_CONFIG: Array<EventConfig> = Array::with_max_entries(1, 0);

/// The socket hooks' settings at index 0.
#[map]
pub static SOCK_CONFIG: Array<SockConfig> = Array::with_max_entries(1, 0);

/// Sockets of the node sent to a pod instead of a hostPort: what they
/// asked for (LRU: entries of closed sockets age out).
#[map]
pub static SOCK_REVNAT: LruHashMap<SockRevKey, SockRevTarget> =
    LruHashMap::with_max_entries(SOCK_REVNAT_MAX, 0);

/// The hostPort target for `port`/`proto` on the node address `addr` (a
/// mapping for that address first, then one for every address).
#[inline(always)]
pub fn hostport(addr: u32, port: u16, proto: u8) -> Option<HostPortTarget> {
    let key = |addr| HostPortKey {
        addr,
        port,
        proto,
        _pad: 0,
    };
    // SAFETY: entries are replaced whole by the agent (see `endpoint`).
    unsafe { HOSTPORTS.get(key(addr)).or_else(|| HOSTPORTS.get(key(0))) }.copied()
}

/// NAT table bookkeeping, indexed by `rivet_common::nat_stat`.
#[map]
pub static NAT_STATS: PerCpuArray<u64> =
    PerCpuArray::with_max_entries(rivet_common::nat_stat::SLOTS, 0);

/// Counts `n` entries created in `NAT`.
#[inline(always)]
pub fn nat_created(n: u64) {
    if let Some(slot) = NAT_STATS.get_ptr_mut(rivet_common::nat_stat::CREATED) {
        // SAFETY: this CPU's slot of a map value; no concurrent writer on it.
        unsafe { *slot += n };
    }
}

/// Masqueraded flows per pod (see `rivet_common::nat_pod_slot`; LRU: a
/// count pushed out is rebuilt by the collector's next recount).
#[map]
pub static NAT_PODS: LruHashMap<NatPodKey, u64> = LruHashMap::with_max_entries(NAT_PODS_MAX, 0);

/// Counts one flow-taken-over event in `NAT_STATS` slot `slot`.
#[inline(always)]
pub fn nat_stat_add(slot: u32) {
    if let Some(v) = NAT_STATS.get_ptr_mut(slot) {
        // SAFETY: this CPU's slot of a map value; no concurrent writer on it.
        unsafe { *v += 1 };
    }
}

/// The live masqueraded flows of the pod at `addr`, as far as the datapath
/// and the collector's last recount know (never negative).
#[inline(always)]
pub fn nat_pod_flows(addr: u32) -> u64 {
    let get = |slot| {
        NAT_PODS
            .get_ptr(NatPodKey { addr, slot })
            // SAFETY: a map value pointer from a successful lookup; a
            // plain read of an aligned u64 (a concurrent atomic add
            // yields the old or the new value).
            .map_or(0, |v| unsafe { core::ptr::read_volatile(v) })
    };
    let sum = get(nat_pod_slot::FLOWS).wrapping_add(get(nat_pod_slot::ADJUST)) as i64;
    if sum < 0 { 0 } else { sum as u64 }
}

/// `*v += delta` as one BPF atomic add (`lock xadd`): other CPUs add to the
/// same value concurrently. (The BPF target has no compare-and-swap, so
/// `core::sync::atomic` offers no `fetch_add`; the intrinsic's result is
/// unused, which is what the instruction supports.)
#[inline(always)]
pub fn atomic_add(v: *mut u64, delta: u64) {
    // SAFETY: `v` is a map value pointer from a successful lookup, valid
    // for the program run and 8-byte aligned (map values are).
    unsafe {
        core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(
            v, delta,
        )
    };
}

/// Adds `delta` (wrapping: `u64::MAX` subtracts one) to the datapath's
/// running flow count of the pod at `addr`.
#[inline(always)]
pub fn nat_pod_add(addr: u32, delta: u64) {
    let key = NatPodKey {
        addr,
        slot: nat_pod_slot::FLOWS,
    };
    if let Some(v) = NAT_PODS.get_ptr_mut(key) {
        atomic_add(v, delta);
    } else if NAT_PODS.insert(key, delta, u64::from(BPF_NOEXIST)).is_err()
        && let Some(v) = NAT_PODS.get_ptr_mut(key)
    {
        // Another CPU created it meanwhile.
        atomic_add(v, delta);
    }
}

/// The masquerade settings, if masquerading is on.
#[inline(always)]
pub fn nat_config() -> Option<NatConfig> {
    let nat = *NAT_CONFIG.get(0)?;
    if nat.flags & nat_config_flags::MASQUERADE == 0 || nat.port_min > nat.port_max {
        return None;
    }
    Some(nat)
}

/// The NAT port range, masquerading on or not: Service flows to a backend
/// on another node take their source ports from it too.
#[inline(always)]
pub fn nat_ports() -> Option<NatConfig> {
    let nat = *NAT_CONFIG.get(0)?;
    if nat.port_min == 0 || nat.port_min > nat.port_max {
        return None;
    }
    Some(nat)
}

/// True if traffic to `addr` keeps the pod's source address.
#[inline(always)]
pub fn no_masquerade(addr: u32) -> bool {
    NO_MASQ.get(Key::new(32, addr)).is_some()
}

/// The endpoint owning `addr`, if it is a local pod.
#[inline(always)]
pub fn endpoint(addr: u32) -> Option<&'static EndpointInfo> {
    // The agent writes a slot after the hash entry and clears it before
    // removing the entry, so a slot naming `addr` is that entry's copy. (A
    // slot rewritten concurrently could be read half old, half new; the
    // agent only ever rewrites an empty slot or the same address's.)
    if let Some(slot) = ENDPOINT_SLOTS.get(rivet_common::endpoint_slot(addr))
        && slot.addr == addr
        && addr != 0
        && slot.info.ifindex != 0
    {
        return Some(&slot.info);
    }
    // SAFETY: entries are only replaced whole by the agent (BPF_ANY update of
    // a preallocated hash); a concurrent update can at worst make us read the
    // old or the new value, both valid endpoints.
    unsafe { ENDPOINTS.get(EndpointKey { addr }) }
}

/// True if `addr` is one of the node's own addresses.
#[inline(always)]
pub fn is_local_addr(addr: u32) -> bool {
    LOCAL_ADDRS.get_ptr(EndpointKey { addr }).is_some()
}

/// Whether `addr` is this node's own: its primary address or one of
/// `LOCAL_ADDRS`.
#[inline(always)]
pub fn is_node_addr(addr: u32) -> bool {
    CONFIG.get(0).is_some_and(|c| c.node_ip == addr) || is_local_addr(addr)
}

/// NetworkPolicy port classes of this node's pods.
#[map]
pub static POLICY_PORTS: LpmTrie<PolicyPortKey, u32> =
    LpmTrie::with_max_entries(POLICY_PORTS_MAX, 0);

/// NetworkPolicy allowed peers of this node's pods, per port class.
#[map]
pub static POLICY_PEERS: LpmTrie<PolicyPeerKey, u32> =
    LpmTrie::with_max_entries(POLICY_PEERS_MAX, 0);

/// Flows this node's pods started or accepted (LRU, a list per CPU).
#[map]
pub static POLICY_FLOWS: LruHashMap<FlowKey, FlowState> =
    LruHashMap::with_max_entries(POLICY_FLOWS_MAX, PER_CPU_LRU);

/// New flows NetworkPolicy allowed, by `rivet_common::policy_stat` slot.
#[map]
pub static POLICY_STATS: PerCpuArray<u64> =
    PerCpuArray::with_max_entries(rivet_common::policy_stat::SLOTS, 0);

/// Counts one new flow allowed in `POLICY_STATS` slot `slot`.
#[inline(always)]
pub fn policy_allowed(slot: u32) {
    if let Some(v) = POLICY_STATS.get_ptr_mut(slot) {
        // SAFETY: this CPU's slot of a map value; no concurrent writer on it.
        unsafe { *v += 1 };
    }
}

/// Pod bandwidth limits by host-side veth ifindex (`crate::bandwidth`).
#[map]
pub static BANDWIDTH: HashMap<u32, rivet_common::PodBandwidth> =
    HashMap::with_max_entries(ENDPOINTS_MAX, 0);

/// Per-CPU working memory of the policy verdict (`crate::policy`).
#[map]
pub static POLICY_SCRATCH: PerCpuArray<[u64; POLICY_SCRATCH_BYTES / 8]> =
    PerCpuArray::with_max_entries(1, 0);

/// The node configuration, if the agent has written it. Returned by value:
/// an `Option` of a map-value pointer gets compiled into pointer arithmetic
/// (`-flag & ptr`) that the verifier rejects.
#[inline(always)]
pub fn config() -> Option<NodeConfig> {
    let cfg = *CONFIG.get(0)?;
    if cfg.flags & rivet_common::config_flags::CONFIGURED == 0 {
        return None;
    }
    Some(cfg)
}

/// The route covering `addr` (longest prefix), if it is a remote pod subnet.
#[inline(always)]
pub fn route(addr: u32) -> Option<RouteInfo> {
    ROUTES.get(Key::new(32, addr)).copied()
}

/// The peer node at `addr`, if known.
#[inline(always)]
pub fn peer(addr: u32) -> Option<PeerInfo> {
    // SAFETY: as for `endpoint`: entries are replaced whole.
    unsafe { PEERS.get(EndpointKey { addr }) }.copied()
}

/// How a pod reaches `addr` on another node: the route of its pod subnet,
/// or — `addr` being another node's own address — that node, the way its
/// pods are reached (encapsulated in the tunnel modes, so no pod address
/// crosses the underlay raw; routed in native mode).
#[inline(always)]
pub fn remote_route(addr: u32) -> Option<RouteInfo> {
    if let Some(route) = route(addr) {
        return Some(route);
    }
    let peer = peer(addr)?;
    (peer.route_mode != 0).then_some(RouteInfo {
        node_ip: addr,
        mode: peer.route_mode,
    })
}

/// Numeric settings by `rivet_common::tunable` index (0: off/default).
#[map]
pub static TUNABLES: Array<u64> = Array::with_max_entries(rivet_common::TUNABLES_MAX, 0);

/// The setting at `rivet_common::tunable` index `index` (0 if unset).
#[inline(always)]
pub fn tunable(index: u32) -> u64 {
    TUNABLES.get(index).copied().unwrap_or(0)
}

/// Per-pod fragment budget, by the sending pod's address: the bucket's
/// theoretical arrival time in `bpf_ktime_get_ns` nanoseconds (LRU: an
/// idle pod's bucket is full anyway; the agent sizes it at load from
/// `max_endpoints`).
#[map]
pub static FRAG_BUDGET: LruHashMap<EndpointKey, u64> =
    LruHashMap::with_max_entries(ENDPOINTS_MAX, 0);

/// Service frontends (`rivet_common::service`).
#[map]
pub static SVC_FRONTENDS: HashMap<SvcKey, SvcInfo> =
    HashMap::with_max_entries(SVC_FRONTENDS_MAX, 0);

/// Service backend groups.
#[map]
pub static SVC_BACKENDS: HashMap<SvcBackendKey, SvcBackend> =
    HashMap::with_max_entries(SVC_BACKENDS_MAX, 0);

/// ClientIP affinity: a client's backend per Service port (LRU).
#[map]
pub static SVC_AFFINITY: LruHashMap<SvcAffinityKey, SvcAffinity> =
    LruHashMap::with_max_entries(SVC_AFFINITY_MAX, 0);

/// Per-Service-port counters, by `SvcInfo::id` (atomic adds).
#[map]
pub static SVC_STATS: Array<SvcCounters> = Array::with_max_entries(SVC_IDS_MAX, 0);

/// This node's pods' network namespaces, by cookie: the socket hooks
/// translate Services for their sockets.
#[map]
pub static SOCK_NETNS: HashMap<u64, u32> = HashMap::with_max_entries(ENDPOINTS_MAX, 0);
