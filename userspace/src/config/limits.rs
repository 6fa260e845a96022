//! The limits sections: map capacities and each pod's budget of fragments
//! to the node's stack.

use super::{ConfigError, FileConfig, invalid};

/// Capacities of the maps the agent fills (entries), from `max_endpoints`,
/// `max_routes`, `max_hostports`, `max_services`, `max_service_backends`,
/// `max_policy_entries`, `max_policy_flows` and `nat_max_entries`. Every map is
/// preallocated by the kernel at this size when first created; a pinned map
/// keeps its size until `rivetd unload`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapLimits {
    /// Pods on this node (ENDPOINTS).
    pub endpoints: u32,
    /// Remote nodes (ROUTES and PEERS).
    pub routes: u32,
    /// hostPort mappings (HOSTPORTS).
    pub hostports: u32,
    /// NAT/conntrack entries (NAT; a masqueraded flow takes two).
    pub nat: u32,
    /// Service frontends (SVC_FRONTENDS) and Service port ids (SVC_STATS).
    pub services: u32,
    /// Service backends over every group (SVC_BACKENDS).
    pub service_backends: u32,
    /// NetworkPolicy peer prefixes (POLICY_PEERS) and port-class prefixes
    /// (POLICY_PORTS).
    pub policy_entries: u32,
    /// Flows let through policy (POLICY_FLOWS, LRU).
    pub policy_flows: u32,
}

impl Default for MapLimits {
    fn default() -> Self {
        Self {
            endpoints: rivet_common::ENDPOINTS_MAX,
            routes: rivet_common::ROUTES_MAX,
            hostports: rivet_common::HOSTPORTS_MAX,
            nat: rivet_common::NAT_MAX,
            services: rivet_common::SVC_FRONTENDS_MAX,
            service_backends: rivet_common::SVC_BACKENDS_MAX,
            policy_entries: rivet_common::POLICY_PEERS_MAX,
            policy_flows: rivet_common::POLICY_FLOWS_MAX,
        }
    }
}

/// The map capacities; the NAT table's is `nat_max_entries`, validated
/// with the NAT section.
pub(super) fn map_limits(file: &FileConfig, nat: u32) -> Result<MapLimits, ConfigError> {
    let size = |key: &'static str, v: Option<u32>, default: u32| match v {
        None => Ok(default),
        Some(n) if (16..=1 << 20).contains(&n) => Ok(n),
        Some(n) => Err(invalid(key, n, format!("must be 16..={}", 1 << 20))),
    };
    let defaults = MapLimits::default();
    Ok(MapLimits {
        endpoints: size("max_endpoints", file.max_endpoints, defaults.endpoints)?,
        routes: size("max_routes", file.max_routes, defaults.routes)?,
        hostports: size("max_hostports", file.max_hostports, defaults.hostports)?,
        nat,
        services: size("max_services", file.max_services, defaults.services)?,
        service_backends: size(
            "max_service_backends",
            file.max_service_backends,
            defaults.service_backends,
        )?,
        policy_entries: size(
            "max_policy_entries",
            file.max_policy_entries,
            defaults.policy_entries,
        )?,
        policy_flows: size(
            "max_policy_flows",
            file.max_policy_flows,
            defaults.policy_flows,
        )?,
    })
}

/// Budget of IPv4 fragments each pod may send to the node's stack (the
/// node's reassembly memory, `ipfrag_high_thresh` = 4 MiB, is shared by
/// every pod; a fragment waits there up to `ipfrag_time` = 30 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FragBudget {
    /// Refill rate, bytes per second (0: no budget). A fragment costs its
    /// frame length plus [`rivet_common::FRAG_COST_OVERHEAD`].
    pub rate: u64,
    /// Bucket depth, bytes (what a pod may send at once).
    pub burst: u64,
}

/// Default fragment budget refill: 32 KiB/s.
pub const DEFAULT_FRAG_BUDGET_RATE: u64 = 32 * 1024;
/// Default fragment budget depth: 256 KiB. With the rate, one pod holds at
/// most 256 KiB + 30 s × 32 KiB/s = 1,216 KiB of the node's 4 MiB
/// reassembly memory (29 %), however it floods.
pub const DEFAULT_FRAG_BUDGET_BURST: u64 = 256 * 1024;
/// Smallest burst: a fragment costing more than the burst never passes,
/// and the largest (a 65,535-byte datagram in one frame) costs 66,573.
pub const MIN_FRAG_BUDGET_BURST: u64 = 68 * 1024;
const _: () = assert!(65_535 + 14 + rivet_common::FRAG_COST_OVERHEAD <= MIN_FRAG_BUDGET_BURST);

impl Default for FragBudget {
    fn default() -> Self {
        Self {
            rate: DEFAULT_FRAG_BUDGET_RATE,
            burst: DEFAULT_FRAG_BUDGET_BURST,
        }
    }
}

impl FragBudget {
    /// The `TUNABLES` entries the datapath reads.
    pub fn tunables(&self) -> [(u32, u64); 2] {
        [
            (rivet_common::tunable::FRAG_RATE, self.rate),
            (rivet_common::tunable::FRAG_BURST, self.burst),
        ]
    }
}

pub(super) fn frag_budget(file: &FileConfig) -> Result<FragBudget, ConfigError> {
    let rate = match file.frag_budget_rate.unwrap_or(DEFAULT_FRAG_BUDGET_RATE) {
        r @ (0 | 1024..=1_073_741_824) => r,
        r => {
            return Err(invalid(
                "frag_budget_rate",
                r,
                "must be 0 (no budget) or 1024..=1073741824 bytes per second",
            ));
        }
    };
    let burst = match file.frag_budget_burst.unwrap_or(DEFAULT_FRAG_BUDGET_BURST) {
        b @ MIN_FRAG_BUDGET_BURST..=1_073_741_824 => b,
        b => {
            return Err(invalid(
                "frag_budget_burst",
                b,
                format!(
                    "must be {MIN_FRAG_BUDGET_BURST}..=1073741824 bytes (the largest fragment must fit)"
                ),
            ));
        }
    };
    Ok(FragBudget { rate, burst })
}
