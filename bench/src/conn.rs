//! Connection-level probes shared by the benchmarks: a 1-byte echo
//! server, a connect / 1-byte exchange / close loop (connection rate and
//! per-connection latency), and a 1-byte ping-pong on one connection
//! (request/response latency).

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
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
