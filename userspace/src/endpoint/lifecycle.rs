//! ADD, DEL, CHECK and GC of attachments.
//!
//! ADD (`endpoint_add`), with rollback:
//! 1. Validate: container ID (libcni's regex), ifname (IFNAMSIZ, no `/ : ..` or
//!    whitespace), netns, routes, port mappings (ports 1–65535, hostIP a node
//!    address, no clash with another endpoint's hostIP/port/protocol), no
//!    attachment for (container, ifname). Open the netns (missing → not_found).
//!    Choose the address (a veth still draining for it is deleted now rather
//!    than failing).
//! 2. Pending record, written on the blocking pool while step 3 runs. The pod
//!    side's thread starts too (`pod`): its wake-up, `setns` into the pod
//!    namespace and blocking netlink socket overlap the veth creation.
//! 3. Veth created with the pod end inside the netns and MAC `02:72:<ip>`, on
//!    the blocking socket with `NLM_F_ECHO`: the kernel's echo of the new host
//!    end gives its ifindex, MAC and the pod end's ifindex (`IFLA_LINK`) in the
//!    same round trip (a kernel before 6.3 does not echo: looked up). On
//!    `EEXIST`: if a host veth with our derived name exists (a leftover of a
//!    crash between creation and the ready record) it is deleted and the
//!    creation retried once; otherwise the pod already has that ifname →
//!    conflict "interface already exists in netns", the interface untouched.
//!    The pod side is then told the pod end's ifindex.
//! 4. Map entry (before any program can look for it); meanwhile the pod side
//!    writes the pod end's IPv6 sysctls.
//! 5. Host end's IPv6 sysctls, then — once the pod end's are written too — pod
//!    side and host side run concurrently, each as **one netlink batch**
//!    (`netlink::batch`: all requests in one `sendmsg`, which the kernel
//!    handles in order, then all acks read — one round trip instead of one per
//!    request). No sysctl write overlaps a batch: `disable_ipv6` takes RTNL by
//!    trylock and restarts the write until it gets it, and one spinning beside
//!    the other side's batch made the ADD tail (both 10–20 ms on a loaded
//!    machine). Sysctls are written through one directory fd. Pod side batch:
//!    lo up (ifindex 1 in every namespace), address, link up, gateway `/32`
//!    scope-link route, default route, extra routes. Host side batch: up, `/32`
//!    route, permanent neighbour and, in tc mode, the `clsact` qdisc and the
//!    `from_pod` filter (by program fd). In TCX mode the link is created after
//!    the batch.
//! 6. Ready record (rewritten in place, see the module `endpoint`).
//!
//! A failure at any step (tests inject one with rivetd's hidden
//! `--test-fault-add-at <step>`, accepted only with `RIVET_TEST_FAULTS=1`) runs
//! the rollback: attachment removed, map entry removed, veth deleted (its
//! routes and neighbour go with it), record removed.
//!
//! DEL (`endpoint_del`): map entry removed if it still points at the record's
//! veth, TCX pin removed, record removed (lease released) — then the answer.
//! The veth is deleted in the background (device unregistration waits for RCU:
//! 20–30 ms nobody needs to wait for); until it is gone its address stays
//! taken. DEL of something that does not exist succeeds with `existed: false`.
//!
//! CHECK (`endpoint_check`), in order, the first failure reported by name:
//! lease exists and is ready, address equals the previous result's, host veth
//! exists with the recorded ifindex, host route `/32 dev rv…`, endpoint map
//! entry, (TCX pin), `from_pod` attached to the veth's ingress, pod netns
//! exists, `eth0` in it with the address `/32`, gateway route, default route,
//! extra routes.
//!
//! GC (`gc`): every attachment not in `valid` is deleted (waiting for its
//! veth); then every `rv…` veth no record owns.

use std::{
    collections::{HashMap, HashSet},
    net::Ipv4Addr,
    path::PathBuf,
};

use rivet_api::{Endpoint, EndpointCheck, EndpointRef, EndpointSpec, EndpointState, Protocol};
use rivet_common::{EndpointInfo, program_names};

use super::{
    Drain, EndpointError, Endpoints, Timeline, host_ifname,
    hostports::{Claim, mappings_clash, remove_hostports, validate_port_mappings},
    ipam::{IpamError, RangeSet},
    is_rivet_veth, now_secs,
    plumbing::{Rollback, delete_veth, entry_flags},
    pod::{check_pod_side, in_netns, parse_routes},
    validate_container_id, validate_network_name,
};
use crate::{
    config::validate_ifname,
    datapath::{AttachMode, Datapath, pins::Hook},
    netlink::{Netlink, netns, parse_mac},
};

impl Endpoints {
    pub(super) fn validate(
        &self,
        spec: &EndpointSpec,
        local: &HashSet<Ipv4Addr>,
    ) -> Result<(), EndpointError> {
        validate_container_id(&spec.container_id).map_err(EndpointError::BadRequest)?;
        if let Some(network) = &spec.network {
            validate_network_name(network).map_err(EndpointError::BadRequest)?;
        }
        validate_ifname(&spec.ifname)
            .map_err(|r| EndpointError::BadRequest(format!("ifname {:?}: {r}", spec.ifname)))?;
        if spec.netns.is_empty() {
            return Err(EndpointError::BadRequest("netns is empty".into()));
        }
        if self
            .by_ref
            .contains_key(&(spec.container_id.clone(), spec.ifname.clone()))
        {
            return Err(EndpointError::Conflict(format!(
                "an attachment for container {} interface {} already exists",
                spec.container_id, spec.ifname
            )));
        }
        validate_port_mappings(&spec.port_mappings, local, self.settings.reserved_ports)?;
        if let Some(bw) = &spec.bandwidth {
            bw.validate()
                .map_err(|e| EndpointError::BadRequest(format!("bandwidth: {e}")))?;
        }
        parse_routes(&spec.routes)?;
        if spec.port_mappings.is_empty() {
            return Ok(());
        }
        // Indexed by (protocol, hostPort): linear in the mappings, however
        // many a pod or the node carries.
        let mut taken: HashMap<(Protocol, u16), Vec<Claim<'_>>> = HashMap::new();
        for other in self.by_ref.values() {
            for b in &other.port_mappings {
                taken
                    .entry((b.protocol, b.host_port))
                    .or_default()
                    .push((b, Some(other.container_id.as_str())));
            }
        }
        for a in &spec.port_mappings {
            let slot = taken.entry((a.protocol, a.host_port)).or_default();
            if let Some((_, owner)) = slot.iter().find(|(b, _)| mappings_clash(a, b)) {
                return Err(match owner {
                    Some(container) => EndpointError::Conflict(format!(
                        "hostPort {}/{:?} is already mapped to container {container}",
                        a.host_port, a.protocol
                    )),
                    None => EndpointError::BadRequest(format!(
                        "hostPort {}/{:?} is mapped twice in the request",
                        a.host_port, a.protocol
                    )),
                });
            }
            slot.push((a, None));
        }
        Ok(())
    }

    /// Deletes the draining veths matching `pick` right away.
    pub(super) async fn drain_now(
        &mut self,
        pick: impl Fn(&Drain) -> bool,
        nl: &Netlink,
    ) -> Result<(), EndpointError> {
        let now: Vec<Drain> = self
            .draining
            .values()
            .filter(|d| pick(d))
            .cloned()
            .collect();
        for d in now {
            delete_veth(nl, &d).await?;
            self.drained(&d);
        }
        Ok(())
    }

    /// The requested address (checked) or the next free one.
    pub(super) fn choose_ip(
        &mut self,
        spec: &EndpointSpec,
        set: &RangeSet,
        dp: &Datapath,
    ) -> Result<Ipv4Addr, IpamError> {
        if let Some(ip) = spec.ip {
            self.ipam
                .check_requested(ip, set, |ip| self.owner_of(ip, dp))?;
            return Ok(ip);
        }
        let by_ref = &self.by_ref;
        let foreign = &self.foreign;
        let draining = &self.draining;
        self.ipam.allocate(set, |ip| {
            if by_ref.values().any(|e| e.ip == ip)
                || foreign.contains(&ip)
                || draining.contains_key(&ip)
            {
                return Some("taken".into());
            }
            matches!(dp.endpoint(ip), Ok(Some(_))).then(|| "map".into())
        })
    }

    /// Creates the attachment. On failure nothing of it remains.
    pub async fn add(
        &mut self,
        spec: EndpointSpec,
        nl: &Netlink,
        dp: &mut Datapath,
        local: &HashSet<Ipv4Addr>,
    ) -> Result<Endpoint, EndpointError> {
        let mut timeline = Timeline::start();
        self.generation += 1;
        self.validate(&spec, local)?;
        let netns_path = PathBuf::from(&spec.netns);
        let netns_file = netns::open(&netns_path)?;
        let set = RangeSet::for_request(&spec.ranges, self.settings.pod_cidr)?;
        // An address held only by a veth still being deleted is reclaimed
        // now rather than refused (requested address, or a full pool).
        if let Some(ip) = spec.ip {
            self.drain_now(|d| d.ip == ip, nl).await?;
        }
        let ip = match self.choose_ip(&spec, &set, dp) {
            Err(IpamError::Exhausted(_)) if !self.draining.is_empty() => {
                self.drain_now(|_| true, nl).await?;
                self.choose_ip(&spec, &set, dp)?
            }
            other => other?,
        };
        let host = host_ifname(&spec.container_id, &spec.ifname);
        let record = Endpoint {
            container_id: spec.container_id.clone(),
            ifname: spec.ifname.clone(),
            network: spec.network.clone(),
            netns: spec.netns.clone(),
            ip,
            mac: String::new(),
            host_ifname: host.clone(),
            host_ifindex: 0,
            host_mac: String::new(),
            mtu: self.settings.mtu,
            gateway: self.settings.gateway,
            state: EndpointState::Pending,
            pod: spec.pod.clone(),
            port_mappings: spec.port_mappings.clone(),
            bandwidth: spec.bandwidth.clone(),
            routes: spec.routes.clone(),
            created: now_secs(),
            netns_cookie: None,
        };

        let mut rollback = Rollback::default();
        timeline.mark("prepare");
        let result = self
            .plumb(record, netns_file, nl, dp, &mut rollback, timeline)
            .await;
        self.spare.refill();
        match result {
            Ok(ep) => Ok(ep),
            Err(e) => {
                self.by_ref
                    .remove(&(spec.container_id.clone(), spec.ifname.clone()));
                rollback.run(nl, dp, &self.store).await;
                Err(e)
            }
        }
    }

    /// Removes the attachment and its lease, waiting for the veth to go.
    /// Returns whether anything existed.
    pub async fn del(
        &mut self,
        r: &EndpointRef,
        nl: &Netlink,
        dp: &mut Datapath,
    ) -> Result<bool, EndpointError> {
        let (existed, drain) = self.del_deferred(r, nl, dp).await?;
        if let Some(d) = drain {
            delete_veth(nl, &d).await?;
            self.drained(&d);
        }
        Ok(existed)
    }

    /// Removes the attachment's map entry, program, record and lease, and
    /// returns the veth still to delete: the caller deletes it (in the
    /// background) and then calls [`Endpoints::drained`]. Until then the
    /// address stays taken. Returns whether anything existed.
    pub async fn del_deferred(
        &mut self,
        r: &EndpointRef,
        nl: &Netlink,
        dp: &mut Datapath,
    ) -> Result<(bool, Option<Drain>), EndpointError> {
        self.generation += 1;
        let host = host_ifname(&r.container_id, &r.ifname);
        let record = self
            .by_ref
            .get(&(r.container_id.clone(), r.ifname.clone()))
            .cloned();
        if record
            .as_ref()
            .is_some_and(|ep| !ep.belongs_to(r.network.as_deref()))
        {
            // Another network's attachment (its veth has the same derived
            // name): not this DEL's to touch.
            return Ok((false, None));
        }
        let mut existed = record.is_some();
        // A veth already being deleted after an earlier DEL is not "there".
        let link = match nl.link_by_name(&host).await? {
            Some(l) if record.is_none() && self.draining.values().any(|d| d.index == l.index) => {
                None
            }
            other => other,
        };
        if let Some(ep) = &record {
            // Only remove the map entry if it points at this attachment's veth
            // (or at nothing we know: a pending record never wrote one).
            let ours = |info: &EndpointInfo| {
                info.ifindex == ep.host_ifindex
                    || link.as_ref().is_some_and(|l| l.index == info.ifindex)
            };
            if dp.endpoint(ep.ip)?.is_some_and(|info| ours(&info)) {
                dp.remove_endpoint(ep.ip)?;
            }
            remove_hostports(dp, ep)?;
            // Limits are kept by ifindex: never those of another pod's veth
            // that took the index of a veth already gone.
            let reused = self.by_ref.values().any(|other| {
                other.host_ifindex == ep.host_ifindex && other.reference() != ep.reference()
            });
            if ep.host_ifindex != 0 && !reused {
                dp.remove_pod_bandwidth(ep.host_ifindex)?;
            }
            // The namespace stays marked while another attachment (a second
            // network of the same pod) lives in it.
            if let Some(cookie) = ep.netns_cookie
                && !self.by_ref.values().any(|other| {
                    other.netns_cookie == Some(cookie) && other.reference() != ep.reference()
                })
            {
                dp.remove_pod_netns(cookie)?;
            }
        }
        existed |= dp.detach(&host, Hook::Ingress)?;
        let drain = match (&link, &record) {
            (Some(l), Some(ep)) => Some(Drain {
                ip: ep.ip,
                host: host.clone(),
                index: l.index,
            }),
            // A veth without a record (a crash leftover): delete it now.
            (Some(l), None) => {
                delete_veth(
                    nl,
                    &Drain {
                        ip: Ipv4Addr::UNSPECIFIED,
                        host: host.clone(),
                        index: l.index,
                    },
                )
                .await?;
                None
            }
            (None, _) => None,
        };
        existed |= link.is_some();
        if let Some(d) = &drain {
            self.draining.insert(d.ip, d.clone());
        }
        self.store.remove(&host)?;
        self.by_ref
            .remove(&(r.container_id.clone(), r.ifname.clone()));
        Ok((existed, drain))
    }

    /// The veth of `d` is gone: its address may be handed out again.
    pub fn drained(&mut self, d: &Drain) {
        self.generation += 1;
        if self.draining.get(&d.ip) == Some(d) {
            self.draining.remove(&d.ip);
        }
    }

    /// Verifies every resource of an attachment (CNI CHECK). The error names
    /// the first one missing.
    pub async fn check(
        &self,
        c: &EndpointCheck,
        nl: &Netlink,
        dp: &Datapath,
    ) -> Result<(), EndpointError> {
        let missing = |m: String| Err(EndpointError::Missing(m));
        let Some(ep) = self
            .by_ref
            .get(&(c.container_id.clone(), c.ifname.clone()))
            .filter(|ep| ep.belongs_to(c.network.as_deref()))
        else {
            return missing(format!(
                "no lease for container {} interface {}{}",
                c.container_id,
                c.ifname,
                c.network
                    .as_deref()
                    .map(|n| format!(" in network {n}"))
                    .unwrap_or_default()
            ));
        };
        if ep.state != EndpointState::Ready {
            return missing(format!(
                "the attachment of container {} is incomplete (pending)",
                c.container_id
            ));
        }
        if let Some(ip) = c.ip
            && ip != ep.ip
        {
            return missing(format!(
                "address mismatch: the previous result has {ip}, the lease has {}",
                ep.ip
            ));
        }
        let host = &ep.host_ifname;
        match nl.link_by_name(host).await? {
            Some(l) if l.index == ep.host_ifindex => {}
            _ => return missing(format!("host veth {host} is missing")),
        }
        let routes = nl.ipv4_routes().await?;
        if !routes
            .iter()
            .any(|r| r.dst == ep.ip && r.prefix == 32 && r.oif == Some(ep.host_ifindex))
        {
            return missing(format!("host route {}/32 dev {host} is missing", ep.ip));
        }
        let want = self.map_entry(ep)?;
        if dp.endpoint(ep.ip)? != Some(want) {
            return missing(format!(
                "endpoint map entry for {} is missing or stale",
                ep.ip
            ));
        }
        if self.settings.attach == AttachMode::Tcx {
            let pin = dp.layout().link(host, Hook::Ingress);
            if !pin.exists() {
                return missing(format!("link pin {} is missing", pin.display()));
            }
        }
        let prog = dp.program_id(program_names::FROM_POD)?;
        if !self.attached_ids(ep, nl, dp).await?.contains(&prog) {
            return missing(format!(
                "program from_pod is not attached to {host} (ingress)"
            ));
        }
        let path = PathBuf::from(&ep.netns);
        if !path.exists() {
            return missing(format!("pod netns {} is missing", ep.netns));
        }
        let (ifname, ip, gateway) = (ep.ifname.clone(), ep.ip, ep.gateway);
        let extra = parse_routes(&ep.routes)?;
        in_netns(path, move |nl| {
            check_pod_side(nl, ifname, ip, gateway, extra)
        })
        .await
    }

    /// Programs attached to the endpoint's host veth ingress, by the
    /// configured mechanism.
    pub async fn attached_ids(
        &self,
        ep: &Endpoint,
        nl: &Netlink,
        dp: &Datapath,
    ) -> Result<Vec<u32>, EndpointError> {
        Ok(match self.settings.attach {
            AttachMode::Tcx => dp.attached_ids(&ep.host_ifname, Hook::Ingress)?,
            AttachMode::Tc => nl.tc_bpf_prog_ids(ep.host_ifindex, true).await?,
        })
    }

    pub(super) fn map_entry(&self, ep: &Endpoint) -> Result<EndpointInfo, EndpointError> {
        let (Some(mac), Some(host_mac)) = (parse_mac(&ep.mac), parse_mac(&ep.host_mac)) else {
            return Err(EndpointError::Other(format!(
                "record of {} has invalid MACs",
                ep.host_ifname
            )));
        };
        Ok(EndpointInfo {
            ifindex: ep.host_ifindex,
            flags: entry_flags(ep),
            mac,
            host_mac,
        })
    }

    /// CNI GC of one network: removes every attachment recorded with
    /// `network` that is not in `valid`, and every `rv…` veth that no
    /// record owns. Attachments of other networks and those recorded
    /// without a network (agent API, older records) are left alone.
    /// Returns what was removed.
    pub async fn gc(
        &mut self,
        network: &str,
        valid: &[EndpointRef],
        nl: &Netlink,
        dp: &mut Datapath,
    ) -> Result<Vec<EndpointRef>, EndpointError> {
        validate_network_name(network).map_err(EndpointError::BadRequest)?;
        self.generation += 1;
        let keep: HashSet<(String, String)> = valid
            .iter()
            .map(|r| (r.container_id.clone(), r.ifname.clone()))
            .collect();
        let doomed: Vec<EndpointRef> = self
            .by_ref
            .values()
            .filter(|e| e.network.as_deref() == Some(network))
            .filter(|e| !keep.contains(&(e.container_id.clone(), e.ifname.clone())))
            .map(Endpoint::reference)
            .collect();
        let mut first_error = None;
        for r in &doomed {
            if let Err(e) = self.del(r, nl, dp).await {
                tracing::warn!(container = %r.container_id, error = %e, "gc");
                first_error.get_or_insert(e);
            }
        }
        let owned: HashSet<String> = self
            .by_ref
            .values()
            .map(|e| e.host_ifname.clone())
            .collect();
        for link in nl.links().await? {
            if is_rivet_veth(&link.name) && !owned.contains(&link.name) {
                tracing::info!(veth = %link.name, "gc: removing a veth no record owns");
                if let Err(e) = nl.delete_link(link.index, &link.name).await
                    && e.errno() != Some(libc::ENODEV)
                {
                    first_error.get_or_insert(e.into());
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(doomed),
        }
    }
}
