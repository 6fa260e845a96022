//! Pod bandwidth limits (the CNI `bandwidth` capability). The shaping is
//! done by an `htb` qdisc tree per limited direction (small packets first;
//! `userspace/src/endpoint/bandwidth.rs`) — on the pod's own `eth0`
//! (what it sends: the sender's TCP stack feels the queue through TCP
//! small queues and slows down instead of losing packets) and on its
//! host-side veth's egress (what it receives). The agent sets both up;
//! here the datapath makes every path go through them:
//!
//! - **Ingress**: [`deliver`] wraps every delivery into a pod (same node,
//!   decapsulated from other nodes, hostPort and Service translation). A
//!   pod with an ingress limit is reached with `bpf_redirect` to its host
//!   veth's egress — through the qdisc — instead of `bpf_redirect_peer`,
//!   which skips it; what the node's stack routes to the pod goes out of
//!   that veth anyway.
//! - **Egress**: every packet the pod sends has left its `eth0` qdisc.
//!   `from_pod` checks it once more against a token bucket in `BANDWIDTH`
//!   ([`egress_over`], a GCRA at the most the qdisc passes, twice its
//!   queue deep; the agent sets both): traffic the qdisc shaped never exceeds it, so it only drops
//!   (`drop_bandwidth`) what a pod sends around its qdisc (one removed
//!   from inside the pod).
//!
//! A pod without limits pays one flag test per packet.
//!
//! Concurrency: CPUs charge one bucket at once. A charge while in debt is
//! one atomic add to `tat`; only the step from a full bucket to debt is a
//! plain store, so racing CPUs at that instant may each start the debt
//! from now (at most one packet per CPU goes uncharged, once per idle
//! period).

use aya_ebpf::{helpers::bpf_ktime_get_ns, programs::TcContext};
use rivet_common::{Counter, bandwidth_dir, endpoint_flags};

use crate::{
    headers::{ETH_HLEN, IPPROTO_TCP, IPPROTO_UDP, Ipv4Hdr},
    maps::{self, atomic_add},
    packet::ptr_at,
    verdict,
};

const NS_PER_SEC: u64 = 1_000_000_000;

/// True when the pod sending this packet (host-side veth `ifindex`) is
/// over its egress limit: the packet is to be dropped. Only for pods
/// with [`endpoint_flags::BANDWIDTH_EGRESS`].
#[inline(always)]
pub fn egress_over(ctx: &TcContext, ifindex: u32) -> bool {
    over(ifindex, wire_len(ctx))
}

/// Delivers the packet into the pod behind host-side veth `ifindex`,
/// counted under `counter`: `bpf_redirect_peer`, or through the veth's
/// egress qdisc when its endpoint flags `flags` say it has an ingress
/// limit.
#[inline(always)]
pub fn deliver(ctx: &TcContext, ifindex: u32, flags: u32, counter: Counter) -> i32 {
    if flags & endpoint_flags::BANDWIDTH_INGRESS != 0 {
        return verdict::redirect(ctx, ifindex, counter);
    }
    verdict::redirect_peer(ctx, ifindex, counter)
}

/// The bytes the packet takes on the wire: its length, plus for a GSO
/// packet the headers each further segment repeats (the kernel's
/// `qdisc_pkt_len` rule: Ethernet, IPv4 and TCP/UDP headers per segment).
#[inline(always)]
fn wire_len(ctx: &TcContext) -> u32 {
    let len = ctx.len();
    // SAFETY: the context's skb pointer is valid for the program run.
    let segs = unsafe { (*ctx.skb.skb).gso_segs };
    if segs <= 1 {
        return len;
    }
    let Some(ip) = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN) else {
        return len;
    };
    // SAFETY: bounds-checked; alignment 1.
    let (ihl, proto) = unsafe { (u32::from((*ip).version_ihl & 0x0f) * 4, (*ip).protocol) };
    let l4 = match proto {
        IPPROTO_TCP => ctx
            .load::<u8>(ETH_HLEN + ihl as usize + 12)
            .map_or(20, |doff| u32::from(doff >> 4) * 4),
        IPPROTO_UDP => 8,
        _ => 0,
    };
    let hdr = ETH_HLEN as u32 + ihl + l4;
    len.saturating_add((segs - 1).saturating_mul(hdr))
}

/// Charges `wire` bytes to the egress bucket of the pod behind `ifindex`;
/// true when the packet is over the limit (counted in the bucket). A pod
/// with no entry, or a zero rate, is not limited. A function of its own with
/// scalar arguments (a BPF-to-BPF call): its locals stay out of the
/// callers' frames.
#[inline(never)]
fn over(ifindex: u32, wire: u32) -> bool {
    let Some(pod) = maps::BANDWIDTH.get_ptr_mut(ifindex) else {
        return false;
    };
    // SAFETY: a map value pointer from a successful lookup, valid for the
    // program run; a constant index within the array.
    let b = unsafe { core::ptr::addr_of_mut!((*pod).buckets[bandwidth_dir::EGRESS]) };
    // SAFETY: as above; plain reads of aligned u64s the agent writes whole
    // (a concurrent atomic add yields the old or the new value).
    let (rate, depth, due) = unsafe {
        (
            core::ptr::read_volatile(core::ptr::addr_of!((*b).rate)),
            core::ptr::read_volatile(core::ptr::addr_of!((*b).depth_ns)),
            core::ptr::read_volatile(core::ptr::addr_of!((*b).tat)),
        )
    };
    if rate == 0 {
        return false;
    }
    let wire = u64::from(wire);
    let cost = wire * NS_PER_SEC / rate;
    // SAFETY: helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    if due > now {
        if due - now + cost > depth {
            // SAFETY: aligned u64 fields of the live map value.
            unsafe {
                atomic_add(core::ptr::addr_of_mut!((*b).dropped_packets), 1);
                atomic_add(core::ptr::addr_of_mut!((*b).dropped_bytes), wire);
            }
            return true;
        }
        // SAFETY: as above.
        unsafe { atomic_add(core::ptr::addr_of_mut!((*b).tat), cost) };
    } else {
        // SAFETY: as above.
        unsafe { core::ptr::write_volatile(core::ptr::addr_of_mut!((*b).tat), now + cost) };
    }
    // SAFETY: as above.
    unsafe { atomic_add(core::ptr::addr_of_mut!((*b).passed_bytes), wire) };
    false
}
