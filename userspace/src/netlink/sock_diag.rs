//! UDP sockets of the calling thread's network namespace, through
//! `NETLINK_SOCK_DIAG` (what `ss -K` uses): list those connected to given
//! destinations, and destroy one (`SOCK_DESTROY`: the kernel aborts it —
//! its next call fails with `ECONNABORTED` — and disconnects it). Needs
//! `CONFIG_INET_DIAG_DESTROY` and `CAP_NET_ADMIN`.
//!
//! Used for connected UDP sockets a Service sent to a backend that has
//! left: the connection is fixed at `connect` (socket-level translation),
//! so without this the socket would keep sending to a gone backend.

use std::{
    collections::HashSet,
    io,
    mem::size_of,
    net::Ipv4Addr,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

const NETLINK_SOCK_DIAG: libc::c_int = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const SOCK_DESTROY: u16 = 21;
const NLMSG_HDR: usize = 16;
/// `struct inet_diag_req_v2`: family, protocol, ext, pad, states, sockid.
const REQ_LEN: usize = 8 + SOCKID_LEN;
/// `struct inet_diag_sockid`: sport, dport, src[4], dst[4], if, cookie[2].
const SOCKID_LEN: usize = 4 + 16 + 16 + 4 + 8;
/// `struct inet_diag_msg` up to and including the sockid.
const MSG_MIN: usize = 4 + SOCKID_LEN;

/// One UDP socket as `sock_diag` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdpSocket {
    /// `struct inet_diag_sockid`, as the kernel sent it (used to destroy).
    id: [u8; SOCKID_LEN],
    /// Its cookie (`SO_COOKIE`, what `bpf_get_socket_cookie` returns).
    pub cookie: u64,
    /// The destination it is connected to.
    pub dst: (Ipv4Addr, u16),
}

fn socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call; the descriptor is owned at once.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by socket(2) and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn request(kind: u16, flags: u16, id: &[u8; SOCKID_LEN]) -> Vec<u8> {
    let len = NLMSG_HDR + REQ_LEN;
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&kind.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    m.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel's
    m.push(libc::AF_INET as u8);
    m.push(libc::IPPROTO_UDP as u8);
    m.push(0); // idiag_ext
    m.push(0); // pad
    m.extend_from_slice(&u32::MAX.to_ne_bytes()); // every state
    m.extend_from_slice(id);
    m
}

fn send(fd: &OwnedFd, msg: &[u8]) -> io::Result<()> {
    // SAFETY: `msg` is a valid buffer of its length; the address is the
    // kernel's (a zeroed sockaddr_nl).
    let rc = unsafe {
        let mut addr: libc::sockaddr_nl = std::mem::zeroed();
        addr.nl_family = libc::AF_NETLINK as u16;
        libc::sendto(
            fd.as_raw_fd(),
            msg.as_ptr().cast(),
            msg.len(),
            0,
            (&raw const addr).cast(),
            size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn recv(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is a valid writable buffer of its length.
    let rc = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc as usize)
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The error a netlink error message carries (0: an acknowledgement).
fn nl_error(payload: &[u8]) -> io::Result<()> {
    if payload.len() < 4 {
        return Err(io::Error::other("truncated netlink error"));
    }
    match u32_at(payload, 0) as i32 {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(-e)),
    }
}

/// The UDP sockets of this namespace connected to one of `targets`.
pub fn connected_to(targets: &HashSet<(Ipv4Addr, u16)>) -> io::Result<Vec<UdpSocket>> {
    let fd = socket()?;
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
    send(&fd, &request(SOCK_DIAG_BY_FAMILY, flags, &[0; SOCKID_LEN]))?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = recv(&fd, &mut buf)?;
        let mut at = 0;
        while at + NLMSG_HDR <= n {
            let len = u32_at(&buf, at) as usize;
            let kind = u16_at(&buf, at + 4);
            if len < NLMSG_HDR || at + len > n {
                return Err(io::Error::other("malformed sock_diag answer"));
            }
            let payload = &buf[at + NLMSG_HDR..at + len];
            match kind {
                k if k == libc::NLMSG_DONE as u16 => return Ok(out),
                k if k == libc::NLMSG_ERROR as u16 => {
                    nl_error(payload)?;
                    return Ok(out);
                }
                SOCK_DIAG_BY_FAMILY if payload.len() >= MSG_MIN => {
                    let mut id = [0u8; SOCKID_LEN];
                    id.copy_from_slice(&payload[4..4 + SOCKID_LEN]);
                    let dport = u16::from_be_bytes([id[2], id[3]]);
                    let dst = Ipv4Addr::new(id[20], id[21], id[22], id[23]);
                    if targets.contains(&(dst, dport)) {
                        let cookie =
                            u64::from(u32_at(&id, 40)) | (u64::from(u32_at(&id, 44)) << 32);
                        out.push(UdpSocket {
                            id,
                            cookie,
                            dst: (dst, dport),
                        });
                    }
                }
                _ => {}
            }
            at += (len + 3) & !3;
        }
    }
}

/// Aborts `sock` (its owner's next call fails with `ECONNABORTED`); a
/// socket already gone is not an error.
pub fn destroy(sock: &UdpSocket) -> io::Result<()> {
    let fd = socket()?;
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16;
    send(&fd, &request(SOCK_DESTROY, flags, &sock.id))?;
    let mut buf = [0u8; 512];
    let n = recv(&fd, &mut buf)?;
    if n < NLMSG_HDR + 4 || u16_at(&buf, 4) != libc::NLMSG_ERROR as u16 {
        return Err(io::Error::other("unexpected SOCK_DESTROY answer"));
    }
    match nl_error(&buf[NLMSG_HDR..n]) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        other => other,
    }
}
