//! HOSTPORTS: hostPort translations.

use aya::maps::{HashMap, MapData, MapError};
use rivet_common::{HostPortKey, HostPortTarget, map_names};

use crate::datapath::maps::insert_err;
use crate::datapath::{Datapath, DatapathError, map_err};

impl Datapath {
    pub(in crate::datapath) fn hostports_mut(
        &mut self,
    ) -> Result<HashMap<&mut MapData, HostPortKey, HostPortTarget>, DatapathError> {
        let name = map_names::HOSTPORTS;
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or_else(|| map_err(name)(MapError::InvalidName { name: name.into() }))?;
        HashMap::try_from(map).map_err(map_err(name))
    }

    /// Inserts or replaces a hostPort.
    pub fn put_hostport(
        &mut self,
        key: HostPortKey,
        target: HostPortTarget,
    ) -> Result<(), DatapathError> {
        let done = self.hostports_mut()?.insert(key, target, 0);
        done.map_err(insert_err(&self.ebpf, map_names::HOSTPORTS))
    }

    /// Removes a hostPort; false if there was none.
    pub fn remove_hostport(&mut self, key: HostPortKey) -> Result<bool, DatapathError> {
        match self.hostports_mut()?.remove(&key) {
            Ok(()) => Ok(true),
            Err(MapError::KeyNotFound) => Ok(false),
            Err(e) => Err(map_err(map_names::HOSTPORTS)(e)),
        }
    }

    /// Every hostPort.
    pub fn list_hostports(&mut self) -> Result<Vec<(HostPortKey, HostPortTarget)>, DatapathError> {
        let map = self.hostports_mut()?;
        Ok(map.iter().filter_map(Result::ok).collect())
    }
}
