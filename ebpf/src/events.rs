//! Datapath events for the agent (`rivetctl monitor`): a 24-byte `Event`
//! (reason = the counter index, ingress ifindex, IPv4 5-tuple — ICMP type/code
//! in the port fields — and length) in the `EVENTS` ring buffer for every drop
//! (`verdict::drop` writes it), and — only while the agent turns them on in
//! `EVENT_CONFIG` — for forwarded and passed packets, one in `flow_sample` (the
//! other verdicts call [`flow`]). Off, a flow event costs one array lookup. A
//! full ring buffer loses the event, never the packet. The flow-event cost is
//! measured in `bench same-node` (variants `rivet+flows`, `rivet+flows/100`).

use aya_ebpf::{EbpfContext as _, helpers::bpf_get_prandom_u32, programs::TcContext};
use rivet_common::{Counter, Event, event_kind};

use crate::{
    headers::{ETH_HLEN, IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_UDP},
    maps::{EVENT_CONFIG, EVENTS},
};

/// EtherType IPv4 as it sits in the frame (wire order, read natively).
const ETH_P_IP_WIRE: u16 = 0x0800u16.to_be();

/// A drop, always reported.
#[inline(always)]
pub fn drop(ctx: &TcContext, reason: Counter) {
    emit(ctx, reason, event_kind::DROP);
}

/// A forwarded or passed packet, reported when flow events are on.
#[inline(always)]
pub fn flow(ctx: &TcContext, counter: Counter) {
    let Some(cfg) = EVENT_CONFIG.get(0) else {
        return;
    };
    let sample = cfg.flow_sample;
    if sample == 0 {
        return;
    }
    // SAFETY: plain helper call.
    if sample > 1 && unsafe { bpf_get_prandom_u32() } % sample != 0 {
        return;
    }
    emit(ctx, counter, event_kind::FLOW);
}

/// NetworkPolicy allowed a new flow in direction `dir` (`policy_dir`):
/// reported while the agent asks (`tunable::POLICY_EVENTS`, set while a
/// monitor client listens), once per flow, with the number of the policy
/// that allowed it in place of the length.
#[inline(always)]
pub fn policy(ctx: &TcContext, dir: u8, policy: u32) {
    if crate::maps::tunable(rivet_common::tunable::POLICY_EVENTS) == 0 {
        return;
    }
    write(ctx, u16::from(dir), event_kind::POLICY, policy);
}

#[inline(always)]
fn emit(ctx: &TcContext, counter: Counter, kind: u8) {
    write(ctx, counter.index() as u16, kind, ctx.len());
}

#[inline(always)]
fn write(ctx: &TcContext, counter: u16, kind: u8, len: u32) {
    // SAFETY: `ctx.as_ptr()` is the program's __sk_buff, valid for its run.
    let ifindex = unsafe { (*(ctx.as_ptr() as *const aya_ebpf::bindings::__sk_buff)).ifindex };
    let mut ev = Event {
        kind,
        counter,
        ifindex,
        len,
        ..Event::default()
    };
    if ctx.load::<u16>(12).is_ok_and(|p| p == ETH_P_IP_WIRE) {
        tuple(ctx, &mut ev);
    }
    let _ = EVENTS.output::<Event>(&ev, 0);
}

/// Fills the IPv4 5-tuple (ICMP: type and code as the ports) from what the
/// packet holds; fields it cannot read stay 0.
#[inline(always)]
fn tuple(ctx: &TcContext, ev: &mut Event) {
    let Ok(vihl) = ctx.load::<u8>(ETH_HLEN) else {
        return;
    };
    ev.proto = ctx.load::<u8>(ETH_HLEN + 9).unwrap_or(0);
    ev.src = ctx.load::<u32>(ETH_HLEN + 12).unwrap_or(0);
    ev.dst = ctx.load::<u32>(ETH_HLEN + 16).unwrap_or(0);
    let l4 = ETH_HLEN + usize::from(vihl & 0x0f) * 4;
    match ev.proto {
        IPPROTO_TCP | IPPROTO_UDP => {
            if let Ok(p) = ctx.load::<[u8; 4]>(l4) {
                ev.sport = u16::from_ne_bytes([p[0], p[1]]);
                ev.dport = u16::from_ne_bytes([p[2], p[3]]);
            }
        }
        IPPROTO_ICMP => {
            if let Ok(t) = ctx.load::<[u8; 2]>(l4) {
                ev.sport = u16::from(t[0]);
                ev.dport = u16::from(t[1]);
            }
        }
        _ => {}
    }
}
