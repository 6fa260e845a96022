//! The node's settings: CONFIG, NAT_CONFIG, NAT_LIMITS, TUNABLES,
//! NO_MASQUERADE, LOCAL_ADDRS.

use std::net::Ipv4Addr;

use aya::maps::{Array, HashMap, LpmTrie, MapData, MapError, lpm_trie::Key};
use ipnet::Ipv4Net;
use rivet_common::{EndpointKey, NatConfig, NatLimits, NodeConfig, ipv4_key, map_names};

use crate::datapath::{Datapath, DatapathError, map_err, random_u32};

impl Datapath {
    /// Writes the node configuration.
    pub fn write_config(&mut self, config: NodeConfig) -> Result<(), DatapathError> {
        let name = map_names::CONFIG;
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or_else(|| map_err(name)(MapError::InvalidName { name: name.into() }))?;
        let mut array: Array<&mut MapData, NodeConfig> =
            Array::try_from(map).map_err(map_err(name))?;
        array.set(0, config, 0).map_err(map_err(name))
    }

    /// Writes the masquerade settings. The timestamp base a previous run
    /// chose (pinned map) is kept: flows already translated depend on it;
    /// the first run draws one at random.
    pub fn write_nat_config(&mut self, mut config: NatConfig) -> Result<(), DatapathError> {
        let name = map_names::NAT_CONFIG;
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or_else(|| map_err(name)(MapError::InvalidName { name: name.into() }))?;
        let mut array: Array<&mut MapData, NatConfig> =
            Array::try_from(map).map_err(map_err(name))?;
        let previous = array.get(&0, 0).map_err(map_err(name))?.ts_base;
        config.ts_base = if previous != 0 {
            previous
        } else {
            random_u32() | 1
        };
        array.set(0, config, 0).map_err(map_err(name))
    }

    /// Writes the NAT limits (the per-pod quota).
    pub fn write_nat_limits(&mut self, limits: NatLimits) -> Result<(), DatapathError> {
        let name = map_names::NAT_LIMITS;
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or_else(|| map_err(name)(MapError::InvalidName { name: name.into() }))?;
        let mut array: Array<&mut MapData, NatLimits> =
            Array::try_from(map).map_err(map_err(name))?;
        array.set(0, limits, 0).map_err(map_err(name))
    }

    /// Writes numeric settings into `TUNABLES`: (`rivet_common::tunable`
    /// index, value).
    pub fn write_tunables(&mut self, values: &[(u32, u64)]) -> Result<(), DatapathError> {
        let name = map_names::TUNABLES;
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or_else(|| map_err(name)(MapError::InvalidName { name: name.into() }))?;
        let mut array: Array<&mut MapData, u64> = Array::try_from(map).map_err(map_err(name))?;
        for &(index, value) in values {
            array.set(index, value, 0).map_err(map_err(name))?;
        }
        Ok(())
    }

    /// Replaces the set of destinations that are never masqueraded.
    pub fn set_no_masquerade(&mut self, nets: &[Ipv4Net]) -> Result<(), DatapathError> {
        let name = map_names::NO_MASQ;
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or_else(|| map_err(name)(MapError::InvalidName { name: name.into() }))?;
        let mut trie: LpmTrie<&mut MapData, u32, u32> =
            LpmTrie::try_from(map).map_err(map_err(name))?;
        let wanted: Vec<Key<u32>> = nets
            .iter()
            .map(|n| Key::new(u32::from(n.prefix_len()), ipv4_key(n.network().octets())))
            .collect();
        let present: Vec<Key<u32>> = trie.keys().filter_map(Result::ok).collect();
        let same =
            |a: &Key<u32>, b: &Key<u32>| a.prefix_len() == b.prefix_len() && a.data() == b.data();
        for key in present
            .iter()
            .filter(|k| !wanted.iter().any(|w| same(w, k)))
        {
            match trie.remove(key) {
                Ok(()) | Err(MapError::KeyNotFound) => {}
                Err(e) => return Err(map_err(name)(e)),
            }
        }
        for key in &wanted {
            trie.insert(key, 1, 0).map_err(map_err(name))?;
        }
        Ok(())
    }

    /// Replaces the set of node-local addresses.
    pub fn set_local_addrs(&mut self, addrs: &[Ipv4Addr]) -> Result<(), DatapathError> {
        let name = map_names::LOCAL_ADDRS;
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or_else(|| map_err(name)(MapError::InvalidName { name: name.into() }))?;
        let mut hash: HashMap<&mut MapData, EndpointKey, u32> =
            HashMap::try_from(map).map_err(map_err(name))?;
        let wanted: Vec<EndpointKey> = addrs
            .iter()
            .map(|a| EndpointKey {
                addr: ipv4_key(a.octets()),
            })
            .collect();
        let present: Vec<EndpointKey> = hash.keys().filter_map(Result::ok).collect();
        for key in present.iter().filter(|k| !wanted.contains(k)) {
            match hash.remove(key) {
                Ok(()) | Err(MapError::KeyNotFound) => {}
                Err(e) => return Err(map_err(name)(e)),
            }
        }
        for key in wanted.iter().filter(|k| !present.contains(k)) {
            hash.insert(key, 1, 0).map_err(map_err(name))?;
        }
        Ok(())
    }
}
