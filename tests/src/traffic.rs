//! Real traffic between namespaces: ping, TCP transfers, iperf3.

use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use crate::netns::Netns;

/// What ping reported.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PingResult {
    /// Echo requests sent.
    pub sent: u32,
    /// Replies received.
    pub received: u32,
    /// Average RTT in ms, if any reply came.
    pub avg_ms: Option<f64>,
}

/// The output of `ping -n -c count -i interval -W 1 dst` run in `ns`.
fn ping_text(ns: &Netns, dst: Ipv4Addr, count: u32, interval: f64) -> String {
    let (count, interval, dst) = (count.to_string(), interval.to_string(), dst.to_string());
    let out = ns.output(
        "ping",
        &["-n", "-c", &count, "-i", &interval, "-W", "1", &dst],
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ping -c count -i interval dst` from inside `ns`.
pub fn ping(ns: &Netns, dst: Ipv4Addr, count: u32, interval: f64) -> PingResult {
    parse_ping(&ping_text(ns, dst, count, interval))
}

/// Every reply's RTT in ms from `ping -c count -i interval dst` in `ns`.
pub fn ping_times(ns: &Netns, dst: Ipv4Addr, count: u32, interval: f64) -> Vec<f64> {
    parse_ping_times(&ping_text(ns, dst, count, interval))
}

/// The `time=… ms` of every reply line.
pub fn parse_ping_times(text: &str) -> Vec<f64> {
    text.lines()
        .filter_map(|l| {
            l.split("time=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// Parses ping's summary lines.
pub fn parse_ping(text: &str) -> PingResult {
    let mut r = PingResult {
        sent: 0,
        received: 0,
        avg_ms: None,
    };
    for line in text.lines() {
        if line.contains("packets transmitted") {
            let nums: Vec<u32> = line
                .split(',')
                .filter_map(|part| part.split_whitespace().next()?.parse().ok())
                .collect();
            if nums.len() >= 2 {
                r.sent = nums[0];
                r.received = nums[1];
            }
        }
        if let Some(stats) = line.split(" = ").nth(1)
            && line.starts_with("rtt")
        {
            r.avg_ms = stats.split('/').nth(1).and_then(|v| v.parse().ok());
        }
    }
    r
}

/// Asserts that `count` pings from `ns` to `dst` all come back.
pub fn assert_ping(ns: &Netns, dst: Ipv4Addr, count: u32) {
    let r = ping(ns, dst, count, 0.05);
    assert_eq!(
        (r.sent, r.received),
        (count, count),
        "ping {dst} from {}: {r:?}",
        ns.name()
    );
}

/// A TCP listener bound inside `ns` (the socket stays in that namespace).
pub fn listen(ns: &Netns, port: u16) -> TcpListener {
    ns.exec(move || TcpListener::bind(("0.0.0.0", port)))
        .unwrap_or_else(|e| panic!("binding :{port} in {}: {e}", ns.name()))
}

/// Connects from inside `ns` (the socket stays in that namespace).
pub fn connect(ns: &Netns, dst: SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    ns.exec(move || TcpStream::connect_timeout(&dst, timeout))
}

/// Sends `bytes` from `client` to a server in `server` at `dst:port`; the
/// server counts them and answers with the count. Returns the count the
/// server saw (must equal `bytes`).
pub fn tcp_transfer(client: &Netns, server: &Netns, dst: Ipv4Addr, port: u16, bytes: usize) -> u64 {
    let listener = listen(server, port);
    let handle = std::thread::spawn(move || -> std::io::Result<u64> {
        let (mut s, _) = listener.accept()?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut total = 0u64;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = s.read(&mut buf)?;
            if n == 0 {
                break;
            }
            total += n as u64;
        }
        s.write_all(&total.to_be_bytes())?;
        Ok(total)
    });
    let mut stream = connect(
        client,
        SocketAddr::from((dst, port)),
        Duration::from_secs(5),
    )
    .unwrap_or_else(|e| panic!("connect {dst}:{port} from {}: {e}", client.name()));
    stream
        .set_write_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let chunk = vec![0x5au8; 64 * 1024];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len());
        stream.write_all(&chunk[..n]).expect("write");
        left -= n;
    }
    stream
        .shutdown(std::net::Shutdown::Write)
        .expect("shutdown");
    let mut answer = [0u8; 8];
    stream.read_exact(&mut answer).expect("server's count");
    let seen = handle
        .join()
        .expect("server thread")
        .expect("server side of the transfer");
    assert_eq!(u64::from_be_bytes(answer), seen);
    seen
}

/// A child process killed on drop.
#[derive(Debug)]
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// iperf3 result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IperfResult {
    /// Receiver-side throughput, bits/s.
    pub bits_per_second: f64,
    /// Retransmits reported by the sender.
    pub retransmits: u64,
}

/// Starts an iperf3 server in `ns` on `port` (one test, then it exits).
pub fn iperf3_server(ns: &Netns, port: u16, cpu: Option<usize>) -> ChildGuard {
    let mut cmd = ns.command("iperf3");
    cmd.args(["-s", "-1", "-p", &port.to_string()]);
    if let Some(c) = cpu {
        cmd.args(["-A", &c.to_string()]);
    }
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("starting iperf3 -s in {}: {e}", ns.name()));
    ChildGuard(child)
}

/// Runs an iperf3 client from `ns` to `dst:port` for `secs` seconds with
/// `streams` parallel streams; retries while the server is starting.
pub fn iperf3_client(
    ns: &Netns,
    dst: Ipv4Addr,
    port: u16,
    secs: u32,
    streams: u32,
    cpu: Option<usize>,
) -> IperfResult {
    iperf3_run(ns, dst, port, secs, streams, cpu, None)
}

/// Like [`iperf3_client`] with one stream paced at `bitrate` (iperf3's
/// `-b`, e.g. "4G"): a fixed offered load.
pub fn iperf3_client_paced(
    ns: &Netns,
    dst: Ipv4Addr,
    port: u16,
    secs: u32,
    bitrate: &str,
    cpu: Option<usize>,
) -> IperfResult {
    iperf3_run(ns, dst, port, secs, 1, cpu, Some(bitrate))
}

fn iperf3_run(
    ns: &Netns,
    dst: Ipv4Addr,
    port: u16,
    secs: u32,
    streams: u32,
    cpu: Option<usize>,
    bitrate: Option<&str>,
) -> IperfResult {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut args = vec![
            "-c".to_owned(),
            dst.to_string(),
            "-p".into(),
            port.to_string(),
            "-t".into(),
            secs.to_string(),
            "-P".into(),
            streams.to_string(),
            "-J".into(),
        ];
        if let Some(b) = bitrate {
            args.push("-b".into());
            args.push(b.to_owned());
        }
        if let Some(c) = cpu {
            args.push("-A".into());
            args.push(c.to_string());
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = ns.output("iperf3", &refs);
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if let Some(bps) = json["end"]["sum_received"]["bits_per_second"].as_f64() {
            return IperfResult {
                bits_per_second: bps,
                retransmits: json["end"]["sum_sent"]["retransmits"].as_u64().unwrap_or(0),
            };
        }
        assert!(
            Instant::now() < deadline,
            "iperf3 to {dst}:{port} from {} failed: {}{}",
            ns.name(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What a receiver saw in an iperf3 run, second by second.
#[derive(Debug, Clone, PartialEq)]
pub struct Received {
    /// Bits received in each interval of the run, per second (iperf3's
    /// one-second intervals, at the receiving end).
    pub per_second: Vec<f64>,
    /// Retransmits the sender reported (TCP).
    pub retransmits: u64,
    /// Datagrams lost (UDP).
    pub lost: u64,
}

impl Received {
    /// Mean bits/s over the intervals from `skip` on.
    pub fn mean_from(&self, skip: usize) -> f64 {
        let rest = &self.per_second[skip.min(self.per_second.len())..];
        assert!(
            !rest.is_empty(),
            "no interval after the first {skip}: {self:?}"
        );
        rest.iter().sum::<f64>() / rest.len() as f64
    }
}

/// The load of an iperf3 run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    /// Seconds.
    pub secs: u32,
    /// Parallel TCP streams (ignored with `udp_bitrate`).
    pub streams: u32,
    /// One UDP stream offered at this rate (iperf3 `-b`, bits/s).
    pub udp_bitrate: Option<u64>,
    /// The server sends (iperf3 `-R`).
    pub reverse: bool,
}

impl Load {
    /// `secs` seconds of `streams` TCP streams, client to server.
    pub const fn tcp(secs: u32, streams: u32) -> Self {
        Self {
            secs,
            streams,
            udp_bitrate: None,
            reverse: false,
        }
    }

    /// `secs` seconds of one UDP stream offered at `bitrate` bit/s.
    pub const fn udp(secs: u32, bitrate: u64) -> Self {
        Self {
            secs,
            streams: 1,
            udp_bitrate: Some(bitrate),
            reverse: false,
        }
    }

    /// The same load, the server sending when `reverse`.
    pub const fn reversed(self, reverse: bool) -> Self {
        Self { reverse, ..self }
    }
}

/// Runs iperf3 from `client` to `server_ip:port` (server in `server`) with
/// `load`. The figures are the receiving end's own: the sender's count
/// bytes written into its socket buffer, which the first second overstates.
pub fn iperf3_received(
    client: &Netns,
    server: &Netns,
    server_ip: Ipv4Addr,
    port: u16,
    load: Load,
) -> Received {
    let Load {
        secs,
        streams,
        udp_bitrate,
        reverse,
    } = load;
    // The server speaks JSON too: its intervals come back inside the
    // client's output (`server_output_json`).
    let _server = ChildGuard(
        server
            .command("iperf3")
            .args(["-s", "-1", "-J", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting iperf3 -s in {}: {e}", server.name())),
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut args = vec![
            "-c".to_owned(),
            server_ip.to_string(),
            "-p".into(),
            port.to_string(),
            "-t".into(),
            secs.to_string(),
            "-P".into(),
            streams.to_string(),
            "-J".into(),
            "--get-server-output".into(),
        ];
        if let Some(b) = udp_bitrate {
            args.extend([
                "-u".into(),
                "-b".into(),
                b.to_string(),
                "-l".into(),
                "1400".into(),
            ]);
        }
        if reverse {
            args.push("-R".into());
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = client.output("iperf3", &refs);
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let receiver = if reverse {
            &json
        } else {
            &json["server_output_json"]
        };
        if let Some(intervals) = receiver["intervals"].as_array()
            && !intervals.is_empty()
        {
            // The closing interval of a run can be a sliver of a second:
            // left out.
            let per_second = intervals
                .iter()
                .filter(|i| i["sum"]["seconds"].as_f64().is_none_or(|s| s >= 0.5))
                .map(|i| {
                    let sum = &i["sum"];
                    let (bytes, secs) = (sum["bytes"].as_f64(), sum["seconds"].as_f64());
                    match (bytes, secs) {
                        (Some(b), Some(s)) if s > 0.0 => b * 8.0 / s,
                        _ => panic!("iperf3 interval without bytes/seconds: {i}"),
                    }
                })
                .collect();
            let end = &json["end"];
            return Received {
                per_second,
                retransmits: end["sum_sent"]["retransmits"].as_u64().unwrap_or(0),
                lost: receiver["end"]["sum"]["lost_packets"].as_u64().unwrap_or(0),
            };
        }
        assert!(
            Instant::now() < deadline,
            "iperf3 to {server_ip}:{port} from {} failed: {}{}",
            client.name(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_reply_times() {
        let text = "PING 10.1.1.2 (10.1.1.2) 56(84) bytes of data.\n64 bytes from 10.1.1.2: icmp_seq=1 ttl=63 time=0.051 ms\n64 bytes from 10.1.1.2: icmp_seq=2 ttl=63 time=1.5 ms\n\n--- 10.1.1.2 ping statistics ---\n";
        assert_eq!(parse_ping_times(text), vec![0.051, 1.5]);
        assert!(
            parse_ping_times("From 10.1.1.1 icmp_seq=1 Destination Host Unreachable").is_empty()
        );
    }

    #[test]
    fn parses_ping_summary() {
        let text = "PING 10.0.0.2 (10.0.0.2) 56(84) bytes of data.\n\n--- 10.0.0.2 ping statistics ---\n3 packets transmitted, 2 received, 33.3333% packet loss, time 405ms\nrtt min/avg/max/mdev = 0.065/0.103/0.165/0.044 ms\n";
        let r = parse_ping(text);
        assert_eq!((r.sent, r.received), (3, 2));
        assert_eq!(r.avg_ms, Some(0.103));
        let r = parse_ping("5 packets transmitted, 0 received, +5 errors, 100% packet loss");
        assert_eq!((r.sent, r.received, r.avg_ms), (5, 0, None));
    }
}
