//! The kernel side seen from userspace: loading the embedded object with its
//! maps pinned, attaching programs through pinned TCX links, and typed access
//! to every map.
//!
//! Restart semantics: maps are reopened from their pins (never recreated),
//! programs are loaded afresh and swapped into the existing pinned links with
//! `bpf_link_update` (atomic: there is no instant without a program).
//!
//! Here: [`Datapath`], loading and unloading. The object, its stamp and
//! layout check are in `object`, attaching in `attach` (with
//! [`sockhooks`]), the maps in `maps` (one file per family), the pin
//! directory in [`pins`].

mod attach;
mod maps;
mod object;
pub mod pins;
pub mod sockhooks;

use std::path::PathBuf;

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{MapData, MapError},
    programs::{ProgramError, SchedClassifier, links::LinkError},
};
use rivet_common::{MAPS, MapSizing};

pub use self::{
    attach::{LinkState, PROGRAMS, TC_HANDLE, TC_PRIORITY, links},
    maps::{
        SIZED_MAPS,
        bandwidth::bandwidth_flags,
        map_full_counts, note_map_full,
        policy::{PeerEntry, PortEntry},
    },
    object::{OBJECT, ObjectInfo, load_verified, object_hash, object_stamp},
};
use self::{
    maps::{configured_size, endpoints::read_slot_holders},
    object::{check_object_maps, check_pinned_maps},
    pins::{PinError, PinLayout, remove_file_if_exists},
};
// Chosen by the configuration, used here.
use crate::config::MapLimits;
pub use crate::config::{AttachMode, ObjectSource};

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

/// The loaded datapath of one node.
pub struct Datapath {
    ebpf: Ebpf,
    layout: PinLayout,
    object: ObjectInfo,
    /// The address each `ENDPOINT_SLOTS` slot holds (0: empty), read at
    /// load and kept in step by every write: one agent owns the pins (a
    /// lock), so an endpoint update costs two map writes and no read.
    slot_holders: Vec<u32>,
    /// Local addresses that are backends of Services reachable at the
    /// uplink (endpoint flag `SERVICE`; `maps/services.rs`).
    service_backends: std::collections::BTreeSet<std::net::Ipv4Addr>,
    /// Isolation bits of local pods NetworkPolicy polices (endpoint flags
    /// `POLICY_INGRESS`/`POLICY_EGRESS`; `maps/policy.rs`).
    policy_isolation: std::collections::HashMap<std::net::Ipv4Addr, u32>,
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
        for spec in &MAPS {
            loader.map_pin_path(spec.name, layout.map(spec.name));
            let (MapSizing::Configured(key) | MapSizing::Follows(key)) = spec.sizing else {
                continue;
            };
            let size = configured_size(limits, key).unwrap_or(spec.max_entries);
            loader.map_max_entries(spec.name, size);
            if let MapSizing::Configured(_) = spec.sizing
                && let Ok(pinned) = MapData::from_pin(layout.map(spec.name))
                && let Ok(info) = pinned.info()
                && info.max_entries() != size
            {
                tracing::warn!(
                    map = spec.name,
                    pinned = info.max_entries(),
                    configured = size,
                    key,
                    "the pinned map keeps its size until `rivetd unload`"
                );
            }
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
        let policy_isolation = maps::policy::read_isolation(&ebpf)?;
        Ok(Self {
            ebpf,
            layout: layout.clone(),
            object,
            slot_holders,
            service_backends: std::collections::BTreeSet::new(),
            policy_isolation,
        })
    }

    /// The object the programs were loaded from.
    pub fn object(&self) -> &ObjectInfo {
        &self.object
    }

    /// The pin layout.
    pub fn layout(&self) -> &PinLayout {
        &self.layout
    }
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
