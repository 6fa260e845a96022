//! What the agent reports about itself: its status (`rivetctl status`,
//! CNI STATUS, readiness, metrics) and the latency of the requests it
//! answered.

use std::{collections::HashMap, time::Duration};

use prometheus_client::metrics::{
    family::Family,
    histogram::{Histogram, exponential_buckets},
};
use rivet_api::{AgentStatus, ApiError, Attachment, ErrorKind};
use rivet_common::{map_names, program_names};

use super::{Agent, NodeState};
use crate::datapath::{self, AttachMode, DatapathError};

impl Agent {
    /// The agent's status, read from `state` (which the caller has locked).
    pub async fn status(&self, state: &mut NodeState) -> Result<AgentStatus, ApiError> {
        let internal = |e: DatapathError| ApiError::new(ErrorKind::Internal, e.to_string());
        let NodeState {
            dp,
            endpoints,
            cluster,
            ..
        } = state;
        let mut attachments: Vec<Attachment> = dp
            .links()
            .map_err(internal)?
            .into_iter()
            .map(|l| Attachment {
                interface: l.interface,
                program: l.program,
                program_id: l.program_id,
                link_id: l.link_id,
                pin: l.pin.display().to_string(),
            })
            .collect();
        if self.cfg.pod_attach == AttachMode::Tc {
            let ours = dp.program_id(program_names::FROM_POD).map_err(internal)?;
            for ep in endpoints.list() {
                let ids = endpoints.attached_ids(&ep, &self.nl, dp).await?;
                for id in ids {
                    attachments.push(Attachment {
                        interface: ep.host_ifname.clone(),
                        program: if id == ours {
                            "from_pod".into()
                        } else {
                            "(not rivet's current program)".into()
                        },
                        program_id: id,
                        link_id: 0,
                        pin: format!("tc ingress prio {}", datapath::TC_PRIORITY),
                    });
                }
            }
            attachments.sort_by(|a, b| a.interface.cmp(&b.interface));
        }
        let (ready, not_ready) = self.ready_with(&attachments);
        let nat = self.nat_status();
        let hostports = dp.list_hostports().map_err(internal)?.len() as u64;
        let refused: HashMap<&str, u64> = datapath::map_full_counts().into_iter().collect();
        let mut maps = Vec::new();
        for (name, key) in datapath::SIZED_MAPS {
            let entries = match name {
                map_names::ENDPOINTS => endpoints.len() as u64,
                map_names::HOSTPORTS => hostports,
                map_names::NAT => nat.entries,
                _ => cluster.len() as u64,
            };
            let (capacity, memory_bytes) = dp.map_size(name).map_err(internal)?;
            maps.push(rivet_api::MapUsage {
                name: name.to_owned(),
                entries,
                capacity: u64::from(capacity),
                memory_bytes,
                full_refusals: refused.get(name).copied().unwrap_or(0),
                config_key: key.to_owned(),
            });
        }
        let warnings = map_warnings(&maps);
        Ok(AgentStatus {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            node_name: self.cfg.node_name.clone(),
            uptime_secs: self.started.elapsed().as_secs(),
            pod_cidr: self.pod_cidr.to_string(),
            gateway: self.cfg.gateway,
            mtu: self.mtu,
            pin_dir: self.cfg.pin_dir.display().to_string(),
            endpoints: endpoints.len(),
            attachments,
            pool: endpoints.pool(),
            mode: self.cfg.mode.as_str().to_owned(),
            cluster_cidr: self.cfg.cluster_cidr.to_string(),
            node_ip: self.node_ip,
            nodes: cluster.len(),
            store: self.store_state(),
            store_synced: self.cfg.etcd.is_none() || self.store_state().starts_with("etcd: synced"),
            nat,
            ready,
            not_ready,
            last_error: self.last_error(),
            maps,
            warnings,
            ebpf: rivet_api::EbpfObject {
                source: dp.object().source.clone(),
                stamp: dp.object().stamp.clone(),
                hash: dp.object().hash.clone(),
                bytes: dp.object().size as u64,
            },
        })
    }

    /// Ready when the uplink (if any) runs its program and, in cluster
    /// mode, the store is in sync.
    fn ready_with(&self, attachments: &[Attachment]) -> (bool, Option<String>) {
        if let (Some(uplink), Some(_)) = (&self.cfg.uplink, self.node_ip)
            && !attachments
                .iter()
                .any(|a| &a.interface == uplink && a.program == program_names::FROM_UPLINK)
        {
            return (
                false,
                Some(format!("no rivet program on the uplink {uplink}")),
            );
        }
        if self.cfg.etcd.is_some() && !self.store_state().starts_with("etcd: synced") {
            return (false, Some(self.store_state()));
        }
        (true, None)
    }
}

/// What an operator should act on: a map at ≥ 90 % of its capacity, or
/// one that refused entries (a pod ADD failed, a node's routes are missing).
pub fn map_warnings(maps: &[rivet_api::MapUsage]) -> Vec<String> {
    let mut out = Vec::new();
    for m in maps {
        if m.full_refusals > 0 {
            out.push(format!(
                "map {} is full: {} entries refused since the agent started; raise `{}` (now {})",
                m.name, m.full_refusals, m.config_key, m.capacity
            ));
        } else if m.capacity > 0 && m.entries * 10 >= m.capacity * 9 {
            out.push(format!(
                "map {} is {}% full ({} of {}); raise `{}`",
                m.name,
                m.entries * 100 / m.capacity,
                m.entries,
                m.capacity,
                m.config_key
            ));
        }
    }
    out
}

/// Labels of the request-latency histograms.
pub type VerbLabels = Vec<(String, String)>;
/// Histogram family constructor.
type NewHistogram = fn() -> Histogram;

/// Latency of the agent's API requests, by the CNI verb they serve.
#[derive(Clone, Debug)]
pub struct RequestMetrics {
    by_verb: Family<VerbLabels, Histogram, NewHistogram>,
}

impl Default for RequestMetrics {
    fn default() -> Self {
        Self {
            // 0.25 ms … 4 s.
            by_verb: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.000_25, 2.0, 15))
            }),
        }
    }
}

impl RequestMetrics {
    /// Records one request of kind `verb` that took `took`.
    pub fn observe(&self, verb: &str, took: Duration) {
        self.by_verb
            .get_or_create(&vec![("verb".to_owned(), verb.to_owned())])
            .observe(took.as_secs_f64());
    }

    /// The histograms, one per verb (what the metrics endpoint registers).
    pub fn histograms(&self) -> Family<VerbLabels, Histogram, NewHistogram> {
        self.by_verb.clone()
    }
}
