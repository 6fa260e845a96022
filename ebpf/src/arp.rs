//! ARP from a pod. The pod's only neighbour is its gateway (169.254.1.1 by
//! default), which has no address anywhere: rivet answers for it in BPF with
//! the MAC of the pod's host-side veth, so every packet the pod routes lands on
//! that veth's TC ingress.

use aya_ebpf::programs::TcContext;
use rivet_common::{Counter, EndpointInfo};

use crate::{
    headers::{ARP_HTYPE_ETHER, ARP_OP_REPLY, ARP_OP_REQUEST, ArpHdr, ETH_HLEN, ETH_P_IP, EthHdr},
    maps,
    packet::{addr, ptr_at},
    verdict,
};

/// Handles an ARP frame sent by the pod behind `ifindex`.
#[inline(always)]
pub fn from_pod(ctx: &TcContext, ifindex: u32) -> i32 {
    let (Some(eth), Some(arp)) = (ptr_at::<EthHdr>(ctx, 0), ptr_at::<ArpHdr>(ctx, ETH_HLEN)) else {
        return verdict::drop(ctx, Counter::DropTruncated);
    };
    // SAFETY: both pointers were bounds-checked against data_end just above,
    // and the structs have alignment 1.
    let (eth, arp) = unsafe { (&mut *eth, &mut *arp) };

    if arp.htype != ARP_HTYPE_ETHER || arp.ptype != ETH_P_IP || arp.hlen != 6 || arp.plen != 4 {
        return verdict::drop(ctx, Counter::DropArpUnsupported);
    }
    // The sender must be the endpoint behind this very veth, with its own MAC
    // in both the Ethernet and the ARP header.
    let Some(ep) = maps::endpoint(addr(&arp.spa)) else {
        return verdict::drop(ctx, Counter::DropArpSpoofed);
    };
    if ep.ifindex != ifindex || arp.sha != ep.mac || eth.src != ep.mac {
        return verdict::drop(ctx, Counter::DropArpSpoofed);
    }
    if arp.spa == arp.tpa {
        // Gratuitous ARP: nothing on the node learns from it.
        return verdict::drop(ctx, Counter::DropArpSpoofed);
    }

    if arp.oper == ARP_OP_REPLY {
        // The pod answering the host (which asked for the pod's address).
        return verdict::pass(ctx, Counter::ArpPass);
    }
    let Some(cfg) = maps::config() else {
        return verdict::drop(ctx, Counter::DropNotConfigured);
    };
    if arp.oper != ARP_OP_REQUEST || addr(&arp.tpa) != cfg.gateway {
        return verdict::drop(ctx, Counter::DropArpUnsupported);
    }
    reply(eth, arp, ep);
    verdict::redirect(ctx, ifindex, Counter::ArpReply)
}

/// Turns the request into the gateway's reply, in place.
#[inline(always)]
fn reply(eth: &mut EthHdr, arp: &mut ArpHdr, ep: &EndpointInfo) {
    eth.dst = ep.mac;
    eth.src = ep.host_mac;
    arp.oper = ARP_OP_REPLY;
    let gateway = arp.tpa;
    arp.tha = arp.sha;
    arp.tpa = arp.spa;
    arp.sha = ep.host_mac;
    arp.spa = gateway;
}
