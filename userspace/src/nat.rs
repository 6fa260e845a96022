//! Masquerade and hostPorts from userspace: the settings the datapath reads,
//! the checks made at start, and the garbage collector of the NAT table
//! (masqueraded flows: two entries each; hostPort connections: one).
//!
//! The datapath creates a flow's two entries (egress and reply) and keeps their
//! `last_seen` and TCP flags fresh; the collector (`Collector`, its own handle
//! on the pinned map, no state lock, every `nat_gc_interval` s) removes both
//! when the flow has been idle longer than its timeout — TCP 60 s before a
//! reply, `nat_tcp_timeout` (3600 s) once answered, `nat_tcp_closing_timeout`
//! (10 s) after RST or a FIN each way; UDP `nat_udp_timeout` (60 s); ICMP 30 s
//! — and removes entries whose partner vanished (evicted by the LRU under
//! pressure), counting both in `status.nat` (`entries`, `max_entries`,
//! `expired`, `orphaned`) together with `evicted` = entries created
//! (`NAT_STATS`) − live − removed by the collector: a full table recycles its
//! least recently used flows, never refuses a new one, and shows it; over 90 %
//! full the agent logs a warning. The table keeps an LRU list per CPU (why:
//! the datapath's `maps` module): a CPU that has used up its share
//! (`max_entries` / possible CPUs) recycles its own least recently used
//! flows, even while other CPUs' shares have room.
//!
//! The collector decides on a snapshot of the table and, just before removing a
//! doomed entry (or a flow's pair), reads it again: one whose `last_seen` moved
//! since the snapshot was used meanwhile — typically a client that reused its
//! TIME_WAIT port toward a hostPort, whose SYN revived the ended connection's
//! entry — and is kept (`spared` in `status.nat`). Removing it would leave the
//! new connection's answers untranslated (masqueraded, then reset by the
//! client): found when a benchmark client hung, tested in
//! `datapath_nat.rs::collector_spares_an_entry_used_again_after_its_decision`.
//! The window left is the few microseconds between that read and the removal.
//!
//! Per-pod quota (`nat_max_per_pod`): the datapath keeps a running count of
//! each pod's flows in `NAT_PODS` (`FLOWS`: one per flow it creates, minus one
//! per flow of the pod another flow takes over, atomic adds); flows that leave
//! the table otherwise (expired here, evicted by the LRU) are accounted by the
//! collector's recount: at each collection it reads the running counts, then
//! the table, and writes each pod's correction (`ADJUST`) so that count +
//! correction = the pod's egress entries it saw (minus those it removed). The
//! datapath writes only `FLOWS` and the collector only `ADJUST`, so no update
//! is lost. Flows created while it reads the table are counted twice until the
//! next collection — the error is on the safe side. A pod without flows loses
//! its slots.
//!
//! The table's size is `nat_max_entries` (default 131072), set at load; a
//! pinned table keeps its size until `rivetd unload`. The NAT port range
//! (default 61000–65535) must not overlap the node's `ip_local_port_range`: the
//! agent refuses to start otherwise.

use std::{collections::HashMap as StdHashMap, net::Ipv4Addr, ops::RangeInclusive, path::Path};

use aya::maps::{HashMap, MapData, MapError};
use rivet_common::{
    NatConfig, NatEntry, NatKey, NatLimits, NatPodKey, ipv4_from_key, nat_config_flags, nat_dir,
    nat_flags, nat_pod_slot,
};

use rivet_api::Protocol;

use crate::config::NatSettings;

const TCP: u8 = Protocol::Tcp.number();
const UDP: u8 = Protocol::Udp.number();
/// A TCP flow that never saw a reply.
const TCP_SYN_TIMEOUT_S: u64 = 60;
/// An ICMP echo flow.
const ICMP_TIMEOUT_S: u64 = 30;
/// Entries younger than this are never called orphans: the datapath writes
/// a flow's two entries one after the other.
const ORPHAN_GRACE_NS: u64 = 2_000_000_000;

/// NAT errors.
#[derive(Debug, thiserror::Error)]
pub enum NatError {
    /// The NAT port range overlaps the node's ephemeral ports.
    #[error(
        "nat_port_range {min}-{max} overlaps the node's ip_local_port_range {local_min}-{local_max}: \
         the node's own connections could collide with masqueraded flows; choose ports outside it"
    )]
    Overlap {
        /// Configured first port.
        min: u16,
        /// Configured last port.
        max: u16,
        /// Node's first ephemeral port.
        local_min: u16,
        /// Node's last ephemeral port.
        local_max: u16,
    },
    /// The map could not be used.
    #[error("NAT map {path}: {source}")]
    Map {
        /// Pin path.
        path: String,
        /// Cause.
        #[source]
        source: MapError,
    },
}

/// One page of a pinned map's entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    /// The entries of the page, in the map's order.
    pub items: Vec<T>,
    /// The offset of the next page, when the map may hold more.
    pub next: Option<usize>,
    /// Entries read (matching or not), and whether that was all of them.
    pub read: usize,
    /// The whole map was read.
    pub complete: bool,
}

/// The entries of `map` that `keep` accepts, after the first `offset` of
/// them, at most `limit`: the map is read in its order only as far as the
/// page needs (one entry beyond it, to tell whether there is a next page).
/// A map changing meanwhile may shift entries between pages.
fn page_of<K, V>(
    entries: impl Iterator<Item = (K, V)>,
    keep: impl Fn(&K, &V) -> bool,
    offset: usize,
    limit: usize,
) -> Page<(K, V)> {
    let mut items = Vec::new();
    let (mut read, mut matched) = (0usize, 0usize);
    let mut complete = true;
    for (k, v) in entries {
        read += 1;
        if !keep(&k, &v) {
            continue;
        }
        matched += 1;
        if matched <= offset {
            continue;
        }
        if items.len() == limit {
            complete = false;
            break;
        }
        items.push((k, v));
    }
    Page {
        next: (!complete).then_some(offset + items.len()),
        items,
        read,
        complete,
    }
}

/// Opens a pinned hash (or LRU hash) map.
fn open_pinned<K: aya::Pod, V: aya::Pod>(pin: &Path) -> Result<HashMap<MapData, K, V>, NatError> {
    let err = |source| NatError::Map {
        path: pin.display().to_string(),
        source,
    };
    let data = MapData::from_pin(pin).map_err(err)?;
    HashMap::try_from(aya::maps::Map::HashMap(data)).map_err(err)
}

/// One page of the NAT table pinned at `pin` (its own handle: no lock of
/// the agent's), the entries `keep` accepts from the `offset`-th on.
pub fn nat_page(
    pin: &Path,
    keep: impl Fn(&NatKey, &NatEntry) -> bool,
    offset: usize,
    limit: usize,
) -> Result<Page<(NatKey, NatEntry)>, NatError> {
    let map = open_pinned(pin)?;
    Ok(page_of(
        map.iter().filter_map(Result::ok),
        keep,
        offset,
        limit,
    ))
}

/// One page of the hostPort map pinned at `pin`.
pub fn hostport_page(
    pin: &Path,
    offset: usize,
    limit: usize,
) -> Result<Page<(rivet_common::HostPortKey, rivet_common::HostPortTarget)>, NatError> {
    let map = open_pinned(pin)?;
    Ok(page_of(
        map.iter().filter_map(Result::ok),
        |_, _| true,
        offset,
        limit,
    ))
}

/// Entries in the hostPort map pinned at `pin` (its keys walked).
pub fn hostport_count(pin: &Path) -> Result<u64, NatError> {
    let map = open_pinned::<rivet_common::HostPortKey, rivet_common::HostPortTarget>(pin)?;
    Ok(map.keys().filter(Result::is_ok).count() as u64)
}

/// What the datapath reads.
pub fn datapath_config(s: &NatSettings) -> NatConfig {
    NatConfig {
        flags: if s.masquerade {
            nat_config_flags::MASQUERADE
        } else {
            0
        },
        port_min: s.port_min,
        port_max: s.port_max,
        ts_base: 0,
    }
}

/// The limits the datapath reads.
pub fn datapath_limits(s: &NatSettings) -> NatLimits {
    NatLimits {
        max_per_pod: s.max_per_pod,
    }
}

/// Refuses a NAT port range that overlaps `ip_local_port_range` (read from
/// the calling thread's namespace).
pub fn check_port_range(s: &NatSettings) -> Result<(), NatError> {
    if !s.masquerade {
        return Ok(());
    }
    let Some(local) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| parse_range(&t))
    else {
        return Ok(());
    };
    let ours = s.port_min..=s.port_max;
    if ours.start() <= local.end() && local.start() <= ours.end() {
        return Err(NatError::Overlap {
            min: s.port_min,
            max: s.port_max,
            local_min: *local.start(),
            local_max: *local.end(),
        });
    }
    Ok(())
}

fn parse_range(text: &str) -> Option<RangeInclusive<u16>> {
    let mut it = text.split_whitespace().map(str::parse::<u16>);
    let (a, b) = (it.next()?.ok()?, it.next()?.ok()?);
    Some(a..=b)
}

/// Timeouts applied by the collector.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// Established TCP, seconds.
    pub tcp: u64,
    /// UDP, seconds.
    pub udp: u64,
    /// Ended TCP (a FIN each way, or a reset), seconds.
    pub closing: u64,
}

/// The table's state after a collection (settings filled in by the agent).
pub type NatStats = rivet_api::NatStatus;

/// The key of the reply entry that belongs to an egress entry.
pub fn reply_key(k: &NatKey, e: &NatEntry) -> NatKey {
    NatKey::new(k.dst, e.addr, (k.dport, e.port), k.proto, nat_dir::REPLY)
}

/// How long a flow may stay idle.
/// The Service flow entry (`dir = svc`: the client's tuple and the backend
/// chosen) of a DNAT entry `{backend, client, backend port, client port}
/// → {frontend, frontend port}`.
pub fn svc_key(k: &NatKey, e: &NatEntry) -> NatKey {
    NatKey::new(k.dst, e.addr, (k.dport, e.port), k.proto, nat_dir::SVC)
}

fn timeout_ns(proto: u8, flags: u16, replied: bool, t: Timeouts) -> u64 {
    let secs = match proto {
        TCP if flags & nat_flags::RST != 0 => t.closing,
        TCP if replied => t.tcp,
        TCP => TCP_SYN_TIMEOUT_S,
        UDP => t.udp,
        _ => ICMP_TIMEOUT_S,
    };
    secs.saturating_mul(1_000_000_000)
}

/// `CLOCK_MONOTONIC` in ns, the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
    })
}

/// Why the collector removes entries.
#[derive(Clone, Copy)]
enum Doom {
    /// Idle past its timeout.
    Expired,
    /// Its partner entry is gone (evicted by the LRU).
    Orphaned,
}

/// The collector, with its own handle of the pinned `NAT` map.
pub struct Collector {
    map: HashMap<MapData, NatKey, NatEntry>,
    counters: Option<aya::maps::PerCpuArray<MapData, u64>>,
    /// `NAT_PODS` (absent when the datapath predates the quota).
    pods: Option<HashMap<MapData, NatPodKey, u64>>,
    path: String,
    timeouts: Timeouts,
    stats: NatStats,
}

impl Collector {
    /// Opens the pinned map at `pin`.
    pub fn open(pin: &Path, timeouts: Timeouts) -> Result<Self, NatError> {
        let path = pin.display().to_string();
        let err = |source| NatError::Map {
            path: path.clone(),
            source,
        };
        let data = MapData::from_pin(pin).map_err(err)?;
        let max = data.info().map_err(err)?.max_entries();
        let map = HashMap::try_from(aya::maps::Map::LruHashMap(data)).map_err(err)?;
        let stats_pin = pin.with_file_name(rivet_common::map_names::NAT_STATS);
        let counters = MapData::from_pin(&stats_pin)
            .ok()
            .and_then(|d| aya::maps::PerCpuArray::try_from(aya::maps::Map::PerCpuArray(d)).ok());
        let pods_pin = pin.with_file_name(rivet_common::map_names::NAT_PODS);
        let pods = MapData::from_pin(&pods_pin)
            .ok()
            .and_then(|d| HashMap::try_from(aya::maps::Map::LruHashMap(d)).ok());
        Ok(Self {
            map,
            counters,
            pods,
            path,
            timeouts,
            stats: NatStats {
                max_entries: u64::from(max),
                ..NatStats::default()
            },
        })
    }

    /// The last collection's figures.
    pub fn stats(&self) -> NatStats {
        self.stats
    }

    /// Entries the datapath created, summed over CPUs.
    fn created(&self) -> Option<u64> {
        let values = self
            .counters
            .as_ref()?
            .get(&rivet_common::nat_stat::CREATED, 0)
            .ok()?;
        Some(values.iter().sum())
    }

    /// Every entry (a snapshot).
    pub fn entries(&self) -> Vec<(NatKey, NatEntry)> {
        self.map.iter().filter_map(Result::ok).collect()
    }

    /// The datapath's running flow count of every pod (`FLOWS` slots).
    fn pod_flows(&self) -> StdHashMap<u32, u64> {
        self.pods.as_ref().map_or_else(StdHashMap::new, |m| {
            m.iter()
                .filter_map(Result::ok)
                .filter(|(k, _)| k.slot == nat_pod_slot::FLOWS)
                .map(|(k, v)| (k.addr, v))
                .collect()
        })
    }

    /// The live flows of every pod as the datapath's quota sees them
    /// (running count + correction, never negative).
    pub fn pod_counts(&self) -> StdHashMap<u32, u64> {
        let Some(m) = self.pods.as_ref() else {
            return StdHashMap::new();
        };
        let mut sums: StdHashMap<u32, u64> = StdHashMap::new();
        for (k, v) in m.iter().filter_map(Result::ok) {
            let s = sums.entry(k.addr).or_default();
            *s = s.wrapping_add(v);
        }
        sums.into_iter()
            .map(|(a, v)| (a, u64::try_from(v as i64).unwrap_or(0)))
            .collect()
    }

    /// Writes each pod's correction: running count (as read before the
    /// table) + correction = `live`. A pod with no flows and a count that
    /// did not move meanwhile loses its two slots.
    fn recount(&mut self, before: &StdHashMap<u32, u64>, live: &StdHashMap<u32, u64>) {
        let Some(m) = self.pods.as_mut() else {
            return;
        };
        let key = |addr, slot| NatPodKey { addr, slot };
        for addr in before.keys().chain(live.keys()) {
            let flows0 = before.get(addr).copied().unwrap_or(0);
            let n = live.get(addr).copied().unwrap_or(0);
            if n == 0 {
                let now = m.get(&key(*addr, nat_pod_slot::FLOWS), 0).ok();
                if now.is_none_or(|v| v == flows0) {
                    // Gone (or idle) pod: nothing to count.
                    let _ = m.remove(&key(*addr, nat_pod_slot::FLOWS));
                    let _ = m.remove(&key(*addr, nat_pod_slot::ADJUST));
                    continue;
                }
            }
            let _ = m.insert(key(*addr, nat_pod_slot::ADJUST), n.wrapping_sub(flows0), 0);
        }
    }

    /// One collection at time `now` (monotonic ns).
    ///
    /// Decides on a snapshot of the table, then removes each doomed entry
    /// only if it is still as the snapshot saw it: a flow the datapath
    /// used again meanwhile (a client reusing its TIME_WAIT port toward a
    /// hostPort hits the ended connection's entry and refreshes it) keeps
    /// its entries — removing them would strand the new connection, whose
    /// replies could no longer be translated.
    pub fn collect(&mut self, now: u64) -> Result<NatStats, NatError> {
        self.collect_with(now, || {})
    }

    /// [`Self::collect`], running `between` after the decisions and before
    /// the removals (tests: traffic arriving meanwhile).
    pub fn collect_with(&mut self, now: u64, between: impl FnOnce()) -> Result<NatStats, NatError> {
        // The running counts before the table: a flow created after this
        // read and seen in the table is counted twice (until the next
        // collection), never not at all.
        let flows_before = self.pod_flows();
        let all: StdHashMap<NatKey, NatEntry> = self.entries().into_iter().collect();
        // Groups removed together (a flow's two entries), as seen.
        let mut doomed: Vec<(Doom, Vec<(NatKey, u64)>)> = Vec::new();
        let young = |e: &NatEntry| now.saturating_sub(e.last_seen) < ORPHAN_GRACE_NS;
        let mut partnered = std::collections::HashSet::new();
        for (k, e) in all.iter().filter(|(k, _)| k.dir == nat_dir::EGRESS) {
            let rk = reply_key(k, e);
            let Some(r) = all.get(&rk) else {
                if !young(e) {
                    doomed.push((Doom::Orphaned, vec![(*k, e.last_seen)]));
                }
                continue;
            };
            partnered.insert(rk);
            let last = e.last_seen.max(r.last_seen);
            let flags = e.flags | r.flags;
            let both_fin = e.flags & r.flags & nat_flags::FIN != 0;
            let replied = r.flags & nat_flags::SEEN != 0;
            let limit = if both_fin && k.proto == TCP {
                self.timeouts.closing.saturating_mul(1_000_000_000)
            } else {
                timeout_ns(k.proto, flags, replied, self.timeouts)
            };
            if now.saturating_sub(last) > limit {
                doomed.push((Doom::Expired, vec![(*k, e.last_seen), (rk, r.last_seen)]));
            }
        }
        // hostPort and Service connections: one entry each, refreshed both
        // ways; a Service flow's backend choice (its client tuple) goes
        // with it.
        for (k, e) in all.iter().filter(|(k, _)| k.dir == nat_dir::DNAT) {
            let choice = svc_key(k, e);
            let choice = all.get(&choice).map(|c| {
                partnered.insert(choice);
                (choice, c.last_seen)
            });
            let replied = e.flags & nat_flags::SEEN != 0;
            let both_fin = e.flags & (nat_flags::FIN | nat_flags::FIN_POD)
                == nat_flags::FIN | nat_flags::FIN_POD;
            let limit = if both_fin && k.proto == TCP {
                self.timeouts.closing.saturating_mul(1_000_000_000)
            } else {
                timeout_ns(k.proto, e.flags, replied, self.timeouts)
            };
            let last = choice.map_or(e.last_seen, |(_, seen)| seen.max(e.last_seen));
            if now.saturating_sub(last) > limit {
                doomed.push((
                    Doom::Expired,
                    std::iter::once((*k, e.last_seen)).chain(choice).collect(),
                ));
            }
        }
        for (k, e) in all
            .iter()
            .filter(|(k, _)| k.dir == nat_dir::REPLY || k.dir == nat_dir::SVC)
        {
            if !partnered.contains(k) && !young(e) {
                doomed.push((Doom::Orphaned, vec![(*k, e.last_seen)]));
            }
        }
        between();
        let (mut expired, mut orphaned, mut removed) = (0u64, 0u64, 0usize);
        let mut gone: std::collections::HashSet<NatKey> = std::collections::HashSet::new();
        for (doom, group) in &doomed {
            // Used again since the snapshot (any entry of the group)?
            let refreshed = group
                .iter()
                .any(|(k, seen)| self.map.get(k, 0).is_ok_and(|now| now.last_seen != *seen));
            if refreshed {
                self.stats.spared += 1;
                continue;
            }
            for (k, _) in group {
                match self.map.remove(k) {
                    Ok(()) | Err(MapError::KeyNotFound) => {}
                    Err(source) => {
                        return Err(NatError::Map {
                            path: self.path.clone(),
                            source,
                        });
                    }
                }
                gone.insert(*k);
                removed += 1;
                match doom {
                    Doom::Expired => expired += 1,
                    Doom::Orphaned => orphaned += 1,
                }
            }
        }
        let mut live: StdHashMap<u32, u64> = StdHashMap::new();
        for k in all
            .keys()
            .filter(|k| k.dir == nat_dir::EGRESS && !gone.contains(k))
        {
            *live.entry(k.src).or_default() += 1;
        }
        self.recount(&flows_before, &live);
        self.stats.entries = (all.len() - removed) as u64;
        self.stats.expired += expired;
        self.stats.orphaned += orphaned;
        if let Some(created) = self.created() {
            // Entries leave the table only through this collector or the
            // LRU; what is neither here nor removed here was evicted. (The
            // removals counted are this agent's: after a restart the
            // figure includes evictions of earlier runs.)
            self.stats.evicted = created
                .saturating_sub(self.stats.entries)
                .saturating_sub(self.stats.expired + self.stats.orphaned);
        }
        self.stats.collections += 1;
        Ok(self.stats)
    }
}

/// A NAT entry for display: `proto src:sport -> dst:dport => addr:port`.
pub fn describe(k: &NatKey, e: &NatEntry) -> String {
    let ip = |a: u32| Ipv4Addr::from(ipv4_from_key(a));
    let port = |p: u16| u16::from_be(p);
    let dir = match k.dir {
        nat_dir::EGRESS => "egress",
        nat_dir::REPLY => "reply",
        nat_dir::DNAT => "dnat-reply",
        nat_dir::SVC => "service",
        _ => "unknown",
    };
    format!(
        "{dir} {} {}:{} -> {}:{} => {}:{}",
        Protocol::from_number(k.proto),
        ip(k.src),
        port(k.sport),
        ip(k.dst),
        port(k.dport),
        ip(e.addr),
        port(e.port)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_read_only_as_far_as_they_need() {
        let read = std::cell::Cell::new(0);
        let entries = || {
            (0u32..10).map(|i| {
                read.set(read.get() + 1);
                (i, i * 10)
            })
        };
        let even = |k: &u32, _: &u32| k.is_multiple_of(2);
        let p = super::page_of(entries(), even, 1, 2);
        assert_eq!(p.items, [(2, 20), (4, 40)]);
        assert_eq!((p.next, p.complete), (Some(3), false));
        // Stopped at the first match past the page (6), not the end.
        assert_eq!(read.get(), 7);
        let last = super::page_of(entries(), even, 3, 2);
        assert_eq!(last.items, [(6, 60), (8, 80)]);
        assert_eq!((last.next, last.complete, last.read), (None, true, 10));
        assert!(super::page_of(entries(), even, 9, 5).items.is_empty());
    }

    #[test]
    fn port_ranges_and_timeouts() {
        assert_eq!(parse_range("32768\t60999\n"), Some(32768..=60999));
        assert_eq!(parse_range("x"), None);
        let t = Timeouts {
            tcp: 100,
            udp: 5,
            closing: 10,
        };
        assert_eq!(timeout_ns(TCP, 0, false, t), 60_000_000_000);
        assert_eq!(timeout_ns(TCP, 0, true, t), 100_000_000_000);
        assert_eq!(timeout_ns(TCP, nat_flags::RST, true, t), 10_000_000_000);
        assert_eq!(timeout_ns(UDP, 0, true, t), 5_000_000_000);
        assert_eq!(timeout_ns(1, 0, true, t), 30_000_000_000);
    }

    #[test]
    fn reply_key_mirrors_the_egress_entry() {
        let k = NatKey::new(1, 2, (3, 4), TCP, nat_dir::EGRESS);
        let e = NatEntry {
            addr: 9,
            port: 61_000u16.to_be(),
            flags: 0,
            last_seen: 0,
            ..NatEntry::default()
        };
        let r = reply_key(&k, &e);
        assert_eq!(
            (r.src, r.dst, r.sport, r.dport),
            (2, 9, 4, 61_000u16.to_be())
        );
        assert_eq!(r.dir, nat_dir::REPLY);
    }
}
