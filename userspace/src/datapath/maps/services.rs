//! SVC_FRONTENDS, SVC_BACKENDS, SVC_STATS, SOCK_NETNS: Services and the pod
//! namespaces whose sockets the hooks translate; and the endpoint flag
//! `SERVICE` for local backends reachable at the uplink (kept here, with
//! the endpoint writes, so the endpoint and Service writers never clobber
//! each other's bits).

use std::net::Ipv4Addr;

use aya::maps::{Array, HashMap, MapData, MapError};
use rivet_common::{
    EndpointKey, SvcBackend, SvcBackendKey, SvcCounters, SvcInfo, SvcKey, endpoint_flags, ipv4_key,
    map_names,
};

use crate::datapath::maps::insert_err;
use crate::datapath::{Datapath, DatapathError, map_err};

impl Datapath {
    fn hash_mut<K: aya::Pod, V: aya::Pod>(
        &mut self,
        name: &'static str,
    ) -> Result<HashMap<&mut MapData, K, V>, DatapathError> {
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or_else(|| map_err(name)(MapError::InvalidName { name: name.into() }))?;
        HashMap::try_from(map).map_err(map_err(name))
    }

    /// Inserts or replaces a Service frontend.
    pub fn put_frontend(&mut self, key: SvcKey, info: SvcInfo) -> Result<(), DatapathError> {
        let done = self
            .hash_mut::<SvcKey, SvcInfo>(map_names::SVC_FRONTENDS)?
            .insert(key, info, 0);
        done.map_err(insert_err(&self.ebpf, map_names::SVC_FRONTENDS))
    }

    /// Removes a Service frontend; false if there was none.
    pub fn remove_frontend(&mut self, key: SvcKey) -> Result<bool, DatapathError> {
        let name = map_names::SVC_FRONTENDS;
        match self.hash_mut::<SvcKey, SvcInfo>(name)?.remove(&key) {
            Ok(()) => Ok(true),
            Err(MapError::KeyNotFound) => Ok(false),
            Err(e) => Err(map_err(name)(e)),
        }
    }

    /// Every Service frontend.
    pub fn list_frontends(&mut self) -> Result<Vec<(SvcKey, SvcInfo)>, DatapathError> {
        let map = self.hash_mut::<SvcKey, SvcInfo>(map_names::SVC_FRONTENDS)?;
        Ok(map.iter().filter_map(Result::ok).collect())
    }

    /// Inserts or replaces one slot of a backend group.
    pub fn put_backend(
        &mut self,
        key: SvcBackendKey,
        backend: SvcBackend,
    ) -> Result<(), DatapathError> {
        let done = self
            .hash_mut::<SvcBackendKey, SvcBackend>(map_names::SVC_BACKENDS)?
            .insert(key, backend, 0);
        done.map_err(insert_err(&self.ebpf, map_names::SVC_BACKENDS))
    }

    /// Removes one slot of a backend group; false if there was none.
    pub fn remove_backend(&mut self, key: SvcBackendKey) -> Result<bool, DatapathError> {
        let name = map_names::SVC_BACKENDS;
        match self
            .hash_mut::<SvcBackendKey, SvcBackend>(name)?
            .remove(&key)
        {
            Ok(()) => Ok(true),
            Err(MapError::KeyNotFound) => Ok(false),
            Err(e) => Err(map_err(name)(e)),
        }
    }

    /// Every backend slot.
    pub fn list_backends(&mut self) -> Result<Vec<(SvcBackendKey, SvcBackend)>, DatapathError> {
        let map = self.hash_mut::<SvcBackendKey, SvcBackend>(map_names::SVC_BACKENDS)?;
        Ok(map.iter().filter_map(Result::ok).collect())
    }

    /// The counters of Service port `id` (zero for an id never used).
    pub fn service_counters(&self, id: u32) -> Result<SvcCounters, DatapathError> {
        let name = map_names::SVC_STATS;
        let map = self
            .ebpf
            .map(name)
            .ok_or_else(|| map_err(name)(MapError::InvalidName { name: name.into() }))?;
        let array: Array<&MapData, SvcCounters> = Array::try_from(map).map_err(map_err(name))?;
        array.get(&id, 0).map_err(map_err(name))
    }

    /// Zeroes the counters of Service port `id` (an id handed to a new
    /// Service port starts from zero).
    pub fn reset_service_counters(&mut self, id: u32) -> Result<(), DatapathError> {
        let name = map_names::SVC_STATS;
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or_else(|| map_err(name)(MapError::InvalidName { name: name.into() }))?;
        let mut array: Array<&mut MapData, SvcCounters> =
            Array::try_from(map).map_err(map_err(name))?;
        array
            .set(id, SvcCounters::default(), 0)
            .map_err(map_err(name))
    }

    /// Marks the pod network namespace `cookie` (`SO_NETNS_COOKIE`): its
    /// sockets get Services translated.
    pub fn put_pod_netns(&mut self, cookie: u64) -> Result<(), DatapathError> {
        let done = self.hash_mut::<u64, u32>(map_names::SOCK_NETNS)?.insert(
            cookie,
            rivet_common::netns_role::POD,
            0,
        );
        done.map_err(insert_err(&self.ebpf, map_names::SOCK_NETNS))
    }

    /// Forgets a pod network namespace; false if it was not marked.
    pub fn remove_pod_netns(&mut self, cookie: u64) -> Result<bool, DatapathError> {
        let name = map_names::SOCK_NETNS;
        match self.hash_mut::<u64, u32>(name)?.remove(&cookie) {
            Ok(()) => Ok(true),
            Err(MapError::KeyNotFound) => Ok(false),
            Err(e) => Err(map_err(name)(e)),
        }
    }

    /// Every marked pod network namespace.
    pub fn list_pod_netns(&mut self) -> Result<Vec<u64>, DatapathError> {
        let map = self.hash_mut::<u64, u32>(map_names::SOCK_NETNS)?;
        Ok(map.keys().filter_map(Result::ok).collect())
    }

    /// Sets which local addresses are backends of Services reachable at the
    /// uplink: their endpoint entries carry [`endpoint_flags::SERVICE`]
    /// (their packets are looked up as possible replies). Entries written
    /// later by [`Datapath::put_endpoint`] get the flag from this set.
    pub fn set_service_backends(
        &mut self,
        addrs: std::collections::BTreeSet<Ipv4Addr>,
    ) -> Result<(), DatapathError> {
        let changed: Vec<Ipv4Addr> = addrs
            .symmetric_difference(&self.service_backends)
            .copied()
            .collect();
        self.service_backends = addrs;
        for ip in changed {
            let key = EndpointKey {
                addr: ipv4_key(ip.octets()),
            };
            let current = self.endpoints()?.get(&key, 0);
            match current {
                Ok(info) => self.put_endpoint(ip, info)?,
                Err(MapError::KeyNotFound) => {}
                Err(e) => return Err(map_err(map_names::ENDPOINTS)(e)),
            }
        }
        Ok(())
    }

    /// `flags` with [`endpoint_flags::SERVICE`] as the Service backends say
    /// for `ip`.
    pub(in crate::datapath) fn with_service_flag(&self, ip: Ipv4Addr, flags: u32) -> u32 {
        if self.service_backends.contains(&ip) {
            flags | endpoint_flags::SERVICE
        } else {
            flags & !endpoint_flags::SERVICE
        }
    }
}

impl Datapath {
    /// Forgets the uplink Service flows (`nat_dir::SVC` entries and their
    /// DNAT entries) of protocol `proto` held by a backend in `backends`
    /// (addresses and ports in wire order): the client's next packet
    /// chooses again. Returns the flows forgotten.
    pub fn forget_service_flows(
        &mut self,
        proto: u8,
        backends: &std::collections::HashSet<(u32, u16)>,
    ) -> Result<usize, DatapathError> {
        use rivet_common::{NatEntry, NatKey, nat_dir};
        let name = map_names::NAT;
        let mut map = self.hash_mut::<NatKey, NatEntry>(name)?;
        let doomed: Vec<(NatKey, NatEntry)> = map
            .iter()
            .filter_map(Result::ok)
            .filter(|(k, e)| {
                k.dir == nat_dir::SVC && k.proto == proto && backends.contains(&(e.addr, e.port))
            })
            .collect();
        for (k, e) in &doomed {
            let dnat = NatKey::new(e.addr, k.src, (e.port, k.sport), k.proto, nat_dir::DNAT);
            for key in [*k, dnat] {
                match map.remove(&key) {
                    Ok(()) | Err(MapError::KeyNotFound) => {}
                    Err(e) => return Err(map_err(name)(e)),
                }
            }
        }
        Ok(doomed.len())
    }

    /// Whether the socket `cookie` was sent to `addr`:`port` (wire order)
    /// by the socket hooks (a Service or hostPort it named).
    pub fn socket_translated(&self, cookie: u64, addr: u32, port: u16) -> bool {
        let name = map_names::SOCK_REVNAT;
        let Some(map) = self.ebpf.map(name) else {
            return false;
        };
        let Ok(hash) =
            HashMap::<&MapData, rivet_common::SockRevKey, rivet_common::SockRevTarget>::try_from(
                map,
            )
        else {
            return false;
        };
        let key = rivet_common::SockRevKey {
            cookie,
            addr,
            port,
            _pad: 0,
        };
        hash.get(&key, 0).is_ok()
    }
}
