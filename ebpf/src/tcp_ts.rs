//! The TCP timestamp option (RFC 7323) of a masqueraded flow: found in the
//! options, shifted by the flow's delta with the checksum balanced.
//!
//! Why: Linux gives every connection a random timestamp offset, so two
//! connections that leave through the same NAT tuple one after the other look
//! to the server like one clock jumping back; its TIME_WAIT socket then refuses
//! the second SYN (PAWS) and the client pays a reset and a retransmission
//! (measured: 464 refusals in 6 s, connections/s down from ~7000 to ~400).
//! Masquerade therefore rewrites TSval on the way out to the node's one clock
//! and TSecr on the way back to the pod's own.
//!
//! How: a flow's first SYN fixes `ts_delta` = node clock − pod TSval (node
//! clock = CLOCK_MONOTONIC ms + `NatConfig.ts_base`, random per node and kept
//! across restarts); TSval is shifted by it on the way out, TSecr back on the
//! way in, checksum balanced. The option is found by the NOP NOP TS fast path
//! or a bounded walk of the options; an odd-aligned option is left alone. The
//! server sees one rising clock per node, so reusing an ended flow's port is
//! safe across pods.

use aya_ebpf::programs::TcContext;

/// TCP option kinds.
const OPT_END: u8 = 0;
const OPT_NOP: u8 = 1;
const OPT_TIMESTAMP: u8 = 8;
const TIMESTAMP_LEN: u8 = 10;
/// The layout Linux, the BSDs and Windows send on every segment after the
/// handshake: NOP, NOP, timestamp.
const NOP_NOP_TS: [u8; 4] = [OPT_NOP, OPT_NOP, OPT_TIMESTAMP, TIMESTAMP_LEN];
/// Options are at most 40 bytes: at most this many steps.
const MAX_OPTIONS: usize = 12;

/// Offset in the frame of TSval (TSecr follows it) of the TCP header at
/// `tcp`, if the segment carries a timestamp at an even offset (the
/// checksum helpers work on 16-bit words; every common stack aligns it).
#[inline(always)]
pub fn find(ctx: &TcContext, tcp: usize) -> Option<usize> {
    let doff = usize::from(ctx.load::<u8>(tcp + 12).ok()? >> 4) * 4;
    if doff < 20 + usize::from(TIMESTAMP_LEN) {
        return None;
    }
    if ctx.load::<[u8; 4]>(tcp + 20).ok()? == NOP_NOP_TS {
        return Some(tcp + 24);
    }
    let mut at = 20;
    for _ in 0..MAX_OPTIONS {
        if at + usize::from(TIMESTAMP_LEN) > doff {
            return None;
        }
        match ctx.load::<u8>(tcp + at).ok()? {
            OPT_END => return None,
            OPT_NOP => at += 1,
            OPT_TIMESTAMP => {
                let ok = ctx.load::<u8>(tcp + at + 1).ok()? == TIMESTAMP_LEN && at % 2 == 0;
                return ok.then_some(tcp + at + 2);
            }
            _ => {
                let len = usize::from(ctx.load::<u8>(tcp + at + 1).ok()?);
                if len < 2 {
                    return None;
                }
                at += len;
            }
        }
    }
    None
}

/// Reads the 32-bit field at `off` (host order).
#[inline(always)]
pub fn read(ctx: &TcContext, off: usize) -> Option<u32> {
    ctx.load::<u32>(off).ok().map(u32::from_be)
}

/// Adds `delta` (mod 2³²) to the 32-bit field at `off`, balancing the TCP
/// checksum at `csum`.
#[inline(always)]
pub fn shift(ctx: &TcContext, off: usize, csum: usize, delta: u32) -> Result<(), ()> {
    let old = ctx.load::<u32>(off).map_err(|_| ())?;
    let new = u32::from_be(old).wrapping_add(delta).to_be();
    ctx.l4_csum_replace(csum, u64::from(old), u64::from(new), 4)
        .map_err(|_| ())?;
    ctx.store(off, &new, 0).map_err(|_| ())
}
