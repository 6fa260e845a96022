//! The kernel side seen from userspace: loading the embedded object with its
//! maps pinned, attaching programs through pinned TCX links, and typed access
//! to every map.
//!
//! Restart semantics: maps are reopened from their pins (never recreated),
//! programs are loaded afresh and swapped into the existing pinned links with
//! `bpf_link_update` (atomic: there is no instant without a program).

pub mod pins;
pub mod sockhooks;

use std::{
    net::Ipv4Addr,
    os::fd::{AsFd as _, AsRawFd as _},
    path::PathBuf,
};

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{Array, HashMap, LpmTrie, MapData, MapError, MapType, PerCpuArray, lpm_trie::Key},
    programs::{
        LinkOrder, ProgramError, SchedClassifier, TcAttachType,
        links::{FdLink, LinkError, PinnedLink},
        tc::{NlOptions, SchedClassifierLink, TcAttachOptions, TcError, TcHandle},
    },
};
use ipnet::Ipv4Net;
use rivet_common::{
    COUNTERS_MAX, Counter, ENDPOINT_SLOTS_MAX, EndpointInfo, EndpointKey, EndpointSlot,
    HostPortKey, HostPortTarget, NatConfig, NatEntry, NatKey, NatLimits, NatPodKey, NodeConfig,
    PeerInfo, RouteInfo, SockConfig, SockRevKey, SockRevTarget, StatsEntry, ipv4_from_key,
    ipv4_key, map_names, program_names,
};

use self::pins::{Hook, PinError, PinLayout, remove_file_if_exists};
// Chosen by the configuration, used here.
pub use crate::config::{AttachMode, ObjectSource};
use crate::{config::MapLimits, netlink::batch::BpfFilter};

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

/// The address in every `ENDPOINT_SLOTS` slot, by index.
fn read_slot_holders(ebpf: &Ebpf) -> Result<Vec<u32>, DatapathError> {
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
const EMPTY_SLOT: EndpointSlot = EndpointSlot {
    addr: 0,
    info: EndpointInfo {
        ifindex: 0,
        flags: 0,
        mac: [0; 6],
        host_mac: [0; 6],
    },
};

/// The eBPF object built by `build.rs` from `ebpf/`.
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/rivet"));

/// What precedes the build stamp in an object (`ebpf/src/stamp.rs`).
const STAMP_MAGIC: &[u8] = b"rivet-ebpf-stamp:";

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
    fn of(source: String, bytes: &[u8]) -> Self {
        Self {
            source,
            stamp: object_stamp(bytes),
            hash: object_hash(bytes),
            size: bytes.len(),
        }
    }
}

/// Datapath errors; each names the map, program, interface or pin involved.
#[derive(Debug, thiserror::Error)]
pub enum DatapathError {
    /// The binary was built without the eBPF toolchain.
    #[error("the embedded eBPF object is empty: this binary was built with AYA_BUILD_SKIP=1")]
    EmptyObject,
    /// The object could not be loaded.
    #[error("loading the eBPF object: {0}")]
    Load(Box<aya::EbpfError>),
    /// A map operation failed.
    #[error("map {name}: {source}")]
    Map {
        /// Map name.
        name: &'static str,
        /// Cause.
        source: Box<MapError>,
    },
    /// A program operation failed.
    #[error("program {name}: {source}")]
    Program {
        /// Program name.
        name: String,
        /// Cause.
        source: Box<ProgramError>,
    },
    /// The object file could not be read.
    #[error("reading the eBPF object {path}: {source}")]
    ObjectFile {
        /// Its path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The object defines a map differently from this build of rivetd.
    #[error(
        "the eBPF object {object} defines map {map} as {found}; this rivet expects {expected}. \
         Refusing to load it: an object must come from the same map layouts as rivetd \
         (a changed layout needs a new rivetd and `rivetd unload`)"
    )]
    ObjectMapLayout {
        /// The object's source.
        object: String,
        /// Map name.
        map: &'static str,
        /// What the object defines.
        found: String,
        /// What this build expects.
        expected: String,
    },
    /// A pinned map does not have the layout this build expects.
    #[error(
        "pinned map {path} has an incompatible layout ({found}); this rivet expects {expected}. \
         Refusing to reuse it: run `rivetd unload` (drops the node's datapath state) to start over"
    )]
    IncompatibleMap {
        /// Pin path.
        path: PathBuf,
        /// What is pinned.
        found: String,
        /// What the object defines.
        expected: String,
    },
    /// Attaching failed.
    #[error("attaching {program} to {interface} ({hook}): {source}")]
    Attach {
        /// Program name.
        program: String,
        /// Interface.
        interface: String,
        /// Hook.
        hook: &'static str,
        /// Cause.
        source: Box<ProgramError>,
    },
    /// A link pin could not be used.
    #[error("link pin {path}: {source}")]
    Link {
        /// Pin path.
        path: PathBuf,
        /// Cause.
        source: Box<LinkError>,
    },
    /// Pinning failed.
    #[error("pinning {path}: {source}")]
    PinObject {
        /// Pin path.
        path: PathBuf,
        /// Cause.
        source: Box<aya::pin::PinError>,
    },
    /// Pin directory problem.
    #[error(transparent)]
    Pins(#[from] PinError),
    /// A map refused a new entry because it is full.
    #[error(
        "map {name} is full ({capacity} entries): entry refused; raise `{key}` in the agent's \
         configuration (takes effect after `rivetd unload`)"
    )]
    MapFull {
        /// Map name.
        name: &'static str,
        /// Its capacity.
        capacity: u32,
        /// The configuration key that sizes it.
        key: &'static str,
    },
}

/// The maps the agent fills, with the configuration key sizing each.
pub const SIZED_MAPS: [(&str, &str); 5] = [
    (map_names::ENDPOINTS, "max_endpoints"),
    (map_names::ROUTES, "max_routes"),
    (map_names::PEERS, "max_routes"),
    (map_names::HOSTPORTS, "max_hostports"),
    (map_names::NAT, "nat_max_entries"),
];

/// Entries refused because their map was full, per [`SIZED_MAPS`] slot,
/// since the agent started (the NAT table's own pressure is counted by the
/// datapath: evictions).
static MAP_FULL: [std::sync::atomic::AtomicU64; 5] =
    [const { std::sync::atomic::AtomicU64::new(0) }; 5];

/// (map, entries refused because it was full) for every sized map.
pub fn map_full_counts() -> Vec<(&'static str, u64)> {
    SIZED_MAPS
        .iter()
        .zip(&MAP_FULL)
        .map(|((name, _), n)| (*name, n.load(std::sync::atomic::Ordering::Relaxed)))
        .collect()
}

/// An insert's error: a full map (E2BIG from hash maps, ENOSPC from LPM
/// tries) becomes [`DatapathError::MapFull`] and is counted.
fn insert_err<'a>(
    ebpf: &'a Ebpf,
    name: &'static str,
) -> impl FnOnce(MapError) -> DatapathError + 'a {
    move |source| {
        let full = matches!(
            &source,
            MapError::SyscallError(e)
                if matches!(e.io_error.raw_os_error(), Some(libc::E2BIG | libc::ENOSPC))
        );
        let slot = SIZED_MAPS.iter().position(|(n, _)| *n == name);
        match (full, slot) {
            (true, Some(i)) => {
                MAP_FULL[i].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let capacity = ebpf
                    .map(name)
                    .and_then(|m| match m {
                        aya::maps::Map::HashMap(d)
                        | aya::maps::Map::LruHashMap(d)
                        | aya::maps::Map::LpmTrie(d) => d.info().ok(),
                        _ => None,
                    })
                    .map_or(0, |i| i.max_entries());
                DatapathError::MapFull {
                    name,
                    capacity,
                    key: SIZED_MAPS[i].1,
                }
            }
            _ => map_err(name)(source),
        }
    }
}

/// What the object defines for each pinned map: (name, type, key size, value size).
const MAP_LAYOUTS: [(&str, MapType, usize, usize); 18] = [
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

/// Priority of rivet's `cls_bpf` filters (first: nothing runs before it).
pub const TC_PRIORITY: u16 = 1;
/// Handle of rivet's `cls_bpf` filters.
pub const TC_HANDLE: TcHandle = TcHandle::new(0, 1);

/// Every program of the object and where it attaches.
pub const PROGRAMS: [&str; 3] = [
    program_names::FROM_POD,
    program_names::FROM_UPLINK,
    program_names::FROM_HOST,
];

/// A program attached through a pinned link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkState {
    /// Interface name.
    pub interface: String,
    /// Hook.
    pub hook: Hook,
    /// Kernel link ID.
    pub link_id: u32,
    /// Kernel ID of the program the link runs.
    pub program_id: u32,
    /// Name of that program.
    pub program: String,
    /// Pin path.
    pub pin: PathBuf,
}

/// The loaded datapath of one node.
pub struct Datapath {
    ebpf: Ebpf,
    layout: PinLayout,
    object: ObjectInfo,
    /// The address each `ENDPOINT_SLOTS` slot holds (0: empty), read at
    /// load and kept in step by every write: one agent owns the pins (a
    /// lock), so an endpoint update costs two map writes and no read.
    slot_holders: Vec<u32>,
}

fn map_err(name: &'static str) -> impl FnOnce(MapError) -> DatapathError {
    move |source| DatapathError::Map {
        name,
        source: Box::new(source),
    }
}

fn prog_err(name: &str) -> impl FnOnce(ProgramError) -> DatapathError + '_ {
    move |source| DatapathError::Program {
        name: name.to_owned(),
        source: Box::new(source),
    }
}

const fn tc_attach_type(hook: Hook) -> TcAttachType {
    match hook {
        Hook::Ingress => TcAttachType::Ingress,
        Hook::Egress => TcAttachType::Egress,
    }
}

/// Refuses pinned maps whose type or sizes differ from this build's.
fn check_pinned_maps(layout: &PinLayout) -> Result<(), DatapathError> {
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
fn check_object_maps(object: &[u8], source: &str) -> Result<(), DatapathError> {
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

impl Datapath {
    /// Loads the object with every map pinned under `layout` (reusing pins
    /// that exist), loads and pins every program.
    pub fn load(layout: &PinLayout) -> Result<Self, DatapathError> {
        Self::load_with(layout, &MapLimits::default())
    }

    /// Like [`Self::load`] with the maps' capacities. A pinned map of
    /// another size is kept as it is (its entries, flows and pods survive)
    /// until `rivetd unload`; a warning says so.
    pub fn load_with(layout: &PinLayout, limits: &MapLimits) -> Result<Self, DatapathError> {
        Self::load_from(layout, limits, &ObjectSource::Embedded)
    }

    /// Like [`Self::load_with`] with the programs from `source`: the
    /// embedded object or a rebuilt one from a file. Either must define
    /// every map as this build does, and the pins must match too.
    pub fn load_from(
        layout: &PinLayout,
        limits: &MapLimits,
        source: &ObjectSource,
    ) -> Result<Self, DatapathError> {
        let (bytes, object) = match source {
            ObjectSource::Embedded => {
                if OBJECT.is_empty() {
                    return Err(DatapathError::EmptyObject);
                }
                (
                    std::borrow::Cow::Borrowed(OBJECT),
                    ObjectInfo::of("embedded".to_owned(), OBJECT),
                )
            }
            ObjectSource::File(path) => {
                let bytes = std::fs::read(path).map_err(|source| DatapathError::ObjectFile {
                    path: path.clone(),
                    source,
                })?;
                let info = ObjectInfo::of(path.display().to_string(), &bytes);
                (std::borrow::Cow::Owned(bytes), info)
            }
        };
        // The embedded object was built with this rivetd: same layouts.
        if matches!(source, ObjectSource::File(_)) {
            check_object_maps(&bytes, &object.source)?;
        }
        layout.create()?;
        check_pinned_maps(layout)?;

        let btf = Btf::from_sys_fs().ok();
        let mut loader = EbpfLoader::new();
        loader.btf(btf.as_ref());
        for (name, key) in SIZED_MAPS {
            let size = match key {
                "max_endpoints" => limits.endpoints,
                "max_routes" => limits.routes,
                "max_hostports" => limits.hostports,
                _ => limits.nat,
            };
            loader.map_max_entries(name, size);
            if let Ok(pinned) = MapData::from_pin(layout.map(name))
                && let Ok(info) = pinned.info()
                && info.max_entries() != size
            {
                tracing::warn!(
                    map = name,
                    pinned = info.max_entries(),
                    configured = size,
                    key,
                    "the pinned map keeps its size until `rivetd unload`"
                );
            }
        }
        // One fragment bucket per pod that sends fragments (LRU, not
        // listed in SIZED_MAPS: the agent never inserts into it).
        loader.map_max_entries(map_names::FRAG_BUDGET, limits.endpoints);
        for name in map_names::ALL {
            loader.map_pin_path(name, layout.map(name));
        }
        let mut ebpf = loader
            .load(&bytes)
            .map_err(|e| DatapathError::Load(Box::new(e)))?;

        for name in PROGRAMS {
            let prog: &mut SchedClassifier = ebpf
                .program_mut(name)
                .ok_or_else(|| prog_err(name)(ProgramError::UnexpectedProgramType))?
                .try_into()
                .map_err(prog_err(name))?;
            load_verified(|| prog.load()).map_err(prog_err(name))?;
            let pin = layout.prog(name);
            remove_file_if_exists(&pin)?;
            prog.pin(&pin).map_err(|source| DatapathError::PinObject {
                path: pin,
                source: Box::new(source),
            })?;
        }
        crate::datapath::sockhooks::load(&mut ebpf, layout)?;
        tracing::info!(
            object = %object.source,
            stamp = object.stamp.as_deref().unwrap_or("none"),
            hash = %object.hash,
            bytes = object.size,
            "datapath object loaded"
        );
        let slot_holders = read_slot_holders(&ebpf)?;
        Ok(Self {
            ebpf,
            layout: layout.clone(),
            object,
            slot_holders,
        })
    }

    /// The object the programs were loaded from.
    pub fn object(&self) -> &ObjectInfo {
        &self.object
    }

    /// Attaches the socket hooks (hostPorts for the node's own sockets) to
    /// `cgroup`, for sockets of the namespace with `netns_cookie` only.
    pub fn attach_socket_hooks(
        &mut self,
        cgroup: &std::path::Path,
        netns_cookie: u64,
    ) -> Result<Vec<u32>, crate::datapath::sockhooks::SockHookError> {
        let name = map_names::SOCK_CONFIG;
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or_else(|| map_err(name)(MapError::InvalidName { name: name.into() }))?;
        let mut array: Array<&mut MapData, SockConfig> =
            Array::try_from(map).map_err(map_err(name))?;
        array
            .set(0, SockConfig { netns_cookie }, 0)
            .map_err(map_err(name))?;
        crate::datapath::sockhooks::attach(&mut self.ebpf, &self.layout, cgroup)
    }

    /// The pin layout.
    pub fn layout(&self) -> &PinLayout {
        &self.layout
    }

    fn program_mut(&mut self, name: &str) -> Result<&mut SchedClassifier, DatapathError> {
        self.ebpf
            .program_mut(name)
            .ok_or_else(|| prog_err(name)(ProgramError::UnexpectedProgramType))?
            .try_into()
            .map_err(prog_err(name))
    }

    /// Attaches `program` to `ifname` at `hook` through a pinned TCX link.
    /// If the link pin exists, the program inside it is replaced atomically
    /// (`bpf_link_update`); otherwise a new link is created and pinned.
    pub fn attach(
        &mut self,
        program: &str,
        ifname: &str,
        hook: Hook,
    ) -> Result<LinkState, DatapathError> {
        let pin = self.layout.link(ifname, hook);
        let attach_err = |source| DatapathError::Attach {
            program: program.to_owned(),
            interface: ifname.to_owned(),
            hook: hook.as_str(),
            source: Box::new(source),
        };
        let prog = self.program_mut(program)?;

        let existing = match PinnedLink::from_pin(&pin) {
            Ok(old) => {
                let link: SchedClassifierLink =
                    FdLink::from(old)
                        .try_into()
                        .map_err(|source| DatapathError::Link {
                            path: pin.clone(),
                            source: Box::new(source),
                        })?;
                match prog.attach_to_link(link) {
                    Ok(id) => Some(id),
                    Err(e) => {
                        // A link whose device is gone cannot be updated: drop
                        // the stale pin and attach afresh below.
                        tracing::warn!(pin = %pin.display(), error = %e, "stale link pin, re-attaching");
                        remove_file_if_exists(&pin)?;
                        None
                    }
                }
            }
            Err(_) if !pin.exists() => None,
            Err(source) => {
                return Err(DatapathError::Link {
                    path: pin,
                    source: Box::new(source),
                });
            }
        };
        let (link_id, pinned) = match existing {
            Some(id) => (id, true),
            None => (
                prog.attach_with_options(
                    ifname,
                    tc_attach_type(hook),
                    TcAttachOptions::TcxOrder(LinkOrder::default()),
                )
                .map_err(attach_err)?,
                false,
            ),
        };
        let link = prog.take_link(link_id).map_err(attach_err)?;
        let fd_link: FdLink = link.try_into().map_err(|source| DatapathError::Link {
            path: pin.clone(),
            source: Box::new(source),
        })?;
        let info = fd_link.info().map_err(|source| DatapathError::Link {
            path: pin.clone(),
            source: Box::new(source),
        })?;
        if !pinned {
            // Dropping the returned PinnedLink only closes our fd; the pin
            // keeps the link (and thus the attachment) alive.
            fd_link
                .pin(&pin)
                .map_err(|source| DatapathError::PinObject {
                    path: pin.clone(),
                    source: Box::new(source),
                })?;
        }
        Ok(LinkState {
            interface: ifname.to_owned(),
            hook,
            link_id: info.id(),
            program_id: info.program_id(),
            program: program.to_owned(),
            pin,
        })
    }

    /// Kernel ID of a loaded program.
    pub fn program_id(&self, name: &str) -> Result<u32, DatapathError> {
        let prog: &SchedClassifier = self
            .ebpf
            .program(name)
            .ok_or_else(|| prog_err(name)(ProgramError::UnexpectedProgramType))?
            .try_into()
            .map_err(prog_err(name))?;
        Ok(prog.info().map_err(prog_err(name))?.id())
    }

    /// IDs of the programs attached (TCX) to `ifname` at `hook`, in order.
    pub fn attached_ids(&self, ifname: &str, hook: Hook) -> Result<Vec<u32>, DatapathError> {
        let (_, progs) = SchedClassifier::query_tcx(ifname, tc_attach_type(hook)).map_err(|e| {
            DatapathError::Attach {
                program: "(query)".into(),
                interface: ifname.to_owned(),
                hook: hook.as_str(),
                source: Box::new(e),
            }
        })?;
        Ok(progs.iter().map(aya::programs::ProgramInfo::id).collect())
    }

    /// Attaches with the given mode (see [`AttachMode`]).
    pub fn attach_with(
        &mut self,
        mode: AttachMode,
        program: &str,
        ifname: &str,
        hook: Hook,
    ) -> Result<LinkState, DatapathError> {
        match mode {
            AttachMode::Tcx => self.attach(program, ifname, hook),
            AttachMode::Tc => self.attach_tc(program, ifname, hook),
        }
    }

    /// The tc filter (see [`Self::attach_tc`]) that attaches `program` at
    /// `hook`, for a netlink batch; the program's fd stays open as long as
    /// this datapath.
    pub fn tc_filter(
        &mut self,
        program: &str,
        hook: Hook,
    ) -> Result<BpfFilter<'static>, DatapathError> {
        let prog = self.program_mut(program)?;
        let fd = prog.fd().map_err(prog_err(program))?.as_fd().as_raw_fd();
        let prog_name = PROGRAMS
            .iter()
            .copied()
            .find(|p| *p == program)
            .ok_or_else(|| prog_err(program)(ProgramError::UnexpectedProgramType))?;
        Ok(BpfFilter {
            ingress: hook == Hook::Ingress,
            priority: TC_PRIORITY,
            handle: u32::from(TC_HANDLE),
            prog_fd: fd,
            prog_name,
        })
    }

    /// Attaches through a `clsact` qdisc and a direct-action `cls_bpf`
    /// filter at [`TC_PRIORITY`]/[`TC_HANDLE`]; an existing rivet filter is
    /// replaced atomically. The filter outlives this process.
    pub fn attach_tc(
        &mut self,
        program: &str,
        ifname: &str,
        hook: Hook,
    ) -> Result<LinkState, DatapathError> {
        let attach_err = |source| DatapathError::Attach {
            program: program.to_owned(),
            interface: ifname.to_owned(),
            hook: hook.as_str(),
            source: Box::new(source),
        };
        match aya::programs::tc::qdisc_add_clsact(ifname) {
            Ok(()) => {}
            Err(TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => return Err(attach_err(ProgramError::from(e))),
        }
        let prog = self.program_mut(program)?;
        let options = NlOptions {
            priority: TC_PRIORITY,
            handle: TC_HANDLE,
            ..NlOptions::default()
        };
        let id = match prog.attach_with_options(
            ifname,
            tc_attach_type(hook),
            TcAttachOptions::Netlink(options),
        ) {
            Ok(id) => id,
            Err(ProgramError::TcError(TcError::NetlinkError(e)))
                if e.raw_os_error() == Some(libc::EEXIST) =>
            {
                let existing = SchedClassifierLink::attached(
                    ifname,
                    tc_attach_type(hook),
                    TC_PRIORITY,
                    TC_HANDLE,
                    None,
                )
                .map_err(|e| attach_err(ProgramError::from(TcError::IoError(e))))?;
                prog.attach_to_link(existing).map_err(attach_err)?
            }
            Err(e) => return Err(attach_err(e)),
        };
        let link = prog.take_link(id).map_err(attach_err)?;
        // Dropping the link would delete the filter: it must outlive us.
        std::mem::forget(link);
        let program_id = prog.info().map_err(attach_err)?.id();
        Ok(LinkState {
            interface: ifname.to_owned(),
            hook,
            link_id: 0,
            program_id,
            program: program.to_owned(),
            pin: PathBuf::new(),
        })
    }

    /// Detaches whatever is pinned for `ifname` at `hook`. Returns whether a
    /// link pin existed.
    pub fn detach(&self, ifname: &str, hook: Hook) -> Result<bool, DatapathError> {
        Ok(remove_file_if_exists(&self.layout.link(ifname, hook))?)
    }

    fn endpoints_mut(
        &mut self,
    ) -> Result<HashMap<&mut MapData, EndpointKey, EndpointInfo>, DatapathError> {
        let name = map_names::ENDPOINTS;
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or_else(|| map_err(name)(MapError::InvalidName { name: name.into() }))?;
        HashMap::try_from(map).map_err(map_err(name))
    }

    fn endpoints(&self) -> Result<HashMap<&MapData, EndpointKey, EndpointInfo>, DatapathError> {
        let name = map_names::ENDPOINTS;
        let map = self
            .ebpf
            .map(name)
            .ok_or_else(|| map_err(name)(MapError::InvalidName { name: name.into() }))?;
        HashMap::try_from(map).map_err(map_err(name))
    }

    fn endpoint_slots_mut(&mut self) -> Result<Array<&mut MapData, EndpointSlot>, DatapathError> {
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
    fn clear_endpoint_slot(&mut self, addr: u32) -> Result<(), DatapathError> {
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

    fn hostports_mut(
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

    /// (capacity, kernel memory in bytes) of a pinned map: `max_entries`
    /// and the `memlock` the kernel reports for it in fdinfo.
    pub fn map_size(&self, name: &str) -> Result<(u32, u64), DatapathError> {
        let name_static = map_names::ALL
            .iter()
            .copied()
            .find(|n| *n == name)
            .unwrap_or("map");
        let data = MapData::from_pin(self.layout.map(name)).map_err(map_err(name_static))?;
        let capacity = data.info().map_err(map_err(name_static))?.max_entries();
        let fdinfo = std::fs::read_to_string(format!(
            "/proc/self/fdinfo/{}",
            data.fd().as_fd().as_raw_fd()
        ))
        .unwrap_or_default();
        let memory = fdinfo
            .lines()
            .find_map(|l| l.strip_prefix("memlock:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        Ok((capacity, memory))
    }

    /// Every hostPort.
    pub fn list_hostports(&mut self) -> Result<Vec<(HostPortKey, HostPortTarget)>, DatapathError> {
        let map = self.hostports_mut()?;
        Ok(map.iter().filter_map(Result::ok).collect())
    }

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

    fn routes_mut(&mut self) -> Result<LpmTrie<&mut MapData, u32, RouteInfo>, DatapathError> {
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

    fn peers_mut(&mut self) -> Result<HashMap<&mut MapData, EndpointKey, PeerInfo>, DatapathError> {
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

    /// Every counter summed over CPUs, in index order.
    pub fn counters(&self) -> Result<Vec<(Counter, StatsEntry)>, DatapathError> {
        read_counters(&self.ebpf)
    }

    /// The programs attached through pins of this node.
    pub fn links(&self) -> Result<Vec<LinkState>, DatapathError> {
        links(&self.layout)
    }
}

fn read_counters(ebpf: &Ebpf) -> Result<Vec<(Counter, StatsEntry)>, DatapathError> {
    let name = map_names::STATS;
    let map = ebpf
        .map(name)
        .ok_or_else(|| map_err(name)(MapError::InvalidName { name: name.into() }))?;
    sum_counters(&PerCpuArray::try_from(map).map_err(map_err(name))?)
}

/// Sums every counter over CPUs, in index order.
fn sum_counters<T: std::borrow::Borrow<MapData>>(
    stats: &PerCpuArray<T, StatsEntry>,
) -> Result<Vec<(Counter, StatsEntry)>, DatapathError> {
    let mut out = Vec::with_capacity(Counter::ALL.len());
    for counter in Counter::ALL {
        debug_assert!(counter.index() < COUNTERS_MAX);
        let per_cpu = stats
            .get(&counter.index(), 0)
            .map_err(map_err(map_names::STATS))?;
        let sum = per_cpu
            .iter()
            .fold(StatsEntry::default(), |acc, v| StatsEntry {
                packets: acc.packets + v.packets,
                bytes: acc.bytes + v.bytes,
            });
        out.push((counter, sum));
    }
    Ok(out)
}

/// Lists the links pinned under `layout`, with their kernel IDs.
pub fn links(layout: &PinLayout) -> Result<Vec<LinkState>, DatapathError> {
    let mut out = Vec::new();
    for name in layout.link_pins()? {
        let Some((interface, hook)) = PinLayout::parse_link_name(&name) else {
            continue;
        };
        let pin = layout.links_dir().join(&name);
        let link = PinnedLink::from_pin(&pin).map_err(|source| DatapathError::Link {
            path: pin.clone(),
            source: Box::new(source),
        })?;
        let fd_link = FdLink::from(link);
        let info = fd_link.info().map_err(|source| DatapathError::Link {
            path: pin.clone(),
            source: Box::new(source),
        })?;
        let program = PROGRAMS
            .iter()
            .find(|name| {
                aya::programs::ProgramInfo::from_pin(layout.prog(name))
                    .is_ok_and(|p| p.id() == info.program_id())
            })
            .map_or_else(
                || "(not rivet's current program)".to_owned(),
                |n| (*n).to_owned(),
            );
        out.push(LinkState {
            interface,
            hook,
            link_id: info.id(),
            program_id: info.program_id(),
            program,
            pin,
        });
    }
    Ok(out)
}

/// Reads the counters of a node from its pinned stats map, without loading
/// anything (used by tests and tools that run beside the agent).
pub fn pinned_counters(layout: &PinLayout) -> Result<Vec<(Counter, StatsEntry)>, DatapathError> {
    let name = map_names::STATS;
    let data = MapData::from_pin(layout.map(name)).map_err(map_err(name))?;
    let stats = PerCpuArray::try_from(aya::maps::Map::PerCpuArray(data)).map_err(map_err(name))?;
    sum_counters(&stats)
}

/// Removes every pin of the node: links first (programs detach), then
/// programs and maps.
pub fn unload(layout: &PinLayout) -> Result<(), DatapathError> {
    for name in layout.link_pins()? {
        remove_file_if_exists(&layout.links_dir().join(name))?;
    }
    layout.remove_all()?;
    // The shared parent (<bpffs>/rivet) goes too once the last node is gone.
    if let Some(parent) = layout.root().parent() {
        let _ = std::fs::remove_dir(parent);
    }
    Ok(())
}

/// A random number from the standard library's per-process hash keys.
fn random_u32() -> u32 {
    use std::hash::{BuildHasher as _, RandomState};
    RandomState::new().hash_one(std::process::id()) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stamp_is_found_and_the_hash_tells_objects_apart() {
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
