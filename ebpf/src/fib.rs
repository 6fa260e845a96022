//! Sending a packet toward another node: FIB lookup for the next hop, then a
//! redirect out of the egress device with the L2 header filled in (or left to
//! the kernel's neighbour code when the next hop is not resolved): neighbour
//! resolved → MACs from the FIB result and `bpf_redirect(uplink)`; not resolved
//! → `bpf_redirect_neigh` (the kernel resolves and queues).

use aya_ebpf::{
    bindings::{
        BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS, BPF_FIB_LOOKUP_OUTPUT,
        bpf_fib_lookup as FibParams, bpf_fib_lookup__bindgen_ty_1, bpf_fib_lookup__bindgen_ty_2,
        bpf_fib_lookup__bindgen_ty_3, bpf_fib_lookup__bindgen_ty_4, bpf_fib_lookup__bindgen_ty_5,
        bpf_redir_neigh,
    },
    helpers::{bpf_fib_lookup, bpf_redirect, bpf_redirect_neigh},
    programs::TcContext,
};

use crate::{headers::EthHdr, packet::ptr_at};

const AF_INET: u8 = 2;

/// Where the FIB says a packet for `dst` goes.
pub struct NextHop {
    params: FibParams,
    resolved: bool,
}

/// Looks up the route from `src` to `dst` as a locally originated packet,
/// constrained to `oif` (the uplink). `None`: no usable route.
#[inline(always)]
pub fn lookup(ctx: &TcContext, src: u32, dst: u32, oif: u32) -> Option<NextHop> {
    // Every byte written through the widest member of each union. With
    // `mem::zeroed` and field stores after it, the zeroing was a call of
    // the byte-at-a-time BPF `memset` over all 64 bytes on every lookup;
    // this way only the zero runs between the set fields still are (35
    // bytes; volatile word stores would avoid even those, but overflow
    // from_pod's 512-byte stack where the lookup is inlined four times).
    let mut params = FibParams {
        family: AF_INET,
        l4_protocol: 0,
        sport: 0,
        dport: 0,
        __bindgen_anon_1: bpf_fib_lookup__bindgen_ty_1 { tot_len: 0 },
        ifindex: oif,
        __bindgen_anon_2: bpf_fib_lookup__bindgen_ty_2 { rt_metric: 0 },
        // ipv4_src/ipv4_dst are the first word of these.
        __bindgen_anon_3: bpf_fib_lookup__bindgen_ty_3 {
            ipv6_src: [src, 0, 0, 0],
        },
        __bindgen_anon_4: bpf_fib_lookup__bindgen_ty_4 {
            ipv6_dst: [dst, 0, 0, 0],
        },
        __bindgen_anon_5: bpf_fib_lookup__bindgen_ty_5 { tbid: 0 },
        smac: [0; 6],
        dmac: [0; 6],
    };
    // SAFETY: params is a valid, fully initialised parameter block on the
    // stack and its size is passed along.
    let rc = unsafe {
        bpf_fib_lookup(
            ctx.skb.skb.cast(),
            &mut params,
            core::mem::size_of::<FibParams>() as i32,
            BPF_FIB_LOOKUP_OUTPUT,
        )
    };
    match rc as u32 {
        BPF_FIB_LKUP_RET_SUCCESS => Some(NextHop {
            params,
            resolved: true,
        }),
        BPF_FIB_LKUP_RET_NO_NEIGH => Some(NextHop {
            params,
            resolved: false,
        }),
        _ => None,
    }
}

/// Sends the (already encapsulated or rewritten) packet out toward the next
/// hop: MACs from the FIB and a plain redirect when the neighbour is known,
/// otherwise `bpf_redirect_neigh` resolves it.
#[inline(always)]
pub fn transmit(ctx: &TcContext, hop: &NextHop) -> i32 {
    if hop.resolved
        && let Some(eth) = ptr_at::<EthHdr>(ctx, 0)
    {
        // SAFETY: bounds-checked above; alignment 1.
        unsafe {
            (*eth).dst = hop.params.dmac;
            (*eth).src = hop.params.smac;
        }
        // SAFETY: plain helper call.
        return unsafe { bpf_redirect(hop.params.ifindex, 0) } as i32;
    }
    let mut nh = bpf_redir_neigh {
        nh_family: u32::from(AF_INET),
        __bindgen_anon_1: aya_ebpf::bindings::bpf_redir_neigh__bindgen_ty_1 {
            // SAFETY: the lookup filled ipv4_dst with the next hop (the
            // gateway if there is one, else the destination).
            ipv4_nh: unsafe { hop.params.__bindgen_anon_4.ipv4_dst },
        },
    };
    // SAFETY: nh is a valid parameter block on the stack, size passed along.
    unsafe {
        bpf_redirect_neigh(
            hop.params.ifindex,
            &mut nh,
            core::mem::size_of::<bpf_redir_neigh>() as i32,
            0,
        ) as i32
    }
}
