//! Traffic arriving at the node's uplink, at TC ingress. Reads `CONFIG`,
//! `PEERS`, `ROUTES`, `ENDPOINTS`, `LOCAL_ADDRS`, `HOSTPORTS`, `NAT`.
//!
//! 1. Not IPv4, VLAN-tagged (`vlan_present`: it belongs to a VLAN device), not
//!    `PACKET_HOST`, or no config → pass (`uplink_pass`).
//! 2. To the node IP, UDP to `vxlan_port` → VXLAN decap; IP protocol 4 → IPIP
//!    decap (the UDP port is read on first fragments only). Both check, in
//!    order: outer header valid (total length within the frame), without
//!    options, not a fragment (`drop_tunnel_malformed`); outer source in
//!    `PEERS` (`drop_tunnel_unknown_peer`); VXLAN: I flag and VNI == ours
//!    (`drop_tunnel_bad_vni`), UDP length ≥ 30 and within the outer datagram,
//!    inner Ethernet type IPv4; the inner IPv4 header and its transport header
//!    valid and within the tunnel payload (`drop_tunnel_malformed`); the inner
//!    destination a local endpoint, or the node itself, else
//!    `drop_tunnel_no_endpoint`. Then the outer headers are stripped
//!    ([`crate::encap`]).
//! 3. Delivery: to a pod → TTL ≤ 1 goes to the node's stack via `rivet_host`
//!    (time-exceeded), else TTL − 1, MACs = (pod MAC, its host veth MAC) and
//!    `bpf_redirect_peer` into the pod (`decap_vxlan` / `decap_ipip`); to the
//!    node → destination MAC = `rivet_host`'s and `bpf_redirect(rivet_host,
//!    INGRESS)` (`deliver_host`): the stack sees it arrive on the device its
//!    route to the sender uses, so reverse-path checks and replies work. A
//!    decapsulated packet for the node goes through step 4's hostPort
//!    translation first, so a pod on another node reaches this node's
//!    hostPorts.
//! 4. TCP/UDP to a hostPort on one of the node's addresses: destination
//!    rewritten to the pod, delivered ([`crate::nat::hostport_in`]). Then a
//!    Service frontend — a NodePort on a node address, an external or
//!    load-balancer IP (only addresses marked in `SVC_FRONTENDS` are looked
//!    at) — from the underlay: the flow's backend chosen once, destination
//!    rewritten, delivered (`fwd_svc`), or ICMP port unreachable when the
//!    Service has no backend (`drop_svc_no_backend`;
//!    [`crate::nat::service_in`]). Replies to
//!    masqueraded flows (addressed to the node IP, matching `NAT`) and ICMP
//!    errors about them: translated back and delivered to the pod
//!    ([`crate::nat`], [`crate::nat_icmp`]).
//! 5. Native routing: destination a local endpoint and source inside a remote
//!    pod subnet (`ROUTES`) → delivered the same way (`fwd_from_peer`); to the
//!    node IP from a remote pod subnet → `rivet_host` ingress (`deliver_host`);
//!    both check the headers like a pod's (`drop_bad_ip_header`,
//!    `drop_truncated`).
//! 6. Everything else passes untouched (`uplink_pass`): the node's own traffic,
//!    etcd, SSH never depend on rivet's maps.
//!
//! The rule: what is ours is delivered or dropped with a reason; what is not
//! ours passes. The idle kernel vxlan device bound to the port (`rivet_vxlan`,
//! kept for receive GRO: `rivet::cluster::node`) never sees a packet: TC
//! ingress runs before the UDP socket.

use aya_ebpf::{EbpfContext as _, bindings::__sk_buff, programs::TcContext};
use rivet_common::{
    Counter, EndpointInfo, IPIP_OVERHEAD, NodeConfig, VXLAN_OVERHEAD, endpoint_flags,
};

use crate::{
    encap,
    headers::{
        ETH_HLEN, ETH_P_IP, EthHdr, IPPROTO_IPIP, IPPROTO_UDP, IPV4_HLEN, Ipv4Hdr, UdpHdr,
        VXLAN_FLAG_VNI, VxlanEncap,
    },
    ipv4, maps, nat, nat_icmp,
    packet::{addr, ensure_linear, ptr_at},
    policy, service, verdict,
};

const PACKET_HOST: u32 = 0;
/// Outer Ethernet + IPv4 + UDP + VXLAN + inner Ethernet + inner IPv4.
const LINEAR: u32 = (ETH_HLEN + VXLAN_OVERHEAD as usize + IPV4_HLEN) as u32;

/// Where a decapsulated packet goes.
enum Target {
    Pod(EndpointInfo),
    Host,
}

///
/// A call of its own, taking the context by value: a delivery into a pod
/// ends in [`policy::finish_uplink`], a sibling call (the verifier bounds
/// the stack of a chain of calls to 512 bytes; this frame is 496).
#[inline(never)]
pub fn handle(ctx: TcContext) -> i32 {
    let ctx = &ctx;
    ensure_linear(ctx, LINEAR);
    let (Some(eth), Some(ip)) = (ptr_at::<EthHdr>(ctx, 0), ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN)) else {
        return verdict::pass(ctx, Counter::UplinkPass);
    };
    // SAFETY: bounds-checked above; alignment 1.
    let (proto, ip) = unsafe { ((*eth).proto, &*ip) };
    if proto != ETH_P_IP || ip.version_ihl >> 4 != 4 {
        return verdict::pass(ctx, Counter::UplinkPass);
    }
    let Some(cfg) = maps::config() else {
        return verdict::pass(ctx, Counter::UplinkPass);
    };
    // SAFETY: reading fields of the program's __sk_buff.
    let (pkt_type, vlan) = unsafe {
        let skb = ctx.as_ptr() as *const __sk_buff;
        ((*skb).pkt_type, (*skb).vlan_present)
    };
    // A tagged frame (its tag already stripped into skb->vlan_tci) belongs
    // to a VLAN device of the node, not to the uplink's address.
    if pkt_type != PACKET_HOST || vlan != 0 {
        return verdict::pass(ctx, Counter::UplinkPass);
    }
    let (src, dst) = (addr(&ip.src), addr(&ip.dst));

    let to_node = dst == cfg.node_ip;
    // A tunnel packet for a pod is delivered at once; one for the node (a
    // pod on another node reaching this node's address or a hostPort) is
    // decapsulated and goes on below as the inner packet.
    let mut decapped = false;
    if to_node {
        let tunnel =
            if ip.protocol == IPPROTO_UDP && udp_dport(ctx, ip) == Some(cfg.vxlan_port as u16) {
                Some(vxlan_in(ctx, &cfg, ip, src))
            } else if ip.protocol == IPPROTO_IPIP {
                Some(ipip_in(ctx, &cfg, ip, src))
            } else {
                None
            };
        match tunnel {
            Some(Err(reason)) => return verdict::drop(ctx, reason),
            Some(Ok((Target::Pod(ep), counter))) => {
                return deliver(ctx, &cfg, Target::Pod(ep), counter);
            }
            Some(Ok((Target::Host, _))) => decapped = true,
            None => {}
        }
    }
    let Some(ip) = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN) else {
        return verdict::drop(ctx, Counter::DropTunnelMalformed);
    };
    // SAFETY: bounds-checked after the last size change; alignment 1.
    let ip = unsafe { &*ip };
    let (src, dst) = (addr(&ip.src), addr(&ip.dst));
    let to_node = dst == cfg.node_ip;
    // Translations toward a pod: a hostPort on any node address (also for
    // a remote pod's decapsulated packet); replies (and ICMP errors) of
    // masqueraded flows on the node IP (only from the underlay).
    if (to_node || maps::is_local_addr(dst) || service::external_addr(dst))
        && let Ok(hlen) = ipv4::validate(ip, ETH_HLEN, ctx.len())
    {
        let hdr = nat::Ip {
            src,
            dst,
            proto: ip.protocol,
            hlen,
            frag: u16::from_be_bytes(ip.frag_off),
        };
        let mut answer = nat::hostport_in(ctx, &hdr, nat::Client::Remote);
        let mut counter = Counter::FwdDnat;
        if matches!(answer, nat::Reply::NotOurs) && !decapped {
            counter = Counter::FwdSvc;
            answer = nat::service_in(ctx, &cfg, &hdr);
        }
        if matches!(answer, nat::Reply::NotOurs) {
            counter = Counter::FwdDnat;
            answer = nat_icmp::hostport_error_in(ctx, &hdr);
        }
        // Replies of masqueraded flows come from the underlay; answers of
        // Service flows sent to a backend on another node come back
        // through the overlay (decapsulated) or routed natively.
        if matches!(answer, nat::Reply::NotOurs)
            && to_node
            && let Some(nat) = maps::nat_ports()
        {
            counter = Counter::RevSnat;
            answer = match nat_icmp::snat_error(ctx, &cfg, &hdr) {
                nat::Reply::NotOurs => nat::reply(ctx, &cfg, &nat, &hdr),
                other => other,
            };
        }
        match answer {
            nat::Reply::Deliver(ep) => return deliver(ctx, &cfg, Target::Pod(ep), counter),
            nat::Reply::Done(v) => return v,
            nat::Reply::NotOurs => {}
        }
    }
    if decapped {
        return to_host(ctx, &cfg, Counter::DeliverHost);
    }
    if to_node {
        if maps::route(src).is_some() && cfg.host_ifindex != 0 {
            // A remote pod talking to this node, routed natively.
            if let Err(reason) = plain_ok(ctx, ip) {
                return verdict::drop(ctx, reason);
            }
            return to_host(ctx, &cfg, Counter::DeliverHost);
        }
        return verdict::pass(ctx, Counter::UplinkPass);
    }
    if let Some(ep) = maps::endpoint(dst)
        && maps::route(src).is_some()
    {
        if let Err(reason) = plain_ok(ctx, ip) {
            return verdict::drop(ctx, reason);
        }
        return deliver(ctx, &cfg, Target::Pod(*ep), Counter::FwdFromPeer);
    }
    // Anything else for a pod (routed to it by the node's stack) is asked
    // the pod's ingress too.
    if let Some(ep) = maps::endpoint(dst)
        && ep.flags & endpoint_flags::POLICY_INGRESS != 0
    {
        return policy::defer(policy::Deferred::Pass, ep.flags, Counter::UplinkPass);
    }
    verdict::pass(ctx, Counter::UplinkPass)
}

/// A remote pod's packet routed natively, which rivet delivers: checked
/// like a pod's own (IPv4 header, transport header within the datagram).
#[inline(always)]
fn plain_ok(ctx: &TcContext, ip: &Ipv4Hdr) -> Result<(), Counter> {
    let hlen = ipv4::validate(ip, ETH_HLEN, ctx.len()).map_err(|_| Counter::DropBadIpHeader)?;
    if !ipv4::transport_fits(ctx, ip, ETH_HLEN + hlen, hlen) {
        return Err(Counter::DropTruncated);
    }
    Ok(())
}

/// The UDP destination port, wherever the IPv4 header ends; `None` for a
/// fragment after the first (its payload is no UDP header).
#[inline(always)]
fn udp_dport(ctx: &TcContext, ip: &Ipv4Hdr) -> Option<u16> {
    if u16::from_be_bytes(ip.frag_off) & ipv4::IP_OFFSET != 0 {
        return None;
    }
    let hlen = usize::from(ip.version_ihl & 0x0f) * 4;
    if hlen == IPV4_HLEN
        && let Some(udp) = ptr_at::<UdpHdr>(ctx, ETH_HLEN + IPV4_HLEN)
    {
        // SAFETY: bounds-checked; alignment 1.
        return Some(u16::from_be_bytes(unsafe { (*udp).dest }));
    }
    if !(IPV4_HLEN..=60).contains(&hlen) {
        return None;
    }
    ctx.load::<[u8; 2]>(ETH_HLEN + hlen + 2)
        .ok()
        .map(u16::from_be_bytes)
}

/// Outer header rules shared by both tunnels: a valid header (its total
/// length within the frame) without options, not a fragment, from a known
/// node. Returns where the outer datagram ends in the frame.
#[inline(always)]
fn outer_ok(ctx: &TcContext, ip: &Ipv4Hdr, src: u32) -> Result<usize, Counter> {
    if ipv4::validate(ip, ETH_HLEN, ctx.len()).is_err()
        || ip.version_ihl & 0x0f != 5
        || (u16::from_be_bytes(ip.frag_off) & 0x3fff) != 0
    {
        return Err(Counter::DropTunnelMalformed);
    }
    if maps::peer(src).is_none() {
        return Err(Counter::DropTunnelUnknownPeer);
    }
    Ok(ETH_HLEN + usize::from(u16::from_be_bytes(ip.tot_len)))
}

/// Where the inner packet at `off` goes; checks its header, and that it
/// lies within the tunnel payload, which ends at `end`.
#[inline(always)]
fn inner_target(
    ctx: &TcContext,
    cfg: &NodeConfig,
    off: usize,
    end: usize,
) -> Result<Target, Counter> {
    let inner = ptr_at::<Ipv4Hdr>(ctx, off).ok_or(Counter::DropTunnelMalformed)?;
    // SAFETY: bounds-checked; alignment 1.
    let inner = unsafe { &*inner };
    let Ok(hlen) = ipv4::validate(inner, off, end as u32) else {
        return Err(Counter::DropTunnelMalformed);
    };
    if !ipv4::transport_fits(ctx, inner, off + hlen, hlen) {
        return Err(Counter::DropTunnelMalformed);
    }
    let dst = addr(&inner.dst);
    if let Some(ep) = maps::endpoint(dst) {
        return Ok(Target::Pod(*ep));
    }
    if cfg.host_ifindex != 0 && (dst == cfg.node_ip || maps::is_local_addr(dst)) {
        return Ok(Target::Host);
    }
    Err(Counter::DropTunnelNoEndpoint)
}

#[inline(always)]
fn vxlan_in(
    ctx: &TcContext,
    cfg: &NodeConfig,
    ip: &Ipv4Hdr,
    src: u32,
) -> Result<(Target, Counter), Counter> {
    let checked = outer_ok(ctx, ip, src).and_then(|end| {
        let hdr = ptr_at::<VxlanEncap>(ctx, ETH_HLEN).ok_or(Counter::DropTunnelMalformed)?;
        // SAFETY: bounds-checked; alignment 1.
        let hdr = unsafe { &*hdr };
        let vni = u32::from(hdr.vxlan.vni[0]) << 16
            | u32::from(hdr.vxlan.vni[1]) << 8
            | u32::from(hdr.vxlan.vni[2]);
        if hdr.vxlan.flags & VXLAN_FLAG_VNI == 0 || vni != cfg.vni {
            return Err(Counter::DropTunnelBadVni);
        }
        if hdr.eth.proto != ETH_P_IP {
            return Err(Counter::DropTunnelMalformed);
        }
        // The UDP datagram holds the VXLAN header and the inner frame, and
        // lies within the outer one.
        let udp_end = ETH_HLEN + IPV4_HLEN + usize::from(u16::from_be_bytes(hdr.udp.len));
        if udp_end < ETH_HLEN + VXLAN_OVERHEAD as usize || udp_end > end {
            return Err(Counter::DropTunnelMalformed);
        }
        inner_target(ctx, cfg, ETH_HLEN + VXLAN_OVERHEAD as usize, udp_end)
    });
    checked
        .and_then(|t| encap::strip(ctx, VXLAN_OVERHEAD).map(|()| t))
        .map(|t| (t, Counter::DecapVxlan))
}

#[inline(always)]
fn ipip_in(
    ctx: &TcContext,
    cfg: &NodeConfig,
    ip: &Ipv4Hdr,
    src: u32,
) -> Result<(Target, Counter), Counter> {
    let checked = outer_ok(ctx, ip, src)
        .and_then(|end| inner_target(ctx, cfg, ETH_HLEN + IPIP_OVERHEAD as usize, end));
    checked
        .and_then(|t| encap::strip(ctx, IPIP_OVERHEAD).map(|()| t))
        .map(|t| (t, Counter::DecapIpip))
}

/// Hands the (now plain) IPv4 packet to its pod, or to the node.
#[inline(always)]
fn deliver(ctx: &TcContext, cfg: &NodeConfig, target: Target, counter: Counter) -> i32 {
    let Target::Pod(ep) = target else {
        return to_host(ctx, cfg, Counter::DeliverHost);
    };
    let (Some(eth), Some(ip)) = (ptr_at::<EthHdr>(ctx, 0), ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN)) else {
        return verdict::drop(ctx, Counter::DropTunnelMalformed);
    };
    // SAFETY: bounds-checked after the last size change; alignment 1.
    let (eth, ip) = unsafe { (&mut *eth, &mut *ip) };
    if ip.ttl <= 1 {
        // The node's stack answers with time-exceeded; it sees the packet
        // arrive on rivet_host, the device its route to the sender uses.
        return to_host(ctx, cfg, Counter::PassTtl);
    }
    ipv4::decrease_ttl(ip);
    eth.dst = ep.mac;
    eth.src = ep.host_mac;
    // The pod's NetworkPolicy ingress is asked for the packet as it now
    // is (decapsulated, translated: the real client and pod port), then
    // it is redirected.
    policy::defer(policy::Deferred::Redirect(ep.ifindex), ep.flags, counter)
}

/// Delivers the plain IPv4 packet to the node's stack as if received on
/// `rivet_host`.
#[inline(always)]
fn to_host(ctx: &TcContext, cfg: &NodeConfig, counter: Counter) -> i32 {
    if cfg.host_ifindex == 0 {
        return verdict::pass(ctx, Counter::UplinkPass);
    }
    if let Some(eth) = ptr_at::<EthHdr>(ctx, 0) {
        // SAFETY: bounds-checked; alignment 1.
        unsafe { (*eth).dst = cfg.host_mac };
    }
    verdict::redirect_ingress(ctx, cfg.host_ifindex, counter)
}
