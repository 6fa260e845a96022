//! Address allocation for pods: host-local's features (several ranges,
//! rangeStart/rangeEnd, a reserved gateway, round-robin reuse) without its
//! flaws. The leases themselves are the endpoint records (written before the
//! pod is plumbed, see `endpoint`); this module only chooses addresses.
//!
//! - The address comes from the requested one (CNI_ARGS `IP`,
//!   `runtimeConfig.ips`, `args.cni.ips`, or a delegated IPAM plugin) or from
//!   [`Ipam`]: the request's ranges (host-local format, inside the node's pod
//!   CIDR) or the whole pod CIDR; the gateway is never handed out.
//! - An address is taken if a record holds it, the endpoints map holds it, the
//!   node has it (addresses, /32 routes via other devices: refreshed by the
//!   reconciler), or a deleted pod's veth is still being removed.
//!
//! Round-robin: the search starts after the last address handed out from the
//! same range set, so a freed address is not reused until the set wraps (stale
//! ARP caches, cni#194). The position (`ipam-last.json`) is a hint persisted
//! without fsync, written like the records: losing or garbling it only restarts
//! the search at the range start (taken addresses are skipped anyway).

use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use ipnet::Ipv4Net;
use rivet_api::IpRange;

/// Allocation problems.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IpamError {
    /// A range is malformed or outside the node's pod CIDR.
    #[error("invalid range: {0}")]
    InvalidRange(String),
    /// A requested address cannot be used.
    #[error("{0}")]
    InvalidAddress(String),
    /// A requested address is held by someone else (`owner`).
    #[error("ip {ip} is already in use by {owner}")]
    InUse {
        /// The address.
        ip: Ipv4Addr,
        /// Who holds it.
        owner: String,
    },
    /// Every address of the range set is taken.
    #[error("no IP addresses available in range set {0}")]
    Exhausted(String),
}

/// One contiguous range of assignable addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    /// The subnet the range lies in.
    pub subnet: Ipv4Net,
    /// First assignable address.
    pub start: Ipv4Addr,
    /// Last assignable address.
    pub end: Ipv4Addr,
    /// Reserved address, never handed out.
    pub gateway: Option<Ipv4Addr>,
}

fn first_host(net: Ipv4Net) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(net.network()) + 1)
}

fn last_host(net: Ipv4Net) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(net.broadcast()) - 1)
}

impl Range {
    /// The usable hosts of `net` (network and broadcast excluded).
    pub fn whole(net: Ipv4Net) -> Self {
        Self {
            subnet: net,
            start: first_host(net),
            end: last_host(net),
            gateway: None,
        }
    }

    /// Validates a host-local style range against the node's pod CIDR.
    pub fn from_api(r: &IpRange, pod_cidr: Ipv4Net) -> Result<Self, IpamError> {
        let bad = |m: String| IpamError::InvalidRange(m);
        let subnet: Ipv4Net = r
            .subnet
            .parse()
            .map_err(|_| bad(format!("subnet {:?} is not an IPv4 CIDR", r.subnet)))?;
        if subnet.network() != subnet.addr() {
            return Err(bad(format!("subnet {subnet} has host bits set")));
        }
        if subnet.prefix_len() > 30 {
            return Err(bad(format!("subnet {subnet} is too small (prefix > 30)")));
        }
        if !pod_cidr.contains(&subnet) {
            return Err(bad(format!(
                "subnet {subnet} is outside the node's pod CIDR {pod_cidr}"
            )));
        }
        let start = r.range_start.unwrap_or_else(|| first_host(subnet));
        let end = r.range_end.unwrap_or_else(|| last_host(subnet));
        for (what, ip) in [("rangeStart", start), ("rangeEnd", end)] {
            if !subnet.contains(&ip) || ip == subnet.network() || ip == subnet.broadcast() {
                return Err(bad(format!(
                    "{what} {ip} is not a host address of {subnet}"
                )));
            }
        }
        if u32::from(start) > u32::from(end) {
            return Err(bad(format!("rangeStart {start} is after rangeEnd {end}")));
        }
        if let Some(gw) = r.gateway
            && !subnet.contains(&gw)
        {
            return Err(bad(format!("gateway {gw} is outside {subnet}")));
        }
        Ok(Self {
            subnet,
            start,
            end,
            gateway: r.gateway,
        })
    }

    /// True if `ip` may be handed out from this range.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let v = u32::from(ip);
        v >= u32::from(self.start) && v <= u32::from(self.end) && Some(ip) != self.gateway
    }

    /// Number of assignable addresses.
    pub fn size(&self) -> u64 {
        let n = u64::from(u32::from(self.end) - u32::from(self.start)) + 1;
        let gw_inside = self.gateway.is_some_and(|g| {
            u32::from(g) >= u32::from(self.start) && u32::from(g) <= u32::from(self.end)
        });
        n - u64::from(gw_inside)
    }
}

/// Ranges searched in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeSet(pub Vec<Range>);

impl RangeSet {
    /// Builds the set for a request: the given ranges, or the whole pod CIDR.
    pub fn for_request(ranges: &[IpRange], pod_cidr: Ipv4Net) -> Result<Self, IpamError> {
        if ranges.is_empty() {
            return Ok(Self(vec![Range::whole(pod_cidr)]));
        }
        let set = ranges
            .iter()
            .map(|r| Range::from_api(r, pod_cidr))
            .collect::<Result<Vec<_>, _>>()?;
        for (i, a) in set.iter().enumerate() {
            for b in &set[i + 1..] {
                if u32::from(a.start) <= u32::from(b.end) && u32::from(b.start) <= u32::from(a.end)
                {
                    return Err(IpamError::InvalidRange(format!(
                        "ranges {}-{} and {}-{} overlap",
                        a.start, a.end, b.start, b.end
                    )));
                }
            }
        }
        Ok(Self(set))
    }

    /// Stable identity of the set (round-robin position key).
    pub fn key(&self) -> String {
        self.0
            .iter()
            .map(|r| format!("{}-{}", r.start, r.end))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// True if `ip` belongs to the set.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        self.0.iter().any(|r| r.contains(ip))
    }

    /// Number of assignable addresses.
    pub fn size(&self) -> u64 {
        self.0.iter().map(Range::size).sum()
    }

    /// Every assignable address, in order.
    fn addresses(&self) -> impl Iterator<Item = Ipv4Addr> + '_ {
        self.0.iter().flat_map(|r| {
            (u32::from(r.start)..=u32::from(r.end))
                .map(Ipv4Addr::from)
                .filter(move |ip| Some(*ip) != r.gateway)
        })
    }
}

/// Chooses addresses; remembers the round-robin position per range set.
#[derive(Debug)]
pub struct Ipam {
    pod_cidr: Ipv4Net,
    last: BTreeMap<String, Ipv4Addr>,
    path: PathBuf,
}

impl Ipam {
    /// Loads the round-robin positions from `state_dir/ipam-last.json`
    /// (missing or unreadable: start from the beginning).
    pub fn open(state_dir: &Path, pod_cidr: Ipv4Net) -> Self {
        let path = state_dir.join("ipam-last.json");
        let last = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        Self {
            pod_cidr,
            last,
            path,
        }
    }

    /// The node's pod CIDR.
    pub fn pod_cidr(&self) -> Ipv4Net {
        self.pod_cidr
    }

    /// Addresses of the whole pod CIDR.
    pub fn pool_size(&self) -> u64 {
        Range::whole(self.pod_cidr).size()
    }

    /// Checks that a requested address is usable (in the set, not taken).
    pub fn check_requested(
        &self,
        ip: Ipv4Addr,
        set: &RangeSet,
        taken: impl Fn(Ipv4Addr) -> Option<String>,
    ) -> Result<(), IpamError> {
        if !set.contains(ip) {
            return Err(IpamError::InvalidAddress(format!(
                "ip {ip} is not a usable address of the pod CIDR {} (or the requested ranges)",
                self.pod_cidr
            )));
        }
        if let Some(owner) = taken(ip) {
            return Err(IpamError::InUse { ip, owner });
        }
        Ok(())
    }

    /// The next free address of `set` after the last one handed out from it.
    /// `taken` names the owner of an address in use.
    pub fn allocate(
        &mut self,
        set: &RangeSet,
        taken: impl Fn(Ipv4Addr) -> Option<String>,
    ) -> Result<Ipv4Addr, IpamError> {
        let key = set.key();
        let after = self.last.get(&key).copied();
        let all: Vec<Ipv4Addr> = set.addresses().collect();
        let start = after
            .and_then(|a| all.iter().position(|ip| *ip == a))
            .map_or(0, |i| i + 1);
        let found = all[start..]
            .iter()
            .chain(&all[..start])
            .copied()
            .find(|ip| taken(*ip).is_none())
            .ok_or_else(|| IpamError::Exhausted(key.clone()))?;
        self.last.insert(key, found);
        self.persist();
        Ok(found)
    }

    fn persist(&self) {
        // A hint only (garbled or lost: the search starts at the beginning,
        // and taken addresses are skipped anyway): rewritten in place.
        let written = serde_json::to_vec(&self.last)
            .map_err(|e| e.to_string())
            .and_then(|b| crate::store::write_hint(&self.path, b).map_err(|e| e.to_string()));
        if let Err(e) = written {
            tracing::debug!(error = %e, "could not persist the round-robin position");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn cidr() -> Ipv4Net {
        "10.1.0.0/24".parse().expect("cidr")
    }

    fn ipam(tag: &str) -> Ipam {
        let dir = std::env::temp_dir().join(format!("rivet-ipam-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let _ = std::fs::remove_file(dir.join("ipam-last.json"));
        let ipam = Ipam::open(&dir, cidr());
        // These tests do not persist: the hint file fails to write, quietly.
        std::fs::remove_dir_all(&dir).expect("cleanup");
        ipam
    }

    fn range(subnet: &str, start: Option<&str>, end: Option<&str>, gw: Option<&str>) -> IpRange {
        IpRange {
            subnet: subnet.into(),
            range_start: start.map(|s| s.parse().expect("ip")),
            range_end: end.map(|s| s.parse().expect("ip")),
            gateway: gw.map(|s| s.parse().expect("ip")),
        }
    }

    #[test]
    fn whole_cidr_has_254_addresses() {
        let set = RangeSet::for_request(&[], cidr()).expect("set");
        assert_eq!(set.size(), 254);
        assert!(!set.contains("10.1.0.0".parse().expect("ip")));
        assert!(!set.contains("10.1.0.255".parse().expect("ip")));
    }

    #[test]
    fn round_robin_does_not_reuse_a_freed_address_immediately() {
        let mut ipam = ipam("rr");
        let set = RangeSet::for_request(&[], cidr()).expect("set");
        let mut used = HashSet::new();
        let a = ipam
            .allocate(&set, |ip| used.contains(&ip).then(|| "x".into()))
            .expect("a");
        used.insert(a);
        let b = ipam
            .allocate(&set, |ip| used.contains(&ip).then(|| "x".into()))
            .expect("b");
        used.insert(b);
        used.remove(&a);
        let c = ipam
            .allocate(&set, |ip| used.contains(&ip).then(|| "x".into()))
            .expect("c");
        assert_eq!(a.to_string(), "10.1.0.1");
        assert_eq!(b.to_string(), "10.1.0.2");
        assert_eq!(
            c.to_string(),
            "10.1.0.3",
            "the freed .1 is not handed out again yet"
        );
    }

    #[test]
    fn ranges_gateway_and_exhaustion() {
        let mut ipam = ipam("ex");
        let set = RangeSet::for_request(
            &[range(
                "10.1.0.0/28",
                Some("10.1.0.2"),
                Some("10.1.0.5"),
                Some("10.1.0.3"),
            )],
            cidr(),
        )
        .expect("set");
        assert_eq!(set.size(), 3);
        let mut used = HashSet::new();
        for want in ["10.1.0.2", "10.1.0.4", "10.1.0.5"] {
            let ip = ipam
                .allocate(&set, |ip| used.contains(&ip).then(|| "x".into()))
                .expect("free address");
            assert_eq!(ip.to_string(), want);
            used.insert(ip);
        }
        let err = ipam
            .allocate(&set, |ip| used.contains(&ip).then(|| "x".into()))
            .expect_err("exhausted");
        assert!(matches!(err, IpamError::Exhausted(_)));
        // One freed address is found again (wrapping around).
        used.remove(&"10.1.0.4".parse().expect("ip"));
        let ip = ipam
            .allocate(&set, |ip| used.contains(&ip).then(|| "x".into()))
            .expect("one free");
        assert_eq!(ip.to_string(), "10.1.0.4");
    }

    #[test]
    fn invalid_ranges_are_rejected() {
        for (r, needle) in [
            (
                range("10.2.0.0/24", None, None, None),
                "outside the node's pod CIDR",
            ),
            (range("10.1.0.1/28", None, None, None), "host bits"),
            (
                range("10.1.0.0/28", Some("10.1.0.9"), Some("10.1.0.3"), None),
                "after rangeEnd",
            ),
            (
                range("10.1.0.0/28", Some("10.1.0.0"), None, None),
                "not a host address",
            ),
            (
                range("10.1.0.0/28", None, None, Some("10.1.1.1")),
                "gateway",
            ),
            (range("nonsense", None, None, None), "not an IPv4 CIDR"),
        ] {
            let err = RangeSet::for_request(&[r], cidr())
                .expect_err(needle)
                .to_string();
            assert!(err.contains(needle), "{err}");
        }
        let err = RangeSet::for_request(
            &[
                range("10.1.0.0/28", None, None, None),
                range("10.1.0.8/29", None, None, None),
            ],
            cidr(),
        )
        .expect_err("overlap")
        .to_string();
        assert!(err.contains("overlap"), "{err}");
    }

    #[test]
    fn requested_addresses_are_checked() {
        let ipam = ipam("req");
        let set = RangeSet::for_request(&[], cidr()).expect("set");
        assert!(
            ipam.check_requested("10.1.0.7".parse().expect("ip"), &set, |_| None)
                .is_ok()
        );
        let err = ipam
            .check_requested("10.1.0.7".parse().expect("ip"), &set, |_| {
                Some("pod x".into())
            })
            .expect_err("taken");
        assert!(
            matches!(&err, IpamError::InUse { owner, .. } if owner == "pod x"),
            "{err:?}"
        );
        assert!(err.to_string().contains("already in use by pod x"));
        assert!(
            ipam.check_requested("10.9.0.7".parse().expect("ip"), &set, |_| None)
                .is_err()
        );
    }

    #[test]
    fn position_survives_reopen() {
        let dir = std::env::temp_dir().join(format!("rivet-ipam-reopen-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let _ = std::fs::remove_file(dir.join("ipam-last.json"));
        let set = RangeSet::for_request(&[], cidr()).expect("set");
        let mut a = Ipam::open(&dir, cidr());
        a.allocate(&set, |_| None).expect("first");
        let mut b = Ipam::open(&dir, cidr());
        assert_eq!(
            b.allocate(&set, |_| None).expect("second").to_string(),
            "10.1.0.2"
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
