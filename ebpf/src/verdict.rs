//! Final verdicts. Every exit of every program goes through one of these
//! functions, so every decision is counted under exactly one `Counter`.

use aya_ebpf::{
    bindings::{BPF_F_INGRESS, TC_ACT_OK, TC_ACT_SHOT},
    helpers::{bpf_redirect, bpf_redirect_peer},
    programs::TcContext,
};
use rivet_common::Counter;

use crate::{events, fib, maps::STATS};

/// Counts a packet that goes on (forwarded or passed); a flow event if on.
#[inline(always)]
fn count(ctx: &TcContext, counter: Counter) {
    add(ctx, counter);
    events::flow(ctx, counter);
}

#[inline(always)]
fn add(ctx: &TcContext, counter: Counter) {
    if let Some(entry) = STATS.get_ptr_mut(counter.index()) {
        // SAFETY: per-CPU slot of a map value that lives as long as the map;
        // no other program instance runs on this CPU concurrently.
        unsafe {
            (*entry).packets += 1;
            (*entry).bytes += u64::from(ctx.len());
        }
    }
}

/// Let the packet continue into the host stack.
#[inline(always)]
pub fn pass(ctx: &TcContext, counter: Counter) -> i32 {
    count(ctx, counter);
    TC_ACT_OK
}

/// Drop the packet, counted under its reason.
#[inline(always)]
pub fn drop(ctx: &TcContext, reason: Counter) -> i32 {
    add(ctx, reason);
    events::drop(ctx, reason);
    TC_ACT_SHOT
}

/// Deliver into the namespace of the veth peer of `ifindex` (its ingress),
/// skipping the host stack.
#[inline(always)]
pub fn redirect_peer(ctx: &TcContext, ifindex: u32, counter: Counter) -> i32 {
    count(ctx, counter);
    // SAFETY: plain helper call; it only records the target and returns a verdict.
    unsafe { bpf_redirect_peer(ifindex, 0) as i32 }
}

/// Transmit out of `ifindex` (its egress).
#[inline(always)]
pub fn redirect(ctx: &TcContext, ifindex: u32, counter: Counter) -> i32 {
    count(ctx, counter);
    // SAFETY: plain helper call; it only records the target and returns a verdict.
    unsafe { bpf_redirect(ifindex, 0) as i32 }
}

/// Receive on `ifindex` (its ingress), as if it had arrived there.
#[inline(always)]
pub fn redirect_ingress(ctx: &TcContext, ifindex: u32, counter: Counter) -> i32 {
    count(ctx, counter);
    // SAFETY: plain helper call; it only records the target and returns a verdict.
    unsafe { bpf_redirect(ifindex, u64::from(BPF_F_INGRESS)) as i32 }
}

/// Transmit toward the FIB's next hop (another node).
#[inline(always)]
pub fn transmit(ctx: &TcContext, hop: &fib::NextHop, counter: Counter) -> i32 {
    count(ctx, counter);
    fib::transmit(ctx, hop)
}
