//! The agent's HTTP endpoints (metrics, health, readiness) read from inside
//! a node namespace, and Prometheus text lookups.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    time::Duration,
};

use crate::Netns;

/// The agent's default metrics port (on 127.0.0.1 of the node namespace).
pub const METRICS_PORT: u16 = 9402;

/// GET `path` from the agent's metrics port inside `ns`: (status, body).
pub fn http_get(ns: &Netns, path: &'static str) -> (u16, String) {
    let text = ns
        .exec(move || -> std::io::Result<String> {
            let mut s = TcpStream::connect(("127.0.0.1", METRICS_PORT))?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            write!(
                s,
                "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
            )?;
            let mut out = String::new();
            s.read_to_string(&mut out)?;
            Ok(out)
        })
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {text}"));
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

/// The value of the sample `series` (name with its labels) in `text`.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}
