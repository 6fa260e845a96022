//! rivet's datapath. One thin entry program per hook; the logic lives in
//! small modules by concern (the layout of Cilium's `bpf/`):
//!
//! | module | concern |
//! |---|---|
//! | [`packet`] | bounds-checked header access |
//! | [`headers`] | Ethernet, ARP, IPv4 header layouts |
//! | [`maps`] | every map (types from `rivet-common`) |
//! | [`verdict`] | counting and the final TC verdicts, one reason per drop |
//! | [`arp`] | answering ARP for the pod gateway |
//! | [`ipv4`] | IPv4 validation and router behaviour (TTL) |
//! | [`from_pod`] | the pipeline for traffic leaving a pod |
#![no_std]
#![no_main]

mod arp;
mod from_pod;
mod headers;
mod ipv4;
mod maps;
mod packet;
mod verdict;

use aya_ebpf::{macros::classifier, programs::TcContext};
use rivet_common::Counter;

/// TC ingress on a pod's host-side veth: every packet the pod sends.
#[classifier]
pub fn from_pod(ctx: TcContext) -> i32 {
    from_pod::handle(&ctx)
}

/// TC ingress on the node's uplink. Nothing arrives there for rivet yet
/// (cross-node encapsulation comes later): count and pass, never break the
/// node's own traffic.
#[classifier]
pub fn from_uplink(ctx: TcContext) -> i32 {
    verdict::pass(&ctx, Counter::UplinkPass)
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
