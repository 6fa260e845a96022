//! STATS: the datapath's counters.

use aya::{
    Ebpf,
    maps::{MapData, MapError, PerCpuArray},
};
use rivet_common::{COUNTERS_MAX, Counter, StatsEntry, map_names};

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

impl Datapath {
    /// Every counter summed over CPUs, in index order.
    pub fn counters(&self) -> Result<Vec<(Counter, StatsEntry)>, DatapathError> {
        read_counters(&self.ebpf)
    }
}
