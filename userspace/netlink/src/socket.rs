//! A blocking route netlink socket: requests framed and numbered, written
//! (several in one `sendmsg` when asked) and acknowledged. It lives in the
//! network namespace of the thread that opened it.

use netlink_packet_core::{
    ErrorMessage, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_ECHO, NLM_F_EXCL, NLM_F_REPLACE,
    NLM_F_REQUEST, NetlinkBuffer, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::{
    RouteNetlinkMessage,
    tc::{TcHandle, TcMessage},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

use crate::{
    Error,
    messages::{
        LinkInfo, QdiscStats, SHAPER_BULK, SHAPER_BULK_KIND, SHAPER_KIND, Shaper, link_info,
        link_named, qdisc_stats, root_qdisc, shaper,
    },
};

/// Flags of a request creating an object that must not exist yet.
pub const CREATE: u16 = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;

/// A blocking route netlink socket, in the namespace of the thread that
/// opened it.
pub struct RouteSocket {
    socket: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl RouteSocket {
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

    /// `msg` with `flags` and the next sequence number, serialized:
    /// (sequence number, bytes; a multiple of 4 long).
    pub fn frame(&mut self, flags: u16, msg: RouteNetlinkMessage) -> (u32, Vec<u8>) {
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

    /// Writes framed requests (one `sendmsg`).
    pub fn send(&self, bytes: &[u8]) -> Result<(), Error> {
        self.socket.send(bytes, 0)?;
        Ok(())
    }

    /// Reads messages, handing each to `on`, until it answers true.
    pub fn receive(
        &mut self,
        mut on: impl FnMut(NetlinkMessage<RouteNetlinkMessage>) -> bool,
    ) -> Result<(), Error> {
        loop {
            let n = self.socket.recv(&mut &mut self.buf[..], 0)?;
            let mut offset = 0;
            while offset < n {
                let slice = &self.buf[offset..n];
                let len = NetlinkBuffer::new_checked(slice)
                    .map_err(|e| Error::Decode(e.to_string()))?
                    .length() as usize;
                let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&slice[..len])
                    .map_err(|e| Error::Decode(e.to_string()))?;
                offset += (len + 3) & !3;
                if on(msg) {
                    return Ok(());
                }
            }
        }
    }

    /// Sends every request in one write (the kernel handles them in order)
    /// and waits for every acknowledgement: each request's answer, in
    /// request order (`code` `None`: done).
    pub fn acknowledge(
        &mut self,
        requests: impl IntoIterator<Item = (u16, RouteNetlinkMessage)>,
    ) -> Result<Vec<ErrorMessage>, Error> {
        let mut bytes = Vec::new();
        let mut answers: Vec<(u32, Option<ErrorMessage>)> = Vec::new();
        for (flags, msg) in requests {
            let (seq, frame) = self.frame(flags | NLM_F_ACK, msg);
            bytes.extend_from_slice(&frame);
            answers.push((seq, None));
        }
        if answers.is_empty() {
            return Ok(Vec::new());
        }
        self.send(&bytes)?;
        let mut pending = answers.len();
        self.receive(|msg| {
            if let NetlinkPayload::Error(e) = msg.payload
                && let Some(slot) = answers
                    .iter_mut()
                    .find(|(seq, done)| *seq == msg.header.sequence_number && done.is_none())
            {
                slot.1 = Some(e);
                pending -= 1;
            }
            pending == 0
        })?;
        Ok(answers
            .into_iter()
            .map(|(_, answer)| answer.unwrap_or_default())
            .collect())
    }

    /// Sends one request and waits for its acknowledgement.
    pub fn request(&mut self, flags: u16, msg: RouteNetlinkMessage) -> Result<(), Error> {
        let answer = self.acknowledge([(flags, msg)])?;
        match answer.into_iter().next() {
            Some(e) if e.code.is_some() => Err(Error::Kernel(e)),
            _ => Ok(()),
        }
    }

    /// Creates a link (`NLM_F_CREATE | NLM_F_EXCL`) and returns the link
    /// called `name` as the kernel echoes it (`NLM_F_ECHO`: ifindex, MAC,
    /// for a veth the peer's ifindex in `IFLA_LINK`) — one round trip
    /// instead of creation then lookup. A kernel that does not echo
    /// creations (before 6.3) answers `None` on success.
    pub fn create_link(
        &mut self,
        name: &str,
        msg: netlink_packet_route::link::LinkMessage,
    ) -> Result<Option<LinkInfo>, Error> {
        let (seq, frame) = self.frame(CREATE | NLM_F_ECHO, RouteNetlinkMessage::NewLink(msg));
        self.send(&frame)?;
        let mut echoed = None;
        let mut failed = None;
        self.receive(|msg| {
            if msg.header.sequence_number != seq {
                return false;
            }
            match msg.payload {
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link)) => {
                    let info = link_info(&link);
                    if info.name == name {
                        echoed = Some(info);
                    }
                    false
                }
                NetlinkPayload::Error(e) => {
                    if e.code.is_some() {
                        failed = Some(e);
                    }
                    true
                }
                _ => false,
            }
        })?;
        match failed {
            Some(e) => Err(Error::Kernel(e)),
            None => Ok(echoed),
        }
    }

    /// The link called `name`, if it exists.
    pub fn link_by_name(&mut self, name: &str) -> Result<Option<LinkInfo>, Error> {
        let (seq, frame) = self.frame(
            NLM_F_REQUEST,
            RouteNetlinkMessage::GetLink(link_named(name)),
        );
        self.send(&frame)?;
        let mut found = None;
        let mut failed = None;
        self.receive(|msg| {
            if msg.header.sequence_number != seq {
                return false;
            }
            match msg.payload {
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link)) => {
                    found = Some(link_info(&link));
                    true
                }
                NetlinkPayload::Error(e) => {
                    if e.raw_code() != -libc::ENODEV {
                        failed = Some(e);
                    }
                    true
                }
                _ => false,
            }
        })?;
        match failed {
            Some(e) => Err(Error::Kernel(e)),
            None => Ok(found),
        }
    }

    /// Deletes the link called `name` (for a veth, its peer too): false
    /// when there is none.
    pub fn delete_link_by_name(&mut self, name: &str) -> Result<bool, Error> {
        match self.request(
            NLM_F_REQUEST | NLM_F_ACK,
            RouteNetlinkMessage::DelLink(link_named(name)),
        ) {
            Ok(()) => Ok(true),
            Err(e) if e.errno() == libc::ENODEV => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Makes the [`shaper`] tree of `t` the root qdisc of link `index`
    /// (replacing the one there): every part or, on an error, the error
    /// of the first part refused (the parts before it stay; deleting the
    /// root removes them).
    pub fn replace_shaper(&mut self, index: u32, t: &Shaper) -> Result<(), Error> {
        let parts = shaper(index, t);
        let answers = self.acknowledge(parts.into_iter().enumerate().map(|(i, msg)| {
            let replace = if i == 0 { NLM_F_REPLACE } else { NLM_F_EXCL };
            (NLM_F_REQUEST | NLM_F_CREATE | replace, msg)
        }))?;
        match answers.into_iter().find(|e| e.code.is_some()) {
            Some(e) => Err(Error::Kernel(e)),
            None => Ok(()),
        }
    }

    /// The counters of every [`shaper`] in the namespace: its root
    /// qdisc's, with the delays of its bulk class's `tbf` added (drops
    /// the root counts itself).
    pub fn shapers(&mut self) -> Result<Vec<QdiscStats>, Error> {
        let (seq, frame) = self.frame(
            NLM_F_REQUEST | NLM_F_DUMP,
            RouteNetlinkMessage::GetQueueDiscipline(TcMessage::default()),
        );
        self.send(&frame)?;
        let (mut out, mut bulk) = (Vec::new(), Vec::new());
        let mut failed = None;
        self.receive(|msg| {
            if msg.header.sequence_number != seq {
                return false;
            }
            match msg.payload {
                NetlinkPayload::Done(_) => true,
                NetlinkPayload::Error(e) => {
                    failed = Some(e);
                    true
                }
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewQueueDiscipline(q)) => {
                    out.extend(qdisc_stats(&q, TcHandle::ROOT, SHAPER_KIND));
                    bulk.extend(qdisc_stats(&q, SHAPER_BULK, SHAPER_BULK_KIND));
                    false
                }
                _ => false,
            }
        })?;
        if let Some(e) = failed.filter(|e| e.code.is_some()) {
            return Err(Error::Kernel(e));
        }
        for root in &mut out {
            for b in bulk.iter().filter(|b| b.index == root.index) {
                root.overlimits += b.overlimits;
            }
        }
        Ok(out)
    }

    /// Removes the root qdisc of link `index` (back to the default): false
    /// when it had none of its own.
    pub fn delete_root_qdisc(&mut self, index: u32) -> Result<bool, Error> {
        match self.request(
            NLM_F_REQUEST | NLM_F_ACK,
            RouteNetlinkMessage::DelQueueDiscipline(root_qdisc(index)),
        ) {
            Ok(()) => Ok(true),
            Err(e) if matches!(e.errno(), libc::ENOENT | libc::EINVAL) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::messages::{link_route, link_up};

    #[test]
    fn frames_are_aligned_and_numbered() {
        let mut nl = RouteSocket::open().expect("netlink socket");
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
        let mut nl = RouteSocket::open().expect("netlink socket");
        let lo = nl.link_by_name("lo").expect("lookup").expect("lo exists");
        assert_eq!(lo.index, crate::messages::LOOPBACK_IFINDEX);
        assert!(nl.link_by_name("rv-no-such").expect("lookup").is_none());
        // Deleting a link that does not exist is no error: "did not exist".
        assert!(!nl.delete_link_by_name("rv-no-such").expect("delete"));
        assert!(nl.acknowledge([]).expect("nothing to send").is_empty());
    }
}
