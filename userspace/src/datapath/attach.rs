//! Attaching programs: TCX links pinned in bpffs, `cls_bpf` filters over
//! netlink, the socket hooks; what is attached where.
//!
//! | | uplink | pod veths, `pod_attach = "tc"` (default) | pod veths, `pod_attach = "tcx"` |
//! |---|---|---|---|
//! | mechanism | TCX link, pinned | `clsact` qdisc + direct-action `cls_bpf` at prio 1 handle 1 | TCX link, pinned |
//! | survives the agent | via the pin | the filter belongs to the device | via the pin |
//! | upgrade | `bpf_link_update` | `tc filter replace` (atomic) | `bpf_link_update` |
//! | cost of the first attach | once per node | < 0.3 ms | 10–20 ms with RTNL held |
//!
//! Why pods default to netlink tc: a TCX attach swaps the device's
//! `bpf_mprog_entry` and then waits for an RCU grace period (`tcx_entry_sync()`
//! → `synchronize_rcu()`) while holding RTNL. Measured here: `BPF_LINK_CREATE`
//! 10–26 ms per pod, serializing every concurrent pod creation (51 ADDs/s at
//! 8-way, ADD p50 17 ms). The netlink `cls_bpf` attach has no such wait
//! (0.2–0.3 ms). The uplink, attached once, uses TCX. Both modes are tested
//! (restart without loss runs in each).

use std::{
    os::fd::{AsFd as _, AsRawFd as _},
    path::PathBuf,
};

use aya::{
    maps::{Array, MapData, MapError},
    programs::{
        LinkOrder, ProgramError, SchedClassifier, TcAttachType,
        links::{FdLink, PinnedLink},
        tc::{NlOptions, SchedClassifierLink, TcAttachOptions, TcError, TcHandle},
    },
};
use rivet_common::{SockConfig, map_names, program_names};

use crate::config::AttachMode;
use crate::datapath::pins::{Hook, PinLayout, remove_file_if_exists};
use crate::datapath::{Datapath, DatapathError, map_err, prog_err};
use crate::netlink::messages::BpfFilter;

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

pub(in crate::datapath) const fn tc_attach_type(hook: Hook) -> TcAttachType {
    match hook {
        Hook::Ingress => TcAttachType::Ingress,
        Hook::Egress => TcAttachType::Egress,
    }
}

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

impl Datapath {
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

    pub(in crate::datapath) fn program_mut(
        &mut self,
        name: &str,
    ) -> Result<&mut SchedClassifier, DatapathError> {
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

    /// The programs attached through pins of this node.
    pub fn links(&self) -> Result<Vec<LinkState>, DatapathError> {
        links(&self.layout)
    }
}
