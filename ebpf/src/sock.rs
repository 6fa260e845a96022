//! hostPorts for the node's own sockets: cgroup socket-address hooks that send
//! a connect or a datagram aimed at a node address (or loopback) and a hostPort
//! straight to the pod, at the socket, before a packet exists — so 127.0.0.1
//! works without `route_localnet` and nothing is NATed on the wire. Such a
//! packet never crosses an interface rivet owns (loopback), and routing
//! 127.0.0.1 to a pod would need `route_localnet`.
//!
//! `sock_connect4` (TCP, connected UDP) and `sock_sendmsg4` (unconnected UDP)
//! look the destination up — a loopback address in mappings without hostIP
//! (`HOSTPORTS{0, port, proto}`), a node address (`LOCAL_ADDRS`) as
//! `nat::hostport_in` does — and, for a ready endpoint, rewrite it to the pod's
//! address and container port, remembering `{socket cookie, pod, container
//! port} → {address, hostPort}` in `SOCK_REVNAT` (LRU). `sock_recvmsg4` and
//! `sock_getpeername4` show that remembered address instead of the pod's, so a
//! DNS-like client that checks the answer's source, or `getpeername`, sees what
//! it asked for. The pod sees the node's address as the client (the kernel
//! picks the source for the route to the pod).
//!
//! The hooks sit on a cgroup that other network namespaces share (the cgroup2
//! root); each first compares `bpf_get_netns_cookie` with `SOCK_CONFIG`'s
//! cookie (the node namespace's `SO_NETNS_COOKIE`, written by the agent) and
//! leaves every other socket alone — several nodes on one machine each have
//! their own hooks. Every call proceeds. Attaching, pinning and restart:
//! `rivet::datapath::sockhooks`.

use aya_ebpf::{
    EbpfContext as _,
    helpers::{bpf_get_netns_cookie, bpf_get_socket_cookie},
    programs::SockAddrContext,
};
use rivet_common::{SockRevKey, SockRevTarget};

use crate::maps::{self, SOCK_CONFIG, SOCK_REVNAT};

const AF_INET: u32 = 2;
const IPPROTO_TCP: u32 = 6;
const IPPROTO_UDP: u32 = 17;
/// A socket hook's verdict that lets the system call go on.
const PROCEED: i32 = 1;

/// The socket lives in the node's network namespace.
#[inline(always)]
fn in_node_netns(ctx: &SockAddrContext) -> bool {
    let Some(cfg) = SOCK_CONFIG.get(0) else {
        return false;
    };
    // SAFETY: plain helper call on the program's context.
    cfg.netns_cookie != 0 && unsafe { bpf_get_netns_cookie(ctx.as_ptr()) } == cfg.netns_cookie
}

/// `(address, port, protocol)` the call names (wire order), if IPv4
/// TCP/UDP in the node's namespace.
#[inline(always)]
fn target(ctx: &SockAddrContext) -> Option<(u32, u16, u8)> {
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
    if !in_node_netns(ctx) {
        return None;
    }
    Some((addr, port as u16, protocol as u8))
}

/// connect4 / sendmsg4: a hostPort on a node address or on loopback (which
/// only mappings without a hostIP serve) becomes the pod's address and
/// container port.
#[inline(always)]
pub fn to_pod(ctx: &SockAddrContext) -> i32 {
    let Some((addr, port, proto)) = target(ctx) else {
        return PROCEED;
    };
    let mapping = if addr.to_ne_bytes()[0] == 127 {
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
    let key = SockRevKey {
        // SAFETY: plain helper call on the program's context.
        cookie: unsafe { bpf_get_socket_cookie(ctx.as_ptr()) },
        addr: mapping.pod_ip,
        port: mapping.port,
        _pad: 0,
    };
    let asked = SockRevTarget {
        addr,
        port,
        _pad: 0,
    };
    // Without the record only the reverse view is lost (the reply shows
    // the pod's address): the connection itself still works.
    let _ = SOCK_REVNAT.insert(key, asked, 0);
    let sa = ctx.sock_addr;
    // SAFETY: user_ip4 and user_port are writable in connect4 and sendmsg4.
    unsafe {
        (*sa).user_ip4 = mapping.pod_ip;
        (*sa).user_port = u32::from(mapping.port);
    }
    PROCEED
}

/// recvmsg4 / getpeername4: a pod address this socket was sent to instead
/// of a hostPort shows as what the application asked for.
#[inline(always)]
pub fn from_pod(ctx: &SockAddrContext) -> i32 {
    let Some((addr, port, _)) = target(ctx) else {
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
