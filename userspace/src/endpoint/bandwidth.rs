//! Pod bandwidth limits: the CNI `bandwidth` capability (rates in bits/s,
//! bursts in bits, per direction; checked by `rivet_api::Bandwidth::validate`
//! as the reference `bandwidth` plugin checks them) applied at ADD, changed
//! on a running pod (`rivetctl bandwidth`), gone with the veth at DEL and
//! re-applied at start.
//!
//! **Mechanism, chosen by measurement.** A token-bucket policer in TC BPF
//! alone (drop what exceeds the rate) was built and measured first: TCP
//! through it reached 0.05–0.77× the rate (10 Mbit/s–1 Gbit/s, 1 and 4
//! streams, bursts of 10 and 100 ms; 2026-12-02) — with pod-to-pod round
//! trips of tens of microseconds every drop hits a sender whose window is
//! far above what the bucket passes, and it retransmits into the same
//! empty bucket. A queue is needed, so each limited direction gets an
//! `htb` qdisc tree (`rivet_netlink::messages::shaper`) and the datapath
//! makes every path cross it (`ebpf/src/bandwidth.rs`):
//! - egress: the tree is the root qdisc of the pod's `eth0`. The sender's
//!   own stack feels the queue (TCP small queues): TCP slows down instead
//!   of losing packets. `from_pod` checks the result against a token bucket
//!   at what the tree can pass (the rate and the small class's share) and
//!   twice the queue deep, which only traffic sent around the qdisc can
//!   exceed (`drop_bandwidth`).
//! - ingress: the tree is the root qdisc of the host-side veth; deliveries
//!   into a pod with an ingress limit use `bpf_redirect` to that veth's
//!   egress instead of `bpf_redirect_peer` (which skips it).
//!
//! **Why `htb` classes around a `tbf`.** Both qdiscs charge a GSO packet
//! by the frames it becomes, so both are exact over time. A `tbf` alone
//! sends a packet only once its bucket holds the whole of it and holds it
//! at the head of its queue meanwhile: a 64 KiB packet at 100 Mbit/s
//! keeps everything behind it, a ping included, for 5.2 ms (a bucket so
//! small that `tbf` cuts GSO packets into frames costs the receiving pod
//! 3–4× the CPU per byte). So small packets (pings, TCP acks, DNS) get an
//! `htb` class of their own with tokens of their own and are served
//! first: they wait for neither the flow's queue nor the packet before
//! them. Measured in two namespaces, one iperf3 flow and pings every
//! 10 ms (2026-12-06, p99 added by the flow; goodput ÷ rate; machine
//! CPU-s per GB): ingress at 100 Mbit/s, `tbf` (1 ms burst, small packets
//! first) 0.16 ms, 0.956, 6.1 → `htb` 0.06 ms, 0.957, 1.4–1.8; at
//! 10 Mbit/s 3.4 ms → 0.06 ms; egress at 1 Gbit/s 0.58 → 0.06 ms. The
//! rest (the bulk class) is held to the rate by a `tbf` with a bucket of
//! at least two GSO packets ([`MIN_BULK_BURST_BYTES`]), not by an `htb`
//! class: `htb` charges a packet after sending it, which a TCP sender
//! whose round trip spans a packet or two reads as a rate above the limit
//! (BBR's estimate 114–133 Mbit/s at 100 Mbit/s, its sender throttled
//! about 190 times a second; `rivet_netlink::messages::shaper` has the
//! figures).
//!
//! **What the rate counts: IP bytes.** A rate is the IP packets a pod
//! sends or receives per second, not the Ethernet frames its veth wraps
//! them in: the pod's traffic has no Ethernet header once it is routed,
//! encapsulated or leaves the node, and its TCP gets the larger share of
//! the rate (payload ÷ IP packet = (MTU − 52) ÷ MTU with timestamps, 0.965
//! at MTU 1500, against 0.956 of a frame). `htb` and `tbf` charge frames
//! (the kernel's `qdisc_pkt_len`: a GSO packet by the frames it becomes),
//! and their rate specification cannot subtract a per-packet overhead (a size
//! table can, but it charges a GSO packet as one frame), so the qdisc's
//! rate is the requested one scaled by (MTU + 14) ÷ MTU ([`frame_rate`]):
//! a full-size packet is charged exactly its IP bytes, a smaller one a
//! little more, never more than its frame (a 66-byte TCP ack as 65.4
//! bytes, not 52). The datapath's egress check uses the same frame rate.
//!
//! **Queue and burst.** Each class's queue ([`queue_bytes`]) holds at
//! least two whole GSO packets — a queue shorter than one drops every such
//! packet, and TCP stalls (measured at 10 Mbit/s with a 12.5 KB queue:
//! 0.8 % of the rate). Egress it holds 10 ms of the rate: a drop there is
//! the sender's own qdisc refusing a packet, which its TCP is told of and
//! waits out, nothing is lost on the wire. Ingress a drop is a loss the
//! sender learns of a round trip later and retransmits, and a sender on
//! the node keeps up to two GSO packets per socket in the queue (its TCP
//! small-queue allowance: `bpf_redirect` keeps the packets charged to its
//! socket), so the ingress queue holds 25 ms of the rate and eight GSO
//! packets (four such senders) where those are at most 50 ms of the rate.
//! Measured 2026-12-06 in the demo's cluster, a pod limited to 100 Mbit/s
//! ingress receiving four TCP streams from a pod of its node, 11 s, the
//! bulk leaf's limit alternated: 135 KB (10 ms) 13,909–16,549
//! retransmissions and 711–809 drops per run, 540 KB 603–1,018 and 19–31;
//! one stream 1,028–3,395 against 0; at 1 Gbit/s, four streams, 10 ms
//! 3,399–19,902 retransmissions (84–484 drops) against 25 ms 10–147 (no
//! drop); goodput the same (0.953–0.964×). The 50 ms cap: at 10 Mbit/s
//! eight GSO packets would be 430 ms, and there four streams kept even
//! that queue full (backlog p50 186 KB against 117 KB with two GSO
//! packets) while retransmitting as much (1,228–1,247 against
//! 1,282–1,532 per run), so a low rate keeps two. A small packet is not behind
//! this queue (it has a class of its own), only the bulk flow's own. The
//! burst (the bucket) is the
//! requested one but at most 10 ms of the rate ([`burst_bytes`], at least
//! four frames): runtimes pass huge bursts (containerd's CRI sends 2³²−1
//! bits, "no limit"), and the reference plugin's 512 MiB bucket lets a
//! 15 Mbit/s pod send at line rate for seconds. Ten milliseconds, not one:
//! the bucket is what pays back a late dequeue (a timer or a softirq that
//! runs late leaves the class idle, and what it could have sent is kept
//! only up to the bucket), and at 1 Gbit/s a millisecond holds two GSO
//! packets. Measured 2026-12-06 in two nodes, a pod limited to 1 Gbit/s
//! sending four TCP streams to a pod across the VXLAN overlay, 11 s, the
//! bucket alternated: goodput over seconds 1–10 0.922–0.963× with 1 ms,
//! 0.957–0.964× with 10 ms, higher in 12 of 12 pairs (the suite's run
//! that prompted it had 0.76× and 0.80× with 1 ms). The bulk's `tbf`
//! bucket is the same but at least [`MIN_BULK_BURST_BYTES`] (a `tbf` cuts
//! a packet larger than its bucket into frames): a first second of at
//! most 1 % over the rate at 1 Gbit/s, 11 % at 10 Mbit/s. The class the
//! two leaves share has a bucket [`SHARED_BURST_MARGIN`] deeper than
//! theirs, at least the bulk's, so the bulk never leaves it in debt
//! (`rivet_netlink::messages::shaper`).

use std::path::Path;

use rivet_api::{Bandwidth, BandwidthFigures, Endpoint, EndpointState};
use rivet_common::{Bucket, PodBandwidth, bandwidth_dir};
use rivet_netlink::{
    RouteSocket,
    messages::{SHAPER_SMALL_SHARE, Shaper},
};

use super::{EndpointError, Endpoints};
use crate::{datapath::Datapath, netlink::netns};

/// A maximal GSO packet with its headers, bytes.
pub const GSO_MAX_BYTES: u64 = 65_536 + 2_048;
/// The egress queue holds this many milliseconds of the rate…
pub const QUEUE_MS: u64 = 10;
/// …and either queue at least this many bytes: two whole GSO packets.
pub const MIN_QUEUE_BYTES: u64 = 2 * GSO_MAX_BYTES;
/// The ingress queue holds this many milliseconds of the rate…
pub const INGRESS_QUEUE_MS: u64 = 25;
/// …and this many GSO packets (four senders' small-queue allowance)…
pub const INGRESS_QUEUE_GSO: u64 = 8;
/// …where they are at most this many milliseconds of the rate.
pub const INGRESS_QUEUE_MAX_MS: u64 = 50;
/// The bucket (burst) holds at most this many milliseconds of the rate…
pub const BURST_MS: u64 = 10;
/// …and at least this many bytes (four full frames).
pub const MIN_BURST_BYTES: u64 = 4 * 1_514;
/// The rate class's bucket is deeper than its leaves' by this, bytes: two
/// whole GSO packets, more than a leaf can owe (its largest packet), so
/// that it does not wake the qdisc a second time per packet while one
/// leaf sends alone (`rivet_netlink::messages::shaper`).
pub const SHARED_BURST_MARGIN: u64 = 2 * GSO_MAX_BYTES;
/// The bulk class's token bucket holds at least this many bytes: two
/// whole GSO packets, more than the frames of the largest (a `tbf` cuts a
/// packet larger than its bucket into frames, or drops it).
pub const MIN_BULK_BURST_BYTES: u64 = 2 * GSO_MAX_BYTES;
/// The Ethernet header each frame on a veth adds to its IP packet, bytes:
/// charged by the qdisc, not counted in the rate.
pub const ETH_HEADER_BYTES: u64 = 14;
/// The smallest link MTU an IPv4 host must handle (RFC 791); a smaller
/// one is taken as this in [`frame_rate`].
const MIN_MTU: u32 = 576;

/// True when `bw` limits either direction.
pub fn limits_any(bw: Option<&Bandwidth>) -> bool {
    bw.is_some_and(Bandwidth::limits_any)
}

/// The largest bucket of a qdisc shaping at `rate` bytes/s.
pub fn burst_bytes(rate: u64) -> u64 {
    (rate.saturating_mul(BURST_MS) / 1_000).max(MIN_BURST_BYTES)
}

/// The queue of a qdisc shaping direction `dir` ([`bandwidth_dir`]) at
/// `rate` bytes/s.
pub fn queue_bytes(rate: u64, dir: usize) -> u64 {
    let ms = |ms: u64| rate.saturating_mul(ms) / 1_000;
    let queue = if dir == bandwidth_dir::INGRESS {
        ms(INGRESS_QUEUE_MS).max((INGRESS_QUEUE_GSO * GSO_MAX_BYTES).min(ms(INGRESS_QUEUE_MAX_MS)))
    } else {
        ms(QUEUE_MS)
    };
    queue.max(MIN_QUEUE_BYTES)
}

/// The rate, bytes/s, at which a qdisc charging whole Ethernet frames
/// passes `rate` bytes/s of full-size IP packets on a link of `mtu`.
pub fn frame_rate(rate: u64, mtu: u32) -> u64 {
    let mtu = u128::from(mtu.max(MIN_MTU));
    let scaled = u128::from(rate) * (mtu + u128::from(ETH_HEADER_BYTES)) / mtu;
    u64::try_from(scaled).unwrap_or(u64::MAX)
}

/// The qdisc shaping direction `dir` ([`bandwidth_dir`]) of a pod whose
/// link MTU is `mtu` (rate in bits/s of IP packets, burst in bits); `None`
/// for a zero rate (no limit).
pub fn shaper(rate_bits: u64, burst_bits: u64, mtu: u32, dir: usize) -> Option<Shaper> {
    let rate = frame_rate(rate_bits / 8, mtu);
    if rate == 0 {
        return None;
    }
    let queue = queue_bytes(rate, dir);
    let burst = (burst_bits / 8).clamp(MIN_BURST_BYTES, burst_bytes(rate));
    Some(Shaper {
        rate,
        burst: u32::try_from(burst).unwrap_or(u32::MAX),
        shared_burst: u32::try_from(burst + SHARED_BURST_MARGIN).unwrap_or(u32::MAX),
        bulk_burst: u32::try_from(burst.max(MIN_BULK_BURST_BYTES)).unwrap_or(u32::MAX),
        limit: u32::try_from(queue).unwrap_or(u32::MAX),
    })
}

/// The datapath's bucket for a direction shaped by `t`: the qdisc's rate
/// and burst; with `slack`, for the egress check behind the qdisc, the
/// most the tree passes (the rate and the small class's own share, both
/// classes full) and a deeper bucket (both classes' queues, a GSO packet,
/// and what the rate class's and the bulk's deeper buckets let go at
/// once, more). The queues, not the burst: what the qdisc
/// releases reaches the check after the softirq gets to it, and that
/// delay can exceed a burst (measured with a 1 ms burst: 13 packets
/// dropped over the 1 Gbit/s cells of `tests/tests/bandwidth.rs` with
/// twice the burst, 2.5 ms at that rate).
fn bucket(t: Option<&Shaper>, slack: bool) -> Bucket {
    let Some(t) = t else {
        return Bucket::default();
    };
    let (rate, depth) = if slack {
        (
            t.rate + t.rate / SHAPER_SMALL_SHARE,
            2 * u64::from(t.limit)
                + GSO_MAX_BYTES
                + u64::from(t.shared_burst.saturating_sub(t.burst))
                + u64::from(t.bulk_burst.saturating_sub(t.burst)),
        )
    } else {
        (t.rate, u64::from(t.burst))
    };
    let depth_ns = u128::from(depth) * 1_000_000_000 / u128::from(rate);
    Bucket {
        rate,
        depth_ns: u64::try_from(depth_ns).unwrap_or(u64::MAX),
        ..Bucket::default()
    }
}

/// What `bw` calls for on a pod link of `mtu`: the qdiscs by
/// [`bandwidth_dir`], and the map entry (`None` when it limits nothing).
pub fn plan(bw: Option<&Bandwidth>, mtu: u32) -> ([Option<Shaper>; 2], Option<PodBandwidth>) {
    let Some(bw) = bw.filter(|b| b.limits_any()) else {
        return ([None, None], None);
    };
    let mut shapers = [None, None];
    shapers[bandwidth_dir::EGRESS] = shaper(
        bw.egress_rate.unwrap_or(0),
        bw.egress_burst.unwrap_or(0),
        mtu,
        bandwidth_dir::EGRESS,
    );
    shapers[bandwidth_dir::INGRESS] = shaper(
        bw.ingress_rate.unwrap_or(0),
        bw.ingress_burst.unwrap_or(0),
        mtu,
        bandwidth_dir::INGRESS,
    );
    let mut pod = PodBandwidth::default();
    // The egress bucket is the datapath's check behind the pod's qdisc,
    // deeper than it, so shaped traffic never meets it.
    pod.buckets[bandwidth_dir::EGRESS] = bucket(shapers[bandwidth_dir::EGRESS].as_ref(), true);
    pod.buckets[bandwidth_dir::INGRESS] = bucket(shapers[bandwidth_dir::INGRESS].as_ref(), false);
    (shapers, Some(pod))
}

/// True when the datapath's `held` buckets carry the settings of `want`
/// (running figures aside).
pub fn same_settings(held: &PodBandwidth, want: &PodBandwidth) -> bool {
    held.buckets
        .iter()
        .zip(&want.buckets)
        .all(|(h, w)| h.rate == w.rate && h.depth_ns == w.depth_ns)
}

fn netlink_err(what: String) -> impl FnOnce(rivet_netlink::Error) -> EndpointError {
    move |e| EndpointError::Other(format!("{what}: {e}"))
}

/// Sets (`Some`) or removes (`None`) the root qdisc of link `index` in the
/// calling thread's namespace. A new limit replaces the qdisc whole (the
/// old one is deleted first): a qdisc changed in place keeps the packets
/// it queued for the old rate (measured with `tbf`: a TCP flow whose limit
/// went from 200 to 20 Mbit/s stalled for good with two 60 KB packets
/// stuck in the queue). Between the two steps (well under
/// a millisecond) the pod's traffic is not shaped.
fn set_qdisc(
    nl: &mut RouteSocket,
    index: u32,
    name: &str,
    t: Option<&Shaper>,
) -> Result<(), EndpointError> {
    nl.delete_root_qdisc(index)
        .map_err(netlink_err(format!("removing the shaper of {name}")))?;
    match t {
        Some(t) => nl
            .replace_shaper(index, t)
            .map_err(netlink_err(format!("shaping {name}"))),
        None => Ok(()),
    }
}

/// Puts the qdiscs of `shapers` in place: the ingress one on the host veth
/// `host_index`/`host`, the egress one on `ifname` inside the pod's
/// namespace `netns`.
pub(super) fn shape(
    host_index: u32,
    host: &str,
    netns_path: &str,
    ifname: &str,
    shapers: &[Option<Shaper>; 2],
) -> Result<(), EndpointError> {
    let mut nl =
        RouteSocket::open().map_err(|e| EndpointError::Other(format!("netlink socket: {e}")))?;
    set_qdisc(
        &mut nl,
        host_index,
        host,
        shapers[bandwidth_dir::INGRESS].as_ref(),
    )?;
    let egress = shapers[bandwidth_dir::EGRESS];
    netns::run_in(Path::new(netns_path), || {
        let mut nl = RouteSocket::open()
            .map_err(|e| EndpointError::Other(format!("netlink socket in the pod: {e}")))?;
        let link = nl
            .link_by_name(ifname)
            .map_err(netlink_err(format!("looking up {ifname} in the pod")))?
            .ok_or_else(|| EndpointError::Missing(format!("{ifname} is gone from the pod")))?;
        set_qdisc(&mut nl, link.index, ifname, egress.as_ref())
    })?
}

/// The shaping figures of the limited pods `limited` (each with its
/// datapath entry): the host veths' qdiscs from one dump of the node's,
/// each pod's own from a dump in its namespace. Blocking (netlink, a thread
/// per pod namespace); a pod whose figures cannot be read is left out
/// (logged).
pub fn figures(limited: &[(Endpoint, Option<PodBandwidth>)]) -> Vec<BandwidthFigures> {
    if limited.is_empty() {
        return Vec::new();
    }
    let host: Vec<rivet_netlink::messages::QdiscStats> = RouteSocket::open()
        .map_err(|e| e.to_string())
        .and_then(|mut nl| nl.shapers().map_err(|e| e.to_string()))
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "reading the host veths' qdiscs");
            Vec::new()
        });
    let mut out = Vec::new();
    for (ep, held) in limited {
        let Some(bw) = ep.bandwidth.as_ref().filter(|b| b.limits_any()) else {
            continue;
        };
        let pod = ep.pod.as_ref().map_or_else(
            || ep.container_id.clone(),
            |p| format!("{}/{}", p.namespace, p.name),
        );
        let figure =
            |direction: &str, rate: u64, q: rivet_netlink::messages::QdiscStats| BandwidthFigures {
                pod: pod.clone(),
                host_ifname: ep.host_ifname.clone(),
                direction: direction.to_owned(),
                rate,
                sent_bytes: q.bytes,
                dropped: q.drops,
                delayed: q.overlimits,
                backlog_bytes: q.backlog,
            };
        if let Some(rate) = bw.ingress_rate.filter(|r| *r != 0) {
            match host.iter().find(|q| q.index == ep.host_ifindex) {
                Some(q) => out.push(figure("ingress", rate, *q)),
                None => tracing::warn!(host = %ep.host_ifname, "no shaper on the host veth"),
            }
        }
        if let Some(rate) = bw.egress_rate.filter(|r| *r != 0) {
            let ifname = ep.ifname.clone();
            let inside = netns::run_in(Path::new(&ep.netns), move || {
                let mut nl = RouteSocket::open().map_err(|e| e.to_string())?;
                let index = nl
                    .link_by_name(&ifname)
                    .map_err(|e| e.to_string())?
                    .ok_or_else(|| format!("{ifname} is gone"))?
                    .index;
                let all = nl.shapers().map_err(|e| e.to_string())?;
                all.into_iter()
                    .find(|q| q.index == index)
                    .ok_or_else(|| format!("no shaper on {ifname}"))
            });
            match inside {
                Ok(Ok(q)) => {
                    let mut f = figure("egress", rate, q);
                    f.dropped +=
                        held.map_or(0, |h| h.buckets[bandwidth_dir::EGRESS].dropped_packets);
                    out.push(f);
                }
                Ok(Err(e)) => tracing::warn!(pod = %pod, error = %e, "egress shaping figures"),
                Err(e) => tracing::warn!(pod = %pod, error = %e, "egress shaping figures"),
            }
        }
    }
    out
}

impl Endpoints {
    /// The limited attachments, each with its datapath entry (for
    /// [`figures`]).
    pub fn limited(&self, dp: &Datapath) -> Vec<(Endpoint, Option<PodBandwidth>)> {
        self.by_ref
            .values()
            .filter(|e| e.state == EndpointState::Ready && limits_any(e.bandwidth.as_ref()))
            .map(|e| (e.clone(), dp.pod_bandwidth(e.host_ifindex).ok().flatten()))
            .collect()
    }

    /// Makes the node hold `ep`'s limits: its `BANDWIDTH` entry (the
    /// endpoint flags follow) and, with `qdiscs`, the shaping qdiscs
    /// (at ADD, a change, start-up; the periodic reconciliation checks the
    /// map only). `rewrite`: the entry is written even when its settings
    /// did not change (a change asked for starts with a full bucket).
    pub(super) fn apply_bandwidth(
        &self,
        dp: &mut Datapath,
        ep: &Endpoint,
        rewrite: bool,
        qdiscs: bool,
    ) -> Result<(), EndpointError> {
        let (shapers, want) = plan(ep.bandwidth.as_ref(), ep.mtu);
        if qdiscs && (want.is_some() || rewrite) {
            shape(
                ep.host_ifindex,
                &ep.host_ifname,
                &ep.netns,
                &ep.ifname,
                &shapers,
            )?;
        }
        let held = dp.pod_bandwidth(ep.host_ifindex)?;
        let current = match (&held, &want) {
            (Some(h), Some(w)) => same_settings(h, w),
            (None, None) => true,
            _ => false,
        };
        if rewrite || !current {
            dp.set_pod_bandwidth(ep.ip, ep.host_ifindex, want)?;
        }
        Ok(())
    }

    /// Changes the limits of the running attachment `r` (`None`: none) and
    /// records them. Returns the updated record.
    pub fn set_bandwidth(
        &mut self,
        r: &rivet_api::EndpointRef,
        bandwidth: Option<Bandwidth>,
        dp: &mut Datapath,
    ) -> Result<Endpoint, EndpointError> {
        if let Some(bw) = &bandwidth {
            bw.validate()
                .map_err(|e| EndpointError::BadRequest(format!("bandwidth: {e}")))?;
        }
        let key = (r.container_id.clone(), r.ifname.clone());
        let Some(mut ep) = self.by_ref.get(&key).cloned() else {
            return Err(EndpointError::Missing(format!(
                "no attachment for container {} interface {}",
                r.container_id, r.ifname
            )));
        };
        if ep.state != EndpointState::Ready {
            return Err(EndpointError::Conflict(format!(
                "attachment {} is not ready",
                ep.host_ifname
            )));
        }
        ep.bandwidth = bandwidth.filter(Bandwidth::limits_any);
        self.apply_bandwidth(dp, &ep, true, true)?;
        self.store.rewrite_volatile(&ep.host_ifname, &ep)?;
        self.by_ref.insert(key, ep.clone());
        Ok(ep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_counts_ip_bytes() {
        // A full-size frame on a 1500-byte link is 1514 bytes: the qdisc
        // charging frames runs 1514/1500 of the rate in IP bytes.
        assert_eq!(frame_rate(1_500_000, 1_500), 1_514_000);
        assert_eq!(frame_rate(1_450_000, 1_450), 1_464_000);
        // An MTU below IPv4's minimum is taken as the minimum.
        assert_eq!(frame_rate(576_000, 0), 590_000);
        assert_eq!(frame_rate(0, 1_500), 0);
        assert_eq!(frame_rate(u64::MAX, 1_500), u64::MAX);
    }

    #[test]
    fn burst_is_the_request_within_ten_milliseconds() {
        // 100 Mbit/s of IP packets on a 1500-byte link: 12,616,666 bytes/s
        // of frames; queue 10 ms = 126,166 bytes, less than two GSO
        // packets: 135,168; a 10 Mbit burst is cut to 10 ms, 126,166
        // bytes; a 1 Mbit one fits.
        let t = shaper(100_000_000, 10_000_000, 1_500, bandwidth_dir::EGRESS).expect("a limit");
        assert_eq!((t.rate, t.burst, t.limit), (12_616_666, 126_166, 135_168));
        let t = shaper(100_000_000, 1_000_000, 1_500, bandwidth_dir::EGRESS).expect("a limit");
        assert_eq!(t.burst, 125_000);
        // containerd's "no limit" burst at 160 Mbit/s: 10 ms.
        let t = shaper(
            160_000_000,
            u64::from(u32::MAX),
            1_500,
            bandwidth_dir::EGRESS,
        )
        .expect("a limit");
        assert_eq!((t.burst, t.limit), (201_866, 201_866));
        // Below 4.8 Mbit/s 10 ms is less than four frames: four.
        let t =
            shaper(4_000_000, u64::from(u32::MAX), 1_500, bandwidth_dir::EGRESS).expect("a limit");
        assert_eq!(u64::from(t.burst), MIN_BURST_BYTES);
        // A tiny rate and burst: four frames, two GSO packets.
        let t = shaper(1_000_000, 8_000, 1_500, bandwidth_dir::INGRESS).expect("a limit");
        assert_eq!(u64::from(t.burst), MIN_BURST_BYTES);
        assert_eq!(u64::from(t.limit), MIN_QUEUE_BYTES);
        assert!(shaper(0, 1000, 1_500, bandwidth_dir::INGRESS).is_none());
    }

    #[test]
    fn the_ingress_queue_holds_four_senders_allowance() {
        let ingress = |mbit: u64| {
            shaper(mbit * 1_000_000, 8_000, 1_500, bandwidth_dir::INGRESS)
                .map(|t| u64::from(t.limit))
        };
        // 10 Mbit/s: 50 ms is 63 KB, less than two GSO packets: two.
        assert_eq!(ingress(10), Some(MIN_QUEUE_BYTES));
        // 30 Mbit/s (3,785,000 bytes/s of frames): 50 ms of it.
        assert_eq!(ingress(30), Some(189_250));
        // 100 Mbit/s: eight GSO packets (43 ms), more than 25 ms.
        assert_eq!(ingress(100), Some(8 * GSO_MAX_BYTES));
        // 1 Gbit/s (126,166,666 bytes/s): 25 ms.
        assert_eq!(ingress(1_000), Some(3_154_166));
        // The egress queue at 1 Gbit/s: 10 ms.
        let egress = shaper(1_000_000_000, 8_000, 1_500, bandwidth_dir::EGRESS);
        assert_eq!(egress.map(|t| t.limit), Some(1_261_666));
        // A rate near u64::MAX saturates rather than overflowing.
        assert_eq!(
            queue_bytes(u64::MAX, bandwidth_dir::INGRESS),
            u64::MAX / 1_000
        );
    }

    #[test]
    fn plan_by_direction() {
        let (shapers, pod) = plan(
            Some(&Bandwidth::limits(Some((8_000_000, 8_000_000)), None)),
            1_500,
        );
        let pod = pod.expect("limits");
        assert!(shapers[bandwidth_dir::EGRESS].is_none());
        let ingress = shapers[bandwidth_dir::INGRESS].expect("ingress");
        assert_eq!(ingress.rate, 1_009_333);
        assert_eq!(pod.buckets[bandwidth_dir::INGRESS].rate, 1_009_333);
        assert_eq!(pod.buckets[bandwidth_dir::EGRESS], Bucket::default());
        let (shapers, pod) = plan(
            Some(&Bandwidth::limits(None, Some((800_000_000, 8_000_000)))),
            1_500,
        );
        let egress = shapers[bandwidth_dir::EGRESS].expect("egress");
        assert_eq!((egress.burst, egress.limit), (1_000_000, 1_009_333));
        // 100,933,333 bytes/s of frames: the requested 1,000,000-byte burst
        // within 10 ms, the bulk's bucket the same (above two GSO
        // packets); queue 1,009,333 bytes (10 ms); the rate class's bucket
        // two GSO packets deeper than the burst; the check behind the
        // qdisc at the rate and its 1/50 for small packets, 102,951,999
        // bytes/s, 2 × the queue + one GSO packet + those two = 2,221,418
        // bytes deep = 21.58 ms.
        assert_eq!(
            u64::from(egress.shared_burst),
            1_000_000 + SHARED_BURST_MARGIN
        );
        assert_eq!(egress.bulk_burst, 1_000_000);
        let check = pod.expect("limits").buckets[bandwidth_dir::EGRESS];
        assert_eq!((check.rate, check.depth_ns), (102_951_999, 21_577_220));
        // At 10 Mbit/s the burst is 10 ms (12,616 bytes of frames) and the
        // bulk's bucket two GSO packets: a `tbf` holds a packet whole.
        let (shapers, _) = plan(
            Some(&Bandwidth::limits(None, Some((10_000_000, 80_000_000)))),
            1_500,
        );
        let egress = shapers[bandwidth_dir::EGRESS].expect("egress");
        assert_eq!(
            (egress.burst, u64::from(egress.bulk_burst)),
            (12_616, MIN_BULK_BURST_BYTES)
        );
        assert!(
            plan(Some(&Bandwidth::limits(Some((0, 0)), None)), 1_500)
                .1
                .is_none()
        );
        assert!(plan(None, 1_500).1.is_none());
    }
}
