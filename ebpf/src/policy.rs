//! Kubernetes NetworkPolicy verdicts (layout: `rivet_common`'s `policy`
//! module). One function, [`check`], is asked wherever a packet leaves a
//! pod of this node (egress, at the top of `from_pod`) and wherever one is
//! about to be delivered into a pod (ingress: the local redirect, uplink
//! delivery after decapsulation or translation, a hostPort reached from a
//! pod) — after any DNAT, so the pod and port are the real ones and the
//! client address is the real client's.
//!
//! 1. Neither end isolated (the endpoint bits, already read): the flow is
//!    remembered in `POLICY_FLOWS` (a TCP SYN, any UDP or ICMP echo packet
//!    not yet known) and passes. No policy lookup.
//! 2. The packet's own tuple in `POLICY_FLOWS` (an allowed flow goes on) or
//!    its reversed tuple (a reply) → pass. An ICMP error passes when the
//!    flow it quotes is known either way (fragmentation-needed, unreachable
//!    and time-exceeded about an allowed flow).
//! 3. Else each isolated end is asked: egress of the source pod for the
//!    destination address, ingress of the destination pod for the source
//!    address: port class from `POLICY_PORTS`, then the peer in
//!    `POLICY_PEERS`. Missing → `drop_policy_egress` / `drop_policy_ingress`.
//!    A pod's traffic to its own node always passes egress (the node's own
//!    packets reach the pod without crossing rivet, so their replies could
//!    not be told from new flows; Kubernetes lets a pod's node reach it).
//! 4. Allowed → the flow is remembered (its later packets and its replies
//!    pass at step 2).
//!
//! A remembered flow lets packets through while it is used: idle longer
//! than a day (TCP) or 120 s (other protocols) it is forgotten, and its
//! next packet is judged by the rules again (a stale tuple opens nothing).
//!
//! ARP never reaches the verdict (only IPv4 is judged), and DHCP between
//! ports 68 and 67 passes it: a pod keeps its gateway and, with a
//! delegated IPAM, its lease whatever its policy.
//!
//! Fragments after the first carry no ports: they are matched as port 0,
//! so only rules without ports let them through an isolated end.

use aya_ebpf::{
    EbpfContext as _,
    bindings::__sk_buff,
    helpers::{bpf_ktime_get_ns, bpf_skb_load_bytes},
    maps::lpm_trie::Key,
    programs::TcContext,
};
use rivet_common::{
    Counter, FlowKey, FlowState, POLICY_FLOW_IDLE_NS, POLICY_FLOW_REFRESH_NS,
    POLICY_FLOW_TCP_IDLE_NS, POLICY_PEER_KEY_FIXED_BITS, POLICY_PORT_KEY_FIXED_BITS,
    POLICY_PROTO_OTHER, POLICY_SCRATCH_BYTES, PolicyPeerKey, PolicyPortKey, endpoint_flags,
    policy_dir, policy_stat,
};

use crate::{
    events,
    headers::{ETH_HLEN, ETH_P_IP, IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_UDP},
    ipv4,
    maps::{self, POLICY_FLOWS, POLICY_PEERS, POLICY_PORTS, POLICY_SCRATCH},
    verdict,
};

const IPPROTO_SCTP: u8 = 132;
const ICMP_ECHO_REPLY: u8 = 0;
const ICMP_DEST_UNREACH: u8 = 3;
const ICMP_ECHO: u8 = 8;
const ICMP_TIME_EXCEEDED: u8 = 11;
const TCP_SYN: u8 = 0x02;
const DHCP_SERVER: u16 = 67;
const DHCP_CLIENT: u16 = 68;
const TCP_ACK: u8 = 0x10;

/// What [`check`] needs of a packet, read at IPv4 header offset `l3`.
#[derive(Clone, Copy)]
pub struct Packet {
    /// Offset of the IPv4 header in the frame.
    pub l3: usize,
    /// Header length (validated).
    pub hlen: usize,
    /// Source, wire order.
    pub src: u32,
    /// Destination, wire order.
    pub dst: u32,
    /// IP protocol.
    pub proto: u8,
    /// Flags and fragment offset, host order.
    pub frag: u16,
    /// Where a translation will send it (address, port in wire order): the
    /// flow is judged as going there.
    pub to: Option<(u32, u16)>,
}

/// The packet as it stands now at the usual offset (after a translation
/// rewrote it), if its IPv4 header is readable.
#[inline(always)]
pub fn translated(ctx: &TcContext) -> Option<Packet> {
    let ip = ctx.load::<[u8; 20]>(ETH_HLEN).ok()?;
    Some(Packet {
        l3: ETH_HLEN,
        hlen: usize::from(ip[0] & 0x0f) * 4,
        src: u32::from_ne_bytes([ip[12], ip[13], ip[14], ip[15]]),
        dst: u32::from_ne_bytes([ip[16], ip[17], ip[18], ip[19]]),
        proto: ip[9],
        frag: u16::from_be_bytes([ip[6], ip[7]]),
        to: None,
    })
}

/// [`check`]'s working memory, in a per-CPU map: the callers' stack frames
/// (`from_pod`'s is 488 bytes) leave a called function almost none of the
/// 512 the verifier allows a chain of calls.
#[repr(C)]
struct Scratch {
    /// The packet's flow.
    key: FlowKey,
    /// Its reverse, or the quoted flow's.
    other: FlowKey,
    /// The flow an ICMP error quotes.
    quoted: FlowKey,
    /// Bytes read from the packet.
    buf: [u8; 28],
    /// `POLICY_PORTS` lookup key.
    port_key: Key<PolicyPortKey>,
    /// `POLICY_PEERS` lookup key.
    peer_key: Key<PolicyPeerKey>,
    /// A new `POLICY_FLOWS` value.
    state: FlowState,
    /// A delivery [`defer`]red to [`finish_uplink`]: what then.
    deferred: Deferred,
    /// Its pod's endpoint flags.
    deferred_flags: u32,
    /// Its counter.
    deferred_counter: Counter,
}
const _: () = assert!(core::mem::size_of::<Scratch>() <= POLICY_SCRATCH_BYTES);

/// Reads `N` bytes at `off` into `buf`'s start.
#[inline(always)]
fn load<const N: usize>(ctx: &TcContext, off: usize, buf: *mut [u8; 28]) -> bool {
    const { assert!(N <= 28) };
    // SAFETY: `buf` points into a per-CPU map value of at least 28 bytes;
    // the helper writes `N` of them or fails.
    unsafe {
        bpf_skb_load_bytes(
            ctx.as_ptr() as *const __sk_buff as *const _,
            off as u32,
            buf as *mut _,
            N as u32,
        ) == 0
    }
}

/// How a packet relates to flows.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Starts {
    /// It starts no flow (TCP without SYN, ICMP other than echo, …).
    No,
    /// It may start one (UDP, SCTP, ICMP echo): remembered unless its flow
    /// is known either way.
    Maybe,
    /// A TCP SYN: always a new connection (a reused tuple too), judged by
    /// the rules even when an old flow had the same tuple.
    Syn,
}

/// Fills `s.key` with the packet's flow (and `s.quoted` for an ICMP error
/// quoting one); returns whether the packet starts a flow and whether
/// `s.quoted` holds one.
#[inline(always)]
fn flow_of(ctx: &TcContext, p: &Packet, s: &mut Scratch) -> (Starts, bool) {
    s.key = FlowKey {
        src: p.src,
        dst: p.dst,
        sport: 0,
        dport: 0,
        proto: p.proto,
        _pad: [0; 3],
    };
    if p.frag & ipv4::IP_OFFSET != 0 {
        return (Starts::No, false);
    }
    let l4 = p.l3 + p.hlen;
    match p.proto {
        IPPROTO_TCP | IPPROTO_UDP | IPPROTO_SCTP => {
            // The ports (a datagram may end right after its 8-byte
            // header), then for TCP its flags.
            if !load::<4>(ctx, l4, &mut s.buf) {
                return (Starts::No, false);
            }
            s.key.sport = u16::from_ne_bytes([s.buf[0], s.buf[1]]);
            s.key.dport = u16::from_ne_bytes([s.buf[2], s.buf[3]]);
            if p.proto != IPPROTO_TCP {
                return (Starts::Maybe, false);
            }
            let syn = load::<14>(ctx, l4, &mut s.buf) && s.buf[13] & (TCP_SYN | TCP_ACK) == TCP_SYN;
            (if syn { Starts::Syn } else { Starts::No }, false)
        }
        IPPROTO_ICMP => {
            // The ICMP header, then (errors) the quoted IPv4 header
            // without options and 4 bytes of its transport header.
            if !load::<8>(ctx, l4, &mut s.buf) {
                return (Starts::No, false);
            }
            match s.buf[0] {
                ICMP_ECHO | ICMP_ECHO_REPLY => {
                    let id = u16::from_ne_bytes([s.buf[4], s.buf[5]]);
                    s.key.sport = id;
                    s.key.dport = id;
                    let starts = if s.buf[0] == ICMP_ECHO {
                        Starts::Maybe
                    } else {
                        Starts::No
                    };
                    (starts, false)
                }
                ICMP_DEST_UNREACH | ICMP_TIME_EXCEEDED => (Starts::No, quoted(ctx, l4 + 8, s)),
                _ => (Starts::No, false),
            }
        }
        _ => (Starts::No, false),
    }
}

/// Fills `s.quoted` with the flow an ICMP error quotes (its IPv4 header at
/// `off`, then 8 bytes).
#[inline(always)]
fn quoted(ctx: &TcContext, off: usize, s: &mut Scratch) -> bool {
    if !load::<1>(ctx, off, &mut s.buf) {
        return false;
    }
    let hlen = usize::from(s.buf[0] & 0x0f) * 4;
    if !(20..=24).contains(&hlen) || !load::<28>(ctx, off, &mut s.buf) {
        // Quoted headers with more options are not looked into.
        return false;
    }
    let b = &s.buf;
    let proto = b[9];
    let (sport, dport) = match proto {
        IPPROTO_TCP | IPPROTO_UDP | IPPROTO_SCTP if hlen == 20 => (
            u16::from_ne_bytes([b[20], b[21]]),
            u16::from_ne_bytes([b[22], b[23]]),
        ),
        _ => (0, 0),
    };
    s.quoted = FlowKey {
        src: u32::from_ne_bytes([b[12], b[13], b[14], b[15]]),
        dst: u32::from_ne_bytes([b[16], b[17], b[18], b[19]]),
        sport,
        dport,
        proto,
        _pad: [0; 3],
    };
    true
}

/// Whether the flow entry `v` is still alive at `now` (not idle past its
/// protocol's timeout); a live one is marked seen (at most once a second).
#[inline(always)]
fn alive(v: *mut FlowState, now: u64, proto: u8) -> bool {
    // SAFETY: a map value pointer from a successful lookup, valid for the
    // program run; a racing CPU writes the same kind of timestamp.
    let seen = unsafe { core::ptr::read_volatile(&(*v).seen) };
    let idle = now.saturating_sub(seen);
    let timeout = if proto == IPPROTO_TCP {
        POLICY_FLOW_TCP_IDLE_NS
    } else {
        POLICY_FLOW_IDLE_NS
    };
    if idle > timeout {
        return false;
    }
    if idle > POLICY_FLOW_REFRESH_NS {
        // SAFETY: as above.
        unsafe { core::ptr::write_volatile(&mut (*v).seen, now) };
    }
    true
}

/// Whether `k` (either way round) is a live flow at `now`; `other` is
/// scratch.
#[expect(
    clippy::needless_borrows_for_generic_args,
    reason = "the key is passed as a pointer into the per-CPU scratch, not copied onto the stack"
)]
#[inline(always)]
fn known(k: &FlowKey, other: &mut FlowKey, now: u64) -> bool {
    if let Some(v) = POLICY_FLOWS.get_ptr_mut(k)
        && alive(v, now, k.proto)
    {
        return true;
    }
    *other = FlowKey {
        src: k.dst,
        dst: k.src,
        sport: k.dport,
        dport: k.sport,
        proto: k.proto,
        _pad: [0; 3],
    };
    POLICY_FLOWS
        .get_ptr_mut(&*other)
        .is_some_and(|v| alive(v, now, k.proto))
}

/// Remembers the packet's flow as seen at `s.state.seen` (an entry of the
/// same tuple — an idle one, or a new SYN's — is refreshed in place: the
/// seen time is all it holds). A full table recycles its least recently
/// used flows (LRU).
///
/// Looked up first: a flow between two pods of this node is remembered at
/// the sender's egress and again at the receiver's ingress, and an insert
/// costs a node of the LRU lists even when it replaces (~0.5 µs with cold
/// lists), a lookup ~30 ns.
#[expect(
    clippy::needless_borrows_for_generic_args,
    reason = "key and value are passed as pointers into the per-CPU scratch, not copied onto the stack"
)]
#[inline(always)]
fn remember(s: &mut Scratch) {
    if let Some(v) = POLICY_FLOWS.get_ptr_mut(&s.key) {
        // SAFETY: a map value pointer from a successful lookup, valid for
        // the program run; a racing CPU writes the same kind of timestamp.
        unsafe { core::ptr::write_volatile(&mut (*v).seen, s.state.seen) };
        return;
    }
    let _ = POLICY_FLOWS.insert(&s.key, &s.state, 0);
}

/// The policy (the agent's number) whose rules let the pod at `pod`, in
/// `dir`, reach or be reached by `peer` for the packet's protocol and
/// destination port; `None` when no rule does.
#[inline(always)]
fn allows(s: &mut Scratch, pod: u32, dir: u8, peer: u32) -> Option<u32> {
    let (proto, port) = match s.key.proto {
        IPPROTO_TCP | IPPROTO_UDP | IPPROTO_SCTP => (s.key.proto, s.key.dport),
        _ => (POLICY_PROTO_OTHER, 0),
    };
    s.port_key.prefix_len = POLICY_PORT_KEY_FIXED_BITS + 16;
    s.port_key.data = PolicyPortKey {
        pod,
        dir,
        proto,
        port: port.to_ne_bytes(),
    };
    let class = POLICY_PORTS.get(&s.port_key)?;
    s.peer_key.prefix_len = POLICY_PEER_KEY_FIXED_BITS + 32;
    s.peer_key.data = PolicyPeerKey {
        pod,
        dir,
        _pad: 0,
        class: (*class as u16).to_be_bytes(),
        peer,
    };
    POLICY_PEERS.get(&s.peer_key).copied()
}

/// The verdict for packet `p` from a pod with endpoint flags `src_flags`
/// (0 when the source is no pod of this node) to one with `dst_flags` (0
/// when the destination is no pod of this node): `Err` with the drop
/// reason when policy denies it.
///
/// A function of its own (a BPF subprogram), its working memory in a
/// per-CPU map: the verifier walks it as one piece of code for every
/// caller, and it adds almost nothing to the callers' stack.
#[inline(never)]
pub fn check(ctx: &TcContext, p: &Packet, src_flags: u32, dst_flags: u32) -> Result<(), Counter> {
    let egress = src_flags & endpoint_flags::POLICY_EGRESS != 0;
    let ingress = dst_flags & endpoint_flags::POLICY_INGRESS != 0;
    let Some(s) = scratch() else {
        return Ok(());
    };
    let (starts, has_quoted) = flow_of(ctx, p, s);
    // DHCP (a delegated IPAM's lease traffic) is never subject to policy.
    if p.proto == IPPROTO_UDP
        && matches!(
            (u16::from_be(s.key.sport), u16::from_be(s.key.dport)),
            (DHCP_CLIENT, DHCP_SERVER) | (DHCP_SERVER, DHCP_CLIENT)
        )
    {
        return Ok(());
    }
    if let Some((addr, port)) = p.to {
        s.key.dst = addr;
        s.key.dport = port;
    }
    let (src, dst) = (s.key.src, s.key.dst);
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    s.state.seen = now;
    if !egress && !ingress {
        match starts {
            Starts::Syn => remember(s),
            Starts::Maybe if !known(&s.key, &mut s.other, now) => remember(s),
            _ => {}
        }
        return Ok(());
    }
    // A SYN opens a new connection: the rules decide, whatever flow had
    // its tuple before.
    if starts != Starts::Syn
        && (known(&s.key, &mut s.other, now) || (has_quoted && known(&s.quoted, &mut s.other, now)))
    {
        return Ok(());
    }
    // The verdicts first, the events once the flow passes both.
    let mut by_egress = 0;
    if egress {
        match allows(s, src, policy_dir::EGRESS, dst) {
            Some(policy) => by_egress = policy,
            // The pod's own node: the rule of the module docs (0: no
            // policy is named).
            None if maps::is_node_addr(dst) => {}
            None => return Err(Counter::DropPolicyEgress),
        }
    }
    let mut by_ingress = 0;
    if ingress {
        match allows(s, dst, policy_dir::INGRESS, src) {
            Some(policy) => by_ingress = policy,
            None => return Err(Counter::DropPolicyIngress),
        }
    }
    remember(s);
    if egress {
        maps::policy_allowed(policy_stat::ALLOWED_EGRESS);
        events::policy(ctx, policy_dir::EGRESS, by_egress);
    }
    if ingress {
        maps::policy_allowed(policy_stat::ALLOWED_INGRESS);
        events::policy(ctx, policy_dir::INGRESS, by_ingress);
    }
    Ok(())
}

/// The verdict for a packet a pod sends, before `from_pod` handles it
/// (called from the program's entry, so the chain of calls stays within
/// the verifier's stack: `from_pod`'s own frame is 488 bytes). Only IPv4
/// from a known endpoint is judged; anything else `from_pod` drops or
/// handles itself. To a pod of this node: the source's egress and that
/// pod's ingress; to a hostPort on a node address: as going to the
/// hostPort's pod and port; else the source's egress. True when the
/// packet was dropped (counted, with its event): the verdict is
/// `TC_ACT_SHOT`.
#[inline(never)]
pub fn from_pod(ctx: TcContext) -> bool {
    let ctx = &ctx;
    match judge_from_pod(ctx) {
        Ok(()) => false,
        Err(reason) => {
            verdict::drop(ctx, reason);
            true
        }
    }
}

#[inline(always)]
fn judge_from_pod(ctx: &TcContext) -> Result<(), Counter> {
    if ctx.load::<[u8; 2]>(12).ok() != Some(ETH_P_IP) {
        return Ok(());
    }
    let Some(mut p) = translated(ctx) else {
        return Ok(());
    };
    if p.hlen < 20 {
        return Ok(());
    }
    let Some(src) = maps::endpoint(p.src) else {
        return Ok(());
    };
    // Only a packet that passes `from_pod`'s anti-spoof (the source's own
    // veth and MAC) is judged, so none is remembered as a flow of another
    // pod: a spoofed one is left to `from_pod` to drop.
    // SAFETY: `ctx.as_ptr()` is the program's __sk_buff, valid for its run.
    let ifindex = unsafe { (*(ctx.as_ptr() as *const __sk_buff)).ifindex };
    if src.ifindex != ifindex || ctx.load::<[u8; 6]>(6).ok() != Some(src.mac) {
        return Ok(());
    }
    let src_flags = src.flags;
    let mut dst_flags = maps::endpoint(p.dst).map_or(0, |ep| ep.flags);
    if dst_flags == 0
        && (p.proto == IPPROTO_TCP || p.proto == IPPROTO_UDP)
        && p.frag & ipv4::IP_OFFSET == 0
        && maps::is_node_addr(p.dst)
        && let Ok(port) = ctx.load::<[u8; 2]>(p.l3 + p.hlen + 2)
        && let Some(target) = maps::hostport(p.dst, u16::from_ne_bytes(port), p.proto)
    {
        p.to = Some((target.pod_ip, target.port));
        dst_flags = maps::endpoint(target.pod_ip).map_or(0, |ep| ep.flags);
    }
    check(ctx, &p, src_flags, dst_flags)
}

/// What `from_uplink` returns when it hands a delivery to
/// [`finish_uplink`] (no TC verdict has this value).
pub const DEFERRED: i32 = 0x7e57;

/// What to do with a deferred packet once policy allows it.
#[derive(Clone, Copy)]
pub enum Deferred {
    /// `bpf_redirect_peer` into the pod behind this host-side ifindex.
    Redirect(u32),
    /// Pass it to the node's stack (which routes it to the pod).
    Pass,
}

#[inline(always)]
fn scratch() -> Option<&'static mut Scratch> {
    let s = POLICY_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: this CPU's slot of a per-CPU map value, large enough
    // (asserted above) and 8-byte aligned; nothing else on this CPU runs
    // while the program does.
    Some(unsafe { &mut *(s as *mut Scratch) })
}

/// Leaves the delivery of the packet to a pod with endpoint flags `flags`
/// to [`finish_uplink`]: returns [`DEFERRED`] for `from_uplink` to return.
#[inline(always)]
pub fn defer(what: Deferred, flags: u32, counter: Counter) -> i32 {
    if let Some(s) = scratch() {
        s.deferred = what;
        s.deferred_flags = flags;
        s.deferred_counter = counter;
        return DEFERRED;
    }
    aya_ebpf::bindings::TC_ACT_SHOT
}

/// Ends a delivery `from_uplink` deferred: the pod's ingress policy for
/// the packet as it now is, then the redirect (or pass) it was to get,
/// counted as it would have been.
#[inline(never)]
pub fn finish_uplink(ctx: TcContext) -> i32 {
    let ctx = &ctx;
    let Some(s) = scratch() else {
        return aya_ebpf::bindings::TC_ACT_SHOT;
    };
    let (what, flags, counter) = (s.deferred, s.deferred_flags, s.deferred_counter);
    if let Some(p) = translated(ctx)
        && let Err(reason) = check(ctx, &p, 0, flags)
    {
        return verdict::drop(ctx, reason);
    }
    match what {
        Deferred::Redirect(ifindex) => crate::bandwidth::deliver(ctx, ifindex, flags, counter),
        Deferred::Pass => verdict::pass(ctx, counter),
    }
}
