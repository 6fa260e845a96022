//! BIRD 2, rivet's BGP speaker: its configuration rendered from what the
//! agent knows ([`SpeakerConfig`] → [`render`]), the process started and
//! found again ([`Bird`]), and its control socket ([`Control`]: `configure`,
//! `show protocols all`).
//!
//! What the configuration makes BIRD do:
//! - announce the node's pod CIDR (and `bgp_advertise`) from a static
//!   protocol (`rivet_own`, blackhole routes: never forwarded by BIRD);
//! - one BGP session per peer from a template: hold time, keepalive at a
//!   third of it, connect retry 5 s, graceful restart with its time;
//!   route reflector clients (`rr client`, `rr cluster id`) on a reflector;
//! - import only prefixes inside the cluster CIDR that are not this node's
//!   (a default route from a router never reaches the datapath);
//! - export to peers only the node's own prefixes, and on a reflector also
//!   what it reflects;
//! - write every BGP-learned route into the agent's kernel table with the
//!   BGP next hop as an on-link gateway on the uplink, persisting there
//!   while BIRD restarts (`persist`, graceful restart recovery deferring
//!   the kernel sync): the agent reads that table (`netlink::table`).

use std::{
    fmt::Write as _,
    io::{BufRead as _, BufReader, Write as _},
    net::Ipv4Addr,
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use ipnet::Ipv4Net;

/// The agent's files of the speaker, in `<state_dir>/bgp/`.
#[derive(Debug, Clone)]
pub struct BirdPaths {
    /// The configuration file.
    pub config: PathBuf,
    /// The control socket.
    pub socket: PathBuf,
    /// The process ID file.
    pub pid: PathBuf,
}

impl BirdPaths {
    /// The files under `dir`.
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            config: dir.join("bird.conf"),
            socket: dir.join("bird.ctl"),
            pid: dir.join("bird.pid"),
        }
    }
}

/// Who a session is with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Another node of the mesh (iBGP), or another reflector.
    Node,
    /// A route reflector this node is a client of.
    Reflector,
    /// A node this reflector serves (`rr client`).
    Client,
    /// An external router (eBGP, or iBGP when it shares the AS).
    External,
}

impl Role {
    /// As `rivetctl bgp` shows it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Node => "node",
            Self::Reflector => "reflector",
            Self::Client => "client",
            Self::External => "external",
        }
    }

    const fn prefix(self) -> &'static str {
        match self {
            Self::Node => "node",
            Self::Reflector => "rr",
            Self::Client => "client",
            Self::External => "peer",
        }
    }
}

/// One BGP session.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Session {
    /// The peer's address.
    pub address: Ipv4Addr,
    /// The peer's AS.
    pub asn: u32,
    /// TCP MD5 password.
    pub password: Option<String>,
    /// Who the peer is.
    pub role: Role,
}

impl Session {
    /// The BIRD protocol's name: role and address (`node_192_168_1_12`).
    pub fn name(&self) -> String {
        session_name(self.role, self.address)
    }
}

/// The protocol name of a session with `address` in `role`.
pub fn session_name(role: Role, address: Ipv4Addr) -> String {
    let o = address.octets();
    format!("{}_{}_{}_{}_{}", role.prefix(), o[0], o[1], o[2], o[3])
}

/// Everything the configuration is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpeakerConfig {
    /// Router ID and session source: the node's address.
    pub router_id: Ipv4Addr,
    /// This node's AS.
    pub asn: u32,
    /// The uplink (learned routes' gateways are on-link there).
    pub uplink: String,
    /// Announced prefixes: the pod CIDR, then `bgp_advertise`.
    pub announce: Vec<Ipv4Net>,
    /// Only prefixes inside it are imported.
    pub cluster_cidr: Ipv4Net,
    /// The node's pod CIDR: never imported.
    pub pod_cidr: Ipv4Net,
    /// Kernel table of learned routes.
    pub table: u32,
    /// Hold time, seconds.
    pub hold_time: u16,
    /// Graceful restart time, seconds (0 = off).
    pub graceful_restart: u16,
    /// This node reflects routes with this cluster ID.
    pub cluster_id: Option<Ipv4Addr>,
    /// The sessions, in a stable order.
    pub sessions: Vec<Session>,
}

/// BIRD's configuration text.
pub fn render(c: &SpeakerConfig) -> String {
    let mut s = String::new();
    let keepalive = (c.hold_time / 3).max(1);
    let gr = c.graceful_restart > 0;
    let _ = writeln!(
        s,
        "# Written by rivetd; rewritten whenever its peers change."
    );
    let _ = writeln!(s, "router id {};", c.router_id);
    let _ = writeln!(s, "timeformat protocol \"%s\";");
    if gr {
        let _ = writeln!(s, "graceful restart wait {};", c.graceful_restart);
    }
    let _ = writeln!(s, "protocol device {{ scan time 10; }}");
    let _ = writeln!(
        s,
        "protocol direct {{ ipv4 {{ import all; }}; interface \"{}\"; }}",
        c.uplink
    );
    let _ = writeln!(s, "protocol static rivet_own {{\n  ipv4;");
    for net in &c.announce {
        let _ = writeln!(s, "  route {net} blackhole;");
    }
    let _ = writeln!(s, "}}");
    let _ = writeln!(
        s,
        "filter rivet_import {{\n  if net ~ [ {own}+ ] then reject;\n  if net ~ [ {cidr}+ ] then accept;\n  reject;\n}}",
        own = c.pod_cidr,
        cidr = c.cluster_cidr,
    );
    let _ = writeln!(
        s,
        "filter rivet_export {{\n  if proto = \"rivet_own\" then accept;\n  reject;\n}}"
    );
    let _ = writeln!(
        s,
        "filter rivet_reflect {{\n  if proto = \"rivet_own\" then accept;\n  if source = RTS_BGP && net ~ [ {cidr}+ ] then accept;\n  reject;\n}}",
        cidr = c.cluster_cidr,
    );
    let _ = writeln!(
        s,
        "protocol kernel rivet_table {{\n  kernel table {table};\n  learn off;\n  persist on;\n  scan time 10;{gr}\n  ipv4 {{\n    import none;\n    export filter {{\n      if source != RTS_BGP then reject;\n      onlink = true;\n      ifname = \"{uplink}\";\n      gw = bgp_next_hop;\n      accept;\n    }};\n  }};\n}}",
        table = c.table,
        uplink = c.uplink,
        gr = if gr { "\n  graceful restart on;" } else { "" },
    );
    let _ = writeln!(
        s,
        "template bgp rivet_peer {{\n  local {rid} as {asn};\n  hold time {hold};\n  keepalive time {keepalive};\n  connect delay time 1;\n  connect retry time 5;\n  error wait time 1, 10;\n  graceful restart {gr_on};{gr_time}\n}}",
        rid = c.router_id,
        asn = c.asn,
        hold = c.hold_time,
        gr_on = if gr { "on" } else { "off" },
        gr_time = if gr {
            format!("\n  graceful restart time {};", c.graceful_restart)
        } else {
            String::new()
        },
    );
    for session in &c.sessions {
        let _ = writeln!(s, "protocol bgp {} from rivet_peer {{", session.name());
        let _ = writeln!(s, "  neighbor {} as {};", session.address, session.asn);
        if let Some(p) = &session.password {
            let _ = writeln!(s, "  password \"{p}\";");
        }
        let export = match (session.role, c.cluster_id) {
            (Role::Client, Some(id)) => {
                let _ = writeln!(s, "  rr client;\n  rr cluster id {id};");
                "rivet_reflect"
            }
            (Role::Node, Some(_)) => "rivet_reflect",
            _ => "rivet_export",
        };
        let _ = writeln!(
            s,
            "  ipv4 {{ import filter rivet_import; export filter {export}; }};\n}}"
        );
    }
    s
}

/// Failures of the speaker.
#[derive(Debug, thiserror::Error)]
pub enum BirdError {
    /// Its configuration could not be written.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// It could not be started.
    #[error("starting {speaker}: {reason}")]
    Start {
        /// The binary.
        speaker: PathBuf,
        /// What it said, or the error.
        reason: String,
    },
    /// Its control socket failed.
    #[error("BIRD control socket {path}: {source}")]
    Control {
        /// The socket.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// It refused a command.
    #[error("BIRD refused {command:?}: {reply}")]
    Refused {
        /// The command.
        command: String,
        /// Its answer.
        reply: String,
    },
}

/// One BIRD process the agent runs (or found running from before its own
/// restart: BIRD outlives the agent, so an agent restart never touches a
/// BGP session).
#[derive(Debug, Clone)]
pub struct Bird {
    speaker: PathBuf,
    paths: BirdPaths,
}

impl Bird {
    /// The speaker `speaker` with its files in `paths`.
    pub fn new(speaker: PathBuf, paths: BirdPaths) -> Self {
        Self { speaker, paths }
    }

    /// Its files.
    pub fn paths(&self) -> &BirdPaths {
        &self.paths
    }

    /// Writes the configuration (atomically). True when it changed.
    pub fn write_config(&self, text: &str) -> Result<bool, BirdError> {
        let path = &self.paths.config;
        if std::fs::read_to_string(path).is_ok_and(|old| old == text) {
            return Ok(false);
        }
        let tmp = path.with_extension("conf.tmp");
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|source| BirdError::Write {
                path: path.clone(),
                source,
            })?;
        Ok(true)
    }

    /// Whether a BIRD answers on the control socket.
    pub fn alive(&self) -> bool {
        Control::connect(&self.paths.socket).is_ok()
    }

    /// Starts BIRD on the written configuration; `recover` starts it in
    /// graceful restart recovery (`-R`: the kernel table is synced only
    /// once the peers have sent their routes again). BIRD daemonizes; its
    /// parent's exit status says whether the configuration was taken.
    pub fn start(&self, recover: bool) -> Result<(), BirdError> {
        let _ = std::fs::remove_file(&self.paths.socket);
        let mut cmd = Command::new(&self.speaker);
        cmd.arg("-c")
            .arg(&self.paths.config)
            .arg("-s")
            .arg(&self.paths.socket)
            .arg("-P")
            .arg(&self.paths.pid);
        if recover {
            cmd.arg("-R");
        }
        let out = cmd.output().map_err(|e| BirdError::Start {
            speaker: self.speaker.clone(),
            reason: e.to_string(),
        })?;
        if !out.status.success() {
            return Err(BirdError::Start {
                speaker: self.speaker.clone(),
                reason: format!(
                    "{}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            });
        }
        // The daemon opens its socket right after forking.
        for _ in 0..100 {
            if self.alive() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(BirdError::Start {
            speaker: self.speaker.clone(),
            reason: format!("no control socket at {}", self.paths.socket.display()),
        })
    }

    /// Makes BIRD read its configuration again (sessions whose settings
    /// did not change stay up).
    pub fn reconfigure(&self) -> Result<(), BirdError> {
        let reply = Control::connect(&self.paths.socket)?.command("configure")?;
        if reply.contains("Reconfigured") || reply.contains("Reconfiguration in progress") {
            Ok(())
        } else {
            Err(BirdError::Refused {
                command: "configure".into(),
                reply,
            })
        }
    }

    /// Its sessions, as `show protocols all` reports them.
    pub fn sessions(&self) -> Result<Vec<SessionState>, BirdError> {
        let reply = Control::connect(&self.paths.socket)?.command("show protocols all")?;
        Ok(parse_protocols(&reply))
    }

    /// Stops the BIRD whose PID file is in `paths` (`rivetd unload`, tests).
    pub fn stop(paths: &BirdPaths) -> bool {
        let Some(pid) = std::fs::read_to_string(&paths.pid)
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok())
        else {
            return false;
        };
        // SAFETY: kill with a PID read from BIRD's own file; a stale PID
        // of an exited BIRD gets ESRCH.
        let killed = unsafe { libc::kill(pid, libc::SIGTERM) } == 0;
        let _ = std::fs::remove_file(&paths.pid);
        killed
    }
}

/// A connection to BIRD's control socket.
pub struct Control {
    path: PathBuf,
    reader: BufReader<UnixStream>,
}

impl Control {
    /// Connects and reads the greeting.
    pub fn connect(path: &Path) -> Result<Self, BirdError> {
        let err = |source| BirdError::Control {
            path: path.to_owned(),
            source,
        };
        let stream = UnixStream::connect(path).map_err(err)?;
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(err)?;
        let mut c = Self {
            path: path.to_owned(),
            reader: BufReader::new(stream),
        };
        c.reply()?;
        Ok(c)
    }

    /// Sends one command and returns its whole reply (lines without their
    /// codes).
    pub fn command(&mut self, command: &str) -> Result<String, BirdError> {
        let path = self.path.clone();
        self.reader
            .get_mut()
            .write_all(format!("{command}\n").as_bytes())
            .map_err(|source| BirdError::Control { path, source })?;
        let reply = self.reply()?;
        if let Some(code) = reply.error {
            return Err(BirdError::Refused {
                command: command.to_owned(),
                reply: format!("{code} {}", reply.text),
            });
        }
        Ok(reply.text)
    }

    /// Reads lines up to the final one: a four-digit code followed by a
    /// space (`NNNN-` continues, a leading space continues the last code).
    fn reply(&mut self) -> Result<Reply, BirdError> {
        let mut text = String::new();
        loop {
            let mut line = String::new();
            let n = self
                .reader
                .read_line(&mut line)
                .map_err(|source| BirdError::Control {
                    path: self.path.clone(),
                    source,
                })?;
            if n == 0 {
                return Err(BirdError::Control {
                    path: self.path.clone(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "BIRD closed the connection",
                    ),
                });
            }
            let line = line.trim_end_matches('\n');
            let code = line
                .get(..4)
                .filter(|c| c.bytes().all(|b| b.is_ascii_digit()));
            match (code, line.as_bytes().get(4)) {
                (Some(code), Some(b' ')) | (Some(code), None) => {
                    text.push_str(line.get(5..).unwrap_or(""));
                    let error = code.starts_with('8') || code.starts_with('9');
                    return Ok(Reply {
                        text,
                        error: error.then(|| code.to_owned()),
                    });
                }
                (Some(_), Some(b'-')) => {
                    text.push_str(&line[5..]);
                    text.push('\n');
                }
                _ => {
                    text.push_str(line);
                    text.push('\n');
                }
            }
        }
    }
}

struct Reply {
    text: String,
    error: Option<String>,
}

/// One BGP session as BIRD reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SessionState {
    /// The protocol's name.
    pub name: String,
    /// BIRD's protocol state (`up`, `start`, …).
    pub state: String,
    /// Since when (Unix time, seconds).
    pub since: String,
    /// The BGP state (`Established`, `Active`, `Connect`, …).
    pub bgp_state: String,
    /// The neighbor's address.
    pub neighbor: Option<Ipv4Addr>,
    /// The neighbor's AS.
    pub neighbor_as: Option<u32>,
    /// Prefixes received (imported).
    pub received: u64,
    /// Prefixes advertised (exported).
    pub advertised: u64,
    /// BIRD's last error, if any.
    pub last_error: Option<String>,
}

/// The BGP protocols of a `show protocols all` reply.
pub fn parse_protocols(text: &str) -> Vec<SessionState> {
    let mut out: Vec<SessionState> = Vec::new();
    let mut current: Option<SessionState> = None;
    for line in text.lines() {
        if !line.starts_with(' ') && !line.is_empty() {
            if let Some(s) = current.take() {
                out.push(s);
            }
            // name proto table state since info…
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() >= 5 && cols[1] == "BGP" {
                current = Some(SessionState {
                    name: cols[0].to_owned(),
                    state: cols[3].to_owned(),
                    since: cols[4].to_owned(),
                    bgp_state: cols.get(5).copied().unwrap_or("").to_owned(),
                    ..SessionState::default()
                });
            }
            continue;
        }
        let Some(s) = current.as_mut() else { continue };
        let line = line.trim();
        if let Some(v) = line.strip_prefix("BGP state:") {
            s.bgp_state = v.trim().to_owned();
        } else if let Some(v) = line.strip_prefix("Neighbor address:") {
            s.neighbor = v.trim().parse().ok();
        } else if let Some(v) = line.strip_prefix("Neighbor AS:") {
            s.neighbor_as = v.trim().parse().ok();
        } else if let Some(v) = line.strip_prefix("Last error:") {
            s.last_error = Some(v.trim().to_owned());
        } else if let Some(v) = line.strip_prefix("Routes:") {
            // "N imported, M exported, K preferred" (filtered may appear)
            for part in v.split(',') {
                let mut words = part.split_whitespace();
                let (Some(n), Some(what)) = (words.next(), words.next()) else {
                    continue;
                };
                let n = n.parse().unwrap_or(0);
                match what {
                    "imported" => s.received = n,
                    "exported" => s.advertised = n,
                    _ => {}
                }
            }
        }
    }
    if let Some(s) = current {
        out.push(s);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> SpeakerConfig {
        SpeakerConfig {
            router_id: Ipv4Addr::new(192, 168, 1, 11),
            asn: 64512,
            uplink: "eth0".into(),
            announce: vec!["10.244.1.0/24".parse().expect("net")],
            cluster_cidr: "10.244.0.0/16".parse().expect("net"),
            pod_cidr: "10.244.1.0/24".parse().expect("net"),
            table: 4242,
            hold_time: 9,
            graceful_restart: 120,
            cluster_id: None,
            sessions: vec![
                Session {
                    address: Ipv4Addr::new(192, 168, 1, 12),
                    asn: 64512,
                    password: Some("pw".into()),
                    role: Role::Node,
                },
                Session {
                    address: Ipv4Addr::new(192, 168, 1, 1),
                    asn: 65001,
                    password: None,
                    role: Role::External,
                },
            ],
        }
    }

    #[test]
    fn a_mesh_node_announces_its_own_prefixes_only() {
        let text = render(&config());
        assert!(text.contains("route 10.244.1.0/24 blackhole;"), "{text}");
        assert!(text.contains("protocol bgp node_192_168_1_12 from rivet_peer"));
        assert!(text.contains("neighbor 192.168.1.12 as 64512;"));
        assert!(text.contains("password \"pw\";"));
        assert!(text.contains("protocol bgp peer_192_168_1_1 from rivet_peer"));
        assert!(text.contains("kernel table 4242;"));
        assert!(text.contains("hold time 9;\n  keepalive time 3;"));
        assert!(!text.contains("rr client"));
        assert_eq!(text.matches("export filter rivet_export;").count(), 2);
    }

    #[test]
    fn a_reflector_reflects_to_clients_and_other_reflectors() {
        let mut c = config();
        c.cluster_id = Some(Ipv4Addr::new(1, 0, 0, 1));
        c.sessions[0].role = Role::Client;
        c.sessions.push(Session {
            address: Ipv4Addr::new(192, 168, 1, 13),
            asn: 64512,
            password: None,
            role: Role::Node,
        });
        let text = render(&c);
        assert!(
            text.contains("rr client;\n  rr cluster id 1.0.0.1;"),
            "{text}"
        );
        assert_eq!(text.matches("export filter rivet_reflect;").count(), 2);
        assert_eq!(text.matches("export filter rivet_export;").count(), 1);
    }

    #[test]
    fn without_graceful_restart_none_is_configured() {
        let mut c = config();
        c.graceful_restart = 0;
        let text = render(&c);
        assert!(text.contains("graceful restart off;"));
        assert!(!text.contains("graceful restart wait"));
    }

    #[test]
    fn protocols_are_parsed_from_birds_reply() {
        let reply = [
            "Name       Proto      Table      State  Since         Info",
            "rivet_own  Static     master4    up     1796243237",
            "node_10_1_1_1 BGP        ---        up     1796243237  Established   ",
            "  BGP state:          Established",
            "    Neighbor address: 10.1.1.1",
            "    Neighbor AS:      64512",
            "   Channel ipv4",
            "     Routes:         3 imported, 1 exported, 3 preferred",
            "peer_10_1_1_9 BGP        ---        start  1796243230  Active        Socket: Connection refused",
            "  BGP state:          Active",
            "    Neighbor address: 10.1.1.9",
            "    Neighbor AS:      65001",
            "    Last error:       Socket: Connection refused",
        ]
        .join("\n");
        let reply = reply.as_str();
        let p = parse_protocols(reply);
        assert_eq!(p.len(), 2, "{p:?}");
        assert_eq!(p[0].name, "node_10_1_1_1");
        assert_eq!(p[0].bgp_state, "Established");
        assert_eq!(p[0].since, "1796243237");
        assert_eq!(p[0].neighbor, Some(Ipv4Addr::new(10, 1, 1, 1)));
        assert_eq!((p[0].received, p[0].advertised), (3, 1));
        assert_eq!(p[1].state, "start");
        assert_eq!(p[1].neighbor_as, Some(65001));
        assert_eq!(
            p[1].last_error.as_deref(),
            Some("Socket: Connection refused")
        );
    }
}
