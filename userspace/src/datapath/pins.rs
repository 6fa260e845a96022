//! bpffs and the pin directory of a node.
//!
//! ```text
//! /sys/fs/bpf/rivet/<node>/    (0700, flock'ed by the agent that owns it)
//!   maps/<MAP>                 every map of the datapath (rivet_common::map_names::ALL)
//!   progs/<program>            from_pod from_uplink from_host
//!                              sock_connect4 sock_sendmsg4 sock_recvmsg4 sock_getpeername4
//!                              sock_release
//!   links/ingress-<ifname>     TCX links: the uplink; pods in tcx mode
//!   links/egress-rivet_host    TCX link of from_host
//!   hooks/sock_*               cgroup links of the socket hooks (cgroup2 root)
//! ```
//!
//! bpffs forbids `.` in names: `%` and `.` in interface names are written `%25`
//! and `%2E`. Pod veths in the default `tc` mode carry a netlink `cls_bpf`
//! filter (by program fd; the program is the pinned `from_pod`), not a link:
//! the veth's lifetime is the attachment's.
//!
//! Everything under the pin directory outlives the agent: the datapath keeps
//! forwarding while rivetd restarts or upgrades. The lock is taken
//! non-blocking: a second agent fails with "in use by another rivetd". The
//! default `/sys/fs/bpf` is mounted if needed; another path must already be
//! bpffs. `rivetd unload` removes pod veths, links (tc, TCX, cgroup), pins and
//! the state directory; `rivetctl uninstall` runs it before removing the
//! installed files.

use std::{
    fs::File,
    io,
    os::unix::fs::{DirBuilderExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

/// `BPF_FS_MAGIC` from linux/magic.h.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// bpffs and pin-directory problems.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    /// The path is not on a bpf filesystem.
    #[error("{path} is not a bpf filesystem (mount it: mount -t bpf bpf {path})")]
    NotBpffs {
        /// The path.
        path: PathBuf,
    },
    /// Mounting bpffs failed.
    #[error("cannot mount bpffs at {path}: {source}")]
    Mount {
        /// Mount point.
        path: PathBuf,
        /// Cause.
        source: nix::Error,
    },
    /// Another agent holds the pin directory.
    #[error("pin directory {path} is in use by another rivetd (lock held)")]
    Locked {
        /// The directory.
        path: PathBuf,
    },
    /// A filesystem operation failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Path.
        path: PathBuf,
        /// Cause.
        source: io::Error,
    },
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> PinError + 'a {
    move |source| PinError::Io {
        what,
        path: path.to_owned(),
        source,
    }
}

/// True if `path` is on a bpf filesystem.
pub fn is_bpffs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .map(|s| s.filesystem_type().0 == BPF_FS_MAGIC)
        .unwrap_or(false)
}

/// Makes sure `path` is a bpffs. The standard location (/sys/fs/bpf) is
/// mounted if needed; any other path must already be one.
pub fn ensure_bpffs(path: &Path) -> Result<(), PinError> {
    if is_bpffs(path) {
        return Ok(());
    }
    if path != Path::new(crate::config::DEFAULT_BPFFS) || !path.is_dir() {
        return Err(PinError::NotBpffs {
            path: path.to_owned(),
        });
    }
    nix::mount::mount(
        Some("bpf"),
        path,
        Some("bpf"),
        nix::mount::MsFlags::empty(),
        Some("mode=0700"),
    )
    .map_err(|source| PinError::Mount {
        path: path.to_owned(),
        source,
    })?;
    if is_bpffs(path) {
        Ok(())
    } else {
        Err(PinError::NotBpffs {
            path: path.to_owned(),
        })
    }
}

/// Paths inside a node's pin directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinLayout {
    root: PathBuf,
}

/// The hooks a link can be attached at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// TC ingress.
    Ingress,
    /// TC egress.
    Egress,
}

impl Hook {
    /// Suffix in link pin names.
    pub const fn as_str(self) -> &'static str {
        match self {
            Hook::Ingress => "ingress",
            Hook::Egress => "egress",
        }
    }
}

impl PinLayout {
    /// Layout rooted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The pin directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Directory of map pins.
    pub fn maps_dir(&self) -> PathBuf {
        self.root.join("maps")
    }

    /// Directory of program pins.
    pub fn progs_dir(&self) -> PathBuf {
        self.root.join("progs")
    }

    /// Directory of link pins.
    pub fn links_dir(&self) -> PathBuf {
        self.root.join("links")
    }

    /// Pin path of map `name`.
    pub fn map(&self, name: &str) -> PathBuf {
        self.maps_dir().join(name)
    }

    /// Pin path of program `name`.
    pub fn prog(&self, name: &str) -> PathBuf {
        self.progs_dir().join(name)
    }

    /// Directory of the socket hooks' link pins.
    pub fn hooks_dir(&self) -> PathBuf {
        self.root.join("hooks")
    }

    /// Pin path of the link of socket hook `program`.
    pub fn hook(&self, program: &str) -> PathBuf {
        self.hooks_dir().join(program)
    }

    /// Pin path of the link on `ifname` at `hook`.
    pub fn link(&self, ifname: &str, hook: Hook) -> PathBuf {
        let escaped = ifname.replace('%', "%25").replace('.', "%2E");
        self.links_dir()
            .join(format!("{}-{escaped}", hook.as_str()))
    }

    /// Parses a link pin file name back into (ifname, hook).
    pub fn parse_link_name(name: &str) -> Option<(String, Hook)> {
        let (hook, ifname) = name.split_once('-')?;
        let hook = match hook {
            "ingress" => Hook::Ingress,
            "egress" => Hook::Egress,
            _ => return None,
        };
        Some((ifname.replace("%2E", ".").replace("%25", "%"), hook))
    }

    /// Creates the directories (0700).
    pub fn create(&self) -> Result<(), PinError> {
        for dir in [
            self.root.clone(),
            self.maps_dir(),
            self.progs_dir(),
            self.links_dir(),
            self.hooks_dir(),
        ] {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .map_err(io_err("creating", &dir))?;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
                .map_err(io_err("setting permissions of", &dir))?;
        }
        Ok(())
    }

    /// Takes the exclusive lock of this pin directory (non-blocking): one
    /// agent per node. Released when the returned guard drops.
    pub fn lock(&self) -> Result<PinLock, PinError> {
        let dir = File::open(&self.root).map_err(io_err("opening", &self.root))?;
        match dir.try_lock() {
            Ok(()) => Ok(PinLock { _dir: dir }),
            Err(std::fs::TryLockError::WouldBlock) => Err(PinError::Locked {
                path: self.root.clone(),
            }),
            Err(std::fs::TryLockError::Error(e)) => Err(io_err("locking", &self.root)(e)),
        }
    }

    /// Names of the link pins present.
    pub fn link_pins(&self) -> Result<Vec<String>, PinError> {
        let dir = self.links_dir();
        let mut names = Vec::new();
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(names),
            Err(e) => return Err(io_err("listing", &dir)(e)),
        };
        for entry in entries {
            let entry = entry.map_err(io_err("listing", &dir))?;
            if let Some(name) = entry.file_name().to_str() {
                names.push(name.to_owned());
            }
        }
        names.sort();
        Ok(names)
    }

    /// Removes the whole pin directory. Links detach when their pin is the
    /// last reference; maps go away with the last program using them.
    pub fn remove_all(&self) -> Result<(), PinError> {
        match std::fs::remove_dir_all(&self.root) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("removing", &self.root)(e)),
        }
    }
}

/// Holds the pin-directory lock.
#[derive(Debug)]
pub struct PinLock {
    _dir: File,
}

/// Removes a file, treating "not there" as success.
pub fn remove_file_if_exists(path: &Path) -> Result<bool, PinError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_err("removing", path)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_paths() {
        let l = PinLayout::new("/sys/fs/bpf/rivet/n1");
        assert_eq!(
            l.map("ENDPOINTS"),
            Path::new("/sys/fs/bpf/rivet/n1/maps/ENDPOINTS")
        );
        assert_eq!(
            l.prog("from_pod"),
            Path::new("/sys/fs/bpf/rivet/n1/progs/from_pod")
        );
        assert_eq!(
            l.link("rv0123", Hook::Ingress),
            Path::new("/sys/fs/bpf/rivet/n1/links/ingress-rv0123")
        );
        assert_eq!(
            l.link("eth0.1%", Hook::Egress),
            Path::new("/sys/fs/bpf/rivet/n1/links/egress-eth0%2E1%25")
        );
        for (ifname, hook) in [("rv0123", Hook::Ingress), ("a.b-c%2E", Hook::Egress)] {
            let pin = l.link(ifname, hook);
            let name = pin.file_name().and_then(|n| n.to_str()).expect("name");
            assert!(!name.contains('.'), "{name}");
            assert_eq!(
                PinLayout::parse_link_name(name),
                Some((ifname.to_owned(), hook))
            );
        }
        assert_eq!(PinLayout::parse_link_name("junk"), None);
        assert_eq!(PinLayout::parse_link_name("sideways-eth0"), None);
    }

    #[test]
    fn tmp_is_not_bpffs() {
        assert!(!is_bpffs(Path::new("/tmp")));
        let err = ensure_bpffs(Path::new("/tmp")).expect_err("not bpffs");
        assert!(
            err.to_string().contains("/tmp is not a bpf filesystem"),
            "{err}"
        );
    }
}
