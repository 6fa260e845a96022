//! `bgp` mode in the agent: the speaker started (or adopted) at start-up,
//! the cluster's nodes as its peers, and the routes it learns into
//! `ROUTES` — from the speaker's kernel table, watched through netlink, so
//! a BGP update reaches the datapath within milliseconds (a burst of
//! changes is one write; the table is read whole at start, after an
//! overrun, and every 10 s). Once a second
//! the sessions are polled: a dead speaker is started again in graceful
//! restart recovery and every session change is logged and counted.

use std::{sync::Arc, time::Duration};

use rivet_api::{ApiError, BgpSession, BgpStatus, ErrorKind};

use super::{Agent, NodeState};
use crate::{
    cluster::{
        Cluster, ClusterError, RemoteNode,
        bgp::{Bgp, bird::SessionState},
    },
    datapath::Datapath,
    netlink::table::{TableChange, TableWatch},
};

/// How often the sessions are polled.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// How often the whole table is read again (changes lost on the way are
/// also caught at once, when the kernel reports an overrun).
pub const RESYNC_INTERVAL: Duration = Duration::from_secs(10);

/// Makes `ROUTES` what BGP says now (learned, unsuppressed), counting
/// the entries it changed.
pub(super) fn sync_routes(
    bgp: &mut Bgp,
    cluster: &mut Cluster,
    dp: &mut Datapath,
) -> Result<(), ClusterError> {
    let changed = cluster.replace_all(dp, bgp.routes())?;
    bgp.route_changes += changed as u64;
    Ok(())
}

/// The cluster store's nodes: in `bgp` mode they are peers.
pub(super) fn members_replaced(bgp: &mut Bgp, nodes: Vec<RemoteNode>) {
    if bgp.replace_members(nodes)
        && let Err(e) = bgp.reconfigure()
    {
        tracing::warn!(error = %e, "reconfiguring the BGP speaker");
    }
}

/// One node of the cluster added or changed.
pub(super) fn member_put(bgp: &mut Bgp, node: RemoteNode) {
    if bgp.put_member(node)
        && let Err(e) = bgp.reconfigure()
    {
        tracing::warn!(error = %e, "reconfiguring the BGP speaker");
    }
}

/// One node of the cluster gone.
pub(super) fn member_removed(bgp: &mut Bgp, subnet: ipnet::Ipv4Net) {
    if bgp.remove_member(subnet)
        && let Err(e) = bgp.reconfigure()
    {
        tracing::warn!(error = %e, "reconfiguring the BGP speaker");
    }
}

impl Agent {
    /// Follows the speaker's table into `ROUTES` and polls its sessions,
    /// for as long as the agent runs (`bgp` mode).
    pub async fn run_bgp(self: Arc<Self>) {
        let Some(table) = self.cfg.bgp.as_ref().map(|b| b.table) else {
            return;
        };
        let mut watch = match TableWatch::open(table) {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(error = %e, "cannot watch the BGP routes: the datapath will not follow BGP");
                self.note_error(format!("BGP: {e}"));
                return;
            }
        };
        self.resync_bgp(&mut watch).await;
        let mut poll = tokio::time::interval(POLL_INTERVAL);
        let mut resync = tokio::time::interval(RESYNC_INTERVAL);
        resync.tick().await;
        loop {
            let reuse = {
                let state = self.lock().await;
                state.bgp.as_ref().and_then(Bgp::next_reuse)
            };
            let reuse_at = reuse.map_or_else(
                || tokio::time::Instant::now() + Duration::from_secs(3600),
                tokio::time::Instant::from_std,
            );
            tokio::select! {
                change = watch.next() => {
                    let Some(first) = change else {
                        tracing::error!("the BGP route watch ended");
                        self.note_error("BGP: the route watch ended".into());
                        return;
                    };
                    // The whole burst, then one write of the datapath.
                    let mut changes = vec![first];
                    while let Some(more) = watch.pending() {
                        changes.push(more);
                    }
                    if changes.contains(&TableChange::Lost) {
                        tracing::warn!("BGP route changes were lost (netlink overrun): reading the table again");
                        self.resync_bgp(&mut watch).await;
                        continue;
                    }
                    let mut state = self.lock().await;
                    let NodeState { dp, cluster, bgp, .. } = &mut *state;
                    let Some(bgp) = bgp else { return };
                    for change in changes {
                        match change {
                            TableChange::Put(r) => bgp.learned_put(r.dst, r.gateway),
                            TableChange::Removed(net) => bgp.learned_removed(net),
                            TableChange::Lost => {}
                        }
                    }
                    if let Err(e) = sync_routes(bgp, cluster, dp) {
                        tracing::warn!(error = %e, "writing the BGP routes");
                    }
                }
                _ = tokio::time::sleep_until(reuse_at) => {
                    let mut state = self.lock().await;
                    let NodeState { dp, cluster, bgp, .. } = &mut *state;
                    if let Some(bgp) = bgp
                        && let Err(e) = sync_routes(bgp, cluster, dp)
                    {
                        tracing::warn!(error = %e, "writing the BGP routes");
                    }
                }
                _ = resync.tick() => self.resync_bgp(&mut watch).await,
                _ = poll.tick() => {
                    let mut state = self.lock().await;
                    if let Some(bgp) = &mut state.bgp
                        && let Err(e) = bgp.poll()
                    {
                        tracing::warn!(error = %e, "polling the BGP speaker");
                    }
                }
            }
        }
    }

    /// Reads the speaker's whole table and makes ROUTES follow it (at
    /// start, after lost changes, and every [`RESYNC_INTERVAL`]).
    async fn resync_bgp(&self, watch: &mut TableWatch) {
        match watch.dump().await {
            Ok(routes) => {
                let mut state = self.lock().await;
                let NodeState {
                    dp, cluster, bgp, ..
                } = &mut *state;
                if let Some(bgp) = bgp {
                    bgp.learned_all(routes.iter().map(|r| (r.dst, r.gateway)));
                    if let Err(e) = sync_routes(bgp, cluster, dp) {
                        tracing::warn!(error = %e, "writing the BGP routes");
                    }
                    tracing::debug!(
                        routes = routes.len(),
                        "BGP routes read from the speaker's table"
                    );
                }
            }
            Err(e) => tracing::warn!(error = %e, "reading the speaker's table"),
        }
    }

    /// `rivetctl bgp`.
    pub async fn bgp_status(&self) -> Result<BgpStatus, ApiError> {
        let state = self.lock().await;
        let Some(bgp) = &state.bgp else {
            return Err(ApiError::new(
                ErrorKind::BadRequest,
                format!("this node runs in {} mode, not bgp", self.cfg.mode.as_str()),
            ));
        };
        let (speaker_up, sessions) = match bgp.bird().sessions() {
            Ok(s) => (true, s),
            Err(e) => {
                tracing::debug!(error = %e, "asking the BGP speaker");
                (false, Vec::new())
            }
        };
        let roles: std::collections::BTreeMap<String, &'static str> = bgp
            .sessions()
            .iter()
            .map(|s| (s.name(), s.role.as_str()))
            .collect();
        let settings = bgp.settings();
        let mut announced = vec![self.pod_cidr.to_string()];
        announced.extend(settings.advertise.iter().map(ToString::to_string));
        Ok(BgpStatus {
            asn: settings.asn,
            router_id: self.node_ip.unwrap_or(std::net::Ipv4Addr::UNSPECIFIED),
            cluster_id: settings.cluster_id,
            speaker_up,
            speaker_restarts: bgp.restarts,
            announced,
            sessions: sessions
                .iter()
                .map(|s| session(s, &roles, bgp.changes.get(&s.name).copied()))
                .collect(),
            learned: bgp.learned(),
            suppressed: bgp.suppressed(),
            suppressions: bgp.suppressions(),
            route_changes: bgp.route_changes,
        })
    }
}

fn session(
    s: &SessionState,
    roles: &std::collections::BTreeMap<String, &'static str>,
    changes: Option<u64>,
) -> BgpSession {
    BgpSession {
        name: s.name.clone(),
        peer: s.neighbor,
        peer_as: s.neighbor_as,
        role: roles.get(&s.name).copied().unwrap_or("?").to_owned(),
        state: if s.bgp_state.is_empty() {
            s.state.clone()
        } else {
            s.bgp_state.clone()
        },
        uptime_secs: uptime(&s.since),
        received: s.received,
        advertised: s.advertised,
        changes: changes.unwrap_or(0),
        last_error: s.last_error.clone(),
    }
}

/// Seconds since `since` (epoch seconds, as the configuration makes BIRD
/// print them).
fn uptime(since: &str) -> Option<u64> {
    let at: u64 = since.parse().ok()?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs();
    Some(now.saturating_sub(at))
}
