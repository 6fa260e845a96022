//! STATS: the datapath's counters.

use aya::{
    Ebpf,
    maps::{MapData, MapError, PerCpuArray},
};
use rivet_common::{COUNTERS_MAX, Counter, StatsEntry, map_names};

use crate::datapath::pins::PinLayout;
use crate::datapath::{Datapath, DatapathError, map_err};

pub(in crate::datapath) fn read_counters(
    ebpf: &Ebpf,
) -> Result<Vec<(Counter, StatsEntry)>, DatapathError> {
    let name = map_names::STATS;
    let map = ebpf
        .map(name)
        .ok_or_else(|| map_err(name)(MapError::InvalidName { name: name.into() }))?;
    sum_counters(&PerCpuArray::try_from(map).map_err(map_err(name))?)
}

/// Sums every counter over CPUs, in index order.
pub(in crate::datapath) fn sum_counters<T: std::borrow::Borrow<MapData>>(
    stats: &PerCpuArray<T, StatsEntry>,
) -> Result<Vec<(Counter, StatsEntry)>, DatapathError> {
    let mut out = Vec::with_capacity(Counter::ALL.len());
    for counter in Counter::ALL {
        debug_assert!(counter.index() < COUNTERS_MAX);
        let per_cpu = stats
            .get(&counter.index(), 0)
            .map_err(map_err(map_names::STATS))?;
        let sum = per_cpu
            .iter()
            .fold(StatsEntry::default(), |acc, v| StatsEntry {
                packets: acc.packets + v.packets,
                bytes: acc.bytes + v.bytes,
            });
        out.push((counter, sum));
    }
    Ok(out)
}

/// Reads the counters of a node from its pinned stats map, without loading
/// anything (used by tests and tools that run beside the agent).
pub fn pinned_counters(layout: &PinLayout) -> Result<Vec<(Counter, StatsEntry)>, DatapathError> {
    let name = map_names::STATS;
    let data = MapData::from_pin(layout.map(name)).map_err(map_err(name))?;
    let stats = PerCpuArray::try_from(aya::maps::Map::PerCpuArray(data)).map_err(map_err(name))?;
    sum_counters(&stats)
}

impl Datapath {
    /// Every counter summed over CPUs, in index order.
    pub fn counters(&self) -> Result<Vec<(Counter, StatsEntry)>, DatapathError> {
        read_counters(&self.ebpf)
    }
}
