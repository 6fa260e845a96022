//! rivet's datapath. One thin entry program per hook; the logic lives in
//! small modules by concern (the layout of Cilium's `bpf/`):
//!
//! | module | concern |
//! |---|---|
//! | [`packet`] | bounds-checked header access |
//! | [`headers`] | Ethernet, ARP, IPv4 header layouts |
//! | [`maps`] | every map (types from `rivet-common`) |
//! | [`verdict`] | counting and the final TC verdicts, one reason per drop |
//! | [`events`] | drop and flow events for the agent |
//! | [`arp`] | answering ARP for the pod gateway |
//! | [`ipv4`] | IPv4 validation and router behaviour (TTL) |
//! | [`from_pod`] | the pipeline for traffic leaving a pod |
//! | [`from_uplink`] | decapsulation and native delivery at the uplink |
//! | [`from_host`] | the node's own traffic to remote pods |
//! | [`remote`] | MTU, TTL, encap and redirect toward another node |
//! | [`encap`] | adding and removing tunnel headers |
//! | [`fib`] | next-hop lookup and transmit |
//! | [`icmp`] | fragmentation-needed answers |
//! | [`frag`] | the per-pod budget of fragments for the node's stack |
//! | [`nat`] | masquerade on rivet's own connection tracking |
//! | [`nat_icmp`] | ICMP errors about translated flows |
//! | [`policy`] | NetworkPolicy verdicts and the flows they let back |
//! | [`tcp_ts`] | TCP timestamps of masqueraded flows |
//! | [`service`] | Kubernetes Services: frontends, backend choice, affinity |
//! | [`sock`] | Services and hostPorts at the socket (cgroup hooks) |
//! | [`bandwidth`] | pod bandwidth limits: steering through the qdiscs, the egress check |
#![no_std]
#![no_main]
#![feature(core_intrinsics)]
#![expect(
    internal_features,
    reason = "core::intrinsics::atomic_xadd: the BPF target has no CAS, so no AtomicU64::fetch_add"
)]

mod arp;
mod bandwidth;
mod encap;
mod events;
mod fib;
mod frag;
mod from_host;
mod from_pod;
mod from_uplink;
mod headers;
mod icmp;
mod ipv4;
mod maps;
mod nat;
mod nat_icmp;
mod packet;
mod policy;
mod remote;
mod service;
mod sock;
mod stamp;
mod tcp_ts;
mod verdict;

use aya_ebpf::{
    macros::{cgroup_sock, cgroup_sock_addr, classifier},
    programs::{SockAddrContext, SockContext, TcContext},
};

/// TC ingress on a pod's host-side veth: every packet the pod sends.
#[classifier]
pub fn from_pod(ctx: TcContext) -> i32 {
    // NetworkPolicy first, in a call of its own beside the pipeline's (the
    // verifier bounds the stack of a chain of calls).
    // Both take the context by value (one register): this frame stays
    // empty.
    if policy::from_pod(TcContext::new(ctx.skb.skb)) {
        return aya_ebpf::bindings::TC_ACT_SHOT;
    }
    from_pod::handle(ctx)
}

/// TC ingress on the node's uplink: tunnel decapsulation, native delivery;
/// everything else passes untouched.
#[classifier]
pub fn from_uplink(ctx: TcContext) -> i32 {
    let verdict = from_uplink::handle(TcContext::new(ctx.skb.skb));
    if verdict == policy::DEFERRED {
        return policy::finish_uplink(ctx);
    }
    verdict
}

/// TC egress on `rivet_host`: the node's own traffic to remote pods.
#[classifier]
pub fn from_host(ctx: TcContext) -> i32 {
    from_host::handle(&ctx)
}

/// cgroup connect4: pods' and the node's sockets connecting to a Service,
/// the node's to a hostPort.
#[cgroup_sock_addr(connect4)]
pub fn sock_connect4(ctx: SockAddrContext) -> i32 {
    sock::to_pod(&ctx, true)
}

/// cgroup sendmsg4: unconnected UDP datagrams to a Service or hostPort.
#[cgroup_sock_addr(sendmsg4)]
pub fn sock_sendmsg4(ctx: SockAddrContext) -> i32 {
    sock::to_pod(&ctx, false)
}

/// cgroup recvmsg4: answers show the Service or hostPort address.
#[cgroup_sock_addr(recvmsg4)]
pub fn sock_recvmsg4(ctx: SockAddrContext) -> i32 {
    sock::from_pod(&ctx)
}

/// cgroup getpeername4: peers show the Service or hostPort address.
#[cgroup_sock_addr(getpeername4)]
pub fn sock_getpeername4(ctx: SockAddrContext) -> i32 {
    sock::from_pod(&ctx)
}

/// cgroup sock_release: a closing socket's translation record goes.
#[cgroup_sock(sock_release)]
pub fn sock_release(ctx: SockContext) -> i32 {
    sock::released(&ctx)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // SAFETY: the verifier rejects any program that could reach a panic
    // (there is no unwinding in BPF); this handler is never called.
    unsafe { core::hint::unreachable_unchecked() }
}

/// GPL is required for the redirect and FIB helpers.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
