//! rivetctl: talk to a running rivetd.

use std::{net::Ipv4Addr, path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand, ValueEnum};
use rivet_api::{Client, EndpointCheck, EndpointRef, EndpointSpec, Request, Response};

#[derive(Parser)]
#[command(
    name = "rivetctl",
    version,
    about = "Inspect and drive a rivet node agent"
)]
struct Cli {
    /// Agent API socket.
    #[arg(long, short, global = true, default_value = rivet_api::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Pick the agent of node NAME: its socket `/run/rivet/NAME.sock` (for
    /// machines running one agent per node, each with such a socket).
    #[arg(long, global = true, conflicts_with = "socket")]
    node: Option<String>,
    /// Output format.
    #[arg(long, short, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Agent status: node, mode, attachments, map fill, store, readiness
    /// (exits non-zero when the agent is not ready).
    Status,
    /// List endpoints (pods attached to this node).
    Endpoints,
    /// Create or delete an endpoint.
    Endpoint {
        #[command(subcommand)]
        action: EndpointAction,
    },
    /// Routes to remote nodes: pod subnets, node addresses, how they are
    /// reached, and the FDB (VTEP MAC, VNI).
    #[command(alias = "nodes")]
    Routes,
    /// Connection-tracking (NAT) entries: masqueraded flows both ways and
    /// hostPort connections.
    Nat {
        /// Only entries with this address on either side.
        #[arg(long)]
        ip: Option<Ipv4Addr>,
        /// Only entries with this port on either side.
        #[arg(long)]
        port: Option<u16>,
        /// At most this many entries.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
    },
    /// hostPort mappings in the datapath, with the pod that owns each.
    Portmaps,
    /// Live datapath events, like `hubble observe`: every drop with its
    /// reason, interface and 5-tuple; with --flows also forwarded and
    /// passed packets (turned on in the datapath only while watched).
    Monitor {
        /// Also flow events.
        #[arg(long)]
        flows: bool,
        /// Flow events for one packet in N.
        #[arg(long, value_name = "N", requires = "flows")]
        sample: Option<u32>,
        /// Only events with this reason (drop reason or verdict).
        #[arg(long)]
        reason: Option<String>,
        /// Stop after this many events.
        #[arg(long)]
        count: Option<u64>,
    },
    /// Add, update or remove a remote node by hand (static clusters).
    Node {
        #[command(subcommand)]
        action: NodeAction,
    },
    /// Datapath counters (verdicts and drop reasons).
    Stats {
        /// Also show counters that are zero.
        #[arg(long)]
        all: bool,
        /// Print per-second rates every SECS seconds until interrupted.
        #[arg(long, value_name = "SECS")]
        watch: Option<u64>,
        /// With --watch: stop after this many samples.
        #[arg(long, requires = "watch")]
        count: Option<u64>,
    },
    /// Install rivet-cni and its conflist on this node (or remove them).
    InstallCni {
        /// The rivet-cni binary (default: next to rivetctl).
        #[arg(long)]
        binary: Option<PathBuf>,
        /// CNI binary directory.
        #[arg(long, default_value = rivet::install::DEFAULT_BIN_DIR)]
        bin_dir: PathBuf,
        /// CNI configuration directory.
        #[arg(long, default_value = rivet::install::DEFAULT_CONF_DIR)]
        conf_dir: PathBuf,
        /// Network name in the conflist.
        #[arg(long, default_value = "rivet")]
        network: String,
        /// Remove instead of install.
        #[arg(long)]
        uninstall: bool,
    },
    /// Print the rivetctl version (and the agent's, if it answers).
    Version,
    /// Install this node as a service: rivetd and rivetctl, rivet-cni and
    /// its conflist, the systemd unit and the configuration.
    Install(NodeArgs),
    /// Undo `install`: stop the service, `rivetd unload` (pod veths,
    /// programs, links, pins, state), then remove the files.
    Uninstall(NodeArgs),
}

#[derive(clap::Args)]
struct NodeArgs {
    /// Directory holding the built rivetd, rivetctl and rivet-cni
    /// (default: the one rivetctl runs from).
    #[arg(long)]
    from: Option<PathBuf>,
    /// The rivet-cni binary (default: in --from).
    #[arg(long)]
    cni_binary: Option<PathBuf>,
    /// Where rivetd and rivetctl go.
    #[arg(long, default_value = "/usr/local/bin")]
    bin_dir: PathBuf,
    /// CNI binary directory.
    #[arg(long, default_value = rivet::install::DEFAULT_BIN_DIR)]
    cni_bin_dir: PathBuf,
    /// CNI configuration directory.
    #[arg(long, default_value = rivet::install::DEFAULT_CONF_DIR)]
    cni_conf_dir: PathBuf,
    /// systemd unit directory.
    #[arg(long, default_value = "/etc/systemd/system")]
    unit_dir: PathBuf,
    /// Configuration directory (rivet.toml).
    #[arg(long, default_value = "/etc/rivet")]
    config_dir: PathBuf,
    /// Install this configuration instead of the commented example.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Network name in the conflist.
    #[arg(long, default_value = "rivet")]
    network: String,
}

impl NodeArgs {
    fn plan(
        &self,
        socket: &std::path::Path,
    ) -> Result<rivet::install::NodePlan, Box<dyn std::error::Error>> {
        let from = match &self.from {
            Some(d) => d.clone(),
            None => std::env::current_exe()?
                .parent()
                .map(std::path::Path::to_path_buf)
                .ok_or("cannot locate the directory of rivetctl")?,
        };
        let config = match &self.config {
            Some(p) => Some(
                std::fs::read_to_string(p).map_err(|e| format!("reading {}: {e}", p.display()))?,
            ),
            None => None,
        };
        Ok(rivet::install::NodePlan {
            cni: rivet::install::InstallPlan {
                binary: self
                    .cni_binary
                    .clone()
                    .unwrap_or_else(|| from.join("rivet-cni")),
                bin_dir: self.cni_bin_dir.clone(),
                conf_dir: self.cni_conf_dir.clone(),
                socket: socket.to_owned(),
                network: self.network.clone(),
            },
            from,
            bin_dir: self.bin_dir.clone(),
            unit_dir: self.unit_dir.clone(),
            config_dir: self.config_dir.clone(),
            config,
        })
    }
}

/// systemd manages this machine and the unit goes where it looks.
fn systemd_owns(unit_dir: &std::path::Path) -> bool {
    unit_dir == std::path::Path::new("/etc/systemd/system")
        && std::path::Path::new("/run/systemd/system").is_dir()
}

fn install_node(
    args: &NodeArgs,
    socket: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let plan = args.plan(socket)?;
    for p in rivet::install::install_node(&plan)? {
        println!("installed {}", p.display());
    }
    if systemd_owns(&args.unit_dir) {
        let _ = std::process::Command::new("systemctl")
            .arg("daemon-reload")
            .status();
        println!(
            "edit {}, then: systemctl enable --now rivetd",
            args.config_dir.join(rivet::install::CONFIG_NAME).display()
        );
    }
    Ok(())
}

fn uninstall_node(
    args: &NodeArgs,
    socket: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let plan = args.plan(socket)?;
    if systemd_owns(&args.unit_dir) && args.unit_dir.join(rivet::install::UNIT_NAME).exists() {
        let _ = std::process::Command::new("systemctl")
            .args(["disable", "--now", "rivetd"])
            .status();
    }
    let rivetd = args.bin_dir.join("rivetd");
    let config = args.config_dir.join(rivet::install::CONFIG_NAME);
    if rivetd.exists() && config.exists() {
        let status = std::process::Command::new(&rivetd)
            .arg("--config")
            .arg(&config)
            .arg("unload")
            .status()
            .map_err(|e| format!("running {}: {e}", rivetd.display()))?;
        if !status.success() {
            return Err(format!(
                "{} --config {} unload failed ({status}); nothing removed",
                rivetd.display(),
                config.display()
            )
            .into());
        }
        println!("unloaded the datapath ({} unload)", rivetd.display());
    }
    let (removed, kept) = rivet::install::uninstall_node(&plan)?;
    for p in removed {
        println!("removed {}", p.display());
    }
    for p in kept {
        println!("kept {} (edited since install)", p.display());
    }
    Ok(())
}

#[derive(Subcommand)]
enum NodeAction {
    /// Add or update a node.
    Set {
        /// Its pod subnet.
        #[arg(long)]
        subnet: String,
        /// Its uplink address.
        #[arg(long)]
        node_ip: Ipv4Addr,
        /// Its VTEP MAC (default: derived from the address).
        #[arg(long)]
        vtep_mac: Option<String>,
    },
    /// Forget a node.
    Del {
        /// Its pod subnet.
        #[arg(long)]
        subnet: String,
    },
}

#[derive(Subcommand)]
enum EndpointAction {
    /// Attach a pod: veth, address, routes, map entry, program.
    Add {
        /// Container (sandbox) ID.
        #[arg(long)]
        container_id: String,
        /// Pod network namespace path.
        #[arg(long)]
        netns: String,
        /// Pod address (inside the node's pod CIDR); default: the agent's IPAM chooses.
        #[arg(long)]
        ip: Option<Ipv4Addr>,
        /// Interface name inside the pod.
        #[arg(long, default_value = "eth0")]
        ifname: String,
    },
    /// Verify every resource of an attachment.
    Check {
        /// Container (sandbox) ID.
        #[arg(long)]
        container_id: String,
        /// Interface name inside the pod.
        #[arg(long, default_value = "eth0")]
        ifname: String,
    },
    /// Detach a pod (idempotent).
    Del {
        /// Container (sandbox) ID.
        #[arg(long)]
        container_id: String,
        /// Interface name inside the pod.
        #[arg(long, default_value = "eth0")]
        ifname: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rivetctl: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli) -> Result<(), Box<dyn std::error::Error>> {
    let socket = match &cli.node {
        Some(node) => {
            std::path::Path::new(rivet_api::DEFAULT_SOCKET).with_file_name(format!("{node}.sock"))
        }
        None => cli.socket.clone(),
    };
    let client = Client::new(&socket);
    let request = match &cli.command {
        Command::Version => {
            println!("rivetctl {}", env!("CARGO_PKG_VERSION"));
            match client.call(&Request::Status {}) {
                Ok(Response::Status(s)) => println!("rivetd {} (node {})", s.version, s.node_name),
                Ok(other) => println!("rivetd: unexpected answer {other:?}"),
                Err(e) => println!("rivetd: not reachable ({e})"),
            }
            return Ok(());
        }
        Command::Stats {
            all,
            watch: Some(secs),
            count,
        } => return watch_stats(&client, *secs, *count, *all),
        Command::Install(args) => return install_node(args, &socket),
        Command::Uninstall(args) => return uninstall_node(args, &socket),
        Command::Monitor {
            flows,
            sample,
            reason,
            count,
        } => {
            let mut shown = 0;
            for event in client.monitor(*flows, *sample)? {
                let e = event?;
                if e.kind == "tick" || reason.as_ref().is_some_and(|r| *r != e.reason) {
                    continue;
                }
                match cli.output {
                    Output::Json => println!("{}", serde_json::to_string(&e)?),
                    Output::Table => println!("{}", monitor_line(&e)),
                }
                shown += 1;
                if count.is_some_and(|c| shown >= c) {
                    break;
                }
            }
            return Ok(());
        }
        Command::InstallCni {
            binary,
            bin_dir,
            conf_dir,
            network,
            uninstall,
        } => {
            if *uninstall {
                for p in rivet::install::uninstall(bin_dir, conf_dir)? {
                    println!("removed {}", p.display());
                }
                return Ok(());
            }
            let binary = match binary {
                Some(b) => b.clone(),
                None => std::env::current_exe()?
                    .parent()
                    .map(|d| d.join("rivet-cni"))
                    .ok_or("cannot locate rivet-cni next to rivetctl")?,
            };
            let plan = rivet::install::InstallPlan {
                binary,
                bin_dir: bin_dir.clone(),
                conf_dir: conf_dir.clone(),
                socket: socket.clone(),
                network: network.clone(),
            };
            for p in rivet::install::install(&plan)? {
                println!("installed {}", p.display());
            }
            return Ok(());
        }
        Command::Status => Request::Status {},
        Command::Endpoints => Request::EndpointList {},
        Command::Routes => Request::NodeList {},
        Command::Nat { ip, port, limit } => Request::NatList {
            ip: *ip,
            port: *port,
            limit: Some(*limit),
        },
        Command::Portmaps => Request::PortmapList {},
        Command::Node { action } => match action {
            NodeAction::Set {
                subnet,
                node_ip,
                vtep_mac,
            } => Request::NodeSet(rivet_api::NodeEntry {
                subnet: subnet.clone(),
                node_ip: *node_ip,
                vtep_mac: vtep_mac.clone(),
                vni: None,
                route: None,
            }),
            NodeAction::Del { subnet } => Request::NodeDel {
                subnet: subnet.clone(),
            },
        },
        Command::Stats { .. } => Request::Stats {},
        Command::Endpoint { action } => match action {
            EndpointAction::Add {
                container_id,
                netns,
                ip,
                ifname,
            } => Request::EndpointAdd(EndpointSpec {
                ifname: ifname.clone(),
                ip: *ip,
                ..EndpointSpec::new(container_id, netns)
            }),
            EndpointAction::Del {
                container_id,
                ifname,
            } => Request::EndpointDel(EndpointRef::new(container_id, ifname)),
            EndpointAction::Check {
                container_id,
                ifname,
            } => Request::EndpointCheck(EndpointCheck {
                container_id: container_id.clone(),
                ifname: ifname.clone(),
                ip: None,
                network: None,
            }),
        },
    };
    let response = client.call(&request)?;
    if matches!(cli.output, Output::Json) {
        println!("{}", serde_json::to_string_pretty(&response)?);
    } else {
        let show_all = matches!(cli.command, Command::Stats { all: true, .. });
        print_table(&response, show_all);
    }
    match response {
        Response::Status(s) if !s.ready => Err(format!(
            "agent at {} is not ready: {}",
            socket.display(),
            s.not_ready.as_deref().unwrap_or("unknown reason")
        )
        .into()),
        Response::Error(e) => Err(format!("agent at {}: {e}", socket.display()).into()),
        _ => Ok(()),
    }
}

/// One event as a line: time (UTC), kind, reason, interface, 5-tuple.
fn monitor_line(e: &rivet_api::MonitorEvent) -> String {
    let ms = (e.time * 1000.0) as u64 % 86_400_000;
    let when = format!(
        "{:02}:{:02}:{:02}.{:03}",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    );
    let iface = format!("{}({})", e.ifname.as_deref().unwrap_or("?"), e.ifindex);
    let what = if e.proto.is_empty() {
        "non-IPv4".to_owned()
    } else {
        format!(
            "{} {} -> {}{}",
            e.proto,
            e.src,
            e.dst,
            e.icmp
                .as_ref()
                .map_or_else(String::new, |t| format!(" type/code {t}"))
        )
    };
    let lost = if e.lost > 0 {
        format!("  ({} earlier events lost)", e.lost)
    } else {
        String::new()
    };
    format!(
        "{when} {:<4} {:<22} {:<22} {what} len {}{lost}",
        e.kind.to_uppercase(),
        e.reason,
        iface,
        e.len
    )
}

/// `stats --watch`: per-second rates of every counter that moved.
fn watch_stats(
    client: &Client,
    secs: u64,
    count: Option<u64>,
    all: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let read = || -> Result<Vec<rivet_api::CounterValue>, Box<dyn std::error::Error>> {
        match client.call(&Request::Stats {})? {
            Response::Stats { counters } => Ok(counters),
            other => Err(format!("unexpected answer: {other:?}").into()),
        }
    };
    let interval = std::time::Duration::from_secs(secs.max(1));
    let mut before = read()?;
    let mut at = std::time::Instant::now();
    let mut n = 0;
    while count.is_none_or(|c| n < c) {
        std::thread::sleep(interval);
        let now = read()?;
        let dt = at.elapsed().as_secs_f64();
        at = std::time::Instant::now();
        n += 1;
        println!(
            "{:<24} {:>12} {:>14} {:>14}",
            "COUNTER", "PACKETS/S", "BYTES/S", "PACKETS"
        );
        for (b, c) in before.iter().zip(&now) {
            let dp = c.packets.saturating_sub(b.packets);
            if dp == 0 && !all {
                continue;
            }
            println!(
                "{:<24} {:>12.1} {:>14.1} {:>14}",
                c.name,
                dp as f64 / dt,
                c.bytes.saturating_sub(b.bytes) as f64 / dt,
                c.packets
            );
        }
        println!();
        before = now;
    }
    Ok(())
}

fn print_table(response: &Response, show_all: bool) {
    match response {
        Response::Endpoint(ep) => {
            println!(
                "added {} ({} {}) on {} mac {}",
                ep.ip, ep.container_id, ep.ifname, ep.host_ifname, ep.mac
            );
        }
        Response::Endpoints { endpoints } => {
            println!(
                "{:<15} {:<24} {:<6} {:<15} {:>7} {:<17} MTU",
                "IP", "CONTAINER", "IFNAME", "HOST-IF", "IFINDEX", "MAC"
            );
            for ep in endpoints {
                println!(
                    "{:<15} {:<24} {:<6} {:<15} {:>7} {:<17} {}",
                    ep.ip.to_string(),
                    ep.container_id,
                    ep.ifname,
                    ep.host_ifname,
                    ep.host_ifindex,
                    ep.mac,
                    ep.mtu
                );
            }
        }
        Response::Checked {} => println!("ok: every resource is in place"),
        Response::Nodes { nodes } => {
            println!(
                "{:<18} {:<15} {:<17} {:>8} ROUTE",
                "SUBNET", "NODE-IP", "VTEP-MAC", "VNI"
            );
            for n in nodes {
                println!(
                    "{:<18} {:<15} {:<17} {:>8} {}",
                    n.subnet,
                    n.node_ip.to_string(),
                    n.vtep_mac.as_deref().unwrap_or("-"),
                    n.vni.map_or_else(|| "-".to_owned(), |v| v.to_string()),
                    n.route.as_deref().unwrap_or("-")
                );
            }
        }
        Response::Collected { removed } => {
            println!("removed {} attachment(s)", removed.len());
            for r in removed {
                println!("  {} {}", r.container_id, r.ifname);
            }
        }
        Response::Deleted { existed } => {
            println!(
                "{}",
                if *existed {
                    "deleted"
                } else {
                    "nothing to delete"
                }
            );
        }
        Response::Stats { counters } => {
            println!("{:<24} {:>14} {:>16}", "COUNTER", "PACKETS", "BYTES");
            for c in counters.iter().filter(|c| show_all || c.packets > 0) {
                println!("{:<24} {:>14} {:>16}", c.name, c.packets, c.bytes);
            }
        }
        Response::Status(s) => {
            println!(
                "rivetd {}  node {}  up {}s",
                s.version, s.node_name, s.uptime_secs
            );
            println!(
                "mode {}  cluster {}  node IP {}  remote nodes {}  store {}",
                s.mode,
                s.cluster_cidr,
                s.node_ip
                    .map_or_else(|| "-".to_owned(), |ip| ip.to_string()),
                s.nodes,
                s.store
            );
            println!(
                "pod CIDR {}  gateway {}  MTU {}",
                s.pod_cidr, s.gateway, s.mtu
            );
            println!(
                "ready: {}",
                if s.ready {
                    "yes".to_owned()
                } else {
                    format!("NO ({})", s.not_ready.as_deref().unwrap_or("?"))
                }
            );
            if let Some(e) = &s.last_error {
                println!("last error: {e}");
            }
            println!("pins {}  endpoints {}", s.pin_dir, s.endpoints);
            if !s.ebpf.source.is_empty() {
                println!(
                    "eBPF object {}  stamp {}  hash {}  ({} bytes)",
                    s.ebpf.source,
                    s.ebpf.stamp.as_deref().unwrap_or("-"),
                    s.ebpf.hash,
                    s.ebpf.bytes
                );
            }
            println!("maps:");
            for m in &s.maps {
                println!(
                    "  {:<10} {:>8} of {:>8} entries  {:>7.1} MiB  refused when full: {}",
                    m.name,
                    m.entries,
                    m.capacity,
                    m.memory_bytes as f64 / (1024.0 * 1024.0),
                    m.full_refusals
                );
            }
            for w in &s.warnings {
                println!("WARNING: {w}");
            }
            println!(
                "address pool: {} used of {} ({} free)",
                s.pool.used,
                s.pool.size,
                s.pool.free()
            );
            let n = s.nat;
            if n.masquerade {
                println!(
                    "masquerade: ports {}-{}  NAT table {} of {} entries  expired {}  evicted {} (+{} half-evicted)  spared {}",
                    n.port_min,
                    n.port_max,
                    n.entries,
                    n.max_entries,
                    n.expired,
                    n.evicted,
                    n.orphaned,
                    n.spared
                );
            } else {
                println!(
                    "masquerade: off  NAT table {} of {} entries",
                    n.entries, n.max_entries
                );
            }
            println!("attachments:");
            for a in &s.attachments {
                println!(
                    "  {:<15} {:<12} program {:>5}  link {:>5}",
                    a.interface, a.program, a.program_id, a.link_id
                );
            }
        }
        Response::Nat { entries, total } => {
            println!(
                "{:<5} {:<7} {:<22} {:<22} {:<22} {:<16} IDLE",
                "PROTO", "DIR", "SOURCE", "DESTINATION", "TRANSLATED", "FLAGS"
            );
            for e in entries {
                println!(
                    "{:<5} {:<7} {:<22} {:<22} {:<22} {:<16} {}s",
                    e.proto,
                    e.dir,
                    e.src,
                    e.dst,
                    e.translated,
                    e.flags.join(","),
                    e.idle_secs
                );
            }
            println!("{} shown, {} in the table", entries.len(), total);
        }
        Response::Portmaps { mappings } => {
            println!(
                "{:<15} {:>6} {:<5} {:<15} {:>6} CONTAINER",
                "HOST-IP", "PORT", "PROTO", "POD-IP", "TO"
            );
            for m in mappings {
                println!(
                    "{:<15} {:>6} {:<5} {:<15} {:>6} {}",
                    m.host_ip
                        .map_or_else(|| "*".to_owned(), |ip| ip.to_string()),
                    m.host_port,
                    m.protocol,
                    m.pod_ip.to_string(),
                    m.container_port,
                    m.container_id.as_deref().unwrap_or("-")
                );
            }
        }
        Response::Error(e) => println!("error: {e}"),
    }
}
