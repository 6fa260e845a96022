//! ROUTES and PEERS: the other nodes.

use std::net::Ipv4Addr;

use aya::maps::{HashMap, LpmTrie, MapData, MapError, lpm_trie::Key};
use ipnet::Ipv4Net;
use rivet_common::{EndpointKey, PeerInfo, RouteInfo, ipv4_from_key, ipv4_key, map_names};

use crate::datapath::maps::insert_err;
use crate::datapath::{Datapath, DatapathError, map_err};

impl Datapath {
    pub(in crate::datapath) fn routes_mut(
        &mut self,
    ) -> Result<LpmTrie<&mut MapData, u32, RouteInfo>, DatapathError> {
        let name = map_names::ROUTES;
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or_else(|| map_err(name)(MapError::InvalidName { name: name.into() }))?;
        LpmTrie::try_from(map).map_err(map_err(name))
    }

    /// Inserts or replaces the route for a remote pod subnet.
    pub fn put_route(&mut self, subnet: Ipv4Net, info: RouteInfo) -> Result<(), DatapathError> {
        let key = Key::new(
            u32::from(subnet.prefix_len()),
            ipv4_key(subnet.network().octets()),
        );
        let done = self.routes_mut()?.insert(&key, info, 0);
        done.map_err(insert_err(&self.ebpf, map_names::ROUTES))
    }

    /// Removes the route for `subnet`; false if there was none.
    pub fn remove_route(&mut self, subnet: Ipv4Net) -> Result<bool, DatapathError> {
        let key = Key::new(
            u32::from(subnet.prefix_len()),
            ipv4_key(subnet.network().octets()),
        );
        match self.routes_mut()?.remove(&key) {
            Ok(()) => Ok(true),
            Err(MapError::KeyNotFound) => Ok(false),
            Err(e) => Err(map_err(map_names::ROUTES)(e)),
        }
    }

    /// Every route.
    pub fn list_routes(&self) -> Result<Vec<(Ipv4Net, RouteInfo)>, DatapathError> {
        let name = map_names::ROUTES;
        let map = self
            .ebpf
            .map(name)
            .ok_or_else(|| map_err(name)(MapError::InvalidName { name: name.into() }))?;
        let trie: LpmTrie<&MapData, u32, RouteInfo> =
            LpmTrie::try_from(map).map_err(map_err(name))?;
        let mut out = Vec::new();
        for item in trie.iter() {
            let (k, v) = item.map_err(map_err(name))?;
            let net = Ipv4Net::new(
                std::net::Ipv4Addr::from(ipv4_from_key(k.data())),
                k.prefix_len() as u8,
            )
            .map_err(|_| map_err(name)(MapError::KeyNotFound))?;
            out.push((net, v));
        }
        out.sort_by_key(|(n, _)| *n);
        Ok(out)
    }

    pub(in crate::datapath) fn peers_mut(
        &mut self,
    ) -> Result<HashMap<&mut MapData, EndpointKey, PeerInfo>, DatapathError> {
        let name = map_names::PEERS;
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or_else(|| map_err(name)(MapError::InvalidName { name: name.into() }))?;
        HashMap::try_from(map).map_err(map_err(name))
    }

    /// Inserts or replaces a peer node.
    pub fn put_peer(&mut self, node_ip: Ipv4Addr, info: PeerInfo) -> Result<(), DatapathError> {
        let key = EndpointKey {
            addr: ipv4_key(node_ip.octets()),
        };
        let done = self.peers_mut()?.insert(key, info, 0);
        done.map_err(insert_err(&self.ebpf, map_names::PEERS))
    }

    /// Removes a peer node; false if it was not there.
    pub fn remove_peer(&mut self, node_ip: Ipv4Addr) -> Result<bool, DatapathError> {
        let key = EndpointKey {
            addr: ipv4_key(node_ip.octets()),
        };
        match self.peers_mut()?.remove(&key) {
            Ok(()) => Ok(true),
            Err(MapError::KeyNotFound) => Ok(false),
            Err(e) => Err(map_err(map_names::PEERS)(e)),
        }
    }

    /// Every peer node.
    pub fn list_peers(&self) -> Result<Vec<(Ipv4Addr, PeerInfo)>, DatapathError> {
        let name = map_names::PEERS;
        let map = self
            .ebpf
            .map(name)
            .ok_or_else(|| map_err(name)(MapError::InvalidName { name: name.into() }))?;
        let hash: HashMap<&MapData, EndpointKey, PeerInfo> =
            HashMap::try_from(map).map_err(map_err(name))?;
        let mut out = Vec::new();
        for item in hash.iter() {
            let (k, v) = item.map_err(map_err(name))?;
            out.push((Ipv4Addr::from(ipv4_from_key(k.addr)), v));
        }
        out.sort_by_key(|(ip, _)| *ip);
        Ok(out)
    }
}
