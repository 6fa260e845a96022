//! Kubernetes Services: the frontends (an address, port and protocol a
//! client names), their backend groups, ClientIP affinity and the
//! per-Service counters. The agent translates `Service` and
//! `EndpointSlice` objects into these maps; the socket hooks and the
//! uplink program read them.
//!
//! A frontend's backends are a *group*: `SVC_BACKENDS{group, slot}` for
//! `slot < count`. A change of a Service's backends writes a new group and
//! then flips the frontend to it in one map update, so a program sees the
//! old set or the new one, never a mix; the old group is removed after.

/// Key of `SVC_FRONTENDS`: what a client names. Addresses and ports in
/// wire order.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SvcKey {
    /// The frontend address (ClusterIP, external IP, load-balancer IP), or
    /// 0 for a NodePort (every address of the node, loopback, and — for the
    /// socket hooks — every other node's address).
    pub addr: u32,
    /// The frontend port (wire order).
    pub port: u16,
    /// IP protocol (6, 17, 132).
    pub proto: u8,
    /// [`svc_scope`]: who asks.
    pub scope: u8,
}

/// Who reaches a frontend: clients inside the cluster (the socket hooks of
/// pods and of the node) and clients from outside (packets at the uplink)
/// may be given different backends (`externalTrafficPolicy: Local`).
pub mod svc_scope {
    /// Pods' and the node's own sockets.
    pub const INTERNAL: u8 = 0;
    /// Packets arriving at the uplink.
    pub const EXTERNAL: u8 = 1;
}

/// Value of `SVC_FRONTENDS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SvcInfo {
    /// The Service port's id: its slot in `SVC_STATS` and its affinity key
    /// (stable while the Service port exists).
    pub id: u32,
    /// The backend group ([`SvcBackendKey::group`]).
    pub group: u32,
    /// Backends in the group; 0: the Service has none and rejects at once.
    pub count: u32,
    /// [`svc_flags`] bits.
    pub flags: u32,
    /// ClientIP affinity timeout, seconds (with [`svc_flags::AFFINITY`]).
    pub affinity_timeout: u32,
    /// Reserved, zero.
    pub _pad: u32,
}

/// Bits of [`SvcInfo::flags`].
pub mod svc_flags {
    /// `sessionAffinity: ClientIP`.
    pub const AFFINITY: u32 = 1;
    /// A NodePort frontend.
    pub const NODEPORT: u32 = 2;
    /// An `externalIPs` or load-balancer ingress frontend.
    pub const EXTERNAL: u32 = 4;
    /// Only this node's backends are in the group (`externalTrafficPolicy`
    /// or `internalTrafficPolicy: Local`) and the Service has backends on
    /// other nodes: with none here, traffic at the uplink is dropped (not
    /// rejected), as kube-proxy does.
    pub const LOCAL_ONLY: u32 = 8;
}

/// Key of `SVC_BACKENDS`: a slot of a backend group.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SvcBackendKey {
    /// The group ([`SvcInfo::group`]).
    pub group: u32,
    /// The slot, `0..count`.
    pub slot: u32,
}

/// Value of `SVC_BACKENDS`: one backend.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SvcBackend {
    /// The backend's address (wire order).
    pub addr: u32,
    /// The backend's port (wire order).
    pub port: u16,
    /// Reserved, zero.
    pub _pad: u16,
}

/// Key of `SVC_AFFINITY`: a client of a Service port.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SvcAffinityKey {
    /// The client: the socket's network namespace cookie at the socket
    /// hooks, [`AFFINITY_BY_ADDR`] | its IPv4 address (wire order) at the
    /// uplink.
    pub client: u64,
    /// [`SvcInfo::id`].
    pub id: u32,
    /// Reserved, zero.
    pub _pad: u32,
}

/// Marks an [`SvcAffinityKey::client`] that is an address, not a
/// namespace cookie.
pub const AFFINITY_BY_ADDR: u64 = 1 << 63;

/// Value of `SVC_AFFINITY`: the backend a client was given and when it
/// last used it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SvcAffinity {
    /// The backend.
    pub backend: SvcBackend,
    /// Its slot in the group it was chosen from: the affinity holds while
    /// the frontend's current group has the same backend in that slot
    /// (the agent keeps a backend's slot while it stays).
    pub slot: u32,
    /// Reserved, zero.
    pub _pad: u32,
    /// `bpf_ktime_get_ns` of the last choice or use.
    pub last_used: u64,
}

/// Value of `SVC_STATS` (indexed by [`SvcInfo::id`]); the datapath adds to
/// it atomically.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SvcCounters {
    /// Sockets translated (connect, or an unconnected datagram).
    pub sockets: u64,
    /// Flows translated at the uplink (NodePort, external IPs).
    pub flows: u64,
    /// Attempts rejected because the frontend had no backend.
    pub rejected: u64,
    /// Affinity hits: a client sent to the backend it had.
    pub affinity_hits: u64,
}

/// Value of `SOCK_NETNS`: whose network namespace a socket lives in.
pub mod netns_role {
    /// A pod of this node: Services are translated for its sockets.
    pub const POD: u32 = 1;
}

/// Default capacity of `SVC_FRONTENDS` (Service ports × their frontends:
/// 10,000 Services with a ClusterIP and a NodePort each fill 40,000 with
/// both scopes).
pub const SVC_FRONTENDS_MAX: u32 = 65_536;
/// Default capacity of `SVC_BACKENDS`: 10,000 Service ports × 10 backends,
/// twice (a group being replaced and its successor), with room.
pub const SVC_BACKENDS_MAX: u32 = 262_144;
/// Capacity of `SVC_AFFINITY` (LRU).
pub const SVC_AFFINITY_MAX: u32 = 65_536;
/// Default slots of `SVC_STATS` (Service port ids).
pub const SVC_IDS_MAX: u32 = 65_536;
