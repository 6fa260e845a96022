//! ENDPOINTS and ENDPOINT_SLOTS: the pods of this node.
//!
//! `ENDPOINT_SLOTS` is a direct-mapped cache of `ENDPOINTS` the programs read
//! first (`ebpf/src/maps.rs`). The agent writes the hash entry, then the slot
//! (only if empty or already the same address); on removal it clears the slot
//! first, so no slot is ever ahead of its entry. At start
//! `Datapath::sync_endpoint_slots` rebuilds the cache from `ENDPOINTS` (a crash
//! between the writes, an upgrade from an agent without the cache, entries
//! removed while no agent ran). A slot is rewritten only when empty or for the
//! same address, so a torn read during the agent's write can only mix two
//! versions of the same endpoint.

use std::net::Ipv4Addr;

use aya::{
    Ebpf,
    maps::{Array, HashMap, MapData, MapError},
};
use rivet_common::{
    ENDPOINT_SLOTS_MAX, EndpointInfo, EndpointKey, EndpointSlot, ipv4_from_key, ipv4_key, map_names,
};

use crate::datapath::maps::insert_err;
use crate::datapath::{Datapath, DatapathError, map_err};

/// The address in every `ENDPOINT_SLOTS` slot, by index.
pub(in crate::datapath) fn read_slot_holders(ebpf: &Ebpf) -> Result<Vec<u32>, DatapathError> {
    let name = map_names::ENDPOINT_SLOTS;
    let map = ebpf
        .map(name)
        .ok_or_else(|| map_err(name)(MapError::InvalidName { name: name.into() }))?;
    let slots: Array<&MapData, EndpointSlot> = Array::try_from(map).map_err(map_err(name))?;
    slots
        .iter()
        .map(|slot| slot.map(|s| s.addr).map_err(map_err(name)))
        .collect()
}

/// An empty endpoint cache slot.
pub(in crate::datapath) const EMPTY_SLOT: EndpointSlot = EndpointSlot {
    addr: 0,
    info: EndpointInfo {
        ifindex: 0,
        flags: 0,
        mac: [0; 6],
        host_mac: [0; 6],
    },
};

impl Datapath {
    pub(in crate::datapath) fn endpoints_mut(
        &mut self,
    ) -> Result<HashMap<&mut MapData, EndpointKey, EndpointInfo>, DatapathError> {
        let name = map_names::ENDPOINTS;
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or_else(|| map_err(name)(MapError::InvalidName { name: name.into() }))?;
        HashMap::try_from(map).map_err(map_err(name))
    }

    pub(in crate::datapath) fn endpoints(
        &self,
    ) -> Result<HashMap<&MapData, EndpointKey, EndpointInfo>, DatapathError> {
        let name = map_names::ENDPOINTS;
        let map = self
            .ebpf
            .map(name)
            .ok_or_else(|| map_err(name)(MapError::InvalidName { name: name.into() }))?;
        HashMap::try_from(map).map_err(map_err(name))
    }

    pub(in crate::datapath) fn endpoint_slots_mut(
        &mut self,
    ) -> Result<Array<&mut MapData, EndpointSlot>, DatapathError> {
        let name = map_names::ENDPOINT_SLOTS;
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or_else(|| map_err(name)(MapError::InvalidName { name: name.into() }))?;
        Array::try_from(map).map_err(map_err(name))
    }

    /// Inserts or replaces the endpoint for `ip`: the `ENDPOINTS` entry
    /// (the truth), then its cache slot if the slot is free or already
    /// holds `ip` (another address in it keeps it; `ip` is then found
    /// through the hash).
    pub fn put_endpoint(&mut self, ip: Ipv4Addr, info: EndpointInfo) -> Result<(), DatapathError> {
        let flags = self.with_policy_flags(ip, self.with_service_flag(ip, info.flags));
        let info = EndpointInfo {
            flags: self.with_bandwidth_flags(info.ifindex, flags)?,
            ..info
        };
        let key = EndpointKey {
            addr: ipv4_key(ip.octets()),
        };
        let done = self.endpoints_mut()?.insert(key, info, 0);
        done.map_err(insert_err(&self.ebpf, map_names::ENDPOINTS))?;
        let index = rivet_common::endpoint_slot(key.addr);
        let held = self.slot_holders[index as usize];
        if held == 0 || held == key.addr {
            self.endpoint_slots_mut()?
                .set(
                    index,
                    EndpointSlot {
                        addr: key.addr,
                        info,
                    },
                    0,
                )
                .map_err(map_err(map_names::ENDPOINT_SLOTS))?;
            self.slot_holders[index as usize] = key.addr;
        }
        Ok(())
    }

    /// Empties `addr`'s cache slot if it holds `addr`.
    pub(in crate::datapath) fn clear_endpoint_slot(
        &mut self,
        addr: u32,
    ) -> Result<(), DatapathError> {
        let index = rivet_common::endpoint_slot(addr);
        if self.slot_holders[index as usize] == addr {
            self.endpoint_slots_mut()?
                .set(index, EMPTY_SLOT, 0)
                .map_err(map_err(map_names::ENDPOINT_SLOTS))?;
            self.slot_holders[index as usize] = 0;
        }
        Ok(())
    }

    /// Makes the endpoint cache agree with `ENDPOINTS` (at start: slots of
    /// a crash between the two writes, of an upgrade from an agent without
    /// the cache, or of entries removed while no agent ran). Returns the
    /// number of slots rewritten.
    pub fn sync_endpoint_slots(&mut self) -> Result<usize, DatapathError> {
        let live: std::collections::HashMap<u32, EndpointInfo> = self
            .list_endpoints()?
            .into_iter()
            .map(|(ip, info)| (ipv4_key(ip.octets()), info))
            .collect();
        // The first live address of each slot, for slots whose holder is gone.
        let mut first = vec![EMPTY_SLOT; ENDPOINT_SLOTS_MAX as usize];
        for (&addr, &info) in &live {
            let slot = &mut first[rivet_common::endpoint_slot(addr) as usize];
            if slot.addr == 0 || addr < slot.addr {
                *slot = EndpointSlot { addr, info };
            }
        }
        let mut holders = vec![0; ENDPOINT_SLOTS_MAX as usize];
        let mut slots = self.endpoint_slots_mut()?;
        let mut rewritten = 0;
        for (index, first) in (0..ENDPOINT_SLOTS_MAX).zip(first) {
            let held = slots
                .get(&index, 0)
                .map_err(map_err(map_names::ENDPOINT_SLOTS))?;
            // A live holder keeps its slot (refreshed); otherwise the first
            // live address of the slot, or empty.
            let want = match live.get(&held.addr) {
                Some(&info) if held.addr != 0 => EndpointSlot {
                    addr: held.addr,
                    info,
                },
                _ => first,
            };
            if held != want {
                slots
                    .set(index, want, 0)
                    .map_err(map_err(map_names::ENDPOINT_SLOTS))?;
                rewritten += 1;
            }
            holders[index as usize] = want.addr;
        }
        self.slot_holders = holders;
        Ok(rewritten)
    }

    /// The endpoint cache slot of `ip`: what it holds (tests, status).
    pub fn endpoint_slot(&self, ip: Ipv4Addr) -> Result<EndpointSlot, DatapathError> {
        let name = map_names::ENDPOINT_SLOTS;
        let map = self
            .ebpf
            .map(name)
            .ok_or_else(|| map_err(name)(MapError::InvalidName { name: name.into() }))?;
        let slots: Array<&MapData, EndpointSlot> = Array::try_from(map).map_err(map_err(name))?;
        slots
            .get(&rivet_common::endpoint_slot(ipv4_key(ip.octets())), 0)
            .map_err(map_err(name))
    }

    /// Removes the endpoint for `ip` (its cache slot first, so the datapath
    /// never finds a slot without its entry); false if there was none.
    pub fn remove_endpoint(&mut self, ip: Ipv4Addr) -> Result<bool, DatapathError> {
        let key = EndpointKey {
            addr: ipv4_key(ip.octets()),
        };
        self.clear_endpoint_slot(key.addr)?;
        match self.endpoints_mut()?.remove(&key) {
            Ok(()) => Ok(true),
            Err(MapError::KeyNotFound) => Ok(false),
            Err(e) => Err(map_err(map_names::ENDPOINTS)(e)),
        }
    }

    /// The endpoint for `ip`, if any.
    pub fn endpoint(&self, ip: Ipv4Addr) -> Result<Option<EndpointInfo>, DatapathError> {
        let key = EndpointKey {
            addr: ipv4_key(ip.octets()),
        };
        match self.endpoints()?.get(&key, 0) {
            Ok(v) => Ok(Some(v)),
            Err(MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(map_err(map_names::ENDPOINTS)(e)),
        }
    }

    /// Every endpoint in the map.
    pub fn list_endpoints(&self) -> Result<Vec<(Ipv4Addr, EndpointInfo)>, DatapathError> {
        let map = self.endpoints()?;
        let mut out = Vec::new();
        for item in map.iter() {
            let (k, v) = item.map_err(map_err(map_names::ENDPOINTS))?;
            out.push((Ipv4Addr::from(ipv4_from_key(k.addr)), v));
        }
        out.sort_by_key(|(ip, _)| *ip);
        Ok(out)
    }
}
