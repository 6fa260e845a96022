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
//!
//! | module | what |
//! |---|---|
//! | `netns` | `Netns`: `ip netns add` guard; `command()` runs through `nsenter --net=` (unlike `ip netns exec` it keeps `/sys`, so bpffs stays visible); `exec(closure)` runs on a dedicated thread that `setns`es |
//! | `world` | `World`: the underlay bridge (it stands for a switch, so bridge netfilter is off there), nodes (`eth0` on the bridge, their own agent, pin dir, state dir, socket, log), pods created through the agent API, an outside host; drop order: pods, nodes (agent stopped, `rivetd unload`, pins removed), outside, underlay, scratch dir |
//! | `apiserver` | `ApiServer`: the Kubernetes API server the agents' API source is tested against (the suite's only stand-in: no kube-apiserver runs on these machines): the real JSON wire protocol for nodes, pods, services, namespaces, EndpointSlices and NetworkPolicies, with chunked lists, watches, patches and test hooks; `kubectl` proves it in `tests/tests/apiserver.rs` |
//! | `agent` | `AgentProc`: spawns `rivetd`, waits for its socket, SIGTERM (then SIGKILL) on drop |
//! | `traffic` | ping, TCP transfer with byte counts, iperf3 client/server |
//! | `continuity` | paced streams, sequenced UDP and a 10 ms attachment poller for the restart and upgrade tests |
//! | `flannel` | a node set up the way flanneld's vxlan backend sets one up (interop test, overlay baseline); `nic_like()` turns the underlay into software GSO/checksum + NAPI GRO |
//! | `packet`, `raw`, `capture` | frame builders with checksums; a pod's raw socket sending whole Ethernet frames (as with `CAP_NET_RAW`); captures of one interface |
//! | `progtest` | per-program tests with `BPF_PROG_TEST_RUN` (below) |
//! | `metrics` | GET from the agent's HTTP port inside a node namespace; Prometheus sample lookups |
//! | `cni`, `cri` | plugins run like a runtime (env + stdin, result/error JSON parsed; `Node::assert_no_pod_state` checks veths, pins, records, map entries and routes are all gone); containerd driven through CRI |
//!
//! Per-program tests (`tests/tests/datapath*.rs`) load a private copy of the
//! object (no pins) in a fresh namespace with two veth pairs standing for two
//! pods' host veths, fill the maps, run the real entry program with
//! `BPF_PROG_TEST_RUN` and check verdict, output bytes (a dropped packet must
//! be unchanged) and that exactly the expected counter moved by one. On 6.18
//! `BPF_PROG_TEST_RUN` itself refuses frames under 14 bytes and IPv4 frames
//! under 34 bytes (EINVAL before the program runs); truncation is exercised
//! with ARP and unknown ethertypes. `progtest` also builds tunnel frames, turns
//! masquerade on, can load with a small NAT table, and times a path
//! (`Harness::time`: mean kernel-measured duration of single runs), which
//! the prog-cost benchmark (`rivet-bench`, in `bench/`) uses.
//!
//! Integration tests, one file per concern in `tests/tests/`. Operator-facing:
//! `operator.rs` (metrics scraped over HTTP in the node namespace, `/healthz`,
//! `/readyz` through an etcd outage, every rivetctl listing in table and JSON,
//! `monitor` with a spoofed packet and flow events switching on and off),
//! `deploy.rs` (the shipped unit, example configuration and DaemonSet parsed
//! and checked; `rivetctl install` → agent → `rivetctl uninstall` compared
//! against the node namespace before). Hardening (RELIABILITY.md lists each
//! threat with its test and result): `restart.rs` (four paced TCP streams —
//! same-node, cross-node per mode, masquerade, hostPort — through SIGTERM,
//! SIGKILL and a 30 s outage of the agent, with a 10 ms attachment poller and
//! the state compared before and after; a changed map layout refused),
//! `upgrade.rs` (the same across a restart onto a rebuilt, byte-different
//! object and back; an object with another map layout refused), `hostile.rs`
//! (real attacks from a pod: exact drop counters, victims silent, neighbour and
//! route tables unchanged, floods), `malformed.rs` (one table of malformed
//! frames through every program, plus short and VLAN-tagged frames over a real
//! veth), `exposure.rs` (modes and owners of state, pins and socket; `nobody`
//! via `setpriv`, a socket group, pods and the metrics port, `route_localnet`,
//! hostPort vs transit), `limits.rs` (full endpoints and routes maps).

pub mod agent;
pub mod apiserver;
pub mod bgp;
pub mod capture;
pub mod cni;
pub mod continuity;
pub mod cri;
pub mod flannel;
pub mod kube;
pub mod metrics;
pub mod netns;
pub mod netpol;
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
