//! The node's own sockets to hostPorts: the cgroup socket-address hooks
//! (`sock_connect4`, `sock_sendmsg4`, `sock_recvmsg4`, `sock_getpeername4`)
//! and the socket hook `sock_release` (a closing socket's record goes)
//! loaded with the object, attached as bpf_links to the cgroup2 root beside
//! anyone else's programs (links are multi-attach) and pinned under `<pin
//! dir>/hooks/`. They act only on sockets of the node's network namespace,
//! whose cookie the agent writes into `SOCK_CONFIG` (what they do:
//! `ebpf/src/sock.rs`).
//!
//! On restart the new links are attached before the old pins are removed (both
//! translate alike; there is no instant without a hook). No cgroup2 mounted → a
//! warning, the rest works.

use std::{
    fs::File,
    io,
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf,
    programs::{
        CgroupAttachMode, CgroupSock, CgroupSockAddr, ProgramError,
        links::{FdLink, LinkError, PinnedLink},
    },
};
use rivet_common::program_names::{SOCK_RELEASE, SOCKET_HOOKS};

use crate::datapath::{
    DatapathError,
    pins::{PinLayout, remove_file_if_exists},
};

/// `statfs` magic of cgroup2.
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
/// `SO_NETNS_COOKIE` (Linux 5.14).
const SO_NETNS_COOKIE: libc::c_int = 71;

/// Errors of the socket hooks.
#[derive(Debug, thiserror::Error)]
pub enum SockHookError {
    /// No cgroup2 hierarchy to attach to.
    #[error("no cgroup2 hierarchy at /sys/fs/cgroup or /sys/fs/cgroup/unified")]
    NoCgroup2,
    /// The cgroup directory could not be opened.
    #[error("opening cgroup {path}: {source}")]
    Cgroup {
        /// The directory.
        path: PathBuf,
        /// Cause.
        source: io::Error,
    },
    /// The namespace cookie could not be read.
    #[error("reading the network namespace cookie (SO_NETNS_COOKIE): {0}")]
    NetnsCookie(io::Error),
    /// Loading, attaching or pinning a hook failed.
    #[error(transparent)]
    Datapath(#[from] DatapathError),
}

/// The cgroup2 root: `/sys/fs/cgroup` on a unified hierarchy,
/// `/sys/fs/cgroup/unified` on a hybrid one.
pub fn cgroup2_root() -> Result<PathBuf, SockHookError> {
    ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| {
            nix::sys::statfs::statfs(p.as_path())
                .is_ok_and(|s| s.filesystem_type().0 == CGROUP2_SUPER_MAGIC)
        })
        .ok_or(SockHookError::NoCgroup2)
}

/// The cookie of the calling thread's network namespace.
pub fn netns_cookie() -> Result<u64, SockHookError> {
    let sock = std::net::UdpSocket::bind(("127.0.0.1", 0)).map_err(SockHookError::NetnsCookie)?;
    let mut cookie: u64 = 0;
    let mut len = size_of::<u64>() as libc::socklen_t;
    // SAFETY: a valid socket fd and an out-buffer of the size passed.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&raw mut cookie).cast(),
            &raw mut len,
        )
    };
    if rc != 0 {
        return Err(SockHookError::NetnsCookie(io::Error::last_os_error()));
    }
    Ok(cookie)
}

/// A socket hook of either program type.
enum Hook<'a> {
    /// A socket-address hook (connect4, sendmsg4, recvmsg4, getpeername4).
    Addr(&'a mut CgroupSockAddr),
    /// A socket hook (sock_release).
    Sock(&'a mut CgroupSock),
}

impl Hook<'_> {
    fn load(&mut self) -> Result<(), ProgramError> {
        match self {
            Self::Addr(p) => p.load(),
            Self::Sock(p) => p.load(),
        }
    }

    fn pin(&mut self, path: &Path) -> Result<(), aya::pin::PinError> {
        match self {
            Self::Addr(p) => p.pin(path),
            Self::Sock(p) => p.pin(path),
        }
    }

    /// Attaches to `cgroup` and hands the link over: the attach failed
    /// (`Err(Ok)`: the program's error) or the link is not a plain fd link
    /// (`Err(Err)`). A link (BPF_LINK_CREATE, kernel ≥ 5.7) is always
    /// attached beside others; its flags must be 0, which `Single` gives.
    fn attach(&mut self, cgroup: &File) -> Result<FdLink, Result<ProgramError, LinkError>> {
        let mode = CgroupAttachMode::Single;
        match self {
            Self::Addr(p) => {
                let id = p.attach(cgroup, mode).map_err(Ok)?;
                FdLink::try_from(p.take_link(id).map_err(Ok)?).map_err(Err)
            }
            Self::Sock(p) => {
                let id = p.attach(cgroup, mode).map_err(Ok)?;
                FdLink::try_from(p.take_link(id).map_err(Ok)?).map_err(Err)
            }
        }
    }
}

fn hook_mut<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<Hook<'a>, DatapathError> {
    let err = |source| DatapathError::Program {
        name: name.to_owned(),
        source: Box::new(source),
    };
    let prog = ebpf
        .program_mut(name)
        .ok_or_else(|| err(ProgramError::UnexpectedProgramType))?;
    if name == SOCK_RELEASE {
        prog.try_into().map(Hook::Sock).map_err(err)
    } else {
        prog.try_into().map(Hook::Addr).map_err(err)
    }
}

/// Loads and pins the hooks (with the object).
pub fn load(ebpf: &mut Ebpf, layout: &PinLayout) -> Result<(), DatapathError> {
    for name in SOCKET_HOOKS {
        let mut prog = hook_mut(ebpf, name)?;
        prog.load().map_err(|source| DatapathError::Program {
            name: name.to_owned(),
            source: Box::new(source),
        })?;
        let pin = layout.prog(name);
        remove_file_if_exists(&pin)?;
        prog.pin(&pin).map_err(|source| DatapathError::PinObject {
            path: pin,
            source: Box::new(source),
        })?;
    }
    Ok(())
}

/// Attaches every hook to `cgroup`. A previous run's link is replaced
/// without a gap: the new link is attached first, then the old pin goes
/// (both run for an instant; they translate alike). Returns the link IDs.
pub fn attach(
    ebpf: &mut Ebpf,
    layout: &PinLayout,
    cgroup: &Path,
) -> Result<Vec<u32>, SockHookError> {
    let dir = File::open(cgroup).map_err(|source| SockHookError::Cgroup {
        path: cgroup.to_owned(),
        source,
    })?;
    let mut ids = Vec::new();
    for name in SOCKET_HOOKS {
        let pin = layout.hook(name);
        let link_err = |source| DatapathError::Link {
            path: pin.clone(),
            source: Box::new(source),
        };
        let old = PinnedLink::from_pin(&pin).ok();
        let mut prog = hook_mut(ebpf, name)?;
        let link = prog.attach(&dir).map_err(|e| match e {
            Ok(source) => DatapathError::Attach {
                program: name.to_owned(),
                interface: cgroup.display().to_string(),
                hook: "cgroup",
                source: Box::new(source),
            },
            Err(source) => link_err(source),
        })?;
        ids.push(link.info().map_err(link_err)?.id());
        if let Some(old) = old {
            remove_file_if_exists(&pin).map_err(DatapathError::from)?;
            // Unpinned and closed: the old link detaches.
            drop(FdLink::from(old));
        }
        link.pin(&pin).map_err(|source| DatapathError::PinObject {
            path: pin.clone(),
            source: Box::new(source),
        })?;
    }
    Ok(ids)
}
