//! Socket-level translation (cgroup socket-address hooks): a `connect` or
//! an unconnected `sendmsg` is sent to its real destination before a packet
//! exists, and `recvmsg` / `getpeername` show the address the application
//! used. Nothing is NATed on the wire.
//!
//! **Services** ([`crate::service`], scope `INTERNAL`): for the sockets of
//! this node's pods (network namespace cookie in `SOCK_NETNS`) and of the
//! node itself, a ClusterIP, external IP, load-balancer IP or NodePort (on
//! any node's address; on loopback only for the node's sockets) becomes a
//! backend — chosen once per TCP or connected-UDP socket, per datagram for
//! unconnected UDP (each answer still shows the Service address). A frontend
//! without backends fails the call at once (`EPERM`, like Cilium's socket
//! LB) instead of a connection that hangs; counted as the Service port's
//! `rejected`.
//!
//! **hostPorts** for the node's own sockets: a node address (or loopback)
//! and a hostPort becomes the pod's address and container port — so
//! 127.0.0.1 works without `route_localnet`. The pod sees the node's address
//! as the client.
//!
//! Both remember `{socket cookie, real address, real port} → {address,
//! port asked for}` in `SOCK_REVNAT` (LRU); `recvmsg4` and `getpeername4`
//! show what was asked for, so a DNS-like client that checks the answer's
//! source, or `getpeername`, sees what it asked for. `sock_release`
//! removes a closing socket's records — a connected one's, and an
//! unconnected one's last destination (earlier ones of a socket that was
//! sent to several backends are left to the LRU) — so the table holds
//! live sockets: a connection's record is never pushed out by those of
//! closed ones, and no insert has to evict. Without it the table was
//! full of closed connections within seconds of a ClusterIP connection
//! benchmark (65,536 entries), and every connect paid for evictions.
//!
//! The hooks sit on a cgroup that other network namespaces share (the
//! cgroup2 root); each first compares `bpf_get_netns_cookie` with
//! `SOCK_CONFIG`'s cookie (the node namespace's `SO_NETNS_COOKIE`, written
//! by the agent) and `SOCK_NETNS`, and leaves every other socket alone —
//! several nodes on one machine each have their own hooks. Attaching,
//! pinning and restart: `rivet::datapath::sockhooks`.

use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_netns_cookie, bpf_get_socket_cookie},
    programs::{SockAddrContext, SockContext},
};
use rivet_common::{SockRevKey, SockRevTarget, svc_scope};

use crate::{
    maps::{self, SOCK_CONFIG, SOCK_NETNS, SOCK_REVNAT},
    service::{self, Lookup, Nodes},
};

const AF_INET: u32 = 2;
const IPPROTO_TCP: u32 = 6;
const IPPROTO_UDP: u32 = 17;
/// A socket hook's verdict that lets the system call go on.
const PROCEED: i32 = 1;
/// A socket hook's verdict that fails the system call (`EPERM`).
const REJECT: i32 = 0;

/// Whose socket this is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// The node's own (its network namespace).
    Node,
    /// A pod of this node.
    Pod,
}

/// The socket's owner, if it is this node or one of its pods (`ctx`: a
/// socket-address or socket hook's context).
#[inline(always)]
fn owner(ctx: &impl EbpfContext) -> Option<(Owner, u64)> {
    // SAFETY: plain helper call on the program's context.
    let netns = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    if let Some(cfg) = SOCK_CONFIG.get(0)
        && cfg.netns_cookie != 0
        && netns == cfg.netns_cookie
    {
        return Some((Owner::Node, netns));
    }
    // SAFETY: entries are written whole by the agent.
    unsafe { SOCK_NETNS.get(netns) }.map(|_| (Owner::Pod, netns))
}

/// `(address, port, protocol)` the call names (wire order), if IPv4
/// TCP/UDP, and whose socket it is.
#[inline(always)]
fn target(ctx: &SockAddrContext) -> Option<(u32, u16, u8, Owner, u64)> {
    let sa = ctx.sock_addr;
    // SAFETY: the kernel's context for this program type; these fields are
    // readable by every socket-address hook (4-byte loads).
    let (family, protocol, addr, port) = unsafe {
        (
            (*sa).user_family,
            (*sa).protocol,
            (*sa).user_ip4,
            (*sa).user_port,
        )
    };
    if family != AF_INET || (protocol != IPPROTO_TCP && protocol != IPPROTO_UDP) {
        return None;
    }
    let (owner, netns) = owner(ctx)?;
    Some((addr, port as u16, protocol as u8, owner, netns))
}

/// connect4 (`connecting`) / sendmsg4: a Service frontend becomes a
/// backend; for the node's sockets a hostPort on a node address or on
/// loopback (which only mappings without a hostIP serve) becomes the pod's
/// address and container port. An unconnected socket's datagram also
/// leaves `{cookie, 0, 0}` → its real destination, the record
/// [`released`] removes with it.
#[inline(always)]
pub fn to_pod(ctx: &SockAddrContext, connecting: bool) -> i32 {
    let Some((addr, port, proto, owner, netns)) = target(ctx) else {
        return PROCEED;
    };
    let loopback = addr.to_ne_bytes()[0] == 127;
    // A pod's loopback is its own; the node's reaches NodePorts.
    let service_addr = if loopback { 0 } else { addr };
    let lookup = if loopback && owner == Owner::Pod {
        Lookup::None
    } else {
        service::lookup(
            service_addr,
            port,
            proto,
            svc_scope::INTERNAL,
            Nodes::Any,
            netns,
        )
    };
    let (to_addr, to_port) = match lookup {
        Lookup::Reject | Lookup::NoLocal => return REJECT,
        Lookup::Backend(backend, info) => {
            service::count(info.id, service::Stat::Sockets);
            (backend.addr, backend.port)
        }
        Lookup::None => {
            if owner != Owner::Node {
                return PROCEED;
            }
            let mapping = if loopback {
                maps::hostport(0, port, proto)
            } else if maps::is_local_addr(addr) {
                maps::hostport(addr, port, proto)
            } else {
                None
            };
            let Some(mapping) = mapping else {
                return PROCEED;
            };
            if maps::endpoint(mapping.pod_ip).is_none() {
                return PROCEED;
            }
            (mapping.pod_ip, mapping.port)
        }
    };
    let key = SockRevKey {
        // SAFETY: plain helper call on the program's context.
        cookie: unsafe { bpf_get_socket_cookie(ctx.as_ptr()) },
        addr: to_addr,
        port: to_port,
        _pad: 0,
    };
    let asked = SockRevTarget {
        addr,
        port,
        _pad: 0,
    };
    // Without the record only the reverse view is lost (the reply shows
    // the real address): the connection itself still works.
    let _ = SOCK_REVNAT.insert(key, asked, 0);
    if !connecting {
        // An unconnected socket: `released` finds its last record here.
        let last = SockRevKey {
            addr: 0,
            port: 0,
            ..key
        };
        let target = SockRevTarget {
            addr: to_addr,
            port: to_port,
            _pad: 0,
        };
        let _ = SOCK_REVNAT.insert(last, target, 0);
    }
    let sa = ctx.sock_addr;
    // SAFETY: user_ip4 and user_port are writable in connect4 and sendmsg4.
    unsafe {
        (*sa).user_ip4 = to_addr;
        (*sa).user_port = u32::from(to_port);
    }
    PROCEED
}

/// recvmsg4 / getpeername4: an address this socket was sent to instead of
/// a Service frontend or a hostPort shows as what the application asked
/// for.
#[inline(always)]
pub fn from_pod(ctx: &SockAddrContext) -> i32 {
    let Some((addr, port, _, _, _)) = target(ctx) else {
        return PROCEED;
    };
    let key = SockRevKey {
        // SAFETY: plain helper call on the program's context.
        cookie: unsafe { bpf_get_socket_cookie(ctx.as_ptr()) },
        addr,
        port,
        _pad: 0,
    };
    // SAFETY: LRU values are replaced whole; a copy is taken at once.
    if let Some(asked) = unsafe { SOCK_REVNAT.get(key) }.copied() {
        let sa = ctx.sock_addr;
        // SAFETY: user_ip4 and user_port are writable in recvmsg4 and
        // getpeername4.
        unsafe {
            (*sa).user_ip4 = asked.addr;
            (*sa).user_port = u32::from(asked.port);
        }
    }
    PROCEED
}

/// sock_release: a socket of this node or its pods drops its records
/// (`SOCK_REVNAT`, by the socket's cookie): a connected one the record of
/// its destination, an unconnected one the record of the last destination
/// it was sent to instead of a frontend (earlier ones, if it had several,
/// are left to the LRU). A socket that reached plain addresses has none;
/// the deletes find nothing.
#[inline(always)]
pub fn released(ctx: &SockContext) -> i32 {
    let sk = ctx.sock;
    // SAFETY: the kernel's context for this program type; family,
    // protocol, dst_ip4 and dst_port are readable by cgroup socket hooks.
    let (family, protocol, addr, port) =
        unsafe { ((*sk).family, (*sk).protocol, (*sk).dst_ip4, (*sk).dst_port) };
    if family != AF_INET
        || (protocol != IPPROTO_TCP && protocol != IPPROTO_UDP)
        || owner(ctx).is_none()
    {
        return PROCEED;
    }
    let mut key = SockRevKey {
        // SAFETY: plain helper call on the program's context.
        cookie: unsafe { bpf_get_socket_cookie(ctx.as_ptr()) },
        addr: 0,
        port: 0,
        _pad: 0,
    };
    if addr == 0 {
        // SAFETY: LRU values are replaced whole; a copy is taken at once.
        let Some(last) = (unsafe { SOCK_REVNAT.get(key) }).copied() else {
            return PROCEED;
        };
        let _ = SOCK_REVNAT.remove(key);
        key.addr = last.addr;
        key.port = last.port;
    } else {
        key.addr = addr;
        key.port = port;
    }
    // Absent (no translation, or already recycled): nothing to do.
    let _ = SOCK_REVNAT.remove(key);
    PROCEED
}
