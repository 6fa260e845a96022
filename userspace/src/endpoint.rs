//! Pod attachments ("endpoints"): plumbing a pod into the node and removing
//! it again, with rollback of every step on failure.
//!
//! ADD, in order (each step undone if a later one fails):
//! 1. validate; open the pod netns;
//! 2. veth `rv<hash>` in the node with its peer created *inside* the pod netns;
//! 3. pod side (on a thread inside the pod netns): lo up, IPv6 off, `ip/32`,
//!    `gateway/32 dev eth0 scope link`, `default via gateway`;
//! 4. host side: IPv6/RA off, up, `ip/32 dev rv… scope link`, permanent
//!    neighbour `ip → pod MAC`;
//! 5. endpoint in the BPF map; 6. `from_pod` attached (pinned TCX link);
//! 7. record persisted.
//!
//! DEL removes map entry, link pin, veth (its routes and neighbour go with
//! it) and record, and succeeds when any of them is already gone.

use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use ipnet::Ipv4Net;
use rivet_api::{ApiError, Endpoint, EndpointRef, EndpointSpec, ErrorKind};
use rivet_common::{EndpointInfo, endpoint_flags, program_names};

use crate::{
    config::validate_ifname,
    datapath::{Datapath, DatapathError},
    netlink::{LinkInfo, Netlink, NetlinkError, format_mac, parse_mac},
    netns::{self, NetnsError},
    pins::Hook,
    store::{RecordDir, StoreError},
};

/// Why an endpoint operation failed.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// Invalid request values.
    #[error("{0}")]
    BadRequest(String),
    /// Conflicts with existing state.
    #[error("{0}")]
    Conflict(String),
    /// Network namespace problem.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// Netlink failure.
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    /// Map or program failure.
    #[error(transparent)]
    Datapath(#[from] DatapathError),
    /// Persisting the record failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Something else in the plumbing.
    #[error("{0}")]
    Other(String),
}

impl From<EndpointError> for ApiError {
    fn from(e: EndpointError) -> Self {
        let kind = match &e {
            EndpointError::BadRequest(_) => ErrorKind::BadRequest,
            EndpointError::Conflict(_) => ErrorKind::Conflict,
            EndpointError::Netns(NetnsError::NotFound { .. }) => ErrorKind::NotFound,
            EndpointError::Netns(_) => ErrorKind::BadRequest,
            _ => ErrorKind::Internal,
        };
        ApiError::new(kind, e.to_string())
    }
}

/// Host-side veth name for an attachment: `rv` + 13 hex digits of a stable
/// hash of (container ID, ifname). 15 bytes, the IFNAMSIZ limit.
pub fn host_ifname(container_id: &str, ifname: &str) -> String {
    // FNV-1a 64: stable across releases and platforms.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in container_id
        .bytes()
        .chain(std::iter::once(0))
        .chain(ifname.bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("rv{:013x}", h & 0x000f_ffff_ffff_ffff)
}

/// Container IDs as libcni validates them: `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`.
pub fn validate_container_id(id: &str) -> Result<(), String> {
    let mut chars = id.chars();
    match chars.next() {
        None => return Err("container ID is empty".into()),
        Some(c) if !c.is_ascii_alphanumeric() => {
            return Err(format!(
                "container ID {id:?} must start with a letter or digit"
            ));
        }
        Some(_) => {}
    }
    if !chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-') {
        return Err(format!(
            "container ID {id:?} may only contain letters, digits, '_', '.' and '-'"
        ));
    }
    Ok(())
}

/// Node settings the endpoint manager needs.
#[derive(Debug, Clone)]
pub struct EndpointSettings {
    /// Pod CIDR of the node.
    pub pod_cidr: Ipv4Net,
    /// Pods' gateway.
    pub gateway: Ipv4Addr,
    /// Pod MTU.
    pub mtu: u32,
}

/// The node's endpoints: records on disk mirrored in memory.
pub struct Endpoints {
    settings: EndpointSettings,
    store: RecordDir,
    by_ref: BTreeMap<(String, String), Endpoint>,
}

/// Steps to undo if ADD fails part-way.
#[derive(Default)]
struct Rollback {
    veth: Option<(u32, String)>,
    map_ip: Option<Ipv4Addr>,
    link: Option<String>,
}

impl Rollback {
    async fn run(self, nl: &Netlink, dp: &mut Datapath) {
        if let Some(ifname) = self.link
            && let Err(e) = dp.detach(&ifname, Hook::Ingress)
        {
            tracing::warn!(error = %e, "rollback: detaching");
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
    }
}

/// What the pod side reports back.
struct PodSide {
    mac: [u8; 6],
}

/// Configures the pod end. Runs on a thread inside the pod netns, with its
/// own single-threaded runtime and netlink socket (bound to that netns).
fn configure_pod_side(
    ifname: &str,
    ip: Ipv4Addr,
    gateway: Ipv4Addr,
) -> Result<PodSide, EndpointError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| EndpointError::Other(format!("starting a runtime in the pod netns: {e}")))?;
    rt.block_on(async {
        let nl = Netlink::connect()
            .map_err(|e| EndpointError::Other(format!("in the pod netns: {e}")))?;
        if let Some(lo) = nl.link_by_name("lo").await? {
            nl.set_up(lo.index, "lo").await?;
        }
        let link = nl
            .link_by_name(ifname)
            .await?
            .ok_or_else(|| EndpointError::Other(format!("{ifname} vanished from the pod netns")))?;
        disable_ipv6(ifname);
        nl.add_address(link.index, ifname, ip, 32).await?;
        nl.set_up(link.index, ifname).await?;
        nl.add_link_route(gateway, 32, link.index, ifname).await?;
        nl.add_default_route(gateway, link.index, ifname).await?;
        Ok(PodSide { mac: link.mac })
    })
}

/// rivet is IPv4-only: no link-local addresses, no DAD, no router
/// advertisements on either end of a pod veth. Best effort: a kernel without
/// IPv6 has none of these files.
fn disable_ipv6(ifname: &str) {
    for (key, value) in [
        ("accept_ra", "0"),
        ("accept_dad", "0"),
        ("disable_ipv6", "1"),
    ] {
        if let Err(e) = netns::write_if_sysctl("ipv6", ifname, key, value) {
            tracing::debug!(ifname, key, error = %e, "ipv6 sysctl");
        }
    }
}

impl Endpoints {
    /// Loads the records from `state_dir/endpoints`.
    pub fn open(settings: EndpointSettings, state_dir: &Path) -> Result<Self, StoreError> {
        let store = RecordDir::open(state_dir.join("endpoints"))?;
        let (records, bad) = store.load_all::<Endpoint>()?;
        for path in bad {
            tracing::warn!(path = %path.display(), "ignoring unreadable endpoint record; live state will be reconciled");
        }
        let by_ref = records
            .into_iter()
            .map(|(_, ep)| ((ep.container_id.clone(), ep.ifname.clone()), ep))
            .collect();
        Ok(Self {
            settings,
            store,
            by_ref,
        })
    }

    /// Node settings.
    pub fn settings(&self) -> &EndpointSettings {
        &self.settings
    }

    /// Every endpoint, sorted by IP.
    pub fn list(&self) -> Vec<Endpoint> {
        let mut v: Vec<Endpoint> = self.by_ref.values().cloned().collect();
        v.sort_by_key(|e| e.ip);
        v
    }

    /// Number of endpoints.
    pub fn len(&self) -> usize {
        self.by_ref.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.by_ref.is_empty()
    }

    fn validate(&self, spec: &EndpointSpec) -> Result<(), EndpointError> {
        validate_container_id(&spec.container_id).map_err(EndpointError::BadRequest)?;
        validate_ifname(&spec.ifname)
            .map_err(|r| EndpointError::BadRequest(format!("ifname {:?}: {r}", spec.ifname)))?;
        let cidr = self.settings.pod_cidr;
        if !cidr.contains(&spec.ip) || spec.ip == cidr.network() || spec.ip == cidr.broadcast() {
            return Err(EndpointError::BadRequest(format!(
                "ip {} is not a usable address of the pod CIDR {cidr}",
                spec.ip
            )));
        }
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
        if let Some(other) = self.by_ref.values().find(|e| e.ip == spec.ip) {
            return Err(EndpointError::Conflict(format!(
                "ip {} is already in use by container {} ({})",
                spec.ip, other.container_id, other.ifname
            )));
        }
        Ok(())
    }

    /// Creates the attachment. On failure nothing of it remains.
    pub async fn add(
        &mut self,
        spec: EndpointSpec,
        nl: &Netlink,
        dp: &mut Datapath,
    ) -> Result<Endpoint, EndpointError> {
        self.validate(&spec)?;
        if dp.endpoint(spec.ip)?.is_some() {
            return Err(EndpointError::Conflict(format!(
                "ip {} is already in the endpoints map",
                spec.ip
            )));
        }
        let netns_path = PathBuf::from(&spec.netns);
        let netns_file = netns::open(&netns_path)?;
        let host = host_ifname(&spec.container_id, &spec.ifname);

        // A host veth with our derived name but no record is a leftover of a
        // crash between veth creation and persisting: it is ours, remove it.
        if let Some(stale) = nl.link_by_name(&host).await? {
            tracing::warn!(host, "removing leftover veth without a record");
            nl.delete_link(stale.index, &host).await?;
        }

        let mut rollback = Rollback::default();
        match self
            .plumb(&spec, &host, netns_file, &netns_path, nl, dp, &mut rollback)
            .await
        {
            Ok(ep) => Ok(ep),
            Err(e) => {
                rollback.run(nl, dp).await;
                Err(e)
            }
        }
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "internal step of add() sharing its locals"
    )]
    async fn plumb(
        &mut self,
        spec: &EndpointSpec,
        host: &str,
        netns_file: std::fs::File,
        netns_path: &Path,
        nl: &Netlink,
        dp: &mut Datapath,
        rollback: &mut Rollback,
    ) -> Result<Endpoint, EndpointError> {
        let EndpointSettings { gateway, mtu, .. } = self.settings;
        if let Err(e) = nl.create_veth(host, &spec.ifname, &netns_file, mtu).await {
            if e.is_exists() {
                return Err(EndpointError::Conflict(format!(
                    "interface {} already exists in netns {}",
                    spec.ifname, spec.netns
                )));
            }
            return Err(e.into());
        }
        let host_link: LinkInfo = nl
            .link_by_name(host)
            .await?
            .ok_or_else(|| EndpointError::Other(format!("veth {host} vanished after creation")))?;
        rollback.veth = Some((host_link.index, host.to_owned()));

        let (ifname, ip) = (spec.ifname.clone(), spec.ip);
        let path = netns_path.to_owned();
        let pod = tokio::task::spawn_blocking(move || {
            netns::run_in_file(&netns_file, &path, || {
                configure_pod_side(&ifname, ip, gateway)
            })
        })
        .await
        .map_err(|e| EndpointError::Other(format!("pod-side worker: {e}")))???;

        disable_ipv6(host);
        nl.set_up(host_link.index, host).await?;
        nl.add_link_route(spec.ip, 32, host_link.index, host)
            .await?;
        nl.add_permanent_neighbour(host_link.index, host, spec.ip, pod.mac)
            .await?;

        dp.put_endpoint(
            spec.ip,
            EndpointInfo {
                ifindex: host_link.index,
                flags: endpoint_flags::READY,
                mac: pod.mac,
                host_mac: host_link.mac,
            },
        )?;
        rollback.map_ip = Some(spec.ip);
        dp.attach(program_names::FROM_POD, host, Hook::Ingress)?;
        rollback.link = Some(host.to_owned());

        let ep = Endpoint {
            container_id: spec.container_id.clone(),
            ifname: spec.ifname.clone(),
            netns: spec.netns.clone(),
            ip: spec.ip,
            mac: format_mac(&pod.mac),
            host_ifname: host.to_owned(),
            host_ifindex: host_link.index,
            host_mac: format_mac(&host_link.mac),
            mtu,
            gateway,
        };
        self.store.save(host, &ep)?;
        self.by_ref
            .insert((ep.container_id.clone(), ep.ifname.clone()), ep.clone());
        Ok(ep)
    }

    /// Removes the attachment. Returns whether anything existed.
    pub async fn del(
        &mut self,
        r: &EndpointRef,
        nl: &Netlink,
        dp: &mut Datapath,
    ) -> Result<bool, EndpointError> {
        let host = host_ifname(&r.container_id, &r.ifname);
        let record = self
            .by_ref
            .get(&(r.container_id.clone(), r.ifname.clone()))
            .cloned();
        let mut existed = record.is_some();
        if let Some(ep) = &record {
            // Only remove the map entry if it still points at this veth.
            if dp
                .endpoint(ep.ip)?
                .is_some_and(|info| info.ifindex == ep.host_ifindex)
            {
                dp.remove_endpoint(ep.ip)?;
            }
        }
        existed |= dp.detach(&host, Hook::Ingress)?;
        if let Some(link) = nl.link_by_name(&host).await? {
            existed = true;
            match nl.delete_link(link.index, &host).await {
                Ok(()) => {}
                // Gone meanwhile (the pod netns was deleted): that is the goal.
                Err(e) if e.errno() == Some(libc::ENODEV) => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.store.remove(&host)?;
        self.by_ref
            .remove(&(r.container_id.clone(), r.ifname.clone()));
        Ok(existed)
    }

    /// Brings kernel state in line with the records: endpoints whose veth is
    /// gone are removed; map entries and link pins without a record are
    /// removed; every live endpoint has its map entry and program (with
    /// `reattach`, programs are swapped to the freshly loaded ones).
    /// `keep_links` names interfaces whose pins are not endpoints (uplink).
    pub async fn reconcile(
        &mut self,
        nl: &Netlink,
        dp: &mut Datapath,
        reattach: bool,
        keep_links: &[String],
    ) -> Result<(), EndpointError> {
        let links: BTreeMap<String, LinkInfo> = nl
            .links()
            .await?
            .into_iter()
            .map(|l| (l.name.clone(), l))
            .collect();

        let records: Vec<Endpoint> = self.by_ref.values().cloned().collect();
        for ep in records {
            let live = links
                .get(&ep.host_ifname)
                .is_some_and(|l| l.index == ep.host_ifindex);
            if !live {
                tracing::info!(container = %ep.container_id, ip = %ep.ip, "pod veth gone; removing endpoint");
                self.del(
                    &EndpointRef {
                        container_id: ep.container_id.clone(),
                        ifname: ep.ifname.clone(),
                    },
                    nl,
                    dp,
                )
                .await?;
                continue;
            }
            let (Some(mac), Some(host_mac)) = (parse_mac(&ep.mac), parse_mac(&ep.host_mac)) else {
                return Err(EndpointError::Other(format!(
                    "record of {} has invalid MACs",
                    ep.host_ifname
                )));
            };
            let want = EndpointInfo {
                ifindex: ep.host_ifindex,
                flags: endpoint_flags::READY,
                mac,
                host_mac,
            };
            if dp.endpoint(ep.ip)? != Some(want) {
                tracing::info!(ip = %ep.ip, "restoring endpoint map entry");
                dp.put_endpoint(ep.ip, want)?;
            }
            let pinned = dp.layout().link(&ep.host_ifname, Hook::Ingress).exists();
            if reattach || !pinned {
                dp.attach(program_names::FROM_POD, &ep.host_ifname, Hook::Ingress)?;
            }
        }

        let known: Vec<Ipv4Addr> = self.by_ref.values().map(|e| e.ip).collect();
        for (ip, _) in dp.list_endpoints()? {
            if !known.contains(&ip) {
                tracing::info!(%ip, "removing map entry without an endpoint record");
                dp.remove_endpoint(ip)?;
            }
        }
        let hosts: Vec<&str> = self
            .by_ref
            .values()
            .map(|e| e.host_ifname.as_str())
            .collect();
        for link in dp.links()? {
            if !hosts.contains(&link.interface.as_str()) && !keep_links.contains(&link.interface) {
                tracing::info!(interface = %link.interface, "removing link pin without an endpoint");
                dp.detach(&link.interface, link.hook)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_ifnames_are_stable_and_fit() {
        let a = host_ifname("abc", "eth0");
        assert_eq!(a.len(), 15);
        assert!(a.starts_with("rv"));
        assert_eq!(a, host_ifname("abc", "eth0"));
        assert_ne!(a, host_ifname("abc", "eth1"));
        assert_ne!(a, host_ifname("ab", "ceth0"));
        assert!(validate_ifname(&a).is_ok());
    }

    #[test]
    fn container_ids() {
        assert!(validate_container_id("a1_b.c-d").is_ok());
        assert!(validate_container_id("ABC123").is_ok());
        for bad in ["", "-a", ".a", "a/b", "a b", "a\nb", "ä"] {
            assert!(validate_container_id(bad).is_err(), "{bad:?}");
        }
    }
}
