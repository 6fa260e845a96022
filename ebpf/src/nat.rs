//! Masquerade (SNAT) on rivet's own connection tracking. Pod traffic that
//! leaves the cluster gets the node's address and a source port from the NAT
//! range; replies are translated back and delivered to the pod. Nothing here
//! touches netfilter: the translated packet goes straight out of the uplink and
//! replies straight into the pod, so `nf_conntrack` never sees these flows.
//! Reads and writes `NAT` (LRU hash) and `NAT_PODS`; reads `NAT_CONFIG`,
//! `NAT_LIMITS`, `NO_MASQ`, `ENDPOINTS`, `HOSTPORTS`.
//!
//! Each flow has two entries in `NAT`: the pod's tuple (egress: write the node
//! address and NAT port as source) and the reply's tuple (write the pod's
//! address and port as destination). The agent expires idle entries
//! (`rivet::nat`, the collector).
//!
//! # Egress (pod → outside, from `from_pod`)
//!
//! The route (`bpf_fib_lookup`) is looked up first — no route → `drop_no_route`
//! with no flow created and the packet unchanged; the parser takes layer 4 only
//! within the datagram's total length. ICMP other than an echo request starts
//! no flow: an error about a packet that reached the pod through one of its
//! flows leaves like the flow ([`crate::nat_icmp`]); anything else (echo reply,
//! error about an unknown flow or to someone else, another type) →
//! `drop_nat_icmp_unknown`. The layer-4 header is parsed at the real IHL — TCP
//! and UDP ports, ICMP echo request identifier; fragments (MF or offset) and
//! other protocols → `drop_nat_unsupported` (a pod address never leaves
//! untranslated).
//!
//! The pod's tuple `{src, dst, sport, dport, proto, dir=egress}` is looked up;
//! on a miss a port is claimed: from a random start in the range, up to
//! `NAT_PROBES` (32) ports in turn, the *reply* tuple `{dst, node_ip, dport,
//! port, proto, dir=reply} → {pod ip, pod port}` is inserted with `BPF_NOEXIST`
//! — the first that succeeds is ours (two flows can never share a reply tuple)
//! — then the egress entry `→ {node_ip, port}`. A port whose reply tuple is
//! held by a TCP flow that *ended* (a FIN each way, or a reset) at least 250 ms
//! ago is taken over (its egress entry removed, its reply entry overwritten),
//! as conntrack lets a SYN reopen a TIME_WAIT tuple. So is a port held by
//! **another pod's** flow that was never answered (no reply, FIN or RST) and
//! has been idle 5 s (`NAT_UNANSWERED_REUSE_NS`): a pod cannot recycle its own
//! stale flows, so a pod flooding one destination with unanswered connections
//! gets the port range once — its further SYNs are `drop_nat_no_port` — while
//! other pods take its ports after 5 s; the flow losing its port loses nothing
//! (never answered, its next packet starts a new flow). Counted in
//! `NAT_STATS[UNANSWERED_TAKEN]`. None free → `drop_nat_no_port`.
//!
//! Before any port is claimed, the pod's quota: `NAT_PODS[pod, FLOWS] +
//! NAT_PODS[pod, ADJUST]` ≥ `NAT_LIMITS.max_per_pod` (`nat_max_per_pod`,
//! default `nat_max_entries / 8` = a quarter of the table's flows; 0 = none) →
//! `drop_nat_quota`, packet unchanged — one pod cannot flush the others' flows
//! out of the LRU table. A created flow adds 1 to `NAT_PODS[pod, FLOWS]` (a BPF
//! atomic add); a taken-over flow subtracts 1 from its old pod's. A SYN on an
//! existing egress entry whose flow ended (the pod reusing its port) reopens
//! it: both entries' flags are reset, so the port is not handed away while the
//! new connection runs.
//!
//! Then the TCP timestamps are shifted ([`crate::tcp_ts`]), TTL − 1, source
//! address and port rewritten with `bpf_l3_csum_replace` /
//! `bpf_l4_csum_replace` (pseudo-header flag for the address; UDP zero checksum
//! kept zero; ICMP: identifier only), `bpf_fib_lookup` from the node IP and
//! redirect out of the uplink (`fwd_snat`). The packet never enters the host
//! stack. `last_seen` (`bpf_ktime_get_ns`, refreshed at most once a second) and
//! TCP SYN/FIN/RST flags are kept on the entries.
//!
//! # Reply (at `from_uplink`, destination the node IP, after the tunnel checks)
//!
//! `{src, node_ip, sport, dport, proto, dir=reply}` is looked up (ICMP echo
//! reply: the identifier is `dport`); found → destination rewritten to the
//! pod's address and port, delivered like a decapsulated packet (TTL − 1, MACs,
//! `bpf_redirect_peer`: `rev_snat`), the entry marked `SEEN` (the flow was
//! answered). ICMP errors to the node about a flow are translated back by
//! [`crate::nat_icmp`]. Not found but TCP/UDP to a port in the NAT range →
//! `pass_nat_no_state` (an expired or evicted flow — or a socket of the node's
//! own: the stack decides); anything else is not NAT's.
//!
//! # hostPorts (`hostport_in` / `hostport_reply`)
//!
//! The agent writes `HOSTPORTS{addr (0 = every node address), port, proto} →
//! {pod ip, container port}` for each TCP/UDP `portMapping` of a ready endpoint
//! (at ADD, removed at DEL/GC, made exact by every reconciliation) and sets the
//! endpoint's `HOSTPORTS` flag. A TCP/UDP packet addressed to one of the node's
//! own addresses — at `from_uplink` (after the tunnel checks), or at `from_pod`
//! from a sibling pod — that hits a mapping records the reply tuple `{pod ip,
//! client, container port, client port, proto, dir=dnat} → {node address,
//! hostPort}` in `NAT`, gets its destination rewritten and is delivered to the
//! pod (`fwd_dnat`); the client's address is kept, so the pod sees the real
//! client (an outside host, another node, a sibling pod). Transit traffic and
//! other addresses never match: only the node's addresses are looked up. A pod
//! with the flag has each of its TCP/UDP packets looked up as a possible reply
//! first: a hit gets its source rewritten back to the node address and hostPort
//! and goes to the client — a local pod (`bpf_redirect_peer`) or out of the
//! uplink (`rev_dnat`). A client's new SYN on an ended entry resets it; the
//! entry records the pod's FIN as `FIN_POD`, the client's as `FIN`.
//!
//! A pod reaching its own hostPort (hairpin) also gets its source rewritten to
//! its gateway (169.254.1.1), since a pod cannot take a packet from its own
//! address; its answer to the gateway is matched by the same entry and both
//! addresses restored — that pod sees 169.254.1.1 as the client. SCTP mappings
//! are refused at ADD, as are hostPorts inside the NAT source range or on the
//! VXLAN UDP port. A pod reaching another node's hostPort travels through the
//! overlay to that node (see [`crate::from_pod`]), so the hostPort pod there
//! sees the remote pod's address.

use aya_ebpf::{
    bindings::{BPF_ANY, BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR, BPF_NOEXIST},
    helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns},
    programs::TcContext,
};
use rivet_common::{
    AFFINITY_BY_ADDR, Counter, EndpointInfo, NAT_PROBES, NAT_UNANSWERED_REUSE_NS, NatConfig,
    NatEntry, NatKey, NodeConfig, RouteInfo, nat_dir, nat_flags, nat_stat, svc_scope,
};

use crate::headers::EthHdr;

use crate::{
    fib,
    headers::{ETH_HLEN, IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_UDP, Ipv4Hdr},
    icmp, ipv4,
    maps::{self, NAT},
    packet::ptr_at,
    service::{self, Lookup, Nodes},
    tcp_ts, verdict,
};

const ICMP_ECHO_REPLY: u8 = 0;
pub const ICMP_ECHO_REQUEST: u8 = 8;
/// Offsets of the IPv4 checksum, source and destination in the frame.
pub const IP_CSUM: usize = ETH_HLEN + 10;
pub const IP_SRC: usize = ETH_HLEN + 12;
pub const IP_DST: usize = ETH_HLEN + 16;
const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
/// Refresh `last_seen` at most this often (ns): one write per second, not
/// one per packet.
const TOUCH_NS: u64 = 1_000_000_000;
/// A TCP flow's NAT port may go to a new flow of the same pod this long
/// (ns) after the flow ended: the closing handshake's last ACK, even over
/// an intercontinental round trip, has arrived by then.
const REUSE_NS: u64 = 250_000_000;

/// What an IPv4 packet's header says, read before anything is rewritten.
#[derive(Clone, Copy)]
pub struct Ip {
    /// Source address (wire order).
    pub src: u32,
    /// Destination address (wire order).
    pub dst: u32,
    /// Protocol.
    pub proto: u8,
    /// Header length in bytes (20..=60, validated).
    pub hlen: usize,
    /// Flags and fragment offset, host order.
    pub frag: u16,
}

/// The layer-4 facts NAT needs.
#[derive(Clone, Copy)]
struct L4 {
    proto: u8,
    /// Offset of the layer-4 header in the frame.
    off: usize,
    /// Ports in wire order (ICMP echo: the identifier on the side that
    /// chose it, 0 on the other).
    sport: u16,
    dport: u16,
    /// [`nat_flags`] of this packet (TCP).
    flags: u16,
}

impl L4 {
    const fn csum_off(&self) -> usize {
        match self.proto {
            IPPROTO_TCP => self.off + 16,
            IPPROTO_UDP => self.off + 6,
            _ => self.off + 2,
        }
    }

    /// Offset of the port NAT rewrites: the source port going out, the
    /// destination port coming back, the echo identifier either way.
    const fn port_off(&self, reply: bool) -> usize {
        match (self.proto, reply) {
            (IPPROTO_ICMP, _) => self.off + 4,
            (_, false) => self.off,
            (_, true) => self.off + 2,
        }
    }
}

/// Reads the layer-4 header. `None`: NAT cannot handle this packet (a
/// fragment, another protocol, an ICMP message other than echo).
#[inline(always)]
fn parse(ctx: &TcContext, ip: &Ip, reply: bool) -> Option<L4> {
    if ip.frag & 0x3fff != 0 {
        return None;
    }
    // What the datagram holds after its header (the frame may go on with
    // Ethernet padding, which is no transport header).
    let hdr = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN)?;
    // SAFETY: bounds-checked; alignment 1.
    let l4_len = usize::from(u16::from_be_bytes(unsafe { (*hdr).tot_len })).saturating_sub(ip.hlen);
    let need = if ip.proto == IPPROTO_TCP { 20 } else { 8 };
    if l4_len < need {
        return None;
    }
    let off = ETH_HLEN + ip.hlen;
    let mut l4 = L4 {
        proto: ip.proto,
        off,
        sport: 0,
        dport: 0,
        flags: 0,
    };
    match ip.proto {
        IPPROTO_TCP | IPPROTO_UDP => {
            let ports = ctx.load::<[u8; 4]>(off).ok()?;
            l4.sport = u16::from_ne_bytes([ports[0], ports[1]]);
            l4.dport = u16::from_ne_bytes([ports[2], ports[3]]);
            if ip.proto == IPPROTO_TCP {
                let f = ctx.load::<u8>(off + 13).ok()?;
                l4.flags = (u16::from(f & TCP_SYN != 0) * nat_flags::SYN)
                    | (u16::from(f & TCP_FIN != 0) * nat_flags::FIN)
                    | (u16::from(f & TCP_RST != 0) * nat_flags::RST);
            }
        }
        IPPROTO_ICMP => {
            let icmp_type = ctx.load::<u8>(off).ok()?;
            let id = u16::from_ne_bytes(ctx.load::<[u8; 2]>(off + 4).ok()?);
            let want = if reply {
                ICMP_ECHO_REPLY
            } else {
                ICMP_ECHO_REQUEST
            };
            if icmp_type != want {
                return None;
            }
            if reply {
                l4.dport = id;
            } else {
                l4.sport = id;
            }
        }
        _ => return None,
    }
    Some(l4)
}

/// Records that a packet used `entry` now. A packet that adds a flag (a
/// SYN, FIN or RST) always stamps the time: "closed since" is exact.
#[inline(always)]
fn touch(entry: *mut NatEntry, now: u64, flags: u16) {
    // SAFETY: a map value pointer from a successful lookup, valid for the
    // program run; concurrent writers on other CPUs only ever store whole
    // timestamps and OR flags, so a lost update costs at most a second of
    // idle time or one flag that the next packet sets again.
    unsafe {
        let new_flag = (*entry).flags & flags != flags;
        if new_flag || now.wrapping_sub((*entry).last_seen) > TOUCH_NS {
            (*entry).last_seen = now;
        }
        if new_flag {
            (*entry).flags |= flags;
        }
    }
}

/// Refreshes a DNAT entry with a packet of the pod's answer: one entry
/// serves both directions, so the pod's FIN has its own bit; the entry is
/// marked answered.
#[inline(always)]
fn touch_answered(entry: *mut NatEntry, l4: &L4) {
    let flags = (l4.flags & !nat_flags::FIN)
        | (u16::from(l4.flags & nat_flags::FIN != 0) * nat_flags::FIN_POD);
    // SAFETY: plain helper call.
    touch(
        entry,
        unsafe { bpf_ktime_get_ns() },
        flags | nat_flags::SEEN,
    );
}

/// Whether a TCP flow with these per-direction flags has ended: a reset,
/// or a FIN each way.
#[inline(always)]
const fn closed(out: u16, back: u16) -> bool {
    (out | back) & nat_flags::RST != 0 || out & back & nat_flags::FIN != 0
}

/// A new SYN on an ended flow's tuple (the pod reusing its port, as
/// `tcp_tw_reuse` does) starts the flow afresh, as conntrack reopens a
/// TIME_WAIT entry: both directions forget the old flags (so the port is
/// not handed to another flow while this one runs) and take the new
/// connection's timestamp delta.
#[inline(always)]
fn reopen(entry: *mut NatEntry, key: &NatKey, node_ip: u32, now: u64, ts_delta: u32) {
    // SAFETY: as in `touch`.
    let port = unsafe {
        if (*entry).flags & (nat_flags::FIN | nat_flags::RST) == 0 {
            return;
        }
        (*entry).flags = nat_flags::SYN;
        (*entry).last_seen = now;
        (*entry).ts_delta = ts_delta;
        (*entry).port
    };
    let rkey = NatKey::new(
        key.dst,
        node_ip,
        (key.dport, port),
        key.proto,
        nat_dir::REPLY,
    );
    if let Some(back) = NAT.get_ptr_mut(rkey) {
        // SAFETY: as in `touch`.
        unsafe {
            (*back).flags = 0;
            (*back).last_seen = now;
            (*back).ts_delta = ts_delta;
        }
    }
}

/// Takes over the reply tuple `rkey` for the new flow `key` (its reply
/// entry `back`) if the flow holding it
/// - is a TCP flow that ended at least `REUSE_NS` ago — what conntrack
///   does when a SYN meets a TIME_WAIT tuple. The server's TIME_WAIT
///   socket accepts the new SYN because the timestamps it sees on the
///   tuple come from the node's one clock ([`tcp_ts`]); or
/// - belongs to another pod, was never answered (no packet came back, no
///   FIN or RST) and has been idle for `NAT_UNANSWERED_REUSE_NS`: a pod
///   flooding one destination with connections nobody answers cannot
///   keep its ports from the other pods for the whole unanswered timeout.
///   Its own flood cannot recycle them (the flows must be another pod's),
///   so once the range is taken, its new flows are dropped while the
///   others' take over its stale ones. The old flow loses nothing it had:
///   its next packet (a SYN retransmission) starts a new flow.
///
/// The old pod's flow count goes down by one. Returns how many entries
/// were replaced or removed.
#[inline(always)]
fn take_over(rkey: &NatKey, key: &NatKey, back: &NatEntry, now: u64) -> Option<u64> {
    let old = NAT.get_ptr(rkey)?;
    // SAFETY: a map value pointer from a successful lookup; plain copies.
    let (pod, pod_port, back_flags, back_seen) =
        unsafe { ((*old).addr, (*old).port, (*old).flags, (*old).last_seen) };
    let okey = NatKey::new(
        pod,
        key.dst,
        (pod_port, key.dport),
        key.proto,
        nat_dir::EGRESS,
    );
    // SAFETY: as above.
    let out = NAT
        .get_ptr(okey)
        .map(|e| unsafe { ((*e).flags, (*e).last_seen) });
    let (out_flags, out_seen) = out.unwrap_or((0, 0));
    let idle = now.wrapping_sub(if out_seen > back_seen {
        out_seen
    } else {
        back_seen
    });
    let ended = key.proto == IPPROTO_TCP && closed(out_flags, back_flags) && idle >= REUSE_NS;
    let unanswered = !ended
        && pod != key.src
        && (out_flags | back_flags) & (nat_flags::SEEN | nat_flags::FIN | nat_flags::RST) == 0
        && idle >= NAT_UNANSWERED_REUSE_NS;
    if !ended && !unanswered {
        return None;
    }
    let mut replaced = 1;
    if out.is_some() && NAT.remove(okey).is_ok() {
        replaced += 1;
        maps::nat_pod_add(pod, u64::MAX);
    }
    NAT.insert(rkey, *back, u64::from(BPF_ANY)).ok()?;
    if unanswered {
        maps::nat_stat_add(nat_stat::UNANSWERED_TAKEN);
    }
    Some(replaced)
}

/// Rewrites one address and one port with incremental checksum updates
/// (RFC 1624, by the kernel's helpers: correct for CHECKSUM_PARTIAL too).
#[inline(always)]
fn rewrite(
    ctx: &TcContext,
    l4: &L4,
    reply: bool,
    (old_addr, new_addr): (u32, u32),
    (old_port, new_port): (u16, u16),
) -> Result<(), Counter> {
    let fail = |_| Counter::DropNatRewrite;
    let csum = l4.csum_off();
    let (from_a, to_a) = (u64::from(old_addr), u64::from(new_addr));
    let (from_p, to_p) = (u64::from(old_port), u64::from(new_port));
    match l4.proto {
        IPPROTO_TCP => {
            ctx.l4_csum_replace(csum, from_a, to_a, u64::from(BPF_F_PSEUDO_HDR) | 4)
                .map_err(fail)?;
            ctx.l4_csum_replace(csum, from_p, to_p, 2).map_err(fail)?;
        }
        IPPROTO_UDP => {
            // A zero UDP checksum means "none" and stays zero.
            let mangled = u64::from(BPF_F_MARK_MANGLED_0);
            ctx.l4_csum_replace(
                csum,
                from_a,
                to_a,
                mangled | u64::from(BPF_F_PSEUDO_HDR) | 4,
            )
            .map_err(fail)?;
            ctx.l4_csum_replace(csum, from_p, to_p, mangled | 2)
                .map_err(fail)?;
        }
        // ICMP has no pseudo-header: only the identifier counts.
        _ => ctx.l4_csum_replace(csum, from_p, to_p, 2).map_err(fail)?,
    }
    ctx.store(l4.port_off(reply), &new_port, 0).map_err(fail)?;
    ctx.l3_csum_replace(IP_CSUM, from_a, to_a, 4)
        .map_err(fail)?;
    let addr_off = if reply { IP_DST } else { IP_SRC };
    ctx.store(addr_off, &new_addr, 0).map_err(fail)
}

/// Rewrites one address only (source or destination, TCP/UDP): the IPv4
/// checksum and the transport checksum's pseudo-header part.
#[inline(always)]
fn rewrite_addr(
    ctx: &TcContext,
    l4: &L4,
    dst: bool,
    (old, new): (u32, u32),
) -> Result<(), Counter> {
    let fail = |_| Counter::DropNatRewrite;
    let (from, to) = (u64::from(old), u64::from(new));
    let mangled = if l4.proto == IPPROTO_UDP {
        u64::from(BPF_F_MARK_MANGLED_0)
    } else {
        0
    };
    ctx.l4_csum_replace(
        l4.csum_off(),
        from,
        to,
        mangled | u64::from(BPF_F_PSEUDO_HDR) | 4,
    )
    .map_err(fail)?;
    ctx.l3_csum_replace(IP_CSUM, from, to, 4).map_err(fail)?;
    ctx.store(if dst { IP_DST } else { IP_SRC }, &new, 0)
        .map_err(fail)
}

/// Claims a NAT port for a new flow: its reply entry goes in first, only
/// if that reply tuple is free, then its egress entry. Returns the port
/// (wire order).
#[inline(always)]
fn allocate(
    key: &NatKey,
    node_ip: u32,
    nat: &NatConfig,
    now: u64,
    (flags, ts_delta): (u16, u32),
) -> Result<u16, Counter> {
    // The pod's quota first: one pod cannot push the others' flows out of
    // the LRU table. The packet leaves unchanged.
    let quota = maps::nat_max_per_pod();
    if quota != 0 && maps::nat_pod_flows(key.src) >= u64::from(quota) {
        return Err(Counter::DropNatQuota);
    }
    let (min, max) = (u32::from(nat.port_min), u32::from(nat.port_max));
    // SAFETY: plain helper call.
    let mut port = min + unsafe { bpf_get_prandom_u32() } % (max - min + 1);
    let back = NatEntry {
        addr: key.src,
        port: key.sport,
        flags: 0,
        last_seen: now,
        ts_delta,
        _pad: 0,
    };
    let mut rkey = NatKey::new(key.dst, node_ip, (key.dport, 0), key.proto, nat_dir::REPLY);
    for _ in 0..NAT_PROBES {
        let wire = (port as u16).to_be();
        rkey.dport = wire;
        let replaced = if NAT.insert(rkey, back, u64::from(BPF_NOEXIST)).is_ok() {
            Some(0)
        } else {
            take_over(&rkey, key, &back, now)
        };
        if let Some(replaced) = replaced {
            let out = NatEntry {
                addr: node_ip,
                port: wire,
                flags,
                last_seen: now,
                ts_delta,
                _pad: 0,
            };
            if NAT.insert(key, out, u64::from(BPF_ANY)).is_err() {
                let _ = NAT.remove(rkey);
                return Err(Counter::DropNatInsertFailed);
            }
            if replaced < 2 {
                maps::nat_created(2 - replaced);
            }
            maps::nat_pod_add(key.src, 1);
            return Ok(wire);
        }
        port = if port >= max { min } else { port + 1 };
    }
    Err(Counter::DropNatNoPort)
}

/// Masquerades a pod's packet leaving the cluster and sends it out of the
/// uplink. The caller has validated the header and checked TTL > 1; a
/// dropped packet leaves unchanged.
#[inline(always)]
pub fn egress(ctx: &TcContext, cfg: &NodeConfig, nat: &NatConfig, ip: &Ip) -> i32 {
    // ICMP other than an echo request starts no flow of the pod's own:
    // an error about a packet that reached the pod through one of its
    // flows leaves translated like the flow; anything else (an echo
    // reply, an error about an unknown flow, another type) would leave
    // with the pod's address and is dropped.
    if ip.proto == IPPROTO_ICMP
        && ip.frag & 0x3fff == 0
        && ctx
            .load::<u8>(ETH_HLEN + ip.hlen)
            .is_ok_and(|t| t != ICMP_ECHO_REQUEST)
    {
        return crate::nat_icmp::snat_error_out(ctx, cfg, ip)
            .unwrap_or_else(|| verdict::drop(ctx, Counter::DropNatIcmpUnknown));
    }
    let Some(l4) = parse(ctx, ip, false) else {
        return verdict::drop(ctx, Counter::DropNatUnsupported);
    };
    // The route first: a packet that cannot leave creates no flow and is
    // dropped as it came.
    let Some(hop) = fib::lookup(ctx, cfg.node_ip, ip.dst, cfg.uplink_ifindex) else {
        return verdict::drop(ctx, Counter::DropNoRoute);
    };
    let key = NatKey::new(
        ip.src,
        ip.dst,
        (l4.sport, l4.dport),
        ip.proto,
        nat_dir::EGRESS,
    );
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    let ts = if ip.proto == IPPROTO_TCP {
        tcp_ts::find(ctx, l4.off)
    } else {
        None
    };
    // A connection's first SYN fixes its timestamp delta: from the pod's
    // clock to the node's.
    let syn_delta = match ts {
        Some(off) if l4.flags & nat_flags::SYN != 0 => {
            tcp_ts::read(ctx, off).map_or(0, |tsval| node_clock(nat, now).wrapping_sub(tsval))
        }
        _ => 0,
    };
    let (port, ts_delta) = match NAT.get_ptr_mut(key) {
        Some(entry) => {
            if l4.flags & nat_flags::SYN != 0 {
                reopen(entry, &key, cfg.node_ip, now, syn_delta);
            }
            touch(entry, now, l4.flags);
            // SAFETY: as in `touch`; the port of an entry never changes,
            // its delta only when the flow reopens (this CPU, above).
            unsafe { ((*entry).port, (*entry).ts_delta) }
        }
        None => match allocate(&key, cfg.node_ip, nat, now, (l4.flags, syn_delta)) {
            Ok(port) => (port, syn_delta),
            Err(reason) => return verdict::drop(ctx, reason),
        },
    };
    // Routed like a router would: TTL − 1 (the caller checked it is > 1),
    // only now that the packet is sure to leave.
    if let Some(hdr) = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN) {
        // SAFETY: bounds-checked; alignment 1; no helper ran since.
        ipv4::decrease_ttl(unsafe { &mut *hdr });
    }
    if let Err(reason) = rewrite(ctx, &l4, false, (ip.src, cfg.node_ip), (l4.sport, port)) {
        return verdict::drop(ctx, reason);
    }
    if let (Some(off), true) = (ts, ts_delta != 0)
        && tcp_ts::shift(ctx, off, l4.csum_off(), ts_delta).is_err()
    {
        return verdict::drop(ctx, Counter::DropNatRewrite);
    }
    verdict::transmit(ctx, &hop, Counter::FwdSnat)
}

/// What to do with a packet addressed to the node.
pub enum Reply {
    /// Not a masqueraded flow's: handle it as before.
    NotOurs,
    /// Translated back: deliver to this pod.
    Deliver(EndpointInfo),
    /// Decided here (the returned TC verdict).
    Done(i32),
}

/// Translates a reply to a masqueraded flow back to the pod's tuple.
#[inline(always)]
pub fn reply(ctx: &TcContext, cfg: &NodeConfig, nat: &NatConfig, ip: &Ip) -> Reply {
    let Some(l4) = parse(ctx, ip, true) else {
        return Reply::NotOurs;
    };
    let key = NatKey::new(
        ip.src,
        cfg.node_ip,
        (l4.sport, l4.dport),
        ip.proto,
        nat_dir::REPLY,
    );
    let in_range = (nat.port_min..=nat.port_max).contains(&u16::from_be(l4.dport));
    let Some(entry) = NAT.get_ptr_mut(key) else {
        // TCP/UDP to the NAT range without state: a flow that expired or
        // was evicted — or a socket of the node's own: the stack decides.
        if in_range && ip.proto != IPPROTO_ICMP {
            return Reply::Done(verdict::pass(ctx, Counter::PassNatNoState));
        }
        return Reply::NotOurs;
    };
    // SAFETY: plain helper call.
    touch(
        entry,
        unsafe { bpf_ktime_get_ns() },
        l4.flags | nat_flags::SEEN,
    );
    // SAFETY: as in `touch`; address and port of an entry never change.
    let (pod_ip, pod_port, ts_delta) = unsafe { ((*entry).addr, (*entry).port, (*entry).ts_delta) };
    let Some(ep) = maps::endpoint(pod_ip) else {
        // Not a pod's flow: a Service flow's answer from a backend on
        // another node, if the frontend was recorded for it.
        return match service_answer(ctx, cfg, ip, &l4, (pod_ip, pod_port)) {
            Some(verdict) => Reply::Done(verdict),
            None => Reply::Done(verdict::pass(ctx, Counter::PassNatNoState)),
        };
    };
    let ep = *ep;
    if let Err(reason) = rewrite(ctx, &l4, true, (cfg.node_ip, pod_ip), (l4.dport, pod_port)) {
        return Reply::Done(verdict::drop(ctx, reason));
    }
    // The echoed timestamp goes back to the pod's clock.
    if ts_delta != 0
        && let Some(off) = tcp_ts::find(ctx, l4.off)
        && tcp_ts::shift(ctx, off + 4, l4.csum_off(), ts_delta.wrapping_neg()).is_err()
    {
        return Reply::Done(verdict::drop(ctx, Counter::DropNatRewrite));
    }
    Reply::Deliver(ep)
}

/// A backend's answer on a Service flow sent to another node (see
/// [`to_remote_backend`]): the destination back to the client (`client`,
/// from the reply entry), the source to the frontend the client used (from
/// the DNAT entry), out of the uplink toward the client (`rev_dnat`).
/// `None`: no such flow.
#[inline(always)]
fn service_answer(
    ctx: &TcContext,
    cfg: &NodeConfig,
    ip: &Ip,
    l4: &L4,
    client: (u32, u16),
) -> Option<i32> {
    let key = NatKey::new(
        ip.src,
        client.0,
        (l4.sport, client.1),
        ip.proto,
        nat_dir::DNAT,
    );
    let entry = NAT.get_ptr_mut(key)?;
    touch_answered(entry, l4);
    // SAFETY: as in `touch`; address and port of an entry never change.
    let (frontend, frontend_port) = unsafe { ((*entry).addr, (*entry).port) };
    let Some(hop) = fib::lookup(ctx, cfg.node_ip, client.0, cfg.uplink_ifindex) else {
        return Some(verdict::drop(ctx, Counter::DropNoRoute));
    };
    let rewritten =
        rewrite(ctx, l4, true, (cfg.node_ip, client.0), (l4.dport, client.1)).and_then(|()| {
            rewrite(
                ctx,
                l4,
                false,
                (ip.src, frontend),
                (l4.sport, frontend_port),
            )
        });
    Some(match rewritten {
        Ok(()) => verdict::transmit(ctx, &hop, Counter::RevDnat),
        Err(reason) => verdict::drop(ctx, reason),
    })
}

/// The node's TCP timestamp clock (ms) for masqueraded flows.
#[inline(always)]
fn node_clock(nat: &NatConfig, now_ns: u64) -> u32 {
    ((now_ns / 1_000_000) as u32).wrapping_add(nat.ts_base)
}

/// Who sent a packet that may hit a hostPort.
#[derive(Clone, Copy)]
pub enum Client {
    /// Arrived at the uplink.
    Remote,
    /// A pod behind host veth `ifindex`; if the hostPort is its own, its
    /// source becomes `gateway` (hairpin: a pod cannot take a packet from
    /// its own address).
    Pod { ifindex: u32, gateway: u32 },
}

/// A packet addressed to one of the node's addresses: if it hits a
/// hostPort, the reply tuple is recorded and the destination rewritten to
/// the pod, which is returned for delivery.
#[inline(always)]
pub fn hostport_in(ctx: &TcContext, ip: &Ip, client: Client) -> Reply {
    if ip.proto != IPPROTO_TCP && ip.proto != IPPROTO_UDP {
        return Reply::NotOurs;
    }
    let Some(l4) = parse(ctx, ip, true) else {
        return Reply::NotOurs;
    };
    let Some(target) = maps::hostport(ip.dst, l4.dport, ip.proto) else {
        return Reply::NotOurs;
    };
    let Some(ep) = maps::endpoint(target.pod_ip) else {
        return Reply::NotOurs;
    };
    let ep = *ep;
    let hairpin = match client {
        Client::Pod { ifindex, gateway } if ifindex == ep.ifindex => Some(gateway),
        _ => None,
    };
    dnat(ctx, ip, &l4, (target.pod_ip, target.port), ep, hairpin)
}

/// A packet at the uplink for a Service frontend: a NodePort on one of the
/// node's addresses, an external IP or a load-balancer IP
/// ([`crate::service`], scope `EXTERNAL`). The flow's backend is kept in
/// `NAT` under the client's tuple (`dir = svc`), inserted only if absent —
/// two CPUs taking a flow's first packets agree on the one that won — and
/// chosen anew only when a SYN reuses the tuple of a flow that ended.
/// Then as a hostPort: the reply tuple recorded, the destination rewritten,
/// the backend (a ready local endpoint) returned for delivery; the client's
/// address is kept. A backend on another node: see [`to_remote_backend`].
/// No backend → ICMP port unreachable out of the uplink.
#[inline(always)]
pub fn service_in(ctx: &TcContext, cfg: &NodeConfig, ip: &Ip) -> Reply {
    if ip.proto != IPPROTO_TCP && ip.proto != IPPROTO_UDP {
        return Reply::NotOurs;
    }
    let Some(l4) = parse(ctx, ip, true) else {
        return Reply::NotOurs;
    };
    let key = NatKey::new(ip.src, ip.dst, (l4.sport, l4.dport), ip.proto, nat_dir::SVC);
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    let mut held = None;
    // An ended flow's entry the SYN of a new one replaces.
    let mut ended = false;
    if let Some(entry) = NAT.get_ptr_mut(key) {
        // SAFETY: as in `touch`; address and port of an entry never change.
        let (addr, port, flags) = unsafe { ((*entry).addr, (*entry).port, (*entry).flags) };
        ended = l4.flags & nat_flags::SYN != 0 && flags & (nat_flags::FIN | nat_flags::RST) != 0;
        if !ended {
            touch(entry, now, l4.flags);
            held = Some((addr, port));
        }
    }
    let (addr, port) = match held {
        Some(backend) => backend,
        None => {
            let client = AFFINITY_BY_ADDR | u64::from(ip.src);
            match service::lookup(
                ip.dst,
                l4.dport,
                ip.proto,
                svc_scope::EXTERNAL,
                Nodes::This,
                client,
            ) {
                Lookup::None => return Reply::NotOurs,
                Lookup::Reject => {
                    return Reply::Done(icmp::port_unreachable(ctx, cfg.uplink_ifindex, ip.dst));
                }
                Lookup::NoLocal => {
                    return Reply::Done(verdict::drop(ctx, Counter::DropSvcNoBackend));
                }
                Lookup::Backend(backend, info) => {
                    // A backend this node cannot reach starts no flow: the
                    // client's retransmission chooses again.
                    if maps::endpoint(backend.addr).is_none()
                        && (maps::remote_route(backend.addr).is_none()
                            || maps::nat_ports().is_none())
                    {
                        return Reply::Done(verdict::drop(ctx, Counter::DropSvcBackendUnreachable));
                    }
                    let entry = NatEntry {
                        addr: backend.addr,
                        port: backend.port,
                        flags: l4.flags,
                        last_seen: now,
                        ts_delta: 0,
                        _pad: 0,
                    };
                    // A SYN on an ended flow replaces it; otherwise the
                    // first CPU's choice stands.
                    let mode = if ended { BPF_ANY } else { BPF_NOEXIST };
                    if NAT.insert(key, entry, u64::from(mode)).is_ok() {
                        maps::nat_created(1);
                        service::count(info.id, service::Stat::Flows);
                        (backend.addr, backend.port)
                    } else {
                        // SAFETY: as in `touch`.
                        match NAT.get_ptr(key).map(|e| unsafe { ((*e).addr, (*e).port) }) {
                            Some(won) => won,
                            None => {
                                return Reply::Done(verdict::drop(
                                    ctx,
                                    Counter::DropNatInsertFailed,
                                ));
                            }
                        }
                    }
                }
            }
        }
    };
    let Some(ep) = maps::endpoint(addr) else {
        return Reply::Done(to_remote_backend(ctx, cfg, ip, &l4, (addr, port)));
    };
    let ep = *ep;
    dnat(ctx, ip, &l4, (addr, port), ep, None)
}

/// A Service flow at the uplink whose backend is a pod on another node
/// (`externalTrafficPolicy: Cluster`): the reply tuple recorded as for a
/// local backend (so the answer gets the frontend back as its source), the
/// destination rewritten to the backend, then the source to the node
/// address and a port of the NAT range — as a pod's masqueraded flow, same
/// entries — so the answer comes back here; the packet goes through the
/// overlay like the node's own traffic to that pod (`fwd_encap_*` /
/// `fwd_native`). The answer is restored by [`reply`].
#[inline(always)]
fn to_remote_backend(ctx: &TcContext, cfg: &NodeConfig, ip: &Ip, l4: &L4, to: (u32, u16)) -> i32 {
    let (Some(route), Some(nat)) = (maps::remote_route(to.0), maps::nat_ports()) else {
        return verdict::drop(ctx, Counter::DropSvcBackendUnreachable);
    };
    let key = NatKey::new(ip.src, to.0, (l4.sport, to.1), ip.proto, nat_dir::EGRESS);
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    let port = match NAT.get_ptr_mut(key) {
        Some(entry) => {
            if l4.flags & nat_flags::SYN != 0 {
                reopen(entry, &key, cfg.node_ip, now, 0);
            }
            touch(entry, now, l4.flags);
            // SAFETY: as in `touch`; the port of an entry never changes.
            unsafe { (*entry).port }
        }
        None => match allocate(&key, cfg.node_ip, &nat, now, (l4.flags, 0)) {
            Ok(port) => port,
            Err(reason) => return verdict::drop(ctx, reason),
        },
    };
    let dnat_key = NatKey::new(to.0, ip.src, (to.1, l4.sport), ip.proto, nat_dir::DNAT);
    let entry = NatEntry {
        addr: ip.dst,
        port: l4.dport,
        flags: l4.flags,
        last_seen: now,
        ts_delta: 0,
        _pad: 0,
    };
    match NAT.get_ptr_mut(dnat_key) {
        Some(e) => touch(e, now, l4.flags),
        None => {
            if NAT.insert(dnat_key, entry, u64::from(BPF_ANY)).is_err() {
                return verdict::drop(ctx, Counter::DropNatInsertFailed);
            }
            maps::nat_created(1);
        }
    }
    let rewritten = rewrite(ctx, l4, true, (ip.dst, to.0), (l4.dport, to.1))
        .and_then(|()| rewrite(ctx, l4, false, (ip.src, cfg.node_ip), (l4.sport, port)));
    if let Err(reason) = rewritten {
        return verdict::drop(ctx, reason);
    }
    crate::remote::forward(ctx, cfg, &route, crate::remote::Sender::Host)
}

/// Records the reply tuple of a connection to `to` (a hostPort's pod or a
/// Service's backend, the endpoint `ep`) and rewrites the destination; a
/// hairpin client's source becomes `hairpin` (its gateway).
#[inline(always)]
fn dnat(
    ctx: &TcContext,
    ip: &Ip,
    l4: &L4,
    to: (u32, u16),
    ep: EndpointInfo,
    hairpin: Option<u32>,
) -> Reply {
    let key = NatKey::new(
        to.0,
        hairpin.unwrap_or(ip.src),
        (to.1, l4.sport),
        ip.proto,
        nat_dir::DNAT,
    );
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    match NAT.get_ptr_mut(key) {
        Some(entry) => {
            // The client reusing its port (TIME_WAIT reuse): a new
            // connection, not the end of the old one.
            // SAFETY: as in `touch`.
            unsafe {
                if l4.flags & nat_flags::SYN != 0
                    && (*entry).flags & (nat_flags::FIN | nat_flags::FIN_POD | nat_flags::RST) != 0
                {
                    (*entry).flags = 0;
                }
            }
            touch(entry, now, l4.flags)
        }
        None => {
            let entry = NatEntry {
                addr: ip.dst,
                port: l4.dport,
                flags: l4.flags,
                last_seen: now,
                ts_delta: 0,
                _pad: 0,
            };
            if NAT.insert(key, entry, u64::from(BPF_ANY)).is_err() {
                return Reply::Done(verdict::drop(ctx, Counter::DropNatInsertFailed));
            }
            maps::nat_created(1);
        }
    }
    let rewritten =
        rewrite(ctx, l4, true, (ip.dst, to.0), (l4.dport, to.1)).and_then(|()| match hairpin {
            Some(gateway) => rewrite_addr(ctx, l4, false, (ip.src, gateway)),
            None => Ok(()),
        });
    match rewritten {
        Ok(()) => Reply::Deliver(ep),
        Err(reason) => Reply::Done(verdict::drop(ctx, reason)),
    }
}

/// Where a pod's translated answer to a hostPort connection goes.
pub enum Answer {
    /// Decided here (the returned TC verdict).
    Done(i32),
    /// Translated; the client is a pod on another node: the caller sends
    /// it on this route like the pod's own traffic there (the router hop,
    /// TTL included, is the caller's).
    Remote(RouteInfo),
}

/// A pod's packet that answers a hostPort connection: the source becomes
/// the node address and hostPort the client used, then it goes to the
/// client (a pod here, a pod on another node through the overlay, or out of
/// the uplink). `None`: not such a reply.
#[inline(always)]
pub fn hostport_reply(ctx: &TcContext, cfg: &NodeConfig, ip: &Ip, ttl: u8) -> Option<Answer> {
    if ip.proto != IPPROTO_TCP && ip.proto != IPPROTO_UDP {
        return None;
    }
    let l4 = parse(ctx, ip, false)?;
    let key = NatKey::new(
        ip.src,
        ip.dst,
        (l4.sport, l4.dport),
        ip.proto,
        nat_dir::DNAT,
    );
    let entry = NAT.get_ptr_mut(key)?;
    touch_answered(entry, &l4);
    if ttl <= 1 {
        return Some(Answer::Done(verdict::pass(ctx, Counter::PassTtl)));
    }
    // SAFETY: as in `touch`; address and port of an entry never change.
    let (addr, port) = unsafe { ((*entry).addr, (*entry).port) };
    // Hairpin: the pod answers itself (it saw its gateway as the client).
    let hairpin = ip.dst == cfg.gateway;
    // Where it goes is settled before anything is rewritten: a packet
    // that cannot leave is dropped as it came.
    let to = match client_of(ctx, cfg, addr, if hairpin { ip.src } else { ip.dst }) {
        Ok(to) => to,
        Err(v) => return Some(Answer::Done(v)),
    };
    if !matches!(to, AnswerTo::Elsewhere(_)) {
        decrease_ttl(ctx);
    }
    if let Err(reason) = rewrite(ctx, &l4, false, (ip.src, addr), (l4.sport, port)) {
        return Some(Answer::Done(verdict::drop(ctx, reason)));
    }
    if hairpin && let Err(reason) = rewrite_addr(ctx, &l4, true, (ip.dst, ip.src)) {
        return Some(Answer::Done(verdict::drop(ctx, reason)));
    }
    Some(send_to(ctx, to))
}

/// Where the client of a hostPort connection is, as seen from the pod
/// answering it.
pub enum AnswerTo {
    /// A pod on this node.
    Local(EndpointInfo),
    /// A pod on another node: through the overlay (or routed natively).
    Elsewhere(RouteInfo),
    /// Anything else: out of the uplink through this hop.
    Underlay(fib::NextHop),
}

/// Finds the client at `dst` for an answer leaving as node address `from`;
/// `Err` is the verdict when it cannot be reached.
#[inline(always)]
pub fn client_of(ctx: &TcContext, cfg: &NodeConfig, from: u32, dst: u32) -> Result<AnswerTo, i32> {
    if let Some(ep) = maps::endpoint(dst) {
        return Ok(AnswerTo::Local(*ep));
    }
    if let Some(route) = maps::route(dst) {
        return Ok(AnswerTo::Elsewhere(route));
    }
    match fib::lookup(ctx, from, dst, cfg.uplink_ifindex) {
        Some(hop) => Ok(AnswerTo::Underlay(hop)),
        None => Err(verdict::drop(ctx, Counter::DropNoRoute)),
    }
}

/// The router hop of an answer that leaves here (the overlay path takes
/// its own).
#[inline(always)]
pub fn decrease_ttl(ctx: &TcContext) {
    if let Some(hdr) = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN) {
        // SAFETY: bounds-checked; alignment 1; the pointer is derived
        // after the last helper that moved or rewrote packet data.
        ipv4::decrease_ttl(unsafe { &mut *hdr });
    }
}

/// Sends a translated answer to its client.
#[inline(always)]
pub fn send_to(ctx: &TcContext, to: AnswerTo) -> Answer {
    match to {
        AnswerTo::Local(ep) => Answer::Done(to_pod(ctx, &ep, Counter::RevDnat)),
        AnswerTo::Elsewhere(route) => Answer::Remote(route),
        AnswerTo::Underlay(hop) => Answer::Done(verdict::transmit(ctx, &hop, Counter::RevDnat)),
    }
}

/// Hands an already routed (TTL done) packet to a local pod.
#[inline(always)]
pub fn to_pod(ctx: &TcContext, ep: &EndpointInfo, counter: Counter) -> i32 {
    if let Some(eth) = ptr_at::<EthHdr>(ctx, 0) {
        // SAFETY: bounds-checked; alignment 1.
        unsafe {
            (*eth).dst = ep.mac;
            (*eth).src = ep.host_mac;
        }
    }
    crate::bandwidth::deliver(ctx, ep.ifindex, ep.flags, counter)
}
