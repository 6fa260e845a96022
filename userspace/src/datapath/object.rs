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
//! expects (`rivet_common::MAPS`: every map, one declaration), else the agent refuses to start with `the eBPF object … defines map
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

use aya::{maps::MapData, programs::ProgramError};
use rivet_common::{MAPS, MapKind, MapSpec};

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

/// A map type as the messages show it: its [`MapKind`], else the kernel's number.
fn kind_text(raw: u32) -> String {
    MapKind::from_raw(raw).map_or_else(|| format!("map type {raw}"), |k| format!("{k:?}"))
}

/// (type, key size, value size) as the messages show them.
fn layout_text((kind, key, value): (u32, usize, usize)) -> String {
    format!("{}, key {key} B, value {value} B", kind_text(kind))
}

/// What this build defines for a map: (type, key size, value size).
fn expected_layout(spec: &MapSpec) -> (u32, usize, usize) {
    (spec.kind as u32, spec.key_size, spec.value_size)
}

/// Refuses pinned maps whose type or sizes differ from this build's
/// (every map of [`MAPS`] that is pinned).
pub(in crate::datapath) fn check_pinned_maps(layout: &PinLayout) -> Result<(), DatapathError> {
    for spec in &MAPS {
        let name = spec.name;
        let path = layout.map(name);
        if !path.exists() {
            continue;
        }
        let data = MapData::from_pin(&path).map_err(map_err(name))?;
        let info = data.info().map_err(map_err(name))?;
        let found_type = info.map_type().map_err(map_err(name))?;
        let found = (
            found_type as u32,
            info.key_size() as usize,
            info.value_size() as usize,
        );
        let expected = expected_layout(spec);
        if found != expected {
            return Err(DatapathError::IncompatibleMap {
                path,
                found: layout_text(found),
                expected: layout_text(expected),
            });
        }
    }
    Ok(())
}

/// Refuses an object whose maps differ from this build's (type, key and
/// value sizes, every map of [`MAPS`]): its programs would read the pinned
/// maps with another layout.
pub(in crate::datapath) fn check_object_maps(
    object: &[u8],
    source: &str,
) -> Result<(), DatapathError> {
    let obj = aya_obj::Object::parse(object)
        .map_err(|e| DatapathError::Load(Box::new(aya::EbpfError::from(e))))?;
    for spec in &MAPS {
        let expected = expected_layout(spec);
        let found = obj.maps.get(spec.name).map(|def| {
            (
                def.map_type(),
                def.key_size() as usize,
                def.value_size() as usize,
            )
        });
        if found != Some(expected) {
            return Err(DatapathError::ObjectMapLayout {
                object: source.to_owned(),
                map: spec.name,
                found: found.map_or_else(|| "missing".to_owned(), layout_text),
                expected: layout_text(expected),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Maps an object holds that are not pinned: global data (`.rodata`,
    /// `.data`, `.bss` sections), created afresh at every load.
    fn is_global_data(name: &str) -> bool {
        name.starts_with('.')
    }

    #[test]
    fn every_map_of_the_object_is_declared_pinned_and_layout_checked() {
        if OBJECT.is_empty() {
            eprintln!("built with AYA_BUILD_SKIP=1: no object to compare");
            return;
        }
        let obj = aya_obj::Object::parse(OBJECT).expect("the embedded object parses");
        let mut names: Vec<&str> = obj
            .maps
            .keys()
            .map(String::as_str)
            .filter(|n| !is_global_data(n))
            .collect();
        names.sort_unstable();
        let mut declared: Vec<&str> = MAPS.iter().map(|m| m.name).collect();
        declared.sort_unstable();
        assert_eq!(
            names, declared,
            "the object's maps and rivet_common::MAPS differ: declare every map there"
        );
        for (name, def) in &obj.maps {
            if is_global_data(name) {
                continue;
            }
            let spec = rivet_common::map_spec(name).expect("declared");
            assert_eq!(
                (
                    def.map_type(),
                    def.key_size() as usize,
                    def.value_size() as usize
                ),
                expected_layout(spec),
                "{name}"
            );
            assert_eq!(def.max_entries(), spec.max_entries, "{name}");
        }
        // What the loader pins, and what both layout checks cover.
        assert_eq!(
            rivet_common::map_names::ALL.to_vec(),
            MAPS.iter().map(|m| m.name).collect::<Vec<_>>()
        );
        check_object_maps(OBJECT, "embedded").expect("the embedded object has this build's maps");
    }

    #[test]
    fn the_tables_written_per_connection_keep_an_lru_list_per_cpu() {
        if OBJECT.is_empty() {
            eprintln!("built with AYA_BUILD_SKIP=1: no object to compare");
            return;
        }
        // The kernel's BPF_F_NO_COMMON_LRU (linux/bpf.h).
        const NO_COMMON_LRU: u32 = 1 << 1;
        let obj = aya_obj::Object::parse(OBJECT).expect("the embedded object parses");
        for (name, def) in &obj.maps {
            let per_cpu = def.map_flags() & NO_COMMON_LRU != 0;
            let expected = [
                rivet_common::map_names::NAT,
                rivet_common::map_names::POLICY_FLOWS,
            ]
            .contains(&name.as_str());
            assert_eq!(per_cpu, expected, "{name}: flags {:#x}", def.map_flags());
        }
    }

    #[test]
    fn layouts_read_as_the_kernel_types() {
        assert_eq!(
            layout_text((MapKind::LruHash as u32, 16, 24)),
            "LruHash, key 16 B, value 24 B"
        );
        assert_eq!(layout_text((99, 4, 4)), "map type 99, key 4 B, value 4 B");
        use aya::maps::MapType;
        // The kernel's numbers, as aya has them.
        for (kind, aya_type) in [
            (MapKind::Hash, MapType::Hash),
            (MapKind::Array, MapType::Array),
            (MapKind::PerCpuArray, MapType::PerCpuArray),
            (MapKind::LruHash, MapType::LruHash),
            (MapKind::LpmTrie, MapType::LpmTrie),
            (MapKind::RingBuf, MapType::RingBuf),
        ] {
            assert_eq!(kind as u32, aya_type as u32, "{kind:?}");
            assert_eq!(format!("{kind:?}"), format!("{aya_type:?}"));
        }
    }

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
