//! One handler per API request. Those that change the node run with the
//! node state locked: they are answered one at a time, in the order they
//! take the lock. Status, counters and the NAT and hostPort listings take
//! no lock of it (status is the agent's published snapshot; the maps are
//! read through their own handles).

use std::{collections::HashMap, net::Ipv4Addr, sync::Arc};

use rivet_api::{
    ApiError, EndpointCheck, EndpointRef, EndpointSpec, ErrorKind, GcRequest, NodeEntry, Protocol,
    Request, Response,
};
use rivet_common::map_names;
use tokio::sync::MutexGuard;

use crate::{
    agent::{Agent, NodeState},
    cluster::RemoteNode,
    datapath::pins::PinLayout,
    endpoint,
};

/// The node state, locked for one request.
type Locked<'a> = MutexGuard<'a, NodeState>;

/// Entries a listing answers unless asked for another number.
const DEFAULT_PAGE: usize = 1000;

/// Answers `request` (a `monitor` stream is served by the connection).
pub(super) async fn dispatch(agent: &Arc<Agent>, request: Request) -> Result<Response, ApiError> {
    // Reads that need no lock of the node state.
    match request {
        Request::Status {} => return Ok(Response::Status(agent.current_status().await)),
        Request::Stats {} => {
            return Ok(Response::Stats {
                counters: agent.counters()?,
                bandwidth: agent.bandwidth_figures().await,
            });
        }
        Request::NatList { ip, port, limit } => {
            return nat_list(agent, ip, port, 0, limit.unwrap_or(DEFAULT_PAGE), false);
        }
        Request::NatPage {
            ip,
            port,
            offset,
            limit,
        } => return nat_list(agent, ip, port, offset, limit.unwrap_or(DEFAULT_PAGE), true),
        Request::PortmapList {} => {
            let (mappings, _) = portmap_list(agent, 0, usize::MAX).await?;
            return Ok(Response::Portmaps { mappings });
        }
        Request::PortmapPage { offset, limit } => {
            let (mappings, next) =
                portmap_list(agent, offset, limit.unwrap_or(DEFAULT_PAGE)).await?;
            return Ok(Response::PortmapPage { mappings, next });
        }
        Request::Monitor { .. } => {
            return Err(ApiError::new(
                ErrorKind::BadRequest,
                "monitor streams events: it is served per connection",
            ));
        }
        // The objects' handlers parse before they take the lock.
        Request::Apply { document } => return apply(agent, document).await,
        Request::Delete {
            document,
            ignore_not_found,
        } => return delete(agent, document, ignore_not_found).await,
        Request::Get {
            kind,
            namespace,
            name,
        } => return get(agent, &kind, namespace.as_deref(), name.as_deref()).await,
        Request::Services {} => {
            return Ok(Response::Services(services(agent, Detail::Full).await?));
        }
        Request::Bgp {} => return agent.bgp_status().await.map(Response::Bgp),
        Request::Policy { pod } => {
            let wanted = pod
                .as_deref()
                .map(|p| p.split_once('/').unwrap_or(("default", p)));
            let list = agent.lock().await.policies.list(wanted);
            if let (Some(p), true) = (&pod, list.pods.is_empty()) {
                return Err(ApiError::new(
                    ErrorKind::NotFound,
                    format!("no pod {p:?} with a Kubernetes identity on this node"),
                ));
            }
            return Ok(Response::Policy(list));
        }
        _ => {}
    }
    // With the Kubernetes source a pod's labels come from its Pod object:
    // the ADD waits for it (not holding the node state).
    if let Request::EndpointAdd(spec) = &request
        && let Some(pod) = &spec.pod
    {
        agent.await_pod_object(&pod.namespace, &pod.name).await?;
    }
    let state = agent.lock().await;
    let changes = matches!(
        request,
        Request::NodeSet(_)
            | Request::NodeDel { .. }
            | Request::EndpointAdd(_)
            | Request::EndpointDel(_)
            | Request::EndpointBandwidth(_)
            | Request::Gc(_)
    );
    let answer = match request {
        Request::NodeSet(entry) => node_set(agent, state, &entry),
        Request::NodeDel { subnet } => node_del(state, &subnet),
        Request::NodeList {} => Ok(Response::Nodes {
            nodes: state.cluster.list(),
        }),
        Request::EndpointAdd(spec) => endpoint_add(agent, state, spec).await,
        Request::EndpointDel(r) => endpoint_del(agent, state, &r).await,
        Request::EndpointCheck(c) => endpoint_check(agent, state, &c).await,
        Request::Gc(r) => gc(agent, state, &r).await,
        Request::EndpointList {} => Ok(Response::Endpoints {
            endpoints: state.endpoints.list(),
        }),
        Request::EndpointBandwidth(b) => endpoint_bandwidth(state, b),
        Request::Status {}
        | Request::Stats {}
        | Request::NatList { .. }
        | Request::NatPage { .. }
        | Request::PortmapList {}
        | Request::PortmapPage { .. }
        | Request::Monitor { .. }
        | Request::Apply { .. }
        | Request::Delete { .. }
        | Request::Get { .. }
        | Request::Services {}
        | Request::Policy { .. }
        | Request::Bgp {} => Err(ApiError::new(
            ErrorKind::Internal,
            "request answered without the lock",
        )),
    };
    if changes {
        agent.note_change();
    }
    answer
}

fn node_set(agent: &Agent, mut state: Locked<'_>, entry: &NodeEntry) -> Result<Response, ApiError> {
    let node = RemoteNode::from_entry(entry, agent.config().vni)
        .map_err(|e| ApiError::new(ErrorKind::BadRequest, e.to_string()))?;
    let subnet = node.subnet;
    if let Some(bgp) = &mut state.bgp {
        // A node of the cluster: a BGP peer, not a route.
        if bgp.put_member(node) {
            bgp.reconfigure()
                .map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))?;
        }
        return Ok(Response::Nodes {
            nodes: vec![entry.clone()],
        });
    }
    let NodeState { dp, cluster, .. } = &mut *state;
    let changed = cluster
        .upsert(dp, node)
        .map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))?;
    tracing::debug!(subnet = %entry.subnet, node_ip = %entry.node_ip, changed, "node set");
    // The node as it now stands (not the whole table: an answer
    // must not grow with the cluster).
    Ok(Response::Nodes {
        nodes: cluster.entry(subnet).into_iter().collect(),
    })
}

fn node_del(mut state: Locked<'_>, subnet: &str) -> Result<Response, ApiError> {
    let net: ipnet::Ipv4Net = subnet.parse().map_err(|_| {
        ApiError::new(
            ErrorKind::BadRequest,
            format!("subnet {subnet:?} is not an IPv4 CIDR"),
        )
    })?;
    if let Some(bgp) = &mut state.bgp {
        let existed = bgp.remove_member(net);
        if existed {
            bgp.reconfigure()
                .map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))?;
        }
        return Ok(Response::Deleted { existed });
    }
    let NodeState { dp, cluster, .. } = &mut *state;
    let existed = cluster
        .remove(dp, net)
        .map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))?;
    Ok(Response::Deleted { existed })
}

async fn endpoint_add(
    agent: &Agent,
    mut state: Locked<'_>,
    spec: EndpointSpec,
) -> Result<Response, ApiError> {
    let NodeState {
        dp,
        endpoints,
        local,
        ..
    } = &mut *state;
    let ep = endpoints.add(spec, agent.netlink(), dp, local).await?;
    agent.pods_changed(&mut state);
    // The pod's policy state is in the maps before the runtime hears of
    // it (and can start the pod's processes); a pod whose policy cannot be
    // written is not left half made.
    if let Err(e) = agent.pods_policy(&mut state) {
        let NodeState { dp, endpoints, .. } = &mut *state;
        let r = EndpointRef::new(&ep.container_id, &ep.ifname);
        if let Err(undo) = endpoints.del(&r, agent.netlink(), dp).await {
            tracing::warn!(error = %undo, container = %ep.container_id, "removing a pod whose policy failed");
        }
        agent.pods_changed(&mut state);
        if let Err(again) = agent.pods_policy(&mut state) {
            tracing::warn!(error = %again, "network policy after removing a pod");
        }
        return Err(e);
    }
    agent.publish_health_checks(&state);
    drop(state);
    tracing::info!(container = %ep.container_id, ip = %ep.ip, host = %ep.host_ifname, "endpoint added");
    Ok(Response::Endpoint(ep))
}

async fn endpoint_del(
    agent: &Arc<Agent>,
    mut state: Locked<'_>,
    r: &EndpointRef,
) -> Result<Response, ApiError> {
    let NodeState { dp, endpoints, .. } = &mut *state;
    let (existed, drain) = endpoints.del_deferred(r, agent.netlink(), dp).await?;
    agent.pods_changed(&mut state);
    if let Err(e) = agent.pods_policy(&mut state) {
        tracing::warn!(error = %e, "network policy not synced after a pod was removed");
    }
    agent.publish_health_checks(&state);
    tracing::info!(container = %r.container_id, ifname = %r.ifname, existed, "endpoint deleted");
    if let Some(d) = drain {
        // The lease is released and the datapath forgets the pod
        // now; the device unregistration (tens of ms of RCU) runs
        // after the answer, with the address held until it ends.
        let agent = Arc::clone(agent);
        tokio::spawn(async move {
            if let Err(e) = endpoint::delete_veth(agent.netlink(), &d).await {
                tracing::warn!(host = %d.host, error = %e, "deleting a veth after DEL");
            }
            agent.lock().await.endpoints.drained(&d);
        });
    }
    Ok(Response::Deleted { existed })
}

fn endpoint_bandwidth(
    mut state: Locked<'_>,
    b: rivet_api::EndpointBandwidth,
) -> Result<Response, ApiError> {
    let NodeState { dp, endpoints, .. } = &mut *state;
    let ep = endpoints.set_bandwidth(&b.endpoint, b.bandwidth, dp)?;
    tracing::info!(
        container = %b.endpoint.container_id,
        ifname = %b.endpoint.ifname,
        bandwidth = ?ep.bandwidth,
        "bandwidth limits changed"
    );
    Ok(Response::Endpoint(ep))
}

async fn endpoint_check(
    agent: &Agent,
    mut state: Locked<'_>,
    c: &EndpointCheck,
) -> Result<Response, ApiError> {
    let NodeState { dp, endpoints, .. } = &mut *state;
    endpoints.check(c, agent.netlink(), dp).await?;
    Ok(Response::Checked {})
}

async fn gc(agent: &Agent, mut state: Locked<'_>, gc: &GcRequest) -> Result<Response, ApiError> {
    let NodeState { dp, endpoints, .. } = &mut *state;
    let removed = endpoints
        .gc(&gc.network, &gc.valid, agent.netlink(), dp)
        .await?;
    if let Err(e) = agent.pods_policy(&mut state) {
        tracing::warn!(error = %e, "network policy not synced after a GC");
    }
    tracing::info!(network = %gc.network, removed = removed.len(), kept = gc.valid.len(), "gc");
    Ok(Response::Collected { removed })
}

async fn apply(agent: &Agent, document: String) -> Result<Response, ApiError> {
    let results = agent.apply_objects(document).await;
    // The health checks follow the Services the maps now hold (a refused
    // change leaves them as they were).
    agent.publish_health_checks(&*agent.lock().await);
    let results = results?;
    agent.note_change();
    Ok(Response::Applied { results })
}

async fn delete(
    agent: &Agent,
    document: String,
    ignore_not_found: bool,
) -> Result<Response, ApiError> {
    let results = agent.delete_objects(document, ignore_not_found).await;
    agent.publish_health_checks(&*agent.lock().await);
    let results = results?;
    agent.note_change();
    Ok(Response::Applied { results })
}

/// How much of each Service port a listing copies.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Detail {
    /// Frontends and backends too (`rivetctl services`).
    Full,
    /// Names, policies and counters only (a metrics scrape: its cost under
    /// the node-state lock does not grow with the backends).
    Counters,
}

/// The Services this node serves (`rivetctl services`, `/metrics`): what
/// the Service maps hold, copied with the node state locked; their
/// counters read afterwards from the pinned `SVC_STATS`.
pub(super) async fn services(
    agent: &Agent,
    detail: Detail,
) -> Result<rivet_api::ServiceList, ApiError> {
    let (mut list, ids) = {
        let state = agent.lock().await;
        service_ports(&state, detail)
    };
    if detail == Detail::Full {
        mark_local_pods(agent, &mut list)?;
    }
    let published = agent.published();
    let capacity = |name: &str, configured: u32| {
        published
            .status
            .maps
            .iter()
            .find(|m| m.name == name)
            .map_or(u64::from(configured), |m| m.capacity)
    };
    let limits = &agent.config().limits;
    list.frontend_capacity = capacity(map_names::SVC_FRONTENDS, limits.services);
    list.backend_capacity = capacity(map_names::SVC_BACKENDS, limits.service_backends);
    if ids.iter().any(Option::is_some) {
        let pin = PinLayout::new(&agent.config().pin_dir).map(map_names::SVC_STATS);
        let err = |e: aya::maps::MapError| {
            ApiError::new(
                ErrorKind::Internal,
                format!("map {}: {e}", map_names::SVC_STATS),
            )
        };
        let data = aya::maps::MapData::from_pin(&pin).map_err(err)?;
        let stats: aya::maps::Array<_, rivet_common::SvcCounters> =
            aya::maps::Array::try_from(aya::maps::Map::Array(data)).map_err(err)?;
        for (port, id) in list.services.iter_mut().zip(ids) {
            let Some(id) = id else { continue };
            let c = stats.get(&id, 0).map_err(err)?;
            port.counters = rivet_api::ServiceCounters {
                sockets: c.sockets,
                flows: c.flows,
                rejected: c.rejected,
                affinity_hits: c.affinity_hits,
            };
            list.totals = list.totals.plus(port.counters);
        }
    }
    Ok(list)
}

/// Marks the backends that are pods of this node (in the pinned
/// `ENDPOINTS`) local.
fn mark_local_pods(agent: &Agent, list: &mut rivet_api::ServiceList) -> Result<(), ApiError> {
    let mut others = list
        .services
        .iter_mut()
        .flat_map(|p| p.backends.iter_mut())
        .filter(|b| !b.local)
        .peekable();
    if others.peek().is_none() {
        return Ok(());
    }
    let pin = PinLayout::new(&agent.config().pin_dir).map(map_names::ENDPOINTS);
    let err = |e: aya::maps::MapError| {
        ApiError::new(
            ErrorKind::Internal,
            format!("map {}: {e}", map_names::ENDPOINTS),
        )
    };
    let data = aya::maps::MapData::from_pin(&pin).map_err(err)?;
    let pods: aya::maps::HashMap<_, rivet_common::EndpointKey, rivet_common::EndpointInfo> =
        aya::maps::HashMap::try_from(aya::maps::Map::HashMap(data)).map_err(err)?;
    for b in others {
        let key = rivet_common::EndpointKey {
            addr: rivet_common::ipv4_key(b.address.octets()),
        };
        match pods.get(&key, 0) {
            Ok(_) => b.local = true,
            Err(aya::maps::MapError::KeyNotFound) => {}
            Err(e) => return Err(err(e)),
        }
    }
    Ok(())
}

/// Every Service port of the plan last synced, with its frontends and
/// backends as written (counters zero), and its counter slot. A backend
/// is marked local here when it is in the port's `Local` group or
/// reachable at the uplink from this node ([`mark_local_pods`] adds the
/// node's other pods).
fn service_ports(state: &NodeState, detail: Detail) -> (rivet_api::ServiceList, Vec<Option<u32>>) {
    use std::collections::{BTreeMap, BTreeSet};

    use crate::services::{FrontendKind, GroupKey, plan::Scope};
    let services = &state.services;
    let plan = services.current();
    let backends_of = |gk: &GroupKey| {
        services.group(gk).map_or_else(
            || plan.groups.get(gk).cloned().unwrap_or_default(),
            <[_]>::to_vec,
        )
    };
    let local = &plan.uplink_backends;
    let mut ports: BTreeMap<_, rivet_api::ServicePortStatus> = BTreeMap::new();
    for (fk, fe) in &plan.frontends {
        let pr = &fe.group.port;
        let entry = ports
            .entry(pr.clone())
            .or_insert_with(|| rivet_api::ServicePortStatus {
                namespace: pr.namespace.clone(),
                name: pr.name.clone(),
                port_name: pr.port_name.clone(),
                protocol: Protocol::from_number(pr.proto.number()),
                port: None,
                id: services.id(pr),
                frontends: Vec::new(),
                backends: Vec::new(),
                affinity_timeout: None,
                external_local: false,
                internal_local: false,
                counters: rivet_api::ServiceCounters::default(),
            });
        let kind = match fe.kind {
            FrontendKind::ClusterIp => rivet_api::ServiceFrontendKind::ClusterIp,
            FrontendKind::NodePort => rivet_api::ServiceFrontendKind::NodePort,
            FrontendKind::ExternalIp => rivet_api::ServiceFrontendKind::ExternalIp,
            FrontendKind::LoadBalancer => rivet_api::ServiceFrontendKind::LoadBalancer,
        };
        let scope = match fk.scope {
            Scope::Internal => rivet_api::ServiceScope::Internal,
            Scope::External => rivet_api::ServiceScope::External,
        };
        if fe.kind != FrontendKind::NodePort {
            entry.port = Some(fk.port);
        }
        entry.affinity_timeout = entry.affinity_timeout.or(fe.affinity);
        if fe.group.local_only {
            match scope {
                rivet_api::ServiceScope::External => entry.external_local = true,
                rivet_api::ServiceScope::Internal => entry.internal_local = true,
            }
        }
        if detail == Detail::Counters {
            continue;
        }
        let count = services.group(&fe.group).map_or(0, <[_]>::len);
        entry.frontends.push(rivet_api::ServiceFrontend {
            kind,
            address: fk.addr,
            port: fk.port,
            scope,
            backends: u32::try_from(count).unwrap_or(u32::MAX),
        });
    }
    for (pr, entry) in ports.iter_mut().filter(|_| detail == Detail::Full) {
        let all = GroupKey {
            port: pr.clone(),
            local_only: false,
        };
        let mine = GroupKey {
            port: pr.clone(),
            local_only: true,
        };
        let local_group: BTreeSet<_> = backends_of(&mine).into_iter().collect();
        let slots = if plan.groups.contains_key(&all) {
            backends_of(&all)
        } else {
            backends_of(&mine)
        };
        entry.backends = slots
            .into_iter()
            .map(|b| rivet_api::ServiceBackend {
                address: b.addr,
                port: b.port,
                local: local_group.contains(&b) || local.contains(&b.addr),
            })
            .collect();
        entry
            .frontends
            .sort_by_key(|f| (f.kind, f.address, f.port, f.scope));
    }
    let ids = ports.values().map(|p| p.id).collect();
    let (frontend_entries, backend_entries) = services.fill();
    let list = rivet_api::ServiceList {
        services: ports.into_values().collect(),
        totals: rivet_api::ServiceCounters::default(),
        frontend_entries: frontend_entries as u64,
        frontend_capacity: 0,
        backend_entries: backend_entries as u64,
        backend_capacity: 0,
    };
    (list, ids)
}

async fn get(
    agent: &Agent,
    kind: &str,
    namespace: Option<&str>,
    name: Option<&str>,
) -> Result<Response, ApiError> {
    let items = agent.get_objects(kind, namespace, name).await?;
    Ok(Response::Objects { items })
}

fn listing_err(e: crate::nat::NatError) -> ApiError {
    ApiError::new(ErrorKind::Internal, e.to_string())
}

/// The NAT entries with `ip` or `port` on either side, from the
/// `offset`-th match on, at most `limit`: the table is read only that far.
fn nat_list(
    agent: &Agent,
    ip: Option<Ipv4Addr>,
    port: Option<u16>,
    offset: usize,
    limit: usize,
    paged: bool,
) -> Result<Response, ApiError> {
    let pin = PinLayout::new(&agent.config().pin_dir).map(map_names::NAT);
    let key = |a: Option<Ipv4Addr>| a.map(|a| rivet_common::ipv4_key(a.octets()));
    let (ip, wire_port) = (key(ip), port.map(u16::to_be));
    let page = crate::nat::nat_page(
        &pin,
        |k, e| {
            ip.is_none_or(|a| k.src == a || k.dst == a || e.addr == a)
                && wire_port.is_none_or(|p| k.sport == p || k.dport == p || e.port == p)
        },
        offset,
        limit,
    )
    .map_err(listing_err)?;
    let now = crate::nat::monotonic_ns();
    let mut entries: Vec<rivet_api::NatFlow> = page
        .items
        .iter()
        .map(|(k, e)| nat_flow(k, e, now))
        .collect();
    entries.sort_by(|a, b| (&a.src, &a.dst, &a.dir).cmp(&(&b.src, &b.dst, &b.dir)));
    let total = if page.complete {
        page.read
    } else {
        usize::try_from(agent.nat_status().entries)
            .unwrap_or(usize::MAX)
            .max(page.read)
    };
    Ok(Response::Nat {
        entries,
        total,
        next: page.next.filter(|_| paged),
    })
}

/// The hostPort mappings from the `offset`-th on, at most `limit`, each
/// with the container that owns its pod address; and the next offset.
async fn portmap_list(
    agent: &Agent,
    offset: usize,
    limit: usize,
) -> Result<(Vec<rivet_api::PortmapEntry>, Option<usize>), ApiError> {
    let pin = PinLayout::new(&agent.config().pin_dir).map(map_names::HOSTPORTS);
    let page = crate::nat::hostport_page(&pin, offset, limit).map_err(listing_err)?;
    let pods: Vec<Ipv4Addr> = page
        .items
        .iter()
        .map(|(_, t)| Ipv4Addr::from(rivet_common::ipv4_from_key(t.pod_ip)))
        .collect();
    let owners: HashMap<Ipv4Addr, String> = if pods.is_empty() {
        HashMap::new()
    } else {
        agent
            .lock()
            .await
            .endpoints
            .list()
            .into_iter()
            .filter(|ep| pods.contains(&ep.ip))
            .map(|ep| (ep.ip, ep.container_id))
            .collect()
    };
    let mut mappings: Vec<rivet_api::PortmapEntry> = page
        .items
        .into_iter()
        .map(|(k, t)| {
            let pod_ip = Ipv4Addr::from(rivet_common::ipv4_from_key(t.pod_ip));
            rivet_api::PortmapEntry {
                host_ip: (k.addr != 0).then(|| Ipv4Addr::from(rivet_common::ipv4_from_key(k.addr))),
                host_port: u16::from_be(k.port),
                protocol: Protocol::from_number(k.proto).to_string(),
                pod_ip,
                container_port: u16::from_be(t.port),
                container_id: owners.get(&pod_ip).cloned(),
            }
        })
        .collect();
    mappings.sort_by_key(|m| (m.host_port, m.protocol.clone(), m.host_ip));
    Ok((mappings, page.next))
}

/// A NAT entry as the API shows it.
fn nat_flow(k: &rivet_common::NatKey, e: &rivet_common::NatEntry, now: u64) -> rivet_api::NatFlow {
    use rivet_common::{ipv4_from_key, nat_dir, nat_flags};
    let addr = |a: u32, p: u16| format!("{}:{}", Ipv4Addr::from(ipv4_from_key(a)), u16::from_be(p));
    let flags = [
        (nat_flags::SYN, "syn"),
        (nat_flags::FIN, "fin"),
        (nat_flags::FIN_POD, "fin_pod"),
        (nat_flags::RST, "rst"),
        (nat_flags::SEEN, "seen"),
    ]
    .iter()
    .filter(|(bit, _)| e.flags & bit != 0)
    .map(|(_, name)| (*name).to_owned())
    .collect();
    rivet_api::NatFlow {
        proto: Protocol::from_number(k.proto).to_string(),
        dir: match k.dir {
            nat_dir::EGRESS => "egress",
            nat_dir::REPLY => "reply",
            _ => "dnat",
        }
        .into(),
        src: addr(k.src, k.sport),
        dst: addr(k.dst, k.dport),
        translated: addr(e.addr, e.port),
        flags,
        idle_secs: now.saturating_sub(e.last_seen) / 1_000_000_000,
    }
}
