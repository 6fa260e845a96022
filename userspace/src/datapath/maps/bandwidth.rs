//! BANDWIDTH: pod bandwidth limits, a [`PodBandwidth`] (token bucket per
//! direction) by the ifindex of the pod's host-side veth
//! (`ebpf/src/bandwidth.rs` charges them).
//!
//! The map is the truth for the endpoint flags `BANDWIDTH_EGRESS` /
//! `BANDWIDTH_INGRESS`: [`Datapath::put_endpoint`] derives them from the
//! entry of the endpoint's veth, so the entry is written first and the
//! flags follow; a limit removed goes the other way (a flag without an
//! entry charges nothing). An entry left
//! by a veth that is gone is removed at start (ifindexes are reused).

use std::net::Ipv4Addr;

use aya::maps::{HashMap, MapData, MapError};
use rivet_common::{EndpointKey, PodBandwidth, bandwidth_dir, endpoint_flags, ipv4_key, map_names};

use crate::datapath::maps::insert_err;
use crate::datapath::{Datapath, DatapathError, map_err};

/// The endpoint flag of each direction, by [`bandwidth_dir`] index.
const FLAGS: [u32; 2] = [
    endpoint_flags::BANDWIDTH_EGRESS,
    endpoint_flags::BANDWIDTH_INGRESS,
];
const _: () = assert!(bandwidth_dir::EGRESS == 0 && bandwidth_dir::INGRESS == 1);

/// The endpoint flags the limits `pod` call for.
pub fn bandwidth_flags(pod: &PodBandwidth) -> u32 {
    pod.buckets
        .iter()
        .zip(FLAGS)
        .filter(|(b, _)| b.rate != 0)
        .fold(0, |acc, (_, f)| acc | f)
}

impl Datapath {
    fn bandwidth_map(&self) -> Result<HashMap<&MapData, u32, PodBandwidth>, DatapathError> {
        let name = map_names::BANDWIDTH;
        let map = self
            .ebpf
            .map(name)
            .ok_or_else(|| map_err(name)(MapError::InvalidName { name: name.into() }))?;
        HashMap::try_from(map).map_err(map_err(name))
    }

    fn bandwidth_map_mut(
        &mut self,
    ) -> Result<HashMap<&mut MapData, u32, PodBandwidth>, DatapathError> {
        let name = map_names::BANDWIDTH;
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or_else(|| map_err(name)(MapError::InvalidName { name: name.into() }))?;
        HashMap::try_from(map).map_err(map_err(name))
    }

    /// `flags` with the bandwidth bits of the pod behind host-side veth
    /// `ifindex` as `BANDWIDTH` says.
    pub(in crate::datapath) fn with_bandwidth_flags(
        &self,
        ifindex: u32,
        flags: u32,
    ) -> Result<u32, DatapathError> {
        let mask = endpoint_flags::BANDWIDTH_EGRESS | endpoint_flags::BANDWIDTH_INGRESS;
        let bits = self
            .pod_bandwidth(ifindex)?
            .map_or(0, |p| bandwidth_flags(&p));
        Ok((flags & !mask) | bits)
    }

    /// The limits of the pod behind host-side veth `ifindex`, as the
    /// datapath holds them (with its running figures).
    pub fn pod_bandwidth(&self, ifindex: u32) -> Result<Option<PodBandwidth>, DatapathError> {
        match self.bandwidth_map()?.get(&ifindex, 0) {
            Ok(v) => Ok(Some(v)),
            Err(MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(map_err(map_names::BANDWIDTH)(e)),
        }
    }

    /// Every entry of `BANDWIDTH`.
    pub fn list_bandwidth(&self) -> Result<Vec<(u32, PodBandwidth)>, DatapathError> {
        self.bandwidth_map()?
            .iter()
            .map(|r| r.map_err(map_err(map_names::BANDWIDTH)))
            .collect()
    }

    /// Sets the limits of the pod `ip` behind host-side veth `ifindex`
    /// (`None` or no direction limited: removes them), then its endpoint
    /// flags if it has an endpoint entry. A new limit starts with a full
    /// bucket; the drop counters of the entry it replaces carry over.
    pub fn set_pod_bandwidth(
        &mut self,
        ip: Ipv4Addr,
        ifindex: u32,
        limits: Option<PodBandwidth>,
    ) -> Result<(), DatapathError> {
        let limits = limits.filter(|p| bandwidth_flags(p) != 0);
        let key = EndpointKey {
            addr: ipv4_key(ip.octets()),
        };
        let entry = match self.endpoints()?.get(&key, 0) {
            Ok(info) if info.ifindex == ifindex => Some(info),
            Ok(_) | Err(MapError::KeyNotFound) => None,
            Err(e) => return Err(map_err(map_names::ENDPOINTS)(e)),
        };
        match limits {
            Some(mut pod) => {
                if let Some(old) = self.pod_bandwidth(ifindex)? {
                    for (new, old) in pod.buckets.iter_mut().zip(old.buckets) {
                        new.dropped_packets = old.dropped_packets;
                        new.dropped_bytes = old.dropped_bytes;
                        new.passed_bytes = old.passed_bytes;
                    }
                }
                let done = self.bandwidth_map_mut()?.insert(ifindex, pod, 0);
                done.map_err(insert_err(&self.ebpf, map_names::BANDWIDTH))?;
                if let Some(info) = entry {
                    self.put_endpoint(ip, info)?;
                }
            }
            None => {
                // A flag without an entry charges nothing: the entry goes
                // first, the flags after.
                self.remove_pod_bandwidth(ifindex)?;
                if let Some(info) = entry {
                    self.put_endpoint(ip, info)?;
                }
            }
        }
        Ok(())
    }

    /// Removes the limits kept for host-side veth `ifindex` (a veth gone).
    /// Returns whether there were any.
    pub fn remove_pod_bandwidth(&mut self, ifindex: u32) -> Result<bool, DatapathError> {
        match self.bandwidth_map_mut()?.remove(&ifindex) {
            Ok(()) => Ok(true),
            // aya reports a missing key of a delete as the syscall's ENOENT.
            Err(MapError::KeyNotFound) => Ok(false),
            Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => {
                Ok(false)
            }
            Err(e) => Err(map_err(map_names::BANDWIDTH)(e)),
        }
    }
}
