//! One kernel routing table, watched: a dump, then every change the kernel
//! multicasts (`RTMGRP_IPV4_ROUTE`). The BGP speaker writes the routes it
//! learns into a table of its own; this is how the agent hears of them
//! within milliseconds, without polling the speaker.

use std::net::Ipv4Addr;

use futures_util::{StreamExt as _, TryStreamExt as _};
use ipnet::Ipv4Net;
use rtnetlink::{
    Handle, RouteMessageBuilder,
    packet_core::{NetlinkMessage, NetlinkPayload},
    packet_route::{
        RouteNetlinkMessage,
        route::{RouteAddress, RouteAttribute, RouteMessage, RouteType},
    },
    sys::{AsyncSocket as _, SocketAddr},
};

use super::{ConnectError, NetlinkError, ctx};

/// A unicast route of the watched table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableRoute {
    /// Its destination.
    pub dst: Ipv4Net,
    /// Its gateway (the first of a multipath route's).
    pub gateway: Ipv4Addr,
}

/// A change of the watched table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableChange {
    /// A route added or replaced.
    Put(TableRoute),
    /// The route to this destination removed.
    Removed(Ipv4Net),
    /// The kernel dropped changes (the socket overran): dump again.
    Lost,
}

/// The subscription's receive buffer: a burst of thousands of route
/// changes fits.
const RECEIVE_BUFFER: usize = 4 << 20;

/// A watch of one table; opened in the calling thread's namespace.
pub struct TableWatch {
    table: u32,
    handle: Handle,
    events:
        futures_util::stream::BoxStream<'static, (NetlinkMessage<RouteNetlinkMessage>, SocketAddr)>,
}

impl TableWatch {
    /// Subscribes to route changes (before any dump, so nothing falls
    /// between the dump and the first change).
    pub fn open(table: u32) -> Result<Self, ConnectError> {
        let (mut conn, handle, events) = rtnetlink::new_connection()?;
        let socket = conn.socket_mut().socket_mut();
        socket.bind(&SocketAddr::new(0, rtnetlink::constants::RTMGRP_IPV4_ROUTE))?;
        socket.set_rx_buf_sz(RECEIVE_BUFFER)?;
        tokio::spawn(conn);
        Ok(Self {
            table,
            handle,
            events: events.boxed(),
        })
    }

    /// The next change if one is queued already (a burst is taken whole
    /// before the datapath is written).
    pub fn pending(&mut self) -> Option<TableChange> {
        use futures_util::FutureExt as _;
        self.next().now_or_never().flatten()
    }

    /// Every unicast route of the table now.
    pub async fn dump(&mut self) -> Result<Vec<TableRoute>, NetlinkError> {
        let msgs: Vec<RouteMessage> = self
            .handle
            .route()
            .get(
                RouteMessageBuilder::<Ipv4Addr>::new()
                    .table_id(self.table)
                    .build(),
            )
            .execute()
            .try_collect()
            .await
            .map_err(ctx(format!("listing routing table {}", self.table)))?;
        Ok(msgs
            .iter()
            .filter(|m| table_of(m) == self.table)
            .filter_map(route_of)
            .collect())
    }

    /// The next change of the table, waiting for one; `None` when the
    /// socket is gone.
    pub async fn next(&mut self) -> Option<TableChange> {
        loop {
            let (msg, _) = self.events.next().await?;
            let inner = match msg.payload {
                NetlinkPayload::InnerMessage(inner) => inner,
                NetlinkPayload::Overrun(_) => return Some(TableChange::Lost),
                _ => continue,
            };
            match inner {
                RouteNetlinkMessage::NewRoute(m) if table_of(&m) == self.table => {
                    if let Some(r) = route_of(&m) {
                        return Some(TableChange::Put(r));
                    }
                    // A route that is no usable unicast route (unreachable,
                    // blackhole) counts as none.
                    if let Some(dst) = dst_of(&m) {
                        return Some(TableChange::Removed(dst));
                    }
                }
                RouteNetlinkMessage::DelRoute(m) if table_of(&m) == self.table => {
                    if let Some(dst) = dst_of(&m) {
                        return Some(TableChange::Removed(dst));
                    }
                }
                _ => {}
            }
        }
    }
}

/// The table a message names: the 32-bit attribute when present (tables
/// above 255), else the header's byte.
fn table_of(m: &RouteMessage) -> u32 {
    m.attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(u32::from(m.header.table))
}

fn dst_of(m: &RouteMessage) -> Option<Ipv4Net> {
    let addr = m
        .attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Destination(RouteAddress::Inet(ip)) => Some(*ip),
            _ => None,
        })
        .unwrap_or(Ipv4Addr::UNSPECIFIED);
    Ipv4Net::new(addr, m.header.destination_prefix_length).ok()
}

fn route_of(m: &RouteMessage) -> Option<TableRoute> {
    if m.header.kind != RouteType::Unicast {
        return None;
    }
    let gateway = m.attributes.iter().find_map(|a| match a {
        RouteAttribute::Gateway(RouteAddress::Inet(ip)) => Some(*ip),
        RouteAttribute::MultiPath(hops) => hops.iter().find_map(|h| {
            h.attributes.iter().find_map(|a| match a {
                RouteAttribute::Gateway(RouteAddress::Inet(ip)) => Some(*ip),
                _ => None,
            })
        }),
        _ => None,
    })?;
    Some(TableRoute {
        dst: dst_of(m)?,
        gateway,
    })
}
