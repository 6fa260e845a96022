//! A per-pod budget for IPv4 fragments that reach the node's stack.
//!
//! The node reassembles every fragment passed to it (addressed to one of its
//! addresses; with conntrack loaded, any it forwards too) in one memory pool
//! per namespace (`ipfrag_high_thresh`, 4 MiB), held until the datagram
//! completes or `ipfrag_time` (30 s) passes. A pod that sends first fragments
//! and never the rest fills it, and every other pod's fragmented datagrams to
//! the node fail (measured: 20,000 fragments of 512 B, +17,166 `ReasmFails`,
//! another pod's 3000-byte ping to the node 0 of 3 for ~30 s). So each pod pays
//! for its fragments from a token bucket (`FRAG_BUDGET`, LRU by pod address,
//! one `u64`: the GCRA "theoretical arrival time" in `bpf_ktime_get_ns` ns, the
//! time its bucket is next empty of debt), refilled at `frag_budget_rate`
//! bytes/s up to `frag_budget_burst` bytes (in `TUNABLES`). A fragment costs
//! its frame length plus [`FRAG_COST_OVERHEAD`] (1 KiB: `sk_buff`, shared info,
//! slab rounding, its share of the queue — a 546-byte frame held ≈ 1,480 bytes
//! in the measurement above, a 1,514-byte one ≈ 2.3 KiB): bytes, not fragments,
//! because the kernel accounts reassembly memory by each fragment's true size.
//! One that the bucket cannot pay for is dropped, unchanged
//! (`drop_frag_budget`); whole datagrams and `PassTtl` (TTL ≤ 1) packets are
//! never charged.
//!
//! Arithmetic: a queued fragment lives at most 30 s, so one pod holds at most
//! `burst + rate × 30 s` = 256 KiB + 30 × 32 KiB = 1,216 KiB with the defaults,
//! 29 % of 4 MiB — three flooding pods together still leave 448 KiB; four or
//! more can fill it, as a few hosts on a LAN can fill a server's. Honest
//! traffic: 256 KiB at once (about 18 datagrams of 8 KB — 6 fragments, ≈ 14.5
//! KB of budget each — or 2 of 64 KB), then 32 KiB/s (≈ 2 datagrams of 8 KB per
//! second, 5 pings of 3000 B). A pod sending 10 datagrams of 8 KB every second,
//! sustained, needs `frag_budget_rate` ≈ 150 KB/s, which lets one pod hold the
//! whole pool over 30 s: the two goals conflict, and the default protects the
//! pool. Refunding the budget when a datagram completes was rejected: the
//! datapath cannot see the kernel complete a datagram, and every way the kernel
//! drops a queue (overlap, `ipfrag_max_dist`, timeout, memory pressure, a bad
//! checksum) would turn into credit for queues still held. Operators can tune
//! both knobs (`frag_budget_rate = 0` turns the budget off), or lower
//! `ipfrag_time` / raise `ipfrag_high_thresh` in the node namespace. Pod
//! traffic to the outside never reaches the node's reassembly with masquerade
//! on (fragments are `drop_nat_unsupported`); pod-to-pod fragments are
//! reassembled by the receiving pod's namespace.
//!
//! Several CPUs may charge one pod at once: charges are atomic adds; only the
//! reset of an idle bucket is a plain write, which can lose a concurrent charge
//! (one fragment, at the start of a burst).

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
