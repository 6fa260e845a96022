//! NAT: the connection table, read.

use aya::maps::{HashMap, MapData, MapError};
use rivet_common::{NatEntry, NatKey, map_names};

use crate::datapath::{Datapath, DatapathError, map_err};

impl Datapath {
    /// Every NAT entry (read through the pinned map; no lock on the table).
    pub fn nat_entries(&self) -> Result<Vec<(NatKey, NatEntry)>, DatapathError> {
        let name = map_names::NAT;
        let map = self
            .ebpf
            .map(name)
            .ok_or_else(|| map_err(name)(MapError::InvalidName { name: name.into() }))?;
        let hash: HashMap<&MapData, NatKey, NatEntry> =
            HashMap::try_from(map).map_err(map_err(name))?;
        Ok(hash.iter().filter_map(Result::ok).collect())
    }
}
