//! Kubernetes Services: finding a frontend and choosing its backend. Reads
//! `SVC_FRONTENDS`, `SVC_BACKENDS`, `LOCAL_ADDRS`, `PEERS`; reads and writes
//! `SVC_AFFINITY`; adds to `SVC_STATS`. Layout: `rivet_common::service`.
//!
//! Two datapaths share this:
//! - **sockets** ([`crate::sock`]): a pod's or the node's `connect` or
//!   unconnected `sendmsg` naming a frontend is sent to a backend before a
//!   packet exists — chosen once per connection, no per-packet NAT (scope
//!   `INTERNAL`);
//! - **packets at the uplink** ([`crate::nat::hostport_in`]): a NodePort,
//!   external IP or load-balancer IP reached from outside; the choice is
//!   stored per flow in `NAT` (scope `EXTERNAL`).
//!
//! A frontend is looked up by its exact address first; a NodePort is the
//! entry with address 0, asked for when the address is the node's own (or,
//! from the sockets, another node's: the connection goes straight to the
//! backend, as it would through that node). An entry `{addr, port 0, proto
//! 0, EXTERNAL}` marks an address holding external frontends, so the uplink
//! looks further only for those.
//!
//! Choice: with `sessionAffinity: ClientIP` the client's last backend, if it
//! was used within the timeout and still holds its slot in the group;
//! otherwise a uniformly random slot (`bpf_get_prandom_u32() % count`). A
//! frontend with no backend (`count == 0`) rejects at once.

use aya_ebpf::helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns};
use rivet_common::{
    SvcAffinity, SvcAffinityKey, SvcBackend, SvcBackendKey, SvcInfo, SvcKey, svc_flags, svc_scope,
};

use crate::maps::{self, SVC_AFFINITY, SVC_BACKENDS, SVC_FRONTENDS, SVC_STATS};

/// What a frontend lookup found.
pub enum Lookup {
    /// No frontend with that address, port and protocol.
    None,
    /// A frontend without backends (for this client): reject.
    Reject,
    /// A `Local` frontend with no backend on this node while the Service
    /// has some elsewhere: drop.
    NoLocal,
    /// The backend for this client, and the frontend.
    Backend(SvcBackend, SvcInfo),
}

/// Where the frontend address sits, for the NodePort fallback.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Nodes {
    /// Only this node's addresses serve NodePorts (packets at the uplink).
    This,
    /// This node's and every other node's (sockets: a NodePort on any node
    /// reaches the same Service).
    Any,
}

/// The frontend `{addr, port, proto}` in `scope`, if there is one.
#[inline(always)]
pub fn frontend(addr: u32, port: u16, proto: u8, scope: u8, nodes: Nodes) -> Option<SvcInfo> {
    let key = |addr| SvcKey {
        addr,
        port,
        proto,
        scope,
    };
    // SAFETY: entries are replaced whole by the agent (BPF_ANY update of a
    // preallocated hash): a concurrent update reads as the old or new value.
    if let Some(info) = unsafe { SVC_FRONTENDS.get(key(addr)) } {
        return Some(*info);
    }
    let node = maps::is_local_addr(addr) || (nodes == Nodes::Any && maps::peer(addr).is_some());
    if !node {
        return None;
    }
    // SAFETY: as above.
    unsafe { SVC_FRONTENDS.get(key(0)) }.copied()
}

/// True if `addr` holds external frontends (the marker entry).
#[inline(always)]
pub fn external_addr(addr: u32) -> bool {
    SVC_FRONTENDS
        .get_ptr(SvcKey {
            addr,
            port: 0,
            proto: 0,
            scope: svc_scope::EXTERNAL,
        })
        .is_some()
}

/// Looks up a frontend and chooses the backend for `client` (an affinity
/// key: [`rivet_common::SvcAffinityKey::client`]).
#[inline(always)]
pub fn lookup(addr: u32, port: u16, proto: u8, scope: u8, nodes: Nodes, client: u64) -> Lookup {
    let Some(info) = frontend(addr, port, proto, scope, nodes) else {
        return Lookup::None;
    };
    match choose(&info, client) {
        Some(backend) => Lookup::Backend(backend, info),
        None => {
            count(info.id, Stat::Rejected);
            if info.flags & svc_flags::LOCAL_ONLY != 0 {
                Lookup::NoLocal
            } else {
                Lookup::Reject
            }
        }
    }
}

/// The backend in `slot` of `info`'s group.
#[inline(always)]
fn backend(info: &SvcInfo, slot: u32) -> Option<SvcBackend> {
    // SAFETY: as in `frontend`: groups are written before a frontend names
    // them and removed after none does.
    unsafe {
        SVC_BACKENDS.get(SvcBackendKey {
            group: info.group,
            slot,
        })
    }
    .copied()
}

/// The client's affinity backend if still valid, else a random one (and
/// the affinity recorded).
#[inline(always)]
fn choose(info: &SvcInfo, client: u64) -> Option<SvcBackend> {
    if info.count == 0 {
        return None;
    }
    let affinity = info.flags & svc_flags::AFFINITY != 0;
    let key = SvcAffinityKey {
        client,
        id: info.id,
        _pad: 0,
    };
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    if affinity && let Some(held) = SVC_AFFINITY.get_ptr_mut(key) {
        // SAFETY: a map value pointer from a successful lookup, valid for
        // the program run; a concurrent writer stores a whole choice (a
        // torn read picks a backend that fails the slot check below).
        let (was, slot, last) = unsafe { ((*held).backend, (*held).slot, (*held).last_used) };
        let timeout = u64::from(info.affinity_timeout) * 1_000_000_000;
        if now.wrapping_sub(last) <= timeout
            && slot < info.count
            && backend(info, slot).is_some_and(|b| b == was)
        {
            // SAFETY: as above; a whole u64 store.
            unsafe { (*held).last_used = now };
            count(info.id, Stat::AffinityHits);
            return Some(was);
        }
    }
    // SAFETY: plain helper call.
    let slot = unsafe { bpf_get_prandom_u32() } % info.count;
    let chosen = backend(info, slot)?;
    if affinity {
        let value = SvcAffinity {
            backend: chosen,
            slot,
            _pad: 0,
            last_used: now,
        };
        // Without the record the next choice is random again: the
        // connection itself is not harmed.
        let _ = SVC_AFFINITY.insert(key, value, 0);
    }
    Some(chosen)
}

/// A field of [`SvcCounters`].
#[derive(Clone, Copy)]
pub enum Stat {
    Sockets,
    Flows,
    Rejected,
    AffinityHits,
}

/// Adds one to counter `stat` of Service port `id`.
#[inline(always)]
pub fn count(id: u32, stat: Stat) {
    if let Some(c) = SVC_STATS.get_ptr_mut(id) {
        // SAFETY: a map value pointer from a successful lookup (an array
        // slot), valid for the program run; only a field address is taken.
        let field = unsafe {
            match stat {
                Stat::Sockets => &raw mut (*c).sockets,
                Stat::Flows => &raw mut (*c).flows,
                Stat::Rejected => &raw mut (*c).rejected,
                Stat::AffinityHits => &raw mut (*c).affinity_hits,
            }
        };
        maps::atomic_add(field, 1);
    }
}
