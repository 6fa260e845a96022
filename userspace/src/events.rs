//! Datapath events: a task reads the `EVENTS` ring buffer with its own handle
//! on the pinned map (tokio `AsyncFd`, woken by the kernel), decodes each
//! record — reason name, interface name via `if_indextoname` in the node's
//! namespace, 5-tuple — and fans it out to `monitor` clients over a broadcast
//! channel (what the datapath writes: `ebpf/src/events.rs`). Flow events are
//! switched on in `EVENT_CONFIG` while at least one client asks for them — the
//! finest sampling any of them asked for — and off (0) again when the last one
//! leaves: no client, no cost beyond one map lookup per packet. NetworkPolicy's
//! allow verdicts (one per new flow to or from an isolated pod) are written
//! only while any client listens (`tunable::POLICY_EVENTS`): written always,
//! they woke the agent for every new connection (14–24 µs of agent CPU per
//! connection, measured 2026-12-01). Drops are cheap to report because they
//! are rare.

use std::{
    net::Ipv4Addr,
    path::PathBuf,
    sync::{Arc, Mutex, PoisonError},
    time::{SystemTime, UNIX_EPOCH},
};

use aya::maps::{Array, Map, MapData, MapError, RingBuf};
use rivet_api::MonitorEvent;
use rivet_common::{Counter, Event, EventConfig, event_kind, ipv4_from_key};
use tokio::{io::unix::AsyncFd, sync::broadcast};

/// Events errors.
#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    /// A pinned map could not be opened.
    #[error("event map {path}: {source}")]
    Map {
        /// Pin path.
        path: PathBuf,
        /// Cause.
        source: Box<MapError>,
    },
    /// Waiting on the ring buffer failed.
    #[error("event ring buffer {path}: {source}")]
    Io {
        /// Pin path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
}

/// The agent's event hub.
#[derive(Debug)]
pub struct Events {
    tx: broadcast::Sender<MonitorEvent>,
    /// Interface names by index, looked up once per index (at flow-event
    /// rates a lookup per event would cost more than the event).
    names: Mutex<std::collections::HashMap<u32, Option<String>>>,
    /// Sampling rates the flow subscribers asked for (the finest wins).
    flow_wants: Mutex<Vec<u32>>,
    /// Which Service an event is about (see [`ServiceNames`]).
    services: std::sync::RwLock<Arc<ServiceNames>>,
    /// The Services changed since `services` was made.
    names_stale: std::sync::atomic::AtomicBool,
    /// Names for NetworkPolicy verdicts (see [`PolicyNames`]).
    policies: std::sync::RwLock<Arc<PolicyNames>>,
    ring_pin: PathBuf,
    config_pin: PathBuf,
    /// `TUNABLES`: its `POLICY_EVENTS` slot is on while anyone listens.
    tunables_pin: PathBuf,
    /// Clients listening.
    listeners: std::sync::atomic::AtomicUsize,
}

/// A client's view; dropping it withdraws its flow request.
pub struct Subscription<'a> {
    /// The events.
    pub rx: broadcast::Receiver<MonitorEvent>,
    hub: &'a Events,
    flow: Option<u32>,
}

impl Drop for Subscription<'_> {
    fn drop(&mut self) {
        if self
            .hub
            .listeners
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst)
            == 1
        {
            self.hub.set_policy_events(false);
        }
        if let Some(rate) = self.flow {
            let mut wants = self
                .hub
                .flow_wants
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(i) = wants.iter().position(|w| *w == rate) {
                wants.remove(i);
            }
            self.hub.apply(&wants);
        }
    }
}

impl Events {
    /// A hub for the maps pinned at `ring_pin`, `config_pin` and
    /// `tunables_pin`.
    pub fn new(ring_pin: PathBuf, config_pin: PathBuf, tunables_pin: PathBuf) -> Self {
        let (tx, _) = broadcast::channel(4096);
        let hub = Self {
            tx,
            names: Mutex::new(std::collections::HashMap::new()),
            flow_wants: Mutex::new(Vec::new()),
            services: std::sync::RwLock::new(Arc::new(ServiceNames::default())),
            policies: std::sync::RwLock::new(Arc::new(PolicyNames::default())),
            names_stale: std::sync::atomic::AtomicBool::new(true),
            ring_pin,
            config_pin,
            tunables_pin,
            listeners: std::sync::atomic::AtomicUsize::new(0),
        };
        // A previous agent may have left flow and policy events on.
        hub.apply(&[]);
        hub.set_policy_events(false);
        hub
    }

    /// Subscribes; `flow`: also flow events, one packet in this many.
    pub fn subscribe(&self, flow: Option<u32>) -> Subscription<'_> {
        if self
            .listeners
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            == 0
        {
            self.set_policy_events(true);
        }
        let flow = flow.map(|f| f.max(1));
        if let Some(rate) = flow {
            let mut wants = self
                .flow_wants
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            wants.push(rate);
            self.apply(&wants);
        }
        Subscription {
            rx: self.tx.subscribe(),
            hub: self,
            flow,
        }
    }

    /// Switches NetworkPolicy's allow verdict events on or off
    /// (`tunable::POLICY_EVENTS`).
    pub fn set_policy_events(&self, on: bool) {
        let result = MapData::from_pin(&self.tunables_pin).and_then(|data| {
            let mut array: Array<MapData, u64> = Array::try_from(Map::Array(data))?;
            array.set(rivet_common::tunable::POLICY_EVENTS, u64::from(on), 0)
        });
        if let Err(e) = result {
            tracing::warn!(error = %e, "switching policy verdict events");
        }
    }

    /// Writes the flow sampling the subscribers need (0: off).
    fn apply(&self, wants: &[u32]) {
        let flow_sample = wants.iter().copied().min().unwrap_or(0);
        let result = MapData::from_pin(&self.config_pin).and_then(|data| {
            let mut array: Array<MapData, EventConfig> = Array::try_from(Map::Array(data))?;
            array.set(0, EventConfig { flow_sample }, 0)
        });
        if let Err(e) = result {
            tracing::warn!(error = %e, "switching flow events");
        }
    }

    /// Reads the ring buffer until the task is aborted.
    pub async fn run(&self) -> Result<(), EventsError> {
        let map_err = |source| EventsError::Map {
            path: self.ring_pin.clone(),
            source: Box::new(source),
        };
        let data = MapData::from_pin(&self.ring_pin).map_err(map_err)?;
        let ring = RingBuf::try_from(Map::RingBuf(data)).map_err(map_err)?;
        // SAFETY: the ring buffer owns its map fd for as long as it lives,
        // and the AsyncFd owns the ring buffer: the fd stays open and the
        // same until the AsyncFd is dropped.
        let mut fd = unsafe { AsyncFd::register(ring) }.map_err(|e| EventsError::Io {
            path: self.ring_pin.clone(),
            source: e.into(),
        })?;
        loop {
            let mut guard = fd.readable_mut().await.map_err(|source| EventsError::Io {
                path: self.ring_pin.clone(),
                source,
            })?;
            let ring = guard.get_inner_mut();
            while let Some(item) = ring.next() {
                let Some(ev) = parse_record(&item) else {
                    continue;
                };
                if self.tx.receiver_count() == 0 {
                    continue;
                }
                let mut decoded = decode(&ev);
                decoded.ifname = self.ifname(ev.ifindex);
                decoded.service = self.service_of(&ev);
                self.name_policy(&ev, &mut decoded);
                // No subscriber: the event is simply not kept.
                let _ = self.tx.send(decoded);
            }
            guard.clear_ready();
            // Names of interfaces that went away must not stick forever.
            let mut names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
            if names.len() > 4096 {
                names.clear();
            }
        }
    }
}

/// Who serves what, for naming the Service of an event: frontends
/// (address, port, IP protocol; address 0.0.0.0 for a NodePort) and
/// backends, each to `namespace/name:port`. The agent replaces it after
/// every change of the Services.
#[derive(Debug, Default)]
pub struct ServiceNames {
    /// Frontends.
    pub frontends: std::collections::HashMap<(Ipv4Addr, u16, u8), String>,
    /// Backends (one name when several Services share a backend).
    pub backends: std::collections::HashMap<(Ipv4Addr, u16, u8), String>,
}

/// Names for NetworkPolicy verdicts: the policies by the agent's number
/// and this node's pods by address. The agent replaces it after every
/// policy sync.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PolicyNames {
    /// `namespace/name` of each policy.
    pub policies: std::collections::HashMap<u32, String>,
    /// `namespace/name` of each local pod.
    pub pods: std::collections::HashMap<Ipv4Addr, String>,
}

impl Events {
    /// Replaces the names policy verdicts are labelled with.
    pub fn set_policy_names(&self, names: PolicyNames) {
        let mut held = self
            .policies
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if **held != names {
            *held = Arc::new(names);
        }
    }

    /// Fills the pod and the policy of a verdict: a `policy` event (the pod
    /// of its direction, the policy that allowed), a policy drop (the pod
    /// no rule of which allowed).
    fn name_policy(&self, ev: &Event, decoded: &mut MonitorEvent) {
        let ingress = match ev.kind {
            event_kind::POLICY => ev.counter == u16::from(rivet_common::policy_dir::INGRESS),
            _ => match Counter::from_index(u32::from(ev.counter)) {
                Some(Counter::DropPolicyIngress) => true,
                Some(Counter::DropPolicyEgress) => false,
                _ => return,
            },
        };
        let names = Arc::clone(&self.policies.read().unwrap_or_else(PoisonError::into_inner));
        let pod = Ipv4Addr::from(ipv4_from_key(if ingress { ev.dst } else { ev.src }));
        decoded.pod = names.pods.get(&pod).cloned();
        if ev.kind == event_kind::POLICY {
            decoded.policy = names.policies.get(&ev.len).cloned();
        }
    }

    /// Whether a monitor client listens (Service names are kept current
    /// only then).
    pub fn watched(&self) -> bool {
        self.tx.receiver_count() > 0
    }

    /// Says the Service names are out of date (the Services changed while
    /// nobody watched).
    pub fn names_stale(&self) {
        self.names_stale
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the Service names are out of date.
    pub fn names_are_stale(&self) -> bool {
        self.names_stale.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Replaces the Service names events are labelled with.
    pub fn set_service_names(&self, names: ServiceNames) {
        self.names_stale
            .store(false, std::sync::atomic::Ordering::Relaxed);
        let mut held = self
            .services
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        *held = Arc::new(names);
    }

    /// The Service an event is about: a frontend it was addressed to
    /// (a NodePort's only for the Service counters), or — translated at the
    /// uplink (`fwd_svc`, `rev_dnat`) — the backend it went to or came from.
    fn service_of(&self, ev: &Event) -> Option<String> {
        if ev.proto != 6 && ev.proto != 17 {
            return None;
        }
        let names = Arc::clone(&self.services.read().unwrap_or_else(PoisonError::into_inner));
        if names.frontends.is_empty() {
            return None;
        }
        let addr = |a: u32| Ipv4Addr::from(ipv4_from_key(a));
        let (src, dst) = (
            (addr(ev.src), u16::from_be(ev.sport), ev.proto),
            (addr(ev.dst), u16::from_be(ev.dport), ev.proto),
        );
        let counter = Counter::from_index(u32::from(ev.counter));
        let svc_counter = matches!(
            counter,
            Some(Counter::FwdSvc | Counter::DropSvcNoBackend | Counter::DropSvcBackendUnreachable)
        );
        let translated = matches!(counter, Some(Counter::FwdSvc | Counter::RevDnat));
        names
            .frontends
            .get(&dst)
            .or_else(|| {
                svc_counter
                    .then(|| names.frontends.get(&(Ipv4Addr::UNSPECIFIED, dst.1, dst.2)))
                    .flatten()
            })
            .or_else(|| {
                translated
                    .then(|| {
                        names
                            .backends
                            .get(&dst)
                            .or_else(|| names.backends.get(&src))
                    })
                    .flatten()
            })
            .cloned()
    }

    /// The (cached) name of interface `index`; a miss is looked up again.
    fn ifname(&self, index: u32) -> Option<String> {
        let mut names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(Some(name)) = names.get(&index) {
            return Some(name.clone());
        }
        let name = ifname(index);
        names.insert(index, name.clone());
        name
    }
}

/// The `Event` at the start of a ring-buffer record; `None` when the
/// record is too short to hold one.
pub fn parse_record(item: &[u8]) -> Option<Event> {
    if item.len() < size_of::<Event>() {
        return None;
    }
    // SAFETY: `item` holds at least `size_of::<Event>()` bytes (checked),
    // `Event` is plain old data (`#[repr(C)]` integers, every bit pattern
    // valid); read unaligned, as a copy.
    Some(unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<Event>()) })
}

/// The API form of a datapath record (interface name not filled in).
pub fn decode(ev: &Event) -> MonitorEvent {
    let reason = Counter::from_index(u32::from(ev.counter)).map_or_else(
        || format!("counter_{}", ev.counter),
        |c| c.name().to_owned(),
    );
    let reason = reason.strip_prefix("drop_").unwrap_or(&reason).to_owned();
    let addr = |a: u32| Ipv4Addr::from(ipv4_from_key(a));
    let (proto, src, dst, icmp) = match ev.proto {
        0 => (String::new(), String::new(), String::new(), None),
        1 => (
            rivet_api::Protocol::Icmp.to_string(),
            addr(ev.src).to_string(),
            addr(ev.dst).to_string(),
            Some(format!("{}/{}", ev.sport, ev.dport)),
        ),
        p @ (6 | 17) => (
            rivet_api::Protocol::from_number(p).to_string(),
            format!("{}:{}", addr(ev.src), u16::from_be(ev.sport)),
            format!("{}:{}", addr(ev.dst), u16::from_be(ev.dport)),
            None,
        ),
        p => (
            rivet_api::Protocol::from_number(p).to_string(),
            addr(ev.src).to_string(),
            addr(ev.dst).to_string(),
            None,
        ),
    };
    let (kind, reason, len) = match ev.kind {
        event_kind::DROP => ("drop", reason, ev.len),
        event_kind::POLICY => {
            let dir = if ev.counter == u16::from(rivet_common::policy_dir::INGRESS) {
                "allow_ingress"
            } else {
                "allow_egress"
            };
            ("policy", dir.to_owned(), 0)
        }
        _ => ("flow", reason, ev.len),
    };
    MonitorEvent {
        kind: kind.into(),
        reason,
        ifindex: ev.ifindex,
        ifname: None,
        service: None,
        pod: None,
        policy: None,
        proto,
        src,
        dst,
        icmp,
        len,
        time: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64()),
        lost: 0,
    }
}

/// The name of interface `index` in the agent's namespace.
fn ifname(index: u32) -> Option<String> {
    let mut buf = [0u8; libc::IF_NAMESIZE];
    // SAFETY: `buf` has IF_NAMESIZE bytes, as if_indextoname requires.
    let name = unsafe { libc::if_indextoname(index, buf.as_mut_ptr().cast()) };
    if name.is_null() {
        return None;
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    Some(String::from_utf8_lossy(&buf[..end]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_shorter_than_an_event_are_skipped() {
        let mut bytes = vec![0u8; size_of::<Event>() + 3];
        bytes[0] = event_kind::DROP;
        bytes[1] = 17;
        bytes[4..8].copy_from_slice(&7u32.to_ne_bytes());
        assert!(parse_record(&bytes[..size_of::<Event>() - 1]).is_none());
        // Unaligned and with trailing bytes: still the record at the start.
        let ev = parse_record(&bytes[..size_of::<Event>()]).expect("a whole record");
        assert_eq!((ev.kind, ev.proto, ev.ifindex), (event_kind::DROP, 17, 7));
        let mut shifted = vec![0u8];
        shifted.extend_from_slice(&bytes);
        let ev = parse_record(&shifted[1..]).expect("unaligned record");
        assert_eq!(ev.ifindex, 7);
    }

    #[test]
    fn decodes_a_tcp_drop() {
        let ev = Event {
            kind: event_kind::DROP,
            proto: 6,
            counter: Counter::DropSpoofedIp.index() as u16,
            ifindex: 0,
            src: rivet_common::ipv4_key([10, 0, 0, 2]),
            dst: rivet_common::ipv4_key([10, 0, 0, 3]),
            sport: 1234u16.to_be(),
            dport: 80u16.to_be(),
            len: 60,
        };
        let m = decode(&ev);
        assert_eq!(
            (m.kind.as_str(), m.reason.as_str(), m.proto.as_str()),
            ("drop", "spoofed_ip", "tcp")
        );
        assert_eq!(
            (m.src.as_str(), m.dst.as_str()),
            ("10.0.0.2:1234", "10.0.0.3:80")
        );
    }
}
