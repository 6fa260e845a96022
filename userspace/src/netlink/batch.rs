//! Blocking netlink for the hot path of an ADD: several requests written in
//! one `sendmsg` and acknowledged together, on a socket bound to the
//! namespace of the thread that opened it. The kernel handles the messages
//! of one write in order, so a batch costs one round trip instead of one per
//! request — and needs no async runtime, which matters on the short-lived
//! thread that configures a pod's namespace. The socket, framing and
//! acknowledgements are `rivet-netlink`'s [`RouteSocket`] (the CNI plugin's
//! too); here each request gets its operation's name for errors.

use std::net::Ipv4Addr;

use rivet_netlink::{RouteSocket, socket::CREATE};
use rtnetlink::{
    packet_core::{ErrorMessage, NLM_F_ACK, NLM_F_CREATE, NLM_F_REPLACE, NLM_F_REQUEST},
    packet_route::RouteNetlinkMessage,
};

use super::{
    LinkInfo, NetlinkError,
    messages::{
        BpfFilter, address, bpf_filter, clsact, link_route, link_up, permanent_neighbour,
        route_via, veth_message,
    },
};

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
    socket: RouteSocket,
}

/// A failed exchange as the netlink error the async path would report:
/// the kernel's answer, else the errno of the socket failure (`EPROTO` for
/// a message that does not parse).
fn nl_error(op: String, e: rivet_netlink::Error) -> NetlinkError {
    let message = match e {
        rivet_netlink::Error::Kernel(m) => m,
        other => {
            let mut m = ErrorMessage::default();
            m.code = std::num::NonZeroI32::new(-other.errno());
            m
        }
    };
    NetlinkError {
        op,
        source: rtnetlink::Error::NetlinkError(message),
    }
}

impl SyncNetlink {
    /// Opens a socket in the calling thread's namespace.
    pub fn open() -> std::io::Result<Self> {
        Ok(Self {
            socket: RouteSocket::open()?,
        })
    }

    /// Sends every request of `batch` in one write and waits for all the
    /// acknowledgements; the first failure (in request order) is returned.
    pub fn run(&mut self, batch: Batch) -> Result<(), NetlinkError> {
        let Some(first) = batch.requests.first() else {
            return Ok(());
        };
        let first_op = first.op.clone();
        let mut ops = Vec::with_capacity(batch.requests.len());
        let mut messages = Vec::with_capacity(batch.requests.len());
        for r in batch.requests {
            ops.push((r.op, r.tolerated));
            messages.push((r.flags, r.msg));
        }
        let answers = self
            .socket
            .acknowledge(messages)
            .map_err(|e| nl_error(first_op, e))?;
        for ((op, tolerated), answer) in ops.into_iter().zip(answers) {
            if answer.code.is_some() && Some(answer.raw_code()) != tolerated {
                return Err(nl_error(op, rivet_netlink::Error::Kernel(answer)));
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
        self.socket
            .create_link(host, veth_message(host, peer, peer_netns, mtu, peer_mac))
            .map_err(|e| nl_error(format!("creating veth {host} (peer {peer})"), e))
    }

    /// The link called `name`, if it exists.
    pub fn link_by_name(&mut self, name: &str) -> Result<Option<LinkInfo>, NetlinkError> {
        self.socket
            .link_by_name(name)
            .map_err(|e| nl_error(format!("looking up link {name}"), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_found_and_missing_links_are_none() {
        let mut nl = SyncNetlink::open().expect("netlink socket");
        let lo = nl.link_by_name("lo").expect("lookup").expect("lo exists");
        assert_eq!(lo.index, 1);
        assert!(nl.link_by_name("rv-no-such").expect("lookup").is_none());
        nl.run(Batch::new()).expect("an empty batch sends nothing");
    }

    #[test]
    fn failures_keep_the_kernel_errno() {
        let e = nl_error(
            "x".to_owned(),
            rivet_netlink::Error::Io(std::io::Error::from_raw_os_error(libc::EPERM)),
        );
        assert_eq!(e.errno(), Some(libc::EPERM));
        let e = nl_error(
            "y".to_owned(),
            rivet_netlink::Error::Decode("short".to_owned()),
        );
        assert_eq!(e.errno(), Some(libc::EPROTO));
    }
}
