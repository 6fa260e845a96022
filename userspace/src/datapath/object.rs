//! The eBPF object: the one built into this binary, its build stamp and hash,
//! and the check that an object (and the pinned maps) have the map layouts of
//! this build.
//!
//! `userspace/build.rs` calls `aya_build::build_ebpf` on `ebpf/` and the object
//! is embedded with `include_bytes_aligned!` ([`OBJECT`]). With
//! `AYA_BUILD_SKIP=1` an empty object is written; the agent then refuses to
//! start with a message saying so.
//!
//! Upgrading the datapath: every start loads the programs afresh and swaps them
//! into the running hooks (`bpf_link_update` for TCX links, `tc filter replace`
//! for pod veths in tc mode), so an upgrade is a restart with other programs.
//! They come from the embedded object or, with `--ebpf-object PATH`
//! (`ebpf_object`), from a file: a rebuilt datapath (a hotfix) without a new
//! `rivetd`. The object's map definitions (type, key and value size, parsed
//! with `aya-obj` before anything is created) must equal the layouts this build
//! expects, else the agent refuses to start with `the eBPF object … defines map
//! … as …; this rivet expects …` and touches nothing — its programs would
//! otherwise read the pinned maps with another layout. Pinned maps whose type
//! or key/value sizes differ are refused the same way on every start (never
//! silently reused); matching pins are reused, so entries survive.
//!
//! The build stamp: `ebpf/src/stamp.rs` puts `rivet-ebpf-stamp:<value>` in
//! `.rodata` (an exported `#[used]` static no program reads, so no instruction
//! changes), the value being `RIVET_EBPF_STAMP` at build time, else the crate
//! version. The agent finds it by scanning the object's bytes and reports it
//! with an FNV-1a hash of the bytes in its start log (`datapath object loaded`)
//! and in `rivetctl status` (`AgentStatus.ebpf`, a field older clients ignore).
//! `tests/upgrade.rs` builds a second object from the same source with another
//! stamp (other bytes, same instructions: equal program tags) and restarts an
//! agent onto it and back under four paced TCP streams in each mode; an object
//! whose ENDPOINTS value size was changed is refused while the old programs
//! keep forwarding.

use aya::{
    maps::{MapData, MapType},
    programs::ProgramError,
};
use rivet_common::{
    EndpointInfo, EndpointKey, EndpointSlot, HostPortKey, HostPortTarget, NatConfig, NatEntry,
    NatKey, NatLimits, NatPodKey, NodeConfig, PeerInfo, RouteInfo, SockConfig, SockRevKey,
    SockRevTarget, StatsEntry, map_names,
};

use crate::datapath::pins::PinLayout;
use crate::datapath::{DatapathError, map_err};

/// Runs `load` (a program's `BPF_PROG_LOAD`) again while the kernel
/// answers EAGAIN: the verifier gives up with EAGAIN when a signal is
/// pending on the loading thread, and `from_pod` takes long enough to
/// verify (≈ 380k instructions) for that to happen on a busy machine.
pub fn load_verified(
    mut load: impl FnMut() -> Result<(), ProgramError>,
) -> Result<(), ProgramError> {
    let mut tries = 0;
    loop {
        match load() {
            Err(ProgramError::LoadError { io_error, .. })
                if io_error.raw_os_error() == Some(libc::EAGAIN) && tries < 4 =>
            {
                tries += 1;
                tracing::debug!(tries, "program verification interrupted (EAGAIN): again");
            }
            other => return other,
        }
    }
}

/// The eBPF object built by `build.rs` from `ebpf/`.
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/rivet"));

/// What precedes the build stamp in an object (`ebpf/src/stamp.rs`).
pub(in crate::datapath) const STAMP_MAGIC: &[u8] = b"rivet-ebpf-stamp:";

/// The build stamp of an eBPF object (`RIVET_EBPF_STAMP` when it was
/// built, else the crate version), if it carries one.
pub fn object_stamp(object: &[u8]) -> Option<String> {
    let at = object
        .windows(STAMP_MAGIC.len())
        .position(|w| w == STAMP_MAGIC)?;
    let rest = object.get(at + STAMP_MAGIC.len()..)?;
    let value = &rest[..rest.iter().position(|&b| b == 0)?.min(64)];
    Some(String::from_utf8_lossy(value).into_owned())
}

/// A short hash of an object's bytes (FNV-1a, 64 bit, hex): tells two
/// builds apart even when their stamps are the same.
pub fn object_hash(object: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in object {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// The object a datapath was loaded from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// `embedded` or the file's path.
    pub source: String,
    /// Its build stamp, if it carries one.
    pub stamp: Option<String>,
    /// [`object_hash`] of its bytes.
    pub hash: String,
    /// Its size in bytes.
    pub size: usize,
}

impl ObjectInfo {
    pub(in crate::datapath) fn of(source: String, bytes: &[u8]) -> Self {
        Self {
            source,
            stamp: object_stamp(bytes),
            hash: object_hash(bytes),
            size: bytes.len(),
        }
    }
}

/// What the object defines for each pinned map: (name, type, key size, value size).
pub(in crate::datapath) const MAP_LAYOUTS: [(&str, MapType, usize, usize); 18] = [
    (
        map_names::ENDPOINT_SLOTS,
        MapType::Array,
        size_of::<u32>(),
        size_of::<EndpointSlot>(),
    ),
    (
        map_names::SOCK_CONFIG,
        MapType::Array,
        size_of::<u32>(),
        size_of::<SockConfig>(),
    ),
    (
        map_names::SOCK_REVNAT,
        MapType::LruHash,
        size_of::<SockRevKey>(),
        size_of::<SockRevTarget>(),
    ),
    (
        map_names::NAT_STATS,
        MapType::PerCpuArray,
        size_of::<u32>(),
        size_of::<u64>(),
    ),
    (
        map_names::HOSTPORTS,
        MapType::Hash,
        size_of::<HostPortKey>(),
        size_of::<HostPortTarget>(),
    ),
    (
        map_names::NAT,
        MapType::LruHash,
        size_of::<NatKey>(),
        size_of::<NatEntry>(),
    ),
    (
        map_names::NAT_CONFIG,
        MapType::Array,
        size_of::<u32>(),
        size_of::<NatConfig>(),
    ),
    (
        map_names::NAT_PODS,
        MapType::LruHash,
        size_of::<NatPodKey>(),
        size_of::<u64>(),
    ),
    (
        map_names::NAT_LIMITS,
        MapType::Array,
        size_of::<u32>(),
        size_of::<NatLimits>(),
    ),
    (
        map_names::TUNABLES,
        MapType::Array,
        size_of::<u32>(),
        size_of::<u64>(),
    ),
    (
        map_names::FRAG_BUDGET,
        MapType::LruHash,
        size_of::<EndpointKey>(),
        size_of::<u64>(),
    ),
    (
        map_names::NO_MASQ,
        MapType::LpmTrie,
        size_of::<u32>() + size_of::<u32>(),
        size_of::<u32>(),
    ),
    (
        map_names::ROUTES,
        MapType::LpmTrie,
        size_of::<u32>() + size_of::<u32>(),
        size_of::<RouteInfo>(),
    ),
    (
        map_names::PEERS,
        MapType::Hash,
        size_of::<EndpointKey>(),
        size_of::<PeerInfo>(),
    ),
    (
        map_names::ENDPOINTS,
        MapType::Hash,
        size_of::<EndpointKey>(),
        size_of::<EndpointInfo>(),
    ),
    (
        map_names::LOCAL_ADDRS,
        MapType::Hash,
        size_of::<EndpointKey>(),
        size_of::<u32>(),
    ),
    (
        map_names::CONFIG,
        MapType::Array,
        size_of::<u32>(),
        size_of::<NodeConfig>(),
    ),
    (
        map_names::STATS,
        MapType::PerCpuArray,
        size_of::<u32>(),
        size_of::<StatsEntry>(),
    ),
];

/// Refuses pinned maps whose type or sizes differ from this build's.
pub(in crate::datapath) fn check_pinned_maps(layout: &PinLayout) -> Result<(), DatapathError> {
    for (name, map_type, key, value) in MAP_LAYOUTS {
        let path = layout.map(name);
        if !path.exists() {
            continue;
        }
        let data = MapData::from_pin(&path).map_err(map_err(name))?;
        let info = data.info().map_err(map_err(name))?;
        let found_type = info.map_type().map_err(map_err(name))?;
        let found = (
            found_type,
            info.key_size() as usize,
            info.value_size() as usize,
        );
        if found != (map_type, key, value) {
            return Err(DatapathError::IncompatibleMap {
                path,
                found: format!("{:?}, key {} B, value {} B", found.0, found.1, found.2),
                expected: format!("{map_type:?}, key {key} B, value {value} B"),
            });
        }
    }
    Ok(())
}

/// Refuses an object whose maps differ from this build's (type, key and
/// value sizes): its programs would read the pinned maps with another
/// layout.
pub(in crate::datapath) fn check_object_maps(
    object: &[u8],
    source: &str,
) -> Result<(), DatapathError> {
    let obj = aya_obj::Object::parse(object)
        .map_err(|e| DatapathError::Load(Box::new(aya::EbpfError::from(e))))?;
    for (name, map_type, key, value) in MAP_LAYOUTS {
        let Some(def) = obj.maps.get(name) else {
            return Err(DatapathError::ObjectMapLayout {
                object: source.to_owned(),
                map: name,
                found: "missing".to_owned(),
                expected: format!("{map_type:?}, key {key} B, value {value} B"),
            });
        };
        let found = (
            def.map_type(),
            def.key_size() as usize,
            def.value_size() as usize,
        );
        if found != (map_type as u32, key, value) {
            return Err(DatapathError::ObjectMapLayout {
                object: source.to_owned(),
                map: name,
                found: format!(
                    "{}, key {} B, value {} B",
                    MAP_LAYOUTS
                        .iter()
                        .find(|l| l.1 as u32 == found.0)
                        .map_or_else(|| format!("map type {}", found.0), |l| format!("{:?}", l.1)),
                    found.1,
                    found.2
                ),
                expected: format!("{map_type:?}, key {key} B, value {value} B"),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(in crate::datapath) fn the_stamp_is_found_and_the_hash_tells_objects_apart() {
        let mut obj = b"\x7fELF....rivet-ebpf-stamp:hotfix-1\0\0\0....".to_vec();
        assert_eq!(object_stamp(&obj).as_deref(), Some("hotfix-1"));
        let h = object_hash(&obj);
        assert_eq!(h.len(), 16);
        obj[2] ^= 1;
        assert_ne!(object_hash(&obj), h);
        assert_eq!(object_stamp(b"no stamp here"), None);
        // Without its NUL the value is not trusted.
        assert_eq!(object_stamp(b"rivet-ebpf-stamp:abc"), None);
        if !OBJECT.is_empty() {
            assert!(
                object_stamp(OBJECT).is_some(),
                "the embedded object is stamped"
            );
        }
    }
}
