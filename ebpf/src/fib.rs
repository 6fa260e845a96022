//! Sending a packet toward another node: FIB lookup for the next hop, then
//! a redirect out of the egress device with the L2 header filled in (or
//! left to the kernel's neighbour code when the next hop is not resolved).

use aya_ebpf::{
    bindings::{
        BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS, BPF_FIB_LOOKUP_OUTPUT,
        bpf_fib_lookup as FibParams, bpf_redir_neigh,
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
    // SAFETY: an all-zero bpf_fib_lookup is a valid (empty) parameter block.
    let mut params: FibParams = unsafe { core::mem::zeroed() };
    params.family = AF_INET;
    params.ifindex = oif;
    params.__bindgen_anon_3.ipv4_src = src;
    params.__bindgen_anon_4.ipv4_dst = dst;
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
