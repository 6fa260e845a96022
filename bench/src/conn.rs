//! Connection-level probes shared by the benchmarks: a 1-byte echo
//! server, a connect / 1-byte exchange / close loop (connection rate and
//! per-connection latency), a 1-byte ping-pong on one connection
//! (request/response latency), and paced non-blocking connection attempts
//! that see when a change (a rule, a Service) takes effect.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, SocketAddrV4, TcpListener, TcpStream},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    time::{Duration, Instant},
};

use rivet_tests::Netns;

/// How long a probe waits for its 1-byte answer.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(2);

/// A server in `ns` on `port`: per connection, read 1 byte, answer 1 byte.
pub fn one_byte_server(ns: &Netns, port: u16) {
    let listener: TcpListener = ns
        .exec(move || TcpListener::bind(("0.0.0.0", port)))
        .expect("bind bench server");
    std::thread::spawn(move || {
        for mut c in listener.incoming().map_while(Result::ok) {
            let mut b = [0u8; 1];
            if c.read_exact(&mut b).is_ok() {
                let _ = c.write_all(&b);
            }
        }
    });
}

/// One connection of [`timed_connections`], in µs from the start of its
/// `connect`.
#[derive(Clone, Copy, Debug)]
pub struct Timed {
    /// Until `connect` returned: the handshake (SYN out, SYN-ACK back).
    pub connect_us: f64,
    /// Until the 1-byte answer arrived.
    pub exchange_us: f64,
}

/// Connect/exchange/close from inside `ns` for `time`: latencies in µs.
pub fn connection_loop(ns: &Netns, dst: SocketAddr, time: Duration) -> Vec<f64> {
    timed_connections(ns, dst, time, None)
        .into_iter()
        .map(|c| c.exchange_us)
        .collect()
}

/// Connect/exchange/close from inside `ns` for `time`, one connection at
/// a time: each one's handshake and exchange time. With `pause`, each
/// connection starts that long after the previous one closed (a paced
/// probe: every variant measured at the same offered load, far below what
/// any of them sustains); without it, back to back (the connection rate).
pub fn timed_connections(
    ns: &Netns,
    dst: SocketAddr,
    time: Duration,
    pause: Option<Duration>,
) -> Vec<Timed> {
    ns.exec(move || {
        let end = Instant::now() + time;
        let mut out = Vec::new();
        while Instant::now() < end {
            if let Some(p) = pause {
                std::thread::sleep(p);
            }
            let t = Instant::now();
            let Ok(mut s) = TcpStream::connect_timeout(&dst, Duration::from_secs(2)) else {
                continue;
            };
            let connect_us = t.elapsed().as_secs_f64() * 1e6;
            // A connection whose answer never comes costs 2 s and is said,
            // instead of hanging the benchmark.
            let _ = s.set_read_timeout(Some(EXCHANGE_TIMEOUT));
            let mut b = [7u8; 1];
            match s.write_all(&b).and_then(|()| s.read_exact(&mut b)) {
                Ok(()) => out.push(Timed {
                    connect_us,
                    exchange_us: t.elapsed().as_secs_f64() * 1e6,
                }),
                Err(e) => eprintln!("\nwarning: connection to {dst}: exchange failed: {e}"),
            }
        }
        out
    })
}

/// A server in `ns` on `port` echoing every byte on each connection.
pub fn echo_server(ns: &Netns, port: u16) {
    let listener: TcpListener = ns
        .exec(move || TcpListener::bind(("0.0.0.0", port)))
        .expect("bind echo server");
    std::thread::spawn(move || {
        for c in listener.incoming().map_while(Result::ok) {
            std::thread::spawn(move || {
                let mut c = c;
                let _ = c.set_nodelay(true);
                let mut b = [0u8; 1];
                while c.read_exact(&mut b).is_ok() && c.write_all(&b).is_ok() {}
            });
        }
    });
}

/// 1-byte request/response round trips on one TCP connection from inside
/// `ns` for `time`: the round-trip times in µs.
pub fn ping_pong(ns: &Netns, dst: SocketAddr, time: Duration) -> Vec<f64> {
    ns.exec(move || {
        let mut out = Vec::new();
        let Ok(mut s) = TcpStream::connect_timeout(&dst, Duration::from_secs(2)) else {
            return out;
        };
        let _ = s.set_nodelay(true);
        let _ = s.set_read_timeout(Some(EXCHANGE_TIMEOUT));
        let end = Instant::now() + time;
        let mut b = [7u8; 1];
        while Instant::now() < end {
            let t = Instant::now();
            if s.write_all(&b).is_err() || s.read_exact(&mut b).is_err() {
                break;
            }
            out.push(t.elapsed().as_secs_f64() * 1e6);
        }
        out
    })
}

// ------------------------------------------------------------ paced attempts

/// Refused attempts in a row (after the first) that confirm a denial.
pub const DENY_CONFIRM: usize = 3;

/// A non-blocking TCP connect from the calling thread's namespace.
fn start_connect(dst: SocketAddrV4) -> std::io::Result<OwnedFd> {
    // SAFETY: socket(2) with constant arguments; the result is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor this function alone owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let sa = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: dst.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*dst.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: `sa` is a valid sockaddr_in of the length given, alive for
    // the call.
    let r = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            std::ptr::from_ref(&sa).cast::<libc::sockaddr>(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if r == 0 {
        return Ok(fd);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EINPROGRESS) {
        Ok(fd)
    } else {
        Err(e)
    }
}

/// The pending error of a socket whose connect finished (0: connected).
fn socket_error(fd: &OwnedFd) -> i32 {
    let mut err: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `err` and `len` are valid for writes of the sizes given.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            std::ptr::from_mut(&mut err).cast::<libc::c_void>(),
            &raw mut len,
        )
    };
    if r < 0 { libc::EIO } else { err }
}

/// What a probe waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Connections answered (the client allowed).
    Open,
    /// Connections not answered (the client denied).
    Closed,
}

struct Attempt {
    start: Instant,
    fd: Option<OwnedFd>,
    /// Connected (answered), refused or not yet known.
    ok: Option<bool>,
    /// When it was seen answered.
    answered: Option<Instant>,
}

/// When the attempts show `expect`: for `Open` when the first one was
/// answered (its SYN let through: the moment is seen); for `Closed` the
/// start of the first refused one followed by [`DENY_CONFIRM`] refused
/// ones, once every earlier attempt is resolved (a dropped SYN leaves no
/// moment to see: its attempt's start is taken, a lower bound when the
/// rules take long to judge it).
fn decided(attempts: &[Attempt], expect: Expect) -> Option<Instant> {
    match expect {
        Expect::Open => attempts.iter().filter_map(|a| a.answered).min(),
        Expect::Closed => {
            for (i, a) in attempts.iter().enumerate() {
                a.ok?;
                let run = attempts.get(i..=i + DENY_CONFIRM)?;
                if run.iter().all(|b| b.ok == Some(false)) {
                    return Some(a.start);
                }
            }
            None
        }
    }
}

/// How a probe paces its attempts.
#[derive(Clone, Copy, Debug)]
pub struct Pacing {
    /// One new connection attempt every this long.
    pub every: Duration,
    /// An attempt not connected after this long counts as refused.
    pub timeout: Duration,
}

/// From inside the calling thread's namespace: a new connection attempt to
/// `dst` every `pacing.every` (non-blocking, several in flight; one not
/// connected within `pacing.timeout` is refused) until the attempts show
/// `expect` (see [`decided`]) or `limit` passes: that moment, and the
/// number of attempts.
pub fn probe(
    dst: SocketAddrV4,
    expect: Expect,
    pacing: Pacing,
    limit: Duration,
) -> (Option<Instant>, usize) {
    let deadline = Instant::now() + limit;
    let mut attempts: Vec<Attempt> = Vec::new();
    let mut next = Instant::now();
    // Attempts before this index are resolved.
    let mut first_pending = 0;
    loop {
        let now = Instant::now();
        if now >= deadline {
            return (None, attempts.len());
        }
        if now >= next {
            // A connect that fails at once (no local port) is no answer
            // about the policy: not recorded.
            if let Ok(fd) = start_connect(dst) {
                attempts.push(Attempt {
                    start: now,
                    fd: Some(fd),
                    ok: None,
                    answered: None,
                });
            }
            next = (next + pacing.every).max(now);
        }
        let pending: Vec<usize> = (first_pending..attempts.len())
            .filter(|&i| attempts[i].ok.is_none())
            .collect();
        let mut fds: Vec<libc::pollfd> = pending
            .iter()
            .map(|&i| libc::pollfd {
                fd: attempts[i].fd.as_ref().map_or(-1, |fd| fd.as_raw_fd()),
                events: libc::POLLOUT,
                revents: 0,
            })
            .collect();
        let wait = next.saturating_duration_since(Instant::now());
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::c_long::try_from(wait.as_nanos()).unwrap_or(1_000_000),
        };
        // SAFETY: `fds` is a valid array of its length; `ts` lives for
        // the call; no signal mask is given.
        let r = unsafe {
            libc::ppoll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                &raw const ts,
                std::ptr::null(),
            )
        };
        let now = Instant::now();
        for (p, &i) in fds.iter().zip(&pending) {
            let a = &mut attempts[i];
            if r > 0 && p.revents != 0 {
                let connected = a.fd.as_ref().is_some_and(|fd| socket_error(fd) == 0);
                a.ok = Some(connected);
                a.answered = connected.then_some(now);
                a.fd = None;
            } else if now.duration_since(a.start) >= pacing.timeout {
                a.ok = Some(false);
                a.fd = None;
            }
        }
        while attempts.get(first_pending).is_some_and(|a| a.ok.is_some()) {
            first_pending += 1;
        }
        if let Some(t) = decided(&attempts, expect) {
            return (Some(t), attempts.len());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions() {
        let t = Instant::now();
        let at = |ms: u64, ok: Option<bool>| Attempt {
            start: t + Duration::from_millis(ms),
            fd: None,
            ok,
            answered: (ok == Some(true)).then(|| t + Duration::from_millis(ms + 1)),
        };
        // Open: the first answer seen, whatever is still pending.
        let a = [at(0, Some(false)), at(1, None), at(2, Some(false))];
        assert_eq!(decided(&a, Expect::Open), None);
        let a = [at(0, Some(false)), at(1, None), at(2, Some(true))];
        assert_eq!(
            decided(&a, Expect::Open),
            Some(t + Duration::from_millis(3))
        );
        // Closed: one refused attempt alone is noise.
        let mut a = vec![
            at(0, Some(true)),
            at(1, Some(false)),
            at(2, Some(true)),
            at(3, Some(false)),
            at(4, Some(false)),
            at(5, Some(false)),
        ];
        assert_eq!(decided(&a, Expect::Closed), None);
        a.push(at(6, Some(false)));
        assert_eq!(
            decided(&a, Expect::Closed),
            Some(t + Duration::from_millis(3))
        );
    }
}
