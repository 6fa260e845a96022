//! NetworkPolicy maps: `POLICY_PORTS` and `POLICY_PEERS` (LPM tries the
//! agent fills per policed pod), the isolation bits of endpoints
//! (`endpoint_flags::POLICY_INGRESS`/`POLICY_EGRESS`, kept here so every
//! endpoint write carries them) and `POLICY_FLOWS` (the datapath's).

use std::net::Ipv4Addr;

use aya::maps::{LpmTrie, MapData, MapError, lpm_trie::Key};
use rivet_common::{
    EndpointKey, FlowKey, FlowState, POLICY_PEER_KEY_FIXED_BITS, POLICY_PORT_KEY_FIXED_BITS,
    PolicyPeerKey, PolicyPortKey, endpoint_flags, ipv4_key, map_names,
};

use super::insert_err;
use crate::datapath::{Datapath, DatapathError, map_err};

/// One `POLICY_PORTS` entry: `bits` leading bits of `port` (0..=16) of
/// `proto` map to `class`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortEntry {
    /// The policed pod.
    pub pod: Ipv4Addr,
    /// `rivet_common::policy_dir`.
    pub dir: u8,
    /// IP protocol, or `rivet_common::POLICY_PROTO_OTHER`.
    pub proto: u8,
    /// First port of the prefix.
    pub port: u16,
    /// Significant bits of `port`.
    pub bits: u8,
}

/// One `POLICY_PEERS` entry: the peer prefix `addr/bits` allowed on `class`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerEntry {
    /// The policed pod.
    pub pod: Ipv4Addr,
    /// `rivet_common::policy_dir`.
    pub dir: u8,
    /// The port class.
    pub class: u16,
    /// The prefix's network address.
    pub addr: Ipv4Addr,
    /// Its length.
    pub bits: u8,
}

impl PortEntry {
    fn key(&self) -> Key<PolicyPortKey> {
        Key::new(
            POLICY_PORT_KEY_FIXED_BITS + u32::from(self.bits),
            PolicyPortKey {
                pod: ipv4_key(self.pod.octets()),
                dir: self.dir,
                proto: self.proto,
                port: self.port.to_be_bytes(),
            },
        )
    }
}

impl PeerEntry {
    fn key(&self) -> Key<PolicyPeerKey> {
        Key::new(
            POLICY_PEER_KEY_FIXED_BITS + u32::from(self.bits),
            PolicyPeerKey {
                pod: ipv4_key(self.pod.octets()),
                dir: self.dir,
                _pad: 0,
                class: self.class.to_be_bytes(),
                peer: ipv4_key(self.addr.octets()),
            },
        )
    }
}

/// The isolation bits the pinned `ENDPOINTS` entries carry (read at load:
/// a restarted agent keeps enforcing until its first policy sync).
pub(in crate::datapath) fn read_isolation(
    ebpf: &aya::Ebpf,
) -> Result<std::collections::HashMap<Ipv4Addr, u32>, DatapathError> {
    let name = map_names::ENDPOINTS;
    let map = ebpf
        .map(name)
        .ok_or_else(|| map_err(name)(MapError::InvalidName { name: name.into() }))?;
    let map: aya::maps::HashMap<&MapData, EndpointKey, rivet_common::EndpointInfo> =
        aya::maps::HashMap::try_from(map).map_err(map_err(name))?;
    let mask = endpoint_flags::POLICY_INGRESS | endpoint_flags::POLICY_EGRESS;
    Ok(map
        .iter()
        .filter_map(Result::ok)
        .filter(|(_, info)| info.flags & mask != 0)
        .map(|(k, info)| {
            (
                Ipv4Addr::from(rivet_common::ipv4_from_key(k.addr)),
                info.flags & mask,
            )
        })
        .collect())
}

impl Datapath {
    fn trie_mut<K: aya::Pod, V: aya::Pod>(
        &mut self,
        name: &'static str,
    ) -> Result<LpmTrie<&mut MapData, K, V>, DatapathError> {
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or_else(|| map_err(name)(MapError::InvalidName { name: name.into() }))?;
        LpmTrie::try_from(map).map_err(map_err(name))
    }

    /// Writes port-class entries (`class` values).
    pub fn put_policy_ports(&mut self, entries: &[(PortEntry, u16)]) -> Result<(), DatapathError> {
        let name = map_names::POLICY_PORTS;
        let failed = {
            let mut trie = self.trie_mut::<PolicyPortKey, u32>(name)?;
            entries
                .iter()
                .find_map(|(entry, class)| trie.insert(&entry.key(), u32::from(*class), 0).err())
        };
        failed.map_or(Ok(()), |e| Err(insert_err(&self.ebpf, name)(e)))
    }

    /// Removes port-class entries (absent ones are no error).
    pub fn remove_policy_ports(&mut self, entries: &[PortEntry]) -> Result<(), DatapathError> {
        let name = map_names::POLICY_PORTS;
        let mut trie = self.trie_mut::<PolicyPortKey, u32>(name)?;
        for entry in entries {
            match trie.remove(&entry.key()) {
                Ok(()) | Err(MapError::KeyNotFound) => {}
                Err(e) => return Err(map_err(name)(e)),
            }
        }
        Ok(())
    }

    /// Writes allowed-peer entries (values: the number of a policy that
    /// allows).
    pub fn put_policy_peers(&mut self, entries: &[(PeerEntry, u32)]) -> Result<(), DatapathError> {
        let name = map_names::POLICY_PEERS;
        // The trie is looked up once (by name) for all of them; the first
        // failure stops the writes.
        let failed = {
            let mut trie = self.trie_mut::<PolicyPeerKey, u32>(name)?;
            entries
                .iter()
                .find_map(|(entry, policy)| trie.insert(&entry.key(), *policy, 0).err())
        };
        failed.map_or(Ok(()), |e| Err(insert_err(&self.ebpf, name)(e)))
    }

    /// Removes allowed-peer entries (absent ones are no error).
    pub fn remove_policy_peers(&mut self, entries: &[PeerEntry]) -> Result<(), DatapathError> {
        let name = map_names::POLICY_PEERS;
        let mut trie = self.trie_mut::<PolicyPeerKey, u32>(name)?;
        for entry in entries {
            match trie.remove(&entry.key()) {
                Ok(()) | Err(MapError::KeyNotFound) => {}
                Err(e) => return Err(map_err(name)(e)),
            }
        }
        Ok(())
    }

    /// Every (pod, dir) that has entries in either policy trie: what a
    /// previous agent left (read at start, to remove what no policy wants).
    pub fn policy_entries(&mut self) -> Result<(Vec<PortEntry>, Vec<PeerEntry>), DatapathError> {
        let ports = self
            .trie_mut::<PolicyPortKey, u32>(map_names::POLICY_PORTS)?
            .keys()
            .filter_map(Result::ok)
            .map(|k| {
                let d = k.data();
                PortEntry {
                    pod: Ipv4Addr::from(rivet_common::ipv4_from_key(d.pod)),
                    dir: d.dir,
                    proto: d.proto,
                    port: u16::from_be_bytes(d.port),
                    bits: (k.prefix_len().saturating_sub(POLICY_PORT_KEY_FIXED_BITS)) as u8,
                }
            })
            .collect();
        let peers = self
            .trie_mut::<PolicyPeerKey, u32>(map_names::POLICY_PEERS)?
            .keys()
            .filter_map(Result::ok)
            .map(|k| {
                let d = k.data();
                PeerEntry {
                    pod: Ipv4Addr::from(rivet_common::ipv4_from_key(d.pod)),
                    dir: d.dir,
                    class: u16::from_be_bytes(d.class),
                    addr: Ipv4Addr::from(rivet_common::ipv4_from_key(d.peer)),
                    bits: (k.prefix_len().saturating_sub(POLICY_PEER_KEY_FIXED_BITS)) as u8,
                }
            })
            .collect();
        Ok((ports, peers))
    }

    /// `flags` with the isolation bits the policies give `ip`.
    pub(in crate::datapath) fn with_policy_flags(&self, ip: Ipv4Addr, flags: u32) -> u32 {
        let mask = endpoint_flags::POLICY_INGRESS | endpoint_flags::POLICY_EGRESS;
        (flags & !mask) | self.policy_isolation.get(&ip).copied().unwrap_or(0)
    }

    /// Sets the isolation bits of the local pod `ip` (0: not isolated). The
    /// endpoint entry, if there is one, is rewritten now; one written later
    /// by [`Datapath::put_endpoint`] carries them too.
    pub fn set_policy_isolation(&mut self, ip: Ipv4Addr, bits: u32) -> Result<(), DatapathError> {
        let bits = bits & (endpoint_flags::POLICY_INGRESS | endpoint_flags::POLICY_EGRESS);
        let before = self.policy_isolation.get(&ip).copied().unwrap_or(0);
        if bits == 0 {
            self.policy_isolation.remove(&ip);
        } else {
            self.policy_isolation.insert(ip, bits);
        }
        if before == bits {
            return Ok(());
        }
        let key = EndpointKey {
            addr: ipv4_key(ip.octets()),
        };
        let current = self.endpoints()?.get(&key, 0);
        match current {
            Ok(info) => self.put_endpoint(ip, info),
            Err(MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(map_err(map_names::ENDPOINTS)(e)),
        }
    }

    /// The flows in `POLICY_FLOWS` (for status and tests).
    pub fn policy_flows(&mut self) -> Result<Vec<(FlowKey, FlowState)>, DatapathError> {
        let name = map_names::POLICY_FLOWS;
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or_else(|| map_err(name)(MapError::InvalidName { name: name.into() }))?;
        let map: aya::maps::HashMap<&mut MapData, FlowKey, FlowState> =
            aya::maps::HashMap::try_from(map).map_err(map_err(name))?;
        Ok(map.iter().filter_map(Result::ok).collect())
    }
}
