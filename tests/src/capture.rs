//! Capturing the frames that cross one interface of a namespace: an
//! `AF_PACKET` socket for every protocol, created on a thread that entered
//! the namespace and bound to the interface, read on its own thread until
//! stopped. Each frame is kept with its direction, full length and first
//! [`SNAP`] bytes (room for Ethernet, an IPv4 header with options, an ICMP
//! header and the IPv4 header and ports it quotes).
//!
//! What a test concludes from a capture is only as good as the capture, so
//! it reports on itself: [`Captured::kernel_drops`] is the kernel's count
//! of frames the socket lost (`PACKET_STATISTICS`), and a test can wait
//! until frames it made on purpose ([`Capture::wait_for`]) were seen — before
//! its traffic, to know the capture runs, and after, to know everything in
//! between was read.

use std::{
    io,
    net::Ipv4Addr,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::{
    netns::Netns,
    packet::{ETH_P_IP, be16},
};

/// Bytes kept of each frame.
pub const SNAP: usize = 192;
/// `ETH_P_ALL`: every protocol.
const ETH_P_ALL: u16 = 0x0003;
/// How long one receive waits before the reader looks at its stop flag.
const POLL: Duration = Duration::from_millis(50);

/// One captured frame.
#[derive(Debug, Clone)]
pub struct Frame {
    /// Sent by the interface (`PACKET_OUTGOING`), else received by it.
    pub outgoing: bool,
    /// Length on the wire.
    pub len: usize,
    /// The first [`SNAP`] bytes, Ethernet header included.
    pub bytes: Vec<u8>,
}

/// The IPv4 facts of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Info {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Protocol.
    pub proto: u8,
    /// ICMP type and code.
    pub icmp: Option<(u8, u8)>,
    /// Source and destination of the packet an ICMP error quotes.
    pub quoted: Option<(Ipv4Addr, Ipv4Addr)>,
    /// Source and destination port (TCP, UDP; 0, 0 when cut off or a later
    /// fragment).
    pub ports: (u16, u16),
}

fn addr(b: &[u8]) -> Ipv4Addr {
    Ipv4Addr::new(b[0], b[1], b[2], b[3])
}

impl Frame {
    /// The frame's IPv4 header (and ICMP or ports), if it is IPv4.
    pub fn ipv4(&self) -> Option<Ipv4Info> {
        let b = &self.bytes;
        if b.len() < 34 || be16(&b[12..14]) != ETH_P_IP || b[14] >> 4 != 4 {
            return None;
        }
        let hlen = usize::from(b[14] & 0x0f) * 4;
        let l4 = 14 + hlen;
        let first = be16(&b[20..22]) & 0x1fff == 0;
        let mut info = Ipv4Info {
            src: addr(&b[26..30]),
            dst: addr(&b[30..34]),
            proto: b[23],
            icmp: None,
            quoted: None,
            ports: (0, 0),
        };
        match info.proto {
            6 | 17 if first && b.len() >= l4 + 4 => {
                info.ports = (be16(&b[l4..]), be16(&b[l4 + 2..]));
            }
            1 if first && b.len() >= l4 + 2 => {
                info.icmp = Some((b[l4], b[l4 + 1]));
                // Errors (unreachable, source quench, redirect, time
                // exceeded, parameter problem) quote a packet.
                let inner = l4 + 8;
                if matches!(b[l4], 3 | 4 | 5 | 11 | 12) && b.len() >= inner + 20 {
                    info.quoted = Some((
                        addr(&b[inner + 12..inner + 16]),
                        addr(&b[inner + 16..inner + 20]),
                    ));
                }
            }
            _ => {}
        }
        Some(info)
    }

    /// Whether `needle` occurs in the captured bytes.
    pub fn contains(&self, needle: &[u8]) -> bool {
        !needle.is_empty() && self.bytes.windows(needle.len()).any(|w| w == needle)
    }
}

/// What a stopped capture holds.
#[derive(Debug, Clone)]
pub struct Captured {
    /// Every frame, in arrival order.
    pub frames: Vec<Frame>,
    /// Frames the kernel handed to the socket (`tp_packets`).
    pub kernel_packets: u32,
    /// Frames the kernel dropped because the socket was full (`tp_drops`).
    pub kernel_drops: u32,
}

/// A running capture on one interface of a namespace.
#[derive(Debug)]
pub struct Capture {
    fd: Arc<OwnedFd>,
    frames: Arc<Mutex<Vec<Frame>>>,
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<io::Result<()>>>,
    what: String,
}

/// `setsockopt` of a plain value.
fn set_opt<T>(fd: &OwnedFd, level: i32, name: i32, value: &T) -> io::Result<()> {
    // SAFETY: `value` points to a live `T` of the size passed.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            std::ptr::from_ref(value).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Capture {
    /// Starts capturing on the interface with index `ifindex` of `ns`.
    pub fn start(ns: &Netns, ifindex: u32) -> io::Result<Self> {
        let fd = Arc::new(ns.exec(move || Self::open_here(ifindex))?);
        let frames = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (fd, frames, stop) = (Arc::clone(&fd), Arc::clone(&frames), Arc::clone(&stop));
            std::thread::spawn(move || read_until_stopped(&fd, ifindex, &frames, &stop))
        };
        Ok(Self {
            fd,
            frames,
            stop,
            reader: Some(reader),
            what: format!("interface {ifindex} of {}", ns.name()),
        })
    }

    /// Opens and binds the socket in the calling thread's namespace.
    fn open_here(ifindex: u32) -> io::Result<OwnedFd> {
        let proto = i32::from(ETH_P_ALL.to_be());
        // SAFETY: plain syscall; the result is checked before use.
        let raw =
            unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // Room for bursts while the reader sleeps (root may exceed rmem_max).
        let size: libc::c_int = 32 << 20;
        set_opt(&fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &size)
            .or_else(|_| set_opt(&fd, libc::SOL_SOCKET, libc::SO_RCVBUF, &size))?;
        let timeout = libc::timeval {
            tv_sec: 0,
            tv_usec: POLL.as_micros() as libc::suseconds_t,
        };
        set_opt(&fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &timeout)?;
        // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = ETH_P_ALL.to_be();
        sll.sll_ifindex = i32::try_from(ifindex)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "ifindex out of range"))?;
        // SAFETY: `sll` is a valid sockaddr_ll of the size passed.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                std::ptr::from_ref(&sll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(fd)
    }

    /// The frames captured so far.
    pub fn frames(&self) -> Vec<Frame> {
        self.frames.lock().map(|f| f.clone()).unwrap_or_default()
    }

    /// Waits up to `timeout` for a frame matching `pred`; true if one came.
    pub fn wait_for(&self, timeout: Duration, pred: impl Fn(&Frame) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut from = 0;
        loop {
            if let Ok(frames) = self.frames.lock() {
                if frames[from..].iter().any(&pred) {
                    return true;
                }
                from = frames.len();
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops the capture once everything queued is read; the frames and
    /// the kernel's counts. An error of the reader is returned as such.
    pub fn stop(mut self) -> io::Result<Captured> {
        self.stop.store(true, Ordering::SeqCst);
        let reader = self.reader.take().expect("reader runs until stopped");
        reader.join().map_err(|_| {
            io::Error::other(format!("capture on {}: reader panicked", self.what))
        })??;
        // SAFETY: tpacket_stats is plain old data; all-zero is a valid value.
        let mut stats: libc::tpacket_stats = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tpacket_stats>() as libc::socklen_t;
        // SAFETY: `stats` and `len` are valid for the call and sized as said.
        let r = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                std::ptr::from_mut(&mut stats).cast(),
                &mut len,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        let frames =
            std::mem::take(&mut *self.frames.lock().map_err(|_| {
                io::Error::other(format!("capture on {}: frames poisoned", self.what))
            })?);
        Ok(Captured {
            frames,
            kernel_packets: stats.tp_packets,
            kernel_drops: stats.tp_drops,
        })
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

/// The reader: every frame of `ifindex` until `stop` is set and a receive
/// finds nothing more queued.
fn read_until_stopped(
    fd: &OwnedFd,
    ifindex: u32,
    frames: &Mutex<Vec<Frame>>,
    stop: &AtomicBool,
) -> io::Result<()> {
    let mut buf = [0u8; SNAP];
    loop {
        // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // SAFETY: `buf`, `sll` and `len` are valid for the call and sized
        // as said; MSG_TRUNC makes the result the frame's full length.
        let n = unsafe {
            libc::recvfrom(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_TRUNC,
                std::ptr::from_mut(&mut sll).cast(),
                &mut len,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                    if stop.load(Ordering::SeqCst) {
                        return Ok(());
                    }
                    continue;
                }
                io::ErrorKind::Interrupted => continue,
                _ => return Err(e),
            }
        }
        // Bound to one interface, but frames of others may have been queued
        // between socket() and bind().
        if u32::try_from(sll.sll_ifindex) != Ok(ifindex) {
            continue;
        }
        let len = n as usize;
        let frame = Frame {
            outgoing: sll.sll_pkttype == libc::PACKET_OUTGOING,
            len,
            bytes: buf[..len.min(SNAP)].to_vec(),
        };
        frames
            .lock()
            .map_err(|_| io::Error::other("frames poisoned"))?
            .push(frame);
    }
}
