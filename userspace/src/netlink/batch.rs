//! Blocking netlink for the hot path of an ADD: several requests written in
//! one `sendmsg` and acknowledged together, on a socket bound to the
//! namespace of the thread that opened it. The kernel handles the messages
//! of one write in order, so a batch costs one round trip instead of one per
//! request — and needs no async runtime, which matters on the short-lived
//! thread that configures a pod's namespace.

use std::net::Ipv4Addr;

use rtnetlink::{
    LinkMessageBuilder, LinkUnspec,
    packet_core::{
        ErrorMessage, NLM_F_ACK, NLM_F_CREATE, NLM_F_ECHO, NLM_F_EXCL, NLM_F_REPLACE,
        NLM_F_REQUEST, NetlinkBuffer, NetlinkHeader, NetlinkMessage, NetlinkPayload,
    },
    packet_route::{RouteNetlinkMessage, link::LinkAttribute},
    sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE},
};

use super::{
    LinkInfo, NetlinkError,
    messages::{
        BpfFilter, address, bpf_filter, clsact, link_info, link_route, link_up,
        permanent_neighbour, route_via, veth_message,
    },
};

const CREATE: u16 = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;

/// One request of a batch.
struct Request {
    op: String,
    flags: u16,
    msg: RouteNetlinkMessage,
    /// An error code (negative errno) that counts as success.
    tolerated: Option<i32>,
}

/// Requests to send together; each names what it does for errors.
#[derive(Default)]
pub struct Batch {
    requests: Vec<Request>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    fn push(&mut self, op: String, flags: u16, msg: RouteNetlinkMessage) -> &mut Self {
        self.requests.push(Request {
            op,
            flags,
            msg,
            tolerated: None,
        });
        self
    }

    /// Adds a `clsact` qdisc (one already there is fine).
    pub fn add_clsact(&mut self, index: u32, name: &str) -> &mut Self {
        self.requests.push(Request {
            op: format!("adding the clsact qdisc to {name}"),
            flags: CREATE,
            msg: RouteNetlinkMessage::NewQueueDiscipline(clsact(index)),
            tolerated: Some(-libc::EEXIST),
        });
        self
    }

    /// Attaches (or replaces) a direct-action BPF filter.
    pub fn replace_bpf_filter(&mut self, index: u32, name: &str, f: &BpfFilter<'_>) -> &mut Self {
        self.push(
            format!("attaching {} to {name}", f.prog_name),
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
            RouteNetlinkMessage::NewTrafficFilter(bpf_filter(index, f)),
        )
    }

    /// Sets a link up.
    pub fn set_up(&mut self, index: u32, name: &str) -> &mut Self {
        self.push(
            format!("setting {name} up"),
            NLM_F_REQUEST | NLM_F_ACK,
            RouteNetlinkMessage::SetLink(link_up(index)),
        )
    }

    /// Adds `addr/prefix` to a link.
    pub fn add_address(&mut self, index: u32, name: &str, addr: Ipv4Addr, prefix: u8) -> &mut Self {
        self.push(
            format!("adding {addr}/{prefix} to {name}"),
            CREATE,
            RouteNetlinkMessage::NewAddress(address(index, addr, prefix)),
        )
    }

    /// Adds a scope-link route.
    pub fn add_link_route(
        &mut self,
        dst: Ipv4Addr,
        prefix: u8,
        index: u32,
        name: &str,
    ) -> &mut Self {
        self.push(
            format!("adding route {dst}/{prefix} dev {name}"),
            CREATE,
            RouteNetlinkMessage::NewRoute(link_route(dst, prefix, index)),
        )
    }

    /// Adds a route through a gateway (`prefix` 0: the default route).
    pub fn add_route_via(
        &mut self,
        dst: Ipv4Addr,
        prefix: u8,
        gateway: Ipv4Addr,
        index: u32,
        name: &str,
    ) -> &mut Self {
        self.push(
            format!("adding route {dst}/{prefix} via {gateway} dev {name}"),
            CREATE,
            RouteNetlinkMessage::NewRoute(route_via(dst, prefix, gateway, index)),
        )
    }

    /// Adds (or replaces) a permanent neighbour entry.
    pub fn add_permanent_neighbour(
        &mut self,
        index: u32,
        name: &str,
        ip: Ipv4Addr,
        mac: [u8; 6],
    ) -> &mut Self {
        self.push(
            format!("adding neighbour {ip} on {name}"),
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
            RouteNetlinkMessage::NewNeighbour(permanent_neighbour(index, ip, mac)),
        )
    }
}

/// A blocking route netlink socket, in the namespace of the thread that
/// opened it.
pub struct SyncNetlink {
    socket: Socket,
    seq: u32,
    buf: Vec<u8>,
}

/// A socket error as the netlink error the async path would report.
fn io_error(op: &str, e: &std::io::Error) -> NetlinkError {
    let mut m = ErrorMessage::default();
    m.code = std::num::NonZeroI32::new(-e.raw_os_error().unwrap_or(libc::EPROTO));
    NetlinkError {
        op: op.to_owned(),
        source: rtnetlink::Error::NetlinkError(m),
    }
}

/// A message the kernel sent that does not parse.
fn decode_error(op: &str) -> NetlinkError {
    io_error(op, &std::io::Error::from_raw_os_error(libc::EPROTO))
}

impl SyncNetlink {
    /// Opens a socket in the calling thread's namespace.
    pub fn open() -> std::io::Result<Self> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        // Errors come back as bare codes: the request is not echoed.
        socket.set_cap_ack(true)?;
        Ok(Self {
            socket,
            seq: 0,
            buf: vec![0; 64 * 1024],
        })
    }

    fn frame(&mut self, flags: u16, msg: RouteNetlinkMessage) -> (u32, Vec<u8>) {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = self.seq;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
        packet.finalize();
        let mut bytes = vec![0; packet.buffer_len()];
        packet.serialize(&mut bytes);
        (self.seq, bytes)
    }

    /// Reads messages until `done` says the exchange is complete.
    fn receive(
        &mut self,
        op: &str,
        mut on: impl FnMut(NetlinkMessage<RouteNetlinkMessage>) -> Result<bool, NetlinkError>,
    ) -> Result<(), NetlinkError> {
        loop {
            let n = self
                .socket
                .recv(&mut &mut self.buf[..], 0)
                .map_err(|e| io_error(op, &e))?;
            let mut offset = 0;
            while offset < n {
                let slice = &self.buf[offset..n];
                let len = NetlinkBuffer::new_checked(slice)
                    .map_err(|_| decode_error(op))?
                    .length() as usize;
                let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&slice[..len])
                    .map_err(|_| decode_error(op))?;
                offset += (len + 3) & !3;
                if on(msg)? {
                    return Ok(());
                }
            }
        }
    }

    /// Sends every request of `batch` in one write and waits for all the
    /// acknowledgements; the first failure (in request order) is returned.
    pub fn run(&mut self, batch: Batch) -> Result<(), NetlinkError> {
        if batch.requests.is_empty() {
            return Ok(());
        }
        let mut bytes = Vec::new();
        let mut ops = Vec::new();
        for r in batch.requests {
            let (seq, frame) = self.frame(r.flags, r.msg);
            bytes.extend_from_slice(&frame);
            ops.push((seq, r.op, None, r.tolerated));
        }
        let first_op = ops[0].1.clone();
        self.socket
            .send(&bytes, 0)
            .map_err(|e| io_error(&first_op, &e))?;
        let mut pending = ops.len();
        self.receive(&first_op, |msg| {
            if let NetlinkPayload::Error(e) = msg.payload
                && let Some(slot) = ops
                    .iter_mut()
                    .find(|(seq, _, done, _)| *seq == msg.header.sequence_number && done.is_none())
            {
                slot.2 = Some(e);
                pending -= 1;
            }
            Ok(pending == 0)
        })?;
        for (_, op, answer, tolerated) in ops {
            if let Some(e) = answer
                && e.code.is_some()
                && Some(e.raw_code()) != tolerated
            {
                return Err(NetlinkError {
                    op,
                    source: rtnetlink::Error::NetlinkError(e),
                });
            }
        }
        Ok(())
    }

    /// Creates veth `host` (in this namespace) with its peer `peer` inside
    /// `peer_netns`, and returns the host end as the kernel echoes it
    /// (`NLM_F_ECHO`: ifindex, MAC, the peer's ifindex in `IFLA_LINK`) —
    /// one round trip instead of creation then lookup. A kernel that does
    /// not echo creations (before 6.3) answers `None` on success: the caller
    /// looks the link up.
    pub fn create_veth(
        &mut self,
        host: &str,
        peer: &str,
        peer_netns: &std::fs::File,
        mtu: u32,
        peer_mac: [u8; 6],
    ) -> Result<Option<LinkInfo>, NetlinkError> {
        let op = format!("creating veth {host} (peer {peer})");
        let msg = veth_message(host, peer, peer_netns, mtu, peer_mac);
        let (seq, frame) = self.frame(CREATE | NLM_F_ECHO, RouteNetlinkMessage::NewLink(msg));
        self.socket.send(&frame, 0).map_err(|e| io_error(&op, &e))?;
        let mut echoed = None;
        let mut failed = None;
        self.receive(&op, |msg| {
            if msg.header.sequence_number != seq {
                return Ok(false);
            }
            match msg.payload {
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link)) => {
                    let info = link_info(&link);
                    if info.name == host {
                        echoed = Some(info);
                    }
                    Ok(false)
                }
                NetlinkPayload::Error(e) => {
                    if e.code.is_some() {
                        failed = Some(e);
                    }
                    Ok(true)
                }
                _ => Ok(false),
            }
        })?;
        match failed {
            Some(e) => Err(NetlinkError {
                op,
                source: rtnetlink::Error::NetlinkError(e),
            }),
            None => Ok(echoed),
        }
    }

    /// The link called `name`, if it exists.
    pub fn link_by_name(&mut self, name: &str) -> Result<Option<LinkInfo>, NetlinkError> {
        let op = format!("looking up link {name}");
        let mut msg = LinkMessageBuilder::<LinkUnspec>::default().build();
        msg.attributes.push(LinkAttribute::IfName(name.to_owned()));
        let (seq, frame) = self.frame(NLM_F_REQUEST, RouteNetlinkMessage::GetLink(msg));
        self.socket.send(&frame, 0).map_err(|e| io_error(&op, &e))?;
        let mut found = None;
        let mut failed = None;
        self.receive(&op, |msg| {
            if msg.header.sequence_number != seq {
                return Ok(false);
            }
            match msg.payload {
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link)) => {
                    found = Some(link_info(&link));
                    Ok(true)
                }
                NetlinkPayload::Error(e) => {
                    if e.raw_code() != -libc::ENODEV {
                        failed = Some(e);
                    }
                    Ok(true)
                }
                _ => Ok(false),
            }
        })?;
        match failed {
            Some(e) => Err(NetlinkError {
                op,
                source: rtnetlink::Error::NetlinkError(e),
            }),
            None => Ok(found),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_aligned_and_numbered() {
        let mut nl = SyncNetlink::open().expect("netlink socket");
        let (a, fa) = nl.frame(
            CREATE,
            RouteNetlinkMessage::NewRoute(link_route(Ipv4Addr::new(10, 0, 0, 1), 32, 7)),
        );
        let (b, _) = nl.frame(CREATE, RouteNetlinkMessage::SetLink(link_up(7)));
        assert_eq!(b, a.wrapping_add(1));
        assert_eq!(fa.len() % 4, 0);
        let buf = NetlinkBuffer::new_checked(&fa[..]).expect("frame");
        assert_eq!(buf.length() as usize, fa.len());
    }

    #[test]
    fn loopback_is_found_and_missing_links_are_none() {
        let mut nl = SyncNetlink::open().expect("netlink socket");
        let lo = nl.link_by_name("lo").expect("lookup").expect("lo exists");
        assert_eq!(lo.index, 1);
        assert!(nl.link_by_name("rv-no-such").expect("lookup").is_none());
    }
}
