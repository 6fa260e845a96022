//! What DEL can do without the agent: delete the pod's host-side veth
//! (which also removes its peer, routes, neighbour entry and TCX link) with a
//! plain netlink socket. The agent releases the lease and map entry when it
//! returns (its reconciliation sees the veth gone).

use netlink_packet_core::{NLM_F_ACK, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::{
    RouteNetlinkMessage,
    link::{LinkAttribute, LinkMessage},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

/// Deletes the link `name` in the calling process's namespace. Returns
/// `Ok(false)` when it does not exist.
pub fn delete_link(name: &str) -> std::io::Result<bool> {
    let mut socket = Socket::new(NETLINK_ROUTE)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;

    let mut link = LinkMessage::default();
    link.attributes.push(LinkAttribute::IfName(name.to_owned()));
    let mut msg = NetlinkMessage::from(RouteNetlinkMessage::DelLink(link));
    msg.header.flags = NLM_F_REQUEST | NLM_F_ACK;
    msg.header.sequence_number = 1;
    msg.finalize();
    let mut buf = vec![0u8; msg.buffer_len()];
    msg.serialize(&mut buf);
    socket.send(&buf, 0)?;

    let mut reply = vec![0u8; 8192];
    let n = socket.recv(&mut &mut reply[..], 0)?;
    let answer = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&reply[..n])
        .map_err(|e| std::io::Error::other(format!("decoding the netlink reply: {e}")))?;
    match answer.payload {
        NetlinkPayload::Error(e) => match e.code {
            None => Ok(true),
            Some(code) if -code.get() == libc::ENODEV => Ok(false),
            Some(code) => Err(std::io::Error::from_raw_os_error(-code.get())),
        },
        _ => Ok(true),
    }
}
