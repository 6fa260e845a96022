//! Kubernetes NetworkPolicy: what the agent compiles the policies selecting
//! this node's pods into, and the flow table that lets replies through.
//!
//! The agent turns, for each local pod and direction, the union of the
//! rules of every policy selecting it into two LPM tries keyed by the pod's
//! own address (so no identity numbers are shared between nodes):
//!
//! - `POLICY_PORTS` {pod, direction, protocol, port} → a *port class*: the
//!   ports are cut into intervals at every rule's port bounds, and intervals
//!   matched by the same rules share a class. A port range is stored as its
//!   aligned prefixes. Protocols without ports (ICMP, …) look up
//!   [`POLICY_PROTO_OTHER`] with port 0: their class holds the rules that
//!   name no port.
//! - `POLICY_PEERS` {pod, direction, class, peer address} → the policy that
//!   allows: the addresses allowed on that class, as disjoint prefixes (pods
//!   chosen by selectors as /32s, `ipBlock`s with their `except`s cut out).
//!
//! Whether a pod is isolated in a direction is a bit of its endpoint
//! ([`crate::endpoint_flags::POLICY_INGRESS`], `POLICY_EGRESS`), read with
//! the endpoint every program already looks up: a pod no policy selects pays
//! no policy lookup.
//!
//! `POLICY_FLOWS` remembers every flow a pod of this node started or
//! accepted, isolated or not, keyed by its first packet's tuple: a packet
//! whose reversed tuple is there is a reply and passes; one whose own tuple
//! is there belongs to an allowed flow and passes.

/// Key data of `POLICY_PORTS` (LPM; 48 bits of pod, direction and protocol,
/// then up to 16 of port).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PolicyPortKey {
    /// The local pod's address, wire order.
    pub pod: u32,
    /// [`policy_dir`].
    pub dir: u8,
    /// IP protocol (6, 17, 132), or [`POLICY_PROTO_OTHER`].
    pub proto: u8,
    /// Destination port, big-endian bytes (what the prefix runs over).
    pub port: [u8; 2],
}

/// Bits of [`PolicyPortKey`] before the port.
pub const POLICY_PORT_KEY_FIXED_BITS: u32 = 48;

/// Key data of `POLICY_PEERS` (LPM; 64 bits of pod, direction and class,
/// then up to 32 of the peer's address).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PolicyPeerKey {
    /// The local pod's address, wire order.
    pub pod: u32,
    /// [`policy_dir`].
    pub dir: u8,
    /// Reserved, zero.
    pub _pad: u8,
    /// The port class ([`PolicyPortKey`]'s value), big-endian bytes.
    pub class: [u8; 2],
    /// The peer's address (source for ingress, destination for egress),
    /// wire order.
    pub peer: u32,
}

/// Bits of [`PolicyPeerKey`] before the peer address.
pub const POLICY_PEER_KEY_FIXED_BITS: u32 = 64;

/// Direction of a policy lookup.
pub mod policy_dir {
    /// Traffic to the pod.
    pub const INGRESS: u8 = 0;
    /// Traffic from the pod.
    pub const EGRESS: u8 = 1;
}

/// [`PolicyPortKey::proto`] of every protocol without ports.
pub const POLICY_PROTO_OTHER: u8 = 0;

/// Key of `POLICY_FLOWS`: a flow as its first packet had it. Ports in wire
/// order; ICMP echo uses its identifier as both ports; other protocols 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct FlowKey {
    /// Source address, wire order.
    pub src: u32,
    /// Destination address, wire order.
    pub dst: u32,
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// IP protocol.
    pub proto: u8,
    /// Reserved, zero.
    pub _pad: [u8; 3],
}

/// Value of `POLICY_FLOWS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FlowState {
    /// `bpf_ktime_get_ns` when a packet of the flow was last looked up
    /// (refreshed at most once per [`POLICY_FLOW_REFRESH_NS`]). A flow
    /// idle longer than its protocol's timeout is forgotten: TCP
    /// [`POLICY_FLOW_TCP_IDLE_NS`], others [`POLICY_FLOW_IDLE_NS`].
    pub seen: u64,
}

/// Idle time after which a TCP flow no longer lets packets through: one
/// day (kube-proxy's conntrack setting for established TCP).
pub const POLICY_FLOW_TCP_IDLE_NS: u64 = 86_400_000_000_000;
/// Idle time after which a flow of another protocol (UDP, SCTP, ICMP
/// echo) no longer lets packets through: 120 s (the kernel's
/// `nf_conntrack_udp_timeout_stream`).
pub const POLICY_FLOW_IDLE_NS: u64 = 120_000_000_000;
/// A flow's `seen` is rewritten at most this often (one write per second
/// per busy flow, not one per packet).
pub const POLICY_FLOW_REFRESH_NS: u64 = 1_000_000_000;

/// Default capacity of `POLICY_PEERS` (LPM tries allocate per entry).
pub const POLICY_PEERS_MAX: u32 = 262_144;
/// Default capacity of `POLICY_PORTS` (sized by the same knob).
pub const POLICY_PORTS_MAX: u32 = POLICY_PEERS_MAX;
/// Default capacity of `POLICY_FLOWS` (LRU).
pub const POLICY_FLOWS_MAX: u32 = 262_144;

/// Slots of `POLICY_STATS` (per-CPU `u64`): new flows policy allowed.
pub mod policy_stat {
    /// New flows an isolated pod's ingress rules allowed.
    pub const ALLOWED_INGRESS: u32 = 0;
    /// New flows an isolated pod's egress rules allowed (or its own node).
    pub const ALLOWED_EGRESS: u32 = 1;
    /// Slots.
    pub const SLOTS: u32 = 2;
}

/// Bytes of the policy verdict's per-CPU working memory (`POLICY_SCRATCH`,
/// one value, used by the datapath only).
pub const POLICY_SCRATCH_BYTES: usize = 192;
