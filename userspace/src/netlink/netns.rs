//! Network namespaces. setns(2) changes the namespace of the calling
//! *thread*, so work inside another namespace runs on a fresh OS thread that
//! joins it and then exits: no pooled thread (tokio worker, blocking pool)
//! ever changes namespace.

use std::{
    fs::File,
    path::{Path, PathBuf},
};

use nix::sched::{CloneFlags, setns};

/// Namespace errors.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// The path does not exist.
    #[error("network namespace {path} does not exist")]
    NotFound {
        /// Path.
        path: PathBuf,
    },
    /// The path exists but is not a network namespace, or cannot be opened.
    #[error("cannot use network namespace {path}: {reason}")]
    Invalid {
        /// Path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The worker thread panicked.
    #[error("worker thread in network namespace {path} panicked")]
    Panicked {
        /// Path.
        path: PathBuf,
    },
}

/// `NSFS_MAGIC` and `PROC_SUPER_MAGIC` (a /proc/<pid>/ns/net path).
const NSFS_MAGIC: i64 = 0x6e73_6673;
const PROC_SUPER_MAGIC: i64 = 0x9fa0;

/// Opens a network namespace file and checks that it is one.
pub fn open(path: &Path) -> Result<File, NetnsError> {
    let file = File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => NetnsError::NotFound {
            path: path.to_owned(),
        },
        _ => NetnsError::Invalid {
            path: path.to_owned(),
            reason: e.to_string(),
        },
    })?;
    let fs = nix::sys::statfs::fstatfs(&file).map_err(|e| NetnsError::Invalid {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    let magic = fs.filesystem_type().0;
    if magic != NSFS_MAGIC && magic != PROC_SUPER_MAGIC {
        return Err(NetnsError::Invalid {
            path: path.to_owned(),
            reason: "not a namespace file".into(),
        });
    }
    Ok(file)
}

/// Moves the *calling thread* into the namespace at `path`. Meant for the
/// start of a process, before any other thread exists (threads created
/// afterwards inherit it).
pub fn enter(path: &Path) -> Result<(), NetnsError> {
    let file = open(path)?;
    setns(&file, CloneFlags::CLONE_NEWNET).map_err(|e| NetnsError::Invalid {
        path: path.to_owned(),
        reason: format!("setns: {e}"),
    })
}

/// Runs `f` on a new thread inside the namespace at `path` and returns its
/// result. The thread exits afterwards, so the namespace switch never leaks.
pub fn run_in<T, F>(path: &Path, f: F) -> Result<T, NetnsError>
where
    T: Send,
    F: FnOnce() -> T + Send,
{
    let file = open(path)?;
    run_in_file(&file, path, f)
}

/// Like [`run_in`] with an already opened namespace file.
pub fn run_in_file<T, F>(file: &File, path: &Path, f: F) -> Result<T, NetnsError>
where
    T: Send,
    F: FnOnce() -> T + Send,
{
    std::thread::scope(|s| {
        s.spawn(|| {
            setns(file, CloneFlags::CLONE_NEWNET).map_err(|e| NetnsError::Invalid {
                path: path.to_owned(),
                reason: format!("setns: {e}"),
            })?;
            Ok(f())
        })
        .join()
        .map_err(|_| NetnsError::Panicked {
            path: path.to_owned(),
        })?
    })
}

/// Writes a per-interface sysctl of the calling thread's network namespace:
/// `/proc/sys/net/<proto>/conf/<ifname>/<key>`.
pub fn write_if_sysctl(proto: &str, ifname: &str, key: &str, value: &str) -> std::io::Result<()> {
    std::fs::write(format!("/proc/sys/net/{proto}/conf/{ifname}/{key}"), value)
}

/// Writes several per-interface sysctls of the calling thread's network
/// namespace, in order, resolving `/proc/sys/net/<proto>/conf/<ifname>`
/// once (each full-path open walks the proc sysctl tree again). Every key
/// is tried; the first failure is returned with its key.
pub fn write_if_sysctls(
    proto: &str,
    ifname: &str,
    values: &[(&'static str, &str)],
) -> Result<(), (&'static str, std::io::Error)> {
    use nix::{fcntl::OFlag, sys::stat::Mode};
    let dir = format!("/proc/sys/net/{proto}/conf/{ifname}");
    let dir = nix::fcntl::open(
        dir.as_str(),
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| (values.first().map_or("", |v| v.0), e.into()))?;
    let mut first = None;
    for (key, value) in values {
        let written = nix::fcntl::openat(
            &dir,
            *key,
            OFlag::O_WRONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(std::io::Error::from)
        .and_then(|fd| std::io::Write::write_all(&mut File::from(fd), value.as_bytes()));
        if let Err(e) = written {
            first.get_or_insert((*key, e));
        }
    }
    first.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_wrong_paths() {
        assert!(matches!(
            open(Path::new("/nonexistent/ns")),
            Err(NetnsError::NotFound { .. })
        ));
        let err = open(Path::new("/etc/hostname")).expect_err("not a netns");
        assert!(err.to_string().contains("not a namespace file"), "{err}");
    }
}
