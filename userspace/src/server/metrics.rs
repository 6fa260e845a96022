//! Prometheus metrics and health endpoints of the agent, a second listener on
//! `metrics_addr` (default 127.0.0.1:9402, TCP in the node's network
//! namespace), served by hyper:
//!
//! - `GET /metrics`: OpenMetrics text. Datapath counters per reason and path,
//!   map fill levels, endpoints, IPAM pool, cluster state, API request latency
//!   by CNI verb, and per Service port (labels `namespace`, `service`, `port`:
//!   the port's name, or its number when unnamed) the counters
//!   `rivet_service_{sockets,flows,rejected,affinity_hits}_total` with the
//!   Service maps' fill `rivet_service_{frontends,backends}[_capacity]`, and
//!   the new flows NetworkPolicy allowed `rivet_policy_allowed_flows_total
//!   {direction}` (its denied packets are `rivet_drop_packets_total{reason=
//!   "policy_ingress"|"policy_egress"}`), and per limited pod and direction
//!   (labels `pod`, `direction`) `rivet_bandwidth_{limit_bits,queued_bytes}`
//!   and `rivet_bandwidth_{sent_bytes,dropped_packets,delayed_packets}_total`,
//!   and in `bgp` mode per session (labels `peer`, `role`)
//!   `rivet_bgp_session_established`, `rivet_bgp_prefixes_{received,
//!   advertised}`, `rivet_bgp_session_changes_total`, with
//!   `rivet_bgp_speaker_up`, `rivet_bgp_routes_{learned,suppressed}` —
//!   see [`encode`].
//! - `GET /healthz`: 200 while the agent serves.
//! - `GET /readyz`: 200 when the datapath is attached and, in cluster mode, the
//!   store is synced; 503 with the reason otherwise.
//!
//! A scrape builds a fresh `prometheus-client` registry from a snapshot taken
//! through the same code as `status` and `stats` (the per-CPU `STATS` map
//! summed, map fills, NAT pressure from the collector, pool, cluster state):
//! nothing is cached, so a scrape is always the kernel's current view. Counter
//! names map to families by prefix (`family_of`): `drop_*` →
//! `rivet_drop_*{reason}`, `fwd_*`/`rev_*`/`decap_*`/`deliver_host` →
//! `rivet_forward_*{path}`, the rest → `rivet_pass_*{reason}`. The only state
//! the agent keeps for metrics is the request-latency histogram family,
//! observed in `server::handle` per request, labelled with the CNI verb it
//! serves (ADD = `endpoint_add`, DEL, CHECK, GC, STATUS) — internal status
//! calls for scrapes and probes bypass it. Ready = the uplink (if configured)
//! runs `from_uplink` (checked from the live links at each call) and, with
//! etcd, the store state is `etcd: synced`; `rivetctl status` exits 1 when not
//! ready, naming why.

use std::{convert::Infallible, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode, body::Incoming, header::CONTENT_TYPE};
use hyper_util::rt::TokioIo;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};
use rivet_api::{AgentStatus, CounterValue, MapUsage};
use tokio::net::TcpListener;

use crate::agent::{Agent, RequestMetrics};

/// What one scrape reports, gathered by the agent.
#[derive(Debug)]
pub struct Snapshot {
    /// Datapath counters.
    pub counters: Vec<CounterValue>,
    /// Agent status.
    pub status: AgentStatus,
    /// Readiness.
    pub ready: bool,
    /// The Services with their counters (`None`: they could not be read;
    /// their metrics are left out).
    pub services: Option<rivet_api::ServiceList>,
    /// New flows NetworkPolicy allowed (ingress, egress); `None`: not read.
    pub policy_allowed: Option<(u64, u64)>,
    /// Each limited direction of each pod.
    pub bandwidth: Vec<rivet_api::BandwidthFigures>,
    /// `bgp` mode: the speaker and its sessions.
    pub bgp: Option<rivet_api::BgpStatus>,
}

/// Per-session BGP figures: (metric, help, type, value).
type BgpMetric = (
    &'static str,
    &'static str,
    prometheus_client::metrics::MetricType,
    fn(&rivet_api::BgpSession) -> u64,
);

/// Figures of each BGP session, labelled `peer`, `role`.
const BGP_SESSIONS: [BgpMetric; 4] = {
    use prometheus_client::metrics::MetricType::{Counter, Gauge};
    [
        (
            "rivet_bgp_session_established",
            "1 while the BGP session is Established, else 0",
            Gauge,
            |s| u64::from(s.state == "Established"),
        ),
        (
            "rivet_bgp_prefixes_received",
            "Prefixes the peer sent that the speaker imported",
            Gauge,
            |s| s.received,
        ),
        (
            "rivet_bgp_prefixes_advertised",
            "Prefixes the speaker advertises to the peer",
            Gauge,
            |s| s.advertised,
        ),
        (
            "rivet_bgp_session_changes",
            "State changes of the session the agent saw",
            Counter,
            |s| s.changes,
        ),
    ]
};

/// Per-pod shaping figures: (metric, help, type, value).
type BandwidthMetric = (
    &'static str,
    &'static str,
    prometheus_client::metrics::MetricType,
    fn(&rivet_api::BandwidthFigures) -> u64,
);

/// Figures of each limited direction of each pod, labelled `pod`,
/// `direction`.
const BANDWIDTH: [BandwidthMetric; 5] = {
    use prometheus_client::metrics::MetricType::{Counter, Gauge};
    [
        (
            "rivet_bandwidth_limit_bits",
            "The pod's bandwidth limit in this direction, bit/s",
            Gauge,
            |b| b.rate,
        ),
        (
            "rivet_bandwidth_sent_bytes",
            "Bytes the pod's shaper sent on in this direction",
            Counter,
            |b| b.sent_bytes,
        ),
        (
            "rivet_bandwidth_dropped_packets",
            "Packets dropped over the pod's limit (shaper queue full; egress also drop_bandwidth)",
            Counter,
            |b| b.dropped,
        ),
        (
            "rivet_bandwidth_delayed_packets",
            "Packets that waited for the pod's rate",
            Counter,
            |b| b.delayed,
        ),
        (
            "rivet_bandwidth_queued_bytes",
            "Bytes waiting in the pod's shaper now",
            Gauge,
            |b| b.backlog_bytes,
        ),
    ]
};

/// The per-Service-port counters: (metric, help, value).
type ServiceCounterMetric = (
    &'static str,
    &'static str,
    fn(&rivet_api::ServiceCounters) -> u64,
);

/// Counters of each Service port, labelled `namespace`, `service`, `port`.
const SERVICE_COUNTERS: [ServiceCounterMetric; 4] = [
    (
        "rivet_service_sockets",
        "Sockets of pods and of the node translated to a backend of the Service port (connects, unconnected datagrams)",
        |c| c.sockets,
    ),
    (
        "rivet_service_flows",
        "Flows from outside translated at the uplink to a backend of the Service port (NodePort, external and load-balancer IPs)",
        |c| c.flows,
    ),
    (
        "rivet_service_rejected",
        "Connections and datagrams to the Service port refused or dropped because it had no backend",
        |c| c.rejected,
    ),
    (
        "rivet_service_affinity_hits",
        "Clients of the Service port sent to the backend they had (ClientIP affinity)",
        |c| c.affinity_hits,
    ),
];

/// Fill of the Service maps: (metric, help, value).
type ServiceFillMetric = (
    &'static str,
    &'static str,
    fn(&rivet_api::ServiceList) -> u64,
);

const SERVICE_FILL: [ServiceFillMetric; 4] = [
    (
        "rivet_service_frontends",
        "Entries in SVC_FRONTENDS (frontends of every Service port and scope, plus one per address holding external frontends)",
        |l| l.frontend_entries,
    ),
    (
        "rivet_service_frontends_capacity",
        "Capacity of SVC_FRONTENDS (max_services)",
        |l| l.frontend_capacity,
    ),
    (
        "rivet_service_backends",
        "Entries in SVC_BACKENDS (the slots of every backend group)",
        |l| l.backend_entries,
    ),
    (
        "rivet_service_backends_capacity",
        "Capacity of SVC_BACKENDS (max_service_backends)",
        |l| l.backend_capacity,
    ),
];

impl Snapshot {
    /// The BGP metrics ([`BGP_SESSIONS`], the speaker, learned routes).
    fn encode_bgp(
        bgp: &rivet_api::BgpStatus,
        encoder: &mut DescriptorEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::metrics::MetricType;
        for (name, help, kind, pick) in BGP_SESSIONS {
            let mut metric = encoder.encode_descriptor(name, help, None, kind)?;
            for s in &bgp.sessions {
                let peer = s.peer.map_or_else(|| s.name.clone(), |p| p.to_string());
                let labels = [("peer", peer.as_str()), ("role", s.role.as_str())];
                if matches!(kind, MetricType::Counter) {
                    ConstCounter::new(pick(s)).encode(metric.encode_family(&labels)?)?;
                } else {
                    ConstGauge::new(i64::try_from(pick(s)).unwrap_or(i64::MAX))
                        .encode(metric.encode_family(&labels)?)?;
                }
            }
        }
        for (name, help, v) in [
            (
                "rivet_bgp_speaker_up",
                "1 while the BGP speaker answers on its control socket",
                u64::from(bgp.speaker_up),
            ),
            (
                "rivet_bgp_routes_learned",
                "Routes the speaker learned (its kernel table)",
                bgp.learned as u64,
            ),
            (
                "rivet_bgp_routes_suppressed",
                "Learned routes held out of the datapath by flap damping",
                bgp.suppressed as u64,
            ),
        ] {
            ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX))
                .encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)?;
        }
        Ok(())
    }

    /// The Service metrics ([`SERVICE_COUNTERS`], [`SERVICE_FILL`]).
    fn encode_services(
        list: &rivet_api::ServiceList,
        encoder: &mut DescriptorEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::metrics::MetricType;
        for (name, help, pick) in SERVICE_COUNTERS {
            let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for p in &list.services {
                // An unnamed port (a Service's only one) by its number.
                let port = match (p.port_name.as_str(), p.port) {
                    ("", Some(n)) => n.to_string(),
                    (name, _) => name.to_owned(),
                };
                let labels = [
                    ("namespace", p.namespace.as_str()),
                    ("service", p.name.as_str()),
                    ("port", port.as_str()),
                ];
                ConstCounter::new(pick(&p.counters)).encode(metric.encode_family(&labels)?)?;
            }
        }
        for (name, help, pick) in SERVICE_FILL {
            let v = i64::try_from(pick(list)).unwrap_or(i64::MAX);
            ConstGauge::new(v).encode(encoder.encode_descriptor(
                name,
                help,
                None,
                MetricType::Gauge,
            )?)?;
        }
        Ok(())
    }
}

/// How a counter shows: the metric of its family ([`rivet_common::Counter::family`],
/// a name this build does not know counts as passed) and its label.
fn family_of(name: &str) -> (&'static str, &'static str, &str) {
    use rivet_common::{Counter, CounterFamily};
    match Counter::from_name(name).map_or(CounterFamily::Pass, Counter::family) {
        CounterFamily::Drop => (
            "rivet_drop",
            "reason",
            name.strip_prefix("drop_").unwrap_or(name),
        ),
        CounterFamily::Forward => (
            "rivet_forward",
            "path",
            name.strip_prefix("fwd_").unwrap_or(name),
        ),
        CounterFamily::Pass => ("rivet_pass", "reason", name),
    }
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        for (family, help) in [
            ("rivet_drop", "Packets dropped by the datapath, by reason"),
            (
                "rivet_forward",
                "Packets the datapath forwarded itself, by path (local, encap, decap, snat, dnat, ...)",
            ),
            (
                "rivet_pass",
                "Packets handed to the kernel stack or answered in BPF, by reason",
            ),
        ] {
            for (unit, pick) in [
                (
                    "packets",
                    (|c: &CounterValue| c.packets) as fn(&CounterValue) -> u64,
                ),
                ("bytes", |c: &CounterValue| c.bytes),
            ] {
                let name = format!("{family}_{unit}");
                let mut metric = encoder.encode_descriptor(
                    &name,
                    help,
                    None,
                    prometheus_client::metrics::MetricType::Counter,
                )?;
                for c in &self.counters {
                    let (f, label, value) = family_of(&c.name);
                    if f != family {
                        continue;
                    }
                    let labels = [(label, value)];
                    ConstCounter::new(pick(c)).encode(metric.encode_family(&labels)?)?;
                }
            }
        }
        let gauge = |encoder: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: i64| {
            ConstGauge::new(v).encode(encoder.encode_descriptor(
                name,
                help,
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?)
        };
        for (name, help, kind, pick) in [
            (
                "rivet_map_entries",
                "Entries in a datapath map",
                prometheus_client::metrics::MetricType::Gauge,
                (|m: &MapUsage| m.entries) as fn(&MapUsage) -> u64,
            ),
            (
                "rivet_map_capacity",
                "Capacity of a datapath map",
                prometheus_client::metrics::MetricType::Gauge,
                |m| m.capacity,
            ),
            (
                "rivet_map_memory_bytes",
                "Kernel memory charged for a datapath map (memlock)",
                prometheus_client::metrics::MetricType::Gauge,
                |m| m.memory_bytes,
            ),
            (
                "rivet_map_full_refusals",
                "Entries a full map refused (pod ADDs, node routes, hostPorts)",
                prometheus_client::metrics::MetricType::Counter,
                |m| m.full_refusals,
            ),
        ] {
            let mut metric = encoder.encode_descriptor(name, help, None, kind)?;
            for m in &self.status.maps {
                let labels = [("map", m.name.as_str())];
                let v = pick(m);
                if matches!(kind, prometheus_client::metrics::MetricType::Counter) {
                    ConstCounter::new(v).encode(metric.encode_family(&labels)?)?;
                } else {
                    ConstGauge::new(v as i64).encode(metric.encode_family(&labels)?)?;
                }
            }
        }
        if !self.bandwidth.is_empty() {
            for (name, help, kind, pick) in BANDWIDTH {
                let mut metric = encoder.encode_descriptor(name, help, None, kind)?;
                for b in &self.bandwidth {
                    let labels = [("pod", b.pod.as_str()), ("direction", b.direction.as_str())];
                    if matches!(kind, prometheus_client::metrics::MetricType::Counter) {
                        ConstCounter::new(pick(b)).encode(metric.encode_family(&labels)?)?;
                    } else {
                        ConstGauge::new(i64::try_from(pick(b)).unwrap_or(i64::MAX))
                            .encode(metric.encode_family(&labels)?)?;
                    }
                }
            }
        }
        if let Some(bgp) = &self.bgp {
            Self::encode_bgp(bgp, &mut encoder)?;
        }
        if let Some((ingress, egress)) = self.policy_allowed {
            let mut metric = encoder.encode_descriptor(
                "rivet_policy_allowed_flows",
                "New flows NetworkPolicy allowed to or from an isolated pod, by direction (denied packets: rivet_drop_packets{reason=\"policy_ingress\"|\"policy_egress\"})",
                None,
                prometheus_client::metrics::MetricType::Counter,
            )?;
            for (dir, v) in [("ingress", ingress), ("egress", egress)] {
                ConstCounter::new(v).encode(metric.encode_family(&[("direction", dir)])?)?;
            }
        }
        let s = &self.status;
        let insert_failed = self
            .counters
            .iter()
            .find(|c| c.name == "drop_nat_insert_failed")
            .map_or(0, |c| c.packets);
        ConstCounter::new(insert_failed).encode(encoder.encode_descriptor(
            "rivet_nat_insert_failures",
            "New NAT flows dropped because their entries could not be inserted",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?)?;
        ConstCounter::new(s.nat.evicted).encode(encoder.encode_descriptor(
            "rivet_nat_evictions",
            "NAT entries the full LRU table recycled",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?)?;
        ConstCounter::new(s.nat.expired).encode(encoder.encode_descriptor(
            "rivet_nat_expired",
            "NAT entries the collector expired",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?)?;
        gauge(
            &mut encoder,
            "rivet_endpoints",
            "Pods attached to this node",
            s.endpoints as i64,
        )?;
        gauge(
            &mut encoder,
            "rivet_ipam_pool_size",
            "Addresses the node can hand out",
            s.pool.size as i64,
        )?;
        gauge(
            &mut encoder,
            "rivet_ipam_pool_used",
            "Addresses leased",
            s.pool.used as i64,
        )?;
        gauge(
            &mut encoder,
            "rivet_cluster_peers",
            "Other nodes known",
            s.nodes as i64,
        )?;
        gauge(
            &mut encoder,
            "rivet_cluster_synced",
            "1 when the cluster store is in sync (always, without one)",
            i64::from(s.store_synced),
        )?;
        gauge(
            &mut encoder,
            "rivet_ready",
            "1 when /readyz answers 200",
            i64::from(self.ready),
        )?;
        gauge(
            &mut encoder,
            "rivet_status_age_milliseconds",
            "Age of the status snapshot this scrape reports",
            i64::try_from(s.age_ms).unwrap_or(i64::MAX),
        )?;
        gauge(
            &mut encoder,
            "rivet_uptime_seconds",
            "Seconds since the agent started",
            s.uptime_secs as i64,
        )?;
        if let Some(list) = &self.services {
            Self::encode_services(list, &mut encoder)?;
        }
        Ok(())
    }
}

/// The OpenMetrics text of `snapshot` and the request latencies.
pub fn encode(snapshot: Snapshot, requests: &RequestMetrics) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    registry.register(
        "rivet_api_request_duration_seconds",
        "Agent API requests by CNI verb (ADD, DEL, CHECK, GC, STATUS; others by request)",
        requests.histograms(),
    );
    registry.register_collector(Box::new(snapshot));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    Ok(text)
}

/// Ready, or why not (what `/readyz` answers).
pub fn readiness(agent: &Agent) -> Result<(), String> {
    agent.readiness()
}

/// Everything one metrics scrape reports (the node state is locked only
/// to copy what the Service maps hold, and to gather the status when a
/// change was noted since it was published: a scrape right after an ADD
/// counts that endpoint).
pub async fn snapshot(agent: &Agent) -> Result<Snapshot, String> {
    let status = agent.current_status().await;
    let counters = agent.counters().map_err(|e| e.to_string())?;
    let services = match super::dispatch::services(agent, super::dispatch::Detail::Counters).await {
        Ok(list) => Some(list),
        Err(e) => {
            tracing::warn!(error = %e, "Service metrics left out of a scrape");
            None
        }
    };
    let policy_allowed = agent
        .policy_allowed()
        .inspect_err(|e| tracing::warn!(error = %e, "policy metrics left out of a scrape"))
        .ok();
    let bandwidth = agent.bandwidth_figures().await;
    let bgp = match agent.config().bgp {
        Some(_) => agent
            .bgp_status()
            .await
            .inspect_err(|e| tracing::warn!(error = %e, "BGP metrics left out of a scrape"))
            .ok(),
        None => None,
    };
    Ok(Snapshot {
        ready: status.ready,
        counters,
        status,
        services,
        policy_allowed,
        bandwidth,
        bgp,
    })
}

fn reply(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(CONTENT_TYPE, v);
    }
    r
}

async fn route(agent: &Arc<Agent>, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    const TEXT: &str = "text/plain; charset=utf-8";
    match req.uri().path() {
        "/metrics" => match snapshot(agent).await {
            Ok(snapshot) => match encode(snapshot, agent.request_metrics()) {
                Ok(text) => reply(
                    StatusCode::OK,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    text,
                ),
                Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, TEXT, e.to_string()),
            },
            Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, TEXT, e),
        },
        "/healthz" => reply(StatusCode::OK, TEXT, "ok\n".into()),
        "/readyz" => match readiness(agent) {
            Ok(()) => reply(StatusCode::OK, TEXT, "ready\n".into()),
            Err(why) => reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, format!("{why}\n")),
        },
        _ => reply(StatusCode::NOT_FOUND, TEXT, "not found\n".into()),
    }
}

/// Serves the metrics and health endpoints until the task is aborted.
pub async fn serve(agent: Arc<Agent>, listener: TcpListener) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a metrics connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let agent = Arc::clone(&agent);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let agent = Arc::clone(&agent);
                async move { Ok::<_, Infallible>(route(&agent, &req).await) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %e, "metrics connection");
            }
        });
    }
}
