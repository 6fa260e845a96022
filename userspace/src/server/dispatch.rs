//! One handler per API request. Each runs with the node state locked:
//! requests are answered one at a time, in the order they take the lock.

use std::{collections::HashMap, net::Ipv4Addr, sync::Arc};

use rivet_api::{
    ApiError, CounterValue, EndpointCheck, EndpointRef, EndpointSpec, ErrorKind, GcRequest,
    NodeEntry, Request, Response,
};
use tokio::sync::MutexGuard;

use crate::{
    agent::{Agent, NodeState},
    cluster::RemoteNode,
    datapath::DatapathError,
    endpoint,
};

/// The node state, locked for one request.
type Locked<'a> = MutexGuard<'a, NodeState>;

fn internal(e: DatapathError) -> ApiError {
    ApiError::new(ErrorKind::Internal, e.to_string())
}

/// Answers `request` (a `monitor` stream is served by the connection).
pub(super) async fn dispatch(agent: &Arc<Agent>, request: Request) -> Result<Response, ApiError> {
    let state = agent.lock().await;
    match request {
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
        Request::Stats {} => stats(&state),
        Request::NatList { ip, port, limit } => nat_list(&state, ip, port, limit),
        Request::Monitor { .. } => Err(ApiError::new(
            ErrorKind::BadRequest,
            "monitor streams events: it is served per connection",
        )),
        Request::PortmapList {} => portmap_list(state),
        Request::Status {} => {
            let mut state = state;
            Ok(Response::Status(agent.status(&mut state).await?))
        }
    }
}

fn node_set(agent: &Agent, mut state: Locked<'_>, entry: &NodeEntry) -> Result<Response, ApiError> {
    let NodeState { dp, cluster, .. } = &mut *state;
    let node = RemoteNode::from_entry(entry, agent.config().vni)
        .map_err(|e| ApiError::new(ErrorKind::BadRequest, e.to_string()))?;
    let subnet = node.subnet;
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
    let NodeState { dp, cluster, .. } = &mut *state;
    let net: ipnet::Ipv4Net = subnet.parse().map_err(|_| {
        ApiError::new(
            ErrorKind::BadRequest,
            format!("subnet {subnet:?} is not an IPv4 CIDR"),
        )
    })?;
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
    tracing::info!(network = %gc.network, removed = removed.len(), kept = gc.valid.len(), "gc");
    Ok(Response::Collected { removed })
}

fn stats(state: &NodeState) -> Result<Response, ApiError> {
    Ok(Response::Stats {
        counters: state
            .dp
            .counters()
            .map_err(internal)?
            .into_iter()
            .map(|(c, v)| CounterValue {
                name: c.name().to_owned(),
                drop: c.is_drop(),
                packets: v.packets,
                bytes: v.bytes,
            })
            .collect(),
    })
}

fn nat_list(
    state: &NodeState,
    ip: Option<Ipv4Addr>,
    port: Option<u16>,
    limit: Option<usize>,
) -> Result<Response, ApiError> {
    let all = state.dp.nat_entries().map_err(internal)?;
    let now = crate::nat::monotonic_ns();
    let key = |a: Option<Ipv4Addr>| a.map(|a| rivet_common::ipv4_key(a.octets()));
    let (ip, wire_port) = (key(ip), port.map(u16::to_be));
    let mut entries: Vec<rivet_api::NatFlow> = all
        .iter()
        .filter(|(k, e)| {
            ip.is_none_or(|a| k.src == a || k.dst == a || e.addr == a)
                && wire_port.is_none_or(|p| k.sport == p || k.dport == p || e.port == p)
        })
        .take(limit.unwrap_or(1000))
        .map(|(k, e)| nat_flow(k, e, now))
        .collect();
    entries.sort_by(|a, b| (&a.src, &a.dst, &a.dir).cmp(&(&b.src, &b.dst, &b.dir)));
    Ok(Response::Nat {
        entries,
        total: all.len(),
    })
}

fn portmap_list(mut state: Locked<'_>) -> Result<Response, ApiError> {
    let NodeState { dp, endpoints, .. } = &mut *state;
    let owners: HashMap<Ipv4Addr, String> = endpoints
        .list()
        .into_iter()
        .map(|ep| (ep.ip, ep.container_id))
        .collect();
    let mut mappings: Vec<rivet_api::PortmapEntry> = dp
        .list_hostports()
        .map_err(internal)?
        .into_iter()
        .map(|(k, t)| {
            let pod_ip = Ipv4Addr::from(rivet_common::ipv4_from_key(t.pod_ip));
            rivet_api::PortmapEntry {
                host_ip: (k.addr != 0).then(|| Ipv4Addr::from(rivet_common::ipv4_from_key(k.addr))),
                host_port: u16::from_be(k.port),
                protocol: if k.proto == 6 { "tcp" } else { "udp" }.into(),
                pod_ip,
                container_port: u16::from_be(t.port),
                container_id: owners.get(&pod_ip).cloned(),
            }
        })
        .collect();
    mappings.sort_by_key(|m| (m.host_port, m.protocol.clone(), m.host_ip));
    Ok(Response::Portmaps { mappings })
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
        proto: match k.proto {
            6 => "tcp".into(),
            17 => "udp".into(),
            1 => "icmp".into(),
            p => p.to_string(),
        },
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
