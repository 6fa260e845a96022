//! A routed data-centre fabric for `bgp` mode: racks behind top-of-rack
//! routers (BIRD in their own namespaces, routing between racks on nothing
//! but what BGP tells them), nodes on each rack's subnet, no L2 between
//! racks.
//!
//! Addresses (world `k`): rack `r` (1-based) is `172.(16+r).k.0/24`, its
//! router `.1`, its nodes `.10+i`; router-to-router links `172.30.k.(4j)/30`.
//! Every process and namespace made here goes when the [`Fabric`] drops.

use std::{
    net::Ipv4Addr,
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use crate::{World, netns::Netns, traffic::ChildGuard};

/// The speaker binary (Debian's `bird2`, installed by `cargo xtask setup`).
pub const BIRD: &str = "/usr/sbin/bird";
/// birdc.
pub const BIRDC: &str = "/usr/sbin/birdc";

/// A top-of-rack router.
pub struct Tor {
    /// Its namespace (bridge `rack` = the rack's subnet).
    pub ns: Netns,
    /// Its AS.
    pub asn: u32,
    /// Its address on the rack (the nodes' gateway).
    pub gateway: Ipv4Addr,
    /// The rack's number.
    pub rack: u8,
    /// BGP neighbours: (address, AS).
    pub neighbors: Vec<(Ipv4Addr, u32)>,
    conf: PathBuf,
    ctl: PathBuf,
    bird: Option<ChildGuard>,
}

/// The routers of a world.
pub struct Fabric {
    /// The routers, by rack.
    pub tors: Vec<Tor>,
    k: u8,
    prefix: String,
    dir: PathBuf,
    links: u8,
}

impl Fabric {
    /// No racks yet.
    pub fn new(w: &World) -> Self {
        Self {
            tors: Vec::new(),
            k: w.k,
            prefix: w.prefix.clone(),
            dir: w.dir.clone(),
            links: 0,
        }
    }

    /// A rack and its router (AS `asn`); returns its index.
    pub fn add_rack(&mut self, asn: u32) -> usize {
        let rack = self.tors.len() as u8 + 1;
        let ns = Netns::new(format!("{}-tor{rack}", self.prefix));
        let gateway = Ipv4Addr::new(172, 16 + rack, self.k, 1);
        ns.ip(&["link", "add", "rack", "type", "bridge"]);
        ns.ip(&["addr", "add", &format!("{gateway}/24"), "dev", "rack"]);
        ns.ip(&["link", "set", "rack", "up"]);
        ns.ip(&["link", "set", "lo", "up"]);
        ns.exec(|| std::fs::write("/proc/sys/net/ipv4/ip_forward", "1"))
            .unwrap_or_else(|e| panic!("forwarding on the router: {e}"));
        self.tors.push(Tor {
            conf: self.dir.join(format!("tor{rack}.conf")),
            ctl: self.dir.join(format!("tor{rack}.ctl")),
            ns,
            asn,
            gateway,
            rack,
            neighbors: Vec::new(),
            bird: None,
        });
        self.tors.len() - 1
    }

    /// A node on rack `t`: its namespace plugged into the rack's bridge,
    /// the router as its default gateway; agent not started.
    pub fn add_node(&mut self, w: &mut World, t: usize) -> usize {
        let i = w.nodes.len() + 1;
        let tor = &self.tors[t];
        let ip = Ipv4Addr::new(172, 16 + tor.rack, self.k, 10 + i as u8);
        let ns = Netns::new(format!("{}-n{i}", self.prefix));
        let port = format!("n{i}");
        tor.ns.ip(&[
            "link",
            "add",
            &port,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            ns.name(),
        ]);
        tor.ns.ip(&["link", "set", &port, "master", "rack", "up"]);
        ns.ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"]);
        ns.ip(&["link", "set", "eth0", "up"]);
        ns.ip(&["link", "set", "lo", "up"]);
        ns.ip(&["route", "add", "default", "via", &tor.gateway.to_string()]);
        let cidr = format!("10.{}.{i}.0/24", self.k);
        w.push_node(ns, ip, &cidr)
    }

    /// Links routers `a` and `b` (a /30) and makes them eBGP neighbours.
    pub fn link(&mut self, a: usize, b: usize) {
        self.links += 1;
        let base = 4 * self.links;
        let ip_a = Ipv4Addr::new(172, 30, self.k, base + 1);
        let ip_b = Ipv4Addr::new(172, 30, self.k, base + 2);
        let (name_a, name_b) = (format!("to{}", b + 1), format!("to{}", a + 1));
        self.tors[a].ns.ip(&[
            "link",
            "add",
            &name_a,
            "type",
            "veth",
            "peer",
            "name",
            &name_b,
            "netns",
            self.tors[b].ns.name(),
        ]);
        for (t, name, ip) in [(a, &name_a, ip_a), (b, &name_b, ip_b)] {
            self.tors[t]
                .ns
                .ip(&["addr", "add", &format!("{ip}/30"), "dev", name]);
            self.tors[t].ns.ip(&["link", "set", name, "up"]);
        }
        let (asn_a, asn_b) = (self.tors[a].asn, self.tors[b].asn);
        self.tors[a].neighbors.push((ip_b, asn_b));
        self.tors[b].neighbors.push((ip_a, asn_a));
    }

    /// Starts every router's BIRD.
    pub fn start(&mut self) {
        for tor in &mut self.tors {
            tor.start();
        }
    }
}

impl Tor {
    /// A rack node's agent flags: `bgp` mode in AS `node_as`, peering with
    /// this router only (`extra` appended).
    pub fn node_flags(&self, node_as: u32, extra: &[&str]) -> Vec<String> {
        let mut flags = vec![
            "--mode".to_owned(),
            "bgp".to_owned(),
            "--bgp-as".to_owned(),
            node_as.to_string(),
            "--bgp-peers".to_owned(),
            format!("{}:{}", self.gateway, self.asn),
        ];
        flags.extend(extra.iter().map(|f| (*f).to_owned()));
        flags
    }

    /// Adds a node of its rack as an eBGP neighbour (before [`Tor::start`]).
    pub fn peer_with(&mut self, node_ip: Ipv4Addr, node_as: u32) {
        self.neighbors.push((node_ip, node_as));
    }

    /// Writes its configuration: eBGP with every neighbour (announcing
    /// its connected subnets and what it learned), everything learned
    /// into the kernel's main table (it routes on it), short timers for
    /// tests.
    fn config(&self) -> String {
        let mut s = format!(
            "router id {gw};\nprotocol device {{ scan time 2; }}\nprotocol direct {{ ipv4; }}\n\
             protocol kernel {{ learn off; scan time 5; ipv4 {{ import none; export where source = RTS_BGP; }}; }}\n",
            gw = self.gateway
        );
        for (n, (ip, asn)) in self.neighbors.iter().enumerate() {
            s.push_str(&format!(
                "protocol bgp n{n} {{\n  local as {me};\n  neighbor {ip} as {asn};\n  hold time 3;\n  keepalive time 1;\n  connect delay time 1;\n  connect retry time 2;\n  error wait time 1, 5;\n  graceful restart on;\n  ipv4 {{ import all; export where source ~ [ RTS_BGP, RTS_DEVICE ]; }};\n}}\n",
                me = self.asn
            ));
        }
        s
    }

    /// Starts BIRD in the foreground (its child process dies with the
    /// guard).
    pub fn start(&mut self) {
        std::fs::write(&self.conf, self.config())
            .unwrap_or_else(|e| panic!("writing {}: {e}", self.conf.display()));
        let child = self
            .ns
            .command(BIRD)
            .args(["-f", "-c"])
            .arg(&self.conf)
            .arg("-s")
            .arg(&self.ctl)
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {BIRD} for rack {}: {e}", self.rack));
        self.bird = Some(ChildGuard(child));
    }

    /// `birdc` output of `show …` on this router.
    pub fn birdc(&self, args: &[&str]) -> String {
        let out = Command::new(BIRDC)
            .arg("-s")
            .arg(&self.ctl)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running {BIRDC}: {e}"));
        assert!(out.status.success(), "birdc {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The kernel routes of its main table for `prefix` (`ip route show`).
    pub fn route(&self, prefix: &str) -> String {
        self.ns.ip(&["route", "show", prefix])
    }
}

/// Waits until `f` holds (polling every 50 ms); panics with `what` and
/// the last value after `timeout`. Returns the time it took.
pub fn wait_for<T: std::fmt::Debug>(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> (bool, T),
) -> Duration {
    let start = Instant::now();
    loop {
        let (ok, last) = f();
        if ok {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < timeout,
            "{what}: not after {timeout:?}; last: {last:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
