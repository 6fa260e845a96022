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
    /// Agent status: node, attachments, endpoint count.
    Status,
    /// List endpoints (pods attached to this node).
    Endpoints,
    /// Create or delete an endpoint.
    Endpoint {
        #[command(subcommand)]
        action: EndpointAction,
    },
    /// Remote nodes: their pod subnets, addresses and how they are reached.
    Nodes,
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
    /// Print the rivetctl version.
    Version,
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
    let client = Client::new(&cli.socket);
    let request = match &cli.command {
        Command::Version => {
            println!("rivetctl {}", env!("CARGO_PKG_VERSION"));
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
                socket: cli.socket.clone(),
                network: network.clone(),
            };
            for p in rivet::install::install(&plan)? {
                println!("installed {}", p.display());
            }
            return Ok(());
        }
        Command::Status => Request::Status {},
        Command::Endpoints => Request::EndpointList {},
        Command::Nodes => Request::NodeList {},
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
            }),
        },
    };
    let response = client.call(&request)?;
    if matches!(cli.output, Output::Json) {
        println!("{}", serde_json::to_string_pretty(&response)?);
        return Ok(());
    }
    let show_all = matches!(cli.command, Command::Stats { all: true });
    print_table(&response, show_all);
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
            println!("pins {}  endpoints {}", s.pin_dir, s.endpoints);
            println!(
                "address pool: {} used of {} ({} free)",
                s.pool.used,
                s.pool.size,
                s.pool.free()
            );
            let n = s.nat;
            if n.masquerade {
                println!(
                    "masquerade: ports {}-{}  NAT table {} of {} entries  expired {}  evicted {} (+{} half-evicted)",
                    n.port_min,
                    n.port_max,
                    n.entries,
                    n.max_entries,
                    n.expired,
                    n.evicted,
                    n.orphaned
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
        Response::Error(e) => println!("error: {e}"),
    }
}
