//! The datapath section: how pod veths get their program, and which
//! object the programs come from.

use std::path::PathBuf;

/// How programs are attached to pod veths.
///
/// - `Tcx`: a TCX link per veth, pinned under `links/`. Each first attach
///   costs the kernel an RCU grace period while holding RTNL
///   (`tcx_entry_sync()` → `synchronize_rcu()`), measured at 10–20 ms here,
///   which serializes concurrent pod creation.
/// - `Tc`: a `clsact` qdisc and a direct-action `cls_bpf` filter at fixed
///   priority/handle, attached over netlink in well under a millisecond. The
///   filter belongs to the device, not to a process: it survives agent
///   restarts without a pin and is replaced atomically (`tc filter replace`).
///
/// The uplink always uses TCX (attached once per node).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttachMode {
    /// Netlink `cls_bpf` on `clsact` (default: fast pod creation).
    #[default]
    Tc,
    /// TCX links pinned in bpffs.
    Tcx,
}

impl std::str::FromStr for AttachMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "tc" => Ok(Self::Tc),
            "tcx" => Ok(Self::Tcx),
            other => Err(format!("{other:?} is not an attach mode (tc or tcx)")),
        }
    }
}

/// Where the programs come from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ObjectSource {
    /// The object built into this binary ([`OBJECT`](crate::datapath::OBJECT)).
    #[default]
    Embedded,
    /// A file (`rivetd --ebpf-object`): a rebuilt datapath without a new
    /// rivetd. It must define the maps exactly as this build does.
    File(PathBuf),
}
