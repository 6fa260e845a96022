//! rivet's test harness: whole topologies built from network namespaces.
//!
//! ```text
//!   underlay ns  (bridge br0, 192.168.<k>.1/24)
//!     ├─ n1 ─ node ns  eth0 192.168.<k>.11  pods 10.<k2>.1.0/24 ─ pod nss
//!     ├─ n2 ─ node ns  eth0 192.168.<k>.12  pods 10.<k2>.2.0/24 ─ pod nss
//!     └─ out ─ outside ns eth0 192.168.<k>.254 (stands in for the internet)
//! ```
//!
//! Every namespace, process, pin and file a test creates is owned by a guard
//! and removed when the guard drops, also while unwinding from a panic. Names
//! carry a per-process, per-world prefix so tests can run in parallel. Nothing
//! here touches the machine's own interfaces or addresses outside the
//! namespaces it made.

pub mod agent;
pub mod bench;
pub mod capture;
pub mod cni;
pub mod continuity;
pub mod cri;
pub mod flannel;
pub mod metrics;
pub mod netns;
pub mod packet;
pub mod progtest;
pub mod raw;
pub mod traffic;
pub mod world;

use std::{
    path::PathBuf,
    sync::atomic::{AtomicU32, Ordering},
};

pub use agent::AgentProc;
pub use netns::Netns;
pub use world::{Node, Pod, World};

/// Directory holding the built rivet binaries (rivetd, rivetctl, rivet-cni):
/// `$RIVET_BIN_DIR`, else the cargo target directory of the running binary.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("RIVET_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// Path of a built binary; panics with a hint if it is missing.
pub fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.exists(),
        "{} not found: build it first (cargo build -p rivet -p rivet-cni), or set RIVET_BIN_DIR",
        path.display()
    );
    path
}

/// The rivet-cni binary the tests drive: `$RIVET_CNI_BIN` (the static
/// build `cargo xtask test` makes, the one that ships), else the workspace
/// build beside the other binaries.
pub fn cni_bin() -> PathBuf {
    match std::env::var_os("RIVET_CNI_BIN") {
        Some(p) => PathBuf::from(p),
        None => bin("rivet-cni"),
    }
}

/// A short prefix unique to this process and call: `rt<pid hex><n>`.
pub fn unique_prefix() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("rt{:x}{n:x}", std::process::id() & 0xfffff)
}

/// A distinct small number per world (for address plans), derived from the
/// process ID and a counter so parallel tests do not share subnets (they are
/// in separate namespaces anyway; distinct numbers make captures readable).
pub fn world_number() -> u8 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    ((std::process::id() + n) % 200 + 20) as u8
}
