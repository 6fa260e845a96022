//! Kubernetes objects in the tests: `rivetctl` driven as a user drives it
//! (a document on standard input), and backends that say who they are.

use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, TcpStream},
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use crate::{Netns, bin, traffic::listen};

/// What a `rivetctl` run said.
pub struct CtlOutput {
    /// It exited with success.
    pub ok: bool,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

/// Runs `rivetctl --socket SOCKET ARGS` with `stdin` on its standard input.
pub fn rivetctl(socket: &Path, args: &[&str], stdin: &str) -> CtlOutput {
    let mut child = Command::new(bin("rivetctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning rivetctl");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("writing rivetctl's stdin");
    let out = child.wait_with_output().expect("rivetctl output");
    CtlOutput {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A TCP server in `ns` on `port` answering each connection with `me` (4
/// bytes), then echoing what it reads until the client closes.
pub fn tell_self_tcp(ns: &Netns, me: Ipv4Addr, port: u16) {
    let l = listen(ns, port);
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            std::thread::spawn(move || {
                let _ = c.write_all(&me.octets());
                let mut buf = [0u8; 256];
                while let Ok(n @ 1..) = c.read(&mut buf) {
                    if c.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
}

/// Connects from `ns` to `dst` over TCP: the address the server said and
/// the peer the socket shows (`getpeername`).
pub fn reach_tcp(ns: &Netns, dst: SocketAddr) -> std::io::Result<(Ipv4Addr, SocketAddr)> {
    let mut c = ns.exec(|| TcpStream::connect_timeout(&dst, Duration::from_secs(3)))?;
    c.set_read_timeout(Some(Duration::from_secs(3)))?;
    let mut b = [0u8; 4];
    c.read_exact(&mut b)?;
    Ok((Ipv4Addr::from(b), c.peer_addr()?))
}

/// Runs `rivetctl --socket SOCKET -o json monitor ARGS` until it has
/// printed its events (it stops by itself after `--count`), within 15 s,
/// with `traffic` run once it is subscribed; the events, one JSON value
/// each.
pub fn monitor(socket: &Path, args: &[&str], traffic: impl FnOnce()) -> Vec<serde_json::Value> {
    let mut child = Command::new(bin("rivetctl"))
        .arg("--socket")
        .arg(socket)
        .args(["-o", "json", "monitor"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("rivetctl monitor");
    // Subscribed once the agent has read the request.
    std::thread::sleep(Duration::from_millis(500));
    traffic();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while child.try_wait().expect("wait").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "rivetctl monitor saw too few events: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().expect("output");
    assert!(out.status.success(), "rivetctl monitor: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("event json"))
        .collect()
}
