//! Raw Ethernet frames sent from inside a namespace (what a pod with
//! `CAP_NET_RAW` can do): an `AF_PACKET` socket created on a thread that
//! entered the namespace, bound to one of its interfaces. The frames it
//! sends are built with [`crate::packet`].
//!
//! A socket belongs to the namespace it was created in for its whole life,
//! so the [`RawSocket`] can be used from any thread afterwards; it never
//! sees an interface of another namespace.

use std::{
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

use crate::netns::Netns;

/// An `AF_PACKET`/`SOCK_RAW` socket bound to one interface of a namespace.
/// It only sends (protocol 0: the kernel delivers nothing to it).
#[derive(Debug)]
pub struct RawSocket {
    fd: OwnedFd,
    ifindex: i32,
    ifname: String,
}

impl RawSocket {
    /// Opens the socket inside `ns` on `ifname`.
    pub fn open(ns: &Netns, ifname: &str) -> io::Result<Self> {
        let name = ifname.to_owned();
        ns.exec(move || Self::open_here(&name))
    }

    /// Opens the socket in the calling thread's namespace.
    pub fn open_here(ifname: &str) -> io::Result<Self> {
        let cname = std::ffi::CString::new(ifname)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in interface name"))?;
        // SAFETY: `cname` is a valid NUL-terminated string for the call.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if ifindex == 0 {
            return Err(io::Error::last_os_error());
        }
        let ifindex = i32::try_from(ifindex)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "ifindex out of range"))?;
        // SAFETY: plain syscall; the result is checked before use.
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(Self {
            fd,
            ifindex,
            ifname: ifname.to_owned(),
        })
    }

    /// The interface it sends on.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// Sends one complete Ethernet frame (header included) as it is.
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        if frame.len() < 14 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "frame shorter than an Ethernet header",
            ));
        }
        // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_ifindex = self.ifindex;
        sll.sll_halen = 6;
        sll.sll_addr[..6].copy_from_slice(&frame[..6]);
        // SAFETY: the buffer and the address are valid for the given lengths
        // for the duration of the call; the descriptor is ours.
        let sent = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                std::ptr::addr_of!(sll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        if usize::try_from(sent).ok() != Some(frame.len()) {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("sent {sent} of {} bytes", frame.len()),
            ));
        }
        Ok(())
    }

    /// Sends every frame; returns how many were sent. A transient
    /// `ENOBUFS` (the device queue is full) is retried after a short pause.
    pub fn send_all<'a>(&self, frames: impl IntoIterator<Item = &'a [u8]>) -> io::Result<u64> {
        let mut count = 0;
        for f in frames {
            let mut tries = 0;
            loop {
                match self.send(f) {
                    Ok(()) => break,
                    Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) && tries < 1000 => {
                        tries += 1;
                        std::thread::sleep(std::time::Duration::from_micros(200));
                    }
                    Err(e) => return Err(e),
                }
            }
            count += 1;
        }
        Ok(count)
    }
}
