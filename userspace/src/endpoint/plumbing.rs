//! The host side of ADD: the veth, its address, route and neighbour, the map
//! entry and the attached program, each step undone by [`Rollback`] when a
//! later one fails.
//!
//! The host end is named `rv` + 13 hex digits of FNV-1a(container ID, ifname)
//! (`rivet_api::host_ifname`, which the CNI plugin's DEL derives too), has no
//! address and IPv6 disabled (`disable_ipv6=1`, `accept_ra=0`, `accept_dad=0`:
//! rivet is IPv4-only, and this keeps the drop counters free of ND/MLD noise);
//! it carries a `/32` route to the pod and a permanent neighbour entry (the
//! host learns the pod's MAC from the agent, never by ARP; a valid ARP reply
//! from a pod is still passed). The veth is created with its pod end directly
//! inside the pod namespace (`IFLA_NET_NS_FD` on the peer), never moved, so the
//! pod's `eth0` cannot clash with a host name.

use std::net::Ipv4Addr;

use rivet_api::{Endpoint, EndpointState};
use rivet_common::{EndpointInfo, HostPortKey, endpoint_flags, program_names};

use super::{
    Drain, EndpointError, Endpoints, Timeline,
    hostports::hostport_entries,
    pod::{PodPlan, PodSide, parse_routes},
};
use crate::{
    datapath::{AttachMode, Datapath, pins::Hook},
    netlink::{LinkInfo, Netlink, batch::Batch, format_mac, netns},
    store::RecordDir,
};

/// Flags of an endpoint's map entry.
pub(super) fn entry_flags(ep: &Endpoint) -> u32 {
    if hostport_entries(ep).is_empty() {
        endpoint_flags::READY
    } else {
        endpoint_flags::READY | endpoint_flags::HOSTPORTS
    }
}

/// Steps to undo if ADD fails part-way.
#[derive(Default)]
pub(super) struct Rollback {
    record: Option<String>,
    veth: Option<(u32, String)>,
    map_ip: Option<Ipv4Addr>,
    link: Option<String>,
    /// A `BANDWIDTH` entry by host veth ifindex.
    bandwidth: Option<u32>,
    hostports: Vec<HostPortKey>,
    netns_cookie: Option<u64>,
}

impl Rollback {
    pub(super) async fn run(self, nl: &Netlink, dp: &mut Datapath, store: &RecordDir) {
        if let Some(cookie) = self.netns_cookie
            && let Err(e) = dp.remove_pod_netns(cookie)
        {
            tracing::warn!(error = %e, "rollback: forgetting the pod namespace");
        }
        for key in self.hostports {
            if let Err(e) = dp.remove_hostport(key) {
                tracing::warn!(error = %e, "rollback: removing a hostPort");
            }
        }
        if let Some(ifname) = self.link
            && let Err(e) = dp.detach(&ifname, Hook::Ingress)
        {
            tracing::warn!(error = %e, "rollback: detaching");
        }
        if let Some(ifindex) = self.bandwidth
            && let Err(e) = dp.remove_pod_bandwidth(ifindex)
        {
            tracing::warn!(error = %e, "rollback: removing bandwidth limits");
        }
        if let Some(ip) = self.map_ip
            && let Err(e) = dp.remove_endpoint(ip)
        {
            tracing::warn!(error = %e, "rollback: removing map entry");
        }
        if let Some((index, name)) = self.veth
            && let Err(e) = nl.delete_link(index, &name).await
        {
            tracing::warn!(error = %e, "rollback: deleting veth");
        }
        if let Some(key) = self.record
            && let Err(e) = store.remove(&key)
        {
            tracing::warn!(error = %e, "rollback: removing the pending record");
        }
    }
}

/// The MAC a pod gets: locally administered unicast `02:72` followed by its
/// IPv4 address — unique wherever the address is, stable across a restart of
/// the pod with the same address (no stale neighbour entries anywhere).
pub fn pod_mac_for(ip: Ipv4Addr) -> [u8; 6] {
    let [a, b, c, d] = ip.octets();
    [0x02, 0x72, a, b, c, d]
}

/// Deletes a pod's host veth (its peer, routes and neighbour go with it);
/// already gone is fine.
pub async fn delete_veth(nl: &Netlink, d: &Drain) -> Result<(), EndpointError> {
    match nl.delete_link(d.index, &d.host).await {
        Ok(()) => Ok(()),
        Err(e) if e.errno() == Some(libc::ENODEV) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// rivet is IPv4-only: no link-local addresses, no DAD, no router
/// advertisements on either end of a pod veth. Best effort: a kernel without
/// IPv6 has none of these files.
pub(super) fn disable_ipv6(ifname: &str) {
    let values = [
        ("accept_ra", "0"),
        ("accept_dad", "0"),
        ("disable_ipv6", "1"),
    ];
    if let Err((key, e)) = netns::write_if_sysctls("ipv6", ifname, &values) {
        tracing::debug!(ifname, key, error = %e, "ipv6 sysctl");
    }
}

impl Endpoints {
    /// Creates the veth, its pod end directly in the pod's namespace. A
    /// host veth with our derived name but no ready record is a leftover of
    /// a crash between veth creation and persisting: it is ours, deleted and
    /// the creation retried. Otherwise `EEXIST` means the pod already has
    /// an interface of that name, which is left alone. Returns the host end
    /// (as the kernel echoed the creation).
    pub(super) async fn create_veth(
        &mut self,
        ep: &Endpoint,
        netns_file: &std::fs::File,
        pod_mac: [u8; 6],
        nl: &Netlink,
    ) -> Result<Option<LinkInfo>, EndpointError> {
        let host = &ep.host_ifname;
        for attempt in 0..2 {
            match self
                .sync_nl
                .create_veth(host, &ep.ifname, netns_file, ep.mtu, pod_mac)
            {
                Ok(Some(link)) => return Ok(Some(link)),
                // No echo (kernel before 6.3): looked up instead.
                Ok(None) => return Ok(self.sync_nl.link_by_name(host)?),
                Err(e) if !e.is_exists() => return Err(e.into()),
                Err(_) => {}
            }
            match self.sync_nl.link_by_name(host)? {
                Some(stale) if attempt == 0 => {
                    tracing::warn!(host, "removing leftover veth without a record");
                    match nl.delete_link(stale.index, host).await {
                        Ok(()) => {}
                        Err(e) if e.errno() == Some(libc::ENODEV) => {}
                        Err(e) => return Err(e.into()),
                    }
                    self.draining.retain(|_, d| d.host != *host);
                }
                _ => break,
            }
        }
        Err(EndpointError::Conflict(format!(
            "interface {} already exists in netns {}",
            ep.ifname, ep.netns
        )))
    }

    pub(super) async fn plumb(
        &mut self,
        mut ep: Endpoint,
        netns_file: std::fs::File,
        nl: &Netlink,
        dp: &mut Datapath,
        rollback: &mut Rollback,
        mut timeline: Timeline,
    ) -> Result<Endpoint, EndpointError> {
        let host = ep.host_ifname.clone();
        // The lease: recorded (on the blocking pool, while the veth is being
        // created) before the ADD can succeed. A crash of the agent keeps it
        // (page cache); a crash of the machine takes the veth and the pod
        // with it, so it is never fsync'ed. A crash before it is written
        // leaves at most a veth no record owns, which reconciliation deletes.
        rollback.record = Some(host.clone());
        self.by_ref
            .insert((ep.container_id.clone(), ep.ifname.clone()), ep.clone());
        let pending = {
            let (store, key, record) = (self.store.clone(), host.clone(), ep.clone());
            tokio::task::spawn_blocking(move || store.save_volatile(&key, &record))
        };
        // The pod side's thread starts now, beside the veth creation.
        let mut pod_side = PodSide::start(
            netns_file
                .try_clone()
                .map_err(|e| EndpointError::Other(format!("duplicating the netns fd: {e}")))?,
            PodPlan {
                ifname: ep.ifname.clone(),
                ip: ep.ip,
                gateway: ep.gateway,
                routes: parse_routes(&ep.routes)?,
            },
            self.spare.take(),
        )?;
        let pod_mac = pod_mac_for(ep.ip);
        let created = self.create_veth(&ep, &netns_file, pod_mac, nl).await;
        timeline.mark("veth");
        if let Ok(Some(link)) = &created {
            rollback.veth = Some((link.index, host.clone()));
        }
        pending
            .await
            .map_err(|e| EndpointError::Other(format!("record writer: {e}")))??;
        self.step("after_reserve", &mut timeline)?;
        let host_link: LinkInfo = created?
            .ok_or_else(|| EndpointError::Other(format!("veth {host} vanished after creation")))?;
        self.step("after_veth", &mut timeline)?;

        // The pod end's sysctls start now, beside the map entry.
        let _ = pod_side.configure.send(host_link.link);

        // The map entry before the program: `from_pod` must find it.
        dp.put_endpoint(
            ep.ip,
            EndpointInfo {
                ifindex: host_link.index,
                flags: entry_flags(&ep),
                mac: pod_mac,
                host_mac: host_link.mac,
            },
        )?;
        rollback.map_ip = Some(ep.ip);
        self.step("after_map", &mut timeline)?;

        // Both ends' IPv6 sysctls, then both ends' netlink batches
        // concurrently (see [`PodSide`] for why no sysctl write overlaps a
        // batch). In tc mode the program is attached in the host side's.
        disable_ipv6(&host);
        timeline.mark("host_sysctls");
        let _ = (&mut pod_side.sysctls_done).await;
        timeline.mark("pod_sysctls");
        let _ = pod_side.proceed.send(());
        let mut batch = Batch::new();
        batch
            .set_up(host_link.index, &host)
            .add_link_route(ep.ip, 32, host_link.index, &host)
            .add_permanent_neighbour(host_link.index, &host, ep.ip, pod_mac);
        let tc_mode = self.settings.attach == AttachMode::Tc;
        if tc_mode {
            let filter = dp.tc_filter(program_names::FROM_POD, Hook::Ingress)?;
            batch.add_clsact(host_link.index, &host).replace_bpf_filter(
                host_link.index,
                &host,
                &filter,
            );
            rollback.link = Some(host.clone());
        }
        let host_side = self.sync_nl.run(batch);
        timeline.mark("host_batch");
        let pod_done = pod_side
            .done
            .await
            .map_err(|e| EndpointError::Other(format!("pod netns thread: {e}")))??;
        host_side?;
        if let Some(seen_mac) = pod_done.mac
            && seen_mac != pod_mac
        {
            return Err(EndpointError::Other(format!(
                "{} in the pod has MAC {} instead of {}",
                ep.ifname,
                format_mac(&seen_mac),
                format_mac(&pod_mac)
            )));
        }
        self.step("after_both_sides", &mut timeline)?;
        // Bandwidth limits once the pod's interface is in place: the
        // qdiscs, then the map entry (the endpoint's flags follow it; an
        // ingress flag steers through the host veth's qdisc).
        let (shapers, limits) = super::bandwidth::plan(ep.bandwidth.as_ref(), ep.mtu);
        if let Some(limits) = limits {
            rollback.bandwidth = Some(host_link.index);
            super::bandwidth::shape(host_link.index, &host, &ep.netns, &ep.ifname, &shapers)?;
            dp.set_pod_bandwidth(ep.ip, host_link.index, Some(limits))?;
            timeline.mark("bandwidth");
        }

        if !tc_mode {
            dp.attach_with(
                self.settings.attach,
                program_names::FROM_POD,
                &host,
                Hook::Ingress,
            )?;
            rollback.link = Some(host.clone());
        }
        self.step("after_attach", &mut timeline)?;
        for (key, target) in hostport_entries(&ep) {
            dp.put_hostport(key, target)?;
            rollback.hostports.push(key);
        }
        dp.put_pod_netns(pod_done.netns_cookie)?;
        rollback.netns_cookie = Some(pod_done.netns_cookie);
        ep.netns_cookie = Some(pod_done.netns_cookie);

        ep.mac = format_mac(&pod_mac);
        ep.host_ifindex = host_link.index;
        ep.host_mac = format_mac(&host_link.mac);
        ep.state = EndpointState::Ready;
        // Like the pending record, not fsync'ed: it must survive a crash of
        // the agent (page cache), and a crash of the machine ends the veth
        // and the pod it describes (start-up reconciliation then releases
        // it, and a record garbled by the crash is ignored).
        self.store.rewrite_volatile(&host, &ep)?;
        timeline.mark("ready_record");
        tracing::debug!(host = %host, timing = %timeline, "endpoint add steps");
        self.by_ref
            .insert((ep.container_id.clone(), ep.ifname.clone()), ep.clone());
        Ok(ep)
    }
}
