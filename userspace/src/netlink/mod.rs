//! rtnetlink operations, each with context in its error. A [`Netlink`] is
//! bound to the namespace of the thread that created its socket.
//!
//! The messages themselves are built and read in [`messages`] (from
//! `rivet-netlink`, which the CNI plugin shares); [`batch`] sends many in
//! one write, without a runtime, on its blocking socket; [`netns`] runs
//! work inside another network namespace; [`table`] watches one routing
//! table.

pub mod batch;
pub mod messages;
pub mod netns;
pub mod sock_diag;
pub mod table;

use std::{
    net::{IpAddr, Ipv4Addr},
    sync::Arc,
};

use futures_util::TryStreamExt as _;

use rtnetlink::{
    Handle, LinkUnspec, LinkVeth, LinkVxlan, RouteMessageBuilder,
    packet_route::{
        address::AddressAttribute,
        link::LinkMessage,
        route::{RouteHeader, RouteMessage},
    },
};

pub use self::messages::{format_mac, parse_mac};
use self::messages::{link_info, route_info};

/// A netlink failure, naming the operation and object.
#[derive(Debug, thiserror::Error)]
#[error("{op}: {source}")]
pub struct NetlinkError {
    /// What was being done ("creating veth rv1234 / eth0").
    pub op: String,
    /// Cause.
    #[source]
    pub source: rtnetlink::Error,
}

impl NetlinkError {
    /// The errno carried by a kernel error reply, if any (positive).
    pub fn errno(&self) -> Option<i32> {
        match &self.source {
            rtnetlink::Error::NetlinkError(m) => Some(-m.raw_code()),
            _ => None,
        }
    }

    /// True for EEXIST.
    pub fn is_exists(&self) -> bool {
        self.errno() == Some(libc::EEXIST)
    }
}

/// Failure to open a netlink socket.
#[derive(Debug, thiserror::Error)]
#[error("opening a netlink socket: {0}")]
pub struct ConnectError(#[from] std::io::Error);

pub use rivet_netlink::{LinkInfo, RouteInfo};

/// A netlink route socket and its handle. Clones share the socket.
///
/// The kernel runs one dump (a listing: links, addresses, routes, filters)
/// at a time per netlink socket and answers a second one started before the
/// first has been read to its end with `EBUSY`; the connection task sends
/// queued requests as it goes and may start the next while it has not yet
/// read the last part of the previous reply (and a dump interrupted that
/// way was also seen to stall for good). Listings therefore take
/// `dumps`, a lock held until their reply is complete, so concurrent users
/// of one socket (a GC beside the background reconciliation) wait for each
/// other instead of failing. Requests for one object are not dumps and do
/// not wait.
#[derive(Clone)]
pub struct Netlink {
    handle: Handle,
    dumps: Arc<tokio::sync::Mutex<()>>,
}

fn ctx(op: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> NetlinkError {
    let op = op.into();
    move |source| NetlinkError { op, source }
}

impl Netlink {
    /// Opens a socket in the calling thread's namespace; the connection task
    /// runs on the current tokio runtime.
    pub fn connect() -> Result<Self, ConnectError> {
        let (conn, handle, _) = rtnetlink::new_connection()?;
        tokio::spawn(conn);
        Ok(Self {
            handle,
            dumps: Arc::default(),
        })
    }

    /// The link called `name`, if it exists.
    pub async fn link_by_name(&self, name: &str) -> Result<Option<LinkInfo>, NetlinkError> {
        let mut stream = self
            .handle
            .link()
            .get()
            .match_name(name.to_owned())
            .execute();
        match stream.try_next().await {
            Ok(Some(msg)) => Ok(Some(link_info(&msg))),
            Ok(None) => Ok(None),
            Err(rtnetlink::Error::NetlinkError(m)) if -m.raw_code() == libc::ENODEV => Ok(None),
            Err(e) => Err(ctx(format!("looking up link {name}"))(e)),
        }
    }

    /// Every link.
    pub async fn links(&self) -> Result<Vec<LinkInfo>, NetlinkError> {
        let _one_dump = self.dumps.lock().await;
        let msgs: Vec<LinkMessage> = self
            .handle
            .link()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(ctx("listing links"))?;
        Ok(msgs.iter().map(link_info).collect())
    }

    /// Creates a veth pair with both ends in this namespace.
    pub async fn create_veth_pair(&self, a: &str, b: &str, mtu: u32) -> Result<(), NetlinkError> {
        self.handle
            .link()
            .add(LinkVeth::new(a, b).mtu(mtu).build())
            .execute()
            .await
            .map_err(ctx(format!("creating veth {a} (peer {b})")))
    }

    /// Creates an external (collect-metadata) vxlan device bound to `port`,
    /// learning off.
    pub async fn create_vxlan_external(&self, name: &str, port: u16) -> Result<(), NetlinkError> {
        let msg = LinkVxlan::new(name, 0)
            .port(port)
            .collect_metadata(true)
            .learning(false)
            .build();
        self.handle
            .link()
            .add(msg)
            .execute()
            .await
            .map_err(ctx(format!("creating vxlan device {name} (port {port})")))
    }

    /// Sets MTU, ARP and up state of a link.
    pub async fn configure_link(
        &self,
        index: u32,
        name: &str,
        mtu: u32,
        arp: bool,
    ) -> Result<(), NetlinkError> {
        self.handle
            .link()
            .set(
                LinkUnspec::new_with_index(index)
                    .mtu(mtu)
                    .arp(arp)
                    .up()
                    .build(),
            )
            .execute()
            .await
            .map_err(ctx(format!("configuring {name} (mtu {mtu})")))
    }

    /// `ip route replace <dst>/<len> dev <index> src <src> scope link`.
    pub async fn replace_link_route_src(
        &self,
        dst: Ipv4Addr,
        prefix: u8,
        index: u32,
        name: &str,
        src: Ipv4Addr,
        mtu: Option<u32>,
    ) -> Result<(), NetlinkError> {
        self.handle
            .route()
            .add(messages::link_route_src(dst, prefix, index, src, mtu))
            .replace()
            .execute()
            .await
            .map_err(ctx(format!(
                "replacing route {dst}/{prefix} dev {name} src {src}"
            )))
    }

    /// Sets a link up.
    pub async fn set_up(&self, index: u32, name: &str) -> Result<(), NetlinkError> {
        self.handle
            .link()
            .set(messages::link_up(index))
            .execute()
            .await
            .map_err(ctx(format!("setting {name} up")))
    }

    /// Deletes a link (and, for a veth, its peer).
    pub async fn delete_link(&self, index: u32, name: &str) -> Result<(), NetlinkError> {
        self.handle
            .link()
            .del(index)
            .execute()
            .await
            .map_err(ctx(format!("deleting link {name}")))
    }

    /// Every IPv4 address of the namespace, with the ifindex holding it.
    pub async fn ipv4_addresses(&self) -> Result<Vec<(u32, Ipv4Addr)>, NetlinkError> {
        let _one_dump = self.dumps.lock().await;
        let msgs: Vec<_> = self
            .handle
            .address()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(ctx("listing addresses"))?;
        let mut out: Vec<(u32, Ipv4Addr)> = msgs
            .iter()
            .flat_map(|m| {
                m.attributes.iter().filter_map(|a| match a {
                    AddressAttribute::Local(IpAddr::V4(ip))
                    | AddressAttribute::Address(IpAddr::V4(ip)) => Some((m.header.index, *ip)),
                    _ => None,
                })
            })
            .collect();
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// IPv4 addresses (with prefix lengths) on the link `index`.
    pub async fn addresses_of(&self, index: u32) -> Result<Vec<(Ipv4Addr, u8)>, NetlinkError> {
        let _one_dump = self.dumps.lock().await;
        let msgs: Vec<_> = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute()
            .try_collect()
            .await
            .map_err(ctx(format!("listing addresses of ifindex {index}")))?;
        Ok(msgs
            .iter()
            .flat_map(|m| {
                m.attributes.iter().filter_map(|a| match a {
                    AddressAttribute::Local(IpAddr::V4(ip)) => Some((*ip, m.header.prefix_len)),
                    _ => None,
                })
            })
            .collect())
    }

    /// IPv4 routes of the main table.
    pub async fn ipv4_routes(&self) -> Result<Vec<RouteInfo>, NetlinkError> {
        let _one_dump = self.dumps.lock().await;
        let msgs: Vec<RouteMessage> = self
            .handle
            .route()
            .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
            .execute()
            .try_collect()
            .await
            .map_err(ctx("listing routes"))?;
        Ok(msgs
            .iter()
            .filter(|m| m.header.table == RouteHeader::RT_TABLE_MAIN)
            .map(route_info)
            .collect())
    }

    /// IDs of the BPF programs in `cls_bpf` filters on the ingress (or
    /// egress) hook of link `index` (`tc filter show dev X ingress`).
    pub async fn tc_bpf_prog_ids(
        &self,
        index: u32,
        ingress: bool,
    ) -> Result<Vec<u32>, NetlinkError> {
        use rtnetlink::packet_route::tc::{TcAttribute, TcFilterBpfOption, TcOption};
        let _one_dump = self.dumps.lock().await;
        let mut tf = self.handle.clone().traffic_filter(index as i32);
        let req = if ingress {
            tf.get().ingress()
        } else {
            tf.get().egress()
        };
        let msgs: Vec<_> = match req.execute().try_collect().await {
            Ok(m) => m,
            // No clsact qdisc: no filters.
            Err(rtnetlink::Error::NetlinkError(m)) if -m.raw_code() == libc::EINVAL => Vec::new(),
            Err(e) => return Err(ctx(format!("listing tc filters of ifindex {index}"))(e)),
        };
        Ok(msgs
            .iter()
            .flat_map(|m| m.attributes.iter())
            .filter_map(|a| match a {
                TcAttribute::Options(opts) => Some(opts),
                _ => None,
            })
            .flatten()
            .filter_map(|o| match o {
                TcOption::Bpf(TcFilterBpfOption::ProgId(id)) => Some(*id),
                _ => None,
            })
            .collect())
    }
}
