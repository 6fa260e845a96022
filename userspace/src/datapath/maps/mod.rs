//! Typed access to the maps, one file per family; the sized maps and their
//! full-map refusals.
//!
//! `ENDPOINTS` (`max_endpoints`), `ROUTES` and `PEERS` (`max_routes`),
//! `HOSTPORTS` (`max_hostports`) and `NAT` (`nat_max_entries`) are sized from
//! the agent's configuration at load (`EbpfLoader::map_max_entries`); a pinned
//! map keeps its size until `rivetd unload` (a warning says so). A full map's
//! refusal (E2BIG from a hash, ENOSPC from the trie) becomes
//! `DatapathError::MapFull{map, capacity, key}` and is counted per map; the
//! endpoint path maps it to `Exhausted` (CNI code 100), `Cluster::upsert`
//! removes the peer entry it just wrote when the route is refused (no
//! half-added node). `status.maps` carries entries, capacity, `memlock` (from
//! the map fd's fdinfo) and refusals for each; `status.warnings` says which map
//! to grow (≥ 90 % full, or any refusal). Memory per map: RELIABILITY.md.

pub(super) mod cluster;
pub(super) mod endpoints;
pub(super) mod hostports;
pub(super) mod nat;
pub(super) mod settings;
pub(super) mod stats;

use std::os::fd::{AsFd as _, AsRawFd as _};

use aya::{
    Ebpf,
    maps::{MapData, MapError},
};
use rivet_common::map_names;

use crate::datapath::{Datapath, DatapathError, map_err};

/// The maps the agent fills, with the configuration key sizing each.
pub const SIZED_MAPS: [(&str, &str); 5] = [
    (map_names::ENDPOINTS, "max_endpoints"),
    (map_names::ROUTES, "max_routes"),
    (map_names::PEERS, "max_routes"),
    (map_names::HOSTPORTS, "max_hostports"),
    (map_names::NAT, "nat_max_entries"),
];

/// Entries refused because their map was full, per [`SIZED_MAPS`] slot,
/// since the agent started (the NAT table's own pressure is counted by the
/// datapath: evictions).
pub(in crate::datapath) static MAP_FULL: [std::sync::atomic::AtomicU64; 5] =
    [const { std::sync::atomic::AtomicU64::new(0) }; 5];

/// (map, entries refused because it was full) for every sized map.
pub fn map_full_counts() -> Vec<(&'static str, u64)> {
    SIZED_MAPS
        .iter()
        .zip(&MAP_FULL)
        .map(|((name, _), n)| (*name, n.load(std::sync::atomic::Ordering::Relaxed)))
        .collect()
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
        let name_static = map_names::ALL
            .iter()
            .copied()
            .find(|n| *n == name)
            .unwrap_or("map");
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
