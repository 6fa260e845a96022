//! Typed access to the maps, one file per family; the sized maps and their
//! full-map refusals.
//!
//! `ENDPOINTS` (`max_endpoints`), `ROUTES` and `PEERS` (`max_routes`),
//! `HOSTPORTS` (`max_hostports`) and `NAT` (`nat_max_entries`) are sized from
//! the agent's configuration at load (`EbpfLoader::map_max_entries`), as
//! `rivet_common::MAPS` declares them (`FRAG_BUDGET` follows `max_endpoints`
//! but, filled by the datapath only, refuses nothing); a pinned
//! map keeps its size until `rivetd unload` (a warning says so). A full map's
//! refusal (E2BIG from a hash, ENOSPC from the trie) becomes
//! `DatapathError::MapFull{map, capacity, key}` and is counted per map; the
//! endpoint path maps it to `Exhausted` (CNI code 100), `Cluster::upsert`
//! removes the peer entry it just wrote when the route is refused (no
//! half-added node). `status.maps` carries entries, capacity, `memlock` (from
//! the map fd's fdinfo) and refusals for each; `status.warnings` says which map
//! to grow (≥ 90 % full, or any refusal). Memory per map: RELIABILITY.md.

pub(super) mod bandwidth;
pub(super) mod cluster;
pub(super) mod endpoints;
pub(super) mod hostports;
pub(super) mod nat;
pub(super) mod policy;
pub(super) mod services;
pub(super) mod settings;
pub(super) mod stats;

use std::os::fd::{AsFd as _, AsRawFd as _};

use aya::{
    Ebpf,
    maps::{MapData, MapError},
};
use rivet_common::{MAPS, MapSizing};

use crate::config::MapLimits;
use crate::datapath::{Datapath, DatapathError, map_err};

/// How many maps of [`MAPS`] the agent fills and sizes from its configuration.
const SIZED: usize = {
    let mut n = 0;
    let mut i = 0;
    while i < MAPS.len() {
        if let MapSizing::Configured(_) = MAPS[i].sizing {
            n += 1;
        }
        i += 1;
    }
    n
};

/// The maps the agent fills, with the configuration key sizing each: the
/// [`MapSizing::Configured`] maps of [`MAPS`], in its order.
pub const SIZED_MAPS: [(&str, &str); SIZED] = {
    let mut out = [("", ""); SIZED];
    let mut n = 0;
    let mut i = 0;
    while i < MAPS.len() {
        if let MapSizing::Configured(key) = MAPS[i].sizing {
            out[n] = (MAPS[i].name, key);
            n += 1;
        }
        i += 1;
    }
    out
};

/// The capacity the configuration gives a map sized by `key` (a
/// [`MapSizing`] key), if `key` is one.
pub(in crate::datapath) fn configured_size(limits: &MapLimits, key: &str) -> Option<u32> {
    match key {
        "max_endpoints" => Some(limits.endpoints),
        "max_routes" => Some(limits.routes),
        "max_hostports" => Some(limits.hostports),
        "nat_max_entries" => Some(limits.nat),
        "max_services" => Some(limits.services),
        "max_service_backends" => Some(limits.service_backends),
        "max_policy_entries" => Some(limits.policy_entries),
        "max_policy_flows" => Some(limits.policy_flows),
        _ => None,
    }
}

/// Entries refused because their map was full, per [`SIZED_MAPS`] slot,
/// since the agent started (the NAT table's own pressure is counted by the
/// datapath: evictions).
pub(in crate::datapath) static MAP_FULL: [std::sync::atomic::AtomicU64; SIZED] =
    [const { std::sync::atomic::AtomicU64::new(0) }; SIZED];

/// (map, entries refused because it was full) for every sized map.
pub fn map_full_counts() -> Vec<(&'static str, u64)> {
    SIZED_MAPS
        .iter()
        .zip(&MAP_FULL)
        .map(|((name, _), n)| (*name, n.load(std::sync::atomic::Ordering::Relaxed)))
        .collect()
}

/// Counts an entry refused for map `name` before it reached the map (a
/// change checked against the capacity and refused whole).
pub fn note_map_full(name: &str) {
    if let Some(i) = SIZED_MAPS.iter().position(|(n, _)| *n == name) {
        MAP_FULL[i].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// An insert's error: a full map (E2BIG from hash maps, ENOSPC from LPM
/// tries) becomes [`DatapathError::MapFull`] and is counted.
pub(in crate::datapath) fn insert_err<'a>(
    ebpf: &'a Ebpf,
    name: &'static str,
) -> impl FnOnce(MapError) -> DatapathError + 'a {
    move |source| {
        let full = matches!(
            &source,
            MapError::SyscallError(e)
                if matches!(e.io_error.raw_os_error(), Some(libc::E2BIG | libc::ENOSPC))
        );
        let slot = SIZED_MAPS.iter().position(|(n, _)| *n == name);
        match (full, slot) {
            (true, Some(i)) => {
                MAP_FULL[i].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let capacity = ebpf
                    .map(name)
                    .and_then(|m| match m {
                        aya::maps::Map::HashMap(d)
                        | aya::maps::Map::LruHashMap(d)
                        | aya::maps::Map::LpmTrie(d) => d.info().ok(),
                        _ => None,
                    })
                    .map_or(0, |i| i.max_entries());
                DatapathError::MapFull {
                    name,
                    capacity,
                    key: SIZED_MAPS[i].1,
                }
            }
            _ => map_err(name)(source),
        }
    }
}

impl Datapath {
    /// (capacity, kernel memory in bytes) of a pinned map: `max_entries`
    /// and the `memlock` the kernel reports for it in fdinfo.
    pub fn map_size(&self, name: &str) -> Result<(u32, u64), DatapathError> {
        let name_static = rivet_common::map_spec(name).map_or("map", |m| m.name);
        let data = MapData::from_pin(self.layout.map(name)).map_err(map_err(name_static))?;
        let capacity = data.info().map_err(map_err(name_static))?.max_entries();
        let fdinfo = std::fs::read_to_string(format!(
            "/proc/self/fdinfo/{}",
            data.fd().as_fd().as_raw_fd()
        ))
        .unwrap_or_default();
        let memory = fdinfo
            .lines()
            .find_map(|l| l.strip_prefix("memlock:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        Ok((capacity, memory))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_configured_map_is_sized_by_a_known_key() {
        let limits = MapLimits::default();
        for spec in &MAPS {
            match spec.sizing {
                MapSizing::Fixed => {}
                MapSizing::Configured(key) | MapSizing::Follows(key) => {
                    assert_eq!(
                        configured_size(&limits, key),
                        Some(spec.max_entries),
                        "{}: `{key}` sizes it and defaults to the object's capacity",
                        spec.name
                    );
                }
            }
        }
        assert_eq!(
            SIZED_MAPS.map(|(name, _)| name),
            [
                rivet_common::map_names::ENDPOINTS,
                rivet_common::map_names::ROUTES,
                rivet_common::map_names::PEERS,
                rivet_common::map_names::HOSTPORTS,
                rivet_common::map_names::NAT,
                rivet_common::map_names::SVC_FRONTENDS,
                rivet_common::map_names::SVC_BACKENDS,
                rivet_common::map_names::SOCK_NETNS,
                rivet_common::map_names::POLICY_PEERS,
                rivet_common::map_names::POLICY_FLOWS,
            ]
        );
    }
}
