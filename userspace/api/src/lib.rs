//! The agent's API: JSON over a unix stream socket, one request per
//! connection. The client writes one [`Request`] and shuts down its write
//! half; the agent writes one [`Response`] and closes. Each side may act on
//! the other's document as soon as it is complete (its closing brace),
//! without waiting for the EOF behind it — one wake-up less per side.
//!
//! This crate is deliberately small (serde only, blocking std I/O) so that the
//! CNI plugin and `rivetctl` stay small and start fast.

use std::{
    io::{Read as _, Write as _},
    net::Ipv4Addr,
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{Deserialize, Serialize};

/// Default path of the agent socket.
pub const DEFAULT_SOCKET: &str = "/run/rivet/rivetd.sock";

/// Largest request or response the agent accepts: room for a document of
/// ten thousand Services (about 5 MB, more once escaped) and its listing.
pub const MAX_MESSAGE: u64 = 64 << 20;

/// Host-side veth name of an attachment: `rv` + 13 hex digits of FNV-1a-64
/// over (container ID, NUL, ifname) — 15 bytes, the IFNAMSIZ limit. Stable
/// across releases: the agent and the CNI plugin (for DEL without the agent)
/// both derive it.
pub fn host_ifname(container_id: &str, ifname: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in container_id
        .bytes()
        .chain(std::iter::once(0))
        .chain(ifname.bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("rv{:013x}", h & 0x000f_ffff_ffff_ffff)
}

/// Default interface name inside the pod.
pub fn default_ifname() -> String {
    "eth0".to_owned()
}

/// What libcni allows as a container ID, and the CNI spec as a network name.
pub const CNI_ID_PATTERN: &str = r"^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$";

/// Checks a container ID or a network name (`what` names which in the
/// error) against [`CNI_ID_PATTERN`]; the error says what is wrong. The
/// agent and the CNI plugin both validate with it.
pub fn check_cni_id(what: &str, value: &str) -> Result<(), String> {
    let mut chars = value.chars();
    match chars.next() {
        None => Err(format!("{what} is empty")),
        Some(c) if !c.is_ascii_alphanumeric() => Err(format!(
            "{what} {value:?} must start with a letter or digit"
        )),
        Some(_) if !chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')) => {
            Err(format!(
                "{what} {value:?} may only contain letters, digits, '_', '.' and '-'"
            ))
        }
        Some(_) => Ok(()),
    }
}

/// What a client asks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Create a pod attachment: address, veth, routes, map entry, program.
    EndpointAdd(EndpointSpec),
    /// Remove a pod attachment and its lease (idempotent).
    EndpointDel(EndpointRef),
    /// Verify every resource of an attachment; the error names the first
    /// missing one.
    EndpointCheck(EndpointCheck),
    /// List the node's endpoints.
    EndpointList {},
    /// Change the bandwidth limits of a running attachment (answer: the
    /// updated endpoint).
    EndpointBandwidth(EndpointBandwidth),
    /// Remove every attachment not in `valid` (CNI GC).
    Gc(GcRequest),
    /// Add or update a remote node (its pod subnet and address).
    NodeSet(NodeEntry),
    /// Forget the remote node owning `subnet`.
    NodeDel {
        /// The node's pod subnet.
        subnet: String,
    },
    /// List the remote nodes (routes and peers).
    NodeList {},
    /// Datapath counters, summed over CPUs.
    Stats {},
    /// Agent and datapath status.
    Status {},
    /// Connection-tracking (NAT) entries, optionally only those with `ip`
    /// or `port` on either side, at most `limit`.
    NatList {
        /// Address filter.
        #[serde(default)]
        ip: Option<Ipv4Addr>,
        /// Port filter.
        #[serde(default)]
        port: Option<u16>,
        /// At most this many entries (default 1000).
        #[serde(default)]
        limit: Option<usize>,
    },
    /// hostPort mappings as the datapath holds them (all of them; see
    /// [`Request::PortmapPage`]).
    PortmapList {},
    /// One page of the NAT table: the entries [`Request::NatList`] would
    /// match, skipping the first `offset` (in the table's order) and
    /// stopping after `limit` (default 1000). The agent reads the table
    /// only that far; [`Response::Nat`] says where the next page starts.
    NatPage {
        /// Address filter.
        #[serde(default)]
        ip: Option<Ipv4Addr>,
        /// Port filter.
        #[serde(default)]
        port: Option<u16>,
        /// Matching entries to skip.
        #[serde(default)]
        offset: usize,
        /// At most this many entries (default 1000).
        #[serde(default)]
        limit: Option<usize>,
    },
    /// One page of the hostPort mappings: skipping the first `offset` (in
    /// the map's order), at most `limit` (default 1000); answered by
    /// [`Response::PortmapPage`].
    PortmapPage {
        /// Mappings to skip.
        #[serde(default)]
        offset: usize,
        /// At most this many (default 1000).
        #[serde(default)]
        limit: Option<usize>,
    },
    /// Stream datapath events (one [`MonitorEvent`] JSON object per line)
    /// until the client goes away: every drop, and flows when `flows` (one
    /// packet in `sample`, default every packet). Use [`Client::monitor`].
    Monitor {
        /// Also flow events (forwarded and passed packets).
        #[serde(default)]
        flows: bool,
        /// Flow sampling: one packet in this many.
        #[serde(default)]
        sample: Option<u32>,
    },
    /// Store the Kubernetes objects of `document` (`kubectl apply -f`):
    /// JSON or YAML, one object, a `List` or several YAML documents. The
    /// agent parses and validates it; one invalid object refuses the
    /// whole document. Answered by [`Response::Applied`].
    Apply {
        /// The document's text, as the user wrote it.
        document: String,
    },
    /// Remove the objects `document` names (`kubectl delete -f`): all of
    /// them, or — when one is not stored and `ignore_not_found` is false —
    /// none (a `not_found` error naming them).
    Delete {
        /// The document's text.
        document: String,
        /// Objects that are not stored are no error.
        #[serde(default)]
        ignore_not_found: bool,
    },
    /// Stored objects of one kind (`kubectl get`), as Kubernetes JSON in
    /// [`Response::Objects`].
    Get {
        /// The kind as a user names it: `services`, `svc`, `service`,
        /// `endpointslices`, `namespaces`, `ns`, `pods`, `po`,
        /// `networkpolicies`, `netpol`, …
        kind: String,
        /// Only this namespace (`None`: every namespace; ignored for
        /// namespaces themselves).
        #[serde(default)]
        namespace: Option<String>,
        /// Only this object (`not_found` when it is not stored).
        #[serde(default)]
        name: Option<String>,
    },
    /// The Services this node serves, one entry per Service port, with
    /// their frontends, backends and counters ([`Response::Services`]).
    Services {},
    /// The NetworkPolicy of this node's pods ([`Response::Policy`]): the
    /// policies selecting each and its effective rules.
    Policy {
        /// Only this pod (`namespace/name`, or a name in `default`).
        #[serde(default)]
        pod: Option<String>,
    },
    /// The node's BGP speaker, sessions and learned routes
    /// ([`Response::Bgp`]; `bgp` mode only).
    Bgp {},
}

/// A node's BGP state ([`Request::Bgp`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BgpStatus {
    /// Its AS number.
    pub asn: u32,
    /// Its router ID (the node's address).
    pub router_id: std::net::Ipv4Addr,
    /// Route reflector cluster ID, when it reflects.
    pub cluster_id: Option<std::net::Ipv4Addr>,
    /// Whether the speaker answers, and its restarts by the agent.
    pub speaker_up: bool,
    /// Times the agent found the speaker dead and started it again.
    pub speaker_restarts: u64,
    /// Prefixes announced.
    pub announced: Vec<String>,
    /// Every session.
    pub sessions: Vec<BgpSession>,
    /// Routes learned (in the speaker's kernel table).
    pub learned: usize,
    /// Of them, held out of the datapath by flap damping.
    pub suppressed: usize,
    /// Suppressions so far.
    pub suppressions: u64,
    /// Datapath route entries written or removed because of BGP.
    #[serde(default)]
    pub route_changes: u64,
}

/// One BGP session.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BgpSession {
    /// The speaker's name of it.
    pub name: String,
    /// The peer's address.
    pub peer: Option<std::net::Ipv4Addr>,
    /// The peer's AS.
    pub peer_as: Option<u32>,
    /// `node`, `reflector`, `client` or `external`.
    pub role: String,
    /// The BGP state (`Established`, `Active`, `Connect`, …).
    pub state: String,
    /// Seconds in this state, when known.
    pub uptime_secs: Option<u64>,
    /// Prefixes received from the peer.
    pub received: u64,
    /// Prefixes advertised to it.
    pub advertised: u64,
    /// State changes the agent saw.
    pub changes: u64,
    /// The speaker's last error of the session.
    pub last_error: Option<String>,
}

/// The NetworkPolicy of a node's pods ([`Request::Policy`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyList {
    /// Every pod of the node with a Kubernetes identity.
    pub pods: Vec<PodPolicy>,
}

/// One pod's NetworkPolicy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodPolicy {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its address.
    pub ip: Ipv4Addr,
    /// `namespace/name` of every policy selecting it.
    pub policies: Vec<String>,
    /// What may reach it (`None`: not isolated, everything may).
    pub ingress: Option<Vec<PolicyRule>>,
    /// What it may reach (`None`: not isolated).
    pub egress: Option<Vec<PolicyRule>>,
}

/// Effective rule: these ports with these peers (the union of every rule
/// of every selecting policy, cut where ports differ).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyRule {
    /// Ports: `tcp/80`, `udp/1000-2000`, `other` (protocols without
    /// ports, ICMP included).
    pub ports: Vec<String>,
    /// Peer prefixes (`10.244.1.5/32`, `0.0.0.0/0`).
    pub peers: Vec<String>,
    /// `namespace/name` of the policies the peers come from.
    pub from_policies: Vec<String>,
}

/// The Services a node serves ([`Request::Services`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceList {
    /// One entry per Service port, by namespace, name and port name.
    pub services: Vec<ServicePortStatus>,
    /// The counters of every Service port, summed.
    pub totals: ServiceCounters,
    /// Entries in `SVC_FRONTENDS` (frontends and the markers of addresses
    /// holding external frontends).
    pub frontend_entries: u64,
    /// Capacity of `SVC_FRONTENDS` (`max_services`).
    pub frontend_capacity: u64,
    /// Entries in `SVC_BACKENDS` (every backend group's slots).
    pub backend_entries: u64,
    /// Capacity of `SVC_BACKENDS` (`max_service_backends`).
    pub backend_capacity: u64,
}

/// One port of one Service as the datapath holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServicePortStatus {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub name: String,
    /// The port's name (empty for a Service's only, unnamed port).
    pub port_name: String,
    /// Its protocol (`tcp`, `udp`, `sctp`).
    pub protocol: Protocol,
    /// The Service port (`spec.ports[].port`), when it has a frontend that
    /// is not a NodePort (a ClusterIP, external or load-balancer IP).
    #[serde(default)]
    pub port: Option<u16>,
    /// Its slot in the counters map (`SVC_STATS`).
    #[serde(default)]
    pub id: Option<u32>,
    /// Every frontend, by kind, address, port and scope.
    pub frontends: Vec<ServiceFrontend>,
    /// Its backends in the slots of its group (the group of every backend;
    /// with only a `Local` group, that one).
    pub backends: Vec<ServiceBackend>,
    /// ClientIP affinity timeout in seconds, when `sessionAffinity` is
    /// `ClientIP`.
    #[serde(default)]
    pub affinity_timeout: Option<u32>,
    /// `externalTrafficPolicy: Local`: clients from outside get this node's
    /// backends only.
    pub external_local: bool,
    /// `internalTrafficPolicy: Local`: the ClusterIP gives this node's
    /// backends only.
    pub internal_local: bool,
    /// What the datapath counted for it.
    pub counters: ServiceCounters,
}

/// What kind of address a Service frontend is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ServiceFrontendKind {
    /// A `clusterIPs` entry.
    #[serde(rename = "ClusterIP")]
    ClusterIp,
    /// The `nodePort`, on every node address.
    NodePort,
    /// An `externalIPs` entry.
    #[serde(rename = "ExternalIP")]
    ExternalIp,
    /// A `status.loadBalancer.ingress` IP.
    LoadBalancer,
}

impl std::fmt::Display for ServiceFrontendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::ClusterIp => "ClusterIP",
            Self::NodePort => "NodePort",
            Self::ExternalIp => "ExternalIP",
            Self::LoadBalancer => "LoadBalancer",
        })
    }
}

/// Who reaches a Service frontend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServiceScope {
    /// Pods' and the node's own sockets (translated at the socket).
    Internal,
    /// Packets arriving at the uplink (translated per flow).
    External,
}

/// One frontend of a Service port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceFrontend {
    /// Its kind.
    pub kind: ServiceFrontendKind,
    /// Its address; 0.0.0.0 for a NodePort (every node address).
    pub address: Ipv4Addr,
    /// Its port (the nodePort for a NodePort).
    pub port: u16,
    /// Who reaches it.
    pub scope: ServiceScope,
    /// Backends it chooses from (0: it rejects, or with a `Local` policy
    /// drops).
    pub backends: u32,
}

/// One backend of a Service port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceBackend {
    /// Its address.
    pub address: Ipv4Addr,
    /// Its port.
    pub port: u16,
    /// It is on this node.
    pub local: bool,
}

/// What the datapath counted for a Service port.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceCounters {
    /// Sockets translated: connects, and unconnected datagrams, of pods
    /// and of the node.
    pub sockets: u64,
    /// Flows translated at the uplink (NodePorts, external and
    /// load-balancer IPs reached from outside).
    pub flows: u64,
    /// Attempts refused or dropped because the frontend had no backend.
    pub rejected: u64,
    /// Choices that sent a client to the backend it had (ClientIP affinity).
    pub affinity_hits: u64,
}

impl ServiceCounters {
    /// Both summed.
    #[must_use]
    pub const fn plus(self, other: Self) -> Self {
        Self {
            sockets: self.sockets.saturating_add(other.sockets),
            flows: self.flows.saturating_add(other.flows),
            rejected: self.rejected.saturating_add(other.rejected),
            affinity_hits: self.affinity_hits.saturating_add(other.affinity_hits),
        }
    }
}

/// What an [`Request::Apply`] or [`Request::Delete`] did to one object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectResult {
    /// Its kind (`Service`, `EndpointSlice`, …).
    pub kind: String,
    /// Its namespace (empty for a Namespace).
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// `created`, `configured`, `unchanged`, `deleted` or `not found`.
    pub outcome: String,
}

/// One datapath event, decoded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MonitorEvent {
    /// `drop`, `flow` or `policy` (NetworkPolicy allowed a new flow);
    /// `tick` is a keep-alive line (no event).
    pub kind: String,
    /// Drop reason or verdict (counter name).
    pub reason: String,
    /// Interface the packet arrived on.
    pub ifindex: u32,
    /// Its name on the node, if it still exists.
    pub ifname: Option<String>,
    /// The Service it is about (`namespace/name:port`), when it was
    /// addressed to a Service frontend or translated to or from a backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// NetworkPolicy verdicts (`policy` events, `policy_ingress` and
    /// `policy_egress` drops): the pod judged (`namespace/name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// `policy` events: the policy that allowed (`namespace/name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// `tcp`, `udp`, `icmp`, another number, or empty (not IPv4).
    pub proto: String,
    /// Source (`addr:port`, `addr` for ICMP).
    pub src: String,
    /// Destination.
    pub dst: String,
    /// ICMP `type/code`, if ICMP.
    pub icmp: Option<String>,
    /// Packet length.
    pub len: u32,
    /// When the agent read it (Unix time, seconds).
    pub time: f64,
    /// Events the agent could not deliver to this client before this one
    /// (it was too slow).
    #[serde(default)]
    pub lost: u64,
}

/// One NAT (connection-tracking) entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NatFlow {
    /// `tcp`, `udp` or `icmp`.
    pub proto: String,
    /// `egress` (a pod's masqueraded flow), `reply` (its way back) or
    /// `dnat` (a hostPort connection, as the pod answers it).
    pub dir: String,
    /// The tuple the entry matches: source `addr:port`.
    pub src: String,
    /// The tuple the entry matches: destination `addr:port`.
    pub dst: String,
    /// What is written instead: `addr:port`.
    pub translated: String,
    /// TCP flags seen (`syn`, `fin`, `fin_pod`, `rst`, `seen`).
    pub flags: Vec<String>,
    /// Seconds since a packet used it.
    pub idle_secs: u64,
}

/// One hostPort mapping in the datapath.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortmapEntry {
    /// The node address it is bound to (None: every node address).
    pub host_ip: Option<Ipv4Addr>,
    /// hostPort.
    pub host_port: u16,
    /// `tcp` or `udp`.
    pub protocol: String,
    /// Target pod.
    pub pod_ip: Ipv4Addr,
    /// Container port.
    pub container_port: u16,
    /// The pod's container ID, when an endpoint owns the address.
    pub container_id: Option<String>,
}

/// A pod attachment to create.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointSpec {
    /// Container (sandbox) ID; with `ifname` it names the attachment.
    pub container_id: String,
    /// CNI network name (the conflist's `name`); `None` for attachments
    /// made through the agent API. See [`Endpoint::network`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// Path of the pod's network namespace (`/run/netns/x`, `/proc/<pid>/ns/net`).
    pub netns: String,
    /// Interface name inside the pod.
    #[serde(default = "default_ifname")]
    pub ifname: String,
    /// Address to give the pod (it must be free and inside the node's pod
    /// CIDR); `None` lets the agent's IPAM choose.
    #[serde(default)]
    pub ip: Option<Ipv4Addr>,
    /// Ranges to allocate from (host-local style); empty = the whole pod CIDR.
    #[serde(default)]
    pub ranges: Vec<IpRange>,
    /// Kubernetes pod identity, when known.
    #[serde(default)]
    pub pod: Option<PodMeta>,
    /// hostPort mappings (CNI `portMappings` capability).
    #[serde(default)]
    pub port_mappings: Vec<PortMapping>,
    /// Traffic shaping (CNI `bandwidth` capability).
    #[serde(default)]
    pub bandwidth: Option<Bandwidth>,
    /// Extra routes (CIDRs) for the pod, via its gateway.
    #[serde(default)]
    pub routes: Vec<String>,
}

impl EndpointSpec {
    /// A spec with only the required fields (agent IPAM).
    pub fn new(container_id: impl Into<String>, netns: impl Into<String>) -> Self {
        Self {
            container_id: container_id.into(),
            network: None,
            netns: netns.into(),
            ifname: default_ifname(),
            ip: None,
            ranges: Vec::new(),
            pod: None,
            port_mappings: Vec::new(),
            bandwidth: None,
            routes: Vec::new(),
        }
    }

    /// Same, asking for a specific address.
    pub fn with_ip(mut self, ip: Ipv4Addr) -> Self {
        self.ip = Some(ip);
        self
    }
}

/// An allocation range (host-local's `ranges` entries).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct IpRange {
    /// Subnet, e.g. `10.244.1.0/24`.
    pub subnet: String,
    /// First address to hand out.
    #[serde(default)]
    pub range_start: Option<Ipv4Addr>,
    /// Last address to hand out.
    #[serde(default)]
    pub range_end: Option<Ipv4Addr>,
    /// Reserved (never handed out).
    #[serde(default)]
    pub gateway: Option<Ipv4Addr>,
}

/// Kubernetes identity of a pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodMeta {
    /// `K8S_POD_NAMESPACE`.
    pub namespace: String,
    /// `K8S_POD_NAME`.
    pub name: String,
}

/// An IP protocol: of a port mapping (TCP, UDP, SCTP), a NAT flow or a
/// datapath event. Its text is the IANA keyword in lowercase (`tcp`,
/// `udp`, `sctp`, `icmp`), or the number for any other protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// ICMP (1).
    Icmp,
    /// TCP (6).
    Tcp,
    /// UDP (17).
    Udp,
    /// SCTP (132).
    Sctp,
    /// Any other protocol, by number.
    Other(u8),
}

impl Protocol {
    /// The protocol of IP protocol number `n`.
    pub const fn from_number(n: u8) -> Self {
        match n {
            1 => Self::Icmp,
            6 => Self::Tcp,
            17 => Self::Udp,
            132 => Self::Sctp,
            n => Self::Other(n),
        }
    }

    /// Its IP protocol number.
    pub const fn number(self) -> u8 {
        match self {
            Self::Icmp => 1,
            Self::Tcp => 6,
            Self::Udp => 17,
            Self::Sctp => 132,
            Self::Other(n) => n,
        }
    }

    /// Its keyword, if it has one of rivet's names.
    pub const fn name(self) -> Option<&'static str> {
        match self {
            Self::Icmp => Some("icmp"),
            Self::Tcp => Some("tcp"),
            Self::Udp => Some("udp"),
            Self::Sctp => Some("sctp"),
            Self::Other(_) => None,
        }
    }

    /// A protocol a hostPort may map (the CNI `portMappings` set).
    pub const fn is_port_mapping(self) -> bool {
        matches!(self, Self::Tcp | Self::Udp | Self::Sctp)
    }
}

impl From<u8> for Protocol {
    fn from(n: u8) -> Self {
        Self::from_number(n)
    }
}

impl From<Protocol> for u8 {
    fn from(p: Protocol) -> Self {
        p.number()
    }
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "{}", self.number()),
        }
    }
}

/// A protocol name or number that is not one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown protocol {0:?} (tcp, udp, sctp, icmp or a number 0-255)")]
pub struct UnknownProtocol(pub String);

impl std::str::FromStr for Protocol {
    type Err = UnknownProtocol;

    /// A keyword (any case) or a number.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "icmp" => Ok(Self::Icmp),
            "tcp" => Ok(Self::Tcp),
            "udp" => Ok(Self::Udp),
            "sctp" => Ok(Self::Sctp),
            other => other
                .parse::<u8>()
                .map(Self::from_number)
                .map_err(|_| UnknownProtocol(s.to_owned())),
        }
    }
}

impl Serialize for Protocol {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Protocol {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = std::borrow::Cow::<'de, str>::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A port mapping's protocol: `tcp`, `udp` or `sctp`, in lowercase.
fn port_mapping_protocol<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Protocol, D::Error> {
    let text = std::borrow::Cow::<'de, str>::deserialize(d)?;
    match text.parse::<Protocol>() {
        Ok(p) if p.is_port_mapping() && p.name() == Some(text.as_ref()) => Ok(p),
        _ => Err(serde::de::Error::custom(format!(
            "port mapping protocol {text:?}: expected tcp, udp or sctp"
        ))),
    }
}

/// One hostPort mapping.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PortMapping {
    /// Port on the node.
    pub host_port: u16,
    /// Port in the pod.
    pub container_port: u16,
    /// Protocol.
    #[serde(deserialize_with = "port_mapping_protocol")]
    pub protocol: Protocol,
    /// Node address it applies to; `None` = every node address.
    #[serde(default)]
    pub host_ip: Option<Ipv4Addr>,
}

/// What shaping one direction of a pod did: its `htb` qdisc's counters
/// (and, egress, the datapath's check behind it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BandwidthFigures {
    /// The pod (`namespace/name`, or its container ID without them).
    pub pod: String,
    /// Its host-side veth.
    pub host_ifname: String,
    /// `ingress` (into the pod) or `egress`.
    pub direction: String,
    /// The limit, bit/s.
    pub rate: u64,
    /// Bytes the qdisc sent on.
    pub sent_bytes: u64,
    /// Packets dropped: the qdisc's queue was full (egress: plus what the
    /// datapath dropped as sent around the qdisc, `drop_bandwidth`).
    pub dropped: u64,
    /// Times a class of the qdisc had to wait for the rate.
    pub delayed: u64,
    /// Bytes queued now.
    pub backlog_bytes: u64,
}

/// New bandwidth limits for a running attachment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointBandwidth {
    /// The attachment.
    pub endpoint: EndpointRef,
    /// Its limits from now on (`None`: none).
    #[serde(default)]
    pub bandwidth: Option<Bandwidth>,
}

/// Traffic shaping, in bits per second and bits (the CNI convention).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Bandwidth {
    /// Rate into the pod.
    #[serde(default)]
    pub ingress_rate: Option<u64>,
    /// Burst into the pod.
    #[serde(default)]
    pub ingress_burst: Option<u64>,
    /// Rate out of the pod.
    #[serde(default)]
    pub egress_rate: Option<u64>,
    /// Burst out of the pod.
    #[serde(default)]
    pub egress_burst: Option<u64>,
}

impl Bandwidth {
    /// Limits as (rate bit/s, burst bits) per direction; `None`: that
    /// direction unlimited.
    pub fn limits(ingress: Option<(u64, u64)>, egress: Option<(u64, u64)>) -> Self {
        Self {
            ingress_rate: ingress.map(|(r, _)| r),
            ingress_burst: ingress.map(|(_, b)| b),
            egress_rate: egress.map(|(r, _)| r),
            egress_burst: egress.map(|(_, b)| b),
        }
    }

    /// Checks the limits as the reference `bandwidth` plugin does: a rate
    /// needs a burst and a burst a rate; a burst fits in 4 GiB. Also
    /// refused: a rate below 8 bit/s (less than a byte per second).
    pub fn validate(&self) -> Result<(), String> {
        for (dir, rate, burst) in [
            ("ingress", self.ingress_rate, self.ingress_burst),
            ("egress", self.egress_rate, self.egress_burst),
        ] {
            let (rate, burst) = (rate.unwrap_or(0), burst.unwrap_or(0));
            if rate != 0 && burst == 0 {
                return Err(format!("{dir}Rate is set: {dir}Burst must be set too"));
            }
            if rate == 0 && burst != 0 {
                return Err(format!("{dir}Burst is set: {dir}Rate must be set too"));
            }
            if burst / 8 >= u64::from(u32::MAX) {
                return Err(format!("{dir}Burst {burst} bits: more than 4 GiB"));
            }
            if rate != 0 && rate < 8 {
                return Err(format!(
                    "{dir}Rate {rate} bit/s: less than a byte per second"
                ));
            }
        }
        Ok(())
    }

    /// True when either direction is limited (a nonzero rate).
    pub fn limits_any(&self) -> bool {
        self.limits_ingress() || self.egress_rate.unwrap_or(0) != 0
    }

    /// True when traffic into the pod is limited.
    pub fn limits_ingress(&self) -> bool {
        self.ingress_rate.unwrap_or(0) != 0
    }
}

/// A remote node as the datapath routes to it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeEntry {
    /// Its pod subnet (CIDR).
    pub subnet: String,
    /// Its uplink address.
    pub node_ip: Ipv4Addr,
    /// Its VTEP MAC (default: derived from the address).
    #[serde(default)]
    pub vtep_mac: Option<String>,
    /// Its VNI (default: ours).
    #[serde(default)]
    pub vni: Option<u32>,
    /// How it is reached (`vxlan`, `ipip`, `native`); output only.
    #[serde(default)]
    pub route: Option<String>,
}

/// Names an attachment.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointRef {
    /// Container (sandbox) ID.
    pub container_id: String,
    /// Interface name inside the pod.
    #[serde(default = "default_ifname")]
    pub ifname: String,
    /// CNI network name; `None` matches an attachment of any network (see
    /// [`Endpoint::belongs_to`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
}

impl EndpointRef {
    /// A reference to an attachment of any network.
    pub fn new(container_id: impl Into<String>, ifname: impl Into<String>) -> Self {
        Self {
            container_id: container_id.into(),
            ifname: ifname.into(),
            network: None,
        }
    }

    /// The same reference, limited to one CNI network.
    pub fn in_network(mut self, network: impl Into<String>) -> Self {
        self.network = Some(network.into());
        self
    }
}

/// What CHECK verifies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointCheck {
    /// Container (sandbox) ID.
    pub container_id: String,
    /// Interface name inside the pod.
    #[serde(default = "default_ifname")]
    pub ifname: String,
    /// The address the previous result reported, if any.
    #[serde(default)]
    pub ip: Option<Ipv4Addr>,
    /// CNI network name; `None` matches any (see [`Endpoint::belongs_to`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
}

/// CNI GC of one network: its attachments that must survive.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcRequest {
    /// The CNI network collected. Only attachments recorded with this
    /// network are candidates; other networks' attachments and those with
    /// no network (made through the agent API, or recorded by an agent
    /// that did not record networks) are never removed by GC.
    pub network: String,
    /// Every attachment of `network` not listed here is removed.
    pub valid: Vec<EndpointRef>,
}

/// Lifecycle of an attachment record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndpointState {
    /// Address reserved, plumbing in progress (or interrupted by a crash).
    Pending,
    /// Fully plumbed.
    Ready,
}

/// A pod attached to the node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    /// Container (sandbox) ID.
    pub container_id: String,
    /// Interface name inside the pod.
    pub ifname: String,
    /// The CNI network that made the attachment: the CNI attachment key is
    /// (network, container ID, ifname). `None` for attachments made through
    /// the agent API and for records written before networks were recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// Pod network namespace path given at creation.
    pub netns: String,
    /// The pod's address (a /32 on its interface).
    pub ip: Ipv4Addr,
    /// MAC of the pod's interface.
    pub mac: String,
    /// Host-side veth name.
    pub host_ifname: String,
    /// Host-side veth ifindex in the node namespace.
    pub host_ifindex: u32,
    /// Host-side veth MAC (the pod's gateway MAC).
    pub host_mac: String,
    /// MTU of both veth ends.
    pub mtu: u32,
    /// The pod's default gateway.
    pub gateway: Ipv4Addr,
    /// Record state.
    pub state: EndpointState,
    /// Kubernetes identity, if given.
    #[serde(default)]
    pub pod: Option<PodMeta>,
    /// hostPort mappings.
    #[serde(default)]
    pub port_mappings: Vec<PortMapping>,
    /// Traffic shaping.
    #[serde(default)]
    pub bandwidth: Option<Bandwidth>,
    /// Extra routes (CIDRs) in the pod, via its gateway.
    #[serde(default)]
    pub routes: Vec<String>,
    /// When the record was created (seconds since the epoch).
    #[serde(default)]
    pub created: u64,
    /// The pod network namespace's cookie (`SO_NETNS_COOKIE`), marked for
    /// the Service socket hooks; `None` in records of older agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns_cookie: Option<u64>,
}

impl Endpoint {
    /// The attachment's name.
    pub fn reference(&self) -> EndpointRef {
        EndpointRef {
            network: self.network.clone(),
            ..EndpointRef::new(&self.container_id, &self.ifname)
        }
    }

    /// Whether a DEL or CHECK naming `network` (with this container ID and
    /// ifname) is about this attachment: a request without a network and a
    /// record without one match any; otherwise the names must be equal.
    /// (Container ID and ifname alone already name one interface in one pod
    /// namespace, so two networks can never hold the same pair at once.)
    pub fn belongs_to(&self, network: Option<&str>) -> bool {
        match (network, self.network.as_deref()) {
            (Some(asked), Some(ours)) => asked == ours,
            _ => true,
        }
    }
}

/// One datapath counter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterValue {
    /// Stable snake_case name (`fwd_local`, `drop_spoofed_ip`, ...).
    pub name: String,
    /// True for drop reasons.
    pub drop: bool,
    /// Packets, summed over CPUs.
    pub packets: u64,
    /// Bytes, summed over CPUs.
    pub bytes: u64,
}

/// A program attached to an interface through a pinned TCX link.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    /// Interface name in the node namespace.
    pub interface: String,
    /// Program name.
    pub program: String,
    /// Kernel program ID.
    pub program_id: u32,
    /// Kernel link ID.
    pub link_id: u32,
    /// Pin path of the link.
    pub pin: String,
}

/// Agent status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentStatus {
    /// rivet version.
    pub version: String,
    /// Node name.
    pub node_name: String,
    /// Seconds since the agent started.
    pub uptime_secs: u64,
    /// Pod CIDR of the node.
    pub pod_cidr: String,
    /// Pods' gateway address.
    pub gateway: Ipv4Addr,
    /// Pod interface MTU.
    pub mtu: u32,
    /// Pin directory.
    pub pin_dir: String,
    /// Number of endpoints.
    pub endpoints: usize,
    /// Attached programs.
    pub attachments: Vec<Attachment>,
    /// Address pool of the node.
    pub pool: PoolStatus,
    /// Cross-node mode.
    pub mode: String,
    /// Cluster CIDR.
    pub cluster_cidr: String,
    /// The node's uplink address, if it has an uplink.
    pub node_ip: Option<Ipv4Addr>,
    /// Remote nodes known.
    pub nodes: usize,
    /// Cluster store state (`single-node`, `synced`, `connecting`, ...).
    pub store: String,
    /// Masquerade settings and the NAT table's fill level.
    #[serde(default)]
    pub nat: NatStatus,
    /// The cluster store is in sync (always true without one).
    #[serde(default)]
    pub store_synced: bool,
    /// Ready: the datapath is attached and, in cluster mode, the store is
    /// in sync (what `/readyz` answers).
    #[serde(default)]
    pub ready: bool,
    /// Why not ready.
    #[serde(default)]
    pub not_ready: Option<String>,
    /// The latest failure of a background task (reconciliation, NAT
    /// collection), with its age.
    #[serde(default)]
    pub last_error: Option<String>,
    /// Fill level, capacity and memory of each map the agent fills.
    #[serde(default)]
    pub maps: Vec<MapUsage>,
    /// Conditions an operator should act on (a map nearly full or
    /// refusing entries), one sentence each.
    #[serde(default)]
    pub warnings: Vec<String>,
    /// The eBPF object the running programs were loaded from (empty from
    /// agents older than this field).
    #[serde(default)]
    pub ebpf: EbpfObject,
    /// Milliseconds since the agent gathered this status (it answers from
    /// a snapshot refreshed after each change and every second).
    #[serde(default)]
    pub age_ms: u64,
}

/// Which build of the datapath an agent loaded.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EbpfObject {
    /// `embedded` (built into rivetd) or the path given with
    /// `--ebpf-object`.
    pub source: String,
    /// Its build stamp (`RIVET_EBPF_STAMP` at build time, else the
    /// version), if it carries one.
    pub stamp: Option<String>,
    /// A short hash of its bytes (FNV-1a 64, hex).
    pub hash: String,
    /// Its size in bytes.
    pub bytes: u64,
}

/// One datapath map's usage.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapUsage {
    /// Map name.
    pub name: String,
    /// Entries in it.
    pub entries: u64,
    /// Its capacity (of the pinned map: what the kernel allocated).
    pub capacity: u64,
    /// Kernel memory charged for it (`memlock` of the map), bytes.
    pub memory_bytes: u64,
    /// Entries refused because it was full, since the agent started.
    pub full_refusals: u64,
    /// The configuration key that sizes it.
    pub config_key: String,
}

/// Masquerade settings and NAT table pressure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NatStatus {
    /// Masquerading pod traffic leaving the cluster.
    pub masquerade: bool,
    /// First NAT source port.
    pub port_min: u16,
    /// Last NAT source port.
    pub port_max: u16,
    /// Entries in the NAT map at the last collection (two per flow).
    pub entries: u64,
    /// Capacity of the NAT map.
    pub max_entries: u64,
    /// Entries expired by the collector since the agent started.
    pub expired: u64,
    /// Entries whose partner was gone (evicted by the full LRU table).
    pub orphaned: u64,
    /// Entries the full table recycled (LRU evictions), since the table
    /// was created: created − live − removed by the collector.
    #[serde(default)]
    pub evicted: u64,
    /// Flows the collector had doomed but found used again before
    /// removing them (kept), since the agent started.
    #[serde(default)]
    pub spared: u64,
    /// Collections run.
    pub collections: u64,
}

/// Address pool usage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolStatus {
    /// Addresses the agent can hand out.
    pub size: u64,
    /// Addresses leased.
    pub used: u64,
}

impl PoolStatus {
    /// Addresses still free.
    pub const fn free(&self) -> u64 {
        self.size.saturating_sub(self.used)
    }
}

/// What the agent answers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Response {
    /// The endpoint that was created.
    Endpoint(Endpoint),
    /// All endpoints.
    Endpoints {
        /// The endpoints, sorted by IP.
        endpoints: Vec<Endpoint>,
    },
    /// Result of a delete.
    Deleted {
        /// False when there was nothing to delete (DEL is idempotent).
        existed: bool,
    },
    /// Every resource of the attachment is in place.
    Checked {},
    /// Remote nodes.
    Nodes {
        /// By subnet.
        nodes: Vec<NodeEntry>,
    },
    /// Result of a GC.
    Collected {
        /// The attachments that were removed.
        removed: Vec<EndpointRef>,
    },
    /// Datapath counters.
    Stats {
        /// Every counter, in index order.
        counters: Vec<CounterValue>,
        /// Each limited direction of each pod: its shaping figures.
        #[serde(default)]
        bandwidth: Vec<BandwidthFigures>,
    },
    /// Agent status.
    Status(AgentStatus),
    /// NAT entries.
    Nat {
        /// The entries (filtered, limited).
        entries: Vec<NatFlow>,
        /// Entries in the table (before filtering): counted when the
        /// listing read the whole table, else the last collection's count.
        total: usize,
        /// The `offset` of the next page (`NatPage`), if the table may hold
        /// more matching entries.
        #[serde(default)]
        next: Option<usize>,
    },
    /// hostPort mappings.
    Portmaps {
        /// By hostPort.
        mappings: Vec<PortmapEntry>,
    },
    /// A page of hostPort mappings (`PortmapPage`).
    PortmapPage {
        /// This page, by hostPort.
        mappings: Vec<PortmapEntry>,
        /// The `offset` of the next page, if the map may hold more.
        #[serde(default)]
        next: Option<usize>,
    },
    /// What an apply or delete did, object by object, in document order.
    Applied {
        /// One per object of the document.
        results: Vec<ObjectResult>,
    },
    /// Stored objects, as Kubernetes serializes them.
    Objects {
        /// By namespace and name.
        items: Vec<serde_json::Value>,
    },
    /// The Services the node serves.
    Services(ServiceList),
    /// The NetworkPolicy of the node's pods.
    Policy(PolicyList),
    /// The node's BGP state.
    Bgp(BgpStatus),
    /// The request failed.
    Error(ApiError),
}

/// Category of a failed request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request is malformed or has invalid values.
    BadRequest,
    /// It conflicts with existing state (address in use, interface exists...).
    Conflict,
    /// Something it names does not exist (network namespace, ...).
    NotFound,
    /// No address left in the pool.
    Exhausted,
    /// CHECK found a resource missing or wrong (the message names it).
    Missing,
    /// The agent failed; details in the message.
    Internal,
    /// Not possible yet (something the request depends on has not
    /// arrived); the same request may succeed later.
    Unavailable,
}

/// A failed request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// Category.
    pub kind: ErrorKind,
    /// One line naming what failed.
    pub message: String,
}

impl ApiError {
    /// Builds an error.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

/// Why a call to the agent failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nobody listens on the socket (agent down) or it cannot be opened.
    #[error("cannot connect to the agent at {path}: {source}")]
    Connect {
        /// Socket path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The exchange failed or timed out.
    #[error("talking to the agent at {path}: {source}")]
    Io {
        /// Socket path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The answer is not a valid response.
    #[error("invalid response from the agent at {path}: {source}")]
    Decode {
        /// Socket path.
        path: PathBuf,
        /// Cause.
        source: serde_json::Error,
    },
    /// The agent answered with an error.
    #[error("{0}")]
    Api(ApiError),
}

/// A blocking client with a bounded timeout on every step.
#[derive(Clone, Debug)]
pub struct Client {
    path: PathBuf,
    timeout: Duration,
}

impl Client {
    /// A client for the socket at `path` (default timeout 10 s).
    pub fn new(path: impl AsRef<Path>) -> Self {
        Self {
            path: path.as_ref().to_owned(),
            timeout: Duration::from_secs(10),
        }
    }

    /// Changes the timeout applied to each read and write.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Starts a [`Request::Monitor`] stream: an iterator over the events
    /// that ends when the agent does. It also yields the agent's keep-alive
    /// events (`kind == "tick"`, one a second) so that a caller can stop
    /// reading even when nothing happens; skip them.
    pub fn monitor(
        &self,
        flows: bool,
        sample: Option<u32>,
    ) -> Result<impl Iterator<Item = Result<MonitorEvent, ClientError>> + use<>, ClientError> {
        use std::io::BufRead as _;
        let path = self.path.clone();
        let io = {
            let path = path.clone();
            move |source| ClientError::Io {
                path: path.clone(),
                source,
            }
        };
        let mut stream =
            UnixStream::connect(&self.path).map_err(|source| ClientError::Connect {
                path: self.path.clone(),
                source,
            })?;
        stream.set_write_timeout(Some(self.timeout)).map_err(&io)?;
        let body = serde_json::to_vec(&Request::Monitor { flows, sample }).map_err(|source| {
            ClientError::Decode {
                path: self.path.clone(),
                source,
            }
        })?;
        stream.write_all(&body).map_err(&io)?;
        stream.shutdown(std::net::Shutdown::Write).map_err(&io)?;
        let lines = std::io::BufReader::new(stream).lines();
        Ok(lines.map(move |line| {
            let line = line.map_err(&io)?;
            serde_json::from_str::<MonitorEvent>(&line).map_err(
                |source| match serde_json::from_str::<Response>(&line) {
                    Ok(Response::Error(e)) => ClientError::Api(e),
                    _ => ClientError::Decode {
                        path: path.clone(),
                        source,
                    },
                },
            )
        }))
    }

    /// Sends `request` and returns the response; an error response becomes
    /// [`ClientError::Api`].
    pub fn call(&self, request: &Request) -> Result<Response, ClientError> {
        let io = |source| ClientError::Io {
            path: self.path.clone(),
            source,
        };
        let mut stream =
            UnixStream::connect(&self.path).map_err(|source| ClientError::Connect {
                path: self.path.clone(),
                source,
            })?;
        stream.set_read_timeout(Some(self.timeout)).map_err(io)?;
        stream.set_write_timeout(Some(self.timeout)).map_err(io)?;
        let body = serde_json::to_vec(request).map_err(|source| ClientError::Decode {
            path: self.path.clone(),
            source,
        })?;
        stream.write_all(&body).map_err(io)?;
        stream.shutdown(std::net::Shutdown::Write).map_err(io)?;
        // Parsed as it arrives: the answer is complete at its closing brace,
        // without waiting for the agent's shutdown (EOF) behind it.
        let mut reader = std::io::BufReader::with_capacity(
            8192,
            Counted {
                inner: stream.take(MAX_MESSAGE),
                bytes: 0,
            },
        );
        let decoded =
            Response::deserialize(&mut serde_json::Deserializer::from_reader(&mut reader));
        let response = match decoded {
            Ok(r) => r,
            Err(e) if e.is_io() => return Err(io(std::io::Error::from(e))),
            // The agent went away mid-request (crash, kill): nothing was
            // answered, so the caller may try again.
            Err(e) if e.is_eof() && reader.get_ref().bytes == 0 => {
                return Err(io(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "connection closed without an answer",
                )));
            }
            Err(source) => {
                return Err(ClientError::Decode {
                    path: self.path.clone(),
                    source,
                });
            }
        };
        match response {
            Response::Error(e) => Err(ClientError::Api(e)),
            other => Ok(other),
        }
    }
}

/// A reader that counts the bytes it returned.
struct Counted<R> {
    inner: R,
    bytes: u64,
}

impl<R: std::io::Read> std::io::Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {

    fn bw(ir: Option<u64>, ib: Option<u64>, er: Option<u64>, eb: Option<u64>) -> Bandwidth {
        Bandwidth {
            ingress_rate: ir,
            ingress_burst: ib,
            egress_rate: er,
            egress_burst: eb,
        }
    }

    #[test]
    fn bandwidth_refused_as_the_reference_plugin_refuses_it() {
        assert!(
            bw(Some(1_000_000), Some(8_000_000), None, None)
                .validate()
                .is_ok()
        );
        assert!(bw(None, None, None, None).validate().is_ok());
        let e = bw(Some(1_000_000), None, None, None)
            .validate()
            .expect_err("refused");
        assert!(e.contains("ingressBurst must be set"), "{e}");
        let e = bw(None, None, None, Some(1000))
            .validate()
            .expect_err("refused");
        assert!(e.contains("egressRate must be set"), "{e}");
        let e = bw(None, None, Some(1000), Some(8 * u64::from(u32::MAX)))
            .validate()
            .expect_err("refused");
        assert!(e.contains("4 GiB"), "{e}");
        assert!(bw(Some(7), Some(100), None, None).validate().is_err());
        assert!(bw(Some(8), Some(100), None, None).limits_any());
        assert!(!bw(Some(0), Some(0), None, None).limits_any());
    }

    use super::*;

    #[test]
    fn cni_ids_follow_the_libcni_pattern() {
        for good in ["a", "a1_b.c-d", "ABC123", "0-"] {
            assert_eq!(check_cni_id("container ID", good), Ok(()), "{good:?}");
        }
        for (bad, why) in [
            ("", "container ID is empty"),
            ("-a", "must start with a letter or digit"),
            ("_a", "must start with a letter or digit"),
            ("a/b", "may only contain"),
            ("a b", "may only contain"),
            ("é", "must start with a letter or digit"),
        ] {
            let e = check_cni_id("container ID", bad).expect_err(bad);
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        assert!(
            check_cni_id("network name", "net/1")
                .expect_err("slash")
                .starts_with("network name")
        );
    }

    #[test]
    fn requests_round_trip() {
        let req = Request::EndpointAdd(
            EndpointSpec::new("c1", "/run/netns/p1").with_ip(Ipv4Addr::new(10, 244, 0, 2)),
        );
        let text = serde_json::to_string(&req).expect("serialize");
        assert!(
            text.starts_with(r#"{"op":"endpoint_add","container_id":"c1","netns":"/run/netns/p1","ifname":"eth0","ip":"10.244.0.2""#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<Request>(&text).expect("parse"), req);
    }

    #[test]
    fn minimal_add_and_port_mappings_parse() {
        let req: Request = serde_json::from_str(
            r#"{"op":"endpoint_add","container_id":"c","netns":"/x",
                "port_mappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]}"#,
        )
        .expect("parse");
        let Request::EndpointAdd(spec) = req else {
            panic!("wrong op");
        };
        assert_eq!(spec.ip, None);
        assert_eq!(spec.ifname, "eth0");
        assert_eq!(spec.port_mappings[0].protocol, Protocol::Tcp);
        assert!(
            serde_json::from_str::<PortMapping>(
                r#"{"hostPort":70000,"containerPort":80,"protocol":"tcp"}"#
            )
            .is_err()
        );
        assert!(
            serde_json::from_str::<PortMapping>(
                r#"{"hostPort":80,"containerPort":80,"protocol":"icmp"}"#
            )
            .is_err()
        );
    }

    #[test]
    fn host_ifnames_are_stable() {
        // Pinned values: changing the derivation would orphan every veth of
        // an upgraded node.
        assert_eq!(host_ifname("abc", "eth0").len(), 15);
        assert_eq!(host_ifname("abc", "eth0"), host_ifname("abc", "eth0"));
        assert_ne!(host_ifname("abc", "eth0"), host_ifname("ab", "ceth0"));
        assert_eq!(
            host_ifname("", ""),
            format!(
                "rv{:013x}",
                0xaf63_bd4c_8601_b7df_u64 & 0x000f_ffff_ffff_ffff
            )
        );
    }

    #[test]
    fn ifname_defaults_to_eth0() {
        let req: Request =
            serde_json::from_str(r#"{"op":"endpoint_del","container_id":"c1"}"#).expect("parse");
        assert_eq!(req, Request::EndpointDel(EndpointRef::new("c1", "eth0")));
    }

    #[test]
    fn network_scoping() {
        let req: Request = serde_json::from_str(
            r#"{"op":"endpoint_del","container_id":"c1","ifname":"net1","network":"a"}"#,
        )
        .expect("parse");
        assert_eq!(
            req,
            Request::EndpointDel(EndpointRef::new("c1", "net1").in_network("a"))
        );
        // A GC names its network; without one it is refused.
        assert!(serde_json::from_str::<Request>(r#"{"op":"gc","valid":[]}"#).is_err());
        let mut ep: Endpoint = serde_json::from_str(
            r#"{"container_id":"c","ifname":"eth0","netns":"/x","ip":"10.0.0.2","mac":"","host_ifname":"rv","host_ifindex":1,"host_mac":"","mtu":1500,"gateway":"169.254.1.1","state":"ready"}"#,
        )
        .expect("a record written before networks were recorded");
        assert_eq!(ep.network, None);
        assert!(ep.belongs_to(Some("a")) && ep.belongs_to(None));
        ep.network = Some("a".into());
        assert!(ep.belongs_to(Some("a")) && ep.belongs_to(None));
        assert!(!ep.belongs_to(Some("b")));
    }

    #[test]
    fn unknown_fields_and_ops_are_rejected() {
        assert!(serde_json::from_str::<Request>(r#"{"op":"endpoint_list","x":1}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"op":"reboot"}"#).is_err());
        assert!(
            serde_json::from_str::<Request>(
                r#"{"op":"endpoint_add","container_id":"c","netns":"/x","ip":"10.0.0.300"}"#
            )
            .is_err()
        );
    }

    #[test]
    fn connecting_to_nothing_fails_fast() {
        let err = Client::new("/nonexistent/rivet.sock")
            .call(&Request::Status {})
            .expect_err("no agent");
        assert!(matches!(err, ClientError::Connect { .. }), "{err}");
        assert!(err.to_string().contains("/nonexistent/rivet.sock"));
    }

    #[test]
    fn protocols_by_number_and_name() {
        for (n, name) in [(1, "icmp"), (6, "tcp"), (17, "udp"), (132, "sctp")] {
            let p = Protocol::from_number(n);
            assert_eq!((p.number(), p.to_string()), (n, name.to_owned()));
            assert_eq!(name.parse::<Protocol>(), Ok(p));
            assert_eq!(name.to_uppercase().parse::<Protocol>(), Ok(p));
        }
        assert_eq!(Protocol::from_number(47), Protocol::Other(47));
        assert_eq!(Protocol::Other(47).to_string(), "47");
        assert_eq!("47".parse::<Protocol>(), Ok(Protocol::Other(47)));
        assert!("gre".parse::<Protocol>().is_err());
        assert_eq!(
            serde_json::to_string(&Protocol::Udp).expect("serialize"),
            r#""udp""#
        );
        // A port mapping takes the CNI set, in lowercase, only.
        let pm = |proto: &str| {
            serde_json::from_str::<PortMapping>(&format!(
                r#"{{"hostPort":80,"containerPort":80,"protocol":"{proto}"}}"#
            ))
        };
        assert_eq!(pm("sctp").expect("sctp").protocol, Protocol::Sctp);
        assert!(pm("TCP").is_err() && pm("6").is_err() && pm("icmp").is_err());
    }

    #[test]
    fn paging_requests_default() {
        let req: Request = serde_json::from_str(r#"{"op":"nat_page"}"#).expect("parse");
        assert_eq!(
            req,
            Request::NatPage {
                ip: None,
                port: None,
                offset: 0,
                limit: None
            }
        );
        let old: Response =
            serde_json::from_str(r#"{"result":"nat","entries":[],"total":3}"#).expect("old answer");
        assert!(matches!(old, Response::Nat { next: None, .. }), "{old:?}");
    }

    #[test]
    fn service_listings_round_trip() {
        let req: Request = serde_json::from_str(r#"{"op":"services"}"#).expect("services");
        assert_eq!(req, Request::Services {});
        let list = ServiceList {
            services: vec![ServicePortStatus {
                namespace: "default".into(),
                name: "web".into(),
                port_name: "http".into(),
                protocol: Protocol::Tcp,
                port: Some(80),
                id: Some(0),
                frontends: vec![ServiceFrontend {
                    kind: ServiceFrontendKind::ClusterIp,
                    address: Ipv4Addr::new(10, 96, 0, 10),
                    port: 80,
                    scope: ServiceScope::Internal,
                    backends: 1,
                }],
                backends: vec![ServiceBackend {
                    address: Ipv4Addr::new(10, 244, 1, 2),
                    port: 8080,
                    local: true,
                }],
                affinity_timeout: None,
                external_local: false,
                internal_local: false,
                counters: ServiceCounters {
                    sockets: 3,
                    ..ServiceCounters::default()
                },
            }],
            totals: ServiceCounters {
                sockets: 3,
                ..ServiceCounters::default()
            },
            frontend_entries: 1,
            frontend_capacity: 65_536,
            backend_entries: 1,
            backend_capacity: 262_144,
        };
        let answer = Response::Services(list);
        let text = serde_json::to_string(&answer).expect("serialize");
        assert!(
            text.starts_with(r#"{"result":"services","services":[{"namespace":"default""#),
            "{text}"
        );
        assert!(
            text.contains(
                r#""kind":"ClusterIP","address":"10.96.0.10","port":80,"scope":"internal""#
            ),
            "{text}"
        );
        assert!(text.contains(r#""protocol":"tcp""#), "{text}");
        assert_eq!(
            serde_json::from_str::<Response>(&text).expect("parse"),
            answer
        );
        let a = ServiceCounters {
            sockets: u64::MAX,
            flows: 1,
            rejected: 2,
            affinity_hits: 3,
        };
        assert_eq!(
            a.plus(a),
            ServiceCounters {
                sockets: u64::MAX,
                flows: 2,
                rejected: 4,
                affinity_hits: 6
            }
        );
        assert_eq!(
            ServiceFrontendKind::LoadBalancer.to_string(),
            "LoadBalancer"
        );
    }

    #[test]
    fn object_requests_carry_the_document_text() {
        let req: Request =
            serde_json::from_str(r#"{"op":"apply","document":"kind: Service\n"}"#).expect("apply");
        assert_eq!(
            req,
            Request::Apply {
                document: "kind: Service\n".into()
            }
        );
        let req: Request =
            serde_json::from_str(r#"{"op":"delete","document":"x"}"#).expect("delete");
        assert_eq!(
            req,
            Request::Delete {
                document: "x".into(),
                ignore_not_found: false
            }
        );
        let req: Request = serde_json::from_str(r#"{"op":"get","kind":"svc"}"#).expect("get");
        assert_eq!(
            req,
            Request::Get {
                kind: "svc".into(),
                namespace: None,
                name: None
            }
        );
        assert!(serde_json::from_str::<Request>(r#"{"op":"apply"}"#).is_err());
        let answer = Response::Applied {
            results: vec![ObjectResult {
                kind: "Service".into(),
                namespace: "default".into(),
                name: "web".into(),
                outcome: "created".into(),
            }],
        };
        let text = serde_json::to_string(&answer).expect("serialize");
        assert!(
            text.starts_with(r#"{"result":"applied","results":[{"kind":"Service""#),
            "{text}"
        );
        let listing: Response = serde_json::from_str(
            r#"{"result":"objects","items":[{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"a"}}]}"#,
        )
        .expect("objects");
        let Response::Objects { items } = listing else {
            panic!("not objects: {listing:?}");
        };
        assert_eq!(items[0]["metadata"]["name"], "a");
    }
}
