//! The NAT section: masquerade, source ports, exceptions, timeouts, the
//! table's size and each pod's quota.

use ipnet::Ipv4Net;

use super::{ConfigError, FileConfig, invalid};

/// Default source ports of masqueraded flows: above Linux's default
/// `ip_local_port_range` (32768–60999), so the node's own connections
/// never collide with them.
pub const DEFAULT_NAT_PORT_RANGE: (u16, u16) = (61_000, 65_535);
/// Destinations that are never masqueraded besides the cluster CIDR:
/// link-local, multicast, limited broadcast.
pub const ALWAYS_NO_MASQUERADE: [&str; 3] = ["169.254.0.0/16", "224.0.0.0/4", "255.255.255.255/32"];

/// Masquerade (SNAT) settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatSettings {
    /// Masquerade pod traffic leaving the cluster (default on).
    pub masquerade: bool,
    /// First NAT source port.
    pub port_min: u16,
    /// Last NAT source port (inclusive).
    pub port_max: u16,
    /// Destinations kept un-masqueraded: the cluster CIDR, the
    /// [`ALWAYS_NO_MASQUERADE`] ones and the configured list.
    pub no_masquerade: Vec<Ipv4Net>,
    /// Idle timeout of an established TCP flow, seconds.
    pub tcp_timeout: u64,
    /// Idle timeout of a UDP flow, seconds.
    pub udp_timeout: u64,
    /// How long a TCP flow stays after it ended (a FIN each way, or a
    /// reset), seconds.
    pub tcp_closing_timeout: u64,
    /// Seconds between two garbage collections of the NAT table.
    pub gc_interval: u64,
    /// Capacity of the NAT table (entries; a masqueraded flow takes two, a
    /// hostPort connection one).
    pub max_entries: u32,
    /// Masqueraded flows one pod may hold at a time (0: no limit); default
    /// [`default_nat_max_per_pod`] of `max_entries` and the possible CPUs.
    pub max_per_pod: u32,
}

/// The default per-pod NAT quota for a table of `max_entries` entries on a
/// node with `cpus` possible CPUs: the flows of half of one CPU's share
/// (`max_entries / cpus`; a flow takes two entries, and the table keeps an
/// LRU list per CPU, so a CPU recycles only what it created), and at most
/// a quarter of the table's flows. One pod at its quota on one CPU can never
/// push out the other flows that CPU holds; on two CPUs or fewer it takes
/// four pods at their quota to fill the table.
pub const fn default_nat_max_per_pod(max_entries: u32, cpus: u32) -> u32 {
    let cpus = if cpus < 2 { 2 } else { cpus };
    let q = max_entries / 4 / cpus;
    if q == 0 { 1 } else { q }
}

/// The node's possible CPUs (what the kernel sizes per-CPU map parts by).
pub fn possible_cpus() -> Result<u32, ConfigError> {
    aya::util::nr_cpus()
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
        .map_err(|(path, source)| ConfigError::Read {
            path: path.into(),
            source,
        })
}

pub(super) fn nat_settings(
    file: &FileConfig,
    cluster_cidr: Ipv4Net,
) -> Result<NatSettings, ConfigError> {
    let (port_min, port_max) = match &file.nat_port_range {
        None => DEFAULT_NAT_PORT_RANGE,
        Some(text) => {
            let bad = || {
                invalid(
                    "nat_port_range",
                    text,
                    "use \"first-last\" with 1024 ≤ first ≤ last ≤ 65535",
                )
            };
            let (a, b) = text.split_once('-').ok_or_else(bad)?;
            let (a, b): (u16, u16) = (
                a.trim().parse().map_err(|_| bad())?,
                b.trim().parse().map_err(|_| bad())?,
            );
            if a < 1024 || a > b {
                return Err(bad());
            }
            (a, b)
        }
    };
    let mut no_masquerade = vec![cluster_cidr];
    for text in ALWAYS_NO_MASQUERADE
        .iter()
        .map(|s| (*s).to_owned())
        .chain(file.no_masquerade.clone().unwrap_or_default())
    {
        let net: Ipv4Net = text
            .parse()
            .map_err(|_| invalid("no_masquerade", &text, "not an IPv4 CIDR"))?;
        no_masquerade.push(net.trunc());
    }
    let seconds = |key: &'static str, v: Option<u64>, default: u64| match v.unwrap_or(default) {
        s @ 1..=604_800 => Ok(s),
        s => Err(invalid(key, s, "must be 1..=604800 seconds")),
    };
    let max_entries = match file.nat_max_entries.unwrap_or(rivet_common::NAT_MAX) {
        n @ 16..=16_777_216 => n,
        n => return Err(invalid("nat_max_entries", n, "must be 16..=16777216")),
    };
    let max_per_pod = match file.nat_max_per_pod {
        None => default_nat_max_per_pod(max_entries, possible_cpus()?),
        Some(n) if n <= max_entries / 2 => n,
        Some(n) => {
            return Err(invalid(
                "nat_max_per_pod",
                n,
                format!(
                    "must be 0 (no limit) ..= nat_max_entries / 2 = {} flows",
                    max_entries / 2
                ),
            ));
        }
    };
    Ok(NatSettings {
        masquerade: file.masquerade.unwrap_or(true),
        port_min,
        port_max,
        no_masquerade,
        tcp_timeout: seconds("nat_tcp_timeout", file.nat_tcp_timeout, 3600)?,
        udp_timeout: seconds("nat_udp_timeout", file.nat_udp_timeout, 60)?,
        tcp_closing_timeout: seconds("nat_tcp_closing_timeout", file.nat_tcp_closing_timeout, 10)?,
        gc_interval: seconds("nat_gc_interval", file.nat_gc_interval, 10)?,
        max_entries,
        max_per_pod,
    })
}
