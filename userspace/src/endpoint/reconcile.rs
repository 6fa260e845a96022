//! Reconciliation: kernel state (veths, map entries, attached programs) brought
//! back to the records, and records that did not parse rebuilt from the kernel.
//!
//! At start-up and every 5 s, serialized with ADD/DEL so never racing one: it
//! releases pending records and records whose veth vanished, removes map
//! entries, link pins and `rv…` veths no record owns, and re-attaches
//! `from_pod` where it is missing. The slow queries run without the state lock,
//! so ADD and DEL never wait behind them: the tc filter probe of every pod veth
//! (one netlink dump each, ~0.3 ms) and the link dump, which is used only if no
//! ADD/DEL/GC changed anything meanwhile (a generation counter; otherwise it is
//! redone under the lock). With 100 pods the lock was held 30 ms per round
//! before; now ~1 ms.
//!
//! A record that does not parse at start (torn, truncated, corrupted) is
//! rebuilt at the first reconciliation from what the kernel holds: the live
//! host veth the file is named after (index, MTU), the `ENDPOINTS` entry on
//! that veth (address, both MACs) and the `HOSTPORTS` entries pointing at the
//! address; the container ID, ifname and netns are recovered from the damaged
//! text and accepted only if `host_ifname(container, ifname)` is the file's
//! name. The rebuilt record (state ready, pod metadata and extra routes
//! unknown) is written back and behaves like any other: CHECK, DEL and GC find
//! it. A file with no recoverable container, or whose veth or map entry is
//! gone, is left to the usual cleanup (its pod was already gone or cannot be
//! named). Tested in `restart.rs` (a record torn to half while the agent is
//! down: the pod keeps its address, hostPort and traffic).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::Ipv4Addr,
};

use rivet_api::{Endpoint, EndpointState, PortMapping, Protocol};
use rivet_common::{HostPortKey, HostPortTarget, ipv4_key, program_names};

use super::{
    Drain, EndpointError, Endpoints, Reattach, Timeline, hostports::hostport_entries,
    is_rivet_veth, now_secs, plumbing::delete_veth,
};
use crate::{
    datapath::{AttachMode, Datapath, pins::Hook},
    netlink::{LinkInfo, Netlink, format_mac},
};

/// The value of the JSON string field `"name": "…"` in possibly damaged
/// JSON text (the first occurrence; simple escapes only).
pub(super) fn json_string_field(text: &str, name: &str) -> Option<String> {
    let at = text.find(&format!("\"{name}\""))? + name.len() + 2;
    let rest = text[at..].trim_start().strip_prefix(':')?.trim_start();
    let body = rest.strip_prefix('"')?;
    let mut out = String::new();
    let mut chars = body.chars();
    loop {
        match chars.next()? {
            '"' => return Some(out),
            '\\' => out.push(chars.next()?),
            c => out.push(c),
        }
    }
}

impl Endpoints {
    /// The host veths (ifindex) whose tc attachment a periodic
    /// reconciliation should probe; empty in TCX mode (pins tell).
    pub fn tc_probe_targets(&self) -> Vec<u32> {
        if self.settings.attach != AttachMode::Tc {
            return Vec::new();
        }
        self.by_ref
            .values()
            .filter(|e| e.state == EndpointState::Ready)
            .map(|e| e.host_ifindex)
            .collect()
    }

    pub async fn reconcile(
        &mut self,
        nl: &Netlink,
        dp: &mut Datapath,
        reattach: Reattach<'_>,
        keep_links: &[String],
        local: &HashSet<Ipv4Addr>,
        prefetched: Option<(u64, Vec<LinkInfo>)>,
    ) -> Result<(), EndpointError> {
        let mut timeline = Timeline::start();
        // A dump taken without the state lock is used only if nothing
        // changed since (then it is exactly what a dump now would say).
        let links = match prefetched {
            Some((generation, links)) if generation == self.generation => links,
            _ => nl.links().await?,
        };
        let links: BTreeMap<String, LinkInfo> =
            links.into_iter().map(|l| (l.name.clone(), l)).collect();
        timeline.mark("links");
        if !self.unreadable.is_empty() {
            self.rebuild_unreadable(&links, dp)?;
        }

        let records: Vec<Endpoint> = self.by_ref.values().cloned().collect();
        for ep in records {
            let live = links
                .get(&ep.host_ifname)
                .is_some_and(|l| l.index == ep.host_ifindex);
            if ep.state == EndpointState::Pending || !live {
                tracing::info!(
                    container = %ep.container_id,
                    ip = %ep.ip,
                    state = ?ep.state,
                    "releasing an interrupted or vanished attachment"
                );
                self.del(&ep.reference(), nl, dp).await?;
                continue;
            }
            let want = self.map_entry(&ep)?;
            if dp.endpoint(ep.ip)? != Some(want) {
                tracing::info!(ip = %ep.ip, "restoring endpoint map entry");
                dp.put_endpoint(ep.ip, want)?;
            }
            let attach = match reattach {
                Reattach::All => true,
                Reattach::Missing(_) if self.settings.attach == AttachMode::Tcx => {
                    !dp.layout().link(&ep.host_ifname, Hook::Ingress).exists()
                }
                // Not probed (added since): ADD attached it.
                Reattach::Missing(probed) => probed.get(&ep.host_ifindex) == Some(&false),
            };
            if attach {
                dp.attach_with(
                    self.settings.attach,
                    program_names::FROM_POD,
                    &ep.host_ifname,
                    Hook::Ingress,
                )?;
            }
            // Limits as recorded; the qdiscs checked at start-up.
            self.apply_bandwidth(dp, &ep, false, matches!(reattach, Reattach::All))?;
        }
        // Limits of veths no record owns (ifindexes are reused).
        let owned: HashSet<u32> = self.by_ref.values().map(|e| e.host_ifindex).collect();
        for (ifindex, _) in dp.list_bandwidth()? {
            if !owned.contains(&ifindex) {
                tracing::info!(ifindex, "removing bandwidth limits without an endpoint");
                dp.remove_pod_bandwidth(ifindex)?;
            }
        }

        timeline.mark("records");
        let wanted: HashMap<HostPortKey, HostPortTarget> = self
            .by_ref
            .values()
            .filter(|e| e.state == EndpointState::Ready)
            .flat_map(hostport_entries)
            .collect();
        let present: HashMap<HostPortKey, HostPortTarget> =
            dp.list_hostports()?.into_iter().collect();
        for (key, target) in &present {
            if wanted.get(key) != Some(target) {
                dp.remove_hostport(*key)?;
            }
        }
        for (key, target) in &wanted {
            if present.get(key) != Some(target) {
                tracing::info!(port = u16::from_be(key.port), "restoring a hostPort");
                dp.put_hostport(*key, *target)?;
            }
        }
        let known: HashSet<Ipv4Addr> = self.by_ref.values().map(|e| e.ip).collect();
        for (ip, _) in dp.list_endpoints()? {
            if !known.contains(&ip) {
                tracing::info!(%ip, "removing map entry without an endpoint record");
                dp.remove_endpoint(ip)?;
            }
        }
        let hosts: HashSet<&str> = self
            .by_ref
            .values()
            .map(|e| e.host_ifname.as_str())
            .collect();
        for link in dp.links()? {
            if !hosts.contains(link.interface.as_str()) && !keep_links.contains(&link.interface) {
                tracing::info!(interface = %link.interface, "removing link pin without an endpoint");
                dp.detach(&link.interface, link.hook)?;
            }
        }

        // Pod veths no record owns (a crash between DEL and the background
        // deletion, or before a pending record was written) are ours by
        // name: remove them.
        let owned: HashSet<&str> = self
            .by_ref
            .values()
            .map(|e| e.host_ifname.as_str())
            .chain(self.draining.values().map(|d| d.host.as_str()))
            .collect();
        timeline.mark("map_and_pins");
        let orphans: Vec<Drain> = links
            .values()
            .filter(|l| is_rivet_veth(&l.name) && !owned.contains(l.name.as_str()))
            .map(|l| Drain {
                ip: Ipv4Addr::UNSPECIFIED,
                host: l.name.clone(),
                index: l.index,
            })
            .collect();
        for d in orphans {
            tracing::info!(veth = %d.host, "removing a pod veth no record owns");
            delete_veth(nl, &d).await?;
        }

        // Addresses in use on the node that are not our pods: node addresses
        // and /32 routes through devices other than our veths.
        let ours: HashSet<u32> = self.by_ref.values().map(|e| e.host_ifindex).collect();
        let mut foreign: HashSet<Ipv4Addr> = local.clone();
        for r in nl.ipv4_routes().await? {
            if r.prefix == 32 && r.oif.is_some_and(|o| !ours.contains(&o)) {
                foreign.insert(r.dst);
            }
        }
        self.foreign = foreign;
        timeline.mark("orphans_and_routes");
        tracing::debug!(timing = %timeline, "endpoint reconciliation steps");
        Ok(())
    }
    /// Rebuilds records that did not parse (a torn or corrupted file) from
    /// what the kernel holds: the live host veth named by the file (index,
    /// MTU), the endpoints map entry on that veth (address, both MACs) and
    /// the hostPorts pointing at that address. The container ID, ifname
    /// and netns are recovered from the damaged text and accepted only if
    /// they name exactly this veth (`host_ifname(container, ifname)` is the
    /// file's name). What cannot be rebuilt is left to the usual cleanup.
    pub(super) fn rebuild_unreadable(
        &mut self,
        links: &BTreeMap<String, LinkInfo>,
        dp: &mut Datapath,
    ) -> Result<(), EndpointError> {
        let entries = dp.list_endpoints()?;
        let hostports = dp.list_hostports()?;
        for (key, path) in std::mem::take(&mut self.unreadable) {
            let text =
                String::from_utf8_lossy(&std::fs::read(&path).unwrap_or_default()).into_owned();
            let field = |name: &str| json_string_field(&text, name);
            let (Some(container_id), Some(ifname)) = (field("container_id"), field("ifname"))
            else {
                tracing::warn!(record = %key, "unreadable record names no container: its pod is cleaned up");
                continue;
            };
            if rivet_api::host_ifname(&container_id, &ifname) != key {
                tracing::warn!(record = %key, %container_id, "unreadable record does not match its name: its pod is cleaned up");
                continue;
            }
            let Some(link) = links.get(&key) else {
                tracing::warn!(record = %key, "unreadable record of a veth that is gone");
                continue;
            };
            let Some((ip, info)) = entries.iter().find(|(_, i)| i.ifindex == link.index) else {
                tracing::warn!(record = %key, "unreadable record of a veth without a map entry");
                continue;
            };
            let pod_ip = ipv4_key(ip.octets());
            let port_mappings = hostports
                .iter()
                .filter(|(_, t)| t.pod_ip == pod_ip)
                .map(|(k, t)| PortMapping {
                    host_port: u16::from_be(k.port),
                    container_port: u16::from_be(t.port),
                    protocol: if k.proto == 17 {
                        Protocol::Udp
                    } else {
                        Protocol::Tcp
                    },
                    host_ip: (k.addr != 0)
                        .then(|| Ipv4Addr::from(rivet_common::ipv4_from_key(k.addr))),
                })
                .collect();
            let ep = Endpoint {
                container_id,
                ifname,
                network: None,
                netns: field("netns").unwrap_or_default(),
                ip: *ip,
                mac: format_mac(&info.mac),
                host_ifname: key.clone(),
                host_ifindex: link.index,
                host_mac: format_mac(&info.host_mac),
                mtu: link.mtu,
                gateway: self.settings.gateway,
                state: EndpointState::Ready,
                pod: None,
                port_mappings,
                bandwidth: None,
                routes: Vec::new(),
                created: now_secs(),
                netns_cookie: None,
            };
            self.store.save(&key, &ep)?;
            tracing::warn!(record = %key, container = %ep.container_id, ip = %ep.ip, "endpoint record rebuilt from the datapath");
            self.by_ref
                .insert((ep.container_id.clone(), ep.ifname.clone()), ep);
            self.generation += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_fields_are_recovered_from_damaged_json() {
        let torn = r#"{
  "container_id": "abc\"d",
  "ifname": "eth0",
  "netns": "/run/netns/x",
  "ip": "10.0"#;
        assert_eq!(
            json_string_field(torn, "container_id").as_deref(),
            Some("abc\"d")
        );
        assert_eq!(json_string_field(torn, "ifname").as_deref(), Some("eth0"));
        assert_eq!(
            json_string_field(torn, "netns").as_deref(),
            Some("/run/netns/x")
        );
        assert_eq!(json_string_field(torn, "mac"), None);
        assert_eq!(
            json_string_field(r#"{"ifname": "et"#, "ifname"),
            None,
            "cut inside the value"
        );
        assert_eq!(json_string_field("garbage", "ifname"), None);
    }
}
