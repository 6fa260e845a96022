//! A per-pod budget for IPv4 fragments that reach the node's stack.
//!
//! The node reassembles every fragment passed to it (addressed to one of
//! its addresses; with conntrack loaded, any it forwards too) in one
//! memory pool per namespace (`ipfrag_high_thresh`, 4 MiB), held until the
//! datagram completes or `ipfrag_time` (30 s) passes. A pod that sends
//! first fragments and never the rest fills it, and every other pod's
//! fragmented datagrams to the node fail. So each pod pays for its
//! fragments from a token bucket (GCRA: one `u64` per pod, the time its
//! bucket is next empty of debt): a fragment costs its frame length plus
//! [`FRAG_COST_OVERHEAD`] — close to what the kernel accounts for it — and
//! one that the bucket cannot pay for is dropped (`drop_frag_budget`). One
//! pod then holds at most `burst + rate × ipfrag_time` bytes of it.
//!
//! Several CPUs may charge one pod at once: charges are atomic adds; only
//! the reset of an idle bucket is a plain write, which can lose a
//! concurrent charge (one fragment, at the start of a burst).

use aya_ebpf::{bindings::BPF_NOEXIST, helpers::bpf_ktime_get_ns, programs::TcContext};
use rivet_common::{Counter, EndpointKey, FRAG_COST_OVERHEAD, tunable};

use crate::{maps, verdict};

const NS_PER_SEC: u64 = 1_000_000_000;

/// Passes a packet of the pod at `pod` to the host stack under `counter`;
/// a fragment (`frag`: flags and offset, host order) is first charged to
/// the pod's budget and dropped if over it.
#[inline(always)]
pub fn pass(ctx: &TcContext, pod: u32, frag: u16, counter: Counter) -> i32 {
    if frag & 0x3fff != 0 && !charge(pod, ctx.len()) {
        return verdict::drop(ctx, Counter::DropFragBudget);
    }
    verdict::pass(ctx, counter)
}

/// Charges one fragment of a `len`-byte frame to the pod at `pod`. False:
/// over budget. A function of its own (a BPF-to-BPF call with scalar
/// arguments): inlined, its locals would push `from_pod`'s one frame past
/// the 512-byte stack.
#[inline(never)]
fn charge(pod: u32, len: u32) -> bool {
    let rate = maps::tunable(tunable::FRAG_RATE);
    if rate == 0 {
        return true;
    }
    // The agent keeps burst ≤ 2^32 and rate ≥ 1: no overflow.
    let tau = maps::tunable(tunable::FRAG_BURST) * NS_PER_SEC / rate;
    let cost = (u64::from(len) + FRAG_COST_OVERHEAD) * NS_PER_SEC / rate;
    // SAFETY: helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let key = EndpointKey { addr: pod };
    let Some(tat) = maps::FRAG_BUDGET.get_ptr_mut(key) else {
        if cost > tau {
            return false;
        }
        if maps::FRAG_BUDGET
            .insert(key, now + cost, u64::from(BPF_NOEXIST))
            .is_err()
            && let Some(tat) = maps::FRAG_BUDGET.get_ptr_mut(key)
        {
            // Another CPU created it meanwhile.
            atomic_add(tat, cost);
        }
        return true;
    };
    // SAFETY: a map value pointer from a successful lookup; a plain read
    // of an aligned u64 (a concurrent atomic add yields the old or the
    // new value).
    let due = unsafe { core::ptr::read_volatile(tat) };
    if due > now {
        // In debt: pay if the debt stays within the burst.
        if due - now + cost > tau {
            return false;
        }
        atomic_add(tat, cost);
    } else {
        if cost > tau {
            return false;
        }
        // SAFETY: as above; an aligned u64 of a live map value.
        unsafe { core::ptr::write_volatile(tat, now + cost) };
    }
    true
}

/// `*v += delta` as one BPF atomic add (see `maps::nat_pod_add`).
#[inline(always)]
fn atomic_add(v: *mut u64, delta: u64) {
    // SAFETY: `v` is a map value pointer from a successful lookup, valid
    // for the program run and 8-byte aligned (map values are).
    unsafe {
        core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(
            v, delta,
        )
    };
}
